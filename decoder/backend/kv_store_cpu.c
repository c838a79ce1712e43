/* kv_store_cpu.c - the KV store over host kvq_cache pages.
 *
 * Attention goes only through kvq's public API: a chunk's keys and values
 * are appended to the layer's cache, then kvq_attn_causal (T > 1) or
 * kvq_attn_decode (T = 1) reads them back from the packed pages, once per KV
 * head for its group of query heads; a chunk's work is split into (KV head x
 * pass) tasks over the pool (parallel.h). With the recent f16 window a chunk
 * is appended at once and attended with kvq_attn_causal_recent, its f16
 * copies kept here (append_attend_each).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_store.h"
#include "kvq_attn.h"
#include "kvq_codec.h"
#include "kvq_half.h"
#include "matvec_internal.h"
#include "parallel.h"

/* Pool threads one store attends on at most. */
#define KVQ_ATTN_MAX_WORKERS 64

struct cpu_store {
    struct kvq_kv_store base;
    kvq_cache **caches; /* [n_layers][max_seqs][RING]: a windowed layer's ring, else slot 0 only */
    int *window;        /* [n_layers] sliding window in tokens, 0 = none */
    size_t *seg;        /* [n_layers] tokens per ring segment (KVQ_WINDOW_SEGMENT) */
    size_t *wlen;       /* [n_layers][max_seqs] tokens a windowed layer has seen */
    float **wk, **wv;   /* [n_work][max window][head_dim] a window's decoded rows */
    double **wsc;       /* [n_work][max window] its scores */
    int n_kv, n_heads, head_dim;
    float scale;        /* attention score scale */
    int recent_f16;
    /* per pool thread (parallel.h), so KV heads are attended in parallel */
    int n_work;
    kvq_attn_workspace **ws; /* [n_work] */
    float **qg, **og;        /* [n_work][max_rows][q_dim]: a KV group's query heads, contiguous */
    uint16_t *rec_k, *rec_v; /* recent window: [max_rows + page - 1][kv_dim] the f16 copies of a
                              * chunk and the partly filled page before it (append_attend_each) */
    size_t rec_rows;
    uint8_t *vnc_packed;  /* v_norm_correct: [max_rows * n_kv] packed V rows */
    float *vnc_dec;       /* v_norm_correct: [max_rows][kv_dim] decoded V rows */
};

#define RING 3

static size_t idx_of(const struct cpu_store *s, int layer, int seq)
{
    return (size_t)layer * (size_t)s->base.max_seqs + (size_t)seq;
}

static kvq_cache *ring_of(const struct cpu_store *s, int layer, int seq, size_t segment)
{
    return s->caches[idx_of(s, layer, seq) * RING + segment % RING];
}

/* The layer's cache: for a windowed layer the segment holding its newest token. */
static kvq_cache *cache_of(const struct cpu_store *s, int layer, int seq)
{
    if (!s->window[layer])
        return s->caches[idx_of(s, layer, seq) * RING];
    size_t L = s->wlen[idx_of(s, layer, seq)];
    return ring_of(s, layer, seq, L ? (L - 1) / s->seg[layer] : 0);
}

/* Tokens of (layer, seq). */
static size_t len_of(const struct cpu_store *s, int layer, int seq)
{
    return s->window[layer] ? s->wlen[idx_of(s, layer, seq)] : kvq_cache_len(cache_of(s, layer, seq));
}

/* Value norm correction (kvq_seq_config.v_norm_correct). A tq value row
 * decodes to n R^T c[idx], whose norm n ||c[idx]|| falls short of n: the
 * codebook shrinks towards the centroids. The codes depend only on the
 * direction of x, so scaling x by ||x|| / ||x~|| before encoding leaves them
 * as they are and stores exactly the norm that makes ||x~|| = ||x|| (up to
 * the f16 rounding of the stored norm). Scales v in place. */
