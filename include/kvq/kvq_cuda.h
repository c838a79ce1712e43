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
 *    The ring holds page_tokens rows, as a host cache's does, so the prefix
 *    views of an append that ends at or before the end of the page its first
 *    token lands in (kvq_cuda_cache_attend_prefix) and truncations within
 *    the page of the last token see exactly what the CPU cache would; rows
 *    the ring no longer holds (an append across a page end, a truncation
 *    into an earlier page) are read packed until their page fills.
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

/** Bytes of one sequence's f16 override rows (sinks and the recent window,
 *  K and V) in a device cache of cfg: sink_tokens rows plus, with
 *  recent_f16, a ring of page_tokens rows (as a host cache's,
 *  kvq_cache_bytes_for, which caps the ring at max_tokens besides). Needs no
 *  device. @return 0 when cfg is invalid. */
KVQ_API size_t kvq_cuda_cache_f16_bytes(const struct kvq_cache_config *cfg);

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

/* ---- step graphs ---------------------------------------------------- */

/* A step recorder: the work of one repeated step (a decode step of every
 * layer: the caller's kernels and the caches' appends and attention, all on
 * one stream) recorded once as a CUDA graph and replayed, so the GPU runs
 * the step's hundreds of kernels without a launch gap each.
 *
 * Between kvq_cuda_step_begin and kvq_cuda_step_launch every kernel and
 * copy of the step goes through kvq_cuda_step_kernel / _copy (the caches
 * given the recorder with kvq_cuda_cache_set_step do this themselves). The
 * first step of a key is captured; a later one with the same key is
 * replayed: the calls are made again in the same order, each compared with
 * the recorded one, and only the nodes whose arguments changed (lengths,
 * split counts, uniforms) are patched in the instantiated graph. Copies
 * read host memory when the graph runs, so their host sources must be
 * pinned and keep their address. Work another library issues on the stream
 * (cuBLAS, CUB) is captured with the step and must not be issued again
 * while replaying (kvq_cuda_step_mode() tells); its arguments must be the
 * same for every step of a key. A replay whose calls differ in number,
 * kind or launch attributes from the recorded ones, or during which any
 * other work reaches the stream, fails in kvq_cuda_step_launch with
 * nothing queued: the caller undoes the step's host-side state and runs it
 * again without the recorder; the key is captured afresh next time. */
typedef struct kvq_cuda_step kvq_cuda_step;

enum kvq_cuda_step_mode {
    KVQ_CUDA_STEP_OFF = 0,     /* calls run as they are made */
    KVQ_CUDA_STEP_CAPTURE = 1, /* calls are recorded into a new graph */
    KVQ_CUDA_STEP_REPLAY = 2   /* calls patch the recorded graph */
};

/** A recorder issuing on stream (a cudaStream_t, not the legacy default
 *  stream, which cannot be captured) that keeps the graphs of up to
 *  max_keys keys (least recently used dropped).
 *  @return KVQ_OK and *out; KVQ_ERR_INVALID_ARG; KVQ_ERR_NOMEM;
 *  KVQ_ERR_NO_DEVICE. */
KVQ_API kvq_status kvq_cuda_step_create(void *stream, int max_keys, kvq_cuda_step **out);
/** Frees s and its graphs; accepts NULL. */
KVQ_API void kvq_cuda_step_free(kvq_cuda_step *s);
/** Opens a step of shape key: REPLAY when a graph of key is recorded, else
 *  CAPTURE. @return the mode; OFF (nothing opened) when s is NULL, a step is
 *  already open or the capture cannot start. */
KVQ_API enum kvq_cuda_step_mode kvq_cuda_step_begin(kvq_cuda_step *s, uint64_t key);
/** The open step's mode (OFF for NULL or none open). */
KVQ_API enum kvq_cuda_step_mode kvq_cuda_step_mode(const kvq_cuda_step *s);
/** Closes the open step and queues its graph on the stream.
 *  @return KVQ_OK; KVQ_ERR_DEVICE (nothing queued: the capture failed, or
 *  the replay's calls did not match the recording or work went around the
 *  recorder; the key's graph is dropped); KVQ_ERR_INVALID_ARG (none open). */
