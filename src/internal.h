/* src/internal.h - what the library's files share and callers never see:
 * the cache struct, its page layout, and element conversions. */
#ifndef KV_INTERNAL_H
#define KV_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kvcache.h"
#include "half.h"
#include "kvtype.h"

#define KV_NO_PAGE (-1)
#define KV_LOST_PAGE (-2) /* a page's parent when it has none in the pool (src/prefix.c) */

/* One piece of an attention call (src/attend.c): the query vectors [v0, v1)
 * of one (sequence, KV head) group against the keys [klo, khi]. */
typedef struct {
    int32_t b;            /* index of the sequence in the batch */
    int32_t head;         /* first KV head */
    int32_t n_heads;      /* KV heads head .. head + n_heads - 1 (decode reads all of a page's heads in turn) */
    int32_t v0, v1;       /* query vectors, vector = row * G + q-head in group */
    int32_t klo, khi;     /* keys, absolute positions, inclusive */
    int32_t partial;      /* offset of this split's m [nv] | l [nv] | acc [nv][d] in the
                           * workspace, or -1: the item writes the output itself */
} kv_work_item;

typedef struct {
    bool live;
    int32_t len;          /* S: positions reserved */
    int32_t first_block;  /* blocks below this were evicted by the window */
    int32_t named_blocks; /* blocks below this were offered to the prefix cache */
    int32_t tail_block;   /* > 0: block tail_block - 1 holds no page (skipped to, window */
    uint64_t tail_hash;   /* cache) and was named tail_hash: where the next load chains from */
} kv_seq_state;

/* Page layout. A page is n_layers layer-slices of layer_bytes each; a slice is
 *     K [Hkv][P][row] | V [Hkv][P][row] | (scaled types) Kscale [Hkv][P][ns] f32 | Vscale [Hkv][P][ns] f32
 * with a row of d elements in kv_type_row_bytes and ns = kv_type_row_scales
 * (src/kvtype.h)
 * so the q-heads of one GQA group stream one contiguous run of P keys.
 *
 * Page states: free (refcount 0, on the free stack), used (refcount > 0), or
 * cached (refcount 0, named, on the LRU list: its K/V kept for the prefix
 * cache until the pool needs the page). */
/* The pages: the pool of K/V and each page's reference count (src/pages.c). */
typedef struct {
    size_t row_bytes;     /* one stored row of head_dim elements */
    int32_t row_scales;   /* f32 scales of a row (0: an unscaled type) */
    size_t head_bytes;    /* P * row_bytes: one head's K (or V) in one page slice */
    size_t layer_bytes;   /* one layer's slice of a page */
    size_t page_bytes;    /* n_layers * layer_bytes, rounded up to 64 */
    unsigned char *pool;  /* [n_pages][page_bytes], 64-byte aligned */
    size_t pool_mapped;   /* bytes mapped for the pool with mmap, or 0 if malloc'd */
    int32_t *refcount;    /* [n_pages] sequences referencing the page */
    int32_t *free_pages;  /* [n_pages] stack of free page ids, n_free on top */
    int32_t n_free;
    struct kv_page_sim *sim; /* [n_pages] a dry run's view (below) */
    int32_t *sim_touched; /* [n_pages] pages whose sim entry the dry run set */
    int32_t n_touched;
    uint32_t sim_call;    /* the dry run under way: entries stamped otherwise are stale */
    int32_t sim_roots;    /* first page the dry run named without a parent */
    int32_t sim_taken;    /* pages the dry run took */
    kv_spill_fn spill;    /* NULL unless a tier below keeps reclaimed pages */
    void *spill_user;
} kv_pages;

/* A reserve is worked out by one code path twice: as a dry run, which reads
 * the pages and writes only these entries (refcounts and names as they would
 * become), then for real. An entry is live when its stamp is sim_call. */
typedef struct kv_page_sim {
    uint32_t stamp;
    int32_t rc;           /* refcount the dry run reached */
    bool named;           /* named by the dry run */
    uint64_t hash;        /* its name, when named by the dry run */
    int32_t parent;
    int32_t next;         /* next page the dry run named after the same parent */
    int32_t children;     /* first page the dry run named after this one */
} kv_page_sim;

