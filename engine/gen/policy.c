/* engine/gen/policy.c - the context shift and prompt-lookup drafting of
 * engine/gen/policy.h (session files are engine/gen/session_file.c). */
#include "policy.h"
#include "../model/arch.h"

#include <time.h>

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

/* Recent passes weigh most: the cost of a pass moves with the depth and the
 * machine's load, the acceptance with what the text is doing. */
#define PASS_COST_KEEP 0.75
#define LOOKUP_KEEP 0.85
#define LOOKUP_IDLE_KEEP 0.97
#define LOOKUP_UNSEEN_KEEP 0.9
#define LOOKUP_PRIOR 0.67

double llm_pass_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void llm_pass_cost_add(llm_pass_cost *c, int32_t rows, double seconds) {
    if (!c || rows < 1 || rows > LLM_PASS_COST_ROWS || !(seconds > 0)) return;
    double *t = &c->t[rows];
    if (*t > 0) { /* a pass the machine held up counts as at most twice the usual */
        seconds = seconds < 2 * *t ? seconds : 2 * *t;
        seconds = seconds > 0.5 * *t ? seconds : 0.5 * *t;
    }
    *t = *t > 0 ? PASS_COST_KEEP * *t + (1 - PASS_COST_KEEP) * seconds : seconds;
    c->w[rows] = c->w[rows] + 1 < 8 ? c->w[rows] + 1 : 8;
}

/* out [1 .. n]: the expected seconds of passes of 1 .. n rows (llm_pass_cost_at):
 * the least-squares line through the row counts measured, each weighed by
 * how often (up to 8), its slope at least a tenth of the mean cost of a row
 * (noise must not make rows look free). */
static void pass_costs(const llm_pass_cost *c, int32_t n, double *out) {
    double W = 0, R = 0, T = 0, RR = 0, RT = 0;
    int32_t distinct = 0, only = 0;
    for (int32_t r = 1; r <= LLM_PASS_COST_ROWS; r++) {
        if (!(c->t[r] > 0)) continue;
        double w = c->w[r] > 0 ? c->w[r] : 1;
        W += w, R += w * r, T += w * c->t[r], RR += w * r * r, RT += w * r * c->t[r];
        distinct++, only = r;
    }
    double m = 0, b = 0;
    if (distinct == 1) { /* one row count: a row beyond r costs 1 / (r + 1.5) of a pass of r */
        m = c->t[only] / (only + 1.5);
        b = c->t[only] - m * only;
    } else if (distinct > 1) {
        m = (W * RT - R * T) / (W * RR - R * R);
        double least = 0.1 * T / R;
        m = m > least ? m : least;
        b = (T - m * R) / W;
    }
    for (int32_t r = 1; r <= n; r++) {
        double t = b + m * r;
        out[r] = distinct == 0 ? 0 : t > 0.1 * m ? t : 0.1 * m;
    }
}

double llm_pass_cost_at(const llm_pass_cost *c, int32_t rows) {
    if (!c || rows < 1 || rows > LLM_PASS_COST_ROWS) return 0;
    double t[LLM_PASS_COST_ROWS + 1];
    pass_costs(c, rows, t);
    return t[rows];
}

void llm_lookup_ctl_init(llm_lookup_ctl *c, int32_t n_max) {
    *c = (llm_lookup_ctl){.n_max = n_max > 0 ? n_max : 0, .probe_gap = LLM_LOOKUP_PROBE_MIN};
}

/* The statistics' slot of run position n (1 ..): the last holds every later one. */
static int32_t run_slot(int64_t n) {
    return n < LLM_LOOKUP_RUN ? (int32_t)n : LLM_LOOKUP_RUN;
}

