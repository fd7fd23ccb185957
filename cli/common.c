/* cli/common.c - what the model subcommands share: the -m/-t/--ctx/--kv-type
 * options, loading a model with a message that says how to get one, a
 * progress bar, reading a file. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

cli_model_opts cli_model_opts_default(void) {
    const char *env = getenv("KVCACHE_MODEL");
    return (cli_model_opts){.model = env && *env ? env : CLI_DEFAULT_MODEL, .threads = 0, .ctx = 0,
                            .batch = 256, .kv_type = "f16", .act_bits = -1};
}

bool cli_model_opt(int argc, char **argv, int *i, cli_model_opts *o) {
    if (!strcmp(argv[*i], "--no-window")) return o->no_window = 1, true;
    return cli_opt_str(argc, argv, i, "-m", "--model", &o->model) ||
           cli_opt_int(argc, argv, i, "-t", "--threads", &o->threads) ||
           cli_opt_int(argc, argv, i, "-c", "--ctx", &o->ctx) ||
           cli_opt_int(argc, argv, i, "-b", "--batch", &o->batch) ||
           cli_opt_str(argc, argv, i, NULL, "--kv-type", &o->kv_type) ||
           cli_opt_int(argc, argv, i, NULL, "--act-bits", &o->act_bits) ||
           (!strcmp(argv[*i], "--exact-matmul") && (o->act_bits = 0, true));
}

int32_t cli_threads(const cli_model_opts *o) {
    if (o->threads > 0) return (int32_t)o->threads; /* cli_model_check refused > CLI_MAX_THREADS */
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 64 ? 64 : (int32_t)n;
}

int cli_model_check(const char *cmd, const cli_model_opts *o, int64_t ctx, kv_dtype *kv) {
    if (kv_dtype_parse(o->kv_type, kv) != KV_OK || *kv == KV_F64) {
        fprintf(stderr, "kvcache %s: --kv-type must be f32, f16, bf16 or q8 (not '%s')\n", cmd, o->kv_type);
        return 2;
    }
    if (o->act_bits != -1 && o->act_bits != 0 && o->act_bits != 8 && o->act_bits != 16) {
        fprintf(stderr, "kvcache %s: --act-bits must be 16 or 8 (or --exact-matmul for f32)\n", cmd);
        return 2;
    }
    if (!cli_range(cmd, "-t", o->threads, 0, CLI_MAX_THREADS, "threads; 0: one per core") ||
        !cli_range(cmd, "--ctx", ctx, 0, 1 << 24, "positions per sequence; 0: the model's, at most 4096") ||
        !cli_range(cmd, "-b", o->batch, 1, 8192, "prompt rows per forward pass") ||
        !cli_range(cmd, "--kv-pages", o->kv_pages, 0, INT32_MAX, "pages in the K/V pool; 0: room for all"))
        return 2;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores > 0 && o->threads > cores) /* allowed (oversubscription is the user's call), but said */
        fprintf(stderr, "kvcache %s: warning: -t %lld is more than the %ld cores online; running %lld threads\n",
                cmd, (long long)o->threads, cores, (long long)o->threads);
    if (access(o->model, R_OK) != 0) {
        fprintf(stderr,
                "kvcache %s: cannot read model '%s': %s\n"
                "  Get the default model (SmolLM2-135M-Instruct, Q4_1, 98 MB) with `make model`,\n"
                "  or pass -m PATH to a Llama or Gemma 3 GGUF file.\n",
                cmd, o->model, strerror(errno));
        return 1;
    }
    return 0;
}

void cli_ctx_warning(const char *cmd, const cli_model_opts *o, int64_t ctx, int32_t trained) {
    if (ctx > trained) /* allowed (RoPE scaling may stretch it), but past what the model has seen */
        fprintf(stderr, "kvcache %s: warning: a context of %lld positions (--ctx) is more than the %d '%s' was "
                        "trained on; text past them may degrade\n",
                cmd, (long long)ctx, (int)trained, o->model);
}

