/* cli/price.c - `kvcache price`: what the KV cache of a model costs in bytes
 * and what that means for decode speed (2 x layers x KV heads x head dim x
 * bytes a token).
 *
 *   KV per token  = 2 (K and V) x layers x KV heads x head_dim x bytes/element
 *   decode floor  = (weight bytes + KV bytes of the sequence) / bandwidth
 * A decode step at batch 1 streams every weight and the sequence's whole
 * cache once, so no step can be faster than that: the bandwidth-bound floor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

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
           "                     [--bandwidth GB/s] [--weight-bits B] [-b N]\n"
           "KV bytes per token and per sequence, weight bytes, and the bandwidth-bound decode floor\n"
           "(weights + one sequence's KV, read once per step at batch 1). A model with sliding-window\n"
           "layers (Gemma 3) is priced per layer group: its window layers hold a bounded number of\n"
           "positions, shown against the same model without windows.\n\n"
           "  -m, --model PATH   read the shape from a GGUF file (weights: the file's tensor bytes)\n"
           "  --preset NAME      a published model:");
    for (int i = 0; i < N_PRESETS; i++) printf("%s%s", i % 4 ? " " : "\n                       ", presets[i].name);
    printf("\n  --ctx N            context per sequence (default 8192)\n"
           "  -b, --batch N      prefill chunk: what a window cache holds beyond its window (default 256)\n"
           "  --kv-type T        K/V storage: f32, f16, bf16 (default: GPUs serve models in bf16), q8\n"
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

/* A model's KV shape: its layer groups (a sliding window W > 0, or 0: full
 * attention) over one head layout. */
enum { PRICE_MAX_GROUPS = 4 };
typedef struct {
    int32_t n_groups;
    int32_t layers[PRICE_MAX_GROUPS], window[PRICE_MAX_GROUPS];
    int32_t kv_heads, head_dim;
} price_shape;

/* Positions of a sequence of n tokens that group g holds, and that a decode
 * step at position n reads: all n in a full group; a window group holds at
 * most W positions plus the chunk being appended and reads the last W. */
static uint64_t held(const price_shape *sh, int g, uint64_t n, uint64_t chunk) {
    uint64_t cap = (uint64_t)sh->window[g] + chunk;
    return sh->window[g] == 0 || n < cap ? n : cap;
}

static uint64_t read_per_step(const price_shape *sh, int g, uint64_t n) {
    return sh->window[g] == 0 || n < (uint64_t)sh->window[g] ? n : (uint64_t)sh->window[g];
}

static void print_price(const char *name, const price_shape *sh, kv_dtype dt, uint64_t ctx, uint64_t chunk,
                        uint64_t wbytes, double bw) {
    char b1[32], b2[32], b3[32];
    int32_t layers = 0, windowed = 0;
    for (int g = 0; g < sh->n_groups; g++) layers += sh->layers[g], windowed |= sh->window[g] > 0;
    const int32_t kvh = sh->kv_heads, hd = sh->head_dim;
    uint64_t per_tok = kv_price_per_token(layers, kvh, hd, dt);
    printf("%s: %d layers x %d KV heads x head_dim %d, K/V %s\n", name, (int)layers, (int)kvh, (int)hd,
           kv_dtype_name(dt));
    printf("  KV per token        %s B (%.1f KiB) = 2 x %d x %d x %d x %zu B%s%s\n", commas(per_tok, b1),
           (double)per_tok / 1024, (int)layers, (int)kvh, (int)hd, kv_dtype_size(dt), dt == KV_Q8 ? " + scales" : "",
           windowed ? ", every layer (what caches without windows keep)" : "");
    uint64_t seq = 0, seq_full = kv_price_tokens(layers, kvh, hd, dt, ctx);
    for (int g = 0; windowed && g < sh->n_groups; g++) {
        uint64_t pt = kv_price_per_token(sh->layers[g], kvh, hd, dt), h = held(sh, g, ctx, chunk);
        seq += pt * h;
        if (sh->window[g] == 0)
            printf("    %2d full layers   %s B per token, every position kept: %s B at %s tokens\n", (int)sh->layers[g],
                   commas(pt, b1), commas(pt * ctx, b2), commas(ctx, b3));
        else
            printf("    %2d window layers %s B per position, window %d: at most %s B (%s positions: the window\n"
                   "                     and one %d-token chunk), however long the sequence\n",
                   (int)sh->layers[g], commas(pt, b1), (int)sh->window[g],
                   commas(pt * ((uint64_t)sh->window[g] + chunk), b2), commas((uint64_t)sh->window[g] + chunk, b3),
                   (int)chunk);
    }
    if (!windowed) seq = seq_full;
    printf("  KV per sequence     %s B (%.2f GiB) at %s tokens", commas(seq, b1), (double)seq / (1024.0 * 1024 * 1024),
           commas(ctx, b2));
    if (windowed) printf("; %s B without windows (%.1fx)", commas(seq_full, b1), (double)seq_full / (double)seq);
    printf("\n  weights             %s B (%.2f GB)\n", commas(wbytes, b1), (double)wbytes / 1e9);
    printf("  decode floor at %.0f GB/s, batch 1: (weights + KV %s) / bandwidth\n", bw,
           windowed ? "a step reads: a window layer only its window's positions" : "of the context");
    /* a few usual contexts and --ctx, ascending */
    int64_t ctxs[6] = {1024, 4096, 8192, 32768, 131072, (int64_t)ctx};
    for (int i = 5; i > 0 && ctxs[i] < ctxs[i - 1]; i--) {
        int64_t t = ctxs[i];
        ctxs[i] = ctxs[i - 1], ctxs[i - 1] = t;
    }
    for (int i = 0; i < 6; i++) {
        if (i > 0 && ctxs[i] == ctxs[i - 1]) continue;
        uint64_t n = (uint64_t)ctxs[i], kv = 0, kv_full = kv_price_tokens(layers, kvh, hd, dt, n);
        for (int g = 0; g < sh->n_groups; g++)
            kv += kv_price_tokens(sh->layers[g], kvh, hd, dt, read_per_step(sh, g, n));
        double ms = ((double)wbytes + (double)kv) / (bw * 1e9) * 1e3;
        double ms_full = ((double)wbytes + (double)kv_full) / (bw * 1e9) * 1e3;
        printf("    %9s tokens  %8.2f GB KV  %8.2f ms/token  (%.0f tokens/s)", commas(n, b1), (double)kv / 1e9, ms, 1e3 / ms);
        if (windowed) printf("  without windows %.3f GB, %.3f ms", (double)kv_full / 1e9, ms_full);
        printf("%s\n", n == ctx ? "  <- --ctx" : "");
    }
}

