/* cuda_cache.cu - the device cache: page pool, per-sequence page tables,
 * append (GPU encode), page copies between host and device.
 *
 * Page bookkeeping lives on the host (a free list and a host mirror of the
 * page tables); the device copy of a table entry is written when the page is
 * handed out, before any kernel can read it. Pages never move.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.cuh"
#include "cuda_ring.h"

struct kvq_dev_pages kvq_cu_pages_of(const kvq_cuda_cache *c)
{
    struct kvq_dev_pages p;
    p.pool = c->pool;
    p.page_bytes = c->layout.page_bytes;
    p.ptab = c->ptab_d;
    p.max_pages_per_seq = (uint32_t)c->max_pages_per_seq;
    p.page_tokens = c->layout.page_tokens;
    p.n_kv_heads = c->layout.n_kv_heads;
    p.dl = c->dev;
    return p;
}

/* ---- codec tables ---------------------------------------------------- */

static size_t rot_floats(const kvq_rotation *r)
{
    if (!r || r->kind != KVQ_ROT_HADAMARD)
        return 0;
    return (size_t)r->rounds * r->dim + (r->m > 1 ? (size_t)r->m * r->m : 0);
}

size_t kvq_cu_codec_table_floats(const kvq_codec *c)
{
    return rot_floats(c->rot) + rot_floats(c->qjl) + (c->levels > 0 ? 2 * (size_t)c->levels - 1 : 0);
}

static kvq_status rot_upload(const kvq_rotation *r, float **cursor, struct kvq_dev_rot *d)
{
    memset(d, 0, sizeof *d);
    if (!r)
        return KVQ_OK;
    d->kind = (int)r->kind;
    d->dim = r->dim;
    d->p = r->p;
    d->m = r->m;
    d->rounds = r->rounds;
    d->scale = r->scale;
    if (r->kind != KVQ_ROT_HADAMARD)
        return KVQ_OK;
    size_t ns = (size_t)r->rounds * r->dim;
    KVQ_CU_TRY(cudaMemcpy(*cursor, r->signs, ns * sizeof(float), cudaMemcpyHostToDevice));
    d->signs = *cursor;
    *cursor += ns;
    if (r->m > 1) {
        size_t nm = (size_t)r->m * r->m;
        KVQ_CU_TRY(cudaMemcpy(*cursor, r->mix, nm * sizeof(float), cudaMemcpyHostToDevice));
        d->mix = *cursor;
        *cursor += nm;
    }
    return KVQ_OK;
}

static int rot_gpu_exact(const kvq_rotation *r)
{
    return r && (r->kind == KVQ_ROT_HADAMARD || r->kind == KVQ_ROT_IDENTITY);
}

kvq_status kvq_cu_codec_upload(const kvq_codec *c, float *tables, struct kvq_dev_codec *d)
{
    memset(d, 0, sizeof *d);
    d->type = (int)c->cfg.type;
    d->dim = c->cfg.dim;
    d->bits = c->bits;
    d->qjl = c->traits->qjl;
    d->levels = c->levels;
    d->rotated = c->traits->rotated;
    d->in_rot = c->rot != NULL;
    d->base = kvq_layout_base_type(d->type);
    for (int i = 0; i < c->levels && i < KVQ_CUDA_TQ_MAX_LEVELS; i++)
        d->centroids[i] = c->centroids[i];
    for (int i = 0; i + 1 < c->levels && i < KVQ_CUDA_TQ_MAX_LEVELS - 1; i++)
        d->boundaries[i] = c->boundaries[i];
    d->kappa = c->qjl_kappa_f;
    float *cursor = tables;
    kvq_status st = rot_upload(c->rot, &cursor, &d->R);
    if (st == KVQ_OK)
        st = rot_upload(c->qjl, &cursor, &d->S);
    if (st != KVQ_OK)
        return st;
    if (c->levels > 0) {
        KVQ_CU_TRY(cudaMemcpy(cursor, c->centroids, (size_t)c->levels * sizeof(float), cudaMemcpyHostToDevice));
        KVQ_CU_TRY(cudaMemcpy(cursor + c->levels, c->boundaries, (size_t)(c->levels - 1) * sizeof(float),
                              cudaMemcpyHostToDevice));
        d->levels_d = cursor;
    }
    d->gpu_encode = (!c->rot || rot_gpu_exact(c->rot)) && (!d->qjl || rot_gpu_exact(c->qjl));
    return KVQ_OK;
}

/* d x d matrix M with y = M x, read off the host rotation column by column;
 * stored column-major (M[i][j] at j * d + i: the query prep reads it that
 * way, coalesced) or row-major (the output rotation reads M^T). */
static kvq_status dense_upload(const kvq_rotation *r, int d, int col_major, float *dst_dev)
{
    float *m = (float *)malloc((size_t)d * d * sizeof(float));
    float *e = (float *)calloc((size_t)d, sizeof(float));
    float *col = (float *)malloc((size_t)d * sizeof(float));
    if (!m || !e || !col) {
        free(m), free(e), free(col);
        return KVQ_ERR_NOMEM;
    }
    for (int j = 0; j < d; j++) {
        if (r) {
            e[j] = 1.0f;
            kvq_rotation_apply(r, e, col);
            e[j] = 0.0f;
        } else {
            for (int i = 0; i < d; i++)
                col[i] = i == j ? 1.0f : 0.0f;
        }
        for (int i = 0; i < d; i++)
            m[col_major ? (size_t)j * d + i : (size_t)i * d + j] = col[i];
    }
    cudaError_t err = cudaMemcpy(dst_dev, m, (size_t)d * d * sizeof(float), cudaMemcpyHostToDevice);
    free(m), free(e), free(col);
    return kvq_cuda_status_of(err);
}

