/* server/generate.c - POST /v1/chat/completions and /v1/completions: the
 * prompt's tokens, a request handed to the scheduler thread, and the tokens
 * coming back through a queue of this request's own, written as SSE chunks
 * (stream) or one JSON reply. A write that fails, or a socket the client
 * closed (looked at while waiting for tokens), means the client left: the
 * request is cancelled and its pages are freed at the next step. */
#include "internal.h"

#include <civetweb.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- the queue */

/* A kve_event copied out of the scheduler thread. */
typedef struct {
    int32_t choice, token;
    char *text;                          /* [len] malloc'ed, NUL-terminated */
    size_t len;
    float logprob;
    int32_t n_top;
    int32_t top_ids[KVE_MAX_TOP];
    float top_lps[KVE_MAX_TOP];
    kve_stop_reason finish;
    int32_t n_prompt, n_cached, n_generated;
    char error[128];
    double t;                            /* when the scheduler produced it */
} gen_event;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    gen_event *ev;                       /* [n] pending, oldest first */
    size_t n, cap;
} gen_queue;

/* One engine request's events into the HTTP request's queue: a list of
 * prompts is a request a prompt, its choices numbered from base. */
typedef struct {
    gen_queue *q;
    int32_t base;
} gen_source;

static void on_event(void *user, const kve_event *e) {
    const gen_source *src = user;
    gen_queue *q = src->q;
    gen_event g = {.choice = src->base + e->choice, .token = e->token, .len = e->text_len,
                   .logprob = isfinite(e->logprob) ? e->logprob : -9999.0f,
                   .n_top = e->n_top, .finish = e->stop, .n_prompt = e->n_prompt,
                   .n_cached = e->n_cached, .n_generated = e->n_generated, .t = now_s()};
    g.text = malloc(e->text_len + 1);
    if (g.text) memcpy(g.text, e->text, e->text_len), g.text[e->text_len] = 0;
    else g.len = 0;
    for (int32_t i = 0; i < e->n_top; i++)
        g.top_ids[i] = e->top_ids[i], g.top_lps[i] = isfinite(e->top_logprobs[i]) ? e->top_logprobs[i] : -9999.0f;
    if (e->error) snprintf(g.error, sizeof g.error, "%s", e->error);
    pthread_mutex_lock(&q->mu);
    if (q->n == q->cap) {
        size_t nc = q->cap ? 2 * q->cap : 16;
        gen_event *p = realloc(q->ev, sizeof *p * nc);
        if (p) q->ev = p, q->cap = nc;
    }
    if (q->n < q->cap) q->ev[q->n++] = g;
    else if (g.finish != KVE_STOP_NONE) q->ev[q->n - 1] = g;   /* out of memory: the end must arrive */
    else free(g.text);
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* Waits on q (locked) until an event comes or ms pass. */
static void queue_wait(gen_queue *q, int ms) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_nsec += (long)ms * 1000000L;
    t.tv_sec += t.tv_nsec / 1000000000L, t.tv_nsec %= 1000000000L;
    while (q->n == 0)
        if (pthread_cond_timedwait(&q->cv, &q->mu, &t) == ETIMEDOUT) return;
}

/* ---------------------------------------------------------------- the prompt */

