/* cli/common.c - what the model subcommands share: the -m/-t/--ctx/--kv-type
 * options, loading a model with a message that says how to get one, a
 * progress bar, reading a file. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "../engine/model/model.h"

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
    if (o->threads > 0) return (int32_t)o->threads; /* cli_load refused > CLI_MAX_THREADS */
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 64 ? 64 : (int32_t)n;
}

int cli_load(const char *cmd, const cli_model_opts *o, int32_t n_seqs, int64_t ctx_default, llm_model **m,
             llm_context **c) {
    *m = NULL, *c = NULL;
    llm_context_params p = llm_context_default_params();
    if (kv_dtype_parse(o->kv_type, &p.kv_type) != KV_OK || p.kv_type == KV_F64) {
        fprintf(stderr, "kvcache %s: --kv-type must be f32, f16, bf16 or q8 (not '%s')\n", cmd, o->kv_type);
        return 2;
    }
    if (o->act_bits != -1 && o->act_bits != 0 && o->act_bits != 8 && o->act_bits != 16) {
        fprintf(stderr, "kvcache %s: --act-bits must be 16 or 8 (or --exact-matmul for f32)\n", cmd);
        return 2;
    }
    p.act_bits = (int32_t)o->act_bits;
    int64_t ctx = o->ctx ? o->ctx : ctx_default;
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
    char err[512];
    if (llm_model_load(o->model, m, err, sizeof err) != 0) {
        fprintf(stderr, "kvcache %s: cannot load model '%s': %s\n", cmd, o->model, err);
        return 1;
    }
    int32_t trained = llm_model_hparams(*m)->ctx_train;
    if (ctx > trained) /* allowed (RoPE scaling may stretch it), but past what the model has seen */
        fprintf(stderr, "kvcache %s: warning: a context of %lld positions (--ctx) is more than the %d '%s' was "
                        "trained on; text past them may degrade\n",
                cmd, (long long)ctx, (int)trained, o->model);
    p.n_ctx = (int32_t)ctx;
    p.n_seqs = n_seqs;
    p.n_batch = (int32_t)o->batch;
    p.n_threads = cli_threads(o);
    p.no_window = o->no_window;
    p.window = (int32_t)o->window;
    p.n_pages = (int32_t)o->kv_pages;
    if (llm_context_create(*m, &p, c, err, sizeof err) != 0) {
        fprintf(stderr, "kvcache %s: %s\n", cmd, err);
        llm_model_free(*m);
        *m = NULL;
        return 1;
    }
    return 0;
}

void cli_print_cache_groups(FILE *f, llm_context *c) {
    const llm_model *m = llm_context_model(c);
    if (llm_model_n_groups(m) < 2) return;
    int no_window = llm_context_get_params(c).no_window;
    for (int32_t g = 0, n, w; llm_model_group(m, g, &n, &w) == LLM_OK; g++) {
        kv_cache_stats s = kv_cache_get_stats(llm_context_cache_at(c, g));
        char what[64];
        if (w == 0) snprintf(what, sizeof what, "%d full-attention layers", (int)n);
        else snprintf(what, sizeof what, "%d window-%d layers%s", (int)n, (int)w, no_window ? " (--no-window)" : "");
        fprintf(f, "  %-36s %llu bytes in use (%d pages), %llu bytes/token\n", what,
                (unsigned long long)s.bytes_in_use, (int)s.pages_used, (unsigned long long)s.bytes_per_token);
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

int32_t *cli_tokenize(const llm_model *m, const char *text, int add_special, int parse_special, int32_t *n_out) {
    return cli_tokenize_len(m, text, strlen(text), add_special, parse_special, n_out);
}

int32_t *cli_tokenize_len(const llm_model *m, const char *text, size_t len, int add_special, int parse_special,
                          int32_t *n_out) {
    int32_t need = llm_tokenize(llm_model_tokenizer(m), text, len, add_special, parse_special, NULL, 0);
    if (need == LLM_TOK_ERR) return NULL;
    int32_t cap = need < 0 ? -need : need;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(cap ? cap : 1));
    if (!ids) return NULL;
    *n_out = cap ? llm_tokenize(llm_model_tokenizer(m), text, len, add_special, parse_special, ids, cap) : 0;
    if (*n_out < 0) {
        free(ids);
        return NULL;
    }
    return ids;
}

/* llm_gen_params.on_text: the text to stdout as it comes (valid UTF-8, so a
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
        if (o->n_stops < LLM_MAX_STOPS) o->stops[o->n_stops++] = stop;
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
        fprintf(stderr, "kvcache %s: --stop is given more than %d times\n", cmd, LLM_MAX_STOPS);
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

llm_sampler_params cli_sampler_params(const cli_sample_opts *o) {
    return (llm_sampler_params){.temp = (float)o->temp, .top_k = (int32_t)o->top_k, .top_p = (float)o->top_p,
                                .seed = (uint64_t)o->seed, .min_p = (float)o->min_p,
                                .repeat_penalty = (float)o->repeat_penalty, .repeat_last_n = (int32_t)o->repeat_last_n,
                                .presence_penalty = (float)o->presence_penalty,
                                .frequency_penalty = (float)o->frequency_penalty};
}

int cli_grammar_load(const char *cmd, const cli_sample_opts *o, const struct llm_model *m, llm_gbnf **g,
                     llm_grammar_vocab **v) {
    *g = NULL, *v = NULL;
    const char *file = o->grammar ? o->grammar : o->json_schema;
    if (!file) return 0;
    size_t len = 0;
    char *text = cli_read_file(file, &len);
    if (!text) {
        fprintf(stderr, "kvcache %s: cannot read '%s': %s\n", cmd, file, strerror(errno));
        return 1;
    }
    char err[320];
    *g = o->grammar ? llm_gbnf_parse(text, len, err, sizeof err) : llm_json_schema_compile(text, len, err, sizeof err);
    free(text);
    if (!*g) {
        fprintf(stderr, "kvcache %s: %s: %s\n", cmd, file, err);
        return 1;
    }
    if (!(*v = llm_grammar_vocab_new(llm_model_tokenizer(m))) || llm_gbnf_bind(*g, *v)) {
        fprintf(stderr, "kvcache %s: out of memory for the grammar\n", cmd);
        cli_grammar_free(*g, *v);
        *g = NULL, *v = NULL;
        return 1;
    }
    return 0;
}

void cli_grammar_free(llm_gbnf *g, llm_grammar_vocab *v) {
    llm_gbnf_free(g);
    llm_grammar_vocab_free(v);
}
