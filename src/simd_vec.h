/* src/simd_vec.h - the vector-width layer under the attention kernels of
 * simd_avx2.c: one set of names for a vector of KV_VW floats, so that each
 * kernel written with them compiles to AVX2 (KV_VW 8: __m256, 16 registers,
 * masks as all-ones lanes) and to AVX-512 (KV_VW 16: __m512, 32 registers,
 * mask registers). Included only by simd_avx2.c, with KV_VW set and the
 * compiler flags of that width. */
#ifndef KV_SIMD_VEC_H
#define KV_SIMD_VEC_H

#include <immintrin.h>

/* Plain static inline: forced inlining moved gcc's register allocation in the
 * AVX-512 decode kernels (docs/PERFORMANCE.md, "Tuning record"). */
#define VINL static inline

#if KV_VW == 8
typedef __m256 vf;
typedef __m256i vi;
typedef __m256i vmask; /* all-ones lanes */
/* The register file: 16 vector registers; the tiles' blocking follows it. */
#define KV_VREGS 16

VINL vf vzero(void) { return _mm256_setzero_ps(); }
VINL vf vset1(float x) { return _mm256_set1_ps(x); }
VINL vf vload(const float *p) { return _mm256_loadu_ps(p); }
VINL void vstore(float *p, vf v) { _mm256_storeu_ps(p, v); }
VINL vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
VINL vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
VINL vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
VINL vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
VINL vf vmin(vf a, vf b) { return _mm256_min_ps(a, b); }
VINL vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }   /* a b + c */
VINL vf vfnma(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); } /* c - a b */
VINL vf vround(vf x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* p 2^n for integral n in the normal range: n built in the exponent field */
VINL vf vpow2_mul(vf p, vf n) {
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23)));
}
VINL float vhsum(vf v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}
VINL float vhmax(vf v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* KV_VW elements of a stored row from element e, as floats; KV_Q8 unscaled.
 * F16 through vcvtph2ps (no AVX-512 FP16 here). */
VINL vf vload_row(kv_dtype t, const unsigned char *row, int32_t e) {
    switch (t) {
    case KV_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * e)));
    case KV_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * e))), 16));
    case KV_Q8: return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + e))));
    default: return _mm256_loadu_ps((const float *)row + e);
    }
}

/* Masks. The tails of rows that are not a multiple of KV_VW long go through
 * masked loads and stores (vmaskload/vmaskstore), lanes not loaded read 0. */
VINL vmask vtail(int32_t n) { /* lanes < n */
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
VINL vf vmaskload(vmask k, const float *p) { return _mm256_maskload_ps(p, k); }
VINL void vmaskstore(float *p, vmask k, vf v) { _mm256_maskstore_ps(p, k, v); }
VINL vi vimaskload(vmask k, const int32_t *p) { return _mm256_maskload_epi32(p, k); }
VINL vf vmaskz(vmask k, vf v) { return _mm256_and_ps(_mm256_castsi256_ps(k), v); }   /* v where k, else 0 */
VINL vf vblend(vmask k, vf a, vf b) { return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(k)); } /* b where k */
VINL vf vmask_max(vf a, vmask k, vf b) { return vblend(k, a, _mm256_max_ps(a, b)); } /* max(a, b) where k */
VINL vmask vmask_and(vmask a, vmask b) { return _mm256_and_si256(a, b); }
VINL vmask vneq(vf a, vf b) { return _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_NEQ_OQ)); }
/* within each 128-bit lane, as vunpcklps, vunpckhps, vshufps */
#define vunpacklo _mm256_unpacklo_ps
#define vunpackhi _mm256_unpackhi_ps
#define vshuffle _mm256_shuffle_ps
VINL vi viset1(int32_t x) { return _mm256_set1_epi32(x); }
VINL vi viadd(vi a, vi b) { return _mm256_add_epi32(a, b); }
VINL vi visub(vi a, vi b) { return _mm256_sub_epi32(a, b); }
VINL vmask vilt(vi a, vi b) { return _mm256_cmpgt_epi32(b, a); } /* a < b */

