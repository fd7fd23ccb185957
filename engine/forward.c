/* engine/forward.c - contexts (cache, threads, scratch) and the Llama forward
 * pass over a ragged batch of new tokens: one matrix pass per layer for all
 * rows of all sequences, K/V appended into the paged cache, attention through
 * the library. The same layer code runs without a cache (llm_forward_dense),
 * which is what cached decoding is checked against. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"

/* Rows of W one matmul task computes. A fixed size, so how the work is cut
 * never depends on the thread count (and a multiple of the 8-row decode
 * chunk of llm_matmul_rows). 32 rows of a 576-wide Q4_1 matrix is ~11 KB of
 * weights: big enough to amortize a task, small enough to balance 3 threads
 * over the 192 rows of a K projection. */
enum { MM_ROWS = 32, EW_ROWS = 16 };

/* Per-call work arrays for `rows` rows. */
typedef struct {
    int32_t rows;       /* capacity in rows */
    float *x;           /* [rows][D] the residual stream */
    float *h;           /* [rows][D] normed block input, then a block's output */
    float *q;           /* [rows][H*d] queries, rotated */
    float *k;           /* [rows][Hkv*d] keys, rotated */
    float *v;           /* [rows][Hkv*d] values */
    float *att;         /* [rows][H*d] attention output */
    float *gate;        /* [rows][F] gate projection, then silu(gate) * up */
    float *up;          /* [rows][F] up projection */
    int32_t *pos;       /* [rows] absolute position of each row */
    int32_t *out_rows;  /* [rows] rows whose logits are wanted, ascending */
} scratch;

struct llm_context {
    const llm_model *m;     /* borrowed; outlives the context */
    llm_context_params p;   /* n_ctx resolved */
    kv_cache *cache;        /* n_seqs sequences of up to n_ctx positions */
    kv_pool *pool;          /* n_threads - 1 workers; also runs the cache's attention */
    scratch ws;             /* n_batch rows */
    uint8_t *all_rows;      /* [n_batch] all ones: "every row's logits" for llm_eval */
};

/* ---------------------------------------------------------------- scratch */

static void scratch_free(scratch *s) {
    free(s->x), free(s->h), free(s->q), free(s->k), free(s->v), free(s->att);
    free(s->gate), free(s->up), free(s->pos), free(s->out_rows);
    memset(s, 0, sizeof *s);
}

static int scratch_alloc(scratch *s, const llm_hparams *hp, int32_t rows) {
    size_t r = (size_t)rows, qd = (size_t)hp->n_heads * (size_t)hp->head_dim;
    size_t kvd = (size_t)hp->n_kv_heads * (size_t)hp->head_dim;
    s->rows = rows;
    s->x = malloc(sizeof(float) * r * (size_t)hp->dim);
    s->h = malloc(sizeof(float) * r * (size_t)hp->dim);
    s->q = malloc(sizeof(float) * r * qd);
    s->k = malloc(sizeof(float) * r * kvd);
    s->v = malloc(sizeof(float) * r * kvd);
    s->att = malloc(sizeof(float) * r * qd);
    s->gate = malloc(sizeof(float) * r * (size_t)hp->ffn_dim);
    s->up = malloc(sizeof(float) * r * (size_t)hp->ffn_dim);
    s->pos = malloc(sizeof(int32_t) * r);
    s->out_rows = malloc(sizeof(int32_t) * r);
    if (s->x && s->h && s->q && s->k && s->v && s->att && s->gate && s->up && s->pos && s->out_rows) return 0;
    scratch_free(s);
    return -1;
}

/* ---------------------------------------------------------------- contexts */

llm_context_params llm_context_default_params(void) {
    return (llm_context_params){.n_ctx = 0, .n_seqs = 1, .n_batch = 256, .n_threads = 1,
                                .kv_type = KV_F16, .page_size = 16};
}

static int cfail(char *err, size_t errlen, const char *msg) {
    if (err && errlen) snprintf(err, errlen, "%s", msg);
    return -1;
}

