/* engine/model/layers.c - the layer toolkit (engine/model/layers.h): matrix products as
 * pool jobs, norms, activations, RoPE and attention over the cache, logits. */
#include "layers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fastexp.h"
#include "../weights/quant.h"

/* Rows of W one matmul task computes: about MM_BYTES of weights, a
 * multiple of 8 rows (the packed groups, and the 8-row decode chunk of
 * llm_matmul_rows), in a number of tasks that the threads share evenly.
 * Every row's result is the same however the rows are cut (the kernels'
 * promise, tested), so the cut may follow the thread count. A task is one
 * stream through memory, and its first KB stall before the kernels'
 * prefetches run ahead, so short tasks are slow; and tasks of equal size
 * balance the threads best, hence a count of tasks rounded up to a multiple
 * of the threads. */
enum { MM_BYTES = 128 << 10 };
static int64_t rows_per_task(const llm_matrix *w, int32_t threads) {
    const int64_t rb = llm_row_bytes(w->type, w->cols);
    int64_t tasks = rb > 0 ? (w->rows * rb + MM_BYTES - 1) / MM_BYTES : 1;
    tasks = (tasks + threads - 1) / threads * threads;
    const int64_t rows = (w->rows + tasks - 1) / tasks;   /* tasks of equal size */
    return (rows + 7) / 8 * 8;
}

/* ---------------------------------------------------------------- scratch */

void llm_scratch_free(llm_scratch *s) {
    free(s->x), free(s->h), free(s->q), free(s->k), free(s->v), free(s->att);
    free(s->gate), free(s->up), free(s->pos), free(s->out_rows), free(s->qa);
    memset(s, 0, sizeof *s);
}

/* n floats from a cache line on: the kernels' 64-byte vectors never
 * straddle two lines at a row start (malloc gives 16 bytes) */
static float *line_floats(size_t n) { return aligned_alloc(64, (n * sizeof(float) + 63) & ~(size_t)63); }

int llm_scratch_alloc(llm_scratch *s, const llm_hparams *hp, int32_t rows) {
    size_t r = (size_t)rows, qd = (size_t)hp->n_heads * (size_t)hp->head_dim;
    size_t kvd = (size_t)hp->n_kv_heads * (size_t)hp->head_dim;
    s->rows = rows;
    s->x = line_floats(r * (size_t)hp->dim);
    s->h = line_floats(r * (size_t)hp->dim);
    s->q = line_floats(r * qd);
    s->k = line_floats(r * kvd);
    s->v = line_floats(r * kvd);
    s->att = line_floats(r * qd);
    s->gate = line_floats(r * (size_t)hp->ffn_dim);
    s->up = line_floats(r * (size_t)hp->ffn_dim);
    s->pos = malloc(sizeof(int32_t) * r);
    s->out_rows = malloc(sizeof(int32_t) * r);
    int64_t widest = hp->dim > (int64_t)qd ? hp->dim : (int64_t)qd;
    if (hp->ffn_dim > widest) widest = hp->ffn_dim;
    s->qa_bytes = llm_act_bytes(rows, widest);
    s->qa = malloc(LLM_MM_INPUTS * s->qa_bytes);
    if (s->x && s->h && s->q && s->k && s->v && s->att && s->gate && s->up && s->pos && s->out_rows && s->qa)
        return LLM_OK;
    llm_scratch_free(s);
    return LLM_ERR_NOMEM;
}

/* ---------------------------------------------------------------- matrix products */

static int32_t tasks_of(const llm_matrix *w, int64_t task_rows) {
    return (int32_t)((w->rows + task_rows - 1) / task_rows);
}

/* The gated activations, one element each: silu(g) * u = g sigmoid(g) u,
 * and gelu(g) * u with gelu(g) ~ g/2 (1 + tanh(sqrt(2/pi) (g + 0.044715
 * g^3))), the tanh form Gemma uses, computed as g sigmoid(2 sqrt(2/pi) (g +
 * 0.044715 g^3)) (the same function: 1 + tanh(v) = 2 / (1 + e^-2v)): one
 * exp, where glibc's tanhf costs three; llm_exp rather than glibc's expf,
 * which is a call per element. */
