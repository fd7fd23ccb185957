/* cli/bench_model.c - `kvcache bench`: dispatches `bench model` (here) and
 * `bench attention` (cli/bench_attention.c). `bench model` measures, like
 * llama-bench, prefill (one batched pass over P tokens) and decode (N
 * tokens one at a time) in tokens/s, with D tokens already in the cache, for
 * every P of -p, N of -n and D of --depth (comma-separated lists), printing
 * each row as soon as it is measured. Each depth is prefilled once, untimed,
 * and every timed run starts from it again (truncated back to D). Both run
 * on the engine's generation loop (engine/gen/session.h), greedy, not stopping
 * at end-of-turn tokens. Before the decode rows it measures read bandwidth
 * with the same threads, and each decode row carries its floor: every
 * decoded token streams all weights (every tensor of the file: an upper
 * bound where the embedding is untied) plus the K/V of the positions it
 * attends over, so it cannot take less than those bytes / bandwidth. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static void bench_usage(FILE *f) {
    fprintf(f, "usage: kvcache bench model|attention [options]   (kvcache bench model --help)\n"
               "  model       prefill and decode tokens/s of a GGUF model on the cache\n"
               "  attention   the attention kernels against this machine's limits\n");
}

int cmd_bench(int argc, char **argv) {
    if (argc < 1 || cli_is_help(argv[0])) {
        bench_usage(argc < 1 ? stderr : stdout);
        return argc < 1 ? 2 : 0;
    }
    if (!strcmp(argv[0], "model")) return cmd_bench_model(argc - 1, argv + 1);
    if (!strcmp(argv[0], "attention")) return cmd_bench_attention(argc - 1, argv + 1);
    fprintf(stderr, "kvcache bench: unknown benchmark '%s'\n", argv[0]);
    bench_usage(stderr);
    return 2;
}

static void usage(void) {
    printf("usage: kvcache bench model [-m MODEL.gguf] [-p 512] [-n 128] [--depth D] [-r REPS] [-t N]\n"
           "                           [--kv-type T] [--json]\n"
           "Prefill and decode speed in tokens/s, like llama-bench: P random tokens in one batched\n"
           "pass, N tokens decoded one at a time, each run after D tokens already cached. -p, -n and\n"
           "--depth take comma-separated lists (-p 128,512 -n 64 --depth 0,4096): one row per\n"
           "depth and size, printed as it is measured.\n\n"
           "  -p, --prompt N,..  prefill tokens (default 512; 0 skips)\n"
           "  -n, --tokens N,..  decode tokens (default 128; 0 skips)\n"
           "  --depth D,..       tokens in the cache before each run (default 0)\n"
           "  -r, --reps N       runs of each test, reported as mean and stdev (default 3)\n"
           "  --json             one JSON object per row on stdout (JSON Lines): prefill_tps or\n"
           "                     decode_tps, threads, depth, ...; decode rows add floor_tps, floor_ratio,\n"
           "                     llc_bytes (the last-level cache) and weights_fit_llc\n"
           CLI_MODEL_HELP);
}

enum { MAX_LIST = 16 };
typedef struct {
    int64_t v[MAX_LIST];
    int n;
} int_list;

/* `--opt A,B,C` into l; exits 2 naming the option when a value is not a
 * count or the list is too long. */
static bool list_opt(int argc, char **argv, int *i, const char *s, const char *l, int_list *out) {
    const char *v;
    if (!cli_opt_str(argc, argv, i, s, l, &v)) return false;
    out->n = 0;
    for (const char *p = v;;) {
        char *end;
        long long x = strtoll(p, &end, 10);
        if (end == p || (*end && *end != ',') || x < 0 || x > (1 << 24) || out->n == MAX_LIST) {
            fprintf(stderr, "kvcache bench model: %s '%s': give up to %d counts of 0 to %d, comma-separated\n",
                    argv[*i - 1], v, MAX_LIST, 1 << 24);
            exit(2);
        }
        out->v[out->n++] = x;
        if (!*end) break;
        p = end + 1;
    }
    return true;
}

