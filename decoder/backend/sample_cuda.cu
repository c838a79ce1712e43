/* sample_cuda.cu - argmax and exact sampling over device logits
 * (sample_cuda.h; the definition is kvq_sampler.h's).
 *
 * A pass over a group of rows: the argmax (two kernels: partial bests, then
 * one block per row folds them) gives each row's max and flags NaN/+Inf;
 * keys_kernel writes the CPU sampler's sort key (descending logit as an
 * ascending uint32) under the row number, so one stable CUB radix sort
 * orders every row of the group at once, ties by ascending id; the weights
 * exp((l - max) / T) go to a per-row inclusive sum in double (CUB scan by
 * key, the key being the row); a thread per row then finds the top-p prefix
 * and the draw by binary search over those sums. Rows without a cut skip
 * the order (ids in place), as the CPU does; greedy rows only take the
 * argmax.
 */
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cuda_runtime.h>
#include <math.h>
#include <new>
#include <stdint.h>

extern "C" {
#include "sample_cuda.h"
}

namespace {

constexpr int kThreads = 256;
/* Blocks per row of the argmax's first pass (one block over a 128K
 * vocabulary took 215 us). */
constexpr int kParts = 64;
/* Rows sampled per pass: bounds the scratch (40 bytes per logit). */
constexpr int kGroup = 8;

enum row_mode { GREEDY = 0, IN_PLACE = 1, ORDERED = 2 };

/* A group's settings, passed by value: no copy to the device to wait for. */
struct row_set {
    double inv_t[kGroup]; /* 1 / temperature, in double as on the CPU */
    double u[kGroup];
    float top_p[kGroup];
    int k[kGroup];        /* kept before ties: top_k, or the vocabulary when no top-k cut */
    int mode[kGroup];
};

struct gpu_sampler {
    int vocab;
    size_t max_rows;
    float *pv;       /* [max_rows][kParts] argmax first pass: values */
    int *pi;         /* likewise: ids (-2: the part saw NaN or +Inf) */
    int32_t *best;   /* [max_rows] */
    uint64_t *keys, *keys_sorted; /* [kGroup][vocab] (row << 32) | key */
    int32_t *ids, *order;         /* [kGroup][vocab] id within the row, before and after the sort */
    double *w, *cum;              /* [kGroup][vocab] weights in order and their running sums */
    void *temp;                   /* CUB scratch */
    size_t temp_bytes;
    int32_t *out;                 /* [2][kGroup] ids, statuses */
};

__device__ __forceinline__ bool bad_logit(float x)
{
    return isnan(x) || x == INFINITY;
}

__device__ __forceinline__ void arg_better(float *v, int *id, float ov, int oi)
{
    if (oi >= 0 && (*id < 0 || ov > *v || (ov == *v && oi < *id)))
        *v = ov, *id = oi;
}

/* Block argmax of (bv, bi) into slot 0; blockDim.x = kThreads. */
__device__ void block_argmax(float *bv, int *bi)
{
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            arg_better(&bv[threadIdx.x], &bi[threadIdx.x], bv[threadIdx.x + s], bi[threadIdx.x + s]);
        __syncthreads();
    }
}

/* Grid (kParts, rows): part j of a row takes every kParts-th run of
 * kThreads logits. */
__global__ void argmax_part_kernel(const float *logits, int n, float *pv, int *pi)
{
    __shared__ float bv[kThreads];
    __shared__ int bi[kThreads];
    __shared__ int bad;
    const float *row = logits + (size_t)blockIdx.y * n;
    if (threadIdx.x == 0)
        bad = 0;
    __syncthreads();
    float v = -INFINITY;
    int id = -1;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float x = row[i];
        if (bad_logit(x))
            bad = 1;
        else
            arg_better(&v, &id, x, i);
    }
    bv[threadIdx.x] = v;
    bi[threadIdx.x] = id;
    block_argmax(bv, bi);
    if (threadIdx.x == 0) {
        const size_t o = (size_t)blockIdx.y * gridDim.x + blockIdx.x;
        pv[o] = bv[0];
        pi[o] = bad ? -2 : bi[0];
    }
}

