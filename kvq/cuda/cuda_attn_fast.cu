/* cuda_attn_fast.cu - fused decode attention over packed pages, tensor cores.
 *
 * Grid (KV head, batch entry, split); 4 warps per block. The tokens of a
 * (sequence, KV head) are cut into 16-token segments (a segment never
 * crosses a page: page_tokens % 16 == 0) and the segments into n_splits
 * contiguous ranges, one per block (flash-decoding), shorter towards the
 * last splits when there is more than one wave of blocks (set_split_bounds).
 * Inside a block each warp owns every 4th segment and runs its own
 * pipeline: NST stage buffers in
 * shared memory, filled by the bulk copy engine (cp.async.bulk, completing
 * on an mbarrier): one copy per stage where the stage is a group of the
 * device page layout (kvq_layout.h; tq K and V), else one per section or
 * f16 row. So the warp never waits on a load it issued itself and no
 * block-wide barrier sits in the main loop.
 * For tq K and V on pages of a multiple of 32 tokens a stage holds S = 2
 * consecutive segments (one set of copies and one wait per 32 tokens, the
 * default); S = 1 is the first version (KVQ_CUDA_KERNEL_FAST_V1).
 *
 * Per segment a warp (kvq_cuda_hooks.cuh has the fragment layouts):
 *  1. decodes the 16 keys into B fragments and computes S^T = Q K^T with 16
 *     MMAs (and 16 more for the QJL sign sums of tq3j);
 *  2. turns scores into softmax weights with an online softmax kept per
 *     query row (the running max only rescales the accumulators when some
 *     lane's max grew);
 *  3. decodes the 16 values into f16 pairs that movmatrix turns into the A
 *     fragments of V^T (accum_values_tq3; f16 values: ldmatrix.trans from
 *     the stage) and accumulates O^T += V^T (p * n_v)^T with 8 MMAs (16 for
 *     5-8 query heads).
 * The queries enter pre-rotated, pre-scaled by scale * log2(e) and split
 * into f16 hi + lo rows (V4: fixed-point fragments) by the prep kernel, or,
 * for a V4 launch of one wave, by the block itself (PREP, cuda_prep.cuh);
 * the block merges its warps and writes an unnormalised partial (O, m, l)
 * that the finalize kernel combines across splits and rotates back.
 */
#include "cuda_internal.cuh"
#include "cuda_prep.cuh"

namespace kvq_cu {
/* ---- mbarrier + bulk copy (sm_90), with a plain-copy fallback ------------
 * (outside the anonymous namespace: the sm_80 pass does not use them) */

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

#ifdef KVQ_CU_MEASURE_TIMELINE
/* Measurement build only (make MEASURE=-DKVQ_CU_MEASURE_TIMELINE): every
 * block of the last fused launch records when it started, when it had its
 * queries (after waiting for the prep kernel), when its warp 0 had its first
 * stage, when its first warp left the main loop, when its warps had merged
 * and when it ended (%globaltimer, ns, low 56 bits) with its SM in the top
 * 8 bits of the last;
 * bench_cuda writes them out (KVQ_BENCH_TIMELINE), bench/cuda_timeline.py
 * sums them up. */
__device__ unsigned long long tl_rec[KVQ_CU_TIMELINE_MAX * KVQ_CU_TIMELINE_WORDS];
__device__ unsigned long long tl_n;
__device__ __forceinline__ unsigned long long tl_now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
extern "C" size_t kvq_cu_timeline_read(unsigned long long *dst, size_t max_blocks)
{
    unsigned long long n = 0;
    if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpyFromSymbol(&n, tl_n, sizeof n) != cudaSuccess)
        return 0;
    n = n < max_blocks ? n : max_blocks;
    n = n < KVQ_CU_TIMELINE_MAX ? n : KVQ_CU_TIMELINE_MAX;
    return cudaMemcpyFromSymbol(dst, tl_rec, n * KVQ_CU_TIMELINE_WORDS * sizeof *dst) == cudaSuccess ? (size_t)n : 0;
}
#endif

