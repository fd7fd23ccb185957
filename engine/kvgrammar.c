/* engine/kvgrammar.c - the public API's grammars (include/kvengine.h): a
 * kve_grammar is GBNF rules (written, compiled from a JSON Schema, or made
 * for a model's tool calls) bound to its model's vocabulary, which contexts
 * and sessions then constrain sampling with. */
#include "kvengine.h"
#include "kvengine_impl.h"

#include "text/gbnf.h"
#include "text/grammar.h"

#include <stdlib.h>
#include <string.h>

/* rules bound to m's vocabulary as a kve_grammar in *out; takes rules. */
static int grammar_new(const kve_model *m, llm_gbnf *rules, kve_grammar **out, char *err, size_t errlen) {
    const llm_grammar_vocab *v = kve_model_grammar_vocab(m);
    kve_grammar *g = v ? calloc(1, sizeof *g) : NULL;
    if (!g || llm_gbnf_bind(rules, v)) {
        free(g);
        llm_gbnf_free(rules);
        return llm_errf(err, errlen, KVE_ERR_NOMEM, "out of memory for the grammar");
    }
    g->rules = rules;
    *out = g;
    return KVE_OK;
}

int kve_grammar_parse(const kve_model *m, const char *text, size_t len, int json_schema, kve_grammar **out,
                      char *err, size_t errlen) {
    if (!out) return llm_errf(err, errlen, KVE_ERR_NULL, "missing argument");
    *out = NULL;
    if (!m || (!text && len)) return llm_errf(err, errlen, KVE_ERR_NULL, "no model or no text");
    llm_gbnf *rules = json_schema ? llm_json_schema_compile(text ? text : "", len, err, errlen)
                                  : llm_gbnf_parse(text ? text : "", len, err, errlen);
    if (!rules) return KVE_ERR_PARAM;
    return grammar_new(m, rules, out, err, errlen);
}

int kve_grammar_check(const char *text, size_t len, int json_schema, char *err, size_t errlen) {
    if (!text && len) return llm_errf(err, errlen, KVE_ERR_NULL, "no text");
    llm_gbnf *rules = json_schema ? llm_json_schema_compile(text ? text : "", len, err, errlen)
                                  : llm_gbnf_parse(text ? text : "", len, err, errlen);
    if (!rules) return KVE_ERR_PARAM;
    llm_gbnf_free(rules);
    return KVE_OK;
}

int kve_grammar_tool_calls(const kve_model *m, int32_t n, const char *const *names, const char *const *schemas,
                           const char *head, const char *args_key, const char *tail, kve_grammar **out, char *err,
                           size_t errlen) {
    if (!out) return llm_errf(err, errlen, KVE_ERR_NULL, "missing argument");
    *out = NULL;
    if (!m || !names || !schemas || !head || !args_key || !tail)
        return llm_errf(err, errlen, KVE_ERR_NULL, "missing argument");
    if (n < 1 || n > 64) return llm_errf(err, errlen, KVE_ERR_PARAM, "n must be in [1, 64] functions; got %d", (int)n);
    for (int32_t i = 0; i < n; i++)
        if (!names[i] || !schemas[i])
            return llm_errf(err, errlen, KVE_ERR_PARAM, "function %d has no name or no schema", (int)i);
    char *text = llm_json_call_grammar(n, names, schemas, head, args_key, tail, err, errlen);
    llm_gbnf *rules = text ? llm_gbnf_parse(text, strlen(text), err, errlen) : NULL;
    free(text);
    if (!rules) return KVE_ERR_PARAM;
    return grammar_new(m, rules, out, err, errlen);
}

void kve_grammar_free(kve_grammar *g) {
    if (!g) return;
    llm_gbnf_free(g->rules);
    free(g);
}