void llm_lookup_ctl_seen(llm_lookup_ctl *c, int32_t proposed, int32_t accepted, int next_foreseen) {
    if (!c) return;
    if (proposed <= 0) {
        c->run = 0;
        return;
    }
    accepted = accepted < 0 ? 0 : accepted > proposed ? proposed : accepted;
    /* the run's positions run + 1 .. run + seen: all right but the last if the run broke there */
    const int32_t seen = accepted < proposed || next_foreseen >= 0 ? accepted + 1 : accepted;
    const int broke = accepted < proposed || next_foreseen == 0;
    for (int32_t i = 1; i <= seen; i++) {
        int32_t k = run_slot((int64_t)c->run + i);
        c->hit[k] = LOOKUP_KEEP * c->hit[k] + !(broke && i == seen);
        c->tried[k] = LOOKUP_KEEP * c->tried[k] + 1;
    }
    /* the positions not reached fade faster, towards those before them: longer drafts get retried */
    for (int64_t k = (int64_t)c->run + seen + 1; k <= LLM_LOOKUP_RUN; k++)
        c->hit[k] *= LOOKUP_UNSEEN_KEEP, c->tried[k] *= LOOKUP_UNSEEN_KEEP;
    /* unforeseen, the model's token after the drafts is taken to go on with the run */
    c->run = broke ? 0 : run_slot((int64_t)c->run + accepted + 1);
    if (c->idle >= c->probe_gap) /* a probe: if drafts still do not pay, the next comes later */
        c->probe_gap = 2 * c->probe_gap < LLM_LOOKUP_PROBE_MAX ? 2 * c->probe_gap : LLM_LOOKUP_PROBE_MAX;
    c->idle = 0;
}

int32_t llm_lookup_ctl_next(llm_lookup_ctl *c, const llm_pass_cost *cost, int32_t rows_other, double tokens_other) {
    if (!c || c->n_max <= 0 || !cost || rows_other < 0 || rows_other >= LLM_PASS_COST_ROWS) return 0;
    int32_t n = rows_other + 1 + c->n_max;
    n = n < LLM_PASS_COST_ROWS ? n : LLM_PASS_COST_ROWS;
    double t[LLM_PASS_COST_ROWS + 1];
    pass_costs(cost, n, t);
    if (!(t[rows_other + 1] > 0)) return 0; /* nothing measured yet: a plain pass first */
    /* the lookup's token at run position i is right, once those before it
     * were, at the rate seen there, pulled towards that of i - 1 where i
     * was seldom reached; the chain first runs up to the current run's end */
    double a = LOOKUP_PRIOR, e = 1, p = 1, best_v = (tokens_other + 1) / t[rows_other + 1];
    for (int32_t i = 1; i <= c->run && i < LLM_LOOKUP_RUN; i++) a = (c->hit[i] + a) / (c->tried[i] + 1);
    int32_t best = 0;
    for (int32_t k = 1; rows_other + 1 + k <= n; k++) {
        int32_t i = run_slot((int64_t)c->run + k);
        a = (c->hit[i] + a) / (c->tried[i] + 1);
        p *= a, e += p;
        double v = (tokens_other + e) / t[rows_other + 1 + k];
        if (v > best_v) best_v = v, best = k;
    }
    if (best > 0) {
        c->probe_gap = LLM_LOOKUP_PROBE_MIN;
        return best;
    }
    /* probes cost at most about 1% of the time once drafts have not paid for a while */
    const double dear = rows_other + 2 <= n ? 100 * (t[rows_other + 2] / t[rows_other + 1] - 1) : LLM_LOOKUP_PROBE_MAX;
    int32_t gap = dear < LLM_LOOKUP_PROBE_MAX ? (int32_t)dear : LLM_LOOKUP_PROBE_MAX;
    gap = gap > LLM_LOOKUP_PROBE_MIN ? gap : LLM_LOOKUP_PROBE_MIN;
    if (c->probe_gap > gap) c->probe_gap = gap;
    if (c->idle < c->probe_gap) c->idle++;
    /* what was seen long ago counts less, so that a probe's news weighs */
    for (int32_t i = 1; i <= LLM_LOOKUP_RUN; i++) c->hit[i] *= LOOKUP_IDLE_KEEP, c->tried[i] *= LOOKUP_IDLE_KEEP;
    c->run = 0; /* a plain pass follows (or a probe): the run, if any, goes unseen */
    return c->idle >= c->probe_gap ? 1 : 0;
}
