/* engine/gen/choice.h - one generated sequence's rules, token by token: the
 * state machine that the single-sequence loop (engine/gen/session.c: generate,
 * chat, bench model) and the batching scheduler (engine/gen/scheduler.c: the
 * server, kvengine.h) both drive, so that a rule is written once.
 *
 * The caller runs the model and owns the sequence's cache; a choice decides
 * everything between two forward passes:
 *
 *   sample     llm_choice_next: the logits are checked (a NaN or infinity
 *              ends the choice with LLM_STOP_ERROR and LLM_ERR_NONFINITE,
 *              nothing sampled), an optional hook may bias them, the sampler
 *              (engine/gen/sampler.h: penalties, grammar, temperature) draws, and
 *              the text stream (engine/gen/session.h) turns the token into text
 *              and says whether a stop condition is met.
 *   drafts     llm_choice_propose: prompt-lookup drafts (engine/gen/policy.h) to
 *              verify after the sampled token, as many as pay by the passes'
 *              measured costs (llm_lookup_ctl) and the room allows;
 *              llm_choice_verified feeds the outcome of a verify pass back.
 *   shift      llm_choice_shift_plan: whether a full context is shifted
 *              (and by how much) or ends the choice.
 *
 * Where the two callers differ, they say so where they call: the session
 * never samples a token it has no position for; the scheduler shows one
 * past a full context (it cannot be fed) and ends with LLM_STOP_CONTEXT. */
#ifndef LLM_CHOICE_H
#define LLM_CHOICE_H

#include <stddef.h>
#include <stdint.h>

#include "../model/model.h"
#include "policy.h"
#include "sampler.h"
#include "session.h"

typedef struct {
    llm_sampler sampler;
    llm_textstream *ts;
    int32_t n_vocab;
    int32_t max_tokens;     /* the text stream's limit; < 0: none */
    int32_t n_generated;    /* tokens sampled and counted (an end-of-generation token is not) */
    int32_t draft_max;      /* prompt lookup: drafts at most; 0: off */
    llm_lookup_ctl lookup;  /* how many drafts to propose next (engine/gen/policy.h) */
    int32_t foreseen;       /* the lookup's token after the last drafts proposed; -1: none */
    /* Called with the logits [V] after the non-finite check, before
     * sampling, to bias or mask them (-INFINITY bans a token); nonzero
     * cancels (LLM_STOP_CANCEL, nothing sampled). NULL: none. */
    int (*on_logits)(void *user, float *logits, int32_t n_vocab);
    void *user;
    int status;             /* with LLM_STOP_ERROR from llm_choice_next: the cause */
    char error[128];        /* and what happened, with numbers */
} llm_choice;

typedef struct {
    const llm_sampler_params *sampler;
    const char *const *stops;   /* [n_stops] stop strings (copied) */
    int32_t n_stops;
    int32_t max_tokens;         /* < 0: no limit */
    unsigned stream_flags;      /* llm_textstream_create flags */
    int32_t draft_max;          /* 0 .. LLM_MAX_DRAFT */
    const int32_t *prompt;      /* [n_prompt] into the sampler's repeat window */
    int32_t n_prompt;
} llm_choice_params;

/* LLM_OK; LLM_ERR_PARAM (bad sampler parameters, a bad stop list, a draft
 * length outside [0, LLM_MAX_DRAFT]) or LLM_ERR_NOMEM, with a sentence in
 * err; then nothing is allocated. */
int llm_choice_init(llm_choice *ch, const llm_model *m, const llm_choice_params *p, char *err, size_t errlen);
void llm_choice_free(llm_choice *ch);

/* The next token from logits [V] of the position after the sequence's last
 * token. Returns LLM_STOP_NONE (go on), or why the choice ends: EOG (the
 * token is not counted), STRING, LENGTH (the token counted is the
 * max_tokens-th), CANCEL (the hook asked, nothing sampled), ERROR (non-finite
 * logits, nothing sampled, or a token the vocabulary cannot render:
 * ch->status and ch->error say which). *token: the sample, -1 when none;
 * *text / *len: the text now safe to show (valid until the next call). */
llm_stop_reason llm_choice_next(llm_choice *ch, float *logits, int32_t *token, const char **text, size_t *len);

/* Up to what pays (llm_lookup_ctl_next with the passes' measured costs and
 * the other sequences' rows_other rows and tokens_other tokens in the same
 * pass) and `room` (positions and batch rows left after the token to feed;
 * tokens left to generate are counted here), the drafts to follow hist [n]
 * (prompt and output) into draft; 0: none. cost NULL: as many as the
 * choice's draft length and room allow, every pass (a fixed length, for
 * results that must not depend on the machine's timings). */
int32_t llm_choice_propose(llm_choice *ch, const int32_t *hist, int32_t n, int64_t room, const llm_pass_cost *cost,
                           int32_t rows_other, double tokens_other, int32_t *draft);
/* A verify pass that proposed `proposed` drafts saw `accepted` taken and
 * then sampled `next` (the token in place of the first refused draft, or
 * after them all). */
void llm_choice_verified(llm_choice *ch, int32_t proposed, int32_t accepted, int32_t next);

/* A sequence whose cache holds n_cached positions of a context that is full
 * (no position for the next token): with context shift on and room to drop
 * after the n_keep kept positions (fewer than 4 count as 4), how many to
 * drop (> 0) and *keep; 0: the choice ends with LLM_STOP_CONTEXT. */
int32_t llm_choice_shift_plan(int context_shift, int32_t n_keep, int32_t n_cached, int32_t *keep);

/* Whether every one of x [n] is finite. */
int llm_all_finite(const float *x, int32_t n);

#endif
