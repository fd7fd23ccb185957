/* tests/fuzz/fuzz_request.c - libFuzzer target: any bytes as the body of each
 * kind of server request (server/request.c). The parse must return a valid
 * request or a 400 with a message, never crash or leak; a valid request's
 * fields must be within the ranges the scheduler is promised (a session name
 * is one file name). Wrapped in more arrays than SRV_MAX_DEPTH, any input
 * must get the nesting error. A completion's list of prompts is each a text
 * or a non-empty list of ids, within SRV_MAX_REPLIES choices. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../server/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input inside k arrays, k from its first byte around the limit (up to
 * 1000 levels past it): beyond SRV_MAX_DEPTH the parse must refuse it by
 * naming the limit, whatever the input holds (it may close the arrays itself,
 * or open a string that hides the closing brackets). */
static void check_nesting(const uint8_t *data, size_t size) {
    size_t k = size ? (data[0] < 128 ? SRV_MAX_DEPTH - 4 + data[0] % 8 : SRV_MAX_DEPTH + (size_t)data[0] * 4) : 0;
    char *body = malloc(2 * k + size + 1);
    if (!body) return;
    memset(body, '[', k);
    memcpy(body + k, data, size);
    memset(body + k + size, ']', k);
    srv_request r;
    srv_error e;
    for (int kind = SRV_CHAT; kind <= SRV_DETOKENIZE; kind++) {
        if (!srv_request_parse((srv_kind)kind, body, 2 * k + size, &r, &e)) abort();   /* an array is no request */
        if (k > SRV_MAX_DEPTH && !strstr(e.message, "levels")) abort();
    }
    free(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check_nesting(data, size);
    for (int kind = SRV_CHAT; kind <= SRV_DETOKENIZE; kind++) {
        srv_request r;
        srv_error e;
        if (srv_request_parse((srv_kind)kind, (const char *)data, size, &r, &e)) {
            if (e.status != 400 && e.status != 500) abort();
            if (!e.message[0] || !e.type) abort();
            continue;
        }
        if (r.n_stops < 0 || r.n_stops > KVE_MAX_STOPS) abort();
        for (int32_t i = 0; i < r.n_stops; i++)
            if (!r.stops[i] || !r.stops[i][0]) abort();
        if (r.n < 1 || r.n > 16 || r.top_logprobs < 0 || r.top_logprobs > SRV_MAX_TOP_LOGPROBS) abort();
        if (r.max_tokens != -1 && (r.max_tokens < 1 || r.max_tokens > (1 << 24))) abort();
        if (!(r.temperature >= 0 && r.temperature <= 2) || !(r.top_p > 0 && r.top_p <= 1)) abort();
        if (kind == SRV_CHAT) {
            if (r.n_msgs < 1) abort();
            for (int32_t i = 0; i < r.n_msgs; i++)
                if (!r.msgs[i].role || !r.msgs[i].content || strlen(r.msgs[i].role) == 0) abort();
        }
        if ((kind == SRV_COMPLETION || kind == SRV_TOKENIZE) && !r.prompt && !r.tokens && !r.n_prompts) abort();
        if (r.n_prompts < 0 || r.n_prompts * r.n > SRV_MAX_REPLIES || (r.n_prompts && (r.prompt || r.tokens || r.session)))
            abort();
        for (int32_t k = 0; k < r.n_prompts; k++) {   /* a list's prompts: each a text or a non-empty list of ids */
            if (!r.prompts[k].text == !r.prompts[k].ids || (r.prompts[k].ids && r.prompts[k].n_ids < 1)) abort();
            for (int32_t i = 0; i < r.prompts[k].n_ids; i++)
                if (r.prompts[k].ids[i] < 0) abort();
        }
        for (int32_t i = 0; i < r.n_tokens; i++)
            if (r.tokens[i] < 0) abort();
        if (r.session) { /* one file name in the session directory, never a path */
            size_t n = strlen(r.session);
            if (n < 1 || n > SRV_MAX_SESSION_NAME || r.session[0] == '.' || strchr(r.session, '/')) abort();
            for (size_t i = 0; i < n; i++)
                if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-", r.session[i])) abort();
        }
        srv_request_free(&r);
    }
    return 0;
}
