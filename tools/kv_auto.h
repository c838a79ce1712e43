/* kv_auto.h - `--kv-auto`: per-layer K/V cache types chosen for a byte budget.
 *
 * 1. Calibration text: BOS + the LAST tokens of <model>/reference/valid.txt
 *    (or --kv-auto-calib F), so that it is disjoint from an evaluation that
 *    scores the file from its start.
 * 2. Scoring, one error per layer and candidate (K type, V type):
 *    - nll: the calibration's mean NLL with only that layer's cache of that
 *      pair (all others f32) minus the all-f32 mean NLL, through the same
 *      windowed, chunked path as `kvq ppl` (ppl_core.h): what perplexity
 *      itself charges for the layer's error. L x pairs + 1 forwards of
 *      KV_AUTO_NLL_TOKENS tokens.
 *    - out_err / ipv / kl: the model runs once with an f32 cache over
 *      KV_AUTO_CALIB_TOKENS tokens, a qkv hook keeps every layer's post-RoPE
 *      q, k, v, and each pair is measured with the `kvq eval` machinery
 *      (eval_metrics.h: the real cache, decoded, and the fused attention).
 * 3. Choice: an exact knapsack over layers on bytes per token: the sum over
 *    layers of the chosen pair's bytes/token times the context must not
 *    exceed the budget, and the summed error is minimal (for nll this
 *    assumes the layers' increases add up; kv_auto_apply measures the whole
 *    choice once and prints both). The pick is then checked with
 *    kvq_seq_plan_of (whole pages per layer); when page rounding makes it
 *    miss the context, the capacity shrinks until it fits.
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
/* nll metric: calibration tokens (BOS included). 2048 keeps the noise of a
 * layer's NLL increase near 0.001 nats on the bundled model; 512 (pruning
 * stage tried) was too noisy to prune with (docs/long-context.md). */
#define KV_AUTO_NLL_TOKENS 2048
#define KV_AUTO_MAX_CANDS 64

/* What a layer's error is (--kv-auto-metric):
 *  nll      the calibration NLL increase (nats) of the layer alone (default);
 *  out_err  the attention output's relative error;
 *  ipv      ip_rel_rms + val_mse: the key side (relative score error) plus
 *           the value side (relative value MSE), measured separately;
 *  kl       KL of the attention weights (blind to values: a poor choice).
 * The attention metrics do not know how much each layer's error costs in
 * perplexity (on the bundled model a key error in layer 1 costs ~15x one in
 * layer 0); nll measures exactly that (docs/long-context.md, "Choosing
 * per-layer types"). */
/* nll is 0 so that a zeroed kv_opts (the default) selects it. */
enum kv_auto_metric { KV_AUTO_NLL = 0, KV_AUTO_OUT_ERR, KV_AUTO_IPV, KV_AUTO_KL, KV_AUTO_N_METRICS };

/* "nll", "out_err", "ipv" or "kl"; NULL outside [0, KV_AUTO_N_METRICS). */
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
 * @return KVQ_OK; KVQ_ERR_INVALID_ARG (n < 2, metric nll: see
 * kv_auto_score_nll); KVQ_ERR_NOMEM; a forward or cache error, with one line
 * in err. */
kvq_status kv_auto_score(const kvq_model *m, const int32_t *ids, size_t n, const enum kvq_type *cands, int n_cands,
                         uint64_t seed, size_t max_queries, enum kv_auto_metric metric, double *err_out, size_t *cost_out, kvq_error *err);

/* Mean NLL (natural log, per scored token) of the text ids text[0..n) (no
 * BOS: the model's BOS is put first) with layer l's cache of types
 * layer_types[2l] (K) and [2l+1] (V), or f32 everywhere when layer_types is
 * NULL, through the same path as `kvq ppl`: one window (several when n
 * exceeds the model's context), forwarded in chunks of 256 whose queries
 * attend over the encoded cache; seed as --seed; recent_f16 as
 * kvq_seq_config.recent_f16 (the run's window, so that the calibration
 * charges what the run will see).
 * @return KVQ_OK; KVQ_ERR_INVALID_ARG (n < 2); sequence or forward errors,
 * with one line in err. */
kvq_status kv_auto_nll(const kvq_model *m, const int32_t *text, size_t n, uint64_t seed, int recent_f16,
                       const enum kvq_type *layer_types, double *mean_nll, kvq_error *err);

/* The nll metric: err_out[l][j] = the calibration's mean NLL with layer l's
 * cache of pair cands[j] and every other layer f32, minus the mean NLL with
 * f32 everywhere (*base_nll, optional). measure ([n_layers][n_cands], NULL =
 * all) skips pairs: their err_out is INFINITY (kv_auto_choose never picks
 * them). cost_out as kv_auto_score. One kv_auto_nll per measured cell plus
 * one for the base. @return as kv_auto_nll; KVQ_ERR_UNSUPPORTED (more than
 * KV_OPTS_MAX_LAYERS layers). */
kvq_status kv_auto_score_nll(const kvq_model *m, const int32_t *text, size_t n, uint64_t seed, int recent_f16,
                             const enum kvq_type *cands, int n_cands, const unsigned char *measure,
                             double *base_nll, double *err_out, size_t *cost_out, kvq_error *err);

/* Exact knapsack: for each layer one of n_cands options (cost[l][c] bytes per
 * token, err[l][c]) with sum cost <= cap and minimal sum err (ties: the lower
 * candidate index in the earliest layer wins, so the result is deterministic).
 * Options whose err is not finite are excluded.
 * choice[n_layers] out, *total_err and *total_cost out.
 * @return KVQ_OK; KVQ_ERR_BUDGET (even the cheapest pick exceeds cap);
 * KVQ_ERR_NOMEM (table too large); KVQ_ERR_INVALID_ARG (a layer without a
 * finite option, bad sizes). */
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