/* ---- create / free --------------------------------------------------- */

void kvq_cuda_cache_config_default(struct kvq_cuda_cache_config *cfg, int n_kv_heads, int head_dim,
                                   size_t max_tokens, int max_seqs)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    kvq_cache_config_default(&cfg->cache, n_kv_heads, head_dim, max_tokens);
    cfg->max_seqs = max_seqs;
    cfg->pool_pages = 0;
    cfg->max_q_per_kv = 8;
    cfg->check_input = 1;
}

void kvq_cuda_cache_free(kvq_cuda_cache *c)
{
    if (!c)
        return;
    if (c->capture_stream) { /* a capture left open: discard it */
        cudaGraph_t graph = NULL;
        (void)kvq_cu_capture_end(c, &graph);
        if (graph)
            (void)cudaGraphDestroy(graph);
        (void)cudaGetLastError();
    }
    kvq_cu_attn_free(c);
    cudaFree(c->pool);
    cudaFree(c->ptab_d);
    cudaFree(c->tables_d);
    cudaFree(c->flag_d);
    cudaFree(c->tok_d);
    cudaFree(c->ov_k_d);
    cudaFree(c->ov_v_d);
    free(c->ring_lo);
    free(c->packed_len);
    free(c->ptab_h);
    free(c->len);
    free(c->n_pages);
    free(c->free_list);
    free(c->page_refs);
    free(c->tok_h);
    cudaFreeHost(c->tok_pin);
    kvq_cache_free(c->twin);
    free(c);
}

static kvq_status tok_reserve(kvq_cuda_cache *c, size_t n)
{
    if (n <= c->tok_cap)
        return KVQ_OK;
    size_t cap = c->tok_cap ? c->tok_cap : 256;
    while (cap < n)
        cap *= 2;
    /* per token: page, slot, sequence, override row; then up to cap + 2
     * key-centering jobs (kvq_cu_pack_job) */
    const size_t words = 4 * cap + 8 * (cap + 2);
    int32_t *h = (int32_t *)realloc(c->tok_h, words * sizeof(int32_t));
    if (!h)
        return KVQ_ERR_NOMEM;
    c->tok_h = h;
    cudaFree(c->tok_d);
    cudaFreeHost(c->tok_pin);
    c->tok_d = NULL;
    c->tok_pin = NULL;
    c->tok_cap = 0;
    KVQ_CU_TRY(cudaMalloc(&c->tok_d, words * sizeof(int32_t)));
    KVQ_CU_TRY(cudaHostAlloc(&c->tok_pin, words * sizeof(int32_t), cudaHostAllocDefault));
    c->tok_cap = cap;
    return KVQ_OK;
}

