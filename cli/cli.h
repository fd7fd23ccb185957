/* cli/cli.h - the `kvcache` command: one entry point per subcommand, and the
 * small helpers they share for options, timing, loading a model and showing
 * progress. */
#ifndef KV_CLI_H
#define KV_CLI_H

#include <stdbool.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcache.h"
#include "kvengine.h"

/* Each subcommand gets argv after its own name; returns the exit status
 * (0 ok, 1 failure at run time, 2 bad usage). */
int cmd_demo(int argc, char **argv);
int cmd_generate(int argc, char **argv);     /* cli/generate.c */
int cmd_chat(int argc, char **argv);         /* cli/chat.c */
int cmd_perplexity(int argc, char **argv);   /* cli/perplexity.c */
int cmd_bench(int argc, char **argv);        /* cli/bench_model.c: `bench model|attention` */
int cmd_bench_model(int argc, char **argv);  /* cli/bench_model.c */
int cmd_bench_attention(int argc, char **argv); /* cli/bench_attention.c */
int cmd_verify(int argc, char **argv);       /* cli/verify.c */
int cmd_price(int argc, char **argv);        /* cli/price.c */
int cmd_info(int argc, char **argv);         /* cli/info.c */
int cmd_serve(int argc, char **argv);        /* cli/serve.c */
int cmd_tokenize(int argc, char **argv);     /* cli/tokenize.c */

/* Seconds on a monotonic clock. */
double cli_now(void);

/* Option parsing: `--name VALUE` or `-n VALUE`. Returns true and advances *i
 * when argv[*i] matches; exits with a message when the value is missing or
 * malformed (the CLI may exit; the library never does). */
bool cli_opt_str(int argc, char **argv, int *i, const char *s, const char *l, const char **out);
bool cli_opt_int(int argc, char **argv, int *i, const char *s, const char *l, int64_t *out);
bool cli_opt_f64(int argc, char **argv, int *i, const char *s, const char *l, double *out);
bool cli_is_help(const char *arg);
/* True when lo <= v <= hi; otherwise false after a line on stderr naming the
 * option, its value, the range and what it means (what). */
bool cli_range(const char *cmd, const char *opt, int64_t v, int64_t lo, int64_t hi, const char *what);

/* Read bandwidth in GB/s, best of `trials` passes over buf [len] floats (len
 * a multiple of 4096, buf far larger than the caches) read by the pool's
 * threads as 4 interleaved streams each and as many more as one stream each
 * (cli/bench_attention.c). */
struct kv_pool;
double cli_read_bandwidth(struct kv_pool *pool, const float *buf, size_t len, int trials);

/* ---- running a model (cli/common.c) ---- */

/* The options every model subcommand takes. */
typedef struct {
    const char *model;    /* -m PATH; default $KVCACHE_MODEL or CLI_DEFAULT_MODEL */
    int64_t threads;      /* -t N; 0: one per online core */
    int64_t ctx;          /* -c/--ctx N: positions per sequence; 0: the subcommand's default */
    int64_t batch;        /* -b/--batch N: prefill chunk rows */
    const char *kv_type;  /* --kv-type f32|f16|bf16|q8 */
    int no_window;        /* --no-window: window layers keep every position */
    int64_t window;       /* a sliding window forced on every layer (verify --policy window); 0: none */
    int64_t kv_pages;     /* KV pool pages; 0: room for every sequence at full context (serve's --kv-pages) */
    int64_t act_bits;     /* --act-bits 16|8, --exact-matmul (0); -1: the engine's default */
} cli_model_opts;

