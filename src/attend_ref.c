/* src/attend_ref.c - the float64 reference kernel: f64 storage, f64
 * arithmetic, one query vector at a time, written for clarity. The FP32
 * kernels (attend.c) are tested against the same oracle to FP32 tolerance. */
#include <math.h>

#include "keys.h"

/* K and V of positions [j0, j0 + n) as [n][d], across blocks. */
static void load_keys(const key_source *src, int32_t j0, int32_t n, double *k, double *v) {
    const size_t row = (size_t)src->d * sizeof(double);
    for (int32_t j = 0; j < n;) {
        const int32_t blk = (j0 + j) / src->block;
        const key_block kb = source_block(src, blk);
        for (int32_t r = (j0 + j) - blk * src->block; r < src->block && j < n; r++, j++) {
            memcpy(k + (size_t)j * src->d, kb.k + (size_t)r * src->stride, row);
            memcpy(v + (size_t)j * src->d, kb.v + (size_t)r * src->stride, row);
        }
    }
}

/* Online softmax per query vector: a running max m, a running sum l of
 * exp(s - m) and an accumulator of exp(s - m) v. A chunk with a larger max m'
 * rescales both by exp(m - m'), so the result is the softmax over every
 * visible key without a score row of length S ever existing. Every row sees
 * its own key, so l > 0: only non-finite inputs make a row NaN. */
void kv_attend_group_f64(const key_source *src, const double *q, double *out, size_t q_stride,
                         int32_t rows, int32_t G, int32_t pos0, int32_t window, double scale) {
    const int32_t d = src->d, kmax = att_chunk(d);
    double kbuf[ATT_CHUNK_ELEMS], vbuf[ATT_CHUNK_ELEMS], acc[KV_MAX_HEAD_DIM];
    for (int32_t r = 0; r < rows; r++) {
        const int32_t pos = pos0 + r;
        const int32_t lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
        for (int32_t h = 0; h < G; h++) {
            const double *qv = q + (size_t)r * q_stride + (size_t)h * d;
            double m = -INFINITY, l = 0;
            memset(acc, 0, sizeof(double) * (size_t)d);
            for (int32_t j0 = lo; j0 <= pos;) {
                int32_t n = kmax - j0 % kmax;
                if (n > pos - j0 + 1) n = pos - j0 + 1;
                load_keys(src, j0, n, kbuf, vbuf);
                double s[ATT_CHUNK_ELEMS], mx = m;
                for (int32_t j = 0; j < n; j++) {
                    double dot = 0;
                    for (int32_t e = 0; e < d; e++) dot += qv[e] * kbuf[(size_t)j * d + e];
                    s[j] = dot * scale;
                    mx = fmax(mx, s[j]);
                }
                /* the non-finite rule (include/kvcache.h), as the FP32 kernels
                 * apply it (simd.h): weights and rescalings are held above
                 * e^-708, never 0 for finite scores; x + x * 0 turns -inf
                 * (a non-finite score) into NaN; a NaN stays NaN */
                const double c = m - mx, corr = m == -INFINITY ? 0 : exp(c < -708 ? -708 : c);
                l *= corr;
                for (int32_t e = 0; e < d; e++) acc[e] *= corr;
                for (int32_t j = 0; j < n; j++) {
                    double x = s[j] - mx;
                    x += x * 0;
                    const double p = exp(x < -708 ? -708 : x);
                    l += p;
                    for (int32_t e = 0; e < d; e++) acc[e] += p * vbuf[(size_t)j * d + e];
                }
                m = mx;
                j0 += n;
            }
            double *o = out + (size_t)r * q_stride + (size_t)h * d;
            for (int32_t e = 0; e < d; e++) o[e] = acc[e] / l;
        }
    }
}
