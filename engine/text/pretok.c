/* engine/text/pretok.c - pre-tokenizer patterns for byte-level BPE, as hand-written
 * matchers (see pretok.h for the regexes they implement). No regex engine: each
 * alternative is a few lines over classified characters, which is both faster
 * and easier to check against the regex than a general matcher would be. */
#include "pretok.h"

#include <string.h>

#include "unicode.h"

int llm_pre_lookup(const char *name, llm_pre_kind *kind, int *ignore_merges) {
    static const struct {
        const char *name;
        llm_pre_kind kind;
        int ignore_merges;
    } names[] = {
        {"default", LLM_PRE_DEFAULT, 0}, {"gpt2", LLM_PRE_GPT2, 0},
        {"gpt-2", LLM_PRE_GPT2, 0},    {"mpt", LLM_PRE_GPT2, 0},
        {"olmo", LLM_PRE_GPT2, 0},     {"jais", LLM_PRE_GPT2, 0},
        {"llama-bpe", LLM_PRE_LLAMA3, 1}, {"llama3", LLM_PRE_LLAMA3, 1},
        {"llama-v3", LLM_PRE_LLAMA3, 1},  {"dbrx", LLM_PRE_LLAMA3, 0},
        {"smaug-bpe", LLM_PRE_LLAMA3, 0}, {"qwen2", LLM_PRE_QWEN2, 0},
        {"stablelm2", LLM_PRE_QWEN2, 0},  {"deepseek-r1-qwen", LLM_PRE_QWEN2, 0},
        {"smollm", LLM_PRE_SMOLLM, 0},    {"starcoder", LLM_PRE_SMOLLM, 0},
        {"refact", LLM_PRE_SMOLLM, 0},    {"command-r", LLM_PRE_SMOLLM, 0},
        {"codeshell", LLM_PRE_SMOLLM, 0},
    };
    if (!name) name = "default";
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(name, names[i].name) == 0) {
            *kind = names[i].kind;
            *ignore_merges = names[i].ignore_merges;
            return 0;
        }
    }
    return -1;
}

/* ---------------------------------------------------------------- helpers */

static int is_crlf(uint32_t cp) { return cp == '\r' || cp == '\n'; }

/* First index >= i in [i, n) whose class is not cls. */
static size_t run_end(const llm_pchar *c, size_t i, size_t n, int cls) {
    while (i < n && c[i].cls == cls) i++;
    return i;
}

/* ASCII case folding for (?i:...); U+017F LATIN SMALL LETTER LONG S folds to
 * 's' under Unicode case folding, which the HF regex engine applies. */
static uint32_t fold(uint32_t cp, int icase) {
    if (!icase) return cp;
    if (cp >= 'A' && cp <= 'Z') return cp + 32;
    if (cp == 0x17F) return 's';
    return cp;
}

/* 's|'t|'re|'ve|'m|'ll|'d at i: the match length in characters, or 0. */
static size_t match_contraction(const llm_pchar *c, size_t i, size_t n, int icase) {
    if (c[i].cp != '\'' || i + 1 >= n) return 0;
    uint32_t a = fold(c[i + 1].cp, icase);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 >= n) return 0;
    uint32_t b = fold(c[i + 2].cp, icase);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* \s+(?!\S) then \s+, at i where c[i] is whitespace: the whole run when it
 * reaches the end of the piece; otherwise all but its last character (which
 * is left to prefix the next word), unless that would leave nothing. */
static size_t match_space_run(const llm_pchar *c, size_t i, size_t n) {
    size_t k = run_end(c, i, n, LLM_CC_SPACE);
    if (k == n || k - i < 2) return k - i;
    return k - 1 - i;
}

/* ---------------------------------------------------------------- patterns */

/* GPT-2: length in characters of the match at i (>= 1). */
static size_t match_gpt2(const llm_pchar *c, size_t i, size_t n) {
    size_t m = match_contraction(c, i, n, 0);
    if (m) return m;
    /* ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional U+0020, then a
     * run of one class. Backtracking past the space never helps: a space is
     * in none of these classes. */
    size_t j = i + (c[i].cp == ' ' && i + 1 < n);
    if (c[j].cls != LLM_CC_SPACE) return run_end(c, j, n, c[j].cls) - i;
    return match_space_run(c, i, n);
}

/* Llama 3 (max_digits 3) and Qwen2 (max_digits 1). */
static size_t match_llama3(const llm_pchar *c, size_t i, size_t n, size_t max_digits) {
    size_t m = match_contraction(c, i, n, 1);
    if (m) return m;
    const llm_pchar *ci = &c[i];
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (ci->cls == LLM_CC_LETTER) return run_end(c, i, n, LLM_CC_LETTER) - i;
    if (ci->cls != LLM_CC_NUMBER && !is_crlf(ci->cp) && i + 1 < n && c[i + 1].cls == LLM_CC_LETTER)
        return run_end(c, i + 1, n, LLM_CC_LETTER) - i;
    /* \p{N}{1,3} */
    if (ci->cls == LLM_CC_NUMBER) {
        size_t k = run_end(c, i, n, LLM_CC_NUMBER) - i;
        return k < max_digits ? k : max_digits;
    }
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    size_t j = i + (ci->cp == ' ' && i + 1 < n);
    if (c[j].cls == LLM_CC_OTHER) {
        size_t k = run_end(c, j, n, LLM_CC_OTHER);
        while (k < n && is_crlf(c[k].cp)) k++;
        return k - i;
    }
    /* \s*[\r\n]+: greedy \s* backs off to the last line break of the run, and
     * [\r\n]+ then takes just that one (nothing after it is a line break). */
    size_t k = run_end(c, i, n, LLM_CC_SPACE), last_nl = 0;
    for (size_t p = i; p < k; p++)
        if (is_crlf(c[p].cp)) last_nl = p + 1;
    if (last_nl) return last_nl - i;
    return match_space_run(c, i, n);
}

