/* tests/test_model_fixture.c - tiny Llama and Gemma 3 GGUF files and the
 * float64 reference forwards (see test_model_fixture.h). */
#include "test_model_fixture.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf_writer.h"
#include "test.h"
#include "../engine/model/model.h"

/* ---------------------------------------------------------------- decoding */

static double half(const uint8_t *p) { return kv_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* 6-bit scale (sc) and min (mn) of sub-block j in a Q4_K/Q5_K scales[12]:
 * j < 4 in the low 6 bits of bytes j and j+4; j >= 4 split between a nibble
 * of byte j+4 and the top two bits of bytes j-4 (scale) and j (min). */
static void k_scale(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63, *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
        *mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* n elements of format `type` at p into out (double), block by block. */
static void decode(int type, const uint8_t *p, int64_t n, double *out) {
    for (int64_t i = 0; i < n;) {
        switch (type) {
        case GW_F32: { float f; memcpy(&f, p, 4); out[i++] = f; p += 4; break; }
        case GW_F16: out[i++] = half(p); p += 2; break;
        case GW_BF16: {
            uint32_t u = (uint32_t)(p[0] | p[1] << 8) << 16;
            float f;
            memcpy(&f, &u, 4);
            out[i++] = f, p += 2;
            break;
        }
        case GW_Q4_0: case GW_Q4_1: { /* byte j: element j low nibble, j+16 high */
            double d = half(p), mn = type == GW_Q4_1 ? half(p + 2) : 0;
            const uint8_t *q = p + (type == GW_Q4_1 ? 4 : 2);
            for (int j = 0; j < 16; j++) {
                int lo = q[j] & 15, hi = q[j] >> 4;
                out[i + j] = type == GW_Q4_0 ? d * (lo - 8) : d * lo + mn;
                out[i + j + 16] = type == GW_Q4_0 ? d * (hi - 8) : d * hi + mn;
            }
            i += 32, p += type == GW_Q4_1 ? 20 : 18;
            break;
        }
        case GW_Q5_0: case GW_Q5_1: { /* as Q4_0 / Q4_1, fifth bit j of the u32 after d (and m) */
            const int o = type == GW_Q5_1 ? 4 : 2;
            double d = half(p), mn = type == GW_Q5_1 ? half(p + 2) : -16 * d;
            uint32_t qh = (uint32_t)p[o] | (uint32_t)p[o + 1] << 8 | (uint32_t)p[o + 2] << 16 | (uint32_t)p[o + 3] << 24;
            for (int j = 0; j < 32; j++) {
                int q = (j < 16 ? p[o + 4 + j] & 15 : p[o + 4 + j - 16] >> 4) | (int)((qh >> j) & 1) << 4;
                out[i + j] = d * q + mn;
            }
            i += 32, p += o + 20;
            break;
        }
        case GW_Q8_0: {
            double d = half(p);
            for (int j = 0; j < 32; j++) out[i + j] = d * (int8_t)p[2 + j];
            i += 32, p += 34;
            break;
        }
        case GW_Q4_K: case GW_Q5_K: { /* 4 groups of 64: 32 low nibbles, then 32 high */
            int five = type == GW_Q5_K;
            double d = half(p), dmin = half(p + 2);
            const uint8_t *sc = p + 4, *qh = p + 16, *qs = p + (five ? 48 : 16);
            for (int g = 0; g < 4; g++)
                for (int hi = 0; hi < 2; hi++) {
                    int sub = 2 * g + hi, s, m;
                    k_scale(sc, sub, &s, &m);
                    for (int l = 0; l < 32; l++) {
                        int q = hi ? qs[32 * g + l] >> 4 : qs[32 * g + l] & 15;
                        if (five) q |= ((qh[l] >> sub) & 1) << 4;
                        out[i + 64 * g + 32 * hi + l] = d * s * q - dmin * m;
                    }
                }
            i += 256, p += five ? 176 : 144;
            break;
        }
        case GW_Q2_K: { /* sub-block s of 16: d (sc & 15) q - dmin (sc >> 4), q 2 bits of byte 32h + l */
            double d = half(p + 80), dmin = half(p + 82);
            for (int e = 0; e < 256; e++) {
                int q = (p[16 + 32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3, sc = p[e / 16];
                out[i + e] = d * (sc & 15) * q - dmin * (sc >> 4);
            }
            i += 256, p += 84;
            break;
        }
        case GW_Q3_K: { /* sub-block s of 16: d (sc - 32) q, sc 6 bits split over two bytes; q in -4..3 */
            const uint8_t *sc = p + 96;
            double d = half(p + 108);
            for (int e = 0; e < 256; e++) {
                int s = e / 16, h = e / 128, j = e % 128 / 32, l = e % 32;
                int six = (s < 8 ? sc[s] & 15 : sc[s - 8] >> 4) | ((sc[8 + s % 4] >> (2 * (s / 4))) & 3) << 4;
                int q = ((p[32 + 32 * h + l] >> (2 * j)) & 3) - ((p[l] >> (4 * h + j)) & 1 ? 0 : 4);
                out[i + e] = d * (six - 32) * q;
            }
            i += 256, p += 110;
            break;
        }
        case GW_Q6_K: { /* two halves of 128: quarters from ql nibbles and qh bit pairs */
            const uint8_t *ql = p, *qh = p + 128;
            const int8_t *scales = (const int8_t *)(p + 192);
            double d = half(p + 208);
            for (int h = 0; h < 2; h++)
                for (int s = 0; s < 4; s++)
                    for (int l = 0; l < 32; l++) {
                        int byte = ql[64 * h + l + 32 * (s & 1)];
                        int q = (s >= 2 ? byte >> 4 : byte & 15) | ((qh[32 * h + l] >> (2 * s)) & 3) << 4;
                        int e = 128 * h + 32 * s + l;
                        out[i + e] = d * scales[e / 16] * (q - 32);
                    }
            i += 256, p += 210;
            break;
        }
        default: test_fail(__FILE__, __LINE__, "fixture: no decoder for type %d", type); return;
        }
    }
}

/* ---------------------------------------------------------------- building */

/* GPT-2's byte-to-unicode map: printable bytes stand for themselves, the
 * others for code points 256, 257, ... in byte order. UTF-8 into buf. */
static void byte_token(int b, char *buf) {
    int cp = b, k = 0;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
        cp = 256;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) cp++;
    }
    if (cp < 0x80) {
        buf[k++] = (char)cp;
    } else {
        buf[k++] = (char)(0xC0 | cp >> 6);
        buf[k++] = (char)(0x80 | (cp & 63));
    }
    buf[k] = 0;
}

typedef struct {
    gw *w;
    const fx_spec *s;
    uint64_t rng;
} builder;

static double normal(builder *b) {
    test_rng r = {b->rng};
    double x = test_rng_normal(&r);
    b->rng = r.s;
    return x;
}

/* A rows x cols matrix of N(0, scale^2) values, quantized to the spec's type
 * and written; returns the decoded [rows][cols] (NULL when skipped). */
static double *add_matrix(builder *b, const char *name, int64_t rows, int64_t cols, double scale) {
    int type = b->s->type;
    float *v = malloc(sizeof(float) * (size_t)(rows + 1) * (size_t)cols);
    for (int64_t i = 0; i < (rows + 1) * cols; i++) v[i] = (float)(normal(b) * scale);
    int64_t wrows = b->s->bad_tensor && !strcmp(b->s->bad_tensor, name) ? rows + 1 : rows;
    int64_t dims[2] = {cols, wrows};
    size_t nbytes = gw_tensor_bytes(type, 2, dims);
    uint8_t *q = malloc(nbytes ? nbytes : 1);
    double *dec = malloc(sizeof(double) * (size_t)(wrows * cols));
    if (gw_quantize(type, v, q, wrows * cols) != 0) test_fail(__FILE__, __LINE__, "fixture: quantize %s", name);
    decode(type, q, wrows * cols, dec);
    if (!b->s->skip_tensor || strcmp(b->s->skip_tensor, name)) gw_add_tensor(b->w, name, type, 2, dims, q, nbytes);
    free(v), free(q);
    return dec;
}

/* A copy of rows [r0, r0 + n) of the [..][cols] matrix w. */
static double *rows_of(const double *w, int64_t r0, int64_t n, int64_t cols) {
    double *r = malloc(sizeof(double) * (size_t)(n * cols));
    memcpy(r, w + r0 * cols, sizeof(double) * (size_t)(n * cols));
    return r;
}

/* A vector of mean + sd N(0, 1) values, written as F32 (as real files do
 * for norms and biases); returns them decoded. */
static double *add_vector(builder *b, const char *name, int64_t n, double mean, double sd) {
    float *v = malloc(sizeof(float) * (size_t)(n + 1));
    double *d = malloc(sizeof(double) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) d[i] = v[i] = (float)(mean + sd * normal(b));
    d[n] = v[n] = (float)mean; /* only written for bad_tensor */
    if (b->s->nan_norm && !strcmp(b->s->nan_norm, name)) d[0] = v[0] = NAN;
    int64_t dims[1] = {b->s->bad_tensor && !strcmp(b->s->bad_tensor, name) ? n + 1 : n};
    if (!b->s->skip_tensor || strcmp(b->s->skip_tensor, name)) gw_add_tensor_f32(b->w, name, GW_F32, 1, dims, v);
    free(v);
    return d;
}

/* A bias: 0.5 N(0, 1); NULL (none in the forward) when the spec leaves it
 * out of the file, which llama files may do. */
static double *add_bias(builder *b, const char *name, int64_t n) {
    double *v = add_vector(b, name, n, 0.0, 0.5);
    if (b->s->skip_tensor && !strcmp(b->s->skip_tensor, name)) free(v), v = NULL;
    return v;
}

/* A norm vector: 1 + 0.1 N(0, 1). */
static double *add_norm(builder *b, const char *name, int64_t n) { return add_vector(b, name, n, 1.0, 0.1); }

enum { TOKEN_CAP = 64 }; /* bytes of one token text, "<extra_2147483647>" included */

static void add_vocab(gw *w, int extra) {
    int n = FX_VOCAB + extra;
    char **toks = malloc(sizeof(char *) * (size_t)n);
    int32_t *types = malloc(sizeof(int32_t) * (size_t)n);
    static const char *const special[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    for (int i = 0; i < n; i++) {
        toks[i] = malloc(TOKEN_CAP);
        types[i] = i < 3 ? 3 : 1; /* control, normal */
        if (i < 3) snprintf(toks[i], TOKEN_CAP, "%s", special[i]);
        else if (i < FX_BYTE0 + 256) byte_token(i - FX_BYTE0, toks[i]);
        else snprintf(toks[i], TOKEN_CAP, "%s", i == FX_BYTE0 + 256 ? "\xc4\xa0t" : i == FX_BYTE0 + 257 ? "he" : "x");
        if (i >= FX_VOCAB) snprintf(toks[i], TOKEN_CAP, "<extra_%d>", i);
    }
    const char *merges[2] = {"\xc4\xa0 t", "h e"};
    gw_add_str(w, "tokenizer.ggml.model", "gpt2");
    gw_add_str(w, "tokenizer.ggml.pre", "smollm");
    gw_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)n);
    gw_add_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)n);
    gw_add_arr_str(w, "tokenizer.ggml.merges", merges, 2);
    gw_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gw_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
    gw_add_bool(w, "tokenizer.ggml.add_bos_token", 0);
    gw_add_str(w, "tokenizer.chat_template",
               "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
               "'<|im_end|>' + '\\n'}}{% endfor %}");
    for (int i = 0; i < n; i++) free(toks[i]);
    free(toks), free(types);
}

