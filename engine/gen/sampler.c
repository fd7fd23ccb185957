/* engine/gen/sampler.c - greedy, temperature, top-k and top-p sampling (see
 * sampler.h). Candidates are ordered by logit, then by id, so equal logits
 * never make a run depend on sort stability. */
#include "sampler.h"
#include "../model/fastexp.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

llm_sampler_params llm_sampler_default_params(void) {
    return (llm_sampler_params){.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 1, .repeat_last_n = 64};
}

static int params_ok(const llm_sampler_params *p, int32_t n_vocab) {
    if (n_vocab < 1 || p->top_k < 0 || isnan(p->temp) || !(p->top_p > 0.0f && p->top_p <= 1.0f)) return 0;
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f) || !(p->repeat_penalty >= 0.0f && p->repeat_penalty < INFINITY) ||
        p->repeat_last_n < -1 || !(fabsf(p->presence_penalty) <= 2.0f) || !(fabsf(p->frequency_penalty) <= 2.0f) ||
        p->n_bias < 0 || (p->n_bias > 0 && !p->bias) || (p->grammar && p->grammar->n_vocab != n_vocab) ||
        (p->rules && !llm_gbnf_bound(p->rules, n_vocab)))
        return 0;
    for (int32_t i = 0; i < p->n_bias; i++)
        if (p->bias[i].id < 0 || p->bias[i].id >= n_vocab || !(fabsf(p->bias[i].bias) <= 100.0f)) return 0;
    return 1;
}

static int repeat_on(const llm_sampler_params *p) {
    return p->repeat_penalty != 0.0f && p->repeat_penalty != 1.0f && p->repeat_last_n != 0;
}

/* The processing state, for the processors that are on. */
static int init_processing(llm_sampler *s, int32_t n_vocab) {
    const llm_sampler_params *p = &s->p;
    const int counts = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    s->processing = p->n_bias > 0 || repeat_on(p) || counts || p->min_p > 0.0f || p->grammar || p->rules;
    if (p->grammar) llm_json_init(&s->json, (llm_json_root)p->json_root);
    if (p->rules && !(s->rules = llm_gbnf_state_new(p->rules))) return -1;
    if ((p->grammar || p->rules) && !(s->masked = malloc(sizeof *s->masked * (size_t)n_vocab))) return -1;
    if (!s->processing) return 0;
    s->work = malloc(sizeof *s->work * (size_t)n_vocab);
    if (!s->work) return -1;
    if (p->n_bias > 0) {
        if (!(s->bias = malloc(sizeof *s->bias * (size_t)p->n_bias))) return -1;
        memcpy(s->bias, p->bias, sizeof *s->bias * (size_t)p->n_bias);
    }
    s->p.bias = NULL; /* the caller's array is not kept */
    if (counts && !(s->count = calloc((size_t)n_vocab, sizeof *s->count))) return -1;
    if (repeat_on(p)) {
        s->cap_ring = p->repeat_last_n > 0 ? p->repeat_last_n : 256; /* -1: grows */
        s->ring = malloc(sizeof *s->ring * (size_t)s->cap_ring);
        s->mark = calloc((size_t)n_vocab, sizeof *s->mark);
        if (!s->ring || !s->mark) return -1;
    }
    return 0;
}

int llm_sampler_init(llm_sampler *s, const llm_sampler_params *p, int32_t n_vocab) {
    memset(s, 0, sizeof *s);
    if (!params_ok(p, n_vocab)) return -1;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->rng = p->seed;
    s->cand = malloc(sizeof *s->cand * (size_t)n_vocab);
    s->prob = malloc(sizeof *s->prob * (size_t)n_vocab);
    s->weight = malloc(sizeof *s->weight * (size_t)n_vocab);
    s->block_mass = malloc(sizeof *s->block_mass * (size_t)(n_vocab / LLM_SAMPLER_BLOCK + 1));
    if (s->cand && s->prob && s->weight && s->block_mass && init_processing(s, n_vocab) == 0) return 0;
    llm_sampler_free(s);
    return -1;
}

