/* engine/weights/quant_kern.h - internal to the engine's quant_*.c files: the table of
 * weight kernels one instruction set provides, and how one is chosen at run
 * time (by CPU feature, or by KVCACHE_SIMD as for the library's kernels).
 * Not for callers: engine/weights/quant.h is the interface. */
#ifndef LLM_QUANT_KERN_H
#define LLM_QUANT_KERN_H

#include "quant.h"

/* One activation row in integer blocks of 32 (see llm_act in quant.h). */
typedef struct {
    const void *q;      /* [n] int8_t (bits 8) or int16_t (bits 16) quants */
    int bits;           /* 8 or 16, the same for every row of one call */
    const float *d;     /* [n / 32] block scales */
    const int32_t *s;   /* [n / 32] sum of each block's quants */
    const int32_t *h;   /* [n / 32] sum of its first 16 quants */
    /* NULL, or (for tables that take these bits in lanes, llm_qkern_lanes)
     * the rows of the call in lanes, in groups of 16 consecutive rows (rows
     * past the call's zero), laid out as llm_act_lanes_size says. A row
     * points at its group, 8 int32 further for rows 8..15 of it
     * (llm_act_lanes_row), so that 8 rows read their lanes at a stride of 16
     * and 16 rows theirs whole. */
    const int32_t *lanes;
} llm_act_row;

/* Packed groups one activation row (decode) reads at once: one stream
 * through memory each, which an Intel core reads faster than a single
 * stream, where the groups are long enough (LLM_ROW1_STREAM_BYTES of 8 rows
 * or more) for the hardware prefetch to ramp up in each; shorter groups
 * (small models) go one at a time, and so do all on AMD's cores, which read
 * one stream faster than several (llm_row1_groups; figures in
 * docs/PERFORMANCE.md) */
enum { LLM_ROW1_GROUPS = 8, LLM_ROW1_STREAM_BYTES = 16384 };
/* How many long groups one activation row reads at once here: 1 on AMD,
 * else LLM_ROW1_GROUPS, or what KVCACHE_ROW1_GROUPS (1 .. LLM_ROW1_GROUPS)
 * says, read once; llm_row1_groups_force(n) overrides it (the tests run
 * both), 0 puts it back (quant_act.c) */
int llm_row1_groups(void);
void llm_row1_groups_force(int n);

typedef struct {
    const char *name;   /* "scalar", "avx2", "avx512", "avx512vnni" */
    /* Decode n elements (whole blocks); 0 if done, -1 if this table has no
     * decoder for the type (the caller then uses the scalar one). */
    int (*dequant)(int type, const void *src, float *dst, int64_t n);
    /* out[r*nt + t] = sum_k w[r][k] * x[t][k] for r < nr, t < nt over n floats.
     * Shapes (nr, nt) are (8, 1), (4, 4) or (1, 1); any other shape is computed
     * one (1, 1) pair at a time. */
    void (*dot_tile)(const float *const *w, int nr, const float *const *x, int nt, int64_t n, float *out);
    /* Decode-and-dot without the float buffer for nr (8 or 1) rows of a
     * Q4_0/Q4_1/Q5_0/Q8_0 chunk: out[r] = dot(w[r][0..n), x), bit-identical
     * to dequant + dot_tile; -1 where this table has none. */
    int (*fused_dot)(int type, const uint8_t *const *w, int nr, const float *x, int64_t n, float *out);
    /* integer-activation products of nb blocks of 32: out[r*nt + t] for weight
     * rows w[r] (r < nr) and activation rows x[t] (t < nt <= 4), by exactly
     * the arithmetic of the scalar reference in quant_act.c (so every table
     * gives the same bits, whatever the shape); -1 if the type has no integer
     * path in this table. */
    int (*act_dot)(int type, const uint8_t *const *w, int nr, const llm_act_row *x, int nt, int64_t nb,
                   float *out);
    /* The same products for one packed group of 8 weight rows (llm_pack_rows)
     * against nt activation rows: out[8*t + r] for t < nt, r < 8, by the same
     * arithmetic; -1 if the type is not packed. */
    int (*act_dot_packed)(int type, const uint8_t *group, int64_t nb, const llm_act_row *x, int nt, float *out);
    /* llm_act_quantize's blocks: nblocks consecutive blocks of 32 floats of x
     * into quants in [-top, top] (127 or 16383) stored in q as int8 or int16
     * (by bits), scales d, sums s and half sums h, each block as the scalar
     * quantize_block (quant_act.c) gives it, bit for bit. */
    void (*act_quantize)(const float *x, int64_t nblocks, int top, int bits, void *q, float *d, int32_t *s,
                         int32_t *h);
    /* NULL, or: the nt rows' quants, scales and sums in lanes of 16 rows
     * (llm_act_row.lanes) into buf (llm_act_lanes_size(nb, bits) int32 per
     * group of 16), each row pointed at its group's; act_dot and
     * act_dot_packed then read them. 16-bit rows, and 8-bit ones where
     * act_lanes8 is 1 (llm_qkern_lanes). */
    void (*act_lanes)(llm_act_row *xs, int nt, int64_t nb, int32_t *buf);
    int act_lanes8;
    /* NULL, or act_dot_packed for one activation row x against ng <=
     * LLM_ROW1_GROUPS packed groups, gbytes apart: out[8*k + r] for group
     * k, row r; -1 if it does not take the type (the caller then takes the
     * groups one at a time) */
    int (*act_row_packed)(int type, const uint8_t *groups, int64_t gbytes, int ng, int64_t nb, const llm_act_row *x,
                          float *out);
} llm_qkern;

