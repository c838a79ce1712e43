/* cuda_ref.cuh - the reference decode attention: scalar fp32, any type,
 * any head dim, any group size; what KVQ_CUDA_KERNEL_REF runs and AUTO
 * takes where neither the fused nor the group kernel applies, and the
 * split merge both the reference and the group kernel (cuda_group.cuh)
 * finish with. Included by cuda_attn.cu after ref_params and
 * merge_override. */
#ifndef KVQ_CUDA_REF_CUH
#define KVQ_CUDA_REF_CUH

namespace ref {

using namespace kvq_cu;

/* Reference query prep: qprep[entry][hq] = (scale * R q, S (scale * R q)). */
__global__ void prep_ref_kernel(const float *q, int Hq, int d, float scale, const float *rk, const float *sk,
                                float *qprep)
{
    extern __shared__ float sh[];
    float *xs = sh, *qr = sh + d;
    const int hq = blockIdx.x, b = blockIdx.y;
    const float *x = q + ((size_t)b * Hq + hq) * d;
    float *dst = qprep + ((size_t)b * Hq + hq) * 2 * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        xs[i] = x[i];
    __syncthreads();
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        qr[i] = scale * (rk ? dense_row(rk, xs, d, i) : xs[i]);
        dst[i] = qr[i];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        dst[d + i] = sk ? dense_row(sk, qr, d, i) : 0.0f;
}


__device__ float warp_sum(float v)
{
    for (int o = 16; o; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The output of (query head hq, entry b) from its normalised rotated-domain
 * output qv[0, d) and sign residual qv[d, 2d) (tqBj values), the packed
 * part's softmax L and M: S_v and R_v applied, merged with the override
 * rows. tmp: d floats. Block-wide. */
__device__ void ref_finish(const ref_params &p, float *qv, float *tmp, float L, float M, int b, int hq)
{
    const int d = p.d;
    if (p.sv) {
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            float y = 0.0f;
            for (int j = 0; j < d; j++)
                y = fmaf(p.sv[(size_t)j * d + i], qv[d + j], y);
            tmp[i] = qv[i] + y;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < d; i += blockDim.x)
            qv[i] = tmp[i];
        __syncthreads();
    }
    float *dst = p.out + ((size_t)b * p.Hq + hq) * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float y = qv[i];
        if (p.rv) {
            y = 0.0f;
            for (int j = 0; j < d; j++)
                y = fmaf(p.rv[(size_t)j * d + i], qv[j], y);
        }
        dst[i] = p.xtra ? merge_override(y, L, M, p.xtra + ((size_t)b * p.Hq + hq) * (d + 2), i, d, false) : y;
    }
}

/* One block per (query head, entry, split), 4 warps striding over the
 * split's tokens, fp32 throughout, one token at a time: simple on purpose.
 * One split writes the output; several write partials for ref_merge_kernel
 * (at batch 1 a block per query head alone left most of the GPU idle). */
__global__ void ref_kernel(const __grid_constant__ ref_params p)
{
    extern __shared__ float sh[];
    const int d = p.d, hq = blockIdx.x, b = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = hq / p.G, seq = p.ids.seq[b], len = p.ids.len[b];
    float *qv = sh;            /* 2d */
    float *acc = sh + 2 * d;   /* 4 x d */
    float *ml = acc + 4 * d;   /* m[4], l[4] */
    float *accs = ml + 8;      /* 4 x d: tqBj values' sign residual, S domain */
    const float *src = p.qprep + ((size_t)b * p.Hq + hq) * 2 * d;
    for (int i = threadIdx.x; i < 2 * d; i += blockDim.x)
        qv[i] = src[i];
    float *my = acc + warp * d, *mys = accs + warp * d;
    for (int j = lane; j < d; j += 32)
        my[j] = 0.0f;
    for (int j = lane; p.sv && j < d; j += 32)
        mys[j] = 0.0f;
    __syncthreads();
    const kvq_dev_pages &pg = p.pg;
    float m = -INFINITY, l = 0.0f;
    const int lo = p.ids.lo[b], per = (len - lo + p.n_splits - 1) / p.n_splits;
    const int t0 = lo + (int)blockIdx.z * per, t1 = t0 + per < len ? t0 + per : len;
    for (int tok = t0 + warp; tok < t1; tok += 4) {
        const int32_t page = pg.ptab[(size_t)seq * pg.max_pages_per_seq + (uint32_t)tok / pg.page_tokens];
        const uint32_t slot = (uint32_t)tok % pg.page_tokens;
        uint8_t *base = pg.pool + (uint64_t)page * pg.page_bytes;
        const kvq_row kr = kvq_dev_row(&pg.dl, base, 0, (uint32_t)h, slot);
        const kvq_row vr = kvq_dev_row(&pg.dl, base, 1, (uint32_t)h, slot);
        const uint8_t *kcodes = kr.codes;
        float s;
        if (p.ck.rotated) {
            float a = 0.0f, z = 0.0f;
            for (int j = lane; j < d; j += 32)
                a = fmaf(qv[j], kvq_cu_centroid(p.ck, code_get(kcodes, p.ck.bits, d, j)), a);
            if (p.ck.qjl) {
                const uint8_t *sg = kr.signs;
                for (int j = lane; j < d; j += 32)
                    z += ((sg[j >> 3] >> (j & 7)) & 1) ? qv[d + j] : -qv[d + j];
            }
            a = warp_sum(a);
            z = warp_sum(z);
            const float n = kvq_f16_to_f32(*kr.norm);
            const float gam = p.ck.qjl ? kvq_f16_to_f32(*kr.rnorm) * p.ck.kappa : 0.0f;
            s = n * fmaf(gam, z, a);
        } else {
            float a = 0.0f;
            for (int j = lane; j < d; j += 32)
                a = fmaf(qv[j], baseline_elem(p.ck.type, kcodes, j), a);
            s = warp_sum(a);
        }
        if (p.gain) /* key centering: the page's q.m~ */
            s += p.gain[((size_t)b * p.Hq + hq) * p.gain_stride + (uint32_t)tok / pg.page_tokens];
        const float m_new = fmaxf(m, s);
        const float alpha = m == -INFINITY ? 0.0f : expf(m - m_new);
        const float pw = expf(s - m_new);
        l = l * alpha + pw;
        m = m_new;
        const uint8_t *vcodes = vr.codes;
        const float nv = p.cv.rotated ? kvq_f16_to_f32(*vr.norm) : 1.0f;
        for (int j = lane; j < d; j += 32) {
            const float val = p.cv.rotated ? nv * kvq_cu_centroid(p.cv, code_get(vcodes, p.cv.bits, d, j))
                                           : baseline_elem(p.cv.type, vcodes, j);
            my[j] = fmaf(pw, val, my[j] * alpha);
        }
        if (p.sv) { /* value = n R^T (c[idx] + g S^T signs), g = rnorm * kappa */
            const float gv = nv * kvq_f16_to_f32(*vr.rnorm) * p.cv.kappa;
            const uint8_t *sg = vr.signs;
            for (int j = lane; j < d; j += 32) {
                const float t = ((sg[j >> 3] >> (j & 7)) & 1) ? gv : -gv;
                mys[j] = fmaf(pw, t, mys[j] * alpha);
            }
        }
    }
    float wgt[4], L;
    const float M = warps_merge<false>(ml, warp, lane, m, l, wgt, &L);
    if (p.n_splits > 1) { /* an unnormalised partial */
        float *dst = p.part + (((size_t)b * p.Hq + hq) * p.n_splits + blockIdx.z) * (2 * (size_t)d + 2);
        for (int j = threadIdx.x; j < d; j += blockDim.x) {
            float o = 0.0f, os = 0.0f;
            for (int w = 0; w < 4; w++) {
                o += acc[w * d + j] * wgt[w];
                if (p.sv)
                    os += accs[w * d + j] * wgt[w];
            }
            dst[j] = o;
            dst[d + j] = os;
        }
        if (threadIdx.x == 0) {
            dst[2 * d] = M;
            dst[2 * d + 1] = L;
        }
        return;
    }
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float o = 0.0f, os = 0.0f;
        for (int w = 0; w < 4; w++)
            o += acc[w * d + j] * wgt[w];
        for (int w = 0; p.sv && w < 4; w++)
            os += accs[w * d + j] * wgt[w];
        qv[j] = o / L;      /* reuse: the rotated-domain output (no packed token: 0/0, see merge_override) */
        qv[d + j] = os / L; /* its sign residual, S domain */
    }
    __syncthreads();
    ref_finish(p, qv, acc, L, M, b, hq);
}

