/* server/metrics.c - GET /metrics in the Prometheus text format (0.0.4):
 * the scheduler's gauges and counters, the reply codes, and histograms of
 * time to first token and inter-token latency. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double ttft_le[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double itl_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};

void srv_metrics_init(srv_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->ttft.le = ttft_le, m->ttft.n = (int)(sizeof ttft_le / sizeof ttft_le[0]);
    m->itl.le = itl_le, m->itl.n = (int)(sizeof itl_le / sizeof itl_le[0]);
}

void srv_metrics_observe(srv_metrics *m, srv_hist *h, double seconds) {
    int b = 0;
    while (b < h->n && seconds > h->le[b]) b++;
    pthread_mutex_lock(&m->mu);
    h->count[b]++, h->total++, h->sum += seconds;
    pthread_mutex_unlock(&m->mu);
}

/* the reply codes counted apart; everything else is "other" */
static const char *const status_label[SRV_N_STATUS] = {"200", "400", "401", "404", "405", "413", "503", "other"};

void srv_metrics_status(srv_metrics *m, int status) {
    int k = 0;
    while (k < SRV_N_STATUS - 1 && atoi(status_label[k]) != status) k++;
    pthread_mutex_lock(&m->mu);
    m->by_status[k]++;
    pthread_mutex_unlock(&m->mu);
}

/* A growing text buffer. */
typedef struct { char *p; size_t n, cap; int failed; } page;

static void put(page *pg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(page *pg, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = pg->failed ? 0 : vsnprintf(pg->p + pg->n, pg->cap - pg->n, fmt, ap);
        va_end(ap);
        if (pg->failed || w < 0) { pg->failed = 1; return; }
        if ((size_t)w < pg->cap - pg->n) { pg->n += (size_t)w; return; }
        char *np = realloc(pg->p, pg->cap * 2 + (size_t)w);
        if (!np) { pg->failed = 1; return; }
        pg->p = np, pg->cap = pg->cap * 2 + (size_t)w;
    }
}

