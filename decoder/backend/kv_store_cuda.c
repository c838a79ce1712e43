/* kv_store_cuda.c - the KV store on the GPU: one kvq_cuda_cache per layer.
 *
 * Each layer's device cache holds the store's sequences in one page pool
 * (kvq_cuda.h), appended by the GPU encoder (bit-identical to the CPU
 * encoder) and attended by the fused kernel where it applies, the reference
 * kernel elsewhere. A decode step of several sequences is one batched append
 * and one batched attend per layer. A prefill chunk is appended in one call
 * and attended causally by the prefill kernel (kvq_cuda_cache_prefill: the
 * chunk's queries together on tensor cores, every key tile read once per 128
 * query rows); at head dims 64 and 128 through the dense path, with one
 * kvq_cuda_prefill_ws for all layers: the past decoded into f16 rows 32K
 * positions at a time and attended as plain FlashAttention, 2.3-3x the tile
 * kernel's speed over long pasts (docs/attention-cuda.md). Where that does not apply (f32 caches, V with QJL signs, head
 * dims other than 32/64/96/128/256, short chunks) the decode kernel attends
 * with one entry per position over the growing prefixes
 * (kvq_cuda_cache_attend_prefix); with the recent-token f16 window such a
 * chunk goes in pieces that end on page ends: the device ring holds the page
 * being filled, so every position of the chunk sees its page's rows in f16,
 * as on the CPU.
 *
 * Not on the device yet, refused at create with one line
 * (kvq_kv_store_cuda_supports): sliding windows, the value-norm correction.
 * A custom attention scale (Gemma's query_pre_attn_scalar) is every
 * kernel's scale argument.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_store.h"
#include "kvq_cuda.h"
#include "kvq_layout.h"

/* Chunks from this many rows on take the prefill kernel (kvq_cuda_cache_prefill):
 * its blocks hold 64-128 query rows, so a shorter chunk would leave most idle. */
enum { PREFILL_MIN_ROWS = 64 };
/* Positions of the past the dense prefill path decodes at a time: 128 MiB
 * of f16 K/V scratch at 8 KV heads x 128 dims; a 128K past goes in 4. */
#define PREFILL_SEG ((size_t)32768)

/* The past's positions the scratch holds at a time: the context, whole
 * blocks of PREFILL_MIN_ROWS, at most PREFILL_SEG. */
static size_t prefill_seg(size_t max_tokens)
{
    size_t seg = max_tokens + PREFILL_MIN_ROWS - 1;
    seg -= seg % PREFILL_MIN_ROWS;
    return seg < PREFILL_SEG ? seg : PREFILL_SEG;
}

size_t kvq_kv_store_cuda_scratch_bytes(int n_kv, int n_heads, int head_dim, size_t max_rows, size_t max_tokens)
{
    if (max_rows < PREFILL_MIN_ROWS || (head_dim != 64 && head_dim != 128))
        return 0;
    return kvq_cuda_prefill_ws_bytes(n_kv, n_heads, head_dim, max_rows, prefill_seg(max_tokens));
}

struct cuda_store {
    struct kvq_kv_store base;
    kvq_cuda_cache **caches; /* [n_layers] */
    int *rep;                /* [max_rows] one sequence id, repeated: a prefill chunk's entries */
    size_t *lens;            /* [max_rows] their causal prefix lengths */
    size_t max_rows;
    size_t page;             /* with the window: a chunk's pieces end on multiples of it; else 0 */
    int n_kv, n_heads, head_dim;
    size_t row_bytes;        /* K + V bytes of one token of one layer, all KV heads */
    float scale;             /* of the attention scores: 1 / sqrt(head_dim), or the config's */
    kvq_cuda_prefill_ws *pws; /* the dense prefill path's scratch, lent to every layer (one stream) */
};

