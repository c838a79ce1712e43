/* cache.c - the paged, packed KV cache of one layer (see kvq_cache.h).
 *
 * Pages are allocated on demand and never moved: the page table is sized
 * once at create (from max_tokens, and from max_bytes when a budget is set)
 * so appending never reallocates anything that readers or a device mirror
 * may hold pointers into. Each page is over-allocated by KVQ_PAGE_TAIL_PAD
 * zero bytes because the SIMD kernels read whole 32-bit words at the last
 * packed code group of a section.
 *
 * Seeds: the K codec uses cfg.seed as given; the V codec uses
 * kvq_seed_derive(cfg.seed, KVQ_CACHE_SEED_STREAM_V) so that the rotation of
 * values is independent of the rotation of keys (and of the QJL projection,
 * which the codec derives from the K seed with streams 1 and 2).
 *
 * f16 overrides (kvq_cache.h): sink rows [sink_rows][H][d] and a ring of
 * ring_rows recent rows (token t in row t % ring_rows), K and V apart. The
 * ring holds valid copies of tokens [f16_lo, len): appending raises f16_lo
 * to len - ring_rows (the row just overwritten), truncating lowers it to n
 * at most, so a view of n <= len tokens can tell which rows are still there.
 *
 * Shared pages (kvq_cache_share): every page allocation starts with a
 * PAGE_HDR-byte header holding the number of caches whose table points at
 * the page; the last one to let go frees it, and a cache about to write into
 * a page that others hold writes into a private copy instead.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "half_bulk.h"
#include "kvq_cache.h"
#include "kvq_half.h"
#include "kvq_rng.h"

struct kvq_cache {
    struct kvq_cache_config cfg;
    struct kvq_page_layout layout;
    kvq_codec *ck, *cv;
    uint8_t **pages;     /* table_cap entries; the first n_pages are allocated */
    size_t table_cap;    /* the most pages this cache may ever hold */
    size_t n_pages;
    size_t len;          /* tokens held */
    size_t alloc_bytes;  /* bytes of one page allocation, padding included */
    /* f16 overrides (NULL / 0 when off) */
    uint16_t *sink_k, *sink_v; /* [sink_rows][H][d] */
    uint16_t *ring_k, *ring_v; /* [ring_rows][H][d] */
    size_t sink_rows, ring_rows;
    size_t f16_lo;             /* ring copies valid for tokens [f16_lo, len) */
    size_t f16_bytes;          /* all four buffers */
    /* key centering (center_k): keys of tokens [0, packed_len) are encoded;
     * the rest wait, in the ring, for their page to fill. A page whose
     * start is below packed_len has its mean. */
    size_t packed_len;
    float *mean, *krow;        /* [d] each: the page's m~, one centred key */
};

void kvq_cache_config_default(struct kvq_cache_config *cfg, int n_kv_heads, int head_dim, size_t max_tokens)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->n_kv_heads = n_kv_heads;
    cfg->head_dim = head_dim;
    cfg->type_k = KVQ_DEFAULT_TYPE_K;
    cfg->type_v = KVQ_DEFAULT_TYPE_V;
    cfg->seed = 0;
    cfg->rot = KVQ_ROT_HADAMARD;
    cfg->qjl = KVQ_QJL_ORTHO;
    cfg->page_tokens = KVQ_DEFAULT_PAGE_TOKENS;
    cfg->max_tokens = max_tokens;
    cfg->max_bytes = 0;
    cfg->recent_f16 = 0;
    cfg->sink_tokens = 0;
    cfg->center_k = 0;
}

/* Checks everything create() checks except what only the codecs know, and
 * fills the page layout. */
