/* scripts/decode_split.c - where a decode step's weight reads go: a model's
 * products of one token (1 X row) by class (q/k/v, o, gate/up, down, the
 * output matrix), each over all layers in the engine's task split
 * (engine/model/layers.c: tasks of about TASK_KB, rounded to a multiple of
 * the threads) on a pool of THREADS, against plain reads of the same bytes,
 * alternated, best of REPS rounds, wall time: "read" one stream a task in
 * the same split, "read4" each thread's half of a matrix as four
 * interleaved streams (the loop `kvcache bench model` measures its floor
 * with). Their ratios say how near each product class streams to what the
 * memory gives; the whole-step figure (`bench model`) adds attention, norms
 * and the pool's waits.
 *
 *   cc -O2 -march=native -D_GNU_SOURCE -Iinclude -o build/decode_split scripts/decode_split.c \
 *      build/libkvengine.a build/libkvcache.a -lpthread -lm
 *   build/decode_split MODEL.gguf [THREADS 2] [REPS 5] [TASK_KB 128]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvcache.h"
#include "../engine/model/arch.h"
#include "../engine/weights/quant.h"

enum { N_CLASSES = 5, MAX_MATS = 4096 };
static const char *class_name[N_CLASSES] = {"q/k/v", "o", "gate/up", "down", "output"};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    const llm_matrix *w;
    int64_t task_rows;
} mat;

typedef struct {
    const mat *m;
    const llm_act *a;
    float *y;
    int read;        /* a plain read of the rows' bytes instead of the product */
    float sink[64];
} job;

static void task_fn(void *ctx, int32_t task, int32_t thread) {
    job *j = ctx;
    const llm_matrix *w = j->m->w;
    const int64_t r0 = task * j->m->task_rows, r1 = r0 + j->m->task_rows < w->rows ? r0 + j->m->task_rows : w->rows;
    if (!j->read) {
        llm_matmul_act(w->type, w->data, w->packed, w->cols, r0, r1, j->a, j->y, w->rows);
        return;
    }
    const int64_t rb = w->packed ? llm_packed_bytes(w->type, 8, w->cols) / 8 : llm_row_bytes(w->type, w->cols);
    const uint8_t *p = (const uint8_t *)(w->packed ? w->packed : w->data) + r0 * rb;
    const size_t n = (size_t)((r1 - r0) * rb) / 64;
    typedef float v16 __attribute__((vector_size(64), aligned(1)));
    v16 s = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    if (j->read == 2) {   /* four interleaved streams, as bench model's bandwidth loop */
        const size_t q = n / 4;
        for (size_t i = 0; i < q; i++) {
            s += *(const v16 *)(p + 64 * i), s1 += *(const v16 *)(p + 64 * (i + q));
            s2 += *(const v16 *)(p + 64 * (i + 2 * q)), s3 += *(const v16 *)(p + 64 * (i + 3 * q));
        }
    } else
        for (size_t i = 0; i < n; i++) s += *(const v16 *)(p + 64 * i);
    s += s1 + s2 + s3;
    j->sink[thread % 64] += s[0];
}

