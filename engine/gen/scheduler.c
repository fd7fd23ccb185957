/* engine/gen/scheduler.c - continuous batching (see scheduler.h): create and
 * submit, admission with prefix reuse, one ragged step, preemption
 * by recomputation, fork for n choices, the cache policies (context shift,
 * prompt-lookup drafts verified as extra rows; session files are in
 * scheduler_session.c), and the thread-safe inbox. The records are in
 * sched_records.h. */
#include "sched_records.h"
#include "policy.h"
#include "tier.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- create, submit */

llm_sched_params llm_sched_default_params(void) {
    return (llm_sched_params){.batch_tokens = 512, .max_running = 0, .max_waiting = 256, .context_shift = 0,
                              .n_keep = 0, .draft_lookup = 0};
}

static void req_free(sched_req *r) {
    if (!r) return;
    llm_tier_drop(r->load);   /* a request cancelled while its pages load */
    free(r->session);
    for (int32_t i = 0; i < r->n_choices; i++) {
        free(r->ch[i].tokens);
        llm_choice_free(&r->ch[i].c);
    }
    free(r);
}

/* The disk tier's reader: a load is ready, the waiting request can go on. */
static void load_ready(void *user) {
    llm_sched *s = user;
    pthread_mutex_lock(&s->mu);
    s->load_ready = 1;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
}

int llm_sched_create(llm_context *c, const llm_sched_params *pp, llm_sched **out) {
    if (!c || !out) return LLM_ERR_NULL;
    *out = NULL;
    llm_sched_params p = pp ? *pp : llm_sched_default_params();
    llm_context_params cp = llm_context_get_params(c);
    if (p.batch_tokens < 1 || p.max_running < 0 || p.max_waiting < 0) return LLM_ERR_PARAM;
    if ((p.context_shift != 0 && p.context_shift != 1) || (p.no_prefix != 0 && p.no_prefix != 1) || p.n_keep < 0 || p.draft_lookup < 0 ||
        p.draft_lookup > LLM_MAX_DRAFT)
        return LLM_ERR_PARAM;
    if (p.n_keep < 4) p.n_keep = 4;
    if (p.batch_tokens > cp.n_batch) p.batch_tokens = cp.n_batch;
    llm_sched *s = calloc(1, sizeof *s);
    if (!s) return LLM_ERR_NOMEM;
    s->c = c, s->m = llm_context_model(c), s->cache = llm_context_cache(c), s->p = p;
    kv_cache_params kp = kv_cache_get_params(s->cache);
    s->n_ctx = cp.n_ctx, s->n_slots = kp.max_seqs, s->page_size = kp.page_size, s->n_pages = kp.n_pages;
    s->V = llm_model_n_vocab(s->m);
    if (!s->p.max_running || s->p.max_running > s->n_slots) s->p.max_running = s->n_slots;
    size_t ns = (size_t)s->n_slots, nr = (size_t)p.batch_tokens;
    s->running = calloc(ns, sizeof *s->running);
    s->ended = calloc(ns, sizeof *s->ended);
    s->b_seqs = malloc(sizeof(int32_t) * ns);
    s->b_rows = malloc(sizeof(int32_t) * (ns + 1));
    s->b_tokens = malloc(sizeof(int32_t) * nr);
    s->b_want = malloc(nr);
    s->b_ch = malloc(sizeof *s->b_ch * ns);
    /* wanted rows: one per sequence, and the drafts' rows, within the batch */
    int64_t n_out = (int64_t)ns * (1 + p.draft_lookup);
    s->n_out_max = (int32_t)(n_out < (int64_t)p.batch_tokens ? n_out : p.batch_tokens);
    if (s->n_out_max < (int32_t)ns) s->n_out_max = (int32_t)ns;
    s->logits = malloc(sizeof(float) * (size_t)s->n_out_max * (size_t)s->V);
    s->lsm = malloc(sizeof(float) * (size_t)s->V);
    s->next_id = 1;
    if (!s->running || !s->ended || !s->b_seqs || !s->b_rows || !s->b_tokens || !s->b_want || !s->b_ch || !s->logits ||
        !s->lsm || pthread_mutex_init(&s->mu, NULL)) {
        free(s->running), free(s->ended), free(s->b_seqs), free(s->b_rows), free(s->b_tokens), free(s->b_want);
        free(s->b_ch), free(s->logits), free(s->lsm), free(s);
        return LLM_ERR_NOMEM;
    }
    pthread_cond_init(&s->wake, NULL);
    s->idle = 1;
    if (s->p.tier) llm_tier_set_notify(s->p.tier, load_ready, s);
    *out = s;
    return LLM_OK;
}

static int refuse(char *err, size_t errlen, int code, const char *fmt, long a, long b) {
    if (err && errlen) snprintf(err, errlen, fmt, a, b);
    return code;
}