static kvq_status norm_correct_v(struct cpu_store *s, const kvq_cache *c, float *v, size_t T)
{
    const kvq_codec *cv = kvq_cache_codec_v(c);
    if (!s->vnc_packed || !kvq_codec_traits(cv)->rotated)
        return KVQ_OK;
    const int d = s->head_dim;
    const size_t rows = T * (size_t)s->n_kv;
    kvq_status st = kvq_codec_encode(cv, v, rows, s->vnc_packed);
    if (st == KVQ_OK)
        st = kvq_codec_decode(cv, s->vnc_packed, rows, s->vnc_dec);
    if (st != KVQ_OK)
        return st;
    for (size_t r = 0; r < rows; r++) {
        float *x = v + r * (size_t)d;
        const float *y = s->vnc_dec + r * (size_t)d;
        double nx = 0, ny = 0;
        for (int i = 0; i < d; i++) {
            nx += (double)x[i] * x[i];
            ny += (double)y[i] * y[i];
        }
        if (ny > 0) {
            float g = (float)sqrt(nx / ny);
            for (int i = 0; i < d; i++)
                x[i] *= g;
        }
    }
    return KVQ_OK;
}

/* Query positions per attention task of a chunk: a row's result does not
 * depend on the call it is computed in (kvq_attn_causal), so the split, and
 * the thread count, leave the bits alone. A task of one pass
 * (kvq_attn_causal_span: 256 positions at G = 2) decodes each packed block
 * once for all its rows; chunks are cut finer only where the threads would
 * otherwise lack tasks. */
static size_t task_positions(const struct cpu_store *s, size_t T, int n_work)
{
    size_t per = kvq_attn_causal_span(s->n_heads / s->n_kv);
    const size_t want = n_work > s->n_kv ? ((size_t)n_work + (size_t)s->n_kv - 1) / (size_t)s->n_kv : 1;
    if ((T + per - 1) / per < want)
        per = (T + want - 1) / want;
    return per ? per : 1;
}

/* Chunks of at most this many positions (decode, speculative verification)
 * attend as one decode per position (kvq_attn_causal_ref), like the few-row
 * matrix kernel they go through: a verified draft then gets exactly the bits
 * of plain decoding. Longer chunks (prefill) take the tiled kernel, equal to
 * rounding, as their sgemm products are. */
#define PER_POSITION_MAX KVQ_MATVEC_MAX_M

/* One KV head's attention over one tile of the chunk's positions (attend's task). */
struct attend_job {
    struct cpu_store *s;
    const kvq_cache *cache;
    size_t pos0, T, per, n_tiles; /* tiles of per positions */
    int tiled; /* kvq_attn_causal, else kvq_attn_causal_ref (PER_POSITION_MAX) */
    const struct kvq_attn_recent *rec; /* the chunk's f16 copies (append_attend_each), or NULL */
    const float *q;
    float *out;
    kvq_status st[KVQ_ATTN_MAX_WORKERS]; /* per pool thread: no two write one slot */
};

/* Rows [pos0, pos0 + T) of KV head g, as the job asks. */
static kvq_status causal(const struct attend_job *j, int g, size_t pos0, size_t T, const float *q, float *out,
                         kvq_attn_workspace *ws)
{
    const int G = j->s->n_heads / j->s->n_kv;
    if (!j->tiled)
        return kvq_attn_causal_ref(j->cache, g, pos0, T, q, G, j->s->scale, out, ws);
    if (j->rec)
        return kvq_attn_causal_recent(j->cache, g, pos0, T, q, G, j->s->scale, out, ws, j->rec);
    return kvq_attn_causal(j->cache, g, pos0, T, q, G, j->s->scale, out, ws);
}

static void attend_task(void *p, int task, int w)
{
    struct attend_job *j = p;
    struct cpu_store *s = j->s;
    /* The last tiles (the longest prefixes) first, so the pool's threads,
     * taking tasks in order, finish together. */
    const int d = s->head_dim, G = s->n_heads / s->n_kv, g = task % s->n_kv;
    const size_t gd = (size_t)G * d, qd = (size_t)s->n_heads * d;
    const size_t t0 = (j->n_tiles - 1 - (size_t)task / (size_t)s->n_kv) * j->per;
    const size_t T = j->T - t0 < j->per ? j->T - t0 : j->per;
    const float scale = s->scale;
    kvq_status st;
    if (j->T == 1) {
        st = kvq_attn_decode(j->cache, g, j->pos0 + 1, j->q + g * gd, G, scale, j->out + g * gd, s->ws[w]);
    } else if (s->n_kv == 1) {
        st = causal(j, g, j->pos0 + t0, T, j->q + t0 * qd, j->out + t0 * qd, s->ws[w]);
    } else {
        /* The heads of one group are contiguous within a token, not across tokens. */
        for (size_t t = 0; t < T; t++)
            memcpy(s->qg[w] + t * gd, j->q + (t0 + t) * qd + g * gd, gd * sizeof(float));
        st = causal(j, g, j->pos0 + t0, T, s->qg[w], s->og[w], s->ws[w]);
        for (size_t t = 0; t < T; t++)
            memcpy(j->out + (t0 + t) * qd + g * gd, s->og[w] + t * gd, gd * sizeof(float));
    }
    if (st != KVQ_OK)
        j->st[w] = st;
}

