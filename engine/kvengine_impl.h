/* engine/kvengine_impl.h - what the parts of the public API share
 * (engine/kvengine.c: models, contexts, requests; engine/kvsession.c:
 * sessions; engine/kvgrammar.c: grammars): the model's and the grammar's
 * handles' insides. */
#ifndef KVENGINE_IMPL_H
#define KVENGINE_IMPL_H

#include <pthread.h>

#include "model/model.h"
#include "text/grammar.h"

struct kve_model {
    llm_model *m;
    pthread_mutex_t mu;          /* guards vocab's making */
    llm_grammar_vocab *vocab;    /* every token's bytes, made at the first grammar */
};

/* The model's grammar vocabulary, made on first use (any thread); NULL when
 * out of memory. */
const llm_grammar_vocab *kve_model_grammar_vocab(const kve_model *m);
struct kve_grammar {
    struct llm_gbnf *rules;   /* bound to the model's vocabulary (kve_model_grammar_vocab) */
};

#endif
