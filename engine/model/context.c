/* engine/model/context.c - contexts (one cache per layer group, threads,
 * scratch), sequences kept in step across the caches, and the forward pass
 * over a ragged batch: reserve in every cache (all or nothing), positions,
 * then the architecture's layers (engine/arch_NAME.c). The same layers run
 * without a cache (llm_forward_dense), which is what cached decoding is
 * checked against. */
#include "layers.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- contexts */

llm_context_params llm_context_default_params(void) {
    return (llm_context_params){.n_ctx = 0, .n_seqs = 1, .n_batch = 256, .n_threads = 1,
                                .kv_type = KV_F16, .page_size = 16, .act_bits = -1};
}

/* Pages one sequence needs in a cache: n_ctx positions, or for a window
 * cache the window plus one batch of new rows (their keys are appended
 * before the oldest ones leave), plus the pages partly covered at each end. */
static int64_t pages_per_seq(const llm_context_params *p, int32_t window) {
    if (p->no_window) window = 0; /* every position stays */
    int64_t span = window > 0 && (int64_t)window + p->n_batch < p->n_ctx ? (int64_t)window + p->n_batch : p->n_ctx;
    return (span + p->page_size - 1) / p->page_size + (window > 0 ? 1 : 0);
}

/* The window of group g's cache: its own, or the context's override for a
 * full-attention group. */
static int32_t group_window(const llm_model *m, const llm_context_params *p, int32_t g) {
    return m->groups[g].window ? m->groups[g].window : p->window;
}

int llm_context_create(const llm_model *m, const llm_context_params *pp, llm_context **out, char *err,
                       size_t errlen) {
    *out = NULL;
    llm_context_params p = *pp;
    if (p.n_ctx == 0) p.n_ctx = m->hp.ctx_train < 4096 ? m->hp.ctx_train : 4096;
    if (p.n_ctx < 1 || p.n_ctx > (1 << 24)) return llm_errf(err, errlen, LLM_ERR_PARAM, "context size must be in [1, 2^24]");
    if (p.n_seqs < 1 || p.n_seqs > 4096) return llm_errf(err, errlen, LLM_ERR_PARAM, "sequences must be in [1, 4096]");
    if (p.n_batch < 1 || p.n_batch > 8192) return llm_errf(err, errlen, LLM_ERR_PARAM, "batch rows must be in [1, 8192]");
    if (p.n_threads < 1 || p.n_threads > 256) return llm_errf(err, errlen, LLM_ERR_PARAM, "threads must be in [1, 256]");
    if (p.page_size < 1 || p.page_size > 4096) return llm_errf(err, errlen, LLM_ERR_PARAM, "page size must be in [1, 4096]");
    if (p.no_window != 0 && p.no_window != 1) return llm_errf(err, errlen, LLM_ERR_PARAM, "no_window must be 0 or 1");
    if (p.window < 0) return llm_errf(err, errlen, LLM_ERR_PARAM, "window must be >= 0");
    if (p.n_pages < 0) return llm_errf(err, errlen, LLM_ERR_PARAM, "the page count must be >= 0");
    if (p.act_bits == -1) p.act_bits = llm_act_default_bits();
    if (p.act_bits != LLM_ACT_F32 && p.act_bits != LLM_ACT_Q8 && p.act_bits != LLM_ACT_Q16)
        return llm_errf(err, errlen, LLM_ERR_PARAM, "activation bits must be 0 (f32), 8 or 16, or -1 (default)");
    if (p.kv_type == KV_F64)
        return llm_errf(err, errlen, LLM_ERR_PARAM, "f64 K/V is for the library's reference path; use f32, f16, bf16 or q8");
    if (m->n_groups < 1 || m->n_groups > LLM_MAX_GROUPS)
        return llm_errf(err, errlen, LLM_ERR_MODEL, "the architecture declared %d cache groups", (int)m->n_groups);
    for (int32_t g = 0; g < m->n_groups; g++)
        if ((int64_t)p.n_seqs * pages_per_seq(&p, group_window(m, &p, g)) > INT32_MAX)
            return llm_errf(err, errlen, LLM_ERR_PARAM, "n_seqs x n_ctx is too large");
    llm_context *c = calloc(1, sizeof *c);
    if (!c) return llm_errf(err, errlen, LLM_ERR_NOMEM, "out of memory");
    c->m = m;
    c->p = p;
    int32_t n_order = 0;
    for (int pass = 0; pass < 2; pass++) /* full caches first: see reserve() */
        for (int32_t g = 0; g < m->n_groups; g++)
            if ((group_window(m, &p, g) > 0) == pass) c->order[n_order++] = g;
    for (int32_t g = 0; g < m->n_groups; g++) {
        kv_cache_params cp = kv_cache_default_params();
        cp.n_layers = m->groups[g].n_layers, cp.n_kv_heads = m->hp.n_kv_heads, cp.head_dim = m->hp.head_dim;
        cp.dtype = p.kv_type, cp.page_size = p.page_size;
        cp.n_pages = (int32_t)(p.n_seqs * pages_per_seq(&p, group_window(m, &p, g)));
        if (p.n_pages > 0 && group_window(m, &p, g) == 0) cp.n_pages = p.n_pages;   /* a shared, smaller pool */
        cp.max_seqs = p.n_seqs, cp.max_seq_len = p.n_ctx, cp.window = group_window(m, &p, g);
        cp.no_evict = p.no_window && cp.window > 0;
        int rc = kv_cache_create(&cp, &c->caches[g]);
        if (rc != KV_OK) {
            llm_context_free(c);
            return llm_errf(err, errlen, rc, "KV cache: %s", kv_status_str(rc));
        }
        c->n_caches++;
    }
    if (kv_pool_create(p.n_threads, &c->pool) != KV_OK) {
        llm_context_free(c);
        return llm_errf(err, errlen, LLM_ERR_NOMEM, "could not start the worker threads");
    }
    for (int32_t g = 0; g < c->n_caches; g++) kv_cache_set_pool(c->caches[g], c->pool);
    c->want_rows = malloc(2 * (size_t)p.n_batch);
    if (!c->want_rows || llm_scratch_alloc(&c->ws, &m->hp, p.n_batch)) {
        llm_context_free(c);
        return llm_errf(err, errlen, LLM_ERR_NOMEM, "out of memory for the forward scratch");
    }
    memset(c->want_rows, 0, (size_t)p.n_batch);
    memset(c->want_rows + p.n_batch, 1, (size_t)p.n_batch);
    *out = c;
    return LLM_OK;
}

