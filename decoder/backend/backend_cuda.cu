/* backend_cuda.cu - the decoder's ops on one NVIDIA GPU.
 *
 * The model's f32 weights are uploaded once at create (the embedding table
 * converted from its file dtype, the LM-head slices gathered into one
 * [vocab][hidden] matrix, the RoPE tables); projections run through cuBLAS
 * SGEMM in plain f32 (no TF32), and the norms, RoPE, activations, soft-cap
 * and greedy argmax are the kernels below, one thread block per row. All
 * work is queued on the legacy default stream, the stream the device KV
 * cache (kvq_cuda.h) uses, so no op needs an explicit synchronisation: only
 * lm_head waits, for the logits or ids it returns in host memory.
 *
 * Numerics follow backend_cpu.c: sums of squares in float with a tree
 * reduction (the CPU accumulates in double), expf/tanhf as on the CPU;
 * results agree with the CPU backend to rounding, not bit for bit.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <new>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "decoder_internal.h"

namespace {

struct cuda_backend {
    struct kvq_backend base;
    cublasHandle_t blas;
    struct kvq_layer_weights *layers; /* [n_layers], device pointers */
    float *embed;             /* [vocab][hidden] */
    float *lm;                /* [vocab][hidden] */
    float *final_norm;        /* [hidden] */
    float *rope_cos, *rope_sin; /* [max_ctx][rotary_dim / 2] */
    float *lm_x;              /* [max_rows][hidden] */
    float *logits;            /* [max_rows][vocab] */
    int32_t *ids;             /* [max_rows] */
    int32_t *best;            /* [max_rows] argmax ids; -1 marks a NaN row */
    int sticky;               /* a CUDA call failed: every later lm_head reports it */
};

constexpr int kThreads = 256;

__device__ float block_sum(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x / 32) ? red[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0)
            red[0] = v;
    }
    __syncthreads();
    float s = red[0];
    __syncthreads();
    return s;
}

__global__ void embed_kernel(const int32_t *ids, const float *table, int hidden, float scale, float *x)
{
    const float *src = table + (size_t)ids[blockIdx.x] * hidden;
    float *dst = x + (size_t)blockIdx.x * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        dst[i] = scale != 1.0f ? src[i] * scale : src[i];
}

__global__ void norm_kernel(const float *x, const float *w, float *y, int n, float eps, int unit_offset)
{
    __shared__ float red[32];
    const float *xr = x + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    const float r = (float)(1.0 / sqrt((double)ss / n + (double)eps));
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = (unit_offset ? 1.0f + w[i] : w[i]) * (xr[i] * r);
}

__global__ void bias_kernel(float *y, const float *b, int n)
{
    float *yr = y + (size_t)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] += b[i];
}

struct rope_args {
    int qkv_dim, q_dim, kv_dim, n_heads, n_kv, d, rd, interleaved, unit_offset;
    float eps;
    const int32_t *pos; /* [T] row positions */
    const float *cos, *sin, *q_norm, *k_norm;
};

/* One warp per (token, head): q heads, then k heads, then v heads (copied). */
__global__ void qkv_rope_kernel(const float *qkv, rope_args a, float *q, float *k, float *v)
{
    const int t = blockIdx.x, head = blockIdx.y, lane = threadIdx.x;
    const float *row = qkv + (size_t)t * a.qkv_dim;
    const float *src, *w = nullptr;
    float *dst;
    if (head < a.n_heads) {
        src = row + (size_t)head * a.d;
        dst = q + (size_t)t * a.q_dim + (size_t)head * a.d;
        w = a.q_norm;
    } else if (head < a.n_heads + a.n_kv) {
        src = row + a.q_dim + (size_t)(head - a.n_heads) * a.d;
        dst = k + (size_t)t * a.kv_dim + (size_t)(head - a.n_heads) * a.d;
        w = a.k_norm;
    } else {
        src = row + a.q_dim + a.kv_dim + (size_t)(head - a.n_heads - a.n_kv) * a.d;
        dst = v + (size_t)t * a.kv_dim + (size_t)(head - a.n_heads - a.n_kv) * a.d;
        for (int i = lane; i < a.d; i += 32)
            dst[i] = src[i];
        return;
    }
    float r = 1.0f;
    if (w) {
        float ss = 0.0f;
        for (int i = lane; i < a.d; i += 32)
            ss += src[i] * src[i];
        for (int o = 16; o > 0; o >>= 1)
            ss += __shfl_xor_sync(0xffffffffu, ss, o);
        r = (float)(1.0 / sqrt((double)ss / a.d + (double)a.eps));
    }
    auto val = [&](int i) {
        return w ? (a.unit_offset ? 1.0f + w[i] : w[i]) * (src[i] * r) : src[i];
    };
    const int half = a.rd / 2;
    const float *cs = a.cos + (size_t)a.pos[t] * half, *sn = a.sin + (size_t)a.pos[t] * half;
    for (int i = lane; i < half; i += 32) {
        const int i0 = a.interleaved ? 2 * i : i, i1 = a.interleaved ? 2 * i + 1 : i + half;
        const float x0 = val(i0), x1 = val(i1);
        dst[i0] = x0 * cs[i] - x1 * sn[i];
        dst[i1] = x1 * cs[i] + x0 * sn[i];
    }
    for (int i = a.rd + lane; i < a.d; i += 32)
        dst[i] = val(i);
}

