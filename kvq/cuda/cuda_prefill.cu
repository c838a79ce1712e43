/* cuda_prefill.cu - a prefill chunk's causal attention, its queries together
 * on tensor cores.
 *
 * The decode kernels attend one query position per entry, so a chunk of T
 * positions read the packed past T times (issue 18: 32K tokens took 32-40 s
 * on an H100). Here a block takes 128 query rows of one KV head (64 at
 * d = 256; rows / G positions times its G query heads) and walks the keys
 * once, 64 at a time: the block decodes the tile into f16 rows in shared
 * memory, then each warp runs S = Q K'^T and O += P V' for its 16 rows with
 * mma.m16n8k16 and keeps an online softmax per row (FlashAttention-2's loop,
 * with the cache's decode in place of a load). For 3-bit tq and f16 rows at
 * d <= 128 the tiles are double-buffered: the next tile's bytes are loaded
 * into registers before the current tile's MMAs and expanded after them.
 * No dense copy of the past exists anywhere.
 *
 * Everything is in the rotated domain of the codecs:
 *  - queries: Q' = c [R_k q, S_k R_k q] (c = scale log2(e); the second half
 *    only for QJL keys), rotated in the kernel as the encoder rotates keys
 *    (warp_rotate), the first half as f16 hi + lo rows;
 *  - a packed tq key: K' = [alpha c[idx], alpha |r| kappa sign] with the
 *    score scaled by norm / alpha afterwards in f32, so Q' . K' is the decode
 *    kernels' estimator; alpha (codebook_alpha) makes the levels ~exact in
 *    f16. f16 keys: their elements;
 *  - a packed tq value: V' = alpha c[idx], its norm / alpha folded into the
 *    softmax weight that meets it; f16 values: their elements;
 *  - a packed key of a codebook over 4 bits: K' = [hi, lo] of alpha c[idx]
 *    in f16 (kvq_prefill_split_k), against Q' = c [R_k q, R_k q];
 *  - an f16 row (sinks, the recent window): K' = [R_k k, 0] (QJL keys) or
 *    [hi, lo] of R_k k (split keys), V' = R_v v;
 * and the output is R_v^T (sum p V') / l. Each row's keys come in two
 * passes over one softmax: the packed tokens [se, tl), then the f16 ones,
 * [0, se) from the sink rows and [tl, n) from the chunk's own input, where
 * (se, tl) is what kvq_cuda_cache_attend_prefix would read for a view of n
 * tokens (override_view in cuda_attn.cu). That needs the window's rows of
 * every position inside the chunk: the caller starts the chunk on a page
 * boundary when the window is on (kvq_cuda_cache_prefill does).
 *
 * Rounding: the softmax weights and the window's rotated rows enter the
 * MMAs as f16 (products accumulate in f32); the bound of op "prefill" in
 * tests/test_backend_ops.c is what that measured.
 */
#include <math.h>
#include <string.h>

#include "cuda_internal.cuh"
#include "cuda_prefill_tile.cuh"
#include "cuda_rot.cuh"

