/* batch.c - slots of one KV store advanced together (kvq_batch.h): the one
 * engine, also under kvq_seq (a batch of one, slot 0: seq.c).
 *
 * The store holds max_seqs sequences; a step lays its items' tokens out as
 * consecutive rows, one forward segment per item (forward.c), and runs the
 * LM head on the last row of each item that wants an output (on each of the
 * last n_out rows of a verify item: speculative decoding). Pages are
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
    int can_share;             /* every layer's pages can be shared (no sliding window) */
    int can_rollback;          /* every layer keeps any truncation exact (no sliding window) */
    int32_t *ids;              /* [max_rows] a step's tokens */
    struct kvq_fwd_seg *segs;  /* [max_seqs] */
    int *seq_ids;              /* [max_seqs] */
    float *logits;             /* [max_seqs][vocab] */
    int32_t *argmax;           /* [max_seqs] */
    size_t *verify_rows;       /* [max_seqs * (KVQ_MAX_DRAFT + 1)] rows of items with n_out > 1 */
    int32_t *verify_tok;       /* [max_seqs * (KVQ_MAX_DRAFT + 1)] their greedy tokens */
    size_t *out_rows;          /* [max_seqs] rows whose LM head a step runs */
    /* [max_seqs * (KVQ_MAX_DRAFT + 1)]: a row per item with a sampler, n_out of a verify item */
    size_t *draw_rows;         /* rows a step draws a token for */
    kvq_sampler **draw_smp;    /* their samplers */
    double *draw_u;            /* the uniforms they draw at */
    int32_t *draw_tok;
    kvq_status *draw_st;
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

/* Layer l's budget share as its store takes it in a batch of one with
 * per-layer shares (kvq_seq): a device store sizes its pool from max_bytes
 * alone (it holds the f16 rows apart): the share's pages part; at least 1,
 * which holds no page and must not read as no limit. */
static size_t share_budget(const struct kvq_seq_config *sc, const struct kvq_layer_spec *specs, int n_layers, int l)
{
    const size_t share = kvq_layer_budget_share(specs, n_layers, sc->kv_budget, l), f16 = specs[l].state_bytes;
    if (!share || sc->device != KVQ_DEVICE_CUDA)
        return share;
    return share > f16 + 1 ? share - f16 : 1;
}

/* Pool size from the budget (the layers' specs): every slot's f16 buffers
 * first, then whole pages of page_tokens tokens in every layer. A windowed
 * layer is counted as if it kept every page (its ring holds fewer), so the
 * pool never promises more than the caches take. The device store sizes
 * its pool from max_bytes[l]; the host caches get no budget of their own
 * (0) and are held to the pool here. With shares (a batch of one under
 * kvq_seq) each layer's cache gets its share of the budget instead and the
 * pool is every page of the context. */
static kvq_status plan_pool(kvq_batch *b, const struct kvq_layer_spec *specs, int shares, size_t *max_bytes,
                            kvq_error *err)
{
    const struct kvq_model_config *c = &b->m->cfg;
    size_t page_set = 0, fixed = 0;
    b->can_share = 1;
    for (int l = 0; l < c->n_layers; l++) {
        b->page_tokens = specs[l].page_tokens;
        page_set += specs[l].page_bytes;
        fixed += specs[l].state_bytes;
        b->bytes_per_token += specs[l].token_bytes;
        b->can_share &= specs[l].can_share;
        b->can_rollback &= specs[l].can_rollback;
        max_bytes[l] = 0;
    }
    b->page_bytes = page_set;
    b->fixed_bytes = fixed * (size_t)b->max_seqs;
    const size_t per_seq = kvq_batch_pages_for(b, b->max_ctx);
    b->pages_total = per_seq * (size_t)b->max_seqs;
    if (shares) { /* each cache holds its share and refuses past it (KVQ_ERR_BUDGET) */
        for (int l = 0; l < c->n_layers; l++)
            max_bytes[l] = share_budget(&b->cfg, specs, c->n_layers, l);
    } else if (b->cfg.kv_budget) {
        if (b->cfg.kv_budget < b->fixed_bytes || (b->cfg.kv_budget - b->fixed_bytes) / page_set == 0)
            return kvq_error_set(err, KVQ_ERR_BUDGET,
                                 "a KV budget of %zu bytes does not hold %d slots' f16 buffers (%zu bytes) "
                                 "and one page (%zu bytes)",
                                 b->cfg.kv_budget, b->max_seqs, b->fixed_bytes, page_set);
        size_t pool = (b->cfg.kv_budget - b->fixed_bytes) / page_set;
        b->pages_total = pool < b->pages_total ? pool : b->pages_total;
        for (int l = 0; l < c->n_layers; l++)
            max_bytes[l] = b->cfg.device == KVQ_DEVICE_CUDA ? b->pages_total * specs[l].page_bytes : 0;
    }
    return KVQ_OK;
}

/* The engine of kvq_batch_create and of kvq_seq_create (a batch of one,
 * shares 1): sc resolved (kvq_engine_config). */
