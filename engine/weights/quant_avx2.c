/* engine/weights/quant_avx2.c - SIMD decoders (AVX2 + F16C), dot-product tiles and
 * fused decode-and-dot kernels (256-bit by default, 512-bit with
 * -DLLM_QUANT_ZMM), the "avx2" table of quant_kern.h. Compiled with -mavx2
 * -mfma -mf16c whatever MARCH says and used only when CPUID reports them;
 * quant_avx512.c compiles this same file again with AVX-512 flags (32
 * registers) as the "avx512" table.
 *
 * Decoders write floats equal to the scalar decoders' up to one rounding
 * (Q4_1 and the K-quants use a fused multiply-add here, two roundings there). */
#include "quant_kern.h"
#include "quant_simd.h"

#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

/* ------------------------------------------------------------ decoders */

/* 8 bytes (low half of v) to 8 floats, signed or unsigned */
static inline __m256 i8_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }
static inline __m256 u8_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }

/* y[0..16) = d * (signed bytes of v) */
static inline void put16_i8(float *y, __m128i v, __m256 d) {
    _mm256_storeu_ps(y, _mm256_mul_ps(i8_ps(v), d));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(i8_ps(_mm_srli_si128(v, 8)), d));
}

/* y[0..16) = d * (unsigned bytes of v) + o */
static inline void put16_u8(float *y, __m128i v, __m256 d, __m256 o) {
    _mm256_storeu_ps(y, _mm256_fmadd_ps(u8_ps(v), d, o));
    _mm256_storeu_ps(y + 8, _mm256_fmadd_ps(u8_ps(_mm_srli_si128(v, 8)), d, o));
}

/* y[0..32) = d * (unsigned bytes of v) + o */
static inline void put32_u8(float *y, __m256i v, __m256 d, __m256 o) {
    put16_u8(y, _mm256_castsi256_si128(v), d, o);
    put16_u8(y + 16, _mm256_extracti128_si256(v, 1), d, o);
}

static void deq_q4_0(const uint8_t *b, float *y, int64_t nb) {
    const __m128i m4 = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
    for (int64_t i = 0; i < nb; i++, b += sizeof(llm_block_q4_0), y += LLM_QK) {
        __m256 d = _mm256_set1_ps(half_at(b + offsetof(llm_block_q4_0, d)));
        __m128i q = _mm_loadu_si128((const __m128i *)(b + offsetof(llm_block_q4_0, qs)));
        /* q - 8 in the integers keeps the product exact up to one rounding, like the scalar code */
        put16_i8(y, _mm_sub_epi8(_mm_and_si128(q, m4), eight), d);
        put16_i8(y + 16, _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m4), eight), d);
    }
}

/* The 32 values q - 16 of a Q5_0 block: elements 0..15 in *lo, 16..31 in *hi. */
static inline void q5_0_bytes(const uint8_t *p, __m128i *lo, __m128i *hi) {
    const __m128i sixteen = _mm_set1_epi8(16);
    q5_0_unsigned(p, lo, hi);
    *lo = _mm_sub_epi8(*lo, sixteen);
    *hi = _mm_sub_epi8(*hi, sixteen);
}

static void deq_q5_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += sizeof(llm_block_q5_0), y += LLM_QK) {
        __m256 d = _mm256_set1_ps(half_at(b + offsetof(llm_block_q5_0, d)));
        __m128i lo, hi;
        q5_0_bytes(b, &lo, &hi);
        put16_i8(y, lo, d);
        put16_i8(y + 16, hi, d);
    }
}

static void deq_q4_1(const uint8_t *b, float *y, int64_t nb) {
    const __m128i m4 = _mm_set1_epi8(15);
    for (int64_t i = 0; i < nb; i++, b += sizeof(llm_block_q4_1), y += LLM_QK) {
        __m256 d = _mm256_set1_ps(half_at(b + offsetof(llm_block_q4_1, d)));
        __m256 m = _mm256_set1_ps(half_at(b + offsetof(llm_block_q4_1, m)));
        __m128i q = _mm_loadu_si128((const __m128i *)(b + offsetof(llm_block_q4_1, qs)));
        put16_u8(y, _mm_and_si128(q, m4), d, m);
        put16_u8(y + 16, _mm_and_si128(_mm_srli_epi16(q, 4), m4), d, m);
    }
}

