/* tests/fuzz/fuzz_grammar.c - libFuzzer target: any bytes into the JSON
 * recognizer (engine/text/grammar.c), whole and split at the first byte's
 * offset. Feeding in two pieces must end in the same state as in one; a
 * refused input stays refused; an accepted complete object must still be
 * one after trailing whitespace; never a crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/text/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int root = LLM_JSON_ANY; root <= LLM_JSON_OBJECT; root++) {
        llm_json_state a, b;
        llm_json_init(&a, (llm_json_root)root), llm_json_init(&b, (llm_json_root)root);
        int ra = llm_json_feed(&a, (const char *)data, size);
        size_t cut = size ? data[0] % (size + 1) : 0;
        int rb = llm_json_feed(&b, (const char *)data, cut);
        if (rb == 0) rb = llm_json_feed(&b, (const char *)data + cut, size - cut);
        if (ra != rb || memcmp(&a, &b, sizeof a) != 0) abort();
        if (ra != 0 && llm_json_feed(&a, "{", 1) != -1) abort();
        if (ra == 0 && llm_json_complete(&a) && root == LLM_JSON_OBJECT && a.ws < LLM_JSON_MAX_WS) {
            if (llm_json_feed(&a, " ", 1) != 0 || !llm_json_complete(&a)) abort();
        }
    }
    return 0;
}
