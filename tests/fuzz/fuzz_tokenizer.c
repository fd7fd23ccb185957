/* tests/fuzz/fuzz_tokenizer.c - libFuzzer target for the tokenizers and chat
 * templates.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Iengine \
 *       tests/fuzz/fuzz_tokenizer.c engine/text/tokenizer.c engine/text/tokenizer_encode.c \
 *       engine/text/pretok.c engine/text/unicode.c engine/text/chat.c engine/status.c -lm -o /tmp/fuzz_tok
 *   /tmp/fuzz_tok -max_total_time=60
 *
 * The first byte picks what the rest of the input drives:
 *   0, 1  tokenize with fixed byte-level vocabularies (each pre-tokenizer) and
 *         a SentencePiece-style one with Gemma-like runs of spaces, tabs and
 *         newlines, parse_special on and off; every result must encode again
 *         to the same ids from its decoded text, and decode back to the input
 *         exactly when the input is well-formed UTF-8 (SPM: and has no literal
 *         '▁', which SPM reads as a space)
 *   2     the input as a chat template and as messages (split at NUL bytes):
 *         detection, rendering, and continuation == whole minus cached prefix
 *   3     the input as a vocabulary (tokens split at '\n', merges from token
 *         pairs): create must accept or reject cleanly, and encoding with it
 *         must not crash */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/text/chat.h"
#include "../../engine/text/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK_OR_DIE(c)                                                         \
    do {                                                                        \
        if (!(c)) {                                                             \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #c);             \
            abort();                                                            \
        }                                                                       \
    } while (0)

/* ---------------------------------------------------------------- fixed vocabularies */

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static size_t enc_utf8(unsigned cp, char *o) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 63)), 2;
}

/* GPT-2 byte-to-unicode, from its definition */
static unsigned gpt2_cp(unsigned b) {
    unsigned next = 256;
    for (unsigned x = 0; x < 256; x++) {
        int printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
        if (x == b) return printable ? x : next;
        if (!printable) next++;
    }
    return 0;
}

enum { N_PRE = 5 };
static const char *const pres[N_PRE] = {"gpt2", "llama-bpe", "qwen2", "smollm", "default"};
static llm_tokenizer *bpe[N_PRE], *spm;

static void build_bpe(void) {
    static char *tok[400];
    static int32_t type[400];
    static char *merges[64];
    int n = 0, nm = 0;
    for (unsigned b = 0; b < 256; b++) {
        char s[4] = {0};
        tok[n] = dup_n(s, enc_utf8(gpt2_cp(b), s));
        type[n++] = LLM_TOKEN_NORMAL;
    }
    const char *specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im"};
    for (int i = 0; i < 4; i++) tok[n] = dup_n(specials[i], strlen(specials[i])), type[n++] = LLM_TOKEN_CONTROL;
    tok[n] = dup_n("<tool>", 6), type[n++] = LLM_TOKEN_USER_DEFINED;
    /* merges "a b" with result tokens; \xC4\xA0 is 'Ġ' (space) */
    const char *pairs[][2] = {{"t", "h"}, {"th", "e"}, {"\xC4\xA0", "the"}, {"i", "n"}, {"\xC4\xA0", "a"},
                              {"e", "r"}, {"1", "2"}, {"12", "3"}, {"\xC4\xA0", "\xC4\xA0"},
                              {"\xC4\x8A", "\xC4\x8A"}, {"\xC3\x83", "\xC2\xA9"}, {"a", "a"}, {"aa", "aa"}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        char m[32], r[32];
        snprintf(m, sizeof m, "%s %s", pairs[i][0], pairs[i][1]);
        snprintf(r, sizeof r, "%s%s", pairs[i][0], pairs[i][1]);
        merges[nm++] = dup_n(m, strlen(m));
        tok[n] = dup_n(r, strlen(r)), type[n++] = LLM_TOKEN_NORMAL;
    }
    for (int p = 0; p < N_PRE; p++) {
        llm_tokenizer_desc d = llm_tokenizer_desc_default();
        d.model = "gpt2";
        d.pre = pres[p];
        d.n_vocab = n;
        d.tokens = (const char *const *)tok;
        d.token_type = type;
        d.n_merges = nm;
        d.merges = (const char *const *)merges;
        d.bos_id = d.eos_id = 256;
        d.add_bos = d.add_eos = 1;
        CHECK_OR_DIE(llm_tokenizer_create(&d, &bpe[p], NULL, 0) == 0);
    }
}

