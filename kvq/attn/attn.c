/* attn.c - workspace, argument checks and the block driver of fused decode
 * attention (the kernels are in attn_avx2.c and attn_ref.c; see
 * attn_internal.h for the structure of one block). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_internal.h"
#include "kvq_cpu.h"
#include "kvq_half.h"

static void *alloc64(size_t n_bytes)
{
    size_t sz = (n_bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, sz ? sz : 64);
    if (p)
        memset(p, 0, sz ? sz : 64);
    return p;
}

kvq_status kvq_attn_workspace_create(int head_dim, int max_q, size_t max_ctx, kvq_attn_workspace **out)
{
    if (!out || head_dim < 1 || max_q < 1 || max_ctx < 1)
        return KVQ_ERR_INVALID_ARG;
    if (head_dim > KVQ_MAX_DIM || max_q > KVQ_ATTN_MAX_Q)
        return KVQ_ERR_UNSUPPORTED;
    kvq_attn_workspace *ws = calloc(1, sizeof *ws);
    if (!ws)
        return KVQ_ERR_NOMEM;
    const size_t d = (size_t)head_dim, nq = (size_t)max_q, B = KVQ_ATTN_BLOCK;
    const size_t nq4 = (nq + KVQ_ATTN_QCHUNK - 1) / KVQ_ATTN_QCHUNK * KVQ_ATTN_QCHUNK;
    ws->dim = head_dim;
    ws->max_q = max_q;
    ws->max_ctx = max_ctx;
    ws->qprep = alloc64(nq * 2 * d * sizeof(float));
    ws->qsum = alloc64(nq * sizeof(float));
    ws->qint = alloc64(nq * d * sizeof(float));
    ws->lut = alloc64(nq4 / 2 * (d / 8) * 256 * sizeof(uint64_t));
    ws->lut_inv = alloc64(nq * sizeof(float));
    ws->dot = alloc64(nq * B * sizeof(float));
    ws->w = alloc64(nq * B * sizeof(float));
    ws->wv = alloc64(nq * B * sizeof(float));
    ws->wg = alloc64(nq * B * sizeof(float));
    ws->ssum = alloc64(2 * B * sizeof(uint64_t));
    ws->acc = alloc64(nq * d * sizeof(double));
    ws->acc_s = alloc64(nq * d * sizeof(double));
    ws->m = alloc64(nq * sizeof(double));
    ws->l = alloc64(nq * sizeof(double));
    ws->alpha = alloc64(nq * sizeof(double));
    ws->row = alloc64(nq * 2 * d * sizeof(float));
    /* the chunk kernels' (attn_chunk.c): one block of K, K^T and V, a pass's rows */
    const size_t crows = nq > KVQ_ATTN_PASS_ROWS ? nq : KVQ_ATTN_PASS_ROWS;
    ws->ck = alloc64(B * d * sizeof(float));
    ws->cv = alloc64(B * d * sizeof(float));
    ws->ckt = alloc64(B * d * sizeof(float));
    ws->crow = alloc64((KVQ_ATTN_CHUNK_ROWS * B + 4 * d) * sizeof(float));
    ws->cacc = alloc64(crows * d * sizeof(double));
    ws->cm = alloc64(crows * sizeof(double));
    ws->cl = alloc64(crows * sizeof(double));
    ws->cr = alloc64(sizeof *ws->cr);
    if (!ws->qprep || !ws->qsum || !ws->qint || !ws->lut || !ws->lut_inv || !ws->dot || !ws->w || !ws->wv || !ws->wg || !ws->ssum ||
        !ws->acc || !ws->acc_s || !ws->m || !ws->l || !ws->alpha || !ws->row || !ws->ck || !ws->cv || !ws->ckt ||
        !ws->crow || !ws->cacc || !ws->cm || !ws->cl || !ws->cr) {
        kvq_attn_workspace_free(ws);
        return KVQ_ERR_NOMEM;
    }
    *out = ws;
    return KVQ_OK;
}

void kvq_attn_workspace_free(kvq_attn_workspace *ws)
{
    if (!ws)
        return;
    free(ws->qprep);
    free(ws->qsum);
    free(ws->qint);
    free(ws->lut);
    free(ws->lut_inv);
    free(ws->dot);
    free(ws->w);
    free(ws->wv);
    free(ws->wg);
    free(ws->ssum);
    free(ws->acc);
    free(ws->acc_s);
    free(ws->m);
    free(ws->l);
    free(ws->alpha);
    free(ws->row);
    free(ws->ck);
    free(ws->cv);
    free(ws->ckt);
    free(ws->crow);
    free(ws->cacc);
    free(ws->cm);
    free(ws->cl);
    free(ws->cr);
    free(ws);
}

/* The checks every entry point shares; n_ctx is the longest context used.
 * A NaN or infinite scale is the caller's bad argument, not data: it would
 * turn every logit into NaN (or +-Inf, then NaN after max-subtraction) and
 * return garbage with KVQ_OK. */
