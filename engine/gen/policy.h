/* engine/gen/policy.h - cache policies a generation loop applies to one sequence
 * of a context:
 *
 *   context shift      when the sequence fills its context, keep its first
 *                      n_keep positions (the attention sinks: the system
 *                      prompt), drop the n_discard after them and go on; the
 *                      kept keys move to new positions, their K re-rotated in
 *                      place (kv_seq_shift).
 *   prompt lookup      speculative decoding without a draft model: propose
 *                      the tokens that followed the most recent earlier
 *                      occurrence of the current n-gram (up to 3 tokens) in
 *                      prompt + output, verify them all in one forward pass
 *                      (T = n_draft + 1 rows over the cache)
 *                      and keep the longest run the model agrees with.
 *   session files      a sequence saved with the model's fingerprint and its
 *                      token ids, restored when those tokens begin a new prompt.
 *
 * They live in the engine, not the command line, so that the one generation
 * loop (engine/gen/session.c) and the server apply the same rules. */
#ifndef LLM_POLICY_H
#define LLM_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "../model/model.h"

/* ---------------------------------------------------------------- context shift */

/* Drops positions [n_keep, n_keep + n_discard) of seq and renumbers the rest
 * in every cache of the context (kv_seq_shift, each with the RoPE table of
 * its layers). Window caches go first: a refusal there (LLM_ERR_WINDOW, the
 * next query would need a key it evicted) or a bad argument (LLM_ERR_LENGTH)
 * changes nothing. KV_ERR_UNSUPPORTED when one cache serves layers with
 * different RoPE tables. A failure in a later, full cache (out of pages for
 * copies of shared pages) leaves the caches out of step: remove the sequence. */
int llm_context_shift(llm_context *c, int32_t seq, int32_t n_keep, int32_t n_discard);

/* How much a shift drops when a sequence of n_ctx positions is full and keeps
 * n_keep: half of what is not kept (llama.cpp's choice: a shift every
 * n_ctx/2 tokens, not one per token), at least 1. */
int32_t llm_shift_discard(int32_t n_ctx, int32_t n_keep);

/* ---------------------------------------------------------------- prompt lookup */

/* LLM_LOOKUP_NGRAM_MIN: tokens a match must share with the end of hist;
 * LLM_LOOKUP_CONTEXT_MAX: how far back two matches are compared. */
enum { LLM_LOOKUP_NGRAM_MIN = 1, LLM_LOOKUP_CONTEXT_MAX = 3 };

/* Proposes up to max_draft tokens to follow hist [n]: the earlier occurrence
 * of hist's last token whose preceding tokens agree with hist's for longest
 * (compared up to LLM_LOOKUP_CONTEXT_MAX back; at least LLM_LOOKUP_NGRAM_MIN
 * agree), the most recent among equals, and the tokens after it.
 * draft [max_draft]; returns how many were written (0: no match). */
int32_t llm_lookup_draft(const int32_t *hist, int32_t n, int32_t max_draft, int32_t *draft);

/* How long a forward pass of r rows takes (a decode step is 1 row, a verify
 * pass 1 + its drafts, a scheduler step every sequence's rows), measured by
 * the loop that runs them: the weight products are compute-bound, so a row
 * costs well over nothing, and how much depends on the model, the machine
 * and its load. Per row count up to LLM_PASS_COST_ROWS an average
 * of the recent passes (a pass over twice or under half of it counts as
 * that) and how often it was seen. Zero it to start. */
enum { LLM_PASS_COST_ROWS = 64 };
typedef struct {
    double t[LLM_PASS_COST_ROWS + 1]; /* seconds of a pass of r rows (recent average); 0: not measured */
    double w[LLM_PASS_COST_ROWS + 1]; /* passes of r rows seen, at most 8 */
} llm_pass_cost;

/* Seconds on a monotonic clock, to time passes with. */
double llm_pass_clock(void);

/* Records a pass of `rows` rows that took `seconds`; ignores rows outside
 * 1 .. LLM_PASS_COST_ROWS and times that are not positive. */
void llm_pass_cost_add(llm_pass_cost *c, int32_t rows, double seconds);

/* The expected seconds of a pass of `rows` rows (1 .. LLM_PASS_COST_ROWS):
 * the least-squares line through the measured row counts (a row's cost at
 * least a tenth of their mean), or with one row count r measured, a row
 * costing 1 / (r + 1.5) of a pass of r. 0 when nothing is measured. */
double llm_pass_cost_at(const llm_pass_cost *c, int32_t rows);

