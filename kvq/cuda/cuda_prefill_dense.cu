/* cuda_prefill_dense.cu - a prefill chunk's causal attention as dense
 * FlashAttention over a bounded f16 scratch (kvq_cuda_prefill_ws).
 *
 * The tile kernel (cuda_prefill.cu) decodes the packed past inside its key
 * loop and keeps every product exact: queries as f16 hi + lo halves, QJL
 * keys as a second D-wide half. That is 2-3x the tensor-core work of plain
 * attention and ran at ~100 TFLOP/s (issue 37: a 128K prompt took 78 s).
 * Here, as every shipping quantized-cache engine does it, the past is
 * decoded once per chunk into f16 rows and the attention is a plain one:
 *
 *  1. rows_kernel: Q' = f16(R_k (c q)) (c = scale log2 e), and the chunk's
 *     own rows as the window ring stores them, R_k f16(k) and R_v f16(v);
 *  2. per segment of the past (seg tokens of the scratch at a time):
 *     deq_kernel writes K^ and V^ of each position in the codecs' rotated
 *     domain: an f16 sink row rotated; a packed key
 *     norm (c[idx] + |r| kappa S^T sign) + R_k m~ (the QJL estimator is
 *     linear in the query, so its S-domain term folds into a D-wide key;
 *     m~ the page's key mean when centred); a packed value norm c[idx];
 *     llama.cpp's blocks their elements. Then fa_kernel attends it,
 *     carrying (O, m, l) of every query row in f32 from segment to segment;
 *  3. the last launch also attends the chunk's own f16 rows (the window,
 *     where it is on) and normalises; finish_kernel rotates O back (R_v^T).
 *
 * A query row sees exactly the ranges kvq_cuda_cache_attend_prefix gives
 * its view (sinks and packed tokens below tl from the scratch, the window
 * [tl, n) from the chunk's rows); what differs from the tile kernel is
 * rounding: Q', K^ and V^ are each rounded to f16 once (FlashAttention's
 * operands; products and sums in f32).
 *
 * fa_kernel: 8 warps, 128 query rows of one KV head (positions x its G
 * query heads, as the tile kernel packs them, so a key tile serves the
 * whole GQA group), 64-key tiles double-buffered with cp.async (zero-filled
 * beyond the rows that exist), Q fragments in registers, K through ldmatrix,
 * V through ldmatrix.trans, mma.sync m16n8k16 with f32 accumulators. On a
 * Hopper GPU at D = 128 the same launch runs fa_ws_kernel instead
 * (cuda_fa_wgmma.cuh: warpgroup MMA, 128-key tiles, a TMA producer
 * warpgroup).
 */
#include <cuda.h> /* CUtensorMap: the encoder comes through the runtime, no -lcuda */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_bulk.cuh"
#include "cuda_internal.cuh"
#include "cuda_prefill_tile.cuh"
#include "cuda_rot.cuh"
#include "cuda_ws.h"

struct kvq_cuda_prefill_ws {
    int H, Hq, D;
    size_t max_rows, seg;
    __half *ka, *va; /* [seg][H][D]: positions seg_lo + row of the past */
    __half *kb, *vb; /* [max_rows][H][D]: the chunk's own rows */
    __half *q;       /* [max_rows][Hq][D] */
    float *o;        /* [max_rows][Hq][D] */
    float *ml;       /* [max_rows][Hq][2]: running max and sum */
    void *mem;
};

