/* tests/main.c - runs the registered tests; `run_tests [SUBSTRING,...]` runs
 * those whose names contain one of the substrings.
 * KVCACHE_TEST_EXCLUDE=a,b,... leaves out the tests whose names contain any
 * of the substrings (the sanitizer and scalar runs leave out the slowest
 * real-model tests, which the plain run keeps), and says how many.
 * KVCACHE_TEST_JOBS=N runs them in N processes, each taking the next test
 * not yet taken, so that a machine's cores share a slow (sanitizer) run; a
 * test's lines come whole, but two tests' lines may interleave: run one job
 * (the default) to read a failure's messages in order. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

enum { MAX_TESTS = 1024 };

static struct { const char *name; test_fn fn; } tests[MAX_TESTS];
static int n_tests;
static int current_failed;

int test_quick(void) {
    const char *q = getenv("KVCACHE_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

void test_register(const char *name, test_fn fn) {
    if (n_tests == MAX_TESTS) {
        fprintf(stderr, "too many tests; raise MAX_TESTS\n");
        exit(2);
    }
    tests[n_tests].name = name;
    tests[n_tests].fn = fn;
    n_tests++;
}

void test_fail(const char *file, int line, const char *fmt, ...) {
    if (current_failed < 10) { /* enough to diagnose; the rest is noise */
        va_list ap;
        fprintf(stderr, "  %s:%d: ", file, line);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
    }
    current_failed++;
}

static int by_name(const void *a, const void *b) {
    const char *x = *(const char *const *)a, *y = *(const char *const *)b;
    return strcmp(x, y);
}

/* whether name contains one of the comma-separated substrings of list */
static int contains_any(const char *name, const char *list) {
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        for (const char *q = name; n && *q; q++)
            if (!strncmp(q, p, n)) return 1;
        p = e ? e + 1 : NULL;
    }
    return 0;
}

/* whether the run asks for the test: its name contains one of the filter's, if any */
static int matches(const char *name, const char *filter) { return !filter || contains_any(name, filter); }

/* What the processes of one run share: the next test to take, the counts,
 * and the test each worker is in (-1: none), to name one that dies. */
typedef struct {
    atomic_int next;
    int passed, failed;
    int running[64];
} shared_counts;

/* Takes tests in name order until none is left, counting each in `sh`. */
static void run_some(shared_counts *sh, int worker, const char *filter, const char *exclude) {
    for (int i; (i = atomic_fetch_add(&sh->next, 1)) < n_tests;) {
        if (!matches(tests[i].name, filter) || contains_any(tests[i].name, exclude)) continue;
        sh->running[worker] = i;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        current_failed = 0;
        tests[i].fn();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
        printf("%-4s %s (%.0f ms)\n", current_failed ? "FAIL" : "ok", tests[i].name, ms);
        fflush(stdout);
        __atomic_add_fetch(current_failed ? &sh->failed : &sh->passed, 1, __ATOMIC_SEQ_CST); /* kept if it dies later */
    }
    sh->running[worker] = -1;
    fflush(stderr);
}

int main(int argc, char **argv) {
    const char *filter = argc > 1 ? argv[1] : NULL, *exclude = getenv("KVCACHE_TEST_EXCLUDE");
    const char *jobs_env = getenv("KVCACHE_TEST_JOBS");
    const int jobs = jobs_env ? atoi(jobs_env) : 1;
    if (jobs < 1 || jobs > 64) {
        fprintf(stderr, "KVCACHE_TEST_JOBS must be 1..64, not '%s'\n", jobs_env);
        return 2;
    }
    /* run in a stable order, whatever the link order */
    qsort(tests, (size_t)n_tests, sizeof tests[0], by_name);
    int left_out = 0;
    for (int i = 0; i < n_tests; i++) left_out += matches(tests[i].name, filter) && contains_any(tests[i].name, exclude);
    shared_counts *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        perror("run_tests: mmap");
        return 2;
    }
    atomic_init(&sh->next, 0);
    if (jobs == 1) { /* in this process: a debugger sees the tests */
        run_some(sh, 0, filter, exclude);
    } else { /* workers, and this process counts what they did, even when one dies */
        fflush(stdout); /* nothing buffered for the workers to print again */
        pid_t pids[64];
        int started = 0;
        for (int k = 0; k < jobs; k++) {
            sh->running[k] = -1;
            pids[k] = fork();
            if (pids[k] == 0) {
                run_some(sh, k, filter, exclude);
                exit(0); /* exit, not _exit: LeakSanitizer checks a worker at exit */
            }
            if (pids[k] < 0) {
                perror("run_tests: fork");
                break;
            }
            started++;
        }
        if (started == 0) run_some(sh, 0, filter, exclude);
        for (int k = 0; k < started; k++) {
            int status;
            if (waitpid(pids[k], &status, 0) == pids[k] && WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
            /* in a test (a crash, a sanitizer's report), or after its last (a leak report) */
            const int t = sh->running[k], code = WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status);
            printf("FAIL %s (worker %d %s %d)\n", t >= 0 ? tests[t].name : "after its last test", k,
                   WIFSIGNALED(status) ? "killed by signal" : "exited with status", code);
            sh->failed++; /* the tests it had not taken, the others took */
        }
    }
    if (left_out) printf("%d passed, %d failed (%d left out by KVCACHE_TEST_EXCLUDE=%s)\n", sh->passed, sh->failed, left_out, exclude);
    else printf("%d passed, %d failed\n", sh->passed, sh->failed);
    return sh->failed ? 1 : 0;
}