int srv_prompt_tokens(srv *s, const srv_request *r, int32_t **out, int32_t *n, srv_error *e) {
    *out = NULL, *n = 0;
    if (r->tokens) {   /* a completion prompt given as ids */
        if (r->n_tokens == 0) return srv_error_set(e, 400, "invalid_request_error", "the prompt is empty");
        for (int32_t i = 0; i < r->n_tokens; i++)
            if (r->tokens[i] >= kve_model_n_vocab(s->m))
                return srv_error_set(e, 400, "invalid_request_error", "token id %d is outside the vocabulary of %d",
                                     (int)r->tokens[i], (int)kve_model_n_vocab(s->m));
        *out = malloc(sizeof(int32_t) * (size_t)(r->n_tokens ? r->n_tokens : 1));
        if (!*out) return srv_error_set(e, 500, "server_error", "out of memory");
        memcpy(*out, r->tokens, sizeof(int32_t) * (size_t)r->n_tokens);
        *n = r->n_tokens;
        return 0;
    }
    int32_t need = 0;
    int rc;
    if (r->kind == SRV_CHAT) {   /* the template's markers are control tokens, the messages text */
        if (!kve_model_has_chat_template(s->m))
            return srv_error_set(e, 400, "invalid_request_error", "the model has no chat template this server knows; use /v1/completions");
        const kve_chat_message *msgs = r->msgs;
        kve_chat_message *written = NULL;
        int32_t n_msgs = r->n_msgs;
        char **owned = NULL;
        if (r->n_tools > 0 || r->has_tool_history) {   /* tools and tool turns written in */
            if (srv_tools_messages(s, r, &written, &n_msgs, &owned, e)) {
                srv_tools_free_messages(written, owned);
                return -1;
            }
            msgs = written;
        }
        rc = kve_chat_tokenize(s->m, msgs, n_msgs, 0, 1, 1, r->enable_thinking, NULL, 0, &need);
        if ((rc == KVE_OK || rc == KVE_ERR_SPACE) && !(*out = malloc(sizeof(int32_t) * (size_t)(need ? need : 1))))
            rc = KVE_ERR_NOMEM;
        else if (rc == KVE_OK || rc == KVE_ERR_SPACE)
            rc = kve_chat_tokenize(s->m, msgs, n_msgs, 0, 1, 1, r->enable_thinking, *out, need, n);
        srv_tools_free_messages(written, owned);
        if (rc == KVE_ERR_TEMPLATE)
            return srv_error_set(e, 400, "invalid_request_error",
                                 "'chat_template_kwargs.enable_thinking' is not supported: the model's chat template "
                                 "has no thinking switch");
    } else {
        rc = kve_tokenize(s->m, r->prompt, r->prompt_len, 1, r->parse_special, NULL, 0, &need);
        if ((rc == KVE_OK || rc == KVE_ERR_SPACE) && !(*out = malloc(sizeof(int32_t) * (size_t)(need ? need : 1))))
            rc = KVE_ERR_NOMEM;
        else if (rc == KVE_OK || rc == KVE_ERR_SPACE)
            rc = kve_tokenize(s->m, r->prompt, r->prompt_len, 1, r->parse_special, *out, need, n);
    }
    if (rc != KVE_OK) {
        free(*out), *out = NULL, *n = 0;
        return srv_error_set(e, 400, "invalid_request_error", "the %s cannot be tokenized (too long?)",
                             r->kind == SRV_CHAT ? "messages" : "prompt");
    }
    if (*n == 0) {   /* an empty text and a model that adds no BOS */
        free(*out), *out = NULL;
        return srv_error_set(e, 400, "invalid_request_error", "the prompt is empty");
    }
    return 0;
}

/* ---------------------------------------------------------------- output */

typedef struct {
    char *text;                          /* [len] accumulated (non-stream) */
    size_t len, cap;
    size_t streamed;                     /* bytes of text sent so far (stream): the next text_offset */
    json_t *lp;                          /* logprobs so far (non-stream) */
    kve_stop_reason finish;
    double t_last;                       /* the previous token's time, 0 before the first */
    /* tool calls while streaming: TOOL_UNDECIDED (auto: held while the reply
     * may begin a call), TOOL_TEXT (streamed as content), TOOL_HELD (auto: a
     * call, sent at the end), TOOL_HEADER / TOOL_ARGS / TOOL_DONE (a call
     * the grammar holds: name, then argument fragments as they come) */
    int tool;
    size_t args_at;                      /* where the arguments start in text */
    size_t args_sent;                    /* bytes of text sent as arguments so far */
} gen_choice;

enum { TOOL_OFF, TOOL_UNDECIDED, TOOL_TEXT, TOOL_HELD, TOOL_HEADER, TOOL_ARGS, TOOL_DONE };

typedef struct {
    srv *s;
    struct mg_connection *conn;
    const srv_request *r;
    char id[48];
    int64_t created;
    kve_request **req;                   /* [n_req]: one a prompt */
    int32_t n_req;
    int32_t *req_prompt, *req_cached;    /* [n_req]: each one's prompt tokens, and of them cached */
    int broken;                          /* a write failed: the client is gone */
    double t_submit;
    double t_first;                      /* when the first token came; 0: none yet */
    int first_seen;
    int32_t n_prompt, n_cached, n_generated;   /* over all the requests */
    int32_t n_finished;                  /* choices ended */
    char error[128];
    gen_choice *ch;                      /* [n_ch]: prompt p's choice j at p * r->n + j */
    int32_t n_ch;
} gen_out;

