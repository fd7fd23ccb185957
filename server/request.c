/* server/request.c - request bodies to validated srv_request (see request.h):
 * the JSON parse with line and column on error, then one small typed getter
 * per kind of field, each naming the field in its message. */
#include "request.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int srv_error_set(srv_error *e, int status, const char *type, const char *fmt, ...) {
    e->status = status;
    e->type = type;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

static int bad(srv_error *e, const char *fmt, const char *field) {
    return srv_error_set(e, 400, "invalid_request_error", fmt, field);
}

/* ---------------------------------------------------------------- typed fields */

/* The field, or NULL when absent or null. */
static json_t *field(json_t *o, const char *name) {
    json_t *v = json_object_get(o, name);
    return json_is_null(v) ? NULL : v;
}

static int is_str(json_t *v, const char *s) {
    return json_is_string(v) && !strcmp(json_string_value(v), s);
}

static int get_bool(json_t *o, const char *name, int *out, srv_error *e) {
    json_t *v = field(o, name);
    if (!v) return 0;
    if (!json_is_boolean(v)) return bad(e, "'%s' must be a boolean", name);
    *out = json_is_true(v);
    return 0;
}

static int get_int(json_t *o, const char *name, int64_t lo, int64_t hi, int64_t *out, srv_error *e) {
    json_t *v = field(o, name);
    if (!v) return 0;
    if (!json_is_integer(v)) return bad(e, "'%s' must be an integer", name);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return srv_error_set(e, 400, "invalid_request_error", "'%s' must be in [%lld, %lld] (got %lld)", name,
                             (long long)lo, (long long)hi, (long long)x);
    *out = x;
    return 0;
}

/* lo_open: the lower bound itself is excluded */
static int get_num(json_t *o, const char *name, double lo, int lo_open, double hi, double *out, srv_error *e) {
    json_t *v = field(o, name);
    if (!v) return 0;
    if (!json_is_number(v)) return bad(e, "'%s' must be a number", name);
    double x = json_number_value(v);
    if (!(lo_open ? x > lo : x >= lo) || !(x <= hi))
        return srv_error_set(e, 400, "invalid_request_error", "'%s' must be in %s%g, %g] (got %g)", name,
                             lo_open ? "(" : "[", lo, hi, x);
    *out = x;
    return 0;
}

static int get_str(json_t *o, const char *name, const char **out, srv_error *e) {
    json_t *v = field(o, name);
    if (!v) return 0;
    if (!json_is_string(v)) return bad(e, "'%s' must be a string", name);
    *out = json_string_value(v);
    return 0;
}

/* "stop": a string or an array of up to KVE_MAX_STOPS non-empty strings. */
static int get_stops(json_t *o, srv_request *r, srv_error *e) {
    json_t *v = field(o, "stop");
    if (!v) return 0;
    if (json_is_string(v)) {
        if (json_string_length(v) == 0) return bad(e, "'%s' must not be empty", "stop");
        r->stops[r->n_stops++] = json_string_value(v);
        return 0;
    }
    if (!json_is_array(v)) return bad(e, "'%s' must be a string or an array of strings", "stop");
    if (json_array_size(v) > KVE_MAX_STOPS)
        return srv_error_set(e, 400, "invalid_request_error", "'stop' takes at most %d strings", KVE_MAX_STOPS);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s) || json_string_length(s) == 0)
            return bad(e, "'%s' must hold non-empty strings", "stop");
        r->stops[r->n_stops++] = json_string_value(s);
    }
    return 0;
}

/* "session": a name that is one file in the session directory, whatever
 * the client sends: 1 .. SRV_MAX_SESSION_NAME characters of [A-Za-z0-9._-]
 * (no separator, so no path), not starting with '.' (no "..", no hidden
 * or temporary files). */
static int get_session(json_t *o, srv_request *r, srv_error *e) {
    if (get_str(o, "session", &r->session, e)) return -1;
    if (!r->session) return 0;
    size_t n = json_string_length(field(o, "session"));
    int ok = n >= 1 && n <= SRV_MAX_SESSION_NAME && r->session[0] != '.';
    for (size_t i = 0; ok && i < n; i++) {
        unsigned char ch = (unsigned char)r->session[i];
        ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
             ch == '_' || ch == '-';
    }
    if (!ok)
        return srv_error_set(e, 400, "invalid_request_error",
                             "'session' must be 1 to %d characters of A-Z a-z 0-9 . _ - not starting with '.'",
                             SRV_MAX_SESSION_NAME);
    return 0;
}

