/* cuda_side.cu - what a decode attention reads besides the packed pages:
 * the f16 override rows (sinks and the recent window) of each entry,
 * attended into unnormalised partials that the split merge folds in, and
 * with key centering the page gains (each query against each page's key
 * mean) that the fused kernel adds to its scores. With both, one launch
 * (side_kernel): each alone was a small latency-bound grid on the decode
 * step's critical path.
 */
#include <string.h>

#include "cuda_internal.cuh"

namespace {

using namespace kvq_cu;

constexpr float kLog2e = 1.4426950408889634f;

/* The f16 override rows of a batch (recent window and sinks, kvq_cache.h):
 * entry b reads tokens [0, se) and [tl, n) of its sequence from f16 rows
 * (row t for t < sink_rows, else sink_rows + t % ring), the rest packed. */
struct ov_params {
    const uint16_t *k, *v; /* [max_seqs][rows_per_seq][H][d] f16 bits */
    const float *q;        /* [nb][Hq][d], unrotated */
    float *xtra;           /* out: [nb][Hq][d + 2], unnormalised O, m, l */
    int rows_per_seq, sink_rows, ring, H, Hq, G, d, nb;
    float c;               /* score = c q.k, in the exponent base's units */
    int seq[KVQ_CU_MAX_BATCH], se[KVQ_CU_MAX_BATCH], tl[KVQ_CU_MAX_BATCH], n[KVQ_CU_MAX_BATCH];
};

/* Key centering: gain[(b * Hq + h * G + g) * stride + page] = c q.m~ for the
 * G queries of KV head h and every page of entry b's packed range
 * [lo, len); blockIdx (h, b, z), a thread per page (a warp per page was
 * bound by the latency of its three dependent loads). A thread's mean
 * words (d / 4 of them, DMAX / 4 at most; DMAX 0: any d, read as used) are
 * all loaded before the first is used: read as the loop used them, a
 * page's 32 loads at d = 128 went one after another (ncu on an H200, 8B
 * shape: 10.2 -> 7.6 us a layer at 4K, 11.6 -> 9.1 us at 128K). */
struct gain_params {
    const float *q;
    int Hq, G, d;
    kvq_dev_pages pg;
    struct {
        int seq[KVQ_CU_MAX_BATCH], lo[KVQ_CU_MAX_BATCH], len[KVQ_CU_MAX_BATCH]; /* packed range [lo, len) */
    } ids;
    uint64_t mean_off;
    uint32_t mean_bytes;
    float c;
    float *gain;
    size_t stride;
    int nz; /* blocks per (head, entry) */
};

template <int DMAX>
__device__ __forceinline__ void gain_block(const gain_params &gp, int h, int b, int z)
{
    constexpr int kG = 8;                    /* query heads kept in registers at once */
    extern __shared__ __align__(16) float qs[]; /* [G][d] */
    const float *q = gp.q;
    const int Hq = gp.Hq, G = gp.G, d = gp.d;
    const kvq_dev_pages &pg = gp.pg;
    const uint64_t mean_off = gp.mean_off;
    const uint32_t mean_bytes = gp.mean_bytes;
    const float c = gp.c;
    float *gain = gp.gain;
    const size_t stride = gp.stride;
    const int lo = gp.ids.lo[b], hi = gp.ids.len[b], P = (int)pg.page_tokens;
    if (hi <= lo)
        return;
    for (int i = threadIdx.x; i < G * d; i += blockDim.x)
        qs[i] = q[((size_t)b * Hq + (size_t)h * G) * d + i];
    __syncthreads();
    for (int page = lo / P + (int)(z * blockDim.x + threadIdx.x); page < (hi + P - 1) / P;
         page += (int)(gp.nz * blockDim.x)) {
        const int32_t phys = pg.ptab[(size_t)gp.ids.seq[b] * pg.max_pages_per_seq + (size_t)page];
        /* 2-byte aligned: the section is 16-aligned, a block 2 + d / 2 bytes (d even) */
        const uint16_t *w = reinterpret_cast<const uint16_t *>(pg.pool + (uint64_t)phys * pg.page_bytes + mean_off +
                                                               (uint64_t)h * mean_bytes);
        constexpr int NW4 = DMAX > 0 ? DMAX / 4 : 1;
        unsigned words[NW4];
#pragma unroll
        for (int k = 0; k < NW4; k++)
            words[k] = DMAX > 0 && 4 * k < d ? w[1 + k] : 0u;
        const float sc = c * kvq_key_mean_scale(reinterpret_cast<const uint8_t *>(w));
        /* each code word read once for up to kG queries; the queries' four
         * coordinates in one shared load (the same address in every lane) */
        for (int g0 = 0; g0 < G; g0 += kG) {
            float a[kG];
#pragma unroll
            for (int g = 0; g < kG; g++)
                a[g] = 0.0f;
#pragma unroll
            for (int k = 0; k < (DMAX > 0 ? NW4 : d / 4); k++) {
                if (4 * k >= d)
                    break;
                const int j = 4 * k;
                const unsigned u = DMAX > 0 ? words[k] : w[1 + k]; /* codes j .. j + 3, a nibble each */
                const float c0 = (float)((int)(u & 15u) - 8), c1 = (float)((int)(u >> 4 & 15u) - 8);
                const float c2 = (float)((int)(u >> 8 & 15u) - 8), c3 = (float)((int)(u >> 12) - 8);
#pragma unroll
                for (int g = 0; g < kG; g++)
                    if (g0 + g < G) {
                        const float4 x = *reinterpret_cast<const float4 *>(qs + (g0 + g) * d + j);
                        a[g] = fmaf(x.w, c3, fmaf(x.z, c2, fmaf(x.y, c1, fmaf(x.x, c0, a[g]))));
                    }
            }
#pragma unroll
            for (int g = 0; g < kG; g++)
                if (g0 + g < G)
                    gain[((size_t)b * Hq + (size_t)h * G + g0 + g) * stride + (size_t)page] = sc * a[g];
        }
    }
}

template <int DMAX>
__global__ void gain_kernel(const __grid_constant__ gain_params gp)
{
    gain_block<DMAX>(gp, blockIdx.x, blockIdx.y, blockIdx.z);
}

/* Attention of one (query head, entry) over its f16 override rows, fp32,
 * into an unnormalised partial (O, m, l). At most rows_per_seq = sink_rows +
 * ring rows, so the scores fit in shared memory and the three passes
 * (scores, weights, weighted values) each issue all their loads at once: a
 * row-at-a-time online softmax was a chain of dependent loads per row
 * (ncu on an H200, 8B shape, a full ring: 20 us a layer). */
template <bool BASE2>
__device__ __forceinline__ void ov_block(const ov_params &p, int hq, int b)
{
    constexpr int kRows = 4; /* rows a warp scores at once */
    extern __shared__ __align__(16) float sh[];
    const int d = p.d, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nw = blockDim.x >> 5;
    const int h = hq / p.G, seq = p.seq[b], se = p.se[b], tl = p.tl[b], n = p.n[b];
    float *qv = sh, *s = sh + d, *red = s + p.rows_per_seq; /* red: [32] */
    int *ro = reinterpret_cast<int *>(red + 32);           /* [rows_per_seq]: row r's storage row */
    const float *src = p.q + ((size_t)b * p.Hq + hq) * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        qv[i] = src[i] * p.c;
    __syncthreads();
    const int n_rows = se + (n - tl);
    auto row_of = [&](int r) {
        const int t = r < se ? r : tl + (r - se);
        return t < p.sink_rows ? t : p.sink_rows + t % p.ring;
    };
    auto off_of = [&](int row) { return (((size_t)seq * p.rows_per_seq + row) * p.H + h) * d; };
    /* scores: each warp kRows rows at a time, their loads in flight together */
    for (int r0 = warp * kRows; r0 < n_rows; r0 += nw * kRows) {
        float a[kRows];
#pragma unroll
        for (int u = 0; u < kRows; u++) {
            a[u] = 0.0f;
            if (r0 + u < n_rows) {
                const __half *kr = reinterpret_cast<const __half *>(p.k + off_of(row_of(r0 + u)));
                for (int j = lane; j < d; j += 32)
                    a[u] = fmaf(qv[j], __half2float(kr[j]), a[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < kRows; u++) {
            for (int o = 16; o; o >>= 1)
                a[u] += __shfl_xor_sync(0xffffffffu, a[u], o);
            if (lane == 0 && r0 + u < n_rows) {
                s[r0 + u] = a[u];
                ro[r0 + u] = row_of(r0 + u);
            }
        }
    }
    __syncthreads();
    /* the maximum, then the weights in place and their sum, in a fixed order */
    float m = -INFINITY;
    for (int r = threadIdx.x; r < n_rows; r += blockDim.x)
        m = fmaxf(m, s[r]);
    for (int o = 16; o; o >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0)
        red[warp] = m;
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < nw; w++)
        M = fmaxf(M, red[w]);
    for (int r = threadIdx.x; r < n_rows; r += blockDim.x)
        s[r] = M == -INFINITY ? 0.0f : (BASE2 ? exp2f(s[r] - M) : expf(s[r] - M));
    __syncthreads();
    float *dst = p.xtra + ((size_t)b * p.Hq + hq) * (d + 2);
    if (warp == 0) {
        float l = 0.0f;
        for (int r = lane; r < n_rows; r += 32)
            l += s[r];
        for (int o = 16; o; o >>= 1)
            l += __shfl_xor_sync(0xffffffffu, l, o);
        if (lane == 0) {
            dst[d] = M;
            dst[d + 1] = M == -INFINITY ? 0.0f : l;
        }
    }
    /* O = sum of w_r v_r: warp w takes rows w, w + nw, ..., its lanes the
     * coordinates, kU rows' loads in flight at once; the warps' sums are
     * then added in warp order (a fixed order: the same bits every run) */
    constexpr int kU = 4, kQ = 4;
    float *part = reinterpret_cast<float *>(ro + p.rows_per_seq); /* [nw][d] */
    for (int j0 = 0; j0 < d; j0 += 32 * kQ) {
        float acc[kQ];
#pragma unroll
        for (int q = 0; q < kQ; q++)
            acc[q] = 0.0f;
        int r = warp;
        for (; r + (kU - 1) * nw < n_rows; r += kU * nw) {
            float vv[kU][kQ];
#pragma unroll
            for (int u = 0; u < kU; u++) {
                const __half *vr = reinterpret_cast<const __half *>(p.v + off_of(ro[r + u * nw]));
#pragma unroll
                for (int q = 0; q < kQ; q++) {
                    const int j = j0 + lane + 32 * q;
                    vv[u][q] = j < d ? __half2float(vr[j]) : 0.0f;
                }
            }
#pragma unroll
            for (int u = 0; u < kU; u++)
#pragma unroll
                for (int q = 0; q < kQ; q++)
                    acc[q] = fmaf(s[r + u * nw], vv[u][q], acc[q]);
        }
        for (; r < n_rows; r += nw) {
            const __half *vr = reinterpret_cast<const __half *>(p.v + off_of(ro[r]));
#pragma unroll
            for (int q = 0; q < kQ; q++) {
                const int j = j0 + lane + 32 * q;
                if (j < d)
                    acc[q] = fmaf(s[r], __half2float(vr[j]), acc[q]);
            }
        }
#pragma unroll
        for (int q = 0; q < kQ; q++) {
            const int j = j0 + lane + 32 * q;
            if (j < d)
                part[warp * d + j] = acc[q];
        }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < nw; w++)
            o += part[w * d + j];
        dst[j] = o;
    }
}

template <bool BASE2>
__global__ void ov_kernel(const __grid_constant__ ov_params p)
{
    ov_block<BASE2>(p, blockIdx.x, blockIdx.y);
}

/* The override rows' attention and the page gains in one launch (key
 * centering with the window: both read only the queries and what the
 * append wrote, and each alone was a small latency-bound grid): blocks
 * [0, Hq nb) as ov_kernel, the rest as gain_kernel. */
struct side_params {
    ov_params ov;
    gain_params gain;
};

template <int DMAX>
__global__ void side_kernel(const __grid_constant__ side_params sp)
{
    const int n_ov = sp.ov.Hq * sp.ov.nb;
    const int i = (int)blockIdx.x;
    if (i < n_ov) {
        ov_block<true>(sp.ov, i % sp.ov.Hq, i / sp.ov.Hq);
        return;
    }
    const int j = i - n_ov, H = sp.gain.Hq / sp.gain.G;
    gain_block<DMAX>(sp.gain, j % H, (j / H) % sp.ov.nb, j / (H * sp.ov.nb));
}

} /* namespace */

/* Key centering: the page gains of entries 0..nb over their packed ranges
 * [lo, hi), scores scaled by c (gain_kernel). A fixed grid for a batch size,
 * so that a step graph's node keeps its shape. */
static gain_params gain_params_of(const kvq_cuda_cache *c, int nb, const int *seqs, const int *lo, const int *hi,
                                  const float *q, int Hq, float scale)
{
    gain_params gp;
    memset(&gp, 0, sizeof gp);
    for (int i = 0; i < nb; i++) {
        gp.ids.seq[i] = seqs[i];
        gp.ids.lo[i] = lo[i];
        gp.ids.len[i] = hi[i];
    }
    gp.q = q;
    gp.Hq = Hq;
    gp.G = Hq / c->cfg.cache.n_kv_heads;
    gp.d = c->cfg.cache.head_dim;
    gp.pg = kvq_cu_pages_of(c);
    gp.mean_off = (uint64_t)c->layout.mean_off;
    gp.mean_bytes = c->layout.mean_bytes;
    gp.c = scale;
    gp.gain = c->gain_d;
    gp.stride = c->max_pages_per_seq;
    gp.nz = (int)((c->max_pages_per_seq + 127) / 128); /* every page of the longest sequence */
    return gp;
}

static kvq_status launch_gain(kvq_cuda_cache *c, const gain_params &gp, int nb)
{
    const int H = c->cfg.cache.n_kv_heads, d = gp.d;
    return kvq_cu_launch(c->step, false, d <= 128 ? gain_kernel<128> : d <= 256 ? gain_kernel<256> : gain_kernel<0>,
                         dim3((unsigned)H, (unsigned)nb, (unsigned)gp.nz), dim3(128),
                         (size_t)gp.G * d * sizeof(float), c->stream, gp);
}

/* The attention over the override rows of entries 0..nb (into xtra). */
static ov_params ov_params_of(const kvq_cuda_cache *c, int nb, const int *seqs, const int *n, const int *se,
                              const int *tl, const float *q, int Hq, float scale, bool base2)
{
    ov_params op;
    memset(&op, 0, sizeof op);
    op.k = c->ov_k_d;
    op.v = c->ov_v_d;
    op.q = q;
    op.xtra = c->xtra_d;
    op.rows_per_seq = c->ov_rows;
    op.sink_rows = c->sink_rows;
    op.ring = c->ring ? c->ring : 1;
    op.H = c->cfg.cache.n_kv_heads;
    op.Hq = Hq;
    op.G = Hq / op.H;
    op.d = c->cfg.cache.head_dim;
    op.nb = nb;
    op.c = base2 ? scale * kLog2e : scale;
    for (int i = 0; i < nb; i++) {
        op.seq[i] = seqs[i];
        op.n[i] = n[i];
        op.se[i] = se[i];
        op.tl[i] = tl[i];
    }
    return op;
}

/* Threads of an override-rows block: 8 warps, so that a full ring's rows
 * take few rounds of loads. */
constexpr int kOvThreads = 256;

static size_t ov_smem(const ov_params &op)
{
    return ((size_t)op.d * (1 + kOvThreads / 32) + 2 * (size_t)op.rows_per_seq + 32) * sizeof(float);
}

static kvq_status attend_overrides(kvq_cuda_cache *c, const ov_params &op, bool base2)
{
    return kvq_cu_launch(c->step, false, base2 ? ov_kernel<true> : ov_kernel<false>, dim3((unsigned)op.Hq, (unsigned)op.nb),
                         dim3(kOvThreads), ov_smem(op), c->stream, op);
}

/* Both in one launch (side_kernel): the fused kernel with centred keys and
 * override rows. */
static kvq_status attend_side(kvq_cuda_cache *c, const ov_params &op, const gain_params &gp)
{
    side_params sp;
    sp.ov = op;
    sp.gain = gp;
    const int H = c->cfg.cache.n_kv_heads, d = gp.d;
    const size_t gsmem = (size_t)gp.G * d * sizeof(float), osmem = ov_smem(op);
    const unsigned blocks = (unsigned)(op.Hq * op.nb + H * op.nb * gp.nz);
    return kvq_cu_launch(c->step, false, d <= 128 ? side_kernel<128> : d <= 256 ? side_kernel<256> : side_kernel<0>,
                         dim3(blocks), dim3(kOvThreads), gsmem > osmem ? gsmem : osmem, c->stream, sp);
}

kvq_status kvq_cu_key_gains(kvq_cuda_cache *c, int nb, const int *seqs, const int *lo, const int *hi, const float *q,
                            int Hq, float scale, int base2)
{
    return launch_gain(c, gain_params_of(c, nb, seqs, lo, hi, q, Hq, base2 ? scale * kLog2e : scale), nb);
}

kvq_status kvq_cu_attend_overrides(kvq_cuda_cache *c, int nb, const int *seqs, const int *n, const int *lo,
                                   const int *hi, const float *q, int Hq, float scale, int base2, int with_gains)
{
    const ov_params op = ov_params_of(c, nb, seqs, n, lo, hi, q, Hq, scale, base2 != 0);
    if (!with_gains || !base2) { /* side_kernel scores in base 2, the fused kernel's units */
        const kvq_status st = attend_overrides(c, op, base2 != 0);
        return st == KVQ_OK && with_gains ? kvq_cu_key_gains(c, nb, seqs, lo, hi, q, Hq, scale, base2) : st;
    }
    return attend_side(c, op, gain_params_of(c, nb, seqs, lo, hi, q, Hq, base2 ? scale * kLog2e : scale));
}
