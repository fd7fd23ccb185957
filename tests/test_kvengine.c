/* tests/test_kvengine.c - the public engine API (include/kvengine.h) on a
 * tiny random-weight model: greedy tokens of a request equal a plain decode
 * loop written here (llm_eval + llm_argmax on a context of its own), the
 * callback and polling see the same output, several requests at once each
 * get their own, and every refusal names what is wrong and queues nothing.
 * kve_submit_ex: n choices each equal the plain loop, a banned token gives
 * way to the plain logits' next best, grammar and tool-call replies are
 * documents of their grammar, the counters count what was submitted.
 * Under the sanitizer runs this is the API's memory and thread check. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test.h"
#include "test_model_fixture.h"
#include "gguf_writer.h"
#include "kvengine.h"
#include "../engine/model/model.h"
#include "../engine/gen/sampler.h"
#include "../engine/text/tokenizer.h"

enum { N_GEN = 12 };

/* Greedy tokens after prompt [n], until end of generation or max. */
/* The fixture loaded with a context of one new sequence (*seq) for the
 * plain loops below, and a buffer for one row of logits; NULL on failure. */
static float *plain_open(const fx_model *fx, llm_model **m, llm_context **c, int32_t *seq) {
    if (!(*m = fx_load(fx))) return NULL;
    llm_context_params p = llm_context_default_params();
    p.n_ctx = 128, p.kv_type = KV_F16, p.n_threads = 1;
    *c = fx_context(*m, &p);
    llm_seq_new(*c, seq);
    return malloc(sizeof(float) * (size_t)llm_model_n_vocab(*m));
}

static int32_t plain_greedy(const fx_model *fx, const int32_t *prompt, int32_t n, int32_t max, int32_t *out) {
    llm_model *m;
    llm_context *c;
    int32_t seq, k = 0;
    float *lg = plain_open(fx, &m, &c, &seq);
    if (!lg) return -1;
    const int32_t V = llm_model_n_vocab(m);
    int rc = llm_eval(c, seq, prompt, n, 0, lg, NULL, NULL);
    while (rc == LLM_OK && k < max) {
        int32_t t = llm_argmax(lg, V);
        if (llm_token_is_eog(llm_model_tokenizer(m), t)) break;
        out[k++] = t;
        rc = llm_eval(c, seq, &t, 1, 0, lg, NULL, NULL);
    }
    free(lg);
    llm_context_free(c);
    llm_model_free(m);
    return k;
}

typedef struct {
    int32_t tokens[64];
    int32_t n, n_stop;
    kve_stop_reason stop;
    size_t text_len;
} seen;

static void on_event(void *user, const kve_event *ev) {
    seen *s = user;
    if (ev->token >= 0 && s->n < 64) s->tokens[s->n++] = ev->token;
    s->text_len += ev->text_len;
    if (ev->stop != KVE_STOP_NONE) s->stop = ev->stop, s->n_stop++;
}

/* Polls r to its end: tokens into out, the last output in *o. */
static int32_t drain(kve_request *r, int32_t *out, int32_t cap, kve_output *o, size_t *text_len) {
    int32_t n = 0;
    *text_len = 0;
    for (;;) {
        int rc = kve_request_poll(r, 10000, o);
        if (rc != KVE_OK) {
            test_fail(__FILE__, __LINE__, "poll: %s", kve_status_str(rc));
            return n;
        }
        for (int32_t i = 0; i < o->n_tokens && n < cap; i++) out[n++] = o->tokens[i];
        *text_len += o->text_len;
        if (o->stop != KVE_STOP_NONE) return n;
    }
}

/* The tiny Q8_0 model every test here runs, written and loaded */
static int load_fixture(fx_model *fx, kve_model **m) {
    if (fx_build(&(fx_spec){.type = GW_Q8_0, .seed = 41}, fx)) return -1;
    char err[256];
    if (kve_model_load(fx->path, m, err, sizeof err) != KVE_OK) {
        test_fail(__FILE__, __LINE__, "load: %s", err);
        fx_free(fx);
        return -1;
    }
    return 0;
}

static int open_engine(fx_model *fx, kve_model **m, kve_context **c, int32_t n_seqs) {
    if (load_fixture(fx, m)) return -1;
    char err[256];
    kve_context_params cp = kve_context_default_params();
    cp.n_ctx = 128, cp.n_seqs = n_seqs, cp.n_threads = 1;
    if (kve_context_create(*m, &cp, c, err, sizeof err) != KVE_OK) {
        test_fail(__FILE__, __LINE__, "context: %s", err);
        kve_model_free(*m);
        fx_free(fx);
        return -1;
    }
    return 0;
}

TEST(kvengine_greedy_requests_equal_a_plain_decode_loop_alone_and_together) {
    fx_model fx;
    kve_model *m;
    kve_context *c;
    if (open_engine(&fx, &m, &c, 4)) return;
    enum { NR = 4 };
    int32_t prompts[NR][8], want[NR][N_GEN], n_want[NR];
    test_rng g = {77};
    for (int q = 0; q < NR; q++) {
        prompts[q][0] = 1;
        for (int i = 1; i < 8; i++) prompts[q][i] = test_rng_int(&g, FX_BYTE0, FX_VOCAB - 1);
        n_want[q] = plain_greedy(&fx, prompts[q], 8, N_GEN, want[q]);
    }
    kve_request *r[NR];
    seen cb[NR];
    memset(cb, 0, sizeof cb);
    for (int q = 0; q < NR; q++) {   /* all submitted before any is read: they share steps */
        kve_request_params p = kve_request_default_params();
        p.tokens = prompts[q], p.n_tokens = 8, p.temperature = 0, p.max_tokens = N_GEN;
        p.on_event = on_event, p.user = &cb[q], p.top_logprobs = 2;
        CHECK_EQ_INT(kve_submit(c, &p, &r[q], NULL, 0), KVE_OK);
    }
    for (int q = 0; q < NR; q++) {
        int32_t got[64];
        kve_output o;
        size_t text_len;
        int32_t n = drain(r[q], got, 64, &o, &text_len);
        CHECK_EQ_INT(n, n_want[q]);
        for (int32_t i = 0; i < n && i < n_want[q]; i++)
            if (got[i] != want[q][i]) {
                test_fail(__FILE__, __LINE__, "request %d token %d: %d, the plain loop %d", q, (int)i, (int)got[i],
                          (int)want[q][i]);
                break;
            }
        CHECK(o.stop == (n < N_GEN ? KVE_STOP_EOG : KVE_STOP_LENGTH));
        CHECK_EQ_INT(o.n_generated, n);
        CHECK_EQ_INT(o.n_prompt, 8);
        CHECK(!strcmp(o.error, ""));
        kve_request_free(r[q]);   /* after the last event: the callback saw everything */
        CHECK_EQ_INT(cb[q].n, n);
        CHECK(!memcmp(cb[q].tokens, got, sizeof(int32_t) * (size_t)n));
        CHECK_EQ_INT(cb[q].n_stop, 1);
        CHECK(cb[q].stop == o.stop);
        CHECK(cb[q].text_len == text_len);
    }
    kve_context_free(c);
    kve_model_free(m);
    fx_free(&fx);
}

