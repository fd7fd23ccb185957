/* src/simd_avx512.c - the attention primitives (see simd.h) for AVX-512
 * (F, BW, VL, DQ): 16 lanes, F16 via vcvtph2ps, Q8 via sign extension. This
 * file is compiled with -mavx512f... whatever MARCH says; it is used only
 * when the CPU reports those features. */
#include "simd.h"
#include "cpu.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#include <math.h>

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
        if (e < d)
            kv_load_row(t, row + (size_t)e * (size_t)kv_elem_bytes(t), scales ? scales + j : NULL, out + e, d - e);
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
 * instead of underflowing through the exponent field. NaN and -inf give NaN
 * (simd.h, kv_weight_exp): x + x * 0, and max/min return their second
 * operand when either is NaN, so the constant goes first. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_fmadd_ps(x, _mm512_setzero_ps(), x);
    x = _mm512_max_ps(_mm512_set1_ps(KV_EXP_FLOOR), x);
    x = _mm512_min_ps(_mm512_set1_ps(88.3f), x);
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

/* 16 elements of a stored row as floats (scale: KV_Q8 only). */
static inline __m512 load16(kv_dtype t, const unsigned char *row, int32_t e, __m512 scale) {
    switch (t) {
    case KV_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * e)));
    case KV_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + 2 * e))), 16));
    case KV_Q8: return _mm512_mul_ps(scale, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + e)))));
    default: return _mm512_loadu_ps((const float *)row + e);
    }
}

/* The kernels' inner parts, inlined where their counts (storage type,
 * vectors, keys or dims a step) are known at compile time, so that their
 * loops unroll and the accumulators stay in registers. */
#define KERNEL_INLINE static inline __attribute__((always_inline)) void

/* The online-softmax update of nv vectors with the raw scores s [nv][16] of
 * n keys: new max, rescale, weights (zero where not visible); q8's K scales
 * go on the scores, its V scales on the weights. A step of `walk` a vector. */
KERNEL_INLINE softmax_block(const int32_t nv, const float *ks, const float *vs, int32_t n, const int32_t *lo,
                            const int32_t *hi, float *m, float *l, float (*s)[16], float *corr, kv_ahead_walk *walk,
                            int32_t step) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __mmask16 keys = (__mmask16)((1u << n) - 1);
    const __m512 ksv = ks ? _mm512_maskz_loadu_ps(keys, ks) : one, vsv = vs ? _mm512_maskz_loadu_ps(keys, vs) : one;
#pragma GCC unroll 8
    for (int32_t i = 0; i < nv; i++) {
        kv_ahead_next(walk, step);
        if (lo[i] > hi[i]) {
            corr[i] = 1.0f;
            _mm512_storeu_ps(s[i], _mm512_setzero_ps());
            continue;
        }
        const __mmask16 vis = (__mmask16)(((1u << (hi[i] + 1)) - 1) & ~((1u << lo[i]) - 1));
        __m512 si = _mm512_maskz_loadu_ps(vis, s[i]);
        if (ks) si = _mm512_mul_ps(si, ksv);
        /* a finite max that no visible score passes (nor is NaN; most blocks)
         * stays, and rescales by exactly 1: no reduction, no exp */
        float mx = m[i];
        if (isfinite(mx) && !_mm512_mask_cmp_ps_mask(vis, si, _mm512_set1_ps(mx), _CMP_NLE_UQ)) {
            corr[i] = 1.0f;
        } else {
            mx = _mm512_mask_reduce_max_ps(vis, si);
            mx = mx > m[i] ? mx : m[i];
            corr[i] = mx == m[i] && isfinite(mx) ? 1.0f : kv_corr_exp(m[i], mx);
        }
        __m512 p = _mm512_maskz_mov_ps(vis, exp16(_mm512_sub_ps(si, _mm512_set1_ps(mx))));
        l[i] = l[i] * corr[i] + _mm512_reduce_add_ps(p);
        m[i] = mx;
        if (vs) p = _mm512_mul_ps(p, vsv);
        _mm512_storeu_ps(s[i], p);
    }
}

