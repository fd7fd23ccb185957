/* engine/text/chat.c - chat prompt formats (see chat.h). Each family is a short
 * function that writes what its Jinja template would, with the same
 * whitespace handling (Llama 3 trims content, Llama 2 strips it, ChatML and
 * Zephyr keep it as is). */
#include "chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unicode.h"

/* ---------------------------------------------------------------- output */

/* Where the template wrote one of its markers: [at, at + len) of the text. */
typedef struct {
    int64_t at, len;
} span;

/* Appends while there is room and counts everything, so one pass both
 * measures and (when the buffer is big enough) writes. A sink with marks set
 * also records where each marker went (llm_chat_tokenize). */
typedef struct {
    char *out;   /* [cap] destination */
    int64_t cap;
    int64_t len; /* bytes produced so far, written or not */
    span *marks; /* [n_marks] (grown as needed), or NULL: not recorded */
    int32_t n_marks, cap_marks;
    int oom;     /* a mark could not be recorded */
} sink;

static void put(sink *s, const char *p, size_t n) {
    if (n && s->len + (int64_t)n <= s->cap) memcpy(s->out + s->len, p, n);
    s->len += (int64_t)n;
}

static void puts_(sink *s, const char *p) { put(s, p, strlen(p)); }

/* The template's own markers (turn and header delimiters, BOS and EOS
 * text), as opposed to what the messages bring: only these may become
 * control tokens. */
static void mark(sink *s, const char *p) {
    if (s->marks) {
        if (s->n_marks == s->cap_marks) {
            int32_t nc = s->cap_marks ? 2 * s->cap_marks : 16;
            span *m = realloc(s->marks, sizeof *m * (size_t)nc);
            if (!m) s->oom = 1;
            else s->marks = m, s->cap_marks = nc;
        }
        if (s->n_marks < s->cap_marks) s->marks[s->n_marks++] = (span){s->len, (int64_t)strlen(p)};
    }
    puts_(s, p);
}

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
    sink none = {.out = NULL};
    return put_strip(&none, p, 1, 1) == 0;
}

static int is_role(const llm_chat_msg *m, const char *role) { return strcmp(m->role, role) == 0; }

/* ---------------------------------------------------------------- families */

static void render_chatml(const llm_chat_format *f, const llm_chat_msg *m, int32_t n, int gen, sink *s) {
    /* SmolLM2/Qwen insert their default inside the loop: only when n >= 1. */
    if (n > 0 && f->default_system[0] && !is_role(&m[0], "system")) {
        mark(s, "<|im_start|>");
        puts_(s, "system\n");
        puts_(s, f->default_system);
        mark(s, "<|im_end|>");
        puts_(s, "\n");
    }
    for (int32_t i = 0; i < n; i++) {
        mark(s, "<|im_start|>");
        puts_(s, m[i].role);
        puts_(s, "\n");
        puts_(s, m[i].content);
        mark(s, "<|im_end|>");
        puts_(s, "\n");
    }
    if (gen) mark(s, "<|im_start|>"), puts_(s, "assistant\n");
    if (gen && f->no_think) mark(s, "<think>"), puts_(s, "\n\n"), mark(s, "</think>"), puts_(s, "\n\n");
}

static void render_llama3(const llm_chat_msg *m, int32_t n, int gen, sink *s) {
    for (int32_t i = 0; i < n; i++) {
        mark(s, "<|start_header_id|>");
        puts_(s, m[i].role);
        mark(s, "<|end_header_id|>");
        puts_(s, "\n\n");
        put_strip(s, m[i].content, 1, 1);
        mark(s, "<|eot_id|>");
    }
    if (gen) {
        mark(s, "<|start_header_id|>");
        puts_(s, "assistant");
        mark(s, "<|end_header_id|>");
        puts_(s, "\n\n");
    }
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
            if (i > first) mark(s, f->bos);
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
            mark(s, f->eos);
        }
    }
}

static void render_zephyr(const llm_chat_format *f, const llm_chat_msg *m, int32_t n, int gen, sink *s) {
    for (int32_t i = 0; i < n; i++) {
        /* the template has a branch for these three roles only */
        if (!is_role(&m[i], "user") && !is_role(&m[i], "system") && !is_role(&m[i], "assistant")) continue;
        /* one of the three: a header the template writes */
        mark(s, is_role(&m[i], "user") ? "<|user|>" : is_role(&m[i], "system") ? "<|system|>" : "<|assistant|>");
        puts_(s, "\n");
        puts_(s, m[i].content);
        mark(s, f->eos);
        puts_(s, "\n");
    }
    /* the template writes it inside the loop, after the last message */
    if (gen && n > 0) mark(s, "<|assistant|>"), puts_(s, "\n");
}

