/* tests/test_paged.c - the paged cache as a serving engine uses it: any page
 * size and physical order, ragged batches, all-or-nothing reserve, fork with
 * copy-on-write, the prefix cache, save/restore, accounting. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "snapshot.h"

enum { H = 4, Hkv = 2, d = 16, D = 12 };

typedef struct {
    double *wq, *wk, *wv;
    kv_layer L;
} weights;

static weights make_weights(test_rng *r) {
    weights w;
    w.wq = rand_normal(r, D * H * d, 0.3), w.wk = rand_normal(r, D * Hkv * d, 0.3);
    w.wv = rand_normal(r, D * Hkv * d, 0.3);
    w.L = (kv_layer){.dim = D, .n_heads = H, .wq = w.wq, .wk = w.wk, .wv = w.wv};
    return w;
}

static void free_weights(weights *w) { free(w->wq), free(w->wk), free(w->wv); }

static kv_cache *make_cache(int page, int n_pages, int max_seqs, kv_dtype dtype) {
    kv_cache_params p = kv_cache_default_params();
    p.n_kv_heads = Hkv, p.head_dim = d, p.dtype = dtype, p.page_size = page, p.n_pages = n_pages;
    p.max_seqs = max_seqs;
    kv_cache *c = NULL;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
    return c;
}

TEST(paged_equals_contiguous_for_any_page_size_and_shuffled_pages) {
    const int pages[] = {1, 3, 16, 64};
    for (int pi = 0; pi < 4; pi++) {
        enum { N = 70 };
        int P = pages[pi];
        test_rng r = {50 + (unsigned)pi};
        kv_cache *c = make_cache(P, 2 * (N / P + 2) + 8, 2, KV_F64);
        int32_t a, junk;
        CHECK_EQ_INT(kv_seq_new(c, &a), KV_OK);
        CHECK_EQ_INT(kv_seq_new(c, &junk), KV_OK);
        double *k = rand_normal(&r, N * Hkv * d, 1), *v = rand_normal(&r, N * Hkv * d, 1);
        double *q = rand_normal(&r, N * H * d, 1);
        /* interleave another sequence's pages, then drop it: a's pages end up
         * scattered and out of order in the pool */
        int32_t rows[2];
        for (int t0 = 0; t0 < N;) {
            int t = test_rng_int(&r, 1, 9);
            if (t > N - t0) t = N - t0;
            CHECK_EQ_INT(kv_seq_reserve(c, junk, test_rng_int(&r, 1, 2 * P), NULL), KV_OK);
            CHECK_EQ_INT(kv_seq_reserve(c, a, t, NULL), KV_OK);
            kv_batch b = one_seq(&a, rows, t);
            CHECK_EQ_INT(kv_append_f64(c, 0, &b, k + t0 * Hkv * d, v + t0 * Hkv * d), KV_OK);
            t0 += t;
            if (test_rng_int(&r, 0, 3) == 0) {
                CHECK_EQ_INT(kv_seq_remove(c, junk), KV_OK);
                CHECK_EQ_INT(kv_seq_new(c, &junk), KV_OK);
            }
        }
        /* attend the last 9 positions through the pages and through a dense array */
        enum { T = 9 };
        double paged[T * H * d], dense[T * H * d], oracle[T * H * d];
        kv_batch b = one_seq(&a, rows, T);
        CHECK_EQ_INT(kv_attend_f64(c, 0, &b, H, q, paged, 0), KV_OK);
        CHECK_EQ_INT(kv_attention_f64(T, N, H, Hkv, d, q, k, v, dense, 0, 0), KV_OK);
        ref_attention(T, N, H, Hkv, d, q, k, v, oracle, 0, 0, 0);
        CHECK(ref_max_diff(paged, oracle, T * H * d) < 1e-12);
        CHECK(ref_max_diff(paged, dense, T * H * d) == 0); /* the same arithmetic, in the same order */
        kv_cache_free(c);
        free(k), free(v), free(q);
    }
}

