/* src/shift.c - moving cached keys to other positions: re-rotating the
 * cached K of a sequence by a position delta, and the context shift that
 * drops a run of positions and renumbers the ones after it (StreamingLLM's
 * attention sinks, llama.cpp's n_keep / n_discard).
 *
 * Positions in a paged cache are indices into the block table, so a shift
 * moves the K/V rows after the hole down by n_discard (one pass, ascending,
 * which never overwrites a row before it is read: the source of position q is
 * q + n_discard > q), turning each K row by -n_discard on the way. Every page
 * written is made private first (copy-on-write), so no other sequence or the
 * prefix cache sees a change; moved positions lose their token ids, so their
 * pages, and every page after them, can never be named for the prefix cache
 * (their K/V were computed with other tokens before them). */
#include "internal.h"

static int32_t blocks_of(const kv_cache *c, int32_t len) {
    return (int32_t)(((int64_t)len + c->p.page_size - 1) / c->p.page_size);
}

/* The first block a query at `pos` can see in a window cache (0 otherwise). */
static int32_t window_first(const kv_cache *c, int32_t pos) {
    int64_t lowest_key = (int64_t)pos - c->p.window + 1;
    return c->p.window == 0 || lowest_key <= 0 ? 0 : (int32_t)(lowest_key / c->p.page_size);
}

/* Pages that writing blocks [b0, b1) of seq takes: one per shared or missing block. */
static int32_t private_needed(const kv_cache *c, int32_t seq, int32_t b0, int32_t b1) {
    const int32_t *t = kv_table(c, seq);
    int32_t n = 0;
    for (int32_t i = b0; i < b1; i++) n += t[i] == KV_NO_PAGE || c->pages.refcount[t[i]] > 1;
    return n;
}

/* Makes every block of [b0, b1) a page seq alone holds and nobody can find by
 * name: a shared page is copied, a missing one (evicted by a window) taken
 * zeroed. The caller checked that private_needed pages are available. */
static void make_private(kv_cache *c, int32_t seq, int32_t b0, int32_t b1) {
    int32_t *t = kv_table(c, seq);
    const int32_t P = c->p.page_size;
    for (int32_t i = b0; i < b1; i++) {
        int32_t old = t[i];
        if (old != KV_NO_PAGE && c->pages.refcount[old] == 1) {
            kv_prefix_unname(c, old);
            continue;
        }
        int32_t page = kv_page_take(c);
        unsigned char *dst = c->pages.pool + (size_t)page * c->pages.page_bytes;
        if (old == KV_NO_PAGE) {
            memset(dst, 0, c->pages.page_bytes);
            for (int32_t j = 0; j < P; j++) c->prefix.page_tokens[(size_t)page * P + j] = -1;
        } else {
            memcpy(dst, c->pages.pool + (size_t)old * c->pages.page_bytes, c->pages.page_bytes);
            memcpy(c->prefix.page_tokens + (size_t)page * P, c->prefix.page_tokens + (size_t)old * P, sizeof(int32_t) * (size_t)P);
            c->pages.refcount[old]--; /* still > 0: another sequence holds it */
        }
        t[i] = page;
    }
}

/* Where one position's rows of one layer, K or V, of head h live. */
static unsigned char *row_at(const kv_cache *c, int32_t page, int32_t slot, int32_t layer, int kv, int32_t h) {
    return kv_page_head(c, page, layer, kv, h) + (size_t)slot * c->pages.row_bytes;
}

/* K of (src page, slot) turned by the angles cs, sn, written to (dst page,
 * slot) of the same layer and head; src may equal dst. f64 turns as stored;
 * the other types decode to f32, turn in double and encode again, which costs
 * one more rounding of the storage type (see kv_seq_rerotate). */
