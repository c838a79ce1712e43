/* backend_cuda.cu - the decoder's ops on one NVIDIA GPU.
 *
 * The model's weights are uploaded once at create in the checkpoint's dtype
 * (a matrix whose file holds bf16 or f16 stays 16-bit, f32 stays f32; the
 * LM-head slices gathered into one [vocab][hidden] matrix, the RoPE
 * tables). f32 projections run through cuBLAS SGEMM in plain f32 (no TF32).
 * 16-bit ones of up to kGemvRows rows (decode steps) run through our
 * few-row kernel, which reads each weight once and multiplies it with the
 * f32 activation in f32; larger ones through cublasGemmEx (f32
 * accumulation and output) with each
 * activation split into two values of the weights' type, hi = round(x) and
 * lo = round(x - hi), as two columns of one product, so W x is computed to
 * ~2^-16 of f32 activations (16 bits of mantissa, not bf16's 8) while the
 * weights are read once, at 16 bits: the decoder agrees with the CPU and
 * with transformers' float32 forward as with f32 weights (test_decoder_cuda).
 * The norms, RoPE, activations and soft-cap are the kernels below, one
 * thread block per row; the argmax and sampling over the logits are
 * sample_cuda.cu's, so a step returns ids, not logits. The ops and the KV
 * store's caches queue their work on the backend's stream (a blocking one:
 * the sampler, the timing events and the synchronous copies on the legacy
 * default stream stay ordered with it), so no op needs an explicit
 * synchronisation: only lm_head and lm_sample wait, for what they return in
 * host memory. A decode step's layers run as one CUDA graph
 * (kvq_cuda.h, "step graphs"): every launch and upload of a forward goes
 * through the step recorder, which records them the first time and
 * patches what changed (positions, lengths) on later steps; the work of
 * cuBLAS is captured and, its arguments being the same for a key (the row
 * count), not issued again while replaying.
 *
 * Numerics follow backend_cpu.c: sums of squares in float with a tree
 * reduction (the CPU accumulates in double), expf/tanhf as on the CPU;
 * results agree with the CPU backend to rounding, not bit for bit.
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <new>
#include <stdlib.h>
#include <string.h>

/* the decoder's internal headers are C: their functions have C linkage */
extern "C" {
#include "backend.h"
#include "decoder_internal.h"
#include "sample_cuda.h"
}
#include "kvq_cuda.h"

namespace {

/* A weight matrix [rows][cols] in device memory, in one of three types. */
enum wtype { W_F32 = 0, W_BF16 = 1, W_F16 = 2 };
struct dmat {
    void *w;
    wtype t;
};

struct cuda_backend {
    struct kvq_backend base;
    cublasHandle_t blas;
    struct kvq_layer_weights *layers; /* [n_layers], device pointers (norms, biases) */
    dmat (*mats)[4];          /* [n_layers][KVQ_W_*] the projections */
    dmat embed;               /* [vocab][hidden] */
    dmat lm;                  /* [vocab][hidden] */
    void *xh;                 /* [2][max_rows][widest input] activations split into 16-bit hi, lo */
    float *y2;                /* [2][rows][out] a split product's halves, for up to kSplitRows rows */
    size_t y2_floats;
    float *final_norm;        /* [hidden] */
    float *rope_cos, *rope_sin; /* [max_ctx][rotary_dim / 2] */
    float *rope_cos_local, *rope_sin_local; /* the same for the windowed layers' local base (Gemma 3), or NULL */
    float *lm_x;              /* [min(max_rows, kLmRows)][hidden] */
    float *logits;            /* [min(max_rows, kLmRows)][vocab] */
    int32_t *ids;             /* [max_rows] */
    kvq_gpu_sampler *smp;     /* argmax and sampling over logits */
    cudaStream_t stream;      /* every op's work (b->dev_stream) */
    void *blas_ws;            /* cuBLAS workspace: capturable calls allocate nothing */
    kvq_cuda_step *step;      /* decode-step graphs (b->dev_step); NULL: off */
    int32_t *pin_ids, *pin_pos; /* [max_rows] pinned: a step graph uploads ids and positions from here */
    int graph_fails;          /* failed step graphs in a row: kGraphMaxFails turn graphs off */
    int step_err;             /* a call of the open step failed */
    int graphs_off;
    int fast16;               /* KVQ_BACKEND_FAST16: products of more than kSplitRows rows take 16-bit inputs */
    /* Device time per part: the events of the forward being queued (cur)
     * and of the one before (done), folded into part_s while the device
     * works on the next, so timing costs the step no wait. An event between
     * two kernels costs ~1.7 us of device time (they no longer overlap), 9%
     * of an 8B-shape decode step, so only every kTimeEvery-th forward of at
     * most kChunkRows rows is timed and scaled; every longer one (prefill
     * chunks, where it costs nothing visible) is timed. */
    struct mark_set {
        cudaEvent_t *ev; /* [max_marks] */
        uint8_t *tag;    /* [max_marks] the part the work after event i counts as */
        int n, chunk;    /* chunk: a forward of more than kChunkRows rows */
    } sets[2];
    int cur, max_marks, timing;
    size_t forwards[2], timed[2]; /* [chunk] */
    double part_s[2][KVQ_N_PARTS];
    int sticky;               /* a CUDA call failed: every later lm_head reports it */
};

constexpr int kThreads = 256;
/* A norm is one block per row: at batch 1 its latency is the step's, so
 * the row goes to 1024 threads (256 took 15 us per norm of the 8B shape). */
constexpr int kNormThreads = 1024;
/* Rows up to which a 16-bit product runs as one GEMM of 2T columns. */
constexpr size_t kSplitRows = 64;
/* Rows up to which it runs as the few-row kernel (gemv16_kernel): one; at
 * 8 rows it took 27 ms per step against 11 ms for the split GEMM (H100,
 * 8B shape, batch 8): its activation reads per weight grow with the rows. */
constexpr size_t kGemvRows = 1;
/* GPU part times (struct mark_set): forwards of up to kChunkRows rows are
 * timed one in kTimeEvery. */
constexpr size_t kChunkRows = 16;
constexpr size_t kTimeEvery = 16;
/* Rows whose settings one lm_sample pass gathers (any R works, in passes). */
constexpr size_t kSampleRows = 64;
/* The LM head runs on at most kLmRows rows at a time: its logits buffer
 * would otherwise be max_rows x vocab floats (4.2 GB for a prefill chunk of
 * 8192 rows and Llama 3's vocabulary), for the one row a prefill asks. */
constexpr size_t kLmRows = 256;
/* Keys (row counts) whose step graphs are kept; failed step graphs in a
 * row after which graphs are turned off (a step that cannot be captured). */
constexpr int kGraphKeys = 8;
constexpr int kGraphMaxFails = 4;
/* cuBLAS workspace (NVIDIA's recommendation for Hopper). */
constexpr size_t kBlasWorkspace = 32u << 20;

void fail(cuda_backend *cb);

/* kern<<<grid, block, smem, the backend's stream>>>(args...) through the
 * step recorder. A failure while a step is open is the recorder's to
 * report (step_end), not a device error. */
template <typename... K, typename... A>
void launch(cuda_backend *cb, void (*kern)(K...), dim3 grid, dim3 block, size_t smem, A &&...args)
{
    if (kvq_cuda_step_launch_kernel(cb->step, cb->stream, false, kern, grid, block, smem,
                                    static_cast<A &&>(args)...) != KVQ_OK)
        fail(cb);
}

/* A step graph is being replayed: work issued around the recorder (cuBLAS)
 * is already in it. */
int replaying(const cuda_backend *cb)
{
    return kvq_cuda_step_mode(cb->step) == KVQ_CUDA_STEP_REPLAY;
}

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

__device__ __forceinline__ float to_f32(float v)
{
    return v;
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}
__device__ __forceinline__ float to_f32(__half v)
{
    return __half2float(v);
}

template <typename W>
__global__ void embed_kernel(const int32_t *ids, const W *table, int hidden, float scale, float *x)
{
    const W *src = table + (size_t)ids[blockIdx.x] * hidden;
    float *dst = x + (size_t)blockIdx.x * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        dst[i] = scale != 1.0f ? to_f32(src[i]) * scale : to_f32(src[i]);
}

/* x as hi + lo in the weights' 16-bit type: y[0, n) = hi = round(x),
 * y[n, 2n) = lo = round(x - hi), both to nearest even; hi only unless lo. */
__global__ void split16_kernel(const float *x, size_t n, int bf16, int lo, void *y)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (bf16) {
            const __nv_bfloat16 hi = __float2bfloat16_rn(x[i]);
            static_cast<__nv_bfloat16 *>(y)[i] = hi;
            if (lo)
                static_cast<__nv_bfloat16 *>(y)[n + i] = __float2bfloat16_rn(x[i] - __bfloat162float(hi));
        } else {
            const __half hi = __float2half_rn(x[i]);
            static_cast<__half *>(y)[i] = hi;
            if (lo)
                static_cast<__half *>(y)[n + i] = __float2half_rn(x[i] - __half2float(hi));
        }
    }
}

