/* tests/test_engine_sampler.c - the sampler: greedy is the argmax, a seed
 * fixes the draws, and the draws follow softmax(logits / T) restricted by
 * top-k and top-p. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "../engine/model/fastexp.h"
#include "../engine/gen/sampler.h"

static llm_sampler make(float temp, int32_t top_k, float top_p, uint64_t seed, int32_t V) {
    llm_sampler s;
    llm_sampler_params p = {.temp = temp, .top_k = top_k, .top_p = top_p, .seed = seed};
    CHECK_EQ_INT(llm_sampler_init(&s, &p, V), 0);
    return s;
}

TEST(engine_sampler_greedy_is_the_argmax_and_prefers_the_lowest_id_on_ties) {
    float l[6] = {0.5f, 2.0f, -1.0f, 2.0f, NAN, 1.0f};
    llm_sampler s = make(0, 40, 0.95f, 1, 6);
    CHECK_EQ_INT(llm_sample(&s, l), 1);
    CHECK_EQ_INT(llm_argmax(l, 6), 1);
    float nan_first[3] = {NAN, -5.0f, -6.0f};
    CHECK_EQ_INT(llm_argmax(nan_first, 3), 1);
    llm_sampler_free(&s);
    /* top_k = 1 at any temperature is greedy too */
    s = make(1.5f, 1, 1.0f, 99, 6);
    for (int i = 0; i < 20; i++) CHECK_EQ_INT(llm_sample(&s, l), 1);
    llm_sampler_free(&s);
}

TEST(engine_sampler_same_seed_same_tokens_other_seed_other_tokens) {
    enum { V = 1000, N = 64 };
    float *l = malloc(sizeof(float) * V);
    test_rng r = {5};
    for (int i = 0; i < V; i++) l[i] = (float)test_rng_normal(&r);
    int32_t a[N], b[N], c[N];
    llm_sampler s1 = make(1.0f, 0, 1.0f, 7, V), s2 = make(1.0f, 0, 1.0f, 7, V), s3 = make(1.0f, 0, 1.0f, 8, V);
    for (int i = 0; i < N; i++) a[i] = llm_sample(&s1, l), b[i] = llm_sample(&s2, l), c[i] = llm_sample(&s3, l);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);
    llm_sampler_free(&s1), llm_sampler_free(&s2), llm_sampler_free(&s3);
    free(l);
}

/* Frequencies of 40,000 draws against the expected probabilities: each
 * within 5 standard deviations of a binomial count. */
static void check_frequencies(float temp, int32_t top_k, float top_p, const float *l, int V, const double *expect) {
    enum { DRAWS = 40000 };
    int counts[16] = {0};
    llm_sampler s = make(temp, top_k, top_p, 123, V);
    for (int i = 0; i < DRAWS; i++) counts[llm_sample(&s, l)]++;
    for (int i = 0; i < V; i++) {
        double mu = DRAWS * expect[i], sd = sqrt(DRAWS * expect[i] * (1 - expect[i]));
        if (!(fabs(counts[i] - mu) <= 5 * sd + 1e-9))
            test_fail(__FILE__, __LINE__, "T=%g k=%d p=%g: token %d drawn %d times, expected %.0f", temp, (int)top_k,
                      top_p, i, counts[i], mu);
    }
    llm_sampler_free(&s);
}

TEST(engine_sampler_draws_follow_softmax_with_temperature_top_k_and_top_p) {
    float l[5] = {1.0f, 3.0f, 0.0f, 2.0f, -1.0f};
    double e[5], z = 0;
    /* temperature 2 over everything */
    for (int i = 0; i < 5; i++) z += e[i] = exp(l[i] / 2.0);
    for (int i = 0; i < 5; i++) e[i] /= z;
    check_frequencies(2.0f, 0, 1.0f, l, 5, e);
    /* top-k 2 at temperature 1: only tokens 1 and 3, renormalized */
    double k2[5] = {0, exp(3.0) / (exp(3.0) + exp(2.0)), 0, exp(2.0) / (exp(3.0) + exp(2.0)), 0};
    check_frequencies(1.0f, 2, 1.0f, l, 5, k2);
    /* top-p 0.9 at temperature 1: probabilities .636 .234 .086 .032 .012 by rank; the
     * shortest prefix reaching 0.9 holds three tokens (1, 3, 0) */
    double z3 = exp(3.0) + exp(2.0) + exp(1.0);
    double p3[5] = {exp(1.0) / z3, exp(3.0) / z3, 0, exp(2.0) / z3, 0};
    check_frequencies(1.0f, 0, 0.9f, l, 5, p3);
}

