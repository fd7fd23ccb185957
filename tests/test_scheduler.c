/* tests/test_scheduler.c - continuous batching (engine/gen/scheduler.h) on tiny
 * random-weight models: many requests with random arrival, prompt and output
 * lengths through a pool small enough to force preemption, each compared with
 * a solo run of the same request written here (llm_eval on a context of its
 * own, one token at a time, the sampler chosen by hand); pages all back in
 * the pool; refusal of what can never fit; cancellation; n choices; logprobs;
 * conversations sharing a prefill in flight and resuming their history on
 * Llama and Gemma 3. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "test_model_fixture.h"
#include "gguf_writer.h"
#include "../engine/model/model.h"
#include "../engine/gen/scheduler.h"
#include "../engine/gen/session.h"

enum { MAX_OUT = 64, MAX_REQ = 24, PAGE = 4, CTX = 96 };

/* What the callback saw of one request. */
typedef struct {
    int32_t tokens[LLM_SCHED_MAX_CHOICES][MAX_OUT];
    int32_t n[LLM_SCHED_MAX_CHOICES];
    llm_stop_reason finish[LLM_SCHED_MAX_CHOICES];
    float logprob[MAX_OUT];                 /* choice 0 */
    int32_t top0[MAX_OUT];                  /* choice 0's best alternative */
    int events_after_done, done, n_finish;
    int32_t usage_prompt, usage_cached, usage_generated;
    llm_sched *sched;                       /* when set: its counters as the done event came */
    llm_sched_stats at_done;
    int status;                             /* choice 0's, with LLM_STOP_ERROR */
    char error[192];
} record;

static void on_event(void *user, const llm_sched_event *ev) {
    record *r = user;
    if (r->done) { r->events_after_done++; return; }
    if (ev->done) {
        r->done = 1;
        if (r->sched) r->at_done = llm_sched_get_stats(r->sched);
        r->usage_prompt = ev->n_prompt, r->usage_cached = ev->n_cached, r->usage_generated = ev->n_generated;
        return;
    }
    if (ev->token >= 0 && r->n[ev->choice] < MAX_OUT) {
        int32_t k = r->n[ev->choice]++;
        r->tokens[ev->choice][k] = ev->token;
        if (ev->choice == 0) r->logprob[k] = ev->logprob, r->top0[k] = ev->n_top ? ev->top_ids[0] : -1;
    }
    if (ev->finish != LLM_STOP_NONE) r->finish[ev->choice] = ev->finish, r->n_finish++;
    if (ev->finish == LLM_STOP_ERROR && ev->choice == 0)
        r->status = ev->status, snprintf(r->error, sizeof r->error, "%s", ev->error ? ev->error : "");
}

static llm_context *make_ctx(const llm_model *m, int32_t seqs, int32_t pages, int32_t batch) {
    llm_context_params p = llm_context_default_params();
    p.n_ctx = CTX, p.n_seqs = seqs, p.n_pages = pages, p.n_batch = batch, p.page_size = PAGE, p.kv_type = KV_F32;
    p.n_threads = 2;
    return fx_context(m, &p);
}

/* The request alone: prefill, then sample -> feed until end of generation,
 * max tokens or the context. Returns the tokens generated (EOG not counted). */
