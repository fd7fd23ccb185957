/* tests/test_policies.c - the engine's cache policies (engine/gen/policy.h) on
 * tiny random models (tests/test_model_fixture.h): a context shift against a
 * float64 oracle that forgets positions from an explicit list instead of
 * re-rotating anything; prompt-lookup drafting on hand-made histories;
 * session files round-tripped, and refused (never crashing, never changing
 * the answer) when corrupt, truncated or made for another model or K/V type.
 *
 * Tolerance. As in test_model_tiny.c: the engine's f32 logits agree with the
 * f64 reference to a few 1e-7 of their largest magnitude; we allow 1e-5. A
 * shift adds one f32 rounding of each moved key (2^-24 of its pair's norm),
 * far below that, while a key left at its old position, or turned the wrong
 * way, moves the logits by O(1e-2) or more. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "test_model_fixture.h"
#include "gguf_writer.h"
#include "../engine/model/model.h"
#include "../engine/gen/policy.h"

static llm_context *make_ctx(const llm_model *m, kv_dtype kv, int32_t n_ctx) {
    llm_context_params p = llm_context_default_params();
    p.n_ctx = n_ctx, p.n_threads = 2, p.kv_type = kv, p.n_batch = 64, p.page_size = 4;
    p.act_bits = 0; /* against a float64 oracle: the f32 products, as the oracle computes them */
    return fx_context(m, &p);
}

/* n tokens from the fixture's byte range, fixed by seed. */
static void some_tokens(int32_t *t, int32_t n, unsigned long long seed) {
    test_rng r = {seed};
    for (int32_t i = 0; i < n; i++) t[i] = test_rng_int(&r, FX_BYTE0, FX_VOCAB - 1);
}

/* Largest |engine - reference| over rows of V logits, relative to the
 * reference's largest magnitude. */
static double rel_diff(const float *got, const double *want, int64_t n) {
    double bmax, d = fx_max_diff(got, want, n, &bmax);
    return d / bmax;
}

/* ---------------------------------------------------------------- context shift */

TEST(policy_the_shift_oracle_without_shifts_is_the_plain_reference) {
    fx_model fx;
    if (fx_build(&(fx_spec){.type = GW_F32, .seed = 31}, &fx)) return;
    enum { N = 20 };
    int32_t tok[N];
    some_tokens(tok, N, 1);
    double *a = malloc(sizeof(double) * N * FX_VOCAB), *b = malloc(sizeof(double) * N * FX_VOCAB);
    fx_reference(&fx, tok, N, a);
    fx_reference_shifted(&fx, tok, N, NULL, 0, b);
    double worst = 0;
    for (int64_t i = 0; i < (int64_t)N * FX_VOCAB; i++) worst = fmax(worst, fabs(a[i] - b[i]));
    CHECK(worst < 1e-9);
    free(a), free(b);
    fx_free(&fx);
}

/* Prefill `first` tokens, then for each shift in turn: shift, feed tokens up
 * to the next shift (all logits kept); compare every row fed after the first
 * shift with the oracle. */
static double run_with_shifts(const fx_model *fx, llm_context *c, const int32_t *tok, int32_t n, const fx_shift *sh,
                              int32_t n_sh) {
    const int32_t V = fx->vocab;
    int32_t seq;
    CHECK_EQ_INT(kv_seq_new(llm_context_cache(c), &seq), KV_OK);
    float *got = malloc(sizeof(float) * (size_t)n * V);
    double *want = malloc(sizeof(double) * (size_t)n * V);
    int32_t done = 0;
    for (int32_t s = 0; s <= n_sh; s++) {
        int32_t upto = s < n_sh ? sh[s].after : n;
        CHECK_EQ_INT(llm_eval(c, seq, tok + done, upto - done, 1, got + (size_t)done * V, NULL, NULL), KV_OK);
        done = upto;
        if (s < n_sh) {
            int32_t len = kv_seq_length(llm_context_cache(c), seq);
            CHECK_EQ_INT(llm_context_shift(c, seq, sh[s].n_keep, sh[s].n_discard), KV_OK);
            CHECK_EQ_INT(kv_seq_length(llm_context_cache(c), seq), len - sh[s].n_discard);
        }
    }
    fx_reference_shifted(fx, tok, n, sh, n_sh, want);
    double d = rel_diff(got + (size_t)sh[0].after * V, want + (size_t)sh[0].after * V, (int64_t)(n - sh[0].after) * V);
    free(got), free(want);
    kv_seq_remove(llm_context_cache(c), seq);
    return d;
}

