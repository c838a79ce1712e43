/* ppl_core.h - perplexity with the compressed KV cache in the loop.
 *
 * The text is cut into windows of ctx tokens. Each window starts from an
 * empty sequence (BOS first when the model has one) and is forwarded in
 * chunks: every chunk's K/V are appended to the kvq caches and its queries
 * attend over the *encoded* cache of the window so far, chunk included, as
 * generation does (kvq_attn_causal). Every token of the window except the
 * first is predicted from the logits of the one before it; with a BOS, the
 * first text token of the window is predicted from BOS.
 */
#ifndef KVQ_PPL_CORE_H
#define KVQ_PPL_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "kvq_model.h"

struct ppl_result {
    size_t scored;   /* tokens whose NLL was counted */
    size_t windows;
    double nll_sum;  /* natural log */
    double ppl;      /* exp(nll_sum / scored) */
    double seconds;
};

/* Called after each chunk: tokens forwarded so far of n_total. */
typedef void (*ppl_progress_fn)(void *user, size_t done, size_t n_total, const struct ppl_result *sofar);

/** Scores ids[0..n) (text ids, no BOS) in windows of ctx tokens (BOS
 *  included when bos >= 0) forwarded `chunk` tokens at a time through s (a
 *  sequence of model m), which is reset before each window (s needs
 *  max_ctx >= ctx).
 *  nll (optional, [n]) gets -ln p(ids[i] | its window's prefix), or NAN for a
 *  token that is not predicted (the first of a window when bos < 0).
 *  The NLL is computed in double from each logits row (log-sum-exp).
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (ctx < 2, chunk 0, ctx > max_ctx);
 *  KVQ_ERR_NOMEM; errors of kvq_seq_forward (KVQ_ERR_BUDGET when the KV
 *  budget cannot hold a window). */
kvq_status ppl_score(const kvq_model *m, kvq_seq *s, const int32_t *ids, size_t n, int32_t bos, size_t ctx,
                     size_t chunk, double *nll, struct ppl_result *res, ppl_progress_fn fn, void *user);

/** -ln softmax(logits)[target] over vocab entries, in double. */
double ppl_token_nll(const float *logits, int vocab, int32_t target);

#endif