static int32_t solo(llm_context *c, const int32_t *prompt, int32_t n_prompt, int32_t max_tokens,
                    const llm_sampler_params *sp, int32_t *out, double *lp0) {
    const llm_model *m = llm_context_model(c);
    const int32_t V = llm_model_n_vocab(m);
    float *logits = malloc(sizeof(float) * (size_t)V);
    llm_sampler smp;
    llm_sampler_init(&smp, sp, V);
    int32_t seq, n = 0;
    llm_seq_new(c, &seq);
    int rc = llm_eval(c, seq, prompt, n_prompt, 0, logits, NULL, NULL);
    while (rc == KV_OK && n < max_tokens && n < MAX_OUT) {
        int32_t t = llm_sample(&smp, logits);
        if (llm_token_is_eog(llm_model_tokenizer(m), t)) break;
        if (lp0 && n == 0) { /* log-softmax in double, for the logprobs check */
            double mx = logits[0], z = 0;
            for (int32_t v = 1; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
            for (int32_t v = 0; v < V; v++) z += exp((double)logits[v] - mx);
            *lp0 = logits[t] - mx - log(z);
        }
        out[n++] = t;
        if (n_prompt + n > CTX || n == max_tokens) break;
        rc = llm_eval(c, seq, &t, 1, 0, logits, NULL, NULL);
    }
    CHECK_EQ_INT(rc, KV_OK);
    llm_seq_remove(c, seq);
    llm_sampler_free(&smp);
    free(logits);
    return n;
}

static llm_sched_request request(const int32_t *prompt, int32_t n, int32_t max_tokens, record *rec) {
    llm_sched_request r = {.prompt = prompt, .n_prompt = n, .n_choices = 1, .max_tokens = max_tokens,
                           .sampler = llm_sampler_default_params(), .top_logprobs = -1, .cb = on_event,
                           .user = rec};
    r.sampler.temp = 0;
    return r;
}

static int setup(fx_model *fx, llm_model **m, int type, uint64_t seed) {
    if (fx_build(&(fx_spec){.type = type, .seed = seed}, fx)) return -1;
    char err[256];
    if (llm_model_load(fx->path, m, err, sizeof err) != 0) {
        test_fail(__FILE__, __LINE__, "load: %s", err);
        fx_free(fx);
        return -1;
    }
    return 0;
}

static void random_prompt(test_rng *g, int32_t *p, int32_t n) {
    p[0] = 1; /* bos */
    for (int32_t i = 1; i < n; i++) p[i] = test_rng_int(g, FX_BYTE0, FX_VOCAB - 1);
}

/* ---------------------------------------------------------------- tests */

TEST(sched_greedy_tokens_equal_solo_runs_under_preemption) {
    fx_model fx;
    llm_model *m;
    if (setup(&fx, &m, GW_Q8_0, 21)) return;
    /* 6 sequences but 30 pages of 4 (120 positions): a few long requests
     * fill the pool, so the newest are preempted and recomputed */
    llm_context *c = make_ctx(m, 6, 30, 24), *ref = make_ctx(m, 1, 0, 64);
    llm_sched_params sp = llm_sched_default_params();
    sp.batch_tokens = 20;   /* prompts arrive in chunks beside running decodes */
    llm_sched *s = NULL;
    CHECK_EQ_INT(llm_sched_create(c, &sp, &s), KV_OK);
    test_rng g = {77};
    static int32_t prompts[MAX_REQ][48];
    static record rec[MAX_REQ];
    memset(rec, 0, sizeof rec);
    int32_t n_prompt[MAX_REQ], max_tok[MAX_REQ], arrive[MAX_REQ];
    for (int i = 0; i < MAX_REQ; i++) {
        n_prompt[i] = test_rng_int(&g, 2, 44);
        max_tok[i] = test_rng_int(&g, 1, 40);
        arrive[i] = test_rng_int(&g, 0, 40);
        random_prompt(&g, prompts[i], n_prompt[i]);
        /* a few share a long prefix, for the prefix cache */
        if (i % 4 == 3) memcpy(prompts[i], prompts[i - 1], sizeof(int32_t) * (size_t)(n_prompt[i] < n_prompt[i - 1] ? n_prompt[i] : n_prompt[i - 1]));
    }
    int submitted = 0, steps = 0;
    for (; steps < 5000; steps++) {
        for (int i = 0; i < MAX_REQ; i++)
            if (arrive[i] == steps) {
                llm_sched_request r = request(prompts[i], n_prompt[i], max_tok[i], &rec[i]);
                CHECK_EQ_INT(llm_sched_submit(s, &r, NULL, NULL, 0), 0);
                submitted++;
            }
        int rows = llm_sched_step(s);
        CHECK(rows >= 0);
        llm_sched_stats st = llm_sched_get_stats(s);
        if (submitted == MAX_REQ && st.running == 0 && st.waiting == 0) break;
    }
    llm_sched_stats st = llm_sched_get_stats(s);
    printf("     %d steps, %llu rows, %llu preemptions, prefix hits %llu of %llu tokens\n", steps,
           (unsigned long long)st.rows, (unsigned long long)st.preemptions, (unsigned long long)st.prefix_hits,
           (unsigned long long)st.prefix_queries);
    CHECK(st.preemptions > 0);
    CHECK(st.prefix_hits > 0);
    int same = 0;
    for (int i = 0; i < MAX_REQ; i++) {
        int32_t want[MAX_OUT];
        llm_sampler_params greedy = llm_sampler_default_params();
        greedy.temp = 0;
        int32_t n = solo(ref, prompts[i], n_prompt[i], max_tok[i], &greedy, want, NULL);
        CHECK(rec[i].done);
        CHECK_EQ_INT(rec[i].events_after_done, 0);
        CHECK_EQ_INT(rec[i].n_finish, 1);
        CHECK_EQ_INT(rec[i].usage_prompt, n_prompt[i]);
        CHECK_EQ_INT(rec[i].usage_generated, rec[i].n[0]);
        if (rec[i].n[0] == n && !memcmp(rec[i].tokens[0], want, sizeof(int32_t) * (size_t)n)) same++;
        else test_fail(__FILE__, __LINE__, "request %d: %d tokens batched, %d solo, or different", i, rec[i].n[0], n);
        CHECK(rec[i].finish[0] == (n == max_tok[i] ? LLM_STOP_LENGTH : n_prompt[i] + n > CTX ? LLM_STOP_CONTEXT : LLM_STOP_EOG));
    }
    CHECK_EQ_INT(same, MAX_REQ);
    int32_t total = 0;
    for (int i = 0; i < MAX_REQ; i++) total += rec[i].n[0];
    printf("     %d tokens generated, every request's equal to its solo run\n", (int)total);
    CHECK(total > 4 * MAX_REQ);   /* not a degenerate run of immediate end-of-turns */
    kv_cache_stats cs = kv_cache_get_stats(llm_context_cache(c));
    CHECK_EQ_INT(cs.pages_used, 0);
    CHECK_EQ_INT(cs.seqs, 0);
    CHECK_EQ_INT(cs.pages_free + cs.pages_cached, cs.pages_total);
    CHECK(cs.pages_cached > 0);   /* the finished requests' full pages stay findable ... */
    CHECK_EQ_INT(kv_prefix_clear(llm_context_cache(c)), KV_OK);
    CHECK_EQ_INT(kv_cache_get_stats(llm_context_cache(c)).pages_free, cs.pages_total);   /* ... until cleared */
    llm_sched_free(s);
    llm_context_free(c), llm_context_free(ref);
    llm_model_free(m);
    fx_free(&fx);
}

TEST(sched_refuses_requests_that_can_never_fit) {
    fx_model fx;
    llm_model *m;
    if (setup(&fx, &m, GW_F16, 22)) return;
    llm_context *c = make_ctx(m, 2, 10, 16);   /* 40 positions of pool, 96 of context */
    llm_sched *s = NULL;
    CHECK_EQ_INT(llm_sched_create(c, NULL, &s), KV_OK);
    static int32_t p[CTX + 8];
    test_rng g = {5};
    random_prompt(&g, p, CTX + 8);
    record rec = {0};
    char err[160];
    llm_sched_request r = request(p, CTX, 4, &rec);
    CHECK_EQ_INT(llm_sched_submit(s, &r, NULL, err, sizeof err), LLM_ERR_TOO_LARGE);
    CHECK(strstr(err, "request of 96 tokens exceeds the context of 96") != NULL);
    r.n_prompt = 50;   /* fits the context, not the pool */
    CHECK_EQ_INT(llm_sched_submit(s, &r, NULL, err, sizeof err), LLM_ERR_TOO_LARGE);
    CHECK(strstr(err, "KV pages") != NULL);
    r.n_prompt = 0;
    CHECK_EQ_INT(llm_sched_submit(s, &r, NULL, err, sizeof err), LLM_ERR_PARAM);
    r.n_prompt = 4, r.n_choices = 3;   /* more choices than sequences */
    CHECK_EQ_INT(llm_sched_submit(s, &r, NULL, err, sizeof err), LLM_ERR_TOO_LARGE);
    r.n_choices = 1;
    int32_t bad[2] = {1, FX_VOCAB};
    r.prompt = bad, r.n_prompt = 2;
    CHECK_EQ_INT(llm_sched_submit(s, &r, NULL, err, sizeof err), LLM_ERR_PARAM);
    /* a request that fits alone but outgrows the pool while generating ends
     * with "context" instead of looping */
    r.prompt = p, r.n_prompt = 30, r.max_tokens = -1;
    CHECK_EQ_INT(llm_sched_submit(s, &r, NULL, err, sizeof err), 0);
    for (int i = 0; i < 200 && !rec.done; i++) llm_sched_step(s);
    CHECK(rec.done);
    CHECK(rec.finish[0] == LLM_STOP_CONTEXT || rec.finish[0] == LLM_STOP_EOG);
    CHECK_EQ_INT(rec.events_after_done, 0);
    /* the queue limit */
    llm_sched_free(s);
    llm_sched_params sp = llm_sched_default_params();
    sp.max_waiting = 2;
    CHECK_EQ_INT(llm_sched_create(c, &sp, &s), KV_OK);
    record q[3];
    memset(q, 0, sizeof q);
    for (int i = 0; i < 3; i++) {
        llm_sched_request ri = request(p, 5, 3, &q[i]);
        CHECK_EQ_INT(llm_sched_submit(s, &ri, NULL, err, sizeof err), i < 2 ? 0 : LLM_ERR_QUEUE_FULL);
    }
    llm_sched_free(s);   /* ends the queued ones: each gets its done event */
    CHECK(q[0].done && q[1].done && !q[2].done);
    CHECK(q[0].finish[0] == LLM_STOP_CANCEL);
    CHECK_EQ_INT(kv_cache_get_stats(llm_context_cache(c)).pages_used, 0);
    llm_context_free(c);
    llm_model_free(m);
    fx_free(&fx);
}

TEST(sched_cancel_frees_pages_on_the_next_step) {
    fx_model fx;
    llm_model *m;
    if (setup(&fx, &m, GW_F16, 23)) return;
    llm_context *c = make_ctx(m, 4, 0, 32);
    llm_sched *s = NULL;
    CHECK_EQ_INT(llm_sched_create(c, NULL, &s), KV_OK);
    int32_t p[20];
    test_rng g = {9};
    random_prompt(&g, p, 20);
    record a = {0}, b = {0};
    uint64_t ida, idb;
    llm_sched_request ra = request(p, 20, 60, &a), rb = request(p, 12, 60, &b);
    CHECK_EQ_INT(llm_sched_submit(s, &ra, &ida, NULL, 0), 0);
    CHECK_EQ_INT(llm_sched_submit(s, &rb, &idb, NULL, 0), 0);
    for (int i = 0; i < 4; i++) llm_sched_step(s);
    CHECK(kv_cache_get_stats(llm_context_cache(c)).pages_used > 0);
    llm_sched_cancel(s, ida);
    llm_sched_cancel(s, idb);
    llm_sched_cancel(s, 12345);   /* unknown: ignored */
    llm_sched_step(s);
    CHECK(a.done && b.done);
    CHECK(a.finish[0] == LLM_STOP_CANCEL && b.finish[0] == LLM_STOP_CANCEL);
    kv_cache_stats cs = kv_cache_get_stats(llm_context_cache(c));
    CHECK_EQ_INT(cs.pages_used, 0);
    CHECK_EQ_INT(cs.seqs, 0);
    llm_sched_stats st = llm_sched_get_stats(s);
    CHECK_EQ_INT(st.running, 0);
    CHECK_EQ_INT(st.pages_used, 0);
    llm_sched_free(s);
    llm_context_free(c);
    llm_model_free(m);
    fx_free(&fx);
}

/* Non-finite logits (a NaN in the final norm makes every logit NaN) end a
 * request in the scheduler as they end llm_session_generate: an error with
 * LLM_ERR_NONFINITE that says the logits were not finite, no token sampled,
 * and its pages back in the pool. Both loops run engine/gen/choice.c. */
TEST(sched_and_session_stop_alike_on_non_finite_logits) {
    fx_model fx;
    if (fx_build(&(fx_spec){.type = GW_F32, .seed = 3, .nan_norm = "output_norm.weight"}, &fx)) return;
    llm_model *m = fx_load(&fx);
    if (!m) { fx_free(&fx); return; }
    llm_context *c = make_ctx(m, 2, 0, 32);
    int32_t p[10];
    test_rng g = {5};
    random_prompt(&g, p, 10);
    llm_session *ss;
    CHECK_EQ_INT(llm_session_create(c, &ss), LLM_OK);
    llm_gen_params gp = llm_gen_default_params();
    gp.max_tokens = 8, gp.sampler.temp = 0;
    llm_gen_result res;
    CHECK_EQ_INT(llm_session_generate(ss, p, 10, &gp, &res), LLM_ERR_NONFINITE);
    CHECK_EQ_INT(res.n_generated, 0);
    llm_session_free(ss);
    llm_sched *s;
    CHECK_EQ_INT(llm_sched_create(c, NULL, &s), LLM_OK);
    record a = {0};
    llm_sched_request ra = request(p, 10, 8, &a);
    CHECK_EQ_INT(llm_sched_submit(s, &ra, NULL, NULL, 0), 0);
    for (int i = 0; i < 4 && !a.done; i++) llm_sched_step(s);
    CHECK(a.done);
    CHECK_EQ_INT(a.finish[0], LLM_STOP_ERROR);
    CHECK_EQ_INT(a.status, LLM_ERR_NONFINITE);
    CHECK_EQ_INT(a.n[0], 0);
    CHECK_EQ_INT(a.usage_generated, 0);
    if (!strstr(a.error, "not finite") || !strstr(res.message, "not finite"))
        test_fail(__FILE__, __LINE__, "messages: scheduler '%s', session '%s'", a.error, res.message);
    CHECK_EQ_INT(kv_cache_get_stats(llm_context_cache(c)).pages_used, 0);
    llm_sched_free(s);
    llm_context_free(c);
    llm_model_free(m);
    fx_free(&fx);
}

/* A request's done event (which ends its HTTP response in the server) comes
 * after the counters count its ending: whoever reads them then sees its
 * pages back and its tokens counted, not the step before. */
TEST(sched_counters_count_a_request_by_the_time_its_done_event_comes) {
    fx_model fx;
    llm_model *m;
    if (setup(&fx, &m, GW_F16, 24)) return;
    llm_context *c = make_ctx(m, 2, 0, 32);
    llm_sched *s = NULL;
    CHECK_EQ_INT(llm_sched_create(c, NULL, &s), KV_OK);
    int32_t p[16];
    test_rng g = {10};
    random_prompt(&g, p, 16);
    record a = {.sched = s};
    llm_sched_request ra = request(p, 16, 6, &a);
    uint64_t id;
    CHECK_EQ_INT(llm_sched_submit(s, &ra, &id, NULL, 0), 0);
    for (int i = 0; i < 40 && !a.done; i++) llm_sched_step(s);
    CHECK(a.done);
    CHECK_EQ_INT(a.at_done.running, 0);
    CHECK_EQ_INT(a.at_done.pages_used, 0);
    CHECK(a.at_done.generation_tokens == (uint64_t)a.n[0]);
    llm_sched_free(s);
    llm_context_free(c);
    llm_model_free(m);
    fx_free(&fx);
}

TEST(sched_n_choices_fork_one_prefill_and_match_seeded_solo_runs) {
    fx_model fx;
    llm_model *m;
    if (setup(&fx, &m, GW_Q4_0, 24)) return;
    llm_context *c = make_ctx(m, 4, 0, 64), *ref = make_ctx(m, 1, 0, 64);
    llm_sched *s = NULL;
    CHECK_EQ_INT(llm_sched_create(c, NULL, &s), KV_OK);
    int32_t p[30];
    test_rng g = {11};
    random_prompt(&g, p, 30);
    record rec = {0};
    llm_sched_request r = request(p, 30, 12, &rec);
    r.n_choices = 3, r.sampler = llm_sampler_default_params(), r.sampler.temp = 1.0f, r.sampler.seed = 40;
    r.top_logprobs = 3;
    CHECK_EQ_INT(llm_sched_submit(s, &r, NULL, NULL, 0), 0);
    llm_sched_step(s);
    /* one prefill: the prompt was computed once, and the forks share its pages */
    CHECK_EQ_INT(llm_sched_get_stats(s).rows, 30);
    CHECK(kv_cache_get_stats(llm_context_cache(c)).pages_shared > 0);
    for (int i = 0; i < 100 && !rec.done; i++) llm_sched_step(s);
    CHECK(rec.done);
    CHECK_EQ_INT(rec.n_finish, 3);
    int differ = 0;
    for (int k = 0; k < 3; k++) {
        llm_sampler_params sp = r.sampler;
        sp.seed += (uint64_t)k;
        int32_t want[MAX_OUT];
        double lp0 = 0;
        int32_t n = solo(ref, p, 30, 12, &sp, want, &lp0);
        CHECK_EQ_INT(rec.n[k], n);
        CHECK(!memcmp(rec.tokens[k], want, sizeof(int32_t) * (size_t)n));
        if (k == 0 && n > 0) CHECK_NEAR(rec.logprob[0], lp0, 1e-4);
        if (k > 0 && memcmp(rec.tokens[k], rec.tokens[0], sizeof(int32_t) * (size_t)n)) differ = 1;
    }
    CHECK(differ);   /* the seeds differ, so do (some of) the choices */
    CHECK_EQ_INT(rec.usage_generated, rec.n[0] + rec.n[1] + rec.n[2]);
    CHECK_EQ_INT(kv_cache_get_stats(llm_context_cache(c)).pages_used, 0);
    llm_sched_free(s);
    llm_context_free(c), llm_context_free(ref);
    llm_model_free(m);
    fx_free(&fx);
}

TEST(sched_logprobs_are_the_log_softmax_and_sorted) {
    fx_model fx;
    llm_model *m;
    if (setup(&fx, &m, GW_F32, 25)) return;
    llm_context *c = make_ctx(m, 2, 0, 64), *ref = make_ctx(m, 1, 0, 64);
    llm_sched *s = NULL;
    CHECK_EQ_INT(llm_sched_create(c, NULL, &s), KV_OK);
    int32_t p[10];
    test_rng g = {13};
    random_prompt(&g, p, 10);
    record rec = {0};
    llm_sched_request r = request(p, 10, 6, &rec);
    r.top_logprobs = 5;
    CHECK_EQ_INT(llm_sched_submit(s, &r, NULL, NULL, 0), 0);
    for (int i = 0; i < 50 && !rec.done; i++) llm_sched_step(s);
    llm_sampler_params greedy = llm_sampler_default_params();
    greedy.temp = 0;
    int32_t want[MAX_OUT];
    double lp0 = 0;
    int32_t n = solo(ref, p, 10, 6, &greedy, want, &lp0);
    CHECK(n > 0 && rec.n[0] == n);
    CHECK_NEAR(rec.logprob[0], lp0, 1e-4);
    for (int32_t k = 0; k < rec.n[0]; k++) {
        CHECK(rec.logprob[k] <= 0);
        CHECK_EQ_INT(rec.top0[k], rec.tokens[0][k]);   /* greedy: the best alternative is the token */
    }
    llm_sched_free(s);
    llm_context_free(c), llm_context_free(ref);
    llm_model_free(m);
    fx_free(&fx);
}

/* Every engine code, the scheduler's refusals included, has its own sentence,
 * and none falls through to the library's "unknown status". */
TEST(scheduler_every_engine_status_has_its_own_message) {
    static const int codes[] = {LLM_ERR_TOKEN, LLM_ERR_PARAM, LLM_ERR_MODEL, LLM_ERR_NONFINITE,
                                LLM_ERR_QUEUE_FULL, LLM_ERR_TOO_LARGE, LLM_ERR_STOPPED};
    enum { N = sizeof codes / sizeof codes[0] };
    for (int i = 0; i < N; i++) {
        const char *s = llm_status_str(codes[i]);
        CHECK(s && *s && strcmp(s, kv_status_str(codes[i])) != 0);
        for (int j = 0; j < i; j++) CHECK(strcmp(s, llm_status_str(codes[j])) != 0);
    }
    CHECK(strstr(llm_status_str(LLM_ERR_QUEUE_FULL), "later") != NULL);
}

/* Eight conversations over one shared 28-token system prompt, on Llama and
 * on Gemma 3 (a full and a window cache group): the first turns arrive
 * together, then each sends its history and a new line. Every reply equals a
 * solo run of the same prompt. The first turns compute the shared pages
 * once: one is prefilled while the others wait for it (prefill_waits), so
 * the rows run are far fewer than the prompt tokens; every later turn
 * resumes from its own history in both groups. */
static void conversations(const char *arch, uint64_t seed) {
    enum { CONV = 8, SYS = 28, OWN = 5, NEW = 3, OUT = 6 };
    fx_model fx;
    if (fx_build(&(fx_spec){.arch = arch, .type = GW_Q8_0, .seed = seed}, &fx)) return;
    llm_model *m;
    char err[256];
    if (llm_model_load(fx.path, &m, err, sizeof err) != 0) {
        test_fail(__FILE__, __LINE__, "load: %s", err);
        return fx_free(&fx);
    }
    llm_context *c = make_ctx(m, CONV, 0, 32), *ref = make_ctx(m, 1, 0, 64);
    llm_sched_params sp = llm_sched_default_params();
    sp.batch_tokens = 32;
    llm_sched *s = NULL;
    CHECK_EQ_INT(llm_sched_create(c, &sp, &s), KV_OK);
    test_rng g = {seed};
    static int32_t p1[CONV][SYS + OWN], p2[CONV][SYS + OWN + OUT + NEW];
    static record r1[CONV], r2[CONV];
    memset(r1, 0, sizeof r1), memset(r2, 0, sizeof r2);
    random_prompt(&g, p1[0], SYS + OWN);
    for (int i = 0; i < CONV; i++) {
        memcpy(p1[i], p1[0], sizeof(int32_t) * SYS);
        for (int j = SYS; j < SYS + OWN; j++) p1[i][j] = test_rng_int(&g, FX_BYTE0, FX_VOCAB - 1);
        llm_sched_request r = request(p1[i], SYS + OWN, OUT, &r1[i]);
        CHECK_EQ_INT(llm_sched_submit(s, &r, NULL, NULL, 0), 0);
    }
    for (int k = 0; k < 200 && llm_sched_step(s) > 0; k++) {}
    llm_sched_stats st1 = llm_sched_get_stats(s);
    int32_t n2[CONV];
    for (int i = 0; i < CONV; i++) {
        CHECK(r1[i].done);
        memcpy(p2[i], p1[i], sizeof(int32_t) * (SYS + OWN));
        memcpy(p2[i] + SYS + OWN, r1[i].tokens[0], sizeof(int32_t) * (size_t)r1[i].n[0]);
        n2[i] = SYS + OWN + r1[i].n[0];
        for (int j = 0; j < NEW; j++) p2[i][n2[i]++] = test_rng_int(&g, FX_BYTE0, FX_VOCAB - 1);
        llm_sched_request r = request(p2[i], n2[i], OUT, &r2[i]);
        CHECK_EQ_INT(llm_sched_submit(s, &r, NULL, NULL, 0), 0);
    }
    for (int k = 0; k < 200 && llm_sched_step(s) > 0; k++) {}
    llm_sched_stats st2 = llm_sched_get_stats(s);
    printf("     %s: first turns %llu rows for %d prompt tokens, %llu waited for a prefill; later turns %llu rows"
           " for %d prompt tokens\n", arch, (unsigned long long)st1.rows, CONV * (SYS + OWN),
           (unsigned long long)st1.prefill_waits, (unsigned long long)(st2.rows - st1.rows), (int)(n2[0] * CONV));
    CHECK(st1.prefill_waits >= CONV - 1);
    CHECK(st1.rows < (uint64_t)(SYS + CONV * (OWN + 4 + OUT)));   /* the system prompt once (whole pages shared) */
    for (int i = 0; i < CONV; i++) {
        llm_sampler_params greedy = llm_sampler_default_params();
        greedy.temp = 0;
        int32_t want[MAX_OUT];
        int32_t n = solo(ref, p1[i], SYS + OWN, OUT, &greedy, want, NULL);
        if (r1[i].n[0] != n || memcmp(r1[i].tokens[0], want, sizeof(int32_t) * (size_t)n))
            test_fail(__FILE__, __LINE__, "%s first turn %d differs from its solo run", arch, i);
        n = solo(ref, p2[i], n2[i], OUT, &greedy, want, NULL);
        if (r2[i].n[0] != n || memcmp(r2[i].tokens[0], want, sizeof(int32_t) * (size_t)n))
            test_fail(__FILE__, __LINE__, "%s later turn %d differs from its solo run", arch, i);
        /* resumed from its own first turn: all its full pages but the last token's */
        CHECK(r2[i].usage_cached >= (SYS + OWN + r1[i].n[0] - 1) / PAGE * PAGE - PAGE);
    }
    CHECK_EQ_INT(llm_context_stats(c).pages_used, 0);
    llm_sched_free(s);
    llm_context_free(c), llm_context_free(ref);
    llm_model_free(m);
    fx_free(&fx);
}

TEST(sched_conversations_share_a_prefix_in_flight_and_resume_their_history_llama) { conversations("llama", 31); }
TEST(sched_conversations_share_a_prefix_in_flight_and_resume_their_history_gemma3) { conversations("gemma3", 32); }