static int64_t list_max(const int_list *l) {
    int64_t m = 0;
    for (int k = 0; k < l->n; k++) m = l->v[k] > m ? l->v[k] : m;
    return m;
}

/* mean and sample standard deviation of x[0..n) */
static void stats(const double *x, int n, double *mean, double *sd) {
    double s = 0, s2 = 0;
    for (int i = 0; i < n; i++) s += x[i];
    *mean = n ? s / n : 0;
    for (int i = 0; i < n; i++) s2 += (x[i] - *mean) * (x[i] - *mean);
    *sd = n > 1 ? sqrt(s2 / (n - 1)) : 0;
}

static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch < 0x20) printf("\\u%04x", ch);
        else putchar(ch);
    }
    putchar('"');
}

/* Feeds toks [from, to) in chunks, with a progress bar: a deep cache takes a while. */
static int feed_to(kve_session *s, const int32_t *toks, int32_t from, int32_t to) {
    int st = KVE_OK;
    for (int32_t at = from; at < to && st == KVE_OK;) {
        int32_t n = to - at < 1024 ? to - at : 1024;
        st = kve_session_feed(s, toks + at, n);
        at += n;
        if (to - from > 1024) cli_progress("depth", at - from, to - from);
    }
    return st;
}

/* Back to the depth's tokens before the next run. A window cache (Gemma 3)
 * has evicted the keys a truncation back would need once a run passes the
 * window, so the session starts over: prefill the depth again, untimed. */
static int back_to_depth(kve_session *s, const int32_t *toks, int32_t depth) {
    int st = kve_session_truncate(s, depth);
    if (st == KVE_OK && kve_session_n_cached(s) < depth) st = feed_to(s, toks, kve_session_n_cached(s), depth);
    return st;
}

/* What every row shares. */
typedef struct {
    kve_model *m;
    kve_session *s;
    kve_model_shape shape;
    const int32_t *toks;
    int64_t reps;
    int json;
    double *x;             /* [reps] one row's tokens/s */
    double read_gbs;       /* measured before the first decode row; 0: not yet */
} bench;

/* The read bandwidth by as many threads as the model runs, over 256 MiB. */
static double measure_bandwidth(int32_t n_threads) {
    size_t len = (size_t)64 << 20;
    float *buf = aligned_alloc(4096, len * sizeof(float));
    kv_pool *pool = NULL;
    double gbs = 0;
    if (buf && kv_pool_create(n_threads, &pool) == KV_OK) {
        for (size_t i = 0; i < len; i++) buf[i] = (float)(i & 1023);
        gbs = cli_read_bandwidth(pool, buf, len, 4);
    }
    kv_pool_free(pool);
    free(buf);
    return gbs;
}

/* The size of the last-level cache cpu 0 reads through: the data or unified
 * cache of the highest level sysfs lists; failing that, glibc's level-3 size
 * (from cpuid). 0 when neither says. */
static uint64_t llc_bytes(void) {
    uint64_t best = 0;
    int best_level = 0;
    for (int i = 0; i < 16; i++) {
        char path[96], type[32] = "", unit = 0;
        int level = 0;
        unsigned long long size = 0;
        FILE *f;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        if (!(f = fopen(path, "r"))) continue;
        int ok = fscanf(f, "%d", &level) == 1;
        fclose(f);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        if (ok && (f = fopen(path, "r"))) ok = fscanf(f, "%31s", type) == 1, fclose(f);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (ok && (f = fopen(path, "r"))) ok = fscanf(f, "%llu%c", &size, &unit) >= 1, fclose(f);
        if (!ok || !strcmp(type, "Instruction")) continue;
        size *= unit == 'K' ? 1ull << 10 : unit == 'M' ? 1ull << 20 : unit == 'G' ? 1ull << 30 : 1;
        if (level > best_level || (level == best_level && size > best)) best = size, best_level = level;
    }
    if (!best) {
        long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
        best = l3 > 0 ? (uint64_t)l3 : 0;
    }
    return best;
}