TEST(ragged_batches_equal_per_sequence_runs) {
    test_rng r = {60};
    for (int it = 0; it < 40; it++) {
        int n = test_rng_int(&r, 1, 32), P = test_rng_int(&r, 1, 8);
        bool f64 = it % 2 == 0;
        kv_dtype dtype = f64 ? KV_F64 : (kv_dtype)test_rng_int(&r, KV_F32, KV_Q8);
        weights w = make_weights(&r);
        float *wqf = to_f32(w.wq, D * H * d), *wkf = to_f32(w.wk, D * Hkv * d), *wvf = to_f32(w.wv, D * Hkv * d);
        kv_layer Lf = {.dim = D, .n_heads = H, .wq = wqf, .wk = wkf, .wv = wvf};
        kv_cache *batched = make_cache(P, 2048, n, dtype), *alone[32];
        int32_t seqs[32], one[32], rows[33];
        for (int i = 0; i < n; i++) {
            alone[i] = make_cache(P, 256, 1, dtype);
            CHECK_EQ_INT(kv_seq_new(batched, &seqs[i]), KV_OK);
            CHECK_EQ_INT(kv_seq_new(alone[i], &one[i]), KV_OK);
        }
        for (int step = 0; step < 4; step++) {
            /* mixed phases: each sequence prefills a chunk, decodes one, or sits out */
            rows[0] = 0;
            for (int i = 0; i < n; i++) {
                int kind = test_rng_int(&r, 0, 2);
                rows[i + 1] = rows[i] + (kind == 0 ? test_rng_int(&r, 2, 12) : kind == 1 ? 1 : 0);
            }
            int total = rows[n];
            double *x = rand_normal(&r, (size_t)total * D, 1), *out = malloc(sizeof(double) * (total * H * d + 1));
            double *ref = malloc(sizeof(double) * (total * H * d + 1));
            float *xf = to_f32(x, (size_t)total * D), *outf = malloc(sizeof(float) * (total * H * d + 1));
            float *reff = malloc(sizeof(float) * (total * H * d + 1));
            kv_batch b = {.n_seqs = n, .seqs = seqs, .row_start = rows};
            CHECK_EQ_INT(kv_batch_reserve(batched, &b, NULL), KV_OK);
            size_t scratch_n = kv_step_scratch(batched, &w.L, total) + 1;
            void *scratch = malloc(scratch_n * sizeof(double));
            CHECK_EQ_INT(f64 ? kv_step_f64(batched, &w.L, &b, x, out, scratch)
                             : kv_step_f32(batched, &Lf, &b, xf, outf, scratch), KV_OK);
            for (int i = 0; i < n; i++) {
                int t = rows[i + 1] - rows[i];
                if (t == 0) continue;
                int rc = f64 ? step_seq_f64(alone[i], one[i], &w.L, t, x + rows[i] * D, ref + rows[i] * H * d)
                             : step_seq_f32(alone[i], one[i], &Lf, t, xf + rows[i] * D, reff + rows[i] * H * d);
                CHECK_EQ_INT(rc, KV_OK);
            }
            if (f64) {
                CHECK(ref_max_diff(out, ref, total * H * d) == 0); /* identical */
            } else {
                for (int e = 0; e < total * H * d; e++) CHECK_NEAR(outf[e], reff[e], 1e-6);
            }
            free(x), free(out), free(ref), free(xf), free(outf), free(reff), free(scratch);
        }
        for (int i = 0; i < n; i++) kv_cache_free(alone[i]);
        kv_cache_free(batched);
        free_weights(&w);
        free(wqf), free(wkf), free(wvf);
    }
}

TEST(batch_reserve_out_of_pages_changes_nothing_and_retry_after_preempting_succeeds) {
    kv_cache *c = make_cache(4, 10, 3, KV_F32);
    int32_t s[3], rows[4];
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(kv_seq_new(c, &s[i]), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, s[0], 6, NULL), KV_OK); /* 2 of 10 pages */
    kv_batch b = {.n_seqs = 3, .seqs = s, .row_start = rows};
    /* s[0] 6 -> 16 takes 2 more pages, s[1] 10 positions 3, s[2] 11 positions 3: 8 > 8 free? no, 8 */
    rows[0] = 0, rows[1] = 10, rows[2] = 20, rows[3] = 32; /* s[2]: 12 positions, 3 pages: 8 of 8 */
    rows[3] = 33;                                          /* 13 positions need a 4th: 9 > 8 */
    CHECK_REFUSED(c, kv_batch_reserve(c, &b, NULL), KV_ERR_OUT_OF_PAGES);
    CHECK_EQ_INT(kv_seq_length(c, s[0]), 6);
    CHECK_EQ_INT(kv_seq_length(c, s[2]), 0);
    /* preempt the third sequence, retry the other two */
    CHECK_EQ_INT(kv_seq_remove(c, s[2]), KV_OK);
    b.n_seqs = 2;
    CHECK_EQ_INT(kv_batch_reserve(c, &b, NULL), KV_OK);
    CHECK_EQ_INT(kv_seq_length(c, s[0]), 16);
    CHECK_EQ_INT(kv_seq_length(c, s[1]), 10);
    CHECK_EQ_INT(kv_cache_get_stats(c).pages_free, 3);
    kv_cache_free(c);
}

