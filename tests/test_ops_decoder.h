/* test_ops_decoder.h - the decoder's backend ops (decoder/backend/backend.h)
 * as cases of test_backend_ops: each on the CPU backend and the CUDA backend
 * against its definition computed here in double precision, over the
 * bundled model's weights with the descriptor (struct kvq_model_arch) set to
 * the case's kinds:
 *
 *   embed     the embedding row times arch.embed_scale (1; Gemma's sqrt(hidden))
 *   norm      site (attn, ffn, final; the sandwich sites post-attn and
 *             post-ffn add norm(x) into y) x kind (RMSNorm, (1 + w) RMSNorm)
 *   qkv-rope  q/k/v split, the optional per-head q/k norm, RoPE pairs (half,
 *             interleaved) over the leading rotary_dim coordinates at
 *             pos * theta^(-2i / rotary_dim) with transformers' float32 angle;
 *             Gemma 3's local base on a windowed layer
 *   glu       act(gate) * up (SiLU, tanh-GELU)
 *   lm-head   final norm, the LM head, the soft-cap c tanh(l / c), argmax
 *
 * Three rows at positions 0, 37 and 1000. Sampling on the GPU against the
 * CPU sampler is test_sample_cuda's. Included by test_backend_ops.c only.
 */
#ifndef KVQ_TEST_OPS_DECODER_H
#define KVQ_TEST_OPS_DECODER_H

#include <math.h>

#include "backend.h"
#include "decoder_internal.h"
#include "kvq_cuda.h"
#include "kvq_rng.h"
#include "test.h"

enum dop { DOP_EMBED, DOP_NORM, DOP_ROPE, DOP_GLU, DOP_LM };

struct dop_variant {
    const char *name;
    int site;    /* norm: enum kvq_norm_site */
    int norm;    /* norm, qkv-rope's q/k norm: enum kvq_norm_kind */
    int kind;    /* qkv-rope: enum kvq_rope_kind; glu: enum kvq_act_kind */
    int rd_half; /* qkv-rope: rotary_dim = head_dim / 2 */
    int qk_norm; /* qkv-rope: per-head q/k norm weights */
    int local;   /* qkv-rope: a windowed layer with a local base (Gemma 3) */
    float value; /* embed: the scale (0: sqrt(hidden)); lm-head: the soft-cap (0: none) */
};

#define DN(s, sn, k, kn) {sn "-" kn, s, k, 0, 0, 0, 0, 0}
static const struct dop_variant DOP_NORMS[] = {
    DN(KVQ_NORM_ATTN, "attn", KVQ_NORM_RMS, "rms"),           DN(KVQ_NORM_ATTN, "attn", KVQ_NORM_RMS_UNIT_OFFSET, "rms+1"),
    DN(KVQ_NORM_FFN, "ffn", KVQ_NORM_RMS, "rms"),             DN(KVQ_NORM_FFN, "ffn", KVQ_NORM_RMS_UNIT_OFFSET, "rms+1"),
    DN(KVQ_NORM_FINAL, "final", KVQ_NORM_RMS, "rms"),         DN(KVQ_NORM_FINAL, "final", KVQ_NORM_RMS_UNIT_OFFSET, "rms+1"),
    DN(KVQ_NORM_POST_ATTN, "post-attn", KVQ_NORM_RMS, "rms"), DN(KVQ_NORM_POST_ATTN, "post-attn", KVQ_NORM_RMS_UNIT_OFFSET, "rms+1"),
    DN(KVQ_NORM_POST_FFN, "post-ffn", KVQ_NORM_RMS, "rms"),   DN(KVQ_NORM_POST_FFN, "post-ffn", KVQ_NORM_RMS_UNIT_OFFSET, "rms+1"),
};
#undef DN
static const struct dop_variant DOP_ROPES[] = {
    {"half", 0, KVQ_NORM_RMS, KVQ_ROPE_HALF, 0, 0, 0, 0},
    {"half-rd/2", 0, KVQ_NORM_RMS, KVQ_ROPE_HALF, 1, 0, 0, 0},
    {"interleaved", 0, KVQ_NORM_RMS, KVQ_ROPE_INTERLEAVED, 0, 0, 0, 0},
    {"interleaved-rd/2", 0, KVQ_NORM_RMS, KVQ_ROPE_INTERLEAVED, 1, 0, 0, 0},
    {"half-qknorm", 0, KVQ_NORM_RMS, KVQ_ROPE_HALF, 0, 1, 0, 0},
    {"half-qknorm-rms+1", 0, KVQ_NORM_RMS_UNIT_OFFSET, KVQ_ROPE_HALF, 0, 1, 0, 0},
    {"half-local", 0, KVQ_NORM_RMS, KVQ_ROPE_HALF, 0, 0, 1, 0},
};
static const struct dop_variant DOP_GLUS[] = {
    {"silu", 0, 0, KVQ_ACT_SILU, 0, 0, 0, 0},
    {"gelu-tanh", 0, 0, KVQ_ACT_GELU_TANH, 0, 0, 0, 0},
};
static const struct dop_variant DOP_EMBEDS[] = {
    {"scale-1", 0, 0, 0, 0, 0, 0, 1.0f},
    {"scale-sqrt-h", 0, 0, 0, 0, 0, 0, 0.0f},
};
static const struct dop_variant DOP_LMS[] = {
    {"plain", 0, KVQ_NORM_RMS, 0, 0, 0, 0, 0.0f},
    {"softcap-30", 0, KVQ_NORM_RMS, 0, 0, 0, 0, 30.0f},
    {"softcap-2.5", 0, KVQ_NORM_RMS, 0, 0, 0, 0, 2.5f},
};

