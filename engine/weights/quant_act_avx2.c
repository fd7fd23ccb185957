/* engine/weights/quant_act_avx2.c - integer-activation dot products for AVX2: each
 * weight block becomes 32 bytes in element order, multiplied with the
 * activation's 32 int8 quants by vpmaddubsw (unsigned x signed byte pairs
 * into int16) and vpmaddwd (into int32), or widened to int16 and multiplied
 * with 16-bit quants by vpmaddwd alone, all exact. Rows packed in groups of
 * 8 (llm_pack_rows; the kernels at the end) are one stream a group (one
 * activation row reads several groups side by side), and the 8 rows' sums
 * of one block become the 8 lanes of one vector. A plain weight row is
 * read in memory order (one stream per row: this CPU family's prefetchers
 * lose pace with 8 interleaved rows), 8 blocks at a time: their exact block
 * sums S_b become the 8 lanes of one vector. Either way the float part
 * d_b * ((float)S_b * wa_b + (float)B_b * wb_b) runs on those lanes by the
 * scalar reference's operations in its order (quant_act.c), so the results
 * equal it bit for bit. Compiled with -mavx2 -mfma -mf16c (and once more
 * with AVX-512 flags by quant_avx512.c); chosen after a CPUID check. The
 * Makefile builds these files with -ffp-contract=off: no mul+add here may
 * become an FMA, or the bits would differ from the scalar reference. */
#include "quant_kern.h"
#include "quant_simd.h"

#include <math.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

/* lane i of the result = the sum of the 8 int32 lanes of v[i] (exact) */
static inline __m256i hsum8_epi32(const __m256i v[8]) {
    __m256i a = _mm256_hadd_epi32(v[0], v[1]), b = _mm256_hadd_epi32(v[2], v[3]);
    __m256i c = _mm256_hadd_epi32(v[4], v[5]), d = _mm256_hadd_epi32(v[6], v[7]);
    __m256i ab = _mm256_hadd_epi32(a, b), cd = _mm256_hadd_epi32(c, d);   /* 128-bit halves: lanes 0-3, 4-7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(ab, cd, 0x20), _mm256_permute2x128_si256(ab, cd, 0x31));
}

/* One X row of 16-bit quants against one weight row (decode): with AVX-512
 * a block of 32 is one zmm of int16 quants, its products one vpmaddwd, and
 * 8 blocks' vectors are summed across by a shuffle tree, half the work of
 * hsum8 on twice as many ymm vectors. ZMM_ROW1: the types that take it, in
 * plain rows (Q6_K, Q8_0) and in packed groups (Q8_0). */
#ifdef __AVX512BW__
#define ZMM_ROW1(type) ((type) == LLM_TYPE_Q6_K || (type) == LLM_TYPE_Q8_0)

/* The sums of lanes 0-7 and of lanes 8-15 of v[i] (a block's elements 0..15
 * and 16..31, where v[i] is its vpmaddwd), i < 8, exact; the result's 128-bit
 * quarters hold them for [i 0..3, lanes 0-7], [i 0..3, lanes 8-15], [i 4..7,
 * lanes 0-7], [i 4..7, lanes 8-15] */
static inline __attribute__((always_inline)) __m512i halves8_epi32(const __m512i v[8]) {
    __m512i a[4];
    UNROLL for (int k = 0; k < 4; k++)   /* per quarter: v[2k], v[2k+1], v[2k], v[2k+1] */
        a[k] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * k], v[2 * k + 1]),
                                _mm512_unpackhi_epi32(v[2 * k], v[2 * k + 1]));
    /* per quarter: v[0..3] and v[4..7] */
    const __m512i b0 = _mm512_add_epi32(_mm512_unpacklo_epi64(a[0], a[1]), _mm512_unpackhi_epi64(a[0], a[1]));
    const __m512i b1 = _mm512_add_epi32(_mm512_unpacklo_epi64(a[2], a[3]), _mm512_unpackhi_epi64(a[2], a[3]));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(b0, b1, 0x88), _mm512_shuffle_i32x4(b0, b1, 0xDD));
}

/* lane i: the sum of v[i]'s two halves in h (halves8_epi32) */
static inline __attribute__((always_inline)) __m256i join_halves(__m512i h) {
    return _mm256_add_epi32(_mm512_castsi512_si256(_mm512_shuffle_i32x4(h, h, 0x08)),
                            _mm512_castsi512_si256(_mm512_shuffle_i32x4(h, h, 0x0D)));
}

/* The exact sums of 8 Q8_0 blocks of a row against 16-bit quants xq
 * (their 256): block i's 32 quants at q + i * step */
static inline __attribute__((always_inline)) __m256i q8_sums8(const uint8_t *q, int64_t step, const int16_t *xq) {
    __m512i v[8];
    UNROLL for (int i = 0; i < 8; i++)
        v[i] = _mm512_madd_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q + i * step))),
                                 _mm512_loadu_si512(xq + 32 * i));
    return join_halves(halves8_epi32(v));
}

/* The exact sums of a packed Q8_0 block's 8 rows (their quants at q, 32
 * bytes a row) against one block of 16-bit quants xq: two rows a zmm, its
 * even and odd bytes taken apart as int16 by vpmaddubsw against 1, 0 and
 * 0, 1 and multiplied with x's even and odd elements (permuted once), so
 * no widening shuffle per row; lane r of the result is row r's sum. */
static inline __attribute__((always_inline)) __m256i q8_rows8_sums(const uint8_t *q, const int16_t *xq) {
    const __m512i even = _mm512_set1_epi16(1), odd = _mm512_set1_epi16(0x100);
    const __m512i pe = _mm512_set_epi16(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0,
                                        30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i x = _mm512_loadu_si512(xq);
    const __m512i xe = _mm512_permutexvar_epi16(pe, x), xo = _mm512_permutexvar_epi16(_mm512_add_epi16(pe, _mm512_set1_epi16(1)), x);
    __m512i u[4];   /* lanes 0-7: row 2k's partial sums, 8-15: row 2k+1's */
    UNROLL for (int k = 0; k < 4; k++) {
        const __m512i w = _mm512_loadu_si512(q + 64 * k);
        u[k] = _mm512_add_epi32(_mm512_madd_epi16(_mm512_maddubs_epi16(even, w), xe),
                                _mm512_madd_epi16(_mm512_maddubs_epi16(odd, w), xo));
    }
    const __m512i a0 = _mm512_add_epi32(_mm512_unpacklo_epi32(u[0], u[1]), _mm512_unpackhi_epi32(u[0], u[1]));
    const __m512i a1 = _mm512_add_epi32(_mm512_unpacklo_epi32(u[2], u[3]), _mm512_unpackhi_epi32(u[2], u[3]));
    /* quarter c: u[0..3]'s sums over quarter c (c < 2: rows 0, 2, 4, 6; else 1, 3, 5, 7) */
    const __m512i b = _mm512_add_epi32(_mm512_unpacklo_epi64(a0, a1), _mm512_unpackhi_epi64(a0, a1));
    const __m512i z = _mm512_add_epi32(b, _mm512_shuffle_i32x4(b, b, 0xB1));
    const __m512i order = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 0, 8, 1, 9, 2, 10, 3, 11);
    return _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, z));
}

/* The 8 exact block sums of the Q6_K super-block p against 16-bit quants
 * xq (its 256): the quants less 32, 64 at a time (two blocks), the products
 * summed per sub-block of 16 and only then times its scale. */
static inline __attribute__((always_inline)) __m256i q6k_sums8(const uint8_t *p, const int16_t *xq) {
    const __m512i m4 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30), k32 = _mm512_set1_epi8(32);
    /* qh bits 2s, 2s+1 to bits 4, 5 for blocks s = 0, 1 (low, high 256 bits) and s = 2, 3 */
    const __m512i sh01 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i sh23 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    __m512i v[8];
    UNROLL for (int h = 0; h < 2; h++) {   /* elements 128h .. 128h+127: blocks 4h .. 4h+3 */
        const __m512i L = _mm512_loadu_si512(p + offsetof(llm_block_q6_k, ql) + 64 * h);
        const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p + offsetof(llm_block_q6_k, qh) + 32 * h)));
        const __m512i h01 = _mm512_and_si512(_mm512_sllv_epi16(H, sh01), m30);
        const __m512i h23 = _mm512_and_si512(_mm512_srlv_epi16(H, sh23), m30);
        /* (a & 15) | b, less 32 */
        const __m512i q01 = _mm512_sub_epi8(_mm512_ternarylogic_epi32(L, h01, m4, 0xEC), k32);
        const __m512i q23 = _mm512_sub_epi8(_mm512_ternarylogic_epi32(_mm512_srli_epi16(L, 4), h23, m4, 0xEC), k32);
        const __m512i q[4] = {q01, q01, q23, q23};
        UNROLL for (int s = 0; s < 4; s++) {
            const __m256i w8 = s % 2 ? _mm512_extracti64x4_epi64(q[s], 1) : _mm512_castsi512_si256(q[s]);
            v[4 * h + s] = _mm512_madd_epi16(_mm512_cvtepi8_epi16(w8), _mm512_loadu_si512(xq + 32 * (4 * h + s)));
        }
    }
    /* the sub-block scales in halves8_epi32's order: 0, 2, 4, 6, 1, 3, 5, 7, 8, 10, ... */
    const __m128i order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    const __m128i sc = _mm_loadu_si128((const __m128i *)(p + offsetof(llm_block_q6_k, scales)));
    /* |sub-block sum| <= 16 * 32 * 16383, times |scale| <= 128: below 2^30 */
    return join_halves(_mm512_mullo_epi32(halves8_epi32(v), _mm512_cvtepi8_epi32(_mm_shuffle_epi8(sc, order))));
}
#else
#define ZMM_ROW1(type) 0
static inline __m256i q8_sums8(const uint8_t *q, int64_t step, const int16_t *xq) {
    (void)q, (void)step, (void)xq;
    return _mm256_setzero_si256();
}
static inline __m256i q6k_sums8(const uint8_t *p, const int16_t *xq) {
    (void)p, (void)xq;
    return _mm256_setzero_si256();
}
static inline __m256i q8_rows8_sums(const uint8_t *q, const int16_t *xq) {
    (void)q, (void)xq;
    return _mm256_setzero_si256();
}
#endif

static inline __m256i join(__m128i lo, __m128i hi) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* all-ones in lanes 0 .. n-1 (n <= 8), zero above */
static inline __m256i lanes_below(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}


/* The 32 quants of a Q4_0, Q4_1, Q5_0 or Q8_0 block as the integer vectors
 * the products take: with W16 as int16 (elements 0..15 in *w0, 16..31 in
 * *w1), else as 32 bytes in *w0 (unsigned quants; Q8_0 signed). rest: the
 * block's bytes after its scale halves, laid out alike in plain rows and in
 * packed groups; Q4_0's and Q5_0's offsets are taken off the sums later. */
static inline __attribute__((always_inline)) void
block32_quants(const int type, const uint8_t *rest, const int W16, __m256i *w0, __m256i *w1) {
    if (type == LLM_TYPE_Q8_0) {
        if (W16) {
            *w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)rest));
            *w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(rest + 16)));
        } else {
            *w0 = _mm256_loadu_si256((const __m256i *)rest);
        }
        return;
    }
    __m128i lo, hi;
    if (type == LLM_TYPE_Q5_0) {
        q5_0_bits(rest, rest + 4, &lo, &hi);
    } else if (W16) {   /* Q4_0, Q4_1: each nibble byte widened once, split in the int16 lanes */
        __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)rest));
        *w0 = _mm256_and_si256(q, _mm256_set1_epi16(15));
        *w1 = _mm256_srli_epi16(q, 4);
        return;
    } else {
        __m128i q = _mm_loadu_si128((const __m128i *)rest), m4 = _mm_set1_epi8(15);
        lo = _mm_and_si128(q, m4);
        hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
    }
    if (W16) {
        *w0 = _mm256_cvtepu8_epi16(lo);
        *w1 = _mm256_cvtepu8_epi16(hi);
    } else {
        *w0 = join(lo, hi);
    }
}

/* Block b of one weight row: its 32 weight bytes in element order (unsigned
 * quants for the formats with an offset, signed values for Q8_0 and Q6_K)
 * and (Q6_K) the int16 sub-block scales for vpmaddwd; the scales come by
 * chunk_scales. */
static inline __attribute__((always_inline)) __m256i
wbytes(const int type, const uint8_t *row, int64_t b, __m256i *sc16) {
    switch (type) {
    case LLM_TYPE_Q4_0: case LLM_TYPE_Q4_1: case LLM_TYPE_Q5_0: case LLM_TYPE_Q8_0: {
        __m256i v, unused;
        block32_quants(type, row + b * llm_packed_block_bytes(type) + llm_packed_head(type), 0, &v, &unused);
        return v;
    }
    case LLM_TYPE_Q4_K: case LLM_TYPE_Q5_K: {
        int five = type == LLM_TYPE_Q5_K, sub = (int)(b % 8), g = sub / 2;
        const uint8_t *p = row + (b / 8) * (five ? sizeof(llm_block_q5_k) : sizeof(llm_block_q4_k));
        __m256i q = _mm256_loadu_si256((const __m256i *)(p + (five ? offsetof(llm_block_q5_k, qs)
                                                                  : offsetof(llm_block_q4_k, qs)) + 32 * g));
        __m256i v = _mm256_and_si256(sub & 1 ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(15));
        if (five) {   /* bit `sub` of qh[l] is element l's fifth bit */
            __m256i qh = _mm256_loadu_si256((const __m256i *)(p + offsetof(llm_block_q5_k, qh)));
            __m256i bit = _mm256_set1_epi8((char)(1 << sub));
            v = _mm256_or_si256(v, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit),
                                                    _mm256_set1_epi8(16)));
        }
        return v;
    }
    default: {   /* Q6_K: elements 32s..32s+31 of half h */
        const uint8_t *p = row + (b / 8) * sizeof(llm_block_q6_k);
        int e0 = (int)(b % 8) * 32, h = e0 / 128, s = (e0 % 128) / 32;
        __m256i l = _mm256_loadu_si256((const __m256i *)(p + offsetof(llm_block_q6_k, ql) + 64 * h + 32 * (s & 1)));
        __m256i hb = _mm256_loadu_si256((const __m256i *)(p + offsetof(llm_block_q6_k, qh) + 32 * h));
        __m256i lo = _mm256_and_si256(s >= 2 ? _mm256_srli_epi16(l, 4) : l, _mm256_set1_epi8(15));
        /* bits 2s, 2s+1 of qh[l] to bits 4, 5 (16-bit shifts; the mask drops strays) */
        __m256i hi2 = 2 * s >= 4 ? _mm256_srli_epi16(hb, 2 * s - 4) : _mm256_slli_epi16(hb, 4 - 2 * s);
        hi2 = _mm256_and_si256(hi2, _mm256_set1_epi8(0x30));
        const int8_t *sc = (const int8_t *)(p + offsetof(llm_block_q6_k, scales)) + e0 / 16;
        *sc16 = join(_mm_set1_epi16(sc[0]), _mm_set1_epi16(sc[1]));
        return _mm256_sub_epi8(_mm256_or_si256(lo, hi2), _mm256_set1_epi8(32));
    }
    }
}

/* acc + the sums of int16 pairs w * x (x: one pair, in every lane), and
 * acc + the sums of u8 x s8 quads; exact either way (vpdpwssd and vpdpbusd
 * with VNNI, which add without saturating) */
static inline __attribute__((always_inline)) __m256i dp_pairs(__m256i acc, __m256i w, __m256i x) {
#ifdef QK_VNNI
    return _mm256_dpwssd_epi32(acc, w, x);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(w, x));
#endif
}
static inline __attribute__((always_inline)) __m256i dp_quads(__m256i acc, __m256i u8, __m256i s8) {
#ifdef QK_VNNI
    return _mm256_dpbusd_epi32(acc, u8, s8);
#else   /* two products of at most 31 * 127 each (unsigned quants of 5 bits at most): no int16 saturation */
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), _mm256_set1_epi16(1)));
#endif
}