int kv_pages_init(kv_pages *pg, const kv_cache_params *p);
void kv_pages_free(kv_pages *pg);

/* The prefix index: names of full pages, and the LRU list of cached ones
 * (src/prefix.c). */
typedef struct {
    int32_t *page_tokens; /* [n_pages][P] token id at each position, -1 unknown */
    uint64_t *page_hash;  /* [n_pages] chained hash of a named page */
    uint64_t *parent_hash; /* [n_pages] page_hash of its parent when it was named (0: none) */
    int32_t *page_parent; /* [n_pages] page before a named page in its chain, KV_NO_PAGE, or
                           * KV_LOST_PAGE: loaded after a block that has no page */
    uint32_t *page_gen;   /* [n_pages] bumped each time the page is named: a reused page is new */
    uint32_t *parent_gen; /* [n_pages] page_gen of the parent when this page was named */
    bool *page_named;     /* [n_pages] findable through the hash table */
    int32_t *lru_prev;    /* [n_pages] cached pages, a list from least to most recently used */
    int32_t *lru_next;    /* [n_pages] */
    int32_t lru_head, lru_tail, n_cached;
    int32_t *hash_slots;  /* [hash_cap] open addressing, page ids or KV_NO_PAGE */
    uint32_t hash_cap;    /* power of two >= 2 n_pages */
    uint64_t hash_mask;   /* hash bits that count (all; tests narrow it to force collisions) */
    kv_prefix_listener listener; /* NULL unless someone publishes the cache's events */
    void *listener_user;
} kv_prefix_index;

int kv_prefix_init(kv_prefix_index *px, int32_t n_pages, int32_t page_size);
void kv_prefix_free(kv_prefix_index *px);

/* The attention work area (src/attend.c), owned by the attention module. */
typedef struct kv_attend_work kv_attend_work;

/* NULL when out of memory. Sized for every split of one longest sequence. */
kv_attend_work *kv_attend_work_create(int32_t max_seq_len, int32_t n_kv_heads);
void kv_attend_work_free(kv_attend_work *w);
void kv_attend_work_set_pool(kv_attend_work *w, kv_pool *pool);

/* A cache is its parameters, its sequences and three parts that allocate and
 * free themselves. */
struct kv_cache {
    kv_cache_params p;
    kv_pages pages;
    int32_t max_blocks;   /* ceil(max_seq_len / P): block-table width */
    kv_seq_state *seqs;   /* [max_seqs] */
    int32_t *tables;      /* [max_seqs][max_blocks] page ids, KV_NO_PAGE when none */
    kv_prefix_index prefix;
    kv_attend_work *work; /* not part of the cache's state: attention calls on a
                           * const cache use it (under its own lock) */
};

static inline int32_t *kv_table(const kv_cache *c, int32_t seq) {
    return c->tables + (size_t)seq * (size_t)c->max_blocks;
}

/* Base of K (kv = 0) or V (kv = 1) of `head` in `layer` of `page`. */
static inline unsigned char *kv_page_head(const kv_cache *c, int32_t page, int32_t layer, int kv,
                                          int32_t head) {
    return c->pages.pool + (size_t)page * c->pages.page_bytes + (size_t)layer * c->pages.layer_bytes +
           ((size_t)kv * (size_t)c->p.n_kv_heads + (size_t)head) * c->pages.head_bytes;
}

/* Scales of `head` in `layer` of `page`: [P][row_scales] floats. */
static inline float *kv_page_scales(const kv_cache *c, int32_t page, int32_t layer, int kv,
                                    int32_t head) {
    unsigned char *s = c->pages.pool + (size_t)page * c->pages.page_bytes + (size_t)layer * c->pages.layer_bytes +
                       2 * (size_t)c->p.n_kv_heads * c->pages.head_bytes;
    return (float *)s + ((size_t)kv * (size_t)c->p.n_kv_heads + (size_t)head) * (size_t)c->p.page_size *
                            (size_t)c->pages.row_scales;
}