void llm_sampler_free(llm_sampler *s) {
    free(s->cand), free(s->prob), free(s->weight), free(s->block_mass);
    llm_gbnf_state_free(s->rules);
    free(s->work), free(s->masked), free(s->bias), free(s->count), free(s->seen), free(s->ring), free(s->mark);
    memset(s, 0, sizeof *s);
}

/* One token into the repeat window: the ring keeps the last repeat_last_n
 * (-1: grows to keep all). */
static void window_push(llm_sampler *s, int32_t token) {
    if (!s->ring || token < 0 || token >= s->n_vocab) return;
    if (s->n_ring == s->cap_ring && s->p.repeat_last_n < 0) { /* full and not wrapped yet: at_ring is 0 */
        int32_t *r = realloc(s->ring, sizeof *r * (size_t)s->cap_ring * 2);
        if (r) s->ring = r, s->at_ring = s->cap_ring, s->cap_ring *= 2; /* out of memory: it wraps instead */
    }
    s->ring[s->at_ring] = token;
    s->at_ring = (s->at_ring + 1) % s->cap_ring;
    if (s->n_ring < s->cap_ring) s->n_ring++;
}

void llm_sampler_accept_prompt(llm_sampler *s, const int32_t *tokens, int32_t n) {
    if (s->ring && s->p.repeat_last_n > 0 && n > s->cap_ring) tokens += n - s->cap_ring, n = s->cap_ring;
    for (int32_t i = 0; i < n; i++) window_push(s, tokens[i]);
}

void llm_sampler_accept(llm_sampler *s, int32_t token) {
    if (!s->processing || token < 0 || token >= s->n_vocab) return;
    if (s->p.grammar) llm_json_accept(&s->json, s->p.grammar, token);
    if (s->rules) llm_gbnf_accept(s->rules, token);
    window_push(s, token);
    if (!s->count) return;
    if (s->count[token]++ == 0) {
        if (s->n_seen == s->cap_seen) {
            int32_t cap = s->cap_seen ? 2 * s->cap_seen : 64;
            int32_t *seen = realloc(s->seen, sizeof *seen * (size_t)cap);
            if (!seen) { /* out of memory: the token goes uncounted rather than lost from the list */
                s->count[token]--;
                return;
            }
            s->seen = seen, s->cap_seen = cap;
        }
        s->seen[s->n_seen++] = token;
    }
}

const float *llm_sampler_process(llm_sampler *s, const float *logits) {
    if (!s->processing) return logits;
    const int32_t V = s->n_vocab;
    float *w = s->work;
    memcpy(w, logits, sizeof *w * (size_t)V);
    for (int32_t i = 0; i < s->p.n_bias; i++)
        w[s->bias[i].id] = s->bias[i].bias <= -100.0f ? -INFINITY : w[s->bias[i].id] + s->bias[i].bias;
    if (s->ring) {
        const float rp = s->p.repeat_penalty;
        if (++s->stamp == 0) memset(s->mark, 0, sizeof *s->mark * (size_t)V), s->stamp = 1;
        for (int32_t i = 0; i < s->n_ring; i++) {
            const int32_t t = s->ring[i];
            if (s->mark[t] == s->stamp) continue;
            s->mark[t] = s->stamp;
            w[t] = w[t] > 0 ? w[t] / rp : w[t] * rp;
        }
    }
    for (int32_t i = 0; i < s->n_seen; i++) {
        const int32_t t = s->seen[i];
        w[t] -= s->p.frequency_penalty * (float)s->count[t] + s->p.presence_penalty;
    }
    if (s->p.grammar) {
        llm_json_mask(&s->json, s->p.grammar, w, s->masked);
        w = s->masked;
    }
    if (s->rules) {
        llm_gbnf_mask(s->rules, w, s->masked);
        w = s->masked;
    }
    if (s->p.min_p > 0.0f && s->p.temp > 0.0f) {
        const float floor = w[llm_argmax(w, V)] + logf(s->p.min_p);
        for (int32_t i = 0; i < V; i++) w[i] = w[i] >= floor ? w[i] : -INFINITY;
    }
    return w;
}

