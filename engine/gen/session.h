/* engine/gen/session.h - the one generation loop: prompt in, tokens and text out.
 *
 * Two layers, so that a single-sequence command and the batching server share
 * every rule about when to stop and what text may be shown (both drive them
 * through the per-token state machine of engine/gen/choice.h):
 *
 *   llm_textstream   per generated sequence: token ids in, text out. It
 *                    detokenizes incrementally, holds back an incomplete UTF-8
 *                    character and any tail that could still become a stop
 *                    string, and says when a stop condition is met (end of
 *                    generation, stop string, max tokens). It runs no model,
 *                    so the scheduler keeps one per request.
 *   llm_session      one sequence on one llm_context: keep the longest common
 *                    prefix with what the sequence holds, prefill the rest in
 *                    n_batch chunks, then sample -> stream -> forward until a
 *                    stop reason, with per-phase timings. `generate`, `chat`
 *                    and `bench model` run on it: a conversation keeps its
 *                    cache between turns, and prefill and decode are timed
 *                    apart, which a batch shared with other requests (the
 *                    scheduler) could not give.
 *
 * Text rules. Shown text is always valid UTF-8: a byte that cannot begin or
 * continue a character becomes U+FFFD at once; the bytes of a character split
 * across tokens wait until it is complete (or, at the end, become one U+FFFD).
 * Stop strings are matched in that text; the text before the earliest match
 * is shown, the match and everything after it never are. An end-of-generation
 * token (llm_token_is_eog) is reported, never rendered; other control tokens
 * render as nothing. */
#ifndef LLM_SESSION_H
#define LLM_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "../model/model.h"
#include "sampler.h"

/* Why generation stopped. Every loop ends with exactly one. */
typedef enum {
    LLM_STOP_NONE = 0,   /* not stopped (still generating) */
    LLM_STOP_EOG,        /* the model emitted an end-of-sequence / end-of-turn token (not shown) */
    LLM_STOP_STRING,     /* a stop string appeared; text before it was emitted, it and after were not */
    LLM_STOP_LENGTH,     /* max_tokens generated */
    LLM_STOP_CONTEXT,    /* the sequence filled its context (n_ctx positions, less `reserve`) */
    LLM_STOP_CANCEL,     /* the caller asked to stop (a callback returned nonzero; client gone) */
    LLM_STOP_ERROR,      /* a forward pass failed or logits were not finite; see the status */
} llm_stop_reason;

/* "end of turn", "stop string", "token limit", "context full", "cancelled", "error". */
const char *llm_stop_reason_str(llm_stop_reason r);

/* ---------------------------------------------------------------- text stream */

enum { LLM_MAX_STOPS = 8, LLM_MAX_DRAFT = 64 /* llm_gen_params.draft_lookup at most */ };

/* llm_textstream_create flags */
enum { LLM_STREAM_IGNORE_EOG = 1 };  /* end-of-generation tokens are ordinary (rendered as nothing) */

typedef struct llm_textstream llm_textstream;

/* stops: [n_stops] non-empty NUL-terminated strings (copied), n_stops <=
 * LLM_MAX_STOPS; max_tokens: LLM_STOP_LENGTH once that many tokens were
 * pushed (< 0: no limit). LLM_OK, LLM_ERR_PARAM (a bad stop list) or
 * LLM_ERR_NOMEM; *out NULL on failure. */
int llm_textstream_create(const llm_tokenizer *tok, const char *const *stops, int32_t n_stops,
                          int32_t max_tokens, unsigned flags, llm_textstream **out);
void llm_textstream_free(llm_textstream *s);
/* Back to the state after create (for the next generation). */
void llm_textstream_reset(llm_textstream *s);

/* Feeds one sampled token. *out / *out_len receive the text that is now safe
 * to show (valid UTF-8, never part of a possible stop string; the pointer is
 * valid until the next call; length 0 when nothing is). Returns
 * LLM_STOP_NONE, or why to stop: EOG (the token is not counted), STRING (the
 * text before the match is in *out), LENGTH (the token counted is the
 * max_tokens-th), ERROR (an id outside the vocabulary). */
llm_stop_reason llm_textstream_push(llm_textstream *s, int32_t token, const char **out, size_t *out_len);
/* At the end (any reason but STRING): what is held back, an incomplete
 * character as U+FFFD. Then the stream is empty. */
void llm_textstream_flush(llm_textstream *s, const char **out, size_t *out_len);
/* Tokens counted so far (EOG not counted). */
int32_t llm_textstream_n_tokens(const llm_textstream *s);

/* ---------------------------------------------------------------- session */

typedef struct {
    int32_t max_tokens;             /* tokens to generate at most; < 0: until another stop;
                                     * 0: prefill only */
    llm_sampler_params sampler;
    const char *const *stops;       /* [n_stops] stop strings, or NULL */
    int32_t n_stops;
    int32_t reserve;                /* positions to keep free after the reply (e.g. for an
                                     * end-of-turn marker the caller feeds); 0: none */
    int ignore_eog;                 /* 1: end-of-generation tokens do not stop (benchmarks) */
    /* Called with the model's logits [V] before each sampling (after the
     * non-finite check) to bias or mask them (-INFINITY bans a token); return
     * nonzero to cancel. May be NULL. */
    int (*on_logits)(void *user, float *logits, int32_t n_vocab);
    /* Called with each generated token id (before its text); nonzero cancels. May be NULL. */
    int (*on_token)(void *user, int32_t token);
    /* Called with each piece of text as it becomes safe to show; nonzero cancels. May be NULL. */
    int (*on_text)(void *user, const char *text, size_t len);
    void *user;
    llm_progress_fn progress;       /* prefill progress (user: progress_user), or NULL */
    void *progress_user;
    /* Cache policies (engine/gen/policy.h), all off by default. */
    int context_shift;              /* 1: a full context keeps its first n_keep positions, drops
                                     * half of the rest and goes on (LLM_STOP_CONTEXT only when
                                     * n_keep leaves nothing to drop); 0: a full context stops */
    int32_t n_keep;                 /* positions a shift keeps, the attention sinks (e.g. the
                                     * system prompt); fewer than 4 count as 4 */
    int32_t draft_lookup;           /* N > 0: prompt-lookup speculative decoding: up to N tokens
                                     * proposed from the prompt and output, verified in one pass
                                     * of N + 1 rows; the output is what plain decoding gives */
    int draft_fixed;                /* 1: every pass proposes draft_lookup drafts (as room allows)
                                     * instead of as many as the measured pass costs pay for */
} llm_gen_params;

