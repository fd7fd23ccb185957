/* src/simd_avx2.c - the attention primitives (see simd.h) for AVX2 + FMA +
 * F16C: 8 lanes. Compiled with those flags whatever MARCH says; used only
 * when the CPU reports them. */
#include "simd.h"
#include "cpu.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

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
 * exponent field (x is clamped so that n stays within the normal range). */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3f));
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

static const kv_simd avx2 = {"avx2", load_rows, dot_rows, exp_sum, axpy_rows, NULL, NULL, NULL};

const kv_simd *kv_simd_avx2(void) { return kv_cpu_avx2() ? &avx2 : NULL; }
#else
const kv_simd *kv_simd_avx2(void) { return NULL; }
#endif