void llm_context_free(llm_context *c) {
    if (!c) return;
    for (int32_t g = 0; g < c->n_caches; g++) kv_cache_free(c->caches[g]); /* before the pool they borrow */
    kv_pool_free(c->pool);
    llm_scratch_free(&c->ws);
    free(c->want_rows);
    free(c);
}

const llm_model *llm_context_model(const llm_context *c) { return c->m; }
llm_context_params llm_context_get_params(const llm_context *c) { return c->p; }
int32_t llm_context_n_caches(const llm_context *c) { return c->n_caches; }
kv_cache *llm_context_cache_at(llm_context *c, int32_t i) { return i >= 0 && i < c->n_caches ? c->caches[i] : NULL; }
kv_cache *llm_context_cache(llm_context *c) { return c->caches[0]; }

kv_cache_stats llm_context_stats(const llm_context *c) {
    kv_cache_stats t = kv_cache_get_stats(c->caches[0]);
    for (int32_t g = 1; g < c->n_caches; g++) {
        kv_cache_stats s = kv_cache_get_stats(c->caches[g]);
        t.pages_total += s.pages_total, t.pages_used += s.pages_used, t.pages_free += s.pages_free;
        t.pages_cached += s.pages_cached, t.pages_shared += s.pages_shared, t.pages_named += s.pages_named;
        t.bytes_per_token += s.bytes_per_token, t.bytes_in_use += s.bytes_in_use, t.bytes_total += s.bytes_total;
    }
    return t;
}

