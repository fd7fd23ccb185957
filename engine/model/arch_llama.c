/* engine/model/arch_llama.c - the `llama` architecture (Llama 1-3, TinyLlama,
 * SmolLM2, Mistral), per token:
 *
 *     x = token_embd[token]
 *     for each layer:
 *         h = rmsnorm(x) * attn_norm
 *         q, k, v = h Wq, h Wk, h Wv          RoPE on q and k at absolute positions
 *         x += attention(q, cached K, cached V) Wo      (GQA: H query heads over Hkv)
 *         h = rmsnorm(x) * ffn_norm
 *         x += (silu(h Wgate) * (h Wup)) Wdown         (SwiGLU)
 *     logits = (rmsnorm(x) * output_norm) Wout         (Wout = token_embd when tied)
 *
 * RoPE layout: the GGUF converter permutes the rows of HF's Wq and Wk so that
 * the two halves a Hugging Face checkpoint rotates together (i, i + d/2)
 * become adjacent (2i, 2i + 1); llama.cpp then rotates adjacent pairs
 * ("normal" mode) for this architecture. So a GGUF llama model takes
 * KV_ROPE_INTERLEAVED, not the split-half layout its HF original uses.
 *
 * One cache group, one RoPE table (with rope_freqs.weight, Llama 3.1's
 * scaled frequencies, when present). Every layer attends fully, or within
 * llama.attention.sliding_window when the file declares one (Mistral 7B
 * v0.1's W = 4096: a window cache that returns pages as the sequence passes
 * them). llama.cpp's converter does not write that key for Mistral and its
 * llama graph ignores it, so a file from it attends fully, as there.
 *
 * The forward is shared with Qwen2 and Qwen3 (engine/model/arch_qwen.c), which
 * differ in tensors, not in code: q/k/v biases are added after the
 * projections and per-head q/k norms applied before RoPE when a layer has
 * them. */
#include "layers.h"

static int llama_hparams(const llm_gguf *g, llm_hparams *hp, char *err, size_t errlen) {
    int rc = llm_read_common_hparams(g, "llama", hp, err, errlen);
    hp->rope.layout = KV_ROPE_INTERLEAVED; /* adjacent pairs (see above) */
    return rc;
}

/* q/k/v biases optional, as llama.cpp reads llama files: some converted
 * models carry them */
static const llm_tensor_desc llama_tensors[] = {
    LLM_LLAMA_TENSORS,
    LLM_TENSOR("attn_q.bias", bq, LLM_SZ_Q, LLM_SZ_NONE, 1),
    LLM_TENSOR("attn_k.bias", bk, LLM_SZ_KV, LLM_SZ_NONE, 1),
    LLM_TENSOR("attn_v.bias", bv, LLM_SZ_KV, LLM_SZ_NONE, 1),
};

/* A file may declare llama.attention.sliding_window (Mistral's window): then
 * every layer attends within it, in one window cache. 0 is what converters
 * write for "no window" (llama.cpp's for Llama 4 without one). */
static int llama_load(llm_model *m, char *err, size_t errlen) {
    int32_t window = 0;
    if (llm_read_opt_count(m->gguf, "llama.attention.sliding_window", 0, INT32_MAX, &window, err, errlen))
        return LLM_ERR_MODEL;
    int rc = llm_load_layers(m, llama_tensors, (int)(sizeof llama_tensors / sizeof llama_tensors[0]), err, errlen);
    if (rc) return rc;
    if (llm_layers_one_group(m, window)) return llm_errf(err, errlen, LLM_ERR_NOMEM, "out of memory");
    return llm_load_rope(m, 0, &m->hp.rope, 1, err, errlen);
}

int llm_llama_forward(const llm_pass *ps) {
    const llm_model *m = ps->c->m;
    const llm_hparams *hp = &m->hp;
    llm_scratch *ws = ps->ws;
    const int32_t rows = ps->rows;
    const int64_t D = hp->dim;
    const size_t n = (size_t)rows * (size_t)D;
    llm_embed(m, ps->tokens, rows, ws->x);
    for (int32_t l = 0; l < hp->n_layers; l++) {
        const llm_layer_weights *w = &m->layers[l];
        /* attention block */
        llm_rmsnorm(ws->x, w->attn_norm, ws->h, rows, D, hp->norm_eps);
        llm_project_qkv(ps, w);
        if (w->attn_q_norm) {
            llm_rmsnorm_heads(ws->q, w->attn_q_norm, rows, hp->n_heads, hp->head_dim, hp->norm_eps);
            llm_rmsnorm_heads(ws->k, w->attn_k_norm, rows, hp->n_kv_heads, hp->head_dim, hp->norm_eps);
        }
        int rc = llm_rope_qk(ps, &m->ropes[m->lhp[l].rope]);
        if (!rc) rc = llm_attention(ps, l);
        if (rc) return rc;
        llm_matmul(ps, &w->wo, ws->att, rows, ws->h);
        llm_add_into(ws->x, ws->h, n);
        /* feed-forward block */
        llm_rmsnorm(ws->x, w->ffn_norm, ws->h, rows, D, hp->norm_eps);
        llm_ffn(ps, w, LLM_GLU_SILU);
        llm_add_into(ws->x, ws->h, n);
    }
    llm_logits(ps, m->output_norm);
    return LLM_OK;
}

const llm_arch llm_arch_llama = {
    .name = "llama",
    .read_hparams = llama_hparams,
    .load = llama_load,
    .forward = llm_llama_forward,
};
