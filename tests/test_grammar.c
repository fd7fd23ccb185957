/* tests/test_grammar.c - the JSON recognizer accepts and rejects documents as
 * RFC 8259 says, every prefix of a valid document is alive, the token mask
 * keeps exactly the tokens whose bytes continue the document, and the
 * sampler constrained to json_object yields a parseable object. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <time.h>

#include "test.h"
#include "../engine/text/grammar.h"
#include "../engine/gen/sampler.h"
#include "real_model.h"

static int accepts(const char *doc, llm_json_root root) {
    llm_json_state st;
    llm_json_init(&st, root);
    return llm_json_feed(&st, doc, strlen(doc)) == 0 && llm_json_complete(&st);
}

TEST(grammar_json_accepts_and_rejects_documents) {
    static const char *good[] = {
        "{}", " { } ", "{\"a\":1}", "{\"a\": [1, 2.5, -0.5e+3, 0, 1E9], \"b\": {\"c\": null}}",
        "{\"s\": \"q\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9 \xc3\xa9\"}", "{\"t\": true, \"f\": false}", "{\"a\": []}",
        "{\"a\": [[], {}, [[1]]]}", "{\"\": \"\"}", "{\"n\": -0}", "{\"n\": 10.01e-2}",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        if (!accepts(good[i], LLM_JSON_OBJECT)) test_fail(__FILE__, __LINE__, "refused %s", good[i]);
    static const char *bad[] = {
        "", "{", "[]", "1", "\"s\"", "{a:1}", "{\"a\" 1}", "{\"a\":}", "{\"a\":1,}", "{,}", "{\"a\":01}",
        "{\"a\":1.}", "{\"a\":.5}", "{\"a\":-}", "{\"a\":1e}", "{\"a\":tru}", "{\"a\":True}", "{\"a\":[1,]}",
        "{\"a\":\"\x01\"}", "{\"a\":\"\\x\"}", "{\"a\":\"\\u12g4\"}", "{\"a\":1}}", "{\"a\":1} x", "{\"a\":[}",
        "{\"a\":1]", "{} {}", "{\"a\":\"unterminated}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (accepts(bad[i], LLM_JSON_OBJECT)) test_fail(__FILE__, __LINE__, "accepted %s", bad[i]);
    /* any value at the root without json_object */
    CHECK(accepts("[1, \"a\"]", LLM_JSON_ANY) && accepts("12.5", LLM_JSON_ANY) && accepts("null", LLM_JSON_ANY));
    CHECK(!accepts("12 13", LLM_JSON_ANY));
    /* nesting and whitespace runs are bounded */
    char deep[2 * LLM_JSON_MAX_DEPTH + 8] = "{\"a\":";
    size_t n = strlen(deep);
    for (int i = 0; i < LLM_JSON_MAX_DEPTH; i++) deep[n++] = '[';
    deep[n] = 0;
    llm_json_state st;
    llm_json_init(&st, LLM_JSON_OBJECT);
    CHECK(llm_json_feed(&st, deep, n) == -1);
    char ws[64] = "{";
    memset(ws + 1, ' ', LLM_JSON_MAX_WS + 1);
    llm_json_init(&st, LLM_JSON_OBJECT);
    CHECK(llm_json_feed(&st, ws, 1 + LLM_JSON_MAX_WS) == 0);
    CHECK(llm_json_feed(&st, " ", 1) == -1);
}

/* Every prefix of a valid document is alive and, but the whole, incomplete. */
TEST(grammar_json_every_prefix_of_a_document_is_alive) {
    const char *doc = "{\"k\": [1, -2.5e3, true, null, \"x\\u0041\"], \"o\": {\"z\": false}}";
    for (size_t i = 0; i <= strlen(doc); i++) {
        llm_json_state st;
        llm_json_init(&st, LLM_JSON_OBJECT);
        CHECK(llm_json_feed(&st, doc, i) == 0);
        CHECK(llm_json_complete(&st) == (i == strlen(doc)));
    }
}

/* A vocabulary of a few pieces, by hand: the mask keeps exactly those whose
 * bytes continue the document, each checked byte by byte apart. */
