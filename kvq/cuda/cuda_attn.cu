/* cuda_attn.cu - decode attention entry point: query preparation, the
 * split merge / output rotation, and the choice of kernel: the fused one
 * (cuda_attn_fast.cu), the group kernel for other head dims
 * (cuda_group.cuh) or the scalar fp32 reference (cuda_ref.cuh). The f16
 * override rows and the key-mean gains are cuda_side.cu's.
 *
 * Queries are rotated once per (sequence, head) with dense d x d matrices
 * read off the host rotations (so every rotation kind works), and outputs
 * rotated back once; the kernels in between only ever see the rotated domain.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.cuh"
#include "cuda_prep.cuh"
#include "cuda_rot.cuh"

namespace {

using namespace kvq_cu;

constexpr float kLog2e = 1.4426950408889634f;

/* ---- kernels ----------------------------------------------------------- */

struct batch_ids {
    int seq[KVQ_CU_MAX_BATCH];
    int lo[KVQ_CU_MAX_BATCH];  /* entry b attends to the packed tokens [lo, len) */
    int len[KVQ_CU_MAX_BATCH];
};

/* y = M x for a column-major dense matrix (M[i][j] at j * d + i), thread i. */
__device__ float dense_row(const float *Mc, const float *x, int d, int i)
{
    float acc = 0.0f;
    for (int j = 0; j < d; j++)
        acc = fmaf(Mc[(size_t)j * d + i], x[j], acc);
    return acc;
}

/* Fused-kernel query block of (entry b, KV head h); blockDim = 128 = d.
 * Warp rotations run in registers (cuda_prep.cuh); dense ones take all (up
 * to 8) queries of the head through the matrix in one pass: 8 independent
 * FMA chains per thread. PDL: let the fused kernel start right away (it
 * loads its first pages, then waits for this kernel before it reads the
 * query block). */