TEST(fork_isolation_and_copy_on_write) {
    enum { N = 21, P = 4 };
    test_rng r = {70};
    weights w = make_weights(&r);
    double *x = rand_normal(&r, (N + 10) * D, 1), *y = rand_normal(&r, 10 * D, 1);
    kv_cache *c = make_cache(P, 64, 4, KV_F64), *ref = make_cache(P, 64, 2, KV_F64);
    int32_t parent, child, rp, rc_;
    CHECK_EQ_INT(kv_seq_new(c, &parent), KV_OK);
    CHECK_EQ_INT(kv_seq_new(ref, &rp), KV_OK);
    CHECK_EQ_INT(kv_seq_new(ref, &rc_), KV_OK);
    double out[(N + 10) * H * d], expect[(N + 10) * H * d];
    CHECK_EQ_INT(step_seq_f64(c, parent, &w.L, N, x, out), KV_OK);
    CHECK_EQ_INT(step_seq_f64(ref, rp, &w.L, N, x, expect), KV_OK);
    CHECK_EQ_INT(step_seq_f64(ref, rc_, &w.L, N, x, expect), KV_OK);
    int used_before = kv_cache_get_stats(c).pages_used;
    CHECK_EQ_INT(kv_seq_fork(c, parent, &child), KV_OK);
    kv_cache_stats st = kv_cache_get_stats(c);
    CHECK_EQ_INT(st.pages_used, used_before); /* the prompt is held once */
    CHECK_EQ_INT(st.pages_shared, used_before);
    /* they diverge: the parent continues with x, the child with y */
    for (int i = 0; i < 10; i++) {
        double o1[H * d], o2[H * d], e1[H * d], e2[H * d];
        CHECK_EQ_INT(step_seq_f64(c, child, &w.L, 1, y + i * D, o2), KV_OK);
        CHECK_EQ_INT(step_seq_f64(c, parent, &w.L, 1, x + (N + i) * D, o1), KV_OK);
        CHECK_EQ_INT(step_seq_f64(ref, rp, &w.L, 1, x + (N + i) * D, e1), KV_OK);
        CHECK_EQ_INT(step_seq_f64(ref, rc_, &w.L, 1, y + i * D, e2), KV_OK);
        CHECK(ref_max_diff(o1, e1, H * d) == 0);
        CHECK(ref_max_diff(o2, e2, H * d) == 0);
    }
    /* the first 5 full pages are still shared; the one each wrote into was copied */
    CHECK_EQ_INT(kv_cache_get_stats(c).pages_shared, N / P);
    CHECK_EQ_INT(kv_seq_remove(c, parent), KV_OK);
    CHECK_EQ_INT(kv_cache_get_stats(c).pages_shared, 0);
    CHECK_EQ_INT(kv_seq_remove(c, child), KV_OK);
    st = kv_cache_get_stats(c);
    CHECK_EQ_INT(st.pages_used, 0);
    CHECK_EQ_INT(st.pages_free + st.pages_cached, st.pages_total);
    kv_cache_free(c);
    kv_cache_free(ref);
    free_weights(&w);
    free(x), free(y);
}

TEST(n_completions_of_one_prompt_hold_the_prompt_once) {
    kv_cache *c = make_cache(16, 64, 8, KV_F16);
    int32_t p, kids[4];
    CHECK_EQ_INT(kv_seq_new(c, &p), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, p, 64, NULL), KV_OK);
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(kv_seq_fork(c, p, &kids[i]), KV_OK);
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(kv_seq_reserve(c, kids[i], 3, NULL), KV_OK);
    kv_cache_stats st = kv_cache_get_stats(c);
    CHECK_EQ_INT(st.pages_used, 4 + 4); /* the prompt's 4 pages once, one new page per child */
    CHECK_EQ_INT(st.pages_shared, 4);
    kv_cache_free(c);
}

/* ------------------------------------------------------------------ prefix cache */

TEST(prefix_cache_hit_equals_cold_prefill) {
    enum { N = 30, P = 4 };
    test_rng r = {80};
    weights w = make_weights(&r);
    double *x = rand_normal(&r, N * D, 1);
    int32_t tokens[N];
    for (int i = 0; i < N; i++) tokens[i] = test_rng_int(&r, 0, 1000);
    kv_cache *c = make_cache(P, 32, 2, KV_F64);
    int32_t a, b, m;
    double cold[N * H * d], warm[N * H * d];
    CHECK_EQ_INT(kv_seq_new(c, &a), KV_OK);
    CHECK_EQ_INT(step_tokens_f64(c, a, &w.L, N, tokens, x, cold), KV_OK);
    CHECK_EQ_INT(kv_seq_remove(c, a), KV_OK); /* its full pages stay cached */
    kv_cache_stats st = kv_cache_get_stats(c);
    CHECK_EQ_INT(st.pages_cached, N / P);
    CHECK_EQ_INT(st.pages_used, 0);

    CHECK_EQ_INT(kv_seq_new(c, &b), KV_OK);
    CHECK_EQ_INT(kv_seq_prefix_match(c, b, tokens, N - 1, &m), KV_OK);
    CHECK_EQ_INT(m, (N - 1) / P * P); /* 28: seven pages need no prefill */
    CHECK_EQ_INT(kv_seq_length(c, b), m);
    CHECK_EQ_INT(step_tokens_f64(c, b, &w.L, N - m, tokens + m, x + m * D, warm + m * H * d), KV_OK);
    CHECK(ref_max_diff(cold + m * H * d, warm + m * H * d, (N - m) * H * d) == 0);

    /* a prompt that differs in its second page reuses only the first */
    int32_t other[N], m2, s3;
    memcpy(other, tokens, sizeof other);
    other[5] += 1;
    CHECK_EQ_INT(kv_seq_remove(c, b), KV_OK);
    CHECK_EQ_INT(kv_seq_new(c, &s3), KV_OK);
    CHECK_EQ_INT(kv_seq_prefix_match(c, s3, other, N, &m2), KV_OK);
    CHECK_EQ_INT(m2, P);
    /* a match needs an empty sequence */
    CHECK_REFUSED(c, kv_seq_prefix_match(c, s3, other, N, &m2), KV_ERR_LENGTH);
    kv_cache_free(c);
    free_weights(&w);
    free(x);
}