__global__ void glu_kernel(const float *gu, float *h, int f, int gelu)
{
    const float *g = gu + (size_t)blockIdx.x * 2 * f;
    float *o = h + (size_t)blockIdx.x * f;
    for (int i = threadIdx.x; i < f; i += blockDim.x) {
        const float x = g[i];
        const float act = gelu ? 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)))
                               : x / (1.0f + expf(-x));
        o[i] = act * g[f + i];
    }
}

__global__ void softcap_kernel(float *y, int n, float c)
{
    float *yr = y + (size_t)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = c * tanhf(yr[i] / c);
}

/* best[row] = argmax (lowest id on ties), or -1 when the row holds a NaN. */
__global__ void argmax_kernel(const float *logits, int n, int32_t *best)
{
    __shared__ float bv[kThreads];
    __shared__ int bi[kThreads];
    __shared__ int nan_seen;
    const float *row = logits + (size_t)blockIdx.x * n;
    if (threadIdx.x == 0)
        nan_seen = 0;
    __syncthreads();
    float v = -INFINITY;
    int id = -1;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float x = row[i];
        if (isnan(x))
            nan_seen = 1;
        else if (id < 0 || x > v)
            v = x, id = i;
    }
    bv[threadIdx.x] = v;
    bi[threadIdx.x] = id;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float ov = bv[threadIdx.x + s];
            const int oi = bi[threadIdx.x + s];
            if (oi >= 0 && (bi[threadIdx.x] < 0 || ov > bv[threadIdx.x] ||
                            (ov == bv[threadIdx.x] && oi < bi[threadIdx.x])))
                bv[threadIdx.x] = ov, bi[threadIdx.x] = oi;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0)
        best[blockIdx.x] = nan_seen ? -1 : bi[0];
}

cuda_backend *cb_of(kvq_backend *b)
{
    return reinterpret_cast<cuda_backend *>(b);
}

void note(cuda_backend *cb, cudaError_t e)
{
    if (e != cudaSuccess)
        cb->sticky = 1;
}

void launched(cuda_backend *cb)
{
    note(cb, cudaGetLastError());
}

/* y[T][out] (+)= x[T][in] . W[out][in]^T: column-major, that is
 * Y^T (out x T) = W^T' (out x in) . X^T (in x T). */
void gemm(cuda_backend *cb, const float *x, const float *w, float *y, size_t T, int in, int out, int accumulate)
{
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    if (cublasSgemm(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, (int)T, in, &one, w, in, x, in, &beta, y, out) !=
        CUBLAS_STATUS_SUCCESS)
        cb->sticky = 1;
}

void cuda_embed(kvq_backend *b, const int32_t *ids, size_t T, float *x)
{
    cuda_backend *cb = cb_of(b);
    note(cb, cudaMemcpy(cb->ids, ids, T * sizeof *ids, cudaMemcpyHostToDevice));
    embed_kernel<<<(unsigned)T, kThreads>>>(cb->ids, cb->embed, b->m->cfg.hidden, b->m->cfg.arch.embed_scale, x);
    launched(cb);
}

