/* cli/price.c - `kvcache price`: what the KV cache of a model costs in bytes
 * and what that means for decode speed, as the seed computes it; and
 * `kvcache info`: a GGUF file's metadata and tensors.
 *
 *   KV per token  = 2 (K and V) x layers x KV heads x head_dim x bytes/element
 *   decode floor  = (weight bytes + KV bytes of the sequence) / bandwidth
 * A decode step at batch 1 streams every weight and the sequence's whole
 * cache once, so no step can be faster than that: the bandwidth-bound floor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "../engine/model.h"

/* Published shapes; params count every weight (bf16 weights: 2 B each). */
static const struct {
    const char *name;
    int32_t layers, kv_heads, head_dim;
    double params;
} presets[] = {
    {"llama-3.1-8b", 32, 8, 128, 8.030261248e9},
    {"llama-3.1-70b", 80, 8, 128, 70.553706496e9},
    {"llama-3.2-1b", 16, 8, 64, 1.2358144e9},
    {"llama-3.2-3b", 28, 8, 128, 3.212749824e9},
    {"llama-2-7b", 32, 32, 128, 6.738415616e9},
    {"mistral-7b", 32, 8, 128, 7.241732096e9},
    {"qwen2.5-7b", 28, 4, 128, 7.615616512e9},
    {"tinyllama-1.1b", 22, 4, 64, 1.100048384e9},
    {"smollm2-135m", 30, 3, 64, 134.515008e6},
    {"smollm2-360m", 32, 5, 64, 361.82112e6},
    {"smollm2-1.7b", 24, 32, 64, 1.711376384e9},
};
enum { N_PRESETS = sizeof presets / sizeof presets[0] };

static void usage(void) {
    printf("usage: kvcache price (-m MODEL.gguf | --preset NAME) [--ctx N] [--kv-type T]\n"
           "                     [--bandwidth GB/s] [--weight-bits B]\n"
           "KV bytes per token and per sequence, weight bytes, and the bandwidth-bound decode floor\n"
           "(weights + one sequence's KV, read once per step at batch 1).\n\n"
           "  -m, --model PATH   read the shape from a GGUF file (weights: the file's tensor bytes)\n"
           "  --preset NAME      a published model:");
    for (int i = 0; i < N_PRESETS; i++) printf("%s%s", i % 4 ? " " : "\n                       ", presets[i].name);
    printf("\n  --ctx N            context per sequence (default 8192)\n"
           "  --kv-type T        K/V storage: f32, f16, bf16 (default), q8\n"
           "  --bandwidth GB/s   memory bandwidth (default 3350: H100 SXM HBM3)\n"
           "  --weight-bits B    bits per weight of a preset (default 16: bf16)\n");
}

/* 1234567 -> "1,234,567" */
static const char *commas(uint64_t v, char *buf) {
    char t[32];
    int n = snprintf(t, sizeof t, "%llu", (unsigned long long)v), k = 0;
    for (int i = 0; i < n; i++) {
        if (i && (n - i) % 3 == 0) buf[k++] = ',';
        buf[k++] = t[i];
    }
    buf[k] = 0;
    return buf;
}