TEST(prefix_cache_forced_hash_collision_is_detected) {
    enum { N = 16, P = 4 };
    test_rng r = {81};
    weights w = make_weights(&r);
    double *x1 = rand_normal(&r, N * D, 1), *x2 = rand_normal(&r, N * D, 1);
    int32_t t1[N], t2[N];
    for (int i = 0; i < N; i++) t1[i] = i, t2[i] = 100 + i;
    kv_cache *c = make_cache(P, 32, 3, KV_F64);
    c->prefix.hash_mask = 0; /* every page hashes to the same name */
    int32_t a, b, m;
    double o1[N * H * d], o2[N * H * d], warm[N * H * d];
    CHECK_EQ_INT(kv_seq_new(c, &a), KV_OK);
    CHECK_EQ_INT(step_tokens_f64(c, a, &w.L, N, t1, x1, o1), KV_OK);
    CHECK_EQ_INT(kv_seq_remove(c, a), KV_OK);
    CHECK_EQ_INT(kv_seq_new(c, &b), KV_OK);
    CHECK_EQ_INT(kv_seq_prefix_match(c, b, t2, N, &m), KV_OK);
    CHECK_EQ_INT(m, 0); /* same name, other tokens: a miss */
    CHECK_EQ_INT(step_tokens_f64(c, b, &w.L, N, t2, x2, o2), KV_OK);
    CHECK_EQ_INT(kv_seq_remove(c, b), KV_OK);
    CHECK_EQ_INT(kv_cache_get_stats(c).pages_named, 2 * N / P);
    /* both prompts are found, each with its own pages */
    CHECK_EQ_INT(kv_seq_new(c, &b), KV_OK);
    CHECK_EQ_INT(kv_seq_prefix_match(c, b, t2, N - 1, &m), KV_OK);
    CHECK_EQ_INT(m, 12);
    CHECK_EQ_INT(step_tokens_f64(c, b, &w.L, N - m, t2 + m, x2 + m * D, warm + m * H * d), KV_OK);
    CHECK(ref_max_diff(o2 + m * H * d, warm + m * H * d, (N - m) * H * d) == 0);
    kv_cache_free(c);
    free_weights(&w);
    free(x1), free(x2);
}

TEST(prefix_cache_pages_are_reclaimed_least_recently_used_first) {
    enum { P = 4 };
    kv_cache *c = make_cache(P, 6, 2, KV_F32);
    int32_t s, m, ta[8], tb[8];
    for (int i = 0; i < 8; i++) ta[i] = i, tb[i] = 50 + i;
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, s, 8, ta), KV_OK);
    CHECK_EQ_INT(kv_seq_remove(c, s), KV_OK); /* a: 2 cached pages (older) */
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, s, 8, tb), KV_OK);
    CHECK_EQ_INT(kv_seq_remove(c, s), KV_OK); /* b: 2 cached pages (newer) */
    kv_cache_stats st = kv_cache_get_stats(c);
    CHECK_EQ_INT(st.pages_cached, 4);
    CHECK_EQ_INT(st.pages_free, 2);
    /* 16 positions need 4 pages: the 2 free ones, then a's 2 cached ones */
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, s, 16, NULL), KV_OK);
    CHECK_EQ_INT(kv_seq_remove(c, s), KV_OK);
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_prefix_match(c, s, ta, 8, &m), KV_OK);
    CHECK_EQ_INT(m, 0);
    CHECK_EQ_INT(kv_seq_prefix_match(c, s, tb, 8, &m), KV_OK);
    CHECK_EQ_INT(m, 8);
    /* out of pages counts cached pages as available, and nothing else */
    int32_t s2;
    CHECK_EQ_INT(kv_seq_new(c, &s2), KV_OK);
    CHECK_REFUSED(c, kv_seq_reserve(c, s2, 17, NULL), KV_ERR_OUT_OF_PAGES);
    kv_cache_free(c);
}

/* ------------------------------------------------------------------ save / restore */

TEST(save_restore_continue_equals_never_saving) {
    enum { N = 19, M = 6, P = 4 };
    test_rng r = {90};
    weights w = make_weights(&r);
    double *x = rand_normal(&r, (N + M) * D, 1);
    int32_t tokens[N];
    for (int i = 0; i < N; i++) tokens[i] = i * 7;
    char path[] = "/tmp/kvcache_save_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    for (int wi = 0; wi < 2; wi++) {
        kv_cache_params p = kv_cache_default_params();
        p.n_layers = 1, p.n_kv_heads = Hkv, p.head_dim = d, p.dtype = KV_F64, p.page_size = P;
        p.window = wi ? 5 : 0;
        kv_cache *c, *c2;
        CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
        p.page_size = 3; /* positions, not pages, are saved */
        CHECK_EQ_INT(kv_cache_create(&p, &c2), KV_OK);
        int32_t s, s2;
        double o1[(N + M) * H * d], o2[(N + M) * H * d];
        CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
        CHECK_EQ_INT(step_tokens_f64(c, s, &w.L, N, tokens, x, o1), KV_OK);
        CHECK_EQ_INT(kv_seq_save(c, s, path), KV_OK);
        CHECK_EQ_INT(kv_seq_restore(c2, path, &s2), KV_OK);
        CHECK_EQ_INT(kv_seq_length(c2, s2), N);
        for (int i = 0; i < M; i++) {
            CHECK_EQ_INT(step_seq_f64(c, s, &w.L, 1, x + (N + i) * D, o1 + (N + i) * H * d), KV_OK);
            CHECK_EQ_INT(step_seq_f64(c2, s2, &w.L, 1, x + (N + i) * D, o2 + (N + i) * H * d), KV_OK);
        }
        CHECK(ref_max_diff(o1 + N * H * d, o2 + N * H * d, M * H * d) == 0);
        kv_cache_free(c);
        kv_cache_free(c2);
    }
    remove(path);
    free_weights(&w);
    free(x);
}

