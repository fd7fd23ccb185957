/* src/simd_scalar.c - the portable primitives (see simd.h), and the run-time
 * choice among the compiled variants. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "cpu.h"
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

/* The kernels of isa (the avx512 ones for avx512vnni, which has no
 * attention kernels of its own), or NULL when not compiled in or the CPU
 * lacks it. */
static const kv_simd *for_isa(int isa) {
    switch (isa) {
    case KV_ISA_SCALAR: return &kv_simd_scalar;
    case KV_ISA_AVX2: return kv_simd_avx2();
    case KV_ISA_AVX512:
    case KV_ISA_AVX512VNNI: return kv_simd_avx512();
    default: return NULL;
    }
}

static const kv_simd *best(void) {
    const kv_simd *s = NULL;
    for (int isa = KV_ISA_COUNT - 1; !s; isa--) s = for_isa(isa);
    return s;
}

static void choose(void) {
    const kv_simd *s = for_isa(kv_isa_requested());
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
    const int isa = kv_isa_parse(name);
    const kv_simd *s = !strcmp(name, "auto") ? best() : isa == KV_ISA_AVX512VNNI ? NULL : for_isa(isa);
    if (!s) return KV_ERR_UNSUPPORTED;
    active = s;
    return KV_OK;
}
