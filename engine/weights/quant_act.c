/* engine/weights/quant_act.c - integer activations: quantizing X rows into int8 or
 * int16 blocks of 32, the scalar integer-activation dot (the reference every
 * SIMD kernel must equal bit for bit), and the matrix-product driver
 * llm_matmul_act. The arithmetic is stated in quant.h above llm_act. */
#include "quant.h"
#include "quant_kern.h"
#include "../../src/half.h"
#include "../../src/cpu.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { QB = 32 };   /* elements per activation block */

/* ------------------------------------------------------------ quantizing */

static size_t round64(size_t v) { return (v + 63) & ~(size_t)63; }
/* the lanes of m rows of n: a group of 16 rows' per 16 rows begun (16-bit
 * ones, the larger) */
static size_t lanes_bytes(int64_t m, int64_t n) {
    return round64((size_t)(m + 15) / 16 * llm_act_lanes_size(n / QB, LLM_ACT_Q16) * sizeof(int32_t));
}

size_t llm_act_bytes(int64_t m, int64_t n) {
    if (m < 1 || n < 1) return 0;
    size_t nb = (size_t)(n / QB);
    return round64((size_t)m * (size_t)n * sizeof(int16_t)) + round64((size_t)m * nb * sizeof(float)) +
           2 * round64((size_t)m * nb * sizeof(int32_t)) + lanes_bytes(m, n) + 64;
}

static pthread_once_t bits_once = PTHREAD_ONCE_INIT;
static int bits_env;
static void read_bits_env(void) {
    const char *e = getenv("KVCACHE_EXACT_MATMUL"), *b = getenv("KVCACHE_ACT_BITS");
    bits_env = e && *e && strcmp(e, "0") != 0 ? LLM_ACT_F32 : b && !strcmp(b, "8") ? LLM_ACT_Q8 : LLM_ACT_Q16;
}
int llm_act_default_bits(void) {
    pthread_once(&bits_once, read_bits_env);
    return bits_env;
}

/* One block: d = max|x| / top, q = round(x / d) (x * (1/d), nearest even),
 * clamped to [-top, top] (top = 127 or 16383) so that negating a quant never
 * overflows; s the sum of the quants, h that of the first 16. */
static void quantize_block(const float *x, int top, int8_t *q8, int16_t *q16, float *d, int32_t *s, int32_t *h) {
    float amax = 0.0f;
    int finite = 1;   /* NaN and infinities, looked for apart */
    for (int k = 0; k < QB; k++) {   /* a NaN compares false: skipped here, caught by finite */
        float v = fabsf(x[k]);
        amax = v > amax ? v : amax;
        finite &= v <= 3.402823466e38f;
    }
    float ft = (float)top, dd = finite ? amax / ft : NAN, id = dd > 0.0f ? 1.0f / dd : 0.0f;
    int32_t sum = 0;
    for (int k = 0; k < QB; k++) {
        float v = rintf(x[k] * id);
        /* NaN (of a NaN or infinite x) becomes q 0; the block's d is NaN then */
        int iv = v > ft ? top : v < -ft ? -top : v == v ? (int)v : 0;
        if (q8) q8[k] = (int8_t)iv;
        else q16[k] = (int16_t)iv;
        sum += iv;
        if (k == QB / 2 - 1) *h = sum;
    }
    *d = dd;   /* NaN for a block with a NaN or infinity: its products come out NaN */
    *s = sum;
}

void llm_act_quantize_scalar(const float *x, int64_t nblocks, int top, int bits, void *q, float *d, int32_t *s,
                             int32_t *h) {
    for (int64_t i = 0; i < nblocks; i++)
        quantize_block(x + i * QB, top, bits == LLM_ACT_Q8 ? (int8_t *)q + i * QB : NULL,
                       bits == LLM_ACT_Q16 ? (int16_t *)q + i * QB : NULL, &d[i], &s[i], &h[i]);
}

enum { JB = LLM_ACT_BLOCK_ROWS };   /* X rows per L2 block */

/* X row j of a as one kernel row */
static llm_act_row act_row(const llm_act *a, int64_t j) {
    int64_t nb = a->n / QB;
    return (llm_act_row){(const char *)a->q + j * a->n * (a->bits / 8), a->bits, a->d + j * nb, a->s + j * nb,
                         a->h + j * nb, NULL};
}

int llm_act_store_bits(int bits, int64_t m) {
    const llm_qkern *k = llm_qkern_active();
    if (bits != LLM_ACT_Q8 || m <= LLM_ACT_FEW_ROWS || llm_qkern_lanes(k, LLM_ACT_Q8)) return bits;
    return llm_qkern_lanes(k, LLM_ACT_Q16) ? LLM_ACT_Q16 : bits;
}

int llm_act_quantize(llm_act *a, const float *x, int64_t m, int64_t n, int bits, void *buf, size_t bytes) {
    return llm_act_quantize_as(a, x, m, n, bits, bits, buf, bytes);
}