static inline float silu_mul(float g, float u) { return g / (1.0f + llm_exp(-g)) * u; }
static inline float gelu_mul(float g, float u) {
    return g / (1.0f + llm_exp(-1.5957691216f * (g + 0.044715f * g * g * g))) * u;
}

/* g [i] = act(g [i], u [i]) for i < n: sixteen a step in an inner loop of
 * fixed length with the activation inlined, which the compiler turns into
 * vector operations (llm_exp has no call and no branch) */
static inline __attribute__((always_inline)) void glu_run(float *restrict g, const float *restrict u, int64_t n,
                                                          const int gelu) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) g[i + k] = gelu ? gelu_mul(g[i + k], u[i + k]) : silu_mul(g[i + k], u[i + k]);
    for (; i < n; i++) g[i] = gelu ? gelu_mul(g[i], u[i]) : silu_mul(g[i], u[i]);
}

static void glu_rows(float *g, const float *u, int64_t n, llm_glu act) {
    if (act == LLM_GLU_GELU_TANH) glu_run(g, u, n, 1);
    else glu_run(g, u, n, 0);
}

/* Rows r0 .. r1 of part i against X rows a, the rows of its input from t0
 * on: y [t0 ..][r0 .. r1) */
static void part_rows(const llm_mm_job *j, int i, int64_t r0, int64_t r1, const llm_act *a, int64_t t0) {
    const llm_matrix *w = j->part[i].w;
    llm_matmul_act(w->type, w->data, w->packed, w->cols, r0, r1, a, j->part[i].y + (size_t)t0 * (size_t)j->part[i].ldy,
                   j->part[i].ldy);
}

static void mm_task(void *ctx, int32_t task, int32_t thread) {
    (void)thread;
    const llm_mm_job *j = ctx;
    if (j->glu) {   /* the same rows of gate and up, then the activation on them */
        const int64_t F = j->part[0].w->rows, n = j->part[0].task_rows, r0 = task * n;
        const int64_t r1 = r0 + n < F ? r0 + n : F;
        /* by blocks of X rows: gate's and up's products of a block read its X rows from L2 one after
         * the other, and the activation finds their results in cache */
        const llm_act *a = &j->act[j->part[0].input];
        for (int64_t t0 = 0; t0 < j->m; t0 += LLM_ACT_BLOCK_ROWS) {
            const int64_t t1 = t0 + LLM_ACT_BLOCK_ROWS < j->m ? t0 + LLM_ACT_BLOCK_ROWS : j->m;
            const llm_act rows = llm_act_rows(a, t0, t1);
            part_rows(j, 0, r0, r1, &rows, t0), part_rows(j, 1, r0, r1, &rows, t0);
            for (int64_t t = t0; t < t1; t++)
                glu_rows(j->part[0].y + (size_t)t * (size_t)F + r0, j->part[1].y + (size_t)t * (size_t)F + r0,
                         r1 - r0, j->glu_act);
        }
        return;
    }
    int i = j->n_parts - 1;
    while (task < j->part[i].first_task) i--;
    const int64_t rows = j->part[i].w->rows, n = j->part[i].task_rows;
    const int64_t r0 = (task - j->part[i].first_task) * n;
    part_rows(j, i, r0, r0 + n < rows ? r0 + n : rows, &j->act[j->part[i].input], 0);
}

llm_mm_job llm_mm_begin(int32_t m) { return (llm_mm_job){.m = m}; }

llm_mm_job llm_mm_glu(int32_t m, const llm_matrix *w_gate, const llm_matrix *w_up, const float *x, float *gate,
                      float *up, llm_glu act) {
    llm_mm_job j = llm_mm_begin(m);
    llm_mm_add(&j, w_gate, x, gate, w_gate->rows);
    llm_mm_add(&j, w_up, x, up, w_up->rows);
    j.glu = 1, j.glu_act = act;
    return j;
}

