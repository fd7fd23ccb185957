/* tests/test_kernels.c - the FP32 kernels: every SIMD path against the
 * float64 oracle (over the K/V as stored, so storage rounding is out of the
 * comparison), long contexts cut into splits, and results identical for any
 * thread count and any cutting of a call into waves. */
#include <pthread.h>
#include <string.h>

#include "helpers.h"
#include "snapshot.h"
#include "../src/attend.h"

typedef struct {
    int H, Hkv, d, S, T, P, window;
    kv_dtype dtype;
} kcase;

/* A cache holding S random positions of one sequence. */
static kv_cache *filled(test_rng *r, const kcase *k, int32_t *seq) {
    kv_cache_params p = kv_cache_default_params();
    p.n_kv_heads = k->Hkv, p.head_dim = k->d, p.dtype = k->dtype, p.page_size = k->P;
    p.n_pages = k->S / k->P + 2, p.window = k->window;
    kv_cache *c;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
    CHECK_EQ_INT(kv_seq_new(c, seq), KV_OK);
    /* written in chunks, as decoding would: a window cache evicts as it goes */
    for (int t0 = 0; t0 < k->S;) {
        int t = k->S - t0 < 700 ? k->S - t0 : 700;
        int32_t rows[2];
        kv_batch b = one_seq(seq, rows, t);
        double *kd = rand_normal(r, (size_t)t * k->Hkv * k->d, 1), *vd = rand_normal(r, (size_t)t * k->Hkv * k->d, 1);
        float *kf = to_f32(kd, (size_t)t * k->Hkv * k->d), *vf = to_f32(vd, (size_t)t * k->Hkv * k->d);
        CHECK_EQ_INT(kv_seq_reserve(c, *seq, t, NULL), KV_OK);
        CHECK_EQ_INT(kv_append_f32(c, 0, &b, kf, vf), KV_OK);
        free(kd), free(vd), free(kf), free(vf);
        t0 += t;
    }
    return c;
}

/* The float64 oracle for the last T rows of one call, over the K/V as
 * stored (evicted positions are invisible anyway), with its largest value and
 * q8i_output_bound relative to it (for the paths whose scores come from int16
 * queries; oracle_q NULL: the kernel's own query, the case that bound is for). */
typedef struct {
    double *ref, mx, q8i;
} oracle;

/* the bound a kernel on the selected path must stay under: 2e-5 relative,
 * plus the int16 queries' where it takes them */
static double oracle_allow(const oracle *o, kv_dtype t) { return 2e-5 + (int16_queries(t) ? o->q8i : 0); }

static oracle oracle_of(const kv_cache *c, int32_t seq, const kcase *k, const float *q, const double *oracle_q) {
    const int S = k->S, T = k->T, H = k->H, Hkv = k->Hkv, d = k->d;
    int from = k->window > 0 ? S - T - k->window + 1 : 0;
    if (from < 0) from = 0;
    float *kf = calloc((size_t)S * Hkv * d, sizeof(float)), *vf = calloc((size_t)S * Hkv * d, sizeof(float));
    CHECK_EQ_INT(kv_read_f32(c, 0, seq, from, S - from, kf + (size_t)from * Hkv * d, vf + (size_t)from * Hkv * d), KV_OK);
    const size_t nq = (size_t)T * H * d, nkv = (size_t)S * Hkv * d;
    double *kd = malloc(sizeof(double) * nkv), *vd = malloc(sizeof(double) * nkv), *qd = malloc(sizeof(double) * nq);
    oracle o = {.ref = malloc(sizeof(double) * nq)};
    for (size_t i = 0; i < nkv; i++) kd[i] = kf[i], vd[i] = vf[i];
    for (size_t i = 0; i < nq; i++) qd[i] = oracle_q ? oracle_q[i] : q[i];
    ref_attention(T, S, H, Hkv, d, qd, kd, vd, o.ref, k->window, oracle_q ? 1.0 : 0, 0);
    o.mx = ref_max_abs(o.ref, (int)nq);
    if (!oracle_q && k->dtype == KV_Q8) o.q8i = q8i_output_bound(qd, nq, kd, vd, nkv, d) / o.mx;
    free(kf), free(vf), free(kd), free(vd), free(qd);
    return o;
}

