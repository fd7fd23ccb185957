/* engine/gen/session.c - one sequence's generation loop (engine/gen/session.h):
 * common-prefix reuse, chunked prefill, then sample -> text stream ->
 * forward until a stop reason, timed per phase. */
#include "session.h"
#include "choice.h"
#include "policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct llm_session {
    llm_context *c;      /* borrowed */
    int32_t seq;         /* its sequence in every cache of c */
    int32_t *toks;       /* [cap] what the sequence holds: [0, n_cached) in the cache, then at
                          * most one generated token not fed yet */
    int32_t n, n_cached, cap;
    float *logits;       /* [V] of the last position fed */
};

llm_gen_params llm_gen_default_params(void) {
    return (llm_gen_params){.max_tokens = 128, .sampler = llm_sampler_default_params()};
}

int llm_session_create(llm_context *c, llm_session **out) {
    *out = NULL;
    if (!c) return LLM_ERR_NULL;
    llm_session *s = calloc(1, sizeof *s);
    if (!s) return LLM_ERR_NOMEM;
    s->c = c;
    s->cap = 256;
    s->toks = malloc(sizeof(int32_t) * (size_t)s->cap);
    s->logits = malloc(sizeof(float) * (size_t)llm_model_n_vocab(llm_context_model(c)));
    int rc = s->toks && s->logits ? llm_seq_new(c, &s->seq) : LLM_ERR_NOMEM;
    if (rc != LLM_OK) {
        free(s->toks), free(s->logits), free(s);
        return rc;
    }
    *out = s;
    return LLM_OK;
}

void llm_session_free(llm_session *s) {
    if (!s) return;
    llm_seq_remove(s->c, s->seq);
    free(s->toks), free(s->logits), free(s);
}

const int32_t *llm_session_tokens(const llm_session *s, int32_t *n) {
    *n = s->n;
    return s->toks;
}
int32_t llm_session_n_cached(const llm_session *s) { return s->n_cached; }
int32_t llm_session_seq(const llm_session *s) { return s->seq; }

static int reserve_tokens(llm_session *s, int64_t n) {
    if (n <= s->cap) return LLM_OK;
    if (n > INT32_MAX / 2) return LLM_ERR_SHAPE;
    int32_t cap = (int32_t)(2 * n);
    int32_t *nt = realloc(s->toks, sizeof(int32_t) * (size_t)cap);
    if (!nt) return LLM_ERR_NOMEM;
    s->toks = nt, s->cap = cap;
    return LLM_OK;
}

/* Keeps toks[0..k) (k <= n): the cache is cut back when it holds more. A
 * window cache may refuse to go back that far; then the sequence starts
 * over, empty. */
static void cut_cache(llm_session *s, int32_t k) {
    if (k < s->n_cached) {
        llm_seq_publish(s->c, s->seq);   /* what is cut stays findable in the prefix cache */
        if (llm_seq_truncate(s->c, s->seq, k) != LLM_OK) {
            llm_seq_remove(s->c, s->seq);
            llm_seq_new(s->c, &s->seq); /* takes the slot just freed */
            k = 0;
        }
        s->n_cached = k;
    }
    s->n = k;
}

int llm_session_truncate(llm_session *s, int32_t n) {
    if (n < 0 || n > s->n) return LLM_ERR_LENGTH;
    cut_cache(s, n);
    return LLM_OK;
}

void llm_session_reset(llm_session *s) { llm_session_truncate(s, 0); }

int llm_session_shift(llm_session *s, int32_t n_keep, int32_t n_discard) {
    if (!s) return LLM_ERR_NULL;
    if (n_keep < 0 || n_discard < 0 || n_keep > s->n_cached - n_discard) return LLM_ERR_LENGTH;
    int rc = llm_context_shift(s->c, s->seq, n_keep, n_discard);
    if (rc != LLM_OK) return rc;
    memmove(s->toks + n_keep, s->toks + n_keep + n_discard, sizeof(int32_t) * (size_t)(s->n - n_keep - n_discard));
    s->n -= n_discard, s->n_cached -= n_discard;
    return LLM_OK;
}

int llm_session_save(const llm_session *s, const char *path, char *err, size_t errlen) {
    if (!s || !path) return LLM_ERR_NULL;
    return llm_session_file_save(s->c, s->seq, s->toks, s->n_cached, path, err, errlen) ? KV_ERR_IO : LLM_OK;
}

