/* server/internal.h - what the server's files share: the server record, HTTP
 * replies, JSON building, metrics. Not installed. */
#ifndef SRV_INTERNAL_H
#define SRV_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "request.h"
#include "server.h"

struct mg_connection;
struct mg_context;

enum { SRV_MAX_BODY = 1 << 20 };   /* request bodies beyond 1 MiB get 413; 1 MiB itself is read */
/* civetweb's defaults when srv_params leaves them 0, and the connections that
 * may wait for a worker (in civetweb's queue, and as many in the kernel's
 * listen backlog, which Linux caps at net.core.somaxconn) */
enum { SRV_HTTP_THREADS = 128, SRV_HTTP_TIMEOUT_MS = 10000, SRV_KEEP_ALIVE_MS = 5000 };
/* how often a handler waiting for tokens looks whether its client left */
enum { SRV_GONE_POLL_MS = 50 };
#define SRV_BACKLOG_STR "1024"
enum { SRV_LOADING = 0, SRV_READY = 1, SRV_STOPPING = 2 };

/* ---------------------------------------------------------------- metrics */

enum { HIST_BUCKETS = 14, SRV_N_STATUS = 8 };

typedef struct {
    const double *le;                  /* [n] upper bounds, ascending (+Inf implied) */
    int n;
    uint64_t count[HIST_BUCKETS + 1];  /* per bucket, not cumulative; [n] is +Inf */
    double sum;
    uint64_t total;
} srv_hist;

typedef struct {
    pthread_mutex_t mu;
    srv_hist ttft;                     /* submit -> first token, seconds */
    srv_hist itl;                      /* between tokens of one choice, seconds */
    uint64_t by_status[SRV_N_STATUS];  /* replies 200, 400, 401, 404, 405, 413, 503, other */
} srv_metrics;

void srv_metrics_init(srv_metrics *m);
void srv_metrics_observe(srv_metrics *m, srv_hist *h, double seconds);
void srv_metrics_status(srv_metrics *m, int status);
/* The Prometheus text page (malloc'ed). */
char *srv_metrics_page(srv *s);

/* ---------------------------------------------------------------- the server */

struct srv {
    srv_params p;
    char host[64];
    char model_id[128];
    char api_key[256];
    char session_dir[3072];            /* --session-dir, "" when off */
    struct mg_context *mg;
    int port;
    atomic_int state;                  /* SRV_LOADING, SRV_READY, SRV_STOPPING */
    kve_context *c;                    /* made by srv_attach */
    const kve_model *m;
    int32_t n_ctx;
    atomic_int generating;             /* generation handlers still writing a reply */
    int64_t created;                   /* Unix time of srv_start (models' "created") */
    atomic_uint_fast64_t next_id;      /* response ids */
    srv_metrics metrics;
    struct srv_events *events;         /* --kv-events publisher, NULL when off */
};

/* ---------------------------------------------------------------- KV-cache events (events.c) */

typedef struct srv_events srv_events;
/* A publisher of prefix-cache changes on a ZeroMQ PUB socket bound to
 * endpoint, fed by srv_events_listener (a context's on_prefix, with
 * s->events as its user). 0, or -1 with a message. */
int srv_events_start(srv *s, const char *endpoint, char *err, size_t errlen);
void srv_events_listener(void *user, const kv_prefix_event *ev);
/* Sends what is pending and closes the socket; call once the context stopped. */
void srv_events_stop(srv *s);

/* ---------------------------------------------------------------- replies (response.c) */

/* One reply of `len` bytes of `type`; header: one more header's name, and
 * value, or NULL. Returns the status. */
int srv_reply_body(srv *s, struct mg_connection *conn, int status, const char *type, const char *body, size_t len,
                   const char *header, const char *value);
/* A JSON reply with this status; takes the reference to body. Returns the
 * status (for the handler's return). */
int srv_reply_json(srv *s, struct mg_connection *conn, int status, json_t *body);
/* {"error":{"message","type","code"}} with e->status. */
int srv_reply_error(srv *s, struct mg_connection *conn, const srv_error *e);
/* The same with one more header (405's Allow). */
int srv_reply_error_header(srv *s, struct mg_connection *conn, const srv_error *e, const char *header,
                           const char *value);
/* The connection's socket, found among the process's own; -1 when not found. */
int srv_conn_socket(const struct mg_connection *conn);
/* Whether the client on socket fd has closed its end (0 for fd < 0). */
int srv_client_gone(int fd);

/* The chat and completions endpoints (generate.c). */
int srv_handle_generate(srv *s, struct mg_connection *conn, srv_kind kind, const char *body, size_t len);

/* ---------------------------------------------------------------- JSON (response.c) */

/* A JSON string of text[0..len): invalid UTF-8 sequences become U+FFFD. */
json_t *srv_json_text(const char *text, size_t len);
/* [bytes...] of text, as OpenAI's logprobs "bytes" field. */
json_t *srv_json_bytes(const char *text, size_t len);
/* The finish_reason of a stop reason: "stop", "length", or "abort" (the
 * server stopped while it ran). */
const char *srv_finish_reason(kve_stop_reason r);
/* Tokenizes what a request asks to generate from (chat messages rendered
 * with the model's template, or the completion prompt) into a malloc'ed array. */
int srv_prompt_tokens(srv *s, const srv_request *r, int32_t **out, int32_t *n, srv_error *e);

/* ---------------------------------------------------------------- tool calls (tools.c) */

/* Whether the model writes calls the Llama 3 way (else the Hermes way). */
int srv_tools_llama3(const srv *s);
/* The messages with tools and tool turns written in as the family's
 * template does: *out [*n], strings in *owned (srv_tools_free_messages). */
int srv_tools_messages(const srv *s, const srv_request *r, kve_chat_message **out, int32_t *n, char ***owned,
                       srv_error *e);
void srv_tools_free_messages(kve_chat_message *m, char **owned);
/* tool_choice "required" or named: the grammar of one call (bound to the
 * vocabulary), or NULL with e set. */
kve_grammar *srv_tools_grammar(const srv *s, const srv_request *r, srv_error *e);
/* In a constrained call's text so far: the offset where its arguments
 * start once the header is complete (0 before), and the name's place. */
size_t srv_tools_header(int llama3, const char *text, size_t len, size_t *name_at, size_t *name_len);
/* A reply that is (after whitespace) one or more calls of the request's
 * functions, as tool_calls entries (ids id_base_0, ...); NULL otherwise. */
json_t *srv_tools_parse(const srv *s, const srv_request *r, const char *text, size_t len, const char *id_base);
/* usage: prompt, completion, total and prompt_tokens_details.cached_tokens. */
json_t *srv_json_usage(int32_t n_prompt, int32_t n_cached, int32_t n_generated);

#endif