static kvq_status check_config(const struct kvq_cache_config *cfg, struct kvq_page_layout *pl)
{
    if (!cfg || cfg->n_kv_heads < 1 || cfg->max_tokens < 1)
        return KVQ_ERR_INVALID_ARG;
    if ((int)cfg->rot < 0 || cfg->rot >= KVQ_ROT_KIND_COUNT || cfg->rot == KVQ_ROT_GAUSS ||
        (int)cfg->qjl < 0 || cfg->qjl >= KVQ_QJL_KIND_COUNT)
        return KVQ_ERR_INVALID_ARG;
    if (cfg->recent_f16 < 0 || cfg->recent_f16 > 1 || cfg->sink_tokens < 0 ||
        cfg->sink_tokens > KVQ_CACHE_MAX_SINK_TOKENS)
        return KVQ_ERR_INVALID_ARG;
    if (cfg->center_k < 0 || cfg->center_k > 1 || (cfg->center_k && !cfg->recent_f16))
        return KVQ_ERR_INVALID_ARG;
    int P = cfg->page_tokens ? cfg->page_tokens : KVQ_DEFAULT_PAGE_TOKENS;
    if (P < KVQ_MIN_PAGE_TOKENS || P > KVQ_MAX_PAGE_TOKENS || P % 16 != 0)
        return KVQ_ERR_INVALID_ARG;
    kvq_status st = kvq_type_check_dim(cfg->type_k, cfg->head_dim);
    if (st == KVQ_OK)
        st = kvq_type_check_dim(cfg->type_v, cfg->head_dim);
    if (st != KVQ_OK)
        return st;
    /* A page must stay addressable with its padding; heads * chunk is 64-bit. */
    if (kvq_page_layout_init(pl, cfg->n_kv_heads, cfg->head_dim, (int)cfg->type_k, (int)cfg->type_v, P) ||
        pl->page_bytes > (uint64_t)(SIZE_MAX / 4))
        return KVQ_ERR_UNSUPPORTED;
    if (cfg->center_k)
        kvq_page_layout_add_key_means(pl);
    return KVQ_OK;
}

static size_t pages_for(size_t n_tokens, size_t P)
{
    return n_tokens / P + (n_tokens % P != 0);
}

/* Rows of the sink and recent buffers of a valid config: never more than
 * max_tokens (a short cache needs no more). */
static void f16_rows(const struct kvq_cache_config *cfg, size_t P, size_t *sink, size_t *ring)
{
    size_t s = (size_t)cfg->sink_tokens, r = cfg->recent_f16 ? P : 0;
    *sink = s < cfg->max_tokens ? s : cfg->max_tokens;
    *ring = r < cfg->max_tokens ? r : cfg->max_tokens;
}

/* Bytes of all f16 override buffers (K and V) of a valid config. */
static size_t f16_bytes_of(const struct kvq_cache_config *cfg, size_t P)
{
    size_t sink, ring;
    f16_rows(cfg, P, &sink, &ring);
    return (sink + ring) * (size_t)cfg->n_kv_heads * (size_t)cfg->head_dim * 2 * sizeof(uint16_t);
}

/* The reference count lives in front of the page, which stays 64-byte aligned. */
#define PAGE_HDR 64

static atomic_uint *page_refs(uint8_t *p)
{
    return (atomic_uint *)(void *)(p - PAGE_HDR);
}

/* A page of bytes bytes (not zeroed), held once. */
static uint8_t *page_alloc(size_t bytes)
{
    uint8_t *base = aligned_alloc(64, PAGE_HDR + bytes);
    if (!base)
        return NULL;
    atomic_init((atomic_uint *)(void *)base, 1u);
    return base + PAGE_HDR;
}

static void page_unref(uint8_t *p)
{
    if (p && atomic_fetch_sub(page_refs(p), 1u) == 1u)
        free(p - PAGE_HDR);
}