int llm_context_create(const llm_model *m, const llm_context_params *pp, llm_context **out, char *err,
                       size_t errlen) {
    *out = NULL;
    llm_context_params p = *pp;
    if (p.n_ctx == 0) p.n_ctx = m->hp.ctx_train < 4096 ? m->hp.ctx_train : 4096;
    if (p.n_ctx < 1 || p.n_ctx > (1 << 24)) return cfail(err, errlen, "context size must be in [1, 2^24]");
    if (p.n_seqs < 1 || p.n_seqs > 4096) return cfail(err, errlen, "sequences must be in [1, 4096]");
    if (p.n_batch < 1 || p.n_batch > 8192) return cfail(err, errlen, "batch rows must be in [1, 8192]");
    if (p.n_threads < 1 || p.n_threads > 256) return cfail(err, errlen, "threads must be in [1, 256]");
    if (p.page_size < 1 || p.page_size > 4096) return cfail(err, errlen, "page size must be in [1, 4096]");
    if (p.kv_type == KV_F64) return cfail(err, errlen, "f64 K/V is for the library's reference path; use f32, f16, bf16 or q8");
    int64_t pages = (int64_t)p.n_seqs * ((p.n_ctx + p.page_size - 1) / p.page_size);
    if (p.n_pages < 0) return cfail(err, errlen, "the page count must be >= 0");
    if (p.n_pages > 0) pages = p.n_pages;
    if (pages > INT32_MAX) return cfail(err, errlen, "n_seqs x n_ctx is too large");
    llm_context *c = calloc(1, sizeof *c);
    if (!c) return cfail(err, errlen, "out of memory");
    c->m = m;
    c->p = p;
    kv_cache_params cp = kv_cache_default_params();
    cp.n_layers = m->hp.n_layers, cp.n_kv_heads = m->hp.n_kv_heads, cp.head_dim = m->hp.head_dim;
    cp.dtype = p.kv_type, cp.page_size = p.page_size, cp.n_pages = (int32_t)pages;
    cp.max_seqs = p.n_seqs, cp.max_seq_len = p.n_ctx;
    int rc = kv_cache_create(&cp, &c->cache);
    if (rc != KV_OK) {
        if (err && errlen) snprintf(err, errlen, "KV cache: %s", kv_status_str(rc));
        free(c);
        return -1;
    }
    if (kv_pool_create(p.n_threads, &c->pool) != KV_OK) {
        llm_context_free(c);
        return cfail(err, errlen, "could not start the worker threads");
    }
    kv_cache_set_pool(c->cache, c->pool);
    c->all_rows = malloc((size_t)p.n_batch);
    if (!c->all_rows || scratch_alloc(&c->ws, &m->hp, p.n_batch)) {
        llm_context_free(c);
        return cfail(err, errlen, "out of memory for the forward scratch");
    }
    memset(c->all_rows, 1, (size_t)p.n_batch);
    *out = c;
    return 0;
}

void llm_context_free(llm_context *c) {
    if (!c) return;
    kv_cache_free(c->cache);   /* before the pool it borrows */
    kv_pool_free(c->pool);
    scratch_free(&c->ws);
    free(c->all_rows);
    free(c);
}

const llm_model *llm_context_model(const llm_context *c) { return c->m; }
llm_context_params llm_context_get_params(const llm_context *c) { return c->p; }
kv_cache *llm_context_cache(llm_context *c) { return c->cache; }

/* ---------------------------------------------------------------- matrix products */

/* Up to three products of one input each, run as one pool job (Q, K and V
 * share an input; so do gate and up): Y = X W^T for m rows of X. */
typedef struct {
    const llm_matrix *w;    /* [rows][cols] */
    const float *x;         /* [m][cols] */
    float *y;               /* [m][ldy] */
    int64_t ldy;            /* row stride of y (>= w->rows) */
    int32_t first_task;     /* index of this part's first task in the job */
} mm_part;

typedef struct {
    mm_part part[3];
    int n_parts;
    int32_t m;              /* rows of X */
} mm_job;

static void mm_task(void *ctx, int32_t task, int32_t thread) {
    (void)thread;
    const mm_job *j = ctx;
    int i = j->n_parts - 1;
    while (task < j->part[i].first_task) i--;
    const mm_part *p = &j->part[i];
    int64_t r0 = (int64_t)(task - p->first_task) * MM_ROWS;
    int64_t r1 = r0 + MM_ROWS < p->w->rows ? r0 + MM_ROWS : p->w->rows;
    llm_matmul_rows(p->w->type, p->w->data, p->w->cols, r0, r1, p->x, j->m, p->y, p->ldy);
}

static void mm_add(mm_job *j, const llm_matrix *w, const float *x, float *y, int64_t ldy) {
    int32_t first = 0;
    if (j->n_parts) {
        const mm_part *last = &j->part[j->n_parts - 1];
        first = last->first_task + (int32_t)((last->w->rows + MM_ROWS - 1) / MM_ROWS);
    }
    j->part[j->n_parts++] = (mm_part){w, x, y, ldy, first};
}

static void mm_run(kv_pool *pool, mm_job *j) {
    const mm_part *last = &j->part[j->n_parts - 1];
    int32_t n_tasks = last->first_task + (int32_t)((last->w->rows + MM_ROWS - 1) / MM_ROWS);
    kv_pool_run(pool, n_tasks, mm_task, j);
}

/* y = x W^T for m rows */
static void matmul(kv_pool *pool, const llm_matrix *w, const float *x, int32_t m, float *y) {
    mm_job j = {.m = m};
    mm_add(&j, w, x, y, w->rows);
    mm_run(pool, &j);
}

