/* src/step.c - one attention step over new tokens only: project them once,
 * rotate q and k at their absolute positions, append k and v in place, attend.
 * The same call is prefill, chunked prefill and decode. */
#include "internal.h"

size_t kv_step_scratch(const kv_cache *c, const kv_layer *L, int32_t rows) {
    if (!c || !L || rows < 0 || L->n_heads <= 0) return 0;
    return (size_t)rows * (size_t)(L->n_heads + 2 * c->p.n_kv_heads) * (size_t)c->p.head_dim;
}

/* y [n, cols] = x [n, dim] @ w [dim, cols], in the row order that streams w. */
#define MATMUL(REALT, SFX)                                                                       \
    static void matmul_##SFX(const REALT *x, const REALT *w, REALT *y, int32_t n, int32_t dim,   \
                             int32_t cols) {                                                    \
        for (int32_t i = 0; i < n; i++) {                                                       \
            REALT *yi = y + (size_t)i * cols;                                                   \
            for (int32_t j = 0; j < cols; j++) yi[j] = 0;                                       \
            for (int32_t k = 0; k < dim; k++) {                                                 \
                const REALT xik = x[(size_t)i * dim + k], *wk = w + (size_t)k * cols;          \
                for (int32_t j = 0; j < cols; j++) yi[j] += xik * wk[j];                        \
            }                                                                                   \
        }                                                                                       \
    }
MATMUL(double, f64)
MATMUL(float, f32)

static int step(bool f64, kv_cache *c, const kv_layer *L, const kv_batch *b, const void *x, void *out,
                void *scratch) {
    if (!c || !L || !b) return KV_ERR_NULL;
    if (kv_type_f64(c->p.dtype) != f64) return KV_ERR_DTYPE;
    if (L->layer < 0 || L->layer >= c->p.n_layers || L->dim <= 0 || L->n_heads <= 0) return KV_ERR_SHAPE;
    if (L->n_heads % c->p.n_kv_heads) return KV_ERR_HEADS;
    if (L->rope && L->rope->params.head_dim != c->p.head_dim) return KV_ERR_ROPE;
    int32_t rows;
    int rc = kv_batch_check(c, b, &rows);
    if (rc || rows == 0) return rc;
    if (!x || !out || !scratch || !L->wq || !L->wk || !L->wv) return KV_ERR_NULL;

    const int32_t H = L->n_heads, Hkv = c->p.n_kv_heads, d = c->p.head_dim;
    const size_t esz = f64 ? sizeof(double) : sizeof(float);
    char *q = scratch;
    char *k = q + (size_t)rows * H * d * esz;
    char *v = k + (size_t)rows * Hkv * d * esz;
    if (f64) {
        matmul_f64(x, L->wq, (double *)q, rows, L->dim, H * d);
        matmul_f64(x, L->wk, (double *)k, rows, L->dim, Hkv * d);
        matmul_f64(x, L->wv, (double *)v, rows, L->dim, Hkv * d);
    } else {
        matmul_f32(x, L->wq, (float *)q, rows, L->dim, H * d);
        matmul_f32(x, L->wk, (float *)k, rows, L->dim, Hkv * d);
        matmul_f32(x, L->wv, (float *)v, rows, L->dim, Hkv * d);
    }
    if (L->rope) {
        for (int32_t s = 0; s < b->n_seqs; s++) {
            int32_t r0 = b->row_start[s], T = b->row_start[s + 1] - r0;
            for (int32_t i = 0; i < T; i++) {
                int32_t pos = c->seqs[b->seqs[s]].len - T + i;
                size_t qo = (size_t)(r0 + i) * H * d * esz, ko = (size_t)(r0 + i) * Hkv * d * esz;
                if (f64) {
                    kv_rope_apply_f64(L->rope, (double *)(q + qo), 1, H, &pos);
                    kv_rope_apply_f64(L->rope, (double *)(k + ko), 1, Hkv, &pos);
                } else {
                    kv_rope_apply_f32(L->rope, (float *)(q + qo), 1, H, &pos);
                    kv_rope_apply_f32(L->rope, (float *)(k + ko), 1, Hkv, &pos);
                }
            }
        }
    }
    rc = f64 ? kv_append_f64(c, L->layer, b, (double *)k, (double *)v)
             : kv_append_f32(c, L->layer, b, (float *)k, (float *)v);
    if (rc) return rc;
    return f64 ? kv_attend_f64(c, L->layer, b, H, (double *)q, out, L->scale)
               : kv_attend_f32(c, L->layer, b, H, (float *)q, out, (float)L->scale);
}

int kv_step_f64(kv_cache *c, const kv_layer *L, const kv_batch *b, const double *x, double *out,
                double *scratch) {
    return step(true, c, L, b, x, out, scratch);
}

int kv_step_f32(kv_cache *c, const kv_layer *L, const kv_batch *b, const float *x, float *out,
                float *scratch) {
    return step(false, c, L, b, x, out, scratch);
}
