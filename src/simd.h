/* src/simd.h - the few primitives the FP32 attention kernel is built from,
 * with a portable scalar version (simd_scalar.c) and AVX2+FMA and AVX-512
 * versions, picked at run time by CPU feature (or by KVCACHE_SIMD /
 * kv_simd_select). The two vector versions are one source, simd_avx2.c,
 * written over the vector-width layer of simd_vec.h and compiled at 8 lanes
 * and again at 16 (simd_avx512.c). */
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

/* What a decode kernel asks the memory for while it computes: the bytes
 * [p, p + bytes) of the slot of the traversal a few ahead of its own (none
 * when bytes is 0), into L2 (prefetcht1): the core has far more L2 misses in
 * flight than L1 ones. With each of their lines, the same line of the slot
 * right after the kernel's own (`near` bytes on from it), into L1
 * (prefetcht0): the kernel's loads of lines in L2 still stalled it, and those
 * of the next slot then hit L1. Asked for a few lines at a time, at steps
 * spread over all of the kernel's work (its reductions and softmax too): all
 * at once, the requests overran the core's miss buffers and stalled it, and
 * bunched into its FMA loops they left the memory idle in between. Three
 * words of state: the kernels use every register they have, and a walk of
 * more (the rows and stride of a dense array) made them spill. */
typedef struct {
    const unsigned char *p;
    int32_t bytes;
    uintptr_t near;
} kv_ahead;

/* Nothing to ask for: the calls on a block after its first. */
static const kv_ahead kv_no_ahead = {0};

/* A walk through the lines (64 bytes) of a kv_ahead. */
typedef struct {
    const unsigned char *at, *end; /* the lines not yet asked for */
    uintptr_t near;
} kv_ahead_walk;

static inline kv_ahead_walk kv_ahead_start(const kv_ahead *a) {
    return (kv_ahead_walk){.at = a->p, .end = a->p + a->bytes, .near = a->near};
}

/* Lines of `a` in all. */
static inline int32_t kv_ahead_lines(const kv_ahead *a) { return (a->bytes + 63) / 64; }

/* Lines a step of `steps` asks for: as many as cover all of `a`, rounded
 * down (at least 1), so that the steps spread them over the kernel's work and
 * its end asks for the few left. */
static inline int32_t kv_ahead_step(const kv_ahead *a, int32_t steps) {
    const int32_t per = steps > 0 ? kv_ahead_lines(a) / steps : 0;
    return per > 1 ? per : 1;
}

/* Asks for the next n lines (as far as there are any), and the same lines
 * of the near slot. */
static inline void kv_ahead_next(kv_ahead_walk *w, int32_t n) {
    for (; n > 0 && w->at < w->end; n--, w->at += 64) {
        __builtin_prefetch(w->at, 0, 2);
        __builtin_prefetch((const void *)((uintptr_t)w->at + w->near), 0, 3);
    }
}

/* Asks for the lines of rows r0 .. r1 - 1 of `a`, as rows of row_bytes (as
 * far as it has them), and of the near slot. A loop of its own, not a walk:
 * inside the AVX2 kernels' passes the walk's per-line bookkeeping cost them
 * half their speed. */
static inline void kv_ahead_rows(const kv_ahead *a, int32_t row_bytes, int32_t r0, int32_t r1) {
    const int32_t end = r1 * row_bytes < a->bytes ? r1 * row_bytes : a->bytes;
    for (int32_t o = r0 * row_bytes; o < end; o += 64) {
        __builtin_prefetch(a->p + o, 0, 2);
        __builtin_prefetch((const void *)((uintptr_t)(a->p + o) + a->near), 0, 3);
    }
}

/* Asks for all of `a` and of the near slot at once. */
static inline void kv_ahead_all(const kv_ahead *a) { kv_ahead_rows(a, a->bytes, 0, 1); }

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
 * kernel storage type T (KV_KERNEL_TYPES) and vector count NV <= KV_DECODE_VECS, so that the SIMD
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
#define KV_DECODE_CASE_(CALL, T, ...) KV_DECODE_T(CALL, T)
#define KV_DECODE_SWITCH(CALL)                                                                  \
    switch (t) {                                                                                \
        KV_KERNEL_TYPES_WITH(KV_DECODE_CASE_, CALL)                                             \
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