static int is_chat(const gen_out *o) { return o->r->kind == SRV_CHAT; }

static void call_id(const gen_out *o, int32_t choice, char *id, size_t cap) {
    snprintf(id, cap, "call_%s_%d", strchr(o->id, '-') ? strchr(o->id, '-') + 1 : o->id, (int)choice);
}

static void cancel_all(gen_out *o) {
    for (int32_t k = 0; k < o->n_req; k++) kve_request_cancel(o->req[k]);
}

/* One SSE event: "data: JSON\n\n" as one chunk. */
static void send_sse(gen_out *o, json_t *obj) {
    char *text = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (!text || o->broken) { free(text); return; }
    size_t n = strlen(text);
    char *buf = malloc(n + 9);
    if (buf) {
        memcpy(buf, "data: ", 6), memcpy(buf + 6, text, n), memcpy(buf + 6 + n, "\n\n", 2);
        if (mg_send_chunk(o->conn, buf, (unsigned)(n + 8)) <= 0) o->broken = 1;
    }
    free(buf), free(text);
    if (o->broken) cancel_all(o);
}

static json_t *chunk(gen_out *o, json_t *choices) {
    json_t *c = json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", o->id, "object",
                          is_chat(o) ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)o->created, "model", o->s->model_id, "choices", choices);
    if (c && o->r->include_usage) json_object_set_new(c, "usage", json_null());
    return c;
}

/* A token's logprobs entry: chat {"token","logprob","bytes","top_logprobs"};
 * completions add to {"tokens","token_logprobs","top_logprobs","text_offset"}. */
static json_t *chat_logprob(gen_out *o, const gen_event *g) {
    size_t len = 0;
    const char *piece = kve_token_piece(o->s->m, g->token, &len);
    json_t *top = json_array();
    for (int32_t i = 0; i < g->n_top; i++) {
        size_t tl = 0;
        const char *tp = kve_token_piece(o->s->m, g->top_ids[i], &tl);
        json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token", srv_json_text(tp, tl), "logprob",
                                             (double)g->top_lps[i], "bytes", srv_json_bytes(tp, tl)));
    }
    return json_pack("{s:o, s:f, s:o, s:o}", "token", srv_json_text(piece, len), "logprob", (double)g->logprob,
                     "bytes", srv_json_bytes(piece, len), "top_logprobs", top);
}

static void completion_logprob(gen_out *o, json_t *lp, const gen_event *g, size_t offset) {
    size_t len = 0;
    const char *piece = kve_token_piece(o->s->m, g->token, &len);
    json_t *top = json_object();
    for (int32_t i = 0; i < g->n_top; i++) {
        size_t tl = 0;
        const char *tp = kve_token_piece(o->s->m, g->top_ids[i], &tl);
        json_t *key = srv_json_text(tp, tl);
        json_object_set_new(top, json_string_value(key), json_real(g->top_lps[i]));
        json_decref(key);
    }
    json_array_append_new(json_object_get(lp, "tokens"), srv_json_text(piece, len));
    json_array_append_new(json_object_get(lp, "token_logprobs"), json_real(g->logprob));
    json_array_append_new(json_object_get(lp, "top_logprobs"), top);
    json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)offset));
}

