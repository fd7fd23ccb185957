/* engine/model/arch_phi3.c - the `phi3` architecture (Phi-3 mini and medium with
 * the 4k context): the Llama decoder (engine/model/arch_llama.c) with its
 * projections fused, as the GGUF convention stores them (llama.cpp's
 * converter and graph; HF transformers' Phi3 model):
 *
 *     attn_qkv [(H + 2 Hkv) d][D]: the rows of Wq, then Wk, then Wv
 *     ffn_up   [2F][D]:            the rows of Wgate, then Wup
 *                                  (SwiGLU: silu(first half) * second half)
 *
 * Each fused matrix is loaded once, checked whole, and split at a row
 * boundary into the llm_matrix views the Llama forward reads (zero-copy:
 * block rows are independent). RoPE split-half over rope.dimension_count,
 * softmax scale 1/sqrt(d).
 *
 * Refused: the 128k models' LongRoPE factors (rope_factors_long/short),
 * which rescale frequencies by context length. Not applied: the
 * attention.sliding_window key the converter writes (2047 for mini-4k).
 * llama.cpp disables Phi-3's window as well (its converter does not yet say
 * which layers use it), so both attend fully and their results compare;
 * they differ from a windowed reading only past 2047 positions. */
#include "layers.h"

static int phi3_hparams(const llm_gguf *g, llm_hparams *hp, char *err, size_t errlen) {
    int rc = llm_read_common_hparams(g, "phi3", hp, err, errlen);
    hp->rope.layout = KV_ROPE_NEOX;
    return rc;
}

static const llm_tensor_desc phi3_tensors[] = {
    LLM_TENSOR("attn_norm.weight", attn_norm, LLM_SZ_D, LLM_SZ_NONE, 0),
    LLM_TENSOR("attn_qkv.weight", wq, LLM_SZ_QKV, LLM_SZ_D, 0),        /* split below */
    LLM_TENSOR("attn_output.weight", wo, LLM_SZ_D, LLM_SZ_Q, 0),
    LLM_TENSOR("ffn_norm.weight", ffn_norm, LLM_SZ_D, LLM_SZ_NONE, 0),
    LLM_TENSOR("ffn_up.weight", w_gate, LLM_SZ_2F, LLM_SZ_D, 0),       /* split below */
    LLM_TENSOR("ffn_down.weight", w_down, LLM_SZ_D, LLM_SZ_F, 0),
};

static int phi3_load(llm_model *m, char *err, size_t errlen) {
    static const char *const longrope[2] = {"rope_factors_long.weight", "rope_factors_short.weight"};
    for (int i = 0; i < 2; i++)
        if (llm_gguf_find_tensor(m->gguf, longrope[i]))
            return llm_errf(err, errlen, LLM_ERR_MODEL, "%s: LongRoPE (the 128k-context Phi-3 models) is not supported",
                            longrope[i]);
    int rc = llm_load_layers(m, phi3_tensors, (int)(sizeof phi3_tensors / sizeof phi3_tensors[0]), err, errlen);
    if (rc) return rc;
    const llm_hparams *hp = &m->hp;
    const int64_t qd = (int64_t)hp->n_heads * hp->head_dim, kvd = (int64_t)hp->n_kv_heads * hp->head_dim;
    for (int32_t l = 0; l < hp->n_layers; l++) {
        llm_layer_weights *w = &m->layers[l];
        llm_matrix_split(&w->wq, qd, &w->wk);
        llm_matrix_split(&w->wk, kvd, &w->wv);
        llm_matrix_split(&w->w_gate, hp->ffn_dim, &w->w_up);
    }
    if (llm_layers_one_group(m, 0)) return llm_errf(err, errlen, LLM_ERR_NOMEM, "out of memory");
    return llm_load_rope(m, 0, &hp->rope, 0, err, errlen);
}

const llm_arch llm_arch_phi3 = {
    .name = "phi3",
    .read_hparams = phi3_hparams,
    .load = phi3_load,
    .forward = llm_llama_forward,
};
