/* bench_cuda_util.h - GPU helpers for the benchmarks only (bench_cuda.c):
 * a device-event timer, a deterministic random fill and a plain read of
 * device memory. They are not part of libkvq, which neither builds nor
 * exports them: bench_cuda_util.cu is compiled with nvcc and linked into the
 * CUDA benchmark only. Without nvcc the functions below are stubs that say
 * KVQ_ERR_NO_DEVICE (like kvq/cuda/cuda_stub.c for the library), so the
 * benchmark still builds and reports that there is nothing to measure.
 */
#ifndef KVQ_BENCH_CUDA_UTIL_H
#define KVQ_BENCH_CUDA_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "kvq_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device-event timer: start/stop bracket work queued on the default
 * stream; stop waits for it and returns the elapsed milliseconds. */
typedef struct bench_cuda_timer bench_cuda_timer;

#if defined(KVQ_HAVE_CUDA) || defined(__CUDACC__)

/** @return KVQ_OK and *out; KVQ_ERR_INVALID_ARG, KVQ_ERR_NO_DEVICE,
 *  KVQ_ERR_NOMEM or KVQ_ERR_DEVICE. */
kvq_status bench_cuda_timer_create(bench_cuda_timer **out);
/** Frees t; accepts NULL. */
void bench_cuda_timer_free(bench_cuda_timer *t);
kvq_status bench_cuda_timer_start(bench_cuda_timer *t);
kvq_status bench_cuda_timer_stop(bench_cuda_timer *t, double *ms);

/** Fills x_dev[n] with N(0, sigma^2) draws from a counter-based generator
 *  (seed, index) -> value, on the default stream: deterministic whatever
 *  the launch shape. @return KVQ_OK, KVQ_ERR_INVALID_ARG,
 *  KVQ_ERR_NO_DEVICE or KVQ_ERR_DEVICE. */
kvq_status bench_cuda_fill_normal(float *x_dev, size_t n, uint64_t seed, float sigma);

/** Reads bytes of device memory and discards them, on the default stream
 *  (any alignment, any length, nothing past the end). Run over a buffer
 *  larger than the L2 cache it starts a timed call cold without leaving
 *  it dirty lines to write back (a memset flush does); run over a buffer
 *  the size of a call's input it times a plain read of those bytes.
 *  @return KVQ_OK, KVQ_ERR_INVALID_ARG, KVQ_ERR_NO_DEVICE or
 *  KVQ_ERR_DEVICE. */
kvq_status bench_cuda_touch(const void *dev, size_t bytes);

/** Starts (on) or stops the profiler's collection (cudaProfilerStart/Stop):
 *  under `ncu --profile-from-start off` only the work in between is
 *  profiled. @return KVQ_OK or KVQ_ERR_DEVICE. */
kvq_status bench_cuda_profile(int on);

#else /* built without nvcc: no device */

static inline kvq_status bench_cuda_timer_create(bench_cuda_timer **out)
{
    if (out)
        *out = NULL;
    return KVQ_ERR_NO_DEVICE;
}
static inline void bench_cuda_timer_free(bench_cuda_timer *t)
{
    (void)t;
}
static inline kvq_status bench_cuda_timer_start(bench_cuda_timer *t)
{
    (void)t;
    return KVQ_ERR_NO_DEVICE;
}
static inline kvq_status bench_cuda_timer_stop(bench_cuda_timer *t, double *ms)
{
    (void)t, (void)ms;
    return KVQ_ERR_NO_DEVICE;
}
static inline kvq_status bench_cuda_fill_normal(float *x_dev, size_t n, uint64_t seed, float sigma)
{
    (void)x_dev, (void)n, (void)seed, (void)sigma;
    return KVQ_ERR_NO_DEVICE;
}
static inline kvq_status bench_cuda_profile(int on)
{
    (void)on;
    return KVQ_ERR_NO_DEVICE;
}
static inline kvq_status bench_cuda_touch(const void *dev, size_t bytes)
{
    (void)dev, (void)bytes;
    return KVQ_ERR_NO_DEVICE;
}

#endif

#ifdef __cplusplus
}
#endif
#endif /* KVQ_BENCH_CUDA_UTIL_H */