KERNEL_INLINE scores_impl(const kv_dtype t, const int32_t nv, const float *q, int32_t d, const unsigned char *k,
                          size_t stride, const float *ks, const float *vs, int32_t n, const int32_t *lo,
                          const int32_t *hi, float *m, float *l, float (*s)[16], float *corr, const kv_ahead *ahead) {
    const __m512 one = _mm512_set1_ps(1.0f); /* q8 scales are applied to scores and weights */
    /* scores: each K row converted once, dotted with every query vector; with
     * few vectors, four keys at a time so four dot products share one
     * reduction. The rows ahead: a step every 16 dims and every reduction,
     * and one a vector in the softmax. */
    const int32_t quads = nv <= 4 ? n / 4 : 0;
    kv_ahead_walk walk = kv_ahead_start(ahead);
    const int32_t step = kv_ahead_step(ahead, quads * (d / 16 + nv) + (n - 4 * quads) * (d / 16) + nv);
    int32_t j = 0;
    if (nv <= 4) {
        for (; j + 4 <= n; j += 4) {
            const unsigned char *r0 = k + (size_t)j * stride, *r1 = r0 + stride, *r2 = r1 + stride, *r3 = r2 + stride;
            __m512 a[4][4];
#pragma GCC unroll 4
            for (int32_t i = 0; i < nv; i++) a[i][0] = a[i][1] = a[i][2] = a[i][3] = _mm512_setzero_ps();
            for (int32_t e = 0; e < d; e += 16) {
                kv_ahead_next(&walk, step);
                __m512 k0 = load16(t, r0, e, one), k1 = load16(t, r1, e, one);
                __m512 k2 = load16(t, r2, e, one), k3 = load16(t, r3, e, one);
#pragma GCC unroll 4
                for (int32_t i = 0; i < nv; i++) {
                    __m512 qv = _mm512_loadu_ps(q + (size_t)i * d + e);
                    __asm__("" : "+v"(qv)); /* loaded once for the four keys: gcc would fold it into each FMA */
                    a[i][0] = _mm512_fmadd_ps(qv, k0, a[i][0]);
                    a[i][1] = _mm512_fmadd_ps(qv, k1, a[i][1]);
                    a[i][2] = _mm512_fmadd_ps(qv, k2, a[i][2]);
                    a[i][3] = _mm512_fmadd_ps(qv, k3, a[i][3]);
                }
            }
#pragma GCC unroll 4
            for (int32_t i = 0; i < nv; i++) {
                kv_ahead_next(&walk, step);
                /* four horizontal sums at once: pairwise interleave, then fold the 128-bit lanes */
                __m512 b0 = _mm512_add_ps(_mm512_unpacklo_ps(a[i][0], a[i][1]), _mm512_unpackhi_ps(a[i][0], a[i][1]));
                __m512 b1 = _mm512_add_ps(_mm512_unpacklo_ps(a[i][2], a[i][3]), _mm512_unpackhi_ps(a[i][2], a[i][3]));
                __m512 c = _mm512_add_ps(_mm512_shuffle_ps(b0, b1, _MM_SHUFFLE(1, 0, 1, 0)),
                                         _mm512_shuffle_ps(b0, b1, _MM_SHUFFLE(3, 2, 3, 2)));
                c = _mm512_add_ps(c, _mm512_shuffle_f32x4(c, c, _MM_SHUFFLE(1, 0, 3, 2)));
                c = _mm512_add_ps(c, _mm512_shuffle_f32x4(c, c, _MM_SHUFFLE(2, 3, 0, 1)));
                _mm_storeu_ps(&s[i][j], _mm512_castps512_ps128(c));
            }
        }
    }
    for (; j < n; j++) {
        const unsigned char *row = k + (size_t)j * stride;
        __m512 a[KV_DECODE_VECS];
#pragma GCC unroll 8
        for (int32_t i = 0; i < nv; i++) a[i] = _mm512_setzero_ps();
        for (int32_t e = 0; e < d; e += 16) {
            kv_ahead_next(&walk, step);
            __m512 kv = load16(t, row, e, one);
#pragma GCC unroll 8
            for (int32_t i = 0; i < nv; i++) a[i] = _mm512_fmadd_ps(_mm512_loadu_ps(q + (size_t)i * d + e), kv, a[i]);
        }
#pragma GCC unroll 8
        for (int32_t i = 0; i < nv; i++) s[i][j] = _mm512_reduce_add_ps(a[i]);
    }
    softmax_block(nv, ks, vs, n, lo, hi, m, l, s, corr, &walk, step);
    kv_ahead_next(&walk, kv_ahead_lines(ahead)); /* the rest */
}

/* acc = acc * corr + sum_j p_j v_j over keys jlo..jhi, which every vector
 * sees, for the NE x 16 dims from e: those dims of every vector in registers
 * while the V rows stream past, each converted once. */