/* int32 lanes summing to sum_k w[k] * x[k] (Q6_K: times the sub-block scales) */
static inline __attribute__((always_inline)) __m256i dot32(const int type, __m256i wv, __m256i xv, __m256i sc16) {
    if (type == LLM_TYPE_Q8_0 || type == LLM_TYPE_Q6_K) {   /* signed weights: |w| times x with w's sign */
        __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
        return _mm256_madd_epi16(p, type == LLM_TYPE_Q6_K ? sc16 : _mm256_set1_epi16(1));
    }
    return dp_quads(_mm256_setzero_si256(), wv, xv);
}

/* Int32 lanes summing to the block sum of weights (w0, w1), as
 * block32_quants or widen16 give them, against the activation block (xa, xb) */
static inline __attribute__((always_inline)) __m256i
wdot(const int type, __m256i w0, __m256i w1, __m256i xa, __m256i xb, const int W16) {
    if (W16) return dp_pairs(_mm256_madd_epi16(w0, xa), w1, xb);
    return dot32(type, w0, xa, _mm256_setzero_si256());
}

/* The weight bytes of wbytes widened to int16, elements 0..15 in *lo and
 * 16..31 in *hi (Q6_K: times its sub-block scales, at most 32 * 128 in size) */
static inline __attribute__((always_inline)) void widen16(const int type, __m256i wv, __m256i sc16, __m256i *lo,
                                                          __m256i *hi) {
    __m128i w0 = _mm256_castsi256_si128(wv), w1 = _mm256_extracti128_si256(wv, 1);
    int sgn = type == LLM_TYPE_Q8_0 || type == LLM_TYPE_Q6_K;
    *lo = sgn ? _mm256_cvtepi8_epi16(w0) : _mm256_cvtepu8_epi16(w0);
    *hi = sgn ? _mm256_cvtepi8_epi16(w1) : _mm256_cvtepu8_epi16(w1);
    if (type == LLM_TYPE_Q6_K) {
        *lo = _mm256_mullo_epi16(*lo, _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sc16)));
        *hi = _mm256_mullo_epi16(*hi, _mm256_broadcastsi128_si256(_mm256_extracti128_si256(sc16, 1)));
    }
}

/* The sum of dot32 against 16-bit quants xl (elements 0..15) and xh (16..31),
 * by vpmaddwd */
static inline __attribute__((always_inline)) __m256i
dot32w(const int type, __m256i wv, __m256i xl, __m256i xh, __m256i sc16) {
    __m256i lo, hi;
    widen16(type, wv, sc16, &lo, &hi);
    return wdot(type, lo, hi, xl, xh, 1);
}

/* For the 16-bit path, Q4_0/Q4_1/Q8_0 widen straight from memory (each byte
 * of nibbles to one int16 lane: low nibble and >> 4), cheaper than the bytes
 * of wbytes widened after; 0 for the other types. */
static inline int words_direct(const int type) {
    return type == LLM_TYPE_Q4_0 || type == LLM_TYPE_Q4_1 || type == LLM_TYPE_Q8_0;
}
static inline __attribute__((always_inline)) int
wwords(const int type, const uint8_t *row, int64_t b, __m256i *lo, __m256i *hi) {
    if (!words_direct(type)) return 0;
    block32_quants(type, row + b * llm_packed_block_bytes(type) + llm_packed_head(type), 1, lo, hi);
    return 1;
}

static inline int rd32(const uint8_t *p) { int h; memcpy(&h, p, 4); return h; }


/* The scale and offset of block b of one weight row as the reference's
 * weight_block gives them */
static inline void plain_scales(const int type, const uint8_t *row, int64_t b, float *wa, float *wb) {
    if (type == LLM_TYPE_Q4_K || type == LLM_TYPE_Q5_K || type == LLM_TYPE_Q6_K) {
        const size_t kb = type == LLM_TYPE_Q6_K ? sizeof(llm_block_q6_k)
                        : type == LLM_TYPE_Q5_K ? sizeof(llm_block_q5_k) : sizeof(llm_block_q4_k);
        const uint8_t *sb = row + (b / 8) * kb;
        if (type == LLM_TYPE_Q6_K) {
            *wa = half_at(sb + offsetof(llm_block_q6_k, d)), *wb = 0.0f;
            return;
        }
        uint8_t sc, mn;
        llm_k_scale_min(sb + offsetof(llm_block_q4_k, scales), (int)(b % 8), &sc, &mn);
        *wa = half_at(sb + offsetof(llm_block_q4_k, d)) * (float)sc;   /* exact: 11 x 6 bits */
        *wb = -(half_at(sb + offsetof(llm_block_q4_k, dmin)) * (float)mn);
        return;
    }
    const uint8_t *p = row + b * llm_packed_block_bytes(type);
    *wa = half_at(p);
    *wb = type == LLM_TYPE_Q4_1 ? half_at(p + offsetof(llm_block_q4_1, m)) : 0.0f;
}

/* Scale and offset (wa, wb) of blocks b0 .. b0+7 of one weight row as the
 * reference's weight_block gives them, one lane per block; lanes >= nv are 0.
 * The 32-bit formats' headers (scale half, then Q4_1's offset half) come in
 * one gather; K-quant sub-block scales unpacked in registers, once a chunk. */
static inline __attribute__((always_inline)) void
chunk_scales(const int type, const uint8_t *row, int64_t b0, int nv, __m256 *wa, __m256 *wb) {
    /* K-quants: chunks start at multiples of 8 blocks, so one chunk is one
     * super-block. The lanes are built in registers: eight scalar stores read
     * back as one vector cannot be forwarded, and that stall was a tenth of
     * the K-quant products. */
    if (type == LLM_TYPE_Q6_K) {   /* the sub-block scales go in the integer sums (sc16) */
        *wa = _mm256_set1_ps(half_at(row + (b0 / 8) * sizeof(llm_block_q6_k) + offsetof(llm_block_q6_k, d)));
        *wb = _mm256_setzero_ps();
        return;
    }
    if (type == LLM_TYPE_Q4_K || type == LLM_TYPE_Q5_K) {   /* plain_scales, llm_k_scale_min on 8 lanes */
        const size_t kb = type == LLM_TYPE_Q5_K ? sizeof(llm_block_q5_k) : sizeof(llm_block_q4_k);
        const uint8_t *sb = row + (b0 / 8) * kb;
        uint32_t s03, m03, hi;
        memcpy(&s03, sb + offsetof(llm_block_q4_k, scales), 4);
        memcpy(&m03, sb + offsetof(llm_block_q4_k, scales) + 4, 4);
        memcpy(&hi, sb + offsetof(llm_block_q4_k, scales) + 8, 4);
        const uint32_t sc47 = (hi & 0x0f0f0f0fu) | ((s03 >> 6) & 0x03030303u) << 4;
        const uint32_t mn47 = (hi >> 4 & 0x0f0f0f0fu) | ((m03 >> 6) & 0x03030303u) << 4;
        const __m128i sc = _mm_cvtsi64_si128((long long)((uint64_t)(s03 & 0x3f3f3f3fu) | (uint64_t)sc47 << 32));
        const __m128i mn = _mm_cvtsi64_si128((long long)((uint64_t)(m03 & 0x3f3f3f3fu) | (uint64_t)mn47 << 32));
        const __m256 d = _mm256_set1_ps(half_at(sb + offsetof(llm_block_q4_k, d)));
        const __m256 dmin = _mm256_set1_ps(half_at(sb + offsetof(llm_block_q4_k, dmin)));
        *wa = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc)));   /* exact: 11 x 6 bits */
        *wb = _mm256_xor_ps(_mm256_set1_ps(-0.0f), _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn))));
        return;
    }
    const int bb = (int)llm_packed_block_bytes(type);
    const uint8_t *p = row + b0 * bb;
    __m256i g;
    if (nv == 8) {
        g = _mm256_setr_epi32(rd32(p), rd32(p + bb), rd32(p + 2 * bb), rd32(p + 3 * bb), rd32(p + 4 * bb),
                              rd32(p + 5 * bb), rd32(p + 6 * bb), rd32(p + 7 * bb));
    } else {   /* lanes past the row: 0, unread */
        _Alignas(32) int h[8] = {0};
        for (int i = 0; i < nv; i++) h[i] = rd32(p + i * bb);
        g = _mm256_load_si256((const __m256i *)h);
    }
    __m256i lo = _mm256_and_si256(g, _mm256_set1_epi32(0xffff)), hi = _mm256_srli_epi32(g, 16);
    __m256i pk = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);   /* [lo 0..7 | hi 0..7] */
    *wa = _mm256_cvtph_ps(_mm256_castsi256_si128(pk));
    *wb = type == LLM_TYPE_Q4_1 ? _mm256_cvtph_ps(_mm256_extracti128_si256(pk, 1)) : _mm256_setzero_ps();
}

/* (a0+a4 + a2+a6) + (a1+a5 + a3+a7): llm_act_lanes_sum's order */
static inline float lanes_sum(__m256 a) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 g = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(g, _mm_shuffle_ps(g, g, 1)));
}

/* log2 of a type's quant offset (Q4_0, Q5_0: unsigned quants, the offset
 * taken off the block sums), and whether its weights have offsets wb; the
 * other types' wb are all 0 */
static inline int quant_offset(const int type) {
    return type == LLM_TYPE_Q4_0 ? 3 : type == LLM_TYPE_Q5_0 ? 4 : 0;
}
static inline int with_offsets(const int type) {
    return type == LLM_TYPE_Q4_1 || type == LLM_TYPE_Q4_K || type == LLM_TYPE_Q5_K;
}

/* The float part of 8 lanes, by the reference's operations in its order:
 * t1 = S wa, t2 = B wb, c = d (t1 + t2). S: the exact block sums (of
 * unsigned quants for Q4_0 and Q5_0, whose offsets go here), B: the
 * activation blocks' quant sums, d: their scales. Where wb is 0, t2 (0
 * times an integer: +-0) is left out, which changes no lane sum: t1 + -0
 * is t1, and a term of -0 leaves a running sum begun at +0 as it was. */
static inline __attribute__((always_inline)) __m256 terms(const int type, __m256i S, __m256i Bv, __m256 dxv,
                                                          __m256 wa, __m256 wb) {
    const int off = quant_offset(type);
    if (off) S = _mm256_sub_epi32(S, _mm256_slli_epi32(Bv, off));
    __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(S), wa);
    if (with_offsets(type)) u = _mm256_add_ps(u, _mm256_mul_ps(_mm256_cvtepi32_ps(Bv), wb));
    return _mm256_mul_ps(dxv, u);
}

/* One chunk of 8 blocks b0 .. b0+7 (FULL) or the row's last nv < 8 of one
 * weight row against T X rows (T <= 4): the 8 block sums of one (row, X row)
 * pair become the 8 lanes of one vector (hsum8), and the float part of the
 * reference runs on those lanes into acc[t]. W16: 16-bit quants. */
static inline __attribute__((always_inline)) void
act_chunk(const int type, const uint8_t *row, int64_t b0, const int nv, const llm_act_row *x, const int T,
          __m256 acc[4], const int W16, const int FULL) {
    const int direct = W16 && words_direct(type);
    __m256i v[4][8];
    UNROLL for (int i = 0; i < 8; i++) {
        if (!FULL && i >= nv) {        /* past the row's end: a zero sum */
            UNROLL for (int t = 0; t < T; t++) v[t][i] = _mm256_setzero_si256();
            continue;
        }
        const int64_t b = b0 + i;
        __m256i wv = _mm256_setzero_si256(), sc16 = _mm256_setzero_si256();
        __m256i wl = _mm256_setzero_si256(), wh = _mm256_setzero_si256();
        if (direct) wwords(type, row, b, &wl, &wh);
        else wv = wbytes(type, row, b, &sc16);
        UNROLL for (int t = 0; t < T; t++) {
            if (W16) {
                const int16_t *q = (const int16_t *)x[t].q + 32 * b;
                __m256i xl = _mm256_loadu_si256((const __m256i *)q);
                __m256i xh = _mm256_loadu_si256((const __m256i *)(q + 16));
                v[t][i] = direct ? wdot(type, wl, wh, xl, xh, 1) : dot32w(type, wv, xl, xh, sc16);
            } else {
                v[t][i] = dot32(type, wv, _mm256_loadu_si256((const __m256i *)((const int8_t *)x[t].q + 32 * b)), sc16);
            }
        }
    }
    __m256 wa, wb;
    chunk_scales(type, row, b0, FULL ? 8 : nv, &wa, &wb);
    UNROLL for (int t = 0; t < T; t++) {
        __m256 dxv;
        __m256i Bv;
        if (FULL) {
            dxv = _mm256_loadu_ps(x[t].d + b0);
            Bv = _mm256_loadu_si256((const __m256i *)(x[t].s + b0));
        } else {   /* lanes past the row: d 0, B 0, unread */
            dxv = _mm256_maskload_ps(x[t].d + b0, lanes_below(nv));
            Bv = _mm256_maskload_epi32((const int *)(x[t].s + b0), lanes_below(nv));
        }
        __m256 sum = _mm256_add_ps(acc[t], terms(type, hsum8_epi32(v[t]), Bv, dxv, wa, wb));
        /* a lane past the row keeps its sum as the reference leaves it (even -0) */
        acc[t] = FULL ? sum : _mm256_blendv_ps(acc[t], sum, _mm256_castsi256_ps(lanes_below(nv)));
    }
}

/* The row's last nv < 8 blocks, one X row at a time, out of line: once per
 * weight type and width, not unrolled per T as well (which made this the
 * slowest file of the build, for at most one chunk of each row). */
#define ACT_TAIL(T_, W_)                                                                                  \
    static void act_tail_##T_##_##W_(const uint8_t *row, int64_t b0, int nv, const llm_act_row *x, __m256 *acc) { \
        act_chunk(T_, row, b0, nv, x, 1, acc, W_, 0);                                                     \
    }
#define ACT_TAILS(T_) ACT_TAIL(T_, 0) ACT_TAIL(T_, 1)
ACT_TAILS(LLM_TYPE_Q4_0) ACT_TAILS(LLM_TYPE_Q4_1) ACT_TAILS(LLM_TYPE_Q5_0) ACT_TAILS(LLM_TYPE_Q8_0)
ACT_TAILS(LLM_TYPE_Q4_K) ACT_TAILS(LLM_TYPE_Q5_K) ACT_TAILS(LLM_TYPE_Q6_K)
#undef ACT_TAILS
#undef ACT_TAIL

static inline __attribute__((always_inline)) void act_tail(const int type, const uint8_t *row, int64_t b0, int nv,
                                                           const llm_act_row *x, const int T, __m256 acc[4],
                                                           const int W16) {
#define CASE(T_) \
    case T_: fn = W16 ? act_tail_##T_##_1 : act_tail_##T_##_0; break;
    void (*fn)(const uint8_t *, int64_t, int, const llm_act_row *, __m256 *) = NULL;
    switch (type) {
        CASE(LLM_TYPE_Q4_0) CASE(LLM_TYPE_Q4_1) CASE(LLM_TYPE_Q5_0) CASE(LLM_TYPE_Q8_0)
        CASE(LLM_TYPE_Q4_K) CASE(LLM_TYPE_Q5_K) CASE(LLM_TYPE_Q6_K)
    default: return;
    }
#undef CASE
    for (int t = 0; t < T; t++) fn(row, b0, nv, x + t, acc + t);
}

/* How far ahead of the chunk it works on a row asks for the memory. Plain
 * rows (any type's under KVCACHE_PACK=0) are short (1408 bytes for a
 * 2048-wide Q5_K row) and lie back to back, so this reaches a few rows
 * ahead: one stream a core, which needs more bytes in flight than the
 * hardware prefetch keeps (tuning record); a prefetch of a row that is
 * elsewhere is only a wasted one. */
