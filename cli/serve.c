/* cli/serve.c - `kvcache serve`: options, then listen (health says "loading"),
 * load the model, serve until SIGINT or SIGTERM, shut down cleanly. The HTTP
 * work is in server/, the scheduling behind kvengine.h's kve_context. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "../server/server.h"

static void usage(void) {
    printf("usage: kvcache serve [-m MODEL.gguf] [--host 127.0.0.1] [--port 8080] [--parallel N] [--ctx N]\n"
           "                     [--kv-type T] [--kv-pages N] [--batch-tokens N] [--api-key KEY] [-t THREADS]\n"
           "                     [--context-shift [--keep N]] [--draft-lookup N] [--session-dir DIR]\n"
           "                     [--kv-events ENDPOINT] [--cache-dir DIR [--cache-disk-size BYTES]]\n"
           "                     [--http-threads N] [--http-timeout S]\n"
           "An OpenAI-compatible HTTP server (POST /v1/chat/completions, /v1/completions, /tokenize,\n"
           "/detokenize; GET /v1/models, /health, /metrics) with continuous batching: every step runs\n"
           "all live requests as one batch. Prints the URL when ready; SIGINT/SIGTERM stop it cleanly.\n"
           "A request samples with the OpenAI API's defaults (temperature 1, top_p 1, no top-k),\n"
           "which OpenAI clients expect, not with `generate`'s.\n\n"
           "  --host ADDR        address to bind (default 127.0.0.1: this machine only)\n"
           "  --port N           TCP port (default 8080; 0: any free port, printed)\n"
           "  --parallel N       sequences that may live at once, choices of n > 1 included (default 8)\n"
           "  -c, --ctx N        positions one sequence may hold (default: the model's, at most 4096)\n"
           "  --kv-pages N       KV pool pages of 16 positions (default: parallel x ctx / 16); fewer\n"
           "                     pages share the pool, and requests are preempted when it is full\n"
           "  --batch-tokens N   tokens one step may run: decodes first, then prompt chunks (default 512)\n"
           "  --max-queue N      waiting requests beyond which new ones get 503 (default 256)\n"
           "  --api-key KEY      require \"Authorization: Bearer KEY\" (health and metrics stay open)\n"
           "  --context-shift    a sequence that fills its context keeps its first --keep positions,\n"
           "                     drops half of the rest and goes on (default: it ends, finish_reason\n"
           "                     \"length\"); a request without max_tokens then ends after --ctx tokens\n"
           "  --keep N           positions a context shift keeps, the attention sinks (default 4, >= 4)\n"
           "  --draft-lookup N   greedy requests (temperature 0) decode by prompt lookup: up to N\n"
           "                     tokens from the prompt and output verified in one step; the same\n"
           "                     tokens as without it (default 0: off; at most 64)\n"
           "  --no-prefix-cache  prefill every prompt in full, reusing no cached page (for comparisons)\n"
           "  --session-dir DIR  keep sessions on disk (made if missing): a request with \"session\": \"NAME\"\n"
           "                     (1-128 of A-Z a-z 0-9 . _ -, not starting with '.') restores DIR/NAME.kvs\n"
           "                     when its tokens begin the prompt, and saves its sequence there when it\n"
           "                     ends (not when cancelled); without this option such a request gets 400\n"
           "  --kv-events ENDPOINT  publish the prefix cache's changes (BlockStored, BlockRemoved,\n"
           "                     AllBlocksCleared, vLLM's schema) on a ZeroMQ PUB socket bound there,\n"
           "                     e.g. tcp://127.0.0.1:5557 (default: off)\n"
           "  --cache-dir DIR    a disk tier under the prefix cache (made if missing): pages the pool\n"
           "                     reclaims, and at shutdown every named page, are written there and read\n"
           "                     back when a prompt continues a prefix found there, after a restart too\n"
           "  --cache-disk-size BYTES  the most the tier keeps in DIR, least recently used files\n"
           "                     removed first (default 1073741824, 1 GiB)\n"
           "  --http-threads N   HTTP workers, each serving one open connection at a time (default\n"
           "                     2 x parallel + 112, at most 1024); more connections wait for one\n"
           "  --http-timeout S   seconds a client has to send a request's headers and body, and to\n"
           "                     take each write of the reply; slower or idle clients are dropped\n"
           "                     (default 10; idle keep-alive connections: 5 or this if shorter)\n"
           "  -m, --model PATH   GGUF model (default $KVCACHE_MODEL or " CLI_DEFAULT_MODEL ")\n"
           "  -t, --threads N    threads for the forward pass (default: one per core)\n"
           "  --kv-type T        K/V storage: f32, f16 (default), bf16, q8\n");
}

/* The file name without directories and ".gguf": what /v1/models calls it. */
static void model_id(const char *path, char *out, size_t cap) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (n > 5 && !strcmp(base + n - 5, ".gguf")) n -= 5;
    snprintf(out, cap, "%.*s", (int)n, base);
}

