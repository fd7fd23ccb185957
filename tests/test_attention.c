/* tests/test_attention.c - the cache's attention equals the float64 oracle:
 * the seed's property, the offset mask, GQA/MQA, and randomized cases over
 * shapes, chunk schedules, windows, RoPE layouts and storage types. */
#include <string.h>

#include "helpers.h"

/* ------------------------------------------------------------------ the seed */

TEST(seed_prefill_then_decode_equals_one_full_pass_f64) {
    enum { H = 8, Hkv = 2, d = 16, D = 64, N = 13 };
    test_rng r = {0};
    double *wq = rand_normal(&r, D * H * d, 1.0 / 8), *wk = rand_normal(&r, D * Hkv * d, 1.0 / 8);
    double *wv = rand_normal(&r, D * Hkv * d, 1.0 / 8), *x = rand_normal(&r, N * D, 1.0);
    kv_layer L = {.layer = 0, .dim = D, .n_heads = H, .wq = wq, .wk = wk, .wv = wv};
    kv_cache_params p = kv_cache_default_params();
    p.n_kv_heads = Hkv, p.head_dim = d, p.dtype = KV_F64;

    kv_cache *full_c, *part_c;
    int32_t s1, s2;
    CHECK_EQ_INT(kv_cache_create(&p, &full_c), KV_OK);
    CHECK_EQ_INT(kv_cache_create(&p, &part_c), KV_OK);
    CHECK_EQ_INT(kv_seq_new(full_c, &s1), KV_OK);
    CHECK_EQ_INT(kv_seq_new(part_c, &s2), KV_OK);

    double full[N * H * d], parts[N * H * d], oracle[N * H * d];
    CHECK_EQ_INT(step_seq_f64(full_c, s1, &L, N, x, full), KV_OK);
    CHECK_EQ_INT(step_seq_f64(part_c, s2, &L, 5, x, parts), KV_OK);
    for (int i = 5; i < N; i++)
        CHECK_EQ_INT(step_seq_f64(part_c, s2, &L, 1, x + i * D, parts + i * H * d), KV_OK);
    CHECK(ref_max_diff(full, parts, N * H * d) < 1e-12);
    ref_forward(N, D, H, Hkv, d, x, wq, wk, wv, NULL, 0, oracle, NULL, NULL, NULL);
    CHECK(ref_max_diff(full, oracle, N * H * d) < 1e-12);
    CHECK_EQ_INT(kv_seq_length(part_c, s2), N);
    /* the cache holds the 2 KV heads, not the 8 query heads */
    CHECK_EQ_INT(kv_cache_get_stats(part_c).bytes_per_token, 2 * Hkv * d * 8);

    kv_cache_free(full_c);
    kv_cache_free(part_c);
    free(wq), free(wk), free(wv), free(x);
}

TEST(seed_empty_input_returns_empty_result) {
    enum { H = 8, Hkv = 2, d = 16, D = 64 };
    test_rng r = {1};
    double *w = rand_normal(&r, D * H * d, 1.0 / 8);
    kv_layer L = {.dim = D, .n_heads = H, .wq = w, .wk = w, .wv = w};
    kv_cache_params p = kv_cache_default_params();
    p.n_kv_heads = Hkv, p.head_dim = d, p.dtype = KV_F64;
    kv_cache *c;
    int32_t s;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    double sentinel = 12345.0, out = sentinel;
    /* T = 0 on an empty cache: nothing to attend, nothing written, no softmax over nothing */
    CHECK_EQ_INT(step_seq_f64(c, s, &L, 0, NULL, &out), KV_OK);
    CHECK(out == sentinel);
    CHECK_EQ_INT(kv_seq_length(c, s), 0);
    CHECK_EQ_INT(kv_attention_f64(0, 0, H, Hkv, d, NULL, NULL, NULL, NULL, 0, 0), KV_OK);
    kv_cache_free(c);
    free(w);
}

/* ------------------------------------------------------------------ the mask */

