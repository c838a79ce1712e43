/* cuda_device.cu - device discovery and memory helpers, so C callers never
 * need the CUDA headers. */
#include <stdio.h>

#include "cuda_internal.cuh"

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

kvq_status kvq_cuda_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    if (!free_bytes || !total_bytes)
        return KVQ_ERR_INVALID_ARG;
    *free_bytes = *total_bytes = 0;
    if (kvq_cuda_require_device() != KVQ_OK)
        return KVQ_ERR_NO_DEVICE;
    KVQ_CU_TRY(cudaMemGetInfo(free_bytes, total_bytes));
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

kvq_status kvq_cuda_synchronize(void)
{
    if (kvq_cuda_require_device() != KVQ_OK)
        return KVQ_ERR_NO_DEVICE;
    KVQ_CU_TRY(cudaDeviceSynchronize());
    KVQ_CU_TRY(cudaGetLastError());
    return KVQ_OK;
}