/* The reference: the argmax as one plain loop (the first of the largest
 * logits that are not NaN; the first that is not NaN when none is above
 * -inf; 0 when all are NaN). */
static int32_t ref_argmax(const float *l, int32_t n) {
    int32_t best = -1;
    for (int32_t i = 0; i < n; i++)
        if (!isnan(l[i]) && (best < 0 || l[i] > l[best])) best = i;
    return best < 0 ? 0 : best;
}

TEST(engine_sampler_argmax_matches_a_plain_loop_on_ragged_lengths_ties_nan_and_inf) {
    test_rng r = {11};
    enum { N = 1000 };
    float *l = malloc(sizeof(float) * N);
    for (int trial = 0; trial < 400; trial++) {
        const int32_t n = 1 + test_rng_int(&r, 0, N - 1);
        const int kind = trial % 4; /* values from few distinct ones (ties), or continuous */
        for (int32_t i = 0; i < n; i++) l[i] = kind == 0 ? (float)test_rng_int(&r, -3, 3) : (float)test_rng_normal(&r);
        const int specials = test_rng_int(&r, 0, 6);
        for (int k = 0; k < specials; k++) {
            const float sp[3] = {NAN, -INFINITY, INFINITY};
            l[test_rng_int(&r, 0, n - 1)] = sp[test_rng_int(&r, 0, trial % 8 == 1 ? 1 : 2)];
        }
        if (trial % 16 == 3) /* no finite logit: all NaN, or NaN and -inf */
            for (int32_t i = 0; i < n; i++) l[i] = test_rng_int(&r, 0, 1) ? NAN : trial % 32 == 3 ? NAN : -INFINITY;
        if (llm_argmax(l, n) != ref_argmax(l, n))
            test_fail(__FILE__, __LINE__, "trial %d (n %d): argmax %d, the plain loop %d", trial, (int)n,
                      (int)llm_argmax(l, n), (int)ref_argmax(l, n));
    }
    free(l);
}

/* The reference distribution, in double: tokens ranked by logit (NaN as
 * -inf), then id; the top_k first; softmax at temp over them; the shortest
 * best-first prefix whose mass reaches top_p; renormalized into p [V]. */
static int by_logit_then_id(const void *pa, const void *pb, void *ctx) {
    const float *l = ctx;
    const int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    const double la = isnan(l[a]) ? -INFINITY : l[a], lb = isnan(l[b]) ? -INFINITY : l[b];
    return la > lb ? -1 : la < lb ? 1 : a < b ? -1 : a > b;
}

static void ref_distribution(const float *l, int32_t V, double temp, int32_t top_k, double top_p, double *p) {
    int32_t *rank = malloc(sizeof(int32_t) * (size_t)V);
    for (int32_t i = 0; i < V; i++) rank[i] = i, p[i] = 0;
    qsort_r(rank, (size_t)V, sizeof *rank, by_logit_then_id, (void *)l);
    const int32_t k = top_k > 0 && top_k < V ? top_k : V;
    double *w = malloc(sizeof(double) * (size_t)k), z = 0;
    for (int32_t j = 0; j < k; j++) z += w[j] = isnan(l[rank[j]]) ? 0 : exp(((double)l[rank[j]] - l[rank[0]]) / temp);
    int32_t keep = k;
    double cum = 0;
    for (int32_t j = 0; j < k && top_p < 1; j++)
        if ((cum += w[j] / z) >= top_p) {
            keep = j + 1;
            break;
        }
    double kept = 0;
    for (int32_t j = 0; j < keep; j++) kept += w[j];
    for (int32_t j = 0; j < keep; j++) p[rank[j]] = w[j] / kept;
    free(w), free(rank);
}

/* llm_sample_at over a grid of M draws u = (m + 1/2) / M: the share of the
 * grid each token takes is its probability, within 2 / M (a token's share is
 * one interval of [0, 1), or a few) plus 1e-5 of it (the float weights); a
 * token outside the top-k or the nucleus is never drawn. */