namespace {

using namespace kvq_cu;

constexpr float kLog2e = 1.4426950408889634f;

struct prefill_params {
    kvq_dev_pages pg;
    kvq_dev_codec ck, cv;
    const float *q;         /* [n][Hq][D] */
    const float *k, *v;     /* the chunk's rows [n][H][D]: its window rows */
    const uint16_t *ov_k, *ov_v; /* f16 rows [max_seqs][ov_rows][H][D]: the sinks */
    float *out;             /* [n][Hq][D] */
    int seq, pos0, n, H, Hq, G;
    int P;                  /* page tokens when the recent window is on, else 0 */
    int sink_rows, ov_rows;
    float qscale;
    float alpha_k, alpha_v; /* codebook scales that make the levels ~exact in f16 (codebook_alpha) */
    tq3_lut lut_k, lut_v;   /* 3-bit codecs: alpha c as f16 bytes */
    float *mrot;            /* key centering: [page][H][D] the pages' key means in the queries'
                             * domain (R_k m~; written by mean_rot_kernel for pages
                             * [0, mean_pages) before the chunk kernel reads them), NULL: none */
    int mean_pages;
    uint64_t mean_off;      /* the pages' key-mean section (kvq_page_layout) */
    uint32_t mean_bytes;
};

/* Key centering: out[(page * H + h) * D] = R_k m~ of pages [0, n_pages) of
 * seq, head blockIdx.y, a warp per page, so that the chunk kernel's score
 * gain of a page is one dot product with its rotated query rows. */
template <int D>
__global__ void mean_rot_kernel(kvq_dev_pages pg, kvq_dev_codec ck, int seq, int n_pages, uint64_t mean_off,
                                uint32_t mean_bytes, float *out)
{
    __shared__ float buf[4][2 * D];
    const int h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int page = blockIdx.x * 4 + warp;
    if (page >= n_pages) /* warp-uniform: warp_rotate's shuffles see whole warps */
        return;
    const int32_t phys = pg.ptab[(size_t)seq * pg.max_pages_per_seq + (size_t)page];
    const uint8_t *blk = pg.pool + (uint64_t)phys * pg.page_bytes + mean_off + (uint64_t)h * mean_bytes;
    const float sc = kvq_key_mean_scale(blk);
    float *x = buf[warp], *tmp = x + D;
    for (int j = lane; j < D; j += 32)
        x[j] = sc * (float)(kvq_key_mean_code(blk, j) - 8);
    __syncwarp();
    const float *y = ck.in_rot ? warp_rotate(ck.R, x, tmp, lane) : x;
    for (int j = lane; j < D; j += 32)
        out[((size_t)page * pg.n_kv_heads + h) * D + j] = y[j];
}

/* PIPE: K and V are each 3-bit tq or f16 and D <= 128 (one 32-coordinate
 * unit per thread); the packed tiles then run double-buffered, the next
 * tile's bytes in registers while the current one is multiplied. */
template <int D, bool QJL, bool PIPE>
__global__ void __launch_bounds__(tile_layout<D, QJL, PIPE>::warps * 32, 1)
    prefill_kernel(const __grid_constant__ prefill_params p)
{
    using L = tile_layout<D, QJL, PIPE>;
    constexpr int KD = L::KD, KS = L::ks, LS = L::ls, VS = L::vs, kWarps = L::warps, kRows = L::rows;
    extern __shared__ __align__(16) uint8_t smem[];
    __half *Qs = reinterpret_cast<__half *>(smem);
    __half *Ql = reinterpret_cast<__half *>(smem + L::q_bytes);
    /* tile buffer b: keys, values, their scales */
    uint8_t *const tiles = smem + L::q_bytes + L::qlo_bytes;
    float *scratch = reinterpret_cast<float *>(tiles + L::bufs * (L::k_bytes + L::v_bytes));
    uint8_t **kpage = reinterpret_cast<uint8_t **>(scratch + kWarps * 2 * D);
    uint32_t *kslot = reinterpret_cast<uint32_t *>(kpage + kKeys);
    float *const scales = reinterpret_cast<float *>(kslot + kKeys); /* [bufs][K, V][kKeys] */
    auto kbuf = [&](int b) { return reinterpret_cast<__half *>(tiles + b * (L::k_bytes + L::v_bytes)); };
    auto vbuf = [&](int b) { return reinterpret_cast<__half *>(tiles + b * (L::k_bytes + L::v_bytes) + L::k_bytes); };
    __half *Ks = kbuf(0), *Vs = vbuf(0);
    float *ksc = scales, *vsc = scales + kKeys;
    float *cent_k = scales + 2 * L::bufs * kKeys, *cent_v = cent_k + KVQ_CUDA_LEVELS_CAP;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int h = blockIdx.y, G = p.G, ppt = kRows / G; /* positions per block */
    const int i0 = blockIdx.x * ppt;                    /* first chunk position of the block */
    float *xw = scratch + warp * 2 * D, *yw = xw + D;
    const tq3_lut lut_k = p.lut_k, lut_v = p.lut_v;
    for (int i = tid; i < p.ck.levels; i += blockDim.x)
        cent_k[i] = p.alpha_k * kvq_cu_centroid(p.ck, (unsigned)i);
    for (int i = tid; i < p.cv.levels; i += blockDim.x)
        cent_v[i] = p.alpha_v * kvq_cu_centroid(p.cv, (unsigned)i);

    /* 1. queries: Q' = c [R_k q, S_k R_k q] as f16 hi rows, and the rounding
     * of the first half as lo rows (invalid rows: zero) */
    for (int r = warp; r < kRows; r += kWarps) {
        const int i = i0 + r / G;
        const bool ok = r < ppt * G && i < p.n;
        const float *qr = p.q + ((size_t)i * p.Hq + (size_t)h * G + r % G) * D;
        for (int j = lane; j < D; j += 32)
            xw[j] = ok ? p.qscale * qr[j] : 0.0f;
        __syncwarp();
        float *y = p.ck.in_rot ? warp_rotate(p.ck.R, xw, yw, lane) : xw;
        for (int j = lane; j < D; j += 32) {
            const __half hi = __float2half_rn(y[j]);
            Qs[r * KS + j] = hi;
            Ql[r * LS + j] = __float2half_rn(y[j] - __half2float(hi));
        }
        __syncwarp();
        if constexpr (QJL) {
            if (p.ck.qjl) {
                float *z = warp_rotate(p.ck.S, y, y == xw ? yw : xw, lane);
                for (int j = lane; j < D; j += 32)
                    Qs[r * KS + D + j] = __float2half_rn(z[j]);
            } else { /* the keys' lo halves meet the queries' hi rows */
                for (int j = lane; j < D; j += 32)
                    Qs[r * KS + D + j] = Qs[r * KS + j];
            }
        }
        __syncwarp();
    }

    /* this thread's two rows (g and g + 8 of its warp): the view n, and
     * the packed range [se, tl) of it (override_view); invalid rows see
     * nothing */
    auto tl_of = [&](int n, int se) {
        int tl = n;
        if (p.P && n % p.P)
            tl = n - n % p.P;
        return tl > se ? tl : se;
    };
    int rn[2], rse[2], rtl[2];
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int r = warp * 16 + g + 8 * k, i = i0 + r / G;
        const bool ok = r < ppt * G && i < p.n;
        const int n = p.pos0 + i + 1;
        const int se = n < p.sink_rows ? n : p.sink_rows;
        rn[k] = ok ? n : 0;
        rse[k] = ok ? se : 0;
        rtl[k] = ok ? tl_of(n, se) : 0;
    }
    /* the block's ranges (from its first and last position) */
    const int ilast = (i0 + ppt < p.n ? i0 + ppt : p.n) - 1;
    const int n_first = p.pos0 + i0 + 1, n_last = p.pos0 + ilast + 1;
    const int se_first = n_first < p.sink_rows ? n_first : p.sink_rows;
    const int se_last = n_last < p.sink_rows ? n_last : p.sink_rows;
    const int a_lo = se_first, a_hi = tl_of(n_last, se_last); /* packed */
    const int w_lo = tl_of(n_first, se_first), w_hi = n_last;  /* f16 window */