/* max |kv_attend_f32 - oracle| / max |oracle| on the selected SIMD path */
static double path_error(const kv_cache *c, int32_t seq, const kcase *k, const float *q, const oracle *o) {
    const size_t n = (size_t)k->T * k->H * k->d;
    int32_t rows[2];
    kv_batch b = one_seq(&seq, rows, k->T);
    float *out = malloc(sizeof(float) * n);
    CHECK_EQ_INT(kv_attend_f32(c, 0, &b, k->H, q, out, 0), KV_OK);
    double err = 0;
    for (size_t i = 0; i < n; i++) err = fmax(err, fabs(out[i] - o->ref[i]));
    if (isnan(out[0])) err = INFINITY;
    free(out);
    return err / o->mx;
}

static double attend_error_q(const kv_cache *c, int32_t seq, const kcase *k, const float *q, const double *oracle_q,
                             double *allow) {
    oracle o = oracle_of(c, seq, k, q, oracle_q);
    const double err = path_error(c, seq, k, q, &o);
    if (allow) *allow = oracle_allow(&o, k->dtype);
    free(o.ref);
    return err;
}

static const char *const simd_names[] = {"scalar", "avx2", "avx512"};

/* Selects the SIMD paths this CPU has, one after another, from *si = -1:
 * for (int si = -1; next_simd(&si);) ...; false after the last, with the
 * choice in force before the loop back (KVCACHE_SIMD's, for the tests after
 * this one: "auto" would drop it, and a forced scalar run would go on with
 * SIMD kernels). */
static bool next_simd(int *si) {
    static const char *was;
    if (*si == -1) was = kv_simd_name();
    while (++*si < 3) {
        if (kv_simd_select(simd_names[*si]) == KV_OK) return true;
        printf("     %s: not available on this CPU, not tested here\n", simd_names[*si]);
    }
    kv_simd_select(was);
    return false;
}

static double attend_error(const kv_cache *c, int32_t seq, const kcase *k, const float *q, double *allow) {
    return attend_error_q(c, seq, k, q, NULL, allow);
}

/* One case of random K/V and queries, the oracle computed once, every SIMD
 * path this CPU has against it: fails past the oracle's bound; the worst
 * error of each path goes into worst[si] (if given). Returns the number of
 * paths tested. */
static int oracle_case(test_rng *r, const kcase *k, double worst[3]) {
    int32_t seq;
    kv_cache *c = filled(r, k, &seq);
    double *qd = rand_normal(r, (size_t)k->T * k->H * k->d, 1);
    float *q = to_f32(qd, (size_t)k->T * k->H * k->d);
    oracle o = oracle_of(c, seq, k, q, NULL);
    int tested = 0;
    for (int si = -1; next_simd(&si); tested++) {
        const double err = path_error(c, seq, k, q, &o), allow = oracle_allow(&o, k->dtype);
        if (!(err < allow))
            test_fail(__FILE__, __LINE__, "%s: H=%d Hkv=%d d=%d S=%d T=%d P=%d W=%d %s: relative error %.3g (bound %.3g)",
                      simd_names[si], k->H, k->Hkv, k->d, k->S, k->T, k->P, k->window, kv_dtype_name(k->dtype), err,
                      allow);
        if (worst) worst[si] = fmax(worst[si], err);
    }
    kv_cache_free(c);
    free(qd), free(q), free(o.ref);
    return tested;
}