int llm_act_quantize_as(llm_act *a, const float *x, int64_t m, int64_t n, int bits, int store, void *buf,
                        size_t bytes) {
    if (!a || !x || m < 1 || n < 1 || (bits != LLM_ACT_F32 && bits != LLM_ACT_Q8 && bits != LLM_ACT_Q16) ||
        (bits != LLM_ACT_F32 && store != bits && store != LLM_ACT_Q16))
        return -1;
    const int top = bits == LLM_ACT_Q8 ? 127 : 16383;
    if (bits != LLM_ACT_F32) bits = store;   /* from here on: how the quants are stored */
    if (bits == LLM_ACT_F32 || n % QB != 0) {
        *a = (llm_act){.x = x, .m = m, .n = n, .bits = LLM_ACT_F32};
        return 0;
    }
    if (!buf || bytes < llm_act_bytes(m, n)) return -1;
    uintptr_t p = ((uintptr_t)buf + 63) & ~(uintptr_t)63;
    size_t nb = (size_t)(n / QB), qsize = bits == LLM_ACT_Q8 ? 1 : 2;
    float *d = (float *)(p + round64((size_t)m * (size_t)n * qsize));
    int32_t *s = (int32_t *)((uintptr_t)d + round64((size_t)m * nb * sizeof(float)));
    int32_t *h = (int32_t *)((uintptr_t)s + round64((size_t)m * nb * sizeof(int32_t)));
    /* rows of whole blocks: the m rows are m * nb consecutive blocks */
    const llm_qkern *k = llm_qkern_active();
    k->act_quantize(x, m * (int64_t)nb, top, bits, (void *)p, d, s, h);
    *a = (llm_act){.x = x, .m = m, .n = n, .bits = bits, .q = (void *)p, .d = d, .s = s, .h = h};
    /* the lanes once here, not again in every product (and every task of one) that reads them */
    if (llm_qkern_lanes(k, bits) && m > LLM_ACT_FEW_ROWS) {
        int32_t *lanes = (int32_t *)((uintptr_t)h + round64((size_t)m * nb * sizeof(int32_t)));
        llm_act_row xs[JB];
        for (int64_t jb = 0; jb < m; jb += JB) {
            int nt = (int)(m - jb < JB ? m - jb : JB);
            for (int t = 0; t < nt; t++) xs[t] = act_row(a, jb + t);
            k->act_lanes(xs, nt, (int64_t)nb, llm_act_lanes_row(lanes, (int64_t)nb, bits, jb));
        }
        a->lanes = lanes;
    }
    return 0;
}

llm_act llm_act_rows(const llm_act *a, int64_t j0, int64_t j1) {
    llm_act r = *a;
    r.m = j1 - j0;
    r.x = a->x + j0 * a->n;
    if (a->bits == LLM_ACT_F32) return r;
    const int64_t nb = a->n / QB;
    r.q = (char *)a->q + j0 * a->n * (a->bits / 8);
    r.d = a->d + j0 * nb, r.s = a->s + j0 * nb, r.h = a->h + j0 * nb;
    /* the lanes of rows from j0 (a group's first) on, if these rows are enough to read them */
    r.lanes = a->lanes && r.m > LLM_ACT_FEW_ROWS ? llm_act_lanes_row(a->lanes, nb, a->bits, j0) : NULL;
    return r;
}

static pthread_once_t groups_once = PTHREAD_ONCE_INIT;
static int groups_here, groups_forced;
static void read_groups(void) {
    const char *e = getenv("KVCACHE_ROW1_GROUPS");
    const int n = e && *e ? atoi(e) : 0;
    groups_here = n >= 1 && n <= LLM_ROW1_GROUPS ? n : kv_cpu_amd() ? 1 : LLM_ROW1_GROUPS;
}
int llm_row1_groups(void) {
    if (groups_forced) return groups_forced;
    pthread_once(&groups_once, read_groups);
    return groups_here;
}
void llm_row1_groups_force(int n) { groups_forced = n >= 1 && n <= LLM_ROW1_GROUPS ? n : 0; }

int llm_type_int8(int type) {
    switch (type) {
    case LLM_TYPE_Q4_0: case LLM_TYPE_Q4_1: case LLM_TYPE_Q5_0: case LLM_TYPE_Q8_0:
    case LLM_TYPE_Q4_K: case LLM_TYPE_Q5_K: case LLM_TYPE_Q6_K:
    case LLM_TYPE_Q5_1: case LLM_TYPE_Q2_K: case LLM_TYPE_Q3_K:
        return 1;
    default:
        return 0;
    }
}

/* ------------------------------------------------------------ the reference */

