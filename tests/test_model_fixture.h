/* tests/test_model_fixture.h - tiny random-weight Llama and Gemma 3 models
 * written as GGUF files by the tests themselves, and an independent float64
 * forward pass over the same weights to check the engine against.
 *
 * The fixture quantizes each matrix with the test-side GGUF writer, writes
 * those exact bytes into the file, and decodes them again with its own
 * decoder (written from the block format definitions, sharing no code with
 * engine/weights/quant.c), so the reference sees exactly the weights the engine
 * reads. The reference forward is the textbook computation, one position at a
 * time, in double, with explicit softmax attention over all earlier
 * positions: no cache, no paging, no online softmax.
 *
 * Gemma 3 (arch "gemma3"), as its published descriptions (HF transformers'
 * Gemma3 model, llama.cpp's graph) define it, per token:
 *
 *     x = token_embd[token] * sqrt(D)
 *     for each layer l (a window layer when l % 6 < 5, else global):
 *         h = rmsnorm(x) * attn_norm
 *         q, k, v = h Wq, h Wk, h Wv
 *         q, k: per-head rmsnorm * attn_q_norm / attn_k_norm, then RoPE split-half
 *               (pairs i, i + d/2) with base 10000 (window) or rope.freq_base (global)
 *         att = softmax(q k^T / sqrt(d)) v over keys j <= t, and j > t - W on window layers
 *         x += rmsnorm(att Wo) * post_attention_norm
 *         h = rmsnorm(x) * ffn_norm
 *         x += rmsnorm((gelu_tanh(h Wgate) * (h Wup)) Wdown) * post_ffw_norm
 *     logits = (rmsnorm(x) * output_norm) token_embd^T
 *
 * norm weights used as stored (the GGUF converter has added Gemma's +1).
 *
 * Qwen2 (arch "qwen2") is the Llama forward with q, k, v = h Wq + bq, h Wk +
 * bk, h Wv + bv; Qwen3 ("qwen3") the Llama forward with q and k normed per
 * head (rmsnorm * attn_q_norm / attn_k_norm, weights [d]) before RoPE, and d
 * = key_length free of D / H. Both rotate split-half (pairs i, i + d/2), as
 * Gemma does, where GGUF llama rotates adjacent pairs. A llama file with
 * `window` set (Mistral) attends within it on every layer.
 *
 * Phi-3 (arch "phi3") is the Llama forward with split-half RoPE, written
 * with q, k, v fused into attn_qkv (their rows in that order) and gate, up
 * into ffn_up (2F rows, gate first); a window key it carries is not applied. */
#ifndef TEST_MODEL_FIXTURE_H
#define TEST_MODEL_FIXTURE_H

#include <stdint.h>

#include "../engine/model/model.h"

/* What to build. Zero fields take the defaults noted. */
typedef struct {
    int type;                 /* weight type of every matrix (GW_*), token_embd included */
    int32_t dim;              /* D (default 256: whole K-quant super-blocks) */
    int32_t layers;           /* default 2 */
    int32_t heads;            /* H (default 4) */
    int32_t kv_heads;         /* Hkv (default 2; gemma3 1) */
    int32_t ffn;              /* F (default 512) */
    int32_t rot_dim;          /* rotated dims per head (default head_dim) */
    double theta;             /* RoPE base (default 10000) */
    int tied;                 /* 1: no output.weight, logits use token_embd */
    int rope_freqs;           /* 1: write a rope_freqs.weight tensor of frequency divisors */
    uint64_t seed;            /* weights' random seed */
    /* gemma3 (arch "gemma3": theta defaults to 1e6 for the global layers, layers to 6,
     * tied to 1 unless untied is set) */
    int32_t head_dim;         /* d written as attention.key_length (default D / H; gemma3 2D / H) */
    int32_t window;           /* attention.sliding_window (gemma3: default 8; llama: written
                               * when set, every layer's window, as Mistral's; -1 writes 0,
                               * "no window") */
    int untied;               /* write output.weight after all */
    int qkv_bias;             /* llama: 1 writes attn_q/k/v.bias (qwen2 always has them) */
    /* for the loader's error tests */
    const char *arch;         /* general.architecture (default "llama") */
    const char *skip_tensor;  /* leave this tensor out */
    const char *bad_tensor;   /* write this tensor with one more row (a vector: element) than it should have */
    int extra_tokens;         /* tokens in the vocabulary beyond token_embd's rows */
    const char *nan_norm;     /* write this norm vector with a NaN as its first element */
    const char *extra_tensor; /* write a vector of 4 floats by this name as well */
} fx_spec;

