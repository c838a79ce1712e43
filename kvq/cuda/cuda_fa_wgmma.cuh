/* cuda_fa_wgmma.cuh - the dense prefill attention (cuda_prefill_dense.cu)
 * on Hopper's warpgroup MMA: the same rows, views and (O, m, l) state as
 * fa_kernel, and the same f16 operands and f32 sums, in another order.
 *
 * fa_kernel issues mma.sync m16n8k16 from ldmatrix fragments and ran at
 * ~230 TFLOP/s on an H200, a third of the card's f16 rate (issue 37); wgmma
 * reads both operands of Q K^T straight from shared memory and 64 rows at a
 * time, which is where FlashAttention-3's rate comes from. Layout: a block
 * takes the same 128 query rows as fa_kernel, in two consumer warpgroups
 * of 64 rows, and a producer warpgroup loads tiles of 128 keys into 3
 * buffers on the TMA unit (fa_ws_kernel below). Every tile (Q, K, V) is two panels of [128 rows][64 halves],
 * 128-byte rows in the 128B swizzle (16-byte chunk c of row r at chunk
 * c ^ (r % 8)), so one descriptor form serves all:
 *   S = Q K^T   m64n128k16, A = Q and B = K both K-major (dims contiguous),
 *               8 steps of 16 dims (panel k / 4, +32 bytes per step inside);
 *   O += P V    m64n64k16 twice per 16 keys (dims 0-63, 64-127), P from
 *               registers (S rounded to f16 in the m16n8k16 A fragment
 *               order), V N-major (imm-trans-b) at 2 KB per 16 keys.
 * The softmax between them runs in registers as in fa_kernel.
 *
 * Built for sm_90a only: elsewhere the kernel is empty and fa_wg_ok() is 0.
 * C++ (nvcc) only; included by cuda_prefill_dense.cu after fa_params.
 */
#ifndef KVQ_CUDA_FA_WGMMA_CUH
#define KVQ_CUDA_FA_WGMMA_CUH

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KVQ_FA_WG 1
#endif

constexpr int kWgKeys = 128;
constexpr uint32_t kWgPanel = 128 * 128;   /* bytes: 128 rows x 64 halves */
constexpr uint32_t kWgTile = 2 * kWgPanel; /* 128 rows x 128 halves */
constexpr size_t kWgSmem = 7 * (size_t)kWgTile + 1024; /* Q, 3 x (K, V), alignment: 225 KB */

/* Where 16-byte chunk c (0..15) of row r lands in a tile (bytes). */
__device__ __forceinline__ uint32_t wg_swz(int r, int c)
{
    return (uint32_t)(c >> 3) * kWgPanel + (uint32_t)r * 128u + ((uint32_t)((c & 7) ^ (r & 7)) << 4);
}

/* Shared-memory matrix descriptors, 128B swizzle, 8-row groups 1024 bytes
 * apart. K-major: the leading offset is unused (16). N-major V, 64 dims
 * wide: one swizzle width across, so only the 8-key group stride matters;
 * both offsets carry it. */
__device__ __forceinline__ uint64_t wg_desc_k(uint32_t addr)
{
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ uint64_t wg_desc_n(uint32_t addr)
{
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)(1024 >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) |
           (1ull << 62);
}

#ifdef KVQ_FA_WG
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }

/* Keeps the compiler from moving accesses of accumulators across an
 * asynchronous MMA's issue and wait. */
template <int N>
__device__ __forceinline__ void wg_hold(float (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}

/* The same for a P V's A fragments, which the MMA reads until its wait. */
__device__ __forceinline__ void wg_hold_r(uint32_t (&a)[8][4])
{
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            asm volatile("" : "+r"(a[i][e])::"memory");
}

/* D (64 rows x 128 keys, this warpgroup's) (+)= Q K^T over 16 dims: A and B
 * from shared memory, both K-major. acc = 0 starts the sums. */
__device__ __forceinline__ void wg_qk(float (&d)[64], uint64_t da, uint64_t db, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(acc));
}

/* D (64 rows x 64 dims) += P V over 16 keys: P from registers (the
 * m16n8k16 A fragment of each warp's 16 rows), V from shared memory with
 * the dims contiguous (N-major: imm-trans-b = 1). */
__device__ __forceinline__ void wg_pv(float (&d)[32], const uint32_t (&a)[4], uint64_t db)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
#endif /* KVQ_FA_WG */

