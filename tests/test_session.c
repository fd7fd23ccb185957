/* tests/test_session.c - the generation loop (engine/gen/session.h): the text
 * stream's UTF-8 and stop-string hold-back on the tiny fixture vocabulary
 * (byte tokens, so one character's bytes can be split across tokens), and
 * every stop reason of a session forced on a tiny random-weight model
 * (tests/test_model_fixture.h). Expected texts are written out here from the
 * UTF-8 definition; expected tokens come from a plain decode loop written
 * here (llm_eval + llm_argmax), not from the session. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "test_model_fixture.h"
#include "gguf_writer.h"
#include "../engine/gen/session.h"

enum { EOS = 2, HE = FX_BYTE0 + 257 }; /* the fixture's <|im_end|> and merged "he" */
#define B(c) (FX_BYTE0 + (unsigned char)(c))

static llm_model *load(fx_model *fx, const fx_spec *spec) {
    return fx_build(spec, fx) ? NULL : fx_load(fx);
}

static llm_context *context(const llm_model *m, int32_t n_ctx) {
    llm_context_params p = llm_context_default_params();
    p.n_ctx = n_ctx, p.n_batch = 8, p.page_size = 4, p.kv_type = KV_F32, p.n_threads = 2;
    return fx_context(m, &p);
}

/* ---------------------------------------------------------------- text stream */

/* Pushes tokens [n] and appends everything shown to out (NUL-terminated);
 * returns the last reason. */
static llm_stop_reason push_all(llm_textstream *ts, const int32_t *toks, int n, char *out, size_t cap,
                                const char *const *each) {
    llm_stop_reason r = LLM_STOP_NONE;
    for (int i = 0; i < n; i++) {
        const char *t;
        size_t len;
        r = llm_textstream_push(ts, toks[i], &t, &len);
        if (each && (len != strlen(each[i]) || memcmp(t, each[i], len)))
            test_fail(__FILE__, __LINE__, "token %d shows '%.*s', expected '%s'", i, (int)len, t, each[i]);
        strncat(out, t, len < cap - strlen(out) - 1 ? len : cap - strlen(out) - 1);
        if (r != LLM_STOP_NONE) break;
    }
    return r;
}

TEST(textstream_holds_back_a_character_split_across_byte_tokens) {
    fx_model fx;
    llm_model *m = load(&fx, &(fx_spec){.type = GW_F32, .seed = 5});
    if (!m) return;
    llm_textstream *ts;
    CHECK_EQ_INT(llm_textstream_create(llm_model_tokenizer(m), NULL, 0, -1, 0, &ts), LLM_OK);
    /* a, é = C3 A9, € = E2 82 AC, a byte that begins nothing (FF), C3 then 'b' (no continuation) */
    const int32_t toks[] = {B('a'), B(0xC3), B(0xA9), B(0xE2), B(0x82), B(0xAC), B(0xFF), B(0xC3), B('b')};
    const char *const each[] = {"a", "", "\xC3\xA9", "", "", "\xE2\x82\xAC", "\xEF\xBF\xBD", "", ("\xEF\xBF\xBD" "b")};
    char out[256] = "";
    CHECK_EQ_INT(push_all(ts, toks, 9, out, sizeof out, each), LLM_STOP_NONE);
    CHECK_EQ_INT(llm_textstream_n_tokens(ts), 9);
    /* an emoji (F0 9F 98 80) cut after two bytes: held, then one U+FFFD at the end */
    const int32_t cut[] = {B(0xF0), B(0x9F)};
    const char *const none[] = {"", ""};
    CHECK_EQ_INT(push_all(ts, cut, 2, out, sizeof out, none), LLM_STOP_NONE);
    const char *t;
    size_t len;
    llm_textstream_flush(ts, &t, &len);
    CHECK(len == 3 && !memcmp(t, "\xEF\xBF\xBD", 3));
    llm_textstream_flush(ts, &t, &len);
    CHECK(len == 0);
    llm_textstream_free(ts);
    llm_model_free(m);
    fx_free(&fx);
}