static void build_spm(void) {
    static char *tok[400];
    static int32_t type[400];
    static float score[400];
    int n = 0;
    const char *head[] = {"<unk>", "<s>", "</s>"};
    int32_t head_type[] = {LLM_TOKEN_UNKNOWN, LLM_TOKEN_CONTROL, LLM_TOKEN_CONTROL};
    for (int i = 0; i < 3; i++) tok[n] = dup_n(head[i], strlen(head[i])), type[n++] = head_type[i];
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        tok[n] = dup_n(s, 6), type[n++] = LLM_TOKEN_BYTE;
    }
    const char *pieces[] = {"\xE2\x96\x81", "a", "b", "c", "e", "h", "l", "o", "\xE2\x96\x81" "a",
                            "ab", "bc", "he", "ll", "llo", "\xE2\x96\x81" "he", "\xE2\x96\x81" "hello",
                            "\xC3\xA9", "\xE4\xBD\xA0", "\xE2\x96\x81\xE2\x96\x81"};
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) {
        tok[n] = dup_n(pieces[i], strlen(pieces[i]));
        score[n] = -(float)i;
        type[n++] = LLM_TOKEN_NORMAL;
    }
    const char *runs[] = {"  ", "   ", "\t", "\t\t", "\n", "\n\n"};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++)
        tok[n] = dup_n(runs[i], strlen(runs[i])), type[n++] = LLM_TOKEN_USER_DEFINED;
    llm_tokenizer_desc d = llm_tokenizer_desc_default();
    d.model = "llama";
    d.n_vocab = n;
    d.tokens = (const char *const *)tok;
    d.token_type = type;
    d.scores = score;
    d.unk_id = 0, d.bos_id = 1, d.eos_id = 2;
    d.add_bos = 1;
    CHECK_OR_DIE(llm_tokenizer_create(&d, &spm, NULL, 0) == 0);
}

/* ---------------------------------------------------------------- modes */

/* Tokenize (checking the size protocol), decode, and compare with the input
 * when exact is set; when stable, the decoded text must encode to the same
 * ids again; with add_special the result must be the same ids with n_added
 * more around them (bos/eos; n_added < 0: not checked). */