kvq_status kvq_attn_check_args(const kvq_cache *c, int kv_head, size_t n_ctx, const float *q, int n_q, float scale,
                             const float *out, const kvq_attn_workspace *ws)
{
    if (!c || !q || !out || !ws || !isfinite(scale))
        return KVQ_ERR_INVALID_ARG;
    const struct kvq_cache_config *cfg = kvq_cache_config_of(c);
    if (kv_head < 0 || kv_head >= cfg->n_kv_heads || n_ctx == 0 || n_ctx > kvq_cache_len(c) ||
        n_q < 1 || n_q > ws->max_q || n_ctx > ws->max_ctx || ws->dim != cfg->head_dim)
        return KVQ_ERR_INVALID_ARG;
    return KVQ_OK;
}

kvq_status kvq_attn_check_queries(const float *q, size_t n, int d)
{
    for (size_t i = 0; i < n; i++)
        if (!kvq_all_finite(q + i * (size_t)d, d))
            return KVQ_ERR_NONFINITE;
    return KVQ_OK;
}

/* Asks for the rows of slots [s0, s0+n) of a head chunk to be brought into
 * L2. Pages are separate allocations of a few KiB, too short for the
 * hardware prefetchers to ramp up on: without this, long contexts run at
 * DRAM latency rather than bandwidth. */
static void prefetch_rows(const struct kvq_head_layout *hl, const uint8_t *chunk, size_t s0, size_t n)
{
    const uint32_t offs[4] = {hl->norm_off, hl->rnorm_off, hl->codes_off, hl->signs_off};
    const uint32_t sizes[4] = {2, 2, hl->codes_stride, hl->signs_stride};
    for (int f = 0; f < 4; f++) {
        if (offs[f] == KVQ_NO_SECTION)
            continue;
        const uint8_t *p = chunk + offs[f] + s0 * sizes[f], *end = p + n * sizes[f];
        for (; p < end; p += 64)
            __builtin_prefetch(p, 0, 2);
    }
}

kvq_status kvq_attn_decode(const kvq_cache *c, int kv_head, size_t n_ctx, const float *q, int n_q, float scale,
                           float *out, kvq_attn_workspace *ws)
{
    const int d = c ? kvq_cache_config_of(c)->head_dim : 0;
    const struct kvq_attn_kernels *kr = &kvq_attn_kernels_scalar;
    if (kvq_cpu_has_avx2() && d % 8 == 0)
        kr = kvq_attn_avx512_usable() && d % 16 == 0 ? &kvq_attn_kernels_avx512 : &kvq_attn_kernels_avx2;
    return kvq_attn_decode_kernels(kr, c, kv_head, n_ctx, q, n_q, scale, out, ws);
}