TEST(kernels_every_simd_path_matches_the_oracle) {
    /* 100: not a multiple of either width, so the chunk kernels' tails run */
    static const int dims[] = {64, 80, 96, 128, 256, 100};
    test_rng r = {700};
    double worst[3] = {-1, -1, -1};
    int tested = 0;
    for (int it = 0; it < (test_quick() ? 20 : 40); it++) {
        kcase k;
        k.Hkv = test_rng_int(&r, 1, 8);
        k.H = k.Hkv * test_rng_int(&r, 1, 8);
        k.d = dims[it % 6];
        k.S = test_rng_int(&r, 1, it % 4 == 0 ? 2600 : 200); /* some cut into splits */
        k.T = test_rng_int(&r, 1, k.S < 12 ? k.S : 12);
        k.P = test_rng_int(&r, 1, 40);
        k.window = test_rng_int(&r, 0, 2) == 0 ? test_rng_int(&r, 1, k.S + 3) : 0;
        k.dtype = (kv_dtype)test_rng_int(&r, KV_F32, KV_Q8);
        tested = oracle_case(&r, &k, worst);
    }
    for (int si = 0; si < 3; si++)
        if (worst[si] >= 0) printf("     %s: worst relative error %.2g\n", simd_names[si], worst[si]);
    CHECK(tested >= 1);
}

/* The KV_Q8 integer scores (AVX-512): on decode-shaped calls (T x G <= 8
 * vectors, d % 32 == 0) every query vector is taken as int16, scaled vector
 * by vector as src/attend.c's quantize_queries specifies: x = q * (float)
 * (1 / sqrt(d)) in float, qs = max |x| / 32767, qi = x / qs rounded to
 * nearest even. Given qs qi as its query (scale 1), the oracle must then
 * agree within the f32 bound, so an error in the integer dots, their sums or
 * their scales shows at 2e-5, not under the looser q8i_output_bound. */
TEST(kernels_q8_integer_scores_match_the_oracle_on_the_query_they_take) {
    const char *was = kv_simd_name();
    for (int novnni = 0; novnni < 2; novnni++) { /* vpdpwssd where the CPU has it, then vpmaddwd + vpaddd */
        setenv("KVCACHE_NO_VNNI", novnni ? "1" : "0", 1);
        if (kv_simd_select("avx512") != KV_OK) {
            printf("     avx512: not available on this CPU, not tested here\n");
            break;
        }
        test_rng r = {733};
        double worst = 0;
        for (int it = 0; it < 30; it++) {
            kcase k = {.d = (it % 3 + 1) * 64, .P = test_rng_int(&r, 1, 40), .dtype = KV_Q8};
            const int G = (int[]){1, 2, 3, 4, 8}[it % 5];
            k.Hkv = test_rng_int(&r, 1, 4), k.H = k.Hkv * G;
            k.S = test_rng_int(&r, 1, it % 3 == 0 ? 2600 : 300);
            k.T = G <= 4 && k.S >= 2 ? test_rng_int(&r, 1, 2) : 1;
            k.window = it % 4 == 1 ? test_rng_int(&r, 1, k.S + 3) : 0;
            int32_t seq;
            kv_cache *c = filled(&r, &k, &seq);
            const size_t n = (size_t)k.T * k.H * k.d;
            double *qd = rand_normal(&r, n, 1), *taken = malloc(sizeof(double) * n);
            float *q = to_f32(qd, n);
            const float scale = (float)(1.0 / sqrt(k.d));
            for (size_t v = 0; v < n / k.d; v++) {
                float x[512], amax = 0;
                for (int e = 0; e < k.d; e++) x[e] = q[v * k.d + e] * scale, amax = fmaxf(amax, fabsf(x[e]));
                const float qs = amax / 32767.0f;
                for (int e = 0; e < k.d; e++) taken[v * k.d + e] = (double)qs * rintf(x[e] / qs);
            }
            const double err = attend_error_q(c, seq, &k, q, taken, NULL);
            worst = fmax(worst, err);
            if (!(err < 2e-5))
                test_fail(__FILE__, __LINE__, "H=%d Hkv=%d d=%d S=%d T=%d P=%d W=%d: relative error %.3g", k.H, k.Hkv,
                          k.d, k.S, k.T, k.P, k.window, err);
            kv_cache_free(c);
            free(qd), free(taken), free(q);
        }
        printf("     %s: worst relative error %.2g against the int16 queries\n", novnni ? "without VNNI" : "VNNI if any",
               worst);
    }
    unsetenv("KVCACHE_NO_VNNI");
    kv_simd_select(was);
}

