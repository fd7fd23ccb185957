/* src/simd_avx2.c - the attention primitives (see simd.h), written once over
 * the vector-width layer of simd_vec.h and compiled twice: here for AVX2 +
 * FMA + F16C (KV_VW 8: 8 lanes, 16 registers), and again by simd_avx512.c
 * for AVX-512 F/BW/VL/DQ (KV_VW 16: 16 lanes, 32 registers, mask
 * registers). Each instance is compiled with its flags whatever MARCH says
 * and used only when the CPU reports them.
 *
 * Written once: the chunk primitives, e^x, the decode kernels' V pass, and
 * the prefill tile's scores, softmax and query transpose. Written per width,
 * in the two sections marked below, where the register file sets the design:
 * the decode scores and softmax (AVX2 folds the lane sums of several keys
 * with one hadd tree and keeps its softmax maskless; AVX-512 reduces four
 * keys in registers and masks with k registers, and has the int16-query
 * VNNI scores) and the prefill tile's V pass and blocking (six vectors by 16
 * dims in 16 registers; four by 64 in 32). */
#include "simd.h"
#include "cpu.h"

#ifndef KV_VW
#define KV_VW 8
#endif

#if (KV_VW == 8 && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)) || \
    (KV_VW == 16 && defined(__AVX512F__) && defined(__AVX512BW__))
#include <math.h>

#include "simd_vec.h"

/* The kernels' inner parts, inlined where their counts (storage type,
 * vectors, keys or dims a step) are known at compile time, so that their
 * loops unroll and the accumulators stay in registers. */
#define KERNEL_INLINE static inline __attribute__((always_inline)) void

/* ------------------------------------------------------------------ chunks */

static void load_rows(kv_dtype t, const unsigned char *src, size_t stride, const float *scales,
                      int32_t n, int32_t d, float *dst) {
    const int32_t dv = d & ~(KV_VW - 1);
    for (int32_t j = 0; j < n; j++) {
        const unsigned char *row = src + (size_t)j * stride;
        float *out = dst + (size_t)j * d;
        int32_t e = 0;
        switch (t) {
        case KV_F16:
            for (; e < dv; e += KV_VW) vstore(out + e, vload_row(KV_F16, row, e));
            break;
        case KV_BF16:
            for (; e < dv; e += KV_VW) vstore(out + e, vload_row(KV_BF16, row, e));
            break;
        case KV_Q8: {
            const vf s = vset1(scales[j]);
            for (; e < dv; e += KV_VW) vstore(out + e, vmul(s, vload_row(KV_Q8, row, e)));
            break;
        }
        default: break;
        }
        if (e < d)
            kv_load_row(t, row + (size_t)e * (size_t)kv_elem_bytes(t), scales ? scales + j : NULL, out + e, d - e);
    }
}

/* p[e..e + KV_VW), as far as p[d - 1] (the rest read as 0) */
VINL vf vload_upto(const float *p, int32_t e, int32_t d) {
    return d - e >= KV_VW ? vload(p + e) : vmaskload(vtail(d - e), p + e);
}

static void dot_rows(const float *q, int32_t nv, const float *k, int32_t n, int32_t d, float *s,
                     int32_t lds) {
    for (int32_t i = 0; i < nv; i++) {
        const float *qi = q + (size_t)i * d;
        int32_t j = 0;
        for (; j + 4 <= n; j += 4) { /* four keys at once: four independent FMA chains */
            const float *k0 = k + (size_t)j * d, *k1 = k0 + d, *k2 = k1 + d, *k3 = k2 + d;
            vf a0 = vzero(), a1 = a0, a2 = a0, a3 = a0;
            for (int32_t e = 0; e < d; e += KV_VW) {
                const vf qv = vload_upto(qi, e, d);
                a0 = vfma(qv, vload_upto(k0, e, d), a0);
                a1 = vfma(qv, vload_upto(k1, e, d), a1);
                a2 = vfma(qv, vload_upto(k2, e, d), a2);
                a3 = vfma(qv, vload_upto(k3, e, d), a3);
            }
            float *si = s + (size_t)i * lds + j;
            si[0] = vhsum(a0), si[1] = vhsum(a1), si[2] = vhsum(a2), si[3] = vhsum(a3);
        }
        for (; j < n; j++) {
            const float *kj = k + (size_t)j * d;
            vf a = vzero();
            for (int32_t e = 0; e < d; e += KV_VW) a = vfma(vload_upto(qi, e, d), vload_upto(kj, e, d), a);
            s[(size_t)i * lds + j] = vhsum(a);
        }
    }
}

