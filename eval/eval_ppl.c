/* eval_ppl.c - windowed, chunked perplexity through kvq_seq_forward
 * (kvq_eval.h, "perplexity"). */
#include "kvq_eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eval_internal.h"

void kvq_ppl_config_default(struct kvq_ppl_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->chunk = 256;
    cfg->add_bos = 1;
}

double kvq_ppl_token_nll(const float *logits, int vocab, int32_t target)
{
    double mx = -INFINITY;
    for (int i = 0; i < vocab; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < vocab; i++)
        sum += exp((double)logits[i] - mx);
    return log(sum) + mx - (double)logits[target];
}

kvq_status kvq_ppl_score(const kvq_model *m, kvq_seq *s, const struct kvq_ppl_config *cfg, const int32_t *ids,
                         size_t n, double *nll, struct kvq_ppl_result *res, kvq_ppl_progress_fn fn, void *user)
{
    if (!m || !s || !cfg || (!ids && n) || !res)
        return KVQ_ERR_INVALID_ARG;
    const size_t ctx = cfg->ctx ? cfg->ctx : kvq_seq_max_ctx(s);
    size_t chunk = cfg->chunk;
    if (ctx < 2 || !chunk || ctx > kvq_seq_max_ctx(s))
        return KVQ_ERR_INVALID_ARG;
    memset(res, 0, sizeof *res);
    const struct kvq_model_config *c = kvq_model_config_of(m);
    const int vocab = c->vocab;
    const int32_t bos = cfg->add_bos ? c->bos_id : -1;
    const size_t lead = bos >= 0 ? 1 : 0, per_win = ctx - lead; /* text tokens per window */
    if (chunk > ctx)
        chunk = ctx;
    float *logits = malloc(chunk * (size_t)vocab * sizeof *logits);
    int32_t *win = malloc(ctx * sizeof *win);
    if (!logits || !win) {
        free(logits);
        free(win);
        return KVQ_ERR_NOMEM;
    }
    if (nll)
        for (size_t i = 0; i < n; i++)
            nll[i] = NAN;
    double t0 = eval_now();
    kvq_status st = KVQ_OK;
    for (size_t w0 = 0; w0 < n && st == KVQ_OK; w0 += per_win) {
        size_t m_text = n - w0 < per_win ? n - w0 : per_win, len = lead + m_text;
        if (lead)
            win[0] = bos;
        memcpy(win + lead, ids + w0, m_text * sizeof *ids);
        kvq_seq_reset(s);
        res->windows++;
        for (size_t c0 = 0; c0 < len && st == KVQ_OK; c0 += chunk) {
            size_t T = len - c0 < chunk ? len - c0 : chunk;
            st = kvq_seq_forward(s, win + c0, T, 0, logits, NULL);
            if (st != KVQ_OK)
                break;
            /* row r (window position c0 + r) predicts window position c0 + r + 1 */
            for (size_t r = 0; r < T && c0 + r + 1 < len; r++) {
                size_t target = c0 + r + 1; /* window position */
                double v = kvq_ppl_token_nll(logits + r * (size_t)vocab, vocab, win[target]);
                if (!isfinite(v)) {
                    st = KVQ_ERR_NONFINITE;
                    break;
                }
                res->nll_sum += v;
                res->scored++;
                if (nll)
                    nll[w0 + target - lead] = v;
            }
            if (fn) {
                res->ppl = res->scored ? exp(res->nll_sum / (double)res->scored) : 0;
                fn(user, w0 + (c0 + T > lead ? c0 + T - lead : 0), n, res);
            }
        }
    }
    res->ppl = res->scored ? exp(res->nll_sum / (double)res->scored) : 0;
    res->seconds = eval_now() - t0;
    free(logits);
    free(win);
    return st;
}