template <bool PDL>
__global__ void prep_fast_kernel(const float *q, int Hq, int H, int G, float c, float inv_alpha_k, rot_arg rk,
                                 rot_arg sk, int k_f16, int imma, float inv_sk, uint8_t *qfrag)
{
    constexpr int D = 128;
    if constexpr (PDL)
        kvq_cu_pdl_trigger();
    __shared__ float xs[8][D];
    __shared__ float qr[8][D];
    __shared__ float sq[8][D];
    __shared__ float sig[8], tsum[8], qmax[8];
    const int i = threadIdx.x, h = blockIdx.x, b = blockIdx.y;
    const int warp = i >> 5, lane = i & 31;
    const float *qb = q + ((size_t)b * Hq + (size_t)h * G) * D;
    if (rk.mode != ROT_DENSE && sk.mode != ROT_DENSE) {
        /* each warp: queries warp and warp + 4, entirely in registers; every
         * global input (both queries, both sign tables) is loaded first, so
         * that at batch 1, after an L2 flush, the block waits for DRAM once */
        float sgr[kRot128Pre][4], sgs[kRot128Pre][4], qv[2][4];
#pragma unroll
        for (int u = 0; u < 2; u++)
#pragma unroll
            for (int k = 0; k < 4; k++)
                qv[u][k] = warp + 4 * u < G ? qb[(size_t)(warp + 4 * u) * D + 32 * k + lane] : 0.0f;
        if (rk.mode == ROT_WARP)
            rot128_load_signs(rk.fast, sgr, lane);
        if (sk.mode == ROT_WARP)
            rot128_load_signs(sk.fast, sgs, lane);
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int qi = warp + 4 * u;
            prep_query128(qv[u], qi < G, c, rk, sgr, sk, sgs, qr[qi], sq[qi], &sig[qi], &tsum[qi], &qmax[qi], lane);
        }
    } else {
        /* other rotation kinds: dense d x d products, thread i owns dimension i */
#pragma unroll
        for (int qi = 0; qi < 8; qi++)
            xs[qi][i] = qi < G ? qb[(size_t)qi * D + i] : 0.0f;
        __syncthreads();
        float acc[8];
#pragma unroll
        for (int qi = 0; qi < 8; qi++)
            acc[qi] = rk.mode == ROT_NONE ? xs[qi][i] : 0.0f;
        if (rk.mode != ROT_NONE) /* the dense matrix exists for every rotated K */
            for (int j = 0; j < D; j++) {
                const float m = rk.dense[(size_t)j * D + i];
#pragma unroll
                for (int qi = 0; qi < 8; qi++)
                    acc[qi] = fmaf(m, xs[qi][j], acc[qi]);
            }
#pragma unroll
        for (int qi = 0; qi < 8; qi++) {
            qr[qi][i] = c * acc[qi];
            acc[qi] = 0.0f;
        }
        __syncthreads();
        if (sk.mode != ROT_NONE)
            for (int j = 0; j < D; j++) {
                const float m = sk.dense[(size_t)j * D + i];
#pragma unroll
                for (int qi = 0; qi < 8; qi++)
                    acc[qi] = fmaf(m, qr[qi][j], acc[qi]);
            }
#pragma unroll
        for (int qi = 0; qi < 8; qi++)
            sq[qi][i] = acc[qi];
        __syncthreads();
        for (int qi = warp; qi < 8; qi += 4) {
            float mx = 0.0f, sum = 0.0f, xm = 0.0f;
            for (int j = lane; j < D; j += 32) {
                mx = fmaxf(mx, fabsf(sq[qi][j]));
                xm = nan_max(xm, fabsf(qr[qi][j]));
                sum += sq[qi][j];
            }
            for (int o = 16; o; o >>= 1) {
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                xm = nan_max(xm, __shfl_xor_sync(0xffffffffu, xm, o));
                sum += __shfl_xor_sync(0xffffffffu, sum, o);
            }
            if (lane == 0) {
                sig[qi] = mx > 0.0f ? mx : 1.0f;
                tsum[qi] = sum;
                qmax[qi] = xm;
            }
        }
    }
    __syncthreads();
    uint8_t *blk = qfrag + ((size_t)b * H + h) * KVQ_CU_QFRAG_BYTES;
    if (imma) {
        imma_fragments(qr, sq, sig, tsum, qmax, G, inv_sk, blk, blk + 4096, reinterpret_cast<float *>(blk + 8192));
        return;
    }
    /* Thread i works out slot i's head dimensions once and stores every
     * query's slot values (xs and qr are free again); the fragments below then
     * read them by slot, without redoing the slot arithmetic per fragment
     * word. Same products as computed in place, so the same bits. */
    {
        float dv;
        const int kd = kslot_dim(k_f16, i), sd = sslot_dim(i, &dv);
        float kv[8], sv[8];
#pragma unroll
        for (int qi = 0; qi < 8; qi++) {
            kv[qi] = qr[qi][kd] * inv_alpha_k;
            sv[qi] = sq[qi][sd] * (1.0f / sig[qi]) * dv;
        }
        __syncthreads();
#pragma unroll
        for (int qi = 0; qi < 8; qi++) {
            xs[qi][i] = kv[qi];
            qr[qi][i] = sv[qi];
        }
    }
    __syncthreads();
    uint4 *qa = reinterpret_cast<uint4 *>(blk);
    uint4 *sa = qa + 256;
    for (int item = i; item < 256; item += D) {
        const int kb = item / 32, ln = item % 32, g = ln >> 2, t = ln & 3;
        uint32_t ra[4], rs[4];
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int s = kb * 16 + 2 * t + 8 * (r >> 1);
            uint32_t hi, lo, shi, slo;
            split_f16x2(xs[g][s], xs[g][s + 1], &hi, &lo);
            split_f16x2(qr[g][s], qr[g][s + 1], &shi, &slo);
            ra[r] = (r & 1) ? lo : hi;
            rs[r] = (r & 1) ? slo : shi;
        }
        qa[item] = make_uint4(ra[0], ra[1], ra[2], ra[3]);
        sa[item] = make_uint4(rs[0], rs[1], rs[2], rs[3]);
    }
    if (i < 8) {
        float *cst = reinterpret_cast<float *>(blk + 8192);
        cst[i] = i < G ? 2.0f * sig[i] : 0.0f;
        cst[8 + i] = i < G ? -tsum[i] : 0.0f;
    }
}

/* A prep kernel launch, left to kvq_cu_fast_launch (kvq_cu_fast_params.prep):
 * only it knows whether the integer-score kernel prepares its queries itself. */
struct prep_call {
    const float *q;
    int Hq, H, G, nb;
    float c, inv_alpha_k;
    rot_arg rk, sk;
    int k_f16, imma;
    float inv_sk;
    uint8_t *qfrag;
    bool pdl;
    cudaStream_t stream;
    kvq_cuda_step *step;
};

kvq_status launch_prep(void *ctx)
{
    const prep_call &a = *static_cast<const prep_call *>(ctx);
    auto prep = a.pdl ? prep_fast_kernel<true> : prep_fast_kernel<false>;
    return kvq_cu_launch(a.step, false, prep, dim3((unsigned)a.H, (unsigned)a.nb), dim3(128), 0, a.stream, a.q, a.Hq,
                         a.H, a.G, a.c, a.inv_alpha_k, a.rk, a.sk, a.k_f16, a.imma, a.inv_sk, a.qfrag);
}

__device__ float block_reduce128(float v, float *red, bool is_max)
{
    for (int o = 16; o; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = is_max ? fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3])) : (red[0] + red[1]) + (red[2] + red[3]);
    __syncthreads();
    return v;
}

/* Merges the splits of one query (grid: query, KV head, entry) and rotates
 * back; blockDim = 128. Every partial this thread needs first (m and l of
 * splits i and i + 128, O of the first kPre splits) is loaded before any of
 * it is used: on the critical path after the fused kernel, each round of
 * dependent L2 loads costs, and at batch 1 (~66 splits) the old order took
 * seven. Split weights go to shared memory for the O sum, which adds the
 * splits in order as before (same results to the bit). */
