/* cuda_plan.c - a device cache's memory, computed on the host: in every
 * build, so that plans and budgets for --device cuda are right on a machine
 * without a GPU too.
 */
#include "cuda_ring.h"
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
