/* server/tools.c - tool calls: the tools and the tool messages of a
 * conversation rendered the way each model family's template writes them,
 * the grammar that holds a reply to one call (tool_choice "required" or a
 * named function), and a reply parsed back into tool_calls.
 *
 *   Hermes style (ChatML: SmolLM2, Qwen2.5/Qwen3; Gemma, Llama 2, Zephyr,
 *   whose templates have no tools, take the same text): the tools as JSON
 *   lines inside <tools></tools> at the end of the system message, a call as
 *   <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, a tool's
 *   result as a user turn <tool_response>\n...\n</tool_response> (Gemma has
 *   no tool role; Qwen's template writes tool results so too).
 *   Llama 3.x: the tools at the start of the first user message with the
 *   instruction of Llama 3.1's template, a call as the JSON object
 *   {"name": ..., "parameters": {...}}, a tool's result as an "ipython" turn. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char hermes_head[] = "<tool_call>\n", hermes_tail[] = "\n</tool_call>";

int srv_tools_llama3(const srv *s) { return kve_model_tool_style(s->m) == KVE_TOOLS_LLAMA3; }

/* A growing string. */
typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sput(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = (b->n + n + 1) * 2;
        char *x = realloc(b->p, nc);
        if (!x) {
            b->oom = 1;
            return;
        }
        b->p = x, b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sputs(sbuf *b, const char *s) { sput(b, s, strlen(s)); }

static void sjson(sbuf *b, json_t *v, size_t flags) {
    char *t = json_dumps(v, flags | JSON_ENCODE_ANY);
    if (!t) b->oom = 1;
    else sputs(b, t);
    free(t);
}

/* One call as the model writes it. */
static void put_call(sbuf *b, int llama3, const char *name, const char *args) {
    json_error_t je;
    json_t *a = json_loads(args, JSON_DECODE_ANY, &je);
    if (!a) a = json_string(args); /* arguments that are not JSON: as a string */
    json_t *call = json_pack("{s:s, s:o}", "name", name, llama3 ? "parameters" : "arguments", a);
    if (!llama3) sputs(b, hermes_head);
    sjson(b, call, JSON_PRESERVE_ORDER);
    if (!llama3) sputs(b, hermes_tail);
    json_decref(call);
}

/* The messages with the tools and tool turns written in: out [*n] (the
 * strings in owned, freed by srv_tools_free_messages). */
int srv_tools_messages(const srv *s, const srv_request *r, kve_chat_message **out, int32_t *n, char ***owned,
                       srv_error *e) {
    const int llama3 = srv_tools_llama3(s);
    const int render_tools = r->n_tools > 0 && r->tool_choice != SRV_TOOLS_NONE;
    json_t *msgs = json_object_get((json_t *)r->root, "messages"), *tools = json_object_get((json_t *)r->root, "tools");
    const int32_t cap = r->n_msgs + 1;
    *out = calloc((size_t)cap, sizeof **out), *owned = calloc((size_t)cap + 1, sizeof **owned), *n = 0;
    if (!*out || !*owned) return srv_error_set(e, 500, "server_error", "out of memory");
    int32_t k = 0, no = 0;
    sbuf tb = {0};
    if (render_tools) {
        if (llama3) {
            sputs(&tb, "Given the following functions, please respond with a JSON for a function call with its proper "
                       "arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function "
                       "name, \"parameters\": dictionary of argument name and its value}. Do not use variables.\n\n");
            for (size_t i = 0; i < json_array_size(tools); i++) {
                sjson(&tb, json_array_get(tools, i), JSON_INDENT(4) | JSON_PRESERVE_ORDER);
                sputs(&tb, "\n\n");
            }
        } else {
            sputs(&tb, "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
                       "provided with function signatures within <tools></tools> XML tags:\n<tools>");
            for (size_t i = 0; i < json_array_size(tools); i++) {
                sputs(&tb, "\n");
                sjson(&tb, json_array_get(tools, i), JSON_PRESERVE_ORDER);
            }
            sputs(&tb, "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                       "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                       "\"arguments\": <args-json-object>}\n</tool_call>");
        }
    }
    int tools_done = !render_tools;
    if (render_tools && !llama3 && (r->n_msgs == 0 || strcmp(r->msgs[0].role, "system"))) {
        /* no system message: the template's default one carries the tools */
        sbuf b = {0};
        const char *sys = kve_chat_default_system(s->m);
        sputs(&b, sys[0] ? sys : "You are a helpful assistant.");
        sput(&b, tb.p ? tb.p : "", tb.n);
        (*owned)[no++] = b.p;
        (*out)[k++] = (kve_chat_message){"system", b.p ? b.p : ""};
        tools_done = 1;
        if (b.oom) tb.oom = 1;
    }
    for (int32_t i = 0; i < r->n_msgs; i++) {
        json_t *m = json_array_get(msgs, (size_t)i);
        const char *role = r->msgs[i].role, *content = r->msgs[i].content;
        sbuf b = {0};
        if (!strcmp(role, "tool")) {
            if (llama3) {
                (*out)[k++] = (kve_chat_message){"ipython", content};
                continue;
            }
            /* Hermes: results in user turns, consecutive ones in one */
            sputs(&b, "<tool_response>\n");
            sputs(&b, content);
            sputs(&b, "\n</tool_response>");
            if (k > 0 && i > 0 && !strcmp(r->msgs[i - 1].role, "tool")) {
                sbuf c = {0};
                sputs(&c, (*out)[k - 1].content);
                sputs(&c, "\n");
                sput(&c, b.p ? b.p : "", b.n);
                free(b.p);
                b = c;
                k--;
            }
            role = "user";
        } else if (!strcmp(role, "assistant") && json_array_size(json_object_get(m, "tool_calls")) > 0) {
            json_t *calls = json_object_get(m, "tool_calls"), *c;
            size_t j;
            if (content[0]) sputs(&b, content), sputs(&b, "\n");
            json_array_foreach(calls, j, c) {
                json_t *fn = json_object_get(c, "function");
                if (j) sputs(&b, "\n");
                put_call(&b, llama3, json_string_value(json_object_get(fn, "name")),
                         json_string_value(json_object_get(fn, "arguments")));
            }
        } else if (!tools_done && (llama3 ? !strcmp(role, "user") : !strcmp(role, "system"))) {
            if (!llama3) sputs(&b, content);
            sput(&b, tb.p ? tb.p : "", tb.n);
            if (llama3) sputs(&b, content);
            tools_done = 1;
        } else {
            (*out)[k++] = (kve_chat_message){role, content};
            continue;
        }
        if (b.oom || !b.p) {
            free(b.p), free(tb.p);
            return srv_error_set(e, 500, "server_error", "out of memory");
        }
        (*owned)[no++] = b.p;
        (*out)[k++] = (kve_chat_message){role, b.p};
    }
    free(tb.p);
    if (tb.oom) return srv_error_set(e, 500, "server_error", "out of memory");
    *n = k;
    return 0;
}

void srv_tools_free_messages(kve_chat_message *m, char **owned) {
    for (int32_t i = 0; owned && owned[i]; i++) free(owned[i]);
    free(owned), free(m);
}

/* ---------------------------------------------------------------- the grammar */

kve_grammar *srv_tools_grammar(const srv *s, const srv_request *r, srv_error *e) {
    const int llama3 = srv_tools_llama3(s);
    const char *names[SRV_MAX_TOOLS], *schemas[SRV_MAX_TOOLS];
    int32_t n = 0;
    for (int32_t i = 0; i < r->n_tools; i++)
        if (r->tool_choice == SRV_TOOLS_REQUIRED || i == r->tool_named)
            names[n] = r->tools[i].name, schemas[n++] = r->tools[i].params;
    char err[240];
    kve_grammar *g = NULL;
    int rc = kve_grammar_tool_calls(s->m, n, names, schemas, llama3 ? "" : hermes_head,
                                    llama3 ? "parameters" : "arguments", llama3 ? "" : hermes_tail, &g, err, sizeof err);
    if (rc == KVE_ERR_NOMEM) srv_error_set(e, 500, "server_error", "out of memory");
    else if (rc != KVE_OK) srv_error_set(e, 400, "invalid_request_error", "'tools': %s", err);
    return g;
}

/* ---------------------------------------------------------------- parsing replies */

/* The header the grammar writes before a call's arguments, and where the
 * name starts in it. */
size_t srv_tools_header(int llama3, const char *text, size_t len, size_t *name_at, size_t *name_len) {
    const char *head = llama3 ? "" : hermes_head, *key = llama3 ? "\", \"parameters\": " : "\", \"arguments\": ";
    const char *open = "{\"name\": \"";
    size_t h = strlen(head), o = strlen(open), k = strlen(key);
    if (len < h + o || memcmp(text, head, h) || memcmp(text + h, open, o)) return 0;
    for (size_t i = h + o; i + k <= len; i++)
        if (!memcmp(text + i, key, k)) {
            *name_at = h + o, *name_len = i - (h + o);
            return i + k;
        }
    return 0;
}

/* One call {"name": ..., "arguments"/"parameters": {...}} as JSON text:
 * a tool_calls entry, or NULL. */
static json_t *call_entry(const srv_request *r, json_t *obj, const char *id) {
    json_t *name = json_object_get(obj, "name"), *args = json_object_get(obj, "arguments");
    if (!args) args = json_object_get(obj, "parameters");
    if (!json_is_string(name) || !(json_is_object(args) || json_is_string(args))) return NULL;
    int known = 0;
    for (int32_t i = 0; i < r->n_tools; i++) known |= !strcmp(r->tools[i].name, json_string_value(name));
    if (!known) return NULL;
    char *a = json_is_string(args) ? strdup(json_string_value(args)) : json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_t *entry = json_pack("{s:s, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function", "name", name,
                              "arguments", a ? a : "{}");
    free(a);
    return entry;
}

/* The reply text as tool calls: *calls (an array of tool_calls entries)
 * when the reply, after leading whitespace, is one or more calls; then
 * *content_len is the length of text before them (0). NULL when it is not. */
json_t *srv_tools_parse(const srv *s, const srv_request *r, const char *text, size_t len, const char *id_base) {
    const int llama3 = srv_tools_llama3(s);
    size_t at = 0;
    while (at < len && (text[at] == ' ' || text[at] == '\n' || text[at] == '\t' || text[at] == '\r')) at++;
    json_t *calls = json_array();
    for (int idx = 0; at < len && idx < (r->one_call ? 1 : 16); idx++) {
        json_error_t je;
        json_t *obj;
        char id[64];
        snprintf(id, sizeof id, "%s_%d", id_base, idx);
        if (llama3) {
            obj = json_loadb(text + at, len - at, JSON_DISABLE_EOF_CHECK, &je);
            if (!obj) break;
            at += je.position;
        } else {
            const size_t h = strlen(hermes_head) - 1; /* "<tool_call>" then any whitespace */
            if (len - at < h || memcmp(text + at, hermes_head, h)) break;
            const char *end = NULL;
            for (size_t i = at + h; i + 12 <= len && !end; i++)
                if (!memcmp(text + i, "</tool_call>", 12)) end = text + i;
            size_t stop = end ? (size_t)(end - text) : len;
            obj = json_loadb(text + at + h, stop - at - h, 0, &je);
            if (!obj) break;
            at = end ? stop + 12 : len;
        }
        json_t *entry = call_entry(r, obj, id);
        json_decref(obj);
        if (!entry) break;
        json_array_append_new(calls, entry);
        while (at < len && (text[at] == ' ' || text[at] == '\n' || text[at] == '\t' || text[at] == '\r')) at++;
    }
    if (at < len || json_array_size(calls) == 0) { /* something else in the reply: it is text */
        json_decref(calls);
        return NULL;
    }
    return calls;
}
