/* engine/session.h - the one generation loop: prompt in, tokens and text out.
 *
 * Two layers, so that a single-sequence command and the batching server share
 * every rule about when to stop and what text may be shown:
 *
 *   llm_textstream   per generated sequence: token ids in, text out. It
 *                    detokenizes incrementally, holds back an incomplete UTF-8
 *                    character and any tail that could still become a stop
 *                    string, and says when a stop condition is met. It runs
 *                    no model, so the scheduler keeps one per request.
 *   llm_session      one sequence on one llm_context: prefill the prompt
 *                    (reusing what the cache already holds), then
 *                    sample -> stream -> forward until a stop reason, with
 *                    per-phase timings. `generate`, `chat`, `bench model` use it.
 *
 * DRAFT INTERFACE (written before the implementation, to let the engine,
 * server and cache-policy work proceed together). The implementer may refine
 * names and fields, keeping the two layers and the stop reasons. */
#ifndef LLM_SESSION_H
#define LLM_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "sampler.h"

/* Why generation stopped. Every loop ends with exactly one. */
typedef enum {
    LLM_STOP_NONE = 0,   /* not stopped (still generating) */
    LLM_STOP_EOG,        /* the model emitted an end-of-sequence / end-of-turn token (not shown) */
    LLM_STOP_STRING,     /* a stop string appeared; text before it was emitted, it and after were not */
    LLM_STOP_LENGTH,     /* max_tokens generated */
    LLM_STOP_CONTEXT,    /* the sequence filled its context (n_ctx positions) */
    LLM_STOP_CANCEL,     /* the caller asked to stop (callback returned nonzero; client gone) */
    LLM_STOP_ERROR,      /* a forward pass failed or logits were not finite; see the status */
} llm_stop_reason;

/* "end of turn", "stop string", "token limit", "context full", "cancelled", "error". */
const char *llm_stop_reason_str(llm_stop_reason r);

/* ---------------------------------------------------------------- text stream */

enum { LLM_MAX_STOPS = 8 };

typedef struct llm_textstream llm_textstream;

/* stops: [n_stops] NUL-terminated strings (copied), n_stops <= LLM_MAX_STOPS;
 * max_tokens: LLM_STOP_LENGTH after that many tokens (< 0: no limit). */
int llm_textstream_create(const llm_model *m, const char *const *stops, int32_t n_stops,
                          int32_t max_tokens, llm_textstream **out);
void llm_textstream_free(llm_textstream *s);

/* Feeds one sampled token. Appends to *out / *out_len the text that is now
 * safe to show (valid UTF-8, never part of a possible stop string; pointer
 * valid until the next call) and returns LLM_STOP_NONE or the reason to stop.
 * An end-of-generation token is reported, never rendered. */
llm_stop_reason llm_textstream_push(llm_textstream *s, int32_t token, const char **out, size_t *out_len);
/* At the end (any reason but STRING): the held-back tail, invalid bytes
 * replaced by U+FFFD. */
void llm_textstream_flush(llm_textstream *s, const char **out, size_t *out_len);

/* ---------------------------------------------------------------- session */

typedef struct {
    int32_t max_tokens;             /* tokens to generate at most; < 0: until another stop */
    llm_sampler_params sampler;
    const char *const *stops;       /* [n_stops] stop strings, or NULL */
    int32_t n_stops;
    /* Called with each piece of text as it becomes safe to show; return
     * nonzero to cancel. May be NULL. */
    int (*on_text)(void *user, const char *text, size_t len);
    /* Called with each generated token id (before its text); NULL allowed. */
    int (*on_token)(void *user, int32_t token);
    void *user;
} llm_gen_params;

/* max_tokens 128, llm_sampler_default_params, no stops, no callbacks. */
llm_gen_params llm_gen_default_params(void);

typedef struct {
    llm_stop_reason reason;
    int status;                     /* LLM_OK, or the error behind LLM_STOP_ERROR */
    int32_t n_prompt;               /* prompt tokens given */
    int32_t n_reused;               /* of those, already in the cache (not prefilled) */
    int32_t n_generated;            /* tokens sampled (the end-of-generation token not counted) */
    double t_prefill, t_decode;     /* seconds */
    char message[160];              /* with LLM_STOP_ERROR / CONTEXT: what happened, with numbers */
} llm_gen_result;

typedef struct llm_session llm_session;

/* A session on sequence 0..n_seqs of c (it creates its own sequence). */
int llm_session_create(llm_context *c, llm_session **out);
void llm_session_free(llm_session *s);

/* Makes the sequence hold exactly tokens[0..n) followed by generated text:
 * keeps the longest common prefix with what it holds (truncating the rest),
 * prefills the remainder, then generates until a stop reason. The cache holds
 * prompt + generated tokens afterwards (so a chat continues from there). */
int llm_session_generate(llm_session *s, const int32_t *tokens, int32_t n, const llm_gen_params *p,
                         llm_gen_result *res);

/* Tokens the sequence holds now: [*n]. */
const int32_t *llm_session_tokens(const llm_session *s, int32_t *n);
/* Forget everything (the sequence becomes empty). */
void llm_session_reset(llm_session *s);

#endif
