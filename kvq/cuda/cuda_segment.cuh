/* cuda_segment.cuh - the arithmetic of the fused kernel for one 16-token
 * segment of a stage: key scores, the online softmax, and the softmax weights
 * as the value MMA's B fragments. One function per way of scoring (M_IM,
 * integer key scores for tq keys and <= 4 query heads per KV head; M_ST, f16
 * scores for f16 keys and 5..8 query heads); the kernel (cuda_attn_fast.cu)
 * then accumulates the values. Fragment layouts are in kvq_cuda_hooks.cuh.
 * Private to kvq/cuda.
 */
#ifndef KVQ_CUDA_SEGMENT_CUH
#define KVQ_CUDA_SEGMENT_CUH

#include "cuda_stage.cuh"

namespace kvq_cu::fast {

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

/* How a kernel scores: M_ST, f16 scores with the queries as the MMA's A
 * operand (st_segment); M_IM, integer key scores (im_segment). M_IM keeps the
 * value 2 it had when a third mode existed, so that the kernels' names (the
 * mangled fast_kernelILi0ELi0ELi4ELi2ELi2E... that ncu filters on in
 * docs/history/attention-cuda.md) stay the same. */
enum { M_ST = 0, M_IM = 2 };

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
 * the same, eight nothing (sixth pass in docs/history/attention-cuda.md). */
constexpr int kImKeep = 2;

/* IM: how far (log2 units) the softmax reference stays above the largest
 * score seen. Every score that passes the reference costs a rescale of the
 * 32 accumulators (and a max reduction over the lanes); with headroom most
 * new maxima stay under it. The price: every weight is up to 2^-kHeadroom
 * smaller than with the exact max, i.e. that much nearer the f16 subnormal
 * range in the value MMA (docs/history/attention-cuda.md, tenth pass). */
constexpr float kHeadroom = 3.0f;

/* Key centering: the page of 16-token segment seg, by a shift where the
 * page holds a power of two of segments (a division costs ~20 instructions
 * a segment). */
__device__ __forceinline__ size_t gain_page(const kvq_cu_fast_params &p, int seg)
{
    return p.gain_shift >= 0 ? (size_t)(seg >> p.gain_shift) : (size_t)(seg * 16) / p.pg.page_tokens;
}

/* IM (fifth pass, "V4" in docs/history/attention-cuda.md; tq keys, GP == 4): scores and
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
                                           int seg, int lo, int len, int lane, const uint4 *qa,
                                           const uint4 (&qkeep)[kImKeep], const float *qc,
                                           float &m_run, float &l_run, float (&acc)[8][4], uint32_t &pb0,
                                           uint32_t &pb1)
{
    const int g = lane >> 2, t = lane & 3;
    /* key centering: the page's q.m~ for query t (a segment never crosses a
     * page), loaded first so that its latency hides behind the MMAs */
    const float gq = p.gain && t < p.G ? p.gain[((size_t)blockIdx.y * p.Hq + (size_t)blockIdx.x * p.G + t) *
                                                    p.gain_stride +
                                                gain_page(p, seg)]
                                       : 0.0f;
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
        s[r] += gq;
        if (seg * 16 + 16 > len && seg * 16 + tk >= len) /* the last, partial segment */
            s[r] = -INFINITY;
        if (seg * 16 < lo && seg * 16 + tk < lo) /* the first, partial segment of a range */
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

/* ST (first and second passes; f16 keys, or 5..8 query heads): the
 * queries are the A operand (row r < 8 the hi part of query r, r + 8 its lo
 * part) and the decoded keys the B operand, S^T[query rows][16 tokens]; lane
 * (g, t) holds tokens 2t, 2t + 1 and 8 + 2t, 9 + 2t of query g. sig2 and tneg
 * are 2 sigma and -T of that query (tq3j). */
template <class L, int GP, int NT>
__device__ __forceinline__ void st_segment(const kvq_cu_fast_params &p, const uint8_t *st, int jk, int js, int jn,
                                           int seg, int lo, int len, int lane, const uint4 *qa, const uint4 *sa,
                                           float sig2, float tneg, float kappa, float &m_run, float &l_run,
                                           float (&acc)[NT][8][4], uint32_t (&pb0)[NT], uint32_t (&pb1)[NT])
{
    const int g = lane >> 2, t = lane & 3;
    /* key centering: the page's q.m~ for query g, loaded first (see im_segment) */
    const float gq = p.gain && g < p.G ? p.gain[((size_t)blockIdx.y * p.Hq + (size_t)blockIdx.x * p.G + g) *
                                                    p.gain_stride +
                                                gain_page(p, seg)]
                                       : 0.0f;
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
#pragma unroll
    for (int i = 0; i < 4; i++)
        s[i] += gq;
    if (tok0 + 16 > len || tok0 < lo) { /* a range's last or first, partial segment (warp-uniform) */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int tk = tok0 + 8 * (i >> 1) + 2 * t + (i & 1);
            if (tk >= len || tk < lo)
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

} /* namespace kvq_cu::fast */

#endif /* KVQ_CUDA_SEGMENT_CUH */
