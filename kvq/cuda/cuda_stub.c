/* cuda_stub.c - the kvq_cuda.h API for builds without nvcc.
 *
 * The Makefile defines KVQ_HAVE_CUDA only when it compiles the .cu files;
 * otherwise these stubs keep the API linkable, so the same programs build
 * everywhere and learn at run time (kvq_cuda_device_count() == 0) that
 * there is no GPU path.
 */
#include <string.h>

#include "kvq_cuda.h"
#include "kvq_layout.h"

#if !defined(KVQ_HAVE_CUDA)

int kvq_cuda_device_count(void)
{
    return 0;
}

kvq_status kvq_cuda_device_describe(char *name, size_t n)
{
    if (name && n)
        name[0] = '\0';
    return KVQ_ERR_NO_DEVICE;
}

kvq_status kvq_cuda_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    if (!free_bytes || !total_bytes)
        return KVQ_ERR_INVALID_ARG;
    *free_bytes = *total_bytes = 0;
    return KVQ_ERR_NO_DEVICE;
}

kvq_status kvq_cuda_malloc(void **dev, size_t bytes)
{
    (void)bytes;
    if (dev)
        *dev = NULL;
    return KVQ_ERR_NO_DEVICE;
}

void kvq_cuda_free(void *dev)
{
    (void)dev;
}

kvq_status kvq_cuda_memcpy_h2d(void *dev, const void *host, size_t bytes)
{
    (void)dev, (void)host, (void)bytes;
    return KVQ_ERR_NO_DEVICE;
}

kvq_status kvq_cuda_memcpy_d2h(void *host, const void *dev, size_t bytes)
{
    (void)dev, (void)host, (void)bytes;
    return KVQ_ERR_NO_DEVICE;
}

kvq_status kvq_cuda_memcpy_d2d(void *dst_dev, const void *src_dev, size_t bytes)
{
    (void)dst_dev, (void)src_dev, (void)bytes;
    return KVQ_ERR_NO_DEVICE;
}

kvq_status kvq_cuda_memset(void *dev, int byte, size_t bytes)
{
    (void)dev, (void)byte, (void)bytes;
    return KVQ_ERR_NO_DEVICE;
}

kvq_status kvq_cuda_synchronize(void)
{
    return KVQ_ERR_NO_DEVICE;
}

kvq_status kvq_cuda_graph_begin(kvq_cuda_cache *c)
{
    (void)c;
    return KVQ_ERR_NO_DEVICE;
}

kvq_status kvq_cuda_graph_end(kvq_cuda_cache *c, kvq_cuda_graph **out)
{
    (void)c;
    if (out)
        *out = NULL;
    return KVQ_ERR_NO_DEVICE;
}

kvq_status kvq_cuda_graph_launch(kvq_cuda_graph *g)
{
    (void)g;
    return KVQ_ERR_NO_DEVICE;
}

void kvq_cuda_graph_free(kvq_cuda_graph *g)
{
    (void)g;
}

void kvq_cuda_cache_config_default(struct kvq_cuda_cache_config *cfg, int n_kv_heads, int head_dim,
                                   size_t max_tokens, int max_seqs)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    kvq_cache_config_default(&cfg->cache, n_kv_heads, head_dim, max_tokens);
    cfg->max_seqs = max_seqs;
    cfg->max_q_per_kv = 8;
    cfg->check_input = 1;
}

kvq_status kvq_cuda_cache_create(const struct kvq_cuda_cache_config *cfg, kvq_cuda_cache **out)
{
    if (out)
        *out = NULL;
    if (cfg && (cfg->cache.sink_tokens < 0 || cfg->cache.sink_tokens > KVQ_CACHE_MAX_SINK_TOKENS))
        return KVQ_ERR_INVALID_ARG; /* as the CUDA build: checked before the device */
    return KVQ_ERR_NO_DEVICE;
}