/* Scores that rise past the exponential's range from one block of keys to
 * the next: 0 for the first 64 keys (a page and a prefill chunk boundary),
 * about 100 after them (e^100 overflows f32),
 * so a kernel that kept a stale running max instead of rescaling would
 * reach inf / inf. The online softmax stays exact up to rounding: the
 * scores near 100 carry an absolute f32 error of a few 1e-5 (their ulp is
 * 7.6e-6, summed over d products), which is the weights' relative error, so
 * the output must agree with the oracle within 1e-3 of its largest value.
 * Decode (T = 1, 2) and prefill (T = 40), all query group sizes to 8. */
TEST(kernels_scores_rising_past_the_exp_range_rescale_on_every_path) {
    test_rng r = {951};
    int tested = 0;
    for (int it = 0; it < 48; it++) { /* every group size, shape and storage type */
        const int G = (int[]){1, 3, 4, 8}[it % 4], shape = it / 4 % 3;
        kcase k = {.H = 2 * G, .Hkv = 2, .d = shape == 2 ? 128 : 64, .S = 160, .T = (int[]){1, 2, 40}[shape],
                   .P = 16, .dtype = (kv_dtype)(KV_F32 + it / 12)};
        kv_cache_params p = kv_cache_default_params();
        p.n_kv_heads = k.Hkv, p.head_dim = k.d, p.dtype = k.dtype, p.page_size = k.P, p.n_pages = k.S / k.P + 1;
        kv_cache *c;
        int32_t seq, rows[2];
        CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
        CHECK_EQ_INT(kv_seq_new(c, &seq), KV_OK);
        const size_t nkv = (size_t)k.S * k.Hkv * k.d, nq = (size_t)k.T * k.H * k.d;
        double *kd = rand_normal(&r, nkv, 0.1), *vd = rand_normal(&r, nkv, 1), *qd = rand_normal(&r, nq, 0.1);
        /* dim 0 carries the score: q[0] = sqrt(d) cancels the 1 / sqrt(d) scaling */
        for (int j = 0; j < k.S; j++)
            for (int h = 0; h < k.Hkv; h++) kd[((size_t)j * k.Hkv + h) * k.d] = j < 64 ? 0.0 : 100.0 + j % 7;
        for (size_t v = 0; v < nq / k.d; v++) qd[v * k.d] = sqrt(k.d);
        float *kf = to_f32(kd, nkv), *vf = to_f32(vd, nkv), *q = to_f32(qd, nq);
        kv_batch b = one_seq(&seq, rows, k.S);
        CHECK_EQ_INT(kv_seq_reserve(c, seq, k.S, NULL), KV_OK);
        CHECK_EQ_INT(kv_append_f32(c, 0, &b, kf, vf), KV_OK);
        oracle o = oracle_of(c, seq, &k, q, NULL);
        tested = 0;
        for (int si = -1; next_simd(&si); tested++) {
            const double err = path_error(c, seq, &k, q, &o);
            if (!(err < 1e-3))
                test_fail(__FILE__, __LINE__, "%s: G=%d d=%d T=%d %s: relative error %.3g", simd_names[si], G, k.d,
                          k.T, kv_dtype_name(k.dtype), err);
        }
        kv_cache_free(c);
        free(kd), free(vd), free(qd), free(kf), free(vf), free(q), free(o.ref);
    }
    CHECK(tested >= 1);
}

