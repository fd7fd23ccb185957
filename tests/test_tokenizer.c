/* tests/test_tokenizer.c - the engine's tokenizers (engine/text/tokenizer.h).
 *
 * Hand-built vocabularies where the right answer follows from the
 * construction (merge order, byte fallback, special tokens, space rules);
 * round trips of random text; the pre-tokenizers against HF's regexes and
 * SmolLM2's vocabulary against HF tokenizers (tests/data/pretok_cases.txt and
 * smollm2_cases.txt, made by tests/data/gen_tokenizer_refs.py). The SmolLM2
 * tests run when the model file is present and report a skip otherwise. */
#include <stdlib.h>
#include <string.h>

#include "../engine/text/chat.h"
#include "../engine/text/tokenizer.h"
#include "test.h"

#ifndef SMOLLM2_PATH
#define SMOLLM2_PATH "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#endif

/* ---------------------------------------------------------------- helpers */

/* GPT-2 byte-to-unicode, written from its definition as an oracle: printable
 * Latin-1 bytes map to themselves, the rest to 256.. in byte order. */
static unsigned gpt2_cp(unsigned b) {
    unsigned next = 256;
    for (unsigned x = 0; x < 256; x++) {
        int printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
        if (x == b) return printable ? x : next;
        if (!printable) next++;
    }
    return 0;
}

static size_t put_utf8(unsigned cp, char *o) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | ((cp >> 6) & 63));
        o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18), o[1] = (char)(0x80 | ((cp >> 12) & 63));
    o[2] = (char)(0x80 | ((cp >> 6) & 63)), o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

/* A vocabulary under construction (strings owned here, freed by vocab_free). */
typedef struct {
    char *tok[1024];     /* token texts, stored form */
    int32_t type[1024];  /* LLM_TOKEN_* */
    float score[1024];
    int n;
    char *merge[256];    /* "left right", rank = index */
    int n_merges;
} vocab;

static int vocab_find(const vocab *v, const char *s) {
    for (int i = 0; i < v->n; i++)
        if (strcmp(v->tok[i], s) == 0) return i;
    return -1;
}

static int vocab_add(vocab *v, const char *s, int type, float score) {
    int id = vocab_find(v, s);
    if (id >= 0) return id;
    v->tok[v->n] = strdup(s);
    v->type[v->n] = type;
    v->score[v->n] = score;
    return v->n++;
}

/* Byte-level: add merge "a b" (stored forms) and its result token. */
static int vocab_merge(vocab *v, const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    char *m = malloc(na + nb + 2);
    memcpy(m, a, na);
    m[na] = ' ';
    memcpy(m + na + 1, b, nb + 1);
    v->merge[v->n_merges++] = m;
    memmove(m + na, m + na + 1, nb + 1); /* the result: a and b joined */
    int id = vocab_add(v, m, LLM_TOKEN_NORMAL, 0);
    m[na] = ' ', memcpy(m + na + 1, b, nb + 1);
    return id;
}

static void vocab_free(vocab *v) {
    for (int i = 0; i < v->n; i++) free(v->tok[i]);
    for (int i = 0; i < v->n_merges; i++) free(v->merge[i]);
}

/* Byte-level vocabulary: 0..255 the bytes, then the control tokens
 * <|endoftext|> (256, bos/eos), <|im_start|> (257), <|im_end|> (258) and the
 * user-defined <tool> (259). */
static void bytelevel_base(vocab *v, int skip_byte) {
    memset(v, 0, sizeof *v);
    for (unsigned b = 0; b < 256; b++) {
        char s[8] = {0};
        put_utf8(gpt2_cp(b), s);
        /* a skipped byte keeps its id but gets an unreachable text */
        int skip = (int)b == skip_byte;
        vocab_add(v, skip ? "<skipped>" : s, skip ? LLM_TOKEN_UNUSED : LLM_TOKEN_NORMAL, 0);
    }
    vocab_add(v, "<|endoftext|>", LLM_TOKEN_CONTROL, 0);
    vocab_add(v, "<|im_start|>", LLM_TOKEN_CONTROL, 0);
    vocab_add(v, "<|im_end|>", LLM_TOKEN_CONTROL, 0);
    vocab_add(v, "<tool>", LLM_TOKEN_USER_DEFINED, 0);
}

static llm_tokenizer *vocab_build(const vocab *v, const char *model, const char *pre, int add_bos,
                                  int add_eos) {
    llm_tokenizer_desc d = llm_tokenizer_desc_default();
    d.model = model;
    d.pre = pre;
    d.n_vocab = v->n;
    d.tokens = (const char *const *)v->tok;
    d.token_type = v->type;
    d.scores = v->score;
    d.n_merges = v->n_merges;
    d.merges = (const char *const *)v->merge;
    d.add_bos = add_bos, d.add_eos = add_eos;
    if (strcmp(model, "gpt2") == 0) {
        d.bos_id = d.eos_id = 256;
    } else {
        d.unk_id = 0, d.bos_id = 1, d.eos_id = 2;
    }
    llm_tokenizer *t = NULL;
    char err[200];
    if (llm_tokenizer_create(&d, &t, err, sizeof err) != 0) test_fail(__FILE__, __LINE__, "create: %s", err);
    return t;
}

/* Tokenize s (parse_special, no add_special) and compare with the token texts
 * in want (NULL-terminated). */
