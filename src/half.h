/* src/half.h - the one IEEE half and bfloat16 conversion of the project:
 * scalar, round to nearest even, NaN and infinities kept. Header-only (static
 * inline) so the library, the engine and the tests share it without the
 * engine linking against library internals; SIMD kernels use the hardware
 * conversion (F16C), which gives the same results. */
#ifndef KV_HALF_H
#define KV_HALF_H

#include <stdint.h>
#include <string.h>

static inline float kv_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);          /* inf, NaN */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);  /* normal: rebias 15 -> 127 */
    } else if (man == 0) {
        bits = sign;
    } else {                                              /* subnormal: normalize */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even; overflow to inf, NaN stays NaN. */
static inline uint16_t kv_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds past 65504 */
    if (ax < 0x38800000u) {                                  /* below 2^-14: subnormal */
        if (ax < 0x33000000u) return (uint16_t)sign;         /* below half the least subnormal */
        uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e;           /* value / 2^-24 = m * 2^(e - 126) */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ax + 0xfff + ((ax >> 13) & 1) - 0x38000000u; /* rebias, round to even */
    return (uint16_t)(sign | (r >> 13));
}

static inline float kv_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t kv_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

#endif
