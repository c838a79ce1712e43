/* cuda_prep.cuh - the pieces of query preparation shared by the prep kernel
 * (cuda_attn.cu) and the V4 fused kernel, which prepares its own queries
 * when the rotations allow it (cuda_attn_fast.cu): a warp's d = 128 query
 * in registers, and the V4 fragment block built from the prepared rows.
 * Both paths run this same code, so the query block is the same bits either
 * way. Private to kvq/cuda.
 */
#ifndef KVQ_CUDA_PREP_CUH
#define KVQ_CUDA_PREP_CUH

#include "cuda_internal.cuh"
#include "cuda_rot.cuh"

namespace kvq_cu {

/* ROT_WARP here means the d = 128 register transform (rot128_*). */
__host__ static inline rot_arg rot_arg_of(bool present, const kvq_dev_rot &r, const float *dense)
{
    rot_arg a;
    a.mode = !present ? ROT_NONE : rot128_ok(r) ? ROT_WARP : ROT_DENSE;
    a.fast = r;
    a.dense = dense;
    return a;
}

/* max(a, b), NaN if either is NaN (fmaxf drops NaNs). */
__device__ __forceinline__ float nan_max(float a, float b)
{
    return a > b || a != a ? a : b;
}

/* One query by one warp, rotations ROT_NONE or ROT_WARP only: v holds
 * elements 32 k + lane of the raw query (zeros for a padding query, live =
 * false, which stays zero), sgr / sgs the preloaded signs of rk / sk. Writes
 * c R q to qr_row, its QJL projection S c R q to sq_row (zeros without
 * QJL), and from lane 0 sigma = max |S c R q| (1 when 0), T = sum S c R q
 * and max |c R q| (NaN when the query has one). */
__device__ __forceinline__ void prep_query128(const float (&v_in)[4], bool live, float c, const rot_arg &rk,
                                              const float (&sgr)[kRot128Pre][4], const rot_arg &sk,
                                              const float (&sgs)[kRot128Pre][4], float *qr_row, float *sq_row,
                                              float *sig, float *tsum, float *qmax, int lane)
{
    float v[4], w[4];
#pragma unroll
    for (int k = 0; k < 4; k++)
        v[k] = v_in[k];
    if (rk.mode == ROT_WARP && live)
        rot128_apply(rk.fast, sgr, v, lane);
    float xm = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        v[k] *= c;
        qr_row[32 * k + lane] = v[k];
        xm = nan_max(xm, fabsf(v[k]));
        w[k] = sk.mode == ROT_WARP ? v[k] : 0.0f;
    }
    if (sk.mode == ROT_WARP && live)
        rot128_apply(sk.fast, sgs, w, lane);
    float mx = 0.0f, sum = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        sq_row[32 * k + lane] = w[k];
        mx = fmaxf(mx, fabsf(w[k]));
        sum += w[k];
    }
    for (int o = 16; o; o >>= 1) {
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        xm = nan_max(xm, __shfl_xor_sync(0xffffffffu, xm, o));
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
    if (lane == 0) {
        *sig = mx > 0.0f ? mx : 1.0f;
        *tsum = sum;
        *qmax = xm;
    }
}

/* The V4 query block (kvq_cuda_hooks.cuh, "integer tensor cores"): s8 B
 * fragments of mma.m16n8k32, column 2j + e of an n-tile = query j, e; per
 * k-block and lane a uint4 {tile 0 b0, b1, tile 1 b0, b1}. Codes (cf, 4096
 * bytes): the query in 24-bit fixed point, tile 0: (hq | 0), (mq | hq);
 * tile 1: (lq | mq), 0. Signs (sf, 2048 bytes; NULL without QJL): the QJL
 * query over sigma in 24-bit fixed point, divided by 2^p for sign bit p
 * (>= 17 bits left), tile 0: hi, mid; tile 1: lo, 0. blockDim = 128: thread
 * i builds items i, i + 128 of the codes and i of the signs; the per-query
 * constants (24 floats) go to cst. qr / sq rows 0..3 are read (G <= 4). */
__device__ inline void imma_fragments(const float (*qr)[128], const float (*sq)[128], const float *sig,
                                      const float *tsum, const float *qmax, int G, float inv_sk, uint8_t *cf_bytes,
                                      uint8_t *sf_bytes, float *cst)
{
    const int i = threadIdx.x;
    uint4 *cf = reinterpret_cast<uint4 *>(cf_bytes);
    for (int item = i; item < 256; item += 128) {
        const int kb = item >> 5, ln = item & 31, g = ln >> 2, t = ln & 3, j = g >> 1, e = g & 1;
        const float sc = qmax[j] > 0.0f ? 256.0f * (float)kFixMax / qmax[j] : 0.0f;
        uint32_t r[4] = {0, 0, 0, 0};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int hq, mq, lq;
            fix_split24(__float2int_rn(qr[j][islot_dim(kb, t, k)] * sc), &hq, &mq, &lq);
            const int sh = 8 * k;
            r[0] |= ((uint32_t)(e ? mq : hq) & 0xffu) << sh;
            r[1] |= ((uint32_t)(e ? hq : 0) & 0xffu) << sh;
            r[2] |= ((uint32_t)(e ? 0 : lq) & 0xffu) << sh;
            r[3] |= ((uint32_t)(e ? 0 : mq) & 0xffu) << sh;
        }
        cf[item] = make_uint4(r[0], r[1], r[2], r[3]);
    }
    if (sf_bytes) {
        const int kb = i >> 5, ln = i & 31, g = ln >> 2, t = ln & 3, j = g >> 1, e = g & 1;
        uint32_t r[4] = {0, 0, 0, 0};
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int p = 2 * kb + a; /* bit position of sign 32 t + 8 k + p in its byte */
                const float y = sq[j][32 * t + 8 * k + p] / sig[j] * (256.0f * (float)kFixMax / (float)(1 << p));
                int hi, mid, lo;
                fix_split24(__float2int_rn(y), &hi, &mid, &lo);
                r[a] |= ((uint32_t)(e ? mid : hi) & 0xffu) << (8 * k);
                r[2 + a] |= ((uint32_t)(e ? 0 : lo) & 0xffu) << (8 * k);
            }
        reinterpret_cast<uint4 *>(sf_bytes)[i] = make_uint4(r[0], r[1], r[2], r[3]);
    }
    if (i < 8) {
        cst[i] = i < G ? 2.0f * sig[i] / (256.0f * (float)kFixMax) : 0.0f;
        cst[8 + i] = i < G ? -tsum[i] : 0.0f;
        /* a NaN or Inf query element would otherwise vanish in the fixed-point
         * conversion; a NaN scale makes it reach the output, as on the other paths */
        cst[16 + i] = i >= G ? 0.0f : isfinite(qmax[i]) ? qmax[i] * inv_sk / (float)kFixMax : NAN;
    }
}

} /* namespace kvq_cu */

#endif /* KVQ_CUDA_PREP_CUH */