namespace {

using namespace kvq_cu;

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
#ifdef KVQ_CU_MEASURE_COMPUTEONLY
    /* measurement build: no copy; the stage barrier completes at once (an
     * arrival expecting no bytes) and the warp computes on the zeros its
     * stages were given (docs/cuda.md) */
    (void)src, (void)st;
    if (lane == 0)
        mbar_expect_tx(bar, 0u);
    __syncwarp();
    return;
#endif
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

/* 2^x with one MUFU (flushes denormal results to zero; ex2(-inf) = 0). */
__device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float2 half2_bits_to_float2(uint32_t u)
{
    __half2 h = *reinterpret_cast<__half2 *>(&u);
    return __half22float2(h);
}

/* How a kernel scores: M_ST, queries as the MMA's A operand (first and second
 * passes); M_TR, transposed f16 scores (below); M_IM, integer key scores
 * (im_segment). */
enum { M_ST = 0, M_TR = 1, M_IM = 2 };

/* {f16 hi, f16 lo} of x in one register (hi in the low half). */
__device__ __forceinline__ uint32_t hilo_f16x2(float x)
{
    const __half hx = __float2half_rn(x);
    const __half lx = __float2half_rn(x - __half2float(hx));
    return (uint32_t)__half_as_ushort(hx) | ((uint32_t)__half_as_ushort(lx) << 16);
}

/* The query fragments of the first kImKeep code k-blocks stay in registers
 * for the whole kernel instead of being read from shared memory per segment:
 * the shared-memory pipe is among the busiest (ncu: 76% of L1 wavefronts),
 * and two (8 registers, 121 in all) gained 2.4-2.9% at batch 32; four gained
 * the same, eight nothing (sixth pass in docs/cuda.md). */
constexpr int kImKeep = 2;

/* IM: how far (log2 units) the softmax reference stays above the largest
 * score seen. Every score that passes the reference costs a rescale of the
 * 32 accumulators (and a max reduction over the lanes); with headroom most
 * new maxima stay under it. The price: every weight is up to 2^-kHeadroom
 * smaller than with the exact max, i.e. that much nearer the f16 subnormal
 * range in the value MMA (docs/cuda.md, tenth pass). */
#ifndef KVQ_CU_HEADROOM
#define KVQ_CU_HEADROOM 3.0f
#endif
constexpr float kHeadroom = KVQ_CU_HEADROOM;

/* IM with in-kernel query prep: c R q and S c R q of 4 queries, then sigma,
 * T and max |c R q| of each (floats, after the barriers). */
constexpr size_t kPrepScratch = (2 * NW * 128 + 3 * NW) * sizeof(float);

/* IM (fifth pass, KVQ_CUDA_KERNEL_FAST_V4; tq keys, GP == 4): scores and
 * online softmax of one 16-token segment with the keys on integer tensor
 * cores (kvq_cuda_hooks.cuh, "integer tensor cores"; the prep kernel's
 * imma_fragments writes the query side). Per k-block of 4 codes per lane,
 * 4 PRMT give the hk/lk A fragment of tokens g and g + 8, and two s8 MMAs
 * (n-tiles 0 and 1) take it; the signs are 8 u8 MMAs on masked sign words.
 * Lane (g, t) then holds every term of query t for tokens g and g + 8, so
 * the scores need no exchange between lanes, and the weights as {hi, lo}
 * f16 pairs of query t are already row g of the [token][column] matrices
 * whose transposes (movmatrix) are the value MMA's B fragments; the value
 * accumulator's columns are (hi, lo) of queries 0..3. */
template <class L>
__device__ __forceinline__ void im_segment(const kvq_cu_fast_params &p, const uint8_t *st, int jk, int js, int jn,
                                           int seg, int len, int lane, const uint4 *qa,
                                           const uint4 (&qkeep)[kImKeep], const float *qc,
                                           float &m_run, float &l_run, float (&acc)[8][4], uint32_t &pb0,
                                           uint32_t &pb1)
{
    const int g = lane >> 2, t = lane & 3;
    int32_t ca[4], cb[4], sa[4], sb[4]; /* n-tiles 0, 1 of the codes and of the signs */
#pragma unroll
    for (int i = 0; i < 4; i++)
        ca[i] = cb[i] = sa[i] = sb[i] = (int32_t)kImmaBias;
    {
        uint32_t ksel[2][4], sw[2] = {0u, 0u};
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            const int row = g + 8 * nt;
            const uint32_t *w = reinterpret_cast<const uint32_t *>(st + L::k_codes + jk + row * 48 + t * 12);
            tq3_select32(w[0], w[1], w[2], ksel[nt]);
            if (L::qjl)
                sw[nt] = *reinterpret_cast<const uint32_t *>(st + L::k_signs + js + row * 16 + t * 4);
        }
        const tq3_ilut &T = p.ilut_k;
#pragma unroll
        for (int kb = 0; kb < 8; kb++) {
            const uint32_t s0 = ksel[0][kb >> 1] >> (16 * (kb & 1)), s1 = ksel[1][kb >> 1] >> (16 * (kb & 1));
            const uint4 a = make_uint4(prmt(T.hi0, T.hi1, s0), prmt(T.hi0, T.hi1, s1), prmt(T.lo0, T.lo1, s0),
                                       prmt(T.lo0, T.lo1, s1));
            const uint4 bq = kb < kImKeep ? qkeep[kb] : qa[kb * 32 + lane];
            mma16832_s8(ca, a, bq.x, bq.y);
            mma16832_s8(cb, a, bq.z, bq.w);
        }
        if (L::qjl) {
#pragma unroll
            for (int kb = 0; kb < 4; kb++) {
                const uint32_t m0 = 0x01010101u << (2 * kb), m1 = m0 << 1;
                const uint4 a = make_uint4(sw[0] & m0, sw[1] & m0, sw[0] & m1, sw[1] & m1);
                const uint4 bs = qa[256 + kb * 32 + lane];
                mma16832_s8<true>(sa, a, bs.x, bs.y);
                mma16832_s8<true>(sb, a, bs.z, bs.w);
            }
        }
    }
    const uint16_t *nkp = reinterpret_cast<const uint16_t *>(st + L::k_norm + jn);
    const uint16_t *rnp = reinterpret_cast<const uint16_t *>(st + L::k_rnorm + jn);
    const float fc = qc[16 + t];
    float s[2]; /* query t, tokens g and g + 8 */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int tk = g + 8 * r;
        /* sum Q C / 256 = (A 256 + B) 256 + C, then times 1 / (S_q S_k) */
        float x = fmaf(fmaf(imma_val(ca[2 * r]), 256.0f, imma_val(ca[2 * r + 1])), 256.0f, imma_val(cb[2 * r]));
        x *= fc;
        if (L::qjl) {
            /* 2 P = ((A 256 + B) 256 + C) 2 sigma / (256 kFixMax) */
            const float ps = fmaf(fmaf(imma_val(sa[2 * r]), 256.0f, imma_val(sa[2 * r + 1])), 256.0f, imma_val(sb[2 * r]));
            const float rk = __half2float(__ushort_as_half(rnp[tk])) * p.kappa;
            x = fmaf(rk, fmaf(ps, qc[t], qc[8 + t]), x);
        }
        s[r] = x * __half2float(__ushort_as_half(nkp[tk]));
        if (seg * 16 + 16 > len && seg * 16 + tk >= len) /* the last, partial segment */
            s[r] = -INFINITY;
    }

    /* online softmax (log2 domain). m_run is a reference kept kHeadroom
     * above the largest score seen, so the weights stay <= 1 and the
     * accumulators are rescaled only when a score passes the reference, not
     * whenever the max grows; the max is then reduced over the token lanes
     * (xor 4, 8, 16) */
    float mx = fmaxf(s[0], s[1]);
    if (__any_sync(0xffffffffu, mx > m_run)) {
#pragma unroll
        for (int o = 4; o < 32; o <<= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float m_new = fmaxf(m_run, mx + kHeadroom);
        const float al = m_new > m_run ? ex2(m_run - m_new) : 1.0f;
        l_run *= al;
#pragma unroll
        for (int mb = 0; mb < 8; mb++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[mb][i] *= al;
        m_run = m_new;
    }
    const float mu = m_run == -INFINITY ? 0.0f : m_run;
    float pw0 = ex2(s[0] - mu), pw1 = ex2(s[1] - mu);
    l_run += pw0 + pw1;
    if (!L::vf16) {
        const uint16_t *nvp = reinterpret_cast<const uint16_t *>(st + L::v_norm + jn);
        pw0 *= __half2float(__ushort_as_half(nvp[g]));
        pw1 *= __half2float(__ushort_as_half(nvp[g + 8]));
    }
    pb0 = movm_trans(hilo_f16x2(pw0));
    pb1 = movm_trans(hilo_f16x2(pw1));
}

/* The value table as four per-lane registers. Left to itself the compiler
 * keeps one of the four in a uniform register and copies it into a fresh
 * register before every lookup (the lookup's PRMT overwrites that operand):
 * 16 extra instructions per segment, ~4% of the loop. An opaque add of
 * laneid >> 5 (always 0) makes the values per-lane, so they stay in
 * registers for the whole loop (eighth pass: 1-2% faster at every shape). */
__device__ __forceinline__ void lane_reg(uint32_t &x)
{
    asm volatile("{\n\t.reg .u32 t;\n\tmov.u32 t, %%laneid;\n\tshr.u32 t, t, 5;\n\tadd.u32 %0, %0, t;\n\t}" : "+r"(x));
}

__device__ __forceinline__ tq3_lut lut_in_registers(const tq3_lut &T)
{
    tq3_lut r = T;
    lane_reg(r.lo0), lane_reg(r.lo1), lane_reg(r.hi0), lane_reg(r.hi1);
    return r;
}

/* TR (third pass, the default in the fourth; tq keys and GP == 4 only): the
 * scores come out as S = K Q^T, the decoded keys being the A operand (16
 * tokens x 16 slots; tq3_decode32's pairs of tokens g and g + 8 are exactly
 * its fragment) and the queries the B operand (8 columns: hi parts of
 * queries 0..3, then their lo parts). That is 8 code MMAs and 8 sign MMAs per
 * segment instead of 16 + 16, since no query rows are padding any more.
 * Lane (g, t) then holds tokens g and g + 8 for the columns 2t, 2t + 1, i.e.
 * queries 2 (t & 1) and 2 (t & 1) + 1, the hi part for t < 2 and the lo
 * part for t >= 2. Lanes t and t ^ 2 split the work instead of repeating
 * it: two shuffles (xor 2) give lane t < 2 the whole scores of token g and
 * lane t >= 2 those of token g + 8, so each lane runs the softmax of 2
 * scores, not 4. The queries are also the value accumulator's columns, so
 * the rescale needs no shuffles. The weights, split into hi and lo f16, are
 * exchanged once more (xor 2) to form two 8x8 [token][column] matrices
 * (tokens 0..7 and 8..15; lane (g, t) holds hi (t < 2) or lo (t >= 2)),
 * which one movmatrix each turns into the value MMA's B fragments. The
 * running max is reduced over the lanes only when some score beats it (a
 * vote), which after the first segments is rare. */
template <int KT, int VT, int GP, int S, int MODE = M_ST, bool PREP = false>
__global__ void __launch_bounds__(NW * 32, GP == 4 ? 4 : 3) fast_kernel(const __grid_constant__ kvq_cu_fast_params p)
{
    constexpr bool TR = MODE == M_TR, IM = MODE == M_IM;
    static_assert(MODE == M_ST || (GP == 4 && KT != KVQ_CU_KT_F16),
                  "transposed and integer scores: tq keys, <= 4 queries per KV head");
    static_assert(!PREP || MODE == M_IM, "in-kernel query prep: V4 only");
    using L = stage_layout<KT, VT, S>;
    constexpr int NST = L::nst;
    constexpr int NT = GP / 4; /* n-tiles of the value MMA: hi/lo columns */
    extern __shared__ __align__(128) uint8_t smem[];
    uint8_t *stages = smem;
    uint4 *qa = reinterpret_cast<uint4 *>(stages + NW * NST * L::bytes);
    uint4 *sa = qa + 256;
    float *qc = reinterpret_cast<float *>(reinterpret_cast<uint8_t *>(qa) + 4096 + (L::qjl ? 4096 : 0));
    uint64_t *bars = reinterpret_cast<uint64_t *>(qc + 32);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int h = blockIdx.x, b = blockIdx.y, split = blockIdx.z;
#ifdef KVQ_CU_MEASURE_TIMELINE
    const unsigned long long tl_t0 = tl_now();
    unsigned long long tl_tq = 0, tl_t1 = 0;
#endif
    const int len = p.len[b];
    const int nseg = (len + 16 * S - 1) / (16 * S); /* stage units of S segments */
    const int s0 = (int)(((uint64_t)nseg * p.split_at[split]) >> 16);
    const int s1 = (int)(((uint64_t)nseg * p.split_at[split + 1]) >> 16);

    /* barriers first, on their own: nothing else touches them until the
     * block barrier below has ordered their initialisation */
    if (tid < NW * NST)
        mbar_init(&bars[tid]);
    mbar_fence_init();
    /* PREP: warp w prepares query w itself from p.q (G <= 4 = NW). Its
     * global inputs are requested before the first pages, so that they do not
     * queue behind them. */
    float pq[4] = {0.f, 0.f, 0.f, 0.f}, sgr[kRot128Pre][4], sgs[kRot128Pre][4];
    if constexpr (PREP) {
        if (warp < p.G) {
            const float *qrow = p.q + ((size_t)b * p.Hq + (size_t)h * p.G + warp) * D;
#pragma unroll
            for (int k = 0; k < 4; k++)
                pq[k] = qrow[32 * k + lane];
        }
        if (p.rk.mode == ROT_WARP)
            rot128_load_signs(p.rk.fast, sgr, lane);
        if (p.sk.mode == ROT_WARP)
            rot128_load_signs(p.sk.fast, sgs, lane);
    }
    __syncthreads();
    /* query fragments of this (entry, head) into shared memory: before the
     * first page loads, except for TR and IM, which issue those first and only
     * then wait for the prep kernel (programmatic dependent launch) */
    auto load_queries = [&]() {
        const uint4 *src = reinterpret_cast<const uint4 *>(p.qfrag + ((size_t)b * p.H + h) * KVQ_CU_QFRAG_BYTES);
        const int n16 = IM ? (L::qjl ? 256 + 128 : 256) : L::qjl ? 512 : 256;
        if constexpr (TR) {
            /* B fragments (2 words per lane and k-block) from the A fragments:
             * column n < 4 is row n (hi) of lane (n, t), column n >= 4 row
             * n + 4 (lo) of lane (n - 4, t); codes at qa[0..255], signs after */
            uint2 *qb = reinterpret_cast<uint2 *>(qa);
            for (int i = tid; i < n16; i += NW * 32) {
                const int ln = i & 31, gg = ln >> 2;
                const uint4 v = src[(i & ~31) + ((gg & 3) << 2) + (ln & 3)];
                qb[i] = gg < 4 ? make_uint2(v.x, v.z) : make_uint2(v.y, v.w);
            }
        } else {
            for (int i = tid; i < n16; i += NW * 32)
                qa[i] = src[i];
        }
        if (tid < 24)
            qc[tid] = reinterpret_cast<const float *>(src + 512)[tid];
    };
    if constexpr (MODE == M_ST) {
        load_queries();
        __syncthreads();
    }

    uint8_t *my_stages = stages + warp * NST * L::bytes;
    uint64_t *my_bars = bars + warp * NST;
#ifdef KVQ_CU_MEASURE_COMPUTEONLY
    for (int i = lane; i < NST * L::bytes / 16; i += 32)
        reinterpret_cast<uint4 *>(my_stages)[i] = make_uint4(0u, 0u, 0u, 0u);
    __syncwarp();
#endif
    const int first = s0 + warp;
    const int nmine = first < s1 ? (s1 - first + NW - 1) / NW : 0;

    /* Segment first + k * NW goes to stage k % NST. Pages are tracked
     * incrementally (no division per segment), and the page-table entry for
     * the next issue is loaded one issue ahead so its latency stays hidden. */
    const copy_desc cd = make_copy_desc<KT, VT, S>(lane, p.pg, h);
    const uint32_t P = p.pg.page_tokens;
    /* index into the page tables of the next page to issue from */
    uint32_t iss_pt = (uint32_t)p.seq[b] * p.pg.max_pages_per_seq + (uint32_t)first * (16u * S) / P;
    uint32_t iss_slot = (uint32_t)first * (16u * S) % P;
    int32_t iss_page = nmine > 0 ? p.pg.ptab[iss_pt] : 0;
    auto advance = [&]() {
        iss_slot += 16u * S * NW;
        while (iss_slot >= P) {
            iss_slot -= P;
            iss_pt++;
        }
    };
    int issued = 0;
    auto issue_upto = [&](int upto) {
        for (; issued < upto && issued < nmine; issued++) {
            seg_issue<KT, VT, S>(p, cd, iss_page, iss_slot, my_stages + issued * L::bytes, &my_bars[issued], lane);
            advance();
            if (issued + 1 < nmine)
                iss_page = p.pg.ptab[iss_pt];
        }
    };
    /* PREP: one stage per warp before the queries are built, the rest after:
     * a smaller first burst of pages lets the query loads through sooner
     * (seventh pass: 1 x 32K 32.9 -> 31.2 us; 1 x 4K 13.9 -> 14.2) */
    issue_upto(PREP ? 1 : NST);

    /* TR: this lane's two queries are 2 (t & 1) and 2 (t & 1) + 1 */
    const int qx = TR ? 2 * (t & 1) : g & 7;
    if constexpr (MODE != M_ST) {
        if constexpr (PREP) {
            /* rows c R q and S c R q of the 4 queries, then the V4 block, as
             * the prep kernel builds them (the same code: cuda_prep.cuh), after
             * the first pages are requested: building them before requesting
             * any cost 0.6-2 us at 4K (seventh pass) */
            float(*pr)[D] = reinterpret_cast<float(*)[D]>(bars + NW * NST);
            float(*ps)[D] = pr + NW;
            float *psig = &ps[NW][0], *ptsum = psig + NW, *pmax = ptsum + NW;
            prep_query128(pq, warp < p.G, p.qscale, p.rk, sgr, p.sk, sgs, pr[warp], ps[warp], &psig[warp],
                          &ptsum[warp], &pmax[warp], lane);
            issue_upto(NST);
            __syncthreads();
            imma_fragments(pr, ps, psig, ptsum, pmax, p.G, p.inv_sk, reinterpret_cast<uint8_t *>(qa),
                           L::qjl ? reinterpret_cast<uint8_t *>(sa) : nullptr, qc);
        } else {
            kvq_cu_pdl_wait(); /* the prep kernel has written the query block */
            load_queries();
        }
        __syncthreads();
    }
#ifdef KVQ_CU_MEASURE_TIMELINE
    tl_tq = tl_now();
#endif
    const float sig2 = L::qjl && MODE == M_ST ? qc[qx] : 0.0f;
    const float tneg = L::qjl && MODE == M_ST ? qc[8 + qx] : 0.0f;
    const float kappa = p.kappa;
    uint4 qkeep[kImKeep]; /* IM: the first query fragments stay in registers */
#pragma unroll
    for (int i = 0; i < kImKeep; i++)
        qkeep[i] = IM ? qa[i * 32 + lane] : make_uint4(0u, 0u, 0u, 0u);

    float m_run = -INFINITY, l_run = 0.0f;
    float m_runb = -INFINITY, l_runb = 0.0f; /* TR: the second query */
    float acc[NT][8][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int mb = 0; mb < 8; mb++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[nt][mb][i] = 0.0f;

    const tq3_lut lut_v = lut_in_registers(p.lut_v);
    for (int k = 0; k < nmine; k++) {
        uint8_t *const st0 = my_stages + (k % NST) * L::bytes;
        mbar_wait(&my_bars[k % NST], (uint32_t)((k / NST) & 1));
#ifdef KVQ_CU_MEASURE_TIMELINE
        if (k == 0 && warp == 0)
            tl_t1 = tl_now();
#endif
#ifndef KVQ_CU_MEASURE_LOADONLY /* measurement build: the copies alone, no output (docs/cuda.md) */
#pragma unroll
      for (int j = 0; j < S; j++) {
        const int seg = (first + k * NW) * S + j;
        if (S > 1 && seg * 16 >= len)
            break; /* warp-uniform: the second half of the sequence's last unit is empty */
        /* st: this segment's view of the stage, section offsets shifted by j segments */
        const int jk = j * 768, js = j * 256, jn = j * 32;
        const uint8_t *st = st0;

        uint32_t pb0[NT], pb1[NT];
        if constexpr (IM) {
            im_segment<L>(p, st, jk, js, jn, seg, len, lane, qa, qkeep, qc, m_run, l_run, acc[0], pb0[0], pb1[0]);
        } else if constexpr (TR) {
            /* 1. scores S[16 tokens][hi/lo query columns] = K Q^T: decode, then a
             * code and a sign MMA chain (see the note above the kernel) */
            float sc[4] = {0.f, 0.f, 0.f, 0.f}, ss[4] = {0.f, 0.f, 0.f, 0.f};
            /* odd k-blocks into second accumulators: chains of 4 dependent MMAs
             * instead of 8 */
            float sc2[4] = {0.f, 0.f, 0.f, 0.f}, ss2[4] = {0.f, 0.f, 0.f, 0.f};
            {
                /* selectors and shifted sign words of tokens g, g + 8 first; the
                 * lookups of k-block kb right before its MMAs (fewer live registers
                 * than decoding both tokens completely first) */
                uint32_t ksel[2][4], sgn[2][4];
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    const int row = g + 8 * nt;
                    const uint32_t *w = reinterpret_cast<const uint32_t *>(st + L::k_codes + jk + row * 48 + t * 12);
                    tq3_select32(w[0], w[1], w[2], ksel[nt]);
                    if (L::qjl) { /* as qjl_bits32: pair r = sgn[r / 4] & (0x10001 << (11 + r % 4)) */
                        const uint32_t sw = *reinterpret_cast<const uint32_t *>(st + L::k_signs + js + row * 16 + t * 4);
                        sgn[nt][0] = sw << 11, sgn[nt][1] = sw << 7, sgn[nt][2] = sw << 3, sgn[nt][3] = sw >> 1;
                    }
                }
                const uint2 *qb = reinterpret_cast<const uint2 *>(qa);
#pragma unroll
                for (int kb = 0; kb < 8; kb++) {
                    /* A = {token g slots 2t.., token g+8 slots 2t.., g slots 2t+8.., g+8 slots 2t+8..} */
                    uint32_t k0a, k0b, k1a, k1b;
                    tq3_lookup4(ksel[0][kb >> 1] >> (16 * (kb & 1)), p.lut_k, &k0a, &k0b);
                    tq3_lookup4(ksel[1][kb >> 1] >> (16 * (kb & 1)), p.lut_k, &k1a, &k1b);
                    const uint2 bq = qb[kb * 32 + lane];
                    mma16816((kb & 1) ? sc2 : sc, make_uint4(k0a, k1a, k0b, k1b), bq.x, bq.y);
                    if (L::qjl) {
                        const uint32_t m0 = 0x00010001u << (11 + 2 * (kb & 1)), m1 = m0 << 1;
                        const uint32_t s0 = sgn[0][kb >> 1], s1 = sgn[1][kb >> 1];
                        const uint2 bs = qb[256 + kb * 32 + lane];
                        mma16816((kb & 1) ? ss2 : ss, make_uint4(s0 & m0, s1 & m0, s0 & m1, s1 & m1), bs.x, bs.y);
                    }
                }
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    sc[i] += sc2[i];
                    ss[i] += ss2[i];
                }
            }
            /* u[2 r + c]: this lane's part (hi or lo query half) of token g + 8 r,
             * query qx + c. Lanes t and t ^ 2 hold the two parts of the same
             * scores, so each finishes one token: t < 2 token g, t >= 2 token
             * g + 8 ("own"), and sends the partner the part of the other one. */
            const uint16_t *nkp = reinterpret_cast<const uint16_t *>(st + L::k_norm + jn);
            const uint16_t *rnp = reinterpret_cast<const uint16_t *>(st + L::k_rnorm + jn);
            /* (2 sigma, -T) of both queries, re-read per segment: four fewer
             * live registers, which is what keeps this variant spill-free */
            const float2 sg2 = L::qjl ? *reinterpret_cast<const float2 *>(qc + qx) : make_float2(0.f, 0.f);
            const float2 tng = L::qjl ? *reinterpret_cast<const float2 *>(qc + 8 + qx) : make_float2(0.f, 0.f);
            const bool lo_half = t >= 2;
            const int own = g + 8 * (t >> 1);
            float u[4];
            if (L::qjl) {
                const float rk0 = __half2float(__ushort_as_half(rnp[g])) * kappa;
                const float rk1 = __half2float(__ushort_as_half(rnp[g + 8])) * kappa;
                u[0] = fmaf(rk0 * sg2.x, ss[0], sc[0]);
                u[1] = fmaf(rk0 * sg2.y, ss[1], sc[1]);
                u[2] = fmaf(rk1 * sg2.x, ss[2], sc[2]);
                u[3] = fmaf(rk1 * sg2.y, ss[3], sc[3]);
            } else {
                u[0] = sc[0], u[1] = sc[1], u[2] = sc[2], u[3] = sc[3];
            }
            float s[2]; /* token own, queries qx and qx + 1 */
            {
                const float x0 = __shfl_xor_sync(0xffffffffu, lo_half ? u[0] : u[2], 2);
                const float x1 = __shfl_xor_sync(0xffffffffu, lo_half ? u[1] : u[3], 2);
                s[0] = (lo_half ? u[2] : u[0]) + x0;
                s[1] = (lo_half ? u[3] : u[1]) + x1;
                const float nk = __half2float(__ushort_as_half(nkp[own]));
                if (L::qjl) {
                    const float rk = __half2float(__ushort_as_half(rnp[own])) * kappa;
                    s[0] = fmaf(rk, tng.x, s[0]);
                    s[1] = fmaf(rk, tng.y, s[1]);
                }
                s[0] *= nk;
                s[1] *= nk;
            }
            if (seg * 16 + 16 > len && seg * 16 + own >= len) /* the last, partial segment */
                s[0] = s[1] = -INFINITY;

            /* 2. online softmax (log2 domain); the max is reduced over the token
             * lanes only when some score beats the running one */
            float mx = s[0], mxb = s[1];
            if (__any_sync(0xffffffffu, mx > m_run || mxb > m_runb)) {
#pragma unroll
                for (int o = 2; o < 32; o <<= 1) { /* lanes of the same queries: xor 2, 4, 8, 16 */
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                    mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, o));
                }
                const float m_new = fmaxf(m_run, mx), m_newb = fmaxf(m_runb, mxb);
                const float al = m_new > m_run ? ex2(m_run - m_new) : 1.0f;
                const float alb = m_newb > m_runb ? ex2(m_runb - m_newb) : 1.0f;
                l_run *= al;
                l_runb *= alb;
#pragma unroll
                for (int mb = 0; mb < 8; mb++) {
                    acc[0][mb][0] *= al;
                    acc[0][mb][1] *= alb;
                    acc[0][mb][2] *= al;
                    acc[0][mb][3] *= alb;
                }
                m_run = m_new;
                m_runb = m_newb;
            }
            const float mu = m_run == -INFINITY ? 0.0f : m_run, mub = m_runb == -INFINITY ? 0.0f : m_runb;
            float pw0 = ex2(s[0] - mu), pw1 = ex2(s[1] - mub);
            l_run += pw0;
            l_runb += pw1;
            if (!L::vf16) {
                const float nv = __half2float(__ushort_as_half(reinterpret_cast<const uint16_t *>(st + L::v_norm + jn)[own]));
                pw0 *= nv;
                pw1 *= nv;
            }
            /* [token][column] f16 matrices of tokens 0..7 (W0) and 8..15 (W1):
             * lane (g, t) holds columns 2t, 2t + 1, i.e. the hi (t < 2) or lo
             * (t >= 2) part of its queries, of token g in W0 and g + 8 in W1 */
            uint32_t hb, lb;
            split_f16x2(pw0, pw1, &hb, &lb);
            const uint32_t xw = __shfl_xor_sync(0xffffffffu, lo_half ? hb : lb, 2);
            pb0[0] = movm_trans(lo_half ? xw : hb);
            pb1[0] = movm_trans(lo_half ? lb : xw);
        } else {
            /* 1. scores S^T[query rows][16 tokens]: decode everything first, then
             * four independent MMA chains (codes and signs of both 8-token tiles)
             * that the scheduler can interleave */
            float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
            float ss[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
            {
                uint32_t kr[2][16], sr[2][16];
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    const int row = g + 8 * nt;
                    if (L::kf16) {
                        const uint8_t *r = st + row * FROW;
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            const int ch = 2 * t + (i & 1) + 8 * (i >> 1);
                            uint4 v = *reinterpret_cast<const uint4 *>(r + 16 * ch);
                            kr[nt][4 * i] = v.x, kr[nt][4 * i + 1] = v.y, kr[nt][4 * i + 2] = v.z, kr[nt][4 * i + 3] = v.w;
                        }
                    } else {
                        const uint32_t *w = reinterpret_cast<const uint32_t *>(st + L::k_codes + jk + row * 48 + t * 12);
                        tq3_decode32(w[0], w[1], w[2], p.lut_k, kr[nt]);
                    }
                    if (L::qjl)
                        qjl_bits32(*reinterpret_cast<const uint32_t *>(st + L::k_signs + js + row * 16 + t * 4), sr[nt]);
                }
#pragma unroll
                for (int kb = 0; kb < 8; kb++) {
                    const uint4 a = qa[kb * 32 + lane];
                    mma16816(sc[0], a, kr[0][2 * kb], kr[0][2 * kb + 1]);
                    mma16816(sc[1], a, kr[1][2 * kb], kr[1][2 * kb + 1]);
                    if (L::qjl) {
                        const uint4 b2 = sa[kb * 32 + lane];
                        mma16816(ss[0], b2, sr[0][2 * kb], sr[0][2 * kb + 1]);
                        mma16816(ss[1], b2, sr[1][2 * kb], sr[1][2 * kb + 1]);
                    }
                }
            }
            /* lane holds tokens 2t, 2t+1 (tile 0) and 8+2t, 9+2t (tile 1) of query g */
            float s[4];
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                float a0 = sc[nt][0] + sc[nt][2], a1 = sc[nt][1] + sc[nt][3];
                if (!L::kf16) {
                    const int tk = 8 * nt + 2 * t;
                    float2 nk = half2_bits_to_float2(*reinterpret_cast<const uint32_t *>(st + L::k_norm + jn + 2 * tk));
                    if (L::qjl) {
                        float2 rn = half2_bits_to_float2(*reinterpret_cast<const uint32_t *>(st + L::k_rnorm + jn + 2 * tk));
                        float p0 = fmaf(sig2, ss[nt][0] + ss[nt][2], tneg);
                        float p1 = fmaf(sig2, ss[nt][1] + ss[nt][3], tneg);
                        a0 = fmaf(rn.x * kappa, p0, a0);
                        a1 = fmaf(rn.y * kappa, p1, a1);
                    }
                    a0 *= nk.x;
                    a1 *= nk.y;
                }
                s[2 * nt] = a0;
                s[2 * nt + 1] = a1;
            }
            const int tok0 = seg * 16;
            if (tok0 + 16 > len) { /* the sequence's last, partial segment (warp-uniform) */
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int tk = tok0 + 8 * (i >> 1) + 2 * t + (i & 1);
                    if (tk >= len)
                        s[i] = -INFINITY;
                }
            }

            /* 2. online softmax (log2 domain) */
            float mx = fmaxf(fmaxf(s[0], s[1]), fmaxf(s[2], s[3]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m_run, mx);
            if (__any_sync(0xffffffffu, m_new > m_run)) {
                const float alpha = m_new > m_run ? ex2(m_run - m_new) : 1.0f;
                l_run *= alpha;
                float a0, a1;
                if (GP == 4) {
                    a0 = __shfl_sync(0xffffffffu, alpha, 4 * ((2 * t) & 3));
                    a1 = __shfl_sync(0xffffffffu, alpha, 4 * ((2 * t + 1) & 3));
                } else {
                    a0 = __shfl_sync(0xffffffffu, alpha, 8 * t);
                    a1 = __shfl_sync(0xffffffffu, alpha, 8 * t + 4);
                }
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int mb = 0; mb < 8; mb++) {
                        acc[nt][mb][0] *= a0;
                        acc[nt][mb][1] *= a1;
                        acc[nt][mb][2] *= a0;
                        acc[nt][mb][3] *= a1;
                    }
                m_run = m_new;
            }
            float pw[4];
            const float m_use = m_run == -INFINITY ? 0.0f : m_run; /* all of s are -inf then */
