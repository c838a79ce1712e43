/* eval_metrics.c - exact reference attention and the per-configuration errors (kvq_eval.h). */
#include "kvq_eval.h"

#include <cblas.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq_attn.h"
#include "kvq_cache.h"
#include "kvq_codec.h"

#define TOPK 8
#define EVAL_MAX_REF_BYTES (4.0 * 1073741824.0)

struct kvq_eval_ctx {
    const struct kvq_eval_data *d;
    size_t n_sel;    /* query positions used */
    size_t *sel;     /* their indices in [0, Tq) */
    int layer;       /* layer of the exact reference, -1 before the first */
    int group;       /* query heads per kv head */
    double scale;    /* 1 / sqrt(d) */
    /* current layer's inputs */
    float *kt, *vt;  /* [T][KVH][d]: the order kvq_cache_append takes */
    float *qsel;     /* [H][n_sel][d] */
    /* exact reference of the current layer */
    double *ex_s;    /* [H][n_sel][T] q.k, zero beyond pos */
    double *ex_p;    /* [H][n_sel][T] probabilities, zero beyond pos */
    double *ex_lse;  /* [H][n_sel] log sum exp(scale * s) */
    double *ex_out;  /* [H][n_sel][d] */
    int *ex_top;     /* [H][n_sel][TOPK] indices, most probable first */
    int *ex_ntop;    /* [H][n_sel] min(TOPK, pos + 1) */
    /* scratch */
    double *kd64, *vd64, *q64; /* [T][d], [T][d], [n_sel][d] */
    float *kdec, *vdec;        /* [T][d] decoded rows of one kv head */
    float *sa;                 /* [n_sel][T] approximate scores */
    double *xa, *ea;           /* [T] scaled approximate scores, their exp */
    float *qb, *ob;            /* [group][d] */
    kvq_attn_workspace *ws;
    double p2_sum, top_sum, gain_sum, n_att; /* kvq_eval_ctx_attention_stats */
    double *vn2;                             /* [T] ||v_t||^2 of one kv head */
};

kvq_status kvq_eval_cost_of(const struct kvq_eval_config *cfg, int d, struct kvq_eval_cost *out)
{
    memset(out, 0, sizeof *out);
    out->row_k = kvq_type_row_bytes(cfg->type_k, d);
    out->row_v = kvq_type_row_bytes(cfg->type_v, d);
    if (out->row_k == 0 || out->row_v == 0 || d < 1)
        return KVQ_ERR_UNSUPPORTED;
    out->bits_k = 8.0 * (double)out->row_k / d;
    out->bits_v = 8.0 * (double)out->row_v / d;
    out->bits = 4.0 * (double)(out->row_k + out->row_v) / d;
    out->ratio_f16 = 4.0 * d / (double)(out->row_k + out->row_v);
    return KVQ_OK;
}

void kvq_eval_sums_add(struct kvq_eval_sums *a, const struct kvq_eval_sums *s)
{
    a->k_err2 += s->k_err2;
    a->k_norm2 += s->k_norm2;
    a->v_err2 += s->v_err2;
    a->v_norm2 += s->v_norm2;
    a->ip_err += s->ip_err;
    a->ip_err2 += s->ip_err2;
    a->ip_ref2 += s->ip_ref2;
    a->ip_n += s->ip_n;
    a->tv += s->tv;
    a->kl += s->kl;
    a->top1 += s->top1;
    a->top8 += s->top8;
    a->out_rel += s->out_rel;
    if (s->out_rel_max > a->out_rel_max)
        a->out_rel_max = s->out_rel_max;
    a->n_q += s->n_q;
}

static double ratio(double num, double den)
{
    return den > 0 ? num / den : 0.0;
}

void kvq_eval_stats_of(const struct kvq_eval_sums *s, struct kvq_eval_stats *o)
{
    o->key_mse = ratio(s->k_err2, s->k_norm2);
    o->val_mse = ratio(s->v_err2, s->v_norm2);
    o->ip_rel_rms = sqrt(ratio(s->ip_err2, s->ip_ref2));
    o->ip_bias = s->ip_n > 0 && s->ip_ref2 > 0 ? (s->ip_err / s->ip_n) / sqrt(s->ip_ref2 / s->ip_n) : 0.0;
    o->tv = ratio(s->tv, s->n_q);
    o->kl = ratio(s->kl, s->n_q);
    o->top1 = ratio(s->top1, s->n_q);
    o->top8 = ratio(s->top8, s->n_q);
    o->out_err = ratio(s->out_rel, s->n_q);
    o->out_err_max = s->out_rel_max;
}

