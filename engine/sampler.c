/* engine/sampler.c - greedy, temperature, top-k and top-p sampling (see
 * sampler.h). Candidates are ordered by logit, then by id, so equal logits
 * never make a run depend on sort stability. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>

llm_sampler_params llm_sampler_default_params(void) {
    return (llm_sampler_params){.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 1};
}

int llm_sampler_init(llm_sampler *s, const llm_sampler_params *p, int32_t n_vocab) {
    s->cand = NULL, s->prob = NULL;
    if (n_vocab < 1 || p->top_k < 0 || isnan(p->temp) || !(p->top_p > 0.0f && p->top_p <= 1.0f)) return -1;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->rng = p->seed;
    s->cand = malloc(sizeof *s->cand * (size_t)n_vocab);
    s->prob = malloc(sizeof *s->prob * (size_t)n_vocab);
    if (s->cand && s->prob) return 0;
    llm_sampler_free(s);
    return -1;
}

void llm_sampler_free(llm_sampler *s) {
    free(s->cand), free(s->prob);
    s->cand = NULL, s->prob = NULL;
}

int32_t llm_argmax(const float *logits, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > logits[best] || (isnan(logits[best]) && !isnan(logits[i]))) best = i;
    return best;
}

/* a ranks below b: smaller logit, or the same logit and a larger id */
static int worse(const llm_candidate *a, const llm_candidate *b) {
    return a->logit < b->logit || (a->logit == b->logit && a->id > b->id);
}

static int by_rank(const void *pa, const void *pb) {
    const llm_candidate *a = pa, *b = pb;
    return worse(a, b) ? 1 : worse(b, a) ? -1 : 0;
}

/* Restore the min-heap (worst at the root) below node i of h[0..n). */
static void sift_down(llm_candidate *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && worse(&h[l], &h[w])) w = l;
        if (r < n && worse(&h[r], &h[w])) w = r;
        if (w == i) return;
        llm_candidate t = h[i];
        h[i] = h[w], h[w] = t;
        i = w;
    }
}

/* uniform in [0, 1) from the top 53 bits of splitmix64 */
static double next_uniform(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

int32_t llm_sample(llm_sampler *s, const float *logits) {
    const int32_t V = s->n_vocab;
    if (s->p.temp <= 0.0f) return llm_argmax(logits, V);
    /* candidates: the top_k best by a bounded heap (O(V log k)), or all */
    int32_t k = s->p.top_k > 0 && s->p.top_k < V ? s->p.top_k : V, n = 0;
    for (int32_t i = 0; i < V; i++) {
        llm_candidate c = {isnan(logits[i]) ? -INFINITY : logits[i], i};
        if (n < k) {
            s->cand[n++] = c;
            if (n == k && k < V)
                for (int32_t j = k / 2 - 1; j >= 0; j--) sift_down(s->cand, n, j);
        } else if (worse(&s->cand[0], &c)) {
            s->cand[0] = c;
            sift_down(s->cand, n, 0);
        }
    }
    qsort(s->cand, (size_t)n, sizeof *s->cand, by_rank);
    if (s->cand[0].logit == -INFINITY) return s->cand[0].id;
    /* softmax at temperature over the candidates, best first */
    double sum = 0, inv_t = 1.0 / s->p.temp;
    for (int32_t i = 0; i < n; i++) sum += s->prob[i] = exp(((double)s->cand[i].logit - s->cand[0].logit) * inv_t);
    /* nucleus: the shortest best-first prefix holding top_p of the mass */
    int32_t keep = n;
    if (s->p.top_p < 1.0f) {
        double cum = 0;
        for (int32_t i = 0; i < n; i++) {
            cum += s->prob[i] / sum;
            if (cum >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    double kept = 0;
    for (int32_t i = 0; i < keep; i++) kept += s->prob[i];
    double u = next_uniform(&s->rng) * kept;
    for (int32_t i = 0; i < keep; i++) {
        u -= s->prob[i];
        if (u < 0) return s->cand[i].id;
    }
    return s->cand[keep - 1].id; /* u landed on the rounding remainder */
}
