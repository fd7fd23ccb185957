/* tests/fuzz/fuzz_gbnf.c - libFuzzer target: any bytes into the grammar
 * compiler and the JSON Schema compiler (engine/text/gbnf.c, json_schema.c),
 * then a document into the recognizer. The input is a text, a NUL, and a
 * document; the first byte's low bit picks the compiler. Never a crash;
 * a schema's grammar text always compiles; a document fed whole or in two
 * pieces ends alike; a document a schema accepts is JSON (the recognizer
 * of engine/text/grammar.h agrees) when it nests little enough for that one. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/text/gbnf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int shallow(const uint8_t *d, size_t n) {
    int depth = 0, max = 0;
    for (size_t i = 0; i < n; i++) {
        depth += d[i] == '[' || d[i] == '{';
        depth -= d[i] == ']' || d[i] == '}';
        if (depth > max) max = depth;
    }
    return max < 32;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int schema = data[0] & 1;
    data++, size--;
    const uint8_t *nul = memchr(data, 0, size);
    const size_t text_len = nul ? (size_t)(nul - data) : size;
    const uint8_t *doc = nul ? nul + 1 : data + size;
    const size_t doc_len = nul ? size - text_len - 1 : 0;
    char err[320];
    llm_gbnf *g;
    if (schema) {
        char *t = llm_json_schema_grammar((const char *)data, text_len, err, sizeof err);
        if (!t) return 0;
        g = llm_gbnf_parse(t, strlen(t), err, sizeof err);
        if (!g && strstr(err, "out of memory") == NULL) abort(); /* a schema's grammar must compile */
        free(t);
    } else {
        g = llm_gbnf_parse((const char *)data, text_len, err, sizeof err);
    }
    if (!g) return 0;
    llm_gbnf_state *a = llm_gbnf_state_new(g), *b = llm_gbnf_state_new(g);
    if (a && b) {
        int ra = llm_gbnf_feed(a, (const char *)doc, doc_len);
        size_t cut = doc_len ? doc[0] % (doc_len + 1) : 0;
        int rb = llm_gbnf_feed(b, (const char *)doc, cut);
        if (rb == 0) rb = llm_gbnf_feed(b, (const char *)doc + cut, doc_len - cut);
        if (ra != rb) abort();
        const int ca = ra == 0 && llm_gbnf_complete(a);
        if (ca != (rb == 0 && llm_gbnf_complete(b))) abort();
        if (schema && ca && shallow(doc, doc_len)) {
            llm_json_state js;
            llm_json_init(&js, LLM_JSON_ANY);
            if (llm_json_feed(&js, (const char *)doc, doc_len) != 0 || !llm_json_complete(&js)) abort();
        }
    }
    llm_gbnf_state_free(a), llm_gbnf_state_free(b);
    llm_gbnf_free(g);
    return 0;
}
