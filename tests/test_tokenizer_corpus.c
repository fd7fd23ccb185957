/* tests/test_tokenizer_corpus.c - the real models' tokenizers against an
 * independent one on real text.
 *
 * tests/data/tokenizer/NAME.txt holds texts of every kind a user sends (a
 * license with indented headings, code in several languages, markdown tables,
 * a chat transcript, numbers and dates, many scripts, emoji and combining
 * marks, CRLF, runs of spaces, tabs and newlines, malformed UTF-8);
 * expected/NAME.MODEL.ids holds llama.cpp's ids for the same bytes
 * (scripts/tokenizer-fixtures.py). Every file must match id for id, and
 * decode back to its bytes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "real_model.h"
#include "test.h"
#include "../engine/text/chat.h"
#include "../engine/gguf/gguf.h"
#include "../engine/text/tokenizer.h"
#include "../engine/text/tokenizer_gguf.h"

#define CORPUS "tests/data/tokenizer/"
#define SMOLLM2_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define GEMMA3_MODEL "models/gemma-3-270m-Q4_K_M.gguf"

static const char *const texts[] = {
    "license_gpl3", "code_python", "code_go", "code_web", "code_shell_make", "markdown", "chat",
    "numbers_dates", "multilingual", "whitespace", "crlf", "invalid_utf8", "template_chatml", "template_gemma",
    "template_llama3", "template_llama2", "template_zephyr",
};
enum { N_TEXTS = sizeof texts / sizeof texts[0] };

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        test_fail(__FILE__, __LINE__, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) free(buf), buf = NULL;
    fclose(f);
    if (!buf) return NULL;
    buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

/* The ids of expected/<stem>.<model>.ids into a malloc'ed array. */
static int32_t *read_ids(const char *stem, const char *model, int32_t *n) {
    char path[256];
    snprintf(path, sizeof path, CORPUS "expected/%s.%s.ids", stem, model);
    size_t len;
    char *s = read_all(path, &len);
    if (!s) return NULL;
    int32_t *ids = malloc(sizeof *ids * (len / 2 + 1));
    *n = 0;
    for (char *p = s, *end; ids; p = end) {
        long v = strtol(p, &end, 10);
        if (end == p) break;
        ids[(*n)++] = (int32_t)v;
    }
    free(s);
    return ids;
}

/* Index of the first id where got and want part, or -1 when they are equal. */
static int32_t first_difference(const int32_t *got, int32_t n_got, const int32_t *want, int32_t n_want) {
    for (int32_t i = 0; i < n_got && i < n_want; i++)
        if (got[i] != want[i]) return i;
    return n_got == n_want ? -1 : (n_got < n_want ? n_got : n_want);
}

/* Tokenizes the corpus text stem with t as message content is (no BOS,
 * special-token text as plain text, or parsed when parse_special) and
 * compares with the fixture; prints the first difference. 1 when equal. */
static int matches_fixture(const llm_tokenizer *t, const char *model, const char *stem, const char *fixture,
                           int parse_special, int quiet) {
    char path[256];
    snprintf(path, sizeof path, CORPUS "%s.txt", stem);
    size_t len;
    char *text = read_all(path, &len);
    int32_t n_want = 0, *want = read_ids(fixture, model, &n_want);
    if (!text || !want) return free(text), free(want), 0;
    int32_t cap = (int32_t)len + 16, *got = malloc(sizeof *got * (size_t)cap);
    int32_t n = llm_tokenize(t, text, len, 0, parse_special, got, cap);
    int32_t at = n < 0 ? 0 : first_difference(got, n, want, n_want);
    if (at >= 0 && !quiet) {
        fprintf(stderr, "  %s/%s: %d ids, llama.cpp %d; first difference at id %d:", model, fixture, (int)n,
                (int)n_want, (int)at);
        for (int32_t i = at; i < n && i < at + 8; i++) fprintf(stderr, " %d", (int)got[i]);
        fprintf(stderr, " | llama.cpp");
        for (int32_t i = at; i < n_want && i < at + 8; i++) fprintf(stderr, " %d", (int)want[i]);
        fputc('\n', stderr);
    }
    free(text), free(want), free(got);
    return at < 0;
}

/* detokenize(tokenize(text)) == text, byte for byte; for malformed UTF-8,
 * which both tokenizers read as llama.cpp does (byte-level BPE: U+FFFD for a
 * byte that starts no sequence; SentencePiece: a lead byte takes the bytes it
 * announces into its byte fallback, a following space's '▁' included), only
 * tokenize(detokenize(ids)) == ids. */
