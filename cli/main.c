/* cli/main.c - `kvcache SUBCOMMAND [options]`: dispatch and shared helpers. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"generate", cmd_generate, "generate text from a GGUF model, streaming; speed and KV bytes on stderr"},
    {"chat", cmd_chat, "an interactive chat that keeps its cache across turns"},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server with continuous batching on the paged cache"},
    {"perplexity", cmd_perplexity, "perplexity of a text (llama.cpp's method); KL divergence between K/V types"},
    {"bench", cmd_bench, "bench model: prefill/decode tokens/s; bench attention: the kernels"},
    {"verify", cmd_verify, "cached decoding against full recomputation, step by step: pass/fail"},
    {"price", cmd_price, "KV bytes per token and per sequence, and the bandwidth-bound decode floor"},
    {"info", cmd_info, "a GGUF file's metadata, tensors and model shape"},
    {"tokenize", cmd_tokenize, "the token ids and pieces a model sees for a text"},
    {"demo", cmd_demo, "a synthetic multi-layer decode loop on the cache: tokens/s and KV bytes"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: kvcache SUBCOMMAND [options]   (kvcache SUBCOMMAND --help for its options)\n"
               "       kvcache --version\n\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "--version")) {
        printf("kvcache %s\n", KVCACHE_VERSION);
        return 0;
    }
    if (argc < 2 || cli_is_help(argv[1])) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 2, argv + 2);
    fprintf(stderr, "kvcache: unknown subcommand '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

double cli_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

bool cli_is_help(const char *arg) { return !strcmp(arg, "-h") || !strcmp(arg, "--help"); }

bool cli_opt_str(int argc, char **argv, int *i, const char *s, const char *l, const char **out) {
    if (!((s && !strcmp(argv[*i], s)) || (l && !strcmp(argv[*i], l)))) return false;
    if (*i + 1 >= argc) {
        fprintf(stderr, "kvcache: option %s needs a value\n", argv[*i]);
        exit(2);
    }
    *out = argv[++*i];
    return true;
}

bool cli_opt_int(int argc, char **argv, int *i, const char *s, const char *l, int64_t *out) {
    const char *v;
    if (!cli_opt_str(argc, argv, i, s, l, &v)) return false;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end) {
        fprintf(stderr, "kvcache: option %s: '%s' is not an integer\n", argv[*i - 1], v);
        exit(2);
    }
    *out = x;
    return true;
}

bool cli_opt_f64(int argc, char **argv, int *i, const char *s, const char *l, double *out) {
    const char *v;
    if (!cli_opt_str(argc, argv, i, s, l, &v)) return false;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end) {
        fprintf(stderr, "kvcache: option %s: '%s' is not a number\n", argv[*i - 1], v);
        exit(2);
    }
    /* strtod accepts "nan" and "inf", which slip through range checks
     * written as `x < lo` and mean nothing for any option */
    if (!isfinite(x)) {
        fprintf(stderr, "kvcache: option %s: '%s' is not a finite number\n", argv[*i - 1], v);
        exit(2);
    }
    *out = x;
    return true;
}