KERNEL_INLINE values_pass(const kv_dtype t, const int32_t NV, const int32_t NE, int32_t d, const unsigned char *v,
                          size_t stride, int32_t e, int32_t jlo, int32_t jhi, float (*s)[16], const float *corr,
                          float *acc, kv_ahead_walk *walk, int32_t step) {
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 a[KV_DECODE_VECS][8];
#pragma GCC unroll 8
    for (int32_t i = 0; i < NV; i++) {
        const __m512 c = _mm512_set1_ps(corr[i]);
#pragma GCC unroll 8
        for (int32_t y = 0; y < NE; y++) a[i][y] = _mm512_mul_ps(c, _mm512_loadu_ps(acc + (size_t)i * d + e + 16 * y));
    }
    for (int32_t jv = jlo; jv <= jhi; jv++) {
        kv_ahead_next(walk, step);
        const unsigned char *row = v + (size_t)jv * stride;
        __m512 x[8];
#pragma GCC unroll 8
        for (int32_t y = 0; y < NE; y++) x[y] = load16(t, row, e + 16 * y, one);
#pragma GCC unroll 8
        for (int32_t i = 0; i < NV; i++) {
            const __m512 p = _mm512_set1_ps(s[i][jv]);
#pragma GCC unroll 8
            for (int32_t y = 0; y < NE; y++) a[i][y] = _mm512_fmadd_ps(p, x[y], a[i][y]);
        }
    }
#pragma GCC unroll 8
    for (int32_t i = 0; i < NV; i++)
#pragma GCC unroll 8
        for (int32_t y = 0; y < NE; y++) _mm512_storeu_ps(acc + (size_t)i * d + e + 16 * y, a[i][y]);
}

/* The passes over d (a multiple of 16): as many dims a pass as NV x NE
 * accumulators allow in 32 registers, then single 16s for the rest. The rows
 * of `ahead` are asked for a few lines a key, spread over the passes. */
KERNEL_INLINE values_impl(const kv_dtype t, const int32_t nv, int32_t d, const unsigned char *v, size_t stride,
                          int32_t jlo, int32_t jhi, float (*s)[16], const float *corr, float *acc,
                          const kv_ahead *ahead) {
    const int32_t NE = nv <= 2 ? 8 : nv <= 4 ? 4 : 2;
    const int32_t passes = d / (16 * NE) + d % (16 * NE) / 16;
    const int32_t step = kv_ahead_step(ahead, passes * (jhi - jlo + 1));
    kv_ahead_walk walk = kv_ahead_start(ahead); /* the rows ahead, a few lines a key */
    int32_t e = 0;
    for (; e + 16 * NE <= d; e += 16 * NE) values_pass(t, nv, NE, d, v, stride, e, jlo, jhi, s, corr, acc, &walk, step);
    for (; e < d; e += 16) values_pass(t, nv, 1, d, v, stride, e, jlo, jhi, s, corr, acc, &walk, step);
    kv_ahead_next(&walk, kv_ahead_lines(ahead));
}

static void decode_scores(kv_dtype t, const float *q, int32_t nv, int32_t d, const unsigned char *k, size_t stride,
                          const float *ks, const float *vs, int32_t n, const int32_t *lo, const int32_t *hi,
                          float *m, float *l, float (*w)[16], float *corr, const kv_ahead *ahead) {
#define SCORES(T, NV) scores_impl(T, NV, q, d, k, stride, ks, vs, n, lo, hi, m, l, w, corr, ahead)
    KV_DECODE_SWITCH(SCORES)
#undef SCORES
}

/* KV_Q8 scores against int16 queries (q ~ qs[i] qi[i]): each K row's int8
 * widened to int16 once, multiplied pairwise with every vector's quants and
 * summed in int32 (exact: |sum| <= 512 * 32767 * 128 < 2^31), four keys a
 * step whose sums share one reduction; then s = qs[i] * sum, rounded once.
 * Instantiated twice: with AVX-512 VNNI's vpdpwssd (multiply-add in one),
 * and with vpmaddwd + vpaddd for AVX-512 without it. d % 32 == 0. */
