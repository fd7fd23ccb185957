/* tests/ref.c - the float64 oracle (see ref.h). Clarity over speed. */
#include "ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int ref_visible(int T, int S, int i, int j, int window) {
    int pos = S - T + i;
    if (j > pos) return 0;
    if (window > 0 && j <= pos - window) return 0;
    return 1;
}

void ref_attention(int T, int S, int H, int Hkv, int d, const double *q, const double *k,
                   const double *v, double *out, int window, double scale, int top_left) {
    if (T == 0) return;
    if (scale == 0) scale = 1.0 / sqrt((double)d);
    int G = H / Hkv;
    /* explicit repeat of KV heads: kr, vr [H, S, d] */
    double *kr = malloc(sizeof(double) * H * S * d), *vr = malloc(sizeof(double) * H * S * d);
    for (int h = 0; h < H; h++)
        for (int j = 0; j < S; j++)
            for (int e = 0; e < d; e++) {
                kr[((size_t)h * S + j) * d + e] = k[((size_t)j * Hkv + h / G) * d + e];
                vr[((size_t)h * S + j) * d + e] = v[((size_t)j * Hkv + h / G) * d + e];
            }
    /* explicit score matrix [T, S] per head, explicit mask, softmax with max subtraction */
    double *s = malloc(sizeof(double) * T * S);
    for (int h = 0; h < H; h++) {
        for (int i = 0; i < T; i++) {
            for (int j = 0; j < S; j++) {
                double dot = 0;
                for (int e = 0; e < d; e++) dot += q[((size_t)i * H + h) * d + e] * kr[((size_t)h * S + j) * d + e];
                int vis = top_left ? j <= i : ref_visible(T, S, i, j, window);
                s[(size_t)i * S + j] = vis ? dot * scale : -INFINITY;
            }
        }
        for (int i = 0; i < T; i++) {
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < S; j++) mx = fmax(mx, s[(size_t)i * S + j]);
            for (int j = 0; j < S; j++) sum += (s[(size_t)i * S + j] = exp(s[(size_t)i * S + j] - mx));
            for (int e = 0; e < d; e++) {
                double acc = 0;
                for (int j = 0; j < S; j++) acc += s[(size_t)i * S + j] / sum * vr[((size_t)h * S + j) * d + e];
                out[((size_t)i * H + h) * d + e] = acc;
            }
        }
    }
    free(s);
    free(kr);
    free(vr);
}

static double ref_freq(const ref_rope_cfg *c, int r, int pair) {
    double f = 1.0 / pow(c->theta, (2.0 * pair) / r);
    if (!c->llama3) return f;
    double wavelen = 2 * M_PI / f;
    double low_wavelen = c->original_context / c->low, high_wavelen = c->original_context / c->high;
    if (wavelen < high_wavelen) return f;
    if (wavelen > low_wavelen) return f / c->factor;
    double smooth = (c->original_context / wavelen - c->low) / (c->high - c->low);
    return (1 - smooth) * f / c->factor + smooth * f;
}

void ref_rope(const ref_rope_cfg *c, double *x, int n, int heads, int d, const int *pos) {
    int r = c->rot_dim ? c->rot_dim : d;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < heads; h++) {
            double *row = x + ((size_t)t * heads + h) * d;
            for (int p = 0; p < r / 2; p++) {
                int a = c->interleaved ? 2 * p : p, b = c->interleaved ? 2 * p + 1 : p + r / 2;
                double ang = pos[t] * ref_freq(c, r, p);
                double xa = row[a], xb = row[b];
                row[a] = xa * cos(ang) - xb * sin(ang);
                row[b] = xa * sin(ang) + xb * cos(ang);
            }
        }
}

void ref_matmul(const double *x, const double *w, double *y, int n, int k, int m) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double acc = 0;
            for (int e = 0; e < k; e++) acc += x[(size_t)i * k + e] * w[(size_t)e * m + j];
            y[(size_t)i * m + j] = acc;
        }
}

void ref_forward(int N, int D, int H, int Hkv, int d, const double *x, const double *wq,
                 const double *wk, const double *wv, const ref_rope_cfg *rope, int window,
                 double *out, double *q_out, double *k_out, double *v_out) {
    double *q = malloc(sizeof(double) * (N * H * d + 1)), *k = malloc(sizeof(double) * (N * Hkv * d + 1));
    double *v = malloc(sizeof(double) * (N * Hkv * d + 1));
    int *pos = malloc(sizeof(int) * (N + 1));
    ref_matmul(x, wq, q, N, D, H * d);
    ref_matmul(x, wk, k, N, D, Hkv * d);
    ref_matmul(x, wv, v, N, D, Hkv * d);
    for (int i = 0; i < N; i++) pos[i] = i;
    if (rope) {
        ref_rope(rope, q, N, H, d, pos);
        ref_rope(rope, k, N, Hkv, d, pos);
    }
    ref_attention(N, N, H, Hkv, d, q, k, v, out, window, 0, 0);
    if (q_out) memcpy(q_out, q, sizeof(double) * N * H * d);
    if (k_out) memcpy(k_out, k, sizeof(double) * N * Hkv * d);
    if (v_out) memcpy(v_out, v, sizeof(double) * N * Hkv * d);
    free(q);
    free(k);
    free(v);
    free(pos);
}

double ref_max_abs(const double *a, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) m = fmax(m, fabs(a[i]));
    return m;
}

double ref_max_diff(const double *a, const double *b, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) {
        double diff = fabs(a[i] - b[i]);
        if (isnan(diff)) return INFINITY;
        m = fmax(m, diff);
    }
    return m;
}