kvq_status kvq_attn_decode_kernels(const struct kvq_attn_kernels *kr, const kvq_cache *c, int kv_head, size_t n_ctx,
                                   const float *q, int n_q, float scale, float *out, kvq_attn_workspace *ws)
{
    kvq_status st = kvq_attn_check_args(c, kv_head, n_ctx, q, n_q, scale, out, ws);
    if (st != KVQ_OK)
        return st;
    const struct kvq_page_layout *pl = kvq_cache_layout(c);
    const int d = (int)pl->dim;
    if ((st = kvq_attn_check_queries(q, (size_t)n_q, d)) != KVQ_OK)
        return st;

    struct kvq_attn_job job = {kvq_cache_codec_k(c), kvq_cache_codec_v(c), &pl->k, &pl->v, d, n_q, scale, ws};
    const size_t D = (size_t)d;
    for (int h = 0; h < n_q; h++) {
        float *qp = ws->qprep + (size_t)h * 2 * D;
        if ((st = kvq_codec_prepare_query(job.ck, q + (size_t)h * D, qp)) != KVQ_OK)
            return st;
        if (job.ck->traits->qjl) {
            float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int j = 0; j < d; j++)
                s[j & 7] += qp[D + (size_t)j];
            ws->qsum[h] = kvq_reduce8(s);
        }
    }
    if (kr->prepare)
        kr->prepare(&job);
    for (int h = 0; h < n_q; h++) {
        ws->m[h] = -INFINITY;
        ws->l[h] = 0.0;
    }
    memset(ws->acc, 0, (size_t)n_q * D * sizeof *ws->acc);
    memset(ws->acc_s, 0, (size_t)n_q * D * sizeof *ws->acc_s);

    /* The packed pages serve [t_beg, t_end); f16 overrides the rest. */
    size_t t_beg, tail_lo;
    if ((st = kvq_cache_f16_view(c, n_ctx, &t_beg, &tail_lo)) != KVQ_OK)
        return st;
    const size_t t_end = tail_lo > t_beg ? tail_lo : t_beg;
    const size_t P = pl->page_tokens;
    /* key centering: a page's scores gain q . m~ (its key mean) */
    float *gain = ws->row;
    size_t gain_page = SIZE_MAX;
    for (size_t t0 = t_beg; t0 < t_end;) {
        size_t page = t0 / P, s0 = t0 % P, n = P - s0;
        if (n > KVQ_ATTN_BLOCK)
            n = KVQ_ATTN_BLOCK;
        if (n > t_end - t0)
            n = t_end - t0;
        const uint8_t *base = kvq_cache_page(c, page);
        struct kvq_attn_block b = {base + pl->k_off + (uint64_t)kv_head * pl->k.bytes,
                                   base + pl->v_off + (uint64_t)kv_head * pl->v.bytes, (uint32_t)s0,
                                   (uint32_t)n};
        if (t0 + n < t_end) { /* the next block, while this one computes */
            size_t t1 = t0 + n, s1 = t1 % P, n1 = P - s1;
            n1 = n1 > KVQ_ATTN_BLOCK ? KVQ_ATTN_BLOCK : n1;
            n1 = n1 > t_end - t1 ? t_end - t1 : n1;
            const uint8_t *nb = kvq_cache_page(c, t1 / P);
            prefetch_rows(&pl->k, nb + pl->k_off + (uint64_t)kv_head * pl->k.bytes, s1, n1);
            prefetch_rows(&pl->v, nb + pl->v_off + (uint64_t)kv_head * pl->v.bytes, s1, n1);
        }
        kr->score(&job, &b);
        const uint8_t *mb = pl->mean_bytes ? kvq_cache_key_mean(c, page, kv_head) : NULL;
        if (mb) {
            if (page != gain_page) {
                kr->mean_gain(mb, d, q, n_q, gain);
                gain_page = page;
            }
            for (int h = 0; h < n_q; h++)
                for (size_t i = 0; i < n; i++)
                    ws->dot[(size_t)h * KVQ_ATTN_BLOCK + i] += gain[h];
        }
        kr->softmax(&job, b.n);
        kr->value(&job, &b);
        t0 += n;
    }

    /* out = acc / l, back from V's stored domain with one rotation per head. */
    const kvq_codec *cv = job.cv;
    for (int h = 0; h < n_q && t_end > t_beg; h++) {
        float *o = out + (size_t)h * D, *t = ws->row;
        const double inv = 1.0 / ws->l[h];
        for (size_t j = 0; j < D; j++)
            o[j] = (float)(ws->acc[(size_t)h * D + j] * inv);
        if (cv->traits->rotated) {
            if (cv->traits->qjl) {
                for (size_t j = 0; j < D; j++)
                    t[j] = (float)(ws->acc_s[(size_t)h * D + j] * inv);
                kvq_rotation_apply_t(cv->qjl, t, t);
                for (size_t j = 0; j < D; j++)
                    o[j] += t[j];
            }
            kvq_rotation_apply_t(cv->rot, o, o);
        } else if (cv->rot) { /* rotated baseline */
            kvq_rotation_apply_t(cv->rot, o, o);
        }
        /* Only a float overflow of the scores (queries near FLT_MAX) gets here. */
        if (!kvq_all_finite(o, d))
            return KVQ_ERR_RANGE;
    }
    if (t_beg > 0 || tail_lo < n_ctx)
        return kvq_attn_merge_f16(kr, c, kv_head, n_ctx, t_beg, tail_lo, q, n_q, scale, t_end > t_beg, out, ws);
    return KVQ_OK;
}

/* Folds the f16 rows of the view into the packed partial result: out (the
 * packed rows' softmax average, back in the input domain) carries the weight
 * sum l at the running maximum m, so out * l re-enters an online softmax in
 * double that continues over the f16 rows (kr->f16_row, one row at a time). */
kvq_status kvq_attn_merge_f16(const struct kvq_attn_kernels *kr, const kvq_cache *c, int kv_head, size_t n_ctx,
                              size_t sink_end, size_t tail_lo, const float *q, int n_q, float scale,
                              int have_packed, float *out, kvq_attn_workspace *ws)
{
    const size_t d = (size_t)ws->dim;
    double *m = ws->m, *l = ws->l, *acc = ws->acc;
    for (int h = 0; h < n_q; h++) {
        if (!have_packed) {
            m[h] = -INFINITY;
            l[h] = 0.0;
        }
        for (size_t j = 0; j < d; j++)
            acc[(size_t)h * d + j] = have_packed ? (double)out[(size_t)h * d + j] * l[h] : 0.0;
    }
    for (size_t t = 0; t < n_ctx; t++) {
        if (t == sink_end && tail_lo > t)
            t = tail_lo; /* skip the packed range */
        if (t >= n_ctx)
            break;
        const uint16_t *hk = kvq_cache_f16_row(c, 0, kv_head, t), *hv = kvq_cache_f16_row(c, 1, kv_head, t);
        if (!hk || !hv)
            return KVQ_ERR_INTERNAL; /* the view names only rows the cache holds */
        kr->f16_row(hk, hv, q, n_q, (int)d, (double)scale, m, l, acc, ws->row);
    }
    for (int h = 0; h < n_q; h++)
        for (size_t j = 0; j < d; j++) {
            double o = acc[(size_t)h * d + j] / l[h];
            out[(size_t)h * d + j] = (float)o;
            if (!isfinite(o) || !isfinite((float)o))
                return KVQ_ERR_RANGE;
        }
    return KVQ_OK;
}
