/* engine/gen/choice.c - one generated sequence's rules between forward passes
 * (engine/gen/choice.h): sample, stream, drafts, shift. */
#include "choice.h"
#include "policy.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

int llm_choice_init(llm_choice *ch, const llm_model *m, const llm_choice_params *p, char *err, size_t errlen) {
    memset(ch, 0, sizeof *ch);
    ch->foreseen = -1;
    if (!m || !p || !p->sampler || (p->n_prompt > 0 && !p->prompt)) return llm_errf(err, errlen, LLM_ERR_NULL, "missing argument");
    if (p->draft_max < 0 || p->draft_max > LLM_MAX_DRAFT)
        return llm_errf(err, errlen, LLM_ERR_PARAM, "draft_lookup must be in [0, %d]", LLM_MAX_DRAFT);
    ch->n_vocab = llm_model_n_vocab(m);
    if (llm_sampler_init(&ch->sampler, p->sampler, ch->n_vocab) != 0)
        return llm_errf(err, errlen, LLM_ERR_PARAM,
                        "bad sampling parameters (top_k >= 0, 0 < top_p <= 1, 0 <= min_p <= 1, repeat_penalty >= 0, "
                        "penalties in [-2, 2], logit_bias ids in the vocabulary and values in [-100, 100])");
    int rc = llm_textstream_create(llm_model_tokenizer(m), p->stops, p->n_stops, p->max_tokens, p->stream_flags, &ch->ts);
    if (rc != LLM_OK) {
        llm_sampler_free(&ch->sampler);
        memset(ch, 0, sizeof *ch);
        return rc == LLM_ERR_NOMEM ? llm_errf(err, errlen, rc, "out of memory")
                                   : llm_errf(err, errlen, LLM_ERR_PARAM, "bad stop strings (at most %d, none empty)",
                                              LLM_MAX_STOPS);
    }
    llm_sampler_accept_prompt(&ch->sampler, p->prompt, p->n_prompt);
    ch->max_tokens = p->max_tokens;
    ch->draft_max = p->draft_max;
    llm_lookup_ctl_init(&ch->lookup, p->draft_max);
    return LLM_OK;
}

void llm_choice_free(llm_choice *ch) {
    if (!ch || !ch->ts) return;
    llm_sampler_free(&ch->sampler);
    llm_textstream_free(ch->ts);
    ch->ts = NULL;
}

/* Sixteen at a time in an inner loop of fixed length, which the compiler
 * takes as vector operations: an early exit per element made this a
 * visible part of a decode step on large vocabularies. */
int llm_all_finite(const float *x, int32_t n) {
    int bad = 0;
    int32_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int32_t k = 0; k < 16; k++) bad |= !(fabsf(x[i + k]) <= FLT_MAX);
    for (; i < n; i++) bad |= !(fabsf(x[i]) <= FLT_MAX);
    return !bad;
}

llm_stop_reason llm_choice_next(llm_choice *ch, float *logits, int32_t *token, const char **text, size_t *len) {
    *token = -1, *text = "", *len = 0;
    if (!llm_all_finite(logits, ch->n_vocab)) {
        ch->status = LLM_ERR_NONFINITE;
        snprintf(ch->error, sizeof ch->error, "the logits after %d generated tokens are not finite (NaN or infinity): "
                 "nothing sampled", (int)ch->n_generated);
        return LLM_STOP_ERROR;
    }
    if (ch->on_logits && ch->on_logits(ch->user, logits, ch->n_vocab)) return LLM_STOP_CANCEL;
    const int32_t tok = llm_sample(&ch->sampler, logits);
    llm_stop_reason why = llm_textstream_push(ch->ts, tok, text, len);
    *token = tok;
    if (why == LLM_STOP_ERROR) {
        ch->status = LLM_ERR_TOKEN;
        snprintf(ch->error, sizeof ch->error, "sampled token %d cannot be rendered", (int)tok);
    } else if (why != LLM_STOP_EOG) {
        ch->n_generated++;
    }
    return why;
}

int32_t llm_choice_propose(llm_choice *ch, const int32_t *hist, int32_t n, int64_t room, const llm_pass_cost *cost,
                           int32_t rows_other, double tokens_other, int32_t *draft) {
    ch->foreseen = -1;
    if (ch->draft_max <= 0) return 0;
    int64_t lim = cost ? llm_lookup_ctl_next(&ch->lookup, cost, rows_other, tokens_other) : ch->draft_max;
    lim = lim < room ? lim : room;
    if (ch->max_tokens >= 0 && lim > (int64_t)ch->max_tokens - ch->n_generated - 1)
        lim = (int64_t)ch->max_tokens - ch->n_generated - 1;
    if (lim <= 0) return 0;
    /* one token more than proposed: whether the model goes on to it tells the controller if the run does */
    int32_t look[LLM_MAX_DRAFT + 1];
    int32_t nd = llm_lookup_draft(hist, n, (int32_t)lim + 1, look);
    if (nd > lim) ch->foreseen = look[--nd];
    memcpy(draft, look, (size_t)nd * sizeof *draft);
    return nd;
}

void llm_choice_verified(llm_choice *ch, int32_t proposed, int32_t accepted, int32_t next) {
    int foreseen = accepted < proposed || ch->foreseen < 0 ? -1 : next == ch->foreseen;
    llm_lookup_ctl_seen(&ch->lookup, proposed, accepted, foreseen);
}

int32_t llm_choice_shift_plan(int context_shift, int32_t n_keep, int32_t n_cached, int32_t *keep) {
    *keep = n_keep > 4 ? n_keep : 4;
    if (!context_shift || *keep >= n_cached) return 0;
    return llm_shift_discard(n_cached, *keep);
}