    float o[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++)
        o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

    /* one tile of keys [t0, t0 + 64) already in buffer b; kind 0 packed,
     * 1 sink rows, 2 window rows */
    auto attend_tile = [&](int t0, int kind, int b) {
        const __half *Kt = kbuf(b), *Vt = vbuf(b);
        const float *kst = scales + 2 * b * kKeys, *vst = kst + kKeys;
        /* key centering: the score gain Q' . R m~ of rows g, g + 8 for each
         * page the tile touches (at most kKeys / 16 + 1), a quarter of the
         * dot product per lane of the row's quad */
        constexpr int kMaxPages = kKeys / KVQ_MIN_PAGE_TOKENS + 1;
        const int PT = (int)p.pg.page_tokens, pbase = t0 / PT;
        float gsel[2][kMaxPages];
#pragma unroll
        for (int pi = 0; pi < kMaxPages; pi++) {
            gsel[0][pi] = gsel[1][pi] = 0.0f;
            if (kind != 0 || !p.mrot || pbase + pi > (t0 + kKeys - 1) / PT)
                continue;
            const float *m = p.mrot + ((size_t)(pbase + pi) * p.H + h) * D + t4 * (D / 4);
#pragma unroll
            for (int k = 0; k < 2; k++) {
                const int r = warp * 16 + g + 8 * k;
                const __half *qh = Qs + r * KS + t4 * (D / 4), *qlo = Ql + r * LS + t4 * (D / 4);
                float a = 0.0f;
                for (int j = 0; j < D / 4; j++)
                    a = fmaf(__half2float(qh[j]) + __half2float(qlo[j]), m[j], a);
                a += __shfl_xor_sync(0xffffffffu, a, 1);
                a += __shfl_xor_sync(0xffffffffu, a, 2);
                gsel[k][pi] = a;
            }
        }
        float s[kKeys / 8][4];
#pragma unroll
        for (int nt = 0; nt < kKeys / 8; nt++)
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        const __half *qa = Qs + (warp * 16 + g) * KS + 2 * t4;
        const __half *ql = Ql + (warp * 16 + g) * LS + 2 * t4;
#pragma unroll 2
        for (int kk = 0; kk < KD / 16; kk++) {
            uint4 a;
            a.x = *reinterpret_cast<const uint32_t *>(qa + 16 * kk);
            a.y = *reinterpret_cast<const uint32_t *>(qa + 8 * KS + 16 * kk);
            a.z = *reinterpret_cast<const uint32_t *>(qa + 16 * kk + 8);
            a.w = *reinterpret_cast<const uint32_t *>(qa + 8 * KS + 16 * kk + 8);
            uint4 al = make_uint4(0u, 0u, 0u, 0u);
            if (kk < D / 16) {
                al.x = *reinterpret_cast<const uint32_t *>(ql + 16 * kk);
                al.y = *reinterpret_cast<const uint32_t *>(ql + 8 * LS + 16 * kk);
                al.z = *reinterpret_cast<const uint32_t *>(ql + 16 * kk + 8);
                al.w = *reinterpret_cast<const uint32_t *>(ql + 8 * LS + 16 * kk + 8);
            }
#pragma unroll
            for (int nt = 0; nt < kKeys / 8; nt++) {
                const __half *kb = Kt + (nt * 8 + g) * KS + 16 * kk + 2 * t4;
                const uint32_t b0 = *reinterpret_cast<const uint32_t *>(kb), b1 = *reinterpret_cast<const uint32_t *>(kb + 8);
                mma16816(s[nt], a, b0, b1);
                if (kk < D / 16)
                    mma16816(s[nt], al, b0, b1);
            }
        }
        /* key scales, mask, then the online softmax of rows g (k = 0) and
         * g + 8 (k = 1) */
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < kKeys / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int k = e >> 1, c = nt * 8 + 2 * t4 + (e & 1), t = t0 + c;
                const bool ok = kind == 0 ? t >= rse[k] && t < rtl[k] : kind == 1 ? t < rse[k] : t >= rtl[k] && t < rn[k];
                float gv = 0.0f; /* key centering: the gain of t's page */
#pragma unroll
                for (int pi = 0; pi < kMaxPages; pi++)
                    gv = t / PT - pbase == pi ? gsel[k][pi] : gv;
                s[nt][e] = ok ? fmaf(s[nt][e], kst[c], gv) : -INFINITY;
                mx[k] = fmaxf(mx[k], s[nt][e]);
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
        /* weights; what enters the value MMA is p times the value's scale */
#pragma unroll
        for (int nt = 0; nt < kKeys / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float w = exp2f(s[nt][e] - mu[e >> 1]);
                l_run[e >> 1] += w;
                s[nt][e] = w * vst[nt * 8 + 2 * t4 + (e & 1)];
            }
        /* O += P V': P from the score registers, V' through ldmatrix.trans */
        const int lr = (lane & 7) + ((lane >> 3) & 1) * 8, lc = (lane >> 4) * 8;
#pragma unroll
        for (int kk = 0; kk < kKeys / 16; kk++) {
            uint4 a;
            a.x = pack_f16x2(s[2 * kk][0], s[2 * kk][1]);
            a.y = pack_f16x2(s[2 * kk][2], s[2 * kk][3]);
            a.z = pack_f16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            a.w = pack_f16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            const uint32_t vrow = smem_u32(Vt + (16 * kk + lr) * VS + lc);
#pragma unroll
            for (int dn = 0; dn < D / 16; dn++) {
                uint32_t b[4];
                ldsm_x4_trans(vrow + dn * 32, b);
                mma16816(o[2 * dn], a, b[0], b[1]);
                mma16816(o[2 * dn + 1], a, b[2], b[3]);
            }
        }
    };

