/* engine/gen/sched_records.h - the scheduler's records (requests, their
 * choices, the scheduler itself), shared by scheduler.c (admission, steps,
 * policies) and scheduler_session.c (session files). Not part of the
 * engine's interface: include scheduler.h instead. */
#ifndef LLM_SCHED_RECORDS_H
#define LLM_SCHED_RECORDS_H

#include <pthread.h>

#include "choice.h"
#include "policy.h"
#include "scheduler.h"

/* ---------------------------------------------------------------- records */

/* One choice of a request: a cache sequence while resident. */
typedef struct {
    int32_t seq;            /* cache sequence id; -1 when it holds no pages (waiting, preempted, done) */
    int32_t *tokens;        /* [cap] the prompt, then every token sampled */
    int32_t n_tokens;       /* tokens known */
    int32_t n_cached;       /* of those, in the cache (the rest are fed by the next steps) */
    int32_t cap;
    int32_t rows;           /* rows this sequence has in the batch being built */
    int32_t out_row;        /* its (first) logits row in that batch, or -1 */
    int32_t n_draft;        /* of its rows, drafts after the token fed (each row wants logits) */
    llm_stop_reason stop;   /* LLM_STOP_NONE while the choice lives */
    int shifted;            /* a context shift moved its cache: never saved to a session */
    llm_choice c;           /* sampling, text, stop rules, draft policy (engine/gen/choice.h) */
} sched_seq;

typedef struct sched_req {
    uint64_t id;                /* arrival order: larger is newer */
    llm_sched_cb cb;
    void *user;
    int32_t n_prompt;
    int32_t n_choices;
    int32_t top;                /* top_logprobs, < 0: none */
    int forked;                 /* choices 1.. exist (prompt prefilled and forked) */
    int admitted;               /* has been admitted once (n_cached_first is known) */
    int deferred;               /* has waited for another request's prefill (counted once) */
    int disk_asked;             /* the disk tier was asked for its prefix (once) */
    struct llm_tier_load *load; /* its pages being read from the disk tier, or NULL */
    int32_t n_cached_first;     /* prompt tokens reused at first admission (prefix cache or session) */
    int32_t n_restored;         /* of those, restored from the session file */
    char *session;              /* the session file's path, or NULL */
    struct sched_req *next;     /* in the inbox or the waiting list */
    sched_seq ch[];             /* [n_choices] */
} sched_req;

struct llm_sched {
    llm_context *c;
    const llm_model *m;
    kv_cache *cache;
    llm_sched_params p;
    int32_t n_ctx, n_slots, page_size, n_pages, V;

    /* owned by the scheduler thread */
    sched_req **running;        /* [n_slots] admitted requests, oldest first */
    sched_req **ended;          /* [n_slots] reap's finished requests, before their done events */
    int32_t n_running;
    sched_req *wait_head, *wait_tail;   /* FIFO; preempted requests go back to the head */
    int32_t n_waiting;
    int32_t n_loading;          /* of those, waiting for the disk tier's reads */
    /* the batch being built: at most n_slots sequences, batch_tokens rows */
    int32_t *b_seqs, *b_rows, *b_tokens;
    uint8_t *b_want;
    sched_seq **b_ch;           /* [n_slots] the choice behind each batch entry */
    float *logits;              /* [n_out_max][V]: one row per sequence, N + 1 with drafts */
    int32_t n_out_max;
    float *lsm;                 /* [V] scratch for log-softmax */
    llm_sched_stats st;         /* counters, written here */
    llm_pass_cost cost;         /* the steps' measured costs by rows, for the drafts' choice */

    /* shared with other threads, under mu */
    pthread_mutex_t mu;
    pthread_cond_t wake;
    sched_req *in_head, *in_tail;   /* submitted, not yet seen by a step */
    int32_t n_inbox;
    uint64_t next_id;
    uint64_t *cancels;              /* [n_cancels] ids to cancel at the next step */
    int32_t n_cancels, cap_cancels;
    int stopping, idle;
    int load_ready;                 /* a disk tier's load became ready since the last step */
    llm_sched_stats snap;           /* st and the pool, at the end of the last step */
};

static inline int32_t pages_for(int32_t tokens, int32_t page) { return (tokens + page - 1) / page; }

/* Session files (scheduler_session.c), on the scheduler thread. At the first
 * admission of r, which names a session and whose choice 0 holds the prefix
 * cache's match: restores the file's prefix when it is worth reading (need:
 * the pages the admission counted on). 0, or 1 when choice 0 gave up its
 * sequence and the file could not be read: the caller places it again. */
int llm_sched_session_restore(llm_sched *s, sched_req *r, int32_t need);
/* When choice 0 (ch) of r ends normally, before its pages go: its cached
 * tokens to the session file, unless it context-shifted. */
void llm_sched_session_save(llm_sched *s, sched_req *r, sched_seq *ch);

#endif