/* A group of 16 rows in lanes (llm_act_row.lanes) of nb blocks, in int32s:
 * each block's quants (16-bit: [pair j][row], 16 x 16; 8-bit: [quad
 * j][row], 8 x 16, quad j being the row's bytes 8 (j / 2) + 0, 4, 1, 5
 * (j even) or + 2, 6, 3, 7 (j odd): the order in which a lane-packed
 * weight dword's nibbles are masked, quant_kern.h below), then the blocks'
 * scales [nb][16] (float) and quant sums [nb][16], and with 8-bit quants
 * the sums of each block's first 16 quants [nb][16] (the K-quants'
 * sub-blocks of 16). Where the scales, sums and half sums begin in it, and
 * where row t of lanes laid out from buf points. */
static inline int64_t llm_act_lanes_q(int bits) { return bits == 8 ? 128 : 256; }
static inline size_t llm_act_lanes_size(int64_t nb, int bits) {
    return (size_t)nb * (size_t)(llm_act_lanes_q(bits) + (bits == 8 ? 48 : 32));
}
static inline int64_t llm_act_lanes_d(int64_t nb, int bits) { return nb * llm_act_lanes_q(bits); }
static inline int64_t llm_act_lanes_s(int64_t nb, int bits) { return nb * (llm_act_lanes_q(bits) + 16); }
static inline int64_t llm_act_lanes_h(int64_t nb, int bits) { return nb * (llm_act_lanes_q(bits) + 32); }
static inline int32_t *llm_act_lanes_row(int32_t *buf, int64_t nb, int bits, int64_t t) {
    return buf + (size_t)(t / 16) * llm_act_lanes_size(nb, bits) + (size_t)(t % 16 / 8 * 8);
}

/* Whether the table lays out (and its products read) rows of these bits in lanes */
static inline int llm_qkern_lanes(const llm_qkern *k, int bits) {
    return k->act_lanes && (bits == 16 || (bits == 8 && k->act_lanes8));
}

/* The kernels in use: KVCACHE_SIMD ("scalar", "avx2", "avx512", "auto") if
 * set and supported, else the best this CPU runs; llm_quant_force_scalar
 * overrides it. */
const llm_qkern *llm_qkern_active(void);
extern const llm_qkern llm_qkern_scalar;
/* NULL when not compiled in or when the CPU lacks the instructions */
const llm_qkern *llm_qkern_avx2(void);
const llm_qkern *llm_qkern_avx512(void);
const llm_qkern *llm_qkern_avx512vnni(void);