enum { ROW_PREFETCH_BYTES = 6144 };

/* R weight rows against T X rows, each weight row streamed in order */
static inline __attribute__((always_inline)) void
act_rows(const int type, const uint8_t *const *w, const int R, const llm_act_row *x, const int T, int64_t nb,
         float *out, const int W16) {
    const int64_t cb = llm_row_bytes(type, LLM_QK_K);   /* a chunk: 8 blocks of 32, or one super-block */
    for (int r = 0; r < R; r++) {
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        int64_t b0 = 0;
        for (; b0 + 8 <= nb; b0 += 8) {
            const uint8_t *ahead = w[r] + b0 / 8 * cb + ROW_PREFETCH_BYTES;
            for (int64_t o = 0; o < cb; o += 64) __builtin_prefetch(ahead + o, 0, 2);
            if (T == 1 && W16 && ZMM_ROW1(type)) {
                const int16_t *xq = (const int16_t *)x->q + 32 * b0;
                const __m256i S = type == LLM_TYPE_Q6_K ? q6k_sums8(w[r] + b0 / 8 * cb, xq)
                                : q8_sums8(w[r] + b0 * cb / 8 + llm_packed_head(type), cb / 8, xq);
                __m256 wa, wb;
                chunk_scales(type, w[r], b0, 8, &wa, &wb);
                acc[0] = _mm256_add_ps(acc[0], terms(type, S, _mm256_loadu_si256((const __m256i *)(x->s + b0)),
                                                     _mm256_loadu_ps(x->d + b0), wa, wb));
                continue;
            }
            act_chunk(type, w[r], b0, 8, x, T, acc, W16, 1);
        }
        if (b0 < nb) act_tail(type, w[r], b0, (int)(nb - b0), x, T, acc, W16);
        UNROLL for (int t = 0; t < T; t++) out[r * T + t] = lanes_sum(acc[t]);
    }
}

/* One function per weight type and width, each holding its four T shapes
 * (noinline: all 56 shapes inlined into llm_act_dot made one 120 KB function,
 * slower to compile and opaque in a profile). */
#define ACT_T(T_, W_)                                                                                  \
    static __attribute__((noinline)) void act_##T_##_##W_(const uint8_t *const *w, int nr, const llm_act_row *x, \
                                                          int nt, int64_t nb, float *out) {            \
        switch (nt) {                                                                                  \
        case 1: act_rows(T_, w, nr, x, 1, nb, out, W_); break;                                         \
        case 2: act_rows(T_, w, nr, x, 2, nb, out, W_); break;                                         \
        case 3: act_rows(T_, w, nr, x, 3, nb, out, W_); break;                                         \
        default: act_rows(T_, w, nr, x, 4, nb, out, W_); break;                                        \
        }                                                                                              \
    }
#define ACT_W(T_) ACT_T(T_, 0) ACT_T(T_, 1)
ACT_W(LLM_TYPE_Q4_0) ACT_W(LLM_TYPE_Q4_1) ACT_W(LLM_TYPE_Q5_0) ACT_W(LLM_TYPE_Q8_0)
ACT_W(LLM_TYPE_Q4_K) ACT_W(LLM_TYPE_Q5_K) ACT_W(LLM_TYPE_Q6_K)
#undef ACT_W
#undef ACT_T

static int many_rows(int type, const uint8_t *const *w, int nr, const llm_act_row *x, int nt, int64_t nb,
                     float *out);
static int more_types(int type, const uint8_t *const *w, int nr, const llm_act_row *x, int nt, int64_t nb,
                      float *out);

int QK_CAT(llm_act_dot_, QK_TABLE)(int type, const uint8_t *const *w, int nr, const llm_act_row *x, int nt,
                                   int64_t nb, float *out) {
    if (type == LLM_TYPE_Q5_1 || type == LLM_TYPE_Q2_K || type == LLM_TYPE_Q3_K)
        return nt < 1 ? -1 : more_types(type, w, nr, x, nt, nb, out);
    if (nt > 4) return many_rows(type, w, nr, x, nt, nb, out);
    if (nt < 1) return llm_act_dot_scalar(type, w, nr, x, nt, nb, out);
    const int w16 = x[0].bits == LLM_ACT_Q16;
#define CASE(T_) \
    case T_: (w16 ? act_##T_##_1 : act_##T_##_0)(w, nr, x, nt, nb, out); return 0;
    switch (type) {
        CASE(LLM_TYPE_Q4_0) CASE(LLM_TYPE_Q4_1) CASE(LLM_TYPE_Q5_0) CASE(LLM_TYPE_Q8_0)
        CASE(LLM_TYPE_Q4_K) CASE(LLM_TYPE_Q5_K) CASE(LLM_TYPE_Q6_K)
    default: return llm_act_dot_scalar(type, w, nr, x, nt, nb, out);
    }
#undef CASE
}

/* ---- packed groups of 8 rows (llm_pack_rows) ----
 * Block b of the group: the 8 rows' scales in one load, and the 8 rows'
 * exact block sums in the 8 lanes of one vector, so the reference's float
 * part runs on 8 rows at once, into acc[b % 8]. Q4_0, Q4_1, Q4_K and Q5_K
 * hold their quants in lanes (quant_kern.h): lane r of every load is row
 * r, and the sums build up in place, pair by pair. Q5_0's and Q8_0's rows
 * keep their blocks whole: each row's sum is one int32 vector, and hsum8
 * turns the 8 vectors into one lane per row. */

/* Block b of activation row x: 32 int8 quants in *xa, or with W16 the int16
 * quants of elements 0..15 in *xa and 16..31 in *xb */
static inline __attribute__((always_inline)) void x_block(const llm_act_row *x, int64_t b, const int W16, __m256i *xa,
                                                         __m256i *xb) {
    if (W16) {
        const int16_t *q = (const int16_t *)x->q + 32 * b;
        *xa = _mm256_loadu_si256((const __m256i *)q);
        *xb = _mm256_loadu_si256((const __m256i *)(q + 16));
    } else {
        *xa = _mm256_loadu_si256((const __m256i *)((const int8_t *)x->q + 32 * b));
        *xb = _mm256_setzero_si256();
    }
}

/* The 4 bytes at p in every lane */
static inline __m256i bcast32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* lo | (hs & mask): bits shifted to their place (Q5_K's fifth, Q6_K's
 * high two), masked and joined to a quant's low 4 bits */
static inline __attribute__((always_inline)) __m256i with_bits(__m256i lo, __m256i hs, __m256i mask) {
#ifdef __AVX512VL__
    return _mm256_ternarylogic_epi32(hs, mask, lo, 0xEA);
#else
    return _mm256_or_si256(_mm256_and_si256(hs, mask), lo);
#endif
}

/* v's dwords shifted right by sh bits, or left by -sh */
static inline __attribute__((always_inline)) __m256i shift_dwords(__m256i v, const int sh) {
    return sh >= 0 ? _mm256_srli_epi32(v, sh) : _mm256_slli_epi32(v, -sh);
}

/* Activation rows a lane-packed group (Q4_0, Q4_1, Q4_K, Q5_K) takes at once with
 * 16-bit quants: 4 rows' sums fill 16 registers, which AVX-512's 32 hold;
 * AVX2 keeps 2. */
#ifdef __AVX512VL__
#define LANE_ROWS 4
#else
#define LANE_ROWS 2
#endif

/* The 8 rows' sums S[t] of one lane-packed block, its quants at q (and
 * Q5_K's fifth bits at h, else NULL), against the 16 int16 pairs of an
 * activation block at xp[t], for NT <= LANE_ROWS activation rows: the
 * quants loaded and masked once for all of them. Nibble s of each 16-bit
 * half, masked in place (with its fifth bit above it), is 16^s times its
 * value for s = 1, 2, and the sums of those are shifted back (exact: |sum|
 * <= 8 * 31 * 256 * 16383 < 2^30). */
static inline __attribute__((always_inline)) void lane_sums16(const uint8_t *q, const uint8_t *h,
                                                             const int16_t *const *xp, const int NT, __m256i *S) {
    const __m256i m0 = _mm256_set1_epi32(0x000F000F), m1 = _mm256_set1_epi32(0x00F000F0);
    const __m256i m2 = _mm256_set1_epi32(0x0F000F00);
    const __m256i hv = h ? _mm256_loadu_si256((const __m256i *)h) : _mm256_setzero_si256();
    __m256i a[LANE_ROWS][4];
    UNROLL for (int t = 0; t < NT; t++) a[t][0] = a[t][1] = a[t][2] = a[t][3] = _mm256_setzero_si256();
    UNROLL for (int i = 0; i < 4; i++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * i));
        __asm__("" : "+v"(v)); /* one load for the four uses, not one each */
        __m256i v0 = _mm256_and_si256(v, m0), v1 = _mm256_and_si256(v, m1), v2 = _mm256_and_si256(v, m2);
        __m256i v3 = _mm256_srli_epi16(v, 12);
        if (h) {   /* chunk i's fifth bits from bit n + i to bit n + 4, above their nibbles */
            const __m256i hs = _mm256_slli_epi32(hv, 4 - i);
            v0 = with_bits(v0, hs, _mm256_set1_epi32(0x00100010));
            v1 = with_bits(v1, hs, _mm256_set1_epi32(0x01000100));
            v2 = with_bits(v2, hs, _mm256_set1_epi32(0x10001000));
            v3 = with_bits(v3, _mm256_srli_epi32(hv, 8 + i), _mm256_set1_epi32(0x00100010));
        }
        UNROLL for (int t = 0; t < NT; t++) {
            a[t][0] = dp_pairs(a[t][0], v0, bcast32(xp[t] + 8 * i));
            a[t][1] = dp_pairs(a[t][1], v1, bcast32(xp[t] + 8 * i + 2));
            a[t][2] = dp_pairs(a[t][2], v2, bcast32(xp[t] + 8 * i + 4));
            a[t][3] = dp_pairs(a[t][3], v3, bcast32(xp[t] + 8 * i + 6));
        }
    }
    UNROLL for (int t = 0; t < NT; t++)
        S[t] = _mm256_add_epi32(_mm256_add_epi32(a[t][0], a[t][3]),
                                _mm256_add_epi32(_mm256_srai_epi32(a[t][1], 4), _mm256_srai_epi32(a[t][2], 8)));
}

/* A block's 32 bytes in element order put in the order of a lane-packed
 * dword's nibbles, masked: elements 0, 4, 1, 5 (low nibbles) and 2, 6, 3, 7
 * (high) of each 8 */
static inline __m256i lane_order(__m256i v) {
    return _mm256_shuffle_epi8(v, _mm256_setr_epi8(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15,
                                                   0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15));
}

/* Chunk i of a lane-packed block's quants (v) as the bytes of its low
 * nibbles (*lo) and of its high ones (*hi), with Q5_K's fifth bits (hv;
 * h is NULL for the types without) at bit 4 of each byte */
static inline __attribute__((always_inline)) void lane_bytes(__m256i v, const uint8_t *h, __m256i hv, const int i,
                                                            __m256i *lo, __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(15), b4 = _mm256_set1_epi8(0x10);
    *lo = _mm256_and_si256(v, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if (h) {
        *lo = with_bits(*lo, _mm256_slli_epi32(hv, 4 - i), b4);
        *hi = with_bits(*hi, _mm256_srli_epi32(hv, i), b4);
    }
}

/* The same against 32 int8 quants at xq, put in the lanes' order first */
static inline __attribute__((always_inline)) __m256i lane_sums8(const uint8_t *q, const uint8_t *h, const int8_t *xq) {
    _Alignas(32) int32_t xr[8];
    _mm256_store_si256((__m256i *)xr, lane_order(_mm256_loadu_si256((const __m256i *)xq)));
    const __m256i hv = h ? _mm256_loadu_si256((const __m256i *)h) : _mm256_setzero_si256();
    __m256i a0 = _mm256_setzero_si256(), a1 = a0;
    UNROLL for (int i = 0; i < 4; i++) {
        __m256i lo, hi;
        lane_bytes(_mm256_loadu_si256((const __m256i *)(q + 32 * i)), h, hv, i, &lo, &hi);
        a0 = dp_quads(a0, lo, bcast32(xr + 2 * i));
        a1 = dp_quads(a1, hi, bcast32(xr + 2 * i + 1));
    }
    return _mm256_add_epi32(a0, a1);
}

/* The scales (wa) and offsets (wb) of the 8 rows of block b of a packed
 * group, as the reference's weight_block gives them (Q4_K, Q5_K: d sc and
 * -(dmin mn) of the sub-block, exact) */
/* Sub-block s's of a packed Q4_K or Q5_K super-block p, d and dmin its 8 rows' */
static inline __attribute__((always_inline)) void q4k_scales(const uint8_t *p, int s, __m256 d, __m256 dmin,
                                                             __m256 *wa, __m256 *wb) {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + LLM_PK4K_SC + 8 * s)));
    const __m256i m = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + LLM_PK4K_MN + 8 * (s / 2))));
    const __m256i sc = _mm256_and_si256(v, _mm256_set1_epi32(63));
    const __m256i mn = _mm256_or_si256(_mm256_slli_epi32(_mm256_srli_epi32(v, 6), 4),
                                       _mm256_and_si256(_mm256_srli_epi32(m, 4 * (s % 2)), _mm256_set1_epi32(15)));
    *wa = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc));
    *wb = _mm256_xor_ps(_mm256_set1_ps(-0.0f), _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mn)));
}

static inline __attribute__((always_inline)) void packed_scales(const int type, const uint8_t *grp, int64_t b,
                                                                __m256 *wa, __m256 *wb) {
    const uint8_t *p = llm_packed_block(type, grp, b);
    if (llm_packed_k45(type)) {
        q4k_scales(p, (int)(b % 8), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + LLM_PK4K_D))),
                   _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + LLM_PK4K_DMIN))), wa, wb);
        return;
    }
    if (type == LLM_TYPE_Q6_K) {   /* the sub-block scales are in the weights (q6k_pairs) */
        *wa = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + LLM_PK6K_D)));
        *wb = _mm256_setzero_ps();
        return;
    }
    *wa = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + llm_packed_scale(0))));
    *wb = type == LLM_TYPE_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + llm_packed_offset(0))))
                                : _mm256_setzero_ps();
}

/* Pair k of nibble chunk c of a packed Q6_K block (v: that chunk, hv: its
 * high-bit chunk, c / 2): lane r is row r's quants 8c + 2k, 8c + 2k + 1
 * less 32, as int16 */
static inline __attribute__((always_inline)) __m256i q6k_pair(__m256i v, __m256i hv, const int c, const int k) {
    const __m256i lo = k == 3 ? _mm256_srli_epi16(v, 12)
                              : _mm256_and_si256(_mm256_srli_epi32(v, 4 * k), _mm256_set1_epi32(0x000F000F));
    /* from the high bits' place to bits 4, 5 of each half */
    const __m256i w = with_bits(lo, shift_dwords(hv, 4 * k + 2 * (c % 2) - 4), _mm256_set1_epi32(0x00300030));
    return _mm256_sub_epi16(w, _mm256_set1_epi16(32));
}

/* The 16 int16 pair vectors of block b of a packed Q6_K group: lane r of
 * pr[j] is row r's weights 2j, 2j + 1, its quants less 32 times their
 * sub-block's scale (at most 32 * 128 in size), as weight_block's. Chunk c
 * of nibbles (elements 8c .. 8c+7, sub-block c / 2) as lane_pairs takes
 * Q4_0's, with the high bits of high-bit chunk c / 2 shifted beside them. */