/* best[row]: the fold of the row's kParts partial bests, -1 if one was bad. */
__global__ void argmax_kernel(const float *pv, const int *pi, int32_t *best)
{
    __shared__ float bv[kThreads];
    __shared__ int bi[kThreads];
    __shared__ int bad;
    if (threadIdx.x == 0)
        bad = 0;
    __syncthreads();
    float v = -INFINITY;
    int id = -1;
    for (int j = threadIdx.x; j < kParts; j += blockDim.x) {
        const size_t o = (size_t)blockIdx.x * kParts + j;
        if (pi[o] == -2)
            bad = 1;
        else
            arg_better(&v, &id, pv[o], pi[o]);
    }
    bv[threadIdx.x] = v;
    bi[threadIdx.x] = id;
    block_argmax(bv, bi);
    if (threadIdx.x == 0)
        best[blockIdx.x] = bad ? -1 : bi[0];
}

/* sampler.c's desc_key: ascending keys are descending logits. */
__device__ __forceinline__ uint32_t desc_key(float x)
{
    uint32_t u = __float_as_uint(x);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~u;
}

__global__ void keys_kernel(const float *logits, int V, int n, uint64_t *keys, int32_t *ids)
{
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
        keys[e] = (uint64_t)(e / V) << 32 | desc_key(logits[e]);
        ids[e] = e % V;
    }
}

/* w = exp((l - max) / T) at each position of the row's order; 0 outside the
 * top-k set (the first k positions and those tied with the k-th). */
__global__ void weights_kernel(const float *logits, int V, int n, row_set rs, const int32_t *best,
                               const int32_t *order, double *w)
{
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
        const int r = e / V, i = e % V;
        const float *row = logits + (size_t)r * V;
        double x = 0.0;
        if (rs.mode[r] != GREEDY && best[r] >= 0) {
            const int k = rs.k[r];
            const float l = row[rs.mode[r] == ORDERED ? order[e] : i];
            const bool kept = rs.mode[r] != ORDERED || i < k || l == row[order[(size_t)r * V + k - 1]];
            if (kept) /* the difference of two floats is exact in double */
                x = exp(((double)l - (double)row[best[r]]) * rs.inv_t[r]);
        }
        w[e] = x;
    }
}

/* First j in [lo, hi) with c[j] > t (strict) or >= t; hi if none. c is
 * non-decreasing. */