int cmd_price(int argc, char **argv) {
    const char *path = NULL, *preset = NULL, *kv_type = "bf16";
    int64_t ctx = 8192, chunk = 256;
    double bw = 3350, wbits = 16;
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) { usage(); return 0; }
        if (cli_opt_str(argc, argv, &i, "-m", "--model", &path)) continue;
        if (cli_opt_str(argc, argv, &i, NULL, "--preset", &preset)) continue;
        if (cli_opt_int(argc, argv, &i, "-c", "--ctx", &ctx)) continue;
        if (cli_opt_int(argc, argv, &i, "-b", "--batch", &chunk)) continue;
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
    if (kv_dtype_parse(kv_type, &dt) != KV_OK) {
        fprintf(stderr, "kvcache price: --kv-type '%s' is not a K/V type: f64, f32, f16, bf16 or q8\n", kv_type);
        return 2;
    }
    if (!cli_range("price", "--ctx", ctx, 1, 1ll << 32, "positions of one sequence") ||
        !cli_range("price", "--batch", chunk, 1, 8192, "prompt rows per forward pass"))
        return 2;
    if (!(bw > 0) || !(wbits > 0)) {
        fprintf(stderr, "kvcache price: %s %g is out of range: it takes a number above 0 (%s)\n",
                bw > 0 ? "--weight-bits" : "--bandwidth", bw > 0 ? wbits : bw,
                bw > 0 ? "bits per weight" : "memory bandwidth in GB/s");
        return 2;
    }
    char name[160];
    price_shape sh = {.n_groups = 1};
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
        sh.layers[0] = presets[k].layers, sh.kv_heads = presets[k].kv_heads, sh.head_dim = presets[k].head_dim;
        wbytes = (uint64_t)(presets[k].params * wbits / 8 + 0.5);
    } else {
        /* the whole model, for its layer groups (windows are an architecture's, not the header's) */
        kve_model *m;
        char err[512];
        if (kve_model_load(path, &m, err, sizeof err) != KVE_OK) {
            fprintf(stderr, "kvcache price: %s: %s\n  (the default model comes with `make model`)\n", path, err);
            return 1;
        }
        const kve_model_shape ms = kve_model_get_shape(m);
        sh.kv_heads = ms.n_kv_heads, sh.head_dim = ms.head_dim;
        sh.n_groups = ms.n_groups < PRICE_MAX_GROUPS ? ms.n_groups : PRICE_MAX_GROUPS;
        for (int32_t g = 0; g < sh.n_groups; g++) kve_model_group(m, g, &sh.layers[g], &sh.window[g]);
        wbytes = ms.weight_bytes;
        const char *slash = strrchr(path, '/');
        snprintf(name, sizeof name, "%s", slash ? slash + 1 : path);
        kve_model_free(m);
    }
    print_price(name, &sh, dt, (uint64_t)ctx, (uint64_t)chunk, wbytes, bw);
    return 0;
}