/* The packed part's normalised output y (normaliser L at reference M) and
 * the override rows' unnormalised partial x = (O[d], m, l) as one softmax:
 * (y L b^(M - M') + O b^(m - M')) / (L b^(M - M') + l b^(m - M')). */
__device__ float merge_override(float y, float L, float M, const float *x, int i, int d, bool base2)
{
    /* A non-finite query makes L, y or l NaN and the result must stay NaN:
     * so no "> 0" tests. An entry without packed tokens has L == 0 and y =
     * 0/0, which the weight 0 drops. */
    const float m = x[d], l = x[d + 1];
    if (m == -INFINITY)
        return y; /* no override row (or a NaN query): the packed result as it is */
    const float Mx = fmaxf(M, m);
    const float wp = L == 0.0f ? 0.0f : L * (base2 ? exp2f(M - Mx) : expf(M - Mx));
    const float wf = base2 ? exp2f(m - Mx) : expf(m - Mx);
    return ((wp == 0.0f ? 0.0f : y * wp) + x[i] * wf) / (wp + l * wf);
}

/* The four warps' online softmaxes of a block as one: each warp's (m, l)
 * goes to ml, then every thread gets M, the warps' weights and L (base 2
 * or e). */
template <bool BASE2>
__device__ __forceinline__ float warps_merge(float *ml, int warp, int lane, float m, float l, float wgt[4], float *L)
{
    if (lane == 0) {
        ml[warp] = m;
        ml[4 + warp] = l;
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < 4; w++)
        M = fmaxf(M, ml[w]);
    *L = 0.0f;
    for (int w = 0; w < 4; w++) {
        wgt[w] = ml[w] == -INFINITY ? 0.0f : (BASE2 ? exp2f(ml[w] - M) : expf(ml[w] - M));
        *L += ml[4 + w] * wgt[w];
    }
    return M;
}

template <bool PDL> /* launched early: wait for the fused kernel's partials */
__global__ void __launch_bounds__(128, 8) /* 8 blocks per SM: one wave up to 32 x 8 x 4 queries */
finalize_kernel(const float *part, int n_splits, int Hq, int H, int G, int v_f16, rot_arg rv,
                                float inv_alpha_v, const float *xtra, float *out)
{
    static_assert(KVQ_CU_MAX_SPLITS <= 256, "finalize_kernel: two splits' m and l per thread");
    constexpr int D = 128, kPre = 16;
    /* the output rotation's signs do not depend on the fused kernel: load
     * them before waiting for it, off the critical path */
    float sg[kRot128Pre][4];
    if (rv.mode == ROT_WARP && threadIdx.x < 32)
        rot128_load_signs(rv.fast, sg, threadIdx.x);
    if constexpr (PDL)
        kvq_cu_pdl_wait();
    extern __shared__ float wts[]; /* n_splits */
    __shared__ float od[D];
    __shared__ float red[4];
    const int i = threadIdx.x, qi = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const size_t stride = (size_t)G * (D + 2);
    const float *base = part + ((size_t)b * H + h) * n_splits * stride;
    const float *ob = base + qi * D + i;
    float m[2], l[2], x[kPre];
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int s = i + k * D;
        m[k] = s < n_splits ? base[s * stride + G * D + qi] : -INFINITY;
        l[k] = s < n_splits ? base[s * stride + G * D + G + qi] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kPre; u++)
        x[u] = u < n_splits ? ob[(size_t)u * stride] : 0.0f;
    const float M = block_reduce128(fmaxf(m[0], m[1]), red, true);
    float L = 0.0f;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int s = i + k * D;
        const float w = m[k] == -INFINITY ? 0.0f : exp2f(m[k] - M);
        if (s < n_splits)
            wts[s] = w;
        L += w * l[k];
    }
    L = block_reduce128(L, red, false); /* its barriers also publish wts */
    float o = 0.0f;
#pragma unroll
    for (int u = 0; u < kPre; u++)
        if (u < n_splits)
            o = fmaf(x[u], wts[u], o);
    /* more splits: 16 loads in flight at a time */
    int s = kPre;
    for (; s + 16 <= n_splits; s += 16) {
        float y[16];
#pragma unroll
        for (int u = 0; u < 16; u++)
            y[u] = ob[(size_t)(s + u) * stride];
#pragma unroll
        for (int u = 0; u < 16; u++)
            o = fmaf(y[u], wts[s + u], o);
    }
    for (; s < n_splits; s++)
        o = fmaf(ob[(size_t)s * stride], wts[s], o);
    od[vslot_dim(v_f16, i)] = o * (inv_alpha_v / L); /* no packed token: 0/0, dropped by merge_override */
    __syncthreads();
    if (rv.mode == ROT_WARP && i < 32) {
        float v[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            v[k] = od[32 * k + i];
        rot128_apply_t(rv.fast, sg, v, i);
#pragma unroll
        for (int k = 0; k < 4; k++)
            od[32 * k + i] = v[k];
    }
    __syncthreads();
    float y = od[i];
    if (rv.mode == ROT_DENSE) {
        y = 0.0f;
        for (int j = 0; j < D; j++)
            y = fmaf(rv.dense[(size_t)j * D + i], od[j], y);
    }
    const size_t row = (size_t)b * Hq + (size_t)h * G + qi;
    out[row * D + i] = xtra ? merge_override(y, L, M, xtra + row * (D + 2), i, D, true) : y;
}