static void write_file(const char *path, const unsigned char *data, long n) {
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, (size_t)n, f);
    fclose(f);
}

TEST(restore_refuses_corrupt_truncated_and_mismatched_files) {
    enum { N = 9 };
    kv_cache *c = make_cache(4, 16, 2, KV_Q8);
    int32_t s, s2;
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, s, N, NULL), KV_OK);
    float k[N * Hkv * d];
    for (int i = 0; i < N * Hkv * d; i++) k[i] = (float)(i % 13) - 6;
    int32_t rows[2];
    kv_batch b = one_seq(&s, rows, N);
    CHECK_EQ_INT(kv_append_f32(c, 0, &b, k, k), KV_OK);
    char path[] = "/tmp/kvcache_bad_XXXXXX";
    close(mkstemp(path));
    CHECK_EQ_INT(kv_seq_save(c, s, path), KV_OK);
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    unsigned char *good = malloc((size_t)n), *bad = malloc((size_t)n);
    CHECK(fread(good, 1, (size_t)n, f) == (size_t)n);
    fclose(f);

    CHECK_REFUSED(c, kv_seq_restore(c, "/nonexistent/kv.bin", &s2), KV_ERR_IO);
    for (long at = 0; at < n; at += 7) { /* one flipped bit anywhere */
        memcpy(bad, good, (size_t)n);
        bad[at] ^= 0x10;
        write_file(path, bad, n);
        int rc = kv_seq_restore(c, path, &s2);
        CHECK(rc == KV_ERR_FORMAT || rc == KV_ERR_MISMATCH || rc == KV_ERR_CAPACITY);
    }
    for (long len = 0; len < n; len += 5) { /* truncated */
        write_file(path, good, len);
        CHECK_REFUSED(c, kv_seq_restore(c, path, &s2), KV_ERR_FORMAT);
    }
    write_file(path, good, n);
    kv_cache *other = make_cache(4, 16, 2, KV_F16); /* another storage type */
    CHECK_REFUSED(other, kv_seq_restore(other, path, &s2), KV_ERR_MISMATCH);
    kv_cache_free(other);
    /* the good file restores, to the same values */
    CHECK_EQ_INT(kv_seq_restore(c, path, &s2), KV_OK);
    float k1[N * Hkv * d], v1[N * Hkv * d], k2[N * Hkv * d], v2[N * Hkv * d];
    CHECK_EQ_INT(kv_read_f32(c, 0, s, 0, N, k1, v1), KV_OK);
    CHECK_EQ_INT(kv_read_f32(c, 0, s2, 0, N, k2, v2), KV_OK);
    CHECK(memcmp(k1, k2, sizeof k1) == 0 && memcmp(v1, v2, sizeof v1) == 0);
    remove(path);
    free(good), free(bad);
    kv_cache_free(c);
}

/* A saved file's bytes, and the same file made to start `drop` positions
 * later (first_pos moved up, those positions' tokens and K/V cut out), its
 * checksum made right again: what the checksum cannot catch. */
static unsigned char *read_all(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    rewind(f);
    unsigned char *b = malloc((size_t)*n);
    CHECK(fread(b, 1, (size_t)*n, f) == (size_t)*n);
    fclose(f);
    return b;
}

static long starting_later(const unsigned char *file, long n, int32_t drop, unsigned char *out) {
    enum { HEAD = 8 + 10 * 4 };
    int32_t h[10];
    memcpy(h, file + 8, sizeof h);
    const int32_t count = h[7] - h[8];
    const long per = (n - HEAD - 8 - 4L * count) / count; /* one position's K/V, every layer */
    memcpy(out, file, HEAD);
    h[8] += drop;
    memcpy(out + 8, h, sizeof h);
    long at = HEAD;
    memcpy(out + at, file + HEAD + 4L * drop, 4L * (count - drop)), at += 4L * (count - drop);
    memcpy(out + at, file + HEAD + 4L * count + per * drop, (size_t)(per * (count - drop))), at += per * (count - drop);
    uint64_t sum = 0xCBF29CE484222325ull;
    for (long i = 0; i < at; i++) sum = (sum ^ out[i]) * 0x100000001B3ull;
    memcpy(out + at, &sum, sizeof sum);
    return at + 8;
}

