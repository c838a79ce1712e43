/* seq.c - the sequence state: creation (the backend with every buffer the
 * forward pass will ever need, the KV store, the sampler, all allocated
 * once), reset, the chunked forward entry point, rollback and statistics. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "expert_cache.h"
#include "decoder_internal.h"
#include "kv_store.h"
#include "kvq_cuda.h"
#include "kvq_rng.h"

#define NGRAM_MAX_SLOTS ((size_t)1 << 18)
#define DEFAULT_CHUNK 256

double kvq_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void kvq_seq_config_default(struct kvq_seq_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->type_k = KVQ_DEFAULT_TYPE_K;
    cfg->type_v = KVQ_DEFAULT_TYPE_V;
    cfg->recent_f16 = KVQ_WINDOW_AUTO;
    cfg->center_k = KVQ_CENTER_AUTO;
    cfg->key_outlier_f16 = 1;
    cfg->cuda_graphs = 1;
}

static int compressed(enum kvq_type t)
{
    return t != KVQ_TYPE_F32 && t != KVQ_TYPE_F16;
}

/* Layer l's K and V types: the configured ones, f16 keys on a key-outlier
 * layer (c NULL: as configured). */
static void types_of(const struct kvq_model_config *c, const struct kvq_seq_config *sc, int l, enum kvq_type *tk,
                     enum kvq_type *tv)
{
    *tk = sc->layer_types ? sc->layer_types[2 * l] : sc->type_k;
    *tv = sc->layer_types ? sc->layer_types[2 * l + 1] : sc->type_v;
    if (c && sc->key_outlier_f16 && compressed(*tk) && (c->arch.key_outlier_layers[l / 8] >> (l % 8) & 1))
        *tk = KVQ_TYPE_F16;
}

int kvq_seq_window_for(const struct kvq_seq_config *cfg, int n_layers)
{
    if (!cfg || cfg->recent_f16 != KVQ_WINDOW_AUTO)
        return cfg ? cfg->recent_f16 : 0;
    for (int l = 0; l < (cfg->layer_types ? n_layers : 1); l++) {
        enum kvq_type tk, tv;
        types_of(NULL, cfg, l, &tk, &tv);
        if (compressed(tk) || compressed(tv))
            return 1;
    }
    return 0;
}

int kvq_seq_center_ok(const struct kvq_seq_config *sc, int window)
{
    return sc->center_k == 0 || sc->center_k == KVQ_CENTER_AUTO || (sc->center_k == 1 && window);
}

/* Bytes per token of layer l (all KV heads); 0 when a type does not fit. */
static size_t layer_row_bytes(const struct kvq_model_config *c, const struct kvq_seq_config *sc, int l)
{
    enum kvq_type tk, tv;
    types_of(c, sc, l, &tk, &tv);
    size_t rk = kvq_type_row_bytes(tk, c->head_dim), rv = kvq_type_row_bytes(tv, c->head_dim);
    return rk && rv ? (rk + rv) * (size_t)c->n_kv_heads : 0;
}

/* Layer l's cache config (types, override buffers, context) without seed and budget. */
void kvq_layer_cache_config(const struct kvq_model_config *c, const struct kvq_seq_config *sc, int l,
                            size_t max_ctx, struct kvq_cache_config *cc)
{
    kvq_cache_config_default(cc, c->n_kv_heads, c->head_dim, max_ctx);
    types_of(c, sc, l, &cc->type_k, &cc->type_v);
    cc->recent_f16 = sc->recent_f16;
    cc->sink_tokens = sc->sink_tokens;
    cc->center_k = sc->center_k != 0 && cc->recent_f16 && compressed(cc->type_k);
}

size_t kvq_layer_f16_bytes(const struct kvq_cache_config *cc, enum kvq_device device)
{
    return device == KVQ_DEVICE_CUDA ? kvq_cuda_cache_f16_bytes(cc) : kvq_cache_bytes_for(cc, 0);
}

/* Bytes of layer l's f16 override buffers (allocated at create). */
static size_t layer_fixed_bytes(const struct kvq_model_config *c, const struct kvq_seq_config *sc, int l,
                                size_t max_ctx)
{
    struct kvq_cache_config cc;
    kvq_layer_cache_config(c, sc, l, max_ctx, &cc);
    return kvq_layer_f16_bytes(&cc, sc->device);
}

