/* cuda_rot.cuh - seeded rotations applied by one warp, bit-identical to
 * kvq_rotation_apply_ref / _apply_t_ref for HADAMARD and IDENTITY (the
 * contract in rotation_internal.h):
 *  - warp_rotate: any dim, in shared memory (the encoder, which must match
 *    the CPU bit for bit);
 *  - rot128_load_signs, then rot128_apply / rot128_apply_t: d = 128 in
 *    registers with shuffles (the attention's query preparation and output
 *    rotation: at batch 1 a dense d x d product run by a handful of blocks
 *    was a latency chain of ~10 us).
 * Every float operation is an explicit _rn intrinsic, so no compiler flag
 * can contract or reorder them. Private to kvq/cuda.
 */
#ifndef KVQ_CUDA_ROT_CUH
#define KVQ_CUDA_ROT_CUH

#include "cuda_internal.cuh"

namespace kvq_cu {

/* 1 when warp_rotate implements r exactly. */
__host__ __device__ static inline bool rot_on_gpu(const kvq_dev_rot &r)
{
    return r.kind == KVQ_ROT_IDENTITY || (r.kind == KVQ_ROT_HADAMARD && r.signs);
}

/* 1 when rot128_apply / rot128_apply_t (registers, d = 128) implement r. */
__host__ __device__ static inline bool rot128_ok(const kvq_dev_rot &r)
{
    return r.kind == KVQ_ROT_IDENTITY || (r.kind == KVQ_ROT_HADAMARD && r.signs && r.dim == 128 && r.m == 1);
}

/* Unnormalised FWHT of the m rows of length p held in v (d = m p floats). */
static __device__ __forceinline__ void warp_fwht_rows(float *v, int d, int p, int lane)
{
    const int half = p / 2;
    for (int h = 1; h < p; h <<= 1) {
        for (int b = lane; b < d / 2; b += 32) {
            int i = b / half, bb = b % half;
            int j = i * p + (bb / h) * 2 * h + (bb % h);
            float a = v[j], c = v[j + h];
            v[j] = __fadd_rn(a, c);
            v[j + h] = __fsub_rn(a, c);
        }
        __syncwarp();
    }
}

/* y = R x in place for HADAMARD / IDENTITY (v holds x; tmp is scratch of d
 * floats). @return the buffer holding y. */
static __device__ __forceinline__ float *warp_rotate(const kvq_dev_rot &R, float *v, float *tmp, int lane)
{
    const int d = R.dim;
    if (R.kind == KVQ_ROT_IDENTITY)
        return v;
    if (R.m == 1) { /* each round: signs, FWHT, scale (the QJL S uses several) */
        for (int k = 0; k < R.rounds; k++) {
            const float *sg = R.signs + (size_t)k * d;
            for (int j = lane; j < d; j += 32)
                v[j] = __fmul_rn(v[j], sg[j]);
            __syncwarp();
            warp_fwht_rows(v, d, d, lane);
            for (int j = lane; j < d; j += 32)
                v[j] = __fmul_rn(v[j], R.scale);
            __syncwarp();
        }
        return v;
    }
    float *cur = v, *other = tmp;
    for (int k = 0; k < R.rounds; k++) {
        const float *sg = R.signs + (size_t)k * d;
        for (int j = lane; j < d; j += 32)
            cur[j] = __fmul_rn(cur[j], sg[j]);
        __syncwarp();
        warp_fwht_rows(cur, d, R.p, lane);
        for (int o = lane; o < d; o += 32) {
            int i = o / R.p, c = o % R.p;
            float acc = 0.0f;
            for (int l = 0; l < R.m; l++)
                acc = __fmaf_rn(R.mix[i * R.m + l], cur[l * R.p + c], acc);
            other[o] = acc;
        }
        __syncwarp();
        float *t = cur;
        cur = other;
        other = t;
    }
    return cur;
}

/* ---- d = 128 in registers: lane holds v[k] = x[lane + 32 k] ------------ */

/* The same butterflies as warp_fwht_rows(v, 128, 128) in the same stage
 * order, with shuffles instead of shared memory: bit-identical. */
static __device__ __forceinline__ void fwht128_reg(float v[4], int lane)
{
#pragma unroll
    for (int h = 1; h < 32; h <<= 1) {
        const bool upper = (lane & h) != 0; /* holds x[j + h]: a - b = partner - mine */
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float o = __shfl_xor_sync(0xffffffffu, v[k], h);
            v[k] = upper ? __fsub_rn(o, v[k]) : __fadd_rn(v[k], o);
        }
    }
    float a0 = v[0], a1 = v[1], a2 = v[2], a3 = v[3]; /* h = 32: k pairs (0,1), (2,3) */
    v[0] = __fadd_rn(a0, a1), v[1] = __fsub_rn(a0, a1), v[2] = __fadd_rn(a2, a3), v[3] = __fsub_rn(a2, a3);
    a0 = v[0], a1 = v[1], a2 = v[2], a3 = v[3]; /* h = 64: k pairs (0,2), (1,3) */
    v[0] = __fadd_rn(a0, a2), v[2] = __fsub_rn(a0, a2), v[1] = __fadd_rn(a1, a3), v[3] = __fsub_rn(a1, a3);
}

