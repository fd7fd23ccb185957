/* engine/model/model.h - a model from a GGUF file, run on the paged KV cache of
 * libkvcache: loading, contexts, sequences, the forward pass.
 *
 * The architecture is chosen by the file's `general.architecture` from a
 * small table (engine/model/arch.h); each one is a file that composes the shared
 * layer toolkit (engine/model/layers.h). Today: `llama` (engine/model/arch_llama.c:
 * Llama 1-3, TinyLlama, SmolLM2, Mistral, with its sliding window when the
 * file declares one), `gemma3` (engine/model/arch_gemma3.c: Gemma 3 270M and 1B,
 * whose window layers share a sliding-window cache), `qwen2` and `qwen3`
 * (engine/model/arch_qwen.c: Qwen2/2.5 with q/k/v biases, Qwen3 with per-head q/k
 * norms) and `phi3` (engine/model/arch_phi3.c: Phi-3 4k, fused projections).
 *
 * Weights stay in the file mapping in their block format; only the small
 * norm vectors are decoded to f32 at load. An llm_model is immutable once
 * loaded: any number of contexts (and threads) may share it. Its fields are
 * the engine's (engine/model/arch.h); a program reads it through the accessors
 * below.
 *
 * A context owns what running needs, all allocated once at creation: one KV
 * cache per layer group the architecture declares (layers that share a
 * sliding window share a cache; Llama has one group), each with pages for
 * n_seqs sequences of up to n_ctx positions; a thread pool; scratch for
 * n_batch rows. A sequence id names the same sequence in every cache: create,
 * truncate and remove sequences with llm_seq_*, which keep the caches in step.
 * Calls on one context are serialized by the caller. Every call returns an
 * llm_status (engine/status.h); a failed forward leaves every sequence as it
 * was. */
#ifndef LLM_MODEL_H
#define LLM_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kvcache.h"
#include "../text/chat.h"
#include "../gguf/gguf.h"
#include "../status.h"
#include "../text/tokenizer.h"

/* ---------------------------------------------------------------- the model */

/* Model-wide hyperparameters (<arch>.* keys). What differs between layers
 * (window, RoPE base) is in the engine's per-layer table (engine/model/arch.h). */
typedef struct {
    int32_t n_vocab;         /* V: tokens in the vocabulary (= rows of token_embd) */
    int32_t dim;             /* D: <arch>.embedding_length */
    int32_t n_layers;        /* L: <arch>.block_count */
    int32_t n_heads;         /* H: <arch>.attention.head_count */
    int32_t n_kv_heads;      /* Hkv: <arch>.attention.head_count_kv (H when absent) */
    int32_t head_dim;        /* d: D / H, or <arch>.attention.key_length */
    int32_t ffn_dim;         /* F: <arch>.feed_forward_length */
    int32_t ctx_train;       /* <arch>.context_length: the context it was trained for */
    float norm_eps;          /* <arch>.attention.layer_norm_rms_epsilon */
    kv_rope_params rope;     /* theta (rope.freq_base), rot_dim (rope.dimension_count), layout;
                              * of the full-attention layers when they differ */
} llm_hparams;

typedef struct llm_model llm_model;

/* Maps the file and checks everything a forward pass relies on: the
 * architecture, every hyperparameter, every tensor's presence, type and shape.
 * LLM_OK, or LLM_ERR_MODEL with one line in err saying what is wrong. */
int llm_model_load(const char *path, llm_model **out, char *err, size_t errlen);
/* The same over a file already opened (e.g. by llm_gguf_open_memory), which
 * the model takes over: closed by llm_model_free, or at once on failure.
 * name: used when the file has no general.name (NULL: "model"). */
int llm_model_from_gguf(llm_gguf *g, const char *name, llm_model **out, char *err, size_t errlen);
void llm_model_free(llm_model *m);

/* Reads only the hyperparameters (no tensors, no tokenizer): for `price` and
 * `info`. LLM_OK, or LLM_ERR_MODEL with a message. */
int llm_hparams_read(const llm_gguf *g, llm_hparams *hp, char *err, size_t errlen);

