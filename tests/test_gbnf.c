/* tests/test_gbnf.c - GBNF grammars and JSON schemas: documents accepted and
 * refused, compile errors that name what is wrong, the token mask against
 * byte-by-byte feeds (SmolLM2's vocabulary and a synthesized one of 150k
 * tokens, with the time a call), and greedy decoding under a grammar that
 * allows everything equal to greedy decoding without one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test.h"
#include "../engine/text/gbnf.h"
#include "../engine/gen/sampler.h"
#include "real_model.h"

static llm_gbnf *compile(const char *text) {
    char err[256];
    llm_gbnf *g = llm_gbnf_parse(text, strlen(text), err, sizeof err);
    if (!g) test_fail(__FILE__, __LINE__, "grammar refused: %s", err);
    return g;
}

static int accepts(const llm_gbnf *g, const char *doc) {
    llm_gbnf_state *st = llm_gbnf_state_new(g);
    int ok = llm_gbnf_feed(st, doc, strlen(doc)) == 0 && llm_gbnf_complete(st);
    llm_gbnf_state_free(st);
    return ok;
}

static void check_docs(const llm_gbnf *g, const char *const *good, size_t n_good, const char *const *bad, size_t n_bad,
                       int line) {
    for (size_t i = 0; i < n_good; i++)
        if (!accepts(g, good[i])) test_fail(__FILE__, line, "refused '%s'", good[i]);
    for (size_t i = 0; i < n_bad; i++)
        if (accepts(g, bad[i])) test_fail(__FILE__, line, "accepted '%s'", bad[i]);
}

TEST(gbnf_accepts_and_rejects_documents) {
    llm_gbnf *g = compile("# arithmetic\n"
                          "root ::= expr\n"
                          "expr ::= term ( [-+] term )*\n"
                          "term ::= factor ( [*/] factor )*\n"
                          "factor ::= num | \"(\" expr \")\"\n"
                          "num ::= \"-\"? [0-9]+ ( \".\" [0-9]{1,3} )?\n");
    static const char *const good[] = {"1", "1+2", "(1+2)*3", "-4.5/2", "((((7))))", "10.123-0"};
    static const char *const bad[] = {"", "+1", "1+", "(1", "1.2345", "1..2", "a", "1)"};
    check_docs(g, good, 6, bad, 8, __LINE__);
    llm_gbnf_free(g);
    /* alternatives over lines, classes with escapes and negation, counts */
    g = compile("root ::= greeting \" \" name \"!\"?\n"
                "greeting ::= \"hello\"\n"
                "  | \"hi\" | \"\\x68ey\"\n"
                "name ::= [A-Z] [^ !\\n]{1,5}\n");
    static const char *const good2[] = {"hello World!", "hi Bob", "hey Zzzzzz"};
    static const char *const bad2[] = {"hello world", "yo Bob", "hi Bobbbbb", "hi B", "hi Bob!!", "hi Bo b"};
    check_docs(g, good2, 3, bad2, 6, __LINE__);
    llm_gbnf_free(g);
    /* every prefix of a good document is alive; complete only at its end */
    g = compile("root ::= \"{\" ( [a-z]+ \":\" [0-9]* ) ( \",\" [a-z]+ \":\" [0-9]* )* \"}\"");
    const char *doc = "{ab:12,c:,de:3}";
    for (size_t i = 0; i <= strlen(doc); i++) {
        llm_gbnf_state *st = llm_gbnf_state_new(g);
        CHECK(llm_gbnf_feed(st, doc, i) == 0);
        CHECK(llm_gbnf_complete(st) == (i == strlen(doc)));
        llm_gbnf_state_free(st);
    }
    llm_gbnf_free(g);
    /* {m,n} of a group, and unicode literals as UTF-8 */
    g = compile("root ::= (\"ab\" | \"c\"){2,3} \"\\u00e9\"");
    static const char *const good3[] = {"abc\xc3\xa9", "cc\xc3\xa9", "ababab\xc3\xa9"};
    static const char *const bad3[] = {"ab\xc3\xa9", "abababc\xc3\xa9", "cce"};
    check_docs(g, good3, 3, bad3, 3, __LINE__);
    llm_gbnf_free(g);
}