/* y[r] (+)= y2[r] + y2[n + r]: the hi and lo halves of a split product.
 * y is read only when accumulating (a fresh y may be unwritten memory:
 * compute-sanitizer's initcheck flagged the select form's load). */
__global__ void add_halves_kernel(const float *y2, size_t n, int accumulate, float *y)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float s = y2[i] + y2[n + i];
        if (accumulate)
            y[i] += s;
        else
            y[i] = s;
    }
}

unsigned grid_for(size_t n)
{
    const size_t blocks = (n + kThreads - 1) / kThreads;
    return (unsigned)(blocks < 4096 ? blocks : 4096);
}

/* y = norm(x) a row per block; accumulate: y += norm(x) (the sandwich
 * sites, which norm a projection's output into the residual stream). */
__global__ void norm_kernel(const float *x, const float *w, float *y, int n, float eps, int unit_offset,
                            int accumulate)
{
    __shared__ float red[32];
    const float *xr = x + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    constexpr int kPer = 8; /* values a thread keeps: rows up to 8 x kNormThreads */
    if (n <= kPer * (int)blockDim.x) {
        /* all of this thread's x, w (and y) loads in flight at once: a
         * loop that waited for each load in turn made this kernel, 65
         * launches a decode step, a chain of memory latencies (same sums,
         * same order, same bits) */
        float xv[kPer], wv[kPer], yv[kPer];
#pragma unroll
        for (int k = 0; k < kPer; k++) {
            const int i = threadIdx.x + k * (int)blockDim.x;
            xv[k] = i < n ? xr[i] : 0.0f;
            wv[k] = i < n ? w[i] : 0.0f;
            yv[k] = i < n && accumulate ? yr[i] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < kPer; k++)
            if (threadIdx.x + k * (int)blockDim.x < n)
                ss += xv[k] * xv[k];
        ss = block_sum(ss, red);
        const float r = (float)(1.0 / sqrt((double)ss / n + (double)eps));
#pragma unroll
        for (int k = 0; k < kPer; k++) {
            const int i = threadIdx.x + k * (int)blockDim.x;
            if (i < n) {
                const float v = (unit_offset ? 1.0f + wv[k] : wv[k]) * (xv[k] * r);
                yr[i] = accumulate ? yv[k] + v : v;
            }
        }
        return;
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    const float r = (float)(1.0 / sqrt((double)ss / n + (double)eps));
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = (unit_offset ? 1.0f + w[i] : w[i]) * (xr[i] * r);
        if (accumulate)
            yr[i] += v;
        else
            yr[i] = v;
    }
}

