/* tests/gguf_writer.c - the GGUF writer for tests and its reference
 * quantizers. Written from the format definitions, sharing no code with the
 * engine, so a file it writes is an independent check of the reader. */
#include "gguf_writer.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A growable byte buffer. */
typedef struct {
    uint8_t *p;     /* [cap] bytes, n used */
    size_t n;       /* bytes used */
    size_t cap;     /* bytes allocated */
} bytes;

/* One tensor waiting to be written. */
typedef struct {
    char *name;          /* NUL-terminated copy */
    int type;            /* ggml type number */
    int n_dims;          /* 1..8 */
    int64_t dims[8];     /* dims[0] contiguous */
    uint8_t *data;       /* [nbytes] copy of the data */
    size_t nbytes;       /* data size */
    int offset_set;      /* 1 if offset_override replaces the real offset */
    uint64_t offset_override;
} gw_tensor;

struct gw {
    bytes kv;            /* serialized metadata entries */
    uint64_t n_kv;       /* entries in kv */
    gw_tensor *t;        /* [n_t] tensors in the order added */
    size_t n_t, cap_t;   /* count and allocated */
    uint32_t alignment;  /* data alignment */
    uint32_t version;    /* header version */
    char err[200];       /* first error; empty = none */
};

__attribute__((format(printf, 2, 3)))
static void set_err(gw *w, const char *fmt, ...) {
    if (w->err[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err, sizeof w->err, fmt, ap);
    va_end(ap);
    if (!w->err[0]) strcpy(w->err, "error");
}

static void put(gw *w, bytes *b, const void *p, size_t n) {
    if (w->err[0]) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q) { set_err(w, "out of memory"); return; }
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
}

/* little-endian integers of any width */
static void put_le(gw *w, bytes *b, uint64_t v, int nbytes) {
    uint8_t t[8];
    for (int i = 0; i < nbytes; i++) t[i] = (uint8_t)(v >> (8 * i));
    put(w, b, t, (size_t)nbytes);
}

static void put_str(gw *w, bytes *b, const char *s, size_t len) {
    put_le(w, b, len, 8);
    put(w, b, s, len);
}

gw *gw_new(void) {
    gw *w = calloc(1, sizeof *w);
    if (w) { w->alignment = 32; w->version = 3; }
    return w;
}

void gw_free(gw *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_t; i++) { free(w->t[i].name); free(w->t[i].data); }
    free(w->t);
    free(w->kv.p);
    free(w);
}

const char *gw_error(const gw *w) { return w->err[0] ? w->err : NULL; }

void gw_set_version(gw *w, uint32_t version) { w->version = version; }

/* ------------------------------------------------------------ metadata */

static void kv_head(gw *w, const char *key, int type) {
    put_str(w, &w->kv, key, strlen(key));
    put_le(w, &w->kv, (uint64_t)type, 4);
    w->n_kv++;
}

void gw_set_alignment(gw *w, uint32_t a) {
    w->alignment = a;
    gw_add_u32(w, "general.alignment", a);
}

void gw_add_u8(gw *w, const char *k, uint8_t v)   { kv_head(w, k, GW_U8);  put_le(w, &w->kv, v, 1); }
void gw_add_i8(gw *w, const char *k, int8_t v)    { kv_head(w, k, GW_I8);  put_le(w, &w->kv, (uint8_t)v, 1); }
void gw_add_u16(gw *w, const char *k, uint16_t v) { kv_head(w, k, GW_U16); put_le(w, &w->kv, v, 2); }
void gw_add_i16(gw *w, const char *k, int16_t v)  { kv_head(w, k, GW_I16); put_le(w, &w->kv, (uint16_t)v, 2); }
void gw_add_u32(gw *w, const char *k, uint32_t v) { kv_head(w, k, GW_U32); put_le(w, &w->kv, v, 4); }
void gw_add_i32(gw *w, const char *k, int32_t v)  { kv_head(w, k, GW_I32); put_le(w, &w->kv, (uint32_t)v, 4); }
void gw_add_u64(gw *w, const char *k, uint64_t v) { kv_head(w, k, GW_U64); put_le(w, &w->kv, v, 8); }
void gw_add_i64(gw *w, const char *k, int64_t v)  { kv_head(w, k, GW_I64); put_le(w, &w->kv, (uint64_t)v, 8); }
void gw_add_bool(gw *w, const char *k, int v)     { kv_head(w, k, GW_BOOL); put_le(w, &w->kv, v != 0, 1); }

