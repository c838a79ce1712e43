/* cuda_segment.cuh - the arithmetic of the fused kernel for one 16-token
 * segment of a stage: key scores, the online softmax, and the softmax weights
 * as the value MMA's B fragments. One function per way of scoring (M_IM, the
 * default; M_TR; M_ST for f16 keys and 5..8 query heads); the kernel
 * (cuda_attn_fast.cu) then accumulates the values. Fragment layouts are in
 * kvq_cuda_hooks.cuh. Private to kvq/cuda.
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
template <class L>
__device__ __forceinline__ void tr_segment(const kvq_cu_fast_params &p, const uint8_t *st, int jk, int js, int jn,
                                           int seg, int len, int lane, const uint4 *qa, const float *qc,
                                           float kappa, float &m_run, float &l_run, float &m_runb, float &l_runb,
                                           float (&acc)[8][4], uint32_t &pb0, uint32_t &pb1)
{
    const int g = lane >> 2, t = lane & 3;
    const int qx = 2 * (t & 1); /* this lane's two queries: qx, qx + 1 */
    /* 1. scores S[16 tokens][hi/lo query columns] = K Q^T: decode, then a
     * code and a sign MMA chain (see the note above) */
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
            acc[mb][0] *= al;
            acc[mb][1] *= alb;
            acc[mb][2] *= al;
            acc[mb][3] *= alb;
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
    pb0 = movm_trans(lo_half ? xw : hb);
    pb1 = movm_trans(lo_half ? lb : xw);
}

/* ST (first and second passes; any key type, up to 8 query heads): the
 * queries are the A operand (row r < 8 the hi part of query r, r + 8 its lo
 * part) and the decoded keys the B operand, S^T[query rows][16 tokens]; lane
 * (g, t) holds tokens 2t, 2t + 1 and 8 + 2t, 9 + 2t of query g. sig2 and tneg
 * are 2 sigma and -T of that query (tq3j). */
template <class L, int GP, int NT>
__device__ __forceinline__ void st_segment(const kvq_cu_fast_params &p, const uint8_t *st, int jk, int js, int jn,
                                           int seg, int len, int lane, const uint4 *qa, const uint4 *sa,
                                           float sig2, float tneg, float kappa, float &m_run, float &l_run,
                                           float (&acc)[NT][8][4], uint32_t (&pb0)[NT], uint32_t (&pb1)[NT])
{
    const int g = lane >> 2, t = lane & 3;
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

} /* namespace kvq_cu::fast */

#endif /* KVQ_CUDA_SEGMENT_CUH */