TEST(gbnf_compile_errors_name_what_is_wrong) {
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"root ::= foo", "'foo' is used but not defined"},
        {"a ::= \"x\"", "no rule 'root'"},
        {"root ::= root \"a\" | \"b\"", "left-recursive"},
        {"root ::= x\nx ::= \"\"? root", "left-recursive"},
        {"root ::= \"abc", "not closed"},
        {"root ::= [a-", "not closed"},
        {"root ::= \"\\q\"", "unknown escape"},
        {"root ::= \"a\"{2000}", "above 1024"},
        {"root ::= \"a\"{3,2}", "goes down"},
        {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
        {"root ::= (\"a\"", "expected ')'"},
        {"root = \"a\"", "expected '::='"},
        {"root ::= [\\u0100]", "holds bytes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[256];
        llm_gbnf *g = llm_gbnf_parse(cases[i].text, strlen(cases[i].text), err, sizeof err);
        if (g || !strstr(err, cases[i].want))
            test_fail(__FILE__, __LINE__, "'%s': %s (want '%s')", cases[i].text, g ? "accepted" : err, cases[i].want);
        llm_gbnf_free(g);
    }
}

static llm_gbnf *schema(const char *s) {
    char err[320];
    llm_gbnf *g = llm_json_schema_compile(s, strlen(s), err, sizeof err);
    if (!g) test_fail(__FILE__, __LINE__, "schema refused: %s", err);
    return g;
}

/* A schema's documents are JSON (checked by the independent JSON recognizer
 * of engine/text/grammar.h) and match the schema. */
TEST(gbnf_json_schema_accepts_and_rejects_documents) {
    llm_gbnf *g = schema("{\"type\":\"object\",\"properties\":{"
                         "\"name\":{\"type\":\"string\"},"
                         "\"age\":{\"type\":\"integer\"},"
                         "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"minItems\":1,\"maxItems\":2},"
                         "\"kind\":{\"enum\":[\"a\",\"b\",3,null]},"
                         "\"v\":{\"const\":{\"x\":[1,\"\\u0041\"]}},"
                         "\"n\":{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"null\"}]},"
                         "\"ok\":{\"type\":[\"boolean\",\"null\"]}},"
                         "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}");
    static const char *const good[] = {
        "{\"name\":\"x\",\"age\":3}",
        " {\"name\": \"J\\u00e9 \\\"q\\\"\", \"age\": -12, \"tags\": [\"a\", \"b\"]} ",
        "{\"name\":\"\",\"age\":0,\"kind\":3,\"v\":{\"x\":[1,\"A\"]},\"n\":1.5e3,\"ok\":null}",
        "{\"name\":\"x\",\"age\":1,\"ok\":true}",
        "{\n  \"name\": \"x\",\n  \"age\": 1,\n  \"kind\": null\n}",
    };
    static const char *const bad[] = {
        "{\"age\":3}",                                  /* name is required */
        "{\"age\":3,\"name\":\"x\"}",                   /* properties in the schema's order */
        "{\"name\":\"x\",\"age\":3.5}",                 /* integer */
        "{\"name\":\"x\",\"age\":3,\"tags\":[]}",       /* minItems */
        "{\"name\":\"x\",\"age\":3,\"tags\":[\"a\",\"b\",\"c\"]}", /* maxItems */
        "{\"name\":\"x\",\"age\":3,\"kind\":\"c\"}",    /* enum */
        "{\"name\":\"x\",\"age\":3,\"other\":1}",       /* no additional properties */
        "{\"name\":\"x\",\"age\":3,\"ok\":1}",          /* type list */
        "{\"name\":\"x\",\"age\":03}",                  /* JSON numbers */
        "{\"name\":\"x\",\"age\":3,}",
        "{\"name\":\"x\n\",\"age\":3}",                 /* raw control byte in a string */
        "{\"name\":\"x\",\"age\":3,\"v\":{\"x\":[1,\"B\"]}}", /* const */
    };
    check_docs(g, good, sizeof good / sizeof *good, bad, sizeof bad / sizeof *bad, __LINE__);
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        llm_json_state js;
        llm_json_init(&js, LLM_JSON_OBJECT);
        CHECK(llm_json_feed(&js, good[i], strlen(good[i])) == 0 && llm_json_complete(&js));
    }
    llm_gbnf_free(g);
    /* no type: any JSON value; a type list at the top */
    g = schema("{}");
    static const char *const any[] = {"1", "[1,{\"a\":null}]", "\"s\"", "true"};
    static const char *const notjson[] = {"[1,]", "{a:1}", "tru"};
    check_docs(g, any, 4, notjson, 3, __LINE__);
    llm_gbnf_free(g);
}

