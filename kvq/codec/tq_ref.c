/* tq_ref.c - scalar reference of the TurboQuant row codec (tqB and tqBj).
 *
 * This file *is* the arithmetic contract written out in codec_internal.h:
 * plain loops, one float operation at a time, in the documented order. The
 * AVX2 path (tq_avx2.c) and the CUDA encoder are tested against it bit for bit.
 */
#include <string.h>

#include "codec_internal.h"
#include "kvq_half.h"

kvq_status kvq_tq_check_ref(const kvq_codec *c, const float *x)
{
    int d = c->cfg.dim;
    if (!kvq_all_finite(x, d))
        return KVQ_ERR_NONFINITE;
    return kvq_f16_overflows(kvq_norm_ref(x, d)) ? KVQ_ERR_RANGE : KVQ_OK;
}

/* The all-zero row: decodes to +0.0f everywhere and scores 0. */
static void store_zero_row(const kvq_codec *c, const struct kvq_row *dst)
{
    kvq_row_store_u16(dst->norm, 0);
    memset(dst->codes, 0, c->fields.codes);
    if (c->traits->qjl) {
        kvq_row_store_u16(dst->rnorm, 0);
        memset(dst->signs, 0, c->fields.signs);
    }
}

kvq_status kvq_tq_encode_ref(const kvq_codec *c, const float *x, const struct kvq_row *dst)
{
    int d = c->cfg.dim, bits = c->bits, nb = c->levels - 1;
    if (!kvq_all_finite(x, d))
        return KVQ_ERR_NONFINITE;
    float n = kvq_norm_ref(x, d);
    if (kvq_f16_overflows(n))
        return KVQ_ERR_RANGE;
    if (n == 0.0f) {
        store_zero_row(c, dst);
        return KVQ_OK;
    }

    float y[KVQ_MAX_DIM], r[KVQ_MAX_DIM];
    if (d < 8) /* never (create checks dims); tells the compiler y gets written */
        return KVQ_ERR_INTERNAL;
    float inv = 1.0f / n;
    for (int j = 0; j < d; j++)
        y[j] = x[j] * inv;
    kvq_rotation_apply_ref(c->rot, y, y);

    memset(dst->codes, 0, c->fields.codes);
    for (int j = 0; j < d; j++) {
        unsigned idx = 0;
        for (int i = 0; i < nb; i++)
            idx += y[j] > c->boundaries[i];
        kvq_code_set(dst->codes, bits, j, idx);
        r[j] = y[j] - c->centroids[idx];
    }
    kvq_row_store_u16(dst->norm, kvq_f32_to_f16(n));
    if (!c->traits->qjl)
        return KVQ_OK;

    float gamma = kvq_norm_ref(r, d);
    kvq_codec_s_apply_ref(c, r, r);
    memset(dst->signs, 0, c->fields.signs);
    for (int j = 0; j < d; j++)
        if (!(r[j] < 0.0f))
            dst->signs[j >> 3] |= (uint8_t)(1u << (j & 7));
    kvq_row_store_u16(dst->rnorm, kvq_f32_to_f16(gamma));
    return KVQ_OK;
}

void kvq_tq_decode_ref(const kvq_codec *c, const struct kvq_row *src, float *x)
{
    int d = c->cfg.dim;
    float n = kvq_f16_to_f32(kvq_row_load_u16(src->norm));
    if (n == 0.0f) {
        memset(x, 0, (size_t)d * sizeof(float));
        return;
    }
    float w[KVQ_MAX_DIM], t[KVQ_MAX_DIM];
    if (d < 8) /* never (create checks dims); tells the compiler w gets written */
        return;
    for (int j = 0; j < d; j++)
        w[j] = c->centroids[kvq_code_get(src->codes, c->bits, j)];
    if (c->traits->qjl) {
        for (int j = 0; j < d; j++)
            t[j] = (src->signs[j >> 3] >> (j & 7)) & 1u ? 1.0f : -1.0f;
        kvq_codec_s_apply_t_ref(c, t, t);
        float g = kvq_f16_to_f32(kvq_row_load_u16(src->rnorm)) * c->qjl_kappa_f;
        for (int j = 0; j < d; j++)
            w[j] = fmaf(g, t[j], w[j]);
    }
    kvq_rotation_apply_t_ref(c->rot, w, w);
    for (int j = 0; j < d; j++)
        x[j] = w[j] * n;
}

float kvq_tq_score_ref(const kvq_codec *c, const float *qprep, const struct kvq_row *src)
{
    int d = c->cfg.dim;
    float n = kvq_f16_to_f32(kvq_row_load_u16(src->norm));
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < d; j++)
        a[j & 7] = fmaf(qprep[j], c->centroids[kvq_code_get(src->codes, c->bits, j)], a[j & 7]);
    float A = kvq_reduce8(a);
    if (!c->traits->qjl)
        return n * A;

    /* sum_j (S q')_j s~_j = 2 * sum_{bit=1} (S q')_j - sum_j (S q')_j */
    const float *sq = qprep + d;
    float p[8] = {0, 0, 0, 0, 0, 0, 0, 0}, t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < d; j++) {
        p[j & 7] += (src->signs[j >> 3] >> (j & 7)) & 1u ? sq[j] : 0.0f;
        t[j & 7] += sq[j];
    }
    float g = kvq_f16_to_f32(kvq_row_load_u16(src->rnorm)) * c->qjl_kappa_f;
    return n * fmaf(g, 2.0f * kvq_reduce8(p) - kvq_reduce8(t), A);
}
