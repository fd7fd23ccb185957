/* tests/test_sched_policies.c - the cache policies in the continuous-batching
 * scheduler (engine/gen/scheduler.h), on tiny random-weight models: context shift
 * against the float64 oracle that forgets positions (tests/test_model_fixture.c,
 * written apart from the engine), prompt-lookup drafts riding in the ragged
 * batch against the same scheduler without them, under preemption, and
 * session files restored at admission against a cold run and the oracle,
 * with corrupt, truncated and foreign files. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "test_model_fixture.h"
#include "gguf_writer.h"
#include "../engine/model/model.h"
#include "../engine/gen/policy.h"
#include "../engine/gen/scheduler.h"

enum { OUT = 200, REQS = 12 };

/* What the callback saw of one request (choice 0; choice 1's tokens too). */
typedef struct {
    int32_t tok[2][OUT];
    int32_t n[2];
    float lp[OUT];                /* choice 0: log p of each token */
    llm_stop_reason finish[2];
    int done;
    int32_t n_cached, n_restored; /* usage on the done event */
} rec_t;

static void on_ev(void *user, const llm_sched_event *ev) {
    rec_t *r = user;
    if (ev->done) {
        r->done = 1, r->n_cached = ev->n_cached, r->n_restored = ev->n_restored;
        return;
    }
    int c = ev->choice;
    if (c < 0 || c > 1) return;
    if (ev->token >= 0 && r->n[c] < OUT) {
        if (c == 0) r->lp[r->n[c]] = ev->logprob;
        r->tok[c][r->n[c]++] = ev->token;
    }
    if (ev->finish != LLM_STOP_NONE) r->finish[c] = ev->finish;
}

static llm_context *ctx(const llm_model *m, int32_t n_ctx, int32_t seqs, int32_t pages, int act_bits) {
    llm_context_params p = llm_context_default_params();
    p.n_ctx = n_ctx, p.n_seqs = seqs, p.n_pages = pages, p.n_batch = 64, p.page_size = 4, p.kv_type = KV_F32;
    p.n_threads = 2, p.act_bits = act_bits;
    llm_context *c = NULL;
    char err[256];
    if (llm_context_create(m, &p, &c, err, sizeof err) != 0) test_fail(__FILE__, __LINE__, "context: %s", err);
    return c;
}

static llm_model *load(fx_model *fx, const fx_spec *spec) {
    if (fx_build(spec, fx)) return NULL;
    llm_model *m = NULL;
    char err[256];
    if (llm_model_load(fx->path, &m, err, sizeof err) != 0) {
        test_fail(__FILE__, __LINE__, "load: %s", err);
        fx_free(fx);
    }
    return m;
}

/* Steps s until every one of n records is done. */
static void drain(llm_sched *s, rec_t *rec, int n) {
    for (int steps = 0; steps < 20000; steps++) {
        int all = 1;
        for (int i = 0; i < n; i++) all &= rec[i].done;
        if (all) return;
        CHECK(llm_sched_step(s) >= 0);
    }
    test_fail(__FILE__, __LINE__, "the requests did not end");
}

/* ---------------------------------------------------------------- context shift */

