/* cli/policy.c - the cache-policy options generate and chat share
 * (--context-shift, --keep, --session, --draft-lookup) and the lines that
 * report what each did. The policies themselves are the engine's (a
 * kve_session's, kvengine.h); this only parses and reports. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

cli_policy_opts cli_policy_opts_default(void) { return (cli_policy_opts){.keep = -1}; }

bool cli_policy_opt(int argc, char **argv, int *i, cli_policy_opts *o, bool lookup) {
    if (!strcmp(argv[*i], "--context-shift")) return o->context_shift = 1, true;
    if (!strcmp(argv[*i], "--session-overwrite")) return o->session_overwrite = 1, true;
    return cli_opt_int(argc, argv, i, NULL, "--keep", &o->keep) ||
           cli_opt_str(argc, argv, i, NULL, "--session", &o->session) ||
           (lookup && cli_opt_int(argc, argv, i, NULL, "--draft-lookup", &o->draft_lookup));
}

int cli_policy_check(const char *cmd, const cli_policy_opts *o) {
    if (o->keep != -1 && !cli_range(cmd, "--keep", o->keep, 0, 1 << 24, "positions a context shift keeps"))
        return 2;
    if (o->keep >= 0 && !o->context_shift) {
        fprintf(stderr, "kvcache %s: --keep goes with --context-shift\n", cmd);
        return 2;
    }
    if (o->session_overwrite && !o->session) {
        fprintf(stderr, "kvcache %s: --session-overwrite goes with --session FILE\n", cmd);
        return 2;
    }
    if (!cli_range(cmd, "--draft-lookup", o->draft_lookup, 0, KVE_MAX_DRAFT, "tokens drafted by prompt lookup"))
        return 2;
    return 0;
}

int32_t *cli_chat_tokens(const kve_model *m, const char *system, const char *user, int think, int32_t *n) {
    kve_chat_message msgs[2];
    int32_t k = 0;
    if (system) msgs[k++] = (kve_chat_message){"system", system};
    msgs[k++] = (kve_chat_message){"user", user};
    return cli_chat_ids(m, msgs, k, 0, 1, think, n);
}

bool cli_think_opt(const char *arg, int *think) {
    if (!strcmp(arg, "--think")) return *think = 1, true;
    if (!strcmp(arg, "--no-think")) return *think = 0, true;
    return false;
}

int cli_think_check(const char *cmd, const kve_model *m, int think) {
    const kve_chat_message probe = {"user", ""};
    int32_t n;
    if (think < 0 || kve_chat_tokenize(m, &probe, 1, 0, 1, 0, think, NULL, 0, &n) != KVE_ERR_TEMPLATE) return 0;
    fprintf(stderr, "kvcache %s: --%s: this model's chat template has no thinking switch (enable_thinking)\n", cmd,
            think ? "think" : "no-think");
    return 2;
}

int32_t cli_chat_prefix_tokens(const kve_model *m, const char *system, int think) {
    /* what two prompts with different user messages share: the template's
     * part before the message, system prompt included, whatever the template */
    int32_t na = 0, nb = 0, k = 0;
    int32_t *a = cli_chat_tokens(m, system, "a", think, &na), *b = cli_chat_tokens(m, system, "b", think, &nb);
    while (a && b && k < na && k < nb && a[k] == b[k]) k++;
    free(a), free(b);
    return k;
}

int32_t cli_session_restore(const char *cmd, kve_session *s, const char *path, const int32_t *prompt, int32_t n,
                            bool *refused) {
    *refused = false;
    if (access(path, F_OK) != 0) {
        fprintf(stderr, "[session %s: new file, the run starts cold]\n", path);
        return 0;
    }
    char err[512];
    int32_t got = 0;
    if (kve_session_load(s, path, prompt, n, &got, err, sizeof err) != KVE_OK) {
        fprintf(stderr, "kvcache %s: session not restored: %s; the run goes on cold\n", cmd, err);
        *refused = true;
        return 0;
    }
    fprintf(stderr, "[session %s: restored %d of the prompt's %d tokens, prefilling %d]\n", path, (int)got, (int)n,
            (int)(n - got));
    return got;
}

int cli_session_save(const char *cmd, const kve_session *s, const cli_policy_opts *o, bool refused) {
    const char *path = o->session;
    if (refused && !o->session_overwrite) {
        fprintf(stderr, "[session %s: not saved, the file it refused is kept (--session-overwrite replaces it)]\n",
                path);
        return 0;
    }
    char err[512];
    if (kve_session_save(s, path, err, sizeof err) != KVE_OK) {
        fprintf(stderr, "kvcache %s: session not saved: %s\n", cmd, err);
        return 1;
    }
    fprintf(stderr, "[session %s: saved %d tokens]\n", path, (int)kve_session_n_cached(s));
    return 0;
}

void cli_policy_report(const kve_generate_result *res) {
    if (res->n_shifts)
        fprintf(stderr, "context shift: %d shifts dropped %d positions\n", (int)res->n_shifts, (int)res->n_discarded);
    if (res->n_drafted)
        fprintf(stderr, "draft lookup: %d of %d drafted tokens accepted (%.1f%%), %d tokens in %d forward passes "
                        "(%.2f tokens/pass)\n",
                (int)res->n_accepted, (int)res->n_drafted, 100.0 * res->n_accepted / res->n_drafted,
                (int)res->n_generated, (int)res->n_passes,
                res->n_passes ? (double)res->n_generated / res->n_passes : 0.0);
}