static kvq_status cache_init(kvq_cuda_cache *c)
{
    const struct kvq_cuda_cache_config *cfg = &c->cfg;
    kvq_status st = kvq_cache_create(&cfg->cache, &c->twin);
    if (st != KVQ_OK)
        return st;
    c->layout = *kvq_cache_layout(c->twin);
    if (kvq_dev_layout_init(&c->dev, &c->layout))
        return KVQ_ERR_INVALID_ARG;
    c->ck = kvq_cache_codec_k(c->twin);
    c->cv = kvq_cache_codec_v(c->twin);
    const size_t P = c->layout.page_tokens;
    const size_t max_tokens = cfg->cache.max_tokens;
    if (max_tokens / P + 1 > (size_t)INT32_MAX)
        return KVQ_ERR_INVALID_ARG;
    c->max_pages_per_seq = (max_tokens + P - 1) / P;
    size_t pool = cfg->pool_pages;
    if (pool == 0) {
        if (c->max_pages_per_seq > SIZE_MAX / (size_t)cfg->max_seqs)
            return KVQ_ERR_INVALID_ARG;
        pool = c->max_pages_per_seq * (size_t)cfg->max_seqs;
    }
    if (pool > (size_t)INT32_MAX || pool > SIZE_MAX / c->layout.page_bytes)
        return KVQ_ERR_INVALID_ARG;
    c->pool_pages = pool;

    const size_t ntab = (size_t)cfg->max_seqs * c->max_pages_per_seq;
    c->ptab_h = (int32_t *)malloc((ntab ? ntab : 1) * sizeof(int32_t));
    c->len = (size_t *)calloc((size_t)cfg->max_seqs, sizeof(size_t));
    c->n_pages = (size_t *)calloc((size_t)cfg->max_seqs, sizeof(size_t));
    c->free_list = (int32_t *)malloc(pool * sizeof(int32_t));
    c->page_refs = (uint32_t *)calloc(pool, sizeof(uint32_t));
    if (!c->ptab_h || !c->len || !c->n_pages || !c->free_list || !c->page_refs)
        return KVQ_ERR_NOMEM;
    for (size_t i = 0; i < ntab; i++)
        c->ptab_h[i] = 0;
    /* Hand out low pages first: the free list is a stack. */
    for (size_t i = 0; i < pool; i++)
        c->free_list[i] = (int32_t)(pool - 1 - i);
    c->n_free = pool;

    KVQ_CU_TRY(cudaMalloc(&c->pool, pool * c->layout.page_bytes));
    /* Zeroed pages: slots past a sequence's end always hold finite values. */
    KVQ_CU_TRY(cudaMemset(c->pool, 0, pool * c->layout.page_bytes));
    KVQ_CU_TRY(cudaMalloc(&c->ptab_d, (ntab ? ntab : 1) * sizeof(int32_t)));
    KVQ_CU_TRY(cudaMemset(c->ptab_d, 0, (ntab ? ntab : 1) * sizeof(int32_t)));
    KVQ_CU_TRY(cudaMalloc(&c->flag_d, sizeof(int)));

    /* f16 override rows: the sinks, and a ring that holds the page being
     * filled (cuda_ring.h) */
    c->sink_rows = cfg->cache.sink_tokens;
    c->ring = cfg->cache.recent_f16 ? (int)kvq_cu_ring_rows(P) : 0;
    c->ov_rows = c->sink_rows + c->ring;
    c->ring_lo = (size_t *)calloc((size_t)cfg->max_seqs, sizeof(size_t));
    c->center = cfg->cache.center_k;
    c->packed_len = (size_t *)calloc((size_t)cfg->max_seqs, sizeof(size_t));
    if (!c->ring_lo || !c->packed_len)
        return KVQ_ERR_NOMEM;
    if (c->ov_rows) {
        const size_t ov = (size_t)cfg->max_seqs * (size_t)c->ov_rows * (size_t)cfg->cache.n_kv_heads *
                          (size_t)cfg->cache.head_dim;
        KVQ_CU_TRY(cudaMalloc(&c->ov_k_d, ov * sizeof(uint16_t)));
        KVQ_CU_TRY(cudaMalloc(&c->ov_v_d, ov * sizeof(uint16_t)));
        KVQ_CU_TRY(cudaMemset(c->ov_k_d, 0, ov * sizeof(uint16_t)));
        KVQ_CU_TRY(cudaMemset(c->ov_v_d, 0, ov * sizeof(uint16_t)));
    }

    const int d = cfg->cache.head_dim;
    const size_t dense = (size_t)d * d;
    const size_t nk = kvq_cu_codec_table_floats(c->ck), nv = kvq_cu_codec_table_floats(c->cv);
    KVQ_CU_TRY(cudaMalloc(&c->tables_d, (nk + nv + 4 * dense) * sizeof(float)));
    st = kvq_cu_codec_upload(c->ck, c->tables_d, &c->dk);
    if (st == KVQ_OK)
        st = kvq_cu_codec_upload(c->cv, c->tables_d + nk, &c->dv);
    if (st != KVQ_OK)
        return st;
    c->rk_dense = c->tables_d + nk + nv;
    c->sk_dense = c->rk_dense + dense;
    c->rv_dense = c->sk_dense + dense;
    c->sv_dense = c->rv_dense + dense;
    st = dense_upload(c->dk.in_rot ? c->ck->rot : NULL, d, 1, c->rk_dense);
    if (st == KVQ_OK)
        st = dense_upload(c->dk.qjl ? c->ck->qjl : NULL, d, 1, c->sk_dense);
    if (st == KVQ_OK)
        st = dense_upload(c->dv.in_rot ? c->cv->rot : NULL, d, 0, c->rv_dense);
    if (st == KVQ_OK) /* tqBj values: the reference kernel adds their QJL residual */
        st = dense_upload(c->dv.qjl ? c->cv->qjl : NULL, d, 0, c->sv_dense);
    if (st == KVQ_OK)
        st = tok_reserve(c, cfg->max_seqs > 256 ? (size_t)cfg->max_seqs : 256); /* a step's appends never grow it */
    if (st == KVQ_OK)
        st = kvq_cu_attn_init(c);
    return st;
}

kvq_status kvq_cuda_cache_create(const struct kvq_cuda_cache_config *cfg, kvq_cuda_cache **out)
{
    if (!cfg || !out)
        return KVQ_ERR_INVALID_ARG;
    *out = NULL;
    if (cfg->max_seqs < 1 || cfg->max_seqs > (1 << 20) || cfg->max_q_per_kv < 0 ||
        cfg->max_q_per_kv > KVQ_ATTN_MAX_Q)
        return KVQ_ERR_INVALID_ARG;
    if (cfg->cache.sink_tokens < 0 || cfg->cache.sink_tokens > KVQ_CACHE_MAX_SINK_TOKENS)
        return KVQ_ERR_INVALID_ARG;
    if (kvq_cuda_require_device() != KVQ_OK)
        return KVQ_ERR_NO_DEVICE;
    kvq_cuda_cache *c = (kvq_cuda_cache *)calloc(1, sizeof *c);
    if (!c)
        return KVQ_ERR_NOMEM;
    c->cfg = *cfg;
    if (c->cfg.max_q_per_kv == 0)
        c->cfg.max_q_per_kv = 8;
    c->cfg.cache.max_bytes = 0;
    c->stream = 0;
    kvq_status st = cache_init(c);
    if (st != KVQ_OK) {
        (void)cudaGetLastError();
        kvq_cuda_cache_free(c);
        return st;
    }
    *out = c;
    return KVQ_OK;
}

const struct kvq_cuda_cache_config *kvq_cuda_cache_config_of(const kvq_cuda_cache *c)
{
    return c ? &c->cfg : NULL;
}

