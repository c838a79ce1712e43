/* kvq_eval.h - what a compressed KV cache costs in quality, measured.
 *
 * The library side of the quality commands; the `kvq` tool only parses
 * their flags and prints what these functions return:
 *  - perplexity (`kvq ppl`): windowed, chunked NLL of a text whose queries
 *    attend over the encoded cache, as generation does;
 *  - passkey retrieval (`kvq passkey`): the fixture prompt format, trials
 *    drawn from a seed, greedy answers checked;
 *  - per-layer cache types for a byte budget (`--kv-auto`): every layer and
 *    candidate K/V pair scored on a calibration text, then an exact knapsack;
 *  - attention error on q/k/v dumps (`kvq eval`): each cache configuration
 *    built for real, attended with the fused kernel, compared with exact
 *    double-precision attention.
 * The recent-token window policy these use is kvq_seq_window_for
 * (kvq_model.h): KVQ_WINDOW_AUTO turns the window on for compressed types.
 *
 * Conventions: token ids are int32_t; NLLs are natural logs; bytes are
 * bytes; "bits per value" counts K and V. Nothing here prints or exits;
 * long work reports progress through an optional callback. Arrays a
 * function returns through a `**` argument are malloc'ed: free() them.
 */
#ifndef KVQ_EVAL_H
#define KVQ_EVAL_H

#include "kvq_export.h"

#include <stddef.h>
#include <stdint.h>

