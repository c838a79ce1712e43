/* eval_kv_auto.c - calibration, scoring and the knapsack behind --kv-auto
 * (kvq_eval.h, "per-layer cache types for a budget"). */
#include "kvq_eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval_internal.h"

/* Queries per layer the attention metrics attend with: evenly spaced over
 * the calibration text, enough for a stable mean at a fraction of the cost. */
#define KV_AUTO_QUERIES 128
/* Largest knapsack choice table (layers x capacity units) we build. */
#define KV_AUTO_MAX_CELLS ((size_t)1 << 26)
/* Tokens per forward in the NLL calibration: kvq ppl's default chunk, so the
 * calibration attends through the cache exactly as the evaluation does. */
#define KV_AUTO_NLL_CHUNK 256

static const char *const metric_names[KVQ_KV_AUTO_N_METRICS] = {"nll", "out_err", "ipv", "kl"};

const char *kvq_kv_auto_metric_name(int metric)
{
    return metric >= 0 && metric < KVQ_KV_AUTO_N_METRICS ? metric_names[metric] : NULL;
}

kvq_status kvq_kv_auto_metric_from_name(const char *name, enum kvq_kv_auto_metric *out)
{
    for (int i = 0; name && out && i < KVQ_KV_AUTO_N_METRICS; i++)
        if (strcmp(name, metric_names[i]) == 0) {
            *out = (enum kvq_kv_auto_metric)i;
            return KVQ_OK;
        }
    return KVQ_ERR_INVALID_ARG;
}

int kvq_kv_auto_candidates(enum kvq_type *out, int cap)
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

static void report(kvq_kv_auto_progress_fn fn, void *user, size_t *done, size_t total)
{
    if (fn)
        fn(user, ++*done, total);
}

static void calib_hook(void *user, int layer, size_t pos0, size_t T, const float *q, const float *k, const float *v)
{
    /* user: an eval dump held in memory, every position a query */
    struct kvq_eval_data *d = user;
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
static kvq_status calibrate(const kvq_model *m, const int32_t *ids, size_t n, struct kvq_eval_data *d,
                            kvq_error *err)
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
        kvq_eval_data_free(d);
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
        kvq_eval_data_free(d);
    return st;
}

/* Costs exactly as the sequence accounts them: kvq_seq_plan_of's charge to
 * a sequence of base's window and centring (NULL: kvq_seq_config_default's)
 * with pair j in every layer, split per layer. */