const struct kvq_page_layout *kvq_cuda_cache_layout(const kvq_cuda_cache *c)
{
    return c ? &c->layout : NULL;
}

void kvq_cuda_cache_set_stream(kvq_cuda_cache *c, void *stream)
{
    if (c)
        c->stream = (cudaStream_t)stream;
}

int kvq_cuda_cache_gpu_encodes(const kvq_cuda_cache *c)
{
    return c && c->dk.gpu_encode && c->dv.gpu_encode;
}

void kvq_cuda_cache_set_step(kvq_cuda_cache *c, kvq_cuda_step *s)
{
    if (c)
        c->step = s;
}

size_t kvq_cuda_cache_len(const kvq_cuda_cache *c, int seq)
{
    if (!c || seq < 0 || seq >= c->cfg.max_seqs)
        return 0;
    return c->len[seq];
}

size_t kvq_cuda_cache_free_pages(const kvq_cuda_cache *c)
{
    return c ? c->n_free : 0;
}

/* ---- page bookkeeping ------------------------------------------------ */

static int32_t *table_of(kvq_cuda_cache *c, int seq)
{
    return c->ptab_h + (size_t)seq * c->max_pages_per_seq;
}

static int32_t page_take(kvq_cuda_cache *c)
{
    const int32_t p = c->free_list[--c->n_free];
    c->page_refs[p] = 1;
    return p;
}

static void page_unref(kvq_cuda_cache *c, int32_t p)
{
    if (--c->page_refs[p] == 0)
        c->free_list[c->n_free++] = p;
}

/* Copy on write: page i of seq becomes its own if another sequence also
 * holds it (kvq_cuda_cache_share), before anything writes into it. */
static kvq_status own_page(kvq_cuda_cache *c, int seq, size_t i)
{
    int32_t *tab = table_of(c, seq);
    if (c->page_refs[tab[i]] <= 1)
        return KVQ_OK;
    if (c->n_free == 0)
        return KVQ_ERR_BUDGET;
    const int32_t p = page_take(c);
    const size_t pb = c->layout.page_bytes;
    KVQ_CU_TRY(cudaMemcpyAsync(c->pool + (size_t)p * pb, c->pool + (size_t)tab[i] * pb, pb, cudaMemcpyDeviceToDevice,
                               c->stream));
    page_unref(c, tab[i]);
    tab[i] = p;
    KVQ_CU_TRY(cudaMemcpyAsync(c->ptab_d + (size_t)seq * c->max_pages_per_seq + i, tab + i, sizeof(int32_t),
                               cudaMemcpyHostToDevice, c->stream));
    return KVQ_OK;
}

/* Pages seq lacks for `tokens` tokens (kvq_cuda_cache_reserve may have
 * taken more than its length needs). */
static size_t pages_short(const kvq_cuda_cache *c, int seq, size_t tokens)
{
    const size_t P = c->layout.page_tokens, want = (tokens + P - 1) / P;
    return want > c->n_pages[seq] ? want - c->n_pages[seq] : 0;
}

/* Gives seq enough pages for `tokens` tokens, from its length on (the
 * pages they land in made its own first). Device table updated. */
static kvq_status grow_pages(kvq_cuda_cache *c, int seq, size_t tokens)
{
    const size_t P = c->layout.page_tokens;
    const size_t want = (tokens + P - 1) / P, have = c->n_pages[seq];
    int32_t *tab = table_of(c, seq);
    int32_t *tab_d = c->ptab_d + (size_t)seq * c->max_pages_per_seq;
    for (size_t i = c->len[seq] / P; tokens > c->len[seq] && i < have && i < want; i++) {
        const kvq_status st = own_page(c, seq, i);
        if (st != KVQ_OK)
            return st;
    }
    if (want <= have)
        return KVQ_OK;
    if (want - have > c->n_free)
        return KVQ_ERR_BUDGET;
    for (size_t i = have; i < want; i++)
        tab[i] = page_take(c);
    c->n_pages[seq] = want;
    KVQ_CU_TRY(cudaMemcpyAsync(tab_d + have, tab + have, (want - have) * sizeof(int32_t), cudaMemcpyHostToDevice,
                               c->stream));
    return KVQ_OK;
}

static void shrink_pages(kvq_cuda_cache *c, int seq, size_t tokens)
{
    const size_t P = c->layout.page_tokens;
    const size_t keep = (tokens + P - 1) / P;
    int32_t *tab = table_of(c, seq);
    while (c->n_pages[seq] > keep)
        page_unref(c, tab[--c->n_pages[seq]]);
}

