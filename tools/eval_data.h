/* eval_data.h - the query/key/value tensors `kvq eval` measures against.
 *
 * An eval dump is a safetensors file with
 *   q [layer, head, Tq, d]      queries of the last Tq positions
 *   k [layer, kv_head, T, d]    post-RoPE keys of all T positions
 *   v [layer, kv_head, T, d]    values
 * in F16, BF16 or F32 (other tensors, e.g. `ids`, are ignored). Query i sits
 * at position T - Tq + i and attends causally over keys 0..pos; query head h
 * reads KV head h / (head / kv_head) (GQA). Everything is held as f32 in the
 * same layouts.
 */
#ifndef KVQ_EVAL_DATA_H
#define KVQ_EVAL_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "kvq_status.h"

struct eval_data {
    char name[64]; /* file basename, or "synthetic" */
    int n_layers, n_heads, n_kv_heads, head_dim;
    size_t n_tokens;  /* T */
    size_t n_queries; /* Tq */
    float *q;         /* [L][H][Tq][d] */
    float *k, *v;     /* [L][KVH][T][d] */
};

/* --synthetic: Gaussian data with planted outlier channels, like real keys
 * (a few channels with a large mean and spread), deterministic from seed. */
struct eval_synth_config {
    int n_layers, n_heads, n_kv_heads, head_dim;
    size_t n_tokens, n_queries;
    int n_outliers; /* outlier channels per (layer, kv head); 0 = pure Gaussian */
    uint64_t seed;
};

void eval_synth_config_default(struct eval_synth_config *cfg);

/** Reads and validates a dump: tensors present, rank 4, consistent shapes,
 *  GQA divisible, Tq <= T, every value finite.
 *  @return KVQ_OK and *out (free with eval_data_free); KVQ_ERR_IO,
 *  KVQ_ERR_FORMAT, KVQ_ERR_UNSUPPORTED, KVQ_ERR_NONFINITE or KVQ_ERR_NOMEM
 *  with one line in err naming the file and the problem. */
kvq_status eval_data_load(const char *path, struct eval_data *out, kvq_error *err);

/** Generates a synthetic dump. @return KVQ_OK, KVQ_ERR_INVALID_ARG (bad
 *  shape, message in err) or KVQ_ERR_NOMEM. */
kvq_status eval_data_synthetic(const struct eval_synth_config *cfg, struct eval_data *out, kvq_error *err);

void eval_data_free(struct eval_data *d);

/** Position of query i (0 <= i < Tq). */
static inline size_t eval_query_pos(const struct eval_data *d, size_t i)
{
    return d->n_tokens - d->n_queries + i;
}

#endif