int cli_load_model(const char *cmd, const cli_model_opts *o, kve_model **m) {
    *m = NULL;
    kv_dtype kv;
    int rc = cli_model_check(cmd, o, o->ctx, &kv);
    if (rc) return rc;
    char err[512];
    if (kve_model_load(o->model, m, err, sizeof err) != KVE_OK) {
        fprintf(stderr, "kvcache %s: cannot load model '%s': %s\n", cmd, o->model, err);
        return 1;
    }
    return 0;
}

int cli_new_session(const char *cmd, const cli_model_opts *o, const kve_model *m, kve_session **s) {
    kve_session_params p = kve_session_default_params();
    kve_session_options so = kve_session_default_options();
    char err[512];
    cli_ctx_warning(cmd, o, o->ctx, kve_model_n_ctx_train(m));
    kv_dtype_parse(o->kv_type, &p.kv_type);   /* checked by cli_load_model */
    p.act_bits = (int32_t)o->act_bits;
    p.n_ctx = (int32_t)o->ctx;
    p.n_batch = (int32_t)o->batch;
    p.n_threads = cli_threads(o);
    p.no_window = o->no_window;
    so.window = (int32_t)o->window;
    if (kve_session_create_ex(m, &p, &so, s, err, sizeof err) != KVE_OK) {
        fprintf(stderr, "kvcache %s: %s\n", cmd, err);
        return 1;
    }
    return 0;
}

int cli_open(const char *cmd, const cli_model_opts *o, kve_model **m, kve_session **s) {
    *s = NULL;
    int rc = cli_load_model(cmd, o, m);
    if (!rc && (rc = cli_new_session(cmd, o, *m, s))) {
        kve_model_free(*m);
        *m = NULL;
    }
    return rc;
}

int32_t cli_argmax(const float *v, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++) best = v[i] > v[best] ? i : best;
    return best;
}

void cli_print_cache_groups(FILE *f, const kve_session *s) {
    int32_t n, w;
    kv_cache_stats st;
    if (kve_session_cache_group(s, 1, &n, &w, &st) != KVE_OK) return;   /* one group */
    int no_window = kve_session_get_params(s).no_window;
    for (int32_t g = 0; kve_session_cache_group(s, g, &n, &w, &st) == KVE_OK; g++) {
        char what[64];
        if (w == 0) snprintf(what, sizeof what, "%d full-attention layers", (int)n);
        else snprintf(what, sizeof what, "%d window-%d layers%s", (int)n, (int)w, no_window ? " (--no-window)" : "");
        fprintf(f, "  %-36s %llu bytes in use (%d pages), %llu bytes/token\n", what,
                (unsigned long long)st.bytes_in_use, (int)st.pages_used, (unsigned long long)st.bytes_per_token);
    }
}

void cli_progress(void *user, int64_t done, int64_t total) {
    static int tty = -1;
    if (tty < 0) tty = isatty(2);
    if (!tty || total <= 0) return;
    enum { WIDTH = 40 };
    int fill = (int)(WIDTH * done / total);
    fprintf(stderr, "\r%s [%.*s%*s] %lld/%lld", user ? (const char *)user : "",
            fill, "========================================", WIDTH - fill, "", (long long)done, (long long)total);
    if (done >= total) fprintf(stderr, "\r\033[K");  /* clear the bar: the results follow */
    fflush(stderr);
}