#pragma unroll
            for (int i = 0; i < 4; i++) {
                pw[i] = ex2(s[i] - m_use);
                l_run += pw[i];
            }
            if (!L::vf16) {
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    float2 nv = half2_bits_to_float2(*reinterpret_cast<const uint32_t *>(st + L::v_norm + jn + 2 * (8 * nt + 2 * t)));
                    pw[2 * nt] *= nv.x;
                    pw[2 * nt + 1] *= nv.y;
                }
            }
            uint32_t hb0, lb0, hb1, lb1;
            split_f16x2(pw[0], pw[1], &hb0, &lb0);
            split_f16x2(pw[2], pw[3], &hb1, &lb1);
            if (GP == 4) {
                const uint32_t x0 = __shfl_xor_sync(0xffffffffu, lb0, 16);
                const uint32_t x1 = __shfl_xor_sync(0xffffffffu, lb1, 16);
                pb0[0] = lane < 16 ? hb0 : x0;
                pb1[0] = lane < 16 ? hb1 : x1;
            } else {
                pb0[0] = hb0, pb1[0] = hb1;
                pb0[NT - 1] = lb0, pb1[NT - 1] = lb1;
            }
        }

        /* 3. values */
        if (L::vf16) {
            accum_values16_rows<NT>(acc, st + L::v_base, FROW, lane, pb0, pb1);
        } else {
            const uint32_t *w0 = reinterpret_cast<const uint32_t *>(st + L::v_codes + jk + g * 48 + t * 12);
            accum_values_tq3<NT>(acc, w0, w0 + 8 * 12, lut_v, pb0, pb1);
        }
        __syncwarp();
      }