kvq_status kvq_cache_create(const struct kvq_cache_config *cfg, kvq_cache **out)
{
    if (!out)
        return KVQ_ERR_INVALID_ARG;
    struct kvq_page_layout pl;
    kvq_status st = check_config(cfg, &pl);
    if (st != KVQ_OK)
        return st;

    kvq_cache *c = calloc(1, sizeof *c);
    if (!c)
        return KVQ_ERR_NOMEM;
    c->cfg = *cfg;
    c->cfg.page_tokens = (int)pl.page_tokens;
    c->layout = pl;
    size_t page_bytes = (size_t)pl.page_bytes;
    c->alloc_bytes = (page_bytes + KVQ_PAGE_TAIL_PAD + 63) / 64 * 64;

    struct kvq_codec_config kc, vc;
    kvq_codec_config_default(&kc, cfg->type_k, cfg->head_dim);
    kc.seed = cfg->seed;
    kc.rot = cfg->rot;
    kc.qjl = cfg->qjl;
    vc = kc;
    vc.type = cfg->type_v;
    vc.seed = kvq_seed_derive(cfg->seed, KVQ_CACHE_SEED_STREAM_V);
    st = kvq_codec_create(&kc, &c->ck);
    if (st == KVQ_OK)
        st = kvq_codec_create(&vc, &c->cv);
    if (st != KVQ_OK)
        goto fail;

    /* The f16 buffers come out of the budget first. */
    f16_rows(cfg, pl.page_tokens, &c->sink_rows, &c->ring_rows);
    c->f16_bytes = f16_bytes_of(cfg, pl.page_tokens);
    const size_t row_h = (size_t)cfg->n_kv_heads * (size_t)cfg->head_dim * sizeof(uint16_t);
    if (c->sink_rows) {
        c->sink_k = malloc(c->sink_rows * row_h);
        c->sink_v = malloc(c->sink_rows * row_h);
    }
    if (c->ring_rows) {
        c->ring_k = malloc(c->ring_rows * row_h);
        c->ring_v = malloc(c->ring_rows * row_h);
    }
    if (cfg->center_k)
        c->mean = malloc(2 * (size_t)cfg->head_dim * sizeof *c->mean);
    c->krow = c->mean ? c->mean + cfg->head_dim : NULL;
    if ((c->sink_rows && (!c->sink_k || !c->sink_v)) || (c->ring_rows && (!c->ring_k || !c->ring_v)) ||
        (cfg->center_k && !c->mean)) {
        st = KVQ_ERR_NOMEM;
        goto fail;
    }

    /* Pages beyond the budget can never be allocated, so the table need not
     * hold them (this also keeps a huge max_tokens with a budget cheap). */
    c->table_cap = pages_for(cfg->max_tokens, pl.page_tokens);
    if (cfg->max_bytes) {
        size_t for_pages = cfg->max_bytes > c->f16_bytes ? cfg->max_bytes - c->f16_bytes : 0;
        if (for_pages / page_bytes < c->table_cap)
            c->table_cap = for_pages / page_bytes;
    }
    if (c->table_cap > SIZE_MAX / sizeof *c->pages) {
        st = KVQ_ERR_NOMEM;
        goto fail;
    }
    c->pages = calloc(c->table_cap ? c->table_cap : 1, sizeof *c->pages);
    if (!c->pages) {
        st = KVQ_ERR_NOMEM;
        goto fail;
    }
    *out = c;
    return KVQ_OK;
fail:
    kvq_cache_free(c);
    return st;
}

void kvq_cache_free(kvq_cache *c)
{
    if (!c)
        return;
    if (c->pages)
        for (size_t i = 0; i < c->n_pages; i++)
            page_unref(c->pages[i]);
    free(c->pages);
    free(c->sink_k);
    free(c->sink_v);
    free(c->ring_k);
    free(c->ring_v);
    free(c->mean);
    kvq_codec_free(c->ck);
    kvq_codec_free(c->cv);
    free(c);
}

/* Lets go of the pages [keep, n_pages): undoes the allocations of a failed
 * append, or trims. */
static void drop_pages(kvq_cache *c, size_t keep)
{
    while (c->n_pages > keep)
        page_unref(c->pages[--c->n_pages]);
}

static uint8_t *head_chunk(const kvq_cache *c, size_t page, int v, int h)
{
    const struct kvq_page_layout *pl = &c->layout;
    uint64_t off = v ? pl->v_off + (uint64_t)h * pl->v.bytes : pl->k_off + (uint64_t)h * pl->k.bytes;
    return c->pages[page] + off;
}