/* What a program may read of a loaded model. */
const llm_hparams *llm_model_hparams(const llm_model *m);
const llm_tokenizer *llm_model_tokenizer(const llm_model *m);
const llm_chat_format *llm_model_chat(const llm_model *m); /* kind LLM_CHAT_UNKNOWN: none known */
const char *llm_model_name(const llm_model *m);            /* general.name, or the file name */
const char *llm_model_arch(const llm_model *m);            /* general.architecture, e.g. "llama" */
uint64_t llm_model_weight_bytes(const llm_model *m);       /* bytes of every tensor in the file */
/* bytes of the weights' packed copy (quant.h, llm_pack_rows; KVCACHE_PACK=0: none) */
uint64_t llm_model_packed_bytes(const llm_model *m);
/* bytes a token's products stream: every layer's projections and the output,
 * each in its packed copy if it has one, else as the file has it (the token
 * embeddings, read a row at a time, and the norms are not counted) */
uint64_t llm_model_streamed_bytes(const llm_model *m);
int32_t llm_model_n_vocab(const llm_model *m);
/* The layer groups: layers that share a sliding window share one cache, and
 * a context makes one cache per group, in this order (llm_context_cache_at).
 * Group g's layer count and window (0: full attention) into the pointers
 * (either may be NULL); LLM_ERR_SHAPE for a g outside [0, n_groups). */
int32_t llm_model_n_groups(const llm_model *m);
int llm_model_group(const llm_model *m, int32_t g, int32_t *n_layers, int32_t *window);

/* ---------------------------------------------------------------- contexts */

typedef struct {
    int32_t n_ctx;       /* positions one sequence may hold; 0: min(ctx_train, 4096) */
    int32_t n_seqs;      /* sequences that may live at once */
    int32_t n_batch;     /* rows one llm_forward call may take (prompt chunk size) */
    int32_t n_threads;   /* threads for matrix products and attention (1: no workers) */
    kv_dtype kv_type;    /* storage of cached K and V: KV_F32, KV_F16, KV_BF16, KV_Q8 */
    int32_t page_size;   /* positions per cache page */
    int32_t no_window;   /* 1: sliding-window layers keep every position, in caches sized as
                          * full ones (attention still sees only the window, so the results
                          * are the same): to compare memory with and without windows */
    int32_t n_pages;     /* pages in the KV pool; 0: n_seqs x ceil(n_ctx / page_size), room for
                          * every sequence at full length (fewer: sequences share the pool) */
    int32_t act_bits;    /* activations of the weight products (engine/weights/quant.h, llm_act): 16 or 8
                          * (integer dot products), 0 (f32, the reference), -1: the engine's
                          * default, llm_act_default_bits() (KVCACHE_EXACT_MATMUL, KVCACHE_ACT_BITS) */
    int32_t window;      /* > 0: layers without a window of their own attend to their last
                          * `window` positions only, through window caches (a Mistral-style
                          * sliding window over any model: `kvcache verify --policy window`);
                          * 0: the model's own windows */
} llm_context_params;

/* n_ctx 0, n_seqs 1, n_batch 256, n_threads 1, KV_F16, page_size 16, no_window 0, n_pages 0,
 * act_bits -1, window 0. */
llm_context_params llm_context_default_params(void);

typedef struct llm_context llm_context;

/* LLM_OK; LLM_ERR_PARAM for a parameter out of range, LLM_ERR_NOMEM, or the
 * cache's kv_status, each with a message in err. */
int llm_context_create(const llm_model *m, const llm_context_params *p, llm_context **out,
                       char *err, size_t errlen);
void llm_context_free(llm_context *c);
const llm_model *llm_context_model(const llm_context *c);
llm_context_params llm_context_get_params(const llm_context *c); /* with n_ctx resolved */
/* The caches, one per layer group: [llm_context_n_caches(c)]. For reading
 * stats and K/V; change sequences through llm_seq_*, not on one cache. */
int32_t llm_context_n_caches(const llm_context *c);
kv_cache *llm_context_cache_at(llm_context *c, int32_t i);
kv_cache *llm_context_cache(llm_context *c);   /* cache 0 (Llama's only one) */
/* The caches' stats added together (bytes_per_token: of all caches). */
kv_cache_stats llm_context_stats(const llm_context *c);
/* kv_batch_reserve_cost in every cache, added together; fits when every
 * cache's does. A window cache is asked about at most `window_rows` rows per
 * sequence (one batch: it evicts as it goes, so a whole prompt at once would
 * overstate it). */
