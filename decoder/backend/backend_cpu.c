/* backend_cpu.c - the decoder's ops on the CPU, over the model's weights in
 * their stored dtype (f32, bf16, f16; struct kvq_wmat).
 *
 * Projections are row-major x[T][in] . W[out][in]^T: chunks through OpenBLAS
 * sgemm, decode and verification rows through the batch-invariant few-row
 * kernel (matvec_internal.h), so a verified draft's greedy token is
 * bit-identical to plain decoding's. The output projections accumulate
 * straight into the residual stream (beta = 1), so the residual add costs
 * nothing. Norms accumulate in double; RoPE rows are computed per forward
 * (rope.c) in float32, as HF computes them.
 *
 * The LM head runs one vocabulary slice at a time: slices bound the scratch
 * memory (rows x slice) and are the unit a sharded model stores; when only
 * the greedy token is wanted, each slice is reduced to (best score, id) per
 * row as soon as it is computed, so the full [rows][vocab] logits never
 * exist.
 */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backend_cpu_internal.h"
#include "decoder_internal.h"
#include "expert_cache.h"
#include "matvec_internal.h"
#include "parallel.h"


struct cpu_backend {
    struct kvq_backend base;
    float *lm_x;       /* [max_rows][hidden] final-normed rows */
    float *lm_out;     /* [max_rows][max_lm_rows] one slice's logits */
    kvq_best *lm_best; /* [max_rows] best token so far per row (greedy) */
    float *logits;     /* [sample_rows][vocab] rows being sampled */
    size_t sample_rows;
    float *wtile;      /* [wtile_workers][SGEMM_SLICE][wtile_cols] weight rows widened to f32 for sgemm */
    int wtile_workers; /* pool threads it has room for (grown when the pool is) */
    size_t wtile_cols; /* widest input of a matrix */
    /* RoPE rows of the current forward's positions, computed by its first
     * layer and reused by the others (rope.c): set 0 for the model's RoPE,
     * set 1 for the local RoPE of windowed layers (Gemma 3) */
    struct rope_set {
        float *cs, *sn;          /* [max_rows][rotary_dim / 2] */
        int32_t *pos;            /* [max_rows] the positions they hold */
        size_t n;                /* rows they hold (0: none) */
        float inv[KVQ_MAX_DIM / 2], scale; /* fixed unless kvq_rope_len_dependent */
    } rope[2];
    struct kvq_cpu_moe *moe; /* mixture-of-experts scratch (moe_cpu.c); NULL for a dense model */
};

/* Makes set r hold the rows of pos[0..T). dynamic and longrope take the
 * frequencies of the longest sequence the call reaches, as transformers'
 * dynamic_rope_update does for one sequence. */
static const struct rope_set *rope_prepare(struct cpu_backend *cb, int r, const int32_t *pos, size_t T)
{
    const struct kvq_model_config *c = &cb->base.m->cfg;
    const int half = c->arch.rotary_dim / 2;
    struct rope_set *rs = &cb->rope[r];
    if (rs->n == T && memcmp(rs->pos, pos, T * sizeof *pos) == 0)
        return rs;
    if (r == 0 && kvq_rope_len_dependent(c)) {
        int32_t top = 0;
        for (size_t t = 0; t < T; t++)
            top = pos[t] > top ? pos[t] : top;
        kvq_rope_freqs(c, (size_t)top + 1, rs->inv, &rs->scale);
    }
    for (size_t t = 0; t < T; t++)
        kvq_rope_rows(rs->inv, rs->scale, half, (size_t)pos[t], 1, rs->cs + t * (size_t)half, rs->sn + t * (size_t)half);
    memcpy(rs->pos, pos, T * sizeof *pos);
    rs->n = T;
    return rs;
}

/* y = norm(x) with weights w over n values (HF's RMSNorm in float32, sum of
 * squares in double). */
static void norm_row(enum kvq_norm_kind kind, const float *x, const float *w, float *y, int n, float eps)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    if (kind == KVQ_NORM_RMS_UNIT_OFFSET)
        for (int i = 0; i < n; i++)
            y[i] = (1.0f + w[i]) * (x[i] * r);
    else
        for (int i = 0; i < n; i++)
            y[i] = w[i] * (x[i] * r);
}