namespace {

using namespace kvq_cu;

constexpr float kLog2eD = 1.4426950408889634f;
constexpr int kFaWarps = 8, kFaRows = 16 * kFaWarps, kFaKeys = 64;

/* ---- 1. queries and the chunk's own rows --------------------------------- */

struct rows_params {
    kvq_dev_codec ck, cv;
    const float *q, *k, *v;
    __half *qo, *kb, *vb;
    int n, H, Hq;
    float qscale;
};

/* blockIdx.y < Hq: query head y; then H key heads, then H value heads; a
 * warp per position. At D = 128 with a rotation rot128_apply implements,
 * the row stays in registers (the same butterflies in the same order as
 * warp_rotate: the same bits); this kernel runs over every row of every
 * chunk, and the shared-memory path's seven synchronised stages made it a
 * latency chain (136 us per layer for a 2048-token chunk on an H200). */
template <int D>
__global__ void rows_kernel(const __grid_constant__ rows_params p)
{
    __shared__ float buf[4][2 * D];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i = blockIdx.x * 4 + warp, y = blockIdx.y;
    if (i >= p.n)
        return;
    const float *src;
    __half *dst;
    const kvq_dev_codec *cd;
    bool round_in = true;
    float sc = 1.0f;
    if (y < p.Hq) {
        src = p.q + ((size_t)i * p.Hq + y) * D;
        dst = p.qo + ((size_t)i * p.Hq + y) * D;
        cd = &p.ck;
        round_in = false;
        sc = p.qscale;
    } else if (y < p.Hq + p.H) {
        src = p.k + ((size_t)i * p.H + (y - p.Hq)) * D;
        dst = p.kb + ((size_t)i * p.H + (y - p.Hq)) * D;
        cd = &p.ck;
    } else {
        src = p.v + ((size_t)i * p.H + (y - p.Hq - p.H)) * D;
        dst = p.vb + ((size_t)i * p.H + (y - p.Hq - p.H)) * D;
        cd = &p.cv;
    }
    if constexpr (D == 128) {
        if (!cd->in_rot || rot128_ok(cd->R)) { /* warp-uniform: the shuffles see whole warps */
            float sg[kRot128Pre][4], v[4];
            if (cd->in_rot)
                rot128_load_signs(cd->R, sg, lane);
#pragma unroll
            for (int k = 0; k < 4; k++) { /* a window row as the ring stores it: f16 */
                const float x = src[lane + 32 * k];
                v[k] = round_in ? __half2float(__float2half_rn(x)) : sc * x;
            }
            if (cd->in_rot)
                rot128_apply(cd->R, sg, v, lane);
#pragma unroll
            for (int k = 0; k < 4; k++)
                dst[lane + 32 * k] = __float2half_rn(v[k]);
            return;
        }
    }
    float *x = buf[warp], *tmp = x + D;
    for (int j = lane; j < D; j += 32)
        x[j] = round_in ? __half2float(__float2half_rn(src[j])) : sc * src[j];
    __syncwarp();
    const float *r = cd->in_rot ? warp_rotate(cd->R, x, tmp, lane) : x;
    for (int j = lane; j < D; j += 32)
        dst[j] = __float2half_rn(r[j]);
}

/* ---- 2. the past, decoded into the scratch ------------------------------- */

struct deq_params {
    kvq_dev_pages pg;
    kvq_dev_codec ck, cv;
    const uint16_t *ov_k, *ov_v;
    __half *ka, *va;
    int seq, H, lo, hi, valid, seg_lo, sink_rows, ov_rows;
    uint64_t mean_off;
    uint32_t mean_bytes;
    int center;
};

/* The levels of a tq codec (up to KVQ_CUDA_TQ_MAX_LEVELS), copied to shared
 * memory: indexed by each lane's own code, the copy in the kernel's
 * parameters (constant memory) is read once per distinct code, 8 times per
 * lookup at 3 bits. */
struct deq_levels {
    float k[KVQ_CUDA_TQ_MAX_LEVELS], v[KVQ_CUDA_TQ_MAX_LEVELS];
};

__device__ __forceinline__ float level_of(const kvq_dev_codec &cd, const float *lv, unsigned i)
{
    return cd.levels <= KVQ_CUDA_TQ_MAX_LEVELS ? lv[i] : cd.levels_d[i];
}

/* Code c (0..31) of a 12-byte group of 3-bit codes in device order
 * (kvq_layout.h) from its three words: codes 0-23 are the low 3 bits of the
 * words' nibbles, codes 24-31 the nibbles' top bits, one word per bit. The
 * same code as kvq_dev_code_get, from 3 word loads shared by the warp in
 * place of 3 byte loads per code. */
__device__ __forceinline__ unsigned code3_word(const uint32_t *w, int c)
{
    if (c < 24)
        return (w[c >> 3] >> (4 * (c & 7))) & 7u;
    const int sh = 4 * (c - 24) + 3;
    return ((w[0] >> sh) & 1u) | (((w[1] >> sh) & 1u) << 1) | (((w[2] >> sh) & 1u) << 2);
}

/* Element j of a packed row in the codec's domain: norm c[idx] for tq
 * codecs, the element for f16 and llama.cpp's blocks. */
__device__ __forceinline__ float elem_of(const kvq_dev_codec &cd, const float *lv, const kvq_row &r, int D, int j)
{
    if (cd.rotated)
        return kvq_f16_to_f32(*r.norm) * level_of(cd, lv, code_get(r.codes, cd.bits, D, j));
    return baseline_elem(cd.type, r.codes, j);
}

/* Elements lane + 32 k (k < 4) of a D = 128 row, as elem_of. */
__device__ __forceinline__ void elems128(const kvq_dev_codec &cd, const float *lv, const kvq_row &r, int lane,
                                         float x[4])
{
    if (cd.rotated && cd.bits == 3 && ((uintptr_t)r.codes & 3u) == 0) {
        const float nv = kvq_f16_to_f32(*r.norm);
        const uint32_t *w = reinterpret_cast<const uint32_t *>(r.codes);
#pragma unroll
        for (int k = 0; k < 4; k++)
            x[k] = nv * level_of(cd, lv, code3_word(w + 3 * k, lane));
        return;
    }
#pragma unroll
    for (int k = 0; k < 4; k++)
        x[k] = elem_of(cd, lv, r, 128, lane + 32 * k);
}

/* Positions one warp decodes in turn: the sign tables and a page's rotated
 * key mean are loaded or computed once for all of them. */
constexpr int kDeqRun = 4;

/* Position t's sink rows (f16, rotated into the codec's domain) or, past
 * valid, zeros: masked keys, but finite. */
template <int D>
__device__ void deq_plain(const deq_params &p, int t, int h, float *x, float *tmp, __half *kd, __half *vd, int lane)
{
    const bool sink = t < p.sink_rows;
    for (int pass = 0; pass < 2; pass++) {
        const kvq_dev_codec &cd = pass ? p.cv : p.ck;
        const uint16_t *ov = (pass ? p.ov_v : p.ov_k) + (((size_t)p.seq * p.ov_rows + t) * p.H + h) * D;
        for (int j = lane; j < D; j += 32)
            x[j] = sink ? kvq_f16_to_f32(ov[j]) : 0.0f;
        __syncwarp();
        const float *y = sink && cd.in_rot ? warp_rotate(cd.R, x, tmp, lane) : x;
        __half *d = pass ? vd : kd;
        for (int j = lane; j < D; j += 32)
            d[j] = __float2half_rn(y[j]);
        __syncwarp();
    }
}

/* A warp per kDeqRun positions of one KV head: 8 warps a block,
 * blockIdx.y the head. The bound keeps 3 blocks an SM (80 registers, no
 * spills; 128 without it). */
template <int D>
__global__ void __launch_bounds__(256, 3) deq_kernel(const __grid_constant__ deq_params p)
{
    __shared__ float buf[8][3 * D];
    __shared__ deq_levels lv;
    if (threadIdx.x < 2 * KVQ_CUDA_TQ_MAX_LEVELS) {
        const int i = threadIdx.x % KVQ_CUDA_TQ_MAX_LEVELS;
        const kvq_dev_codec &cd = threadIdx.x < KVQ_CUDA_TQ_MAX_LEVELS ? p.ck : p.cv;
        (threadIdx.x < KVQ_CUDA_TQ_MAX_LEVELS ? lv.k : lv.v)[i] = i < cd.levels ? cd.centroids[i] : 0.0f;
    }
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, h = blockIdx.y;
    const int t_lo = p.lo + (blockIdx.x * 8 + warp) * kDeqRun, t_hi = min(t_lo + kDeqRun, p.hi);
    float *x = buf[warp], *tmp = x + D, *z = x + 2 * D;
    const bool fast = D == 128 && (!p.ck.qjl || rot128_ok(p.ck.S)) && (!p.center || !p.ck.in_rot || rot128_ok(p.ck.R));
    float mean[4]; /* R m of the key mean of page mean_page, lane + 32 k */
    int mean_page = -1, pg_page = -1;
    uint8_t *pg = nullptr;
#pragma unroll 1
    for (int t = t_lo; t < t_hi; t++) {
        const size_t at = ((size_t)(t - p.seg_lo) * p.H + h) * D;
        __half *kd = p.ka + at, *vd = p.va + at;
        if (t < p.sink_rows || t >= p.valid) {
            deq_plain<D>(p, t, h, x, tmp, kd, vd, lane);
            continue;
        }
        const uint32_t page_i = (uint32_t)t / p.pg.page_tokens, slot = (uint32_t)t % p.pg.page_tokens;
        if ((int)page_i != pg_page) { /* a run's positions share their page but for a page edge */
            pg = p.pg.pool + (uint64_t)p.pg.ptab[(size_t)p.seq * p.pg.max_pages_per_seq + page_i] * p.pg.page_bytes;
            pg_page = (int)page_i;
        }
        const kvq_row kr = kvq_dev_row(&p.pg.dl, pg, 0, (uint32_t)h, slot);
        const kvq_row vr = kvq_dev_row(&p.pg.dl, pg, 1, (uint32_t)h, slot);
        if constexpr (D == 128) { /* the same sums in registers (rot128_*: shuffles, no shared memory) */
            if (fast) {
                float x4[4], z4[4], v4[4];
                elems128(p.ck, lv.k, kr, lane, x4);
                elems128(p.cv, lv.v, vr, lane, v4);
                if (p.ck.qjl) {
                    float sg[kRot128Pre][4]; /* L1 hits after the first position */
                    rot128_load_signs(p.ck.S, sg, lane);
                    const float gam = kvq_f16_to_f32(*kr.norm) * kvq_f16_to_f32(*kr.rnorm) * p.ck.kappa;
#pragma unroll
                    for (int k = 0; k < 4; k++)
                        z4[k] = (kr.signs[4 * k + (lane >> 3)] >> (lane & 7)) & 1u ? gam : -gam;
                    rot128_apply_t(p.ck.S, sg, z4, lane);
#pragma unroll
                    for (int k = 0; k < 4; k++)
                        x4[k] += z4[k];
                }
                if (p.center) { /* R m of the page's key mean, once per page */
                    if ((int)page_i != mean_page) {
                        const uint8_t *blk = pg + p.mean_off + (uint64_t)h * p.mean_bytes;
                        const float sc = kvq_key_mean_scale(blk);
#pragma unroll
                        for (int k = 0; k < 4; k++)
                            mean[k] = sc * (float)(kvq_key_mean_code(blk, lane + 32 * k) - 8);
                        if (p.ck.in_rot) {
                            float sg[kRot128Pre][4];
                            rot128_load_signs(p.ck.R, sg, lane);
                            rot128_apply(p.ck.R, sg, mean, lane);
                        }
                        mean_page = (int)page_i;
                    }
#pragma unroll
                    for (int k = 0; k < 4; k++)
                        x4[k] += mean[k];
                }
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    kd[lane + 32 * k] = __float2half_rn(x4[k]);
                    vd[lane + 32 * k] = __float2half_rn(v4[k]);
                }
                continue;
            }
        }
        /* K^: the levels, the QJL term folded through S^T, the page's mean */
        for (int j = lane; j < D; j += 32)
            x[j] = elem_of(p.ck, lv.k, kr, D, j);
        if (p.ck.qjl) {
            const float gam = kvq_f16_to_f32(*kr.norm) * kvq_f16_to_f32(*kr.rnorm) * p.ck.kappa;
            for (int j = lane; j < D; j += 32)
                z[j] = (kr.signs[j >> 3] >> (j & 7)) & 1u ? gam : -gam;
            __syncwarp();
            const float *s = warp_rotate_t(p.ck.S, z, tmp, lane);
            for (int j = lane; j < D; j += 32)
                x[j] += s[j];
        }
        __syncwarp();
        if (p.center) {
            const uint8_t *blk = pg + p.mean_off + (uint64_t)h * p.mean_bytes;
            const float sc = kvq_key_mean_scale(blk);
            for (int j = lane; j < D; j += 32)
                z[j] = sc * (float)(kvq_key_mean_code(blk, j) - 8);
            __syncwarp();
            const float *m = p.ck.in_rot ? warp_rotate(p.ck.R, z, tmp, lane) : z;
            for (int j = lane; j < D; j += 32)
                x[j] += m[j];
        }
        for (int j = lane; j < D; j += 32)
            kd[j] = __float2half_rn(x[j]);
        for (int j = lane; j < D; j += 32)
            vd[j] = __float2half_rn(elem_of(p.cv, lv.v, vr, D, j));
        __syncwarp(); /* x, z and tmp are the next position's */
    }
}