void llm_mm_add(llm_mm_job *j, const llm_matrix *w, const float *x, float *y, int64_t ldy) {
    j->part[j->n_parts].w = w, j->part[j->n_parts].x = x, j->part[j->n_parts].y = y;
    j->part[j->n_parts].ldy = ldy;
    j->n_parts++;
}

void llm_mm_run(const llm_pass *ps, llm_mm_job *j) {
    /* each distinct input quantized once, on this thread, before the tasks;
     * its rows have the width of the matrices that read it */
    int n_inputs = 0, bits[LLM_MM_INPUTS];
    for (int i = 0; i < j->n_parts; i++) {
        /* float weights take the f32 rows (llm_type_int8): nothing to quantize for them */
        bits[i] = llm_type_int8(j->part[i].w->type) ? ps->c->p.act_bits : LLM_ACT_F32;
        int k = 0;
        while (k < i && !(j->part[k].x == j->part[i].x && j->part[k].w->cols == j->part[i].w->cols &&
                          bits[k] == bits[i]))
            k++;
        if (k < i) {
            j->part[i].input = j->part[k].input;
            continue;
        }
        j->part[i].input = n_inputs;
        /* cannot fail: the scratch holds m <= rows rows of the widest input at any bits */
        llm_act_quantize_as(&j->act[n_inputs], j->part[i].x, j->m, j->part[i].w->cols, bits[i],
                            llm_act_store_bits(bits[i], j->m),
                            (char *)ps->ws->qa + (size_t)n_inputs * ps->ws->qa_bytes, ps->ws->qa_bytes);
        n_inputs++;
    }
    /* the cut: each part's tasks in turn (a GLU job's tasks take gate's and up's rows together) */
    const int32_t threads = kv_pool_threads(ps->c->pool);
    int32_t n_tasks = 0;
    for (int i = 0; i < j->n_parts; i++) {
        j->part[i].task_rows = rows_per_task(j->part[i].w, threads);
        j->part[i].first_task = n_tasks;
        if (i == 0 || !j->glu) n_tasks += tasks_of(j->part[i].w, j->part[i].task_rows);
    }
    kv_pool_run(ps->c->pool, n_tasks, mm_task, j);
}

void llm_matmul(const llm_pass *ps, const llm_matrix *w, const float *x, int32_t m, float *y) {
    llm_mm_job j = llm_mm_begin(m);
    llm_mm_add(&j, w, x, y, w->rows);
    llm_mm_run(ps, &j);
}

/* ---------------------------------------------------------------- element-wise */

void llm_embed(const llm_model *m, const int32_t *tokens, int32_t rows, float *x) {
    const int64_t D = m->hp.dim, row = llm_row_bytes(m->tok_embd.type, D);
    for (int32_t r = 0; r < rows; r++)
        llm_dequant_row(m->tok_embd.type, (const uint8_t *)m->tok_embd.data + (size_t)tokens[r] * (size_t)row,
                        x + (size_t)r * (size_t)D, D);
}

/* The mean in double: 576-4096 squares summed in f32 lose a few bits we can
 * keep for free. */
void llm_rmsnorm(const float *x, const float *w, float *out, int32_t rows, int64_t n, float eps) {
    for (int32_t r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * (size_t)n;
        float *o = out + (size_t)r * (size_t)n;
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        float s = (float)(1.0 / sqrt(ss / (double)n + eps));
        for (int64_t i = 0; i < n; i++) o[i] = xr[i] * s * w[i];
    }
}

void llm_rmsnorm_heads(float *x, const float *w, int32_t rows, int32_t n_heads, int32_t d, float eps) {
    llm_rmsnorm(x, w, x, rows * n_heads, d, eps);
}

