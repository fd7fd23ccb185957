/* engine/model/arch_gemma3.c - the `gemma3` architecture (Gemma 3 text models:
 * 270M, 1B; the larger ones' rope scaling is refused), per token:
 *
 *     x = token_embd[token] * sqrt(D)
 *     for each layer l (a window layer when l % 6 < 5, a global one otherwise):
 *         h = rmsnorm(x) * attn_norm
 *         q, k, v = h Wq, h Wk, h Wv
 *         q = rmsnorm_per_head(q) * attn_q_norm,  k = rmsnorm_per_head(k) * attn_k_norm
 *         RoPE split-half (NEOX) at absolute positions: base 10000 on window
 *         layers, rope.freq_base (1e6) on global ones
 *         att = attention(q, K, V), scale 1/sqrt(d); window layers see only the
 *               last W = attention.sliding_window positions (j > p - W)
 *         x += rmsnorm(att Wo) * post_attention_norm
 *         h = rmsnorm(x) * ffn_norm
 *         x += rmsnorm((gelu_tanh(h Wgate) * (h Wup)) Wdown) * post_ffw_norm
 *     logits = (rmsnorm(x) * output_norm) token_embd^T       (tied)
 *
 * As the GGUF convention encodes it (llama.cpp's converter and graph; HF
 * transformers' Gemma3 model): the converter has already added Gemma's +1 to
 * every norm weight, so norms multiply by the weight as stored; Wq and Wk are
 * not permuted, so RoPE rotates the halves' pairs (i, i + d/2); the window
 * pattern (6) and the local base (10000) are not in the file; the query scale
 * is query_pre_attn_scalar^-1/2, which is head_dim for every size but the
 * 27B (62 layers: D / H); Gemma 3 has no logit soft-capping.
 *
 * Two cache groups: the global layers share a full cache, the window layers
 * a window cache of W, whose pages go back to the pool as the sequence
 * passes them, so that group's memory stays flat at about W positions. */
#include <math.h>
#include <stdlib.h>

#include "layers.h"

enum {
    GEMMA3_PATTERN = 6,           /* layers l with l % 6 == 5 attend globally */
};
#define GEMMA3_LOCAL_BASE 10000.0 /* RoPE base of the window layers */

static int is_window_layer(int32_t l) { return l % GEMMA3_PATTERN < GEMMA3_PATTERN - 1; }

static int gemma3_hparams(const llm_gguf *g, llm_hparams *hp, char *err, size_t errlen) {
    int rc = llm_read_common_hparams(g, "gemma3", hp, err, errlen);
    if (rc) return rc;
    /* Gemma 2's soft-capping keys would change the math; Gemma 3 files have none */
    static const char *const caps[2] = {"gemma3.attn_logit_softcapping", "gemma3.final_logit_softcapping"};
    for (int i = 0; i < 2; i++)
        if (llm_gguf_f32_or(g, caps[i], 0.0f) != 0.0f)
            return llm_errf(err, errlen, LLM_ERR_MODEL, "%s is set: logit soft-capping is not supported", caps[i]);
    int32_t w = 0;
    if (llm_read_count(g, "gemma3.attention.sliding_window", 1, INT32_MAX, &w, err, errlen)) return LLM_ERR_MODEL;
    return LLM_OK;
}

static const llm_tensor_desc gemma3_tensors[] = {
    LLM_TENSOR("attn_norm.weight", attn_norm, LLM_SZ_D, LLM_SZ_NONE, 0),
    LLM_TENSOR("attn_q_norm.weight", attn_q_norm, LLM_SZ_HEAD, LLM_SZ_NONE, 0),
    LLM_TENSOR("attn_k_norm.weight", attn_k_norm, LLM_SZ_HEAD, LLM_SZ_NONE, 0),
    LLM_TENSOR("post_attention_norm.weight", post_attn_norm, LLM_SZ_D, LLM_SZ_NONE, 0),
    LLM_TENSOR("ffn_norm.weight", ffn_norm, LLM_SZ_D, LLM_SZ_NONE, 0),
    LLM_TENSOR("post_ffw_norm.weight", post_ffn_norm, LLM_SZ_D, LLM_SZ_NONE, 0),
    LLM_TENSOR("attn_q.weight", wq, LLM_SZ_Q, LLM_SZ_D, 0),
    LLM_TENSOR("attn_k.weight", wk, LLM_SZ_KV, LLM_SZ_D, 0),
    LLM_TENSOR("attn_v.weight", wv, LLM_SZ_KV, LLM_SZ_D, 0),
    LLM_TENSOR("attn_output.weight", wo, LLM_SZ_D, LLM_SZ_Q, 0),
    LLM_TENSOR("ffn_gate.weight", w_gate, LLM_SZ_F, LLM_SZ_D, 0),
    LLM_TENSOR("ffn_up.weight", w_up, LLM_SZ_F, LLM_SZ_D, 0),
    LLM_TENSOR("ffn_down.weight", w_down, LLM_SZ_D, LLM_SZ_F, 0),
};