/* RoPE of the first rd coordinates of x at the angles cs/sn [rd / 2]; the
 * rest of the head passes unrotated (partial rotary). */
static void rope_row(enum kvq_rope_kind kind, float *x, const float *cs, const float *sn, int rd)
{
    int half = rd / 2;
    for (int i = 0; i < half; i++) {
        int i0 = kind == KVQ_ROPE_INTERLEAVED ? 2 * i : i;
        int i1 = kind == KVQ_ROPE_INTERLEAVED ? 2 * i + 1 : i + half;
        float a = x[i0], b = x[i1];
        x[i0] = a * cs[i] - b * sn[i];
        x[i1] = b * cs[i] + a * sn[i];
    }
}

static int mv_dtype(enum kvq_st_dtype t)
{
    return t == KVQ_ST_BF16 ? KVQ_MV_BF16 : t == KVQ_ST_F16 ? KVQ_MV_F16 : KVQ_MV_F32;
}

/* The few-row kernel over a block's rows, split into row ranges over the
 * pool (parallel.h): each output element is computed alone, the same way
 * whatever range holds it, so the result does not depend on the split. */
struct mv_job {
    const float *x;
    const struct kvq_wblock *b;
    int K, ldy, M, acc, rows_per_task;
    float *y;
};

static void mv_task(void *p, int i, int w)
{
    (void)w;
    const struct mv_job *j = p;
    const int n0 = i * j->rows_per_task;
    const int n = j->b->rows - n0 < j->rows_per_task ? j->b->rows - n0 : j->rows_per_task;
    const size_t esz = kvq_st_dtype_size(j->b->dtype);
    kvq_matvec_w(j->x, j->K, (const uint8_t *)j->b->data + (size_t)n0 * (size_t)j->K * esz, mv_dtype(j->b->dtype),
                 j->y + n0, j->ldy, j->M, n, j->K, j->acc);
}

static void matvec_par(const float *x, const struct kvq_wblock *b, int K, float *y, int ldy, int M, int acc)
{
    const int threads = kvq_par_threads();
    /* below ~64K weights a wake-up of the pool costs more than it saves */
    if (threads == 1 || (size_t)b->rows * (size_t)K < ((size_t)1 << 16)) {
        kvq_matvec_w(x, K, b->data, mv_dtype(b->dtype), y, ldy, M, b->rows, K, acc);
        return;
    }
    int per = (b->rows + 4 * threads - 1) / (4 * threads);
    per = per < 16 ? 16 : (per + 1) & ~1;
    struct mv_job j = {x, b, K, ldy, M, acc, per, y};
    kvq_par_for((b->rows + per - 1) / per, threads, mv_task, &j);
}

/* y[T][ldy] (+)= x[T][K] . w[n][K]^T through sgemm, in slices of SGEMM_SLICE
 * weight rows over the pool, OpenBLAS itself single-threaded (kvq_set_threads):
 * its own threads spin for a while after each call and took the second core
 * from the attention's workers that follow (issue 44). The slices do not
 * depend on the thread count, so neither do the bits. */
#define SGEMM_SLICE 128
struct sgemm_job {
    int T, n, K, ldy;
    const float *x, *w;
    float beta;
    float *y;
    const struct kvq_wmat *wide; /* not NULL: widen rows r0 + a.. of it into the worker's scratch first */
    int r0;
    float *scratch;              /* [workers][SGEMM_SLICE][K] */
};

static void sgemm_task(void *p, int i, int w)
{
    const struct sgemm_job *j = p;
    const int a = i * SGEMM_SLICE, n = j->n - a < SGEMM_SLICE ? j->n - a : SGEMM_SLICE;
    const float *wa = j->w + (size_t)a * (size_t)j->K;
    if (j->wide) {
        float *t = j->scratch + (size_t)w * SGEMM_SLICE * (size_t)j->K;
        kvq_wmat_rows_f32(j->wide, j->r0 + a, n, t);
        wa = t;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->T, n, j->K, 1.0f, j->x, j->K, wa, j->K, j->beta,
                    j->y + a, j->ldy);
}

