/* kv_auto.c - calibration, scoring and the knapsack behind --kv-auto. */
#include "kv_auto.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "eval_data.h"
#include "eval_metrics.h"
#include "eval_spec.h"
#include "ppl_core.h"

/* Queries per layer the scorer attends with: evenly spaced over the
 * calibration text, enough for a stable mean at a fraction of the cost. */
#define KV_AUTO_QUERIES 128
/* Largest knapsack choice table (layers x capacity units) we build. */
#define KV_AUTO_MAX_CELLS ((size_t)1 << 26)

const char *kv_auto_metric_name(int metric)
{
    static const char *names[KV_AUTO_N_METRICS] = {"nll", "out_err", "ipv", "kl"};
    return metric >= 0 && metric < KV_AUTO_N_METRICS ? names[metric] : NULL;
}

int kv_auto_candidates(enum kvq_type *out, int cap)
{
    static const char *ks[] = {"tq2", "tq3", "tq4", "tq3j", "tq4j", "q4_0", "q8_0"};
    static const char *vs[] = {"tq2", "tq3", "tq4", "q4_0", "q8_0"};
    int n = 0;
    for (size_t i = 0; i < sizeof ks / sizeof *ks; i++)
        for (size_t j = 0; j < sizeof vs / sizeof *vs; j++) {
            enum kvq_type tk, tv;
            if (n >= cap || kvq_type_from_name(ks[i], &tk) != KVQ_OK || kvq_type_from_name(vs[j], &tv) != KVQ_OK)
                continue;
            out[2 * n] = tk;
            out[2 * n + 1] = tv;
            n++;
        }
    return n;
}

static void calib_hook(void *user, int layer, size_t pos0, size_t T, const float *q, const float *k, const float *v)
{
    /* user: an eval dump held in memory, every position a query */
    struct eval_data *d = user;
    size_t dim = (size_t)d->head_dim, H = (size_t)d->n_heads, KH = (size_t)d->n_kv_heads, N = d->n_tokens;
    for (size_t t = 0; t < T && pos0 + t < N; t++) {
        size_t p = pos0 + t;
        for (size_t h = 0; h < H; h++)
            memcpy(d->q + (((size_t)layer * H + h) * N + p) * dim, q + (t * H + h) * dim, dim * sizeof *q);
        for (size_t h = 0; h < KH; h++) {
            size_t o = (((size_t)layer * KH + h) * N + p) * dim;
            memcpy(d->k + o, k + (t * KH + h) * dim, dim * sizeof *k);
            memcpy(d->v + o, v + (t * KH + h) * dim, dim * sizeof *v);
        }
    }
}

/* One forward with an f32 cache over ids, recording q/k/v. */
static kvq_status calibrate(const kvq_model *m, const int32_t *ids, size_t n, struct eval_data *d, kvq_error *err)
{
    const struct kvq_model_config *c = kvq_model_config_of(m);
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "kv-auto calibration");
    d->n_layers = c->n_layers;
    d->n_heads = c->n_heads;
    d->n_kv_heads = c->n_kv_heads;
    d->head_dim = c->head_dim;
    d->n_tokens = d->n_queries = n;
    size_t per = (size_t)c->n_layers * n * (size_t)c->head_dim;
    d->q = malloc(per * (size_t)c->n_heads * sizeof *d->q);
    d->k = malloc(per * (size_t)c->n_kv_heads * sizeof *d->k);
    d->v = malloc(per * (size_t)c->n_kv_heads * sizeof *d->v);
    if (!d->q || !d->k || !d->v) {
        eval_data_free(d);
        return KVQ_ERR_NOMEM;
    }
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.type_k = sc.type_v = KVQ_TYPE_F32;
    sc.max_ctx = n;
    kvq_seq *s = NULL;
    kvq_status st = kvq_seq_create(m, &sc, &s, err);
    if (st == KVQ_OK) {
        kvq_seq_set_qkv_hook(s, calib_hook, d);
        st = kvq_seq_forward(s, ids, n, n, NULL, NULL);
        if (st != KVQ_OK && err && !err->msg[0])
            snprintf(err->msg, sizeof err->msg, "calibration forward: %s", kvq_status_str(st));
    }
    kvq_seq_free(s);
    if (st != KVQ_OK)
        eval_data_free(d);
    return st;
}