static inline __attribute__((always_inline)) void q6k_pairs(const uint8_t *grp, int64_t b, __m256i pr[16]) {
    const uint8_t *p = llm_packed_block(LLM_TYPE_Q6_K, grp, b);
    const uint8_t *q = p + LLM_PK6K_Q + LLM_PK6K_BLOCK * (b % 8);
    UNROLL for (int c = 0; c < 4; c++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * c));
        const __m256i hv = _mm256_loadu_si256((const __m256i *)(q + LLM_PK6K_HI + 32 * (c / 2)));
        /* row r's int8 scale in both int16 halves of dword r */
        const __m256i s32 = _mm256_cvtepi8_epi32(
            _mm_loadl_epi64((const __m128i *)(p + LLM_PK6K_SC + 8 * (2 * (b % 8) + c / 2))));
        const __m256i sc = _mm256_or_si256(_mm256_and_si256(s32, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(s32, 16));
        UNROLL for (int k = 0; k < 4; k++) pr[4 * c + k] = _mm256_mullo_epi16(q6k_pair(v, hv, c, k), sc);
    }
}

/* The weights of nibble chunk c of a packed Q6_K block (v: the chunk, hv:
 * high-bit chunk c / 2) as int16 pairs w[k], their quants unsigned (the 32
 * taken off the sums): pairs 0, 1, 2 masked in place, 16^k times their
 * value, with their high bits shifted once for the three to just above
 * them; pair 3 shifted down, its high bits beside it. */
static inline __attribute__((always_inline)) void q6k_chunk(__m256i v, __m256i hv, const int c, __m256i w[4]) {
    const __m256i hs = _mm256_slli_epi32(hv, 4 - 2 * (c % 2));
    w[0] = with_bits(_mm256_and_si256(v, _mm256_set1_epi32(0x000F000F)), hs, _mm256_set1_epi32(0x00300030));
    w[1] = with_bits(_mm256_and_si256(v, _mm256_set1_epi32(0x00F000F0)), hs, _mm256_set1_epi32(0x03000300));
    w[2] = with_bits(_mm256_and_si256(v, _mm256_set1_epi32(0x0F000F00)), hs, _mm256_set1_epi32(0x30003000));
    w[3] = with_bits(_mm256_srli_epi16(v, 12), _mm256_srli_epi32(hv, 8 + 2 * (c % 2)), _mm256_set1_epi32(0x00300030));
}

/* A sub-block's sum from q6k_chunk's three sums (a[1] and a[2] exactly 16
 * and 256 times theirs), less 32 times the X sub-block's sum xs */
static inline __attribute__((always_inline)) __m256i q6k_sub_sum(const __m256i a[3], __m256i xs) {
    const __m256i u = _mm256_add_epi32(_mm256_srai_epi32(a[1], 4), _mm256_srai_epi32(a[2], 8));
    return _mm256_sub_epi32(_mm256_add_epi32(a[0], u), _mm256_slli_epi32(xs, 5));
}

/* The 8 rows' exact sums S[t] of block b of a packed Q6_K group against
 * NT <= LANE_ROWS activation rows x[t] (their int16 pairs at xp[t]), per
 * sub-block of 16 and only then times its scale (|sub-block sum| <= 16 *
 * 32 * 16383, times 128: below 2^30). One or two rows take q6k_chunk's
 * unsigned quants in place, less 32 times x's sum over the sub-block at the
 * end, a sub-block at a time (AVX2's 16 registers); more take the quants
 * less 32 (q6k_pair), which costs more a block but less a row. Either is
 * fewer operations than q6k_pairs' scaled weights where few X rows read
 * them. */
static inline __attribute__((always_inline)) void q6k_sums(const uint8_t *grp, int64_t b, const llm_act_row *x,
                                                          const int16_t *const *xp, const int NT, __m256i *S) {
    const uint8_t *p = llm_packed_block(LLM_TYPE_Q6_K, grp, b);
    const uint8_t *q = p + LLM_PK6K_Q + LLM_PK6K_BLOCK * (b % 8);
    const uint8_t *scales = p + LLM_PK6K_SC + 16 * (b % 8);   /* the rows' first sub-block's, then second's */
    if (NT > 2) {
        __m256i acc[LANE_ROWS][2];   /* [X row][sub-block] */
        UNROLL for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = _mm256_setzero_si256();
        UNROLL for (int c = 0; c < 4; c++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * c));
            const __m256i hv = _mm256_loadu_si256((const __m256i *)(q + LLM_PK6K_HI + 32 * (c / 2)));
            UNROLL for (int k = 0; k < 4; k++) {
                const __m256i wq = q6k_pair(v, hv, c, k);
                UNROLL for (int t = 0; t < NT; t++)
                    acc[t][c / 2] = dp_pairs(acc[t][c / 2], wq, bcast32(xp[t] + 8 * c + 2 * k));
            }
        }
        const __m256i sa = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)scales));
        const __m256i sb = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(scales + 8)));
        UNROLL for (int t = 0; t < NT; t++)
            S[t] = _mm256_add_epi32(_mm256_mullo_epi32(acc[t][0], sa), _mm256_mullo_epi32(acc[t][1], sb));
        return;
    }
    UNROLL for (int sub = 0; sub < 2; sub++) {
        const __m256i hv = _mm256_loadu_si256((const __m256i *)(q + LLM_PK6K_HI + 32 * sub));
        __m256i acc[2][3];   /* [X row][pair's power of 16] */
        UNROLL for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = acc[t][2] = _mm256_setzero_si256();
        UNROLL for (int c = 2 * sub; c < 2 * sub + 2; c++) {
            __m256i w[4];
            q6k_chunk(_mm256_loadu_si256((const __m256i *)(q + 32 * c)), hv, c, w);
            UNROLL for (int t = 0; t < NT; t++) UNROLL for (int k = 0; k < 4; k++)
                acc[t][k % 3] = dp_pairs(acc[t][k % 3], w[k], bcast32(xp[t] + 8 * c + 2 * k));
        }
        const __m256i sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(scales + 8 * sub)));
        UNROLL for (int t = 0; t < NT; t++) {
            const int32_t xs = sub ? x[t].s[b] - x[t].h[b] : x[t].h[b];   /* x's sum over the sub-block */
            const __m256i u = _mm256_mullo_epi32(q6k_sub_sum(acc[t], _mm256_set1_epi32(xs)), sc);
            S[t] = sub ? _mm256_add_epi32(S[t], u) : u;
        }
    }
}

#ifdef __AVX512BW__
/* dp_pairs on 512-bit vectors */
static inline __attribute__((always_inline)) __m512i dp_pairs512(__m512i acc, __m512i w, __m512i x) {
#ifdef QK_VNNI
    return _mm512_dpwssd_epi32(acc, w, x);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(w, x));
#endif
}

/* q6k_sums for one X row on two blocks at once, b and b + 1 (b even), in
 * the 16 lanes of 512-bit vectors: lanes 0-7 block b's 8 rows, 8-15 block
 * b + 1's. xv[j]: the X row's pair j of block b in lanes 0-7, of block b + 1
 * in 8-15, and xs[sub] its sums over that sub-block likewise (q6k_x2) */
static inline __attribute__((always_inline)) __m512i q6k_sums2(const uint8_t *grp, int64_t b, const __m512i xv[16],
                                                              const __m512i xs[2]) {
    const uint8_t *p = llm_packed_block(LLM_TYPE_Q6_K, grp, b);
    const uint8_t *q = p + LLM_PK6K_Q + LLM_PK6K_BLOCK * (b % 8);
    __m512i acc[2][3];   /* [sub-block][pair's power of 16], as q6k_sums' */
    UNROLL for (int sub = 0; sub < 2; sub++) acc[sub][0] = acc[sub][1] = acc[sub][2] = _mm512_setzero_si512();
    UNROLL for (int c = 0; c < 4; c++) {
        const uint8_t *lo_at = q + 32 * c, *hi_at = q + LLM_PK6K_HI + 32 * (c / 2);
        const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lo_at)),
                                             _mm256_loadu_si256((const __m256i *)(lo_at + LLM_PK6K_BLOCK)), 1);
        const __m512i hv = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)hi_at)),
                                              _mm256_loadu_si256((const __m256i *)(hi_at + LLM_PK6K_BLOCK)), 1);
        const __m512i hs = _mm512_slli_epi32(hv, 4 - 2 * (c % 2));   /* q6k_chunk's */
        const __m512i w0 = _mm512_ternarylogic_epi32(hs, _mm512_set1_epi32(0x00300030),
                                                     _mm512_and_si512(v, _mm512_set1_epi32(0x000F000F)), 0xEA);
        const __m512i w1 = _mm512_ternarylogic_epi32(hs, _mm512_set1_epi32(0x03000300),
                                                     _mm512_and_si512(v, _mm512_set1_epi32(0x00F000F0)), 0xEA);
        const __m512i w2 = _mm512_ternarylogic_epi32(hs, _mm512_set1_epi32(0x30003000),
                                                     _mm512_and_si512(v, _mm512_set1_epi32(0x0F000F00)), 0xEA);
        const __m512i w3 = _mm512_ternarylogic_epi32(_mm512_srli_epi32(hv, 8 + 2 * (c % 2)), _mm512_set1_epi32(0x00300030),
                                                     _mm512_srli_epi16(v, 12), 0xEA);
        __m512i *a = acc[c / 2];
        a[0] = dp_pairs512(a[0], w0, xv[4 * c]);
        a[1] = dp_pairs512(a[1], w1, xv[4 * c + 1]);
        a[2] = dp_pairs512(a[2], w2, xv[4 * c + 2]);
        a[0] = dp_pairs512(a[0], w3, xv[4 * c + 3]);
    }
    /* the sub-block scales: [block b's first 8, its second 8, block b + 1's first, second] */
    const __m128i s0 = _mm_loadu_si128((const __m128i *)(p + LLM_PK6K_SC + 16 * (b % 8)));
    const __m128i s1 = _mm_loadu_si128((const __m128i *)(p + LLM_PK6K_SC + 16 * (b % 8) + 16));
    const __m512i sc[2] = {_mm512_cvtepi8_epi32(_mm_unpacklo_epi64(s0, s1)), _mm512_cvtepi8_epi32(_mm_unpackhi_epi64(s0, s1))};
    __m512i S = _mm512_setzero_si512();
    UNROLL for (int sub = 0; sub < 2; sub++) {   /* q6k_sub_sum's, on 16 lanes */
        const __m512i u = _mm512_add_epi32(_mm512_srai_epi32(acc[sub][1], 4), _mm512_srai_epi32(acc[sub][2], 8));
        const __m512i sum = _mm512_sub_epi32(_mm512_add_epi32(acc[sub][0], u), _mm512_slli_epi32(xs[sub], 5));
        S = _mm512_add_epi32(S, _mm512_mullo_epi32(sum, sc[sub]));
    }
    return S;
}

/* X row x's blocks b, b + 1 as q6k_sums2 reads them: the pairs xv (8-bit
 * quants widened), and its sums over each half xs */
static inline __attribute__((always_inline)) void q6k_x2(const llm_act_row *x, int64_t b, const int W16,
                                                        __m512i xv[16], __m512i xs[2]) {
    __m512i x0, x1;
    if (W16) {
        x0 = _mm512_loadu_si512((const int16_t *)x->q + 32 * b), x1 = _mm512_loadu_si512((const int16_t *)x->q + 32 * b + 32);
    } else {
        const __m512i q = _mm512_loadu_si512((const int8_t *)x->q + 32 * b);
        x0 = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(q)), x1 = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(q, 1));
    }
    UNROLL for (int j = 0; j < 16; j++)
        xv[j] = _mm512_permutex2var_epi32(x0, _mm512_inserti64x4(_mm512_set1_epi32(j), _mm256_set1_epi32(16 + j), 1), x1);
    /* [h_b, h_b+1, s_b - h_b, s_b+1 - h_b+1], each spread over its 8 lanes */
    const __m128i h = _mm_loadl_epi64((const __m128i *)(x->h + b)), s = _mm_loadl_epi64((const __m128i *)(x->s + b));
    const __m512i sums = _mm512_castsi128_si512(_mm_unpacklo_epi64(h, _mm_sub_epi32(s, h)));
    UNROLL for (int k = 0; k < 2; k++)
        xs[k] = _mm512_permutexvar_epi32(_mm512_inserti64x4(_mm512_set1_epi32(2 * k), _mm256_set1_epi32(2 * k + 1), 1), sums);
}
#endif

/* Block b of activation row x as int16 pairs: its 16-bit quants, or its
 * 8-bit ones widened into buf */
static inline __attribute__((always_inline)) const int16_t *x_pairs(const llm_act_row *x, int64_t b, const int W16,
                                                                   int16_t buf[32]) {
    if (W16) return (const int16_t *)x->q + 32 * b;
    const int8_t *q = (const int8_t *)x->q + 32 * b;
    _mm256_storeu_si256((__m256i *)buf, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)q)));
    _mm256_storeu_si256((__m256i *)(buf + 16), _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 16))));
    return buf;
}

/* The 8 rows' terms of block b, S their block sums and wa, wb their scales
 * and offsets */
static inline __attribute__((always_inline)) __m256
block_terms(const int type, __m256i S, __m256 wa, __m256 wb, const llm_act_row *x, int64_t b) {
    return terms(type, S, _mm256_set1_epi32(x->s[b]), _mm256_set1_ps(x->d[b]), wa, wb);
}

/* (l0+l4 + l2+l6) + (l1+l5 + l3+l7) of the lane sums acc[b % 8], 8 rows at once */
static inline void lanes_final(const __m256 acc[8], float out[8]) {
    __m256 h0 = _mm256_add_ps(acc[0], acc[4]), h1 = _mm256_add_ps(acc[1], acc[5]);
    __m256 h2 = _mm256_add_ps(acc[2], acc[6]), h3 = _mm256_add_ps(acc[3], acc[7]);
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(h0, h2), _mm256_add_ps(h1, h3)));
}


/* Bytes ahead of the block in use that a packed group prefetches: a group
 * is one stream, but a matmul task is only 4 groups (11 KB of a 576-wide
 * Q4_1 matrix), too short for the hardware prefetcher to run ahead; a few KB
 * ahead keeps one core's stream fed, more starts to evict what is in use. */
enum { PF_AHEAD = 3072 };

/* The 8 rows' exact sums of block b of a packed group (the block's bytes at
 * p) against one activation row x */
static inline __attribute__((always_inline)) __m256i row1_sums(const int type, const uint8_t *grp, const uint8_t *p,
                                                              int64_t b, const llm_act_row *x, const int W16) {
    const int bb = (int)llm_packed_block_bytes(type), hd = llm_packed_head(type);
    __m256i S;
    if (type == LLM_TYPE_Q6_K) {
        _Alignas(32) int16_t buf[32];
        const int16_t *xp = x_pairs(x, b, W16, buf);
        q6k_sums(grp, b, x, &xp, 1, &S);
    } else if (llm_packed_lanes(type) && W16) {
        const int16_t *xp = (const int16_t *)x->q + 32 * b;
        lane_sums16(llm_packed_lane_quants(type, grp, b), llm_packed_lane_high(type, grp, b), &xp, 1, &S);
    } else if (llm_packed_lanes(type)) {
        S = lane_sums8(llm_packed_lane_quants(type, grp, b), llm_packed_lane_high(type, grp, b),
                       (const int8_t *)x->q + 32 * b);
    } else if (W16 && type == LLM_TYPE_Q8_0 && ZMM_ROW1(type)) {
        S = q8_rows8_sums(p + llm_packed_rest(bb, hd, 0), (const int16_t *)x->q + 32 * b);
    } else {
        __m256i xa, xb, v[8];
        x_block(x, b, W16, &xa, &xb);
        UNROLL for (int r = 0; r < 8; r++) {
            __m256i w0, w1 = _mm256_setzero_si256();
            block32_quants(type, p + llm_packed_rest(bb, hd, r), W16, &w0, &w1);
            v[r] = wdot(type, w0, w1, xa, xb, W16);
        }
        S = hsum8_epi32(v);
    }
    return S;
}

