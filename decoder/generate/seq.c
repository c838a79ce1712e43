/* seq.c - the sequence state: slot 0 of a batch of one (batch.c: the one
 * engine, whose backend holds every buffer the forward pass will ever need
 * and whose store holds the caches), with what a single sequence adds: the
 * token history and its n-gram table, the sampler, the plan, the chunked
 * forward with an LM head over any of its rows, rollback and statistics. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "decoder_internal.h"
#include "kv_store.h"
#include "kvq_batch.h"
#include "kvq_cuda.h"
#include "kvq_rng.h"

double kvq_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int kvq_default_max_chunk(enum kvq_device dev)
{
    return dev == KVQ_DEVICE_CUDA ? KVQ_DEFAULT_MAX_CHUNK_CUDA : KVQ_DEFAULT_MAX_CHUNK;
}

/* The chunk a config resolves to over a context of max_ctx: its own or the
 * device's default, at most the context, at least a verify pass. */
static size_t chunk_of(const struct kvq_seq_config *cfg, size_t max_ctx)
{
    size_t ch = cfg->max_chunk > 0 ? (size_t)cfg->max_chunk : (size_t)kvq_default_max_chunk(cfg->device);
    ch = ch < max_ctx ? ch : max_ctx;
    return ch > KVQ_MAX_DRAFT + 1 ? ch : KVQ_MAX_DRAFT + 1;
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
    struct kvq_layer_spec *specs = malloc((size_t)c->n_layers * sizeof *specs);
    if (!specs)
        return KVQ_ERR_NOMEM;
    kvq_status st = kvq_layers_plan(c, cfg, max_ctx, NULL, specs, NULL);
    size_t fit = SIZE_MAX;
    for (int l = 0; st == KVQ_OK && l < c->n_layers; l++) {
        const struct kvq_layer_spec *sp = &specs[l];
        const size_t pt = sp->page_tokens, pb = sp->page_bytes, fx = sp->state_bytes;
        out->page_tokens = pt;
        out->page_bytes = pb > out->page_bytes ? pb : out->page_bytes;
        /* with center_k the page's key means, rounded up to whole bytes per token */
        out->bytes_per_token += sp->center_k ? (pb + pt - 1) / pt : sp->token_bytes;
        out->fixed_bytes += fx;
        size_t share = kvq_layer_budget_share(specs, c->n_layers, cfg->kv_budget, l);
        if (share) { /* what kvq_cache_append allows: whole pages within the share */
            size_t f = share > fx ? (share - fx) / pb * pt : 0;
            fit = f < fit ? f : fit;
        }
    }
    if (st == KVQ_OK) {
        out->max_chunk = chunk_of(cfg, max_ctx);
        if (cfg->device == KVQ_DEVICE_CUDA)
            out->work_bytes = kvq_backend_cuda_work_bytes(m, out->max_chunk) +
                              kvq_kv_store_cuda_scratch_bytes(c->n_kv_heads, c->n_heads, c->head_dim,
                                                              out->max_chunk, max_ctx);
        out->budget_tokens = fit;
        out->max_tokens = fit < max_ctx ? fit : max_ctx;
        for (int l = 0; l < c->n_layers; l++) {
            struct kvq_cache_config cc;
            kvq_layer_cache_config(c, cfg, l, max_ctx, &cc);
            out->bytes_at_max += kvq_cache_bytes_for(&cc, out->max_tokens) - kvq_cache_bytes_for(&cc, 0) +
                                 specs[l].state_bytes;
        }
    }
    free(specs);
    return st;
}

kvq_status kvq_seq_create(const kvq_model *m, const struct kvq_seq_config *cfg, kvq_seq **out, kvq_error *err)
{
    if (!m || !out)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_seq_create: NULL argument");
    struct kvq_seq_config sc;
    size_t max_ctx;
    kvq_status st = kvq_engine_config(&m->cfg, cfg, &sc, &max_ctx, err);
    if (st != KVQ_OK)
        return st;
    const struct kvq_model_config *c = &m->cfg;
    kvq_seq *s = calloc(1, sizeof *s);
    if (!s)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    s->m = m;
    s->cfg = sc;
    s->max_ctx = max_ctx;
    s->max_chunk = (int)chunk_of(&sc, s->max_ctx);
    if (!s->cfg.ngram)
        s->cfg.ngram = 3;

    st = kvq_batch_create_one(m, &sc, s->max_ctx, (size_t)s->max_chunk, &s->b, err);
    if (st != KVQ_OK) {
        kvq_seq_free(s);
        return st;
    }
    s->be = kvq_batch_backend(s->b);
    s->kv = kvq_batch_store(s->b);
    s->tm = kvq_batch_timers(s->b);
    kvq_sampler_params sp = kvq_sampler_params_default();
    sp.seed = sc.seed;
    if (kvq_sampler_create(c->vocab, &sp, &s->sampler) != KVQ_OK)
        goto nomem;
    s->draft = malloc((KVQ_MAX_DRAFT + 1) * sizeof *s->draft);
    s->verify = malloc((KVQ_MAX_DRAFT + 1) * sizeof *s->verify);
    s->tokens = malloc((s->max_ctx + 1) * sizeof *s->tokens);
    if (kvq_ngram_create(s->cfg.ngram, s->max_ctx, &s->ngram) != KVQ_OK)
        goto nomem;
    if (!s->draft || !s->verify || !s->tokens)
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
    kvq_batch_free(s->b);
    kvq_sampler_free(s->sampler);
    free(s->draft);
    free(s->verify);
    free(s->tokens);
    kvq_ngram_free(s->ngram);
    free(s);
}

void kvq_seq_reset(kvq_seq *s)
{
    if (!s)
        return;
    kvq_batch_rollback(s->b, 0, 0);
    s->kv->ops->reset(s->kv, 0);
    s->pos = 0;
    kvq_ngram_clear(s->ngram);
    kvq_sampler_reset(s->sampler);
    memset(s->tm, 0, sizeof *s->tm);
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

const char *kvq_seq_error_detail(const kvq_seq *s)
{
    return s ? kvq_backend_cpu_expert_error(s->be) : NULL;
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
        kvq_status st = kvq_batch_chunk(s->b, 0, ids + i, T);
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
            s->tm->lm_head += kvq_now() - t1;
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
    kvq_batch_rollback(s->b, 0, n);
    s->pos = n;
    kvq_ngram_truncate(s->ngram, n);
    return KVQ_OK;
}

void kvq_seq_set_qkv_hook(kvq_seq *s, kvq_qkv_hook fn, void *user)
{
    if (s)
        kvq_batch_set_hook(s->b, fn, user);
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
    st->t_matmul = s->tm->matmul;
    st->t_attn = s->tm->attn;
    st->t_lm_head = s->tm->lm_head;
    double host = st->t_prefill + st->t_decode - st->t_matmul - st->t_attn - st->t_lm_head;
    st->t_host = host > 0 ? host : 0;
    kvq_backend_gpu_parts(s->be, &st->gpu_matmul, &st->gpu_attn, &st->gpu_lm_head, &st->gpu_other);
    size_t captured = 0, replayed = 0;
    kvq_cuda_step_counts(s->be->dev_step, &captured, &replayed);
    st->gpu_graph_steps = captured + replayed;
    kvq_backend_cpu_expert_stats(s->be, &st->experts);
}
