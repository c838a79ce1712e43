/* cuda_internal.cuh - the device cache object and what its .cu files share.
 * C++ (nvcc) only; the public C API is kvq_cuda.h.
 */
#ifndef KVQ_CUDA_INTERNAL_CUH
#define KVQ_CUDA_INTERNAL_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "codec_internal.h"
#include "kvq_attn.h"
#include "kvq_cuda.h"
#include "kvq_cuda_hooks.cuh"
#include "kvq_layout.h"
#include "rotation_internal.h"

/* Returns the kvq status of a failed CUDA call from the enclosing function. */
#define KVQ_CU_TRY(call)                                                                           \
    do {                                                                                           \
        cudaError_t kvq_e_ = (call);                                                               \
        if (kvq_e_ != cudaSuccess)                                                                 \
            return kvq_cuda_status_of(kvq_e_);                                                     \
    } while (0)

kvq_status kvq_cuda_status_of(cudaError_t e);
/* Makes sure a device is present (cached). KVQ_OK or KVQ_ERR_NO_DEVICE. */
kvq_status kvq_cuda_require_device(void);

/* Largest batch one kernel launch takes: sequence ids and lengths travel as
 * kernel parameters (no host->device copy per call, graph-capturable). */
#define KVQ_CU_MAX_BATCH 128

/* Most splits of one (sequence, KV head) in the fused kernel: the split
 * boundaries travel as kernel parameters too (kvq_cu_fast_params.split_at). */
#define KVQ_CU_MAX_SPLITS 256

/* One rotation as device tables, enough to reproduce kvq_rotation_apply bit
 * for bit for HADAMARD and IDENTITY (rotation_internal.h's contract). */
struct kvq_dev_rot {
    int kind;          /* enum kvq_rot_kind */
    int dim, p, m, rounds;
    float scale;       /* power-of-two HADAMARD */
    const float *signs; /* rounds * dim */
    const float *mix;   /* m * m, NULL when m == 1 */
};

/* A codec travels by value as a kernel argument, with codebooks of up to 4
 * bits inline (what the fused kernel and the tq3/tq4 paths index); every
 * codebook, the 5- to 8-bit ones of tq5, tq6 and tq8 included, is also in
 * device memory (kvq_dev_codec.levels_d): 256 levels inline would make every
 * launch carry 4 KB of parameters. */
#define KVQ_CUDA_TQ_MAX_LEVELS 16
/* Levels of the widest codebook (tq8): the shared-memory tables of the group
 * and prefill kernels. */
#define KVQ_CUDA_LEVELS_CAP 256

/* Everything a kernel needs about one codec (passed by value). */
struct kvq_dev_codec {
    int type, dim, bits, qjl, levels;
    int rotated;       /* tq types: a Lloyd-Max codebook */
    int in_rot;        /* rows live in R's domain: tq types and the rotated baselines */
    int base;          /* the row layout's type (kvq_layout_base_type): q8_0 for q8_0r */
    int gpu_encode;    /* 1 when kvq_cu_encode can reproduce the CPU bytes */
    float centroids[KVQ_CUDA_TQ_MAX_LEVELS];
    float boundaries[KVQ_CUDA_TQ_MAX_LEVELS - 1];
    float kappa;       /* qjl_kappa_f */
    const float *levels_d; /* tq types: levels centroids, then levels - 1 boundaries (device) */
    struct kvq_dev_rot R, S;
};

/* Centroid i of a tq codec, from the argument or, over 4 bits, from device
 * memory. */
__device__ __forceinline__ float kvq_cu_centroid(const kvq_dev_codec &c, unsigned i)
{
    return c.levels <= KVQ_CUDA_TQ_MAX_LEVELS ? c.centroids[i] : c.levels_d[i];
}

/* The code of rotated coordinate y: the number of boundaries y exceeds, as
 * the CPU encoder counts them (tq_ref.c; the binary search gives the same
 * count over the ascending boundaries, as tq_avx2.c's does). */
