/* engine/gen/scheduler.h - continuous batching over one llm_context: requests in,
 * tokens out, no HTTP.
 *
 * Every step gathers all running sequences into one ragged llm_forward batch:
 * a decoding sequence contributes one row, a prefilling one a chunk of its
 * prompt, under a per-step token budget (decodes first, so a long prompt never
 * stalls running decodes). A sequence is just its tokens and how many of them
 * the cache holds, so prefill, chunked prefill, decode and recomputation after
 * preemption are one rule: feed tokens[n_cached .. n_tokens), and when the
 * last one is fed, sample the next token from its logits.
 *
 *   admission    oldest waiting request first; its sequence reuses the
 *                cached pages of the longest prefix every cache group can
 *                resume at (llm_seq_prefix_match) and is admitted only when
 *                the pool has room for the rest. A request whose prompt
 *                begins with full pages a running request is prefilling now
 *                waits (later ones may pass it) until those pages are in the
 *                cache, and then reuses them.
 *   preemption   when kv_batch_reserve is out of pages, the newest running
 *                request gives up its pages (its tokens are kept) and waits at
 *                the head of the queue, to be recomputed when there is room.
 *   refusal      a request that could never fit (prompt beyond the context,
 *                or more pages than the whole pool) is refused at submit.
 *   n choices    one prefill; when the prompt is in, the sequence is forked
 *                (kv_seq_fork) into n, each sampling with its own seed.
 *   text         each choice runs an llm_choice (engine/gen/choice.h): the
 *                non-finite check, sampler, stop strings, max tokens, end of
 *                generation, UTF-8 and draft rules are those of every other
 *                command.
 *   sessions     a request may name a session file (engine/gen/policy.h): at its
 *                first admission the file's longest common prefix with the
 *                prompt is restored when it reaches further than the prefix
 *                cache; when choice 0 ends normally its sequence is saved
 *                there. Both run on the scheduler thread, between steps.
 *
 * Threads: llm_sched_submit, _cancel, _stop and _get_stats may be called from
 * any thread; llm_sched_step / llm_sched_run run on one thread (the one that
 * owns the context), and every callback runs there. */
#ifndef LLM_SCHEDULER_H
#define LLM_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include "../model/model.h"
#include "sampler.h"
#include "session.h"

/* Submit refusals: LLM_ERR_QUEUE_FULL, LLM_ERR_TOO_LARGE, LLM_ERR_STOPPED (engine/status.h). */

enum { LLM_SCHED_MAX_CHOICES = 16, LLM_SCHED_MAX_TOP = 20 };

typedef struct {
    int32_t batch_tokens;   /* rows one step may run at most (clipped to the context's n_batch) */
    int32_t max_running;    /* requests admitted at once; 0: as many as sequence slots allow */
    int32_t max_waiting;    /* submit refuses with LLM_ERR_QUEUE_FULL beyond this many waiting */
    /* Cache policies (engine/gen/policy.h), as llm_gen_params has them. */
    int context_shift;      /* 1: a sequence that fills the context keeps its first n_keep
                             * positions, drops half of the rest (llm_context_shift) and goes
                             * on; a request without max_tokens then ends after n_ctx tokens
                             * (LLM_STOP_LENGTH). 0: it ends with LLM_STOP_CONTEXT */
    int32_t n_keep;         /* positions a shift keeps (the attention sinks); fewer than 4 count as 4 */
    int no_prefix;          /* 1: never reuse the prefix cache (every prompt computed in full;
                             * for comparisons: `kvcache serve --no-prefix-cache`) */
    int32_t draft_lookup;   /* N > 0: greedy choices (temperature <= 0) decode by prompt lookup:
                             * up to N drafts (llm_lookup_draft) ride in the step as N more rows
                             * of the choice, the ones the model disagrees with are cut off by
                             * llm_seq_truncate; the tokens are those of plain decoding.
                             * 0 .. LLM_MAX_DRAFT */
    int draft_fixed;        /* 1: every pass proposes draft_lookup drafts (as room allows)
                             * instead of as many as the measured pass costs pay for
                             * (llm_lookup_ctl_next): steps that do not depend on timing */
    /* One line about a session file: restored or saved (with the time it
     * took), or ignored / not saved and why. Called on the scheduler thread;
     * NULL: silent. */
    void (*log)(void *user, const char *line);
    void *log_user;
    /* A disk tier under the prefix cache (engine/gen/tier.h), borrowed: a
     * waiting request whose prefix continues on disk waits aside while the
     * tier's thread reads it (others keep decoding), then resumes there.
     * Scheduler and tier each keep the other until llm_sched_free, which
     * comes before llm_tier_close. NULL: none. */
    struct llm_tier *tier;
} llm_sched_params;

/* batch_tokens 512, max_running 0, max_waiting 256, no shift (n_keep 0), no drafts, no log. */
llm_sched_params llm_sched_default_params(void);

/* What a callback receives. A choice produces token events, then exactly one
 * event with `finish` set; after every choice has finished, one last event
 * with `done` set, after which the scheduler never uses `user` again. */
