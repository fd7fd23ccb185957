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
 * next. Among earlier occurrences of the last token, the one whose preceding
 * tokens agree with the end of hist for longest, compared up to
 * LLM_LOOKUP_CONTEXT_MAX tokens back, and the most recent among equals: a
 * copy in progress sits there. Measured on SmolLM2 at depth 4k copying a
 * 4,000-token list (scripts/lookup_bench.sh and two other lists), comparing
 * up to 3 tokens back beat 6, 12 and 64 (2.90 vs 2.70 tokens per pass, 3.08
 * vs 2.38): further back favours the source line, while the model often
 * repeats the line it just wrote. */
int32_t llm_lookup_draft(const int32_t *hist, int32_t n, int32_t max_draft, int32_t *draft) {
    if (!hist || !draft || n < 2 || max_draft < 1) return 0;
    const int32_t last = hist[n - 1];
    int32_t best = -1, best_len = 0;
    for (int32_t i = n - 2; i >= 0; i--) { /* i: where the candidate's context ends */
        if (hist[i] != last) continue;
        int32_t len = 1;
        while (len < LLM_LOOKUP_CONTEXT_MAX && len <= i && hist[i - len] == hist[n - 1 - len]) len++;
        if (len > best_len) best = i, best_len = len;
        if (best_len == LLM_LOOKUP_CONTEXT_MAX) break; /* none can be longer; this is the most recent */
    }
    if (best_len < LLM_LOOKUP_NGRAM_MIN) return 0;
    int32_t k = 0; /* best <= n - 2: at least one token follows */
    while (k < max_draft && best + 1 + k < n) {
        draft[k] = hist[best + 1 + k];
        k++;
    }
    return k;
}

int32_t llm_lookup_next_len(int32_t n_max, int32_t proposed, int32_t accepted) {
    if (accepted < proposed) return accepted + 1 < n_max ? accepted + 1 : n_max;
    return 2 * proposed < n_max ? 2 * proposed : n_max;
}
