/* tests/real_model.h - what the tests on real GGUF models share: the model,
 * fetched by scripts/fetch-model.sh when absent (a real-model test fails
 * rather than skips when it cannot be had), a context, greedy decoding,
 * tests/data/perplexity_en.txt tokenized, and llama.cpp's perplexity written
 * out apart from `kvcache perplexity`. */
#ifndef TEST_REAL_MODEL_H
#define TEST_REAL_MODEL_H

#include <stdint.h>

#include "../engine/model/model.h"

/* The model at path; when the file is missing, first runs
 * `sh scripts/fetch-model.sh [fetch_arg] path` (fetch_arg: NULL for the
 * default model, e.g. "gemma3-270m"). NULL, with the test failed, when it
 * cannot be fetched or loaded. */
llm_model *rm_load(const char *path, const char *fetch_arg);

/* A context of one sequence; the test fails when it cannot be made. */
llm_context *rm_context(const llm_model *m, int32_t threads, int32_t n_ctx, int32_t n_batch, kv_dtype kv);
/* The same with the weight products' activations chosen (engine/weights/quant.h: 0 is
 * the f32 reference path, -1 the engine's default). A cache check compares two
 * ways of computing attention; on integer activations a last-bit difference in
 * attention can move a product input across a rounding boundary, so such
 * checks run the f32 products and test the cache alone. */
llm_context *rm_context_act(const llm_model *m, int32_t threads, int32_t n_ctx, int32_t n_batch, kv_dtype kv,
                           int32_t act_bits);

/* Greedy decoding of up to n tokens after prompt [n_prompt] in a new sequence
 * (removed after); stops at an end-of-generation token. out [n]; returns the
 * count. */
int32_t rm_greedy(llm_context *c, const int32_t *prompt, int32_t n_prompt, int32_t n, int32_t *out);

/* tests/data/perplexity_en.txt as ids [cap] with BOS; the count (0 when the
 * file cannot be read, with the test failed). */
int32_t rm_text_tokens(const llm_model *m, int32_t *ids, int32_t cap);

/* The largest relative difference between cached and recomputed logits over
 * rows [rows][V]: max over rows of max |a - b| / max |b|; the test fails when
 * a row of b is flat (max |b| <= 1: not a real model's logits). */
double rm_worst_row_diff(const float *a, const float *b, int32_t rows, int32_t V);

/* Windows of ctx tokens of ids [n], each from an empty cache and scored on
 * its second half: exp(mean negative log-likelihood of the scored tokens).
 * *scored (may be NULL) receives how many tokens were scored. */
double rm_perplexity(const llm_model *m, const int32_t *ids, int32_t n, int32_t ctx, kv_dtype kv, int64_t *scored);

#endif