#define CLI_DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
/* One help paragraph describing the options above. */
#define CLI_MODEL_HELP                                                                            \
    "  -m, --model PATH   GGUF model (default $KVCACHE_MODEL or " CLI_DEFAULT_MODEL ")\n"          \
    "  -t, --threads N    threads (default: one per core)\n"                                     \
    "  -c, --ctx N        context: positions the cache holds per sequence\n"                     \
    "  -b, --batch N      prompt rows per forward pass (default 256)\n"                          \
    "  --kv-type T        K/V storage: f32, f16 (default), bf16, q8\n"                        \
    "  --act-bits N       weight products on 16-bit (default) or 8-bit integer activations\n"    \
    "                     (8: llama.cpp's precision; faster prefill with AVX-512 VNNI)\n"       \
    "  --exact-matmul     weight products on f32 activations (the reference; also\n"             \
    "                     KVCACHE_EXACT_MATMUL=1)\n" \
    "  --no-window        sliding-window layers (Gemma 3) keep every position, as caches\n"      \
    "                     without windows do: same results, for comparing memory\n"

cli_model_opts cli_model_opts_default(void);
/* Matches one of the options above at argv[*i]. */
bool cli_model_opt(int argc, char **argv, int *i, cli_model_opts *o);
/* The checks before a model is loaded: the options' ranges (ctx: --ctx or
 * the subcommand's default), *kv from --kv-type, a warning for more threads
 * than cores, a readable model file (else how to get the default one).
 * 0, 2 for bad options, 1 for an unreadable model, after a message. */
int cli_model_check(const char *cmd, const cli_model_opts *o, int64_t ctx, kv_dtype *kv);
/* A warning when ctx is past the trained context. */
void cli_ctx_warning(const char *cmd, const cli_model_opts *o, int64_t ctx, int32_t trained);
/* Loads the model and makes a session on it (kvengine.h) with the options'
 * context (0: the model's training context capped at 4096). A clear message
 * and nonzero on failure: 2 for bad options, 1 for an unreadable model. */
int cli_open(const char *cmd, const cli_model_opts *o, kve_model **m, kve_session **s);
/* cli_open in two steps, for a command that needs the model before it knows
 * its context size, or several sessions on one model: the checks (with
 * o->ctx) and the load; then a session with the options' context, K/V type,
 * threads and window (o->window forced on every layer). The same messages
 * and statuses; on failure nothing is left allocated by the step. */
int cli_load_model(const char *cmd, const cli_model_opts *o, kve_model **m);
int cli_new_session(const char *cmd, const cli_model_opts *o, const kve_model *m, kve_session **s);
/* The first index of the largest of v[0..n). */
int32_t cli_argmax(const float *v, int32_t n);
/* Per cache of s (one per layer group): its layers, window and bytes in use,
 * one indented line each; nothing for a model with one group. */
void cli_print_cache_groups(FILE *f, const kve_session *s);

/* The most threads -t may ask for (the engine's limit); more is refused. */
#define CLI_MAX_THREADS 256
/* Threads -t resolves to. */
int32_t cli_threads(const cli_model_opts *o);
/* A progress callback (kve_progress_fn): a bar on stderr, only when stderr is
 * a terminal. user: the label (a C string). Call with done == total to end the line. */
void cli_progress(void *user, int64_t done, int64_t total);
/* The ids of text [len] (NUL bytes included; BOS/EOS as the model says when
 * add_special; control tokens written in it recognised only when
 * parse_special), malloc'ed, *n_out of them; NULL on failure. */
int32_t *cli_text_tokens(const kve_model *m, const char *text, size_t len, int add_special, int parse_special,
                         int32_t *n_out);
/* kve_chat_tokenize (the assistant's turn opened; think: its enable_thinking)
 * into a malloc'ed array of *n_out ids; NULL on failure. */
int32_t *cli_chat_ids(const kve_model *m, const kve_chat_message *msgs, int32_t n, int32_t n_prev, int add_bos,
                      int think, int32_t *n_out);
/* A one-turn chat prompt (system may be NULL) as the model's template gives
 * it, BOS first: markers from the template, the messages as text; think: the
 * template's enable_thinking (-1 its default). */
int32_t *cli_chat_tokens(const kve_model *m, const char *system, const char *user, int think, int32_t *n);
/* kve_generate_params.on_text: writes text [len] to stdout and flushes. */
int cli_print_text(void *user, const char *text, size_t len);
/* ---- sampling and length, for generate and chat ---- */