/* out[T][n_heads][d] for queries at positions pos0.. of a cache that already
 * holds them: (KV head x query tile) tasks in parallel over the pool (each
 * task writes its own rows, whose values do not depend on the thread). */
static kvq_status attend(struct cpu_store *s, const kvq_cache *cache, size_t pos0, size_t T, int tiled,
                         const float *q, float *out, const struct kvq_attn_recent *rec)
{
    /* a task's work must outweigh a wake-up of the pool */
    const int work = T * kvq_cache_len(cache) >= 256 ? s->n_work : 1;
    const size_t per = tiled ? task_positions(s, T, work) : T;
    struct attend_job j = {s, cache, pos0, T, per, (T + per - 1) / per, tiled, rec, q, out, {KVQ_OK}};
    kvq_par_for((int)((size_t)s->n_kv * j.n_tiles), work, attend_task, &j);
    for (int i = 0; i < s->n_work; i++)
        if (j.st[i] != KVQ_OK)
            return j.st[i];
    return KVQ_OK;
}

/* Generation order for a chunk (recent f16 window): each query must see the
 * f16 rows of its own page as they were when its token was the newest, and
 * the cache keeps the copies of its last page only. So the chunk's f16
 * copies, and those of the partly filled page before it, are kept here
 * (rec_k/rec_v, the rounding the cache gives its own), the chunk is appended
 * at once and attended as one, each query's page read from them
 * (kvq_attn_causal_recent). Short chunks (PER_POSITION_MAX) go a position at
 * a time, as their products do. */
static kvq_status append_attend_each(struct cpu_store *s, kvq_cache *cache, size_t pos0, size_t T, const float *k,
                                     const float *v, const float *q, float *out)
{
    const size_t d = (size_t)s->head_dim, kvd = (size_t)s->n_kv * d, qd = (size_t)s->n_heads * d;
    if (T <= PER_POSITION_MAX) {
        for (size_t t = 0; t < T; t++) {
            kvq_status st = kvq_cache_append(cache, 1, k + t * kvd, v + t * kvd);
            if (st == KVQ_OK)
                st = attend(s, cache, pos0 + t, 1, 0, q + t * qd, out + t * qd, NULL);
            if (st != KVQ_OK)
                return st;
        }
        return KVQ_OK;
    }
    size_t se, lo;
    kvq_status st = kvq_cache_f16_view(cache, pos0, &se, &lo); /* lo: the first copy of the page before */
    if (st != KVQ_OK)
        return st;
    if (pos0 - lo + T > s->rec_rows)
        return KVQ_ERR_INTERNAL; /* the store was made for chunks of max_rows */
    for (size_t t = lo; t < pos0; t++)
        for (int h = 0; h < s->n_kv; h++) {
            const uint16_t *hk = kvq_cache_f16_row(cache, 0, h, t), *hv = kvq_cache_f16_row(cache, 1, h, t);
            if (!hk || !hv)
                return KVQ_ERR_INTERNAL; /* the view names only rows the cache holds */
            memcpy(s->rec_k + (t - lo) * kvd + (size_t)h * d, hk, d * sizeof *hk);
            memcpy(s->rec_v + (t - lo) * kvd + (size_t)h * d, hv, d * sizeof *hv);
        }
    kvq_f32_to_f16_n(k, s->rec_k + (pos0 - lo) * kvd, T * kvd);
    kvq_f32_to_f16_n(v, s->rec_v + (pos0 - lo) * kvd, T * kvd);
    const struct kvq_attn_recent rec = {s->rec_k, s->rec_v, lo, pos0 - lo + T};
    if ((st = kvq_cache_append(cache, T, k, v)) != KVQ_OK)
        return st;
    return attend(s, cache, pos0, T, 1, q, out, &rec);
}

/* ---- sliding window: a ring of RING segment caches ------------------------
 * Token p lives in segment p / S (S = seg[layer]) of ring slot (p / S) % RING;
 * starting a segment resets the slot, which held tokens older than p - 2S:
 * never inside a window (W < S), nor inside one after a rollback of up to
 * 2S - W tokens. The window (p - W, p] spans at most two segments; its rows
 * are decoded (kvq_cache_read: what the fused kernels read) and attended in
 * double precision. */

