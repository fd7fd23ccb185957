/* engine/status.h - the engine's return codes, and the one helper that writes
 * an error message.
 *
 * Every engine call that can fail returns an llm_status. The library's
 * kv_status codes are embedded with their values (-1 .. -16), so a code from
 * libkvcache passes through the engine unchanged and llm_status_str names it;
 * the engine's own codes start at -100. Each code says what state the failed
 * call left behind:
 *
 *   nothing changed   the call had no effect; fix the argument and call again
 *   retry             nothing changed, and the same call can succeed once
 *                     something is freed (a sequence removed or truncated)
 *   fatal             the object named is unusable: free it
 *
 * Calls that build something (llm_model_load, llm_context_create,
 * llm_textstream_create) also write one line into a caller's err buffer
 * saying what is wrong, with the numbers; on failure nothing is allocated and
 * *out is NULL. */
#ifndef LLM_STATUS_H
#define LLM_STATUS_H

#include <stddef.h>

#include "kvcache.h"

typedef enum {
    LLM_OK = 0,
    /* ---- the library's codes, as include/kvcache.h documents them */
    LLM_ERR_NULL = KV_ERR_NULL,               /* a required pointer was NULL; nothing changed */
    LLM_ERR_SHAPE = KV_ERR_SHAPE,             /* a count or batch shape is out of range (rows > n_batch,
                                               * row_start not non-decreasing); nothing changed */
    LLM_ERR_LENGTH = KV_ERR_LENGTH,           /* a position or truncation outside the sequence; nothing
                                               * changed */
    LLM_ERR_CAPACITY = KV_ERR_CAPACITY,       /* the sequence would exceed n_ctx positions: nothing changed
                                               * (llm_eval: the sequence is back where it was); the
                                               * context is full, truncate or remove to go on */
    LLM_ERR_OUT_OF_PAGES = KV_ERR_OUT_OF_PAGES, /* retry: the cache pool is short of pages; no sequence
                                               * changed; free one (preempt) and call again */
    LLM_ERR_WINDOW = KV_ERR_WINDOW,           /* a sliding-window cache already evicted keys the call
                                               * needs (a truncate too far back); fatal for that
                                               * sequence: remove it */
    LLM_ERR_NOMEM = KV_ERR_NOMEM,             /* allocation failed; nothing changed */
    LLM_ERR_SEQ = KV_ERR_SEQ,                 /* no such sequence, or no free sequence slot (retry after
                                               * removing one); nothing changed */
    /* ... and every other kv_status with its value and meaning */
    /* ---- the engine's own */
    LLM_ERR_TOKEN = -100,     /* a token id outside [0, n_vocab); nothing changed */
    LLM_ERR_PARAM = -101,     /* a parameter out of range (context, sampler, stop strings);
                                 nothing changed, err says which */
    LLM_ERR_MODEL = -102,     /* the file cannot be run as a model (unreadable, not GGUF, an
                                 unknown architecture, a missing or misshapen tensor); nothing
                                 was allocated, err says what */
    LLM_ERR_NONFINITE = -103, /* the logits hold NaN or infinity (bad weights or an overflow):
                                 no token was sampled; the sequence holds what was fed so far */
    /* ---- the scheduler's refusals of a request (engine/gen/scheduler.h); nothing was queued */
    LLM_ERR_QUEUE_FULL = -201, /* too many requests waiting: try later (HTTP 503) */
    LLM_ERR_TOO_LARGE = -202,  /* the request can never fit the context or the pool */
    LLM_ERR_STOPPED = -203,    /* the scheduler is shutting down */
} llm_status;

/* One sentence for any llm_status or kv_status code (never NULL). */
const char *llm_status_str(int status);

/* Writes the formatted message into err[0..n) (when err is not NULL and n >
 * 0; truncated to fit) and returns status, so that a check reads
 * `return llm_errf(err, n, LLM_ERR_MODEL, "missing tensor %s", name);`. */
int llm_errf(char *err, size_t n, int status, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#endif
