/* tests/test_model_fixture.h - tiny random-weight Llama models written as GGUF
 * files by the tests themselves, and an independent float64 forward pass over
 * the same weights to check the engine against.
 *
 * The fixture quantizes each matrix with the test-side GGUF writer, writes
 * those exact bytes into the file, and decodes them again with its own
 * decoder (written from the block format definitions, sharing no code with
 * engine/quant.c), so the reference sees exactly the weights the engine
 * reads. The reference forward is the textbook computation, one position at a
 * time, in double, with explicit softmax attention over all earlier
 * positions: no cache, no paging, no online softmax. */
#ifndef TEST_MODEL_FIXTURE_H
#define TEST_MODEL_FIXTURE_H

#include <stdint.h>

/* What to build. Zero fields take the defaults noted. */
typedef struct {
    int type;                 /* weight type of every matrix (GW_*), token_embd included */
    int32_t dim;              /* D (default 256: whole K-quant super-blocks) */
    int32_t layers;           /* default 2 */
    int32_t heads;            /* H (default 4) */
    int32_t kv_heads;         /* Hkv (default 2) */
    int32_t ffn;              /* F (default 512) */
    int32_t rot_dim;          /* rotated dims per head (default head_dim) */
    double theta;             /* RoPE base (default 10000) */
    int tied;                 /* 1: no output.weight, logits use token_embd */
    int rope_freqs;           /* 1: write a rope_freqs.weight tensor of frequency divisors */
    uint64_t seed;            /* weights' random seed */
    /* for the loader's error tests */
    const char *arch;         /* general.architecture (default "llama") */
    const char *skip_tensor;  /* leave this tensor out */
    const char *bad_tensor;   /* write this tensor with one more row than it should have */
    int extra_tokens;         /* tokens in the vocabulary beyond token_embd's rows */
    const char *nan_norm;     /* write this norm vector with a NaN as its first element */
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
} fx_layer;

typedef struct {
    fx_spec s;                /* with defaults filled in */
    int32_t vocab;            /* V */
    int32_t head_dim;         /* d = D / H */
    double *embd;             /* [V][D] */
    double *out;              /* [V][D] (= embd when tied) */
    double *out_norm;         /* [D] */
    double *inv_freq;         /* [rot_dim / 2] RoPE angle per position of pair i */
    fx_layer *L;              /* [layers] */
    char path[256];           /* the GGUF file, removed by fx_free */
} fx_model;

/* Token ids of the fixture's vocabulary: 0 "<|endoftext|>", 1 "<|im_start|>"
 * (bos), 2 "<|im_end|>" (eos), then the 256 byte tokens (byte b is id
 * FX_BYTE0 + b), then the merges "Ġt" and "he". */
enum { FX_BYTE0 = 3, FX_VOCAB = 261 };

/* Writes the file and decodes its weights; 0 on success. */
int fx_build(const fx_spec *spec, fx_model *m);
void fx_free(fx_model *m);

/* logits [n][V] of every position of tokens [n], in float64. */
void fx_reference(const fx_model *m, const int32_t *tokens, int32_t n, double *logits);

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

/* max |a - b| over n, and max |b| into *bmax */
double fx_max_diff(const float *a, const double *b, int64_t n, double *bmax);

#endif
