/* engine/kvsession.c - the public API's sessions (include/kvengine.h): a
 * kve_session is an llm_context of one sequence with the single-sequence
 * loop (engine/gen/session.h) on it, driven from the caller's thread. */
#include "kvengine.h"
#include "kvengine_impl.h"

#include "gen/policy.h"
#include "gen/session.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

_Static_assert((int)KVE_STOP_ERROR == (int)LLM_STOP_ERROR && (int)KVE_STOP_EOG == (int)LLM_STOP_EOG,
               "stop reasons are the engine's");
_Static_assert((int)KVE_MAX_STOPS == (int)LLM_MAX_STOPS && (int)KVE_MAX_DRAFT == (int)LLM_MAX_DRAFT, "limits are the engine's");

int kve_session_dir_clean(const char *dir, char *err, size_t errlen) {
    if (!dir) return llm_errf(err, errlen, -1, "no directory");
    return llm_session_dir_clean(dir, err, errlen);
}

/* ---------------------------------------------------------------- sessions */

struct kve_session {
    llm_context *c;
    llm_session *s;
    kve_session_params p;   /* resolved */
    kve_session_options o;
};

kve_session_params kve_session_default_params(void) {
    llm_context_params d = llm_context_default_params();
    return (kve_session_params){.n_ctx = 0, .n_threads = 0, .n_batch = d.n_batch, .kv_type = d.kv_type,
                                .act_bits = d.act_bits, .no_window = 0};
}

kve_session_options kve_session_default_options(void) {
    return (kve_session_options){.size = sizeof(kve_session_options)};
}

int kve_session_create(const kve_model *m, const kve_session_params *p, kve_session **out, char *err,
                       size_t errlen) {
    return kve_session_create_ex(m, p, NULL, out, err, errlen);
}

int kve_session_create_ex(const kve_model *m, const kve_session_params *pp, const kve_session_options *po,
                          kve_session **out, char *err, size_t errlen) {
    if (!out) return llm_errf(err, errlen, KVE_ERR_NULL, "missing argument");
    *out = NULL;
    if (!m) return llm_errf(err, errlen, KVE_ERR_NULL, "no model");
    /* the caller's struct may be older and shorter than ours: the fields it
     * lacks keep their defaults */
    kve_session_options o = kve_session_default_options();
    if (po) {
        if (po->size < offsetof(kve_session_options, window) + sizeof o.window || po->size > sizeof o)
            return llm_errf(err, errlen, KVE_ERR_PARAM, "options size %zu is not one this library knows (%zu)",
                            po->size, sizeof o);
        memcpy(&o, po, po->size);
    }
    if (o.window < 0) return llm_errf(err, errlen, KVE_ERR_PARAM, "window must be >= 0 (0: the model's own windows)");
    kve_session_params p = pp ? *pp : kve_session_default_params();
    if (p.n_ctx < 0) return llm_errf(err, errlen, KVE_ERR_PARAM, "n_ctx must be >= 0");
    if (p.n_threads < 0) return llm_errf(err, errlen, KVE_ERR_PARAM, "n_threads must be >= 0 (0: one per core)");
    if (p.n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        p.n_threads = n < 1 ? 1 : n > 64 ? 64 : (int32_t)n;
    }
    llm_context_params cp = llm_context_default_params();
    cp.n_ctx = p.n_ctx, cp.n_seqs = 1, cp.n_threads = p.n_threads, cp.n_batch = p.n_batch;
    cp.kv_type = p.kv_type, cp.act_bits = p.act_bits, cp.no_window = p.no_window, cp.window = o.window;
    kve_session *s = calloc(1, sizeof *s);
    if (!s) return llm_errf(err, errlen, KVE_ERR_NOMEM, "out of memory");
    int rc = llm_context_create(m->m, &cp, &s->c, err, errlen);
    if (rc == LLM_OK && (rc = llm_session_create(s->c, &s->s)) != LLM_OK)
        llm_errf(err, errlen, rc, "%s", llm_status_str(rc));
    if (rc != LLM_OK) {
        llm_context_free(s->c);
        free(s);
        return rc;
    }
    llm_context_params got = llm_context_get_params(s->c);
    p.n_ctx = got.n_ctx, p.n_threads = got.n_threads, p.act_bits = got.act_bits;
    s->p = p, s->o = o;
    *out = s;
    return KVE_OK;
}