kvq_status kvq_cuda_cache_share(kvq_cuda_cache *c, int dst, int src, size_t n_tokens)
{
    if (!c || dst < 0 || src < 0 || dst >= c->cfg.max_seqs || src >= c->cfg.max_seqs || dst == src ||
        c->len[dst] != 0 || n_tokens > c->len[src] || n_tokens % c->layout.page_tokens)
        return KVQ_ERR_INVALID_ARG;
    const size_t k = n_tokens / c->layout.page_tokens;
    shrink_pages(c, dst, 0);
    int32_t *td = table_of(c, dst);
    const int32_t *ts = table_of(c, src);
    for (size_t i = 0; i < k; i++) {
        td[i] = ts[i];
        c->page_refs[td[i]]++;
    }
    c->n_pages[dst] = k;
    if (k)
        KVQ_CU_TRY(cudaMemcpyAsync(c->ptab_d + (size_t)dst * c->max_pages_per_seq, td, k * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, c->stream));
    const size_t sinks = n_tokens < (size_t)c->sink_rows ? n_tokens : (size_t)c->sink_rows;
    if (sinks) { /* a sequence's sink rows come first in its override rows */
        const size_t row = (size_t)c->cfg.cache.n_kv_heads * (size_t)c->cfg.cache.head_dim;
        const size_t per_seq = (size_t)c->ov_rows * row;
        KVQ_CU_TRY(cudaMemcpyAsync(c->ov_k_d + (size_t)dst * per_seq, c->ov_k_d + (size_t)src * per_seq,
                                   sinks * row * sizeof(uint16_t), cudaMemcpyDeviceToDevice, c->stream));
        KVQ_CU_TRY(cudaMemcpyAsync(c->ov_v_d + (size_t)dst * per_seq, c->ov_v_d + (size_t)src * per_seq,
                                   sinks * row * sizeof(uint16_t), cudaMemcpyDeviceToDevice, c->stream));
    }
    c->len[dst] = n_tokens;
    c->packed_len[dst] = n_tokens; /* whole pages: their keys are encoded */
    c->ring_lo[dst] = n_tokens; /* a whole-page view reads no recent copy, as on the CPU */
    return KVQ_OK;
}

kvq_status kvq_cuda_cache_truncate(kvq_cuda_cache *c, int seq, size_t n)
{
    if (!c || seq < 0 || seq >= c->cfg.max_seqs || n > c->len[seq])
        return KVQ_ERR_INVALID_ARG;
    c->len[seq] = n;
    c->packed_len[seq] = c->packed_len[seq] < n ? c->packed_len[seq] : n; /* a page keeps its mean */
    /* ring rows from n on are rewritten before anything reads them; rows
     * below ring_lo may be stale */
    c->ring_lo[seq] = c->ring_lo[seq] < n ? c->ring_lo[seq] : n;
    shrink_pages(c, seq, n);
    return KVQ_OK;
}

/* ---- append ---------------------------------------------------------- */

/* Override row of token pos of seq in an append ending at end (tokens
 * [.., end) of seq): its sink row, its ring row when it is among the ring's
 * last rows, else -1. */
static int32_t override_row(const kvq_cuda_cache *c, size_t pos, size_t end)
{
    if (pos < (size_t)c->sink_rows)
        return (int32_t)pos;
    if (c->ring && pos + (size_t)c->ring >= end)
        return c->sink_rows + (int32_t)(pos % (size_t)c->ring);
    return -1;
}

/* The ring's rows below end - ring were overwritten by an append ending at end. */
static void ring_advance(kvq_cuda_cache *c, int seq, size_t end)
{
    if (c->ring && end > (size_t)c->ring && c->ring_lo[seq] < end - (size_t)c->ring)
        c->ring_lo[seq] = end - (size_t)c->ring;
}

/* Key centering: the pack jobs (kvq_cu_pack_job) that bring seq's encoded
 * keys up to token end after an append of tokens [in_first, end), input rows
 * from in_row on; as the CPU's pack_keys, a page is packed when it fills, or
 * at once where it already has its mean (after a truncation into it).
 * @return the jobs written to jobs; *packed: the new packed length. */
static int plan_pack(const kvq_cuda_cache *c, int seq, size_t end, size_t in_first, int in_row,
                     kvq_cu_pack_job *jobs, size_t *packed)
{
    const size_t P = c->layout.page_tokens;
    const int32_t *tab = c->ptab_h + (size_t)seq * c->max_pages_per_seq;
    size_t pl = c->packed_len[seq];
    int n = 0;
    while (pl < end) {
        const size_t page = pl / P, p0 = page * P, stop = p0 + P < end ? p0 + P : end;
        const int fresh = pl == p0;
        if (fresh && p0 + P > end)
            break;
        jobs[n++] = kvq_cu_pack_job{seq, tab[page], (int32_t)p0, (int32_t)pl, (int32_t)stop, fresh,
                                     (int32_t)in_first, in_row};
        pl = stop;
    }
    *packed = pl;
    return n;
}

/* Encodes n tokens whose pages, slots, sequences and override rows the
 * caller put in tok_h ([0, n), [n, 2n), [2n, 3n), [3n, 4n)). With the input check on, the check kernel's verdict goes
 * to the encode kernel on the device (a refused input writes nothing), and
 * the one host synchronisation of the call comes after both.
 * @return KVQ_OK; KVQ_ERR_NONFINITE / KVQ_ERR_RANGE (nothing written). */