/* Group 0: the global layers (full cache), group 1: the window layers
 * (window cache); a model of fewer than 6 layers has window layers only. */
static int declare_layers(llm_model *m, int32_t window, float attn_scale) {
    const int32_t L = m->hp.n_layers;
    m->lhp = calloc((size_t)L, sizeof *m->lhp);
    if (!m->lhp) return LLM_ERR_NOMEM;
    int32_t n_global = 0;
    for (int32_t l = 0; l < L; l++) n_global += !is_window_layer(l);
    const int32_t g_global = n_global ? 0 : -1, g_window = n_global ? 1 : 0;
    int32_t next[2] = {0, 0};
    for (int32_t l = 0; l < L; l++) {
        int local = is_window_layer(l);
        int32_t g = local ? g_window : g_global;
        m->lhp[l] = (llm_layer_hparams){.group = g, .group_layer = next[g]++, .window = local ? window : 0,
                                        .rope = local ? 1 : 0, .attn_scale = attn_scale};
    }
    m->n_groups = 0;
    if (n_global) m->groups[m->n_groups++] = (llm_cache_group){.n_layers = n_global, .window = 0};
    if (L - n_global) m->groups[m->n_groups++] = (llm_cache_group){.n_layers = L - n_global, .window = window};
    return LLM_OK;
}

static int gemma3_load(llm_model *m, char *err, size_t errlen) {
    const llm_hparams *hp = &m->hp;
    if (!m->tied_output)
        return llm_errf(err, errlen, LLM_ERR_MODEL, "gemma3 files tie the output to token_embd; this one has output.weight");
    if (hp->rope.rot_dim != hp->head_dim)
        return llm_errf(err, errlen, LLM_ERR_MODEL, "gemma3 rotates whole heads; rope.dimension_count is %d of %d",
                        (int)hp->rope.rot_dim, (int)hp->head_dim);
    int32_t window = 0;
    if (llm_read_count(m->gguf, "gemma3.attention.sliding_window", 1, INT32_MAX, &window, err, errlen))
        return LLM_ERR_MODEL;
    float scale = hp->n_layers == 62 ? (float)(1.0 / sqrt((double)hp->dim / hp->n_heads)) : 0.0f;
    int rc = llm_load_layers(m, gemma3_tensors, (int)(sizeof gemma3_tensors / sizeof gemma3_tensors[0]), err, errlen);
    if (rc) return rc;
    if (declare_layers(m, window, scale)) return llm_errf(err, errlen, LLM_ERR_NOMEM, "out of memory");
    kv_rope_params local = hp->rope;
    local.theta = GEMMA3_LOCAL_BASE;
    rc = llm_load_rope(m, 0, &hp->rope, 0, err, errlen);
    return rc ? rc : llm_load_rope(m, 1, &local, 0, err, errlen);
}

static int gemma3_forward(const llm_pass *ps) {
    const llm_model *m = ps->c->m;
    const llm_hparams *hp = &m->hp;
    llm_scratch *ws = ps->ws;
    const int32_t rows = ps->rows, H = hp->n_heads, Hkv = hp->n_kv_heads, d = hp->head_dim;
    const int64_t D = hp->dim;
    const size_t n = (size_t)rows * (size_t)D;
    const float eps = hp->norm_eps;
    llm_embed(m, ps->tokens, rows, ws->x);
    llm_scale(ws->x, n, sqrtf((float)D));
    for (int32_t l = 0; l < hp->n_layers; l++) {
        const llm_layer_weights *w = &m->layers[l];
        /* attention block, normed before and after */
        llm_rmsnorm(ws->x, w->attn_norm, ws->h, rows, D, eps);
        llm_project_qkv(ps, w);
        llm_rmsnorm_heads(ws->q, w->attn_q_norm, rows, H, d, eps);
        llm_rmsnorm_heads(ws->k, w->attn_k_norm, rows, Hkv, d, eps);
        int rc = llm_rope_qk(ps, &m->ropes[m->lhp[l].rope]);
        if (!rc) rc = llm_attention(ps, l);
        if (rc) return rc;
        llm_matmul(ps, &w->wo, ws->att, rows, ws->h);
        llm_rmsnorm(ws->h, w->post_attn_norm, ws->h, rows, D, eps);
        llm_add_into(ws->x, ws->h, n);
        /* feed-forward block (GeGLU), normed before and after */
        llm_rmsnorm(ws->x, w->ffn_norm, ws->h, rows, D, eps);
        llm_ffn(ps, w, LLM_GLU_GELU_TANH);
        llm_rmsnorm(ws->h, w->post_ffn_norm, ws->h, rows, D, eps);
        llm_add_into(ws->x, ws->h, n);
    }
    llm_logits(ps, m->output_norm);
    return LLM_OK;
}

const llm_arch llm_arch_gemma3 = {
    .name = "gemma3",
    .read_hparams = gemma3_hparams,
    .load = gemma3_load,
    .forward = gemma3_forward,
};