TEST(offset_mask_T3_S7_matches_oracle_and_top_left_mask_differs) {
    enum { T = 3, S = 7, H = 4, Hkv = 2, d = 8 };
    test_rng r = {2};
    double *q = rand_normal(&r, T * H * d, 1), *k = rand_normal(&r, S * Hkv * d, 1);
    double *v = rand_normal(&r, S * Hkv * d, 1);
    double out[T * H * d], oracle[T * H * d], wrong[T * H * d];
    CHECK_EQ_INT(kv_attention_f64(T, S, H, Hkv, d, q, k, v, out, 0, 0), KV_OK);
    ref_attention(T, S, H, Hkv, d, q, k, v, oracle, 0, 0, 0);
    ref_attention(T, S, H, Hkv, d, q, k, v, wrong, 0, 0, 1);
    CHECK(ref_max_diff(out, oracle, T * H * d) < 1e-13);
    CHECK(ref_max_diff(out, wrong, T * H * d) > 1e-2); /* the test would catch tril */
    /* query 0 sits at S - T = 4: it sees keys 0..4, five of them */
    int seen = 0;
    for (int j = 0; j < S; j++) seen += ref_visible(T, S, 0, j, 0);
    CHECK_EQ_INT(seen, 5);

    /* the same through the cache: 4 positions cached earlier, 3 new */
    kv_cache_params p = kv_cache_default_params();
    p.n_kv_heads = Hkv, p.head_dim = d, p.dtype = KV_F64, p.page_size = 3;
    kv_cache *c;
    int32_t s, rows[2];
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
    CHECK_EQ_INT(kv_seq_new(c, &s), KV_OK);
    kv_batch b = one_seq(&s, rows, 4);
    CHECK_EQ_INT(kv_seq_reserve(c, s, 4, NULL), KV_OK);
    CHECK_EQ_INT(kv_append_f64(c, 0, &b, k, v), KV_OK);
    b = one_seq(&s, rows, 3);
    CHECK_EQ_INT(kv_seq_reserve(c, s, 3, NULL), KV_OK);
    CHECK_EQ_INT(kv_append_f64(c, 0, &b, k + 4 * Hkv * d, v + 4 * Hkv * d), KV_OK);
    CHECK_EQ_INT(kv_attend_f64(c, 0, &b, H, q, out, 0), KV_OK);
    CHECK(ref_max_diff(out, oracle, T * H * d) < 1e-13);
    kv_cache_free(c);
    free(q), free(k), free(v);
}

TEST(mqa_and_gqa_index_the_group_without_copying) {
    test_rng r = {3};
    const int cases[][3] = {{8, 1, 16}, {8, 8, 16}, {12, 3, 32}, {16, 4, 64}};
    for (int ci = 0; ci < 4; ci++) {
        int H = cases[ci][0], Hkv = cases[ci][1], d = cases[ci][2], T = 5, S = 11;
        double *q = rand_normal(&r, T * H * d, 1), *k = rand_normal(&r, S * Hkv * d, 1);
        double *v = rand_normal(&r, S * Hkv * d, 1);
        double *out = malloc(sizeof(double) * T * H * d), *oracle = malloc(sizeof(double) * T * H * d);
        CHECK_EQ_INT(kv_attention_f64(T, S, H, Hkv, d, q, k, v, out, 0, 0), KV_OK);
        ref_attention(T, S, H, Hkv, d, q, k, v, oracle, 0, 0, 0);
        CHECK(ref_max_diff(out, oracle, T * H * d) < 1e-12);
        float *qf = to_f32(q, T * H * d), *kf = to_f32(k, S * Hkv * d), *vf = to_f32(v, S * Hkv * d);
        float *of = malloc(sizeof(float) * T * H * d);
        CHECK_EQ_INT(kv_attention_f32(T, S, H, Hkv, d, qf, kf, vf, of, 0, 0), KV_OK);
        for (int i = 0; i < T * H * d; i++) CHECK_NEAR(of[i], oracle[i], 1e-5 * ref_max_abs(oracle, T * H * d));
        free(q), free(k), free(v), free(out), free(oracle), free(qf), free(kf), free(vf), free(of);
    }
}

TEST(huge_scores_stay_finite) {
    /* scores of order 1e4: exp would overflow without the running max */
    enum { T = 4, S = 9, H = 2, Hkv = 1, d = 16 };
    test_rng r = {4};
    double *q = rand_normal(&r, T * H * d, 300), *k = rand_normal(&r, S * Hkv * d, 300);
    double *v = rand_normal(&r, S * Hkv * d, 1);
    double out[T * H * d], oracle[T * H * d];
    float qf[T * H * d], kf[S * Hkv * d], vf[S * Hkv * d], of[T * H * d];
    CHECK_EQ_INT(kv_attention_f64(T, S, H, Hkv, d, q, k, v, out, 0, 0), KV_OK);
    ref_attention(T, S, H, Hkv, d, q, k, v, oracle, 0, 0, 0);
    CHECK(ref_max_diff(out, oracle, T * H * d) < 1e-12);
    for (int i = 0; i < T * H * d; i++) qf[i] = (float)q[i];
    for (int i = 0; i < S * Hkv * d; i++) kf[i] = (float)k[i], vf[i] = (float)v[i];
    CHECK_EQ_INT(kv_attention_f32(T, S, H, Hkv, d, qf, kf, vf, of, 0, 0), KV_OK);
    for (int i = 0; i < T * H * d; i++) CHECK(isfinite(of[i]));
    free(q), free(k), free(v);
}

