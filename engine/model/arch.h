/* engine/model/arch.h - inside the engine: the model and context structs, the
 * per-layer hyperparameters, and the table of architectures. For the engine sources
 * (and tests that inspect a loaded model), not for programs, which read a
 * model through engine/model/model.h.
 *
 * An architecture is one file (engine/arch_NAME.c) holding an llm_arch: how
 * to read its hyperparameters, how to find its tensors, and its forward pass
 * composed from engine/model/layers.h. At load it declares
 *
 *   - per layer (m->lhp[l]): which cache group holds its K/V and at which
 *     layer index, its sliding window, its RoPE table, its softmax scale;
 *   - the groups (m->groups): layers sharing a window share one kv_cache, and
 *     the context makes one cache per group (reserved together, all or
 *     nothing);
 *   - up to LLM_MAX_ROPES RoPE tables (e.g. one base for local layers, one
 *     for global ones).
 *
 * Llama, Qwen2, Qwen3, Phi-3: one group of every layer (a window group when the
 * file declares a sliding window, as Mistral's do), one RoPE table. Gemma 3:
 * a full group of the global layers and a window group of the others, two
 * RoPE tables (base 1e6 and 10000).
 *
 * An architecture's per-layer tensors are a table (llm_tensor_desc): name,
 * shape in terms of the hyperparameters, required or optional, and the
 * llm_layer_weights field it fills; llm_load_layers checks and maps them. */
#ifndef LLM_ARCH_H
#define LLM_ARCH_H

#include <stddef.h>

#include "model.h"

enum {
    LLM_MAX_GROUPS = 4,  /* caches per context */
    LLM_MAX_ROPES = 2,   /* RoPE tables per model */
};

/* A weight matrix in the mapping: rows x cols, each row one block-format row. */
typedef struct {
    int type;                /* LLM_TYPE_* (engine/weights/quant.h) */
    const void *data;        /* [rows] rows of llm_row_bytes(type, cols) bytes */
    const void *packed;      /* the rows in groups of 8 (llm_pack_rows) in m->packed, or NULL */
    int64_t rows;            /* outputs */
    int64_t cols;            /* inputs: the contiguous dimension, GGUF dims[0] */
} llm_matrix;

/* One layer's weights. An architecture fills what it has; the rest stays
 * NULL / zero. */
typedef struct {
    const float *attn_norm;      /* [D] */
    llm_matrix wq;               /* [H*d][D] */
    llm_matrix wk;               /* [Hkv*d][D] */
    llm_matrix wv;               /* [Hkv*d][D] */
    const float *bq;             /* [H*d] bias added to q (Qwen2), or NULL */
    const float *bk;             /* [Hkv*d] bias added to k, or NULL */
    const float *bv;             /* [Hkv*d] bias added to v, or NULL */
    llm_matrix wo;               /* [D][H*d] */
    const float *ffn_norm;       /* [D] */
    llm_matrix w_gate;           /* [F][D] */
    llm_matrix w_up;             /* [F][D] */
    llm_matrix w_down;           /* [D][F] */
    const float *attn_q_norm;    /* [d] per-head RMSNorm of q before RoPE (Gemma 3, Qwen3), or NULL */
    const float *attn_k_norm;    /* [d] per-head RMSNorm of k, or NULL */
    const float *post_attn_norm; /* [D] norm of the attention output before the residual, or NULL */
    const float *post_ffn_norm;  /* [D] norm of the FFN output before the residual, or NULL */
} llm_layer_weights;

/* What may differ from layer to layer. */
typedef struct {
    int32_t group;           /* the cache holding this layer's K/V: [0, n_groups) */
    int32_t group_layer;     /* its layer index inside that cache */
    int32_t window;          /* sliding window W (0: full causal); = its group's window */
    int32_t rope;            /* which of m->ropes rotates its q and k: [0, n_ropes) */
    float attn_scale;        /* softmax scale; 0: 1/sqrt(d) */
} llm_layer_hparams;

