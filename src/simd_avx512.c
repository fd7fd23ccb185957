/* src/simd_avx512.c - the attention primitives (see simd.h) for AVX-512
 * (F, BW, VL, DQ): 16 lanes, F16 via vcvtph2ps, Q8 via sign extension. This
 * file is compiled with -mavx512f... whatever MARCH says; it is used only
 * when the CPU reports those features. */
#include "simd.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>

static void load_rows(kv_dtype t, const unsigned char *src, size_t stride, const float *scales,
                      int32_t n, int32_t d, float *dst) {
    const int32_t dv = d & ~15;
    for (int32_t j = 0; j < n; j++) {
        const unsigned char *row = src + (size_t)j * stride;
        float *out = dst + (size_t)j * d;
        int32_t e = 0;
        switch (t) {
        case KV_F16:
            for (; e < dv; e += 16)
                _mm512_storeu_ps(out + e, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * e))));
            break;
        case KV_BF16:
            for (; e < dv; e += 16) {
                __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + 2 * e)));
                _mm512_storeu_ps(out + e, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
            }
            break;
        case KV_Q8: {
            const __m512 s = _mm512_set1_ps(scales[j]);
            for (; e < dv; e += 16) {
                __m512i w = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + e)));
                _mm512_storeu_ps(out + e, _mm512_mul_ps(s, _mm512_cvtepi32_ps(w)));
            }
            break;
        }
        default: break;
        }
        if (e < d) kv_load_row(t, row + (size_t)e * kv_dtype_size(t), scales ? scales[j] : 1.0f, out + e, d - e);
    }
}

static inline __m512 load_tail(const float *p, int32_t e, int32_t d) {
    return d - e >= 16 ? _mm512_loadu_ps(p + e) : _mm512_maskz_loadu_ps((__mmask16)((1u << (d - e)) - 1), p + e);
}

static void dot_rows(const float *q, int32_t nv, const float *k, int32_t n, int32_t d, float *s,
                     int32_t lds) {
    for (int32_t i = 0; i < nv; i++) {
        const float *qi = q + (size_t)i * d;
        int32_t j = 0;
        for (; j + 4 <= n; j += 4) { /* four keys at once: four independent FMA chains */
            const float *k0 = k + (size_t)j * d, *k1 = k0 + d, *k2 = k1 + d, *k3 = k2 + d;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int32_t e = 0; e < d; e += 16) {
                __m512 qv = load_tail(qi, e, d);
                a0 = _mm512_fmadd_ps(qv, load_tail(k0, e, d), a0);
                a1 = _mm512_fmadd_ps(qv, load_tail(k1, e, d), a1);
                a2 = _mm512_fmadd_ps(qv, load_tail(k2, e, d), a2);
                a3 = _mm512_fmadd_ps(qv, load_tail(k3, e, d), a3);
            }
            float *si = s + (size_t)i * lds + j;
            si[0] = _mm512_reduce_add_ps(a0);
            si[1] = _mm512_reduce_add_ps(a1);
            si[2] = _mm512_reduce_add_ps(a2);
            si[3] = _mm512_reduce_add_ps(a3);
        }
        for (; j < n; j++) {
            const float *kj = k + (size_t)j * d;
            __m512 a = _mm512_setzero_ps();
            for (int32_t e = 0; e < d; e += 16) a = _mm512_fmadd_ps(load_tail(qi, e, d), load_tail(kj, e, d), a);
            s[(size_t)i * lds + j] = _mm512_reduce_add_ps(a);
        }
    }
}

/* e^x for x <= 0 (and moderately above): 2^n e^r, |r| <= ln2/2, degree-6
 * Taylor polynomial (relative error < 2e-7); inputs below -87.3 give ~1e-38
 * instead of underflowing through the exponent field. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    x = _mm512_min_ps(x, _mm512_set1_ps(88.3f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

static float exp_sum(float *s, int32_t n, float mx) {
    const __m512 m = _mm512_set1_ps(mx);
    __m512 sum = _mm512_setzero_ps();
    int32_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), m));
        _mm512_storeu_ps(s + j, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (j < n) {
        __mmask16 k = (__mmask16)((1u << (n - j)) - 1);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), m));
        _mm512_mask_storeu_ps(s + j, k, e);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, e));
    }
    return _mm512_reduce_add_ps(sum);
}

static void axpy_rows(const float *p, const float *v, int32_t n, int32_t d, float corr, float *acc) {
    const __m512 c = _mm512_set1_ps(corr);
    int32_t e = 0;
    for (; e + 64 <= d; e += 64) { /* four accumulators stay in registers over all rows */
        __m512 a0 = _mm512_mul_ps(c, _mm512_loadu_ps(acc + e)), a1 = _mm512_mul_ps(c, _mm512_loadu_ps(acc + e + 16));
        __m512 a2 = _mm512_mul_ps(c, _mm512_loadu_ps(acc + e + 32)), a3 = _mm512_mul_ps(c, _mm512_loadu_ps(acc + e + 48));
        for (int32_t j = 0; j < n; j++) {
            const float *vj = v + (size_t)j * d + e;
            __m512 pj = _mm512_set1_ps(p[j]);
            a0 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj), a0);
            a1 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 16), a1);
            a2 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 32), a2);
            a3 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 48), a3);
        }
        _mm512_storeu_ps(acc + e, a0);
        _mm512_storeu_ps(acc + e + 16, a1);
        _mm512_storeu_ps(acc + e + 32, a2);
        _mm512_storeu_ps(acc + e + 48, a3);
    }
    for (; e < d; e += 16) {
        __mmask16 k = d - e >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (d - e)) - 1);
        __m512 a = _mm512_mul_ps(c, _mm512_maskz_loadu_ps(k, acc + e));
        for (int32_t j = 0; j < n; j++)
            a = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_maskz_loadu_ps(k, v + (size_t)j * d + e), a);
        _mm512_mask_storeu_ps(acc + e, k, a);
    }
}

static const kv_simd avx512 = {"avx512", load_rows, dot_rows, exp_sum, axpy_rows};

const kv_simd *kv_simd_avx512(void) {
    __builtin_cpu_init();
    bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    return ok ? &avx512 : NULL;
}
#else
const kv_simd *kv_simd_avx512(void) { return NULL; }
#endif
