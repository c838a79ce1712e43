/* test_decoder_ops.c - the CPU backend's ops honour the architecture
 * descriptor (struct kvq_model_arch).
 *
 * The bundled model only exercises the Llama kinds (RMSNorm, SiLU,
 * rotate-half RoPE, no scale, no soft-cap); the other kinds are checked op by
 * op against the formulas of their definitions, computed here in double
 * precision: the (1 + w) RMSNorm, the tanh-GELU gate, interleaved RoPE pairs
 * at the angle pos * theta^(-2i/d), the embedding scale, the logit soft-cap.
 */
#include <math.h>
#include <stdint.h>

#include "backend.h"
#include "decoder_internal.h"
#include "kvq_rng.h"
#include "test.h"

static kvq_model *model;
static kvq_backend *be;

static void fill(float *x, size_t n, uint64_t seed)
{
    kvq_rng r;
    kvq_rng_init(&r, seed);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)kvq_rng_gauss(&r);
}

static double rel_err(const float *a, const double *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs(b[i]));
    }
    return num / (den > 0 ? den : 1);
}

/* The descriptor the bundled config parses to: the Llama kinds. */
static void test_descriptor_defaults(void)
{
    const struct kvq_model_arch *a = &model->cfg.arch;
    CHECK(a->norm == KVQ_NORM_RMS && a->act == KVQ_ACT_SILU && a->rope == KVQ_ROPE_HALF);
    CHECK(a->rotary_dim == model->cfg.head_dim);
    CHECK(a->embed_scale == 1.0f && a->final_softcap == 0.0f && a->attn_softcap == 0.0f);
    CHECK(a->sliding_window == 0);
}

static void test_norm_kinds(void)
{
    const int h = model->cfg.hidden;
    float x[2 * 512], y[2 * 512];
    double want[2 * 512];
    CHECK(h <= 512);
    fill(x, 2 * (size_t)h, 1);
    const float *w = model->layers[1].attn_norm;
    for (int kind = 0; kind < 2; kind++) {
        model->cfg.arch.norm = (enum kvq_norm_kind)kind;
        be->ops->norm(be, KVQ_NORM_ATTN, 1, x, y, 2);
        for (int t = 0; t < 2; t++) {
            double ss = 0;
            for (int i = 0; i < h; i++)
                ss += (double)x[t * h + i] * x[t * h + i];
            double r = 1.0 / sqrt(ss / h + model->cfg.rms_eps);
            for (int i = 0; i < h; i++)
                want[t * h + i] = (kind == KVQ_NORM_RMS_UNIT_OFFSET ? 1.0 + w[i] : (double)w[i]) * x[t * h + i] * r;
        }
        double e = rel_err(y, want, 2 * (size_t)h);
        CHECKF(e < 1e-6, "norm kind %d: rel err %.3g", kind, e);
    }
    model->cfg.arch.norm = KVQ_NORM_RMS;
}

static void test_act_kinds(void)
{
    const int f = model->cfg.ffn;
    float *gu = malloc(2 * (size_t)f * sizeof *gu), *hb = malloc((size_t)f * sizeof *hb);
    double *want = malloc((size_t)f * sizeof *want);
    fill(gu, 2 * (size_t)f, 2);
    for (int kind = 0; kind < 2; kind++) {
        model->cfg.arch.act = (enum kvq_act_kind)kind;
        be->ops->glu(be, gu, hb, 1);
        for (int i = 0; i < f; i++) {
            double g = gu[i], up = gu[f + i];
            double a = kind == KVQ_ACT_GELU_TANH ? 0.5 * g * (1 + tanh(sqrt(2 / M_PI) * (g + 0.044715 * g * g * g)))
                                                 : g / (1 + exp(-g));
            want[i] = a * up;
        }
        double e = rel_err(hb, want, (size_t)f);
        CHECKF(e < 1e-6, "activation kind %d: rel err %.3g", kind, e);
    }
    model->cfg.arch.act = KVQ_ACT_SILU;
    free(gu);
    free(hb);
    free(want);
}