TEST(gbnf_json_schema_refuses_what_it_does_not_support_by_name) {
    static const struct {
        const char *schema, *want;
    } cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"^a\"}", "keyword 'pattern' is not supported (at the top)"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"date\"}}}",
         "keyword 'format' is not supported (at /properties/a)"},
        {"{\"$ref\":\"#/$defs/x\"}", "keyword '$ref'"},
        {"{\"type\":\"array\",\"items\":{\"minimum\":1}}", "keyword 'minimum' is not supported (at /items)"},
        {"{\"anyOf\":[{\"type\":\"string\"},{\"oneOf\":[]}]}", "keyword 'oneOf' is not supported (at /anyOf/1)"},
        {"{\"type\":\"object\",\"additionalProperties\":true}", "'additionalProperties' is only supported as false"},
        {"{\"type\":\"strin\"}", "not a JSON Schema type"},
        {"{\"type\":\"object\",\"properties\":{},\"required\":[\"a\"]}", "not in 'properties'"},
        {"{\"type\":\"array\",\"maxItems\":5000}", "'maxItems' must be an integer"},
        {"{\"type\":", "not valid JSON"},
        {"[1]", "a schema must be an object"},
        {"{\"type\":\"string\"} x", "something follows it"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[320];
        llm_gbnf *g = llm_json_schema_compile(cases[i].schema, strlen(cases[i].schema), err, sizeof err);
        if (g || !strstr(err, cases[i].want))
            test_fail(__FILE__, __LINE__, "%s: %s (want '%s')", cases[i].schema, g ? "accepted" : err, cases[i].want);
        llm_gbnf_free(g);
    }
}

/* The mask of state st over vocabulary v against feeding each token's
 * bytes apart; returns the microseconds a call (over reps calls). */