    /* 2. the packed tokens [a_lo, a_hi) */
    if constexpr (PIPE) {
        constexpr int U = kKeys * (D / 32); /* 32-coordinate units per tile, <= threads */
        const int ui = tid / (D / 32), j0 = 32 * (tid % (D / 32));
        const bool kt = p.ck.rotated, vt = p.cv.rotated;
        raw_unit ru;
        auto load = [&](int t0) {
            const int t = t0 + ui;
            ru.ok = tid < U && t < a_hi;
            if (!ru.ok)
                return;
            const int32_t page = p.pg.ptab[(size_t)p.seq * p.pg.max_pages_per_seq + (uint32_t)t / p.pg.page_tokens];
            uint8_t *pg = p.pg.pool + (uint64_t)page * p.pg.page_bytes;
            const uint32_t slot = (uint32_t)t % p.pg.page_tokens;
            const kvq_row kr = kvq_dev_row(&p.pg.dl, pg, 0, (uint32_t)h, slot);
            const kvq_row vr = kvq_dev_row(&p.pg.dl, pg, 1, (uint32_t)h, slot);
            raw_load(kr, kt, j0, ru.k);
            raw_load(vr, vt, j0, ru.v);
            if (kt)
                ru.kn = *kr.norm;
            if (vt)
                ru.vn = *vr.norm;
            if (QJL) {
                ru.ks = *reinterpret_cast<const uint32_t *>(kr.signs + (j0 >> 3));
                ru.kr = *kr.rnorm;
            }
        };
        auto expand = [&](int b) {
            if (tid >= U)
                return;
            uint4 *kd = reinterpret_cast<uint4 *>(kbuf(b) + ui * KS + j0);
            uint4 *vd = reinterpret_cast<uint4 *>(vbuf(b) + ui * VS + j0);
            float *kst = scales + 2 * b * kKeys, *vst = kst + kKeys;
            uint32_t pk[16], pv[16], ps[16];
            if (!ru.ok) {
#pragma unroll
                for (int i = 0; i < 16; i++)
                    pk[i] = pv[i] = ps[i] = 0u;
            } else {
                raw_expand(kt, ru.k, lut_k, pk);
                raw_expand(vt, ru.v, lut_v, pv);
                if (QJL)
                    qjl_pairs(p.alpha_k * kvq_f16_to_f32(ru.kr) * p.ck.kappa, ru.ks, ps);
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                kd[i] = make_uint4(pk[4 * i], pk[4 * i + 1], pk[4 * i + 2], pk[4 * i + 3]);
                vd[i] = make_uint4(pv[4 * i], pv[4 * i + 1], pv[4 * i + 2], pv[4 * i + 3]);
                if (QJL)
                    kd[D / 8 + i] = make_uint4(ps[4 * i], ps[4 * i + 1], ps[4 * i + 2], ps[4 * i + 3]);
            }
            if (j0 == 0) {
                kst[ui] = !ru.ok ? 0.0f : kt ? kvq_f16_to_f32(ru.kn) / p.alpha_k : 1.0f;
                vst[ui] = !ru.ok ? 0.0f : vt ? kvq_f16_to_f32(ru.vn) / p.alpha_v : 1.0f;
            }
        };
        if (a_lo < a_hi)
            load(a_lo);
        for (int t0 = a_lo, b = 0; t0 < a_hi; t0 += kKeys, b ^= 1) {
            expand(b);
            /* buffer b is complete, and every warp is past the tile that
             * last read it (two iterations ago) */
            __syncthreads();
            if (t0 + kKeys < a_hi)
                load(t0 + kKeys); /* in flight during the MMAs below */
            attend_tile(t0, 0, b);
        }
        __syncthreads(); /* the f16 rows below reuse buffer 0 */
    } else
    for (int t0 = a_lo; t0 < a_hi; t0 += kKeys) {
        if (tid < kKeys) {
            const int t = t0 + tid;
            uint8_t *pg = nullptr;
            if (t < a_hi) {
                const int32_t page = p.pg.ptab[(size_t)p.seq * p.pg.max_pages_per_seq + (uint32_t)t / p.pg.page_tokens];
                pg = p.pg.pool + (uint64_t)page * p.pg.page_bytes;
            }
            kpage[tid] = pg;
            kslot[tid] = (uint32_t)t % p.pg.page_tokens;
        }
        __syncthreads();
        for (int u = tid; u < kKeys * (D / 32); u += kWarps * 32) {
            const int i = u / (D / 32), j0 = 32 * (u % (D / 32));
            __half *kd = Ks + i * KS + j0, *vd = Vs + i * VS + j0;
            if (!kpage[i]) {
#pragma unroll
                for (int c = 0; c < 32; c += 2) {
                    *reinterpret_cast<uint32_t *>(kd + c) = 0u;
                    if (QJL)
                        *reinterpret_cast<uint32_t *>(kd + D + c) = 0u;
                    *reinterpret_cast<uint32_t *>(vd + c) = 0u;
                }
                if (j0 == 0)
                    ksc[i] = vsc[i] = 0.0f;
                continue;
            }
            const kvq_row kr = kvq_dev_row(&p.pg.dl, kpage[i], 0, (uint32_t)h, kslot[i]);
            const kvq_row vr = kvq_dev_row(&p.pg.dl, kpage[i], 1, (uint32_t)h, kslot[i]);
            decode32<D>(p.ck, cent_k, lut_k, p.alpha_k, kr, j0, kd, QJL ? kd + D : nullptr, &ksc[i]);
            decode32<D>(p.cv, cent_v, lut_v, p.alpha_v, vr, j0, vd, nullptr, &vsc[i]);
        }
        __syncthreads();
        attend_tile(t0, 0, 0);
        __syncthreads();
    }

