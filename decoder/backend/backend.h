/* backend.h - the operations the forward pass is written in.
 *
 * The layer loop (model/forward.c) never touches a weight matrix, a norm
 * formula or a cache itself: it calls these ops on activation buffers the
 * backend allocated, and the KV store interface (kv_store.h) for attention.
 * A second backend (CUDA) implements the same table over device memory, so
 * the forward pass stays one piece of code for every backend and every
 * architecture: the architecture reaches the ops as the descriptor
 * struct kvq_model_arch (kvq_model.h), decided once when config.json is
 * parsed, never as a model_type string.
 *
 * A backend instance belongs to one sequence state or one batch (kvq_batch.h:
 * rows of several sequences in one forward). Its buffers are float
 * arrays in the backend's memory, row-major [rows][cols] with rows <=
 * max_rows (host pointers for the CPU backend). Ops never allocate.
 *
 * Adding a backend: implement struct kvq_backend_ops and a create function
 * that fills struct kvq_backend (backend_cpu.c is the model), then a KV store
 * (kv_store.h) over the backend's memory, and add both to the case table of
 * tests/test_backend_ops.c.
 */
#ifndef KVQ_BACKEND_H
#define KVQ_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "decoder_internal.h"
#include "kvq_model.h"
#include "kvq_sampler.h"
#include "kvq_status.h"

/* The projections of a layer; each comes with its optional bias. */
enum kvq_weight {
    KVQ_W_QKV = KVQ_WEIGHT_QKV,         /* [q_dim + 2 kv_dim][hidden]: q, k and v rows of one matmul */
    KVQ_W_O = KVQ_WEIGHT_O,             /* [hidden][q_dim] */
    KVQ_W_GATE_UP = KVQ_WEIGHT_GATE_UP, /* [2 ffn][hidden]: gate rows, then up rows */
    KVQ_W_DOWN = KVQ_WEIGHT_DOWN        /* [hidden][ffn] */
};

/* The norms of a layer, and the one before the LM head (layer ignored).
 * The sandwich sites (arch.sandwich_norm) norm a projection's output into
 * the residual stream: y += norm(x). */
enum kvq_norm_site { KVQ_NORM_ATTN, KVQ_NORM_FFN, KVQ_NORM_FINAL, KVQ_NORM_POST_ATTN, KVQ_NORM_POST_FFN };

/* Activation buffers of one sequence state, [max_rows][...] each. */
struct kvq_acts {
    float *x;    /* [hidden] residual stream */
    float *xn;   /* [hidden] normed input of a projection */
    float *qkv;  /* [q_dim + 2 kv_dim] */
    float *q;    /* [n_heads][head_dim] after q-norm and RoPE */
    float *k;    /* [n_kv_heads][head_dim] after k-norm and RoPE */
    float *v;    /* [n_kv_heads][head_dim] */
    float *attn; /* [n_heads][head_dim] attention output */
    float *gu;   /* [2 ffn] gate and up */
    float *h;    /* [ffn] act(gate) * up */
};

/* The buffers of a, with the floats each holds for rows rows of model m, in
 * one table, so that every backend allocates and frees the same set. */
#define KVQ_N_ACTS 9
static inline void kvq_acts_table(struct kvq_acts *a, const struct kvq_model *m, size_t rows,
                                  float **slot[KVQ_N_ACTS], size_t floats[KVQ_N_ACTS])
{
    const size_t h = (size_t)m->cfg.hidden, f = (size_t)m->cfg.ffn;
    float **s[KVQ_N_ACTS] = {&a->x, &a->xn, &a->qkv, &a->q, &a->k, &a->v, &a->attn, &a->gu, &a->h};
    const size_t n[KVQ_N_ACTS] = {h, h, (size_t)m->qkv_dim, (size_t)m->q_dim, (size_t)m->kv_dim,
                                  (size_t)m->kv_dim, (size_t)m->q_dim, 2 * f, f};
    for (int i = 0; i < KVQ_N_ACTS; i++) {
        slot[i] = s[i];
        floats[i] = rows * n[i];
    }
}