TEST(textstream_stop_string_spanning_two_tokens_is_never_shown) {
    fx_model fx;
    llm_model *m = load(&fx, &(fx_spec){.type = GW_F32, .seed = 5});
    if (!m) return;
    const llm_tokenizer *tok = llm_model_tokenizer(m);
    llm_textstream *ts;
    /* "a" "he" "l": the stop "el" spans the second and third tokens */
    const char *stops[] = {"xyz", "el"};
    CHECK_EQ_INT(llm_textstream_create(tok, stops, 2, -1, 0, &ts), LLM_OK);
    const int32_t toks[] = {B('a'), HE, B('l'), B('p')};
    const char *const each[] = {"a", "h", ""};
    char out[64] = "";
    CHECK_EQ_INT(push_all(ts, toks, 4, out, sizeof out, each), LLM_STOP_STRING);
    CHECK(strcmp(out, "ah") == 0);
    llm_textstream_free(ts);
    /* a near miss is released as soon as it cannot match any more */
    const char *near[] = {"elx"};
    CHECK_EQ_INT(llm_textstream_create(tok, near, 1, -1, 0, &ts), LLM_OK);
    const char *const each2[] = {"a", "h", "", "elp"};
    out[0] = 0;
    CHECK_EQ_INT(push_all(ts, toks, 4, out, sizeof out, each2), LLM_STOP_NONE);
    CHECK(strcmp(out, "ahelp") == 0);
    llm_textstream_free(ts);
    /* the token limit: the third token stops; what is held comes out at the flush */
    CHECK_EQ_INT(llm_textstream_create(tok, near, 1, 3, 0, &ts), LLM_OK);
    out[0] = 0;
    CHECK_EQ_INT(push_all(ts, toks, 4, out, sizeof out, NULL), LLM_STOP_LENGTH);
    const char *t;
    size_t len;
    llm_textstream_flush(ts, &t, &len);
    CHECK(strcmp(out, "ah") == 0 && len == 2 && !memcmp(t, "el", 2));
    /* end of generation: reported, not counted, not shown; ignored with the flag */
    llm_textstream_reset(ts);
    CHECK_EQ_INT(llm_textstream_push(ts, EOS, &t, &len), LLM_STOP_EOG);
    CHECK(len == 0 && llm_textstream_n_tokens(ts) == 0);
    CHECK_EQ_INT(llm_textstream_push(ts, 0, &t, &len), LLM_STOP_EOG); /* <|endoftext|> too */
    llm_textstream_free(ts);
    CHECK_EQ_INT(llm_textstream_create(tok, NULL, 0, -1, LLM_STREAM_IGNORE_EOG, &ts), LLM_OK);
    CHECK_EQ_INT(llm_textstream_push(ts, EOS, &t, &len), LLM_STOP_NONE);
    CHECK(len == 0 && llm_textstream_n_tokens(ts) == 1);
    llm_textstream_free(ts);
    /* bad stop lists */
    const char *empty[] = {""};
    CHECK_EQ_INT(llm_textstream_create(tok, empty, 1, -1, 0, &ts), LLM_ERR_PARAM);
    CHECK(ts == NULL);
    CHECK_EQ_INT(llm_textstream_create(tok, stops, LLM_MAX_STOPS + 1, -1, 0, &ts), LLM_ERR_PARAM);
    llm_model_free(m);
    fx_free(&fx);
}

/* ---------------------------------------------------------------- sessions */

/* Callbacks: force a token sequence through on_logits, count and record
 * tokens, collect text, cancel after some tokens. */
typedef struct {
    const int32_t *force;   /* [n_force] the tokens to make the model choose, then free choice */
    int n_force, step;
    int32_t got[64];        /* tokens seen by on_token */
    int n_got;
    int cancel_after;       /* on_token returns 1 on this token count (0: never) */
    char text[512];
} watch;

static int w_logits(void *user, float *logits, int32_t n_vocab) {
    watch *w = user;
    if (w->step < w->n_force && w->force[w->step] < n_vocab) logits[w->force[w->step]] = 1e4f;
    w->step++;
    return 0;
}
static int w_token(void *user, int32_t token) {
    watch *w = user;
    if (w->n_got < 64) w->got[w->n_got] = token;
    w->n_got++;
    return w->cancel_after && w->n_got == w->cancel_after;
}
static int w_text(void *user, const char *text, size_t len) {
    watch *w = user;
    size_t have = strlen(w->text);
    if (have + len < sizeof w->text) memcpy(w->text + have, text, len), w->text[have + len] = 0;
    return 0;
}

static llm_gen_params greedy(watch *w, int32_t max_tokens) {
    llm_gen_params p = llm_gen_default_params();
    p.max_tokens = max_tokens;
    p.sampler.temp = 0;
    p.on_logits = w_logits, p.on_token = w_token, p.on_text = w_text, p.user = w;
    return p;
}


/* A tiny model, a context of n_ctx positions and a session on it. */
typedef struct {
    fx_model fx;
    llm_model *m;
    llm_context *c;
    llm_session *s;
} rig;