/* ------------------------------------------------------------------ randomized */

typedef struct {
    int H, Hkv, d, D, N, page, window;
    kv_dtype dtype;
    int rope;       /* 0 none, 1 neox, 2 interleaved */
    ref_rope_cfg rc;
} rcase;

static rcase random_case(test_rng *r, kv_dtype dtype) {
    static const int dims[] = {16, 64, 80, 128}, pages[] = {1, 3, 16, 64};
    rcase c = {0};
    c.Hkv = test_rng_int(r, 1, 16);
    c.H = c.Hkv * test_rng_int(r, 1, 16 / c.Hkv);
    c.d = dims[test_rng_int(r, 0, 3)];
    c.D = test_rng_int(r, 4, 40);
    c.N = test_rng_int(r, 1, 40);
    c.page = pages[test_rng_int(r, 0, 3)];
    c.window = test_rng_int(r, 0, 1) ? test_rng_int(r, 1, c.N + 2) : 0;
    c.dtype = dtype;
    c.rope = test_rng_int(r, 0, 2);
    c.rc = (ref_rope_cfg){.rot_dim = test_rng_int(r, 0, 1) ? c.d : c.d / 2, .interleaved = c.rope == 2,
                          .theta = test_rng_int(r, 0, 1) ? 10000.0 : 500000.0, .llama3 = test_rng_int(r, 0, 1),
                          .factor = 8, .low = 1, .high = 4, .original_context = 64};
    return c;
}

/* Runs a random chunk schedule through kv_step and returns max |ours - oracle|;
 * *bound receives the tolerance for the case's storage type (see below). */
