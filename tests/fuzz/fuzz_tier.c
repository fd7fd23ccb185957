/* tests/fuzz/fuzz_tier.c - libFuzzer target for the disk tier's page files
 * (engine/gen/tier.h, llm_tier_parse), untrusted input read back at admission.
 *
 * What a lookup expects is taken from the input's own header where it has
 * one (group, fingerprint, names, token count, data size, tokens), so that
 * mutations get past the field checks to the size and checksum; the first
 * byte, when odd, recomputes the checksum too, so that they reach the token
 * comparison. Then an accepted file must hold its data inside the buffer, at
 * the place the format puts it. Any crash, sanitizer report or trap is a bug.
 * Seeds: tests/fuzz/corpus_tier (files written by the tier).
 *
 *   make fuzz */
#include "../../engine/gen/tier.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(c) do { if (!(c)) __builtin_trap(); } while (0)

enum { HEADER = 56 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int fix = data[0] & 1;
    size--, data++;
    unsigned char *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    uint32_t group = 0, hp = 0, nt = 0;
    uint64_t fp = 0, h = 0, ph = 0, db = 0;
    if (size >= HEADER) {
        memcpy(&group, buf + 12, 4), memcpy(&fp, buf + 16, 8), memcpy(&h, buf + 24, 8), memcpy(&ph, buf + 32, 8);
        memcpy(&hp, buf + 40, 4), memcpy(&nt, buf + 44, 4), memcpy(&db, buf + 48, 8);
    }
    int32_t n_tokens = nt > 4096 ? 4096 : (int32_t)nt;
    int32_t *tokens = calloc((size_t)n_tokens + 1, sizeof *tokens);
    size_t have = size > HEADER ? (size - HEADER) / sizeof(int32_t) : 0;
    memcpy(tokens, buf + (size > HEADER ? HEADER : 0), sizeof(int32_t) * (have < (size_t)n_tokens ? have : (size_t)n_tokens));
    if (fix && size >= HEADER + 8) {
        uint64_t sum = llm_tier_checksum(buf, size - 8);
        memcpy(buf + size - 8, &sum, 8);
    }
    size_t data_bytes = db > (1u << 30) ? (1u << 30) : (size_t)db;
    const unsigned char *out = NULL;
    if (llm_tier_parse(buf, size, group, fp, h, ph, (int)hp, tokens, n_tokens, data_bytes, &out) == 0) {
        REQUIRE(out == buf + HEADER + sizeof(int32_t) * (size_t)n_tokens);
        REQUIRE(out + data_bytes + 8 == buf + size);
    }
    /* and against expectations that do not match */
    llm_tier_parse(buf, size, group + 1, fp, h, ph, (int)hp, tokens, n_tokens, data_bytes, &out);
    llm_tier_parse(buf, size, group, fp, h, ph, (int)hp, tokens, n_tokens, data_bytes + 1, &out);
    free(tokens);
    free(buf);
    return 0;
}
