/* src/prefix.c - the prefix cache: full pages named by a hash of their
 * tokens chained with the hash of the page before, an open-addressing table
 * from names to pages, and the LRU list of cached (unreferenced) pages that
 * the pool reclaims only when it runs out of free ones.
 *
 * A name alone is never trusted: a hit must also have the same tokens and the
 * same parent page (in the same generation, since a reclaimed page is reused
 * for other content), so a hash collision costs a miss, never wrong K/V.
 * A window cache resumes at a point p from the pages of (p - W, p] alone,
 * whose first page's parent may be long gone: that page is confirmed by its
 * tokens and the parent's chained hash (a wrong hit would take two token
 * histories with the same 64-bit hash), the pages after it by identity. */
#include <stdlib.h>

#include "internal.h"

/* ------------------------------------------------------------------ the index */

int kv_prefix_init(kv_prefix_index *px, int32_t n_pages, int32_t page_size) {
    *px = (kv_prefix_index){0};
    px->hash_cap = 16;
    while (px->hash_cap < 2 * (uint32_t)n_pages) px->hash_cap *= 2;
    px->page_tokens = malloc((size_t)n_pages * (size_t)page_size * sizeof *px->page_tokens);
    px->page_hash = calloc((size_t)n_pages, sizeof *px->page_hash);
    px->page_parent = calloc((size_t)n_pages, sizeof *px->page_parent);
    px->parent_hash = calloc((size_t)n_pages, sizeof *px->parent_hash);
    px->page_gen = calloc((size_t)n_pages, sizeof *px->page_gen);
    px->parent_gen = calloc((size_t)n_pages, sizeof *px->parent_gen);
    px->page_named = calloc((size_t)n_pages, sizeof *px->page_named);
    px->lru_prev = malloc((size_t)n_pages * sizeof *px->lru_prev);
    px->lru_next = malloc((size_t)n_pages * sizeof *px->lru_next);
    px->hash_slots = malloc(px->hash_cap * sizeof *px->hash_slots);
    if (!px->page_tokens || !px->page_hash || !px->page_parent || !px->parent_hash || !px->page_gen || !px->parent_gen ||
        !px->page_named || !px->lru_prev || !px->lru_next || !px->hash_slots) {
        kv_prefix_free(px);
        return KV_ERR_NOMEM;
    }
    for (size_t i = 0; i < (size_t)n_pages * (size_t)page_size; i++) px->page_tokens[i] = -1;
    for (uint32_t i = 0; i < px->hash_cap; i++) px->hash_slots[i] = KV_NO_PAGE;
    px->lru_head = px->lru_tail = KV_NO_PAGE;
    px->hash_mask = UINT64_MAX;
    return KV_OK;
}

void kv_prefix_free(kv_prefix_index *px) {
    free(px->page_tokens);
    free(px->page_hash);
    free(px->page_parent);
    free(px->parent_hash);
    free(px->page_gen);
    free(px->parent_gen);
    free(px->page_named);
    free(px->lru_prev);
    free(px->lru_next);
    free(px->hash_slots);
    *px = (kv_prefix_index){0};
}

/* ------------------------------------------------------------------ hashing */

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t chain_hash(const kv_cache *c, uint64_t prev, const int32_t *tokens) {
    uint64_t h = mix64(prev + 0x9E3779B97F4A7C15ull);
    for (int32_t i = 0; i < c->p.page_size; i++) h = mix64(h ^ (uint32_t)tokens[i]);
    return h & c->prefix.hash_mask;
}

static uint32_t home_slot(const kv_cache *c, uint64_t h) {
    return (uint32_t)(h ^ (h >> 32)) & (c->prefix.hash_cap - 1);
}

static const int32_t *tokens_of(const kv_cache *c, int32_t page) {
    return c->prefix.page_tokens + (size_t)page * (size_t)c->p.page_size;
}

/* The named page with this hash, parent and tokens, or KV_NO_PAGE. */
static int32_t find(const kv_cache *c, uint64_t h, int32_t parent, const int32_t *tokens) {
    for (uint32_t i = home_slot(c, h);; i = (i + 1) & (c->prefix.hash_cap - 1)) {
        int32_t p = c->prefix.hash_slots[i];
        if (p == KV_NO_PAGE) return KV_NO_PAGE;
        if (c->prefix.page_hash[p] == h && c->prefix.page_parent[p] == parent &&
            (parent == KV_NO_PAGE || c->prefix.parent_gen[p] == c->prefix.page_gen[parent]) &&
            memcmp(tokens_of(c, p), tokens, sizeof(int32_t) * (size_t)c->p.page_size) == 0)
            return p;
    }
}

