/* cli/bench_model.c - `kvcache bench`: dispatches `bench model` (here) and
 * `bench attention` (cli/bench_attention.c). `bench model` measures, like
 * llama-bench, prefill (one batched pass over -p tokens) and decode (-n
 * tokens one at a time) in tokens/s, with --depth D tokens already in the
 * cache: the depth is prefilled once, untimed, and every timed run starts
 * from it again (truncated back to D). Both run on the engine's generation
 * loop (engine/session.h), greedy, not stopping at end-of-turn tokens.
 * After the runs it measures read bandwidth with the same threads and prints
 * decode's floor: every decoded token streams all weights (every tensor of
 * the file: an upper bound where the embedding is untied) plus the K/V of
 * the positions it attends over, so it cannot take less than those bytes /
 * bandwidth. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "../engine/model.h"
#include "../engine/quant.h"
#include "../engine/session.h"

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
           "Prefill and decode speed in tokens/s, like llama-bench: -p random tokens in one batched\n"
           "pass, then -n tokens decoded one at a time, each run after D tokens already cached.\n\n"
           "  -p, --prompt N     prefill tokens (default 512; 0 skips)\n"
           "  -n, --tokens N     decode tokens (default 128; 0 skips)\n"
           "  --depth D          tokens in the cache before each run (default 0)\n"
           "  -r, --reps N       runs of each test, reported as mean and stdev (default 3)\n"
           "  --json             one JSON object on stdout: prefill_tps, decode_tps, threads, depth, ...\n"
           CLI_MODEL_HELP);
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

/* Back to the depth's tokens before the next run. A window cache (Gemma 3)
 * has evicted the keys a truncation back would need once a run passes the
 * window, so the session starts over: prefill the depth again, untimed. */
static int back_to_depth(llm_session *s, const int32_t *toks, int32_t depth) {
    int st = llm_session_truncate(s, depth);
    if (st == LLM_OK && llm_session_n_cached(s) < depth) st = llm_session_feed(s, toks, depth);
    return st;
}

