/* attn_ref.c - the reference attention (dequantize, then attend in double)
 * and the scalar block kernels of the fused path (no SIMD; used when the CPU
 * lacks AVX2 or the head dim is not a multiple of 8). */
#include <math.h>
#include <string.h>

#include "attn_internal.h"
#include "kvq_half.h"

/* ---- reference ---- */

static struct kvq_row row_at(const kvq_cache *c, int v, int kv_head, size_t t)
{
    const struct kvq_page_layout *pl = kvq_cache_layout(c);
    const uint8_t *page = kvq_cache_page(c, t / pl->page_tokens);
    uint32_t slot = (uint32_t)(t % pl->page_tokens);
    if (v)
        return kvq_attn_row(&pl->v, page + pl->v_off + (uint64_t)kv_head * pl->v.bytes, slot);
    return kvq_attn_row(&pl->k, page + pl->k_off + (uint64_t)kv_head * pl->k.bytes, slot);
}

/* Token t's key and/or value rows as the view (sink_end, tail_lo) reads
 * them: the f16 copy for an override token, else the codec's decode_ref. */
static void ref_rows(const kvq_cache *c, int kv_head, size_t t, size_t sink_end, size_t tail_lo, float *k, float *v)
{
    const int d = kvq_cache_config_of(c)->head_dim;
    const int over = t < sink_end || t >= tail_lo;
    for (int side = 0; side < 2; side++) {
        float *dst = side ? v : k;
        if (!dst)
            continue;
        if (over) {
            const uint16_t *h = kvq_cache_f16_row(c, side, kv_head, t);
            for (int j = 0; j < d; j++)
                dst[j] = kvq_f16_to_f32(h[j]);
        } else {
            const kvq_codec *cd = side ? kvq_cache_codec_v(c) : kvq_cache_codec_k(c);
            struct kvq_row r = row_at(c, side, kv_head, t);
            cd->traits->decode_ref(cd, &r, dst);
            const uint8_t *m = side ? NULL : kvq_cache_key_mean(c, t / kvq_cache_layout(c)->page_tokens, kv_head);
            if (m) { /* key centering: the page's mean comes back */
                float mean[KVQ_MAX_DIM];
                kvq_key_mean_decode(m, d, mean);
                for (int j = 0; j < d; j++)
                    dst[j] += mean[j];
            }
        }
    }
}

static double dot_d(const float *a, const float *b, int d)
{
    double s = 0.0;
    for (int j = 0; j < d; j++)
        s += (double)a[j] * (double)b[j];
    return s;
}

kvq_status kvq_attn_decode_ref(const kvq_cache *c, int kv_head, size_t n_ctx, const float *q, int n_q, float scale,
                               float *out, kvq_attn_workspace *ws)
{
    if (!c || !q || !out || !ws || !isfinite(scale)) /* as kvq_attn_decode's check_args */
        return KVQ_ERR_INVALID_ARG;
    const struct kvq_cache_config *cfg = kvq_cache_config_of(c);
    const int d = cfg->head_dim;
    if (kv_head < 0 || kv_head >= cfg->n_kv_heads || n_ctx == 0 || n_ctx > kvq_cache_len(c) || n_q < 1 ||
        n_q > ws->max_q || n_ctx > ws->max_ctx || ws->dim != d)
        return KVQ_ERR_INVALID_ARG;
    for (int h = 0; h < n_q; h++)
        if (!kvq_all_finite(q + (size_t)h * d, d))
            return KVQ_ERR_NONFINITE;

    size_t sink_end, tail_lo;
    if (kvq_cache_f16_view(c, n_ctx, &sink_end, &tail_lo) != KVQ_OK)
        return KVQ_ERR_INVALID_ARG;
    const double ds = (double)scale;
    float *k = ws->row, *v = ws->row + d;
    double *m = ws->m, *l = ws->l, *acc = ws->acc;
    /* Pass 1: the exact maximum of every head's logits. */
    for (int h = 0; h < n_q; h++)
        m[h] = -INFINITY;
    for (size_t i = 0; i < n_ctx; i++) {
        ref_rows(c, kv_head, i, sink_end, tail_lo, k, NULL);
        for (int h = 0; h < n_q; h++) {
            double s = ds * dot_d(q + (size_t)h * d, k, d);
            if (s > m[h])
                m[h] = s;
        }
    }
    /* Pass 2: weights and the weighted sum of values, all in double. */
    memset(acc, 0, (size_t)n_q * (size_t)d * sizeof *acc);
    for (int h = 0; h < n_q; h++)
        l[h] = 0.0;
    for (size_t i = 0; i < n_ctx; i++) {
        ref_rows(c, kv_head, i, sink_end, tail_lo, k, v);
        for (int h = 0; h < n_q; h++) {
            double w = exp(ds * dot_d(q + (size_t)h * d, k, d) - m[h]);
            l[h] += w;
            for (int j = 0; j < d; j++)
                acc[(size_t)h * d + j] += w * (double)v[j];
        }
    }
    for (int h = 0; h < n_q; h++)
        for (int j = 0; j < d; j++) {
            double o = acc[(size_t)h * d + j] / l[h];
            out[(size_t)h * d + j] = (float)o;
            if (!isfinite(o) || !isfinite((float)o))
                return KVQ_ERR_RANGE;
        }
    return KVQ_OK;
}

