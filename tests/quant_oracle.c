/* tests/quant_oracle.c - the float64 oracle of the weight formats (see
 * quant_oracle.h). */
#include "quant_oracle.h"
#include "gguf_writer.h"
#include "../engine/weights/quant.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------ the oracle */

double ref_half(const uint8_t *p) {
    int h = p[0] | p[1] << 8, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);   /* tests never use inf/NaN */
    return (h & 0x8000) ? -v : v;
}

/* 6-bit scale (want_min = 0) or min (1) of sub-block j of a Q4_K/Q5_K block:
 * j < 4 lives in the low 6 bits of byte j (scale) or j+4 (min); j >= 4 takes its
 * low 4 bits from byte j+4 (scale: low nibble, min: high nibble) and its top 2
 * bits from the top of byte j-4 (scale) or j (min). */
static int ref_k_scale(const uint8_t *s, int j, int want_min) {
    if (j < 4) return s[j + 4 * want_min] & 63;
    int low = want_min ? s[j + 4] >> 4 : s[j + 4] & 15;
    int top = s[want_min ? j : j - 4] >> 6;
    return low | top << 4;
}

/* Element e of a row stored in `type`, in float64. */
double ref_value(int type, const uint8_t *row, int64_t e) {
    switch (type) {
    case GW_F32: { float f; memcpy(&f, row + 4 * e, 4); return f; }
    case GW_F16: return ref_half(row + 2 * e);
    case GW_BF16: { uint32_t u = (uint32_t)(row[2 * e] | row[2 * e + 1] << 8) << 16; float f; memcpy(&f, &u, 4); return f; }
    case GW_Q4_0: case GW_Q4_1: case GW_Q8_0: {
        int bsz = type == GW_Q4_0 ? 18 : type == GW_Q4_1 ? 20 : 34;
        const uint8_t *b = row + (e / 32) * bsz;
        int j = (int)(e % 32);
        double d = ref_half(b);
        if (type == GW_Q8_0) return d * (int8_t)b[2 + j];
        const uint8_t *qs = b + (type == GW_Q4_0 ? 2 : 4);
        int q = j < 16 ? qs[j] & 15 : qs[j - 16] >> 4;    /* element j+16 is the high nibble */
        return type == GW_Q4_0 ? d * (q - 8) : d * q + ref_half(b + 2);
    }
    case GW_Q5_0: case GW_Q5_1: {   /* d (Q5_1: then m), a u32 of fifth bits (bit j: element j), 16 bytes of nibbles */
        const int h = type == GW_Q5_1 ? 4 : 2;
        const uint8_t *b = row + (e / 32) * (h + 20);
        int j = (int)(e % 32);
        uint32_t qh = (uint32_t)b[h] | (uint32_t)b[h + 1] << 8 | (uint32_t)b[h + 2] << 16 | (uint32_t)b[h + 3] << 24;
        int q = (j < 16 ? b[h + 4 + j] & 15 : b[h + 4 + j - 16] >> 4) + 16 * (int)((qh >> j) & 1);
        return type == GW_Q5_1 ? ref_half(b) * q + ref_half(b + 2) : ref_half(b) * (q - 16);
    }
    case GW_Q4_K: case GW_Q5_K: {
        int five = type == GW_Q5_K;
        const uint8_t *b = row + (e / 256) * (five ? 176 : 144);
        int i = (int)(e % 256), g = i / 64, hi = (i % 64) / 32, l = i % 32, sub = 2 * g + hi;
        const uint8_t *qs = b + (five ? 48 : 16);
        int q = hi ? qs[32 * g + l] >> 4 : qs[32 * g + l] & 15;
        if (five) q += ((b[16 + l] >> sub) & 1) * 16;   /* qh bit `sub` of byte l */
        return ref_half(b) * ref_k_scale(b + 4, sub, 0) * q - ref_half(b + 2) * ref_k_scale(b + 4, sub, 1);
    }
    case GW_Q2_K: {   /* scales[16] (low nibble scale, high min), 64 bytes of 2-bit quants, d, dmin */
        const uint8_t *b = row + (e / 256) * 84;
        int i = (int)(e % 256), h = i / 128, j = (i % 128) / 32, l = i % 32, s = b[i / 16];
        int q = (b[16 + 32 * h + l] >> (2 * j)) & 3;   /* 4 elements 32 apart share a byte */
        return ref_half(b + 80) * (s & 15) * q - ref_half(b + 82) * (s >> 4);
    }
    case GW_Q3_K: {   /* hmask[32], 64 bytes of low 2 bits (as Q2_K), 12 bytes of 6-bit scales, d */
        const uint8_t *b = row + (e / 256) * 110, *sc = b + 96;
        int i = (int)(e % 256), h = i / 128, j = (i % 128) / 32, l = i % 32, s = i / 16;
        int lo = s < 8 ? sc[s] & 15 : sc[s - 8] >> 4, top = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
        int q = ((b[32 + 32 * h + l] >> (2 * j)) & 3) - 4 * !((b[l] >> (4 * h + j)) & 1);
        return ref_half(b + 108) * ((lo | top << 4) - 32) * q;
    }
    case GW_Q6_K: {
        const uint8_t *b = row + (e / 256) * 210;
        int i = (int)(e % 256), h = i / 128, s = (i % 128) / 32, l = i % 32;
        int byte = b[64 * h + l + 32 * (s & 1)];
        int q = (s >= 2 ? byte >> 4 : byte & 15) | ((b[128 + 32 * h + l] >> (2 * s)) & 3) << 4;
        return ref_half(b + 208) * (int8_t)b[192 + i / 16] * (q - 32);
    }
    }
    return NAN;
}