void cuda_norm(kvq_backend *b, enum kvq_norm_site site, int layer, const float *x, float *y, size_t T)
{
    cuda_backend *cb = cb_of(b);
    const struct kvq_model_config *c = &b->m->cfg;
    const float *w = site == KVQ_NORM_FINAL ? (const float *)cb->final_norm
                     : site == KVQ_NORM_ATTN ? cb->layers[layer].attn_norm
                                             : cb->layers[layer].ffn_norm;
    norm_kernel<<<(unsigned)T, kThreads>>>(x, w, y, c->hidden, c->rms_eps, c->arch.norm == KVQ_NORM_RMS_UNIT_OFFSET);
    launched(cb);
}

void cuda_linear(kvq_backend *b, enum kvq_weight which, int layer, const float *x, float *y, size_t T, int acc)
{
    cuda_backend *cb = cb_of(b);
    const kvq_model *m = b->m;
    const float *W, *bias;
    int in, out;
    kvq_weight_pick(&cb->layers[layer], which, m->cfg.hidden, m->cfg.ffn, m->q_dim, m->qkv_dim, &W, &bias, &in, &out);
    gemm(cb, x, W, y, T, in, out, acc);
    if (bias) {
        bias_kernel<<<(unsigned)T, kThreads>>>(y, bias, out);
        launched(cb);
    }
}

void cuda_set_pos(kvq_backend *b, const int32_t *pos, size_t T)
{
    note(cb_of(b), cudaMemcpy(b->pos, pos, T * sizeof *pos, cudaMemcpyHostToDevice));
}

void cuda_qkv_rope(kvq_backend *b, int layer, const float *qkv, size_t T, const int32_t *pos, float *q, float *k,
                   float *v)
{
    cuda_backend *cb = cb_of(b);
    const kvq_model *m = b->m;
    const struct kvq_model_config *c = &m->cfg;
    rope_args a;
    a.qkv_dim = m->qkv_dim, a.q_dim = m->q_dim, a.kv_dim = m->kv_dim;
    a.n_heads = c->n_heads, a.n_kv = c->n_kv_heads, a.d = c->head_dim, a.rd = c->arch.rotary_dim;
    a.interleaved = c->arch.rope == KVQ_ROPE_INTERLEAVED;
    a.unit_offset = c->arch.norm == KVQ_NORM_RMS_UNIT_OFFSET;
    a.eps = c->rms_eps, a.pos = pos, a.cos = cb->rope_cos, a.sin = cb->rope_sin;
    a.q_norm = cb->layers[layer].q_norm, a.k_norm = cb->layers[layer].k_norm;
    qkv_rope_kernel<<<dim3((unsigned)T, (unsigned)(c->n_heads + 2 * c->n_kv_heads)), 32>>>(qkv, a, q, k, v);
    launched(cb);
}

void cuda_glu(kvq_backend *b, const float *gu, float *h, size_t T)
{
    cuda_backend *cb = cb_of(b);
    glu_kernel<<<(unsigned)T, kThreads>>>(gu, h, b->m->cfg.ffn, b->m->cfg.arch.act == KVQ_ACT_GELU_TANH);
    launched(cb);
}

kvq_status cuda_lm_head(kvq_backend *b, const float *x, size_t R, float *logits, int32_t *argmax)
{
    cuda_backend *cb = cb_of(b);
    const struct kvq_model_config *c = &b->m->cfg;
    if (R == 0 || (!logits && !argmax))
        return cb->sticky ? KVQ_ERR_DEVICE : KVQ_OK;
    cuda_norm(b, KVQ_NORM_FINAL, 0, x, cb->lm_x, R);
    gemm(cb, cb->lm_x, cb->lm, cb->logits, R, c->hidden, c->vocab, 0);
    if (c->arch.final_softcap > 0) {
        softcap_kernel<<<(unsigned)R, kThreads>>>(cb->logits, c->vocab, c->arch.final_softcap);
        launched(cb);
    }
    if (argmax) {
        argmax_kernel<<<(unsigned)R, kThreads>>>(cb->logits, c->vocab, cb->best);
        launched(cb);
        note(cb, cudaMemcpy(argmax, cb->best, R * sizeof *argmax, cudaMemcpyDeviceToHost));
    }
    if (logits)
        note(cb, cudaMemcpy(logits, cb->logits, R * (size_t)c->vocab * sizeof *logits, cudaMemcpyDeviceToHost));
    if (cb->sticky)
        return KVQ_ERR_DEVICE;
    for (size_t r = 0; argmax && r < R; r++)
        if (argmax[r] < 0)
            return KVQ_ERR_NONFINITE;
    return KVQ_OK;
}