static const struct dop_variant *dop_table(enum dop op, int *n)
{
    switch (op) {
    case DOP_EMBED: *n = (int)(sizeof DOP_EMBEDS / sizeof DOP_EMBEDS[0]); return DOP_EMBEDS;
    case DOP_NORM: *n = (int)(sizeof DOP_NORMS / sizeof DOP_NORMS[0]); return DOP_NORMS;
    case DOP_ROPE: *n = (int)(sizeof DOP_ROPES / sizeof DOP_ROPES[0]); return DOP_ROPES;
    case DOP_GLU: *n = (int)(sizeof DOP_GLUS / sizeof DOP_GLUS[0]); return DOP_GLUS;
    default: *n = (int)(sizeof DOP_LMS / sizeof DOP_LMS[0]); return DOP_LMS;
    }
}

enum { DOP_T = 3, DOP_NORM_LAYER = 1, DOP_ROPE_LAYER = 0 };
static const int32_t DOP_POS[DOP_T] = {0, 37, 1000}, DOP_IDS[DOP_T] = {5, 1234, 4000};

/* The bundled model, loaded by the first case, and weights the fixture lends it. */
static kvq_model *dop_model;

struct dop_fx {
    enum dop op;
    const struct dop_variant *v;
    struct kvq_model_arch arch0; /* restored at free */
    double theta0;
    float *w_post, *w_qk; /* the sandwich norms' and q/k norms' weights, lent to the model */
    float *in, *y0;       /* inputs; norm: y before a sandwich site adds into it */
    size_t n_in, n_out;
    double *ref;
    float *out[2];        /* [0] the CPU backend's, [1] the CUDA backend's */
    int32_t argmax[2][DOP_T];
    kvq_backend *be[2];
};

static void dop_fill(float *x, size_t n, uint64_t seed, double mean, double sd)
{
    kvq_rng r;
    kvq_rng_init(&r, seed);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(mean + sd * kvq_rng_gauss(&r));
}

static double dop_rms_inv(const float *x, int n, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    return 1.0 / sqrt(ss / n + eps);
}

static double dop_w(int norm, float w)
{
    return norm == KVQ_NORM_RMS_UNIT_OFFSET ? 1.0 + w : (double)w;
}