/* Gemma 3's vocabulary kind at fixture size: SentencePiece pieces with byte
 * fallback, its control tokens at the ids the fixture's tests use. */
static void add_vocab_spm(gw *w) {
    char **toks = malloc(sizeof(char *) * FX_VOCAB);
    int32_t *types = malloc(sizeof(int32_t) * FX_VOCAB);
    float *scores = malloc(sizeof(float) * FX_VOCAB);
    static const char *const special[3] = {"<pad>", "<eos>", "<bos>"};
    for (int i = 0; i < FX_VOCAB; i++) {
        toks[i] = malloc(TOKEN_CAP);
        types[i] = i < FX_BYTE0 || i >= FX_START_OF_TURN ? 3 : 6; /* control, byte */
        scores[i] = 0;
        if (i < FX_BYTE0) snprintf(toks[i], TOKEN_CAP, "%s", special[i]);
        else if (i < FX_START_OF_TURN) snprintf(toks[i], TOKEN_CAP, "<0x%02X>", i - FX_BYTE0);
        else snprintf(toks[i], TOKEN_CAP, "%s", i == FX_START_OF_TURN ? "<start_of_turn>" : "<end_of_turn>");
    }
    gw_add_str(w, "tokenizer.ggml.model", "llama");
    gw_add_str(w, "tokenizer.ggml.pre", "default");
    gw_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, FX_VOCAB);
    gw_add_arr_f32(w, "tokenizer.ggml.scores", scores, FX_VOCAB);
    gw_add_arr_i32(w, "tokenizer.ggml.token_type", types, FX_VOCAB);
    gw_add_u32(w, "tokenizer.ggml.bos_token_id", 2);
    gw_add_u32(w, "tokenizer.ggml.eos_token_id", 1);
    gw_add_u32(w, "tokenizer.ggml.padding_token_id", 0);
    gw_add_bool(w, "tokenizer.ggml.add_bos_token", 1);
    gw_add_bool(w, "tokenizer.ggml.add_space_prefix", 0);
    for (int i = 0; i < FX_VOCAB; i++) free(toks[i]);
    free(toks), free(types), free(scores);
}