/* The passes over the vocabulary below take LANES logits a step in inner
 * loops of fixed length, which the compiler turns into vector operations:
 * they run once a token over vocabularies of up to 262144 words, and
 * sampling never sorts the whole vocabulary. */
enum { LANES = 16 };

/* Lane k keeps the largest logit among k, k + LANES, ... and its first id
 * (NaN never passes the strict >); the lanes' best, the lowest id on a
 * tie, is the first id of the largest logit. */
int32_t llm_argmax(const float *logits, int32_t n) {
    float mx[LANES];
    int32_t at[LANES];
    for (int32_t k = 0; k < LANES; k++) mx[k] = -INFINITY, at[k] = -1;
    int32_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int32_t k = 0; k < LANES; k++) {
            const int gt = logits[i + k] > mx[k];
            mx[k] = gt ? logits[i + k] : mx[k];
            at[k] = gt ? i + k : at[k];
        }
    for (int32_t k = 0; i + k < n; k++)
        if (logits[i + k] > mx[k]) mx[k] = logits[i + k], at[k] = i + k;
    int32_t best = -1;
    for (int32_t k = 0; k < LANES; k++)
        if (at[k] >= 0 && (best < 0 || mx[k] > mx[best] || (mx[k] == mx[best] && at[k] < at[best]))) best = k;
    if (best >= 0) return at[best];
    /* nothing above -inf: the first logit that is not NaN (-inf), else 0 */
    for (i = 0; i < n; i++)
        if (!isnan(logits[i])) return i;
    return 0;
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

/* The sum of e^((logit - mx) inv_t) over logits [i0, i1), each term 0
 * where it is below e^-87 (NaN and -inf logits too); with STORE, each term
 * into w [i1 - i0] too. Runs of LANES summed in float lanes, the lanes in
 * double. */
static inline __attribute__((always_inline)) double exp_terms(const float *restrict logits, int32_t i0, int32_t i1,
                                                              float mx, float inv_t, float *restrict w,
                                                              const int STORE) {
    float sum[LANES] = {0};
    int32_t i = i0;
    for (; i + LANES <= i1; i += LANES)
        for (int32_t k = 0; k < LANES; k++) {
            const float x = (logits[i + k] - mx) * inv_t;
            const float e = x >= -87.0f ? llm_exp(x) : 0.0f; /* 0 for NaN */
            if (STORE) w[i + k - i0] = e;
            sum[k] += e;
        }
    for (int32_t k = 0; i + k < i1; k++) {
        const float x = (logits[i + k] - mx) * inv_t;
        const float e = x >= -87.0f ? llm_exp(x) : 0.0f;
        if (STORE) w[i + k - i0] = e;
        sum[k] += e;
    }
    double total = 0;
    for (int32_t k = 0; k < LANES; k++) total += sum[k];
    return total;
}

/* The sampler's weights e^((logit - mx) / T) of every token and their sum,
 * with the sum of each LLM_SAMPLER_BLOCK tokens in block_mass. */
static double weigh(llm_sampler *s, const float *logits, float mx) {
    const int32_t V = s->n_vocab;
    const float inv_t = 1.0f / s->p.temp;
    double total = 0;
    for (int32_t b0 = 0; b0 < V; b0 += LLM_SAMPLER_BLOCK) {
        const int32_t b1 = b0 + LLM_SAMPLER_BLOCK < V ? b0 + LLM_SAMPLER_BLOCK : V;
        const double mass = exp_terms(logits, b0, b1, mx, inv_t, s->weight + b0, 1);
        s->block_mass[b0 / LLM_SAMPLER_BLOCK] = mass;
        total += mass;
    }
    return total;
}

double llm_log_sum_exp(const float *logits, int32_t n) {
    const float mx = n > 0 ? logits[llm_argmax(logits, n)] : -INFINITY;
    if (!(mx > -INFINITY && mx < INFINITY)) return isnan(mx) ? NAN : mx;
    double total = 0;
    for (int32_t b0 = 0; b0 < n; b0 += LLM_SAMPLER_BLOCK)
        total += exp_terms(logits, b0, b0 + LLM_SAMPLER_BLOCK < n ? b0 + LLM_SAMPLER_BLOCK : n, mx, 1.0f, NULL, 0);
    return mx + log(total);
}

