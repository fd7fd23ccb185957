/* server/http.c - civetweb glue: start and stop, one handler that routes every
 * path (404 unknown, 405 wrong method), the API key, the body limit, and the
 * small endpoints (health, models, tokenize,
 * detokenize, metrics). The generation endpoints are in generate.c. */
#include "internal.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int reply_405(srv *s, struct mg_connection *conn, const char *path, const char *allow) {
    srv_error e;
    srv_error_set(&e, 405, "invalid_request_error", "%s takes %s", path, allow);
    return srv_reply_error_header(s, conn, &e, "Allow", allow);
}

/* ---------------------------------------------------------------- small endpoints */

static int health(srv *s, struct mg_connection *conn) {
    int st = atomic_load(&s->state);
    if (st == SRV_READY) return srv_reply_json(s, conn, 200, json_pack("{s:s}", "status", "ok"));
    srv_error e;
    srv_error_set(&e, 503, "unavailable_error", st == SRV_LOADING ? "loading the model" : "shutting down");
    return srv_reply_error(s, conn, &e);
}

static int models(srv *s, struct mg_connection *conn) {
    return srv_reply_json(s, conn, 200,
                          json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data", "id", s->model_id,
                                    "object", "model", "created", (json_int_t)s->created, "owned_by", "kvcache"));
}

/* GET /: what this server is and where its API is, for a person or a
 * program that finds the port. Open, and answered while the model loads. */
static int index_page(srv *s, struct mg_connection *conn) {
    return srv_reply_json(s, conn, 200,
                          json_pack("{s:s, s:s, s:s, s:s, s:[s,s,s,s,s,s,s]}", "object", "server", "name", "kvcache serve",
                                    "description", "an OpenAI-compatible API over a paged KV cache, continuous batching",
                                    "model", s->model_id, "endpoints", "POST /v1/chat/completions",
                                    "POST /v1/completions", "GET /v1/models", "POST /tokenize", "POST /detokenize",
                                    "GET /health", "GET /metrics"));
}

static int tokenize(srv *s, struct mg_connection *conn, const srv_request *r) {
    int32_t cap = 0, n = 0;
    int rc = kve_tokenize(s->m, r->prompt, r->prompt_len, r->add_special, r->parse_special, NULL, 0, &cap);
    srv_error e;
    if (rc != KVE_OK && rc != KVE_ERR_SPACE)
        return srv_error_set(&e, 400, "invalid_request_error", "the text cannot be tokenized"), srv_reply_error(s, conn, &e);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(cap ? cap : 1));
    if (ids && cap && kve_tokenize(s->m, r->prompt, r->prompt_len, r->add_special, r->parse_special, ids, cap, &n))
        n = 0;
    json_t *arr = json_array();
    for (int32_t i = 0; ids && i < n; i++) {
        if (!r->with_pieces) {
            json_array_append_new(arr, json_integer(ids[i]));
            continue;
        }
        size_t len = 0;
        const char *piece = kve_token_piece(s->m, ids[i], &len);
        json_array_append_new(arr, json_pack("{s:i, s:o}", "id", ids[i], "piece", srv_json_text(piece, len)));
    }
    free(ids);
    return srv_reply_json(s, conn, 200, json_pack("{s:o}", "tokens", arr));
}

static int detokenize(srv *s, struct mg_connection *conn, const srv_request *r) {
    srv_error e;
    for (int32_t i = 0; i < r->n_tokens; i++)
        if (r->tokens[i] >= kve_model_n_vocab(s->m))
            return srv_error_set(&e, 400, "invalid_request_error", "token id %d is outside the vocabulary of %d",
                                 (int)r->tokens[i], (int)kve_model_n_vocab(s->m)),
                   srv_reply_error(s, conn, &e);
    size_t need = 0, n = 0;
    int rc = kve_detokenize(s->m, r->tokens, r->n_tokens, 0, NULL, 0, &need);
    char *text = rc == KVE_OK || rc == KVE_ERR_SPACE ? malloc(need + 1) : NULL;
    rc = text ? kve_detokenize(s->m, r->tokens, r->n_tokens, 0, text, need + 1, &n) : KVE_ERR_NOMEM;
    json_t *body = rc == KVE_OK ? json_pack("{s:o}", "content", srv_json_text(text, n)) : NULL;
    free(text);
    if (!body) return srv_error_set(&e, 500, "server_error", "detokenize failed"), srv_reply_error(s, conn, &e);
    return srv_reply_json(s, conn, 200, body);
}

