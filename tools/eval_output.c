/* eval_output.c - the table, CSV and JSON forms of `kvq eval` results. */
#include "eval_output.h"

#include <cjson/cJSON.h>
#include <string.h>

#include "kvq_file.h"
#include "kvq_rotation.h"

static int is_floor(const struct kvq_eval_config *c)
{
    return c->type_k == KVQ_TYPE_F32 && c->type_v == KVQ_TYPE_F32;
}

/* Error of configuration i for the front: out_err (which 0) or KL (1). */
static double front_err(const struct eval_result *r, int which)
{
    struct kvq_eval_stats m;
    kvq_eval_stats_of(&r->total, &m);
    return which ? m.kl : m.out_err;
}

int eval_is_lossless(const struct eval_run *run, const struct eval_result *r, int which)
{
    double floor_v = -1.0;
    for (size_t i = 0; i < run->n_res; i++)
        if (is_floor(&run->res[i].cfg))
            floor_v = front_err(&run->res[i], which);
    /* Within an order of magnitude of float rounding: nothing was lost
     * (f16 on an f16 dump, or KL of a V-only row whose keys are exact). */
    return !is_floor(&r->cfg) && floor_v >= 0.0 && front_err(r, which) <= 10.0 * floor_v;
}

static int on_front_candidate(const struct eval_run *run, const struct eval_result *r, int which)
{
    return !is_floor(&r->cfg) && !eval_is_lossless(run, r, which);
}

static void mark(struct eval_run *run, int which)
{
    for (size_t i = 0; i < run->n_res; i++) {
        struct eval_result *a = &run->res[i];
        int on = on_front_candidate(run, a, which);
        double ea = front_err(a, which);
        for (size_t j = 0; on && j < run->n_res; j++) {
            const struct eval_result *b = &run->res[j];
            if (j == i || !on_front_candidate(run, b, which))
                continue;
            double eb = front_err(b, which);
            if (b->cost.bits <= a->cost.bits && eb <= ea && (b->cost.bits < a->cost.bits || eb < ea))
                on = 0;
        }
        if (which)
            a->front_kl = on;
        else
            a->front_out = on;
    }
}

void eval_mark_pareto(struct eval_run *run)
{
    mark(run, 0);
    mark(run, 1);
}

static void table_line(FILE *f, const char *label, const struct kvq_eval_cost *c, const struct kvq_eval_sums *s,
                       const char *front)
{
    struct kvq_eval_stats m;
    kvq_eval_stats_of(s, &m);
    fprintf(f, "%-22s %6.3f %6.3f %6.3f %5.2f  %9.3e %9.3e %9.3e %+10.2e %9.3e %9.3e %6.4f %6.4f %9.3e %9.3e %s\n",
            label, c->bits_k, c->bits_v, c->bits, c->ratio_f16, m.key_mse, m.val_mse, m.ip_rel_rms, m.ip_bias, m.tv,
            m.kl, m.top1, m.top8, m.out_err, m.out_err_max, front);
}

void eval_print_table(FILE *f, const struct eval_run *run, int per_layer)
{
    const struct kvq_eval_data *d = run->data;
    fprintf(f, "\n%s: %d of %d layers, %d query heads / %d kv heads, head dim %d, %zu tokens, %zu of %zu query positions\n",
            d->name, run->n_layers, d->n_layers, d->n_heads, d->n_kv_heads, d->head_dim, d->n_tokens, run->queries_used,
            d->n_queries);
    fprintf(f, "exact attention: %.1f effective keys per query (1/mean sum p^2), mean top probability %.3f, "
               "value-noise gain %.3f\n",
            run->eff_keys, run->top_p, run->v_gain);
    fprintf(f, "%-22s %6s %6s %6s %5s  %9s %9s %9s %10s %9s %9s %6s %6s %9s %9s %s\n", "K/V", "K bit", "V bit",
            "bits", "xf16", "K mse", "V mse", "qk rms", "qk bias", "TV", "KL", "top1", "top8", "out err", "out max",
            "front");
    for (size_t i = 0; i < run->n_res; i++) {
        const struct eval_result *r = &run->res[i];
        char front[8];
        snprintf(front, sizeof front, "%s%s", r->front_out ? "o" : eval_is_lossless(run, r, 0) ? "=" : "",
                 r->front_kl ? "k" : eval_is_lossless(run, r, 1) ? "=" : "");
        if (is_floor(&r->cfg))
            snprintf(front, sizeof front, "floor");
        table_line(f, r->cfg.label, &r->cost, &r->total, front);
        if (per_layer)
            for (int l = 0; l < run->n_layers; l++) {
                char lab[32];
                snprintf(lab, sizeof lab, "  layer %d", run->layers[l]);
                table_line(f, lab, &r->cost, &r->layers[l], "");
            }
    }
    fprintf(f, "bits: per value incl. norms/scales (K and V mean); qk: q.k error relative to RMS(q.k); "
               "out: fused-attention output ||o-o^||/||o||;\nfront: on the Pareto front of out err (o) / KL (k) "
               "against bits; '=' lossless (within 10x of the f32 floor), left out of the fronts\n");
}