static void *dop_setup(enum dop op, int variant)
{
    if (!dop_model) {
        kvq_error err = {0};
        CHECKF(kvq_model_load(TEST_MODEL_DIR, NULL, &dop_model, &err) == KVQ_OK, "cannot load %s: %s",
               TEST_MODEL_DIR, err.msg);
        if (!dop_model)
            return NULL;
    }
    kvq_model *m = dop_model;
    const struct kvq_model_config *c = &m->cfg;
    struct dop_fx *f = calloc(1, sizeof *f);
    int n;
    f->op = op;
    f->v = &dop_table(op, &n)[variant];
    f->arch0 = m->cfg.arch;
    f->theta0 = m->cfg.rope_theta;
    const size_t h = (size_t)c->hidden, ff = (size_t)c->ffn, d = (size_t)c->head_dim;
    struct kvq_model_arch *a = &m->cfg.arch;
    switch (op) {
    case DOP_EMBED:
        a->embed_scale = f->v->value > 0 ? f->v->value : sqrtf((float)c->hidden);
        f->n_in = 0;
        f->n_out = DOP_T * h;
        break;
    case DOP_NORM:
        a->norm = (enum kvq_norm_kind)f->v->norm;
        f->w_post = malloc(2 * h * sizeof *f->w_post);
        dop_fill(f->w_post, 2 * h, 71, 0.1, 0.5);
        m->layers[DOP_NORM_LAYER].post_attn_norm = f->w_post;
        m->layers[DOP_NORM_LAYER].post_ffn_norm = f->w_post + h;
        a->sandwich_norm = 1;
        f->n_in = f->n_out = DOP_T * h;
        break;
    case DOP_ROPE:
        a->rope = (enum kvq_rope_kind)f->v->kind;
        a->norm = (enum kvq_norm_kind)f->v->norm;
        a->rotary_dim = f->v->rd_half ? c->head_dim / 2 : c->head_dim;
        if (f->v->qk_norm) {
            f->w_qk = malloc(2 * d * sizeof *f->w_qk);
            dop_fill(f->w_qk, 2 * d, 72, f->v->norm == KVQ_NORM_RMS_UNIT_OFFSET ? 0.0 : 1.0, 0.3);
            m->layers[DOP_ROPE_LAYER].q_norm = f->w_qk;
            m->layers[DOP_ROPE_LAYER].k_norm = f->w_qk + d;
            a->qk_norm = 1;
        }
        if (f->v->local) { /* layer 0 windowed with its own base, the rest on a 1e6 base */
            m->cfg.rope_theta = 1e6;
            a->rope_local_theta = 10000.0;
            a->sliding_window = 512;
            a->window_layers[DOP_ROPE_LAYER / 8] |= (uint8_t)(1u << (DOP_ROPE_LAYER % 8));
        }
        f->n_in = f->n_out = DOP_T * (size_t)m->qkv_dim;
        break;
    case DOP_GLU:
        a->act = (enum kvq_act_kind)f->v->kind;
        f->n_in = DOP_T * 2 * ff;
        f->n_out = DOP_T * ff;
        break;
    case DOP_LM:
        a->final_softcap = f->v->value;
        f->n_in = DOP_T * h;
        f->n_out = DOP_T * (size_t)c->vocab;
        break;
    }
    f->in = malloc((f->n_in ? f->n_in : 1) * sizeof *f->in);
    f->y0 = malloc((f->n_in ? f->n_in : 1) * sizeof *f->y0);
    f->ref = calloc(f->n_out, sizeof *f->ref);
    for (int b = 0; b < 2; b++)
        f->out[b] = calloc(f->n_out, sizeof *f->out[b]);
    dop_fill(f->in, f->n_in, 73 + (uint64_t)op, 0.0, 1.0);
    dop_fill(f->y0, f->n_in, 79, 0.0, 1.0);
    return f;
}

static void dop_free(void *p)
{
    struct dop_fx *f = p;
    if (!f)
        return;
    for (int b = 0; b < 2; b++) {
        kvq_backend_free(f->be[b]);
        free(f->out[b]);
    }
    kvq_model *m = dop_model;
    m->cfg.arch = f->arch0;
    m->cfg.rope_theta = f->theta0;
    if (f->w_post)
        m->layers[DOP_NORM_LAYER].post_attn_norm = m->layers[DOP_NORM_LAYER].post_ffn_norm = NULL;
    if (f->w_qk)
        m->layers[DOP_ROPE_LAYER].q_norm = m->layers[DOP_ROPE_LAYER].k_norm = NULL;
    free(f->w_post);
    free(f->w_qk);
    free(f->in);
    free(f->y0);
    free(f->ref);
    free(f);
}

/* Called at the end of test_backend_ops. */
static void dop_cleanup(void)
{
    kvq_model_free(dop_model);
    dop_model = NULL;
}