/* Costs exactly as the sequence accounts them (a uniform plan split per layer). */
static kvq_status fill_costs(const kvq_model *m, const enum kvq_type *cands, int n_cands, size_t *cost_out,
                             kvq_error *err)
{
    int L = kvq_model_config_of(m)->n_layers;
    for (int j = 0; j < n_cands; j++) {
        struct kvq_seq_config sc;
        struct kvq_seq_plan pl;
        kvq_seq_config_default(&sc);
        sc.type_k = cands[2 * j];
        sc.type_v = cands[2 * j + 1];
        kvq_status st = kvq_seq_plan_of(m, &sc, &pl);
        if (st != KVQ_OK) {
            if (err)
                snprintf(err->msg, sizeof err->msg, "cache type %s/%s: %s", kvq_type_traits(sc.type_k)->name,
                         kvq_type_traits(sc.type_v)->name, kvq_status_str(st));
            return st;
        }
        for (int l = 0; l < L; l++)
            cost_out[(size_t)l * (size_t)n_cands + (size_t)j] = pl.bytes_per_token / (size_t)L;
    }
    return KVQ_OK;
}

kvq_status kv_auto_score(const kvq_model *m, const int32_t *ids, size_t n, const enum kvq_type *cands, int n_cands,
                         uint64_t seed, size_t max_queries, enum kv_auto_metric metric, double *err_out, size_t *cost_out, kvq_error *err)
{
    if (!m || !ids || n < 2 || !cands || n_cands < 1 || !err_out || !cost_out || metric == KV_AUTO_NLL ||
        metric >= KV_AUTO_N_METRICS)
        return KVQ_ERR_INVALID_ARG; /* nll: kv_auto_score_nll */
    kvq_status st = fill_costs(m, cands, n_cands, cost_out, err);
    if (st != KVQ_OK)
        return st;
    int L = kvq_model_config_of(m)->n_layers;
    struct eval_data d;
    st = calibrate(m, ids, n, &d, err);
    if (st != KVQ_OK)
        return st;
    eval_ctx *ctx = NULL;
    st = eval_ctx_create(&d, max_queries, &ctx, err);
    for (int l = 0; st == KVQ_OK && l < L; l++) {
        st = eval_ctx_set_layer(ctx, l, err);
        for (int j = 0; st == KVQ_OK && j < n_cands; j++) {
            struct eval_config cfg;
            struct eval_sums sums;
            struct eval_stats stats;
            eval_config_defaults(&cfg);
            cfg.type_k = cands[2 * j];
            cfg.type_v = cands[2 * j + 1];
            cfg.seed = seed;
            st = eval_ctx_run(ctx, &cfg, &sums, err);
            if (st == KVQ_OK) {
                eval_stats_of(&sums, &stats);
                err_out[(size_t)l * (size_t)n_cands + (size_t)j] =
                    metric == KV_AUTO_KL    ? stats.kl
                    : metric == KV_AUTO_IPV ? stats.ip_rel_rms + stats.val_mse
                                            : stats.out_err;
            }
        }
    }
    eval_ctx_free(ctx);
    eval_data_free(&d);
    return st;
}

/* Tokens per forward in the NLL calibration: kvq ppl's default chunk, so the
 * calibration attends through the cache exactly as the evaluation does. */
#define KV_AUTO_NLL_CHUNK 256

kvq_status kv_auto_nll(const kvq_model *m, const int32_t *text, size_t n, uint64_t seed, int recent_f16,
                       const enum kvq_type *layer_types, double *mean_nll, kvq_error *err)
{
    if (!m || !text || n < 2 || !mean_nll)
        return KVQ_ERR_INVALID_ARG;
    const struct kvq_model_config *c = kvq_model_config_of(m);
    size_t ctx = n + (c->bos_id >= 0 ? 1 : 0);
    if (ctx > (size_t)c->max_ctx)
        ctx = (size_t)c->max_ctx;
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.type_k = sc.type_v = KVQ_TYPE_F32;
    sc.seed = seed;
    sc.max_ctx = ctx;
    sc.max_chunk = KV_AUTO_NLL_CHUNK;
    sc.layer_types = layer_types;
    sc.recent_f16 = recent_f16;
    kvq_seq *s = NULL;
    kvq_status st = kvq_seq_create(m, &sc, &s, err);
    struct ppl_result r;
    if (st == KVQ_OK)
        st = ppl_score(m, s, text, n, c->bos_id, ctx, KV_AUTO_NLL_CHUNK, NULL, &r, NULL, NULL);
    kvq_seq_free(s);
    if (st == KVQ_OK && !r.scored)
        st = KVQ_ERR_INVALID_ARG;
    if (st != KVQ_OK) {
        if (err && !err->msg[0])
            snprintf(err->msg, sizeof err->msg, "calibration forward: %s", kvq_status_str(st));
        return st;
    }
    *mean_nll = r.nll_sum / (double)r.scored;
    return KVQ_OK;
}