/* ---------------------------------------------------------------- driver */

/* Run one pattern over characters [a, b) of c[0..n), which act as the whole
 * text (the end of the range is the end of input for (?!\S)). */
static int split_range(llm_pre_kind kind, const llm_pchar *c, size_t a, size_t b, size_t n,
                       size_t len, llm_piece_fn emit, void *ctx) {
    size_t i = a;
    while (i < b) {
        size_t m;
        switch (kind) {
        case LLM_PRE_LLAMA3: m = match_llama3(c, i, b, 3); break;
        case LLM_PRE_QWEN2: m = match_llama3(c, i, b, 1); break;
        default: m = match_gpt2(c, i, b); break;
        }
        int rc = emit(ctx, c[i].off, i + m < n ? c[i + m].off : len);
        if (rc) return rc;
        i += m;
    }
    return 0;
}

/* Emits characters [a, b) of c[0..n), or [a, len) in bytes at the end. */
static int emit_chars(const llm_pchar *c, size_t a, size_t b, size_t n, size_t len, llm_piece_fn emit,
                      void *ctx) {
    return a < b ? emit(ctx, c[a].off, b < n ? c[b].off : len) : 0;
}

static int is_ascii_digit(uint32_t cp) { return cp >= '0' && cp <= '9'; }

/* DEFAULT's last two splits over one piece [a, b): runs of \p{N} apart from
 * the rest, and within a run each three ASCII digits in a row apart. */
static int split_numbers(const llm_pchar *c, size_t a, size_t b, size_t n, size_t len, llm_piece_fn emit,
                         void *ctx) {
    for (size_t i = a; i < b;) {
        int cls = c[i].cls == LLM_CC_NUMBER;
        size_t k = i;
        while (k < b && (c[k].cls == LLM_CC_NUMBER) == cls) k++;
        size_t gap = i;
        for (size_t p = i; cls && p + 3 <= k;) {
            if (is_ascii_digit(c[p].cp) && is_ascii_digit(c[p + 1].cp) && is_ascii_digit(c[p + 2].cp)) {
                int rc = emit_chars(c, gap, p, n, len, emit, ctx);
                if (!rc) rc = emit_chars(c, p, p + 3, n, len, emit, ctx);
                if (rc) return rc;
                gap = p += 3;
            } else {
                p++;
            }
        }
        int rc = emit_chars(c, gap, k, n, len, emit, ctx);
        if (rc) return rc;
        i = k;
    }
    return 0;
}

/* [\p{P}\$\+<=>\^~\|]: the first of DEFAULT's classes. */
static int is_default_punct(uint32_t cp) {
    return cp < 0x80 ? cp == '$' || cp == '+' || cp == '<' || cp == '=' || cp == '>' || cp == '^' || cp == '~' ||
                           cp == '|' || llm_unicode_is_punct(cp)
                     : llm_unicode_is_punct(cp);
}

static int split_default(const llm_pchar *c, size_t n, size_t len, llm_piece_fn emit, void *ctx) {
    for (size_t a = 0; a < n;) {
        int punct = is_default_punct(c[a].cp);
        size_t b = a;
        while (b < n && is_default_punct(c[b].cp) == punct) b++;
        /* A run of punctuation passes the later splits whole; between runs,
         * GPT2 treats [a, b) as the whole text. */
        for (size_t i = a; i < b;) {
            size_t m = punct ? b - a : match_gpt2(c, i, b);
            int rc = split_numbers(c, i, i + m, n, len, emit, ctx);
            if (rc) return rc;
            i += m;
        }
        a = b;
    }
    return 0;
}

int llm_pre_split(llm_pre_kind kind, const char *text, size_t len, llm_pchar *c,
                  llm_piece_fn emit, void *ctx) {
    const unsigned char *s = (const unsigned char *)text;
    size_t n = 0;
    for (size_t off = 0; off < len; n++) {
        c[n].off = (uint32_t)off;
        off += (size_t)llm_utf8_decode(s + off, len - off, &c[n].cp);
        c[n].cls = (uint8_t)llm_unicode_class(c[n].cp);
    }
    if (kind == LLM_PRE_DEFAULT) return split_default(c, n, len, emit, ctx);
    if (kind != LLM_PRE_SMOLLM) return split_range(kind, c, 0, n, n, len, emit, ctx);
    /* Digits first: each number character alone; GPT-2 between them. */
    size_t a = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && c[i].cls != LLM_CC_NUMBER) continue;
        int rc = split_range(LLM_PRE_GPT2, c, a, i, n, len, emit, ctx);
        if (rc) return rc;
        if (i < n) {
            rc = emit(ctx, c[i].off, i + 1 < n ? c[i + 1].off : len);
            if (rc) return rc;
        }
        a = i + 1;
    }
    return 0;
}
