/* tests/fuzz/fuzz_session.c - libFuzzer target for saved sequences: the
 * library's files (kv_seq_restore_file) and the engine's session files
 * (llm_session_file_load), both untrusted input.
 *
 * The first byte picks what the rest is read as: bits 0-2 one of the cache
 * configurations below, or (7) a session file for the tiny model
 * tests/fuzz/corpus_model/tiny_q8_0.gguf (the fuzzer runs from the source
 * tree); bit 3 asks for the checksums to be recomputed first, so that the
 * mutations reach what lies behind them (sizes, counts, positions, token
 * ids) rather than stopping at the checksum. Then:
 *   - a refusal must leave the cache exactly as it was (the same pages used,
 *     free and cached, the same sequences);
 *   - a restored sequence must be usable: one more token appended and
 *     attended (a decode step, the forward pass for a session) succeeds, and
 *     removing it gives every page back.
 * Any crash, sanitizer report or trap is a bug. Seeds: tests/fuzz/corpus_session
 * (valid files of every mode, made by kv_seq_save_file / llm_session_file_save).
 *
 *   make fuzz   (builds every tests/fuzz target with clang's libFuzzer) */
#define _GNU_SOURCE
#include "../../engine/model/model.h"
#include "../../engine/gen/policy.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(c) do { if (!(c)) __builtin_trap(); } while (0)

/* The library configurations: layers, KV heads, head dim, type, window, page size. */
typedef struct {
    int32_t layers, heads, d;
    kv_dtype dtype;
    int32_t window, page;
} config;
static const config CONFIGS[] = {
    {2, 2, 16, KV_F16, 0, 4},  {2, 2, 16, KV_F16, 0, 16}, {1, 3, 8, KV_Q8, 0, 4},  {2, 1, 16, KV_F32, 12, 4},
    {2, 2, 16, KV_F16, 12, 8}, {1, 2, 8, KV_Q8, 10, 4},   {1, 1, 8, KV_BF16, 0, 5},
};
enum { N_CONFIGS = sizeof CONFIGS / sizeof CONFIGS[0], ENGINE = 7, FIX = 8, MAX_LEN = 64, PAGES = 24 };

static uint64_t fnv(uint64_t h, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}
static const uint64_t FNV0 = 0xCBF29CE484222325ull;

static int32_t word(const uint8_t *p) {
    int32_t w;
    memcpy(&w, p, 4);
    return w;
}

/* Recomputes the checksum of the library's sequence at p[0..n) as its own
 * header describes it (src/persist.c's layout); the bytes after it. */
static size_t fix_sequence(uint8_t *p, size_t n) {
    enum { HEAD = 8 + 10 * 4 };
    if (n < HEAD) return n;
    const int64_t layers = word(p + 12), heads = word(p + 16), d = word(p + 20), dtype = word(p + 24);
    const int64_t len = word(p + 36), first = word(p + 40);
    const int64_t elem = dtype == KV_F32 ? 4 : dtype == KV_Q8 ? 1 : 2;
    if (layers < 1 || layers > 8 || heads < 1 || heads > 8 || d < 1 || d > 64 || len < first || first < 0 ||
        len > MAX_LEN * 4)
        return n;
    const int64_t pos_bytes = 2 * heads * d * elem + (dtype == KV_Q8 ? 2 * heads * 4 : 0);
    const uint64_t end = HEAD + (uint64_t)(len - first) * (uint64_t)(4 + pos_bytes * layers);
    if (end + 8 > n) return n;
    const uint64_t sum = fnv(FNV0, p, end);
    memcpy(p + end, &sum, 8);
    return end + 8;
}

/* The engine's header (engine/gen/session_file.c), then its sequences. */
static void fix_session(uint8_t *p, size_t n) {
    enum { HEAD = 8 + 4 + 4 + 8 + 128 + 4 * 4 };
    if (n < HEAD) return;
    const int64_t tokens = word(p + HEAD - 12), caches = word(p + HEAD - 8);
    if (tokens < 0 || tokens > MAX_LEN * 4 || HEAD + 4 * (uint64_t)tokens + 8 > n) return;
    const size_t at = HEAD + 4 * (size_t)tokens;
    const uint64_t sum = fnv(FNV0, p, at);
    memcpy(p + at, &sum, 8);
    size_t off = at + 8;
    for (int64_t i = 0; i < caches && i < 8 && off < n; i++) off += fix_sequence(p + off, n - off);
}

static int same_stats(kv_cache_stats a, kv_cache_stats b) {
    return a.pages_used == b.pages_used && a.pages_free == b.pages_free && a.pages_cached == b.pages_cached &&
           a.pages_shared == b.pages_shared && a.seqs == b.seqs;
}

/* One decode step on a restored sequence: a random K/V row appended to every
 * layer and attended. */
