/* engine/kvengine.c - the public engine API (include/kvengine.h) over the
 * model, the tokenizer, the chat templates and the scheduler: a context is an
 * llm_context with an llm_sched running on a thread of its own; a request is
 * a scheduler request whose events land in a buffer that kve_request_poll
 * reads (and are passed to the caller's callback as they come). */
#include "kvengine.h"

#include "text/chat.h"
#include "model/model.h"
#include "gen/scheduler.h"
#include "gen/tier.h"
#include "text/grammar.h"
#include "text/tokenizer.h"
#include "weights/quant.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvengine_impl.h"

struct kve_context {
    const kve_model *model;
    llm_context *c;
    llm_sched *s;
    llm_tier *tier;              /* options.cache_dir, or NULL */
    pthread_t thread;
    pthread_mutex_t stop_mu;     /* kve_context_stop once */
    int stopped;
    int listening;               /* options.on_prefix is set on the cache */
    kve_context_params p;
};

struct kve_request {
    kve_context *ctx;
    uint64_t id;
    kve_event_fn fn;
    void *user;
    int32_t n_choices;
    int unbuffered;             /* n_choices > 1 or callback_only: nothing kept for polling but the end */
    kve_stop_reason stop0;      /* with n_choices > 1: choice 0's reason, given at the end */
    int32_t top;                /* alternatives per token; < 0: no log-probabilities */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* written by the scheduler thread, under mu */
    char *text;
    size_t n_text, cap_text, text_read;
    int32_t *tokens, *top_ids;
    float *lps, *top_lps;
    int32_t n_tok, cap_tok, tok_read;
    kve_stop_reason stop;
    int status, done;
    char error[192];
    int32_t n_prompt, n_cached, n_generated;
    /* the poller's copies, valid until its next poll */
    char *r_text;
    size_t cap_r_text;
    int32_t *r_tokens, *r_top_ids;
    float *r_lps, *r_top_lps;
    int32_t cap_r_tok;
};

/* ---------------------------------------------------------------- status */

const char *kve_status_str(int status) {
    if (status == KVE_ERR_TEMPLATE) return "the model has no chat template this engine knows";
    if (status == KVE_ERR_TIMEOUT) return "nothing new within the time given";
    if (status == KVE_ERR_SPACE) return "the output buffer is too small (the size needed was given)";
    return llm_status_str(status);
}

const char *kve_stop_reason_str(kve_stop_reason r) { return llm_stop_reason_str((llm_stop_reason)r); }

/* ---------------------------------------------------------------- model */

int kve_model_load(const char *path, kve_model **out, char *err, size_t errlen) {
    if (!out) return llm_errf(err, errlen, KVE_ERR_NULL, "missing argument");
    *out = NULL;
    if (!path) return llm_errf(err, errlen, KVE_ERR_NULL, "no model path");
    kve_model *km = calloc(1, sizeof *km);
    if (!km) return llm_errf(err, errlen, KVE_ERR_NOMEM, "out of memory");
    int rc = llm_model_load(path, &km->m, err, errlen);
    if (rc != LLM_OK) {
        free(km);
        return rc;
    }
    pthread_mutex_init(&km->mu, NULL);
    *out = km;
    return KVE_OK;
}