/* The tensor maps fa_ws_kernel loads through (run_d encodes them): each a
 * 3-D view (dims, heads, positions) of an f16 array, box 64 dims wide
 * (one 128-byte swizzle row) and 128 rows (keys) or G x 128 / G (queries). */
struct fa_maps {
    CUtensorMap q, ka, va, kb, vb;
};

constexpr int kWsThreads = 3 * 128; /* the producer warpgroup, then two consumers */
constexpr size_t kWsSmem = kWgSmem + 64; /* + the mbarriers */

/* fa_kernel's launch on warpgroup MMA (D = 128): the same grid, params and
 * results up to the order of the f32 sums.
 *
 * Warpgroup 0 is a producer in which one thread issues every copy (Q once,
 * then per tile 4 boxes of 64 dims x 128 keys into 3 stage buffers, each
 * stage an mbarrier "full" armed with its bytes and one "empty" the 256
 * consumer threads arrive on after the tile's P V). Warpgroups 1 and 2 are
 * consumers of 64 rows each with no block-wide barrier, so they drift apart
 * and one's softmax can run under the other's MMAs; and each issues the
 * next tile's S = Q K^T together with this tile's O += P V and computes the
 * next softmax while P V runs (FlashAttention-3's intra-warpgroup overlap).
 * The TMA unit writes the 128B swizzle wg_swz describes and zero-fills rows
 * outside the tensors, which the masks then exclude. Registers move from
 * the producer (40) to the consumers (232) with setmaxnreg, as
 * FlashAttention-3 does. Loading with cp.async from every thread instead
 * (the kernel before this one) ran 1.3x slower. */