static kvq_status cuda_append_attend(kvq_kv_store *base, int layer, int n_seqs, const int *seqs, size_t T,
                                     const float *k, float *v, const float *q, float *out)
{
    struct cuda_store *s = (struct cuda_store *)base;
    kvq_cuda_cache *c = s->caches[layer];
    const size_t kvd = (size_t)s->n_kv * s->head_dim, qd = (size_t)s->n_heads * s->head_dim;
    const float scale = s->scale;
    if (T == 1) {
        kvq_status st = kvq_cuda_cache_append_batch(c, n_seqs, seqs, k, v);
        if (st != KVQ_OK)
            return st;
        st = kvq_cuda_cache_attend(c, n_seqs, seqs, q, s->n_heads, scale, out, NULL);
        if (st != KVQ_OK)
            for (int i = 0; i < n_seqs; i++)
                kvq_cuda_cache_truncate(c, seqs[i], kvq_cuda_cache_len(c, seqs[i]) - 1);
        return st;
    }
    /* a chunk: appended and attended causally, by the prefill kernel where it
     * applies, else at once and then by T entries of the sequence over
     * growing prefixes */
    if (T > s->max_rows)
        return KVQ_ERR_INVALID_ARG;
    const int chunk_kernel = T >= PREFILL_MIN_ROWS && kvq_cuda_prefill_supported(c, s->n_heads);
    for (int i = 0; i < n_seqs; i++) {
        const int seq = seqs[i];
        const size_t pos0 = kvq_cuda_cache_len(c, seq);
        kvq_status st = KVQ_OK;
        if (chunk_kernel)
            st = kvq_cuda_cache_prefill(c, seq, T, k + (size_t)i * T * kvd, v + (size_t)i * T * kvd,
                                        q + (size_t)i * T * qd, s->n_heads, scale, out + (size_t)i * T * qd);
        for (size_t t0 = 0, n = 0; t0 < T && st == KVQ_OK && !chunk_kernel; t0 += n) {
            const size_t room = s->page ? s->page - (pos0 + t0) % s->page : T, r = (size_t)i * T + t0;
            n = T - t0 < room ? T - t0 : room;
            st = kvq_cuda_cache_append(c, seq, n, k + r * kvd, v + r * kvd);
            for (size_t t = 0; t < n; t++) {
                s->rep[t] = seq;
                s->lens[t] = pos0 + t0 + t + 1;
            }
            if (st == KVQ_OK)
                st = kvq_cuda_cache_attend_prefix(c, (int)n, s->rep, s->lens, q + r * qd, s->n_heads, scale,
                                                  out + r * qd, NULL);
        }
        if (st != KVQ_OK) { /* all or nothing over the call's sequences */
            kvq_cuda_cache_truncate(c, seq, pos0);
            for (int j = 0; j < i; j++)
                kvq_cuda_cache_truncate(c, seqs[j], kvq_cuda_cache_len(c, seqs[j]) - T);
            return st;
        }
    }
    return KVQ_OK;
}

static kvq_status cuda_append(kvq_kv_store *base, int layer, int n_seqs, const int *seqs, size_t T, const float *k,
                              const float *v)
{
    struct cuda_store *s = (struct cuda_store *)base;
    const size_t kvd = (size_t)s->n_kv * s->head_dim;
    for (int i = 0; i < n_seqs; i++) {
        kvq_status st = kvq_cuda_cache_append(s->caches[layer], seqs[i], T, k + (size_t)i * T * kvd,
                                              v + (size_t)i * T * kvd);
        if (st != KVQ_OK)
            return st;
    }
    return KVQ_OK;
}

/* The pages the next n tokens land in, in every layer (all or nothing). */
static kvq_status cuda_reserve(kvq_kv_store *base, int seq, size_t n)
{
    struct cuda_store *s = (struct cuda_store *)base;
    for (int l = 0; l < base->n_layers; l++) {
        kvq_status st = kvq_cuda_cache_reserve(s->caches[l], seq, n);
        if (st != KVQ_OK) {
            for (int j = 0; j <= l; j++) /* the pages beyond the length go back */
                kvq_cuda_cache_truncate(s->caches[j], seq, kvq_cuda_cache_len(s->caches[j], seq));
            return st;
        }
    }
    return KVQ_OK;
}

static void cuda_attach(kvq_kv_store *base, void *stream, void *step)
{
    struct cuda_store *s = (struct cuda_store *)base;
    for (int l = 0; l < base->n_layers; l++) {
        kvq_cuda_cache_set_stream(s->caches[l], stream);
        kvq_cuda_cache_set_step(s->caches[l], (kvq_cuda_step *)step);
    }
}

static void cuda_truncate(kvq_kv_store *base, int seq, int n_layers, size_t n)
{
    struct cuda_store *s = (struct cuda_store *)base;
    for (int l = 0; l < n_layers; l++)
        if (kvq_cuda_cache_len(s->caches[l], seq) > n)
            kvq_cuda_cache_truncate(s->caches[l], seq, n);
}