/* Allocates the pages that len + n_tokens tokens need; all or nothing. */
static kvq_status grow(kvq_cache *c, size_t n_tokens)
{
    if (n_tokens > c->cfg.max_tokens - c->len)
        return KVQ_ERR_CONTEXT_FULL;
    const size_t P = c->layout.page_tokens, had = c->n_pages;
    const size_t need = pages_for(c->len + n_tokens, P);
    /* copy on write: a page these tokens land in that another cache also
     * holds (kvq_cache_share) is replaced by a private copy; a copy made
     * before a later failure is harmless (same bytes) */
    for (size_t i = c->len / P; n_tokens && i < had && i < need; i++)
        if (atomic_load(page_refs(c->pages[i])) > 1u) {
            uint8_t *p = page_alloc(c->alloc_bytes);
            if (!p)
                return KVQ_ERR_NOMEM;
            memcpy(p, c->pages[i], c->alloc_bytes);
            page_unref(c->pages[i]);
            c->pages[i] = p;
        }
    if (need <= had)
        return KVQ_OK;
    if (need > c->table_cap) /* only the budget can make the table short */
        return KVQ_ERR_BUDGET;
    for (size_t i = had; i < need; i++) {
        uint8_t *p = page_alloc(c->alloc_bytes);
        if (!p) {
            drop_pages(c, had);
            return KVQ_ERR_NOMEM;
        }
        /* Zeroed, padding included: kernels may read (and ignore) the bytes
         * past the last row, and they are then defined. */
        memset(p, 0, c->alloc_bytes);
        c->pages[c->n_pages++] = p;
    }
    return KVQ_OK;
}

kvq_status kvq_cache_reserve(kvq_cache *c, size_t n_tokens)
{
    return c ? grow(c, n_tokens) : KVQ_ERR_INVALID_ARG;
}

/* Largest finite half; values beyond round to Inf. */
#define KVQ_F16_MAX 65504.0f

/* The f16 copies of tokens [len, len + n_tokens) (rows already checked). */
static void keep_f16(kvq_cache *c, size_t n_tokens, const float *k, const float *v)
{
    const size_t hd = (size_t)c->cfg.n_kv_heads * (size_t)c->cfg.head_dim;
    for (size_t t = 0; t < n_tokens; t++) {
        size_t pos = c->len + t;
        const float *kr = k + t * hd, *vr = v + t * hd;
        uint16_t *dst[4] = {NULL, NULL, NULL, NULL};
        if (pos < c->sink_rows) {
            dst[0] = c->sink_k + pos * hd;
            dst[1] = c->sink_v + pos * hd;
        }
        if (c->ring_rows) {
            dst[2] = c->ring_k + pos % c->ring_rows * hd;
            dst[3] = c->ring_v + pos % c->ring_rows * hd;
        }
        for (int b = 0; b < 4; b++)
            if (dst[b])
                kvq_f32_to_f16_n(b & 1 ? vr : kr, dst[b], hd);
    }
    size_t end = c->len + n_tokens;
    if (c->ring_rows && end > c->ring_rows && end - c->ring_rows > c->f16_lo)
        c->f16_lo = end - c->ring_rows;
}

/* Key centering (kvq_layout.h, "key means"). The mean is summed in float
 * in token order and quantized with the f16 scale's own value, so a GPU
 * encoder that does the same reproduces the bytes. */
static void key_mean_encode(const float *m, int d, uint8_t *blk)
{
    float mx = 0.0f;
    for (int j = 0; j < d; j++)
        mx = fabsf(m[j]) > mx ? fabsf(m[j]) : mx;
    const uint16_t sh = kvq_f32_to_f16(mx / 7.0f);
    const float s = kvq_f16_to_f32(sh);
    blk[0] = (uint8_t)(sh & 255);
    blk[1] = (uint8_t)(sh >> 8);
    memset(blk + 2, 0, ((size_t)d + 1) / 2);
    for (int j = 0; j < d; j++)
        blk[2 + j / 2] |= (uint8_t)(kvq_key_mean_quant(m[j], s) << (j & 1 ? 4 : 0));
}

