/* kvq_cuda.h - the packed KV cache and fused decode attention on an NVIDIA GPU.
 *
 * A device cache holds one layer's keys and values for up to max_seqs
 * sequences in a pool of pages in GPU memory. Every page has exactly the
 * byte layout of the CPU cache (kvq_layout.h), so pages copy between host
 * and device unchanged, and a sequence's page table maps its token t to
 * page table[t / page_tokens], slot t % page_tokens. Sequences grow and
 * shrink independently (each has its own length).
 *
 *  - append: encodes new tokens on the GPU, bit-identical to the CPU encoder
 *    (kvq_codec_encode) for the same config and seed;
 *  - attend: decode attention for a batch of sequences, one query position
 *    each, straight from the packed pages (see docs/attention-cuda.md for
 *    the kernel);
 *  - page copies: kvq_cuda_cache_upload() mirrors a CPU kvq_cache into a
 *    sequence, kvq_cuda_cache_read_page()/write_page() move single pages;
 *  - f16 overrides (cache.recent_f16, cache.sink_tokens; kvq_cache.h): the
 *    sink tokens and a ring of recent rows are also kept in f16 per
 *    sequence, and attention reads them from there, as the CPU cache does.
 *    The ring holds 2 * page_tokens + KVQ_CACHE_F16_SLACK rows, so the
 *    prefix views of an append of up to page_tokens tokens
 *    (kvq_cuda_cache_attend_prefix) and truncations by up to
 *    KVQ_CACHE_F16_SLACK tokens see exactly what the CPU cache would; rows
 *    the ring no longer holds (a longer append, a deeper truncation) are read
 *    packed until their page fills.
 *
 * Pointers named *_dev are device memory (kvq_cuda_malloc or any cudaMalloc
 * pointer); all others are host memory. Shapes are row-major floats:
 *   K, V to append   [n_tokens][n_kv_heads][head_dim]
 *   queries, outputs [n_seqs][n_q_heads][head_dim], query head h uses KV head
 *                    h / (n_q_heads / n_kv_heads) (GQA).
 *
 * Every call returns a kvq_status: KVQ_ERR_NO_DEVICE when the library was
 * built without CUDA or no usable GPU is present (callers and tests use
 * kvq_cuda_device_count() to skip), KVQ_ERR_DEVICE when a CUDA call failed.
 * Nothing here prints or exits.
 *
 * Threading and streams: a cache and its calls belong to one host thread at
 * a time. Work is issued on the cache's stream (default: the legacy default
 * stream, see kvq_cuda_cache_set_stream); kvq_cuda_cache_attend() returns
 * once the work is queued, without synchronising. append() synchronises once
 * to learn whether the input rows were valid (all-or-nothing, like the CPU
 * cache) unless check_input is 0 in the config.
 */
#ifndef KVQ_CUDA_H
#define KVQ_CUDA_H

#include "kvq_export.h"

#include <stddef.h>
#include <stdint.h>

#include "kvq_cache.h"
#include "kvq_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- device --------------------------------------------------------- */

/** @return the number of usable CUDA devices; 0 without CUDA, without a
 *  driver or without a GPU (never an error). */
KVQ_API int kvq_cuda_device_count(void);

/** Fills name (NUL-terminated, at most n bytes) with the current device's
 *  name, its multiprocessor count and memory, e.g. "NVIDIA H100 80GB HBM3,
 *  132 SMs, 79.1 GiB". @return KVQ_OK or KVQ_ERR_NO_DEVICE. */
KVQ_API kvq_status kvq_cuda_device_describe(char *name, size_t n);

/** Free and total memory of the current device in bytes (cudaMemGetInfo).
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (NULL); KVQ_ERR_NO_DEVICE. */
KVQ_API kvq_status kvq_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);

/* ---- device memory helpers (so C callers need no CUDA headers) ------ */

/** @return KVQ_OK and *dev (bytes of device memory); KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_cuda_malloc(void **dev, size_t bytes);
/** Frees device memory; accepts NULL. */
KVQ_API void kvq_cuda_free(void *dev);
KVQ_API kvq_status kvq_cuda_memcpy_h2d(void *dev, const void *host, size_t bytes);
KVQ_API kvq_status kvq_cuda_memcpy_d2h(void *host, const void *dev, size_t bytes);
KVQ_API kvq_status kvq_cuda_memcpy_d2d(void *dst_dev, const void *src_dev, size_t bytes);
KVQ_API kvq_status kvq_cuda_memset(void *dev, int byte, size_t bytes);
/** Waits for all queued work on the device. @return KVQ_OK or KVQ_ERR_DEVICE
 *  (also reports an earlier asynchronous kernel failure). */
KVQ_API kvq_status kvq_cuda_synchronize(void);