#else
        __syncwarp();
#endif
        if (issued < nmine) {
            seg_issue<KT, VT, S>(p, cd, iss_page, iss_slot, st0, &my_bars[k % NST], lane);
            issued++;
            advance();
            if (issued < nmine)
                iss_page = p.pg.ptab[iss_pt];
        }
    }

#ifdef KVQ_CU_MEASURE_TIMELINE
    __shared__ unsigned long long tl_wend[NW];
    if (lane == 0)
        tl_wend[warp] = tl_now();
#endif
    if constexpr (MODE != M_ST)
        kvq_cu_pdl_trigger(); /* the merge kernel may start (it waits for this one to finish) */

    /* merge: warp state -> own stage area (all its copies have landed) */
    float *ws = reinterpret_cast<float *>(my_stages);
    if constexpr (IM) {
        /* lane (g, t): tokens g, g + 8 of query t */
        float la = l_run;
#pragma unroll
        for (int o = 4; o < 32; o <<= 1)
            la += __shfl_xor_sync(0xffffffffu, la, o);
        if (g == 0) {
            ws[t] = m_run;
            ws[8 + t] = la;
        }
    } else if constexpr (TR) {
        /* lane (g, t): token g + 8 (t >> 1) of queries qx, qx + 1 */
        float la = l_run, lb = l_runb;
#pragma unroll
        for (int o = 2; o < 32; o <<= 1) {
            la += __shfl_xor_sync(0xffffffffu, la, o);
            lb += __shfl_xor_sync(0xffffffffu, lb, o);
        }
        if (g == 0 && t < 2) {
            ws[qx] = m_run;
            ws[qx + 1] = m_runb;
            ws[8 + qx] = la;
            ws[8 + qx + 1] = lb;
        }
    } else {
        float l_sum = l_run + __shfl_xor_sync(0xffffffffu, l_run, 1);
        l_sum += __shfl_xor_sync(0xffffffffu, l_sum, 2);
        if (t == 0 && g < GP) {
            ws[g] = m_run;
            ws[8 + g] = l_sum;
        }
    }
    float *wo = ws + 16;