static float exp_sum(float *s, int32_t n, float mx) {
    const vf m = vset1(mx);
    vf sum = vzero();
    int32_t j = 0;
    for (; j + KV_VW <= n; j += KV_VW) {
        const vf e = vexp(vsub(vload(s + j), m));
        vstore(s + j, e);
        sum = vadd(sum, e);
    }
    if (j < n) {
        const vmask k = vtail(n - j);
        const vf e = vexp(vsub(vmaskload(k, s + j), m));
        vmaskstore(s + j, k, e);
        sum = vadd(sum, vmaskz(k, e));
    }
    return vhsum(sum);
}

static void axpy_rows(const float *p, const float *v, int32_t n, int32_t d, float corr, float *acc) {
    const vf c = vset1(corr);
    int32_t e = 0;
    for (; e + 4 * KV_VW <= d; e += 4 * KV_VW) { /* four accumulators stay in registers over all rows */
        vf a0 = vmul(c, vload(acc + e)), a1 = vmul(c, vload(acc + e + KV_VW));
        vf a2 = vmul(c, vload(acc + e + 2 * KV_VW)), a3 = vmul(c, vload(acc + e + 3 * KV_VW));
        for (int32_t j = 0; j < n; j++) {
            const float *vj = v + (size_t)j * d + e;
            const vf pj = vset1(p[j]);
            a0 = vfma(pj, vload(vj), a0);
            a1 = vfma(pj, vload(vj + KV_VW), a1);
            a2 = vfma(pj, vload(vj + 2 * KV_VW), a2);
            a3 = vfma(pj, vload(vj + 3 * KV_VW), a3);
        }
        vstore(acc + e, a0);
        vstore(acc + e + KV_VW, a1);
        vstore(acc + e + 2 * KV_VW, a2);
        vstore(acc + e + 3 * KV_VW, a3);
    }
    for (; e < d; e += KV_VW) {
        const vmask k = vtail(d - e);
        vf a = vmul(c, vmaskload(k, acc + e));
        for (int32_t j = 0; j < n; j++) a = vfma(vset1(p[j]), vmaskload(k, v + (size_t)j * d + e), a);
        vmaskstore(acc + e, k, a);
    }
}

/* ------------------------------------------------------------------ decode */

/* acc = acc * corr + sum_j p_j v_j over keys jlo..jhi, which every one of
 * the NV vectors sees, for the NE x KV_VW dims from e: those dims of every
 * vector in registers while the V rows stream past, each converted once.
 * A step of `walk` a key (AVX2: step 0, it asks for its rows a pass at a
 * time). */
KERNEL_INLINE values_pass(const kv_dtype t, const int32_t NV, const int32_t NE, int32_t d, const unsigned char *v,
                          size_t stride, int32_t e, int32_t jlo, int32_t jhi, float (*s)[16], const float *corr,
                          float *acc, kv_ahead_walk *walk, int32_t step) {
    vf a[KV_DECODE_VECS][8];
#pragma GCC unroll 8
    for (int32_t i = 0; i < NV; i++) {
        const vf c = vset1(corr[i]);
#pragma GCC unroll 8
        for (int32_t y = 0; y < NE; y++) a[i][y] = vmul(c, vload(acc + (size_t)i * d + e + KV_VW * y));
    }
    for (int32_t jv = jlo; jv <= jhi; jv++) {
        kv_ahead_next(walk, step);
        const unsigned char *row = v + (size_t)jv * stride;
        vf x[8];
#pragma GCC unroll 8
        for (int32_t y = 0; y < NE; y++) x[y] = vload_row(t, row, e + KV_VW * y);
#pragma GCC unroll 8
        for (int32_t i = 0; i < NV; i++) {
            const vf p = vset1(s[i][jv]);
#pragma GCC unroll 8
            for (int32_t y = 0; y < NE; y++) a[i][y] = vfma(p, x[y], a[i][y]);
        }
    }
#pragma GCC unroll 8
    for (int32_t i = 0; i < NV; i++)
#pragma GCC unroll 8
        for (int32_t y = 0; y < NE; y++) vstore(acc + (size_t)i * d + e + KV_VW * y, a[i][y]);
}

