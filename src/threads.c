/* src/threads.c - a small pthread pool for data-parallel jobs.
 *
 * A job is published by bumping `generation`; workers spin briefly on it
 * (decode runs hundreds of small jobs per token, and waking a sleeping thread
 * costs tens of microseconds), then sleep on a condition variable. Tasks are
 * claimed from an atomic counter, so any thread may run any task: the split
 * of work is fixed by the caller, never by the thread count. */
#include <stdatomic.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "internal.h"

enum { SPIN_ROUNDS = 20000, MAX_THREADS = 256 };

struct kv_pool {
    int32_t n_threads;          /* workers + the caller */
    pthread_t *workers;         /* [n_threads - 1] */
    pthread_mutex_t run_lock;   /* one job at a time */
    pthread_mutex_t lock;       /* guards sleeping/waking */
    pthread_cond_t wake;        /* a new job, or stop */
    pthread_cond_t done;        /* the last worker finished its share */
    atomic_uint generation;     /* bumped per job */
    atomic_int next_task;       /* next unclaimed task of the job */
    atomic_int busy;            /* workers still inside the current job */
    atomic_bool stop;
    int32_t n_tasks;            /* the current job */
    kv_task_fn fn;
    void *ctx;
};

typedef struct {
    kv_pool *pool;
    int32_t thread;
} worker_arg;

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void run_tasks(kv_pool *p, int32_t thread) {
    for (;;) {
        int32_t t = atomic_fetch_add_explicit(&p->next_task, 1, memory_order_relaxed);
        if (t >= p->n_tasks) return;
        p->fn(p->ctx, t, thread);
    }
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    kv_pool *p = wa->pool;
    const int32_t thread = wa->thread;
    free(wa);
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop) && spins++ < SPIN_ROUNDS)
            cpu_relax();
        if (gen == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->lock);
            while ((gen = atomic_load(&p->generation)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->lock);
            pthread_mutex_unlock(&p->lock);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = gen;
        run_tasks(p, thread);
        if (atomic_fetch_sub_explicit(&p->busy, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->lock);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->lock);
        }
    }
}

int kv_pool_create(int32_t n_threads, kv_pool **out) {
    if (!out) return KV_ERR_NULL;
    if (n_threads < 0 || n_threads > MAX_THREADS) return KV_ERR_SHAPE;
    if (n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int32_t)n;
    }
    kv_pool *p = calloc(1, sizeof *p);
    if (!p) return KV_ERR_NOMEM;
    p->n_threads = n_threads;
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    if (!p->workers) {
        free(p);
        return KV_ERR_NOMEM;
    }
    pthread_mutex_init(&p->run_lock, NULL);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 4u << 20); /* kernels keep their tiles on the stack */
    for (int32_t i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) *wa = (worker_arg){p, i};
        if (!wa || pthread_create(&p->workers[i - 1], &attr, worker_main, wa) != 0) {
            free(wa);
            p->n_threads = i; /* the ones started so far */
            pthread_attr_destroy(&attr);
            kv_pool_free(p);
            return KV_ERR_NOMEM;
        }
    }
    pthread_attr_destroy(&attr);
    *out = p;
    return KV_OK;
}

void kv_pool_free(kv_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int32_t i = 1; i < p->n_threads; i++) pthread_join(p->workers[i - 1], NULL);
    pthread_mutex_destroy(&p->run_lock);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p->workers);
    free(p);
}

int32_t kv_pool_threads(const kv_pool *p) { return p ? p->n_threads : 1; }

int kv_pool_run(kv_pool *p, int32_t n_tasks, kv_task_fn fn, void *ctx) {
    if (!fn) return KV_ERR_NULL;
    if (n_tasks < 0) return KV_ERR_SHAPE;
    if (!p || p->n_threads == 1 || n_tasks <= 1) {
        for (int32_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return KV_OK;
    }
    pthread_mutex_lock(&p->run_lock);
    p->n_tasks = n_tasks;
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->next_task, 0);
    atomic_store(&p->busy, p->n_threads - 1);
    pthread_mutex_lock(&p->lock);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    run_tasks(p, 0);
    int spins = 0;
    while (atomic_load_explicit(&p->busy, memory_order_acquire) > 0 && spins++ < SPIN_ROUNDS) cpu_relax();
    if (atomic_load(&p->busy) > 0) {
        pthread_mutex_lock(&p->lock);
        while (atomic_load(&p->busy) > 0) pthread_cond_wait(&p->done, &p->lock);
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_unlock(&p->run_lock);
    return KV_OK;
}
