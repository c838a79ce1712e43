/* batch.c - slots of one KV store advanced together (kvq_batch.h).
 *
 * The store holds max_seqs sequences; a step lays its items' tokens out as
 * consecutive rows, one forward segment per item (forward.c), and runs the
 * LM head on the last row of each item that wants an output. Pages are
 * counted here, over all slots, against one pool; the CPU caches have no
 * budget of their own (they allocate pages on demand and the batch never
 * lets them exceed the pool), the device caches get the pool as theirs.
 *
 * Prefix sharing (kvq_batch_share): the batch mirrors what the caches hold
 * with a page id per page of each slot and a count of the slots holding each
 * id, so pages_used counts a shared page once and the step check knows the
 * page a copy on write will take.
 */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "decoder_internal.h"
#include "kv_store.h"
#include "kvq_batch.h"
#include "kvq_cuda.h"
#include "kvq_rng.h"
#include "matvec_internal.h"

#define DEFAULT_SEQS 8
#define DEFAULT_CHUNK 256

struct kvq_batch {
    const kvq_model *m;
    struct kvq_seq_config cfg; /* recent_f16 resolved */
    int max_seqs;
    size_t max_rows, max_ctx, page_tokens;
    kvq_backend *be;
    kvq_kv_store *kv;
    struct kvq_fwd fwd;
    int *taken;                /* [max_seqs] */
    size_t *len;               /* [max_seqs] tokens held */
    unsigned *mark;            /* [max_seqs] step stamp: one item per slot */
    unsigned stamp;
    int active;
    size_t pages_total, page_bytes, fixed_bytes, bytes_per_token;
    size_t per_seq;            /* pages of one full slot */
    uint32_t *pid;             /* [max_seqs][per_seq] the pool page of each page of a slot */
    uint32_t *refs;            /* [max_seqs * per_seq] slots holding each page id (0: unused) */
    uint32_t *free_ids;        /* stack of unused ids */
    size_t n_free, n_ids;
    size_t pages_shared;       /* ids held by two slots or more */
    int32_t *ids;              /* [max_rows] a step's tokens */
    struct kvq_fwd_seg *segs;  /* [max_seqs] */
    int *seq_ids;              /* [max_seqs] */
    float *logits;             /* [max_seqs][vocab] */
    int32_t *argmax;           /* [max_seqs] */
    size_t *out_rows;          /* [max_seqs] rows whose LM head a step runs */
    size_t *draw_rows;         /* [max_seqs] rows a step draws a token for (items with a sampler) */
    kvq_sampler **draw_smp;    /* [max_seqs] their samplers */
    double *draw_u;            /* [max_seqs] the uniforms they draw at */
    int32_t *draw_tok;         /* [max_seqs] */
    kvq_status *draw_st;       /* [max_seqs] */
    struct kvq_seq_timers tm;
    size_t steps, rows;
    double t_total;
};

void kvq_batch_config_default(struct kvq_batch_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    kvq_seq_config_default(&cfg->seq);
    cfg->max_seqs = DEFAULT_SEQS;
}

size_t kvq_batch_pages_for(const kvq_batch *b, size_t n)
{
    return b ? (n + b->page_tokens - 1) / b->page_tokens : 0;
}

static size_t pages_used(const kvq_batch *b)
{
    return b->n_ids - b->n_free;
}

/* Page i of slot becomes a fresh page. */
static void take_page(kvq_batch *b, int slot, size_t i)
{
    uint32_t id = b->free_ids[--b->n_free];
    b->refs[id] = 1;
    b->pid[(size_t)slot * b->per_seq + i] = id;
}

static void unref_page(kvq_batch *b, uint32_t id)
{
    if (b->refs[id] == 2)
        b->pages_shared--;
    if (--b->refs[id] == 0)
        b->free_ids[b->n_free++] = id;
}

