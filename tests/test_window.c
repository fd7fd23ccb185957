/* tests/test_window.c - sliding-window caches: equal to the oracle under the
 * window mask, and their memory stays bounded however long the sequence. */
#include <string.h>

#include "helpers.h"

TEST(window_layer_equals_oracle_with_window_mask) {
    test_rng r = {20};
    const int windows[] = {1, 2, 5, 8, 16, 40};
    for (int wi = 0; wi < 6; wi++) {
        for (int page = 1; page <= 16; page *= 4) {
            enum { H = 6, Hkv = 3, d = 16, D = 12, N = 37 };
            int W = windows[wi];
            double *wq = rand_normal(&r, D * H * d, 0.3), *wk = rand_normal(&r, D * Hkv * d, 0.3);
            double *wv = rand_normal(&r, D * Hkv * d, 0.3), *x = rand_normal(&r, N * D, 1);
            double out[N * H * d], oracle[N * H * d];
            kv_cache_params p = kv_cache_default_params();
            p.n_kv_heads = Hkv, p.head_dim = d, p.dtype = KV_F64, p.page_size = page, p.window = W;
            kv_cache *c;
            int32_t s;
            CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
            CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
            kv_layer L = {.dim = D, .n_heads = H, .wq = wq, .wk = wk, .wv = wv};
            for (int t0 = 0; t0 < N;) {
                int t = test_rng_int(&r, 1, 6);
                if (t > N - t0) t = N - t0;
                CHECK_EQ_INT(step_seq_f64(c, s, &L, t, x + t0 * D, out + t0 * H * d), KV_OK);
                t0 += t;
            }
            ref_forward(N, D, H, Hkv, d, x, wq, wk, wv, NULL, W, oracle, NULL, NULL, NULL);
            CHECK(ref_max_diff(out, oracle, N * H * d) < 1e-12);
            kv_cache_free(c);
            free(wq), free(wk), free(wv), free(x);
        }
    }
}

TEST(window_memory_stays_bounded_while_sequence_grows_to_10W) {
    enum { W = 32, P = 8, CHUNK = 8, H = 2, Hkv = 1, d = 16, D = 8, N = 10 * W };
    test_rng r = {21};
    double *wq = rand_normal(&r, D * H * d, 0.3), *wk = rand_normal(&r, D * Hkv * d, 0.3);
    double *wv = rand_normal(&r, D * Hkv * d, 0.3), *x = rand_normal(&r, N * D, 1);
    double *out = malloc(sizeof(double) * N * H * d), *oracle = malloc(sizeof(double) * N * H * d);
    /* what one step can need: W - 1 older keys plus the chunk, over at most one
     * more page than they fill */
    const int bound_pages = (W - 1 + CHUNK + P - 1) / P + 1;
    kv_cache_params p = kv_cache_default_params();
    p.n_kv_heads = Hkv, p.head_dim = d, p.dtype = KV_F64, p.page_size = P, p.window = W;
    p.n_pages = bound_pages, p.max_seq_len = N; /* a pool far smaller than the sequence */
    kv_cache *c;
    int32_t s;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    kv_layer L = {.dim = D, .n_heads = H, .wq = wq, .wk = wk, .wv = wv};
    int peak = 0;
    for (int t0 = 0; t0 < N;) {
        int t = test_rng_int(&r, 0, 1) ? 1 : test_rng_int(&r, 1, CHUNK);
        if (t > N - t0) t = N - t0;
        CHECK_EQ_INT(step_seq_f64(c, s, &L, t, x + t0 * D, out + t0 * H * d), KV_OK);
        int used = kv_cache_get_stats(c).pages_used;
        peak = used > peak ? used : peak;
        t0 += t;
    }
    CHECK(peak <= bound_pages);
    CHECK_EQ_INT(kv_seq_length(c, s), N);
    ref_forward(N, D, H, Hkv, d, x, wq, wk, wv, NULL, W, oracle, NULL, NULL, NULL);
    CHECK(ref_max_diff(out, oracle, N * H * d) < 1e-12);
    /* the evicted keys are gone: reading them or rolling back to them is refused */
    double k[d], v[d];
    CHECK_EQ_INT(kv_read_f64(c, 0, s, 0, 1, k, v), KV_ERR_WINDOW);
    CHECK_EQ_INT(kv_seq_truncate(c, s, W), KV_ERR_WINDOW);
    CHECK_EQ_INT(kv_seq_length(c, s), N);
    CHECK_EQ_INT(kv_seq_truncate(c, s, N - 1), KV_OK); /* a step back within the window is fine */
    CHECK_EQ_INT(kv_seq_remove(c, s), KV_OK);
    CHECK_EQ_INT(kv_cache_get_stats(c).pages_free, bound_pages);
    kv_cache_free(c);
    free(wq), free(wk), free(wv), free(x), free(out), free(oracle);
}