static float half_at(const uint8_t *p) { return kv_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* Block b (32 elements) of a weight row as integers w[32], with its scale wa
 * and offset wb: the weight values are wa * w[k] + wb (Q6_K, Q3_K: wa * w[k],
 * the sub-block scales folded into w). Q2_K's two sub-blocks of 16 have mins
 * of their own: its values are wa * w[k] + wb * mn[k], so its term takes
 * sum_k mn[k] q[k] where the others take the block's quant sum; the return
 * is 1 when mins[] holds those mn[k] (Q2_K), 0 otherwise. */
static int weight_block(int type, const uint8_t *row, int64_t b, int32_t w[QB], int32_t mins[QB], float *wa,
                        float *wb) {
    *wb = 0.0f;
    switch (type) {
    case LLM_TYPE_Q5_1: {
        const uint8_t *p = row + b * sizeof(llm_block_q5_1), *qh = p + offsetof(llm_block_q5_1, qh);
        const uint8_t *qs = p + offsetof(llm_block_q5_1, qs);
        uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
        for (int j = 0; j < 16; j++) {
            w[j] = (qs[j] & 15) | (int)((h >> j) & 1) << 4;
            w[j + 16] = (qs[j] >> 4) | (int)((h >> (j + 16)) & 1) << 4;
        }
        *wa = half_at(p);
        *wb = half_at(p + offsetof(llm_block_q5_1, m));
        return 0;
    }
    case LLM_TYPE_Q2_K: {   /* elements 32i .. 32i+31 of the super-block: bits 2j of qs[32h + l] */
        const uint8_t *p = row + (b / 8) * sizeof(llm_block_q2_k), *sc = p + offsetof(llm_block_q2_k, scales);
        const int i = (int)(b % 8), h = i / 4, j = i % 4;
        const uint8_t *qs = p + offsetof(llm_block_q2_k, qs) + 32 * h;
        for (int l = 0; l < QB; l++) {
            const int s = sc[2 * i + l / 16];
            w[l] = ((qs[l] >> (2 * j)) & 3) * (s & 15);
            mins[l] = s >> 4;
        }
        *wa = half_at(p + offsetof(llm_block_q2_k, d));
        *wb = -half_at(p + offsetof(llm_block_q2_k, dmin));
        return 1;
    }
    case LLM_TYPE_Q3_K: {   /* quants as Q2_K's, less 4 where the hmask bit is clear, times scale - 32 */
        const uint8_t *p = row + (b / 8) * sizeof(llm_block_q3_k), *sc = p + offsetof(llm_block_q3_k, scales);
        const int i = (int)(b % 8), h = i / 4, j = i % 4;
        const uint8_t *qs = p + offsetof(llm_block_q3_k, qs) + 32 * h, *hm = p + offsetof(llm_block_q3_k, hmask);
        for (int l = 0; l < QB; l++) {
            const int s = 2 * i + l / 16;
            const int lo = s < 8 ? sc[s] & 15 : sc[s - 8] >> 4, hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
            const int q = ((qs[l] >> (2 * j)) & 3) - ((hm[l] >> (4 * h + j)) & 1 ? 0 : 4);
            w[l] = q * ((lo | hi << 4) - 32);
        }
        *wa = half_at(p + offsetof(llm_block_q3_k, d));
        return 0;
    }
    case LLM_TYPE_Q4_0: case LLM_TYPE_Q4_1: {
        const uint8_t *p = row + b * (type == LLM_TYPE_Q4_0 ? sizeof(llm_block_q4_0) : sizeof(llm_block_q4_1));
        const uint8_t *qs = p + (type == LLM_TYPE_Q4_0 ? offsetof(llm_block_q4_0, qs) : offsetof(llm_block_q4_1, qs));
        int off = type == LLM_TYPE_Q4_0 ? 8 : 0;
        for (int j = 0; j < 16; j++) { w[j] = (qs[j] & 15) - off; w[j + 16] = (qs[j] >> 4) - off; }
        *wa = half_at(p);
        if (type == LLM_TYPE_Q4_1) *wb = half_at(p + offsetof(llm_block_q4_1, m));
        return 0;
    }
    case LLM_TYPE_Q5_0: {
        const uint8_t *p = row + b * sizeof(llm_block_q5_0), *qh = p + offsetof(llm_block_q5_0, qh);
        const uint8_t *qs = p + offsetof(llm_block_q5_0, qs);
        uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
        for (int j = 0; j < 16; j++) {
            w[j] = ((qs[j] & 15) | (int)((h >> j) & 1) << 4) - 16;
            w[j + 16] = ((qs[j] >> 4) | (int)((h >> (j + 16)) & 1) << 4) - 16;
        }
        *wa = half_at(p);
        return 0;
    }
    case LLM_TYPE_Q8_0: {
        const uint8_t *p = row + b * sizeof(llm_block_q8_0);
        for (int j = 0; j < QB; j++) w[j] = (int8_t)p[offsetof(llm_block_q8_0, qs) + j];
        *wa = half_at(p);
        return 0;
    }
    case LLM_TYPE_Q4_K: case LLM_TYPE_Q5_K: {
        int five = type == LLM_TYPE_Q5_K;
        const uint8_t *p = row + (b / 8) * (five ? sizeof(llm_block_q5_k) : sizeof(llm_block_q4_k));
        int sub = (int)(b % 8), g = sub / 2, hi = sub % 2;
        const uint8_t *qs = p + (five ? offsetof(llm_block_q5_k, qs) : offsetof(llm_block_q4_k, qs)) + 32 * g;
        const uint8_t *qh = p + offsetof(llm_block_q5_k, qh);
        for (int l = 0; l < QB; l++) {
            int q = hi ? qs[l] >> 4 : qs[l] & 15;
            if (five) q |= ((qh[l] >> sub) & 1) << 4;
            w[l] = q;
        }
        uint8_t sc, mn;
        llm_k_scale_min(p + offsetof(llm_block_q4_k, scales), sub, &sc, &mn);
        *wa = half_at(p + offsetof(llm_block_q4_k, d)) * (float)sc;        /* exact: 11 x 6 bits */
        *wb = -(half_at(p + offsetof(llm_block_q4_k, dmin)) * (float)mn);
        return 0;
    }
    case LLM_TYPE_Q6_K: {
        const uint8_t *p = row + (b / 8) * sizeof(llm_block_q6_k);
        int e0 = (int)(b % 8) * QB, h = e0 / 128, s = (e0 % 128) / 32;
        const uint8_t *ql = p + offsetof(llm_block_q6_k, ql) + 64 * h + 32 * (s & 1);
        const uint8_t *qh = p + offsetof(llm_block_q6_k, qh) + 32 * h;
        const int8_t *sc = (const int8_t *)(p + offsetof(llm_block_q6_k, scales));
        for (int l = 0; l < QB; l++) {
            int q = (s >= 2 ? ql[l] >> 4 : ql[l] & 15) | ((qh[l] >> (2 * s)) & 3) << 4;
            w[l] = (q - 32) * sc[(e0 + l) / 16];
        }
        *wa = half_at(p + offsetof(llm_block_q6_k, d));
        return 0;
    }
    default:
        memset(w, 0, QB * sizeof *w);
        *wa = 0.0f;
        return 0;
    }
}

/* The reference, which every SIMD table equals bit for bit: block b's term
 * goes to lane b % 8 of eight running sums (so that a vector of 8 lanes holds
 * the terms of 8 consecutive blocks of one row, and a row streams through
 * memory in order), and the lanes are added at the end in the tree a 256-bit
 * register reduces in: (l0+l4 + l2+l6) + (l1+l5 + l3+l7). */
float llm_act_lanes_sum(const float l[8]) {
    float h0 = l[0] + l[4], h1 = l[1] + l[5], h2 = l[2] + l[6], h3 = l[3] + l[7];
    float g0 = h0 + h2, g1 = h1 + h3;
    return g0 + g1;
}

/* Block b's term for one activation row: the exact block sum S (and B, the
 * quant sum, or with mn its sum weighted by the mins), then the float part
 * one operation per statement, so that no compiler may fuse them */
static float act_term(const int32_t wi[QB], const int32_t *mn, float wa, float wb, const llm_act_row *x, int64_t b) {
    int32_t S = 0, B = 0;
    if (x->bits == LLM_ACT_Q8) {
        const int8_t *q = (const int8_t *)x->q + b * QB;
        for (int k = 0; k < QB; k++) S += wi[k] * q[k];
        if (mn) for (int k = 0; k < QB; k++) B += mn[k] * q[k];
    } else {   /* |wi| <= 32 * 128 (Q6_K), |q| <= 16383: 32 products fit in int32 */
        const int16_t *q = (const int16_t *)x->q + b * QB;
        for (int k = 0; k < QB; k++) S += wi[k] * q[k];
        if (mn) for (int k = 0; k < QB; k++) B += mn[k] * q[k];
    }
    if (!mn) B = x->s[b];
    float t1 = (float)S * wa;
    float t2 = (float)B * wb;
    float u = t1 + t2;
    return x->d[b] * u;
}

int llm_act_dot_scalar(int type, const uint8_t *const *w, int nr, const llm_act_row *x, int nt, int64_t nb,
                       float *out) {
    if (!llm_type_int8(type) || nt < 1) return -1;
    for (int r = 0; r < nr; r++)
        for (int t0 = 0; t0 < nt; t0 += 8) {   /* X rows 8 at a time */
            int n = nt - t0 < 8 ? nt - t0 : 8;
            float lane[8][8] = {{0}};   /* [X row][b % 8] */
            for (int64_t b = 0; b < nb; b++) {
                int32_t wi[QB], mn[QB];
                float wa, wb;
                const int with_mn = weight_block(type, w[r], b, wi, mn, &wa, &wb);   /* once for every X row */
                for (int t = 0; t < n; t++)
                    lane[t][b % 8] = lane[t][b % 8] + act_term(wi, with_mn ? mn : NULL, wa, wb, &x[t0 + t], b);
            }
            for (int t = 0; t < n; t++) out[r * nt + t0 + t] = llm_act_lanes_sum(lane[t]);
        }
    return 0;
}

/* ------------------------------------------------------------ packed rows */

int llm_type_packed(int type) {
    return type == LLM_TYPE_Q4_0 || type == LLM_TYPE_Q4_1 || type == LLM_TYPE_Q5_0 || type == LLM_TYPE_Q8_0 ||
           llm_packed_k45(type) || type == LLM_TYPE_Q6_K;
}

int64_t llm_packed_bytes(int type, int64_t rows, int64_t cols) {
    int64_t rb = llm_type_packed(type) ? llm_row_bytes(type, cols) : -1;
    if (rb <= 0 || rows < 1 || rows > INT64_MAX / 8 / rb - 1) return 0;
    return (rows + 7) / 8 * 8 * rb;
}

/* Chunk c's dword of a lane-packed row (quant_kern.h): its elements 8c ..
 * 8c+7 are the nibbles (hi: the high ones) of the 8 bytes at qs, element j
 * at bits 4 (j / 2) + 16 (j % 2), as llm_lane_byte says. With the 8 bytes'
 * nibbles at bits 8j of one word, the even and the odd ones each are drawn
 * together: 16 bits apart, then 4. */
static uint32_t lane_dword(const uint8_t *qs, int hi) {
    uint64_t n;
    memcpy(&n, qs, 8);
    n = n >> (4 * hi) & 0x0F0F0F0F0F0F0F0Full;
    uint64_t half[2] = {n & 0x000F000F000F000Full, n >> 8 & 0x000F000F000F000Full};
    uint32_t v = 0;
    for (int h = 0; h < 2; h++) {
        uint64_t e = (half[h] | half[h] >> 12) & 0x000000FF000000FFull;   /* j, j+2 at bits 0, 4 and 32, 36 */
        v |= (uint32_t)((e | e >> 24) & 0xFFFF) << (16 * h);
    }
    return v;
}

/* Block b of W's rows 8g .. 8g+7 into the packed block at dst (sizes as
 * constants, so that every copy is a few moves); padding rows are zeros */
static inline void pack_block(int type, const uint8_t *src, int64_t rows, int64_t rb, int64_t g, int64_t b,
                              uint8_t *dst, const int bb, const int hd) {
    memset(dst, 0, (size_t)(8 * bb));
    for (int r = 0; r < 8 && g * 8 + r < rows; r++) {
        const uint8_t *blk = src + (g * 8 + r) * rb + b * bb;
        memcpy(dst + llm_packed_scale(r), blk, 2);
        if (hd == 4) memcpy(dst + llm_packed_offset(r), blk + 2, 2);
        if (!llm_packed_lanes(type)) {
            memcpy(dst + llm_packed_rest(bb, hd, r), blk + hd, (size_t)(bb - hd));
            continue;
        }
        for (int c = 0; c < 4; c++) {
            uint32_t v = lane_dword(blk + hd + 8 * (c % 2), c / 2);
            memcpy(dst + 8 * hd + 32 * c + 4 * r, &v, 4);
        }
    }
}

/* Row r's block of a packed block p, put back together as the file has it */
static void unpack_block(int type, const uint8_t *p, int r, uint8_t blk[sizeof(llm_block_q8_0)]) {
    const int bb = (int)llm_type_block_bytes(type), hd = llm_packed_head(type);
    memcpy(blk, p + llm_packed_scale(r), 2);
    if (hd == 4) memcpy(blk + 2, p + llm_packed_offset(r), 2);
    if (!llm_packed_lanes(type)) {
        memcpy(blk + hd, p + llm_packed_rest(bb, hd, r), (size_t)(bb - hd));
        return;
    }
    memset(blk + hd, 0, 16);
    for (int k = 0; k < QB; k++) {
        int shift, at = 8 * hd + llm_lane_byte(r, k, &shift);
        blk[hd + k % 16] |= (uint8_t)((p[at] >> shift & 15) << (k / 16 * 4));
    }
}

/* Q4_K or (five) Q5_K (quant_kern.h): super-block sb of W's rows 8g ..
 * 8g+7 into the packed super-block at dst, padding rows zeros. The two
 * formats differ in the offset of qs and Q5_K's fifth bits: bit s of qh[k]
 * for element k of sub-block s. */
static void pack_k45(const uint8_t *src, int64_t rows, int64_t rb, int64_t g, int64_t sb, uint8_t *dst, int five) {
    const size_t bytes = five ? sizeof(llm_block_q5_k) : sizeof(llm_block_q4_k);
    const size_t qs = five ? offsetof(llm_block_q5_k, qs) : offsetof(llm_block_q4_k, qs);
    const int stride = five ? LLM_PK5K_BLOCK : 128;
    memset(dst, 0, 8 * bytes);
    for (int r = 0; r < 8 && g * 8 + r < rows; r++) {
        const uint8_t *blk = src + (g * 8 + r) * rb + sb * (int64_t)bytes;
        memcpy(dst + LLM_PK4K_D + 2 * r, blk + offsetof(llm_block_q4_k, d), 2);
        memcpy(dst + LLM_PK4K_DMIN + 2 * r, blk + offsetof(llm_block_q4_k, dmin), 2);
        for (int s = 0; s < 8; s++) {
            uint8_t sc, mn;
            llm_k_scale_min(blk + offsetof(llm_block_q4_k, scales), s, &sc, &mn);
            dst[LLM_PK4K_SC + 8 * s + r] = (uint8_t)(sc | (mn >> 4) << 6);
            dst[LLM_PK4K_MN + 8 * (s / 2) + r] |= (uint8_t)((mn & 15) << (4 * (s % 2)));
            uint8_t *q = dst + LLM_PK4K_Q + stride * s;
            uint32_t h = 0;
            /* sub-block s: nibble s % 2 of bytes 32 (s / 2) .. +31 */
            for (int c = 0; c < 4; c++) {
                uint32_t v = lane_dword(blk + qs + 32 * (s / 2) + 8 * c, s % 2);
                memcpy(q + 32 * c + 4 * r, &v, 4);
                if (!five) continue;
                uint64_t t;   /* chunk c's fifth bits at bit 0 of their bytes, then at their nibbles' places + c */
                memcpy(&t, blk + offsetof(llm_block_q5_k, qh) + 8 * c, 8);
                t = t >> s & 0x0101010101010101ull;
                h |= lane_dword((const uint8_t *)&t, 0) << c;
            }
            if (five) memcpy(q + LLM_PK5K_HI + 4 * r, &h, 4);
        }
    }
}

/* Row r's super-block of a packed Q4_K or (five) Q5_K super-block p, as the
 * file has it */
static void unpack_k45(const uint8_t *p, int r, uint8_t *blk, int five) {
    const size_t qs = five ? offsetof(llm_block_q5_k, qs) : offsetof(llm_block_q4_k, qs);
    const int stride = five ? LLM_PK5K_BLOCK : 128;
    uint8_t sc[8], mn[8];
    memset(blk, 0, five ? sizeof(llm_block_q5_k) : sizeof(llm_block_q4_k));
    memcpy(blk + offsetof(llm_block_q4_k, d), p + LLM_PK4K_D + 2 * r, 2);
    memcpy(blk + offsetof(llm_block_q4_k, dmin), p + LLM_PK4K_DMIN + 2 * r, 2);
    for (int s = 0; s < 8; s++) {
        const uint8_t v = p[LLM_PK4K_SC + 8 * s + r];
        const uint8_t *q = p + LLM_PK4K_Q + stride * s;
        sc[s] = v & 63;
        mn[s] = (uint8_t)((v >> 6) << 4 | (p[LLM_PK4K_MN + 8 * (s / 2) + r] >> (4 * (s % 2)) & 15));
        for (int k = 0; k < QB; k++) {
            int shift, at = llm_lane_byte(r, k, &shift);
            blk[qs + 32 * (s / 2) + k] |= (uint8_t)((q[at] >> shift & 15) << (4 * (s % 2)));
            if (!five) continue;
            at = LLM_PK5K_HI + llm_q5_hi_byte(r, k, &shift);
            blk[offsetof(llm_block_q5_k, qh) + k] |= (uint8_t)((q[at] >> shift & 1) << s);
        }
    }
    /* the 12 scale bytes as llm_k_scale_min reads them */
    uint8_t *e = blk + offsetof(llm_block_q4_k, scales);
    for (int j = 0; j < 4; j++) {
        e[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        e[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        e[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
    }
}

/* Q6_K (quant_kern.h): super-block sb of W's rows 8g .. 8g+7 into the
 * packed super-block at dst, padding rows zeros. Element k of block i: its
 * low 4 bits are nibble i / 2 % 2 of ql[64 (i / 4) + 32 (i % 2) + k], its
 * high 2 bits bits 2 (i % 4) of qh[32 (i / 4) + k], as weight_block reads
 * them; whole dwords of lanes at a time (a model's load packs hundreds of
 * MB of them). */
static void pack_q6_k(const uint8_t *src, int64_t rows, int64_t rb, int64_t g, int64_t sb, uint8_t *dst) {
    memset(dst, 0, 8 * sizeof(llm_block_q6_k));
    for (int r = 0; r < 8 && g * 8 + r < rows; r++) {
        const uint8_t *blk = src + (g * 8 + r) * rb + sb * (int64_t)sizeof(llm_block_q6_k);
        memcpy(dst + LLM_PK6K_D + 2 * r, blk + offsetof(llm_block_q6_k, d), 2);
        for (int j = 0; j < 16; j++) dst[LLM_PK6K_SC + 8 * j + r] = blk[offsetof(llm_block_q6_k, scales) + j];
        for (int i = 0; i < 8; i++) {
            uint8_t *q = dst + LLM_PK6K_Q + LLM_PK6K_BLOCK * i;
            const uint8_t *ql = blk + offsetof(llm_block_q6_k, ql) + 64 * (i / 4) + 32 * (i % 2);
            const uint8_t *qh = blk + offsetof(llm_block_q6_k, qh) + 32 * (i / 4);
            for (int c = 0; c < 4; c++) {
                const uint32_t v = lane_dword(ql + 8 * c, i / 2 % 2);
                memcpy(q + 32 * c + 4 * r, &v, 4);
            }
            for (int c = 0; c < 2; c++) {   /* the high bits of nibble chunk 2c + e, as nibbles, at bit 2e */
                uint32_t h = 0;
                for (int e = 0; e < 2; e++) {
                    uint64_t t;
                    memcpy(&t, qh + 8 * (2 * c + e), 8);
                    t = t >> (2 * (i % 4)) & 0x0303030303030303ull;
                    h |= lane_dword((const uint8_t *)&t, 0) << (2 * e);
                }
                memcpy(q + LLM_PK6K_HI + 32 * c + 4 * r, &h, 4);
            }
        }
    }
}

/* Row r's super-block of a packed Q6_K super-block p, as the file has it
 * (pack_q6_k's bits put back one at a time, by llm_lane_byte and
 * llm_q6_hi_byte) */
static void unpack_q6_k(const uint8_t *p, int r, uint8_t blk[sizeof(llm_block_q6_k)]) {
    memset(blk, 0, sizeof(llm_block_q6_k));
    memcpy(blk + offsetof(llm_block_q6_k, d), p + LLM_PK6K_D + 2 * r, 2);
    for (int j = 0; j < 16; j++) blk[offsetof(llm_block_q6_k, scales) + j] = p[LLM_PK6K_SC + 8 * j + r];
    for (int i = 0; i < 8; i++) {
        const uint8_t *q = p + LLM_PK6K_Q + LLM_PK6K_BLOCK * i;
        for (int k = 0; k < QB; k++) {
            int ls, hs;
            const uint8_t lo = q[llm_lane_byte(r, k, &ls)] >> ls & 15;
            const uint8_t hi = q[LLM_PK6K_HI + llm_q6_hi_byte(r, k, &hs)] >> hs & 3;
            blk[offsetof(llm_block_q6_k, ql) + 64 * (i / 4) + 32 * (i % 2) + k] |= (uint8_t)(lo << (i / 2 % 2 * 4));
            blk[offsetof(llm_block_q6_k, qh) + 32 * (i / 4) + k] |= (uint8_t)(hi << (2 * (i % 4)));
        }
    }
}

int llm_pack_rows(int type, const void *W, int64_t rows, int64_t cols, void *P) {
    int64_t bytes = llm_packed_bytes(type, rows, cols);
    if (!bytes || !W || !P) return -1;
    const int64_t bb = llm_type_block_bytes(type), nb = cols / QB, rb = llm_row_bytes(type, cols);
    uint8_t *dst = P;
    if (llm_packed_k45(type) || type == LLM_TYPE_Q6_K) {
        for (int64_t g = 0; g < (rows + 7) / 8; g++)
            for (int64_t sb = 0; sb < cols / LLM_QK_K; sb++, dst += 8 * bb)
                if (type == LLM_TYPE_Q6_K) pack_q6_k(W, rows, rb, g, sb, dst);
                else pack_k45(W, rows, rb, g, sb, dst, type == LLM_TYPE_Q5_K);
        return 0;
    }
    for (int64_t g = 0; g < (rows + 7) / 8; g++)
        for (int64_t b = 0; b < nb; b++, dst += 8 * bb) switch (type) {
            case LLM_TYPE_Q4_0: pack_block(type, W, rows, rb, g, b, dst, sizeof(llm_block_q4_0), 2); break;
            case LLM_TYPE_Q4_1: pack_block(type, W, rows, rb, g, b, dst, sizeof(llm_block_q4_1), 4); break;
            case LLM_TYPE_Q5_0: pack_block(type, W, rows, rb, g, b, dst, sizeof(llm_block_q5_0), 2); break;
            default: pack_block(type, W, rows, rb, g, b, dst, sizeof(llm_block_q8_0), 2); break;
            }
    return 0;
}

int llm_act_dot_packed_scalar(int type, const uint8_t *group, int64_t nb, const llm_act_row *x, int nt, float *out) {
    if (!llm_type_packed(type) || nt < 1) return -1;
    const int64_t bb = llm_type_block_bytes(type);
    const int kq = llm_packed_k45(type) || type == LLM_TYPE_Q6_K;   /* by super-block */
    for (int t = 0; t < nt; t++, x++, out += 8) {
        for (int r = 0; r < 8; r++) {
            float lane[8] = {0};
            for (int64_t b = 0; b < nb; b++) {
                uint8_t blk[sizeof(llm_block_q6_k)];
                if (llm_packed_k45(type))
                    unpack_k45(llm_packed_block(type, group, b), r, blk, type == LLM_TYPE_Q5_K);
                else if (type == LLM_TYPE_Q6_K) unpack_q6_k(llm_packed_block(type, group, b), r, blk);
                else unpack_block(type, group + b * 8 * bb, r, blk);
                int32_t wi[QB], mn[QB];
                float wa, wb;
                /* the packed types have no mins of Q2_K's kind */
                weight_block(type, blk, kq ? b % 8 : 0, wi, mn, &wa, &wb);
                lane[b % 8] = lane[b % 8] + act_term(wi, NULL, wa, wb, x, b);
            }
            out[r] = llm_act_lanes_sum(lane);
        }
    }
    return 0;
}

/* ------------------------------------------------------------ the product */


void llm_matmul_act(int type, const void *W, const void *P, int64_t n_in, int64_t row0, int64_t row1,
                    const llm_act *a, float *Y, int64_t ldy) {
    int64_t rb = llm_row_bytes(type, n_in);
    if (a->bits == LLM_ACT_F32 || !llm_type_int8(type) || rb < 0 || n_in != a->n) {
        llm_matmul_rows(type, W, n_in, row0, row1, a->x, a->m, Y, ldy);
        return;
    }
    if (row0 < 0 || row1 <= row0) return;
    const llm_qkern *k = llm_qkern_active();
    const uint8_t *Wb = W;
    const int64_t nb = n_in / QB, m = a->m;
    const int packed = P && llm_type_packed(type), groups = llm_row1_groups();
    llm_act_row xs[JB];
    float out[8 * JB];
    /* with more than a few X rows: their quants in lanes, if the kernels take them */
    int32_t *lanes = NULL;   /* a's, or (quantized under other kernels) this call's */
    const int own = !a->lanes;
    if (llm_qkern_lanes(k, a->bits) && m > LLM_ACT_FEW_ROWS)
        lanes = own ? malloc(llm_act_lanes_size(nb, a->bits) * sizeof *lanes * (JB / 16)) : a->lanes;
    /* groups of 8 weight rows against blocks of JB X rows (kept in L2): the
     * kernels decode the 8 rows once for all the block's X rows */
    for (int64_t jb = 0; jb < m; jb += JB) {
        int nt = (int)(m - jb < JB ? m - jb : JB);
        for (int t = 0; t < nt; t++) xs[t] = act_row(a, jb + t);
        if (lanes && nt > LLM_ACT_FEW_ROWS && own) k->act_lanes(xs, nt, nb, lanes);
        else if (lanes && nt > LLM_ACT_FEW_ROWS)
            for (int t = 0; t < nt; t++) xs[t].lanes = llm_act_lanes_row(lanes, nb, a->bits, jb + t);
        if (packed) {
            for (int64_t g = row0 / 8, ng = 1; g * 8 < row1; g += ng) {
                const uint8_t *grp = (const uint8_t *)P + g * 8 * rb;
                /* one X row: up to llm_row1_groups() long groups at once;
                 * a single group through act_dot_packed (the same one-row
                 * kernel, for a group that is not read beside others) */
                ng = 8 * rb >= LLM_ROW1_STREAM_BYTES ? (row1 - g * 8 + 7) / 8 : 1;
                ng = ng < groups ? ng : groups;
                const int row1_kernel = nt == 1 && ng > 1 && k->act_row_packed;
                if (!row1_kernel || k->act_row_packed(type, grp, 8 * rb, (int)ng, nb, xs, out) != 0) {
                    ng = 1;
                    if (k->act_dot_packed(type, grp, nb, xs, nt, out) != 0)
                        llm_act_dot_packed_scalar(type, grp, nb, xs, nt, out);
                }
                for (int64_t h = 0; h < ng; h++) {
                    const int64_t r = (g + h) * 8;
                    const int64_t i0 = row0 > r ? row0 - r : 0, i1 = row1 - r < 8 ? row1 - r : 8;
                    if (i0 == 0 && i1 == 8)   /* a whole group: one copy of a constant size (a vector move) a row */
                        for (int t = 0; t < nt; t++) memcpy(Y + (jb + t) * ldy + r, out + 8 * (h + t), 8 * sizeof *Y);
                    else
                        for (int t = 0; t < nt; t++)
                            for (int64_t i = i0; i < i1; i++) Y[(jb + t) * ldy + r + i] = out[8 * (h + t) + i];
                }
            }
            continue;
        }
        for (int64_t r0 = row0; r0 < row1; r0 += 8) {
            int nr = (int)(row1 - r0 < 8 ? row1 - r0 : 8);
            const uint8_t *w[8];
            for (int i = 0; i < nr; i++) w[i] = Wb + (r0 + i) * rb;
            if (k->act_dot(type, w, nr, xs, nt, nb, out) != 0) llm_act_dot_scalar(type, w, nr, xs, nt, nb, out);
            for (int i = 0; i < nr; i++)
                for (int t = 0; t < nt; t++) Y[(jb + t) * ldy + r0 + i] = out[i * nt + t];
        }
    }
    if (own) free(lanes);
}