/* Gemma's template: the system message and a blank line start the first turn
 * (the system text as is, the user's trimmed), roles other than "assistant"
 * keep their names. */
static void render_gemma(const llm_chat_msg *m, int32_t n, int gen, sink *s) {
    const char *system = NULL;
    int32_t first = 0;
    if (n > 0 && is_role(&m[0], "system")) system = m[0].content, first = 1;
    for (int32_t i = first; i < n; i++) {
        mark(s, "<start_of_turn>");
        puts_(s, is_role(&m[i], "assistant") ? "model" : m[i].role);
        puts_(s, "\n");
        if (i == first && system) {
            puts_(s, system);
            puts_(s, "\n\n");
        }
        put_strip(s, m[i].content, 1, 1);
        mark(s, "<end_of_turn>");
        puts_(s, "\n");
    }
    if (gen) mark(s, "<start_of_turn>"), puts_(s, "model\n");
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
    if (kind == LLM_CHAT_CHATML) {
        find_default_system(tmpl, out->default_system, sizeof out->default_system);
        /* Qwen3: the empty think block behind the switch, written with
         * escapes or real newlines */
        out->think_switch = strstr(tmpl, "enable_thinking") &&
                            (strstr(tmpl, "<think>\\n\\n</think>\\n\\n") || strstr(tmpl, "<think>\n\n</think>\n\n"));
    }
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

int llm_chat_set_thinking(llm_chat_format *f, int enable) {
    if (!f || !f->think_switch) return -1;
    f->no_think = !enable;
    return 0;
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
    sink s = {.out = NULL};
    if (render(f, m, n, gen, &s)) return LLM_CHAT_ERR;
    int32_t rc = result_len(s.len, cap);
    if (rc < 0) return rc;
    sink w = {.out = out, .cap = s.len};
    render(f, m, n, gen, &w);
    out[s.len] = '\0';
    return rc;
}

/* Render into a fresh allocation (NUL-terminated); NULL on error. */
static char *render_alloc(const llm_chat_format *f, const llm_chat_msg *m, int32_t n, int gen,
                          int64_t *len) {
    sink s = {.out = NULL};
    if (render(f, m, n, gen, &s)) return NULL;
    char *buf = malloc((size_t)s.len + 1);
    if (!buf) return NULL;
    sink w = {.out = buf, .cap = s.len};
    render(f, m, n, gen, &w);
    buf[s.len] = '\0';
    *len = s.len;
    return buf;
}

/* Where the text after the first n_prev of the n messages starts in whole
 * [nw], their rendering: where the rendering of the n_prev alone ends, less
 * the trailer after its last turn marker (the cache stops at the marker, so
 * what follows it is sent again). -1 when that rendering is not a prefix of
 * whole (no family here renders so; if one did, no tail would be right). */
static int64_t continuation_from(const llm_chat_format *f, const llm_chat_msg *m, int32_t n_prev, const char *whole,
                                 int64_t nw) {
    if (n_prev == 0) return 0;
    int64_t np = 0;
    char *prev = render_alloc(f, m, n_prev, 0, &np);
    int64_t from = -1;
    if (prev && np <= nw && memcmp(prev, whole, (size_t)np) == 0) {
        from = np;
        const char *end = llm_chat_turn_end(f), *trail = turn_trailer(f);
        int64_t ne = (int64_t)strlen(end), nt = (int64_t)strlen(trail);
        if (nt > 0 && np >= ne + nt && memcmp(prev + np - nt, trail, (size_t)nt) == 0 &&
            memcmp(prev + np - nt - ne, end, (size_t)ne) == 0)
            from -= nt;
    }
    free(prev);
    return from;
}

int32_t llm_chat_render_continuation(const llm_chat_format *f, const llm_chat_msg *m, int32_t n,
                                     int32_t n_prev, int gen, char *out, int32_t cap) {
    if (!f || n < 0 || n_prev < 0 || n_prev > n || (!m && n) || cap < 0 || (!out && cap))
        return LLM_CHAT_ERR;
    int64_t nw = 0;
    char *whole = render_alloc(f, m, n, gen, &nw);
    int64_t from = whole ? continuation_from(f, m, n_prev, whole, nw) : -1;
    int32_t rc = LLM_CHAT_ERR;
    if (from >= 0) {
        rc = result_len(nw - from, cap);
        if (rc >= 0) {
            memcpy(out, whole + from, (size_t)(nw - from));
            out[nw - from] = '\0';
        }
    }
    free(whole);
    return rc;
}

/* ---------------------------------------------------------------- tokens */

/* A growing array of ids. */
typedef struct {
    int32_t *ids;
    int32_t n, cap;
    int oom;
} id_list;

static int32_t *id_room(id_list *l, int32_t more) {
    if (l->oom) return NULL;
    if ((int64_t)l->n + more > l->cap) {
        int64_t nc = ((int64_t)l->n + more) * 2;
        int32_t *p = nc <= INT32_MAX ? realloc(l->ids, sizeof(int32_t) * (size_t)nc) : NULL;
        if (!p) { l->oom = 1; return NULL; }
        l->ids = p, l->cap = (int32_t)nc;
    }
    return l->ids + l->n;
}

static void push_id(id_list *l, int32_t id) {
    int32_t *at = id_room(l, 1);
    if (at) *at = id, l->n++;
}

/* Appends the ids of text[0..len), control tokens not recognised. */
static void push_text(id_list *l, const llm_tokenizer *tok, const char *text, size_t len) {
    int32_t need = llm_tokenize(tok, text, len, 0, 0, NULL, 0);
    if (need == LLM_TOK_ERR) { l->oom = 1; return; }
    need = need < 0 ? -need : need;
    int32_t *at = need ? id_room(l, need) : NULL;
    if (!at) return;
    if (llm_tokenize(tok, text, len, 0, 0, at, need) != need) l->oom = 1;
    else l->n += need;
}

/* The id a marker stands for, when the vocabulary has it as a special token. */
static int32_t marker_id(const llm_tokenizer *tok, const char *text, size_t len) {
    int32_t id = llm_tokenizer_find(tok, text, len);
    int type = llm_token_type(tok, id);
    return type == LLM_TOKEN_CONTROL || type == LLM_TOKEN_UNKNOWN || type == LLM_TOKEN_USER_DEFINED ? id : -1;
}

int32_t llm_chat_tokenize_continuation(const llm_chat_format *f, const llm_tokenizer *tok, const llm_chat_msg *m,
                                       int32_t n, int32_t n_prev, int gen, int add_special, int32_t **out) {
    if (out) *out = NULL;
    if (!f || !tok || !out || n < 0 || n_prev < 0 || n_prev > n || (!m && n)) return LLM_CHAT_ERR;
    int64_t len = 0;
    char *text = render_alloc(f, m, n, gen, &len);
    if (!text) return LLM_CHAT_ERR;
    int64_t from = continuation_from(f, m, n_prev, text, len);
    sink s = {.out = text, .cap = len};
    s.marks = from >= 0 ? malloc(sizeof(span) * 16) : NULL;
    s.cap_marks = s.marks ? 16 : 0;
    if (s.marks) render(f, m, n, gen, &s);   /* again, recording where the markers go */
    id_list l = {NULL, 0, 0, !s.marks || s.oom};
    /* BOS (and EOS) where llm_tokenize would add them around the whole text */
    int32_t ends[4], n_ends = add_special ? llm_tokenize(tok, "", 0, 1, 0, ends, 4) : 0;
    if (n_ends < 0) n_ends = 0, l.oom = 1;
    int32_t n_bos = n_ends > 0 && ends[0] == llm_tokenizer_bos(tok);
    if (n_bos) push_id(&l, ends[0]);
    /* Text between two markers is tokenized on its own, as llm_tokenize with
     * parse_special does between the control tokens it finds: the same ids,
     * except that what the messages wrote stays text. */
    for (int32_t k = 0; k <= s.n_marks && !l.oom; k++) {
        int64_t at = k < s.n_marks ? s.marks[k].at : len;
        if (at < from) continue; /* in the part already sent */
        int32_t id = k < s.n_marks ? marker_id(tok, text + at, (size_t)s.marks[k].len) : -1;
        if (id < 0 && k < s.n_marks) continue;   /* not a token of this vocabulary: plain text */
        push_text(&l, tok, text + from, (size_t)(at - from));
        if (id >= 0) push_id(&l, id), from = at + s.marks[k].len;
    }
    for (int32_t k = n_bos; k < n_ends; k++) push_id(&l, ends[k]);
    free(s.marks);
    free(text);
    if (l.oom) {
        free(l.ids);
        return LLM_CHAT_ERR;
    }
    *out = l.ids;
    return l.n;
}

int32_t llm_chat_tokenize(const llm_chat_format *f, const llm_tokenizer *tok, const llm_chat_msg *m, int32_t n,
                          int gen, int add_special, int32_t **out) {
    return llm_chat_tokenize_continuation(f, tok, m, n, 0, gen, add_special, out);
}
