/* src/simd_avx2.c - the attention primitives (see simd.h) for AVX2 + FMA +
 * F16C: 8 lanes. Compiled with those flags whatever MARCH says; used only
 * when the CPU reports them. */
#include "simd.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>

static void load_rows(kv_dtype t, const unsigned char *src, size_t stride, const float *scales,
                      int32_t n, int32_t d, float *dst) {
    const int32_t dv = d & ~7;
    for (int32_t j = 0; j < n; j++) {
        const unsigned char *row = src + (size_t)j * stride;
        float *out = dst + (size_t)j * d;
        int32_t e = 0;
        switch (t) {
        case KV_F16:
            for (; e < dv; e += 8)
                _mm256_storeu_ps(out + e, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * e))));
            break;
        case KV_BF16:
            for (; e < dv; e += 8) {
                __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * e)));
                _mm256_storeu_ps(out + e, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
            }
            break;
        case KV_Q8: {
            const __m256 s = _mm256_set1_ps(scales[j]);
            for (; e < dv; e += 8) {
                __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + e)));
                _mm256_storeu_ps(out + e, _mm256_mul_ps(s, _mm256_cvtepi32_ps(w)));
            }
            break;
        }
        default: break;
        }
        if (e < d) kv_load_row(t, row + (size_t)e * kv_dtype_size(t), scales ? scales[j] : 1.0f, out + e, d - e);
    }
}

static inline float hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

static void dot_rows(const float *q, int32_t nv, const float *k, int32_t n, int32_t d, float *s,
                     int32_t lds) {
    const int32_t dv = d & ~7;
    for (int32_t i = 0; i < nv; i++) {
        const float *qi = q + (size_t)i * d;
        int32_t j = 0;
        for (; j + 4 <= n; j += 4) {
            const float *k0 = k + (size_t)j * d, *k1 = k0 + d, *k2 = k1 + d, *k3 = k2 + d;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int32_t e = 0; e < dv; e += 8) {
                __m256 qv = _mm256_loadu_ps(qi + e);
                a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + e), a0);
                a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + e), a1);
                a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + e), a2);
                a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + e), a3);
            }
            float r[4] = {hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3)};
            for (int32_t e = dv; e < d; e++) {
                r[0] += qi[e] * k0[e], r[1] += qi[e] * k1[e];
                r[2] += qi[e] * k2[e], r[3] += qi[e] * k3[e];
            }
            memcpy(s + (size_t)i * lds + j, r, sizeof r);
        }
        for (; j < n; j++) {
            const float *kj = k + (size_t)j * d;
            __m256 a = _mm256_setzero_ps();
            for (int32_t e = 0; e < dv; e += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(qi + e), _mm256_loadu_ps(kj + e), a);
            float r = hsum8(a);
            for (int32_t e = dv; e < d; e++) r += qi[e] * kj[e];
            s[(size_t)i * lds + j] = r;
        }
    }
}

/* e^x: 2^n e^r with |r| <= ln2/2 and a degree-6 polynomial; 2^n built in the
 * exponent field (x is clamped so that n stays within the normal range). NaN
 * and -inf give NaN (simd.h, kv_weight_exp): x + x * 0, and max/min return
 * their second operand when either is NaN, so the constant goes first. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_fmadd_ps(x, _mm256_setzero_ps(), x);
    x = _mm256_max_ps(_mm256_set1_ps(KV_EXP_FLOOR), x);
    x = _mm256_min_ps(_mm256_set1_ps(88.3f), x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i pow2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(pow2));
}

static float exp_sum(float *s, int32_t n, float mx) {
    const __m256 m = _mm256_set1_ps(mx);
    __m256 sum = _mm256_setzero_ps();
    int32_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), m));
        _mm256_storeu_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    float total = hsum8(sum);
    if (j < n) { /* the tail through a zero-padded buffer */
        float t[8] = {0};
        memcpy(t, s + j, sizeof(float) * (size_t)(n - j));
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(t), m));
        _mm256_storeu_ps(t, e);
        for (int32_t i = 0; i < n - j; i++) total += s[j + i] = t[i];
    }
    return total;
}