char *cli_read_file(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    errno = 0;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (n + 1 < cap) break;
        char *nb = realloc(buf, cap *= 2);
        if (!nb) free(buf);
        buf = nb;
    }
    int bad = ferror(f) ? (errno ? errno : EIO) : !buf ? ENOMEM : 0;
    if (f != stdin) fclose(f);
    if (bad) {
        free(buf);
        errno = bad; /* for the caller's message */
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

bool cli_range(const char *cmd, const char *opt, int64_t v, int64_t lo, int64_t hi, const char *what) {
    if (v >= lo && v <= hi) return true;
    fprintf(stderr, "kvcache %s: %s %lld is out of range: it takes %lld to %lld (%s)\n", cmd, opt, (long long)v,
            (long long)lo, (long long)hi, what);
    return false;
}

int32_t *cli_text_tokens(const kve_model *m, const char *text, size_t len, int add_special, int parse_special,
                         int32_t *n_out) {
    int32_t need = 0;
    int rc = kve_tokenize(m, text, len, add_special, parse_special, NULL, 0, &need);
    if (rc != KVE_OK && rc != KVE_ERR_SPACE) return NULL;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(need ? need : 1));
    if (ids && need && kve_tokenize(m, text, len, add_special, parse_special, ids, need, &need) != KVE_OK) {
        free(ids);
        return NULL;
    }
    if (ids) *n_out = need;
    return ids;
}

int32_t *cli_chat_ids(const kve_model *m, const kve_chat_message *msgs, int32_t n, int32_t n_prev, int add_bos,
                      int think, int32_t *n_out) {
    int32_t need = 0;
    int rc = kve_chat_tokenize(m, msgs, n, n_prev, 1, add_bos, think, NULL, 0, &need);
    if (rc != KVE_OK && rc != KVE_ERR_SPACE) return NULL;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(need ? need : 1));
    if (ids && need && kve_chat_tokenize(m, msgs, n, n_prev, 1, add_bos, think, ids, need, &need) != KVE_OK) {
        free(ids);
        return NULL;
    }
    if (ids) *n_out = need;
    return ids;
}

/* kve_generate_params.on_text: the text to stdout as it comes (valid UTF-8, so a
 * terminal never sees half a character). */