/* ---- the attention -------------------------------------------------------- */

struct fa_params {
    const __half *q;       /* [n][Hq][D] */
    const __half *ka, *va; /* [seg_hi - seg_lo][H][D] */
    const __half *kb, *vb; /* [n][H][D], positions pos0 + row */
    float *o, *ml;         /* [n][Hq][D], [n][Hq][2] */
    int n, H, Hq, G, pos0, P, sink_rows;
    int seg_lo, seg_hi;    /* the scratch's positions this launch */
    int first, last;       /* start the rows' state / attend the chunk's rows and normalise */
};

__device__ __forceinline__ void cp16(uint32_t dst, const void *src, bool ok)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
#else
    (void)dst, (void)src, (void)ok;
#endif
}

__device__ __forceinline__ void cp_commit()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void cp_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

template <int D>
struct fa_layout {
    static constexpr int S = D + 8; /* row stride in halves: ldmatrix rows on distinct banks */
    static constexpr size_t q_bytes = (size_t)kFaRows * S * 2;
    static constexpr size_t tile_bytes = (size_t)kFaKeys * S * 2; /* K or V of one buffer */
    static constexpr size_t bytes = q_bytes + 4 * tile_bytes;
};

template <int D>
__global__ void __launch_bounds__(kFaWarps * 32, 1) fa_kernel(const __grid_constant__ fa_params p)
{
    using L = fa_layout<D>;
    constexpr int S = L::S, KS = D / 16;
    extern __shared__ __align__(16) uint8_t smem[];
    __half *Qs = reinterpret_cast<__half *>(smem);
    auto kbuf = [&](int b) { return reinterpret_cast<__half *>(smem + L::q_bytes + (2 * b) * L::tile_bytes); };
    auto vbuf = [&](int b) { return reinterpret_cast<__half *>(smem + L::q_bytes + (2 * b + 1) * L::tile_bytes); };

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int h = blockIdx.y, G = p.G, ppt = kFaRows / G, i0 = blockIdx.x * ppt;

    /* the queries: rows (position i0 + r / G, head h G + r % G), zero-filled past the chunk */
    for (int u = tid; u < kFaRows * (D / 8); u += kFaWarps * 32) {
        const int r = u / (D / 8), c = 8 * (u % (D / 8)), i = i0 + r / G;
        const bool ok = r < ppt * G && i < p.n;
        const __half *src = p.q + (ok ? ((size_t)i * p.Hq + (size_t)h * G + r % G) * D + c : 0);
        cp16(smem_u32(Qs + r * S + c), src, ok);
    }
    cp_commit();

    /* this thread's rows g and g + 8: their view n, sink end se, packed end tl */
    auto tl_of = [&](int n, int se) {
        int tl = n;
        if (p.P && n % p.P)
            tl = n - n % p.P;
        return tl > se ? tl : se;
    };
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
    const int ilast = (i0 + ppt < p.n ? i0 + ppt : p.n) - 1;
    const int n_first = p.pos0 + i0 + 1, n_last = p.pos0 + ilast + 1;
    const int se_first = n_first < p.sink_rows ? n_first : p.sink_rows;
    const int se_last = n_last < p.sink_rows ? n_last : p.sink_rows;
    const int a_end = min(p.seg_hi, tl_of(n_last, se_last));
    const int n_a = a_end > p.seg_lo ? (a_end - p.seg_lo + kFaKeys - 1) / kFaKeys : 0;
    const int w_lo = tl_of(n_first, se_first), w_hi = n_last;
    const int a_full = w_lo; /* scratch tiles below this are whole in every row's view: no mask */
    const int n_b = p.last && p.P && w_hi > w_lo ? (w_hi - w_lo + kFaKeys - 1) / kFaKeys : 0;
    auto tile_t0 = [&](int j) { return j < n_a ? p.seg_lo + j * kFaKeys : w_lo + (j - n_a) * kFaKeys; };

    auto load_tile = [&](int j, int b) {
        const bool a = j < n_a;
        const int t0 = tile_t0(j);
        __half *kd = kbuf(b), *vd = vbuf(b);
        for (int u = tid; u < kFaKeys * (D / 8); u += kFaWarps * 32) {
            const int r = u / (D / 8), c = 8 * (u % (D / 8)), t = t0 + r;
            const bool ok = a ? t < p.seg_hi : t >= p.pos0 && t < p.pos0 + p.n;
            const size_t at = ok ? ((size_t)(a ? t - p.seg_lo : t - p.pos0) * p.H + h) * D + c : 0;
            cp16(smem_u32(kd + r * S + c), (a ? p.ka : p.kb) + at, ok);
            cp16(smem_u32(vd + r * S + c), (a ? p.va : p.vb) + at, ok);
        }
        cp_commit();
    };
    const int n_t = n_a + n_b;
    if (n_t > 0)
        load_tile(0, 0);

    /* the running state */
    float o[D / 8][4];
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
            o[nt][e] = !p.first && ridx[k] >= 0 ? p.o[(size_t)ridx[k] * D + nt * 8 + 2 * t4 + (e & 1)] : 0.0f;
        }

    /* Q fragments of this warp's 16 rows */
    if (n_t > 0)
        cp_wait<1>();
    else
        cp_wait<0>();
    __syncthreads();
    uint4 qf[KS];
    {
        const uint32_t base = smem_u32(Qs + (warp * 16 + (lane & 15)) * S + (lane >> 4) * 8);
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            uint32_t r[4];
            ldsm_x4(base + kk * 32, r);
            qf[kk] = make_uint4(r[0], r[1], r[2], r[3]);
        }
    }

    const int krow = (lane & 7) + ((lane >> 4) << 3), kcol = ((lane >> 3) & 1) * 8; /* K: two n-tiles x two k-halves */
    const int vrow = lane & 15, vcol = (lane >> 4) * 8;
    for (int j = 0; j < n_t; j++) {
        const int b = j & 1;
        if (j + 1 < n_t) {
            load_tile(j + 1, b ^ 1);
            cp_wait<1>();
        } else
            cp_wait<0>();
        __syncthreads();
        const bool a = j < n_a;
        const int t0 = tile_t0(j);
        const __half *Kt = kbuf(b), *Vt = vbuf(b);
        float s[kFaKeys / 8][4];
#pragma unroll
        for (int nt = 0; nt < kFaKeys / 8; nt++)
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        const uint32_t kbase = smem_u32(Kt + krow * S + kcol);
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
#pragma unroll
            for (int np = 0; np < kFaKeys / 16; np++) {
                uint32_t r[4];
                ldsm_x4(kbase + (np * 16 * S + kk * 16) * 2, r);
                mma16816(s[2 * np], qf[kk], r[0], r[1]);
                mma16816(s[2 * np + 1], qf[kk], r[2], r[3]);
            }
        /* mask to the rows' views, then the online softmax (log2 units) */
        float mx[2] = {-INFINITY, -INFINITY};
        if (a && t0 + kFaKeys <= a_full) {
#pragma unroll
            for (int nt = 0; nt < kFaKeys / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
        } else {
#pragma unroll
            for (int nt = 0; nt < kFaKeys / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int k = e >> 1, t = t0 + nt * 8 + 2 * t4 + (e & 1);
                    const bool ok = a ? t < rtl[k] : t >= rtl[k] && t < rn[k];
                    s[nt][e] = ok ? s[nt][e] : -INFINITY;
                    mx[k] = fmaxf(mx[k], s[nt][e]);
                }
        }
        float alpha[2], mu[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 1));
            mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 2));
            const float m_new = fmaxf(m_run[k], mx[k]);
            mu[k] = m_new == -INFINITY ? 0.0f : m_new; /* a row with nothing yet stays empty */
            alpha[k] = exp2f(m_run[k] - mu[k]);
            m_run[k] = m_new;
            l_run[k] *= alpha[k];
        }
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++) {
            o[nt][0] *= alpha[0];
            o[nt][1] *= alpha[0];
            o[nt][2] *= alpha[1];
            o[nt][3] *= alpha[1];
        }