static void axpy_rows(const float *p, const float *v, int32_t n, int32_t d, float corr, float *acc) {
    const __m256 c = _mm256_set1_ps(corr);
    int32_t e = 0;
    for (; e + 32 <= d; e += 32) {
        __m256 a0 = _mm256_mul_ps(c, _mm256_loadu_ps(acc + e)), a1 = _mm256_mul_ps(c, _mm256_loadu_ps(acc + e + 8));
        __m256 a2 = _mm256_mul_ps(c, _mm256_loadu_ps(acc + e + 16)), a3 = _mm256_mul_ps(c, _mm256_loadu_ps(acc + e + 24));
        for (int32_t j = 0; j < n; j++) {
            const float *vj = v + (size_t)j * d + e;
            __m256 pj = _mm256_set1_ps(p[j]);
            a0 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj), a0);
            a1 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8), a1);
            a2 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 16), a2);
            a3 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 24), a3);
        }
        _mm256_storeu_ps(acc + e, a0);
        _mm256_storeu_ps(acc + e + 8, a1);
        _mm256_storeu_ps(acc + e + 16, a2);
        _mm256_storeu_ps(acc + e + 24, a3);
    }
    for (; e + 8 <= d; e += 8) {
        __m256 a = _mm256_mul_ps(c, _mm256_loadu_ps(acc + e));
        for (int32_t j = 0; j < n; j++) a = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + (size_t)j * d + e), a);
        _mm256_storeu_ps(acc + e, a);
    }
    for (; e < d; e++) {
        float a = acc[e] * corr;
        for (int32_t j = 0; j < n; j++) a += p[j] * v[(size_t)j * d + e];
        acc[e] = a;
    }
}

/* ------------------------------------------------------------------ decode */

/* 8 elements of a stored row as floats; KV_Q8 unscaled (its scales go on the
 * scores and the weights). F16 through vcvtph2ps, the widest conversion AVX2
 * machines have (no AVX-512 FP16 here). */
static inline __m256 load8(kv_dtype t, const unsigned char *row, int32_t e) {
    switch (t) {
    case KV_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * e)));
    case KV_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * e))), 16));
    case KV_Q8: return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + e))));
    default: return _mm256_loadu_ps((const float *)row + e);
    }
}

#define DECODE_INLINE static inline __attribute__((always_inline)) void

/* Raw scores s[i][j] = q[i] . k[j], j < n, of NV <= 4 vectors: keys in pairs,
 * each converted once against every vector, the vectors read from L1 (four of
 * them do not fit the 16 registers); four keys share one horizontal sum. */
DECODE_INLINE dots_impl(const kv_dtype t, const int32_t NV, const float *q, int32_t d, const unsigned char *k,
                        size_t stride, int32_t n, float (*s)[16]) {
    int32_t j = 0;
    for (; j + 4 <= n; j += 4) {
        __m256 h[2][4];
#pragma GCC unroll 2
        for (int32_t half = 0; half < 2; half++) {
            const unsigned char *r0 = k + (size_t)(j + 2 * half) * stride, *r1 = r0 + stride;
            __m256 a0[4], a1[4];
#pragma GCC unroll 4
            for (int32_t i = 0; i < NV; i++) a0[i] = a1[i] = _mm256_setzero_ps();
            for (int32_t e = 0; e < d; e += 8) {
                const __m256 k0 = load8(t, r0, e), k1 = load8(t, r1, e);
#pragma GCC unroll 4
                for (int32_t i = 0; i < NV; i++) {
                    const __m256 qv = _mm256_loadu_ps(q + (size_t)i * d + e);
                    a0[i] = _mm256_fmadd_ps(qv, k0, a0[i]);
                    a1[i] = _mm256_fmadd_ps(qv, k1, a1[i]);
                }
            }
#pragma GCC unroll 4
            for (int32_t i = 0; i < NV; i++) h[half][i] = _mm256_hadd_ps(a0[i], a1[i]);
        }
#pragma GCC unroll 4
        for (int32_t i = 0; i < NV; i++) { /* [k0 k1 k2 k3] partial sums in each 128-bit half */
            const __m256 x = _mm256_hadd_ps(h[0][i], h[1][i]);
            _mm_storeu_ps(&s[i][j], _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1)));
        }
    }
    for (; j < n; j++) {
        const unsigned char *row = k + (size_t)j * stride;
        __m256 a[4];
#pragma GCC unroll 4
        for (int32_t i = 0; i < NV; i++) a[i] = _mm256_setzero_ps();
        for (int32_t e = 0; e < d; e += 8) {
            const __m256 kv = load8(t, row, e);
#pragma GCC unroll 4
            for (int32_t i = 0; i < NV; i++) a[i] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)i * d + e), kv, a[i]);
        }
