/* src/dtype.c - storage types of K and V: names, sizes, conversion of rows,
 * int8 quantization, and the price of a token in bytes. */
#include <math.h>
#include <string.h>

#include "internal.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {
    [KV_F64] = {"f64", 8}, [KV_F32] = {"f32", 4}, [KV_F16] = {"f16", 2},
    [KV_BF16] = {"bf16", 2}, [KV_Q8] = {"q8", 1},
};

static bool dtype_valid(kv_dtype t) { return (unsigned)t <= KV_Q8; }

size_t kv_dtype_size(kv_dtype t) { return dtype_valid(t) ? dtypes[t].size : 0; }

const char *kv_dtype_name(kv_dtype t) { return dtype_valid(t) ? dtypes[t].name : "invalid"; }

int kv_dtype_parse(const char *name, kv_dtype *out) {
    if (!name || !out) return KV_ERR_NULL;
    for (int t = 0; t <= KV_Q8; t++) {
        if (strcmp(name, dtypes[t].name) == 0) {
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

/* a * b and a + b, saturating at UINT64_MAX */
static uint64_t sat_mul(uint64_t a, uint64_t b) { return b && a > UINT64_MAX / b ? UINT64_MAX : a * b; }
static uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

uint64_t kv_price_per_token(int32_t n_layers, int32_t n_kv_heads, int32_t head_dim, kv_dtype t) {
    if (n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 || !dtype_valid(t)) return 0;
    uint64_t heads = sat_mul(2ull * (uint64_t)n_layers, (uint64_t)n_kv_heads); /* K and V */
    uint64_t b = sat_mul(sat_mul(heads, (uint64_t)head_dim), dtypes[t].size);
    if (t == KV_Q8) b = sat_add(b, sat_mul(heads, sizeof(float))); /* one scale per token, layer, head */
    return b;
}

uint64_t kv_price_tokens(int32_t n_layers, int32_t n_kv_heads, int32_t head_dim, kv_dtype t,
                         uint64_t n_tokens) {
    return sat_mul(kv_price_per_token(n_layers, n_kv_heads, head_dim, t), n_tokens);
}

/* ------------------------------------------------------------------ rows */

void kv_store_row(kv_dtype t, void *dst, float *scale, const float *src, int32_t n) {
    switch (t) {
    case KV_F64: {
        double *d = dst;
        for (int32_t i = 0; i < n; i++) d[i] = src[i];
        break;
    }
    case KV_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case KV_F16: {
        uint16_t *d = dst;
        for (int32_t i = 0; i < n; i++) d[i] = kv_f32_to_f16(src[i]);
        break;
    }
    case KV_BF16: {
        uint16_t *d = dst;
        for (int32_t i = 0; i < n; i++) d[i] = kv_f32_to_bf16(src[i]);
        break;
    }
    case KV_Q8: {
        /* symmetric: x ~ scale * q, q in [-127, 127], scale = max|x| / 127 */
        int8_t *d = dst;
        float amax = 0;
        for (int32_t i = 0; i < n; i++) {
            const float a = fabsf(src[i]);
            amax = a > amax || a != a ? a : amax; /* a NaN wins (fmaxf would drop it) */
        }
        if (!(amax <= 3.4e38f)) { /* a NaN or infinity: the row reads back as NaN (include/kvcache.h) */
            memset(d, 0, (size_t)n);
            *scale = NAN;
            break;
        }
        float s = amax / 127.0f, inv = s > 0 ? 1.0f / s : 0.0f;
        for (int32_t i = 0; i < n; i++) d[i] = (int8_t)lrintf(src[i] * inv);
        *scale = s;
        break;
    }
    }
}

void kv_load_row(kv_dtype t, const void *src, float scale, float *dst, int32_t n) {
    switch (t) {
    case KV_F64: {
        const double *s = src;
        for (int32_t i = 0; i < n; i++) dst[i] = (float)s[i];
        break;
    }
    case KV_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case KV_F16: {
        const uint16_t *s = src;
        for (int32_t i = 0; i < n; i++) dst[i] = kv_f16_to_f32(s[i]);
        break;
    }
    case KV_BF16: {
        const uint16_t *s = src;
        for (int32_t i = 0; i < n; i++) dst[i] = kv_bf16_to_f32(s[i]);
        break;
    }
    case KV_Q8: {
        const int8_t *s = src;
        for (int32_t i = 0; i < n; i++) dst[i] = scale * (float)s[i];
        break;
    }
    }
}