/* The named page with this hash and tokens whose parent had hash ph, whether
 * or not that parent is still there, or KV_NO_PAGE. */
static int32_t find_after(const kv_cache *c, uint64_t h, uint64_t ph, const int32_t *tokens) {
    for (uint32_t i = home_slot(c, h);; i = (i + 1) & (c->prefix.hash_cap - 1)) {
        int32_t p = c->prefix.hash_slots[i];
        if (p == KV_NO_PAGE) return KV_NO_PAGE;
        if (c->prefix.page_hash[p] == h && c->prefix.page_parent[p] != KV_NO_PAGE && c->prefix.parent_hash[p] == ph &&
            memcmp(tokens_of(c, p), tokens, sizeof(int32_t) * (size_t)c->p.page_size) == 0)
            return p;
    }
}

static void name_page(kv_cache *c, int32_t page, uint64_t h, int32_t parent) {
    c->prefix.page_hash[page] = h;
    c->prefix.page_parent[page] = parent;
    c->prefix.parent_hash[page] = parent == KV_NO_PAGE ? 0 : c->prefix.page_hash[parent];
    c->prefix.parent_gen[page] = parent == KV_NO_PAGE ? 0 : c->prefix.page_gen[parent];
    c->prefix.page_gen[page]++;
    c->prefix.page_named[page] = true;
    uint32_t i = home_slot(c, h);
    while (c->prefix.hash_slots[i] != KV_NO_PAGE) i = (i + 1) & (c->prefix.hash_cap - 1);
    c->prefix.hash_slots[i] = page;
    if (c->prefix.listener)   /* once per full page, never per token */
        c->prefix.listener(c->prefix.listener_user,
                           &(kv_prefix_event){KV_PREFIX_STORED, h, parent == KV_NO_PAGE ? 0 : c->prefix.page_hash[parent],
                                              parent != KV_NO_PAGE, tokens_of(c, page), c->p.page_size});
}

