/* engine/policy.c - the context shift and prompt-lookup drafting of
 * engine/policy.h (session files are engine/session_file.c). */
#include "policy.h"

int llm_context_shift(llm_context *c, int32_t seq, int32_t n_keep, int32_t n_discard) {
    if (!c) return KV_ERR_NULL;
    return kv_seq_shift(llm_context_cache(c), seq, n_keep, n_discard, &llm_context_model(c)->rope);
}

int32_t llm_shift_discard(int32_t n_ctx, int32_t n_keep) {
    int32_t n = (n_ctx - n_keep) / 2;
    return n < 1 ? 1 : n;
}

/* Prompt lookup (Saxena's "prompt lookup decoding", llama.cpp's lookup): in
 * text that copies its input (summaries, edits, code, lists) the tokens after
 * an earlier occurrence of the current n-gram are a good guess of what comes
 * next. Longer n-grams first: they are rarer and more often right. The most
 * recent occurrence wins, since a copy in progress sits there. */
int32_t llm_lookup_draft(const int32_t *hist, int32_t n, int32_t max_draft, int32_t *draft) {
    if (!hist || !draft || n < 2 || max_draft < 1) return 0;
    for (int32_t g = n - 1 < LLM_LOOKUP_NGRAM_MAX ? n - 1 : LLM_LOOKUP_NGRAM_MAX; g >= LLM_LOOKUP_NGRAM_MIN; g--) {
        const int32_t *pat = hist + n - g;
        for (int32_t i = n - g - 1; i >= 0; i--) {
            int32_t j = 0;
            while (j < g && hist[i + j] == pat[j]) j++;
            if (j < g) continue;
            int32_t from = i + g, k = 0; /* from <= n - 1: at least one token follows */
            while (k < max_draft && from + k < n) {
                draft[k] = hist[from + k];
                k++;
            }
            return k;
        }
    }
    return 0;
}
