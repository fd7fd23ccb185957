/* scripts/decode_layers.c - decode attention as a model step meets it: the
 * K/V of a 16-layer cache at the Llama 3.2 1B shape (H32/Hkv8/d64, f16), one
 * query row attended layer after layer, each layer after a read of its share
 * of the weights (WEIGHT_MB over the layers, on the same pool), so the K/V
 * comes from memory as it does in `kvcache bench model`. Prints, best and
 * median of REPS steps (wall time): the weight reads' GB/s, attention's GB/s
 * of K/V and their ratio; then attention with K/V in L2 (one layer of 512
 * keys, one thread, thread CPU time), the kernels' compute rate on one core.
 * A ratio well under 1 with a warm rate near the read rate per core means
 * the kernels, not memory, bound decode attention.
 *
 *   cc -O2 -march=native -D_GNU_SOURCE -Iinclude -o build/decode_layers scripts/decode_layers.c \
 *      build/libkvcache.a -lpthread -lm
 *   build/decode_layers [S 4096] [THREADS 2] [REPS 10] [WEIGHT_MB 656] [PAGE 16]
 *
 * PAGE: positions a cache page holds (the engine's default 16).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvcache.h"

enum { LAYERS = 16, H = 32, HKV = 8, D = 64 };

static double now(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    const float *w;
    size_t n; /* floats, a multiple of 16 * tasks */
    int32_t tasks;
    float sink[256];
} read_job;

/* Task t sums its contiguous share of the buffer, 16 lanes a step. */
static void read_task(void *ctx, int32_t t, int32_t thread) {
    read_job *r = ctx;
    const size_t per = r->n / (size_t)r->tasks;
    const float *p = r->w + (size_t)t * per;
    float acc[16] = {0};
    for (size_t i = 0; i < per; i += 16)
        for (int k = 0; k < 16; k++) acc[k] += p[i + k];
    float s = 0;
    for (int k = 0; k < 16; k++) s += acc[k];
    r->sink[t & 255] += s;
    (void)thread;
}

static int32_t page = 16;

static kv_cache *filled_cache(int32_t layers, int32_t S, int32_t *seq) {
    kv_cache_params p = kv_cache_default_params();
    p.n_layers = layers, p.n_kv_heads = HKV, p.head_dim = D, p.dtype = KV_F16;
    p.page_size = page, p.n_pages = S / page + 2;
    kv_cache *c = NULL;
    if (kv_cache_create(&p, &c) != KV_OK) return NULL;
    kv_seq_new(c, seq);
    kv_seq_reserve(c, *seq, S, NULL);
    int32_t rows[2] = {0, S};
    kv_batch b = {.n_seqs = 1, .seqs = seq, .row_start = rows};
    float *k = malloc(sizeof(float) * (size_t)S * HKV * D);
    unsigned s = 1;
    for (size_t i = 0; i < (size_t)S * HKV * D; i++) s = s * 1103515245u + 12345u, k[i] = (float)(s >> 16) / 65536.0f - 0.5f;
    for (int32_t l = 0; l < layers; l++) kv_append_f32(c, l, &b, k, k);
    free(k);
    return c;
}

