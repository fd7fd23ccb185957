/* cli/generate.c - `kvcache generate`: one prompt through the engine's
 * generation loop (engine/gen/session.h), the text streamed as it comes, then
 * the speed of each phase, why it stopped, and the cache in use. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "../engine/model/model.h"
#include "../engine/gen/session.h"

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
static int report(llm_context *c, const llm_session *s, const llm_gen_result *res, int st) {
    if (st == LLM_ERR_CAPACITY && res->reason == LLM_STOP_CONTEXT) {
        fprintf(stderr, "kvcache generate: %s (raise --ctx)\n", res->message);
        return 1;
    }
    printf("\n");
    fflush(stdout); /* the text ends before the stats begin */
    if (res->reason == LLM_STOP_ERROR) {
        fprintf(stderr, "kvcache generate: %s\n", res->message);
        return 1;
    }
    kv_cache_stats cs = llm_context_stats(c);
    llm_context_params cp = llm_context_get_params(c);
    /* the tokens restored from a session were not prefilled: they count apart */
    const int32_t prefilled = res->n_prompt - res->n_reused;
    fprintf(stderr, "prefill: %d tokens in %.3f s (%.1f tokens/s)", (int)prefilled, res->t_prefill,
            prefilled / (res->t_prefill > 0 ? res->t_prefill : 1e-9));
    if (res->n_reused) fprintf(stderr, ", after %d restored from the session", (int)res->n_reused);
    fprintf(stderr, "\n");
    fprintf(stderr, "decode:  %d tokens in %.3f s (%.1f tokens/s), stopped at %s\n", (int)res->n_generated,
            res->t_decode, res->n_generated / (res->t_decode > 0 ? res->t_decode : 1e-9),
            llm_stop_reason_str(res->reason));
    if (res->reason == LLM_STOP_CONTEXT) fprintf(stderr, "  %s\n", res->message);
    cli_policy_report(res);
    fprintf(stderr, "KV cache: %s, %llu bytes/token, %llu bytes in use (%d tokens in %d pages), %d threads\n",
            kv_dtype_name(cp.kv_type), (unsigned long long)cs.bytes_per_token, (unsigned long long)cs.bytes_in_use,
            (int)llm_seq_length(c, llm_session_seq(s)), (int)cs.pages_used, (int)cp.n_threads);
    cli_print_cache_groups(stderr, c);
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
    llm_model *m;
    llm_context *c;
    int rc = cli_load("generate", &mo, 1, 0, &m, &c);
    if (rc) return free(file_text), rc;
    if (chat && llm_model_chat(m)->kind != LLM_CHAT_UNKNOWN && (rc = cli_think_apply("generate", m, think))) {
        llm_context_free(c), llm_model_free(m);
        return free(file_text), rc;
    }
    int32_t n_prompt = 0, *ids = NULL;
    if (chat && llm_model_chat(m)->kind == LLM_CHAT_UNKNOWN)
        fprintf(stderr, "kvcache generate: the model has no chat template this engine knows\n");
    else
        ids = chat ? cli_chat_tokens(m, system, prompt, &n_prompt)
                   : cli_tokenize_len(m, prompt, prompt_len, 1, special, &n_prompt);
    llm_session *s = NULL;
    llm_gbnf *rules = NULL;
    llm_grammar_vocab *gv = NULL;
    rc = 1;
    if (ids && cli_grammar_load("generate", &so, m, &rules, &gv)) {
        free(ids);
        ids = NULL, n_prompt = -1;
    }
    if (n_prompt < 0) {
        /* the grammar's error is written */
    } else if (!ids) {
        if (!chat || llm_model_chat(m)->kind != LLM_CHAT_UNKNOWN)
            fprintf(stderr, "kvcache generate: could not tokenize the prompt\n");
    } else if (n_prompt == 0) {
        fprintf(stderr, "kvcache generate: the prompt is empty\n");
    } else if ((rc = llm_session_create(c, &s)) != LLM_OK) {
        fprintf(stderr, "kvcache generate: %s\n", llm_status_str(rc));
        rc = 1;
    } else {
        llm_gen_params gp = llm_gen_default_params();
        gp.max_tokens = (int32_t)so.n_gen;
        gp.sampler = cli_sampler_params(&so); gp.stops = so.stops, gp.n_stops = so.n_stops;
        gp.sampler.rules = rules;
        gp.on_text = cli_print_text;
        if (n_prompt > 512) gp.progress = cli_progress, gp.progress_user = "prefill";
        gp.context_shift = po.context_shift;
        gp.n_keep = po.keep >= 0 ? (int32_t)po.keep : chat ? cli_chat_prefix_tokens(m, system) : 0;
        gp.draft_lookup = (int32_t)po.draft_lookup;
        bool refused = false;
        if (po.session) cli_session_restore("generate", s, po.session, ids, n_prompt, &refused);
        llm_gen_result res;
        int st = llm_session_generate(s, ids, n_prompt, &gp, &res);
        rc = report(c, s, &res, st);
        if (po.session && res.reason != LLM_STOP_ERROR && !(st == LLM_ERR_CAPACITY)) {
            fprintf(stderr, "session: %d tokens restored, %d prefilled\n", (int)res.n_reused,
                    (int)(res.n_prompt - res.n_reused));
            if (cli_session_save("generate", s, &po, refused)) rc = 1;
        }
    }
    llm_session_free(s);
    cli_grammar_free(rules, gv);
    free(ids), free(file_text);
    llm_context_free(c);
    llm_model_free(m);
    return rc;
}