/* A long windowed prefill: items of several sub-tiles, whose windows start
 * at every offset within a chunk of keys (d = 128: 32 keys a chunk, 32
 * vectors a sub-tile), so that each sub-tile's first and last chunks are
 * exactly the ones it sees; and d = 384, one sub-tile of 10 vectors an item. */
TEST(kernels_prefill_sub_tiles_see_exactly_their_windows) {
    test_rng r = {901};
    int tested = 0;
    for (int g = 1; g <= 8; g *= 4)
        for (int w = 1; w <= 34; w += test_quick() ? 3 : 1) {
            kcase k = {.H = g == 8 ? 1 : g, .Hkv = 1, .d = g == 8 ? 384 : 128, .S = 170, .T = 100, .P = 16,
                       .window = w,
                       .dtype = w % 2 ? KV_F32 : KV_F16};
            tested = oracle_case(&r, &k, NULL);
        }
    CHECK(tested >= 1);
}

/* The outputs of one decode-like and one prefill-like call under `threads`. */
static void run_threads(kv_cache *c, int32_t seq, const kcase *k, const float *q, int threads, float *out) {
    kv_pool *pool = NULL;
    CHECK_EQ_INT(kv_pool_create(threads, &pool), KV_OK);
    kv_cache_set_pool(c, pool);
    int32_t rows[2];
    kv_batch b = one_seq(&seq, rows, k->T);
    CHECK_EQ_INT(kv_attend_f32(c, 0, &b, k->H, q, out, 0), KV_OK);
    kv_cache_set_pool(c, NULL);
    kv_pool_free(pool);
}

TEST(kernels_results_are_identical_for_any_thread_count_and_wave_cut) {
    test_rng r = {710};
    const kcase cases[] = {
        {.H = 8, .Hkv = 2, .d = 128, .S = 10500, .T = 1, .P = 16, .dtype = KV_F16}, /* 6 splits of 2048 */
        {.H = 9, .Hkv = 3, .d = 64, .S = 3001, .T = 4, .P = 7, .dtype = KV_Q8},
        {.H = 4, .Hkv = 4, .d = 80, .S = 700, .T = 300, .P = 16, .dtype = KV_BF16}, /* prefill tiles */
        {.H = 6, .Hkv = 1, .d = 96, .S = 2500, .T = 2, .P = 5, .window = 1500, .dtype = KV_F32},
        {.H = 8, .Hkv = 2, .d = 128, .S = 600, .T = 1, .P = 16, .dtype = KV_F16},  /* 3 splits of 256 */
        /* a 512-key window from 1488: 5 splits of 128, the first one short */
        {.H = 4, .Hkv = 1, .d = 64, .S = 2000, .T = 1, .P = 16, .window = 512, .dtype = KV_Q8},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const kcase *k = &cases[ci];
        int32_t seq;
        kv_cache *c = filled(&r, k, &seq);
        size_t n = (size_t)k->T * k->H * k->d;
        double *qd = rand_normal(&r, n, 1);
        float *q = to_f32(qd, n), *one = malloc(sizeof(float) * n), *many = malloc(sizeof(float) * n);
        run_threads(c, seq, k, q, 1, one);
        double allow, err = attend_error(c, seq, k, q, &allow);
        CHECK(err < allow);
        for (int t = 2; t <= 4; t++) {
            run_threads(c, seq, k, q, t, many);
            if (memcmp(one, many, sizeof(float) * n) != 0)
                test_fail(__FILE__, __LINE__, "case %zu: %d threads differ from 1", ci, t);
        }
        /* a tiny workspace cuts the call into many waves: same numbers */
        int32_t item_cap = c->work->item_cap;
        size_t partial_cap = c->work->partial_cap;
        c->work->item_cap = 7;
        /* room for one sequence's splits (of kv_split_len keys for all its heads, the shortest an item
         * of this cache has, or up to KV_SPLIT_SHORT + 1 short ones), no more */
        const size_t key_bytes = 2 * (size_t)k->Hkv * ((size_t)k->d * kv_dtype_size(k->dtype) +
                                                       (k->dtype == KV_Q8 ? sizeof(float) : 0));
        const size_t long_splits = (size_t)k->S / (size_t)kv_split_len(k->S, key_bytes) + 2;
        const size_t splits = long_splits > KV_SPLIT_SHORT + 1 ? long_splits : KV_SPLIT_SHORT + 1;
        c->work->partial_cap = splits * (size_t)k->H * k->T * (k->d + 2);
        run_threads(c, seq, k, q, 3, many);
        CHECK(memcmp(one, many, sizeof(float) * n) == 0);
        c->work->item_cap = item_cap, c->work->partial_cap = partial_cap;
        kv_cache_free(c);
        free(qd), free(q), free(one), free(many);
    }
}