typedef struct {
    int64_t n_gen;   /* -n, --tokens: at most this many tokens */
    double temp;     /* --temp: 0 is greedy */
    int64_t top_k;   /* --top-k: 0 keeps every token */
    double top_p;    /* --top-p, in (0, 1] */
    int64_t seed;    /* --seed */
    double min_p;                /* --min-p, in [0, 1]; 0: off */
    double repeat_penalty;       /* --repeat-penalty, > 0; 1: off */
    int64_t repeat_last_n;       /* --repeat-last-n: its window, prompt included; -1: all */
    double presence_penalty;     /* --presence-penalty, in [-2, 2] */
    double frequency_penalty;    /* --frequency-penalty, in [-2, 2] */
    const char *stops[KVE_MAX_STOPS]; /* --stop, repeatable */
    int32_t n_stops;
    bool too_many_stops;
    const char *grammar;         /* --grammar FILE: a GBNF-like grammar (docs/GRAMMAR.md) */
    const char *json_schema;     /* --json-schema FILE: a JSON Schema (the subset docs/GRAMMAR.md lists) */
} cli_sample_opts;

/* generate's and chat's defaults (llama-cli's): temperature 0.8, top-k 40,
 * top-p 0.95, seed 1, repeat window 64, penalties and min-p off, no stop
 * strings, and at most n_gen tokens. */
cli_sample_opts cli_sample_opts_default(int64_t n_gen);
/* Their help lines, -n's apart. */
#define CLI_SAMPLE_HELP                                                                          \
    "  --temp T           temperature; 0 is greedy and deterministic (default 0.8)\n"            \
    "  --top-k K          sample among the K most likely tokens, 0: all (default 40)\n"          \
    "  --top-p P          nucleus: the smallest set holding mass P (default 0.95)\n"             \
    "  --seed S           sampler seed (default 1)\n"                                             \
    "  --min-p P          drop tokens less likely than P times the best one (default 0: off)\n"  \
    "  --repeat-penalty R divide positive logits (multiply negative) of the tokens among the\n"  \
    "                     last --repeat-last-n, prompt included, by R (default 1: off)\n"        \
    "  --repeat-last-n N  that window in tokens; -1: every token (default 64)\n"                 \
    "  --presence-penalty P  OpenAI's: subtract P from each token generated before (in [-2, 2])\n" \
    "  --frequency-penalty F OpenAI's: subtract F times its count so far (in [-2, 2])\n"         \
    "  --stop TEXT        stop before TEXT appears (repeatable, up to 8; not shown)\n"            \
    "  --grammar FILE     every reply a document of this GBNF-like grammar (docs/GRAMMAR.md)\n"  \
    "  --json-schema FILE every reply a JSON document of this schema (docs/GRAMMAR.md)\n"
/* Matches -n/--tokens, --temp, --top-k, --top-p, --seed, --min-p,
 * --repeat-penalty, --repeat-last-n, --presence-penalty, --frequency-penalty,
 * --stop at argv[*i]. */
bool cli_sample_opt(int argc, char **argv, int *i, cli_sample_opts *o);
/* 0, or 2 after a message; n_min is the least -n the command takes. */
int cli_sample_check(const char *cmd, const cli_sample_opts *o, int64_t n_min);
/* kve_generate_default_params with the options' length, sampling and stops. */
kve_generate_params cli_generate_params(const cli_sample_opts *o);
/* --grammar or --json-schema read and compiled for m into *g (NULL when
 * neither is given; kve_grammar_free). 0, or 1 after a message naming the
 * file and what is wrong. */
int cli_grammar_load(const char *cmd, const cli_sample_opts *o, const kve_model *m, kve_grammar **g);

/* ---- cache policies, for generate and chat (cli/policy.c) ---- */

