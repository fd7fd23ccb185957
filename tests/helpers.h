/* tests/helpers.h - small drivers the library tests share. */
#ifndef KV_TEST_HELPERS_H
#define KV_TEST_HELPERS_H

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kvcache.h"
#include "ref.h"
#include "test.h"

/* n random normals (times scale) */
static inline double *rand_normal(test_rng *r, size_t n, double scale) {
    double *a = malloc(sizeof(double) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) a[i] = test_rng_normal(r) * scale;
    return a;
}

static inline float *to_f32(const double *a, size_t n) {
    float *f = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) f[i] = (float)a[i];
    return f;
}

/* a, rounded through f32 (so the oracle sees exactly what an f32 call sees) */
static inline void round_f32(double *a, size_t n) {
    for (size_t i = 0; i < n; i++) a[i] = (float)a[i];
}

/* The largest error the KV_Q8 integer scores of the AVX-512 kernels may add
 * to an output (src/attend.c, quantize_queries): a query element, scaled by
 * 1/sqrt(d), is off by at most qs/2, qs = max |q| / sqrt(d) / 32767; a score
 * so by at most qs/2 |k_j|_1; an output, a softmax average of V, by at most
 * twice the largest score error times max |v|. q [nq], k and v [nkv] (rows
 * of d); non-finite elements are left out. */
static inline double q8i_output_bound(const double *q, size_t nq, const double *k, const double *v, size_t nkv,
                                      int d) {
    double qmax = 0, k1 = 0, vmax = 0;
    for (size_t i = 0; i < nq; i++)
        if (isfinite(q[i])) qmax = fmax(qmax, fabs(q[i]) / sqrt(d));
    for (size_t r = 0; r < nkv / (size_t)d; r++) {
        double n1 = 0;
        for (int e = 0; e < d; e++) {
            const double x = k[r * d + e], y = v[r * d + e];
            if (isfinite(x)) n1 += fabs(x);
            if (isfinite(y)) vmax = fmax(vmax, fabs(y));
        }
        k1 = fmax(k1, n1);
    }
    return qmax / 32767 * k1 * vmax;
}

/* Whether the selected kernels take KV_Q8 scores from int16 queries. */
static inline bool int16_queries(kv_dtype t) { return t == KV_Q8 && strcmp(kv_simd_name(), "avx512") == 0; }

static inline kv_batch one_seq(const int32_t *seq, int32_t *rows2, int32_t t) {
    rows2[0] = 0;
    rows2[1] = t;
    return (kv_batch){.n_seqs = 1, .seqs = seq, .row_start = rows2};
}

/* Reserve t positions of seq (token ids, or NULL), then one kv_step over
 * x [t, D] -> out [t, H*d]. */
static inline int step_tokens_f64(kv_cache *c, int32_t seq, const kv_layer *L, int32_t t,
                                  const int32_t *tokens, const double *x, double *out) {
    int rc = kv_seq_reserve(c, seq, t, tokens);
    if (rc) return rc;
    int32_t rows[2];
    kv_batch b = one_seq(&seq, rows, t);
    double *scratch = malloc(sizeof(double) * (kv_step_scratch(c, L, t) + 1));
    rc = kv_step_f64(c, L, &b, x, out, scratch);
    free(scratch);
    return rc;
}

static inline int step_seq_f64(kv_cache *c, int32_t seq, const kv_layer *L, int32_t t,
                               const double *x, double *out) {
    return step_tokens_f64(c, seq, L, t, NULL, x, out);
}

static inline int step_seq_f32(kv_cache *c, int32_t seq, const kv_layer *L, int32_t t,
                               const float *x, float *out) {
    int rc = kv_seq_reserve(c, seq, t, NULL);
    if (rc) return rc;
    int32_t rows[2];
    kv_batch b = one_seq(&seq, rows, t);
    float *scratch = malloc(sizeof(float) * (kv_step_scratch(c, L, t) + 1));
    rc = kv_step_f32(c, L, &b, x, out, scratch);
    free(scratch);
    return rc;
}

#endif