/* The final sum of the reference's 8 lane sums (quant_act.c), in its order */
float llm_act_lanes_sum(const float l[8]);

/* The int8-activation tiles: scalar (quant_act.c, the reference), AVX2
 * (quant_act_avx2.c) and the same compiled with AVX-512 flags. */
int llm_act_dot_scalar(int type, const uint8_t *const *w, int nr, const llm_act_row *x, int nt, int64_t nb,
                       float *out);
int llm_act_dot_avx2(int type, const uint8_t *const *w, int nr, const llm_act_row *x, int nt, int64_t nb,
                     float *out);
int llm_act_dot_avx512(int type, const uint8_t *const *w, int nr, const llm_act_row *x, int nt, int64_t nb,
                       float *out);
int llm_act_dot_avx512vnni(int type, const uint8_t *const *w, int nr, const llm_act_row *x, int nt, int64_t nb,
                           float *out);
void llm_act_quantize_scalar(const float *x, int64_t nblocks, int top, int bits, void *q, float *d, int32_t *s,
                             int32_t *h);
void llm_act_quantize_avx2(const float *x, int64_t nblocks, int top, int bits, void *q, float *d, int32_t *s,
                           int32_t *h);
void llm_act_quantize_avx512(const float *x, int64_t nblocks, int top, int bits, void *q, float *d, int32_t *s,
                             int32_t *h);
void llm_act_quantize_avx512vnni(const float *x, int64_t nblocks, int top, int bits, void *q, float *d, int32_t *s,
                                 int32_t *h);
void llm_act_lanes_avx2(llm_act_row *xs, int nt, int64_t nb, int32_t *buf);
void llm_act_lanes_avx512(llm_act_row *xs, int nt, int64_t nb, int32_t *buf);
void llm_act_lanes_avx512vnni(llm_act_row *xs, int nt, int64_t nb, int32_t *buf);
int llm_act_dot_packed_scalar(int type, const uint8_t *group, int64_t nb, const llm_act_row *x, int nt, float *out);
int llm_act_dot_packed_avx2(int type, const uint8_t *group, int64_t nb, const llm_act_row *x, int nt, float *out);
int llm_act_dot_packed_avx512(int type, const uint8_t *group, int64_t nb, const llm_act_row *x, int nt, float *out);
int llm_act_dot_packed_avx512vnni(int type, const uint8_t *group, int64_t nb, const llm_act_row *x, int nt,
                                  float *out);
int llm_act_row_packed_avx2(int type, const uint8_t *groups, int64_t gbytes, int ng, int64_t nb, const llm_act_row *x,
                            float *out);
int llm_act_row_packed_avx512(int type, const uint8_t *groups, int64_t gbytes, int ng, int64_t nb,
                              const llm_act_row *x, float *out);
int llm_act_row_packed_avx512vnni(int type, const uint8_t *groups, int64_t gbytes, int ng, int64_t nb,
                                  const llm_act_row *x, float *out);

/* The packed layout (quant.h, llm_pack_rows): 1 for the types it holds; the
 * header bytes each row's block keeps in front (the scale halves); and where
 * row r's parts lie in a packed block of 8 blocks of bb bytes: its scale
 * half, Q4_1's offset half, then (Q5_0, Q8_0) the rest of its block. */
int llm_type_packed(int type);
/* Up to this many activation rows, the 16-bit products take no lanes of 8
 * X rows (the decoded-rows buffer's, which cost as much for 2 rows as for
 * 8): a packed group is multiplied with the rows by the decode kernel (its
 * 8 rows' blocks, a few KB, stay in L1 for the rows after the first), a
 * Q4_0/Q4_1 group with up to 4 of them at once (2 with AVX2: LANE_ROWS in
 * quant_act_avx2.c), other groups one at a time, and plain rows in tiles of
 * up to 4. Past it, whole groups of 8 go in lanes, and a packed group's
 * rest as above. A batch of decodes is such a product (figures in
 * docs/PERFORMANCE.md, "Tuning record"). */
