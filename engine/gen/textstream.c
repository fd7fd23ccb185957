/* engine/gen/textstream.c - incremental detokenization with UTF-8 and
 * stop-string hold-back, and the stop conditions that need no model
 * (engine/gen/session.h). */
#include "session.h"

#include <stdlib.h>
#include <string.h>

#include "../text/unicode.h"

struct llm_textstream {
    const llm_tokenizer *tok;   /* borrowed */
    int32_t n_stops;
    char *stops[LLM_MAX_STOPS]; /* [n_stops] owned copies */
    size_t stop_len[LLM_MAX_STOPS];
    int32_t max_tokens;         /* < 0: no limit */
    unsigned flags;             /* LLM_STREAM_* */
    int32_t n_tokens;           /* counted so far */
    unsigned char raw[4];       /* [raw_len] the bytes of an incomplete character */
    int raw_len;
    char *hold;                 /* [hold_len] valid text not shown yet: it could begin a stop string */
    size_t hold_len, hold_cap;
    char *out;                  /* [out_cap] what the last call returned */
    size_t out_cap;
    char *piece;                /* [piece_cap] one token's bytes */
    int32_t piece_cap;
};

const char *llm_stop_reason_str(llm_stop_reason r) {
    switch (r) {
    case LLM_STOP_NONE: return "not stopped";
    case LLM_STOP_EOG: return "end of turn";
    case LLM_STOP_STRING: return "stop string";
    case LLM_STOP_LENGTH: return "token limit";
    case LLM_STOP_CONTEXT: return "context full";
    case LLM_STOP_CANCEL: return "cancelled";
    case LLM_STOP_ERROR: return "error";
    }
    return "?";
}

void llm_textstream_free(llm_textstream *s) {
    if (!s) return;
    for (int32_t i = 0; i < s->n_stops; i++) free(s->stops[i]);
    free(s->hold), free(s->out), free(s->piece);
    free(s);
}

int llm_textstream_create(const llm_tokenizer *tok, const char *const *stops, int32_t n_stops,
                          int32_t max_tokens, unsigned flags, llm_textstream **out) {
    *out = NULL;
    if (!tok || n_stops < 0 || n_stops > LLM_MAX_STOPS || (n_stops > 0 && !stops)) return LLM_ERR_PARAM;
    for (int32_t i = 0; i < n_stops; i++)
        if (!stops[i] || !stops[i][0]) return LLM_ERR_PARAM;
    llm_textstream *s = calloc(1, sizeof *s);
    if (!s) return LLM_ERR_NOMEM;
    s->tok = tok, s->max_tokens = max_tokens, s->flags = flags;
    size_t longest = 0;
    for (int32_t i = 0; i < n_stops; i++) {
        s->stop_len[i] = strlen(stops[i]);
        if (!(s->stops[i] = strdup(stops[i]))) return llm_textstream_free(s), LLM_ERR_NOMEM;
        s->n_stops++;
        if (s->stop_len[i] > longest) longest = s->stop_len[i];
    }
    s->piece_cap = 256;
    s->hold_cap = s->out_cap = 2 * longest + 512;
    s->hold = malloc(s->hold_cap), s->out = malloc(s->out_cap), s->piece = malloc((size_t)s->piece_cap);
    if (!s->hold || !s->out || !s->piece) return llm_textstream_free(s), LLM_ERR_NOMEM;
    *out = s;
    return LLM_OK;
}

void llm_textstream_reset(llm_textstream *s) { s->n_tokens = 0, s->raw_len = 0, s->hold_len = 0; }

int32_t llm_textstream_n_tokens(const llm_textstream *s) { return s->n_tokens; }

static int grow(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t nc = 2 * need;
    char *nb = realloc(*buf, nc);
    if (!nb) return -1;
    *buf = nb, *cap = nc;
    return 0;
}

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

/* Appends bytes b[0..n) after the held incomplete character to the held
 * text as valid UTF-8; a new incomplete character at the end is held in raw. */