static kvq_status create(const kvq_model *m, const struct kvq_seq_config *sc, size_t max_ctx, int max_seqs,
                         size_t max_rows, int shares, kvq_batch **out, kvq_error *err)
{
    const struct kvq_model_config *c = &m->cfg;
    kvq_batch *b = calloc(1, sizeof *b);
    if (!b)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    b->m = m;
    b->cfg = *sc;
    b->max_seqs = max_seqs;
    b->max_ctx = max_ctx;
    b->max_rows = max_rows;
    b->can_rollback = 1;
    const size_t S = (size_t)max_seqs;
    struct kvq_layer_spec *specs = malloc((size_t)c->n_layers * sizeof *specs);
    size_t *max_bytes = malloc((size_t)c->n_layers * sizeof *max_bytes);
    kvq_status st = specs && max_bytes ? kvq_layers_plan(c, sc, max_ctx, NULL, specs, err)
                                       : kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    if (st == KVQ_OK)
        st = plan_pool(b, specs, shares, max_bytes, err);
    if (st == KVQ_OK)
        st = kvq_engine_open(m, sc, max_ctx, max_seqs, max_rows, specs, max_bytes, &b->kv, &b->be, err);
    free(specs);
    free(max_bytes);
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
    b->verify_rows = malloc(S * (KVQ_MAX_DRAFT + 1) * sizeof *b->verify_rows);
    b->verify_tok = malloc(S * (KVQ_MAX_DRAFT + 1) * sizeof *b->verify_tok);
    b->out_rows = malloc(S * sizeof *b->out_rows);
    b->draw_rows = malloc(S * (KVQ_MAX_DRAFT + 1) * sizeof *b->draw_rows);
    b->draw_smp = malloc(S * (KVQ_MAX_DRAFT + 1) * sizeof *b->draw_smp);
    b->draw_u = malloc(S * (KVQ_MAX_DRAFT + 1) * sizeof *b->draw_u);
    b->draw_tok = malloc(S * (KVQ_MAX_DRAFT + 1) * sizeof *b->draw_tok);
    b->draw_st = malloc(S * (KVQ_MAX_DRAFT + 1) * sizeof *b->draw_st);
    int32_t *pos = malloc(b->max_rows * sizeof *pos);
    b->fwd = (struct kvq_fwd){m, b->be, b->kv, &b->tm, NULL, NULL, pos, b->seq_ids};
    if (!b->pid || !b->refs || !b->free_ids || b->n_ids > UINT32_MAX || !b->taken || !b->len || !b->mark || !b->ids || !b->segs || !b->seq_ids || !b->logits || !b->argmax || !b->verify_rows || !b->verify_tok || !b->out_rows || !b->draw_rows || !b->draw_smp || !b->draw_u || !b->draw_tok || !b->draw_st || !pos) {
        kvq_batch_free(b);
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory for the batch");
    }
    *out = b;
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
    if (bc.max_seqs < 1 || bc.max_rows < 0)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "max_seqs %d must be positive, max_rows %d not negative",
                             bc.max_seqs, bc.max_rows);
    struct kvq_seq_config sc;
    size_t max_ctx;
    kvq_status st = kvq_engine_config(&m->cfg, &bc.seq, &sc, &max_ctx, err);
    if (st != KVQ_OK)
        return st;
    const size_t rows = bc.max_rows ? (size_t)bc.max_rows : (size_t)kvq_default_max_chunk(sc.device) + (size_t)bc.max_seqs;
    return create(m, &sc, max_ctx, bc.max_seqs, rows, 0, out, err);
}