TEST(kvengine_refusals_name_the_problem_and_queue_nothing) {
    fx_model fx;
    kve_model *m;
    kve_context *c;
    if (open_engine(&fx, &m, &c, 2)) return;
    char err[256];
    kve_request *r = (kve_request *)&err;   /* must come back NULL */
    int32_t toks[3] = {1, 5, 6}, bad[2] = {1, FX_VOCAB + 3};
    kve_request_params p = kve_request_default_params();
    CHECK_EQ_INT(kve_submit(c, &p, &r, err, sizeof err), KVE_ERR_PARAM);   /* no prompt */
    CHECK(r == NULL && strstr(err, "exactly one") != NULL);
    p.prompt = "hello", p.tokens = toks, p.n_tokens = 3;
    CHECK_EQ_INT(kve_submit(c, &p, &r, err, sizeof err), KVE_ERR_PARAM);   /* two prompts */
    p.prompt = NULL, p.tokens = bad, p.n_tokens = 2;
    CHECK_EQ_INT(kve_submit(c, &p, &r, err, sizeof err), KVE_ERR_TOKEN);
    CHECK(strstr(err, "outside the vocabulary") != NULL);
    p.tokens = toks, p.n_tokens = 3, p.max_tokens = 0;
    CHECK_EQ_INT(kve_submit(c, &p, &r, err, sizeof err), KVE_ERR_PARAM);
    CHECK(strstr(err, "max_tokens") != NULL);
    p.max_tokens = 4, p.top_p = 0;
    CHECK_EQ_INT(kve_submit(c, &p, &r, err, sizeof err), KVE_ERR_PARAM);
    CHECK(strstr(err, "sampling") != NULL);
    p.top_p = 1;
    const char *empty[] = {""};
    p.stops = empty, p.n_stops = 1;
    CHECK_EQ_INT(kve_submit(c, &p, &r, err, sizeof err), KVE_ERR_PARAM);
    CHECK(strstr(err, "stop") != NULL);
    p.stops = NULL, p.n_stops = 0;
    int32_t longp[200];
    for (int i = 0; i < 200; i++) longp[i] = FX_BYTE0 + i % 200;
    p.tokens = longp, p.n_tokens = 200;
    CHECK_EQ_INT(kve_submit(c, &p, &r, err, sizeof err), KVE_ERR_TOO_LARGE);
    p.tokens = toks, p.n_tokens = 3;
    p.enable_thinking = 0;   /* the chat template's switch: not for token ids */
    CHECK_EQ_INT(kve_submit(c, &p, &r, err, sizeof err), KVE_ERR_PARAM);
    CHECK(strstr(err, "enable_thinking goes with messages") != NULL);
    p.enable_thinking = -1;
    if (!kve_model_has_chat_template(m)) {
        kve_chat_message msg = {"user", "hi"};
        p.tokens = NULL, p.n_tokens = 0, p.messages = &msg, p.n_messages = 1;
        CHECK_EQ_INT(kve_submit(c, &p, &r, err, sizeof err), KVE_ERR_TEMPLATE);
        size_t len;
        CHECK_EQ_INT(kve_chat_apply(m, &msg, 1, 1, NULL, 0, &len), KVE_ERR_TEMPLATE);
    }
    CHECK(r == NULL);
    /* the room rule: the size always, the text only when it fits */
    int32_t ids[8], n_ids;
    CHECK_EQ_INT(kve_tokenize(m, "the", 3, 0, 0, NULL, 0, &n_ids), KVE_ERR_SPACE);
    CHECK(n_ids >= 1 && n_ids <= 3);
    CHECK_EQ_INT(kve_tokenize(m, "the", 3, 0, 0, ids, 8, &n_ids), KVE_OK);
    char text[8] = "xxxxxxx";
    size_t len;
    CHECK_EQ_INT(kve_detokenize(m, ids, n_ids, 0, text, 2, &len), KVE_ERR_SPACE);
    CHECK(len == 3 && text[0] == 'x');
    CHECK_EQ_INT(kve_detokenize(m, ids, n_ids, 0, text, sizeof text, &len), KVE_OK);
    CHECK(!strcmp(text, "the"));
    CHECK_EQ_INT(kve_detokenize(m, bad, 2, 0, text, sizeof text, &len), KVE_ERR_TOKEN);
    CHECK(strstr(kve_status_str(KVE_ERR_SPACE), "too small") != NULL);
    /* a cancelled request ends so; a zero-timeout poll then gives nothing new */
    p = kve_request_default_params();
    p.tokens = toks, p.n_tokens = 3, p.max_tokens = -1;
    CHECK_EQ_INT(kve_submit(c, &p, &r, err, sizeof err), KVE_OK);
    kve_request_cancel(r);
    kve_output o;
    int32_t got[64];
    size_t tl;
    drain(r, got, 64, &o, &tl);
    CHECK(o.stop == KVE_STOP_CANCEL || o.stop == KVE_STOP_EOG);
    CHECK_EQ_INT(kve_request_poll(r, 0, &o), KVE_OK);
    CHECK(o.n_tokens == 0 && o.text_len == 0);
    kve_request_free(r);
    /* freeing the context ends a request still running; it stays readable */
    p.max_tokens = 100;
    CHECK_EQ_INT(kve_submit(c, &p, &r, err, sizeof err), KVE_OK);
    kve_context_free(c);
    drain(r, got, 64, &o, &tl);
    CHECK(o.stop != KVE_STOP_NONE);
    kve_request_free(r);
    kve_model_free(m);
    fx_free(&fx);
}

/* ---------------------------------------------------------------- sessions */

static int open_session(fx_model *fx, kve_model **m, kve_session **s) {
    if (load_fixture(fx, m)) return -1;
    char err[256];
    kve_session_params sp = kve_session_default_params();
    sp.n_ctx = 128, sp.n_threads = 1;
    if (kve_session_create(*m, &sp, s, err, sizeof err) != KVE_OK) {
        test_fail(__FILE__, __LINE__, "session: %s", err);
        kve_model_free(*m);
        fx_free(fx);
        return -1;
    }
    return 0;
}

typedef struct {
    int32_t tokens[64];
    int32_t n;
} token_log;

static int log_token(void *user, int32_t token) {
    token_log *l = user;
    if (l->n < 64) l->tokens[l->n++] = token;
    return 0;
}

/* A session's turns each give the plain loop's greedy tokens over the whole
 * conversation, prefilling only what is new; a saved session restores. */
