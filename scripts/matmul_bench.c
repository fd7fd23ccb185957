/* scripts/matmul_bench.c - one weight product in GMAC/s: ROWS x N random
 * weights of a type (ggml number: 2 Q4_0, 12 Q4_K, 14 Q6_K, ...) against M
 * X rows quantized to 16 bits (KVCACHE_ACT_BITS=8: 8 bits), plain or packed (llm_pack_rows), called in
 * tasks of TASK rows as the engine's pool runs it (engine/model/layers.c),
 * best of 5 in the thread's CPU time, which a loaded machine disturbs less
 * than wall time. KVCACHE_SIMD=avx2 runs the AVX2 kernels.
 *
 *   cc -O2 -march=native -D_GNU_SOURCE -Iinclude -o build/matmul_bench scripts/matmul_bench.c \
 *      build/libkvengine.a build/libkvcache.a -lpthread -lm
 *   build/matmul_bench TYPE ROWS N M [PACKED 1] [TASK ROWS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../engine/weights/quant.h"

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s TYPE ROWS N M [PACKED 1] [TASK ROWS]\n", argv[0]);
        return 2;
    }
    const int type = atoi(argv[1]);
    const int64_t rows = atoll(argv[2]), n = atoll(argv[3]), m = atoll(argv[4]);
    const int pack = argc > 5 ? atoi(argv[5]) : 1;
    const int64_t task = argc > 6 ? atoll(argv[6]) : rows;
    const int64_t rb = llm_row_bytes(type, n);
    if (!llm_type_int8(type) || rb <= 0 || rows < 1 || m < 1 || task < 1) {
        fprintf(stderr, "bad type or shape\n");
        return 2;
    }
    uint8_t *W = malloc((size_t)(rows * rb));
    float *X = malloc((size_t)(m * n) * sizeof *X), *Y = malloc((size_t)(m * rows) * sizeof *Y);
    size_t ab = llm_act_bytes(m, n);
    void *buf = malloc(ab);
    if (!W || !X || !Y || !buf) return 1;
    srand(1);
    for (int64_t i = 0; i < rows * rb; i++) W[i] = (uint8_t)rand();
    for (int64_t i = 0; i < m * n; i++) X[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    llm_act a;
    const int bits = llm_act_default_bits();   /* stored as the engine stores them */
    if (llm_act_quantize_as(&a, X, m, n, bits, llm_act_store_bits(bits, m), buf, ab) != 0) return 1;
    void *P = NULL;
    int64_t pb = pack ? llm_packed_bytes(type, rows, n) : 0;
    if (pb && (P = malloc((size_t)pb)) != NULL) llm_pack_rows(type, W, rows, n, P);
    double best = 1e30;
    for (int it = 0; it < 5; it++) {
        double t = cpu_seconds();
        for (int64_t r0 = 0; r0 < rows; r0 += task)
            llm_matmul_act(type, W, P, n, r0, r0 + task < rows ? r0 + task : rows, &a, Y, rows);
        t = cpu_seconds() - t;
        best = t < best ? t : best;
    }
    printf("%s %s %lld x %lld, %lld X rows, %s, tasks of %lld rows: %.2f ms, %.1f GMAC/s\n", llm_quant_kernels(),
           llm_type_name(type), (long long)rows, (long long)n, (long long)m, P ? "packed" : "plain", (long long)task,
           best * 1e3, (double)(rows * n * m) / best * 1e-9);
    free(W), free(X), free(Y), free(buf), free(P);
    return 0;
}