/* Whether appending to slot at len writes into a page other slots hold: the
 * caches then copy it (kvq_cache.h), which takes one more page. */
static int cow_page(const kvq_batch *b, int slot, size_t len)
{
    return len % b->page_tokens && b->refs[b->pid[(size_t)slot * b->per_seq + len / b->page_tokens]] > 1;
}

/* The caches copied the shared page slot's next token lands in. */
static void cow_commit(kvq_batch *b, int slot, size_t len)
{
    if (cow_page(b, slot, len)) {
        unref_page(b, b->pid[(size_t)slot * b->per_seq + len / b->page_tokens]);
        take_page(b, slot, len / b->page_tokens);
    }
}

/* The ids of slot growing from len to len + n tokens (pages checked). */
static void grow_pages(kvq_batch *b, int slot, size_t len, size_t n)
{
    if (n)
        cow_commit(b, slot, len);
    for (size_t i = kvq_batch_pages_for(b, len); i < kvq_batch_pages_for(b, len + n); i++)
        take_page(b, slot, i);
}

/* Pool size and per-layer cache configs from the budget: every slot's f16
 * buffers first, then whole pages of page_tokens tokens in every layer. */
static kvq_status plan_pool(kvq_batch *b, struct kvq_cache_config *ccs, kvq_error *err)
{
    const struct kvq_model_config *c = &b->m->cfg;
    size_t page_set = 0, fixed = 0, *page_l = calloc((size_t)c->n_layers, sizeof *page_l);
    if (!page_l)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    for (int l = 0; l < c->n_layers; l++) {
        struct kvq_cache_config *cc = &ccs[l];
        kvq_layer_cache_config(c, &b->cfg, l, b->max_ctx, cc);
        if (!kvq_type_traits(cc->type_k) || !kvq_type_traits(cc->type_v)) {
            free(page_l);
            return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "unknown cache type for layer %d", l);
        }
        cc->seed = kvq_seed_derive(b->cfg.seed, (uint64_t)l);
        b->page_tokens = (size_t)(cc->page_tokens ? cc->page_tokens : KVQ_DEFAULT_PAGE_TOKENS);
        size_t fx = kvq_cache_bytes_for(cc, 0), all = kvq_cache_bytes_for(cc, b->page_tokens);
        const size_t f16 = kvq_layer_f16_bytes(cc, b->cfg.device); /* fx, or the device cache's rows */
        size_t rk = kvq_type_row_bytes(cc->type_k, c->head_dim), rv = kvq_type_row_bytes(cc->type_v, c->head_dim);
        if (!all || all <= fx || !rk || !rv) {
            free(page_l);
            return kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "cache types %s/%s do not support head_dim %d",
                                 kvq_type_traits(cc->type_k)->name, kvq_type_traits(cc->type_v)->name, c->head_dim);
        }
        page_l[l] = all - fx;
        page_set += all - fx;
        fixed += f16;
        b->bytes_per_token += (rk + rv) * (size_t)c->n_kv_heads;
    }
    b->page_bytes = page_set;
    b->fixed_bytes = fixed * (size_t)b->max_seqs;
    const size_t per_seq = kvq_batch_pages_for(b, b->max_ctx);
    b->pages_total = per_seq * (size_t)b->max_seqs;
    if (b->cfg.kv_budget) {
        if (b->cfg.kv_budget < b->fixed_bytes || (b->cfg.kv_budget - b->fixed_bytes) / page_set == 0) {
            free(page_l);
            return kvq_error_set(err, KVQ_ERR_BUDGET,
                                 "a KV budget of %zu bytes does not hold %d slots' f16 buffers (%zu bytes) "
                                 "and one page (%zu bytes)",
                                 b->cfg.kv_budget, b->max_seqs, b->fixed_bytes, page_set);
        }
        size_t pool = (b->cfg.kv_budget - b->fixed_bytes) / page_set;
        b->pages_total = pool < b->pages_total ? pool : b->pages_total;
        /* a device store sizes its pool from max_bytes; host caches are held to it here */
        for (int l = 0; l < c->n_layers; l++)
            ccs[l].max_bytes = b->cfg.device == KVQ_DEVICE_CUDA ? b->pages_total * page_l[l] : 0;
    }
    free(page_l);
    return KVQ_OK;
}

