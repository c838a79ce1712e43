/* rope.c - RoPE frequencies and angles, as transformers computes them.
 *
 * Each scaling type is the formula of transformers' rope init function of
 * the same name (modeling_rope_utils.py), evaluated in float32 where torch
 * evaluates tensors (the inverse frequencies, the ramps) and in double where
 * it evaluates Python scalars (the correction range, attention factors,
 * dynamic NTK's base at init). Angles are (float)pos * inv_freq rounded to
 * float, cos/sin rounded to float and multiplied by the attention factor in
 * float, as the rotary embedding's forward does.
 *
 * No table over the model's context exists: the backends ask for the rows of
 * the positions a chunk needs, so memory and load time do not depend on
 * max_position_embeddings. dynamic and longrope depend on the length of the
 * sequence the forward reaches (transformers' dynamic_rope_update), which is
 * why kvq_rope_freqs takes it.
 */
#include <math.h>
#include <stdlib.h>

#include "decoder_internal.h"

int kvq_rope_len_dependent(const struct kvq_model_config *c)
{
    const enum kvq_rope_scaling_kind k = c->arch.rope_scaling.kind;
    return k == KVQ_ROPE_SCALE_DYNAMIC || k == KVQ_ROPE_SCALE_LONGROPE;
}

/* base ** (2i / dim) in float32, i < dim / 2. */
static float pos_freq(double base, int i, int dim)
{
    float e = (float)(2 * i) / (float)dim;
    return (float)pow(base, (double)e);
}

