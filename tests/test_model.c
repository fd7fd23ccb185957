/* tests/test_model.c - a model-based random test of the paged cache: 10,000+
 * mixed operations (reserve/append/attend in batches, fork, truncate, remove,
 * window eviction, prefix reuse), each checked against a plain reference
 * model of what every sequence must hold.
 *
 * The reference model is tiny because K/V here are a pure function of the
 * token prefix (as in a real model): kv_of(tokens[0..p], layer) is computed
 * from a hash of the prefix, so what any sequence must hold follows from its
 * tokens alone, and a prefix-cache hit is right exactly when it returns the
 * same numbers as computing them cold. */
#include <string.h>

#include "helpers.h"
#include "snapshot.h"

enum { LAYERS = 2, HKV = 2, HD = 8, HQ = 4, PAGE = 4, PAGES = 48, SEQS = 6, MAXLEN = 96, VOCAB = 3 };

typedef struct {
    bool live;
    int32_t id;           /* the cache's sequence id */
    int32_t len;
    int32_t tokens[MAXLEN];
} model_seq;

static uint64_t prefix_hash(const int32_t *tokens, int32_t n) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint64_t)(tokens[i] + 1)) * 1099511628211ull;
    return h;
}

/* K and V [HKV][HD] of the last position of tokens[0..n) in `layer`. */
static void kv_of(const int32_t *tokens, int32_t n, int layer, double *k, double *v) {
    test_rng r = {prefix_hash(tokens, n) * 31 + (uint64_t)layer};
    for (int i = 0; i < HKV * HD; i++) k[i] = test_rng_uniform(&r), v[i] = test_rng_uniform(&r);
}

/* Every position the cache still holds for m equals kv_of. */
static void check_contents(const kv_cache *c, const model_seq *m, int window) {
    CHECK_EQ_INT(kv_seq_length(c, m->id), m->len);
    int32_t from = window > 0 && m->len - window + 1 > 0 ? m->len - window + 1 : 0;
    double k[HKV * HD], v[HKV * HD], ek[HKV * HD], ev[HKV * HD];
    for (int l = 0; l < LAYERS; l++)
        for (int32_t p = from; p < m->len; p++) {
            CHECK_EQ_INT(kv_read_f64(c, l, m->id, p, 1, k, v), KV_OK);
            kv_of(m->tokens, p + 1, l, ek, ev);
            if (memcmp(k, ek, sizeof k) || memcmp(v, ev, sizeof v))
                test_fail(__FILE__, __LINE__, "seq %d position %d layer %d holds the wrong K/V", m->id, p, l);
        }
}

/* Structural invariants: every page is used, free or cached, and the
 * reference counts are exactly the block-table references. */
static void check_pool(const kv_cache *c) {
    kv_cache_stats st = kv_cache_get_stats(c);
    CHECK_EQ_INT(st.pages_used + st.pages_free + st.pages_cached, st.pages_total);
    int32_t refs[PAGES] = {0};
    for (int32_t s = 0; s < c->p.max_seqs; s++) {
        if (!c->seqs[s].live) continue;
        const int32_t *t = kv_table(c, s);
        for (int32_t b = 0; b < (c->seqs[s].len + PAGE - 1) / PAGE; b++)
            if (t[b] != KV_NO_PAGE) refs[t[b]]++;
    }
    for (int p = 0; p < PAGES; p++)
        if (refs[p] != c->pages.refcount[p]) test_fail(__FILE__, __LINE__, "page %d: refcount %d, referenced %d", p, c->pages.refcount[p], refs[p]);
    /* the name table: exactly the named pages, each reachable by probing from its home slot */
    int32_t in_table = 0;
    for (uint32_t i = 0; i < c->prefix.hash_cap; i++) in_table += c->prefix.hash_slots[i] != KV_NO_PAGE;
    CHECK_EQ_INT(in_table, st.pages_named);
    for (int p = 0; p < PAGES; p++) {
        if (!c->prefix.page_named[p]) continue;
        uint64_t h = c->prefix.page_hash[p];
        uint32_t i = (uint32_t)(h ^ (h >> 32)) & (c->prefix.hash_cap - 1);
        while (c->prefix.hash_slots[i] != p && c->prefix.hash_slots[i] != KV_NO_PAGE) i = (i + 1) & (c->prefix.hash_cap - 1);
        if (c->prefix.hash_slots[i] != p) test_fail(__FILE__, __LINE__, "named page %d is unreachable", p);
    }
}