/* Layer l's exact share of the budget: its f16 buffers F_l, plus a part of
 * the rest R = B - sum F proportional to its bytes per token: floor(R * b_l /
 * sum) computed as q * b_l + r * b_l / sum (R = q * sum + r) so nothing
 * overflows and the shares never add up to more than B. A share below one
 * page still must not read as "no limit" (max_bytes 0), so it is at least
 * one byte: such a cache holds no page and every append reports
 * KVQ_ERR_BUDGET. */
static size_t layer_budget(const struct kvq_model_config *c, const struct kvq_seq_config *sc, int l, size_t max_ctx)
{
    if (!sc->kv_budget)
        return 0;
    size_t sum = 0, fixed = 0;
    for (int i = 0; i < c->n_layers; i++) {
        sum += layer_row_bytes(c, sc, i);
        fixed += layer_fixed_bytes(c, sc, i, max_ctx);
    }
    size_t b = layer_row_bytes(c, sc, l);
    if (!sum || !b || fixed >= sc->kv_budget)
        return 1;
    size_t rest = sc->kv_budget - fixed;
    size_t share = rest / sum * b + rest % sum * b / sum + layer_fixed_bytes(c, sc, l, max_ctx);
    return share ? share : 1;
}

kvq_status kvq_seq_plan_of(const kvq_model *m, const struct kvq_seq_config *cfg, struct kvq_seq_plan *out)
{
    if (!m || !cfg || !out)
        return KVQ_ERR_INVALID_ARG;
    const struct kvq_model_config *c = &m->cfg;
    memset(out, 0, sizeof *out);
    struct kvq_seq_config resolved = *cfg;
    resolved.recent_f16 = kvq_seq_window_for(cfg, c->n_layers);
    cfg = &resolved;
    if (cfg->recent_f16 < 0 || cfg->recent_f16 > 1 || cfg->sink_tokens < 0 ||
        cfg->sink_tokens > KVQ_CACHE_MAX_SINK_TOKENS || !kvq_seq_center_ok(cfg, cfg->recent_f16))
        return KVQ_ERR_INVALID_ARG;
    size_t max_ctx = cfg->max_ctx ? cfg->max_ctx : (size_t)c->max_ctx;
    size_t fit = SIZE_MAX, bytes_at = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int l = 0; l < c->n_layers; l++) {
            enum kvq_type tk, tv;
            types_of(NULL, cfg, l, &tk, &tv);
            if (!kvq_type_traits(tk) || !kvq_type_traits(tv))
                return KVQ_ERR_INVALID_ARG;
            struct kvq_cache_config cc;
            kvq_layer_cache_config(c, cfg, l, max_ctx, &cc);
            size_t pt = (size_t)(cc.page_tokens ? cc.page_tokens : KVQ_DEFAULT_PAGE_TOKENS);
            size_t all = kvq_cache_bytes_for(&cc, pt), pb = all - kvq_cache_bytes_for(&cc, 0);
            size_t fx = kvq_layer_f16_bytes(&cc, cfg->device), rb = layer_row_bytes(c, cfg, l);
            if (!all || !pb || !rb)
                return KVQ_ERR_UNSUPPORTED;
            if (cc.center_k) /* the page's key means, rounded up to whole bytes per token */
                rb = (pb + pt - 1) / pt;
            if (pass == 0) {
                out->page_tokens = pt;
                out->page_bytes = pb > out->page_bytes ? pb : out->page_bytes;
                out->bytes_per_token += rb;
                out->fixed_bytes += fx;
                size_t share = layer_budget(c, cfg, l, max_ctx);
                if (share) { /* what kvq_cache_append allows: whole pages within the share */
                    size_t f = share > fx ? (share - fx) / pb * pt : 0;
                    fit = f < fit ? f : fit;
                }
            } else {
                bytes_at += kvq_cache_bytes_for(&cc, out->max_tokens) - kvq_cache_bytes_for(&cc, 0) +
                            kvq_layer_f16_bytes(&cc, cfg->device);
            }
        }
        if (pass == 0) {
            out->budget_tokens = fit;
            out->max_tokens = fit < max_ctx ? fit : max_ctx;
        }
    }
    out->bytes_at_max = bytes_at;
    return KVQ_OK;
}