/* wide: the tasks widen their own slice of the weights' rows r0.. into
 * per-worker scratch, so a whole block is one pool loop (one start and one
 * wait of the threads per matrix, not one per tile of rows: each wait is a
 * point where the thread that started late holds the others up). */
static void sgemm_par(struct cpu_backend *cb, int T, int n, int K, const float *x, const float *w, float beta, float *y,
                      int ldy, const struct kvq_wmat *wide, int r0)
{
    int threads = kvq_par_threads();
    if (wide && cb->wtile_workers < threads) { /* the pool grew (kvq_set_threads) */
        const size_t bytes = (size_t)threads * SGEMM_SLICE * cb->wtile_cols * sizeof(float);
        float *t = aligned_alloc(64, (bytes + 63) / 64 * 64);
        if (t) {
            free(cb->wtile);
            cb->wtile = t;
            cb->wtile_workers = threads;
        } else {
            threads = cb->wtile_workers; /* out of memory: fewer threads, the same bits */
        }
    }
    struct sgemm_job j = {T, n, K, ldy, x, w, beta, y, wide, r0, cb->wtile};
    kvq_par_for((n + SGEMM_SLICE - 1) / SGEMM_SLICE, threads, sgemm_task, &j);
}

/* y[T][ldy] (+)= x[T][cols] . w[rows][cols]^T, block by block. Few rows: the
 * batch-invariant kernel widens the weights as it loads them. More: sgemm,
 * straight over an aligned f32 block, else over slices widened to f32 by the
 * sgemm tasks themselves (prefill pays one widening per chunk, not per row). */
static void matmul(struct cpu_backend *cb, const struct kvq_wmat *w, const float *x, float *y, int ldy, size_t T,
                   int accumulate)
{
    const int K = w->cols;
    const float beta = accumulate ? 1.0f : 0.0f;
    int r0 = 0;
    for (int i = 0; i < w->n_blocks; i++) {
        const struct kvq_wblock *b = &w->b[i];
        if (T <= KVQ_MATVEC_MAX_M)
            matvec_par(x, b, K, y + r0, ldy, (int)T, accumulate);
        else if (b->dtype == KVQ_ST_F32 && (uintptr_t)b->data % sizeof(float) == 0)
            sgemm_par(cb, (int)T, b->rows, K, x, b->data, beta, y + r0, ldy, NULL, 0);
        else
            sgemm_par(cb, (int)T, b->rows, K, x, NULL, beta, y + r0, ldy, w, r0);
        r0 += b->rows;
    }
}

void kvq_cpu_matmul(kvq_backend *b, const struct kvq_wmat *w, const float *x, float *y, int ldy, size_t T,
                    int accumulate)
{
    matmul((struct cpu_backend *)b, w, x, y, ldy, T, accumulate);
}

/* Row-wise steps (norms, RoPE, the GLU) of a prefill chunk over the pool in
 * ranges of ROWS_PER_TASK rows: each row is computed alone, the same way on
 * any thread, so the bits do not change; left serial they were ~5% of a
 * 1-thread prefill that a second thread could not share. Few rows (decode)
 * stay on the caller: a wake-up of the pool would cost more. */
#define ROWS_PER_TASK 16
struct rows_job {
    void (*fn)(void *ctx, size_t t0, size_t t1);
    void *ctx;
    size_t T;
};

static void rows_task(void *p, int i, int w)
{
    (void)w;
    const struct rows_job *j = p;
    const size_t t0 = (size_t)i * ROWS_PER_TASK, t1 = j->T - t0 < ROWS_PER_TASK ? j->T : t0 + ROWS_PER_TASK;
    j->fn(j->ctx, t0, t1);
}

static void par_rows(size_t T, void (*fn)(void *ctx, size_t t0, size_t t1), void *ctx)
{
    if (T <= KVQ_MATVEC_MAX_M || kvq_par_threads() == 1) {
        fn(ctx, 0, T);
        return;
    }
    struct rows_job j = {fn, ctx, T};
    kvq_par_for((int)((T + ROWS_PER_TASK - 1) / ROWS_PER_TASK), kvq_par_threads(), rows_task, &j);
}

