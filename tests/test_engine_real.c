/* tests/test_engine_real.c - the engine on the real default model,
 * SmolLM2-135M-Instruct (Q4_1), fetched by scripts/fetch-model.sh when
 * absent: greedy output identical for 1, 2 and 3 threads and coherent,
 * cached decoding equal to full recomputation, the tokenizer round-tripping
 * UTF-8, and the perplexity of tests/data/perplexity_en.txt in its recorded
 * range. About 20 s on 2 cores. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "../engine/model.h"
#include "../engine/sampler.h"

#define REAL_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

/* The model, fetched first if needed; NULL (and the test failed) when it
 * cannot be had: these tests must not pass by skipping. */
static llm_model *real_model(void) {
    if (access(REAL_MODEL, R_OK) != 0) {
        printf("     %s is missing: fetching it with scripts/fetch-model.sh\n", REAL_MODEL);
        fflush(stdout);
        if (system("sh scripts/fetch-model.sh " REAL_MODEL) != 0) {
            test_fail(__FILE__, __LINE__, "no %s and scripts/fetch-model.sh failed (run `make model`)", REAL_MODEL);
            return NULL;
        }
    }
    llm_model *m = NULL;
    char err[256];
    if (llm_model_load(REAL_MODEL, &m, err, sizeof err) != 0) test_fail(__FILE__, __LINE__, "load: %s", err);
    return m;
}

static llm_context *context(const llm_model *m, int32_t threads, kv_dtype kv, int32_t n_ctx) {
    llm_context_params p = llm_context_default_params();
    p.n_ctx = n_ctx, p.n_threads = threads, p.kv_type = kv;
    llm_context *c = NULL;
    char err[256];
    if (llm_context_create(m, &p, &c, err, sizeof err) != 0) test_fail(__FILE__, __LINE__, "context: %s", err);
    return c;
}

static int32_t tokenize(const llm_model *m, const char *text, int32_t *ids, int32_t cap) {
    int32_t n = llm_tokenize(llm_model_tokenizer(m), text, strlen(text), 1, 1, ids, cap);
    CHECK(n > 0);
    return n;
}

/* Greedy decoding of n tokens after a prompt; stops at end of turn. */
static int32_t greedy(llm_context *c, const int32_t *prompt, int32_t n_prompt, int32_t n, int32_t *out) {
    const llm_model *m = llm_context_model(c);
    float *logits = malloc(sizeof(float) * (size_t)llm_model_n_vocab(m));
    int32_t seq, k = 0;
    CHECK_EQ_INT(kv_seq_new(llm_context_cache(c), &seq), KV_OK);
    int rc = llm_eval(c, seq, prompt, n_prompt, 0, logits, NULL, NULL);
    while (rc == KV_OK && k < n) {
        out[k] = llm_argmax(logits, llm_model_n_vocab(m));
        if (llm_token_is_eog(llm_model_tokenizer(m), out[k])) break;
        rc = llm_eval(c, seq, &out[k++], 1, 0, logits, NULL, NULL);
    }
    CHECK_EQ_INT(rc, KV_OK);
    kv_seq_remove(llm_context_cache(c), seq);
    free(logits);
    return k;
}