/* A file whose first positions are gone (first_pos > 0) comes only from a
 * window that evicted them, and never with a key the next query would see:
 * a crafted one would restore a sequence that no later call could attend
 * (or one whose zero-filled first page it would), so it is refused. */
TEST(restore_refuses_evicted_positions_that_no_window_could_have_evicted) {
    enum { N = 13, W = 6, P = 4 };
    char path[] = "/tmp/kvcache_evict_XXXXXX";
    close(mkstemp(path));
    float k[N * Hkv * d];
    for (int i = 0; i < N * Hkv * d; i++) k[i] = (float)(i % 11) - 5;
    kv_cache_params p = kv_cache_default_params();
    p.n_kv_heads = Hkv, p.head_dim = d, p.dtype = KV_F16, p.page_size = P, p.n_pages = 16, p.max_seqs = 2;
    unsigned char out[65536];
    /* no window: nothing is ever evicted */
    kv_cache *c;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
    int32_t s, s2, rows[2];
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, s, N, NULL), KV_OK);
    kv_batch b = one_seq(&s, rows, N);
    CHECK_EQ_INT(kv_append_f32(c, 0, &b, k, k), KV_OK);
    CHECK_EQ_INT(kv_seq_save(c, s, path), KV_OK);
    long n;
    unsigned char *file = read_all(path, &n);
    CHECK(n < (long)sizeof out);
    for (int32_t drop = 1; drop <= P; drop += P - 1) {
        write_file(path, out, starting_later(file, n, drop, out));
        CHECK_REFUSED(c, kv_seq_restore(c, path, &s2), KV_ERR_FORMAT);
    }
    write_file(path, out, starting_later(file, n, 0, out)); /* the rewrite itself keeps a file good */
    CHECK_EQ_INT(kv_seq_restore(c, path, &s2), KV_OK);
    kv_cache_free(c);
    free(file);

    /* a window of W, decoded one token at a time: the first page goes */
    p.window = W;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    for (int t = 0; t < N; t++) {
        CHECK_EQ_INT(kv_seq_reserve(c, s, 1, NULL), KV_OK);
        b = one_seq(&s, rows, 1);
        CHECK_EQ_INT(kv_append_f32(c, 0, &b, k + t * Hkv * d, k + t * Hkv * d), KV_OK);
    }
    CHECK_EQ_INT(kv_seq_save(c, s, path), KV_OK);
    file = read_all(path, &n);
    int32_t h[10];
    memcpy(h, file + 8, sizeof h);
    CHECK(h[8] > 0 && h[8] <= N - W + 1); /* evicted, as the window allows */
    CHECK_EQ_INT(kv_seq_restore(c, path, &s2), KV_OK); /* and it restores, to attend on */
    float q[H * d], o[H * d];
    for (int i = 0; i < H * d; i++) q[i] = (float)(i % 5) - 2;
    CHECK_EQ_INT(kv_seq_reserve(c, s2, 1, NULL), KV_OK);
    b = one_seq(&s2, rows, 1);
    CHECK_EQ_INT(kv_append_f32(c, 0, &b, k, k), KV_OK);
    CHECK_EQ_INT(kv_attend_f32(c, 0, &b, H, q, o, 0), KV_OK);
    CHECK_EQ_INT(kv_seq_remove(c, s2), KV_OK);
    /* past what the window evicts: the next query would see the zero-filled
     * positions below first_pos */
    const int32_t drop = N - W + 2 - h[8];
    write_file(path, out, starting_later(file, n, drop, out));
    CHECK_REFUSED(c, kv_seq_restore(c, path, &s2), KV_ERR_FORMAT);
    /* a window that never evicts was not what saved it */
    write_file(path, file, n);
    p.no_evict = 1;
    kv_cache *keep;
    CHECK_EQ_INT(kv_cache_create(&p, &keep), KV_OK);
    CHECK_REFUSED(keep, kv_seq_restore(keep, path, &s2), KV_ERR_MISMATCH);
    kv_cache_free(keep);
    kv_cache_free(c);
    free(file);
    remove(path);
}

/* ------------------------------------------------------------------ accounting */

TEST(accounting_paging_wastes_at_most_one_partial_page_per_sequence) {
    test_rng r = {95};
    for (int it = 0; it < 50; it++) {
        int P = test_rng_int(&r, 1, 32), n = test_rng_int(&r, 1, 8);
        kv_cache *c = make_cache(P, 4096, n, KV_BF16);
        int64_t tokens = 0;
        for (int i = 0; i < n; i++) {
            int32_t s, len = test_rng_int(&r, 0, 200);
            CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
            CHECK_EQ_INT(kv_seq_reserve(c, s, len, NULL), KV_OK);
            tokens += len;
        }
        kv_cache_stats st = kv_cache_get_stats(c);
        int64_t slots = (int64_t)st.pages_used * P;
        CHECK(slots >= tokens && slots - tokens < (int64_t)n * P);
        CHECK_EQ_INT(st.bytes_per_token, kv_price_per_token(1, Hkv, d, KV_BF16));
        CHECK_EQ_INT(st.bytes_in_use, (uint64_t)st.pages_used * st.bytes_per_page);
        CHECK_EQ_INT(st.pages_used + st.pages_free + st.pages_cached, st.pages_total);
        kv_cache_free(c);
    }
}

