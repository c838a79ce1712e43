/* baseline_q5.c - llama.cpp's q4_1, q5_0 and q5_1 cache formats.
 *
 * Bit for bit llama.cpp's blocks (ggml-common.h) and reference quantizers
 * (ggml-quants.c quantize_row_q4_1_ref, quantize_row_q5_0_ref,
 * quantize_row_q5_1_ref): the same float operations in the same order, the
 * same float-to-integer conversions ((int8_t) then MIN for q4_1/q5_0, a bare
 * (uint8_t) for q5_1), the scale used unrounded and stored as f16. Decode is
 * dequantize_row_*: q * d + m (q4_1, q5_1) or (q - 16) * d (q5_0).
 * kvq's additions are those of baseline.c: non-finite input is refused
 * (KVQ_ERR_NONFINITE), so is any block whose f16 scale or minimum would
 * overflow (KVQ_ERR_RANGE), both before anything is written; 1/d that
 * overflows quantizes to 0 (kvq_block_inv_scale).
 *
 * These exist as honest baselines (and as the layouts of q4_1r, q5_0r,
 * q5_1r), not as kvq's fast path: the traits table uses these scalar kernels
 * for the "fast" row functions too. Attention has AVX2 kernels for them
 * (attn_avx2.c). Scores use the 8-lane fmaf order of codec_internal.h.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "codec_internal.h"
#include "kvq_half.h"

struct blk_par {
    float d, m; /* scale (unrounded) and minimum (q4_1, q5_1; 0 for q5_0) */
};

/* quantize_row_q4_1_ref / q5_1_ref: min starts at FLT_MAX, max at -FLT_MAX. */
static struct blk_par min_max_par(const float *x, float levels)
{
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < KVQ_QK; j++) {
        const float v = x[j];
        if (v < min)
            min = v;
        if (v > max)
            max = v;
    }
    struct blk_par p = {(max - min) / levels, min};
    return p;
}

/* quantize_row_q5_0_ref: the value of the largest |x| (the first one wins), / -16. */
static struct blk_par q5_0_par(const float *x)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < KVQ_QK; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    struct blk_par p = {max / -16.0f, 0.0f};
    return p;
}

static struct blk_par block_par(int type, const float *x)
{
    switch (type) {
    case KVQ_TYPE_Q4_1: return min_max_par(x, 15.0f);
    case KVQ_TYPE_Q5_1: return min_max_par(x, 31.0f);
    default: return q5_0_par(x);
    }
}

/* Every block's parameters into p[d / KVQ_QK] (p may be NULL), checking the
 * whole row first. @return KVQ_OK, KVQ_ERR_NONFINITE or KVQ_ERR_RANGE. */
static kvq_status row_par(int type, const float *x, int d, struct blk_par *p)
{
    if (!kvq_all_finite(x, d))
        return KVQ_ERR_NONFINITE;
    for (int b = 0; b < d / KVQ_QK; b++) {
        const struct blk_par q = block_par(type, x + b * KVQ_QK);
        if (kvq_f16_overflows(q.d) || kvq_f16_overflows(q.m))
            return KVQ_ERR_RANGE;
        if (p)
            p[b] = q;
    }
    return KVQ_OK;
}

kvq_status kvq_q5_family_check(int type, const float *x, int d)
{
    return row_par(type, x, d, NULL);
}

/* The 5-bit levels of one q5 block into qs/qh (llama.cpp's packing). */
static void pack5(const uint8_t xi[KVQ_QK], uint8_t qs[KVQ_QK / 2], uint8_t qh_out[4])
{
    uint32_t qh = 0;
    for (int j = 0; j < KVQ_QK / 2; j++) {
        const uint8_t xi0 = xi[j], xi1 = xi[j + KVQ_QK / 2];
        qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
        qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
        qh |= ((xi1 & 0x10u) >> 4) << (j + KVQ_QK / 2);
    }
    memcpy(qh_out, &qh, sizeof qh); /* little-endian, as llama.cpp on its hosts */
}