TEST(engine_real_greedy_output_is_identical_for_1_2_3_threads_and_coherent) {
    llm_model *m = real_model();
    if (!m) return;
    CHECK_EQ_INT(llm_model_chat(m)->kind, LLM_CHAT_CHATML);
    llm_chat_msg msg = {"user", "What is the capital of France?"};
    char text[1024];
    CHECK(llm_chat_render(llm_model_chat(m), &msg, 1, 1, text, sizeof text) > 0);
    int32_t prompt[256], n_prompt = tokenize(m, text, prompt, 256);
    int32_t out[3][24], n[3];
    for (int t = 1; t <= 3; t++) {
        llm_context *c = context(m, t, KV_F16, 512);
        n[t - 1] = greedy(c, prompt, n_prompt, 24, out[t - 1]);
        llm_context_free(c);
    }
    CHECK(n[0] > 3);
    CHECK(n[0] == n[1] && n[1] == n[2]);
    CHECK(memcmp(out[0], out[1], sizeof(int32_t) * (size_t)n[0]) == 0);
    CHECK(memcmp(out[0], out[2], sizeof(int32_t) * (size_t)n[0]) == 0);
    char reply[512];
    CHECK(llm_detokenize(llm_model_tokenizer(m), out[0], n[0], 0, reply, sizeof reply) > 0);
    printf("     reply: %s\n", reply);
    CHECK(strstr(reply, "Paris") != NULL);
    CHECK(strstr(reply, "capital") != NULL);
    /* a plain continuation as well */
    int32_t p2[64], n2 = tokenize(m, "One, two, three, four,", p2, 64), o2[12];
    llm_context *c = context(m, 2, KV_F16, 128);
    int32_t k = greedy(c, p2, n2, 12, o2);
    CHECK(llm_detokenize(llm_model_tokenizer(m), o2, k, 0, reply, sizeof reply) > 0);
    printf("     continuation: %s\n", reply);
    CHECK(strstr(reply, "five, six, seven") != NULL);
    llm_context_free(c);
    llm_model_free(m);
}

/* 32 greedy steps decoded on the cache, each step's logits against a full
 * recomputation without a cache. By causality one dense pass over the whole
 * run holds every step's recomputation (row t sees tokens 0..t), which keeps
 * this at one prefill's cost instead of 33. */
TEST(engine_real_cached_decode_equals_full_recompute_32_steps) {
    llm_model *m = real_model();
    if (!m) return;
    enum { STEPS = 32 };
    const int32_t V = llm_model_n_vocab(m);
    llm_context *c = context(m, 2, KV_F32, 128);
    int32_t ids[128], n = tokenize(m, "Lighthouses were built on rocky coasts because", ids, 64), seq;
    const int32_t n_prompt = n;
    float *lc = malloc(sizeof(float) * (size_t)V * (STEPS + 1)), *lf = malloc(sizeof(float) * (size_t)V * (STEPS + 1));
    CHECK_EQ_INT(kv_seq_new(llm_context_cache(c), &seq), KV_OK);
    CHECK_EQ_INT(llm_eval(c, seq, ids, n, 0, lc, NULL, NULL), KV_OK);
    for (int s = 0; s <= STEPS; s++) {
        float *l = lc + (size_t)s * V;
        if (s > 0) CHECK_EQ_INT(llm_eval(c, seq, &ids[n - 1], 1, 0, l, NULL, NULL), KV_OK);
        ids[n++] = llm_argmax(l, V);
    }
    CHECK_EQ_INT(llm_forward_dense(c, ids, n - 1, n_prompt - 1, lf), KV_OK);
    double worst = 0;
    for (int s = 0; s <= STEPS; s++) {
        double d = 0, mx = 0;
        for (int32_t i = 0; i < V; i++) {
            size_t k = (size_t)s * V + (size_t)i;
            d = fmax(d, fabs((double)lc[k] - lf[k]));
            mx = fmax(mx, fabs(lf[k]));
        }
        worst = fmax(worst, d / mx);
        CHECK(mx > 1);
    }
    printf("     largest relative logit difference over 33 steps: %.3g\n", worst);
    if (!(worst <= 1e-4)) test_fail(__FILE__, __LINE__, "cached vs recomputed: %g", worst);
    free(lc), free(lf);
    llm_context_free(c);
    llm_model_free(m);
}

