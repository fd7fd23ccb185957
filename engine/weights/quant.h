/* engine/weights/quant.h - weight block formats: sizes, dequantization, dot products
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
 *   Q5_1   32   24     x[i] = d * q[i] + m,     q in 0..31 (as Q5_0)
 *   Q8_0   32   34     x[i] = d * q[i],         q in -128..127
 *   Q2_K   256  84     16 sub-blocks of 16: x = d*sc[s]*q - dmin*mn[s], 4-bit sc, mn, q in 0..3
 *   Q3_K   256  110    16 sub-blocks of 16: x = d * (sc[s] - 32) * q, 6-bit sc, q in -4..3
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
 * (AVX2+FMA+F16C; 32 registers with AVX-512VL), faster than 512-bit ones
 * on CPUs without two 512-bit FMA units. Build with -DLLM_QUANT_ZMM for
 * 512-bit kernels (hosts with two 512-bit FMA units).
 * In llm_matmul_rows activations stay f32, so the only error is f32 rounding
 * of the sums (llm_matmul_act below is the integer-activation product). Each (row, X row) result is computed by the same
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
    LLM_TYPE_Q5_1 = 7,
    LLM_TYPE_Q8_0 = 8,
    LLM_TYPE_Q2_K = 10,
    LLM_TYPE_Q3_K = 11,
    LLM_TYPE_Q4_K = 12,
    LLM_TYPE_Q5_K = 13,
    LLM_TYPE_Q6_K = 14,
    LLM_TYPE_BF16 = 30,
};

#define LLM_QK   32   /* elements per block of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 */
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
    uint16_t m;                  /* offset added to every element, IEEE half */
    uint8_t  qh[4];              /* 32 fifth bits, as Q5_0 */
    uint8_t  qs[LLM_QK / 2];     /* [16] low 4 bits, order as Q4_0 */
} llm_block_q5_1;
typedef struct {
    uint16_t d;                  /* scale, IEEE half */
    int8_t   qs[LLM_QK];         /* [32] signed quants */
} llm_block_q8_0;
typedef struct {
    uint8_t  scales[16];         /* sub-block s (elements 16s..16s+15): scale in the low
                                    nibble of byte s, min in the high nibble */
    uint8_t  qs[LLM_QK_K / 4];   /* [64] 2-bit quants: element 128h + 32j + l in bits 2j, 2j+1
                                    of byte 32h + l (h < 2, j < 4, l < 32) */
    uint16_t d;                  /* super-scale of the scales, IEEE half */
    uint16_t dmin;               /* super-scale of the mins, IEEE half */
} llm_block_q2_k;
typedef struct {
    uint8_t  hmask[LLM_QK_K / 8]; /* [32] third bits: element 128h + 32j + l in bit 4h + j of
                                     byte l; a clear bit subtracts 4 from the quant */
    uint8_t  qs[LLM_QK_K / 4];    /* [64] low 2 bits, placed as Q2_K's */
    uint8_t  scales[12];          /* 16 six-bit scales, stored + 32: low 4 bits of scale s in
                                     byte s (s < 8, low nibble) or s - 8 (high nibble), top 2
                                     bits in bits 2(s / 4), +1 of byte 8 + s % 4 */
    uint16_t d;                   /* super-scale, IEEE half */
} llm_block_q3_k;
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