static void roundtrip(const llm_tokenizer *t, const char *s, size_t n, int parse_special, int exact, int stable,
                      int n_added) {
    int32_t need = llm_tokenize(t, s, n, 0, parse_special, NULL, 0);
    CHECK_OR_DIE(need != LLM_TOK_ERR);
    int32_t cap = need < 0 ? -need : need;
    int32_t *ids = malloc(sizeof *ids * (size_t)(cap + 2));
    int32_t k = llm_tokenize(t, s, n, 0, parse_special, ids, cap);
    CHECK_OR_DIE(k == cap);
    if (n_added >= 0) {
        int32_t *with = malloc(sizeof *with * (size_t)(cap + 2));
        int32_t k2 = llm_tokenize(t, s, n, 1, parse_special, with, cap + 2);
        CHECK_OR_DIE(k2 == k + n_added);
        CHECK_OR_DIE(k == 0 || memcmp(with + (k2 > k ? 1 : 0), ids, sizeof *ids * (size_t)k) == 0);
        free(with);
    }
    int flags = parse_special ? LLM_DETOK_SPECIAL : 0;
    int32_t len = llm_detokenize(t, ids, k, flags, NULL, 0);
    CHECK_OR_DIE(len < 0 && len != LLM_TOK_ERR);
    char *back = malloc((size_t)-len);
    CHECK_OR_DIE(llm_detokenize(t, ids, k, flags, back, -len) == -len - 1);
    if (exact && ((size_t)(-len - 1) != n || memcmp(back, s, n) != 0)) {
        fprintf(stderr, "round trip failed (parse_special %d): %zu bytes in, %d out\n", parse_special, n, -len - 1);
        abort();
    }
    if (stable) {
        int32_t *again = malloc(sizeof *again * (size_t)(k + 8));
        CHECK_OR_DIE(llm_tokenize(t, back, (size_t)(-len - 1), 0, parse_special, again, k + 8) == k);
        CHECK_OR_DIE(k == 0 || memcmp(again, ids, sizeof *ids * (size_t)k) == 0);
        free(again);
    }
    for (int32_t i = 0; i < k; i++) {
        char piece[16];
        int32_t plen = -1;
        const char *p = llm_token_piece(t, ids[i], &plen);
        int32_t got = llm_token_to_piece(t, ids[i], 1, piece, sizeof piece);
        CHECK_OR_DIE(p && plen >= 0 && (got == plen || (plen > (int32_t)sizeof piece && got == -plen)));
        CHECK_OR_DIE(got < 0 || memcmp(piece, p, (size_t)got) == 0);
    }
    free(ids);
    free(back);
}

/* Is s [n] well-formed UTF-8 (no overlong form, surrogate or value past
 * U+10FFFF)? */
static int well_formed(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned b = s[i];
        size_t len = b < 0x80 ? 1 : b >= 0xC2 && b <= 0xDF ? 2 : (b & 0xF0) == 0xE0 ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
        if (!len || i + len > n) return 0;
        uint32_t c = len == 1 ? b : b & (0x7Fu >> len);
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            c = c << 6 | (s[i + k] & 0x3Fu);
        }
        if ((len == 3 && c < 0x800) || (len == 4 && (c < 0x10000 || c > 0x10FFFF)) || (c >= 0xD800 && c <= 0xDFFF))
            return 0;
        i += len;
    }
    return 1;
}

static void fuzz_tokenize(const char *s, size_t n) {
    int has_sp = 0, ok = well_formed((const unsigned char *)s, n);
    for (size_t i = 0; i + 2 < n; i++)
        if ((unsigned char)s[i] == 0xE2 && (unsigned char)s[i + 1] == 0x96 && (unsigned char)s[i + 2] == 0x81)
            has_sp = 1;
    for (int p = 0; p < N_PRE; p++) {
        roundtrip(bpe[p], s, n, 0, ok, 1, 2);
        roundtrip(bpe[p], s, n, 1, ok, 1, 2);
    }
    /* a literal '▁' decodes as a space, which user-defined runs of spaces then match */
    roundtrip(spm, s, n, 0, ok && !has_sp, !has_sp, 1);
    roundtrip(spm, s, n, 1, ok && !has_sp, !has_sp, 1);
    int32_t ends[64];
    for (int p = 0; p < N_PRE; p++) {
        int32_t k = llm_pretokenize(pres[p], s, n, ends, 64);
        CHECK_OR_DIE(k != LLM_TOK_ERR);
        if (k > 0) CHECK_OR_DIE(ends[k - 1] == (int32_t)n);
        for (int32_t i = 1; i < k && i < 64; i++) CHECK_OR_DIE(ends[i] > ends[i - 1]);
    }
}