void kvq_cuda_cache_free(kvq_cuda_cache *c)
{
    (void)c;
}

const struct kvq_cuda_cache_config *kvq_cuda_cache_config_of(const kvq_cuda_cache *c)
{
    (void)c;
    return NULL;
}

const struct kvq_page_layout *kvq_cuda_cache_layout(const kvq_cuda_cache *c)
{
    (void)c;
    return NULL;
}

void kvq_cuda_cache_set_stream(kvq_cuda_cache *c, void *stream)
{
    (void)c, (void)stream;
}

size_t kvq_cuda_cache_len(const kvq_cuda_cache *c, int seq)
{
    (void)c, (void)seq;
    return 0;
}

size_t kvq_cuda_cache_free_pages(const kvq_cuda_cache *c)
{
    (void)c;
    return 0;
}

kvq_status kvq_cuda_cache_share(kvq_cuda_cache *c, int dst, int src, size_t n_tokens)
{
    (void)c, (void)dst, (void)src, (void)n_tokens;
    return KVQ_ERR_NO_DEVICE;
}

kvq_status kvq_cuda_cache_truncate(kvq_cuda_cache *c, int seq, size_t n)
{
    (void)c, (void)seq, (void)n;
    return KVQ_ERR_NO_DEVICE;
}

kvq_status kvq_cuda_cache_append(kvq_cuda_cache *c, int seq, size_t n_tokens, const float *k_dev,
                                 const float *v_dev)
{
    (void)c, (void)seq, (void)n_tokens, (void)k_dev, (void)v_dev;
    return KVQ_ERR_NO_DEVICE;
}

kvq_status kvq_cuda_cache_append_batch(kvq_cuda_cache *c, int n_seqs, const int *seqs, const float *k_dev,
                                       const float *v_dev)
{
    (void)c, (void)n_seqs, (void)seqs, (void)k_dev, (void)v_dev;
    return KVQ_ERR_NO_DEVICE;
}

kvq_status kvq_cuda_cache_upload(kvq_cuda_cache *c, int seq, const kvq_cache *host)
{
    (void)c, (void)seq, (void)host;
    return KVQ_ERR_NO_DEVICE;
}

kvq_status kvq_cuda_cache_read_page(const kvq_cuda_cache *c, int seq, size_t i, void *host)
{
    (void)c, (void)seq, (void)i, (void)host;
    return KVQ_ERR_NO_DEVICE;
}

kvq_status kvq_cuda_cache_write_page(kvq_cuda_cache *c, int seq, size_t i, const void *host)
{
    (void)c, (void)seq, (void)i, (void)host;
    return KVQ_ERR_NO_DEVICE;
}

int kvq_cuda_fast_supported(const kvq_cuda_cache *c, int n_q_heads)
{
    (void)c, (void)n_q_heads;
    return 0;
}

kvq_status kvq_cuda_cache_attend(kvq_cuda_cache *c, int n_seqs, const int *seqs, const float *q_dev,
                                 int n_q_heads, float scale, float *out_dev,
                                 const struct kvq_cuda_attn_opts *opts)
{
    (void)c, (void)n_seqs, (void)seqs, (void)q_dev, (void)n_q_heads, (void)scale, (void)out_dev, (void)opts;
    return KVQ_ERR_NO_DEVICE;
}

kvq_status kvq_cuda_cache_attend_prefix(kvq_cuda_cache *c, int n, const int *seqs, const size_t *lens,
                                        const float *q_dev, int n_q_heads, float scale, float *out_dev,
                                        const struct kvq_cuda_attn_opts *opts)
{
    (void)c, (void)n, (void)seqs, (void)lens, (void)q_dev, (void)n_q_heads, (void)scale, (void)out_dev, (void)opts;
    return KVQ_ERR_NO_DEVICE;
}

int kvq_cuda_prefill_supported(const kvq_cuda_cache *c, int n_q_heads)
{
    (void)c, (void)n_q_heads;
    return 0;
}