/* Splits of a long decode hold KV_SPLIT_BYTES of K/V at least (in powers of
 * two from KV_SPLIT keys), and a short span is cut into at most
 * KV_SPLIT_SHORT of at least KV_SPLIT_MIN keys: the lengths depend on the
 * span and the bytes a key streams, nothing else. */
TEST(kernels_split_length_follows_the_span_and_the_bytes_a_key_streams) {
    const size_t d64_f16 = 2 * 3 * 64 * 2, d128_f16 = 2 * 8 * 128 * 2, one_head_q8 = 2 * (64 + 4);
    CHECK_EQ_INT(kv_split_len(131072, d64_f16), 4096);  /* 1024 keys hold 768 KB: four times that, 3 MB */
    CHECK_EQ_INT(kv_split_len(131072, d128_f16), 1024); /* 1024 keys hold 4 MB already */
    CHECK_EQ_INT(kv_split_len(1 << 30, one_head_q8), 16384);
    CHECK_EQ_INT(kv_split_len(600, d64_f16), 256);      /* short: three of 256 */
    CHECK_EQ_INT(kv_split_len(100, d64_f16), KV_SPLIT_MIN);
    CHECK_EQ_INT(kv_split_len(8192, d64_f16), 2048);    /* four of 2048, under the long length */
    CHECK_EQ_INT(kv_split_len(8192, d128_f16), 1024);
    for (int32_t n = 1; n < 70000; n += 997)
        for (size_t b = 16; b < 100000; b *= 3) {
            const int32_t len = kv_split_len(n, b);
            CHECK(len >= KV_SPLIT_MIN && (len & (len - 1)) == 0);
            /* few enough splits, or long ones */
            CHECK((n + len - 1) / len <= KV_SPLIT_SHORT || (size_t)len * b >= KV_SPLIT_BYTES);
            /* and no longer than either asks */
            CHECK(len <= KV_SPLIT || (size_t)(len / 2) * b < KV_SPLIT_BYTES);
            CHECK(len == KV_SPLIT_MIN || KV_SPLIT_SHORT * (len / 2) < n);
        }
}