/* 8 weights of a 16-bit row (16 bytes) as floats. */
__device__ __forceinline__ void widen8(uint4 u, const __nv_bfloat16 *, float f[8])
{
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 v = __bfloat1622float2(h[k]);
        f[2 * k] = v.x;
        f[2 * k + 1] = v.y;
    }
}
__device__ __forceinline__ void widen8(uint4 u, const __half *, float f[8])
{
    const __half2 *h = reinterpret_cast<const __half2 *>(&u);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 v = __half22float2(h[k]);
        f[2 * k] = v.x;
        f[2 * k + 1] = v.y;
    }
}

/* y[t][r] (+)= W[r] . x[t] for T <= TT rows of few-row steps (decode): one
 * warp per output row reads the 16-bit weights once, 16 bytes per lane and
 * 4 loads in flight, and multiplies them with the f32 activations in f32, so
 * no activation is rounded. in % 8 == 0 (16-byte rows). */
template <typename W, int TT>
__global__ void __launch_bounds__(256) gemv16_kernel(const W *w, const float *x, float *y, int in, int out, int T,
                                                     int accumulate)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = blockIdx.x * 8 + warp;
    if (r >= out)
        return;
    const uint4 *wr = reinterpret_cast<const uint4 *>(w + (size_t)r * in);
    const int n8 = in / 8; /* 16-byte chunks of the row */
    float acc[TT];
#pragma unroll
    for (int t = 0; t < TT; t++)
        acc[t] = 0.0f;
    auto fma8 = [&](uint4 u, int c) {
        float f[8];
        widen8(u, static_cast<const W *>(nullptr), f);
#pragma unroll
        for (int t = 0; t < TT; t++) {
            if (t < T) {
                const float4 *xv = reinterpret_cast<const float4 *>(x + (size_t)t * in + (size_t)c * 8);
                const float4 a = xv[0], b = xv[1];
                acc[t] += f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w + f[4] * b.x + f[5] * b.y + f[6] * b.z +
                          f[7] * b.w;
            }
        }
    };
    int c = lane;
    for (; c + 96 < n8; c += 128) {
        const uint4 u0 = wr[c], u1 = wr[c + 32], u2 = wr[c + 64], u3 = wr[c + 96];
        fma8(u0, c);
        fma8(u1, c + 32);
        fma8(u2, c + 64);
        fma8(u3, c + 96);
    }
    for (; c < n8; c += 32)
        fma8(wr[c], c);
#pragma unroll
    for (int t = 0; t < TT; t++) {
        float v = acc[t];
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0 && t < T) {
            float *dst = y + (size_t)t * out + r;
            *dst = accumulate ? *dst + v : v;
        }
    }
}