int fx_build(const fx_spec *spec, fx_model *m) {
    static int counter;
    memset(m, 0, sizeof *m);
    fx_spec s = *spec;
    if (!s.dim) s.dim = 256;
    if (!s.layers) s.layers = 2;
    if (!s.heads) s.heads = 4;
    if (!s.ffn) s.ffn = 512;
    if (!s.arch) s.arch = "llama";
    m->gemma = strcmp(s.arch, "gemma3") == 0;
    m->qwen = !strcmp(s.arch, "qwen2") ? 2 : !strcmp(s.arch, "qwen3") ? 3 : 0;
    m->phi = !strcmp(s.arch, "phi3");
    if (!s.kv_heads) s.kv_heads = m->gemma ? 1 : 2;
    if (m->gemma) {
        if (!spec->layers) s.layers = 6;
        if (!s.window) s.window = 8;
        s.tied = !s.untied;
        s.rot_dim = 0; /* Gemma rotates whole heads */
        if (!s.head_dim) s.head_dim = 2 * s.dim / s.heads; /* wider than D / H, as 270M: 4 x 256 over 640 */
    }
    if (!s.theta) s.theta = m->gemma ? 1e6 : 10000;
    m->s = s;
    m->vocab = FX_VOCAB;
    m->head_dim = s.head_dim ? s.head_dim : s.dim / s.heads;
    m->eps = m->gemma ? 1e-6 : 1e-5;
    if (!m->s.rot_dim) m->s.rot_dim = m->head_dim;
    const int32_t D = s.dim, d = m->head_dim, H = s.heads, Hkv = s.kv_heads, F = s.ffn, V = m->vocab;
    builder b = {gw_new(), &m->s, s.seed * 7919 + 17};
    gw_add_str(b.w, "general.architecture", s.arch);
    gw_add_str(b.w, "general.name", "fixture");
    char key[64];
    snprintf(key, sizeof key, "%s.block_count", s.arch), gw_add_u32(b.w, key, (uint32_t)s.layers);
    snprintf(key, sizeof key, "%s.embedding_length", s.arch), gw_add_u32(b.w, key, (uint32_t)D);
    snprintf(key, sizeof key, "%s.feed_forward_length", s.arch), gw_add_u32(b.w, key, (uint32_t)F);
    snprintf(key, sizeof key, "%s.attention.head_count", s.arch), gw_add_u32(b.w, key, (uint32_t)H);
    snprintf(key, sizeof key, "%s.attention.head_count_kv", s.arch), gw_add_u32(b.w, key, (uint32_t)Hkv);
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", s.arch), gw_add_f32(b.w, key, (float)m->eps);
    snprintf(key, sizeof key, "%s.rope.freq_base", s.arch), gw_add_f32(b.w, key, (float)s.theta);
    if (!m->gemma)
        snprintf(key, sizeof key, "%s.rope.dimension_count", s.arch), gw_add_u32(b.w, key, (uint32_t)m->s.rot_dim);
    if (!m->gemma && s.window) {  /* llama: Mistral's sliding window; phi3: its converter's key, not applied */
        snprintf(key, sizeof key, "%s.attention.sliding_window", s.arch);
        gw_add_u32(b.w, key, s.window > 0 ? (uint32_t)s.window : 0);
        if (s.window < 0) m->s.window = 0;
    }
    snprintf(key, sizeof key, "%s.context_length", s.arch), gw_add_u32(b.w, key, 1024);
    if (s.head_dim) {
        snprintf(key, sizeof key, "%s.attention.key_length", s.arch), gw_add_u32(b.w, key, (uint32_t)d);
        snprintf(key, sizeof key, "%s.attention.value_length", s.arch), gw_add_u32(b.w, key, (uint32_t)d);
    }
    if (m->gemma) {
        snprintf(key, sizeof key, "%s.attention.sliding_window", s.arch), gw_add_u32(b.w, key, (uint32_t)s.window);
        add_vocab_spm(b.w);
    } else {
        add_vocab(b.w, s.extra_tokens);
    }

    /* scales 1/sqrt(fan-in) keep activations of order one through the layers */
    double sd = 1.0 / sqrt(D), sf = 1.0 / sqrt(F);
    m->embd = add_matrix(&b, "token_embd.weight", V, D, 1.0);
    m->L = calloc((size_t)s.layers, sizeof *m->L);
    for (int32_t l = 0; l < s.layers; l++) {
        char n[64];
        fx_layer *L = &m->L[l];
#define NAME(x) (snprintf(n, sizeof n, "blk.%d." x ".weight", (int)l), n)
#define NAME2(x, kind) (snprintf(n, sizeof n, "blk.%d." x "." kind, (int)l), n)
        L->attn_norm = add_norm(&b, NAME("attn_norm"), D);
        if (m->phi) { /* one matrix of the rows of Wq, Wk, Wv */
            double *qkv = add_matrix(&b, NAME("attn_qkv"), (int64_t)(H + 2 * Hkv) * d, D, sd);
            L->wq = rows_of(qkv, 0, (int64_t)H * d, D);
            L->wk = rows_of(qkv, (int64_t)H * d, (int64_t)Hkv * d, D);
            L->wv = rows_of(qkv, (int64_t)(H + Hkv) * d, (int64_t)Hkv * d, D);
            free(qkv);
        } else {
            L->wq = add_matrix(&b, NAME("attn_q"), (int64_t)H * d, D, sd);
            L->wk = add_matrix(&b, NAME("attn_k"), (int64_t)Hkv * d, D, sd);
            L->wv = add_matrix(&b, NAME("attn_v"), (int64_t)Hkv * d, D, sd);
        }
        if (m->qwen == 2 || s.qkv_bias) {
            /* biases of the size of the projections' outputs, so that losing one shows */
            L->bq = add_bias(&b, NAME2("attn_q", "bias"), (int64_t)H * d);
            L->bk = add_bias(&b, NAME2("attn_k", "bias"), (int64_t)Hkv * d);
            L->bv = add_bias(&b, NAME2("attn_v", "bias"), (int64_t)Hkv * d);
        }
        L->wo = add_matrix(&b, NAME("attn_output"), D, (int64_t)H * d, 1.0 / sqrt((double)H * d));
        if (m->gemma || m->qwen == 3) {
            L->q_norm = add_norm(&b, NAME("attn_q_norm"), d);
            L->k_norm = add_norm(&b, NAME("attn_k_norm"), d);
        }
        if (m->gemma) {
            L->post_attn_norm = add_norm(&b, NAME("post_attention_norm"), D);
        }
        L->ffn_norm = add_norm(&b, NAME("ffn_norm"), D);
        if (m->phi) { /* one matrix of the rows of Wgate, then Wup */
            double *gu = add_matrix(&b, NAME("ffn_up"), 2 * (int64_t)F, D, sd);
            L->wg = rows_of(gu, 0, F, D);
            L->wu = rows_of(gu, F, F, D);
            free(gu);
        } else {
            L->wg = add_matrix(&b, NAME("ffn_gate"), F, D, sd);
            L->wu = add_matrix(&b, NAME("ffn_up"), F, D, sd);
        }
        L->wd = add_matrix(&b, NAME("ffn_down"), D, F, sf);
        if (m->gemma) L->post_ffn_norm = add_norm(&b, NAME("post_ffw_norm"), D);
#undef NAME
#undef NAME2
    }
    m->out_norm = add_norm(&b, "output_norm.weight", D);
    m->out = s.tied ? m->embd : add_matrix(&b, "output.weight", V, D, sd * 4);
    int32_t half_rot = m->s.rot_dim / 2;
    m->inv_freq = malloc(sizeof(double) * (size_t)half_rot);
    if (m->gemma) {
        m->inv_freq_local = malloc(sizeof(double) * (size_t)half_rot);
        for (int32_t i = 0; i < half_rot; i++) m->inv_freq_local[i] = pow(10000.0, -2.0 * i / m->s.rot_dim);
    }
    float factors[256];
    for (int32_t i = 0; i < half_rot; i++) {
        factors[i] = (float)(1.0 + (i % 5) * 0.75);  /* exact in f32 */
        m->inv_freq[i] = pow(s.theta, -2.0 * i / m->s.rot_dim) / (s.rope_freqs ? factors[i] : 1.0);
    }
    if (s.rope_freqs) {
        int64_t dims[1] = {half_rot};
        gw_add_tensor_f32(b.w, "rope_freqs.weight", GW_F32, 1, dims, factors);
    }
    if (s.extra_tensor) {   /* a vector of 4 the architecture does not read */
        int64_t dims[1] = {4};
        gw_add_tensor_f32(b.w, s.extra_tensor, GW_F32, 1, dims, factors);
    }
    snprintf(m->path, sizeof m->path, "/tmp/kvcache_fixture_%d_%d.gguf", (int)getpid(), counter++);
    int rc = gw_write_file(b.w, m->path);
    if (rc) test_fail(__FILE__, __LINE__, "fixture: %s", gw_error(b.w));
    gw_free(b.w);
    return rc;
}