/* ---- integer activations ----
 * For the block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K) a product
 * can take its X rows quantized once, in blocks of 32 with an f32 scale each,
 * and shared by every matrix that reads the same input (Q, K, V; gate, up):
 *   bits 8:  d = max|x| / 127,   q = round(x / d) in int8
 *   bits 16: d = max|x| / 16383, q = round(x / d) in int16 (15 bits: Q6_K's
 *            scaled weights times 32 such q stay inside int32)
 * so |x - d q| <= d / 2. The dot of a weight row with an X row is then, with
 * S_b an exact integer sum over block b's 32 elements of (weight integer) * q
 * and B_b the sum of the block's q, summed in 8 lanes (so that SIMD kernels
 * hold 8 consecutive blocks of one row in one vector and stream each row in
 * memory order):
 *     lane[b % 8] += d_b * ((float)S_b * wa_b + (float)B_b * wb_b)
 * and finally (l0+l4 + l2+l6) + (l1+l5 + l3+l7),
 * where wa_b, wb_b are the weight block's scale and offset (Q4_1, Q5_1: d, m;
 * Q4_K, Q5_K: d*sc, -dmin*mn of the sub-block; symmetric formats: d, 0; Q6_K
 * and Q3_K: d, 0 with the sub-block scales in the integers). Q2_K's blocks of
 * 32 span two sub-blocks of 16 with mins of their own: S_b takes the scales
 * (w = sc q), wa_b = d, wb_b = -dmin and B_b is the sum of mn(k) q_k. Every
 * kernel (scalar, AVX2) follows this arithmetic exactly, so results are
 * bit-identical across kernels, thread counts and row splits. F32, F16 and
 * BF16 weights stay in f32 against the f32 rows (their 11-bit or 8-bit
 * mantissas are not integers an integer dot can use without rounding the
 * weight itself). bits 0 keeps every product in f32 (the reference).
 * Which bits the engine uses: llm_act_default_bits(). */
enum { LLM_ACT_F32 = 0, LLM_ACT_Q8 = 8, LLM_ACT_Q16 = 16 };
typedef struct {
    const float *x;   /* [m][n] the f32 rows (float weights and bits 0 read them) */
    int64_t m, n;     /* rows, elements per row */
    int bits;         /* 0 (every product in f32), or how the quants are stored: 8 or 16 */
    void *q;          /* [m][n] int8_t or int16_t quants; NULL for bits 0 */
    float *d;         /* [m][n / 32] block scales */
    int32_t *s;       /* [m][n / 32] sum of each block's quants */
    int32_t *h;       /* [m][n / 32] sum of its first 16 (a K-quant sub-block's) */
    int32_t *lanes;   /* NULL, or (more than 8 rows, kernels that read them at
                         these bits) the rows' quants in lanes of 16 rows, laid
                         out once for every product that reads a */
} llm_act;

/* Bytes of the work area llm_act_quantize needs for m rows of n (any bits;
 * with room for the lanes). */
size_t llm_act_bytes(int64_t m, int64_t n);
/* The engine's choice, read once from the environment: 0 when
 * KVCACHE_EXACT_MATMUL is set (not "0"), else KVCACHE_ACT_BITS (8 or 16) if
 * set, else 16. */
int llm_act_default_bits(void);
/* Prepare X [m][n] (kept by pointer: it must outlive *a) for llm_matmul_act,
 * quantized into buf (llm_act_bytes(m, n) bytes) to `bits` (0, 8, 16; n not a
 * multiple of 32 gives 0). Returns 0, or -1 (a untouched) for m < 1, n < 1,
 * other bits or a buffer too small. */
int llm_act_quantize(llm_act *a, const float *x, int64_t m, int64_t n, int bits, void *buf, size_t bytes);
/* The same with `bits`-bit quants stored as int`store` (bits, or 16 for 8-bit
 * quants: the same values, so the same products, through the 16-bit kernels;
 * a->bits is then 16). */
int llm_act_quantize_as(llm_act *a, const float *x, int64_t m, int64_t n, int bits, int store, void *buf,
                        size_t bytes);
/* How the engine stores `bits`-bit quants of m X rows on the kernels in use:
 * 8-bit ones as int16 past a few rows where the kernels take 16-bit rows in
 * lanes but have no 8-bit tiles (AVX2, AVX-512 without VNNI), whose 8-bit
 * many-row products lose to the 16-bit ones (docs/PERFORMANCE.md). Else
 * bits. */
int llm_act_store_bits(int bits, int64_t m);
/* X rows the products take at once (their blocks of X rows), a multiple of
 * the lanes' groups of 16 */
enum { LLM_ACT_BLOCK_ROWS = 64 };
/* Rows j0 .. j1-1 of a as an llm_act of their own (the same quants, read in
 * place), for 0 <= j0 < j1 <= a->m, j0 a multiple of LLM_ACT_BLOCK_ROWS */