TEST(kernels_ragged_batch_on_a_pool_equals_one_sequence_at_a_time) {
    test_rng r = {720};
    enum { N = 12, H = 8, Hkv = 2, d = 64 };
    kv_cache_params p = kv_cache_default_params();
    p.n_kv_heads = Hkv, p.head_dim = d, p.dtype = KV_F16, p.n_pages = 2048, p.max_seqs = N;
    kv_cache *c;
    CHECK_EQ_INT(kv_cache_create(&p, &c), KV_OK);
    kv_pool *pool;
    CHECK_EQ_INT(kv_pool_create(3, &pool), KV_OK);
    kv_cache_set_pool(c, pool);
    int32_t seqs[N], rows[N + 1] = {0};
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(kv_seq_new(c, &seqs[i]), KV_OK);
        int len = test_rng_int(&r, 1, 1500);
        rows[i + 1] = rows[i] + (i % 3 == 0 ? test_rng_int(&r, 1, len < 20 ? len : 20) : 1);
        CHECK_EQ_INT(kv_seq_reserve(c, seqs[i], len, NULL), KV_OK);
        int32_t r1[2];
        kv_batch one = one_seq(&seqs[i], r1, len);
        double *kd = rand_normal(&r, (size_t)len * Hkv * d, 1);
        float *kf = to_f32(kd, (size_t)len * Hkv * d);
        CHECK_EQ_INT(kv_append_f32(c, 0, &one, kf, kf), KV_OK);
        free(kd), free(kf);
    }
    size_t n = (size_t)rows[N] * H * d;
    double *qd = rand_normal(&r, n, 1);
    float *q = to_f32(qd, n), *all = malloc(sizeof(float) * n), *each = malloc(sizeof(float) * n);
    kv_batch b = {.n_seqs = N, .seqs = seqs, .row_start = rows};
    CHECK_EQ_INT(kv_attend_f32(c, 0, &b, H, q, all, 0), KV_OK);
    for (int i = 0; i < N; i++) {
        int32_t r1[2];
        kv_batch one = one_seq(&seqs[i], r1, rows[i + 1] - rows[i]);
        CHECK_EQ_INT(kv_attend_f32(c, 0, &one, H, q + (size_t)rows[i] * H * d, each + (size_t)rows[i] * H * d, 0), KV_OK);
    }
    CHECK(memcmp(all, each, sizeof(float) * n) == 0);
    kv_cache_free(c);
    kv_pool_free(pool);
    free(qd), free(q), free(all), free(each);
}

static void count(void *c_, int32_t task, int32_t thread) {
    int *counts = *(int **)c_;
    __atomic_add_fetch(&counts[task], 1, __ATOMIC_RELAXED);
    (void)thread;
}

TEST(kernels_pool_runs_every_task_once) {
    for (int threads = 1; threads <= 4; threads++) {
        kv_pool *pool;
        CHECK_EQ_INT(kv_pool_create(threads, &pool), KV_OK);
        CHECK_EQ_INT(kv_pool_threads(pool), threads);
        for (int job = 0; job < 200; job++) {
            int n = job % 37;
            int counts[40] = {0};
            CHECK_EQ_INT(kv_pool_run(pool, n, (kv_task_fn)NULL, NULL), KV_ERR_NULL);
            struct { int *counts; } ctx = {counts};
            CHECK_EQ_INT(kv_pool_run(pool, n, count, &ctx), KV_OK);
            for (int i = 0; i < n; i++) CHECK_EQ_INT(counts[i], 1);
        }
        kv_pool_free(pool);
    }
    kv_pool *p;
    CHECK_EQ_INT(kv_pool_create(-1, &p), KV_ERR_SHAPE);
    CHECK_EQ_INT(kv_simd_select("sse9"), KV_ERR_UNSUPPORTED);
}

/* Several threads attending on one cache at once, with long sequences cut
 * into splits that use the cache's work area: each gets its own answer. */
typedef struct {
    const kv_cache *c;
    int32_t seq;
    const float *q;
    float *out;
    const float *expect; /* NULL: just compute */
    int mismatches;
} attend_arg;

static void *attend_thread(void *p) {
    attend_arg *a = p;
    int32_t rows[2] = {0, 1};
    kv_batch b = {.n_seqs = 1, .seqs = &a->seq, .row_start = rows};
    for (int rep = 0; rep < (a->expect ? 300 : 1); rep++) {
        kv_attend_f32(a->c, 0, &b, 8, a->q, a->out, 0);
        if (a->expect && memcmp(a->out, a->expect, sizeof(float) * 8 * 64)) a->mismatches++;
    }
    return NULL;
}