#pragma unroll
        for (int nt = 0; nt < kFaKeys / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float w = exp2f(s[nt][e] - mu[e >> 1]);
                l_run[e >> 1] += w;
                s[nt][e] = w;
            }
        const uint32_t vbase = smem_u32(Vt + vrow * S + vcol);
#pragma unroll
        for (int kk = 0; kk < kFaKeys / 16; kk++) {
            uint4 pa;
            pa.x = pack_f16x2(s[2 * kk][0], s[2 * kk][1]);
            pa.y = pack_f16x2(s[2 * kk][2], s[2 * kk][3]);
            pa.z = pack_f16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa.w = pack_f16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int dn = 0; dn < D / 16; dn++) {
                uint32_t r[4];
                ldsm_x4_trans(vbase + (16 * kk * S + dn * 16) * 2, r);
                mma16816(o[2 * dn], pa, r[0], r[1]);
                mma16816(o[2 * dn + 1], pa, r[2], r[3]);
            }
        }
        __syncthreads(); /* buffer b is refilled next iteration */
    }

    /* the state back: normalised after the last launch */
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
            *reinterpret_cast<float2 *>(dst + nt * 8) = make_float2(o[nt][2 * k] * inv, o[nt][2 * k + 1] * inv);
        if (!p.last && t4 == 0) {
            p.ml[2 * (size_t)ridx[k]] = m_run[k];
            p.ml[2 * (size_t)ridx[k] + 1] = l_run[k];
        }
    }
}