void kve_model_free(kve_model *m) {
    if (!m) return;
    llm_model_free(m->m);
    llm_grammar_vocab_free(m->vocab);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

const llm_grammar_vocab *kve_model_grammar_vocab(const kve_model *cm) {
    kve_model *m = (kve_model *)cm;   /* made once, then read-only */
    pthread_mutex_lock(&m->mu);
    if (!m->vocab) m->vocab = llm_grammar_vocab_new(llm_model_tokenizer(m->m));
    llm_grammar_vocab *v = m->vocab;
    pthread_mutex_unlock(&m->mu);
    return v;
}

kve_tool_style kve_model_tool_style(const kve_model *m) {
    return m && llm_model_chat(m->m)->kind == LLM_CHAT_LLAMA3 ? KVE_TOOLS_LLAMA3 : KVE_TOOLS_HERMES;
}

const char *kve_chat_default_system(const kve_model *m) { return m ? llm_model_chat(m->m)->default_system : ""; }

int32_t kve_model_n_vocab(const kve_model *m) { return m ? llm_model_n_vocab(m->m) : 0; }
int32_t kve_model_n_ctx_train(const kve_model *m) { return m ? llm_model_hparams(m->m)->ctx_train : 0; }
const char *kve_model_name(const kve_model *m) { return m ? llm_model_name(m->m) : ""; }
int kve_model_has_chat_template(const kve_model *m) { return m && llm_model_chat(m->m)->kind != LLM_CHAT_UNKNOWN; }
int32_t kve_model_bos(const kve_model *m) { return m ? llm_tokenizer_bos(llm_model_tokenizer(m->m)) : -1; }

kve_model_shape kve_model_get_shape(const kve_model *m) {
    kve_model_shape sh = {0};
    if (!m) return sh;
    const llm_hparams *hp = llm_model_hparams(m->m);
    sh.n_layers = hp->n_layers, sh.dim = hp->dim, sh.n_heads = hp->n_heads, sh.n_kv_heads = hp->n_kv_heads;
    sh.head_dim = hp->head_dim, sh.ffn_dim = hp->ffn_dim, sh.n_groups = llm_model_n_groups(m->m);
    sh.weight_bytes = llm_model_weight_bytes(m->m);
    sh.packed_bytes = llm_model_packed_bytes(m->m), sh.streamed_bytes = llm_model_streamed_bytes(m->m);
    return sh;
}

const char *kve_kernels(void) { return llm_quant_kernels(); }

int kve_model_group(const kve_model *m, int32_t g, int32_t *n_layers, int32_t *window) {
    if (!m) return KVE_ERR_NULL;
    return llm_model_group(m->m, g, n_layers, window) == LLM_OK ? KVE_OK : KVE_ERR_PARAM;
}

int kve_tokenize(const kve_model *m, const char *text, size_t len, int add_special, int parse_special, int32_t *out,
                 int32_t cap, int32_t *n_out) {
    if (n_out) *n_out = 0;
    if (!m || !n_out || (!text && len) || (!out && cap > 0) || cap < 0) return KVE_ERR_NULL;
    const llm_tokenizer *tok = llm_model_tokenizer(m->m);
    int32_t n = llm_tokenize(tok, text ? text : "", len, add_special, parse_special, out, cap);
    if (n == LLM_TOK_ERR) return KVE_ERR_NOMEM;
    *n_out = n < 0 ? -n : n;
    return n < 0 || (n > 0 && !out) ? KVE_ERR_SPACE : KVE_OK;
}

int kve_detokenize(const kve_model *m, const int32_t *ids, int32_t n, int render_special, char *out, size_t cap,
                   size_t *len) {
    if (len) *len = 0;
    if (!m || !len || (!ids && n) || n < 0 || (!out && cap > 0)) return KVE_ERR_NULL;
    const llm_tokenizer *tok = llm_model_tokenizer(m->m);
    const int32_t V = llm_tokenizer_n_vocab(tok);
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) return KVE_ERR_TOKEN;
    int32_t c = cap > INT32_MAX ? INT32_MAX : (int32_t)cap;
    int32_t r = llm_detokenize(tok, ids, n, render_special ? LLM_DETOK_SPECIAL : 0, c ? out : NULL, c);
    if (r == LLM_TOK_ERR) return KVE_ERR_TOKEN;
    *len = (size_t)(r < 0 ? -(int64_t)r - 1 : r);
    return r < 0 ? KVE_ERR_SPACE : KVE_OK;
}

static int messages_ok(const kve_chat_message *msgs, int32_t n) {
    if (n < 1 || !msgs) return 0;
    for (int32_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content) return 0;
    return 1;
}

/* The model's format with the request's thinking switch in *f. */
static int chat_format(const kve_model *m, int enable_thinking, llm_chat_format *f) {
    if (enable_thinking < -1 || enable_thinking > 1) return KVE_ERR_PARAM;
    *f = *llm_model_chat(m->m);
    return enable_thinking < 0 || llm_chat_set_thinking(f, enable_thinking) == 0 ? KVE_OK : KVE_ERR_TEMPLATE;
}

int kve_chat_apply(const kve_model *m, const kve_chat_message *msgs, int32_t n, int add_assistant, char *out,
                   size_t cap, size_t *len) {
    return kve_chat_apply_ex(m, msgs, n, add_assistant, -1, out, cap, len);
}

int kve_chat_apply_ex(const kve_model *m, const kve_chat_message *msgs, int32_t n, int add_assistant,
                      int enable_thinking, char *out, size_t cap, size_t *len) {
    if (len) *len = 0;
    if (!m || !len || (!out && cap > 0)) return KVE_ERR_NULL;
    if (!messages_ok(msgs, n)) return KVE_ERR_PARAM;
    if (!kve_model_has_chat_template(m)) return KVE_ERR_TEMPLATE;
    llm_chat_format f;
    int rc = chat_format(m, enable_thinking, &f);
    if (rc != KVE_OK) return rc;
    /* the two message structs are the same two pointers */
    _Static_assert(sizeof(kve_chat_message) == sizeof(llm_chat_msg), "chat message layout");
    int32_t c = cap > INT32_MAX ? INT32_MAX : (int32_t)cap;
    int32_t r = llm_chat_render(&f, (const llm_chat_msg *)msgs, n, add_assistant, c ? out : NULL, c);
    if (r == LLM_CHAT_ERR) return KVE_ERR_NOMEM;
    *len = (size_t)(r < 0 ? -(int64_t)r - 1 : r);
    return r < 0 ? KVE_ERR_SPACE : KVE_OK;
}

