/* layer_spec.c - what every layer's memory is made of, in one place.
 *
 * From the model config and a sequence config: each layer's cache config
 * (types, f16 override buffers, context) and its memory spec (page tokens
 * and bytes, per-token bytes, per-sequence state, window, what it can roll
 * back and share). Every plan, budget and pool reads these: kvq_seq_plan_of
 * and kvq_seq's per-layer budget shares, kvq_batch's page pool, the device
 * store's pool (kv_store_cuda.c), `kvq run --plan`. They used to compute
 * them each on their own, and three past bugs came from the copies
 * disagreeing. The checks both engines make at create are here too.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "decoder_internal.h"
#include "kvq_cuda.h"

void kvq_seq_config_default(struct kvq_seq_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->type_k = KVQ_DEFAULT_TYPE_K;
    cfg->type_v = KVQ_DEFAULT_TYPE_V;
    cfg->recent_f16 = KVQ_WINDOW_AUTO;
    cfg->center_k = KVQ_CENTER_AUTO;
    cfg->key_outlier_f16 = 1;
    cfg->cuda_graphs = 1;
    cfg->fast_prefill = 1;
}

/* Layer l's K and V types: the configured ones, f16 keys on a key-outlier
 * layer (c NULL: as configured). */
static void types_of(const struct kvq_model_config *c, const struct kvq_seq_config *sc, int l, enum kvq_type *tk,
                     enum kvq_type *tv)
{
    *tk = sc->layer_types ? sc->layer_types[2 * l] : sc->type_k;
    *tv = sc->layer_types ? sc->layer_types[2 * l + 1] : sc->type_v;
    if (c && sc->key_outlier_f16 && kvq_type_compressed(*tk) && (c->arch.key_outlier_layers[l / 8] >> (l % 8) & 1))
        *tk = KVQ_TYPE_F16;
}

int kvq_seq_window_for(const struct kvq_seq_config *cfg, int n_layers)
{
    if (!cfg || cfg->recent_f16 != KVQ_WINDOW_AUTO)
        return cfg ? cfg->recent_f16 : 0;
    for (int l = 0; l < (cfg->layer_types ? n_layers : 1); l++) {
        enum kvq_type tk, tv;
        types_of(NULL, cfg, l, &tk, &tv);
        if (kvq_type_compressed(tk) || kvq_type_compressed(tv))
            return 1;
    }
    return 0;
}

int kvq_type_is_compressed(enum kvq_type t)
{
    return kvq_type_compressed(t);
}

int kvq_seq_centred(const struct kvq_seq_config *cfg, int n_layers)
{
    if (!cfg || !cfg->center_k || !kvq_seq_window_for(cfg, n_layers))
        return 0;
    for (int l = 0; l < (cfg->layer_types ? n_layers : 1); l++)
        if (kvq_type_compressed(cfg->layer_types ? cfg->layer_types[2 * l] : cfg->type_k))
            return 1;
    return 0;
}

int kvq_seq_center_ok(const struct kvq_seq_config *sc, int window)
{
    return sc->center_k == 0 || sc->center_k == KVQ_CENTER_AUTO || (sc->center_k == 1 && window);
}

void kvq_layer_cache_config(const struct kvq_model_config *c, const struct kvq_seq_config *sc, int l,
                            size_t max_ctx, struct kvq_cache_config *cc)
{
    kvq_cache_config_default(cc, c->n_kv_heads, c->head_dim, max_ctx);
    types_of(c, sc, l, &cc->type_k, &cc->type_v);
    cc->recent_f16 = sc->recent_f16;
    cc->sink_tokens = sc->sink_tokens;
    cc->center_k = sc->center_k != 0 && cc->recent_f16 && kvq_type_compressed(cc->type_k);
}

size_t kvq_layer_f16_bytes(const struct kvq_cache_config *cc, enum kvq_device device)
{
    return device == KVQ_DEVICE_CUDA ? kvq_cuda_cache_f16_bytes(cc) : kvq_cache_bytes_for(cc, 0);
}

/* The sliding window of layer l when it restricts anything in a context of
 * max_ctx tokens (a window that holds the whole context is no window). */
static int window_of(const struct kvq_model_config *c, int l, size_t max_ctx)
{
    const int W = c->arch.sliding_window;
    return W > 0 && (c->arch.window_layers[l / 8] >> (l % 8) & 1) && (size_t)W < max_ctx ? W : 0;
}