static int rig_open(rig *r, const fx_spec *spec, int32_t n_ctx) {
    memset(r, 0, sizeof *r);
    if (!(r->m = load(&r->fx, spec))) return -1;
    r->c = context(r->m, n_ctx);
    if (llm_session_create(r->c, &r->s) != LLM_OK) test_fail(__FILE__, __LINE__, "no session");
    return r->s ? 0 : -1;
}

static void rig_close(rig *r) {
    llm_session_free(r->s);
    llm_context_free(r->c);
    llm_model_free(r->m);
    fx_free(&r->fx);
}

static const fx_spec q8_model = {.type = GW_Q8_0, .seed = 11};

static const int32_t prompt[10] = {1, B('h'), B('i'), B(' '), HE, B('l'), B('l'), B('o'), B('!'), B('\n')};

TEST(session_greedy_tokens_equal_a_plain_decode_loop_and_stop_at_the_token_limit) {
    fx_model fx;
    llm_model *m = load(&fx, &(fx_spec){.type = GW_Q8_0, .seed = 11});
    if (!m) return;
    llm_context *c = context(m, 64);
    /* the reference: prompt, then argmax and feed, 8 times, on its own sequence */
    const int32_t V = llm_model_n_vocab(m);
    float *lg = malloc(sizeof(float) * (size_t)V);
    int32_t ref[8], rseq;
    CHECK_EQ_INT(llm_seq_new(c, &rseq), LLM_OK);
    CHECK_EQ_INT(llm_eval(c, rseq, prompt, 10, 0, lg, NULL, NULL), LLM_OK);
    for (int i = 0; i < 8; i++) {
        ref[i] = llm_argmax(lg, V);
        CHECK_EQ_INT(llm_eval(c, rseq, &ref[i], 1, 0, lg, NULL, NULL), LLM_OK);
    }
    llm_seq_remove(c, rseq);
    llm_session *s;
    CHECK_EQ_INT(llm_session_create(c, &s), LLM_OK);
    watch w = {0};
    llm_gen_params p = greedy(&w, 8);
    p.ignore_eog = 1; /* the reference does not stop at an end-of-turn token either */
    llm_gen_result res;
    CHECK_EQ_INT(llm_session_generate(s, prompt, 10, &p, &res), LLM_OK);
    CHECK_EQ_INT(res.reason, LLM_STOP_LENGTH);
    CHECK_EQ_INT(res.n_generated, 8);
    CHECK_EQ_INT(res.n_prompt, 10);
    CHECK_EQ_INT(res.n_reused, 8);   /* the reference's two full pages, from the prefix cache */
    CHECK(res.t_prefill > 0 && res.t_decode > 0);
    CHECK_EQ_INT(w.n_got, 8);
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(w.got[i], ref[i]);
    /* it holds prompt + 8; the cache all but the last, which the next call feeds */
    int32_t n;
    const int32_t *held = llm_session_tokens(s, &n);
    CHECK_EQ_INT(n, 18);
    CHECK(n == 18 && !memcmp(held, prompt, sizeof prompt) && !memcmp(held + 10, ref, sizeof ref));
    CHECK_EQ_INT(llm_session_n_cached(s), 17);
    CHECK_EQ_INT(llm_seq_length(c, llm_session_seq(s)), 17);
    /* the next prompt extends what it holds: only the new part (and the unfed token) is prefilled */
    int32_t more[20];
    memcpy(more, held, sizeof(int32_t) * 18);
    more[18] = B('o'), more[19] = B('k');
    CHECK_EQ_INT(llm_session_generate(s, more, 20, &p, &res), LLM_OK);
    CHECK_EQ_INT(res.n_reused, 17);
    /* a prompt that diverges early keeps only the common prefix */
    int32_t other[4] = {1, B('h'), B('o'), B('w')};
    p.max_tokens = 1;
    CHECK_EQ_INT(llm_session_generate(s, other, 4, &p, &res), LLM_OK);
    CHECK_EQ_INT(res.n_reused, 2);
    CHECK_EQ_INT(llm_seq_length(c, llm_session_seq(s)), 4);
    llm_session_free(s);
    free(lg);
    llm_context_free(c);
    llm_model_free(m);
    fx_free(&fx);
}

