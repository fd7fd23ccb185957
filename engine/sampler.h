/* engine/sampler.h - choosing the next token from logits.
 *
 *   temp <= 0          greedy: the largest logit (the lowest id on a tie);
 *                      deterministic, the seed is unused
 *   otherwise          softmax(logits / temp) restricted to the top_k largest
 *                      logits (0: all), then to the smallest prefix of those,
 *                      by descending probability, whose mass reaches top_p
 *                      (1: all), renormalized and sampled with a seeded
 *                      generator: the same seed and logits give the same token.
 *
 * A sampler owns scratch for one vocabulary, allocated once at init. */
#ifndef LLM_SAMPLER_H
#define LLM_SAMPLER_H

#include <stdint.h>

typedef struct {
    float temp;        /* temperature; <= 0 is greedy */
    int32_t top_k;     /* keep the k most likely tokens; 0 keeps all */
    float top_p;       /* nucleus mass in (0, 1]; 1 keeps all */
    uint64_t seed;     /* generator seed */
} llm_sampler_params;

/* temp 0.8, top_k 40, top_p 0.95, seed 1. */
llm_sampler_params llm_sampler_default_params(void);

typedef struct {
    float logit;       /* the token's logit */
    int32_t id;        /* token id */
} llm_candidate;

typedef struct {
    llm_sampler_params p;
    int32_t n_vocab;       /* V */
    uint64_t rng;          /* splitmix64 state */
    llm_candidate *cand;   /* [V] candidates, best first once sorted */
    double *prob;          /* [V] their probabilities (top_k < V) */
    float *weight;         /* [V] e^((logit - max) / temp) of every token (top_k = 0) */
    double *block_mass;    /* [V / LLM_SAMPLER_BLOCK + 1] sums of weight */
} llm_sampler;

enum { LLM_SAMPLER_BLOCK = 256 };

/* 0, or -1 for bad parameters (top_k < 0, top_p outside (0, 1], NaN temp,
 * n_vocab < 1) or out of memory. */
int llm_sampler_init(llm_sampler *s, const llm_sampler_params *p, int32_t n_vocab);
void llm_sampler_free(llm_sampler *s);
/* The next token for logits [V]. */
int32_t llm_sample(llm_sampler *s, const float *logits);
/* The token that the uniform draw u in [0, 1) picks: each token owns a
 * share of [0, 1) equal to its probability (llm_sample draws u from the
 * seeded generator; the tests walk u over a grid). */
int32_t llm_sample_at(llm_sampler *s, const float *logits, double u);
/* log sum_i e^logits[i] over n logits (NaN ones left out), within about
 * 1e-6: the log of the softmax's denominator, for log-probabilities. -inf
 * when none is above -inf, +inf when one is +inf, NaN when all are NaN. */
double llm_log_sum_exp(const float *logits, int32_t n);
/* The largest logit's id (the lowest on a tie); NaN logits are never chosen
 * unless all are NaN, then 0. */
int32_t llm_argmax(const float *logits, int32_t n);

#endif