kvq_status kvq_cuda_cache_prefill(kvq_cuda_cache *c, int seq, size_t n, const float *k_dev, const float *v_dev,
                                  const float *q_dev, int n_q_heads, float scale, float *out_dev)
{
    (void)c, (void)seq, (void)n, (void)k_dev, (void)v_dev, (void)q_dev, (void)n_q_heads, (void)scale, (void)out_dev;
    return KVQ_ERR_NO_DEVICE;
}

kvq_status kvq_cuda_prefill_ws_create(int n_kv_heads, int n_q_heads, int head_dim, size_t max_rows, size_t seg_tokens,
                                      kvq_cuda_prefill_ws **out)
{
    (void)n_kv_heads, (void)n_q_heads, (void)head_dim, (void)max_rows, (void)seg_tokens;
    if (out)
        *out = NULL;
    return KVQ_ERR_NO_DEVICE;
}

void kvq_cuda_prefill_ws_free(kvq_cuda_prefill_ws *ws)
{
    (void)ws;
}

void kvq_cuda_cache_set_prefill_ws(kvq_cuda_cache *c, kvq_cuda_prefill_ws *ws)
{
    (void)c, (void)ws;
}

kvq_status kvq_cuda_step_create(void *stream, int max_keys, kvq_cuda_step **out)
{
    (void)stream, (void)max_keys;
    if (out)
        *out = NULL;
    return KVQ_ERR_NO_DEVICE;
}

void kvq_cuda_step_free(kvq_cuda_step *s)
{
    (void)s;
}

enum kvq_cuda_step_mode kvq_cuda_step_begin(kvq_cuda_step *s, uint64_t key)
{
    (void)s, (void)key;
    return KVQ_CUDA_STEP_OFF;
}

enum kvq_cuda_step_mode kvq_cuda_step_mode(const kvq_cuda_step *s)
{
    (void)s;
    return KVQ_CUDA_STEP_OFF;
}

kvq_status kvq_cuda_step_launch(kvq_cuda_step *s)
{
    (void)s;
    return KVQ_ERR_INVALID_ARG;
}

void kvq_cuda_step_cancel(kvq_cuda_step *s)
{
    (void)s;
}

void kvq_cuda_step_counts(const kvq_cuda_step *s, size_t *captured, size_t *replayed)
{
    (void)s;
    if (captured)
        *captured = 0;
    if (replayed)
        *replayed = 0;
}

kvq_status kvq_cuda_step_kernel(kvq_cuda_step *s, void *stream, const void *func, const unsigned grid[3],
                                const unsigned block[3], size_t smem, int pdl, void **args, const size_t *arg_bytes,
                                int n_args)
{
    (void)s, (void)stream, (void)func, (void)grid, (void)block, (void)smem, (void)pdl, (void)args, (void)arg_bytes,
        (void)n_args;
    return KVQ_ERR_NO_DEVICE;
}

kvq_status kvq_cuda_step_copy(kvq_cuda_step *s, void *stream, void *dst, const void *src, size_t bytes)
{
    (void)s, (void)stream, (void)dst, (void)src, (void)bytes;
    return KVQ_ERR_NO_DEVICE;
}

int kvq_cuda_cache_gpu_encodes(const kvq_cuda_cache *c)
{
    (void)c;
    return 0;
}

void kvq_cuda_cache_set_step(kvq_cuda_cache *c, kvq_cuda_step *s)
{
    (void)c, (void)s;
}

kvq_status kvq_cuda_cache_reserve(kvq_cuda_cache *c, int seq, size_t n)
{
    (void)c, (void)seq, (void)n;
    return KVQ_ERR_NO_DEVICE;
}

#else
/* Built with CUDA: the real definitions are in the .cu files. ISO C wants
 * at least one declaration in a translation unit. */
typedef int kvq_cuda_stub_unused;
#endif

