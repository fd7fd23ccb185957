/* scripts/attend_ab.c - median CPU time of one kv_attend_f32 call (one
 * thread, K/V warm) on the decode cases of `kvcache bench attention` plus
 * bf16 and shorter contexts, and a T = S = 2048 prefill: for A/B runs of
 * two builds of the kernels, alternated, on a shared machine (thread CPU
 * time leaves out the time other work holds the core).
 *
 *   cc -O2 -D_GNU_SOURCE -Iinclude -o build/attend_ab scripts/attend_ab.c build/libkvcache.a -lpthread -lm
 *   KVCACHE_SIMD=avx512 build/attend_ab; KVCACHE_SIMD=avx2 build/attend_ab */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kvcache.h"

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void fill(float *x, size_t n, unsigned *s) {
    for (size_t i = 0; i < n; i++) {
        *s = *s * 1103515245u + 12345u;
        x[i] = (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
}

static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median microseconds a call of T rows over S keys, at least 7 calls and
 * `budget` seconds of CPU time; -1 if the cache cannot be made. */
static double median_us(int H, int Hkv, int d, kv_dtype dtype, int S, int T, double budget) {
    kv_cache_params p = kv_cache_default_params();
    p.n_kv_heads = Hkv, p.head_dim = d, p.dtype = dtype, p.page_size = 16, p.n_pages = S / 16 + 1;
    kv_cache *c;
    if (kv_cache_create(&p, &c) != KV_OK) return -1;
    int32_t seq, rows[2] = {0, S};
    kv_seq_new(c, &seq);
    kv_batch b = {.n_seqs = 1, .seqs = &seq, .row_start = rows};
    float *kv = malloc(sizeof(float) * (size_t)S * Hkv * d);
    unsigned s = 7;
    fill(kv, (size_t)S * Hkv * d, &s);
    kv_seq_reserve(c, seq, S, NULL);
    kv_append_f32(c, 0, &b, kv, kv);
    free(kv);
    rows[1] = T;
    float *q = malloc(sizeof(float) * (size_t)T * H * d), *out = malloc(sizeof(float) * (size_t)T * H * d);
    fill(q, (size_t)T * H * d, &s);
    for (int i = 0; i < 3; i++) kv_attend_f32(c, 0, &b, H, q, out, 0);
    enum { MAX_CALLS = 4000 };
    static double t[MAX_CALLS];
    int n = 0;
    const double t0 = cpu_now();
    while (n < MAX_CALLS && (n < 7 || cpu_now() - t0 < budget)) {
        const double a = cpu_now();
        kv_attend_f32(c, 0, &b, H, q, out, 0);
        t[n++] = cpu_now() - a;
    }
    qsort(t, (size_t)n, sizeof *t, by_value);
    free(q), free(out);
    kv_cache_free(c);
    return t[n / 2] * 1e6;
}

int main(void) {
    static const struct {
        const char *name;
        kv_dtype t;
    } types[] = {{"f16", KV_F16}, {"q8", KV_Q8}, {"bf16", KV_BF16}};
    static const int shapes[2][3] = {{32, 8, 128}, {9, 3, 64}}, Ss[] = {2048, 8192, 32768};
    printf("simd %s\n", kv_simd_name());
    for (int a = 0; a < 3; a++)
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 3; i++)
                printf("decode %s H%d/Hkv%d/d%d S=%d %.1f\n", types[a].name, shapes[h][0], shapes[h][1], shapes[h][2],
                       Ss[i], median_us(shapes[h][0], shapes[h][1], shapes[h][2], types[a].t, Ss[i], 1, 0.15));
    printf("prefill f16 H32/Hkv8/d128 T=S=2048 %.1f\n", median_us(32, 8, 128, KV_F16, 2048, 2048, 1.0));
    return 0;
}
