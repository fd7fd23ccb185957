/* src/simd.h - the few primitives the FP32 attention kernel is built from,
 * with a portable scalar version and AVX2+FMA and AVX-512 versions picked at
 * run time by CPU feature (or by KVCACHE_SIMD / kv_simd_select). */
#ifndef KV_SIMD_H
#define KV_SIMD_H

#include <math.h>

#include "internal.h"

/* The non-finite rule (include/kvcache.h), shared by every kernel. A weight is
 * e^(s - max); its argument is made NaN when it is -inf (a score of -inf, or a
 * max of +inf: both come only from non-finite scores) by adding x * 0, and
 * held at -87.3 below so that a finite score never gets weight 0 (0 * inf
 * would turn an infinite value into NaN) nor a subnormal one. Comparisons keep
 * a NaN argument: `x < c ? c : x` is false for NaN. */
#define KV_EXP_FLOOR (-87.3f)
static inline float kv_weight_exp(float x) {
    x += x * 0.0f;
    return expf(x < KV_EXP_FLOOR ? KV_EXP_FLOOR : x);
}
/* e^(m_old - m_new), the rescaling of the running state: 0 on the first keys
 * (m_old = -inf, nothing accumulated yet), NaN when either is NaN. */
static inline float kv_corr_exp(float m_old, float m_new) {
    if (m_old == -INFINITY) return 0.0f;
    const float x = m_old - m_new;
    return expf(x < KV_EXP_FLOOR ? KV_EXP_FLOOR : x);
}

/* Rows a decode kernel asks the memory for while it computes: the slot of
 * the traversal a few ahead of it (rows of `bytes` bytes, `stride` apart from
 * p; none when rows is 0). Asked for a few at a time, spread over the
 * kernel's work: all at once, the requests overran the core's miss buffers
 * and stalled it. Into L2 (prefetcht1), not L1: the core has far more L2
 * misses in flight than L1 ones, and the rows are read once, soon after. */
typedef struct {
    const unsigned char *p;
    size_t stride;
    int32_t rows, bytes;
} kv_ahead;

/* Nothing to ask for: the calls on a block after its first. */
static const kv_ahead kv_no_ahead = {0};

/* A walk through the lines (64 bytes) of `a`, row by row: a kernel asks for
 * the next few at each step of its work, a share it fixes once per call.
 * Rows that follow one another (a page's rows of one head) are walked as one:
 * a pointer and its end, a few instructions a line. */
typedef struct {
    const unsigned char *at, *end; /* the lines of the current row not yet asked for */
    const unsigned char *row;      /* where it starts */
    size_t stride;
    int32_t rows_left, bytes;      /* rows after the current one, of `bytes` each */
} kv_ahead_walk;

static inline int32_t kv_ahead_row_lines(const kv_ahead *a) { return (a->bytes + 63) / 64; }
static inline kv_ahead_walk kv_ahead_start(const kv_ahead *a) {
    if (a->rows <= 0) return (kv_ahead_walk){0};
    const bool whole = a->stride == (size_t)a->bytes;
    return (kv_ahead_walk){.at = a->p, .end = a->p + (size_t)a->bytes * (whole ? (size_t)a->rows : 1),
                           .row = a->p, .stride = a->stride, .rows_left = whole ? 0 : a->rows - 1,
                           .bytes = a->bytes};
}

/* Lines of `a` in all. */
static inline int32_t kv_ahead_lines(const kv_ahead *a) { return a->rows * kv_ahead_row_lines(a); }

/* Lines a step of `steps` asks for, so that they cover all of `a` (0 for no steps). */
static inline int32_t kv_ahead_step(const kv_ahead *a, int32_t steps) {
    return steps > 0 ? (kv_ahead_lines(a) + steps - 1) / steps : 0;
}

/* Asks for the next n lines (as far as there are any). */
static inline void kv_ahead_next(kv_ahead_walk *w, int32_t n) {
    for (; n > 0; n--) {
        if (w->at >= w->end) {
            if (w->rows_left == 0) return;
            w->rows_left--, w->row += w->stride, w->at = w->row, w->end = w->row + w->bytes;
        }
        __builtin_prefetch(w->at, 0, 2);
        w->at += 64;
    }
}

/* Asks for rows r0 .. r1 - 1 of `a` (as far as it has them). A loop of its
 * own, not a walk: inside the AVX2 kernels' passes the walk's per-line
 * bookkeeping cost them half their speed. */
static inline void kv_ahead_rows(const kv_ahead *a, int32_t r0, int32_t r1) {
    if (r1 > a->rows) r1 = a->rows;
    for (int32_t r = r0; r < r1; r++)
        for (int32_t o = 0; o < a->bytes; o += 64) __builtin_prefetch(a->p + (size_t)r * a->stride + o, 0, 2);
}