int cli_print_text(void *user, const char *text, size_t len) {
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

cli_sample_opts cli_sample_opts_default(int64_t n_gen) {
    return (cli_sample_opts){.n_gen = n_gen, .temp = 0.8, .top_k = 40, .top_p = 0.95, .seed = 1,
                             .repeat_penalty = 1, .repeat_last_n = 64};
}

bool cli_sample_opt(int argc, char **argv, int *i, cli_sample_opts *o) {
    const char *stop = NULL;
    if (cli_opt_str(argc, argv, i, NULL, "--stop", &stop)) {
        if (o->n_stops < KVE_MAX_STOPS) o->stops[o->n_stops++] = stop;
        else o->too_many_stops = true;
        return true;
    }
    if (cli_opt_str(argc, argv, i, NULL, "--grammar", &o->grammar) ||
        cli_opt_str(argc, argv, i, NULL, "--json-schema", &o->json_schema))
        return true;
    return cli_opt_int(argc, argv, i, "-n", "--tokens", &o->n_gen) || cli_opt_f64(argc, argv, i, NULL, "--temp", &o->temp) ||
           cli_opt_int(argc, argv, i, NULL, "--top-k", &o->top_k) || cli_opt_f64(argc, argv, i, NULL, "--top-p", &o->top_p) ||
           cli_opt_int(argc, argv, i, NULL, "--seed", &o->seed) || cli_opt_f64(argc, argv, i, NULL, "--min-p", &o->min_p) ||
           cli_opt_f64(argc, argv, i, NULL, "--repeat-penalty", &o->repeat_penalty) ||
           cli_opt_int(argc, argv, i, NULL, "--repeat-last-n", &o->repeat_last_n) ||
           cli_opt_f64(argc, argv, i, NULL, "--presence-penalty", &o->presence_penalty) ||
           cli_opt_f64(argc, argv, i, NULL, "--frequency-penalty", &o->frequency_penalty);
}

/* A real option out of [lo, hi] (NaN too): 0 after a message naming it. */
static bool f64_range(const char *cmd, const char *opt, double v, double lo, double hi, const char *what) {
    if (v >= lo && v <= hi) return true;
    fprintf(stderr, "kvcache %s: %s %g is out of range: it takes %s, %g to %g\n", cmd, opt, v, what, lo, hi);
    return false;
}

int cli_sample_check(const char *cmd, const cli_sample_opts *o, int64_t n_min) {
    if (!cli_range(cmd, "-n", o->n_gen, n_min, 1 << 24, "tokens to generate") ||
        !cli_range(cmd, "--top-k", o->top_k, 0, INT32_MAX, "the K most likely tokens; 0: all") ||
        !cli_range(cmd, "--repeat-last-n", o->repeat_last_n, -1, 1 << 24, "a window in tokens; -1: all") ||
        !f64_range(cmd, "--min-p", o->min_p, 0, 1, "a fraction of the best token's probability") ||
        !f64_range(cmd, "--repeat-penalty", o->repeat_penalty, 1e-6, 10, "a divisor above 0 (1: off)") ||
        !f64_range(cmd, "--presence-penalty", o->presence_penalty, -2, 2, "a logit offset") ||
        !f64_range(cmd, "--frequency-penalty", o->frequency_penalty, -2, 2, "a logit offset per occurrence"))
        return 2;
    if (o->grammar && o->json_schema) {
        fprintf(stderr, "kvcache %s: give --grammar or --json-schema, not both\n", cmd);
        return 2;
    }
    if (o->too_many_stops) {
        fprintf(stderr, "kvcache %s: --stop is given more than %d times\n", cmd, KVE_MAX_STOPS);
        return 2;
    }
    for (int32_t k = 0; k < o->n_stops; k++)
        if (!o->stops[k][0]) {
            fprintf(stderr, "kvcache %s: --stop takes a non-empty text\n", cmd);
            return 2;
        }
    if (!(o->temp >= 0)) {
        fprintf(stderr, "kvcache %s: --temp %g is out of range: it takes 0 (greedy) or more\n", cmd, o->temp);
        return 2;
    }
    if (!(o->top_p > 0 && o->top_p <= 1)) {
        fprintf(stderr, "kvcache %s: --top-p %g is out of range: it takes a probability mass above 0, up to 1\n",
                cmd, o->top_p);
        return 2;
    }
    return 0;
}

kve_generate_params cli_generate_params(const cli_sample_opts *o) {
    kve_generate_params p = kve_generate_default_params();
    p.max_tokens = (int32_t)o->n_gen;
    p.temperature = (float)o->temp, p.top_k = (int32_t)o->top_k, p.top_p = (float)o->top_p;
    p.random_state = (uint64_t)o->seed, p.min_p = (float)o->min_p;
    p.repeat_penalty = (float)o->repeat_penalty, p.repeat_last_n = (int32_t)o->repeat_last_n;
    p.presence_penalty = (float)o->presence_penalty, p.frequency_penalty = (float)o->frequency_penalty;
    p.stops = o->stops, p.n_stops = o->n_stops;
    return p;
}

int cli_grammar_load(const char *cmd, const cli_sample_opts *o, const kve_model *m, kve_grammar **g) {
    *g = NULL;
    const char *file = o->grammar ? o->grammar : o->json_schema;
    if (!file) return 0;
    size_t len = 0;
    char *text = cli_read_file(file, &len);
    if (!text) {
        fprintf(stderr, "kvcache %s: cannot read '%s': %s\n", cmd, file, strerror(errno));
        return 1;
    }
    char err[320];
    int rc = kve_grammar_parse(m, text, len, o->json_schema != NULL && !o->grammar, g, err, sizeof err);
    free(text);
    if (rc == KVE_ERR_PARAM) fprintf(stderr, "kvcache %s: %s: %s\n", cmd, file, err);
    else if (rc != KVE_OK) fprintf(stderr, "kvcache %s: %s\n", cmd, err);
    return rc != KVE_OK;
}
