/* tests/test_accounting.c - page accounting a caller can predict: random
 * sequences of create, fork, reserve (alone and in batches, with and without
 * token ids), append, truncate, prefix store (remove), match and free on a
 * nearly full pool with shared pages. Every reserve is asked about first
 * (kv_batch_reserve_cost); the real change of the stats must equal the
 * prediction, and every call must keep the rules kvcache.h states, counted
 * here from the test's own model of the sequences. K/V are a function of the
 * token prefix, so the contents are checked too. */
#include <string.h>

#include "helpers.h"

enum { HKV = 1, HD = 4, PAGE = 4, MAXLEN = 64, SEQS = 8, LAYERS = 2 };

typedef struct {
    bool live;
    int32_t len, tokens[MAXLEN];
} acc_seq;

static void kv_at(const int32_t *tokens, int32_t n, int layer, double *k, double *v) {
    uint64_t h = 1469598103934665603ull + (uint64_t)layer;
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint64_t)(tokens[i] + 1)) * 1099511628211ull;
    test_rng r = {h};
    for (int i = 0; i < HKV * HD; i++) k[i] = test_rng_uniform(&r), v[i] = test_rng_uniform(&r);
}

/* Writes K/V of the newest T positions of seq in every layer. */
static void write_new(kv_cache *c, const acc_seq *m, int32_t seq, int32_t T) {
    int32_t rows[2] = {0, T};
    kv_batch b = {.n_seqs = 1, .seqs = &seq, .row_start = rows};
    double k[MAXLEN * HKV * HD], v[MAXLEN * HKV * HD];
    for (int l = 0; l < LAYERS; l++) {
        for (int32_t r = 0; r < T; r++) kv_at(m->tokens, m->len - T + r + 1, l, k + r * HKV * HD, v + r * HKV * HD);
        CHECK_EQ_INT(kv_append_f64(c, l, &b, k, v), KV_OK);
    }
}

static void check_contents(const kv_cache *c, const acc_seq *m, int32_t seq) {
    double k[HKV * HD], v[HKV * HD], ek[HKV * HD], ev[HKV * HD];
    CHECK_EQ_INT(kv_seq_length(c, seq), m->len);
    for (int l = 0; l < LAYERS; l++)
        for (int32_t p = 0; p < m->len; p++) {
            CHECK_EQ_INT(kv_read_f64(c, l, seq, p, 1, k, v), KV_OK);
            kv_at(m->tokens, p + 1, l, ek, ev);
            if (memcmp(k, ek, sizeof k) || memcmp(v, ev, sizeof v))
                test_fail(__FILE__, __LINE__, "seq %d position %d layer %d holds the wrong K/V", seq, p, l);
        }
}

static bool same_pages(kv_cache_stats a, kv_cache_stats b) {
    return a.pages_used == b.pages_used && a.pages_free == b.pages_free && a.pages_cached == b.pages_cached &&
           a.pages_shared == b.pages_shared && a.pages_named == b.pages_named && a.seqs == b.seqs;
}

static int32_t blocks(int32_t len) { return (len + PAGE - 1) / PAGE; }

typedef struct {
    long reserves, refused, gave_back, adopted, reclaimed, shared_more, fork, match_hits;
} acc_counts;

/* A batch reserve of 1..3 sequences, predicted first. */
static void op_reserve(test_rng *r, kv_cache *c, acc_seq *ms, bool with_tokens, acc_counts *n) {
    int32_t seqs[3], rows[4] = {0}, nb = 0, toks[3 * 24];
    for (int32_t s = 0; s < SEQS && nb < 3; s++) {
        if (!ms[s].live || test_rng_int(r, 0, 2) == 0) continue;
        int32_t t = test_rng_int(r, 1, test_rng_int(r, 0, 3) == 0 ? 24 : 5);
        if (ms[s].len + t > MAXLEN) continue;
        for (int32_t i = 0; i < t; i++) toks[rows[nb] + i] = test_rng_int(r, 0, 1); /* 2 ids: many twins */
        seqs[nb] = s, rows[nb + 1] = rows[nb] + t, nb++;
    }
    if (!nb) return;
    kv_batch b = {.n_seqs = nb, .seqs = seqs, .row_start = rows};
    kv_reserve_cost k;
    kv_cache_stats before = kv_cache_get_stats(c);
    CHECK_EQ_INT(kv_batch_reserve_cost(c, &b, &k), KV_OK);
    /* asking changes nothing */
    kv_cache_stats asked = kv_cache_get_stats(c);
    CHECK(same_pages(asked, before));
    int rc = kv_batch_reserve(c, &b, with_tokens ? toks : NULL);
    kv_cache_stats after = kv_cache_get_stats(c);
    n->reserves++;
    if (!k.fits) {
        CHECK_EQ_INT(rc, KV_ERR_OUT_OF_PAGES);
        CHECK(same_pages(after, before));
        n->refused++;
        return;
    }
    CHECK_EQ_INT(rc, KV_OK);
    CHECK_EQ_INT(after.pages_used - before.pages_used, k.used_delta);
    CHECK_EQ_INT(after.pages_shared - before.pages_shared, k.shared_delta);
    CHECK_EQ_INT(after.pages_free - before.pages_free, k.free_delta);
    CHECK_EQ_INT(after.pages_cached - before.pages_cached, k.cached_delta);
    CHECK_EQ_INT(k.used_delta, k.pages_taken + k.pages_adopted - k.pages_given_back);
    /* the header's rules, counted from the model: what growth takes, at most
     * one copy per sequence, and naming never adds a used page */
    int32_t grow = 0, cow = 0;
    for (int32_t i = 0; i < nb; i++) {
        acc_seq *m = &ms[seqs[i]];
        int32_t t = rows[i + 1] - rows[i];
        grow += blocks(m->len + t) - blocks(m->len);
        cow += m->len % PAGE != 0;
    }
    CHECK(k.pages_taken >= grow && k.pages_taken <= grow + cow);
    CHECK(after.pages_used - before.pages_used <= grow + cow);
    CHECK(k.pages_adopted <= k.pages_given_back);
    CHECK(k.pages_reclaimed <= k.pages_taken && k.pages_reclaimed <= before.pages_cached);
    n->gave_back += k.pages_given_back, n->adopted += k.pages_adopted, n->reclaimed += k.pages_reclaimed;
    n->shared_more += k.shared_delta > 0;
    for (int32_t i = 0; i < nb; i++) {
        acc_seq *m = &ms[seqs[i]];
        int32_t t = rows[i + 1] - rows[i];
        memcpy(m->tokens + m->len, toks + rows[i], sizeof(int32_t) * (size_t)t);
        m->len += t;
        write_new(c, m, seqs[i], t);
    }
}

