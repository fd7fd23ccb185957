/* engine/quant.h - weight block formats: sizes, dequantization, dot products
 * and a row-range matrix product over weights stored in GGUF's (ggml's) formats.
 *
 * A tensor row of n elements is stored as n / B consecutive blocks of B
 * elements each; every block carries its own scale(s), so a row can be decoded
 * on its own. Type numbers are ggml's, as written in GGUF tensor infos.
 *
 *   type   B    bytes  one block decodes as
 *   F32    1    4      the float
 *   F16    1    2      IEEE half
 *   BF16   1    2      upper 16 bits of a float
 *   Q4_0   32   18     x[i] = d * (q[i] - 8),   q in 0..15
 *   Q4_1   32   20     x[i] = d * q[i] + m,     q in 0..15
 *   Q5_0   32   22     x[i] = d * (q[i] - 16),  q in 0..31 (4 low bits + 1 high bit)
 *   Q8_0   32   34     x[i] = d * q[i],         q in -128..127
 *   Q4_K   256  144    8 sub-blocks of 32: x = d*sc[s]*q - dmin*mn[s], 6-bit sc, mn
 *   Q5_K   256  176    as Q4_K with a fifth bit per quant (q in 0..31)
 *   Q6_K   256  210    16 sub-blocks of 16: x = d * sc[s] * (q - 32), int8 sc, q in 0..63
 *
 * Nibble order in the 4-bit formats: byte j of a 32-element group holds
 * element j in its low nibble and element j+16 (j+32 for K-quants, whose
 * groups are 64 wide) in its high nibble. All scales d, m, dmin are IEEE
 * halves. Data is little-endian; the code reads fields with memcpy so blocks
 * need no alignment.
 *
 * Speed: for m > 1 llm_matmul_rows decodes a chunk of 4 weight rows into an
 * L1-resident float buffer once and multiplies it against tiles of 4 X rows
 * (16 accumulators), over blocks of 64 X rows kept in L2, so each decoded
 * weight feeds 64 X rows. For m == 1 (decode) Q4_0/Q4_1/Q5_0/Q8_0 rows are decoded
 * in registers, 8 rows sharing each x vector. Kernels use 256-bit vectors
 * (AVX2+FMA+F16C; 32 registers with AVX-512VL): on the Zen 4 host they were
 * tuned on, 512-bit FMAs gave ~0.6x the FLOP/s of 256-bit ones. Build with
 * -DLLM_QUANT_ZMM for 512-bit kernels (hosts with two 512-bit FMA units).
 * Activations stay f32 (no 8-bit quantization of X), so the only error is f32
 * rounding of the sums. Each (row, X row) result is computed by the same
 * sequence of operations whatever the row range, m or tile it falls in, so
 * splitting rows over threads, or prefill against decode, changes no bit. */
#ifndef LLM_QUANT_H
#define LLM_QUANT_H

#include <stddef.h>
#include <stdint.h>

/* ggml type numbers of the formats this engine decodes. */
enum {
    LLM_TYPE_F32  = 0,
    LLM_TYPE_F16  = 1,
    LLM_TYPE_Q4_0 = 2,
    LLM_TYPE_Q4_1 = 3,
    LLM_TYPE_Q5_0 = 6,
    LLM_TYPE_Q8_0 = 8,
    LLM_TYPE_Q4_K = 12,
    LLM_TYPE_Q5_K = 13,
    LLM_TYPE_Q6_K = 14,
    LLM_TYPE_BF16 = 30,
};

#define LLM_QK   32   /* elements per block of Q4_0, Q4_1, Q5_0, Q8_0 */
#define LLM_QK_K 256  /* elements per super-block of the K-quants */

/* Block layouts, for documentation and sizeof; the code reads fields at
 * offsetof() through memcpy because blocks in a file may be unaligned. */
typedef struct {
    uint16_t d;                  /* scale, IEEE half */
    uint8_t  qs[LLM_QK / 2];     /* [16] element j: low nibble of qs[j]; j+16: high nibble */
} llm_block_q4_0;
typedef struct {
    uint16_t d;                  /* scale, IEEE half */
    uint16_t m;                  /* offset added to every element, IEEE half */
    uint8_t  qs[LLM_QK / 2];     /* [16] nibbles, order as Q4_0 */
} llm_block_q4_1;
typedef struct {
    uint16_t d;                  /* scale, IEEE half */
    uint8_t  qh[4];              /* 32 fifth bits, a little-endian u32: bit j for element j */
    uint8_t  qs[LLM_QK / 2];     /* [16] low 4 bits, order as Q4_0 */
} llm_block_q5_0;
typedef struct {
    uint16_t d;                  /* scale, IEEE half */
    int8_t   qs[LLM_QK];         /* [32] signed quants */
} llm_block_q8_0;
typedef struct {
    uint16_t d;                  /* super-scale of the 6-bit sub-block scales, IEEE half */
    uint16_t dmin;               /* super-scale of the 6-bit sub-block mins, IEEE half */
    uint8_t  scales[12];         /* 8 scales + 8 mins, 6 bits each (see llm_k_scale_min) */
    uint8_t  qs[LLM_QK_K / 2];   /* [128] 4 groups of 64: byte l of group g holds element
                                    64g+l (low nibble) and 64g+32+l (high nibble) */
} llm_block_q4_k;
typedef struct {
    uint16_t d;                  /* as Q4_K */
    uint16_t dmin;               /* as Q4_K */
    uint8_t  scales[12];         /* as Q4_K */
    uint8_t  qh[LLM_QK_K / 8];   /* [32] fifth bits: bit 2g of qh[l] for element 64g+l,
                                    bit 2g+1 for element 64g+32+l */
    uint8_t  qs[LLM_QK_K / 2];   /* [128] low 4 bits, order as Q4_K */
} llm_block_q5_k;
typedef struct {
    uint8_t  ql[LLM_QK_K / 2];   /* [128] low 4 bits; see quant.c for the element order */
    uint8_t  qh[LLM_QK_K / 4];   /* [64] high 2 bits, four elements per byte */
    int8_t   scales[LLM_QK_K / 16]; /* [16] one per 16 elements */
    uint16_t d;                  /* super-scale, IEEE half */
} llm_block_q6_k;

