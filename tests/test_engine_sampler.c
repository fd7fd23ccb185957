/* tests/test_engine_sampler.c - the sampler: greedy is the argmax, a seed
 * fixes the draws, and the draws follow softmax(logits / T) restricted by
 * top-k and top-p. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "../engine/sampler.h"

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