void kv_prefix_unname(kv_cache *c, int32_t page) {
    if (!c->prefix.page_named[page]) return;
    const uint32_t mask = c->prefix.hash_cap - 1;
    uint32_t i = home_slot(c, c->prefix.page_hash[page]);
    while (c->prefix.hash_slots[i] != page) i = (i + 1) & mask;
    /* backward-shift deletion: pull later entries of the run into the hole
     * unless their home slot lies cyclically in (hole, entry] */
    for (uint32_t j = (i + 1) & mask; c->prefix.hash_slots[j] != KV_NO_PAGE; j = (j + 1) & mask) {
        uint32_t home = home_slot(c, c->prefix.page_hash[c->prefix.hash_slots[j]]);
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

/* ------------------------------------------------------------------ naming */

void kv_prefix_publish(kv_cache *c, int32_t seq, int32_t upto) {
    kv_seq_state *s = &c->seqs[seq];
    if (upto <= s->named_blocks) return;
    int32_t *t = kv_table(c, seq);
    for (int32_t i = s->named_blocks; i < upto; i++) {
        int32_t page = t[i], parent = i > 0 ? t[i - 1] : KV_NO_PAGE;
        if (page == KV_NO_PAGE || (i > 0 && parent == KV_NO_PAGE)) continue; /* evicted unnamed (a restore) */
        if (c->prefix.page_named[page]) continue; /* shared from a fork or a prefix hit */
        if (parent != KV_NO_PAGE && !c->prefix.page_named[parent]) continue; /* the chain is broken */
        const int32_t *tok = tokens_of(c, page);
        bool known = true;
        for (int32_t j = 0; j < c->p.page_size; j++) known &= tok[j] >= 0;
        if (!known) continue;
        uint64_t h = chain_hash(c, parent == KV_NO_PAGE ? 0 : c->prefix.page_hash[parent], tok);
        int32_t twin = find(c, h, parent, tok);
        if (twin != KV_NO_PAGE) {
            /* The same tokens after the same parent are named already (the
             * sequence prefilled without a lookup): hold the named twin
             * instead, so the chain goes on through it and this block's
             * successors can be named and found. Not when that would take a
             * cached page and free none (a page a fork shares): a reserve
             * names before it takes pages, counting on no fewer. */
            if (c->pages.refcount[twin] == 0 && c->pages.refcount[page] > 1) continue;
            if (c->pages.refcount[twin] == 0) kv_lru_remove(c, twin);
            c->pages.refcount[twin]++;
            t[i] = twin;
            kv_page_release(c, page);
            continue;
        }
        name_page(c, page, h, parent);
    }
    s->named_blocks = upto;
}

/* The longest page-aligned point m <= n (and <= max_seq_len) at which the
 * cache can resume tokens: a full cache needs the pages of every block
 * below m, a window cache those of blocks kv_window_first_block(m) .. m/P - 1,
 * chained. One pass over the blocks keeps the page found for the one before
 * and where the present run of chained pages began; table, when not NULL,
 * receives the page found for each block (KV_NO_PAGE for none). */
static int32_t prefix_scan(const kv_cache *c, const int32_t *tokens, int32_t n, int32_t *table) {
    const int32_t P = c->p.page_size;
    const bool window = c->p.window > 0 && !c->p.no_evict;
    int32_t blocks = (n < c->p.max_seq_len ? n : c->p.max_seq_len) / P, best = 0, run = -1, prev = KV_NO_PAGE;
    uint64_t h_prev = 0;
    for (int32_t i = 0; i < blocks; i++) {
        const int32_t *tok = tokens + (size_t)i * P;
        uint64_t h = chain_hash(c, h_prev, tok);
        int32_t page = i == 0 || prev != KV_NO_PAGE ? find(c, h, prev, tok) : KV_NO_PAGE;
        if (page != KV_NO_PAGE && i == 0) run = 0;
        if (page == KV_NO_PAGE && i > 0 && window && (page = find_after(c, h, h_prev, tok)) != KV_NO_PAGE) run = i;
        if (page == KV_NO_PAGE) {
            run = -1;
            if (!window) break;
        }
        if (table) table[i] = page;
        prev = page, h_prev = h;
        if (run >= 0 && run <= kv_window_first_block(c, (i + 1) * P)) best = (i + 1) * P;
    }
    return best;
}

int kv_prefix_lookup(const kv_cache *c, const int32_t *tokens, int32_t n, int32_t *n_found) {
    if (!c || !n_found) return KV_ERR_NULL;
    if (n < 0) return KV_ERR_SHAPE;
    if (n > 0 && !tokens) return KV_ERR_NULL;
    *n_found = prefix_scan(c, tokens, n, NULL);
    return KV_OK;
}

int kv_seq_prefix_match(kv_cache *c, int32_t seq, const int32_t *tokens, int32_t n, int32_t *n_matched) {
    if (!c || !n_matched) return KV_ERR_NULL;
    if (seq < 0 || seq >= c->p.max_seqs || !c->seqs[seq].live) return KV_ERR_SEQ;
    if (n < 0) return KV_ERR_SHAPE;
    if (n > 0 && !tokens) return KV_ERR_NULL;
    kv_seq_state *s = &c->seqs[seq];
    if (s->len != 0) return KV_ERR_LENGTH;
    const int32_t P = c->p.page_size;
    int32_t *t = kv_table(c, seq);
    int32_t m = prefix_scan(c, tokens, n, t), scanned = (n < c->p.max_seq_len ? n : c->p.max_seq_len) / P;
    int32_t first = kv_window_first_block(c, m), k = m / P;
    for (int32_t i = 0; i < scanned; i++) {
        if (i < first || i >= k) {
            t[i] = KV_NO_PAGE;
            continue;
        }
        if (c->pages.refcount[t[i]] == 0) kv_lru_remove(c, t[i]);
        c->pages.refcount[t[i]]++;
    }
    s->len = m;
    s->first_block = first;
    s->named_blocks = k;
    *n_matched = m;
    return KV_OK;
}

void kv_cache_set_prefix_listener(kv_cache *c, kv_prefix_listener fn, void *user) {
    if (!c) return;
    c->prefix.listener = fn, c->prefix.listener_user = user;
}

int kv_prefix_clear(kv_cache *c) {
    if (!c) return KV_ERR_NULL;
    kv_prefix_listener fn = c->prefix.listener;   /* one CLEARED, not a REMOVED per page */
    c->prefix.listener = NULL;
    while (c->prefix.lru_head != KV_NO_PAGE) { /* cached pages: unreferenced, so free */
        int32_t page = c->prefix.lru_head;
        kv_lru_remove(c, page);
        kv_prefix_unname(c, page);
        c->pages.free_pages[c->pages.n_free++] = page;
    }
    for (int32_t page = 0; page < c->p.n_pages; page++) kv_prefix_unname(c, page);
    for (int32_t i = 0; i < c->p.max_seqs; i++) c->seqs[i].named_blocks = 0;
    c->prefix.listener = fn;
    if (fn) fn(c->prefix.listener_user, &(kv_prefix_event){.kind = KV_PREFIX_CLEARED});
    return KV_OK;
}
