/* baseline.c - the llama.cpp cache formats kvq is compared against.
 *
 * f32, f16, q8_0 and q4_0 rows are byte-for-byte what llama.cpp stores, and
 * quantize with its reference semantics (quantize_row_q8_0_ref /
 * quantize_row_q4_0_ref): the scale is computed in f32 and used unrounded to
 * quantize, then stored as f16. Two deliberate additions, so that no input is
 * silently destroyed: non-finite input is refused (KVQ_ERR_NONFINITE), and so
 * is input whose stored f16 (value or scale) would overflow to Inf
 * (KVQ_ERR_RANGE). Both checks run before anything is written.
 *
 * These are plain scalar loops; their fast and reference entries are the same
 * functions (they exist as baselines, not as kvq's product).
 */
#include <math.h>
#include <string.h>

#include "codec_internal.h"
#include "kvq_half.h"

static int f16_overflows(float v)
{
    uint16_t h = kvq_f32_to_f16(v);
    return (h & 0x7c00u) == 0x7c00u;
}

/* ---- f32 ---- */

kvq_status kvq_f32_encode(const kvq_codec *c, const float *x, const struct kvq_row *dst)
{
    int d = c->cfg.dim;
    if (!kvq_all_finite(x, d))
        return KVQ_ERR_NONFINITE;
    memcpy(dst->codes, x, (size_t)d * sizeof(float));
    return KVQ_OK;
}

void kvq_f32_decode(const kvq_codec *c, const struct kvq_row *src, float *x)
{
    memcpy(x, src->codes, (size_t)c->cfg.dim * sizeof(float));
}

float kvq_f32_score(const kvq_codec *c, const float *q, const struct kvq_row *src)
{
    float s = 0.0f, v;
    for (int j = 0; j < c->cfg.dim; j++) {
        memcpy(&v, src->codes + 4 * (size_t)j, sizeof v);
        s += q[j] * v;
    }
    return s;
}

/* ---- f16 ---- */

kvq_status kvq_f16_encode(const kvq_codec *c, const float *x, const struct kvq_row *dst)
{
    int d = c->cfg.dim;
    if (!kvq_all_finite(x, d))
        return KVQ_ERR_NONFINITE;
    for (int j = 0; j < d; j++)
        if (f16_overflows(x[j]))
            return KVQ_ERR_RANGE;
    for (int j = 0; j < d; j++) {
        uint16_t h = kvq_f32_to_f16(x[j]);
        memcpy(dst->codes + 2 * (size_t)j, &h, sizeof h);
    }
    return KVQ_OK;
}

static float f16_at(const uint8_t *p, int j)
{
    uint16_t h;
    memcpy(&h, p + 2 * (size_t)j, sizeof h);
    return kvq_f16_to_f32(h);
}

void kvq_f16_decode(const kvq_codec *c, const struct kvq_row *src, float *x)
{
    for (int j = 0; j < c->cfg.dim; j++)
        x[j] = f16_at(src->codes, j);
}

float kvq_f16_score(const kvq_codec *c, const float *q, const struct kvq_row *src)
{
    float s = 0.0f;
    for (int j = 0; j < c->cfg.dim; j++)
        s += q[j] * f16_at(src->codes, j);
    return s;
}

/* ---- q8_0: per block of 32, d = max|x| / 127, q = round(x / d) ---- */