TEST(sched_context_shift_runs_past_the_context_as_the_oracle_says) {
    enum { N_CTX = 32, N = 10, GEN = 90, KEEP = 5, R = 3 };
    fx_model fx;
    llm_model *m = load(&fx, &(fx_spec){.type = GW_F32, .seed = 52, .rot_dim = 32});
    if (!m) return;
    /* the f32 products, as the oracle computes them */
    llm_context *c = ctx(m, N_CTX, R, 0, 0);
    int32_t prompt[R][N];
    test_rng g = {5};
    for (int i = 0; i < R; i++)
        for (int j = 0; j < N; j++) prompt[i][j] = test_rng_int(&g, FX_BYTE0, FX_VOCAB - 1);
    for (int lookup = 0; lookup <= 8; lookup += 8) {
        llm_sched_params sp = llm_sched_default_params();
        sp.context_shift = 1, sp.n_keep = KEEP, sp.draft_lookup = lookup, sp.draft_fixed = 1;
        llm_sched *s = NULL;
        CHECK_EQ_INT(llm_sched_create(c, &sp, &s), LLM_OK);
        if (!s) break;
        static rec_t rec[R + 1];
        memset(rec, 0, sizeof rec);
        for (int i = 0; i <= R; i++) { /* the last: no max_tokens, so at most n_ctx tokens */
            llm_sched_request q = {.prompt = prompt[i % R], .n_prompt = N, .n_choices = 1,
                                   .max_tokens = i < R ? GEN : -1, .sampler = llm_sampler_default_params(),
                                   .top_logprobs = 0, .cb = on_ev, .user = &rec[i]};
            q.sampler.temp = 0;
            CHECK_EQ_INT(llm_sched_submit(s, &q, NULL, NULL, 0), 0);
        }
        drain(s, rec, R + 1);
        uint64_t shifts = 0;
        int32_t longest = 0;
        double worst = 0;
        for (int i = 0; i <= R; i++) {
            const int32_t n = rec[i].n[0];
            longest = n > longest ? n : longest;
            CHECK(rec[i].finish[0] == (n == (i < R ? GEN : N_CTX) ? LLM_STOP_LENGTH : LLM_STOP_EOG));
            /* the shifts it must have made: before feeding a token that does
             * not fit, keep KEEP and drop half of the rest */
            fx_shift sh[16];
            int32_t n_sh = 0, held = N;
            for (int32_t t = 0; t < n - 1; t++) { /* token t is fed (the last one never is) */
                if (held + 1 > N_CTX && n_sh < 16) {
                    int32_t drop = (held - KEEP) / 2;
                    sh[n_sh++] = (fx_shift){N + t, KEEP, drop};
                    held -= drop;
                }
                held++;
            }
            shifts += (uint64_t)n_sh;
            int32_t stream[N + OUT];
            memcpy(stream, prompt[i % R], sizeof(int32_t) * N);
            memcpy(stream + N, rec[i].tok[0], sizeof(int32_t) * (size_t)n);
            double *want = malloc(sizeof(double) * (size_t)(N + n) * FX_VOCAB);
            fx_reference_shifted(&fx, stream, N + n - 1, sh, n_sh, want);
            for (int32_t t = 0; t < n; t++) { /* token t was drawn after stream token N + t - 1 */
                const double *row = want + (size_t)(N - 1 + t) * FX_VOCAB;
                int32_t best = 0;
                double mx = row[0], z = 0;
                for (int32_t v = 1; v < FX_VOCAB; v++) best = row[v] > row[best] ? v : best;
                mx = row[best];
                for (int32_t v = 0; v < FX_VOCAB; v++) z += exp(row[v] - mx);
                if (best != rec[i].tok[0][t])
                    test_fail(__FILE__, __LINE__, "lookup %d request %d token %d: %d, the oracle's greedy is %d",
                              lookup, i, (int)t, (int)rec[i].tok[0][t], (int)best);
                double d = fabs(rec[i].lp[t] - (row[rec[i].tok[0][t]] - mx - log(z)));
                worst = d > worst ? d : worst;
            }
            free(want);
        }
        llm_sched_stats st = llm_sched_get_stats(s);
        printf("     lookup %d: %llu shifts, longest run %d tokens in a context of %d; log p vs oracle %.2e\n",
               lookup, (unsigned long long)st.shifts, (int)longest, N_CTX, worst);
        CHECK(longest > 2 * N_CTX);   /* it ran well past the context */
        CHECK_EQ_INT((int64_t)st.shifts, (int64_t)shifts);
        CHECK(worst <= 1e-4);
        if (lookup) CHECK(st.drafted > 0);
        llm_sched_free(s);
        kv_cache_stats cs = kv_cache_get_stats(llm_context_cache(c));
        CHECK_EQ_INT(cs.pages_used, 0);
    }
    llm_context_free(c);
    llm_model_free(m);
    fx_free(&fx);
}

/* ---------------------------------------------------------------- prompt lookup */

/* REQS requests (copyable and not; greedy, sampled, two greedy choices)
 * through a scheduler with draft_lookup N on a pool small enough to preempt;
 * stats into *st. */
static void run_lookup(llm_context *c, int32_t N, int32_t (*prompt)[48], const int32_t *n_prompt, rec_t *rec,
                       llm_sched_stats *st) {
    llm_sched_params sp = llm_sched_default_params();
    sp.batch_tokens = 24, sp.draft_lookup = N, sp.draft_fixed = 1;
    llm_sched *s = NULL;
    CHECK_EQ_INT(llm_sched_create(c, &sp, &s), LLM_OK);
    if (!s) return;
    memset(rec, 0, sizeof(rec_t) * REQS);
    for (int i = 0; i < REQS; i++) {
        llm_sched_request q = {.prompt = prompt[i], .n_prompt = n_prompt[i], .n_choices = i % 6 == 5 ? 2 : 1,
                               .max_tokens = 20 + 7 * i, .sampler = llm_sampler_default_params(),
                               .top_logprobs = -1, .cb = on_ev, .user = &rec[i]};
        q.sampler.temp = i % 4 == 3 ? 1.2f : 0, q.sampler.seed = 40 + (uint64_t)i;
        CHECK_EQ_INT(llm_sched_submit(s, &q, NULL, NULL, 0), 0);
        CHECK(llm_sched_step(s) >= 0); /* arrivals spread over the first steps */
    }
    drain(s, rec, REQS);
    *st = llm_sched_get_stats(s);
    llm_sched_free(s);
}