/* One block per (query head, entry): the splits' partials as one softmax,
 * then ref_finish. */
__global__ void ref_merge_kernel(const __grid_constant__ ref_params p)
{
    extern __shared__ float sh[];
    const int d = p.d, hq = blockIdx.x, b = blockIdx.y, S = p.n_splits;
    float *qv = sh, *tmp = sh + 2 * d;
    const float *part = p.part + ((size_t)b * p.Hq + hq) * S * (2 * (size_t)d + 2);
    const size_t stride = 2 * (size_t)d + 2;
    float M = -INFINITY, L = 0.0f;
    for (int s = 0; s < S; s++)
        M = fmaxf(M, part[s * stride + 2 * d]);
    for (int s = 0; s < S; s++) {
        const float m = part[s * stride + 2 * d];
        L += m == -INFINITY ? 0.0f : part[s * stride + 2 * d + 1] * expf(m - M);
    }
    for (int j = threadIdx.x; j < 2 * d; j += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < S; s++) {
            const float m = part[s * stride + 2 * d];
            if (m != -INFINITY)
                o += part[s * stride + j] * expf(m - M);
        }
        qv[j] = o / L; /* no packed token: 0/0, see merge_override */
    }
    __syncthreads();
    ref_finish(p, qv, tmp, L, M, b, hq);
}

} /* namespace ref */

#endif /* KVQ_CUDA_REF_CUH */