void fx_free(fx_model *m) {
    if (m->path[0]) remove(m->path);
    for (int32_t l = 0; m->L && l < m->s.layers; l++) {
        fx_layer *L = &m->L[l];
        free(L->attn_norm), free(L->wq), free(L->wk), free(L->wv), free(L->wo);
        free(L->ffn_norm), free(L->wg), free(L->wu), free(L->wd);
        free(L->q_norm), free(L->k_norm), free(L->post_attn_norm), free(L->post_ffn_norm);
        free(L->bq), free(L->bk), free(L->bv);
    }
    if (m->out != m->embd) free(m->out);
    free(m->embd), free(m->out_norm), free(m->inv_freq), free(m->inv_freq_local), free(m->L);
    memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------- the reference */

static void rmsnorm(const double *x, const double *w, double *o, int32_t n, double eps) {
    double ss = 0;
    for (int32_t i = 0; i < n; i++) ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / n + eps);
    for (int32_t i = 0; i < n; i++) o[i] = x[i] * s * w[i];
}

/* y [rows] = W [rows][cols] x */
static void matvec(const double *W, const double *x, double *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        double s = 0;
        for (int64_t c = 0; c < cols; c++) s += W[r * cols + c] * x[c];
        y[r] = s;
    }
}

/* RoPE over each head's first rot dims at pos: GGUF llama turns adjacent
 * pairs (2i, 2i+1), Gemma and Qwen the halves' pairs (i, i + d/2), by pos *
 * inv_freq[i]. */
