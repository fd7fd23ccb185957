/* scripts/batch_step.c - the cost of one batched decode step by its rows:
 * 16 sequences prefilled to DEPTH tokens, then steps of 1, 2, 4, 8 and 16
 * rows (one new token for each of that many sequences) in turn, REPS rounds,
 * each step rolled back after it. With THREADS 1 it times the process's CPU
 * time, which a loaded machine disturbs far less than wall time (the figures
 * of docs/PERFORMANCE.md's batched decode); with more, wall time.
 *
 *   cc -O2 -march=native -D_GNU_SOURCE -Iinclude -o build/batch_step scripts/batch_step.c \
 *      build/libkvengine.a build/libkvcache.a -lpthread -lm
 *   build/batch_step MODEL.gguf [DEPTH 40] [REPS 12] [THREADS 1]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../engine/model/model.h"

enum { MAX_ROWS = 16, N_SIZES = 5 };

static double seconds(int cpu) {
    struct timespec t;
    clock_gettime(cpu ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: batch_step MODEL.gguf [DEPTH 40] [REPS 12] [THREADS 1]\n");
        return 2;
    }
    const int depth = argc > 2 ? atoi(argv[2]) : 40, reps = argc > 3 ? atoi(argv[3]) : 12;
    const int threads = argc > 4 ? atoi(argv[4]) : 1;
    if (depth < 1 || reps < 2 || threads < 1) {
        fprintf(stderr, "batch_step: DEPTH >= 1, REPS >= 2, THREADS >= 1\n");
        return 2;
    }
    char err[256];
    llm_model *m;
    llm_context *c;
    if (llm_model_load(argv[1], &m, err, sizeof err)) {
        fprintf(stderr, "batch_step: %s\n", err);
        return 1;
    }
    llm_context_params p = llm_context_default_params();
    p.n_ctx = depth + 64, p.n_seqs = MAX_ROWS, p.n_threads = threads, p.n_batch = 512;
    if (llm_context_create(m, &p, &c, err, sizeof err)) {
        fprintf(stderr, "batch_step: %s\n", err);
        return 1;
    }
    const int V = llm_model_n_vocab(m);
    float *logits = malloc(sizeof(float) * (size_t)V * MAX_ROWS);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)depth), seqs[MAX_ROWS];
    if (!logits || !toks) return 1;
    for (int s = 0; s < MAX_ROWS; s++) {
        for (int i = 0; i < depth; i++) toks[i] = (s * 131 + i * 7919) % V;
        if (llm_seq_new(c, &seqs[s]) || llm_eval(c, seqs[s], toks, depth, 0, logits, NULL, NULL)) {
            fprintf(stderr, "batch_step: prefill failed\n");
            return 1;
        }
    }
    const int sizes[N_SIZES] = {1, 2, 4, 8, 16};
    double total[N_SIZES] = {0};
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < N_SIZES; k++) {
            const int n = sizes[k];
            int32_t rows[MAX_ROWS + 1], tk[MAX_ROWS];
            for (int i = 0; i <= n; i++) rows[i] = i;
            for (int i = 0; i < n; i++) tk[i] = (r * 17 + i) % V;
            llm_batch b = {.n_seqs = n, .seqs = seqs, .row_start = rows, .tokens = tk};
            double t0 = seconds(threads == 1);
            if (llm_forward(c, &b, logits)) {
                fprintf(stderr, "batch_step: step of %d rows failed\n", n);
                return 1;
            }
            if (r > 0) total[k] += seconds(threads == 1) - t0; /* the first round warms up */
            for (int i = 0; i < n; i++) llm_seq_truncate(c, seqs[i], depth);
        }
    printf("%s, depth %d, %d threads (%s time), %d rounds\n", argv[1], depth, threads, threads == 1 ? "CPU" : "wall",
           reps - 1);
    for (int k = 0; k < N_SIZES; k++)
        printf("  rows %2d: %8.3f ms a step, %7.1f tokens/s\n", sizes[k], 1e3 * total[k] / (reps - 1),
               sizes[k] * (reps - 1) / total[k]);
    llm_context_free(c), llm_model_free(m);
    free(logits), free(toks);
    return 0;
}