static void run_accounting(uint64_t seed, int32_t n_pages, int ops) {
    kv_cache_params p = kv_cache_default_params();
    p.n_layers = LAYERS, p.n_kv_heads = HKV, p.head_dim = HD, p.dtype = KV_F64, p.page_size = PAGE;
    p.n_pages = n_pages, p.max_seqs = SEQS, p.max_seq_len = MAXLEN;
    kv_cache *c = NULL;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
    if (!c) return;
    static acc_seq ms[SEQS];
    memset(ms, 0, sizeof ms);
    acc_counts n = {0};
    test_rng r = {seed};
    for (int op = 0; op < ops; op++) {
        int what = test_rng_int(&r, 0, 19);
        kv_cache_stats before = kv_cache_get_stats(c);
        int32_t s = test_rng_int(&r, 0, SEQS - 1);
        if (what < 9) {
            op_reserve(&r, c, ms, test_rng_int(&r, 0, 3) != 0, &n);
            continue;
        }
        if (what < 11 && !ms[s].live) { /* create, then maybe match a prefix */
            int32_t id;
            CHECK_EQ_INT(kv_seq_new(c, &id), KV_OK);
            ms[id] = (acc_seq){.live = true};
            if (test_rng_int(&r, 0, 1)) {
                int32_t toks[MAXLEN], len = test_rng_int(&r, 1, MAXLEN - 8), got = 0;
                /* what another sequence holds or held, then anything */
                const acc_seq *o = &ms[test_rng_int(&r, 0, SEQS - 1)];
                for (int32_t i = 0; i < len; i++) toks[i] = i < o->len ? o->tokens[i] : test_rng_int(&r, 0, 1);
                CHECK_EQ_INT(kv_seq_prefix_match(c, id, toks, len, &got), KV_OK);
                kv_cache_stats a = kv_cache_get_stats(c);
                /* holds matched pages only: no free page moves */
                CHECK_EQ_INT(a.pages_free, before.pages_free);
                CHECK_EQ_INT(a.pages_used - before.pages_used, before.pages_cached - a.pages_cached);
                CHECK(a.pages_used - before.pages_used <= got / PAGE);
                memcpy(ms[id].tokens, toks, sizeof(int32_t) * (size_t)got);
                ms[id].len = got;
                n.match_hits += got > 0;
            }
        } else if (what < 13 && ms[s].live) { /* fork */
            int32_t child;
            int rc = kv_seq_fork(c, s, &child);
            if (rc == KV_OK) {
                ms[child] = ms[s];
                kv_cache_stats a = kv_cache_get_stats(c);
                CHECK_EQ_INT(a.pages_used, before.pages_used);
                CHECK_EQ_INT(a.pages_free, before.pages_free);
                CHECK_EQ_INT(a.pages_cached, before.pages_cached);
                n.fork++;
            } else {
                CHECK_EQ_INT(rc, KV_ERR_SEQ);
            }
        } else if (what < 16 && ms[s].live) { /* truncate */
            int32_t to = test_rng_int(&r, 0, ms[s].len), from = ms[s].len;
            CHECK_EQ_INT(kv_seq_truncate(c, s, to), KV_OK);
            ms[s].len = to;
            kv_cache_stats a = kv_cache_get_stats(c);
            /* drops references to the pages wholly past the new length only */
            CHECK(a.pages_used <= before.pages_used && before.pages_used - a.pages_used <= blocks(from) - blocks(to));
            CHECK(a.pages_shared <= before.pages_shared);
        } else if (what < 19 && ms[s].live) { /* remove: stores its full pages in the prefix cache */
            CHECK_EQ_INT(kv_seq_remove(c, s), KV_OK);
            ms[s].live = false;
            kv_cache_stats a = kv_cache_get_stats(c);
            CHECK(a.pages_used <= before.pages_used);
            CHECK(a.pages_shared <= before.pages_shared);
            CHECK(before.pages_used - a.pages_used <= blocks(MAXLEN));
        } else if (what == 19 && test_rng_int(&r, 0, 9) == 0) {
            CHECK_EQ_INT(kv_prefix_clear(c), KV_OK);
            kv_cache_stats a = kv_cache_get_stats(c);
            CHECK_EQ_INT(a.pages_used, before.pages_used);
            CHECK_EQ_INT(a.pages_cached, 0);
        }
        kv_cache_stats a = kv_cache_get_stats(c);
        CHECK_EQ_INT(a.pages_used + a.pages_free + a.pages_cached, a.pages_total);
        if (op % 50 == 0)
            for (int32_t i = 0; i < SEQS; i++)
                if (ms[i].live) check_contents(c, &ms[i], i);
    }
    printf("     %ld reserves (%ld refused), %ld pages given back, %ld adopted, %ld reclaimed, %ld shared more, %ld forks, %ld hits\n",
           n.reserves, n.refused, n.gave_back, n.adopted, n.reclaimed, n.shared_more, n.fork, n.match_hits);
    /* the run met the cases it is for */
    CHECK(n.refused > 0 && n.gave_back > 0 && n.adopted > 0 && n.reclaimed > 0 && n.shared_more > 0);
    kv_cache_free(c);
}