static json_t *new_logprobs(const gen_out *o) {
    return is_chat(o) ? json_pack("{s:[]}", "content")
                      : json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

/* A streamed piece of choice i: text, and this token's logprobs when asked. */
static void stream_piece(gen_out *o, int32_t i, const char *text, size_t len, const gen_event *lpg,
                         kve_stop_reason finish) {
    json_t *lp = json_null();
    if (lpg && o->r->logprobs) {
        lp = new_logprobs(o);
        if (is_chat(o)) json_array_append_new(json_object_get(lp, "content"), chat_logprob(o, lpg));
        else completion_logprob(o, lp, lpg, o->ch[i].streamed);
    }
    o->ch[i].streamed += len;
    json_t *fr = finish != KVE_STOP_NONE ? json_string(srv_finish_reason(finish)) : json_null();
    json_t *c = is_chat(o) ? json_pack("{s:i, s:o, s:o, s:o}", "index", i, "delta",
                                       finish != KVE_STOP_NONE && !len ? json_object()
                                                                       : json_pack("{s:o}", "content", srv_json_text(text, len)),
                                       "logprobs", lp, "finish_reason", fr)
                           : json_pack("{s:i, s:o, s:o, s:o}", "index", i, "text", srv_json_text(text, len), "logprobs",
                                       lp, "finish_reason", fr);
    send_sse(o, chunk(o, json_pack("[o]", c)));
}

/* A delta of choice i with one tool_calls entry, or the last one (finish). */
static void tool_delta(gen_out *o, int32_t i, json_t *call, const char *finish) {
    json_t *delta = call ? json_pack("{s:[o]}", "tool_calls", call) : json_object();
    json_t *fr = finish ? json_string(finish) : json_null();
    send_sse(o, chunk(o, json_pack("[{s:i, s:o, s:n, s:o}]", "index", i, "delta", delta, "logprobs", "finish_reason", fr)));
}

static void append_text(gen_choice *c, const char *text, size_t len);

/* Choice i's text grew (streaming with tools): what of it can go out now. */
static void tool_stream(gen_out *o, int32_t i, int final) {
    gen_choice *c = &o->ch[i];
    const int llama3 = srv_tools_llama3(o->s);
    if (c->tool == TOOL_UNDECIDED) {   /* auto: text until it cannot be the start of a call */
        size_t at = 0;
        while (at < c->len && strchr(" \n\t\r", c->text[at])) at++;
        const char *mark = llama3 ? "{" : "<tool_call>";
        size_t k = strlen(mark), n = c->len - at < k ? c->len - at : k;
        if (n > 0 && !memcmp(c->text + at, mark, n)) c->tool = n == k ? TOOL_HELD : TOOL_UNDECIDED;
        else if (c->len > at) c->tool = TOOL_TEXT;
        if (c->tool == TOOL_TEXT || (final && c->tool == TOOL_UNDECIDED)) {
            stream_piece(o, i, c->text, c->len, NULL, KVE_STOP_NONE);
            c->tool = TOOL_TEXT;
        }
    }
    if (c->tool == TOOL_HELD && final) {
        char id[64];
        call_id(o, i, id, sizeof id);
        json_t *calls = srv_tools_parse(o->s, o->r, c->text, c->len, id), *e;
        size_t k;
        if (!calls) {   /* not a call after all: it is text */
            stream_piece(o, i, c->text, c->len, NULL, KVE_STOP_NONE);
            c->tool = TOOL_TEXT;
            return;
        }
        json_array_foreach(calls, k, e) {
            json_t *f = json_object_get(e, "function");
            tool_delta(o, i, json_pack("{s:i, s:O, s:s, s:{s:O, s:s}}", "index", (int)k, "id", json_object_get(e, "id"),
                                       "type", "function", "function", "name", json_object_get(f, "name"), "arguments", ""),
                       NULL);
            tool_delta(o, i, json_pack("{s:i, s:{s:O}}", "index", (int)k, "function", "arguments",
                                       json_object_get(f, "arguments")), NULL);
        }
        json_decref(calls);
        c->tool = TOOL_DONE;
    }
    if (c->tool == TOOL_HEADER) {   /* a call the grammar holds: the name once its header is whole */
        size_t name_at, name_len, args = srv_tools_header(llama3, c->text, c->len, &name_at, &name_len);
        if (!args) return;
        char id[64];
        call_id(o, i, id, sizeof id);
        strcat(id, "_0");
        tool_delta(o, i, json_pack("{s:i, s:s, s:s, s:{s:s%, s:s}}", "index", 0, "id", id, "type", "function",
                                   "function", "name", c->text + name_at, name_len, "arguments", ""), NULL);
        c->tool = TOOL_ARGS, c->args_at = c->args_sent = args;
    }
    if (c->tool == TOOL_ARGS) {   /* fragments up to the end of the arguments' object */
        json_error_t je;   /* the grammar holds the text to JSON: not a whole object yet is a prefix of one */
        json_t *whole = json_loadb(c->text + c->args_at, c->len - c->args_at, JSON_DISABLE_EOF_CHECK, &je);
        size_t end = whole ? c->args_at + (size_t)je.position : c->len;
        json_decref(whole);
        if (end > c->args_sent)
            tool_delta(o, i, json_pack("{s:i, s:{s:s%}}", "index", 0, "function", "arguments", c->text + c->args_sent,
                                       end - c->args_sent), NULL);
        c->args_sent = end > c->args_sent ? end : c->args_sent;
        if (whole) c->tool = TOOL_DONE;
    }
}

static void append_text(gen_choice *c, const char *text, size_t len) {
    if (c->len + len + 1 > c->cap) {
        size_t nc = (c->len + len + 1) * 2;
        char *p = realloc(c->text, nc);
        if (!p) return;
        c->text = p, c->cap = nc;
    }
    memcpy(c->text + c->len, text, len);
    c->len += len;
    c->text[c->len] = 0;
}

static void on_gen_event(gen_out *o, const gen_event *g) {
    gen_choice *c = &o->ch[g->choice];
    const int32_t k = g->choice / (int32_t)o->r->n;   /* the prompt's request it came from */
    o->n_prompt += g->n_prompt - o->req_prompt[k], o->n_cached += g->n_cached - o->req_cached[k];
    o->req_prompt[k] = g->n_prompt, o->req_cached[k] = g->n_cached;
    if (g->token >= 0) {
        srv_metrics *m = &o->s->metrics;
        if (!o->first_seen) {
            o->first_seen = 1, o->t_first = g->t;
            srv_metrics_observe(m, &m->ttft, g->t - o->t_submit);
        }
        if (c->t_last > 0) srv_metrics_observe(m, &m->itl, g->t - c->t_last);
        c->t_last = g->t;
        if (o->r->stream && c->tool != TOOL_OFF && c->tool != TOOL_TEXT) {
            append_text(c, g->text, g->len);
            tool_stream(o, g->choice, 0);
        } else if (o->r->stream) {
            if (g->len || o->r->logprobs) stream_piece(o, g->choice, g->text, g->len, g, KVE_STOP_NONE);
        } else {
            if (o->r->logprobs) {
                if (is_chat(o)) json_array_append_new(json_object_get(c->lp, "content"), chat_logprob(o, g));
                else completion_logprob(o, c->lp, g, c->len);
            }
            append_text(c, g->text, g->len);
        }
    }
    if (g->finish != KVE_STOP_NONE) {
        c->finish = g->finish;
        o->n_finished++, o->n_generated += g->n_generated;
        if (g->finish == KVE_STOP_ERROR) snprintf(o->error, sizeof o->error, "%s", g->error);
        if (o->r->stream && c->tool != TOOL_OFF && c->tool != TOOL_TEXT) {
            append_text(c, g->text, g->len);
            tool_stream(o, g->choice, 1);
            if (c->tool == TOOL_DONE && g->finish == KVE_STOP_EOG) tool_delta(o, g->choice, NULL, "tool_calls");
            else stream_piece(o, g->choice, "", 0, NULL, g->finish);
        } else if (o->r->stream) {
            if (g->len) stream_piece(o, g->choice, g->text, g->len, NULL, KVE_STOP_NONE);
            stream_piece(o, g->choice, "", 0, NULL, g->finish);
        } else {
            append_text(c, g->text, g->len);
        }
    }
}

/* The whole reply of a request that did not stream. */
static int reply_whole(gen_out *o) {
    srv_error e;
    if (o->error[0]) {
        srv_error_set(&e, 500, "server_error", "generation failed: %s", o->error);
        return srv_reply_error(o->s, o->conn, &e);
    }
    json_t *choices = json_array();
    for (int32_t i = 0; i < o->n_ch; i++) {
        gen_choice *c = &o->ch[i];
        json_t *text = srv_json_text(c->text ? c->text : "", c->len);
        json_t *lp = o->r->logprobs ? json_incref(c->lp) : json_null();
        json_t *calls = NULL;
        if (c->tool != TOOL_OFF && c->finish == KVE_STOP_EOG) {
            char id[64];
            call_id(o, i, id, sizeof id);
            calls = srv_tools_parse(o->s, o->r, c->text ? c->text : "", c->len, id);
        }
        json_t *fr = json_string(calls ? "tool_calls" : srv_finish_reason(c->finish));
        json_t *msg = NULL;
        if (is_chat(o)) {
            msg = json_pack("{s:s, s:o}", "role", "assistant", "content", calls ? (json_decref(text), json_null()) : text);
            if (calls) json_object_set_new(msg, "tool_calls", calls);
        }
        json_array_append_new(choices, is_chat(o) ? json_pack("{s:i, s:o, s:o, s:o}", "index", i, "message", msg,
                                                              "logprobs", lp, "finish_reason", fr)
                                                  : json_pack("{s:i, s:o, s:o, s:o}", "index", i, "text", text,
                                                              "logprobs", lp, "finish_reason", fr));
    }
    json_t *body = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", o->id, "object",
                             is_chat(o) ? "chat.completion" : "text_completion", "created", (json_int_t)o->created,
                             "model", o->s->model_id, "choices", choices, "usage",
                             srv_json_usage(o->n_prompt, o->n_cached, o->n_generated));
    return srv_reply_json(o->s, o->conn, 200, body);
}

