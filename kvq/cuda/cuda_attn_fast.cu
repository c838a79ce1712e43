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
 * default page); on other pages S = 1.
 *
 * Per segment a warp (kvq_cuda_hooks.cuh has the fragment layouts):
 *  1. scores the 16 keys (cuda_segment.cuh), one of two ways:
 *     - MODE = M_IM, integer key scores (tq keys, <= 4 query heads per KV
 *       head; "V4" in docs/history/attention-cuda.md): fixed-point centroids
 *       looked up as s8 A fragments, s8/u8 mma.m16n8k32 against the queries
 *       in 24-bit fixed point;
 *     - MODE = M_ST, f16 scores (f16 keys, or 5..8 query heads): the keys
 *       decoded into B fragments, S^T = Q K^T with 16 MMAs (and 16 more for
 *       the QJL sign sums of tq3j);
 *  2. turns scores into softmax weights with an online softmax kept per
 *     query (the accumulators are rescaled only when the running max, or
 *     for M_IM a reference kept above it, is passed);
 *  3. decodes the 16 values into f16 pairs that movmatrix turns into the A
 *     fragments of V^T (accum_values_tq3; f16 values: ldmatrix.trans from
 *     the stage) and accumulates O^T += V^T (p * n_v)^T with 8 MMAs (16 for
 *     5-8 query heads).
 * The queries enter pre-rotated, pre-scaled by scale * log2(e) and split
 * into f16 hi + lo rows (M_IM: fixed-point fragments) by the prep kernel,
 * or, for an M_IM launch of one wave, by the block itself (PREP,
 * cuda_prep.cuh); the block merges its warps and writes an unnormalised
 * partial (O, m, l) that the finalize kernel combines across splits and
 * rotates back. docs/attention-cuda.md describes the kernel as a whole.
 *
 * This file holds the kernel and its launch. The stage buffers and their
 * copies are in cuda_stage.cuh (on cuda_bulk.cuh), steps 1-2 of a segment in
 * cuda_segment.cuh, the decode hooks of step 3 in kvq_cuda_hooks.cuh.
 */
#include "cuda_internal.cuh"
#include "cuda_prep.cuh"
#include "cuda_segment.cuh"

