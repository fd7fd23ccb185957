/* tests/ref.h - the float64 brute-force oracle every kernel is tested against.
 * Written from the definitions, independently of src/: an explicit score
 * matrix, an explicit mask, an explicit repeat of KV heads. */
#ifndef KV_TEST_REF_H
#define KV_TEST_REF_H

#include <stdint.h>

/* Mask of the seed: query i (of T) sits at S - T + i and sees key j iff
 * j <= S - T + i and, with window W > 0, j > S - T + i - W. */
int ref_visible(int T, int S, int i, int j, int window);

/* q [T, H, d], k and v [S, Hkv, d], out [T, H, d]; scale 0 means 1/sqrt(d).
 * `top_left` anchors the causal diagonal at (0, 0) instead (the bug the
 * offset mask exists to avoid); tests use it to show they would catch it. */
void ref_attention(int T, int S, int H, int Hkv, int d, const double *q, const double *k,
                   const double *v, double *out, int window, double scale, int top_left);

typedef struct {
    int rot_dim;          /* r <= d (0: d) */
    int interleaved;      /* 0: pairs (k, k + r/2); 1: pairs (2k, 2k + 1) */
    double theta;
    int llama3;           /* Llama 3.1 frequency scaling */
    double factor, low, high;
    int original_context;
} ref_rope_cfg;

/* Rotates x [n, heads, d] in place, row t by position pos[t]. */
void ref_rope(const ref_rope_cfg *cfg, double *x, int n, int heads, int d, const int *pos);

/* y [n, m] = x [n, k] @ w [k, m] */
void ref_matmul(const double *x, const double *w, double *y, int n, int k, int m);

/* One full pass of the seed's step over all N tokens (no cache): project,
 * rotate at positions 0..N-1 (rope may be NULL), attend with T = S = N.
 * x [N, D], wq [D, H*d], wk, wv [D, Hkv*d]; out [N, H*d]. If q_out/k_out/v_out
 * are non-NULL they receive the rotated q [N,H,d] and k, v [N,Hkv,d]. */
void ref_forward(int N, int D, int H, int Hkv, int d, const double *x, const double *wq,
                 const double *wk, const double *wv, const ref_rope_cfg *rope, int window,
                 double *out, double *q_out, double *k_out, double *v_out);

double ref_max_abs(const double *a, int n);
double ref_max_diff(const double *a, const double *b, int n);

#endif
