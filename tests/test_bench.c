/* tests/test_bench.c - `kvcache bench attention --quick --json` runs, and its
 * JSON has the promised shape and sane values: every ratio in (0, 4), each
 * decode case's roofline recomputed from its shape and the run's limits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

/* The kvcache binary of this build (the Makefile sets KVCACHE_BIN). */
static const char *kvcache_bin(void) {
    const char *b = getenv("KVCACHE_BIN");
    return b && *b ? b : "build/kvcache";
}

/* Every number following `"key": ` in text, up to max. */
static int numbers_after(const char *text, const char *key, double *out, int max) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    int n = 0;
    for (const char *p = strstr(text, pat); p && n < max; p = strstr(p + 1, pat)) out[n++] = strtod(p + strlen(pat), NULL);
    return n;
}

TEST(bench_attention_json_has_every_key_and_sane_ratios) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s bench attention --quick --json -t 2 2>/dev/null", kvcache_bin());
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL);
    if (!f) return;
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    CHECK_EQ_INT(pclose(f), 0);
    const char *keys[] = {"read_gbs", "peak_gflops", "decode", "prefill", "cache_vs_recompute", "S", "H",
                          "Hkv", "d", "kv_type", "threads", "gbs", "ratio", "T", "gflops", "prompt", "gen",
                          "speedup", "flop_ratio"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char pat[64];
        snprintf(pat, sizeof pat, "\"%s\":", keys[i]);
        if (!strstr(text, pat)) test_fail(__FILE__, __LINE__, "key %s missing from the JSON", keys[i]);
    }
    double v[64];
    int nr = numbers_after(text, "ratio", v, 64);
    CHECK_EQ_INT(nr, 8 + 2); /* 8 decode cases, 2 prefill cases in --quick */
    /* a sanity bound, not a speed claim: on a machine shared with other builds
     * a --quick decode call (well under a millisecond) can land in a quiet
     * moment that no bandwidth trial caught, so a ratio may pass 1; a byte or
     * FLOP count wrong by a factor (what this catches) lands far outside.
     * Under KVCACHE_SIMD=scalar (make test-portable's second run) the peak is
     * a scalar FMA loop's, while the compiler may vectorize the "scalar"
     * prefill kernel: its ratio to that peak has no upper bound then. */
    const char *simd = getenv("KVCACHE_SIMD");
    int scalar = simd && !strcmp(simd, "scalar");
    for (int i = 0; i < nr; i++) {
        double hi = scalar && i >= 8 ? INFINITY : 4;
        if (!(v[i] > 0 && v[i] < hi)) test_fail(__FILE__, __LINE__, "ratio %d = %g outside (0, %g)", i, v[i], hi);
    }
    CHECK(numbers_after(text, "read_gbs", v, 64) >= 1 && v[0] > 0.1);
    /* the run's FMA peak, then one beside each decode and each prefill case:
     * a prefill ratio is its GFLOP/s over the peak beside it */
    double pk[12], gf[4];
    CHECK_EQ_INT(numbers_after(text, "peak_gflops", pk, 12), 1 + 8 + 2);
    CHECK_EQ_INT(numbers_after(text, "gflops", gf, 4), 2);
    CHECK_EQ_INT(numbers_after(text, "ratio", v, 64), 10);
    for (int i = 0; i < 11; i++) CHECK(pk[i] > 0.1);
    for (int i = 0; i < 2; i++) CHECK_NEAR(v[8 + i], gf[i] / pk[9 + i], 2e-3 * v[8 + i] + 1e-4);
    /* each decode case against its roofline: min(its read bandwidth, its peak / FLOP per byte),
     * with the FLOP per byte of the case's shape and storage recomputed here */
    double read[9], fpb[8], roof[8], rr[8], gbs[8];
    CHECK_EQ_INT(numbers_after(text, "flop_per_byte", fpb, 8), 8);
    CHECK_EQ_INT(numbers_after(text, "roofline_gbs", roof, 8), 8);
    CHECK_EQ_INT(numbers_after(text, "roofline_ratio", rr, 8), 8);
    CHECK_EQ_INT(numbers_after(text, "gbs", gbs, 8), 8);
    CHECK_EQ_INT(numbers_after(text, "read_gbs", read, 9), 9); /* the run's, then one per case */
    static const double shape[8][3] = {{32, 8, 128}, {32, 8, 128}, {32, 8, 128}, {32, 8, 128},
                                       {9, 3, 64},   {9, 3, 64},   {9, 3, 64},   {9, 3, 64}};
    for (int i = 0; i < 8; i++) {
        const double H = shape[i][0], Hkv = shape[i][1], d = shape[i][2], q8 = (i / 2) % 2;
        const double bytes_per_key = 2 * Hkv * (q8 ? d + 4 : 2 * d); /* K and V: f16, or int8 + an f32 scale */
        CHECK_NEAR(fpb[i], 4 * d * H / bytes_per_key, 1e-3);
        CHECK_NEAR(roof[i], fmin(read[i + 1], pk[1 + i] / fpb[i]), 2e-3 * roof[i]);
        CHECK_NEAR(rr[i], gbs[i] / roof[i], 2e-3 * rr[i] + 1e-4);
        CHECK(rr[i] > 0);
    }
    int ns = numbers_after(text, "speedup", v, 64);
    CHECK(ns >= 2);
    for (int i = 0; i < ns; i++) CHECK(v[i] > 1); /* the cache wins */
    double fr[4];
    CHECK_EQ_INT(numbers_after(text, "flop_ratio", fr, 4), 2);
    CHECK_NEAR(fr[0], 32 + 33 / 2.0, 1e-9); /* (P+1 + ... + P+G) / G for P = G = 32 */
}

TEST(bench_attention_rejects_bad_options) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s bench attention --frobnicate >/dev/null 2>&1", kvcache_bin());
    CHECK(system(cmd) != 0);
    snprintf(cmd, sizeof cmd, "%s bench attention -t -3 >/dev/null 2>&1", kvcache_bin());
    CHECK(system(cmd) != 0);
}
