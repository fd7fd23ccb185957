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
    px->parent_hash = calloc((size_t)n_pages, sizeof *px->parent_hash);
    px->page_parent = calloc((size_t)n_pages, sizeof *px->page_parent);
    px->page_gen = calloc((size_t)n_pages, sizeof *px->page_gen);
    px->parent_gen = calloc((size_t)n_pages, sizeof *px->parent_gen);
    px->page_named = calloc((size_t)n_pages, sizeof *px->page_named);
    px->lru_prev = malloc((size_t)n_pages * sizeof *px->lru_prev);
    px->lru_next = malloc((size_t)n_pages * sizeof *px->lru_next);
    px->hash_slots = malloc(px->hash_cap * sizeof *px->hash_slots);
    if (!px->page_tokens || !px->page_hash || !px->parent_hash || !px->page_parent || !px->page_gen || !px->parent_gen ||
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
    free(px->parent_hash);
    free(px->page_parent);
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

static const int32_t *tokens_of(const kv_cache *c, int32_t page) {
    return c->prefix.page_tokens + (size_t)page * (size_t)c->p.page_size;
}

/* The named page with this hash, parent and tokens, or KV_NO_PAGE. */
static int32_t find(const kv_cache *c, uint64_t h, int32_t parent, const int32_t *tokens) {
    for (uint32_t i = kv_name_slot(c, h);; i = (i + 1) & (c->prefix.hash_cap - 1)) {
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
    for (uint32_t i = kv_name_slot(c, h);; i = (i + 1) & (c->prefix.hash_cap - 1)) {
        int32_t p = c->prefix.hash_slots[i];
        if (p == KV_NO_PAGE) return KV_NO_PAGE;
        if (c->prefix.page_hash[p] == h && c->prefix.page_parent[p] != KV_NO_PAGE && c->prefix.parent_hash[p] == ph &&
            memcmp(tokens_of(c, p), tokens, sizeof(int32_t) * (size_t)c->p.page_size) == 0)
            return p;
    }
}

/* Names page h after parent (KV_LOST_PAGE: after a block without a page,
 * whose name was parent_hash). */
static void name_page_after(kv_cache *c, int32_t page, uint64_t h, int32_t parent, uint64_t parent_hash) {
    const bool real = parent >= 0;
    c->prefix.page_hash[page] = h;
    c->prefix.page_parent[page] = parent;
    c->prefix.parent_gen[page] = real ? c->prefix.page_gen[parent] : 0;
    c->prefix.parent_hash[page] = real ? c->prefix.page_hash[parent] : parent_hash;
    c->prefix.page_gen[page]++;
    c->prefix.page_named[page] = true;
    uint32_t i = kv_name_slot(c, h);
    while (c->prefix.hash_slots[i] != KV_NO_PAGE) i = (i + 1) & (c->prefix.hash_cap - 1);
    c->prefix.hash_slots[i] = page;
    if (c->prefix.listener)   /* once per full page, never per token */
        c->prefix.listener(c->prefix.listener_user,
                           &(kv_prefix_event){KV_PREFIX_STORED, h, c->prefix.parent_hash[page], parent != KV_NO_PAGE,
                                              tokens_of(c, page), c->p.page_size});
}

static void name_page(kv_cache *c, int32_t page, uint64_t h, int32_t parent) {
    name_page_after(c, page, h, parent, 0);
}

/* ------------------------------------------------------------------ naming */

bool kv_view_named(kv_cache *c, bool dry, int32_t page) {
    if (c->prefix.page_named[page]) return true;
    const kv_page_sim *e = &c->pages.sim[page];
    return dry && e->stamp == c->pages.sim_call && e->named;
}

/* The name of a named page in the view. */
static uint64_t view_hash(kv_cache *c, bool dry, int32_t page) {
    return c->prefix.page_named[page] || !dry ? c->prefix.page_hash[page] : c->pages.sim[page].hash;
}

/* find() in the view: a dry run also sees the names it gave. */
static int32_t view_find(kv_cache *c, bool dry, uint64_t h, int32_t parent, const int32_t *tokens) {
    int32_t p = find(c, h, parent, tokens);
    if (p != KV_NO_PAGE || !dry) return p;
    if (parent != KV_NO_PAGE && c->pages.sim[parent].stamp != c->pages.sim_call) return KV_NO_PAGE;
    for (p = parent == KV_NO_PAGE ? c->pages.sim_roots : c->pages.sim[parent].children; p != KV_NO_PAGE;
         p = c->pages.sim[p].next)
        if (c->pages.sim[p].hash == h && memcmp(tokens_of(c, p), tokens, sizeof(int32_t) * (size_t)c->p.page_size) == 0)
            return p;
    return KV_NO_PAGE;
}

static void view_name(kv_cache *c, bool dry, int32_t page, uint64_t h, int32_t parent) {
    if (!dry) {
        name_page(c, page, h, parent);
        return;
    }
    kv_page_sim *e = kv_sim_of(c, page);
    e->named = true, e->hash = h, e->parent = parent;
    int32_t *head = parent == KV_NO_PAGE ? &c->pages.sim_roots : &kv_sim_of(c, parent)->children;
    e->next = *head, *head = page;
}

/* Names one full block (page, after parent) in the view, or finds its named
 * twin and holds that instead. Returns the page the block holds then. */
static int32_t publish_block(kv_cache *c, bool dry, int32_t page, int32_t parent) {
    if (kv_view_named(c, dry, page)) return page; /* shared from a fork or a prefix hit */
    if (parent != KV_NO_PAGE && !kv_view_named(c, dry, parent)) return page; /* the chain is broken */
    const int32_t *tok = tokens_of(c, page);
    for (int32_t j = 0; j < c->p.page_size; j++)
        if (tok[j] < 0) return page;
    uint64_t h = chain_hash(c, parent == KV_NO_PAGE ? 0 : view_hash(c, dry, parent), tok);
    int32_t twin = view_find(c, dry, h, parent, tok);
    if (twin == KV_NO_PAGE) {
        view_name(c, dry, page, h, parent);
        return page;
    }
    /* The same tokens after the same parent are named already (the sequence
     * prefilled without a lookup): hold the named twin instead, so the chain
     * goes on through it and this block's successors can be named and found.
     * Not when that would add a used page (a cached twin for a duplicate
     * another sequence keeps): naming never makes pages_used grow. */
    if (kv_view_refs(c, dry, twin) == 0 && kv_view_refs(c, dry, page) > 1) return page;
    kv_view_hold(c, dry, twin);
    kv_view_release(c, dry, page);
    return twin;
}

void kv_prefix_publish(kv_cache *c, int32_t seq, int32_t upto, bool dry) {
    kv_seq_state *s = &c->seqs[seq];
    if (upto <= s->named_blocks) return;
    int32_t *t = kv_table(c, seq);
    int32_t parent = s->named_blocks > 0 ? t[s->named_blocks - 1] : KV_NO_PAGE;
    for (int32_t i = s->named_blocks; i < upto; i++) {
        if (t[i] == KV_NO_PAGE || (i > 0 && parent == KV_NO_PAGE)) { /* evicted unnamed: the chain is broken */
            parent = KV_NO_PAGE;
            continue;
        }
        parent = publish_block(c, dry, t[i], parent);
        if (!dry) t[i] = parent;
    }
    if (!dry) s->named_blocks = upto;
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
        if (i < first || i >= k) t[i] = KV_NO_PAGE;
        else kv_view_hold(c, false, t[i]);
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

/* ------------------------------------------------------------------ a tier below */

void kv_cache_set_spill(kv_cache *c, kv_spill_fn fn, void *user) {
    if (!c) return;
    c->pages.spill = fn, c->pages.spill_user = user;
}

int kv_prefix_spill_all(kv_cache *c) {
    if (!c) return KV_ERR_NULL;
    if (!c->pages.spill) return KV_OK;
    for (int32_t page = 0; page < c->p.n_pages; page++)
        if (c->prefix.page_named[page]) kv_page_spill(c, page);
    return KV_OK;
}

int kv_prefix_hashes(const kv_cache *c, const int32_t *tokens, int32_t n, uint64_t *hashes) {
    if (!c || !hashes || (n > 0 && !tokens)) return KV_ERR_NULL;
    if (n < 0) return KV_ERR_SHAPE;
    uint64_t h = 0;
    for (int32_t i = 0; i < n / c->p.page_size; i++) hashes[i] = h = chain_hash(c, h, tokens + (size_t)i * c->p.page_size);
    return KV_OK;
}

/* Where seq's next page would chain from: KV_OK when seq ends on a named
 * page boundary, with *parent its last page (KV_NO_PAGE: none; KV_LOST_PAGE:
 * a block skipped to, named *parent_hash). */
static int next_parent(const kv_cache *c, int32_t seq, int32_t *parent, uint64_t *parent_hash) {
    if (seq < 0 || seq >= c->p.max_seqs || !c->seqs[seq].live) return KV_ERR_SEQ;
    const kv_seq_state *s = &c->seqs[seq];
    const int32_t P = c->p.page_size, n = s->len / P;
    if (s->len % P != 0 || s->named_blocks != n) return KV_ERR_LENGTH;
    *parent = n > 0 ? kv_table(c, seq)[n - 1] : KV_NO_PAGE;
    if (n > 0 && *parent == KV_NO_PAGE && s->tail_block == n) {
        *parent = KV_LOST_PAGE, *parent_hash = s->tail_hash;
        return KV_OK;
    }
    if (n > 0 && (*parent == KV_NO_PAGE || !c->prefix.page_named[*parent])) return KV_ERR_LENGTH;
    *parent_hash = n > 0 ? c->prefix.page_hash[*parent] : 0;
    return KV_OK;
}

int kv_seq_prefix_next(const kv_cache *c, int32_t seq, const int32_t *tokens, uint64_t *hash, uint64_t *parent_hash,
                       int *has_parent) {
    if (!c || !tokens || !hash || !parent_hash || !has_parent) return KV_ERR_NULL;
    int32_t parent;
    int rc = next_parent(c, seq, &parent, parent_hash);
    if (rc) return rc;
    *has_parent = parent != KV_NO_PAGE;
    *hash = chain_hash(c, *parent_hash, tokens);
    return KV_OK;
}

int kv_seq_prefix_skip(kv_cache *c, int32_t seq, const int32_t *tokens, int32_t n) {
    if (!c || (n > 0 && !tokens)) return KV_ERR_NULL;
    if (seq < 0 || seq >= c->p.max_seqs || !c->seqs[seq].live) return KV_ERR_SEQ;
    if (c->p.window == 0 || c->p.no_evict) return KV_ERR_WINDOW;
    kv_seq_state *s = &c->seqs[seq];
    const int32_t P = c->p.page_size;
    if (n < 0 || n % P != 0 || n < s->len || n > c->p.max_seq_len || s->len % P != 0 || s->named_blocks != s->len / P)
        return KV_ERR_LENGTH;
    if (n == s->len) return KV_OK;
    uint64_t h = 0;
    for (int32_t i = 0; i < n / P; i++) h = chain_hash(c, h, tokens + (size_t)i * P);
    int32_t *t = kv_table(c, seq);
    for (int32_t i = s->first_block; i < s->len / P; i++) {
        if (t[i] != KV_NO_PAGE) kv_page_release(c, t[i]);
        t[i] = KV_NO_PAGE;
    }
    s->len = n;
    s->first_block = s->named_blocks = s->tail_block = n / P;
    s->tail_hash = h;
    return KV_OK;
}

int kv_seq_prefix_load(kv_cache *c, int32_t seq, const int32_t *tokens, const void *data, size_t bytes) {
    if (!c || !tokens || !data) return KV_ERR_NULL;
    int32_t parent;
    uint64_t ph;
    int rc = next_parent(c, seq, &parent, &ph);
    if (rc) return rc;
    if (bytes != c->pages.page_bytes) return KV_ERR_SHAPE;
    const int32_t P = c->p.page_size;
    kv_seq_state *s = &c->seqs[seq];
    if (s->len > c->p.max_seq_len - P) return KV_ERR_CAPACITY;
    for (int32_t j = 0; j < P; j++)
        if (tokens[j] < 0) return KV_ERR_SHAPE;
    uint64_t h = chain_hash(c, ph, tokens);
    int32_t page = parent == KV_LOST_PAGE ? find_after(c, h, ph, tokens) : find(c, h, parent, tokens);
    if (page != KV_NO_PAGE) {
        kv_view_hold(c, false, page);
    } else {
        if (c->pages.n_free + c->prefix.n_cached == 0) return KV_ERR_OUT_OF_PAGES;
        page = kv_page_take(c);
        memcpy(c->pages.pool + (size_t)page * c->pages.page_bytes, data, bytes);
        memcpy(c->prefix.page_tokens + (size_t)page * P, tokens, sizeof(int32_t) * (size_t)P);
        name_page_after(c, page, h, parent, ph);
    }
    kv_table(c, seq)[s->len / P] = page;
    s->len += P;
    s->named_blocks++;
    return KV_OK;
}
