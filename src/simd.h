/* src/simd.h - the few primitives the FP32 attention kernel is built from,
 * with a portable scalar version and AVX2+FMA and AVX-512 versions picked at
 * run time by CPU feature (or by KVCACHE_SIMD / kv_simd_select). */
#ifndef KV_SIMD_H
#define KV_SIMD_H

#include "internal.h"

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
     * decode_values then sets acc [nv][d] = acc * corr + sum_j w[j] v[j]. */
    void (*decode_scores)(kv_dtype dtype, const float *q, int32_t nv, int32_t d, const unsigned char *k,
                          size_t stride, const float *ks, const float *vs, int32_t n, const int32_t *lo,
                          const int32_t *hi, float *m, float *l, float (*w)[16], float *corr);
    void (*decode_values)(kv_dtype dtype, int32_t nv, int32_t d, const unsigned char *v, size_t stride, int32_t n,
                          float (*w)[16], float *corr, float *acc);
    /* Prefill-shaped work (NULL if absent): the online-softmax update of nv
     * query vectors, given transposed as qt [d][ldq] (ldq: nv rounded up to 16,
     * d % 16 == 0), with n keys at absolute positions j0.. in k and v [n][d]
     * (f32). Vector i sits at pos[i] and sees keys pos[i] - window < j <=
     * pos[i]; m, l [ldq] and acc [nv][d] are its running state; s is scratch
     * of n x ldq floats. */
    void (*tile_block)(const float *qt, int32_t nv, int32_t ldq, int32_t d, const float *k, const float *v,
                       int32_t n, int32_t j0, const int32_t *pos, int32_t window, float *m, float *l, float *acc,
                       float *s);
} kv_simd;

enum { KV_DECODE_VECS = 8 };

const kv_simd *kv_simd_active(void);
extern const kv_simd kv_simd_scalar;
const kv_simd *kv_simd_avx2(void);   /* NULL when not compiled in */
const kv_simd *kv_simd_avx512(void);

#endif