__device__ __forceinline__ int kvq_cu_bucket(const kvq_dev_codec &c, float y)
{
    if (c.levels <= KVQ_CUDA_TQ_MAX_LEVELS) {
        int k = 0;
        for (int i = 0; i + 1 < c.levels; i++)
            k += y > c.boundaries[i];
        return k;
    }
    const float *b = c.levels_d + c.levels;
    int lo = 0, hi = c.levels - 1;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (y > b[mid])
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Where the pages live and how a page is laid out (kvq_layout.h, "device
 * page layout"). */
struct kvq_dev_pages {
    uint8_t *pool;
    uint64_t page_bytes;
    const int32_t *ptab; /* [max_seqs][max_pages_per_seq] */
    uint32_t max_pages_per_seq;
    uint32_t page_tokens;
    uint32_t n_kv_heads;
    struct kvq_dev_layout dl;
};

struct kvq_cuda_cache {
    struct kvq_cuda_cache_config cfg;
    struct kvq_page_layout layout; /* of host pages (page copies use it) */
    struct kvq_dev_layout dev;     /* of the pool's pages */
    kvq_cache *twin; /* a page-less CPU cache with the same config: the codecs */
    const kvq_codec *ck, *cv;
    struct kvq_dev_codec dk, dv;
    cudaStream_t stream;
    cudaStream_t capture_stream, saved_stream; /* kvq_cuda_graph_begin .. _end (cuda_graph.cu) */
    kvq_cuda_step *step; /* kvq_cuda_cache_set_step: every launch of an append or attend goes through it */

    /* pages */
    uint8_t *pool;
    size_t pool_pages;
    size_t max_pages_per_seq;
    int32_t *ptab_d;   /* device page tables */
    int32_t *ptab_h;   /* host mirror */
    size_t *len;       /* tokens per sequence */
    size_t *n_pages;   /* pages held per sequence */
    int32_t *free_list;
    size_t n_free;
    uint32_t *page_refs; /* [pool_pages] sequences whose table holds the page (kvq_cuda_cache_share) */

    /* codec tables on the device: signs and mix of R and S for K and V,
     * dense rotations for queries (R_k, S_k) and outputs (R_v). */
    float *tables_d;
    float *rk_dense, *sk_dense, *rv_dense, *sv_dense; /* d x d row-major: y = M x */

    /* encode scratch */
    int *flag_d;             /* input check result */
    int32_t *tok_pin;        /* pinned twin of tok_h: a step graph's copy reads it when the graph runs */
    int32_t *tok_d, *tok_h;  /* per appended token of a call of n: page index [0, n), slot in the page [n, 2n) */
    size_t tok_cap;

    /* f16 override rows (kvq_cache.h: sinks and the recent window), per
     * sequence: ov_rows = sink_rows + ring rows of [H][d] f16, K and V apart;
     * token t < sink_rows in row t, a later one in row sink_rows + t % ring.
     * The ring holds the tokens from ring_lo[seq] on (older rows may have
     * been overwritten: read packed, as the CPU cache does after a deep
     * truncation). */
    uint16_t *ov_k_d, *ov_v_d;
    int ov_rows, sink_rows, ring;
    size_t *ring_lo;
    float *xtra_d;           /* override partials: [KVQ_CU_MAX_BATCH][Hq][d + 2] */

    /* attention workspace */
    float *qprep_d;          /* ref kernel: [KVQ_CU_MAX_BATCH][Hq][2d] */
    uint8_t *qfrag_d;        /* fast kernel: per (batch entry, kv head) fragment block */
    float *part_d;           /* split partials: [entries][G][d + 2] */
    size_t part_entries;
    float *ref_part_d;       /* the reference kernel's split partials: [ref_part_entries][2d + 2] */
    size_t ref_part_entries;
    float alpha_k, alpha_v;  /* codebook scales of the fused kernel's f16 tables */
    float int_scale_k;       /* fixed-point scale of the integer key scores' K table (1 for f16 K) */
    int n_sm;
    int cc_major;
    /* key centering (cfg.cache.center_k): keys of tokens [0, packed_len[seq])
     * are encoded, the rest wait in the ring for their page to fill; the
     * attention kernels add gain_d[(entry * Hq + hq) * max_pages_per_seq + page]
     * (q . m~ of the page, scaled as the kernel's scores) */
    int center;
    size_t *packed_len;
    float *gain_d;
    float *mrot_d; /* the prefill kernel's rotated page means: [max_pages_per_seq][H][d] */
    kvq_cuda_prefill_ws *pws; /* kvq_cuda_cache_set_prefill_ws: the dense prefill path's scratch (borrowed) */
};

/* The dense prefill path (cuda_prefill_dense.cu): whether it takes a chunk
 * of n rows, and the chunk's attention from pos0 (a page boundary with the
 * window), its rows already appended. */
int kvq_cu_prefill_dense_ok(const kvq_cuda_cache *c, const kvq_cuda_prefill_ws *ws, int n_q_heads, size_t n);
kvq_status kvq_cu_prefill_dense(kvq_cuda_cache *c, kvq_cuda_prefill_ws *ws, int seq, size_t pos0, size_t n,
                                const float *k, const float *v, const float *q, int n_q_heads, float scale,
                                float *out);

struct kvq_dev_pages kvq_cu_pages_of(const kvq_cuda_cache *c);

/* Fills d from a host codec and uploads its rotation tables into tables
 * (device floats, at least kvq_cu_codec_table_floats(c) of them).
 * @return KVQ_OK or KVQ_ERR_DEVICE. */
size_t kvq_cu_codec_table_floats(const kvq_codec *c);
kvq_status kvq_cu_codec_upload(const kvq_codec *c, float *tables, struct kvq_dev_codec *d);

/* Encode kernels (cuda_encode.cu). Rows are (token, head, K|V):
 * x rows [n_tokens][n_kv_heads][dim]; token i goes to page tok_page[i],
 * slot tok_slot[i], and where the cache keeps f16 override rows (sinks,
 * recent window) also to row tok_row[i] (-1: none) of sequence tok_seq[i]
 * in f16. check: ORs 1 (non-finite) / 2 (range) into *flag; the
 * encoder writes nothing when flag is set and *flag != 0 (the same stream
 * orders the two, so the input check costs no host round trip before it). */
kvq_status kvq_cu_check_rows(const kvq_cuda_cache *c, size_t n_tokens, const float *k, const float *v,
                             int *flag_d);
kvq_status kvq_cu_encode_rows(const kvq_cuda_cache *c, size_t n_tokens, const float *k, const float *v,
                              const int32_t *tok_page_d, const int32_t *tok_slot_d, const int32_t *tok_seq_d,
                              const int32_t *tok_row_d, const int *flag_d);

/* Key centering: one page's keys to encode (cuda_encode.cu, pack_kernel):
 * tokens [from, to) of sequence seq in pool page `page`, whose first token
 * is p0; fresh: the page gets its mean first (from == p0, to == p0 + P).
 * The call's appended keys start at token in_first of seq, input row
 * in_row. Eight int32 words, uploaded with the call's token tables. */
struct kvq_cu_pack_job {
    int32_t seq, page, p0, from, to, fresh, in_first, in_row;
};
static_assert(sizeof(kvq_cu_pack_job) == 8 * sizeof(int32_t), "a pack job is eight words");

/* Launches pack_kernel over n_jobs jobs (a job with to <= from does nothing),
 * before the append's encode kernel. */
kvq_status kvq_cu_pack_keys(const kvq_cuda_cache *c, int n_jobs, const kvq_cu_pack_job *jobs_d, const float *k,
                            const int *flag_d);

/* cuda_side.cu, for decode entries 0..nb (sequence seqs[i], its first n[i]
 * tokens, the packed ones [lo[i], hi[i]) and the rest f16 override rows),
 * scores scaled by scale, in base 2 when base2 (the fused kernel's units):
 * the override rows' partials into c->xtra_d (kvq_cu_attend_overrides;
 * with_gains: also the key-mean gains, in the same launch), or the gains
 * alone into c->gain_d (kvq_cu_key_gains). Launched on c's stream and step.
 * @return KVQ_OK or KVQ_ERR_DEVICE. */
kvq_status kvq_cu_attend_overrides(kvq_cuda_cache *c, int nb, const int *seqs, const int *n, const int *lo,
                                   const int *hi, const float *q, int Hq, float scale, int base2, int with_gains);
kvq_status kvq_cu_key_gains(kvq_cuda_cache *c, int nb, const int *seqs, const int *lo, const int *hi, const float *q,
                            int Hq, float scale, int base2);

/* Ends c's open capture (cuda_graph.cu): c issues on its own stream again;
 * *graph is the captured graph or NULL. */
cudaError_t kvq_cu_capture_end(kvq_cuda_cache *c, cudaGraph_t *graph);

/* Attention workspace (cuda_attn.cu): sizes and slot tables. */
kvq_status kvq_cu_attn_init(kvq_cuda_cache *c);
void kvq_cu_attn_free(kvq_cuda_cache *c);

/* ---- the fused kernel (cuda_attn_fast.cu) ---------------------------- */

enum { KVQ_CU_KT_TQ3J = 0, KVQ_CU_KT_TQ3 = 1, KVQ_CU_KT_F16 = 2 };
enum { KVQ_CU_VT_TQ3 = 0, KVQ_CU_VT_F16 = 1 };

/* Per (batch entry, KV head) query block written by the prep kernel:
 * fragments of the code scores and of the QJL sign sums (f16 A fragments,
 * 4096 + 4096 bytes; integer key scores: s8 B fragments, 4096 + 2048
 * bytes), then per query 2 sigma (integer: 2 sigma / (256 kFixMax)), -T and
 * (integer) the code scale 1 / (S_q S_k) at byte 8192 (see
 * cuda_attn_fast.cu). */
#define KVQ_CU_QFRAG_BYTES (4096 + 4096 + 128)

namespace kvq_cu {
/* How a rotation is applied: not at all, by the warp transform (HADAMARD,
 * IDENTITY: O(d log d)) or through its dense matrix (other kinds). */
enum { ROT_NONE = 0, ROT_WARP = 1, ROT_DENSE = 2 };

struct rot_arg {
    int mode;
    kvq_dev_rot fast;
    const float *dense; /* column-major for queries, row-major for outputs */
};
} /* namespace kvq_cu */

struct kvq_cu_fast_params {
    struct kvq_dev_pages pg;
    const uint8_t *qfrag; /* [n_batch][H] blocks of KVQ_CU_QFRAG_BYTES */
    float *part;          /* [(b * H + h) * n_splits + split][G * (128 + 2)] */
    int n_splits, H, G;
    int pdl;              /* in: programmatic dependent launch allowed (sm_90+; integer key
                             scores only: that kernel waits for the prep kernel itself) */
    float kappa;          /* K codec's qjl_kappa_f */
    kvq_cu::tq3_lut lut_k, lut_v;
    kvq_cu::tq3_ilut ilut_k; /* integer key scores: the K centroids in 16-bit fixed point */
    int seq[KVQ_CU_MAX_BATCH];
    int lo[KVQ_CU_MAX_BATCH];  /* entry b attends to the packed tokens [lo[b], len[b]) */
    int len[KVQ_CU_MAX_BATCH];
    /* split s of a sequence of n stage units covers units
     * [n * split_at[s] >> 16, n * split_at[s + 1] >> 16); split_at[0] = 0,
     * split_at[n_splits] = 65536 (set by kvq_cu_fast_launch) */
    uint32_t split_at[KVQ_CU_MAX_SPLITS + 1];
    /* host side: launches the prep kernel, which writes qfrag; called by
     * kvq_cu_fast_launch before the fused kernel unless that prepares its
     * queries itself */
    kvq_status (*prep)(void *ctx);
    void *prep_ctx;
    kvq_cuda_step *step;  /* host side: the cache's step recorder (launches go through it) */
    /* key centering: gain[((b * Hq) + hq) * gain_stride + page] is added to
     * the scores of page `page` (gain_kernel, log2 units); NULL: none */
    const float *gain;
    int gain_stride;
    int gain_shift;       /* log2 of the 16-token segments of a page, -1 when not a power of two */
    /* integer key scores only, in: q set allows each block to prepare its own query block
     * from the raw queries q [n_batch][Hq][128] (warp rotations only; see
     * cuda_prep.cuh) instead of reading qfrag; kvq_cu_fast_launch keeps it
     * for a launch of one wave of blocks and clears it otherwise */
    const float *q;
    int Hq;
    float qscale, inv_sk; /* scale * log2(e); 1 / the K codebook's integer scale */
    kvq_cu::rot_arg rk, sk;
    int pdl_used;         /* out: the fused kernel was launched that way (it waits for the prep
                             kernel itself), so the merge kernel may be too */
};
/* passed by value as the fused kernel's one parameter: under the 4 KB that
 * every driver and architecture takes */
static_assert(sizeof(kvq_cu_fast_params) <= 4096, "fused-kernel parameters over 4 KB");

/* Programmatic dependent launch (sm_90): a kernel launched with the
 * attribute may start once every block of the previous kernel in the stream
 * has called pdl_trigger() (or ended); pdl_wait() then blocks until that
 * kernel has finished and its writes are visible. Both are no-ops for a
 * kernel launched the ordinary way, and before sm_90. */
__device__ __forceinline__ void kvq_cu_pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void kvq_cu_pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* kern<<<grid, block, smem, stream>>>(args...), with the programmatic
 * dependent launch attribute when pdl is set, through the cache's step
 * recorder (kvq_cuda.h: recorded or patched while a step graph is open). */
template <typename... K, typename... A>
kvq_status kvq_cu_launch(kvq_cuda_step *step, bool pdl, void (*kern)(K...), dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, A &&...args)
{
    return kvq_cuda_step_launch_kernel(step, stream, pdl, kern, grid, block, smem, static_cast<A &&>(args)...);
}

/* Returns a failed kvq call's status from the enclosing function. */
#define KVQ_CU_RET(call)                                                                                           \
    do {                                                                                                           \
        const kvq_status kvq_st_ = (call);                                                                         \
        if (kvq_st_ != KVQ_OK)                                                                                     \
            return kvq_st_;                                                                                        \
    } while (0)

/* Launches the fused kernel for kt/vt (enums above) over n_batch entries;
 * n_splits <= 0 chooses the split count (returned in *used_splits) so that
 * the GPU is filled, capped by max_splits. */
kvq_status kvq_cu_fast_launch(kvq_cu_fast_params *p, int kt, int vt, int n_batch, int n_splits, int max_splits,
                              int n_sm, cudaStream_t stream);

#endif /* KVQ_CUDA_INTERNAL_CUH */