kvq_status kvq_batch_create(const kvq_model *m, const struct kvq_batch_config *cfg, kvq_batch **out,
                            kvq_error *err)
{
    if (!m || !out)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_batch_create: NULL argument");
    struct kvq_batch_config bc;
    kvq_batch_config_default(&bc);
    if (cfg)
        bc = *cfg;
    const struct kvq_model_config *c = &m->cfg;
    if (bc.max_seqs < 1 || bc.max_rows < 0)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "max_seqs %d must be positive, max_rows %d not negative",
                             bc.max_seqs, bc.max_rows);
    if (bc.seq.max_ctx > (size_t)c->max_ctx)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "context %zu exceeds the model's maximum %d", bc.seq.max_ctx,
                             c->max_ctx);
    if (bc.seq.device != KVQ_DEVICE_CPU && bc.seq.device != KVQ_DEVICE_CUDA)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "unknown device %d", (int)bc.seq.device);
    if (bc.seq.recent_f16 < KVQ_WINDOW_AUTO || bc.seq.recent_f16 > 1 || bc.seq.sink_tokens < 0 ||
        bc.seq.sink_tokens > KVQ_CACHE_MAX_SINK_TOKENS)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "bad recent_f16 %d or sink_tokens %d", bc.seq.recent_f16,
                             bc.seq.sink_tokens);
    if (!kvq_seq_center_ok(&bc.seq, kvq_seq_window_for(&bc.seq, c->n_layers)))
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, KVQ_SEQ_CENTER_WHY);
    kvq_batch *b = calloc(1, sizeof *b);
    if (!b)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    b->m = m;
    b->cfg = bc.seq;
    b->cfg.recent_f16 = kvq_seq_window_for(&bc.seq, c->n_layers);
    b->max_seqs = bc.max_seqs;
    b->max_ctx = bc.seq.max_ctx ? bc.seq.max_ctx : (size_t)c->max_ctx;
    b->max_rows = bc.max_rows ? (size_t)bc.max_rows : DEFAULT_CHUNK + (size_t)bc.max_seqs;
    const size_t S = (size_t)bc.max_seqs;
    struct kvq_cache_config *ccs = calloc((size_t)c->n_layers, sizeof *ccs);
    kvq_status st = ccs ? plan_pool(b, ccs, err) : kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    if (st == KVQ_OK && (c->arch.sliding_window || c->arch.attn_scale > 0)) /* the store config has neither here */
        /* Said as the model's config.json feature and the command that does
         * run it, not the API names (the batch's users are kvq serve's). */
        st = kvq_error_set(err, KVQ_ERR_UNSUPPORTED,
                           "decoding several sequences at once (kvq serve) is not supported yet for %s models with "
                           "%s; one sequence at a time (kvq run) is",
                           c->model_type,
                           c->arch.sliding_window ? "sliding-window attention (config.json sliding_window)"
                                                  : "a custom attention scale (config.json query_pre_attn_scalar)");
    if (st == KVQ_OK && bc.seq.device == KVQ_DEVICE_CUDA && kvq_backend_cuda_refusal(m))
        st = kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "%s", kvq_backend_cuda_refusal(m));
    if (st == KVQ_OK) {
        struct kvq_kv_store_config kc = {.cfgs = ccs, .n_layers = c->n_layers, .max_seqs = bc.max_seqs,
                                         .n_heads = c->n_heads, .max_rows = b->max_rows,
                                         .v_norm_correct = bc.seq.v_norm_correct};
        st = bc.seq.device == KVQ_DEVICE_CUDA ? kvq_kv_store_cuda_create(&kc, &b->kv, err)
                                              : kvq_kv_store_cpu_create(&kc, &b->kv, err);
    }
    free(ccs);
    if (st == KVQ_OK) {
        const int cuda = bc.seq.device == KVQ_DEVICE_CUDA;
        st = cuda ? kvq_backend_cuda_create(m, b->max_rows, kvq_seq_backend_flags(&bc.seq), &b->be)
                  : kvq_backend_cpu_create(m, b->max_rows, &b->be);
        if (st != KVQ_OK)
            kvq_error_set(err, st, "cannot create the %s backend: %s", cuda ? "CUDA" : "CPU", kvq_status_str(st));
        else if (bc.seq.expert_cache) /* one cache for all slots: they share the backend */
            st = kvq_backend_cpu_expert_cache(b->be, bc.seq.expert_cache, err);
        if (st == KVQ_OK && b->kv->ops->attach)
            b->kv->ops->attach(b->kv, b->be->dev_stream, b->be->dev_step);
    }
    if (st != KVQ_OK) {
        kvq_batch_free(b);
        return st;
    }
    b->per_seq = kvq_batch_pages_for(b, b->max_ctx);
    b->n_ids = b->n_free = S * b->per_seq;
    b->pid = malloc(b->n_ids * sizeof *b->pid);
    b->refs = calloc(b->n_ids, sizeof *b->refs);
    b->free_ids = malloc(b->n_ids * sizeof *b->free_ids);
    for (size_t i = 0; b->free_ids && i < b->n_ids; i++)
        b->free_ids[i] = (uint32_t)(b->n_ids - 1 - i);
    b->taken = calloc(S, sizeof *b->taken);
    b->len = calloc(S, sizeof *b->len);
    b->mark = calloc(S, sizeof *b->mark);
    b->ids = malloc(b->max_rows * sizeof *b->ids);
    b->segs = malloc(S * sizeof *b->segs);
    b->seq_ids = malloc(S * sizeof *b->seq_ids);
    b->logits = malloc(S * (size_t)c->vocab * sizeof *b->logits);
    b->argmax = malloc(S * sizeof *b->argmax);
    b->out_rows = malloc(S * sizeof *b->out_rows);
    b->draw_rows = malloc(S * sizeof *b->draw_rows);
    b->draw_smp = malloc(S * sizeof *b->draw_smp);
    b->draw_u = malloc(S * sizeof *b->draw_u);
    b->draw_tok = malloc(S * sizeof *b->draw_tok);
    b->draw_st = malloc(S * sizeof *b->draw_st);
    int32_t *pos = malloc(b->max_rows * sizeof *pos);
    b->fwd = (struct kvq_fwd){m, b->be, b->kv, &b->tm, NULL, NULL, pos, b->seq_ids};
    if (!b->pid || !b->refs || !b->free_ids || b->n_ids > UINT32_MAX || !b->taken || !b->len || !b->mark || !b->ids || !b->segs || !b->seq_ids || !b->logits || !b->argmax || !b->out_rows || !b->draw_rows || !b->draw_smp || !b->draw_u || !b->draw_tok || !b->draw_st || !pos) {
        kvq_batch_free(b);
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory for the batch");
    }
    *out = b;
    return KVQ_OK;
}

