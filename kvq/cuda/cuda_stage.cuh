/* cuda_stage.cuh - the data side of the fused kernel's pipeline: what a
 * stage buffer holds (stage_layout), which bulk copy each lane issues to fill
 * one (copy_desc), and the issue itself (seg_issue). The arithmetic that
 * reads a stage is in cuda_segment.cuh, the kernel in cuda_attn_fast.cu.
 * Private to kvq/cuda.
 */
#ifndef KVQ_CUDA_STAGE_CUH
#define KVQ_CUDA_STAGE_CUH

#include "cuda_bulk.cuh"
#include "cuda_internal.cuh"

namespace kvq_cu::fast {

constexpr int NW = 4;      /* warps per block */
constexpr int D = 128;     /* head dim of the fused kernel */
constexpr int FROW = 272;  /* f16 row stride in a stage: 256 + 16 keeps ldmatrix/LDS conflict-free */

/* S = 16-token segments per stage (1, or 2 for tq K and V on pages of a
 * multiple of 32 tokens): one set of bulk copies and one barrier wait then
 * serve 32 tokens, which halves the per-token cost of the copy issue (the
 * bulk copy takes uniform operands, so each lane's copy is a serialised
 * round of a few instructions) and of the pipeline bookkeeping. */
template <int KT, int VT, int S = 1>
struct stage_layout {
    static constexpr bool kf16 = KT == KVQ_CU_KT_F16;
    static constexpr bool qjl = KT == KVQ_CU_KT_TQ3J;
    static constexpr bool vf16 = VT == KVQ_CU_VT_F16;
    /* tq sections in the order of a device page's group (kvq_layout.h), so
     * that a stage of a whole group is one copy */
    static constexpr int k_norm = 0;
    static constexpr int k_rnorm = 32 * S;
    static constexpr int k_codes = (qjl ? 64 : 32) * S;
    static constexpr int k_signs = k_codes + 768 * S;
    static constexpr int k_bytes = kf16 ? 16 * FROW : (qjl ? 1088 : 800) * S;
    static constexpr int v_base = k_bytes;
    static constexpr int v_norm = v_base;
    static constexpr int v_codes = vf16 ? v_base : v_base + 32 * S;
    static constexpr int v_bytes = vf16 ? 16 * FROW : 800 * S;
    static constexpr int bytes = k_bytes + v_bytes;
    static constexpr int nk = kf16 ? 16 : (qjl ? 4 : 2); /* bulk copies per segment, copied by section */
    static constexpr int nv = vf16 ? 16 : 2;
    static constexpr uint32_t tx = kf16 ? 16 * 256 : (qjl ? 1088 : 800) * S;
    static constexpr uint32_t txv = vf16 ? 16 * 256 : 800 * S;
    static constexpr int nst = (kf16 || vf16) ? 3 : 4 / S; /* stages per warp (same bytes for S = 2) */
    static constexpr uint32_t tokens = 16u * S;             /* per stage */
    static_assert(S == 1 || !(kf16 || vf16), "2-segment stages are for tq K and V only");
    static_assert(kf16 || vf16 || tx + txv == bytes, "a tq stage holds exactly the bytes of 16 S tokens");
};

/* Whether a stage of L is one group of the device layout dl, so that one
 * copy fills it (make_copy_desc). */
template <class L>
__host__ __device__ __forceinline__ bool stage_is_group(const kvq_dev_layout &dl)
{
    return !(L::kf16 || L::vf16) && dl.group_tokens == L::tokens;
}

/* Whether that group has the stage's bytes in the stage's places (host
 * side: launch_one checks it before the kernel relies on it). */
template <class L>
bool group_matches_stage(const kvq_dev_layout &dl)
{
    const kvq_head_layout &k = dl.k, &v = dl.v;
    return k.norm_off == (uint32_t)L::k_norm && k.codes_off == (uint32_t)L::k_codes &&
           k.bytes == (uint32_t)L::k_bytes &&
           (L::qjl ? k.rnorm_off == (uint32_t)L::k_rnorm && k.signs_off == (uint32_t)L::k_signs
                   : k.signs_off == KVQ_NO_SECTION) &&
           v.norm_off == (uint32_t)(L::v_norm - L::v_base) && v.codes_off == (uint32_t)(L::v_codes - L::v_base) &&
           v.bytes == (uint32_t)L::v_bytes;
}

template <int KT, int VT, int S>
constexpr size_t smem_bytes()
{
    using L = stage_layout<KT, VT, S>;
    return (size_t)NW * L::nst * L::bytes + 4096 + (L::qjl ? 4096 : 0) + 128 +
           NW * L::nst * 8;
}

/* The one bulk copy lane i issues for every stage. Where a stage is a whole
 * group of the device layout (tq K and V, 16 S = G tokens), lane 0 copies it
 * all at once; otherwise each lane copies one section (or f16 row) of the K
 * or V half of a group, 16 S tokens long. Lane-constant, so it is worked out
 * once per block; three registers. */
struct copy_desc {
    uint32_t off;       /* from the page start: head h, half, section */
    uint32_t stride;    /* bytes per token in the section */
    uint32_t dst_bytes; /* stage offset << 16 | bytes (0 bytes: lane issues nothing) */
};

template <int KT, int VT, int S>
__device__ __forceinline__ copy_desc make_copy_desc(int i, const kvq_dev_pages &pg, int h)
{
    using L = stage_layout<KT, VT, S>;
    const kvq_dev_layout &dl = pg.dl;
    copy_desc c;
    c.off = (uint32_t)h * dl.head_bytes;
    if (stage_is_group<L>(dl)) {
        c.stride = dl.row_bytes;
        c.dst_bytes = i == 0 ? (uint32_t)L::bytes : 0u;
        return c;
    }
    const bool isv = i >= L::nk;
    const kvq_head_layout &hl = isv ? dl.v : dl.k;
    const int j = isv ? i - L::nk : i;
    const bool f16 = isv ? L::vf16 : L::kf16;
    uint32_t src, stride, dst, bytes;
    if (f16) { /* one 256-byte row per lane, into a padded row */
        src = hl.codes_off + (uint32_t)j * 256u, stride = 256, dst = (isv ? L::v_base : 0) + j * FROW, bytes = 256;
    } else if (j == 0) {
        src = hl.codes_off, stride = 48, dst = isv ? L::v_codes : L::k_codes, bytes = 768 * S;
    } else if (j == 1) {
        src = hl.norm_off, stride = 2, dst = isv ? L::v_norm : L::k_norm, bytes = 32 * S;
    } else if (j == 2) {
        src = hl.signs_off, stride = 16, dst = L::k_signs, bytes = 256 * S;
    } else {
        src = hl.rnorm_off, stride = 2, dst = L::k_rnorm, bytes = 32 * S;
    }
    c.off += (isv ? dl.k.bytes : 0u) + src;
    c.stride = stride;
    c.dst_bytes = i < L::nk + L::nv ? (dst << 16) | bytes : 0u;
    return c;
}

/* Starts filling stage buffer st (barrier bar) with the segment at token
 * slot slot0 of pool page `page`. */
template <int KT, int VT, int S>
__device__ __forceinline__ void seg_issue(const kvq_cu_fast_params &p, const copy_desc &cd, int32_t page,
                                          uint32_t slot0, uint8_t *st, uint64_t *bar, int lane)
{
    using L = stage_layout<KT, VT, S>;
    /* token slot0 is token r of its group */
    const uint32_t r = slot0 & (p.pg.dl.group_tokens - 1u);
    const uint8_t *src = p.pg.pool + (uint64_t)page * p.pg.page_bytes + cd.off + (slot0 - r) * p.pg.dl.row_bytes +
                         r * cd.stride;
#if __CUDA_ARCH__ >= 900
    if (lane == 0)
        mbar_expect_tx(bar, L::tx + L::txv);
    __syncwarp();
    if (cd.dst_bytes)
        bulk_copy(st + (cd.dst_bytes >> 16), src, cd.dst_bytes & 0xffffu, bar);
#else
    (void)bar, (void)lane, (void)(L::tx + L::txv);
    /* sm_80: the warp copies its segment itself, section by section */
    for (int i = 0; i < 32; i++) {
        const uint8_t *s_i = (const uint8_t *)__shfl_sync(0xffffffffu, (unsigned long long)src, i);
        const uint32_t d_i = __shfl_sync(0xffffffffu, cd.dst_bytes >> 16, i);
        const uint32_t n_i = __shfl_sync(0xffffffffu, cd.dst_bytes & 0xffffu, i);
        for (uint32_t o = 16u * (uint32_t)(threadIdx.x & 31); o < n_i; o += 512u)
            *reinterpret_cast<uint4 *>(st + d_i + o) = *reinterpret_cast<const uint4 *>(s_i + o);
    }
    __syncwarp();
#endif
}

} /* namespace kvq_cu::fast */

#endif /* KVQ_CUDA_STAGE_CUH */