static int metrics_endpoint(srv *s, struct mg_connection *conn) {
    char *page = srv_metrics_page(s);
    if (!page) return srv_reply_body(s, conn, 500, "text/plain", "out of memory\n", 14, NULL, NULL);
    srv_reply_body(s, conn, 200, "text/plain; version=0.0.4; charset=utf-8", page, strlen(page), NULL, NULL);
    free(page);
    return 200;
}

/* ---------------------------------------------------------------- routing */

typedef struct {
    const char *path;
    const char *method;
    int kind;          /* srv_kind for POST bodies; -1 for GET endpoints */
    int open;          /* answered without the API key */
} route;

static const route routes[] = {
    {"/v1/chat/completions", "POST", SRV_CHAT, 0},
    {"/v1/completions", "POST", SRV_COMPLETION, 0},
    {"/tokenize", "POST", SRV_TOKENIZE, 0},
    {"/detokenize", "POST", SRV_DETOKENIZE, 0},
    {"/v1/embeddings", "POST", -2, 0},   /* answered 501: see handle */
    {"/v1/models", "GET", -1, 0},
    {"/health", "GET", -1, 1},
    {"/metrics", "GET", -1, 1},
    {"/", "GET", -1, 1},
};

/* Reads the whole body (NUL-terminated) into a malloc'ed buffer, or NULL
 * with e set: 413 beyond SRV_MAX_BODY bytes, 400 when it ends before its
 * Content-Length (the client stopped sending: civetweb's read timed out). A
 * chunked body is read up to one byte past the limit, which tells it is over. */
static char *read_body(struct mg_connection *conn, size_t *len, srv_error *e) {
    const long long announced = mg_get_request_info(conn)->content_length;
    if (announced > SRV_MAX_BODY) {
        srv_error_set(e, 413, "invalid_request_error", "the request body exceeds %d bytes", SRV_MAX_BODY);
        return NULL;
    }
    size_t cap = announced >= 0 ? (size_t)announced : 4096, n = 0;
    char *buf = malloc(cap + 1);
    int oom = !buf;
    while (!oom) {
        if (n == cap) {
            if (announced >= 0 || cap > SRV_MAX_BODY) break;
            size_t nc = cap * 2 > (size_t)SRV_MAX_BODY + 1 ? (size_t)SRV_MAX_BODY + 1 : cap * 2;
            char *nb = realloc(buf, nc + 1);
            if (!nb) { oom = 1; break; }
            buf = nb, cap = nc;
        }
        int got = mg_read(conn, buf + n, cap - n);
        if (got <= 0) break;
        n += (size_t)got;
    }
    if (oom) {
        free(buf);
        srv_error_set(e, 500, "server_error", "out of memory");
        return NULL;
    }
    if (n > SRV_MAX_BODY) {
        free(buf);
        srv_error_set(e, 413, "invalid_request_error", "the request body exceeds %d bytes", SRV_MAX_BODY);
        return NULL;
    }
    if (announced >= 0 && n < (size_t)announced) {
        free(buf);
        srv_error_set(e, 400, "invalid_request_error",
                      "the request body ended after %zu of the %lld bytes its Content-Length announced", n, announced);
        return NULL;
    }
    buf[n] = 0, *len = n;
    return buf;
}

/* Equal strings, in a time that depends on the key's length alone, not on
 * where a guess first differs. */
static int same_key(const char *given, const char *key) {
    size_t n = strlen(key), m = strlen(given);
    unsigned diff = n != m;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)key[i] ^ (unsigned char)(i < m ? given[i] : 0);
    return diff == 0;
}

static int authorized(const srv *s, struct mg_connection *conn) {
    if (!s->api_key[0]) return 1;
    const char *h = mg_get_header(conn, "Authorization");
    return h && !strncasecmp(h, "Bearer ", 7) && same_key(h + 7, s->api_key);
}