void kvq_batch_free(kvq_batch *b)
{
    if (!b)
        return;
    kvq_kv_store_free(b->kv);
    kvq_backend_free(b->be);
    free(b->pid);
    free(b->refs);
    free(b->free_ids);
    free(b->taken);
    free(b->len);
    free(b->mark);
    free(b->ids);
    free(b->segs);
    free(b->seq_ids);
    free(b->logits);
    free(b->argmax);
    free(b->out_rows);
    free(b->draw_rows);
    free(b->draw_smp);
    free(b->draw_u);
    free(b->draw_tok);
    free(b->draw_st);
    free(b->fwd.pos);
    free(b);
}

kvq_status kvq_batch_add(kvq_batch *b, int *slot)
{
    if (!b || !slot)
        return KVQ_ERR_INVALID_ARG;
    for (int i = 0; i < b->max_seqs; i++)
        if (!b->taken[i]) {
            b->taken[i] = 1;
            b->len[i] = 0;
            b->active++;
            *slot = i;
            return KVQ_OK;
        }
    return KVQ_ERR_BUDGET;
}

static int valid(const kvq_batch *b, int slot)
{
    return b && slot >= 0 && slot < b->max_seqs && b->taken[slot];
}

kvq_status kvq_batch_truncate(kvq_batch *b, int slot, size_t n)
{
    if (!valid(b, slot) || n > b->len[slot])
        return KVQ_ERR_INVALID_ARG;
    b->kv->ops->truncate(b->kv, slot, b->m->cfg.n_layers, n);
    b->kv->ops->trim(b->kv, slot);
    for (size_t i = kvq_batch_pages_for(b, n); i < kvq_batch_pages_for(b, b->len[slot]); i++)
        unref_page(b, b->pid[(size_t)slot * b->per_seq + i]);
    b->len[slot] = n;
    return KVQ_OK;
}