TEST(prefix_cache_never_chains_onto_a_reclaimed_and_renamed_parent) {
    /* p1 was named as the page after p0's old content; p0 is then reclaimed
     * and renamed with other tokens. With every name equal (hash_mask 0), only
     * the parent's generation tells p1 does not follow p0's new content. */
    kv_cache *c = make_cache(4, 2, 2, KV_F32);
    c->prefix.hash_mask = 0;
    int32_t a0a1[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b0a1[8] = {9, 9, 9, 9, 5, 6, 7, 8}, s, m;
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, s, 8, a0a1), KV_OK); /* pages 0, 1 */
    CHECK_EQ_INT(kv_seq_remove(c, s), KV_OK);           /* both cached, page 0 least recent */
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, s, 4, b0a1), KV_OK); /* reclaims page 0 */
    CHECK_EQ_INT(kv_seq_remove(c, s), KV_OK);           /* page 0 renamed as {9, 9, 9, 9} */
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_prefix_match(c, s, b0a1, 8, &m), KV_OK);
    CHECK_EQ_INT(m, 4);
    kv_cache_free(c);
}

TEST(prefix_cache_finds_the_longest_prefix_of_a_sequence_that_skipped_the_lookup) {
    /* 1..8 cached; b prefills 1..12 without a lookup, so its first two pages
     * are twins of the cached ones, then decodes 13. A lookup of 1..12 must
     * match all three full pages, and the hit must give b's own K/V. */
    enum { N = 13, P = 4 };
    test_rng r = {82};
    weights w = make_weights(&r);
    double *x = rand_normal(&r, N * D, 1);
    int32_t tokens[N];
    for (int i = 0; i < N; i++) tokens[i] = i + 1;
    kv_cache *c = make_cache(P, 16, 3, KV_F64);
    int32_t a, b, s, m;
    double cold[N * H * d], warm[N * H * d];
    CHECK_EQ_INT(kv_seq_new(c, &a), KV_OK);
    CHECK_EQ_INT(step_tokens_f64(c, a, &w.L, 8, tokens, x, cold), KV_OK);
    CHECK_EQ_INT(kv_seq_remove(c, a), KV_OK);
    CHECK_EQ_INT(kv_cache_get_stats(c).pages_cached, 2);
    CHECK_EQ_INT(kv_seq_new(c, &b), KV_OK);
    CHECK_EQ_INT(step_tokens_f64(c, b, &w.L, 12, tokens, x, cold), KV_OK);
    CHECK_EQ_INT(step_tokens_f64(c, b, &w.L, 1, tokens + 12, x + 12 * D, cold + 12 * H * d), KV_OK);
    /* b now holds the two cached pages instead of its twins, and its third page is named */
    kv_cache_stats st = kv_cache_get_stats(c);
    CHECK_EQ_INT(st.pages_used, 4);
    CHECK_EQ_INT(st.pages_cached, 0);
    CHECK_EQ_INT(st.pages_named, 3);
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_prefix_match(c, s, tokens, 12, &m), KV_OK);
    CHECK_EQ_INT(m, 12);
    CHECK_EQ_INT(step_tokens_f64(c, s, &w.L, N - m, tokens + m, x + m * D, warm + m * H * d), KV_OK);
    CHECK(ref_max_diff(cold + m * H * d, warm + m * H * d, (N - m) * H * d) == 0);
    /* and after b is gone, its pages are still found */
    CHECK_EQ_INT(kv_seq_remove(c, b), KV_OK);
    CHECK_EQ_INT(kv_seq_remove(c, s), KV_OK);
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_prefix_match(c, s, tokens, N, &m), KV_OK);
    CHECK_EQ_INT(m, 12);
    kv_cache_free(c);
    free_weights(&w);
    free(x);
}

TEST(prefix_clear_frees_every_cached_page_and_forgets_every_name) {
    enum { P = 4 };
    kv_cache *c = make_cache(P, 8, 2, KV_F32);
    int32_t s, live, m, ta[12], tb[8];
    for (int i = 0; i < 12; i++) ta[i] = i;
    for (int i = 0; i < 8; i++) tb[i] = 100 + i;
    CHECK_EQ_INT(kv_prefix_clear(NULL), KV_ERR_NULL);
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, s, 12, ta), KV_OK);
    CHECK_EQ_INT(kv_seq_remove(c, s), KV_OK);
    CHECK_EQ_INT(kv_seq_new(c, &live), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, live, 8, tb), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, live, 1, tb), KV_OK); /* names live's two full pages */
    kv_cache_stats st = kv_cache_get_stats(c);
    CHECK_EQ_INT(st.pages_cached, 3);
    CHECK_EQ_INT(st.pages_named, 5);
    CHECK_EQ_INT(kv_prefix_clear(c), KV_OK);
    st = kv_cache_get_stats(c);
    CHECK_EQ_INT(st.pages_cached, 0);
    CHECK_EQ_INT(st.pages_named, 0);
    CHECK_EQ_INT(st.pages_used, 3);
    CHECK_EQ_INT(st.pages_free, 5);
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_prefix_match(c, s, ta, 12, &m), KV_OK);
    CHECK_EQ_INT(m, 0);
    CHECK_EQ_INT(kv_seq_prefix_match(c, s, tb, 8, &m), KV_OK);
    CHECK_EQ_INT(m, 0);
    /* the live sequence's pages are named again by its next reserve, and once
     * every sequence is gone a clear leaves the whole pool free */
    CHECK_EQ_INT(kv_seq_reserve(c, live, 1, tb), KV_OK);
    CHECK_EQ_INT(kv_cache_get_stats(c).pages_named, 2);
    CHECK_EQ_INT(kv_seq_remove(c, live), KV_OK);
    CHECK_EQ_INT(kv_seq_remove(c, s), KV_OK);
    CHECK_EQ_INT(kv_cache_get_stats(c).pages_cached, 2);
    CHECK_EQ_INT(kv_prefix_clear(c), KV_OK);
    st = kv_cache_get_stats(c);
    CHECK_EQ_INT(st.pages_free, st.pages_total);
    CHECK_EQ_INT(st.pages_named, 0);
    /* the pool hands out the freed pages as usual */
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, s, 8 * P, NULL), KV_OK);
    kv_cache_free(c);
}

