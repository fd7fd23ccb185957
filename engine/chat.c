/* engine/chat.c - chat prompt formats (see chat.h). Each family is a short
 * function that writes what its Jinja template would, with the same
 * whitespace handling (Llama 3 trims content, Llama 2 strips it, ChatML and
 * Zephyr keep it as is). */
#include "chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unicode.h"

/* ---------------------------------------------------------------- output */

/* Appends while there is room and counts everything, so one pass both
 * measures and (when the buffer is big enough) writes. */
typedef struct {
    char *out;   /* [cap] destination */
    int64_t cap;
    int64_t len; /* bytes produced so far, written or not */
} sink;

static void put(sink *s, const char *p, size_t n) {
    if (n && s->len + (int64_t)n <= s->cap) memcpy(s->out + s->len, p, n);
    s->len += (int64_t)n;
}

static void puts_(sink *s, const char *p) { put(s, p, strlen(p)); }

/* Python's str.isspace (what Jinja's trim and str.strip remove): Unicode
 * White_Space plus the ASCII separators U+001C..U+001F. */
static int is_py_space(uint32_t cp) {
    return (cp >= 0x1C && cp <= 0x1F) || llm_unicode_class(cp) == LLM_CC_SPACE;
}

/* p without its leading (lead) and trailing (trail) whitespace; returns the
 * bytes written, 0 when p is all whitespace. */
static size_t put_strip(sink *s, const char *p, int lead, int trail) {
    const unsigned char *u = (const unsigned char *)p;
    size_t n = strlen(p), a = 0, b = n;
    if (lead) {
        while (a < n) {
            uint32_t cp;
            int k = llm_utf8_decode(u + a, n - a, &cp);
            if (!is_py_space(cp)) break;
            a += (size_t)k;
        }
    }
    if (trail) {
        b = a;
        for (size_t i = a; i < n;) {
            uint32_t cp;
            i += (size_t)llm_utf8_decode(u + i, n - i, &cp);
            if (!is_py_space(cp)) b = i; /* end of the last non-space character */
        }
    }
    if (b > a) put(s, p + a, b - a);
    return b > a ? b - a : 0;
}

static int all_space(const char *p) {
    sink none = {NULL, 0, 0};
    return put_strip(&none, p, 1, 1) == 0;
}

static int is_role(const llm_chat_msg *m, const char *role) { return strcmp(m->role, role) == 0; }

/* ---------------------------------------------------------------- families */

static void render_chatml(const llm_chat_format *f, const llm_chat_msg *m, int32_t n, int gen, sink *s) {
    /* SmolLM2/Qwen insert their default inside the loop: only when n >= 1. */
    if (n > 0 && f->default_system[0] && !is_role(&m[0], "system")) {
        puts_(s, "<|im_start|>system\n");
        puts_(s, f->default_system);
        puts_(s, "<|im_end|>\n");
    }
    for (int32_t i = 0; i < n; i++) {
        puts_(s, "<|im_start|>");
        puts_(s, m[i].role);
        puts_(s, "\n");
        puts_(s, m[i].content);
        puts_(s, "<|im_end|>\n");
    }
    if (gen) puts_(s, "<|im_start|>assistant\n");
}