/* One batched step: some live sequences get 1..6 new tokens; reserve, append
 * kv_of for every layer, attend random queries and compare with the oracle. */
static void op_step(test_rng *r, kv_cache *c, model_seq *ms, int window) {
    int32_t seqs[SEQS], rows[SEQS + 1] = {0}, who[SEQS], tokens[SEQS * 6];
    int n = 0;
    for (int i = 0; i < SEQS; i++) {
        if (!ms[i].live || test_rng_int(r, 0, 1)) continue;
        int t = test_rng_int(r, 1, 6);
        if (ms[i].len + t > MAXLEN) continue;
        for (int j = 0; j < t; j++) tokens[rows[n] + j] = test_rng_int(r, 0, VOCAB - 1);
        seqs[n] = ms[i].id, who[n] = i, rows[n + 1] = rows[n] + t, n++;
    }
    if (n == 0) return;
    kv_batch b = {.n_seqs = n, .seqs = seqs, .row_start = rows};
    snapshot before = snap(c);
    int rc = kv_batch_reserve(c, &b, tokens);
    if (rc == KV_ERR_OUT_OF_PAGES) {
        if (!snap_equal(c, &before)) test_fail(__FILE__, __LINE__, "a refused reserve changed the cache");
        snap_free(&before);
        return;
    }
    snap_free(&before);
    CHECK_EQ_INT(rc, KV_OK);
    int total = rows[n];
    double *k = malloc(sizeof(double) * total * HKV * HD), *v = malloc(sizeof(double) * total * HKV * HD);
    for (int i = 0; i < n; i++) {
        model_seq *m = &ms[who[i]];
        for (int j = rows[i]; j < rows[i + 1]; j++) m->tokens[m->len++] = tokens[j];
    }
    for (int l = 0; l < LAYERS; l++) {
        for (int i = 0; i < n; i++) {
            model_seq *m = &ms[who[i]];
            int t = rows[i + 1] - rows[i];
            for (int j = 0; j < t; j++)
                kv_of(m->tokens, m->len - t + j + 1, l, k + (rows[i] + j) * HKV * HD, v + (rows[i] + j) * HKV * HD);
        }
        CHECK_EQ_INT(kv_append_f64(c, l, &b, k, v), KV_OK);
    }
    /* attention of layer 1 against the oracle over the model's K/V */
    double *q = rand_normal(r, (size_t)total * HQ * HD, 1), *out = malloc(sizeof(double) * total * HQ * HD);
    CHECK_EQ_INT(kv_attend_f64(c, 1, &b, HQ, q, out, 0), KV_OK);
    for (int i = 0; i < n; i++) {
        model_seq *m = &ms[who[i]];
        int t = rows[i + 1] - rows[i], S = m->len;
        double *K = malloc(sizeof(double) * S * HKV * HD), *V = malloc(sizeof(double) * S * HKV * HD);
        double *expect = malloc(sizeof(double) * t * HQ * HD);
        for (int p = 0; p < S; p++) kv_of(m->tokens, p + 1, 1, K + p * HKV * HD, V + p * HKV * HD);
        ref_attention(t, S, HQ, HKV, HD, q + rows[i] * HQ * HD, K, V, expect, window, 0, 0);
        double err = ref_max_diff(out + rows[i] * HQ * HD, expect, t * HQ * HD);
        if (!(err < 1e-12)) test_fail(__FILE__, __LINE__, "attention of seq %d (S=%d, T=%d) off by %g", m->id, S, t, err);
        free(K), free(V), free(expect);
    }
    free(k), free(v), free(q), free(out);
}

static model_seq *free_slot(model_seq *ms) {
    for (int i = 0; i < SEQS; i++)
        if (!ms[i].live) return &ms[i];
    return NULL;
}

static model_seq *random_live(test_rng *r, model_seq *ms) {
    int live[SEQS], n = 0;
    for (int i = 0; i < SEQS; i++)
        if (ms[i].live) live[n++] = i;
    return n ? &ms[live[test_rng_int(r, 0, n - 1)]] : NULL;
}