static void decode_step(kv_cache *c, const config *k, int32_t seq) {
    float kv[3 * 16], q[2 * 3 * 16], out[2 * 3 * 16];
    for (int i = 0; i < 2 * 3 * 16; i++) q[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
    for (int i = 0; i < 3 * 16; i++) kv[i] = (float)((i * 53) % 13) / 13.0f - 0.5f;
    int32_t rows[2] = {0, 1};
    kv_batch b = {.n_seqs = 1, .seqs = &seq, .row_start = rows};
    int rc = kv_seq_reserve(c, seq, 1, NULL);
    REQUIRE(rc == KV_OK || rc == KV_ERR_OUT_OF_PAGES || rc == KV_ERR_CAPACITY);
    if (rc != KV_OK) return;
    for (int32_t l = 0; l < k->layers; l++) {
        REQUIRE(kv_append_f32(c, l, &b, kv, kv) == KV_OK);
        REQUIRE(kv_attend_f32(c, l, &b, 2 * k->heads, q, out, 0) == KV_OK);
    }
}

static void library_file(const config *k, uint8_t *p, size_t n, int fix) {
    kv_cache_params cp = kv_cache_default_params();
    cp.n_layers = k->layers, cp.n_kv_heads = k->heads, cp.head_dim = k->d, cp.dtype = k->dtype;
    cp.window = k->window, cp.page_size = k->page, cp.n_pages = PAGES, cp.max_seq_len = MAX_LEN, cp.max_seqs = 4;
    kv_cache *c;
    REQUIRE(kv_cache_create(&cp, &c) == KV_OK);
    /* another sequence is there already, and must not be disturbed */
    int32_t other;
    REQUIRE(kv_seq_new(c, &other) == KV_OK);
    decode_step(c, k, other);
    if (fix) fix_sequence(p, n);
    const kv_cache_stats before = kv_cache_get_stats(c);
    FILE *f = fmemopen(p, n ? n : 1, "rb");
    REQUIRE(f);
    int32_t seq = -1;
    const int rc = kv_seq_restore_file(c, f, &seq);
    fclose(f);
    if (rc != KV_OK) {
        REQUIRE(kv_status_str(rc)[0] && same_stats(before, kv_cache_get_stats(c)));
    } else {
        REQUIRE(seq >= 0 && seq != other && kv_seq_length(c, seq) <= MAX_LEN);
        decode_step(c, k, seq);
        REQUIRE(kv_seq_remove(c, seq) == KV_OK);
        const kv_cache_stats after = kv_cache_get_stats(c); /* every page back, free or kept for the prefix cache */
        REQUIRE(after.pages_used == before.pages_used && after.seqs == before.seqs &&
                after.pages_free + after.pages_cached == before.pages_free + before.pages_cached);
    }
    REQUIRE(kv_seq_length(c, other) == 1);
    kv_cache_free(c);
}

static llm_model *tiny;

static void session_file(uint8_t *p, size_t n, int fix) {
    if (!tiny) {
        char err[256] = "";
        llm_gguf *g;
        if (llm_gguf_open("tests/fuzz/corpus_model/tiny_q8_0.gguf", &g, err, sizeof err) != 0 ||
            llm_model_from_gguf(g, "tiny", &tiny, err, sizeof err) != 0) {
            fprintf(stderr, "fuzz_session: cannot load the tiny model (run from the source tree): %s\n", err);
            __builtin_trap();
        }
    }
    llm_context_params cp = llm_context_default_params();
    cp.n_ctx = MAX_LEN, cp.n_batch = 8, cp.page_size = 4;
    llm_context *c;
    char err[512] = "";
    REQUIRE(llm_context_create(tiny, &cp, &c, err, sizeof err) == 0);
    if (fix) fix_session(p, n);
    const int fd = memfd_create("session", 0);
    REQUIRE(fd >= 0 && write(fd, p, n) == (ssize_t)n);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    /* the prompt: what the seeds were saved from, then more */
    int32_t prompt[MAX_LEN / 2];
    for (int32_t i = 0; i < MAX_LEN / 2; i++) prompt[i] = (i * 7 + 3) % llm_model_n_vocab(tiny);
    const kv_cache_stats before = kv_cache_get_stats(llm_context_cache_at(c, 0));
    int32_t seq = -1, got = 0;
    err[0] = 0;
    const int rc = llm_session_file_load(c, path, prompt, MAX_LEN / 2, &seq, &got, err, sizeof err);
    if (rc != 0) {
        REQUIRE(err[0] && seq == -1 && same_stats(before, kv_cache_get_stats(llm_context_cache_at(c, 0))));
    } else {
        REQUIRE(got > 0 && got < MAX_LEN / 2);
        float *logits = malloc(sizeof(float) * (size_t)llm_model_n_vocab(tiny));
        REQUIRE(logits && llm_eval(c, seq, prompt + got, MAX_LEN / 2 - got, 0, logits, NULL, NULL) == KV_OK);
        free(logits);
        REQUIRE(llm_seq_remove(c, seq) == LLM_OK);
    }
    close(fd);
    llm_context_free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t *p = calloc(size > 1 ? size - 1 : 1, 1); /* fmemopen wants at least a byte */
    REQUIRE(p);
    memcpy(p, data + 1, size - 1);
    const int which = data[0] & 7, fix = (data[0] & FIX) != 0;
    if (which == ENGINE) session_file(p, size - 1, fix);
    else if (which < N_CONFIGS) library_file(&CONFIGS[which], p, size - 1, fix);
    free(p);
    return 0;
}