static void start_stream(gen_out *o) {
    mg_response_header_start(o->conn, 200);
    mg_response_header_add(o->conn, "Content-Type", "text/event-stream", -1);
    mg_response_header_add(o->conn, "Cache-Control", "no-cache", -1);
    mg_response_header_add(o->conn, "Transfer-Encoding", "chunked", -1);
    mg_response_header_send(o->conn);
    srv_metrics_status(&o->s->metrics, 200);
    if (!is_chat(o)) return;
    for (int32_t i = 0; i < o->r->n; i++)   /* OpenAI's first delta names the role */
        send_sse(o, chunk(o, json_pack("[{s:i, s:{s:s, s:s}, s:n, s:n}]", "index", i, "delta", "role", "assistant",
                                       "content", "", "logprobs", "finish_reason")));
}

static void end_stream(gen_out *o) {
    if (o->error[0])
        send_sse(o, json_pack("{s:{s:s, s:s, s:i}}", "error", "message", o->error, "type", "server_error", "code", 500));
    if (o->r->include_usage) {
        json_t *c = chunk(o, json_array());
        json_object_set_new(c, "usage", srv_json_usage(o->n_prompt, o->n_cached, o->n_generated));
        send_sse(o, c);
    }
    if (!o->broken && mg_send_chunk(o->conn, "data: [DONE]\n\n", 14) <= 0) o->broken = 1;
    if (!o->broken) mg_send_chunk(o->conn, "", 0);   /* the chunked body's end */
}