KVQ_API kvq_status kvq_cuda_step_launch(kvq_cuda_step *s);
/** Closes the open step without queuing anything (the step failed on the
 *  host); a capture is dropped. Accepts NULL and no open step. */
KVQ_API void kvq_cuda_step_cancel(kvq_cuda_step *s);
/** Steps captured and replayed since create (for the run summary). */
KVQ_API void kvq_cuda_step_counts(const kvq_cuda_step *s, size_t *captured, size_t *replayed);

/** func (a __global__ function) over grid[3] x block[3] with smem bytes of
 *  dynamic shared memory and the n_args arguments args[i] of arg_bytes[i]
 *  bytes, on stream: launched (s NULL or no step open), recorded, or
 *  compared and patched. pdl: with the programmatic-dependent-launch
 *  attribute (sm_90). The stream must be s's while a step is open.
 *  @return KVQ_OK; KVQ_ERR_DEVICE (also a mismatch while replaying, which
 *  the launch reports again). */
KVQ_API kvq_status kvq_cuda_step_kernel(kvq_cuda_step *s, void *stream, const void *func, const unsigned grid[3],
                                        const unsigned block[3], size_t smem, int pdl, void **args,
                                        const size_t *arg_bytes, int n_args);
/** bytes from src to dst (device or pinned host memory, any direction),
 *  queued on stream, recorded or patched as kvq_cuda_step_kernel. */
KVQ_API kvq_status kvq_cuda_step_copy(kvq_cuda_step *s, void *stream, void *dst, const void *src, size_t bytes);

/** c issues its appends' and attention's kernels and copies through s
 *  (NULL: plainly); give it s's stream too (kvq_cuda_cache_set_stream).
 *  While a step is open, an append of a cache whose config has check_input
 *  set fails with KVQ_ERR_INVALID_ARG (its check would wait for the
 *  device), and the pages an append lands in must have been taken before
 *  the step (kvq_cuda_cache_reserve). */
KVQ_API void kvq_cuda_cache_set_step(kvq_cuda_cache *c, kvq_cuda_step *s);

/** Makes room for n more tokens of seq: the pages they land in are taken
 *  (and made its own where shared), so appends of up to n tokens neither
 *  fail for want of pages nor update the page table (what a replayed step
 *  needs). @return KVQ_OK; KVQ_ERR_INVALID_ARG; KVQ_ERR_CONTEXT_FULL;
 *  KVQ_ERR_BUDGET; KVQ_ERR_DEVICE. */
KVQ_API kvq_status kvq_cuda_cache_reserve(kvq_cuda_cache *c, int seq, size_t n);

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
 *  GPU encoding supports every type with a HADAMARD or IDENTITY rotation
 *  (or none) and the orthogonal QJL projection; the other configs (DCT,
 *  Gaussian S) are encoded on the host (kvq_cuda_cache_upload) and give
 *  KVQ_ERR_UNSUPPORTED here.
 *  All-or-nothing when check_input is set: every row is checked first.
 *  @return KVQ_OK; KVQ_ERR_NONFINITE / KVQ_ERR_RANGE (bad row, nothing
 *  written); KVQ_ERR_CONTEXT_FULL; KVQ_ERR_BUDGET (pool exhausted);
 *  KVQ_ERR_INVALID_ARG (also while a graph capture is open);
 *  KVQ_ERR_UNSUPPORTED; KVQ_ERR_DEVICE. */
KVQ_API kvq_status kvq_cuda_cache_append(kvq_cuda_cache *c, int seq, size_t n_tokens, const float *k_dev,
                                 const float *v_dev);

/** @return 1 when kvq_cuda_cache_append encodes c's config on the GPU
 *  (HADAMARD or IDENTITY rotations, or none, and the orthogonal QJL
 *  projection), 0 otherwise (then only kvq_cuda_cache_upload fills it). */