static llm_grammar_vocab *vocab_of(const char *const *pieces, int n, int eog) {
    llm_grammar_vocab *v = calloc(1, sizeof *v);
    v->n_vocab = n;
    v->off = calloc((size_t)n + 1, sizeof *v->off);
    v->eog = calloc((size_t)n, 1);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += strlen(pieces[i]);
    v->bytes = malloc(total + 1);
    for (int i = 0; i < n; i++) {
        v->off[i + 1] = v->off[i] + (uint32_t)strlen(pieces[i]);
        memcpy(v->bytes + v->off[i], pieces[i], strlen(pieces[i]));
    }
    v->by_first = malloc(sizeof *v->by_first * (size_t)n);
    v->plain = calloc((size_t)n, 1); /* as llm_grammar_vocab_new marks them */
    for (int i = 0; i < n; i++) {
        v->plain[i] = 1;
        for (const char *q = pieces[i]; *q; q++)
            if ((unsigned char)*q < 0x20 || *q == '"' || *q == '\\') v->plain[i] = 0;
    }
    v->eogs = malloc(sizeof *v->eogs);
    if (eog >= 0) v->eog[eog] = 1, v->eogs[v->n_eog++] = eog;
    int32_t k = 0; /* grouped by first byte, as llm_grammar_vocab_new does */
    for (int c = 0; c < 256; c++) {
        v->group[c] = k;
        for (int i = 0; i < n; i++)
            if (i != eog && pieces[i][0] && (unsigned char)pieces[i][0] == c) v->by_first[k++] = i;
    }
    v->group[256] = k;
    return v;
}

TEST(grammar_json_mask_keeps_exactly_the_continuations) {
    static const char *const pieces[] = {"{", "}", "\"", "\"a\":", " ", "1", "1}", "x", "", "true", ",", "<eos>", "\"}"};
    enum { V = sizeof pieces / sizeof pieces[0], EOS = 11 };
    llm_grammar_vocab *v = vocab_of(pieces, V, EOS);
    static const char *prefixes[] = {"", "{", "{\"a\":", "{\"a\":1", "{\"a\":\"", "{\"a\":1}", "{\"a\":1,"};
    for (size_t p = 0; p < sizeof prefixes / sizeof prefixes[0]; p++) {
        llm_json_state st;
        llm_json_init(&st, LLM_JSON_OBJECT);
        CHECK(llm_json_feed(&st, prefixes[p], strlen(prefixes[p])) == 0);
        float in[V], l[V];
        for (int t = 0; t < V; t++) in[t] = 1.0f;
        int32_t allowed = llm_json_mask(&st, v, in, l), count = 0;
        for (int t = 0; t < V; t++) {
            llm_json_state s = st;
            int want = t == EOS ? llm_json_complete(&st)
                                : pieces[t][0] && llm_json_feed(&s, pieces[t], strlen(pieces[t])) == 0;
            count += want;
            if (want != (l[t] == 1.0f))
                test_fail(__FILE__, __LINE__, "after '%s', piece '%s': mask %s, want %d", prefixes[p], pieces[t],
                          l[t] == 1.0f ? "keeps" : "bans", want);
        }
        CHECK_EQ_INT(allowed, count);
    }
    llm_grammar_vocab_free(v);
}

/* The sampler constrained to json_object: random logits, any temperature,
 * give a complete object ending with the end token; greedy where the mask
 * allows everything is the plain argmax. */
