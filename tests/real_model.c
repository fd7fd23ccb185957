/* tests/real_model.c - helpers for the real-model tests (real_model.h). */
#include "real_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "../engine/gen/sampler.h"

llm_model *rm_load(const char *path, const char *fetch_arg) {
    if (access(path, R_OK) != 0) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "sh scripts/fetch-model.sh %s %s", fetch_arg ? fetch_arg : "", path);
        printf("     %s is missing: fetching it with %s\n", path, cmd);
        fflush(stdout);
        if (system(cmd) != 0) {
            test_fail(__FILE__, __LINE__, "no %s and `%s` failed (run `make test-models`)", path, cmd);
            return NULL;
        }
    }
    llm_model *m = NULL;
    char err[256];
    if (llm_model_load(path, &m, err, sizeof err) != LLM_OK) test_fail(__FILE__, __LINE__, "load: %s", err);
    return m;
}

llm_context *rm_context_act(const llm_model *m, int32_t threads, int32_t n_ctx, int32_t n_batch, kv_dtype kv,
                           int32_t act_bits) {
    llm_context_params p = llm_context_default_params();
    p.n_ctx = n_ctx, p.n_threads = threads, p.n_batch = n_batch, p.kv_type = kv, p.act_bits = act_bits;
    llm_context *c = NULL;
    char err[256];
    if (llm_context_create(m, &p, &c, err, sizeof err) != LLM_OK) test_fail(__FILE__, __LINE__, "context: %s", err);
    return c;
}

llm_context *rm_context(const llm_model *m, int32_t threads, int32_t n_ctx, int32_t n_batch, kv_dtype kv) {
    return rm_context_act(m, threads, n_ctx, n_batch, kv, -1);
}

int32_t rm_greedy(llm_context *c, const int32_t *prompt, int32_t n_prompt, int32_t n, int32_t *out) {
    const llm_model *m = llm_context_model(c);
    const int32_t V = llm_model_n_vocab(m);
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t seq, k = 0;
    CHECK_EQ_INT(llm_seq_new(c, &seq), LLM_OK);
    int rc = llm_eval(c, seq, prompt, n_prompt, 0, logits, NULL, NULL);
    while (rc == LLM_OK && k < n) {
        out[k] = llm_argmax(logits, V);
        if (llm_token_is_eog(llm_model_tokenizer(m), out[k])) break;
        rc = llm_eval(c, seq, &out[k++], 1, 0, logits, NULL, NULL);
    }
    CHECK_EQ_INT(rc, LLM_OK);
    llm_seq_remove(c, seq);
    free(logits);
    return k;
}

int32_t rm_text_tokens(const llm_model *m, int32_t *ids, int32_t cap) {
    FILE *f = fopen("tests/data/perplexity_en.txt", "rb");
    if (!f) {
        test_fail(__FILE__, __LINE__, "cannot read tests/data/perplexity_en.txt");
        return 0;
    }
    static char text[1 << 16];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    int32_t n = llm_tokenize(llm_model_tokenizer(m), text, len, 1, 0, ids, cap);
    CHECK(n > 0);
    return n > 0 ? n : 0;
}

double rm_worst_row_diff(const float *a, const float *b, int32_t rows, int32_t V) {
    double worst = 0;
    for (int32_t r = 0; r < rows; r++) {
        double d = 0, mx = 0;
        for (int32_t i = 0; i < V; i++) {
            size_t k = (size_t)r * (size_t)V + (size_t)i;
            d = fmax(d, fabs((double)a[k] - b[k]));
            mx = fmax(mx, fabs(b[k]));
        }
        worst = fmax(worst, d / mx);
        CHECK(mx > 1);
    }
    return worst;
}

double rm_perplexity(const llm_model *m, const int32_t *ids, int32_t n, int32_t ctx, kv_dtype kv, int64_t *scored) {
    const int32_t V = llm_model_n_vocab(m), first = ctx / 2;
    llm_context *c = rm_context(m, 2, ctx, ctx, kv);
    float *logits = malloc(sizeof(float) * (size_t)(ctx - 1 - first) * (size_t)V);
    uint8_t *want = malloc((size_t)ctx);
    for (int32_t j = 0; j < ctx; j++) want[j] = j >= first && j < ctx - 1; /* only scored rows */
    double nll = 0;
    int64_t count = 0;
    for (int32_t w = 0; c && w + ctx <= n; w += ctx) {
        int32_t seq, rows[2] = {0, ctx};
        CHECK_EQ_INT(llm_seq_new(c, &seq), LLM_OK);
        llm_batch b = {.n_seqs = 1, .seqs = &seq, .row_start = rows, .tokens = ids + w, .want = want};
        CHECK_EQ_INT(llm_forward(c, &b, logits), LLM_OK);
        for (int32_t j = first; j < ctx - 1; j++) {
            const float *l = logits + (size_t)(j - first) * (size_t)V;
            double mx = -INFINITY, z = 0;
            for (int32_t i = 0; i < V; i++) mx = fmax(mx, l[i]);
            for (int32_t i = 0; i < V; i++) z += exp((double)l[i] - mx);
            nll += mx + log(z) - l[ids[w + j + 1]];
            count++;
        }
        llm_seq_remove(c, seq);
    }
    free(logits), free(want);
    llm_context_free(c);
    if (scored) *scored = count;
    return exp(nll / (double)count);
}