TEST(session_stops_at_end_of_generation_without_keeping_the_token) {
    rig r;
    if (rig_open(&r, &q8_model, 64)) return;
    llm_context *c = r.c;
    llm_session *s = r.s;
    const int32_t force[3] = {B('o'), B('k'), EOS};
    watch w = {.force = force, .n_force = 3};
    llm_gen_params p = greedy(&w, 20);
    llm_gen_result res;
    CHECK_EQ_INT(llm_session_generate(s, prompt, 10, &p, &res), LLM_OK);
    CHECK_EQ_INT(res.reason, LLM_STOP_EOG);
    CHECK_EQ_INT(res.eog_token, EOS);
    CHECK_EQ_INT(res.n_generated, 2);
    CHECK(strcmp(w.text, "ok") == 0);
    int32_t n;
    llm_session_tokens(s, &n);
    CHECK_EQ_INT(n, 12);
    /* the caller closes the turn with it */
    CHECK_EQ_INT(llm_session_feed(s, &res.eog_token, 1), LLM_OK);
    CHECK_EQ_INT(llm_seq_length(c, llm_session_seq(s)), 13);
    CHECK_EQ_INT(llm_session_n_cached(s), 13);
    /* ignored, it is an ordinary token that shows nothing */
    watch w2 = {.force = force, .n_force = 3};
    p = greedy(&w2, 4);
    p.ignore_eog = 1;
    CHECK_EQ_INT(llm_session_generate(s, prompt, 10, &p, &res), LLM_OK);
    CHECK_EQ_INT(res.reason, LLM_STOP_LENGTH);
    CHECK_EQ_INT(res.n_generated, 4);
    CHECK_EQ_INT(w2.got[2], EOS);
    rig_close(&r);
}

TEST(session_stop_string_spanning_two_tokens_ends_the_text_before_it) {
    rig r;
    if (rig_open(&r, &q8_model, 64)) return;
    llm_session *s = r.s;
    const int32_t force[5] = {B('a'), HE, B('l'), B('p'), B('!')};
    watch w = {.force = force, .n_force = 5};
    llm_gen_params p = greedy(&w, 20);
    const char *stops[] = {"el"};
    p.stops = stops, p.n_stops = 1;
    llm_gen_result res;
    CHECK_EQ_INT(llm_session_generate(s, prompt, 10, &p, &res), LLM_OK);
    CHECK_EQ_INT(res.reason, LLM_STOP_STRING);
    CHECK_EQ_INT(res.n_generated, 3);
    CHECK(strcmp(w.text, "ah") == 0);
    rig_close(&r);
}

TEST(session_context_full_stops_cleanly_with_its_reason_and_numbers) {
    rig r;
    if (rig_open(&r, &q8_model, 16)) return;
    llm_context *c = r.c;
    llm_session *s = r.s;
    watch w = {0};
    llm_gen_params p = greedy(&w, -1);
    p.ignore_eog = 1;
    llm_gen_result res;
    /* 10 prompt tokens in 16 positions: 6 generated, every one of them in the cache */
    CHECK_EQ_INT(llm_session_generate(s, prompt, 10, &p, &res), LLM_OK);
    CHECK_EQ_INT(res.reason, LLM_STOP_CONTEXT);
    CHECK_EQ_INT(res.n_generated, 6);
    CHECK_EQ_INT(llm_seq_length(c, llm_session_seq(s)), 16);
    if (!strstr(res.message, "16 of 16")) test_fail(__FILE__, __LINE__, "message: %s", res.message);
    /* room kept for an end-of-turn marker of 2 tokens: 4 generated */
    p.reserve = 2;
    CHECK_EQ_INT(llm_session_generate(s, prompt, 10, &p, &res), LLM_OK);
    CHECK_EQ_INT(res.reason, LLM_STOP_CONTEXT);
    CHECK_EQ_INT(res.n_generated, 4);
    CHECK_EQ_INT(res.n_reused, 9);
    int32_t marker[2] = {EOS, B('\n')};
    CHECK_EQ_INT(llm_session_feed(s, marker, 2), LLM_OK);
    CHECK_EQ_INT(llm_seq_length(c, llm_session_seq(s)), 16);
    /* a prompt with no room left: refused with the numbers, the sequence as it was */
    int32_t n_before;
    llm_session_tokens(s, &n_before);
    int32_t big[16];
    for (int i = 0; i < 16; i++) big[i] = B('a' + i);
    p.reserve = 0;
    CHECK_EQ_INT(llm_session_generate(s, big, 16, &p, &res), LLM_ERR_CAPACITY);
    CHECK_EQ_INT(res.reason, LLM_STOP_CONTEXT);
    CHECK_EQ_INT(res.n_generated, 0);
    if (!strstr(res.message, "the prompt is 16 tokens; the context holds 16"))
        test_fail(__FILE__, __LINE__, "message: %s", res.message);
    int32_t n_after;
    llm_session_tokens(s, &n_after);
    CHECK_EQ_INT(n_after, n_before);
    CHECK_EQ_INT(llm_seq_length(c, llm_session_seq(s)), 16);
    /* feeding past the end: refused, nothing changed */
    CHECK_EQ_INT(llm_session_feed(s, marker, 1), LLM_ERR_CAPACITY);
    CHECK_EQ_INT(llm_seq_length(c, llm_session_seq(s)), 16);
    rig_close(&r);
}