kvq_status kvq_layers_plan(const struct kvq_model_config *c, const struct kvq_seq_config *sc, size_t max_ctx,
                           struct kvq_cache_config *ccs, struct kvq_layer_spec *specs, kvq_error *err)
{
    for (int l = 0; l < c->n_layers; l++) {
        enum kvq_type tk, tv;
        types_of(NULL, sc, l, &tk, &tv);
        if (!kvq_type_traits(tk) || !kvq_type_traits(tv))
            return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "unknown cache type for layer %d", l);
        struct kvq_cache_config cc;
        kvq_layer_cache_config(c, sc, l, max_ctx, &cc);
        const size_t pt = (size_t)(cc.page_tokens ? cc.page_tokens : KVQ_DEFAULT_PAGE_TOKENS);
        const size_t all = kvq_cache_bytes_for(&cc, pt), pb = all - kvq_cache_bytes_for(&cc, 0);
        const size_t rk = kvq_type_row_bytes(cc.type_k, c->head_dim), rv = kvq_type_row_bytes(cc.type_v, c->head_dim);
        if (!all || !pb || !rk || !rv)
            return kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "cache types %s/%s of layer %d do not support head_dim %d",
                                 kvq_type_traits(cc.type_k)->name, kvq_type_traits(cc.type_v)->name, l, c->head_dim);
        struct kvq_layer_spec *s = &specs[l];
        memset(s, 0, sizeof *s);
        s->kind = KVQ_LAYER_KV_CACHE;
        s->type_k = cc.type_k;
        s->type_v = cc.type_v;
        s->page_tokens = pt;
        s->page_bytes = pb;
        s->token_bytes = (rk + rv) * (size_t)c->n_kv_heads;
        s->state_bytes = kvq_layer_f16_bytes(&cc, sc->device);
        s->recent_f16 = cc.recent_f16;
        s->center_k = cc.center_k;
        s->window = window_of(c, l, max_ctx);
        /* a windowed layer keeps a ring of segments (kv_store.h): older
         * tokens are gone, and a segment is no prefix another could share */
        s->can_rollback = s->can_share = !s->window;
        if (ccs)
            ccs[l] = cc;
    }
    return KVQ_OK;
}

kvq_status kvq_layer_specs(const kvq_model *m, const struct kvq_seq_config *cfg, struct kvq_layer_spec *out,
                           kvq_error *err)
{
    if (!m || !cfg || !out)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_layer_specs: NULL argument");
    struct kvq_seq_config sc;
    size_t max_ctx;
    kvq_status st = kvq_engine_config(&m->cfg, cfg, &sc, &max_ctx, err);
    return st != KVQ_OK ? st : kvq_layers_plan(&m->cfg, &sc, max_ctx, NULL, out, err);
}

size_t kvq_layer_budget_share(const struct kvq_layer_spec *specs, int n_layers, size_t budget, int l)
{
    if (!budget)
        return 0;
    size_t sum = 0, fixed = 0;
    for (int i = 0; i < n_layers; i++) {
        sum += specs[i].token_bytes;
        fixed += specs[i].state_bytes + specs[i].fixed_bytes;
    }
    const size_t b = specs[l].token_bytes;
    if (!sum || !b || fixed >= budget)
        return 1;
    const size_t rest = budget - fixed;
    const size_t share = rest / sum * b + rest % sum * b / sum + specs[l].state_bytes + specs[l].fixed_bytes;
    return share ? share : 1;
}

kvq_status kvq_engine_config(const struct kvq_model_config *c, const struct kvq_seq_config *cfg,
                             struct kvq_seq_config *out, size_t *max_ctx, kvq_error *err)
{
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    if (cfg)
        sc = *cfg;
    if (sc.max_ctx > (size_t)c->max_ctx)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "context %zu exceeds the model's maximum %d", sc.max_ctx,
                             c->max_ctx);
    if (sc.device != KVQ_DEVICE_CPU && sc.device != KVQ_DEVICE_CUDA)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "unknown device %d", (int)sc.device);
    if (sc.max_chunk < 0 || sc.ngram < 0)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "negative max_chunk or ngram");
    if (sc.recent_f16 < KVQ_WINDOW_AUTO || sc.recent_f16 > 1)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "recent_f16 must be -1, 0 or 1, not %d", sc.recent_f16);
    if (!sc.layer_types && (!kvq_type_traits(sc.type_k) || !kvq_type_traits(sc.type_v)))
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "unknown cache type");
    sc.recent_f16 = kvq_seq_window_for(&sc, c->n_layers);
    if (!kvq_seq_center_ok(&sc, sc.recent_f16))
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, KVQ_SEQ_CENTER_WHY);
    if (sc.sink_tokens < 0 || sc.sink_tokens > KVQ_CACHE_MAX_SINK_TOKENS)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "sink_tokens %d is outside 0..%d", sc.sink_tokens,
                             KVQ_CACHE_MAX_SINK_TOKENS);
    *out = sc;
    *max_ctx = sc.max_ctx ? sc.max_ctx : (size_t)c->max_ctx;
    return KVQ_OK;
}