static kvq_status fill_costs(const kvq_model *m, const enum kvq_type *cands, int n_cands,
                             const struct kvq_seq_config *base, size_t *cost_out, kvq_error *err)
{
    int L = kvq_model_config_of(m)->n_layers;
    for (int j = 0; j < n_cands; j++) {
        struct kvq_seq_config sc;
        struct kvq_seq_plan pl;
        kvq_seq_config_default(&sc);
        if (base) {
            sc.recent_f16 = base->recent_f16;
            sc.center_k = base->center_k;
        }
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

/* base: the run's options the costs are for (fill_costs). */
static kvq_status score(const kvq_model *m, const int32_t *ids, size_t n, const enum kvq_type *cands, int n_cands,
                        uint64_t seed, size_t max_queries, enum kvq_kv_auto_metric metric,
                        const struct kvq_seq_config *base, double *err_out, size_t *cost_out,
                        kvq_kv_auto_progress_fn fn, void *user, kvq_error *err)
{
    if (!m || !ids || n < 2 || !cands || n_cands < 1 || !err_out || !cost_out || metric == KVQ_KV_AUTO_NLL ||
        (int)metric < 0 || metric >= KVQ_KV_AUTO_N_METRICS)
        return KVQ_ERR_INVALID_ARG; /* nll: kvq_kv_auto_score_nll */
    kvq_status st = fill_costs(m, cands, n_cands, base, cost_out, err);
    if (st != KVQ_OK)
        return st;
    int L = kvq_model_config_of(m)->n_layers;
    struct kvq_eval_data d;
    st = calibrate(m, ids, n, &d, err);
    if (st != KVQ_OK)
        return st;
    kvq_eval_ctx *ctx = NULL;
    size_t done = 0, total = (size_t)L * (size_t)n_cands;
    st = kvq_eval_ctx_create(&d, max_queries, &ctx, err);
    for (int l = 0; st == KVQ_OK && l < L; l++) {
        st = kvq_eval_ctx_set_layer(ctx, l, err);
        for (int j = 0; st == KVQ_OK && j < n_cands; j++) {
            struct kvq_eval_config cfg;
            struct kvq_eval_sums sums;
            struct kvq_eval_stats stats;
            kvq_eval_config_default(&cfg);
            cfg.type_k = cands[2 * j];
            cfg.type_v = cands[2 * j + 1];
            cfg.seed = seed;
            st = kvq_eval_ctx_run(ctx, &cfg, &sums, err);
            if (st == KVQ_OK) {
                kvq_eval_stats_of(&sums, &stats);
                err_out[(size_t)l * (size_t)n_cands + (size_t)j] =
                    metric == KVQ_KV_AUTO_KL    ? stats.kl
                    : metric == KVQ_KV_AUTO_IPV ? stats.ip_rel_rms + stats.val_mse
                                                : stats.out_err;
                report(fn, user, &done, total);
            }
        }
    }
    kvq_eval_ctx_free(ctx);
    kvq_eval_data_free(&d);
    return st;
}

kvq_status kvq_kv_auto_score(const kvq_model *m, const int32_t *ids, size_t n, const enum kvq_type *cands,
                             int n_cands, uint64_t seed, size_t max_queries, enum kvq_kv_auto_metric metric,
                             double *err_out, size_t *cost_out, kvq_error *err)
{
    return score(m, ids, n, cands, n_cands, seed, max_queries, metric, NULL, err_out, cost_out, NULL, NULL, err);
}

kvq_status kvq_kv_auto_nll(const kvq_model *m, const int32_t *text, size_t n, uint64_t seed, int recent_f16,
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
    struct kvq_ppl_config pc;
    struct kvq_ppl_result r;
    kvq_ppl_config_default(&pc);
    pc.ctx = ctx;
    pc.chunk = KV_AUTO_NLL_CHUNK;
    if (st == KVQ_OK)
        st = kvq_ppl_score(m, s, &pc, text, n, NULL, &r, NULL, NULL);
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

/* base: the run's options (fill_costs), its recent_f16 resolved (0 or 1):
 * the calibration's window too. */
static kvq_status score_nll(const kvq_model *m, const int32_t *text, size_t n, uint64_t seed,
                            const struct kvq_seq_config *base, const enum kvq_type *cands, int n_cands,
                            const unsigned char *measure, double *base_nll, double *err_out, size_t *cost_out,
                            kvq_kv_auto_progress_fn fn, void *user, kvq_error *err)
{
    if (!m || !text || n < 2 || !cands || n_cands < 1 || !err_out || !cost_out)
        return KVQ_ERR_INVALID_ARG;
    int L = kvq_model_config_of(m)->n_layers;
    if (L > KVQ_KV_AUTO_MAX_LAYERS)
        return KVQ_ERR_UNSUPPORTED;
    size_t done = 0, total = 1;
    for (size_t i = 0; i < (size_t)L * (size_t)n_cands; i++)
        total += !measure || measure[i];
    const int recent_f16 = base->recent_f16;
    kvq_status st = fill_costs(m, cands, n_cands, base, cost_out, err);
    double base_v = 0;
    if (st == KVQ_OK)
        st = kvq_kv_auto_nll(m, text, n, seed, recent_f16, NULL, &base_v, err);
    if (st != KVQ_OK)
        return st;
    report(fn, user, &done, total);
    if (base_nll)
        *base_nll = base_v;
    /* every layer f32 except the one under test */
    enum kvq_type lt[2 * KVQ_KV_AUTO_MAX_LAYERS];
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
            if ((st = kvq_kv_auto_nll(m, text, n, seed, recent_f16, lt, &v, err)) != KVQ_OK)
                return st;
            err_out[at] = v - base_v;
            report(fn, user, &done, total);
        }
        lt[2 * l] = lt[2 * l + 1] = KVQ_TYPE_F32;
    }
    return KVQ_OK;
}

kvq_status kvq_kv_auto_score_nll(const kvq_model *m, const int32_t *text, size_t n, uint64_t seed, int recent_f16,
                                 const enum kvq_type *cands, int n_cands, const unsigned char *measure,
                                 double *base_nll, double *err_out, size_t *cost_out, kvq_error *err)
{
    struct kvq_seq_config base;
    kvq_seq_config_default(&base);
    base.recent_f16 = recent_f16;
    return score_nll(m, text, n, seed, &base, cands, n_cands, measure, base_nll, err_out, cost_out, NULL, NULL, err);
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

kvq_status kvq_kv_auto_knapsack(int n_layers, int n_cands, const size_t *cost, const double *err, size_t cap,
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

/* ---- the whole step: kvq_kv_auto ------------------------------------- */

struct kvq_kv_auto {
    const kvq_model *m;
    struct kvq_kv_auto_config cfg;
    int L, nc;
    size_t ctx;            /* the context planned for */
    size_t budget;         /* for pages: the budget less the f16 buffers */
    enum kvq_type cands[2 * KVQ_KV_AUTO_MAX_CANDS];
    double *errs;          /* [L][nc] */
    size_t *cost;          /* [L][nc] */
    int32_t *calib;        /* the measured calibration, BOS first when the model has one */
    size_t n_calib;
    double base, seconds;  /* f32 mean NLL (nll), wall clock of the measurement */
    int measured;
};

void kvq_kv_auto_config_default(struct kvq_kv_auto_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    kvq_seq_config_default(&cfg->seq);
    cfg->metric = KVQ_KV_AUTO_NLL;
}

void kvq_kv_auto_free(kvq_kv_auto *a)
{
    if (!a)
        return;
    free(a->errs);
    free(a->cost);
    free(a->calib);
    free(a);
}

kvq_status kvq_kv_auto_create(const kvq_model *m, const struct kvq_kv_auto_config *cfg, kvq_kv_auto **out,
                              kvq_error *err)
{
    if (!m || !cfg || !out || !cfg->seq.kv_budget || (int)cfg->metric < 0 || cfg->metric >= KVQ_KV_AUTO_N_METRICS)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kv-auto: needs a model, a budget and a metric");
    *out = NULL;
    const struct kvq_model_config *c = kvq_model_config_of(m);
    if (c->n_layers > KVQ_KV_AUTO_MAX_LAYERS)
        return kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "supports at most %d layers", KVQ_KV_AUTO_MAX_LAYERS);
    kvq_kv_auto *a = calloc(1, sizeof *a);
    if (!a)
        return KVQ_ERR_NOMEM;
    a->m = m;
    a->cfg = *cfg;
    a->cfg.seq.layer_types = NULL;
    a->L = c->n_layers;
    a->ctx = cfg->ctx ? cfg->ctx : (size_t)c->max_ctx;
    /* Keep only the pairs this model's head_dim supports. */
    int all = kvq_kv_auto_candidates(a->cands, KVQ_KV_AUTO_MAX_CANDS);
    for (int j = 0; j < all; j++) {
        struct kvq_seq_config sc;
        struct kvq_seq_plan pl;
        kvq_seq_config_default(&sc);
        sc.type_k = a->cands[2 * j];
        sc.type_v = a->cands[2 * j + 1];
        if (kvq_seq_plan_of(m, &sc, &pl) != KVQ_OK)
            continue;
        a->cands[2 * a->nc] = sc.type_k;
        a->cands[2 * a->nc + 1] = sc.type_v;
        a->nc++;
    }
    if (!a->nc) {
        kvq_kv_auto_free(a);
        return kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "no candidate cache type supports head_dim %d", c->head_dim);
    }
    /* The run's recent-token window as the sequence will resolve it (every
     * candidate is compressed: on unless turned off): the nll calibration
     * uses the same setting (the attention metrics score the packed rows
     * alone), and the window's (and sinks') fixed f16 buffers come off the
     * budget first. */
    int window = cfg->seq.recent_f16;
    if (window == KVQ_WINDOW_AUTO) {
        window = 0;
        for (int j = 0; j < a->nc && !window; j++) {
            struct kvq_seq_config sc = a->cfg.seq;
            sc.type_k = a->cands[2 * j];
            sc.type_v = a->cands[2 * j + 1];
            window = kvq_seq_window_for(&sc, a->L);
        }
    }
    a->cfg.seq.recent_f16 = window; /* resolved: every plan, cost and calibration below is the run's */
    size_t fixed = 0;
    {
        struct kvq_seq_config sc = a->cfg.seq;
        struct kvq_seq_plan pl;
        sc.type_k = a->cands[0];
        sc.type_v = a->cands[1];
        sc.max_ctx = 0;
        if (kvq_seq_plan_of(m, &sc, &pl) == KVQ_OK)
            fixed = pl.fixed_bytes;
    }
    a->budget = cfg->seq.kv_budget > fixed ? cfg->seq.kv_budget - fixed : 0;
    /* Refuse a budget no candidate fits before paying for the calibration. */
    size_t least = SIZE_MAX;
    for (int j = 0; j < a->nc; j++) {
        size_t one[KVQ_KV_AUTO_MAX_LAYERS];
        if (fill_costs(m, a->cands + 2 * j, 1, &a->cfg.seq, one, NULL) == KVQ_OK && (size_t)a->L * one[0] < least)
            least = (size_t)a->L * one[0];
    }
    if (least > a->budget / a->ctx) {
        kvq_kv_auto_free(a);
        return kvq_error_set(err, KVQ_ERR_BUDGET, "a budget of %zu bytes cannot hold %zu tokens with any candidate types",
                             cfg->seq.kv_budget, cfg->ctx ? cfg->ctx : (size_t)c->max_ctx);
    }
    a->errs = malloc((size_t)a->L * (size_t)a->nc * sizeof *a->errs);
    a->cost = malloc((size_t)a->L * (size_t)a->nc * sizeof *a->cost);
    if (!a->errs || !a->cost) {
        kvq_kv_auto_free(a);
        return KVQ_ERR_NOMEM;
    }
    *out = a;
    return KVQ_OK;
}

kvq_status kvq_kv_auto_calib_ids(const kvq_kv_auto *a, const int32_t *text, size_t n_text, int32_t **ids, size_t *n)
{
    if (!a || (!text && n_text) || !ids || !n)
        return KVQ_ERR_INVALID_ARG;
    const size_t want = a->cfg.metric == KVQ_KV_AUTO_NLL ? KVQ_KV_AUTO_NLL_TOKENS : KVQ_KV_AUTO_CALIB_TOKENS;
    const int bos = kvq_model_config_of(a->m)->bos_id;
    size_t keep = n_text < want - 1 ? n_text : want - 1;
    *n = 0;
    *ids = malloc((keep + 1) * sizeof **ids);
    if (!*ids)
        return KVQ_ERR_NOMEM;
    if (bos >= 0)
        (*ids)[(*n)++] = bos;
    if (keep)
        memcpy(*ids + *n, text + (n_text - keep), keep * sizeof *text);
    *n += keep;
    if (*n < KVQ_KV_AUTO_MIN_CALIB) {
        free(*ids);
        *ids = NULL;
        return KVQ_ERR_RANGE;
    }
    return KVQ_OK;
}

kvq_status kvq_kv_auto_measure(kvq_kv_auto *a, const int32_t *ids, size_t n, kvq_kv_auto_progress_fn fn, void *user,
                               kvq_error *err)
{
    if (!a || !ids || n < 2)
        return KVQ_ERR_INVALID_ARG;
    const size_t lead = kvq_model_config_of(a->m)->bos_id >= 0 ? 1 : 0;
    if (n < lead + 2)
        return KVQ_ERR_INVALID_ARG;
    a->measured = 0;
    free(a->calib);
    a->calib = malloc(n * sizeof *ids);
    if (!a->calib)
        return KVQ_ERR_NOMEM;
    memcpy(a->calib, ids, n * sizeof *ids);
    a->n_calib = n;
    a->base = 0;
    const struct kvq_kv_auto_config *cfg = &a->cfg;
    double t0 = eval_now();
    kvq_status st;
    /* ids has the BOS first; the nll metric takes the text alone and adds its own */
    if (cfg->metric == KVQ_KV_AUTO_NLL)
        st = score_nll(a->m, ids + lead, n - lead, cfg->seq.seed, &cfg->seq, a->cands, a->nc, NULL, &a->base, a->errs,
                       a->cost, fn, user, err);
    else
        st = score(a->m, ids, n, a->cands, a->nc, cfg->seq.seed, KV_AUTO_QUERIES, cfg->metric, &cfg->seq, a->errs,
                   a->cost, fn, user, err);
    a->seconds = eval_now() - t0;
    a->measured = st == KVQ_OK;
    return st;
}

kvq_status kvq_kv_auto_choose(kvq_kv_auto *a, struct kvq_kv_auto_choice *out, kvq_error *err)
{
    if (!a || !out || !a->measured)
        return KVQ_ERR_INVALID_ARG;
    const int L = a->L, nc = a->nc;
    const size_t ctx = a->ctx;
    memset(out, 0, sizeof *out);
    out->n_layers = L;
    out->ctx = ctx;
    out->budget = a->cfg.seq.kv_budget;
    out->metric = a->cfg.metric;
    out->n_cands = nc;
    out->calib_tokens = a->n_calib;
    out->score_seconds = a->seconds;
    out->base_nll = a->base;
    out->joint_err = NAN;
    int choice[KVQ_KV_AUTO_MAX_LAYERS];
    size_t cap = a->budget / ctx;
    for (;;) {
        kvq_status st = kvq_kv_auto_knapsack(L, nc, a->cost, a->errs, cap, choice, &out->total_err, &out->total_bytes);
        if (st != KVQ_OK)
            return st;
        for (int l = 0; l < L; l++) {
            out->layer_types[2 * l] = a->cands[2 * choice[l]];
            out->layer_types[2 * l + 1] = a->cands[2 * choice[l] + 1];
        }
        /* Whole pages per layer may hold a few tokens less than bytes/ctx
         * promises: ask the planner and tighten until the context fits. */
        struct kvq_seq_config sc = a->cfg.seq;
        struct kvq_seq_plan pl;
        sc.layer_types = out->layer_types;
        sc.max_ctx = ctx;
        if (kvq_seq_plan_of(a->m, &sc, &pl) != KVQ_OK)
            return kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "the chosen types cannot be planned for this model");
        if (pl.budget_tokens >= ctx)
            break;
        if (out->total_bytes == 0)
            return kvq_error_set(err, KVQ_ERR_BUDGET, "no choice fits %zu tokens", ctx);
        cap = out->total_bytes - 1;
    }
    for (int l = 0; l < L; l++) {
        out->layer_err[l] = a->errs[(size_t)l * (size_t)nc + (size_t)choice[l]];
        out->layer_bytes[l] = a->cost[(size_t)l * (size_t)nc + (size_t)choice[l]];
    }
    /* The knapsack assumes the layers' NLL increases add up: measure the
     * whole choice on the calibration once. */
    if (a->cfg.metric == KVQ_KV_AUTO_NLL) {
        const size_t lead = kvq_model_config_of(a->m)->bos_id >= 0 ? 1 : 0;
        double v = 0;
        if (kvq_kv_auto_nll(a->m, a->calib + lead, a->n_calib - lead, a->cfg.seq.seed, a->cfg.seq.recent_f16,
                            out->layer_types, &v, NULL) == KVQ_OK)
            out->joint_err = v - a->base;
    }
    return KVQ_OK;
}