#define Q8I_KERNELS(SUFFIX, TARGET, DP)                                                                          \
    static inline __attribute__((always_inline TARGET)) void q8i_dots_##SUFFIX(                                \
        const int32_t NV, const int16_t *qi, const float *qs, int32_t d, const unsigned char *k, size_t stride,  \
        int32_t n, float (*s)[16], kv_ahead_walk *walk, int32_t step) {                                          \
        int32_t j = 0;                                                                                           \
        for (; j + 4 <= n; j += 4) {                                                                             \
            const unsigned char *r0 = k + (size_t)j * stride, *r1 = r0 + stride, *r2 = r1 + stride;              \
            const unsigned char *r3 = r2 + stride;                                                               \
            __m512i a[4][4];                                                                                     \
            _Pragma("GCC unroll 4") for (int32_t i = 0; i < NV; i++) a[i][0] = a[i][1] = a[i][2] = a[i][3] =    \
                _mm512_setzero_si512();                                                                          \
            for (int32_t e = 0; e < d; e += 32) {                                                                \
                kv_ahead_next(walk, step);                                                                       \
                const __m512i k0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(r0 + e)));         \
                const __m512i k1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(r1 + e)));         \
                const __m512i k2 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(r2 + e)));         \
                const __m512i k3 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(r3 + e)));         \
                _Pragma("GCC unroll 4") for (int32_t i = 0; i < NV; i++) {                                       \
                    __m512i qv = _mm512_loadu_si512(qi + (size_t)i * d + e);                                     \
                    __asm__("" : "+v"(qv)); /* once for the four keys */                                         \
                    a[i][0] = DP(a[i][0], k0, qv), a[i][1] = DP(a[i][1], k1, qv);                               \
                    a[i][2] = DP(a[i][2], k2, qv), a[i][3] = DP(a[i][3], k3, qv);                               \
                }                                                                                                \
            }                                                                                                    \
            _Pragma("GCC unroll 4") for (int32_t i = 0; i < NV; i++) {                                           \
                kv_ahead_next(walk, step);                                                                       \
                /* four horizontal sums at once, as in scores_impl, in int32 */                                 \
                const __m512i b0 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[i][0], a[i][1]),                     \
                                                    _mm512_unpackhi_epi32(a[i][0], a[i][1]));                    \
                const __m512i b1 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[i][2], a[i][3]),                     \
                                                    _mm512_unpackhi_epi32(a[i][2], a[i][3]));                    \
                __m512i c = _mm512_add_epi32(_mm512_unpacklo_epi64(b0, b1), _mm512_unpackhi_epi64(b0, b1));      \
                c = _mm512_add_epi32(c, _mm512_shuffle_i32x4(c, c, _MM_SHUFFLE(1, 0, 3, 2)));                   \
                c = _mm512_add_epi32(c, _mm512_shuffle_i32x4(c, c, _MM_SHUFFLE(2, 3, 0, 1)));                   \
                _mm_storeu_ps(&s[i][j], _mm_mul_ps(_mm_set1_ps(qs[i]),                                           \
                                                   _mm_cvtepi32_ps(_mm512_castsi512_si128(c))));                 \
            }                                                                                                    \
        }                                                                                                        \
        for (; j < n; j++) {                                                                                     \
            const unsigned char *row = k + (size_t)j * stride;                                                   \
            __m512i a[4];                                                                                        \
            _Pragma("GCC unroll 4") for (int32_t i = 0; i < NV; i++) a[i] = _mm512_setzero_si512();              \
            for (int32_t e = 0; e < d; e += 32) {                                                                \
                kv_ahead_next(walk, step);                                                                       \
                const __m512i kv = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(row + e)));         \
                _Pragma("GCC unroll 4") for (int32_t i = 0; i < NV; i++)                                         \
                    a[i] = DP(a[i], kv, _mm512_loadu_si512(qi + (size_t)i * d + e));                             \
            }                                                                                                    \
            _Pragma("GCC unroll 4") for (int32_t i = 0; i < NV; i++)                                             \
                s[i][j] = qs[i] * (float)_mm512_reduce_add_epi32(a[i]);                                          \
        }                                                                                                        \
    }                                                                                                            \
    /* decode_scores for KV_Q8 from int16 queries: the dots of up to four    \
     * vectors at a time, then the softmax of scores_impl; the rows ahead a  \
     * step every 32 dims and every reduction of the first four vectors'    \
     * dots, and one a vector in the softmax */                              \
    static inline __attribute__((always_inline TARGET)) void q8i_scores_##SUFFIX(                              \
        const int32_t NV, const int16_t *qi, const float *qs, int32_t d, const unsigned char *k, size_t stride,  \
        const float *ks, const float *vs, int32_t n, const int32_t *lo, const int32_t *hi, float *m, float *l,   \
        float (*w)[16], float *corr, const kv_ahead *ahead) {                                                    \
        const int32_t nv4 = NV < 4 ? NV : 4;                                                                     \
        kv_ahead_walk walk = kv_ahead_start(ahead), none = kv_ahead_start(&kv_no_ahead);                         \
        const int32_t step = kv_ahead_step(ahead, n / 4 * (d / 32 + nv4) + n % 4 * (d / 32) + NV);             \
        q8i_dots_##SUFFIX(nv4, qi, qs, d, k, stride, n, w, &walk, step);                                        \
        if (NV > 4) q8i_dots_##SUFFIX(NV - 4, qi + 4 * (size_t)d, qs + 4, d, k, stride, n, w + 4, &none, 0);   \
        softmax_block(NV, ks, vs, n, lo, hi, m, l, w, corr, &walk, step);                                        \
        kv_ahead_next(&walk, kv_ahead_lines(ahead)); /* the rest */                                              \
    }                                                                                                            \
    static __attribute__((unused TARGET)) void decode_scores_q8i_##SUFFIX(                                                \
        const int16_t *qi, const float *qs, int32_t nv, int32_t d, const unsigned char *k, size_t stride,        \
        const float *ks, const float *vs, int32_t n, const int32_t *lo, const int32_t *hi, float *m, float *l,   \
        float (*w)[16], float *corr, const kv_ahead *ahead) {                                                    \
        switch (nv) {                                                                                            \
        case 1: q8i_scores_##SUFFIX(1, qi, qs, d, k, stride, ks, vs, n, lo, hi, m, l, w, corr, ahead); break;    \
        case 2: q8i_scores_##SUFFIX(2, qi, qs, d, k, stride, ks, vs, n, lo, hi, m, l, w, corr, ahead); break;    \
        case 3: q8i_scores_##SUFFIX(3, qi, qs, d, k, stride, ks, vs, n, lo, hi, m, l, w, corr, ahead); break;    \
        case 4: q8i_scores_##SUFFIX(4, qi, qs, d, k, stride, ks, vs, n, lo, hi, m, l, w, corr, ahead); break;    \
        case 5: q8i_scores_##SUFFIX(5, qi, qs, d, k, stride, ks, vs, n, lo, hi, m, l, w, corr, ahead); break;    \
        case 6: q8i_scores_##SUFFIX(6, qi, qs, d, k, stride, ks, vs, n, lo, hi, m, l, w, corr, ahead); break;    \
        case 7: q8i_scores_##SUFFIX(7, qi, qs, d, k, stride, ks, vs, n, lo, hi, m, l, w, corr, ahead); break;    \
        case 8: q8i_scores_##SUFFIX(8, qi, qs, d, k, stride, ks, vs, n, lo, hi, m, l, w, corr, ahead); break;    \
        default: break;                                                                                          \
        }                                                                                                        \
    }