static int roundtrips(const llm_tokenizer *t, const char *stem, int malformed) {
    char path[256];
    snprintf(path, sizeof path, CORPUS "%s.txt", stem);
    size_t len;
    char *text = read_all(path, &len);
    if (!text) return 0;
    int32_t cap = (int32_t)len + 16, *ids = malloc(sizeof *ids * (size_t)cap);
    int32_t n = llm_tokenize(t, text, len, 0, 0, ids, cap);
    int32_t cap_back = 3 * (int32_t)len + 64;
    char *back = malloc((size_t)cap_back);
    int32_t bl = n >= 0 ? llm_detokenize(t, ids, n, 0, back, cap_back) : -1;
    int ok = bl == (int32_t)len && memcmp(back, text, len) == 0;
    if (malformed && bl >= 0) {
        int32_t *again = malloc(sizeof *again * (size_t)(bl + 16));
        int32_t n2 = llm_tokenize(t, back, (size_t)bl, 0, 0, again, bl + 16);
        ok = !ok && n2 == n && memcmp(again, ids, sizeof *ids * (size_t)n) == 0;
        free(again);
    }
    if (!ok) fprintf(stderr, "  %s: %d bytes back for %zu\n", stem, (int)bl, len);
    free(text), free(ids), free(back);
    return ok;
}

static void check_corpus(const char *path, const char *fetch_arg, const char *model) {
    llm_model *m = rm_load(path, fetch_arg);
    if (!m) return;
    const llm_tokenizer *t = llm_model_tokenizer(m);
    int bad = 0, bad_trip = 0;
    for (int i = 0; i < N_TEXTS; i++) {
        bad += !matches_fixture(t, model, texts[i], texts[i], 0, 0);
        bad_trip += !roundtrips(t, texts[i], !strcmp(texts[i], "invalid_utf8"));
    }
    /* a rendered chat: the markers are parsed as the control tokens they name */
    bad += !matches_fixture(t, model, "chat", "chat.special", 1, 0);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(bad_trip, 0);
    llm_model_free(m);
}

TEST(tokenizer_corpus_smollm2_equals_llama_cpp) { check_corpus(SMOLLM2_MODEL, NULL, "smollm2"); }

TEST(tokenizer_corpus_gemma3_equals_llama_cpp) { check_corpus(GEMMA3_MODEL, "gemma3-270m", "gemma3"); }

/* The GGUF file at path (fetched first when missing), open in *g; NULL, with
 * the test failed, when it cannot be had. */
static llm_gguf *open_gguf(const char *path, const char *fetch_arg) {
    llm_model *m = rm_load(path, fetch_arg);
    if (!m) return NULL;
    llm_model_free(m);
    llm_gguf *g = NULL;
    char err[256];
    if (llm_gguf_open(path, &g, err, sizeof err) != 0) test_fail(__FILE__, __LINE__, "%s: %s", path, err);
    return g;
}

/* The comparison catches a wrong whitespace rule: Gemma 3's vocabulary with
 * the runs of spaces, tabs and newlines treated as ordinary pieces (what an
 * earlier version did), or with a space prefixed to the text, parts from
 * llama.cpp on the whitespace-heavy texts. */