/* The mass of the weights at or above tau. */
static double mass_above(const float *w, int32_t V, float tau) {
    float sum[LANES] = {0};
    int32_t i = 0;
    for (; i + LANES <= V; i += LANES)
        for (int32_t k = 0; k < LANES; k++) sum[k] += w[i + k] >= tau ? w[i + k] : 0.0f;
    for (int32_t k = 0; i + k < V; k++) sum[k] += w[i + k] >= tau ? w[i + k] : 0.0f;
    double mass = 0;
    for (int32_t k = 0; k < LANES; k++) mass += sum[k];
    return mass;
}

/* top_k = 0 (or >= V): draw u over the whole vocabulary, or its nucleus. */
static int32_t sample_all(llm_sampler *s, const float *logits, double u) {
    const int32_t V = s->n_vocab;
    const int32_t top = llm_argmax(logits, V);
    const float mx = logits[top];
    if (!(mx > -INFINITY && mx < INFINITY)) return top; /* no finite weights to draw from */
    const double total = weigh(s, logits, mx);
    const float *w = s->weight;
    if (s->p.top_p >= 1.0f) { /* every token, in id order: the block, then the token */
        double at = u * total;
        int32_t last = top; /* where rounding leaves u past the end: a token of weight > 0 */
        for (int32_t b0 = 0; b0 < V; b0 += LLM_SAMPLER_BLOCK) {
            const double mass = s->block_mass[b0 / LLM_SAMPLER_BLOCK];
            if (at >= mass) {
                at -= mass;
                continue;
            }
            const int32_t b1 = b0 + LLM_SAMPLER_BLOCK < V ? b0 + LLM_SAMPLER_BLOCK : V;
            for (int32_t i = b0; i < b1; i++) {
                if (w[i] > 0) last = i;
                if ((at -= w[i]) < 0) return i;
            }
        }
        return last;
    }
    /* The nucleus, without ranking the whole vocabulary: tau_lo and tau_hi
     * with the weights at or above tau_hi holding less than top_p of the mass
     * and those at or above tau_lo at least top_p (tau falls by 2^8 from 1,
     * then bisects to within 6%). Every token at or above tau_hi is in the
     * nucleus, in any order; only the band between is ranked (logit, then
     * id), and its best-first prefix taken until the mass reaches top_p. */
    const double need = s->p.top_p * total;
    float hi = 2.0f, lo = 1.0f; /* no weight is above 1 */
    while (lo > 1e-30f && mass_above(w, V, lo) < need) hi = lo, lo /= 256;
    if (!(lo > 1e-30f)) lo = 0; /* the band reaches every token with a weight */
    for (int it = 0; it < 16 && lo > 0 && hi > 1.0625f * lo; it++) {
        const float mid = sqrtf(lo * hi);
        if (mass_above(w, V, mid) >= need) lo = mid;
        else hi = mid;
    }
    /* the sure ones from the front of cand, the band from its back (a run of
     * LANES weights all below both is passed over in one test) */
    const float floor = lo > 0 ? lo : FLT_MIN;
    int32_t n_sure = 0, back = V;
    double cum = 0;
    for (int32_t i = 0; i < V; i += LANES) {
        const int32_t end = i + LANES < V ? i + LANES : V;
        if (end - i == LANES) {
            int any = 0;
            for (int32_t k = 0; k < LANES; k++) any |= w[i + k] >= floor;
            if (!any) continue;
        }
        for (int32_t j = i; j < end; j++)
            if (w[j] >= hi) s->cand[n_sure++] = (llm_candidate){logits[j], j}, cum += w[j];
            else if (w[j] >= floor) s->cand[--back] = (llm_candidate){logits[j], j};
    }
    /* the band after the sure ones, ranked */
    const int32_t n_band = V - back;
    memmove(s->cand + n_sure, s->cand + back, sizeof *s->cand * (size_t)n_band);
    const int32_t n = n_sure + n_band;
    qsort(s->cand + n_sure, (size_t)n_band, sizeof *s->cand, by_rank);
    int32_t keep = n;
    for (int32_t i = n_sure; i < n && cum < need; i++) {
        cum += w[s->cand[i].id];
        keep = i + 1;
    }
    if (cum < need) keep = n;
    if (keep == 0) return top;
    double kept = 0;
    for (int32_t i = 0; i < keep; i++) kept += w[s->cand[i].id];
    double at = u * kept;
    for (int32_t i = 0; i < keep; i++) {
        at -= w[s->cand[i].id];
        if (at < 0) return s->cand[i].id;
    }
    return s->cand[keep - 1].id; /* u landed on the rounding remainder */
}