/* The signs of the first kRot128Pre rounds are loaded before any
 * arithmetic: one memory latency instead of one per round (the QJL
 * projection has three rounds, and at batch 1 the tables come from DRAM). */
constexpr int kRot128Pre = 4;

static __device__ __forceinline__ void rot128_load_signs(const kvq_dev_rot &R, float sg[kRot128Pre][4], int lane)
{
#pragma unroll
    for (int r = 0; r < kRot128Pre; r++)
#pragma unroll
        for (int k = 0; k < 4; k++)
            sg[r][k] = r < R.rounds && R.kind != KVQ_ROT_IDENTITY ? R.signs[r * 128 + 32 * k + lane] : 1.0f;
}

/* y = R x for d = 128 (HADAMARD with m == 1, or IDENTITY), sg from
 * rot128_load_signs: callers at batch 1 load them before their other
 * inputs arrive, so the tables' DRAM latency overlaps. */
static __device__ __forceinline__ void rot128_apply(const kvq_dev_rot &R, const float sg[kRot128Pre][4], float v[4],
                                                    int lane)
{
    if (R.kind == KVQ_ROT_IDENTITY)
        return;
#pragma unroll
    for (int r = 0; r < kRot128Pre; r++) {
        if (r >= R.rounds)
            break;
#pragma unroll
        for (int k = 0; k < 4; k++)
            v[k] = __fmul_rn(v[k], sg[r][k]);
        fwht128_reg(v, lane);
#pragma unroll
        for (int k = 0; k < 4; k++)
            v[k] = __fmul_rn(v[k], R.scale);
    }
    for (int r = kRot128Pre; r < R.rounds; r++) {
#pragma unroll
        for (int k = 0; k < 4; k++)
            v[k] = __fmul_rn(v[k], R.signs[r * 128 + 32 * k + lane]);
        fwht128_reg(v, lane);
#pragma unroll
        for (int k = 0; k < 4; k++)
            v[k] = __fmul_rn(v[k], R.scale);
    }
}

/* x = R^T y for d = 128, sg as for rot128_apply. */
static __device__ __forceinline__ void rot128_apply_t(const kvq_dev_rot &R, const float sg[kRot128Pre][4], float v[4],
                                                      int lane)
{
    if (R.kind == KVQ_ROT_IDENTITY)
        return;
    for (int r = R.rounds - 1; r >= kRot128Pre; r--) {
        fwht128_reg(v, lane);
#pragma unroll
        for (int k = 0; k < 4; k++)
            v[k] = __fmul_rn(__fmul_rn(v[k], R.scale), R.signs[r * 128 + 32 * k + lane]);
    }
#pragma unroll
    for (int r = kRot128Pre - 1; r >= 0; r--) {
        if (r >= R.rounds)
            continue;
        fwht128_reg(v, lane);
#pragma unroll
        for (int k = 0; k < 4; k++)
            v[k] = __fmul_rn(__fmul_rn(v[k], R.scale), sg[r][k]);
    }
}

} /* namespace kvq_cu */

#endif /* KVQ_CUDA_ROT_CUH */
