/* tests/main.c - runs the registered tests; `run_tests [SUBSTRING]`.
 * KVCACHE_TEST_EXCLUDE=a,b,... leaves out the tests whose names contain any
 * of the substrings (the sanitizer and scalar runs leave out the slowest
 * real-model tests, which the plain run keeps), and says how many. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test.h"

enum { MAX_TESTS = 1024 };

static struct { const char *name; test_fn fn; } tests[MAX_TESTS];
static int n_tests;
static int current_failed;

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
static int excluded(const char *name, const char *list) {
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        for (const char *q = name; n && *q; q++)
            if (!strncmp(q, p, n)) return 1;
        p = e ? e + 1 : NULL;
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *filter = argc > 1 ? argv[1] : NULL, *exclude = getenv("KVCACHE_TEST_EXCLUDE");
    int passed = 0, failed = 0, left_out = 0;
    /* run in a stable order, whatever the link order */
    qsort(tests, (size_t)n_tests, sizeof tests[0], by_name);
    for (int i = 0; i < n_tests; i++) {
        if (filter && !strstr(tests[i].name, filter)) continue;
        if (excluded(tests[i].name, exclude)) {
            left_out++;
            continue;
        }
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        current_failed = 0;
        tests[i].fn();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
        printf("%-4s %s (%.0f ms)\n", current_failed ? "FAIL" : "ok", tests[i].name, ms);
        fflush(stdout);
        if (current_failed) failed++; else passed++;
    }
    if (left_out) printf("%d passed, %d failed (%d left out by KVCACHE_TEST_EXCLUDE=%s)\n", passed, failed, left_out, exclude);
    else printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