int llm_session_load(llm_session *s, const char *path, const int32_t *prompt, int32_t n, int32_t *n_restored,
                     char *err, size_t errlen) {
    if (!s || !path || !n_restored || (n > 0 && !prompt)) return LLM_ERR_NULL;
    *n_restored = 0;
    int rc = reserve_tokens(s, n);
    if (rc) return rc;
    /* the file goes into a sequence slot of its own: give up ours first */
    llm_seq_remove(s->c, s->seq);
    s->n = s->n_cached = 0;
    int32_t seq, got;
    if (llm_session_file_load(s->c, path, prompt, n, &seq, &got, err, errlen) != 0) {
        rc = llm_seq_new(s->c, &s->seq); /* takes the slot just freed */
        return rc ? rc : KV_ERR_IO;
    }
    s->seq = seq;
    memcpy(s->toks, prompt, sizeof(int32_t) * (size_t)got);
    s->n = s->n_cached = *n_restored = got;
    return LLM_OK;
}

static int check_ids(const llm_session *s, const int32_t *tokens, int32_t n) {
    int32_t V = llm_model_n_vocab(llm_context_model(s->c));
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V) return LLM_ERR_TOKEN;
    return LLM_OK;
}

int llm_session_feed(llm_session *s, const int32_t *tokens, int32_t n) {
    return llm_session_eval(s, tokens, n, n, NULL);
}

int llm_session_eval(llm_session *s, const int32_t *tokens, int32_t n, int32_t first, float *logits) {
    if (!s || n < 0 || (n > 0 && !tokens) || (!logits && first < n)) return LLM_ERR_NULL;
    if (first < 0 || first > n) return LLM_ERR_SHAPE;
    int rc = check_ids(s, tokens, n);
    if (!rc) rc = reserve_tokens(s, (int64_t)s->n + n);
    if (rc) return rc;
    memcpy(s->toks + s->n, tokens, sizeof(int32_t) * (size_t)n);
    const int32_t pending = s->n - s->n_cached; /* a generated token not yet in the cache */
    rc = llm_eval_from(s->c, s->seq, s->toks + s->n_cached, pending + n, pending + first, logits, NULL, NULL);
    if (rc) return rc; /* llm_eval_from put the sequence back: nothing changed */
    s->n += n, s->n_cached = s->n;
    return LLM_OK;
}

/* Sends text to the caller; nonzero when it asks to stop. */
static int show(const llm_gen_params *p, const char *text, size_t len) {
    return len && p->on_text ? p->on_text(p->user, text, len) : 0;
}

#define STOP(why, st, ...) \
    (res->reason = (why), res->status = (st), snprintf(res->message, sizeof res->message, __VA_ARGS__))