/* no_evict: the same attention under the window mask (bit for bit the same
 * outputs as the evicting cache), but every page stays, as in a full cache. */
TEST(window_no_evict_attends_the_same_and_keeps_every_page) {
    enum { W = 8, P = 4, H = 2, Hkv = 1, d = 16, D = 8, N = 50 };
    test_rng r = {22};
    double *wq = rand_normal(&r, D * H * d, 0.3), *wk = rand_normal(&r, D * Hkv * d, 0.3);
    double *wv = rand_normal(&r, D * Hkv * d, 0.3), *x = rand_normal(&r, N * D, 1);
    double *out[2] = {malloc(sizeof(double) * N * H * d), malloc(sizeof(double) * N * H * d)};
    kv_layer L = {.dim = D, .n_heads = H, .wq = wq, .wk = wk, .wv = wv};
    int32_t used[2];
    for (int keep = 0; keep < 2; keep++) {
        kv_cache_params p = kv_cache_default_params();
        p.n_kv_heads = Hkv, p.head_dim = d, p.dtype = KV_F64, p.page_size = P, p.window = W, p.no_evict = keep;
        kv_cache *c;
        int32_t s;
        CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
        CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
        for (int t0 = 0; t0 < N; t0 += 5) CHECK_EQ_INT(step_seq_f64(c, s, &L, 5, x + t0 * D, out[keep] + t0 * H * d), KV_OK);
        used[keep] = kv_cache_get_stats(c).pages_used;
        double k[d], v[d];
        CHECK_EQ_INT(kv_read_f64(c, 0, s, 0, 1, k, v), keep ? KV_OK : KV_ERR_WINDOW);
        kv_cache_free(c);
    }
    CHECK(memcmp(out[0], out[1], sizeof(double) * N * H * d) == 0);
    CHECK(used[0] <= (W + 5 + P - 1) / P + 1);
    CHECK_EQ_INT(used[1], N / P + (N % P != 0));
    kv_cache_params bad = kv_cache_default_params();
    kv_cache *c;
    bad.no_evict = 2;
    CHECK_EQ_INT(kv_cache_create(&bad, &c), KV_ERR_WINDOW);
    free(wq), free(wk), free(wv), free(x), free(out[0]), free(out[1]);
}

/* Prefix matching in a window cache (P = 4, W = 8). A 40-token sequence is
 * written and removed: its 10 full pages stay named, cached. Three other
 * sequences then take 9 pages of the 14: the 4 free ones and the 5 least
 * recently used cached ones, blocks 0 .. 4. Resuming at m needs blocks
 * (m - 7) / 4 .. m / 4 - 1, so only m >= 28 can be served now: the values
 * below are worked out by hand from that rule. A match holds only the
 * window's pages and reads back what was written there. */
static double value_at(int32_t pos, int kv) { return 1000.0 * kv + pos + 0.25; }

