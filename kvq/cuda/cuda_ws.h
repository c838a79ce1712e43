/* cuda_ws.h - where the dense prefill path's scratch lives inside its one
 * allocation: one definition for kvq_cuda_prefill_ws_create
 * (cuda_prefill_dense.cu) and for kvq_cuda_prefill_ws_bytes, which plans
 * and budgets call without a device (cuda_plan.c). Private to kvq/cuda.
 */
#ifndef KVQ_CUDA_WS_H
#define KVQ_CUDA_WS_H

#include <stddef.h>

/* Sections: K and V of the segment [seg][H][D] f16, the chunk's K and V
 * rows [rows][H][D] f16, the queries [rows][Hq][D] f16, the outputs
 * [rows][Hq][D] f32, the rows' (max, sum) [rows][Hq][2] f32; each on a
 * 256-byte boundary. Fills off[7]; @return the total bytes. */
static inline size_t kvq_cu_ws_layout(size_t H, size_t Hq, size_t D, size_t rows, size_t seg, size_t off[7])
{
    const size_t sz[7] = {seg * H * D * 2, seg * H * D * 2, rows * H * D * 2, rows * H * D * 2,
                          rows * Hq * D * 2, rows * Hq * D * 4, rows * Hq * 2 * 4};
    size_t at = 0;
    for (int i = 0; i < 7; i++) {
        off[i] = at;
        at += (sz[i] + 255) & ~(size_t)255;
    }
    return at;
}

#endif /* KVQ_CUDA_WS_H */