static void run_model(unsigned long long seed, int window, int n_ops, uint64_t hash_mask) {
    test_rng r = {seed};
    kv_cache_params p = kv_cache_default_params();
    p.n_layers = LAYERS, p.n_kv_heads = HKV, p.head_dim = HD, p.dtype = KV_F64, p.page_size = PAGE;
    p.n_pages = PAGES, p.max_seqs = SEQS, p.max_seq_len = MAXLEN, p.window = window;
    kv_cache *c;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
    c->prefix.hash_mask = hash_mask;
    model_seq ms[SEQS] = {{0}}, past = {0}; /* past: the tokens of a removed sequence */
    int counts[7] = {0}, hits = 0;
    for (int op = 0; op < n_ops; op++) {
        int kind = test_rng_int(&r, 0, 9);
        model_seq *m = random_live(&r, ms), *slot = free_slot(ms);
        if (kind <= 3) {
            op_step(&r, c, ms, window);
        } else if (kind == 4 && slot) { /* new, maybe reusing a cached prefix */
            CHECK_EQ_INT(kv_seq_new(c, &slot->id), KV_OK);
            slot->live = true, slot->len = 0;
            if (past.len > 0 && test_rng_int(&r, 0, 1)) {
                int32_t n = test_rng_int(&r, 1, past.len), got;
                CHECK_EQ_INT(kv_seq_prefix_match(c, slot->id, past.tokens, n, &got), KV_OK);
                CHECK(got % PAGE == 0 && got <= n);   /* a window: from the pages of its last W only */
                memcpy(slot->tokens, past.tokens, sizeof(int32_t) * (size_t)got);
                slot->len = got;
                hits += got > 0;
            }
            counts[0]++;
        } else if (kind == 5 && m) { /* remove */
            CHECK_EQ_INT(kv_seq_remove(c, m->id), KV_OK);
            past = *m;
            m->live = false;
            counts[1]++;
        } else if (kind == 6 && m && slot) { /* fork */
            int32_t child;
            CHECK_EQ_INT(kv_seq_fork(c, m->id, &child), KV_OK);
            *slot = *m;
            slot->id = child;
            counts[2]++;
        } else if (kind == 7 && m) { /* truncate (rollback) */
            int32_t to = test_rng_int(&r, 0, m->len);
            int rc = kv_seq_truncate(c, m->id, to);
            /* a window cache may refuse to roll back into evicted keys */
            CHECK(rc == KV_OK || (window > 0 && rc == KV_ERR_WINDOW));
            if (rc == KV_OK) m->len = to;
            counts[3]++;
        } else if (kind == 8 && m) { /* refused calls change nothing */
            int32_t rows[2] = {0, m->len + 1};
            kv_batch b = {.n_seqs = 1, .seqs = &m->id, .row_start = rows};
            double dummy[1];
            CHECK_REFUSED(c, kv_attend_f64(c, 0, &b, HQ, dummy, dummy, 0), KV_ERR_LENGTH);
            CHECK_REFUSED(c, kv_seq_reserve(c, m->id, MAXLEN - m->len + 1, NULL), KV_ERR_CAPACITY);
            counts[4]++;
        } else if (kind == 9 && m) {
            check_contents(c, m, window);
            counts[5]++;
        }
        check_pool(c);
    }
    for (int i = 0; i < SEQS; i++) {
        if (!ms[i].live) continue;
        check_contents(c, &ms[i], window);
        CHECK_EQ_INT(kv_seq_remove(c, ms[i].id), KV_OK);
    }
    kv_cache_stats st = kv_cache_get_stats(c);
    CHECK_EQ_INT(st.pages_used, 0);
    CHECK_EQ_INT(st.pages_free + st.pages_cached, PAGES);
    CHECK(hits > 10); /* the prefix cache was really exercised */
    printf("     window %d: %d ops (%d new, %d remove, %d fork, %d truncate), %d prefix hits\n", window,
           n_ops, counts[0], counts[1], counts[2], counts[3], hits);
    kv_cache_free(c);
}

TEST(model_based_10000_mixed_operations_full_attention) { run_model(1000, 0, 10000, UINT64_MAX); }
TEST(model_based_10000_mixed_operations_sliding_window) { run_model(2000, 7, 10000, UINT64_MAX); }
/* four names for every page: collisions, long probe runs and deletions inside them */
TEST(model_based_10000_mixed_operations_colliding_names) { run_model(3000, 0, 10000, 3); }