/* ---------------------------------------------------------------- the handler */

/* The token ids of each of r's n prompts (a chat's messages, a single
 * prompt, or a list's prompts in turn) into ids[k], n_ids[k]; an error
 * names the prompt of a list that caused it. */
static int prompts_tokens(srv *s, const srv_request *r, int32_t n, int32_t **ids, int32_t *n_ids, srv_error *e) {
    for (int32_t k = 0; k < n; k++) {
        srv_request one = *r;   /* prompt k as the only one */
        if (r->n_prompts) {
            one.prompt = r->prompts[k].text, one.prompt_len = r->prompts[k].len;
            one.tokens = r->prompts[k].ids, one.n_tokens = r->prompts[k].n_ids;
        }
        if (srv_prompt_tokens(s, &one, &ids[k], &n_ids[k], e)) {
            if (r->n_prompts) {
                char why[sizeof e->message - 32];   /* room for the prefix */
                const size_t l = strnlen(e->message, sizeof why - 1);
                memcpy(why, e->message, l), why[l] = 0;
                snprintf(e->message, sizeof e->message, "prompt %d of the list: %s", (int)k, why);
            }
            return -1;
        }
    }
    return 0;
}

static void free_ids(int32_t **ids, int32_t n) {
    for (int32_t k = 0; ids && k < n; k++) free(ids[k]);
    free(ids);
}

/* One line on stderr per generation request, as llama-server logs them: its
 * id, HTTP status, tokens, time to the first token, time in all, and why it
 * ended. One fprintf: lines of concurrent requests never interleave. */
static void log_request(const gen_out *o, int status) {
    char ttft[32] = "none";
    if (o->first_seen) snprintf(ttft, sizeof ttft, "%.3f s", o->t_first - o->t_submit);
    const char *why = o->broken ? "client gone" : o->error[0] ? o->error : srv_finish_reason(o->ch[0].finish);
    fprintf(stderr, "kvcache serve: %s %d: prompt %d tokens (%d cached), %d generated, first token %s, "
                    "total %.3f s, finish %s\n",
            o->id, status, (int)o->n_prompt, (int)o->n_cached, (int)o->n_generated, ttft, now_s() - o->t_submit, why);
}

