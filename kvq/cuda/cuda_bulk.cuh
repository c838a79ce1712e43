/* cuda_bulk.cuh - the sm_90 bulk copy engine as the fused kernels use it: an
 * mbarrier per stage buffer, armed with the bytes it expects, and
 * cp.async.bulk copies from global memory that complete on it, flat
 * (bulk_copy) or as a box of a tensor map (tma_load_3d, the TMA unit). On
 * older architectures these compile to nothing; the kernels then copy with
 * plain loads (cuda_stage.cuh, seg_issue) or cp.async. Private to kvq/cuda.
 */
#ifndef KVQ_CUDA_BULK_CUH
#define KVQ_CUDA_BULK_CUH

#include <stdint.h>

#include "kvq_cuda_hooks.cuh" /* smem_u32 */

namespace kvq_cu {

/* `count` arrivals complete a phase, together with the bytes announced by
 * expect_tx; the default, one, is the issuing lane's expect_tx. */
__device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count = 1)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#else
    (void)bar, (void)count;
#endif
}

__device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
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

/* mbar_wait for a whole warp that waits together: the loop's branch is
 * marked uniform, which lets ptxas keep the warpgroup MMAs after it
 * pipelined (a per-thread loop makes it serialise them: C7513). */
__device__ __forceinline__ void mbar_wait_warp(uint64_t *bar, uint32_t parity)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 " @!p bra.uni WAIT_%=;\n}\n" ::"r"(smem_u32(bar)),
                 "r"(parity)
                 : "memory");
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

/* The box of a 3-D tensor map (a __grid_constant__ kernel parameter) at
 * element coordinates (x, y, z), x fastest, into shared memory at dst
 * (shared-window address), completing on bar. Elements outside the tensor,
 * negative coordinates included, arrive as zeros and count as bytes. */
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void *map, int x, int y, int z, uint64_t *bar)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
                 "l"(map), "r"(x), "r"(y), "r"(z), "r"(smem_u32(bar))
                 : "memory");
#else
    (void)dst, (void)map, (void)x, (void)y, (void)z, (void)bar;
#endif
}

} /* namespace kvq_cu */

#endif /* KVQ_CUDA_BULK_CUH */
