/* cli/generate.c - `kvcache generate`: prefill a prompt in one batched pass,
 * then decode token by token on the cache, streaming text as it comes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "../engine/model.h"
#include "../engine/sampler.h"

static void usage(void) {
    printf("usage: kvcache generate [-m MODEL.gguf] -p PROMPT [-n N] [--chat] [--temp T] [--top-k K]\n"
           "                        [--top-p P] [--seed S] [-t THREADS] [--ctx N] [--kv-type T]\n"
           "Streams the continuation of PROMPT to stdout, then prints prefill and decode speed,\n"
           "KV bytes per token and cache bytes in use to stderr.\n\n"
           "  -p, --prompt TEXT  the prompt (or -f FILE)\n"
           "  -f, --file FILE    read the prompt from a file\n"
           "  -n, --tokens N     tokens to generate at most (default 128); stops early at end of turn\n"
           "  --chat             wrap the prompt in the model's chat template as a user message\n"
           "  --system TEXT      with --chat: the system message (default: the template's)\n"
           "  --temp T           temperature; 0 is greedy and deterministic (default 0.8)\n"
           "  --top-k K          sample among the K most likely tokens, 0: all (default 40)\n"
           "  --top-p P          nucleus: the smallest set holding mass P (default 0.95)\n"
           "  --seed S           sampler seed (default 1)\n" CLI_MODEL_HELP);
}

/* Renders a one-turn conversation; NULL (after a message) on failure. */
static char *render_chat(const llm_model *m, const char *system, const char *prompt) {
    if (m->chat.kind == LLM_CHAT_UNKNOWN) {
        fprintf(stderr, "kvcache generate: the model has no chat template this engine knows\n");
        return NULL;
    }
    llm_chat_msg msgs[2];
    int32_t n = 0;
    if (system) msgs[n++] = (llm_chat_msg){"system", system};
    msgs[n++] = (llm_chat_msg){"user", prompt};
    int32_t len = llm_chat_render(&m->chat, msgs, n, 1, NULL, 0);
    char *text = len < 0 && len != LLM_CHAT_ERR ? malloc((size_t)-len) : NULL;
    if (!text || llm_chat_render(&m->chat, msgs, n, 1, text, -len) < 0) {
        free(text);
        fprintf(stderr, "kvcache generate: could not render the chat prompt\n");
        return NULL;
    }
    return text;
}