TEST(kvengine_session_turns_equal_a_plain_decode_loop_and_reuse_the_cache) {
    fx_model fx;
    kve_model *m;
    kve_session *s;
    if (open_session(&fx, &m, &s)) return;
    int32_t conv[128], n_conv = 8, want[N_GEN];
    test_rng g = {99};
    conv[0] = 1;
    for (int i = 1; i < 8; i++) conv[i] = test_rng_int(&g, FX_BYTE0, FX_VOCAB - 1);
    kve_generate_params gp = kve_generate_default_params();
    gp.temperature = 0, gp.max_tokens = N_GEN, gp.on_token = log_token;
    for (int turn = 0; turn < 2; turn++) {
        int32_t n_want = plain_greedy(&fx, conv, n_conv, N_GEN, want);
        token_log log = {.n = 0};
        gp.user = &log;
        kve_generate_result res;
        int32_t held, cached = kve_session_n_cached(s);
        CHECK_EQ_INT(kve_session_generate(s, conv, n_conv, &gp, &res), KVE_OK);
        CHECK_EQ_INT(res.n_prompt, n_conv);
        CHECK_EQ_INT(res.n_reused, cached);   /* what the cache held is not prefilled again */
        CHECK(turn == 0 || cached >= n_conv - 4);
        CHECK_EQ_INT(res.n_generated, n_want);
        CHECK_EQ_INT(log.n, n_want);
        CHECK(!memcmp(log.tokens, want, sizeof(int32_t) * (size_t)(log.n < n_want ? log.n : n_want)));
        CHECK(res.stop == (n_want < N_GEN ? KVE_STOP_EOG : KVE_STOP_LENGTH));
        const int32_t *t = kve_session_tokens(s, &held);
        CHECK_EQ_INT(held, n_conv + res.n_generated);
        /* the next turn: what the session holds and three more tokens */
        memcpy(conv, t, sizeof(int32_t) * (size_t)held);
        n_conv = held;
        for (int i = 0; i < 3; i++) conv[n_conv++] = FX_BYTE0 + 7 * i + turn;
    }
    /* save, then restore into a fresh session: all but the last prompt token come from the file */
    char path[300], err[256];
    snprintf(path, sizeof path, "%s.session", fx.path);
    int32_t held;
    kve_session_tokens(s, &held);   /* the three new tokens after what it holds */
    CHECK_EQ_INT(kve_session_feed(s, conv + held, n_conv - held), KVE_OK);
    CHECK_EQ_INT(kve_session_n_cached(s), n_conv);
    CHECK_EQ_INT(kve_session_save(s, path, err, sizeof err), KVE_OK);
    kve_session_reset(s);
    int32_t n0;
    kve_session_tokens(s, &n0);
    CHECK_EQ_INT(n0, 0);
    int32_t restored;
    CHECK_EQ_INT(kve_session_load(s, path, conv, n_conv, &restored, err, sizeof err), KVE_OK);
    CHECK_EQ_INT(restored, n_conv - 1);
    int32_t n_want = plain_greedy(&fx, conv, n_conv, N_GEN, want);
    token_log log = {.n = 0};
    gp.user = &log;
    kve_generate_result res;
    CHECK_EQ_INT(kve_session_generate(s, conv, n_conv, &gp, &res), KVE_OK);
    CHECK_EQ_INT(res.n_reused, n_conv - 1);
    CHECK_EQ_INT(log.n, n_want);
    CHECK(!memcmp(log.tokens, want, sizeof(int32_t) * (size_t)(log.n < n_want ? log.n : n_want)));
    /* a shift drops at least what is asked after the kept positions */
    int32_t before = kve_session_n_cached(s), dropped;
    CHECK_EQ_INT(kve_session_shift(s, 4, before - 4, &dropped), KVE_OK);
    CHECK_EQ_INT(dropped, before - 4);
    CHECK_EQ_INT(kve_session_n_cached(s), 4);
    remove(path);
    kve_session_free(s);
    kve_model_free(m);
    fx_free(&fx);
}

TEST(kvengine_session_refusals_name_the_problem_and_change_nothing) {
    fx_model fx;
    kve_model *m;
    kve_session *s;
    if (open_session(&fx, &m, &s)) return;
    char err[256];
    kve_session *bad_s = (kve_session *)&err;   /* must come back NULL */
    kve_session_params sp = kve_session_default_params();
    sp.n_batch = 0;
    CHECK_EQ_INT(kve_session_create(m, &sp, &bad_s, err, sizeof err), KVE_ERR_PARAM);
    CHECK(bad_s == NULL && strstr(err, "batch") != NULL);
    sp = kve_session_default_params();
    sp.act_bits = 5;
    CHECK_EQ_INT(kve_session_create(m, &sp, &bad_s, err, sizeof err), KVE_ERR_PARAM);
    CHECK(strstr(err, "activation") != NULL);
    CHECK(kve_session_get_params(s).n_ctx == 128 && kve_session_get_params(s).n_threads == 1);
    /* a first turn to hold something */
    int32_t toks[6] = {1, FX_BYTE0 + 3, FX_BYTE0 + 9, FX_BYTE0 + 4, FX_BYTE0 + 1, FX_BYTE0 + 5};
    kve_generate_params gp = kve_generate_default_params();
    gp.temperature = 0, gp.max_tokens = 4;
    kve_generate_result res;
    CHECK_EQ_INT(kve_session_generate(s, toks, 6, &gp, &res), KVE_OK);
    int32_t held, held2;
    kve_session_tokens(s, &held);
    int32_t cached = kve_session_n_cached(s);
    gp.top_p = 0;   /* bad sampling */
    CHECK_EQ_INT(kve_session_generate(s, toks, 6, &gp, &res), KVE_ERR_PARAM);
    CHECK_EQ_INT(res.status, KVE_ERR_PARAM);
    gp.top_p = 1;
    int32_t badtok[2] = {1, FX_VOCAB + 2};
    CHECK_EQ_INT(kve_session_generate(s, badtok, 2, &gp, &res), KVE_ERR_TOKEN);
    int32_t longp[200];
    for (int i = 0; i < 200; i++) longp[i] = FX_BYTE0 + i % 50;
    CHECK_EQ_INT(kve_session_generate(s, longp, 200, &gp, &res), KV_ERR_CAPACITY);
    CHECK(res.stop == KVE_STOP_CONTEXT && res.message[0]);
    CHECK_EQ_INT(kve_session_feed(s, badtok, 2), KVE_ERR_TOKEN);
    int32_t dropped = 7;
    CHECK_EQ_INT(kve_session_shift(s, cached + 1, 0, &dropped), KVE_ERR_PARAM);
    CHECK_EQ_INT(kve_session_shift(s, 4, cached, &dropped), KVE_ERR_PARAM);
    CHECK_EQ_INT(dropped, 0);
    kve_session_tokens(s, &held2);
    CHECK_EQ_INT(held2, held);   /* every refusal left the conversation as it was */
    CHECK_EQ_INT(kve_session_n_cached(s), cached);
    /* session files: a missing one or garbage is refused, the session empty and usable */
    int32_t restored = 9;
    CHECK_EQ_INT(kve_session_load(s, "/nonexistent/kvcache.session", toks, 6, &restored, err, sizeof err),
                 KV_ERR_IO);
    CHECK(restored == 0 && err[0]);
    CHECK_EQ_INT(kve_session_n_cached(s), 0);
    CHECK_EQ_INT(kve_session_save(s, "/nonexistent/dir/x.session", err, sizeof err), KV_ERR_IO);
    CHECK_EQ_INT(kve_session_generate(s, toks, 6, &gp, &res), KVE_OK);
    /* cache groups: one here */
    int32_t nl, w;
    kv_cache_stats st;
    CHECK_EQ_INT(kve_session_cache_group(s, 0, &nl, &w, &st), KVE_OK);
    CHECK(nl >= 1 && w == 0 && st.bytes_in_use > 0);
    CHECK(kve_session_cache_stats(s).bytes_in_use == st.bytes_in_use);
    CHECK_EQ_INT(kve_session_cache_group(s, 1, &nl, &w, &st), KVE_ERR_PARAM);
    /* grammars, pieces, chat tokens */
    kve_grammar *gr = (kve_grammar *)&err;
    CHECK_EQ_INT(kve_grammar_parse(m, "root ::= = x", 12, 0, &gr, err, sizeof err), KVE_ERR_PARAM);
    CHECK(gr == NULL && strstr(err, "line 1") != NULL);
    CHECK_EQ_INT(kve_grammar_parse(m, "{\"type\": 5}", 11, 1, &gr, err, sizeof err), KVE_ERR_PARAM);
    CHECK_EQ_INT(kve_grammar_parse(m, "root ::= \"ab\"", 13, 0, &gr, err, sizeof err), KVE_OK);
    kve_grammar_free(gr);
    size_t plen = 5;
    CHECK(kve_token_piece(m, FX_VOCAB + 1, &plen) == NULL && plen == 0);
    CHECK(kve_token_piece(m, FX_BYTE0 + 65, &plen) != NULL && plen >= 1);
    kve_chat_message msg = {"user", "hi"};
    int32_t n_ids;
    if (!kve_model_has_chat_template(m)) {
        CHECK_EQ_INT(kve_chat_tokenize(m, &msg, 1, 0, 1, 1, -1, NULL, 0, &n_ids), KVE_ERR_TEMPLATE);
        CHECK(!strcmp(kve_chat_turn_end(m), ""));
    }
    CHECK_EQ_INT(kve_chat_tokenize(m, &msg, 1, 2, 1, 1, -1, NULL, 0, &n_ids), KVE_ERR_PARAM);
    kve_session_free(s);
    kve_model_free(m);
    fx_free(&fx);
}