enum { LLM_ACT_FEW_ROWS = 8 };
static inline int llm_packed_head(int type) { return type == LLM_TYPE_Q4_1 ? 4 : 2; }
static inline int llm_packed_scale(int r) { return 2 * r; }
static inline int llm_packed_offset(int r) { return 16 + 2 * r; }
static inline int llm_packed_rest(int bb, int hd, int r) { return 8 * hd + r * (bb - hd); }

/* Q4_0 and Q4_1 packed blocks hold their quants in lanes: after the 8
 * rows' halves (8 * hd bytes), 4 chunks of 32 bytes, whose dword r is row
 * r's, so that a 256-bit load has one row per lane and the 8 rows' sums
 * build up in the lanes of one vector. Element 8i + 2s + h is the nibble at
 * bits 4s + 16h of chunk i's dword: the dword's two 16-bit halves, masked,
 * are the pair (2j, 2j + 1) as int16. Q5_0 and Q8_0 keep each row's rest
 * of block whole, at llm_packed_rest.
 * A packed Q4_K super-block (8 rows' super-blocks, 8 * 144 bytes) holds the
 * 8 rows' d halves, their dmin halves, their sub-block scales and mins as
 * [sub-block][row] bytes sc | (mn >> 4) << 6, the mins' low 4 bits (byte
 * LLM_PK4K_MN + 8 (s / 2) + r: low nibble for an even sub-block s, high
 * for an odd one), then each sub-block's 32 quants of the 8 rows in lanes
 * as a Q4_0 block's (128 bytes). A packed Q5_K super-block (8 * 176
 * bytes) has Q4_K's head, then for each sub-block its nibbles as Q4_K's
 * and their fifth bits in one chunk of 32 bytes, dword r row r's: the bit
 * of the nibble at bit n of nibble chunk c's dword at bit n + c
 * (llm_q5_hi_byte), so that one shift and a mask put a chunk's fifth bits
 * beside its nibbles (LLM_PK5K_BLOCK bytes a sub-block, its fifth bits
 * LLM_PK5K_HI into it). */
enum { LLM_PK4K_D = 0, LLM_PK4K_DMIN = 16, LLM_PK4K_SC = 32, LLM_PK4K_MN = 96, LLM_PK4K_Q = 128 };
enum { LLM_PK5K_BLOCK = 160, LLM_PK5K_HI = 128 };
/* Q4_K and Q5_K: packed super-blocks with the same head */
static inline int llm_packed_k45(int type) { return type == LLM_TYPE_Q4_K || type == LLM_TYPE_Q5_K; }
/* A packed Q6_K super-block (8 rows' super-blocks, 8 * 210 bytes) holds the
 * 8 rows' d halves, their 16 int8 sub-block scales as [sub-block of
 * 16][row] bytes, then per block of 32 elements (LLM_PK6K_BLOCK bytes): the
 * low 4 bits of its 32 quants of the 8 rows in lanes as a Q4_0 block's (4
 * chunks, 128 bytes), and their high 2 bits in 2 chunks of 32 bytes, dword
 * r row r's: chunk c holds those of nibble chunks 2c and 2c + 1, the 2 bits
 * of the nibble at bit n of chunk i's dword at bit n + 2 (i % 2) of chunk
 * i / 2's (llm_q6_hi_byte), so that one shift and a mask put them beside
 * their nibbles. LLM_PK6K_Q: where block 0 begins; LLM_PK6K_HI: where a
 * block's high bits begin in it. */
enum { LLM_PK6K_D = 0, LLM_PK6K_SC = 16, LLM_PK6K_Q = 144, LLM_PK6K_HI = 128, LLM_PK6K_BLOCK = 192 };
/* The types whose packed blocks hold their quants' low 4 bits in lanes
 * (Q5_K: with its fifth bits beside them, llm_packed_lane_high) */
static inline int llm_packed_lanes(int type) {
    return type == LLM_TYPE_Q4_0 || type == LLM_TYPE_Q4_1 || llm_packed_k45(type);
}
/* Bytes of one block of Q4_0, Q4_1, Q5_0 or Q8_0; Q4_K's and Q5_K's bytes
 * per 32 elements (inline: the kernels take it per block) */