int main(int argc, char **argv) {
    const int32_t S = argc > 1 ? atoi(argv[1]) : 4096, threads = argc > 2 ? atoi(argv[2]) : 2;
    const int reps = argc > 3 ? atoi(argv[3]) : 10;
    const size_t weight_mb = argc > 4 ? (size_t)atoll(argv[4]) : 656;
    page = argc > 5 ? atoi(argv[5]) : 16;
    if (page < 1) return fprintf(stderr, "decode_layers: PAGE must be at least 1\n"), 2;
    if (S < 1 || threads < 1 || reps < 1)
        return fprintf(stderr, "usage: decode_layers [S] [THREADS] [REPS] [WEIGHT_MB] [PAGE]\n"), 2;
    kv_pool *pool = NULL;
    int32_t seq;
    kv_cache *c = filled_cache(LAYERS, S, &seq);
    if (!c || kv_pool_create(threads, &pool) != KV_OK) return fprintf(stderr, "out of memory\n"), 1;
    kv_cache_set_pool(c, pool);
    static float q[H * D], out[H * D];
    for (int i = 0; i < H * D; i++) q[i] = (float)(i % 7) / 7.0f - 0.4f;
    int32_t one[2] = {0, 1};
    const kv_batch b1 = {.n_seqs = 1, .seqs = &seq, .row_start = one};
    /* the layer's share of the weights, cut into 4 tasks a thread */
    read_job rj = {.tasks = 4 * threads};
    rj.n = (weight_mb << 20) / LAYERS / sizeof(float) / (16 * (size_t)rj.tasks) * (16 * (size_t)rj.tasks);
    float *w = aligned_alloc(64, rj.n * sizeof(float));
    if (!w) return fprintf(stderr, "out of memory\n"), 1;
    for (size_t i = 0; i < rj.n; i++) w[i] = (float)(i & 7) * 1e-3f;
    rj.w = w;
    double *ta = malloc(sizeof(double) * (size_t)reps), *tr = malloc(sizeof(double) * (size_t)reps);
    kv_attend_f32(c, 0, &b1, H, q, out, 0); /* warm-up */
    for (int r = 0; r < reps; r++) {
        ta[r] = tr[r] = 0;
        for (int32_t l = 0; l < LAYERS; l++) {
            double t0 = now(CLOCK_MONOTONIC);
            kv_pool_run(pool, rj.tasks, read_task, &rj);
            double t1 = now(CLOCK_MONOTONIC);
            kv_attend_f32(c, l, &b1, H, q, out, 0);
            double t2 = now(CLOCK_MONOTONIC);
            tr[r] += t1 - t0, ta[r] += t2 - t1;
        }
    }
    const double kv_bytes = (double)LAYERS * HKV * S * D * 2 * 2, w_bytes = (double)LAYERS * rj.n * sizeof(float);
    double ratio[1024];
    const int nr = reps < 1024 ? reps : 1024;
    for (int r = 0; r < nr; r++) ratio[r] = (kv_bytes / ta[r]) / (w_bytes / tr[r]);
    qsort(ta, (size_t)reps, sizeof *ta, by_value), qsort(tr, (size_t)reps, sizeof *tr, by_value);
    qsort(ratio, (size_t)nr, sizeof *ratio, by_value);
    printf("S %d, %d threads, %d steps: weight reads %.2f GB/s (median %.2f), attention %.2f GB/s of K/V "
           "(median %.2f, %.2f ms a step), attention/read median %.2f\n",
           S, threads, reps, w_bytes / tr[0] / 1e9, w_bytes / tr[reps / 2] / 1e9, kv_bytes / ta[0] / 1e9,
           kv_bytes / ta[reps / 2] / 1e9, ta[reps / 2] * 1e3, ratio[nr / 2]);
    kv_cache_free(c);
    /* the kernels' own rate: one layer of 512 keys, in L2, one thread */
    int32_t wseq;
    kv_cache *wc = filled_cache(1, 512, &wseq);
    if (!wc) return fprintf(stderr, "out of memory\n"), 1;
    const kv_batch wb = {.n_seqs = 1, .seqs = &wseq, .row_start = one};
    double best = 1e9;
    for (int r = 0; r < 200 * reps; r++) {
        double t0 = now(CLOCK_THREAD_CPUTIME_ID);
        kv_attend_f32(wc, 0, &wb, H, q, out, 0);
        double t = now(CLOCK_THREAD_CPUTIME_ID) - t0;
        best = t < best ? t : best;
    }
    printf("K/V in L2 (512 keys, one thread): %.2f GB/s, %.1f us a layer\n", (double)HKV * 512 * D * 4 / best / 1e9,
           best * 1e6);
    kv_cache_free(wc);
    kv_pool_free(pool);
    free(w), free(ta), free(tr);
    return 0;
}
