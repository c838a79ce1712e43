/* kvq_qkv_dump.h - record a model's post-RoPE q/k/v and write them in the
 * format `kvq eval` reads (the format of the reference kv_*.safetensors):
 *   ids  I32 [T]
 *   k    F16 [n_layers][n_kv_heads][T][head_dim]
 *   q    F16 [n_layers][n_heads][Q][head_dim]   (the last Q = min(q_last, T) positions)
 *   v    F16 [n_layers][n_kv_heads][T][head_dim]
 * Install kvq_qkv_dump_hook with kvq_seq_set_qkv_hook(seq, kvq_qkv_dump_hook, dump).
 * Entries are stored by position, so a speculative rollback that re-runs a
 * position simply overwrites it.
 */
#ifndef KVQ_QKV_DUMP_H
#define KVQ_QKV_DUMP_H

#include "kvq_export.h"

#include <stddef.h>
#include <stdint.h>

#include "kvq_model.h"
#include "kvq_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvq_qkv_dump kvq_qkv_dump;

/** Room for positions [0, max_tokens).
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG; KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_qkv_dump_create(const struct kvq_model_config *cfg, size_t max_tokens, size_t q_last,
                               kvq_qkv_dump **out);

/** Accepts NULL. */
KVQ_API void kvq_qkv_dump_free(kvq_qkv_dump *d);

/** A kvq_qkv_hook: user is the kvq_qkv_dump. Positions beyond max_tokens are dropped. */
KVQ_API void kvq_qkv_dump_hook(void *user, int layer, size_t pos0, size_t T, const float *q, const float *k,
                       const float *v);

/** Writes positions [0, n_tokens) with their ids. Call once: the buffers are
 *  compacted in place.
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (n_tokens > max_tokens or 0);
 *  KVQ_ERR_IO; KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_qkv_dump_write(kvq_qkv_dump *d, const int32_t *ids, size_t n_tokens, const char *path,
                              kvq_error *err);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_QKV_DUMP_H */
