/* engine/text/tokenizer_gguf.h - the tokenizer description a GGUF file's metadata
 * gives (tokenizer.ggml.*), read into arrays a caller may inspect or change
 * before building the tokenizer with llm_tokenizer_create. */
#ifndef LLM_TOKENIZER_GGUF_H
#define LLM_TOKENIZER_GGUF_H

#include "../gguf/gguf.h"
#include "tokenizer.h"

typedef struct {
    llm_tokenizer_desc desc; /* points into the fields below and into the GGUF mapping */
    char model[32];          /* tokenizer.ggml.model */
    char pre[64];            /* tokenizer.ggml.pre */
    const char **tokens;     /* [n_vocab] token texts, in the mapping */
    int32_t *token_len;      /* [n_vocab] their byte lengths */
    int32_t *token_type;     /* [n_vocab] LLM_TOKEN_*, or NULL when the file has none */
    float *scores;           /* [n_vocab], or NULL when the file has none */
    const char **merges;     /* [n_merges] merge texts, in the mapping */
    int32_t *merge_len;      /* [n_merges] their byte lengths */
} llm_vocab_desc;

/* Reads g's vocabulary into v (valid while g stays open). LLM_OK, or
 * LLM_ERR_MODEL with a message naming the bad key; v then owns nothing. */
int llm_vocab_desc_read(const llm_gguf *g, llm_vocab_desc *v, char *err, size_t errlen);
void llm_vocab_desc_free(llm_vocab_desc *v);

#endif