int llm_context_reserve_cost(llm_context *c, const kv_batch *b, int32_t window_rows, kv_reserve_cost *cost);

/* ---------------------------------------------------------------- sequences */

/* The same calls as kv_seq_*, on every cache of the context at once; all or
 * nothing (a failure leaves every cache as it was, except LLM_ERR_WINDOW from
 * a truncate, after which the sequence must be removed). */
int llm_seq_new(llm_context *c, int32_t *seq);
int llm_seq_remove(llm_context *c, int32_t seq);
int32_t llm_seq_length(const llm_context *c, int32_t seq); /* or a negative status */
int llm_seq_truncate(llm_context *c, int32_t seq, int32_t new_len);
int llm_seq_fork(llm_context *c, int32_t parent, int32_t *child);
/* Prefix reuse across every cache group: on an empty sequence, the longest
 * page-aligned point <= n that every cache can resume tokens at (a full
 * group: every page below it; a window group: the pages covering the last W
 * positions before it), matched in each cache. *n_matched positions are then
 * cached; pass n - 1 to keep a token to feed for its logits. */
int llm_seq_prefix_match(llm_context *c, int32_t seq, const int32_t *tokens, int32_t n, int32_t *n_matched);
/* The point llm_seq_prefix_match would resume tokens [n] at, changing nothing. */
int llm_prefix_lookup(llm_context *c, const int32_t *tokens, int32_t n, int32_t *n_found);
/* Makes the full pages seq has written so far findable by prefix matches
 * now, rather than at its next forward (kv_seq_reserve of 0 positions). */
int llm_seq_publish(llm_context *c, int32_t seq);

/* ---------------------------------------------------------------- running */

/* New tokens for several sequences at once (ragged, CSR as kv_batch):
 * sequence seqs[b] receives tokens[row_start[b] .. row_start[b+1]). */
typedef struct {
    int32_t n_seqs;
    const int32_t *seqs;        /* [n_seqs] ids from llm_seq_new */
    const int32_t *row_start;   /* [n_seqs + 1], row_start[0] = 0, non-decreasing */
    const int32_t *tokens;      /* [rows] */
    const uint8_t *want;        /* [rows] nonzero: return this row's logits; NULL: the last
                                 * row of each sequence with rows */
} llm_batch;

/* Appends the batch's tokens to their sequences and runs them through the
 * model as one matrix pass: rows = row_start[n_seqs] <= n_batch. logits
 * receives [n_wanted][V], wanted rows in batch order (NULL: none are
 * computed, e.g. to feed a token whose successor is already known). On error
 * no sequence changed: LLM_ERR_TOKEN, LLM_ERR_SHAPE, LLM_ERR_CAPACITY (a
 * sequence would pass n_ctx), LLM_ERR_OUT_OF_PAGES (retry after freeing). */
int llm_forward(llm_context *c, const llm_batch *b, float *logits);

/* Called during long evaluations: done of total tokens. */
typedef void (*llm_progress_fn)(void *user, int64_t done, int64_t total);

/* Appends tokens [n] to one sequence in chunks of n_batch rows. logits:
 * all = 0: the last token's [V]; all = 1: every token's [n][V]; NULL: none.
 * progress may be NULL. On error the sequence is truncated back to where it
 * was. */
int llm_eval(llm_context *c, int32_t seq, const int32_t *tokens, int32_t n, int all, float *logits,
             llm_progress_fn progress, void *user);
/* The same, with the logits of tokens [first, n) into logits[n - first][V]
 * (first == n or logits NULL: none); LLM_ERR_SHAPE for first outside [0, n]. */
int llm_eval_from(llm_context *c, int32_t seq, const int32_t *tokens, int32_t n, int32_t first, float *logits,
                  llm_progress_fn progress, void *user);

/* The same model over tokens [n] with no cache at all: every position is
 * recomputed in one pass and attends through dense kv_attention_f32 over
 * contiguous f32 K/V. The reference for cached decoding (`kvcache verify`):
 * by causality, row t of one pass over n tokens is what a full recomputation
 * of tokens[0..t] gives, so one pass checks every step of a decode at once.
 * logits: rows first .. n-1, [n - first][V]. Allocates its n-row scratch per
 * call (it is not a hot path); uses the context's threads, not its cache. */
int llm_forward_dense(llm_context *c, const int32_t *tokens, int32_t n, int32_t first, float *logits);

#endif