/* ---------------------------------------------------------------- kve_submit_ex, options, stats */

/* The greedy first token after prompt [n] with token ban excluded (-1: none). */
static int32_t plain_first(const fx_model *fx, const int32_t *prompt, int32_t n, int32_t ban) {
    llm_model *m;
    llm_context *c;
    int32_t seq, t = -1;
    float *lg = plain_open(fx, &m, &c, &seq);
    if (!lg) return -1;
    const int32_t V = llm_model_n_vocab(m);
    if (llm_eval(c, seq, prompt, n, 0, lg, NULL, NULL) == LLM_OK) {
        if (ban >= 0) lg[ban] = -INFINITY;
        t = llm_argmax(lg, V);
    }
    free(lg);
    llm_context_free(c);
    llm_model_free(m);
    return t;
}

typedef struct {
    int32_t tokens[KVE_MAX_CHOICES][64];
    int32_t n[KVE_MAX_CHOICES], n_stop[KVE_MAX_CHOICES];
    char text[256];
    size_t text_len;
    int bad_choice;
} choices_seen;

static void on_choice(void *user, const kve_event *ev) {
    choices_seen *s = user;
    if (ev->choice < 0 || ev->choice >= KVE_MAX_CHOICES) {
        s->bad_choice = 1;
        return;
    }
    if (ev->token >= 0 && s->n[ev->choice] < 64) s->tokens[ev->choice][s->n[ev->choice]++] = ev->token;
    if (ev->choice == 0 && s->text_len + ev->text_len < sizeof s->text)
        memcpy(s->text + s->text_len, ev->text, ev->text_len), s->text_len += ev->text_len;
    if (ev->stop != KVE_STOP_NONE) s->n_stop[ev->choice]++;
}

/* Submits with options, callback only, and waits for the end. */
static int run_ex(kve_context *c, kve_request_params *p, const kve_request_options *o, choices_seen *cs,
                  kve_output *out) {
    memset(cs, 0, sizeof *cs);
    p->on_event = on_choice, p->user = cs;
    kve_request *r;
    char err[256];
    int rc = kve_submit_ex(c, p, o, &r, err, sizeof err);
    if (rc != KVE_OK) {
        test_fail(__FILE__, __LINE__, "submit_ex: %s", err);
        return rc;
    }
    for (;;) {
        rc = kve_request_poll(r, 10000, out);
        if (rc != KVE_OK || out->stop != KVE_STOP_NONE) break;
    }
    kve_output last = *out;
    kve_request_free(r);
    *out = last;
    out->text = NULL, out->tokens = NULL, out->error = NULL;
    return rc;
}

