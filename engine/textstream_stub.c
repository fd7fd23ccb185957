/* engine/textstream_stub.c - TEMPORARY stand-in for llm_textstream of
 * engine/session.h until ENGINE's engine/session.c lands in main; deleted at
 * that merge. Only what the scheduler needs: UTF-8 hold-back, stop strings,
 * max tokens, end of generation. */
#include <stdlib.h>
#include <string.h>

#include "session.h"

struct llm_textstream {
    const llm_model *m;
    char *stops[LLM_MAX_STOPS];
    int32_t n_stops, max_tokens, n_tokens;
    char *pend;          /* [cap] decoded bytes not shown yet */
    size_t n, cap, shown;  /* shown: bytes of pend handed out by the last call */
};

const char *llm_stop_reason_str(llm_stop_reason r) {
    static const char *names[] = {"none", "end of turn", "stop string", "token limit", "context full", "cancelled", "error"};
    return (unsigned)r < sizeof names / sizeof names[0] ? names[r] : "?";
}

int llm_textstream_create(const llm_model *m, const char *const *stops, int32_t n_stops, int32_t max_tokens,
                          llm_textstream **out) {
    *out = NULL;
    if (n_stops < 0 || n_stops > LLM_MAX_STOPS) return -1;
    llm_textstream *s = calloc(1, sizeof *s);
    if (!s) return -1;
    s->m = m, s->max_tokens = max_tokens;
    for (int32_t i = 0; i < n_stops; i++)
        if (stops[i][0] && !(s->stops[s->n_stops++] = strdup(stops[i]))) { llm_textstream_free(s); return -1; }
    *out = s;
    return 0;
}

void llm_textstream_free(llm_textstream *s) {
    if (!s) return;
    for (int32_t i = 0; i < s->n_stops; i++) free(s->stops[i]);
    free(s->pend);
    free(s);
}

/* bytes of p[0..n) that end on a complete UTF-8 character */
static size_t utf8_complete(const char *p, size_t n) {
    size_t i = n, back = 0;
    while (i > 0 && back < 4 && ((unsigned char)p[i - 1] & 0xC0) == 0x80) i--, back++;
    if (i == 0) return n;
    unsigned char c = (unsigned char)p[i - 1];
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back + 1 ? i - 1 : n;
}

llm_stop_reason llm_textstream_push(llm_textstream *s, int32_t token, const char **out, size_t *out_len) {
    memmove(s->pend, s->pend + s->shown, s->n - s->shown);
    s->n -= s->shown, s->shown = 0;
    *out = "", *out_len = 0;
    if (llm_token_is_eog(s->m->tok, token)) return LLM_STOP_EOG;
    s->n_tokens++;
    int32_t len = 0;
    const char *piece = llm_token_piece(s->m->tok, token, &len);
    int type = llm_token_type(s->m->tok, token);
    if (type == LLM_TOKEN_CONTROL || type == LLM_TOKEN_UNKNOWN) len = 0;
    if (s->n + (size_t)len + 1 > s->cap) {
        size_t nc = (s->n + (size_t)len + 1) * 2;
        char *p = realloc(s->pend, nc);
        if (!p) return LLM_STOP_ERROR;
        s->pend = p, s->cap = nc;
    }
    if (len > 0) memcpy(s->pend + s->n, piece, (size_t)len);
    s->n += (size_t)len;
    for (int32_t i = 0; i < s->n_stops; i++) {
        size_t sl = strlen(s->stops[i]);
        for (size_t at = 0; at + sl <= s->n; at++)
            if (!memcmp(s->pend + at, s->stops[i], sl)) {
                *out = s->pend, *out_len = at;
                s->shown = s->n;
                return LLM_STOP_STRING;
            }
    }
    size_t safe = utf8_complete(s->pend, s->n);
    for (int32_t i = 0; i < s->n_stops; i++) {   /* hold back a tail that may begin a stop string */
        size_t sl = strlen(s->stops[i]);
        for (size_t k = sl - 1; k > 0; k--)
            if (k <= s->n && !memcmp(s->pend + s->n - k, s->stops[i], k)) {
                if (s->n - k < safe) safe = s->n - k;
                break;
            }
    }
    *out = s->pend, *out_len = safe;
    s->shown = safe;
    return s->max_tokens >= 0 && s->n_tokens >= s->max_tokens ? LLM_STOP_LENGTH : LLM_STOP_NONE;
}

void llm_textstream_flush(llm_textstream *s, const char **out, size_t *out_len) {
    memmove(s->pend, s->pend + s->shown, s->n - s->shown);
    s->n -= s->shown;
    *out = s->pend ? s->pend : "", *out_len = s->n;
    s->shown = s->n;
}