__device__ int first_reaching(const double *c, int lo, int hi, double t, bool strict)
{
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (strict ? c[mid] > t : c[mid] >= t)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* One thread per row: the status, then the token. */
__global__ void choose_kernel(const float *logits, int V, int R, row_set rs, const int32_t *best,
                              const int32_t *order, const double *cum, int32_t *out)
{
    const int r = threadIdx.x;
    if (r >= R)
        return;
    int32_t tok = -1, st = KVQ_OK;
    const int b = best[r];
    if (b < 0)
        st = KVQ_ERR_NONFINITE;
    else if (logits[(size_t)r * V + b] == -INFINITY)
        st = KVQ_ERR_INVALID_ARG; /* every token masked */
    else if (rs.mode[r] == GREEDY)
        tok = b;
    else {
        const double *c = cum + (size_t)r * V;
        int n = V; /* beyond the top-k set the sums stay flat */
        if (rs.top_p[r] < 1.0f) {
            /* keep position j while the mass before it is < top_p of the total */
            const int j = first_reaching(c, 0, V, (double)rs.top_p[r] * c[V - 1], false);
            n = j < V ? j + 1 : V;
        }
        const double mass = c[n - 1];
        int pos = first_reaching(c, 0, n, rs.u[r] * mass, true);
        if (pos == n) /* rounding left the target at the top: the last positive weight */
            pos = first_reaching(c, 0, n, mass, false);
        tok = rs.mode[r] == ORDERED ? order[(size_t)r * V + pos] : pos;
    }
    out[r] = tok;
    out[kGroup + r] = st;
}

/* Row equality for the scan: the high word of the sort key. */
struct same_row {
    __host__ __device__ bool operator()(uint64_t a, uint64_t b) const
    {
        return (a >> 32) == (b >> 32);
    }
};

unsigned grid_for(size_t n)
{
    const size_t g = (n + kThreads - 1) / kThreads;
    return (unsigned)(g < 4096 ? g : 4096);
}

gpu_sampler *of(kvq_gpu_sampler *g)
{
    return reinterpret_cast<gpu_sampler *>(g);
}

kvq_status device_status(cudaError_t e)
{
    return e == cudaSuccess ? KVQ_OK : KVQ_ERR_DEVICE;
}

/* Queues the argmax of R <= max_rows rows into s->best. */
cudaError_t queue_argmax(gpu_sampler *s, const float *logits, size_t R)
{
    argmax_part_kernel<<<dim3(kParts, (unsigned)R), kThreads>>>(logits, s->vocab, s->pv, s->pi);
    argmax_kernel<<<(unsigned)R, kThreads>>>(s->pv, s->pi, s->best);
    return cudaGetLastError();
}

/* Settings of rows p[0..R) (R <= kGroup) as the kernels take them. */
row_set settings(const kvq_sampler_params *p, const double *u, int R, int V, int *need_order, int *need_weights)
{
    row_set rs = {};
    *need_order = *need_weights = 0;
    for (int r = 0; r < R; r++) {
        const int k = p[r].top_k > 0 && p[r].top_k < V ? p[r].top_k : V;
        rs.mode[r] = p[r].temperature == 0.0f ? GREEDY : (k < V || p[r].top_p < 1.0f) ? ORDERED : IN_PLACE;
        rs.k[r] = k;
        rs.top_p[r] = p[r].top_p;
        rs.u[r] = u[r];
        rs.inv_t[r] = rs.mode[r] == GREEDY ? 0.0 : 1.0 / (double)p[r].temperature;
        *need_order |= rs.mode[r] == ORDERED;
        *need_weights |= rs.mode[r] != GREEDY;
    }
    return rs;
}

/* One group of R <= kGroup rows. */
kvq_status sample_group(gpu_sampler *s, const float *logits, int R, const kvq_sampler_params *p, const double *u,
                        int32_t *tok, kvq_status *row_st)
{
    const int V = s->vocab, n = R * V;
    int need_order, need_weights;
    const row_set rs = settings(p, u, R, V, &need_order, &need_weights);
    cudaError_t e = queue_argmax(s, logits, (size_t)R);
    if (e == cudaSuccess && need_weights) {
        keys_kernel<<<grid_for((size_t)n), kThreads>>>(logits, V, n, s->keys, s->ids);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess && need_order) {
        int bits = 0;
        while ((1 << bits) < R)
            bits++;
        size_t bytes = s->temp_bytes;
        e = cub::DeviceRadixSort::SortPairs(s->temp, bytes, s->keys, s->keys_sorted, s->ids, s->order, n, 0,
                                            32 + bits);
    }
    if (e == cudaSuccess && need_weights) {
        weights_kernel<<<grid_for((size_t)n), kThreads>>>(logits, V, n, rs, s->best, s->order, s->w);
        size_t bytes = s->temp_bytes;
        e = cudaGetLastError();
        if (e == cudaSuccess) /* keys in id order still carry the row */
            e = cub::DeviceScan::InclusiveSumByKey(s->temp, bytes, s->keys, s->w, s->cum, n, same_row());
    }
    if (e == cudaSuccess) {
        choose_kernel<<<1, kGroup>>>(logits, V, R, rs, s->best, s->order, s->cum, s->out);
        e = cudaGetLastError();
    }
    int32_t out[2 * kGroup];
    if (e == cudaSuccess)
        e = cudaMemcpy(out, s->out, sizeof out, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess)
        return KVQ_ERR_DEVICE;
    for (int r = 0; r < R; r++) {
        tok[r] = out[r];
        row_st[r] = (kvq_status)out[kGroup + r];
    }
    return KVQ_OK;
}

} // namespace

extern "C" void kvq_gpu_sampler_free(kvq_gpu_sampler *g)
{
    if (!g)
        return;
    gpu_sampler *s = of(g);
    void *p[] = {s->pv, s->pi, s->best, s->keys, s->keys_sorted, s->ids, s->order, s->w, s->cum, s->temp, s->out};
    for (void *q : p)
        cudaFree(q);
    delete s;
}