TEST(policy_after_a_shift_logits_equal_the_oracle_over_the_kept_tokens_at_their_new_positions) {
    /* two layers, half-rotated heads, untied output; and Llama 3.1-style
     * rope_freqs on a tied model */
    const fx_spec specs[] = {{.type = GW_F32, .seed = 32, .rot_dim = 32}, {.type = GW_Q8_0, .seed = 33, .tied = 1, .rope_freqs = 1}};
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        fx_model fx;
        if (fx_build(&specs[k], &fx)) return;
        llm_model *m = fx_load(&fx);
        if (!m) return fx_free(&fx);
        llm_context *c = make_ctx(m, KV_F32, 64);
        enum { N = 48 };
        int32_t tok[N];
        some_tokens(tok, N, 2 + k);
        /* mid-page sinks and hole, then a second shift on the shifted sequence */
        const fx_shift one[] = {{24, 4, 10}}, two[] = {{24, 5, 7}, {36, 5, 9}};
        double d1 = run_with_shifts(&fx, c, tok, N, one, 1), d2 = run_with_shifts(&fx, c, tok, N, two, 2);
        printf("     shifted vs oracle: one shift %.2e, two shifts %.2e (relative)\n", d1, d2);
        CHECK(d1 <= 1e-5);
        CHECK(d2 <= 1e-5);
        /* the oracle tells a shift from no shift: without re-rotation (as if
         * the kept keys stayed at their old positions) the logits are far off */
        const fx_shift none[] = {{24, 4, 0}};
        int32_t kept[N - 10];
        memcpy(kept, tok, sizeof(int32_t) * 4), memcpy(kept + 4, tok + 14, sizeof(int32_t) * (N - 14));
        double *ref_kept = malloc(sizeof(double) * (N - 10) * FX_VOCAB), *ref_shift = malloc(sizeof(double) * N * FX_VOCAB);
        fx_reference_shifted(&fx, tok, N, one, 1, ref_shift);
        fx_reference_shifted(&fx, kept, N - 10, none, 0, ref_kept);
        /* a fresh pass over the kept tokens differs after the first layer:
         * the kept keys were computed while the dropped tokens were visible.
         * That is what a shift is (StreamingLLM), so the oracle is the shift
         * itself, not a fresh pass (see the one-layer test below). */
        double fresh = 0, mx = 0;
        for (int64_t i = (int64_t)14 * FX_VOCAB; i < (int64_t)(N - 10) * FX_VOCAB; i++) {
            fresh = fmax(fresh, fabs(ref_kept[i] - ref_shift[i + (int64_t)10 * FX_VOCAB]));
            mx = fmax(mx, fabs(ref_shift[i + (int64_t)10 * FX_VOCAB]));
        }
        CHECK(fresh / mx > 1e-3);
        free(ref_kept), free(ref_shift);
        llm_context_free(c);
        llm_model_free(m);
        fx_free(&fx);
    }
}

TEST(policy_in_a_one_layer_model_a_shift_equals_a_fresh_run_over_the_kept_tokens) {
    /* with one layer, a key depends on its token and position only, so the
     * shifted cache is exactly a fresh pass over the kept tokens */
    fx_model fx;
    if (fx_build(&(fx_spec){.type = GW_F32, .seed = 34, .layers = 1}, &fx)) return;
    llm_model *m = fx_load(&fx);
    if (!m) return fx_free(&fx);
    llm_context *c = make_ctx(m, KV_F32, 64);
    enum { N = 40, KEEP = 6, DROP = 11, AT = 25 };
    int32_t tok[N], kept[N - DROP];
    some_tokens(tok, N, 5);
    memcpy(kept, tok, sizeof(int32_t) * KEEP), memcpy(kept + KEEP, tok + KEEP + DROP, sizeof(int32_t) * (N - KEEP - DROP));
    int32_t seq;
    CHECK_EQ_INT(kv_seq_new(llm_context_cache(c), &seq), KV_OK);
    float *got = malloc(sizeof(float) * (N - AT) * FX_VOCAB);
    double *fresh = malloc(sizeof(double) * (N - DROP) * FX_VOCAB);
    CHECK_EQ_INT(llm_eval(c, seq, tok, AT, 0, NULL, NULL, NULL), KV_OK);
    CHECK_EQ_INT(llm_context_shift(c, seq, KEEP, DROP), KV_OK);
    CHECK_EQ_INT(llm_eval(c, seq, tok + AT, N - AT, 1, got, NULL, NULL), KV_OK);
    fx_reference(&fx, kept, N - DROP, fresh);
    double d = rel_diff(got, fresh + (size_t)(AT - DROP) * FX_VOCAB, (int64_t)(N - AT) * FX_VOCAB);
    printf("     one layer: shifted vs fresh run over the kept tokens %.2e (relative)\n", d);
    CHECK(d <= 1e-5);
    free(got), free(fresh);
    llm_context_free(c);
    llm_model_free(m);
    fx_free(&fx);
}

TEST(policy_shift_discard_is_half_of_what_is_not_kept) {
    CHECK_EQ_INT(llm_shift_discard(64, 4), 30);
    CHECK_EQ_INT(llm_shift_discard(8, 7), 1);
    CHECK_EQ_INT(llm_shift_discard(8, 8), 1);
    CHECK_EQ_INT(llm_context_shift(NULL, 0, 1, 1), KV_ERR_NULL);
}

/* ---------------------------------------------------------------- prompt lookup */

TEST(policy_lookup_drafts_after_the_longest_ngram_before_a_more_recent_shorter_one) {
    int32_t d[8];
    /* 1 2 3 4 5, then a "3" with other tokens before it (9 3 7), then 1 2 3:
     * the 3-gram 1 2 3 wins over the more recent 1-gram, so 4 5 is proposed, not 7 */
    const int32_t a[] = {1, 2, 3, 4, 5, 0, 9, 3, 7, 0, 1, 2, 3};
    CHECK_EQ_INT(llm_lookup_draft(a, 13, 3, d), 3);
    CHECK(d[0] == 4 && d[1] == 5 && d[2] == 0);
    /* two earlier "3"s, each agreeing for that one token: the most recent, 8 */
    const int32_t b[] = {5, 3, 7, 6, 3, 8, 4, 3};
    CHECK_EQ_INT(llm_lookup_draft(b, 8, 1, d), 1);
    CHECK(d[0] == 8);
}