#pragma GCC unroll 4
        for (int32_t i = 0; i < NV; i++) s[i][j] = hsum8(a[i]);
    }
}

static inline float hmax8(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

DECODE_INLINE scores_impl(const kv_dtype t, const int32_t nv, const float *q, int32_t d, const unsigned char *k,
                          size_t stride, const float *ks, const float *vs, int32_t n, const int32_t *lo,
                          const int32_t *hi, float *m, float *l, float (*s)[16], float *corr) {
    dots_impl(t, nv < 4 ? nv : 4, q, d, k, stride, n, s);
    if (nv > 4) dots_impl(t, nv - 4, q + 4 * (size_t)d, d, k, stride, n, s + 4);
    const __m256i iota0 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), iota1 = _mm256_add_epi32(iota0, _mm256_set1_epi32(8));
    for (int32_t i = 0; i < nv; i++) {
        if (lo[i] > hi[i]) { /* sees none of the block: state unchanged, values skip it */
            corr[i] = 1.0f;
            continue;
        }
        /* visible lanes lo <= j <= hi; the others are never loaded */
        const __m256i vlo = _mm256_set1_epi32(lo[i] - 1), vhi = _mm256_set1_epi32(hi[i] + 1);
        const __m256i vis0 = _mm256_and_si256(_mm256_cmpgt_epi32(iota0, vlo), _mm256_cmpgt_epi32(vhi, iota0));
        const __m256i vis1 = _mm256_and_si256(_mm256_cmpgt_epi32(iota1, vlo), _mm256_cmpgt_epi32(vhi, iota1));
        __m256 s0 = _mm256_maskload_ps(s[i], vis0), s1 = _mm256_maskload_ps(s[i] + 8, vis1);
        if (ks) s0 = _mm256_mul_ps(s0, _mm256_maskload_ps(ks, vis0)), s1 = _mm256_mul_ps(s1, _mm256_maskload_ps(ks + 8, vis1));
        const __m256 ninf = _mm256_set1_ps(-INFINITY);
        /* a NaN score may drop out of the max; its weight below is NaN anyway */
        float mx = hmax8(_mm256_max_ps(_mm256_blendv_ps(ninf, s0, _mm256_castsi256_ps(vis0)),
                                       _mm256_blendv_ps(ninf, s1, _mm256_castsi256_ps(vis1))));
        mx = mx > m[i] ? mx : m[i]; /* a NaN m (poisoned before) stays */
        corr[i] = kv_corr_exp(m[i], mx);
        const __m256 mv = _mm256_set1_ps(mx);
        __m256 p0 = _mm256_and_ps(_mm256_castsi256_ps(vis0), exp8(_mm256_sub_ps(s0, mv)));
        __m256 p1 = _mm256_and_ps(_mm256_castsi256_ps(vis1), exp8(_mm256_sub_ps(s1, mv)));
        l[i] = l[i] * corr[i] + hsum8(_mm256_add_ps(p0, p1));
        m[i] = mx;
        if (vs) p0 = _mm256_mul_ps(p0, _mm256_maskload_ps(vs, vis0)), p1 = _mm256_mul_ps(p1, _mm256_maskload_ps(vs + 8, vis1));
        _mm256_storeu_ps(s[i], p0);
        _mm256_storeu_ps(s[i] + 8, p1);
    }
}

/* acc = acc * corr + sum_j w[i][j] v[j] over keys jlo..jhi, which each of the
 * NV <= 4 vectors sees: 16 dims of every vector in registers while the V rows
 * stream past, each converted once. */