typedef struct {
    int32_t choice;             /* 0 .. n_choices-1; -1 on the done event */
    int32_t token;              /* the sampled token, or -1 (finish/done events without one) */
    const char *text;           /* [text_len] text now safe to show (valid UTF-8); may be empty */
    size_t text_len;
    float logprob;              /* log p(token) under the model (raw logits), with logprobs */
    int32_t n_top;              /* alternatives below, 0 without logprobs */
    const int32_t *top_ids;     /* [n_top] most likely tokens, best first */
    const float *top_logprobs;  /* [n_top] their log probabilities */
    llm_stop_reason finish;     /* LLM_STOP_NONE, or why this choice ended */
    int done;                   /* the request's last event */
    /* usage, final on the done event */
    int32_t n_prompt;           /* prompt tokens */
    int32_t n_cached;           /* of those, reused at first admission (not prefilled): from
                                 * the prefix cache or the session file */
    int32_t n_restored;         /* of n_cached, read from the session file (0: none) */
    int32_t n_generated;        /* this choice's tokens (done event: all choices') */
    const char *error;          /* with LLM_STOP_ERROR: what failed */
    int status;                 /* with LLM_STOP_ERROR: the llm_status behind it */
} llm_sched_event;

typedef void (*llm_sched_cb)(void *user, const llm_sched_event *ev);

typedef struct {
    const int32_t *prompt;        /* [n_prompt] token ids (copied) */
    int32_t n_prompt;
    int32_t n_choices;            /* 1 .. LLM_SCHED_MAX_CHOICES */
    int32_t max_tokens;           /* per choice; < 0: until the context is full */
    llm_sampler_params sampler;   /* choice i uses seed + i */
    const char *const *stops;     /* [n_stops] stop strings (copied by the text streams) */
    int32_t n_stops;
    int32_t top_logprobs;         /* < 0: no logprobs; 0 .. LLM_SCHED_MAX_TOP alternatives */
    llm_sched_cb cb;              /* required */
    void *user;
    /* A session file (path, copied), or NULL. At first admission, when the
     * file is valid for this model and context (llm_session_file_peek) and
     * its tokens begin the prompt further than the prefix cache's match, that
     * prefix is restored (llm_session_file_load) and only the rest prefilled;
     * a file that cannot be used is ignored (logged) and the prompt runs as
     * without it. When choice 0 ends by end of turn, a stop string, max
     * tokens or a full context, the tokens its cache holds (prompt and
     * output, the last sampled token not fed) are saved there atomically
     * (llm_session_file_save); not when it is cancelled or fails, nor when it
     * has context-shifted (its kept K/V were computed over the dropped
     * tokens, so a restore would not equal a cold run). A preempted request
     * is recomputed from the prefix cache, not the file. */
    const char *session;
} llm_sched_request;

typedef struct {
    int32_t running, waiting;           /* requests */
    int32_t pages_total, pages_used, pages_free, pages_cached;
    uint64_t prefix_queries;            /* prompt tokens looked up in the prefix cache */
    uint64_t prefix_hits;               /* of those, found */
    uint64_t prompt_tokens;             /* prompt tokens of admitted requests */
    uint64_t generation_tokens;         /* tokens sampled */
    uint64_t preemptions;
    uint64_t prefill_waits;             /* requests that waited for another's prefill of their prefix */
    uint64_t disk_waits;                /* requests that waited for the disk tier's reads of their prefix */
    uint64_t steps;                     /* forward passes run */
    uint64_t rows;                      /* rows those passes took */
    uint64_t shifts;                    /* context shifts made */
    uint64_t drafted, accepted;         /* prompt-lookup draft tokens verified, and of those taken */
    uint64_t session_restores;          /* requests that restored a prefix from their session file */
    uint64_t session_restored;          /* tokens those restores gave */
    uint64_t session_refused;           /* session files present but ignored (corrupt, truncated,
                                         * another model or configuration, nothing in common,
                                         * no room in the pool) */
    uint64_t session_saves;             /* session files written */
    uint64_t session_save_failures;     /* saves that failed or were skipped (after a shift) */
    double session_seconds;             /* scheduler-thread time in session file I/O */
} llm_sched_stats;

typedef struct llm_sched llm_sched;

/* The scheduler borrows c (and its model) for its lifetime and owns every
 * sequence of its caches while it lives. LLM_OK, or an llm_status code. */
int llm_sched_create(llm_context *c, const llm_sched_params *p, llm_sched **out);
/* Ends every request (LLM_STOP_CANCEL, callbacks run) and frees. */
void llm_sched_free(llm_sched *s);

/* Queues a request; *id names it for llm_sched_cancel. 0, or
 * LLM_ERR_TOO_LARGE / LLM_ERR_QUEUE_FULL / LLM_ERR_STOPPED / LLM_ERR_PARAM /
 * LLM_ERR_NULL with a sentence in err (err may be NULL). A refused request gets
 * no callback. */
int llm_sched_submit(llm_sched *s, const llm_sched_request *r, uint64_t *id, char *err, size_t errlen);
/* Ends the request at the next step (LLM_STOP_CANCEL); its pages are freed
 * then. Unknown or finished ids are ignored. */
void llm_sched_cancel(llm_sched *s, uint64_t id);

/* One step on the calling thread: take new requests and cancellations,
 * admit, run one batch, deliver tokens. Returns the rows run (0: nothing to
 * do) or a negative status when the context failed (the requests of that
 * batch end with LLM_STOP_ERROR; the scheduler stays usable). */
int llm_sched_step(llm_sched *s);
/* Steps until llm_sched_stop, sleeping while there is nothing to do; then
 * ends every request (LLM_STOP_CANCEL) and returns 0. */
int llm_sched_run(llm_sched *s);
/* Makes llm_sched_run return; later submits get LLM_ERR_STOPPED. */
void llm_sched_stop(llm_sched *s);

/* A snapshot taken at the end of the last step. */
llm_sched_stats llm_sched_get_stats(llm_sched *s);

#endif
