/* cuda_prefill_tile.cuh - the prefill kernel's key tiles (cuda_prefill.cu):
 * how a tile of packed rows becomes f16 rows in shared memory, the shared
 * memory a block holds, and the output rotation. C++ (nvcc) only; private
 * to cuda_prefill.cu, whose file comment describes the kernel.
 */
#ifndef KVQ_CUDA_PREFILL_TILE_CUH
#define KVQ_CUDA_PREFILL_TILE_CUH

#include "cuda_internal.cuh"
#include "cuda_rot.cuh"

namespace {

using namespace kvq_cu;

constexpr int kMinRows = 64; /* query rows per block (16 per warp): at least */
constexpr int kKeys = 64; /* keys per tile */

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi)
{
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

/* The QJL half of 32 coordinates: +-gam as f16 pairs, a clear sign bit
 * flipping the f16 sign bit of its half. */
__device__ __forceinline__ void qjl_pairs(float gam, uint32_t bits, uint32_t out[16])
{
    const uint32_t pos = pack_f16x2(gam, gam), neg = ~bits;
#pragma unroll
    for (int c = 0; c < 32; c += 2)
        out[c / 2] = pos ^ (((neg >> c) & 1u) << 15) ^ (((neg >> (c + 1)) & 1u) << 31);
}

/* The raw bytes of coordinates [j0, j0 + 32) of a row (PIPE): 3 words of
 * 3-bit codes (tq) or 16 words of f16 values; then their f16 pairs. */
__device__ __forceinline__ void raw_load(const kvq_row &r, bool tq, int j0, uint32_t w[16])
{
    if (tq) {
        const uint32_t *c = reinterpret_cast<const uint32_t *>(r.codes + 12 * (j0 >> 5));
        w[0] = c[0], w[1] = c[1], w[2] = c[2];
        return;
    }
    const uint4 *c = reinterpret_cast<const uint4 *>(r.codes + 2 * j0);
#pragma unroll
    for (int i = 0; i < 4; i++)
        *reinterpret_cast<uint4 *>(&w[4 * i]) = c[i];
}

__device__ __forceinline__ void raw_expand(bool tq, const uint32_t w[16], const tq3_lut &lut, uint32_t out[16])
{
    if (tq) {
        tq3_decode32(w[0], w[1], w[2], lut, out);
        return;
    }
#pragma unroll
    for (int i = 0; i < 16; i++)
        out[i] = w[i];
}

/* Elements [j0, j0 + 32) of a packed row into dst (f16): for tq types the
 * scaled levels cent[idx] (alpha c, ~exact in f16 up to 4 bits: the row's
 * norm / alpha is applied in f32 outside, *scale), and into dst_s for QJL
 * keys alpha |r| kappa sign, for the wider codebooks' keys what f16 lost of
 * each level (kvq_prefill_split_k); other types their elements (*scale = 1).
 * 3-bit codes go through lut (the same levels as f16 bytes), others through
 * cent, in shared memory: a kernel parameter indexed by code would
 * serialise the warp. */
/* Whether the chunk kernel gives keys of codec k a second half (its QJL
 * layout, KD = 2D): the QJL signs, or what f16 rounding takes from each
 * element, for codebooks over 4 bits (up to 4.5e-4 relative for 8 bits,
 * where codebook_alpha's search brings 3 bits to 2.6e-5 and 4 bits to
 * 9.6e-5) and llama.cpp's blocks (level times scale), scored against the
 * queries' f16 rows. */
__host__ __device__ __forceinline__ bool kvq_prefill_split_k(const kvq_dev_codec &k)
{
    return k.qjl || (k.rotated && k.levels > KVQ_CUDA_TQ_MAX_LEVELS) || kvq_layout_block_bytes(k.base) > 0;
}

/* v0, v1 as f16 into hi[0, 1] and, where lo is given, what that rounding
 * lost into lo[0, 1]. */
__device__ __forceinline__ void put_pair(__half *hi, __half *lo, float v0, float v1)
{
    const __half h0 = __float2half_rn(v0), h1 = __float2half_rn(v1);
    *reinterpret_cast<__half2 *>(hi) = __halves2half2(h0, h1);
    if (lo)
        *reinterpret_cast<uint32_t *>(lo) = pack_f16x2(v0 - __half2float(h0), v1 - __half2float(h1));
}

template <int D>
__device__ __forceinline__ void decode32(const kvq_dev_codec &cd, const float *cent, const tq3_lut &lut, float alpha,
                                         const kvq_row &r, int j0, __half *dst, __half *dst_s, float *scale)
{
    if (cd.rotated) {
        if (j0 == 0)
            *scale = kvq_f16_to_f32(*r.norm) / alpha;
        if (cd.bits == 3) { /* the fused kernel's PRMT lookup: one per code */
            const uint32_t *w = reinterpret_cast<const uint32_t *>(r.codes + 12 * (j0 >> 5));
            uint32_t pr[16];
            tq3_decode32(w[0], w[1], w[2], lut, pr);
            uint4 *o = reinterpret_cast<uint4 *>(dst);
#pragma unroll
            for (int i = 0; i < 4; i++)
                o[i] = make_uint4(pr[4 * i], pr[4 * i + 1], pr[4 * i + 2], pr[4 * i + 3]);
        } else {
            const bool split = dst_s && !cd.qjl; /* kvq_prefill_split_k: the levels' hi and lo halves */
#pragma unroll 4
            for (int c = 0; c < 32; c += 2)
                put_pair(dst + c, split ? dst_s + c : nullptr, cent[code_get(r.codes, cd.bits, D, j0 + c)],
                         cent[code_get(r.codes, cd.bits, D, j0 + c + 1)]);
            if (split)
                return;
        }
        if (dst_s) {
            const float gam = alpha * kvq_f16_to_f32(*r.rnorm) * cd.kappa;
            const uint8_t *sg = r.signs + (j0 >> 3);
            const uint32_t bits = (uint32_t)sg[0] | ((uint32_t)sg[1] << 8) | ((uint32_t)sg[2] << 16) |
                                  ((uint32_t)sg[3] << 24);
            uint32_t pr[16];
            qjl_pairs(gam, bits, pr);
            uint4 *o = reinterpret_cast<uint4 *>(dst_s);
#pragma unroll
            for (int i = 0; i < 4; i++)
                o[i] = make_uint4(pr[4 * i], pr[4 * i + 1], pr[4 * i + 2], pr[4 * i + 3]);
        }
        return;
    }
    if (j0 == 0)
        *scale = 1.0f;
    if (cd.type == KVQ_TYPE_F16) {
        const uint4 *src = reinterpret_cast<const uint4 *>(r.codes + 2 * j0);
        uint4 *o = reinterpret_cast<uint4 *>(dst);
#pragma unroll
        for (int i = 0; i < 4; i++)
            o[i] = src[i];
        return;
    }
#pragma unroll 4
    for (int c = 0; c < 32; c += 2) /* dst_s: a split key's lo halves */
        put_pair(dst + c, dst_s ? dst_s + c : nullptr, baseline_elem(cd.type, r.codes, j0 + c),
                 baseline_elem(cd.type, r.codes, j0 + c + 1));
}

/* x = R^T y in place for HADAMARD / IDENTITY, one warp (warp_rotate's
 * rounds undone in reverse: each is (mix or scale) o FWHT o signs, and the
 * FWHT is symmetric); tmp: d floats. @return the buffer holding x. */
__device__ __forceinline__ float *warp_rotate_t(const kvq_dev_rot &R, float *v, float *tmp, int lane)
{
    const int d = R.dim;
    if (R.kind == KVQ_ROT_IDENTITY)
        return v;
    float *cur = v, *other = tmp;
    for (int k = R.rounds - 1; k >= 0; k--) {
        if (R.m == 1) {
            for (int j = lane; j < d; j += 32)
                cur[j] *= R.scale;
        } else {
            for (int o = lane; o < d; o += 32) {
                const int l = o / R.p, c = o % R.p;
                float acc = 0.0f;
                for (int i = 0; i < R.m; i++)
                    acc = fmaf(R.mix[i * R.m + l], cur[i * R.p + c], acc);
                other[o] = acc;
            }
            float *t = cur;
            cur = other;
            other = t;
        }
        __syncwarp();
        warp_fwht_rows(cur, d, R.m == 1 ? d : R.p, lane);
        const float *sg = R.signs + (size_t)k * d;
        for (int j = lane; j < d; j += 32)
            cur[j] *= sg[j];
        __syncwarp();
    }
    return cur;
}

/* One thread's share of a key tile in flight (PIPE): the raw bytes of
 * 32 coordinates of one key's K and V row (3-bit codes: 3 words; f16: 16),
 * loaded one tile ahead and expanded into shared memory a tile later. */
struct raw_unit {
    uint32_t k[16], v[16];
    uint32_t ks;              /* QJL sign bits */
    uint16_t kn, kr, vn;      /* f16 norms: K, K residual, V */
    bool ok;
};

template <int D, bool QJL, bool PIPE = false>
struct tile_layout {
    /* 8 warps (128 query rows: each key tile's decode serves twice the rows
     * of 4: 1.2x the rate at 32K on an H200), 4 where 8 would not fit the
     * shared memory */
    static constexpr int warps = D >= 256 ? 4 : 8;
    static constexpr int rows = 16 * warps;
    static constexpr int KD = QJL ? 2 * D : D;
    static constexpr int ks = KD + 8; /* row strides in halves: 16-byte rows, conflict-free fragments */
    static constexpr int ls = D + 8;
    static constexpr int vs = D + 8;
    static constexpr size_t q_bytes = (size_t)rows * ks * 2;
    static constexpr size_t qlo_bytes = (size_t)rows * ls * 2;
    static constexpr size_t k_bytes = (size_t)kKeys * ks * 2;
    static constexpr size_t v_bytes = (size_t)kKeys * vs * 2;
    static constexpr size_t scratch_bytes = (size_t)warps * 2 * D * 4;
    /* + per key: page, slot, K and V scales; two codebooks (up to 8 bits) */
    static constexpr int bufs = PIPE ? 2 : 1; /* key/value tile buffers */
    static constexpr size_t bytes =
        q_bytes + qlo_bytes + bufs * (k_bytes + v_bytes) + scratch_bytes + kKeys * (16 + 8 * bufs) + 2 * KVQ_CUDA_LEVELS_CAP * 4;
    static_assert((size_t)rows * D * 4 <= q_bytes + qlo_bytes, "the output staging fits the query rows");
};

} /* namespace */

#endif /* KVQ_CUDA_PREFILL_TILE_CUH */