kvq_status kvq_seq_create(const kvq_model *m, const struct kvq_seq_config *cfg, kvq_seq **out, kvq_error *err)
{
    if (!m || !out)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_seq_create: NULL argument");
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    if (cfg)
        sc = *cfg;
    const struct kvq_model_config *c = &m->cfg;
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

    kvq_seq *s = calloc(1, sizeof *s);
    if (!s)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    s->m = m;
    s->cfg = sc;
    s->max_ctx = sc.max_ctx ? sc.max_ctx : (size_t)c->max_ctx;
    s->max_chunk = sc.max_chunk ? sc.max_chunk : DEFAULT_CHUNK;
    if ((size_t)s->max_chunk > s->max_ctx)
        s->max_chunk = (int)s->max_ctx;
    if (s->max_chunk < KVQ_MAX_DRAFT + 1)
        s->max_chunk = KVQ_MAX_DRAFT + 1; /* a verify pass is one chunk */
    if (!s->cfg.ngram)
        s->cfg.ngram = 3;

    struct kvq_cache_config *ccs = calloc((size_t)c->n_layers, sizeof *ccs);
    if (!ccs)
        goto nomem;
    for (int l = 0; l < c->n_layers; l++) {
        kvq_layer_cache_config(c, &sc, l, s->max_ctx, &ccs[l]);
        if (!kvq_type_traits(ccs[l].type_k) || !kvq_type_traits(ccs[l].type_v)) {
            free(ccs);
            kvq_seq_free(s);
            return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "unknown cache type for layer %d", l);
        }
        ccs[l].seed = kvq_seed_derive(sc.seed, (uint64_t)l);
        ccs[l].max_bytes = layer_budget(c, &sc, l, s->max_ctx);
        if (ccs[l].max_bytes && sc.device == KVQ_DEVICE_CUDA) {
            /* a device store sizes its pool from max_bytes alone (it holds the
             * f16 rows apart), as kvq_batch passes it: the share's pages part;
             * at least 1, which holds no page and must not read as no limit */
            const size_t f16 = kvq_layer_f16_bytes(&ccs[l], sc.device);
            ccs[l].max_bytes = ccs[l].max_bytes > f16 + 1 ? ccs[l].max_bytes - f16 : 1;
        }
    }
    struct kvq_kv_store_config kc = {.cfgs = ccs, .n_layers = c->n_layers, .max_seqs = 1, .n_heads = c->n_heads,
                                     .max_rows = (size_t)s->max_chunk, .v_norm_correct = sc.v_norm_correct};
    const int cuda = sc.device == KVQ_DEVICE_CUDA;
    int *windows = c->arch.sliding_window ? calloc((size_t)c->n_layers, sizeof *windows) : NULL;
    for (int l = 0; windows && l < c->n_layers; l++)
        windows[l] = c->arch.window_layers[l / 8] >> (l % 8) & 1 ? c->arch.sliding_window : 0;
    kc.windows = windows;
    kc.attn_scale = c->arch.attn_scale;
    const int cpu_only = windows || c->arch.sandwich_norm || c->arch.attn_scale > 0;
    const char *refused = cuda ? kvq_backend_cuda_refusal(m) : NULL;
    kvq_status st = c->arch.sliding_window && !windows ? kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory")
                    : refused ? kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "%s", refused)
                    : cuda && cpu_only ? kvq_error_set(err, KVQ_ERR_UNSUPPORTED,
                                                       "%s runs on the CPU only (--device cpu)",
                                                       windows ? "sliding-window attention" : "Gemma's architecture")
                    : cuda ? kvq_kv_store_cuda_create(&kc, &s->kv, err)
                           : kvq_kv_store_cpu_create(&kc, &s->kv, err);
    free(windows);
    free(ccs);
    if (st != KVQ_OK) {
        kvq_seq_free(s);
        return st;
    }
    st = cuda ? kvq_backend_cuda_create(m, (size_t)s->max_chunk, kvq_seq_backend_flags(&sc), &s->be)
              : kvq_backend_cpu_create(m, (size_t)s->max_chunk, &s->be);
    if (st != KVQ_OK) {
        kvq_seq_free(s);
        return kvq_error_set(err, st, "cannot create the %s backend: %s", cuda ? "CUDA" : "CPU", kvq_status_str(st));
    }
    if (s->kv->ops->attach)
        s->kv->ops->attach(s->kv, s->be->dev_stream, s->be->dev_step);
    if (sc.expert_cache && (st = kvq_backend_cpu_expert_cache(s->be, sc.expert_cache, err)) != KVQ_OK) {
        kvq_seq_free(s);
        return st;
    }
    kvq_sampler_params sp = kvq_sampler_params_default();
    sp.seed = sc.seed;
    if (kvq_sampler_create(c->vocab, &sp, &s->sampler) != KVQ_OK)
        goto nomem;
    s->draft = malloc((KVQ_MAX_DRAFT + 1) * sizeof *s->draft);
    s->verify = malloc((KVQ_MAX_DRAFT + 1) * sizeof *s->verify);
    s->tokens = malloc((s->max_ctx + 1) * sizeof *s->tokens);
    s->row_pos = malloc((size_t)s->max_chunk * sizeof *s->row_pos);
    /* a hash table: past NGRAM_MAX_SLOTS / 2 tokens older n-grams are just
     * overwritten sooner (fewer drafts), so its size, cleared at every reset,
     * stays independent of a million-token context */
    s->ngram_mask = 1;
    while (s->ngram_mask < 2 * s->max_ctx && s->ngram_mask < NGRAM_MAX_SLOTS)
        s->ngram_mask <<= 1;
    s->ngram_pos = malloc((size_t)s->cfg.ngram * s->ngram_mask * sizeof *s->ngram_pos);
    s->ngram_mask--;
    if (!s->draft || !s->verify || !s->tokens || !s->ngram_pos || !s->row_pos)
        goto nomem;
    kvq_seq_reset(s);
    *out = s;
    return KVQ_OK;