struct window_job {
    struct cpu_store *s;
    int layer, seq;
    size_t p;
    const float *q;
    float *out;
    kvq_status st[KVQ_ATTN_MAX_WORKERS];
};

static void window_head(void *ctx, int g, int w)
{
    struct window_job *j = ctx;
    struct cpu_store *s = j->s;
    const int d = s->head_dim, G = s->n_heads / s->n_kv;
    const size_t S = s->seg[j->layer], W = (size_t)s->window[j->layer];
    const size_t a = j->p + 1 > W ? j->p + 1 - W : 0, n = j->p + 1 - a;
    float *K = s->wk[w], *V = s->wv[w];
    for (size_t pos = a; pos <= j->p;) {
        size_t sg = pos / S, here = (sg + 1) * S < j->p + 1 ? (sg + 1) * S - pos : j->p + 1 - pos;
        kvq_status st = kvq_cache_read(ring_of(s, j->layer, j->seq, sg), g, pos - sg * S, here,
                                       K + (pos - a) * (size_t)d, V + (pos - a) * (size_t)d);
        if (st != KVQ_OK) {
            j->st[w] = st;
            return;
        }
        pos += here;
    }
    const double scale = s->scale;
    double *sc = s->wsc[w];
    for (int h = 0; h < G; h++) {
        const float *qh = j->q + ((size_t)g * G + h) * (size_t)d;
        double mx = -INFINITY, sum = 0;
        for (size_t t = 0; t < n; t++) {
            double dot = 0;
            for (int i = 0; i < d; i++)
                dot += (double)qh[i] * K[t * (size_t)d + i];
            sc[t] = dot * scale;
            mx = sc[t] > mx ? sc[t] : mx;
        }
        for (size_t t = 0; t < n; t++)
            sum += sc[t] = exp(sc[t] - mx);
        float *o = j->out + ((size_t)g * G + h) * (size_t)d;
        for (int i = 0; i < d; i++) {
            double acc = 0;
            for (size_t t = 0; t < n; t++)
                acc += sc[t] * V[t * (size_t)d + i];
            o[i] = (float)(acc / sum);
        }
    }
}

/* Drops tokens [n, wlen) of a windowed layer. */
static void window_truncate(struct cpu_store *s, int layer, int seq, size_t n)
{
    size_t *L = &s->wlen[idx_of(s, layer, seq)];
    const size_t S = s->seg[layer];
    if (n >= *L)
        return;
    for (size_t sg = (*L - 1) / S + 1; sg-- > n / S;) {
        if (sg == n / S)
            kvq_cache_truncate(ring_of(s, layer, seq, sg), n - sg * S);
        else
            kvq_cache_reset(ring_of(s, layer, seq, sg));
    }
    *L = n;
}

/* Appends token by token, each then attending its window (the order of
 * generation, so a prefill sees what decoding sees). */
static kvq_status window_append_attend(struct cpu_store *s, int layer, int seq, size_t T, const float *k,
                                       const float *v, const float *q, float *out)
{
    const size_t kvd = (size_t)s->n_kv * s->head_dim, qd = (size_t)s->n_heads * s->head_dim, S = s->seg[layer];
    size_t *L = &s->wlen[idx_of(s, layer, seq)];
    for (size_t t = 0; t < T; t++) {
        const size_t p = *L;
        kvq_cache *c = ring_of(s, layer, seq, p / S);
        if (p % S == 0)
            kvq_cache_reset(c);
        kvq_status st = kvq_cache_append(c, 1, k + t * kvd, v + t * kvd);
        if (st != KVQ_OK)
            return st;
        (*L)++;
        struct window_job j = {s, layer, seq, p, q + t * qd, out + t * qd, {KVQ_OK}};
        kvq_par_for(s->n_kv, (size_t)s->window[layer] >= 256 ? s->n_work : 1, window_head, &j);
        for (int w = 0; w < s->n_work; w++)
            if (j.st[w] != KVQ_OK)
                return j.st[w];
    }
    return KVQ_OK;
}

