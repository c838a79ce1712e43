/* parallel.h - one process-wide pool of worker threads for the CPU
 * backend's loops (few-row products, attention over KV heads).
 *
 * kvq_set_threads (kvq_model.h) sizes it (OpenBLAS stays single-threaded:
 * backend_cpu.c splits its sgemm calls over this pool); by default
 * it has as many threads as the process may run on (sched_getaffinity).
 * Work is split into tasks whose results do not depend on which thread runs
 * them or in what order, so output is identical for any thread count.
 * A loop started while the pool is busy (another sequence on another thread,
 * or a loop inside a loop) runs on the calling thread alone.
 */
#ifndef KVQ_PARALLEL_H
#define KVQ_PARALLEL_H

/* Threads the pool runs a loop on (the caller included), >= 1. */
int kvq_par_threads(void);

/* Runs fn(ctx, i, w) for every i in [0, n), each exactly once, on at most
 * max_workers threads (w in [0, max_workers) names the thread, e.g. for
 * per-thread scratch); returns when all are done. */
void kvq_par_for(int n, int max_workers, void (*fn)(void *ctx, int i, int w), void *ctx);

#endif