/* What a device backend's queued work is counted as (kvq_seq_stats gpu_*). */
enum kvq_part { KVQ_PART_OTHER, KVQ_PART_MATMUL, KVQ_PART_ATTN, KVQ_PART_LM_HEAD, KVQ_N_PARTS };

typedef struct kvq_backend kvq_backend;

struct kvq_backend_ops {
    /* embedding rows of ids[0..T) (host ids in [0, vocab)), times the
     * architecture's embedding scale, into x[T][hidden] */
    void (*embed)(kvq_backend *b, const int32_t *ids, size_t T, float *x);
    /* y[T][hidden] = norm(x) with the site's weights (arch.norm) */
    void (*norm)(kvq_backend *b, enum kvq_norm_site site, int layer, const float *x, float *y, size_t T);
    /* y[T][out] (+)= x[T][in] . W^T + bias: accumulate adds to y (the
     * residual add of the output projections) */
    void (*linear)(kvq_backend *b, enum kvq_weight w, int layer, const float *x, float *y, size_t T,
                   int accumulate);
    /* qkv[T] -> q, k, v: the optional per-head q/k norm, then RoPE (arch.rope,
     * arch.rotary_dim), row t at position pos[t]: pos is backend memory
     * (b->pos, as set_pos filled it), so rows of several sequences, each at
     * its own position, go through one call */
    void (*qkv_rope)(kvq_backend *b, int layer, const float *qkv, size_t T, const int32_t *pos, float *q,
                     float *k, float *v);
    /* h[T][ffn] = act(gate) * up from gu[T][2 ffn] (arch.act) */
    void (*glu)(kvq_backend *b, const float *gu, float *h, size_t T);
    /* mixture of experts, sparse layer `layer` (kvq_model_layer_is_moe): the
     * router of rows x[T][hidden] (the FFN-normed input): its logits, then
     * the arch's top-k (kvq_model_arch.router, norm_topk) into b->moe_ids
     * and b->moe_w [T][top_k] (backend memory: on a device the choice never
     * goes through the host), each row by descending weight. NULL in a
     * backend that cannot run sparse layers (it refuses such models at create) */
    void (*moe_route)(kvq_backend *b, int layer, const float *x, size_t T);
    /* y[T][hidden] += for each row, over its k experts e in ascending e,
     * moe_w . down_e(act(gate_e . x) * (up_e . x)), with the experts of the
     * last moe_route over the same rows (transformers' order of the sum: 0
     * plus each expert's weighted output, then the residual add). The rows
     * are grouped by expert, so each expert's weights are read once per call
     * whatever the rows (prefill). @return KVQ_OK; KVQ_ERR_IO (an expert
     * cache could not read an expert: y is then undefined) */
    kvq_status (*moe_experts)(kvq_backend *b, int layer, const float *x, float *y, size_t T);
    /* final norm and LM head of rows x[0..R): logits [R][vocab] (host, if not
     * NULL; arch.final_softcap applied) and/or argmax [R] (host, if not NULL;
     * lowest id on ties). @return KVQ_OK or KVQ_ERR_NONFINITE. */
    kvq_status (*lm_head)(kvq_backend *b, const float *x, size_t R, float *logits, int32_t *argmax);
    /* final norm, LM head and one token per row of x[0..R), chosen where
     * the logits are: row r drawn with smp[r]'s settings at the uniform u[r]
     * (kvq_sampler_pick; no RNG advances: the caller skips the draws it
     * keeps). tok[R] and row_st[R] on the host: row_st[r] is the row's
     * kvq_sampler_pick status (tok[r] -1 unless KVQ_OK).
     * @return KVQ_OK, or KVQ_ERR_DEVICE (the rows are then undefined). */
    kvq_status (*lm_sample)(kvq_backend *b, const float *x, size_t R, kvq_sampler *const *smp, const double *u,
                            int32_t *tok, kvq_status *row_st);
    void (*free)(kvq_backend *b);
    /* copies the host positions pos[0..T) of a forward's rows into b->pos
     * (once per forward, not per layer: a device backend uploads them) */
    void (*set_pos)(kvq_backend *b, const int32_t *pos, size_t T);
    /* device backends (NULL on the CPU): the work queued from here on counts
     * as part; rows > 0 opens a forward of that many rows. Never waits: the
     * device times are read from events once the work is done. */
    void (*mark)(kvq_backend *b, enum kvq_part part, size_t rows);
    /* device backends: seconds of device time per part since the last
     * reset (an estimate: backend_cuda.cu times a sample of the forwards),
     * waiting for the queued work; reset zeroes the totals */
    void (*part_times)(kvq_backend *b, double t[KVQ_N_PARTS], int reset);
    /* device backends (NULL on the CPU): the forward just opened by
     * mark(rows) is a decode step (one row per sequence) that may run as
     * one CUDA graph: recorded the first time, replayed with the new
     * lengths and positions after that (kvq_cuda.h, "step graphs"); the KV
     * store issues through the same recorder (kv_store.h attach). @return 1
     * when the step is recorded or replayed, and step_end or step_cancel
     * then closes it; 0 when it runs as queued (timed forwards, the first
     * one, graphs off) */
    int (*step_begin)(kvq_backend *b, size_t rows);
    /* queues the step's graph. @return KVQ_OK; KVQ_ERR_DEVICE: nothing of
     * the step ran (the caller undoes it and runs it again as queued) */
    kvq_status (*step_end)(kvq_backend *b);
    void (*step_cancel)(kvq_backend *b);
};