int srv_handle_generate(srv *s, struct mg_connection *conn, srv_kind kind, const char *body, size_t len) {
    srv_request r;
    srv_error e;
    if (srv_request_parse(kind, body, len, &r, &e)) return srv_reply_error(s, conn, &e);
    char path[sizeof s->session_dir + SRV_MAX_SESSION_NAME + 8];   /* DIR/NAME.kvs */
    if (r.session && !s->session_dir[0]) {
        srv_error_set(&e, 400, "invalid_request_error",
                      "'session' needs a server started with --session-dir (this one keeps no sessions)");
        srv_request_free(&r);
        return srv_reply_error(s, conn, &e);
    }
    if (r.session) snprintf(path, sizeof path, "%s/%s.kvs", s->session_dir, r.session);   /* a name, never a path */
    for (int32_t i = 0; i < r.n_bias; i++)
        if (r.bias[i].token >= kve_model_n_vocab(s->m)) {
            srv_error_set(&e, 400, "invalid_request_error", "'logit_bias' token id %d is outside the vocabulary of %d",
                          (int)r.bias[i].token, (int)kve_model_n_vocab(s->m));
            srv_request_free(&r);
            return srv_reply_error(s, conn, &e);
        }
    const int32_t n_req = r.n_prompts ? r.n_prompts : 1;
    int32_t **ids = calloc((size_t)n_req, sizeof *ids), *n_ids = calloc((size_t)n_req, sizeof *n_ids);
    if (!ids || !n_ids) srv_error_set(&e, 500, "server_error", "out of memory");
    if (!ids || !n_ids || prompts_tokens(s, &r, n_req, ids, n_ids, &e)) {
        free_ids(ids, n_req), free(n_ids);
        srv_request_free(&r);
        return srv_reply_error(s, conn, &e);
    }
    gen_queue q = {.n = 0};
    pthread_mutex_init(&q.mu, NULL);
    pthread_cond_init(&q.cv, NULL);
    gen_out *o = calloc(1, sizeof *o);
    gen_source *src = calloc((size_t)n_req, sizeof *src);
    const uint64_t serial = atomic_fetch_add(&s->next_id, 1);
    int rc = KVE_OK;
    char msg[240];
    if (o) {
        *o = (gen_out){.s = s, .conn = conn, .r = &r, .created = (int64_t)time(NULL), .t_submit = now_s(),
                       .n_ch = n_req * (int32_t)r.n, .req = calloc((size_t)n_req, sizeof *o->req),
                       .req_prompt = calloc((size_t)n_req, sizeof(int32_t)),
                       .req_cached = calloc((size_t)n_req, sizeof(int32_t))};
        o->ch = calloc((size_t)o->n_ch, sizeof *o->ch);
        snprintf(o->id, sizeof o->id, "%s-%llx%06llx", kind == SRV_CHAT ? "chatcmpl" : "cmpl",
                 (unsigned long long)o->created, (unsigned long long)serial);
    }
    if (!o || !src || !o->req || !o->req_prompt || !o->req_cached || !o->ch) rc = KVE_ERR_NOMEM;
    kve_request_params rp = kve_request_default_params();
    rp.max_tokens = (int32_t)r.max_tokens;
    rp.temperature = (float)r.temperature, rp.top_k = (int32_t)r.top_k, rp.top_p = (float)r.top_p;
    rp.min_p = (float)r.min_p, rp.repeat_penalty = (float)r.repeat_penalty;
    rp.presence_penalty = (float)r.presence_penalty, rp.frequency_penalty = (float)r.frequency_penalty;
    rp.stops = r.stops, rp.n_stops = r.n_stops, rp.top_logprobs = r.logprobs ? (int32_t)r.top_logprobs : -1;
    rp.on_event = on_event;
    kve_request_options ro = kve_request_default_options();
    ro.n_choices = (int32_t)r.n, ro.repeat_last_n = (int32_t)r.repeat_last_n, ro.callback_only = 1;
    ro.logit_bias = r.bias, ro.n_logit_bias = r.n_bias, ro.json_object = r.json_object;
    ro.session_file = r.session ? path : NULL;
    /* a json_schema, or one call the grammar holds: compiled for the model */
    kve_grammar *rules = NULL;
    const int tools_on = r.n_tools > 0 && r.tool_choice != SRV_TOOLS_NONE;
    const int call_rules = tools_on && (r.tool_choice == SRV_TOOLS_REQUIRED || r.tool_choice == SRV_TOOLS_NAMED);
    int failed_early = 0;   /* e already says why */
    if (rc == KVE_OK && call_rules) {
        if (!(rules = srv_tools_grammar(s, &r, &e))) failed_early = 1;
    } else if (rc == KVE_OK && r.schema) {
        rc = kve_grammar_parse(s->m, r.schema, strlen(r.schema), 1, &rules, msg, sizeof msg);
    }
    ro.grammar = rules;
    /* each prompt its own request (a seed seeds each alike, as it would them one by one) */
    for (int32_t k = 0; k < n_req && rc == KVE_OK && !failed_early; k++) {
        rp.tokens = ids[k], rp.n_tokens = n_ids[k];
        rp.random_state = r.has_seed ? r.seed
                                     : ((uint64_t)time(NULL) * 1000003u + serial) ^ (0x9E3779B97F4A7C15u * (uint64_t)k);
        src[k] = (gen_source){.q = &q, .base = k * (int32_t)r.n};
        rp.user = &src[k];
        rc = kve_submit_ex(s->c, &rp, &ro, &o->req[k], msg, sizeof msg);
        if (rc == KVE_OK) o->n_req = k + 1;
    }
    free_ids(ids, n_req), free(n_ids);
    int status;
    if (rc || failed_early) {
        if (o && o->n_req) cancel_all(o);   /* the prompts already in go again */
        for (int32_t k = 0; o && k < o->n_req; k++) kve_request_free(o->req[k]);
        if (!failed_early && (rc == KVE_ERR_QUEUE_FULL || rc == KVE_ERR_STOPPED))
            srv_error_set(&e, 503, "unavailable_error", "%s", msg);
        else if (!failed_early && rc == KVE_ERR_NOMEM)
            srv_error_set(&e, 500, "server_error", "out of memory");
        else if (!failed_early)
            srv_error_set(&e, 400, "invalid_request_error", "%s", msg);
        status = srv_reply_error(s, conn, &e);
    } else {
        for (int32_t i = 0; i < o->n_ch && r.logprobs && !r.stream; i++) o->ch[i].lp = new_logprobs(o);
        for (int32_t i = 0; i < o->n_ch && tools_on; i++) o->ch[i].tool = call_rules ? TOOL_HEADER : TOOL_UNDECIDED;
        if (r.stream) start_stream(o);
        int fd = -2;   /* the client's socket, looked up once the request has run a while */
        double t_looked = now_s();
        while (o->n_finished < o->n_ch) {   /* until every choice has ended */
            pthread_mutex_lock(&q.mu);
            queue_wait(&q, SRV_GONE_POLL_MS);
            gen_event *ev = q.ev;
            size_t n = q.n;
            q.ev = NULL, q.n = q.cap = 0;
            pthread_mutex_unlock(&q.mu);
            if (!o->broken && now_s() - t_looked >= SRV_GONE_POLL_MS * 1e-3) {   /* is anyone still waiting? */
                t_looked = now_s();
                if (fd == -2) fd = srv_conn_socket(conn);
                if (srv_client_gone(fd)) o->broken = 1, cancel_all(o);
            }
            for (size_t k = 0; k < n; k++) {
                on_gen_event(o, &ev[k]);
                free(ev[k].text);
            }
            free(ev);
        }
        /* each waits for its request's end (its pages freed); then q is ours */
        for (int32_t k = 0; k < o->n_req; k++) kve_request_free(o->req[k]);
        o->n_req = 0;
        if (r.stream) end_stream(o);
        /* 499: the client closed the connection before the reply (nginx's code, for the log) */
        status = r.stream ? 200 : o->broken ? 499 : reply_whole(o);
        log_request(o, status);
    }
    if (o) {
        for (int32_t i = 0; o->ch && i < o->n_ch; i++) free(o->ch[i].text), json_decref(o->ch[i].lp);
        free(o->ch), free(o->req), free(o->req_prompt), free(o->req_cached);
    }
    for (size_t k = 0; k < q.n; k++) free(q.ev[k].text);
    free(q.ev);
    pthread_mutex_destroy(&q.mu);
    pthread_cond_destroy(&q.cv);
    free(o), free(src);
    kve_grammar_free(rules);
    srv_request_free(&r);
    return status;
}
