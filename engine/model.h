/* engine/model.h - a Llama-family model from a GGUF file, run on the paged KV
 * cache of libkvcache.
 *
 * The model (llama.cpp's `llama` architecture: Llama 1-3, TinyLlama, SmolLM2,
 * Mistral without sliding windows) is, per token,
 *
 *     x = token_embd[token]
 *     for each layer:
 *         h = rmsnorm(x) * attn_norm
 *         q, k, v = h Wq, h Wk, h Wv          RoPE on q and k at absolute positions
 *         x += attention(q, cached K, cached V) Wo      (GQA: H query heads over Hkv)
 *         h = rmsnorm(x) * ffn_norm
 *         x += (silu(h Wgate) * (h Wup)) Wdown         (SwiGLU)
 *     logits = (rmsnorm(x) * output_norm) Wout         (Wout = token_embd when tied)
 *
 * RoPE layout: the GGUF converter permutes the rows of HF's Wq and Wk so that
 * the two halves a Hugging Face checkpoint rotates together (i, i + d/2)
 * become adjacent (2i, 2i + 1); llama.cpp then rotates adjacent pairs
 * ("normal" mode) for this architecture. So a GGUF llama model takes
 * KV_ROPE_INTERLEAVED, not the split-half layout its HF original uses.
 *
 * Weights stay in the file mapping in their block format; only the small
 * norm vectors are decoded to f32 at load. An llm_model is immutable once
 * loaded: any number of contexts (and threads) may share it.
 *
 * A context owns what running needs: the KV cache (pages for n_seqs
 * sequences of up to n_ctx positions), a thread pool, and scratch for n_batch
 * rows, all allocated once at creation. Calls on one context are serialized by
 * the caller. Errors are kv_status codes or LLM_ERR_TOKEN; llm_status_str
 * names them. A failed forward leaves every sequence as it was. */
#ifndef LLM_MODEL_H
#define LLM_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kvcache.h"
#include "chat.h"
#include "gguf.h"
#include "tokenizer.h"

/* A token id outside [0, n_vocab) in a batch (the library's codes are -1..-15). */
#define LLM_ERR_TOKEN (-100)

/* kv_status_str, plus the engine's own codes. */
const char *llm_status_str(int status);

/* ---------------------------------------------------------------- the model */

typedef struct {
    int32_t n_vocab;         /* V: tokens in the vocabulary (= rows of token_embd) */
    int32_t dim;             /* D: llama.embedding_length */
    int32_t n_layers;        /* L: llama.block_count */
    int32_t n_heads;         /* H: llama.attention.head_count */
    int32_t n_kv_heads;      /* Hkv: llama.attention.head_count_kv (H when absent) */
    int32_t head_dim;        /* d: D / H, or llama.attention.key_length */
    int32_t ffn_dim;         /* F: llama.feed_forward_length */
    int32_t ctx_train;       /* llama.context_length: the context it was trained for */
    float norm_eps;          /* llama.attention.layer_norm_rms_epsilon */
    kv_rope_params rope;     /* theta (rope.freq_base), rot_dim (rope.dimension_count), layout */
} llm_hparams;

/* A weight matrix in the mapping: rows x cols, each row one block-format row. */
typedef struct {
    int type;                /* LLM_TYPE_* (engine/quant.h) */
    const void *data;        /* [rows] rows of llm_row_bytes(type, cols) bytes */
    int64_t rows;            /* outputs */
    int64_t cols;            /* inputs: the contiguous dimension, GGUF dims[0] */
} llm_matrix;

typedef struct {
    const float *attn_norm;  /* [D] */
    llm_matrix wq;           /* [H*d][D] */
    llm_matrix wk;           /* [Hkv*d][D] */
    llm_matrix wv;           /* [Hkv*d][D] */
    llm_matrix wo;           /* [D][H*d] */
    const float *ffn_norm;   /* [D] */
    llm_matrix w_gate;       /* [F][D] */
    llm_matrix w_up;         /* [F][D] */
    llm_matrix w_down;       /* [D][F] */
} llm_layer_weights;

