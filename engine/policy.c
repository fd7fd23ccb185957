/* engine/policy.c - the context shift and prompt-lookup drafting of
 * engine/policy.h (session files are engine/session_file.c). */
#include "policy.h"
#include "arch.h"

/* The RoPE table of a cache group's layers (they share one: a group is the
 * layers of one window), or NULL when they differ. */
static const kv_rope *group_rope(const llm_model *m, int32_t group) {
    int32_t r = -1;
    for (int32_t l = 0; l < m->hp.n_layers; l++) {
        if (m->lhp[l].group != group) continue;
        if (r >= 0 && m->lhp[l].rope != r) return NULL;
        r = m->lhp[l].rope;
    }
    return r >= 0 ? &m->ropes[r] : NULL;
}

int llm_context_shift(llm_context *c, int32_t seq, int32_t n_keep, int32_t n_discard) {
    if (!c) return LLM_ERR_NULL;
    const llm_model *m = c->m;
    for (int32_t g = 0; g < c->n_caches; g++)
        if (!group_rope(m, g)) return KV_ERR_UNSUPPORTED;
    /* window caches first: they are the ones that can refuse (the next query
     * would need a key they evicted), and their refusal changes nothing */
    int rc = LLM_OK;
    for (int32_t i = c->n_caches - 1; i >= 0 && rc == LLM_OK; i--) {
        int32_t g = c->order[i];
        rc = kv_seq_shift(c->caches[g], seq, n_keep, n_discard, group_rope(m, g));
    }
    return rc;
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
