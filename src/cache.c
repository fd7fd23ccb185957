/* src/cache.c - sequences and their block tables over the pages of
 * src/pages.c, reserve
 * (all or nothing), fork with copy-on-write, truncate, window eviction, and
 * writing K/V in place. */
#include <stdlib.h>

#include "internal.h"

kv_cache_params kv_cache_default_params(void) {
    return (kv_cache_params){
        .n_layers = 1,
        .n_kv_heads = 1,
        .head_dim = 64,
        .dtype = KV_F32,
        .page_size = 16,
        .n_pages = 256,
        .max_seqs = 1,
        .max_seq_len = 0,
        .window = 0,
        .no_evict = 0,
    };
}

static int params_check(const kv_cache_params *p) {
    if (p->n_layers <= 0 || p->n_kv_heads <= 0 || p->head_dim <= 0 || p->page_size <= 0 ||
        p->n_pages <= 0 || p->max_seqs <= 0 || p->max_seq_len < 0)
        return KV_ERR_SHAPE;
    if (p->head_dim > KV_MAX_HEAD_DIM) return KV_ERR_SHAPE;
    if (!kv_type(p->dtype)) return KV_ERR_DTYPE;
    if (p->window < 0 || (p->no_evict != 0 && p->no_evict != 1)) return KV_ERR_WINDOW;
    return KV_OK;
}

int kv_cache_create(const kv_cache_params *params, kv_cache **out) {
    if (!params || !out) return KV_ERR_NULL;
    int rc = params_check(params);
    if (rc) return rc;
    kv_cache_params p = *params;
    int64_t pool_positions = (int64_t)p.n_pages * p.page_size;
    if (p.max_seq_len == 0) {
        /* a window cache recycles its pages: only the block table bounds it */
        int64_t len = p.window > 0 && !p.no_evict && pool_positions < (1 << 20) ? (1 << 20) : pool_positions;
        p.max_seq_len = len > INT32_MAX ? INT32_MAX : (int32_t)len;
    }

    kv_cache *c = calloc(1, sizeof *c);
    if (!c) return KV_ERR_NOMEM;
    c->p = p;
    c->max_blocks = (int32_t)(((int64_t)p.max_seq_len + p.page_size - 1) / p.page_size);
    rc = kv_pages_init(&c->pages, &p);
    if (rc) {
        free(c);
        return rc;
    }
    c->seqs = calloc((size_t)p.max_seqs, sizeof *c->seqs);
    c->tables = malloc((size_t)p.max_seqs * (size_t)c->max_blocks * sizeof *c->tables);
    rc = kv_prefix_init(&c->prefix, p.n_pages, p.page_size);
    c->work = kv_attend_work_create(p.max_seq_len, p.n_kv_heads);
    if (rc || !c->seqs || !c->tables || !c->work) {
        kv_cache_free(c);
        return KV_ERR_NOMEM;
    }
    for (size_t i = 0; i < (size_t)p.max_seqs * (size_t)c->max_blocks; i++) c->tables[i] = KV_NO_PAGE;
    *out = c;
    return KV_OK;
}

void kv_cache_free(kv_cache *c) {
    if (!c) return;
    kv_pages_free(&c->pages);
    free(c->seqs);
    free(c->tables);
    kv_prefix_free(&c->prefix);
    kv_attend_work_free(c->work);
    free(c);
}

void kv_cache_set_pool(kv_cache *c, kv_pool *pool) {
    if (c) kv_attend_work_set_pool(c->work, pool);
}

kv_cache_params kv_cache_get_params(const kv_cache *c) {
    return c ? c->p : (kv_cache_params){0};
}

