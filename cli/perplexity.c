/* cli/perplexity.c - `kvcache perplexity`: perplexity as llama.cpp computes
 * it. The text's tokens are cut into non-overlapping windows of ctx tokens;
 * each window is evaluated from an empty cache and scored only on its second
 * half (predictions of tokens ctx/2+1 .. ctx-1), so every scored token sees at
 * least ctx/2 tokens of context. ppl = exp(mean negative log-likelihood).
 *
 * --kl-base FILE prices a K/V storage type: the first run saves every scored
 * position's log-probabilities (f32, V per position); a later run with the
 * same text, model and ctx compares against them and reports the mean KL
 * divergence KL(base || this run). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static void usage(void) {
    printf("usage: kvcache perplexity [-m MODEL.gguf] -f TEXT [--ctx N] [--chunks N] [--kv-type T]\n"
           "                          [--kl-base FILE] [-t THREADS]\n"
           "Perplexity over TEXT as llama.cpp computes it: windows of --ctx tokens (default 512),\n"
           "each scored on its second half. Ends with the line `ppl = X`.\n\n"
           "  -f, --file TEXT    the text to score (-: standard input)\n"
           "  --chunks N         score at most N windows\n"
           "  --kl-base FILE     if FILE does not exist, save this run's log-probabilities there\n"
           "                     (about 4 x vocabulary bytes per scored token); if it does, report\n"
           "                     the mean KL divergence of this run from it (e.g. q8 against f16 K/V)\n"
           CLI_MODEL_HELP);
}

enum { KL_MAGIC = 0x4c4b564b, KL_VERSION = 1 }; /* "KVKL" */

/* Header of a --kl-base file; V f32 log-probabilities per scored token follow. */
typedef struct {
    uint32_t magic, version;
    uint32_t n_vocab;      /* V */
    uint32_t ctx;          /* window length */
    uint64_t n_scored;     /* positions stored */
    uint64_t tokens_hash;  /* FNV-1a of the scored windows' token ids: same text, same windows */
} kl_header;

static uint64_t fnv(uint64_t h, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) h = (h ^ (uint8_t)((uint32_t)ids[i] >> (8 * b))) * 1099511628211ull;
    return h;
}