static void check_grid(const char *what, const float *l, int32_t V, float temp, int32_t top_k, float top_p,
                       int32_t M) {
    double *p = malloc(sizeof(double) * (size_t)V);
    int32_t *count = calloc((size_t)V, sizeof(int32_t));
    ref_distribution(l, V, temp, top_k, top_p, p);
    llm_sampler s = make(temp, top_k, top_p, 1, V);
    for (int32_t m = 0; m < M; m++) {
        const int32_t t = llm_sample_at(&s, l, (m + 0.5) / M);
        if (t < 0 || t >= V) {
            test_fail(__FILE__, __LINE__, "%s: token %d of %d", what, (int)t, (int)V);
            break;
        }
        count[t]++;
    }
    int bad = 0;
    for (int32_t i = 0; i < V && bad < 5; i++) {
        const double f = (double)count[i] / M;
        if (p[i] == 0 ? count[i] != 0 : !(fabs(f - p[i]) <= 2.0 / M + 1e-5 * p[i])) {
            test_fail(__FILE__, __LINE__, "%s (T %g, k %d, p %g): token %d drawn at %.6f of the grid, p = %.6f", what,
                      temp, (int)top_k, top_p, (int)i, f, p[i]);
            bad++;
        }
    }
    llm_sampler_free(&s);
    free(p), free(count);
}

TEST(engine_sampler_draws_match_a_double_reference_over_whole_vocabularies) {
    test_rng r = {21};
    /* 1501 tokens: blocks of 256 and runs of 16, with ragged ends */
    enum { V = 1501, M = 20000 };
    float *l = malloc(sizeof(float) * V);
    for (int32_t i = 0; i < V; i++) l[i] = (float)(2.0 * test_rng_normal(&r));
    check_grid("normal logits, all tokens", l, V, 1.0f, 0, 1.0f, M);
    check_grid("normal logits, nucleus 0.9", l, V, 1.0f, 0, 0.9f, M);
    check_grid("normal logits, cold, nucleus 0.5", l, V, 0.3f, 0, 0.5f, M);
    check_grid("normal logits, hot, nucleus 0.99", l, V, 2.0f, 0, 0.99f, M);
    check_grid("normal logits, top-k 50, nucleus 0.8", l, V, 1.0f, 50, 0.8f, M);
    /* peaked: a few tokens far above the rest (the nucleus is a handful of
     * them, found after no fall of tau or one), with ties among them */
    for (int j = 0; j < 12; j++) l[(j * 257 + 5) % V] = 12.0f - 0.5f * (float)(j / 2);
    check_grid("peaked with ties, all tokens", l, V, 1.0f, 0, 1.0f, M);
    check_grid("peaked with ties, nucleus 0.3", l, V, 1.0f, 0, 0.3f, M);
    check_grid("peaked with ties, nucleus 0.95", l, V, 0.7f, 0, 0.95f, M);
    /* one token holds nearly all: the nucleus is it alone */
    l[77] = 40.0f;
    check_grid("one dominant token, nucleus 0.9", l, V, 1.0f, 0, 0.9f, M);
    check_grid("one dominant token, all tokens", l, V, 1.0f, 0, 1.0f, M);
    /* flat: every token alike but for a little noise, so tau falls far */
    for (int32_t i = 0; i < V; i++) l[i] = (float)(0.01 * test_rng_normal(&r));
    check_grid("flat logits, nucleus 0.9", l, V, 1.0f, 0, 0.9f, M);
    check_grid("flat logits, all tokens", l, V, 1.0f, 0, 1.0f, M);
    /* NaN and -inf logits are never drawn; logits far below the top have no weight */
    for (int32_t i = 0; i < V; i++) l[i] = (float)(3.0 * test_rng_normal(&r));
    for (int32_t i = 0; i < V; i += 97) l[i] = NAN;
    for (int32_t i = 5; i < V; i += 89) l[i] = -INFINITY;
    for (int32_t i = 7; i < V; i += 101) l[i] = -1000.0f;
    check_grid("NaN, -inf and very low logits, all tokens", l, V, 1.0f, 0, 1.0f, M);
    check_grid("NaN, -inf and very low logits, nucleus 0.9", l, V, 1.0f, 0, 0.9f, M);
    check_grid("NaN, -inf and very low logits, top-k 200", l, V, 1.0f, 200, 1.0f, M);
    /* the last token the best: the ragged end of the last run and block */
    l[V - 1] = 12.0f, l[V - 2] = 11.5f;
    check_grid("the last two tokens best, top-k 3", l, V, 1.0f, 3, 1.0f, M);
    check_grid("the last two tokens best, all tokens", l, V, 1.0f, 0, 1.0f, M);
    check_grid("the last two tokens best, nucleus 0.5", l, V, 1.0f, 0, 0.5f, M);
    /* tiny vocabularies: shorter than a run of 16 */
    const float small[5] = {1.0f, 3.0f, 0.0f, 2.0f, -1.0f};
    check_grid("five tokens, all", small, 5, 2.0f, 0, 1.0f, M);
    check_grid("five tokens, nucleus 0.9", small, 5, 1.0f, 0, 0.9f, M);
    free(l);
}