#pragma unroll
    for (int mb = 0; mb < 8; mb++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int slot = mb * 16 + g + 8 * (i >> 1);
            if (IM) { /* columns 2t, 2t + 1: hi and lo weights of query t */
                if ((i & 1) == 0)
                    wo[t * D + slot] = acc[0][mb][i] + acc[0][mb][i + 1];
            } else if (GP == 4) {
                const float o = acc[0][mb][i];
                const float other = __shfl_xor_sync(0xffffffffu, o, 2);
                if (t < 2)
                    wo[(2 * t + (i & 1)) * D + slot] = o + other;
            } else {
                wo[(2 * t + (i & 1)) * D + slot] = acc[0][mb][i] + acc[NT - 1][mb][i];
            }
        }
    __syncthreads();
#ifdef KVQ_CU_MEASURE_TIMELINE
    const unsigned long long tl_t2 = tl_now();
#endif

    const int G = p.G;
    float *part = p.part + (((size_t)b * p.H + h) * p.n_splits + split) * (size_t)G * (D + 2);
    for (int idx = tid; idx < G * D; idx += NW * 32) {
        const int q = idx / D, slot = idx % D;
        float M = -INFINITY;
        for (int w = 0; w < NW; w++)
            M = fmaxf(M, reinterpret_cast<const float *>(stages + w * NST * L::bytes)[q]);
        float o = 0.0f;
        if (M != -INFINITY)
            for (int w = 0; w < NW; w++) {
                const float *wsw = reinterpret_cast<const float *>(stages + w * NST * L::bytes);
                if (wsw[q] != -INFINITY)
                    o += wsw[16 + q * D + slot] * exp2f(wsw[q] - M);
            }
        part[q * D + slot] = o;
        if (slot == 0) {
            float l = 0.0f;
            if (M != -INFINITY)
                for (int w = 0; w < NW; w++) {
                    const float *wsw = reinterpret_cast<const float *>(stages + w * NST * L::bytes);
                    if (wsw[q] != -INFINITY)
                        l += wsw[8 + q] * exp2f(wsw[q] - M);
                }
            part[G * D + q] = M;
            part[G * D + G + q] = l;
        }
    }