static void metric(page *pg, const char *name, const char *type, const char *help, double v) {
    put(pg, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

/* A vLLM-named family with the model_name label vLLM puts on every sample, so
 * routers and dashboards written for vLLM read a replica unchanged. */
static void vllm_metric(page *pg, const char *model, const char *name, const char *type, const char *help, double v) {
    put(pg, "# HELP %s %s\n# TYPE %s %s\n%s{model_name=\"%s\"} %.17g\n", name, help, name, type, name, model, v);
}

/* s into a Prometheus label value: backslash, double quote and newline escaped */
static void label_value(char *out, size_t cap, const char *s) {
    size_t n = 0;
    for (; *s && n + 3 < cap; s++) {
        if (*s == '\\' || *s == '"') out[n++] = '\\', out[n++] = *s;
        else if (*s == '\n') out[n++] = '\\', out[n++] = 'n';
        else out[n++] = *s;
    }
    out[n] = 0;
}

static void histogram(page *pg, const char *name, const char *help, const srv_hist *h) {
    put(pg, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int b = 0; b < h->n; b++) {
        cum += h->count[b];
        put(pg, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[b], (unsigned long long)cum);
    }
    put(pg, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.17g\n%s_count %llu\n", name, (unsigned long long)h->total, name,
        h->sum, name, (unsigned long long)h->total);
}

char *srv_metrics_page(srv *s) {
    page pg = {.p = malloc(8192), .cap = 8192};
    if (!pg.p) return NULL;
    kve_context_stats st = {.size = sizeof st};
    if (s->c) kve_context_get_stats(s->c, &st);
    metric(&pg, "kvcache_ready", "gauge", "1 once the model is loaded and requests are served",
           atomic_load(&s->state) == SRV_READY);
    metric(&pg, "kvcache_requests_running", "gauge", "Requests admitted to the running batch", st.running);
    metric(&pg, "kvcache_requests_waiting", "gauge", "Requests queued (new or preempted)", st.waiting);
    metric(&pg, "kvcache_kv_pages_total", "gauge", "KV cache pages in the pool", st.pages_total);
    metric(&pg, "kvcache_kv_pages_used", "gauge", "KV pages referenced by live sequences", st.pages_used);
    metric(&pg, "kvcache_kv_pages_free", "gauge", "KV pages holding nothing", st.pages_free);
    metric(&pg, "kvcache_kv_pages_cached", "gauge", "KV pages kept only for the prefix cache (reclaimable)",
           st.pages_cached);
    metric(&pg, "kvcache_kv_usage_ratio", "gauge", "Used pages / all pages",
           st.pages_total ? (double)st.pages_used / st.pages_total : 0);
    metric(&pg, "kvcache_prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache",
           (double)st.prefix_queries);
    metric(&pg, "kvcache_prefix_cache_hits_total", "counter", "Of those, tokens found (not recomputed)",
           (double)st.prefix_hits);
    metric(&pg, "kvcache_prompt_tokens_total", "counter", "Prompt tokens of admitted requests", (double)st.prompt_tokens);
    metric(&pg, "kvcache_generation_tokens_total", "counter", "Tokens generated", (double)st.generation_tokens);
    metric(&pg, "kvcache_preemptions_total", "counter", "Requests preempted (pages freed, recomputed later)",
           (double)st.preemptions);
    metric(&pg, "kvcache_prefill_waits_total", "counter",
           "Requests that waited for another's prefill of their first pages, to reuse them", (double)st.prefill_waits);
    metric(&pg, "kvcache_steps_total", "counter", "Batched forward passes", (double)st.steps);
    metric(&pg, "kvcache_context_shifts_total", "counter", "Context shifts (--context-shift)", (double)st.shifts);
    metric(&pg, "kvcache_draft_tokens_total", "counter", "Prompt-lookup draft tokens verified (--draft-lookup)",
           (double)st.drafted);
    metric(&pg, "kvcache_draft_accepted_total", "counter", "Of those, accepted", (double)st.accepted);
    metric(&pg, "kvcache_session_restores_total", "counter", "Requests that restored a prefix from their session file",
           (double)st.session_restores);
    metric(&pg, "kvcache_session_restored_tokens_total", "counter", "Prompt tokens restored from session files",
           (double)st.session_restored);
    metric(&pg, "kvcache_session_load_failures_total", "counter",
           "Session files present but ignored (corrupt, foreign, nothing in common, no room)",
           (double)st.session_refused);
    metric(&pg, "kvcache_session_saves_total", "counter", "Session files written", (double)st.session_saves);
    metric(&pg, "kvcache_session_save_failures_total", "counter",
           "Session saves that failed or were skipped (after a context shift)", (double)st.session_save_failures);
    metric(&pg, "kvcache_session_io_seconds_total", "counter", "Scheduler-thread time spent reading and writing session files",
           st.session_seconds);
    if (st.disk_on) {   /* --cache-dir: counted in pages and bytes */
        metric(&pg, "kvcache_prefix_disk_hits_total", "counter", "Pages read back from the disk tier into the pool",
               (double)st.disk_hits);
        metric(&pg, "kvcache_prefix_disk_waits_total", "counter",
               "Requests that waited aside while the tier's thread read their prefix", (double)st.disk_waits);
        metric(&pg, "kvcache_prefix_disk_misses_total", "counter", "Disk-tier lookups that found no usable page",
               (double)st.disk_misses);
        metric(&pg, "kvcache_prefix_disk_damaged_total", "counter", "Of those, files that failed a check (removed)",
               (double)st.disk_damaged);
        metric(&pg, "kvcache_prefix_disk_read_bytes_total", "counter", "Bytes read from the disk tier",
               (double)st.disk_bytes_read);
        metric(&pg, "kvcache_prefix_disk_writes_total", "counter", "Pages written to the disk tier", (double)st.disk_writes);
        metric(&pg, "kvcache_prefix_disk_written_bytes_total", "counter", "Bytes written to the disk tier",
               (double)st.disk_bytes_written);
        metric(&pg, "kvcache_prefix_disk_dropped_total", "counter",
               "Pages not written (the writer's queue was full or a write failed)", (double)st.disk_dropped);
        metric(&pg, "kvcache_prefix_disk_evictions_total", "counter", "Files removed to stay within --cache-disk-size",
               (double)st.disk_evictions);
        metric(&pg, "kvcache_prefix_disk_pages", "gauge", "Pages held in the disk tier", (double)st.disk_entries);
        metric(&pg, "kvcache_prefix_disk_bytes", "gauge", "Bytes held in the disk tier", (double)st.disk_bytes);
    }
    /* the same quantities under vLLM's names and meanings: usage counts the pages
     * live sequences hold (cached pages are reclaimable, as vLLM's free queue),
     * prefix-cache queries and hits are counted in tokens */
    char model[2 * sizeof s->model_id];
    label_value(model, sizeof model, s->model_id);
    vllm_metric(&pg, model, "vllm:num_requests_running", "gauge", "Requests in the running batch", st.running);
    vllm_metric(&pg, model, "vllm:num_requests_waiting", "gauge", "Requests waiting to be processed", st.waiting);
    vllm_metric(&pg, model, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage: 1 means 100 percent",
                st.pages_total ? (double)st.pages_used / st.pages_total : 0);
    vllm_metric(&pg, model, "vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in queried tokens",
                (double)st.prefix_queries);
    vllm_metric(&pg, model, "vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in cached tokens",
                (double)st.prefix_hits);
    pthread_mutex_lock(&s->metrics.mu);
    put(&pg, "# HELP kvcache_http_responses_total HTTP replies by status\n"
             "# TYPE kvcache_http_responses_total counter\n");
    for (int k = 0; k < SRV_N_STATUS; k++)
        put(&pg, "kvcache_http_responses_total{code=\"%s\"} %llu\n", status_label[k],
            (unsigned long long)s->metrics.by_status[k]);
    histogram(&pg, "kvcache_time_to_first_token_seconds", "Time from submission to the first token",
              &s->metrics.ttft);
    histogram(&pg, "kvcache_inter_token_latency_seconds", "Time between consecutive tokens of one choice",
              &s->metrics.itl);
    pthread_mutex_unlock(&s->metrics.mu);
    if (pg.failed) { free(pg.p); return NULL; }
    return pg.p;
}