void gw_add_f32(gw *w, const char *k, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    kv_head(w, k, GW_F32V);
    put_le(w, &w->kv, u, 4);
}

void gw_add_f64(gw *w, const char *k, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    kv_head(w, k, GW_F64V);
    put_le(w, &w->kv, u, 8);
}

void gw_add_strn(gw *w, const char *k, const char *s, size_t len) {
    kv_head(w, k, GW_STR);
    put_str(w, &w->kv, s, len);
}

void gw_add_str(gw *w, const char *k, const char *s) { gw_add_strn(w, k, s, strlen(s)); }

static int elem_size(int t) {
    switch (t) {
    case GW_U8: case GW_I8: case GW_BOOL: return 1;
    case GW_U16: case GW_I16: return 2;
    case GW_U32: case GW_I32: case GW_F32V: return 4;
    case GW_U64: case GW_I64: case GW_F64V: return 8;
    default: return 0;
    }
}

void gw_add_arr(gw *w, const char *k, int elem_type, uint64_t n, const void *values) {
    int es = elem_size(elem_type);
    if (!es) { set_err(w, "gw_add_arr('%s'): element type %d is not fixed-size", k, elem_type); return; }
    kv_head(w, k, GW_ARR);
    put_le(w, &w->kv, (uint64_t)elem_type, 4);
    put_le(w, &w->kv, n, 8);
    const uint8_t *p = values;
    for (uint64_t i = 0; i < n; i++) {   /* host order to little-endian, element by element */
        uint64_t v = 0;
        switch (es) {
        case 1: v = p[i]; break;
        case 2: { uint16_t x; memcpy(&x, p + 2 * i, 2); v = x; break; }
        case 4: { uint32_t x; memcpy(&x, p + 4 * i, 4); v = x; break; }
        default: memcpy(&v, p + 8 * i, 8); break;
        }
        put_le(w, &w->kv, v, es);
    }
}

void gw_add_arr_str(gw *w, const char *k, const char *const *strs, uint64_t n) {
    kv_head(w, k, GW_ARR);
    put_le(w, &w->kv, GW_STR, 4);
    put_le(w, &w->kv, n, 8);
    for (uint64_t i = 0; i < n; i++) put_str(w, &w->kv, strs[i], strlen(strs[i]));
}

void gw_add_arr_f32(gw *w, const char *k, const float *v, uint64_t n) { gw_add_arr(w, k, GW_F32V, n, v); }
void gw_add_arr_i32(gw *w, const char *k, const int32_t *v, uint64_t n) { gw_add_arr(w, k, GW_I32, n, v); }
void gw_add_arr_u32(gw *w, const char *k, const uint32_t *v, uint64_t n) { gw_add_arr(w, k, GW_U32, n, v); }

/* ------------------------------------------------------------ conversions */

/* ------------------------------------------------------------ reference quantizers */

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static float half_round(float f) { return kv_f16_to_f32(kv_f32_to_f16(f)); }
static int clampi(long v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : (int)v; }

static void quant_q8_0(const float *x, uint8_t *b) {
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    float d = half_round(amax / 127);
    put16(b, kv_f32_to_f16(d));
    for (int i = 0; i < 32; i++) b[2 + i] = (uint8_t)(int8_t)clampi(d ? lrintf(x[i] / d) : 0, -128, 127);
}

static void quant_q4_0(const float *x, uint8_t *b) {
    /* d = (value of largest magnitude) / -8: that value lands exactly on q = 0 */
    float mx = 0;
    for (int i = 0; i < 32; i++) if (fabsf(x[i]) > fabsf(mx)) mx = x[i];
    float d = half_round(mx / -8);
    put16(b, kv_f32_to_f16(d));
    for (int j = 0; j < 16; j++) {
        int lo = clampi(d ? lrintf(x[j] / d) + 8 : 8, 0, 15);
        int hi = clampi(d ? lrintf(x[j + 16] / d) + 8 : 8, 0, 15);
        b[2 + j] = (uint8_t)(lo | hi << 4);
    }
}