/* One activation row against ng <= LLM_ROW1_GROUPS packed groups, gbytes
 * apart (out[8*k + r]: row r of group k), block b of every group before
 * block b + 1: ng streams through memory at once. Each group's rows are summed as
 * packed_group sums them, in the same order, so the same bits; a Q4_K
 * super-block's d and dmin are converted once for its 8 blocks. */
static inline __attribute__((always_inline)) void packed_groups_row1(const int type, const uint8_t *grp,
                                                                    int64_t gbytes, int ng, int64_t nb,
                                                                    const llm_act_row *x, float *out, const int W16) {
    __m256 acc[LLM_ROW1_GROUPS][8];   /* [group][b % 8], a lane per weight row: the reference's lane sums */
    for (int k = 0; k < ng; k++) UNROLL for (int i = 0; i < 8; i++) acc[k][i] = _mm256_setzero_ps();
    __m256 d[LLM_ROW1_GROUPS], dmin[LLM_ROW1_GROUPS];
#ifdef __AVX512BW__
    if (type == LLM_TYPE_Q6_K) {   /* two blocks at a time (a row has whole super-blocks): q6k_sums2 */
        const int64_t sb = llm_packed_stream_bytes(type);
        for (int64_t b = 0; b < nb; b += 2) {
            __m512i xv[16], xs[2];
            q6k_x2(x, b, W16, xv, xs);
            for (int k = 0; k < ng; k++) {
                const uint8_t *g = grp + k * gbytes, *at = g + b * sb;
                for (int o = 0; o < 2 * sb; o += 64) _mm_prefetch((const char *)at + PF_AHEAD + o, _MM_HINT_T0);
                const __m512i S = q6k_sums2(g, b, xv, xs);
                __m256 wa, wb;
                packed_scales(type, g, b, &wa, &wb);   /* the super-block's d, the same for b + 1 */
                acc[k][b % 8] = _mm256_add_ps(acc[k][b % 8], block_terms(type, _mm512_castsi512_si256(S), wa, wb, x, b));
                acc[k][b % 8 + 1] = _mm256_add_ps(acc[k][b % 8 + 1],
                                                  block_terms(type, _mm512_extracti64x4_epi64(S, 1), wa, wb, x, b + 1));
            }
        }
        for (int k = 0; k < ng; k++) lanes_final(acc[k], out + 8 * k);
        return;
    }
#endif
    for (int64_t b0 = 0; b0 < nb; b0 += 8) {
        const int ns = nb - b0 < 8 ? (int)(nb - b0) : 8;
        if (llm_packed_k45(type))
            for (int k = 0; k < ng; k++) {
                const uint8_t *sb = llm_packed_block(type, grp + k * gbytes, b0);
                d[k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + LLM_PK4K_D)));
                dmin[k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + LLM_PK4K_DMIN)));
            }
        UNROLL for (int s = 0; s < 8; s++) {
            if (s >= ns) break;
            const int64_t b = b0 + s;
            for (int k = 0; k < ng; k++) {
                const uint8_t *g = grp + k * gbytes;
                const int64_t sb = llm_packed_stream_bytes(type);
                const uint8_t *p = llm_packed_block(type, g, b), *at = g + b * sb;
                for (int o = 0; o < sb; o += 64) _mm_prefetch((const char *)at + PF_AHEAD + o, _MM_HINT_T0);
                const __m256i S = row1_sums(type, g, p, b, x, W16);
                __m256 wa, wb;
                if (llm_packed_k45(type)) q4k_scales(p, s, d[k], dmin[k], &wa, &wb);
                else packed_scales(type, g, b, &wa, &wb);
                acc[k][s] = _mm256_add_ps(acc[k][s], block_terms(type, S, wa, wb, x, b));
            }
        }
    }
    for (int k = 0; k < ng; k++) lanes_final(acc[k], out + 8 * k);
}

/* NT (2 .. LANE_ROWS) activation rows of 16-bit quants (a few rows): a
 * lane-packed group's bytes masked once for all the rows, another group's 8
 * rows decoded once per block for all of them (figures in
 * docs/PERFORMANCE.md); each row's float part is the same as one row's, so
 * the same bits. */
static inline __attribute__((always_inline)) void packed_group(const int type, const uint8_t *grp, int64_t nb,
                                                              const llm_act_row *x, const int NT, float *out) {
    const int64_t bb = llm_packed_block_bytes(type);
    const int hd = llm_packed_head(type);
    __m256 acc[LANE_ROWS][8];   /* [X row][b % 8], a lane per weight row: the reference's lane sums */
    UNROLL for (int t = 0; t < NT; t++) UNROLL for (int i = 0; i < 8; i++) acc[t][i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        /* block b's bytes in the group's stream (a Q4_K super-block's eighth) */
        const int64_t sb = llm_packed_stream_bytes(type);
        const uint8_t *p = llm_packed_block(type, grp, b), *at = grp + b * sb;
        for (int o = 0; o < sb; o += 64) _mm_prefetch((const char *)at + PF_AHEAD + o, _MM_HINT_T0);
        __m256i S[LANE_ROWS];
        if (type == LLM_TYPE_Q6_K) {
            const int16_t *xp[LANE_ROWS];
            UNROLL for (int t = 0; t < NT; t++) xp[t] = (const int16_t *)x[t].q + 32 * b;
            q6k_sums(grp, b, x, xp, NT, S);
        } else if (llm_packed_lanes(type)) {
            const int16_t *xp[LANE_ROWS];
            UNROLL for (int t = 0; t < NT; t++) xp[t] = (const int16_t *)x[t].q + 32 * b;
            lane_sums16(llm_packed_lane_quants(type, grp, b), llm_packed_lane_high(type, grp, b), xp, NT, S);
        } else {
            __m256i w0[8], w1[8];
            UNROLL for (int r = 0; r < 8; r++) {
                w1[r] = _mm256_setzero_si256();
                block32_quants(type, p + llm_packed_rest((int)bb, hd, r), 1, &w0[r], &w1[r]);
            }
            UNROLL for (int t = 0; t < NT; t++) {
                __m256i xa, xb, v[8];
                x_block(&x[t], b, 1, &xa, &xb);
                UNROLL for (int r = 0; r < 8; r++) v[r] = wdot(type, w0[r], w1[r], xa, xb, 1);
                S[t] = hsum8_epi32(v);
            }
        }
        __m256 wa, wb;
        packed_scales(type, grp, b, &wa, &wb);
        UNROLL for (int t = 0; t < NT; t++)
            acc[t][b % 8] = _mm256_add_ps(acc[t][b % 8], block_terms(type, S[t], wa, wb, &x[t], b));
    }
    UNROLL for (int t = 0; t < NT; t++) lanes_final(acc[t], out + 8 * t);
}

/* packed_group on the first rows of x [0 .. n), as many as it takes at
 * once (up to LANE_ROWS with 16-bit quants, else 1), each count compiled
 * apart; returns how many it took. */
static inline __attribute__((always_inline)) int packed_rows(const int type, const uint8_t *grp, int64_t nb,
                                                            const llm_act_row *x, int n, float *out, const int W16) {
    if (!W16 || n == 1) {
        packed_groups_row1(type, grp, 0, 1, nb, x, out, W16);
        return 1;
    }
    switch (n < LANE_ROWS ? n : LANE_ROWS) {
#if LANE_ROWS > 2
    case 4: packed_group(type, grp, nb, x, 4, out); return 4;
    case 3: packed_group(type, grp, nb, x, 3, out); return 3;
#endif
    default: packed_group(type, grp, nb, x, 2, out); return 2;
    }
}

/* Several activation rows (prefill, batches): 8 rows' weights decoded once,
 * CB blocks at a time, into an L1-resident buffer that every activation row
 * then reads, so a format's decoding (Q5_0's fifth bits, the K-quants'
 * scales) is not paid again per row. The rows' lane sums wait in acc between
 * chunks. */
enum { CB = 64, NT_MAX = 64 };
typedef struct {
    __m256i w[CB][8][2];   /* [block][row]: the vectors of packed_weights (32 KB) */
    __m256 wa[CB], wb[CB]; /* [block]: the 8 rows' scales and offsets */
    int32_t sc[CB][2][8];  /* [block][half][row]: a packed Q6_K block's sub-block scales, for the 8-bit tiles */
} rows_buf;

static inline __attribute__((always_inline)) void
rows_against_x(const int type, const rows_buf *rb, int64_t c0, int64_t c1, const llm_act_row *x, int nt,
               __m256 (*acc)[8], const int W16) {
    for (int t = 0; t < nt; t++)
        for (int64_t b = c0; b < c1; b++) {
            __m256i xa, xb, v[8];
            x_block(&x[t], b, W16, &xa, &xb);
            UNROLL for (int r = 0; r < 8; r++)
                v[r] = wdot(type, rb->w[b - c0][r][0], rb->w[b - c0][r][1], xa, xb, W16);
            acc[t][b % 8] = _mm256_add_ps(acc[t][b % 8],
                                          block_terms(type, hsum8_epi32(v), rb->wa[b - c0], rb->wb[b - c0], &x[t], b));
        }
}

/* dword j of in[r] to dword r of out[j], r, j < 8 */
static inline __attribute__((always_inline)) void transpose8_epi32(const __m256i in[8], __m256i out[8]) {
    __m256i t[8], u[8];
    UNROLL for (int k = 0; k < 4; k++) {
        t[2 * k] = _mm256_unpacklo_epi32(in[2 * k], in[2 * k + 1]);
        t[2 * k + 1] = _mm256_unpackhi_epi32(in[2 * k], in[2 * k + 1]);
    }
    UNROLL for (int k = 0; k < 2; k++) {   /* u[4k + j]: dword j (128-bit half 0) and j + 4 (half 1) of in[4k .. 4k+3] */
        u[4 * k] = _mm256_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 1] = _mm256_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 2] = _mm256_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
        u[4 * k + 3] = _mm256_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
    }
    UNROLL for (int j = 0; j < 4; j++) {
        out[j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x20);
        out[j + 4] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x31);
    }
}

/* The 16 int16 pair vectors of a lane-packed block's quants q (Q5_K's
 * fifth bits at h, else NULL): lane r of pr[j] is row r's elements 2j,
 * 2j + 1 */
static inline __attribute__((always_inline)) void lane_pairs(const uint8_t *q, const uint8_t *h, __m256i pr[16]) {
    const __m256i m0 = _mm256_set1_epi32(0x000F000F);
    const __m256i hv = h ? _mm256_loadu_si256((const __m256i *)h) : _mm256_setzero_si256();
    UNROLL for (int c = 0; c < 4; c++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * c));
        pr[4 * c] = _mm256_and_si256(v, m0);
        pr[4 * c + 1] = _mm256_and_si256(_mm256_srli_epi32(v, 4), m0);
        pr[4 * c + 2] = _mm256_and_si256(_mm256_srli_epi32(v, 8), m0);
        pr[4 * c + 3] = _mm256_srli_epi16(v, 12);
        if (h)   /* pair k's fifth bits from bits 4k + c (+ 16) to 4 (+ 16) */
            UNROLL for (int k = 0; k < 4; k++)
                pr[4 * c + k] = with_bits(pr[4 * c + k], shift_dwords(hv, 4 * k + c - 4), _mm256_set1_epi32(0x00100010));
    }
}

/* Block b of a packed group into slot i of the buffer. A lane-packed block
 * becomes its pair vectors, then by two transposes each row's elements
 * 0..15 and 16..31 (with 8-bit quants, packed to its 32 bytes); with
 * PAIRS the pair vectors themselves, [pair][row] (pair_at), for the
 * products that broadcast one row's pair at a time. */
/* Whether a packed block of the type gives its 8 rows' weights as 16 int16
 * pair vectors (lane_pairs, q6k_pairs); for 8-bit X rows every packed
 * block gives 8 quad vectors (packed_quads) */
static inline int packed_pairs(int type) { return llm_packed_lanes(type) || type == LLM_TYPE_Q6_K; }

/* 512-bit VNNI tiles of X rows in lanes (wide_block) */
#define X_WIDE QK_X_WIDE
#if X_WIDE
/* 32 weight bytes of 8 rows in element order (rows[r]) to the quad vectors
 * of packed_quads: each row's bytes in the lanes' order, then the 8 rows'
 * dwords transposed */
static inline __attribute__((always_inline)) void rows_to_quads(__m256i rows[8], __m256i qd[8]) {
    UNROLL for (int r = 0; r < 8; r++) rows[r] = lane_order(rows[r]);
    transpose8_epi32(rows, qd);
}

/* The 8 quad vectors of block b of a packed group for 8-bit X rows in
 * lanes: lane r of qd[j] is row r's unsigned quants of elements 8 (j / 2)
 * + 0, 4, 1, 5 (j even) or + 2, 6, 3, 7 (j odd), the order of the lanes'
 * quad j (llm_act_lanes_size). Lane-packed blocks: a dword's low nibbles
 * masked (j even) or its high ones shifted down and masked. Q6_K's 6-bit
 * quants take their high bits beside them (bits 4, 5 of each byte), from
 * the high-bit chunk's nibble places (quant_kern.h). Q5_0's and Q8_0's
 * rows keep their blocks whole: each row's 32 quants (Q8_0's plus 128,
 * unsigned) put in that order by a shuffle, then the 8 rows' dwords
 * transposed. */
static inline __attribute__((always_inline)) void packed_quads(const int type, const uint8_t *grp, int64_t b,
                                                               __m256i qd[8]) {
    const __m256i m4 = _mm256_set1_epi8(15), mh = _mm256_set1_epi8(0x30);
    if (type == LLM_TYPE_Q5_0 || type == LLM_TYPE_Q8_0) {
        const int bb = (int)llm_packed_block_bytes(type), hd = llm_packed_head(type);
        const uint8_t *p = llm_packed_block(type, grp, b);
        __m256i rows[8], unused;
        UNROLL for (int r = 0; r < 8; r++) {
            block32_quants(type, p + llm_packed_rest(bb, hd, r), 0, &rows[r], &unused);
            if (type == LLM_TYPE_Q8_0) rows[r] = _mm256_xor_si256(rows[r], _mm256_set1_epi8(-128));
        }
        rows_to_quads(rows, qd);
        return;
    }
    if (type == LLM_TYPE_Q6_K) {
        const uint8_t *q = llm_packed_block(type, grp, b) + LLM_PK6K_Q + LLM_PK6K_BLOCK * (b % 8);
        UNROLL for (int c = 0; c < 4; c++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * c));
            const __m256i h = _mm256_srli_epi32(_mm256_loadu_si256((const __m256i *)(q + LLM_PK6K_HI + 32 * (c / 2))),
                                                2 * (c % 2));
            qd[2 * c] = with_bits(_mm256_and_si256(v, m4), _mm256_slli_epi32(h, 4), mh);
            qd[2 * c + 1] = with_bits(_mm256_and_si256(_mm256_srli_epi32(v, 4), m4), h, mh);
        }
        return;
    }
    const uint8_t *q = llm_packed_lane_quants(type, grp, b), *h = llm_packed_lane_high(type, grp, b);
    const __m256i hv = h ? _mm256_loadu_si256((const __m256i *)h) : _mm256_setzero_si256();
    UNROLL for (int c = 0; c < 4; c++)
        lane_bytes(_mm256_loadu_si256((const __m256i *)(q + 32 * c)), h, hv, c, &qd[2 * c], &qd[2 * c + 1]);
}
#endif

