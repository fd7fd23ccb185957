/* cli/info.c - `kvcache info`: a GGUF file's metadata and tensors, and the
 * model shape the engine reads from it. An inspector of files the engine may
 * refuse to run, so it reads them with kvengine.h's GGUF inspector and loads
 * the model only for its cache groups. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void info_usage(void) {
    printf("usage: kvcache info [-m MODEL.gguf] [--tensors]\n"
           "The GGUF file's metadata (long arrays shortened), the model shape the engine reads\n"
           "from it and, with --tensors, every tensor's type, shape and size.\n");
}

/* A string value quoted, escaped to printable ASCII, cut after max bytes. */
static void print_str(const kve_gguf_value *v, size_t max) {
    putchar('"');
    for (size_t i = 0; i < v->len && i < max; i++) {
        unsigned char c = (unsigned char)v->str[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c >= 32 && c < 127) putchar(c);
        else if (c == '\n') fputs("\\n", stdout);
        else printf("\\x%02x", c);
    }
    fputs(v->len > max ? "\"..." : "\"", stdout);
}

static void print_value(const kve_gguf_value *v, size_t max_str) {
    switch (v->type) {
    case KVE_GGUF_STRING: print_str(v, max_str); break;
    case KVE_GGUF_F32: case KVE_GGUF_F64: printf("%g", v->f); break;
    case KVE_GGUF_BOOL: fputs(v->i ? "true" : "false", stdout); break;
    case KVE_GGUF_U64: printf("%llu", (unsigned long long)v->u); break;
    default: printf("%lld", (long long)v->i); break;
    }
}

/* Every metadata entry (arrays: their first 6 elements) and, with tensors,
 * every tensor's type, shape, size and offset. */
static void print_gguf(const kve_gguf *g, int tensors) {
    kve_gguf_info in = kve_gguf_get_info(g);
    printf("GGUF v%u: %lld metadata entries, %lld tensors, alignment %u, data at offset %llu, file %llu bytes\n",
           in.version, (long long)in.n_kv, (long long)in.n_tensors, in.alignment,
           (unsigned long long)in.data_offset, (unsigned long long)in.file_size);
    kve_gguf_kv kv;
    kve_gguf_value v;
    for (int64_t i = 0; kve_gguf_kv_at(g, i, &kv) == KVE_OK; i++) {
        printf("  %-44.*s ", (int)(kv.key_len > 200 ? 200 : kv.key_len), kv.key);
        if (kv.type == KVE_GGUF_ARRAY) {
            printf("%s[%llu] [", kve_gguf_type_name(kv.elem_type), (unsigned long long)kv.n);
            for (uint64_t e = 0; e < kv.n && e < 6 && kve_gguf_value_at(g, i, e, &v) == KVE_OK; e++) {
                if (e) fputs(", ", stdout);
                print_value(&v, 40);
            }
            fputs(kv.n > 6 ? ", ...]\n" : "]\n", stdout);
        } else if (kve_gguf_value_at(g, i, 0, &v) == KVE_OK) {
            printf(kv.type == KVE_GGUF_STRING ? "%s " : "%-6s ", kve_gguf_type_name(kv.type));
            print_value(&v, 80);
            putchar('\n');
        }
    }
    kve_gguf_tensor t;
    for (int64_t i = 0; tensors && kve_gguf_tensor_at(g, i, &t) == KVE_OK; i++) {
        char shape[96];
        int o = 0;
        for (int d = 0; d < t.n_dims; d++)
            o += snprintf(shape + o, sizeof shape - (size_t)o, "%s%lld", d ? ", " : "", (long long)t.dims[d]);
        printf("  %-44s %-5s [%s] %llu bytes at %llu\n", t.name, t.type_name, shape, (unsigned long long)t.n_bytes,
               (unsigned long long)t.offset);
    }
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
    kve_gguf *g;
    char err[512];
    if (kve_gguf_open(mo.model, &g, err, sizeof err) != KVE_OK) {
        fprintf(stderr, "kvcache info: %s\n  (the default model comes with `make model`)\n", err);
        return 1;
    }
    print_gguf(g, tensors);
    kve_hparams hp;
    const int hp_rc = kve_gguf_hparams(g, &hp, err, sizeof err);
    if (hp_rc != KVE_OK) {
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
    kve_gguf_close(g);
    /* the layer groups come from the architecture: only a loadable model has
     * them; a file whose header reads but whose tensors do not says why */
    kve_model *m;
    if (kve_model_load(mo.model, &m, err, sizeof err) != KVE_OK) {
        if (hp_rc == KVE_OK) printf("engine: cannot load this model: %s\n", err);
    } else {
        printf("        layer groups (one cache each):");
        for (int32_t i = 0, n, w; kve_model_group(m, i, &n, &w) == KVE_OK; i++) {
            if (w) printf("%s %d sliding-window layers (window %d)", i ? ";" : "", (int)n, (int)w);
            else printf("%s %d full-attention layers", i ? ";" : "", (int)n);
        }
        printf("\n");
        kve_model_free(m);
    }
    return 0;
}