template <typename W>
void gemv16(cuda_backend *cb, const void *w, const float *x, float *y, int in, int out, int T, int accumulate)
{
    const unsigned blocks = (unsigned)((out + 7) / 8);
    const W *wt = static_cast<const W *>(w);
    auto kern = T == 1 ? gemv16_kernel<W, 1> : T <= 4 ? gemv16_kernel<W, 4> : gemv16_kernel<W, 8>;
    launch(cb, kern, dim3(blocks), dim3(256), 0, wt, x, y, in, out, T, accumulate);
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

/* grid (column blocks, rows): a decode step's one row of ffn elements
 * spread over the GPU (one block per row took 51 us of the 8B shape's step,
 * ncu on an H200, against ~3 us) */
__global__ void glu_kernel(const float *gu, float *h, int f, int gelu)
{
    const float *g = gu + (size_t)blockIdx.y * 2 * f;
    float *o = h + (size_t)blockIdx.y * f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < f; i += gridDim.x * blockDim.x) {
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

/* The better of two (value, id) candidates: the larger value, the lower id
 * on ties; id < 0 is no candidate. */
cuda_backend *cb_of(kvq_backend *b)
{
    return reinterpret_cast<cuda_backend *>(b);
}

/* A failed call: a device error, or while a step graph is open, that
 * step's failure (step_end reports it and the step runs again as queued). */
void fail(cuda_backend *cb)
{
    if (kvq_cuda_step_mode(cb->step) != KVQ_CUDA_STEP_OFF)
        cb->step_err = 1;
    else
        cb->sticky = 1;
}

void note(cuda_backend *cb, cudaError_t e)
{
    if (e != cudaSuccess)
        fail(cb);
}

/* y[T][out] (+)= x[T][in] . W[out][in]^T: column-major, that is
 * Y^T (out x T) = W^T' (out x in) . X^T (in x T). A 16-bit W meets x rounded
 * to its type; the products accumulate in f32 into f32 y. */
void gemm(cuda_backend *cb, const float *x, const dmat &w, float *y, size_t T, int in, int out, int accumulate)
{
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    /* a replayed step graph holds cuBLAS's work: only our kernels are
     * walked again (their arguments are the same too, but the recorder
     * must meet every one it recorded) */
    const bool blas = !replaying(cb);
    if (w.t == W_F32) {
        if (blas)
            st = cublasSgemm(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, (int)T, in, &one,
                             static_cast<const float *>(w.w), in, x, in, &beta, y, out);
    } else if (T <= kGemvRows && in % 8 == 0) { /* decode: the weights once, f32 activations */
        if (w.t == W_BF16)
            gemv16<__nv_bfloat16>(cb, w.w, x, y, in, out, (int)T, accumulate);
        else
            gemv16<__half>(cb, w.w, x, y, in, out, (int)T, accumulate);
        return;
    } else {
        const size_t n = T * (size_t)in, m = T * (size_t)out;
        const bool fast = cb->fast16 && T > kSplitRows;
        launch(cb, split16_kernel, dim3(grid_for(n)), dim3(kThreads), 0, x, n, (int)(w.t == W_BF16), (int)!fast,
               cb->xh);
        const cudaDataType dt = w.t == W_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        const size_t lo_bytes = n * 2;
        const void *x_lo = static_cast<const uint8_t *>(cb->xh) + lo_bytes;
        if (fast) { /* inputs rounded to 16 bits, as a bf16 forward: one product */
            if (blas)
                st = cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, (int)T, in, &one, w.w, dt, in, cb->xh, dt,
                                  in, &beta, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        } else if (2 * m <= cb->y2_floats) { /* few rows: hi and lo as 2T columns of one product, W read once */
            const float zero = 0.0f;
            if (blas)
                st = cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, 2 * (int)T, in, &one, w.w, dt, in, cb->xh,
                                  dt, in, &zero, cb->y2, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            launch(cb, add_halves_kernel, dim3(grid_for(m)), dim3(kThreads), 0, cb->y2, m, accumulate, y);
        } else { /* many rows: two products (compute-bound either way) */
            if (blas)
                st = cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, (int)T, in, &one, w.w, dt, in, cb->xh, dt,
                                  in, &beta, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            if (blas && st == CUBLAS_STATUS_SUCCESS)
                st = cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, (int)T, in, &one, w.w, dt, in, x_lo, dt, in,
                                  &one, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        }
    }
    if (st != CUBLAS_STATUS_SUCCESS)
        fail(cb);
}

/* n int32 of host src to device dst: a step graph's copy reads pinned
 * memory when the graph runs (pin, which nothing else of the step
 * rewrites); otherwise a plain synchronous copy. */
void upload_ints(cuda_backend *cb, int32_t *dst, int32_t *pin, const int32_t *src, size_t n)
{
    if (kvq_cuda_step_mode(cb->step) == KVQ_CUDA_STEP_OFF) {
        note(cb, cudaMemcpy(dst, src, n * sizeof *src, cudaMemcpyHostToDevice));
        return;
    }
    memcpy(pin, src, n * sizeof *src);
    if (kvq_cuda_step_copy(cb->step, cb->stream, dst, pin, n * sizeof *src) != KVQ_OK)
        fail(cb);
}

void cuda_embed(kvq_backend *b, const int32_t *ids, size_t T, float *x)
{
    cuda_backend *cb = cb_of(b);
    upload_ints(cb, cb->ids, cb->pin_ids, ids, T);
    const int h = b->m->cfg.hidden;
    const float sc = b->m->cfg.arch.embed_scale;
    const dim3 g((unsigned)T), t(kThreads);
    if (cb->embed.t == W_BF16)
        launch(cb, embed_kernel<__nv_bfloat16>, g, t, 0, cb->ids, static_cast<const __nv_bfloat16 *>(cb->embed.w), h,
               sc, x);
    else if (cb->embed.t == W_F16)
        launch(cb, embed_kernel<__half>, g, t, 0, cb->ids, static_cast<const __half *>(cb->embed.w), h, sc, x);
    else
        launch(cb, embed_kernel<float>, g, t, 0, cb->ids, static_cast<const float *>(cb->embed.w), h, sc, x);
}

void cuda_norm(kvq_backend *b, enum kvq_norm_site site, int layer, const float *x, float *y, size_t T)
{
    cuda_backend *cb = cb_of(b);
    const struct kvq_model_config *c = &b->m->cfg;
    const kvq_layer_weights *lw = &cb->layers[site == KVQ_NORM_FINAL ? 0 : layer];
    const float *w = site == KVQ_NORM_FINAL       ? (const float *)cb->final_norm
                     : site == KVQ_NORM_ATTN      ? lw->attn_norm
                     : site == KVQ_NORM_POST_ATTN ? lw->post_attn_norm
                     : site == KVQ_NORM_POST_FFN  ? lw->post_ffn_norm
                                                  : lw->ffn_norm;
    const int post = site == KVQ_NORM_POST_ATTN || site == KVQ_NORM_POST_FFN;
    launch(cb, norm_kernel, dim3((unsigned)T), dim3(kNormThreads), 0, x, w, y, c->hidden, c->rms_eps,
           (int)(c->arch.norm == KVQ_NORM_RMS_UNIT_OFFSET), post);
}

void cuda_linear(kvq_backend *b, enum kvq_weight which, int layer, const float *x, float *y, size_t T, int acc)
{
    cuda_backend *cb = cb_of(b);
    const kvq_model *m = b->m;
    const float *W, *bias;
    int in, out;
    kvq_weight_pick(&cb->layers[layer], which, m->cfg.hidden, m->cfg.ffn, m->q_dim, m->qkv_dim, &W, &bias, &in, &out);
    gemm(cb, x, cb->mats[layer][which], y, T, in, out, acc);
    if (bias)
        launch(cb, bias_kernel, dim3((unsigned)T), dim3(kThreads), 0, y, bias, out);
}

void cuda_set_pos(kvq_backend *b, const int32_t *pos, size_t T)
{
    cuda_backend *cb = cb_of(b);
    upload_ints(cb, b->pos, cb->pin_pos, pos, T);
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
    const int local = kvq_rope_layer_local(c, layer);
    a.eps = c->rms_eps, a.pos = pos;
    a.cos = local ? cb->rope_cos_local : cb->rope_cos;
    a.sin = local ? cb->rope_sin_local : cb->rope_sin;
    a.q_norm = cb->layers[layer].q_norm, a.k_norm = cb->layers[layer].k_norm;
    launch(cb, qkv_rope_kernel, dim3((unsigned)T, (unsigned)(c->n_heads + 2 * c->n_kv_heads)), dim3(32), 0, qkv, a, q,
           k, v);
}

void cuda_glu(kvq_backend *b, const float *gu, float *h, size_t T)
{
    cuda_backend *cb = cb_of(b);
    const int f = b->m->cfg.ffn;
    launch(cb, glu_kernel, dim3((unsigned)((f + kThreads - 1) / kThreads), (unsigned)T), dim3(kThreads), 0, gu, h, f,
           (int)(b->m->cfg.arch.act == KVQ_ACT_GELU_TANH));
}

/* Adds the intervals between a finished set's events to their parts. */
void fold(cuda_backend *cb, cuda_backend::mark_set *m)
{
    if (m->n > 1 && cudaEventSynchronize(m->ev[m->n - 1]) == cudaSuccess)
        for (int i = 0; i + 1 < m->n; i++) {
            float ms = 0.0f;
            if (cudaEventElapsedTime(&ms, m->ev[i], m->ev[i + 1]) == cudaSuccess)
                cb->part_s[m->chunk][m->tag[i]] += 1e-3 * ms;
        }
    m->n = 0;
}

void record(cuda_backend *cb, enum kvq_part part)
{
    cuda_backend::mark_set *m = &cb->sets[cb->cur];
    if (cb->timing && m->n < cb->max_marks && cudaEventRecord(m->ev[m->n], 0) == cudaSuccess)
        m->tag[m->n++] = (uint8_t)part;
}

void cuda_mark(kvq_backend *b, enum kvq_part part, size_t rows)
{
    cuda_backend *cb = cb_of(b);
    if (rows) {
        if (cb->sets[cb->cur].n) { /* the last forward had no LM head: it becomes the done one */
            fold(cb, &cb->sets[!cb->cur]);
            cb->cur = !cb->cur;
        }
        const int chunk = rows > kChunkRows;
        /* not the first short forward: its kernels' first launches load
         * their code (lazy module loading), and one step is scaled by all */
        cb->timing = chunk || cb->forwards[0] % kTimeEvery == 1;
        cb->forwards[chunk]++;
        cb->timed[chunk] += (size_t)cb->timing;
        cb->sets[cb->cur].chunk = chunk;
    }
    record(cb, part);
}

/* The LM head's work is queued: the forward before (long finished) is
 * folded while the device runs this one. */
void fold_done(cuda_backend *cb)
{
    fold(cb, &cb->sets[!cb->cur]);
}

/* After the LM head's wait: this forward's set is complete; the next
 * forward records into the other (folded) one. */
void close_forward(cuda_backend *cb)
{
    record(cb, KVQ_PART_OTHER);
    cb->cur = !cb->cur;
}

void cuda_part_times(kvq_backend *b, double t[KVQ_N_PARTS], int reset)
{
    cuda_backend *cb = cb_of(b);
    fold(cb, &cb->sets[!cb->cur]);
    if (cb->sets[cb->cur].n) {
        record(cb, KVQ_PART_OTHER);
        fold(cb, &cb->sets[cb->cur]);
    }
    for (int i = 0; i < KVQ_N_PARTS; i++) {
        t[i] = 0.0;
        for (int c = 0; c < 2; c++) {
            if (cb->timed[c])
                t[i] += cb->part_s[c][i] * (double)cb->forwards[c] / (double)cb->timed[c];
            if (reset)
                cb->part_s[c][i] = 0.0;
        }
    }
    if (reset)
        for (int c = 0; c < 2; c++)
            cb->forwards[c] = cb->timed[c] = 0;
}

/* cb->logits[R] = the LM head of rows x[0..R) (final norm, soft-cap). */
void logits_of(kvq_backend *b, const float *x, size_t R)
{
    cuda_backend *cb = cb_of(b);
    const struct kvq_model_config *c = &b->m->cfg;
    cuda_norm(b, KVQ_NORM_FINAL, 0, x, cb->lm_x, R);
    gemm(cb, cb->lm_x, cb->lm, cb->logits, R, c->hidden, c->vocab, 0);
    if (c->arch.final_softcap > 0)
        launch(cb, softcap_kernel, dim3((unsigned)R), dim3(kThreads), 0, cb->logits, c->vocab, c->arch.final_softcap);
}

kvq_status cuda_lm_head(kvq_backend *b, const float *x, size_t R, float *logits, int32_t *argmax)
{
    cuda_backend *cb = cb_of(b);
    const struct kvq_model_config *c = &b->m->cfg;
    if (R == 0 || (!logits && !argmax))
        return cb->sticky ? KVQ_ERR_DEVICE : KVQ_OK;
    cuda_mark(b, KVQ_PART_LM_HEAD, 0);
    kvq_status st = KVQ_OK;
    for (size_t r0 = 0; r0 < R && st == KVQ_OK; r0 += kLmRows) {
        const size_t n = R - r0 < kLmRows ? R - r0 : kLmRows;
        logits_of(b, x + r0 * (size_t)c->hidden, n);
        if (r0 == 0)
            fold_done(cb);
        if (argmax)
            st = kvq_gpu_argmax(cb->smp, cb->logits, n, argmax + r0);
        if (logits)
            note(cb, cudaMemcpy(logits + r0 * (size_t)c->vocab, cb->logits, n * (size_t)c->vocab * sizeof *logits,
                                cudaMemcpyDeviceToHost));
    }
    close_forward(cb);
    if (cb->sticky || st == KVQ_ERR_DEVICE)
        return KVQ_ERR_DEVICE;
    return st;
}

kvq_status cuda_lm_sample(kvq_backend *b, const float *x, size_t R, kvq_sampler *const *smp, const double *u,
                          int32_t *tok, kvq_status *row_st)
{
    cuda_backend *cb = cb_of(b);
    kvq_sampler_params p[kSampleRows];
    const size_t step = kSampleRows < b->max_rows ? kSampleRows : b->max_rows;
    cuda_mark(b, KVQ_PART_LM_HEAD, 0);
    for (size_t r0 = 0; r0 < R; r0 += step) {
        const size_t n = R - r0 < step ? R - r0 : step;
        logits_of(b, x + r0 * (size_t)b->m->cfg.hidden, n);
        for (size_t r = 0; r < n; r++)
            p[r] = kvq_sampler_get_params(smp[r0 + r]);
        if (r0 == 0)
            fold_done(cb);
        if (kvq_gpu_sample(cb->smp, cb->logits, n, p, u + r0, tok + r0, row_st + r0) != KVQ_OK)
            cb->sticky = 1;
    }
    close_forward(cb);
    return cb->sticky ? KVQ_ERR_DEVICE : KVQ_OK;
}

/* A decode step of rows rows (mark has just opened it) as a CUDA graph:
 * not the timed forwards (their events would be recorded once) nor the
 * first one (its kernels' first launches load their code). */
int cuda_step_begin(kvq_backend *b, size_t rows)
{
    cuda_backend *cb = cb_of(b);
    if (!cb->step || cb->graphs_off || cb->timing || cb->forwards[0] < 2 || cb->sticky)
        return 0;
    cb->step_err = 0;
    return kvq_cuda_step_begin(cb->step, (uint64_t)rows) != KVQ_CUDA_STEP_OFF;
}

/* Counts a step graph that ran (ok) or did not. A step that keeps failing
 * (cannot be captured, or changes shape every time) runs as queued from
 * then on; the recorder stays, idle, as the store's caches point at it. */
void graph_outcome(cuda_backend *cb, bool ok)
{
    cb->graph_fails = ok ? 0 : cb->graph_fails + 1;
    cb->graphs_off |= cb->graph_fails >= kGraphMaxFails;
}

void cuda_step_cancel(kvq_backend *b)
{
    cuda_backend *cb = cb_of(b);
    kvq_cuda_step_cancel(cb->step);
    graph_outcome(cb, false);
}

kvq_status cuda_step_end(kvq_backend *b)
{
    cuda_backend *cb = cb_of(b);
    if (cb->step_err) {
        cuda_step_cancel(b);
        return KVQ_ERR_DEVICE;
    }
    const kvq_status st = kvq_cuda_step_launch(cb->step);
    graph_outcome(cb, st == KVQ_OK);
    return st;
}

void cuda_free(kvq_backend *b)
{
    cuda_backend *cb = cb_of(b);
    if (cb->layers)
        for (int l = 0; l < b->m->cfg.n_layers; l++) {
            const kvq_layer_weights *w = &cb->layers[l];
            const float *p[] = {w->attn_norm, w->ffn_norm,       w->post_attn_norm, w->post_ffn_norm, w->bqkv,
                                w->q_norm,    w->k_norm,         w->bo,             w->bgu,            w->bdown};
            for (const float *q : p)
                cudaFree(const_cast<float *>(q));
            for (int i = 0; cb->mats && i < 4; i++)
                cudaFree(cb->mats[l][i].w);
        }
    free(cb->layers);
    free(cb->mats);
    void *p[] = {cb->embed.w, cb->lm.w, cb->final_norm, cb->rope_cos, cb->rope_sin, cb->rope_cos_local,
                 cb->rope_sin_local, cb->lm_x,
                 cb->logits,  cb->ids,   b->pos,         cb->xh,       cb->y2};
    for (void *q : p)
        cudaFree(q);
    float **slot[KVQ_N_ACTS];
    size_t floats[KVQ_N_ACTS];
    kvq_acts_table(&b->acts, b->m, 0, slot, floats);
    for (int i = 0; i < KVQ_N_ACTS; i++)
        cudaFree(*slot[i]);
    kvq_gpu_sampler_free(cb->smp);
    for (cuda_backend::mark_set &m : cb->sets) {
        for (int i = 0; m.ev && i < cb->max_marks; i++)
            if (m.ev[i])
                cudaEventDestroy(m.ev[i]);
        free(m.ev);
        free(m.tag);
    }
    if (cb->blas)
        cublasDestroy(cb->blas);
    kvq_cuda_step_free(cb->step);
    cudaFree(cb->blas_ws);
    cudaFreeHost(cb->pin_ids);
    cudaFreeHost(cb->pin_pos);
    if (cb->stream)
        cudaStreamDestroy(cb->stream);
    delete cb;
}

const struct kvq_backend_ops cuda_ops = {
    cuda_embed, cuda_norm, cuda_linear, cuda_qkv_rope, cuda_glu,
    nullptr, nullptr, /* moe_route, moe_experts: no expert kernels yet (create refuses MoE models) */
    cuda_lm_head, cuda_lm_sample, cuda_free,
    cuda_set_pos, cuda_mark, cuda_part_times, cuda_step_begin, cuda_step_end, cuda_step_cancel,
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

/* The device type of a host matrix: its file's 16-bit type when every
 * block has it, else f32. */
wtype wtype_of(const struct kvq_wmat *wm)
{
    const enum kvq_st_dtype t = wm->n_blocks ? wm->b[0].dtype : KVQ_ST_F32;
    for (int i = 1; i < wm->n_blocks; i++)
        if (wm->b[i].dtype != t)
            return W_F32;
    return t == KVQ_ST_BF16 ? W_BF16 : t == KVQ_ST_F16 ? W_F16 : W_F32;
}

/* Uploads a host weight matrix in type t (16-bit: its file bytes as they
 * are; f32: widened). */
kvq_status upload_mat(const struct kvq_wmat *wm, wtype t, void *dev)
{
    const size_t n = (size_t)wm->rows * (size_t)wm->cols;
    if (t != W_F32) {
        size_t off = 0;
        for (int i = 0; i < wm->n_blocks; i++) {
            const size_t bytes = (size_t)wm->b[i].rows * (size_t)wm->cols * 2;
            if (cudaMemcpy(static_cast<uint8_t *>(dev) + off, wm->b[i].data, bytes, cudaMemcpyHostToDevice) !=
                cudaSuccess)
                return KVQ_ERR_DEVICE;
            off += bytes;
        }
        return KVQ_OK;
    }
    float *tmp = static_cast<float *>(malloc((n ? n : 1) * sizeof(float)));
    if (!tmp)
        return KVQ_ERR_NOMEM;
    kvq_wmat_to_f32(wm, tmp);
    kvq_status st = cudaMemcpy(dev, tmp, n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess ? KVQ_OK
                                                                                                 : KVQ_ERR_DEVICE;
    free(tmp);
    return st;
}

size_t wbytes(wtype t)
{
    return t == W_F32 ? 4 : 2;
}

kvq_status alloc_dmat(dmat *d, wtype t, size_t n)
{
    d->t = t;
    return cudaMalloc(&d->w, (n ? n : 1) * wbytes(t)) == cudaSuccess ? KVQ_OK : KVQ_ERR_NOMEM;
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
    const size_t qkv = (size_t)m->qkv_dim;
    cb->layers = static_cast<kvq_layer_weights *>(calloc((size_t)c->n_layers, sizeof *cb->layers));
    cb->mats = static_cast<dmat(*)[4]>(calloc((size_t)c->n_layers, sizeof *cb->mats));
    if (!cb->layers || !cb->mats)
        return KVQ_ERR_NOMEM;
    kvq_status st = KVQ_OK;
    for (int l = 0; l < c->n_layers && st == KVQ_OK; l++) {
        const struct kvq_layer_weights *w = &m->layers[l];
        kvq_layer_weights *o = &cb->layers[l];
        struct {
            const float *src;
            size_t n;
            const float **dst;
        } t[] = {{w->attn_norm, h, &o->attn_norm}, {w->ffn_norm, h, &o->ffn_norm},
                 {w->post_attn_norm, h, &o->post_attn_norm}, {w->post_ffn_norm, h, &o->post_ffn_norm},
                 {w->bqkv, qkv, &o->bqkv},         {w->q_norm, d, &o->q_norm},     {w->k_norm, d, &o->k_norm},
                 {w->bo, h, &o->bo},               {w->bgu, 2 * f, &o->bgu},       {w->bdown, h, &o->bdown}};
        for (size_t i = 0; i < sizeof t / sizeof t[0] && st == KVQ_OK; i++)
            st = upload(t[i].src, t[i].n, t[i].dst);
        for (int i = 0; i < 4 && st == KVQ_OK; i++) {
            const struct kvq_wmat *wm = &m->mats[l][i];
            st = alloc_dmat(&cb->mats[l][i], wtype_of(wm), (size_t)wm->rows * (size_t)wm->cols);
            if (st == KVQ_OK)
                st = upload_mat(wm, cb->mats[l][i].t, cb->mats[l][i].w);
        }
    }
    if (st == KVQ_OK)
        st = upload(m->final_norm, h, &cb->final_norm);
    const size_t rope = (size_t)c->max_ctx * (size_t)(c->arch.rotary_dim / 2);
    for (int local = 0; local < (c->arch.rope_local_theta > 0 ? 2 : 1) && st == KVQ_OK; local++) {
        float *rcos = nullptr, *rsin = nullptr; /* the model keeps no table (rope.c) */
        st = kvq_rope_table(c, (size_t)c->max_ctx, local, &rcos, &rsin);
        if (st == KVQ_OK)
            st = upload(rcos, rope, local ? &cb->rope_cos_local : &cb->rope_cos);
        if (st == KVQ_OK)
            st = upload(rsin, rope, local ? &cb->rope_sin_local : &cb->rope_sin);
        free(rcos);
        free(rsin);
    }
    /* embedding table and LM head in their file's type (f32 where the
     * types differ): rows copied, or widened a slice of rows at a time */
    const size_t V = (size_t)c->vocab, step = 4096;
    const enum kvq_st_dtype et = m->embed->dtype;
    const wtype emb_t = et == KVQ_ST_BF16 ? W_BF16 : et == KVQ_ST_F16 ? W_F16 : W_F32;
    wtype lm_t = m->n_lm ? wtype_of(&m->lm[0].wm) : W_F32;
    for (int k = 1; k < m->n_lm; k++)
        if (wtype_of(&m->lm[k].wm) != lm_t)
            lm_t = W_F32;
    if (st == KVQ_OK && (st = alloc_dmat(&cb->embed, emb_t, V * h)) == KVQ_OK)
        st = alloc_dmat(&cb->lm, lm_t, V * h);
    if (st == KVQ_OK && emb_t != W_F32 &&
        cudaMemcpy(cb->embed.w, m->embed->data, V * h * 2, cudaMemcpyHostToDevice) != cudaSuccess)
        st = KVQ_ERR_DEVICE;
    float *tmp = st == KVQ_OK ? static_cast<float *>(malloc(step * h * sizeof(float))) : nullptr;
    if (st == KVQ_OK && !tmp)
        st = KVQ_ERR_NOMEM;
    for (size_t r = 0; st == KVQ_OK && emb_t == W_F32 && r < V; r += step) {
        const size_t n = V - r < step ? V - r : step;
        st = kvq_st_to_f32_range(m->embed, r * h, n * h, tmp);
        if (st == KVQ_OK && cudaMemcpy(static_cast<float *>(cb->embed.w) + r * h, tmp, n * h * sizeof(float),
                                       cudaMemcpyHostToDevice) != cudaSuccess)
            st = KVQ_ERR_DEVICE;
    }
    free(tmp);
    for (int k = 0; st == KVQ_OK && k < m->n_lm; k++) {
        const struct kvq_lm_slice *sl = &m->lm[k];
        st = upload_mat(&sl->wm, lm_t, static_cast<uint8_t *>(cb->lm.w) + (size_t)sl->start * h * wbytes(lm_t));
    }
    return st;
}

} // namespace

namespace {

/* The sizes of the working buffers that depend on max_rows, apart from
 * kvq_acts: one place for create and kvq_backend_cuda_work_bytes. */
struct work_sizes {
    size_t lm_rows;   /* rows of lm_x and logits */
    size_t xh_bytes;  /* the 16-bit hi and lo inputs of the widest projection (hidden, q_dim or ffn) */
    size_t y2_floats; /* a split product's halves: kSplitRows rows of the widest output */
};

work_sizes work_of(const kvq_model *m, size_t max_rows)
{
    work_sizes w;
    w.lm_rows = max_rows < kLmRows ? max_rows : kLmRows;
    const int wide = m->cfg.ffn > m->q_dim ? (m->cfg.ffn > m->cfg.hidden ? m->cfg.ffn : m->cfg.hidden)
                                           : (m->q_dim > m->cfg.hidden ? m->q_dim : m->cfg.hidden);
    w.xh_bytes = 2 * max_rows * (size_t)wide * 2;
    /* the widest output: the LM head's vocab, 2 ffn or q + 2 kv */
    size_t widest = (size_t)m->cfg.vocab > 2 * (size_t)m->cfg.ffn ? (size_t)m->cfg.vocab : 2 * (size_t)m->cfg.ffn;
    widest = widest > (size_t)m->qkv_dim ? widest : (size_t)m->qkv_dim;
    w.y2_floats = 2 * (max_rows < kSplitRows ? max_rows : kSplitRows) * widest;
    return w;
}

} /* namespace */

extern "C" size_t kvq_backend_cuda_work_bytes(const kvq_model *m, size_t max_rows)
{
    struct kvq_acts a;
    float **slot[KVQ_N_ACTS];
    size_t floats[KVQ_N_ACTS], n = 0;
    kvq_acts_table(&a, m, max_rows, slot, floats);
    for (int i = 0; i < KVQ_N_ACTS; i++)
        n += floats[i];
    const work_sizes w = work_of(m, max_rows);
    n += w.lm_rows * ((size_t)m->cfg.hidden + (size_t)m->cfg.vocab) + w.y2_floats;
    return n * sizeof(float) + w.xh_bytes;
}

extern "C" kvq_status kvq_backend_cuda_create(const kvq_model *m, size_t max_rows, unsigned flags, kvq_backend **out)
{
    if (kvq_backend_cuda_refusal(m)) /* no expert kernels yet: the callers name the reason */
        return KVQ_ERR_UNSUPPORTED;
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
    if (cudaStreamCreate(&cb->stream) != cudaSuccess || cublasCreate(&cb->blas) != CUBLAS_STATUS_SUCCESS ||
        cudaMalloc(&cb->blas_ws, kBlasWorkspace) != cudaSuccess ||
        cublasSetWorkspace(cb->blas, cb->blas_ws, kBlasWorkspace) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(cb->blas, cb->stream) != CUBLAS_STATUS_SUCCESS) {
        cudaGetLastError();
        cuda_free(b);
        return KVQ_ERR_DEVICE;
    }
    b->dev_stream = cb->stream;
    kvq_status st = upload_model(cb);
    float **slot[KVQ_N_ACTS];
    size_t floats[KVQ_N_ACTS];
    kvq_acts_table(&b->acts, m, max_rows, slot, floats);
    const work_sizes ws = work_of(m, max_rows);
    for (int i = 0; i < KVQ_N_ACTS && st == KVQ_OK; i++)
        st = alloc(slot[i], floats[i]);
    if (st == KVQ_OK)
        st = alloc(&cb->lm_x, ws.lm_rows * (size_t)m->cfg.hidden);
    if (st == KVQ_OK && cudaMalloc(&cb->xh, ws.xh_bytes) != cudaSuccess)
        st = KVQ_ERR_NOMEM;
    cb->y2_floats = ws.y2_floats;
    if (st == KVQ_OK && cudaMalloc(&cb->y2, cb->y2_floats * sizeof(float)) != cudaSuccess)
        st = KVQ_ERR_NOMEM;
    if (st == KVQ_OK)
        st = alloc(&cb->logits, ws.lm_rows * (size_t)m->cfg.vocab);
    const size_t mr = max_rows;
    if (st == KVQ_OK && (cudaMalloc(&cb->ids, mr * sizeof(int32_t)) != cudaSuccess ||
                         cudaMalloc(&b->pos, mr * sizeof(int32_t)) != cudaSuccess))
        st = KVQ_ERR_NOMEM;
    if (st == KVQ_OK && (cudaHostAlloc(&cb->pin_ids, mr * sizeof(int32_t), cudaHostAllocDefault) != cudaSuccess ||
                         cudaHostAlloc(&cb->pin_pos, mr * sizeof(int32_t), cudaHostAllocDefault) != cudaSuccess))
        st = KVQ_ERR_NOMEM;
    if (st == KVQ_OK && (flags & KVQ_BACKEND_GRAPHS))
        st = kvq_cuda_step_create(cb->stream, kGraphKeys, &cb->step);
    cb->fast16 = !!(flags & KVQ_BACKEND_FAST16);
    b->dev_step = cb->step;
    if (st == KVQ_OK)
        st = kvq_gpu_sampler_create(m->cfg.vocab, mr, &cb->smp);
    /* a forward marks 10 part changes per layer (into and out of its four
     * products and its attention), then the LM head's; a set that ran out
     * dropped the last layers' time from every part */
    cb->max_marks = 10 * m->cfg.n_layers + 8;
    for (cuda_backend::mark_set &ms : cb->sets) {
        if (st != KVQ_OK)
            break;
        ms.ev = static_cast<cudaEvent_t *>(calloc((size_t)cb->max_marks, sizeof *ms.ev));
        ms.tag = static_cast<uint8_t *>(malloc((size_t)cb->max_marks));
        if (!ms.ev || !ms.tag)
            st = KVQ_ERR_NOMEM;
        for (int i = 0; st == KVQ_OK && i < cb->max_marks; i++)
            if (cudaEventCreate(&ms.ev[i]) != cudaSuccess)
                st = KVQ_ERR_DEVICE;
    }
    if (st != KVQ_OK) {
        cuda_free(b);
        return st;
    }
    *out = b;
    return KVQ_OK;
}