kvq_status kv_auto_score_nll(const kvq_model *m, const int32_t *text, size_t n, uint64_t seed, int recent_f16,
                             const enum kvq_type *cands, int n_cands, const unsigned char *measure,
                             double *base_nll, double *err_out, size_t *cost_out, kvq_error *err)
{
    if (!m || !text || n < 2 || !cands || n_cands < 1 || !err_out || !cost_out)
        return KVQ_ERR_INVALID_ARG;
    int L = kvq_model_config_of(m)->n_layers;
    if (L > KV_OPTS_MAX_LAYERS)
        return KVQ_ERR_UNSUPPORTED;
    kvq_status st = fill_costs(m, cands, n_cands, cost_out, err);
    double base = 0;
    if (st == KVQ_OK)
        st = kv_auto_nll(m, text, n, seed, recent_f16, NULL, &base, err);
    if (st != KVQ_OK)
        return st;
    if (base_nll)
        *base_nll = base;
    /* every layer f32 except the one under test */
    enum kvq_type lt[2 * KV_OPTS_MAX_LAYERS];
    for (int i = 0; i < 2 * L; i++)
        lt[i] = KVQ_TYPE_F32;
    for (int l = 0; l < L; l++) {
        for (int j = 0; j < n_cands; j++) {
            size_t at = (size_t)l * (size_t)n_cands + (size_t)j;
            if (measure && !measure[at]) {
                err_out[at] = INFINITY;
                continue;
            }
            lt[2 * l] = cands[2 * j];
            lt[2 * l + 1] = cands[2 * j + 1];
            double v = 0;
            if ((st = kv_auto_nll(m, text, n, seed, recent_f16, lt, &v, err)) != KVQ_OK)
                return st;
            err_out[at] = v - base;
        }
        lt[2 * l] = lt[2 * l + 1] = KVQ_TYPE_F32;
    }
    return KVQ_OK;
}

