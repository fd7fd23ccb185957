/* engine/gen/sampler.h - choosing the next token from logits.
 *
 *   temp <= 0          greedy: the largest logit (the lowest id on a tie);
 *                      deterministic, the seed is unused
 *   otherwise          softmax(logits / temp) restricted to the top_k largest
 *                      logits (0: all), then to the smallest prefix of those,
 *                      by descending probability, whose mass reaches top_p
 *                      (1: all), renormalized and sampled with a seeded
 *                      generator: the same seed and logits give the same token.
 *
 * Before that choice, one logits-processing step (llm_sampler_process), the
 * only one: the server's scheduler and the session loop both sample through
 * llm_sample, so both apply it the same way. In this order, on a copy of the
 * logits (the caller's stay the model's):
 *
 *   logit_bias         bias[id] is added; -100 bans the token (-inf), as the
 *                      OpenAI API promises "a ban"
 *   repeat_penalty     llama.cpp's: each distinct token among the last
 *                      repeat_last_n tokens of the sequence, the prompt
 *                      included (llm_sampler_accept_prompt), has a positive
 *                      logit divided by it, a negative one multiplied
 *   frequency_penalty  OpenAI's, over the generated tokens only (the prompt
 *   presence_penalty   is not counted): logit -= frequency * count + presence
 *                      * (count > 0), count = times the token was generated
 *   grammar            only tokens that continue a valid JSON document
 *                      (engine/text/grammar.h), or a document of the rules
 *                      (engine/text/gbnf.h: a GBNF grammar or a JSON schema),
 *                      keep their logits; each sampler (each choice of a
 *                      request) has its own state of the document
 *   min_p              (temp > 0) tokens whose probability at temperature 1
 *                      is below min_p times the best one's are dropped
 *
 * With every one off (bias none, repeat_penalty 0 or 1, penalties 0, min_p 0)
 * there is no copy and the draw is exactly the plain one. llm_sample records
 * each token it returns as generated (each choice of a request has its own
 * sampler, so its own history).
 *
 * A sampler owns scratch for one vocabulary, allocated once at init. */
#ifndef LLM_SAMPLER_H
#define LLM_SAMPLER_H

#include <stdint.h>

#include "../text/gbnf.h"

typedef struct {
    float temp;        /* temperature; <= 0 is greedy */
    int32_t top_k;     /* keep the k most likely tokens; 0 keeps all */
    float top_p;       /* nucleus mass in (0, 1]; 1 keeps all */
    uint64_t seed;     /* generator seed */
    float min_p;       /* in [0, 1]; 0: off */
    float repeat_penalty;       /* > 0; 0 and 1: off */
    int32_t repeat_last_n;      /* its window in tokens; 0: off, -1: every token seen */
    float presence_penalty;     /* OpenAI's, in [-2, 2]; 0: off */
    float frequency_penalty;    /* OpenAI's, in [-2, 2]; 0: off */
    const struct llm_logit_bias *bias; /* [n_bias], copied at init; ids in the vocabulary, */
    int32_t n_bias;                    /* values in [-100, 100] */
    const llm_grammar_vocab *grammar;  /* non-NULL: constrained to JSON (its root: json_root); */
    int32_t json_root;                 /* the caller keeps it alive while the sampler lives */
    const llm_gbnf *rules;             /* non-NULL (bound to the vocabulary, llm_gbnf_bind): constrained
                                        * to its documents; the caller keeps it alive too */
} llm_sampler_params;

typedef struct llm_logit_bias {
    int32_t id;
    float bias;
} llm_logit_bias;

/* temp 0.8, top_k 40, top_p 0.95, seed 1, repeat_last_n 64, the rest off. */
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
    /* the processing step's state, allocated only when a processor is on */
    int processing;        /* any processor on */
    float *work;           /* [V] the processed copy of the logits */
    llm_logit_bias *bias;  /* [p.n_bias] */
    int32_t *count;        /* [V] times each token was generated */
    int32_t *seen;         /* [n_seen] the distinct tokens generated, in order */
    int32_t n_seen, cap_seen;
    int32_t *ring;         /* [cap_ring] the last tokens of the sequence (repeat window) */
    int32_t cap_ring, n_ring, at_ring;
    uint32_t *mark, stamp; /* [V] deduplication of the window within one step */
    llm_json_state json;   /* with p.grammar: the document so far */
    float *masked;         /* [V] with p.grammar or p.rules: the logits it allows */
    llm_gbnf_state *rules; /* with p.rules: the document so far */
} llm_sampler;

enum { LLM_SAMPLER_BLOCK = 256 };

/* 0, or -1 for bad parameters (top_k < 0, top_p outside (0, 1], NaN temp,
 * n_vocab < 1, min_p outside [0, 1], repeat_penalty < 0, repeat_last_n < -1,
 * a penalty outside [-2, 2], a bias id outside the vocabulary or value
 * outside [-100, 100], rules not bound to a vocabulary of n_vocab) or out
 * of memory. */
int llm_sampler_init(llm_sampler *s, const llm_sampler_params *p, int32_t n_vocab);
void llm_sampler_free(llm_sampler *s);
/* The next token for logits [V] (processed, then drawn), recorded as generated. */
int32_t llm_sample(llm_sampler *s, const float *logits);
/* Prompt tokens [n] into the repeat window (they never count as generated). */
void llm_sampler_accept_prompt(llm_sampler *s, const int32_t *tokens, int32_t n);
/* Records token as generated (llm_sample does so itself). */
void llm_sampler_accept(llm_sampler *s, int32_t token);
/* The processed logits for logits [V]: logits itself when no processor is
 * on, else the sampler's copy (valid until the next call). */
const float *llm_sampler_process(llm_sampler *s, const float *logits);
/* The token that the uniform draw u in [0, 1) picks from the processed
 * logits (nothing recorded): each token owns a
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