TEST(policy_lookup_drafts_what_followed_the_most_recent_occurrence) {
    int32_t d[8];
    /* the 3-gram 5 6 7 occurred at 0: propose what followed, up to the end */
    const int32_t a[] = {5, 6, 7, 8, 9, 5, 6, 7};
    CHECK_EQ_INT(llm_lookup_draft(a, 8, 8, d), 5);
    CHECK(d[0] == 8 && d[1] == 9 && d[2] == 5 && d[3] == 6 && d[4] == 7);
    CHECK_EQ_INT(llm_lookup_draft(a, 8, 2, d), 2); /* at most max_draft */
    CHECK(d[0] == 8 && d[1] == 9);
    /* no 3-gram match (4 1 2 is new): the 2-gram 1 2, most recently at 3 */
    const int32_t b[] = {1, 2, 3, 1, 2, 4, 1, 2};
    CHECK_EQ_INT(llm_lookup_draft(b, 8, 8, d), 3);
    CHECK(d[0] == 4 && d[1] == 1 && d[2] == 2);
    /* a 1-gram: 9 followed by 3 earlier */
    const int32_t e[] = {9, 3, 4, 5, 9};
    CHECK_EQ_INT(llm_lookup_draft(e, 5, 8, d), 4);
    CHECK(d[0] == 3 && d[3] == 9);
    /* nothing repeats */
    const int32_t f[] = {1, 2, 3, 4};
    CHECK_EQ_INT(llm_lookup_draft(f, 4, 8, d), 0);
    CHECK_EQ_INT(llm_lookup_draft(f, 1, 8, d), 0);
    CHECK_EQ_INT(llm_lookup_draft(a, 8, 0, d), 0);
    CHECK_EQ_INT(llm_lookup_draft(NULL, 8, 8, d), 0);
}

TEST(policy_pass_cost_interpolates_extrapolates_and_never_falls_with_rows) {
    llm_pass_cost c = {0};
    CHECK(llm_pass_cost_at(&c, 1) == 0); /* nothing measured */
    llm_pass_cost_add(&c, 1, 1.0);
    CHECK_NEAR(llm_pass_cost_at(&c, 1), 1.0, 1e-12);
    CHECK_NEAR(llm_pass_cost_at(&c, 2), 1.0 + 1.0 / 2.5, 1e-12); /* one row counts: the prior */
    llm_pass_cost_add(&c, 5, 3.0);
    CHECK_NEAR(llm_pass_cost_at(&c, 3), 2.0, 1e-12);  /* between 1 and 5 */
    CHECK_NEAR(llm_pass_cost_at(&c, 9), 5.0, 1e-12);  /* the slope of 1 .. 5 beyond */
    llm_pass_cost_add(&c, 1, 2.0);                    /* recent passes weigh most */
    CHECK(llm_pass_cost_at(&c, 1) > 1.0 && llm_pass_cost_at(&c, 1) < 2.0);
    llm_pass_cost d = {0};
    llm_pass_cost_add(&d, 1, 1.0);
    llm_pass_cost_add(&d, 2, 0.5);                    /* noise: more rows never cost less */
    CHECK(llm_pass_cost_at(&d, 2) > llm_pass_cost_at(&d, 1) && llm_pass_cost_at(&d, 1) > 0);
    llm_pass_cost_add(&d, 1, 100.0);                  /* a pass held up counts as twice the usual */
    CHECK_NEAR(d.t[1], 0.75 * 1.0 + 0.25 * 2.0, 1e-12);
    llm_pass_cost_add(&d, 0, 1.0), llm_pass_cost_add(&d, LLM_PASS_COST_ROWS + 1, 1.0), llm_pass_cost_add(&d, 3, -1);
    CHECK(llm_pass_cost_at(&d, 0) == 0 && llm_pass_cost_at(&d, LLM_PASS_COST_ROWS + 1) == 0);
}

/* A verify loop against a made-up machine: a pass of r rows takes
 * base + row * (r - 1) seconds; the first draft is taken with probability
 * p1, each later one with p while those before it were (a fixed
 * pseudo-random sequence). Returns the tokens per second of n passes driven
 * by the controller; *drafted: passes with drafts. */
static double lookup_sim(int32_t n_max, double base, double row, double p1, double p, int32_t n, int32_t rows_other,
                         int32_t *drafted, llm_lookup_ctl *ctl, llm_pass_cost *cost, uint64_t *rng) {
    double tokens = 0, secs = 0;
    *drafted = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t k = llm_lookup_ctl_next(ctl, cost, rows_other, rows_other);
        CHECK(k >= 0 && k <= n_max);
        int32_t j = 0;
        while (j < k) {
            *rng = *rng * 6364136223846793005ULL + 1442695040888963407ULL;
            if ((double)(*rng >> 11) / 9007199254740992.0 >= (j ? p : p1)) break;
            j++;
        }
        double t = base + row * (rows_other + k);
        llm_pass_cost_add(cost, rows_other + 1 + k, t);
        llm_lookup_ctl_seen(ctl, k, j, -1);
        tokens += rows_other + 1 + j, secs += t, *drafted += k > 0;
    }
    return tokens / secs;
}

