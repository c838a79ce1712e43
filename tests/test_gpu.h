/* test_gpu.h - what the GPU tests share: the skip on a machine without a
 * CUDA device (CI has none) and the small mode of the compute-sanitizer
 * runs. */
#ifndef KVQ_TEST_GPU_H
#define KVQ_TEST_GPU_H

#include <stdlib.h>

#include "kvq_cuda.h"
#include "test.h"

/* Skips the calling test (SKIP returns from it) without a CUDA device. */
#define NEED_GPU()                                                                   \
    do {                                                                             \
        if (kvq_cuda_device_count() == 0)                                            \
            SKIP("no CUDA device (kvq_cuda_device_count() == 0): GPU test not run"); \
    } while (0)

/* KVQ_CUDA_TEST_SMALL=1: every path at a smaller size, for compute-sanitizer. */
static inline int test_gpu_small(void)
{
    const char *s = getenv("KVQ_CUDA_TEST_SMALL");
    return s && s[0] == '1';
}

#endif /* KVQ_TEST_GPU_H */