TEST(kernels_concurrent_attend_calls_on_one_cache_do_not_mix) {
    test_rng r = {730};
    kcase k = {.H = 8, .Hkv = 2, .d = 64, .S = 4000, .T = 1, .P = 16, .dtype = KV_F16};
    int32_t seq;
    kv_cache *c = filled(&r, &k, &seq);
    enum { N = 4 };
    float *q[N], *serial[N], *together[N];
    pthread_t th[N];
    attend_arg args[N];
    for (int i = 0; i < N; i++) {
        double *qd = rand_normal(&r, 8 * 64, 1);
        q[i] = to_f32(qd, 8 * 64);
        free(qd);
        serial[i] = malloc(sizeof(float) * 8 * 64), together[i] = malloc(sizeof(float) * 8 * 64);
        args[i] = (attend_arg){c, seq, q[i], serial[i], NULL, 0};
        attend_thread(&args[i]);
        args[i].out = together[i], args[i].expect = serial[i];
    }
    for (int i = 0; i < N; i++) pthread_create(&th[i], NULL, attend_thread, &args[i]);
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(args[i].mismatches, 0);
        free(q[i]), free(serial[i]), free(together[i]);
    }
    kv_cache_free(c);
}

/* The header's stack promise: every attention path (decode, tile, chunks, the
 * float64 reference) runs on a thread with only 512 KiB of stack. */
typedef struct {
    int rc;
} small_stack_result;

static void *attend_on_small_stack(void *arg) {
    small_stack_result *r = arg;
    test_rng g = {77};
    r->rc = 0;
    const int32_t shapes[][4] = {{1, 300, 8, 64}, {64, 300, 8, 64}, {40, 200, 2, 512}, {3, 50, 1, 512}}; /* T S H d */
    for (int s = 0; s < 4; s++) {
        const int32_t T = shapes[s][0], S = shapes[s][1], H = shapes[s][2], dd = shapes[s][3];
        size_t nq = (size_t)T * H * dd, nk = (size_t)S * H * dd;
        double *q = rand_normal(&g, nq, 1), *k = rand_normal(&g, nk, 1), *v = rand_normal(&g, nk, 1);
        double *o = malloc(nq * sizeof(double));
        float *qf = to_f32(q, nq), *kf = to_f32(k, nk), *vf = to_f32(v, nk), *of = malloc(nq * sizeof(float));
        r->rc |= kv_attention_f32(T, S, H, H, dd, qf, kf, vf, of, 0, 0);
        r->rc |= kv_attention_f64(T, S, H, H, dd, q, k, v, o, 0, 0);
        double worst = 0;
        for (size_t i = 0; i < nq; i++) worst = fmax(worst, fabs(o[i] - of[i]));
        if (!(worst <= 1e-4)) {
            fprintf(stderr, "     shape %d: f32 vs f64 differ by %g\n", s, worst);
            r->rc |= 1;
        }
        free(q), free(k), free(v), free(o), free(qf), free(kf), free(vf), free(of);
    }
    return NULL;
}

/* AddressSanitizer puts redzones around every stack array: frames grow
 * about threefold, so the promise is checked at 4 x 512 KiB there. */
#if defined(__SANITIZE_ADDRESS__)
#define STACK_SCALE 4u
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define STACK_SCALE 4u
#endif
#endif
#ifndef STACK_SCALE
#define STACK_SCALE 1u
#endif

TEST(kernels_attention_runs_on_a_thread_with_512_KiB_of_stack) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    CHECK_EQ_INT(pthread_attr_setstacksize(&attr, STACK_SCALE * (512u << 10)), 0);
    small_stack_result r = {-1};
    pthread_t t;
    CHECK_EQ_INT(pthread_create(&t, &attr, attend_on_small_stack, &r), 0);
    pthread_join(t, NULL);
    pthread_attr_destroy(&attr);
    CHECK_EQ_INT(r.rc, 0);
}
