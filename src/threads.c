/* src/threads.c - a small pthread pool for data-parallel jobs.
 *
 * A job is published as a new generation in one atomic word that also holds
 * the index of the next unclaimed task: (generation << 32) | task. Any thread
 * claims a run of tasks with a compare-and-swap that fails once the
 * generation moved on, so the split of work is fixed by the caller, never by
 * the thread count, and a worker that wakes late finds nothing left instead
 * of being waited for. The caller runs tasks too, and returns when every task
 * has completed, whichever threads ran them. Workers spin briefly on the word
 * (decode runs hundreds of small jobs per token, and waking a sleeping thread
 * costs tens of microseconds), then sleep on a condition variable. */
#include <stdatomic.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "internal.h"

enum { SPIN_ROUNDS = 4000, MAX_THREADS = 256 };

typedef struct {
    kv_task_fn fn;
    void *ctx;
    _Atomic int32_t n_tasks;  /* read by late workers of an older job: atomic, though
                               * what they read then only fails their claim */
} pool_job;

struct kv_pool {
    int32_t n_threads;          /* workers + the caller */
    pthread_t *workers;         /* [n_threads - 1] */
    pthread_mutex_t run_lock;   /* one job at a time */
    pthread_mutex_t lock;       /* guards sleeping and waking */
    pthread_cond_t wake;        /* a new generation, or stop */
    pthread_cond_t done;        /* the last task of a job completed */
    _Atomic uint64_t next;      /* (generation << 32) | next unclaimed task */
    atomic_int completed;       /* tasks of the current job that have finished */
    atomic_bool stop;
    uint32_t generation;        /* the caller's count of jobs (under run_lock) */
    pool_job job[2];            /* job of generation g in job[g & 1]: a late reader of g
                                 * never sees g + 1's, which is written in the other slot */
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

static uint32_t generation_of(uint64_t word) { return (uint32_t)(word >> 32); }

/* Claims the next tasks of generation gen, if that job still has some: a run
 * of consecutive ones, a 2 n_threads-th of those left (at least one), so that
 * a job of many small tasks costs a few claims per thread instead of one a
 * task (each a compare-and-swap on a line every core writes), while the last
 * claims, one task each, still even out the threads' finishing times. */
static bool claim(kv_pool *p, uint32_t gen, int32_t *task, int32_t *count) {
    uint64_t w = atomic_load_explicit(&p->next, memory_order_acquire);
    for (;;) {
        const int32_t n = atomic_load_explicit(&p->job[gen & 1].n_tasks, memory_order_relaxed), at = (int32_t)(uint32_t)w;
        if (generation_of(w) != gen || at >= n) return false;
        int32_t k = (n - at) / (2 * p->n_threads);
        k = k < 1 ? 1 : k;
        if (atomic_compare_exchange_weak_explicit(&p->next, &w, w + (uint64_t)k, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            *task = at, *count = k;
            return true;
        }
    }
}

/* Runs tasks of generation gen until none is left, then counts them done in
 * one atomic add (one per task made the count's cache line bounce between the
 * cores thousands of times a token). */
static void run_tasks(kv_pool *p, uint32_t gen, int32_t thread) {
    const pool_job *j = &p->job[gen & 1];
    int32_t t, k, done = 0;
    while (claim(p, gen, &t, &k)) {
        for (int32_t i = 0; i < k; i++) j->fn(j->ctx, t + i, thread);
        done += k;
    }
    if (done && atomic_fetch_add_explicit(&p->completed, done, memory_order_acq_rel) + done == atomic_load(&j->n_tasks)) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->done);
        pthread_mutex_unlock(&p->lock);
    }
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    kv_pool *p = wa->pool;
    const int32_t thread = wa->thread;
    free(wa);
    uint32_t seen = 0;
    for (;;) {
        uint32_t gen;
        int spins = 0;
        while ((gen = generation_of(atomic_load_explicit(&p->next, memory_order_acquire))) == seen &&
               !atomic_load(&p->stop) && spins++ < SPIN_ROUNDS)
            cpu_relax();
        if (gen == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->lock);
            while ((gen = generation_of(atomic_load(&p->next))) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->lock);
            pthread_mutex_unlock(&p->lock);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = gen;
        run_tasks(p, gen, thread);
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
    const uint32_t gen = ++p->generation;
    p->job[gen & 1].fn = fn;
    p->job[gen & 1].ctx = ctx;
    atomic_store_explicit(&p->job[gen & 1].n_tasks, n_tasks, memory_order_relaxed);
    atomic_store_explicit(&p->completed, 0, memory_order_relaxed);
    pthread_mutex_lock(&p->lock);
    atomic_store_explicit(&p->next, (uint64_t)gen << 32, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    run_tasks(p, gen, 0);
    int spins = 0;
    while (atomic_load_explicit(&p->completed, memory_order_acquire) < n_tasks && spins++ < SPIN_ROUNDS) cpu_relax();
    if (atomic_load_explicit(&p->completed, memory_order_acquire) < n_tasks) {
        pthread_mutex_lock(&p->lock);
        while (atomic_load(&p->completed) < n_tasks) pthread_cond_wait(&p->done, &p->lock);
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_unlock(&p->run_lock);
    return KV_OK;
}
