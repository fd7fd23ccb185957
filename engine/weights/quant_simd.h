/* engine/weights/quant_simd.h - internal to the SIMD quant files (quant_avx2.c,
 * quant_act_avx2.c and their AVX-512 builds): the table naming they share and
 * the small AVX2 helpers both the f32 and the int8 kernels use. */
#ifndef LLM_QUANT_SIMD_H
#define LLM_QUANT_SIMD_H

#include "quant_kern.h"
#include "../../src/cpu.h"

#include <string.h>

/* quant_avx512.c defines these before including the AVX2 sources again */
#ifndef QK_TABLE
#define QK_TABLE avx2
#define QK_CPU_OK kv_cpu_avx2
#endif
/* Every SIMD table lays prefill's X rows out in lanes (llm_act_row.lanes),
 * an activation block of 8 rows as 16 vectors: in registers with AVX-512's
 * 32, read from L1 as memory operands with AVX2's 16 (docs/PERFORMANCE.md).
 * QK_X_WIDE: 1 where prefill's products take X rows in lanes in 512-bit
 * VNNI tiles, of 16-bit and of 8-bit quants (wide_block in quant_act_avx2.c) */
#if defined(__AVX512F__) && defined(QK_VNNI)
#define QK_X_WIDE 1
#else
#define QK_X_WIDE 0
#endif
#define QK_CAT2(a, b) a##b
#define QK_CAT(a, b) QK_CAT2(a, b)
#define QK_STR2(a) #a
#define QK_STR(a) QK_STR2(a)

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#define UNROLL _Pragma("GCC unroll 16")

static inline float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* The 32 quants q (0..31) of a Q5_0 block from its fifth bits qh[4] and
 * nibbles qs[16]: elements 0..15 in *lo, 16..31 in *hi. Byte i of each half
 * picks the fifth bit i of its 16 with a shuffle (byte i/8 of the bit field)
 * and a per-byte bit mask; with AVX-512 (BW, VL) the bit field itself is the
 * mask of a masked add of 16, half the operations. q5_0_unsigned: the same
 * from a whole block. */
static inline void q5_0_bits(const uint8_t *qh, const uint8_t *qs, __m128i *lo, __m128i *hi) {
    const __m128i m4 = _mm_set1_epi8(15), sixteen = _mm_set1_epi8(16);
    const __m128i q = _mm_loadu_si128((const __m128i *)qs);
    const __m128i l4 = _mm_and_si128(q, m4), h4 = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
    uint32_t h;
    memcpy(&h, qh, 4);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    *lo = _mm_mask_add_epi8(l4, (__mmask16)h, l4, sixteen);   /* + 16 is | 16 on 4-bit values */
    *hi = _mm_mask_add_epi8(h4, (__mmask16)(h >> 16), h4, sixteen);
#else
    const __m128i bit = _mm_set1_epi64x((long long)0x8040201008040201ull);
    __m128i hv = _mm_cvtsi32_si128((int)h);
    __m128i h0 = _mm_shuffle_epi8(hv, _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    __m128i h1 = _mm_shuffle_epi8(hv, _mm_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    h0 = _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(h0, bit), bit), sixteen);
    h1 = _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(h1, bit), bit), sixteen);
    *lo = _mm_or_si128(l4, h0);
    *hi = _mm_or_si128(h4, h1);
#endif
}
static inline void q5_0_unsigned(const uint8_t *p, __m128i *lo, __m128i *hi) {
    q5_0_bits(p + offsetof(llm_block_q5_0, qh), p + offsetof(llm_block_q5_0, qs), lo, hi);
}

#endif
#endif