/* Q5_0: as Q4_0 with 16 levels each side; the fifth bits go to qh (bit j for element j). */
static void quant_q5_0(const float *x, uint8_t *b) {
    float mx = 0;
    for (int i = 0; i < 32; i++) if (fabsf(x[i]) > fabsf(mx)) mx = x[i];
    float d = half_round(mx / -16);
    put16(b, kv_f32_to_f16(d));
    uint32_t qh = 0;
    for (int j = 0; j < 32; j++) {
        int q = clampi(d ? lrintf(x[j] / d) + 16 : 16, 0, 31);
        if (q & 16) qh |= 1u << j;
        if (j < 16) b[6 + j] = (uint8_t)(q & 15);
        else b[6 + j - 16] |= (uint8_t)((q & 15) << 4);
    }
    for (int k = 0; k < 4; k++) b[2 + k] = (uint8_t)(qh >> (8 * k));
}

/* Q5_1: d = (max - min) / 31, m = min, q = round((x - m) / d), fifth bits
 * and nibbles laid out as Q5_0's after the two halves. */
static void quant_q5_1(const float *x, uint8_t *b) {
    float mn = x[0], mx = x[0];
    for (int i = 1; i < 32; i++) { mn = fminf(mn, x[i]); mx = fmaxf(mx, x[i]); }
    float d = half_round((mx - mn) / 31), m = half_round(mn);
    put16(b, kv_f32_to_f16(d));
    put16(b + 2, kv_f32_to_f16(m));
    uint32_t qh = 0;
    for (int j = 0; j < 32; j++) {
        int q = clampi(d ? lrintf((x[j] - m) / d) : 0, 0, 31);
        if (q & 16) qh |= 1u << j;
        if (j < 16) b[8 + j] = (uint8_t)(q & 15);
        else b[8 + j - 16] |= (uint8_t)((q & 15) << 4);
    }
    for (int k = 0; k < 4; k++) b[4 + k] = (uint8_t)(qh >> (8 * k));
}

static void quant_q4_1(const float *x, uint8_t *b) {
    float mn = x[0], mx = x[0];
    for (int i = 1; i < 32; i++) { mn = fminf(mn, x[i]); mx = fmaxf(mx, x[i]); }
    float d = half_round((mx - mn) / 15), m = half_round(mn);
    put16(b, kv_f32_to_f16(d));
    put16(b + 2, kv_f32_to_f16(m));
    for (int j = 0; j < 16; j++) {
        int lo = clampi(d ? lrintf((x[j] - m) / d) : 0, 0, 15);
        int hi = clampi(d ? lrintf((x[j + 16] - m) / d) : 0, 0, 15);
        b[4 + j] = (uint8_t)(lo | hi << 4);
    }
}

/* Pack 8 six-bit scales and mins into the 12-byte K-quant layout. */
static void pack_scales(const int sc[8], const int mn[8], uint8_t s[12]) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
    }
}

/* Q4_K (levels 15) and Q5_K (levels 31): per sub-block of 32 a scale and a
 * min <= 0, both quantized to 6 bits against super-scales rounded up, so the
 * decoded range always covers the sub-block. */
static void quant_k45(const float *x, uint8_t *b, int levels) {
    float scale[8], neg_min[8], max_s = 0, max_m = 0;
    for (int s = 0; s < 8; s++) {
        float mn = 0, mx = 0;   /* min <= 0 <= max: the format stores -min >= 0 */
        for (int l = 0; l < 32; l++) { mn = fminf(mn, x[32 * s + l]); mx = fmaxf(mx, x[32 * s + l]); }
        scale[s] = (mx - mn) / (float)levels;
        neg_min[s] = -mn;
        max_s = fmaxf(max_s, scale[s]);
        max_m = fmaxf(max_m, neg_min[s]);
    }
    float d = half_round(max_s / 63), dmin = half_round(max_m / 63);
    int sc[8], mq[8];
    for (int s = 0; s < 8; s++) {
        sc[s] = d > 0 ? clampi((long)ceilf(scale[s] / d), 0, 63) : 0;
        mq[s] = dmin > 0 ? clampi((long)ceilf(neg_min[s] / dmin), 0, 63) : 0;
    }
    put16(b, kv_f32_to_f16(d));
    put16(b + 2, kv_f32_to_f16(dmin));
    pack_scales(sc, mq, b + 4);
    int five = levels == 31;
    uint8_t *qh = b + 16, *qs = b + (five ? 48 : 16);
    if (five) memset(qh, 0, 32);
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) {
            int q[2];
            for (int h = 0; h < 2; h++) {
                int s = 2 * g + h;
                float step = d * (float)sc[s], off = dmin * (float)mq[s];
                q[h] = step > 0 ? clampi(lrintf((x[64 * g + 32 * h + l] + off) / step), 0, levels) : 0;
                if (five && (q[h] & 16)) qh[l] |= (uint8_t)(1 << s);
            }
            qs[32 * g + l] = (uint8_t)((q[0] & 15) | (q[1] & 15) << 4);
        }
}