/* One row: reps runs of prefill (n_gen 0) or decode of n tokens at depth,
 * then its line (or JSON object) on stdout. A kve_status. */
static int bench_row(bench *b, int64_t depth, int64_t n_prompt, int64_t n_gen) {
    kve_generate_params gp = kve_generate_default_params();
    gp.temperature = 0, gp.ignore_eog = 1; /* every run does the same work */
    kve_generate_result res;
    char label[64];
    snprintf(label, sizeof label, "%s %lld @ d%lld", n_prompt ? "prefill" : "decode",
             (long long)(n_prompt ? n_prompt : n_gen), (long long)depth);
    enum { MAX_GROUPS = 4 };
    uint64_t in_use[MAX_GROUPS] = {0};
    int32_t in_use_len = 0;
    const int32_t n_groups = b->shape.n_groups < MAX_GROUPS ? b->shape.n_groups : MAX_GROUPS;
    int st = KVE_OK;
    for (int64_t r = 0; r < b->reps && st == KVE_OK; r++) {
        cli_progress(label, r, b->reps);
        if (n_prompt) { /* one batched pass over n_prompt tokens after the depth */
            gp.max_tokens = 0;
            kve_session_clear_prefixes(b->s); /* measured, not reused from the last run */
            st = kve_session_generate(b->s, b->toks, (int32_t)(depth + n_prompt), &gp, &res);
            b->x[r] = (double)n_prompt / res.t_prefill;
        } else { /* n_gen forward passes of one token: the first fed as a one-token prompt, the rest sampled */
            gp.max_tokens = (int32_t)n_gen;
            st = kve_session_generate(b->s, b->toks, (int32_t)(depth + 1), &gp, &res);
            b->x[r] = (double)n_gen / (res.t_prefill + res.t_decode);
            if (st == KVE_OK && res.stop != KVE_STOP_LENGTH) st = KV_ERR_CAPACITY;
            kv_cache_stats cs;
            for (int32_t g = 0; g < n_groups; g++) /* what each cache holds at the run's end */
                in_use[g] = kve_session_cache_group(b->s, g, NULL, NULL, &cs) == KVE_OK ? cs.bytes_in_use : 0;
            in_use_len = kve_session_n_cached(b->s);
        }
        if (st == KVE_OK) st = back_to_depth(b->s, b->toks, (int32_t)depth);
    }
    cli_progress(label, b->reps, b->reps);
    if (st != KVE_OK) return st;
    double mean, sd;
    stats(b->x, (int)b->reps, &mean, &sd);
    /* the floor: what a decoded token reads at the measured bandwidth, at the
     * row's mean depth D + n/2: the weights the products stream (the packed
     * copy when there is one), and per cache group the K/V of the positions
     * its layers attend, at most a window's */
    double at = (double)depth + (double)n_gen / 2, kv = 0;
    kv_cache_stats cs;
    for (int32_t g = 0, w; g < n_groups && kve_session_cache_group(b->s, g, NULL, &w, &cs) == KVE_OK; g++) {
        double span = w && (double)w < at ? (double)w : at;
        kv += (double)cs.bytes_per_token * span;
    }
    const uint64_t streamed = b->shape.streamed_bytes;
    double floor_mb = ((double)streamed + kv) / 1e6;
    double floor_tps = n_gen && b->read_gbs > 0 ? b->read_gbs * 1e3 / floor_mb : 0;
    const kve_session_params cp = kve_session_get_params(b->s);
    if (b->json) {
        const char *k = n_prompt ? "prefill" : "decode";
        printf("{\"model\": ");
        json_str(kve_model_name(b->m));
        printf(", \"threads\": %d, \"depth\": %lld, \"kv_type\": \"%s\", \"reps\": %lld, \"kernels\": \"%s\", "
               "\"act_bits\": %d, \"packed_bytes\": %llu, \"streamed_bytes\": %llu, \"%s_tokens\": %lld, "
               "\"%s_tps\": %.3f, \"%s_tps_stdev\": %.3f",
               (int)cp.n_threads, (long long)depth, kv_dtype_name(cp.kv_type), (long long)b->reps,
               kve_kernels(), (int)cp.act_bits, (unsigned long long)b->shape.packed_bytes,
               (unsigned long long)streamed, k,
               (long long)(n_prompt ? n_prompt : n_gen), k, mean, k, sd);
        if (n_gen) {
            /* a floor ratio above 1 is possible when the weights stay in the last-level cache */
            const uint64_t llc = llc_bytes(), weights = streamed;
            printf(", \"bytes_per_token\": %.0f, \"read_gbs\": %.2f, \"floor_tps\": %.2f, \"floor_ratio\": %.3f, "
                   "\"llc_bytes\": %llu, \"weights_fit_llc\": %s, \"kv_bytes_in_use\": [",
                   floor_mb * 1e6, b->read_gbs, floor_tps, floor_tps > 0 ? mean / floor_tps : 0,
                   (unsigned long long)llc, !llc ? "null" : weights <= llc ? "true" : "false");
            for (int32_t g = 0; g < n_groups; g++) printf("%s%llu", g ? ", " : "", (unsigned long long)in_use[g]);
            printf("]");
        }
        printf("}\n");
    } else {
        printf("  %-8s %-6lld d%-7lld %10.1f %8.1f", n_prompt ? "prefill" : "decode",
               (long long)(n_prompt ? n_prompt : n_gen), (long long)depth, mean, sd);
        if (floor_tps > 0) printf(" %9.1f %6.2f", floor_tps, mean / floor_tps);
        if (n_gen) {
            printf("   KV in use at %d:", (int)in_use_len);
            for (int32_t g = 0, nl, w; g < n_groups && kve_model_group(b->m, g, &nl, &w) == KVE_OK; g++) {
                if (w) printf("%s %d window-%d layers %llu", g ? ";" : "", (int)nl, (int)w, (unsigned long long)in_use[g]);
                else printf("%s %d full layers %llu", g ? ";" : "", (int)nl, (unsigned long long)in_use[g]);
            }
        }
        printf("\n");
    }
    fflush(stdout);
    return KVE_OK;
}