static kvq_status encode_mapped(kvq_cuda_cache *c, size_t n, const float *k, const float *v, int n_jobs)
{
    const int check = c->cfg.check_input;
    if (check) {
        KVQ_CU_TRY(cudaMemsetAsync(c->flag_d, 0, sizeof(int), c->stream));
        const kvq_status st = kvq_cu_check_rows(c, n, k, v, c->flag_d);
        if (st != KVQ_OK)
            return st;
    }
    /* tok_h is pageable on purpose: the driver stages the copy before this
     * returns, so the next call may rewrite tok_h at once (pinned memory with
     * an event guard measured no faster: docs/history/attention-cuda.md,
     * seventh pass). A step graph's copy reads its source when the graph
     * runs: pinned tok_pin, which no other call of the step rewrites. */
    const size_t words = c->ov_rows ? 4 * n + 8 * (size_t)n_jobs : 2 * n; /* jobs: center_k needs the ring */
    if (kvq_cuda_step_mode(c->step) != KVQ_CUDA_STEP_OFF) {
        if (check)
            return KVQ_ERR_INVALID_ARG;
        memcpy(c->tok_pin, c->tok_h, words * sizeof(int32_t));
        KVQ_CU_RET(kvq_cuda_step_copy(c->step, c->stream, c->tok_d, c->tok_pin, words * sizeof(int32_t)));
    } else {
        KVQ_CU_TRY(cudaMemcpyAsync(c->tok_d, c->tok_h, words * sizeof(int32_t), cudaMemcpyHostToDevice, c->stream));
    }
    /* the keys of filled pages first: they read ring rows the encode kernel may overwrite */
    kvq_status st = kvq_cu_pack_keys(c, n_jobs, reinterpret_cast<const kvq_cu_pack_job *>(c->tok_d + 4 * n), k,
                                     check ? c->flag_d : NULL);
    if (st == KVQ_OK)
        st = kvq_cu_encode_rows(c, n, k, v, c->tok_d, c->tok_d + n, c->tok_d + 2 * n, c->tok_d + 3 * n,
                                check ? c->flag_d : NULL);
    if (st != KVQ_OK || !check)
        return st;
    int flag = 0;
    KVQ_CU_TRY(cudaMemcpyAsync(&flag, c->flag_d, sizeof(int), cudaMemcpyDeviceToHost, c->stream));
    KVQ_CU_TRY(cudaStreamSynchronize(c->stream));
    return (flag & 1) ? KVQ_ERR_NONFINITE : (flag & 2) ? KVQ_ERR_RANGE : KVQ_OK;
}

kvq_status kvq_cuda_cache_append(kvq_cuda_cache *c, int seq, size_t n_tokens, const float *k_dev,
                                 const float *v_dev)
{
    if (!c || seq < 0 || seq >= c->cfg.max_seqs || (n_tokens && (!k_dev || !v_dev)) || c->capture_stream)
        return KVQ_ERR_INVALID_ARG;
    if (n_tokens == 0)
        return KVQ_OK;
    if (!c->dk.gpu_encode || !c->dv.gpu_encode)
        return KVQ_ERR_UNSUPPORTED;
    const size_t len = c->len[seq];
    if (n_tokens > c->cfg.cache.max_tokens - len)
        return KVQ_ERR_CONTEXT_FULL;
    if (pages_short(c, seq, len + n_tokens) > c->n_free)
        return KVQ_ERR_BUDGET;
    const size_t P = c->layout.page_tokens;
    size_t packed = 0;
    kvq_status st = tok_reserve(c, n_tokens);
    if (st == KVQ_OK)
        st = grow_pages(c, seq, len + n_tokens);
    if (st == KVQ_OK) {
        const int32_t *tab = table_of(c, seq);
        for (size_t i = 0; i < n_tokens; i++) {
            c->tok_h[i] = tab[(len + i) / P];
            c->tok_h[n_tokens + i] = (int32_t)((len + i) % P);
            c->tok_h[2 * n_tokens + i] = seq;
            c->tok_h[3 * n_tokens + i] = override_row(c, len + i, len + n_tokens);
        }
        int n_jobs = 0;
        if (c->center)
            n_jobs = plan_pack(c, seq, len + n_tokens, len, 0,
                               reinterpret_cast<kvq_cu_pack_job *>(c->tok_h + 4 * n_tokens), &packed);
        st = encode_mapped(c, n_tokens, k_dev, v_dev, n_jobs);
    }
    if (st != KVQ_OK) {
        shrink_pages(c, seq, len); /* all or nothing: the pages taken go back */
        return st;
    }
    if (c->center)
        c->packed_len[seq] = packed;
    c->len[seq] = len + n_tokens;
    ring_advance(c, seq, len + n_tokens);
    return KVQ_OK;
}