/* Q2_K: per sub-block of 16 a 4-bit scale and a 4-bit min against the
 * super-scales d, dmin; x ~ d sc q - dmin mn with q in 0..3. Byte 32h + l of
 * the quants holds elements 128h + 32j + l in its bits 2j, 2j+1. */
static void quant_q2_k(const float *x, uint8_t *b) {
    float scale[16], neg_min[16], max_s = 0, max_m = 0;
    for (int s = 0; s < 16; s++) {
        float mn = 0, mx = 0;   /* min <= 0 <= max: the format stores -min >= 0 */
        for (int l = 0; l < 16; l++) { mn = fminf(mn, x[16 * s + l]); mx = fmaxf(mx, x[16 * s + l]); }
        scale[s] = (mx - mn) / 3;
        neg_min[s] = -mn;
        max_s = fmaxf(max_s, scale[s]);
        max_m = fmaxf(max_m, neg_min[s]);
    }
    float d = half_round(max_s / 15), dmin = half_round(max_m / 15);
    memset(b, 0, 84);
    for (int s = 0; s < 16; s++) {
        int sc = d > 0 ? clampi((long)ceilf(scale[s] / d), 0, 15) : 0;
        int mq = dmin > 0 ? clampi((long)ceilf(neg_min[s] / dmin), 0, 15) : 0;
        b[s] = (uint8_t)(sc | mq << 4);
        for (int l = 0; l < 16; l++) {
            int e = 16 * s + l;
            float step = d * (float)sc;
            int q = step > 0 ? clampi(lrintf((x[e] + dmin * (float)mq) / step), 0, 3) : 0;
            b[16 + 32 * (e / 128) + e % 32] |= (uint8_t)(q << (2 * (e % 128 / 32)));
        }
    }
    put16(b + 80, kv_f32_to_f16(d));
    put16(b + 82, kv_f32_to_f16(dmin));
}

/* sub [16] = max |x| / levels over each sub-block of 16 of x [256]; returns
 * the largest. */
static float sub_scales(const float *x, float levels, float sub[16]) {
    float max_s = 0;
    for (int s = 0; s < 16; s++) {
        float a = 0;
        for (int l = 0; l < 16; l++) a = fmaxf(a, fabsf(x[16 * s + l]));
        sub[s] = a / levels;
        max_s = fmaxf(max_s, sub[s]);
    }
    return max_s;
}

/* Q3_K: per sub-block of 16 a 6-bit scale (stored + 32) against one
 * super-scale, x ~ d (sc - 32) q with q in -4..3 kept as q + 4: the low 2
 * bits placed as Q2_K's, the third in bit 4h + j of hmask[l]. */
static void quant_q3_k(const float *x, uint8_t *b) {
    float sub[16], d = half_round(sub_scales(x, 4, sub) / 31);
    memset(b, 0, 110);
    for (int s = 0; s < 16; s++) {
        int sc = d > 0 ? clampi(lrintf(sub[s] / d), 0, 31) : 0, st = sc + 32;
        if (s < 8) b[96 + s] |= (uint8_t)(st & 15);
        else b[96 + s - 8] |= (uint8_t)((st & 15) << 4);
        b[104 + s % 4] |= (uint8_t)((st >> 4) << (2 * (s / 4)));
        for (int l = 0; l < 16; l++) {
            int e = 16 * s + l, h = e / 128, j = e % 128 / 32, el = e % 32;
            float step = d * (float)sc;
            int q = (step > 0 ? clampi(lrintf(x[e] / step), -4, 3) : 0) + 4;
            b[32 + 32 * h + el] |= (uint8_t)((q & 3) << (2 * j));
            if (q & 4) b[el] |= (uint8_t)(1 << (4 * h + j));
        }
    }
    put16(b + 108, kv_f32_to_f16(d));
}

