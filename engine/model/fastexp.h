/* engine/model/fastexp.h - e^x in float without a call or a branch, so that loops
 * over many elements vectorize (glibc's expf is a call per element).
 *
 * x = n ln 2 + r with n rounded to nearest (by adding and taking away 1.5 x
 * 2^23) and |r| <= ln 2 / 2 (ln 2 in two parts, the first exact times any
 * n here), e^r by its Taylor polynomial to r^6, 2^n put in the exponent
 * field: within about 2e-7 of e^x over [-87.3, 88.3]. Below that, 0 (the
 * true value is under 1.2e-38); above, e^88.3, and +inf for +inf; NaN for
 * NaN. Internal to the engine. */
#ifndef LLM_FASTEXP_H
#define LLM_FASTEXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float llm_exp(float x) {
    const int nan = !(x == x), tiny = x < -87.3f, inf = x == INFINITY;
    const float c = nan || tiny ? 0.0f : x > 88.3f ? 88.3f : x; /* n stays in -126 .. 127 */
    const float n = (c * 1.44269504f + 12582912.0f) - 12582912.0f;
    const float r = (c - n * 0.693359375f) - n * -2.12194440e-4f;
    float p = 1.0f / 720;
    p = p * r + 1.0f / 120, p = p * r + 1.0f / 24, p = p * r + 1.0f / 6;
    p = p * r + 0.5f, p = p * r + 1.0f, p = p * r + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    const float e = p * scale;
    return nan ? x : tiny ? 0.0f : inf ? INFINITY : e;
}

#endif