TEST(sched_prompt_lookup_gives_the_tokens_of_plain_decoding_under_preemption) {
    fx_model fx;
    llm_model *m = load(&fx, &(fx_spec){.type = GW_Q8_0, .seed = 61});
    if (!m) return;
    /* 4 sequences, 20 pages of 4: long requests preempt the newest */
    llm_context *c = ctx(m, 128, 4, 20, -1);
    static int32_t prompt[REQS][48];
    int32_t n_prompt[REQS];
    test_rng g = {9};
    for (int i = 0; i < REQS; i++) {
        n_prompt[i] = 12 + 3 * (i % 4);
        prompt[i][0] = 1;
        for (int j = 1; j < n_prompt[i]; j++) prompt[i][j] = test_rng_int(&g, FX_BYTE0, FX_VOCAB - 1);
        if (i % 2 == 0) /* copyable: a phrase three times over */
            for (int j = n_prompt[i] / 3; j < n_prompt[i]; j++) prompt[i][j] = prompt[i][1 + (j - 1) % (n_prompt[i] / 3)];
    }
    static rec_t plain[REQS], spec[REQS];
    llm_sched_stats sa = {0}, sb = {0};
    run_lookup(c, 0, prompt, n_prompt, plain, &sa);
    run_lookup(c, 8, prompt, n_prompt, spec, &sb);
    for (int i = 0; i < REQS; i++)
        for (int ch = 0; ch < (i % 6 == 5 ? 2 : 1); ch++) {
            CHECK(plain[i].done && spec[i].done);
            CHECK_EQ_INT(plain[i].finish[ch], spec[i].finish[ch]);
            if (plain[i].n[ch] != spec[i].n[ch] ||
                memcmp(plain[i].tok[ch], spec[i].tok[ch], sizeof(int32_t) * (size_t)plain[i].n[ch]))
                test_fail(__FILE__, __LINE__, "request %d choice %d: %d tokens plain, %d with lookup, or different", i,
                          ch, (int)plain[i].n[ch], (int)spec[i].n[ch]);
        }
    printf("     lookup: %llu of %llu drafts taken; %llu steps vs %llu plain; %llu + %llu preemptions\n",
           (unsigned long long)sb.accepted, (unsigned long long)sb.drafted, (unsigned long long)sb.steps,
           (unsigned long long)sa.steps, (unsigned long long)sa.preemptions, (unsigned long long)sb.preemptions);
    CHECK_EQ_INT((int64_t)sa.drafted, 0);
    CHECK(sb.accepted > 0);             /* drafts were taken ... */
    CHECK(sb.drafted > sb.accepted);    /* ... and rolled back */
    CHECK(sb.preemptions > 0);
    CHECK_EQ_INT((int64_t)sa.generation_tokens, (int64_t)sb.generation_tokens);
    kv_cache_stats cs = kv_cache_get_stats(llm_context_cache(c));
    CHECK_EQ_INT(cs.pages_used, 0);
    CHECK_EQ_INT(cs.seqs, 0);
    llm_context_free(c);
    llm_model_free(m);
    fx_free(&fx);
}

TEST(sched_refuses_bad_policy_parameters) {
    fx_model fx;
    llm_model *m = load(&fx, &(fx_spec){.type = GW_Q8_0, .seed = 62});
    if (!m) return;
    llm_context *c = ctx(m, 64, 1, 0, -1);
    llm_sched *s = NULL;
    llm_sched_params sp = llm_sched_default_params();
    sp.draft_lookup = LLM_MAX_DRAFT + 1;
    CHECK_EQ_INT(llm_sched_create(c, &sp, &s), LLM_ERR_PARAM);
    sp = llm_sched_default_params(), sp.draft_lookup = -1;
    CHECK_EQ_INT(llm_sched_create(c, &sp, &s), LLM_ERR_PARAM);
    sp = llm_sched_default_params(), sp.n_keep = -1;
    CHECK_EQ_INT(llm_sched_create(c, &sp, &s), LLM_ERR_PARAM);
    sp = llm_sched_default_params(), sp.context_shift = 2;
    CHECK_EQ_INT(llm_sched_create(c, &sp, &s), LLM_ERR_PARAM);
    CHECK(s == NULL);
    llm_context_free(c);
    llm_model_free(m);
    fx_free(&fx);
}

/* ---------------------------------------------------------------- session files */

/* One greedy request (prompt [n], at most max_tokens) through a new
 * scheduler with params sp on c, naming session (or NULL); its record and the
 * scheduler's stats. The context, and so its prefix cache, outlives it. */
static void run_stop(llm_context *c, const llm_sched_params *sp, const int32_t *prompt, int32_t n, int32_t max_tokens,
                     const char *session, const char *stop, rec_t *rec, llm_sched_stats *st) {
    llm_sched *s = NULL;
    memset(rec, 0, sizeof *rec);
    CHECK_EQ_INT(llm_sched_create(c, sp, &s), LLM_OK);
    if (!s) return;
    llm_sched_request q = {.prompt = prompt, .n_prompt = n, .n_choices = 1, .max_tokens = max_tokens,
                           .sampler = llm_sampler_default_params(), .top_logprobs = 0, .cb = on_ev, .user = rec,
                           .session = session, .stops = stop ? &stop : NULL, .n_stops = stop != NULL};
    q.sampler.temp = 0;
    CHECK_EQ_INT(llm_sched_submit(s, &q, NULL, NULL, 0), 0);
    drain(s, rec, 1);
    *st = llm_sched_get_stats(s);
    llm_sched_free(s);
    CHECK_EQ_INT(kv_cache_get_stats(llm_context_cache(c)).pages_used, 0);
}