KVQ_API int kvq_cuda_cache_gpu_encodes(const kvq_cuda_cache *c);

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
 *  max_seqs, a NaN or infinite scale, n_q_heads not a multiple of
 *  n_kv_heads or beyond max_q_per_kv, opts->kernel not one of enum
 *  kvq_cuda_kernel); KVQ_ERR_UNSUPPORTED (KVQ_CUDA_KERNEL_FUSED where it does not apply);
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

/** A prefill workspace: the bounded scratch of the dense prefill path, which
 *  decodes a chunk's packed past into f16 rows (seg_tokens positions at a
 *  time) and attends them as plain FlashAttention on f16 tensor cores,
 *  several times faster than the tile kernel for long pasts
 *  (docs/attention-cuda.md). One workspace serves every cache of one stream
 *  whose geometry it has (the layers of a model): their calls are ordered.
 *  Sizes: chunks of up to max_rows positions; seg_tokens a multiple of 64.
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (a size out of range: n_q_heads not
 *  a multiple of n_kv_heads, head_dim not a multiple of 16); KVQ_ERR_NOMEM
 *  (device memory); KVQ_ERR_NO_DEVICE. */
typedef struct kvq_cuda_prefill_ws kvq_cuda_prefill_ws;
KVQ_API kvq_status kvq_cuda_prefill_ws_create(int n_kv_heads, int n_q_heads, int head_dim, size_t max_rows,
                                              size_t seg_tokens, kvq_cuda_prefill_ws **out);
/** Frees ws (NULL: nothing). Caches that borrow it must not prefill after. */
KVQ_API void kvq_cuda_prefill_ws_free(kvq_cuda_prefill_ws *ws);
/** @return the device bytes kvq_cuda_prefill_ws_create allocates for these
 *  sizes (no device needed; 0 for sizes it refuses outright). */
KVQ_API size_t kvq_cuda_prefill_ws_bytes(int n_kv_heads, int n_q_heads, int head_dim, size_t max_rows,
                                         size_t seg_tokens);
/** Lends c a workspace (NULL: none): kvq_cuda_cache_prefill then takes the
 *  dense path for chunks it fits (head_dim 64 or 128, the workspace's head
 *  counts, n <= max_rows), the tile kernel for the rest. */
KVQ_API void kvq_cuda_cache_set_prefill_ws(kvq_cuda_cache *c, kvq_cuda_prefill_ws *ws);

#ifdef __cplusplus
}
#endif

#if defined(__CUDACC__) && defined(__cplusplus)
#include <cuda_runtime.h>
#include <tuple>
#include <utility>

namespace kvq_step_detail {
template <typename T, size_t... I>
kvq_status launch(kvq_cuda_step *s, cudaStream_t st, bool pdl, const void *f, dim3 g, dim3 b, size_t smem, T &t,
                  std::index_sequence<I...>)
{
    void *args[sizeof...(I) + 1] = {(void *)&std::get<I>(t)...};
    const size_t bytes[sizeof...(I) + 1] = {sizeof(std::get<I>(t))...};
    const unsigned grid[3] = {g.x, g.y, g.z}, block[3] = {b.x, b.y, b.z};
    return kvq_cuda_step_kernel(s, (void *)st, f, grid, block, smem, pdl, args, bytes, (int)sizeof...(I));
}
} /* namespace kvq_step_detail */

/** kern<<<grid, block, smem, stream>>>(args...) through the recorder s
 *  (kvq_cuda_step_kernel; s may be NULL): the arguments are converted to
 *  the kernel's parameter types first. */
template <typename... K, typename... A>
kvq_status kvq_cuda_step_launch_kernel(kvq_cuda_step *s, cudaStream_t stream, bool pdl, void (*kern)(K...),
                                       dim3 grid, dim3 block, size_t smem, A &&...args)
{
    std::tuple<K...> held(static_cast<A &&>(args)...);
    return kvq_step_detail::launch(s, stream, pdl, (const void *)kern, grid, block, smem, held,
                                   std::index_sequence_for<K...>{});
}
#endif /* __CUDACC__ */
#endif /* KVQ_CUDA_H */