static void deq_q8_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += sizeof(llm_block_q8_0), y += LLM_QK) {
        __m256 d = _mm256_set1_ps(half_at(b + offsetof(llm_block_q8_0, d)));
        const uint8_t *qs = b + offsetof(llm_block_q8_0, qs);
        put16_i8(y, _mm_loadu_si128((const __m128i *)qs), d);
        put16_i8(y + 16, _mm_loadu_si128((const __m128i *)(qs + 16)), d);
    }
}

/* Q4_K (five == 0) and Q5_K: see the element order in quant.h */
static void deq_k45(const uint8_t *b, float *y, int64_t nb, int five) {
    const __m256i m4 = _mm256_set1_epi8(15), sixteen = _mm256_set1_epi8(16);
    size_t bsz = five ? sizeof(llm_block_q5_k) : sizeof(llm_block_q4_k);
    size_t qs_at = five ? offsetof(llm_block_q5_k, qs) : offsetof(llm_block_q4_k, qs);
    for (int64_t i = 0; i < nb; i++, b += bsz, y += LLM_QK_K) {
        float d = half_at(b + offsetof(llm_block_q4_k, d));
        float dmin = half_at(b + offsetof(llm_block_q4_k, dmin));
        const uint8_t *sc = b + offsetof(llm_block_q4_k, scales);
        __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(b + offsetof(llm_block_q5_k, qh)))
                          : _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            uint8_t s1, m1, s2, m2;
            llm_k_scale_min(sc, 2 * g, &s1, &m1);
            llm_k_scale_min(sc, 2 * g + 1, &s2, &m2);
            __m256i q = _mm256_loadu_si256((const __m256i *)(b + qs_at + 32 * g));
            __m256i lo = _mm256_and_si256(q, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (five) {   /* bit 2g of qh[l] is the fifth bit of the low half, 2g+1 of the high */
                __m256i b1 = _mm256_set1_epi8((char)(1 << (2 * g)));
                __m256i b2 = _mm256_set1_epi8((char)(1 << (2 * g + 1)));
                lo = _mm256_or_si256(lo, _mm256_and_si256(
                         _mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), sixteen));
                hi = _mm256_or_si256(hi, _mm256_and_si256(
                         _mm256_cmpeq_epi8(_mm256_and_si256(qh, b2), b2), sixteen));
            }
            put32_u8(y + 64 * g, lo, _mm256_set1_ps(d * s1), _mm256_set1_ps(-dmin * m1));
            put32_u8(y + 64 * g + 32, hi, _mm256_set1_ps(d * s2), _mm256_set1_ps(-dmin * m2));
        }
    }
}

static void deq_q6_k(const uint8_t *b, float *y, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(0x30);
    const __m256i off = _mm256_set1_epi8(32);
    for (int64_t i = 0; i < nb; i++, b += sizeof(llm_block_q6_k), y += LLM_QK_K) {
        float d = half_at(b + offsetof(llm_block_q6_k, d));
        const int8_t *sc = (const int8_t *)(b + offsetof(llm_block_q6_k, scales));
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b + offsetof(llm_block_q6_k, ql) + 64 * h;
            __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i hb = _mm256_loadu_si256((const __m256i *)(b + offsetof(llm_block_q6_k, qh) + 32 * h));
            /* 16-bit shifts move bits across the byte boundary; the masks drop them */
            __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m3)),
                _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m3)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m3)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                _mm256_and_si256(_mm256_srli_epi16(hb, 2), m3)),
            };
            for (int s = 0; s < 4; s++) {
                __m256i v = _mm256_sub_epi8(q[s], off);
                int si = 8 * h + 2 * s;               /* scale of elements 32s..32s+15 */
                float *ys = y + 128 * h + 32 * s;
                put16_i8(ys, _mm256_castsi256_si128(v), _mm256_set1_ps(d * (float)sc[si]));
                put16_i8(ys + 16, _mm256_extracti128_si256(v, 1), _mm256_set1_ps(d * (float)sc[si + 1]));
            }
        }
    }
}