namespace {

using namespace kvq_cu;
using namespace kvq_cu::fast;

/* IM with in-kernel query prep: c R q and S c R q of 4 queries, then sigma,
 * T and max |c R q| of each (floats, after the barriers). */
constexpr size_t kPrepScratch = (2 * NW * 128 + 3 * NW) * sizeof(float);

template <int KT, int VT, int GP, int S, int MODE = M_ST, bool PREP = false>
__global__ void __launch_bounds__(NW * 32, GP == 4 ? 4 : 3) fast_kernel(const __grid_constant__ kvq_cu_fast_params p)
{
    constexpr bool IM = MODE == M_IM;
    static_assert(MODE == M_ST || (GP == 4 && KT != KVQ_CU_KT_F16),
                  "integer scores: tq keys, <= 4 queries per KV head");
    static_assert(!PREP || IM, "in-kernel query prep: integer scores only");
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
    /* the entry's tokens [lo, len): its stage units [u0, u1) go to the splits */
    const int len = p.len[b], lo = p.lo[b];
    const int u0 = lo / (16 * S), u1 = len > lo ? (len + 16 * S - 1) / (16 * S) : u0;
    const int s0 = u0 + (int)(((uint64_t)(u1 - u0) * p.split_at[split]) >> 16);
    const int s1 = u0 + (int)(((uint64_t)(u1 - u0) * p.split_at[split + 1]) >> 16);

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
     * first page loads, except for IM, which issues those first and only
     * then waits for the prep kernel (programmatic dependent launch) */
    auto load_queries = [&]() {
        const uint4 *src = reinterpret_cast<const uint4 *>(p.qfrag + ((size_t)b * p.H + h) * KVQ_CU_QFRAG_BYTES);
        const int n16 = IM ? (L::qjl ? 256 + 128 : 256) : L::qjl ? 512 : 256;
        for (int i = tid; i < n16; i += NW * 32)
            qa[i] = src[i];
        if (tid < 24)
            qc[tid] = reinterpret_cast<const float *>(src + 512)[tid];
    };
    if constexpr (MODE == M_ST) {
        load_queries();
        __syncthreads();
    }

    uint8_t *my_stages = stages + warp * NST * L::bytes;
    uint64_t *my_bars = bars + warp * NST;
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

    const int qx = g & 7; /* ST: this lane's query */
    if constexpr (IM) {
        if constexpr (PREP) {
            /* rows c R q and S c R q of the 4 queries, then the IM block, as
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
    const float sig2 = L::qjl && MODE == M_ST ? qc[qx] : 0.0f;
    const float tneg = L::qjl && MODE == M_ST ? qc[8 + qx] : 0.0f;
    const float kappa = p.kappa;
    uint4 qkeep[kImKeep]; /* IM: the first query fragments stay in registers */
#pragma unroll
    for (int i = 0; i < kImKeep; i++)
        qkeep[i] = IM ? qa[i * 32 + lane] : make_uint4(0u, 0u, 0u, 0u);

    float m_run = -INFINITY, l_run = 0.0f;
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
#pragma unroll
      for (int j = 0; j < S; j++) {
        const int seg = (first + k * NW) * S + j;
        if (S > 1 && seg * 16 >= len)
            break; /* warp-uniform: the second half of the sequence's last unit is empty */
        if (S > 1 && seg * 16 + 16 <= lo)
            continue; /* warp-uniform: the first half of the range's first unit is before it */
        /* st: this segment's view of the stage, section offsets shifted by j segments */
        const int jk = j * 768, js = j * 256, jn = j * 32;
        const uint8_t *st = st0;

        uint32_t pb0[NT], pb1[NT];
        if constexpr (IM) {
            im_segment<L>(p, st, jk, js, jn, seg, lo, len, lane, qa, qkeep, qc, m_run, l_run, acc[0], pb0[0], pb1[0]);
        } else {
            st_segment<L, GP, NT>(p, st, jk, js, jn, seg, lo, len, lane, qa, sa, sig2, tneg, kappa, m_run, l_run, acc, pb0,
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
        if (issued < nmine) {
            seg_issue<KT, VT, S>(p, cd, iss_page, iss_slot, st0, &my_bars[k % NST], lane);
            issued++;
            advance();
            if (issued < nmine)
                iss_page = p.pg.ptab[iss_pt];
        }
    }

    if constexpr (IM)
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
}

/* Both tuned on the H100 (docs/history/attention-cuda.md, seventh pass: 0.7
 * and 3 waves against 0.5 and 4, 0-5% faster from 32K up, five A/B rounds). */
constexpr double kTaper = 0.7;
constexpr int kWaves = 3;
/* Split boundaries (kvq_cu_fast_params.split_at). With more blocks than fit
 * at once, the splits shrink linearly from 1 + kTaper to 1 - kTaper (1.7 to
 * 0.3) times the mean, in the order the blocks start: the blocks a slot runs
 * last are then the short ones, and the slots finish closer together (with
 * equal splits the slots' last blocks start up to one block time apart, and
 * the call waits for the last; docs/history/attention-cuda.md, seventh
 * pass). */
void set_split_bounds(kvq_cu_fast_params *p, int n, bool taper)
{
    const double a = taper && n > 1 ? kTaper : 0.0;
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
        max_len = p->len[i] - p->lo[i] > max_len ? p->len[i] - p->lo[i] : max_len;
    const int nseg = (max_len + 16 * S - 1) / (16 * S); /* stage units */
    const int pairs = n_batch * p->H;
    if (n_splits <= 0) {
        /* At least one wave of blocks (a partial second wave costs a whole
         * block time); where each block still gets >= 64 units of 16 S tokens,
         * up to kWaves (3) waves, which balance the SMs better (measured,
         * docs/history/attention-cuda.md: batch 32 x 128K 2177 -> 2011 us
         * with 4 before the splits tapered; with the taper 3 is a little
         * better, 2, 6 and 8 are not); and at least 4 segments per warp so
         * the pipeline gets going. */
        const int capacity = n_sm * occupancy;
        const int one_wave = pairs >= capacity ? 1 : capacity / pairs;
        const int waves = (kWaves * capacity + pairs - 1) / pairs;
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
    /* IM prepares its own queries only in a single wave: there it saves the
     * wait for the prep kernel, while later waves would each pay the query
     * latency under load (docs/history/attention-cuda.md, seventh pass). A
     * kernel of its own,
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
        return kvq_cu_launch(p->step, !prep_here, run, grid, dim3(NW * 32), run_smem, stream, *p);
    }
    return kvq_cu_launch(p->step, false, run, grid, dim3(NW * 32), run_smem, stream, *p);
}

/* tq keys: 32-token stages with tq3 values on pages of a multiple of 32
 * tokens, else 16-token stages. */
template <int GP, int MODE>
kvq_status launch_tq(kvq_cu_fast_params *p, int kt, int vt, bool s2, int n_batch, int n_splits, int max_splits,
                     int n_sm, cudaStream_t stream)
{
    constexpr int J = KVQ_CU_KT_TQ3J, K3 = KVQ_CU_KT_TQ3, V3 = KVQ_CU_VT_TQ3, VF = KVQ_CU_VT_F16;
    if (vt == V3 && s2)
        return kt == J ? launch_one<J, V3, GP, 2, MODE>(p, n_batch, n_splits, max_splits, n_sm, stream)
                       : launch_one<K3, V3, GP, 2, MODE>(p, n_batch, n_splits, max_splits, n_sm, stream);
    if (vt == V3)
        return kt == J ? launch_one<J, V3, GP, 1, MODE>(p, n_batch, n_splits, max_splits, n_sm, stream)
                       : launch_one<K3, V3, GP, 1, MODE>(p, n_batch, n_splits, max_splits, n_sm, stream);
    return kt == J ? launch_one<J, VF, GP, 1, MODE>(p, n_batch, n_splits, max_splits, n_sm, stream)
                   : launch_one<K3, VF, GP, 1, MODE>(p, n_batch, n_splits, max_splits, n_sm, stream);
}

} /* namespace */

kvq_status kvq_cu_fast_launch(kvq_cu_fast_params *p, int kt, int vt, int n_batch, int n_splits, int max_splits,
                              int n_sm, cudaStream_t stream)
{
    constexpr int J = KVQ_CU_KT_TQ3J, K3 = KVQ_CU_KT_TQ3, KF = KVQ_CU_KT_F16, V3 = KVQ_CU_VT_TQ3, VF = KVQ_CU_VT_F16;
    if ((kt != J && kt != K3 && kt != KF) || (vt != V3 && vt != VF))
        return KVQ_ERR_UNSUPPORTED;
    /* f16 keys: f16 scores on 16-token stages, up to 4 or 8 query heads */
    if (kt == KF) {
        if (vt == V3)
            return p->G <= 4 ? launch_one<KF, V3, 4, 1>(p, n_batch, n_splits, max_splits, n_sm, stream)
                             : launch_one<KF, V3, 8, 1>(p, n_batch, n_splits, max_splits, n_sm, stream);
        return p->G <= 4 ? launch_one<KF, VF, 4, 1>(p, n_batch, n_splits, max_splits, n_sm, stream)
                         : launch_one<KF, VF, 8, 1>(p, n_batch, n_splits, max_splits, n_sm, stream);
    }
    /* tq keys: integer key scores for <= 4 query heads per KV head, f16
     * scores for 5..8; 32-token stages where a 32-token slice never crosses a
     * page */
    const bool s2 = p->pg.page_tokens % 32 == 0;
    if (p->G <= 4)
        return launch_tq<4, M_IM>(p, kt, vt, s2, n_batch, n_splits, max_splits, n_sm, stream);
    return launch_tq<8, M_ST>(p, kt, vt, s2, n_batch, n_splits, max_splits, n_sm, stream);
}