typedef struct llm_model {
    llm_gguf *gguf;              /* the file; every llm_matrix points into it */
    llm_hparams hp;
    llm_matrix tok_embd;         /* [V][D] */
    const float *output_norm;    /* [D] */
    llm_matrix output;           /* [V][D]; a copy of tok_embd when the file ties them */
    int tied_output;             /* 1 when the file has no output.weight */
    llm_layer_weights *layers;   /* [L] */
    float *norms;                /* [(2L + 1) * D] the decoded norm vectors, one allocation */
    kv_rope rope;                /* frequencies of hp.rope (and rope_freqs.weight if present) */
    llm_tokenizer *tok;          /* from tokenizer.ggml.* */
    llm_chat_format chat;        /* kind LLM_CHAT_UNKNOWN when no format was recognised */
    uint64_t weight_bytes;       /* bytes of every tensor in the file */
    char name[128];              /* general.name, or the file name */
} llm_model;

/* Maps the file and checks everything a forward pass relies on: the
 * architecture, every hyperparameter, every tensor's presence, type and shape.
 * Returns 0, or -1 with one line in err saying what is wrong. */
int llm_model_load(const char *path, llm_model **out, char *err, size_t errlen);
/* The same over a file already opened (e.g. by llm_gguf_open_memory), which
 * the model takes over: closed by llm_model_free, or at once on failure.
 * name: used when the file has no general.name (NULL: "model"). */
int llm_model_from_gguf(llm_gguf *g, const char *name, llm_model **out, char *err, size_t errlen);
void llm_model_free(llm_model *m);

/* Reads only the hyperparameters (no tensors, no tokenizer): for `price` and
 * `info`. 0, or -1 with a message. */
int llm_hparams_read(const llm_gguf *g, llm_hparams *hp, char *err, size_t errlen);

/* ---------------------------------------------------------------- contexts */

typedef struct {
    int32_t n_ctx;       /* positions one sequence may hold; 0: min(ctx_train, 4096) */
    int32_t n_seqs;      /* sequences that may live at once */
    int32_t n_batch;     /* rows one llm_forward call may take (prompt chunk size) */
    int32_t n_threads;   /* threads for matrix products and attention (1: no workers) */
    kv_dtype kv_type;    /* storage of cached K and V: KV_F32, KV_F16, KV_BF16, KV_Q8 */
    int32_t page_size;   /* positions per cache page */
    int32_t n_pages;     /* pages in the KV pool; 0: n_seqs x ceil(n_ctx / page_size), room for
                          * every sequence at full length (fewer: sequences share the pool) */
} llm_context_params;

/* n_ctx 0, n_seqs 1, n_batch 256, n_threads 1, KV_F16, page_size 16, n_pages 0. */
llm_context_params llm_context_default_params(void);

typedef struct llm_context llm_context;

int llm_context_create(const llm_model *m, const llm_context_params *p, llm_context **out,
                       char *err, size_t errlen);
void llm_context_free(llm_context *c);
const llm_model *llm_context_model(const llm_context *c);
llm_context_params llm_context_get_params(const llm_context *c); /* with n_ctx resolved */
kv_cache *llm_context_cache(llm_context *c);   /* for sequences: kv_seq_new, _remove, _truncate */

/* ---------------------------------------------------------------- running */

/* New tokens for several sequences at once (ragged, CSR as kv_batch):
 * sequence seqs[b] receives tokens[row_start[b] .. row_start[b+1]). */
typedef struct {
    int32_t n_seqs;
    const int32_t *seqs;        /* [n_seqs] ids from kv_seq_new */
    const int32_t *row_start;   /* [n_seqs + 1], row_start[0] = 0, non-decreasing */
    const int32_t *tokens;      /* [rows] */
    const uint8_t *want;        /* [rows] nonzero: return this row's logits; NULL: the last
                                 * row of each sequence with rows */
} llm_batch;

/* Appends the batch's tokens to their sequences and runs them through the
 * model as one matrix pass: rows = row_start[n_seqs] <= n_batch. logits
 * receives [n_wanted][V], wanted rows in batch order (NULL: none are
 * computed, e.g. to feed a token whose successor is already known). On error
 * no sequence changed. */
int llm_forward(llm_context *c, const llm_batch *b, float *logits);

/* Called during long evaluations: done of total tokens. */
typedef void (*llm_progress_fn)(void *user, int64_t done, int64_t total);

/* Appends tokens [n] to one sequence in chunks of n_batch rows. logits:
 * all = 0: the last token's [V]; all = 1: every token's [n][V]; NULL: none.
 * progress may be NULL. On error the sequence is truncated back to where it
 * was. */
int llm_eval(llm_context *c, int32_t seq, const int32_t *tokens, int32_t n, int all, float *logits,
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