static void cpu_embed(kvq_backend *b, const int32_t *ids, size_t T, float *x)
{
    const kvq_model *m = b->m;
    const size_t h = (size_t)m->cfg.hidden;
    const float scale = m->cfg.arch.embed_scale;
    for (size_t t = 0; t < T; t++) {
        float *row = x + t * h;
        kvq_st_to_f32_range(m->embed, (size_t)ids[t] * h, h, row);
        if (scale != 1.0f)
            for (size_t i = 0; i < h; i++)
                row[i] *= scale;
    }
}

struct norm_ctx {
    enum kvq_norm_kind kind;
    const float *x, *w;
    float *y;
    int h;
    float eps;
};

static void norm_rows(void *p, size_t t0, size_t t1)
{
    const struct norm_ctx *c = p;
    for (size_t t = t0; t < t1; t++)
        norm_row(c->kind, c->x + t * (size_t)c->h, c->w, c->y + t * (size_t)c->h, c->h, c->eps);
}

static void cpu_norm(kvq_backend *b, enum kvq_norm_site site, int layer, const float *x, float *y, size_t T)
{
    const kvq_model *m = b->m;
    const int h = m->cfg.hidden;
    const struct kvq_layer_weights *lw = &m->layers[site == KVQ_NORM_FINAL ? 0 : layer];
    const float *w = site == KVQ_NORM_FINAL       ? m->final_norm
                     : site == KVQ_NORM_ATTN      ? lw->attn_norm
                     : site == KVQ_NORM_POST_ATTN ? lw->post_attn_norm
                     : site == KVQ_NORM_POST_FFN  ? lw->post_ffn_norm
                                                  : lw->ffn_norm;
    if (site == KVQ_NORM_POST_ATTN || site == KVQ_NORM_POST_FFN) { /* y += norm(x), a row at a time */
        float *row = ((struct cpu_backend *)b)->lm_x; /* the LM head's scratch, idle inside the layers */
        for (size_t t = 0; t < T; t++) {
            norm_row(m->cfg.arch.norm, x + t * (size_t)h, w, row, h, m->cfg.rms_eps);
            for (int i = 0; i < h; i++)
                y[t * (size_t)h + i] += row[i];
        }
        return;
    }
    struct norm_ctx nc = {m->cfg.arch.norm, x, w, y, h, m->cfg.rms_eps};
    par_rows(T, norm_rows, &nc);
}

static void cpu_linear(kvq_backend *b, enum kvq_weight which, int layer, const float *x, float *y, size_t T,
                       int accumulate)
{
    const kvq_model *m = b->m;
    const float *W, *bias;
    int in, out;
    kvq_weight_pick(&m->layers[layer], which, m->cfg.hidden, m->cfg.ffn, m->q_dim, m->qkv_dim, &W, &bias, &in, &out);
    matmul((struct cpu_backend *)b, &m->mats[layer][which], x, y, out, T, accumulate);
    for (size_t t = 0; bias && t < T; t++)
        for (int i = 0; i < out; i++)
            y[t * (size_t)out + i] += bias[i];
}

static void cpu_set_pos(kvq_backend *b, const int32_t *pos, size_t T)
{
    memcpy(b->pos, pos, T * sizeof *pos);
}

struct rope_ctx {
    const kvq_model *m;
    const struct kvq_layer_weights *w;
    const struct rope_set *rs;
    const float *qkv;
    float *q, *k, *v;
};