kv_cache_stats kv_cache_get_stats(const kv_cache *c) {
    kv_cache_stats s = {0};
    if (!c) return s;
    s.pages_total = c->p.n_pages;
    s.pages_free = c->pages.n_free;
    s.pages_cached = c->prefix.n_cached;
    for (int32_t i = 0; i < c->p.n_pages; i++) {
        if (c->pages.refcount[i] > 0) s.pages_used++;
        if (c->pages.refcount[i] > 1) s.pages_shared++;
        if (c->prefix.page_named[i]) s.pages_named++;
    }
    for (int32_t i = 0; i < c->p.max_seqs; i++) s.seqs += c->seqs[i].live;
    s.bytes_per_token = kv_price_per_token(c->p.n_layers, c->p.n_kv_heads, c->p.head_dim, c->p.dtype);
    s.bytes_per_page = c->pages.page_bytes;
    s.bytes_in_use = (uint64_t)s.pages_used * c->pages.page_bytes;
    s.bytes_total = (uint64_t)c->p.n_pages * c->pages.page_bytes;
    return s;
}

/* ------------------------------------------------------------------ sequences */

static int32_t blocks_for(const kv_cache *c, int32_t len) {
    return (int32_t)(((int64_t)len + c->p.page_size - 1) / c->p.page_size);
}

int kv_seq_new(kv_cache *c, int32_t *seq) {
    if (!c || !seq) return KV_ERR_NULL;
    for (int32_t i = 0; i < c->p.max_seqs; i++) {
        if (!c->seqs[i].live) {
            c->seqs[i] = (kv_seq_state){.live = true};
            *seq = i;
            return KV_OK;
        }
    }
    return KV_ERR_SEQ;
}

int kv_seq_remove(kv_cache *c, int32_t seq) {
    if (!c) return KV_ERR_NULL;
    if (!kv_seq_valid(c, seq)) return KV_ERR_SEQ;
    kv_prefix_publish(c, seq, c->seqs[seq].len / c->p.page_size, false);
    int32_t *t = kv_table(c, seq);
    for (int32_t i = 0; i < blocks_for(c, c->seqs[seq].len); i++) {
        if (t[i] != KV_NO_PAGE) kv_page_release(c, t[i]);
        t[i] = KV_NO_PAGE;
    }
    c->seqs[seq] = (kv_seq_state){0};
    return KV_OK;
}

int32_t kv_seq_length(const kv_cache *c, int32_t seq) {
    if (!c) return KV_ERR_NULL;
    if (!kv_seq_valid(c, seq)) return KV_ERR_SEQ;
    return c->seqs[seq].len;
}

int kv_seq_fork(kv_cache *c, int32_t parent, int32_t *child) {
    if (!c || !child) return KV_ERR_NULL;
    if (!kv_seq_valid(c, parent)) return KV_ERR_SEQ;
    int32_t id;
    int rc = kv_seq_new(c, &id);
    if (rc) return rc;
    c->seqs[id] = c->seqs[parent];
    const int32_t *from = kv_table(c, parent);
    int32_t *to = kv_table(c, id);
    for (int32_t i = 0; i < blocks_for(c, c->seqs[parent].len); i++) {
        to[i] = from[i];
        if (to[i] != KV_NO_PAGE) c->pages.refcount[to[i]]++;
    }
    *child = id;
    return KV_OK;
}

/* A reserve of n_new positions of seq, on the view: the window's eviction. */
static void reserve_evict(kv_cache *c, int32_t seq, bool dry) {
    kv_seq_state *s = &c->seqs[seq];
    int32_t *t = kv_table(c, seq);
    int32_t first = kv_window_first_block(c, s->len), old_blocks = blocks_for(c, s->len);
    if (first < s->first_block) first = s->first_block;
    int32_t end = first < old_blocks ? first : old_blocks;
    for (int32_t i = s->first_block; i < end; i++) {
        if (t[i] != KV_NO_PAGE) kv_view_release(c, dry, t[i]);
        if (!dry) t[i] = KV_NO_PAGE;
    }
    if (!dry) s->first_block = first;
}