#include "cuda_fa_wgmma.cuh"

typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                              const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* The driver's tensor-map encoder, looked up once; NULL where the driver
 * has none. */
encode_fn tma_encoder()
{
    static const encode_fn fn = [] {
        void *f = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) !=
                cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
            (void)cudaGetLastError();
            f = NULL;
        }
        return (encode_fn)f;
    }();
    return fn;
}

/* Whether fa_ws_kernel runs on this device: its sm_90a code loaded (a
 * compute capability 9.0 GPU) and the driver encodes tensor maps, unless
 * KVQ_CUDA_NO_WGMMA is set to other than 0 (the mma.sync kernel then: an
 * A/B switch and a fallback). */
bool fa_wg_ok()
{
    const char *off = getenv("KVQ_CUDA_NO_WGMMA");
    if (off && *off && strcmp(off, "0"))
        return false;
    cudaFuncAttributes a;
    if (cudaFuncGetAttributes(&a, fa_ws_kernel) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.binaryVersion == 90 && tma_encoder() != NULL;
}

/* A (D, heads, rows) f16 array's tensor map, boxes of 64 dims x bh heads x
 * br rows in the 128B swizzle. @return 0 on success. */
int tma_map(CUtensorMap *m, const __half *a, int D, int heads, int rows, int bh, int br)
{
    const cuuint64_t dim[3] = {(cuuint64_t)D, (cuuint64_t)heads, (cuuint64_t)(rows > 0 ? rows : 1)};
    const cuuint64_t stride[2] = {(cuuint64_t)D * 2, (cuuint64_t)heads * D * 2};
    const cuuint32_t box[3] = {64, (cuuint32_t)bh, (cuuint32_t)br}, one[3] = {1, 1, 1};
    return tma_encoder()(m, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, (void *)a, dim, stride, box, one,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS;
}

/* ---- 3. out = R_v^T O ------------------------------------------------------ */

/* At D = 128 in registers, warp_rotate_t's operations in its order (each
 * round undone: scale, the butterflies, the signs): the same bits. */
template <int D>
__global__ void finish_kernel(kvq_dev_codec cv, const float *o, float *out, int rows)
{
    __shared__ float buf[4][2 * D];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = blockIdx.x * 4 + warp;
    if (r >= rows)
        return;
    if constexpr (D == 128) {
        if (!cv.in_rot || rot128_ok(cv.R)) {
            float v[4];
#pragma unroll
            for (int k = 0; k < 4; k++)
                v[k] = o[(size_t)r * D + lane + 32 * k];
            if (cv.in_rot && cv.R.kind != KVQ_ROT_IDENTITY)
                for (int t = cv.R.rounds - 1; t >= 0; t--) {
#pragma unroll
                    for (int k = 0; k < 4; k++)
                        v[k] *= cv.R.scale;
                    fwht128_reg(v, lane);
#pragma unroll
                    for (int k = 0; k < 4; k++)
                        v[k] *= cv.R.signs[t * 128 + 32 * k + lane];
                }
#pragma unroll
            for (int k = 0; k < 4; k++)
                out[(size_t)r * D + lane + 32 * k] = v[k];
            return;
        }
    }
    float *x = buf[warp], *tmp = x + D;
    for (int j = lane; j < D; j += 32)
        x[j] = o[(size_t)r * D + j];
    __syncwarp();
    const float *y = cv.in_rot ? warp_rotate_t(cv.R, x, tmp, lane) : x;
    for (int j = lane; j < D; j += 32)
        out[(size_t)r * D + j] = y[j];
}

template <int D>
kvq_status run_d(kvq_cuda_cache *c, kvq_cuda_prefill_ws *ws, int seq, int pos0, int n, const float *k, const float *v,
                 const float *q, int Hq, float scale, float *out)
{
    const int H = c->cfg.cache.n_kv_heads, P = c->ring ? (int)c->layout.page_tokens : 0;
    cudaStream_t st = c->stream;
    rows_params rp;
    rp.ck = c->dk;
    rp.cv = c->dv;
    rp.q = q;
    rp.k = k;
    rp.v = v;
    rp.qo = ws->q;
    rp.kb = ws->kb;
    rp.vb = ws->vb;
    rp.n = n;
    rp.H = H;
    rp.Hq = Hq;
    rp.qscale = scale * kLog2eD;
    rows_kernel<D><<<dim3((unsigned)((n + 3) / 4), (unsigned)(Hq + 2 * H)), 128, 0, st>>>(rp);
    KVQ_CU_TRY(cudaGetLastError());

    /* the scratch's positions: [0, valid) hold keys some row reads from it */
    const int n_last = pos0 + n, se_last = n_last < c->sink_rows ? n_last : c->sink_rows;
    int valid = n_last;
    if (P && n_last % P)
        valid = n_last - n_last % P;
    valid = valid > se_last ? valid : se_last;
    const int seg = (int)ws->seg;
    const int n_seg = valid > 0 ? (valid + seg - 1) / seg : 0;

    const bool ws_on = D == 128 && fa_wg_ok();
    if (ws_on)
        KVQ_CU_TRY(cudaFuncSetAttribute(fa_ws_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kWsSmem));
    else
        KVQ_CU_TRY(cudaFuncSetAttribute(fa_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)fa_layout<D>::bytes));
    fa_params fp;
    memset(&fp, 0, sizeof fp);
    fp.q = ws->q;
    fp.ka = ws->ka;
    fp.va = ws->va;
    fp.kb = ws->kb;
    fp.vb = ws->vb;
    fp.o = ws->o;
    fp.ml = ws->ml;
    fp.n = n;
    fp.H = H;
    fp.Hq = Hq;
    fp.G = Hq / H;
    fp.pos0 = pos0;
    fp.P = P;
    fp.sink_rows = c->sink_rows;
    const int ppt = kFaRows / fp.G;
    const dim3 grid((unsigned)((n + ppt - 1) / ppt), (unsigned)H);
    fa_maps maps;
    if (ws_on && (tma_map(&maps.q, ws->q, D, Hq, n, fp.G, ppt) || tma_map(&maps.ka, ws->ka, D, H, seg, 1, kWgKeys) ||
                  tma_map(&maps.va, ws->va, D, H, seg, 1, kWgKeys) || tma_map(&maps.kb, ws->kb, D, H, n, 1, kWgKeys) ||
                  tma_map(&maps.vb, ws->vb, D, H, n, 1, kWgKeys)))
        return KVQ_ERR_DEVICE;

    deq_params dp;
    memset(&dp, 0, sizeof dp);
    dp.pg = kvq_cu_pages_of(c);
    dp.ck = c->dk;
    dp.cv = c->dv;
    dp.ov_k = c->ov_k_d;
    dp.ov_v = c->ov_v_d;
    dp.ka = ws->ka;
    dp.va = ws->va;
    dp.seq = seq;
    dp.H = H;
    dp.valid = valid;
    dp.sink_rows = c->sink_rows;
    dp.ov_rows = c->ov_rows;
    dp.center = c->center;
    dp.mean_off = c->layout.mean_off;
    dp.mean_bytes = c->layout.mean_bytes;
    for (int s = 0; s < (n_seg ? n_seg : 1); s++) {
        const int lo = s * seg, hi = lo + seg;
        if (n_seg) {
            /* through the last tile any row reads (zeros past valid: a masked key's
             * weight is 0, and 0 times a stale NaN would not be); kWgKeys is
             * the larger of the two kernels' tiles */
            int end = (valid + kWgKeys - 1) / kWgKeys * kWgKeys;
            end = end < hi ? end : hi;
            dp.lo = lo;
            dp.hi = end;
            dp.seg_lo = lo;
            deq_kernel<D><<<dim3((unsigned)((end - lo + 8 * kDeqRun - 1) / (8 * kDeqRun)), (unsigned)H), 256, 0, st>>>(dp);
            KVQ_CU_TRY(cudaGetLastError());
        }
        fp.seg_lo = n_seg ? lo : 0;
        fp.seg_hi = n_seg ? hi : 0;
        fp.first = s == 0;
        fp.last = s == (n_seg ? n_seg : 1) - 1;
        if (ws_on)
            fa_ws_kernel<<<grid, kWsThreads, kWsSmem, st>>>(fp, maps);
        else
            fa_kernel<D><<<grid, kFaWarps * 32, fa_layout<D>::bytes, st>>>(fp);
        KVQ_CU_TRY(cudaGetLastError());
    }
    const int rows = n * Hq;
    finish_kernel<D><<<(unsigned)((rows + 3) / 4), 128, 0, st>>>(c->dv, ws->o, out, rows);
    KVQ_CU_TRY(cudaGetLastError());
    return KVQ_OK;
}

} /* namespace */