/* Layers that share one cache. */
typedef struct {
    int32_t n_layers;        /* layers in the group (their group_layer is 0..n_layers-1) */
    int32_t window;          /* W of every layer of the group; 0: full attention */
} llm_cache_group;

struct llm_arch;

struct llm_model {
    const struct llm_arch *arch; /* from general.architecture */
    llm_gguf *gguf;              /* the file; every llm_matrix points into it */
    llm_hparams hp;
    llm_layer_hparams *lhp;      /* [L] */
    int32_t n_groups;            /* caches a context makes */
    llm_cache_group groups[LLM_MAX_GROUPS];
    int32_t n_ropes;
    kv_rope ropes[LLM_MAX_ROPES]; /* frequencies (with rope_freqs.weight applied if present) */
    llm_matrix tok_embd;         /* [V][D] */
    const float *output_norm;    /* [D] */
    llm_matrix output;           /* [V][D]; a copy of tok_embd when the file ties them */
    int tied_output;             /* 1 when the file has no output.weight */
    llm_layer_weights *layers;   /* [L] */
    float *norms;                /* every decoded norm vector, one allocation (the arch's layout) */
    void *packed;                /* every llm_matrix.packed, one allocation; NULL if none */
    uint64_t packed_bytes;       /* its size */
    const struct llm_tensor_desc *table; /* the per-layer tensor table llm_load_layers read */
    int n_table;
    int rope_freqs_used;         /* 1 when llm_load_rope applied rope_freqs.weight */
    llm_tokenizer *tok;          /* from tokenizer.ggml.* */
    llm_chat_format chat;        /* kind LLM_CHAT_UNKNOWN when no format was recognised */
    uint64_t weight_bytes;       /* bytes of every tensor in the file */
    char name[128];              /* general.name, or the file name */
};

/* Activations of one pass, `rows` rows each. */
typedef struct {
    int32_t rows;
    float *x;           /* [rows][D] residual stream */
    float *h;           /* [rows][D] normed input of a block; block output */
    float *q;           /* [rows][H*d] queries, rotated */
    float *k;           /* [rows][Hkv*d] keys, rotated */
    float *v;           /* [rows][Hkv*d] values */
    float *att;         /* [rows][H*d] attention output */
    float *gate;        /* [rows][F] gate projection, then act(gate) * up */
    float *up;          /* [rows][F] up projection */
    int32_t *pos;       /* [rows] absolute position of each row */
    int32_t *out_rows;  /* [rows] rows whose logits are wanted, ascending */
    void *qa;           /* llm_act work areas of one product job: LLM_MM_INPUTS x qa_bytes */
    size_t qa_bytes;    /* llm_act_bytes(rows, widest product input) */
} llm_scratch;

struct llm_context {
    const llm_model *m;     /* borrowed; outlives the context */
    llm_context_params p;   /* n_ctx resolved */
    int32_t n_caches;       /* = m->n_groups */
    kv_cache *caches[LLM_MAX_GROUPS]; /* one per group, n_seqs sequences of up to n_ctx positions */
    int32_t order[LLM_MAX_GROUPS];    /* reserve order: full caches first, window caches last */
    kv_pool *pool;          /* n_threads - 1 workers; also runs the caches' attention */
    llm_scratch ws;         /* n_batch rows */
    uint8_t *want_rows;     /* [2 n_batch]: n_batch zeros, then n_batch ones; from offset
                             * n_batch - k, "every row's logits but the first k" */
};

/* One forward pass, as an architecture's forward receives it. */
typedef struct {
    llm_context *c;
    llm_scratch *ws;         /* rows 0..rows-1; pos and out_rows set */
    int32_t rows;
    const int32_t *tokens;   /* [rows] ids, checked against V */
    const kv_batch *kb;      /* the batch, the same in every cache (reserved); NULL: no cache,
                              * the rows are one sequence attending densely among themselves */
    int32_t n_out;           /* rows of logits wanted (ws->out_rows[0..n_out)) */
    float *logits;           /* [n_out][V], or NULL: none */
} llm_pass;