void kvq_batch_remove(kvq_batch *b, int slot)
{
    if (!valid(b, slot))
        return;
    kvq_batch_truncate(b, slot, 0);
    b->kv->ops->reset(b->kv, slot);
    b->taken[slot] = 0;
    b->active--;
}

size_t kvq_batch_len(const kvq_batch *b, int slot)
{
    return valid(b, slot) ? b->len[slot] : 0;
}

/* Checks the items and counts rows and new pages; nothing changes. */
static kvq_status check_items(kvq_batch *b, const struct kvq_batch_item *items, int n_items, size_t *rows,
                              size_t *new_pages, kvq_error *err)
{
    const int32_t vocab = b->m->cfg.vocab;
    b->stamp++;
    *rows = *new_pages = 0;
    if (n_items < 1 || n_items > b->max_seqs)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "a step takes 1..%d items, not %d", b->max_seqs, n_items);
    for (int i = 0; i < n_items; i++) {
        const struct kvq_batch_item *it = &items[i];
        if (!valid(b, it->slot) || b->mark[it->slot] == b->stamp || !it->ids || it->n == 0)
            return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "item %d: free or repeated slot %d, or no tokens", i,
                                 it->slot);
        b->mark[it->slot] = b->stamp;
        if (!it->sampler != !it->token)
            return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "item %d: a sampler needs a token to write, and back",
                                 i);
        if (it->n > b->max_rows - *rows)
            return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "a step of more than %zu rows", b->max_rows);
        *rows += it->n;
        for (size_t t = 0; t < it->n; t++)
            if (it->ids[t] < 0 || it->ids[t] >= vocab)
                return kvq_error_set(err, KVQ_ERR_RANGE, "item %d: token id %d outside [0, %d)", i, it->ids[t],
                                     vocab);
        const size_t len = b->len[it->slot];
        if (it->n > b->max_ctx - len)
            return kvq_error_set(err, KVQ_ERR_CONTEXT_FULL, "slot %d: %zu + %zu tokens exceed the context %zu",
                                 it->slot, len, it->n, b->max_ctx);
        *new_pages += kvq_batch_pages_for(b, len + it->n) - kvq_batch_pages_for(b, len) + cow_page(b, it->slot, len);
    }
    if (*new_pages > b->pages_total - pages_used(b))
        return kvq_error_set(err, KVQ_ERR_BUDGET, "the step needs %zu pages, %zu of %zu are free", *new_pages,
                             b->pages_total - pages_used(b), b->pages_total);
    return KVQ_OK;
}