int llm_context_reserve_cost(llm_context *c, const kv_batch *b, int32_t window_rows, kv_reserve_cost *cost) {
    if (!c || !b || !cost || b->n_seqs < 0 || b->n_seqs > c->p.n_seqs || window_rows < 0) return LLM_ERR_NULL;
    int32_t rows[b->n_seqs + 1];
    *cost = (kv_reserve_cost){.fits = 1};
    for (int32_t g = 0; g < c->n_caches; g++) {
        kv_batch kb = *b;
        if (kv_cache_get_params(c->caches[g]).window > 0 && !c->p.no_window) {
            rows[0] = 0;
            for (int32_t i = 0; i < b->n_seqs; i++) {
                int32_t t = b->row_start[i + 1] - b->row_start[i];
                rows[i + 1] = rows[i] + (t < window_rows ? t : window_rows);
            }
            kb.row_start = rows;
        }
        kv_reserve_cost k;
        int rc = kv_batch_reserve_cost(c->caches[g], &kb, &k);
        if (rc) return rc;
        cost->fits &= k.fits;
        cost->pages_taken += k.pages_taken, cost->pages_reclaimed += k.pages_reclaimed;
        cost->pages_adopted += k.pages_adopted, cost->pages_given_back += k.pages_given_back;
        cost->used_delta += k.used_delta, cost->shared_delta += k.shared_delta;
        cost->free_delta += k.free_delta, cost->cached_delta += k.cached_delta;
    }
    return LLM_OK;
}

/* ---------------------------------------------------------------- sequences */

/* Slots are taken lowest first in every cache, and every cache sees the same
 * calls, so one id names the same sequence everywhere; checked anyway. */
int llm_seq_new(llm_context *c, int32_t *seq) {
    if (!c || !seq) return LLM_ERR_NULL;
    int rc = kv_seq_new(c->caches[0], seq);
    for (int32_t g = 1; g < c->n_caches && rc == KV_OK; g++) {
        int32_t s;
        rc = kv_seq_new(c->caches[g], &s);
        if (rc == KV_OK && s != *seq) kv_seq_remove(c->caches[g], s), rc = LLM_ERR_SEQ;
        if (rc != KV_OK)
            while (g-- > 0) kv_seq_remove(c->caches[g], *seq);
    }
    return rc;
}

int llm_seq_remove(llm_context *c, int32_t seq) {
    if (!c) return LLM_ERR_NULL;
    int rc = KV_OK;
    for (int32_t g = 0; g < c->n_caches; g++) {
        int r = kv_seq_remove(c->caches[g], seq);
        if (r) rc = r;
    }
    return rc;
}

int32_t llm_seq_length(const llm_context *c, int32_t seq) {
    return c ? kv_seq_length(c->caches[0], seq) : LLM_ERR_NULL;
}

int llm_seq_truncate(llm_context *c, int32_t seq, int32_t new_len) {
    if (!c) return LLM_ERR_NULL;
    int32_t len = kv_seq_length(c->caches[0], seq);
    if (len < 0) return len;
    if (new_len < 0 || new_len > len) return LLM_ERR_LENGTH;
    int rc = KV_OK;
    for (int32_t g = 0; g < c->n_caches; g++) {
        int r = kv_seq_truncate(c->caches[c->order[g]], seq, new_len);
        if (r) rc = r;
    }
    return rc;
}

int llm_seq_fork(llm_context *c, int32_t parent, int32_t *child) {
    if (!c || !child) return LLM_ERR_NULL;
    int rc = kv_seq_fork(c->caches[0], parent, child);
    for (int32_t g = 1; g < c->n_caches && rc == KV_OK; g++) {
        int32_t s;
        rc = kv_seq_fork(c->caches[g], parent, &s);
        if (rc == KV_OK && s != *child) kv_seq_remove(c->caches[g], s), rc = LLM_ERR_SEQ;
        if (rc != KV_OK)
            while (g-- > 0) kv_seq_remove(c->caches[g], *child);
    }
    return rc;
}

/* Each cache's longest point <= the last answer, until they agree: a full
 * group serves every point up to its match, a window group only the points
 * whose window pages it still has, so the answers only decrease. */