TEST(kvengine_submit_ex_choices_bias_and_grammars_match_independent_runs) {
    fx_model fx;
    kve_model *m;
    kve_context *c;
    if (open_engine(&fx, &m, &c, 4)) return;
    int32_t prompt[8] = {1};
    test_rng g = {91};
    for (int i = 1; i < 8; i++) prompt[i] = test_rng_int(&g, FX_BYTE0, FX_VOCAB - 1);
    int32_t want[N_GEN];
    int32_t n_want = plain_greedy(&fx, prompt, 8, N_GEN, want);
    kve_context_stats before = {.size = sizeof before};
    CHECK_EQ_INT(kve_context_get_stats(c, &before), KVE_OK);

    /* n choices, greedy: each is the solo greedy run; poll gives only the end */
    kve_request_params p = kve_request_default_params();
    p.tokens = prompt, p.n_tokens = 8, p.temperature = 0, p.max_tokens = N_GEN;
    kve_request_options o = kve_request_default_options();
    o.n_choices = 3;
    choices_seen cs;
    kve_output out;
    CHECK_EQ_INT(run_ex(c, &p, &o, &cs, &out), KVE_OK);
    CHECK(!cs.bad_choice);
    for (int k = 0; k < 3; k++) {
        CHECK_EQ_INT(cs.n[k], n_want);
        CHECK_EQ_INT(cs.n_stop[k], 1);
        CHECK(!memcmp(cs.tokens[k], want, sizeof(int32_t) * (size_t)(cs.n[k] < n_want ? cs.n[k] : n_want)));
    }
    CHECK_EQ_INT(out.n_tokens, 0);
    CHECK(out.stop == (n_want < N_GEN ? KVE_STOP_EOG : KVE_STOP_LENGTH));
    CHECK_EQ_INT(out.n_generated, 3 * n_want);

    /* a ban on the greedy token: the next best of the plain logits */
    kve_logit_bias ban = {want[0], -100};
    o = kve_request_default_options();
    o.logit_bias = &ban, o.n_logit_bias = 1;
    p.max_tokens = 1;
    CHECK_EQ_INT(run_ex(c, &p, &o, &cs, &out), KVE_OK);
    if (n_want > 0) {
        CHECK_EQ_INT(cs.n[0], 1);
        CHECK_EQ_INT(cs.tokens[0][0], plain_first(&fx, prompt, 8, want[0]));
        CHECK(cs.tokens[0][0] != want[0]);
    }

    /* a grammar: the reply is its one document, then end of turn */
    kve_grammar *gr;
    char err[256];
    CHECK_EQ_INT(kve_grammar_parse(m, "root ::= \"ab\" [0-9] \"c\"", 23, 0, &gr, err, sizeof err), KVE_OK);
    o = kve_request_default_options();
    o.grammar = gr;
    p.max_tokens = N_GEN;
    CHECK_EQ_INT(run_ex(c, &p, &o, &cs, &out), KVE_OK);
    CHECK(cs.text_len == 4 && !memcmp(cs.text, "ab", 2) && cs.text[2] >= '0' && cs.text[2] <= '9' && cs.text[3] == 'c');
    CHECK(out.stop == KVE_STOP_EOG);
    kve_grammar_free(gr);

    /* a tool-call grammar: the head, the call object with its schema's arguments, the tail */
    const char *names[1] = {"get_x"}, *schemas[1] = {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},"
                                                      "\"required\":[\"x\"],\"additionalProperties\":false}"};
    CHECK_EQ_INT(kve_grammar_tool_calls(m, 1, names, schemas, "<c>", "arguments", "</c>", &gr, err, sizeof err), KVE_OK);
    o.grammar = gr;
    p.max_tokens = 60;
    CHECK_EQ_INT(run_ex(c, &p, &o, &cs, &out), KVE_OK);
    const char *head = "<c>{\"name\": \"get_x\", \"arguments\": {";
    CHECK(cs.text_len > strlen(head) && !memcmp(cs.text, head, strlen(head)));
    if (out.stop == KVE_STOP_EOG) CHECK(cs.text_len >= 6 && !memcmp(cs.text + cs.text_len - 6, "}}</c>", 6));
    kve_grammar_free(gr);

    /* json_object mode: the reply is the start of an object (whitespace may lead) */
    o = kve_request_default_options();
    o.json_object = 1;
    p.max_tokens = 8;
    CHECK_EQ_INT(run_ex(c, &p, &o, &cs, &out), KVE_OK);
    size_t at = 0;
    while (at < cs.text_len && strchr(" \t\n\r", cs.text[at])) at++;
    if (cs.n[0] < 1 || (at < cs.text_len && cs.text[at] != '{'))
        test_fail(__FILE__, __LINE__, "json_object reply \"%.*s\" (%d tokens, stop %d)", (int)cs.text_len, cs.text,
                  (int)cs.n[0], (int)out.stop);

    /* the counters saw what was submitted: 5 requests of 8 prompt tokens, 7 choices */
    kve_context_stats st = {.size = sizeof st};
    CHECK_EQ_INT(kve_context_get_stats(c, &st), KVE_OK);
    CHECK_EQ_INT((int)(st.prompt_tokens - before.prompt_tokens), 5 * 8);
    CHECK(st.generation_tokens - before.generation_tokens >= (uint64_t)(3 * n_want + 1));
    CHECK(st.running == 0 && st.waiting == 0 && st.page_size == 16 && st.pages_total > 0 && !st.disk_on);
    CHECK(st.prefix_queries > before.prefix_queries);
    kve_context_free(c);
    kve_model_free(m);
    fx_free(&fx);
}

typedef struct {
    int stored;
} prefix_seen;

static void on_prefix(void *user, const kv_prefix_event *ev) {
    if (ev->kind == KV_PREFIX_STORED) ((prefix_seen *)user)->stored++;
}

