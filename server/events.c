/* server/events.c - `--kv-events ENDPOINT`: the prefix cache's changes,
 * published on a ZeroMQ PUB socket in the schema vLLM publishes
 * (vllm/distributed/kv_events.py), so that KV-aware routers written for
 * vLLM track which replica holds which blocks.
 *
 * Each message has three frames: the topic (empty), a sequence number
 * (8 bytes, big-endian) and a msgpack EventBatch [ts, [event...]] whose
 * events are tagged arrays:
 *   ["BlockStored", [hash], parent_hash or nil, [token...], page_size, nil, "CPU"]
 *   ["BlockRemoved", [hash], "CPU"]
 *   ["AllBlocksCleared"]
 * The cache's listener (on the scheduler thread) only appends the encoded
 * event to a buffer; a thread of its own sends what has gathered every
 * SRV_EVENTS_FLUSH_MS, so the scheduler never waits on the socket.
 *
 * msgpack is written by hand: the few encodings below are all it takes. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

enum { SRV_EVENTS_FLUSH_MS = 20 };

typedef struct { unsigned char *p; size_t n, cap; int failed; } bytes;

struct srv_events {
    void *zctx, *pub;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bytes pending;            /* encoded events not sent yet */
    uint32_t n_pending;
    int stop;
    uint64_t seq;
    pthread_t thread;
};

/* ---------------------------------------------------------------- msgpack */

static void put_raw(bytes *b, const void *p, size_t n) {
    if (b->failed) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        unsigned char *np = realloc(b->p, cap);
        if (!np) { b->failed = 1; return; }
        b->p = np, b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

/* a type byte, then v in n big-endian bytes */
static void put_be(bytes *b, unsigned char type, uint64_t v, int n) {
    unsigned char t[9] = {type};
    for (int i = 0; i < n; i++) t[1 + i] = (unsigned char)(v >> (8 * (n - 1 - i)));
    put_raw(b, t, (size_t)n + 1);
}

static void mp_array(bytes *b, uint32_t n) {
    if (n < 16) put_be(b, (unsigned char)(0x90 | n), 0, 0);
    else if (n < 65536) put_be(b, 0xdc, n, 2);
    else put_be(b, 0xdd, n, 4);
}

static void mp_uint(bytes *b, uint64_t v) {
    if (v < 128) put_be(b, (unsigned char)v, 0, 0);
    else if (v < 65536) put_be(b, 0xcd, v, 2);
    else if (v <= UINT32_MAX) put_be(b, 0xce, v, 4);
    else put_be(b, 0xcf, v, 8);
}

static void mp_str(bytes *b, const char *s) {   /* short strings only: the tags */
    size_t n = strlen(s);
    put_be(b, (unsigned char)(0xa0 | n), 0, 0);
    put_raw(b, s, n);
}

static void mp_nil(bytes *b) { put_be(b, 0xc0, 0, 0); }

static void mp_float(bytes *b, double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    put_be(b, 0xcb, u, 8);
}

/* ---------------------------------------------------------------- events */

void srv_events_listener(void *user, const kv_prefix_event *ev) {
    srv_events *e = user;
    pthread_mutex_lock(&e->mu);
    bytes *b = &e->pending;
    switch (ev->kind) {
    case KV_PREFIX_STORED:
        mp_array(b, 7), mp_str(b, "BlockStored");
        mp_array(b, 1), mp_uint(b, ev->hash);
        if (ev->has_parent) mp_uint(b, ev->parent_hash); else mp_nil(b);
        mp_array(b, (uint32_t)ev->n_tokens);
        for (int32_t i = 0; i < ev->n_tokens; i++) mp_uint(b, (uint32_t)ev->tokens[i]);
        mp_uint(b, (uint64_t)ev->n_tokens);
        mp_nil(b);                      /* lora_id */
        mp_str(b, "CPU");               /* medium */
        break;
    case KV_PREFIX_REMOVED:
        mp_array(b, 3), mp_str(b, "BlockRemoved");
        mp_array(b, 1), mp_uint(b, ev->hash);
        mp_str(b, "CPU");
        break;
    case KV_PREFIX_CLEARED:
        mp_array(b, 1), mp_str(b, "AllBlocksCleared");
        break;
    }
    e->n_pending++;
    pthread_mutex_unlock(&e->mu);
}

/* Sends the events gathered so far as one batch (nothing when none). */
static void flush(srv_events *e, bytes *batch) {
    pthread_mutex_lock(&e->mu);
    bytes ev = e->pending;
    uint32_t n = e->n_pending;
    e->pending = (bytes){0}, e->n_pending = 0;
    pthread_mutex_unlock(&e->mu);
    if (n == 0 || ev.failed) {   /* out of memory: those events are lost, as on a full socket */
        free(ev.p);
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    batch->n = 0;
    mp_array(batch, 2), mp_float(batch, (double)ts.tv_sec + ts.tv_nsec * 1e-9);
    mp_array(batch, n), put_raw(batch, ev.p, ev.n);
    free(ev.p);
    if (batch->failed) { batch->failed = 0; return; }
    unsigned char seq[8];
    for (int i = 0; i < 8; i++) seq[i] = (unsigned char)(e->seq >> (56 - 8 * i));
    e->seq++;
    /* PUB never blocks: past its high-water mark it drops, as vLLM's does */
    zmq_send(e->pub, "", 0, ZMQ_SNDMORE);
    zmq_send(e->pub, seq, sizeof seq, ZMQ_SNDMORE);
    zmq_send(e->pub, batch->p, batch->n, 0);
}

static void *publisher(void *arg) {
    srv_events *e = arg;
    bytes batch = {0};
    pthread_mutex_lock(&e->mu);
    while (!e->stop) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += SRV_EVENTS_FLUSH_MS * 1000000L;
        if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&e->cv, &e->mu, &t);
        pthread_mutex_unlock(&e->mu);
        flush(e, &batch);
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    flush(e, &batch);   /* what the last steps changed */
    free(batch.p);
    return NULL;
}

int srv_events_start(srv *s, const char *endpoint, char *err, size_t errlen) {
    srv_events *e = calloc(1, sizeof *e);
    if (!e) return snprintf(err, errlen, "out of memory"), -1;
    e->zctx = zmq_ctx_new();
    e->pub = e->zctx ? zmq_socket(e->zctx, ZMQ_PUB) : NULL;
    int linger = 0;
    if (!e->pub || zmq_setsockopt(e->pub, ZMQ_LINGER, &linger, sizeof linger) || zmq_bind(e->pub, endpoint)) {
        snprintf(err, errlen, "--kv-events %s: %s", endpoint, zmq_strerror(zmq_errno()));
        if (e->pub) zmq_close(e->pub);
        if (e->zctx) zmq_ctx_term(e->zctx);
        free(e);
        return -1;
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    if (pthread_create(&e->thread, NULL, publisher, e)) {
        zmq_close(e->pub), zmq_ctx_term(e->zctx);
        pthread_mutex_destroy(&e->mu), pthread_cond_destroy(&e->cv);
        free(e);
        return snprintf(err, errlen, "cannot start the --kv-events thread"), -1;
    }
    s->events = e;
    return 0;
}

void srv_events_stop(srv *s) {
    srv_events *e = s->events;
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    zmq_close(e->pub), zmq_ctx_term(e->zctx);
    pthread_mutex_destroy(&e->mu), pthread_cond_destroy(&e->cv);
    free(e->pending.p);
    free(e);
    s->events = NULL;
}
