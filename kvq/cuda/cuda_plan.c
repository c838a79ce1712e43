/* cuda_plan.c - a device cache's memory, computed on the host: in every
 * build, so that plans and budgets for --device cuda are right on a machine
 * without a GPU too.
 */
#include "cuda_ring.h"
#include "cuda_ws.h"
#include "kvq_cuda.h"
#include "kvq_layout.h"

size_t kvq_cuda_cache_f16_bytes(const struct kvq_cache_config *cfg)
{
    if (!cfg || !kvq_cache_bytes_for(cfg, 0))
        return 0; /* invalid */
    const size_t P = (size_t)(cfg->page_tokens ? cfg->page_tokens : KVQ_DEFAULT_PAGE_TOKENS);
    const size_t rows = (size_t)cfg->sink_tokens + (cfg->recent_f16 ? kvq_cu_ring_rows(P) : 0);
    return rows * (size_t)cfg->n_kv_heads * (size_t)cfg->head_dim * 2 * sizeof(uint16_t); /* K and V, f16 */
}

size_t kvq_cuda_prefill_ws_bytes(int n_kv_heads, int n_q_heads, int head_dim, size_t max_rows, size_t seg_tokens)
{
    size_t off[7];
    if (n_kv_heads < 1 || n_q_heads < 1 || head_dim < 1 || !max_rows || !seg_tokens)
        return 0;
    return kvq_cu_ws_layout((size_t)n_kv_heads, (size_t)n_q_heads, (size_t)head_dim, max_rows, seg_tokens, off);
}