static double yarn_mscale(double scale, double mscale)
{
    return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

static double yarn_correction_dim(double rot, int dim, double base, double max_pos)
{
    return (dim * log(max_pos / (rot * 2.0 * M_PI))) / (2.0 * log(base));
}

static void yarn(const struct kvq_model_config *c, float *inv, float *scale)
{
    const struct kvq_rope_scaling *rs = &c->arch.rope_scaling;
    const int dim = c->arch.rotary_dim, half = dim / 2;
    const double base = c->rope_theta, factor = rs->factor;
    double af = rs->attention_factor;
    if (!(af > 0))
        af = rs->mscale > 0 && rs->mscale_all_dim > 0
                 ? yarn_mscale(factor, rs->mscale) / yarn_mscale(factor, rs->mscale_all_dim)
                 : yarn_mscale(factor, 1.0);
    const double bf = rs->beta_fast > 0 ? rs->beta_fast : 32, bs = rs->beta_slow > 0 ? rs->beta_slow : 1;
    double lo = yarn_correction_dim(bf, dim, base, rs->original_max);
    double hi = yarn_correction_dim(bs, dim, base, rs->original_max);
    if (rs->truncate) {
        lo = floor(lo);
        hi = ceil(hi);
    }
    lo = lo > 0 ? lo : 0;
    hi = hi < dim - 1 ? hi : dim - 1;
    if (lo == hi)
        hi += 0.001; /* transformers' guard against a zero-width ramp */
    const float flo = (float)lo, span = (float)(hi - lo), ffac = (float)factor;
    for (int i = 0; i < half; i++) {
        float pf = pos_freq(base, i, dim);
        float extra = 1.0f / pf, inter = 1.0f / (ffac * pf);
        float ramp = ((float)i - flo) / span;
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float ef = 1.0f - ramp;
        inv[i] = inter * (1.0f - ef) + extra * ef;
    }
    *scale = (float)af;
}

static void llama3(const struct kvq_model_config *c, float *inv)
{
    const struct kvq_rope_scaling *rs = &c->arch.rope_scaling;
    const int dim = c->arch.rotary_dim, half = dim / 2;
    const float factor = (float)rs->factor, old = (float)rs->original_max;
    const float lo_wl = (float)(rs->original_max / rs->low_freq_factor);
    const float hi_wl = (float)(rs->original_max / rs->high_freq_factor);
    const float lff = (float)rs->low_freq_factor, span = (float)(rs->high_freq_factor - rs->low_freq_factor);
    for (int i = 0; i < half; i++) {
        float f = 1.0f / pos_freq(c->rope_theta, i, dim);
        float wl = (float)(2.0 * M_PI) / f;
        float fl = wl > lo_wl ? f / factor : f;
        if (!(wl < hi_wl) && !(wl > lo_wl)) {
            float s = (old / wl - lff) / span;
            fl = (1.0f - s) * fl / factor + s * fl;
        }
        inv[i] = fl;
    }
}

void kvq_rope_freqs(const struct kvq_model_config *c, size_t seq_len, float *inv, float *scale)
{
    const struct kvq_rope_scaling *rs = &c->arch.rope_scaling;
    const int dim = c->arch.rotary_dim, half = dim / 2;
    double base = c->rope_theta;
    *scale = 1.0f;
    switch (rs->kind) {
    case KVQ_ROPE_SCALE_YARN:
        yarn(c, inv, scale);
        return;
    case KVQ_ROPE_SCALE_LLAMA3:
        llama3(c, inv);
        return;
    case KVQ_ROPE_SCALE_DYNAMIC:
        if (seq_len > (size_t)rs->original_max) { /* float32: the length arrives as a tensor */
            float r = (float)rs->factor * (float)seq_len / (float)rs->original_max - (float)(rs->factor - 1.0);
            base = (double)((float)base * powf(r, (float)dim / (float)(dim - 2)));
        }
        break;
    case KVQ_ROPE_SCALE_LONGROPE: {
        const float *ext = seq_len > (size_t)rs->original_max ? rs->long_factor : rs->short_factor;
        double af = rs->attention_factor;
        if (!(af > 0))
            af = rs->factor <= 1.0 ? 1.0 : sqrt(1.0 + log(rs->factor) / log((double)rs->original_max));
        for (int i = 0; i < half; i++)
            inv[i] = 1.0f / (ext[i] * pos_freq(base, i, dim));
        *scale = (float)af;
        return;
    }
    default:
        break;
    }
    for (int i = 0; i < half; i++) {
        /* default: one rounding of the exact value, which is what torch's float32 pow gives in practice */
        inv[i] = (float)(1.0 / pow(base, (double)(2 * i) / dim));
        if (rs->kind == KVQ_ROPE_SCALE_LINEAR)
            inv[i] /= (float)rs->factor;
    }
}

void kvq_rope_freqs_local(const struct kvq_model_config *c, float *inv, float *scale)
{
    const int dim = c->arch.rotary_dim;
    for (int i = 0; i < dim / 2; i++)
        inv[i] = (float)(1.0 / pow(c->arch.rope_local_theta, (double)(2 * i) / dim));
    *scale = 1.0f;
}

void kvq_rope_rows(const float *inv, float scale, int half, size_t pos0, size_t n, float *cs, float *sn)
{
    for (size_t p = 0; p < n; p++)
        for (int i = 0; i < half; i++) {
            float a = (float)(pos0 + p) * inv[i];
            cs[p * (size_t)half + i] = (float)cos((double)a) * scale;
            sn[p * (size_t)half + i] = (float)sin((double)a) * scale;
        }
}

kvq_status kvq_rope_table(const struct kvq_model_config *c, size_t n_pos, int local, float **cs, float **sn)
{
    const int half = c->arch.rotary_dim / 2;
    float inv[KVQ_MAX_DIM / 2], scale;
    *cs = malloc((n_pos ? n_pos : 1) * (size_t)half * sizeof(float));
    *sn = malloc((n_pos ? n_pos : 1) * (size_t)half * sizeof(float));
    if (!*cs || !*sn) {
        free(*cs);
        free(*sn);
        *cs = *sn = NULL;
        return KVQ_ERR_NOMEM;
    }
    if (local)
        kvq_rope_freqs_local(c, inv, &scale);
    else
        kvq_rope_freqs(c, n_pos, inv, &scale);
    kvq_rope_rows(inv, scale, half, 0, n_pos, *cs, *sn);
    return KVQ_OK;
}