/* The best rate any fixed draft length reaches on that machine. */
static double lookup_best(int32_t n_max, double base, double row, double p1, double p, int32_t rows_other) {
    double best = 0, e = 0, q = 1;
    for (int32_t k = 0; k <= n_max; k++, q *= k == 1 ? p1 : p) {
        e += q;
        double v = (rows_other + e) / (base + row * (rows_other + k));
        best = v > best ? v : best;
    }
    return best;
}

/* A copy of lines of `line` tokens on the same made-up machine: every
 * draft is taken up to a line's end and the first of the next line is
 * refused (a refusal, then a run). fixed >= 0: that many drafts every pass
 * instead of the controller's choice. Tokens per second of n passes. */
static double lookup_lines(int32_t n_max, double base, double row, int32_t line, int32_t n, int32_t fixed) {
    llm_lookup_ctl ctl;
    llm_pass_cost cost = {0};
    llm_lookup_ctl_init(&ctl, n_max);
    double tokens = 0, secs = 0;
    int64_t pos = 0; /* the token the next pass computes */
    for (int32_t i = 0; i < n; i++) {
        int32_t k = fixed >= 0 ? fixed : llm_lookup_ctl_next(&ctl, &cost, 0, 0), j = 0;
        while (j < k && (pos + 1 + j) % line != 0) j++;
        double t = base + row * k;
        llm_pass_cost_add(&cost, 1 + k, t);
        llm_lookup_ctl_seen(&ctl, k, j, (pos + 1 + j) % line != 0); /* the token after the drafts foreseen? */
        pos += 1 + j, tokens += 1 + j, secs += t;
    }
    return tokens / secs;
}

TEST(policy_lookup_follows_copied_lines_as_well_as_the_best_fixed_length) {
    const struct { double row; int32_t line; } cases[] = {{0.3, 6}, {0.3, 12}, {0.15, 24}, {0.5, 24}, {0.3, 40}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        double best = 0;
        int32_t best_k = 0;
        for (int32_t k = 0; k <= 8; k++) {
            double v = lookup_lines(8, 1.0, cases[c].row, cases[c].line, 600, k);
            if (v > best) best = v, best_k = k;
        }
        double v = lookup_lines(8, 1.0, cases[c].row, cases[c].line, 600, -1);
        printf("    lines of %d, row %.2f: %.3f of the best fixed length (%d drafts)\n", (int)cases[c].line,
               cases[c].row, v / best, (int)best_k);
        CHECK(v >= 0.9 * best);
    }
}

TEST(policy_lookup_drafts_only_what_the_measured_costs_pay_for) {
    struct {
        double row, p1, p, min_of_best; /* a row's cost, drafts taken, rate at least this share of the best */
        int32_t rows_other, draft_most; /* passes with drafts: at most draft_most (of 400) */
    } cases[] = {
        {0.5, 0.2, 0.2, 0.97, 0, 60},    /* little copying, dear rows: plain, a probe now and then */
        {0.5, 0.0, 0.0, 0.97, 0, 60},    /* no copying at all */
        {0.3, 0.9, 0.9, 0.90, 0, 400},   /* a copy: long drafts */
        {0.4, 0.6, 0.97, 0.90, 0, 400},  /* a copy whose runs go on once begun */
        {0.0, 0.5, 0.5, 0.97, 0, 400},   /* free rows: every draft pays */
        {0.05, 0.5, 0.5, 0.97, 15, 400}, /* a batch of 16: a row is cheap beside the step */
        {0.2, 0.2, 0.2, 0.97, 15, 100},  /* ... unless drafts are rarely taken (probes are cheap here) */
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        llm_lookup_ctl ctl;
        llm_pass_cost cost = {0};
        uint64_t rng = 42 + c;
        int32_t drafted;
        llm_lookup_ctl_init(&ctl, 8);
        double v = lookup_sim(8, 1.0, cases[c].row, cases[c].p1, cases[c].p, 400, cases[c].rows_other, &drafted, &ctl,
                              &cost, &rng);
        double best = lookup_best(8, 1.0, cases[c].row, cases[c].p1, cases[c].p, cases[c].rows_other);
        if (v < cases[c].min_of_best * best || drafted > cases[c].draft_most)
            printf("case %d: %.4f tokens/s of the best %.4f, %d passes with drafts\n", (int)c, v, best, (int)drafted);
        CHECK(v >= cases[c].min_of_best * best);
        CHECK(drafted <= cases[c].draft_most);
    }
    /* a copy that begins late is found by the probes, and drafts stop when it ends */
    llm_lookup_ctl ctl;
    llm_pass_cost cost = {0};
    uint64_t rng = 7;
    int32_t drafted;
    llm_lookup_ctl_init(&ctl, 8);
    lookup_sim(8, 1.0, 0.4, 0.05, 0.05, 300, 0, &drafted, &ctl, &cost, &rng);
    double v = lookup_sim(8, 1.0, 0.4, 0.95, 0.95, 300, 0, &drafted, &ctl, &cost, &rng);
    CHECK(v >= 0.8 * lookup_best(8, 1.0, 0.4, 0.95, 0.95, 0));
    lookup_sim(8, 1.0, 0.4, 0.0, 0.0, 100, 0, &drafted, &ctl, &cost, &rng);
    CHECK(drafted <= 20);
    /* never more than n_max, never any with n_max 0 */
    llm_lookup_ctl_init(&ctl, 0);
    CHECK_EQ_INT(llm_lookup_ctl_next(&ctl, &cost, 0, 0), 0);
    llm_lookup_ctl_init(&ctl, 3);
    CHECK_EQ_INT(llm_lookup_ctl_next(&ctl, &(llm_pass_cost){0}, 0, 0), 0); /* first a plain pass, to measure */
    llm_pass_cost cheap = {0};
    llm_pass_cost_add(&cheap, 1, 1.0), llm_pass_cost_add(&cheap, 2, 1.0);
    CHECK_EQ_INT(llm_lookup_ctl_next(&ctl, &cheap, 0, 0), 3);
}