/* ---- scalar block kernels ---- */

/* The codec's own reference score: n (q'.c + g (S q').s~) for tq types, a
 * plain dot product for baselines (the prepared query is q itself). */
static void score_scalar(const struct kvq_attn_job *job, const struct kvq_attn_block *b)
{
    const kvq_codec *ck = job->ck;
    kvq_attn_workspace *ws = job->ws;
    const size_t qs = 2 * (size_t)job->dim;
    for (uint32_t i = 0; i < b->n; i++) {
        struct kvq_row r = kvq_attn_row(job->hk, b->kchunk, b->s0 + i);
        for (int h = 0; h < job->n_q; h++)
            ws->dot[(size_t)h * KVQ_ATTN_BLOCK + i] = ck->traits->score_ref(ck, ws->qprep + (size_t)h * qs, &r);
    }
}

static void softmax_scalar(const struct kvq_attn_job *job, uint32_t n)
{
    kvq_attn_workspace *ws = job->ws;
    for (int h = 0; h < job->n_q; h++) {
        const float *dot = ws->dot + (size_t)h * KVQ_ATTN_BLOCK;
        float *w = ws->w + (size_t)h * KVQ_ATTN_BLOCK;
        float mb = -INFINITY;
        for (uint32_t i = 0; i < n; i++)
            mb = fmaxf(mb, job->scale * dot[i]);
        float mo = (float)ws->m[h], mn = fmaxf(mo, mb);
        ws->alpha[h] = mo == -INFINITY ? 0.0 : exp((double)mo - (double)mn);
        ws->m[h] = mn;
        float sum = 0.0f;
        for (uint32_t i = 0; i < n; i++) {
            w[i] = expf(job->scale * dot[i] - mn);
            sum += w[i];
        }
        ws->l[h] = ws->l[h] * ws->alpha[h] + (double)sum;
    }
}

/* acc = alpha acc + blk for every head, blk being [n_q][dim] floats. */
static void fold(double *acc, const float *blk, const struct kvq_attn_job *job)
{
    const size_t d = (size_t)job->dim;
    for (int h = 0; h < job->n_q; h++)
        for (size_t j = 0; j < d; j++)
            acc[(size_t)h * d + j] = job->ws->alpha[h] * acc[(size_t)h * d + j] + (double)blk[(size_t)h * d + j];
}