#define DP_VNNI(acc, a, b) _mm512_dpwssd_epi32(acc, a, b)
#define DP_BW(acc, a, b) _mm512_add_epi32(acc, _mm512_madd_epi16(a, b))
#define VNNI_ATTR , target("avx512vnni")
#define NO_ATTR
Q8I_KERNELS(vnni, VNNI_ATTR, DP_VNNI)
Q8I_KERNELS(bw, NO_ATTR, DP_BW)
#undef NO_ATTR
#undef VNNI_ATTR
#undef DP_BW
#undef DP_VNNI
#undef Q8I_KERNELS

static void decode_values(kv_dtype t, int32_t nv, int32_t d, const unsigned char *v, size_t stride, int32_t n,
                          const int32_t *lo, const int32_t *hi, float (*w)[16], float *corr, float *acc,
                          const kv_ahead *ahead) {
    if (kv_block_uniform(nv, lo, hi)) {
        if (lo[0] > hi[0]) {
            kv_ahead_all(ahead);
            return;
        }
#define VALUES(T, NV) values_impl(T, NV, d, v, stride, lo[0], hi[0], w, corr, acc, ahead)
        KV_DECODE_SWITCH(VALUES)
#undef VALUES
        return;
    }
    /* vectors that see different keys (rows of a short prefill, a window's
     * edge): one at a time, each over its own keys */
    kv_ahead_all(ahead);
    for (int32_t i = 0; i < nv; i++) {
        if (lo[i] > hi[i]) continue;
#define ONE(T, ...)                                                                                      \
    case T: values_impl(T, 1, d, v, stride, lo[i], hi[i], &w[i], &corr[i], acc + (size_t)i * d, &kv_no_ahead); break;
        switch (t) { KV_KERNEL_TYPES(ONE) default: break; }
#undef ONE
    }
    (void)n;
}

/* s[j][i] = k[j] . qt[:, i] for KB keys j and the 16 or 32 (two) vectors i
 * from qt, s rows ldq apart. */
KERNEL_INLINE tile_scores(const int32_t KB, const bool two, const float *qt, int32_t ldq, int32_t d, const float *k,
                          float *s) {
    __m512 a[8][2];
#pragma GCC unroll 8
    for (int32_t x = 0; x < KB; x++) a[x][0] = a[x][1] = _mm512_setzero_ps();
    for (int32_t e = 0; e < d; e++) {
        const float *qe = qt + (size_t)e * ldq;
        const __m512 q0 = _mm512_loadu_ps(qe), q1 = two ? _mm512_loadu_ps(qe + 16) : q0;
#pragma GCC unroll 8
        for (int32_t x = 0; x < KB; x++) {
            const __m512 b = _mm512_set1_ps(k[(size_t)x * d + e]);
            a[x][0] = _mm512_fmadd_ps(b, q0, a[x][0]);
            if (two) a[x][1] = _mm512_fmadd_ps(b, q1, a[x][1]);
        }
    }
#pragma GCC unroll 8
    for (int32_t x = 0; x < KB; x++) {
        _mm512_storeu_ps(s + (size_t)x * ldq, a[x][0]);
        if (two) _mm512_storeu_ps(s + (size_t)x * ldq + 16, a[x][1]);
    }
}

/* The accumulators a[x][y] (vector i + x, dims e0 + 16 y) scaled by corr
 * from acc, and stored back. */