/* Head h's key of token t as centering reads it: its f16 rounding, from the
 * input k (tokens from first on) or from the ring (earlier ones, which the
 * ring still holds: they are in the page being completed). */
static void centred_source(const kvq_cache *c, size_t t, int h, size_t first, const float *k, float *out)
{
    const size_t d = (size_t)c->cfg.head_dim, hd = (size_t)c->cfg.n_kv_heads * d;
    if (t >= first) {
        memcpy(out, k + (t - first) * hd + (size_t)h * d, d * sizeof *out);
        kvq_half_round(out, d);
    } else {
        kvq_f16_to_f32_n(c->ring_k + t % c->ring_rows * hd + (size_t)h * d, out, d);
    }
}

/* Encodes the keys of every token below end whose page has filled (its
 * mean first, when the page has none yet) or already has a mean. Tokens
 * [first, end) are the ones being appended, with keys k. */
static kvq_status pack_keys(kvq_cache *c, size_t end, size_t first, const float *k)
{
    const int H = c->cfg.n_kv_heads, d = c->cfg.head_dim;
    const size_t P = c->layout.page_tokens;
    const kvq_encode_fn enc = c->ck->traits->encode;
    while (c->packed_len < end) {
        const size_t page = c->packed_len / P, p0 = page * P, stop = p0 + P < end ? p0 + P : end;
        const int fresh = c->packed_len == p0;
        if (fresh && p0 + P > end)
            break; /* the page is not full yet */
        for (int h = 0; h < H; h++) {
            uint8_t *blk = c->pages[page] + c->layout.mean_off + (uint64_t)h * c->layout.mean_bytes;
            if (fresh) {
                memset(c->mean, 0, (size_t)d * sizeof *c->mean);
                for (size_t t = p0; t < p0 + P; t++) {
                    centred_source(c, t, h, first, k, c->krow);
                    for (int j = 0; j < d; j++)
                        c->mean[j] += c->krow[j];
                }
                for (int j = 0; j < d; j++)
                    c->mean[j] /= (float)P;
                key_mean_encode(c->mean, d, blk);
            }
            kvq_key_mean_decode(blk, d, c->mean);
            for (size_t t = c->packed_len; t < stop; t++) {
                centred_source(c, t, h, first, k, c->krow);
                for (int j = 0; j < d; j++)
                    c->krow[j] -= c->mean[j];
                struct kvq_row r = kvq_head_row(&c->layout.k, head_chunk(c, page, 0, h), (uint32_t)(t - p0));
                if (enc(c->ck, c->krow, &r) != KVQ_OK)
                    return KVQ_ERR_INTERNAL; /* append admits only keys whose centred rows encode */
            }
        }
        c->packed_len = stop;
    }
    return KVQ_OK;
}

