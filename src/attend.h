/* src/attend.h - what the attention files share: where the keys of one
 * (sequence, KV head) lie, and the float64 reference kernel. */
#ifndef KV_ATTEND_H
#define KV_ATTEND_H

#include <pthread.h>

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

/* The attention work area of one cache: the work items and split results of
 * one wave. Attention calls only read the cache, so several threads may call
 * at once; they take turns on this area under its lock. */
struct kv_attend_work {
    pthread_mutex_t lock;
    kv_pool *threads;     /* borrowed: runs attention tasks, or NULL */
    kv_work_item *items;  /* [item_cap] the work items of one wave */
    int32_t item_cap;
    float *partials;      /* [partial_cap] split results of one wave */
    size_t partial_cap;
};

/* Keys per chunk of the kernels, from the stack budget: chunks end at
 * multiples of this in absolute position, so the order of the softmax updates
 * (hence every rounding) does not depend on the page size or key layout. */
enum { ATT_ACC_ELEMS = 4096, ATT_CHUNK_ELEMS = 4096, ATT_WIDE_ELEMS = 16384 };

/* The kernels' buffers on the stack start on a cache line: a 64-byte vector
 * load or store that straddles two lines costs two, and the frame is
 * aligned to only 16 or 32 bytes otherwise. */
#define LINE_ALIGNED _Alignas(64)

/* Decode-like groups (at most KV_SPLIT_ROWS rows) are cut into splits at
 * fixed absolute positions (multiples of kv_split_len), attended in parallel
 * and combined by log-sum-exp in split order (flash-decoding): one long
 * sequence keeps every core busy, and the result is the same for any number
 * of threads. */
enum { KV_SPLIT = 1024, KV_SPLIT_MIN = 128, KV_SPLIT_SHORT = 4, KV_SPLIT_ROWS = 8, KV_WIDE_HEADS = 32 };

/* Bytes of K/V a long split streams at least: a split costs a few
 * microseconds more than its keys, whatever its length, which is a large
 * share of a short split of a small head. A long sequence on many cores
 * keeps its parallelism: 32k keys of H9/Hkv3/d64 f16 still make 8 splits. */
#define KV_SPLIT_BYTES ((size_t)2 << 20)

/* Keys per split of a group that sees n keys, each key_bytes of K/V: the
 * least power of two from KV_SPLIT whose split holds KV_SPLIT_BYTES, or
 * below KV_SPLIT_SHORT of those the least power of two from KV_SPLIT_MIN
 * that cuts the n keys into at most KV_SPLIT_SHORT splits (one more when
 * they start between two multiples of it). Decode keeps all of a sequence's
 * heads in one item, so with long splits alone a context under 1024 keys
 * (or a 512-key sliding window) would run on one thread; more than four
 * short splits cost more than they spread. It depends on n and the cache's
 * shape alone, never on the threads. */
static inline int32_t kv_split_len(int32_t n, size_t key_bytes) {
    int32_t longest = KV_SPLIT;
    while ((size_t)longest * key_bytes < KV_SPLIT_BYTES && longest < (1 << 20)) longest *= 2;
    int32_t len = KV_SPLIT_MIN;
    while (len < longest && KV_SPLIT_SHORT * len < n) len *= 2;
    return len;
}

static inline int32_t att_chunk(int32_t d) { return ATT_CHUNK_ELEMS / d < 1 ? 1 : ATT_CHUNK_ELEMS / d; }
static inline int32_t att_tile(int32_t d) { return ATT_ACC_ELEMS / d < 1 ? 1 : ATT_ACC_ELEMS / d; }

/* The float64 reference: `rows` query rows of G heads each, query vector
 * (r, h) at q[r * q_stride + h * d], row r at absolute position pos0 + r. */
void kv_attend_group_f64(const key_source *src, const double *q, double *out, size_t q_stride,
                         int32_t rows, int32_t G, int32_t pos0, int32_t window, double scale);

#endif
