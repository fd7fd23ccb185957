/* src/attend.h - what the FP32 attention kernels share beyond src/keys.h:
 * the work area of a cache, buffer alignment, and how decode is split. */
#ifndef KV_ATTEND_H
#define KV_ATTEND_H

#include <pthread.h>

#include "keys.h"

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

#endif
