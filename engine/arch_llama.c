/* engine/arch_llama.c - the `llama` architecture (Llama 1-3, TinyLlama,
 * SmolLM2, Mistral without sliding windows), per token:
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
 * Every layer attends fully: one cache group, one RoPE table (with
 * rope_freqs.weight, Llama 3.1's scaled frequencies, when present). */
#include <stdio.h>
#include <stdlib.h>

#include "layers.h"

static int llama_hparams(const llm_gguf *g, llm_hparams *hp, char *err, size_t errlen) {
    int rc = llm_read_common_hparams(g, "llama", hp, err, errlen);
    hp->rope.layout = KV_ROPE_INTERLEAVED; /* adjacent pairs (see above) */
    return rc;
}

static int load_layer(llm_model *m, int32_t l, float *norms, char *err, size_t errlen) {
    const llm_hparams *hp = &m->hp;
    llm_layer_weights *w = &m->layers[l];
    int64_t D = hp->dim, qd = (int64_t)hp->n_heads * hp->head_dim, kvd = (int64_t)hp->n_kv_heads * hp->head_dim;
    char n[9][64];
    static const char *const suffix[9] = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                          "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"};
    for (int i = 0; i < 9; i++) snprintf(n[i], sizeof n[i], "blk.%d.%s.weight", (int)l, suffix[i]);
    if (llm_load_vector(m->gguf, n[0], D, norms, err, errlen) ||
        llm_load_matrix(m->gguf, n[1], qd, D, &w->wq, err, errlen) ||
        llm_load_matrix(m->gguf, n[2], kvd, D, &w->wk, err, errlen) ||
        llm_load_matrix(m->gguf, n[3], kvd, D, &w->wv, err, errlen) ||
        llm_load_matrix(m->gguf, n[4], D, qd, &w->wo, err, errlen) ||
        llm_load_vector(m->gguf, n[5], D, norms + D, err, errlen) ||
        llm_load_matrix(m->gguf, n[6], hp->ffn_dim, D, &w->w_gate, err, errlen) ||
        llm_load_matrix(m->gguf, n[7], hp->ffn_dim, D, &w->w_up, err, errlen) ||
        llm_load_matrix(m->gguf, n[8], D, hp->ffn_dim, &w->w_down, err, errlen))
        return LLM_ERR_MODEL;
    w->attn_norm = norms;
    w->ffn_norm = norms + D;
    return LLM_OK;
}

static int llama_load(llm_model *m, char *err, size_t errlen) {
    const llm_hparams *hp = &m->hp;
    const int64_t D = hp->dim;
    /* the 2L + 1 norm vectors are in the file at >= half a byte per element:
     * a header claiming more cannot be right, and must not make us allocate */
    if ((uint64_t)D * (uint64_t)(2 * hp->n_layers + 1) / 2 > llm_gguf_file_size(m->gguf))
        return llm_errf(err, errlen, LLM_ERR_MODEL, "the file (%llu bytes) is too small for %d layers of width %d",
                        (unsigned long long)llm_gguf_file_size(m->gguf), (int)hp->n_layers, (int)D);
    m->layers = calloc((size_t)hp->n_layers, sizeof *m->layers);
    m->norms = malloc(sizeof(float) * (size_t)D * (size_t)(2 * hp->n_layers + 1));
    if (!m->layers || !m->norms || llm_layers_one_group(m))
        return llm_errf(err, errlen, LLM_ERR_NOMEM, "out of memory");
    for (int32_t l = 0; l < hp->n_layers; l++)
        if (load_layer(m, l, m->norms + (size_t)2 * l * D, err, errlen)) return LLM_ERR_MODEL;
    float *onorm = m->norms + (size_t)2 * hp->n_layers * D;
    if (llm_load_vector(m->gguf, "output_norm.weight", D, onorm, err, errlen)) return LLM_ERR_MODEL;
    m->output_norm = onorm;
    return llm_load_rope(m, 0, &hp->rope, 1, err, errlen);
}

static int llama_forward(const llm_pass *ps) {
    const llm_model *m = ps->c->m;
    const llm_hparams *hp = &m->hp;
    llm_scratch *ws = ps->ws;
    kv_pool *pool = ps->c->pool;
    const int32_t rows = ps->rows;
    const int64_t D = hp->dim, F = hp->ffn_dim;
    const int64_t qd = (int64_t)hp->n_heads * hp->head_dim, kvd = (int64_t)hp->n_kv_heads * hp->head_dim;
    const size_t n = (size_t)rows * (size_t)D;
    llm_embed(m, ps->tokens, rows, ws->x);
    for (int32_t l = 0; l < hp->n_layers; l++) {
        const llm_layer_weights *w = &m->layers[l];
        /* attention block */
        llm_rmsnorm(ws->x, w->attn_norm, ws->h, rows, D, hp->norm_eps);
        llm_mm_job j = llm_mm_begin(rows);
        llm_mm_add(&j, &w->wq, ws->h, ws->q, qd);
        llm_mm_add(&j, &w->wk, ws->h, ws->k, kvd);
        llm_mm_add(&j, &w->wv, ws->h, ws->v, kvd);
        llm_mm_run(pool, &j);
        int rc = llm_rope_qk(ps, &m->ropes[m->lhp[l].rope]);
        if (!rc) rc = llm_attention(ps, l);
        if (rc) return rc;
        llm_matmul(pool, &w->wo, ws->att, rows, ws->h);
        llm_add_into(ws->x, ws->h, n);
        /* feed-forward block */
        llm_rmsnorm(ws->x, w->ffn_norm, ws->h, rows, D, hp->norm_eps);
        llm_mm_job g = llm_mm_begin(rows);
        llm_mm_add(&g, &w->w_gate, ws->h, ws->gate, F);
        llm_mm_add(&g, &w->w_up, ws->h, ws->up, F);
        llm_mm_run(pool, &g);
        llm_swiglu(pool, ws->gate, ws->up, rows, F);
        llm_matmul(pool, &w->w_down, ws->gate, rows, ws->h);
        llm_add_into(ws->x, ws->h, n);
    }
    llm_logits(ps, m->output_norm);
    return LLM_OK;
}

const llm_arch llm_arch_llama = {
    .name = "llama",
    .read_hparams = llama_hparams,
    .load = llama_load,
    .forward = llama_forward,
};
