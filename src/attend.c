/* src/attend.c - attention over the cache (paged) and over plain arrays
 * (dense): argument checks, where each block of keys lies, and the kernel
 * instantiated for f64 (reference) and f32 (FP32 accumulation). */
#include <math.h>

#include "internal.h"

/* Stack budget of one kernel call, in elements: accumulators for up to
 * ATT_ACC_ELEMS / d query vectors and chunks of ATT_CHUNK_ELEMS / d keys. */
enum { ATT_ACC_ELEMS = 4096, ATT_CHUNK_ELEMS = 4096 };

/* Where the keys of one (sequence, KV head) lie: in pages named by a block
 * table, or in a dense [S, Hkv, d] array viewed as blocks of `block` rows. */
typedef struct {
    kv_dtype dtype;
    int32_t d;                  /* head_dim */
    int32_t block;              /* positions per block (page size when paged) */
    size_t stride;              /* bytes from one key row to the next within a block */
    const kv_cache *cache;      /* paged: the cache, else NULL */
    const int32_t *table;       /* paged: [blocks] page ids */
    int32_t layer, head;        /* paged: which slice */
    const unsigned char *k, *v; /* dense: row 0 of this head */
} key_source;

typedef struct {
    const unsigned char *k, *v;   /* row 0 of the block */
    const float *kscale, *vscale; /* KV_Q8: [block] scales, else NULL */
} key_block;

static key_block source_block(const key_source *s, int32_t blk) {
    key_block b = {0};
    if (!s->cache) {
        size_t off = (size_t)blk * (size_t)s->block * s->stride;
        b.k = s->k + off;
        b.v = s->v + off;
        return b;
    }
    int32_t page = s->table[blk];
    b.k = kv_page_head(s->cache, page, s->layer, 0, s->head);
    b.v = kv_page_head(s->cache, page, s->layer, 1, s->head);
    if (s->dtype == KV_Q8) {
        b.kscale = kv_page_scales(s->cache, page, s->layer, 0, s->head);
        b.vscale = kv_page_scales(s->cache, page, s->layer, 1, s->head);
    }
    return b;
}

#define KV_TMPL_F64 1
#define REAL double
#define KFN(name) name##_f64
static double exp_f64(double x) { return exp(x); }
#include "attend_tmpl.h"
#undef KV_TMPL_F64
#undef REAL
#undef KFN

#define KV_TMPL_F64 0
#define REAL float
#define KFN(name) name##_f32
static float exp_f32(float x) { return expf(x); }
#include "attend_tmpl.h"
#undef KV_TMPL_F64
#undef REAL
#undef KFN

/* One (sequence, KV head) group in the call's precision. q and out point at
 * the group's first query head; offsets are in elements. */
static void attend_group(bool f64, const key_source *src, const void *q, void *out, size_t q_stride,
                         int32_t rows, int32_t G, int32_t pos0, int32_t window, double scale) {
    if (f64)
        attend_group_f64(src, q, out, q_stride, rows, G, pos0, window, scale);
    else
        attend_group_f32(src, q, out, q_stride, rows, G, pos0, window, (float)scale);
}

static double default_scale(double scale, int32_t d) { return scale != 0 ? scale : 1.0 / sqrt(d); }

/* ------------------------------------------------------------------ dense */

static int attention_dense(bool f64, int32_t T, int32_t S, int32_t H, int32_t Hkv, int32_t d,
                           const void *q, const void *k, const void *v, void *out, int32_t window,
                           double scale) {
    if (T < 0 || S < 0 || H <= 0 || Hkv <= 0 || d <= 0 || d > KV_MAX_HEAD_DIM) return KV_ERR_SHAPE;
    if (H % Hkv) return KV_ERR_HEADS;
    if (T > S) return KV_ERR_LENGTH;
    if (window < 0) return KV_ERR_WINDOW;
    if (T == 0) return KV_OK;
    if (!q || !k || !v || !out) return KV_ERR_NULL;
    const size_t esz = f64 ? sizeof(double) : sizeof(float);
    const int32_t G = H / Hkv;
    for (int32_t g = 0; g < Hkv; g++) {
        key_source src = {.dtype = f64 ? KV_F64 : KV_F32, .d = d, .block = 64,
                          .stride = (size_t)Hkv * (size_t)d * esz,
                          .k = (const unsigned char *)k + (size_t)g * d * esz,
                          .v = (const unsigned char *)v + (size_t)g * d * esz};
        size_t off = (size_t)g * G * d * esz;
        attend_group(f64, &src, (const char *)q + off, (char *)out + off, (size_t)H * d, T, G,
                     S - T, window, default_scale(scale, d));
    }
    return KV_OK;
}

int kv_attention_f64(int32_t T, int32_t S, int32_t H, int32_t Hkv, int32_t d, const double *q,
                     const double *k, const double *v, double *out, int32_t window, double scale) {
    return attention_dense(true, T, S, H, Hkv, d, q, k, v, out, window, scale);
}

int kv_attention_f32(int32_t T, int32_t S, int32_t H, int32_t Hkv, int32_t d, const float *q,
                     const float *k, const float *v, float *out, int32_t window, float scale) {
    return attention_dense(false, T, S, H, Hkv, d, q, k, v, out, window, scale);
}

/* ------------------------------------------------------------------ paged */

static int attend_paged(bool f64, const kv_cache *c, int32_t layer, const kv_batch *b, int32_t H,
                        const void *q, void *out, double scale) {
    if (!c || !b) return KV_ERR_NULL;
    if ((c->p.dtype == KV_F64) != f64) return KV_ERR_DTYPE;
    if (layer < 0 || layer >= c->p.n_layers || H <= 0) return KV_ERR_SHAPE;
    if (H % c->p.n_kv_heads) return KV_ERR_HEADS;
    int32_t rows;
    int rc = kv_batch_check(c, b, &rows);
    if (rc || rows == 0) return rc;
    if (!q || !out) return KV_ERR_NULL;
    const size_t esz = f64 ? sizeof(double) : sizeof(float);
    const int32_t Hkv = c->p.n_kv_heads, d = c->p.head_dim, G = H / Hkv;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const int32_t seq = b->seqs[i], T = b->row_start[i + 1] - b->row_start[i];
        if (T == 0) continue;
        const int32_t S = c->seqs[seq].len;
        for (int32_t g = 0; g < Hkv; g++) {
            key_source src = {.dtype = c->p.dtype, .d = d, .block = c->p.page_size,
                              .stride = (size_t)d * c->elem, .cache = c, .table = kv_table(c, seq),
                              .layer = layer, .head = g};
            size_t off = ((size_t)b->row_start[i] * (size_t)H + (size_t)g * G) * d * esz;
            attend_group(f64, &src, (const char *)q + off, (char *)out + off, (size_t)H * d, T, G,
                         S - T, c->p.window, default_scale(scale, d));
        }
    }
    return KV_OK;
}

int kv_attend_f64(const kv_cache *c, int32_t layer, const kv_batch *b, int32_t H, const double *q,
                  double *out, double scale) {
    return attend_paged(true, c, layer, b, H, q, out, scale);
}

int kv_attend_f32(const kv_cache *c, int32_t layer, const kv_batch *b, int32_t H, const float *q,
                  float *out, float scale) {
    return attend_paged(false, c, layer, b, H, q, out, scale);
}