static void deq_q5_1(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += sizeof(llm_block_q5_1), y += LLM_QK) {
        __m256 d = _mm256_set1_ps(half_at(b + offsetof(llm_block_q5_1, d)));
        __m256 m = _mm256_set1_ps(half_at(b + offsetof(llm_block_q5_1, m)));
        __m128i lo, hi;
        q5_0_bits(b + offsetof(llm_block_q5_1, qh), b + offsetof(llm_block_q5_1, qs), &lo, &hi);
        put16_u8(y, lo, d, m);
        put16_u8(y + 16, hi, d, m);
    }
}

/* Q2_K and Q3_K: element 128h + 32j + l is bits 2j, 2j+1 of qs[32h + l]
 * (Q3_K: less 4 where bit 4h + j of hmask[l] is clear); sub-block 8h + 2j
 * for l < 16, the next one above */
static inline __m256i crumbs(const uint8_t *qs, int j) {
    return _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)qs), 2 * j), _mm256_set1_epi8(3));
}

static void deq_q2_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += sizeof(llm_block_q2_k), y += LLM_QK_K) {
        const float d = half_at(b + offsetof(llm_block_q2_k, d)), dmin = half_at(b + offsetof(llm_block_q2_k, dmin));
        const uint8_t *sc = b + offsetof(llm_block_q2_k, scales);
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++) {
                __m256i v = crumbs(b + offsetof(llm_block_q2_k, qs) + 32 * h, j);
                const int s = 8 * h + 2 * j;
                float *ys = y + 128 * h + 32 * j;
                put16_u8(ys, _mm256_castsi256_si128(v), _mm256_set1_ps(d * (float)(sc[s] & 15)),
                         _mm256_set1_ps(-(dmin * (float)(sc[s] >> 4))));
                put16_u8(ys + 16, _mm256_extracti128_si256(v, 1), _mm256_set1_ps(d * (float)(sc[s + 1] & 15)),
                         _mm256_set1_ps(-(dmin * (float)(sc[s + 1] >> 4))));
            }
    }
}

static void deq_q3_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += sizeof(llm_block_q3_k), y += LLM_QK_K) {
        const float d = half_at(b + offsetof(llm_block_q3_k, d));
        const uint8_t *sc = b + offsetof(llm_block_q3_k, scales);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)(b + offsetof(llm_block_q3_k, hmask)));
        float dl[16];
        for (int s = 0; s < 16; s++) {
            int lo = s < 8 ? sc[s] & 15 : sc[s - 8] >> 4, hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
            dl[s] = d * (float)((lo | hi << 4) - 32);
        }
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++) {
                const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + j)));
                const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
                __m256i v = _mm256_sub_epi8(crumbs(b + offsetof(llm_block_q3_k, qs) + 32 * h, j),
                                            _mm256_andnot_si256(set, _mm256_set1_epi8(4)));
                const int s = 8 * h + 2 * j;
                float *ys = y + 128 * h + 32 * j;
                put16_i8(ys, _mm256_castsi256_si128(v), _mm256_set1_ps(dl[s]));
                put16_i8(ys + 16, _mm256_extracti128_si256(v, 1), _mm256_set1_ps(dl[s + 1]));
            }
    }
}

static void deq_f16(const uint8_t *src, float *y, int64_t n) {
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(y + k, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + 2 * k))));
    for (; k < n; k++) y[k] = half_at(src + 2 * k);
}

static void deq_bf16(const uint8_t *src, float *y, int64_t n) {
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + 2 * k)));
        _mm256_storeu_ps(y + k, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; k < n; k++) {
        uint32_t u = (uint32_t)(src[2 * k] | (src[2 * k + 1] << 8)) << 16;
        memcpy(&y[k], &u, 4);
    }
}