/* Truncates (layer, seq) to n tokens, windowed or not. */
static void truncate_to(struct cpu_store *s, int layer, int seq, size_t n)
{
    if (s->window[layer])
        window_truncate(s, layer, seq, n);
    else if (kvq_cache_len(cache_of(s, layer, seq)) > n)
        kvq_cache_truncate(cache_of(s, layer, seq), n);
}

static kvq_status cpu_append_attend(kvq_kv_store *base, int layer, int n_seqs, const int *seqs, size_t T,
                                    const float *k, float *v, const float *q, float *out)
{
    struct cpu_store *s = (struct cpu_store *)base;
    const size_t kvd = (size_t)s->n_kv * s->head_dim, qd = (size_t)s->n_heads * s->head_dim;
    for (int i = 0; i < n_seqs; i++) {
        kvq_cache *cache = cache_of(s, layer, seqs[i]);
        size_t pos0 = len_of(s, layer, seqs[i]);
        const float *ki = k + (size_t)i * T * kvd, *qi = q + (size_t)i * T * qd;
        float *vi = v + (size_t)i * T * kvd, *oi = out + (size_t)i * T * qd;
        kvq_status st = norm_correct_v(s, cache, vi, T);
        if (st == KVQ_OK) {
            if (s->window[layer])
                st = window_append_attend(s, layer, seqs[i], T, ki, vi, qi, oi);
            else if (s->recent_f16 && T > 1)
                st = append_attend_each(s, cache, pos0, T, ki, vi, qi, oi);
            else if ((st = kvq_cache_append(cache, T, ki, vi)) == KVQ_OK)
                st = attend(s, cache, pos0, T, T > PER_POSITION_MAX, qi, oi, NULL);
        }
        if (st != KVQ_OK) { /* all or nothing over the call's sequences */
            truncate_to(s, layer, seqs[i], pos0);
            for (int j = 0; j < i; j++)
                truncate_to(s, layer, seqs[j], len_of(s, layer, seqs[j]) - T);
            return st;
        }
    }
    return KVQ_OK;
}

static kvq_status cpu_reserve(kvq_kv_store *base, int seq, size_t n)
{
    struct cpu_store *s = (struct cpu_store *)base;
    for (int l = 0; l < base->n_layers; l++) {
        if (s->window[l])
            continue; /* a ring reuses its pages */
        kvq_status st = kvq_cache_reserve(cache_of(s, l, seq), n);
        if (st != KVQ_OK)
            return st;
    }
    return KVQ_OK;
}

static void cpu_truncate(kvq_kv_store *base, int seq, int n_layers, size_t n)
{
    struct cpu_store *s = (struct cpu_store *)base;
    for (int l = 0; l < n_layers; l++)
        truncate_to(s, l, seq, n);
}

static void cpu_reset(kvq_kv_store *base, int seq)
{
    struct cpu_store *s = (struct cpu_store *)base;
    for (int l = 0; l < base->n_layers; l++) {
        for (int r = 0; r < (s->window[l] ? RING : 1); r++)
            kvq_cache_reset(ring_of(s, l, seq, (size_t)r));
        s->wlen[idx_of(s, l, seq)] = 0;
    }
}

static void cpu_trim(kvq_kv_store *base, int seq)
{
    struct cpu_store *s = (struct cpu_store *)base;
    for (int l = 0; l < base->n_layers; l++)
        for (int r = 0; r < (s->window[l] ? RING : 1); r++)
            kvq_cache_trim(ring_of(s, l, seq, (size_t)r));
}

static kvq_status cpu_share(kvq_kv_store *base, int dst, int src, size_t n)
{
    struct cpu_store *s = (struct cpu_store *)base;
    for (int l = 0; l < base->n_layers; l++) {
        kvq_status st = s->window[l] ? KVQ_ERR_UNSUPPORTED /* a ring's segments are not a prefix */
                                     : kvq_cache_share(cache_of(s, l, dst), cache_of(s, l, src), n);
        if (st != KVQ_OK) {
            cpu_reset(base, dst);
            cpu_trim(base, dst);
            return st;
        }
    }
    return KVQ_OK;
}