void kve_session_free(kve_session *s) {
    if (!s) return;
    llm_session_free(s->s);
    llm_context_free(s->c);
    free(s);
}

kve_session_params kve_session_get_params(const kve_session *s) {
    return s ? s->p : kve_session_default_params();
}

kve_generate_params kve_generate_default_params(void) {
    llm_gen_params g = llm_gen_default_params();
    return (kve_generate_params){.max_tokens = g.max_tokens, .temperature = g.sampler.temp, .top_k = g.sampler.top_k,
                                 .top_p = g.sampler.top_p, .min_p = g.sampler.min_p,
                                 .repeat_penalty = 1, .repeat_last_n = g.sampler.repeat_last_n,
                                 .random_state = g.sampler.seed};
}

int kve_session_generate(kve_session *s, const int32_t *tokens, int32_t n, const kve_generate_params *p,
                         kve_generate_result *res) {
    if (res) memset(res, 0, sizeof *res), res->eog_token = -1;
    if (!s || !p || !res || (!tokens && n)) return res ? (res->status = KVE_ERR_NULL) : KVE_ERR_NULL;
    llm_gen_params g = llm_gen_default_params();
    g.max_tokens = p->max_tokens;
    g.sampler = (llm_sampler_params){.temp = p->temperature, .top_k = p->top_k, .top_p = p->top_p,
                                     .seed = p->random_state, .min_p = p->min_p,
                                     .repeat_penalty = p->repeat_penalty, .repeat_last_n = p->repeat_last_n,
                                     .presence_penalty = p->presence_penalty,
                                     .frequency_penalty = p->frequency_penalty,
                                     .rules = p->grammar ? p->grammar->rules : NULL};
    g.stops = p->stops, g.n_stops = p->n_stops;
    g.reserve = p->reserve;
    g.on_token = p->on_token, g.on_text = p->on_text, g.user = p->user;
    g.progress = p->on_progress, g.progress_user = p->progress_user;
    g.context_shift = p->context_shift, g.n_keep = p->n_keep, g.draft_lookup = p->draft_lookup;
    g.ignore_eog = p->ignore_eog;
    llm_gen_result r;
    int rc = llm_session_generate(s->s, tokens, n, &g, &r);
    *res = (kve_generate_result){.stop = (kve_stop_reason)r.reason, .status = r.status, .n_prompt = r.n_prompt,
                                 .n_reused = r.n_reused, .n_generated = r.n_generated, .eog_token = r.eog_token,
                                 .t_prefill = r.t_prefill, .t_decode = r.t_decode, .n_shifts = r.n_shifts,
                                 .n_discarded = r.n_discarded, .n_passes = r.n_passes, .n_drafted = r.n_drafted,
                                 .n_accepted = r.n_accepted};
    _Static_assert(sizeof res->message == sizeof r.message, "one message size");
    memcpy(res->message, r.message, sizeof r.message);
    return rc;
}

int kve_session_feed(kve_session *s, const int32_t *tokens, int32_t n) {
    if (!s || (!tokens && n)) return KVE_ERR_NULL;
    return llm_session_feed(s->s, tokens, n);
}

int kve_session_eval(kve_session *s, const int32_t *tokens, int32_t n, int32_t first, float *logits) {
    if (!s || (!tokens && n) || (!logits && first < n)) return KVE_ERR_NULL;
    if (n < 0 || first < 0 || first > n) return KVE_ERR_PARAM;
    int rc = llm_session_eval(s->s, tokens, n, first, logits);
    return rc == LLM_ERR_SHAPE ? KVE_ERR_PARAM : rc;
}

int kve_session_eval_reference(kve_session *s, const int32_t *tokens, int32_t n, int32_t first, float *logits) {
    if (!s || (!tokens && n) || (!logits && first < n)) return KVE_ERR_NULL;
    if (n < 0 || n > s->p.n_ctx || first < 0 || first > n) return KVE_ERR_PARAM;
    if (first == n) return KVE_OK;
    return llm_forward_dense(s->c, tokens, n, first, logits);
}