int llm_session_generate(llm_session *s, const int32_t *tokens, int32_t n, const llm_gen_params *p,
                         llm_gen_result *res) {
    memset(res, 0, sizeof *res);
    res->eog_token = -1, res->n_prompt = n;
    if (!s || !p || !tokens || n < 1) return STOP(LLM_STOP_ERROR, LLM_ERR_NULL, "no prompt tokens"), res->status;
    const int32_t n_ctx = llm_context_get_params(s->c).n_ctx;
    const int32_t n_batch = llm_context_get_params(s->c).n_batch;
    const llm_model *m = llm_context_model(s->c);
    const int32_t V = llm_model_n_vocab(m);
    if (p->reserve < 0 || p->n_stops < 0 || p->n_stops > LLM_MAX_STOPS)
        return STOP(LLM_STOP_ERROR, LLM_ERR_PARAM, "reserve < 0 or more than %d stop strings", LLM_MAX_STOPS), res->status;
    if (p->draft_lookup < 0 || p->draft_lookup > LLM_MAX_DRAFT || p->n_keep < 0)
        return STOP(LLM_STOP_ERROR, LLM_ERR_PARAM, "draft_lookup must be in [0, %d] and n_keep >= 0", LLM_MAX_DRAFT),
               res->status;
    if (check_ids(s, tokens, n))
        return STOP(LLM_STOP_ERROR, LLM_ERR_TOKEN, "a prompt token id is outside the vocabulary of %d", (int)V),
               res->status;
    if ((int64_t)n + (p->max_tokens != 0) + p->reserve > n_ctx) /* room for the prompt and one token */
        return STOP(LLM_STOP_CONTEXT, LLM_ERR_CAPACITY, "the prompt is %d tokens%s; the context holds %d", (int)n,
                    p->reserve ? " plus room for the end of turn" : "", (int)n_ctx),
               res->status;
    llm_choice ch;
    llm_choice_params cp = {.sampler = &p->sampler, .stops = p->stops, .n_stops = p->n_stops,
                            .max_tokens = p->max_tokens, .stream_flags = p->ignore_eog ? LLM_STREAM_IGNORE_EOG : 0,
                            .draft_max = p->draft_lookup, .prompt = tokens, .n_prompt = n};
    int rc = llm_choice_init(&ch, m, &cp, res->message, sizeof res->message);
    if (rc != LLM_OK) return res->reason = LLM_STOP_ERROR, res->status = rc;
    ch.on_logits = p->on_logits, ch.user = p->user;
    /* it never holds more than n_ctx tokens in the cache and one not fed yet */
    int64_t most = (int64_t)n + (p->max_tokens >= 0 ? p->max_tokens : n_ctx) + 1;
    rc = reserve_tokens(s, most < (int64_t)n_ctx + 1 ? most : (int64_t)n_ctx + 1);
    /* prompt lookup: drafts [N] and the logits of a verify pass [N + 1][V] */
    const int32_t n_draft_max = p->draft_lookup;
    int32_t *draft = n_draft_max ? malloc(sizeof(int32_t) * (size_t)n_draft_max) : NULL;
    float *rows = n_draft_max ? malloc(sizeof(float) * (size_t)(n_draft_max + 1) * (size_t)V) : NULL;
    if (rc != LLM_OK || (n_draft_max && (!draft || !rows))) {
        free(draft), free(rows);
        llm_choice_free(&ch);
        return STOP(LLM_STOP_ERROR, LLM_ERR_NOMEM, "out of memory"), res->status;
    }

    /* prefill what the cache does not hold yet (at least the last token, for its logits) */
    int32_t k = 0;
    while (k < n && k < s->n_cached && tokens[k] == s->toks[k]) k++;
    if (k == n) k = n - 1;
    cut_cache(s, k);
    k = s->n;
    if (k == 0) {   /* an empty sequence: the prefix cache may hold the start (a /reset, a window cut) */
        int32_t hit;
        if (llm_seq_prefix_match(s->c, s->seq, tokens, n - 1, &hit) == LLM_OK) k = s->n_cached = hit;
    }
    memcpy(s->toks, tokens, sizeof(int32_t) * (size_t)n);
    s->n = n;
    res->n_reused = k;
    double t0 = llm_pass_clock();
    rc = llm_eval(s->c, s->seq, tokens + k, n - k, 0, s->logits, p->progress, p->progress_user);
    res->t_prefill = llm_pass_clock() - t0;
    t0 = llm_pass_clock();
    if (rc != LLM_OK) {
        s->n = k;
        STOP(LLM_STOP_ERROR, rc, "prefill of %d tokens failed: %s", (int)(n - k), llm_status_str(rc));
    } else {
        s->n_cached = n;
    }

    /* feed -> llm_choice_next -> forward. With prompt lookup, a forward feeds
     * the sampled token and up to N drafts after it ([n_cached, n_cached + 1
     * + vk) in the cache); the next samples come from their rows, each draft
     * equal to its sample is already in the cache (vi counts them), and the
     * first that differs is cut off before the sample is fed. The samples
     * are those of plain decoding: row i is the model's output after the same
     * tokens. */
    float *cur = s->logits;  /* the logits to sample from */
    int32_t vk = 0, vi = 0;  /* drafts in the cache after n_cached, and how many were accepted */
    llm_pass_cost cost = {0}; /* the passes' measured costs, to judge how many drafts pay */
    while (rc == LLM_OK) {
        if (p->max_tokens == 0) {
            STOP(LLM_STOP_LENGTH, LLM_OK, "prefill only");
            break;
        }
        /* no position for the next token: shift or stop before sampling it (the drafts were
         * limited to the room left, so none is pending when the context is full) */
        if ((int64_t)s->n_cached + 1 + p->reserve > n_ctx) {
            int32_t keep, drop = vi == vk ? llm_choice_shift_plan(p->context_shift, p->n_keep, s->n_cached, &keep) : 0;
            if (!drop) {
                STOP(LLM_STOP_CONTEXT, LLM_OK, "context full: %d of %d positions (prompt %d, generated %d%s)%s",
                     (int)s->n_cached, (int)n_ctx, (int)n, (int)res->n_generated,
                     p->reserve ? ", room kept for the end of turn" : "",
                     p->context_shift ? "; nothing to drop after the kept positions" : "");
                break;
            }
            rc = llm_session_shift(s, keep, drop);
            if (rc != LLM_OK) {
                STOP(LLM_STOP_ERROR, rc, "context shift (keep %d, drop %d) failed: %s", (int)keep, (int)drop,
                     llm_status_str(rc));
                break;
            }
            res->n_shifts++, res->n_discarded += drop;
            continue;
        }
        int32_t tok;
        const char *text;
        size_t len;
        llm_stop_reason why = llm_choice_next(&ch, cur, &tok, &text, &len);
        if (why == LLM_STOP_CANCEL) {
            STOP(LLM_STOP_CANCEL, LLM_OK, "cancelled");
            break;
        }
        if (why == LLM_STOP_ERROR) {
            rc = ch.status;
            STOP(why, rc, "%s", ch.error);
            break;
        }
        int cancel = p->on_token && p->on_token(p->user, tok);
        if (show(p, text, len)) cancel = 1;
        if (why == LLM_STOP_EOG) {
            res->eog_token = tok;
            STOP(why, LLM_OK, "end of generation token %d", (int)tok);
            break;
        }
        if (reserve_tokens(s, (int64_t)s->n + 1)) {
            rc = LLM_ERR_NOMEM;
            STOP(LLM_STOP_ERROR, rc, "out of memory");
            break;
        }
        s->toks[s->n++] = tok;
        res->n_generated++;
        if (why != LLM_STOP_NONE || cancel) {
            STOP(why != LLM_STOP_NONE ? why : LLM_STOP_CANCEL, LLM_OK, "%s",
                 llm_stop_reason_str(why != LLM_STOP_NONE ? why : LLM_STOP_CANCEL));
            break;
        }
        if (vi < vk && tok == draft[vi]) { /* accepted: it is in the cache already */
            s->n_cached++, res->n_accepted++;
            cur = rows + (size_t)++vi * (size_t)V;
            continue;
        }
        llm_choice_verified(&ch, vk, vi, tok);
        if (vk && vi < vk && (rc = llm_seq_truncate(s->c, s->seq, s->n_cached)) != LLM_OK) { /* drafts from vi on: wrong */
            STOP(LLM_STOP_ERROR, rc, "rolling back rejected drafts failed: %s", llm_status_str(rc));
            break;
        }
        vk = vi = 0;
        /* room: positions after tok, rows of one pass */
        int64_t room = (int64_t)n_ctx - p->reserve - s->n_cached - 1;
        if (room > n_batch - 1) room = n_batch - 1;
        const int32_t nd = n_draft_max ? llm_choice_propose(&ch, s->toks, s->n, room, p->draft_fixed ? NULL : &cost, 0, 0, draft) : 0;
        res->n_passes++;
        double tp = llm_pass_clock();
        if (nd == 0) {
            rc = llm_eval(s->c, s->seq, &tok, 1, 0, s->logits, NULL, NULL);
            cur = s->logits;
        } else {
            int32_t feed[LLM_MAX_DRAFT + 1], row_start[2] = {0, nd + 1};
            uint8_t want[LLM_MAX_DRAFT + 1];
            feed[0] = tok;
            memcpy(feed + 1, draft, sizeof(int32_t) * (size_t)nd);
            memset(want, 1, sizeof want);
            llm_batch b = {.n_seqs = 1, .seqs = &s->seq, .row_start = row_start, .tokens = feed, .want = want};
            rc = llm_forward(s->c, &b, rows);
            cur = rows, vk = nd, res->n_drafted += nd;
        }
        if (n_draft_max) llm_pass_cost_add(&cost, 1 + nd, llm_pass_clock() - tp);
        if (rc != LLM_OK) {
            vk = 0;
            STOP(LLM_STOP_ERROR, rc, "decoding failed after %d tokens: %s", (int)res->n_generated, llm_status_str(rc));
            break;
        }
        s->n_cached++;
    }
    /* a stop in the middle of a verify pass: the drafts not taken leave the cache */
    if (vk > vi && llm_seq_truncate(s->c, s->seq, s->n_cached) != LLM_OK && rc == LLM_OK)
        STOP(LLM_STOP_ERROR, LLM_ERR_WINDOW, "rolling back rejected drafts failed");
    free(draft), free(rows);
    if (res->reason != LLM_STOP_STRING) {
        const char *text;
        size_t len;
        llm_textstream_flush(ch.ts, &text, &len);
        show(p, text, len);
    }
    res->t_decode = llm_pass_clock() - t0;
    llm_choice_free(&ch);
    return res->status;
}