static double run_case(test_rng *r, const rcase *c, double *bound) {
    const int N = c->N, D = c->D, H = c->H, Hkv = c->Hkv, d = c->d;
    const bool f64 = c->dtype == KV_F64;
    double *wq = rand_normal(r, D * H * d, 1.0 / sqrt(D)), *wk = rand_normal(r, D * Hkv * d, 1.0 / sqrt(D));
    double *wv = rand_normal(r, D * Hkv * d, 1.0 / sqrt(D)), *x = rand_normal(r, N * D, 1.0);
    if (!f64) {
        round_f32(wq, D * H * d), round_f32(wk, D * Hkv * d), round_f32(wv, D * Hkv * d), round_f32(x, N * D);
    }
    double *oracle = malloc(sizeof(double) * N * H * d), *q = malloc(sizeof(double) * N * H * d);
    double *k = malloc(sizeof(double) * N * Hkv * d), *v = malloc(sizeof(double) * N * Hkv * d);
    ref_forward(N, D, H, Hkv, d, x, wq, wk, wv, c->rope ? &c->rc : NULL, c->window, oracle, q, k, v);

    kv_rope rope;
    kv_rope_params rp = {.head_dim = d, .rot_dim = c->rc.rot_dim, .theta = c->rc.theta,
                         .layout = c->rope == 2 ? KV_ROPE_INTERLEAVED : KV_ROPE_NEOX,
                         .scaling = c->rc.llama3 ? KV_ROPE_SCALING_LLAMA3 : KV_ROPE_SCALING_NONE,
                         .factor = c->rc.factor, .low_freq_factor = c->rc.low,
                         .high_freq_factor = c->rc.high, .original_context = c->rc.original_context};
    CHECK_EQ_INT(kv_rope_init(&rope, &rp), KV_OK);
    kv_cache_params p = kv_cache_default_params();
    p.n_kv_heads = Hkv, p.head_dim = d, p.dtype = c->dtype, p.page_size = c->page, p.window = c->window;
    p.n_pages = N + 2;
    kv_cache *cache;
    int32_t s;
    CHECK_EQ_INT(kv_cache_create(&p, &cache), KV_OK);
    CHECK_EQ_INT(kv_seq_new(cache, &s), KV_OK);

    float *xf = to_f32(x, N * D), *wqf = to_f32(wq, D * H * d), *wkf = to_f32(wk, D * Hkv * d);
    float *wvf = to_f32(wv, D * Hkv * d), *outf = malloc(sizeof(float) * N * H * d);
    double *out = malloc(sizeof(double) * N * H * d);
    kv_layer L = {.dim = D, .n_heads = H, .wq = f64 ? (void *)wq : wqf, .wk = f64 ? (void *)wk : wkf,
                  .wv = f64 ? (void *)wv : wvf, .rope = c->rope ? &rope : NULL};
    for (int t0 = 0; t0 < N;) {
        int t = test_rng_int(r, 1, N - t0);
        if (test_rng_int(r, 0, 2)) t = 1; /* mostly decode steps */
        int rc = f64 ? step_seq_f64(cache, s, &L, t, x + t0 * D, out + t0 * H * d)
                     : step_seq_f32(cache, s, &L, t, xf + t0 * D, outf + t0 * H * d);
        CHECK_EQ_INT(rc, KV_OK);
        t0 += t;
    }
    if (!f64)
        for (int i = 0; i < N * H * d; i++) out[i] = outf[i];
    double err = ref_max_diff(out, oracle, N * H * d);

    /* Tolerance. f64: 1e-12 absolute. f32 arithmetic: 1e-5 of max|out|.
     * Storage rounding adds, for a relative element error u (f16 2^-11, bf16
     * 2^-8; q8 rounds to max|row|/254): rounding V moves the output, a convex
     * combination of V rows, by at most u max|v|; rounding K moves each score
     * by at most delta = scale u |q| |k| (Cauchy-Schwarz), which moves each
     * softmax weight p to within p (e^{2 delta} - 1), hence the output by at
     * most (e^{2 delta} - 1) max|v|. */
    double vmax = ref_max_abs(v, N * Hkv * d), qn = 0, kn = 0, kinf = 0, q1 = 0;
    for (int i = 0; i < N * H; i++) {
        double n2 = 0, n1 = 0;
        for (int e = 0; e < d; e++) n2 += q[i * d + e] * q[i * d + e], n1 += fabs(q[i * d + e]);
        qn = fmax(qn, sqrt(n2)), q1 = fmax(q1, n1);
    }
    for (int i = 0; i < N * Hkv; i++) {
        double n2 = 0;
        for (int e = 0; e < d; e++) n2 += k[i * d + e] * k[i * d + e], kinf = fmax(kinf, fabs(k[i * d + e]));
        kn = fmax(kn, sqrt(n2));
    }
    double scale = 1 / sqrt(d), u = 0, delta = 0;
    switch (c->dtype) {
    case KV_F64: *bound = 1e-12; break;
    case KV_F32: *bound = 1e-5 * fmax(ref_max_abs(oracle, N * H * d), 1e-3); break;
    case KV_F16: u = 0x1p-11, delta = scale * u * qn * kn; break;
    case KV_BF16: u = 0x1p-8, delta = scale * u * qn * kn; break;
    case KV_Q8: u = 1.0 / 254, delta = scale * q1 * kinf / 254; break;
    }
    if (c->dtype >= KV_F16) *bound = vmax * (u + (exp(2 * delta) - 1) * (1 + u)) + 1e-5 * vmax;

    kv_cache_free(cache);
    free(wq), free(wk), free(wv), free(x), free(oracle), free(q), free(k), free(v);
    free(xf), free(wqf), free(wkf), free(wvf), free(outf), free(out);
    return err;
}

static void random_cases(kv_dtype dtype, int n, unsigned long long seed) {
    test_rng r = {seed};
    double worst = 0;
    if (test_quick()) n /= 4;
    for (int i = 0; i < n; i++) {
        rcase c = random_case(&r, dtype);
        double bound, err = run_case(&r, &c, &bound);
        if (!(err <= bound))
            test_fail(__FILE__, __LINE__, "%s case %d: H=%d Hkv=%d d=%d N=%d page=%d window=%d rope=%d: err %.3g > bound %.3g",
                      kv_dtype_name(dtype), i, c.H, c.Hkv, c.d, c.N, c.page, c.window, c.rope, err, bound);
        worst = fmax(worst, err / bound);
    }
    printf("     %s: %d cases, worst error / bound = %.3g\n", kv_dtype_name(dtype), n, worst);
}

TEST(random_chunk_schedules_f64_within_1e12) { random_cases(KV_F64, 300, 100); }
TEST(random_chunk_schedules_f32_within_1e5_relative) { random_cases(KV_F32, 300, 200); }
TEST(random_chunk_schedules_f16_within_derived_bound) { random_cases(KV_F16, 150, 300); }
TEST(random_chunk_schedules_bf16_within_derived_bound) { random_cases(KV_BF16, 150, 400); }
TEST(random_chunk_schedules_q8_within_derived_bound) { random_cases(KV_Q8, 150, 500); }