/* Q6_K: per sub-block of 16 a signed 8-bit scale against one super-scale. */
static void quant_q6_k(const float *x, uint8_t *b) {
    float sub[16], d = half_round(sub_scales(x, 31, sub) / 127);
    int8_t *scales = (int8_t *)(b + 192);
    for (int s = 0; s < 16; s++) scales[s] = (int8_t)(d > 0 ? clampi(lrintf(sub[s] / d), -128, 127) : 0);
    put16(b + 208, kv_f32_to_f16(d));
    uint8_t *ql = b, *qh = b + 128;
    memset(ql, 0, 128);
    memset(qh, 0, 64);
    for (int e = 0; e < 256; e++) {
        float step = d * scales[e / 16];
        int q = (step != 0 ? clampi(lrintf(x[e] / step), -32, 31) : 0) + 32;
        /* element e = 128h + 32s + l: see the order in engine/weights/quant.h's table */
        int h = e / 128, s = (e % 128) / 32, l = e % 32;
        int li = 64 * h + l + (s & 1) * 32;         /* s = 0, 2 low nibble; 1, 3 offset 32 */
        ql[li] |= (uint8_t)((q & 15) << ((s >= 2) * 4));
        qh[32 * h + l] |= (uint8_t)((q >> 4) << (2 * s));
    }
}

static int block_of(int type, int *elems, int *bsize) {
    switch (type) {
    case GW_F32:  *elems = 1;   *bsize = 4;   return 0;
    case GW_F16:  *elems = 1;   *bsize = 2;   return 0;
    case GW_BF16: *elems = 1;   *bsize = 2;   return 0;
    case GW_Q4_0: *elems = 32;  *bsize = 18;  return 0;
    case GW_Q4_1: *elems = 32;  *bsize = 20;  return 0;
    case GW_Q5_0: *elems = 32;  *bsize = 22;  return 0;
    case GW_Q5_1: *elems = 32;  *bsize = 24;  return 0;
    case GW_Q8_0: *elems = 32;  *bsize = 34;  return 0;
    case GW_Q2_K: *elems = 256; *bsize = 84;  return 0;
    case GW_Q3_K: *elems = 256; *bsize = 110; return 0;
    case GW_Q4_K: *elems = 256; *bsize = 144; return 0;
    case GW_Q5_K: *elems = 256; *bsize = 176; return 0;
    case GW_Q6_K: *elems = 256; *bsize = 210; return 0;
    default: return -1;
    }
}

size_t gw_tensor_bytes(int type, int n_dims, const int64_t *dims) {
    int elems, bsize;
    if (block_of(type, &elems, &bsize) || n_dims < 1 || dims[0] % elems) return 0;
    size_t n = (size_t)(dims[0] / elems) * (size_t)bsize;
    for (int d = 1; d < n_dims; d++) n *= (size_t)dims[d];
    return n;
}

int gw_quantize(int type, const float *src, void *dst, int64_t n) {
    int elems, bsize;
    if (block_of(type, &elems, &bsize) || n % elems) return -1;
    uint8_t *b = dst;
    for (int64_t i = 0; i < n / elems; i++, b += bsize, src += elems) {
        switch (type) {
        case GW_F32:  memcpy(b, src, 4); break;   /* little-endian host */
        case GW_F16:  put16(b, kv_f32_to_f16(*src)); break;
        case GW_BF16: put16(b, kv_f32_to_bf16(*src)); break;
        case GW_Q4_0: quant_q4_0(src, b); break;
        case GW_Q4_1: quant_q4_1(src, b); break;
        case GW_Q5_0: quant_q5_0(src, b); break;
        case GW_Q5_1: quant_q5_1(src, b); break;
        case GW_Q8_0: quant_q8_0(src, b); break;
        case GW_Q2_K: quant_q2_k(src, b); break;
        case GW_Q3_K: quant_q3_k(src, b); break;
        case GW_Q4_K: quant_k45(src, b, 15); break;
        case GW_Q5_K: quant_k45(src, b, 31); break;
        case GW_Q6_K: quant_q6_k(src, b); break;
        }
    }
    return 0;
}