int cmd_bench_model(int argc, char **argv) {
    cli_model_opts mo = cli_model_opts_default();
    int_list prompts = {{512}, 1}, gens = {{128}, 1}, depths = {{0}, 1};
    int64_t reps = 3;
    int json = 0;
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) { usage(); return 0; }
        if (cli_model_opt(argc, argv, &i, &mo)) continue;
        if (list_opt(argc, argv, &i, "-p", "--prompt", &prompts)) continue;
        if (list_opt(argc, argv, &i, "-n", "--tokens", &gens)) continue;
        if (list_opt(argc, argv, &i, NULL, "--depth", &depths)) continue;
        if (cli_opt_int(argc, argv, &i, "-r", "--reps", &reps)) continue;
        if (!strcmp(argv[i], "--json")) { json = 1; continue; }
        fprintf(stderr, "kvcache bench model: unknown option '%s' (see --help)\n", argv[i]);
        return 2;
    }
    const int64_t max_p = list_max(&prompts), max_n = list_max(&gens), max_d = list_max(&depths);
    if (!cli_range("bench model", "-r", reps, 1, 100, "runs of each test")) return 2;
    if (max_p == 0 && max_n == 0) {
        fprintf(stderr, "kvcache bench model: -p and -n are both 0: nothing to measure\n");
        return 2;
    }
    /* a decode run feeds its first token, then samples n_gen: room for depth + n_gen + 1 */
    int64_t need = max_d + (max_p > max_n + 1 ? max_p : max_n + 1);
    if (need > (1 << 24)) {
        fprintf(stderr, "kvcache bench model: --depth %lld with -p %lld / -n %lld needs %lld positions, "
                        "more than 2^24\n", (long long)max_d, (long long)max_p, (long long)max_n, (long long)need);
        return 2;
    }
    bench b = {.reps = reps, .json = json};
    if (!mo.ctx) mo.ctx = need;
    int rc = cli_open("bench model", &mo, &b.m, &b.s);
    if (rc) return rc;
    if (kve_session_get_params(b.s).n_ctx < need) {
        fprintf(stderr, "kvcache bench model: --ctx %d is less than depth + tokens + 1 = %lld\n",
                (int)kve_session_get_params(b.s).n_ctx, (long long)need);
        kve_session_free(b.s), kve_model_free(b.m);
        return 2;
    }
    b.shape = kve_model_get_shape(b.m);
    const int32_t V = kve_model_n_vocab(b.m);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)need);
    b.x = calloc((size_t)reps, sizeof(double));
    uint64_t rng = 42;
    for (int64_t i = 0; toks && i < need; i++) { /* random ids, as llama-bench feeds */
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)((rng >> 33) % (uint64_t)V);
    }
    b.toks = toks;
    int st = toks && b.x ? KVE_OK : KVE_ERR_NOMEM;
    const kve_session_params cp = kve_session_get_params(b.s);
    if (st == KVE_OK && !json) {
        int ab = cp.act_bits;
        printf("model %s (%.1f MB of weights, %.1f MB of them packed), %d threads, %s K/V, %s kernels, %s "
               "activations, %lld runs each\n",
               kve_model_name(b.m), (double)b.shape.weight_bytes / 1e6,
               (double)b.shape.packed_bytes / 1e6, (int)cp.n_threads, kv_dtype_name(cp.kv_type),
               kve_kernels(), ab == 16 ? "int16" : ab == 8 ? "int8" : "f32", (long long)reps);
        printf("  %-8s %-6s %-8s %10s %8s%s\n", "test", "tokens", "depth", "tokens/s", "+/-",
               max_n ? "     floor  ratio" : "");
        fflush(stdout);
    }
    for (int di = 0; di < depths.n && st == KVE_OK; di++) {
        const int64_t d = depths.v[di];
        kve_session_reset(b.s);
        st = feed_to(b.s, toks, 0, (int32_t)d);
        for (int k = 0; k < prompts.n && st == KVE_OK; k++)
            if (prompts.v[k]) st = bench_row(&b, d, prompts.v[k], 0);
        for (int k = 0; k < gens.n && st == KVE_OK; k++) {
            if (!gens.v[k]) continue;
            if (b.read_gbs == 0) b.read_gbs = measure_bandwidth(cp.n_threads);
            st = bench_row(&b, d, 0, gens.v[k]);
        }
    }
    if (st != KVE_OK) {
        fprintf(stderr, "kvcache bench model: %s\n", kve_status_str(st));
        rc = 1;
    } else if (!json && b.read_gbs > 0) {
        const uint64_t streamed = b.shape.streamed_bytes;
        printf("  floor: the weights the products stream (%.1f MB, packed where they are) + each layer group's\n"
               "  K/V at the row's mean depth (a window group's at most its window), read once per token at\n"
               "  the %.1f GB/s read by %d threads before the decode rows; ratio: decode's tokens/s over the floor's\n",
               (double)streamed / 1e6, b.read_gbs, (int)cp.n_threads);
        const uint64_t llc = llc_bytes();
        if (llc)
            printf("  the last-level cache holds %.1f MiB: the weights %s (a ratio above 1 means they are read from it)\n",
                   (double)llc / (1 << 20), streamed <= llc ? "fit in it" : "do not fit");
    }
    kve_session_free(b.s);
    free(toks), free(b.x);
    kve_model_free(b.m);
    return rc;
}