/* Value j (0..31) of a q5 block: the nibble plus the fifth bit, 0..31. */
static int level5(const uint8_t *qs, uint32_t qh, int j)
{
    const int lo = j < KVQ_QK / 2 ? qs[j] & 15 : qs[j - KVQ_QK / 2] >> 4;
    return lo | (int)(((qh >> j) << 4) & 0x10);
}

/* <q, x> over a decoded row, in the 8-lane order of every baseline score:
 * the f32 score reads the floats as its row. The decoders compute each value
 * with the same expression the scores would, so this is that score exactly. */
static float score_decoded(const kvq_codec *c, const float *q, const float *x)
{
    return kvq_f32_score(c, q, &(struct kvq_row){NULL, NULL, (uint8_t *)(uintptr_t)x, NULL});
}

/* ---- q4_1 ---- */

kvq_status kvq_q4_1_encode(const kvq_codec *c, const float *x, const struct kvq_row *dst)
{
    const int nb = c->cfg.dim / KVQ_QK;
    struct blk_par par[KVQ_MAX_DIM / KVQ_QK];
    const kvq_status st = row_par(KVQ_TYPE_Q4_1, x, c->cfg.dim, par);
    if (st != KVQ_OK)
        return st;
    for (int b = 0; b < nb; b++) {
        const float *xb = x + b * KVQ_QK, min = par[b].m, id = kvq_block_inv_scale(par[b].d);
        kvq_block_q4_1 blk;
        blk.d = kvq_f32_to_f16(par[b].d);
        blk.m = kvq_f32_to_f16(min);
        for (int j = 0; j < KVQ_QK / 2; j++) {
            const float x0 = (xb[j] - min) * id, x1 = (xb[j + KVQ_QK / 2] - min) * id;
            const int8_t t0 = (int8_t)(x0 + 0.5f), t1 = (int8_t)(x1 + 0.5f);
            const uint8_t xi0 = (uint8_t)(t0 < 15 ? t0 : 15), xi1 = (uint8_t)(t1 < 15 ? t1 : 15);
            blk.qs[j] = (uint8_t)(xi0 | (xi1 << 4));
        }
        memcpy(dst->codes + (size_t)b * sizeof blk, &blk, sizeof blk);
    }
    return KVQ_OK;
}

void kvq_q4_1_decode(const kvq_codec *c, const struct kvq_row *src, float *x)
{
    const int nb = c->cfg.dim / KVQ_QK;
    for (int b = 0; b < nb; b++) {
        kvq_block_q4_1 blk;
        memcpy(&blk, src->codes + (size_t)b * sizeof blk, sizeof blk);
        const float d = kvq_f16_to_f32(blk.d), m = kvq_f16_to_f32(blk.m);
        float *xb = x + b * KVQ_QK;
        for (int j = 0; j < KVQ_QK / 2; j++) {
            xb[j] = (float)(blk.qs[j] & 15) * d + m;
            xb[j + KVQ_QK / 2] = (float)(blk.qs[j] >> 4) * d + m;
        }
    }
}

float kvq_q4_1_score(const kvq_codec *c, const float *q, const struct kvq_row *src)
{
    float x[KVQ_MAX_DIM];
    kvq_q4_1_decode(c, src, x);
    return score_decoded(c, q, x);
}

/* ---- q5_0 ---- */