/* Then the copy of a shared partial last page and the new blocks. */
static void reserve_grow(kv_cache *c, int32_t seq, int32_t n_new, const int32_t *tokens, bool dry) {
    kv_seq_state *s = &c->seqs[seq];
    int32_t *t = kv_table(c, seq);
    const int32_t P = c->p.page_size, old_len = s->len;
    const int32_t old_blocks = blocks_for(c, old_len), new_blocks = blocks_for(c, old_len + n_new);
    if (old_len % P != 0) { /* the last page is about to change */
        int32_t last = t[old_blocks - 1];
        if (kv_view_refs(c, dry, last) > 1) {
            int32_t copy = kv_view_take(c, dry);
            kv_view_release(c, dry, last); /* still held: another sequence has it */
            if (!dry) {
                memcpy(c->pages.pool + (size_t)copy * c->pages.page_bytes,
                       c->pages.pool + (size_t)last * c->pages.page_bytes, c->pages.page_bytes);
                memcpy(c->prefix.page_tokens + (size_t)copy * P, c->prefix.page_tokens + (size_t)last * P,
                       sizeof(int32_t) * (size_t)P);
                t[old_blocks - 1] = copy;
            }
        } else if (!dry && c->prefix.page_named[last]) {
            kv_prefix_unname(c, last); /* its content will no longer match its name */
        }
    }
    for (int32_t i = old_blocks; i < new_blocks; i++) {
        int32_t page = kv_view_take(c, dry);
        if (!dry) t[i] = page;
    }
    if (dry) return;
    for (int32_t r = 0; r < n_new; r++) {
        int32_t pos = old_len + r;
        c->prefix.page_tokens[(size_t)t[pos / P] * P + pos % P] = tokens ? tokens[r] : -1;
    }
    s->len += n_new;
}

/* A batch reserve on the view, in three passes over its sequences: name
 * the pages written before it (swapping duplicates for named twins), evict
 * what the windows no longer need, then copy and take. The dry run and the
 * real one walk the same steps, so what the first counts is what the second
 * does. */
static void reserve_walk(kv_cache *c, const kv_batch *b, const int32_t *tokens, bool dry) {
    for (int pass = 0; pass < 3; pass++)
        for (int32_t i = 0; i < b->n_seqs; i++) {
            int32_t seq = b->seqs[i], n_new = b->row_start[i + 1] - b->row_start[i];
            if (pass == 0) kv_prefix_publish(c, seq, c->seqs[seq].len / c->p.page_size, dry); /* n_new 0: only this */
            else if (n_new == 0) continue;
            else if (pass == 1) reserve_evict(c, seq, dry);
            else reserve_grow(c, seq, n_new, tokens ? tokens + b->row_start[i] : NULL, dry);
        }
}

int kv_batch_reserve_cost(kv_cache *c, const kv_batch *b, kv_reserve_cost *cost) {
    int rc = kv_batch_form(c, b);
    if (rc) return rc;
    if (!cost) return KV_ERR_NULL;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        int32_t seq = b->seqs[i], n_new = b->row_start[i + 1] - b->row_start[i];
        if (n_new > c->p.max_seq_len - c->seqs[seq].len) return KV_ERR_CAPACITY;
    }
    kv_sim_begin(c);
    reserve_walk(c, b, NULL, true);
    kv_reserve_cost k = {.pages_taken = c->pages.sim_taken};
    int32_t to_free = 0;
    for (int32_t i = 0; i < c->pages.n_touched; i++) {
        int32_t page = c->pages.sim_touched[i], before = c->pages.refcount[page], after = c->pages.sim[page].rc;
        bool named = kv_view_named(c, true, page);
        if (before == 0 && after > 0) k.pages_adopted++;
        if (before > 0 && after == 0) k.pages_given_back++, to_free += !named;
        k.shared_delta += (after > 1) - (before > 1);
    }
    /* the takes come last: from the free pages, then the cached ones */
    int32_t free_then = c->pages.n_free + to_free;
    int32_t cached_then = c->prefix.n_cached - k.pages_adopted + (k.pages_given_back - to_free);
    k.fits = k.pages_taken <= free_then + cached_then;
    k.pages_reclaimed = k.pages_taken > free_then ? k.pages_taken - free_then : 0;
    k.used_delta = k.pages_taken + k.pages_adopted - k.pages_given_back;
    k.free_delta = to_free - (k.pages_taken - k.pages_reclaimed);
    k.cached_delta = -k.used_delta - k.free_delta;
    *cost = k;
    return KV_OK;
}