static void run_one(llm_context *c, const llm_sched_params *sp, const int32_t *prompt, int32_t n, int32_t max_tokens,
                    const char *session, rec_t *rec, llm_sched_stats *st) {
    run_stop(c, sp, prompt, n, max_tokens, session, NULL, rec, st);
}

/* Greedy tokens and log p of rec (after prompt [n]) against the float64
 * oracle over prompt + tokens; returns the worst |log p| difference. */
static double vs_oracle(fx_model *fx, const int32_t *prompt, int32_t n, const rec_t *rec) {
    const int32_t g = rec->n[0];
    int32_t *stream = malloc(sizeof(int32_t) * (size_t)(n + g));
    double *want = malloc(sizeof(double) * (size_t)(n + g) * FX_VOCAB), worst = 0;
    memcpy(stream, prompt, sizeof(int32_t) * (size_t)n);
    memcpy(stream + n, rec->tok[0], sizeof(int32_t) * (size_t)g);
    fx_reference(fx, stream, n + g, want);
    for (int32_t t = 0; t < g; t++) { /* token t was drawn after stream token n + t - 1 */
        const double *row = want + (size_t)(n - 1 + t) * FX_VOCAB;
        int32_t best = 0;
        double z = 0;
        for (int32_t v = 1; v < FX_VOCAB; v++) best = row[v] > row[best] ? v : best;
        for (int32_t v = 0; v < FX_VOCAB; v++) z += exp(row[v] - row[best]);
        if (best != rec->tok[0][t])
            test_fail(__FILE__, __LINE__, "token %d: %d, the oracle's greedy is %d", (int)t, (int)rec->tok[0][t], (int)best);
        worst = fmax(worst, fabs(rec->lp[t] - (row[rec->tok[0][t]] - row[best] - log(z))));
    }
    free(stream), free(want);
    return worst;
}

/* The same tokens, and log p within f32 rounding (exactly: bit for bit). */
static void same_run(const rec_t *a, const rec_t *b, int exactly, const char *what) {
    CHECK(a->done && b->done);
    if (a->n[0] != b->n[0] || memcmp(a->tok[0], b->tok[0], sizeof(int32_t) * (size_t)a->n[0]) || a->finish[0] != b->finish[0])
        test_fail(__FILE__, __LINE__, "%s: %d tokens, %d cold, or different", what, (int)a->n[0], (int)b->n[0]);
    double d = 0;
    for (int32_t t = 0; t < a->n[0] && t < b->n[0]; t++) d = fmax(d, fabs((double)a->lp[t] - b->lp[t]));
    if (exactly ? d != 0 : d > 1e-5) test_fail(__FILE__, __LINE__, "%s: log p differs from the cold run by %.3g", what, d);
}

static void session_path(char *path, size_t n, const char *tag) {
    snprintf(path, n, "/tmp/kvcache_test_sched_session_%d_%s.kvs", (int)getpid(), tag);
    remove(path);
}