int kve_chat_tokenize(const kve_model *m, const kve_chat_message *msgs, int32_t n, int32_t n_prev, int add_assistant,
                      int add_bos, int enable_thinking, int32_t *out, int32_t cap, int32_t *n_out) {
    if (n_out) *n_out = 0;
    if (!m || !n_out || (!out && cap > 0) || cap < 0) return KVE_ERR_NULL;
    if (!messages_ok(msgs, n) || n_prev < 0 || n_prev > n) return KVE_ERR_PARAM;
    if (!kve_model_has_chat_template(m)) return KVE_ERR_TEMPLATE;
    llm_chat_format f;
    int rc = chat_format(m, enable_thinking, &f);
    if (rc != KVE_OK) return rc;
    int32_t *ids = NULL;
    int32_t k = llm_chat_tokenize_continuation(&f, llm_model_tokenizer(m->m), (const llm_chat_msg *)msgs, n, n_prev,
                                               add_assistant, add_bos, &ids);
    if (k < 0) return KVE_ERR_NOMEM;
    *n_out = k;
    rc = k > cap ? KVE_ERR_SPACE : KVE_OK;
    if (rc == KVE_OK && k) memcpy(out, ids, sizeof *ids * (size_t)k);
    free(ids);
    return rc;
}

const char *kve_chat_turn_end(const kve_model *m) {
    return kve_model_has_chat_template(m) ? llm_chat_turn_end(llm_model_chat(m->m)) : "";
}

const char *kve_token_piece(const kve_model *m, int32_t id, size_t *len) {
    if (len) *len = 0;
    if (!m || id < 0 || id >= llm_model_n_vocab(m->m)) return NULL;
    int32_t n = 0;
    const char *p = llm_token_piece(llm_model_tokenizer(m->m), id, &n);
    if (p && len) *len = (size_t)n;
    return p;
}

/* ---------------------------------------------------------------- context */

kve_context_params kve_context_default_params(void) {
    return (kve_context_params){.n_ctx = 0, .n_seqs = 8, .n_threads = 0, .n_batch = 512, .kv_type = KV_F16,
                                .n_pages = 0, .max_waiting = 256};
}

static void *sched_main(void *arg) {
    llm_sched_run(arg);
    return NULL;
}

kve_context_options kve_context_default_options(void) {
    return (kve_context_options){.size = sizeof(kve_context_options), .act_bits = -1, .n_keep = 4,
                                 .cache_disk_size = (uint64_t)1 << 30};
}

int kve_context_create(const kve_model *m, const kve_context_params *pp, kve_context **out, char *err,
                       size_t errlen) {
    return kve_context_create_ex(m, pp, NULL, out, err, errlen);
}

/* The caller's options over the defaults: the fields its size covers. */
static int options_in(void *dst, size_t dst_size, const void *src, size_t src_size, const char *what, char *err,
                      size_t errlen) {
    if (!src) return KVE_OK;
    if (src_size < sizeof(size_t) || src_size > dst_size)
        return llm_errf(err, errlen, KVE_ERR_PARAM, "%s.size is %zu: set it to sizeof(%s) (%zu in this library)",
                        what, src_size, what, dst_size);
    memcpy(dst, src, src_size);
    return KVE_OK;
}

