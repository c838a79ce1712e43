/* kvq_attn.h - fused decode attention straight from the packed cache (CPU).
 *
 * For one KV head and the n_q query heads that share it (GQA), computes
 *     out_i = softmax(scale * q_i . K[0..n_ctx)^T) V[0..n_ctx)
 * without materialising K or V:
 *  - tq types score in the rotated domain: each query is rotated once
 *    (q' = R q, and S q' for the QJL term); scores come from per-query lookup
 *    of codebook centroids and sign sums, times the row norms;
 *  - values are accumulated in V's rotated domain as sum_i p_i n_i c[idx_i]
 *    and rotated back once per query;
 *  - baseline types (f32, f16, q8_0, q4_0) read their own blocks.
 * kvq_attn_decode_ref() is the scalar reference: dequantize every row with
 * the codec, then attend in double precision. The two agree to ~1e-5 relative.
 *
 * Shapes: q and out are [n_q][head_dim] floats. scale is usually 1/sqrt(d).
 * The workspace holds all scratch memory: create one per thread, sized for
 * the largest n_q and n_ctx it will see; the attention calls never allocate.
 */
#ifndef KVQ_ATTN_H
#define KVQ_ATTN_H

#include <stddef.h>

#include "kvq_cache.h"
#include "kvq_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_ATTN_MAX_Q 64 /* query heads per KV head */

typedef struct kvq_attn_workspace kvq_attn_workspace;

/** @return KVQ_OK and *out; KVQ_ERR_INVALID_ARG / KVQ_ERR_UNSUPPORTED / KVQ_ERR_NOMEM. */
kvq_status kvq_attn_workspace_create(int head_dim, int max_q, size_t max_ctx, kvq_attn_workspace **out);
void kvq_attn_workspace_free(kvq_attn_workspace *ws);

/** Fused decode attention over tokens [0, n_ctx) of kv_head.
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (n_ctx == 0 or > cache len, n_q or
 *  n_ctx beyond the workspace, bad head, NULL); KVQ_ERR_NONFINITE (NaN in q). */
kvq_status kvq_attn_decode(const kvq_cache *c, int kv_head, size_t n_ctx, const float *q, int n_q,
                           float scale, float *out, kvq_attn_workspace *ws);

/** Scalar reference: dequantize then attend (double accumulation). */
kvq_status kvq_attn_decode_ref(const kvq_cache *c, int kv_head, size_t n_ctx, const float *q, int n_q,
                               float scale, float *out, kvq_attn_workspace *ws);

/** Causal attention for T consecutive query positions (prefill, speculative
 *  verification): query t (0 <= t < T) sits at position pos0 + t and attends
 *  over tokens [0, pos0 + t]. q and out are [T][n_q][head_dim].
 *  The cache must already hold tokens up to pos0 + T - 1. */
kvq_status kvq_attn_causal(const kvq_cache *c, int kv_head, size_t pos0, size_t T, const float *q, int n_q,
                           float scale, float *out, kvq_attn_workspace *ws);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_ATTN_H */