void kvq_eval_ctx_free(kvq_eval_ctx *c)
{
    if (!c)
        return;
    free(c->sel);
    free(c->kt);
    free(c->vt);
    free(c->qsel);
    free(c->ex_s);
    free(c->ex_p);
    free(c->ex_lse);
    free(c->ex_out);
    free(c->ex_top);
    free(c->ex_ntop);
    free(c->kd64);
    free(c->vd64);
    free(c->q64);
    free(c->kdec);
    free(c->vdec);
    free(c->sa);
    free(c->xa);
    free(c->ea);
    free(c->vn2);
    free(c->qb);
    free(c->ob);
    kvq_attn_workspace_free(c->ws);
    free(c);
}

void kvq_eval_ctx_attention_stats(const kvq_eval_ctx *c, double *eff_keys, double *top_p, double *v_gain)
{
    *eff_keys = c->p2_sum > 0 ? c->n_att / c->p2_sum : 0.0;
    *top_p = ratio(c->top_sum, c->n_att);
    *v_gain = ratio(c->gain_sum, c->n_att);
}

size_t kvq_eval_ctx_queries_used(const kvq_eval_ctx *c)
{
    return c->n_sel;
}

kvq_status kvq_eval_ctx_create(const struct kvq_eval_data *d, size_t max_queries, kvq_eval_ctx **out, kvq_error *err)
{
    kvq_eval_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    const size_t T = d->n_tokens, D = (size_t)d->head_dim, H = (size_t)d->n_heads;
    c->d = d;
    c->layer = -1;
    c->group = d->n_heads / d->n_kv_heads;
    c->scale = 1.0 / sqrt((double)d->head_dim);
    c->n_sel = max_queries == 0 || max_queries > d->n_queries ? d->n_queries : max_queries;
    const size_t S = c->n_sel;
    /* The exact scores and probabilities of a whole layer stay in memory
     * (16 bytes per head, query and key). Refuse clearly rather than let
     * the system kill the process on a very long dump. */
    const double ref_bytes = 16.0 * (double)H * (double)S * (double)T;
    if (ref_bytes > EVAL_MAX_REF_BYTES) {
        size_t fit = (size_t)(EVAL_MAX_REF_BYTES / (16.0 * (double)H * (double)T));
        free(c);
        return kvq_error_set(err, KVQ_ERR_NOMEM,
                             "%s: the exact reference for %zu queries x %zu keys x %zu heads needs %.1f GiB; "
                             "use --max-queries %zu or fewer",
                             d->name, S, T, H, ref_bytes / 1073741824.0, fit ? fit : 1);
    }
    c->sel = malloc(S * sizeof *c->sel);
    c->kt = malloc(T * (size_t)d->n_kv_heads * D * sizeof(float));
    c->vt = malloc(T * (size_t)d->n_kv_heads * D * sizeof(float));
    c->qsel = malloc(H * S * D * sizeof(float));
    c->ex_s = malloc(H * S * T * sizeof(double));
    c->ex_p = malloc(H * S * T * sizeof(double));
    c->ex_lse = malloc(H * S * sizeof(double));
    c->ex_out = malloc(H * S * D * sizeof(double));
    c->ex_top = malloc(H * S * TOPK * sizeof(int));
    c->ex_ntop = malloc(H * S * sizeof(int));
    c->kd64 = malloc(T * D * sizeof(double));
    c->vd64 = malloc(T * D * sizeof(double));
    c->q64 = malloc(S * D * sizeof(double));
    c->kdec = malloc(T * D * sizeof(float));
    c->vdec = malloc(T * D * sizeof(float));
    c->sa = malloc(S * T * sizeof(float));
    c->xa = malloc(T * sizeof(double));
    c->ea = malloc(T * sizeof(double));
    c->vn2 = malloc(T * sizeof(double));
    c->qb = malloc((size_t)c->group * D * sizeof(float));
    c->ob = malloc((size_t)c->group * D * sizeof(float));
    if (!c->sel || !c->kt || !c->vt || !c->qsel || !c->ex_s || !c->ex_p || !c->ex_lse || !c->ex_out || !c->ex_top ||
        !c->ex_ntop || !c->kd64 || !c->vd64 || !c->q64 || !c->kdec || !c->vdec || !c->sa || !c->xa || !c->ea || !c->vn2 || !c->qb ||
        !c->ob) {
        kvq_eval_ctx_free(c);
        return kvq_error_set(err, KVQ_ERR_NOMEM, "%s: out of memory for the evaluation buffers", d->name);
    }
    /* Evenly spaced, the last query always included: it has the longest
     * context, the case long-context users care about. */
    for (size_t s = 0; s < S; s++)
        c->sel[s] = (s + 1) * d->n_queries / S - 1;
    kvq_status st = kvq_attn_workspace_create(d->head_dim, c->group, T, &c->ws);
    if (st) {
        kvq_eval_ctx_free(c);
        return kvq_error_set(err, st, "%s: cannot create the attention workspace (d %d, %d heads per kv head): %s",
                             d->name, d->head_dim, c->group, kvq_status_str(st));
    }
    *out = c;
    return KVQ_OK;
}

