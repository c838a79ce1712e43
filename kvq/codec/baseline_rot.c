/* baseline_rot.c - q8_0r and q4_0r: llama.cpp's block formats of the rotated
 * row, the baseline a llama.cpp user has had by default since 2026-04.
 *
 * Rows are y = R x in the base layout, so a row costs exactly the base's
 * bytes. Everything that reads rows (scores, the value sum of attention)
 * stays in R's domain and pays the rotation once per query or per output,
 * never per row; only decode, which returns x~ itself, applies R^T per row.
 * Rotating before the block scales is the whole point: R spreads a channel
 * outlier over every block instead of letting it set one block's scale.
 */
#include "codec_internal.h"
#include "kvq_cpu.h"

static const struct kvq_type_traits *base_of(const kvq_codec *c)
{
    return kvq_type_traits(c->traits->base);
}

kvq_status kvq_rotbase_check(const kvq_codec *c, const float *x)
{
    const int d = c->cfg.dim;
    if (!kvq_all_finite(x, d))
        return KVQ_ERR_NONFINITE;
    float y[KVQ_MAX_DIM];
    kvq_rotation_apply(c->rot, x, y);
    return kvq_cpu_has_avx2() ? kvq_baseline_check_avx2(c, y) : kvq_baseline_check(c, y);
}

kvq_status kvq_rotbase_encode(const kvq_codec *c, const float *x, const struct kvq_row *dst)
{
    if (!kvq_all_finite(x, c->cfg.dim))
        return KVQ_ERR_NONFINITE; /* before R mixes a NaN into every coordinate */
    float y[KVQ_MAX_DIM];
    kvq_rotation_apply(c->rot, x, y);
    return base_of(c)->encode(c, y, dst);
}

kvq_status kvq_rotbase_encode_ref(const kvq_codec *c, const float *x, const struct kvq_row *dst)
{
    if (!kvq_all_finite(x, c->cfg.dim))
        return KVQ_ERR_NONFINITE;
    float y[KVQ_MAX_DIM];
    kvq_rotation_apply_ref(c->rot, x, y);
    return base_of(c)->encode_ref(c, y, dst);
}

void kvq_rotbase_decode(const kvq_codec *c, const struct kvq_row *src, float *x)
{
    base_of(c)->decode(c, src, x);
    kvq_rotation_apply_t(c->rot, x, x);
}

void kvq_rotbase_decode_ref(const kvq_codec *c, const struct kvq_row *src, float *x)
{
    base_of(c)->decode_ref(c, src, x);
    kvq_rotation_apply_t_ref(c->rot, x, x);
}

float kvq_rotbase_score(const kvq_codec *c, const float *qprep, const struct kvq_row *src)
{
    return base_of(c)->score(c, qprep, src);
}

float kvq_rotbase_score_ref(const kvq_codec *c, const float *qprep, const struct kvq_row *src)
{
    return base_of(c)->score_ref(c, qprep, src);
}