static void value_scalar(const struct kvq_attn_job *job, const struct kvq_attn_block *b)
{
    const kvq_codec *cv = job->cv;
    kvq_attn_workspace *ws = job->ws;
    const int d = job->dim, nq = job->n_q, qjl = cv->traits->qjl;
    /* Block sums in float (like the SIMD path), folded into double below. */
    float *blk = ws->row, tmp_s[KVQ_MAX_DIM];
    memset(blk, 0, (size_t)nq * (size_t)d * sizeof *blk);
    if (!cv->traits->rotated) { /* a rotated baseline sums in R's domain; attn.c rotates the result back */
        const struct kvq_type_traits *st = kvq_codec_stored_traits(cv);
        for (uint32_t i = 0; i < b->n; i++) {
            struct kvq_row r = kvq_attn_row(job->hv, b->vchunk, b->s0 + i);
            st->decode_ref(cv, &r, tmp_s);
            for (int h = 0; h < nq; h++) {
                float w = ws->w[(size_t)h * KVQ_ATTN_BLOCK + i];
                for (int j = 0; j < d; j++)
                    blk[(size_t)h * d + j] += w * tmp_s[j];
            }
        }
        fold(ws->acc, blk, job);
        return;
    }
    /* tq: sum_i w n_i c[idx_i] in R's domain, and for tqBj sum_i w n_i g_i s~_i in S's. */
    for (int pass = 0; pass < 1 + qjl; pass++) {
        memset(blk, 0, (size_t)nq * (size_t)d * sizeof *blk);
        for (uint32_t i = 0; i < b->n; i++) {
            struct kvq_row r = kvq_attn_row(job->hv, b->vchunk, b->s0 + i);
            float n = kvq_f16_to_f32(kvq_row_load_u16(r.norm));
            if (pass == 0) {
                for (int j = 0; j < d; j++)
                    tmp_s[j] = cv->centroids[kvq_code_get(r.codes, cv->bits, j)];
            } else {
                n *= kvq_f16_to_f32(kvq_row_load_u16(r.rnorm)) * cv->qjl_kappa_f;
                for (int j = 0; j < d; j++)
                    tmp_s[j] = (r.signs[j >> 3] >> (j & 7)) & 1u ? 1.0f : -1.0f;
            }
            for (int h = 0; h < nq; h++) {
                float w = ws->w[(size_t)h * KVQ_ATTN_BLOCK + i] * n;
                for (int j = 0; j < d; j++)
                    blk[(size_t)h * d + j] += w * tmp_s[j];
            }
        }
        fold(pass == 0 ? ws->acc : ws->acc_s, blk, job);
    }
}

/* One f16 override row (kvq_attn_f16_row_fn), all in double. */
static void f16_row_scalar(const uint16_t *hk, const uint16_t *hv, const float *q, int n_q, int d, double scale,
                           double *m, double *l, double *acc, float *tmp)
{
    float *k = tmp, *v = tmp + d;
    for (int j = 0; j < d; j++) {
        k[j] = kvq_f16_to_f32(hk[j]);
        v[j] = kvq_f16_to_f32(hv[j]);
    }
    for (int h = 0; h < n_q; h++) {
        double s = scale * dot_d(q + (size_t)h * d, k, d), *a = acc + (size_t)h * d;
        if (s > m[h]) { /* a new maximum rescales what came before */
            double r = m[h] == -INFINITY ? 0.0 : exp(m[h] - s);
            l[h] *= r;
            for (int j = 0; j < d; j++)
                a[j] *= r;
            m[h] = s;
        }
        double w = exp(s - m[h]);
        l[h] += w;
        for (int j = 0; j < d; j++)
            a[j] += w * (double)v[j];
    }
}

void kvq_attn_mean_gain_scalar(const uint8_t *blk, int d, const float *q, int n_q, float *gain)
{
    const float s = kvq_key_mean_scale(blk);
    for (int h = 0; h < n_q; h++) {
        const float *qh = q + (size_t)h * (size_t)d;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int j = 0; j < d; j++)
            acc[j & 7] += qh[j] * (float)(kvq_key_mean_code(blk, j) - 8);
        gain[h] = s * kvq_reduce8(acc);
    }
}

const struct kvq_attn_kernels kvq_attn_kernels_scalar = {NULL, score_scalar, softmax_scalar, value_scalar,
                                                         f16_row_scalar, kvq_attn_mean_gain_scalar};
