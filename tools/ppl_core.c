/* ppl_core.c - windowed, chunked perplexity through kvq_seq_forward. */
#include "ppl_core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

double ppl_token_nll(const float *logits, int vocab, int32_t target)
{
    double mx = -INFINITY;
    for (int i = 0; i < vocab; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < vocab; i++)
        sum += exp((double)logits[i] - mx);
    return log(sum) + mx - (double)logits[target];
}

kvq_status ppl_score(const kvq_model *m, kvq_seq *s, const int32_t *ids, size_t n, int32_t bos, size_t ctx,
                     size_t chunk, double *nll, struct ppl_result *res, ppl_progress_fn fn, void *user)
{
    if (!m || !s || (!ids && n) || !res || ctx < 2 || !chunk || ctx > kvq_seq_max_ctx(s))
        return KVQ_ERR_INVALID_ARG;
    memset(res, 0, sizeof *res);
    const int vocab = kvq_model_config_of(m)->vocab;
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
    double t0 = cli_now();
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
                double v = ppl_token_nll(logits + r * (size_t)vocab, vocab, win[target]);
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
    res->seconds = cli_now() - t0;
    free(logits);
    free(win);
    return st;
}