#ifdef KVQ_CU_MEASURE_TIMELINE
    if (tid == 0) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        const unsigned long long lin = ((unsigned long long)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
        if (lin < KVQ_CU_TIMELINE_MAX) {
            unsigned long long *r = tl_rec + KVQ_CU_TIMELINE_WORDS * lin;
            unsigned long long w0 = tl_wend[0];
            for (int w = 1; w < NW; w++)
                w0 = tl_wend[w] < w0 ? tl_wend[w] : w0;
            r[0] = tl_t0;
            r[1] = tl_tq;
            r[2] = tl_t1;
            r[3] = w0;
            r[4] = tl_t2;
            r[5] = (tl_now() << 8 >> 8) | ((unsigned long long)smid << 56);
        }
        if (lin == 0)
            tl_n = (unsigned long long)gridDim.x * gridDim.y * gridDim.z;
    }
#endif
}

/* Both tuned on the H100 (docs/cuda.md, seventh pass: 0.7 and 3 waves
 * against 0.5 and 4, 0-5% faster from 32K up, five A/B rounds). */
#ifndef KVQ_CU_TAPER
#define KVQ_CU_TAPER 0.7
#endif
#ifndef KVQ_CU_WAVES
#define KVQ_CU_WAVES 3
#endif
/* Split boundaries (kvq_cu_fast_params.split_at). With more blocks than fit
 * at once, the splits shrink linearly from 1 + KVQ_CU_TAPER to
 * 1 - KVQ_CU_TAPER (1.7 to 0.3) times the mean, in the order the blocks
 * start: the blocks a slot runs last are then the short ones, and the slots
 * finish closer together (with equal splits the slots' last blocks start up
 * to one block time apart, and the call waits for the last; docs/cuda.md,
 * seventh pass). */
