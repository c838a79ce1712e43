/* kv_store.h - every layer's keys and values, behind one interface.
 *
 * The forward pass hands a store the post-RoPE keys and values of a chunk
 * and the chunk's queries, and gets attention outputs back; how the rows are
 * kept (types, pages, f16 windows, which device) is the store's business.
 * The shape is the device cache's (kvq_cuda.h): one store holds all layers
 * of up to max_seqs sequences, each sequence with its own length, and a call
 * may carry several sequences (batched decode), so a CUDA store maps a
 * layer to one kvq_cuda_cache whose sequences are the store's.
 *
 * Shapes (in the backend's memory): for a call over n_seqs sequences of T
 * new tokens each,
 *   k, v  [n_seqs][T][n_kv_heads][head_dim]
 *   q     [n_seqs][T][n_heads][head_dim], out likewise;
 * query head h reads KV head h / (n_heads / n_kv_heads).
 *
 * Adding a store (a new device, another cache organisation): implement these
 * ops, refuse what it cannot do at create (as kvq_kv_store_cuda_supports),
 * and create it where the engine picks its backend (batch.c).
 */
#ifndef KVQ_KV_STORE_H
#define KVQ_KV_STORE_H

#include <stddef.h>

#include "kvq_cache.h"
#include "kvq_model.h"
#include "kvq_status.h"

typedef struct kvq_kv_store kvq_kv_store;

struct kvq_kv_store_ops {
    /* Appends the T new tokens of each of seqs[0..n_seqs) to layer's rows
     * and writes the attention of their queries over everything the
     * sequence then holds, causally (query t of a sequence of length L
     * before the call sees tokens [0, L + t]). The store may rescale v in
     * place (the value-norm correction). On error the layer holds what it
     * held before for every sequence. */
    kvq_status (*append_attend)(kvq_kv_store *s, int layer, int n_seqs, const int *seqs, size_t T,
                                const float *k, float *v, const float *q, float *out);
    /* Appends the T new tokens of each of seqs[0..n_seqs) to layer's rows
     * without attending (k, v shaped as above): a context that comes from
     * elsewhere, e.g. a benchmark's synthetic one. All or nothing per
     * sequence. */
    kvq_status (*append)(kvq_kv_store *s, int layer, int n_seqs, const int *seqs, size_t T, const float *k,
                         const float *v);
    /* Makes room for n more tokens of seq in every layer, so that appends of
     * up to n tokens cannot fail for want of memory (and, on the device,
     * change no page table: what a replayed step graph needs). */
    kvq_status (*reserve)(kvq_kv_store *s, int seq, size_t n);
    /* Drops tokens [n, len) of seq in layers [0, n_layers). */
    void (*truncate)(kvq_kv_store *s, int seq, int n_layers, size_t n);
    /* Empties seq in every layer (pages may be kept for reuse). */
    void (*reset)(kvq_kv_store *s, int seq);
    /* Gives back the pages seq's tokens do not use (after reset or
     * truncate), so sequences that come and go share one memory budget. */
    void (*trim)(kvq_kv_store *s, int seq);
    /* Makes the empty seq dst hold the first n tokens of src in every
     * layer by sharing src's whole pages (kvq_cache_share: reference
     * counted, copy on write; kvq_cuda_cache_share on the device); n a
     * multiple of the page. NULL where the store cannot share pages. All or
     * nothing. */
    kvq_status (*share)(kvq_kv_store *s, int dst, int src, size_t n);
    /* Bytes and rows of seq, summed over layers. */
    void (*stats)(const kvq_kv_store *s, int seq, struct kvq_cache_stats *sum);
    /* Device stores (NULL elsewhere): issue on the device backend's stream
     * (kvq_backend.dev_stream) and through its step recorder (dev_step, may
     * be NULL), so a decode step's appends and attention join its graph. */
    void (*attach)(kvq_kv_store *s, void *stream, void *step);
    /* The host cache of (layer, seq) where the store has one, else NULL. */
    const kvq_cache *(*cache)(const kvq_kv_store *s, int layer, int seq);
    void (*free)(kvq_kv_store *s);
};