int llm_prefix_lookup(llm_context *c, const int32_t *tokens, int32_t n, int32_t *n_found) {
    if (!c || !n_found || (!tokens && n > 0)) return LLM_ERR_NULL;
    *n_found = 0;
    int32_t m = n;
    for (;;) {   /* a round in which no answer is below m: every cache agrees */
        int32_t lo = m;
        for (int32_t g = 0; g < c->n_caches; g++) {
            int rc = kv_prefix_lookup(c->caches[g], tokens, lo, &lo);
            if (rc) return rc;
        }
        if (lo == m) break;
        m = lo;
    }
    *n_found = m;
    return LLM_OK;
}

int llm_seq_prefix_match(llm_context *c, int32_t seq, const int32_t *tokens, int32_t n, int32_t *n_matched) {
    if (!c || !n_matched || (!tokens && n > 0)) return LLM_ERR_NULL;
    *n_matched = 0;
    int32_t m;
    int rc = llm_prefix_lookup(c, tokens, n, &m);
    if (rc) return rc;
    for (int32_t g = 0; g < c->n_caches && m > 0; g++) {
        int32_t got;
        rc = kv_seq_prefix_match(c->caches[g], seq, tokens, m, &got);
        if (rc == KV_OK && got != m) rc = LLM_ERR_SEQ;   /* cannot happen: nothing changed since the lookup */
        if (rc) {
            for (int32_t k = 0; k <= g; k++) kv_seq_truncate(c->caches[k], seq, 0);
            return rc;
        }
    }
    *n_matched = m;
    return LLM_OK;
}

int llm_seq_publish(llm_context *c, int32_t seq) {
    if (!c) return LLM_ERR_NULL;
    for (int32_t g = 0; g < c->n_caches; g++) {
        int rc = kv_seq_reserve(c->caches[g], seq, 0, NULL);
        if (rc) return rc;
    }
    return LLM_OK;
}

/* ---------------------------------------------------------------- the pass */

/* kv_batch_reserve in every cache, all or nothing. Full caches go first: if
 * a later one fails, the earlier ones are truncated back, which a full cache
 * always allows; a window cache may evict pages as it reserves, so it goes
 * last, where its own failure changes nothing. (Two window caches: the first
 * one's rollback can fail with LLM_ERR_WINDOW.) */
static int reserve(llm_context *c, const kv_batch *kb, const int32_t *tokens) {
    for (int32_t i = 0; i < c->n_caches; i++) {
        int rc = kv_batch_reserve(c->caches[c->order[i]], kb, tokens);
        if (rc == KV_OK) continue;
        while (i-- > 0)
            for (int32_t s = 0; s < kb->n_seqs; s++) {
                kv_cache *cache = c->caches[c->order[i]];
                int32_t t = kb->row_start[s + 1] - kb->row_start[s];
                kv_seq_truncate(cache, kb->seqs[s], kv_seq_length(cache, kb->seqs[s]) - t);
            }
        return rc;
    }
    return KV_OK;
}