TEST(tokenizer_corpus_catches_a_broken_whitespace_rule) {
    llm_gguf *g = open_gguf(GEMMA3_MODEL, "gemma3-270m");
    if (!g) return;
    char err[256];
    llm_vocab_desc v;
    CHECK_EQ_INT(llm_vocab_desc_read(g, &v, err, sizeof err), LLM_OK);
    llm_tokenizer *t;
    CHECK_EQ_INT(llm_tokenizer_create(&v.desc, &t, err, sizeof err), 0);
    CHECK(matches_fixture(t, "gemma3", "whitespace", "whitespace", 0, 1)); /* as built from the file */
    llm_tokenizer_free(t);

    for (int32_t i = 0; i < v.desc.n_vocab; i++) {
        int blank = v.token_len[i] > 0;
        for (int32_t k = 0; k < v.token_len[i]; k++) blank &= strchr(" \t\n", v.tokens[i][k]) != NULL;
        if (blank && v.token_type[i] == LLM_TOKEN_USER_DEFINED) v.token_type[i] = LLM_TOKEN_NORMAL;
    }
    CHECK_EQ_INT(llm_tokenizer_create(&v.desc, &t, err, sizeof err), 0);
    CHECK(!matches_fixture(t, "gemma3", "whitespace", "whitespace", 0, 1));
    CHECK(!matches_fixture(t, "gemma3", "license_gpl3", "license_gpl3", 0, 1));
    CHECK(!matches_fixture(t, "gemma3", "code_python", "code_python", 0, 1));
    llm_tokenizer_free(t);
    llm_vocab_desc_free(&v);

    CHECK_EQ_INT(llm_vocab_desc_read(g, &v, err, sizeof err), LLM_OK);
    v.desc.add_space_prefix = 1;
    CHECK_EQ_INT(llm_tokenizer_create(&v.desc, &t, err, sizeof err), 0);
    CHECK(!matches_fixture(t, "gemma3", "whitespace", "whitespace", 0, 1));
    llm_tokenizer_free(t);
    llm_vocab_desc_free(&v);
    llm_gguf_close(g);
}

/* A conversation rendered by the model's chat template equals the template's
 * own rendering (template_*.txt, from the Jinja template), and both ways of
 * tokenizing it (the text with special tokens parsed, and llm_chat_tokenize,
 * which the server uses) give llama.cpp's ids for it: every turn boundary is
 * the model's marker ids. */
static void check_template(const char *path, const char *fetch_arg, const char *model, const char *stem) {
    llm_model *m = rm_load(path, fetch_arg);
    if (!m) return;
    llm_chat_msg msgs[] = {{"system", "You are terse."},
                           {"user", "Hi!  How are you?\n\tFine?"},
                           {"assistant", "Good."},
                           {"user", "List 3 colours."}};
    char file[256], text[1024];
    snprintf(file, sizeof file, CORPUS "%s.txt", stem);
    size_t len;
    char *want = read_all(file, &len);
    int32_t n = llm_chat_render(llm_model_chat(m), msgs, 4, 1, text, sizeof text);
    CHECK(want && n == (int32_t)len && memcmp(text, want, len) == 0);
    if (want && (n != (int32_t)len || memcmp(text, want, len)))
        fprintf(stderr, "  rendered:\n%.*s\n  template:\n%s\n", (int)n, text, want);
    char fixture[128];
    snprintf(fixture, sizeof fixture, "%s.special", stem);
    CHECK(matches_fixture(llm_model_tokenizer(m), model, stem, fixture, 1, 0));
    /* the server's path: markers from the template, messages as text */
    int32_t *ids = NULL, n_want = 0, *want_ids = read_ids(fixture, model, &n_want);
    int32_t k = llm_chat_tokenize(llm_model_chat(m), llm_model_tokenizer(m), msgs, 4, 1, 0, &ids);
    CHECK(want_ids && k == n_want && first_difference(ids, k, want_ids, n_want) < 0);
    free(ids), free(want_ids), free(want);
    llm_model_free(m);
}

TEST(tokenizer_chatml_template_turn_boundaries_equal_llama_cpp) {
    check_template(SMOLLM2_MODEL, NULL, "smollm2", "template_chatml");
}

TEST(tokenizer_gemma_template_turn_boundaries_equal_llama_cpp) {
    check_template(GEMMA3_MODEL, "gemma3-270m", "gemma3", "template_gemma");
}

/* Every byte-level pre-tokenizer pattern, on SmolLM2's vocabulary: the file's
 * tokenizer.ggml.pre replaced (expected/NAME.smollm2-PRE.ids come from a
 * vocabulary-only copy of the file naming PRE, through llama.cpp). */
TEST(tokenizer_corpus_bpe_pretokenizers_equal_llama_cpp) {
    llm_gguf *g = open_gguf(SMOLLM2_MODEL, NULL);
    if (!g) return;
    char err[256];
    static const char *const pres[] = {"gpt-2", "default", "llama-bpe", "qwen2"};
    for (size_t p = 0; p < sizeof pres / sizeof pres[0]; p++) {
        llm_vocab_desc v;
        CHECK_EQ_INT(llm_vocab_desc_read(g, &v, err, sizeof err), LLM_OK);
        v.desc.pre = pres[p];
        llm_tokenizer *t;
        CHECK_EQ_INT(llm_tokenizer_create(&v.desc, &t, err, sizeof err), 0);
        char model[64];
        snprintf(model, sizeof model, "smollm2-%s", pres[p]);
        int bad = 0;
        for (int i = 0; i < N_TEXTS; i++) bad += !matches_fixture(t, model, texts[i], texts[i], 0, 0);
        if (bad) fprintf(stderr, "  pre-tokenizer %s: %d texts differ\n", pres[p], bad);
        CHECK_EQ_INT(bad, 0);
        llm_tokenizer_free(t);
        llm_vocab_desc_free(&v);
    }
    llm_gguf_close(g);
}

