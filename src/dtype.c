/* src/dtype.c - the storage types of K and V (the table of src/kvtype.h):
 * each type's row conversions, its names and sizes, and the price of a token
 * in bytes; the status strings. */
#include <math.h>
#include <string.h>

#include "internal.h"

/* ------------------------------------------------------------------ rows */

static void store_f64(void *dst, float *scale, const float *src, int32_t n) {
    double *d = dst;
    for (int32_t i = 0; i < n; i++) d[i] = src[i];
}
static void load_f64(const void *src, const float *scale, float *dst, int32_t n) {
    const double *s = src;
    for (int32_t i = 0; i < n; i++) dst[i] = (float)s[i];
}

static void store_f32(void *dst, float *scale, const float *src, int32_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}
static void load_f32(const void *src, const float *scale, float *dst, int32_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void store_f16(void *dst, float *scale, const float *src, int32_t n) {
    uint16_t *d = dst;
    for (int32_t i = 0; i < n; i++) d[i] = kv_f32_to_f16(src[i]);
}
static void load_f16(const void *src, const float *scale, float *dst, int32_t n) {
    const uint16_t *s = src;
    for (int32_t i = 0; i < n; i++) dst[i] = kv_f16_to_f32(s[i]);
}

static void store_bf16(void *dst, float *scale, const float *src, int32_t n) {
    uint16_t *d = dst;
    for (int32_t i = 0; i < n; i++) d[i] = kv_f32_to_bf16(src[i]);
}
static void load_bf16(const void *src, const float *scale, float *dst, int32_t n) {
    const uint16_t *s = src;
    for (int32_t i = 0; i < n; i++) dst[i] = kv_bf16_to_f32(s[i]);
}

/* Symmetric: x ~ scale * q, q in [-127, 127], scale = max|x| / 127. */
static void store_q8(void *dst, float *scale, const float *src, int32_t n) {
    int8_t *d = dst;
    float amax = 0;
    for (int32_t i = 0; i < n; i++) {
        const float a = fabsf(src[i]);
        amax = a > amax || a != a ? a : amax; /* a NaN wins (fmaxf would drop it) */
    }
    if (!(amax <= 3.4e38f)) { /* a NaN or infinity: the row reads back as NaN (include/kvcache.h) */
        memset(d, 0, (size_t)n);
        *scale = NAN;
        return;
    }
    float s = amax / 127.0f, inv = s > 0 ? 1.0f / s : 0.0f;
    for (int32_t i = 0; i < n; i++) d[i] = (int8_t)lrintf(src[i] * inv);
    *scale = s;
}
static void load_q8(const void *src, const float *scale, float *dst, int32_t n) {
    const int8_t *s = src;
    const float sc = *scale;
    for (int32_t i = 0; i < n; i++) dst[i] = sc * (float)s[i];
}

/* ------------------------------------------------------------------ the table */

#define ROW(T, id, b, scale) [T] = {#id, b, scale, store_##id, load_##id},
static const kv_type_traits types[] = {KV_TYPES(ROW)};
#undef ROW

const kv_type_traits *kv_type(kv_dtype t) {
    return (unsigned)t < sizeof types / sizeof types[0] && types[t].name ? &types[t] : NULL;
}

size_t kv_type_row_bytes(const kv_type_traits *tt, int32_t n) { return ((size_t)n * (size_t)tt->bits + 7) / 8; }

int32_t kv_type_row_scales(const kv_type_traits *tt, int32_t n) {
    if (!tt->scale_block) return 0;
    return tt->scale_block == KV_ROW ? 1 : (n + tt->scale_block - 1) / tt->scale_block;
}

void kv_store_row(kv_dtype t, void *dst, float *scale, const float *src, int32_t n) {
    kv_type(t)->store_row(dst, scale, src, n);
}

void kv_load_row(kv_dtype t, const void *src, const float *scale, float *dst, int32_t n) {
    kv_type(t)->load_row(src, scale, dst, n);
}

/* ------------------------------------------------------------------ names */

size_t kv_dtype_size(kv_dtype t) {
    const kv_type_traits *tt = kv_type(t);
    return tt && tt->bits % 8 == 0 ? (size_t)tt->bits / 8 : 0;
}

int32_t kv_dtype_bits(kv_dtype t) {
    const kv_type_traits *tt = kv_type(t);
    return tt ? tt->bits : 0;
}

const char *kv_dtype_name(kv_dtype t) {
    const kv_type_traits *tt = kv_type(t);
    return tt ? tt->name : "invalid";
}

int kv_dtype_parse(const char *name, kv_dtype *out) {
    if (!name || !out) return KV_ERR_NULL;
    for (int t = 0; t < (int)(sizeof types / sizeof types[0]); t++) {
        if (types[t].name && strcmp(name, types[t].name) == 0) {
            *out = (kv_dtype)t;
            return KV_OK;
        }
    }
    if (strcmp(name, "int8") == 0 || strcmp(name, "q8_0") == 0) {
        *out = KV_Q8;
        return KV_OK;
    }
    return KV_ERR_DTYPE;
}

const char *kv_status_str(int status) {
    switch (status) {
    case KV_OK: return "ok";
    case KV_ERR_NULL: return "a required pointer is NULL";
    case KV_ERR_SHAPE: return "invalid or inconsistent shape";
    case KV_ERR_HEADS: return "n_heads is not a multiple of n_kv_heads";
    case KV_ERR_LENGTH: return "length out of range (T > S, or position outside the sequence)";
    case KV_ERR_CAPACITY: return "sequence would exceed the cache's max_seq_len";
    case KV_ERR_OUT_OF_PAGES: return "out of pages: the pool has too few free pages";
    case KV_ERR_WINDOW: return "invalid window, or the keys needed were evicted by the window";
    case KV_ERR_DTYPE: return "unsupported dtype, or precision does not match the cache";
    case KV_ERR_NOMEM: return "out of memory";
    case KV_ERR_SEQ: return "no such sequence, or no free sequence slot";
    case KV_ERR_ROPE: return "invalid RoPE parameters";
    case KV_ERR_IO: return "file could not be read or written";
    case KV_ERR_FORMAT: return "file is corrupt or made for another configuration";
    case KV_ERR_SHARED: return "write into a page shared with another sequence or the prefix cache";
    case KV_ERR_MISMATCH: return "file was saved from a cache of another configuration";
    case KV_ERR_UNSUPPORTED: return "not supported on this CPU or in this build";
    case KV_ERR_DUPLICATE: return "a sequence appears more than once in the batch";
    default: return "unknown status";
    }
}

/* ------------------------------------------------------------------ price */

/* a * b, saturating at UINT64_MAX */
static uint64_t sat_mul(uint64_t a, uint64_t b) { return b && a > UINT64_MAX / b ? UINT64_MAX : a * b; }

uint64_t kv_price_per_token(int32_t n_layers, int32_t n_kv_heads, int32_t head_dim, kv_dtype t) {
    const kv_type_traits *tt = kv_type(t);
    if (n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 || !tt) return 0;
    uint64_t heads = sat_mul(2ull * (uint64_t)n_layers, (uint64_t)n_kv_heads); /* K and V */
    uint64_t row = (uint64_t)kv_type_row_bytes(tt, head_dim) +
                   (uint64_t)kv_type_row_scales(tt, head_dim) * sizeof(float);
    return sat_mul(heads, row);
}

uint64_t kv_price_tokens(int32_t n_layers, int32_t n_kv_heads, int32_t head_dim, kv_dtype t,
                         uint64_t n_tokens) {
    return sat_mul(kv_price_per_token(n_layers, n_kv_heads, head_dim, t), n_tokens);
}