kvq_status kvq_cuda_prefill_ws_create(int n_kv_heads, int n_q_heads, int head_dim, size_t max_rows, size_t seg_tokens,
                                      kvq_cuda_prefill_ws **out)
{
    if (!out)
        return KVQ_ERR_INVALID_ARG;
    *out = NULL;
    if (n_kv_heads < 1 || n_q_heads < n_kv_heads || n_q_heads % n_kv_heads || head_dim < 16 || head_dim % 16 ||
        !max_rows || max_rows > (size_t)INT32_MAX / 2 || seg_tokens < kFaKeys || seg_tokens % kFaKeys ||
        seg_tokens > (size_t)INT32_MAX / 2)
        return KVQ_ERR_INVALID_ARG;
    KVQ_CU_RET(kvq_cuda_require_device());
    kvq_cuda_prefill_ws *ws = (kvq_cuda_prefill_ws *)calloc(1, sizeof *ws);
    if (!ws)
        return KVQ_ERR_NOMEM;
    size_t off[7];
    const size_t bytes = kvq_cu_ws_layout((size_t)n_kv_heads, (size_t)n_q_heads, (size_t)head_dim, max_rows, seg_tokens, off);
    if (cudaMalloc(&ws->mem, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        free(ws);
        return KVQ_ERR_NOMEM;
    }
    uint8_t *m = (uint8_t *)ws->mem;
    ws->H = n_kv_heads;
    ws->Hq = n_q_heads;
    ws->D = head_dim;
    ws->max_rows = max_rows;
    ws->seg = seg_tokens;
    ws->ka = (__half *)(m + off[0]);
    ws->va = (__half *)(m + off[1]);
    ws->kb = (__half *)(m + off[2]);
    ws->vb = (__half *)(m + off[3]);
    ws->q = (__half *)(m + off[4]);
    ws->o = (float *)(m + off[5]);
    ws->ml = (float *)(m + off[6]);
    *out = ws;
    return KVQ_OK;
}

void kvq_cuda_prefill_ws_free(kvq_cuda_prefill_ws *ws)
{
    if (!ws)
        return;
    cudaFree(ws->mem);
    free(ws);
}

/* Whether the dense path takes this chunk (cuda_prefill.cu asks). */
int kvq_cu_prefill_dense_ok(const kvq_cuda_cache *c, const kvq_cuda_prefill_ws *ws, int n_q_heads, size_t n)
{
    const int d = c->cfg.cache.head_dim;
    return ws && (d == 64 || d == 128) && ws->D == d && ws->H == c->cfg.cache.n_kv_heads && ws->Hq == n_q_heads &&
           n <= ws->max_rows && n_q_heads / ws->H <= kFaRows;
}

kvq_status kvq_cu_prefill_dense(kvq_cuda_cache *c, kvq_cuda_prefill_ws *ws, int seq, size_t pos0, size_t n,
                                const float *k, const float *v, const float *q, int n_q_heads, float scale,
                                float *out)
{
    switch (c->cfg.cache.head_dim) {
    case 64: return run_d<64>(c, ws, seq, (int)pos0, (int)n, k, v, q, n_q_heads, scale, out);
    case 128: return run_d<128>(c, ws, seq, (int)pos0, (int)n, k, v, q, n_q_heads, scale, out);
    default: return KVQ_ERR_UNSUPPORTED;
    }
}