static double mask_check(llm_gbnf *g, const llm_grammar_vocab *v, const char *prefix, int reps, int32_t *n_allowed) {
    const int32_t V = v->n_vocab;
    float *in = malloc(sizeof(float) * (size_t)V), *out = malloc(sizeof(float) * (size_t)V);
    for (int32_t t = 0; t < V; t++) in[t] = (float)(t % 7);
    llm_gbnf_state *st = llm_gbnf_state_new(g);
    CHECK(llm_gbnf_feed(st, prefix, strlen(prefix)) == 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int32_t allowed = 0;
    for (int r = 0; r < reps; r++) allowed = llm_gbnf_mask(st, in, out);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const int complete = llm_gbnf_complete(st);
    int32_t count = 0, wrong = -1;
    for (int32_t t = 0; t < V; t++) {
        const uint32_t a = v->off[t], b = v->off[t + 1];
        int want;
        if (v->eog[t]) {
            want = complete;
        } else {
            llm_gbnf_state *s = llm_gbnf_state_new(g);
            want = a < b && llm_gbnf_feed(s, prefix, strlen(prefix)) == 0 && llm_gbnf_feed(s, v->bytes + a, b - a) == 0;
            llm_gbnf_state_free(s);
        }
        count += want;
        if (want != (out[t] == in[t]) && wrong < 0) wrong = t;
    }
    if (wrong >= 0) test_fail(__FILE__, __LINE__, "after '%s': token %d masked wrongly", prefix, (int)wrong);
    CHECK_EQ_INT(allowed, count);
    *n_allowed = allowed;
    llm_gbnf_state_free(st);
    free(in), free(out);
    return ((double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-3) / reps;
}

static const char *const bench_schema =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"ok\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"age\",\"tags\",\"ok\"]}";
static const char *const bench_states[] = {"", "{", "{\"name\": \"", "{\"name\": \"Jo", "{\"name\": \"Jo\", \"age\": 4",
                                           "{\"name\": \"x\", \"age\": 1, \"tags\": [", "{\"name\": \"x\", \"age\": 1, \"tags\": [], \"ok\": true}"};

static void mask_states(llm_gbnf *g, const llm_grammar_vocab *v, const char *what) {
    CHECK_EQ_INT(llm_gbnf_bind(g, v), 0);
    for (size_t k = 0; k < sizeof bench_states / sizeof *bench_states; k++) {
        int32_t allowed = 0;
        double us = mask_check(g, v, bench_states[k], 5, &allowed);
        fprintf(stderr, "  %s schema mask after '%s': %d of %d tokens allowed, %.1f us a call\n", what,
                bench_states[k], (int)allowed, (int)v->n_vocab, us);
    }
}

/* SmolLM2's vocabulary, and one of 150k tokens synthesized from it: its
 * 49152 tokens and 101k more, each two of its tokens joined (BPE merges
 * look like that), with the same byte statistics. */
TEST(gbnf_mask_matches_byte_by_byte_feeds_at_49k_and_150k_tokens) {
    llm_model *m = rm_load("models/SmolLM2-135M-Instruct.Q4_1.gguf", NULL);
    if (!m) return;
    llm_grammar_vocab *v = llm_grammar_vocab_new(llm_model_tokenizer(m));
    CHECK(v != NULL);
    llm_gbnf *g = schema(bench_schema);
    mask_states(g, v, "49k");
    enum { BIG = 150000 };
    uint32_t *off = malloc(sizeof *off * (BIG + 1));
    uint8_t *eog = calloc(BIG, 1);
    size_t cap = (size_t)v->off[v->n_vocab] + (size_t)(BIG - v->n_vocab) * 24 + 16, used = 0;
    char *bytes = malloc(cap);
    test_rng r = {11};
    for (int32_t t = 0; t < BIG; t++) {
        off[t] = (uint32_t)used;
        if (t < v->n_vocab) {
            memcpy(bytes + used, v->bytes + v->off[t], v->off[t + 1] - v->off[t]);
            used += v->off[t + 1] - v->off[t], eog[t] = v->eog[t];
            continue;
        }
        for (int k = 0; k < 2; k++) {
            int32_t a = (int32_t)(test_rng_u64(&r) % (uint64_t)v->n_vocab);
            uint32_t n = v->off[a + 1] - v->off[a];
            if (n > 12) n = 12;
            memcpy(bytes + used, v->bytes + v->off[a], n), used += n;
        }
    }
    off[BIG] = (uint32_t)used;
    llm_grammar_vocab *big = llm_grammar_vocab_from_bytes(BIG, off, bytes, eog);
    CHECK(big != NULL);
    mask_states(g, big, "150k");
    llm_grammar_vocab_free(big);
    free(off), free(eog), free(bytes);
    llm_gbnf_free(g);
    llm_grammar_vocab_free(v);
    llm_model_free(m);
}

/* Greedy decoding with a grammar that allows every byte string picks the
 * same tokens as greedy decoding without one. */
TEST(gbnf_greedy_under_an_allow_all_grammar_equals_plain_greedy) {
    llm_model *m = rm_load("models/SmolLM2-135M-Instruct.Q4_1.gguf", NULL);
    if (!m) return;
    llm_context *c = rm_context(m, 1, 256, 64, KV_F32);
    const int32_t V = llm_model_n_vocab(m);
    llm_grammar_vocab *v = llm_grammar_vocab_new(llm_model_tokenizer(m));
    llm_gbnf *g = compile("root ::= [\\x00-\\xFF]*");
    CHECK_EQ_INT(llm_gbnf_bind(g, v), 0);
    llm_sampler plain, ruled;
    llm_sampler_params p = {.temp = 0, .top_p = 1}, q = p;
    q.rules = g;
    CHECK_EQ_INT(llm_sampler_init(&plain, &p, V), 0);
    CHECK_EQ_INT(llm_sampler_init(&ruled, &q, V), 0);
    int32_t prompt[64];
    const char *text = "Write a short poem about the sea:";
    int32_t n = llm_tokenize(llm_model_tokenizer(m), text, strlen(text), 1, 0, prompt, 64);
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t seq;
    CHECK_EQ_INT(llm_seq_new(c, &seq), LLM_OK);
    int rc = llm_eval(c, seq, prompt, n, 0, logits, NULL, NULL);
    int steps = 0;
    while (rc == LLM_OK && steps < 48) {
        int32_t a = llm_sample(&plain, logits), b = llm_sample(&ruled, logits);
        CHECK_EQ_INT(a, b);
        if (a != b || llm_token_is_eog(llm_model_tokenizer(m), a)) break;
        rc = llm_eval(c, seq, &a, 1, 0, logits, NULL, NULL);
        steps++;
    }
    CHECK(steps >= 16);
    free(logits);
    llm_sampler_free(&plain), llm_sampler_free(&ruled);
    llm_gbnf_free(g);
    llm_grammar_vocab_free(v);
    llm_context_free(c);
    llm_model_free(m);
}

/* A tool call's grammar in both layouts the server writes (Hermes's
 * <tool_call> block with "arguments", Llama 3's bare object with
 * "parameters"): one call of one of the functions, its arguments a
 * document of that function's schema. */
TEST(gbnf_call_grammar_holds_one_call_with_arguments_of_its_schema) {
    const char *names[] = {"get_weather", "add"};
    const char *schemas[] = {"{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}",
                             "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}},"
                             "\"required\":[\"a\",\"b\"]}"};
    char err[256];
    for (int llama3 = 0; llama3 < 2; llama3++) {
        char *text = llm_json_call_grammar(2, names, schemas, llama3 ? "" : "<tool_call>\n", llama3 ? "parameters" : "arguments",
                                           llama3 ? "" : "\n</tool_call>", err, sizeof err);
        CHECK(text != NULL);
        llm_gbnf *g = text ? compile(text) : NULL;
        free(text);
        if (!g) continue;
        char good[3][200], bad[5][200];
        const char *h = llama3 ? "" : "<tool_call>\n", *t = llama3 ? "" : "\n</tool_call>", *k = llama3 ? "parameters" : "arguments";
        snprintf(good[0], 200, "%s{\"name\": \"add\", \"%s\": {\"a\": 1, \"b\": -2}}%s", h, k, t);
        snprintf(good[1], 200, "%s{\"name\": \"get_weather\", \"%s\": {\"city\":\"Paris\"}}%s", h, k, t);
        snprintf(good[2], 200, "%s{\"name\": \"get_weather\", \"%s\": {\n  \"city\": \"\"\n}}%s", h, k, t);
        snprintf(bad[0], 200, "%s{\"name\": \"sub\", \"%s\": {\"a\": 1, \"b\": 2}}%s", h, k, t);      /* no such function */
        snprintf(bad[1], 200, "%s{\"name\": \"add\", \"%s\": {\"a\": 1}}%s", h, k, t);                /* b required */
        snprintf(bad[2], 200, "%s{\"name\": \"add\", \"%s\": {\"city\": \"x\"}}%s", h, k, t);         /* the other's arguments */
        snprintf(bad[3], 200, "%s{\"name\": \"add\", \"%s\": {\"a\": 1, \"b\": 2}}", h, llama3 ? "arguments" : "parameters");
        snprintf(bad[4], 200, "%s{\"name\": \"add\", \"%s\": {\"a\": 1.5, \"b\": 2}}%s", h, k, t);    /* integers */
        const char *gp[3] = {good[0], good[1], good[2]}, *bp[5] = {bad[0], bad[1], bad[2], bad[3], bad[4]};
        check_docs(g, gp, 3, bp, 5, __LINE__);
        llm_gbnf_free(g);
    }
}