static void cuda_reset(kvq_kv_store *base, int seq)
{
    cuda_truncate(base, seq, base->n_layers, 0);
}

/* Truncation already returns a device sequence's pages to the layer's pool. */
static void cuda_trim(kvq_kv_store *base, int seq)
{
    (void)base;
    (void)seq;
}

static kvq_status cuda_share(kvq_kv_store *base, int dst, int src, size_t n)
{
    struct cuda_store *s = (struct cuda_store *)base;
    for (int l = 0; l < base->n_layers; l++) {
        const kvq_status st = kvq_cuda_cache_share(s->caches[l], dst, src, n);
        if (st != KVQ_OK) {
            cuda_reset(base, dst);
            return st;
        }
    }
    return KVQ_OK;
}

static void cuda_stats(const kvq_kv_store *base, int seq, struct kvq_cache_stats *sum)
{
    const struct cuda_store *s = (const struct cuda_store *)base;
    memset(sum, 0, sizeof *sum);
    for (int l = 0; l < base->n_layers; l++) {
        const struct kvq_page_layout *pl = kvq_cuda_cache_layout(s->caches[l]);
        const size_t len = kvq_cuda_cache_len(s->caches[l], seq);
        const size_t pages = (len + pl->page_tokens - 1) / pl->page_tokens;
        sum->tokens = len;
        sum->pages += pages;
        sum->page_bytes = pl->page_bytes;
        sum->bytes_allocated += pages * pl->page_bytes;
        sum->bytes_used += len * s->row_bytes;
        sum->bytes_f16 += len * (size_t)s->n_kv * 2 * (size_t)s->head_dim * 2;
    }
}

static const kvq_cache *cuda_cache(const kvq_kv_store *base, int layer, int seq)
{
    (void)base;
    (void)layer;
    (void)seq;
    return NULL; /* the pages live on the device */
}

static void cuda_free_store(kvq_kv_store *base)
{
    struct cuda_store *s = (struct cuda_store *)base;
    for (int l = 0; s->caches && l < base->n_layers; l++)
        kvq_cuda_cache_free(s->caches[l]);
    free(s->caches);
    kvq_cuda_prefill_ws_free(s->pws);
    free(s->rep);
    free(s->lens);
    free(s);
}

static const struct kvq_kv_store_ops cuda_store_ops = {
    .append_attend = cuda_append_attend,
    .append = cuda_append,
    .reserve = cuda_reserve,
    .truncate = cuda_truncate,
    .reset = cuda_reset,
    .trim = cuda_trim,
    .share = cuda_share,
    .attach = cuda_attach,
    .stats = cuda_stats,
    .cache = cuda_cache,
    .free = cuda_free_store,
};

kvq_status kvq_kv_store_cuda_supports(const struct kvq_kv_store_config *cfg, kvq_error *err)
{
    /* Said as the model's config.json feature and what runs it: the users
     * of the message are the commands' (kvq run, kvq serve). */
    for (int l = 0; cfg->specs && l < cfg->n_layers; l++)
        if (cfg->specs[l].window)
            return kvq_error_set(err, KVQ_ERR_UNSUPPORTED,
                                 "sliding-window attention (config.json sliding_window %d, layer %d) is not on the "
                                 "GPU yet: --device cpu runs it",
                                 cfg->specs[l].window, l);
    if (cfg->v_norm_correct)
        return kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "the value-norm correction is not on the GPU yet");
    return KVQ_OK;
}