static const char *type_name(enum kvq_type t)
{
    const struct kvq_type_traits *tr = kvq_type_traits(t);
    return tr ? tr->name : "?";
}

static const char *qjl_name(enum kvq_qjl_kind q)
{
    return q == KVQ_QJL_GAUSS ? "gauss" : "ortho";
}

static void csv_line(FILE *f, const struct eval_run *run, const struct eval_result *r, int layer,
                     const struct kvq_eval_sums *s)
{
    struct kvq_eval_stats m;
    kvq_eval_stats_of(s, &m);
    char lay[16];
    if (layer < 0)
        snprintf(lay, sizeof lay, "all");
    else
        snprintf(lay, sizeof lay, "%d", layer);
    fprintf(f, "%s,%s,%s,%s,%s,%s,%llu,%s,%zu,%zu,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,"
               "%.9g,%d,%d\n",
            run->data->name, r->cfg.label, type_name(r->cfg.type_k), type_name(r->cfg.type_v),
            kvq_rot_kind_name(r->cfg.rot), qjl_name(r->cfg.qjl), (unsigned long long)r->cfg.seed, lay, r->cost.row_k,
            r->cost.row_v, r->cost.bits_k, r->cost.bits_v, r->cost.bits, r->cost.ratio_f16, m.key_mse, m.val_mse,
            m.ip_rel_rms, m.ip_bias, m.tv, m.kl, m.top1, m.top8, m.out_err, m.out_err_max, r->front_out, r->front_kl);
}

int eval_write_csv(const char *path, const struct eval_run *runs, size_t n_runs, kvq_error *err)
{
    kvq_out_file *of;
    if (kvq_out_file_create(path, &of, err) != KVQ_OK)
        return -1;
    FILE *f = kvq_out_file_stream(of);
    fprintf(f, "input,config,k_type,v_type,rot,qjl,seed,layer,row_bytes_k,row_bytes_v,bits_k,bits_v,bits,ratio_f16,"
               "key_mse,val_mse,ip_rel_rms,ip_bias,tv,kl,top1,top8,out_err,out_err_max,pareto_out,pareto_kl\n");
    for (size_t i = 0; i < n_runs; i++)
        for (size_t c = 0; c < runs[i].n_res; c++) {
            const struct eval_result *r = &runs[i].res[c];
            csv_line(f, &runs[i], r, -1, &r->total);
            for (int l = 0; l < runs[i].n_layers; l++)
                csv_line(f, &runs[i], r, runs[i].layers[l], &r->layers[l]);
        }
    return kvq_out_file_commit(of, err) == KVQ_OK ? 0 : -1; /* reports any failed write above */
}