static void render_llama3(const llm_chat_msg *m, int32_t n, int gen, sink *s) {
    for (int32_t i = 0; i < n; i++) {
        puts_(s, "<|start_header_id|>");
        puts_(s, m[i].role);
        puts_(s, "<|end_header_id|>\n\n");
        put_strip(s, m[i].content, 1, 1);
        puts_(s, "<|eot_id|>");
    }
    if (gen) puts_(s, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* The system message folds into the first user turn; every user turn but the
 * first starts with BOS (the tokenizer adds the first). There is no
 * generation prompt: a prompt ending in [/INST] already asks for the answer. */
static void render_llama2(const llm_chat_format *f, const llm_chat_msg *m, int32_t n, sink *s) {
    const char *system = NULL;
    int32_t first = 0;
    if (n > 0 && is_role(&m[0], "system")) system = m[0].content, first = 1;
    for (int32_t i = first; i < n; i++) {
        if (is_role(&m[i], "user")) {
            if (i > first) puts_(s, f->bos);
            puts_(s, "[INST] ");
            if (i == first && system) {
                /* The template strips "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + user
                 * as one string: only the user's trailing whitespace goes, or
                 * the blank line too when the user's text is all whitespace. */
                puts_(s, "<<SYS>>\n");
                puts_(s, system);
                puts_(s, all_space(m[i].content) ? "\n<</SYS>>" : "\n<</SYS>>\n\n");
                put_strip(s, m[i].content, 0, 1);
            } else {
                put_strip(s, m[i].content, 1, 1);
            }
            puts_(s, " [/INST]");
        } else if (is_role(&m[i], "assistant")) {
            puts_(s, " ");
            put_strip(s, m[i].content, 1, 1);
            puts_(s, " ");
            puts_(s, f->eos);
        }
    }
}

static void render_zephyr(const llm_chat_format *f, const llm_chat_msg *m, int32_t n, int gen, sink *s) {
    for (int32_t i = 0; i < n; i++) {
        /* the template has a branch for these three roles only */
        if (!is_role(&m[i], "user") && !is_role(&m[i], "system") && !is_role(&m[i], "assistant")) continue;
        puts_(s, "<|");
        puts_(s, m[i].role);
        puts_(s, "|>\n");
        puts_(s, m[i].content);
        puts_(s, f->eos);
        puts_(s, "\n");
    }
    /* the template writes it inside the loop, after the last message */
    if (gen && n > 0) puts_(s, "<|assistant|>\n");
}

/* Gemma's template: the system message and a blank line start the first turn
 * (the system text as is, the user's trimmed), roles other than "assistant"
 * keep their names. */
static void render_gemma(const llm_chat_msg *m, int32_t n, int gen, sink *s) {
    const char *system = NULL;
    int32_t first = 0;
    if (n > 0 && is_role(&m[0], "system")) system = m[0].content, first = 1;
    for (int32_t i = first; i < n; i++) {
        puts_(s, "<start_of_turn>");
        puts_(s, is_role(&m[i], "assistant") ? "model" : m[i].role);
        puts_(s, "\n");
        if (i == first && system) {
            puts_(s, system);
            puts_(s, "\n\n");
        }
        put_strip(s, m[i].content, 1, 1);
        puts_(s, "<end_of_turn>\n");
    }
    if (gen) puts_(s, "<start_of_turn>model\n");
}

static int render(const llm_chat_format *f, const llm_chat_msg *m, int32_t n, int gen, sink *s) {
    for (int32_t i = 0; i < n; i++)
        if (!m[i].role || !m[i].content) return -1;
    switch (f->kind) {
    case LLM_CHAT_CHATML: render_chatml(f, m, n, gen, s); return 0;
    case LLM_CHAT_LLAMA3: render_llama3(m, n, gen, s); return 0;
    case LLM_CHAT_LLAMA2: render_llama2(f, m, n, s); return 0;
    case LLM_CHAT_ZEPHYR: render_zephyr(f, m, n, gen, s); return 0;
    case LLM_CHAT_GEMMA: render_gemma(m, n, gen, s); return 0;
    default: return -1;
    }
}

/* ---------------------------------------------------------------- formats */

static void copy_str(char *dst, size_t cap, const char *src) { snprintf(dst, cap, "%s", src); }

llm_chat_format llm_chat_format_of(llm_chat_kind kind) {
    llm_chat_format f;
    memset(&f, 0, sizeof f);
    f.kind = kind;
    copy_str(f.bos, sizeof f.bos, "<s>");
    copy_str(f.eos, sizeof f.eos, "</s>");
    return f;
}

/* The literal system message a ChatML template writes by itself, e.g.
 * '<|im_start|>system\nYou are ...<|im_end|>\n': text after the header (a
 * newline, real or written "\n") up to <|im_end|>, with Jinja string escapes
 * undone. Text built from variables (quotes, "{{") is not a default.
 * Returns 1 and fills dst when found. */
static int find_default_system(const char *tmpl, char *dst, size_t cap) {
    static const char head[] = "<|im_start|>system";
    for (const char *p = strstr(tmpl, head); p; p = strstr(p + 1, head)) {
        const char *q = p + sizeof head - 1;
        if (q[0] == '\n') {
            q += 1;
        } else if (q[0] == '\\' && q[1] == 'n') {
            q += 2;
        } else {
            continue;
        }
        const char *end = strstr(q, "<|im_end|>");
        if (!end || end == q) continue;
        size_t n = 0;
        int literal = 1;
        for (const char *c = q; c < end && literal; c++) {
            char ch = *c;
            if (ch == '\\' && c + 1 < end) {
                char e = *++c;
                ch = e == 'n' ? '\n' : e == 't' ? '\t' : e;
            } else if (ch == '\'' || ch == '"' || (ch == '{' && (c[1] == '{' || c[1] == '%'))) {
                literal = 0;
                break;
            }
            if (n + 1 >= cap) literal = 0;
            else dst[n++] = ch;
        }
        if (!literal) continue;
        dst[n] = '\0';
        return 1;
    }
    return 0;
}

int llm_chat_format_from_template(const char *tmpl, const char *bos_text, const char *eos_text,
                                  llm_chat_format *out) {
    if (!out) return -1;
    llm_chat_kind kind = LLM_CHAT_UNKNOWN;
    if (tmpl) {
        if (strstr(tmpl, "<|im_start|>")) kind = LLM_CHAT_CHATML;
        else if (strstr(tmpl, "<|start_header_id|>")) kind = LLM_CHAT_LLAMA3;
        else if (strstr(tmpl, "<|user|>") && strstr(tmpl, "<|assistant|>")) kind = LLM_CHAT_ZEPHYR;
        else if (strstr(tmpl, "[INST]") && strstr(tmpl, "<<SYS>>")) kind = LLM_CHAT_LLAMA2;
        else if (strstr(tmpl, "<start_of_turn>")) kind = LLM_CHAT_GEMMA;
    }
    *out = llm_chat_format_of(kind);
    if (bos_text) copy_str(out->bos, sizeof out->bos, bos_text);
    if (eos_text) copy_str(out->eos, sizeof out->eos, eos_text);
    if (kind == LLM_CHAT_CHATML) find_default_system(tmpl, out->default_system, sizeof out->default_system);
    return kind == LLM_CHAT_UNKNOWN ? -1 : 0;
}

int llm_chat_format_from_vocab(const llm_tokenizer *tok, llm_chat_format *out) {
    if (!out) return -1;
    llm_chat_kind kind = LLM_CHAT_UNKNOWN;
    if (llm_tokenizer_find(tok, "<|im_start|>", 12) >= 0) kind = LLM_CHAT_CHATML;
    else if (llm_tokenizer_find(tok, "<|start_header_id|>", 19) >= 0) kind = LLM_CHAT_LLAMA3;
    else if (llm_tokenizer_find(tok, "<|user|>", 8) >= 0) kind = LLM_CHAT_ZEPHYR;
    else if (llm_tokenizer_find(tok, "<start_of_turn>", 15) >= 0) kind = LLM_CHAT_GEMMA;
    *out = llm_chat_format_of(kind);
    int32_t bos = llm_tokenizer_bos(tok), eos = llm_tokenizer_eos(tok), n;
    const char *p;
    if (bos >= 0 && (p = llm_token_piece(tok, bos, &n)) && n < (int32_t)sizeof out->bos) {
        memcpy(out->bos, p, (size_t)n);
        out->bos[n] = '\0';
    }
    if (eos >= 0 && (p = llm_token_piece(tok, eos, &n)) && n < (int32_t)sizeof out->eos) {
        memcpy(out->eos, p, (size_t)n);
        out->eos[n] = '\0';
    }
    return kind == LLM_CHAT_UNKNOWN ? -1 : 0;
}

const char *llm_chat_turn_end(const llm_chat_format *f) {
    if (!f) return "";
    switch (f->kind) {
    case LLM_CHAT_CHATML: return "<|im_end|>";
    case LLM_CHAT_LLAMA3: return "<|eot_id|>";
    case LLM_CHAT_GEMMA: return "<end_of_turn>";
    default: return f->eos;
    }
}

/* What a format writes after its end-of-turn marker, before the next turn;
 * the model stops at the marker, so the cache never holds this. */
static const char *turn_trailer(const llm_chat_format *f) {
    return f->kind == LLM_CHAT_CHATML || f->kind == LLM_CHAT_ZEPHYR || f->kind == LLM_CHAT_GEMMA ? "\n" : "";
}

/* ---------------------------------------------------------------- rendering */

/* The length to return for text of len bytes and a buffer of cap. */
static int32_t result_len(int64_t len, int32_t cap) {
    if (len >= INT32_MAX) return LLM_CHAT_ERR;
    return len + 1 > cap ? -(int32_t)(len + 1) : (int32_t)len;
}

int32_t llm_chat_render(const llm_chat_format *f, const llm_chat_msg *m, int32_t n, int gen, char *out,
                        int32_t cap) {
    if (!f || n < 0 || (!m && n) || cap < 0 || (!out && cap)) return LLM_CHAT_ERR;
    /* Measure, then write only when it all fits (the buffer stays untouched
     * otherwise). */
    sink s = {NULL, 0, 0};
    if (render(f, m, n, gen, &s)) return LLM_CHAT_ERR;
    int32_t rc = result_len(s.len, cap);
    if (rc < 0) return rc;
    sink w = {out, s.len, 0};
    render(f, m, n, gen, &w);
    out[s.len] = '\0';
    return rc;
}

/* Render into a fresh allocation (NUL-terminated); NULL on error. */
static char *render_alloc(const llm_chat_format *f, const llm_chat_msg *m, int32_t n, int gen,
                          int64_t *len) {
    sink s = {NULL, 0, 0};
    if (render(f, m, n, gen, &s)) return NULL;
    char *buf = malloc((size_t)s.len + 1);
    if (!buf) return NULL;
    sink w = {buf, s.len, 0};
    render(f, m, n, gen, &w);
    buf[s.len] = '\0';
    *len = s.len;
    return buf;
}

int32_t llm_chat_render_continuation(const llm_chat_format *f, const llm_chat_msg *m, int32_t n,
                                     int32_t n_prev, int gen, char *out, int32_t cap) {
    if (!f || n < 0 || n_prev < 0 || n_prev > n || (!m && n) || cap < 0 || (!out && cap))
        return LLM_CHAT_ERR;
    int64_t nw = 0, np = 0;
    char *whole = render_alloc(f, m, n, gen, &nw);
    char *prev = render_alloc(f, m, n_prev, 0, &np);
    int32_t rc = LLM_CHAT_ERR;
    /* Every family here renders a conversation as a prefix of its extension;
     * if that ever fails, no tail would be right. */
    if (whole && prev && np <= nw && memcmp(prev, whole, (size_t)np) == 0) {
        int64_t from = np;
        const char *end = llm_chat_turn_end(f), *trail = turn_trailer(f);
        int64_t ne = (int64_t)strlen(end), nt = (int64_t)strlen(trail);
        /* The cache stops at the turn marker: resend what follows it. */
        if (n_prev > 0 && nt > 0 && np >= ne + nt && memcmp(prev + np - nt, trail, (size_t)nt) == 0 &&
            memcmp(prev + np - nt - ne, end, (size_t)ne) == 0)
            from -= nt;
        rc = result_len(nw - from, cap);
        if (rc >= 0) {
            memcpy(out, whole + from, (size_t)(nw - from));
            out[nw - from] = '\0';
        }
    }
    free(whole);
    free(prev);
    return rc;
}
