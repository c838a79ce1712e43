/* bench_util.h - the timing helpers every benchmark shares (header-only).
 *
 * Benchmarks report medians of repeated runs: the median is what a noisy,
 * shared machine disturbs least. Which clock to read is each benchmark's
 * choice (wall time, or the thread's CPU time on a busy machine).
 */
#ifndef KVQ_BENCH_UTIL_H
#define KVQ_BENCH_UTIL_H

#include <stdlib.h>
#include <time.h>

/* Seconds on clock `id` (CLOCK_MONOTONIC, CLOCK_THREAD_CPUTIME_ID, ...). */
static inline double bench_clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[0..n) (sorts v in place); n >= 1. */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Ends benchmark `prog` on a failed kvq call (kvq_status_str: include
 * kvq_status.h), naming the call: a benchmark has nothing to report after one. */
#define BENCH_TRY(prog, expr)                                                                      \
    do {                                                                                           \
        kvq_status bench_st_ = (expr);                                                             \
        if (bench_st_ != KVQ_OK) {                                                                 \
            fprintf(stderr, "%s: %s: %s\n", prog, #expr, kvq_status_str(bench_st_));               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#endif /* KVQ_BENCH_UTIL_H */