TEST(session_a_callback_cancels_after_the_token_it_saw) {
    rig r;
    if (rig_open(&r, &q8_model, 64)) return;
    llm_session *s = r.s;
    watch w = {.cancel_after = 3};
    llm_gen_params p = greedy(&w, 20);
    p.ignore_eog = 1;
    llm_gen_result res;
    CHECK_EQ_INT(llm_session_generate(s, prompt, 10, &p, &res), LLM_OK);
    CHECK_EQ_INT(res.reason, LLM_STOP_CANCEL);
    CHECK_EQ_INT(res.n_generated, 3);
    CHECK_EQ_INT(w.n_got, 3);
    rig_close(&r);
}

TEST(session_non_finite_logits_stop_with_an_error_before_sampling) {
    fx_model fx;
    llm_model *m = load(&fx, &(fx_spec){.type = GW_F32, .seed = 3, .nan_norm = "output_norm.weight"});
    if (!m) return;
    llm_context *c = context(m, 64);
    /* the model's logits really are NaN (checked apart from the session) */
    const int32_t V = llm_model_n_vocab(m);
    float *lg = malloc(sizeof(float) * (size_t)V);
    int32_t seq;
    CHECK_EQ_INT(llm_seq_new(c, &seq), LLM_OK);
    CHECK_EQ_INT(llm_eval(c, seq, prompt, 10, 0, lg, NULL, NULL), LLM_OK);
    int nan = 0;
    for (int32_t i = 0; i < V; i++) nan += isnan(lg[i]) != 0;
    CHECK(nan > 0);
    llm_seq_remove(c, seq);
    llm_session *s;
    CHECK_EQ_INT(llm_session_create(c, &s), LLM_OK);
    watch w = {0};
    llm_gen_params p = greedy(&w, 20);
    llm_gen_result res;
    CHECK_EQ_INT(llm_session_generate(s, prompt, 10, &p, &res), LLM_ERR_NONFINITE);
    CHECK_EQ_INT(res.reason, LLM_STOP_ERROR);
    CHECK_EQ_INT(res.status, LLM_ERR_NONFINITE);
    CHECK_EQ_INT(res.n_generated, 0);
    CHECK_EQ_INT(w.n_got, 0);
    if (!strstr(res.message, "not finite")) test_fail(__FILE__, __LINE__, "message: %s", res.message);
    CHECK(strstr(llm_status_str(LLM_ERR_NONFINITE), "non-finite") != NULL);
    llm_session_free(s);
    free(lg);
    llm_context_free(c);
    llm_model_free(m);
    fx_free(&fx);
}

TEST(session_rejects_bad_input_and_changes_nothing) {
    rig r;
    if (rig_open(&r, &q8_model, 64)) return;
    llm_context *c = r.c;
    llm_session *s = r.s;
    watch w = {0};
    llm_gen_params p = greedy(&w, 2);
    llm_gen_result res;
    CHECK_EQ_INT(llm_session_generate(s, prompt, 10, &p, &res), LLM_OK);
    int32_t len = llm_seq_length(c, llm_session_seq(s));
    int32_t bad[2] = {1, FX_VOCAB};
    CHECK_EQ_INT(llm_session_generate(s, bad, 2, &p, &res), LLM_ERR_TOKEN);
    CHECK_EQ_INT(llm_session_feed(s, bad, 2), LLM_ERR_TOKEN);
    CHECK_EQ_INT(llm_session_generate(s, prompt, 0, &p, &res), LLM_ERR_NULL);
    p.sampler.top_p = 2;
    CHECK_EQ_INT(llm_session_generate(s, prompt, 10, &p, &res), LLM_ERR_PARAM);
    CHECK_EQ_INT(llm_seq_length(c, llm_session_seq(s)), len);
    CHECK_EQ_INT(llm_session_truncate(s, 100), LLM_ERR_LENGTH);
    CHECK_EQ_INT(llm_session_truncate(s, 3), LLM_OK);
    CHECK_EQ_INT(llm_seq_length(c, llm_session_seq(s)), 3);
    llm_session_reset(s);
    CHECK_EQ_INT(llm_seq_length(c, llm_session_seq(s)), 0);
    /* one sequence slot: a second session has none */
    llm_session *s2 = (llm_session *)1;
    CHECK_EQ_INT(llm_session_create(c, &s2), LLM_ERR_SEQ);
    CHECK(s2 == NULL);
    rig_close(&r);
}