/* The scales of the row at `slot` of that head (NULL for an unscaled type). */
static inline float *kv_page_row_scales(const kv_cache *c, int32_t page, int32_t layer, int kv, int32_t head,
                                        int32_t slot) {
    if (!c->pages.row_scales) return NULL;
    return kv_page_scales(c, page, layer, kv, head) + (size_t)slot * (size_t)c->pages.row_scales;
}

/* Pages (src/pages.c). */
int32_t kv_page_take(kv_cache *c);                 /* a free page, else the LRU cached one */
void kv_page_release(kv_cache *c, int32_t page);   /* drop one reference */
void kv_prefix_unname(kv_cache *c, int32_t page);  /* forget a page's name */
void kv_lru_remove(kv_cache *c, int32_t page);
void kv_lru_push(kv_cache *c, int32_t page);       /* as most recently used */

/* The same moves on a view of the pages: the real ones when dry is false,
 * else the dry run's entries (kv_sim_begin starts a dry run). */
void kv_sim_begin(kv_cache *c);
kv_page_sim *kv_sim_of(kv_cache *c, int32_t page); /* its entry, made live */
int32_t kv_view_refs(kv_cache *c, bool dry, int32_t page);
void kv_view_hold(kv_cache *c, bool dry, int32_t page);    /* one more reference (a cached page becomes used) */
void kv_view_release(kv_cache *c, bool dry, int32_t page);
/* kv_page_take, or in a dry run a count of it (KV_NO_PAGE). */
int32_t kv_view_take(kv_cache *c, bool dry);

/* Home slot of name hash h in the prefix index's open-addressing table. */
static inline uint32_t kv_name_slot(const kv_cache *c, uint64_t h) {
    return (uint32_t)(h ^ (h >> 32)) & (c->prefix.hash_cap - 1);
}

/* Calls the spill listener with the image of a named page. */
void kv_page_spill(kv_cache *c, int32_t page);

/* Prefix index (src/prefix.c). */
/* Names the full, written blocks of seq below `upto` that are not yet named;
 * a block whose twin (same tokens after the same parent) is named already is
 * swapped for that twin in the block table. */
void kv_prefix_publish(kv_cache *c, int32_t seq, int32_t upto, bool dry);
/* First block a window cache still needs when the earliest query to come sits
 * at position `pos`: that query sees keys j > pos - W, so every block whose
 * last position is <= pos - W can go. */
static inline int32_t kv_window_first_block(const kv_cache *c, int32_t pos) {
    if (c->p.window == 0 || c->p.no_evict) return 0;
    int64_t lowest_key = (int64_t)pos - c->p.window + 1;
    return lowest_key <= 0 ? 0 : (int32_t)(lowest_key / c->p.page_size);
}
/* Whether the page is named, in the view. */
bool kv_view_named(kv_cache *c, bool dry, int32_t page);

static inline bool kv_seq_valid(const kv_cache *c, int32_t seq) {
    return seq >= 0 && seq < c->p.max_seqs && c->seqs[seq].live;
}
/* src/batch.c. Form: the arrays are there, row_start starts at 0 and never
 * decreases, each id names a live sequence that appears once. */
int kv_batch_form(const kv_cache *c, const kv_batch *b);
/* Validates a batch against the cache: ids live and distinct, rows well formed,
 * T_b <= S_b, and the window's keys still present. *rows receives the total. */
int kv_batch_check(const kv_cache *c, const kv_batch *b, int32_t *rows);

/* ------------------------------------------------------------------ elements */

/* kv_f16_to_f32, kv_f32_to_f16, kv_bf16_to_f32, kv_f32_to_bf16: src/half.h;
 * rows of a storage type, kv_store_row and kv_load_row: src/kvtype.h */

/* RoPE (src/rope.c): cs, sn [rot_dim / 2] of a turn by delta positions, and
 * that turn applied to one head row v [head_dim] in place. */
void kv_rope_turn_angles(const kv_rope *rope, double delta, double *cs, double *sn);
void kv_rope_turn_row(const kv_rope *rope, double *v, const double *cs, const double *sn);

#endif