__global__ void __launch_bounds__(kWsThreads, 1)
    fa_ws_kernel(const __grid_constant__ fa_params p, const __grid_constant__ fa_maps mp)
{
#ifdef KVQ_FA_WG
    constexpr int D = 128;
    static_assert(kFaRows == 128, "two consumer warpgroups of 64 rows");
    extern __shared__ __align__(16) uint8_t smem[];
    uint8_t *const sbase = smem + ((1024u - (smem_u32(smem) & 1023u)) & 1023u);
    const uint32_t base = smem_u32(sbase), sq = base;
    auto sk = [&](int b) { return base + (uint32_t)(1 + 2 * b) * kWgTile; };
    auto sv = [&](int b) { return base + (uint32_t)(2 + 2 * b) * kWgTile; };
    uint64_t *const bars = reinterpret_cast<uint64_t *>(sbase + 7 * (size_t)kWgTile);
    uint64_t *const qbar = bars, *const full = bars + 1, *const empty = bars + 4;

    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int h = blockIdx.y, G = p.G, ppt = kFaRows / G, i0 = blockIdx.x * ppt;

    auto tl_of = [&](int n, int se) {
        int tl = n;
        if (p.P && n % p.P)
            tl = n - n % p.P;
        return tl > se ? tl : se;
    };
    const int ilast = (i0 + ppt < p.n ? i0 + ppt : p.n) - 1;
    const int n_first = p.pos0 + i0 + 1, n_last = p.pos0 + ilast + 1;
    const int se_first = n_first < p.sink_rows ? n_first : p.sink_rows;
    const int se_last = n_last < p.sink_rows ? n_last : p.sink_rows;
    const int a_end = min(p.seg_hi, tl_of(n_last, se_last));
    const int n_a = a_end > p.seg_lo ? (a_end - p.seg_lo + kWgKeys - 1) / kWgKeys : 0;
    const int w_lo = tl_of(n_first, se_first), w_hi = n_last;
    const int a_full = min(w_lo, p.seg_hi); /* scratch tiles below this are whole in every row's view */
    const int n_b = p.last && p.P && w_hi > w_lo ? (w_hi - w_lo + kWgKeys - 1) / kWgKeys : 0;
    const int n_t = n_a + n_b;
    auto tile_t0 = [&](int j) { return j < n_a ? p.seg_lo + j * kWgKeys : w_lo + (j - n_a) * kWgKeys; };

    if (tid == 0) {
        mbar_init(qbar);
        for (int b = 0; b < 3; b++) {
            mbar_init(&full[b]);
            mbar_init(&empty[b], 256);
        }
        mbar_fence_init();
    }
    __syncthreads();

    if (wg == 0) { /* the producer */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (tid == 0) {
            mbar_expect_tx(qbar, 2u * 128u * (uint32_t)(G * ppt));
            tma_load_3d(sq, &mp.q, 0, h * G, i0, qbar);
            tma_load_3d(sq + kWgPanel, &mp.q, 64, h * G, i0, qbar);
            for (int j = 0; j < n_t; j++) {
                const int b = j % 3;
                if (j >= 3)
                    mbar_wait(&empty[b], (uint32_t)((j / 3 - 1) & 1));
                mbar_expect_tx(&full[b], 2 * kWgTile);
                const bool a = j < n_a;
                const int t = tile_t0(j) - (a ? p.seg_lo : p.pos0);
                const CUtensorMap *mk = a ? &mp.ka : &mp.kb, *mv = a ? &mp.va : &mp.vb;
                tma_load_3d(sk(b), mk, 0, h, t, &full[b]);
                tma_load_3d(sk(b) + kWgPanel, mk, 64, h, t, &full[b]);
                tma_load_3d(sv(b), mv, 0, h, t, &full[b]);
                tma_load_3d(sv(b) + kWgPanel, mv, 64, h, t, &full[b]);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");

    /* a consumer: warpgroup c takes rows 64 c ..; warp w (0..7) rows 16 w .. */
    const int c = wg - 1, warp = (tid >> 5) - 4;
    int rn[2], rtl[2], ridx[2];
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int r = warp * 16 + g + 8 * k, i = i0 + r / G;
        const bool ok = r < ppt * G && i < p.n;
        const int n = p.pos0 + i + 1, se = n < p.sink_rows ? n : p.sink_rows;
        rn[k] = ok ? n : 0;
        rtl[k] = ok ? tl_of(n, se) : 0;
        ridx[k] = ok ? i * p.Hq + h * G + r % G : -1;
    }

    /* the running state; o[half][4 i + e]: row g + 8 (e >> 1), dim 64 half + 8 i + 2 t4 + (e & 1) */
    float o[2][32];
    float m_run[2], l_run[2];
#pragma unroll
    for (int k = 0; k < 2; k++) {
        m_run[k] = -INFINITY;
        l_run[k] = 0.0f;
        if (!p.first && ridx[k] >= 0) {
            m_run[k] = p.ml[2 * (size_t)ridx[k]];
            l_run[k] = t4 == 0 ? p.ml[2 * (size_t)ridx[k] + 1] : 0.0f;
        }
    }
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int k = e >> 1;
            o[nt >> 3][4 * (nt & 7) + e] =
                !p.first && ridx[k] >= 0 ? p.o[(size_t)ridx[k] * D + nt * 8 + 2 * t4 + (e & 1)] : 0.0f;
        }

    const uint32_t q_rows = sq + (uint32_t)c * 64u * 128u; /* this warpgroup's 64 rows */
    float s[64];
#pragma unroll
    for (int i = 0; i < 64; i++)
        s[i] = 0.0f;
    auto issue_qk = [&](int j) {
        const uint32_t kt = sk(j % 3);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            const uint32_t off = (uint32_t)(kk >> 2) * kWgPanel + (uint32_t)(kk & 3) * 32u;
            wg_qk(s, wg_desc_k(q_rows + off), wg_desc_k(kt + off), kk);
        }
        wg_commit();
    };
    auto softmax = [&](int j, uint32_t (&pa)[8][4], float (&alpha)[2]) {
        const bool a = j < n_a;
        const int t0 = tile_t0(j);
        float mx[2] = {-INFINITY, -INFINITY};
        if (a && t0 + kWgKeys <= a_full) {
#pragma unroll
            for (int i = 0; i < 64; i++)
                mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
        } else {
#pragma unroll
            for (int i = 0; i < 64; i++) {
                const int k = (i >> 1) & 1, t = t0 + 8 * (i >> 2) + 2 * t4 + (i & 1);
                const bool ok = a ? t < rtl[k] && t < p.seg_hi : t >= rtl[k] && t < rn[k];
                s[i] = ok ? s[i] : -INFINITY;
                mx[k] = fmaxf(mx[k], s[i]);
            }
        }
        float mu[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 1));
            mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 2));
            const float m_new = fmaxf(m_run[k], mx[k]);
            mu[k] = m_new == -INFINITY ? 0.0f : m_new;
            alpha[k] = exp2f(m_run[k] - mu[k]);
            m_run[k] = m_new;
            l_run[k] *= alpha[k];
        }
