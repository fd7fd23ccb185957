/* src/pages.c - the pages under the cache and the prefix index: the pool,
 * the free stack, each page's reference count, the LRU list of cached pages
 * and the one way out of it (taking a page drops its name). src/cache.c and
 * src/prefix.c build on these; this file calls neither. */
#include <stdlib.h>
#include <sys/mman.h>

#include "internal.h"

/* The pool, on 2 MiB pages where the kernel allows: decode streams it, and a
 * stream over 4 KiB pages makes the hardware prefetcher start over at every
 * page boundary (and fills the TLB). A large pool is mapped directly, since
 * huge pages need a 2 MiB-aligned range the allocator may not hand out;
 * *mapped receives its length (0 when it came from malloc). */
static unsigned char *pool_alloc(size_t bytes, size_t *mapped) {
    const size_t huge = (size_t)2 << 20;
    *mapped = 0;
    if (bytes < huge) return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    size_t len = ((bytes + huge - 1) & ~(huge - 1)) + huge; /* room to align the start */
    unsigned char *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return NULL;
    unsigned char *p = (unsigned char *)(((uintptr_t)map + huge - 1) & ~(uintptr_t)(huge - 1));
    if (p > map) munmap(map, (size_t)(p - map)); /* keep [p, p + len - huge) */
    size_t keep = len - huge, tail = (size_t)(map + len - (p + keep));
    if (tail) munmap(p + keep, tail);
#ifdef MADV_HUGEPAGE
    madvise(p, keep, MADV_HUGEPAGE);
#endif
    *mapped = keep;
    return p;
}

/* The layout of a page, then the pool and the free stack. KV_ERR_SHAPE when
 * the pool's size does not fit in memory's address range. */
int kv_pages_init(kv_pages *pg, const kv_cache_params *p) {
    *pg = (kv_pages){0};
    pg->elem = kv_dtype_size(p->dtype);
    pg->head_bytes = (size_t)p->page_size * (size_t)p->head_dim * pg->elem;
    pg->layer_bytes = 2 * (size_t)p->n_kv_heads * pg->head_bytes;
    if (p->dtype == KV_Q8) pg->layer_bytes += 2 * (size_t)p->n_kv_heads * (size_t)p->page_size * sizeof(float);
    pg->page_bytes = ((size_t)p->n_layers * pg->layer_bytes + 63) & ~(size_t)63;
    if (pg->page_bytes / (size_t)p->n_layers < pg->layer_bytes || (size_t)p->n_pages > SIZE_MAX / pg->page_bytes)
        return KV_ERR_SHAPE;
    pg->pool = pool_alloc((size_t)p->n_pages * pg->page_bytes, &pg->pool_mapped);
    pg->refcount = calloc((size_t)p->n_pages, sizeof *pg->refcount);
    pg->free_pages = malloc((size_t)p->n_pages * sizeof *pg->free_pages);
    pg->sim = calloc((size_t)p->n_pages, sizeof *pg->sim);
    pg->sim_touched = malloc((size_t)p->n_pages * sizeof *pg->sim_touched);
    if (!pg->pool || !pg->refcount || !pg->free_pages || !pg->sim || !pg->sim_touched) {
        kv_pages_free(pg);
        return KV_ERR_NOMEM;
    }
    /* pop order 0, 1, 2, ...: the stack holds the highest id at the bottom */
    for (int32_t i = 0; i < p->n_pages; i++) pg->free_pages[i] = p->n_pages - 1 - i;
    pg->n_free = p->n_pages;
    return KV_OK;
}

void kv_pages_free(kv_pages *pg) {
    if (pg->pool_mapped)
        munmap(pg->pool, pg->pool_mapped);
    else
        free(pg->pool);
    free(pg->refcount);
    free(pg->free_pages);
    free(pg->sim);
    free(pg->sim_touched);
    *pg = (kv_pages){0};
}

/* ------------------------------------------------------------------ take, release */

int32_t kv_page_take(kv_cache *c) {
    int32_t page;
    if (c->pages.n_free > 0) {
        page = c->pages.free_pages[--c->pages.n_free];
    } else { /* reclaim the least recently used cached page */
        page = c->prefix.lru_head;
        kv_lru_remove(c, page);
        if (c->pages.spill) kv_page_spill(c, page);
        kv_prefix_unname(c, page);
    }
    c->pages.refcount[page] = 1;
    return page;
}

void kv_page_release(kv_cache *c, int32_t page) {
    if (--c->pages.refcount[page] > 0) return;
    if (c->prefix.page_named[page])
        kv_lru_push(c, page); /* keep its K/V while the pool can spare it */
    else
        c->pages.free_pages[c->pages.n_free++] = page;
}