/* ---- the device cache ---------------------------------------------- */

struct kvq_cuda_cache_config {
    /* Per-sequence layout, types, seeds and limits, exactly as for the CPU
     * cache: the device pages of a sequence are byte-identical to those of a
     * kvq_cache created with this config. cache.max_tokens is the limit per
     * sequence; cache.max_bytes is ignored (pool_pages is the budget). */
    struct kvq_cache_config cache;
    int max_seqs;       /* sequences the cache can hold, >= 1 */
    size_t pool_pages;  /* device pages shared by all sequences; 0 = enough for
                           max_seqs sequences of cache.max_tokens tokens */
    int max_q_per_kv;   /* largest n_q_heads / n_kv_heads attend() will see; 0 = 8 */
    int check_input;    /* 1 (default when created by kvq_cuda_cache_config_default):
                           append validates rows first and is all-or-nothing */
};

typedef struct kvq_cuda_cache kvq_cuda_cache;

/** Fills cfg: kvq_cache_config_default(&cfg->cache, ...), max_seqs, pool for
 *  all of them, max_q_per_kv 8, check_input 1. */
KVQ_API void kvq_cuda_cache_config_default(struct kvq_cuda_cache_config *cfg, int n_kv_heads, int head_dim,
                                   size_t max_tokens, int max_seqs);

/** Validates cfg, builds the codecs (as kvq_cache_create would), allocates
 *  the page pool (zero-filled), page tables, f16 override rows (sinks and
 *  the recent ring, when configured) and attention workspace.
 *  @return KVQ_OK and *out; KVQ_ERR_INVALID_ARG / KVQ_ERR_UNSUPPORTED (bad
 *  config); KVQ_ERR_NO_DEVICE; KVQ_ERR_NOMEM (host or device). */
KVQ_API kvq_status kvq_cuda_cache_create(const struct kvq_cuda_cache_config *cfg, kvq_cuda_cache **out);

/** Frees c and its device memory; accepts NULL. */
KVQ_API void kvq_cuda_cache_free(kvq_cuda_cache *c);

KVQ_API const struct kvq_cuda_cache_config *kvq_cuda_cache_config_of(const kvq_cuda_cache *c);
KVQ_API const struct kvq_page_layout *kvq_cuda_cache_layout(const kvq_cuda_cache *c);

/** Issues later work on stream (a cudaStream_t; NULL = default stream). */
KVQ_API void kvq_cuda_cache_set_stream(kvq_cuda_cache *c, void *stream);

/* CUDA-graph capture, for fixed-shape replay and for timing the device side
 * without the host's launch cost: the work c issues between begin and end
 * (attend calls; no synchronising call such as append) is recorded instead
 * of run, and kvq_cuda_graph_launch replays it on the default stream with
 * the arguments of the recorded calls, including the sequence lengths and
 * split counts at capture time. */
typedef struct kvq_cuda_graph kvq_cuda_graph;
/** @return KVQ_OK; KVQ_ERR_INVALID_ARG (c NULL or already capturing); KVQ_ERR_DEVICE. */
KVQ_API kvq_status kvq_cuda_graph_begin(kvq_cuda_cache *c);
/** Ends the capture (c issues on its own stream again) and instantiates it.
 *  @return KVQ_OK and *out; KVQ_ERR_INVALID_ARG (not capturing);
 *  KVQ_ERR_DEVICE (a recorded call was not capturable); KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_cuda_graph_end(kvq_cuda_cache *c, kvq_cuda_graph **out);
/** Queues one replay on the default stream. @return KVQ_OK or KVQ_ERR_DEVICE. */
KVQ_API kvq_status kvq_cuda_graph_launch(kvq_cuda_graph *g);
/** Frees g; accepts NULL. */
KVQ_API void kvq_cuda_graph_free(kvq_cuda_graph *g);

/** Tokens held by seq (0 for an invalid seq). */
KVQ_API size_t kvq_cuda_cache_len(const kvq_cuda_cache *c, int seq);

/** Pages of the pool not in use by any sequence. */
KVQ_API size_t kvq_cuda_cache_free_pages(const kvq_cuda_cache *c);

/** Drops tokens [n, len) of seq; whole pages past n return to the pool
 *  (a page another sequence shares stays until its last holder lets go).
 *  @return KVQ_OK or KVQ_ERR_INVALID_ARG (bad seq, n > len). */
KVQ_API kvq_status kvq_cuda_cache_truncate(kvq_cuda_cache *c, int seq, size_t n);