typedef struct llm_arch {
    const char *name;        /* general.architecture */
    /* Model-wide hyperparameters from the <name>.* keys. LLM_OK or LLM_ERR_MODEL. */
    int (*read_hparams)(const llm_gguf *g, llm_hparams *hp, char *err, size_t errlen);
    /* Everything else the forward needs, with m->hp, m->tok_embd and
     * m->output (or tied) already set: layers, norms, m->lhp, m->groups,
     * m->ropes. LLM_OK or LLM_ERR_MODEL / LLM_ERR_NOMEM. */
    int (*load)(llm_model *m, char *err, size_t errlen);
    /* Every layer over ps->rows, then the logits. An llm_status. */
    int (*forward)(const llm_pass *ps);
} llm_arch;

extern const llm_arch llm_arch_llama;   /* engine/model/arch_llama.c */
extern const llm_arch llm_arch_gemma3;  /* engine/model/arch_gemma3.c */
extern const llm_arch llm_arch_qwen2;   /* engine/model/arch_qwen.c */
extern const llm_arch llm_arch_qwen3;   /* engine/model/arch_qwen.c */
extern const llm_arch llm_arch_phi3;    /* engine/model/arch_phi3.c */

/* The pre-norm SwiGLU decoder of engine/model/arch_llama.c, which Qwen2 and Qwen3
 * share: it adds q/k/v biases and applies the per-head q/k norms when the
 * layer has them (llm_layer_weights fields non-NULL). */
int llm_llama_forward(const llm_pass *ps);

/* The architecture named name[0..len), or NULL. */
const llm_arch *llm_arch_find(const char *name, size_t len);
/* "llama, ..." : the names, for error messages. */
const char *llm_arch_names(void);

/* The sliding window layer l attends with in context c: its own, or the
 * context's override (llm_context_params.window) when it has none. */
int32_t llm_layer_window(const llm_context *c, int32_t l);

/* ---- loading helpers for architecture files (engine/model/model.c) */

/* <prefix>.block_count, embedding_length, feed_forward_length, head_count,
 * head_count_kv, context_length, key_length/value_length, the RMS epsilon,
 * rope.freq_base/dimension_count (layout left as the default NEOX) and the
 * vocabulary size. */
int llm_read_common_hparams(const llm_gguf *g, const char *prefix, llm_hparams *hp, char *err, size_t errlen);
/* A required count in [lo, hi]; an optional one (keeps *out when absent). */
int llm_read_count(const llm_gguf *g, const char *key, int32_t lo, int32_t hi, int32_t *out, char *err,
                   size_t errlen);
int llm_read_opt_count(const llm_gguf *g, const char *key, int32_t lo, int32_t hi, int32_t *out, char *err,
                       size_t errlen);
/* The tensor `name` as a rows x cols matrix (GGUF dims {cols, rows}). */
int llm_load_matrix(const llm_gguf *g, const char *name, int64_t rows, int64_t cols, llm_matrix *out,
                    char *err, size_t errlen);
/* The vector `name` of n elements, decoded to f32 into dst. */
int llm_load_vector(const llm_gguf *g, const char *name, int64_t n, float *dst, char *err, size_t errlen);
/* m->ropes[i] from params, with rope_freqs.weight divisors applied when the
 * file has that tensor and use_freqs is set. */
int llm_load_rope(llm_model *m, int32_t i, const kv_rope_params *params, int use_freqs, char *err,
                  size_t errlen);
/* Every layer in one group with RoPE table 0, attending within `window`
 * positions (0: fully): what an architecture without per-layer differences
 * declares. NOMEM or OK. */
int llm_layers_one_group(llm_model *m, int32_t window);

/* ---- the declarative per-layer tensor table */

