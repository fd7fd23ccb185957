/* engine/model/arch_qwen.c - the `qwen2` (Qwen2, Qwen2.5) and `qwen3` (Qwen3 dense)
 * architectures. Both are the Llama decoder (engine/model/arch_llama.c: pre-norm
 * RMSNorm, SwiGLU, GQA, one full cache, logits through output.weight or the
 * tied token_embd), with these differences, as the GGUF convention encodes
 * them (llama.cpp's converter and graphs; HF transformers' Qwen2/Qwen3
 * models):
 *
 *   qwen2:  q, k, v = h Wq + bq, h Wk + bk, h Wv + bv   (biases on the three
 *           projections, none on Wo or the FFN)
 *   qwen3:  no biases; q and k normed per head before RoPE:
 *           q = rmsnorm_per_head(q) * attn_q_norm,  k = rmsnorm_per_head(k) * attn_k_norm
 *           (norm weights [d]); d = attention.key_length, which may differ
 *           from D / H (Qwen3 0.6B: 16 heads of 128 over D = 1024)
 *
 *   both:   RoPE split-half (NEOX, pairs (i, i + d/2)): the converter does not
 *           permute Wq and Wk for these architectures, unlike llama's;
 *           softmax scale 1/sqrt(d); ChatML prompts (from the file's template).
 *
 * The forward is llm_llama_forward, which acts on what the layer has: the
 * difference is data (the tensor tables below and the RoPE layout), not a
 * code path of its own. */
#include "layers.h"

static const llm_tensor_desc qwen2_tensors[] = {
    LLM_LLAMA_TENSORS,
    LLM_TENSOR("attn_q.bias", bq, LLM_SZ_Q, LLM_SZ_NONE, 0),
    LLM_TENSOR("attn_k.bias", bk, LLM_SZ_KV, LLM_SZ_NONE, 0),
    LLM_TENSOR("attn_v.bias", bv, LLM_SZ_KV, LLM_SZ_NONE, 0),
};

static const llm_tensor_desc qwen3_tensors[] = {
    LLM_LLAMA_TENSORS,
    LLM_TENSOR("attn_q_norm.weight", attn_q_norm, LLM_SZ_HEAD, LLM_SZ_NONE, 0),
    LLM_TENSOR("attn_k_norm.weight", attn_k_norm, LLM_SZ_HEAD, LLM_SZ_NONE, 0),
};

/* Whole heads rotated split-half: what both families' graphs assume. */
static int qwen_hparams(const llm_gguf *g, const char *arch, llm_hparams *hp, char *err, size_t errlen) {
    int rc = llm_read_common_hparams(g, arch, hp, err, errlen);
    if (rc) return rc;
    hp->rope.layout = KV_ROPE_NEOX;
    if (hp->rope.rot_dim != hp->head_dim)
        return llm_errf(err, errlen, LLM_ERR_MODEL, "%s rotates whole heads; rope.dimension_count is %d of %d", arch,
                        (int)hp->rope.rot_dim, (int)hp->head_dim);
    return LLM_OK;
}

static int qwen2_hparams(const llm_gguf *g, llm_hparams *hp, char *err, size_t errlen) {
    return qwen_hparams(g, "qwen2", hp, err, errlen);
}

static int qwen3_hparams(const llm_gguf *g, llm_hparams *hp, char *err, size_t errlen) {
    return qwen_hparams(g, "qwen3", hp, err, errlen);
}

static int qwen_load(llm_model *m, const llm_tensor_desc *table, int n, char *err, size_t errlen) {
    int rc = llm_load_layers(m, table, n, err, errlen);
    if (rc) return rc;
    if (llm_layers_one_group(m, 0)) return llm_errf(err, errlen, LLM_ERR_NOMEM, "out of memory");
    return llm_load_rope(m, 0, &m->hp.rope, 0, err, errlen);
}

static int qwen2_load(llm_model *m, char *err, size_t errlen) {
    return qwen_load(m, qwen2_tensors, (int)(sizeof qwen2_tensors / sizeof qwen2_tensors[0]), err, errlen);
}

static int qwen3_load(llm_model *m, char *err, size_t errlen) {
    return qwen_load(m, qwen3_tensors, (int)(sizeof qwen3_tensors / sizeof qwen3_tensors[0]), err, errlen);
}

const llm_arch llm_arch_qwen2 = {
    .name = "qwen2",
    .read_hparams = qwen2_hparams,
    .load = qwen2_load,
    .forward = llm_llama_forward,
};

const llm_arch llm_arch_qwen3 = {
    .name = "qwen3",
    .read_hparams = qwen3_hparams,
    .load = qwen3_load,
    .forward = llm_llama_forward,
};