struct kvq_backend {
    const struct kvq_backend_ops *ops;
    const char *name;
    const struct kvq_model *m;
    size_t max_rows;      /* rows of every activation buffer */
    int device;           /* 1: the buffers are device memory (not readable by the host) */
    struct kvq_acts acts; /* owned by the backend */
    int32_t *pos;         /* [max_rows] row positions in the backend's memory (set_pos) */
    int32_t *moe_ids;     /* [max_rows][top_k] experts of the last moe_route (NULL: dense model) */
    float *moe_w;         /* [max_rows][top_k] their weights */
    void *dev_stream;     /* device backends: the stream every op issues on (a cudaStream_t) */
    void *dev_step;       /* device backends: the step recorder (a kvq_cuda_step), NULL when graphs are off */
};

/* The device's time per part (part_times, nothing reset) into the gpu_*
 * fields of kvq_seq_stats and kvq_batch_stats; left as they are on a backend
 * without device timing. */
static inline void kvq_backend_gpu_parts(kvq_backend *b, double *matmul, double *attn, double *lm_head, double *other)
{
    if (!b->ops->part_times)
        return;
    double t[KVQ_N_PARTS];
    b->ops->part_times(b, t, 0);
    *matmul = t[KVQ_PART_MATMUL];
    *attn = t[KVQ_PART_ATTN];
    *lm_head = t[KVQ_PART_LM_HEAD];
    *other = t[KVQ_PART_OTHER];
}