TEST(kvengine_submit_ex_and_context_options_refuse_bad_input_and_change_nothing) {
    fx_model fx;
    kve_model *m;
    if (load_fixture(&fx, &m)) return;
    char err[256];
    kve_context *c = (kve_context *)&err;
    kve_context_params cp = kve_context_default_params();
    cp.n_ctx = 128, cp.n_seqs = 2, cp.n_threads = 1;
    kve_context_options co = kve_context_default_options();
    co.draft_lookup = KVE_MAX_DRAFT + 1;
    CHECK_EQ_INT(kve_context_create_ex(m, &cp, &co, &c, err, sizeof err), KVE_ERR_PARAM);
    CHECK(c == NULL && strstr(err, "draft_lookup") != NULL);
    co = kve_context_default_options();
    co.act_bits = 3;
    CHECK_EQ_INT(kve_context_create_ex(m, &cp, &co, &c, err, sizeof err), KVE_ERR_PARAM);
    CHECK(strstr(err, "act_bits") != NULL);
    co = kve_context_default_options();
    co.cache_dir = "";
    CHECK_EQ_INT(kve_context_create_ex(m, &cp, &co, &c, err, sizeof err), KVE_ERR_PARAM);
    CHECK(strstr(err, "cache_dir") != NULL);
    co = kve_context_default_options();
    co.size = sizeof co + 8;
    CHECK_EQ_INT(kve_context_create_ex(m, &cp, &co, &c, err, sizeof err), KVE_ERR_PARAM);
    CHECK(strstr(err, "size") != NULL && c == NULL);
    /* a listener sees the prompt's full pages named */
    prefix_seen ps = {0};
    co = kve_context_default_options();
    co.on_prefix = on_prefix, co.prefix_user = &ps;
    CHECK_EQ_INT(kve_context_create_ex(m, &cp, &co, &c, err, sizeof err), KVE_OK);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = FX_BYTE0 + 10 + i;
    kve_context_stats st0 = {.size = sizeof st0}, st1 = {.size = sizeof st1};
    CHECK_EQ_INT(kve_context_get_stats(c, &st0), KVE_OK);
    kve_request_params p = kve_request_default_params();
    p.tokens = prompt, p.n_tokens = 40, p.temperature = 0, p.max_tokens = 2;
    kve_request_options o = kve_request_default_options();
    kve_request *r = (kve_request *)&err;
    kve_logit_bias bias = {FX_VOCAB + 5, 1};
    o.n_choices = 0;
    CHECK_EQ_INT(kve_submit_ex(c, &p, &o, &r, err, sizeof err), KVE_ERR_PARAM);
    CHECK(r == NULL && strstr(err, "n_choices") != NULL);
    o.n_choices = KVE_MAX_CHOICES + 1;
    CHECK_EQ_INT(kve_submit_ex(c, &p, &o, &r, err, sizeof err), KVE_ERR_PARAM);
    o = kve_request_default_options();
    o.logit_bias = &bias, o.n_logit_bias = 1;
    CHECK_EQ_INT(kve_submit_ex(c, &p, &o, &r, err, sizeof err), KVE_ERR_TOKEN);
    CHECK(strstr(err, "logit_bias") != NULL && strstr(err, "outside the vocabulary") != NULL);
    bias.token = FX_BYTE0, bias.bias = 200;
    CHECK_EQ_INT(kve_submit_ex(c, &p, &o, &r, err, sizeof err), KVE_ERR_PARAM);
    CHECK(strstr(err, "[-100, 100]") != NULL);
    kve_grammar *gr;
    CHECK_EQ_INT(kve_grammar_parse(m, "root ::= \"a\"", 12, 0, &gr, err, sizeof err), KVE_OK);
    o = kve_request_default_options();
    o.grammar = gr, o.json_object = 1;
    CHECK_EQ_INT(kve_submit_ex(c, &p, &o, &r, err, sizeof err), KVE_ERR_PARAM);
    CHECK(strstr(err, "json_object") != NULL);
    o = kve_request_default_options();
    o.repeat_last_n = -2;
    CHECK_EQ_INT(kve_submit_ex(c, &p, &o, &r, err, sizeof err), KVE_ERR_PARAM);
    CHECK(strstr(err, "repeat_last_n") != NULL);
    o = kve_request_default_options();
    o.size = 4;
    CHECK_EQ_INT(kve_submit_ex(c, &p, &o, &r, err, sizeof err), KVE_ERR_PARAM);
    CHECK(strstr(err, "size") != NULL && r == NULL);
    /* nothing was queued: the counters did not move */
    nanosleep(&(struct timespec){0, 20000000}, NULL);
    CHECK_EQ_INT(kve_context_get_stats(c, &st1), KVE_OK);
    CHECK(st1.prompt_tokens == st0.prompt_tokens && st1.waiting == 0 && st1.running == 0);
    /* grammar and tool-call grammar refusals; checks without a model */
    kve_grammar *g2 = (kve_grammar *)&err;
    const char *names[2] = {"f", NULL}, *schemas[2] = {"{\"type\": 5}", "{}"};
    CHECK_EQ_INT(kve_grammar_tool_calls(m, 0, names, schemas, "", "parameters", "", &g2, err, sizeof err), KVE_ERR_PARAM);
    CHECK(g2 == NULL);
    CHECK_EQ_INT(kve_grammar_tool_calls(m, 2, names, schemas, "", "parameters", "", &g2, err, sizeof err), KVE_ERR_PARAM);
    CHECK(strstr(err, "function 1") != NULL);
    CHECK_EQ_INT(kve_grammar_tool_calls(m, 1, names, schemas, "", "parameters", "", &g2, err, sizeof err), KVE_ERR_PARAM);
    CHECK(g2 == NULL && err[0]);
    CHECK_EQ_INT(kve_grammar_check("root ::= \"a\" | [b-d]+", 21, 0, err, sizeof err), KVE_OK);
    CHECK_EQ_INT(kve_grammar_check("root ::= = x", 12, 0, err, sizeof err), KVE_ERR_PARAM);
    CHECK(strstr(err, "line 1") != NULL);
    CHECK_EQ_INT(kve_grammar_check("{\"type\": \"object\"}", 18, 1, err, sizeof err), KVE_OK);
    CHECK_EQ_INT(kve_grammar_check("{\"type\": 5}", 11, 1, err, sizeof err), KVE_ERR_PARAM);
    CHECK(kve_model_tool_style(m) == KVE_TOOLS_HERMES && !strcmp(kve_chat_default_system(m), ""));
    CHECK_EQ_INT(kve_session_dir_clean("/nonexistent/kvcache-dir", err, sizeof err), -1);
    CHECK(err[0]);
    /* a good request runs; its prompt's full pages (16 positions) are named */
    o = kve_request_default_options();
    choices_seen cs;
    kve_output out;
    CHECK_EQ_INT(run_ex(c, &p, &o, &cs, &out), KVE_OK);
    CHECK(ps.stored >= 40 / 16);
    kve_context_stats bad = {.size = 0};
    CHECK_EQ_INT(kve_context_get_stats(c, &bad), KVE_ERR_PARAM);
    bad.size = sizeof bad + 1;
    CHECK_EQ_INT(kve_context_get_stats(c, &bad), KVE_ERR_PARAM);
    /* a stopped context refuses new requests, and frees as before */
    kve_context_stop(c);
    o = kve_request_default_options();
    CHECK_EQ_INT(kve_submit_ex(c, &p, &o, &r, err, sizeof err), KVE_ERR_STOPPED);
    CHECK(r == NULL);
    kve_context_stop(c);
    kve_context_free(c);
    kve_grammar_free(gr);
    kve_model_free(m);
    fx_free(&fx);
}

/* kve_session_eval's logits, in chunks that start and end inside the
 * prefill batches and after a generated token not yet in the cache, equal
 * the float64 forward of the fixture at every scored position; truncation
 * keeps what it says and leaves the cut pages to the prefix cache until
 * kve_session_clear_prefixes; the shape is the fixture's. */
/* The fixture and an f32 session on it (64 positions, 2 threads, prefill
 * batches of 7 rows, f32 products); -1 with the test failed and nothing
 * left open. */
static int open_f32_session(fx_model *fx, kve_model **m, kve_session **s) {
    if (load_fixture(fx, m)) return -1;
    char err[256];
    kve_session_params sp = kve_session_default_params();
    sp.n_ctx = 64, sp.n_threads = 2, sp.n_batch = 7, sp.kv_type = KV_F32, sp.act_bits = 0;
    if (kve_session_create(*m, &sp, s, err, sizeof err) != KVE_OK) {
        test_fail(__FILE__, __LINE__, "session: %s", err);
        kve_model_free(*m), fx_free(fx);
        return -1;
    }
    return 0;
}