TEST(accounting_reserve_changes_the_pages_exactly_as_predicted) {
    run_accounting(42, 40, 6000);
    run_accounting(7, 24, 6000);
}

/* The held-out case: sequences that prefilled the same tokens without a
 * lookup, forked, reserved without token ids. */
TEST(accounting_twins_swapped_in_give_back_pages_and_never_add_used_ones) {
    kv_cache_params p = kv_cache_default_params();
    p.n_layers = 1, p.n_kv_heads = HKV, p.head_dim = HD, p.dtype = KV_F64, p.page_size = PAGE;
    p.n_pages = 32, p.max_seqs = 4, p.max_seq_len = MAXLEN;
    kv_cache *c = NULL;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
    int32_t toks[16], a, b, f;
    for (int i = 0; i < 16; i++) toks[i] = i % 3;
    /* a names 4 pages; b computes the same 4 pages again; f shares b's */
    CHECK_EQ_INT(kv_seq_new(c, &a), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, a, 16, toks), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, a, 1, NULL), KV_OK);
    CHECK_EQ_INT(kv_seq_new(c, &b), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, b, 16, toks), KV_OK);
    CHECK_EQ_INT(kv_seq_fork(c, b, &f), KV_OK);
    kv_cache_stats s0 = kv_cache_get_stats(c);
    CHECK_EQ_INT(s0.pages_used, 5 + 4);
    kv_reserve_cost k;
    CHECK_EQ_INT(kv_seq_reserve_cost(c, b, 1, &k), KV_OK);
    /* b swaps its 4 pages for a's (used): f keeps b's, nothing is given back */
    CHECK_EQ_INT(k.pages_taken, 1);
    CHECK_EQ_INT(k.pages_given_back, 0);
    CHECK_EQ_INT(k.used_delta, 1);
    CHECK_EQ_INT(k.shared_delta, 4 - 4 + 0); /* a's 4 become shared, b's 4 stop being shared */
    CHECK_EQ_INT(kv_seq_reserve(c, b, 1, NULL), KV_OK);
    kv_cache_stats s1 = kv_cache_get_stats(c);
    CHECK_EQ_INT(s1.pages_used - s0.pages_used, 1);
    /* f's reserve now gives back the 4 duplicates */
    CHECK_EQ_INT(kv_seq_reserve_cost(c, f, 1, &k), KV_OK);
    CHECK_EQ_INT(k.pages_given_back, 4);
    CHECK_EQ_INT(k.used_delta, 1 - 4);
    CHECK_EQ_INT(kv_seq_reserve(c, f, 1, NULL), KV_OK);
    CHECK_EQ_INT(kv_cache_get_stats(c).pages_used - s1.pages_used, -3);
    /* a cached twin is not taken for a page another sequence still holds */
    int32_t g, h;
    CHECK_EQ_INT(kv_seq_remove(c, a), KV_OK);
    CHECK_EQ_INT(kv_seq_remove(c, b), KV_OK);
    CHECK_EQ_INT(kv_seq_remove(c, f), KV_OK);
    CHECK_EQ_INT(kv_cache_get_stats(c).pages_cached, 4);
    CHECK_EQ_INT(kv_seq_new(c, &g), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, g, 16, toks), KV_OK);
    CHECK_EQ_INT(kv_seq_fork(c, g, &h), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve_cost(c, g, 1, &k), KV_OK);
    CHECK_EQ_INT(k.pages_adopted, 0);
    CHECK_EQ_INT(k.used_delta, 1);
    kv_cache_free(c);
}
