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
 * Tokens with an f16 override (sink tokens, recent window: kvq_cache.h) are
 * read from their f16 copies by both: the fast path runs its kernels over
 * the packed rows only and folds the f16 rows into the online softmax
 * afterwards in double. A call over n_ctx < len tokens sees the cache as
 * kvq_cache_truncate(c, n_ctx) would leave it.
 *
 * Kernels: AVX-512 (F/BW/VL/VBMI) for tq rows when the head dim is a multiple
 * of 16, AVX2/FMA/F16C otherwise when it is a multiple of 8, plain C for the
 * rest and on other CPUs; KVQ_FORCE_SCALAR=1 forces plain C and
 * KVQ_ATTN_NO_AVX512=1 stops at AVX2. Softmax is max-subtracted with exp in
 * float; the weighted sums are formed per block of 64 tokens in float and
 * accumulated in double. See docs/attention-cpu.md for speeds.
 *
 * Shapes: q and out are [n_q][head_dim] floats. scale is usually 1/sqrt(d).
 * The workspace holds all scratch memory: create one per thread, sized for
 * the largest n_q and n_ctx it will see; the attention calls never allocate.
 */
#ifndef KVQ_ATTN_H
#define KVQ_ATTN_H

#include "kvq_export.h"

#include <stddef.h>

#include "kvq_cache.h"
#include "kvq_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_ATTN_MAX_Q 64 /* query heads per KV head */

typedef struct kvq_attn_workspace kvq_attn_workspace;

/** Allocates the scratch of one thread for heads of head_dim, up to max_q
 *  query heads per KV head and contexts up to max_ctx tokens. Its size does
 *  not depend on max_ctx (blocks are streamed); about
 *  max_q * head_dim * 170 bytes (mostly the QJL sign tables) plus, for
 *  kvq_attn_causal, about max(max_q, 512) * head_dim * 8 + head_dim * 784 + 40 KiB.
 *  @return KVQ_OK and *out; KVQ_ERR_INVALID_ARG (NULL out, head_dim, max_q or
 *  max_ctx < 1); KVQ_ERR_UNSUPPORTED (head_dim > KVQ_MAX_DIM, max_q >
 *  KVQ_ATTN_MAX_Q); KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_attn_workspace_create(int head_dim, int max_q, size_t max_ctx, kvq_attn_workspace **out);
/** Frees ws; accepts NULL. */
KVQ_API void kvq_attn_workspace_free(kvq_attn_workspace *ws);

/** Fused decode attention over tokens [0, n_ctx) of kv_head.
 *  Thread-safe for concurrent calls with separate workspaces (and out).
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (n_ctx == 0 or > cache len, n_q or
 *  n_ctx beyond the workspace, workspace for another head_dim, bad head,
 *  NULL, a NaN or infinite scale); KVQ_ERR_NONFINITE (NaN or Inf in q); KVQ_ERR_RANGE (a logit
 *  overflowed float: queries of norm ~1e34 and more). */
KVQ_API kvq_status kvq_attn_decode(const kvq_cache *c, int kv_head, size_t n_ctx, const float *q, int n_q,
                           float scale, float *out, kvq_attn_workspace *ws);

/** Scalar reference: decode every row with the codec's decode_ref, then
 *  softmax(scale q.k) v in double (two passes over K: the maximum, then the
 *  weights). Same arguments and errors as kvq_attn_decode. */
KVQ_API kvq_status kvq_attn_decode_ref(const kvq_cache *c, int kv_head, size_t n_ctx, const float *q, int n_q,
                               float scale, float *out, kvq_attn_workspace *ws);