kvq_status cuda_sample(kvq_backend *b, kvq_sampler *smp, const float *logits, int32_t *tok)
{
    (void)b; /* the logits are on the host already: the CPU sampler's semantics exactly */
    return kvq_sampler_sample(smp, logits, tok);
}

void cuda_free(kvq_backend *b)
{
    cuda_backend *cb = cb_of(b);
    if (cb->layers)
        for (int l = 0; l < b->m->cfg.n_layers; l++) {
            const kvq_layer_weights *w = &cb->layers[l];
            const float *p[] = {w->attn_norm, w->ffn_norm, w->wqkv, w->bqkv, w->q_norm, w->k_norm,
                                w->wo,        w->bo,       w->wgu,  w->bgu,  w->wdown,  w->bdown};
            for (const float *q : p)
                cudaFree(const_cast<float *>(q));
        }
    free(cb->layers);
    void *p[] = {cb->embed, cb->lm, cb->final_norm, cb->rope_cos, cb->rope_sin, cb->lm_x, cb->logits, cb->ids, cb->best,
                 b->pos};
    for (void *q : p)
        cudaFree(q);
    float **slot[KVQ_N_ACTS];
    size_t floats[KVQ_N_ACTS];
    kvq_acts_table(&b->acts, b->m, 0, slot, floats);
    for (int i = 0; i < KVQ_N_ACTS; i++)
        cudaFree(*slot[i]);
    if (cb->blas)
        cublasDestroy(cb->blas);
    delete cb;
}

const struct kvq_backend_ops cuda_ops = {
    cuda_embed, cuda_norm, cuda_linear, cuda_qkv_rope, cuda_glu, cuda_lm_head, cuda_sample, cuda_free,
    cuda_set_pos,
};