/* The end of the run of consecutive rows starting at rows[j], at most cap long. */
static int run_end(const size_t *rows, int n, int j, size_t cap)
{
    int k = j + 1;
    while (k < n && rows[k] == rows[k - 1] + 1 && (size_t)(k - j) < cap)
        k++;
    return k;
}

/* LM head over the wanted rows: runs of consecutive rows, at most
 * KVQ_MATVEC_MAX_M at a time on the CPU so that each row meets the kernel
 * it meets alone. outs[j] is the row of output j. */
static kvq_status head(kvq_batch *b, const size_t *outs, int n_out, int with_logits)
{
    const size_t h = (size_t)b->m->cfg.hidden, V = (size_t)b->m->cfg.vocab;
    const size_t cap = b->be->device ? b->max_rows : KVQ_MATVEC_MAX_M;
    kvq_status res = KVQ_OK;
    for (int j = 0; j < n_out;) {
        int k = run_end(outs, n_out, j, cap);
        kvq_status st = b->be->ops->lm_head(b->be, b->be->acts.x + outs[j] * h, (size_t)(k - j),
                                            with_logits ? b->logits + (size_t)j * V : NULL, b->argmax + j);
        if (st != KVQ_OK && res == KVQ_OK)
            res = st;
        j = k;
    }
    return res;
}

/* A token drawn where the logits are for each of the n rows b->draw_rows,
 * row j by b->draw_smp[j] at b->draw_u[j], in runs as head(). */
static kvq_status draw(kvq_batch *b, int n)
{
    const size_t h = (size_t)b->m->cfg.hidden;
    const size_t cap = b->be->device ? b->max_rows : KVQ_MATVEC_MAX_M;
    kvq_status res = KVQ_OK;
    for (int j = 0; j < n;) {
        int k = run_end(b->draw_rows, n, j, cap);
        kvq_status st = b->be->ops->lm_sample(b->be, b->be->acts.x + b->draw_rows[j] * h, (size_t)(k - j),
                                              b->draw_smp + j, b->draw_u + j, b->draw_tok + j, b->draw_st + j);
        for (int i = j; i < k; i++) {
            if (st != KVQ_OK) /* the device failed: no row has a token */
                b->draw_tok[i] = -1, b->draw_st[i] = st;
            if (b->draw_st[i] != KVQ_OK && res == KVQ_OK)
                res = b->draw_st[i];
        }
        j = k;
    }
    return res;
}