/* Chooses the drafts of a sequence's next verify pass by what they are
 * measured to pay. A run is the tokens the lookup foresaw one after another,
 * over as many passes as it lasts, until one differs from what the model
 * chose; per position n in a run the controller keeps how often the lookup's
 * token there was right once the run had reached it (recent passes weigh
 * most), a_n. A copied line runs to its end and breaks there, so the odds of
 * the next draft depend on how far the current run has come, c: k drafts
 * yield E(k) = 1 + a_c+1 + a_c+1 a_c+2 + ... + a_c+1..a_c+k tokens. It picks
 * the k in 0 .. n_max that maximizes the tokens of the pass per second:
 * (tokens_other + E(k)) / cost(rows_other + 1 + k), where the other rows and
 * tokens are those of the other sequences in the same pass (0 for one
 * sequence). When no drafts pay it proposes none, but every probe_gap
 * passes it asks for one (the gap doubling while drafts keep not paying, up
 * to where probes cost about 1% of the time, and LLM_LOOKUP_PROBE_MAX; what
 * was seen fades meanwhile), so that a copy that begins later is found; the
 * first pass is plain, to measure its cost. */
enum { LLM_LOOKUP_PROBE_MIN = 4, LLM_LOOKUP_PROBE_MAX = 128, LLM_LOOKUP_RUN = 48 };
typedef struct {
    int32_t n_max;     /* drafts at most; 0: never */
    double hit[LLM_LOOKUP_RUN + 1], tried[LLM_LOOKUP_RUN + 1]; /* per run position 1..: decayed counts
                                                               * (the last for every later one) */
    int32_t run;       /* run positions so far (0 after a break or a plain pass) */
    int32_t idle;      /* passes planned without drafts since drafts were last tried */
    int32_t probe_gap; /* passes without drafts before a probe */
} llm_lookup_ctl;

void llm_lookup_ctl_init(llm_lookup_ctl *c, int32_t n_max);

/* After a verify pass that proposed `proposed` drafts, `accepted` of them
 * taken. When all were taken, the model's own next token shows whether the
 * run goes on past them: next_foreseen 1 if it is the token the lookup had
 * after the drafts, 0 if another, -1 if the lookup had none. 0 proposed: a
 * plain pass, which ends the run it cannot see. */
void llm_lookup_ctl_seen(llm_lookup_ctl *c, int32_t proposed, int32_t accepted, int next_foreseen);

/* The drafts to propose for the next pass (0 .. n_max; the loop may find
 * fewer). Call once per pass planned. */
int32_t llm_lookup_ctl_next(llm_lookup_ctl *c, const llm_pass_cost *cost, int32_t rows_other, double tokens_other);

/* ---------------------------------------------------------------- session files */

/* A hash of what makes a model's K/V: its shape, RoPE, vocabulary size,
 * weight bytes and norm vectors (two fine-tunes of one shape differ there). */
uint64_t llm_model_fingerprint(const llm_model *m);

/* Writes seq (holding tokens [n], n = its length) to path: a header with the
 * model's fingerprint and name, the K/V type and the token ids, then the
 * library's sequence file. Written to a temporary file of its own beside path
 * (path.XXXXXX, mkstemp: mode 0600) and renamed over path, so a reader sees
 * the old file or the new one whole, a failed save leaves the older file, and
 * concurrent writers of one path end with one of their files (the last
 * renamed). Not fsync'ed: a power cut may leave a file the checksums refuse.
 * 0, or -1 with the reason in err. */
int llm_session_file_save(llm_context *c, int32_t seq, const int32_t *tokens, int32_t n, const char *path,
                          char *err, size_t errlen);

/* Restores path into a new sequence *seq that holds the longest common prefix
 * of the file's tokens and prompt [n_prompt], at most n_prompt - 1 of them so
 * that one token is left to prefill for its logits: *n_restored positions.
 * 0 on success; -1 with the reason in err (no such file, not a session file,
 * corrupt or truncated, made for another model or K/V type, longer than the
 * context, nothing in common with the prompt), *seq = -1 and the cache as it
 * was: the caller goes on cold. */
int llm_session_file_load(llm_context *c, const char *path, const int32_t *prompt, int32_t n_prompt,
                          int32_t *seq, int32_t *n_restored, char *err, size_t errlen);

/* What llm_session_file_load would restore, reading only the engine's header
 * and token ids (n_file x 4 bytes, no K/V): *n_common tokens of path begin
 * prompt [n_prompt] (at most n_prompt - 1), of the *n_file it holds. 0; 1
 * when there is no such file; or -1 with the reason (as llm_session_file_load
 * gives it, but the K/V are not read: a file that passes may still be
 * refused by the load). */
int llm_session_file_peek(llm_context *c, const char *path, const int32_t *prompt, int32_t n_prompt,
                          int32_t *n_common, int32_t *n_file, char *err, size_t errlen);

/* Removes from dir the temporary files (NAME.kvs.XXXXXX) of saves that never
 * finished: a writer killed before its rename. Only for a directory no other
 * process is saving into. The number removed, or -1 with the reason. */
int llm_session_dir_clean(const char *dir, char *err, size_t errlen);

#endif