struct ref_params {
    kvq_dev_pages pg;
    kvq_dev_codec ck, cv;
    const float *qprep;
    const float *rv; /* row-major R_v, NULL for baseline V */
    const float *sv; /* row-major S_v, NULL unless V carries QJL signs (tqBj values) */
    float *out;
    const float *xtra; /* f16 override partials (ov_kernel, natural units), NULL: none */
    float *part;       /* n_splits > 1: [entry][Hq][n_splits][2d + 2] partials (o, o_S, m, l) */
    const float *gain; /* key centering: page scores per (entry, query head) (gain_kernel), NULL: none */
    size_t gain_stride;
    int Hq, G, d, n_splits;
    batch_ids ids;
};

} /* namespace */

#include "cuda_group.cuh"
#include "cuda_ref.cuh"

namespace {

/* The group kernel's instantiation for d, K type kt, V type vt; NULL where
 * it does not apply. */
using group_fn = void (*)(ref_params);
template <int D>
group_fn group_pick(int kt, int vt)
{
#define KVQ_GROUP_ROW(K) \
    {group::group_kernel<D, K, group::V_TQ3>, group::group_kernel<D, K, group::V_F16>, \
     group::group_kernel<D, K, group::V_CB>, group::group_kernel<D, K, group::V_BL>}
    static const group_fn t[group::N_KT][group::N_VT] = {KVQ_GROUP_ROW(group::K_TQ3), KVQ_GROUP_ROW(group::K_TQ3J),
                                                         KVQ_GROUP_ROW(group::K_F16), KVQ_GROUP_ROW(group::K_TQ4),
                                                         KVQ_GROUP_ROW(group::K_CB),  KVQ_GROUP_ROW(group::K_BL)};
#undef KVQ_GROUP_ROW
    return kt >= 0 && vt >= 0 ? t[kt][vt] : NULL;
}

/* The group kernel's way of reading a codec's rows; -1: it does not read
 * them (QJL signs other than tq3j keys'). */
static int group_ktype(const kvq_dev_codec &k)
{
    if (k.type == KVQ_TYPE_F16)
        return group::K_F16;
    if (!k.rotated)
        return group::K_BL;
    if (k.qjl)
        return k.type == KVQ_TYPE_TQ3J ? group::K_TQ3J : -1;
    return k.bits == 3 ? group::K_TQ3 : k.bits == 4 ? group::K_TQ4 : group::K_CB;
}

static int group_vtype(const kvq_dev_codec &v)
{
    if (v.type == KVQ_TYPE_F16)
        return group::V_F16;
    if (!v.rotated)
        return group::V_BL;
    if (v.qjl)
        return -1;
    return v.bits == 3 ? group::V_TQ3 : group::V_CB;
}

group_fn group_of(const kvq_cuda_cache *c, int G)
{
    const int kt = group_ktype(c->dk), vt = group_vtype(c->dv);
    if (G > group::kMaxG || !c->ref_part_d)
        return NULL;
    switch (c->cfg.cache.head_dim) {
    case 64:
        return group_pick<64>(kt, vt);
    case 96:
        return group_pick<96>(kt, vt);
    case 128: /* where the fused kernel does not apply: codebooks other than 3 bits, f32, blocks */
        return kt == group::K_TQ4 || kt == group::K_CB || kt == group::K_BL || vt == group::V_CB || vt == group::V_BL
                   ? group_pick<128>(kt, vt)
                   : NULL;
    case 256:
        return group_pick<256>(kt, vt);
    default:
        return NULL;
    }
}

int fast_ktype(int t)
{
    return t == KVQ_TYPE_TQ3J ? KVQ_CU_KT_TQ3J : t == KVQ_TYPE_TQ3 ? KVQ_CU_KT_TQ3 : t == KVQ_TYPE_F16 ? KVQ_CU_KT_F16 : -1;
}

int fast_vtype(int t)
{
    return t == KVQ_TYPE_TQ3 ? KVQ_CU_VT_TQ3 : t == KVQ_TYPE_F16 ? KVQ_CU_VT_F16 : -1;
}

/* The reference kernel's splits (ref_splits): blocks per SM aimed at, and
 * the fewest tokens worth a split of their own. */
constexpr int kRefBlocksPerSm = 16;
constexpr int kRefMinTokens = 128;

int batch_cap(const kvq_cuda_cache *c)
{
    return c->cfg.max_seqs < KVQ_CU_MAX_BATCH ? c->cfg.max_seqs : KVQ_CU_MAX_BATCH;
}

} /* namespace */