struct kvq_kv_store {
    const struct kvq_kv_store_ops *ops;
    int n_layers;
    int max_seqs;
};

/* Per-layer cache configs of a store; cfgs[l] for layer l. */
struct kvq_kv_store_config {
    const struct kvq_cache_config *cfgs; /* [n_layers] (copied) */
    int n_layers;
    int max_seqs;
    int n_heads;        /* query heads (GQA groups of n_heads / n_kv_heads) */
    size_t max_rows;    /* most tokens of one call over all its sequences */
    int v_norm_correct; /* kvq_seq_config.v_norm_correct */
    const struct kvq_layer_spec *specs; /* [n_layers] each layer's memory spec (layer_spec.c):
                         * its sliding window (a query at p sees (p - W, p]) and, where a
                         * store sizes a pool, its page bytes */
    float attn_scale;   /* score scale; 0 = 1 / sqrt(head_dim) */
};

/** A store of kvq_cache pages in host memory, attended by kvq_attn_* (the
 *  fused CPU kernels). With recent_f16 a chunk is appended and attended one
 *  position at a time, so a prefill sees exactly what token-by-token
 *  generation sees. A windowed layer keeps a ring of three caches of
 *  segments of KVQ_WINDOW_SEGMENT(W) tokens (the oldest reset when a new
 *  segment starts: memory bounded at any length) and attends its window
 *  from their decoded rows; the cache op returns its current segment. @return KVQ_OK and *out; a kvq_cache_create error (err
 *  says which layer); KVQ_ERR_NOMEM. */
kvq_status kvq_kv_store_cpu_create(const struct kvq_kv_store_config *cfg, kvq_kv_store **out,
                                   kvq_error *err);

/* Tokens per ring segment of a layer with window w: at least the window
 * plus a speculative rollback, and a whole chunk, so a chunk's appends never
 * reset a segment its first queries still read. */
#define KVQ_WINDOW_SEGMENT(w) ((size_t)(w) + 256 + 16)

/** What the device store cannot do yet, asked before anything is allocated
 *  (kvq_kv_store_cuda_create asks it first): sliding windows, a custom
 *  attention scale, the value-norm correction. @return KVQ_OK, or
 *  KVQ_ERR_UNSUPPORTED with one line saying what and what runs it. */
kvq_status kvq_kv_store_cuda_supports(const struct kvq_kv_store_config *cfg, kvq_error *err);

/** A store of kvq_cuda_cache pages on the current GPU, one device cache per
 *  layer holding all max_seqs sequences (kv_store_cuda.c); k, v, q and out
 *  are device memory. @return KVQ_OK and *out; KVQ_ERR_UNSUPPORTED
 *  (kvq_kv_store_cuda_supports);
 *  KVQ_ERR_BUDGET (a layer's budget share holds no page); a
 *  kvq_cuda_cache_create error (KVQ_ERR_NO_DEVICE without a GPU). */
kvq_status kvq_kv_store_cuda_create(const struct kvq_kv_store_config *cfg, kvq_kv_store **out, kvq_error *err);
/* The device bytes of the dense prefill path's scratch that
 * kvq_kv_store_cuda_create allocates for chunks of max_rows over a context of
 * max_tokens (at head dims 64 and 128, for caches the path supports: not f32
 * or V with QJL signs); 0 where it allocates none. No device needed. */
size_t kvq_kv_store_cuda_scratch_bytes(int n_kv, int n_heads, int head_dim, size_t max_rows, size_t max_tokens);

static inline void kvq_kv_store_free(kvq_kv_store *s)
{
    if (s)
        s->ops->free(s);
}

#endif /* KVQ_KV_STORE_H */