static void turn_k(const kv_cache *c, const kv_rope *rope, const double *cs, const double *sn, int32_t layer,
                   int32_t h, int32_t src_page, int32_t src_slot, int32_t dst_page, int32_t dst_slot) {
    const int32_t d = c->p.head_dim;
    double x[KV_MAX_HEAD_DIM];
    float f[KV_MAX_HEAD_DIM];
    const unsigned char *src = row_at(c, src_page, src_slot, layer, 0, h);
    unsigned char *dst = row_at(c, dst_page, dst_slot, layer, 0, h);
    if (kv_type_f64(c->p.dtype)) {
        memcpy(x, src, sizeof(double) * (size_t)d);
        kv_rope_turn_row(rope, x, cs, sn);
        memcpy(dst, x, sizeof(double) * (size_t)d);
        return;
    }
    kv_load_row(c->p.dtype, src, kv_page_row_scales(c, src_page, layer, 0, h, src_slot), f, d);
    for (int32_t i = 0; i < d; i++) x[i] = f[i];
    kv_rope_turn_row(rope, x, cs, sn);
    for (int32_t i = 0; i < d; i++) f[i] = (float)x[i];
    kv_store_row(c->p.dtype, dst, kv_page_row_scales(c, dst_page, layer, 0, h, dst_slot), f, d);
}

/* V (and a K left unturned) of one position copied as stored, scales included. */
static void copy_rows(const kv_cache *c, int kv, int32_t layer, int32_t h, int32_t src_page, int32_t src_slot,
                      int32_t dst_page, int32_t dst_slot) {
    memmove(row_at(c, dst_page, dst_slot, layer, kv, h), row_at(c, src_page, src_slot, layer, kv, h),
            c->pages.row_bytes);
    if (c->pages.row_scales)
        memmove(kv_page_row_scales(c, dst_page, layer, kv, h, dst_slot),
                kv_page_row_scales(c, src_page, layer, kv, h, src_slot), (size_t)c->pages.row_scales * sizeof(float));
}

static int rope_for(const kv_cache *c, const kv_rope *rope) {
    return rope && rope->params.head_dim != c->p.head_dim ? KV_ERR_ROPE : KV_OK;
}

int kv_seq_rerotate(kv_cache *c, int32_t seq, int32_t pos, int32_t n, int32_t delta, const kv_rope *rope) {
    if (!c || !rope) return KV_ERR_NULL;
    if (seq < 0 || seq >= c->p.max_seqs || !c->seqs[seq].live) return KV_ERR_SEQ;
    int rc = rope_for(c, rope);
    if (rc) return rc;
    kv_seq_state *s = &c->seqs[seq];
    const int32_t P = c->p.page_size;
    if (n < 0 || pos < 0 || pos > s->len - n) return KV_ERR_LENGTH;
    if (n == 0 || delta == 0) return KV_OK;
    if (pos / P < s->first_block) return KV_ERR_WINDOW;
    const int32_t b0 = pos / P, b1 = blocks_of(c, pos + n);
    if (private_needed(c, seq, b0, b1) > c->pages.n_free + c->prefix.n_cached) return KV_ERR_OUT_OF_PAGES;
    make_private(c, seq, b0, b1);
    double cs[KV_MAX_HEAD_DIM / 2], sn[KV_MAX_HEAD_DIM / 2];
    kv_rope_turn_angles(rope, (double)delta, cs, sn);
    const int32_t *t = kv_table(c, seq);
    for (int32_t q = pos; q < pos + n; q++) {
        int32_t page = t[q / P], slot = q % P;
        for (int32_t l = 0; l < c->p.n_layers; l++)
            for (int32_t h = 0; h < c->p.n_kv_heads; h++) turn_k(c, rope, cs, sn, l, h, page, slot, page, slot);
        c->prefix.page_tokens[(size_t)page * P + slot] = -1; /* no longer what a fresh pass over its token gives */
    }
    if (s->named_blocks > b0) s->named_blocks = b0;
    return KV_OK;
}