/* The definitions, in double. */
static void dop_reference(struct dop_fx *f)
{
    const kvq_model *m = dop_model;
    const struct kvq_model_config *c = &m->cfg;
    const int h = c->hidden, d = c->head_dim;
    const double eps = c->rms_eps;
    if (f->op == DOP_EMBED) {
        float *row = malloc((size_t)h * sizeof *row);
        for (int t = 0; t < DOP_T; t++) {
            kvq_st_to_f32_range(m->embed, (size_t)DOP_IDS[t] * (size_t)h, (size_t)h, row);
            for (int i = 0; i < h; i++)
                f->ref[(size_t)t * h + i] = (double)row[i] * c->arch.embed_scale;
        }
        free(row);
    } else if (f->op == DOP_NORM) {
        const struct kvq_layer_weights *lw = &m->layers[DOP_NORM_LAYER];
        const int site = f->v->site, post = site == KVQ_NORM_POST_ATTN || site == KVQ_NORM_POST_FFN;
        const float *w = site == KVQ_NORM_FINAL       ? m->final_norm
                         : site == KVQ_NORM_ATTN      ? lw->attn_norm
                         : site == KVQ_NORM_FFN       ? lw->ffn_norm
                         : site == KVQ_NORM_POST_ATTN ? lw->post_attn_norm
                                                      : lw->post_ffn_norm;
        for (int t = 0; t < DOP_T; t++) {
            const float *x = f->in + (size_t)t * h;
            const double r = dop_rms_inv(x, h, eps);
            for (int i = 0; i < h; i++)
                f->ref[(size_t)t * h + i] = (post ? (double)f->y0[(size_t)t * h + i] : 0.0) + dop_w(f->v->norm, w[i]) * x[i] * r;
        }
    } else if (f->op == DOP_ROPE) {
        const struct kvq_layer_weights *lw = &m->layers[DOP_ROPE_LAYER];
        const int rd = c->arch.rotary_dim, half = rd / 2;
        const double base = f->v->local ? c->arch.rope_local_theta : c->rope_theta;
        for (int t = 0; t < DOP_T; t++) {
            const float *row = f->in + (size_t)t * m->qkv_dim;
            double *o = f->ref + (size_t)t * m->qkv_dim; /* q, then k, then v: the outputs' order */
            for (int hd = 0; hd < c->n_heads + c->n_kv_heads; hd++) {
                const float *x = row + (size_t)hd * d;
                const float *w = hd < c->n_heads ? lw->q_norm : lw->k_norm;
                double *y = o + (size_t)hd * d;
                const double r = w ? dop_rms_inv(x, d, eps) : 1.0;
                for (int i = 0; i < d; i++)
                    y[i] = w ? dop_w(f->v->norm, w[i]) * x[i] * r : (double)x[i];
                for (int i = 0; i < half; i++) {
                    /* transformers: inv_freq = 1 / base^(2i / rd) and the angle in float32 */
                    const float inv = (float)(1.0 / pow(base, (double)(float)(2.0 * i / rd)));
                    const double ang = (double)((float)DOP_POS[t] * inv);
                    const int i0 = f->v->kind == KVQ_ROPE_INTERLEAVED ? 2 * i : i;
                    const int i1 = f->v->kind == KVQ_ROPE_INTERLEAVED ? 2 * i + 1 : i + half;
                    const double a0 = y[i0], a1 = y[i1];
                    y[i0] = a0 * cos(ang) - a1 * sin(ang);
                    y[i1] = a1 * cos(ang) + a0 * sin(ang);
                }
            }
            for (int i = 0; i < m->kv_dim; i++)
                o[m->q_dim + m->kv_dim + i] = row[m->q_dim + m->kv_dim + i];
        }
    } else if (f->op == DOP_GLU) {
        const int ff = c->ffn;
        for (int t = 0; t < DOP_T; t++)
            for (int i = 0; i < ff; i++) {
                const double g = f->in[(size_t)t * 2 * ff + i], up = f->in[(size_t)t * 2 * ff + ff + i];
                const double act = f->v->kind == KVQ_ACT_GELU_TANH
                                       ? 0.5 * g * (1 + tanh(sqrt(2 / M_PI) * (g + 0.044715 * g * g * g)))
                                       : g / (1 + exp(-g));
                f->ref[(size_t)t * ff + i] = act * up;
            }
    } else {
        const size_t V = (size_t)c->vocab;
        double *xn = malloc((size_t)h * sizeof *xn);
        float *wrow = malloc((size_t)h * sizeof *wrow);
        for (int t = 0; t < DOP_T; t++) {
            const float *x = f->in + (size_t)t * h;
            const double r = dop_rms_inv(x, h, eps);
            for (int i = 0; i < h; i++)
                xn[i] = dop_w(c->arch.norm, m->final_norm[i]) * x[i] * r;
            for (int s = 0; s < m->n_lm; s++)
                for (int v = 0; v < m->lm[s].count; v++) {
                    kvq_wmat_rows_f32(&m->lm[s].wm, v, 1, wrow);
                    double l = 0;
                    for (int i = 0; i < h; i++)
                        l += (double)wrow[i] * xn[i];
                    const double cap = c->arch.final_softcap;
                    f->ref[(size_t)t * V + (size_t)(m->lm[s].start + v)] = cap > 0 ? cap * tanh(l / cap) : l;
                }
        }
        free(xn);
        free(wrow);
    }
}