static int tokens_are(const llm_tokenizer *t, const vocab *v, const char *s, int parse_special,
                      const char *const *want) {
    int32_t ids[256];
    int32_t n = llm_tokenize(t, s, strlen(s), 0, parse_special, ids, 256);
    int k = 0;
    while (want[k]) k++;
    if (n != k) {
        fprintf(stderr, "  '%s': %d tokens, want %d:", s, n, k);
        for (int i = 0; i < n && i < 256; i++) fprintf(stderr, " [%s]", v->tok[ids[i]]);
        fputc('\n', stderr);
        return 0;
    }
    for (int i = 0; i < n; i++) {
        if (strcmp(v->tok[ids[i]], want[i]) != 0) {
            fprintf(stderr, "  '%s': token %d is [%s], want [%s]\n", s, i, v->tok[ids[i]], want[i]);
            return 0;
        }
    }
    return 1;
}
#define TOKENS(t, v, s, ps, ...) CHECK(tokens_are(t, v, s, ps, (const char *const[]){__VA_ARGS__, NULL}))

/* detokenize(tokenize(s)) == s */
static int roundtrips(const llm_tokenizer *t, const char *s, size_t n, int parse_special) {
    int32_t cap = (int32_t)(3 * n + 8);
    int32_t *ids = malloc(sizeof *ids * (size_t)cap);
    char *back = malloc(n + 1);
    int32_t k = llm_tokenize(t, s, n, 1, parse_special, ids, cap);
    int32_t m = k >= 0 ? llm_detokenize(t, ids, k, parse_special ? LLM_DETOK_SPECIAL : 0, back, (int32_t)n + 1) : -1;
    int ok = k >= 0 && m == (int32_t)n && memcmp(back, s, n) == 0;
    free(ids);
    free(back);
    return ok;
}

