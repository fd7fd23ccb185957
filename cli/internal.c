/* cli/internal.c - loading a model and tokenizing through the engine's
 * internal headers, for the diagnostic subcommands (cli/internal.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int cli_load(const char *cmd, const cli_model_opts *o, int32_t n_seqs, int64_t ctx_default, llm_model **m,
             llm_context **c) {
    *m = NULL, *c = NULL;
    llm_context_params p = llm_context_default_params();
    int64_t ctx = o->ctx ? o->ctx : ctx_default;
    int rc = cli_model_check(cmd, o, ctx, &p.kv_type);
    if (rc) return rc;
    char err[512];
    if (llm_model_load(o->model, m, err, sizeof err) != 0) {
        fprintf(stderr, "kvcache %s: cannot load model '%s': %s\n", cmd, o->model, err);
        return 1;
    }
    cli_ctx_warning(cmd, o, ctx, llm_model_hparams(*m)->ctx_train);
    p.act_bits = (int32_t)o->act_bits;
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

int32_t *cli_tokenize(const llm_model *m, const char *text, int add_special, int parse_special, int32_t *n_out) {
    const size_t len = strlen(text);
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
