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
 *
 * This file holds the kernel and its launch. The stage buffers and their
 * copies are in cuda_stage.cuh (on cuda_bulk.cuh), steps 1-2 of a segment in
 * cuda_segment.cuh, the decode hooks of step 3 in kvq_cuda_hooks.cuh.
 */
#include "cuda_internal.cuh"
#include "cuda_prep.cuh"
#include "cuda_segment.cuh"

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
using namespace kvq_cu::fast;

/* IM with in-kernel query prep: c R q and S c R q of 4 queries, then sigma,
 * T and max |c R q| of each (floats, after the barriers). */
constexpr size_t kPrepScratch = (2 * NW * 128 + 3 * NW) * sizeof(float);

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
            tr_segment<L>(p, st, jk, js, jn, seg, len, lane, qa, qc, kappa, m_run, l_run, m_runb, l_runb, acc[0],
                          pb0[0], pb1[0]);
        } else {
            st_segment<L, GP, NT>(p, st, jk, js, jn, seg, len, lane, qa, sa, sig2, tneg, kappa, m_run, l_run, acc, pb0,
                                  pb1);
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
