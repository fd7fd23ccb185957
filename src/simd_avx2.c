/* src/simd_avx2.c - the attention primitives (see simd.h) for AVX2 + FMA +
 * F16C: 8 lanes, 16 registers. The chunk primitives, the fused decode kernels
 * (a GQA group's vectors against one pass over K and V straight from storage)
 * and the prefill tile kernel. Compiled with those flags whatever MARCH says;
 * used only when the CPU reports them. */
#include "simd.h"
#include "cpu.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
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
        if (e < d)
            kv_load_row(t, row + (size_t)e * (size_t)kv_elem_bytes(t), scales ? scales + j : NULL, out + e, d - e);
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

/* Raw scores of keys j..j+KP-1 against NV <= 4 vectors, into tmp [NV][16][8]
 * lane sums: NV * KP independent FMA chains (FMA latency 4 x 2 pipes wants
 * at least 8), each K element converted once, each 8 elements of q loaded
 * once for the KP keys (NV + 1 + NV * KP registers of 16: loads, at most two
 * 256-bit ones a cycle, would bound the FMAs if q came from L1 per key). */
DECODE_INLINE dots_pass(const kv_dtype t, const int32_t NV, const int32_t KP, const float *q, int32_t d,
                        const unsigned char *k, size_t stride, int32_t j, float (*tmp)[16][8]) {
    __m256 a[4][6];
#pragma GCC unroll 4
    for (int32_t i = 0; i < NV; i++)
#pragma GCC unroll 6
        for (int32_t kk = 0; kk < KP; kk++) a[i][kk] = _mm256_setzero_ps();
    const unsigned char *row = k + (size_t)j * stride;
    for (int32_t e = 0; e < d; e += 8) {
        __m256 qv[4];
#pragma GCC unroll 4
        for (int32_t i = 0; i < NV; i++) {
            qv[i] = _mm256_loadu_ps(q + (size_t)i * d + e);
            __asm__("" : "+x"(qv[i]));   /* kept in a register: gcc would fold it into every FMA again */
        }
#pragma GCC unroll 6
        for (int32_t kk = 0; kk < KP; kk++) {
            const __m256 kv = load8(t, row + (size_t)kk * stride, e);
#pragma GCC unroll 4
            for (int32_t i = 0; i < NV; i++) a[i][kk] = _mm256_fmadd_ps(qv[i], kv, a[i][kk]);
        }
    }
#pragma GCC unroll 4
    for (int32_t i = 0; i < NV; i++)
#pragma GCC unroll 6
        for (int32_t kk = 0; kk < KP; kk++) _mm256_store_ps(tmp[i][j + kk], a[i][kk]);
}

/* vhaddps, as two shuffles and an add: the same sums of the same pairs, so
 * the same bits, in fewer cycles on CPUs where vhaddps is microcoded (Zen);
 * the trees below are a fifth of a block's dots at d = 64. */
static inline __m256 hadd8(__m256 a, __m256 b) {
    return _mm256_add_ps(_mm256_shuffle_ps(a, b, 0x88), _mm256_shuffle_ps(a, b, 0xDD));
}

/* s[i][j] = q[i] . k[j] for j < n (<= 16), NV <= 4: passes of KP keys, then
 * the lane sums of eight keys at a time folded by one hadd tree. */