/* ---- workspace ----------------------------------------------------------- */

kvq_status kvq_cu_attn_init(kvq_cuda_cache *c)
{
    const int d = c->cfg.cache.head_dim, H = c->cfg.cache.n_kv_heads, G = c->cfg.max_q_per_kv;
    const size_t nb = (size_t)batch_cap(c);
    int dev = 0;
    KVQ_CU_TRY(cudaGetDevice(&dev));
    KVQ_CU_TRY(cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, dev));
    KVQ_CU_TRY(cudaDeviceGetAttribute(&c->cc_major, cudaDevAttrComputeCapabilityMajor, dev));
    KVQ_CU_TRY(cudaMalloc(&c->qprep_d, nb * H * G * 2 * (size_t)d * sizeof(float)));
    if (c->ov_rows)
        KVQ_CU_TRY(cudaMalloc(&c->xtra_d, nb * H * G * ((size_t)d + 2) * sizeof(float)));
    if (c->center) {
        KVQ_CU_TRY(cudaMalloc(&c->gain_d, nb * H * G * c->max_pages_per_seq * sizeof(float)));
        KVQ_CU_TRY(cudaMalloc(&c->mrot_d, c->max_pages_per_seq * H * (size_t)d * sizeof(float)));
    }
    /* f16 tables of the levels (the fused kernel: tq3; the prefill kernel:
     * any tq type) */
    c->alpha_k = c->dk.rotated && c->dk.levels <= KVQ_CUDA_TQ_MAX_LEVELS ? codebook_alpha(c->dk.centroids, c->dk.levels)
                                                                          : 1.0f;
    c->alpha_v = c->dv.rotated && c->dv.levels <= KVQ_CUDA_TQ_MAX_LEVELS ? codebook_alpha(c->dv.centroids, c->dv.levels)
                                                                          : 1.0f;
    /* the reference kernel's splits, where AUTO takes it (any type the
     * fused kernel does not read): enough for kRefBlocksPerSm blocks per SM
     * at small batches (larger ones fill the GPU without splits) */
    const bool fused = d == 128 && fast_ktype(c->dk.type) >= 0 && fast_vtype(c->dv.type) >= 0 && G <= 8;
    c->ref_part_entries = fused ? 0 : (size_t)kRefBlocksPerSm * (size_t)c->n_sm;
    if (c->ref_part_entries)
        KVQ_CU_TRY(cudaMalloc(&c->ref_part_d, c->ref_part_entries * (2 * (size_t)d + 2) * sizeof(float)));
    if (d != 128)
        return KVQ_OK; /* the fused kernel's buffers are for d = 128 only */
    KVQ_CU_TRY(cudaMalloc(&c->qfrag_d, nb * H * KVQ_CU_QFRAG_BYTES));
    /* room for up to eight waves of 4 blocks per SM plus one split per pair
     * (the split rule in kvq_cu_fast_launch takes kWaves = 3), and at
     * least 4 splits per pair */
    const size_t waves = (size_t)32 * (size_t)c->n_sm + nb * H;
    c->part_entries = nb * H * 4 > waves ? nb * H * 4 : waves;
    KVQ_CU_TRY(cudaMalloc(&c->part_d, c->part_entries * G * (size_t)(d + 2) * sizeof(float)));
    c->int_scale_k = c->dk.type == KVQ_TYPE_TQ3 || c->dk.type == KVQ_TYPE_TQ3J ? codebook_int_scale(c->dk.centroids, 8)
                                                                                : 1.0f;
    return KVQ_OK;
}

void kvq_cu_attn_free(kvq_cuda_cache *c)
{
    cudaFree(c->qprep_d);
    cudaFree(c->xtra_d);
    cudaFree(c->gain_d);
    cudaFree(c->mrot_d);
    cudaFree(c->qfrag_d);
    cudaFree(c->part_d);
    cudaFree(c->ref_part_d);
}

int kvq_cuda_fast_supported(const kvq_cuda_cache *c, int n_q_heads)
{
    if (!c || c->cfg.cache.head_dim != 128 || !c->qfrag_d)
        return 0;
    const int H = c->cfg.cache.n_kv_heads;
    if (n_q_heads < H || n_q_heads % H != 0 || n_q_heads / H > 8 || n_q_heads / H > c->cfg.max_q_per_kv)
        return 0;
    return fast_ktype(c->dk.type) >= 0 && fast_vtype(c->dv.type) >= 0;
}

/* ---- attend -------------------------------------------------------------- */

/* Which of the first n tokens of seq a reader takes from f16 rows: [0, *se)
 * and [*tl, n); the packed pages serve [*se, *tl). As kvq_cache_f16_view:
 * the recent window is the last, partly filled page, less the rows the ring
 * no longer holds (ring_lo). */