/* Name of any ggml type number ("Q4_1", "IQ2_XXS", ...), or NULL if unknown. */
const char *llm_type_name(int type);
/* 1 if this engine can decode the type, else 0. */
int llm_type_supported(int type);
/* Elements per block, or 0 if the type is not supported. */
int64_t llm_type_block_elems(int type);
/* Bytes per block, or 0 if the type is not supported. */
int64_t llm_type_block_bytes(int type);
/* Bytes of a row of n elements; -1 if the type is unsupported, n < 0, or n is
 * not a multiple of the block size. */
int64_t llm_row_bytes(int type, int64_t n);

/* dst[0..n) = decoded src row. Returns 0, or -1 (dst untouched) for an
 * unsupported type or n not a whole number of blocks. */
int llm_dequant_row(int type, const void *src, float *dst, int64_t n);

/* sum_k row[k] * x[k] over n elements (row in the block format, x f32).
 * NaN for an unsupported type or a bad n. */
float llm_vec_dot(int type, const void *row, const float *x, int64_t n);

/* Y[j*ldy + r] = dot(W row r, X row j) for r in [row0, row1), j in [0, m).
 *   W: [rows][n_in] in format `type`, each row llm_row_bytes(type, n_in) bytes
 *   X: [m][n_in] f32, row-major
 *   Y: [m][ldy] f32; only columns row0..row1-1 are written
 * Threads may call this at once on disjoint row ranges of the same Y; each
 * call uses about 33 KiB of stack for decoded rows and allocates nothing.
 * For an unsupported type or bad n_in the written entries are NaN. */
void llm_matmul_rows(int type, const void *W, int64_t n_in, int64_t row0, int64_t row1,
                     const float *X, int64_t m, float *Y, int64_t ldy);

/* on != 0: use the plain C kernels even where SIMD ones are compiled in
 * (tests compare both). Process-wide; set it before starting threads. */
void llm_quant_force_scalar(int on);
/* "avx512" (-DLLM_QUANT_ZMM builds), "avx2" or "scalar": the kernels that run now. */
const char *llm_quant_kernels(void);

/* Quantize n floats (n a multiple of 32) to Q8_0 blocks: d = max|x| / 127
 * rounded to half, q = round(x / d). Error per element <= d/2 (plus the
 * half rounding of d, which q absorbs). Returns 0, or -1 for a bad n. */
int llm_quantize_row_q8_0(const float *src, void *dst, int64_t n);

/* Scalar conversions (round to nearest even; NaN and infinities kept). */
float    llm_f16_to_f32(uint16_t h);
uint16_t llm_f32_to_f16(float f);
float    llm_bf16_to_f32(uint16_t h);
uint16_t llm_f32_to_bf16(float f);

/* The 6-bit scale and min of sub-block s (0..7) of a Q4_K/Q5_K block. */
void llm_k_scale_min(const uint8_t scales[12], int s, uint8_t *sc, uint8_t *mn);

/* ---- internal: shared by quant.c and quant_avx2.c, not for callers ---- */
/* Decode n elements (whole blocks) with SIMD; 0 if done, -1 if this type or
 * build has no SIMD decoder (the caller then uses the scalar one). */
int llm_simd_dequant(int type, const void *src, float *dst, int64_t n);
/* out[r*nt + t] = sum_k w[r][k] * x[t][k] for r < nr, t < nt over n floats.
 * Shapes (nr, nt) are (8, 1), (4, 4) or (1, 1); any other shape is computed
 * one (1, 1) pair at a time. */
void llm_simd_dot_tile(const float *const *w, int nr, const float *const *x, int nt,
                       int64_t n, float *out);
/* Decode-and-dot without the float buffer for nr (8 or 1) rows of a
 * Q4_0/Q4_1/Q5_0/Q8_0 chunk: out[r] = dot(w[r][0..n), x). Bit-identical to
 * llm_simd_dequant + llm_simd_dot_tile; -1 where not compiled in. */
int llm_simd_fused_dot(int type, const uint8_t *const *w, int nr, const float *x, int64_t n, float *out);
/* 2 for the 512-bit kernels, 1 for the 256-bit ones, 0 if none were compiled in. */
int llm_simd_level(void);

#endif
