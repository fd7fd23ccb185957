/* cli/generate.c - `kvcache generate`: one prompt through a kve_session
 * (kvengine.h), the text streamed as it comes, then the speed of each phase,
 * why it stopped, and the cache in use. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage(void) {
    printf("usage: kvcache generate [-m MODEL.gguf] -p PROMPT [-n N] [--chat [--no-think]] [--temp T] [--top-k K]\n"
           "                        [--top-p P] [--min-p P] [--repeat-penalty R] [--repeat-last-n N]\n"
           "                        [--presence-penalty P] [--frequency-penalty F] [--stop TEXT]...\n"
           "                        [--grammar FILE | --json-schema FILE]\n"
           "                        [--seed S] [-t THREADS] [--ctx N] [--kv-type T]\n"
           "                        [--context-shift [--keep N]] [--session FILE] [--draft-lookup N]\n"
           "Streams the continuation of PROMPT to stdout, then prints prefill and decode speed,\n"
           "KV bytes per token and cache bytes in use to stderr.\n\n"
           "  -p, --prompt TEXT  the prompt (or -f FILE)\n"
           "  -f, --file FILE    read the prompt from a file (-: standard input)\n"
           "  -n, --tokens N     tokens to generate at most (default 128); stops early at end of turn\n"
           "  --chat             wrap the prompt in the model's chat template as a user message\n"
           "  --system TEXT      with --chat: the system message (default: the template's)\n"
           CLI_THINK_HELP
           "  --special          recognise control tokens written in the prompt (\"<|im_start|>\");\n"
           "                     by default they are plain text (--chat: the template writes them)\n"
           CLI_SAMPLE_HELP
           "  --draft-lookup N   prompt-lookup speculative decoding: propose up to N tokens that\n"
           "                     followed the last n-gram earlier in prompt + output, verify them in\n"
           "                     one pass, as many as the measured pass costs pay for (none when\n"
           "                     drafts are seldom taken); the same text as without it (default 0: off)\n"
           CLI_POLICY_HELP CLI_MODEL_HELP);
}

/* The stats after the text: speed of each phase, why it stopped, the cache. */
static int report(const kve_session *s, const kve_generate_result *res, int st) {
    if (st == KV_ERR_CAPACITY && res->stop == KVE_STOP_CONTEXT) {
        fprintf(stderr, "kvcache generate: %s (raise --ctx)\n", res->message);
        return 1;
    }
    printf("\n");
    fflush(stdout); /* the text ends before the stats begin */
    if (res->stop == KVE_STOP_ERROR) {
        fprintf(stderr, "kvcache generate: %s\n", res->message);
        return 1;
    }
    kv_cache_stats cs = kve_session_cache_stats(s);
    kve_session_params sp = kve_session_get_params(s);
    /* the tokens restored from a session were not prefilled: they count apart */
    const int32_t prefilled = res->n_prompt - res->n_reused;
    fprintf(stderr, "prefill: %d tokens in %.3f s (%.1f tokens/s)", (int)prefilled, res->t_prefill,
            prefilled / (res->t_prefill > 0 ? res->t_prefill : 1e-9));
    if (res->n_reused) fprintf(stderr, ", after %d restored from the session", (int)res->n_reused);
    fprintf(stderr, "\n");
    fprintf(stderr, "decode:  %d tokens in %.3f s (%.1f tokens/s), stopped at %s\n", (int)res->n_generated,
            res->t_decode, res->n_generated / (res->t_decode > 0 ? res->t_decode : 1e-9),
            kve_stop_reason_str(res->stop));
    if (res->stop == KVE_STOP_CONTEXT) fprintf(stderr, "  %s\n", res->message);
    cli_policy_report(res);
    fprintf(stderr, "KV cache: %s, %llu bytes/token, %llu bytes in use (%d tokens in %d pages), %d threads\n",
            kv_dtype_name(sp.kv_type), (unsigned long long)cs.bytes_per_token, (unsigned long long)cs.bytes_in_use,
            (int)kve_session_n_cached(s), (int)cs.pages_used, (int)sp.n_threads);
    cli_print_cache_groups(stderr, s);
    return 0;
}