/* Request smuggling's two shapes: Content-Length headers that disagree, or
 * one beside Transfer-Encoding (which of the two frames the body would then
 * depend on who reads it). 0, or -1 with e set. */
static int check_framing(const struct mg_request_info *ri, srv_error *e) {
    const char *length = NULL, *encoding = NULL;
    for (int i = 0; i < ri->num_headers; i++) {
        const char *name = ri->http_headers[i].name, *value = ri->http_headers[i].value;
        if (!strcasecmp(name, "Transfer-Encoding")) encoding = value;
        if (strcasecmp(name, "Content-Length")) continue;
        if (length && strcmp(length, value))
            return srv_error_set(e, 400, "invalid_request_error", "two different Content-Length headers (%.40s, %.40s)",
                                 length, value);
        length = value;
    }
    if (length && encoding)
        return srv_error_set(e, 400, "invalid_request_error",
                             "both Content-Length and Transfer-Encoding: a body is framed by one of them");
    return 0;
}

static int handle(struct mg_connection *conn, void *cbdata) {
    srv *s = cbdata;
    const struct mg_request_info *ri = mg_get_request_info(conn);
    const char *path = ri->local_uri ? ri->local_uri : "/";
    srv_error e;
    const route *rt = NULL;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(path, routes[i].path)) rt = &routes[i];
    if (!rt) {
        srv_error_set(&e, 404, "invalid_request_error", "no endpoint %.200s (GET / lists them)", path);
        return srv_reply_error(s, conn, &e);
    }
    int head = rt->kind == -1 && !strcmp(ri->request_method, "HEAD");   /* a GET without the body */
    if (strcmp(ri->request_method, rt->method) && !head)
        return reply_405(s, conn, path, rt->kind == -1 ? "GET, HEAD" : rt->method);
    if (check_framing(ri, &e)) {   /* where the next request would start is unclear: none is read */
        srv_reply_error_header(s, conn, &e, "Connection", "close");
        int fd = srv_conn_socket(conn);   /* civetweb keeps it alive otherwise */
        if (fd >= 0) shutdown(fd, SHUT_RDWR);
        return e.status;
    }
    if (!rt->open && !authorized(s, conn)) {
        srv_error_set(&e, 401, "authentication_error", "missing or wrong API key (Authorization: Bearer KEY)");
        return srv_reply_error(s, conn, &e);
    }
    if (!strcmp(path, "/health")) return health(s, conn);
    if (!strcmp(path, "/metrics")) return metrics_endpoint(s, conn);
    if (!strcmp(path, "/")) return index_page(s, conn);
    if (atomic_load(&s->state) != SRV_READY) {
        srv_error_set(&e, 503, "unavailable_error",
                      atomic_load(&s->state) == SRV_LOADING ? "loading the model" : "shutting down");
        return srv_reply_error(s, conn, &e);
    }
    if (rt->kind == -2) {
        srv_error_set(&e, 501, "not_implemented_error",
                      "/v1/embeddings is not implemented: the server runs causal language models for generation "
                      "and has no pooling or embedding head");
        return srv_reply_error(s, conn, &e);
    }
    if (rt->kind < 0) return models(s, conn);
    size_t len = 0;
    char *body = read_body(conn, &len, &e);
    if (!body) return srv_reply_error(s, conn, &e);
    int status;
    if (rt->kind == SRV_CHAT || rt->kind == SRV_COMPLETION) {
        atomic_fetch_add(&s->generating, 1);
        status = srv_handle_generate(s, conn, (srv_kind)rt->kind, body, len);
        atomic_fetch_sub(&s->generating, 1);
    } else {
        srv_request r;
        if (srv_request_parse((srv_kind)rt->kind, body, len, &r, &e)) {
            status = srv_reply_error(s, conn, &e);
        } else {
            status = rt->kind == SRV_TOKENIZE ? tokenize(s, conn, &r) : detokenize(s, conn, &r);
            srv_request_free(&r);
        }
    }
    free(body);
    return status;
}

/* ---------------------------------------------------------------- lifetime */

