/* tests/test.h - the smallest test framework that does the job.
 *
 * A test is a function registered at load time:
 *
 *     TEST(offset_mask_matches_oracle) { CHECK(x == y); CHECK_NEAR(a, b, 1e-12); }
 *
 * The runner (tests/main.c) runs every registered test, or those whose name
 * contains argv[1], and ends with the line "N passed, N failed". A CHECK that
 * fails prints file:line and the expression and marks the test failed; the
 * test keeps running so one run shows every broken property. */
#ifndef KV_TEST_H
#define KV_TEST_H

#include <math.h>
#include <stdio.h>

typedef void (*test_fn)(void);
void test_register(const char *name, test_fn fn);
void test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define TEST(name)                                                          \
    static void test_##name(void);                                          \
    __attribute__((constructor)) static void test_reg_##name(void) {        \
        test_register(#name, test_##name);                                  \
    }                                                                       \
    static void test_##name(void)

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) test_fail(__FILE__, __LINE__, "CHECK(%s)", #cond);     \
    } while (0)

/* |a - b| <= tol, and never NaN. */
#define CHECK_NEAR(a, b, tol)                                               \
    do {                                                                    \
        double a_ = (double)(a), b_ = (double)(b), t_ = (double)(tol);     \
        if (!(fabs(a_ - b_) <= t_))                                         \
            test_fail(__FILE__, __LINE__, "CHECK_NEAR(%s, %s): %.17g vs %.17g (diff %.3g > %.3g)", \
                      #a, #b, a_, b_, fabs(a_ - b_), t_);                   \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                  \
    do {                                                                    \
        long long a_ = (long long)(a), b_ = (long long)(b);                 \
        if (a_ != b_)                                                       \
            test_fail(__FILE__, __LINE__, "CHECK_EQ_INT(%s, %s): %lld vs %lld", #a, #b, a_, b_); \
    } while (0)

/* The sanitizer and portable runs set KVCACHE_TEST_QUICK=1: the longest
 * sweeps then take a part of their cases (every shape and path still, fewer
 * random draws and combinations), where the plain run takes them all. */
int test_quick(void);

/* Deterministic random numbers for property tests (splitmix64). */
typedef struct { unsigned long long s; } test_rng;
static inline unsigned long long test_rng_u64(test_rng *r) {
    unsigned long long z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* uniform integer in [lo, hi] */
static inline int test_rng_int(test_rng *r, int lo, int hi) {
    return lo + (int)(test_rng_u64(r) % (unsigned long long)(hi - lo + 1));
}
/* uniform in [-1, 1) */
static inline double test_rng_uniform(test_rng *r) {
    return (double)(test_rng_u64(r) >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}
/* standard normal (Box-Muller) */
static inline double test_rng_normal(test_rng *r) {
    double u = ((double)(test_rng_u64(r) >> 11) + 0.5) / 9007199254740992.0;
    double v = (double)(test_rng_u64(r) >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

#endif