static void qkv_rope_rows(void *p, size_t t0, size_t t1)
{
    const struct rope_ctx *rc = p;
    const kvq_model *m = rc->m;
    const struct kvq_model_config *c = &m->cfg;
    const struct kvq_layer_weights *w = rc->w;
    const int d = c->head_dim, rd = c->arch.rotary_dim, half = rd / 2;
    const int full = c->arch.qk_norm_full; /* OLMoE: one norm over all heads, before the split */
    for (size_t t = t0; t < t1; t++) {
        const float *row = rc->qkv + t * (size_t)m->qkv_dim;
        const float *cs = rc->rs->cs + t * (size_t)half;
        const float *sn = rc->rs->sn + t * (size_t)half;
        float *qt = rc->q + t * (size_t)m->q_dim, *kt = rc->k + t * (size_t)m->kv_dim;
        if (full) {
            norm_row(c->arch.norm, row, w->q_norm, qt, m->q_dim, c->rms_eps);
            norm_row(c->arch.norm, row + m->q_dim, w->k_norm, kt, m->kv_dim, c->rms_eps);
        }
        for (int hd = 0; hd < c->n_heads; hd++) {
            float *qh = qt + (size_t)hd * d;
            if (!full && w->q_norm)
                norm_row(c->arch.norm, row + (size_t)hd * d, w->q_norm, qh, d, c->rms_eps);
            else if (!full)
                memcpy(qh, row + (size_t)hd * d, (size_t)d * sizeof *qh);
            rope_row(c->arch.rope, qh, cs, sn, rd);
        }
        for (int hd = 0; hd < c->n_kv_heads; hd++) {
            float *kh = kt + (size_t)hd * d;
            if (!full && w->k_norm)
                norm_row(c->arch.norm, row + m->q_dim + (size_t)hd * d, w->k_norm, kh, d, c->rms_eps);
            else if (!full)
                memcpy(kh, row + m->q_dim + (size_t)hd * d, (size_t)d * sizeof *kh);
            rope_row(c->arch.rope, kh, cs, sn, rd);
        }
        memcpy(rc->v + t * (size_t)m->kv_dim, row + m->q_dim + m->kv_dim, (size_t)m->kv_dim * sizeof(float));
    }
}

static void cpu_qkv_rope(kvq_backend *b, int layer, const float *qkv, size_t T, const int32_t *pos, float *q,
                         float *k, float *v)
{
    const kvq_model *m = b->m;
    struct cpu_backend *cb = (struct cpu_backend *)b;
    /* the RoPE rows first, on this thread: they are cached across layers */
    const struct rope_set *rs = rope_prepare(cb, kvq_rope_layer_local(&m->cfg, layer), pos, T);
    struct rope_ctx rc = {m, &m->layers[layer], rs, qkv, q, k, v};
    par_rows(T, qkv_rope_rows, &rc);
}

struct glu_ctx {
    const float *gu;
    float *h;
    int f;
    enum kvq_act_kind kind;
};

static void glu_rows(void *p, size_t t0, size_t t1)
{
    const struct glu_ctx *c = p;
    for (size_t t = t0; t < t1; t++) {
        const float *g = c->gu + t * 2 * (size_t)c->f;
        float *o = c->h + t * (size_t)c->f;
        for (int i = 0; i < c->f; i++)
            o[i] = kvq_cpu_act(c->kind, g[i]) * g[c->f + i];
    }
}

static void cpu_glu(kvq_backend *b, const float *gu, float *hbuf, size_t T)
{
    struct glu_ctx c = {gu, hbuf, b->m->cfg.ffn, b->m->cfg.arch.act};
    par_rows(T, glu_rows, &c);
}

static void cpu_moe_route(kvq_backend *b, int layer, const float *x, size_t T)
{
    kvq_cpu_moe_route(b, ((struct cpu_backend *)b)->moe, layer, x, T);
}

static kvq_status cpu_moe_experts(kvq_backend *b, int layer, const float *x, float *y, size_t T)
{
    return kvq_cpu_moe_experts(b, ((struct cpu_backend *)b)->moe, layer, x, y, T);
}

static const struct kvq_backend_ops cpu_ops; /* below: what tells a CPU backend */

kvq_status kvq_backend_cpu_expert_cache(kvq_backend *b, size_t bytes, int prefetch, int direct, kvq_error *err)
{
    struct cpu_backend *cb = (struct cpu_backend *)b;
    if (b->ops != &cpu_ops || !cb->moe)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "expert cache: %s",
                             b->ops != &cpu_ops ? "not a CPU backend" : "the model has no experts");
    return kvq_cpu_moe_set_cache(b, cb->moe, bytes, prefetch, direct, err);
}

