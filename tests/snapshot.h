/* tests/snapshot.h - a deep copy of everything a cache holds (white box: it
 * reads src/internal.h), to show that a refused call changed nothing. */
#ifndef KV_TEST_SNAPSHOT_H
#define KV_TEST_SNAPSHOT_H

#include <string.h>

#include "../src/internal.h"
#include "test.h"

typedef struct {
    kv_cache copy;      /* the struct itself; its pointers are replaced by copies */
    size_t pool_bytes;
} snapshot;

static inline void *dup_bytes(const void *p, size_t n) {
    void *d = malloc(n ? n : 1);
    memcpy(d, p, n);
    return d;
}

static inline snapshot snap(const kv_cache *c) {
    snapshot s = {.copy = *c, .pool_bytes = (size_t)c->p.n_pages * c->pages.page_bytes};
    size_t np = (size_t)c->p.n_pages, tables = (size_t)c->p.max_seqs * (size_t)c->max_blocks;
    s.copy.pages.pool = dup_bytes(c->pages.pool, s.pool_bytes);
    s.copy.pages.refcount = dup_bytes(c->pages.refcount, np * sizeof(int32_t));
    s.copy.pages.free_pages = dup_bytes(c->pages.free_pages, np * sizeof(int32_t));
    s.copy.seqs = dup_bytes(c->seqs, (size_t)c->p.max_seqs * sizeof(kv_seq_state));
    s.copy.tables = dup_bytes(c->tables, tables * sizeof(int32_t));
    s.copy.prefix.page_tokens = dup_bytes(c->prefix.page_tokens, np * (size_t)c->p.page_size * sizeof(int32_t));
    s.copy.prefix.page_hash = dup_bytes(c->prefix.page_hash, np * sizeof(uint64_t));
    s.copy.prefix.page_parent = dup_bytes(c->prefix.page_parent, np * sizeof(int32_t));
    s.copy.prefix.page_gen = dup_bytes(c->prefix.page_gen, np * sizeof(uint32_t));
    s.copy.prefix.parent_gen = dup_bytes(c->prefix.parent_gen, np * sizeof(uint32_t));
    s.copy.prefix.page_named = dup_bytes(c->prefix.page_named, np * sizeof(bool));
    s.copy.prefix.lru_prev = dup_bytes(c->prefix.lru_prev, np * sizeof(int32_t));
    s.copy.prefix.lru_next = dup_bytes(c->prefix.lru_next, np * sizeof(int32_t));
    s.copy.prefix.hash_slots = dup_bytes(c->prefix.hash_slots, c->prefix.hash_cap * sizeof(int32_t));
    return s;
}

static inline bool snap_equal(const kv_cache *c, const snapshot *s) {
    const kv_cache *o = &s->copy;
    size_t np = (size_t)c->p.n_pages, tables = (size_t)c->p.max_seqs * (size_t)c->max_blocks;
    bool lru_same = true; /* link fields matter only for pages on the list */
    for (int32_t p = c->prefix.lru_head; p != KV_NO_PAGE; p = c->prefix.lru_next[p])
        lru_same &= o->prefix.lru_prev[p] == c->prefix.lru_prev[p] && o->prefix.lru_next[p] == c->prefix.lru_next[p];
    return o->pages.n_free == c->pages.n_free && o->prefix.n_cached == c->prefix.n_cached && o->prefix.lru_head == c->prefix.lru_head &&
           o->prefix.lru_tail == c->prefix.lru_tail && lru_same && !memcmp(o->pages.pool, c->pages.pool, s->pool_bytes) &&
           !memcmp(o->pages.refcount, c->pages.refcount, np * sizeof(int32_t)) &&
           !memcmp(o->pages.free_pages, c->pages.free_pages, (size_t)c->pages.n_free * sizeof(int32_t)) &&
           !memcmp(o->seqs, c->seqs, (size_t)c->p.max_seqs * sizeof(kv_seq_state)) &&
           !memcmp(o->tables, c->tables, tables * sizeof(int32_t)) &&
           !memcmp(o->prefix.page_tokens, c->prefix.page_tokens, np * (size_t)c->p.page_size * sizeof(int32_t)) &&
           !memcmp(o->prefix.page_hash, c->prefix.page_hash, np * sizeof(uint64_t)) &&
           !memcmp(o->prefix.page_parent, c->prefix.page_parent, np * sizeof(int32_t)) &&
           !memcmp(o->prefix.page_gen, c->prefix.page_gen, np * sizeof(uint32_t)) &&
           !memcmp(o->prefix.page_named, c->prefix.page_named, np * sizeof(bool)) &&
           !memcmp(o->prefix.hash_slots, c->prefix.hash_slots, c->prefix.hash_cap * sizeof(int32_t));
}

static inline void snap_free(snapshot *s) {
    kv_cache *o = &s->copy;
    free(o->pages.pool), free(o->pages.refcount), free(o->pages.free_pages), free(o->seqs), free(o->tables);
    free(o->prefix.page_tokens), free(o->prefix.page_hash), free(o->prefix.page_parent), free(o->prefix.page_gen);
    free(o->prefix.parent_gen), free(o->prefix.page_named), free(o->prefix.lru_prev), free(o->prefix.lru_next), free(o->prefix.hash_slots);
}

/* Expects `call` to return `code` and to leave cache `c` unchanged. */
#define CHECK_REFUSED(c, call, code)                                                           \
    do {                                                                                       \
        snapshot s_ = snap(c);                                                                 \
        CHECK_EQ_INT((call), (code));                                                          \
        if (!snap_equal((c), &s_)) test_fail(__FILE__, __LINE__, "cache changed by %s", #call); \
        snap_free(&s_);                                                                        \
    } while (0)

#endif