void set_split_bounds(kvq_cu_fast_params *p, int n, bool taper)
{
    const double a = taper && n > 1 ? KVQ_CU_TAPER : 0.0;
    double sum = 0.0;
    p->split_at[0] = 0;
    for (int s = 0; s < n; s++) {
        sum += 1.0 + (n > 1 ? a * (1.0 - 2.0 * s / (n - 1)) : 0.0);
        p->split_at[s + 1] = (uint32_t)(65536.0 * sum / n + 0.5);
    }
    p->split_at[n] = 65536u;
}

template <int KT, int VT, int GP, int S, int MODE = M_ST>
kvq_status launch_one(kvq_cu_fast_params *p, int n_batch, int n_splits, int max_splits, int n_sm,
                      cudaStream_t stream)
{
    static int configured = 0, occupancy = 1, configured_prep = 0;
    using L = stage_layout<KT, VT, S>;
    /* make_copy_desc fills a stage with one copy where the group size matches */
    if (stage_is_group<L>(p->pg.dl) && !group_matches_stage<L>(p->pg.dl))
        return KVQ_ERR_INTERNAL;
    const size_t smem = smem_bytes<KT, VT, S>();
    auto kern = fast_kernel<KT, VT, GP, S, MODE>;
    if (!configured) {
        KVQ_CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        int occ = 0;
        KVQ_CU_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, NW * 32, smem));
        occupancy = occ > 0 ? occ : 1;
        configured = 1;
    }
    int max_len = 1;
    for (int i = 0; i < n_batch; i++)
        max_len = p->len[i] > max_len ? p->len[i] : max_len;
    const int nseg = (max_len + 16 * S - 1) / (16 * S); /* stage units */
    const int pairs = n_batch * p->H;
    if (n_splits <= 0) {
        /* At least one wave of blocks (a partial second wave costs a whole
         * block time); where each block still gets >= 64 units of 16 S tokens,
         * up to KVQ_CU_WAVES (3) waves, which balance the SMs better (measured,
         * docs/cuda.md: batch 32 x 128K 2177 -> 2011 us with 4 before the
         * splits tapered; with the taper 3 is a little better, 2, 6 and 8 are
         * not); and at least 4 segments per warp so the pipeline gets going. */
        const int capacity = n_sm * occupancy;
        const int one_wave = pairs >= capacity ? 1 : capacity / pairs;
        const int waves = (KVQ_CU_WAVES * capacity + pairs - 1) / pairs;
        const int by_size = nseg / 64;
        n_splits = waves < by_size ? waves : by_size;
        if (n_splits < one_wave)
            n_splits = one_wave;
        const int by_work = nseg / (NW * 4 / S);
        if (n_splits > by_work)
            n_splits = by_work;
    }
    if (n_splits > nseg)
        n_splits = nseg;
    if (n_splits > max_splits)
        n_splits = max_splits;
    if (n_splits < 1)
        n_splits = 1;
    p->n_splits = n_splits;
    const bool one_wave = (long)pairs * n_splits <= (long)n_sm * occupancy;
    set_split_bounds(p, n_splits, !one_wave);
    /* V4 prepares its own queries only in a single wave: there it saves the
     * wait for the prep kernel, while later waves would each pay the query
     * latency under load (docs/cuda.md, seventh pass). A kernel of its own,
     * since the prep's registers and shared memory (kPrepScratch after the
     * barriers) cost the other launches ~3%. */
    const bool prep_here = MODE == M_IM && one_wave && p->q;
    if (!prep_here) {
        p->q = nullptr;
        if (p->prep) {
            const kvq_status st = p->prep(p->prep_ctx);
            if (st != KVQ_OK)
                return st;
        }
    }
    auto kern_prep = fast_kernel<KT, VT, GP, S, MODE, MODE == M_IM>;
    if (prep_here && !configured_prep) {
        KVQ_CU_TRY(cudaFuncSetAttribute(kern_prep, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)(smem + kPrepScratch)));
        configured_prep = 1;
    }
    /* split-major, so that blocks start in split order: the larger splits first */
    dim3 grid((unsigned)p->H, (unsigned)n_batch, (unsigned)n_splits);
    auto run = prep_here ? kern_prep : kern;
    const size_t run_smem = prep_here ? smem + kPrepScratch : smem;
    if (MODE != M_ST && p->pdl) {
        p->pdl_used = 1; /* the merge kernel may overlap this one's end */
        /* overlapping the kernel before only pays when that is the prep kernel */
        KVQ_CU_TRY(kvq_cu_launch(!prep_here, run, grid, dim3(NW * 32), run_smem, stream, *p));
    } else {
        run<<<grid, NW * 32, run_smem, stream>>>(*p);
    }
    KVQ_CU_TRY(cudaGetLastError());
    return KVQ_OK;
}