/* A size in a tensor table, in terms of m->hp. */
typedef enum {
    LLM_SZ_NONE,   /* no second dimension: the tensor is a vector */
    LLM_SZ_D,      /* dim */
    LLM_SZ_HEAD,   /* head_dim */
    LLM_SZ_Q,      /* n_heads * head_dim */
    LLM_SZ_KV,     /* n_kv_heads * head_dim */
    LLM_SZ_F,      /* ffn_dim */
    LLM_SZ_QKV,    /* (n_heads + 2 n_kv_heads) * head_dim: q, k and v fused (Phi-3) */
    LLM_SZ_2F,     /* 2 ffn_dim: gate and up fused (Phi-3) */
} llm_size;

/* One tensor of every layer: blk.<l>.<suffix>. A matrix (cols != LLM_SZ_NONE)
 * is mapped into the llm_matrix at `field`; a vector is decoded to f32 into
 * m->norms and the const float * at `field` points at it. An optional tensor
 * the file lacks leaves its field NULL / zero. */
typedef struct llm_tensor_desc {
    const char *suffix;      /* e.g. "attn_q.weight", "attn_q.bias" */
    size_t field;            /* offsetof(llm_layer_weights, ...) */
    llm_size rows;           /* matrix rows (outputs), or the vector's length */
    llm_size cols;           /* matrix cols (inputs, GGUF dims[0]); LLM_SZ_NONE for a vector */
    int optional;            /* 1: may be absent */
} llm_tensor_desc;

/* Splits a matrix loaded fused at its row `at`: *whole keeps rows [0, at),
 * *rest gets the others (zero-copy views of the same block rows). */
void llm_matrix_split(llm_matrix *whole, int64_t at, llm_matrix *rest);

/* A table entry for field of llm_layer_weights. */
#define LLM_TENSOR(suffix, field, rows, cols, optional) \
    {suffix, offsetof(llm_layer_weights, field), rows, cols, optional}
/* The Llama block's tensors, which Qwen2 and Qwen3 extend. */
#define LLM_LLAMA_TENSORS                                            \
    LLM_TENSOR("attn_norm.weight", attn_norm, LLM_SZ_D, LLM_SZ_NONE, 0), \
    LLM_TENSOR("attn_q.weight", wq, LLM_SZ_Q, LLM_SZ_D, 0),              \
    LLM_TENSOR("attn_k.weight", wk, LLM_SZ_KV, LLM_SZ_D, 0),             \
    LLM_TENSOR("attn_v.weight", wv, LLM_SZ_KV, LLM_SZ_D, 0),             \
    LLM_TENSOR("attn_output.weight", wo, LLM_SZ_D, LLM_SZ_Q, 0),         \
    LLM_TENSOR("ffn_norm.weight", ffn_norm, LLM_SZ_D, LLM_SZ_NONE, 0),   \
    LLM_TENSOR("ffn_gate.weight", w_gate, LLM_SZ_F, LLM_SZ_D, 0),        \
    LLM_TENSOR("ffn_up.weight", w_up, LLM_SZ_F, LLM_SZ_D, 0),            \
    LLM_TENSOR("ffn_down.weight", w_down, LLM_SZ_D, LLM_SZ_F, 0)

/* m->layers and m->norms from the n entries of table for every layer, then
 * output_norm.weight [D] into m->output_norm. A missing required tensor or
 * a misshapen one is refused with its name (and both shapes). OK, MODEL or NOMEM. */
int llm_load_layers(llm_model *m, const llm_tensor_desc *table, int n, char *err, size_t errlen);

/* After an architecture's load: every tensor of the file is one it read
 * (token_embd, output, output_norm, rope_freqs where applied, blk.<l>.<a
 * suffix of its table> for l < L), or one known to carry nothing the
 * forward needs (blk.<l>.attn_rot_embd.weight: RoPE frequencies older
 * converters stored, which the RoPE table recomputes). Anything else
 * would be weights silently left out: refused, naming the tensor. */
int llm_check_tensors(const llm_model *m, char *err, size_t errlen);

#endif