DECODE_INLINE dots_impl(const kv_dtype t, const int32_t NV, const float *q, int32_t d, const unsigned char *k,
                        size_t stride, int32_t n, float (*s)[16], const kv_ahead *ahead) {
    const int32_t KP = NV == 1 ? 6 : NV == 2 ? 5 : NV == 3 ? 3 : 2, row_bytes = d * kv_elem_bytes(t);
    float tmp[4][16][8] __attribute__((aligned(32)));
    int32_t j = 0;
    for (; j + KP <= n; j += KP) {
        kv_ahead_rows(ahead, row_bytes, j, j + KP); /* as many rows ahead as this pass reads */
        dots_pass(t, NV, KP, q, d, k, stride, j, tmp);
    }
    for (; j < n; j++) dots_pass(t, NV, 1, q, d, k, stride, j, tmp);
    kv_ahead_rows(ahead, row_bytes, n - n % KP, 16); /* the single keys' rows, and the rest of a longer slot */
    for (int32_t i = 0; i < NV; i++)
        for (int32_t jj = n; jj < ((n + 7) & ~7); jj++) _mm256_store_ps(tmp[i][jj], _mm256_setzero_ps());
#pragma GCC unroll 4
    for (int32_t i = 0; i < NV; i++)
        for (int32_t j0 = 0; j0 < n; j0 += 8) {
            const float(*x)[8] = tmp[i] + j0;
            __m256 h01 = hadd8(_mm256_load_ps(x[0]), _mm256_load_ps(x[1]));
            __m256 h23 = hadd8(_mm256_load_ps(x[2]), _mm256_load_ps(x[3]));
            __m256 h45 = hadd8(_mm256_load_ps(x[4]), _mm256_load_ps(x[5]));
            __m256 h67 = hadd8(_mm256_load_ps(x[6]), _mm256_load_ps(x[7]));
            __m256 h0123 = hadd8(h01, h23), h4567 = hadd8(h45, h67);
            /* h0123 = [k0..k3 over lanes 0-3 | k0..k3 over lanes 4-7], likewise h4567 */
            __m256 lo = _mm256_permute2f128_ps(h0123, h4567, 0x20), hi = _mm256_permute2f128_ps(h0123, h4567, 0x31);
            _mm256_storeu_ps(&s[i][j0], _mm256_add_ps(lo, hi));
        }
}