KERNEL_INLINE acc_load(const int32_t NI, const int32_t NE, __m512 (*a)[4], const float *acc, int32_t d, int32_t i,
                       int32_t e0, const float *corr) {
#pragma GCC unroll 4
    for (int32_t x = 0; x < NI; x++)
#pragma GCC unroll 4
        for (int32_t y = 0; y < NE; y++)
            a[x][y] = _mm512_mul_ps(_mm512_set1_ps(corr[i + x]), _mm512_loadu_ps(acc + (size_t)(i + x) * d + e0 + 16 * y));
}

KERNEL_INLINE acc_store(const int32_t NI, const int32_t NE, __m512 (*a)[4], float *acc, int32_t d, int32_t i,
                        int32_t e0) {
#pragma GCC unroll 4
    for (int32_t x = 0; x < NI; x++)
#pragma GCC unroll 4
        for (int32_t y = 0; y < NE; y++) _mm512_storeu_ps(acc + (size_t)(i + x) * d + e0 + 16 * y, a[x][y]);
}

/* a[x][y] += w[j][i + x] v[j][e0 + 16 y ..] for keys jlo..jhi, which all
 * four vectors see: each V row loaded once for the four. */
KERNEL_INLINE block_keys(__m512 (*a)[4], int32_t jlo, int32_t jhi, int32_t i, int32_t e0, int32_t d, int32_t ldq,
                         const float *v, const float *s) {
    for (int32_t j = jlo; j <= jhi; j++) {
        const float *vj = v + (size_t)j * d + e0, *wj = s + (size_t)j * ldq + i;
        __m512 x4[4];
#pragma GCC unroll 4
        for (int32_t y = 0; y < 4; y++) {
            x4[y] = _mm512_loadu_ps(vj + 16 * y);
            __asm__("" : "+v"(x4[y])); /* loaded once for the vectors: gcc would fold it into each FMA again */
        }
#pragma GCC unroll 4
        for (int32_t x = 0; x < 4; x++) {
            const __m512 w = _mm512_set1_ps(wj[x]);
#pragma GCC unroll 4
            for (int32_t y = 0; y < 4; y++) a[x][y] = _mm512_fmadd_ps(w, x4[y], a[x][y]);
        }
    }
}

/* acc[i + x] = acc[i + x] corr_(i + x) + sum_j w[j][i + x] v[j] for the four
 * vectors from i and the 64 dims from e0, all of which see every key of the
 * chunk: a 16 x 4 block of accumulators that never leaves the registers. */
KERNEL_INLINE tile_values_all(int32_t i, int32_t e0, int32_t d, int32_t ldq, const float *v, int32_t n,
                              const float *s, const float *corr, float *acc) {
    __m512 a[4][4];
    acc_load(4, 4, a, acc, d, i, e0, corr);
    block_keys(a, 0, n - 1, i, e0, d, ldq, v, s);
    acc_store(4, 4, a, acc, d, i, e0);
}

/* The same for the NI <= 4 vectors from i and NE <= 4 16-dim groups from e0
 * where some do not see every key: the keys all four see in the unrolled
 * loop (full blocks only), every other key only for the vectors that see it
 * (a weight of 0 times a NaN or infinite V would still poison a vector). */
KERNEL_INLINE tile_values(const int32_t NI, const int32_t NE, int32_t i, int32_t e0, int32_t d, int32_t ldq,
                          const float *v, int32_t n, int32_t j0, const int32_t *pos, int32_t window, const float *s,
                          const float *corr, float *acc) {
    __m512 a[4][4];
    acc_load(NI, NE, a, acc, d, i, e0, corr);
    int32_t all_lo = window > 0 ? pos[i + NI - 1] - window + 1 - j0 : 0, all_hi = pos[i] - j0;
    all_lo = all_lo < 0 ? 0 : all_lo, all_hi = all_hi > n - 1 ? n - 1 : all_hi;
    if (NI == 4 && NE == 4 && all_lo <= all_hi) block_keys(a, all_lo, all_hi, i, e0, d, ldq, v, s);
    else all_lo = n, all_hi = n - 1; /* none in the unrolled loop */
    /* then the keys before and after those, in order */
    for (int32_t j = 0; j < n; j++) {
        if (j == all_lo) j = all_hi + 1;
        if (j == n) break;
        for (int32_t x = 0; x < NI; x++) {
            const int32_t key = j0 + j, p = pos[i + x];
            if (key > p || (window > 0 && key <= p - window)) continue;
            const __m512 w = _mm512_set1_ps(s[(size_t)j * ldq + i + x]);
            for (int32_t y = 0; y < NE; y++)
                a[x][y] = _mm512_fmadd_ps(w, _mm512_loadu_ps(v + (size_t)j * d + e0 + 16 * y), a[x][y]);
        }
    }
    acc_store(NI, NE, a, acc, d, i, e0);
}

/* The online-softmax update of 16 lanes from the raw scores s[j] (rows ldq
 * apart) of n keys from j0: the visible keys of each lane, the new max,
 * weights in place (zero where not visible), sums, and corr in the row after
 * the weights. `all`: every key is visible to every lane, no masks. */