kvq_status kvq_batch_step(kvq_batch *b, const struct kvq_batch_item *items, int n_items, kvq_error *err)
{
    if (!b || !items)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_batch_step: NULL argument");
    size_t rows, new_pages;
    kvq_status st = check_items(b, items, n_items, &rows, &new_pages, err);
    if (st != KVQ_OK)
        return st;
    double t0 = kvq_now();
    /* With the recent window a failed chunk could not restore the f16 copies
     * it overwrote, so pages are taken before the first append (seq.c); a
     * copy on write is made here too, so that after a failed forward the
     * caches hold the copy whatever layer failed. */
    for (int i = 0; i < n_items; i++)
        if ((b->cfg.recent_f16 || cow_page(b, items[i].slot, b->len[items[i].slot])) &&
            (st = b->kv->ops->reserve(b->kv, items[i].slot, items[i].n)) != KVQ_OK) {
            for (int j = 0; j <= i; j++)
                b->kv->ops->trim(b->kv, items[j].slot);
            return kvq_error_set(err, st, "cannot reserve pages: %s", kvq_status_str(st));
        }
    size_t r = 0;
    int n_out = 0, with_logits = 0, n_draw = 0;
    size_t *out_rows = b->out_rows;
    for (int i = 0; i < n_items; i++) {
        const struct kvq_batch_item *it = &items[i];
        memcpy(b->ids + r, it->ids, it->n * sizeof *it->ids);
        b->segs[i] = (struct kvq_fwd_seg){it->slot, b->len[it->slot], it->n};
        r += it->n;
        if (it->logits || it->argmax)
            out_rows[n_out++] = r - 1;
        with_logits |= it->logits != NULL;
        if (it->sampler) {
            b->draw_rows[n_draw] = r - 1;
            b->draw_smp[n_draw] = it->sampler;
            kvq_sampler_peek(it->sampler, &b->draw_u[n_draw++], 1);
        }
    }
    st = kvq_forward_rows(&b->fwd, b->ids, b->segs, n_items);
    if (st != KVQ_OK) {
        for (int i = 0; i < n_items; i++) {
            b->kv->ops->trim(b->kv, items[i].slot);
            cow_commit(b, items[i].slot, b->len[items[i].slot]);
        }
        return kvq_error_set(err, st, "batched forward failed: %s", kvq_status_str(st));
    }
    for (int i = 0; i < n_items; i++) {
        grow_pages(b, items[i].slot, b->len[items[i].slot], items[i].n);
        b->len[items[i].slot] += items[i].n;
    }
    double t1 = kvq_now();
    st = head(b, out_rows, n_out, with_logits);
    kvq_status st_draw = draw(b, n_draw);
    st = st != KVQ_OK ? st : st_draw;
    b->tm.lm_head += kvq_now() - t1;
    for (int i = 0, j = 0; i < n_items; i++) {
        const struct kvq_batch_item *it = &items[i];
        if (!it->logits && !it->argmax)
            continue;
        if (it->logits)
            memcpy(it->logits, b->logits + (size_t)j * (size_t)b->m->cfg.vocab,
                   (size_t)b->m->cfg.vocab * sizeof *it->logits);
        if (it->argmax)
            *it->argmax = b->argmax[j];
        j++;
    }
    for (int i = 0, j = 0; i < n_items; i++) {
        const struct kvq_batch_item *it = &items[i];
        if (!it->sampler)
            continue;
        if (it->token)
            *it->token = b->draw_tok[j];
        if (b->draw_st[j] == KVQ_OK)
            kvq_sampler_skip(it->sampler, 1);
        j++;
    }
    b->steps++;
    b->rows += rows;
    b->t_total += kvq_now() - t0;
    if (st != KVQ_OK)
        return kvq_error_set(err, st, "LM head: %s", kvq_status_str(st));
    return KVQ_OK;
}

kvq_status kvq_batch_share(kvq_batch *b, int dst, int src, size_t n, kvq_error *err)
{
    if (!valid(b, dst) || !valid(b, src) || dst == src || b->len[dst] != 0 || n > b->len[src] ||
        n % b->page_tokens)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG,
                             "share: slot %d must be taken and empty, slot %d taken and holding %zu tokens, a "
                             "multiple of the page (%zu)",
                             dst, src, n, b ? b->page_tokens : 0);
    if (!b->kv->ops->share)
        return kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "prefix sharing is not supported by the %s page pool yet",
                             b->be->device ? "CUDA" : "host");
    kvq_status st = b->kv->ops->share(b->kv, dst, src, n);
    if (st != KVQ_OK)
        return kvq_error_set(err, st, "cannot share %zu tokens of slot %d: %s", n, src, kvq_status_str(st));
    for (size_t i = 0; i < n / b->page_tokens; i++) {
        const uint32_t id = b->pid[(size_t)src * b->per_seq + i];
        if (b->refs[id]++ == 1)
            b->pages_shared++;
        b->pid[(size_t)dst * b->per_seq + i] = id;
    }
    b->len[dst] = n;
    return KVQ_OK;
}

void kvq_batch_page_counts(const kvq_batch *b, size_t *used, size_t *shared, size_t *refs)
{
    size_t r = 0;
    for (int i = 0; b && i < b->max_seqs; i++)
        r += b->taken[i] ? kvq_batch_pages_for(b, b->len[i]) : 0;
    if (used)
        *used = b ? pages_used(b) : 0;
    if (shared)
        *shared = b ? b->pages_shared : 0;
    if (refs)
        *refs = r;
}