/* Random valid UTF-8 from a mix of scripts and spaces; never U+2581. */
static size_t random_utf8(test_rng *r, char *out, size_t max_chars) {
    static const unsigned pool[][2] = {
        {'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {' ', ' '}, {' ', ' '}, {'\n', '\n'}, {'!', '/'},
        {0xC0, 0x17F}, {0x391, 0x3C9}, {0x410, 0x44F}, {0x4E00, 0x4FFF}, {0xAC00, 0xACFF},
        {0x1F600, 0x1F64F}, {0x2000, 0x206F}, {0x80, 0xBF}, {0x10000, 0x10FFF},
    };
    size_t n = (size_t)test_rng_int(r, 0, (int)max_chars), k = 0;
    for (size_t i = 0; i < n; i++) {
        int p = test_rng_int(r, 0, (int)(sizeof pool / sizeof pool[0]) - 1);
        unsigned cp = (unsigned)test_rng_int(r, (int)pool[p][0], (int)pool[p][1]);
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
        k += put_utf8(cp, out + k);
    }
    out[k] = 0;
    return k;
}

/* ---------------------------------------------------------------- byte-level BPE */

TEST(tok_bpe_lower_rank_merges_first) {
    vocab v;
    /* "the" with only h+e (rank 0) and t+h (rank 1): he wins, then no t+he. */
    bytelevel_base(&v, -1);
    vocab_merge(&v, "h", "e");
    vocab_merge(&v, "t", "h");
    llm_tokenizer *t = vocab_build(&v, "gpt2", NULL, 0, 0);
    TOKENS(t, &v, "the", 0, "t", "he");
    llm_tokenizer_free(t);
    vocab_free(&v);
    /* the same merges ranked the other way round give th + e */
    bytelevel_base(&v, -1);
    vocab_merge(&v, "t", "h");
    vocab_merge(&v, "h", "e");
    t = vocab_build(&v, "gpt2", NULL, 0, 0);
    TOKENS(t, &v, "the", 0, "th", "e");
    llm_tokenizer_free(t);
    vocab_free(&v);
    /* a chain of merges builds the whole word, with the space ('Ġ') */
    bytelevel_base(&v, -1);
    vocab_merge(&v, "h", "e");
    vocab_merge(&v, "t", "he");
    vocab_merge(&v, "\xC4\xA0", "the");
    t = vocab_build(&v, "gpt2", NULL, 0, 0);
    TOKENS(t, &v, "the the", 0, "the", "\xC4\xA0the");
    llm_tokenizer_free(t);
    vocab_free(&v);
}

TEST(tok_bpe_equal_pairs_merge_leftmost_first) {
    vocab v;
    bytelevel_base(&v, -1);
    vocab_merge(&v, "a", "a");
    llm_tokenizer *t = vocab_build(&v, "gpt2", NULL, 0, 0);
    TOKENS(t, &v, "aaa", 0, "aa", "a");
    TOKENS(t, &v, "aaaa", 0, "aa", "aa");
    TOKENS(t, &v, "aaaaa", 0, "aa", "aa", "a");
    llm_tokenizer_free(t);
    vocab_free(&v);
}

TEST(tok_bpe_merges_stay_inside_pretokenizer_pieces) {
    vocab v;
    bytelevel_base(&v, -1);
    vocab_merge(&v, "a", "\xC4\xA0"); /* "a " never forms: the space starts the next piece */
    vocab_merge(&v, "1", "2");        /* SmolLM splits digits apart; GPT-2 keeps them */
    llm_tokenizer *t = vocab_build(&v, "gpt2", NULL, 0, 0);
    TOKENS(t, &v, "a b", 0, "a", "\xC4\xA0", "b");
    TOKENS(t, &v, "x12", 0, "x", "12");
    llm_tokenizer_free(t);
    t = vocab_build(&v, "gpt2", "smollm", 0, 0);
    TOKENS(t, &v, "x12", 0, "x", "1", "2");
    llm_tokenizer_free(t);
    vocab_free(&v);
}

TEST(tok_bpe_long_word_merges_fully) {
    /* 20000 'a's with merges a+a, aa+aa, ... up to 1024 a's: the heap keeps a
     * long piece fast, and every byte ends up in exactly one token. */
    vocab v;
    bytelevel_base(&v, -1);
    char a[2048] = "a";
    for (int k = 0; k < 10; k++) {
        vocab_merge(&v, a, a);
        size_t n = strlen(a);
        memcpy(a + n, a, n);
        a[2 * n] = 0;
    }
    llm_tokenizer *t = vocab_build(&v, "gpt2", NULL, 0, 0);
    size_t n = 20000;
    char *s = malloc(n);
    memset(s, 'a', n);
    int32_t ids[64];
    int32_t k = llm_tokenize(t, s, n, 0, 0, ids, 64);
    int32_t total = 0;
    for (int32_t i = 0; i < k; i++) total += (int32_t)strlen(v.tok[ids[i]]);
    CHECK(k > 0 && k < 64);
    CHECK_EQ_INT(total, n);
    char *back = malloc(n + 1);
    CHECK_EQ_INT(llm_detokenize(t, ids, k, 0, back, (int32_t)n + 1), n);
    CHECK(memcmp(back, s, n) == 0);
    free(back);
    free(s);
    llm_tokenizer_free(t);
    vocab_free(&v);
}

/* Well-formed UTF-8 round trips exactly. Malformed bytes are read as llama.cpp
 * reads them (U+FFFD for a byte that starts no sequence): the decoded text is
 * well-formed and encodes to the same ids again. */
TEST(tok_bpe_roundtrips_utf8_and_reads_malformed_bytes_as_replacement_characters) {
    vocab v;
    bytelevel_base(&v, -1);
    vocab_merge(&v, "\xC4\xA0", "t");
    vocab_merge(&v, "h", "e");
    vocab_merge(&v, "\xC4\xA0t", "he");
    vocab_merge(&v, "\xC3\x83", "\xC2\xA9"); /* the two bytes of "é" */
    test_rng r = {42};
    char s[600], back[2048];
    int32_t ids[2048], again[2048];
    const char *pres[] = {NULL, "llama-bpe", "qwen2", "smollm"};
    for (int p = 0; p < 4; p++) {
        llm_tokenizer *t = vocab_build(&v, "gpt2", pres[p], 0, 0);
        int bad = 0, bad_malformed = 0;
        for (int it = 0; it < 500; it++) {
            size_t n = (size_t)test_rng_int(&r, 0, 200);
            for (size_t i = 0; i < n; i++) s[i] = (char)test_rng_int(&r, 0, 255);
            int32_t k = llm_tokenize(t, s, n, 0, 0, ids, 2048);
            int32_t m = k >= 0 ? llm_detokenize(t, ids, k, 0, back, sizeof back) : -1;
            int32_t k2 = m >= 0 ? llm_tokenize(t, back, (size_t)m, 0, 0, again, 2048) : -1;
            bad_malformed += !(k2 == k && k >= 0 && memcmp(ids, again, sizeof *ids * (size_t)k) == 0);
            n = random_utf8(&r, s, 100);
            bad += !roundtrips(t, s, n, 0);
        }
        CHECK_EQ_INT(bad, 0);
        CHECK_EQ_INT(bad_malformed, 0);
        int32_t k = llm_tokenize(t, "a\xFF\x80", 3, 0, 0, ids, 2048);
        CHECK_EQ_INT(llm_detokenize(t, ids, k, 0, back, sizeof back), 7);
        CHECK(memcmp(back, "a\xEF\xBF\xBD\xEF\xBF\xBD", 7) == 0);
        llm_tokenizer_free(t);
    }
    vocab_free(&v);
}

TEST(tok_special_tokens_need_parse_special_user_defined_do_not) {
    vocab v;
    bytelevel_base(&v, -1);
    llm_tokenizer *t = vocab_build(&v, "gpt2", NULL, 0, 0);
    TOKENS(t, &v, "<|im_start|>hi<|im_end|>", 1, "<|im_start|>", "h", "i", "<|im_end|>");
    int32_t ids[64];
    const char *s = "<|im_start|>hi";
    int32_t n = llm_tokenize(t, s, strlen(s), 0, 0, ids, 64);
    CHECK_EQ_INT(n, (int)strlen(s)); /* no merges: one token per byte */
    for (int32_t i = 0; i < n; i++) CHECK(ids[i] < 256);
    TOKENS(t, &v, "a<tool>b", 0, "a", "<tool>", "b");
    TOKENS(t, &v, "<|im_end", 1, "<", "|", "i", "m", "_", "e", "n", "d");
    llm_tokenizer_free(t);
    vocab_free(&v);
}

TEST(tok_special_longest_match_wins) {
    vocab v;
    bytelevel_base(&v, -1);
    vocab_add(&v, "<x>", LLM_TOKEN_CONTROL, 0);
    vocab_add(&v, "<x>>", LLM_TOKEN_CONTROL, 0);
    llm_tokenizer *t = vocab_build(&v, "gpt2", NULL, 0, 0);
    TOKENS(t, &v, "<x>><x>", 1, "<x>>", "<x>");
    llm_tokenizer_free(t);
    vocab_free(&v);
}

TEST(tok_bos_eos_added_as_desc_says) {
    vocab v;
    bytelevel_base(&v, -1);
    int32_t ids[16];
    llm_tokenizer *t = vocab_build(&v, "gpt2", NULL, 1, 1);
    CHECK_EQ_INT(llm_tokenize(t, "a", 1, 1, 0, ids, 16), 3);
    CHECK_EQ_INT(ids[0], 256);
    CHECK_EQ_INT(ids[1], 'a');
    CHECK_EQ_INT(ids[2], 256);
    CHECK_EQ_INT(llm_tokenize(t, "a", 1, 0, 0, ids, 16), 1);
    CHECK_EQ_INT(llm_tokenize(t, "", 0, 1, 0, ids, 16), 2);
    llm_tokenizer_free(t);
    t = vocab_build(&v, "gpt2", NULL, 0, 0);
    CHECK_EQ_INT(llm_tokenize(t, "a", 1, 1, 0, ids, 16), 1);
    CHECK_EQ_INT(llm_tokenize(t, "", 0, 1, 0, ids, 16), 0);
    llm_tokenizer_free(t);
    vocab_free(&v);
}

TEST(tok_small_buffers_report_the_size_needed) {
    vocab v;
    bytelevel_base(&v, -1);
    llm_tokenizer *t = vocab_build(&v, "gpt2", NULL, 0, 0);
    int32_t ids[4] = {-7, -7, -7, -7};
    CHECK_EQ_INT(llm_tokenize(t, "hello", 5, 0, 0, ids, 4), -5);
    CHECK_EQ_INT(ids[0], -7); /* nothing written */
    CHECK_EQ_INT(llm_tokenize(t, "hello", 5, 0, 0, NULL, 0), -5);
    int32_t five[5] = {'h', 'e', 'l', 'l', 'o'};
    char buf[6];
    CHECK_EQ_INT(llm_detokenize(t, five, 5, 0, buf, 5), -6);
    CHECK_EQ_INT(llm_detokenize(t, five, 5, 0, buf, 6), 5);
    CHECK(strcmp(buf, "hello") == 0);
    CHECK_EQ_INT(llm_token_to_piece(t, 257, 1, buf, 3), -12);
    CHECK_EQ_INT(llm_token_to_piece(t, 257, 0, buf, 3), 0);
    CHECK_EQ_INT(llm_token_to_piece(t, 99999, 1, buf, 6), LLM_TOK_ERR);
    int32_t bad = 99999;
    CHECK_EQ_INT(llm_detokenize(t, &bad, 1, 0, buf, 6), LLM_TOK_ERR);
    llm_tokenizer_free(t);
    vocab_free(&v);
}

TEST(tok_byte_without_token_is_dropped) {
    vocab v;
    bytelevel_base(&v, 0xC3);
    llm_tokenizer *t = vocab_build(&v, "gpt2", NULL, 0, 0);
    TOKENS(t, &v, "a\xC3\xA9" "b", 0, "a", "\xC2\xA9", "b"); /* "é" without its first byte */
    llm_tokenizer_free(t);
    vocab_free(&v);
}

TEST(tok_specials_render_only_when_asked) {
    vocab v;
    bytelevel_base(&v, -1);
    llm_tokenizer *t = vocab_build(&v, "gpt2", NULL, 0, 0);
    int32_t ids[] = {257, 'h', 'i', 259, 258};
    char buf[64];
    CHECK_EQ_INT(llm_detokenize(t, ids, 5, 0, buf, 64), 8);
    CHECK(strcmp(buf, "hi<tool>") == 0);
    CHECK(llm_detokenize(t, ids, 5, LLM_DETOK_SPECIAL, buf, 64) > 0);
    CHECK(strcmp(buf, "<|im_start|>hi<tool><|im_end|>") == 0);
    CHECK_EQ_INT(llm_token_to_piece(t, ' ', 0, buf, 64), 1);
    CHECK(buf[0] == ' ');
    int32_t len = 0;
    const char *p = llm_token_piece(t, '\n', &len);
    CHECK(p && len == 1 && p[0] == '\n');
    CHECK(llm_token_is_eog(t, 256));
    CHECK(llm_token_is_eog(t, 258));
    CHECK(!llm_token_is_eog(t, 257));
    CHECK_EQ_INT(llm_tokenizer_find(t, "<|im_end|>", 10), 258);
    CHECK_EQ_INT(llm_tokenizer_find(t, "nope", 4), -1);
    CHECK_EQ_INT(llm_token_type(t, 259), LLM_TOKEN_USER_DEFINED);
    llm_tokenizer_free(t);
    vocab_free(&v);
}

TEST(tok_create_rejects_bad_descriptions) {
    vocab v;
    bytelevel_base(&v, -1);
    llm_tokenizer_desc d = llm_tokenizer_desc_default();
    d.model = "gpt2";
    d.n_vocab = v.n;
    d.tokens = (const char *const *)v.tok;
    llm_tokenizer *t = (llm_tokenizer *)&d;
    char err[128] = "";
    d.pre = "no-such-pre";
    CHECK(llm_tokenizer_create(&d, &t, err, sizeof err) == -1 && t == NULL && strstr(err, "no-such-pre"));
    d.pre = NULL;
    d.model = "bert";
    CHECK(llm_tokenizer_create(&d, &t, err, sizeof err) == -1 && strstr(err, "bert"));
    d.model = "gpt2";
    d.eos_id = v.n;
    CHECK(llm_tokenizer_create(&d, &t, err, sizeof err) == -1);
    d.eos_id = -1;
    const char *merges[] = {"nospace"};
    d.merges = merges;
    d.n_merges = 1;
    CHECK(llm_tokenizer_create(&d, &t, err, sizeof err) == -1 && strstr(err, "merge 0"));
    const char *no_merge[] = {NULL};
    d.merges = no_merge;
    CHECK(llm_tokenizer_create(&d, &t, err, sizeof err) == -1 && strstr(err, "merge 0"));
    d.n_merges = 0;
    CHECK(llm_tokenizer_create(&d, &t, NULL, 0) == 0 && t != NULL);
    llm_tokenizer_free(t);
    llm_tokenizer_free(NULL);
    vocab_free(&v);
}

/* ---------------------------------------------------------------- SentencePiece-style */

#define SP "\xE2\x96\x81" /* '▁' */

/* <unk> <s> </s>, the 256 byte tokens, then normal pieces with scores. */
static void spm_base(vocab *v) {
    memset(v, 0, sizeof *v);
    vocab_add(v, "<unk>", LLM_TOKEN_UNKNOWN, 0);
    vocab_add(v, "<s>", LLM_TOKEN_CONTROL, 0);
    vocab_add(v, "</s>", LLM_TOKEN_CONTROL, 0);
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        vocab_add(v, s, LLM_TOKEN_BYTE, 0);
    }
    const char *pieces[] = {SP, "h", "e", "l", "o", "w", "r", "d", "a", "b", "c"};
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) vocab_add(v, pieces[i], LLM_TOKEN_NORMAL, -100);
}

