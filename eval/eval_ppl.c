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

double kvq_logits_kl(const float *ref, const float *test, int vocab)
{
    double mr = -INFINITY, mt = -INFINITY;
    for (int i = 0; i < vocab; i++) {
        mr = ref[i] > mr ? ref[i] : mr;
        mt = test[i] > mt ? test[i] : mt;
    }
    double sr = 0, st = 0;
    for (int i = 0; i < vocab; i++) {
        sr += exp((double)ref[i] - mr);
        st += exp((double)test[i] - mt);
    }
    const double lr = mr + log(sr), lt = mt + log(st); /* log-normalisers */
    double kl = 0;
    for (int i = 0; i < vocab; i++) {
        const double a = (double)ref[i] - lr; /* log p_ref */
        if (a > -745.0)                       /* exp(a) is 0 below: no term */
            kl += exp(a) * (a - ((double)test[i] - lt));
    }
    return kl > 0 ? kl : 0; /* rounding can leave -1e-17 for identical rows */
}

static int32_t argmax_row(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* What kvq_ppl_score and kvq_ppl_kl share: the windows and chunks of s, and
 * of ref in lockstep when it is given (kls[i]: the KL of text token i's
 * prediction, NAN where none; *agree: positions whose argmax agree). */
static kvq_status score_windows(const kvq_model *m, kvq_seq *s, kvq_seq *ref, const struct kvq_ppl_config *cfg,
                                const int32_t *ids, size_t n, double *nll, struct kvq_ppl_result *res, double *kls,
                                double *ref_nll, size_t *agree, kvq_ppl_progress_fn fn, void *user)
{
    const size_t ctx = cfg->ctx ? cfg->ctx : kvq_seq_max_ctx(s);
    size_t chunk = cfg->chunk;
    if (ctx < 2 || !chunk || ctx > kvq_seq_max_ctx(s) || (ref && ctx > kvq_seq_max_ctx(ref)))
        return KVQ_ERR_INVALID_ARG;
    memset(res, 0, sizeof *res);
    const struct kvq_model_config *c = kvq_model_config_of(m);
    const int vocab = c->vocab;
    const int32_t bos = cfg->add_bos ? c->bos_id : -1;
    const size_t lead = bos >= 0 ? 1 : 0, per_win = ctx - lead; /* text tokens per window */
    if (chunk > ctx)
        chunk = ctx;
    float *logits = malloc(chunk * (size_t)vocab * sizeof *logits);
    float *rlog = ref ? malloc(chunk * (size_t)vocab * sizeof *rlog) : NULL;
    int32_t *win = malloc(ctx * sizeof *win);
    if (!logits || !win || (ref && !rlog)) {
        free(logits);
        free(rlog);
        free(win);
        return KVQ_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        if (nll)
            nll[i] = NAN;
        if (kls)
            kls[i] = NAN;
    }
    double t0 = eval_now();
    kvq_status st = KVQ_OK;
    for (size_t w0 = 0; w0 < n && st == KVQ_OK; w0 += per_win) {
        size_t m_text = n - w0 < per_win ? n - w0 : per_win, len = lead + m_text;
        if (lead)
            win[0] = bos;
        memcpy(win + lead, ids + w0, m_text * sizeof *ids);
        kvq_seq_reset(s);
        if (ref)
            kvq_seq_reset(ref);
        res->windows++;
        for (size_t c0 = 0; c0 < len && st == KVQ_OK; c0 += chunk) {
            size_t T = len - c0 < chunk ? len - c0 : chunk;
            st = kvq_seq_forward(s, win + c0, T, 0, logits, NULL);
            if (st == KVQ_OK && ref)
                st = kvq_seq_forward(ref, win + c0, T, 0, rlog, NULL);
            if (st != KVQ_OK)
                break;
            /* row r (window position c0 + r) predicts window position c0 + r + 1 */
            for (size_t r = 0; r < T && c0 + r + 1 < len; r++) {
                size_t target = c0 + r + 1; /* window position */
                const float *row = logits + r * (size_t)vocab;
                double v = kvq_ppl_token_nll(row, vocab, win[target]);
                if (!isfinite(v)) {
                    st = KVQ_ERR_NONFINITE;
                    break;
                }
                res->nll_sum += v;
                res->scored++;
                if (nll)
                    nll[w0 + target - lead] = v;
                if (ref) {
                    const float *rrow = rlog + r * (size_t)vocab;
                    *ref_nll += kvq_ppl_token_nll(rrow, vocab, win[target]);
                    kls[w0 + target - lead] = kvq_logits_kl(rrow, row, vocab);
                    *agree += argmax_row(rrow, vocab) == argmax_row(row, vocab);
                }
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
    free(rlog);
    free(win);
    return st;
}

kvq_status kvq_ppl_score(const kvq_model *m, kvq_seq *s, const struct kvq_ppl_config *cfg, const int32_t *ids,
                         size_t n, double *nll, struct kvq_ppl_result *res, kvq_ppl_progress_fn fn, void *user)
{
    if (!m || !s || !cfg || (!ids && n) || !res)
        return KVQ_ERR_INVALID_ARG;
    return score_windows(m, s, NULL, cfg, ids, n, nll, res, NULL, NULL, NULL, fn, user);
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

kvq_status kvq_ppl_kl(const kvq_model *m, kvq_seq *s, kvq_seq *ref, const struct kvq_ppl_config *cfg,
                      const int32_t *ids, size_t n, struct kvq_ppl_result *res, struct kvq_kl_result *kl,
                      kvq_ppl_progress_fn fn, void *user)
{
    if (!m || !s || !ref || !cfg || (!ids && n) || !res || !kl)
        return KVQ_ERR_INVALID_ARG;
    memset(kl, 0, sizeof *kl);
    double *kls = malloc((n ? n : 1) * sizeof *kls), ref_nll = 0;
    if (!kls)
        return KVQ_ERR_NOMEM;
    size_t agree = 0;
    kvq_status st = score_windows(m, s, ref, cfg, ids, n, NULL, res, kls, &ref_nll, &agree, fn, user);
    if (st == KVQ_OK) {
        size_t k = 0; /* the scored positions, packed and sorted for the percentile */
        for (size_t i = 0; i < n; i++)
            if (!isnan(kls[i]))
                kls[k++] = kls[i];
        double sum = 0;
        for (size_t i = 0; i < k; i++)
            sum += kls[i];
        qsort(kls, k, sizeof *kls, cmp_double);
        kl->n = k;
        if (k) {
            kl->mean = sum / (double)k;
            kl->p99 = kls[(size_t)ceil(0.99 * (double)k) - 1]; /* nearest rank */
            kl->max = kls[k - 1];
            kl->top1 = (double)agree / (double)k;
            kl->ref_ppl = exp(ref_nll / (double)k);
        }
    }
    free(kls);
    return st;
}