typedef struct {
    const char *name;
    /* dst [n][d] = n rows of `dtype` starting at src, `stride` bytes apart
     * (KV_Q8: times scales[j]) */
    void (*load_rows)(kv_dtype dtype, const unsigned char *src, size_t stride, const float *scales,
                      int32_t n, int32_t d, float *dst);
    /* s[i * lds + j] = q[i] . k[j] for i < nv, j < n; q [nv][d], k [n][d] */
    void (*dot_rows)(const float *q, int32_t nv, const float *k, int32_t n, int32_t d, float *s,
                     int32_t lds);
    /* s[j] = exp(s[j] - mx) for j < n; returns their sum */
    float (*exp_sum)(float *s, int32_t n, float mx);
    /* acc [d] = acc * corr + sum_j p[j] v[j], v [n][d] */
    void (*axpy_rows)(const float *p, const float *v, int32_t n, int32_t d, float corr, float *acc);
    /* Decode-shaped work straight from storage (NULL if absent), in two
     * halves so that a caller can read every head's K of a page, then every
     * head's V: the online-softmax update of nv <= KV_DECODE_VECS query
     * vectors q [nv][d] (d % 16 == 0) with n <= 16 keys. decode_scores reads
     * the K rows (from k, `stride` bytes apart; KV_Q8: times ks[j]), lets
     * vector i see keys lo[i]..hi[i] (none when lo > hi), updates its running
     * max m[i] and sum l[i], and leaves the weights in w [nv][16] (times vs[j]
     * for KV_Q8) and the rescaling of the old state in corr [nv];
     * decode_values then sets acc [nv][d] = acc * corr + sum_j w[j] v[j]
     * over the visible keys lo[i]..hi[i] only (a key a vector does not see
     * never touches it, even when its V holds a NaN: no 0 * NaN).
     * Both ask for the rows of `ahead` (the traversal's next slots) a few at
     * a time while they compute. */
    void (*decode_scores)(kv_dtype dtype, const float *q, int32_t nv, int32_t d, const unsigned char *k,
                          size_t stride, const float *ks, const float *vs, int32_t n, const int32_t *lo,
                          const int32_t *hi, float *m, float *l, float (*w)[16], float *corr, const kv_ahead *ahead);
    void (*decode_values)(kv_dtype dtype, int32_t nv, int32_t d, const unsigned char *v, size_t stride, int32_t n,
                          const int32_t *lo, const int32_t *hi, float (*w)[16], float *corr, float *acc,
                          const kv_ahead *ahead);
    /* decode_scores for KV_Q8 from int16 queries (NULL if absent): query
     * vector i as qs[i] * qi[i] (qi [nv][d], |qi| <= 32767, d % 32 == 0),
     * whose dot products with the int8 K rows are exact integer sums. */
    void (*decode_scores_q8i)(const int16_t *qi, const float *qs, int32_t nv, int32_t d, const unsigned char *k,
                              size_t stride, const float *ks, const float *vs, int32_t n, const int32_t *lo,
                              const int32_t *hi, float *m, float *l, float (*w)[16], float *corr,
                              const kv_ahead *ahead);
    /* Prefill-shaped work (NULL if absent): the online-softmax update of nv
     * query vectors, given transposed as qt [d][ldq] (ldq: nv rounded up to 16,
     * d % 16 == 0), with n keys at absolute positions j0.. in k and v [n][d]
     * (f32). Vector i sits at pos[i] and sees keys pos[i] - window < j <=
     * pos[i]; m, l [ldq] and acc [nv][d] are its running state; s is scratch
     * of n x ldq floats. */
    void (*tile_block)(const float *qt, int32_t nv, int32_t ldq, int32_t d, const float *k, const float *v,
                       int32_t n, int32_t j0, const int32_t *pos, int32_t window, float *m, float *l, float *acc,
                       float *s);
    /* tile_block's qt from n <= ldq query vectors (ldq % 16 == 0, d % 16 ==
     * 0): qt[e][i] = scale * rows[i][e], 0 for the lanes i >= n (NULL where
     * tile_block is). */
    void (*tile_q)(const float *const *rows, int32_t n, int32_t d, float scale, int32_t ldq, float *qt);
} kv_simd;

enum { KV_DECODE_VECS = 8 };

/* switch (dtype) { case T: switch (nv) { case NV: CALL(T, NV) } } for every
 * storage type T and vector count NV <= KV_DECODE_VECS, so that the SIMD
 * files instantiate their decode kernels with both known at compile time. */
#define KV_DECODE_NV(CALL, T, NV) case NV: CALL(T, NV); break;
#define KV_DECODE_T(CALL, T)                                                                    \
    case T:                                                                                     \
        switch (nv) {                                                                           \
            KV_DECODE_NV(CALL, T, 1) KV_DECODE_NV(CALL, T, 2) KV_DECODE_NV(CALL, T, 3)          \
            KV_DECODE_NV(CALL, T, 4) KV_DECODE_NV(CALL, T, 5) KV_DECODE_NV(CALL, T, 6)          \
            KV_DECODE_NV(CALL, T, 7) KV_DECODE_NV(CALL, T, 8)                                   \
        }                                                                                       \
        break;
#define KV_DECODE_SWITCH(CALL)                                                                  \
    switch (t) {                                                                                \
        KV_DECODE_T(CALL, KV_F32) KV_DECODE_T(CALL, KV_F16) KV_DECODE_T(CALL, KV_BF16)          \
        KV_DECODE_T(CALL, KV_Q8)                                                                \
    default: break;                                                                             \
    }

/* Whether the `count` tile vectors at pos[0..count) (positions that never
 * fall along the lanes) all see every one of the n keys from j0: then the
 * tile kernels need no visibility masks for them. */
static inline bool kv_tile_sees_all(const int32_t *pos, int32_t count, int32_t j0, int32_t n, int32_t window) {
    return j0 + n - 1 <= pos[0] && (window == 0 || j0 > pos[count - 1] - window);
}

/* Whether every vector sees the same keys lo[0]..hi[0] of a block (T = 1,
 * or every row past the block): then one pass serves them all. */
static inline bool kv_block_uniform(int32_t nv, const int32_t *lo, const int32_t *hi) {
    for (int32_t i = 1; i < nv; i++)
        if (lo[i] != lo[0] || hi[i] != hi[0]) return false;
    return true;
}

const kv_simd *kv_simd_active(void);
extern const kv_simd kv_simd_scalar;
const kv_simd *kv_simd_avx2(void);   /* NULL when not compiled in */
const kv_simd *kv_simd_avx512(void);

#endif