/* Two tokens d apart at temperature T: token 0's share of [0, 1), found by
 * bisecting u to the one step between the tokens, is 1 / (1 + e^(d / T))
 * within 1e-5 of the smaller share (the float weights, and their exp over
 * its whole range of reduced arguments). */
TEST(engine_sampler_two_token_shares_match_the_softmax_closely) {
    const float temps[3] = {0.5f, 1.0f, 1.7f};
    const int32_t ks[2] = {0, 2};
    for (int ti = 0; ti < 3; ti++)
        for (int ki = 0; ki < 2; ki++) {
            llm_sampler s = make(temps[ti], ks[ki], 1.0f, 1, 2);
            for (double d = -30; d <= 30; d += 0.37) {
                const float l[2] = {0.0f, (float)d};
                const double p0 = 1 / (1 + exp((double)l[1] / temps[ti]));
                const int32_t first = llm_sample_at(&s, l, 0.0);
                double lo = 0, hi = 1; /* u below lo picks `first`, from hi the other */
                for (int it = 0; it < 60; it++) {
                    const double mid = (lo + hi) / 2;
                    if (llm_sample_at(&s, l, mid) == first) lo = mid;
                    else hi = mid;
                }
                const double share0 = first == 0 ? lo : 1 - lo, small = p0 < 1 - p0 ? p0 : 1 - p0;
                if (!(fabs(share0 - p0) <= 1e-5 * small + 1e-15))
                    test_fail(__FILE__, __LINE__, "T %g, k %d, d %g: token 0's share %.9g, softmax %.9g", temps[ti],
                              (int)ks[ki], d, share0, p0);
            }
            llm_sampler_free(&s);
        }
}

/* llm_log_sum_exp against the sum in double: within 1e-6, NaN logits left
 * out; the cases with no finite logit by their rule. */
TEST(engine_sampler_log_sum_exp_matches_double_and_leaves_nan_out) {
    test_rng r = {31};
    enum { N = 5000 };
    float *l = malloc(sizeof(float) * N);
    for (int trial = 0; trial < 40; trial++) {
        const int32_t n = 1 + test_rng_int(&r, 0, N - 1);
        const double scale = trial % 3 == 0 ? 0.1 : trial % 3 == 1 ? 3 : 30;
        for (int32_t i = 0; i < n; i++) l[i] = (float)(scale * test_rng_normal(&r) + 5);
        if (trial % 2)
            for (int32_t i = trial % 7; i < n; i += 53) l[i] = i % 2 ? NAN : -INFINITY;
        double mx = -INFINITY, z = 0;
        for (int32_t i = 0; i < n; i++)
            if (l[i] > mx) mx = l[i];
        for (int32_t i = 0; i < n; i++)
            if (!isnan(l[i])) z += exp((double)l[i] - mx);
        const double want = mx + log(z), got = llm_log_sum_exp(l, n);
        if (!(fabs(got - want) <= 1e-6 * (1 + fabs(want))))
            test_fail(__FILE__, __LINE__, "trial %d (n %d, scale %g): %.9g, in double %.9g", trial, (int)n, scale, got,
                      want);
    }
    const float none[3] = {-INFINITY, NAN, -INFINITY}, nans[2] = {NAN, NAN}, inf[3] = {1.0f, INFINITY, NAN};
    CHECK(llm_log_sum_exp(none, 3) == -INFINITY);
    CHECK(isnan(llm_log_sum_exp(nans, 2)));
    CHECK(llm_log_sum_exp(inf, 3) == INFINITY);
    free(l);
}