int kve_context_create_ex(const kve_model *m, const kve_context_params *pp, const kve_context_options *po,
                          kve_context **out, char *err, size_t errlen) {
    if (!out) return llm_errf(err, errlen, KVE_ERR_NULL, "missing argument");
    *out = NULL;
    if (!m) return llm_errf(err, errlen, KVE_ERR_NULL, "no model");
    kve_context_params p = pp ? *pp : kve_context_default_params();
    kve_context_options o = kve_context_default_options();
    int rc = options_in(&o, sizeof o, po, po ? po->size : 0, "kve_context_options", err, errlen);
    if (rc != KVE_OK) return rc;
    if (o.act_bits != -1 && o.act_bits != 0 && o.act_bits != 8 && o.act_bits != 16)
        return llm_errf(err, errlen, KVE_ERR_PARAM, "act_bits must be -1, 0, 8 or 16");
    if (o.draft_lookup < 0 || o.draft_lookup > KVE_MAX_DRAFT)
        return llm_errf(err, errlen, KVE_ERR_PARAM, "draft_lookup must be in [0, %d]", KVE_MAX_DRAFT);
    if (o.n_keep < 0) return llm_errf(err, errlen, KVE_ERR_PARAM, "n_keep must be >= 0");
    if (o.cache_dir && (!o.cache_dir[0] || o.cache_disk_size == 0))
        return llm_errf(err, errlen, KVE_ERR_PARAM, "cache_dir needs a path and a cache_disk_size > 0");
    if (p.n_seqs < 1 || p.n_seqs > 4096) return llm_errf(err, errlen, KVE_ERR_PARAM, "n_seqs must be in [1, 4096]");
    if (p.n_threads < 0 || p.n_threads > 1024)
        return llm_errf(err, errlen, KVE_ERR_PARAM, "n_threads must be in [0, 1024] (0: one per core)");
    if (p.n_batch < 1 || p.n_batch > 8192) return llm_errf(err, errlen, KVE_ERR_PARAM, "n_batch must be in [1, 8192]");
    if (p.max_waiting < 0) return llm_errf(err, errlen, KVE_ERR_PARAM, "max_waiting must be >= 0");
    if (p.n_ctx < 0 || p.n_pages < 0) return llm_errf(err, errlen, KVE_ERR_PARAM, "n_ctx and n_pages must be >= 0");
    if (p.n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        p.n_threads = n < 1 ? 1 : n > 64 ? 64 : (int32_t)n;
    }
    llm_context_params cp = llm_context_default_params();
    cp.n_ctx = p.n_ctx, cp.n_seqs = p.n_seqs, cp.n_threads = p.n_threads, cp.n_batch = p.n_batch;
    cp.kv_type = p.kv_type, cp.n_pages = p.n_pages, cp.act_bits = o.act_bits, cp.no_window = o.no_window;
    kve_context *c = calloc(1, sizeof *c);
    if (!c) return llm_errf(err, errlen, KVE_ERR_NOMEM, "out of memory");
    c->model = m;
    pthread_mutex_init(&c->stop_mu, NULL);
    rc = llm_context_create(m->m, &cp, &c->c, err, errlen);
    if (rc == LLM_OK && o.cache_dir) {
        char why[256];
        rc = llm_tier_open(o.cache_dir, o.cache_disk_size, c->c, &c->tier, why, sizeof why);
        if (rc != LLM_OK) llm_errf(err, errlen, rc, "cache_dir %s: %s", o.cache_dir, why);
    }
    if (rc == LLM_OK) {
        llm_sched_params sp = llm_sched_default_params();
        sp.batch_tokens = p.n_batch, sp.max_waiting = p.max_waiting;
        sp.context_shift = o.context_shift, sp.n_keep = o.n_keep, sp.draft_lookup = o.draft_lookup;
        sp.no_prefix = o.no_prefix, sp.log = o.log, sp.log_user = o.log_user, sp.tier = c->tier;
        rc = llm_sched_create(c->c, &sp, &c->s);
        if (rc != LLM_OK) llm_errf(err, errlen, rc, "scheduler: %s", llm_status_str(rc));
    }
    if (rc == LLM_OK && o.on_prefix) {   /* before the scheduler changes the cache */
        kv_cache_set_prefix_listener(llm_context_cache(c->c), o.on_prefix, o.prefix_user);
        c->listening = 1;
    }
    pthread_attr_t at;
    if (rc == LLM_OK) { /* attention keeps its tiles on the stack (kvcache.h, "Stack") */
        pthread_attr_init(&at);
        pthread_attr_setstacksize(&at, 8u << 20);
        if (pthread_create(&c->thread, &at, sched_main, c->s) != 0)
            rc = llm_errf(err, errlen, KVE_ERR_NOMEM, "cannot start the scheduler thread");
        pthread_attr_destroy(&at);
    }
    if (rc != LLM_OK) {
        if (c->listening) kv_cache_set_prefix_listener(llm_context_cache(c->c), NULL, NULL);
        llm_sched_free(c->s);
        llm_tier_close(c->tier);
        llm_context_free(c->c);
        pthread_mutex_destroy(&c->stop_mu);
        free(c);
        return rc;
    }
    p.n_ctx = llm_context_get_params(c->c).n_ctx;
    c->p = p;
    *out = c;
    return KVE_OK;
}

void kve_context_stop(kve_context *c) {
    if (!c) return;
    pthread_mutex_lock(&c->stop_mu);
    if (!c->stopped) {
        llm_sched_stop(c->s);
        pthread_join(c->thread, NULL);   /* every request has had its last event */
        if (c->listening) kv_cache_set_prefix_listener(llm_context_cache(c->c), NULL, NULL);
        c->stopped = 1;
    }
    pthread_mutex_unlock(&c->stop_mu);
}

void kve_context_free(kve_context *c) {
    if (!c) return;
    kve_context_stop(c);
    llm_sched_free(c->s);     /* unhooks itself from the tier */
    llm_tier_close(c->tier);  /* every named page not yet on disk is written */
    llm_context_free(c->c);
    pthread_mutex_destroy(&c->stop_mu);
    free(c);
}

int kve_context_get_stats(const kve_context *c, kve_context_stats *st) {
    if (!c || !st) return KVE_ERR_NULL;
    size_t size = st->size;
    if (size == 0 || size > sizeof *st) return KVE_ERR_PARAM;
    llm_sched_stats s = llm_sched_get_stats(c->s);
    kve_context_stats k = {.size = size, .running = s.running, .waiting = s.waiting, .pages_total = s.pages_total,
                           .pages_used = s.pages_used, .pages_free = s.pages_free, .pages_cached = s.pages_cached,
                           .page_size = llm_context_get_params(c->c).page_size, .prefix_queries = s.prefix_queries,
                           .prefix_hits = s.prefix_hits, .prompt_tokens = s.prompt_tokens,
                           .generation_tokens = s.generation_tokens, .preemptions = s.preemptions,
                           .prefill_waits = s.prefill_waits, .disk_waits = s.disk_waits, .steps = s.steps,
                           .rows = s.rows, .shifts = s.shifts, .drafted = s.drafted, .accepted = s.accepted,
                           .session_restores = s.session_restores, .session_restored = s.session_restored,
                           .session_refused = s.session_refused, .session_saves = s.session_saves,
                           .session_save_failures = s.session_save_failures, .session_seconds = s.session_seconds};
    if (c->tier) {
        llm_tier_stats t = llm_tier_get_stats(c->tier);
        k.disk_on = 1, k.disk_hits = t.hits, k.disk_misses = t.misses, k.disk_damaged = t.damaged;
        k.disk_bytes_read = t.bytes_read, k.disk_writes = t.writes, k.disk_bytes_written = t.bytes_written;
        k.disk_dropped = t.dropped, k.disk_evictions = t.evictions, k.disk_entries = t.entries, k.disk_bytes = t.bytes;
    }
    memcpy(st, &k, size);
    return KVE_OK;
}

