/* cuda_group.cuh - decode attention on CUDA cores where the fused kernel does
 * not apply: head dims 64, 96, 256 for the fused kernel's types (K tq3j, tq3
 * or f16; V tq3 or f16), and at those dims and 128 the codebooks the fused
 * kernel does not read (it reads 3-bit codes only): tq4 keys, and keys and
 * values of any other tq type without QJL signs (tq1, tq2, tq5, tq6, tq8),
 * of f32 and of llama.cpp's block layouts, plain and rotated. Included by
 * cuda_attn.cu after ref_params.
 *
 * The reference kernel gives a warp one token at a time: a dot product
 * spread over the lanes, two warp reductions and an exp per token and query
 * head, one block per query head, so each token is decoded G times. Here a
 * block takes one KV head and all G query heads of its group over a split
 * of the tokens: a lane scores its own token against the G queries (its
 * row's 3-bit codes read as three words per 32 codes, kvq_layout.h's device
 * order), a warp runs one online softmax per query head over 32 tokens at a
 * time, and then the lanes switch to dimensions to accumulate the 32 value
 * rows, every value decoded once for the G heads. The block's four warps
 * are merged in shared memory into one partial per query head in
 * ref_merge_kernel's format, which finishes as for the reference kernel.
 * fp32 throughout, in natural-exp units.
 */
#ifndef KVQ_CUDA_GROUP_CUH
#define KVQ_CUDA_GROUP_CUH