/* ---------------------------------------------------------------- session files */

typedef struct {
    fx_model fx;
    llm_model *m;
    char path[128];
} session_fixture;

static int session_setup(session_fixture *s, unsigned long long seed) {
    if (fx_build(&(fx_spec){.type = GW_Q8_0, .seed = seed, .tied = 1}, &s->fx)) return -1;
    s->m = fx_load(&s->fx);
    snprintf(s->path, sizeof s->path, "/tmp/kvcache_test_session_%d_%llu", (int)getpid(), seed);
    return s->m ? 0 : -1;
}

static void session_teardown(session_fixture *s) {
    remove(s->path);
    llm_model_free(s->m);
    fx_free(&s->fx);
}

/* Logits of the last token of tok [n] in a fresh context, cold. */
static void cold_logits(const llm_model *m, kv_dtype kv, const int32_t *tok, int32_t n, float *out) {
    llm_context *c = make_ctx(m, kv, 64);
    int32_t seq;
    CHECK_EQ_INT(kv_seq_new(llm_context_cache(c), &seq), KV_OK);
    CHECK_EQ_INT(llm_eval(c, seq, tok, n, 0, out, NULL, NULL), KV_OK);
    llm_context_free(c);
}

/* Saves the first n of tok from a context of type kv. */
static void save_prefix(const session_fixture *s, kv_dtype kv, const int32_t *tok, int32_t n) {
    llm_context *c = make_ctx(s->m, kv, 64);
    int32_t seq;
    char err[256] = "";
    CHECK_EQ_INT(kv_seq_new(llm_context_cache(c), &seq), KV_OK);
    CHECK_EQ_INT(llm_eval(c, seq, tok, n, 0, NULL, NULL, NULL), KV_OK);
    if (llm_session_file_save(c, seq, tok, n, s->path, err, sizeof err) != 0)
        test_fail(__FILE__, __LINE__, "save: %s", err);
    llm_context_free(c);
}

/* Loads s->path for prompt tok [n] and finishes the prompt: the last row's
 * logits into out; returns the restored count, or -1 with err set. */
static int32_t warm_logits(const llm_model *m, const char *path, kv_dtype kv, const int32_t *tok, int32_t n,
                           float *out, char *err, size_t errlen) {
    llm_context *c = make_ctx(m, kv, 64);
    kv_cache_stats before = kv_cache_get_stats(llm_context_cache(c));
    int32_t seq = 123, restored = 99;
    int rc = llm_session_file_load(c, path, tok, n, &seq, &restored, err, errlen);
    if (rc != 0) {
        kv_cache_stats after = kv_cache_get_stats(llm_context_cache(c));
        CHECK(seq == -1 && restored == 0);
        CHECK(after.pages_free == before.pages_free && after.seqs == 0); /* the cache as it was */
        CHECK(strlen(err) > 0 && strstr(err, path));
        /* and the run goes on cold: the same answer */
        CHECK_EQ_INT(kv_seq_new(llm_context_cache(c), &seq), KV_OK);
        restored = 0;
    }
    CHECK_EQ_INT(kv_seq_length(llm_context_cache(c), seq), restored);
    CHECK_EQ_INT(llm_eval(c, seq, tok + restored, n - restored, 0, out, NULL, NULL), KV_OK);
    llm_context_free(c);
    return rc == 0 ? restored : -1;
}

/* Logits of a warm and a cold run of the same tokens: the K/V restored are
 * the bytes saved, so only the summation order of the prefill kernels can
 * differ (one row decodes through the split kernel, many rows through the
 * tiled one): f32 rounding, and the same greedy token. */
static int same_logits(const float *a, const float *b) {
    double d = 0, mx = 0;
    for (int32_t i = 0; i < FX_VOCAB; i++) d = fmax(d, fabs((double)a[i] - b[i])), mx = fmax(mx, fabs((double)b[i]));
    int32_t ia = 0, ib = 0;
    for (int32_t i = 1; i < FX_VOCAB; i++) ia = a[i] > a[ia] ? i : ia, ib = b[i] > b[ib] ? i : ib;
    return d <= 1e-5 * mx && ia == ib;
}

