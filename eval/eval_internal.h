/* eval_internal.h - helpers the eval/ sources share (not exported). */
#ifndef KVQ_EVAL_INTERNAL_H
#define KVQ_EVAL_INTERNAL_H

#include <time.h>

/* Monotonic wall clock in seconds. */
static inline double eval_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