int llm_forward(llm_context *c, const llm_batch *b, float *logits) {
    if (!c || !b || !b->seqs || !b->row_start || b->n_seqs < 1) return LLM_ERR_NULL;
    if (b->row_start[0] != 0) return LLM_ERR_SHAPE;
    for (int32_t s = 0; s < b->n_seqs; s++)
        if (b->row_start[s + 1] < b->row_start[s]) return LLM_ERR_SHAPE;
    const int32_t rows = b->row_start[b->n_seqs];
    if (rows > c->p.n_batch) return LLM_ERR_SHAPE;
    if (rows == 0) return LLM_OK;
    if (!b->tokens) return LLM_ERR_NULL;
    for (int32_t r = 0; r < rows; r++)
        if (b->tokens[r] < 0 || b->tokens[r] >= c->m->hp.n_vocab) return LLM_ERR_TOKEN;

    llm_scratch *ws = &c->ws;
    int32_t n_out = 0;
    for (int32_t s = 0; s < b->n_seqs; s++)
        for (int32_t r = b->row_start[s]; r < b->row_start[s + 1]; r++)
            if (b->want ? b->want[r] != 0 : r == b->row_start[s + 1] - 1) ws->out_rows[n_out++] = r;

    kv_batch kb = {.n_seqs = b->n_seqs, .seqs = b->seqs, .row_start = b->row_start};
    int rc = reserve(c, &kb, b->tokens);
    if (rc) return rc;  /* all or nothing: nothing changed */
    for (int32_t s = 0; s < b->n_seqs; s++) {
        int32_t t = b->row_start[s + 1] - b->row_start[s], S = kv_seq_length(c->caches[0], b->seqs[s]);
        for (int32_t i = 0; i < t; i++) ws->pos[b->row_start[s] + i] = S - t + i;
    }
    llm_pass ps = {.c = c, .ws = ws, .rows = rows, .tokens = b->tokens, .kb = &kb, .n_out = n_out, .logits = logits};
    rc = c->m->arch->forward(&ps);
    if (rc) /* undo the reserve; the positions were never visible to anyone */
        for (int32_t s = 0; s < b->n_seqs; s++) {
            int32_t t = b->row_start[s + 1] - b->row_start[s];
            llm_seq_truncate(c, b->seqs[s], kv_seq_length(c->caches[0], b->seqs[s]) - t);
        }
    return rc;
}

int llm_eval_from(llm_context *c, int32_t seq, const int32_t *tokens, int32_t n, int32_t first, float *logits,
                  llm_progress_fn progress, void *user) {
    if (!c || (!tokens && n > 0) || n < 0) return LLM_ERR_NULL;
    if (first < 0 || first > n) return LLM_ERR_SHAPE;
    int32_t start = kv_seq_length(c->caches[0], seq);
    if (start < 0) return start;
    const int32_t nb = c->p.n_batch;
    const size_t V = (size_t)c->m->hp.n_vocab;
    int rc = LLM_OK;
    for (int32_t done = 0; done < n && rc == LLM_OK;) {
        int32_t t = n - done < nb ? n - done : nb;
        int32_t rows[2] = {0, t};
        /* rows [skip, t) of this chunk return logits; NULL asks for the last row alone */
        int32_t skip = first - done < 0 ? 0 : first - done < t ? first - done : t;
        float *out = logits && skip < t ? logits + (size_t)(done + skip - first) * V : NULL;
        llm_batch b = {.n_seqs = 1, .seqs = &seq, .row_start = rows, .tokens = tokens + done,
                       .want = !out || skip == t - 1 ? NULL : c->want_rows + nb - skip};
        rc = llm_forward(c, &b, out);
        done += t;
        if (progress) progress(user, done, n);
    }
    if (rc) llm_seq_truncate(c, seq, start);
    return rc;
}

int llm_eval(llm_context *c, int32_t seq, const int32_t *tokens, int32_t n, int all, float *logits,
             llm_progress_fn progress, void *user) {
    return llm_eval_from(c, seq, tokens, n, all || n == 0 ? 0 : n - 1, logits, progress, user);
}

int llm_forward_dense(llm_context *c, const int32_t *tokens, int32_t n, int32_t first, float *logits) {
    if (!c || !tokens || !logits) return LLM_ERR_NULL;
    if (n < 1 || first < 0 || first >= n) return LLM_ERR_SHAPE;
    for (int32_t r = 0; r < n; r++)
        if (tokens[r] < 0 || tokens[r] >= c->m->hp.n_vocab) return LLM_ERR_TOKEN;
    llm_scratch ws;
    if (llm_scratch_alloc(&ws, &c->m->hp, n)) return LLM_ERR_NOMEM;
    for (int32_t r = 0; r < n; r++) ws.pos[r] = r;
    for (int32_t r = first; r < n; r++) ws.out_rows[r - first] = r;
    llm_pass ps = {.c = c, .ws = &ws, .rows = n, .tokens = tokens, .kb = NULL, .n_out = n - first, .logits = logits};
    int rc = c->m->arch->forward(&ps);
    llm_scratch_free(&ws);
    return rc;
}