    /* 3. the f16 rows: sinks [0, se_last), then the window [w_lo, w_hi),
     * rotated into the codecs' domain one row per warp */
    for (int kind = 1; kind <= (p.P ? 2 : 1); kind++) {
        const int lo = kind == 1 ? 0 : w_lo, hi = kind == 1 ? se_last : w_hi;
        for (int t0 = lo; t0 < hi; t0 += kKeys) {
            for (int i = warp; i < kKeys; i += kWarps) {
                const int t = t0 + i;
                const bool ok = t < hi;
                for (int pass = 0; pass < 2; pass++) { /* K, then V */
                    for (int j = lane; j < D; j += 32) {
                        float x = 0.0f;
                        if (ok && kind == 1)
                            x = __half2float(__ushort_as_half(
                                (pass ? p.ov_v : p.ov_k)[(((size_t)p.seq * p.ov_rows + t) * p.H + h) * D + j]));
                        else if (ok) /* as the ring stores it: f16 */
                            x = __half2float(__float2half_rn((pass ? p.v : p.k)[((size_t)(t - p.pos0) * p.H + h) * D + j]));
                        xw[j] = x;
                    }
                    __syncwarp();
                    /* the tile holds alpha-free rows: scale 1 */
                    if (pass) {
                        const float *y = p.cv.in_rot ? warp_rotate(p.cv.R, xw, yw, lane) : xw;
                        for (int j = lane; j < D; j += 32)
                            Vs[i * VS + j] = __float2half_rn(y[j]);
                    } else {
                        const float *y = p.ck.in_rot ? warp_rotate(p.ck.R, xw, yw, lane) : xw;
                        for (int j = lane; j < D; j += 32) {
                            const __half hi = __float2half_rn(y[j]);
                            Ks[i * KS + j] = hi;
                            if (QJL) /* no sign residual; a split key's lo half */
                                Ks[i * KS + D + j] = __float2half_rn(p.ck.qjl ? 0.0f : y[j] - __half2float(hi));
                        }
                    }
                    __syncwarp();
                }
                if (lane == 0)
                    ksc[i] = vsc[i] = 1.0f;
            }
            __syncthreads();
            attend_tile(t0, kind, 0);
            __syncthreads();
        }
    }

