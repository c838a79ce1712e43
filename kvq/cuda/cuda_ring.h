/* cuda_ring.h - how many f16 rows a device cache keeps per sequence, one
 * definition for the cache (cuda_cache.cu) and for the budget arithmetic
 * that runs without a device (cuda_plan.c). Private to kvq/cuda.
 */
#ifndef KVQ_CUDA_RING_H
#define KVQ_CUDA_RING_H

#include <stddef.h>

#include "kvq_cache.h"

/* The recent-window ring: the page being filled, one append of up to a page
 * (the prefix views of a chunk appended in pieces of at most a page stay
 * exact), and the host cache's truncation slack. */
static inline size_t kvq_cu_ring_rows(size_t page_tokens)
{
    return 2 * page_tokens + KVQ_CACHE_F16_SLACK;
}

#endif /* KVQ_CUDA_RING_H */
