/* eval_metrics.h - how much attention a compressed cache breaks.
 *
 * For one dump (eval_data.h) and one configuration (eval_spec.h), layer by
 * layer:
 *  - the exact reference is computed once per layer in double precision from
 *    the original (f16 -> f32) data: scores s = q.k, probabilities
 *    p = softmax(s / sqrt(d)) over keys 0..pos, outputs o = p V;
 *  - the configuration's cache is built for real (kvq_cache_append of all T
 *    tokens of the layer), its keys and values read back (decoded) with
 *    kvq_cache_read, and every query position attended with the fused
 *    kvq_attn_decode over n_ctx = pos + 1 tokens.
 *
 * Metrics (all relative to the exact reference):
 *  key_mse, val_mse  sum ||x - x~||^2 / sum ||x||^2 over all T rows
 *  ip_rel_rms        RMS(q.k~ - q.k) / RMS(q.k) over all causal (query, key) pairs
 *  ip_bias           mean(q.k~ - q.k) / RMS(q.k)
 *  tv, kl            total variation 1/2 sum |p - p~| and KL(p || p~) in nats,
 *                    p~ = softmax of the decoded keys' scores (decode-then-dot,
 *                    which equals the codec's score to rounding); mean per query
 *  top1              fraction of queries whose attention argmax is unchanged
 *  top8              mean overlap |top8(p) & top8(p~)| / 8 (min(8, pos+1) early on)
 *  out_err           mean over queries of ||o - o^|| / ||o||, o^ from the fused
 *                    attention (absolute error where ||o|| = 0); out_err_max the worst
 * Sums are kept per layer so layers can be reported separately and merged in
 * a fixed order (results do not depend on scheduling).
 */
#ifndef KVQ_EVAL_METRICS_H
#define KVQ_EVAL_METRICS_H

#include <stddef.h>

#include "eval_data.h"
#include "eval_spec.h"
#include "kvq_status.h"

struct eval_sums {
    double k_err2, k_norm2, v_err2, v_norm2;
    double ip_err, ip_err2, ip_ref2, ip_n;
    double tv, kl, top1, top8, out_rel, out_rel_max, n_q;
};

struct eval_stats {
    double key_mse, val_mse, ip_rel_rms, ip_bias, tv, kl, top1, top8, out_err, out_err_max;
};

/* Storage cost, exact (norms and scales included), per token and head. */
struct eval_cost {
    size_t row_k, row_v;  /* bytes of one K row and one V row */
    double bits_k, bits_v; /* 8 * row / d */
    double bits;           /* mean of K and V: 4 * (row_k + row_v) / d */
    double ratio_f16;      /* f16 bytes / these bytes = 4d / (row_k + row_v) */
};

/** @return KVQ_OK, or KVQ_ERR_UNSUPPORTED when a type cannot store dim d. */
kvq_status eval_cost_of(const struct eval_config *cfg, int d, struct eval_cost *out);

void eval_sums_add(struct eval_sums *acc, const struct eval_sums *s);
void eval_stats_of(const struct eval_sums *s, struct eval_stats *out);

typedef struct eval_ctx eval_ctx;

/** Plans an evaluation of d using at most max_queries query positions
 *  (0 = all Tq; otherwise evenly spaced, always including the last).
 *  d must outlive the context. @return KVQ_OK or KVQ_ERR_NOMEM (message in err). */
kvq_status eval_ctx_create(const struct eval_data *d, size_t max_queries, eval_ctx **out, kvq_error *err);
void eval_ctx_free(eval_ctx *c);

/** Number of query positions used. */
size_t eval_ctx_queries_used(const eval_ctx *c);

/** How the exact attention of the layers set so far averages values:
 *  eff_keys = 1 / mean(sum_j p_j^2), the effective number of keys a query
 *  reads; top_p = mean max_j p_j; v_gain = mean of
 *  sqrt(sum_j p_j^2 ||v_j||^2) / ||o||, the factor by which independent
 *  per-token value errors of relative size e reach the output: a V-only
 *  cache should give out_err ~ sqrt(val_mse) * v_gain. Averaging shrinks
 *  the output as well as the error, so v_gain stays near 1 unless the
 *  values share a common direction. */
void eval_ctx_attention_stats(const eval_ctx *c, double *eff_keys, double *top_p, double *v_gain);

/** Computes the exact reference of layer l (needed before eval_ctx_run). */
kvq_status eval_ctx_set_layer(eval_ctx *c, int l, kvq_error *err);

/** Builds cfg's cache for the current layer, attends, and fills *out
 *  (overwritten). @return KVQ_OK, or the first library error with one line
 *  in err (unsupported dim, norm too large for f16, out of memory). */
kvq_status eval_ctx_run(eval_ctx *c, const struct eval_config *cfg, struct eval_sums *out, kvq_error *err);

#endif