/** Causal attention for T consecutive query positions (prefill, speculative
 *  verification): query t (0 <= t < T) sits at position pos0 + t and sees
 *  exactly what kvq_attn_decode(c, kv_head, pos0 + t + 1, ...) sees: tokens
 *  [0, pos0 + t], the f16 overrides as kvq_cache_f16_view gives them for
 *  pos0 + t + 1 tokens. With a recent f16 window that is generation's view
 *  only while the cache still holds the f16 copies of the query's page, i.e.
 *  when the chunk stays within one page after the cache's last full page
 *  (append a page at a time and attend each, or append the whole chunk and
 *  use kvq_attn_causal_recent; a query whose page's copies are gone gets
 *  KVQ_ERR_INTERNAL). q and out are [T][n_q][head_dim].
 *  The cache must already hold tokens up to pos0 + T - 1, and the workspace
 *  must admit contexts of pos0 + T.
 *  Computed in passes of up to kvq_attn_causal_span(n_q) positions (up to
 *  512 rows, positions x n_q heads): each block of up to 64 keys/values is
 *  decoded once per pass into f32, then scored against every row of the
 *  pass with f32 products (AVX-512 or AVX2/FMA, picked as kvq_attn_decode
 *  picks its kernels), with an online softmax per row. A row's result
 *  depends only on its own position and query, not on T, pos0 or its pass
 *  (the blocks sit on absolute positions), so a chunk may be split by
 *  position, e.g. across threads, with the same bits. It agrees with
 *  kvq_attn_causal_ref to float rounding (~5e-6 relative on outlier-heavy
 *  rows; not bit for bit).
 *  @return as kvq_attn_decode; KVQ_ERR_INVALID_ARG also for T == 0. */
KVQ_API kvq_status kvq_attn_causal(const kvq_cache *c, int kv_head, size_t pos0, size_t T, const float *q, int n_q,
                           float scale, float *out, kvq_attn_workspace *ws);

/** f16 copies of tokens [pos, pos + n) of every KV head of a cache, as
 *  kvq_cache_append makes them (kvq_f32_to_f16_n of its input rows): k and v
 *  are [n][n_kv_heads][head_dim] halves each. Owned by the caller. */
struct kvq_attn_recent {
    const uint16_t *k, *v;
    size_t pos, n;
};

/** kvq_attn_causal for a chunk appended at once to a cache with the recent
 *  f16 window (recent_f16): the cache's ring then holds only the chunk's last
 *  page, so the caller keeps the f16 copies of the chunk and of the partly
 *  filled page before it, rec->pos = the tail_lo kvq_cache_f16_view(c, pos0)
 *  gave before the append (pos0 when pos0 is a page start). Query t reads
 *  its own page's tokens [max(n - n % page_tokens, rec->pos), n), n = pos0 +
 *  t + 1, from rec: exactly the view a decode at n had when the cache held n
 *  tokens, so the result equals appending and attending a page (or a token)
 *  at a time, bit for bit. rec must cover [rec->pos, pos0 + T) with rec->pos
 *  <= pos0. Otherwise as kvq_attn_causal.
 *  @return as kvq_attn_causal; KVQ_ERR_INVALID_ARG also for a NULL rec or
 *  rows, a cache without recent_f16, or rec not covering the chunk. */
KVQ_API kvq_status kvq_attn_causal_recent(const kvq_cache *c, int kv_head, size_t pos0, size_t T, const float *q,
                                          int n_q, float scale, float *out, kvq_attn_workspace *ws,
                                          const struct kvq_attn_recent *rec);

/** @return the positions of one pass of kvq_attn_causal for n_q query heads
 *  (each packed block decoded once for all of them): a caller that splits a
 *  chunk into calls, e.g. over threads, decodes least with calls of this
 *  many positions (0 when n_q < 1). */
KVQ_API size_t kvq_attn_causal_span(int n_q);

/** The reference of kvq_attn_causal: one kvq_attn_decode per position (each
 *  block re-read for every row). Same arguments, views and errors. */
KVQ_API kvq_status kvq_attn_causal_ref(const kvq_cache *c, int kv_head, size_t pos0, size_t T, const float *q,
                                       int n_q, float scale, float *out, kvq_attn_workspace *ws);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_ATTN_H */