    /* 4. normalise, stage the rows in f32 over the query rows (no longer
     * read), rotate back (R_v^T, a warp per row) and store */
#pragma unroll
    for (int k = 0; k < 2; k++) {
        l_run[k] += __shfl_xor_sync(0xffffffffu, l_run[k], 1);
        l_run[k] += __shfl_xor_sync(0xffffffffu, l_run[k], 2);
    }
    __syncthreads(); /* every warp is past its last read of the query rows */
    float *os = reinterpret_cast<float *>(smem);
    const int r0 = warp * 16 + g;
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) {
        const int c = nt * 8 + 2 * t4;
        os[r0 * D + c] = o[nt][0] / l_run[0];
        os[r0 * D + c + 1] = o[nt][1] / l_run[0];
        os[(r0 + 8) * D + c] = o[nt][2] / l_run[1];
        os[(r0 + 8) * D + c + 1] = o[nt][3] / l_run[1];
    }
    __syncthreads();
    for (int r = warp; r < kRows; r += kWarps) {
        const int i = i0 + r / G;
        if (r >= ppt * G || i >= p.n)
            continue;
        const float *y = p.cv.in_rot ? warp_rotate_t(p.cv.R, os + r * D, yw, lane) : os + r * D;
        float *dst = p.out + ((size_t)i * p.Hq + (size_t)h * G + r % G) * D;
        for (int j = lane; j < D; j += 32)
            dst[j] = y[j];
        __syncwarp();
    }
}