static void fuzz_chat(const char *s, size_t n) {
    char *z = dup_n(s, n); /* NUL-terminated; embedded NULs split messages */
    llm_chat_format f;
    llm_chat_format_from_template(z, NULL, NULL, &f);
    static const char *roles[] = {"system", "user", "assistant", "user", "assistant", "tool"};
    llm_chat_msg m[16];
    int nm = 0;
    for (size_t at = 0; at <= n && nm < 16;) {
        m[nm].role = roles[nm % 6];
        m[nm].content = z + at;
        nm++;
        at += strlen(z + at) + 1;
    }
    for (int kind = LLM_CHAT_CHATML; kind <= LLM_CHAT_GEMMA; kind++) {
        llm_chat_format g = llm_chat_format_of((llm_chat_kind)kind);
        if (kind == LLM_CHAT_CHATML) memcpy(g.default_system, f.default_system, sizeof g.default_system);
        for (int gen = 0; gen < 2; gen++) {
            int32_t need = llm_chat_render(&g, m, nm, gen, NULL, 0);
            CHECK_OR_DIE(need < 0 && need != LLM_CHAT_ERR);
            char *whole = malloc((size_t)-need);
            CHECK_OR_DIE(llm_chat_render(&g, m, nm, gen, whole, -need) == -need - 1);
            for (int p = 0; p <= nm; p++) {
                int32_t cn = llm_chat_render_continuation(&g, m, nm, p, gen, NULL, 0);
                CHECK_OR_DIE(cn < 0 && cn != LLM_CHAT_ERR);
                char *tail = malloc((size_t)-cn);
                CHECK_OR_DIE(llm_chat_render_continuation(&g, m, nm, p, gen, tail, -cn) == -cn - 1);
                size_t wl = strlen(whole), tl = strlen(tail);
                CHECK_OR_DIE(tl <= wl && memcmp(whole + wl - tl, tail, tl) == 0);
                free(tail);
            }
            free(whole);
        }
    }
    free(z);
}

static void fuzz_vocab(const char *s, size_t n) {
    char *tok[256];
    int32_t len[256], type[256];
    int nt = 0;
    for (size_t at = 0; at < n && nt < 256;) {
        const char *e = memchr(s + at, '\n', n - at);
        size_t l = e ? (size_t)(e - (s + at)) : n - at;
        tok[nt] = (char *)s + at;
        len[nt] = (int32_t)l;
        type[nt] = l ? (unsigned char)s[at] % 7 : LLM_TOKEN_NORMAL;
        nt++;
        at += l + 1;
    }
    if (nt == 0) return;
    char *merges[64];
    int nm = 0;
    for (int i = 0; i + 1 < nt && nm < 64; i += 2) {
        size_t l = (size_t)len[i] + 1 + (size_t)len[i + 1];
        merges[nm] = malloc(l + 1);
        memcpy(merges[nm], tok[i], (size_t)len[i]);
        merges[nm][len[i]] = ' ';
        memcpy(merges[nm] + len[i] + 1, tok[i + 1], (size_t)len[i + 1]);
        merges[nm][l] = 0;
        nm++;
    }
    for (int model = 0; model < 2; model++) {
        llm_tokenizer_desc d = llm_tokenizer_desc_default();
        d.model = model ? "llama" : "gpt2";
        d.pre = "llama-bpe";
        d.n_vocab = nt;
        d.tokens = (const char *const *)tok;
        d.token_len = len;
        d.token_type = type;
        d.n_merges = model ? 0 : nm;
        d.merges = (const char *const *)merges;
        d.bos_id = 0;
        d.eos_id = nt - 1;
        d.add_bos = d.add_eos = 1;
        llm_tokenizer *t = NULL;
        if (llm_tokenizer_create(&d, &t, NULL, 0) != 0) continue;
        roundtrip(t, s, n, 0, 0, 0, -1);
        roundtrip(t, s, n, 1, 0, 0, -1);
        llm_tokenizer_free(t);
    }
    for (int i = 0; i < nm; i++) free(merges[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready;
    if (!ready) {
        build_bpe();
        build_spm();
        ready = 1;
    }
    if (size == 0) return 0;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    switch (data[0] & 3) {
    case 0:
    case 1: fuzz_tokenize(s, n); break;
    case 2: fuzz_chat(s, n); break;
    default: fuzz_vocab(s, n); break;
    }
    return 0;
}