namespace group {

constexpr int kMaxG = 8;
/* K_CB, V_CB: any codebook without QJL signs, codes in stream order read
 * one at a time (code_stream); K_BL, V_BL: f32 and llama.cpp's blocks, of
 * the row or of R x, an element at a time (baseline_elem) */
enum { K_TQ3 = 0, K_TQ3J = 1, K_F16 = 2, K_TQ4 = 3, K_CB = 4, K_BL = 5, N_KT };
enum { V_TQ3 = 0, V_F16 = 1, V_CB = 2, V_BL = 3, N_VT };

/* The 12 bytes of 32 3-bit codes (device order) as three words: a row's
 * codes start 4-byte aligned (the code section follows the 2-byte norms of
 * 16 or 32 tokens; rows are 3d/8 bytes, d a multiple of 32). */
__device__ __forceinline__ void load_words(const uint8_t *p, uint32_t w[3])
{
    const uint32_t *q = reinterpret_cast<const uint32_t *>(p);
#pragma unroll
    for (int k = 0; k < 3; k++)
        w[k] = q[k];
}

/* The 16 bytes of 32 4-bit codes (stream order: code c in nibble c & 7 of
 * word c >> 3), 4-byte aligned as load_words's. */
__device__ __forceinline__ void load_words4(const uint8_t *p, uint32_t w[4])
{
    const uint32_t *q = reinterpret_cast<const uint32_t *>(p);
#pragma unroll
    for (int k = 0; k < 4; k++)
        w[k] = q[k];
}

/* Element j of an f16 row (2-byte aligned). */
__device__ __forceinline__ float f16_elem(const uint8_t *row, int j)
{
    return kvq_f16_to_f32(reinterpret_cast<const uint16_t *>(row)[j]);
}

/* Code c (0..31) of a 32-code group: codes c < 24 are the low 3 bits of
 * nibble c & 7 of word c >> 3; code 24 + i has bit k in bit 3 of nibble i of
 * word k (kvq_dev_bitpos). */
__device__ __forceinline__ unsigned group_code(const uint32_t w[3], int c)
{
    if (c < 24)
        return (w[c >> 3] >> (4 * (c & 7))) & 7u;
    const int s = 4 * (c - 24) + 3;
    return ((w[0] >> s) & 1u) | (((w[1] >> s) & 1u) << 1) | (((w[2] >> s) & 1u) << 2);
}

/* a[g] += q_g[j .. j + 3] . (k0, k1, k2, k3) for the G queries (rows of 2D
 * floats): one 16-byte shared load of each query, the same address in every
 * lane, per four products. */
template <int D>
__device__ __forceinline__ void acc4(float (&a)[kMaxG], const float *qs, int G, int j, float k0, float k1, float k2,
                                     float k3)
{
#pragma unroll
    for (int g = 0; g < kMaxG; g++)
        if (g < G) {
            const float4 q = *reinterpret_cast<const float4 *>(qs + g * 2 * D + j);
            a[g] = fmaf(q.w, k3, fmaf(q.z, k2, fmaf(q.y, k1, fmaf(q.x, k0, a[g]))));
        }
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float lane_sum(float v)
{
    for (int o = 16; o; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Grid (KV head, entry, split), 128 threads. Shared memory: the G queries
 * (2D floats each: R q and S R q, scaled), 4 x G x (D + 2) floats for
 * merging the warps, the levels of K and V (KVQ_CUDA_LEVELS_CAP each). */
template <int D, int KT, int VT>
__global__ void __launch_bounds__(128) group_kernel(const __grid_constant__ ref_params p)
{
    constexpr int ND = D / 32;
    extern __shared__ float sh[];
    const int h = blockIdx.x, b = blockIdx.y, G = p.G, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int seq = p.ids.seq[b], len = p.ids.len[b], lo = p.ids.lo[b], S = p.n_splits;
    const int per = (len - lo + S - 1) / S, t0 = lo + (int)blockIdx.z * per;
    const int t1 = t0 + per < len ? t0 + per : len;
    float *qs = sh, *mrg = sh + G * 2 * D, *ck = mrg + 4 * G * (D + 2), *cv = ck + KVQ_CUDA_LEVELS_CAP;
    const float *src = p.qprep + ((size_t)b * p.Hq + (size_t)h * G) * 2 * D; /* the group's heads are consecutive */
    for (int i = threadIdx.x; i < G * 2 * D; i += blockDim.x)
        qs[i] = src[i];
    /* the levels, looked up by code */
    for (int i = threadIdx.x; i < p.ck.levels; i += blockDim.x)
        ck[i] = kvq_cu_centroid(p.ck, (unsigned)i);
    for (int i = threadIdx.x; i < p.cv.levels; i += blockDim.x)
        cv[i] = kvq_cu_centroid(p.cv, (unsigned)i);
    __syncthreads();
    const kvq_dev_pages &pg = p.pg;
    float m[kMaxG], l[kMaxG], acc[kMaxG][ND];
#pragma unroll
    for (int g = 0; g < kMaxG; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int k = 0; k < ND; k++)
            acc[g][k] = 0.0f;
    }
    for (int base = t0 + warp * 32; base < t1; base += 128) {
        const int tok = base + lane, n_here = t1 - base < 32 ? t1 - base : 32;
        const bool valid = lane < n_here;
        float sc[kMaxG];
        const uint8_t *vcodes = NULL;
        float nv = 1.0f;
        if (valid) {
            const int32_t page = pg.ptab[(size_t)seq * pg.max_pages_per_seq + (uint32_t)tok / pg.page_tokens];
            uint8_t *pbase = pg.pool + (uint64_t)page * pg.page_bytes;
            const uint32_t slot = (uint32_t)tok % pg.page_tokens;
            const kvq_row kr = kvq_dev_row(&pg.dl, pbase, 0, (uint32_t)h, slot);
            const kvq_row vr = kvq_dev_row(&pg.dl, pbase, 1, (uint32_t)h, slot);
            vcodes = vr.codes;
            if (VT == V_TQ3 || VT == V_CB)
                nv = kvq_f16_to_f32(*vr.norm);
            float a[kMaxG], z[kMaxG];
#pragma unroll
            for (int g = 0; g < kMaxG; g++)
                a[g] = z[g] = 0.0f;
            if (KT == K_F16) {
                for (int j = 0; j < D; j += 4)
                    acc4<D>(a, qs, G, j, f16_elem(kr.codes, j), f16_elem(kr.codes, j + 1),
                            f16_elem(kr.codes, j + 2), f16_elem(kr.codes, j + 3));
            } else if (KT == K_BL) {
                for (int j = 0; j < D; j += 4)
                    acc4<D>(a, qs, G, j, baseline_elem(p.ck.type, kr.codes, j), baseline_elem(p.ck.type, kr.codes, j + 1),
                            baseline_elem(p.ck.type, kr.codes, j + 2), baseline_elem(p.ck.type, kr.codes, j + 3));
            } else if (KT == K_CB) {
                const int bits = p.ck.bits;
                for (int j = 0; j < D; j += 4)
                    acc4<D>(a, qs, G, j, ck[code_stream(kr.codes, bits, j)], ck[code_stream(kr.codes, bits, j + 1)],
                            ck[code_stream(kr.codes, bits, j + 2)], ck[code_stream(kr.codes, bits, j + 3)]);
            } else {
                for (int grp = 0; grp < ND; grp++) {
                    uint32_t w[4];
                    if (KT == K_TQ4)
                        load_words4(kr.codes + 16 * grp, w);
                    else
                        load_words(kr.codes + 12 * grp, w);
#pragma unroll 2
                    for (int c = 0; c < 32; c += 4) {
                        const int j = 32 * grp + c;
                        if (KT == K_TQ4) { /* four nibbles of one word */
                            const uint32_t wc = w[c >> 3] >> (4 * (c & 7));
                            acc4<D>(a, qs, G, j, ck[wc & 15u], ck[(wc >> 4) & 15u], ck[(wc >> 8) & 15u],
                                    ck[(wc >> 12) & 15u]);
                        } else {
                            acc4<D>(a, qs, G, j, ck[group_code(w, c)], ck[group_code(w, c + 1)],
                                    ck[group_code(w, c + 2)], ck[group_code(w, c + 3)]);
                        }
                    }
                }
                if (KT == K_TQ3J)
                    for (int j = 0; j < D; j += 4) {
                        const unsigned bits = kr.signs[j >> 3] >> (j & 7);
                        acc4<D>(z, qs + D, G, j, bits & 1u ? 1.0f : -1.0f, bits & 2u ? 1.0f : -1.0f,
                                bits & 4u ? 1.0f : -1.0f, bits & 8u ? 1.0f : -1.0f); /* the S-domain half */
                    }
            }
            const float nk = KT == K_F16 || KT == K_BL ? 1.0f : kvq_f16_to_f32(*kr.norm);
            const float gam = KT == K_TQ3J ? kvq_f16_to_f32(*kr.rnorm) * p.ck.kappa : 0.0f;
#pragma unroll
            for (int g = 0; g < kMaxG; g++)
                sc[g] = KT == K_F16 || KT == K_BL ? a[g] : nk * fmaf(gam, z[g], a[g]);
            if (p.gain) { /* key centering: the page's q.m~ */
                const float *gp = p.gain + ((size_t)b * p.Hq + (size_t)h * G) * p.gain_stride +
                                  (uint32_t)tok / pg.page_tokens;
#pragma unroll
                for (int g = 0; g < kMaxG; g++)
                    if (g < G)
                        sc[g] += gp[(size_t)g * p.gain_stride];
            }
        } else {
#pragma unroll
            for (int g = 0; g < kMaxG; g++)
                sc[g] = -INFINITY;
        }
        /* one online softmax per head over the 32 tokens */
        float pw[kMaxG];
#pragma unroll
        for (int g = 0; g < kMaxG; g++) {
            if (g >= G)
                continue;
            const float mx = warp_max(sc[g]);
            const float m_new = fmaxf(m[g], mx);
            const float alpha = m[g] == -INFINITY ? 0.0f : expf(m[g] - m_new);
            pw[g] = valid ? expf(sc[g] - m_new) : 0.0f;
            l[g] = l[g] * alpha + lane_sum(pw[g]);
            m[g] = m_new;
#pragma unroll
            for (int k = 0; k < ND; k++)
                acc[g][k] *= alpha;
        }
        /* the lanes switch to dimensions: value row tt, element lane + 32 k */
        for (int tt = 0; tt < n_here; tt++) {
            const uint8_t *vr = reinterpret_cast<const uint8_t *>(
                __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(vcodes), tt));
            const float nvt = __shfl_sync(0xffffffffu, nv, tt);
            float pg_w[kMaxG];
#pragma unroll
            for (int g = 0; g < kMaxG; g++)
                pg_w[g] = g < G ? __shfl_sync(0xffffffffu, pw[g], tt) * nvt : 0.0f;
#pragma unroll
            for (int k = 0; k < ND; k++) {
                float val;
                if (VT == V_F16) {
                    val = f16_elem(vr, lane + 32 * k);
                } else if (VT == V_CB) {
                    val = cv[code_stream(vr, p.cv.bits, lane + 32 * k)];
                } else if (VT == V_BL) {
                    val = baseline_elem(p.cv.type, vr, lane + 32 * k);
                } else {
                    uint32_t w[3];
                    load_words(vr + 12 * k, w);
                    val = cv[group_code(w, lane)];
                }
#pragma unroll
                for (int g = 0; g < kMaxG; g++)
                    if (g < G)
                        acc[g][k] = fmaf(pg_w[g], val, acc[g][k]);
            }
        }
    }
    /* the four warps as one partial per head */
    const int stride = D + 2;
#pragma unroll
    for (int g = 0; g < kMaxG; g++) {
        if (g >= G)
            continue;
        float *my = mrg + (warp * G + g) * stride;
#pragma unroll
        for (int k = 0; k < ND; k++)
            my[lane + 32 * k] = acc[g][k];
        if (lane == 0) {
            my[D] = m[g];
            my[D + 1] = l[g];
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < G * D; e += blockDim.x) {
        const int g = e / D, j = e % D;
        float M = -INFINITY;
        for (int w = 0; w < 4; w++)
            M = fmaxf(M, mrg[(w * G + g) * stride + D]);
        float o = 0.0f, L = 0.0f;
        for (int w = 0; w < 4; w++) {
            const float *pw4 = mrg + (w * G + g) * stride;
            const float wt = pw4[D] == -INFINITY ? 0.0f : expf(pw4[D] - M);
            o += pw4[j] * wt;
            L += pw4[D + 1] * wt;
        }
        float *dst = p.part + (((size_t)b * p.Hq + (size_t)h * G + g) * S + blockIdx.z) * (2 * (size_t)D + 2);
        dst[j] = o;
        dst[D + j] = 0.0f; /* no sign residual: V has no QJL here */
        if (j == 0) {
            dst[2 * D] = M;
            dst[2 * D + 1] = L;
        }
    }
}

} /* namespace group */

#endif /* KVQ_CUDA_GROUP_CUH */