template <int D, bool QJL, bool PIPE>
kvq_status launch(const prefill_params &p, cudaStream_t stream)
{
    using L = tile_layout<D, QJL, PIPE>;
    KVQ_CU_TRY(cudaFuncSetAttribute(prefill_kernel<D, QJL, PIPE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)L::bytes));
    const int ppt = L::rows / p.G;
    const dim3 grid((unsigned)((p.n + ppt - 1) / ppt), (unsigned)p.H);
    prefill_kernel<D, QJL, PIPE><<<grid, L::warps * 32, L::bytes, stream>>>(p);
    KVQ_CU_TRY(cudaGetLastError());
    return KVQ_OK;
}

/* K and V each 3-bit tq or f16: the pipelined loop (D <= 128) */
bool pipelined(const kvq_dev_codec &c)
{
    return (c.rotated && c.bits == 3) || c.type == KVQ_TYPE_F16;
}

template <int D>
kvq_status launch_d(const prefill_params &p, cudaStream_t stream)
{
    if (p.mrot && p.mean_pages > 0) {
        const dim3 g((unsigned)((p.mean_pages + 3) / 4), (unsigned)p.H);
        mean_rot_kernel<D><<<g, 128, 0, stream>>>(p.pg, p.ck, p.seq, p.mean_pages, p.mean_off, p.mean_bytes, p.mrot);
        KVQ_CU_TRY(cudaGetLastError());
    }
    if constexpr (D <= 128)
        if (pipelined(p.ck) && pipelined(p.cv))
            return p.ck.qjl ? launch<D, true, true>(p, stream) : launch<D, false, true>(p, stream);
    return kvq_prefill_split_k(p.ck) ? launch<D, true, false>(p, stream) : launch<D, false, false>(p, stream);
}

} /* namespace */

int kvq_cuda_prefill_supported(const kvq_cuda_cache *c, int n_q_heads)
{
    if (!c)
        return 0;
    const int d = c->cfg.cache.head_dim, H = c->cfg.cache.n_kv_heads;
    if (d != 32 && d != 64 && d != 96 && d != 128 && d != 256)
        return 0;
    if (n_q_heads < H || n_q_heads % H != 0 || n_q_heads / H > c->cfg.max_q_per_kv || n_q_heads / H > kMinRows)
        return 0;
    /* f32 keeps its exact path (f16 operands would round it); V with QJL
     * signs needs an S-domain accumulator this kernel does not keep */
    if (c->dk.type == KVQ_TYPE_F32 || c->dv.type == KVQ_TYPE_F32 || c->dv.qjl)
        return 0;
    /* the rotations as the encoder applies them (warp_rotate) */
    if ((c->dk.in_rot && !rot_on_gpu(c->dk.R)) || (c->dk.qjl && !rot_on_gpu(c->dk.S)) ||
        (c->dv.in_rot && !rot_on_gpu(c->dv.R)))
        return 0;
    return c->dk.gpu_encode && c->dv.gpu_encode;
}

void kvq_cuda_cache_set_prefill_ws(kvq_cuda_cache *c, kvq_cuda_prefill_ws *ws)
{
    if (c)
        c->pws = ws;
}