int kvq_backend_cpu_expert_stats(const kvq_backend *b, struct kvq_expert_stats *st)
{
    const struct cpu_backend *cb = (const struct cpu_backend *)b;
    struct kvq_expert_cache_stats es;
    memset(st, 0, sizeof *st);
    if (b->ops != &cpu_ops || !cb->moe || !kvq_cpu_moe_cache_stats(cb->moe, &es))
        return 0;
    *st = (struct kvq_expert_stats){es.slots * es.slot_bytes, es.hits, es.misses, es.bytes_read, es.read_seconds,
                                    es.prefetched, es.prefetch_bytes, es.prefetch_seconds, es.prefetch_hits,
                                    es.prefetch_wait_seconds};
    return 1;
}

const char *kvq_backend_cpu_expert_error(const kvq_backend *b)
{
    const struct cpu_backend *cb = (const struct cpu_backend *)b;
    return b && b->ops == &cpu_ops && cb->moe ? kvq_cpu_moe_cache_error(cb->moe) : NULL;
}

static void softcap(float *y, int n, float c)
{
    for (int i = 0; i < n; i++)
        y[i] = c * tanhf(y[i] / c);
}

static kvq_status cpu_lm_head(kvq_backend *b, const float *x, size_t R, float *logits, int32_t *argmax)
{
    struct cpu_backend *cb = (struct cpu_backend *)b;
    const kvq_model *m = b->m;
    const struct kvq_model_config *c = &m->cfg;
    if (R == 0 || (!logits && !argmax))
        return KVQ_OK;
    cpu_norm(b, KVQ_NORM_FINAL, 0, x, cb->lm_x, R);
    for (size_t r = 0; r < R; r++)
        cb->lm_best[r] = kvq_best_none();
    kvq_status st = KVQ_OK;
    for (int k = 0; k < m->n_lm; k++) {
        const struct kvq_lm_slice *sl = &m->lm[k];
        /* With full logits wanted, write each slice straight into its columns. */
        float *out = logits ? logits + sl->start : cb->lm_out;
        int ldc = logits ? c->vocab : sl->count;
        matmul(cb, &sl->wm, cb->lm_x, out, ldc, R, 0); /* few rows: batch-invariant (verify = decode) */
        for (size_t r = 0; c->arch.final_softcap > 0 && r < R; r++)
            softcap(out + r * (size_t)ldc, sl->count, c->arch.final_softcap);
        for (size_t r = 0; argmax && r < R && st == KVQ_OK; r++) {
            kvq_best best;
            st = kvq_argmax(out + r * (size_t)ldc, sl->count, sl->start, &best);
            kvq_best_merge(&cb->lm_best[r], best); /* ties: lowest id, whatever the slice order */
        }
    }
    for (size_t r = 0; argmax && r < R; r++)
        argmax[r] = cb->lm_best[r].token;
    return st;
}

/* The rows' logits, at most KVQ_MATVEC_MAX_M at a time (the few-row kernel:
 * each row gets what it gets alone), through the host sampler. */
static kvq_status cpu_lm_sample(kvq_backend *b, const float *x, size_t R, kvq_sampler *const *smp, const double *u,
                                int32_t *tok, kvq_status *row_st)
{
    struct cpu_backend *cb = (struct cpu_backend *)b;
    const size_t V = (size_t)b->m->cfg.vocab, h = (size_t)b->m->cfg.hidden;
    for (size_t r0 = 0; r0 < R; r0 += cb->sample_rows) {
        const size_t n = R - r0 < cb->sample_rows ? R - r0 : cb->sample_rows;
        cpu_lm_head(b, x + r0 * h, n, cb->logits, NULL); /* no argmax: cannot fail */
        for (size_t r = 0; r < n; r++)
            row_st[r0 + r] = kvq_sampler_pick(smp[r0 + r], cb->logits + r * V, u[r0 + r], &tok[r0 + r]);
    }
    return KVQ_OK;
}

