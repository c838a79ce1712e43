/* test.h - the tiny test harness every tests/test_*.c uses.
 *
 * A test file is a main() that RUN()s test functions. A function fails when
 * any CHECK in it fails; SKIP() marks it skipped (e.g. no GPU). The last line
 * a test binary prints is "NAME: N passed, N failed, N skipped", which
 * tests/run.sh adds up into the suite's closing line.
 */
#ifndef KVQ_TEST_H
#define KVQ_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq_status.h"

static int test_failures_;
static int test_passed_, test_failed_, test_skipped_;
static int test_skip_flag_;
static const char *test_current_;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            test_failures_++;                                                        \
            fprintf(stderr, "  %s:%d: %s: check failed: %s\n", __FILE__, __LINE__,   \
                    test_current_, #cond);                                           \
        }                                                                            \
    } while (0)

/* CHECKF(cond, "fmt", args...) prints the formatted detail when cond fails. */
#define CHECKF(cond, ...)                                                            \
    do {                                                                             \
        if (!(cond)) {                                                               \
            test_failures_++;                                                        \
            fprintf(stderr, "  %s:%d: %s: check failed: %s: ", __FILE__, __LINE__,   \
                    test_current_, #cond);                                           \
            fprintf(stderr, __VA_ARGS__);                                            \
            fputc('\n', stderr);                                                     \
        }                                                                            \
    } while (0)

/* Expects a kvq_status equal to `want`. */
#define CHECK_STATUS(expr, want)                                                     \
    do {                                                                             \
        kvq_status st_ = (expr);                                                     \
        CHECKF(st_ == (want), "got %d (%s), want %d (%s)", (int)st_,                 \
               kvq_status_str(st_), (int)(want), kvq_status_str(want));              \
    } while (0)
#define CHECK_OK(expr) CHECK_STATUS(expr, KVQ_OK)

#define CHECK_NEAR(a, b, tol)                                                        \
    do {                                                                             \
        double a_ = (double)(a), b_ = (double)(b), t_ = (double)(tol);               \
        CHECKF(fabs(a_ - b_) <= t_, "%s = %.12g, %s = %.12g, |diff| %.3g > %.3g",    \
               #a, a_, #b, b_, fabs(a_ - b_), t_);                                   \
    } while (0)

/* Marks the current test skipped and returns from it. */
#define SKIP(...)                                                                    \
    do {                                                                             \
        printf("  skip %s: ", test_current_);                                        \
        printf(__VA_ARGS__);                                                         \
        printf("\n");                                                                \
        test_skip_flag_ = 1;                                                         \
        return;                                                                      \
    } while (0)

/* KVQ_TEST_ONLY=a,b runs only the tests named (a sanitizer run of a few). */
static inline int test_selected_(const char *name)
{
    const char *only = getenv("KVQ_TEST_ONLY");
    if (!only || !*only)
        return 1;
    const size_t n = strlen(name);
    for (const char *p = only; (p = strstr(p, name)) != NULL; p += n)
        if ((p == only || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
            return 1;
    return 0;
}

static inline void test_run_(const char *name, void (*fn)(void))
{
    if (!test_selected_(name))
        return;
    int before = test_failures_;
    test_current_ = name;
    test_skip_flag_ = 0;
    fn();
    if (test_failures_ > before) {
        test_failed_++;
        printf("FAIL %s\n", name);
    } else if (test_skip_flag_) {
        test_skipped_++;
    } else {
        test_passed_++;
        printf("ok   %s\n", name);
    }
    fflush(stdout);
}
#define RUN(fn) test_run_(#fn, fn)

static inline int test_end_(const char *suite)
{
    printf("%s: %d passed, %d failed, %d skipped\n", suite, test_passed_, test_failed_, test_skipped_);
    return test_failed_ ? 1 : 0;
}
#define TEST_END(suite) test_end_(suite)

/* Path of a repository file: tests run from the repository root. */
#define TEST_MODEL_DIR "models/kvq-tiny-llama"
#define TEST_REF_DIR "models/kvq-tiny-llama/reference"

#endif /* KVQ_TEST_H */