kvq_status kvq_cache_append(kvq_cache *c, size_t n_tokens, const float *k, const float *v)
{
    if (!c)
        return KVQ_ERR_INVALID_ARG;
    if (n_tokens == 0)
        return KVQ_OK;
    if (!k || !v)
        return KVQ_ERR_INVALID_ARG;
    if (n_tokens > c->cfg.max_tokens - c->len)
        return KVQ_ERR_CONTEXT_FULL;
    const int H = c->cfg.n_kv_heads, d = c->cfg.head_dim;
    const size_t rows = n_tokens * (size_t)H;
    /* 1. every row, exactly as encode will judge it */
    for (size_t r = 0; r < rows; r++) {
        kvq_status st = kvq_codec_check_row(c->ck, k + r * (size_t)d);
        if (st == KVQ_OK)
            st = kvq_codec_check_row(c->cv, v + r * (size_t)d);
        if (st != KVQ_OK)
            return st;
        /* a centred key may be up to about twice as long as the longest
         * key of its page: keep that within what every codec stores */
        if (c->cfg.center_k) {
            double n2 = 0.0;
            for (int j = 0; j < d; j++)
                n2 += (double)k[r * (size_t)d + j] * k[r * (size_t)d + j];
            if (n2 > (double)(KVQ_F16_MAX / 4) * (KVQ_F16_MAX / 4))
                return KVQ_ERR_RANGE;
        }
    }
    /* ... and the rows that get an f16 copy must fit f16 */
    for (size_t t = 0; t < n_tokens; t++) {
        if (!c->ring_rows && c->len + t >= c->sink_rows)
            break;
        const size_t hd = (size_t)H * (size_t)d;
        for (size_t j = 0; j < hd; j++)
            if (fabsf(k[t * hd + j]) > KVQ_F16_MAX || fabsf(v[t * hd + j]) > KVQ_F16_MAX)
                return KVQ_ERR_RANGE;
    }
    /* 2. every page, before anything is written */
    const size_t P = c->layout.page_tokens, had = c->n_pages;
    kvq_status gst = grow(c, n_tokens);
    if (gst != KVQ_OK)
        return gst;
    /* 3. encode; only slots at or past len are written, so on a (never
     * expected) failure the tokens already held are untouched. */
    const kvq_encode_fn enc_k = c->ck->traits->encode, enc_v = c->cv->traits->encode;
    for (size_t t = 0; t < n_tokens; t++) {
        size_t pos = c->len + t, page = pos / P;
        uint32_t slot = (uint32_t)(pos % P);
        for (int h = 0; h < H; h++) {
            size_t r = t * (size_t)H + (size_t)h;
            struct kvq_row rk = kvq_head_row(&c->layout.k, head_chunk(c, page, 0, h), slot);
            struct kvq_row rv = kvq_head_row(&c->layout.v, head_chunk(c, page, 1, h), slot);
            if ((!c->cfg.center_k && enc_k(c->ck, k + r * (size_t)d, &rk) != KVQ_OK) ||
                enc_v(c->cv, v + r * (size_t)d, &rv) != KVQ_OK) {
                drop_pages(c, had);
                return KVQ_ERR_INTERNAL; /* the checks above admit exactly what encode accepts */
            }
        }
    }
    if (c->cfg.center_k) { /* before keep_f16 overwrites the ring rows it reads */
        const kvq_status st = pack_keys(c, c->len + n_tokens, c->len, k);
        if (st != KVQ_OK) {
            c->packed_len = c->packed_len < c->len ? c->packed_len : c->len;
            drop_pages(c, had);
            return st;
        }
    }
    if (c->sink_rows || c->ring_rows)
        keep_f16(c, n_tokens, k, v);
    c->len += n_tokens;
    return KVQ_OK;
}

kvq_status kvq_cache_read(const kvq_cache *c, int kv_head, size_t t0, size_t n, float *k, float *v)
{
    if (!c || kv_head < 0 || kv_head >= c->cfg.n_kv_heads || t0 > c->len || n > c->len - t0)
        return KVQ_ERR_INVALID_ARG;
    const size_t P = c->layout.page_tokens, d = (size_t)c->cfg.head_dim;
    size_t sink_end, tail_lo, mean_page = SIZE_MAX;
    float mean[KVQ_MAX_DIM];
    kvq_cache_f16_view(c, c->len, &sink_end, &tail_lo);
    for (size_t i = 0; i < n; i++) {
        size_t pos = t0 + i, page = pos / P;
        uint32_t slot = (uint32_t)(pos % P);
        if (pos < sink_end || pos >= tail_lo) {
            if (k)
                kvq_f16_to_f32_n(kvq_cache_f16_row(c, 0, kv_head, pos), k + i * d, d);
            if (v)
                kvq_f16_to_f32_n(kvq_cache_f16_row(c, 1, kv_head, pos), v + i * d, d);
            continue;
        }
        if (k) {
            struct kvq_row r = kvq_head_row(&c->layout.k, head_chunk(c, page, 0, kv_head), slot);
            c->ck->traits->decode(c->ck, &r, k + i * d);
            const uint8_t *m = kvq_cache_key_mean(c, page, kv_head);
            if (m && page != mean_page) { /* key centering: the page's mean, decoded once a page */
                kvq_key_mean_decode(m, (int)d, mean);
                mean_page = page;
            }
            for (size_t j = 0; m && j < d; j++)
                k[i * d + j] += mean[j];
        }
        if (v) {
            struct kvq_row r = kvq_head_row(&c->layout.v, head_chunk(c, page, 1, kv_head), slot);
            c->cv->traits->decode(c->cv, &r, v + i * d);
        }
    }
    return KVQ_OK;
}