int kv_seq_reserve_cost(kv_cache *c, int32_t seq, int32_t n_new, kv_reserve_cost *cost) {
    int32_t rows[2] = {0, n_new};
    kv_batch b = {.n_seqs = 1, .seqs = &seq, .row_start = rows};
    return kv_batch_reserve_cost(c, &b, cost);
}

int kv_batch_reserve(kv_cache *c, const kv_batch *b, const int32_t *tokens) {
    kv_reserve_cost k;
    int rc = kv_batch_reserve_cost(c, b, &k);
    if (rc || b->n_seqs == 0) return rc;
    if (!k.fits) return KV_ERR_OUT_OF_PAGES;
    reserve_walk(c, b, tokens, false);
    return KV_OK;
}

int kv_seq_reserve(kv_cache *c, int32_t seq, int32_t n_new, const int32_t *tokens) {
    int32_t rows[2] = {0, n_new};
    kv_batch b = {.n_seqs = 1, .seqs = &seq, .row_start = rows};
    return kv_batch_reserve(c, &b, tokens);
}

int kv_seq_truncate(kv_cache *c, int32_t seq, int32_t new_len) {
    if (!c) return KV_ERR_NULL;
    if (!kv_seq_valid(c, seq)) return KV_ERR_SEQ;
    kv_seq_state *s = &c->seqs[seq];
    if (new_len < 0 || new_len > s->len) return KV_ERR_LENGTH;
    /* the next query sits at new_len; the keys it sees must still be here */
    if (new_len > 0 && new_len < s->len && kv_window_first_block(c, new_len) < s->first_block) return KV_ERR_WINDOW;
    int32_t *t = kv_table(c, seq);
    for (int32_t i = blocks_for(c, new_len); i < blocks_for(c, s->len); i++) {
        if (t[i] != KV_NO_PAGE) kv_page_release(c, t[i]);
        t[i] = KV_NO_PAGE;
    }
    s->len = new_len;
    if (s->named_blocks > new_len / c->p.page_size) s->named_blocks = new_len / c->p.page_size;
    if (new_len == 0) s->first_block = 0;
    if (s->tail_block > new_len / c->p.page_size) s->tail_block = 0;
    return KV_OK;
}

/* ------------------------------------------------------------------ batches */