static cJSON *stats_json(const struct kvq_eval_sums *s)
{
    struct kvq_eval_stats m;
    kvq_eval_stats_of(s, &m);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "key_mse", m.key_mse);
    cJSON_AddNumberToObject(o, "val_mse", m.val_mse);
    cJSON_AddNumberToObject(o, "ip_rel_rms", m.ip_rel_rms);
    cJSON_AddNumberToObject(o, "ip_bias", m.ip_bias);
    cJSON_AddNumberToObject(o, "tv", m.tv);
    cJSON_AddNumberToObject(o, "kl", m.kl);
    cJSON_AddNumberToObject(o, "top1", m.top1);
    cJSON_AddNumberToObject(o, "top8", m.top8);
    cJSON_AddNumberToObject(o, "out_err", m.out_err);
    cJSON_AddNumberToObject(o, "out_err_max", m.out_err_max);
    return o;
}

static cJSON *result_json(const struct eval_run *run, const struct eval_result *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "label", r->cfg.label);
    cJSON_AddStringToObject(o, "k", type_name(r->cfg.type_k));
    cJSON_AddStringToObject(o, "v", type_name(r->cfg.type_v));
    cJSON_AddStringToObject(o, "rot", kvq_rot_kind_name(r->cfg.rot));
    cJSON_AddStringToObject(o, "qjl", qjl_name(r->cfg.qjl));
    cJSON_AddNumberToObject(o, "seed", (double)r->cfg.seed);
    cJSON_AddNumberToObject(o, "row_bytes_k", (double)r->cost.row_k);
    cJSON_AddNumberToObject(o, "row_bytes_v", (double)r->cost.row_v);
    cJSON_AddNumberToObject(o, "bits_k", r->cost.bits_k);
    cJSON_AddNumberToObject(o, "bits_v", r->cost.bits_v);
    cJSON_AddNumberToObject(o, "bits", r->cost.bits);
    cJSON_AddNumberToObject(o, "ratio_f16", r->cost.ratio_f16);
    cJSON_AddBoolToObject(o, "floor", is_floor(&r->cfg));
    cJSON_AddBoolToObject(o, "pareto_out", r->front_out);
    cJSON_AddBoolToObject(o, "pareto_kl", r->front_kl);
    cJSON_AddItemToObject(o, "overall", stats_json(&r->total));
    cJSON *layers = cJSON_AddArrayToObject(o, "layers");
    for (int l = 0; l < run->n_layers; l++) {
        cJSON *lo = stats_json(&r->layers[l]);
        cJSON_AddNumberToObject(lo, "layer", run->layers[l]);
        cJSON_AddItemToArray(layers, lo);
    }
    return o;
}

char *eval_json_text(const struct eval_run *runs, size_t n_runs, int pretty)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *inputs = cJSON_AddArrayToObject(root, "inputs");
    for (size_t i = 0; i < n_runs; i++) {
        const struct kvq_eval_data *d = runs[i].data;
        cJSON *in = cJSON_CreateObject();
        cJSON_AddStringToObject(in, "name", d->name);
        cJSON_AddNumberToObject(in, "layers", d->n_layers);
        cJSON_AddNumberToObject(in, "heads", d->n_heads);
        cJSON_AddNumberToObject(in, "kv_heads", d->n_kv_heads);
        cJSON_AddNumberToObject(in, "head_dim", d->head_dim);
        cJSON_AddNumberToObject(in, "tokens", (double)d->n_tokens);
        cJSON_AddNumberToObject(in, "queries", (double)d->n_queries);
        cJSON_AddNumberToObject(in, "queries_used", (double)runs[i].queries_used);
        cJSON_AddNumberToObject(in, "effective_keys", runs[i].eff_keys);
        cJSON_AddNumberToObject(in, "top_probability", runs[i].top_p);
        cJSON_AddNumberToObject(in, "value_noise_gain", runs[i].v_gain);
        cJSON *ls = cJSON_AddArrayToObject(in, "layers_used");
        for (int l = 0; l < runs[i].n_layers; l++)
            cJSON_AddItemToArray(ls, cJSON_CreateNumber(runs[i].layers[l]));
        cJSON *cf = cJSON_AddArrayToObject(in, "configs");
        for (size_t c = 0; c < runs[i].n_res; c++)
            cJSON_AddItemToArray(cf, result_json(&runs[i], &runs[i].res[c]));
        cJSON_AddItemToArray(inputs, in);
    }
    char *text = pretty ? cJSON_Print(root) : cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}