static inline float hmax8(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* The online-softmax update of NV vectors that all see the whole block of 16
 * keys (most blocks): unrolled over the vectors, so that their exp chains
 * overlap. */
DECODE_INLINE softmax_full(const int32_t NV, const float *ks, const float *vs, float *m, float *l, float (*s)[16],
                           float *corr) {
    __m256 s0[KV_DECODE_VECS], s1[KV_DECODE_VECS];
    float bm[KV_DECODE_VECS];
#pragma GCC unroll 8
    for (int32_t i = 0; i < NV; i++) {
        s0[i] = _mm256_loadu_ps(s[i]), s1[i] = _mm256_loadu_ps(s[i] + 8);
        if (ks) s0[i] = _mm256_mul_ps(s0[i], _mm256_loadu_ps(ks)), s1[i] = _mm256_mul_ps(s1[i], _mm256_loadu_ps(ks + 8));
        bm[i] = hmax8(_mm256_max_ps(s0[i], s1[i]));
    }
#pragma GCC unroll 8
    for (int32_t i = 0; i < NV; i++) {
        /* a new max rescales the old state; an unchanged one (most blocks) by
         * exactly 1, no exp; a NaN m (poisoned before) stays; a NaN score may
         * drop out of the max, but its weight is NaN */
        corr[i] = 1.0f;
        if (bm[i] > m[i]) corr[i] = kv_corr_exp(m[i], bm[i]), m[i] = bm[i];
    }
#pragma GCC unroll 8
    for (int32_t i = 0; i < NV; i++) {
        const __m256 mv = _mm256_set1_ps(m[i]);
        __m256 p0 = exp8(_mm256_sub_ps(s0[i], mv)), p1 = exp8(_mm256_sub_ps(s1[i], mv));
        l[i] = l[i] * corr[i] + hsum8(_mm256_add_ps(p0, p1));
        if (vs) p0 = _mm256_mul_ps(p0, _mm256_loadu_ps(vs)), p1 = _mm256_mul_ps(p1, _mm256_loadu_ps(vs + 8));
        _mm256_storeu_ps(s[i], p0);
        _mm256_storeu_ps(s[i] + 8, p1);
    }
}

/* The online-softmax update of the vectors that see only part of the block
 * (a window's edge, rows of a short prefill) or of a short block. */
static void softmax_part(int32_t nv, const float *ks, const float *vs, const int32_t *lo, const int32_t *hi,
                         float *m, float *l, float (*s)[16], float *corr) {
    const __m256i iota0 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), iota1 = _mm256_add_epi32(iota0, _mm256_set1_epi32(8));
    for (int32_t i = 0; i < nv; i++) {
        if (lo[i] > hi[i]) { /* sees none of the block: state unchanged, values skip it */
            corr[i] = 1.0f;
            continue;
        }
        /* visible lanes lo <= j <= hi; the others are never loaded */
        const bool full = lo[i] == 0 && hi[i] == 15;
        __m256 vis0, vis1, s0, s1;
        if (full) {
            vis0 = vis1 = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
            s0 = _mm256_loadu_ps(s[i]), s1 = _mm256_loadu_ps(s[i] + 8);
            if (ks) s0 = _mm256_mul_ps(s0, _mm256_loadu_ps(ks)), s1 = _mm256_mul_ps(s1, _mm256_loadu_ps(ks + 8));
        } else {
            const __m256i vlo = _mm256_set1_epi32(lo[i] - 1), vhi = _mm256_set1_epi32(hi[i] + 1);
            const __m256i m0 = _mm256_and_si256(_mm256_cmpgt_epi32(iota0, vlo), _mm256_cmpgt_epi32(vhi, iota0));
            const __m256i m1 = _mm256_and_si256(_mm256_cmpgt_epi32(iota1, vlo), _mm256_cmpgt_epi32(vhi, iota1));
            vis0 = _mm256_castsi256_ps(m0), vis1 = _mm256_castsi256_ps(m1);
            s0 = _mm256_maskload_ps(s[i], m0), s1 = _mm256_maskload_ps(s[i] + 8, m1);
            if (ks) s0 = _mm256_mul_ps(s0, _mm256_maskload_ps(ks, m0)), s1 = _mm256_mul_ps(s1, _mm256_maskload_ps(ks + 8, m1));
            const __m256 ninf = _mm256_set1_ps(-INFINITY);
            s0 = _mm256_blendv_ps(ninf, s0, vis0), s1 = _mm256_blendv_ps(ninf, s1, vis1); /* out of the max */
        }
        /* a NaN score may drop out of the max; its weight below is NaN anyway */
        const float bm = hmax8(_mm256_max_ps(s0, s1));
        /* a new max rescales the old state; an unchanged one (most blocks) by
         * exactly 1, no exp; a NaN m (poisoned before) stays */
        float mx = m[i];
        corr[i] = 1.0f;
        if (bm > mx) corr[i] = kv_corr_exp(mx, bm), mx = bm;
        const __m256 mv = _mm256_set1_ps(mx);
        __m256 p0 = _mm256_and_ps(vis0, exp8(_mm256_sub_ps(s0, mv)));
        __m256 p1 = _mm256_and_ps(vis1, exp8(_mm256_sub_ps(s1, mv)));
        l[i] = l[i] * corr[i] + hsum8(_mm256_add_ps(p0, p1));
        m[i] = mx;
        if (vs) {
            if (full) p0 = _mm256_mul_ps(p0, _mm256_loadu_ps(vs)), p1 = _mm256_mul_ps(p1, _mm256_loadu_ps(vs + 8));
            else p0 = _mm256_mul_ps(p0, _mm256_maskload_ps(vs, _mm256_castps_si256(vis0))),
                 p1 = _mm256_mul_ps(p1, _mm256_maskload_ps(vs + 8, _mm256_castps_si256(vis1)));
        }
        _mm256_storeu_ps(s[i], p0);
        _mm256_storeu_ps(s[i] + 8, p1);
    }
}

/* acc = acc * corr + sum_j w[i][j] v[j] over keys jlo..jhi, which each of the
 * NV <= 4 vectors sees: 16 dims of every vector in registers while the V rows
 * stream past, each converted once. */
