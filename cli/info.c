/* cli/info.c - `kvcache info`: a GGUF file's metadata and tensors, and the
 * model shape the engine reads from it. An inspector of files the engine may
 * refuse, so it reads the GGUF layer directly (cli/internal.h). */
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "../engine/model/model.h"

static void info_usage(void) {
    printf("usage: kvcache info [-m MODEL.gguf] [--tensors]\n"
           "The GGUF file's metadata (long arrays shortened), the model shape the engine reads\n"
           "from it and, with --tensors, every tensor's type, shape and size.\n");
}

int cmd_info(int argc, char **argv) {
    cli_model_opts mo = cli_model_opts_default();
    int tensors = 0;
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) { info_usage(); return 0; }
        if (cli_opt_str(argc, argv, &i, "-m", "--model", &mo.model)) continue;
        if (!strcmp(argv[i], "--tensors")) { tensors = 1; continue; }
        fprintf(stderr, "kvcache info: unknown option '%s' (see --help)\n", argv[i]);
        return 2;
    }
    llm_gguf *g;
    char err[512];
    if (llm_gguf_open(mo.model, &g, err, sizeof err) != 0) {
        fprintf(stderr, "kvcache info: %s\n  (the default model comes with `make model`)\n", err);
        return 1;
    }
    llm_gguf_print(g, stdout, tensors);
    llm_hparams hp;
    const int hp_rc = llm_hparams_read(g, &hp, err, sizeof err);
    if (hp_rc != 0) {
        printf("engine: cannot run this model: %s\n", err);
    } else {
        printf("engine: %d layers, width %d, %d heads over %d KV heads of %d, FFN %d, vocabulary %d,\n"
               "        RoPE theta %g on %d dims (%s), RMSNorm eps %g, trained context %d;\n"
               "        KV per token %llu B in f16\n",
               (int)hp.n_layers, (int)hp.dim, (int)hp.n_heads, (int)hp.n_kv_heads, (int)hp.head_dim, (int)hp.ffn_dim,
               (int)hp.n_vocab, hp.rope.theta, (int)hp.rope.rot_dim,
               hp.rope.layout == KV_ROPE_INTERLEAVED ? "adjacent pairs" : "split halves", (double)hp.norm_eps,
               (int)hp.ctx_train, (unsigned long long)kv_price_per_token(hp.n_layers, hp.n_kv_heads, hp.head_dim, KV_F16));
    }
    llm_gguf_close(g);
    /* the layer groups come from the architecture: only a loadable model has
     * them; a file whose header reads but whose tensors do not says why */
    llm_model *m;
    if (llm_model_load(mo.model, &m, err, sizeof err) != LLM_OK) {
        if (hp_rc == 0) printf("engine: cannot load this model: %s\n", err);
    } else {
        printf("        layer groups (one cache each):");
        for (int32_t i = 0, n, w; llm_model_group(m, i, &n, &w) == LLM_OK; i++) {
            if (w) printf("%s %d sliding-window layers (window %d)", i ? ";" : "", (int)n, (int)w);
            else printf("%s %d full-attention layers", i ? ";" : "", (int)n);
        }
        printf("\n");
        llm_model_free(m);
    }
    return 0;
}