static inline __attribute__((always_inline)) void
packed_block_into(const int type, const uint8_t *grp, int64_t b, rows_buf *rb, int64_t i, const int W16,
                  const int PAIRS) {
    const int64_t bb = llm_packed_block_bytes(type);
    const int hd = llm_packed_head(type);
    const uint8_t *p = llm_packed_block(type, grp, b);
#if X_WIDE
    if (PAIRS && !W16) {   /* 8-bit X rows: the quad vectors, [quad][row] */
        __m256i qd[8];
        packed_quads(type, grp, b, qd);
        UNROLL for (int j = 0; j < 8; j++) _mm256_store_si256((__m256i *)rb->w[i] + j, qd[j]);
        if (type == LLM_TYPE_Q6_K)
            UNROLL for (int h = 0; h < 2; h++)
                _mm256_store_si256((__m256i *)rb->sc[i][h],
                                   _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                       (const __m128i *)(p + LLM_PK6K_SC + 8 * (2 * (b % 8) + h)))));
        packed_scales(type, grp, b, &rb->wa[i], &rb->wb[i]);
        return;
    }
#endif
    if (packed_pairs(type)) {
        __m256i pr[16], rows[8];
        if (type == LLM_TYPE_Q6_K) q6k_pairs(grp, b, pr);
        else lane_pairs(llm_packed_lane_quants(type, grp, b), llm_packed_lane_high(type, grp, b), pr);
        if (PAIRS) {   /* Q4_0's quants less 8 here, once for all the X rows */
            if (type == LLM_TYPE_Q4_0) UNROLL for (int j = 0; j < 16; j++) pr[j] = _mm256_sub_epi16(pr[j], _mm256_set1_epi16(8));
            UNROLL for (int j = 0; j < 16; j++) _mm256_store_si256((__m256i *)rb->w[i] + j, pr[j]);
            packed_scales(type, grp, b, &rb->wa[i], &rb->wb[i]);
            return;
        }
        UNROLL for (int half = 0; half < 2; half++) {
            transpose8_epi32(pr + 8 * half, rows);
            UNROLL for (int r = 0; r < 8; r++) rb->w[i][r][half] = rows[r];
        }
        if (!W16 && llm_packed_lanes(type))   /* 8-bit X rows: each row's quants as bytes in element order */
            UNROLL for (int r = 0; r < 8; r++)
                rb->w[i][r][0] = _mm256_permute4x64_epi64(_mm256_packus_epi16(rb->w[i][r][0], rb->w[i][r][1]), 0xD8);
    } else {
        UNROLL for (int r = 0; r < 8; r++) {
            rb->w[i][r][1] = _mm256_setzero_si256();
            block32_quants(type, p + llm_packed_rest((int)bb, hd, r), W16, &rb->w[i][r][0], &rb->w[i][r][1]);
        }
    }
    packed_scales(type, grp, b, &rb->wa[i], &rb->wb[i]);
}

/* Block b of nr <= 8 plain rows (rows past nr: zeros) into slot i, as the
 * int16 weights of dot32w */
static inline __attribute__((always_inline)) void
plain_block_into(const int type, const uint8_t *const *w, int nr, int64_t b, rows_buf *rb, int64_t i) {
    _Alignas(32) float wa[8] = {0}, wb[8] = {0};
    for (int r = 0; r < 8; r++) {
        __m256i *v = rb->w[i][r];
        if (r >= nr) {
            v[0] = v[1] = _mm256_setzero_si256();
            continue;
        }
        if (!wwords(type, w[r], b, &v[0], &v[1])) {
            __m256i sc16 = _mm256_setzero_si256(), wv = wbytes(type, w[r], b, &sc16);
            widen16(type, wv, sc16, &v[0], &v[1]);
        }
        plain_scales(type, w[r], b, &wa[r], &wb[r]);
    }
    rb->wa[i] = _mm256_load_ps(wa), rb->wb[i] = _mm256_load_ps(wb);
}

#if X_WIDE
/* Block b of nr <= 8 plain rows (rows past nr: zeros) into slot i as the
 * quad vectors of packed_quads, for 8-bit X rows: wbytes' bytes made
 * unsigned (Q8_0 plus 128, Q6_K's quants as stored) with Q6_K's sub-block
 * scales beside them, as a packed group's */
static inline __attribute__((always_inline)) void
plain_quads_into(const int type, const uint8_t *const *w, int nr, int64_t b, rows_buf *rb, int64_t i) {
    _Alignas(32) float wa[8] = {0}, wb[8] = {0};
    __m256i rows[8], qd[8];
    for (int r = 0; r < 8; r++) {
        if (r >= nr) {
            rows[r] = _mm256_setzero_si256();
            if (type == LLM_TYPE_Q6_K) rb->sc[i][0][r] = rb->sc[i][1][r] = 0;
            continue;
        }
        __m256i sc16 = _mm256_setzero_si256();
        rows[r] = wbytes(type, w[r], b, &sc16);
        if (type == LLM_TYPE_Q8_0) rows[r] = _mm256_xor_si256(rows[r], _mm256_set1_epi8(-128));
        if (type == LLM_TYPE_Q6_K) {
            rows[r] = _mm256_add_epi8(rows[r], _mm256_set1_epi8(32));
            rb->sc[i][0][r] = (int16_t)_mm256_extract_epi16(sc16, 0);
            rb->sc[i][1][r] = (int16_t)_mm256_extract_epi16(sc16, 8);
        }
        plain_scales(type, w[r], b, &wa[r], &wb[r]);
    }
    rows_to_quads(rows, qd);
    UNROLL for (int j = 0; j < 8; j++) _mm256_store_si256((__m256i *)rb->w[i] + j, qd[j]);
    rb->wa[i] = _mm256_load_ps(wa), rb->wb[i] = _mm256_load_ps(wb);
}
#endif

/* Pair j (elements 2j, 2j + 1) of weight row r in slot i of the buffer:
 * rows' vectors ([row][half]), or with PAIRS the pair vectors ([pair][row]) */
static inline __attribute__((always_inline)) int pair_index(int r, int j, const int PAIRS) {
    return PAIRS ? 8 * j + r : 16 * r + j;
}
static inline __attribute__((always_inline)) const int32_t *pair_at(const rows_buf *rb, int64_t i, int r, int j,
                                                                    const int PAIRS) {
    return (const int32_t *)rb->w[i] + pair_index(r, j, PAIRS);
}

/* The same with the activation rows in lanes (llm_act_row.lanes, 16-bit):
 * 8 X rows' pairs of a block stay in 16 registers (with AVX2's 16, in L1,
 * read as the multiply-adds' memory operands) while each of the 8
 * weight rows' pairs is broadcast against them, so the 8 sums of a weight
 * row build up in the lanes of one vector (lane l: X row t0 + l), with no
 * horizontal sum. acc[g][r][b % 8]: X rows 8g.., weight row r. */
static inline __attribute__((always_inline)) void
rows_against_lanes(const int type, const rows_buf *rb, int64_t nb, int64_t c0, int64_t c1, const llm_act_row *x,
                   int nt, __m256 (*acc)[8][8], const int PAIRS) {
    for (int t0 = 0; t0 < nt; t0 += 8) {
        for (int64_t b = c0; b < c1; b++) {
            const int32_t *lanes = x[t0].lanes;   /* 8 rows of a group of 16 */
            __m256i xv[16];
            UNROLL for (int j = 0; j < 16; j++) xv[j] = _mm256_loadu_si256((const __m256i *)(lanes + b * 256 + 16 * j));
            const __m256 dv = _mm256_loadu_ps((const float *)(lanes + llm_act_lanes_d(nb, 16) + b * 16));
            const __m256i Bv = _mm256_loadu_si256((const __m256i *)(lanes + llm_act_lanes_s(nb, 16) + b * 16));
            const float *wa = (const float *)&rb->wa[b - c0], *wb = (const float *)&rb->wb[b - c0];
            UNROLL for (int r = 0; r < 8; r++) {
                __m256i a0 = _mm256_setzero_si256(), a1 = a0;
                UNROLL for (int j = 0; j < 16; j += 2) {
                    a0 = dp_pairs(a0, xv[j], bcast32(pair_at(rb, b - c0, r, j, PAIRS)));
                    a1 = dp_pairs(a1, xv[j + 1], bcast32(pair_at(rb, b - c0, r, j + 1, PAIRS)));
                }
                __m256 *ac = &acc[t0 / 8][r][b % 8];
                /* Q4_0's pair vectors hold its quants less 8: sums with no offset to take off, as Q8_0's */
                *ac = _mm256_add_ps(*ac, terms(PAIRS && type == LLM_TYPE_Q4_0 ? LLM_TYPE_Q8_0 : type,
                                               _mm256_add_epi32(a0, a1), Bv, dv, _mm256_set1_ps(wa[r]),
                                               _mm256_set1_ps(wb[r])));
            }
        }
    }
}

/* With AVX-512 VNNI, the X rows in lanes by 32 or 64 at a time in 512-bit
 * tiles (wide_block); without VNNI a product is two 512-bit operations
 * (vpmaddwd and vpaddd) and such tiles lose to rows_against_lanes
 * (docs/PERFORMANCE.md) */
#if X_WIDE
/* Block b (slot i of the buffer) of weight rows r0 .. r0+NR-1 against NV
 * vectors of 16 X rows in lanes (groups of 16 from l0 on, G int32 apart),
 * in the 16 lanes of 512-bit vectors: per pair (Q8: quad), the NV X vectors
 * loaded once and each weight row's pair broadcast once for all of them,
 * the NV * NR sums in registers (at most 16). A 512-bit load or broadcast
 * costs about what a vpdpwssd does on the machines measured, so the loads
 * a product takes decide: 64 X rows against 4 weight rows take 8 a pair
 * for 16 products (32 against 8: 10). With 8-bit X rows (Q8) a vpdpbusd
 * takes 4 elements where vpdpwssd takes 2, the unsigned quads of
 * packed_quads against the signed X quads; Q6_K's two sub-blocks of 16 are
 * summed apart, less 32 times the X half sums, and times their scales in
 * float, where each product (at most 16 * 32 * 127 * 128 < 2^23) and their
 * sum (< 2^24) are exact: the float of the integer sum the reference's
 * scaled weights give. acc[v][r][b % 8]: lane l is X row 16v
 * + l, weight row r. The float part is terms' on 16 lanes; off: the quant
 * offset still in the sums (none in Q4_0's 16-bit pair vectors). */
static inline __attribute__((always_inline)) void
tile512(const int type, const rows_buf *rb, int64_t i, int64_t b, int64_t nb, const int32_t *l0, int64_t G,
        const int NV, const int r0, const int NR, __m512 (*acc)[8][8], const int PAIRS, const int off, const int Q8) {
    const int bits = Q8 ? 8 : 16, J = Q8 ? 8 : 16, q6 = Q8 && type == LLM_TYPE_Q6_K;
    const int64_t QW = llm_act_lanes_q(bits);
    /* hidden from the compiler, which would otherwise keep one tile's
     * addresses and loads for the next and run out of registers */
    const int32_t *l = l0, *wp = pair_at(rb, i, r0, 0, PAIRS);
    __asm__("" : "+r"(l), "+r"(wp));
    __m512i a[4][8];   /* [X vector][weight row] */
    __m512 h[4][8];   /* Q6_K: the first sub-block's scaled sums */
    UNROLL for (int v = 0; v < NV; v++) UNROLL for (int r = 0; r < NR; r++) a[v][r] = _mm512_setzero_si512();
    UNROLL for (int j = 0; j < J; j++) {
        if (q6 && j == J / 2)   /* the first sub-block's sums, scaled; the second's from 0 */
            UNROLL for (int v = 0; v < NV; v++) {
                const __m512i Hv = _mm512_slli_epi32(_mm512_loadu_si512(l + v * G + llm_act_lanes_h(nb, 8) + b * 16), 5);
                UNROLL for (int r = 0; r < NR; r++) {
                    h[v][r] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a[v][r], Hv)),
                                            _mm512_set1_ps((float)rb->sc[i][0][r0 + r]));
                    a[v][r] = _mm512_setzero_si512();
                }
            }
        __m512i xv[4];
        UNROLL for (int v = 0; v < NV; v++) xv[v] = _mm512_loadu_si512(l + v * G + b * QW + 16 * j);
        UNROLL for (int r = 0; r < NR; r++) {
            const __m512i w = _mm512_set1_epi32(wp[pair_index(r, j, PAIRS)]);
            UNROLL for (int v = 0; v < NV; v++)
                a[v][r] = Q8 ? _mm512_dpbusd_epi32(a[v][r], w, xv[v]) : dp_pairs512(a[v][r], xv[v], w);
        }
    }
    /* and the float part's loads kept after the products, not hoisted into them */
    const float *wa = (const float *)&rb->wa[i], *wb = (const float *)&rb->wb[i];
    __asm__("" : "+r"(l), "+r"(wa), "+r"(wb));
    UNROLL for (int v = 0; v < NV; v++) {
        const __m512 dv = _mm512_loadu_ps(l + v * G + llm_act_lanes_d(nb, bits) + b * 16);
        const __m512i Bv = _mm512_loadu_si512(l + v * G + llm_act_lanes_s(nb, bits) + b * 16);
        __m512i H2 = _mm512_setzero_si512();   /* Q6_K: 32 times the X half sums of elements 16..31 */
        if (q6) H2 = _mm512_slli_epi32(_mm512_sub_epi32(Bv, _mm512_loadu_si512(l + v * G + llm_act_lanes_h(nb, 8) + b * 16)), 5);
        UNROLL for (int r = 0; r < NR; r++) {
            __m512i S = a[v][r];
            if (off) S = _mm512_sub_epi32(S, _mm512_slli_epi32(Bv, off));
            __m512 Sf = _mm512_cvtepi32_ps(S);
            if (q6)
                Sf = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(S, H2)), _mm512_set1_ps((float)rb->sc[i][1][r0 + r]),
                                     h[v][r]);
            __m512 u = _mm512_mul_ps(Sf, _mm512_set1_ps(wa[r0 + r]));
            if (with_offsets(type))
                u = _mm512_add_ps(u, _mm512_mul_ps(_mm512_cvtepi32_ps(Bv), _mm512_set1_ps(wb[r0 + r])));
            __m512 *ac = &acc[v][r0 + r][b % 8];
            *ac = _mm512_add_ps(*ac, _mm512_mul_ps(dv, u));
        }
    }
}

/* Block b (slot i of the buffer) against X rows [0, wide) in lanes: 64 X
 * rows as two tiles of 4 weight rows, 32 as one of 8 (8-bit Q6_K, whose
 * tiles keep two sums a pair of rows: each 32 as two of 4), and (8-bit
 * rows, whose wide is a multiple of 16, the last group's rows past the
 * call's zeros) 16 as one of 8. acc[v]: X rows 16v.. */
static inline __attribute__((always_inline)) void
wide_block(const int type, const rows_buf *rb, int64_t nb, int64_t i, int64_t b, const llm_act_row *x, int wide,
           __m512 (*acc)[8][8], const int PAIRS, const int Q8) {
    /* Q8_0's quads are its quants plus 128 */
    const int off = PAIRS && !Q8 && type == LLM_TYPE_Q4_0 ? 0 : Q8 && type == LLM_TYPE_Q8_0 ? 7 : quant_offset(type);
    const int64_t G = (int64_t)llm_act_lanes_size(nb, Q8 ? 8 : 16);   /* from a group of 16 X rows to the next */
    int t0 = 0;
    if (Q8 && type == LLM_TYPE_Q6_K)
        for (; t0 + 32 <= wide; t0 += 32) {
            tile512(type, rb, i, b, nb, x[t0].lanes, G, 2, 0, 4, acc + t0 / 16, PAIRS, off, Q8);
            tile512(type, rb, i, b, nb, x[t0].lanes, G, 2, 4, 4, acc + t0 / 16, PAIRS, off, Q8);
        }
    for (; t0 + 64 <= wide; t0 += 64) {
        tile512(type, rb, i, b, nb, x[t0].lanes, G, 4, 0, 4, acc + t0 / 16, PAIRS, off, Q8);
        tile512(type, rb, i, b, nb, x[t0].lanes, G, 4, 4, 4, acc + t0 / 16, PAIRS, off, Q8);
    }
    for (; t0 + 32 <= wide; t0 += 32) tile512(type, rb, i, b, nb, x[t0].lanes, G, 2, 0, 8, acc + t0 / 16, PAIRS, off, Q8);
    if (Q8 && t0 < wide) tile512(type, rb, i, b, nb, x[t0].lanes, G, 1, 0, 8, acc + t0 / 16, PAIRS, off, Q8);
}

