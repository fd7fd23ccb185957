/* src/rope.c - rotary position embeddings at absolute positions: both pair
 * layouts, partial rotation, Llama 3.1 frequency scaling. Frequencies are
 * computed once in kv_rope_init; a call computes only the angles of its
 * positions. */
#include <math.h>

#include "internal.h"

kv_rope_params kv_rope_default_params(int32_t head_dim) {
    return (kv_rope_params){.head_dim = head_dim, .rot_dim = head_dim, .layout = KV_ROPE_NEOX,
                            .theta = 10000.0, .scaling = KV_ROPE_SCALING_NONE};
}

int kv_rope_init(kv_rope *rope, const kv_rope_params *params) {
    if (!rope || !params) return KV_ERR_NULL;
    kv_rope_params p = *params;
    if (p.rot_dim == 0) p.rot_dim = p.head_dim;
    if (p.head_dim <= 0 || p.head_dim > KV_MAX_HEAD_DIM || p.rot_dim < 0 || p.rot_dim > p.head_dim ||
        p.rot_dim % 2 || !(p.theta > 0) || (unsigned)p.layout > KV_ROPE_INTERLEAVED)
        return KV_ERR_ROPE;
    if (p.scaling == KV_ROPE_SCALING_LLAMA3) {
        if (!(p.factor > 0) || !(p.low_freq_factor > 0) || !(p.high_freq_factor > p.low_freq_factor) ||
            p.original_context <= 0)
            return KV_ERR_ROPE;
    } else if (p.scaling != KV_ROPE_SCALING_NONE) {
        return KV_ERR_ROPE;
    }
    rope->params = p;
    const int32_t half = p.rot_dim / 2;
    for (int32_t k = 0; k < half; k++) {
        double f = pow(p.theta, -2.0 * k / p.rot_dim);
        if (p.scaling == KV_ROPE_SCALING_LLAMA3) {
            /* Long wavelengths (beyond original_context / low_freq_factor) are
             * slowed by `factor`, short ones (below original_context /
             * high_freq_factor) kept, and the band between interpolated. */
            double wavelen = 2 * M_PI / f;
            double ratio = p.original_context / wavelen;
            if (ratio < p.low_freq_factor) {
                f /= p.factor;
            } else if (ratio <= p.high_freq_factor) {
                double smooth = (ratio - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
                f = (1 - smooth) * f / p.factor + smooth * f;
            }
        }
        rope->inv_freq[k] = f;
    }
    return KV_OK;
}

static int rope_check(const kv_rope *rope, const void *x, int32_t n, int32_t n_heads, const int32_t *pos) {
    if (!rope) return KV_ERR_NULL;
    if (n < 0 || n_heads <= 0) return KV_ERR_SHAPE;
    if (n > 0 && (!x || !pos)) return KV_ERR_NULL;
    for (int32_t t = 0; t < n; t++)
        if (pos[t] < 0) return KV_ERR_LENGTH;
    return KV_OK;
}

/* cos and sin of pos * inv_freq[k], in double whatever the data type, so a
 * position of 10^6 still rotates by the right angle. */
static void rope_angles(const kv_rope *rope, int32_t pos, double *cs, double *sn) {
    for (int32_t k = 0; k < rope->params.rot_dim / 2; k++) {
        double a = (double)pos * rope->inv_freq[k];
        cs[k] = cos(a);
        sn[k] = sin(a);
    }
}

/* Element offsets of the two members of pair k. */
static void rope_pair(const kv_rope_params *p, int32_t k, int32_t *i0, int32_t *i1) {
    if (p->layout == KV_ROPE_NEOX) {
        *i0 = k;
        *i1 = k + p->rot_dim / 2;
    } else {
        *i0 = 2 * k;
        *i1 = 2 * k + 1;
    }
}

#define ROPE_APPLY(REALT, SFX)                                                                   \
    int kv_rope_apply_##SFX(const kv_rope *rope, REALT *x, int32_t n, int32_t n_heads,           \
                            const int32_t *pos) {                                               \
        int rc = rope_check(rope, x, n, n_heads, pos);                                          \
        if (rc) return rc;                                                                      \
        const kv_rope_params *p = &rope->params;                                                \
        double cs[KV_MAX_HEAD_DIM / 2], sn[KV_MAX_HEAD_DIM / 2];                                \
        for (int32_t t = 0; t < n; t++) {                                                       \
            rope_angles(rope, pos[t], cs, sn);                                                  \
            for (int32_t h = 0; h < n_heads; h++) {                                             \
                REALT *v = x + ((size_t)t * n_heads + h) * p->head_dim;                         \
                for (int32_t k = 0; k < p->rot_dim / 2; k++) {                                  \
                    int32_t i0, i1;                                                             \
                    rope_pair(p, k, &i0, &i1);                                                  \
                    double a = v[i0], b = v[i1];                                                \
                    v[i0] = (REALT)(a * cs[k] - b * sn[k]);                                     \
                    v[i1] = (REALT)(a * sn[k] + b * cs[k]);                                     \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        return KV_OK;                                                                           \
    }

ROPE_APPLY(double, f64)
ROPE_APPLY(float, f32)

/* Re-rotation of stored keys. Rotations of a pair compose by adding angles,
 * R(p + delta) = R(delta) R(p), so a key rotated at p and then turned by
 * delta is the key rotated at p + delta, up to rounding; delta may be
 * negative (a context shift moves keys down). */
void kv_rope_turn_angles(const kv_rope *rope, double delta, double *cs, double *sn) {
    for (int32_t k = 0; k < rope->params.rot_dim / 2; k++) {
        double a = delta * rope->inv_freq[k];
        cs[k] = cos(a);
        sn[k] = sin(a);
    }
}

void kv_rope_turn_row(const kv_rope *rope, double *v, const double *cs, const double *sn) {
    const kv_rope_params *p = &rope->params;
    for (int32_t k = 0; k < p->rot_dim / 2; k++) {
        int32_t i0, i1;
        rope_pair(p, k, &i0, &i1);
        double x = v[i0], y = v[i1];
        v[i0] = x * cs[k] - y * sn[k];
        v[i1] = x * sn[k] + y * cs[k];
    }
}
