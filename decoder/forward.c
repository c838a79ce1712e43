/* forward.c - one chunk of T tokens through every layer.
 *
 * Projections are row-major sgemm calls, x[T][in] . W[out][in]^T; the
 * output projections accumulate straight into the residual stream (beta = 1),
 * so the residual add costs nothing. Attention goes only through kvq's public
 * API: the chunk's post-RoPE keys and values are appended to the layer's
 * cache, then kvq_attn_causal (T > 1) or kvq_attn_decode (T = 1) reads them
 * back from the packed pages, once per KV head for its group of query heads.
 * With the recent f16 window (kvq_seq_config.recent_f16) a chunk is appended
 * and attended one position at a time instead (append_attend_each).
 */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "decoder_internal.h"
#include "matvec_internal.h"

/* y = x * w / rms(x), as HF's LlamaRMSNorm (float32 throughout). */
static void rmsnorm(const float *x, const float *w, float *y, int n, float eps)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++)
        y[i] = w[i] * (x[i] * r);
}

/* HF rotate_half RoPE: pairs (i, i + d/2) rotate by the angle of position p. */
static void rope(float *x, const float *cs, const float *sn, int d)
{
    int half = d / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cs[i] - b * sn[i];
        x[i + half] = b * cs[i] + a * sn[i];
    }
}

/* y[T][out] (+)= x[T][in] . w[out][in]^T. Decode and verification chunks go
 * through the batch-invariant few-row kernel, prefill chunks through sgemm. */
static void linear(const float *x, const float *w, float *y, size_t T, int in, int out, float beta)
{
    if (T <= KVQ_MATVEC_MAX_M)
        kvq_matvec(x, in, w, y, out, (int)T, out, in, beta != 0.0f);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, out, in, 1.0f, x, in, w, in, beta, y, out);
}

static void add_bias(float *y, const float *b, size_t T, int n)
{
    if (!b)
        return;
    for (size_t t = 0; t < T; t++)
        for (int i = 0; i < n; i++)
            y[t * (size_t)n + i] += b[i];
}

/* Splits qkv into q [T][n_heads][d], k and v [T][n_kv][d], applying the
 * optional q/k norm and RoPE at positions pos0 + t. */
static void split_rope(const kvq_seq *s, const struct kvq_layer_weights *w, size_t T)
{
    const kvq_model *m = s->m;
    const struct kvq_model_config *c = &m->cfg;
    int d = c->head_dim, half = d / 2;
    for (size_t t = 0; t < T; t++) {
        const float *row = s->qkv + t * (size_t)m->qkv_dim;
        const float *cs = m->rope_cos + (s->pos + t) * (size_t)half;
        const float *sn = m->rope_sin + (s->pos + t) * (size_t)half;
        float *q = s->q + t * (size_t)m->q_dim;
        float *k = s->k + t * (size_t)m->kv_dim;
        for (int h = 0; h < c->n_heads; h++) {
            float *qh = q + (size_t)h * d;
            if (w->q_norm)
                rmsnorm(row + (size_t)h * d, w->q_norm, qh, d, c->rms_eps);
            else
                memcpy(qh, row + (size_t)h * d, (size_t)d * sizeof *qh);
            rope(qh, cs, sn, d);
        }
        for (int h = 0; h < c->n_kv_heads; h++) {
            float *kh = k + (size_t)h * d;
            if (w->k_norm)
                rmsnorm(row + m->q_dim + (size_t)h * d, w->k_norm, kh, d, c->rms_eps);
            else
                memcpy(kh, row + m->q_dim + (size_t)h * d, (size_t)d * sizeof *kh);
            rope(kh, cs, sn, d);
        }
        memcpy(s->v + t * (size_t)m->kv_dim, row + m->q_dim + m->kv_dim, (size_t)m->kv_dim * sizeof(float));
    }
}

/* attn[T][n_heads][d] from the cache of layer l (which already holds the chunk). */
static kvq_status attention(kvq_seq *s, int l, size_t T)
{
    const kvq_model *m = s->m;
    const struct kvq_model_config *c = &m->cfg;
    int d = c->head_dim, G = c->n_heads / c->n_kv_heads;
    size_t gd = (size_t)G * d;
    float scale = 1.0f / sqrtf((float)d);
    const kvq_cache *cache = s->caches[l];
    for (int g = 0; g < c->n_kv_heads; g++) {
        kvq_status st;
        if (T == 1) {
            st = kvq_attn_decode(cache, g, s->pos + 1, s->q + g * gd, G, scale, s->attn + g * gd, s->ws);
        } else if (c->n_kv_heads == 1) {
            st = kvq_attn_causal(cache, g, s->pos, T, s->q, G, scale, s->attn, s->ws);
        } else {
            /* The heads of one group are contiguous within a token, not across tokens. */
            for (size_t t = 0; t < T; t++)
                memcpy(s->qg + t * gd, s->q + t * (size_t)m->q_dim + g * gd, gd * sizeof(float));
            st = kvq_attn_causal(cache, g, s->pos, T, s->qg, G, scale, s->og, s->ws);
            for (size_t t = 0; t < T; t++)
                memcpy(s->attn + t * (size_t)m->q_dim + g * gd, s->og + t * gd, gd * sizeof(float));
        }
        if (st != KVQ_OK)
            return st;
    }
    return KVQ_OK;
}