/* lp = log softmax(logits), the normalizer summed in double. */
static void log_softmax(const float *logits, int32_t V, float *lp) {
    double mx = -INFINITY, sum = 0;
    for (int32_t i = 0; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    for (int32_t i = 0; i < V; i++) sum += exp((double)logits[i] - mx);
    double lz = mx + log(sum);
    for (int32_t i = 0; i < V; i++) lp[i] = (float)((double)logits[i] - lz);
}

int cmd_perplexity(int argc, char **argv) {
    cli_model_opts mo = cli_model_opts_default();
    const char *file = NULL, *kl_path = NULL;
    int64_t max_chunks = 0;
    mo.ctx = 512;
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) { usage(); return 0; }
        if (cli_model_opt(argc, argv, &i, &mo)) continue;
        if (cli_opt_str(argc, argv, &i, "-f", "--file", &file)) continue;
        if (cli_opt_str(argc, argv, &i, NULL, "--kl-base", &kl_path)) continue;
        if (cli_opt_int(argc, argv, &i, NULL, "--chunks", &max_chunks)) continue;
        fprintf(stderr, "kvcache perplexity: unknown option '%s' (see --help)\n", argv[i]);
        return 2;
    }
    if (!file) {
        fprintf(stderr, "kvcache perplexity: give the text with -f FILE (see --help)\n");
        return 2;
    }
    if (!cli_range("perplexity", "--ctx", mo.ctx, 4, 1 << 24, "positions per window") ||
        !cli_range("perplexity", "--chunks", max_chunks, 0, INT32_MAX, "windows to score; 0: all"))
        return 2;
    size_t text_len = 0;
    char *text = cli_read_file(file, &text_len);
    if (!text) {
        fprintf(stderr, "kvcache perplexity: cannot read '%s': %s\n", file, strerror(errno));
        return 1;
    }
    kve_model *m;
    kve_session *s;
    int rc = cli_open("perplexity", &mo, &m, &s);
    if (rc) return free(text), rc;
    const int32_t V = kve_model_n_vocab(m), ctx = (int32_t)mo.ctx, first = ctx / 2;
    const int32_t n_batch = kve_session_get_params(s).n_batch;
    int32_t n_tok = 0, *ids = cli_text_tokens(m, text, text_len, 1, 0, &n_tok); /* a NUL is a byte */
    free(text);
    float *logits = malloc(sizeof(float) * (size_t)V * (size_t)n_batch);
    float *lp = malloc(sizeof(float) * (size_t)V), *base = malloc(sizeof(float) * (size_t)V);
    FILE *kl = NULL;
    char tmp_path[4096] = "";
    rc = 1;
    if (!ids || !logits || !lp || !base) {
        fprintf(stderr, "kvcache perplexity: out of memory or untokenizable text\n");
        goto done;
    }
    int32_t n_chunks = n_tok / ctx;
    if (max_chunks && max_chunks < n_chunks) n_chunks = (int32_t)max_chunks;
    if (n_chunks < 1) {
        fprintf(stderr, "kvcache perplexity: the text is %d tokens; one window needs --ctx = %d (lower --ctx)\n",
                (int)n_tok, (int)ctx);
        goto done;
    }
    /* llama.cpp starts every window with BOS when the model adds one */
    int32_t bos = kve_model_bos(m);
    int add_bos = bos >= 0 && n_tok > 0 && ids[0] == bos;
    uint64_t per = (uint64_t)(ctx - 1 - first), n_scored = per * (uint64_t)n_chunks, hash = 1469598103934665603ull;
    for (int32_t k = 0; k < n_chunks; k++) {
        if (add_bos) ids[k * ctx] = bos;
        hash = fnv(hash, ids + (size_t)k * (size_t)ctx, (size_t)ctx);
    }
    kl_header hdr = {KL_MAGIC, KL_VERSION, (uint32_t)V, (uint32_t)ctx, n_scored, hash};
    int kl_compare = 0;
    if (kl_path && (kl = fopen(kl_path, "rb"))) {
        kl_header got;
        if (fread(&got, sizeof got, 1, kl) != 1 || got.magic != KL_MAGIC || got.version != KL_VERSION) {
            fprintf(stderr, "kvcache perplexity: '%s' is not a --kl-base file\n", kl_path);
            goto done;
        }
        if (memcmp(&got, &hdr, sizeof hdr) != 0) {
            fprintf(stderr, "kvcache perplexity: '%s' was saved for another text, model or --ctx "
                            "(%u tokens of vocabulary, ctx %u, %llu positions)\n",
                    kl_path, got.n_vocab, got.ctx, (unsigned long long)got.n_scored);
            goto done;
        }
        kl_compare = 1;
    } else if (kl_path) {
        snprintf(tmp_path, sizeof tmp_path, "%s.tmp", kl_path);
        if (!(kl = fopen(tmp_path, "wb")) || fwrite(&hdr, sizeof hdr, 1, kl) != 1) {
            fprintf(stderr, "kvcache perplexity: cannot write '%s'\n", tmp_path);
            goto done;
        }
    }
    printf("perplexity: %s, %d tokens: %d windows of %d, each scored on its last %d predictions; %s K/V\n",
           kve_model_name(m), (int)n_tok, (int)n_chunks, (int)ctx, (int)per,
           kv_dtype_name(kve_session_get_params(s).kv_type));
    double nll = 0, nll2 = 0, kl_sum = 0, kl_max = 0, t0 = cli_now();
    uint64_t count = 0, same_top = 0;
    int st = KVE_OK;
    for (int32_t k = 0; k < n_chunks && st == KVE_OK; k++) {
        const int32_t *w = ids + (size_t)k * (size_t)ctx;
        kve_session_reset(s);
        for (int32_t a = 0; a < ctx && st == KVE_OK; a += n_batch) {
            /* scored: the predictions after tokens [first, ctx - 1) of the window */
            int32_t t = ctx - a < n_batch ? ctx - a : n_batch, from = first - a < 0 ? 0 : first - a < t ? first - a : t;
            st = kve_session_eval(s, w + a, t, from, logits);
            for (int32_t j = from; j < t && a + j < ctx - 1 && st == KVE_OK; j++) {
                const float *lg = logits + (size_t)(j - from) * (size_t)V;
                log_softmax(lg, V, lp);
                double l = -(double)lp[w[a + j + 1]];
                nll += l, nll2 += l * l, count++;
                if (kl_compare) {
                    if (fread(base, sizeof(float), (size_t)V, kl) != (size_t)V) {
                        fprintf(stderr, "kvcache perplexity: '%s' is truncated\n", kl_path);
                        goto done;
                    }
                    double d = 0;
                    for (int32_t i = 0; i < V; i++) d += exp((double)base[i]) * ((double)base[i] - lp[i]);
                    kl_sum += d, kl_max = d > kl_max ? d : kl_max;
                    same_top += cli_argmax(base, V) == cli_argmax(lp, V);
                } else if (kl && fwrite(lp, sizeof(float), (size_t)V, kl) != (size_t)V) {
                    fprintf(stderr, "kvcache perplexity: cannot write '%s'\n", tmp_path);
                    goto done;
                }
            }
            cli_progress("perplexity", (int64_t)k * ctx + a + t, (int64_t)n_chunks * ctx);
        }
        if (st == KVE_OK && !isatty(2))
            fprintf(stderr, "[%d/%d] ppl %.4f\n", (int)k + 1, (int)n_chunks, exp(nll / (double)count));
    }
    if (st != KVE_OK) {
        fprintf(stderr, "kvcache perplexity: %s\n", kve_status_str(st));
        goto done;
    }
    double secs = cli_now() - t0, mean = nll / (double)count;
    /* the standard error of the mean NLL, carried to ppl to first order */
    double var = count > 1 ? (nll2 / (double)count - mean * mean) * (double)count / (double)(count - 1) : 0;
    double ppl = exp(mean), err = ppl * sqrt(var > 0 ? var / (double)count : 0);
    printf("%llu tokens scored in %.2f s (%.1f tokens/s evaluated)\n", (unsigned long long)count, secs,
           (double)n_chunks * ctx / (secs > 0 ? secs : 1e-9));
    if (kl_compare) {
        printf("mean KL divergence from %s: %.6g (max %.4g); same top token: %.2f%%\n", kl_path,
               kl_sum / (double)count, kl_max, 100.0 * (double)same_top / (double)count);
    } else if (kl) {
        if (fclose(kl) != 0 || rename(tmp_path, kl_path) != 0) {
            kl = NULL;
            fprintf(stderr, "kvcache perplexity: cannot write '%s'\n", kl_path);
            goto done;
        }
        kl = NULL;
        tmp_path[0] = 0;
        printf("saved %llu x %d log-probabilities to %s as the KL base\n", (unsigned long long)count, (int)V, kl_path);
    }
    printf("ppl = %.4f +/- %.4f\n", ppl, err);
    rc = 0;
done:
    if (kl) fclose(kl);
    if (tmp_path[0]) remove(tmp_path);
    free(ids), free(logits), free(lp), free(base);
    kve_session_free(s);
    kve_model_free(m);
    return rc;
}