TEST(policy_a_session_file_round_trip_equals_a_cold_run) {
    session_fixture s;
    if (session_setup(&s, 41)) return;
    enum { N = 40, SAVED = 29 };
    int32_t tok[N];
    some_tokens(tok, N, 6);
    float cold[FX_VOCAB], warm[FX_VOCAB];
    char err[256] = "";
    const kv_dtype types[] = {KV_F32, KV_F16, KV_Q8};
    for (size_t k = 0; k < 3; k++) {
        save_prefix(&s, types[k], tok, SAVED);
        cold_logits(s.m, types[k], tok, N, cold);
        /* the file's tokens begin the prompt: restore them, prefill the rest */
        CHECK_EQ_INT(warm_logits(s.m, s.path, types[k], tok, N, warm, err, sizeof err), SAVED);
        CHECK(same_logits(warm, cold));
        /* a prompt that leaves the file's tokens at 17: the common prefix only */
        int32_t other[N];
        memcpy(other, tok, sizeof other);
        other[17] = other[17] == FX_BYTE0 ? FX_BYTE0 + 1 : FX_BYTE0;
        cold_logits(s.m, types[k], other, N, cold);
        CHECK_EQ_INT(warm_logits(s.m, s.path, types[k], other, N, warm, err, sizeof err), 17);
        CHECK(same_logits(warm, cold));
        /* the prompt is the file's tokens exactly: one is left to prefill */
        cold_logits(s.m, types[k], tok, SAVED, cold);
        CHECK_EQ_INT(warm_logits(s.m, s.path, types[k], tok, SAVED, warm, err, sizeof err), SAVED - 1);
        CHECK(same_logits(warm, cold));
    }
    session_teardown(&s);
}

static void write_file(const char *path, const unsigned char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) fwrite(b, 1, n, f), fclose(f);
}

static unsigned char *read_whole(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n);
    if (fread(b, 1, *n, f) != *n) *n = 0;
    fclose(f);
    return b;
}

TEST(policy_corrupt_truncated_or_foreign_session_files_are_refused_and_change_nothing) {
    session_fixture s, other;
    if (session_setup(&s, 42)) return;
    if (session_setup(&other, 43)) return session_teardown(&s);
    enum { N = 30, SAVED = 21 };
    int32_t tok[N];
    some_tokens(tok, N, 7);
    float cold[FX_VOCAB], warm[FX_VOCAB];
    char err[256];
    cold_logits(s.m, KV_F16, tok, N, cold);
    save_prefix(&s, KV_F16, tok, SAVED);
    size_t n = 0;
    unsigned char *good = read_whole(s.path, &n);
    CHECK(good && n > 1000);
    if (!good) return session_teardown(&s), session_teardown(&other);

    /* every truncation, at a spread of lengths through every part of the file */
    for (size_t cut = 0; cut < n; cut += cut < 400 ? 7 : 977) {
        write_file(s.path, good, cut);
        CHECK_EQ_INT(warm_logits(s.m, s.path, KV_F16, tok, N, warm, err, sizeof err), -1);
        CHECK(memcmp(cold, warm, sizeof cold) == 0);
    }
    /* one flipped bit anywhere: header, tokens, K/V, checksums */
    test_rng r = {44};
    for (int i = 0; i < 60; i++) {
        size_t at = i < 30 ? (size_t)test_rng_int(&r, 0, 250) : (size_t)test_rng_int(&r, 0, (int)n - 1);
        unsigned char bit = (unsigned char)(1u << test_rng_int(&r, 0, 7));
        good[at] ^= bit;
        write_file(s.path, good, n);
        good[at] ^= bit;
        int32_t got = warm_logits(s.m, s.path, KV_F16, tok, N, warm, err, sizeof err);
        if (got != -1) test_fail(__FILE__, __LINE__, "a flip at byte %zu of %zu was accepted", at, n);
        CHECK(memcmp(cold, warm, sizeof cold) == 0);
    }
    /* bytes after the end */
    {
        unsigned char *longer = malloc(n + 1);
        memcpy(longer, good, n);
        longer[n] = 0;
        write_file(s.path, longer, n + 1);
        CHECK_EQ_INT(warm_logits(s.m, s.path, KV_F16, tok, N, warm, err, sizeof err), -1);
        CHECK(strstr(err, "after the end") != NULL);
        free(longer);
    }
    /* another model, another K/V type, not a session file, no file */
    save_prefix(&other, KV_F16, tok, SAVED);
    CHECK_EQ_INT(warm_logits(s.m, other.path, KV_F16, tok, N, warm, err, sizeof err), -1);
    CHECK(strstr(err, "another model") != NULL);
    /* both fixtures bear one name: said once, with what differs */
    CHECK(strstr(err, "named") && strstr(err, "other weights") && !strstr(err, "), not '"));
    CHECK(memcmp(cold, warm, sizeof cold) == 0);
    save_prefix(&s, KV_Q8, tok, SAVED);
    CHECK_EQ_INT(warm_logits(s.m, s.path, KV_F16, tok, N, warm, err, sizeof err), -1);
    CHECK(strstr(err, "K/V type q8") && strstr(err, "f16"));
    CHECK(memcmp(cold, warm, sizeof cold) == 0);
    write_file(s.path, (const unsigned char *)"hello, world", 12);
    CHECK_EQ_INT(warm_logits(s.m, s.path, KV_F16, tok, N, warm, err, sizeof err), -1);
    CHECK(strstr(err, "not a session file") != NULL);
    remove(s.path);
    CHECK_EQ_INT(warm_logits(s.m, s.path, KV_F16, tok, N, warm, err, sizeof err), -1);
    CHECK(strstr(err, "cannot open") != NULL);
    /* a prompt with nothing in common */
    save_prefix(&s, KV_F16, tok, SAVED);
    int32_t unrelated[N];
    for (int i = 0; i < N; i++) unrelated[i] = tok[i] == FX_BYTE0 ? FX_BYTE0 + 1 : FX_BYTE0;
    CHECK_EQ_INT(warm_logits(s.m, s.path, KV_F16, unrelated, N, warm, err, sizeof err), -1);
    CHECK(strstr(err, "no prefix") != NULL);
    free(good);
    session_teardown(&s);
    session_teardown(&other);
}