static void rope(const fx_model *m, const double *inv_freq, double *v, int32_t heads, int32_t pos) {
    const int32_t half = m->s.rot_dim / 2;
    for (int32_t h = 0; h < heads; h++)
        for (int32_t i = 0; i < half; i++) {
            const int neox = m->gemma || m->qwen || m->phi;
            double *x0 = v + (size_t)h * m->head_dim + (neox ? i : 2 * i);
            double *x1 = neox ? x0 + half : x0 + 1;
            double a = pos * inv_freq[i], c0 = *x0, c1 = *x1;
            *x0 = c0 * cos(a) - c1 * sin(a);
            *x1 = c0 * sin(a) + c1 * cos(a);
        }
}

/* att [H*d] for the query q [H*d] at position t over keys/values K, V
 * [n][Hkv*d]: plain softmax over j <= t, and j > t - window when window > 0. */
static void attend(const fx_model *m, const double *q, const double *K, const double *V, int32_t t, int32_t window,
                   double *p, double *att) {
    const int32_t d = m->head_dim, H = m->s.heads, Hkv = m->s.kv_heads, kvd = Hkv * d;
    const int32_t j0 = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
    for (int32_t hh = 0; hh < H; hh++) {
        int32_t kv = hh / (H / Hkv); /* GQA: query heads share KV heads in groups */
        double mx = -INFINITY, sum = 0;
        for (int32_t j = j0; j <= t; j++) {
            double s = 0;
            for (int32_t i = 0; i < d; i++) s += q[hh * d + i] * K[(size_t)j * kvd + kv * d + i];
            p[j] = s / sqrt((double)d);
            mx = p[j] > mx ? p[j] : mx;
        }
        for (int32_t j = j0; j <= t; j++) sum += p[j] = exp(p[j] - mx);
        for (int32_t i = 0; i < d; i++) {
            double a = 0;
            for (int32_t j = j0; j <= t; j++) a += p[j] * V[(size_t)j * kvd + kv * d + i];
            att[hh * d + i] = a / sum;
        }
    }
}