kvq_status kvq_batch_create_one(const kvq_model *m, const struct kvq_seq_config *sc, size_t max_ctx,
                                size_t max_rows, kvq_batch **out, kvq_error *err)
{
    kvq_status st = create(m, sc, max_ctx, 1, max_rows, 1, out, err);
    if (st == KVQ_OK)
        kvq_batch_add(*out, &(int){0});
    return st;
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
    free(b->verify_rows);
    free(b->verify_tok);
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
        if (it->n_out > 1 && (it->n_out > it->n || it->n_out > KVQ_MAX_DRAFT + 1 || !it->argmax == !it->sampler ||
                              it->logits))
            return kvq_error_set(err, KVQ_ERR_INVALID_ARG,
                                 "item %d: outputs for %zu rows take argmax or a sampler (not both, no logits), for "
                                 "at most %d and n (%zu) rows",
                                 i, it->n_out, KVQ_MAX_DRAFT + 1, it->n);
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
static kvq_status head(kvq_batch *b, const size_t *outs, int n_out, int with_logits, int32_t *argmax)
{
    const size_t h = (size_t)b->m->cfg.hidden, V = (size_t)b->m->cfg.vocab;
    const size_t cap = b->be->device ? b->max_rows : KVQ_MATVEC_MAX_M;
    kvq_status res = KVQ_OK;
    for (int j = 0; j < n_out;) {
        int k = run_end(outs, n_out, j, cap);
        kvq_status st = b->be->ops->lm_head(b->be, b->be->acts.x + outs[j] * h, (size_t)(k - j),
                                            with_logits ? b->logits + (size_t)j * V : NULL, argmax + j);
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
    int n_out = 0, with_logits = 0, n_draw = 0, n_verify = 0;
    size_t *out_rows = b->out_rows;
    for (int i = 0; i < n_items; i++) {
        const struct kvq_batch_item *it = &items[i];
        memcpy(b->ids + r, it->ids, it->n * sizeof *it->ids);
        b->segs[i] = (struct kvq_fwd_seg){it->slot, b->len[it->slot], it->n};
        r += it->n;
        const size_t outs = it->n_out > 1 ? it->n_out : 1; /* rows r - outs .. r - 1 */
        if (it->n_out > 1 && it->argmax)
            for (size_t j = 0; j < outs; j++)
                b->verify_rows[n_verify++] = r - outs + j;
        else if (it->logits || it->argmax)
            out_rows[n_out++] = r - 1;
        with_logits |= it->logits != NULL;
        if (it->sampler) { /* row j at the sampler's j-th next uniform */
            kvq_sampler_peek(it->sampler, &b->draw_u[n_draw], (int)outs);
            for (size_t j = 0; j < outs; j++) {
                b->draw_rows[n_draw] = r - outs + j;
                b->draw_smp[n_draw++] = it->sampler;
            }
        }
    }
    st = kvq_forward_rows(&b->fwd, b->ids, b->segs, n_items);
    if (st != KVQ_OK) {
        for (int i = 0; i < n_items; i++) {
            b->kv->ops->trim(b->kv, items[i].slot);
            cow_commit(b, items[i].slot, b->len[items[i].slot]);
        }
        const char *why = st == KVQ_ERR_IO ? kvq_backend_cpu_expert_error(b->be) : NULL;
        if (why)
            return kvq_error_set(err, st, "reading experts from the checkpoint failed: %s", why);
        return kvq_error_set(err, st, "batched forward failed: %s", kvq_status_str(st));
    }
    for (int i = 0; i < n_items; i++) {
        grow_pages(b, items[i].slot, b->len[items[i].slot], items[i].n);
        b->len[items[i].slot] += items[i].n;
    }
    double t1 = kvq_now();
    st = head(b, out_rows, n_out, with_logits, b->argmax);
    kvq_status st_verify = head(b, b->verify_rows, n_verify, 0, b->verify_tok);
    st = st != KVQ_OK ? st : st_verify;
    kvq_status st_draw = draw(b, n_draw);
    st = st != KVQ_OK ? st : st_draw;
    b->tm.lm_head += kvq_now() - t1;
    for (int i = 0, j = 0; i < n_items; i++) {
        const struct kvq_batch_item *it = &items[i];
        if (it->n_out > 1 && it->argmax) {
            memcpy(it->argmax, b->verify_tok + j, it->n_out * sizeof *it->argmax);
            j += (int)it->n_out;
        }
    }
    for (int i = 0, j = 0; i < n_items; i++) {
        const struct kvq_batch_item *it = &items[i];
        if ((!it->logits && !it->argmax) || it->n_out > 1)
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
        if (it->n_out > 1) { /* the caller skips the draws it keeps (kvq_batch_item) */
            memcpy(it->token, b->draw_tok + j, it->n_out * sizeof *it->token);
            j += (int)it->n_out;
            continue;
        }
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
    if (!b->can_share || !b->kv->ops->share)
        return kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "prefix sharing is not supported %s yet",
                             !b->can_share ? "for sliding-window layers" : "by this page pool");
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
    st->can_share = b->can_share;
    st->can_rollback = b->can_rollback;
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
    kvq_backend_gpu_parts(b->be, &st->gpu_matmul, &st->gpu_attn, &st->gpu_lm_head, &st->gpu_other);
    kvq_backend_cpu_expert_stats(b->be, &st->experts);
}

/* ---- the batch of one under kvq_seq (decoder_internal.h) ------------- */

kvq_status kvq_batch_chunk(kvq_batch *b, int slot, const int32_t *ids, size_t T)
{
    const struct kvq_fwd_seg seg = {slot, b->len[slot], T};
    kvq_status st = kvq_forward_rows(&b->fwd, ids, &seg, 1);
    if (st != KVQ_OK)
        return st;
    grow_pages(b, slot, b->len[slot], T);
    b->len[slot] += T;
    return KVQ_OK;
}

void kvq_batch_rollback(kvq_batch *b, int slot, size_t n)
{
    b->kv->ops->truncate(b->kv, slot, b->m->cfg.n_layers, n);
    for (size_t i = kvq_batch_pages_for(b, n); i < kvq_batch_pages_for(b, b->len[slot]); i++)
        unref_page(b, b->pid[(size_t)slot * b->per_seq + i]);
    b->len[slot] = n;
}

void kvq_batch_set_hook(kvq_batch *b, kvq_qkv_hook fn, void *user)
{
    b->fwd.hook = fn;
    b->fwd.hook_user = user;
}

struct kvq_backend *kvq_batch_backend(const kvq_batch *b)
{
    return b->be;
}

struct kvq_kv_store *kvq_batch_store(const kvq_batch *b)
{
    return b->kv;
}

struct kvq_seq_timers *kvq_batch_timers(kvq_batch *b)
{
    return &b->tm;
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