/* ---------------------------------------------------------------- in the generation loop */

#include "../engine/gen/session.h"

typedef struct {
    int32_t toks[1024];
    int32_t n;
    float *logits;     /* [cap][V] the logits each sample was drawn from, or NULL */
    int32_t n_logits, cap;
} trace;

static int t_token(void *user, int32_t token) {
    trace *t = user;
    if (t->n < 1024) t->toks[t->n++] = token;
    return 0;
}

static int t_logits(void *user, float *logits, int32_t n_vocab) {
    trace *t = user;
    if (t->logits && t->n_logits < t->cap)
        memcpy(t->logits + (size_t)t->n_logits++ * (size_t)n_vocab, logits, sizeof(float) * (size_t)n_vocab);
    return 0;
}

/* One generation on a fresh session of c; the tokens into *t. */
static llm_gen_result generate(llm_context *c, const int32_t *prompt, int32_t n, llm_gen_params gp, trace *t,
                               int32_t *n_cached, int32_t *seq_len) {
    llm_session *s = NULL;
    llm_gen_result res;
    memset(&res, 0, sizeof res);
    CHECK_EQ_INT(llm_session_create(c, &s), LLM_OK);
    if (!s) return res;
    gp.on_token = t_token, gp.on_logits = t_logits, gp.user = t;
    llm_session_generate(s, prompt, n, &gp, &res);
    *n_cached = llm_session_n_cached(s);
    *seq_len = llm_seq_length(c, llm_session_seq(s));
    llm_session_free(s);
    return res;
}

TEST(policy_prompt_lookup_gives_the_tokens_of_plain_decoding_greedy_and_sampled) {
    fx_model fx;
    if (fx_build(&(fx_spec){.type = GW_F32, .seed = 51, .rot_dim = 32}, &fx)) return;
    llm_model *m = fx_load(&fx);
    if (!m) return fx_free(&fx);
    llm_context *c = make_ctx(m, KV_F32, 512);
    /* a prompt built to be copied (a phrase three times over) and one that is not */
    int32_t copy[60], plain[60];
    some_tokens(copy, 20, 8), some_tokens(plain, 60, 9);
    memcpy(copy + 20, copy, sizeof(int32_t) * 20), memcpy(copy + 40, copy, sizeof(int32_t) * 20);
    const int32_t *prompts[2] = {copy, plain};
    const float temps[2] = {0, 1.5f};
    const int32_t lengths[3] = {120, 13, 1};
    int64_t drafted = 0, accepted = 0;
    for (int pi = 0; pi < 2; pi++)
        for (int ti = 0; ti < 2; ti++)
            for (int li = 0; li < 3; li++) {
                llm_gen_params gp = llm_gen_default_params();
                gp.max_tokens = lengths[li];
                gp.sampler.temp = temps[ti], gp.sampler.seed = 77;
                gp.ignore_eog = 1; /* long runs: the random model's EOG would end them early */
                trace a = {0}, b = {0};
                int32_t ca, cb, la, lb;
                llm_gen_result ra = generate(c, prompts[pi], 60, gp, &a, &ca, &la);
                gp.draft_lookup = 8, gp.draft_fixed = 1;
                llm_gen_result rb = generate(c, prompts[pi], 60, gp, &b, &cb, &lb);
                if (a.n != b.n || memcmp(a.toks, b.toks, sizeof(int32_t) * (size_t)a.n) != 0)
                    test_fail(__FILE__, __LINE__, "prompt %d temp %g max %d: lookup changed the tokens", pi,
                              (double)temps[ti], (int)lengths[li]);
                CHECK_EQ_INT(ra.n_generated, rb.n_generated);
                CHECK_EQ_INT(ra.reason, rb.reason);
                CHECK_EQ_INT(ca, cb); /* the cache holds the same: rejected drafts were rolled back */
                CHECK_EQ_INT(la, lb);
                CHECK_EQ_INT(ca, la);
                CHECK(rb.n_accepted <= rb.n_drafted);
                CHECK(rb.n_passes <= ra.n_passes);
                drafted += rb.n_drafted, accepted += rb.n_accepted;
            }
    printf("     lookup: %lld of %lld drafted tokens accepted\n", (long long)accepted, (long long)drafted);
    CHECK(accepted > 0);           /* both branches ran: drafts taken ... */
    CHECK(drafted > accepted);     /* ... and drafts rolled back */
    llm_context_free(c);
    llm_model_free(m);
    fx_free(&fx);
}