DECODE_INLINE values_group(const kv_dtype t, const int32_t NV, int32_t d, const unsigned char *v, size_t stride,
                           int32_t jlo, int32_t jhi, float (*w)[16], const float *corr, float *acc,
                           const kv_ahead *ahead) {
    const int32_t per = (16 + d / 16 - 1) / (d / 16); /* rows ahead per 16 dims: 16 over the row */
    const int32_t row_bytes = d * kv_elem_bytes(t);
    for (int32_t e = 0; e < d; e += 16) {
        kv_ahead_rows(ahead, row_bytes, e / 16 * per, e / 16 * per + per);
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

/* One out-of-line instance of each kernel per storage type and group size
 * that it needs known at compile time, and no more: dots and values per
 * (type, NV <= 4), a group of 5..8 vectors taking two of them; the full-block
 * softmax per NV <= 8, whatever the type. (Inlining every kernel into each of
 * the (type, NV <= 8) cases made this file the slowest of the build.) */
typedef void dots_fn(const float *q, int32_t d, const unsigned char *k, size_t stride, int32_t n, float (*s)[16],
                     const kv_ahead *ahead);
typedef void values_fn(int32_t d, const unsigned char *v, size_t stride, int32_t jlo, int32_t jhi, float (*w)[16],
                       const float *corr, float *acc, const kv_ahead *ahead);
typedef void softmax_fn(const float *ks, const float *vs, float *m, float *l, float (*s)[16], float *corr);

#define DOTS(T, NV)                                                                                            \
    static void dots_##T##_##NV(const float *q, int32_t d, const unsigned char *k, size_t stride, int32_t n,   \
                                float (*s)[16], const kv_ahead *ahead) {                                       \
        dots_impl(T, NV, q, d, k, stride, n, s, ahead);                                                        \
    }                                                                                                          \
    static void values_##T##_##NV(int32_t d, const unsigned char *v, size_t stride, int32_t jlo, int32_t jhi, \
                                  float (*w)[16], const float *corr, float *acc, const kv_ahead *ahead) {     \
        values_group(T, NV, d, v, stride, jlo, jhi, w, corr, acc, ahead);                                     \
    }
#define DOTS_T(T, ...) DOTS(T, 1) DOTS(T, 2) DOTS(T, 3) DOTS(T, 4)
KV_KERNEL_TYPES(DOTS_T)
#undef DOTS_T
#undef DOTS

#define ROW(T, F) [T] = {F##_##T##_1, F##_##T##_2, F##_##T##_3, F##_##T##_4},
#define DOTS_ROW(T, ...) ROW(T, dots)
#define VALUES_ROW(T, ...) ROW(T, values)
static dots_fn *const dots_for[][4] = {KV_KERNEL_TYPES(DOTS_ROW)};
static values_fn *const values_for[][4] = {KV_KERNEL_TYPES(VALUES_ROW)};
#undef VALUES_ROW
#undef DOTS_ROW
#undef ROW

#define SOFTMAX(NV)                                                                                         \
    static void softmax_##NV(const float *ks, const float *vs, float *m, float *l, float (*s)[16], float *corr) { \
        softmax_full(NV, ks, vs, m, l, s, corr);                                                            \
    }
SOFTMAX(1) SOFTMAX(2) SOFTMAX(3) SOFTMAX(4) SOFTMAX(5) SOFTMAX(6) SOFTMAX(7) SOFTMAX(8)
#undef SOFTMAX
static softmax_fn *const softmax_for[KV_DECODE_VECS] = {softmax_1, softmax_2, softmax_3, softmax_4,
                                                        softmax_5, softmax_6, softmax_7, softmax_8};

static bool decode_type(kv_dtype t) {
#define CASE(T, ...) case T:
    switch (t) {
        KV_KERNEL_TYPES(CASE) return true;
    default: return false;
    }
#undef CASE
}

