/* server/request.h - the server's request bodies: JSON bytes in, a validated
 * request or an error (HTTP status, type, message) out. A pure function of the
 * bytes (no model, no scheduler), so a fuzzer can drive it alone.
 *
 * Field names are the OpenAI API's (chat/completions, completions) and
 * llama.cpp's server (tokenize, detokenize). JSON null counts as absent.
 * Generation requests are held to one table of fields (srv_fields, the one
 * docs/SERVER.md shows): a field is honoured, an extension, accepted without
 * effect (identifiers such as "user"), or refused with a 400 naming it; a
 * field the table does not know is refused too, so nothing a client asks
 * for is ever silently dropped. */
#ifndef SRV_REQUEST_H
#define SRV_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "kvengine.h"

typedef enum {
    SRV_CHAT = 0,        /* POST /v1/chat/completions: messages */
    SRV_COMPLETION,      /* POST /v1/completions: prompt */
    SRV_TOKENIZE,        /* POST /tokenize: content */
    SRV_DETOKENIZE,      /* POST /detokenize: tokens */
} srv_kind;

/* An error as the HTTP reply carries it: {"error":{"message","type","code"}}
 * with code = status. */
typedef struct {
    int status;              /* 400, 401, 404, 405, 413, 503, 500 */
    const char *type;        /* "invalid_request_error", "authentication_error", ... */
    char message[320];
} srv_error;

/* Fills e and returns -1. */
int srv_error_set(srv_error *e, int status, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* SRV_MAX_DEPTH: arrays and objects nested deeper than this are refused
 * before the JSON parser sees them (jansson recurses once per level, on a
 * civetweb worker's small stack); a valid request nests 4 deep. */
/* SRV_MAX_REPLIES: choices of one completion request, prompts times n. */
enum { SRV_MAX_REPLIES = 128, SRV_MAX_TOOLS = 64, SRV_MAX_LOGIT_BIAS = 1024, SRV_MAX_MESSAGES = 1024, SRV_MAX_TOP_LOGPROBS = 20, SRV_MAX_SESSION_NAME = 128, SRV_MAX_DEPTH = 64 };

typedef struct {
    srv_kind kind;
    void *root;                  /* the parsed document (json_t); owns the strings below */
    const char *model;           /* "model", or NULL */
    /* chat */
    kve_chat_message *msgs;      /* [n_msgs] role and content (text parts joined) */
    int32_t n_msgs;
    char **joined;               /* [n_msgs] content strings built from parts, or NULL */
    /* completion / tokenize */
    const char *prompt;          /* prompt / content text, or NULL when given as token ids */
    size_t prompt_len;
    int32_t *tokens;             /* [n_tokens] prompt as ids (completion), or the ids (detokenize) */
    int32_t n_tokens;
    /* completion: a list of prompts (several strings, or lists of token
     * ids), each as prompt or tokens above; NULL when prompt or tokens
     * holds the one prompt */
    struct srv_prompt {
        const char *text;        /* or NULL, and the ids */
        size_t len;
        int32_t *ids;            /* [n_ids] malloc'ed */
        int32_t n_ids;
    } *prompts;
    int32_t n_prompts;
    int add_special;             /* tokenize: add BOS as the model says (default 0) */
    int with_pieces;             /* tokenize: return each token's text as well */
    int parse_special;           /* completion, tokenize: control tokens written in the text
                                  * ("<|im_start|>") become their ids (default 0: text) */
    /* sampling and stopping */
    int64_t max_tokens;          /* max_tokens / max_completion_tokens; -1 when absent */
    double temperature;          /* default 1 (OpenAI's) */
    double top_p;                /* default 1 */
    int64_t top_k;               /* default 0: all */
    double min_p;                /* extension, default 0: off */
    double repeat_penalty;       /* extension, default 1: off */
    int64_t repeat_last_n;       /* extension, default 64; -1: every token */
    double presence_penalty, frequency_penalty;  /* OpenAI's, default 0 */
    kve_logit_bias *bias;        /* [n_bias] from "logit_bias" (ids checked against the
                                  * vocabulary by the caller) */
    int32_t n_bias;
    int json_object;             /* response_format {"type": "json_object"}: the reply is one JSON object */
    char *schema;                /* response_format json_schema: its schema as JSON text (checked to
                                  * compile; compiled for the model by the handler), or NULL */
    /* tools (chat): each function's name, description (or NULL) and
     * parameter schema as JSON text (checked to compile), and the choice */
    struct srv_tool {
        const char *name, *description;
        char *params;            /* malloc'ed JSON text */
    } *tools;
    int32_t n_tools;
    enum { SRV_TOOLS_NONE, SRV_TOOLS_AUTO, SRV_TOOLS_REQUIRED, SRV_TOOLS_NAMED } tool_choice;
    int32_t tool_named;          /* SRV_TOOLS_NAMED: the index of the function */
    int has_tool_history;        /* a message is a tool result or carries tool_calls */
    int one_call;                /* parallel_tool_calls false: at most one call a reply */
    uint64_t seed;               /* when has_seed */
    int has_seed;
    const char *stops[KVE_MAX_STOPS];
    int32_t n_stops;
    int64_t n;                   /* choices, default 1 */
    int stream, include_usage;
    int logprobs;                /* return logprobs of the chosen tokens */
    int64_t top_logprobs;        /* alternatives per position, 0 .. 20 */
    int enable_thinking;         /* chat_template_kwargs.enable_thinking (an extension, vLLM's
                                  * and llama-server's): 0 or 1, -1 when absent */
    const char *session;         /* "session" (an extension): a session name, already checked
                                  * to be 1 .. SRV_MAX_SESSION_NAME of [A-Za-z0-9._-], not
                                  * starting with '.'; NULL when absent */
} srv_request;

/* Parses and validates body[0..len) as a request of `kind`. 0, or -1 with
 * *err set: 400 for malformed JSON (with line and column), a missing or
 * ill-typed field, a value out of range, or nesting deeper than
 * SRV_MAX_DEPTH. On failure nothing needs freeing;
 * on success call srv_request_free. */
int srv_request_parse(srv_kind kind, const char *body, size_t len, srv_request *out, srv_error *err);
void srv_request_free(srv_request *r);

/* The table of generation fields, for the docs and the tests. */
typedef enum {
    SRV_FIELD_HONOURED,   /* as the OpenAI API says */
    SRV_FIELD_EXTENSION,  /* not OpenAI's: llama.cpp's or this server's */
    SRV_FIELD_NO_EFFECT,  /* accepted, changes nothing (identifiers, metadata) */
    SRV_FIELD_PARTIAL,    /* some values honoured, the rest refused (see why) */
    SRV_FIELD_REFUSED,    /* any non-null value is a 400 */
} srv_field_use;

typedef struct {
    const char *name;
    unsigned kinds;       /* 1 << SRV_CHAT | 1 << SRV_COMPLETION */
    srv_field_use use;
    const char *why;      /* with PARTIAL and REFUSED: what is not supported */
} srv_field;

extern const srv_field srv_fields[];
extern const int srv_n_fields;

#endif