/* RoPE pairs of both kinds: the pair of frequency i turns by pos * theta^(-2i/d). */
static void test_rope_kinds(void)
{
    const kvq_model *m = model;
    const int d = m->cfg.head_dim, half = d / 2;
    const size_t pos = 37;
    float *qkv = malloc((size_t)m->qkv_dim * sizeof *qkv);
    float *q = malloc((size_t)m->q_dim * sizeof *q), *k = malloc((size_t)m->kv_dim * sizeof *k);
    float *v = malloc((size_t)m->kv_dim * sizeof *v);
    double *want = malloc((size_t)d * sizeof *want);
    fill(qkv, (size_t)m->qkv_dim, 3);
    for (int kind = 0; kind < 2; kind++) {
        model->cfg.arch.rope = (enum kvq_rope_kind)kind;
        const int32_t pos32 = (int32_t)pos;
        be->ops->set_pos(be, &pos32, 1);
        be->ops->qkv_rope(be, 0, qkv, 1, be->pos, q, k, v);
        const float *x = qkv + m->q_dim; /* KV head 0 (no k norm in the bundled model) */
        for (int i = 0; i < half; i++) {
            int i0 = kind == KVQ_ROPE_INTERLEAVED ? 2 * i : i, i1 = kind == KVQ_ROPE_INTERLEAVED ? 2 * i + 1 : i + half;
            double ang = (double)pos * pow(m->cfg.rope_theta, -2.0 * i / d);
            want[i0] = x[i0] * cos(ang) - x[i1] * sin(ang);
            want[i1] = x[i1] * cos(ang) + x[i0] * sin(ang);
        }
        double e = rel_err(k, want, (size_t)d);
        CHECKF(e < 1e-5, "rope kind %d: rel err %.3g", kind, e); /* float32 angles, as HF */
        CHECK(memcmp(v, qkv + m->q_dim + m->kv_dim, (size_t)m->kv_dim * sizeof *v) == 0);
    }
    model->cfg.arch.rope = KVQ_ROPE_HALF;
    free(qkv);
    free(q);
    free(k);
    free(v);
    free(want);
}

static void test_embed_scale_and_softcap(void)
{
    const int h = model->cfg.hidden, V = model->cfg.vocab;
    const int32_t ids[2] = {5, 1234};
    float *a = malloc(2 * (size_t)h * sizeof *a), *b = malloc(2 * (size_t)h * sizeof *b);
    be->ops->embed(be, ids, 2, a);
    model->cfg.arch.embed_scale = 3.0f;
    be->ops->embed(be, ids, 2, b);
    model->cfg.arch.embed_scale = 1.0f;
    for (int i = 0; i < 2 * h; i++)
        CHECKF(b[i] == 3.0f * a[i], "embedding %d: %g vs 3 x %g", i, b[i], a[i]);

    float *raw = malloc((size_t)V * sizeof *raw), *cap = malloc((size_t)V * sizeof *cap);
    double *want = malloc((size_t)V * sizeof *want);
    int32_t id_raw, id_cap;
    CHECK_OK(be->ops->lm_head(be, a, 1, raw, &id_raw));
    model->cfg.arch.final_softcap = 2.5f;
    CHECK_OK(be->ops->lm_head(be, a, 1, cap, &id_cap));
    model->cfg.arch.final_softcap = 0.0f;
    for (int i = 0; i < V; i++)
        want[i] = 2.5 * tanh(raw[i] / 2.5);
    double e = rel_err(cap, want, (size_t)V);
    CHECKF(e < 1e-6, "soft-cap: rel err %.3g", e);
    CHECK(id_raw == id_cap); /* tanh is monotonic */
    free(a);
    free(b);
    free(raw);
    free(cap);
    free(want);
}

int main(void)
{
    kvq_error err = {0};
    if (kvq_model_load(TEST_MODEL_DIR, NULL, &model, &err) != KVQ_OK) {
        fprintf(stderr, "cannot load %s: %s\n", TEST_MODEL_DIR, err.msg);
        return 1;
    }
    if (kvq_backend_cpu_create(model, 4, &be) != KVQ_OK)
        return 1;
    RUN(test_descriptor_defaults);
    RUN(test_norm_kinds);
    RUN(test_act_kinds);
    RUN(test_rope_kinds);
    RUN(test_embed_scale_and_softcap);
    kvq_backend_free(be);
    kvq_model_free(model);
    return TEST_END("test_decoder_ops");
}