int cmd_generate(int argc, char **argv) {
    cli_model_opts mo = cli_model_opts_default();
    const char *prompt = NULL, *file = NULL, *system = NULL;
    int64_t n_gen = 128;
    int chat = 0;
    double temp = 0.8, top_p = 0.95;
    int64_t top_k = 40, seed = 1;
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) { usage(); return 0; }
        if (cli_model_opt(argc, argv, &i, &mo)) continue;
        if (cli_opt_str(argc, argv, &i, "-p", "--prompt", &prompt)) continue;
        if (cli_opt_str(argc, argv, &i, "-f", "--file", &file)) continue;
        if (cli_opt_str(argc, argv, &i, NULL, "--system", &system)) continue;
        if (cli_opt_int(argc, argv, &i, "-n", "--tokens", &n_gen)) continue;
        if (cli_opt_f64(argc, argv, &i, NULL, "--temp", &temp)) continue;
        if (cli_opt_int(argc, argv, &i, NULL, "--top-k", &top_k)) continue;
        if (cli_opt_f64(argc, argv, &i, NULL, "--top-p", &top_p)) continue;
        if (cli_opt_int(argc, argv, &i, NULL, "--seed", &seed)) continue;
        if (!strcmp(argv[i], "--chat")) { chat = 1; continue; }
        fprintf(stderr, "kvcache generate: unknown option '%s' (see --help)\n", argv[i]);
        return 2;
    }
    if (system && !chat) {
        fprintf(stderr, "kvcache generate: --system goes with --chat\n");
        return 2;
    }
    if (!prompt == !file) {
        fprintf(stderr, "kvcache generate: give the prompt with -p TEXT or -f FILE (see --help)\n");
        return 2;
    }
    if (n_gen < 0 || n_gen > (1 << 24) || temp < 0 || top_k < 0 || top_k > INT32_MAX || !(top_p > 0 && top_p <= 1)) {
        fprintf(stderr, "kvcache generate: need -n >= 0, --temp >= 0, --top-k >= 0, 0 < --top-p <= 1\n");
        return 2;
    }
    char *file_text = NULL;
    size_t prompt_len = prompt ? strlen(prompt) : 0;
    if (file && !(prompt = file_text = cli_read_file(file, &prompt_len))) {
        fprintf(stderr, "kvcache generate: cannot read prompt file '%s'\n", file);
        return 1;
    }
    /* read by length: a NUL byte is tokenized as the byte it is, except
     * that the chat template is built of strings */
    const char *nul = memchr(prompt, 0, prompt_len);
    if (chat && nul) {
        fprintf(stderr, "kvcache generate: '%s' has a NUL byte at offset %zu; --chat needs text without one\n",
                file, (size_t)(nul - prompt));
        free(file_text);
        return 1;
    }
    llm_model *m;
    llm_context *c;
    int rc = cli_load("generate", &mo, 1, 0, &m, &c);
    if (rc) return free(file_text), rc;
    llm_sampler_params sp = {.temp = (float)temp, .top_k = (int32_t)top_k, .top_p = (float)top_p,
                             .seed = (uint64_t)seed};
    llm_sampler smp;
    char *text = chat ? render_chat(m, system, prompt) : NULL;
    int32_t n_prompt = 0, *ids = (chat && !text) ? NULL : text ? cli_tokenize(m, text, 1, &n_prompt)
                                                           : cli_tokenize_len(m, prompt, prompt_len, 1, &n_prompt);
    float *logits = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    const int32_t n_ctx = llm_context_get_params(c).n_ctx;
    int32_t seq = -1, generated = 0;
    double t_prefill = 0, t_decode = 0;
    rc = 1;
    if (!ids || !logits || llm_sampler_init(&smp, &sp, m->hp.n_vocab) != 0) {
        if (ids || !chat) fprintf(stderr, "kvcache generate: could not tokenize the prompt\n");
        goto done;
    }
    if (n_prompt == 0) {
        fprintf(stderr, "kvcache generate: the prompt is empty\n");
        goto done_sampler;
    }
    if (n_prompt >= n_ctx) {
        fprintf(stderr, "kvcache generate: the prompt is %d tokens; the context holds %d (raise --ctx)\n",
                (int)n_prompt, (int)n_ctx);
        goto done_sampler;
    }
    kv_seq_new(llm_context_cache(c), &seq);
    double t0 = cli_now();
    int st = llm_eval(c, seq, ids, n_prompt, 0, logits, n_prompt > 1024 ? cli_progress : NULL, "prefill");
    t_prefill = cli_now() - t0;
    t0 = cli_now();
    const char *stop_reason = "token limit";
    while (st == KV_OK && generated < n_gen) {
        int32_t next = llm_sample(&smp, logits);
        if (llm_token_is_eog(m->tok, next)) {
            stop_reason = "end of turn";
            break;
        }
        cli_emit(m, next);
        generated++;
        if (generated == n_gen) break;
        if (kv_seq_length(llm_context_cache(c), seq) >= n_ctx) {
            stop_reason = "context full";
            break;
        }
        st = llm_eval(c, seq, &next, 1, 0, logits, NULL, NULL);
    }
    t_decode = cli_now() - t0;
    printf("\n");
    fflush(stdout); /* the text ends before the stats begin */
    if (st != KV_OK) {
        fprintf(stderr, "kvcache generate: %s\n", llm_status_str(st));
        goto done_sampler;
    }
    kv_cache_stats cs = kv_cache_get_stats(llm_context_cache(c));
    fprintf(stderr, "prefill: %d tokens in %.3f s (%.1f tokens/s)\n", (int)n_prompt, t_prefill,
            n_prompt / (t_prefill > 0 ? t_prefill : 1e-9));
    fprintf(stderr, "decode:  %d tokens in %.3f s (%.1f tokens/s), stopped at %s\n", (int)generated, t_decode,
            generated / (t_decode > 0 ? t_decode : 1e-9), stop_reason);
    fprintf(stderr, "KV cache: %s, %llu bytes/token, %llu bytes in use (%d tokens in %d pages), %d threads\n",
            kv_dtype_name(llm_context_get_params(c).kv_type), (unsigned long long)cs.bytes_per_token,
            (unsigned long long)cs.bytes_in_use, (int)kv_seq_length(llm_context_cache(c), seq), (int)cs.pages_used,
            (int)llm_context_get_params(c).n_threads);
    rc = 0;
done_sampler:
    llm_sampler_free(&smp);
done:
    free(logits), free(ids), free(text), free(file_text);
    llm_context_free(c);
    llm_model_free(m);
    return rc;
}