static inline int64_t llm_packed_block_bytes(int type) {
    return type == LLM_TYPE_Q4_K ? (int64_t)sizeof(llm_block_q4_k) / 8
         : type == LLM_TYPE_Q5_K ? (int64_t)sizeof(llm_block_q5_k) / 8
         : type == LLM_TYPE_Q4_0 ? (int64_t)sizeof(llm_block_q4_0)
         : type == LLM_TYPE_Q4_1 ? (int64_t)sizeof(llm_block_q4_1)
         : type == LLM_TYPE_Q5_0 ? (int64_t)sizeof(llm_block_q5_0) : (int64_t)sizeof(llm_block_q8_0);
}
/* Where block b (of 32 elements) of a packed group begins: its packed
 * block, or for the K-quants its super-block */
static inline const uint8_t *llm_packed_block(int type, const uint8_t *grp, int64_t b) {
    if (type == LLM_TYPE_Q4_K) return grp + b / 8 * 8 * (int64_t)sizeof(llm_block_q4_k);
    if (type == LLM_TYPE_Q5_K) return grp + b / 8 * 8 * (int64_t)sizeof(llm_block_q5_k);
    if (type == LLM_TYPE_Q6_K) return grp + b / 8 * 8 * (int64_t)sizeof(llm_block_q6_k);
    return grp + b * 8 * llm_packed_block_bytes(type);
}
/* The bytes of a packed group's stream per block of 32 elements (8 rows'),
 * what a kernel prefetches per block: 8 blocks' bytes, or Q6_K's 210 (its
 * 8 rows' super-block of 8 blocks is 8 * 210 bytes, 26.25 a block and row) */
static inline int64_t llm_packed_stream_bytes(int type) {
    return type == LLM_TYPE_Q6_K ? (int64_t)sizeof(llm_block_q6_k) : 8 * llm_packed_block_bytes(type);
}
/* Block b's quants in lanes (llm_packed_lanes types) */
static inline const uint8_t *llm_packed_lane_quants(int type, const uint8_t *grp, int64_t b) {
    if (type == LLM_TYPE_Q4_K) return llm_packed_block(type, grp, b) + LLM_PK4K_Q + 128 * (b % 8);
    if (type == LLM_TYPE_Q5_K) return llm_packed_block(type, grp, b) + LLM_PK4K_Q + LLM_PK5K_BLOCK * (b % 8);
    return llm_packed_block(type, grp, b) + 8 * llm_packed_head(type);
}
/* Block b's chunk of fifth bits (Q5_K), or NULL (the other lane types) */
static inline const uint8_t *llm_packed_lane_high(int type, const uint8_t *grp, int64_t b) {
    return type == LLM_TYPE_Q5_K ? llm_packed_lane_quants(type, grp, b) + LLM_PK5K_HI : NULL;
}
/* The byte of a block's lane quants that holds element k (0..31) of row r,
 * and the shift of its nibble in that byte (0 or 4) */
static inline int llm_lane_byte(int r, int k, int *shift) {
    const int j = k % 8, bit = 4 * (j / 2) + 16 * (j % 2);
    *shift = bit % 8;
    return 32 * (k / 8) + 4 * r + bit / 8;
}
/* The byte of a packed Q5_K block's fifth-bit chunk that holds the fifth
 * bit of element k (0..31) of row r, and its shift in that byte */
static inline int llm_q5_hi_byte(int r, int k, int *shift) {
    const int j = k % 8, bit = 4 * (j / 2) + 16 * (j % 2) + k / 8;
    *shift = bit % 8;
    return 4 * r + bit / 8;
}
/* The byte of a packed Q6_K block's high-bit chunks that holds the 2 high
 * bits of element k (0..31) of row r, and their shift in that byte */
static inline int llm_q6_hi_byte(int r, int k, int *shift) {
    const int j = k % 8, bit = 4 * (j / 2) + 16 * (j % 2) + 2 * (k / 8 % 2);
    *shift = bit % 8;
    return 32 * (k / 16) + 4 * r + bit / 8;
}

#endif