int cmd_generate(int argc, char **argv) {
    cli_model_opts mo = cli_model_opts_default();
    const char *prompt = NULL, *file = NULL, *system = NULL;
    int chat = 0, special = 0, think = -1;
    cli_sample_opts so = cli_sample_opts_default(128);
    cli_policy_opts po = cli_policy_opts_default();
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) { usage(); return 0; }
        if (cli_model_opt(argc, argv, &i, &mo)) continue;
        if (cli_policy_opt(argc, argv, &i, &po, true)) continue;
        if (cli_opt_str(argc, argv, &i, "-p", "--prompt", &prompt)) continue;
        if (cli_opt_str(argc, argv, &i, "-f", "--file", &file)) continue;
        if (cli_opt_str(argc, argv, &i, NULL, "--system", &system)) continue;
        if (cli_sample_opt(argc, argv, &i, &so)) continue;
        if (!strcmp(argv[i], "--chat")) { chat = 1; continue; }
        if (cli_think_opt(argv[i], &think)) continue;
        if (!strcmp(argv[i], "--special")) { special = 1; continue; }
        fprintf(stderr, "kvcache generate: unknown option '%s' (see --help)\n", argv[i]);
        return 2;
    }
    if (system && !chat) {
        fprintf(stderr, "kvcache generate: --system goes with --chat\n");
        return 2;
    }
    if (think >= 0 && !chat) {
        fprintf(stderr, "kvcache generate: --%s goes with --chat\n", think ? "think" : "no-think");
        return 2;
    }
    if (special && chat) {
        fprintf(stderr, "kvcache generate: --special is for a raw prompt; with --chat the template writes the "
                        "control tokens and the message stays text\n");
        return 2;
    }
    if (!prompt == !file) {
        fprintf(stderr, "kvcache generate: give the prompt with -p TEXT or -f FILE (see --help)\n");
        return 2;
    }
    if (cli_sample_check("generate", &so, 0)) return 2;
    if (cli_policy_check("generate", &po)) return 2;
    char *file_text = NULL;
    size_t prompt_len = prompt ? strlen(prompt) : 0;
    if (file && !(prompt = file_text = cli_read_file(file, &prompt_len))) {
        fprintf(stderr, "kvcache generate: cannot read prompt file '%s': %s\n", file, strerror(errno));
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
    kve_model *m;
    kve_session *s;
    int rc = cli_open("generate", &mo, &m, &s);
    if (rc) return free(file_text), rc;
    if (chat && kve_model_has_chat_template(m) && (rc = cli_think_check("generate", m, think))) {
        kve_session_free(s), kve_model_free(m);
        return free(file_text), rc;
    }
    int32_t n_prompt = 0, *ids = NULL;
    if (chat && !kve_model_has_chat_template(m))
        fprintf(stderr, "kvcache generate: the model has no chat template this engine knows\n");
    else
        ids = chat ? cli_chat_tokens(m, system, prompt, think, &n_prompt)
                   : cli_text_tokens(m, prompt, prompt_len, 1, special, &n_prompt);
    kve_grammar *rules = NULL;
    rc = 1;
    if (ids && cli_grammar_load("generate", &so, m, &rules)) {
        free(ids);
        ids = NULL, n_prompt = -1;
    }
    if (n_prompt < 0) {
        /* the grammar's error is written */
    } else if (!ids) {
        if (!chat || kve_model_has_chat_template(m))
            fprintf(stderr, "kvcache generate: could not tokenize the prompt\n");
    } else if (n_prompt == 0) {
        fprintf(stderr, "kvcache generate: the prompt is empty\n");
    } else {
        kve_generate_params gp = cli_generate_params(&so);
        gp.grammar = rules;
        gp.on_text = cli_print_text;
        if (n_prompt > 512) gp.on_progress = cli_progress, gp.progress_user = "prefill";
        gp.context_shift = po.context_shift;
        gp.n_keep = po.keep >= 0 ? (int32_t)po.keep : chat ? cli_chat_prefix_tokens(m, system, think) : 0;
        gp.draft_lookup = (int32_t)po.draft_lookup;
        bool refused = false;
        if (po.session) cli_session_restore("generate", s, po.session, ids, n_prompt, &refused);
        kve_generate_result res;
        int st = kve_session_generate(s, ids, n_prompt, &gp, &res);
        rc = report(s, &res, st);
        if (po.session && res.stop != KVE_STOP_ERROR && !(st == KV_ERR_CAPACITY)) {
            fprintf(stderr, "session: %d tokens restored, %d prefilled\n", (int)res.n_reused,
                    (int)(res.n_prompt - res.n_reused));
            if (cli_session_save("generate", s, &po, refused)) rc = 1;
        }
    }
    kve_grammar_free(rules);
    free(ids), free(file_text);
    kve_session_free(s);
    kve_model_free(m);
    return rc;
}