/* llm_exp (the sampler's weights, the gated activations) against exp in
 * double: within 3e-7 of it over [-87.3, 88.3] (a million points and the
 * ends), 0 below, +inf for +inf, NaN for NaN. */
TEST(engine_fast_exp_is_within_3e_7_of_exp_and_keeps_its_special_values) {
    double worst = 0;
    float at = 0;
    for (int i = 0; i <= 1000000; i++) {
        const float x = -87.3f + (float)i * (88.3f + 87.3f) / 1000000;
        const double want = exp((double)x), err = fabs(llm_exp(x) - want) / want;
        if (err > worst) worst = err, at = x;
    }
    if (!(worst <= 3e-7)) test_fail(__FILE__, __LINE__, "llm_exp is off by %.3g of exp at x = %.9g", worst, at);
    CHECK(llm_exp(0.0f) == 1.0f);
    CHECK(llm_exp(-88.0f) == 0.0f && llm_exp(-INFINITY) == 0.0f);
    CHECK(llm_exp(INFINITY) == INFINITY && llm_exp(100.0f) > 1e38f && llm_exp(100.0f) < INFINITY);
    CHECK(isnan(llm_exp(NAN)));
}

TEST(engine_sampler_rejects_bad_parameters) {
    llm_sampler s;
    llm_sampler_params p = llm_sampler_default_params();
    CHECK_EQ_INT(llm_sampler_init(&s, &p, 0), -1);
    p.top_k = -1;
    CHECK_EQ_INT(llm_sampler_init(&s, &p, 10), -1);
    p = llm_sampler_default_params(), p.top_p = 0;
    CHECK_EQ_INT(llm_sampler_init(&s, &p, 10), -1);
    p.top_p = 1.5f;
    CHECK_EQ_INT(llm_sampler_init(&s, &p, 10), -1);
    p = llm_sampler_default_params(), p.temp = NAN;
    CHECK_EQ_INT(llm_sampler_init(&s, &p, 10), -1);
}

/* The processing step against a direct float64 computation of the same
 * rules over a prompt and a generated history: bias, then the repeat
 * penalty over the last repeat_last_n tokens of both (each distinct token
 * once), then frequency * count + presence over the generated ones only. */
TEST(engine_sampler_penalties_and_bias_match_a_direct_computation) {
    enum { V = 300, NP = 40, NG = 70, LAST = 50 };
    test_rng r = {11};
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)(4 * test_rng_normal(&r));
    int32_t prompt[NP], gen[NG], all[NP + NG];
    for (int i = 0; i < NP; i++) all[i] = prompt[i] = (int32_t)(test_rng_u64(&r) % 40);
    for (int i = 0; i < NG; i++) all[NP + i] = gen[i] = (int32_t)(20 + test_rng_u64(&r) % 40);
    const llm_logit_bias bias[3] = {{5, 2.5f}, {25, -1.25f}, {299, -100.0f}};
    llm_sampler_params p = {.temp = 0, .top_p = 1, .repeat_penalty = 1.3f, .repeat_last_n = LAST,
                            .presence_penalty = 0.7f, .frequency_penalty = -0.4f, .bias = bias, .n_bias = 3};
    llm_sampler s;
    CHECK_EQ_INT(llm_sampler_init(&s, &p, V), 0);
    llm_sampler_accept_prompt(&s, prompt, NP);
    for (int i = 0; i < NG; i++) llm_sampler_accept(&s, gen[i]);
    const float *got = llm_sampler_process(&s, l);
    CHECK(got != l);
    double want[V];
    for (int v = 0; v < V; v++) {
        double x = l[v];
        for (int b = 0; b < 3; b++)
            if (bias[b].id == v) x = bias[b].bias <= -100 ? -INFINITY : x + bias[b].bias;
        int in_window = 0, count = 0;
        for (int i = NP + NG - LAST; i < NP + NG; i++) in_window |= all[i] == v;
        for (int i = 0; i < NG; i++) count += gen[i] == v;
        if (in_window) x = x > 0 ? x / 1.3 : x * 1.3;
        x -= -0.4 * count + (count > 0 ? 0.7 : 0);
        want[v] = x;
    }
    for (int v = 0; v < V; v++)
        if (!(isinf(want[v]) ? got[v] == want[v] : fabs(got[v] - want[v]) <= 1e-5 * (1 + fabs(want[v]))))
            test_fail(__FILE__, __LINE__, "token %d: processed logit %.7g, direct %.7g", v, got[v], want[v]);
    /* greedy over the processed logits, and the token is recorded */
    int32_t t = llm_sample(&s, l);
    CHECK_EQ_INT(t, llm_argmax(got, V));
    CHECK(t != 299);
    llm_sampler_free(&s);
}