kve_context_params kve_context_get_params(const kve_context *c) {
    return c ? c->p : kve_context_default_params();
}

/* ---------------------------------------------------------------- requests */

kve_request_params kve_request_default_params(void) {
    llm_sampler_params s = llm_sampler_default_params();
    return (kve_request_params){.max_tokens = 128, .temperature = s.temp, .top_k = s.top_k, .top_p = s.top_p,
                                .min_p = s.min_p, .repeat_penalty = 1.0f, .random_state = s.seed,
                                .top_logprobs = -1, .enable_thinking = -1};
}

static void request_destroy(kve_request *r) {
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->text), free(r->tokens), free(r->top_ids), free(r->lps), free(r->top_lps);
    free(r->r_text), free(r->r_tokens), free(r->r_top_ids), free(r->r_lps), free(r->r_top_lps);
    free(r);
}

/* Room for one more token (and its alternatives) and len more bytes. */
static int grow(kve_request *r, size_t len) {
    if (r->n_text + len + 1 > r->cap_text) {
        size_t cap = 2 * (r->n_text + len + 1) + 64;
        char *t = realloc(r->text, cap);
        if (!t) return -1;
        r->text = t, r->cap_text = cap;
    }
    if (r->n_tok == r->cap_tok) {
        int32_t cap = r->cap_tok ? 2 * r->cap_tok : 64, nt = r->top > 0 ? r->top : 1;
        int32_t *t = realloc(r->tokens, sizeof *t * (size_t)cap);
        if (t) r->tokens = t;
        float *l = t ? realloc(r->lps, sizeof *l * (size_t)cap) : NULL;
        if (l) r->lps = l;
        int32_t *ti = l ? realloc(r->top_ids, sizeof *ti * (size_t)cap * (size_t)nt) : NULL;
        if (ti) r->top_ids = ti;
        float *tl = ti ? realloc(r->top_lps, sizeof *tl * (size_t)cap * (size_t)nt) : NULL;
        if (!tl) return -1;
        r->top_lps = tl, r->cap_tok = cap;
    }
    return 0;
}

/* The caller's callback with the scheduler's event ev. */
static void call_back(const kve_request *r, const llm_sched_event *ev) {
    kve_event e = {.token = ev->token, .text = ev->text, .text_len = ev->text_len, .logprob = ev->logprob,
                   .stop = (kve_stop_reason)ev->finish, .choice = ev->choice, .n_top = ev->n_top,
                   .top_ids = ev->top_ids, .top_logprobs = ev->top_logprobs, .n_prompt = ev->n_prompt,
                   .n_cached = ev->n_cached, .n_generated = ev->n_generated, .status = ev->status,
                   .error = ev->finish == LLM_STOP_ERROR ? ev->error : NULL};
    r->fn(r->user, &e);
}

/* Records why the request failed (under r->mu). */
static void set_error(kve_request *r, const llm_sched_event *ev) {
    r->status = ev->status ? ev->status : KVE_ERR_PARAM;
    snprintf(r->error, sizeof r->error, "%s", ev->error ? ev->error : kve_status_str(r->status));
}

/* The scheduler's events (on its thread): into the buffer, then to the
 * callback; unbuffered, a token goes to the callback alone, with no lock. */