/* ------------------------------------------------------------ tensors */

void gw_add_tensor(gw *w, const char *name, int type, int n_dims, const int64_t *dims,
                   const void *data, size_t nbytes) {
    if (w->err[0]) return;
    if (n_dims < 1 || n_dims > 8) { set_err(w, "tensor '%s': n_dims %d", name, n_dims); return; }
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? 2 * w->cap_t : 8;
        gw_tensor *t = realloc(w->t, cap * sizeof *t);
        if (!t) { set_err(w, "out of memory"); return; }
        w->t = t;
        w->cap_t = cap;
    }
    gw_tensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    t->name = malloc(strlen(name) + 1);
    t->data = malloc(nbytes ? nbytes : 1);
    if (!t->name || !t->data) { free(t->name); free(t->data); set_err(w, "out of memory"); return; }
    strcpy(t->name, name);
    if (nbytes) memcpy(t->data, data, nbytes);
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < n_dims; d++) t->dims[d] = dims[d];
    t->nbytes = nbytes;
    w->n_t++;
}

void gw_add_tensor_f32(gw *w, const char *name, int type, int n_dims, const int64_t *dims,
                       const float *values) {
    size_t nbytes = gw_tensor_bytes(type, n_dims, dims);
    if (!nbytes) { set_err(w, "tensor '%s': type %d cannot hold these dims", name, type); return; }
    int64_t n = 1;
    for (int d = 0; d < n_dims; d++) n *= dims[d];
    void *buf = malloc(nbytes);
    if (!buf) { set_err(w, "out of memory"); return; }
    gw_quantize(type, values, buf, n);
    gw_add_tensor(w, name, type, n_dims, dims, buf, nbytes);
    free(buf);
}

void gw_set_tensor_offset(gw *w, const char *name, uint64_t offset) {
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0) { w->t[i].offset_set = 1; w->t[i].offset_override = offset; return; }
    set_err(w, "gw_set_tensor_offset: no tensor '%s'", name);
}

/* ------------------------------------------------------------ output */

void *gw_to_memory(gw *w, size_t *size) {
    if (w->err[0]) return NULL;
    uint64_t a = w->alignment ? w->alignment : 1;
    bytes out = {0};
    put(w, &out, "GGUF", 4);
    put_le(w, &out, w->version, 4);
    put_le(w, &out, w->n_t, 8);
    put_le(w, &out, w->n_kv, 8);
    put(w, &out, w->kv.p, w->kv.n);
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const gw_tensor *t = &w->t[i];
        put_str(w, &out, t->name, strlen(t->name));
        put_le(w, &out, (uint64_t)t->n_dims, 4);
        for (int d = 0; d < t->n_dims; d++) put_le(w, &out, (uint64_t)t->dims[d], 8);
        put_le(w, &out, (uint64_t)t->type, 4);
        put_le(w, &out, t->offset_set ? t->offset_override : off, 8);
        off = (off + t->nbytes + a - 1) / a * a;
    }
    static const uint8_t zeros[64];
    while (w->n_t && out.n % a) put(w, &out, zeros, (size_t)((a - out.n % a) < 64 ? a - out.n % a : 64));
    for (size_t i = 0; i < w->n_t; i++) {
        put(w, &out, w->t[i].data, w->t[i].nbytes);
        /* pad between tensors only: the file ends right after the last one */
        while (i + 1 < w->n_t && out.n % a)
            put(w, &out, zeros, (size_t)((a - out.n % a) < 64 ? a - out.n % a : 64));
    }
    if (w->err[0]) { free(out.p); return NULL; }
    *size = out.n;
    return out.p ? out.p : malloc(1);
}

int gw_write_file(gw *w, const char *path) {
    size_t n;
    void *p = gw_to_memory(w, &n);
    if (!p) return -1;
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(p, 1, n, f) == n;
    if (f && fclose(f) != 0) ok = 0;
    free(p);
    if (!ok) { set_err(w, "cannot write '%s'", path); return -1; }
    return 0;
}
