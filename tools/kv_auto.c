/* kv_auto.c - --kv-auto for the commands: calibration text in, the
 * library's choice (kvq_kv_auto) out and printed. */
#include "kv_auto.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "kvq_eval.h"

static int budget_error(const char *cmd, const struct kv_opts *o, size_t ctx)
{
    return cli_error(cmd, "--kv-auto: --kv-budget %zu bytes cannot hold %zu tokens with any candidate types",
                     o->budget, ctx);
}

/* The calibration (kvq_kv_auto_calib_ids) from the text file: valid.txt by
 * default, whose end never overlaps an evaluation that scores the file from
 * its start (kvq ppl --max-tokens N with N < total - calibration). */
static int read_calib(const char *cmd, const struct kv_opts *o, const kvq_kv_auto *a, const kvq_tokenizer *tok,
                      const char *model_dir, int32_t **ids, size_t *n)
{
    char path[4096];
    if (o->auto_calib)
        snprintf(path, sizeof path, "%s", o->auto_calib);
    else
        snprintf(path, sizeof path, "%s/reference/valid.txt", model_dir);
    size_t len = 0, nt = 0;
    int32_t *t = NULL;
    char *text = cli_read_text(cmd, path, "the --kv-auto calibration text (give one with --kv-auto-calib)", &len);
    if (!text)
        return 2;
    kvq_status st = kvq_tokenizer_encode_alloc(tok, text, len, 0, &t, &nt);
    free(text);
    if (st != KVQ_OK)
        return cli_status_error(cmd, st, "encoding the calibration text");
    st = kvq_kv_auto_calib_ids(a, t, nt, ids, n);
    free(t);
    if (st == KVQ_ERR_RANGE)
        return cli_error(cmd, "%s: the calibration text has only %zu tokens (%d or more needed)", path, *n,
                         KVQ_KV_AUTO_MIN_CALIB);
    return st != KVQ_OK ? cli_status_error(cmd, st, "calibration ids") : 0;
}

static void print_choice(const char *cmd, const struct kv_opts *o, const kvq_model *m)
{
    const struct kvq_model_config *c = kvq_model_config_of(m);
    const struct kvq_kv_auto_choice *ch = &o->auto_choice;
    const char *metric = kvq_kv_auto_metric_name(ch->metric);
    const int nll = ch->metric == KVQ_KV_AUTO_NLL;
    fprintf(stderr, "kvq %s: --kv-auto for %zu bytes at %zu tokens (%zu calibration tokens, the end of %s; "
                    "scored in %.1f s):\n",
            cmd, o->budget, ch->ctx, ch->calib_tokens, o->auto_calib ? o->auto_calib : "reference/valid.txt",
            ch->score_seconds);
    if (nll)
        fprintf(stderr, "  nll: %d layers x %d pairs + 1 forwards of %zu tokens; f32 mean NLL %.5f\n", ch->n_layers,
                ch->n_cands, ch->calib_tokens, ch->base_nll);
    for (int l = 0; l < ch->n_layers; l++)
        fprintf(stderr, "  layer %2d  %s/%s  %.3f bits/value  %s %.5f\n", l,
                kvq_type_traits(ch->layer_types[2 * l])->name, kvq_type_traits(ch->layer_types[2 * l + 1])->name,
                8.0 * (double)ch->layer_bytes[l] / (2.0 * c->n_kv_heads * c->head_dim), metric, ch->layer_err[l]);
    fprintf(stderr, "  total     %zu bytes/token (%zu at %zu tokens)  summed %s %.5f\n", ch->total_bytes,
            ch->total_bytes * ch->ctx, ch->ctx, metric, ch->total_err);
    if (nll)
        fprintf(stderr, "  additivity: the whole choice raises the calibration NLL by %.5f (sum of layers %.5f)\n",
                ch->joint_err, ch->total_err);
}

int kv_auto_apply(const char *cmd, struct kv_opts *o, const kvq_model *m, const kvq_tokenizer *tok,
                  const char *model_dir, size_t ctx, int quiet)
{
    if (!o->kv_auto)
        return 0;
    const struct kvq_model_config *c = kvq_model_config_of(m);
    if (c->n_layers > KVQ_KV_AUTO_MAX_LAYERS)
        return cli_error(cmd, "--kv-auto supports at most %d layers", KVQ_KV_AUTO_MAX_LAYERS);
    if (o->auto_ctx)
        ctx = o->auto_ctx;
    struct kvq_kv_auto_config cfg;
    kvq_kv_auto_config_default(&cfg);
    kv_opts_seq_config(o, &cfg.seq);
    cfg.ctx = ctx;
    cfg.metric = o->auto_metric;
    kvq_kv_auto *a = NULL;
    kvq_error err = {0};
    kvq_status st = kvq_kv_auto_create(m, &cfg, &a, &err);
    if (st == KVQ_ERR_BUDGET)
        return budget_error(cmd, o, ctx);
    if (st != KVQ_OK)
        return err.msg[0] ? cli_error(cmd, "--kv-auto: %s", err.msg) : cli_status_error(cmd, st, "--kv-auto");
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = read_calib(cmd, o, a, tok, model_dir, &ids, &n);
    if (!rc && (st = kvq_kv_auto_measure(a, ids, n, NULL, NULL, &err)) != KVQ_OK)
        rc = err.msg[0] ? cli_error(cmd, "--kv-auto: %s", err.msg) : cli_status_error(cmd, st, "--kv-auto scoring");
    if (!rc) {
        kvq_error cerr = {0};
        st = kvq_kv_auto_choose(a, &o->auto_choice, &cerr);
        if (st != KVQ_OK)
            rc = cerr.msg[0]               ? cli_error(cmd, "--kv-auto: %s", cerr.msg)
                 : st == KVQ_ERR_BUDGET ? budget_error(cmd, o, ctx)
                                        : cli_status_error(cmd, st, "--kv-auto choice");
    }
    if (!rc) {
        o->n_layer_types = c->n_layers;
        for (int i = 0; i < 2 * c->n_layers; i++)
            o->layer_types[i] = o->auto_choice.layer_types[i];
        if (!quiet)
            print_choice(cmd, o, m);
    }
    free(ids);
    kvq_kv_auto_free(a);
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
    cJSON_AddNumberToObject(a, "ctx", (double)o->auto_choice.ctx);
    cJSON_AddNumberToObject(a, "budget", (double)o->budget);
    cJSON_AddStringToObject(a, "metric", kvq_kv_auto_metric_name(o->auto_metric));
    double total = 0;
    for (int l = 0; l < o->n_layer_types; l++) {
        cJSON *e = cJSON_CreateObject();
        if (!e)
            break;
        enum kvq_type tk = o->layer_types[2 * l], tv = o->layer_types[2 * l + 1];
        struct kvq_eval_config cfg;
        struct kvq_eval_cost cost;
        kvq_eval_config_default(&cfg);
        cfg.type_k = tk;
        cfg.type_v = tv;
        double bits = kvq_eval_cost_of(&cfg, c->head_dim, &cost) == KVQ_OK ? cost.bits : 0;
        cJSON_AddStringToObject(e, "k", kvq_type_traits(tk)->name);
        cJSON_AddStringToObject(e, "v", kvq_type_traits(tv)->name);
        cJSON_AddNumberToObject(e, "bits", bits);
        cJSON_AddNumberToObject(e, "err", o->auto_choice.layer_err[l]);
        cJSON_AddItemToArray(layers, e);
        total += o->auto_choice.layer_err[l];
    }
    cJSON_AddNumberToObject(a, "total_err", total);
    cJSON_AddItemToObject(a, "layers", layers);
}