llm_act llm_act_rows(const llm_act *a, int64_t j0, int64_t j1);
/* As llm_matmul_rows for the rows of a (n_in == a->n): integer products for
 * the block formats unless a->bits == 0, f32 ones otherwise. P is NULL or
 * the same rows packed by llm_pack_rows (faster; the same bits). Weight rows
 * go 8 at a time against blocks of 64 X rows: one X row (decode) decodes
 * each weight block in registers; several decode the 8 rows' blocks once
 * into an L1 buffer that each X row reads (the avx512 kernels: 8 X rows at
 * a time, their quants laid out in lanes once per call). */
void llm_matmul_act(int type, const void *W, const void *P, int64_t n_in, int64_t row0, int64_t row1,
                    const llm_act *a, float *Y, int64_t ldy);
/* 1 if llm_matmul_act takes integer products for this type; the others
 * (F32, F16, BF16) run llm_matmul_rows on f32 activations. */
int llm_type_int8(int type);

/* ---- weights packed in groups of 8 rows ----
 * An integer-activation product reads a matrix of Q4_0, Q4_1, Q5_0, Q8_0, Q4_K or Q6_K
 * fastest with its rows in groups of 8 interleaved block by block: one
 * memory stream feeds 8 rows, their 8 scales come in one load, and 8 rows'
 * block sums fill one vector (no partial chunk at a row's end). Block b of
 * group g holds the 8 rows' scale halves d[8], for Q4_1 then their offset
 * halves m[8], then the quants: Q4_0's and Q4_1's nibbles in lanes (4 chunks
 * of 32 bytes whose dword r is row r's, engine/weights/quant_kern.h, so that a load
 * holds one row per lane and the 8 sums build up in place), Q5_0's and
 * Q8_0's as each row's rest of block in turn (4 fifth-bit bytes and 16
 * nibble bytes; 32 quants). Q4_K goes by super-block: the 8 rows' d and
 * dmin halves, their sub-block scales and mins unpacked to bytes, then each
 * sub-block's quants in lanes as Q4_0's (quant_kern.h, LLM_PK4K_*), and
 * Q5_K as Q4_K with each sub-block's fifth bits in lanes beside its
 * nibbles (LLM_PK5K_*); Q6_K
 * too: the 8 rows' d halves and int8 sub-block scales, then each block of
 * 32's low 4 bits in lanes as Q4_0's and its high 2 bits in lanes beside
 * them (LLM_PK6K_*). A group takes the bytes of 8 rows; rows past the
 * last one pad its last group as zeros. Every row's product follows the
 * reference's arithmetic, so packed and plain rows give the same bits. */
/* Bytes of the packed form of rows x cols, or 0 if this type is not packed
 * (Q5_1, Q2_K, Q3_K and the other formats not named above, and the float types)
 * or the shape is bad. */
int64_t llm_packed_bytes(int type, int64_t rows, int64_t cols);
/* Pack W (rows x cols of `type`) into P (llm_packed_bytes bytes). Returns 0,
 * or -1 (P untouched) if the type is not packed or the shape is bad. */
int llm_pack_rows(int type, const void *W, int64_t rows, int64_t cols, void *P);
/* Kernels are chosen at first use by CPU feature, like the library's: the
 * best of "avx512vnni" (the avx512 ones with VNNI's integer dot products),
 * "avx512" (256-bit vectors with 32 registers; 512-bit ones in
 * -DLLM_QUANT_ZMM builds), "avx2" and "scalar", or the one named by the
 * environment variable KVCACHE_SIMD when this CPU runs it; "avx512" takes
 * VNNI too where the CPU has it, unless KVCACHE_NO_VNNI is set. Every build
 * compiles the SIMD files with their own -m flags and runs them only after a
 * CPUID check, so a portable build runs them too.
 * llm_quant_select changes the choice process-wide ("auto": the best); -1 if
 * this CPU or build lacks it. Call it before starting threads. */
int llm_quant_select(const char *name);
/* on != 0: llm_quant_select("scalar"); 0: back to the first-use choice. */
void llm_quant_force_scalar(int on);
/* The name of the kernels that run now. */
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

#endif