#ifdef __cplusplus
extern "C" {
#endif

/** The CPU backend: OpenBLAS sgemm for chunks, the batch-invariant few-row
 *  kernel (matvec_internal.h) for decode and verification rows, scalar norms,
 *  RoPE and activations over the model's f32 weights as loaded.
 *  @return KVQ_OK and *out; KVQ_ERR_NOMEM. */
kvq_status kvq_backend_cpu_create(const struct kvq_model *m, size_t max_rows, kvq_backend **out);

/** CPU backend: keep at most `bytes` of expert weights in memory, reading
 *  the experts from the checkpoint's files on demand (expert_cache.h) and,
 *  with prefetch, the next sparse layer's likely experts ahead; a second
 *  call replaces the cache. @return KVQ_OK; KVQ_ERR_INVALID_ARG (a dense
 *  model, weights widened at load, bytes below one expert: err says which);
 *  KVQ_ERR_IO; KVQ_ERR_NOMEM. */
kvq_status kvq_backend_cpu_expert_cache(kvq_backend *b, size_t bytes, int prefetch, int direct, kvq_error *err);
/** The CPU backend's expert cache statistics. @return 0 (and st zeroed) without a cache, else 1. */
int kvq_backend_cpu_expert_stats(const kvq_backend *b, struct kvq_expert_stats *st);
/** Why the last step's expert read failed (the call gave KVQ_ERR_IO): file,
 *  bytes, offset and reason; NULL otherwise (and for other backends). */
const char *kvq_backend_cpu_expert_error(const kvq_backend *b);

/* kvq_backend_cuda_create flags. */
enum {
    KVQ_BACKEND_GRAPHS = 1, /* decode steps run as CUDA graphs (step_begin) */
    KVQ_BACKEND_FAST16 = 2  /* products of more than 64 rows (prefill chunks) round their inputs to
                               the weights' 16-bit type: one GEMM instead of the exact two */
};

/* The flags a sequence config asks of the CUDA backend. */
static inline unsigned kvq_seq_backend_flags(const struct kvq_seq_config *sc)
{
    return (sc->cuda_graphs ? KVQ_BACKEND_GRAPHS : 0u) | (sc->fast_prefill ? KVQ_BACKEND_FAST16 : 0u);
}

/** The CUDA backend (backend_cuda.cu): the model's weights uploaded to
 *  the current GPU, cuBLAS projections, our kernels for the rest, on a
 *  stream of its own; the logits and ids lm_head returns are copied to the
 *  host. flags: KVQ_BACKEND_*.
 *  @return KVQ_OK and *out; KVQ_ERR_NO_DEVICE (built without CUDA or no
 *  GPU); KVQ_ERR_NOMEM (device memory); KVQ_ERR_DEVICE. */
kvq_status kvq_backend_cuda_create(const struct kvq_model *m, size_t max_rows, unsigned flags, kvq_backend **out);
/* The device bytes kvq_backend_cuda_create allocates for rows of max_rows
 * beyond the weights and tables: the activations (kvq_acts), the LM head's
 * rows, the products' 16-bit inputs and split halves (kvq_seq_plan.work_bytes;
 * 0 in a build without CUDA). */
size_t kvq_backend_cuda_work_bytes(const struct kvq_model *m, size_t max_rows);

/* What the CUDA backend cannot compute yet, asked before anything is
 * created: the models with sandwich norms (Gemma 2 and 3; the norm op has
 * their sites and qkv_rope Gemma 3's local base, checked op by op on the
 * GPU, but the whole model is not yet) and attention soft-caps.
 * @return KVQ_OK, or KVQ_ERR_UNSUPPORTED with one line. */
static inline kvq_status kvq_backend_cuda_supports(const struct kvq_model_config *c, kvq_error *err)
{
    if (c->arch.sandwich_norm)
        return kvq_error_set(err, KVQ_ERR_UNSUPPORTED,
                             "%s (sandwich norms) is not on the GPU yet: --device cpu runs it",
                             c->model_type);
    if (c->arch.attn_softcap > 0)
        return kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "attention soft-capping is not on the GPU yet");
    return KVQ_OK;
}

#ifdef __cplusplus
}
#endif

/** Why the CUDA backend cannot run m yet: one line for the error, or NULL
 *  when it can. Sequence and batch creation check it before creating one. */
static inline const char *kvq_backend_cuda_refusal(const struct kvq_model *m)
{
    return m->cfg.arch.n_experts > 0 ? "mixture-of-experts layers run on the CPU only for now (--device cpu)" : NULL;
}

/** Frees b; accepts NULL. */
static inline void kvq_backend_free(kvq_backend *b)
{
    if (b)
        b->ops->free(b);
}

#endif /* KVQ_BACKEND_H */