#endif

/* llm_qkern.act_lanes: each 8 rows' pairs (16-bit) or quads (8-bit, their
 * bytes put in the lanes' order by a shuffle) of quants by 8 x 8
 * transposes of dwords into their half of a group of 16, their scales and
 * sums (few) one at a time */
void QK_CAT(llm_act_lanes_, QK_TABLE)(llm_act_row *xs, int nt, int64_t nb, int32_t *buf) {
    const int bits = xs[0].bits;
    for (int g = 0; g * 16 < nt; g++) {
        int32_t *dst = buf + (size_t)g * llm_act_lanes_size(nb, bits);
        int32_t *dd = dst + llm_act_lanes_d(nb, bits), *ss = dst + llm_act_lanes_s(nb, bits);
        const int n = nt - 16 * g < 16 ? nt - 16 * g : 16;
        for (int l = 0; l < n; l++) xs[16 * g + l].lanes = llm_act_lanes_row(dst, nb, bits, l);
        const llm_act_row *x = xs + 16 * g;
        __m256i in[8], out[8];
        if (bits == LLM_ACT_Q8) {
            int32_t *hh = dst + llm_act_lanes_h(nb, bits);
            for (int64_t b = 0; b < nb; b++) {
                for (int e = 0; e < 2; e++) {   /* rows 8e .. 8e+7 of the group */
                    UNROLL for (int l = 0; l < 8; l++)
                        in[l] = 8 * e + l < n ? lane_order(_mm256_loadu_si256(
                                                    (const __m256i *)((const int8_t *)x[8 * e + l].q + 32 * b)))
                                              : _mm256_setzero_si256();
                    transpose8_epi32(in, out);
                    UNROLL for (int j = 0; j < 8; j++)
                        _mm256_storeu_si256((__m256i *)(dst + (b * 8 + j) * 16 + 8 * e), out[j]);
                }
                for (int l = 0; l < 16; l++) hh[b * 16 + l] = l < n ? x[l].h[b] : 0;
            }
        } else {
            for (int64_t b = 0; b < nb; b++)
                UNROLL for (int half = 0; half < 2; half++)
                    for (int e = 0; e < 2; e++) {   /* rows 8e .. 8e+7 of the group */
                        UNROLL for (int l = 0; l < 8; l++)
                            in[l] = 8 * e + l < n ? _mm256_loadu_si256((const __m256i *)(
                                                        (const int16_t *)x[8 * e + l].q + 32 * b + 16 * half))
                                                  : _mm256_setzero_si256();
                        transpose8_epi32(in, out);
                        UNROLL for (int j = 0; j < 8; j++)
                            _mm256_storeu_si256((__m256i *)(dst + (b * 16 + 8 * half + j) * 16 + 8 * e), out[j]);
                    }
        }
        for (int64_t b = 0; b < nb; b++)
            for (int l = 0; l < 16; l++) {
                float d = l < n ? x[l].d[b] : 0.0f;
                memcpy(dd + b * 16 + l, &d, 4);
                ss[b * 16 + l] = l < n ? x[l].s[b] : 0;
            }
    }
}

/* The group (PACKED) or the nr plain rows w against nt activation rows:
 * out[8*t + r] for a group, out[r*nt + t] for plain rows (16-bit only) */
static inline __attribute__((always_inline)) void
group_rows(const int type, const int PACKED, const uint8_t *grp, const uint8_t *const *w, int nr, int64_t nb,
           const llm_act_row *x, int nt, float *out, const int W16) {
    rows_buf rb;
    /* 8-bit X rows are read in lanes only by the 512-bit tiles of quads, all
     * of them (wide >= nt) */
    const int quads = X_WIDE && !W16 && x[0].lanes;
    const int lanes = x[0].lanes && (W16 || quads);
    /* X rows [0, wide) in 512-bit tiles (wide_block) */
    const int wide = X_WIDE && lanes ? (W16 ? nt / 32 * 32 : (nt + 15) / 16 * 16) : 0;
    /* with lanes, a lane-packed group's pair vectors (or any rows' quads) as they load */
    const int pairs = lanes && ((PACKED && packed_pairs(type)) || quads);
    union {
        __m256 rows[NT_MAX][8];           /* [X row][b % 8], a lane per weight row */
        __m256 lanes[NT_MAX / 8][8][8];   /* [X rows / 8][weight row][b % 8], a lane per X row */
#if X_WIDE
        __m512 lanes512[NT_MAX / 16][8][8];   /* [X rows / 16][weight row][b % 8] */
#endif
    } acc;
    for (int t = 0; t < ((wide > nt ? wide : nt) + 7) / 8 * 8; t++)   /* as many bytes as the rows or tiles use */
        UNROLL for (int i = 0; i < 8; i++) acc.rows[t][i] = _mm256_setzero_ps();
    for (int64_t c0 = 0; c0 < nb; c0 += CB) {
        const int64_t c1 = nb - c0 < CB ? nb : c0 + CB;
        for (int64_t b = c0; b < c1; b++) {
            /* the block's slot: one for all when the tiles take every row, so the buffer stays in L1
             * beside the sums, else one a block for the rest's pass after */
            const int64_t i = wide >= nt ? 0 : b - c0;
            if (PACKED && pairs) packed_block_into(type, grp, b, &rb, i, W16, 1);
            else if (PACKED) packed_block_into(type, grp, b, &rb, i, W16, 0);
#if X_WIDE
            else if (quads) plain_quads_into(type, w, nr, b, &rb, i);
#endif
            else plain_block_into(type, w, nr, b, &rb, i);
#if X_WIDE
            /* X rows [0, wide) against the block as it is decoded, so that the decoding's loads and the
             * products overlap */
            if (pairs && wide && !W16) wide_block(type, &rb, nb, i, b, x, wide, acc.lanes512, 1, 1);
            else if (pairs && wide) wide_block(type, &rb, nb, i, b, x, wide, acc.lanes512, 1, 0);
            else if (wide) wide_block(type, &rb, nb, i, b, x, wide, acc.lanes512, 0, 0);
#endif
        }
        /* the rest: its sums from acc.lanes[wide / 8], past the passes' */
        if (pairs && wide < nt) rows_against_lanes(type, &rb, nb, c0, c1, x + wide, nt - wide, acc.lanes + wide / 8, 1);
        else if (lanes && wide < nt)
            rows_against_lanes(type, &rb, nb, c0, c1, x + wide, nt - wide, acc.lanes + wide / 8, 0);
        else if (!lanes) rows_against_x(type, &rb, c0, c1, x, nt, acc.rows, W16);
    }
#if X_WIDE
    for (int t0 = 0; t0 < wide; t0 += 16)
        UNROLL for (int r = 0; r < nr; r++) {   /* lanes_final on 16 lanes */
            const __m512 *a = acc.lanes512[t0 / 16][r];
            _Alignas(64) float o[16];
            _mm512_store_ps(o, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                                             _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7]))));
            for (int k = 0; k < 16 && t0 + k < nt; k++) out[PACKED ? 8 * (t0 + k) + r : r * nt + t0 + k] = o[k];
        }
#endif
    for (int t0 = wide; t0 < nt; t0 += 8) {
        UNROLL for (int i = 0; i < 8; i++) {   /* i: an X row (rows), or a weight row (lanes) */
            _Alignas(32) float o[8];
            lanes_final(lanes ? acc.lanes[t0 / 8][i] : acc.rows[t0 + i], o);
            for (int k = 0; k < 8; k++) {
                const int t = lanes ? t0 + k : t0 + i, r = lanes ? i : k;
                if (t < nt && r < nr) out[PACKED ? 8 * t + r : r * nt + t] = o[k];
            }
        }
    }
}

/* group_rows on plain rows, 16-bit X rows and (VNNI, in lanes) 8-bit ones */
#define ROWS(T_, W_)                                                                                       \
    static void rows##W_##_##T_(const uint8_t *const *w, int nr, int64_t nb, const llm_act_row *x, int nt,    \
                                float *out) {                                                              \
        group_rows(T_, 0, NULL, w, nr, nb, x, nt, out, W_ == 16);                                          \
    }
#if X_WIDE
#define ROWS_W(T_) ROWS(T_, 16) ROWS(T_, 8)
#else
#define ROWS_W(T_) ROWS(T_, 16)
#endif
ROWS_W(LLM_TYPE_Q4_0) ROWS_W(LLM_TYPE_Q4_1) ROWS_W(LLM_TYPE_Q5_0) ROWS_W(LLM_TYPE_Q8_0)
ROWS_W(LLM_TYPE_Q4_K) ROWS_W(LLM_TYPE_Q5_K) ROWS_W(LLM_TYPE_Q6_K)
#undef ROWS_W
#undef ROWS

/* nt > 4 X rows against nr <= 8 rows: tiles of 4 X rows (up to
 * LLM_ACT_FEW_ROWS, or 8-bit activations not in lanes), else through the
 * decoded-rows buffer */
static int many_rows(int type, const uint8_t *const *w, int nr, const llm_act_row *x, int nt, int64_t nb,
                     float *out) {
    if (nr > 8 || nt > NT_MAX) return llm_act_dot_scalar(type, w, nr, x, nt, nb, out);
    const int w16 = x[0].bits == LLM_ACT_Q16;
    if (nt <= LLM_ACT_FEW_ROWS || (!w16 && !(X_WIDE && x[0].lanes))) {
        float part[8 * 4];
        for (int t0 = 0; t0 < nt; t0 += 4) {
            int n = nt - t0 < 4 ? nt - t0 : 4;
            QK_CAT(llm_act_dot_, QK_TABLE)(type, w, nr, x + t0, n, nb, part);
            for (int r = 0; r < nr; r++)
                for (int t = 0; t < n; t++) out[r * nt + t0 + t] = part[r * n + t];
        }
        return 0;
    }
    void (*fn)(const uint8_t *const *, int, int64_t, const llm_act_row *, int, float *) = NULL;
#if X_WIDE
#define PICK(T_) (w16 ? rows16_##T_ : rows8_##T_)
#else
#define PICK(T_) rows16_##T_
#endif
    switch (type) {
    case LLM_TYPE_Q4_0: fn = PICK(LLM_TYPE_Q4_0); break;
    case LLM_TYPE_Q4_1: fn = PICK(LLM_TYPE_Q4_1); break;
    case LLM_TYPE_Q5_0: fn = PICK(LLM_TYPE_Q5_0); break;
    case LLM_TYPE_Q8_0: fn = PICK(LLM_TYPE_Q8_0); break;
    case LLM_TYPE_Q4_K: fn = PICK(LLM_TYPE_Q4_K); break;
    case LLM_TYPE_Q5_K: fn = PICK(LLM_TYPE_Q5_K); break;
    case LLM_TYPE_Q6_K: fn = PICK(LLM_TYPE_Q6_K); break;
    default: return llm_act_dot_scalar(type, w, nr, x, nt, nb, out);
    }
#undef PICK
    fn(w, nr, nb, x, nt, out);
    return 0;
}

/* Lane-packed groups (Q4_0, Q4_1, Q4_K, Q5_K) with 16-bit quants take any number of
 * rows LANE_ROWS at a time (packed_rows), on the AVX2 and VNNI kernels: the
 * nibbles masked once for those rows beat decoding the group into the
 * buffer once for all, by 20-40% per row at 16-64 rows on a Sapphire Rapids
 * (docs/PERFORMANCE.md); the AVX-512 kernels without VNNI still run past
 * LLM_ACT_FEW_ROWS rows whole groups of 8 in lanes, as the other types do.
 * With 8-bit quants and no 512-bit tiles (AVX2), Q5_K's groups past
 * LLM_ACT_FEW_ROWS rows are decoded into the buffer once, their fifth bits
 * costing more than that a row; the other lane types' rows go one at a time
 * there, which is faster for them (docs/PERFORMANCE.md). The rest (or all of
 * a few) by packed_rows. */
#if defined(QK_VNNI) || LANE_ROWS == 2
#define LANE_TILES 1
#else
#define LANE_TILES 0
#endif
/* With AVX-512 VNNI (X_WIDE), each 32 rows in lanes go first to group_rows'
 * 512-bit tiles, faster there than the tiles above (figures in
 * docs/PERFORMANCE.md); 8-bit rows in lanes (more than LLM_ACT_FEW_ROWS)
 * all go there, the last 16 padded */
#define PACKED(T_, W_)                                                                                 \
    static void packed_##T_##_##W_(const uint8_t *grp, int64_t nb, const llm_act_row *x, int nt, float *out) { \
        int t = 0;                                                                                     \
        if (X_WIDE && x[0].lanes && (W_ ? nt >= 32 : nt > LLM_ACT_FEW_ROWS)) {                         \
            t = W_ ? nt / 32 * 32 : nt;                                                                \
            group_rows(T_, 1, grp, NULL, 8, nb, x, t, out, W_);                                        \
        }                                                                                              \
        if (nt - t > LLM_ACT_FEW_ROWS && (W_ || T_ != LLM_TYPE_Q6_K) &&                               \
            (!llm_packed_lanes(T_) || (W_ ? !LANE_TILES : !X_WIDE && T_ == LLM_TYPE_Q5_K))) {         \
            const int n = (nt - t) / 8 * 8;                                                            \
            group_rows(T_, 1, grp, NULL, 8, nb, x + t, n, out + 8 * t, W_);                            \
            t += n;                                                                                    \
        }                                                                                              \
        while (t < nt) t += packed_rows(T_, grp, nb, x + t, nt - t, out + 8 * t, W_);                  \
    }
#define PACKED_W(T_) PACKED(T_, 0) PACKED(T_, 1)
PACKED_W(LLM_TYPE_Q4_0) PACKED_W(LLM_TYPE_Q4_1) PACKED_W(LLM_TYPE_Q5_0) PACKED_W(LLM_TYPE_Q8_0)
PACKED_W(LLM_TYPE_Q4_K) PACKED_W(LLM_TYPE_Q5_K) PACKED_W(LLM_TYPE_Q6_K)
#undef PACKED_W
#undef PACKED
#undef LANE_TILES

int QK_CAT(llm_act_dot_packed_, QK_TABLE)(int type, const uint8_t *group, int64_t nb, const llm_act_row *x, int nt,
                                          float *out) {
    if (nt < 1 || nt > NT_MAX) return llm_act_dot_packed_scalar(type, group, nb, x, nt, out);
    int w16 = x->bits == LLM_ACT_Q16;
    switch (type) {
    case LLM_TYPE_Q4_0: (w16 ? packed_LLM_TYPE_Q4_0_1 : packed_LLM_TYPE_Q4_0_0)(group, nb, x, nt, out); return 0;
    case LLM_TYPE_Q4_1: (w16 ? packed_LLM_TYPE_Q4_1_1 : packed_LLM_TYPE_Q4_1_0)(group, nb, x, nt, out); return 0;
    case LLM_TYPE_Q5_0: (w16 ? packed_LLM_TYPE_Q5_0_1 : packed_LLM_TYPE_Q5_0_0)(group, nb, x, nt, out); return 0;
    case LLM_TYPE_Q8_0: (w16 ? packed_LLM_TYPE_Q8_0_1 : packed_LLM_TYPE_Q8_0_0)(group, nb, x, nt, out); return 0;
    case LLM_TYPE_Q4_K: (w16 ? packed_LLM_TYPE_Q4_K_1 : packed_LLM_TYPE_Q4_K_0)(group, nb, x, nt, out); return 0;
    case LLM_TYPE_Q5_K: (w16 ? packed_LLM_TYPE_Q5_K_1 : packed_LLM_TYPE_Q5_K_0)(group, nb, x, nt, out); return 0;
    case LLM_TYPE_Q6_K: (w16 ? packed_LLM_TYPE_Q6_K_1 : packed_LLM_TYPE_Q6_K_0)(group, nb, x, nt, out); return 0;
    default: return llm_act_dot_packed_scalar(type, group, nb, x, nt, out);
    }
}