static float q8_0_scale(const float *x)
{
    float amax = 0.0f;
    for (int j = 0; j < KVQ_QK; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    return amax / 127.0f;
}

kvq_status kvq_q8_0_encode(const kvq_codec *c, const float *x, const struct kvq_row *dst)
{
    int nb = c->cfg.dim / KVQ_QK;
    if (!kvq_all_finite(x, c->cfg.dim))
        return KVQ_ERR_NONFINITE;
    for (int b = 0; b < nb; b++)
        if (f16_overflows(q8_0_scale(x + b * KVQ_QK)))
            return KVQ_ERR_RANGE;
    for (int b = 0; b < nb; b++) {
        const float *xb = x + b * KVQ_QK;
        kvq_block_q8_0 blk;
        float d = q8_0_scale(xb);
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        blk.d = kvq_f32_to_f16(d);
        for (int j = 0; j < KVQ_QK; j++)
            blk.qs[j] = (int8_t)roundf(xb[j] * id);
        memcpy(dst->codes + (size_t)b * sizeof blk, &blk, sizeof blk);
    }
    return KVQ_OK;
}

void kvq_q8_0_decode(const kvq_codec *c, const struct kvq_row *src, float *x)
{
    int nb = c->cfg.dim / KVQ_QK;
    for (int b = 0; b < nb; b++) {
        kvq_block_q8_0 blk;
        memcpy(&blk, src->codes + (size_t)b * sizeof blk, sizeof blk);
        float d = kvq_f16_to_f32(blk.d);
        for (int j = 0; j < KVQ_QK; j++)
            x[b * KVQ_QK + j] = (float)blk.qs[j] * d;
    }
}

float kvq_q8_0_score(const kvq_codec *c, const float *q, const struct kvq_row *src)
{
    int nb = c->cfg.dim / KVQ_QK;
    float s = 0.0f;
    for (int b = 0; b < nb; b++) {
        kvq_block_q8_0 blk;
        memcpy(&blk, src->codes + (size_t)b * sizeof blk, sizeof blk);
        float d = kvq_f16_to_f32(blk.d);
        for (int j = 0; j < KVQ_QK; j++)
            s += q[b * KVQ_QK + j] * ((float)blk.qs[j] * d);
    }
    return s;
}

/* ---- q4_0: per block of 32, d = (signed value of max |x|) / -8 ---- */

static float q4_0_scale(const float *x)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < KVQ_QK; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max / -8.0f;
}

static int q4_0_level(float v)
{
    /* v + 8.5 lies in [0.5, 16.5] up to rounding, so truncation is floor. */
    int q = (int8_t)(v + 8.5f);
    return q < 15 ? q : 15;
}

kvq_status kvq_q4_0_encode(const kvq_codec *c, const float *x, const struct kvq_row *dst)
{
    int nb = c->cfg.dim / KVQ_QK;
    if (!kvq_all_finite(x, c->cfg.dim))
        return KVQ_ERR_NONFINITE;
    for (int b = 0; b < nb; b++)
        if (f16_overflows(q4_0_scale(x + b * KVQ_QK)))
            return KVQ_ERR_RANGE;
    for (int b = 0; b < nb; b++) {
        const float *xb = x + b * KVQ_QK;
        kvq_block_q4_0 blk;
        float d = q4_0_scale(xb);
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        blk.d = kvq_f32_to_f16(d);
        for (int j = 0; j < KVQ_QK / 2; j++) {
            int lo = q4_0_level(xb[j] * id), hi = q4_0_level(xb[j + KVQ_QK / 2] * id);
            blk.qs[j] = (uint8_t)(lo | (hi << 4));
        }
        memcpy(dst->codes + (size_t)b * sizeof blk, &blk, sizeof blk);
    }
    return KVQ_OK;
}

void kvq_q4_0_decode(const kvq_codec *c, const struct kvq_row *src, float *x)
{
    int nb = c->cfg.dim / KVQ_QK;
    for (int b = 0; b < nb; b++) {
        kvq_block_q4_0 blk;
        memcpy(&blk, src->codes + (size_t)b * sizeof blk, sizeof blk);
        float d = kvq_f16_to_f32(blk.d);
        float *xb = x + b * KVQ_QK;
        for (int j = 0; j < KVQ_QK / 2; j++) {
            xb[j] = (float)((blk.qs[j] & 15) - 8) * d;
            xb[j + KVQ_QK / 2] = (float)((blk.qs[j] >> 4) - 8) * d;
        }
    }
}

float kvq_q4_0_score(const kvq_codec *c, const float *q, const struct kvq_row *src)
{
    int nb = c->cfg.dim / KVQ_QK;
    float s = 0.0f;
    for (int b = 0; b < nb; b++) {
        kvq_block_q4_0 blk;
        memcpy(&blk, src->codes + (size_t)b * sizeof blk, sizeof blk);
        float d = kvq_f16_to_f32(blk.d);
        const float *qb = q + b * KVQ_QK;
        for (int j = 0; j < KVQ_QK / 2; j++) {
            s += qb[j] * ((float)((blk.qs[j] & 15) - 8) * d);
            s += qb[j + KVQ_QK / 2] * ((float)((blk.qs[j] >> 4) - 8) * d);
        }
    }
    return s;
}