KERNEL_INLINE tile_softmax(const bool all, int32_t live_n, int32_t ldq, int32_t n, int32_t j0, const int32_t *pos,
                           int32_t window, float *m, float *l, float *s) {
    const __mmask16 live = live_n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << live_n) - 1);
    const __m512i p = _mm512_maskz_loadu_epi32(live, pos);
    const __m512i lo = window > 0 ? _mm512_sub_epi32(p, _mm512_set1_epi32(window - 1)) : _mm512_set1_epi32(INT32_MIN);
#define VISIBLE(j)                                                                                              \
    (all ? (__mmask16)0xffff                                                                                    \
         : live & _mm512_cmple_epi32_mask(_mm512_set1_epi32(j0 + (j)), p) &                                    \
               _mm512_cmpge_epi32_mask(_mm512_set1_epi32(j0 + (j)), lo))
    const __m512 mold = _mm512_loadu_ps(m);
    /* four running maxima: one alone waits out each max's latency, key after
     * key. The max is exact in any order; a NaN score makes its weight NaN
     * whichever maximum it lands in. */
    __m512 m4[4] = {mold, mold, mold, mold};
    int32_t j = 0;
    for (; j + 4 <= n; j += 4)
#pragma GCC unroll 4
        for (int32_t u = 0; u < 4; u++)
            m4[u] = _mm512_mask_max_ps(m4[u], VISIBLE(j + u), m4[u], _mm512_loadu_ps(s + (size_t)(j + u) * ldq));
    for (; j < n; j++) m4[0] = _mm512_mask_max_ps(m4[0], VISIBLE(j), m4[0], _mm512_loadu_ps(s + (size_t)j * ldq));
    const __m512 mx = _mm512_max_ps(_mm512_max_ps(m4[0], m4[1]), _mm512_max_ps(m4[2], m4[3]));
    /* corr = e^(m_old - m_new); 1 where nothing was ever seen, 0 on the first sight */
    const __mmask16 seen = _mm512_cmp_ps_mask(mx, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    const __mmask16 had = _mm512_cmp_ps_mask(mold, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    __m512 corr = _mm512_mask_blend_ps(seen, _mm512_set1_ps(1.0f), _mm512_setzero_ps());
    corr = _mm512_mask_mov_ps(corr, seen & had, exp16(_mm512_sub_ps(mold, mx)));
    __m512 sum = _mm512_mul_ps(_mm512_loadu_ps(l), corr);
    for (j = 0; j < n; j++) {
        float *sj = s + (size_t)j * ldq;
        const __m512 w = _mm512_maskz_mov_ps(VISIBLE(j), exp16(_mm512_sub_ps(_mm512_loadu_ps(sj), mx)));
        _mm512_storeu_ps(sj, w);
        sum = _mm512_add_ps(sum, w);
    }
#undef VISIBLE
    _mm512_storeu_ps(l, sum);
    _mm512_storeu_ps(m, mx);
    _mm512_storeu_ps(s + (size_t)n * ldq, corr);
}

static void tile_block(const float *qt, int32_t nv, int32_t ldq, int32_t d, const float *k, const float *v,
                       int32_t n, int32_t j0, const int32_t *pos, int32_t window, float *m, float *l, float *acc,
                       float *s) {
    /* 1. scores s[j][i] = k[j] . qt[:, i]: eight keys by 32 vectors per
     *    step, the keys' elements broadcast, the vectors along the lanes: no
     *    reductions */
    for (int32_t i0 = 0; i0 < ldq; i0 += 32) {
        int32_t j = 0;
#define SCORES(KB, TWO) tile_scores(KB, TWO, qt + i0, ldq, d, k + (size_t)j * d, s + (size_t)j * ldq + i0)
        if (i0 + 16 < ldq) {
            for (; j + 8 <= n; j += 8) SCORES(8, true);
            for (; j < n; j++) SCORES(1, true);
        } else {
            for (; j + 8 <= n; j += 8) SCORES(8, false);
            for (; j < n; j++) SCORES(1, false);
        }
#undef SCORES
    }
    /* 2. online softmax along the lanes, 16 at a time */
    for (int32_t i0 = 0; i0 < ldq; i0 += 16) {
        /* every live lane sees the whole chunk: no masks, the padding lanes' weights never read */
        if (kv_tile_sees_all(pos + i0, nv - i0 < 16 ? nv - i0 : 16, j0, n, window))
            tile_softmax(true, nv - i0, ldq, n, j0, pos + i0, window, m + i0, l + i0, s + i0);
        else
            tile_softmax(false, nv - i0, ldq, n, j0, pos + i0, window, m + i0, l + i0, s + i0);
    }
    /* 3. acc[i] = acc[i] corr_i + sum_j w[j][i] v[j]: four vectors by 64
     *    dimensions per step, V rows along the lanes */
    const float *corr = s + (size_t)n * ldq;
    for (int32_t e0 = 0; e0 < d; e0 += 64) {
        const int32_t ne = d - e0 >= 64 ? 4 : (d - e0) / 16;
        for (int32_t i = 0; i < nv; i += 4) {
            const int32_t ni = nv - i < 4 ? nv - i : 4;
            if (ni == 4 && ne == 4 && kv_tile_sees_all(pos + i, 4, j0, n, window))
                tile_values_all(i, e0, d, ldq, v, n, s, corr, acc);
            else if (ni == 4 && ne == 4) tile_values(4, 4, i, e0, d, ldq, v, n, j0, pos, window, s, corr, acc);
            else tile_values(ni, ne, i, e0, d, ldq, v, n, j0, pos, window, s, corr, acc);
        }
    }
}

/* qt[e][i] = scale rows[i][e], sixteen vectors by sixteen dims a step: the
 * rows loaded whole (sixteen lines in flight, where one float a step kept
 * the reads of q from memory waiting) and transposed in registers. */
static void tile_q(const float *const *rows, int32_t n, int32_t d, float scale, int32_t ldq, float *qt) {
    const __m512 sc = _mm512_set1_ps(scale);
    for (int32_t i0 = 0; i0 < ldq; i0 += 16)
        for (int32_t e0 = 0; e0 < d; e0 += 16) {
            __m512 r[16], a[16], b[16];
#pragma GCC unroll 16
            for (int32_t x = 0; x < 16; x++)
                r[x] = i0 + x < n ? _mm512_mul_ps(_mm512_loadu_ps(rows[i0 + x] + e0), sc) : _mm512_setzero_ps();
            /* within 128-bit lanes: b[4 y + c] lane L holds dim 4 L + c of vectors 4 y .. 4 y + 3 */
#pragma GCC unroll 8
            for (int32_t x = 0; x < 16; x += 2) {
                a[x] = _mm512_unpacklo_ps(r[x], r[x + 1]);
                a[x + 1] = _mm512_unpackhi_ps(r[x], r[x + 1]);
            }
#pragma GCC unroll 4
            for (int32_t x = 0; x < 16; x += 4) {
                b[x] = _mm512_shuffle_ps(a[x], a[x + 2], 0x44);
                b[x + 1] = _mm512_shuffle_ps(a[x], a[x + 2], 0xee);
                b[x + 2] = _mm512_shuffle_ps(a[x + 1], a[x + 3], 0x44);
                b[x + 3] = _mm512_shuffle_ps(a[x + 1], a[x + 3], 0xee);
            }
            /* then across lanes: dims c, 4 + c, 8 + c, 12 + c from b[c], b[4 + c], b[8 + c], b[12 + c] */
            float *out = qt + (size_t)e0 * ldq + i0;
#pragma GCC unroll 4
            for (int32_t c = 0; c < 4; c++) {
                const __m512 p = _mm512_shuffle_f32x4(b[c], b[4 + c], 0x88), q = _mm512_shuffle_f32x4(b[c], b[4 + c], 0xdd);
                const __m512 p2 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0x88);
                const __m512 q2 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0xdd);
                _mm512_storeu_ps(out + (size_t)c * ldq, _mm512_shuffle_f32x4(p, p2, 0x88));
                _mm512_storeu_ps(out + (size_t)(8 + c) * ldq, _mm512_shuffle_f32x4(p, p2, 0xdd));
                _mm512_storeu_ps(out + (size_t)(4 + c) * ldq, _mm512_shuffle_f32x4(q, q2, 0x88));
                _mm512_storeu_ps(out + (size_t)(12 + c) * ldq, _mm512_shuffle_f32x4(q, q2, 0xdd));
            }
        }
}

/* Two tables, told apart by the int16-query q8 scores: VNNI's where the CPU has it */
#define AVX512_TABLE(Q8I)                                                                                     \
    {.name = "avx512", .load_rows = load_rows, .dot_rows = dot_rows, .exp_sum = exp_sum, .axpy_rows = axpy_rows, \
     .decode_scores = decode_scores, .decode_values = decode_values, .decode_scores_q8i = Q8I,                  \
     .tile_block = tile_block, .tile_q = tile_q}
static const kv_simd avx512_vnni = AVX512_TABLE(decode_scores_q8i_vnni), avx512_bw = AVX512_TABLE(decode_scores_q8i_bw);
#undef AVX512_TABLE

/* VNNI's kernels where the CPU has it, unless KVCACHE_NO_VNNI (src/cpu.h). */
const kv_simd *kv_simd_avx512(void) {
    if (!kv_cpu_avx512()) return NULL;
    return kv_cpu_avx512vnni() && !kv_cpu_vnni_off() ? &avx512_vnni : &avx512_bw;
}
#else
const kv_simd *kv_simd_avx512(void) { return NULL; }
#endif