#include "kvq_codec.h"
#include "kvq_model.h"
#include "kvq_rotation.h"
#include "kvq_status.h"
#include "kvq_tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==== perplexity ========================================================
 *
 * The text is cut into windows of ctx tokens. Each window starts from an
 * empty sequence (the model's BOS first when it has one and add_bos is set)
 * and is forwarded in chunks: every chunk's K/V are appended to the caches
 * and its queries attend over the *encoded* cache of the window so far,
 * chunk included (kvq_seq_forward). Every token of the window except the
 * first is predicted from the logits of the one before it; with a BOS, the
 * first text token of the window is predicted from BOS. */

struct kvq_ppl_config {
    size_t ctx;   /* tokens per window, BOS included; 0 (default) = kvq_seq_max_ctx(s) */
    size_t chunk; /* tokens per forward; default 256 (`kvq ppl --chunk`); more than ctx = ctx */
    int add_bos;  /* 1 (default): the model's BOS starts every window (when it has one) */
};

struct kvq_ppl_result {
    size_t scored;  /* tokens whose NLL was counted */
    size_t windows; /* windows forwarded */
    double nll_sum; /* natural log */
    double ppl;     /* exp(nll_sum / scored); 0 when nothing was scored */
    double seconds; /* wall clock of the whole call */
};

/* Called after each chunk: text tokens forwarded so far of n_total, and the
 * result so far (ppl over the tokens scored so far). */
typedef void (*kvq_ppl_progress_fn)(void *user, size_t done, size_t n_total, const struct kvq_ppl_result *sofar);

/** Fills cfg with `kvq ppl`'s defaults: ctx 0 (the sequence's), chunk 256, add_bos 1. */
KVQ_API void kvq_ppl_config_default(struct kvq_ppl_config *cfg);

/** Scores the text ids[0..n) (no BOS) through s, a sequence of model m
 *  (reset before each window; needs kvq_seq_max_ctx(s) >= ctx; create it
 *  with max_chunk = chunk, as `kvq ppl` does: kvq_seq_forward splits a
 *  longer chunk at its max_chunk). nll (optional, [n]) gets
 *  -ln p(ids[i] | its window's prefix), or NAN for a token that is not
 *  predicted (the first of a window without BOS). Each NLL is computed in
 *  double from its logits row (kvq_ppl_token_nll). fn (optional) is called
 *  after every chunk. Allocates one logits buffer of chunk rows per call.
 *  @return KVQ_OK with *res; KVQ_ERR_INVALID_ARG (NULL, ctx < 2, chunk 0,
 *  ctx > kvq_seq_max_ctx(s)); KVQ_ERR_NOMEM; KVQ_ERR_NONFINITE (a
 *  non-finite NLL); errors of kvq_seq_forward (KVQ_ERR_BUDGET when the KV
 *  budget cannot hold a window). */
KVQ_API kvq_status kvq_ppl_score(const kvq_model *m, kvq_seq *s, const struct kvq_ppl_config *cfg, const int32_t *ids,
                                 size_t n, double *nll, struct kvq_ppl_result *res, kvq_ppl_progress_fn fn,
                                 void *user);

/** @return -ln softmax(logits[0..vocab))[target], computed in double
 *  (log-sum-exp). */
KVQ_API double kvq_ppl_token_nll(const float *logits, int vocab, int32_t target);

/* How far a cache moves the model's next-token distributions from a
 * reference cache's (f32 in `kvq ppl --kl-divergence`), over every scored
 * position: the measures llama.cpp's perplexity tool reports. */
struct kvq_kl_result {
    size_t n;          /* positions compared */
    double mean;       /* mean KL(P_ref || P), natural log */
    double p99;        /* 99th percentile of the per-position KL */
    double max;        /* largest per-position KL */
    double top1;       /* fraction of positions whose argmax (lowest id on ties) agrees */
    double ref_ppl;    /* perplexity through the reference sequence */
};

/** As kvq_ppl_score through s, with the reference sequence ref (same model,
 *  max_ctx >= ctx, max_chunk = chunk) forwarded over the same windows and
 *  chunks in lockstep; each position's KL(P_ref || P) is computed in double
 *  from the two logits rows. res is s's perplexity result, kl the
 *  comparison. Allocates two logits buffers of chunk rows and n doubles.
 *  @return as kvq_ppl_score (for either sequence). */
KVQ_API kvq_status kvq_ppl_kl(const kvq_model *m, kvq_seq *s, kvq_seq *ref, const struct kvq_ppl_config *cfg,
                              const int32_t *ids, size_t n, struct kvq_ppl_result *res, struct kvq_kl_result *kl,
                              kvq_ppl_progress_fn fn, void *user);

/** @return KL(softmax(ref) || softmax(test)) over vocab logits, in double. */
KVQ_API double kvq_logits_kl(const float *ref, const float *test, int vocab);

/* ==== passkey retrieval =================================================
 *
 * Prompts follow the format the bundled model was trained on
 * (models/kvq-tiny-llama/FIXTURES.md):
 *   INTRO + FILLER*a + " The pass key is KEY. Remember it. KEY is the pass key. "
 *         + FILLER*b + " What is the pass key? The pass key is"
 * BOS first. A trial draws from the seed, the length and its index a 5-7
 * digit key and a depth a / (a + b) in [0, 1), so every cache type sees the
 * same prompts; a + b is as large as fits the length in tokens. The greedy
 * answer must start with the key (after spaces), not followed by a digit. */

#define KVQ_PASSKEY_MAX_LENGTHS 32

struct kvq_passkey_config {
    size_t lengths[KVQ_PASSKEY_MAX_LENGTHS]; /* prompt lengths in tokens, BOS included (>= the
                                              * format's length without fillers);
                                              * default 512, 1024, 2048, 3072, 4000 */
    int n_lengths;                           /* 1..KVQ_PASSKEY_MAX_LENGTHS; default 5 */
    size_t trials;                           /* prompts per length; default 10 */
    uint64_t seed;                           /* keys and depths; default 0 (`--seed`) */
    size_t answer_tokens;                    /* greedy tokens generated per prompt; default 10
                                              * (7 digits, the full stop, slack) */
};

/* One length's tally. */
struct kvq_passkey_result {
    size_t length;     /* the requested length */
    size_t trials;     /* prompts run so far */
    size_t correct;    /* of them answered with the key */
    double tokens_sum; /* summed prompt tokens (BOS included); mean = tokens_sum / trials */
};

/* Called after every trial: the index of the length being run and its tally. */
typedef void (*kvq_passkey_progress_fn)(void *user, int length_index, const struct kvq_passkey_result *sofar);

/** Fills cfg with `kvq passkey`'s defaults (see the fields). */
KVQ_API void kvq_passkey_config_default(struct kvq_passkey_config *cfg);

/** @return the context a sequence needs for cfg: the longest length plus
 *  answer_tokens (0 when cfg has no lengths). */
KVQ_API size_t kvq_passkey_ctx(const struct kvq_passkey_config *cfg);

/** The prompt text with n_before fillers before the key sentence and
 *  n_after after it, into *text (malloc'ed, NUL-terminated; free() it).
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (NULL text, negative counts);
 *  KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_passkey_prompt_text(long key, int n_before, int n_after, char **text);

/** The token ids (BOS first, as the tokenizer adds it) of the longest
 *  prompt of at most length tokens with the key at depth (0 = first,
 *  1 = last), into *ids (malloc'ed, free() it) and *n_ids.
 *  @return KVQ_OK; KVQ_ERR_RANGE when even the prompt without fillers is
 *  longer than length; KVQ_ERR_INVALID_ARG; KVQ_ERR_NOMEM; tokenizer errors. */
KVQ_API kvq_status kvq_passkey_prompt(const kvq_tokenizer *tok, long key, double depth, size_t length, int32_t **ids,
                                      size_t *n_ids);

/** @return 1 when the decoded answer, after leading spaces, starts with
 *  key's digits and no further digit follows; else 0. */
KVQ_API int kvq_passkey_check(const char *answer, long key);

/** Runs cfg's trials through s (reset before each prompt; its
 *  kvq_seq_max_ctx must be at least kvq_passkey_ctx(cfg)): for every length
 *  and trial, the prompt (kvq_passkey_prompt), greedy generation of
 *  answer_tokens tokens (stopping at EOS), decoding without control tokens
 *  and kvq_passkey_check. res[0..n_lengths) get the tallies; fn (optional)
 *  is called after every trial.
 *  @return KVQ_OK; KVQ_ERR_RANGE with "length N is too short for the
 *  prompt format" in err; KVQ_ERR_INVALID_ARG (bad config, the sequence's
 *  context too short); KVQ_ERR_NOMEM; generation or tokenizer errors. On
 *  an error res holds the trials completed before it. */
KVQ_API kvq_status kvq_passkey_run(kvq_seq *s, const kvq_tokenizer *tok, const struct kvq_passkey_config *cfg,
                                   struct kvq_passkey_result *res, kvq_passkey_progress_fn fn, void *user,
                                   kvq_error *err);

/* ==== per-layer cache types for a budget (--kv-auto) ====================
 *
 * 1. Calibration: BOS + the LAST tokens of a text (kvq_kv_auto_calib_ids),
 *    so that it is disjoint from an evaluation that scores the text from
 *    its start.
 * 2. Scoring, one error per layer and candidate (K type, V type):
 *    - nll: the calibration's mean NLL with only that layer's cache of that
 *      pair (all others f32) minus the all-f32 mean NLL, through the same
 *      windowed, chunked path as kvq_ppl_score: what perplexity itself
 *      charges for the layer's error. L x pairs + 1 forwards of
 *      KVQ_KV_AUTO_NLL_TOKENS tokens.
 *    - out_err / ipv / kl: the model runs once with an f32 cache over
 *      KVQ_KV_AUTO_CALIB_TOKENS tokens, a qkv hook keeps every layer's
 *      post-RoPE q, k, v, and each pair is measured with kvq_eval_ctx (the
 *      real cache, decoded, and the fused attention).
 * 3. Choice: an exact knapsack over layers on bytes per token: the sum over
 *    layers of the chosen pair's bytes/token times the context must not
 *    exceed the budget (less the f16 window/sink buffers), and the summed
 *    error is minimal (for nll this assumes the layers' increases add up;
 *    kvq_kv_auto_choose measures the whole choice once). The pick is then
 *    checked with kvq_seq_plan_of (whole pages per layer); when page
 *    rounding makes it miss the context, the capacity shrinks until it fits.
 *
 * The step by step API (kvq_kv_auto_score, _score_nll, _knapsack) is below
 * the handle that runs all three steps. */

#define KVQ_KV_AUTO_MAX_LAYERS 256
#define KVQ_KV_AUTO_MAX_CANDS 64
/* Calibration tokens (BOS included) of the attention metrics. */
#define KVQ_KV_AUTO_CALIB_TOKENS 512
/* nll metric: calibration tokens (BOS included). 2048 keeps the noise of a
 * layer's NLL increase near 0.001 nats on the bundled model; 512 was too
 * noisy to prune with (docs/long-context.md). */
#define KVQ_KV_AUTO_NLL_TOKENS 2048
/* Fewest calibration tokens (BOS included) kvq_kv_auto_calib_ids accepts. */
#define KVQ_KV_AUTO_MIN_CALIB 16

/* What a layer's error is:
 *  NLL      the calibration NLL increase (nats) of the layer alone (default);
 *  OUT_ERR  the attention output's relative error;
 *  IPV      ip_rel_rms + val_mse: the key side (relative score error) plus
 *           the value side (relative value MSE), measured separately;
 *  KL       KL of the attention weights (blind to values: a poor choice).
 * The attention metrics do not know how much each layer's error costs in
 * perplexity (on the bundled model a key error in layer 1 costs ~15x one in
 * layer 0); nll measures exactly that (docs/long-context.md). NLL is 0 so
 * that a zeroed config selects it. */
enum kvq_kv_auto_metric {
    KVQ_KV_AUTO_NLL = 0,
    KVQ_KV_AUTO_OUT_ERR,
    KVQ_KV_AUTO_IPV,
    KVQ_KV_AUTO_KL,
    KVQ_KV_AUTO_N_METRICS
};

/** @return "nll", "out_err", "ipv" or "kl"; NULL outside [0, KVQ_KV_AUTO_N_METRICS). */
KVQ_API const char *kvq_kv_auto_metric_name(int metric);

/** The metric named name (as kvq_kv_auto_metric_name spells it) into *out.
 *  @return KVQ_OK or KVQ_ERR_INVALID_ARG (unknown or NULL name). */
KVQ_API kvq_status kvq_kv_auto_metric_from_name(const char *name, enum kvq_kv_auto_metric *out);

/** The candidate pairs: K in {tq2, tq3, tq4, tq3j, tq4j, q4_0, q8_0} times
 *  V in {tq2, tq3, tq4, q4_0, q8_0}. Writes at most cap pairs to out[2*i]
 *  (K), out[2*i+1] (V). @return the number of pairs written (35 when cap
 *  allows). */
KVQ_API int kvq_kv_auto_candidates(enum kvq_type *out, int cap);

struct kvq_kv_auto_config {
    struct kvq_seq_config seq;      /* the sequence the choice is for: seq.kv_budget (bytes,
                                     * required), seed, recent_f16 (KVQ_WINDOW_AUTO: on, as
                                     * every candidate is compressed), sink_tokens; the
                                     * window's and sinks' f16 buffers come off the budget
                                     * first. type_k, type_v, layer_types and max_ctx are
                                     * ignored. Default kvq_seq_config_default. */
    size_t ctx;                     /* tokens the choice must hold; 0 (default) = the model's context */
    enum kvq_kv_auto_metric metric; /* default KVQ_KV_AUTO_NLL */
};

/* What kvq_kv_auto_choose picked. */
struct kvq_kv_auto_choice {
    int n_layers;
    enum kvq_type layer_types[2 * KVQ_KV_AUTO_MAX_LAYERS]; /* [n_layers][2]: K, V; ready for
                                                           * kvq_seq_config.layer_types */
    double layer_err[KVQ_KV_AUTO_MAX_LAYERS];   /* the chosen pair's measured error per layer */
    size_t layer_bytes[KVQ_KV_AUTO_MAX_LAYERS]; /* the chosen pair's bytes per token per layer
                                                 * (all KV heads, K and V) */
    size_t total_bytes;              /* sum of layer_bytes: bytes per token */
    double total_err;                /* sum of layer_err */
    double joint_err;                /* nll: the whole choice's measured calibration NLL
                                      * increase (compare with total_err); NAN otherwise or
                                      * when that forward failed */
    double base_nll;                 /* nll: the f32 mean NLL of the calibration; 0 otherwise */
    size_t ctx;                      /* the context planned for */
    size_t budget;                   /* seq.kv_budget */
    enum kvq_kv_auto_metric metric;
    int n_cands;                     /* candidate pairs this model supports */
    size_t calib_tokens;             /* calibration tokens, BOS included */
    double score_seconds;            /* wall clock of kvq_kv_auto_measure */
};

typedef struct kvq_kv_auto kvq_kv_auto;

/* Called after every measured cell (a forward for nll, an attention
 * evaluation otherwise): done of total. */
typedef void (*kvq_kv_auto_progress_fn)(void *user, size_t done, size_t total);

/** Fills cfg with the CLI's defaults: kvq_seq_config_default (no budget:
 *  set seq.kv_budget), ctx 0, metric nll. */
KVQ_API void kvq_kv_auto_config_default(struct kvq_kv_auto_config *cfg);

/** Prepares a choice for m under cfg: keeps the candidates m's head_dim
 *  supports and refuses a budget no candidate fits before any calibration
 *  is paid for. m must outlive the handle.
 *  @return KVQ_OK and *out (kvq_kv_auto_free); KVQ_ERR_INVALID_ARG (NULL,
 *  no budget, bad metric); KVQ_ERR_UNSUPPORTED (more than
 *  KVQ_KV_AUTO_MAX_LAYERS layers, or no candidate for this head_dim, with a
 *  line in err); KVQ_ERR_BUDGET (the budget cannot hold ctx tokens with any
 *  candidates); KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_kv_auto_create(const kvq_model *m, const struct kvq_kv_auto_config *cfg, kvq_kv_auto **out,
                                      kvq_error *err);

/** Frees a; accepts NULL. */
KVQ_API void kvq_kv_auto_free(kvq_kv_auto *a);

/** The calibration for a's metric from the tokens of a text (no BOS): the
 *  model's BOS (when it has one), then the LAST KVQ_KV_AUTO_NLL_TOKENS - 1
 *  (nll) or KVQ_KV_AUTO_CALIB_TOKENS - 1 (other metrics) text tokens, into
 *  *ids (malloc'ed, free() it) and *n.
 *  @return KVQ_OK; KVQ_ERR_RANGE when fewer than KVQ_KV_AUTO_MIN_CALIB
 *  tokens result (*n says how many, *ids is NULL); KVQ_ERR_INVALID_ARG;
 *  KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_kv_auto_calib_ids(const kvq_kv_auto *a, const int32_t *text, size_t n_text, int32_t **ids,
                                         size_t *n);

/** Scores every layer and candidate on the calibration ids[0..n) (as
 *  kvq_kv_auto_calib_ids returns them: BOS first when the model has one;
 *  copied). fn (optional) reports progress. Replaces an earlier
 *  measurement. @return KVQ_OK; KVQ_ERR_INVALID_ARG; KVQ_ERR_NOMEM; a
 *  forward or cache error, with one line in err. */
KVQ_API kvq_status kvq_kv_auto_measure(kvq_kv_auto *a, const int32_t *ids, size_t n, kvq_kv_auto_progress_fn fn,
                                       void *user, kvq_error *err);

/** Chooses per-layer types from the measurement for the budget at ctx
 *  tokens (whole pages included) into *out; for nll, also measures the
 *  whole choice on the calibration once (out->joint_err).
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (nothing measured yet);
 *  KVQ_ERR_BUDGET (no choice fits); KVQ_ERR_UNSUPPORTED (the choice cannot
 *  be planned, with a line in err); KVQ_ERR_NOMEM (knapsack table too
 *  large). */
KVQ_API kvq_status kvq_kv_auto_choose(kvq_kv_auto *a, struct kvq_kv_auto_choice *out, kvq_error *err);

/** Measured errors of cands[n_cands][2] for every layer of m on calibration
 *  tokens ids[0..n) (BOS included by the caller) with an attention metric
 *  (not nll: kvq_kv_auto_score_nll), at most max_queries query positions
 *  per layer (0 = all). err_out [n_layers][n_cands] gets the metric,
 *  cost_out [n_layers][n_cands] the bytes per token of the layer (all KV
 *  heads, K and V) as kvq_seq_plan_of charges a kvq_seq_config_default
 *  sequence of the pair: with the window, the centred keys' page means are
 *  included. seed: the caches' codec seed.
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (n < 2, metric nll); KVQ_ERR_NOMEM;
 *  a forward or cache error, with one line in err. */
KVQ_API kvq_status kvq_kv_auto_score(const kvq_model *m, const int32_t *ids, size_t n, const enum kvq_type *cands,
                                     int n_cands, uint64_t seed, size_t max_queries, enum kvq_kv_auto_metric metric,
                                     double *err_out, size_t *cost_out, kvq_error *err);

/** Mean NLL (natural log, per scored token) of the text text[0..n) (no
 *  BOS: the model's BOS is put first) with layer l's cache of types
 *  layer_types[2l] (K) and [2l+1] (V), or f32 everywhere when layer_types is
 *  NULL, through kvq_ppl_score: one window (several when n exceeds the
 *  model's context), forwarded in chunks of 256; seed as
 *  kvq_seq_config.seed; recent_f16 as kvq_seq_config.recent_f16 (the run's
 *  window, so that the calibration charges what the run will see).
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (n < 2); sequence or forward errors,
 *  with one line in err. */
KVQ_API kvq_status kvq_kv_auto_nll(const kvq_model *m, const int32_t *text, size_t n, uint64_t seed, int recent_f16,
                                   const enum kvq_type *layer_types, double *mean_nll, kvq_error *err);

/** The nll metric: err_out[l][j] = the calibration's mean NLL with layer l's
 *  cache of pair cands[j] and every other layer f32, minus the mean NLL with
 *  f32 everywhere (*base_nll, optional). measure ([n_layers][n_cands], NULL
 *  = all) skips pairs: their err_out is INFINITY (the knapsack never picks
 *  them). cost_out as kvq_kv_auto_score, for a sequence with recent_f16
 *  (without the window: the rows alone). One kvq_kv_auto_nll per measured
 *  cell plus one for the base. @return as kvq_kv_auto_nll;
 *  KVQ_ERR_UNSUPPORTED (more than KVQ_KV_AUTO_MAX_LAYERS layers). */
KVQ_API kvq_status kvq_kv_auto_score_nll(const kvq_model *m, const int32_t *text, size_t n, uint64_t seed,
                                         int recent_f16, const enum kvq_type *cands, int n_cands,
                                         const unsigned char *measure, double *base_nll, double *err_out,
                                         size_t *cost_out, kvq_error *err);

/** Exact knapsack: for each layer one of n_cands options (cost[l][c] bytes
 *  per token, err[l][c]) with sum cost <= cap and minimal sum err (ties: the
 *  lower candidate index in the earliest layer wins, so the result is
 *  deterministic). Options whose err is not finite are excluded.
 *  choice[n_layers] out; *total_err and *total_cost out (each optional).
 *  @return KVQ_OK; KVQ_ERR_BUDGET (even the cheapest pick exceeds cap);
 *  KVQ_ERR_NOMEM (table too large); KVQ_ERR_INVALID_ARG (a layer without a
 *  finite option, bad sizes, more than 127 candidates). */
KVQ_API kvq_status kvq_kv_auto_knapsack(int n_layers, int n_cands, const size_t *cost, const double *err, size_t cap,
                                        int *choice, double *total_err, size_t *total_cost);

/* ==== attention error on q/k/v dumps (kvq eval) =========================
 *
 * An eval dump is a safetensors file with
 *   q [layer, head, Tq, d]      queries of the last Tq positions
 *   k [layer, kv_head, T, d]    post-RoPE keys of all T positions
 *   v [layer, kv_head, T, d]    values
 * in F16, BF16 or F32 (other tensors, e.g. `ids`, are ignored; `kvq run
 * --dump-qkv` and kvq_qkv_dump.h write them). Query i sits at position
 * T - Tq + i and attends causally over keys 0..pos; query head h reads KV
 * head h / (head / kv_head) (GQA). Everything is held as f32 in the same
 * layouts. */

struct kvq_eval_data {
    char name[64]; /* file basename, or "synthetic" */
    int n_layers, n_heads, n_kv_heads, head_dim;
    size_t n_tokens;  /* T */
    size_t n_queries; /* Tq */
    float *q;         /* [L][H][Tq][d] */
    float *k, *v;     /* [L][KVH][T][d] */
};

/* Synthetic data: Gaussian with planted outlier channels, like real keys (a
 * few channels with a large mean and spread), deterministic from seed. */
struct kvq_eval_synth_config {
    int n_layers, n_heads, n_kv_heads, head_dim; /* default 2, 4, 2, 128 */
    size_t n_tokens, n_queries;                  /* default 1024, 64 */
    int n_outliers;                              /* outlier channels per (layer, kv head); 0 = pure
                                                  * Gaussian; default 4 */
    uint64_t seed;                               /* default 0 */
};

/** Fills cfg with `kvq eval --synthetic`'s defaults (see the fields). */
KVQ_API void kvq_eval_synth_config_default(struct kvq_eval_synth_config *cfg);

/** Reads and validates a dump: tensors present, rank 4, consistent shapes,
 *  GQA divisible, Tq <= T, head dim at most KVQ_MAX_DIM, every value finite.
 *  @return KVQ_OK and *out (free with kvq_eval_data_free); KVQ_ERR_IO,
 *  KVQ_ERR_FORMAT, KVQ_ERR_UNSUPPORTED, KVQ_ERR_NONFINITE or KVQ_ERR_NOMEM
 *  with one line in err naming the file and the problem. */
KVQ_API kvq_status kvq_eval_data_load(const char *path, struct kvq_eval_data *out, kvq_error *err);

/** Generates a synthetic dump. @return KVQ_OK and *out (free with
 *  kvq_eval_data_free); KVQ_ERR_INVALID_ARG (bad shape, line in err);
 *  KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_eval_data_synthetic(const struct kvq_eval_synth_config *cfg, struct kvq_eval_data *out,
                                           kvq_error *err);

/** Frees d's tensors and zeroes it; accepts NULL and a zeroed d. */
KVQ_API void kvq_eval_data_free(struct kvq_eval_data *d);

/** @return the position of query i (0 <= i < Tq). */
static inline size_t kvq_eval_query_pos(const struct kvq_eval_data *d, size_t i)
{
    return d->n_tokens - d->n_queries + i;
}

/* A cache configuration: K type, V type and the codec variant. */
#define KVQ_EVAL_LABEL_MAX 48
#define KVQ_EVAL_MAX_CONFIGS 256

struct kvq_eval_config {
    enum kvq_type type_k, type_v;
    enum kvq_rot_kind rot;
    enum kvq_qjl_kind qjl;
    uint64_t seed;
    /* "tq3j/tq3", plus "+dct", "+gauss", "+s7" where the variant differs
     * from the run's defaults, so plot labels stay short but unambiguous. */
    char label[KVQ_EVAL_LABEL_MAX];
};

/** Sets cfg to f32/f32 with the variant defaults: HADAMARD rotation, ORTHO
 *  QJL, seed 0, empty label. */
KVQ_API void kvq_eval_config_default(struct kvq_eval_config *cfg);

/** Fills c->label from its fields, naming the variants that differ from
 *  def (only for the types that use them). */
KVQ_API void kvq_eval_config_label(struct kvq_eval_config *c, const struct kvq_eval_config *def);

/** The sweep grid, with def's variant: the f32 floor, the f16/q8_0/q4_0
 *  baselines, tqB/tqB and tqBj/tqB for B = 1..4, mixed pairs, and K-only
 *  (V = f16) / V-only (K = f16) rows that separate the two sides' errors.
 *  @return the number of entries written to out (at most cap; 30 in all). */
KVQ_API size_t kvq_eval_sweep_default(const struct kvq_eval_config *def, struct kvq_eval_config *out, size_t cap);

/** Puts an f32/f32 configuration (the floor: only float rounding) first
 *  in cfgs[0..n) when there is none. @return the new count (unchanged when
 *  there is one or the array is full at cap). */
KVQ_API size_t kvq_eval_ensure_floor(const struct kvq_eval_config *def, struct kvq_eval_config *cfgs, size_t n,
                                     size_t cap);

/* Storage cost, exact (norms and scales included), per token and head. */
struct kvq_eval_cost {
    size_t row_k, row_v;   /* bytes of one K row and one V row */
    double bits_k, bits_v; /* 8 * row / d */
    double bits;           /* mean of K and V: 4 * (row_k + row_v) / d */
    double ratio_f16;      /* f16 bytes / these bytes = 4d / (row_k + row_v) */
};

/** @return KVQ_OK with *out, or KVQ_ERR_UNSUPPORTED (out zeroed) when a
 *  type cannot store dim d. */
KVQ_API kvq_status kvq_eval_cost_of(const struct kvq_eval_config *cfg, int d, struct kvq_eval_cost *out);

/* Error sums of one configuration over one layer (or several merged), and
 * the metrics they give (kvq_eval_stats_of), all relative to the exact
 * reference:
 *  key_mse, val_mse  sum ||x - x~||^2 / sum ||x||^2 over all T rows
 *  ip_rel_rms        RMS(q.k~ - q.k) / RMS(q.k) over all causal (query, key) pairs
 *  ip_bias           mean(q.k~ - q.k) / RMS(q.k)
 *  tv, kl            total variation 1/2 sum |p - p~| and KL(p || p~) in nats,
 *                    p~ = softmax of the decoded keys' scores; mean per query
 *  top1              fraction of queries whose attention argmax is unchanged
 *  top8              mean overlap |top8(p) & top8(p~)| / 8 (min(8, pos+1) early on)
 *  out_err           mean over queries of ||o - o^|| / ||o||, o^ from the fused
 *                    attention (absolute error where ||o|| = 0); out_err_max the worst */
struct kvq_eval_sums {
    double k_err2, k_norm2, v_err2, v_norm2;
    double ip_err, ip_err2, ip_ref2, ip_n;
    double tv, kl, top1, top8, out_rel, out_rel_max, n_q;
};

struct kvq_eval_stats {
    double key_mse, val_mse, ip_rel_rms, ip_bias, tv, kl, top1, top8, out_err, out_err_max;
};

/** acc += s (out_rel_max: the larger). Merge in a fixed order for results
 *  that do not depend on scheduling. */
KVQ_API void kvq_eval_sums_add(struct kvq_eval_sums *acc, const struct kvq_eval_sums *s);

/** The metrics of s (0 where a denominator is 0). */
KVQ_API void kvq_eval_stats_of(const struct kvq_eval_sums *s, struct kvq_eval_stats *out);

/* An evaluation of one dump, layer by layer: the exact reference is computed
 * once per layer in double precision from the original data (scores
 * s = q.k, probabilities p = softmax(s / sqrt(d)) over keys 0..pos, outputs
 * o = p V); then each configuration's cache is built for real
 * (kvq_cache_append of all T tokens), read back (kvq_cache_read), and every
 * selected query attended with kvq_attn_decode over pos + 1 tokens. */
typedef struct kvq_eval_ctx kvq_eval_ctx;

/** Plans an evaluation of d with at most max_queries query positions (0 =
 *  all Tq; otherwise evenly spaced, the last always included); allocates
 *  every buffer (the reference needs 16 bytes per head, query and key; more
 *  than 4 GiB is refused). d must outlive the context.
 *  @return KVQ_OK and *out (kvq_eval_ctx_free); KVQ_ERR_NOMEM or an
 *  attention workspace error, with one line in err. */
KVQ_API kvq_status kvq_eval_ctx_create(const struct kvq_eval_data *d, size_t max_queries, kvq_eval_ctx **out,
                                       kvq_error *err);

/** Frees c; accepts NULL. */
KVQ_API void kvq_eval_ctx_free(kvq_eval_ctx *c);

/** @return the number of query positions used. */
KVQ_API size_t kvq_eval_ctx_queries_used(const kvq_eval_ctx *c);

/** How the exact attention of the layers set so far averages values:
 *  eff_keys = 1 / mean(sum_j p_j^2), the effective number of keys a query
 *  reads; top_p = mean max_j p_j; v_gain = mean of
 *  sqrt(sum_j p_j^2 ||v_j||^2) / ||o||, the factor by which independent
 *  per-token value errors of relative size e reach the output: a V-only
 *  cache should give out_err ~ sqrt(val_mse) * v_gain. Averaging shrinks
 *  the output as well as the error, so v_gain stays near 1 unless the
 *  values share a common direction. All 0 before any layer. */
KVQ_API void kvq_eval_ctx_attention_stats(const kvq_eval_ctx *c, double *eff_keys, double *top_p, double *v_gain);

/** Computes the exact reference of layer l (needed before kvq_eval_ctx_run).
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (l out of range, line in err). */
KVQ_API kvq_status kvq_eval_ctx_set_layer(kvq_eval_ctx *c, int l, kvq_error *err);

/** Builds cfg's cache for the current layer, attends, and fills *out
 *  (overwritten). @return KVQ_OK, or the first library error with one line
 *  in err (no layer set, unsupported dim, norm too large for f16, out of
 *  memory). */
KVQ_API kvq_status kvq_eval_ctx_run(kvq_eval_ctx *c, const struct kvq_eval_config *cfg, struct kvq_eval_sums *out,
                                    kvq_error *err);

#ifdef __cplusplus
}
#endif

#endif /* KVQ_EVAL_H */