/* Value norm correction (kvq_seq_config.v_norm_correct). A tq value row
 * decodes to n R^T c[idx], whose norm n ||c[idx]|| falls short of n: the
 * codebook shrinks towards the centroids. The codes depend only on the
 * direction of x, so scaling x by ||x|| / ||x~|| before encoding leaves them
 * as they are and stores exactly the norm that makes ||x~|| = ||x|| (up to
 * the f16 rounding of the stored norm). */
static kvq_status norm_correct_v(kvq_seq *s, int l, size_t T)
{
    const kvq_codec *cv = kvq_cache_codec_v(s->caches[l]);
    if (!s->vnc_packed || !kvq_codec_traits(cv)->rotated)
        return KVQ_OK;
    const int d = s->m->cfg.head_dim;
    const size_t rows = T * (size_t)s->m->cfg.n_kv_heads;
    kvq_status st = kvq_codec_encode(cv, s->v, rows, s->vnc_packed);
    if (st == KVQ_OK)
        st = kvq_codec_decode(cv, s->vnc_packed, rows, s->vnc_dec);
    if (st != KVQ_OK)
        return st;
    for (size_t r = 0; r < rows; r++) {
        float *x = s->v + r * (size_t)d;
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

/* Generation order for a chunk (recent f16 window): append token t, then
 * attend for query t, so every query sees the f16 window exactly as it was
 * when its own token was the newest (pages filled later in the chunk are
 * not yet read packed). */
static kvq_status append_attend_each(kvq_seq *s, int l, size_t T)
{
    const kvq_model *m = s->m;
    const struct kvq_model_config *c = &m->cfg;
    int d = c->head_dim, G = c->n_heads / c->n_kv_heads;
    size_t gd = (size_t)G * d;
    float scale = 1.0f / sqrtf((float)d);
    kvq_cache *cache = s->caches[l];
    for (size_t t = 0; t < T; t++) {
        kvq_status st = kvq_cache_append(cache, 1, s->k + t * (size_t)m->kv_dim, s->v + t * (size_t)m->kv_dim);
        for (int g = 0; g < c->n_kv_heads && st == KVQ_OK; g++) {
            size_t off = t * (size_t)m->q_dim + g * gd; /* a group's heads are contiguous within a token */
            st = kvq_attn_decode(cache, g, s->pos + t + 1, s->q + off, G, scale, s->attn + off, s->ws);
        }
        if (st != KVQ_OK)
            return st;
    }
    return KVQ_OK;
}

static void rollback(kvq_seq *s, int n_layers)
{
    for (int l = 0; l < n_layers; l++)
        kvq_cache_truncate(s->caches[l], s->pos);
}

/* Timed sgemm: matmul time is reported apart from attention and host work. */
static void linear_timed(kvq_seq *s, const float *x, const float *w, float *y, size_t T, int in, int out, float beta)
{
    double t0 = kvq_now();
    linear(x, w, y, T, in, out, beta);
    s->tm.matmul += kvq_now() - t0;
}

kvq_status kvq_forward_chunk(kvq_seq *s, const int32_t *ids, size_t T)
{
    const kvq_model *m = s->m;
    const struct kvq_model_config *c = &m->cfg;
    int h = c->hidden, f = c->ffn;
    for (size_t t = 0; t < T; t++)
        kvq_st_to_f32_range(m->embed, (size_t)ids[t] * (size_t)h, (size_t)h, s->x + t * (size_t)h);

    for (int l = 0; l < c->n_layers; l++) {
        const struct kvq_layer_weights *w = &m->layers[l];
        for (size_t t = 0; t < T; t++)
            rmsnorm(s->x + t * (size_t)h, w->attn_norm, s->xn + t * (size_t)h, h, c->rms_eps);
        linear_timed(s, s->xn, w->wqkv, s->qkv, T, h, m->qkv_dim, 0.0f);
        add_bias(s->qkv, w->bqkv, T, m->qkv_dim);
        split_rope(s, w, T);
        if (s->hook)
            s->hook(s->hook_user, l, s->pos, T, s->q, s->k, s->v);

        double t0 = kvq_now();
        kvq_status st = norm_correct_v(s, l, T);
        if (st != KVQ_OK) {
            rollback(s, l);
            return st;
        }
        if (s->cfg.recent_f16 && T > 1) {
            st = append_attend_each(s, l, T);
        } else if ((st = kvq_cache_append(s->caches[l], T, s->k, s->v)) == KVQ_OK) {
            st = attention(s, l, T);
        }
        if (st != KVQ_OK) {
            rollback(s, l + 1); /* layer l may hold some of the chunk */
            return st;
        }
        s->tm.attn += kvq_now() - t0;

        linear_timed(s, s->attn, w->wo, s->x, T, m->q_dim, h, 1.0f);
        add_bias(s->x, w->bo, T, h);
        for (size_t t = 0; t < T; t++)
            rmsnorm(s->x + t * (size_t)h, w->ffn_norm, s->xn + t * (size_t)h, h, c->rms_eps);
        linear_timed(s, s->xn, w->wgu, s->gu, T, h, 2 * f, 0.0f);
        add_bias(s->gu, w->bgu, T, 2 * f);
        for (size_t t = 0; t < T; t++) {
            const float *g = s->gu + t * 2 * (size_t)f;
            float *o = s->hb + t * (size_t)f;
            for (int i = 0; i < f; i++)
                o[i] = g[i] / (1.0f + expf(-g[i])) * g[f + i];
        }
        linear_timed(s, s->hb, w->wdown, s->x, T, f, h, 1.0f);
        add_bias(s->x, w->bdown, T, h);
    }
    return KVQ_OK;
}