/* ---------------------------------------------------------------- element-wise */

/* out = x / sqrt(mean(x^2) + eps) * w, per row of n. The mean in double:
 * 576-4096 squares summed in f32 lose a few bits we can keep for free. */
static void rmsnorm(const float *x, const float *w, float *out, int32_t rows, int64_t n, float eps) {
    for (int32_t r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * (size_t)n;
        float *o = out + (size_t)r * (size_t)n;
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        float s = (float)(1.0 / sqrt(ss / (double)n + eps));
        for (int64_t i = 0; i < n; i++) o[i] = xr[i] * s * w[i];
    }
}

static void add_into(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

/* gate = silu(gate) * up, silu(g) = g * sigmoid(g); row blocks over threads
 * (F expf per row is the one element-wise cost that shows in prefill). */
typedef struct {
    float *gate;          /* [rows][F] */
    const float *up;      /* [rows][F] */
    int32_t rows;
    int64_t F;
} swiglu_job;

static void swiglu_task(void *ctx, int32_t task, int32_t thread) {
    (void)thread;
    const swiglu_job *j = ctx;
    int32_t r1 = (task + 1) * EW_ROWS < j->rows ? (task + 1) * EW_ROWS : j->rows;
    for (size_t i = (size_t)task * EW_ROWS * (size_t)j->F; i < (size_t)r1 * (size_t)j->F; i++) {
        float g = j->gate[i];
        j->gate[i] = g / (1.0f + expf(-g)) * j->up[i];
    }
}

/* ---------------------------------------------------------------- the pass */

/* Every layer over ws rows 0..rows-1 (tokens and positions set), then the
 * logits of ws->out_rows[0..n_out). kb: the batch in the cache; NULL: no
 * cache, all rows are one sequence attending densely among themselves. */
static int run_layers(llm_context *c, scratch *ws, int32_t rows, const int32_t *tokens, const kv_batch *kb,
                      int32_t n_out, float *logits) {
    const llm_model *m = c->m;
    const llm_hparams *hp = &m->hp;
    const int64_t D = hp->dim, F = hp->ffn_dim;
    const int64_t qd = (int64_t)hp->n_heads * hp->head_dim, kvd = (int64_t)hp->n_kv_heads * hp->head_dim;
    const int64_t emb_row = llm_row_bytes(m->tok_embd.type, D);
    for (int32_t r = 0; r < rows; r++)
        llm_dequant_row(m->tok_embd.type, (const uint8_t *)m->tok_embd.data + (size_t)tokens[r] * (size_t)emb_row,
                        ws->x + (size_t)r * (size_t)D, D);

    for (int32_t l = 0; l < hp->n_layers; l++) {
        const llm_layer_weights *w = &m->layers[l];
        /* attention block */
        rmsnorm(ws->x, w->attn_norm, ws->h, rows, D, hp->norm_eps);
        mm_job j = {.m = rows};
        mm_add(&j, &w->wq, ws->h, ws->q, qd);
        mm_add(&j, &w->wk, ws->h, ws->k, kvd);
        mm_add(&j, &w->wv, ws->h, ws->v, kvd);
        mm_run(c->pool, &j);
        int rc = kv_rope_apply_f32(&m->rope, ws->q, rows, hp->n_heads, ws->pos);
        if (!rc) rc = kv_rope_apply_f32(&m->rope, ws->k, rows, hp->n_kv_heads, ws->pos);
        if (!rc && kb) {
            rc = kv_append_f32(c->cache, l, kb, ws->k, ws->v);
            if (!rc) rc = kv_attend_f32(c->cache, l, kb, hp->n_heads, ws->q, ws->att, 0);
        } else if (!rc) {
            rc = kv_attention_f32(rows, rows, hp->n_heads, hp->n_kv_heads, hp->head_dim, ws->q, ws->k, ws->v,
                                  ws->att, 0, 0);
        }
        if (rc) return rc;
        matmul(c->pool, &w->wo, ws->att, rows, ws->h);
        add_into(ws->x, ws->h, (size_t)rows * (size_t)D);

        /* feed-forward block */
        rmsnorm(ws->x, w->ffn_norm, ws->h, rows, D, hp->norm_eps);
        mm_job g = {.m = rows};
        mm_add(&g, &w->w_gate, ws->h, ws->gate, F);
        mm_add(&g, &w->w_up, ws->h, ws->up, F);
        mm_run(c->pool, &g);
        swiglu_job sj = {ws->gate, ws->up, rows, F};
        kv_pool_run(rows >= 2 * EW_ROWS ? c->pool : NULL, (rows + EW_ROWS - 1) / EW_ROWS, swiglu_task, &sj);
        matmul(c->pool, &w->w_down, ws->gate, rows, ws->h);
        add_into(ws->x, ws->h, (size_t)rows * (size_t)D);
    }
    if (n_out == 0 || !logits) return KV_OK;
    /* only the rows that need logits: gather, norm, project onto the vocabulary */
    for (int32_t i = 0; i < n_out; i++)
        memmove(ws->h + (size_t)i * (size_t)D, ws->x + (size_t)ws->out_rows[i] * (size_t)D, sizeof(float) * (size_t)D);
    rmsnorm(ws->h, m->output_norm, ws->h, n_out, D, hp->norm_eps);
    matmul(c->pool, &m->output, ws->h, n_out, logits);
    return KV_OK;
}

int llm_forward(llm_context *c, const llm_batch *b, float *logits) {
    if (!c || !b || !b->seqs || !b->row_start || b->n_seqs < 1) return KV_ERR_NULL;
    if (b->row_start[0] != 0) return KV_ERR_SHAPE;
    for (int32_t s = 0; s < b->n_seqs; s++)
        if (b->row_start[s + 1] < b->row_start[s]) return KV_ERR_SHAPE;
    const int32_t rows = b->row_start[b->n_seqs];
    if (rows > c->p.n_batch) return KV_ERR_SHAPE;
    if (rows == 0) return KV_OK;
    if (!b->tokens) return KV_ERR_NULL;
    for (int32_t r = 0; r < rows; r++)
        if (b->tokens[r] < 0 || b->tokens[r] >= c->m->hp.n_vocab) return LLM_ERR_TOKEN;

    scratch *ws = &c->ws;
    int32_t n_out = 0;
    for (int32_t s = 0; s < b->n_seqs; s++)
        for (int32_t r = b->row_start[s]; r < b->row_start[s + 1]; r++)
            if (b->want ? b->want[r] != 0 : r == b->row_start[s + 1] - 1) ws->out_rows[n_out++] = r;

    kv_batch kb = {.n_seqs = b->n_seqs, .seqs = b->seqs, .row_start = b->row_start};
    int rc = kv_batch_reserve(c->cache, &kb, b->tokens);
    if (rc) return rc;  /* all or nothing: nothing changed */
    for (int32_t s = 0; s < b->n_seqs; s++) {
        int32_t t = b->row_start[s + 1] - b->row_start[s], S = kv_seq_length(c->cache, b->seqs[s]);
        for (int32_t i = 0; i < t; i++) ws->pos[b->row_start[s] + i] = S - t + i;
    }
    rc = run_layers(c, ws, rows, b->tokens, &kb, n_out, logits);
    if (rc) /* undo the reserve; the positions were never visible to anyone */
        for (int32_t s = 0; s < b->n_seqs; s++) {
            int32_t t = b->row_start[s + 1] - b->row_start[s];
            kv_seq_truncate(c->cache, b->seqs[s], kv_seq_length(c->cache, b->seqs[s]) - t);
        }
    return rc;
}

int llm_eval(llm_context *c, int32_t seq, const int32_t *tokens, int32_t n, int all, float *logits,
             llm_progress_fn progress, void *user) {
    if (!c || (!tokens && n > 0) || n < 0) return KV_ERR_NULL;
    int32_t start = kv_seq_length(c->cache, seq);
    if (start < 0) return start;
    const size_t V = (size_t)c->m->hp.n_vocab;
    int rc = KV_OK;
    for (int32_t done = 0; done < n && rc == KV_OK;) {
        int32_t t = n - done < c->p.n_batch ? n - done : c->p.n_batch;
        int32_t rows[2] = {0, t};
        int last = done + t == n;
        llm_batch b = {.n_seqs = 1, .seqs = &seq, .row_start = rows, .tokens = tokens + done,
                       .want = all ? c->all_rows : NULL};
        float *out = !logits ? NULL : all ? logits + (size_t)done * V : last ? logits : NULL;
        rc = llm_forward(c, &b, out);
        done += t;
        if (progress) progress(user, done, n);
    }
    if (rc) kv_seq_truncate(c->cache, seq, start);
    return rc;
}

int llm_forward_dense(llm_context *c, const int32_t *tokens, int32_t n, int32_t first, float *logits) {
    if (!c || !tokens || !logits) return KV_ERR_NULL;
    if (n < 1 || first < 0 || first >= n) return KV_ERR_SHAPE;
    for (int32_t r = 0; r < n; r++)
        if (tokens[r] < 0 || tokens[r] >= c->m->hp.n_vocab) return LLM_ERR_TOKEN;
    scratch ws;
    if (scratch_alloc(&ws, &c->m->hp, n)) return KV_ERR_NOMEM;
    for (int32_t r = 0; r < n; r++) ws.pos[r] = r;
    for (int32_t r = first; r < n; r++) ws.out_rows[r - first] = r;
    int rc = run_layers(c, &ws, n, tokens, NULL, n - first, logits);
    scratch_free(&ws);
    return rc;
}