#define ROW1(T_, W_)                                                                                   \
    static void row1_##T_##_##W_(const uint8_t *grp, int64_t gbytes, int ng, int64_t nb, const llm_act_row *x, \
                                 float *out) {                                                         \
        packed_groups_row1(T_, grp, gbytes, ng, nb, x, out, W_);                                       \
    }
#define ROW1_W(T_) ROW1(T_, 0) ROW1(T_, 1)
ROW1_W(LLM_TYPE_Q4_0) ROW1_W(LLM_TYPE_Q4_1) ROW1_W(LLM_TYPE_Q5_0) ROW1_W(LLM_TYPE_Q8_0) ROW1_W(LLM_TYPE_Q4_K)
ROW1_W(LLM_TYPE_Q5_K) ROW1_W(LLM_TYPE_Q6_K)
#undef ROW1_W
#undef ROW1

int QK_CAT(llm_act_row_packed_, QK_TABLE)(int type, const uint8_t *groups, int64_t gbytes, int ng, int64_t nb,
                                          const llm_act_row *x, float *out) {
    if (ng < 1 || ng > LLM_ROW1_GROUPS) return -1;
    int w16 = x->bits == LLM_ACT_Q16;
    switch (type) {
    case LLM_TYPE_Q4_0: (w16 ? row1_LLM_TYPE_Q4_0_1 : row1_LLM_TYPE_Q4_0_0)(groups, gbytes, ng, nb, x, out); return 0;
    case LLM_TYPE_Q4_1: (w16 ? row1_LLM_TYPE_Q4_1_1 : row1_LLM_TYPE_Q4_1_0)(groups, gbytes, ng, nb, x, out); return 0;
    case LLM_TYPE_Q5_0: (w16 ? row1_LLM_TYPE_Q5_0_1 : row1_LLM_TYPE_Q5_0_0)(groups, gbytes, ng, nb, x, out); return 0;
    case LLM_TYPE_Q8_0: (w16 ? row1_LLM_TYPE_Q8_0_1 : row1_LLM_TYPE_Q8_0_0)(groups, gbytes, ng, nb, x, out); return 0;
    case LLM_TYPE_Q4_K: (w16 ? row1_LLM_TYPE_Q4_K_1 : row1_LLM_TYPE_Q4_K_0)(groups, gbytes, ng, nb, x, out); return 0;
    case LLM_TYPE_Q5_K: (w16 ? row1_LLM_TYPE_Q5_K_1 : row1_LLM_TYPE_Q5_K_0)(groups, gbytes, ng, nb, x, out); return 0;
    case LLM_TYPE_Q6_K: (w16 ? row1_LLM_TYPE_Q6_K_1 : row1_LLM_TYPE_Q6_K_0)(groups, gbytes, ng, nb, x, out); return 0;
    default: return -1;
    }
}

/* ---- Q5_1, Q2_K and Q3_K ----
 * Each block of 32 decoded once per chunk of 8 into int16 weights (Q3_K:
 * times the sub-block scale - 32, Q2_K: times the 4-bit scale, with its
 * 4-bit mins beside them), then every X row's exact block sums by
 * vpmaddwd (8-bit quants widened), 8 blocks' sums in the lanes of one
 * vector, and the reference's float part on them (quant_act.c). */

/* Block b of a row: weights w[0] (elements 0..15), w[1] (16..31); Q2_K's
 * mins likewise in mn */
static inline __attribute__((always_inline)) void
more_block(const int type, const uint8_t *row, int64_t b, __m256i w[2], __m256i mn[2]) {
    if (type == LLM_TYPE_Q5_1) {
        const uint8_t *p = row + b * sizeof(llm_block_q5_1);
        __m128i lo, hi;
        q5_0_bits(p + offsetof(llm_block_q5_1, qh), p + offsetof(llm_block_q5_1, qs), &lo, &hi);
        w[0] = _mm256_cvtepu8_epi16(lo);
        w[1] = _mm256_cvtepu8_epi16(hi);
        return;
    }
    const int i = (int)(b % 8), h = i / 4, j = i % 4;
    const int k2 = type == LLM_TYPE_Q2_K;
    const uint8_t *p = row + (b / 8) * (k2 ? sizeof(llm_block_q2_k) : sizeof(llm_block_q3_k));
    const uint8_t *qs = p + (k2 ? offsetof(llm_block_q2_k, qs) : offsetof(llm_block_q3_k, qs)) + 32 * h;
    /* bits 2j, 2j+1 of each byte (a 16-bit shift; the mask drops the strays) */
    __m256i q = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)qs), 2 * j),
                                 _mm256_set1_epi8(3));
    int s0, s1;
    if (k2) {
        const uint8_t *sc = p + offsetof(llm_block_q2_k, scales) + 2 * i;
        s0 = sc[0] & 15, s1 = sc[1] & 15;
        mn[0] = _mm256_set1_epi16((short)(sc[0] >> 4));
        mn[1] = _mm256_set1_epi16((short)(sc[1] >> 4));
    } else {   /* less 4 where the hmask bit 4h + j is clear */
        const __m256i hm = _mm256_loadu_si256((const __m256i *)(p + offsetof(llm_block_q3_k, hmask)));
        const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + j)));
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
        q = _mm256_sub_epi8(q, _mm256_andnot_si256(set, _mm256_set1_epi8(4)));
        const uint8_t *sc = p + offsetof(llm_block_q3_k, scales);
        int sv[2];
        for (int k = 0; k < 2; k++) {
            const int s = 2 * i + k;
            const int lo = s < 8 ? sc[s] & 15 : sc[s - 8] >> 4, hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
            sv[k] = (lo | hi << 4) - 32;
        }
        s0 = sv[0], s1 = sv[1];
    }
    w[0] = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)), _mm256_set1_epi16((short)s0));
    w[1] = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)), _mm256_set1_epi16((short)s1));
}

/* The weight scales of blocks b0 .. b0+nv-1 in lanes (0 above), as the
 * reference's weight_block gives them */
static inline void more_scales(const int type, const uint8_t *row, int64_t b0, int nv, __m256 *wa, __m256 *wb) {
    if (type == LLM_TYPE_Q5_1) {
        _Alignas(32) float a[8] = {0}, o[8] = {0};
        for (int i = 0; i < nv; i++) {
            const uint8_t *p = row + (b0 + i) * sizeof(llm_block_q5_1);
            a[i] = half_at(p + offsetof(llm_block_q5_1, d));
            o[i] = half_at(p + offsetof(llm_block_q5_1, m));
        }
        *wa = _mm256_load_ps(a), *wb = _mm256_load_ps(o);
        return;
    }
    if (type == LLM_TYPE_Q2_K) {
        const uint8_t *p = row + (b0 / 8) * sizeof(llm_block_q2_k);
        *wa = _mm256_set1_ps(half_at(p + offsetof(llm_block_q2_k, d)));
        *wb = _mm256_set1_ps(-half_at(p + offsetof(llm_block_q2_k, dmin)));
        return;
    }
    *wa = _mm256_set1_ps(half_at(row + (b0 / 8) * sizeof(llm_block_q3_k) + offsetof(llm_block_q3_k, d)));
    *wb = _mm256_setzero_ps();
}

/* Activation block b of x as int16: elements 0..15 in x2[0], 16..31 in x2[1] */
static inline __attribute__((always_inline)) void more_x(const llm_act_row *x, int64_t b, __m256i x2[2]) {
    if (x->bits == LLM_ACT_Q16) {
        const int16_t *q = (const int16_t *)x->q + 32 * b;
        x2[0] = _mm256_loadu_si256((const __m256i *)q);
        x2[1] = _mm256_loadu_si256((const __m256i *)(q + 16));
    } else {
        const int8_t *q = (const int8_t *)x->q + 32 * b;
        x2[0] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)q));
        x2[1] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 16)));
    }
}

enum { MORE_NT = 64 };   /* X rows per call: llm_matmul_act's blocks (JB) */

static inline __attribute__((always_inline)) int act_dot_more(const int type, const uint8_t *const *w, int nr,
                                                               const llm_act_row *x, int nt, int64_t nb, float *out) {
    if (nt > MORE_NT) return llm_act_dot_scalar(type, w, nr, x, nt, nb, out);
    const int k2 = type == LLM_TYPE_Q2_K;
    for (int r = 0; r < nr; r++) {
        __m256 acc[MORE_NT];
        for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
        for (int64_t b0 = 0; b0 < nb; b0 += 8) {
            const int nv = nb - b0 < 8 ? (int)(nb - b0) : 8;
            __m256i wv[8][2], mv[8][2];
            for (int i = 0; i < nv; i++) more_block(type, w[r], b0 + i, wv[i], mv[i]);
            __m256 wa, wb;
            more_scales(type, w[r], b0, nv, &wa, &wb);
            const __m256i valid = lanes_below(nv);
            for (int t = 0; t < nt; t++) {
                __m256i S[8], T[8];
                for (int i = 0; i < 8; i++) {
                    S[i] = T[i] = _mm256_setzero_si256();
                    if (i >= nv) continue;
                    __m256i x2[2];
                    more_x(&x[t], b0 + i, x2);
                    S[i] = dp_pairs(_mm256_madd_epi16(wv[i][0], x2[0]), wv[i][1], x2[1]);
                    if (k2) T[i] = dp_pairs(_mm256_madd_epi16(mv[i][0], x2[0]), mv[i][1], x2[1]);
                }
                const __m256 dxv = _mm256_maskload_ps(x[t].d + b0, valid);
                const __m256i Bv = k2 ? hsum8_epi32(T) : _mm256_maskload_epi32((const int *)(x[t].s + b0), valid);
                __m256 t1 = _mm256_mul_ps(_mm256_cvtepi32_ps(hsum8_epi32(S)), wa);
                __m256 t2 = _mm256_mul_ps(_mm256_cvtepi32_ps(Bv), wb);
                __m256 sum = _mm256_add_ps(acc[t], _mm256_mul_ps(dxv, _mm256_add_ps(t1, t2)));
                /* a lane past the row keeps its sum as the reference leaves it (even -0) */
                acc[t] = _mm256_blendv_ps(acc[t], sum, _mm256_castsi256_ps(valid));
            }
        }
        for (int t = 0; t < nt; t++) out[r * nt + t] = lanes_sum(acc[t]);
    }
    return 0;
}

/* one out-of-line copy per type */
static __attribute__((noinline)) int act_dot_q5_1(const uint8_t *const *w, int nr, const llm_act_row *x, int nt,
                                                  int64_t nb, float *out) {
    return act_dot_more(LLM_TYPE_Q5_1, w, nr, x, nt, nb, out);
}
static __attribute__((noinline)) int act_dot_q2_k(const uint8_t *const *w, int nr, const llm_act_row *x, int nt,
                                                  int64_t nb, float *out) {
    return act_dot_more(LLM_TYPE_Q2_K, w, nr, x, nt, nb, out);
}
static __attribute__((noinline)) int act_dot_q3_k(const uint8_t *const *w, int nr, const llm_act_row *x, int nt,
                                                  int64_t nb, float *out) {
    return act_dot_more(LLM_TYPE_Q3_K, w, nr, x, nt, nb, out);
}

static int more_types(int type, const uint8_t *const *w, int nr, const llm_act_row *x, int nt, int64_t nb,
                      float *out) {
    switch (type) {
    case LLM_TYPE_Q5_1: return act_dot_q5_1(w, nr, x, nt, nb, out);
    case LLM_TYPE_Q2_K: return act_dot_q2_k(w, nr, x, nt, nb, out);
    case LLM_TYPE_Q3_K: return act_dot_q3_k(w, nr, x, nt, nb, out);
    default: return -1;
    }
}

/* ---- quantizing activation rows: quantize_block (quant_act.c), 32 floats
 * in 4 vectors: the same max (vmaxps with the running max second skips a
 * NaN, as the scalar comparison does), the same scalar d and 1/d, the same
 * product rounded to nearest even, clamp, and a NaN quant made 0. */
void QK_CAT(llm_act_quantize_, QK_TABLE)(const float *x, int64_t nblocks, int top, int bits, void *q, float *d,
                                         int32_t *s, int32_t *h) {
    const float ft = (float)top;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), fmax = _mm256_set1_ps(3.402823466e38f);
    for (int64_t i = 0; i < nblocks; i++) {
        const float *xb = x + 32 * i;
        __m256 v[4], amax = _mm256_setzero_ps();
        int finite = 1;
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(xb + 8 * k);
            __m256 a = _mm256_and_ps(v[k], absmask);
            amax = _mm256_max_ps(a, amax);
            finite &= _mm256_movemask_ps(_mm256_cmp_ps(a, fmax, _CMP_LE_OQ)) == 0xff;
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float am = _mm_cvtss_f32(m4), dd = finite ? am / ft : NAN, id = dd > 0.0f ? 1.0f / dd : 0.0f;
        const __m256 idv = _mm256_set1_ps(id), hi = _mm256_set1_ps(ft), lo = _mm256_set1_ps(-ft);
        __m256i iv[4], sum[2];
        for (int k = 0; k < 4; k++) {
            __m256 r = _mm256_round_ps(_mm256_mul_ps(v[k], idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m256 c = _mm256_and_ps(_mm256_min_ps(_mm256_max_ps(r, lo), hi), _mm256_cmp_ps(r, r, _CMP_ORD_Q));
            iv[k] = _mm256_cvttps_epi32(c);
        }
        UNROLL for (int e = 0; e < 2; e++) sum[e] = _mm256_add_epi32(iv[2 * e], iv[2 * e + 1]);
        /* the packs work per 128-bit half: the permute puts the elements back in order */
        __m256i w01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(iv[0], iv[1]), 0xD8);
        __m256i w23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(iv[2], iv[3]), 0xD8);
        if (bits == LLM_ACT_Q8) {
            __m256i b = _mm256_permute4x64_epi64(_mm256_packs_epi16(w01, w23), 0xD8);
            _mm256_storeu_si256((__m256i *)((int8_t *)q + 32 * i), b);
        } else {
            _mm256_storeu_si256((__m256i *)((int16_t *)q + 32 * i), w01);
            _mm256_storeu_si256((__m256i *)((int16_t *)q + 32 * i + 16), w23);
        }
        /* dwords 0, 1 of the halves' sums (elements 0..15, 16..31) */
        const __m256i s2 = _mm256_hadd_epi32(sum[0], sum[1]);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s2), _mm256_extracti128_si256(s2, 1));
        s4 = _mm_hadd_epi32(s4, s4);
        d[i] = dd;
        h[i] = _mm_cvtsi128_si32(s4);
        s[i] = h[i] + _mm_extract_epi32(s4, 1);
    }
}

#else

void QK_CAT(llm_act_quantize_, QK_TABLE)(const float *x, int64_t nblocks, int top, int bits, void *q, float *d,
                                         int32_t *s, int32_t *h) {
    llm_act_quantize_scalar(x, nblocks, top, bits, q, d, s, h);
}

int QK_CAT(llm_act_dot_packed_, QK_TABLE)(int type, const uint8_t *group, int64_t nb, const llm_act_row *x, int nt,
                                          float *out) {
    return llm_act_dot_packed_scalar(type, group, nb, x, nt, out);
}

int QK_CAT(llm_act_dot_, QK_TABLE)(int type, const uint8_t *const *w, int nr, const llm_act_row *x, int nt,
                                   int64_t nb, float *out) {
    return llm_act_dot_scalar(type, w, nr, x, nt, nb, out);
}

int QK_CAT(llm_act_row_packed_, QK_TABLE)(int type, const uint8_t *groups, int64_t gbytes, int ng, int64_t nb,
                                          const llm_act_row *x, float *out) {
    return -1;
}

#endif