static void override_view(const kvq_cuda_cache *c, int seq, size_t n, int *se, int *tl)
{
    const size_t P = c->layout.page_tokens, sinks = (size_t)c->sink_rows;
    const size_t s = n < sinks ? n : sinks;
    size_t t = n;
    if (c->ring && n % P) {
        t = n - n % P;
        t = t > c->ring_lo[seq] ? t : c->ring_lo[seq];
        t = t < n ? t : n;
    }
    *se = (int)s;
    *tl = (int)(t > s ? t : s);
}

/* Splits of the reference kernel's token ranges [lo, hi): requested (> 0),
 * or enough blocks for kRefBlocksPerSm per SM with at least kRefMinTokens
 * tokens a split; at most what ref_part_d holds. */
static int ref_splits(const kvq_cuda_cache *c, int nb, int Hq, const int *lo, const int *hi, int requested)
{
    int longest = 0;
    for (int i = 0; i < nb; i++)
        longest = hi[i] - lo[i] > longest ? hi[i] - lo[i] : longest;
    const int blocks = nb * Hq, room = (int)(c->ref_part_entries / (size_t)blocks); /* 0: no buffer */
    int s = requested;
    if (s <= 0) {
        s = (kRefBlocksPerSm * c->n_sm + blocks - 1) / blocks;
        const int by_len = (longest + kRefMinTokens - 1) / kRefMinTokens;
        s = s < by_len ? s : by_len;
    }
    s = s < room ? s : room;
    return s > 1 ? s : 1;
}

/* The packed range [lo[i], hi[i]) of entry i on the fused kernel, then
 * its split merge (merged with the override partials xtra, if any). */
static kvq_status attend_fused(kvq_cuda_cache *c, int nb, const int *seqs, const int *lo, const int *hi,
                               const float *q, int Hq, float scale, float *out, const float *xtra, int n_splits,
                               bool gains_done)
{
    const int H = c->cfg.cache.n_kv_heads, G = Hq / H;
    kvq_cu_fast_params p;
    memset(&p, 0, sizeof p);
    p.pg = kvq_cu_pages_of(c);
    p.qfrag = c->qfrag_d;
    p.part = c->part_d;
    p.H = H;
    p.G = G;
    /* integer key scores (tq keys, G <= 4); that kernel waits for the prep
     * kernel itself, so only it is launched to overlap it (programmatic
     * dependent launch, sm_90 or newer) */
    const int imma = G <= 4 && c->dk.type != KVQ_TYPE_F16;
    p.pdl = imma && c->cc_major >= 9;
    p.kappa = c->dk.kappa;
    if (c->dk.type != KVQ_TYPE_F16) {
        p.lut_k = tq3_lut_make(c->dk.centroids, c->alpha_k);
        p.ilut_k = tq3_ilut_make(c->dk.centroids, c->int_scale_k);
    }
    if (c->dv.type != KVQ_TYPE_F16)
        p.lut_v = tq3_lut_make(c->dv.centroids, c->alpha_v);
    for (int i = 0; i < nb; i++) {
        p.seq[i] = seqs[i];
        p.lo[i] = lo[i];
        p.len[i] = hi[i];
    }
    if (c->center) {
        if (!gains_done)
            KVQ_CU_RET(kvq_cu_key_gains(c, nb, seqs, lo, hi, q, Hq, scale, 1));
        p.gain = c->gain_d;
        p.gain_stride = (int)c->max_pages_per_seq;
        p.Hq = Hq;
        const int segs = (int)(c->layout.page_tokens / 16);
        p.gain_shift = (segs & (segs - 1)) ? -1 : __builtin_ctz((unsigned)segs);
    }
    prep_call pc;
    pc.q = q;
    pc.Hq = Hq;
    pc.H = H;
    pc.G = G;
    pc.nb = nb;
    pc.c = scale * kLog2e;
    pc.inv_alpha_k = 1.0f / c->alpha_k;
    pc.rk = rot_arg_of(c->dk.in_rot, c->dk.R, c->rk_dense);
    pc.sk = rot_arg_of(c->dk.qjl, c->dk.S, c->sk_dense);
    pc.k_f16 = c->dk.type == KVQ_TYPE_F16;
    pc.imma = imma;
    pc.inv_sk = 1.0f / c->int_scale_k;
    pc.qfrag = c->qfrag_d;
    pc.pdl = p.pdl;
    pc.stream = c->stream;
    pc.step = c->step;
    p.prep = launch_prep;
    p.prep_ctx = &pc;
    p.step = c->step;
    if (imma && pc.rk.mode != ROT_DENSE && pc.sk.mode != ROT_DENSE) {
        /* the integer-score kernel may prepare its queries itself
         * (kvq_cu_fast_launch decides) */
        p.q = q;
        p.Hq = Hq;
        p.qscale = pc.c;
        p.inv_sk = pc.inv_sk;
        p.rk = pc.rk;
        p.sk = pc.sk;
    }
    int max_splits = (int)(c->part_entries / ((size_t)nb * H));
    max_splits = max_splits < KVQ_CU_MAX_SPLITS ? max_splits : KVQ_CU_MAX_SPLITS;
    kvq_status st = kvq_cu_fast_launch(&p, fast_ktype(c->dk.type), fast_vtype(c->dv.type), nb, n_splits,
                                       max_splits, c->n_sm, c->stream);
    if (st != KVQ_OK)
        return st;
    const dim3 fgrid((unsigned)G, (unsigned)H, (unsigned)nb);
    const size_t fsmem = (size_t)p.n_splits * sizeof(float);
    const rot_arg rv = rot_arg_of(c->dv.in_rot, c->dv.R, c->rv_dense);
    const int v_f16 = c->dv.type == KVQ_TYPE_F16;
    const bool pdl = p.pdl_used;
    return kvq_cu_launch(c->step, pdl, pdl ? finalize_kernel<true> : finalize_kernel<false>, fgrid, dim3(128), fsmem,
                         c->stream, c->part_d, p.n_splits, Hq, H, G, v_f16, rv, 1.0f / c->alpha_v, xtra, out);
}