static int file_exists(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

TEST(sched_session_restore_gives_the_tokens_of_a_cold_run_and_the_oracle) {
    enum { N1 = 22, GEN1 = 9, EXTRA = 7, GEN2 = 24 };
    fx_model fx;
    llm_model *m = load(&fx, &(fx_spec){.type = GW_F32, .seed = 71});
    if (!m) return;
    char path[160];
    session_path(path, sizeof path, "restore");
    llm_sched_params sp = llm_sched_default_params();
    llm_sched_stats st;
    static rec_t r1, warm, cold;
    int32_t p1[N1], p2[N1 + GEN1 + EXTRA];
    test_rng g = {17};
    for (int j = 0; j < N1; j++) p1[j] = test_rng_int(&g, FX_BYTE0, FX_VOCAB - 1);
    /* the first request of the session: nothing to restore, its sequence saved */
    llm_context *ca = ctx(m, 96, 2, 0, 0);
    run_one(ca, &sp, p1, N1, GEN1, path, &r1, &st);
    CHECK(file_exists(path));
    CHECK_EQ_INT((int64_t)st.session_saves, 1);
    CHECK_EQ_INT((int64_t)(st.session_restores + st.session_refused), 0);
    CHECK_EQ_INT(r1.n_cached, 0);
    /* the cache held the prompt and the output, the last token not fed (but
     * after an end of turn, which is never kept, every one) */
    const int32_t saved = N1 + r1.n[0] - (r1.finish[0] == LLM_STOP_EOG ? 0 : 1);
    /* the next turn: the saved tokens, then more */
    const int32_t n2 = N1 + r1.n[0] + EXTRA;
    memcpy(p2, p1, sizeof p1);
    memcpy(p2 + N1, r1.tok[0], sizeof(int32_t) * (size_t)r1.n[0]);
    for (int32_t j = N1 + r1.n[0]; j < n2; j++) p2[j] = test_rng_int(&g, FX_BYTE0, FX_VOCAB - 1);
    llm_context *cc = ctx(m, 96, 2, 0, 0);
    run_one(cc, &sp, p2, n2, GEN2, NULL, &cold, &st);
    CHECK_EQ_INT(cold.n_cached, 0);
    double worst = vs_oracle(&fx, p2, n2, &cold);

    /* 1. a new server (an empty prefix cache): the file gives the prefix */
    llm_context *cb = ctx(m, 96, 2, 0, 0);
    run_one(cb, &sp, p2, n2, GEN2, path, &warm, &st);
    CHECK_EQ_INT(warm.n_restored, saved);
    CHECK_EQ_INT(warm.n_cached, saved);
    CHECK_EQ_INT((int64_t)st.session_restores, 1);
    CHECK_EQ_INT((int64_t)st.session_restored, saved);
    same_run(&warm, &cold, 0, "restored in a new context");
    worst = fmax(worst, vs_oracle(&fx, p2, n2, &warm));
    llm_context_free(cb);

    /* 2. the first server after its prefix cache lost the pages (pressure):
     * only two pages of the prompt are found; the file, which now holds p2
     * and its answer, reaches to the last prompt token */
    CHECK_EQ_INT(kv_prefix_clear(llm_context_cache(ca)), KV_OK);
    run_one(ca, &sp, p1, 8, 1, NULL, &r1, &st); /* p1[0..8): two pages of 4 named again */
    run_one(ca, &sp, p2, n2, GEN2, path, &warm, &st);
    CHECK_EQ_INT(warm.n_restored, n2 - 1);
    CHECK_EQ_INT(warm.n_cached, n2 - 1);
    CHECK(st.prefix_hits == 8);    /* what the prefix cache had, and the file beat */
    same_run(&warm, &cold, 0, "restored past the prefix cache");

    /* 3. a prompt that leaves the file's tokens at 15: that prefix only */
    p2[15] = p2[15] == FX_BYTE0 ? FX_BYTE0 + 1 : FX_BYTE0;
    llm_context *cd = ctx(m, 96, 2, 0, 0);
    run_one(cd, &sp, p2, n2, GEN2, NULL, &cold, &st);
    llm_context_free(cd);
    cd = ctx(m, 96, 2, 0, 0);
    run_one(cd, &sp, p2, n2, GEN2, path, &warm, &st);
    CHECK_EQ_INT(warm.n_restored, 15);
    same_run(&warm, &cold, 0, "a common prefix of 15");
    worst = fmax(worst, vs_oracle(&fx, p2, n2, &warm));
    printf("     restored %d, then %d, then 15 tokens; log p vs the oracle %.2e\n", (int)saved, (int)(n2 - 1), worst);
    CHECK(worst <= 1e-4);
    llm_context_free(cd), llm_context_free(cc), llm_context_free(ca);
    remove(path);
    llm_model_free(m);
    fx_free(&fx);
}

static char last_log[512];   /* the scheduler's first line about a session file since emptied */

static void keep_log(void *user, const char *line) {
    (void)user;
    if (!last_log[0]) snprintf(last_log, sizeof last_log, "%s", line);
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    unsigned char *b = NULL;
    *n = 0;
    if (f && fseek(f, 0, SEEK_END) == 0) {
        long len = ftell(f);
        b = len > 0 ? malloc((size_t)len) : NULL;
        if (b && fseek(f, 0, SEEK_SET) == 0 && fread(b, 1, (size_t)len, f) == (size_t)len) *n = (size_t)len;
    }
    if (f) fclose(f);
    return b;
}

static void spill(const char *path, const unsigned char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(b, 1, n, f) == n);
    fclose(f);
}