nomem:
    kvq_seq_free(s);
    return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory for the sequence state");
}

void kvq_seq_free(kvq_seq *s)
{
    if (!s)
        return;
    kvq_kv_store_free(s->kv);
    kvq_backend_free(s->be);
    kvq_sampler_free(s->sampler);
    free(s->draft);
    free(s->verify);
    free(s->tokens);
    free(s->ngram_pos);
    free(s->row_pos);
    free(s);
}

void kvq_seq_reset(kvq_seq *s)
{
    if (!s)
        return;
    s->kv->ops->reset(s->kv, 0);
    s->pos = 0;
    kvq_ngram_clear(s);
    kvq_sampler_reset(s->sampler);
    memset(&s->tm, 0, sizeof s->tm);
    memset(&s->st, 0, sizeof s->st);
    if (s->be->ops->part_times) {
        double t[KVQ_N_PARTS];
        s->be->ops->part_times(s->be, t, 1);
    }
    s->decoding = 0;
}

size_t kvq_seq_pos(const kvq_seq *s)
{
    return s ? s->pos : 0;
}

size_t kvq_seq_max_ctx(const kvq_seq *s)
{
    return s ? s->max_ctx : 0;
}

kvq_status kvq_seq_forward(kvq_seq *s, const int32_t *ids, size_t n, size_t first_out, float *logits,
                           int32_t *argmax)
{
    struct kvq_seq_out o = {logits, argmax, NULL, NULL, NULL};
    return kvq_seq_forward_out(s, ids, n, first_out, &o);
}