int kve_session_shift(kve_session *s, int32_t n_keep, int32_t n_min, int32_t *n_dropped) {
    if (n_dropped) *n_dropped = 0;
    if (!s || !n_dropped) return KVE_ERR_NULL;
    const int32_t held = llm_session_n_cached(s->s);
    if (n_keep < 0 || n_keep > held || n_min < 0 || n_min > held - n_keep) return KVE_ERR_PARAM;
    int32_t drop = llm_shift_discard(held, n_keep);
    drop = drop > n_min ? drop : n_min;
    drop = drop < held - n_keep ? drop : held - n_keep;
    int rc = llm_session_shift(s->s, n_keep, drop);
    if (rc == LLM_OK) *n_dropped = drop;
    return rc;
}

int kve_session_truncate(kve_session *s, int32_t n) {
    if (!s) return KVE_ERR_NULL;
    int32_t held;
    llm_session_tokens(s->s, &held);
    if (n < 0 || n > held) return KVE_ERR_PARAM;
    return llm_session_truncate(s->s, n);
}

void kve_session_reset(kve_session *s) {
    if (s) llm_session_reset(s->s);
}

void kve_session_clear_prefixes(kve_session *s) {
    if (!s) return;
    for (int32_t g = 0; g < llm_context_n_caches(s->c); g++) kv_prefix_clear(llm_context_cache_at(s->c, g));
}

const int32_t *kve_session_tokens(const kve_session *s, int32_t *n) {
    int32_t k = 0;
    const int32_t *t = s ? llm_session_tokens(s->s, &k) : NULL;
    if (n) *n = k;
    return t;
}

int32_t kve_session_n_cached(const kve_session *s) { return s ? llm_session_n_cached(s->s) : 0; }

int kve_session_save(const kve_session *s, const char *path, char *err, size_t errlen) {
    if (!s || !path) return llm_errf(err, errlen, KVE_ERR_NULL, "no session or no path");
    return llm_session_save(s->s, path, err, errlen);
}

int kve_session_load(kve_session *s, const char *path, const int32_t *prompt, int32_t n, int32_t *n_restored,
                     char *err, size_t errlen) {
    if (n_restored) *n_restored = 0;
    if (!s || !path || !n_restored || (!prompt && n)) return llm_errf(err, errlen, KVE_ERR_NULL, "missing argument");
    return llm_session_load(s->s, path, prompt, n, n_restored, err, errlen);
}

kv_cache_stats kve_session_cache_stats(const kve_session *s) {
    kv_cache_stats z;
    memset(&z, 0, sizeof z);
    return s ? llm_context_stats(s->c) : z;
}

int kve_session_cache_group(const kve_session *s, int32_t g, int32_t *n_layers, int32_t *window,
                            kv_cache_stats *stats) {
    if (!s) return KVE_ERR_NULL;
    if (g < 0 || g >= llm_context_n_caches(s->c)) return KVE_ERR_PARAM;
    const kv_cache *c = llm_context_cache_at(s->c, g);
    if (n_layers) *n_layers = kv_cache_get_params(c).n_layers;
    if (window) *window = kv_cache_get_params(c).window;
    if (stats) *stats = kv_cache_get_stats(c);
    return KVE_OK;
}

int kve_session_read_kv(const kve_session *s, int32_t g, int32_t layer, int32_t pos, int32_t n, float *k, float *v) {
    if (!s || ((!k || !v) && n > 0)) return KVE_ERR_NULL;
    if (g < 0 || g >= llm_context_n_caches(s->c)) return KVE_ERR_PARAM;
    const kv_cache *c = llm_context_cache_at(s->c, g);
    if (layer < 0 || layer >= kv_cache_get_params(c).n_layers || n < 0 || pos < 0 || pos > llm_session_n_cached(s->s) - n)
        return KVE_ERR_PARAM;
    if (n == 0) return KVE_OK;
    int rc = kv_read_f32(c, layer, llm_session_seq(s->s), pos, n, k, v);
    return rc == KV_OK ? KVE_OK : KVE_ERR_PARAM;
}