kvq_status kvq_cuda_cache_append_batch(kvq_cuda_cache *c, int n_seqs, const int *seqs, const float *k_dev,
                                       const float *v_dev)
{
    if (!c || n_seqs < 0 || (n_seqs && (!seqs || !k_dev || !v_dev)) || c->capture_stream)
        return KVQ_ERR_INVALID_ARG;
    if (n_seqs == 0)
        return KVQ_OK;
    if (!c->dk.gpu_encode || !c->dv.gpu_encode)
        return KVQ_ERR_UNSUPPORTED;
    const size_t P = c->layout.page_tokens;
    size_t new_pages = 0;
    for (int i = 0; i < n_seqs; i++) {
        int s = seqs[i];
        if (s < 0 || s >= c->cfg.max_seqs)
            return KVQ_ERR_INVALID_ARG;
        for (int j = 0; j < i; j++)
            if (seqs[j] == s)
                return KVQ_ERR_INVALID_ARG;
        if (c->len[s] >= c->cfg.cache.max_tokens)
            return KVQ_ERR_CONTEXT_FULL;
        new_pages += pages_short(c, s, c->len[s] + 1);
    }
    if (new_pages > c->n_free)
        return KVQ_ERR_BUDGET;
    kvq_status st = tok_reserve(c, (size_t)n_seqs);
    for (int i = 0; i < n_seqs && st == KVQ_OK; i++)
        st = grow_pages(c, seqs[i], c->len[seqs[i]] + 1);
    if (st == KVQ_OK) {
        for (int i = 0; i < n_seqs; i++) {
            size_t pos = c->len[seqs[i]];
            c->tok_h[i] = table_of(c, seqs[i])[pos / P];
            c->tok_h[n_seqs + i] = (int32_t)(pos % P);
            c->tok_h[2 * n_seqs + i] = seqs[i];
            c->tok_h[3 * n_seqs + i] = override_row(c, pos, pos + 1);
        }
        /* centring: one job per sequence, empty where no page fills, so that a
         * step graph's launch keeps its shape */
        kvq_cu_pack_job *jobs = reinterpret_cast<kvq_cu_pack_job *>(c->tok_h + 4 * (size_t)n_seqs);
        for (int i = 0; i < n_seqs && c->center; i++) {
            const size_t pos = c->len[seqs[i]];
            size_t packed;
            if (plan_pack(c, seqs[i], pos + 1, pos, i, jobs + i, &packed) == 0)
                jobs[i] = kvq_cu_pack_job{seqs[i], 0, 0, 0, 0, 0, 0, 0};
        }
        st = encode_mapped(c, (size_t)n_seqs, k_dev, v_dev, c->center ? n_seqs : 0);
    }
    if (st != KVQ_OK) {
        for (int i = 0; i < n_seqs; i++) /* all or nothing: the pages taken go back */
            shrink_pages(c, seqs[i], c->len[seqs[i]]);
        return st;
    }
    const kvq_cu_pack_job *jobs = reinterpret_cast<const kvq_cu_pack_job *>(c->tok_h + 4 * (size_t)n_seqs);
    for (int i = 0; i < n_seqs; i++) {
        if (c->center && jobs[i].to > jobs[i].from) /* the keys its job packed */
            c->packed_len[seqs[i]] = (size_t)jobs[i].to;
        c->len[seqs[i]]++;
        ring_advance(c, seqs[i], c->len[seqs[i]]);
    }
    return KVQ_OK;
}

kvq_status kvq_cuda_cache_reserve(kvq_cuda_cache *c, int seq, size_t n)
{
    if (!c || seq < 0 || seq >= c->cfg.max_seqs)
        return KVQ_ERR_INVALID_ARG;
    if (n > c->cfg.cache.max_tokens - c->len[seq])
        return KVQ_ERR_CONTEXT_FULL;
    return n ? grow_pages(c, seq, c->len[seq] + n) : KVQ_OK;
}

/* ---- page copies ----------------------------------------------------- */

/* Copies every row of page src to page dst, from the host layout to the
 * device layout (kvq_layout.h) when to_device, else back, turning 3-bit code
 * rows between the stream order and the device order on the way. */
static void page_convert(const kvq_cuda_cache *c, const uint8_t *src, uint8_t *dst, int to_device)
{
    const struct kvq_page_layout *L = &c->layout;
    /* the row views take writable pages; src is only read through them */
    uint8_t *host = to_device ? (uint8_t *)(uintptr_t)src : dst, *dev = to_device ? dst : (uint8_t *)(uintptr_t)src;
    for (int kv = 0; kv < 2; kv++) {
        const struct kvq_head_layout *hl = kv ? &L->v : &L->k;
        const struct kvq_row_fields f = kvq_layout_row_fields((int)hl->type, (int)hl->dim);
        const int dev_order = kvq_dev_order((int)hl->type);
        for (uint32_t h = 0; h < L->n_kv_heads; h++) {
            uint8_t *chunk = host + (kv ? L->v_off : L->k_off) + (size_t)h * hl->bytes;
            for (uint32_t s = 0; s < L->page_tokens; s++) {
                const struct kvq_row a = kvq_head_row(hl, chunk, s), b = kvq_dev_row(&c->dev, dev, kv, h, s);
                const struct kvq_row *from = to_device ? &a : &b, *to = to_device ? &b : &a;
                if (f.norm)
                    *to->norm = *from->norm;
                if (f.rnorm)
                    *to->rnorm = *from->rnorm;
                if (f.signs)
                    memcpy(to->signs, from->signs, f.signs);
                memcpy(to->codes, from->codes, f.codes);
                if (dev_order)
                    kvq_dev_order_row(to->codes, (int)hl->dim, to_device);
            }
        }
    }
    if (L->mean_bytes) /* key means: the same bytes in both layouts */
        memcpy(to_device ? dev + L->mean_off : host + L->mean_off, to_device ? host + L->mean_off : dev + L->mean_off,
               L->page_bytes - L->mean_off);
}

static kvq_status page_index(const kvq_cuda_cache *c, int seq, size_t i, int32_t *page)
{
    if (seq < 0 || seq >= c->cfg.max_seqs || i >= c->n_pages[seq])
        return KVQ_ERR_INVALID_ARG;
    *page = c->ptab_h[(size_t)seq * c->max_pages_per_seq + i];
    return KVQ_OK;
}