kvq_status kvq_seq_forward_out(kvq_seq *s, const int32_t *ids, size_t n, size_t first_out,
                               const struct kvq_seq_out *out)
{
    float *logits = out->logits;
    int32_t *argmax = out->argmax;
    if (!s || (!ids && n) || first_out > n || (out->tok && n - first_out > KVQ_MAX_DRAFT + 1))
        return KVQ_ERR_INVALID_ARG;
    kvq_sampler *smp[KVQ_MAX_DRAFT + 1]; /* lm_sample takes a sampler per row: here all the sequence's */
    for (size_t i = 0; out->tok && i < n - first_out; i++)
        smp[i] = s->sampler;
    const struct kvq_model_config *c = &s->m->cfg;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab)
            return KVQ_ERR_RANGE;
    if (n > s->max_ctx - s->pos)
        return KVQ_ERR_CONTEXT_FULL;
    /* With the recent window a failed chunk could not give back the f16
     * copies the chunk's appends overwrote, so the budget is settled for
     * all n tokens before the first one is appended. */
    if (s->cfg.recent_f16) {
        kvq_status st = s->kv->ops->reserve(s->kv, 0, n);
        if (st != KVQ_OK)
            return st;
    }
    double t0 = kvq_now();
    size_t pos0 = s->pos;
    for (size_t i = 0; i < n;) {
        size_t T = n - i < (size_t)s->max_chunk ? n - i : (size_t)s->max_chunk;
        kvq_status st = kvq_forward_chunk(s, ids + i, T);
        if (st != KVQ_OK) {
            kvq_seq_truncate(s, pos0); /* all or nothing */
            return st;
        }
        memcpy(s->tokens + s->pos, ids + i, T * sizeof *ids);
        s->pos += T;
        if (i + T > first_out && (logits || argmax || out->tok)) {
            size_t r0 = first_out > i ? first_out - i : 0;
            size_t o = i + r0 - first_out;
            const float *x = s->be->acts.x + r0 * (size_t)c->hidden;
            double t1 = kvq_now();
            if (out->tok)
                st = s->be->ops->lm_sample(s->be, x, T - r0, smp, out->u + o, out->tok + o, out->row_st + o);
            else
                st = s->be->ops->lm_head(s->be, x, T - r0, logits ? logits + o * (size_t)c->vocab : NULL,
                                         argmax ? argmax + o : NULL);
            s->tm.lm_head += kvq_now() - t1;
            if (st != KVQ_OK)
                return st; /* the tokens stay: only the head's output was bad */
        }
        i += T;
    }
    if (!s->decoding) { /* generation times its whole loop itself */
        s->st.t_prefill += kvq_now() - t0;
        s->st.prefill_tokens += n;
    }
    return KVQ_OK;
}

kvq_status kvq_seq_truncate(kvq_seq *s, size_t n)
{
    if (!s || n > s->pos)
        return KVQ_ERR_INVALID_ARG;
    s->kv->ops->truncate(s->kv, 0, s->m->cfg.n_layers, n);
    s->pos = n;
    if (s->ngram_indexed > n)
        s->ngram_indexed = n;
    return KVQ_OK;
}

void kvq_seq_set_qkv_hook(kvq_seq *s, kvq_qkv_hook fn, void *user)
{
    if (s) {
        s->hook = fn;
        s->hook_user = user;
    }
}

const struct kvq_cache *kvq_seq_cache(const kvq_seq *s, int layer)
{
    return s && layer >= 0 && layer < s->m->cfg.n_layers ? s->kv->ops->cache(s->kv, layer, 0) : NULL;
}

void kvq_seq_get_stats(const kvq_seq *s, struct kvq_seq_stats *st)
{
    memset(st, 0, sizeof *st);
    if (!s)
        return;
    *st = s->st;
    st->tokens = s->pos;
    st->kv_budget = s->cfg.kv_budget;
    struct kvq_cache_stats cs;
    s->kv->ops->stats(s->kv, 0, &cs);
    st->kv_bytes_used = cs.bytes_used;
    st->kv_bytes_alloc = cs.bytes_allocated;
    st->kv_bytes_f16 = cs.bytes_f16;
    st->kv_bytes_f16_buffers = cs.bytes_f16_buffers;
    st->t_matmul = s->tm.matmul;
    st->t_attn = s->tm.attn;
    st->t_lm_head = s->tm.lm_head;
    double host = st->t_prefill + st->t_decode - st->t_matmul - st->t_attn - st->t_lm_head;
    st->t_host = host > 0 ? host : 0;
    if (s->be->ops->part_times) {
        double t[KVQ_N_PARTS];
        s->be->ops->part_times(s->be, t, 0);
        st->gpu_matmul = t[KVQ_PART_MATMUL];
        st->gpu_attn = t[KVQ_PART_ATTN];
        st->gpu_lm_head = t[KVQ_PART_LM_HEAD];
        st->gpu_other = t[KVQ_PART_OTHER];
    }
    size_t captured = 0, replayed = 0;
    kvq_cuda_step_counts(s->be->dev_step, &captured, &replayed);
    st->gpu_graph_steps = captured + replayed;
    struct kvq_expert_cache_stats es;
    if (kvq_backend_cpu_expert_stats(s->be, &es)) {
        st->expert_cache_bytes = es.slots * es.slot_bytes;
        st->expert_hits = es.hits;
        st->expert_misses = es.misses;
        st->expert_bytes_read = es.bytes_read;
        st->t_expert_read = es.read_seconds;
    }
}
