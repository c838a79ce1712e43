/* baseline.c - the llama.cpp cache formats kvq is compared against.
 *
 * f32, f16, q8_0 and q4_0 rows are byte-for-byte what llama.cpp stores, and
 * quantize with its reference semantics (quantize_row_q8_0_ref /
 * quantize_row_q4_0_ref): the scale is computed in f32 and used unrounded to
 * quantize, then stored as f16. Deliberate additions, so that no input is
 * silently destroyed: non-finite input is refused (KVQ_ERR_NONFINITE), and so
 * is input whose stored f16 (value or scale) would overflow to Inf
 * (KVQ_ERR_RANGE); both checks run before anything is written. Blocks so
 * tiny that 1/d overflows quantize to 0 (kvq_block_inv_scale), where
 * llama.cpp's reference has undefined behaviour.
 *
 * These are the scalar references; baseline_avx2.c has the bit-identical
 * AVX2/F16C paths, so that speed comparisons with kvq's types are fair.
 * Scores accumulate in the 8-lane fmaf order of codec_internal.h.
 */
#include <math.h>
#include <string.h>

#include "codec_internal.h"
#include "kvq_cpu.h"
#include "kvq_half.h"

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
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, v;
    for (int j = 0; j < c->cfg.dim; j++) {
        memcpy(&v, src->codes + 4 * (size_t)j, sizeof v);
        a[j & 7] = fmaf(q[j], v, a[j & 7]);
    }
    return kvq_reduce8(a);
}

/* ---- f16 ---- */

static kvq_status f16_check(const float *x, int d)
{
    if (!kvq_all_finite(x, d))
        return KVQ_ERR_NONFINITE;
    for (int j = 0; j < d; j++)
        if (kvq_f16_overflows(x[j]))
            return KVQ_ERR_RANGE;
    return KVQ_OK;
}

kvq_status kvq_f16_encode(const kvq_codec *c, const float *x, const struct kvq_row *dst)
{
    int d = c->cfg.dim;
    kvq_status st = f16_check(x, d);
    if (st != KVQ_OK)
        return st;
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
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < c->cfg.dim; j++)
        a[j & 7] = fmaf(q[j], f16_at(src->codes, j), a[j & 7]);
    return kvq_reduce8(a);
}

/* ---- q8_0: per block of 32, d = max|x| / 127, q = round(x / d) ---- */

static float q8_0_scale(const float *x)
{
    float amax = 0.0f;
    for (int j = 0; j < KVQ_QK; j++) /* x is finite: a plain compare is fmaxf */
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    return amax / 127.0f;
}

/* The scale of every block of x[d] into d_out[d / KVQ_QK], checking the
 * whole row (finite, scales fit f16) before an encoder writes anything.
 * @return KVQ_OK, KVQ_ERR_NONFINITE or KVQ_ERR_RANGE. */
static kvq_status block_scales(const float *x, int d, float (*scale)(const float *), float *d_out)
{
    if (!kvq_all_finite(x, d))
        return KVQ_ERR_NONFINITE;
    for (int b = 0; b < d / KVQ_QK; b++) {
        d_out[b] = scale(x + b * KVQ_QK);
        if (kvq_f16_overflows(d_out[b]))
            return KVQ_ERR_RANGE;
    }
    return KVQ_OK;
}