static void cpu_stats(const kvq_kv_store *base, int seq, struct kvq_cache_stats *sum)
{
    const struct cpu_store *s = (const struct cpu_store *)base;
    memset(sum, 0, sizeof *sum);
    for (int l = 0; l < base->n_layers; l++)
        for (int r = 0; r < (s->window[l] ? RING : 1); r++) {
            struct kvq_cache_stats cs;
            kvq_cache_get_stats(ring_of(s, l, seq, (size_t)r), &cs);
            sum->bytes_used += cs.bytes_used;
            sum->bytes_allocated += cs.bytes_allocated;
            sum->bytes_f16 += cs.bytes_f16;
            sum->bytes_f16_buffers += cs.bytes_f16_buffers;
            if (!s->window[l])
                sum->tokens = cs.tokens;
        }
    if (!sum->tokens) /* every layer windowed */
        sum->tokens = len_of(s, 0, seq);
}

static const kvq_cache *cpu_cache(const kvq_kv_store *base, int layer, int seq)
{
    return cache_of((const struct cpu_store *)base, layer, seq);
}

static void cpu_free(kvq_kv_store *base)
{
    struct cpu_store *s = (struct cpu_store *)base;
    for (size_t i = 0; s->caches && i < (size_t)base->n_layers * (size_t)base->max_seqs * RING; i++)
        kvq_cache_free(s->caches[i]);
    free(s->caches);
    for (int w = 0; w < s->n_work; w++) {
        free(s->wk ? s->wk[w] : NULL);
        free(s->wv ? s->wv[w] : NULL);
        free(s->wsc ? s->wsc[w] : NULL);
    }
    free(s->wk);
    free(s->wv);
    free(s->wsc);
    free(s->window);
    free(s->seg);
    free(s->wlen);
    for (int w = 0; w < s->n_work; w++) {
        kvq_attn_workspace_free(s->ws ? s->ws[w] : NULL);
        free(s->qg ? s->qg[w] : NULL);
        free(s->og ? s->og[w] : NULL);
    }
    free(s->ws);
    free(s->qg);
    free(s->og);
    free(s->rec_k);
    free(s->rec_v);
    free(s->vnc_packed);
    free(s->vnc_dec);
    free(s);
}

static kvq_status cpu_append(kvq_kv_store *base, int layer, int n_seqs, const int *seqs, size_t T, const float *k,
                             const float *v)
{
    struct cpu_store *s = (struct cpu_store *)base;
    const size_t kvd = (size_t)s->n_kv * s->head_dim;
    for (int i = 0; i < n_seqs; i++) {
        kvq_status st = kvq_cache_append(cache_of(s, layer, seqs[i]), T, k + (size_t)i * T * kvd,
                                         v + (size_t)i * T * kvd);
        if (st != KVQ_OK)
            return st;
    }
    return KVQ_OK;
}

static const struct kvq_kv_store_ops cpu_ops = {
    .append_attend = cpu_append_attend,
    .append = cpu_append,
    .reserve = cpu_reserve,
    .truncate = cpu_truncate,
    .reset = cpu_reset,
    .trim = cpu_trim,
    .share = cpu_share,
    .stats = cpu_stats,
    .cache = cpu_cache,
    .free = cpu_free,
};