#elif KV_VW == 16
typedef __m512 vf;
typedef __m512i vi;
typedef __mmask16 vmask;
#define KV_VREGS 32

VINL vf vzero(void) { return _mm512_setzero_ps(); }
VINL vf vset1(float x) { return _mm512_set1_ps(x); }
VINL vf vload(const float *p) { return _mm512_loadu_ps(p); }
VINL void vstore(float *p, vf v) { _mm512_storeu_ps(p, v); }
VINL vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
VINL vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
VINL vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
VINL vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
VINL vf vmin(vf a, vf b) { return _mm512_min_ps(a, b); }
VINL vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
VINL vf vfnma(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
VINL vf vround(vf x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
VINL vf vpow2_mul(vf p, vf n) { return _mm512_scalef_ps(p, n); }
VINL float vhsum(vf v) { return _mm512_reduce_add_ps(v); }
VINL float vhmax(vf v) { return _mm512_reduce_max_ps(v); }

VINL vf vload_row(kv_dtype t, const unsigned char *row, int32_t e) {
    switch (t) {
    case KV_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * e)));
    case KV_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + 2 * e))), 16));
    case KV_Q8: return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + e))));
    default: return _mm512_loadu_ps((const float *)row + e);
    }
}

VINL vmask vtail(int32_t n) { return n >= 16 ? (vmask)0xffff : (vmask)((1u << n) - 1); }
VINL vf vmaskload(vmask k, const float *p) { return _mm512_maskz_loadu_ps(k, p); }
VINL void vmaskstore(float *p, vmask k, vf v) { _mm512_mask_storeu_ps(p, k, v); }
VINL vi vimaskload(vmask k, const int32_t *p) { return _mm512_maskz_loadu_epi32(k, p); }
VINL vf vmaskz(vmask k, vf v) { return _mm512_maskz_mov_ps(k, v); }
VINL vf vblend(vmask k, vf a, vf b) { return _mm512_mask_blend_ps(k, a, b); }
VINL vf vmask_max(vf a, vmask k, vf b) { return _mm512_mask_max_ps(a, k, a, b); }
VINL vmask vmask_and(vmask a, vmask b) { return a & b; }
VINL vmask vneq(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_NEQ_OQ); }
#define vunpacklo _mm512_unpacklo_ps
#define vunpackhi _mm512_unpackhi_ps
#define vshuffle _mm512_shuffle_ps
VINL vi viset1(int32_t x) { return _mm512_set1_epi32(x); }
VINL vi viadd(vi a, vi b) { return _mm512_add_epi32(a, b); }
VINL vi visub(vi a, vi b) { return _mm512_sub_epi32(a, b); }
VINL vmask vilt(vi a, vi b) { return _mm512_cmplt_epi32_mask(a, b); }
#else
#error "KV_VW must be 8 or 16"
#endif

/* e^x: 2^n e^r with |r| <= ln2/2 and a degree-6 Taylor polynomial (relative
 * error < 2e-7); x is clamped to [-87.3, 88.3], so 2^n stays normal and the
 * smallest weight is ~1e-38 rather than 0. NaN and -inf give NaN (simd.h,
 * kv_weight_exp): x + x * 0, and max/min return their second operand when
 * either is NaN, so the constant goes first. */
VINL vf vexp(vf x) {
    x = vfma(x, vzero(), x);
    x = vmax(vset1(KV_EXP_FLOOR), x);
    x = vmin(vset1(88.3f), x);
    const vf n = vround(vmul(x, vset1(1.44269504f)));
    vf r = vfnma(n, vset1(0.693359375f), x);
    r = vfnma(n, vset1(-2.12194440e-4f), r);
    vf p = vset1(1.0f / 720);
    p = vfma(p, r, vset1(1.0f / 120));
    p = vfma(p, r, vset1(1.0f / 24));
    p = vfma(p, r, vset1(1.0f / 6));
    p = vfma(p, r, vset1(0.5f));
    p = vfma(p, r, vset1(1.0f));
    p = vfma(p, r, vset1(1.0f));
    return vpow2_mul(p, n);
}

#endif
