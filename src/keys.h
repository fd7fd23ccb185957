/* src/keys.h - where the keys of one (sequence, KV head) lie, the chunks
 * the kernels take them in, and the float64 reference kernel over them
 * (src/attend_ref.c): what the FP32 kernels and the reference share. */
#ifndef KV_KEYS_H
#define KV_KEYS_H

#include "internal.h"

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
    const float *kscale, *vscale; /* a scaled type's [block] scales, else NULL */
} key_block;

static inline key_block source_block(const key_source *s, int32_t blk) {
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
    if (s->cache->pages.row_scales) {
        b.kscale = kv_page_scales(s->cache, page, s->layer, 0, s->head);
        b.vscale = kv_page_scales(s->cache, page, s->layer, 1, s->head);
    }
    return b;
}

/* Keys per chunk of the kernels, from the stack budget: chunks end at
 * multiples of this in absolute position, so the order of the softmax updates
 * (hence every rounding) does not depend on the page size or key layout. */
enum { ATT_ACC_ELEMS = 4096, ATT_CHUNK_ELEMS = 4096, ATT_WIDE_ELEMS = 16384 };

static inline int32_t att_chunk(int32_t d) { return ATT_CHUNK_ELEMS / d < 1 ? 1 : ATT_CHUNK_ELEMS / d; }
static inline int32_t att_tile(int32_t d) { return ATT_ACC_ELEMS / d < 1 ? 1 : ATT_ACC_ELEMS / d; }

/* The float64 reference: `rows` query rows of G heads each, query vector
 * (r, h) at q[r * q_stride + h * d], row r at absolute position pos0 + r. */
void kv_attend_group_f64(const key_source *src, const double *q, double *out, size_t q_stride,
                         int32_t rows, int32_t G, int32_t pos0, int32_t window, double scale);

#endif
