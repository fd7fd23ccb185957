/* engine/kvengine_impl.h - what the two halves of the public API
 * (engine/kvengine.c: models, contexts, requests; engine/kvsession.c:
 * sessions, grammars) share: the model handle's insides. */
#ifndef KVENGINE_IMPL_H
#define KVENGINE_IMPL_H

#include "model/model.h"

struct kve_model {
    llm_model *m;
};

#endif