static int simd_dequant(int type, const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    switch (type) {
    case LLM_TYPE_F16:  deq_f16(b, dst, n); return 0;
    case LLM_TYPE_BF16: deq_bf16(b, dst, n); return 0;
    case LLM_TYPE_Q4_0: deq_q4_0(b, dst, n / LLM_QK); return 0;
    case LLM_TYPE_Q4_1: deq_q4_1(b, dst, n / LLM_QK); return 0;
    case LLM_TYPE_Q5_0: deq_q5_0(b, dst, n / LLM_QK); return 0;
    case LLM_TYPE_Q8_0: deq_q8_0(b, dst, n / LLM_QK); return 0;
    case LLM_TYPE_Q4_K: deq_k45(b, dst, n / LLM_QK_K, 0); return 0;
    case LLM_TYPE_Q5_K: deq_k45(b, dst, n / LLM_QK_K, 1); return 0;
    case LLM_TYPE_Q6_K: deq_q6_k(b, dst, n / LLM_QK_K); return 0;
    case LLM_TYPE_Q5_1: deq_q5_1(b, dst, n / LLM_QK); return 0;
    case LLM_TYPE_Q2_K: deq_q2_k(b, dst, n / LLM_QK_K); return 0;
    case LLM_TYPE_Q3_K: deq_q3_k(b, dst, n / LLM_QK_K); return 0;
    default: return -1;
    }
}

/* ------------------------------------------------------------ dot tiles */

/* Every (r, t) pair has one vector accumulator fed in k order, and lanes are
 * folded the same way in every shape, so a result does not depend on which
 * tile computed it. R and T are constants at each call site; after inlining
 * the loops unroll and the accumulators live in registers. */
#if defined(__AVX512F__) && defined(LLM_QUANT_ZMM)

/* out[i] = sum of the 16 lanes of v[i], i < nout. A transposed tree: each
 * output lane only ever adds lanes of one input, in the same order whatever
 * the other inputs hold, so unused inputs can be anything. About 45 ops for
 * 16 sums where 16 separate horizontal sums take about 160. */