/* Host <-> backend buffers. On a device both wait for all queued work
 * (the backend's stream is its own): a put lands before the op that
 * follows, a get sees the ops before it. */
static void dop_put(const kvq_backend *be, float *dst, const float *src, size_t n)
{
    if (!be->device) {
        memcpy(dst, src, n * sizeof *src);
        return;
    }
    CHECK_OK(kvq_cuda_memcpy_h2d(dst, src, n * sizeof *src));
    CHECK_OK(kvq_cuda_synchronize());
}

static void dop_get(const kvq_backend *be, float *dst, const float *src, size_t n)
{
    if (!be->device) {
        memcpy(dst, src, n * sizeof *src);
        return;
    }
    CHECK_OK(kvq_cuda_synchronize());
    CHECK_OK(kvq_cuda_memcpy_d2h(dst, src, n * sizeof *src));
}

/* which: 0 the CPU backend, 1 the CUDA backend. */
static void dop_run(struct dop_fx *f, int which)
{
    kvq_model *m = dop_model;
    const struct kvq_model_config *c = &m->cfg;
    if (!f->be[which]) { /* after the descriptor is set: the CUDA backend uploads what it reads */
        if (which)
            CHECK_OK(kvq_backend_cuda_create(m, DOP_T, 0, &f->be[which]));
        else
            CHECK_OK(kvq_backend_cpu_create(m, DOP_T, &f->be[which]));
        if (!f->be[which])
            return;
    }
    kvq_backend *be = f->be[which];
    const struct kvq_acts *a = &be->acts;
    const size_t h = (size_t)c->hidden;
    float *out = f->out[which];
    switch (f->op) {
    case DOP_EMBED:
        be->ops->embed(be, DOP_IDS, DOP_T, a->x);
        dop_get(be, out, a->x, f->n_out);
        break;
    case DOP_NORM:
        dop_put(be, a->x, f->in, f->n_in);
        dop_put(be, a->xn, f->y0, f->n_in);
        be->ops->norm(be, (enum kvq_norm_site)f->v->site, DOP_NORM_LAYER, a->x, a->xn, DOP_T);
        dop_get(be, out, a->xn, f->n_out);
        break;
    case DOP_ROPE:
        dop_put(be, a->qkv, f->in, f->n_in);
        be->ops->set_pos(be, DOP_POS, DOP_T);
        be->ops->qkv_rope(be, DOP_ROPE_LAYER, a->qkv, DOP_T, be->pos, a->q, a->k, a->v);
        for (int t = 0; t < DOP_T; t++) {
            float *o = out + (size_t)t * m->qkv_dim;
            dop_get(be, o, a->q + (size_t)t * m->q_dim, (size_t)m->q_dim);
            dop_get(be, o + m->q_dim, a->k + (size_t)t * m->kv_dim, (size_t)m->kv_dim);
            dop_get(be, o + m->q_dim + m->kv_dim, a->v + (size_t)t * m->kv_dim, (size_t)m->kv_dim);
        }
        break;
    case DOP_GLU:
        dop_put(be, a->gu, f->in, f->n_in);
        be->ops->glu(be, a->gu, a->h, DOP_T);
        dop_get(be, out, a->h, f->n_out);
        break;
    case DOP_LM:
        dop_put(be, a->x, f->in, DOP_T * h);
        CHECK_OK(be->ops->lm_head(be, a->x, DOP_T, out, f->argmax[which]));
        break;
    }
}

/* max |out - ref| / max |ref|; lm-head: and argmax is the first largest logit. */
static double dop_error(struct dop_fx *f, int which)
{
    const float *out = f->out[which];
    double num = 0, den = 0;
    for (size_t i = 0; i < f->n_out; i++) {
        num = fmax(num, fabs((double)out[i] - f->ref[i]));
        den = fmax(den, fabs(f->ref[i]));
    }
    if (f->op == DOP_LM) {
        const size_t V = (size_t)dop_model->cfg.vocab;
        for (int t = 0; t < DOP_T; t++) {
            int32_t best = 0;
            for (size_t v = 1; v < V; v++)
                if (out[t * V + v] > out[t * V + (size_t)best])
                    best = (int32_t)v;
            CHECKF(f->argmax[which][t] == best, "row %d: argmax %d, the logits' %d", t, f->argmax[which][t], best);
        }
    }
    return num / (den > 0 ? den : 1);
}

#endif /* KVQ_TEST_OPS_DECODER_H */