static int log_message(const struct mg_connection *conn, const char *message) {
    (void)conn, (void)message;
    return 1;   /* civetweb's own error log stays quiet; our errors go to the client */
}

/* The errors civetweb answers before any handler runs (an unknown method, a
 * malformed request line, headers too large) in the API's JSON shape. */
static int http_error(struct mg_connection *conn, int status, const char *msg) {
    srv *s = mg_get_user_data(mg_get_context(conn));
    const char *method = mg_get_request_info(conn)->request_method;
    static const char *const known[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "CONNECT", "TRACE"};
    int unknown = method && *method;
    for (size_t i = 0; unknown && i < sizeof known / sizeof known[0]; i++) unknown = strcmp(method, known[i]) != 0;
    srv_error e;
    if (unknown)
        srv_error_set(&e, status, "invalid_request_error", "unknown HTTP method '%.40s' (this server takes GET, HEAD and POST)",
                      method);
    else
        srv_error_set(&e, status, "invalid_request_error", "%.200s", msg && *msg ? msg : "bad request");
    srv_reply_error(s, conn, &e);
    return 0;
}

int srv_start(const srv_params *p, srv **out, char *err, size_t errlen) {
    *out = NULL;
    srv *s = calloc(1, sizeof *s);
    if (!s) return snprintf(err, errlen, "out of memory"), -1;
    s->p = *p;
    snprintf(s->host, sizeof s->host, "%s", p->host ? p->host : "127.0.0.1");
    snprintf(s->model_id, sizeof s->model_id, "%s", p->model_id ? p->model_id : "model");
    snprintf(s->api_key, sizeof s->api_key, "%s", p->api_key ? p->api_key : "");
    if (p->session_dir && snprintf(s->session_dir, sizeof s->session_dir, "%s", p->session_dir) >= (int)sizeof s->session_dir) {
        free(s);
        return snprintf(err, errlen, "the session directory's path is too long"), -1;
    }
    s->created = (int64_t)time(NULL);
    atomic_init(&s->state, SRV_LOADING);
    atomic_init(&s->next_id, 1);
    atomic_init(&s->generating, 0);
    srv_metrics_init(&s->metrics);
    char ports[96], threads[16], timeout[16], keep_alive[16];
    snprintf(ports, sizeof ports, strchr(s->host, ':') ? "[%s]:%d" : "%s:%d", s->host, p->port);
    int n_threads = p->http_threads > 0 ? p->http_threads : SRV_HTTP_THREADS;
    int timeout_ms = p->http_timeout_ms > 0 ? p->http_timeout_ms : SRV_HTTP_TIMEOUT_MS;
    snprintf(threads, sizeof threads, "%d", n_threads);
    snprintf(timeout, sizeof timeout, "%d", timeout_ms);
    snprintf(keep_alive, sizeof keep_alive, "%d", timeout_ms < SRV_KEEP_ALIVE_MS ? timeout_ms : SRV_KEEP_ALIVE_MS);
    /* Each open connection holds a worker until its request is read, so a
     * client that sends nothing, or stops halfway, is dropped after the
     * timeout; connections beyond the workers wait in civetweb's queue and
     * the kernel's backlog (SRV_BACKLOG each) instead of being refused. */
    const char *opts[] = {"listening_ports", ports, "num_threads", threads, "enable_keep_alive", "yes",
                          "request_timeout_ms", timeout, "keep_alive_timeout_ms", keep_alive,
                          "listen_backlog", SRV_BACKLOG_STR, "connection_queue", SRV_BACKLOG_STR, NULL};
    struct mg_callbacks cb;
    memset(&cb, 0, sizeof cb);
    cb.log_message = log_message;
    cb.http_error = http_error;
    mg_init_library(0);
    s->mg = mg_start(&cb, s, opts);
    if (!s->mg) {
        snprintf(err, errlen, "cannot listen on %s (in use, or not an address of this machine)", ports);
        mg_exit_library();
        free(s);
        return -1;
    }
    struct mg_server_port sp[4];
    int np = mg_get_server_ports(s->mg, 4, sp);
    s->port = np > 0 ? sp[0].port : p->port;
    mg_set_request_handler(s->mg, "/", handle, s);
    *out = s;
    return 0;
}

