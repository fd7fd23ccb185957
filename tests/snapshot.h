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
    snapshot s = {.copy = *c, .pool_bytes = (size_t)c->p.n_pages * c->page_bytes};
    size_t np = (size_t)c->p.n_pages, tables = (size_t)c->p.max_seqs * (size_t)c->max_blocks;
    s.copy.pool = dup_bytes(c->pool, s.pool_bytes);
    s.copy.refcount = dup_bytes(c->refcount, np * sizeof(int32_t));
    s.copy.free_pages = dup_bytes(c->free_pages, np * sizeof(int32_t));
    s.copy.seqs = dup_bytes(c->seqs, (size_t)c->p.max_seqs * sizeof(kv_seq_state));
    s.copy.tables = dup_bytes(c->tables, tables * sizeof(int32_t));
    s.copy.page_tokens = dup_bytes(c->page_tokens, np * (size_t)c->p.page_size * sizeof(int32_t));
    s.copy.page_hash = dup_bytes(c->page_hash, np * sizeof(uint64_t));
    s.copy.page_parent = dup_bytes(c->page_parent, np * sizeof(int32_t));
    s.copy.page_gen = dup_bytes(c->page_gen, np * sizeof(uint32_t));
    s.copy.parent_gen = dup_bytes(c->parent_gen, np * sizeof(uint32_t));
    s.copy.page_named = dup_bytes(c->page_named, np * sizeof(bool));
    s.copy.lru_prev = dup_bytes(c->lru_prev, np * sizeof(int32_t));
    s.copy.lru_next = dup_bytes(c->lru_next, np * sizeof(int32_t));
    s.copy.hash_slots = dup_bytes(c->hash_slots, c->hash_cap * sizeof(int32_t));
    return s;
}

static inline bool snap_equal(const kv_cache *c, const snapshot *s) {
    const kv_cache *o = &s->copy;
    size_t np = (size_t)c->p.n_pages, tables = (size_t)c->p.max_seqs * (size_t)c->max_blocks;
    bool lru_same = true; /* link fields matter only for pages on the list */
    for (int32_t p = c->lru_head; p != KV_NO_PAGE; p = c->lru_next[p])
        lru_same &= o->lru_prev[p] == c->lru_prev[p] && o->lru_next[p] == c->lru_next[p];
    return o->n_free == c->n_free && o->n_cached == c->n_cached && o->lru_head == c->lru_head &&
           o->lru_tail == c->lru_tail && lru_same && !memcmp(o->pool, c->pool, s->pool_bytes) &&
           !memcmp(o->refcount, c->refcount, np * sizeof(int32_t)) &&
           !memcmp(o->free_pages, c->free_pages, (size_t)c->n_free * sizeof(int32_t)) &&
           !memcmp(o->seqs, c->seqs, (size_t)c->p.max_seqs * sizeof(kv_seq_state)) &&
           !memcmp(o->tables, c->tables, tables * sizeof(int32_t)) &&
           !memcmp(o->page_tokens, c->page_tokens, np * (size_t)c->p.page_size * sizeof(int32_t)) &&
           !memcmp(o->page_hash, c->page_hash, np * sizeof(uint64_t)) &&
           !memcmp(o->page_parent, c->page_parent, np * sizeof(int32_t)) &&
           !memcmp(o->page_gen, c->page_gen, np * sizeof(uint32_t)) &&
           !memcmp(o->page_named, c->page_named, np * sizeof(bool)) &&
           !memcmp(o->hash_slots, c->hash_slots, c->hash_cap * sizeof(int32_t));
}

static inline void snap_free(snapshot *s) {
    kv_cache *o = &s->copy;
    free(o->pool), free(o->refcount), free(o->free_pages), free(o->seqs), free(o->tables);
    free(o->page_tokens), free(o->page_hash), free(o->page_parent), free(o->page_gen);
    free(o->parent_gen), free(o->page_named), free(o->lru_prev), free(o->lru_next), free(o->hash_slots);
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