static int append_rows(kv_cache *c, int32_t layer, const kv_batch *b, const void *k, const void *v,
                       bool f64) {
    if (!c || !b) return KV_ERR_NULL;
    if (kv_type_f64(c->p.dtype) != f64) return KV_ERR_DTYPE;
    if (layer < 0 || layer >= c->p.n_layers) return KV_ERR_SHAPE;
    int32_t rows;
    int rc = kv_batch_check(c, b, &rows);
    if (rc) return rc;
    if (rows == 0) return KV_OK;
    if (!k || !v) return KV_ERR_NULL;
    const int32_t P = c->p.page_size, Hkv = c->p.n_kv_heads, d = c->p.head_dim;
    /* all checks before the first write: a refused call changes nothing */
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const kv_seq_state *s = &c->seqs[b->seqs[i]];
        const int32_t *t = kv_table(c, b->seqs[i]);
        int32_t T = b->row_start[i + 1] - b->row_start[i];
        for (int32_t blk = (s->len - T) / P; T > 0 && blk <= (s->len - 1) / P; blk++)
            if (c->pages.refcount[t[blk]] > 1 || c->prefix.page_named[t[blk]]) return KV_ERR_SHARED;
    }
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const kv_seq_state *s = &c->seqs[b->seqs[i]];
        const int32_t *t = kv_table(c, b->seqs[i]);
        int32_t T = b->row_start[i + 1] - b->row_start[i];
        for (int32_t r = 0; r < T; r++) {
            int32_t pos = s->len - T + r, page = t[pos / P], slot = pos % P;
            size_t row = (size_t)(b->row_start[i] + r) * (size_t)Hkv * (size_t)d;
            for (int32_t h = 0; h < Hkv; h++) {
                for (int kv = 0; kv < 2; kv++) {
                    unsigned char *dst = kv_page_head(c, page, layer, kv, h) + (size_t)slot * c->pages.row_bytes;
                    const void *src = kv == 0 ? k : v;
                    if (f64) {
                        memcpy(dst, (const double *)src + row + (size_t)h * d, (size_t)d * sizeof(double));
                    } else {
                        kv_store_row(c->p.dtype, dst, kv_page_row_scales(c, page, layer, kv, h, slot),
                                     (const float *)src + row + (size_t)h * d, d);
                    }
                }
            }
        }
    }
    return KV_OK;
}

int kv_append_f64(kv_cache *c, int32_t layer, const kv_batch *b, const double *k, const double *v) {
    return append_rows(c, layer, b, k, v, true);
}

int kv_append_f32(kv_cache *c, int32_t layer, const kv_batch *b, const float *k, const float *v) {
    return append_rows(c, layer, b, k, v, false);
}

static int read_rows(const kv_cache *c, int32_t layer, int32_t seq, int32_t pos, int32_t n, void *k,
                     void *v, bool f64) {
    if (!c) return KV_ERR_NULL;
    if (kv_type_f64(c->p.dtype) != f64) return KV_ERR_DTYPE;
    if (layer < 0 || layer >= c->p.n_layers || n < 0) return KV_ERR_SHAPE;
    if (!kv_seq_valid(c, seq)) return KV_ERR_SEQ;
    const kv_seq_state *s = &c->seqs[seq];
    const int32_t P = c->p.page_size, Hkv = c->p.n_kv_heads, d = c->p.head_dim;
    if (pos < 0 || pos > s->len - n) return KV_ERR_LENGTH;
    if (n > 0 && pos / P < s->first_block) return KV_ERR_WINDOW;
    if (n > 0 && (!k || !v)) return KV_ERR_NULL;
    const int32_t *t = kv_table(c, seq);
    for (int32_t r = 0; r < n; r++) {
        int32_t page = t[(pos + r) / P], slot = (pos + r) % P;
        for (int32_t h = 0; h < Hkv; h++) {
            for (int kv = 0; kv < 2; kv++) {
                const unsigned char *src = kv_page_head(c, page, layer, kv, h) + (size_t)slot * c->pages.row_bytes;
                size_t off = ((size_t)r * Hkv + (size_t)h) * (size_t)d;
                void *dst = kv == 0 ? k : v;
                if (f64) {
                    memcpy((double *)dst + off, src, (size_t)d * sizeof(double));
                } else {
                    kv_load_row(c->p.dtype, src, kv_page_row_scales(c, page, layer, kv, h, slot), (float *)dst + off,
                                d);
                }
            }
        }
    }
    return KV_OK;
}

int kv_read_f64(const kv_cache *c, int32_t layer, int32_t seq, int32_t pos, int32_t n, double *k, double *v) {
    return read_rows(c, layer, seq, pos, n, k, v, true);
}

int kv_read_f32(const kv_cache *c, int32_t layer, int32_t seq, int32_t pos, int32_t n, float *k, float *v) {
    return read_rows(c, layer, seq, pos, n, k, v, false);
}
