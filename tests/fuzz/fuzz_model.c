/* tests/fuzz/fuzz_model.c - libFuzzer target for model loading and the
 * forward pass.
 *
 * Parses the input as GGUF (llm_gguf_open_memory) and builds a model from it
 * (llm_model_from_gguf: hyperparameters, every tensor's shape and type, the
 * tokenizer). A refusal must come with a message. When a small model loads,
 * runs a forward pass over a few tokens on a paged cache and a dense
 * recomputation, and samples from the logits. Any crash, sanitizer report or
 * trap is a bug. Seeds: tests/fuzz/corpus_model (tiny valid models).
 *
 *   make fuzz   (builds every tests/fuzz target with clang's libFuzzer) */
#include "../../engine/model/model.h"
#include "../../engine/gen/sampler.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(c) do { if (!(c)) __builtin_trap(); } while (0)

static volatile float sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    llm_gguf *g;
    char err[512] = "";
    if (llm_gguf_open_memory(data, size, &g, err, sizeof err) != 0) {
        REQUIRE(err[0]);
        return 0;
    }
    llm_model *m;
    err[0] = 0;
    if (llm_model_from_gguf(g, "fuzz", &m, err, sizeof err) != 0) {
        REQUIRE(err[0] && m == NULL);
        return 0;
    }
    const llm_hparams *hp = llm_model_hparams(m);
    /* run only what stays fast: a few layers of a narrow model */
    if (hp->n_layers <= 4 && hp->dim <= 512 && hp->ffn_dim <= 2048 && hp->n_vocab <= 4096 && hp->n_heads <= 16) {
        llm_context_params p = llm_context_default_params();
        p.n_ctx = 16, p.n_batch = 4, p.page_size = 4;
        llm_context *c;
        if (llm_context_create(m, &p, &c, err, sizeof err) == 0) {
            int32_t toks[6], seq, n = 0;
            const char *text = "hi \xc3\xa9";
            n = llm_tokenize(llm_model_tokenizer(m), text, strlen(text), 1, 1, toks, 6);
            if (n <= 0) toks[0] = 0, n = 1;
            for (int i = 0; i < n; i++) REQUIRE(toks[i] >= 0 && toks[i] < hp->n_vocab);
            float *lg = malloc(sizeof(float) * (size_t)hp->n_vocab * 2);
            REQUIRE(kv_seq_new(llm_context_cache(c), &seq) == KV_OK);
            if (llm_eval(c, seq, toks, n, 0, lg, NULL, NULL) == KV_OK) {
                REQUIRE(llm_forward_dense(c, toks, n, n - 1, lg + hp->n_vocab) == KV_OK);
                llm_sampler s;
                llm_sampler_params sp = llm_sampler_default_params();
                if (llm_sampler_init(&s, &sp, hp->n_vocab) == 0) {
                    int32_t t = llm_sample(&s, lg);
                    REQUIRE(t >= 0 && t < hp->n_vocab);
                    llm_sampler_free(&s);
                }
                sink = lg[0];
            }
            free(lg);
            llm_context_free(c);
        }
    }
    llm_model_free(m);
    return 0;
}