/* Indices of the k largest x[0..n), largest first; ties go to the lower
 * index so the result is deterministic. @return the count, min(k, n). */
static int top_k(const double *x, size_t n, int k, int *idx)
{
    int m = 0;
    for (size_t j = 0; j < n; j++) {
        if (m == k && x[j] <= x[idx[m - 1]])
            continue;
        int i = m < k ? m++ : k - 1;
        while (i > 0 && x[j] > x[idx[i - 1]]) {
            idx[i] = idx[i - 1];
            i--;
        }
        idx[i] = (int)j;
    }
    return m;
}

static size_t pos_of(const kvq_eval_ctx *c, size_t s)
{
    return kvq_eval_query_pos(c->d, c->sel[s]);
}

kvq_status kvq_eval_ctx_set_layer(kvq_eval_ctx *c, int l, kvq_error *err)
{
    const struct kvq_eval_data *d = c->d;
    const size_t T = d->n_tokens, D = (size_t)d->head_dim, S = c->n_sel, KVH = (size_t)d->n_kv_heads;
    if (l < 0 || l >= d->n_layers)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "layer %d out of range", l);
    const float *k = d->k + (size_t)l * KVH * T * D, *v = d->v + (size_t)l * KVH * T * D;
    /* The dump is head-major; the cache takes token-major rows. */
    for (size_t g = 0; g < KVH; g++)
        for (size_t t = 0; t < T; t++) {
            memcpy(c->kt + (t * KVH + g) * D, k + (g * T + t) * D, D * sizeof(float));
            memcpy(c->vt + (t * KVH + g) * D, v + (g * T + t) * D, D * sizeof(float));
        }
    for (int h = 0; h < d->n_heads; h++) {
        const float *q = d->q + ((size_t)l * (size_t)d->n_heads + (size_t)h) * d->n_queries * D;
        for (size_t s = 0; s < S; s++)
            memcpy(c->qsel + ((size_t)h * S + s) * D, q + c->sel[s] * D, D * sizeof(float));
    }
    for (size_t g = 0; g < KVH; g++) {
        for (size_t i = 0; i < T * D; i++) {
            c->kd64[i] = k[g * T * D + i];
            c->vd64[i] = v[g * T * D + i];
        }
        for (size_t t = 0; t < T; t++) {
            double a = 0.0;
            for (size_t j = 0; j < D; j++)
                a += c->vd64[t * D + j] * c->vd64[t * D + j];
            c->vn2[t] = a;
        }
        for (int h = (int)g * c->group; h < ((int)g + 1) * c->group; h++) {
            for (size_t i = 0; i < S * D; i++)
                c->q64[i] = c->qsel[(size_t)h * S * D + i];
            double *sc = c->ex_s + (size_t)h * S * T, *p = c->ex_p + (size_t)h * S * T;
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)S, (int)T, (int)D, 1.0, c->q64, (int)D,
                        c->kd64, (int)D, 0.0, sc, (int)T);
            for (size_t s = 0; s < S; s++) {
                size_t n = pos_of(c, s) + 1;
                double *sr = sc + s * T, *pr = p + s * T, mx = -DBL_MAX, z = 0.0;
                for (size_t j = 0; j < n; j++)
                    mx = c->scale * sr[j] > mx ? c->scale * sr[j] : mx;
                for (size_t j = 0; j < n; j++) {
                    pr[j] = exp(c->scale * sr[j] - mx);
                    z += pr[j];
                }
                for (size_t j = 0; j < n; j++)
                    pr[j] /= z;
                for (size_t j = n; j < T; j++)
                    sr[j] = pr[j] = 0.0;
                c->ex_lse[(size_t)h * S + s] = mx + log(z);
                c->ex_ntop[(size_t)h * S + s] = top_k(sr, n, TOPK, c->ex_top + ((size_t)h * S + s) * TOPK);
            }
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)S, (int)D, (int)T, 1.0, p, (int)T, c->vd64,
                        (int)D, 0.0, c->ex_out + (size_t)h * S * D, (int)D);
            for (size_t s = 0; s < S; s++) {
                const double *pr = p + s * T, *o = c->ex_out + ((size_t)h * S + s) * D;
                double p2 = 0.0, pv2 = 0.0, pm = 0.0, o2 = 0.0;
                for (size_t j = 0; j < T; j++) {
                    p2 += pr[j] * pr[j];
                    pv2 += pr[j] * pr[j] * c->vn2[j];
                    pm = pr[j] > pm ? pr[j] : pm;
                }
                for (size_t j = 0; j < D; j++)
                    o2 += o[j] * o[j];
                c->p2_sum += p2;
                c->top_sum += pm;
                c->gain_sum += o2 > 0.0 ? sqrt(pv2 / o2) : 0.0;
                c->n_att += 1.0;
            }
        }
    }
    c->layer = l;
    return KVQ_OK;
}