size_t kvq_cache_len(const kvq_cache *c)
{
    return c ? c->len : 0;
}

void kvq_cache_reset(kvq_cache *c)
{
    if (c) {
        c->len = 0;
        c->f16_lo = 0;
        c->packed_len = 0;
    }
}

size_t kvq_cache_trim(kvq_cache *c)
{
    if (!c)
        return 0;
    const size_t had = c->n_pages;
    drop_pages(c, pages_for(c->len, c->layout.page_tokens));
    return (had - c->n_pages) * c->layout.page_bytes;
}

kvq_status kvq_cache_share(kvq_cache *dst, const kvq_cache *src, size_t n_tokens)
{
    if (!dst || !src || dst == src || n_tokens > src->len || dst->len != 0)
        return KVQ_ERR_INVALID_ARG;
    const struct kvq_cache_config *a = &dst->cfg, *b = &src->cfg;
    const size_t P = dst->layout.page_tokens, k = n_tokens / P;
    if (n_tokens % P || a->n_kv_heads != b->n_kv_heads || a->head_dim != b->head_dim || a->type_k != b->type_k ||
        a->type_v != b->type_v || a->seed != b->seed || a->rot != b->rot || a->qjl != b->qjl ||
        a->page_tokens != b->page_tokens || a->recent_f16 != b->recent_f16 || a->sink_tokens != b->sink_tokens ||
        a->center_k != b->center_k)
        return KVQ_ERR_INVALID_ARG;
    if (n_tokens > a->max_tokens)
        return KVQ_ERR_CONTEXT_FULL;
    if (k > dst->table_cap)
        return KVQ_ERR_BUDGET;
    drop_pages(dst, 0);
    for (size_t i = 0; i < k; i++) {
        atomic_fetch_add(page_refs(src->pages[i]), 1u);
        dst->pages[i] = src->pages[i];
    }
    dst->n_pages = k;
    const size_t hd = (size_t)a->n_kv_heads * (size_t)a->head_dim;
    const size_t sinks = n_tokens < dst->sink_rows ? n_tokens : dst->sink_rows;
    if (sinks) {
        memcpy(dst->sink_k, src->sink_k, sinks * hd * sizeof *dst->sink_k);
        memcpy(dst->sink_v, src->sink_v, sinks * hd * sizeof *dst->sink_v);
    }
    dst->len = n_tokens;
    dst->packed_len = n_tokens; /* whole pages: their keys are encoded */
    dst->f16_lo = n_tokens; /* a whole-page view reads no recent copy */
    return KVQ_OK;
}

size_t kvq_cache_pages_shared(const kvq_cache *c)
{
    size_t n = 0;
    for (size_t i = 0; c && i < c->n_pages; i++)
        n += atomic_load(page_refs(c->pages[i])) > 1u;
    return n;
}

kvq_status kvq_cache_truncate(kvq_cache *c, size_t n)
{
    if (!c || n > c->len)
        return KVQ_ERR_INVALID_ARG;
    c->len = n;
    if (c->packed_len > n) /* a page keeps its mean while it keeps a token */
        c->packed_len = n;
    if (c->f16_lo > n) /* nothing kept had a copy; new tokens will */
        c->f16_lo = n;
    return KVQ_OK;
}

