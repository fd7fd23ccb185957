/* engine/status.c - names of the engine's return codes and the error-message
 * helper (engine/status.h). */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>

const char *llm_status_str(int status) {
    switch (status) {
    case LLM_ERR_TOKEN: return "a token id is outside the vocabulary";
    case LLM_ERR_PARAM: return "a parameter is out of range";
    case LLM_ERR_MODEL: return "the file cannot be run as a model";
    case LLM_ERR_NONFINITE: return "the model produced non-finite logits (NaN or infinity)";
    case LLM_ERR_QUEUE_FULL: return "too many requests are waiting; try again later";
    case LLM_ERR_TOO_LARGE: return "the request can never fit the context or the cache pool";
    case LLM_ERR_STOPPED: return "the scheduler is shutting down";
    default: return kv_status_str(status);
    }
}

int llm_errf(char *err, size_t n, int status, const char *fmt, ...) {
    if (err && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return status;
}