void llm_add_into(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

void llm_add_rows(float *x, const float *b, int32_t rows, int64_t n) {
    for (int32_t r = 0; r < rows; r++) llm_add_into(x + (size_t)r * (size_t)n, b, (size_t)n);
}

void llm_scale(float *x, size_t n, float s) {
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* ---------------------------------------------------------------- the blocks' projections */

void llm_project_qkv(const llm_pass *ps, const llm_layer_weights *w) {
    const llm_hparams *hp = &ps->c->m->hp;
    llm_scratch *ws = ps->ws;
    const int64_t qd = (int64_t)hp->n_heads * hp->head_dim, kvd = (int64_t)hp->n_kv_heads * hp->head_dim;
    llm_mm_job j = llm_mm_begin(ps->rows);
    llm_mm_add(&j, &w->wq, ws->h, ws->q, qd);
    llm_mm_add(&j, &w->wk, ws->h, ws->k, kvd);
    llm_mm_add(&j, &w->wv, ws->h, ws->v, kvd);
    llm_mm_run(ps, &j);
    if (w->bq) llm_add_rows(ws->q, w->bq, ps->rows, qd);
    if (w->bk) llm_add_rows(ws->k, w->bk, ps->rows, kvd);
    if (w->bv) llm_add_rows(ws->v, w->bv, ps->rows, kvd);
}

void llm_ffn(const llm_pass *ps, const llm_layer_weights *w, llm_glu act) {
    llm_scratch *ws = ps->ws;
    llm_mm_job g = llm_mm_glu(ps->rows, &w->w_gate, &w->w_up, ws->h, ws->gate, ws->up, act);
    llm_mm_run(ps, &g);
    llm_matmul(ps, &w->w_down, ws->gate, ps->rows, ws->h);
}

/* ---------------------------------------------------------------- attention */

int llm_rope_qk(const llm_pass *ps, const kv_rope *rope) {
    const llm_hparams *hp = &ps->c->m->hp;
    int rc = kv_rope_apply_f32(rope, ps->ws->q, ps->rows, hp->n_heads, ps->ws->pos);
    return rc ? rc : kv_rope_apply_f32(rope, ps->ws->k, ps->rows, hp->n_kv_heads, ps->ws->pos);
}

int32_t llm_layer_window(const llm_context *c, int32_t l) {
    return c->m->lhp[l].window ? c->m->lhp[l].window : c->p.window;
}

int llm_attention(const llm_pass *ps, int32_t l) {
    const llm_model *m = ps->c->m;
    const llm_hparams *hp = &m->hp;
    const llm_layer_hparams *lp = &m->lhp[l];
    llm_scratch *ws = ps->ws;
    if (ps->kb) {
        kv_cache *cache = ps->c->caches[lp->group];
        int rc = kv_append_f32(cache, lp->group_layer, ps->kb, ws->k, ws->v);
        return rc ? rc : kv_attend_f32(cache, lp->group_layer, ps->kb, hp->n_heads, ws->q, ws->att, lp->attn_scale);
    }
    return kv_attention_f32(ps->rows, ps->rows, hp->n_heads, hp->n_kv_heads, hp->head_dim, ws->q, ws->k, ws->v,
                            ws->att, llm_layer_window(ps->c, l), lp->attn_scale);
}

/* ---------------------------------------------------------------- output */

void llm_logits(const llm_pass *ps, const float *out_norm) {
    if (ps->n_out == 0 || !ps->logits) return;
    const llm_model *m = ps->c->m;
    const int64_t D = m->hp.dim;
    llm_scratch *ws = ps->ws;
    /* only the rows that need logits: gather, norm, project onto the vocabulary */
    for (int32_t i = 0; i < ps->n_out; i++)
        memmove(ws->h + (size_t)i * (size_t)D, ws->x + (size_t)ws->out_rows[i] * (size_t)D, sizeof(float) * (size_t)D);
    llm_rmsnorm(ws->h, out_norm, ws->h, ps->n_out, D, m->hp.norm_eps);
    llm_matmul(ps, &m->output, ws->h, ps->n_out, ps->logits);
}