static inline void reduce16(const __m512 v[16], float *out, int nout) {
    __m512 s[8], u[4];
    for (int i = 0; i < 8; i++)   /* per 128-bit block: [a0+a2, b0+b2, a1+a3, b1+b3] */
        s[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) { /* per block: the block sums of 4 inputs */
        __m512d a = _mm512_castps_pd(s[2 * i]), b = _mm512_castps_pd(s[2 * i + 1]);
        u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    /* add the 4 blocks of each u: block i of the result holds inputs 4i..4i+3 */
    __m512 p = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 q = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 r = _mm512_add_ps(_mm512_shuffle_f32x4(p, q, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(p, q, _MM_SHUFFLE(3, 1, 3, 1)));
    float all[16];
    _mm512_storeu_ps(all, r);
    for (int i = 0; i < nout; i++) out[i] = all[i];
}

static inline __attribute__((always_inline)) void
tile_v(const float *const *w, const float *const *x, int64_t n, float *out, const int R, const int T) {
    __m512 acc[16];
    UNROLL for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        __m512 xv[4];
        UNROLL for (int t = 0; t < T; t++) xv[t] = _mm512_loadu_ps(x[t] + k);
        UNROLL for (int r = 0; r < R; r++) {
            __m512 wv = _mm512_loadu_ps(w[r] + k);
            UNROLL for (int t = 0; t < T; t++) acc[r * T + t] = _mm512_fmadd_ps(wv, xv[t], acc[r * T + t]);
        }
    }
    if (k < n) {   /* masked lanes read nothing and add zeros */
        __mmask16 mk = (__mmask16)((1u << (n - k)) - 1);
        __m512 xv[4];
        UNROLL for (int t = 0; t < T; t++) xv[t] = _mm512_maskz_loadu_ps(mk, x[t] + k);
        UNROLL for (int r = 0; r < R; r++) {
            __m512 wv = _mm512_maskz_loadu_ps(mk, w[r] + k);
            UNROLL for (int t = 0; t < T; t++) acc[r * T + t] = _mm512_fmadd_ps(wv, xv[t], acc[r * T + t]);
        }
    }
    reduce16(acc, out, R * T);
}

/* Decode (one X row) for the 32-element formats without the float buffer:
 * each block is decoded in registers into the same floats the decoders above
 * write (same operations), and fed to the accumulator in the same k order as
 * tile_v, so the result is bit-identical to the buffered path. */
static inline __attribute__((always_inline)) void
fused_v(const int type, const uint8_t *const *w, const float *x, int64_t n, float *out, const int R) {
    __m512 acc[16];
    UNROLL for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
    const size_t bsz = type == LLM_TYPE_Q4_0 ? sizeof(llm_block_q4_0)
                     : type == LLM_TYPE_Q4_1 ? sizeof(llm_block_q4_1)
                     : type == LLM_TYPE_Q5_0 ? sizeof(llm_block_q5_0) : sizeof(llm_block_q8_0);
    for (int64_t b = 0; b < n / LLM_QK; b++) {
        __m512 x0 = _mm512_loadu_ps(x + LLM_QK * b), x1 = _mm512_loadu_ps(x + LLM_QK * b + 16);
        UNROLL for (int r = 0; r < R; r++) {
            const uint8_t *p = w[r] + (size_t)b * bsz;
            __m512 w0, w1;
            if (type == LLM_TYPE_Q4_1) {
                uint32_t dm;
                memcpy(&dm, p, 4);              /* d and m, two adjacent halves */
                __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dm));
                __m512 d = _mm512_broadcastss_ps(f), m = _mm512_broadcastss_ps(_mm_movehdup_ps(f));
                __m128i q = _mm_loadu_si128((const __m128i *)(p + offsetof(llm_block_q4_1, qs)));
                w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q, m4))), d, m);
                w1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                         _mm_and_si128(_mm_srli_epi16(q, 4), m4))), d, m);
            } else if (type == LLM_TYPE_Q5_0) {
                __m512 d = _mm512_set1_ps(half_at(p));
                __m128i lo, hi;
                q5_0_bytes(p, &lo, &hi);
                w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), d);
                w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), d);
            } else if (type == LLM_TYPE_Q4_0) {
                __m512 d = _mm512_set1_ps(half_at(p));
                __m128i q = _mm_loadu_si128((const __m128i *)(p + offsetof(llm_block_q4_0, qs)));
                w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                         _mm_sub_epi8(_mm_and_si128(q, m4), eight))), d);
                w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                         _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m4), eight))), d);
            } else {
                __m512 d = _mm512_set1_ps(half_at(p));
                const uint8_t *qs = p + offsetof(llm_block_q8_0, qs);
                w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)qs))), d);
                w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                         _mm_loadu_si128((const __m128i *)(qs + 16)))), d);
            }
            acc[r] = _mm512_fmadd_ps(w0, x0, acc[r]);
            acc[r] = _mm512_fmadd_ps(w1, x1, acc[r]);
        }
    }
    reduce16(acc, out, R);
}

static void simd_dot_tile(const float *const *w, int nr, const float *const *x, int nt,
                          int64_t n, float *out) {
    if (nr == 8 && nt == 1) tile_v(w, x, n, out, 8, 1);
    else if (nr == 4 && nt == 4) tile_v(w, x, n, out, 4, 4);
    else
        for (int r = 0; r < nr; r++)
            for (int t = 0; t < nt; t++) tile_v(&w[r], &x[t], n, &out[r * nt + t], 1, 1);
}

#else   /* 256-bit vectors: AVX2, with 32 registers where AVX-512VL is there */

/* 256-bit vectors are the default even where AVX-512 is available: CPUs
 * with one 512-bit FMA unit (or two 256-bit halves) run 256-bit FMAs at a
 * higher rate (build with -DLLM_QUANT_ZMM for the 512-bit kernels above). */

/* out[i] = sum of the 8 lanes of v[i], i < nout: a transposed tree in which
 * each output lane only adds lanes of one input, always in the same order. */