/* One layer's decoded weights, row-major [out][in]. */
typedef struct {
    double *attn_norm;        /* [D] */
    double *wq;               /* [H*d][D] */
    double *wk;               /* [Hkv*d][D] */
    double *wv;               /* [Hkv*d][D] */
    double *wo;               /* [D][H*d] */
    double *ffn_norm;         /* [D] */
    double *wg;               /* [F][D] */
    double *wu;               /* [F][D] */
    double *wd;               /* [D][F] */
    /* gemma3 and qwen3 (NULL otherwise) */
    double *q_norm;           /* [d] */
    double *k_norm;           /* [d] */
    double *post_attn_norm;   /* [D] */
    double *post_ffn_norm;    /* [D] */
    /* qwen2 only (NULL otherwise) */
    double *bq;               /* [H*d] */
    double *bk;               /* [Hkv*d] */
    double *bv;               /* [Hkv*d] */
} fx_layer;

typedef struct {
    fx_spec s;                /* with defaults filled in */
    int32_t vocab;            /* V */
    int32_t head_dim;         /* d = D / H, or the spec's head_dim */
    int gemma;                /* 1: arch "gemma3" (forward above) */
    int qwen;                 /* 2: arch "qwen2", 3: "qwen3" (below); 0: neither */
    int phi;                  /* 1: arch "phi3" (below) */
    double eps;               /* RMSNorm epsilon written in the file */
    double *embd;             /* [V][D] */
    double *out;              /* [V][D] (= embd when tied) */
    double *out_norm;         /* [D] */
    double *inv_freq;         /* [rot_dim / 2] RoPE angle per position of pair i (gemma3: global) */
    double *inv_freq_local;   /* [d / 2] gemma3: of the window layers (base 10000) */
    fx_layer *L;              /* [layers] */
    char path[256];           /* the GGUF file, removed by fx_free */
} fx_model;

/* Token ids of the fixture's vocabulary: 0 "<|endoftext|>", 1 "<|im_start|>"
 * (bos), 2 "<|im_end|>" (eos), then the 256 byte tokens (byte b is id
 * FX_BYTE0 + b), then the merges "Ġt" and "he". gemma3 (SentencePiece, no
 * chat template): 0 "<pad>", 1 "<eos>", 2 "<bos>", the 256 "<0xNN>" byte
 * tokens, then "<start_of_turn>" and "<end_of_turn>". */
enum { FX_BYTE0 = 3, FX_VOCAB = 261, FX_START_OF_TURN = 259, FX_END_OF_TURN = 260 };

/* Writes the file and decodes its weights; 0 on success. */
int fx_build(const fx_spec *spec, fx_model *m);
void fx_free(fx_model *m);

/* The fixture's file loaded, or NULL with the test failed. */
llm_model *fx_load(const fx_model *m);
/* A context on model with params p, or NULL with the test failed. */
llm_context *fx_context(const llm_model *model, const llm_context_params *p);

/* Layer 0's K (RoPE applied at pos) and V of token, [Hkv*d] each, in
 * float64: what a cache's first layer holds for it there (gemma3: layer 0 is
 * a window layer). */
void fx_layer0_kv(const fx_model *m, int32_t token, int32_t pos, double *k, double *v);
/* logits [n][V] of every position of tokens [n], in float64. */
void fx_reference(const fx_model *m, const int32_t *tokens, int32_t n, double *logits);

/* Builds spec's file and checks that loading it fails with LLM_ERR_MODEL and
 * an error message containing expect. */
void fx_check_load_error(const fx_spec *spec, const char *expect);

/* A context shift for fx_reference_shifted: once `after` tokens have been
 * processed, the positions [n_keep, n_keep + n_discard) are forgotten and
 * the later ones renumbered. */
typedef struct {
    int32_t after, n_keep, n_discard;
} fx_shift;

/* logits [n][V] of every token, run one at a time with the shifts applied:
 * each token attends over the positions visible when it is processed, every
 * key rotated at its current position. */
void fx_reference_shifted(const fx_model *m, const int32_t *tokens, int32_t n, const fx_shift *shifts,
                          int32_t n_shifts, double *logits);

/* Every position's logits of tokens [n], from one new sequence of a context
 * of params p for each n_batch of batches [nb], against fx_reference: the
 * test fails where the largest difference passes tol of the largest logit.
 * Prints each relative difference after `what`. */
void fx_check_prefill(const fx_model *fx, const llm_model *m, const llm_context_params *p, const int32_t *tokens,
                      int32_t n, const int32_t *batches, int nb, double tol, const char *what);

/* The last position's logits of tokens [n] in contexts of params p with 1,
 * 2 and 3 threads: the test fails unless they are bit-identical. */
void fx_check_threads(const llm_model *m, const llm_context_params *p, const int32_t *tokens, int32_t n);

/* max |a - b| over n, and max |b| into *bmax */
double fx_max_diff(const float *a, const double *b, int64_t n, double *bmax);

#endif