void kvq_batch_get_stats(const kvq_batch *b, struct kvq_batch_stats *st)
{
    memset(st, 0, sizeof *st);
    if (!b)
        return;
    st->max_seqs = b->max_seqs;
    st->active = b->active;
    st->max_rows = b->max_rows;
    st->max_ctx = b->max_ctx;
    st->page_tokens = b->page_tokens;
    st->page_bytes = b->page_bytes;
    st->pages_total = b->pages_total;
    kvq_batch_page_counts(b, &st->pages_used, &st->pages_shared, &st->page_refs);
    st->bytes_per_token = b->bytes_per_token;
    st->fixed_bytes = b->fixed_bytes;
    st->kv_budget = b->cfg.kv_budget;
    for (int i = 0; i < b->max_seqs; i++) {
        struct kvq_cache_stats cs;
        b->kv->ops->stats(b->kv, i, &cs);
        st->bytes_allocated += cs.bytes_allocated;
    }
    st->bytes_allocated -= (st->page_refs - st->pages_used) * b->page_bytes; /* each slot's caches count a shared page */
    st->steps = b->steps;
    st->rows = b->rows;
    st->t_matmul = b->tm.matmul;
    st->t_attn = b->tm.attn;
    st->t_lm_head = b->tm.lm_head;
    st->t_total = b->t_total;
}

kvq_status kvq_batch_fill(kvq_batch *b, int slot, size_t n, uint64_t seed)
{
    if (!b || slot < 0 || slot >= b->max_seqs || !b->taken[slot])
        return KVQ_ERR_INVALID_ARG;
    if (n > b->max_ctx - b->len[slot])
        return KVQ_ERR_CONTEXT_FULL;
    const size_t more =
        kvq_batch_pages_for(b, b->len[slot] + n) - kvq_batch_pages_for(b, b->len[slot]) + cow_page(b, slot, b->len[slot]);
    if (more > b->pages_total - pages_used(b))
        return KVQ_ERR_BUDGET;
    const struct kvq_model_config *c = &b->m->cfg;
    /* the rows of one chunk, reused for every chunk and layer: their values
     * do not change what a step costs; unit-variance K, V */
    const size_t kvd = (size_t)c->n_kv_heads * (size_t)c->head_dim, C = n < 4096 ? n : 4096;
    float *rows = malloc(2 * C * kvd * sizeof *rows);
    if (!rows)
        return KVQ_ERR_NOMEM;
    kvq_rng r;
    kvq_rng_init(&r, seed);
    for (size_t i = 0; i < 2 * C * kvd; i++)
        rows[i] = (float)kvq_rng_gauss(&r);
    float *k = rows, *v = rows + C * kvd;
    kvq_status st = KVQ_OK;
    void *dev = NULL;
    if (b->be->device) {
        st = kvq_cuda_malloc(&dev, 2 * C * kvd * sizeof *rows);
        if (st == KVQ_OK)
            st = kvq_cuda_memcpy_h2d(dev, rows, 2 * C * kvd * sizeof *rows);
        k = dev;
        v = (float *)dev + C * kvd;
    }
    size_t done = 0;
    for (; st == KVQ_OK && done < n; done += C) {
        const size_t m = n - done < C ? n - done : C;
        for (int l = 0; l < c->n_layers && st == KVQ_OK; l++)
            st = b->kv->ops->append(b->kv, l, 1, &slot, m, k, v);
        if (st != KVQ_OK)
            b->kv->ops->truncate(b->kv, slot, c->n_layers, b->len[slot] + done);
    }
    kvq_cuda_free(dev);
    free(rows);
    if (st != KVQ_OK)
        return st;
    grow_pages(b, slot, b->len[slot], n);
    b->len[slot] += n;
    return KVQ_OK;
}