static void row_errors(const float *x, const float *xq, size_t n, double *err2, double *norm2)
{
    double e = 0.0, r = 0.0;
    for (size_t i = 0; i < n; i++) {
        double a = x[i], dd = (double)xq[i] - a;
        e += dd * dd;
        r += a * a;
    }
    *err2 += e;
    *norm2 += r;
}

/* Scores and probabilities of query head h against the decoded keys. */
static void score_metrics(kvq_eval_ctx *c, int h, struct kvq_eval_sums *o)
{
    const size_t T = c->d->n_tokens, D = (size_t)c->d->head_dim, S = c->n_sel;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)S, (int)T, (int)D, 1.0f, c->qsel + (size_t)h * S * D,
                (int)D, c->kdec, (int)D, 0.0f, c->sa, (int)T);
    for (size_t s = 0; s < S; s++) {
        const size_t n = pos_of(c, s) + 1, row = (size_t)h * S + s;
        const float *sa = c->sa + s * T;
        const double *se = c->ex_s + row * T, *pe = c->ex_p + row * T, lse = c->ex_lse[row];
        double *x = c->xa, mx = -DBL_MAX, ie = 0.0, ie2 = 0.0, ir2 = 0.0;
        for (size_t j = 0; j < n; j++) {
            double e = (double)sa[j] - se[j];
            ie += e;
            ie2 += e * e;
            ir2 += se[j] * se[j];
            x[j] = c->scale * (double)sa[j];
            mx = x[j] > mx ? x[j] : mx;
        }
        o->ip_err += ie;
        o->ip_err2 += ie2;
        o->ip_ref2 += ir2;
        o->ip_n += (double)n;
        int top[TOPK];
        int nt = top_k(x, n, TOPK, top);
        const int *et = c->ex_top + row * TOPK;
        int hit = 0;
        for (int a = 0; a < nt; a++)
            for (int b = 0; b < c->ex_ntop[row]; b++)
                hit += top[a] == et[b];
        o->top1 += top[0] == et[0];
        o->top8 += (double)hit / nt;
        double z = 0.0, *ea = c->ea;
        for (size_t j = 0; j < n; j++) {
            ea[j] = exp(x[j] - mx);
            z += ea[j];
        }
        const double lz = mx + log(z), iz = 1.0 / z;
        double tv = 0.0, kl = 0.0;
        for (size_t j = 0; j < n; j++) {
            double lq = x[j] - lz;
            tv += fabs(pe[j] - ea[j] * iz);
            if (pe[j] > 0.0)
                kl += pe[j] * ((c->scale * se[j] - lse) - lq);
        }
        o->tv += 0.5 * tv;
        o->kl += kl;
    }
}