kvq_status kvq_cuda_cache_prefill(kvq_cuda_cache *c, int seq, size_t n, const float *k_dev, const float *v_dev,
                                  const float *q_dev, int n_q_heads, float scale, float *out_dev)
{
    if (!c || seq < 0 || seq >= c->cfg.max_seqs || n == 0 || !k_dev || !v_dev || !q_dev || !out_dev ||
        !isfinite(scale) || c->capture_stream)
        return KVQ_ERR_INVALID_ARG;
    if (!kvq_cuda_prefill_supported(c, n_q_heads))
        return KVQ_ERR_UNSUPPORTED;
    const int H = c->cfg.cache.n_kv_heads, d = c->cfg.cache.head_dim;
    const size_t P = c->layout.page_tokens, pos0 = c->len[seq];
    if (pos0 + n > (size_t)INT32_MAX / 2)
        return KVQ_ERR_INVALID_ARG;
    const size_t kvd = (size_t)H * d, qd = (size_t)n_q_heads * d;
    /* with the window, the positions up to the first page boundary go the
     * decode kernels' way (their window rows sit in the ring, which the
     * chunk's append would overwrite); the rest starts on a boundary */
    size_t head = c->ring && pos0 % P ? P - pos0 % P : 0;
    head = head < n ? head : n;
    kvq_status st = KVQ_OK;
    if (head) {
        int seqs[KVQ_CU_MAX_BATCH];
        size_t lens[KVQ_CU_MAX_BATCH];
        st = kvq_cuda_cache_append(c, seq, head, k_dev, v_dev);
        for (size_t i = 0; i < head && st == KVQ_OK; i += KVQ_CU_MAX_BATCH) {
            const size_t m = head - i < KVQ_CU_MAX_BATCH ? head - i : KVQ_CU_MAX_BATCH;
            for (size_t j = 0; j < m; j++) {
                seqs[j] = seq;
                lens[j] = pos0 + i + j + 1;
            }
            st = kvq_cuda_cache_attend_prefix(c, (int)m, seqs, lens, q_dev + i * qd, n_q_heads, scale,
                                              out_dev + i * qd, NULL);
        }
    }
    if (st == KVQ_OK && head < n)
        st = kvq_cuda_cache_append(c, seq, n - head, k_dev + head * kvd, v_dev + head * kvd);
    if (st == KVQ_OK && head < n && kvq_cu_prefill_dense_ok(c, c->pws, n_q_heads, n - head))
        st = kvq_cu_prefill_dense(c, c->pws, seq, pos0 + head, n - head, k_dev + head * kvd, v_dev + head * kvd,
                                  q_dev + head * qd, n_q_heads, scale, out_dev + head * qd);
    else if (st == KVQ_OK && head < n) {
        prefill_params p;
        memset(&p, 0, sizeof p);
        p.pg = kvq_cu_pages_of(c);
        p.ck = c->dk;
        p.cv = c->dv;
        p.q = q_dev + head * qd;
        p.k = k_dev + head * kvd;
        p.v = v_dev + head * kvd;
        p.ov_k = c->ov_k_d;
        p.ov_v = c->ov_v_d;
        p.alpha_k = c->alpha_k;
        p.alpha_v = c->alpha_v;
        if (c->dk.rotated && c->dk.bits == 3)
            p.lut_k = tq3_lut_make(c->dk.centroids, c->alpha_k);
        if (c->dv.rotated && c->dv.bits == 3)
            p.lut_v = tq3_lut_make(c->dv.centroids, c->alpha_v);
        p.out = out_dev + head * qd;
        p.seq = seq;
        p.pos0 = (int)(pos0 + head);
        p.n = (int)(n - head);
        p.H = H;
        p.Hq = n_q_heads;
        p.G = n_q_heads / H;
        p.P = c->ring ? (int)P : 0;
        p.sink_rows = c->sink_rows;
        p.ov_rows = c->ov_rows;
        p.qscale = scale * kLog2e;
        if (c->center) { /* every page the chunk's packed ranges reach: the filled ones */
            p.mrot = c->mrot_d;
            p.mean_pages = (int)(c->packed_len[seq] / P);
            p.mean_off = c->layout.mean_off;
            p.mean_bytes = c->layout.mean_bytes;
        }
        switch (d) {
        case 32: st = launch_d<32>(p, c->stream); break;
        case 64: st = launch_d<64>(p, c->stream); break;
        case 96: st = launch_d<96>(p, c->stream); break;
        case 128: st = launch_d<128>(p, c->stream); break;
        default: st = launch_d<256>(p, c->stream); break;
        }
    }
    if (st != KVQ_OK && c->len[seq] > pos0)
        kvq_cuda_cache_truncate(c, seq, pos0); /* all or nothing */
    return st;
}
