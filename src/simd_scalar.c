/* src/simd_scalar.c - the portable primitives (see simd.h), and the run-time
 * choice among the compiled variants. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

static void load_rows(kv_dtype t, const unsigned char *src, size_t stride, const float *scales,
                      int32_t n, int32_t d, float *dst) {
    for (int32_t j = 0; j < n; j++)
        kv_load_row(t, src + (size_t)j * stride, scales ? scales + j : NULL, dst + (size_t)j * d, d);
}

static void dot_rows(const float *q, int32_t nv, const float *k, int32_t n, int32_t d, float *s,
                     int32_t lds) {
    for (int32_t i = 0; i < nv; i++)
        for (int32_t j = 0; j < n; j++) {
            const float *qi = q + (size_t)i * d, *kj = k + (size_t)j * d;
            float acc = 0;
            for (int32_t e = 0; e < d; e++) acc += qi[e] * kj[e];
            s[(size_t)i * lds + j] = acc;
        }
}

static float exp_sum(float *s, int32_t n, float mx) {
    float sum = 0;
    for (int32_t j = 0; j < n; j++) sum += s[j] = kv_weight_exp(s[j] - mx);
    return sum;
}

static void axpy_rows(const float *p, const float *v, int32_t n, int32_t d, float corr, float *acc) {
    for (int32_t e = 0; e < d; e++) acc[e] *= corr;
    for (int32_t j = 0; j < n; j++) {
        const float pj = p[j], *vj = v + (size_t)j * d;
        for (int32_t e = 0; e < d; e++) acc[e] += pj * vj[e];
    }
}

const kv_simd kv_simd_scalar = {.name = "scalar", .load_rows = load_rows, .dot_rows = dot_rows, .exp_sum = exp_sum,
                                .axpy_rows = axpy_rows};

/* ------------------------------------------------------------------ selection */

static const kv_simd *active;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static const kv_simd *by_name(const char *name) {
    if (!strcmp(name, "scalar")) return &kv_simd_scalar;
    if (!strcmp(name, "avx2")) return kv_simd_avx2();
    if (!strcmp(name, "avx512")) return kv_simd_avx512();
    return NULL;
}

static const kv_simd *best(void) {
    const kv_simd *s = kv_simd_avx512();
    if (!s) s = kv_simd_avx2();
    return s ? s : &kv_simd_scalar;
}

static void choose(void) {
    const char *env = getenv("KVCACHE_SIMD");
    const kv_simd *s = env && *env && strcmp(env, "auto") ? by_name(env) : NULL;
    active = s ? s : best();
}

const kv_simd *kv_simd_active(void) {
    pthread_once(&once, choose);
    return active;
}

const char *kv_simd_name(void) { return kv_simd_active()->name; }

int kv_simd_select(const char *name) {
    if (!name) return KV_ERR_NULL;
    pthread_once(&once, choose);
    const kv_simd *s = strcmp(name, "auto") ? by_name(name) : best();
    if (!s) return KV_ERR_UNSUPPORTED;
    active = s;
    return KV_OK;
}