kvq_status kvq_kv_store_cpu_create(const struct kvq_kv_store_config *cfg, kvq_kv_store **out, kvq_error *err)
{
    if (!cfg || !cfg->cfgs || cfg->n_layers < 1 || cfg->max_seqs < 1 || !out)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_kv_store_cpu_create: bad arguments");
    const struct kvq_cache_config *c0 = &cfg->cfgs[0];
    struct cpu_store *s = calloc(1, sizeof *s);
    if (!s)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    s->base.ops = &cpu_ops;
    s->base.n_layers = cfg->n_layers;
    s->base.max_seqs = cfg->max_seqs;
    s->n_kv = c0->n_kv_heads;
    s->n_heads = cfg->n_heads;
    s->head_dim = c0->head_dim;
    s->scale = cfg->attn_scale > 0 ? cfg->attn_scale : 1.0f / sqrtf((float)c0->head_dim);
    s->recent_f16 = c0->recent_f16;
    size_t n = (size_t)cfg->n_layers * (size_t)cfg->max_seqs, max_tokens = 0, max_window = 0;
    s->caches = calloc(n * RING, sizeof *s->caches);
    s->window = calloc((size_t)cfg->n_layers, sizeof *s->window);
    s->seg = calloc((size_t)cfg->n_layers, sizeof *s->seg);
    s->wlen = calloc(n, sizeof *s->wlen);
    if (!s->caches || !s->window || !s->seg || !s->wlen)
        goto nomem;
    kvq_status st;
    for (size_t i = 0; i < n * RING; i++) {
        const int l = (int)(i / RING / (size_t)cfg->max_seqs);
        struct kvq_cache_config wc = cfg->cfgs[l];
        const struct kvq_cache_config *cc = &wc;
        const int W = cfg->specs ? cfg->specs[l].window : 0; /* 0 where it holds the context */
        if (W > 0) { /* a ring of segments, without sinks */
            s->window[l] = W;
            s->seg[l] = KVQ_WINDOW_SEGMENT(W);
            max_window = (size_t)W > max_window ? (size_t)W : max_window;
            wc.max_tokens = s->seg[l];
            wc.sink_tokens = 0;
            wc.max_bytes /= RING;
        } else if (i % RING) {
            continue;
        }
        max_tokens = cc->max_tokens > max_tokens ? cc->max_tokens : max_tokens;
        if ((st = kvq_cache_create(cc, &s->caches[i])) != KVQ_OK) {
            cpu_free(&s->base);
            return kvq_error_set(err, st, "cannot create a %s/%s cache for head_dim %d: %s",
                                 kvq_type_traits(cc->type_k)->name, kvq_type_traits(cc->type_v)->name, cc->head_dim,
                                 kvq_status_str(st));
        }
    }
    s->n_work = kvq_par_threads();
    s->n_work = s->n_work < KVQ_ATTN_MAX_WORKERS ? s->n_work : KVQ_ATTN_MAX_WORKERS;
    s->ws = calloc((size_t)s->n_work, sizeof *s->ws);
    s->qg = calloc((size_t)s->n_work, sizeof *s->qg);
    s->og = calloc((size_t)s->n_work, sizeof *s->og);
    if (!s->ws || !s->qg || !s->og)
        goto nomem;
    size_t qd = (size_t)s->n_heads * s->head_dim, kvd = (size_t)s->n_kv * s->head_dim;
    for (int w = 0; w < s->n_work; w++) {
        if ((st = kvq_attn_workspace_create(s->head_dim, s->n_heads / s->n_kv, max_tokens, &s->ws[w])) != KVQ_OK) {
            cpu_free(&s->base);
            return kvq_error_set(err, st, "cannot create the attention workspace: %s", kvq_status_str(st));
        }
        s->qg[w] = malloc(cfg->max_rows * qd * sizeof(float));
        s->og[w] = malloc(cfg->max_rows * qd * sizeof(float));
        if (!s->qg[w] || !s->og[w])
            goto nomem;
    }
    if (max_window) {
        s->wk = calloc((size_t)s->n_work, sizeof *s->wk);
        s->wv = calloc((size_t)s->n_work, sizeof *s->wv);
        s->wsc = calloc((size_t)s->n_work, sizeof *s->wsc);
        if (!s->wk || !s->wv || !s->wsc)
            goto nomem;
        for (int w = 0; w < s->n_work; w++) {
            s->wk[w] = malloc(max_window * (size_t)s->head_dim * sizeof(float));
            s->wv[w] = malloc(max_window * (size_t)s->head_dim * sizeof(float));
            s->wsc[w] = malloc(max_window * sizeof(double));
            if (!s->wk[w] || !s->wv[w] || !s->wsc[w])
                goto nomem;
        }
    }
    if (s->recent_f16) {
        size_t P = 0;
        for (size_t i = 0; i < n * RING; i++)
            if (s->caches[i] && kvq_cache_layout(s->caches[i])->page_tokens > P)
                P = kvq_cache_layout(s->caches[i])->page_tokens;
        s->rec_rows = cfg->max_rows + P - 1;
        s->rec_k = malloc(s->rec_rows * kvd * sizeof *s->rec_k);
        s->rec_v = malloc(s->rec_rows * kvd * sizeof *s->rec_v);
        if (!s->rec_k || !s->rec_v)
            goto nomem;
    }
    if (cfg->v_norm_correct) {
        size_t rb = 0;
        for (size_t i = 0; i < n; i++) {
            size_t r = kvq_codec_row_bytes(kvq_cache_codec_v(s->caches[i]));
            rb = r > rb ? r : rb;
        }
        s->vnc_packed = malloc(cfg->max_rows * (size_t)s->n_kv * rb);
        s->vnc_dec = malloc(cfg->max_rows * kvd * sizeof(float));
        if (!s->vnc_packed || !s->vnc_dec)
            goto nomem;
    }
    *out = &s->base;
    return KVQ_OK;
nomem:
    cpu_free(&s->base);
    return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory for the KV store");
}