int cmd_bench_model(int argc, char **argv) {
    cli_model_opts mo = cli_model_opts_default();
    int64_t n_prompt = 512, n_gen = 128, depth = 0, reps = 3;
    int json = 0;
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) { usage(); return 0; }
        if (cli_model_opt(argc, argv, &i, &mo)) continue;
        if (cli_opt_int(argc, argv, &i, "-p", "--prompt", &n_prompt)) continue;
        if (cli_opt_int(argc, argv, &i, "-n", "--tokens", &n_gen)) continue;
        if (cli_opt_int(argc, argv, &i, NULL, "--depth", &depth)) continue;
        if (cli_opt_int(argc, argv, &i, "-r", "--reps", &reps)) continue;
        if (!strcmp(argv[i], "--json")) { json = 1; continue; }
        fprintf(stderr, "kvcache bench model: unknown option '%s' (see --help)\n", argv[i]);
        return 2;
    }
    if (n_prompt < 0 || n_gen < 0 || depth < 0 || reps < 1 || reps > 100 || n_prompt + n_gen + depth > (1 << 24) ||
        (n_prompt == 0 && n_gen == 0)) {
        fprintf(stderr, "kvcache bench model: need -p, -n, --depth >= 0 (not -p and -n both 0), 1 <= -r <= 100\n");
        return 2;
    }
    /* a decode run feeds its first token, then samples n_gen: room for depth + n_gen + 1 */
    int64_t need = depth + (n_prompt > n_gen + 1 ? n_prompt : n_gen + 1);
    llm_model *m;
    llm_context *c;
    int rc = cli_load("bench model", &mo, 1, need, &m, &c);
    if (rc) return rc;
    if (llm_context_get_params(c).n_ctx < need) {
        fprintf(stderr, "kvcache bench model: --ctx %d is less than depth + tokens + 1 = %lld\n",
                (int)llm_context_get_params(c).n_ctx, (long long)need);
        llm_context_free(c), llm_model_free(m);
        return 2;
    }
    const int32_t V = llm_model_n_vocab(m);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)need);
    double *pp = calloc((size_t)reps, sizeof(double)), *tg = calloc((size_t)reps, sizeof(double));
    uint64_t rng = 42;
    for (int64_t i = 0; toks && i < need; i++) { /* random ids, as llama-bench feeds */
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)((rng >> 33) % (uint64_t)V);
    }
    llm_session *s = NULL;
    int st = toks && pp && tg ? llm_session_create(c, &s) : LLM_ERR_NOMEM;
    if (st == LLM_OK && depth > 0) st = llm_session_feed(s, toks, (int32_t)depth);
    /* greedy, never stopping at an end-of-turn token: every run does the same work */
    llm_gen_params gp = llm_gen_default_params();
    gp.sampler.temp = 0, gp.ignore_eog = 1;
    llm_gen_result res;
    enum { MAX_GROUPS = 4 };
    uint64_t in_use[MAX_GROUPS] = {0};
    int32_t in_use_len = 0;
    const int32_t n_groups = llm_model_n_groups(m) < MAX_GROUPS ? llm_model_n_groups(m) : MAX_GROUPS;
    for (int64_t r = 0; r < reps && st == LLM_OK; r++) {
        if (n_prompt > 0) { /* one batched pass over n_prompt tokens after the depth */
            gp.max_tokens = 0;
            st = llm_session_generate(s, toks, (int32_t)(depth + n_prompt), &gp, &res);
            pp[r] = (double)n_prompt / res.t_prefill;
            if (st == LLM_OK) st = back_to_depth(s, toks, (int32_t)depth);
        }
        if (n_gen > 0 && st == LLM_OK) { /* n_gen forward passes of one token: the first fed
                                          * as a one-token prompt, the rest sampled */
            gp.max_tokens = (int32_t)n_gen;
            st = llm_session_generate(s, toks, (int32_t)(depth + 1), &gp, &res);
            tg[r] = (double)n_gen / (res.t_prefill + res.t_decode);
            if (st == LLM_OK && res.reason != LLM_STOP_LENGTH) st = LLM_ERR_CAPACITY;
            for (int32_t g = 0; g < n_groups; g++) /* what each cache holds at the run's end */
                in_use[g] = kv_cache_get_stats(llm_context_cache_at(c, g)).bytes_in_use;
            in_use_len = llm_seq_length(c, llm_session_seq(s));
            if (st == LLM_OK) st = back_to_depth(s, toks, (int32_t)depth);
        }
    }
    /* the floor: bytes per decoded token (mean depth D + n/2) at the read
     * bandwidth measured now, by as many threads, over 256 MiB */
    double floor_mb = 0, read_gbs = 0, floor_tps = 0;
    if (st == LLM_OK && n_gen > 0) {
        size_t len = (size_t)64 << 20;
        float *buf = aligned_alloc(4096, len * sizeof(float));
        kv_pool *pool = NULL;
        if (buf && kv_pool_create(llm_context_get_params(c).n_threads, &pool) == KV_OK) {
            for (size_t i = 0; i < len; i++) buf[i] = (float)(i & 1023);
            read_gbs = cli_read_bandwidth(pool, buf, len, 4);
            double kv = (double)llm_context_stats(c).bytes_per_token * ((double)depth + (double)n_gen / 2);
            floor_mb = ((double)llm_model_weight_bytes(m) + kv) / 1e6;
            floor_tps = read_gbs * 1e3 / floor_mb;
        }
        kv_pool_free(pool);
        free(buf);
    }
    if (st != LLM_OK) {
        fprintf(stderr, "kvcache bench model: %s\n", llm_status_str(st));
        rc = 1;
    } else {
        double ppm, pps, tgm, tgs;
        stats(pp, (int)reps, &ppm, &pps);
        stats(tg, (int)reps, &tgm, &tgs);
        int32_t threads = llm_context_get_params(c).n_threads;
        const char *kvt = kv_dtype_name(llm_context_get_params(c).kv_type);
        if (json) {
            printf("{\"model\": ");
            json_str(llm_model_name(m));
            printf(", \"threads\": %d, \"depth\": %lld, \"kv_type\": \"%s\", \"prefill_tokens\": %lld, "
                   "\"decode_tokens\": %lld, \"reps\": %lld, \"prefill_tps\": %.3f, \"prefill_tps_stdev\": %.3f, "
                   "\"decode_tps\": %.3f, \"decode_tps_stdev\": %.3f, \"kernels\": \"%s\", \"act_bits\": %d, "
                   "\"bytes_per_token\": %.0f, \"read_gbs\": %.2f, \"floor_tps\": %.2f, \"packed_bytes\": %llu, "
                   "\"kv_bytes_in_use\": [",
                   (int)threads, (long long)depth, kvt, (long long)n_prompt, (long long)n_gen, (long long)reps,
                   ppm, pps, tgm, tgs, llm_quant_kernels(), (int)llm_context_get_params(c).act_bits, floor_mb * 1e6,
                   read_gbs, floor_tps, (unsigned long long)llm_model_packed_bytes(m));
            for (int32_t g = 0; g < n_groups; g++) printf("%s%llu", g ? ", " : "", (unsigned long long)in_use[g]);
            printf("]}\n");
        } else {
            int ab = llm_context_get_params(c).act_bits;
            printf("model %s (%.1f MB of weights, %.1f MB of them packed), %d threads, %s K/V, %s kernels, %s "
                   "activations, %lld runs each\n",
                   llm_model_name(m), (double)llm_model_weight_bytes(m) / 1e6, (double)llm_model_packed_bytes(m) / 1e6,
                   (int)threads, kvt, llm_quant_kernels(),
                   ab == 16 ? "int16" : ab == 8 ? "int8" : "f32", (long long)reps);
            printf("  %-20s %12s\n", "test", "tokens/s");
            if (n_prompt) printf("  prefill %-5lld @ d%-5lld %10.1f +/- %.1f\n", (long long)n_prompt, (long long)depth, ppm, pps);
            if (n_gen) printf("  decode  %-5lld @ d%-5lld %10.1f +/- %.1f\n", (long long)n_gen, (long long)depth, tgm, tgs);
            if (floor_tps > 0)
                printf("  decode floor: %.1f MB streamed per token (weights + K/V at mean depth %lld) at %.1f GB/s\n"
                       "  measured now: floor %.2f ms = %.1f tokens/s; decode reached %.2f of it\n",
                       floor_mb, (long long)(depth + n_gen / 2), read_gbs, floor_mb / read_gbs,
                       floor_tps, tgm / floor_tps);
            if (n_gen) {
                printf("  KV bytes in use after a decode run (%d positions):", (int)in_use_len);
                for (int32_t g = 0, nl, w; g < n_groups && llm_model_group(m, g, &nl, &w) == LLM_OK; g++) {
                    if (w) printf("%s %d window-%d layers %llu", g ? ";" : "", (int)nl, (int)w, (unsigned long long)in_use[g]);
                    else printf("%s %d full layers %llu", g ? ";" : "", (int)nl, (unsigned long long)in_use[g]);
                }
                printf("\n");
            }
        }
    }
    llm_session_free(s);
    free(toks), free(pp), free(tg);
    llm_context_free(c);
    llm_model_free(m);
    return rc;
}