int llm_sched_submit(llm_sched *s, const llm_sched_request *r, uint64_t *id, char *err, size_t errlen) {
    if (err && errlen) err[0] = 0;
    if (!s || !r || !r->cb || (!r->prompt && r->n_prompt > 0)) return refuse(err, errlen, LLM_ERR_NULL, "missing argument", 0, 0);
    if (r->n_prompt < 1) return refuse(err, errlen, LLM_ERR_PARAM, "the prompt is empty", 0, 0);
    if (r->n_choices < 1 || r->n_choices > LLM_SCHED_MAX_CHOICES)
        return refuse(err, errlen, LLM_ERR_PARAM, "n must be in [1, %ld]", LLM_SCHED_MAX_CHOICES, 0);
    if (r->n_choices > s->n_slots)
        return refuse(err, errlen, LLM_ERR_TOO_LARGE, "n = %ld exceeds the %ld parallel sequences", r->n_choices,
                      s->n_slots);
    if (r->top_logprobs > LLM_SCHED_MAX_TOP)
        return refuse(err, errlen, LLM_ERR_PARAM, "top_logprobs must be in [0, %ld]", LLM_SCHED_MAX_TOP, 0);
    if (r->n_stops < 0 || r->n_stops > LLM_MAX_STOPS || (r->n_stops && !r->stops))
        return refuse(err, errlen, LLM_ERR_PARAM, "at most %ld stop strings", LLM_MAX_STOPS, 0);
    for (int32_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= s->V)
            return refuse(err, errlen, LLM_ERR_PARAM, "token id %ld is outside the vocabulary of %ld", r->prompt[i], s->V);
    if (r->n_prompt >= s->n_ctx)
        return refuse(err, errlen, LLM_ERR_TOO_LARGE, "request of %ld tokens exceeds the context of %ld",
                      r->n_prompt, s->n_ctx);
    /* the prompt and its first token, plus one copied page per extra choice */
    int32_t need = pages_for(r->n_prompt + 1, s->page_size) + r->n_choices - 1;
    if (need > s->n_pages)
        return refuse(err, errlen, LLM_ERR_TOO_LARGE, "request needs %ld KV pages; the pool has %ld", need, s->n_pages);

    sched_req *q = calloc(1, sizeof *q + sizeof(sched_seq) * (size_t)r->n_choices);
    if (!q) return refuse(err, errlen, LLM_ERR_NOMEM, "out of memory", 0, 0);
    q->cb = r->cb, q->user = r->user, q->n_prompt = r->n_prompt, q->n_choices = r->n_choices;
    q->top = r->top_logprobs;
    if (r->session && !(q->session = strdup(r->session))) {
        free(q);
        return refuse(err, errlen, LLM_ERR_NOMEM, "out of memory", 0, 0);
    }
    int64_t gen = r->max_tokens < 0 || r->max_tokens > s->n_ctx ? s->n_ctx : r->max_tokens;
    int32_t cap = (int32_t)(r->n_prompt + gen + 1);
    /* with shifts the tokens kept never pass the context and one not fed; a
     * request without a limit stops after n_ctx tokens, not never */
    int32_t max_tokens = r->max_tokens;
    if (s->p.context_shift) cap = s->n_ctx + 1, max_tokens = max_tokens < 0 ? s->n_ctx : max_tokens;
    const int greedy = !(r->sampler.temp > 0);
    for (int32_t i = 0; i < r->n_choices; i++) {
        sched_seq *ch = &q->ch[i];
        ch->seq = -1, ch->cap = cap, ch->out_row = -1;
        llm_sampler_params sp = r->sampler;
        sp.seed += (uint64_t)i;
        llm_choice_params cp = {.sampler = &sp, .stops = r->stops, .n_stops = r->n_stops, .max_tokens = max_tokens,
                                .draft_max = greedy ? s->p.draft_lookup : 0, .prompt = r->prompt,
                                .n_prompt = r->n_prompt};
        ch->tokens = malloc(sizeof(int32_t) * (size_t)cap);
        int rc = ch->tokens ? llm_choice_init(&ch->c, s->m, &cp, err, errlen) : LLM_ERR_NOMEM;
        if (rc) {
            req_free(q);
            return rc == LLM_ERR_NOMEM ? refuse(err, errlen, LLM_ERR_NOMEM, "out of memory", 0, 0) : rc;
        }
        memcpy(ch->tokens, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
        ch->n_tokens = r->n_prompt;
    }
    pthread_mutex_lock(&s->mu);
    int rc = s->stopping ? LLM_ERR_STOPPED : s->n_inbox + s->snap.waiting >= s->p.max_waiting ? LLM_ERR_QUEUE_FULL : 0;
    if (!rc) {
        q->id = s->next_id++;
        if (id) *id = q->id;
        if (s->in_tail) s->in_tail->next = q; else s->in_head = q;
        s->in_tail = q;
        s->n_inbox++;
        pthread_cond_signal(&s->wake);
    }
    pthread_mutex_unlock(&s->mu);
    if (rc) {
        req_free(q);
        return refuse(err, errlen, rc, rc == LLM_ERR_STOPPED ? "the server is shutting down"
                                                             : "too many requests are waiting (%ld)", s->p.max_waiting, 0);
    }
    return 0;
}

void llm_sched_cancel(llm_sched *s, uint64_t id) {
    pthread_mutex_lock(&s->mu);
    if (s->n_cancels == s->cap_cancels) {
        int32_t nc = s->cap_cancels ? 2 * s->cap_cancels : 16;
        uint64_t *p = realloc(s->cancels, sizeof *p * (size_t)nc);
        if (p) s->cancels = p, s->cap_cancels = nc;
    }
    if (s->n_cancels < s->cap_cancels) s->cancels[s->n_cancels++] = id;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
}

void llm_sched_stop(llm_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
}

llm_sched_stats llm_sched_get_stats(llm_sched *s) {
    pthread_mutex_lock(&s->mu);
    llm_sched_stats st = s->snap;
    st.waiting += s->n_inbox;
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* ---------------------------------------------------------------- ending */

static void release(llm_sched *s, sched_seq *ch) {
    if (ch->seq >= 0) llm_seq_remove(s->c, ch->seq);
    ch->seq = -1, ch->n_cached = 0;
}

static int req_finished(const sched_req *r) {
    for (int32_t i = 0; i < r->n_choices; i++)
        if (r->ch[i].stop == LLM_STOP_NONE) return 0;
    return 1;
}

/* Ends one choice: the held-back text, the finish event, its pages. */
static void finish_choice(llm_sched *s, sched_req *r, int32_t i, llm_stop_reason why, const char *error) {
    sched_seq *ch = &r->ch[i];
    if (ch->stop != LLM_STOP_NONE) return;
    ch->stop = why;
    if (i == 0 && r->session && ch->seq >= 0 && why != LLM_STOP_CANCEL && why != LLM_STOP_ERROR)
        llm_sched_session_save(s, r, ch);
    release(s, ch);
    llm_sched_event ev = {.choice = i, .token = -1, .text = "", .finish = why, .n_prompt = r->n_prompt,
                          .n_cached = r->n_cached_first, .n_restored = r->n_restored,
                          .n_generated = ch->c.n_generated, .error = error,
                          .status = why != LLM_STOP_ERROR ? LLM_OK : ch->c.status ? ch->c.status : LLM_ERR_PARAM};
    if (why != LLM_STOP_STRING && why != LLM_STOP_CANCEL && why != LLM_STOP_ERROR)
        llm_textstream_flush(ch->c.ts, &ev.text, &ev.text_len);
    r->cb(r->user, &ev);
}

/* The done event; the record is freed (the caller unlinks it first). */
static void deliver_done(sched_req *r) {
    llm_sched_event ev = {.choice = -1, .token = -1, .text = "", .done = 1, .n_prompt = r->n_prompt,
                          .n_cached = r->n_cached_first, .n_restored = r->n_restored};
    for (int32_t i = 0; i < r->n_choices; i++) ev.n_generated += r->ch[i].c.n_generated;
    r->cb(r->user, &ev);
    req_free(r);
}

static void end_request(llm_sched *s, sched_req *r, llm_stop_reason why, const char *error) {
    for (int32_t i = 0; i < r->n_choices; i++) finish_choice(s, r, i, why, error);
}

static void unlink_running(llm_sched *s, int32_t k) {
    memmove(s->running + k, s->running + k + 1, sizeof *s->running * (size_t)(s->n_running - k - 1));
    s->n_running--;
}

static void snapshot(llm_sched *s);

/* Running requests whose every choice ended: slots back, then done events.
 * The counters are published in between, so a client that has its response
 * reads metrics that count its ending (its pages freed, its tokens). */
static void reap(llm_sched *s) {
    int32_t n = 0;
    for (int32_t k = 0; k < s->n_running;) {
        sched_req *r = s->running[k];
        if (!req_finished(r)) { k++; continue; }
        unlink_running(s, k);
        s->ended[n++] = r;
    }
    if (!n) return;
    snapshot(s);
    for (int32_t i = 0; i < n; i++) deliver_done(s->ended[i]);
}

static void cancel_id(llm_sched *s, uint64_t id) {
    for (int32_t k = 0; k < s->n_running; k++)
        if (s->running[k]->id == id) { end_request(s, s->running[k], LLM_STOP_CANCEL, NULL); return; }
    for (sched_req **pp = &s->wait_head; *pp; pp = &(*pp)->next) {
        sched_req *r = *pp;
        if (r->id != id) continue;
        *pp = r->next;
        if (s->wait_tail == r) {
            s->wait_tail = NULL;
            for (sched_req *t = s->wait_head; t; t = t->next) s->wait_tail = t;
        }
        s->n_waiting--;
        end_request(s, r, LLM_STOP_CANCEL, NULL);
        deliver_done(r);
        return;
    }
}

/* ---------------------------------------------------------------- admission, preemption */

static int32_t slots_held(const llm_sched *s) {
    int32_t n = 0;
    for (int32_t k = 0; k < s->n_running; k++)
        for (int32_t i = 0; i < s->running[k]->n_choices; i++) n += s->running[k]->ch[i].stop == LLM_STOP_NONE;
    return n;
}

/* Choices of r that get a sequence when it is admitted: before the fork only
 * the first (the others are born from it). */
static int32_t choices_to_place(const sched_req *r) {
    if (!r->forked) return r->ch[0].stop == LLM_STOP_NONE;
    int32_t n = 0;
    for (int32_t i = 0; i < r->n_choices; i++) n += r->ch[i].stop == LLM_STOP_NONE;
    return n;
}

/* A new sequence for ch holding the longest prefix of its tokens the prefix
 * cache has (with *load, a ready load of the disk tier: also what it read;
 * the load is used up), one token short (it is fed: its logits choose the
 * next token); sets ch->n_cached. 0, or -1 (ch->seq = -1) when no sequence
 * is free. */
static int place(llm_sched *s, sched_seq *ch, llm_tier_load **load) {
    if (llm_seq_new(s->c, &ch->seq) != LLM_OK) {
        ch->seq = -1;
        return -1;
    }
    int32_t matched = 0;
    if (load && *load) {   /* every cache group, from RAM and the pages read */
        matched = llm_tier_apply(*load, ch->seq, ch->tokens, ch->n_tokens - 1);
        *load = NULL;
    } else if (!s->p.no_prefix && ch->n_tokens > 1) {   /* every cache group */
        if (llm_seq_prefix_match(s->c, ch->seq, ch->tokens, ch->n_tokens - 1, &matched) != LLM_OK) matched = 0;
    }
    ch->n_cached = matched;
    return 0;
}

/* Gives r sequences, reusing the longest cached prefix of each choice. Fails
 * (leaving r as it was) when the pool cannot hold the rest while others
 * run. Returns 1 when admitted. */
static int try_admit(llm_sched *s, sched_req *r) {
    int32_t alive = 0;
    for (int32_t i = 0; i < r->n_choices; i++) alive += r->ch[i].stop == LLM_STOP_NONE;
    if (s->n_running >= s->p.max_running || slots_held(s) + alive > s->n_slots) return 0;
    int32_t need = 0, queried = 0, hit = 0, n_place = choices_to_place(r), nb = 0;
    s->b_rows[0] = 0;
    for (int32_t i = 0, placed = 0; i < r->n_choices && placed < n_place; i++) {
        sched_seq *ch = &r->ch[i];
        if (ch->stop != LLM_STOP_NONE) continue;
        placed++;
        if (place(s, ch, i == 0 ? &r->load : NULL)) goto undo;
        queried += ch->n_tokens - 1, hit += ch->n_cached;
        /* the rest of its tokens and the first one generated */
        s->b_seqs[nb] = ch->seq, s->b_rows[nb + 1] = s->b_rows[nb] + ch->n_tokens + 1 - ch->n_cached, nb++;
    }
    if (s->n_running > 0) {
        /* what reserving all of it would take, as the caches count it (a
         * matched prefix holds pages the stats already count as used) */
        kv_reserve_cost k;
        kv_batch kb = {.n_seqs = nb, .seqs = s->b_seqs, .row_start = s->b_rows};
        if (llm_context_reserve_cost(s->c, &kb, s->p.batch_tokens, &k)) goto undo;
        need = k.used_delta;
        kv_cache_stats cs = llm_context_stats(s->c);
        /* a small watermark (vLLM's 1%): growth past it preempts the newest */
        if (!k.fits || cs.pages_free + cs.pages_cached < need + s->n_pages / 100 + 1) goto undo;
    } else {
        for (int32_t i = 0; i < nb; i++) need += pages_for(s->b_rows[i + 1] - s->b_rows[i], s->page_size);
    }
    if (!r->admitted && r->session && llm_sched_session_restore(s, r, need) && place(s, &r->ch[0], NULL)) goto undo;
    if (!r->admitted) {
        r->admitted = 1;
        r->n_cached_first = r->ch[0].n_cached < r->n_prompt ? r->ch[0].n_cached : r->n_prompt;
        s->st.prompt_tokens += (uint64_t)r->n_prompt;
    }
    s->st.prefix_queries += (uint64_t)queried, s->st.prefix_hits += (uint64_t)hit;
    s->running[s->n_running++] = r;   /* ids grow, and a preempted (older) one re-enters in order */
    for (int32_t k = s->n_running - 1; k > 0 && s->running[k - 1]->id > s->running[k]->id; k--) {
        sched_req *t = s->running[k];
        s->running[k] = s->running[k - 1], s->running[k - 1] = t;
    }
    return 1;
undo:
    for (int32_t i = 0; i < r->n_choices; i++) release(s, &r->ch[i]);
    return 0;
}

/* Tokens a and b have in common from the start. */
static int32_t common_prefix(const int32_t *a, int32_t na, const int32_t *b, int32_t nb) {
    int32_t k = 0, n = na < nb ? na : nb;
    while (k < n && a[k] == b[k]) k++;
    return k;
}

/* Requests in flight share a prefix (SGLang's in-batch prefix caching): a
 * waiting request whose prompt begins with at least one full page that a
 * running request is prefilling now, beyond what the prefix cache holds,
 * steps aside until that prefill has passed those pages, then matches them
 * from the cache instead of computing them again. Deferring costs the
 * deferred request at most the rest of that one prefill, which it would
 * otherwise have spent computing the same pages beside it in the same
 * steps. Returns 1 when r should wait. */
static int shares_prefill(llm_sched *s, const sched_req *r) {
    if (r->forked || s->p.no_prefix) return 0;   /* forked: a preempted request, recomputed as it is */
    const sched_seq *mine = &r->ch[0];
    for (int32_t k = 0; k < s->n_running; k++) {
        const sched_seq *ch = &s->running[k]->ch[0];
        if (ch->seq < 0 || ch->stop != LLM_STOP_NONE || s->running[k]->forked) continue;
        int32_t prompt = s->running[k]->n_prompt;
        if (ch->n_cached >= prompt - 1) continue;   /* its prompt is in: nothing in flight */
        int32_t shared = common_prefix(mine->tokens, mine->n_tokens - 1, ch->tokens, prompt - 1);
        if (shared / s->page_size > ch->n_cached / s->page_size) return 1;
    }
    return 0;
}

/* The running requests' full pages written so far become findable before
 * anyone is admitted, so that a request admitted now matches a prefill that
 * ended in the step just run. */
static void publish_running(llm_sched *s) {
    for (int32_t k = 0; k < s->n_running; k++)
        for (int32_t i = 0; i < s->running[k]->n_choices; i++)
            if (s->running[k]->ch[i].seq >= 0) llm_seq_publish(s->c, s->running[k]->ch[i].seq);
}

/* Whether r waits for the disk tier: at its first turn its prefix is looked
 * up there, and while the pages found are read (on the tier's thread) it
 * steps aside, as for a prefill in flight. */
static int loads_from_disk(llm_sched *s, sched_req *r) {
    if (!s->p.tier || r->forked || s->p.no_prefix || r->ch[0].n_tokens < 2) return 0;
    if (!r->disk_asked) {
        r->disk_asked = 1;
        r->load = llm_tier_fetch(s->p.tier, r->ch[0].tokens, r->ch[0].n_tokens - 1);
        s->st.disk_waits += r->load != NULL;
    }
    return r->load && !llm_tier_ready(r->load);
}

/* Oldest first, no overtaking, except past a request that waits for a
 * prefill in flight (shares_prefill) or for the disk tier. */
static void admit(llm_sched *s) {
    publish_running(s);
    s->n_loading = 0;
    for (sched_req **pp = &s->wait_head, *prev = NULL; *pp;) {
        sched_req *r = *pp;
        if (loads_from_disk(s, r)) {
            s->n_loading++;
            prev = r, pp = &r->next;
            continue;
        }
        if (shares_prefill(s, r)) {
            s->st.prefill_waits += !r->deferred;
            r->deferred = 1;
            prev = r, pp = &r->next;
            continue;
        }
        if (!try_admit(s, r)) break;
        *pp = r->next;
        if (s->wait_tail == r) s->wait_tail = prev;
        r->next = NULL;
        s->n_waiting--;
    }
}

/* The newest running request gives its pages back and waits at the head. */
static void preempt_newest(llm_sched *s) {
    sched_req *r = s->running[s->n_running - 1];
    s->n_running--;
    for (int32_t i = 0; i < r->n_choices; i++) release(s, &r->ch[i]);
    r->next = s->wait_head;
    s->wait_head = r;
    if (!s->wait_tail) s->wait_tail = r;
    s->n_waiting++;
    s->st.preemptions++;
}

/* ---------------------------------------------------------------- one step */

/* Drafts for a decoding choice, written after its fed token at rows: as many
 * as pay (llm_lookup_ctl_next) and the room allows (positions left in the context, tokens left to generate,
 * rows and logits rows left once every later decoder has its one row). */
static int32_t propose(llm_sched *s, sched_seq *ch, int32_t rows, int32_t n_out, int32_t later, int32_t n_dec) {
    int64_t room[] = {s->n_ctx - ch->n_tokens, s->p.batch_tokens - rows - 1 - later, s->n_out_max - n_out - 1 - later};
    int64_t lim = room[0] < room[1] ? room[0] : room[1];
    lim = lim < room[2] ? lim : room[2];
    /* the other decoders' rows (those placed, one for each still to come) and tokens */
    return llm_choice_propose(&ch->c, ch->tokens, ch->n_tokens, lim, s->p.draft_fixed ? NULL : &s->cost, rows + later, n_dec - 1,
                              s->b_tokens + rows + 1);
}

/* Live, in the cache, and one token (the last sampled) to feed. */
static int decoding(const sched_seq *ch) {
    return ch->seq >= 0 && ch->stop == LLM_STOP_NONE && ch->n_tokens - ch->n_cached == 1;
}

/* Fills the batch: one row for every decoding sequence (with its drafts, if
 * any), then prompt chunks, oldest request first, within the token budget.
 * Returns the rows. */
static int32_t build_batch(llm_sched *s, int32_t *n_seqs, int32_t *n_out) {
    int32_t rows = 0, nb = 0, no = 0, later = 0;
    for (int32_t k = 0; k < s->n_running; k++)
        for (int32_t i = 0; i < s->running[k]->n_choices; i++) later += decoding(&s->running[k]->ch[i]);
    const int32_t n_dec = later;
    s->b_rows[0] = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int32_t k = 0; k < s->n_running; k++) {
            sched_req *r = s->running[k];
            for (int32_t i = 0; i < r->n_choices; i++) {
                sched_seq *ch = &r->ch[i];
                if (pass == 0) ch->rows = 0, ch->out_row = -1, ch->n_draft = 0;
                if (ch->seq < 0 || ch->stop != LLM_STOP_NONE || rows >= s->p.batch_tokens) continue;
                int32_t left = ch->n_tokens - ch->n_cached;
                if ((pass == 0) != (left == 1)) continue;
                if (pass == 0) { /* the token to feed, then drafts: every row wants its logits */
                    later--;
                    ch->n_draft = propose(s, ch, rows, no, later, n_dec);
                    s->b_tokens[rows] = ch->tokens[ch->n_cached];
                    memset(s->b_want + rows, 1, (size_t)(1 + ch->n_draft));
                    ch->rows = 1 + ch->n_draft, ch->out_row = no;
                    no += ch->rows, rows += ch->rows;
                } else {
                    int32_t t = left < s->p.batch_tokens - rows ? left : s->p.batch_tokens - rows;
                    memcpy(s->b_tokens + rows, ch->tokens + ch->n_cached, sizeof(int32_t) * (size_t)t);
                    memset(s->b_want + rows, 0, (size_t)t);
                    if (ch->n_cached + t == ch->n_tokens) s->b_want[rows + t - 1] = 1, ch->out_row = no++;
                    rows += t;
                    ch->rows = t;
                }
                s->b_seqs[nb] = ch->seq, s->b_ch[nb] = ch;
                s->b_rows[++nb] = rows;
            }
        }
    *n_seqs = nb, *n_out = no;
    return rows;
}

/* The log-softmax of `token`, and of the n best ids (ties to the lower) into ids/lps. */
static float logprobs_of(llm_sched *s, const float *logits, int32_t token, int32_t n, int32_t *ids, float *lps) {
    const double lz = llm_log_sum_exp(logits, s->V);
    int32_t have = 0;
    for (int32_t v = 0; v < s->V && n > 0; v++) { /* insertion into the n best, ties to the lower id */
        if (have == n && logits[v] <= logits[ids[have - 1]]) continue;
        int32_t j = have < n ? have++ : n - 1;
        while (j > 0 && logits[ids[j - 1]] < logits[v]) ids[j] = ids[j - 1], j--;
        ids[j] = v;
    }
    for (int32_t j = 0; j < have; j++) lps[j] = (float)(logits[ids[j]] - lz);
    return (float)(logits[token] - lz);
}

/* Samples choice i of r from logits (llm_choice_next), streams its text,
 * ends it if a stop condition is met. Returns the token, -1 when none. */
static int32_t sample_choice(llm_sched *s, sched_req *r, int32_t i, float *logits) {
    sched_seq *ch = &r->ch[i];
    int32_t token, ids[LLM_SCHED_MAX_TOP];
    float lps[LLM_SCHED_MAX_TOP];
    llm_sched_event ev = {.choice = i, .n_prompt = r->n_prompt, .n_cached = r->n_cached_first,
                          .n_restored = r->n_restored};
    llm_stop_reason why = llm_choice_next(&ch->c, logits, &token, &ev.text, &ev.text_len);
    ev.token = token;
    if (why == LLM_STOP_ERROR || why == LLM_STOP_CANCEL) {
        finish_choice(s, r, i, why, why == LLM_STOP_ERROR ? ch->c.error : NULL);
        return -1;
    }
    if (r->top >= 0) {
        ev.logprob = logprobs_of(s, logits, token, r->top, ids, lps);
        ev.n_top = r->top, ev.top_ids = ids, ev.top_logprobs = lps;
    }
    if (why != LLM_STOP_EOG) {
        s->st.generation_tokens++;
        ev.n_generated = ch->c.n_generated;
        ch->tokens[ch->n_tokens++] = token;
        /* a token past the context can be shown but never fed (with shifts: not before a shift) */
        if (why == LLM_STOP_NONE && !s->p.context_shift && (ch->n_tokens > s->n_ctx || ch->n_tokens >= ch->cap))
            why = LLM_STOP_CONTEXT;
        r->cb(r->user, &ev);
    }
    if (why != LLM_STOP_NONE) finish_choice(s, r, i, why, NULL);
    return token;
}

/* A verify pass: row j of the choice's logits follows the fed token and
 * drafts 0 .. j-1 (at b_tokens[first + 1 ..]). Samples row after row while
 * each sample equals the draft the next row was computed after, as plain
 * decoding would have fed it; the drafts after the first that differs leave
 * the cache. `before`: what the cache held before the pass. */
static void verify(llm_sched *s, sched_req *r, int32_t i, int32_t before, const int32_t *draft) {
    sched_seq *ch = &r->ch[i];
    const int32_t nd = ch->n_draft, fed = ch->n_cached;   /* fed: before + 1 + nd */
    int32_t j = 0, tok;
    s->st.drafted += (uint64_t)nd;
    for (;; j++) {
        /* what the cache holds of the tokens so far, should this sample end
         * the choice (a session saves that many): the drafts taken */
        ch->n_cached = before + 1 + j;
        tok = sample_choice(s, r, i, s->logits + (size_t)(ch->out_row + j) * (size_t)s->V);
        if (ch->stop != LLM_STOP_NONE) return;   /* its pages are gone with it */
        if (j == nd || tok != draft[j]) break;
        s->st.accepted++;
    }
    llm_choice_verified(&ch->c, nd, j, tok);
    const int32_t keep = before + 1 + j;   /* the fed token and the drafts taken */
    if (keep < fed) {
        if (llm_seq_truncate(s->c, ch->seq, keep) != LLM_OK) {
            ch->c.status = LLM_ERR_WINDOW;
            finish_choice(s, r, i, LLM_STOP_ERROR, "rolling back rejected drafts failed");
            return;
        }
        ch->n_cached = keep;
    }
}

/* After the forward: advance each sequence; where its last token was fed,
 * fork (first time, n > 1) and sample. */
static void deliver(llm_sched *s, int32_t nb) {
    for (int32_t b = 0; b < nb; b++) {
        sched_seq *ch = s->b_ch[b];
        const int32_t before = ch->n_cached;
        ch->n_cached += ch->rows;
        if (ch->out_row < 0) continue;
        float *lg = s->logits + (size_t)ch->out_row * (size_t)s->V;
        sched_req *r = NULL;
        for (int32_t k = 0; k < s->n_running && !r; k++)
            if (ch >= s->running[k]->ch && ch < s->running[k]->ch + s->running[k]->n_choices) r = s->running[k];
        int32_t i = (int32_t)(ch - r->ch);
        if (i == 0 && !r->forked && r->n_choices > 1) {
            r->forked = 1;
            for (int32_t j = 1; j < r->n_choices; j++) {
                sched_seq *cj = &r->ch[j];
                if (cj->stop != LLM_STOP_NONE) continue;
                if (llm_seq_fork(s->c, ch->seq, &cj->seq) != LLM_OK) {
                    cj->seq = -1;
                    cj->c.status = LLM_ERR_SEQ;
                    finish_choice(s, r, j, LLM_STOP_ERROR, "could not fork the sequence");
                    continue;
                }
                cj->n_cached = ch->n_cached;
            }
            for (int32_t j = 0; j < r->n_choices; j++)
                if (r->ch[j].stop == LLM_STOP_NONE) sample_choice(s, r, j, lg);
        } else if (ch->n_draft > 0) {
            verify(s, r, i, before, s->b_tokens + s->b_rows[b] + 1);
        } else {
            sample_choice(s, r, i, lg);
        }
    }
}

/* Context shift (engine/gen/policy.h) for every choice whose cache is full and
 * has a token to feed: its first n_keep positions stay, half of the rest go
 * (llm_context_shift re-rotates the kept keys and renumbers), the same
 * tokens leave its list. Nothing to drop after the kept ones: it ends with
 * LLM_STOP_CONTEXT. */
static void shift_full(llm_sched *s) {
    if (!s->p.context_shift) return;
    for (int32_t k = 0; k < s->n_running; k++)
        for (int32_t i = 0; i < s->running[k]->n_choices; i++) {
            sched_req *r = s->running[k];
            sched_seq *ch = &r->ch[i];
            if (!decoding(ch) || ch->n_cached < s->n_ctx) continue;
            int32_t keep, drop = llm_choice_shift_plan(1, s->p.n_keep, ch->n_cached, &keep);
            if (!drop) {
                finish_choice(s, r, i, LLM_STOP_CONTEXT, NULL);
                continue;
            }
            if (llm_context_shift(s->c, ch->seq, keep, drop) != LLM_OK) {
                ch->c.status = LLM_ERR_OUT_OF_PAGES;
                finish_choice(s, r, i, LLM_STOP_ERROR, "the context shift failed (out of KV pages for copies)");
                continue;
            }
            memmove(ch->tokens + keep, ch->tokens + keep + drop, sizeof(int32_t) * (size_t)(ch->n_tokens - keep - drop));
            ch->n_tokens -= drop, ch->n_cached -= drop;
            ch->shifted = 1;
            s->st.shifts++;
        }
}

static void snapshot(llm_sched *s) {
    kv_cache_stats cs = llm_context_stats(s->c);
    pthread_mutex_lock(&s->mu);
    s->snap = s->st;
    s->snap.running = s->n_running, s->snap.waiting = s->n_waiting;
    s->snap.pages_total = cs.pages_total, s->snap.pages_used = cs.pages_used;
    s->snap.pages_free = cs.pages_free, s->snap.pages_cached = cs.pages_cached;
    s->idle = s->n_running == 0 && s->n_waiting == s->n_loading;   /* nothing to do until a load is ready */
    pthread_mutex_unlock(&s->mu);
}

/* Takes the inbox and the cancellations. Returns the stopping flag. */
static int take_inbox(llm_sched *s) {
    pthread_mutex_lock(&s->mu);
    sched_req *in = s->in_head;
    int32_t n_in = s->n_inbox;
    s->in_head = s->in_tail = NULL, s->n_inbox = 0;
    int32_t nc = s->n_cancels;
    uint64_t few[64], *ids = nc <= 64 ? few : malloc(sizeof *ids * (size_t)nc);
    if (!ids) nc = 0;
    else if (nc) memcpy(ids, s->cancels, sizeof *ids * (size_t)nc);
    s->n_cancels = 0;
    int stopping = s->stopping;
    s->load_ready = 0;
    if (n_in) {   /* visible as waiting at once, so the queue limit holds */
        s->snap.waiting += n_in;
    }
    pthread_mutex_unlock(&s->mu);
    if (in) {
        if (s->wait_tail) s->wait_tail->next = in; else s->wait_head = in;
        for (s->wait_tail = in; s->wait_tail->next;) s->wait_tail = s->wait_tail->next;
        s->n_waiting += n_in;
    }
    for (int32_t k = 0; k < nc; k++) cancel_id(s, ids[k]);
    if (ids != few) free(ids);
    return stopping;
}

static void end_all(llm_sched *s) {
    while (s->n_running) {
        sched_req *r = s->running[s->n_running - 1];
        end_request(s, r, LLM_STOP_CANCEL, NULL);
        s->n_running--;
        deliver_done(r);
    }
    while (s->wait_head) {
        sched_req *r = s->wait_head;
        s->wait_head = r->next;
        end_request(s, r, LLM_STOP_CANCEL, NULL);
        deliver_done(r);
    }
    s->wait_tail = NULL, s->n_waiting = 0;
}

int llm_sched_step(llm_sched *s) {
    take_inbox(s);
    reap(s);
    admit(s);
    shift_full(s);
    int32_t nb, no, rows;
    int rc = LLM_OK;
    for (;;) {
        rows = build_batch(s, &nb, &no);
        if (rows == 0) break;
        llm_batch b = {.n_seqs = nb, .seqs = s->b_seqs, .row_start = s->b_rows, .tokens = s->b_tokens,
                       .want = s->b_want};
        double t0 = llm_pass_clock();
        rc = llm_forward(s->c, &b, s->logits);
        if (rc == LLM_OK) llm_pass_cost_add(&s->cost, rows, llm_pass_clock() - t0);
        if (rc != LLM_ERR_OUT_OF_PAGES) break;
        if (s->n_running > 1) {
            preempt_newest(s);
        } else {   /* alone and still out of pages: it has outgrown the pool */
            end_request(s, s->running[0], LLM_STOP_CONTEXT, NULL);
            rc = LLM_OK;
        }
    }
    if (rows > 0 && rc == LLM_OK) {
        s->st.steps++, s->st.rows += (uint64_t)rows;
        deliver(s, nb);
    } else if (rows > 0) {
        const char *msg = llm_status_str(rc);
        for (int32_t k = 0; k < nb; k++)
            for (int32_t q = 0; q < s->n_running; q++) {
                sched_req *r = s->running[q];
                if (s->b_ch[k] < r->ch || s->b_ch[k] >= r->ch + r->n_choices) continue;
                for (int32_t i = 0; i < r->n_choices; i++) r->ch[i].c.status = rc;
                end_request(s, r, LLM_STOP_ERROR, msg);
            }
    }
    reap(s);
    admit(s);   /* slots freed by this step's endings are taken before the next */
    snapshot(s);
    return rc == LLM_OK ? rows : rc;
}

int llm_sched_run(llm_sched *s) {
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->stopping && s->idle && !s->in_head && !s->n_cancels && !s->load_ready) pthread_cond_wait(&s->wake, &s->mu);
        int stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stopping) break;
        llm_sched_step(s);
    }
    take_inbox(s);
    end_all(s);
    snapshot(s);
    return 0;
}

void llm_sched_free(llm_sched *s) {
    if (!s) return;
    take_inbox(s);
    end_all(s);
    if (s->p.tier) llm_tier_set_notify(s->p.tier, NULL, NULL);
    free(s->running), free(s->ended), free(s->b_seqs), free(s->b_rows), free(s->b_tokens), free(s->b_want);
    free(s->b_ch), free(s->logits), free(s->lsm), free(s->cancels);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->wake);
    free(s);
}