int cmd_serve(int argc, char **argv) {
    cli_model_opts mo = cli_model_opts_default();
    const char *host = "127.0.0.1", *api_key = NULL, *session_dir = NULL, *kv_events = NULL, *cache_dir = NULL;
    int64_t cache_disk_size = (int64_t)1 << 30;
    int64_t port = 8080, parallel = 8, batch_tokens = 512, max_queue = 256, keep = 4, draft = 0;
    int64_t http_threads = 0, http_timeout = 10;
    int shift = 0, no_prefix = 0;
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) { usage(); return 0; }
        if (cli_opt_int(argc, argv, &i, NULL, "--batch-tokens", &batch_tokens)) continue;
        if (cli_model_opt(argc, argv, &i, &mo)) continue;
        if (cli_opt_str(argc, argv, &i, NULL, "--host", &host)) continue;
        if (cli_opt_int(argc, argv, &i, NULL, "--port", &port)) continue;
        if (cli_opt_int(argc, argv, &i, NULL, "--parallel", &parallel)) continue;
        if (cli_opt_int(argc, argv, &i, NULL, "--kv-pages", &mo.kv_pages)) continue;
        if (cli_opt_int(argc, argv, &i, NULL, "--max-queue", &max_queue)) continue;
        if (cli_opt_str(argc, argv, &i, NULL, "--api-key", &api_key)) continue;
        if (cli_opt_str(argc, argv, &i, NULL, "--session-dir", &session_dir)) continue;
        if (cli_opt_str(argc, argv, &i, NULL, "--kv-events", &kv_events)) continue;
        if (cli_opt_str(argc, argv, &i, NULL, "--cache-dir", &cache_dir)) continue;
        if (cli_opt_int(argc, argv, &i, NULL, "--cache-disk-size", &cache_disk_size)) continue;
        if (cli_opt_int(argc, argv, &i, NULL, "--keep", &keep)) continue;
        if (cli_opt_int(argc, argv, &i, NULL, "--draft-lookup", &draft)) continue;
        if (cli_opt_int(argc, argv, &i, NULL, "--http-threads", &http_threads)) continue;
        if (cli_opt_int(argc, argv, &i, NULL, "--http-timeout", &http_timeout)) continue;
        if (!strcmp(argv[i], "--context-shift")) { shift = 1; continue; }
        if (!strcmp(argv[i], "--no-prefix-cache")) { no_prefix = 1; continue; }
        fprintf(stderr, "kvcache serve: unknown option '%s' (see --help)\n", argv[i]);
        return 2;
    }
    if (!cli_range("serve", "--port", port, 0, 65535, "TCP port; 0: any free one") ||
        !cli_range("serve", "--parallel", parallel, 1, 4096, "sequences decoded together") ||
        !cli_range("serve", "--batch-tokens", batch_tokens, 1, 8192, "rows of one engine step") ||
        !cli_range("serve", "--kv-pages", mo.kv_pages, 0, 1 << 26, "pages in the K/V pool; 0: room for all") ||
        !cli_range("serve", "--max-queue", max_queue, 1, 1 << 20, "requests waiting for a slot") ||
        !cli_range("serve", "--keep", keep, 0, 1 << 24, "positions a context shift keeps") ||
        !cli_range("serve", "--draft-lookup", draft, 0, KVE_MAX_DRAFT, "tokens drafted by prompt lookup") ||
        !cli_range("serve", "--http-threads", http_threads, 0, 4096, "HTTP worker threads; 0: 2 x --parallel + 112") ||
        !cli_range("serve", "--http-timeout", http_timeout, 1, 3600, "seconds a stalled or idle connection is kept") ||
        !cli_range("serve", "--cache-disk-size", cache_disk_size, 1, INT64_MAX, "bytes the disk tier keeps"))
        return 2;
    if (api_key && !*api_key) {
        fprintf(stderr, "kvcache serve: --api-key is empty: give the key clients must send\n");
        return 2;
    }
    mo.batch = batch_tokens;   /* one step is one forward pass of at most this many rows */
    if (session_dir) {   /* checked now, not at the first request that names a session */
        struct stat st;
        if (!*session_dir || strlen(session_dir) > 3000) {
            fprintf(stderr, "kvcache serve: --session-dir needs a directory path of at most 3000 bytes\n");
            return 2;
        }
        if (mkdir(session_dir, 0700) != 0 && errno != EEXIST) {
            fprintf(stderr, "kvcache serve: --session-dir %s: cannot make it: %s\n", session_dir, strerror(errno));
            return 1;
        }
        if (stat(session_dir, &st) != 0 || !S_ISDIR(st.st_mode) || access(session_dir, R_OK | W_OK | X_OK) != 0) {
            fprintf(stderr, "kvcache serve: --session-dir %s: not a directory this process can read and write\n",
                    session_dir);
            return 1;
        }
        char why[256];   /* a save killed before its rename left its temporary file */
        int removed = kve_session_dir_clean(session_dir, why, sizeof why);
        if (removed > 0)
            fprintf(stderr, "kvcache serve: --session-dir %s: removed %d unfinished save%s (NAME.kvs.XXXXXX)\n",
                    session_dir, removed, removed == 1 ? "" : "s");
        else if (removed < 0)
            fprintf(stderr, "kvcache serve: --session-dir %s: cannot look for unfinished saves: %s\n", session_dir, why);
    }

    /* Signals go to sigwait below, never to a worker thread; a client that
     * closes its socket is a failed write, not a SIGPIPE. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    char id[128], err[256];
    model_id(mo.model, id, sizeof id);
    srv_params sp = {.host = host, .port = (int)port, .api_key = api_key, .batch_tokens = (int32_t)batch_tokens,
                     .max_waiting = (int32_t)max_queue,
                     .http_threads = (int32_t)(http_threads ? http_threads
                                                            : 2 * parallel + 112 > 1024 ? 1024 : 2 * parallel + 112),
                     .http_timeout_ms = (int32_t)(http_timeout * 1000), .model_id = id,
                     .context_shift = shift, .n_keep = (int32_t)keep, .draft_lookup = (int32_t)draft,
                     .no_prefix = no_prefix,
                     .session_dir = session_dir, .kv_events = kv_events, .cache_dir = cache_dir,
                     .cache_disk_size = (uint64_t)cache_disk_size, .act_bits = (int32_t)mo.act_bits,
                     .no_window = mo.no_window};
    srv *s;
    if (srv_start(&sp, &s, err, sizeof err)) {
        fprintf(stderr, "kvcache serve: %s\n", err);
        return 1;
    }
    fprintf(stderr, "kvcache serve: loading %s (GET /health answers 503 until it is ready)\n", mo.model);
    kve_context_params cp = kve_context_default_params();
    int rc = cli_model_check("serve", &mo, mo.ctx, &cp.kv_type);
    kve_model *m = NULL;
    if (!rc && kve_model_load(mo.model, &m, err, sizeof err) != KVE_OK) {
        fprintf(stderr, "kvcache serve: cannot load model '%s': %s\n", mo.model, err);
        rc = 1;
    }
    if (rc) {
        srv_shutdown(s);
        return rc;
    }
    cli_ctx_warning("serve", &mo, mo.ctx, kve_model_n_ctx_train(m));
    cp.n_ctx = (int32_t)mo.ctx, cp.n_seqs = (int32_t)parallel, cp.n_batch = (int32_t)mo.batch;
    cp.n_threads = cli_threads(&mo), cp.n_pages = (int32_t)mo.kv_pages;
    if (srv_attach(s, m, &cp, err, sizeof err)) {
        fprintf(stderr, "kvcache serve: %s\n", err);
        srv_shutdown(s);
        kve_model_free(m);
        return 1;
    }
    kve_context_params got = kve_context_get_params(srv_context(s));
    kve_context_stats cs = {.size = sizeof cs};
    kve_context_get_stats(srv_context(s), &cs);
    printf("kvcache serve: listening on http://%s%s%s:%d  (model %s; %d parallel x %d positions; %d KV pages of %d, %s; "
           "%d threads)\n",
           strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "", srv_port(s), id, (int)parallel,
           (int)got.n_ctx, (int)cs.pages_total, (int)cs.page_size, kv_dtype_name(got.kv_type), (int)got.n_threads);
    fflush(stdout);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "kvcache serve: %s: ending in-flight requests and shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    srv_shutdown(s);
    kve_model_free(m);
    fprintf(stderr, "kvcache serve: stopped\n");
    return 0;
}