TEST(sched_a_corrupt_truncated_or_foreign_session_file_gives_the_cold_answer) {
    enum { N = 30, SAVED = 21, GEN = 16 };
    fx_model fx, fx2;
    llm_model *m = load(&fx, &(fx_spec){.type = GW_Q8_0, .seed = 73});
    if (!m) return;
    llm_model *other = load(&fx2, &(fx_spec){.type = GW_Q8_0, .seed = 74});
    if (!other) return llm_model_free(m), fx_free(&fx);
    char path[160];
    session_path(path, sizeof path, "bad");
    int32_t p[N];
    test_rng g = {23};
    for (int j = 0; j < N; j++) p[j] = test_rng_int(&g, FX_BYTE0, FX_VOCAB - 1);
    llm_sched_params sp = llm_sched_default_params();
    llm_sched_stats st;
    static rec_t r0, cold, got;
    /* files of this model, another model, another K/V type: each from p[0..SAVED) */
    size_t n_good = 0, n_foreign = 0, n_f16 = 0;
    llm_context *c = ctx(other, 64, 1, 0, 0);
    run_one(c, &sp, p, SAVED, 1, path, &r0, &st);
    llm_context_free(c);
    unsigned char *foreign = slurp(path, &n_foreign);
    llm_context_params cp = llm_context_default_params();
    cp.n_ctx = 64, cp.n_seqs = 1, cp.n_batch = 64, cp.page_size = 4, cp.kv_type = KV_F16, cp.n_threads = 2;
    cp.act_bits = 0;
    c = fx_context(m, &cp);
    run_one(c, &sp, p, SAVED, 1, path, &r0, &st);
    llm_context_free(c);
    unsigned char *f16 = slurp(path, &n_f16);
    c = ctx(m, 64, 1, 0, 0);
    run_one(c, &sp, p, SAVED, 1, path, &r0, &st);
    llm_context_free(c);
    unsigned char *good = slurp(path, &n_good);
    CHECK(good && foreign && f16 && n_good > 2000 && n_foreign == n_good && n_f16 < n_good);
    if (!good || !foreign || !f16 || n_good < 2000) goto out;
    c = ctx(m, 64, 1, 0, 0);
    run_one(c, &sp, p, N, GEN, NULL, &cold, &st);
    llm_context_free(c);
    /* the good file restores (so the ones below are refused for what was done to them) */
    c = ctx(m, 64, 1, 0, 0);
    spill(path, good, n_good);
    run_one(c, &sp, p, N, GEN, path, &got, &st);
    llm_context_free(c);
    CHECK_EQ_INT(got.n_restored, SAVED);
    same_run(&got, &cold, 0, "the good file");
    unsigned char *bad = malloc(n_good + 1);
    sp.log = keep_log;
    int cases = 0;
    for (int k = 0; bad && k < 40; k++) {
        size_t n = n_good;
        memcpy(bad, good, n_good);
        const unsigned char *src = bad;
        if (k < 12) { /* truncated: in the engine's header, its tokens, the library's header, K/V, checksums */
            static const size_t cuts[] = {0, 1, 9, 100, 170, 181, 200, 260, 300};
            n = k < 9 ? cuts[k] : k == 9 ? n_good / 2 : n_good - (size_t)(k - 9) * 4;
        } else if (k < 34) { /* one flipped bit: 8 in the first 300 bytes, the rest anywhere */
            size_t at = k < 20 ? (size_t)test_rng_int(&g, 0, 299) : (size_t)test_rng_int(&g, 0, (int)n_good - 1);
            bad[at] ^= (unsigned char)(1u << test_rng_int(&g, 0, 7));
        } else if (k == 34) {
            src = foreign, n = n_foreign;
        } else if (k == 35) {
            src = f16, n = n_f16;
        } else if (k == 36) { /* a byte after the end */
            bad[n_good] = 0, n = n_good + 1;
        } else { /* noise of the good file's length, or of a few bytes */
            for (size_t i = 0; i < n_good; i++) bad[i] = (unsigned char)test_rng_int(&g, 0, 255);
            n = k == 37 ? n_good : (size_t)(k - 37) * 3;
        }
        spill(path, src, n);
        last_log[0] = 0;
        c = ctx(m, 64, 1, 0, 0);
        run_one(c, &sp, p, N, GEN, path, &got, &st);
        llm_context_free(c);
        if (st.session_refused != 1 || got.n_cached != 0)
            test_fail(__FILE__, __LINE__, "case %d: refused %llu, cached %d", k, (unsigned long long)st.session_refused,
                      (int)got.n_cached);
        /* and the log says why */
        const char *why = k == 34 ? "another model" : k == 35 ? "K/V type" : k == 36 ? "after the end" : "ignored";
        if (!strstr(last_log, why) || !strstr(last_log, path))
            test_fail(__FILE__, __LINE__, "case %d: the log says '%s', not '%s'", k, last_log, why);
        char what[32];
        snprintf(what, sizeof what, "bad file %d", k);
        same_run(&got, &cold, 1, what);   /* a cold run in a new context: bit for bit */
        CHECK_EQ_INT((int64_t)st.session_saves, 1); /* and the run left a good file behind */
        cases++;
    }
    /* which the next request restores */
    c = ctx(m, 64, 1, 0, 0);
    run_one(c, &sp, p, N, GEN, path, &got, &st);
    llm_context_free(c);
    CHECK_EQ_INT(got.n_restored, N - 1);
    same_run(&got, &cold, 0, "the file a cold run left");
    printf("     %d bad files refused, each run cold\n", cases);
    free(bad);
out:
    free(good), free(foreign), free(f16);
    remove(path);
    llm_model_free(other), llm_model_free(m);
    fx_free(&fx2), fx_free(&fx);
}