static size_t gcd(size_t a, size_t b)
{
    while (b) {
        size_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

kvq_status kv_auto_choose(int n_layers, int n_cands, const size_t *cost, const double *err, size_t cap,
                          int *choice, double *total_err, size_t *total_cost)
{
    if (n_layers < 1 || n_cands < 1 || n_cands > 127 || !cost || !err || !choice)
        return KVQ_ERR_INVALID_ARG;
    size_t N = (size_t)n_cands, g = 0, most = 0, least = 0;
    for (size_t l = 0; l < (size_t)n_layers; l++) {
        size_t hi = 0, lo = SIZE_MAX;
        for (size_t j = 0; j < N; j++) {
            if (!isfinite(err[l * N + j]))
                continue; /* excluded (not measured) */
            g = gcd(g, cost[l * N + j]);
            hi = cost[l * N + j] > hi ? cost[l * N + j] : hi;
            lo = cost[l * N + j] < lo ? cost[l * N + j] : lo;
        }
        if (lo == SIZE_MAX)
            return KVQ_ERR_INVALID_ARG;
        most += hi;
        least += lo;
    }
    if (least > cap)
        return KVQ_ERR_BUDGET;
    if (g == 0)
        g = 1;
    /* Capacity beyond the dearest pick changes nothing; units of the gcd keep
     * the table small (bytes per token are multiples of the block sizes). */
    size_t W = (cap < most ? cap : most) / g;
    if ((size_t)n_layers * (W + 1) > KV_AUTO_MAX_CELLS)
        return KVQ_ERR_NOMEM;
    double *f = malloc((W + 1) * sizeof *f), *f2 = malloc((W + 1) * sizeof *f2);
    signed char *pick = malloc((size_t)n_layers * (W + 1));
    if (!f || !f2 || !pick) {
        free(f);
        free(f2);
        free(pick);
        return KVQ_ERR_NOMEM;
    }
    /* f[w]: least summed error of the layers so far within w units; INFINITY =
     * none fits (errors may be negative: an NLL increase can be below 0). */
    for (size_t w = 0; w <= W; w++)
        f[w] = 0;
    for (size_t l = 0; l < (size_t)n_layers; l++) {
        for (size_t w = 0; w <= W; w++) {
            double best = INFINITY;
            int bj = -1;
            for (size_t j = 0; j < N; j++) {
                size_t u = cost[l * N + j] / g;
                if (u > w || !isfinite(f[w - u]) || !isfinite(err[l * N + j]))
                    continue;
                double e = f[w - u] + err[l * N + j];
                if (bj < 0 || e < best) {
                    best = e;
                    bj = (int)j;
                }
            }
            f2[w] = best;
            pick[l * (W + 1) + w] = (signed char)bj;
        }
        memcpy(f, f2, (W + 1) * sizeof *f);
    }
    double te = 0;
    size_t tc = 0, w = W;
    for (size_t l = (size_t)n_layers; l-- > 0;) {
        int j = pick[l * (W + 1) + w];
        choice[l] = j;
        te += err[l * N + (size_t)j];
        tc += cost[l * N + (size_t)j];
        w -= cost[l * N + (size_t)j] / g;
    }
    free(f);
    free(f2);
    free(pick);
    if (total_err)
        *total_err = te;
    if (total_cost)
        *total_cost = tc;
    return KVQ_OK;
}

/* The calibration: BOS + the LAST want-1 tokens of the text (valid.txt by
 * default), so that it never overlaps an evaluation that scores the file from
 * its start (kvq ppl --max-tokens N with N < total - want). */
static int read_calib(const char *cmd, const struct kv_opts *o, const kvq_model *m, const kvq_tokenizer *tok,
                      const char *model_dir, size_t want, int32_t **ids, size_t *n)
{
    char path[4096];
    if (o->auto_calib)
        snprintf(path, sizeof path, "%s", o->auto_calib);
    else
        snprintf(path, sizeof path, "%s/reference/valid.txt", model_dir);
    size_t len = 0, nt = 0;
    int32_t *t = NULL;
    char *text = cli_read_file(path, &len);
    if (!text)
        return cli_error(cmd, "%s: cannot read the --kv-auto calibration text (give one with --kv-auto-calib)", path);
    kvq_status st = kvq_tokenizer_encode_alloc(tok, text, len, 0, &t, &nt);
    free(text);
    if (st != KVQ_OK)
        return cli_status_error(cmd, st, "encoding the calibration text");
    int bos = kvq_model_config_of(m)->bos_id;
    size_t keep = nt < want - 1 ? nt : want - 1;
    *ids = malloc((keep + 1) * sizeof **ids);
    if (!*ids) {
        free(t);
        return cli_status_error(cmd, KVQ_ERR_NOMEM, "calibration ids");
    }
    *n = 0;
    if (bos >= 0)
        (*ids)[(*n)++] = bos;
    memcpy(*ids + *n, t + (nt - keep), keep * sizeof *t);
    *n += keep;
    free(t);
    if (*n < 16) {
        free(*ids);
        *ids = NULL;
        return cli_error(cmd, "%s: the calibration text has only %zu tokens (16 or more needed)", path, *n);
    }
    return 0;
}

int kv_auto_apply(const char *cmd, struct kv_opts *o, const kvq_model *m, const kvq_tokenizer *tok,
                  const char *model_dir, size_t ctx, int quiet)
{
    if (!o->kv_auto)
        return 0;
    const struct kvq_model_config *c = kvq_model_config_of(m);
    int L = c->n_layers, rc = 0;
    if (L > KV_OPTS_MAX_LAYERS)
        return cli_error(cmd, "--kv-auto supports at most %d layers", KV_OPTS_MAX_LAYERS);
    if (o->auto_ctx)
        ctx = o->auto_ctx;
    enum kvq_type cands[2 * KV_AUTO_MAX_CANDS];
    int all = kv_auto_candidates(cands, KV_AUTO_MAX_CANDS), nc = 0;
    /* Keep only the pairs this model's head_dim supports. */
    for (int j = 0; j < all; j++) {
        struct kvq_seq_config sc;
        struct kvq_seq_plan pl;
        kvq_seq_config_default(&sc);
        sc.type_k = cands[2 * j];
        sc.type_v = cands[2 * j + 1];
        if (kvq_seq_plan_of(m, &sc, &pl) != KVQ_OK)
            continue;
        cands[2 * nc] = sc.type_k;
        cands[2 * nc + 1] = sc.type_v;
        nc++;
    }
    if (!nc)
        return cli_error(cmd, "--kv-auto: no candidate cache type supports head_dim %d", c->head_dim);
    /* Every candidate is compressed, so the run's recent-token window is on
     * unless --no-kv-recent-f16: the nll calibration uses the same setting
     * (the attention metrics score the packed rows alone), and the window's
     * (and sinks') fixed f16 buffers come off the budget first. */
    const int window = o->recent_f16 != 0;
    size_t fixed = 0;
    {
        struct kvq_seq_config sc;
        struct kvq_seq_plan pl;
        kv_opts_seq_config(o, &sc);
        sc.type_k = cands[0];
        sc.type_v = cands[1];
        sc.layer_types = NULL;
        sc.recent_f16 = window;
        if (kvq_seq_plan_of(m, &sc, &pl) == KVQ_OK)
            fixed = pl.fixed_bytes;
    }
    const size_t budget = o->budget > fixed ? o->budget - fixed : 0;
    /* Refuse a budget no candidate fits before paying for the calibration. */
    size_t least = SIZE_MAX;
    for (int j = 0; j < nc; j++) {
        size_t one[KV_OPTS_MAX_LAYERS];
        if (fill_costs(m, cands + 2 * j, 1, one, NULL) == KVQ_OK && (size_t)L * one[0] < least)
            least = (size_t)L * one[0];
    }
    if (least > budget / ctx)
        return cli_error(cmd, "--kv-auto: --kv-budget %zu bytes cannot hold %zu tokens with any candidate types",
                         o->budget, ctx);
    int32_t *ids = NULL;
    size_t n = 0;
    int nll = o->auto_metric == KV_AUTO_NLL;
    if ((rc = read_calib(cmd, o, m, tok, model_dir, nll ? KV_AUTO_NLL_TOKENS : KV_AUTO_CALIB_TOKENS, &ids, &n)) != 0)
        return rc;
    double *errs = malloc((size_t)L * (size_t)nc * sizeof *errs);
    size_t *cost = malloc((size_t)L * (size_t)nc * sizeof *cost);
    int choice[KV_OPTS_MAX_LAYERS];
    kvq_error err = {0};
    double t0 = cli_now(), base = 0;
    kvq_status st = KVQ_ERR_NOMEM;
    /* read_calib put the BOS first; kv_auto_nll takes the text alone and adds its own */
    size_t lead = c->bos_id >= 0 ? 1 : 0;
    if (errs && cost && nll)
        st = kv_auto_score_nll(m, ids + lead, n - lead, o->seed, window, cands, nc, NULL, &base, errs, cost, &err);
    else if (errs && cost)
        st = kv_auto_score(m, ids, n, cands, nc, o->seed, KV_AUTO_QUERIES, (enum kv_auto_metric)o->auto_metric,
                           errs, cost, &err);
    double t_score = cli_now() - t0;
    if (st != KVQ_OK) {
        rc = err.msg[0] ? cli_error(cmd, "--kv-auto: %s", err.msg) : cli_status_error(cmd, st, "--kv-auto scoring");
        goto out;
    }
    size_t cap = budget / ctx, total_cost = 0;
    double total_err = 0;
    for (;;) {
        st = kv_auto_choose(L, nc, cost, errs, cap, choice, &total_err, &total_cost);
        if (st == KVQ_ERR_BUDGET) {
            rc = cli_error(cmd, "--kv-auto: --kv-budget %zu bytes cannot hold %zu tokens with any candidate types",
                           o->budget, ctx);
            goto out;
        }
        if (st != KVQ_OK) {
            rc = cli_status_error(cmd, st, "--kv-auto choice");
            goto out;
        }
        o->n_layer_types = L;
        for (int l = 0; l < L; l++) {
            o->layer_types[2 * l] = cands[2 * choice[l]];
            o->layer_types[2 * l + 1] = cands[2 * choice[l] + 1];
        }
        /* Whole pages per layer may hold a few tokens less than bytes/ctx
         * promises: ask the planner and tighten until the context fits. */
        struct kvq_seq_config sc;
        struct kvq_seq_plan pl;
        kv_opts_seq_config(o, &sc);
        sc.max_ctx = ctx;
        if (kvq_seq_plan_of(m, &sc, &pl) != KVQ_OK) {
            rc = cli_error(cmd, "--kv-auto: the chosen types cannot be planned for this model");
            goto out;
        }
        if (pl.budget_tokens >= ctx)
            break;
        if (total_cost == 0) {
            rc = cli_error(cmd, "--kv-auto: no choice fits %zu tokens", ctx);
            goto out;
        }
        cap = total_cost - 1;
    }
    o->auto_ctx_used = ctx;
    for (int l = 0; l < L; l++)
        o->auto_err[l] = errs[(size_t)l * (size_t)nc + (size_t)choice[l]];
    /* The knapsack assumes the layers' NLL increases add up: measure the
     * whole choice on the calibration once and report both. */
    double joint = NAN;
    if (nll) {
        double v = 0;
        if (kv_auto_nll(m, ids + lead, n - lead, o->seed, window, o->layer_types, &v, &err) == KVQ_OK)
            joint = v - base;
    }
    if (!quiet) {
        fprintf(stderr, "kvq %s: --kv-auto for %zu bytes at %zu tokens (%zu calibration tokens, the end of %s; "
                        "scored in %.1f s):\n",
                cmd, o->budget, ctx, n, o->auto_calib ? o->auto_calib : "reference/valid.txt", t_score);
        if (nll)
            fprintf(stderr, "  nll: %d layers x %d pairs + 1 forwards of %zu tokens; f32 mean NLL %.5f\n", L, nc, n,
                    base);
        for (int l = 0; l < L; l++) {
            size_t b = cost[(size_t)l * (size_t)nc + (size_t)choice[l]];
            fprintf(stderr, "  layer %2d  %s/%s  %.3f bits/value  %s %.5f\n", l,
                    kvq_type_traits(o->layer_types[2 * l])->name, kvq_type_traits(o->layer_types[2 * l + 1])->name,
                    8.0 * (double)b / (2.0 * c->n_kv_heads * c->head_dim), kv_auto_metric_name(o->auto_metric),
                    o->auto_err[l]);
        }
        fprintf(stderr, "  total     %zu bytes/token (%zu at %zu tokens)  summed %s %.5f\n", total_cost,
                total_cost * ctx, ctx, kv_auto_metric_name(o->auto_metric), total_err);
        if (nll)
            fprintf(stderr, "  additivity: the whole choice raises the calibration NLL by %.5f (sum of layers %.5f)\n",
                    joint, total_err);
    }
out:
    free(ids);
    free(errs);
    free(cost);
    return rc;
}

void kv_auto_json(void *cjson_root, const struct kv_opts *o, const kvq_model *m)
{
    cJSON *root = cjson_root;
    if (!root || !o->kv_auto || !o->n_layer_types)
        return;
    const struct kvq_model_config *c = kvq_model_config_of(m);
    cJSON *a = cJSON_CreateObject(), *layers = cJSON_CreateArray();
    if (!a || !layers) {
        cJSON_Delete(a);
        cJSON_Delete(layers);
        return;
    }
    cJSON_AddItemToObject(root, "kv_auto", a);
    cJSON_AddNumberToObject(a, "ctx", (double)o->auto_ctx_used);
    cJSON_AddNumberToObject(a, "budget", (double)o->budget);
    cJSON_AddStringToObject(a, "metric", kv_auto_metric_name(o->auto_metric));
    double total = 0;
    for (int l = 0; l < o->n_layer_types; l++) {
        cJSON *e = cJSON_CreateObject();
        if (!e)
            break;
        enum kvq_type tk = o->layer_types[2 * l], tv = o->layer_types[2 * l + 1];
        struct eval_config cfg;
        struct eval_cost cost;
        eval_config_defaults(&cfg);
        cfg.type_k = tk;
        cfg.type_v = tv;
        double bits = eval_cost_of(&cfg, c->head_dim, &cost) == KVQ_OK ? cost.bits : 0;
        cJSON_AddStringToObject(e, "k", kvq_type_traits(tk)->name);
        cJSON_AddStringToObject(e, "v", kvq_type_traits(tv)->name);
        cJSON_AddNumberToObject(e, "bits", bits);
        cJSON_AddNumberToObject(e, "err", o->auto_err[l]);
        cJSON_AddItemToArray(layers, e);
        total += o->auto_err[l];
    }
    cJSON_AddNumberToObject(a, "total_err", total);
    cJSON_AddItemToObject(a, "layers", layers);
}