/** Prefix sharing, as kvq_cache_share on the CPU: the empty sequence dst
 *  takes the first n_tokens tokens of src, n_tokens a multiple of the page
 *  size, by pointing its table at src's pages (reference counted; no page
 *  is copied) and copying src's sink rows. A sequence about to write into a
 *  page another one holds (after a truncation into it) writes into a
 *  private copy first, so neither sees the other's later tokens; a sharer
 *  attends bit-identically to a sequence that encoded the same tokens. The
 *  recent f16 window of dst starts empty (its last page is whole and read
 *  packed, as on the CPU).
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (bad seqs, dst not empty, n_tokens
 *  over src's length or not whole pages). */
KVQ_API kvq_status kvq_cuda_cache_share(kvq_cuda_cache *c, int dst, int src, size_t n_tokens);

/** Encodes n_tokens tokens on the GPU and appends them to seq.
 *  k_dev, v_dev: [n_tokens][n_kv_heads][head_dim] floats in device memory.
 *  GPU encoding supports f32, f16 and the tq types with HADAMARD or
 *  IDENTITY rotations and the orthogonal QJL projection; other configs
 *  (DCT, Gaussian S, q8_0, q4_0) are encoded on the host
 *  (kvq_cuda_cache_upload) and give KVQ_ERR_UNSUPPORTED here.
 *  All-or-nothing when check_input is set: every row is checked first.
 *  @return KVQ_OK; KVQ_ERR_NONFINITE / KVQ_ERR_RANGE (bad row, nothing
 *  written); KVQ_ERR_CONTEXT_FULL; KVQ_ERR_BUDGET (pool exhausted);
 *  KVQ_ERR_INVALID_ARG (also while a graph capture is open);
 *  KVQ_ERR_UNSUPPORTED; KVQ_ERR_DEVICE. */
KVQ_API kvq_status kvq_cuda_cache_append(kvq_cuda_cache *c, int seq, size_t n_tokens, const float *k_dev,
                                 const float *v_dev);

/** One decode step for a batch: appends token i of k_dev/v_dev
 *  ([n_seqs][n_kv_heads][head_dim]) to sequence seqs[i] (host array of
 *  distinct sequence ids). Same errors as kvq_cuda_cache_append. */
KVQ_API kvq_status kvq_cuda_cache_append_batch(kvq_cuda_cache *c, int n_seqs, const int *seqs, const float *k_dev,
                                       const float *v_dev);

/** Replaces the content of seq with the tokens of a CPU cache whose config
 *  matches (heads, dim, types, seeds, rotation, QJL kind, page_tokens):
 *  its pages are copied host -> device (rewritten into the device page
 *  layout of kvq_layout.h on the way, nothing else changed).
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (mismatch, too long); KVQ_ERR_BUDGET;
 *  KVQ_ERR_NOMEM (host staging copy); KVQ_ERR_UNSUPPORTED (either cache
 *  keeps f16 override rows: they are not copied); KVQ_ERR_DEVICE. */
KVQ_API kvq_status kvq_cuda_cache_upload(kvq_cuda_cache *c, int seq, const kvq_cache *host);

/** Copies page i of seq (tokens [i * page_tokens, ...)) to/from host memory
 *  of layout->page_bytes bytes, in the host page layout: the GPU keeps pages
 *  in the device page layout of kvq_layout.h (tokens in groups, 3-bit codes
 *  in the device order) and these convert, so a page read back compares byte
 *  for byte with the CPU cache's. write_page() needs the page to exist (the
 *  sequence holds a token in it).
 *  @return KVQ_OK, KVQ_ERR_INVALID_ARG, KVQ_ERR_NOMEM (the host staging copy
 *  of the page) or KVQ_ERR_DEVICE. */
KVQ_API kvq_status kvq_cuda_cache_read_page(const kvq_cuda_cache *c, int seq, size_t i, void *host);
KVQ_API kvq_status kvq_cuda_cache_write_page(kvq_cuda_cache *c, int seq, size_t i, const void *host);

/* ---- decode attention ---------------------------------------------- */

/* Which kernel kvq_cuda_cache_attend runs. The values are pinned. */
enum kvq_cuda_kernel {
    KVQ_CUDA_KERNEL_AUTO = 0,  /* the fused tensor-core kernel where it applies
                                  (kvq_cuda_fast_supported); at head_dim 64, 96
                                  and 256 the group kernel for the same types
                                  (CUDA cores, a block per KV head); else the
                                  reference */
    KVQ_CUDA_KERNEL_FUSED = 1, /* the fused kernel only: KVQ_ERR_UNSUPPORTED where it does not apply */
    KVQ_CUDA_KERNEL_REF = 2    /* the scalar fp32 reference kernel (any type, any head dim, any group) */
};

struct kvq_cuda_attn_opts {
    enum kvq_cuda_kernel kernel;
    int n_splits; /* sequence splits per (sequence, KV head) for every kernel; 0 = chosen to fill the GPU */
};

