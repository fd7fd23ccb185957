/* cli/demo.c - `kvcache demo`: a synthetic multi-layer model decoding on the
 * cache. No vocabulary: each "token" is the model's own last output fed back.
 * Shows what the cache buys and costs: tokens/s, KV bytes per token, bytes in
 * use. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvcache.h"

static void usage(void) {
    printf("usage: kvcache demo [-l LAYERS] [-p PROMPT] [-n TOKENS] [--kv-type f32|f16|bf16|q8]\n"
           "A synthetic model (width 512, 8 query heads over 2 KV heads of 64) prefills PROMPT\n"
           "tokens, then decodes TOKENS one at a time over the paged cache.\n");
}

int cmd_demo(int argc, char **argv) {
    int64_t n_layers = 4, prompt = 256, gen = 256;
    const char *kv_type = "f16";
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) { usage(); return 0; }
        if (cli_opt_int(argc, argv, &i, "-l", "--layers", &n_layers)) continue;
        if (cli_opt_int(argc, argv, &i, "-p", "--prompt", &prompt)) continue;
        if (cli_opt_int(argc, argv, &i, "-n", "--tokens", &gen)) continue;
        if (cli_opt_str(argc, argv, &i, NULL, "--kv-type", &kv_type)) continue;
        fprintf(stderr, "kvcache demo: unknown option '%s'\n", argv[i]);
        return 2;
    }
    enum { H = 8, HKV = 2, HD = 64, D = H * HD };
    kv_cache_params p = kv_cache_default_params();
    if (kv_dtype_parse(kv_type, &p.dtype) || p.dtype == KV_F64) {
        fprintf(stderr, "kvcache demo: --kv-type must be f32, f16, bf16 or q8\n");
        return 2;
    }
    if (!cli_range("demo", "-l", n_layers, 1, 64, "layers of the synthetic model") ||
        !cli_range("demo", "-p", prompt, 1, 1 << 20, "prompt tokens") ||
        !cli_range("demo", "-n", gen, 0, (1 << 20) - prompt, "decoded tokens; -p + -n at most 2^20"))
        return 2;
    p.n_layers = (int32_t)n_layers, p.n_kv_heads = HKV, p.head_dim = HD;
    p.n_pages = (int32_t)((prompt + gen + p.page_size - 1) / p.page_size);
    kv_cache *cache;
    int rc = kv_cache_create(&p, &cache);
    if (rc) {
        fprintf(stderr, "kvcache demo: %s\n", kv_status_str(rc));
        return 1;
    }
    kv_rope rope;
    kv_rope_params rp = kv_rope_default_params(HD);
    kv_rope_init(&rope, &rp);

    /* weights: one set per layer, scaled so activations stay of order one */
    size_t wsize = (size_t)D * (H + 2 * HKV) * HD;
    float *w = malloc(sizeof(float) * wsize * (size_t)n_layers);
    srand(1);
    for (size_t i = 0; i < wsize * (size_t)n_layers; i++) w[i] = ((float)rand() / (float)RAND_MAX - 0.5f) * 0.1f;
    kv_layer *layers = malloc(sizeof(kv_layer) * (size_t)n_layers);
    for (int l = 0; l < n_layers; l++) {
        float *base = w + wsize * (size_t)l;
        layers[l] = (kv_layer){.layer = l, .dim = D, .n_heads = H, .wq = base,
                               .wk = base + (size_t)D * H * HD, .wv = base + (size_t)D * (H + HKV) * HD,
                               .rope = &rope};
    }
    float *x = malloc(sizeof(float) * (size_t)prompt * D), *out = malloc(sizeof(float) * (size_t)prompt * D);
    float *scratch = malloc(sizeof(float) * kv_step_scratch(cache, &layers[0], (int32_t)prompt));
    for (int64_t i = 0; i < prompt * D; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;

    int32_t seq, rows[2] = {0, 0};
    kv_seq_new(cache, &seq);
    kv_batch batch = {.n_seqs = 1, .seqs = &seq, .row_start = rows};
    double t_prefill = 0, t_decode = 0;
    for (int64_t step = 0; step <= gen && !rc; step++) {
        int32_t t = step == 0 ? (int32_t)prompt : 1;
        double t0 = cli_now();
        rows[1] = t;
        rc = kv_seq_reserve(cache, seq, t, NULL);
        for (int l = 0; l < n_layers && !rc; l++) {
            rc = kv_step_f32(cache, &layers[l], &batch, x, out, scratch);
            for (int64_t i = 0; i < (int64_t)t * D; i++) x[i] = tanhf(x[i] + out[i]); /* residual */
        }
        if (t > 1) memmove(x, x + (size_t)(t - 1) * D, sizeof(float) * D); /* feed the last one back */
        *(step == 0 ? &t_prefill : &t_decode) += cli_now() - t0;
    }
    if (rc) {
        fprintf(stderr, "kvcache demo: %s\n", kv_status_str(rc));
    } else {
        kv_cache_stats st = kv_cache_get_stats(cache);
        printf("kvcache demo: %d layers, %d query heads over %d KV heads of %d, %s K/V\n", (int)n_layers,
               H, HKV, HD, kv_dtype_name(p.dtype));
        printf("  prefill  %6lld tokens  %9.1f tokens/s\n", (long long)prompt, prompt / t_prefill);
        printf("  decode   %6lld tokens  %9.1f tokens/s\n", (long long)gen, gen / (t_decode > 0 ? t_decode : 1));
        printf("  KV bytes per token   %llu (2 x %d layers x %d heads x %d x %zu B%s)\n",
               (unsigned long long)st.bytes_per_token, (int)n_layers, HKV, HD, kv_dtype_size(p.dtype),
               p.dtype == KV_Q8 ? " + scales" : "");
        printf("  cache in use         %llu bytes in %d pages of %d tokens (%d tokens cached)\n",
               (unsigned long long)st.bytes_in_use, st.pages_used, p.page_size, kv_seq_length(cache, seq));
    }
    free(w), free(layers), free(x), free(out), free(scratch);
    kv_cache_free(cache);
    return rc ? 1 : 0;
}