TEST(tok_spm_highest_score_merges_first) {
    vocab v;
    spm_base(&v);
    vocab_add(&v, "ab", LLM_TOKEN_NORMAL, -1);
    vocab_add(&v, "bc", LLM_TOKEN_NORMAL, -2);
    llm_tokenizer *t = vocab_build(&v, "llama", NULL, 0, 0);
    TOKENS(t, &v, "abc", 0, SP, "ab", "c");
    llm_tokenizer_free(t);
    v.score[vocab_find(&v, "bc")] = 0; /* now bc outscores ab */
    t = vocab_build(&v, "llama", NULL, 0, 0);
    TOKENS(t, &v, "abc", 0, SP, "a", "bc");
    llm_tokenizer_free(t);
    vocab_free(&v);
}

TEST(tok_spm_spaces_become_prefixed_pieces) {
    vocab v;
    spm_base(&v);
    vocab_add(&v, "he", LLM_TOKEN_NORMAL, -5);
    vocab_add(&v, "ll", LLM_TOKEN_NORMAL, -4);
    vocab_add(&v, "llo", LLM_TOKEN_NORMAL, -3);
    vocab_add(&v, SP "he", LLM_TOKEN_NORMAL, -3);
    vocab_add(&v, SP "hello", LLM_TOKEN_NORMAL, -1);
    vocab_add(&v, "wor", LLM_TOKEN_NORMAL, -50);
    vocab_add(&v, "or", LLM_TOKEN_NORMAL, -6);
    llm_tokenizer *t = vocab_build(&v, "llama", NULL, 1, 0);
    TOKENS(t, &v, "hello", 0, SP "hello");
    TOKENS(t, &v, "hello hello", 0, SP "hello", SP "hello");
    TOKENS(t, &v, " hello", 0, SP, SP "hello");
    TOKENS(t, &v, "word", 0, SP, "wor", "d"); /* o+r first, then w+or: any pair that is a token */
    int32_t ids[16];
    CHECK_EQ_INT(llm_tokenize(t, "hello", 5, 1, 0, ids, 16), 2);
    CHECK_EQ_INT(ids[0], 1); /* <s> */
    char buf[32];
    CHECK_EQ_INT(llm_detokenize(t, ids, 2, 0, buf, 32), 5);
    CHECK(strcmp(buf, "hello") == 0);
    CHECK_EQ_INT(llm_detokenize(t, ids, 2, LLM_DETOK_KEEP_SPACE, buf, 32), 6);
    CHECK(strcmp(buf, " hello") == 0);
    llm_tokenizer_free(t);
    vocab_free(&v);
}