/* Uploads n floats of host memory (NULL gives NULL). */
kvq_status upload(const float *host, size_t n, const float **dev)
{
    *dev = nullptr;
    if (!host)
        return KVQ_OK;
    float *d = nullptr;
    if (cudaMalloc(&d, n * sizeof(float)) != cudaSuccess)
        return KVQ_ERR_NOMEM;
    *dev = d;
    return cudaMemcpy(d, host, n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess ? KVQ_OK : KVQ_ERR_DEVICE;
}

kvq_status upload(const float *host, size_t n, float **dev)
{
    const float *d = nullptr;
    kvq_status st = upload(host, n, &d);
    *dev = const_cast<float *>(d);
    return st;
}

kvq_status alloc(float **dev, size_t n)
{
    return cudaMalloc(dev, (n ? n : 1) * sizeof(float)) == cudaSuccess ? KVQ_OK : KVQ_ERR_NOMEM;
}

kvq_status upload_model(cuda_backend *cb)
{
    const kvq_model *m = cb->base.m;
    const struct kvq_model_config *c = &m->cfg;
    const size_t h = (size_t)c->hidden, f = (size_t)c->ffn, d = (size_t)c->head_dim;
    const size_t qkv = (size_t)m->qkv_dim, qd = (size_t)m->q_dim;
    cb->layers = static_cast<kvq_layer_weights *>(calloc((size_t)c->n_layers, sizeof *cb->layers));
    if (!cb->layers)
        return KVQ_ERR_NOMEM;
    kvq_status st = KVQ_OK;
    for (int l = 0; l < c->n_layers && st == KVQ_OK; l++) {
        const struct kvq_layer_weights *w = &m->layers[l];
        kvq_layer_weights *o = &cb->layers[l];
        struct {
            const float *src;
            size_t n;
            const float **dst;
        } t[] = {{w->attn_norm, h, &o->attn_norm}, {w->ffn_norm, h, &o->ffn_norm}, {w->wqkv, qkv * h, &o->wqkv},
                 {w->bqkv, qkv, &o->bqkv},         {w->q_norm, d, &o->q_norm},     {w->k_norm, d, &o->k_norm},
                 {w->wo, h * qd, &o->wo},          {w->bo, h, &o->bo},             {w->wgu, 2 * f * h, &o->wgu},
                 {w->bgu, 2 * f, &o->bgu},         {w->wdown, h * f, &o->wdown},   {w->bdown, h, &o->bdown}};
        for (size_t i = 0; i < sizeof t / sizeof t[0] && st == KVQ_OK; i++)
            st = upload(t[i].src, t[i].n, t[i].dst);
    }
    if (st == KVQ_OK)
        st = upload(m->final_norm, h, &cb->final_norm);
    const size_t rope = (size_t)c->max_ctx * (size_t)(c->arch.rotary_dim / 2);
    float *rcos = nullptr, *rsin = nullptr; /* the model keeps no table (rope.c) */
    if (st == KVQ_OK)
        st = kvq_rope_table(c, (size_t)c->max_ctx, &rcos, &rsin);
    if (st == KVQ_OK)
        st = upload(rcos, rope, &cb->rope_cos);
    if (st == KVQ_OK)
        st = upload(rsin, rope, &cb->rope_sin);
    free(rcos);
    free(rsin);
    /* embedding table (converted from its dtype) and LM head, a slice of rows at a time */
    const size_t V = (size_t)c->vocab, step = 4096;
    if (st == KVQ_OK && (st = alloc(&cb->embed, V * h)) == KVQ_OK)
        st = alloc(&cb->lm, V * h);
    float *tmp = st == KVQ_OK ? static_cast<float *>(malloc(step * h * sizeof(float))) : nullptr;
    if (st == KVQ_OK && !tmp)
        st = KVQ_ERR_NOMEM;
    for (size_t r = 0; st == KVQ_OK && r < V; r += step) {
        const size_t n = V - r < step ? V - r : step;
        st = kvq_st_to_f32_range(m->embed, r * h, n * h, tmp);
        if (st == KVQ_OK && cudaMemcpy(cb->embed + r * h, tmp, n * h * sizeof(float), cudaMemcpyHostToDevice))
            st = KVQ_ERR_DEVICE;
    }
    free(tmp);
    for (int k = 0; st == KVQ_OK && k < m->n_lm; k++) {
        const struct kvq_lm_slice *sl = &m->lm[k];
        if (cudaMemcpy(cb->lm + (size_t)sl->start * h, sl->w, (size_t)sl->count * h * sizeof(float),
                       cudaMemcpyHostToDevice) != cudaSuccess)
            st = KVQ_ERR_DEVICE;
    }
    return st;
}

} // namespace

extern "C" kvq_status kvq_backend_cuda_create(const kvq_model *m, size_t max_rows, kvq_backend **out)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        cudaGetLastError();
        return KVQ_ERR_NO_DEVICE;
    }
    cuda_backend *cb = new (std::nothrow) cuda_backend();
    if (!cb)
        return KVQ_ERR_NOMEM;
    kvq_backend *b = &cb->base;
    b->ops = &cuda_ops;
    b->name = "cuda";
    b->m = m;
    b->max_rows = max_rows;
    b->device = 1;
    if (cublasCreate(&cb->blas) != CUBLAS_STATUS_SUCCESS) {
        cb->blas = nullptr;
        cuda_free(b);
        return KVQ_ERR_DEVICE;
    }
    kvq_status st = upload_model(cb);
    float **slot[KVQ_N_ACTS];
    size_t floats[KVQ_N_ACTS];
    kvq_acts_table(&b->acts, m, max_rows, slot, floats);
    for (int i = 0; i < KVQ_N_ACTS && st == KVQ_OK; i++)
        st = alloc(slot[i], floats[i]);
    if (st == KVQ_OK)
        st = alloc(&cb->lm_x, max_rows * (size_t)m->cfg.hidden);
    if (st == KVQ_OK)
        st = alloc(&cb->logits, max_rows * (size_t)m->cfg.vocab);
    const size_t mr = max_rows;
    if (st == KVQ_OK && (cudaMalloc(&cb->ids, mr * sizeof(int32_t)) != cudaSuccess ||
                         cudaMalloc(&cb->best, mr * sizeof(int32_t)) != cudaSuccess ||
                         cudaMalloc(&b->pos, mr * sizeof(int32_t)) != cudaSuccess))
        st = KVQ_ERR_NOMEM;
    if (st != KVQ_OK) {
        cuda_free(b);
        return st;
    }
    *out = b;
    return KVQ_OK;
}
