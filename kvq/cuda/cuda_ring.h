/* cuda_ring.h - how many f16 rows a device cache keeps per sequence, one
 * definition for the cache (cuda_cache.cu) and for the budget arithmetic
 * that runs without a device (cuda_plan.c). Private to kvq/cuda.
 */
#ifndef KVQ_CUDA_RING_H
#define KVQ_CUDA_RING_H

#include <stddef.h>

#include "kvq_cache.h"

/* The recent-window ring: the page being filled, as in a host cache (an
 * append that ends past that page's end leaves the earlier rows of the
 * append read packed: callers append in pieces that end on page ends). */
static inline size_t kvq_cu_ring_rows(size_t page_tokens)
{
    return page_tokens;
}

#endif /* KVQ_CUDA_RING_H */
