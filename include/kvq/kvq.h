/* kvq.h - everything public in libkvq, in one include.
 *
 *   kvq_status.h    status codes, kvq_error
 *   kvq_half.h      IEEE binary16 conversion (host and CUDA)
 *   kvq_codebook.h  Lloyd-Max codebooks for rotated unit-vector coordinates
 *   kvq_rotation.h  seeded orthogonal rotations (randomised Hadamard, ...)
 *   kvq_codec.h     cache types, traits table, row encode/decode/score
 *   kvq_layout.h    row and page byte layouts (shared with CUDA)
 *   kvq_cache.h     the paged, packed KV cache of one layer
 *   kvq_attn.h      fused CPU decode attention over the packed cache
 */
#ifndef KVQ_H
#define KVQ_H

#include "kvq_status.h"
#include "kvq_half.h"
#include "kvq_codebook.h"
#include "kvq_rotation.h"
#include "kvq_codec.h"
#include "kvq_layout.h"
#include "kvq_cache.h"
#include "kvq_attn.h"

#endif