kvq_status kvq_q8_0_encode(const kvq_codec *c, const float *x, const struct kvq_row *dst)
{
    int nb = c->cfg.dim / KVQ_QK;
    float scales[KVQ_MAX_DIM / KVQ_QK];
    kvq_status st = block_scales(x, c->cfg.dim, q8_0_scale, scales);
    if (st != KVQ_OK)
        return st;
    for (int b = 0; b < nb; b++) {
        const float *xb = x + b * KVQ_QK;
        kvq_block_q8_0 blk;
        float d = scales[b];
        float id = kvq_block_inv_scale(d);
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
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int b = 0; b < nb; b++) {
        kvq_block_q8_0 blk;
        memcpy(&blk, src->codes + (size_t)b * sizeof blk, sizeof blk);
        float d = kvq_f16_to_f32(blk.d);
        for (int j = 0; j < KVQ_QK; j++)
            a[j & 7] = fmaf(q[b * KVQ_QK + j], (float)blk.qs[j] * d, a[j & 7]);
    }
    return kvq_reduce8(a);
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
    float scales[KVQ_MAX_DIM / KVQ_QK];
    kvq_status st = block_scales(x, c->cfg.dim, q4_0_scale, scales);
    if (st != KVQ_OK)
        return st;
    for (int b = 0; b < nb; b++) {
        const float *xb = x + b * KVQ_QK;
        kvq_block_q4_0 blk;
        float d = scales[b];
        float id = kvq_block_inv_scale(d);
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
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int b = 0; b < nb; b++) {
        kvq_block_q4_0 blk;
        memcpy(&blk, src->codes + (size_t)b * sizeof blk, sizeof blk);
        float d = kvq_f16_to_f32(blk.d);
        const float *qb = q + b * KVQ_QK;
        for (int j = 0; j < KVQ_QK; j++) {
            int v = j < KVQ_QK / 2 ? blk.qs[j] & 15 : blk.qs[j - KVQ_QK / 2] >> 4;
            a[j & 7] = fmaf(qb[j], (float)(v - 8) * d, a[j & 7]);
        }
    }
    return kvq_reduce8(a);
}

kvq_status kvq_baseline_check(const kvq_codec *c, const float *x)
{
    int d = c->cfg.dim;
    float scales[KVQ_MAX_DIM / KVQ_QK];
    switch (kvq_layout_base_type((int)c->cfg.type)) {
    case KVQ_TYPE_F16: return f16_check(x, d);
    case KVQ_TYPE_Q8_0: return block_scales(x, d, q8_0_scale, scales);
    case KVQ_TYPE_Q4_0: return block_scales(x, d, q4_0_scale, scales);
    case KVQ_TYPE_Q4_1:
    case KVQ_TYPE_Q5_0:
    case KVQ_TYPE_Q5_1: return kvq_q5_family_check(kvq_layout_base_type((int)c->cfg.type), x, d);
    default: return kvq_all_finite(x, d) ? KVQ_OK : KVQ_ERR_NONFINITE;
    }
}

/* ---- fast-path dispatch ---- */

#define DISPATCH(T)                                                                          \
    kvq_status kvq_##T##_encode_fast(const kvq_codec *c, const float *x, const struct kvq_row *dst) \
    {                                                                                        \
        return kvq_cpu_has_avx2() ? kvq_##T##_encode_avx2(c, x, dst) : kvq_##T##_encode(c, x, dst); \
    }                                                                                        \
    void kvq_##T##_decode_fast(const kvq_codec *c, const struct kvq_row *src, float *x)      \
    {                                                                                        \
        if (kvq_cpu_has_avx2())                                                              \
            kvq_##T##_decode_avx2(c, src, x);                                                \
        else                                                                                 \
            kvq_##T##_decode(c, src, x);                                                     \
    }                                                                                        \
    float kvq_##T##_score_fast(const kvq_codec *c, const float *q, const struct kvq_row *src) \
    {                                                                                        \
        return kvq_cpu_has_avx2() ? kvq_##T##_score_avx2(c, q, src) : kvq_##T##_score(c, q, src); \
    }
DISPATCH(f16)
DISPATCH(q8_0)
DISPATCH(q4_0)

kvq_status kvq_f32_encode_fast(const kvq_codec *c, const float *x, const struct kvq_row *dst)
{
    return kvq_cpu_has_avx2() ? kvq_f32_encode_avx2(c, x, dst) : kvq_f32_encode(c, x, dst);
}

float kvq_f32_score_fast(const kvq_codec *c, const float *q, const struct kvq_row *src)
{
    return kvq_cpu_has_avx2() ? kvq_f32_score_avx2(c, q, src) : kvq_f32_score(c, q, src);
}