int kv_seq_shift(kv_cache *c, int32_t seq, int32_t n_keep, int32_t n_discard, const kv_rope *rope) {
    if (!c) return KV_ERR_NULL;
    if (seq < 0 || seq >= c->p.max_seqs || !c->seqs[seq].live) return KV_ERR_SEQ;
    int rc = rope_for(c, rope);
    if (rc) return rc;
    kv_seq_state *s = &c->seqs[seq];
    const int32_t P = c->p.page_size, len = s->len;
    if (n_keep < 0 || n_discard < 0 || n_keep > len - n_discard) return KV_ERR_LENGTH;
    if (n_discard == 0) return KV_OK;
    const int32_t new_len = len - n_discard, first_present = s->first_block * P;
    /* lo: the lowest new position that will hold a key. A window may have
     * evicted the sinks and some of what moves down; the next query (at
     * new_len) must still find every key it sees. */
    int32_t lo = first_present <= n_keep ? first_present : first_present - n_discard;
    if (lo < n_keep && first_present > n_keep) lo = n_keep;
    if (c->p.window > 0 && new_len > 0 && (int64_t)lo > (int64_t)new_len - c->p.window + 1 && lo > 0)
        return KV_ERR_WINDOW;
    const int32_t new_first = window_first(c, new_len);
    const int32_t w0 = n_keep > new_first * P ? n_keep : new_first * P; /* first position written */
    const int32_t b0 = w0 / P, b1 = blocks_of(c, new_len);
    int32_t *t = kv_table(c, seq);
    int32_t freed = 0; /* blocks below the new window, which hold no key that moves */
    for (int32_t i = s->first_block; i < new_first && i < b0; i++) freed += t[i] != KV_NO_PAGE && c->pages.refcount[t[i]] == 1;
    if (b0 < b1 && private_needed(c, seq, b0, b1) > c->pages.n_free + c->prefix.n_cached + freed) return KV_ERR_OUT_OF_PAGES;

    /* nothing fails from here */
    for (int32_t i = s->first_block; i < new_first && i < b0; i++) {
        if (t[i] != KV_NO_PAGE) kv_page_release(c, t[i]);
        t[i] = KV_NO_PAGE;
    }
    if (b0 < b1) make_private(c, seq, b0, b1);
    double cs[KV_MAX_HEAD_DIM / 2], sn[KV_MAX_HEAD_DIM / 2];
    if (rope) kv_rope_turn_angles(rope, -(double)n_discard, cs, sn);
    for (int32_t q = w0; q < new_len; q++) {
        int32_t src = q + n_discard, dst_page = t[q / P], dst_slot = q % P;
        if (src < first_present) { /* evicted: the slot stays zero, and no query sees it */
            for (int32_t l = 0; l < c->p.n_layers; l++)
                for (int kv = 0; kv < 2; kv++)
                    for (int32_t h = 0; h < c->p.n_kv_heads; h++) {
                        memset(row_at(c, dst_page, dst_slot, l, kv, h), 0, c->pages.row_bytes);
                        if (c->pages.row_scales)
                            memset(kv_page_row_scales(c, dst_page, l, kv, h, dst_slot), 0,
                                   (size_t)c->pages.row_scales * sizeof(float));
                    }
        } else {
            int32_t src_page = t[src / P], src_slot = src % P;
            for (int32_t l = 0; l < c->p.n_layers; l++)
                for (int32_t h = 0; h < c->p.n_kv_heads; h++) {
                    if (rope)
                        turn_k(c, rope, cs, sn, l, h, src_page, src_slot, dst_page, dst_slot);
                    else
                        copy_rows(c, 0, l, h, src_page, src_slot, dst_page, dst_slot);
                    copy_rows(c, 1, l, h, src_page, src_slot, dst_page, dst_slot);
                }
        }
        c->prefix.page_tokens[(size_t)dst_page * P + dst_slot] = -1;
    }
    for (int32_t i = b1; i < blocks_of(c, len); i++) { /* the tail the rows came from */
        if (t[i] != KV_NO_PAGE) kv_page_release(c, t[i]);
        t[i] = KV_NO_PAGE;
    }
    s->len = new_len;
    /* every block from the window's first on now has a page: below n_keep
     * the sinks still there (the window check made sure), above it a moved
     * or zeroed row */
    s->first_block = new_first;
    if (s->named_blocks > b0) s->named_blocks = b0;
    return KV_OK;
}