static inline void reduce8(const __m256 v[8], float *out, int nout) {
    __m256 s[4], u[2];
    for (int i = 0; i < 4; i++)   /* per 128-bit half: [a0+a2, b0+b2, a1+a3, b1+b3] */
        s[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 2; i++) { /* per half: the half sums of 4 inputs */
        __m256d a = _mm256_castps_pd(s[2 * i]), b = _mm256_castps_pd(s[2 * i + 1]);
        u[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)),
                             _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
    }
    __m256 r = _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20),
                             _mm256_permute2f128_ps(u[0], u[1], 0x31));
    float all[8];
    _mm256_storeu_ps(all, r);
    for (int i = 0; i < nout; i++) out[i] = all[i];
}

static inline __attribute__((always_inline)) void
tile_v(const float *const *w, const float *const *x, int64_t n, float *out, const int R, const int T) {
    __m256 acc[16];
    UNROLL for (int i = 0; i < 16; i++) acc[i] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 xv[4];
        UNROLL for (int t = 0; t < T; t++) xv[t] = _mm256_loadu_ps(x[t] + k);
        UNROLL for (int r = 0; r < R; r++) {
            __m256 wv = _mm256_loadu_ps(w[r] + k);
            UNROLL for (int t = 0; t < T; t++) acc[r * T + t] = _mm256_fmadd_ps(wv, xv[t], acc[r * T + t]);
        }
    }
    if (k < n) {   /* masked lanes read nothing and add zeros */
        __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - k)),
                                        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 xv[4];
        UNROLL for (int t = 0; t < T; t++) xv[t] = _mm256_maskload_ps(x[t] + k, mk);
        UNROLL for (int r = 0; r < R; r++) {
            __m256 wv = _mm256_maskload_ps(w[r] + k, mk);
            UNROLL for (int t = 0; t < T; t++) acc[r * T + t] = _mm256_fmadd_ps(wv, xv[t], acc[r * T + t]);
        }
    }
    reduce8(acc, out, R * T < 8 ? R * T : 8);
    if (R * T > 8) reduce8(acc + 8, out + 8, R * T - 8);
}

/* Decode (one X row) for the 32-element formats without the float buffer:
 * each block is decoded in registers by the same operations the decoders
 * above use, and fed to the accumulators in tile_v's k order, so the result
 * is bit-identical to the buffered path. */
static inline __attribute__((always_inline)) void
fused_v(const int type, const uint8_t *const *w, const float *x, int64_t n, float *out, const int R) {
    __m256 acc[8];
    UNROLL for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
    const size_t bsz = type == LLM_TYPE_Q4_0 ? sizeof(llm_block_q4_0)
                     : type == LLM_TYPE_Q4_1 ? sizeof(llm_block_q4_1)
                     : type == LLM_TYPE_Q5_0 ? sizeof(llm_block_q5_0) : sizeof(llm_block_q8_0);
    for (int64_t b = 0; b < n / LLM_QK; b++) {
        const float *xb = x + LLM_QK * b;
        __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
        __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
        UNROLL for (int r = 0; r < R; r++) {
            const uint8_t *p = w[r] + (size_t)b * bsz;
            __m256 d, w0, w1, w2, w3;
            if (type == LLM_TYPE_Q4_1) {
                uint32_t dm;
                memcpy(&dm, p, 4);              /* d and m: two adjacent halves, one conversion */
                __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dm));
                d = _mm256_broadcastss_ps(f);
                __m256 m = _mm256_broadcastss_ps(_mm_movehdup_ps(f));
                __m128i q = _mm_loadu_si128((const __m128i *)(p + offsetof(llm_block_q4_1, qs)));
                __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
                w0 = _mm256_fmadd_ps(u8_ps(lo), d, m);
                w1 = _mm256_fmadd_ps(u8_ps(_mm_srli_si128(lo, 8)), d, m);
                w2 = _mm256_fmadd_ps(u8_ps(hi), d, m);
                w3 = _mm256_fmadd_ps(u8_ps(_mm_srli_si128(hi, 8)), d, m);
            } else {
                __m128i lo, hi;
                d = _mm256_set1_ps(half_at(p));
                if (type == LLM_TYPE_Q4_0) {
                    __m128i q = _mm_loadu_si128((const __m128i *)(p + offsetof(llm_block_q4_0, qs)));
                    lo = _mm_sub_epi8(_mm_and_si128(q, m4), eight);
                    hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m4), eight);
                } else if (type == LLM_TYPE_Q5_0) {
                    q5_0_bytes(p, &lo, &hi);
                } else {
                    lo = _mm_loadu_si128((const __m128i *)(p + offsetof(llm_block_q8_0, qs)));
                    hi = _mm_loadu_si128((const __m128i *)(p + offsetof(llm_block_q8_0, qs) + 16));
                }
                w0 = _mm256_mul_ps(i8_ps(lo), d);
                w1 = _mm256_mul_ps(i8_ps(_mm_srli_si128(lo, 8)), d);
                w2 = _mm256_mul_ps(i8_ps(hi), d);
                w3 = _mm256_mul_ps(i8_ps(_mm_srli_si128(hi, 8)), d);
            }
            acc[r] = _mm256_fmadd_ps(w0, x0, acc[r]);
            acc[r] = _mm256_fmadd_ps(w1, x1, acc[r]);
            acc[r] = _mm256_fmadd_ps(w2, x2, acc[r]);
            acc[r] = _mm256_fmadd_ps(w3, x3, acc[r]);
        }
    }
    reduce8(acc, out, R);
}