TEST(kvengine_session_eval_scores_every_position_as_the_f64_reference) {
    enum { N = 40 };
    fx_model fx;
    kve_model *m;
    kve_session *s;
    if (open_f32_session(&fx, &m, &s)) return;
    const int32_t V = kve_model_n_vocab(m);
    int32_t toks[N];
    toks[0] = kve_model_bos(m);
    CHECK_EQ_INT(toks[0], 1);
    for (int32_t i = 1; i < N; i++) toks[i] = FX_BYTE0 + (int32_t)((i * 37 + 11) % 200);
    double *ref = malloc(sizeof(double) * (size_t)N * (size_t)V);
    float *got = malloc(sizeof(float) * (size_t)N * (size_t)V);
    fx_reference(&fx, toks, N, ref);
    /* tokens [0, 25) scoring from 5, then [25, 40) scoring all */
    CHECK_EQ_INT(kve_session_eval(s, toks, 25, 5, got), KVE_OK);
    CHECK_EQ_INT(kve_session_eval(s, toks + 25, 15, 0, got + (size_t)20 * (size_t)V), KVE_OK);
    double bmax, r = fx_max_diff(got, ref + (size_t)5 * (size_t)V, (int64_t)35 * V, &bmax) / bmax;
    printf("     eval in chunks: relative diff to f64 %.2e\n", r);
    CHECK(r <= 1e-5);
    CHECK_EQ_INT(kve_session_n_cached(s), N);
    /* refused with nothing changed: first past n, an id outside the vocabulary, no room */
    CHECK_EQ_INT(kve_session_eval(s, toks, 3, 4, got), KVE_ERR_PARAM);
    int32_t bad = V;
    CHECK_EQ_INT(kve_session_eval(s, &bad, 1, 0, got), KVE_ERR_TOKEN);
    CHECK_EQ_INT(kve_session_eval(s, toks, 30, 30, NULL), KV_ERR_CAPACITY);
    CHECK_EQ_INT(kve_session_eval(s, toks, 2, 0, NULL), KVE_ERR_NULL);
    CHECK_EQ_INT(kve_session_n_cached(s), N);
    /* truncated, the cut pages resume a later generation until the prefix cache is cleared */
    CHECK_EQ_INT(kve_session_truncate(s, N + 1), KVE_ERR_PARAM);
    CHECK_EQ_INT(kve_session_truncate(s, 20), KVE_OK);
    CHECK_EQ_INT(kve_session_n_cached(s), 20);
    CHECK_EQ_INT(kve_session_truncate(s, 0), KVE_OK);
    kve_generate_params g0 = kve_generate_default_params();
    g0.max_tokens = 0;
    kve_generate_result r0;
    CHECK_EQ_INT(kve_session_generate(s, toks, N, &g0, &r0), KVE_OK);
    CHECK(r0.n_reused >= 16);   /* whole pages of the cut sequence */
    kve_session_reset(s);
    kve_session_clear_prefixes(s);
    CHECK_EQ_INT(kve_session_generate(s, toks, N, &g0, &r0), KVE_OK);
    CHECK_EQ_INT(r0.n_reused, 0);
    /* after a generated token (held, not yet cached) the scores follow it too */
    kve_session_reset(s);
    kve_generate_params gp = kve_generate_default_params();
    gp.temperature = 0, gp.max_tokens = 1;
    kve_generate_result res;
    CHECK_EQ_INT(kve_session_generate(s, toks, 10, &gp, &res), KVE_OK);
    int32_t n_held;
    const int32_t *held = kve_session_tokens(s, &n_held);
    if (n_held == 11) {
        int32_t seq2[13];
        memcpy(seq2, held, sizeof(int32_t) * 11);
        seq2[11] = toks[11], seq2[12] = toks[12];
        CHECK_EQ_INT(kve_session_eval(s, seq2 + 11, 2, 0, got), KVE_OK);
        fx_reference(&fx, seq2, 13, ref);
        r = fx_max_diff(got, ref + (size_t)11 * (size_t)V, (int64_t)2 * V, &bmax) / bmax;
        printf("     eval after a generated token: relative diff to f64 %.2e\n", r);
        CHECK(r <= 1e-5);
    } else {
        test_fail(__FILE__, __LINE__, "generate held %d tokens, not 11", (int)n_held);
    }
    /* the shape the cache is sized by */
    kve_model_shape sh = kve_model_get_shape(m);
    CHECK(sh.n_layers == fx.s.layers && sh.n_kv_heads == fx.s.kv_heads && sh.head_dim == fx.head_dim);
    CHECK(sh.n_groups == 1 && sh.weight_bytes > 0);
    int32_t nl = -1, w = -1;
    CHECK_EQ_INT(kve_model_group(m, 0, &nl, &w), KVE_OK);
    CHECK(nl == fx.s.layers && w == 0);
    CHECK_EQ_INT(kve_model_group(m, 1, &nl, &w), KVE_ERR_PARAM);
    free(ref), free(got);
    kve_session_free(s);
    kve_model_free(m);
    fx_free(&fx);
}

/* Largest |got - want| relative to the largest |want| over n. */
static double rel_diff_f64(const float *got, const double *want, int64_t n) {
    double bmax, d = fx_max_diff(got, want, n, &bmax);
    return d / (bmax > 0 ? bmax : 1);
}

/* kve_session_eval_reference (no cache at all) equals the float64 forward
 * of the fixture at every scored position and leaves the session as it was;
 * kve_session_read_kv gives layer 0's K and V as the fixture's weights make
 * them, at their positions, and after a context shift the moved keys turned
 * to their new positions; bad arguments are refused by name with nothing
 * written. */
TEST(kvengine_reference_eval_and_kv_reads_are_the_f64_forward) {
    enum { N = 40 };
    fx_model fx;
    kve_model *m;
    kve_session *s;
    if (open_f32_session(&fx, &m, &s)) return;
    const int32_t V = kve_model_n_vocab(m), kvd = fx.s.kv_heads * fx.head_dim;
    int32_t toks[N];
    toks[0] = kve_model_bos(m);
    for (int32_t i = 1; i < N; i++) toks[i] = FX_BYTE0 + (int32_t)((i * 53 + 7) % 200);
    double *ref = malloc(sizeof(double) * (size_t)N * (size_t)V);
    float *got = malloc(sizeof(float) * (size_t)N * (size_t)V);
    fx_reference(&fx, toks, N, ref);
    CHECK_EQ_INT(kve_session_eval_reference(s, toks, N, 3, got), KVE_OK);
    double r = rel_diff_f64(got, ref + (size_t)3 * (size_t)V, (int64_t)(N - 3) * V);
    printf("     reference eval: relative diff to f64 %.2e\n", r);
    CHECK(r <= 1e-5);
    CHECK_EQ_INT(kve_session_n_cached(s), 0);   /* the session is not used */
    /* refused, nothing written: first past n, more than n_ctx, an id outside the vocabulary, NULLs */
    got[0] = 12345.0f;
    CHECK_EQ_INT(kve_session_eval_reference(s, toks, 3, 4, got), KVE_ERR_PARAM);
    CHECK_EQ_INT(kve_session_eval_reference(s, toks, -1, 0, got), KVE_ERR_PARAM);
    int32_t *many = calloc(65, sizeof *many);
    CHECK_EQ_INT(kve_session_eval_reference(s, many, 65, 64, got), KVE_ERR_PARAM);
    free(many);
    int32_t bad[2] = {1, V};
    CHECK_EQ_INT(kve_session_eval_reference(s, bad, 2, 0, got), KVE_ERR_TOKEN);
    CHECK(got[0] == 12345.0f);
    CHECK_EQ_INT(kve_session_eval_reference(s, toks, 2, 0, NULL), KVE_ERR_NULL);
    CHECK_EQ_INT(kve_session_eval_reference(s, toks, 2, 2, NULL), KVE_OK);   /* nothing scored */
    CHECK_EQ_INT(kve_session_eval_reference(NULL, toks, 2, 0, got), KVE_ERR_NULL);
    /* the cache's layer 0 after feeding in chunks: each position's K and V */
    CHECK_EQ_INT(kve_session_feed(s, toks, 17), KVE_OK);
    CHECK_EQ_INT(kve_session_feed(s, toks + 17, N - 17), KVE_OK);
    float *k = malloc(sizeof(float) * (size_t)N * (size_t)kvd), *v = malloc(sizeof(float) * (size_t)N * (size_t)kvd);
    double *kr = malloc(sizeof(double) * (size_t)kvd), *vr = malloc(sizeof(double) * (size_t)kvd);
    CHECK_EQ_INT(kve_session_read_kv(s, 0, 0, 0, N, k, v), KVE_OK);
    double worst = 0;
    for (int32_t p = 0; p < N; p++) {
        fx_layer0_kv(&fx, toks[p], p, kr, vr);
        worst = fmax(worst, fmax(rel_diff_f64(k + (size_t)p * kvd, kr, kvd), rel_diff_f64(v + (size_t)p * kvd, vr, kvd)));
    }
    printf("     layer 0 K/V read: relative diff to f64 %.2e\n", worst);
    CHECK(worst <= 1e-5);
    float *k2 = malloc(sizeof(float) * 3 * (size_t)kvd), *v2 = malloc(sizeof(float) * 3 * (size_t)kvd);
    CHECK_EQ_INT(kve_session_read_kv(s, 0, 0, 21, 3, k2, v2), KVE_OK);   /* a range from inside */
    CHECK(!memcmp(k2, k + (size_t)21 * kvd, sizeof(float) * 3 * (size_t)kvd) &&
          !memcmp(v2, v + (size_t)21 * kvd, sizeof(float) * 3 * (size_t)kvd));
    free(k2), free(v2);
    /* shifted: position p >= 4 now holds token p + dropped, turned to p */
    int32_t dropped = 0;
    CHECK_EQ_INT(kve_session_shift(s, 4, 0, &dropped), KVE_OK);
    CHECK(dropped > 0);
    const int32_t held = N - dropped;
    CHECK_EQ_INT(kve_session_read_kv(s, 0, 0, 0, held, k, v), KVE_OK);
    worst = 0;
    for (int32_t p = 0; p < held; p++) {
        fx_layer0_kv(&fx, toks[p < 4 ? p : p + dropped], p, kr, vr);
        worst = fmax(worst, fmax(rel_diff_f64(k + (size_t)p * kvd, kr, kvd), rel_diff_f64(v + (size_t)p * kvd, vr, kvd)));
    }
    printf("     layer 0 K/V after a shift of %d: relative diff to f64 %.2e\n", (int)dropped, worst);
    CHECK(worst <= 1e-5);
    /* refused, nothing written: group, layer, positions past what is cached, NULLs */
    k[0] = 12345.0f;
    CHECK_EQ_INT(kve_session_read_kv(s, 1, 0, 0, 1, k, v), KVE_ERR_PARAM);
    CHECK_EQ_INT(kve_session_read_kv(s, 0, fx.s.layers, 0, 1, k, v), KVE_ERR_PARAM);
    CHECK_EQ_INT(kve_session_read_kv(s, 0, -1, 0, 1, k, v), KVE_ERR_PARAM);
    CHECK_EQ_INT(kve_session_read_kv(s, 0, 0, held - 1, 2, k, v), KVE_ERR_PARAM);
    CHECK_EQ_INT(kve_session_read_kv(s, 0, 0, -1, 1, k, v), KVE_ERR_PARAM);
    CHECK_EQ_INT(kve_session_read_kv(s, 0, 0, 0, 1, NULL, v), KVE_ERR_NULL);
    CHECK(k[0] == 12345.0f);
    CHECK_EQ_INT(kve_session_read_kv(s, 0, 0, held, 0, NULL, NULL), KVE_OK);
    free(k), free(v), free(kr), free(vr), free(ref), free(got);
    kve_session_free(s);
    kve_model_free(m);
    fx_free(&fx);
}