void fx_layer0_kv(const fx_model *m, int32_t token, int32_t pos, double *k, double *v) {
    const int32_t D = m->s.dim, d = m->head_dim, Hkv = m->s.kv_heads, kvd = Hkv * d;
    const fx_layer *L = &m->L[0];
    double *x = malloc(sizeof(double) * D), *h = malloc(sizeof(double) * D);
    for (int32_t i = 0; i < D; i++) x[i] = m->embd[(size_t)token * D + i] * (m->gemma ? sqrt((double)D) : 1.0);
    rmsnorm(x, L->attn_norm, h, D, m->eps);
    matvec(L->wk, h, k, kvd, D);
    matvec(L->wv, h, v, kvd, D);
    for (int32_t i = 0; L->bk && i < kvd; i++) k[i] += L->bk[i];
    for (int32_t i = 0; L->bv && i < kvd; i++) v[i] += L->bv[i];
    for (int32_t kh = 0; (m->gemma || m->qwen == 3) && kh < Hkv; kh++)
        rmsnorm(k + kh * d, L->k_norm, k + kh * d, d, m->eps);
    rope(m, m->gemma ? m->inv_freq_local : m->inv_freq, k, Hkv, pos);
    free(x), free(h);
}

void fx_reference(const fx_model *m, const int32_t *tokens, int32_t n, double *logits) {
    const int32_t D = m->s.dim, d = m->head_dim, H = m->s.heads, Hkv = m->s.kv_heads, F = m->s.ffn, V = m->vocab;
    const int32_t qd = H * d, kvd = Hkv * d;
    const double eps = m->eps;
    double *x = malloc(sizeof(double) * (size_t)n * D), *h = malloc(sizeof(double) * D);
    double *K = malloc(sizeof(double) * (size_t)n * kvd), *Vv = malloc(sizeof(double) * (size_t)n * kvd);
    double *q = malloc(sizeof(double) * qd), *att = malloc(sizeof(double) * qd), *o = malloc(sizeof(double) * D);
    double *g = malloc(sizeof(double) * F), *u = malloc(sizeof(double) * F), *p = malloc(sizeof(double) * n);
    for (int32_t t = 0; t < n; t++)
        for (int32_t i = 0; i < D; i++)
            x[(size_t)t * D + i] = m->embd[(size_t)tokens[t] * D + i] * (m->gemma ? sqrt((double)D) : 1.0);
    for (int32_t l = 0; l < m->s.layers; l++) {
        const fx_layer *L = &m->L[l];
        const int local = m->gemma && l % 6 < 5;
        const int32_t window = local || (!m->gemma && !m->qwen && !m->phi) ? m->s.window : 0; /* llama: Mistral's, or 0 */
        const int qk_norm = m->gemma || m->qwen == 3;
        const double *inv_freq = local ? m->inv_freq_local : m->inv_freq;
        /* every position's K and V first: position t attends to keys 0..t */
        for (int32_t t = 0; t < n; t++) {
            double *kt = K + (size_t)t * kvd;
            rmsnorm(x + (size_t)t * D, L->attn_norm, h, D, eps);
            matvec(L->wk, h, kt, kvd, D);
            matvec(L->wv, h, Vv + (size_t)t * kvd, kvd, D);
            for (int32_t i = 0; L->bk && i < kvd; i++) kt[i] += L->bk[i];
            for (int32_t i = 0; L->bv && i < kvd; i++) Vv[(size_t)t * kvd + i] += L->bv[i];
            for (int32_t kh = 0; qk_norm && kh < Hkv; kh++) rmsnorm(kt + kh * d, L->k_norm, kt + kh * d, d, eps);
            rope(m, inv_freq, kt, Hkv, t);
        }
        for (int32_t t = 0; t < n; t++) {
            double *xt = x + (size_t)t * D;
            rmsnorm(xt, L->attn_norm, h, D, eps);
            matvec(L->wq, h, q, qd, D);
            for (int32_t i = 0; L->bq && i < qd; i++) q[i] += L->bq[i];
            for (int32_t qh = 0; qk_norm && qh < H; qh++) rmsnorm(q + qh * d, L->q_norm, q + qh * d, d, eps);
            rope(m, inv_freq, q, H, t);
            attend(m, q, K, Vv, t, window, p, att);
            matvec(L->wo, att, o, D, qd);
            if (m->gemma) rmsnorm(o, L->post_attn_norm, o, D, eps);
            for (int32_t i = 0; i < D; i++) xt[i] += o[i];
            rmsnorm(xt, L->ffn_norm, h, D, eps);
            matvec(L->wg, h, g, F, D);
            matvec(L->wu, h, u, F, D);
            for (int32_t i = 0; i < F; i++) {
                double a = g[i];
                /* SwiGLU: silu(a) = a sigmoid(a); GeGLU: gelu, tanh form */
                g[i] = m->gemma ? 0.5 * a * (1 + tanh(sqrt(2 / M_PI) * (a + 0.044715 * a * a * a))) * u[i]
                                : a / (1 + exp(-a)) * u[i];
            }
            matvec(L->wd, g, o, D, F);
            if (m->gemma) rmsnorm(o, L->post_ffn_norm, o, D, eps);
            for (int32_t i = 0; i < D; i++) xt[i] += o[i];
        }
    }
    for (int32_t t = 0; t < n; t++) {
        rmsnorm(x + (size_t)t * D, m->out_norm, h, D, eps);
        matvec(m->out, h, logits + (size_t)t * V, V, D);
    }
    free(x), free(h), free(K), free(Vv), free(q), free(att), free(o), free(g), free(u), free(p);
}