static void decode_scores(kv_dtype t, const float *q, int32_t nv, int32_t d, const unsigned char *k, size_t stride,
                          const float *ks, const float *vs, int32_t n, const int32_t *lo, const int32_t *hi,
                          float *m, float *l, float (*w)[16], float *corr, const kv_ahead *ahead) {
    if (!decode_type(t) || nv < 1 || nv > KV_DECODE_VECS) return;
    dots_for[t][(nv < 4 ? nv : 4) - 1](q, d, k, stride, n, w, ahead);
    if (nv > 4) dots_for[t][nv - 5](q + 4 * (size_t)d, d, k, stride, n, w + 4, &kv_no_ahead);
    if (n == 16 && kv_block_uniform(nv, lo, hi) && lo[0] == 0 && hi[0] == 15)
        softmax_for[nv - 1](ks, vs, m, l, w, corr);
    else
        softmax_part(nv, ks, vs, lo, hi, m, l, w, corr);
}

/* acc = acc * corr + sum_j w[j] v[j] over keys jlo..jhi, which all nv vectors see */
static void values_seen(kv_dtype t, int32_t nv, int32_t d, const unsigned char *v, size_t stride, int32_t jlo,
                        int32_t jhi, float (*w)[16], const float *corr, float *acc, const kv_ahead *ahead) {
    values_for[t][(nv < 4 ? nv : 4) - 1](d, v, stride, jlo, jhi, w, corr, acc, ahead);
    if (nv > 4) values_for[t][nv - 5](d, v, stride, jlo, jhi, w + 4, corr + 4, acc + 4 * (size_t)d, &kv_no_ahead);
}

static void decode_values(kv_dtype t, int32_t nv, int32_t d, const unsigned char *v, size_t stride, int32_t n,
                          const int32_t *lo, const int32_t *hi, float (*w)[16], float *corr, float *acc,
                          const kv_ahead *ahead) {
    if (!decode_type(t) || nv < 1 || nv > KV_DECODE_VECS) return;
    if (kv_block_uniform(nv, lo, hi)) {
        if (lo[0] <= hi[0]) values_seen(t, nv, d, v, stride, lo[0], hi[0], w, corr, acc, ahead);
        else kv_ahead_all(ahead);
        return;
    }
    /* vectors that see different keys (rows of a short prefill, a window's
     * edge): one at a time, each over its own keys */
    kv_ahead_all(ahead);
    for (int32_t i = 0; i < nv; i++)
        if (lo[i] <= hi[i])
            values_seen(t, 1, d, v, stride, lo[i], hi[i], &w[i], &corr[i], acc + (size_t)i * d, &kv_no_ahead);
    (void)n;
}

/* ------------------------------------------------------------------ prefill */

/* Scores s[j][i] = k[j] . qt[:, i] of keys j..j+KP-1 against the 16 vectors
 * from i0: the keys' elements broadcast, the vectors along the lanes (no
 * reductions), 2 KP independent FMA chains. */
DECODE_INLINE tile_dots(const int32_t KP, const float *qt, int32_t ldq, int32_t d, const float *k, int32_t j,
                        int32_t i0, float *s) {
    __m256 a[6][2];
#pragma GCC unroll 6
    for (int32_t kk = 0; kk < KP; kk++) a[kk][0] = a[kk][1] = _mm256_setzero_ps();
    const float *kj = k + (size_t)j * d;
    for (int32_t e = 0; e < d; e++) {
        const float *qe = qt + (size_t)e * ldq + i0;
        const __m256 q0 = _mm256_loadu_ps(qe), q1 = _mm256_loadu_ps(qe + 8);
#pragma GCC unroll 6
        for (int32_t kk = 0; kk < KP; kk++) {
            const __m256 b = _mm256_broadcast_ss(kj + (size_t)kk * d + e);
            a[kk][0] = _mm256_fmadd_ps(b, q0, a[kk][0]);
            a[kk][1] = _mm256_fmadd_ps(b, q1, a[kk][1]);
        }
    }
#pragma GCC unroll 6
    for (int32_t kk = 0; kk < KP; kk++) {
        _mm256_storeu_ps(s + (size_t)(j + kk) * ldq + i0, a[kk][0]);
        _mm256_storeu_ps(s + (size_t)(j + kk) * ldq + i0 + 8, a[kk][1]);
    }
}