TEST(sched_sessions_save_what_drafts_kept_and_never_a_cancelled_or_shifted_sequence) {
    enum { N = 21, GEN = 16, EXTRA = 5 };
    fx_model fx;
    llm_model *m = load(&fx, &(fx_spec){.type = GW_F32, .seed = 75});
    if (!m) return;
    char path[160];
    session_path(path, sizeof path, "policies");
    int32_t p[N + GEN + EXTRA];
    test_rng g = {29};
    for (int j = 0; j < 7; j++) p[j] = test_rng_int(&g, FX_BYTE0, FX_VOCAB - 1);
    for (int j = 7; j < N; j++) p[j] = p[j % 7];   /* a phrase three times: drafts to take */
    llm_sched_params sp = llm_sched_default_params(), drafts = sp;
    drafts.draft_lookup = 8, drafts.draft_fixed = 1;
    llm_sched_stats st;
    static rec_t r1, warm, cold;
    /* drafts: a choice that ends within a verify pass saves the positions of
     * the drafts it took, not the ones after; ends at every output length */
    uint64_t drafted = 0, accepted = 0;
    for (int32_t gen = 3; gen <= GEN; gen++) {
        llm_context *c = ctx(m, 96, 1, 0, 0);
        run_one(c, &drafts, p, N, gen, path, &r1, &st);
        llm_context_free(c);
        drafted += st.drafted, accepted += st.accepted;
        CHECK_EQ_INT((int64_t)st.session_saves, 1);
        const int32_t n2 = N + r1.n[0] + EXTRA;
        memcpy(p + N, r1.tok[0], sizeof(int32_t) * (size_t)r1.n[0]);
        for (int32_t j = N + r1.n[0]; j < n2; j++) p[j] = test_rng_int(&g, FX_BYTE0, FX_VOCAB - 1);
        c = ctx(m, 96, 1, 0, 0);
        run_one(c, &sp, p, n2, GEN, NULL, &cold, &st);
        llm_context_free(c);
        c = ctx(m, 96, 1, 0, 0);
        run_one(c, &drafts, p, n2, GEN, path, &warm, &st);
        llm_context_free(c);
        CHECK_EQ_INT(warm.n_restored, N + r1.n[0] - (r1.finish[0] == LLM_STOP_EOG ? 0 : 1));
        same_run(&warm, &cold, 0, "restored after drafts");
        CHECK(vs_oracle(&fx, p, n2, &warm) <= 1e-4);
    }
    CHECK(accepted > 0 && drafted > accepted);   /* drafts taken, and rejected */
    /* a stop string can end the choice inside a verify pass, before its last
     * row. A prompt that holds every token once, so that every step drafts;
     * each printable byte the output shows first at t > 1 as the stop */
    static int32_t every[FX_VOCAB - FX_BYTE0];
    const int32_t n_every = FX_VOCAB - FX_BYTE0;
    for (int32_t j = 0; j < n_every; j++) every[j] = FX_BYTE0 + j;
    for (int32_t j = n_every - 1; j > 0; j--) {
        int32_t k = test_rng_int(&g, 0, j), t = every[j];
        every[j] = every[k], every[k] = t;
    }
    llm_context *c0 = ctx(m, 512, 1, 0, 0);
    run_one(c0, &sp, every, n_every, GEN, NULL, &cold, &st);
    llm_context_free(c0);
    int stops = 0;
    for (int32_t t = 2; t < cold.n[0]; t++) {
        int32_t b = cold.tok[0][t] - FX_BYTE0, seen = 0;
        for (int32_t u = 0; u < t; u++) seen |= cold.tok[0][u] == cold.tok[0][t];
        if (seen || b < 0x21 || b > 0x7e) continue;
        const char stop[2] = {(char)b, 0};
        c0 = ctx(m, 512, 1, 0, 0);
        run_stop(c0, &drafts, every, n_every, GEN, path, stop, &r1, &st);
        drafted += st.drafted;
        CHECK_EQ_INT(r1.finish[0], LLM_STOP_STRING);
        CHECK_EQ_INT(r1.n[0], t + 1);
        int32_t n_common = 0, n_file = 0;
        CHECK_EQ_INT(llm_session_file_peek(c0, path, every, n_every, &n_common, &n_file, NULL, 0), 0);
        llm_context_free(c0);
        CHECK_EQ_INT(n_file, n_every + t);   /* the prompt and the tokens fed: all but the stop's own */
        stops++;
    }
    CHECK(stops > 0);
    printf("     drafts: %llu of %llu taken; %d stop strings\n", (unsigned long long)accepted,
           (unsigned long long)drafted, stops);

    /* cancelled: no file */
    remove(path);
    llm_context *c = ctx(m, 96, 1, 0, 0);
    llm_sched *s = NULL;
    CHECK_EQ_INT(llm_sched_create(c, &sp, &s), LLM_OK);
    if (s) {
        llm_sched_request q = {.prompt = p, .n_prompt = N, .n_choices = 1, .max_tokens = 40,
                               .sampler = llm_sampler_default_params(), .top_logprobs = -1, .cb = on_ev,
                               .user = &r1, .session = path};
        uint64_t id = 0;
        memset(&r1, 0, sizeof r1);
        CHECK_EQ_INT(llm_sched_submit(s, &q, &id, NULL, 0), 0);
        for (int k = 0; k < 4; k++) CHECK(llm_sched_step(s) >= 0);
        CHECK(r1.n[0] > 0 && !r1.done);
        llm_sched_cancel(s, id);
        drain(s, &r1, 1);
        CHECK_EQ_INT(r1.finish[0], LLM_STOP_CANCEL);
        CHECK_EQ_INT((int64_t)llm_sched_get_stats(s).session_saves, 0);
        llm_sched_free(s);
    }
    CHECK(!file_exists(path));
    llm_context_free(c);

    /* context-shifted: its kept K/V were computed over what it dropped, so a
     * restore would not be a cold run; not saved, counted */
    llm_sched_params shift = sp;
    shift.context_shift = 1, shift.n_keep = 5;
    c = ctx(m, 32, 1, 0, 0);
    run_one(c, &shift, p, 10, 60, path, &r1, &st);
    CHECK(st.shifts >= 1 && r1.n[0] > 32);
    CHECK_EQ_INT((int64_t)st.session_saves, 0);
    CHECK_EQ_INT((int64_t)st.session_save_failures, 1);
    CHECK(!file_exists(path));
    /* the same scheduler settings save a sequence that did not shift */
    run_one(c, &shift, p, 10, 5, path, &r1, &st);
    CHECK_EQ_INT((int64_t)st.session_saves, 1);
    CHECK(file_exists(path));
    llm_context_free(c);
    remove(path);
    llm_model_free(m);
    fx_free(&fx);
}