kvq_status kvq_eval_ctx_run(kvq_eval_ctx *c, const struct kvq_eval_config *cfg, struct kvq_eval_sums *o, kvq_error *err)
{
    const struct kvq_eval_data *d = c->d;
    const size_t T = d->n_tokens, D = (size_t)d->head_dim, S = c->n_sel;
    memset(o, 0, sizeof *o);
    if (c->layer < 0)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "no layer selected");
    struct kvq_cache_config cc;
    kvq_cache_config_default(&cc, d->n_kv_heads, d->head_dim, T);
    cc.type_k = cfg->type_k;
    cc.type_v = cfg->type_v;
    cc.seed = cfg->seed;
    cc.rot = cfg->rot;
    cc.qjl = cfg->qjl;
    kvq_cache *cache = NULL;
    kvq_status st = kvq_cache_create(&cc, &cache);
    if (st)
        return kvq_error_set(err, st, "%s: cannot create a %s cache for head dim %d: %s", d->name, cfg->label,
                             d->head_dim, kvq_status_str(st));
    st = kvq_cache_append(cache, T, c->kt, c->vt);
    if (st) {
        kvq_error_set(err, st, "%s: %s cache refused layer %d: %s%s", d->name, cfg->label, c->layer,
                      kvq_status_str(st), st == KVQ_ERR_RANGE ? " (a row norm exceeds the f16 range)" : "");
        goto done;
    }
    for (int g = 0; g < d->n_kv_heads; g++) {
        st = kvq_cache_read(cache, g, 0, T, c->kdec, c->vdec);
        if (st) {
            kvq_error_set(err, st, "%s: reading back the %s cache failed: %s", d->name, cfg->label,
                          kvq_status_str(st));
            goto done;
        }
        const size_t off = ((size_t)c->layer * (size_t)d->n_kv_heads + (size_t)g) * T * D;
        row_errors(d->k + off, c->kdec, T * D, &o->k_err2, &o->k_norm2);
        row_errors(d->v + off, c->vdec, T * D, &o->v_err2, &o->v_norm2);
        for (int h = g * c->group; h < (g + 1) * c->group; h++)
            score_metrics(c, h, o);
        /* The output error comes from the fused kernel users actually run. */
        for (size_t s = 0; s < S; s++) {
            for (int a = 0; a < c->group; a++)
                memcpy(c->qb + (size_t)a * D, c->qsel + ((size_t)(g * c->group + a) * S + s) * D, D * sizeof(float));
            st = kvq_attn_decode(cache, g, pos_of(c, s) + 1, c->qb, c->group, (float)c->scale, c->ob, c->ws);
            if (st) {
                kvq_error_set(err, st, "%s: fused attention over the %s cache failed: %s", d->name, cfg->label,
                              kvq_status_str(st));
                goto done;
            }
            for (int a = 0; a < c->group; a++) {
                const double *oe = c->ex_out + ((size_t)(g * c->group + a) * S + s) * D;
                const float *oa = c->ob + (size_t)a * D;
                double e2 = 0.0, r2 = 0.0;
                for (size_t j = 0; j < D; j++) {
                    double dd = (double)oa[j] - oe[j];
                    e2 += dd * dd;
                    r2 += oe[j] * oe[j];
                }
                double rel = r2 > 0.0 ? sqrt(e2 / r2) : sqrt(e2);
                o->out_rel += rel;
                if (rel > o->out_rel_max)
                    o->out_rel_max = rel;
            }
        }
    }
    o->n_q = (double)((size_t)d->n_heads * S);
done:
    kvq_cache_free(cache);
    return st;
}
