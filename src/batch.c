/* src/batch.c - the checks every call taking a ragged batch runs before it
 * touches anything: the arrays' form, the sequences' lengths and, for a
 * window cache, that the keys the rows will attend are still there. Apart
 * from src/cache.c so that attention and the step check a batch without
 * depending on the cache's bookkeeping. */
#include "internal.h"

/* What every call taking a batch checks first: the arrays are there,
 * row_start starts at 0 and never decreases, and each id names a live
 * sequence that appears once. */
int kv_batch_form(const kv_cache *c, const kv_batch *b) {
    if (!c || !b) return KV_ERR_NULL;
    if (b->n_seqs < 0) return KV_ERR_SHAPE;
    if (b->n_seqs == 0) return KV_OK;
    if (!b->seqs || !b->row_start) return KV_ERR_NULL;
    if (b->row_start[0] != 0) return KV_ERR_SHAPE;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        int32_t seq = b->seqs[i];
        if (!kv_seq_valid(c, seq)) return KV_ERR_SEQ;
        for (int32_t j = 0; j < i; j++)
            if (b->seqs[j] == seq) return KV_ERR_DUPLICATE;
        if (b->row_start[i + 1] < b->row_start[i]) return KV_ERR_SHAPE;
    }
    return KV_OK;
}

int kv_batch_check(const kv_cache *c, const kv_batch *b, int32_t *rows) {
    *rows = 0;
    int rc = kv_batch_form(c, b);
    if (rc || b->n_seqs == 0) return rc;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        int32_t T = b->row_start[i + 1] - b->row_start[i];
        const kv_seq_state *s = &c->seqs[b->seqs[i]];
        if (T > s->len) return KV_ERR_LENGTH;
        if (T > 0 && kv_window_first_block(c, s->len - T) < s->first_block) return KV_ERR_WINDOW;
    }
    *rows = b->row_start[b->n_seqs];
    return KV_OK;
}
