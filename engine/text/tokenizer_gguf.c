/* engine/text/tokenizer_gguf.c - a GGUF file's tokenizer metadata as an
 * llm_tokenizer_desc (tokenizer_gguf.h). */
#include "tokenizer_gguf.h"

#include <stdlib.h>
#include <string.h>

#include "../status.h"

void llm_vocab_desc_free(llm_vocab_desc *v) {
    free(v->tokens), free(v->token_len), free(v->token_type), free(v->scores);
    free(v->merges), free(v->merge_len);
    memset(v, 0, sizeof *v);
}

int llm_vocab_desc_read(const llm_gguf *g, llm_vocab_desc *v, char *err, size_t errlen) {
    memset(v, 0, sizeof *v);
    llm_gguf_str model_s, pre_s;
    llm_gguf_arr toks, merges, scores, types;
    if (llm_gguf_get_str(g, "tokenizer.ggml.model", &model_s) != LLM_GGUF_OK)
        return llm_errf(err, errlen, LLM_ERR_MODEL, "missing tokenizer.ggml.model");
    if (llm_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks) != LLM_GGUF_OK || toks.type != LLM_GGUF_STR)
        return llm_errf(err, errlen, LLM_ERR_MODEL, "missing tokenizer.ggml.tokens (an array of strings)");
    if (toks.n == 0 || toks.n > INT32_MAX / 8)
        return llm_errf(err, errlen, LLM_ERR_MODEL, "tokenizer.ggml.tokens holds %llu tokens", (unsigned long long)toks.n);
    int has_merges = llm_gguf_get_arr(g, "tokenizer.ggml.merges", &merges) == LLM_GGUF_OK;
    int has_scores = llm_gguf_get_arr(g, "tokenizer.ggml.scores", &scores) == LLM_GGUF_OK;
    int has_types = llm_gguf_get_arr(g, "tokenizer.ggml.token_type", &types) == LLM_GGUF_OK;
    if (has_merges && (merges.type != LLM_GGUF_STR || merges.n > (1u << 24)))
        return llm_errf(err, errlen, LLM_ERR_MODEL, "tokenizer.ggml.merges is not an array of strings");
    if (has_scores && (scores.n != toks.n || (scores.type != LLM_GGUF_F32 && scores.type != LLM_GGUF_F64)))
        return llm_errf(err, errlen, LLM_ERR_MODEL, "tokenizer.ggml.scores: want %llu floats", (unsigned long long)toks.n);
    if (has_types && (types.n != toks.n || types.type == LLM_GGUF_STR || types.type >= LLM_GGUF_F32))
        return llm_errf(err, errlen, LLM_ERR_MODEL, "tokenizer.ggml.token_type: want %llu integers", (unsigned long long)toks.n);

    int32_t nv = (int32_t)toks.n, nm = has_merges ? (int32_t)merges.n : 0;
    v->tokens = malloc(sizeof *v->tokens * (size_t)nv);
    v->token_len = malloc(sizeof *v->token_len * (size_t)nv);
    v->token_type = has_types ? malloc(sizeof *v->token_type * (size_t)nv) : NULL;
    v->scores = has_scores ? malloc(sizeof *v->scores * (size_t)nv) : NULL;
    v->merges = malloc(sizeof *v->merges * (size_t)(nm ? nm : 1));
    v->merge_len = malloc(sizeof *v->merge_len * (size_t)(nm ? nm : 1));
    if (!v->tokens || !v->token_len || !v->merges || !v->merge_len || (has_types && !v->token_type) ||
        (has_scores && !v->scores)) {
        llm_vocab_desc_free(v);
        return llm_errf(err, errlen, LLM_ERR_MODEL, "out of memory reading the vocabulary");
    }
    for (int32_t i = 0; i < nv; i++) {
        llm_gguf_str s = llm_gguf_arr_str(&toks, (uint64_t)i);
        if (s.len > 1024) {
            llm_vocab_desc_free(v);
            return llm_errf(err, errlen, LLM_ERR_MODEL, "token %d is %llu bytes long", (int)i, (unsigned long long)s.len);
        }
        v->tokens[i] = s.ptr, v->token_len[i] = (int32_t)s.len;
        if (has_types) v->token_type[i] = (int32_t)llm_gguf_arr_i64(&types, (uint64_t)i);
        if (has_scores) v->scores[i] = llm_gguf_arr_f32(&scores, (uint64_t)i);
    }
    for (int32_t i = 0; i < nm; i++) {
        llm_gguf_str s = llm_gguf_arr_str(&merges, (uint64_t)i);
        if (s.len > 2048) {
            llm_vocab_desc_free(v);
            return llm_errf(err, errlen, LLM_ERR_MODEL, "merge %d is %llu bytes long", (int)i, (unsigned long long)s.len);
        }
        v->merges[i] = s.ptr, v->merge_len[i] = (int32_t)s.len;
    }
    llm_tokenizer_desc *d = &v->desc;
    *d = llm_tokenizer_desc_default();
    d->model = llm_gguf_str_copy(model_s, v->model, sizeof v->model);
    if (llm_gguf_get_str(g, "tokenizer.ggml.pre", &pre_s) == LLM_GGUF_OK)
        d->pre = llm_gguf_str_copy(pre_s, v->pre, sizeof v->pre);
    d->n_vocab = nv, d->tokens = v->tokens, d->token_len = v->token_len;
    d->scores = v->scores, d->token_type = v->token_type;
    d->n_merges = nm, d->merges = v->merges, d->merge_len = v->merge_len;
    d->bos_id = llm_gguf_i32_or(g, "tokenizer.ggml.bos_token_id", -1);
    d->eos_id = llm_gguf_i32_or(g, "tokenizer.ggml.eos_token_id", -1);
    d->unk_id = llm_gguf_i32_or(g, "tokenizer.ggml.unknown_token_id", -1);
    d->pad_id = llm_gguf_i32_or(g, "tokenizer.ggml.padding_token_id", -1);
    /* SentencePiece vocabularies start with BOS unless told otherwise; BPE ones do not */
    d->add_bos = llm_gguf_bool_or(g, "tokenizer.ggml.add_bos_token", strcmp(v->model, "llama") == 0);
    d->add_eos = llm_gguf_bool_or(g, "tokenizer.ggml.add_eos_token", 0);
    d->add_space_prefix = llm_gguf_bool_or(g, "tokenizer.ggml.add_space_prefix", -1);
    return LLM_OK;
}