void kv_page_spill(kv_cache *c, int32_t page) {
    const kv_prefix_index *px = &c->prefix;
    kv_page_image img = {.hash = px->page_hash[page], .parent_hash = px->parent_hash[page],
                         .has_parent = px->page_parent[page] != KV_NO_PAGE,
                         .tokens = px->page_tokens + (size_t)page * (size_t)c->p.page_size,
                         .n_tokens = c->p.page_size, .data = c->pages.pool + (size_t)page * c->pages.page_bytes,
                         .bytes = c->pages.page_bytes};
    c->pages.spill(c->pages.spill_user, &img);
}

/* ------------------------------------------------------------------ dry runs */

void kv_sim_begin(kv_cache *c) {
    kv_pages *pg = &c->pages;
    if (++pg->sim_call == 0) { /* the stamps wrapped: make every entry stale */
        memset(pg->sim, 0, (size_t)c->p.n_pages * sizeof *pg->sim);
        pg->sim_call = 1;
    }
    pg->n_touched = 0, pg->sim_taken = 0, pg->sim_roots = KV_NO_PAGE;
}

kv_page_sim *kv_sim_of(kv_cache *c, int32_t page) {
    kv_page_sim *e = &c->pages.sim[page];
    if (e->stamp != c->pages.sim_call) {
        *e = (kv_page_sim){.stamp = c->pages.sim_call, .rc = c->pages.refcount[page], .parent = KV_NO_PAGE,
                           .next = KV_NO_PAGE, .children = KV_NO_PAGE};
        c->pages.sim_touched[c->pages.n_touched++] = page;
    }
    return e;
}

int32_t kv_view_refs(kv_cache *c, bool dry, int32_t page) {
    if (!dry) return c->pages.refcount[page];
    const kv_page_sim *e = &c->pages.sim[page];
    return e->stamp == c->pages.sim_call ? e->rc : c->pages.refcount[page];
}

void kv_view_hold(kv_cache *c, bool dry, int32_t page) {
    if (dry) {
        kv_sim_of(c, page)->rc++;
        return;
    }
    if (c->pages.refcount[page] == 0) kv_lru_remove(c, page);
    c->pages.refcount[page]++;
}

void kv_view_release(kv_cache *c, bool dry, int32_t page) {
    if (dry)
        kv_sim_of(c, page)->rc--;
    else
        kv_page_release(c, page);
}

int32_t kv_view_take(kv_cache *c, bool dry) {
    if (!dry) return kv_page_take(c);
    c->pages.sim_taken++;
    return KV_NO_PAGE;
}

/* ------------------------------------------------------------------ names */

void kv_prefix_unname(kv_cache *c, int32_t page) {
    if (!c->prefix.page_named[page]) return;
    const uint32_t mask = c->prefix.hash_cap - 1;
    uint32_t i = kv_name_slot(c, c->prefix.page_hash[page]);
    while (c->prefix.hash_slots[i] != page) i = (i + 1) & mask;
    /* backward-shift deletion: pull later entries of the run into the hole
     * unless their home slot lies cyclically in (hole, entry] */
    for (uint32_t j = (i + 1) & mask; c->prefix.hash_slots[j] != KV_NO_PAGE; j = (j + 1) & mask) {
        uint32_t home = kv_name_slot(c, c->prefix.page_hash[c->prefix.hash_slots[j]]);
        bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            c->prefix.hash_slots[i] = c->prefix.hash_slots[j];
            i = j;
        }
    }
    c->prefix.hash_slots[i] = KV_NO_PAGE;
    c->prefix.page_named[page] = false;
    if (c->prefix.listener)
        c->prefix.listener(c->prefix.listener_user,
                           &(kv_prefix_event){.kind = KV_PREFIX_REMOVED, .hash = c->prefix.page_hash[page]});
}

/* ------------------------------------------------------------------ LRU */

void kv_lru_remove(kv_cache *c, int32_t page) {
    int32_t prev = c->prefix.lru_prev[page], next = c->prefix.lru_next[page];
    if (prev != KV_NO_PAGE) c->prefix.lru_next[prev] = next; else c->prefix.lru_head = next;
    if (next != KV_NO_PAGE) c->prefix.lru_prev[next] = prev; else c->prefix.lru_tail = prev;
    c->prefix.n_cached--;
}

void kv_lru_push(kv_cache *c, int32_t page) {
    c->prefix.lru_prev[page] = c->prefix.lru_tail;
    c->prefix.lru_next[page] = KV_NO_PAGE;
    if (c->prefix.lru_tail != KV_NO_PAGE) c->prefix.lru_next[c->prefix.lru_tail] = page; else c->prefix.lru_head = page;
    c->prefix.lru_tail = page;
    c->prefix.n_cached++;
}