TEST(sched_sessions_under_preemption_give_the_tokens_of_cold_runs) {
    enum { R = 8 };
    fx_model fx;
    llm_model *m = load(&fx, &(fx_spec){.type = GW_F32, .seed = 77});
    if (!m) return;
    static int32_t prompt[R][32];
    int32_t n_prompt[R];
    char path[R][160];
    test_rng g = {31};
    llm_sched_params sp = llm_sched_default_params();
    sp.batch_tokens = 24;
    llm_sched_stats st;
    static rec_t rec[2][R];
    /* the even requests name a session that holds the first 12 tokens of their prompt */
    llm_context *big = ctx(m, 128, 1, 0, 0);
    for (int i = 0; i < R; i++) {
        n_prompt[i] = 14 + 2 * i;
        for (int j = 0; j < n_prompt[i]; j++) prompt[i][j] = test_rng_int(&g, FX_BYTE0, FX_VOCAB - 1);
        char tag[16];
        snprintf(tag, sizeof tag, "pre%d", i);
        session_path(path[i], sizeof path[i], tag);
        if (i % 2 == 0) run_one(big, &sp, prompt[i], 12, 1, path[i], &rec[0][i], &st);
    }
    llm_context_free(big);
    uint64_t preempted[2] = {0, 0}, restores = 0;
    for (int with = 0; with < 2; with++) {
        /* 4 sequences on 24 pages of 4: the newest are preempted */
        llm_context *c = ctx(m, 128, 4, 24, 0);
        llm_sched *s = NULL;
        CHECK_EQ_INT(llm_sched_create(c, &sp, &s), LLM_OK);
        if (!s) break;
        memset(rec[with], 0, sizeof rec[with]);
        for (int i = 0; i < R; i++) {
            llm_sched_request q = {.prompt = prompt[i], .n_prompt = n_prompt[i], .n_choices = 1,
                                   .max_tokens = 20 + 2 * i, .sampler = llm_sampler_default_params(),
                                   .top_logprobs = 0, .cb = on_ev, .user = &rec[with][i],
                                   .session = with && i % 2 == 0 ? path[i] : NULL};
            q.sampler.temp = 0;
            CHECK_EQ_INT(llm_sched_submit(s, &q, NULL, NULL, 0), 0);
            CHECK(llm_sched_step(s) >= 0);
        }
        drain(s, rec[with], R);
        st = llm_sched_get_stats(s);
        preempted[with] = st.preemptions;
        if (with) restores = st.session_restores;
        llm_sched_free(s);
        CHECK_EQ_INT(kv_cache_get_stats(llm_context_cache(c)).pages_used, 0);
        llm_context_free(c);
    }
    for (int i = 0; i < R; i++) {
        char what[32];
        snprintf(what, sizeof what, "request %d", i);
        same_run(&rec[1][i], &rec[0][i], 0, what);
        remove(path[i]);
    }
    printf("     %llu restores; %llu and %llu preemptions\n", (unsigned long long)restores,
           (unsigned long long)preempted[0], (unsigned long long)preempted[1]);
    CHECK(restores >= 1);
    CHECK(preempted[0] > 0 && preempted[1] > 0);
    llm_model_free(m);
    fx_free(&fx);
}