/* top_k < V: the k best by a bounded heap (O(V log k)); a run of LANES
 * logits none of which beats the heap's worst is passed over in one test. */
static int32_t sample_top_k(llm_sampler *s, const float *logits, int32_t k, double u) {
    const int32_t V = s->n_vocab;
    int32_t n = 0, i = 0;
    for (; i < V && n < k; i++) s->cand[n++] = (llm_candidate){isnan(logits[i]) ? -INFINITY : logits[i], i};
    for (int32_t j = k / 2 - 1; j >= 0; j--) sift_down(s->cand, n, j);
    while (i < V) {
        if (i + LANES <= V) {
            const float worst = s->cand[0].logit;
            int any = 0;
            for (int32_t x = 0; x < LANES; x++) any |= logits[i + x] > worst;
            if (!any) {
                i += LANES;
                continue;
            }
        }
        const int32_t end = i + LANES < V ? i + LANES : V;
        for (; i < end; i++) {
            llm_candidate c = {isnan(logits[i]) ? -INFINITY : logits[i], i};
            if (worse(&s->cand[0], &c)) {
                s->cand[0] = c;
                sift_down(s->cand, n, 0);
            }
        }
    }
    qsort(s->cand, (size_t)n, sizeof *s->cand, by_rank);
    if (s->cand[0].logit == -INFINITY) return llm_argmax(logits, V);
    /* softmax at temperature over the candidates, best first */
    double sum = 0, inv_t = 1.0 / s->p.temp;
    for (int32_t j = 0; j < n; j++) sum += s->prob[j] = exp(((double)s->cand[j].logit - s->cand[0].logit) * inv_t);
    /* nucleus: the shortest best-first prefix holding top_p of the mass */
    int32_t keep = n;
    if (s->p.top_p < 1.0f) {
        double cum = 0;
        for (int32_t j = 0; j < n; j++) {
            cum += s->prob[j] / sum;
            if (cum >= s->p.top_p) {
                keep = j + 1;
                break;
            }
        }
    }
    double kept = 0;
    for (int32_t j = 0; j < keep; j++) kept += s->prob[j];
    double at = u * kept;
    for (int32_t j = 0; j < keep; j++) {
        at -= s->prob[j];
        if (at < 0) return s->cand[j].id;
    }
    return s->cand[keep - 1].id; /* u landed on the rounding remainder */
}

/* The draw from logits already processed. */
static int32_t draw(llm_sampler *s, const float *logits, double u) {
    const int32_t V = s->n_vocab;
    if (s->p.temp <= 0.0f) return llm_argmax(logits, V);
    const int32_t k = s->p.top_k > 0 && s->p.top_k < V ? s->p.top_k : V;
    return k < V ? sample_top_k(s, logits, k, u) : sample_all(s, logits, u);
}

int32_t llm_sample_at(llm_sampler *s, const float *logits, double u) {
    return draw(s, llm_sampler_process(s, logits), u);
}

int32_t llm_sample(llm_sampler *s, const float *logits) {
    const float *l = llm_sampler_process(s, logits);
    /* greedy draws nothing from the generator */
    const int32_t t = s->p.temp <= 0.0f ? llm_argmax(l, s->n_vocab) : draw(s, l, next_uniform(&s->rng));
    llm_sampler_accept(s, t);
    return t;
}