kvq_status kvq_cache_f16_view(const kvq_cache *c, size_t n, size_t *sink_end, size_t *tail_lo)
{
    if (!c || !sink_end || !tail_lo || n > c->len)
        return KVQ_ERR_INVALID_ARG;
    *sink_end = n < c->sink_rows ? n : c->sink_rows;
    *tail_lo = n;
    const size_t P = c->layout.page_tokens;
    if (c->ring_rows && n % P) {
        size_t lo = n - n % P;
        lo = lo > c->f16_lo ? lo : c->f16_lo;
        *tail_lo = lo < n ? lo : n;
    }
    return KVQ_OK;
}

const uint16_t *kvq_cache_f16_row(const kvq_cache *c, int v, int kv_head, size_t t)
{
    if (!c || kv_head < 0 || kv_head >= c->cfg.n_kv_heads || t >= c->len)
        return NULL;
    const size_t hd = (size_t)c->cfg.n_kv_heads * (size_t)c->cfg.head_dim;
    const size_t off = (size_t)kv_head * (size_t)c->cfg.head_dim;
    if (t < c->sink_rows)
        return (v ? c->sink_v : c->sink_k) + t * hd + off;
    if (c->ring_rows && t >= c->f16_lo)
        return (v ? c->ring_v : c->ring_k) + t % c->ring_rows * hd + off;
    return NULL;
}

void kvq_cache_get_stats(const kvq_cache *c, struct kvq_cache_stats *st)
{
    if (!st)
        return;
    memset(st, 0, sizeof *st);
    if (!c)
        return;
    const size_t H = (size_t)c->cfg.n_kv_heads, d = (size_t)c->cfg.head_dim;
    st->tokens = c->len;
    st->pages = c->n_pages;
    st->page_bytes = (size_t)c->layout.page_bytes;
    st->bytes_f16_buffers = c->f16_bytes;
    st->bytes_allocated = c->n_pages * st->page_bytes + c->f16_bytes;
    st->bytes_used = c->len * H * (c->ck->row_bytes + c->cv->row_bytes);
    st->bytes_f16 = c->len * H * 2 * d * 2;
}

const struct kvq_cache_config *kvq_cache_config_of(const kvq_cache *c)
{
    return c ? &c->cfg : NULL;
}

const uint8_t *kvq_cache_key_mean(const kvq_cache *c, size_t page, int kv_head)
{
    if (!c || !c->layout.mean_bytes || page >= c->n_pages || kv_head < 0 || kv_head >= c->cfg.n_kv_heads ||
        page * c->layout.page_tokens >= c->packed_len)
        return NULL;
    return c->pages[page] + c->layout.mean_off + (uint64_t)kv_head * c->layout.mean_bytes;
}

const struct kvq_page_layout *kvq_cache_layout(const kvq_cache *c)
{
    return c ? &c->layout : NULL;
}

const kvq_codec *kvq_cache_codec_k(const kvq_cache *c)
{
    return c ? c->ck : NULL;
}

const kvq_codec *kvq_cache_codec_v(const kvq_cache *c)
{
    return c ? c->cv : NULL;
}

size_t kvq_cache_page_count(const kvq_cache *c)
{
    return c ? c->n_pages : 0;
}

const uint8_t *kvq_cache_page(const kvq_cache *c, size_t i)
{
    return c && i < c->n_pages ? c->pages[i] : NULL;
}

size_t kvq_cache_bytes_for(const struct kvq_cache_config *cfg, size_t n_tokens)
{
    struct kvq_page_layout pl;
    if (check_config(cfg, &pl) != KVQ_OK)
        return 0;
    size_t pages = pages_for(n_tokens, pl.page_tokens);
    if (pages > (SIZE_MAX - f16_bytes_of(cfg, pl.page_tokens)) / (size_t)pl.page_bytes)
        return 0;
    return pages * (size_t)pl.page_bytes + f16_bytes_of(cfg, pl.page_tokens);
}
