/* cuda_bulk.cuh - the sm_90 bulk copy engine as the fused kernel uses it: an
 * mbarrier per stage buffer, armed with the bytes it expects, and
 * cp.async.bulk copies from global memory that complete on it. On older
 * architectures these compile to nothing; the kernel then copies with plain
 * loads (cuda_stage.cuh, seg_issue). Private to kvq/cuda.
 */
#ifndef KVQ_CUDA_BULK_CUH
#define KVQ_CUDA_BULK_CUH

#include <stdint.h>

#include "kvq_cuda_hooks.cuh" /* smem_u32 */

namespace kvq_cu {

/* One arrival (the issuing lane's expect_tx) completes a phase, together with
 * the bytes that lane announced. */
__device__ __forceinline__ void mbar_init(uint64_t *bar)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(bar)) : "memory");
#else
    (void)bar;
#endif
}

__device__ __forceinline__ void mbar_fence_init()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
#else
    (void)bar, (void)bytes;
#endif
}

__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity)
{
#if __CUDA_ARCH__ >= 900
    uint32_t ok = 0;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(ok)
                     : "r"(smem_u32(bar)), "r"(parity)
                     : "memory");
    } while (!ok);
#else
    (void)bar, (void)parity;
#endif
}

__device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t bytes, uint64_t *bar)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
#else
    (void)dst, (void)src, (void)bytes, (void)bar;
#endif
}

} /* namespace kvq_cu */

#endif /* KVQ_CUDA_BULK_CUH */