#pragma unroll
        for (int kk = 0; kk < 8; kk++) {
            float w[8];
#pragma unroll
            for (int e = 0; e < 8; e++) {
                w[e] = exp2f(s[8 * kk + e] - mu[(e >> 1) & 1]);
                l_run[(e >> 1) & 1] += w[e];
            }
            pa[kk][0] = pack_f16x2(w[0], w[1]);
            pa[kk][1] = pack_f16x2(w[2], w[3]);
            pa[kk][2] = pack_f16x2(w[4], w[5]);
            pa[kk][3] = pack_f16x2(w[6], w[7]);
        }
    };
    auto scale_o = [&](const float (&alpha)[2]) {
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
#pragma unroll
            for (int i = 0; i < 32; i++)
                o[hf][i] *= alpha[(i >> 1) & 1];
    };
    uint32_t pa[8][4], pn[8][4];
    float alpha[2];
    auto issue_pv = [&](int j) {
        const uint32_t vt = sv(j % 3);
#pragma unroll
        for (int kk = 0; kk < kWgKeys / 16; kk++) {
            const uint32_t at = vt + (uint32_t)kk * 16u * 128u;
            wg_pv(o[0], pa[kk], wg_desc_n(at));
            wg_pv(o[1], pa[kk], wg_desc_n(at + kWgPanel));
        }
        wg_commit();
    };
    /* tile j's P V is done: its stage may refill */
    auto release = [&](int j) { mbar_arrive(&empty[j % 3]); };

    mbar_wait_warp(qbar, 0); /* always: the block must not exit with copies in flight */
    if (n_t > 0) {
        mbar_wait_warp(&full[0], 0);
        wg_hold(s);
        wg_fence();
        issue_qk(0);
        wg_wait0();
        wg_hold(s);
        softmax(0, pa, alpha);
        scale_o(alpha);
    }
    for (int j = 0; j + 1 < n_t; j++) {
        mbar_wait_warp(&full[(j + 1) % 3], (uint32_t)(((j + 1) / 3) & 1));
        /* the MMAs' inputs defined before they start, or ptxas serialises them */
        wg_hold_r(pa);
        wg_hold(o[0]);
        wg_hold(o[1]);
        wg_hold(s);
        wg_fence();
        issue_qk(j + 1);
        issue_pv(j);
        wg_wait1();
        wg_hold(s);
        softmax(j + 1, pn, alpha);
        wg_wait0();
        wg_hold(o[0]);
        wg_hold(o[1]);
        wg_hold_r(pa);
        release(j);
        scale_o(alpha);
#pragma unroll
        for (int kk = 0; kk < 8; kk++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                pa[kk][e] = pn[kk][e];
    }
    if (n_t > 0) {
        wg_hold_r(pa);
        wg_hold(o[0]);
        wg_hold(o[1]);
        wg_fence();
        issue_pv(n_t - 1);
        wg_wait0();
        wg_hold(o[0]);
        wg_hold(o[1]);
    }

#pragma unroll
    for (int k = 0; k < 2; k++) {
        l_run[k] += __shfl_xor_sync(0xffffffffu, l_run[k], 1);
        l_run[k] += __shfl_xor_sync(0xffffffffu, l_run[k], 2);
    }
#pragma unroll
    for (int k = 0; k < 2; k++) {
        if (ridx[k] < 0)
            continue;
        const float inv = p.last ? 1.0f / l_run[k] : 1.0f;
        float *dst = p.o + (size_t)ridx[k] * D + 2 * t4;
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++)
            *reinterpret_cast<float2 *>(dst + nt * 8) =
                make_float2(o[nt >> 3][4 * (nt & 7) + 2 * k] * inv, o[nt >> 3][4 * (nt & 7) + 2 * k + 1] * inv);
        if (!p.last && t4 == 0) {
            p.ml[2 * (size_t)ridx[k]] = m_run[k];
            p.ml[2 * (size_t)ridx[k] + 1] = l_run[k];
        }
    }
#else
    (void)p, (void)mp;
#endif
}

#endif /* KVQ_CUDA_FA_WGMMA_CUH */