/* acc[i0 + x] = acc * corr + sum_j w[j][i0 + x] v[j] over the 16 dims from
 * e0, for the NI <= 6 vectors from i0: keys all_lo..all_hi, which every one
 * of them sees, in the unrolled loop; the others only for the vectors that see
 * them (a weight of 0 times a NaN or infinite V would still poison a vector). */
DECODE_INLINE tile_values(const int32_t NI, const float *s, int32_t ldq, int32_t d, const float *v, int32_t n,
                          int32_t j0, const int32_t *pos, int32_t window, const float *corr, int32_t all_lo,
                          int32_t all_hi, int32_t i0, int32_t e0, float *acc) {
    __m256 a[6][2];
#pragma GCC unroll 6
    for (int32_t x = 0; x < NI; x++) {
        const __m256 c = _mm256_set1_ps(corr[i0 + x]);
        a[x][0] = _mm256_mul_ps(c, _mm256_loadu_ps(acc + (size_t)(i0 + x) * d + e0));
        a[x][1] = _mm256_mul_ps(c, _mm256_loadu_ps(acc + (size_t)(i0 + x) * d + e0 + 8));
    }
    for (int32_t j = all_lo; j <= all_hi; j++) {
        const float *vj = v + (size_t)j * d + e0, *wj = s + (size_t)j * ldq + i0;
        const __m256 v0 = _mm256_loadu_ps(vj), v1 = _mm256_loadu_ps(vj + 8);
#pragma GCC unroll 6
        for (int32_t x = 0; x < NI; x++) {
            const __m256 w = _mm256_broadcast_ss(wj + x);
            a[x][0] = _mm256_fmadd_ps(w, v0, a[x][0]);
            a[x][1] = _mm256_fmadd_ps(w, v1, a[x][1]);
        }
    }
    /* the keys some of the vectors see: pos[i0] - window < key <= pos[i0 + NI - 1] */
    int32_t any_lo = window > 0 ? pos[i0] - window + 1 - j0 : 0, any_hi = pos[i0 + NI - 1] - j0;
    any_lo = any_lo < 0 ? 0 : any_lo, any_hi = any_hi > n - 1 ? n - 1 : any_hi;
    for (int32_t j = any_lo; j <= any_hi; j++) {
        if (j >= all_lo && j <= all_hi) {
            j = all_hi;
            continue;
        }
        const int32_t key = j0 + j;
        const float *vj = v + (size_t)j * d + e0, *wj = s + (size_t)j * ldq + i0;
#pragma GCC unroll 6
        for (int32_t x = 0; x < NI; x++) {
            const int32_t p = pos[i0 + x];
            if (key > p || (window > 0 && key <= p - window)) continue;
            const __m256 w = _mm256_broadcast_ss(wj + x);
            a[x][0] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vj), a[x][0]);
            a[x][1] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vj + 8), a[x][1]);
        }
    }
#pragma GCC unroll 6
    for (int32_t x = 0; x < NI; x++) {
        _mm256_storeu_ps(acc + (size_t)(i0 + x) * d + e0, a[x][0]);
        _mm256_storeu_ps(acc + (size_t)(i0 + x) * d + e0 + 8, a[x][1]);
    }
}

/* The online-softmax update of 8 lanes from the raw scores s[j] (rows ldq
 * apart) of n keys from j0: the visible keys of each lane, the new max,
 * weights in place (zero where not visible), sums, and corr in the row after
 * the weights. `all`: every key is visible to every lane, no masks. */