#if KV_VW == 8 /* -------------------------------------------- AVX2 decode */

/* Raw scores of keys j..j+KP-1 against NV <= 4 vectors, into tmp [NV][16][8]
 * lane sums: NV * KP independent FMA chains (FMA latency 4 x 2 pipes wants
 * at least 8), each K element converted once, each 8 elements of q loaded
 * once for the KP keys (NV + 1 + NV * KP registers of 16: loads, at most two
 * 256-bit ones a cycle, would bound the FMAs if q came from L1 per key). */
KERNEL_INLINE dots_pass(const kv_dtype t, const int32_t NV, const int32_t KP, const float *q, int32_t d,
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
            const __m256 kv = vload_row(t, row + (size_t)kk * stride, e);
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
KERNEL_INLINE dots_impl(const kv_dtype t, const int32_t NV, const float *q, int32_t d, const unsigned char *k,
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


/* The online-softmax update of NV vectors that all see the whole block of 16
 * keys (most blocks): unrolled over the vectors, so that their exp chains
 * overlap. */
KERNEL_INLINE softmax_full(const int32_t NV, const float *ks, const float *vs, float *m, float *l, float (*s)[16],
                           float *corr) {
    __m256 s0[KV_DECODE_VECS], s1[KV_DECODE_VECS];
    float bm[KV_DECODE_VECS];
#pragma GCC unroll 8
    for (int32_t i = 0; i < NV; i++) {
        s0[i] = _mm256_loadu_ps(s[i]), s1[i] = _mm256_loadu_ps(s[i] + 8);
        if (ks) s0[i] = _mm256_mul_ps(s0[i], _mm256_loadu_ps(ks)), s1[i] = _mm256_mul_ps(s1[i], _mm256_loadu_ps(ks + 8));
        bm[i] = vhmax(_mm256_max_ps(s0[i], s1[i]));
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
        __m256 p0 = vexp(_mm256_sub_ps(s0[i], mv)), p1 = vexp(_mm256_sub_ps(s1[i], mv));
        l[i] = l[i] * corr[i] + vhsum(_mm256_add_ps(p0, p1));
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
        const float bm = vhmax(_mm256_max_ps(s0, s1));
        /* a new max rescales the old state; an unchanged one (most blocks) by
         * exactly 1, no exp; a NaN m (poisoned before) stays */
        float mx = m[i];
        corr[i] = 1.0f;
        if (bm > mx) corr[i] = kv_corr_exp(mx, bm), mx = bm;
        const __m256 mv = _mm256_set1_ps(mx);
        __m256 p0 = _mm256_and_ps(vis0, vexp(_mm256_sub_ps(s0, mv)));
        __m256 p1 = _mm256_and_ps(vis1, vexp(_mm256_sub_ps(s1, mv)));
        l[i] = l[i] * corr[i] + vhsum(_mm256_add_ps(p0, p1));
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
 * NV <= 4 vectors sees: passes of 16 dims (NV x 2 accumulators of the 16
 * registers), each asking first for its share of the rows ahead, 16 rows over
 * the whole row (a walk's steps a key cost these passes half their speed). */
KERNEL_INLINE values_group(const kv_dtype t, const int32_t NV, int32_t d, const unsigned char *v, size_t stride,
                           int32_t jlo, int32_t jhi, float (*w)[16], const float *corr, float *acc,
                           const kv_ahead *ahead) {
    const int32_t per = (16 + d / 16 - 1) / (d / 16); /* rows ahead per 16 dims: 16 over the row */
    const int32_t row_bytes = d * kv_elem_bytes(t);
    kv_ahead_walk none = kv_ahead_start(&kv_no_ahead);
    for (int32_t e = 0; e < d; e += 16) {
        kv_ahead_rows(ahead, row_bytes, e / 16 * per, e / 16 * per + per);
        values_pass(t, NV, 2, d, v, stride, e, jlo, jhi, w, corr, acc, &none, 0);
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

#else /* ------------------------------------------------------ AVX-512 decode */

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
        __m512 p = _mm512_maskz_mov_ps(vis, vexp(_mm512_sub_ps(si, _mm512_set1_ps(mx))));
        l[i] = l[i] * corr[i] + _mm512_reduce_add_ps(p);
        m[i] = mx;
        if (vs) p = _mm512_mul_ps(p, vsv);
        _mm512_storeu_ps(s[i], p);
    }
}

KERNEL_INLINE scores_impl(const kv_dtype t, const int32_t nv, const float *q, int32_t d, const unsigned char *k,
                          size_t stride, const float *ks, const float *vs, int32_t n, const int32_t *lo,
                          const int32_t *hi, float *m, float *l, float (*s)[16], float *corr, const kv_ahead *ahead) {
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
                __m512 k0 = vload_row(t, r0, e), k1 = vload_row(t, r1, e);
                __m512 k2 = vload_row(t, r2, e), k3 = vload_row(t, r3, e);
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
            __m512 kv = vload_row(t, row, e);
#pragma GCC unroll 8
            for (int32_t i = 0; i < nv; i++) a[i] = _mm512_fmadd_ps(_mm512_loadu_ps(q + (size_t)i * d + e), kv, a[i]);
        }
#pragma GCC unroll 8
        for (int32_t i = 0; i < nv; i++) s[i][j] = _mm512_reduce_add_ps(a[i]);
    }
    softmax_block(nv, ks, vs, n, lo, hi, m, l, s, corr, &walk, step);
    kv_ahead_next(&walk, kv_ahead_lines(ahead)); /* the rest */
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
#endif

/* ------------------------------------------------------------------ prefill */

/* s[j][i] = k[j] . qt[:, i] for KB keys j and the KV_VW or 2 KV_VW (two)
 * vectors i from qt, s rows ldq apart: the keys' elements broadcast, the
 * vectors along the lanes (no reductions), KB or 2 KB independent FMA chains. */
KERNEL_INLINE tile_scores(const int32_t KB, const bool two, const float *qt, int32_t ldq, int32_t d, const float *k,
                          float *s) {
    vf a[8][2];
#pragma GCC unroll 8
    for (int32_t x = 0; x < KB; x++) a[x][0] = a[x][1] = vzero();
    for (int32_t e = 0; e < d; e++) {
        const float *qe = qt + (size_t)e * ldq;
        const vf q0 = vload(qe), q1 = two ? vload(qe + KV_VW) : q0;
#pragma GCC unroll 8
        for (int32_t x = 0; x < KB; x++) {
            const vf b = vset1(k[(size_t)x * d + e]);
            a[x][0] = vfma(b, q0, a[x][0]);
            if (two) a[x][1] = vfma(b, q1, a[x][1]);
        }
    }
#pragma GCC unroll 8
    for (int32_t x = 0; x < KB; x++) {
        vstore(s + (size_t)x * ldq, a[x][0]);
        if (two) vstore(s + (size_t)x * ldq + KV_VW, a[x][1]);
    }
}

/* Running maxima of tile_softmax: one alone waits out each max's latency,
 * key after key. Four at AVX-512's width (docs/PERFORMANCE.md, "Tuning
 * record"); AVX2, whose masks take registers of the sixteen, keeps one. */
#define TILE_MAX_CHAINS (KV_VREGS == 32 ? 4 : 1)

/* The online-softmax update of KV_VW lanes from the raw scores s[j] (rows
 * ldq apart) of n keys from j0: the visible keys of each lane, the new max,
 * weights in place (zero where not visible), sums, and corr in the row after
 * the weights. `all`: every key is visible to every lane, no masks. The max
 * is exact in any order; a NaN score makes its weight NaN whichever running
 * maximum it lands in. */
KERNEL_INLINE tile_softmax(const bool all, int32_t live_n, int32_t ldq, int32_t n, int32_t j0, const int32_t *pos,
                           int32_t window, float *m, float *l, float *s) {
    const vmask live = vtail(live_n);
    const vi p = vimaskload(live, pos);
    /* visible: p - window < key <= p, i.e. lo < key < p + 1 */
    const vi lo = window > 0 ? visub(p, viset1(window)) : viset1(INT32_MIN), p1 = viadd(p, viset1(1));
#define VISIBLE(j) vmask_and(live, vmask_and(vilt(viset1(j0 + (j)), p1), vilt(lo, viset1(j0 + (j)))))
#define MAX(mx, j) (all ? vmax(mx, vload(s + (size_t)(j) * ldq)) : vmask_max(mx, VISIBLE(j), vload(s + (size_t)(j) * ldq)))
    const vf mold = vload(m);
    vf mc[TILE_MAX_CHAINS];
#pragma GCC unroll 4
    for (int32_t u = 0; u < TILE_MAX_CHAINS; u++) mc[u] = mold;
    int32_t j = 0;
    for (; j + TILE_MAX_CHAINS <= n; j += TILE_MAX_CHAINS)
#pragma GCC unroll 4
        for (int32_t u = 0; u < TILE_MAX_CHAINS; u++) mc[u] = MAX(mc[u], j + u);
    for (; j < n; j++) mc[0] = MAX(mc[0], j);
#if TILE_MAX_CHAINS == 4
    const vf mx = vmax(vmax(mc[0], mc[1]), vmax(mc[2], mc[3]));
#else
    const vf mx = mc[0];
#endif
    /* corr = e^(m_old - m_new); 1 where nothing was ever seen, 0 on the
     * first sight (a NaN max counts as unseen: its weights are NaN) */
    const vf ninf = vset1(-INFINITY);
    const vmask seen = vneq(mx, ninf), had = vneq(mold, ninf);
    vf corr = vblend(seen, vset1(1.0f), vzero());
    corr = vblend(vmask_and(seen, had), corr, vexp(vsub(mold, mx)));
    vf sum = vmul(vload(l), corr);
    for (j = 0; j < n; j++) {
        float *sj = s + (size_t)j * ldq;
        vf w = vexp(vsub(vload(sj), mx));
        if (!all) w = vmaskz(VISIBLE(j), w);
        vstore(sj, w);
        sum = vadd(sum, w);
    }
#undef MAX
#undef VISIBLE
    vstore(l, sum);
    vstore(m, mx);
    vstore(s + (size_t)n * ldq, corr);
}

/* Step 2 of tile_block: the online softmax along the lanes, KV_VW at a time. */
static inline void tile_softmax_lanes(int32_t nv, int32_t ldq, int32_t n, int32_t j0, const int32_t *pos,
                                      int32_t window, float *m, float *l, float *s) {
    for (int32_t i0 = 0; i0 < ldq; i0 += KV_VW) {
        /* every live lane sees the whole chunk: no masks, the padding lanes' weights never read */
        if (kv_tile_sees_all(pos + i0, nv - i0 < KV_VW ? nv - i0 : KV_VW, j0, n, window))
            tile_softmax(true, nv - i0, ldq, n, j0, pos + i0, window, m + i0, l + i0, s + i0);
        else
            tile_softmax(false, nv - i0, ldq, n, j0, pos + i0, window, m + i0, l + i0, s + i0);
    }
}

#if KV_VW == 8 /* ------------------------------------ AVX2 tile V pass, blocking */

/* acc[i0 + x] = acc * corr + sum_j w[j][i0 + x] v[j] over the 16 dims from
 * e0, for the NI <= 6 vectors from i0: keys all_lo..all_hi, which every one
 * of them sees, in the unrolled loop; the others only for the vectors that see
 * them (a weight of 0 times a NaN or infinite V would still poison a vector). */
KERNEL_INLINE tile_values(const int32_t NI, const float *s, int32_t ldq, int32_t d, const float *v, int32_t n,
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

static void tile_block(const float *qt, int32_t nv, int32_t ldq, int32_t d, const float *k, const float *v,
                       int32_t n, int32_t j0, const int32_t *pos, int32_t window, float *m, float *l, float *acc,
                       float *s) {
    /* 1. scores, six keys by 16 vectors per step */
    for (int32_t i0 = 0; i0 < ldq; i0 += 16) {
        int32_t j = 0;
        for (; n - j >= 10; j += 6) tile_scores(6, true, qt + i0, ldq, d, k + (size_t)j * d, s + (size_t)j * ldq + i0);
        /* the last 0..9 keys in at most two passes, none of a single key
         * unless one is left: a pass of KP keys is KP FMA latencies long */
        for (int32_t left = n - j; left > 0; left = n - j) {
            const int32_t kp = left > 5 ? left / 2 : left;
            switch (kp) {
            case 5: tile_scores(5, true, qt + i0, ldq, d, k + (size_t)j * d, s + (size_t)j * ldq + i0); break;
            case 4: tile_scores(4, true, qt + i0, ldq, d, k + (size_t)j * d, s + (size_t)j * ldq + i0); break;
            case 3: tile_scores(3, true, qt + i0, ldq, d, k + (size_t)j * d, s + (size_t)j * ldq + i0); break;
            case 2: tile_scores(2, true, qt + i0, ldq, d, k + (size_t)j * d, s + (size_t)j * ldq + i0); break;
            default: tile_scores(1, true, qt + i0, ldq, d, k + (size_t)j * d, s + (size_t)j * ldq + i0); break;
            }
            j += kp;
        }
    }
    /* 2. online softmax along the lanes */
    tile_softmax_lanes(nv, ldq, n, j0, pos, window, m, l, s);
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

#else /* ------------------------------------------- AVX-512 tile V pass, blocking */

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
    /* 2. online softmax along the lanes */
    tile_softmax_lanes(nv, ldq, n, j0, pos, window, m, l, s);
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
#endif

/* qt[e][i] = scale rows[i][e], KV_VW vectors by KV_VW dims a step: the rows
 * loaded whole (KV_VW lines in flight, where one float a step kept the reads
 * of q from memory waiting) and transposed in registers. */
static void tile_q(const float *const *rows, int32_t n, int32_t d, float scale, int32_t ldq, float *qt) {
    const vf sc = vset1(scale);
    for (int32_t i0 = 0; i0 < ldq; i0 += KV_VW)
        for (int32_t e0 = 0; e0 < d; e0 += KV_VW) {
            vf r[KV_VW], a[KV_VW], b[KV_VW];
#pragma GCC unroll 16
            for (int32_t x = 0; x < KV_VW; x++)
                r[x] = i0 + x < n ? vmul(vload(rows[i0 + x] + e0), sc) : vzero();
            /* within 128-bit lanes: b[4 y + c] lane L holds dim 4 L + c of vectors 4 y .. 4 y + 3 */
#pragma GCC unroll 8
            for (int32_t x = 0; x < KV_VW; x += 2) {
                a[x] = vunpacklo(r[x], r[x + 1]);
                a[x + 1] = vunpackhi(r[x], r[x + 1]);
            }
#pragma GCC unroll 4
            for (int32_t x = 0; x < KV_VW; x += 4) {
                b[x] = vshuffle(a[x], a[x + 2], 0x44);
                b[x + 1] = vshuffle(a[x], a[x + 2], 0xee);
                b[x + 2] = vshuffle(a[x + 1], a[x + 3], 0x44);
                b[x + 3] = vshuffle(a[x + 1], a[x + 3], 0xee);
            }
            /* then across the 128-bit lanes */
            float *out = qt + (size_t)e0 * ldq + i0;
#pragma GCC unroll 4
            for (int32_t c = 0; c < 4; c++) {
#if KV_VW == 8 /* dims c and 4 + c from b[c] and b[4 + c] */
                vstore(out + (size_t)c * ldq, _mm256_permute2f128_ps(b[c], b[4 + c], 0x20));
                vstore(out + (size_t)(4 + c) * ldq, _mm256_permute2f128_ps(b[c], b[4 + c], 0x31));
#else /* dims c, 4 + c, 8 + c, 12 + c from b[c], b[4 + c], b[8 + c], b[12 + c] */
                const vf p = _mm512_shuffle_f32x4(b[c], b[4 + c], 0x88), q = _mm512_shuffle_f32x4(b[c], b[4 + c], 0xdd);
                const vf p2 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0x88);
                const vf q2 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0xdd);
                vstore(out + (size_t)c * ldq, _mm512_shuffle_f32x4(p, p2, 0x88));
                vstore(out + (size_t)(8 + c) * ldq, _mm512_shuffle_f32x4(p, p2, 0xdd));
                vstore(out + (size_t)(4 + c) * ldq, _mm512_shuffle_f32x4(q, q2, 0x88));
                vstore(out + (size_t)(12 + c) * ldq, _mm512_shuffle_f32x4(q, q2, 0xdd));
#endif
            }
        }
}

#if KV_VW == 8
static const kv_simd avx2 = {.name = "avx2", .load_rows = load_rows, .dot_rows = dot_rows, .exp_sum = exp_sum,
                             .axpy_rows = axpy_rows, .decode_scores = decode_scores, .decode_values = decode_values,
                             .tile_block = tile_block, .tile_q = tile_q};

const kv_simd *kv_simd_avx2(void) { return kv_cpu_avx2() ? &avx2 : NULL; }
#else
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
#endif
#elif KV_VW == 8
const kv_simd *kv_simd_avx2(void) { return NULL; }
#else
const kv_simd *kv_simd_avx512(void) { return NULL; }
#endif