int cmd_price(int argc, char **argv) {
    const char *path = NULL, *preset = NULL, *kv_type = "bf16";
    int64_t ctx = 8192;
    double bw = 3350, wbits = 16;
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) { usage(); return 0; }
        if (cli_opt_str(argc, argv, &i, "-m", "--model", &path)) continue;
        if (cli_opt_str(argc, argv, &i, NULL, "--preset", &preset)) continue;
        if (cli_opt_int(argc, argv, &i, "-c", "--ctx", &ctx)) continue;
        if (cli_opt_str(argc, argv, &i, NULL, "--kv-type", &kv_type)) continue;
        if (cli_opt_f64(argc, argv, &i, NULL, "--bandwidth", &bw)) continue;
        if (cli_opt_f64(argc, argv, &i, NULL, "--weight-bits", &wbits)) continue;
        fprintf(stderr, "kvcache price: unknown option '%s' (see --help)\n", argv[i]);
        return 2;
    }
    kv_dtype dt;
    if (!path == !preset) {
        fprintf(stderr, "kvcache price: give exactly one of -m MODEL.gguf or --preset NAME (see --help)\n");
        return 2;
    }
    if (kv_dtype_parse(kv_type, &dt) != KV_OK || ctx < 1 || ctx > (1ll << 32) || !(bw > 0) || !(wbits > 0)) {
        fprintf(stderr, "kvcache price: need a --kv-type of f64/f32/f16/bf16/q8, --ctx >= 1, --bandwidth > 0\n");
        return 2;
    }
    char name[160];
    int32_t layers, kvh, hd;
    uint64_t wbytes;
    if (preset) {
        int k = -1;
        for (int i = 0; i < N_PRESETS; i++)
            if (!strcmp(preset, presets[i].name)) k = i;
        if (k < 0) {
            fprintf(stderr, "kvcache price: unknown preset '%s'; known:", preset);
            for (int i = 0; i < N_PRESETS; i++) fprintf(stderr, " %s", presets[i].name);
            fprintf(stderr, "\n");
            return 2;
        }
        snprintf(name, sizeof name, "%s", presets[k].name);
        layers = presets[k].layers, kvh = presets[k].kv_heads, hd = presets[k].head_dim;
        wbytes = (uint64_t)(presets[k].params * wbits / 8 + 0.5);
    } else {
        llm_gguf *g;
        llm_hparams hp;
        char err[512];
        if (llm_gguf_open(path, &g, err, sizeof err) != 0) {
            fprintf(stderr, "kvcache price: %s\n  (the default model comes with `make model`)\n", err);
            return 1;
        }
        if (llm_hparams_read(g, &hp, err, sizeof err) != 0) {
            fprintf(stderr, "kvcache price: %s: %s\n", path, err);
            llm_gguf_close(g);
            return 1;
        }
        wbytes = 0;
        for (int64_t i = 0; i < llm_gguf_n_tensors(g); i++) wbytes += llm_gguf_tensor_at(g, i)->n_bytes;
        const char *slash = strrchr(path, '/');
        snprintf(name, sizeof name, "%s", slash ? slash + 1 : path);
        layers = hp.n_layers, kvh = hp.n_kv_heads, hd = hp.head_dim;
        llm_gguf_close(g);
    }
    char b1[32], b2[32];
    uint64_t per_tok = kv_price_per_token(layers, kvh, hd, dt), per_seq = kv_price_tokens(layers, kvh, hd, dt, (uint64_t)ctx);
    printf("%s: %d layers x %d KV heads x head_dim %d, K/V %s\n", name, (int)layers, (int)kvh, (int)hd,
           kv_dtype_name(dt));
    printf("  KV per token        %s B (%.1f KiB) = 2 x %d x %d x %d x %zu B%s\n", commas(per_tok, b1),
           (double)per_tok / 1024, (int)layers, (int)kvh, (int)hd, kv_dtype_size(dt), dt == KV_Q8 ? " + scales" : "");
    printf("  KV per sequence     %s B (%.2f GiB) at %s tokens\n", commas(per_seq, b1),
           (double)per_seq / (1024.0 * 1024 * 1024), commas((uint64_t)ctx, b2));
    printf("  weights             %s B (%.2f GB)\n", commas(wbytes, b1), (double)wbytes / 1e9);
    printf("  decode floor at %.0f GB/s, batch 1: (weights + KV of the context) / bandwidth\n", bw);
    /* a few usual contexts and --ctx, ascending */
    int64_t ctxs[6] = {1024, 4096, 8192, 32768, 131072, ctx};
    for (int i = 5; i > 0 && ctxs[i] < ctxs[i - 1]; i--) {
        int64_t t = ctxs[i];
        ctxs[i] = ctxs[i - 1], ctxs[i - 1] = t;
    }
    for (int i = 0; i < 6; i++) {
        if (i > 0 && ctxs[i] == ctxs[i - 1]) continue;
        uint64_t kv = kv_price_tokens(layers, kvh, hd, dt, (uint64_t)ctxs[i]);
        double ms = ((double)wbytes + (double)kv) / (bw * 1e9) * 1e3;
        printf("    %9s tokens  %8.2f GB KV  %8.2f ms/token  (%.0f tokens/s)%s\n", commas((uint64_t)ctxs[i], b1),
               (double)kv / 1e9, ms, 1e3 / ms, ctxs[i] == ctx ? "  <- --ctx" : "");
    }
    return 0;
}

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
    if (llm_hparams_read(g, &hp, err, sizeof err) != 0) {
        printf("engine: cannot run this model: %s\n", err);
    } else {
        printf("engine: %d layers, width %d, %d heads over %d KV heads of %d, FFN %d, vocabulary %d,\n"
               "        RoPE theta %g on %d dims (adjacent pairs), RMSNorm eps %g, trained context %d;\n"
               "        KV per token %llu B in f16\n",
               (int)hp.n_layers, (int)hp.dim, (int)hp.n_heads, (int)hp.n_kv_heads, (int)hp.head_dim, (int)hp.ffn_dim,
               (int)hp.n_vocab, hp.rope.theta, (int)hp.rope.rot_dim, (double)hp.norm_eps, (int)hp.ctx_train,
               (unsigned long long)kv_price_per_token(hp.n_layers, hp.n_kv_heads, hp.head_dim, KV_F16));
    }
    llm_gguf_close(g);
    return 0;
}