kvq_status kvq_q5_0_encode(const kvq_codec *c, const float *x, const struct kvq_row *dst)
{
    const int nb = c->cfg.dim / KVQ_QK;
    struct blk_par par[KVQ_MAX_DIM / KVQ_QK];
    const kvq_status st = row_par(KVQ_TYPE_Q5_0, x, c->cfg.dim, par);
    if (st != KVQ_OK)
        return st;
    for (int b = 0; b < nb; b++) {
        const float *xb = x + b * KVQ_QK, id = kvq_block_inv_scale(par[b].d);
        kvq_block_q5_0 blk;
        uint8_t xi[KVQ_QK];
        blk.d = kvq_f32_to_f16(par[b].d);
        for (int j = 0; j < KVQ_QK; j++) { /* x * id + 16.5 lies in [0.5, 32.5]: truncation is floor */
            const int8_t t = (int8_t)(xb[j] * id + 16.5f);
            xi[j] = (uint8_t)(t < 31 ? t : 31);
        }
        pack5(xi, blk.qs, blk.qh);
        memcpy(dst->codes + (size_t)b * sizeof blk, &blk, sizeof blk);
    }
    return KVQ_OK;
}

void kvq_q5_0_decode(const kvq_codec *c, const struct kvq_row *src, float *x)
{
    const int nb = c->cfg.dim / KVQ_QK;
    for (int b = 0; b < nb; b++) {
        kvq_block_q5_0 blk;
        uint32_t qh;
        memcpy(&blk, src->codes + (size_t)b * sizeof blk, sizeof blk);
        memcpy(&qh, blk.qh, sizeof qh);
        const float d = kvq_f16_to_f32(blk.d);
        for (int j = 0; j < KVQ_QK; j++)
            x[b * KVQ_QK + j] = (float)(level5(blk.qs, qh, j) - 16) * d;
    }
}

float kvq_q5_0_score(const kvq_codec *c, const float *q, const struct kvq_row *src)
{
    float x[KVQ_MAX_DIM];
    kvq_q5_0_decode(c, src, x);
    return score_decoded(c, q, x);
}

/* ---- q5_1 ---- */

kvq_status kvq_q5_1_encode(const kvq_codec *c, const float *x, const struct kvq_row *dst)
{
    const int nb = c->cfg.dim / KVQ_QK;
    struct blk_par par[KVQ_MAX_DIM / KVQ_QK];
    const kvq_status st = row_par(KVQ_TYPE_Q5_1, x, c->cfg.dim, par);
    if (st != KVQ_OK)
        return st;
    for (int b = 0; b < nb; b++) {
        const float *xb = x + b * KVQ_QK, min = par[b].m, id = kvq_block_inv_scale(par[b].d);
        kvq_block_q5_1 blk;
        uint8_t xi[KVQ_QK];
        blk.d = kvq_f32_to_f16(par[b].d);
        blk.m = kvq_f32_to_f16(min);
        for (int j = 0; j < KVQ_QK; j++) /* no MIN(31, .): llama.cpp has none; (x - min) * id <= 31 + a few ulps */
            xi[j] = (uint8_t)((xb[j] - min) * id + 0.5f);
        pack5(xi, blk.qs, blk.qh);
        memcpy(dst->codes + (size_t)b * sizeof blk, &blk, sizeof blk);
    }
    return KVQ_OK;
}

void kvq_q5_1_decode(const kvq_codec *c, const struct kvq_row *src, float *x)
{
    const int nb = c->cfg.dim / KVQ_QK;
    for (int b = 0; b < nb; b++) {
        kvq_block_q5_1 blk;
        uint32_t qh;
        memcpy(&blk, src->codes + (size_t)b * sizeof blk, sizeof blk);
        memcpy(&qh, blk.qh, sizeof qh);
        const float d = kvq_f16_to_f32(blk.d), m = kvq_f16_to_f32(blk.m);
        for (int j = 0; j < KVQ_QK; j++)
            x[b * KVQ_QK + j] = (float)level5(blk.qs, qh, j) * d + m;
    }
}

float kvq_q5_1_score(const kvq_codec *c, const float *q, const struct kvq_row *src)
{
    float x[KVQ_MAX_DIM];
    kvq_q5_1_decode(c, src, x);
    return score_decoded(c, q, x);
}