DECODE_INLINE values_group(const kv_dtype t, const int32_t NV, int32_t d, const unsigned char *v, size_t stride,
                           int32_t jlo, int32_t jhi, float (*w)[16], const float *corr, float *acc) {
    for (int32_t e = 0; e < d; e += 16) {
        __m256 a0[4], a1[4];
#pragma GCC unroll 4
        for (int32_t i = 0; i < NV; i++) {
            const __m256 c = _mm256_set1_ps(corr[i]);
            a0[i] = _mm256_mul_ps(c, _mm256_loadu_ps(acc + (size_t)i * d + e));
            a1[i] = _mm256_mul_ps(c, _mm256_loadu_ps(acc + (size_t)i * d + e + 8));
        }
        for (int32_t jv = jlo; jv <= jhi; jv++) {
            const unsigned char *row = v + (size_t)jv * stride;
            const __m256 v0 = load8(t, row, e), v1 = load8(t, row, e + 8);
#pragma GCC unroll 4
            for (int32_t i = 0; i < NV; i++) {
                const __m256 p = _mm256_broadcast_ss(&w[i][jv]);
                a0[i] = _mm256_fmadd_ps(p, v0, a0[i]);
                a1[i] = _mm256_fmadd_ps(p, v1, a1[i]);
            }
        }
#pragma GCC unroll 4
        for (int32_t i = 0; i < NV; i++) {
            _mm256_storeu_ps(acc + (size_t)i * d + e, a0[i]);
            _mm256_storeu_ps(acc + (size_t)i * d + e + 8, a1[i]);
        }
    }
}

DECODE_INLINE values_impl(const kv_dtype t, const int32_t nv, int32_t d, const unsigned char *v, size_t stride,
                          int32_t jlo, int32_t jhi, float (*w)[16], const float *corr, float *acc) {
    values_group(t, nv < 4 ? nv : 4, d, v, stride, jlo, jhi, w, corr, acc);
    if (nv > 4) values_group(t, nv - 4, d, v, stride, jlo, jhi, w + 4, corr + 4, acc + 4 * (size_t)d);
}

static void decode_scores(kv_dtype t, const float *q, int32_t nv, int32_t d, const unsigned char *k, size_t stride,
                          const float *ks, const float *vs, int32_t n, const int32_t *lo, const int32_t *hi,
                          float *m, float *l, float (*w)[16], float *corr) {
#define SCORES(T, NV) scores_impl(T, NV, q, d, k, stride, ks, vs, n, lo, hi, m, l, w, corr)
    KV_DECODE_SWITCH(SCORES)
#undef SCORES
}

static void decode_values(kv_dtype t, int32_t nv, int32_t d, const unsigned char *v, size_t stride, int32_t n,
                          const int32_t *lo, const int32_t *hi, float (*w)[16], float *corr, float *acc) {
    if (kv_block_uniform(nv, lo, hi)) {
        if (lo[0] > hi[0]) return;
#define VALUES(T, NV) values_impl(T, NV, d, v, stride, lo[0], hi[0], w, corr, acc)
        KV_DECODE_SWITCH(VALUES)
#undef VALUES
        return;
    }
    /* vectors that see different keys (rows of a short prefill, a window's
     * edge): one at a time, each over its own keys */
    for (int32_t i = 0; i < nv; i++) {
        if (lo[i] > hi[i]) continue;
#define ONE(T) case T: values_group(T, 1, d, v, stride, lo[i], hi[i], &w[i], &corr[i], acc + (size_t)i * d); break;
        switch (t) { ONE(KV_F32) ONE(KV_F16) ONE(KV_BF16) ONE(KV_Q8) default: break; }
#undef ONE
    }
    (void)n;
}

static const kv_simd avx2 = {"avx2", load_rows, dot_rows, exp_sum, axpy_rows, decode_scores, decode_values, NULL};

const kv_simd *kv_simd_avx2(void) {
    __builtin_cpu_init();
    unsigned a, b, c, d; /* F16C: CPUID leaf 1, ECX bit 29 (not every compiler names it) */
    bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
    bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    return ok ? &avx2 : NULL;
}
#else
const kv_simd *kv_simd_avx2(void) { return NULL; }
#endif
