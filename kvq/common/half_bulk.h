/* half_bulk.h - inside kvq/: x rounded to f16 and back, in place, bit for
 * bit kvq_f16_to_f32(kvq_f32_to_f16(x)) (the cache's key centring reads its
 * keys as their f16 copies hold them). The row conversions themselves are
 * public (kvq_half.h); all three live in half_bulk.c. */
#ifndef KVQ_HALF_BULK_H
#define KVQ_HALF_BULK_H

#include <stddef.h>

void kvq_half_round(float *x, size_t n);

#endif /* KVQ_HALF_BULK_H */