TEST(tok_spm_unknown_characters_fall_back_to_bytes) {
    vocab v;
    spm_base(&v);
    llm_tokenizer *t = vocab_build(&v, "llama", NULL, 0, 0);
    TOKENS(t, &v, "h\xC3\xA9", 0, SP, "h", "<0xC3>", "<0xA9>");
    TOKENS(t, &v, "\xF0\x9F\x98\x80", 0, SP, "<0xF0>", "<0x9F>", "<0x98>", "<0x80>");
    TOKENS(t, &v, "a\xFF", 0, SP, "a", "<0xFF>"); /* invalid UTF-8 too */
    llm_tokenizer_free(t);
    vocab_free(&v);
}

TEST(tok_spm_special_tokens_restart_the_space_prefix) {
    vocab v;
    spm_base(&v);
    llm_tokenizer *t = vocab_build(&v, "llama", NULL, 0, 0);
    TOKENS(t, &v, "a<s>b", 1, SP, "a", "<s>", SP, "b");
    TOKENS(t, &v, "<s>b", 1, "<s>", SP, "b");
    char buf[32];
    int32_t ids[16];
    int32_t n = llm_tokenize(t, "a<s>b", 5, 0, 1, ids, 16);
    CHECK_EQ_INT(llm_detokenize(t, ids, n, LLM_DETOK_SPECIAL, buf, 32), 5);
    CHECK(strcmp(buf, "a<s>b") == 0);
    llm_tokenizer_free(t);
    vocab_free(&v);
}