/* max_tokens 128, llm_sampler_default_params, no stops, reserve 0, no callbacks. */
llm_gen_params llm_gen_default_params(void);

typedef struct {
    llm_stop_reason reason;
    int status;                     /* LLM_OK, or the error behind LLM_STOP_ERROR (and
                                     * LLM_ERR_CAPACITY for a prompt that does not fit) */
    int32_t n_prompt;               /* prompt tokens given */
    int32_t n_reused;               /* of those, already in the cache (not prefilled) */
    int32_t n_generated;            /* tokens sampled (the end-of-generation token not counted) */
    int32_t eog_token;              /* with LLM_STOP_EOG: the token (not in the sequence); else -1 */
    double t_prefill, t_decode;     /* seconds */
    int32_t n_shifts, n_discarded;  /* context shifts made, and the positions they dropped */
    int32_t n_passes;               /* forward passes while decoding (one per verify pass) */
    int32_t n_drafted, n_accepted;  /* draft tokens verified, and of those accepted */
    char message[192];              /* with LLM_STOP_ERROR / CONTEXT: what happened, with numbers */
} llm_gen_result;

typedef struct llm_session llm_session;

/* A session on a new sequence of c (llm_seq_new; removed by llm_session_free).
 * LLM_OK, LLM_ERR_SEQ (no free slot) or LLM_ERR_NOMEM. */
int llm_session_create(llm_context *c, llm_session **out);
void llm_session_free(llm_session *s);

/* Makes the sequence hold tokens[0..n) (n >= 1) followed by generated
 * tokens: keeps the longest common prefix with what it holds (at least one
 * token is always prefilled, for its logits), truncates the rest, prefills
 * the remainder, then generates until a stop reason, which *res reports. The
 * session's tokens are then the prompt and every generated token; the cache
 * holds all of them but possibly the last (it is fed by the next generate or
 * feed). Returns res->status: LLM_OK for every stop but ERROR, with a prompt
 * that leaves no room to generate LLM_ERR_CAPACITY (reason CONTEXT, nothing
 * changed), LLM_ERR_TOKEN / LLM_ERR_PARAM (nothing changed), or the failure
 * behind LLM_STOP_ERROR (LLM_ERR_NONFINITE: the model's logits held NaN or
 * infinity, nothing was sampled from them). tokens is the caller's array, not
 * the one llm_session_tokens returns (this call may move that one). */
int llm_session_generate(llm_session *s, const int32_t *tokens, int32_t n, const llm_gen_params *p,
                         llm_gen_result *res);

/* Appends tokens [n] to the sequence (after a generated token not yet in the
 * cache) through the model, without logits: an end-of-turn marker, a depth
 * for a benchmark. All or nothing. */
int llm_session_feed(llm_session *s, const int32_t *tokens, int32_t n);
/* The same, with the logits after each of tokens [first, n) into
 * logits[n - first][V]: LLM_ERR_SHAPE for first outside [0, n]. */
int llm_session_eval(llm_session *s, const int32_t *tokens, int32_t n, int32_t first, float *logits);
/* Keeps the first n tokens (n <= what it holds). */
int llm_session_truncate(llm_session *s, int32_t n);
/* Forget everything (the sequence becomes empty). */
void llm_session_reset(llm_session *s);

/* Context shift (llm_context_shift) of the sequence and its tokens: drops
 * positions [n_keep, n_keep + n_discard) of what the cache holds; a token not
 * fed yet stays last. Nothing changes on error. */
int llm_session_shift(llm_session *s, int32_t n_keep, int32_t n_discard);
/* The cached tokens and their K/V to path (llm_session_file_save). LLM_OK,
 * or KV_ERR_IO with the reason in err. */
int llm_session_save(const llm_session *s, const char *path, char *err, size_t errlen);
/* Empties the session, then restores from path the longest common prefix of
 * the file's tokens and prompt [n] (at most n - 1: one token is left to
 * prefill); *n_restored positions. LLM_OK, or KV_ERR_IO with the reason in
 * err (the file is missing, corrupt, for another model or K/V type, or shares
 * nothing with the prompt): the session is then empty and usable, cold. */
int llm_session_load(llm_session *s, const char *path, const int32_t *prompt, int32_t n, int32_t *n_restored,
                     char *err, size_t errlen);

/* Tokens the session holds: [*n] (valid until the next call on s). */
const int32_t *llm_session_tokens(const llm_session *s, int32_t *n);
/* Of those, the ones in the cache (all, or all but the last). */
int32_t llm_session_n_cached(const llm_session *s);
int32_t llm_session_seq(const llm_session *s);   /* its sequence id in the context */

#endif