/* ------------------------------------------------------------ helpers */

const int all_types[] = {GW_F32, GW_F16, GW_BF16, GW_Q4_0, GW_Q4_1, GW_Q5_0, GW_Q5_1, GW_Q8_0,
                                GW_Q2_K, GW_Q3_K, GW_Q4_K, GW_Q5_K, GW_Q6_K};
const int n_all_types = (int)(sizeof all_types / sizeof all_types[0]);

void put_half(uint8_t *p, float v) { uint16_t h = kv_f32_to_f16(v); p[0] = (uint8_t)h; p[1] = (uint8_t)(h >> 8); }

/* n elements of random but valid data: random quant bits, scales in a sane
 * range (a random half could be inf or NaN, which no real file holds). */
void random_row(test_rng *r, int type, int64_t n, uint8_t *dst) {
    int64_t bytes = llm_row_bytes(type, n);
    for (int64_t i = 0; i < bytes; i++) dst[i] = (uint8_t)test_rng_u64(r);
    int64_t be = llm_type_block_elems(type), bb = llm_type_block_bytes(type);
    for (int64_t k = 0; k < n / be; k++) {
        uint8_t *b = dst + k * bb;
        float s = (float)(0.002 + 0.05 * fabs(test_rng_uniform(r)));
        switch (type) {
        case GW_F32: { float f = (float)test_rng_normal(r); memcpy(b, &f, 4); break; }
        case GW_F16: put_half(b, (float)test_rng_normal(r)); break;
        case GW_BF16: { uint16_t h = kv_f32_to_bf16((float)test_rng_normal(r)); memcpy(b, &h, 2); break; }
        case GW_Q4_0: case GW_Q5_0: case GW_Q8_0: put_half(b, s); break;
        case GW_Q4_1: case GW_Q5_1: put_half(b, s); put_half(b + 2, (float)test_rng_uniform(r)); break;
        case GW_Q4_K: case GW_Q5_K: put_half(b, s); put_half(b + 2, s * 0.5f); break;
        case GW_Q6_K: put_half(b + 208, s * 0.1f); break;
        case GW_Q2_K: put_half(b + 80, s); put_half(b + 82, s * 0.5f); break;
        case GW_Q3_K: put_half(b + 108, s * 0.1f); break;
        }
    }
}