static int add_bytes(llm_textstream *s, const char *b, size_t n) {
    size_t total = (size_t)s->raw_len + n;
    unsigned char *u = malloc(total ? total : 1);
    if (!u || grow(&s->hold, &s->hold_cap, s->hold_len + 3 * total)) return free(u), -1;
    memcpy(u, s->raw, (size_t)s->raw_len);
    memcpy(u + s->raw_len, b, n);
    s->raw_len = 0;
    for (size_t i = 0; i < total;) {
        uint32_t cp;
        int len = llm_utf8_decode(u + i, total - i, &cp);
        if (cp < LLM_CP_INVALID_BASE) {
            memcpy(s->hold + s->hold_len, u + i, (size_t)len);
            s->hold_len += (size_t)len, i += (size_t)len;
            continue;
        }
        /* undecodable: the start of a character the next token completes
         * (a lead byte and only continuation bytes so far), or a bad byte */
        size_t want = (size_t)llm_utf8_len(u[i]), j = i + 1;
        while (j < total && (u[j] & 0xC0) == 0x80) j++;
        if (want > 1 && j == total && total - i < want) {
            memcpy(s->raw, u + i, total - i);
            s->raw_len = (int)(total - i);
            break;
        }
        memcpy(s->hold + s->hold_len, REPLACEMENT, 3);
        s->hold_len += 3, i++;
    }
    free(u);
    return 0;
}

/* Moves hold[0..n) to the output. */
static void emit(llm_textstream *s, size_t n, const char **out, size_t *out_len) {
    if (n > 0 && grow(&s->out, &s->out_cap, n) == 0) {
        memcpy(s->out, s->hold, n);
        memmove(s->hold, s->hold + n, s->hold_len - n);
        s->hold_len -= n;
        *out = s->out, *out_len = n;
    }
}

llm_stop_reason llm_textstream_push(llm_textstream *s, int32_t token, const char **out, size_t *out_len) {
    *out = "", *out_len = 0;
    if (!(s->flags & LLM_STREAM_IGNORE_EOG) && llm_token_is_eog(s->tok, token)) return LLM_STOP_EOG;
    int32_t n = llm_token_to_piece(s->tok, token, 0, s->piece, s->piece_cap);
    if (n < 0 && n != LLM_TOK_ERR) {
        char *np = realloc(s->piece, (size_t)-n);
        if (!np) return LLM_STOP_ERROR;
        s->piece = np, s->piece_cap = -n;
        n = llm_token_to_piece(s->tok, token, 0, s->piece, s->piece_cap);
    }
    if (n < 0 || add_bytes(s, s->piece, (size_t)n)) return LLM_STOP_ERROR;
    s->n_tokens++;
    /* the earliest complete stop string ends the text there */
    size_t first = SIZE_MAX;
    for (int32_t i = 0; i < s->n_stops; i++) {
        const char *hit = memmem(s->hold, s->hold_len, s->stops[i], s->stop_len[i]);
        if (hit && (size_t)(hit - s->hold) < first) first = (size_t)(hit - s->hold);
    }
    if (first != SIZE_MAX) {
        emit(s, first, out, out_len);
        s->hold_len = 0, s->raw_len = 0;
        return LLM_STOP_STRING;
    }
    /* hold back the longest tail that is a proper prefix of a stop string */
    size_t keep = 0;
    for (int32_t i = 0; i < s->n_stops; i++)
        for (size_t k = s->stop_len[i] - 1 < s->hold_len ? s->stop_len[i] - 1 : s->hold_len; k > keep; k--)
            if (!memcmp(s->hold + s->hold_len - k, s->stops[i], k)) {
                keep = k;
                break;
            }
    emit(s, s->hold_len - keep, out, out_len);
    return s->max_tokens >= 0 && s->n_tokens >= s->max_tokens ? LLM_STOP_LENGTH : LLM_STOP_NONE;
}

void llm_textstream_flush(llm_textstream *s, const char **out, size_t *out_len) {
    *out = "", *out_len = 0;
    if (s->raw_len && grow(&s->hold, &s->hold_cap, s->hold_len + 3) == 0) {
        memcpy(s->hold + s->hold_len, REPLACEMENT, 3);
        s->hold_len += 3;
    }
    s->raw_len = 0;
    emit(s, s->hold_len, out, out_len);
}
