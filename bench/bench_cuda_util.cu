/* bench_cuda_util.cu - the benchmarks' GPU helpers (bench_cuda_util.h):
 * device-event timer, deterministic random fill, plain read. Compiled with
 * nvcc into the CUDA benchmark only, never into libkvq. */
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <stdlib.h>

#include "bench_cuda_util.h"
#include "cuda_internal.cuh" /* KVQ_CU_TRY, kvq_cuda_status_of: libkvq.a's, linked statically */
#include "kvq_cuda.h"
#include "kvq_rng.h"

namespace {

/* 16-byte loads from every SM, folded into one word that is stored only
 * when sink is set (never, from bench_cuda_touch) so the loads cannot be
 * dropped. The unaligned head and tail go byte by byte. */
__global__ void touch_kernel(const unsigned char *p, size_t bytes, unsigned *sink)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x, tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t head = (16 - ((uintptr_t)p & 15)) & 15, lead = head < bytes ? head : bytes;
    const size_t n16 = (bytes - lead) / 16;
    const uint4 *v = (const uint4 *)(p + lead);
    unsigned acc = 0;
    /* four loads per thread in flight before their values are used */
    for (size_t i = tid; i < n16; i += 4 * stride) {
        uint4 r[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            r[k] = i + k * stride < n16 ? v[i + k * stride] : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int k = 0; k < 4; k++)
            acc ^= r[k].x ^ r[k].y ^ r[k].z ^ r[k].w;
    }
    for (size_t i = tid; i < bytes - n16 * 16; i += stride)
        acc ^= p[i < lead ? i : n16 * 16 + i];
    if (sink)
        sink[tid] = acc;
}

/* Counter-based: element i depends only on (seed, i), whatever the launch shape. */
__global__ void fill_normal_kernel(float *x, size_t n, uint64_t seed, float sigma)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t st = seed ^ (i * 0x9e3779b97f4a7c15ull);
        uint64_t a = kvq_splitmix64(&st), b = kvq_splitmix64(&st);
        double u1 = ((double)(a >> 11) + 0.5) * (1.0 / 9007199254740992.0);
        double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);
        x[i] = sigma * (float)(sqrt(-2.0 * log(u1)) * cospi(2.0 * u2));
    }
}

} /* namespace */

kvq_status bench_cuda_touch(const void *dev, size_t bytes)
{
    if (!dev && bytes)
        return KVQ_ERR_INVALID_ARG;
    if (kvq_cuda_device_count() == 0)
        return KVQ_ERR_NO_DEVICE;
    if (bytes == 0)
        return KVQ_OK;
    int d = 0, n_sm = 0;
    KVQ_CU_TRY(cudaGetDevice(&d));
    KVQ_CU_TRY(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, d));
    /* enough 16-byte loads in flight to saturate HBM, no more blocks than the data needs */
    const size_t want = (bytes / 16 + 255) / 256, cap = (size_t)n_sm * 8;
    touch_kernel<<<(unsigned)(want < 1 ? 1 : want < cap ? want : cap), 256>>>((const unsigned char *)dev, bytes, NULL);
    KVQ_CU_TRY(cudaGetLastError());
    return KVQ_OK;
}

kvq_status bench_cuda_fill_normal(float *x_dev, size_t n, uint64_t seed, float sigma)
{
    if (!x_dev && n)
        return KVQ_ERR_INVALID_ARG;
    if (kvq_cuda_device_count() == 0)
        return KVQ_ERR_NO_DEVICE;
    if (n == 0)
        return KVQ_OK;
    size_t blocks = (n + 255) / 256;
    fill_normal_kernel<<<(unsigned)(blocks < 8192 ? blocks : 8192), 256>>>(x_dev, n, seed, sigma);
    KVQ_CU_TRY(cudaGetLastError());
    return KVQ_OK;
}

struct bench_cuda_timer {
    cudaEvent_t a, b;
};

kvq_status bench_cuda_timer_create(bench_cuda_timer **out)
{
    if (!out)
        return KVQ_ERR_INVALID_ARG;
    *out = NULL;
    if (kvq_cuda_device_count() == 0)
        return KVQ_ERR_NO_DEVICE;
    bench_cuda_timer *t = (bench_cuda_timer *)calloc(1, sizeof *t);
    if (!t)
        return KVQ_ERR_NOMEM;
    if (cudaEventCreate(&t->a) != cudaSuccess || cudaEventCreate(&t->b) != cudaSuccess) {
        free(t);
        return KVQ_ERR_DEVICE;
    }
    *out = t;
    return KVQ_OK;
}

void bench_cuda_timer_free(bench_cuda_timer *t)
{
    if (!t)
        return;
    (void)cudaEventDestroy(t->a);
    (void)cudaEventDestroy(t->b);
    free(t);
}

kvq_status bench_cuda_timer_start(bench_cuda_timer *t)
{
    if (!t)
        return KVQ_ERR_INVALID_ARG;
    KVQ_CU_TRY(cudaEventRecord(t->a, 0));
    return KVQ_OK;
}

kvq_status bench_cuda_timer_stop(bench_cuda_timer *t, double *ms)
{
    if (!t || !ms)
        return KVQ_ERR_INVALID_ARG;
    float f = 0.0f;
    KVQ_CU_TRY(cudaEventRecord(t->b, 0));
    KVQ_CU_TRY(cudaEventSynchronize(t->b));
    KVQ_CU_TRY(cudaEventElapsedTime(&f, t->a, t->b));
    *ms = (double)f;
    return KVQ_OK;
}

extern "C" kvq_status bench_cuda_profile(int on)
{
    return (on ? cudaProfilerStart() : cudaProfilerStop()) == cudaSuccess ? KVQ_OK : KVQ_ERR_DEVICE;
}