int srv_port(const srv *s) { return s->port; }

/* The context's lines about session files, on its scheduler thread. */
static void sched_log(void *user, const char *line) {
    (void)user;
    fprintf(stderr, "kvcache serve: %s\n", line);
}

int srv_attach(srv *s, const kve_model *m, const kve_context_params *cpp, char *err, size_t errlen) {
    kve_context_params cp = *cpp;
    if (s->p.batch_tokens > 0) cp.n_batch = s->p.batch_tokens;
    if (s->p.max_waiting > 0) cp.max_waiting = s->p.max_waiting;
    kve_context_options o = kve_context_default_options();
    o.act_bits = s->p.act_bits, o.no_window = s->p.no_window;
    o.context_shift = s->p.context_shift, o.n_keep = s->p.n_keep, o.draft_lookup = s->p.draft_lookup;
    o.no_prefix = s->p.no_prefix;
    o.log = sched_log;
    o.cache_dir = s->p.cache_dir, o.cache_disk_size = s->p.cache_disk_size;
    if (s->p.kv_events) {
        if (srv_events_start(s, s->p.kv_events, err, errlen)) return -1;
        o.on_prefix = srv_events_listener, o.prefix_user = s->events;
    }
    char why[320];
    int rc = kve_context_create_ex(m, &cp, &o, &s->c, why, sizeof why);
    if (rc != KVE_OK) {
        srv_events_stop(s);
        if (s->p.cache_dir && !strncmp(why, "cache_dir ", 10)) return snprintf(err, errlen, "--cache-dir %s", why + 10), -1;
        return snprintf(err, errlen, "%s", why), -1;
    }
    s->m = m, s->n_ctx = kve_context_get_params(s->c).n_ctx;
    atomic_store(&s->state, SRV_READY);
    return 0;
}

const kve_context *srv_context(const srv *s) { return s->c; }

/* civetweb 1.15's listening thread notices mg_stop only when its poll()
 * returns, which without a connection takes its 2-second quantum: every
 * SIGTERM would wait that long. The waker connects to our own port (and
 * closes at once) every 20 ms until mg_stop has returned, so that it returns
 * within one tick. A connection refused or lost is of no matter. (A worker
 * waiting on a client's idle keep-alive connection still takes up to one
 * quantum to notice: civetweb gives no way to close it from outside.) */
typedef struct {
    const srv *s;
    atomic_int done;
} waker;

static void *wake_listener(void *arg) {
    waker *w = arg;
    char port[16];
    snprintf(port, sizeof port, "%d", w->s->port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV}, *ai = NULL;
    if (getaddrinfo(w->s->host, port, &hints, &ai) != 0) return NULL;
    while (!atomic_load(&w->done)) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0) connect(fd, ai->ai_addr, ai->ai_addrlen), close(fd);
        nanosleep(&(struct timespec){0, 20000000}, NULL);
    }
    freeaddrinfo(ai);
    return NULL;
}

void srv_shutdown(srv *s) {
    if (!s) return;
    atomic_store(&s->state, SRV_STOPPING);   /* new requests: 503 */
    kve_context_stop(s->c);                   /* in-flight requests end; their workers finish the replies */

    srv_events_stop(s);
    /* civetweb refuses writes once stopping: let the handlers write their
     * last chunks and [DONE] first (bounded: a stalled client cannot hold us) */
    for (int i = 0; i < 1000 && atomic_load(&s->generating) > 0; i++) nanosleep(&(struct timespec){0, 10000000}, NULL);
    waker w = {.s = s};
    atomic_init(&w.done, 0);
    pthread_t wt;
    int waking = pthread_create(&wt, NULL, wake_listener, &w) == 0;
    mg_stop(s->mg);                           /* waits for every worker */
    if (waking) atomic_store(&w.done, 1), pthread_join(wt, NULL);
    mg_exit_library();
    kve_context_free(s->c);                   /* every named page not yet on the disk tier is written */
    pthread_mutex_destroy(&s->metrics.mu);
    free(s);
}