/** The fused kernel covers head_dim 128, n_q_heads / n_kv_heads <= 8, K in
 *  {tq3j, tq3, f16} and V in {tq3, f16}, with any rotation kind: queries are
 *  rotated once and outputs rotated back once per call (a fast Hadamard
 *  transform for HADAMARD/IDENTITY, the dense matrix for DCT and the
 *  Gaussian S). For tq keys and n_q_heads / n_kv_heads <= 4 its key scores
 *  run on integer tensor cores, elsewhere on f16 ones. On sm_90 or newer the
 *  call's kernels (query prep, fused, split merge) are launched to overlap
 *  (programmatic dependent launch). Everything else runs on the group or the
 *  reference kernel (AUTO). @return 1 when it applies to c's config and
 *  n_q_heads. */
KVQ_API int kvq_cuda_fast_supported(const kvq_cuda_cache *c, int n_q_heads);

/** out_dev[i] = softmax(scale * q_i K^T) V over all tokens of seqs[i], for
 *  every query head. seqs: host array of n_seqs sequence ids (repeats
 *  allowed, every sequence non-empty). q_dev/out_dev: [n_seqs][n_q_heads]
 *  [head_dim] device floats. opts may be NULL (AUTO, automatic splits).
 *  Queued on the cache's stream; no allocation, no synchronisation.
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (bad seq, empty seq, n_seqs beyond
 *  max_seqs, n_q_heads not a multiple of n_kv_heads or beyond max_q_per_kv,
 *  opts->kernel not one of enum kvq_cuda_kernel); KVQ_ERR_UNSUPPORTED (KVQ_CUDA_KERNEL_FUSED where it does not apply);
 *  KVQ_ERR_DEVICE. */
KVQ_API kvq_status kvq_cuda_cache_attend(kvq_cuda_cache *c, int n_seqs, const int *seqs, const float *q_dev,
                                 int n_q_heads, float scale, float *out_dev,
                                 const struct kvq_cuda_attn_opts *opts);

/** Attention over prefixes, for a prefill chunk: as kvq_cuda_cache_attend,
 *  but entry i attends only to the first lens[i] tokens of seqs[i]
 *  (1 <= lens[i] <= the sequence's length), and n is not limited by max_seqs
 *  (entries run in batches). A chunk of T tokens appended to seq at pos0
 *  attends causally with T entries of seq and lens pos0 + 1 .. pos0 + T:
 *  exactly what appending and attending one token at a time computes.
 *  seqs and lens are host arrays of n entries.
 *  @return as kvq_cuda_cache_attend; KVQ_ERR_INVALID_ARG also for lens NULL
 *  or a length outside [1, len]. */
KVQ_API kvq_status kvq_cuda_cache_attend_prefix(kvq_cuda_cache *c, int n, const int *seqs, const size_t *lens,
                                                const float *q_dev, int n_q_heads, float scale, float *out_dev,
                                                const struct kvq_cuda_attn_opts *opts);

/** @return 1 when kvq_cuda_cache_prefill's kernel takes c's config
 *  and n_q_heads: head_dim 32, 64, 96, 128 or 256; up to 64 query heads per
 *  KV head; any type the GPU encoder appends but f32 (whose exact path f16
 *  operands would round) and values with QJL signs. */
KVQ_API int kvq_cuda_prefill_supported(const kvq_cuda_cache *c, int n_q_heads);

/** Appends a prefill chunk and attends it causally in one call: the n rows
 *  k_dev, v_dev ([n][n_kv_heads][head_dim] device floats) go to seq at
 *  pos0 = its length, and out_dev[i] = attention of q_dev[i] over the first
 *  pos0 + i + 1 tokens, read as kvq_cuda_cache_attend_prefix reads them
 *  (sinks and the recent window from f16 rows, the rest packed), so the
 *  result is what appending and attending one token at a time computes, up
 *  to f16 rounding of the operands: a block takes 128 query rows of one KV
 *  head (64 at head_dim 256) and reads every key tile once for all of them,
 *  on f16 tensor cores (docs/attention-cuda.md). With the recent window,
 *  the positions before the chunk's first page boundary go through the
 *  decode kernels. q_dev/out_dev: [n][n_q_heads][head_dim]. Queued on the
 *  cache's stream.
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (bad seq, n = 0, a NULL pointer, a
 *  non-finite scale, a graph capture open); KVQ_ERR_UNSUPPORTED where
 *  kvq_cuda_prefill_supported() says no; the errors of
 *  kvq_cuda_cache_append; KVQ_ERR_DEVICE. Nothing is appended on an error. */
KVQ_API kvq_status kvq_cuda_cache_prefill(kvq_cuda_cache *c, int seq, size_t n, const float *k_dev,
                                          const float *v_dev, const float *q_dev, int n_q_heads, float scale,
                                          float *out_dev);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_CUDA_H */
