/* cuda_device.cu - device discovery, memory helpers, the benchmark timer and
 * a deterministic random fill, so C callers never need the CUDA headers. */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_internal.cuh"
#include "kvq_rng.h"

kvq_status kvq_cuda_status_of(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return KVQ_OK;
    case cudaErrorMemoryAllocation:
        return KVQ_ERR_NOMEM;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
        return KVQ_ERR_NO_DEVICE;
    default:
        return KVQ_ERR_DEVICE;
    }
}

int kvq_cuda_device_count(void)
{
    static int count = -1;
    if (count < 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess)
            n = 0;
        (void)cudaGetLastError(); /* a failed probe must not poison later calls */
        count = n;
    }
    return count;
}

kvq_status kvq_cuda_require_device(void)
{
    return kvq_cuda_device_count() > 0 ? KVQ_OK : KVQ_ERR_NO_DEVICE;
}

kvq_status kvq_cuda_device_describe(char *name, size_t n)
{
    if (!name || n == 0)
        return KVQ_ERR_INVALID_ARG;
    name[0] = '\0';
    if (kvq_cuda_require_device() != KVQ_OK)
        return KVQ_ERR_NO_DEVICE;
    int dev = 0;
    cudaDeviceProp p;
    KVQ_CU_TRY(cudaGetDevice(&dev));
    KVQ_CU_TRY(cudaGetDeviceProperties(&p, dev));
    snprintf(name, n, "%s, %d SMs, %.1f GiB, sm_%d%d", p.name, p.multiProcessorCount,
             (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), p.major, p.minor);
    return KVQ_OK;
}

kvq_status kvq_cuda_malloc(void **dev, size_t bytes)
{
    if (!dev)
        return KVQ_ERR_INVALID_ARG;
    *dev = NULL;
    if (kvq_cuda_require_device() != KVQ_OK)
        return KVQ_ERR_NO_DEVICE;
    cudaError_t e = cudaMalloc(dev, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *dev = NULL;
        return kvq_cuda_status_of(e);
    }
    return KVQ_OK;
}

void kvq_cuda_free(void *dev)
{
    if (dev)
        (void)cudaFree(dev);
}

kvq_status kvq_cuda_memcpy_h2d(void *dev, const void *host, size_t bytes)
{
    if ((!dev || !host) && bytes)
        return KVQ_ERR_INVALID_ARG;
    KVQ_CU_TRY(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
    return KVQ_OK;
}

kvq_status kvq_cuda_memcpy_d2h(void *host, const void *dev, size_t bytes)
{
    if ((!dev || !host) && bytes)
        return KVQ_ERR_INVALID_ARG;
    KVQ_CU_TRY(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
    return KVQ_OK;
}

kvq_status kvq_cuda_memcpy_d2d(void *dst_dev, const void *src_dev, size_t bytes)
{
    if ((!dst_dev || !src_dev) && bytes)
        return KVQ_ERR_INVALID_ARG;
    KVQ_CU_TRY(cudaMemcpy(dst_dev, src_dev, bytes, cudaMemcpyDeviceToDevice));
    return KVQ_OK;
}

kvq_status kvq_cuda_memset(void *dev, int byte, size_t bytes)
{
    if (!dev && bytes)
        return KVQ_ERR_INVALID_ARG;
    KVQ_CU_TRY(cudaMemset(dev, byte, bytes));
    return KVQ_OK;
}

namespace {

/* 16-byte loads from every SM, folded into one word that is stored only
 * when sink is set (never, from kvq_cuda_touch) so the loads cannot be
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

} /* namespace */

kvq_status kvq_cuda_touch(const void *dev, size_t bytes)
{
    if (!dev && bytes)
        return KVQ_ERR_INVALID_ARG;
    if (kvq_cuda_require_device() != KVQ_OK)
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

kvq_status kvq_cuda_synchronize(void)
{
    if (kvq_cuda_require_device() != KVQ_OK)
        return KVQ_ERR_NO_DEVICE;
    KVQ_CU_TRY(cudaDeviceSynchronize());
    KVQ_CU_TRY(cudaGetLastError());
    return KVQ_OK;
}

namespace {

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

kvq_status kvq_cuda_fill_normal(float *x_dev, size_t n, uint64_t seed, float sigma)
{
    if (!x_dev && n)
        return KVQ_ERR_INVALID_ARG;
    if (kvq_cuda_require_device() != KVQ_OK)
        return KVQ_ERR_NO_DEVICE;
    if (n == 0)
        return KVQ_OK;
    size_t blocks = (n + 255) / 256;
    fill_normal_kernel<<<(unsigned)(blocks < 8192 ? blocks : 8192), 256>>>(x_dev, n, seed, sigma);
    KVQ_CU_TRY(cudaGetLastError());
    return KVQ_OK;
}

struct kvq_cuda_timer {
    cudaEvent_t a, b;
};

kvq_status kvq_cuda_timer_create(kvq_cuda_timer **out)
{
    if (!out)
        return KVQ_ERR_INVALID_ARG;
    *out = NULL;
    if (kvq_cuda_require_device() != KVQ_OK)
        return KVQ_ERR_NO_DEVICE;
    kvq_cuda_timer *t = (kvq_cuda_timer *)calloc(1, sizeof *t);
    if (!t)
        return KVQ_ERR_NOMEM;
    if (cudaEventCreate(&t->a) != cudaSuccess || cudaEventCreate(&t->b) != cudaSuccess) {
        free(t);
        return KVQ_ERR_DEVICE;
    }
    *out = t;
    return KVQ_OK;
}

void kvq_cuda_timer_free(kvq_cuda_timer *t)
{
    if (!t)
        return;
    (void)cudaEventDestroy(t->a);
    (void)cudaEventDestroy(t->b);
    free(t);
}

kvq_status kvq_cuda_timer_start(kvq_cuda_timer *t)
{
    if (!t)
        return KVQ_ERR_INVALID_ARG;
    KVQ_CU_TRY(cudaEventRecord(t->a, 0));
    return KVQ_OK;
}

kvq_status kvq_cuda_timer_stop(kvq_cuda_timer *t, double *ms)
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