typedef struct {
    int n_stored, n_removed, n_cleared;
    uint64_t stored[16], parent[16], removed[16];
    int has_parent[16];
    int32_t first_token[16];
} prefix_log;

static void log_prefix_event(void *user, const kv_prefix_event *ev) {
    prefix_log *l = user;
    if (ev->kind == KV_PREFIX_STORED && l->n_stored < 16) {
        l->stored[l->n_stored] = ev->hash, l->parent[l->n_stored] = ev->parent_hash;
        l->has_parent[l->n_stored] = ev->has_parent, l->first_token[l->n_stored] = ev->tokens[0];
        CHECK_EQ_INT(ev->n_tokens, 4);
        l->n_stored++;
    } else if (ev->kind == KV_PREFIX_REMOVED && l->n_removed < 16) {
        l->removed[l->n_removed++] = ev->hash;
    } else if (ev->kind == KV_PREFIX_CLEARED) {
        l->n_cleared++;
    }
}

TEST(prefix_listener_sees_every_name_given_and_taken) {
    enum { P = 4 };
    kv_cache *c = make_cache(P, 6, 2, KV_F32);
    prefix_log l = {0};
    kv_cache_set_prefix_listener(NULL, log_prefix_event, &l); /* no cache: nothing happens */
    kv_cache_set_prefix_listener(c, log_prefix_event, &l);
    int32_t s, ta[8], tb[8];
    for (int i = 0; i < 8; i++) ta[i] = i, tb[i] = 50 + i;
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, s, 8, ta), KV_OK);
    CHECK_EQ_INT(kv_seq_remove(c, s), KV_OK);
    /* two pages, a chain: the second's parent is the first */
    CHECK_EQ_INT(l.n_stored, 2);
    CHECK_EQ_INT(l.has_parent[0], 0);
    CHECK_EQ_INT(l.has_parent[1], 1);
    CHECK(l.parent[1] == l.stored[0]);
    CHECK_EQ_INT(l.first_token[0], 0);
    CHECK_EQ_INT(l.first_token[1], 4);
    CHECK_EQ_INT(kv_cache_get_stats(c).pages_named, 2);
    /* a hit names nothing new */
    int32_t m;
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_prefix_match(c, s, ta, 8, &m), KV_OK);
    CHECK_EQ_INT(m, 8);
    CHECK_EQ_INT(kv_seq_remove(c, s), KV_OK);
    CHECK_EQ_INT(l.n_stored, 2);
    CHECK_EQ_INT(l.n_removed, 0);
    /* 24 positions need every page: both cached ones are reclaimed, and said so */
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, s, 24, NULL), KV_OK);
    CHECK_EQ_INT(kv_seq_remove(c, s), KV_OK);
    CHECK_EQ_INT(l.n_removed, 2);
    CHECK((l.removed[0] == l.stored[0] && l.removed[1] == l.stored[1]) ||
          (l.removed[0] == l.stored[1] && l.removed[1] == l.stored[0]));
    /* a clear is one event, not one per page */
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, s, 8, tb), KV_OK);
    CHECK_EQ_INT(kv_seq_remove(c, s), KV_OK);
    CHECK_EQ_INT(l.n_stored, 4);
    CHECK_EQ_INT(kv_prefix_clear(c), KV_OK);
    CHECK_EQ_INT(l.n_cleared, 1);
    CHECK_EQ_INT(l.n_removed, 2);
    /* removed, the listener hears nothing more */
    kv_cache_set_prefix_listener(c, NULL, NULL);
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    CHECK_EQ_INT(kv_seq_reserve(c, s, 8, ta), KV_OK);
    CHECK_EQ_INT(kv_seq_remove(c, s), KV_OK);
    CHECK_EQ_INT(kv_prefix_clear(c), KV_OK);
    CHECK_EQ_INT(l.n_stored, 4);
    CHECK_EQ_INT(l.n_cleared, 1);
    kv_cache_free(c);
}