/* The TR / IM kernels for tq keys: 32-token stages with tq3 values on pages
 * of a multiple of 32 tokens, else 16-token stages. */
template <int MODE>
kvq_status launch_scored(kvq_cu_fast_params *p, int kt, int vt, bool s2, int n_batch, int n_splits, int max_splits,
                         int n_sm, cudaStream_t stream)
{
    constexpr int J = KVQ_CU_KT_TQ3J, K3 = KVQ_CU_KT_TQ3, V3 = KVQ_CU_VT_TQ3, VF = KVQ_CU_VT_F16;
    if (vt == V3 && s2)
        return kt == J ? launch_one<J, V3, 4, 2, MODE>(p, n_batch, n_splits, max_splits, n_sm, stream)
                       : launch_one<K3, V3, 4, 2, MODE>(p, n_batch, n_splits, max_splits, n_sm, stream);
    if (vt == V3)
        return kt == J ? launch_one<J, V3, 4, 1, MODE>(p, n_batch, n_splits, max_splits, n_sm, stream)
                       : launch_one<K3, V3, 4, 1, MODE>(p, n_batch, n_splits, max_splits, n_sm, stream);
    return kt == J ? launch_one<J, VF, 4, 1, MODE>(p, n_batch, n_splits, max_splits, n_sm, stream)
                   : launch_one<K3, VF, 4, 1, MODE>(p, n_batch, n_splits, max_splits, n_sm, stream);
}

} /* namespace */

kvq_status kvq_cu_fast_launch(kvq_cu_fast_params *p, int kt, int vt, int n_batch, int n_splits, int max_splits,
                              int n_sm, cudaStream_t stream)
{
    const int gp = p->G <= 4 ? 4 : 8;
    /* 32-token stages where a 32-token slice never crosses a page */
    const bool s2 = p->variant != 1 && p->pg.page_tokens % 32 == 0;
    /* transposed (variant 2) or integer (variant 3, the default) scores for
     * tq keys and <= 4 queries per KV head; elsewhere the second-pass kernel */
    if ((p->variant == 2 || p->variant == 3) && gp == 4 && kt != KVQ_CU_KT_F16) {
        if (p->variant == 3)
            return launch_scored<M_IM>(p, kt, vt, s2, n_batch, n_splits, max_splits, n_sm, stream);
        return launch_scored<M_TR>(p, kt, vt, s2, n_batch, n_splits, max_splits, n_sm, stream);
    }
#define KVQ_CU_CASE2(KT, VT)                                                                                 \
    if (kt == KT && vt == VT && s2)                                                                          \
        return gp == 4 ? launch_one<KT, VT, 4, 2>(p, n_batch, n_splits, max_splits, n_sm, stream)           \
                       : launch_one<KT, VT, 8, 2>(p, n_batch, n_splits, max_splits, n_sm, stream);
#define KVQ_CU_CASE(KT, VT)                                                                                  \
    if (kt == KT && vt == VT)                                                                                \
        return gp == 4 ? launch_one<KT, VT, 4, 1>(p, n_batch, n_splits, max_splits, n_sm, stream)           \
                       : launch_one<KT, VT, 8, 1>(p, n_batch, n_splits, max_splits, n_sm, stream);
    KVQ_CU_CASE2(KVQ_CU_KT_TQ3J, KVQ_CU_VT_TQ3)
    KVQ_CU_CASE2(KVQ_CU_KT_TQ3, KVQ_CU_VT_TQ3)
    KVQ_CU_CASE(KVQ_CU_KT_TQ3J, KVQ_CU_VT_TQ3)
    KVQ_CU_CASE(KVQ_CU_KT_TQ3, KVQ_CU_VT_TQ3)
    KVQ_CU_CASE(KVQ_CU_KT_F16, KVQ_CU_VT_F16)
    KVQ_CU_CASE(KVQ_CU_KT_TQ3J, KVQ_CU_VT_F16)
    KVQ_CU_CASE(KVQ_CU_KT_TQ3, KVQ_CU_VT_F16)
    KVQ_CU_CASE(KVQ_CU_KT_F16, KVQ_CU_VT_TQ3)
#undef KVQ_CU_CASE
#undef KVQ_CU_CASE2
    return KVQ_ERR_UNSUPPORTED;
}