/* The templates of models not at hand: SmolLM2's vocabulary with the
 * template's markers appended as control tokens (as the fixture script gives
 * llama.cpp), the conversation rendered (equal to the Jinja template's
 * rendering) and tokenized by llm_chat_tokenize. */
static void check_foreign_template(llm_chat_kind kind, const char *name, const char *const *markers, int n_markers) {
    llm_gguf *g = open_gguf(SMOLLM2_MODEL, NULL);
    if (!g) return;
    char err[256];
    llm_vocab_desc v;
    CHECK_EQ_INT(llm_vocab_desc_read(g, &v, err, sizeof err), LLM_OK);
    int32_t n = v.desc.n_vocab, total = n + n_markers;
    const char **tokens = malloc(sizeof *tokens * (size_t)total);
    int32_t *lens = malloc(sizeof *lens * (size_t)total), *types = malloc(sizeof *types * (size_t)total);
    memcpy(tokens, v.tokens, sizeof *tokens * (size_t)n);
    memcpy(lens, v.token_len, sizeof *lens * (size_t)n);
    memcpy(types, v.token_type, sizeof *types * (size_t)n);
    for (int i = 0; i < n_markers; i++)
        tokens[n + i] = markers[i], lens[n + i] = (int32_t)strlen(markers[i]), types[n + i] = LLM_TOKEN_CONTROL;
    v.desc.n_vocab = total, v.desc.tokens = tokens, v.desc.token_len = lens, v.desc.token_type = types;
    llm_tokenizer *t;
    CHECK_EQ_INT(llm_tokenizer_create(&v.desc, &t, err, sizeof err), 0);
    llm_chat_format f = llm_chat_format_of(kind);
    llm_chat_msg msgs[] = {{"system", "You are terse."},
                           {"user", "Hi!  How are you?\n\tFine?"},
                           {"assistant", "Good."},
                           {"user", "List 3 colours."}};
    char stem[64], fixture[96], model[64], file[128], text[1024];
    snprintf(stem, sizeof stem, "template_%s", name);
    snprintf(fixture, sizeof fixture, "%s.special", stem);
    snprintf(model, sizeof model, "smollm2+%s", name);
    snprintf(file, sizeof file, CORPUS "%s.txt", stem);
    size_t len;
    char *want = read_all(file, &len);
    int32_t k = llm_chat_render(&f, msgs, 4, 1, text, sizeof text);
    CHECK(want && k == (int32_t)len && memcmp(text, want, len) == 0);
    int32_t *ids = NULL, n_want = 0, *want_ids = read_ids(fixture, model, &n_want);
    k = llm_chat_tokenize(&f, t, msgs, 4, 1, 0, &ids);
    CHECK(want_ids && k == n_want && first_difference(ids, k, want_ids, n_want) < 0);
    CHECK(matches_fixture(t, model, stem, fixture, 1, 0));
    free(ids), free(want_ids), free(want);
    llm_tokenizer_free(t);
    free(tokens), free(lens), free(types);
    llm_vocab_desc_free(&v);
    llm_gguf_close(g);
}

TEST(tokenizer_llama3_template_turn_boundaries_equal_llama_cpp) {
    static const char *const markers[] = {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
    check_foreign_template(LLM_CHAT_LLAMA3, "llama3", markers, 3);
}

TEST(tokenizer_llama2_template_turn_boundaries_equal_llama_cpp) {
    static const char *const markers[] = {"<s>", "</s>"};
    check_foreign_template(LLM_CHAT_LLAMA2, "llama2", markers, 2);
}

TEST(tokenizer_zephyr_template_turn_boundaries_equal_llama_cpp) {
    static const char *const markers[] = {"<|system|>", "<|user|>", "<|assistant|>", "</s>"};
    check_foreign_template(LLM_CHAT_ZEPHYR, "zephyr", markers, 4);
}