/* The token ids of array v into a malloc'ed *ids, *n. */
static int read_ids(json_t *v, const char *name, int32_t **ids, int32_t *n, srv_error *e) {
    size_t len = json_array_size(v);
    if (len > (1u << 24)) return bad(e, "'%s' has too many tokens", name);
    *ids = malloc(sizeof(int32_t) * (len ? len : 1));
    if (!*ids) return srv_error_set(e, 500, "server_error", "out of memory");
    size_t i;
    json_t *t;
    json_array_foreach(v, i, t) {
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX)
            return bad(e, "'%s' must hold token ids (integers >= 0)", name);
        (*ids)[i] = (int32_t)json_integer_value(t);
    }
    *n = (int32_t)len;
    return 0;
}

/* An array of token ids into r->tokens. */
static int get_ids(json_t *v, const char *name, srv_request *r, srv_error *e) {
    return read_ids(v, name, &r->tokens, &r->n_tokens, e);
}

/* A completion's list of prompts: several strings, or lists of token ids
 * (OpenAI's forms), each its own request, their choices one after another. */
static int get_prompts(json_t *p, srv_request *r, srv_error *e) {
    const size_t n = json_array_size(p);
    if (n > SRV_MAX_REPLIES)
        return srv_error_set(e, 400, "invalid_request_error", "'prompt' lists at most %d prompts", (int)SRV_MAX_REPLIES);
    r->prompts = calloc(n, sizeof *r->prompts);
    if (!r->prompts) return srv_error_set(e, 500, "server_error", "out of memory");
    r->n_prompts = (int32_t)n;
    const int texts = json_is_string(json_array_get(p, 0));
    size_t i;
    json_t *v;
    json_array_foreach(p, i, v) {
        if (texts && json_is_string(v)) {
            r->prompts[i].text = json_string_value(v), r->prompts[i].len = json_string_length(v);
        } else if (!texts && json_is_array(v)) {
            if (json_array_size(v) == 0) return bad(e, "'%s' holds an empty list of token ids", "prompt");
            if (read_ids(v, "prompt", &r->prompts[i].ids, &r->prompts[i].n_ids, e)) return -1;
        } else {
            return bad(e, "'%s' must be a list of strings or a list of lists of token ids, not a mix", "prompt");
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- messages */

/* content: a string, or an array of parts {"type":"text","text":...} joined. */
static int message_content(json_t *c, int32_t i, srv_request *r, srv_error *e) {
    if (json_is_string(c)) {
        r->msgs[i].content = json_string_value(c);
        return 0;
    }
    if (!json_is_array(c)) return bad(e, "'%s' must be a string or an array of text parts", "messages[].content");
    size_t total = 0, k;
    json_t *part;
    json_array_foreach(c, k, part) {
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (json_is_object(part) && json_is_string(type) && strcmp(json_string_value(type), "text"))
            return srv_error_set(e, 400, "invalid_request_error",
                                 "'messages[].content' part type \"%.40s\" is not supported: text parts only (no "
                                 "images, audio or files)", json_string_value(type));
        if (!json_is_object(part) || !json_is_string(type) || !json_is_string(text))
            return bad(e, "'%s' parts must be {\"type\": \"text\", \"text\": ...}", "messages[].content");
        total += json_string_length(text);
    }
    char *s = malloc(total + 1);
    if (!s) return srv_error_set(e, 500, "server_error", "out of memory");
    size_t at = 0;
    json_array_foreach(c, k, part) {
        json_t *text = json_object_get(part, "text");
        memcpy(s + at, json_string_value(text), json_string_length(text));
        at += json_string_length(text);
    }
    s[at] = 0;
    r->joined[i] = s;
    r->msgs[i].content = s;
    return 0;
}

/* A message's role and fields: system, developer, user, assistant with
 * role and content; an assistant's tool_calls (then content may be null),
 * a tool message's tool_call_id. Anything else is refused, naming it. */
static int check_message(json_t *m, const char *role, srv_request *r, srv_error *e) {
    if (!strcmp(role, "function"))
        return srv_error_set(e, 400, "invalid_request_error",
                             "'messages[].role' \"function\" is not supported: use \"tool\" (the deprecated functions API is not implemented)");
    const int tool = !strcmp(role, "tool"), assistant = !strcmp(role, "assistant");
    if (!tool && strcmp(role, "system") && strcmp(role, "developer") && strcmp(role, "user") && !assistant)
        return srv_error_set(e, 400, "invalid_request_error",
                             "'messages[].role' must be system, developer, user, assistant or tool (got \"%.40s\")", role);
    const char *key;
    json_t *v;
    json_object_foreach(m, key, v) {
        if (json_is_null(v) || !strcmp(key, "role") || !strcmp(key, "content")) continue;
        if (!strcmp(key, "refusal") && json_is_string(v)) continue;   /* an earlier reply's refusal text: history */
        if (tool && !strcmp(key, "tool_call_id")) {
            if (!json_is_string(v)) return bad(e, "'%s' must be a string", "messages[].tool_call_id");
            continue;
        }
        if (assistant && !strcmp(key, "tool_calls")) {
            size_t i;
            json_t *c;
            if (!json_is_array(v)) return bad(e, "'%s' must be an array", "messages[].tool_calls");
            json_array_foreach(v, i, c) {
                json_t *f = json_object_get(c, "function");
                if (!json_is_object(c) || (json_object_get(c, "type") && !is_str(json_object_get(c, "type"), "function")) ||
                    !json_is_object(f) || !json_is_string(json_object_get(f, "name")) ||
                    !json_is_string(json_object_get(f, "arguments")))
                    return bad(e, "'%s' entries must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\": a JSON string}}",
                               "messages[].tool_calls");
            }
            r->has_tool_history = 1;
            continue;
        }
        return srv_error_set(e, 400, "invalid_request_error",
                             "'messages[].%.40s' is not supported (a message takes role and content; an assistant's "
                             "tool_calls; a tool message's tool_call_id)", key);
    }
    if (tool) {
        if (!json_is_string(json_object_get(m, "tool_call_id")))
            return bad(e, "'%s' is required in a tool message", "messages[].tool_call_id");
        r->has_tool_history = 1;
    }
    return 0;
}

static int get_messages(json_t *o, srv_request *r, srv_error *e) {
    json_t *v = field(o, "messages");
    if (!v) return bad(e, "'%s' is required", "messages");
    if (!json_is_array(v) || json_array_size(v) == 0) return bad(e, "'%s' must be a non-empty array", "messages");
    size_t n = json_array_size(v);
    if (n > SRV_MAX_MESSAGES)
        return srv_error_set(e, 400, "invalid_request_error", "at most %d messages", SRV_MAX_MESSAGES);
    r->msgs = calloc(n, sizeof *r->msgs);
    r->joined = calloc(n, sizeof *r->joined);
    if (!r->msgs || !r->joined) return srv_error_set(e, 500, "server_error", "out of memory");
    r->n_msgs = (int32_t)n;
    size_t i;
    json_t *m;
    json_array_foreach(v, i, m) {
        if (!json_is_object(m)) return bad(e, "'%s' must hold objects", "messages");
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        if (!json_is_string(role) || json_string_length(role) == 0)
            return bad(e, "'%s' must be a non-empty string", "messages[].role");
        if (check_message(m, json_string_value(role), r, e)) return -1;
        if (json_is_null(content)) content = NULL;
        if (!content && is_str(role, "assistant") && json_array_size(json_object_get(m, "tool_calls")) > 0) {
            r->msgs[i].role = "assistant", r->msgs[i].content = "";   /* the calls are rendered from the JSON */
            continue;
        }
        if (!content) return bad(e, "'%s' is required", "messages[].content");
        /* "developer" is the newer name of "system" (OpenAI's o1 and later) */
        r->msgs[i].role = is_str(role, "developer") ? "system" : json_string_value(role);
        if (message_content(content, (int32_t)i, r, e)) return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- the field table */

enum { CH = 1u << SRV_CHAT, CO = 1u << SRV_COMPLETION, BOTH = CH | CO };

const srv_field srv_fields[] = {
    {"model", BOTH, SRV_FIELD_HONOURED, NULL},
    {"messages", CH, SRV_FIELD_HONOURED, NULL},
    {"prompt", CO, SRV_FIELD_HONOURED, NULL},
    {"max_tokens", BOTH, SRV_FIELD_HONOURED, NULL},
    {"max_completion_tokens", CH, SRV_FIELD_HONOURED, NULL},
    {"temperature", BOTH, SRV_FIELD_HONOURED, NULL},
    {"top_p", BOTH, SRV_FIELD_HONOURED, NULL},
    {"n", BOTH, SRV_FIELD_HONOURED, NULL},
    {"stream", BOTH, SRV_FIELD_HONOURED, NULL},
    {"stream_options", BOTH, SRV_FIELD_HONOURED, NULL},
    {"stop", BOTH, SRV_FIELD_HONOURED, NULL},
    {"seed", BOTH, SRV_FIELD_HONOURED, NULL},
    {"presence_penalty", BOTH, SRV_FIELD_HONOURED, NULL},
    {"frequency_penalty", BOTH, SRV_FIELD_HONOURED, NULL},
    {"logit_bias", BOTH, SRV_FIELD_HONOURED, NULL},
    {"logprobs", BOTH, SRV_FIELD_HONOURED, NULL},
    {"top_logprobs", CH, SRV_FIELD_HONOURED, NULL},
    {"user", BOTH, SRV_FIELD_NO_EFFECT, NULL},
    {"metadata", CH, SRV_FIELD_NO_EFFECT, NULL},
    {"safety_identifier", CH, SRV_FIELD_NO_EFFECT, NULL},
    {"prompt_cache_key", CH, SRV_FIELD_NO_EFFECT, NULL},
    {"store", CH, SRV_FIELD_PARTIAL, "only false: this server stores no completions"},
    {"service_tier", CH, SRV_FIELD_PARTIAL, "only \"auto\" or \"default\": there is one tier"},
    {"modalities", CH, SRV_FIELD_PARTIAL, "only [\"text\"]: no audio output"},
    {"response_format", CH, SRV_FIELD_HONOURED, NULL},
    {"tools", CH, SRV_FIELD_HONOURED, NULL},
    {"tool_choice", CH, SRV_FIELD_HONOURED, NULL},
    {"parallel_tool_calls", CH, SRV_FIELD_HONOURED, NULL},
    {"function_call", CH, SRV_FIELD_PARTIAL, "only \"none\": the deprecated functions API is not implemented (use tools)"},
    {"functions", CH, SRV_FIELD_REFUSED, "the deprecated functions API is not implemented (use tools)"},
    {"audio", CH, SRV_FIELD_REFUSED, "no audio output"},
    {"prediction", CH, SRV_FIELD_REFUSED, "predicted outputs are not implemented"},
    {"reasoning_effort", CH, SRV_FIELD_REFUSED, "the models served have no reasoning budget"},
    {"verbosity", CH, SRV_FIELD_REFUSED, "not implemented"},
    {"web_search_options", CH, SRV_FIELD_REFUSED, "there is no web search"},
    {"echo", CO, SRV_FIELD_PARTIAL, "only false: the prompt is not echoed"},
    {"best_of", CO, SRV_FIELD_PARTIAL, "only 1: candidates are not ranked"},
    {"suffix", CO, SRV_FIELD_PARTIAL, "only \"\": no insertion (fill in the middle)"},
    {"top_k", BOTH, SRV_FIELD_EXTENSION, NULL},
    {"min_p", BOTH, SRV_FIELD_EXTENSION, NULL},
    {"repeat_penalty", BOTH, SRV_FIELD_EXTENSION, NULL},
    {"repeat_last_n", BOTH, SRV_FIELD_EXTENSION, NULL},
    {"session", BOTH, SRV_FIELD_EXTENSION, NULL},
    {"chat_template_kwargs", CH, SRV_FIELD_EXTENSION, NULL},
    {"parse_special", CO, SRV_FIELD_EXTENSION, NULL},
};
const int srv_n_fields = (int)(sizeof srv_fields / sizeof srv_fields[0]);

/* Whether a PARTIAL field's value is one of those honoured. */
static int partial_ok(const char *name, json_t *v) {
    if (!strcmp(name, "prompt")) return 1;   /* checked where it is read */
    if (!strcmp(name, "store") || !strcmp(name, "echo")) return json_is_false(v);
    if (!strcmp(name, "service_tier")) return is_str(v, "auto") || is_str(v, "default");
    if (!strcmp(name, "modalities")) return json_is_array(v) && json_array_size(v) == 1 && is_str(json_array_get(v, 0), "text");
    if (!strcmp(name, "function_call")) return is_str(v, "none");
    if (!strcmp(name, "best_of")) return json_is_integer(v) && json_integer_value(v) == 1;
    if (!strcmp(name, "suffix")) return is_str(v, "");
    return 0;
}

/* Every non-null top-level field of a generation request against the table:
 * one it does not list for this endpoint, a refused one, or a partial one
 * with a value not honoured is a 400 naming it. */
static int check_fields(json_t *o, srv_kind kind, srv_error *e) {
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        if (json_is_null(v)) continue;
        const srv_field *f = NULL;
        for (int i = 0; i < srv_n_fields && !f; i++)
            if (!strcmp(srv_fields[i].name, key) && (srv_fields[i].kinds & (1u << kind))) f = &srv_fields[i];
        if (!f)
            return srv_error_set(e, 400, "invalid_request_error",
                                 "'%.64s' is not a field this endpoint takes (docs/SERVER.md lists them)", key);
        if (f->use == SRV_FIELD_REFUSED)
            return srv_error_set(e, 400, "invalid_request_error", "'%s' is not supported: %s", key, f->why);
        if (f->use == SRV_FIELD_PARTIAL && !partial_ok(key, v)) {
            return srv_error_set(e, 400, "invalid_request_error", "'%s' is not supported with this value: %s", key,
                                 f->why);
        }
    }
    return 0;
}

/* "logit_bias": {"token id": bias in [-100, 100], ...}, at most
 * SRV_MAX_LOGIT_BIAS entries. */
static int get_logit_bias(json_t *o, srv_request *r, srv_error *e) {
    json_t *v = field(o, "logit_bias");
    if (!v) return 0;
    if (!json_is_object(v)) return bad(e, "'%s' must be an object of token ids to numbers", "logit_bias");
    size_t n = json_object_size(v);
    if (n > SRV_MAX_LOGIT_BIAS)
        return srv_error_set(e, 400, "invalid_request_error", "'logit_bias' takes at most %d tokens", SRV_MAX_LOGIT_BIAS);
    r->bias = malloc(sizeof *r->bias * (n ? n : 1));
    if (!r->bias) return srv_error_set(e, 500, "server_error", "out of memory");
    const char *key;
    json_t *b;
    json_object_foreach(v, key, b) {
        char *end;
        long long id = strtoll(key, &end, 10);
        if (!*key || *end || key[0] < '0' || key[0] > '9' || id > INT32_MAX)
            return srv_error_set(e, 400, "invalid_request_error",
                                 "'logit_bias' keys must be token ids (decimal integers >= 0); got \"%.40s\"", key);
        if (!json_is_number(b) || !(json_number_value(b) >= -100 && json_number_value(b) <= 100))
            return srv_error_set(e, 400, "invalid_request_error",
                                 "'logit_bias' values must be numbers in [-100, 100]; token %lld has another", id);
        r->bias[r->n_bias++] = (kve_logit_bias){(int32_t)id, (float)json_number_value(b)};
    }
    return 0;
}

/* A schema (a JSON value) checked to compile, as JSON text in *text; a 400
 * naming where it is and what is wrong. */
static int check_schema(json_t *schema, const char *where, char **text, srv_error *e) {
    char *t = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t) return srv_error_set(e, 500, "server_error", "out of memory");
    char err[240];
    int rc = kve_grammar_check(t, strlen(t), 1, err, sizeof err);
    if (rc != KVE_OK) {
        free(t);
        if (rc == KVE_ERR_NOMEM) return srv_error_set(e, 500, "server_error", "out of memory");
        return srv_error_set(e, 400, "invalid_request_error", "'%s': %s", where, err);
    }
    *text = t;
    return 0;
}

/* "response_format": {"type": "text"}, {"type": "json_object"}, or
 * {"type": "json_schema", "json_schema": {"name", "schema", "strict",
 * "description"}}. */
static int get_response_format(json_t *o, srv_request *r, srv_error *e) {
    json_t *v = field(o, "response_format");
    if (!v) return 0;
    json_t *type = json_object_get(v, "type");
    if (!json_is_object(v) || !(is_str(type, "text") || is_str(type, "json_object") || is_str(type, "json_schema")))
        return bad(e, "'%s' must be an object whose type is \"text\", \"json_object\" or \"json_schema\"",
                   "response_format");
    const char *key;
    json_t *x;
    json_object_foreach(v, key, x)
        if (strcmp(key, "type") && !(is_str(type, "json_schema") && !strcmp(key, "json_schema")))
            return srv_error_set(e, 400, "invalid_request_error", "'response_format.%.40s' is not a field of this type", key);
    r->json_object = is_str(type, "json_object");
    if (!is_str(type, "json_schema")) return 0;
    json_t *js = json_object_get(v, "json_schema");
    if (!json_is_object(js)) return bad(e, "'%s' is required and must be an object", "response_format.json_schema");
    json_object_foreach(js, key, x) {
        if (!strcmp(key, "name") || !strcmp(key, "description")) {
            if (!json_is_string(x)) return srv_error_set(e, 400, "invalid_request_error", "'response_format.json_schema.%s' must be a string", key);
        } else if (!strcmp(key, "strict")) {
            if (!json_is_boolean(x) && !json_is_null(x)) return bad(e, "'%s' must be a boolean", "response_format.json_schema.strict");
        } else if (strcmp(key, "schema")) {
            return srv_error_set(e, 400, "invalid_request_error", "'response_format.json_schema.%.40s' is not a field of json_schema", key);
        }
    }
    if (!json_is_string(json_object_get(js, "name"))) return bad(e, "'%s' is required", "response_format.json_schema.name");
    json_t *schema = json_object_get(js, "schema");
    if (!schema) schema = json_true();   /* no schema: any JSON value */
    else json_incref(schema);
    int rc = check_schema(schema, "response_format.json_schema.schema", &r->schema, e);
    json_decref(schema);
    return rc;
}

/* Function names as OpenAI takes them: 1 to 64 of [A-Za-z0-9_-]. */
static int good_name(const char *s) {
    size_t n = strlen(s);
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '_' || s[i] == '-'))
            return 0;
    return n >= 1 && n <= 64;
}

/* "tools": [{"type": "function", "function": {"name", "description",
 * "parameters", "strict"}}], and "tool_choice". */
static int get_tools(json_t *o, srv_request *r, srv_error *e) {
    json_t *v = field(o, "tools"), *tc = field(o, "tool_choice"), *ptc = field(o, "parallel_tool_calls");
    if (ptc && !json_is_boolean(ptc)) return bad(e, "'%s' must be a boolean", "parallel_tool_calls");
    r->one_call = ptc && json_is_false(ptc);
    if (v) {
        if (!json_is_array(v) || json_array_size(v) == 0) return bad(e, "'%s' must be a non-empty array", "tools");
        if (json_array_size(v) > SRV_MAX_TOOLS)
            return srv_error_set(e, 400, "invalid_request_error", "'tools' takes at most %d functions", SRV_MAX_TOOLS);
        if (!(r->tools = calloc(json_array_size(v), sizeof *r->tools))) return srv_error_set(e, 500, "server_error", "out of memory");
        size_t i;
        json_t *t;
        json_array_foreach(v, i, t) {
            json_t *f = json_object_get(t, "function");
            if (!json_is_object(t) || !is_str(json_object_get(t, "type"), "function") || !json_is_object(f))
                return bad(e, "'%s' entries must be {\"type\": \"function\", \"function\": {...}}", "tools");
            const char *key;
            json_t *x;
            json_object_foreach(f, key, x)
                if (strcmp(key, "name") && strcmp(key, "description") && strcmp(key, "parameters") && strcmp(key, "strict"))
                    return srv_error_set(e, 400, "invalid_request_error", "'tools[].function.%.40s' is not supported", key);
            json_t *name = json_object_get(f, "name"), *desc = field(f, "description"), *params = field(f, "parameters");
            if (!json_is_string(name) || !good_name(json_string_value(name)))
                return bad(e, "'%s' must be 1 to 64 characters of A-Z a-z 0-9 _ -", "tools[].function.name");
            if (desc && !json_is_string(desc)) return bad(e, "'%s' must be a string", "tools[].function.description");
            for (int32_t k = 0; k < r->n_tools; k++)
                if (!strcmp(r->tools[k].name, json_string_value(name)))
                    return srv_error_set(e, 400, "invalid_request_error", "'tools' names the function \"%s\" twice",
                                         json_string_value(name));
            struct srv_tool *st = &r->tools[r->n_tools++];
            st->name = json_string_value(name), st->description = desc ? json_string_value(desc) : NULL;
            json_t *schema = params ? json_incref(params) : json_pack("{s:s, s:{}}", "type", "object", "properties");
            if (params && !json_is_object(params)) {
                json_decref(schema);
                return bad(e, "'%s' must be a JSON Schema object", "tools[].function.parameters");
            }
            char where[100];
            snprintf(where, sizeof where, "tools[%zu].function.parameters", i);
            int rc = check_schema(schema, where, &st->params, e);
            json_decref(schema);
            if (rc) return -1;
        }
    }
    r->tool_choice = v ? SRV_TOOLS_AUTO : SRV_TOOLS_NONE;
    if (!tc) return 0;
    if (is_str(tc, "none")) r->tool_choice = SRV_TOOLS_NONE;
    else if (is_str(tc, "auto") || is_str(tc, "required")) {
        if (!v) return bad(e, "'%s' other than \"none\" needs 'tools'", "tool_choice");
        r->tool_choice = is_str(tc, "auto") ? SRV_TOOLS_AUTO : SRV_TOOLS_REQUIRED;
    } else if (json_is_object(tc) && is_str(json_object_get(tc, "type"), "function") &&
               json_is_string(json_object_get(json_object_get(tc, "function"), "name"))) {
        const char *name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
        r->tool_choice = SRV_TOOLS_NAMED, r->tool_named = -1;
        for (int32_t k = 0; k < r->n_tools; k++)
            if (!strcmp(r->tools[k].name, name)) r->tool_named = k;
        if (r->tool_named < 0)
            return srv_error_set(e, 400, "invalid_request_error", "'tool_choice' names \"%.64s\", which is not in 'tools'", name);
    } else {
        return bad(e, "'%s' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\"}}",
                   "tool_choice");
    }
    if (r->tool_choice != SRV_TOOLS_NONE && (r->json_object || r->schema))
        return bad(e, "'%s' other than \"none\" cannot be combined with a JSON response_format", "tool_choice");
    return 0;
}

/* "chat_template_kwargs": the template variables a request may set. The
 * templates are rendered in C, so only the one switch they read is taken;
 * any other variable would be dropped, and is refused. */
static int get_template_kwargs(json_t *o, srv_request *r, srv_error *e) {
    json_t *v = field(o, "chat_template_kwargs");
    if (!v) return 0;
    if (!json_is_object(v)) return bad(e, "'%s' must be an object", "chat_template_kwargs");
    const char *key;
    json_t *x;
    json_object_foreach(v, key, x) {
        if (strcmp(key, "enable_thinking"))
            return srv_error_set(e, 400, "invalid_request_error",
                                 "'chat_template_kwargs.%.64s' is not supported: the only template variable taken is "
                                 "enable_thinking", key);
        if (!json_is_null(x) && !json_is_boolean(x))
            return bad(e, "'%s' must be a boolean", "chat_template_kwargs.enable_thinking");
        if (json_is_boolean(x)) r->enable_thinking = json_is_true(x);
    }
    return 0;
}

/* ---------------------------------------------------------------- the parse */

static int parse_generation(json_t *o, srv_request *r, srv_error *e) {
    if (check_fields(o, r->kind, e)) return -1;
    if (r->kind == SRV_CHAT) {
        if (get_messages(o, r, e)) return -1;
    } else {
        json_t *p = field(o, "prompt");
        if (!p) return bad(e, "'%s' is required", "prompt");
        if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
            p = json_array_get(p, 0);   /* a list of one prompt */
        if (json_is_string(p)) {
            r->prompt = json_string_value(p), r->prompt_len = json_string_length(p);
        } else if (json_is_array(p) && json_array_size(p) > 0 && json_is_integer(json_array_get(p, 0))) {
            if (get_ids(p, "prompt", r, e)) return -1;
        } else if (json_is_array(p) && json_array_size(p) > 0 &&
                   (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)))) {
            if (get_prompts(p, r, e)) return -1;
        } else {
            return bad(e, "'%s' must be a string, a list of strings, token ids or a list of lists of token ids", "prompt");
        }
    }
    int64_t mt = -1, mct = -1;
    if (get_int(o, "max_tokens", 1, 1 << 24, &mt, e) || get_int(o, "max_completion_tokens", 1, 1 << 24, &mct, e))
        return -1;
    r->max_tokens = mct >= 0 ? mct : mt;
    if (get_num(o, "temperature", 0, 0, 2, &r->temperature, e) || get_num(o, "top_p", 0, 1, 1, &r->top_p, e) ||
        get_int(o, "top_k", 0, INT32_MAX, &r->top_k, e) || get_int(o, "n", 1, 16, &r->n, e) ||
        get_bool(o, "stream", &r->stream, e) || get_stops(o, r, e) ||
        get_num(o, "presence_penalty", -2, 0, 2, &r->presence_penalty, e) ||
        get_num(o, "frequency_penalty", -2, 0, 2, &r->frequency_penalty, e) || get_logit_bias(o, r, e) ||
        get_num(o, "min_p", 0, 0, 1, &r->min_p, e) || get_num(o, "repeat_penalty", 0, 1, 10, &r->repeat_penalty, e) ||
        get_int(o, "repeat_last_n", -1, 1 << 24, &r->repeat_last_n, e))
        return -1;
    int64_t seed = 0;
    if (get_int(o, "seed", INT64_MIN, INT64_MAX, &seed, e)) return -1;
    r->seed = (uint64_t)seed, r->has_seed = field(o, "seed") != NULL;
    if (get_session(o, r, e)) return -1;
    if (r->n_prompts * r->n > SRV_MAX_REPLIES)
        return srv_error_set(e, 400, "invalid_request_error", "%d prompts times 'n' %d is %d choices; at most %d a request",
                             (int)r->n_prompts, (int)r->n, (int)(r->n_prompts * r->n), (int)SRV_MAX_REPLIES);
    if (r->n_prompts && r->session)
        return bad(e, "'%s' keeps one sequence: it takes one prompt, not a list", "session");
    if (r->kind == SRV_CHAT && (get_response_format(o, r, e) || get_tools(o, r, e) || get_template_kwargs(o, r, e)))
        return -1;
    json_t *so = field(o, "stream_options");
    if (so && !json_is_object(so)) return bad(e, "'%s' must be an object", "stream_options");
    json_t *iu = so ? field(so, "include_usage") : NULL;
    if (iu && !json_is_boolean(iu)) return bad(e, "'%s' must be a boolean", "stream_options.include_usage");
    r->include_usage = iu && json_is_true(iu);
    if (r->kind == SRV_CHAT) {
        if (get_bool(o, "logprobs", &r->logprobs, e) ||
            get_int(o, "top_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &r->top_logprobs, e))
            return -1;
        if (field(o, "top_logprobs") && !r->logprobs)
            return bad(e, "'%s' needs \"logprobs\": true", "top_logprobs");
        if (field(o, "parse_special"))   /* the template alone writes the markers */
            return bad(e, "'%s' is for /v1/completions and /tokenize: chat content is always text", "parse_special");
    } else { /* the legacy form: logprobs is the number of alternatives */
        if (get_bool(o, "parse_special", &r->parse_special, e)) return -1;
        int64_t lp = -1;
        if (get_int(o, "logprobs", 0, 5, &lp, e)) return -1;
        r->logprobs = lp >= 0, r->top_logprobs = lp >= 0 ? lp : 0;
    }
    return 0;
}

/* Whether arrays and objects in body[0..len) nest deeper than limit: one
 * pass that skips strings (a bracket inside one is text) and their escapes.
 * A stray closer is not counted below zero; the parser refuses it anyway, at
 * or before the depth this pass saw. */
static int nests_deeper(const char *body, size_t len, int limit) {
    int depth = 0, in_string = 0;
    for (size_t i = 0; i < len; i++) {
        char c = body[i];
        if (in_string) {
            if (c == '\\') i++;
            else if (c == '"') in_string = 0;
        } else if (c == '"') {
            in_string = 1;
        } else if (c == '[' || c == '{') {
            if (++depth > limit) return 1;
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
    }
    return 0;
}

int srv_request_parse(srv_kind kind, const char *body, size_t len, srv_request *out, srv_error *err) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->max_tokens = -1, out->temperature = 1, out->top_p = 1, out->n = 1;
    out->repeat_penalty = 1, out->repeat_last_n = 64, out->enable_thinking = -1;
    if (nests_deeper(body, len, SRV_MAX_DEPTH))
        return srv_error_set(err, 400, "invalid_request_error",
                             "the JSON nests arrays and objects deeper than the limit of %d levels", SRV_MAX_DEPTH);
    json_error_t je;
    json_t *root = json_loadb(body, len, 0, &je);
    if (!root)
        return srv_error_set(err, 400, "invalid_request_error", "malformed JSON at line %d, column %d: %s", je.line,
                             je.column, je.text);
    out->root = root;
    if (!json_is_object(root)) {
        srv_request_free(out);
        return srv_error_set(err, 400, "invalid_request_error", "the request body must be a JSON object");
    }
    int rc = get_str(root, "model", &out->model, err);
    if (!rc && (kind == SRV_CHAT || kind == SRV_COMPLETION)) {
        rc = parse_generation(root, out, err);
    } else if (!rc && kind == SRV_TOKENIZE) {
        json_t *c = field(root, "content");
        if (!json_is_string(c)) rc = bad(err, "'%s' is required and must be a string", "content");
        else out->prompt = json_string_value(c), out->prompt_len = json_string_length(c);
        if (!rc) rc = get_bool(root, "add_special", &out->add_special, err);
        if (!rc) rc = get_bool(root, "with_pieces", &out->with_pieces, err);
        if (!rc) rc = get_bool(root, "parse_special", &out->parse_special, err);
    } else if (!rc) {
        json_t *t = field(root, "tokens");
        if (!json_is_array(t)) rc = bad(err, "'%s' is required and must be an array of token ids", "tokens");
        else rc = get_ids(t, "tokens", out, err);
    }
    if (rc) srv_request_free(out);
    return rc;
}

void srv_request_free(srv_request *r) {
    if (r->joined)
        for (int32_t i = 0; i < r->n_msgs; i++) free(r->joined[i]);
    free(r->joined), free(r->msgs), free(r->tokens), free(r->bias);
    for (int32_t i = 0; i < r->n_prompts; i++) free(r->prompts[i].ids);
    free(r->prompts);
    for (int32_t i = 0; i < r->n_tools; i++) free(r->tools[i].params);
    free(r->tools);
    free(r->schema);
    if (r->root) json_decref((json_t *)r->root);
    memset(r, 0, sizeof *r);
}
