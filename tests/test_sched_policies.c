/* tests/test_sched_policies.c - the cache policies in the continuous-batching
 * scheduler (engine/scheduler.h), on tiny random-weight models: context shift
 * against the float64 oracle that forgets positions (tests/test_model_fixture.c,
 * written apart from the engine), and prompt-lookup drafts riding in the
 * ragged batch against the same scheduler without them, under preemption. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "test_model_fixture.h"
#include "gguf_writer.h"
#include "../engine/model.h"
#include "../engine/scheduler.h"

enum { OUT = 200, REQS = 12 };

/* What the callback saw of one request (choice 0; choice 1's tokens too). */
typedef struct {
    int32_t tok[2][OUT];
    int32_t n[2];
    float lp[OUT];                /* choice 0: log p of each token */
    llm_stop_reason finish[2];
    int done;
} rec_t;

static void on_ev(void *user, const llm_sched_event *ev) {
    rec_t *r = user;
    if (ev->done) { r->done = 1; return; }
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
        sp.context_shift = 1, sp.n_keep = KEEP, sp.draft_lookup = lookup;
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
    sp.batch_tokens = 24, sp.draft_lookup = N;
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