DECODE_INLINE tile_softmax(const bool all, int32_t live_n, int32_t ldq, int32_t n, int32_t j0, const int32_t *pos,
                           int32_t window, float *m, float *l, float *s) {
    const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(live_n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i p = _mm256_loadu_si256((const __m256i *)pos);
    /* visible: p - window < key <= p, i.e. key > lo and key < p + 1 */
    const __m256i lo = window > 0 ? _mm256_sub_epi32(p, _mm256_set1_epi32(window)) : _mm256_set1_epi32(INT32_MIN);
    const __m256i p1 = _mm256_add_epi32(p, _mm256_set1_epi32(1));
#define VISIBLE(j)                                                                                              \
    _mm256_castsi256_ps(_mm256_and_si256(live, _mm256_and_si256(_mm256_cmpgt_epi32(p1, _mm256_set1_epi32(j0 + (j))), \
                                                                _mm256_cmpgt_epi32(_mm256_set1_epi32(j0 + (j)), lo))))
    const __m256 mold = _mm256_loadu_ps(m);
    __m256 mx = mold;
    for (int32_t j = 0; j < n; j++) {
        const __m256 mj = _mm256_max_ps(mx, _mm256_loadu_ps(s + (size_t)j * ldq));
        mx = all ? mj : _mm256_blendv_ps(mx, mj, VISIBLE(j));
    }
    /* corr = e^(m_old - m_new); 1 where nothing was ever seen, 0 on the
     * first sight (a NaN max counts as unseen: its weights are NaN) */
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const __m256 seen = _mm256_cmp_ps(mx, ninf, _CMP_NEQ_OQ), had = _mm256_cmp_ps(mold, ninf, _CMP_NEQ_OQ);
    __m256 corr = _mm256_blendv_ps(_mm256_set1_ps(1.0f), _mm256_setzero_ps(), seen);
    corr = _mm256_blendv_ps(corr, exp8(_mm256_sub_ps(mold, mx)), _mm256_and_ps(seen, had));
    __m256 sum = _mm256_mul_ps(_mm256_loadu_ps(l), corr);
    for (int32_t j = 0; j < n; j++) {
        float *sj = s + (size_t)j * ldq;
        __m256 w = exp8(_mm256_sub_ps(_mm256_loadu_ps(sj), mx));
        if (!all) w = _mm256_and_ps(VISIBLE(j), w);
        _mm256_storeu_ps(sj, w);
        sum = _mm256_add_ps(sum, w);
    }
#undef VISIBLE
    _mm256_storeu_ps(l, sum);
    _mm256_storeu_ps(m, mx);
    _mm256_storeu_ps(s + (size_t)n * ldq, corr);
}

static void tile_block(const float *qt, int32_t nv, int32_t ldq, int32_t d, const float *k, const float *v,
                       int32_t n, int32_t j0, const int32_t *pos, int32_t window, float *m, float *l, float *acc,
                       float *s) {
    /* 1. scores, six keys by 16 vectors per step */
    for (int32_t i0 = 0; i0 < ldq; i0 += 16) {
        int32_t j = 0;
        for (; n - j >= 10; j += 6) tile_dots(6, qt, ldq, d, k, j, i0, s);
        /* the last 0..9 keys in at most two passes, none of a single key
         * unless one is left: a pass of KP keys is KP FMA latencies long */
        for (int32_t left = n - j; left > 0; left = n - j) {
            const int32_t kp = left > 5 ? left / 2 : left;
            switch (kp) {
            case 5: tile_dots(5, qt, ldq, d, k, j, i0, s); break;
            case 4: tile_dots(4, qt, ldq, d, k, j, i0, s); break;
            case 3: tile_dots(3, qt, ldq, d, k, j, i0, s); break;
            case 2: tile_dots(2, qt, ldq, d, k, j, i0, s); break;
            default: tile_dots(1, qt, ldq, d, k, j, i0, s); break;
            }
            j += kp;
        }
    }
    /* 2. online softmax along the lanes, 8 at a time */
    for (int32_t i0 = 0; i0 < ldq; i0 += 8) {
        /* every live lane sees the whole chunk: no masks, the padding lanes' weights never read */
        if (kv_tile_sees_all(pos + i0, nv - i0 < 8 ? nv - i0 : 8, j0, n, window))
            tile_softmax(true, nv - i0, ldq, n, j0, pos + i0, window, m + i0, l + i0, s + i0);
        else
            tile_softmax(false, nv - i0, ldq, n, j0, pos + i0, window, m + i0, l + i0, s + i0);
    }
    /* 3. acc[i] = acc[i] corr_i + sum_j w[j][i] v[j]: six vectors by 16
     *    dimensions per step */
    const float *corr = s + (size_t)n * ldq;
    for (int32_t i = 0; i < nv; i += 6) {
        const int32_t ni = nv - i < 6 ? nv - i : 6;
        int32_t all_lo = window > 0 ? pos[i + ni - 1] - window + 1 - j0 : 0, all_hi = pos[i] - j0;
        all_lo = all_lo < 0 ? 0 : all_lo, all_hi = all_hi > n - 1 ? n - 1 : all_hi;
        for (int32_t e0 = 0; e0 < d; e0 += 16) {
#define VALUES(NI) tile_values(NI, s, ldq, d, v, n, j0, pos, window, corr, all_lo, all_hi, i, e0, acc)
            switch (ni) {
            case 6: VALUES(6); break;
            case 5: VALUES(5); break;
            case 4: VALUES(4); break;
            case 3: VALUES(3); break;
            case 2: VALUES(2); break;
            default: VALUES(1); break;
            }
#undef VALUES
        }
    }
}

/* qt[e][i] = scale rows[i][e], eight vectors by eight dims a step, the rows
 * loaded whole and transposed in registers (as in simd_avx512.c). */
static void tile_q(const float *const *rows, int32_t n, int32_t d, float scale, int32_t ldq, float *qt) {
    const __m256 sc = _mm256_set1_ps(scale);
    for (int32_t i0 = 0; i0 < ldq; i0 += 8)
        for (int32_t e0 = 0; e0 < d; e0 += 8) {
            __m256 r[8], a[8], b[8];
#pragma GCC unroll 8
            for (int32_t x = 0; x < 8; x++)
                r[x] = i0 + x < n ? _mm256_mul_ps(_mm256_loadu_ps(rows[i0 + x] + e0), sc) : _mm256_setzero_ps();
            /* within 128-bit lanes: b[4 y + c] lane L holds dim 4 L + c of vectors 4 y .. 4 y + 3 */
#pragma GCC unroll 4
            for (int32_t x = 0; x < 8; x += 2) {
                a[x] = _mm256_unpacklo_ps(r[x], r[x + 1]);
                a[x + 1] = _mm256_unpackhi_ps(r[x], r[x + 1]);
            }
#pragma GCC unroll 2
            for (int32_t x = 0; x < 8; x += 4) {
                b[x] = _mm256_shuffle_ps(a[x], a[x + 2], 0x44);
                b[x + 1] = _mm256_shuffle_ps(a[x], a[x + 2], 0xee);
                b[x + 2] = _mm256_shuffle_ps(a[x + 1], a[x + 3], 0x44);
                b[x + 3] = _mm256_shuffle_ps(a[x + 1], a[x + 3], 0xee);
            }
            /* then across the lanes: dims c and 4 + c from b[c] and b[4 + c] */
            float *out = qt + (size_t)e0 * ldq + i0;
#pragma GCC unroll 4
            for (int32_t c = 0; c < 4; c++) {
                _mm256_storeu_ps(out + (size_t)c * ldq, _mm256_permute2f128_ps(b[c], b[4 + c], 0x20));
                _mm256_storeu_ps(out + (size_t)(4 + c) * ldq, _mm256_permute2f128_ps(b[c], b[4 + c], 0x31));
            }
        }
}

static const kv_simd avx2 = {.name = "avx2", .load_rows = load_rows, .dot_rows = dot_rows, .exp_sum = exp_sum,
                             .axpy_rows = axpy_rows, .decode_scores = decode_scores, .decode_values = decode_values,
                             .tile_block = tile_block, .tile_q = tile_q};

const kv_simd *kv_simd_avx2(void) { return kv_cpu_avx2() ? &avx2 : NULL; }
#else
const kv_simd *kv_simd_avx2(void) { return NULL; }
#endif