/* With every processor off the caller's logits are drawn from as they are,
 * and a penalty changes a greedy run that repeats. */
TEST(engine_sampler_processing_off_is_the_plain_draw_and_on_breaks_repeats) {
    enum { V = 8 };
    float l[V] = {0, 1, 3, 2.5f, 0, 0, 0, 0};
    llm_sampler_params p = {.temp = 0, .top_p = 1, .repeat_penalty = 1, .repeat_last_n = 64};
    llm_sampler s;
    CHECK_EQ_INT(llm_sampler_init(&s, &p, V), 0);
    CHECK(llm_sampler_process(&s, l) == l);
    for (int i = 0; i < 5; i++) CHECK_EQ_INT(llm_sample(&s, l), 2);
    llm_sampler_free(&s);
    p.presence_penalty = 1.0f;
    CHECK_EQ_INT(llm_sampler_init(&s, &p, V), 0);
    CHECK_EQ_INT(llm_sample(&s, l), 2);
    CHECK_EQ_INT(llm_sample(&s, l), 3); /* 3 - 1 < 2.5 */
    llm_sampler_free(&s);
    /* a window of 1 only remembers the last token */
    p = (llm_sampler_params){.temp = 0, .top_p = 1, .repeat_penalty = 2, .repeat_last_n = 1};
    CHECK_EQ_INT(llm_sampler_init(&s, &p, V), 0);
    CHECK_EQ_INT(llm_sample(&s, l), 2);
    CHECK_EQ_INT(llm_sample(&s, l), 3);
    CHECK_EQ_INT(llm_sample(&s, l), 2);
    llm_sampler_free(&s);
}

/* min_p drops every token whose probability (temperature 1) is below min_p
 * times the best one's: logit < max + ln(min_p). */
TEST(engine_sampler_min_p_keeps_tokens_near_the_best) {
    enum { V = 6 };
    float l[V] = {0, -1, -2.2f, -3, -0.5f, -2.4f};
    llm_sampler_params p = {.temp = 1, .top_p = 1, .min_p = 0.1f};
    llm_sampler s;
    CHECK_EQ_INT(llm_sampler_init(&s, &p, V), 0);
    const float *w = llm_sampler_process(&s, l);
    for (int v = 0; v < V; v++) CHECK((exp(l[v]) >= 0.1 * exp(0)) == (w[v] > -INFINITY));
    for (int i = 0; i < 200; i++) {
        int32_t t = llm_sample(&s, l);
        CHECK(t == 0 || t == 1 || t == 2 || t == 4); /* e^-2.2 > 0.1, e^-2.4 < 0.1 */
    }
    llm_sampler_free(&s);
}

TEST(engine_sampler_rejects_bad_processing_parameters) {
    llm_sampler s;
    const llm_logit_bias out[1] = {{10, 1}}, big[1] = {{1, 100.5f}};
    llm_sampler_params good = llm_sampler_default_params(), p;
    p = good, p.min_p = 1.5f;
    CHECK_EQ_INT(llm_sampler_init(&s, &p, 10), -1);
    p = good, p.repeat_penalty = -1;
    CHECK_EQ_INT(llm_sampler_init(&s, &p, 10), -1);
    p = good, p.repeat_last_n = -2;
    CHECK_EQ_INT(llm_sampler_init(&s, &p, 10), -1);
    p = good, p.presence_penalty = 2.5f;
    CHECK_EQ_INT(llm_sampler_init(&s, &p, 10), -1);
    p = good, p.frequency_penalty = -3;
    CHECK_EQ_INT(llm_sampler_init(&s, &p, 10), -1);
    p = good, p.bias = out, p.n_bias = 1;
    CHECK_EQ_INT(llm_sampler_init(&s, &p, 10), -1);
    p = good, p.bias = big, p.n_bias = 1;
    CHECK_EQ_INT(llm_sampler_init(&s, &p, 10), -1);
}
