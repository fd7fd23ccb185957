/* server/server.h - `kvcache serve`: an OpenAI-compatible HTTP server over a
 * kve_context (include/kvengine.h: continuous batching), on civetweb and jansson.
 *
 *   srv_start      listen (GET /health answers 503 "loading" from now on)
 *   srv_attach     hand it the loaded model: its context is made with the
 *                  server's cache policies, and /health turns 200
 *   srv_shutdown   stop accepting, end in-flight streams cleanly, free the
 *                  context, join every thread; the model is the caller's to free
 *
 * Endpoints, fields, errors and metrics: docs/SERVER.md. */
#ifndef SRV_SERVER_H
#define SRV_SERVER_H

#include <stdint.h>

#include "kvengine.h"

typedef struct {
    const char *host;          /* address to bind, default "127.0.0.1" */
    int port;                  /* 0: any free port (srv_port tells which) */
    const char *api_key;       /* require "Authorization: Bearer KEY" on the API; NULL: open */
    int32_t batch_tokens;      /* scheduler's per-step token budget */
    int32_t max_waiting;       /* queued requests beyond which new ones get 503 */
    int32_t http_threads;      /* civetweb workers (one per open connection) */
    int32_t http_timeout_ms;   /* a request's headers and body must arrive, and each write
                                * complete, within this; slower or idle clients are dropped */
    const char *model_id;      /* the name /v1/models reports */
    int context_shift;         /* the context's cache policies (kve_context_options) */
    int32_t n_keep;
    int32_t draft_lookup;
    int no_prefix;             /* --no-prefix-cache */
    const char *session_dir;   /* --session-dir: requests may name a session kept there
                                * (DIR/NAME.kvs); NULL: a request naming one gets 400 */
    const char *kv_events;     /* --kv-events: a ZeroMQ endpoint to publish the prefix
                                * cache's changes on (server/events.c); NULL: off */
    const char *cache_dir;     /* --cache-dir: the prefix cache's disk tier; NULL: off */
    uint64_t cache_disk_size;  /* --cache-disk-size: bytes the tier may keep there */
    int32_t act_bits;          /* --act-bits / --exact-matmul (kve_context_options) */
    int32_t no_window;         /* --no-window */
} srv_params;

typedef struct srv srv;

/* Starts listening. 0, or -1 with a message in err. */
int srv_start(const srv_params *p, srv **out, char *err, size_t errlen);
/* The bound port. */
int srv_port(const srv *s);
/* Makes a context for m with cp and the server's options and starts serving
 * generation on it (m borrowed until srv_shutdown returns). 0, or -1 with a
 * message. */
int srv_attach(srv *s, const kve_model *m, const kve_context_params *cp, char *err, size_t errlen);
/* The context srv_attach made, or NULL. */
const kve_context *srv_context(const srv *s);
/* Stops everything and frees the server and its context (not the model). */
void srv_shutdown(srv *s);

#endif