/* SentencePiece (Gemma 3's "  ", "\t\t"): GGUF stores user-defined pieces with
 * spaces, not '▁', and they are cut out of the raw text, longest first; what
 * is left between them is encoded as usual. */
TEST(tok_spm_user_defined_whitespace_runs_are_cut_out) {
    vocab v;
    spm_base(&v);
    vocab_add(&v, "  ", LLM_TOKEN_USER_DEFINED, 0);
    vocab_add(&v, "   ", LLM_TOKEN_USER_DEFINED, 0);
    vocab_add(&v, "\t\t", LLM_TOKEN_USER_DEFINED, 0);
    vocab_add(&v, "\t", LLM_TOKEN_NORMAL, -100);
    llm_tokenizer *t = vocab_build(&v, "llama", NULL, 0, 0);
    /* (this vocabulary adds the space prefix after each special token too) */
    TOKENS(t, &v, "a  b", 0, SP, "a", "  ", SP, "b");
    TOKENS(t, &v, "a     b", 0, SP, "a", "   ", "  ", SP, "b");
    TOKENS(t, &v, "a \t\t\t", 0, SP, "a", SP, "\t\t", SP, "\t");
    llm_tokenizer_free(t);
    vocab_free(&v);
}

TEST(tok_spm_roundtrips_random_utf8) {
    vocab v;
    spm_base(&v);
    vocab_add(&v, SP "a", LLM_TOKEN_NORMAL, -1);
    vocab_add(&v, "ab", LLM_TOKEN_NORMAL, -2);
    vocab_add(&v, "\xC3\xA9", LLM_TOKEN_NORMAL, -3);
    llm_tokenizer *t = vocab_build(&v, "llama", NULL, 1, 0);
    test_rng r = {7};
    char s[600];
    int bad = 0;
    for (int it = 0; it < 1000; it++) {
        size_t n = random_utf8(&r, s, 100);
        bad += !roundtrips(t, s, n, 0);
    }
    CHECK_EQ_INT(bad, 0);
    llm_tokenizer_free(t);
    vocab_free(&v);
}

/* ---------------------------------------------------------------- reference data */

/* One line of a cases file: "[pre] <hex> <n> <n ints>". Returns 1 when read. */
typedef struct {
    char pre[32];       /* pretok_cases.txt: the pre-tokenizer name */
    char text[4096];    /* decoded input */
    size_t len;
    int32_t vals[2048]; /* expected ids or end offsets */
    int n;
} ref_case;

static int read_case(FILE *f, int with_pre, ref_case *c) {
    char hex[8200];
    for (;;) {
        int ch = fgetc(f);
        if (ch == EOF) return 0;
        if (ch == '#') {
            while (ch != '\n' && ch != EOF) ch = fgetc(f);
            continue;
        }
        ungetc(ch, f);
        break;
    }
    if (with_pre && fscanf(f, "%31s", c->pre) != 1) return 0;
    if (fscanf(f, "%8199s %d", hex, &c->n) != 2 || c->n < 0 || c->n > 2048) return 0;
    c->len = 0;
    if (strcmp(hex, "-") != 0) {
        for (size_t i = 0; hex[i] && hex[i + 1]; i += 2) {
            unsigned v;
            sscanf(hex + i, "%2x", &v);
            c->text[c->len++] = (char)v;
        }
    }
    for (int i = 0; i < c->n; i++)
        if (fscanf(f, "%d", &c->vals[i]) != 1) return 0;
    return 1;
}

TEST(tok_pretokenizers_match_hf_regex_splits) {
    FILE *f = fopen("tests/data/pretok_cases.txt", "r");
    CHECK(f != NULL);
    if (!f) return;
    static ref_case c;
    int n_cases = 0, bad = 0;
    while (read_case(f, 1, &c)) {
        int32_t ends[2048];
        int32_t n = llm_pretokenize(c.pre, c.text, c.len, ends, 2048);
        int ok = n == c.n;
        for (int i = 0; ok && i < n; i++) ok = ends[i] == c.vals[i];
        if (!ok && bad++ < 5) {
            fprintf(stderr, "  %s '%.*s': %d pieces, want %d; ends", c.pre, (int)c.len, c.text, n, c.n);
            for (int i = 0; i < n && i < 20; i++) fprintf(stderr, " %d", ends[i]);
            fprintf(stderr, " want");
            for (int i = 0; i < c.n && i < 20; i++) fprintf(stderr, " %d", c.vals[i]);
            fputc('\n', stderr);
        }
        n_cases++;
    }
    fclose(f);
    CHECK(n_cases >= 1000);
    CHECK_EQ_INT(bad, 0);
}