static void cpu_free(kvq_backend *b)
{
    struct cpu_backend *cb = (struct cpu_backend *)b;
    float **slot[KVQ_N_ACTS];
    size_t floats[KVQ_N_ACTS];
    kvq_acts_table(&b->acts, b->m, 0, slot, floats);
    for (int i = 0; i < KVQ_N_ACTS; i++)
        free(*slot[i]);
    free(cb->lm_x);
    free(cb->lm_out);
    free(cb->lm_best);
    free(cb->logits);
    free(cb->wtile);
    kvq_cpu_moe_free(b, cb->moe);
    for (int r = 0; r < 2; r++) {
        free(cb->rope[r].cs);
        free(cb->rope[r].sn);
        free(cb->rope[r].pos);
    }
    free(b->pos);
    free(cb);
}

static const struct kvq_backend_ops cpu_ops = {
    .embed = cpu_embed,
    .norm = cpu_norm,
    .linear = cpu_linear,
    .qkv_rope = cpu_qkv_rope,
    .glu = cpu_glu,
    .moe_route = cpu_moe_route,
    .moe_experts = cpu_moe_experts,
    .lm_head = cpu_lm_head,
    .lm_sample = cpu_lm_sample,
    .free = cpu_free,
    .set_pos = cpu_set_pos,
};

static float *alloc_f(size_t n)
{
    return aligned_alloc(64, ((n * sizeof(float) + 63) / 64) * 64);
}

kvq_status kvq_backend_cpu_create(const kvq_model *m, size_t max_rows, kvq_backend **out)
{
    struct cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb)
        return KVQ_ERR_NOMEM;
    kvq_backend *b = &cb->base;
    b->ops = &cpu_ops;
    b->name = "cpu";
    b->m = m;
    b->max_rows = max_rows;
    float **slot[KVQ_N_ACTS];
    size_t floats[KVQ_N_ACTS];
    kvq_acts_table(&b->acts, m, max_rows, slot, floats);
    int ok = 1;
    for (int i = 0; i < KVQ_N_ACTS; i++)
        ok &= (*slot[i] = alloc_f(floats[i])) != NULL;
    cb->lm_x = alloc_f(max_rows * (size_t)m->cfg.hidden);
    cb->lm_out = alloc_f(max_rows * (size_t)m->max_lm_rows);
    cb->lm_best = malloc(max_rows * sizeof *cb->lm_best);
    cb->sample_rows = max_rows < KVQ_MATVEC_MAX_M ? max_rows : KVQ_MATVEC_MAX_M;
    cb->logits = alloc_f(cb->sample_rows * (size_t)m->cfg.vocab);
    size_t widest = (size_t)m->cfg.hidden;
    widest = (size_t)m->cfg.ffn > widest ? (size_t)m->cfg.ffn : widest;
    widest = (size_t)m->q_dim > widest ? (size_t)m->q_dim : widest;
    widest = (size_t)m->cfg.arch.moe_ffn > widest ? (size_t)m->cfg.arch.moe_ffn : widest; /* experts' down */
    cb->wtile_cols = widest;
    cb->wtile_workers = kvq_par_threads();
    cb->wtile = alloc_f((size_t)cb->wtile_workers * SGEMM_SLICE * widest);
    b->pos = malloc(max_rows * sizeof *b->pos);
    const size_t half = (size_t)m->cfg.arch.rotary_dim / 2;
    for (int r = 0; r < 2; r++) {
        cb->rope[r].cs = alloc_f(max_rows * half);
        cb->rope[r].sn = alloc_f(max_rows * half);
        cb->rope[r].pos = malloc(max_rows * sizeof *cb->rope[r].pos);
        ok &= cb->rope[r].cs && cb->rope[r].sn && cb->rope[r].pos;
    }
    kvq_rope_freqs(&m->cfg, 0, cb->rope[0].inv, &cb->rope[0].scale);
    if (m->cfg.arch.rope_local_theta > 0)
        kvq_rope_freqs_local(&m->cfg, cb->rope[1].inv, &cb->rope[1].scale);
    ok &= kvq_cpu_moe_create(b, &cb->moe) == KVQ_OK;
    if (!ok || !cb->lm_x || !cb->lm_out || !cb->lm_best || !cb->logits || !cb->wtile || !b->pos) {
        cpu_free(b);
        return KVQ_ERR_NOMEM;
    }
    *out = b;
    return KVQ_OK;
}