double fx_max_diff(const float *a, const double *b, int64_t n, double *bmax) {
    double d = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (e > d || isnan(e)) d = e;
        if (fabs(b[i]) > mx) mx = fabs(b[i]);
    }
    if (bmax) *bmax = mx;
    return d;
}

void fx_check_prefill(const fx_model *fx, const llm_model *m, const llm_context_params *p, const int32_t *tokens,
                      int32_t n, const int32_t *batches, int nb, double tol, const char *what) {
    const int64_t nv = (int64_t)n * fx->vocab;
    double *ref = malloc(sizeof(double) * (size_t)nv);
    float *got = malloc(sizeof(float) * (size_t)nv);
    fx_reference(fx, tokens, n, ref);
    for (int b = 0; b < nb; b++) {
        llm_context_params pb = *p;
        pb.n_batch = batches[b];
        llm_context *c = fx_context(m, &pb);
        int32_t seq;
        if (!c) break;
        CHECK_EQ_INT(llm_seq_new(c, &seq), LLM_OK);
        CHECK_EQ_INT(llm_eval(c, seq, tokens, n, 1, got, NULL, NULL), LLM_OK);
        double bmax, r = fx_max_diff(got, ref, nv, &bmax) / bmax;
        printf("     %-16s n_batch %2d: relative diff to f64 %.2e\n", what, (int)batches[b], r);
        if (!(r <= tol)) test_fail(__FILE__, __LINE__, "%s, batch %d: logits off by %g", what, (int)batches[b], r);
        llm_context_free(c);
    }
    free(ref), free(got);
}

void fx_check_threads(const llm_model *m, const llm_context_params *p, const int32_t *tokens, int32_t n) {
    const int32_t V = llm_model_n_vocab(m);
    float *base = malloc(sizeof(float) * (size_t)V), *other = malloc(sizeof(float) * (size_t)V);
    for (int32_t t = 1; t <= 3; t++) {
        llm_context_params pt = *p;
        pt.n_threads = t;
        llm_context *c = fx_context(m, &pt);
        int32_t seq;
        if (!c) break;
        CHECK_EQ_INT(llm_seq_new(c, &seq), LLM_OK);
        CHECK_EQ_INT(llm_eval(c, seq, tokens, n, 0, t == 1 ? base : other, NULL, NULL), LLM_OK);
        if (t > 1 && memcmp(base, other, sizeof(float) * (size_t)V))
            test_fail(__FILE__, __LINE__, "%s: %d threads changed the logits", llm_model_arch(m), (int)t);
        llm_context_free(c);
    }
    free(base), free(other);
}

void fx_check_load_error(const fx_spec *spec, const char *expect) {
    fx_model fx;
    if (fx_build(spec, &fx)) return;
    llm_model *m = (llm_model *)1;
    char err[256] = "";
    CHECK_EQ_INT(llm_model_load(fx.path, &m, err, sizeof err), LLM_ERR_MODEL);
    CHECK(m == NULL);
    if (!strstr(err, expect)) test_fail(__FILE__, __LINE__, "error '%s' does not mention '%s'", err, expect);
    fx_free(&fx);
}