kvq_status kvq_cuda_cache_read_page(const kvq_cuda_cache *c, int seq, size_t i, void *host)
{
    int32_t page;
    if (!c || !host || page_index(c, seq, i, &page) != KVQ_OK)
        return KVQ_ERR_INVALID_ARG;
    uint8_t *staging = (uint8_t *)malloc(c->layout.page_bytes);
    if (!staging)
        return KVQ_ERR_NOMEM;
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e == cudaSuccess)
        e = cudaMemcpy(staging, c->pool + (size_t)page * c->layout.page_bytes, c->layout.page_bytes,
                       cudaMemcpyDeviceToHost);
    if (e == cudaSuccess)
        page_convert(c, staging, (uint8_t *)host, 0);
    free(staging);
    return e == cudaSuccess ? KVQ_OK : kvq_cuda_status_of(e);
}

/* Copies a page already in the device layout (host memory) to pool page
 * `page`. */
static kvq_status write_page_dev(kvq_cuda_cache *c, int32_t page, const uint8_t *page_dev)
{
    KVQ_CU_TRY(cudaStreamSynchronize(c->stream));
    KVQ_CU_TRY(cudaMemcpy(c->pool + (size_t)page * c->layout.page_bytes, page_dev, c->layout.page_bytes,
                          cudaMemcpyHostToDevice));
    return KVQ_OK;
}

kvq_status kvq_cuda_cache_write_page(kvq_cuda_cache *c, int seq, size_t i, const void *host)
{
    int32_t page;
    if (!c || !host || page_index(c, seq, i, &page) != KVQ_OK)
        return KVQ_ERR_INVALID_ARG;
    kvq_status st = own_page(c, seq, i);
    if (st != KVQ_OK)
        return st;
    page = table_of(c, seq)[i];
    uint8_t *staging = (uint8_t *)malloc(c->layout.page_bytes);
    if (!staging)
        return KVQ_ERR_NOMEM;
    page_convert(c, (const uint8_t *)host, staging, 1);
    st = write_page_dev(c, page, staging);
    free(staging);
    return st;
}

/* Zeroes the slots [used, P) of every section of one head chunk. */
static void zero_tail(uint8_t *chunk, const struct kvq_head_layout *hl, uint32_t used)
{
    const uint32_t P = hl->page_tokens;
    const uint32_t offs[4] = {hl->norm_off, hl->rnorm_off, hl->codes_off, hl->signs_off};
    const uint32_t strides[4] = {2, 2, hl->codes_stride, hl->signs_stride};
    for (int f = 0; f < 4; f++)
        if (offs[f] != KVQ_NO_SECTION && strides[f])
            memset(chunk + offs[f] + (size_t)used * strides[f], 0, (size_t)(P - used) * strides[f]);
}

static int same_config(const struct kvq_cache_config *a, const struct kvq_cache_config *b,
                       const struct kvq_page_layout *la, const struct kvq_page_layout *lb)
{
    return a->n_kv_heads == b->n_kv_heads && a->head_dim == b->head_dim && a->type_k == b->type_k &&
           a->type_v == b->type_v && a->seed == b->seed && a->rot == b->rot && a->qjl == b->qjl &&
           la->page_tokens == lb->page_tokens && la->page_bytes == lb->page_bytes;
}

kvq_status kvq_cuda_cache_upload(kvq_cuda_cache *c, int seq, const kvq_cache *host)
{
    if (!c || !host || seq < 0 || seq >= c->cfg.max_seqs)
        return KVQ_ERR_INVALID_ARG;
    const struct kvq_page_layout *hl = kvq_cache_layout(host);
    if (kvq_cache_config_of(host)->recent_f16 || kvq_cache_config_of(host)->sink_tokens || c->ov_rows)
        return KVQ_ERR_UNSUPPORTED; /* f16 override rows are not copied */
    if (!same_config(&c->cfg.cache, kvq_cache_config_of(host), &c->layout, hl))
        return KVQ_ERR_INVALID_ARG;
    const size_t n = kvq_cache_len(host);
    if (n > c->cfg.cache.max_tokens)
        return KVQ_ERR_INVALID_ARG;
    const size_t P = c->layout.page_tokens;
    if ((n + P - 1) / P > c->n_pages[seq] + c->n_free)
        return KVQ_ERR_BUDGET;
    KVQ_CU_TRY(cudaStreamSynchronize(c->stream));
    c->len[seq] = 0;
    shrink_pages(c, seq, 0);
    kvq_status st = grow_pages(c, seq, n);
    if (st != KVQ_OK)
        return st;
    /* the host page with its unused slots zeroed, then the device page */
    uint8_t *staging = (uint8_t *)malloc(2 * c->layout.page_bytes);
    if (!staging)
        return KVQ_ERR_NOMEM;
    uint8_t *dev = staging + c->layout.page_bytes;
    const size_t pages = (n + P - 1) / P;
    for (size_t i = 0; i < pages && st == KVQ_OK; i++) {
        memcpy(staging, kvq_cache_page(host, i), c->layout.page_bytes);
        uint32_t used = (uint32_t)(i + 1 < pages ? P : n - i * P);
        if (used < P)
            for (uint32_t h = 0; h < c->layout.n_kv_heads; h++) {
                zero_tail(staging + c->layout.k_off + (size_t)h * c->layout.k.bytes, &c->layout.k, used);
                zero_tail(staging + c->layout.v_off + (size_t)h * c->layout.v.bytes, &c->layout.v, used);
            }
        page_convert(c, staging, dev, 1);
        st = write_page_dev(c, table_of(c, seq)[i], dev);
    }
    free(staging);
    if (st == KVQ_OK)
        c->len[seq] = n;
    return st;
}