TEST(grammar_json_sampler_yields_objects_and_leaves_free_steps_alone) {
    static const char *const pieces[] = {"{", "}", "\"", "\"k\":", " ", "1", "2}", "x", "ab", "true", ",", "<eos>",
                                         "[", "]", "null", "\"v\"", "-", ".5", "e3", "\\n", "\n", ":"};
    enum { V = sizeof pieces / sizeof pieces[0], EOS = 11 };
    llm_grammar_vocab *v = vocab_of(pieces, V, EOS);
    test_rng r = {3};
    int n_ended = 0;
    for (int run = 0; run < 200; run++) {
        llm_sampler_params p = {.temp = run % 4 ? 1.5f : 0, .top_p = 1, .seed = (uint64_t)run, .grammar = v,
                                .json_root = LLM_JSON_OBJECT};
        llm_sampler s;
        CHECK_EQ_INT(llm_sampler_init(&s, &p, V), 0);
        char doc[4096] = "";
        size_t n = 0;
        int ended = 0;
        for (int step = 0; step < 300 && !ended; step++) {
            float l[V];
            for (int t = 0; t < V; t++) l[t] = (float)test_rng_normal(&r);
            l[EOS] -= 3; /* the end comes late */
            int32_t t = llm_sample(&s, l);
            if (t == EOS) ended = 1;
            else if (n + strlen(pieces[t]) < sizeof doc) memcpy(doc + n, pieces[t], strlen(pieces[t])), n += strlen(pieces[t]);
        }
        doc[n] = 0;
        if (ended && !accepts(doc, LLM_JSON_OBJECT)) test_fail(__FILE__, __LINE__, "run %d: not an object: %s", run, doc);
        n_ended += ended;
        llm_sampler_free(&s);
    }
    CHECK(n_ended >= 100);
    /* inside a string every piece without a quote, backslash or control byte is allowed: greedy is the argmax */
    llm_sampler_params p = {.temp = 0, .top_p = 1, .grammar = v, .json_root = LLM_JSON_OBJECT};
    llm_sampler s;
    CHECK_EQ_INT(llm_sampler_init(&s, &p, V), 0);
    llm_sampler_accept(&s, 0), llm_sampler_accept(&s, 2); /* {" */
    float l[V];
    for (int t = 0; t < V; t++) l[t] = (float)t * 0.01f;
    l[8] = 5; /* "ab" */
    CHECK_EQ_INT(llm_sample(&s, l), llm_argmax(l, V));
    llm_sampler_free(&s);
    llm_grammar_vocab_free(v);
}

/* On SmolLM2's 49152 tokens: in structural and string states the mask (its
 * first-byte groups, second-byte table and plain-string shortcut) keeps
 * exactly the tokens a byte-by-byte feed accepts; its time per call is
 * printed (the per-token cost of json_object). */
TEST(grammar_json_mask_on_smollm2_matches_byte_by_byte_feeds) {
    llm_model *m = rm_load("models/SmolLM2-135M-Instruct.Q4_1.gguf", NULL);
    if (!m) return;
    llm_grammar_vocab *v = llm_grammar_vocab_new(llm_model_tokenizer(m));
    CHECK(v != NULL);
    const int32_t V = v->n_vocab;
    float *in = malloc(sizeof(float) * (size_t)V), *out = malloc(sizeof(float) * (size_t)V);
    for (int32_t t = 0; t < V; t++) in[t] = (float)(t % 7);
    static const char *states[] = {"", "{", "{\"name\": \"", "{\"a\": 1", "{\"a\": [1, 2", "{\"a\": \"x\\",
                                   "{\"a\": tr", "{\"a\": {}"};
    for (size_t k = 0; k < sizeof states / sizeof states[0]; k++) {
        llm_json_state st;
        llm_json_init(&st, LLM_JSON_OBJECT);
        CHECK(llm_json_feed(&st, states[k], strlen(states[k])) == 0);
        const int reps = 20;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int32_t allowed = 0;
        for (int r = 0; r < reps; r++) allowed = llm_json_mask(&st, v, in, out);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        int32_t count = 0, wrong = -1;
        for (int32_t t = 0; t < V; t++) {
            llm_json_state s = st;
            const uint32_t a = v->off[t], b = v->off[t + 1];
            const int want = v->eog[t] ? llm_json_complete(&st) : a < b && llm_json_feed(&s, v->bytes + a, b - a) == 0;
            count += want;
            if (want != (out[t] == in[t]) && wrong < 0) wrong = t;
        }
        if (wrong >= 0) test_fail(__FILE__, __LINE__, "after '%s': token %d masked wrongly", states[k], (int)wrong);
        CHECK_EQ_INT(allowed, count);
        fprintf(stderr, "  json mask after '%s': %d of %d tokens allowed, %.1f us a call\n", states[k], (int)allowed,
                (int)V, ((double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-3) / reps);
    }
    free(in), free(out);
    llm_grammar_vocab_free(v);
    llm_model_free(m);
}