TEST(policy_a_session_with_context_shift_runs_past_its_context_as_the_oracle_says) {
    fx_model fx;
    if (fx_build(&(fx_spec){.type = GW_F32, .seed = 52, .rot_dim = 32}, &fx)) return;
    llm_model *m = fx_load(&fx);
    if (!m) return fx_free(&fx);
    enum { N_CTX = 32, N = 10, GEN = 90, KEEP = 5 };
    llm_context *c = make_ctx(m, KV_F32, N_CTX);
    int32_t prompt[N];
    some_tokens(prompt, N, 10);
    for (int lookup = 0; lookup <= 8; lookup += 8) {
        llm_gen_params gp = llm_gen_default_params();
        gp.max_tokens = GEN, gp.sampler.temp = 0, gp.ignore_eog = 1;
        gp.context_shift = 1, gp.n_keep = KEEP, gp.draft_lookup = lookup, gp.draft_fixed = 1;
        trace t = {.logits = malloc(sizeof(float) * GEN * FX_VOCAB), .cap = GEN};
        int32_t cached, len;
        llm_gen_result r = generate(c, prompt, N, gp, &t, &cached, &len);
        CHECK_EQ_INT(r.n_generated, GEN); /* three times the context */
        CHECK_EQ_INT(r.reason, LLM_STOP_LENGTH);
        CHECK_EQ_INT(t.n_logits, GEN);
        /* the shifts the loop must have made: before feeding a token that
         * does not fit, keep KEEP and drop half of the rest */
        fx_shift sh[16];
        int32_t n_sh = 0, held = N, dropped = 0;
        for (int32_t g = 0; g < GEN; g++) {
            if (held + 1 > N_CTX && n_sh < 16) {
                int32_t drop = (held - KEEP) / 2;
                sh[n_sh++] = (fx_shift){N + g, KEEP, drop};
                held -= drop, dropped += drop;
            }
            held++; /* token g is fed */
        }
        CHECK_EQ_INT(r.n_shifts, n_sh);
        CHECK_EQ_INT(r.n_discarded, dropped);
        int32_t stream[N + GEN];
        memcpy(stream, prompt, sizeof prompt), memcpy(stream + N, t.toks, sizeof(int32_t) * GEN);
        double *want = malloc(sizeof(double) * (N + GEN) * FX_VOCAB);
        fx_reference_shifted(&fx, stream, N + GEN - 1, sh, n_sh, want);
        /* sample g was drawn from the logits after stream token N + g - 1 */
        double d = rel_diff(t.logits, want + (size_t)(N - 1) * FX_VOCAB, (int64_t)GEN * FX_VOCAB);
        printf("     %d shifts over %d tokens (lookup %d): logits vs oracle %.2e (relative)\n", (int)n_sh,
               (int)(N + GEN), lookup, d);
        CHECK(d <= 1e-5);
        /* and the greedy tokens are the oracle's */
        int same = 1;
        for (int32_t g = 0; g < GEN; g++) {
            const double *row = want + (size_t)(N - 1 + g) * FX_VOCAB;
            int32_t best = 0;
            for (int32_t i = 1; i < FX_VOCAB; i++) best = row[i] > row[best] ? i : best;
            same &= best == t.toks[g];
        }
        CHECK(same);
        free(t.logits), free(want);
    }
    llm_context_free(c);
    llm_model_free(m);
    fx_free(&fx);
}

TEST(policy_a_session_saved_and_loaded_generates_what_a_cold_session_does) {
    session_fixture s;
    if (session_setup(&s, 53)) return;
    llm_context *c = make_ctx(s.m, KV_F16, 64);
    int32_t prompt[40];
    some_tokens(prompt, 40, 11);
    llm_gen_params gp = llm_gen_default_params();
    gp.max_tokens = 8, gp.sampler.temp = 0, gp.ignore_eog = 1;
    /* a first run on the first 20 prompt tokens, saved */
    llm_session *a;
    llm_gen_result r;
    char err[256] = "";
    CHECK_EQ_INT(llm_session_create(c, &a), LLM_OK);
    llm_session_generate(a, prompt, 20, &gp, &r);
    CHECK_EQ_INT(llm_session_save(a, s.path, err, sizeof err), LLM_OK);
    int32_t n_saved = llm_session_n_cached(a);
    llm_session_free(a);
    /* cold and warm runs of the whole prompt */
    trace cold = {0}, warm = {0};
    int32_t cc, cl, wc, wl;
    llm_gen_result rc = generate(c, prompt, 40, gp, &cold, &cc, &cl);
    llm_session *b;
    CHECK_EQ_INT(llm_session_create(c, &b), LLM_OK);
    int32_t restored = -1;
    CHECK_EQ_INT(llm_session_load(b, s.path, prompt, 40, &restored, err, sizeof err), LLM_OK);
    CHECK_EQ_INT(restored, 20); /* the saved run's prompt part: its reply differs from prompt[20..] */
    CHECK(n_saved > 20);
    gp.on_token = t_token, gp.on_logits = t_logits, gp.user = &warm;
    llm_gen_result rw;
    llm_session_generate(b, prompt, 40, &gp, &rw);
    CHECK_EQ_INT(rw.n_reused, 20);
    CHECK_EQ_INT(rw.n_generated, rc.n_generated);
    CHECK(warm.n == cold.n && memcmp(warm.toks, cold.toks, sizeof(int32_t) * (size_t)cold.n) == 0);
    /* a bad file: refused, the session empty and usable, the same answer */
    FILE *f = fopen(s.path, "r+b");
    if (f) fseek(f, 300, SEEK_SET), fputc(0x5a, f), fclose(f);
    trace again = {0};
    CHECK(llm_session_load(b, s.path, prompt, 40, &restored, err, sizeof err) != LLM_OK);
    CHECK_EQ_INT(restored, 0);
    int32_t n_held;
    llm_session_tokens(b, &n_held);
    CHECK_EQ_INT(n_held, 0);
    gp.user = &again;
    llm_session_generate(b, prompt, 40, &gp, &rw);
    CHECK(again.n == cold.n && memcmp(again.toks, cold.toks, sizeof(int32_t) * (size_t)cold.n) == 0);
    llm_session_free(b);
    (void)cc, (void)cl, (void)wc, (void)wl;
    llm_context_free(c);
    session_teardown(&s);
}