/* ---------------------------------------------------------------- SmolLM2 from its GGUF */

/* The tokenizer metadata of a GGUF file, read by a minimal reader local to
 * this test (the engine's GGUF reader can replace load_vocab_from_gguf). */
typedef struct {
    char model[32], pre[32];
    char **tokens;      /* [n_vocab] */
    int32_t *tok_len;   /* [n_vocab] */
    int32_t *types;     /* [n_vocab] */
    int32_t n_vocab;
    char **merges;      /* [n_merges] */
    int32_t *merge_len; /* [n_merges] */
    int32_t n_merges;
    int32_t bos, eos, unk, pad;
    int add_bos, add_eos;
    char *chat_template;
} gguf_vocab;

static int rd(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n ? 0 : -1; }

static char *rd_str(FILE *f, int32_t *len) {
    uint64_t n;
    if (rd(f, &n, 8) || n > (1u << 24)) return NULL;
    char *s = malloc(n + 1);
    if (!s || rd(f, s, n)) return free(s), NULL;
    s[n] = 0;
    if (len) *len = (int32_t)n;
    return s;
}

static size_t gguf_scalar_size(uint32_t type) {
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return type < 13 ? sz[type] : 0;
}

static void gguf_vocab_free(gguf_vocab *v) {
    for (int32_t i = 0; v->tokens && i < v->n_vocab; i++) free(v->tokens[i]);
    for (int32_t i = 0; v->merges && i < v->n_merges; i++) free(v->merges[i]);
    free(v->tokens), free(v->tok_len), free(v->types), free(v->merges), free(v->merge_len);
    free(v->chat_template);
    memset(v, 0, sizeof *v);
}

static int load_vocab_from_gguf(const char *path, gguf_vocab *v) {
    memset(v, 0, sizeof *v);
    v->bos = v->eos = v->unk = v->pad = -1;
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    uint32_t magic, version;
    uint64_t n_tensors, n_kv;
    int rc = -1;
    if (rd(f, &magic, 4) || memcmp(&magic, "GGUF", 4) || rd(f, &version, 4) || version < 2 ||
        rd(f, &n_tensors, 8) || rd(f, &n_kv, 8))
        goto done;
    for (uint64_t k = 0; k < n_kv; k++) {
        char *key = rd_str(f, NULL);
        uint32_t type;
        if (!key || rd(f, &type, 4)) goto fail_key;
        if (type == 8) {
            int32_t n;
            char *s = rd_str(f, &n);
            if (!s) goto fail_key;
            if (!strcmp(key, "tokenizer.ggml.model")) snprintf(v->model, sizeof v->model, "%s", s);
            if (!strcmp(key, "tokenizer.ggml.pre")) snprintf(v->pre, sizeof v->pre, "%s", s);
            if (!strcmp(key, "tokenizer.chat_template")) v->chat_template = s, s = NULL;
            free(s);
        } else if (type == 9) {
            uint32_t et;
            uint64_t n;
            if (rd(f, &et, 4) || rd(f, &n, 8) || n > (1u << 22)) goto fail_key;
            if (et == 8) {
                char **arr = malloc(sizeof *arr * n);
                int32_t *lens = malloc(sizeof *lens * n);
                for (uint64_t i = 0; i < n; i++) arr[i] = rd_str(f, &lens[i]);
                if (!strcmp(key, "tokenizer.ggml.tokens")) {
                    v->tokens = arr, v->tok_len = lens, v->n_vocab = (int32_t)n;
                } else if (!strcmp(key, "tokenizer.ggml.merges")) {
                    v->merges = arr, v->merge_len = lens, v->n_merges = (int32_t)n;
                } else {
                    for (uint64_t i = 0; i < n; i++) free(arr[i]);
                    free(arr), free(lens);
                }
            } else {
                size_t es = gguf_scalar_size(et);
                char *buf = malloc(es * n + 1);
                if (!es || !buf || rd(f, buf, es * n)) goto fail_key;
                if (!strcmp(key, "tokenizer.ggml.token_type") && es == 4) v->types = (int32_t *)buf, buf = NULL;
                free(buf);
            }
        } else {
            size_t es = gguf_scalar_size(type);
            unsigned char b[8] = {0};
            if (!es || rd(f, b, es)) goto fail_key;
            uint32_t u32;
            memcpy(&u32, b, 4);
            if (!strcmp(key, "tokenizer.ggml.bos_token_id")) v->bos = (int32_t)u32;
            if (!strcmp(key, "tokenizer.ggml.eos_token_id")) v->eos = (int32_t)u32;
            if (!strcmp(key, "tokenizer.ggml.unknown_token_id")) v->unk = (int32_t)u32;
            if (!strcmp(key, "tokenizer.ggml.padding_token_id")) v->pad = (int32_t)u32;
            if (!strcmp(key, "tokenizer.ggml.add_bos_token")) v->add_bos = b[0];
            if (!strcmp(key, "tokenizer.ggml.add_eos_token")) v->add_eos = b[0];
        }
        free(key);
        continue;
    fail_key:
        free(key);
        goto done;
    }
    rc = v->tokens ? 0 : -1;
done:
    fclose(f);
    return rc;
}