static void on_sched_event(void *user, const llm_sched_event *ev) {
    kve_request *r = user;
    if (r->unbuffered && !ev->done) {
        if (ev->finish != LLM_STOP_NONE) {
            pthread_mutex_lock(&r->mu);
            r->n_prompt = ev->n_prompt, r->n_cached = ev->n_cached;
            if (ev->choice == 0) r->stop0 = (kve_stop_reason)ev->finish;
            if (ev->finish == LLM_STOP_ERROR && !r->status) set_error(r, ev);
            pthread_mutex_unlock(&r->mu);
        }
        if (r->fn) call_back(r, ev);
        return;
    }
    pthread_mutex_lock(&r->mu);
    r->n_prompt = ev->n_prompt, r->n_cached = ev->n_cached;
    if (ev->done) {
        if (r->unbuffered) {   /* the end comes when every choice has ended */
            r->n_generated = ev->n_generated;
            if (r->stop == KVE_STOP_NONE) r->stop = r->stop0;
        }
        r->done = 1;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        return;
    }
    int oom = grow(r, ev->text_len);
    if (!oom) {
        memcpy(r->text + r->n_text, ev->text, ev->text_len);
        r->n_text += ev->text_len;
        if (ev->token >= 0) {
            int32_t nt = r->top > 0 ? r->top : 0, k = r->n_tok++;
            r->tokens[k] = ev->token, r->lps[k] = ev->logprob;
            for (int32_t j = 0; j < nt; j++) {
                r->top_ids[(size_t)k * nt + j] = j < ev->n_top ? ev->top_ids[j] : -1;
                r->top_lps[(size_t)k * nt + j] = j < ev->n_top ? ev->top_logprobs[j] : 0;
            }
        }
    }
    r->n_generated = ev->n_generated > r->n_generated ? ev->n_generated : r->n_generated;
    if (ev->finish != LLM_STOP_NONE && r->stop == KVE_STOP_NONE) {
        r->stop = (kve_stop_reason)ev->finish;
        if (ev->finish == LLM_STOP_ERROR) set_error(r, ev);
    } else if (oom && r->stop == KVE_STOP_NONE) {
        r->stop = KVE_STOP_ERROR, r->status = KVE_ERR_NOMEM;
        snprintf(r->error, sizeof r->error, "out of memory for the request's output");
        llm_sched_cancel(r->ctx->s, r->id);
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (r->fn) call_back(r, ev);
}

/* The prompt's token ids (malloc'ed) from whichever form p gives. */
static int prompt_ids(const kve_context *c, const kve_request_params *p, int32_t **ids, int32_t *n, char *err,
                      size_t errlen) {
    const llm_model *m = c->model->m;
    *ids = NULL, *n = 0;
    int forms = (p->prompt != NULL) + (p->tokens != NULL || p->n_tokens > 0) + (p->messages != NULL || p->n_messages > 0);
    if (forms != 1)
        return llm_errf(err, errlen, KVE_ERR_PARAM, "give exactly one of prompt, tokens and messages (%d given)", forms);
    if (p->enable_thinking != -1 && !p->messages)
        return llm_errf(err, errlen, KVE_ERR_PARAM, "enable_thinking goes with messages (-1 without them)");
    if (p->tokens || p->n_tokens) {
        if (!p->tokens || p->n_tokens < 1) return llm_errf(err, errlen, KVE_ERR_PARAM, "tokens: n_tokens must be >= 1");
        const int32_t V = llm_model_n_vocab(m);
        for (int32_t i = 0; i < p->n_tokens; i++)
            if (p->tokens[i] < 0 || p->tokens[i] >= V)
                return llm_errf(err, errlen, KVE_ERR_TOKEN, "token %d (id %d) is outside the vocabulary of %d", (int)i,
                                (int)p->tokens[i], (int)V);
        if (!(*ids = malloc(sizeof(int32_t) * (size_t)p->n_tokens))) return llm_errf(err, errlen, KVE_ERR_NOMEM, "out of memory");
        memcpy(*ids, p->tokens, sizeof(int32_t) * (size_t)p->n_tokens);
        *n = p->n_tokens;
        return KVE_OK;
    }
    if (p->messages || p->n_messages) {
        if (!messages_ok(p->messages, p->n_messages))
            return llm_errf(err, errlen, KVE_ERR_PARAM, "messages: at least one, each with a role and a content");
        if (!kve_model_has_chat_template(c->model))
            return llm_errf(err, errlen, KVE_ERR_TEMPLATE, "the model has no chat template this engine knows");
        llm_chat_format f;
        int rc = chat_format(c->model, p->enable_thinking, &f);
        if (rc == KVE_ERR_PARAM)
            return llm_errf(err, errlen, rc, "enable_thinking: -1 (the template's default), 0 or 1; got %d",
                            (int)p->enable_thinking);
        if (rc != KVE_OK)
            return llm_errf(err, errlen, rc, "enable_thinking: the model's chat template has no thinking switch");
        /* the template's markers are control tokens, the messages' text is text */
        *n = llm_chat_tokenize(&f, llm_model_tokenizer(m), (const llm_chat_msg *)p->messages, p->n_messages, 1, 1,
                               ids);
        if (*n == LLM_CHAT_ERR) return *n = 0, llm_errf(err, errlen, KVE_ERR_NOMEM, "the messages cannot be tokenized");
        return KVE_OK;
    }
    size_t len = strlen(p->prompt);
    int32_t need = llm_tokenize(llm_model_tokenizer(m), p->prompt, len, 1, 0, NULL, 0);
    int32_t cap = need < 0 ? -need : need;
    if (need == LLM_TOK_ERR || !(*ids = malloc(sizeof(int32_t) * (size_t)(cap ? cap : 1))))
        return llm_errf(err, errlen, KVE_ERR_NOMEM, "the prompt cannot be tokenized (out of memory)");
    *n = cap ? llm_tokenize(llm_model_tokenizer(m), p->prompt, len, 1, 0, *ids, cap) : 0;
    if (*n < 1) {
        free(*ids), *ids = NULL, *n = 0;
        return llm_errf(err, errlen, KVE_ERR_PARAM, "the prompt is empty (the model adds no BOS token)");
    }
    return KVE_OK;
}

kve_request_options kve_request_default_options(void) {
    return (kve_request_options){.size = sizeof(kve_request_options), .n_choices = 1,
                                 .repeat_last_n = llm_sampler_default_params().repeat_last_n};
}

int kve_submit(kve_context *c, const kve_request_params *p, kve_request **out, char *err, size_t errlen) {
    return kve_submit_ex(c, p, NULL, out, err, errlen);
}

/* The options' checks that need no prompt: KVE_OK or a refusal with err. */
static int check_options(const kve_context *c, const kve_request_options *o, char *err, size_t errlen) {
    if (o->n_choices < 1 || o->n_choices > KVE_MAX_CHOICES)
        return llm_errf(err, errlen, KVE_ERR_PARAM, "n_choices must be in [1, %d]; got %d", KVE_MAX_CHOICES,
                        (int)o->n_choices);
    if (o->repeat_last_n < -1) return llm_errf(err, errlen, KVE_ERR_PARAM, "repeat_last_n must be >= -1");
    if (o->n_logit_bias < 0 || (o->n_logit_bias && !o->logit_bias))
        return llm_errf(err, errlen, KVE_ERR_PARAM, "logit_bias: n_logit_bias must be >= 0, with an array");
    const int32_t V = llm_model_n_vocab(c->model->m);
    for (int32_t i = 0; i < o->n_logit_bias; i++) {
        if (o->logit_bias[i].token < 0 || o->logit_bias[i].token >= V)
            return llm_errf(err, errlen, KVE_ERR_TOKEN, "logit_bias %d: token %d is outside the vocabulary of %d",
                            (int)i, (int)o->logit_bias[i].token, (int)V);
        if (!(o->logit_bias[i].bias >= -100 && o->logit_bias[i].bias <= 100))
            return llm_errf(err, errlen, KVE_ERR_PARAM, "logit_bias %d: the bias must be in [-100, 100]", (int)i);
    }
    if (o->json_object && o->grammar)
        return llm_errf(err, errlen, KVE_ERR_PARAM, "json_object and grammar: give one of them");
    return KVE_OK;
}

int kve_submit_ex(kve_context *c, const kve_request_params *p, const kve_request_options *po, kve_request **out,
                  char *err, size_t errlen) {
    if (err && errlen) err[0] = 0;
    if (!out) return llm_errf(err, errlen, KVE_ERR_NULL, "missing argument");
    *out = NULL;
    if (!c || !p) return llm_errf(err, errlen, KVE_ERR_NULL, "missing argument");
    kve_request_options o = kve_request_default_options();
    int rc = options_in(&o, sizeof o, po, po ? po->size : 0, "kve_request_options", err, errlen);
    if (rc == KVE_OK) rc = check_options(c, &o, err, errlen);
    if (rc != KVE_OK) return rc;
    const llm_grammar_vocab *json = NULL;
    if (o.json_object && !(json = kve_model_grammar_vocab(c->model)))
        return llm_errf(err, errlen, KVE_ERR_NOMEM, "out of memory for the vocabulary's byte strings");
    if (p->top_logprobs > KVE_MAX_TOP)
        return llm_errf(err, errlen, KVE_ERR_PARAM, "top_logprobs must be at most %d", KVE_MAX_TOP);
    if (p->max_tokens == 0)
        return llm_errf(err, errlen, KVE_ERR_PARAM, "max_tokens must be >= 1 (or < 0: until the context is full)");
    int32_t *ids, n;
    rc = prompt_ids(c, p, &ids, &n, err, errlen);
    if (rc != KVE_OK) return rc;
    kve_request *r = calloc(1, sizeof *r);
    if (!r) {
        free(ids);
        return llm_errf(err, errlen, KVE_ERR_NOMEM, "out of memory");
    }
    r->ctx = c, r->fn = p->on_event, r->user = p->user, r->top = p->top_logprobs < 0 ? -1 : p->top_logprobs;
    r->n_choices = o.n_choices, r->unbuffered = o.n_choices > 1 || o.callback_only;
    r->n_prompt = n;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    llm_sampler_params sp = llm_sampler_default_params();
    sp.temp = p->temperature, sp.top_k = p->top_k, sp.top_p = p->top_p, sp.min_p = p->min_p;
    sp.repeat_penalty = p->repeat_penalty, sp.presence_penalty = p->presence_penalty;
    sp.frequency_penalty = p->frequency_penalty, sp.seed = p->random_state, sp.repeat_last_n = o.repeat_last_n;
    _Static_assert(sizeof(kve_logit_bias) == sizeof(llm_logit_bias), "logit bias layout");
    _Static_assert((int)KVE_MAX_CHOICES == (int)LLM_SCHED_MAX_CHOICES && (int)KVE_MAX_TOP == (int)LLM_SCHED_MAX_TOP,
                   "the scheduler's limits");
    sp.bias = (const llm_logit_bias *)o.logit_bias, sp.n_bias = o.n_logit_bias;
    sp.grammar = json, sp.json_root = LLM_JSON_OBJECT;
    sp.rules = o.grammar ? o.grammar->rules : NULL;
    llm_sched_request q = {.prompt = ids, .n_prompt = n, .n_choices = o.n_choices, .max_tokens = p->max_tokens,
                           .sampler = sp, .stops = p->stops, .n_stops = p->n_stops, .top_logprobs = r->top,
                           .cb = on_sched_event, .user = r, .session = o.session_file};
    /* the lock keeps the scheduler's first event behind r->id */
    pthread_mutex_lock(&r->mu);
    rc = llm_sched_submit(c->s, &q, &r->id, err, errlen);
    pthread_mutex_unlock(&r->mu);
    free(ids);
    if (rc != LLM_OK) {
        request_destroy(r);
        return rc == LLM_ERR_PARAM || rc == LLM_ERR_NULL ? KVE_ERR_PARAM : rc;
    }
    *out = r;
    return KVE_OK;
}

/* Copies what was not polled yet into the poller's buffers. Under r->mu. */
static int take(kve_request *r, kve_output *o) {
    size_t nt = r->n_text - r->text_read;
    int32_t nk = r->n_tok - r->tok_read, w = r->top > 0 ? r->top : 0;
    if (nt + 1 > r->cap_r_text) {
        char *t = realloc(r->r_text, nt + 1);
        if (!t) return KVE_ERR_NOMEM;
        r->r_text = t, r->cap_r_text = nt + 1;
    }
    if (nk > r->cap_r_tok) {
        int32_t *a = realloc(r->r_tokens, sizeof *a * (size_t)nk);
        if (a) r->r_tokens = a;
        float *b = a ? realloc(r->r_lps, sizeof *b * (size_t)nk) : NULL;
        if (b) r->r_lps = b;
        int32_t *cc = b ? realloc(r->r_top_ids, sizeof *cc * (size_t)nk * (size_t)(w ? w : 1)) : NULL;
        if (cc) r->r_top_ids = cc;
        float *d = cc ? realloc(r->r_top_lps, sizeof *d * (size_t)nk * (size_t)(w ? w : 1)) : NULL;
        if (!d) return KVE_ERR_NOMEM;
        r->r_top_lps = d, r->cap_r_tok = nk;
    }
    if (nt) memcpy(r->r_text, r->text + r->text_read, nt); /* a callback-only request keeps no text */
    r->r_text[nt] = 0;
    if (nk) {
        memcpy(r->r_tokens, r->tokens + r->tok_read, sizeof(int32_t) * (size_t)nk);
        memcpy(r->r_lps, r->lps + r->tok_read, sizeof(float) * (size_t)nk);
        if (w) {
            memcpy(r->r_top_ids, r->top_ids + (size_t)r->tok_read * w, sizeof(int32_t) * (size_t)nk * w);
            memcpy(r->r_top_lps, r->top_lps + (size_t)r->tok_read * w, sizeof(float) * (size_t)nk * w);
        }
    }
    r->text_read = r->n_text, r->tok_read = r->n_tok;
    *o = (kve_output){.text = r->r_text, .text_len = nt, .tokens = r->r_tokens, .n_tokens = nk,
                      .logprobs = r->top >= 0 ? r->r_lps : NULL, .top_ids = w ? r->r_top_ids : NULL,
                      .top_logprobs = w ? r->r_top_lps : NULL, .n_top = w, .stop = r->stop, .status = r->status,
                      .error = r->error, .n_prompt = r->n_prompt, .n_cached = r->n_cached,
                      .n_generated = r->n_generated};
    return KVE_OK;
}

int kve_request_poll(kve_request *r, int timeout_ms, kve_output *out) {
    if (!r || !out) return KVE_ERR_NULL;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    if (timeout_ms > 0) {
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&r->mu);
    int timed_out = 0;
    while (r->n_text == r->text_read && r->n_tok == r->tok_read && r->stop == KVE_STOP_NONE) {
        if (timeout_ms == 0) { timed_out = 1; break; }
        if (timeout_ms < 0) pthread_cond_wait(&r->cv, &r->mu);
        else if (pthread_cond_timedwait(&r->cv, &r->mu, &until) == ETIMEDOUT) { timed_out = 1; break; }
    }
    int rc = take(r, out);
    pthread_mutex_unlock(&r->mu);
    return rc != KVE_OK ? rc : timed_out ? KVE_ERR_TIMEOUT : KVE_OK;
}

void kve_request_cancel(kve_request *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    int live = !r->done && r->stop == KVE_STOP_NONE;
    pthread_mutex_unlock(&r->mu);
    if (live) llm_sched_cancel(r->ctx->s, r->id);
}

void kve_request_free(kve_request *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    if (!r->done) {
        pthread_mutex_unlock(&r->mu);
        llm_sched_cancel(r->ctx->s, r->id);
        pthread_mutex_lock(&r->mu);
        while (!r->done) pthread_cond_wait(&r->cv, &r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    request_destroy(r);
}