typedef struct {
    int context_shift;    /* --context-shift: a full context drops old positions and goes on */
    int64_t keep;         /* --keep N: positions a shift keeps; -1: the system prompt (at least 4) */
    const char *session;  /* --session FILE: restore the common prefix, save after the run */
    int session_overwrite; /* --session-overwrite: save over a FILE that was refused */
    int64_t draft_lookup; /* --draft-lookup N (generate): prompt-lookup speculative decoding */
} cli_policy_opts;

#define CLI_POLICY_HELP                                                                          \
    "  --context-shift    when the context is full, keep the first --keep positions, drop half\n" \
    "                     of the rest and go on (default: stop, saying so)\n"                      \
    "  --keep N           positions a context shift keeps (default: the system prompt, >= 4)\n"    \
    "  --session FILE     restore the cached prefix FILE holds (if it begins this prompt and was\n" \
    "                     made by this model and --kv-type), prefill only the rest, save after\n"  \
    "                     the run; a FILE it refuses (another model, K/V type, corrupt) is kept\n" \
    "  --session-overwrite  save over a --session FILE that was refused\n"

cli_policy_opts cli_policy_opts_default(void);
/* Matches --context-shift, --keep, --session, --session-overwrite (and --draft-lookup when
 * lookup is set) at argv[*i]. */
bool cli_policy_opt(int argc, char **argv, int *i, cli_policy_opts *o, bool lookup);
/* 0, or 2 after a message naming the bad option. */
int cli_policy_check(const char *cmd, const cli_policy_opts *o);
/* Tokens a chat prompt starts with whatever the user says: BOS, the system
 * message (or the template's own), the user header. The default --keep. */
int32_t cli_chat_prefix_tokens(const kve_model *m, const char *system, int think);
/* --think / --no-think: *think = 1 or 0 (it stays -1 when neither is given). */
bool cli_think_opt(const char *arg, int *think);
/* 0, or 2 with a message when think >= 0 and the model's template has no
 * enable_thinking switch (kve_chat_tokenize refuses it). */
int cli_think_check(const char *cmd, const kve_model *m, int think);
#define CLI_THINK_HELP                                                                            \
    "  --think, --no-think  the template's enable_thinking (Qwen3): --no-think opens the reply\n"      \
    "                     with an empty <think></think> block so the model answers directly;\n"       \
    "                     --think is the template's default. A model whose template has no\n"        \
    "                     such switch refuses both\n"
/* --session: restores what FILE shares with prompt [n] into s (a line on
 * stderr says what happened, or why the run goes on cold); the count.
 * *refused: FILE exists but could not be restored. */
int32_t cli_session_restore(const char *cmd, kve_session *s, const char *path, const int32_t *prompt, int32_t n,
                            bool *refused);
/* --session: saves s to o->session, a line on stderr either way; 0 or 1. A
 * file that was refused is kept (a line says so) unless --session-overwrite. */
int cli_session_save(const char *cmd, const kve_session *s, const cli_policy_opts *o, bool refused);
/* A line per policy that acted in a generation: shifts, lookup acceptance. */
void cli_policy_report(const kve_generate_result *res);

/* ---- the lines chat reads (cli/lineedit.c) ---- */

#include <signal.h>

/* Set by SIGINT while a terminal chat runs (cli_lines_open installs the
 * handler); whoever acts on it clears it. */
extern volatile sig_atomic_t cli_interrupted;
typedef struct cli_lines cli_lines;
/* Lines from stdin: edited, with history, when it is a terminal (libedit),
 * plain otherwise. NULL when out of memory. */
cli_lines *cli_lines_open(void);
bool cli_lines_interactive(const cli_lines *l);
/* 1 with *line (valid until the next call; no line end), 0 at the end of
 * input, -1 when Ctrl-C discarded the line being edited. */
int cli_lines_read(cli_lines *l, const char **line);
void cli_lines_close(cli_lines *l);

/* Reads a whole file, "-" standard input (NUL-terminated; *len without the
 * NUL); NULL with errno set on error. */
char *cli_read_file(const char *path, size_t *len);

#endif