TEST(engine_real_tokenizer_round_trips_utf8_with_accents_emoji_and_cjk) {
    llm_model *m = real_model();
    if (!m) return;
    const char *texts[] = {
        "Caf\xc3\xa9 cr\xc3\xa8me br\xc3\xbbl\xc3\xa9" "e, na\xc3\xafve fa\xc3\xa7" "ade, \xc3\x85ngstr\xc3\xb6m, Stra\xc3\x9f" "e.",
        "Emoji: \xf0\x9f\x98\x80 \xf0\x9f\x9a\x80\xf0\x9f\x8c\x8d and a family \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7!",
        "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88 \xe4\xb8\xad\xe6\x96\x87 \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 mixed with ASCII 123.",
        "  leading spaces,\ttabs\nand newlines\n\n",
    };
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
        int32_t ids[256], n = llm_tokenize(llm_model_tokenizer(m), texts[k], strlen(texts[k]), 1, 0, ids, 256);
        CHECK(n > 0);
        char back[512];
        int32_t len = llm_detokenize(llm_model_tokenizer(m), ids, n, 0, back, sizeof back);
        if (len != (int32_t)strlen(texts[k]) || strcmp(back, texts[k]))
            test_fail(__FILE__, __LINE__, "round trip of text %d gave '%s'", (int)k, back);
    }
    /* the emoji and CJK need byte-level pieces: more tokens than characters would be a
     * sign of nothing, but every id must be a real vocabulary entry */
    int32_t ids[64], n = llm_tokenize(llm_model_tokenizer(m), "\xf0\x9f\x98\x80", 4, 0, 0, ids, 64);
    CHECK(n >= 1 && n <= 4);
    for (int32_t i = 0; i < n; i++) CHECK(ids[i] >= 0 && ids[i] < llm_model_n_vocab(m));
    llm_model_free(m);
}

/* llama.cpp's method, written out here apart from `kvcache perplexity`:
 * windows of ctx tokens from an empty cache, each scored on its second half. */
static double perplexity(const llm_model *m, const int32_t *ids, int32_t n, int32_t ctx, kv_dtype kv) {
    const int32_t V = llm_model_n_vocab(m), first = ctx / 2;
    llm_context *c = context(m, 2, kv, ctx);
    float *logits = malloc(sizeof(float) * (size_t)(ctx - 1 - first) * (size_t)V);
    uint8_t *want = malloc((size_t)ctx);
    for (int32_t j = 0; j < ctx; j++) want[j] = j >= first && j < ctx - 1; /* only scored rows */
    double nll = 0;
    int64_t count = 0;
    for (int32_t w = 0; w + ctx <= n; w += ctx) {
        int32_t seq, rows[2] = {0, ctx};
        CHECK_EQ_INT(kv_seq_new(llm_context_cache(c), &seq), KV_OK);
        llm_batch b = {.n_seqs = 1, .seqs = &seq, .row_start = rows, .tokens = ids + w, .want = want};
        CHECK_EQ_INT(llm_forward(c, &b, logits), KV_OK);
        for (int32_t j = first; j < ctx - 1; j++) {
            const float *l = logits + (size_t)(j - first) * (size_t)V;
            double mx = -INFINITY, z = 0;
            for (int32_t i = 0; i < V; i++) mx = fmax(mx, l[i]);
            for (int32_t i = 0; i < V; i++) z += exp((double)l[i] - mx);
            nll += mx + log(z) - l[ids[w + j + 1]];
            count++;
        }
        kv_seq_remove(llm_context_cache(c), seq);
    }
    free(logits), free(want);
    llm_context_free(c);
    return exp(nll / (double)count);
}

/* Recorded on this text at ctx 128 (4 windows, 252 scored tokens): f16 K/V
 * 27.98, q8 28.11 (+0.5%). The range allows other kernels' rounding and
 * fails for a broken model (a wrong RoPE layout gives ~180, random ~49,000). */
TEST(engine_real_perplexity_of_english_text_is_in_its_recorded_range) {
    llm_model *m = real_model();
    if (!m) return;
    FILE *f = fopen("tests/data/perplexity_en.txt", "rb");
    CHECK(f != NULL);
    if (!f) return llm_model_free(m);
    static char text[16384];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = 0;
    static int32_t ids[4096];
    int32_t n = llm_tokenize(llm_model_tokenizer(m), text, len, 1, 0, ids, 4096);
    CHECK(n >= 512);
    double p16 = perplexity(m, ids, n, 128, KV_F16), p8 = perplexity(m, ids, n, 128, KV_Q8);
    printf("     %d tokens; ppl f16 K/V %.4f, q8 K/V %.4f\n", (int)n, p16, p8);
    CHECK(isfinite(p16) && p16 > 22 && p16 < 34);
    CHECK(fabs(p8 - p16) / p16 < 0.03);
    llm_model_free(m);
}
