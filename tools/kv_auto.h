/* kv_auto.h - `--kv-auto`: per-layer K/V cache types chosen for a byte budget.
 *
 * 1. Calibration: the model runs once with an f32 cache over a short text
 *    (default: the first KV_AUTO_CALIB_TOKENS tokens of <model>/reference/
 *    valid.txt) and a qkv hook keeps every layer's post-RoPE q, k and v in
 *    memory in the layout of an eval dump (eval_data.h).
 * 2. Scoring: every candidate (K type, V type) of every layer is measured
 *    with the `kvq eval` machinery (eval_metrics.h: the real cache, decoded,
 *    and the fused attention); the score is one of its metrics (see
 *    enum kv_auto_metric).
 * 3. Choice: an exact knapsack over layers on bytes per token: the sum over
 *    layers of the chosen pair's bytes/token times the context must not
 *    exceed the budget, and the summed out_err is minimal. The pick is then
 *    checked with kvq_seq_plan_of (whole pages per layer); when page rounding
 *    makes it miss the context, the capacity shrinks until it fits.
 */
#ifndef KVQ_KV_AUTO_H
#define KVQ_KV_AUTO_H

#include <stddef.h>
#include <stdint.h>

#include "kv_opts.h"
#include "kvq_model.h"
#include "kvq_status.h"
#include "kvq_tokenizer.h"

#define KV_AUTO_CALIB_TOKENS 512
#define KV_AUTO_MAX_CANDS 64

/* What a layer's error is (--kv-auto-metric):
 *  out_err  the attention output's relative error (default);
 *  ipv      ip_rel_rms + val_mse: the key side (relative score error) plus
 *           the value side (relative value MSE), measured separately;
 *  kl       KL of the attention weights (blind to values: a poor choice).
 * Neither out_err nor ipv won at every budget measured (docs/long-context.md,
 * "Choosing per-layer types"): neither knows how much each layer's error
 * costs in perplexity. */
enum kv_auto_metric { KV_AUTO_OUT_ERR = 0, KV_AUTO_IPV, KV_AUTO_KL, KV_AUTO_N_METRICS };

/* "out_err", "ipv" or "kl"; NULL outside [0, KV_AUTO_N_METRICS). */
const char *kv_auto_metric_name(int metric);

/* The candidate pairs: K in {tq2, tq3, tq4, tq3j, tq4j, q4_0, q8_0} times
 * V in {tq2, tq3, tq4, q4_0, q8_0}. Writes at most cap pairs to out[2*i],
 * out[2*i+1]. @return the number of pairs. */
int kv_auto_candidates(enum kvq_type *out, int cap);

/* Measured errors of cands[n_cands][2] for every layer of m on calibration
 * tokens ids[0..n) (BOS included by the caller), at most max_queries query
 * positions per layer (0 = all).
 * err_out [n_layers][n_cands] (the metric), cost_out [n_layers][n_cands] exact
 * bytes per token of the layer (all KV heads, K and V).
 * @return KVQ_OK; KVQ_ERR_INVALID_ARG (n < 2); KVQ_ERR_NOMEM; a forward or
 * cache error, with one line in err. */
kvq_status kv_auto_score(const kvq_model *m, const int32_t *ids, size_t n, const enum kvq_type *cands, int n_cands,
                         uint64_t seed, size_t max_queries, enum kv_auto_metric metric, double *err_out, size_t *cost_out, kvq_error *err);

/* Exact knapsack: for each layer one of n_cands options (cost[l][c] bytes per
 * token, err[l][c]) with sum cost <= cap and minimal sum err (ties: the lower
 * candidate index in the earliest layer wins, so the result is deterministic).
 * choice[n_layers] out, *total_err and *total_cost out.
 * @return KVQ_OK; KVQ_ERR_BUDGET (even the cheapest pick exceeds cap);
 * KVQ_ERR_NOMEM (table too large). */
kvq_status kv_auto_choose(int n_layers, int n_cands, const size_t *cost, const double *err, size_t cap,
                          int *choice, double *total_err, size_t *total_cost);

/* The whole --kv-auto step of a command, after the model is loaded: reads
 * the calibration text (o->auto_calib or <model_dir>/reference/valid.txt),
 * scores, chooses for o->budget at ctx tokens, writes o->layer_types /
 * n_layer_types and o->auto_err, prints one line per layer to stderr unless
 * quiet. @return 0, or 2 after printing the error. */
int kv_auto_apply(const char *cmd, struct kv_opts *o, const kvq_model *m, const kvq_tokenizer *tok,
                  const char *model_dir, size_t ctx, int quiet);

/* Adds "kv_auto": {ctx, budget, total_err, layers: [{k, v, bits, err}]} to
 * a cJSON object (passed as void * so callers need not include cJSON here)
 * when o->kv_auto is set. */
void kv_auto_json(void *cjson_root, const struct kv_opts *o, const kvq_model *m);

#endif