kvq_status kvq_kv_store_cuda_create(const struct kvq_kv_store_config *cfg, kvq_kv_store **out, kvq_error *err)
{
    if (!cfg || !cfg->cfgs || !cfg->specs || cfg->n_layers < 1 || cfg->max_seqs < 1 || !out)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_kv_store_cuda_create: bad arguments");
    const struct kvq_cache_config *c0 = &cfg->cfgs[0];
    kvq_status refused = kvq_kv_store_cuda_supports(cfg, err);
    if (refused != KVQ_OK)
        return refused;
    struct cuda_store *s = calloc(1, sizeof *s);
    if (!s || !(s->caches = calloc((size_t)cfg->n_layers, sizeof *s->caches)) ||
        !(s->rep = malloc(cfg->max_rows * sizeof *s->rep)) || !(s->lens = malloc(cfg->max_rows * sizeof *s->lens))) {
        if (s)
            cuda_free_store(&s->base);
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    }
    s->max_rows = cfg->max_rows;
    s->scale = cfg->attn_scale > 0 ? cfg->attn_scale : 1.0f / sqrtf((float)c0->head_dim);
    s->base.ops = &cuda_store_ops;
    s->base.n_layers = cfg->n_layers;
    s->base.max_seqs = cfg->max_seqs;
    s->n_kv = c0->n_kv_heads;
    s->n_heads = cfg->n_heads;
    s->head_dim = c0->head_dim;
    for (int l = 0; l < cfg->n_layers; l++) {
        struct kvq_cuda_cache_config cc;
        kvq_cuda_cache_config_default(&cc, c0->n_kv_heads, c0->head_dim, cfg->cfgs[l].max_tokens, cfg->max_seqs);
        cc.cache = cfg->cfgs[l];
        cc.max_q_per_kv = cfg->n_heads / c0->n_kv_heads;
        /* no per-append input check: it would cost one host synchronisation
         * per layer and step; a non-finite row makes non-finite logits,
         * which the LM head reports (KVQ_ERR_NONFINITE), as on the CPU */
        cc.check_input = 0;
        if (cfg->cfgs[l].max_bytes) { /* the layer's budget share, in whole pages */
            /* a page alone (the spec's page bytes): the f16 buffers (window,
             * sinks) the device holds apart are not in it; counted with them
             * the pool came out smaller than the batch's count */
            const size_t pb = cfg->specs[l].page_bytes;
            cc.pool_pages = pb ? cfg->cfgs[l].max_bytes / pb : 0;
            if (!cc.pool_pages) {
                cuda_free_store(&s->base);
                return kvq_error_set(err, KVQ_ERR_BUDGET, "the KV budget holds no page of layer %d", l);
            }
        }
        cc.cache.max_bytes = 0;
        kvq_status st = kvq_cuda_cache_create(&cc, &s->caches[l]);
        if (st != KVQ_OK) {
            cuda_free_store(&s->base);
            return kvq_error_set(err, st, "cannot create the device cache of layer %d: %s", l, kvq_status_str(st));
        }
        if (!kvq_cuda_cache_gpu_encodes(s->caches[l])) { /* else the first append would fail */
            const char *tk = kvq_type_traits(cc.cache.type_k)->name, *tv = kvq_type_traits(cc.cache.type_v)->name;
            cuda_free_store(&s->base);
            return kvq_error_set(err, KVQ_ERR_UNSUPPORTED,
                                 "cache types %s/%s of layer %d: the GPU encoder does not append them (it takes "
                                 "every type with a Hadamard rotation, or none)",
                                 tk, tv, l);
        }
        if (cc.cache.recent_f16) /* every layer has the same pages */
            s->page = kvq_cuda_cache_layout(s->caches[l])->page_tokens;
        if (l == 0)
            s->row_bytes = (kvq_type_row_bytes(cc.cache.type_k, c0->head_dim) +
                            kvq_type_row_bytes(cc.cache.type_v, c0->head_dim)) *
                           (size_t)c0->n_kv_heads;
    }
    /* the dense prefill path where the chunk kernel applies: one scratch for
     * all layers, PREFILL_SEG positions of the past at a time */
    if (kvq_kv_store_cuda_scratch_bytes(s->n_kv, s->n_heads, s->head_dim, cfg->max_rows, cfg->cfgs[0].max_tokens) &&
        kvq_cuda_prefill_supported(s->caches[0], s->n_heads)) {
        const size_t seg = prefill_seg(cfg->cfgs[0].max_tokens);
        kvq_status st = kvq_cuda_prefill_ws_create(s->n_kv, s->n_heads, s->head_dim, cfg->max_rows, seg, &s->pws);
        if (st != KVQ_OK) {
            cuda_free_store(&s->base);
            return kvq_error_set(err, st, "cannot create the prefill scratch (%zu bytes): %s",
                                 kvq_cuda_prefill_ws_bytes(s->n_kv, s->n_heads, s->head_dim, cfg->max_rows, seg),
                                 kvq_status_str(st));
        }
        for (int l = 0; l < cfg->n_layers; l++)
            kvq_cuda_cache_set_prefill_ws(s->caches[l], s->pws);
    }
    *out = &s->base;
    return KVQ_OK;
}