/* The same model run one token at a time over an explicit list of the
 * positions still visible, so that a context shift is what it means rather
 * than how the cache does it: each key is kept unrotated and rotated at its
 * current position (its index in the list) whenever it is used; a shift
 * removes entries from the list. No re-rotation, no paging. */
void fx_reference_shifted(const fx_model *m, const int32_t *tokens, int32_t n, const fx_shift *shifts,
                          int32_t n_shifts, double *logits) {
    const int32_t D = m->s.dim, d = m->head_dim, H = m->s.heads, Hkv = m->s.kv_heads, F = m->s.ffn, V = m->vocab;
    const int32_t qd = H * d, kvd = Hkv * d, NL = m->s.layers;
    double *Kraw = malloc(sizeof(double) * (size_t)NL * n * kvd), *Vv = malloc(sizeof(double) * (size_t)NL * n * kvd);
    double *x = malloc(sizeof(double) * D), *h = malloc(sizeof(double) * D), *q = malloc(sizeof(double) * qd);
    double *att = malloc(sizeof(double) * qd), *o = malloc(sizeof(double) * D), *key = malloc(sizeof(double) * kvd);
    double *g = malloc(sizeof(double) * F), *u = malloc(sizeof(double) * F), *p = malloc(sizeof(double) * n);
    int32_t *vis = malloc(sizeof(int32_t) * n), n_vis = 0; /* token indices by current position */
    for (int32_t t = 0; t < n; t++) {
        vis[n_vis++] = t;
        const int32_t pos = n_vis - 1;
        memcpy(x, m->embd + (size_t)tokens[t] * D, sizeof(double) * D);
        for (int32_t l = 0; l < NL; l++) {
            const fx_layer *L = &m->L[l];
            double *kr = Kraw + ((size_t)l * n + t) * kvd, *vr = Vv + ((size_t)l * n + t) * kvd;
            rmsnorm(x, L->attn_norm, h, D, m->eps);
            matvec(L->wq, h, q, qd, D);
            matvec(L->wk, h, kr, kvd, D);
            matvec(L->wv, h, vr, kvd, D);
            rope(m, m->inv_freq, q, H, pos);
            for (int32_t hh = 0; hh < H; hh++) {
                int32_t kv = hh / (H / Hkv);
                double mx = -INFINITY, sum = 0;
                for (int32_t j = 0; j < n_vis; j++) {
                    memcpy(key, Kraw + ((size_t)l * n + vis[j]) * kvd, sizeof(double) * kvd);
                    rope(m, m->inv_freq, key, Hkv, j);
                    double s = 0;
                    for (int32_t i = 0; i < d; i++) s += q[hh * d + i] * key[kv * d + i];
                    p[j] = s / sqrt((double)d);
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int32_t j = 0; j < n_vis; j++) sum += p[j] = exp(p[j] - mx);
                for (int32_t i = 0; i < d; i++) {
                    double a = 0;
                    for (int32_t j = 0; j < n_vis; j++) a += p[j] * Vv[((size_t)l * n + vis[j]) * kvd + kv * d + i];
                    att[hh * d + i] = a / sum;
                }
            }
            matvec(L->wo, att, o, D, qd);
            for (int32_t i = 0; i < D; i++) x[i] += o[i];
            rmsnorm(x, L->ffn_norm, h, D, m->eps);
            matvec(L->wg, h, g, F, D);
            matvec(L->wu, h, u, F, D);
            for (int32_t i = 0; i < F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
            matvec(L->wd, g, o, D, F);
            for (int32_t i = 0; i < D; i++) x[i] += o[i];
        }
        rmsnorm(x, m->out_norm, h, D, m->eps);
        matvec(m->out, h, logits + (size_t)t * V, V, D);
        for (int32_t s = 0; s < n_shifts; s++) {
            if (shifts[s].after != t + 1) continue;
            int32_t keep = shifts[s].n_keep, drop = shifts[s].n_discard;
            memmove(vis + keep, vis + keep + drop, sizeof(int32_t) * (size_t)(n_vis - keep - drop));
            n_vis -= drop;
        }
    }
    free(Kraw), free(Vv), free(x), free(h), free(q), free(att), free(o), free(key), free(g), free(u), free(p), free(vis);
}

llm_model *fx_load(const fx_model *fx) {
    llm_model *m = NULL;
    char err[256];
    if (llm_model_load(fx->path, &m, err, sizeof err) != LLM_OK) test_fail(__FILE__, __LINE__, "load: %s", err);
    return m;
}

llm_context *fx_context(const llm_model *model, const llm_context_params *p) {
    llm_context *c = NULL;
    char err[256];
    if (llm_context_create(model, p, &c, err, sizeof err) != LLM_OK) test_fail(__FILE__, __LINE__, "context: %s", err);
    return c;
}