static llm_tokenizer *smollm2_tokenizer(gguf_vocab *v) {
    if (load_vocab_from_gguf(SMOLLM2_PATH, v) != 0) {
        printf("     skipped: no %s (make model)\n", SMOLLM2_PATH);
        return NULL;
    }
    llm_tokenizer_desc d = llm_tokenizer_desc_default();
    d.model = v->model;
    d.pre = v->pre;
    d.n_vocab = v->n_vocab;
    d.tokens = (const char *const *)v->tokens;
    d.token_len = v->tok_len;
    d.token_type = v->types;
    d.n_merges = v->n_merges;
    d.merges = (const char *const *)v->merges;
    d.merge_len = v->merge_len;
    d.bos_id = v->bos, d.eos_id = v->eos, d.unk_id = v->unk, d.pad_id = v->pad;
    d.add_bos = v->add_bos, d.add_eos = v->add_eos;
    llm_tokenizer *t = NULL;
    char err[200];
    if (llm_tokenizer_create(&d, &t, err, sizeof err) != 0) test_fail(__FILE__, __LINE__, "create: %s", err);
    return t;
}

TEST(tok_smollm2_vocabulary_facts) {
    gguf_vocab v;
    llm_tokenizer *t = smollm2_tokenizer(&v);
    if (!t) return gguf_vocab_free(&v);
    CHECK(strcmp(v.model, "gpt2") == 0 && strcmp(v.pre, "smollm") == 0);
    CHECK_EQ_INT(llm_tokenizer_n_vocab(t), 49152);
    CHECK_EQ_INT(v.n_merges, 48900);
    CHECK_EQ_INT(llm_tokenizer_bos(t), 1);
    CHECK_EQ_INT(llm_tokenizer_eos(t), 2);
    CHECK(!v.add_bos && !v.add_eos);
    CHECK_EQ_INT(llm_tokenizer_find(t, "<|im_start|>", 12), 1);
    CHECK_EQ_INT(llm_tokenizer_find(t, "<|im_end|>", 10), 2);
    CHECK(llm_token_is_eog(t, 2) && llm_token_is_eog(t, 0) && !llm_token_is_eog(t, 1));
    CHECK(v.chat_template && strstr(v.chat_template, "<|im_start|>"));
    llm_tokenizer_free(t);
    gguf_vocab_free(&v);
}

TEST(tok_smollm2_matches_hf_tokenizers) {
    gguf_vocab v;
    llm_tokenizer *t = smollm2_tokenizer(&v);
    if (!t) return gguf_vocab_free(&v);
    FILE *f = fopen("tests/data/smollm2_cases.txt", "r");
    CHECK(f != NULL);
    static ref_case c;
    int n_cases = 0, bad = 0, bad_trip = 0;
    while (f && read_case(f, 0, &c)) {
        int32_t ids[2048];
        int32_t n = llm_tokenize(t, c.text, c.len, 1, 1, ids, 2048);
        int ok = n == c.n;
        for (int i = 0; ok && i < n; i++) ok = ids[i] == c.vals[i];
        if (!ok && bad++ < 5) {
            fprintf(stderr, "  '%.*s': %d ids, want %d:", (int)c.len, c.text, n, c.n);
            for (int i = 0; i < n && i < 24; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, " want");
            for (int i = 0; i < c.n && i < 24; i++) fprintf(stderr, " %d", c.vals[i]);
            fputc('\n', stderr);
        }
        bad_trip += !roundtrips(t, c.text, c.len, 1);
        n_cases++;
    }
    if (f) fclose(f);
    CHECK(n_cases >= 300);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(bad_trip, 0);
    llm_tokenizer_free(t);
    gguf_vocab_free(&v);
}

/* The GGUF's own template selects ChatML with SmolLM2's default system
 * message, and the rendered prompt tokenizes into its markers. */
TEST(tok_smollm2_chat_prompt_from_its_template) {
    gguf_vocab v;
    llm_tokenizer *t = smollm2_tokenizer(&v);
    if (!t) return gguf_vocab_free(&v);
    llm_chat_format f;
    CHECK_EQ_INT(llm_chat_format_from_template(v.chat_template, NULL, NULL, &f), 0);
    CHECK_EQ_INT(f.kind, LLM_CHAT_CHATML);
    CHECK(strcmp(f.default_system, "You are a helpful AI assistant named SmolLM, trained by Hugging Face") == 0);
    llm_chat_msg m[] = {{"user", "What is the capital of France?"}};
    char text[512];
    int32_t n = llm_chat_render(&f, m, 1, 1, text, sizeof text);
    CHECK(n > 0);
    int32_t ids[256];
    int32_t k = llm_tokenize(t, text, (size_t)n, 1, 1, ids, 256);
    CHECK(k > 10);
    int starts = 0, ends = 0;
    for (int32_t i = 0; i < k; i++) starts += ids[i] == 1, ends += ids[i] == 2;
    CHECK(ids[0] == 1 && starts == 3 && ends == 2); /* system, user, assistant headers */
    char back[512];
    CHECK_EQ_INT(llm_detokenize(t, ids, k, LLM_DETOK_SPECIAL, back, sizeof back), n);
    CHECK(strcmp(back, text) == 0);
    llm_tokenizer_free(t);
    gguf_vocab_free(&v);
}