/* kve_session_options.window forces a sliding window on a model without
 * one: the cache group says so, cached decoding and the reference both
 * equal the float64 forward attending within that window, and the evicted
 * positions are no longer readable. Options of a size this library does
 * not know, or a negative window, are refused by name. */
TEST(kvengine_session_forced_window_attends_as_the_windowed_f64_forward) {
    enum { N = 40, W = 8 };
    fx_model fx;
    kve_model *m;
    kve_session *s = NULL;
    if (load_fixture(&fx, &m)) return;
    char err[256];
    kve_session_params sp = kve_session_default_params();
    sp.n_ctx = 64, sp.n_threads = 2, sp.n_batch = 5, sp.kv_type = KV_F32, sp.act_bits = 0;
    kve_session_options so = kve_session_default_options();
    CHECK(so.size == sizeof so && so.window == 0);
    so.window = -1;
    CHECK_EQ_INT(kve_session_create_ex(m, &sp, &so, &s, err, sizeof err), KVE_ERR_PARAM);
    CHECK(s == NULL && strstr(err, "window") != NULL);
    so.window = W, so.size = sizeof so + 8;
    CHECK_EQ_INT(kve_session_create_ex(m, &sp, &so, &s, err, sizeof err), KVE_ERR_PARAM);
    CHECK(strstr(err, "size") != NULL);
    so.size = sizeof(size_t);
    CHECK_EQ_INT(kve_session_create_ex(m, &sp, &so, &s, err, sizeof err), KVE_ERR_PARAM);
    so.size = sizeof so;
    if (kve_session_create_ex(m, &sp, &so, &s, err, sizeof err) != KVE_OK) {
        test_fail(__FILE__, __LINE__, "session: %s", err);
        return kve_model_free(m), fx_free(&fx);
    }
    int32_t nl = -1, w = -1;
    CHECK_EQ_INT(kve_session_cache_group(s, 0, &nl, &w, NULL), KVE_OK);
    CHECK(nl == fx.s.layers && w == W);
    const int32_t V = kve_model_n_vocab(m);
    int32_t toks[N];
    toks[0] = kve_model_bos(m);
    for (int32_t i = 1; i < N; i++) toks[i] = FX_BYTE0 + (int32_t)((i * 29 + 3) % 200);
    double *ref = malloc(sizeof(double) * (size_t)N * (size_t)V), *full = malloc(sizeof(double) * (size_t)N * (size_t)V);
    float *got = malloc(sizeof(float) * (size_t)N * (size_t)V);
    fx_reference(&fx, toks, N, full);
    fx.s.window = W;   /* the reference attends within the forced window too */
    fx_reference(&fx, toks, N, ref);
    fx.s.window = 0;
    /* the window matters for these tokens: the last rows differ from full attention */
    double bmax, apart = 0;
    for (int64_t i = (int64_t)(N - 1) * V; i < (int64_t)N * V; i++) apart = fmax(apart, fabs(ref[i] - full[i]));
    CHECK(apart > 1e-3);
    CHECK_EQ_INT(kve_session_eval(s, toks, 23, 0, got), KVE_OK);
    CHECK_EQ_INT(kve_session_eval(s, toks + 23, N - 23, 0, got + (size_t)23 * (size_t)V), KVE_OK);
    double r = fx_max_diff(got, ref, (int64_t)N * V, &bmax) / bmax;
    printf("     forced window %d, cached: relative diff to windowed f64 %.2e\n", W, r);
    CHECK(r <= 1e-5);
    CHECK_EQ_INT(kve_session_eval_reference(s, toks, N, 0, got), KVE_OK);
    r = fx_max_diff(got, ref, (int64_t)N * V, &bmax) / bmax;
    printf("     forced window %d, reference: relative diff to windowed f64 %.2e\n", W, r);
    CHECK(r <= 1e-5);
    float kv[2][512];
    CHECK(fx.s.kv_heads * fx.head_dim <= 512);
    CHECK_EQ_INT(kve_session_read_kv(s, 0, 0, 0, 1, kv[0], kv[1]), KVE_ERR_PARAM);   /* evicted */
    CHECK_EQ_INT(kve_session_read_kv(s, 0, 0, N - 1, 1, kv[0], kv[1]), KVE_OK);
    free(ref), free(full), free(got);
    kve_session_free(s);
    kve_model_free(m);
    fx_free(&fx);
}