static int64_t rows_per_task(const llm_matrix *w, int32_t threads, int64_t task_bytes) {
    const int64_t rb = llm_row_bytes(w->type, w->cols);
    int64_t tasks = (w->rows * rb + task_bytes - 1) / task_bytes;
    tasks = (tasks + threads - 1) / threads * threads;
    const int64_t rows = (w->rows + tasks - 1) / tasks;
    return (rows + 7) / 8 * 8;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: decode_split MODEL.gguf [THREADS 2] [REPS 5] [TASK_KB 128]\n");
        return 2;
    }
    const int threads = argc > 2 ? atoi(argv[2]) : 2, reps = argc > 3 ? atoi(argv[3]) : 5;
    const int64_t task_bytes = (argc > 4 ? atoll(argv[4]) : 128) << 10;
    char err[256];
    llm_model *m;
    if (llm_model_load(argv[1], &m, err, sizeof err)) {
        fprintf(stderr, "decode_split: %s\n", err);
        return 1;
    }
    kv_pool *pool;
    if (kv_pool_create(threads, &pool)) return 1;
    static mat mats[N_CLASSES][MAX_MATS / N_CLASSES];
    int n[N_CLASSES] = {0};
    for (int32_t l = 0; l < m->hp.n_layers; l++) {
        const llm_layer_weights *w = &m->layers[l];
        const llm_matrix *cls[N_CLASSES - 1][2] = {{&w->wq, &w->wk}, {&w->wo, NULL}, {&w->w_gate, &w->w_up},
                                                   {&w->w_down, NULL}};
        for (int c = 0; c < N_CLASSES - 1; c++)
            for (int i = 0; i < 2 && cls[c][i]; i++) mats[c][n[c]++].w = cls[c][i];
        mats[0][n[0]++].w = &w->wv;
    }
    mats[4][n[4]++].w = &m->output;
    const int64_t D = m->hp.dim, F = m->hp.ffn_dim > D ? m->hp.ffn_dim : D;
    float *x = malloc(sizeof(float) * (size_t)F), *y = malloc(sizeof(float) * (size_t)m->output.rows);
    size_t ab = llm_act_bytes(1, F);
    void *buf = malloc(ab);
    llm_act a[2];
    srand(1);
    for (int64_t i = 0; i < F; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    void *buf2 = malloc(ab);
    if (!x || !y || !buf || !buf2 || llm_act_quantize(&a[0], x, 1, D, llm_act_default_bits(), buf, ab) ||
        llm_act_quantize(&a[1], x, 1, F, llm_act_default_bits(), buf2, ab))
        return 1;
    double best[N_CLASSES][3], bytes[N_CLASSES] = {0};
    for (int c = 0; c < N_CLASSES; c++) {
        best[c][0] = best[c][1] = best[c][2] = 1e30;
        for (int i = 0; i < n[c]; i++) {
            const llm_matrix *w = mats[c][i].w;
            mats[c][i].task_rows = rows_per_task(w, threads, task_bytes);
            bytes[c] += (double)(w->packed ? llm_packed_bytes(w->type, w->rows, w->cols)
                                           : w->rows * llm_row_bytes(w->type, w->cols));
        }
    }
    for (int r = 0; r < reps; r++)
        for (int c = 0; c < N_CLASSES; c++)
            for (int rd = 0; rd < 3; rd++) {
                job j = {.y = y, .read = rd};
                double t = now();
                for (int i = 0; i < n[c]; i++) {
                    mat whole = {mats[c][i].w, (mats[c][i].w->rows / threads + 7) / 8 * 8};
                    j.m = rd == 2 ? &whole : &mats[c][i];
                    j.a = &a[mats[c][i].w->cols == D ? 0 : 1];
                    kv_pool_run(pool, (int32_t)((j.m->w->rows + j.m->task_rows - 1) / j.m->task_rows), task_fn, &j);
                }
                t = now() - t;
                if (t < best[c][rd]) best[c][rd] = t;
            }
    double tot[3] = {0}, totb = 0;
    printf("%s, %d threads, tasks of ~%lld KB, best of %d (wall)\n", llm_quant_kernels(), threads,
           (long long)(task_bytes >> 10), reps);
    printf("%-8s %-7s %8s %8s %8s %8s %9s %6s %6s\n", "class", "type", "MB", "prod ms", "read ms", "read4 ms",
           "prod GB/s", "/read", "/read4");
    for (int c = 0; c < N_CLASSES; c++) {
        printf("%-8s %-7s %8.1f %8.2f %8.2f %8.2f %9.2f %6.3f %6.3f\n", class_name[c],
               llm_type_name(mats[c][0].w->type), bytes[c] / 1e6, best[c][0] * 1e3, best[c][1] * 1e3,
               best[c][2] * 1e3, bytes[c] / best[c][0] / 1e9, best[c][1] / best[c][0], best[c][2] / best[c][0]);
        for (int k = 0; k < 3; k++) tot[k] += best[c][k];
        totb += bytes[c];
    }
    printf("%-8s %-7s %8.1f %8.2f %8.2f %8.2f %9.2f %6.3f %6.3f (read %.2f, read4 %.2f GB/s)\n", "all", "",
           totb / 1e6, tot[0] * 1e3, tot[1] * 1e3, tot[2] * 1e3, totb / tot[0] / 1e9, tot[1] / tot[0],
           tot[2] / tot[0], totb / tot[1] / 1e9, totb / tot[2] / 1e9);
    kv_pool_free(pool);
    llm_model_free(m);
    free(x), free(y), free(buf), free(buf2);
    return 0;
}