TEST(window_prefix_match_serves_only_points_whose_window_pages_remain) {
    enum { P = 4, W = 8, N = 40, d = 4 };
    kv_cache_params p = kv_cache_default_params();
    p.head_dim = d, p.dtype = KV_F64, p.page_size = P, p.window = W, p.n_pages = 14, p.max_seqs = 4;
    p.max_seq_len = 64;
    kv_cache *c;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
    int32_t ta[N], tb[N], a, others[3], b;
    for (int i = 0; i < N; i++) ta[i] = tb[i] = 100 + i * 7 % 13;
    tb[35] = 99;
    double k[N * d], v[N * d];
    for (int i = 0; i < N * d; i++) k[i] = value_at(i / d, 0), v[i] = value_at(i / d, 1);
    CHECK_EQ_INT(kv_seq_new(c, &a), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, a, N, ta), KV_OK);
    int32_t rows[2] = {0, N};
    kv_batch batch = {.n_seqs = 1, .seqs = &a, .row_start = rows};
    CHECK_EQ_INT(kv_append_f64(c, 0, &batch, k, v), KV_OK);
    CHECK_EQ_INT(kv_seq_remove(c, a), KV_OK);
    CHECK_EQ_INT(kv_cache_get_stats(c).pages_cached, 10);
    int32_t m;
    CHECK_EQ_INT(kv_prefix_lookup(c, ta, N, &m), KV_OK);
    CHECK_EQ_INT(m, 40);
    CHECK_EQ_INT(kv_prefix_lookup(c, ta, 27, &m), KV_OK);
    CHECK_EQ_INT(m, 24);   /* nothing reclaimed yet */
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(kv_seq_new(c, &others[i]), KV_OK);
        CHECK_EQ_INT(kv_seq_reserve(c, others[i], 12, NULL), KV_OK);
    }
    CHECK_EQ_INT(kv_cache_get_stats(c).pages_cached, 5);
    const struct { const int32_t *t; int32_t n, want; } cases[] = {
        {ta, 40, 40}, {ta, 39, 36}, {ta, 31, 28}, {ta, 28, 28}, {ta, 27, 0}, {ta, 12, 0}, {tb, 40, 32}, {tb, 3, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_EQ_INT(kv_prefix_lookup(c, cases[i].t, cases[i].n, &m), KV_OK);
        if (m != cases[i].want) test_fail(__FILE__, __LINE__, "case %zu: %d, not %d", i, (int)m, (int)cases[i].want);
    }
    kv_cache_stats before = kv_cache_get_stats(c);
    CHECK_EQ_INT(kv_seq_new(c, &b), KV_OK);
    CHECK_EQ_INT(kv_seq_prefix_match(c, b, ta, 31, &m), KV_OK);
    CHECK_EQ_INT(m, 28);
    CHECK_EQ_INT(kv_seq_length(c, b), 28);
    CHECK_EQ_INT(kv_cache_get_stats(c).pages_used, before.pages_used + 2);   /* blocks 5 and 6 only */
    double rk[W * d], rv[W * d];
    CHECK_EQ_INT(kv_read_f64(c, 0, b, 28 - W + 1, W - 1, rk, rv), KV_OK);
    for (int i = 0; i < (W - 1) * d; i++)
        if (rk[i] != value_at(28 - W + 1 + i / d, 0) || rv[i] != value_at(28 - W + 1 + i / d, 1))
            test_fail(__FILE__, __LINE__, "position %d holds the wrong K/V", 28 - W + 1 + i / d);
    CHECK_EQ_INT(kv_read_f64(c, 0, b, 19, 1, rk, rv), KV_ERR_WINDOW);
    /* it goes on as any window sequence: the next positions append after 28 */
    CHECK_EQ_INT(kv_seq_reserve(c, b, 4, ta + 28), KV_OK);
    CHECK_EQ_INT(kv_seq_length(c, b), 32);
    CHECK_EQ_INT(kv_prefix_lookup(NULL, ta, 4, &m), KV_ERR_NULL);
    CHECK_EQ_INT(kv_prefix_lookup(c, NULL, 4, &m), KV_ERR_NULL);
    CHECK_EQ_INT(kv_prefix_lookup(c, ta, -1, &m), KV_ERR_SHAPE);
    CHECK_EQ_INT(kv_prefix_lookup(c, ta, 4, NULL), KV_ERR_NULL);
    kv_cache_free(c);
}