/* The reference and group kernels' split merge. */
static kvq_status merge_ref(kvq_cuda_cache *c, int nb, int Hq, int d, const ref_params &rp)
{
    return kvq_cu_launch(c->step, false, ref::ref_merge_kernel, dim3((unsigned)Hq, (unsigned)nb), dim3(128),
                         3 * (size_t)d * sizeof(float), c->stream, rp);
}

/* The same on CUDA cores: the group kernel where it applies (and use_ref
 * is not set), else the reference kernel; both split the range over blocks
 * and merge the splits. */
static kvq_status attend_cores(kvq_cuda_cache *c, int nb, const int *seqs, const int *lo, const int *hi,
                               const float *q, int Hq, float scale, float *out, const float *xtra, int use_ref,
                               int n_splits)
{
    const int H = c->cfg.cache.n_kv_heads, G = Hq / H, d = c->cfg.cache.head_dim;
    KVQ_CU_RET(kvq_cu_launch(c->step, false, ref::prep_ref_kernel, dim3((unsigned)Hq, (unsigned)nb), dim3(128),
                             2 * (size_t)d * sizeof(float), c->stream, q, Hq, d, scale,
                             c->dk.in_rot ? c->rk_dense : NULL, c->dk.qjl ? c->sk_dense : NULL, c->qprep_d));
    ref_params rp;
    memset(&rp, 0, sizeof rp);
    rp.pg = kvq_cu_pages_of(c);
    rp.ck = c->dk;
    rp.cv = c->dv;
    rp.qprep = c->qprep_d;
    rp.rv = c->dv.in_rot ? c->rv_dense : NULL;
    rp.sv = c->dv.qjl ? c->sv_dense : NULL;
    rp.out = out;
    rp.xtra = xtra;
    rp.Hq = Hq;
    rp.G = G;
    rp.d = d;
    for (int i = 0; i < nb; i++) {
        rp.ids.seq[i] = seqs[i];
        rp.ids.lo[i] = lo[i];
        rp.ids.len[i] = hi[i];
    }
    if (c->center) { /* the cores' scores are in natural units */
        KVQ_CU_RET(kvq_cu_key_gains(c, nb, seqs, lo, hi, q, Hq, scale, 0));
        rp.gain = c->gain_d;
        rp.gain_stride = c->max_pages_per_seq;
    }
    rp.part = c->ref_part_d;
    /* the group kernel writes a partial per query head and split: the
     * buffer holds at least one split of every head of the batch */
    const int group_room = (int)(c->ref_part_entries / ((size_t)nb * Hq));
    const group_fn gk = use_ref || group_room < 1 ? NULL : group_of(c, G);
    if (gk) { /* a block per KV head and split */
        const int S = ref_splits(c, nb, H, lo, hi, n_splits);
        rp.n_splits = S < group_room ? S : group_room;
        const size_t gsmem = ((size_t)G * 2 * d + 4 * (size_t)G * (d + 2) + 2 * KVQ_CUDA_LEVELS_CAP) * sizeof(float);
        if (gsmem > 48 * 1024)
            KVQ_CU_TRY(cudaFuncSetAttribute(gk, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gsmem));
        KVQ_CU_RET(kvq_cu_launch(c->step, false, gk, dim3((unsigned)H, (unsigned)nb, (unsigned)rp.n_splits), dim3(128),
                                 gsmem, c->stream, rp));
        return merge_ref(c, nb, Hq, d, rp);
    }
    rp.n_splits = ref_splits(c, nb, Hq, lo, hi, n_splits);
    const size_t smem = (10 * (size_t)d + 8) * sizeof(float);
    if (smem > 48 * 1024)
        KVQ_CU_TRY(cudaFuncSetAttribute(ref::ref_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    KVQ_CU_RET(kvq_cu_launch(c->step, false, ref::ref_kernel, dim3((unsigned)Hq, (unsigned)nb, (unsigned)rp.n_splits),
                             dim3(128), smem, c->stream, rp));
    return rp.n_splits > 1 ? merge_ref(c, nb, Hq, d, rp) : KVQ_OK;
}

/* Entry i attends to the first lens[i] tokens of seqs[i] (lens NULL: all). */
static kvq_status attend_chunk(kvq_cuda_cache *c, int nb, const int *seqs, const size_t *lens, const float *q,
                               int Hq, float scale, float *out, int use_fast, int use_ref, int n_splits)
{
    /* the packed range [lo, hi) of each entry; the rest from f16 rows first */
    int n[KVQ_CU_MAX_BATCH], lo[KVQ_CU_MAX_BATCH], hi[KVQ_CU_MAX_BATCH];
    for (int i = 0; i < nb; i++) {
        n[i] = (int)(lens ? lens[i] : c->len[seqs[i]]);
        override_view(c, seqs[i], (size_t)n[i], &lo[i], &hi[i]);
    }
    const bool overrides = c->ov_rows > 0, side = overrides && use_fast && c->center;
    if (overrides) {
        const kvq_status st = kvq_cu_attend_overrides(c, nb, seqs, n, lo, hi, q, Hq, scale, use_fast != 0, side);
        if (st != KVQ_OK)
            return st;
    }
    const float *xtra = overrides ? c->xtra_d : NULL;
    return use_fast ? attend_fused(c, nb, seqs, lo, hi, q, Hq, scale, out, xtra, n_splits, side)
                    : attend_cores(c, nb, seqs, lo, hi, q, Hq, scale, out, xtra, use_ref, n_splits);
}

/* Both entry points: lens NULL attends to whole sequences (at most max_seqs
 * entries), else entry i to the first lens[i] tokens of seqs[i]. */
static kvq_status attend(kvq_cuda_cache *c, int n_seqs, const int *seqs, const size_t *lens, const float *q_dev,
                         int n_q_heads, float scale, float *out_dev, const struct kvq_cuda_attn_opts *opts)
{
    if (!c || n_seqs < 1 || !seqs || !q_dev || !out_dev || (!lens && n_seqs > c->cfg.max_seqs))
        return KVQ_ERR_INVALID_ARG;
    const int H = c->cfg.cache.n_kv_heads;
    if (n_q_heads < H || n_q_heads % H != 0 || n_q_heads / H > c->cfg.max_q_per_kv || !isfinite(scale))
        return KVQ_ERR_INVALID_ARG;
    for (int i = 0; i < n_seqs; i++) {
        if (seqs[i] < 0 || seqs[i] >= c->cfg.max_seqs || c->len[seqs[i]] == 0 || c->len[seqs[i]] > INT32_MAX / 2)
            return KVQ_ERR_INVALID_ARG;
        if (lens && (lens[i] == 0 || lens[i] > c->len[seqs[i]]))
            return KVQ_ERR_INVALID_ARG;
    }
    /* as an int: a C caller may pass any value */
    const int kern = opts ? (int)opts->kernel : KVQ_CUDA_KERNEL_AUTO;
    const int fast_ok = kvq_cuda_fast_supported(c, n_q_heads);
    if (kern != KVQ_CUDA_KERNEL_AUTO && kern != KVQ_CUDA_KERNEL_FUSED && kern != KVQ_CUDA_KERNEL_REF)
        return KVQ_ERR_INVALID_ARG;
    if (kern == KVQ_CUDA_KERNEL_FUSED && !fast_ok)
        return KVQ_ERR_UNSUPPORTED;
    const int use_fast = kern != KVQ_CUDA_KERNEL_REF && fast_ok;
    const int n_splits = opts ? opts->n_splits : 0;
    const size_t row = (size_t)n_q_heads * c->cfg.cache.head_dim;
    const int cap = batch_cap(c);
    for (int off = 0; off < n_seqs; off += cap) {
        const int nb = n_seqs - off < cap ? n_seqs - off : cap;
        kvq_status st = attend_chunk(c, nb, seqs + off, lens ? lens + off : NULL, q_dev + (size_t)off * row,
                                     n_q_heads, scale, out_dev + (size_t)off * row, use_fast,
                                     kern == KVQ_CUDA_KERNEL_REF, n_splits);
        if (st != KVQ_OK)
            return st;
    }
    return KVQ_OK;
}

kvq_status kvq_cuda_cache_attend(kvq_cuda_cache *c, int n_seqs, const int *seqs, const float *q_dev,
                                 int n_q_heads, float scale, float *out_dev, const struct kvq_cuda_attn_opts *opts)
{
    return attend(c, n_seqs, seqs, NULL, q_dev, n_q_heads, scale, out_dev, opts);
}

kvq_status kvq_cuda_cache_attend_prefix(kvq_cuda_cache *c, int n, const int *seqs, const size_t *lens,
                                        const float *q_dev, int n_q_heads, float scale, float *out_dev,
                                        const struct kvq_cuda_attn_opts *opts)
{
    if (!lens)
        return KVQ_ERR_INVALID_ARG;
    return attend(c, n, seqs, lens, q_dev, n_q_heads, scale, out_dev, opts);
}