static void simd_dot_tile(const float *const *w, int nr, const float *const *x, int nt,
                          int64_t n, float *out) {
    if (nr == 8 && nt == 1) {
        tile_v(w, x, n, out, 8, 1);
    } else if (nr == 4 && nt == 4) {
#ifdef __AVX512VL__
        tile_v(w, x, n, out, 4, 4);        /* 16 accumulators fit in 32 registers */
#else
        float o[8];                        /* 16 registers: two 4x2 passes */
        tile_v(w, x, n, o, 4, 2);
        for (int r = 0; r < 4; r++) { out[r * 4] = o[r * 2]; out[r * 4 + 1] = o[r * 2 + 1]; }
        tile_v(w, x + 2, n, o, 4, 2);
        for (int r = 0; r < 4; r++) { out[r * 4 + 2] = o[r * 2]; out[r * 4 + 3] = o[r * 2 + 1]; }
#endif
    } else {
        for (int r = 0; r < nr; r++)
            for (int t = 0; t < nt; t++) tile_v(&w[r], &x[t], n, &out[r * nt + t], 1, 1);
    }
}

#endif

/* Both vector widths define fused_v; the type and row count become constants
 * of its inlined instances. */
static int simd_fused_dot(int type, const uint8_t *const *w, int nr, const float *x, int64_t n, float *out) {
    if (nr != 8 && nr != 1) return -1;
#define FUSED(T) (nr == 8 ? fused_v(T, w, x, n, out, 8) : fused_v(T, w, x, n, out, 1))
    switch (type) {
    case LLM_TYPE_Q4_0: FUSED(LLM_TYPE_Q4_0); return 0;
    case LLM_TYPE_Q4_1: FUSED(LLM_TYPE_Q4_1); return 0;
    case LLM_TYPE_Q5_0: FUSED(LLM_TYPE_Q5_0); return 0;
    case LLM_TYPE_Q8_0: FUSED(LLM_TYPE_Q8_0); return 0;
    default: return -1;
    }
#undef FUSED
}

static const llm_qkern table = {QK_STR(QK_TABLE), simd_dequant, simd_dot_tile, simd_fused_dot,
                                QK_CAT(llm_act_dot_, QK_TABLE), QK_CAT(llm_act_dot_packed_, QK_TABLE),
                                QK_CAT(llm_act_quantize_, QK_TABLE),
                                QK_CAT(llm_act_lanes_, QK_TABLE), QK_X_WIDE,
                                QK_CAT(llm_act_row_packed_, QK_TABLE)};

const llm_qkern *QK_CAT(llm_qkern_, QK_TABLE)(void) { return QK_CPU_OK() ? &table : NULL; }

#else /* a compiler without these instruction sets: the table is absent */

const llm_qkern *QK_CAT(llm_qkern_, QK_TABLE)(void) { return NULL; }

#endif