extern "C" kvq_status kvq_gpu_sampler_create(int32_t vocab, size_t max_rows, kvq_gpu_sampler **out)
{
    if (!out)
        return KVQ_ERR_INVALID_ARG;
    *out = nullptr;
    /* rows of a group are numbered in the keys' high word; n = kGroup * vocab is an int */
    if (vocab < 1 || max_rows < 1 || (size_t)vocab > (size_t)INT32_MAX / kGroup)
        return KVQ_ERR_INVALID_ARG;
    gpu_sampler *s = new (std::nothrow) gpu_sampler();
    if (!s)
        return KVQ_ERR_NOMEM;
    s->vocab = vocab;
    s->max_rows = max_rows;
    const size_t n = (size_t)kGroup * (size_t)vocab;
    size_t sort_bytes = 0, scan_bytes = 0;
    cudaError_t e = cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, s->keys, s->keys_sorted, s->ids, s->order,
                                                    (int)n, 0, 64);
    if (e == cudaSuccess)
        e = cub::DeviceScan::InclusiveSumByKey(nullptr, scan_bytes, s->keys, s->w, s->cum, (int)n, same_row());
    s->temp_bytes = sort_bytes > scan_bytes ? sort_bytes : scan_bytes;
    kvq_status st = device_status(e);
    struct {
        void **p;
        size_t bytes;
    } a[] = {{(void **)&s->pv, max_rows * kParts * sizeof(float)},
             {(void **)&s->pi, max_rows * kParts * sizeof(int)},
             {(void **)&s->best, max_rows * sizeof(int32_t)},
             {(void **)&s->keys, n * sizeof(uint64_t)},
             {(void **)&s->keys_sorted, n * sizeof(uint64_t)},
             {(void **)&s->ids, n * sizeof(int32_t)},
             {(void **)&s->order, n * sizeof(int32_t)},
             {(void **)&s->w, n * sizeof(double)},
             {(void **)&s->cum, n * sizeof(double)},
             {&s->temp, s->temp_bytes ? s->temp_bytes : 1},
             {(void **)&s->out, 2 * kGroup * sizeof(int32_t)}};
    for (size_t i = 0; i < sizeof a / sizeof a[0] && st == KVQ_OK; i++)
        if (cudaMalloc(a[i].p, a[i].bytes) != cudaSuccess)
            st = KVQ_ERR_NOMEM;
    if (st != KVQ_OK) {
        cudaGetLastError();
        kvq_gpu_sampler_free(reinterpret_cast<kvq_gpu_sampler *>(s));
        return st;
    }
    *out = reinterpret_cast<kvq_gpu_sampler *>(s);
    return KVQ_OK;
}

extern "C" kvq_status kvq_gpu_argmax(kvq_gpu_sampler *g, const float *logits, size_t R, int32_t *best)
{
    if (!g || !logits || !best || R > of(g)->max_rows)
        return KVQ_ERR_INVALID_ARG;
    if (R == 0)
        return KVQ_OK;
    gpu_sampler *s = of(g);
    cudaError_t e = queue_argmax(s, logits, R);
    if (e == cudaSuccess)
        e = cudaMemcpy(best, s->best, R * sizeof *best, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess)
        return KVQ_ERR_DEVICE;
    for (size_t r = 0; r < R; r++)
        if (best[r] < 0)
            return KVQ_ERR_NONFINITE;
    return KVQ_OK;
}

extern "C" kvq_status kvq_gpu_sample(kvq_gpu_sampler *g, const float *logits, size_t R, const kvq_sampler_params *p,
                                     const double *u, int32_t *tok, kvq_status *row_st)
{
    if (!g || !logits || !p || !u || !tok || !row_st)
        return KVQ_ERR_INVALID_ARG;
    gpu_sampler *s = of(g);
    for (size_t r = 0; r < R; r++)
        if (kvq_sampler_params_check(&p[r]) != KVQ_OK)
            return KVQ_ERR_INVALID_ARG;
    for (size_t r0 = 0; r0 < R; r0 += kGroup) {
        const int n = (int)(R - r0 < (size_t)kGroup ? R - r0 : (size_t)kGroup);
        kvq_status st = sample_group(s, logits + r0 * (size_t)s->vocab, n, p + r0, u + r0, tok + r0, row_st + r0);
        if (st != KVQ_OK)
            return st;
    }
    return KVQ_OK;
}
