/* baseline_avx2.c - f16, q8_0 and q4_0 rows with AVX2/F16C, bit-identical to baseline.c.
 *
 * Why these exist: kvq's types are compared with the baselines in speed, so
 * the baselines must not be handicapped by scalar loops. Bit-identity with
 * the llama.cpp reference semantics needs care in two places:
 *  - q8_0 rounds with roundf (halves away from zero); the SIMD round
 *    instruction rounds halves to even, so rounding is done as
 *    t = trunc(v), t += sign(v) when |v - t| >= 0.5 (v - t is exact);
 *  - q4_0's scale is the first value of largest magnitude in the block, so
 *    the maximum is located by index, not just by value.
 * F16C's conversion (round to nearest even) equals kvq_f32_to_f16.
 * Only called after kvq_cpu_has_avx2().
 */
#include <immintrin.h>
#include <string.h>

#include "codec_avx2_internal.h"
#include "codec_internal.h"
#include "kvq_half.h"

static inline __m256 abs8(__m256 v)
{
    return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}

/* f32 and f16 rows take any d >= 8, so their loops run to d8 = d & ~7 and
 * finish the tail in scalar code (scores: into the lane j & 7, as the
 * reference does). q8_0/q4_0 rows are whole blocks of 32.
 *
 * Score tail: the lanes spilled, the n < 8 values from index d8 (a multiple
 * of 8) added into lane j, then reduced as kvq_reduce8(). */
static inline float finish_score(__m256 acc, const float *q, const float *x, int n)
{
    float a[8];
    _mm256_storeu_ps(a, acc);
    for (int j = 0; j < n; j++)
        a[j] = fmaf(q[j], x[j], a[j]);
    return kvq_reduce8(a);
}

/* 1 when some |x_j| >= 65520 (its f16 would be Inf). */
static inline int f16_range_bad(const float *x, int d)
{
    const __m256 lim = _mm256_set1_ps(65520.0f);
    __m256 over = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= d; j += 8)
        over = _mm256_or_ps(over, _mm256_cmp_ps(abs8(_mm256_loadu_ps(x + j)), lim, _CMP_GE_OQ));
    int bad = _mm256_movemask_ps(over) != 0;
    for (; j < d; j++)
        bad |= !(fabsf(x[j]) < 65520.0f);
    return bad;
}

/* ---- f32 ---- */

kvq_status kvq_f32_encode_avx2(const kvq_codec *c, const float *x, const struct kvq_row *dst)
{
    if (!kvq_all_finite_avx2(x, c->cfg.dim))
        return KVQ_ERR_NONFINITE;
    memcpy(dst->codes, x, (size_t)c->cfg.dim * sizeof(float));
    return KVQ_OK;
}

/* ---- f16 ---- */

kvq_status kvq_f16_encode_avx2(const kvq_codec *c, const float *x, const struct kvq_row *dst)
{
    int d = c->cfg.dim, d8 = d & ~7;
    if (!kvq_all_finite_avx2(x, d))
        return KVQ_ERR_NONFINITE;
    if (f16_range_bad(x, d))
        return KVQ_ERR_RANGE;
    for (int j = 0; j < d8; j += 8)
        _mm_storeu_si128((__m128i *)(void *)(dst->codes + 2 * j),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + j), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (int j = d8; j < d; j++) {
        uint16_t h = kvq_f32_to_f16(x[j]);
        memcpy(dst->codes + 2 * j, &h, sizeof h);
    }
    return KVQ_OK;
}

static inline __m256 f16x8(const uint8_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

static inline float f16_at(const uint8_t *p, int j)
{
    uint16_t h;
    memcpy(&h, p + 2 * j, sizeof h);
    return kvq_f16_to_f32(h);
}

void kvq_f16_decode_avx2(const kvq_codec *c, const struct kvq_row *src, float *x)
{
    int d = c->cfg.dim, d8 = d & ~7;
    for (int j = 0; j < d8; j += 8)
        _mm256_storeu_ps(x + j, f16x8(src->codes + 2 * j));
    for (int j = d8; j < d; j++)
        x[j] = f16_at(src->codes, j);
}

float kvq_f16_score_avx2(const kvq_codec *c, const float *q, const struct kvq_row *src)
{
    int d = c->cfg.dim, d8 = d & ~7;
    __m256 a = _mm256_setzero_ps();
    for (int j = 0; j < d8; j += 8)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), f16x8(src->codes + 2 * j), a);
    float tail[8];
    for (int j = d8; j < d; j++)
        tail[j - d8] = f16_at(src->codes, j);
    return finish_score(a, q + d8, tail, d - d8);
}

float kvq_f32_score_avx2(const kvq_codec *c, const float *q, const struct kvq_row *src)
{
    int d = c->cfg.dim, d8 = d & ~7;
    const float *x = (const float *)(const void *)src->codes; /* unaligned loads only */
    __m256 a = _mm256_setzero_ps();
    for (int j = 0; j < d8; j += 8)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), _mm256_loadu_ps(x + j), a);
    float tail[8];
    memcpy(tail, src->codes + 4 * (size_t)d8, (size_t)(d - d8) * sizeof(float));
    return finish_score(a, q + d8, tail, d - d8);
}

/* ---- q8_0 ---- */

static inline float block_amax(const float *x)
{
    __m256 m = _mm256_max_ps(_mm256_max_ps(abs8(_mm256_loadu_ps(x)), abs8(_mm256_loadu_ps(x + 8))),
                             _mm256_max_ps(abs8(_mm256_loadu_ps(x + 16)), abs8(_mm256_loadu_ps(x + 24))));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_shuffle_ps(s, s, 1)));
}

/* roundf(v) for every lane (halves away from zero). */
static inline __m256 round_away(__m256 v)
{
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 half = _mm256_cmp_ps(abs8(_mm256_sub_ps(v, t)), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    __m256 one = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(v, _mm256_set1_ps(-0.0f)));
    return _mm256_add_ps(t, _mm256_and_ps(half, one));
}

kvq_status kvq_q8_0_encode_avx2(const kvq_codec *c, const float *x, const struct kvq_row *dst)
{
    int nb = c->cfg.dim / KVQ_QK;
    if (!kvq_all_finite_avx2(x, c->cfg.dim))
        return KVQ_ERR_NONFINITE;
    float amax[KVQ_MAX_DIM / KVQ_QK];
    for (int b = 0; b < nb; b++) {
        amax[b] = block_amax(x + b * KVQ_QK);
        if (kvq_f16_overflows(amax[b] / 127.0f))
            return KVQ_ERR_RANGE;
    }
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int b = 0; b < nb; b++) {
        const float *xb = x + b * KVQ_QK;
        float d = amax[b] / 127.0f, id = kvq_block_inv_scale(d);
        const __m256 vid = _mm256_set1_ps(id);
        __m256i i[4];
        for (int k = 0; k < 4; k++)
            i[k] = _mm256_cvttps_epi32(round_away(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * k), vid)));
        /* int32 -> int8 keeping order: the packs interleave 128-bit lanes, the permute undoes it. */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        p = _mm256_permutevar8x32_epi32(p, order);
        uint16_t dh = kvq_f32_to_f16(d);
        uint8_t *o = dst->codes + (size_t)b * sizeof(kvq_block_q8_0);
        memcpy(o, &dh, sizeof dh);
        _mm256_storeu_si256((__m256i *)(void *)(o + 2), p);
    }
    return KVQ_OK;
}

void kvq_q8_0_decode_avx2(const kvq_codec *c, const struct kvq_row *src, float *x)
{
    int nb = c->cfg.dim / KVQ_QK;
    for (int b = 0; b < nb; b++) {
        const uint8_t *o = src->codes + (size_t)b * sizeof(kvq_block_q8_0);
        uint16_t dh;
        memcpy(&dh, o, sizeof dh);
        const __m256 d = _mm256_set1_ps(kvq_f16_to_f32(dh));
        for (int k = 0; k < 4; k++) {
            __m128i q8 = _mm_loadl_epi64((const __m128i *)(const void *)(o + 2 + 8 * k));
            __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
            _mm256_storeu_ps(x + b * KVQ_QK + 8 * k, _mm256_mul_ps(v, d));
        }
    }
}

float kvq_q8_0_score_avx2(const kvq_codec *c, const float *q, const struct kvq_row *src)
{
    int nb = c->cfg.dim / KVQ_QK;
    __m256 a = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *o = src->codes + (size_t)b * sizeof(kvq_block_q8_0);
        uint16_t dh;
        memcpy(&dh, o, sizeof dh);
        const __m256 d = _mm256_set1_ps(kvq_f16_to_f32(dh));
        for (int k = 0; k < 4; k++) {
            __m128i q8 = _mm_loadl_epi64((const __m128i *)(const void *)(o + 2 + 8 * k));
            __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)), d);
            a = _mm256_fmadd_ps(_mm256_loadu_ps(q + b * KVQ_QK + 8 * k), v, a);
        }
    }
    return kvq_hsum8_avx2(a);
}

/* ---- q4_0 ---- */

/* The first value of largest magnitude (llama.cpp keeps the first on ties). */
static inline float block_signed_max(const float *x)
{
    float amax = block_amax(x);
    if (amax == 0.0f) /* the reference then keeps its initial +0 (x may hold -0) */
        return 0.0f;
    const __m256 m = _mm256_set1_ps(amax);
    for (int k = 0; k < 4; k++) {
        int hit = _mm256_movemask_ps(_mm256_cmp_ps(abs8(_mm256_loadu_ps(x + 8 * k)), m, _CMP_EQ_OQ));
        if (hit)
            return x[8 * k + __builtin_ctz((unsigned)hit)];
    }
    return 0.0f; /* not reached: some |x| equals amax */
}

kvq_status kvq_q4_0_encode_avx2(const kvq_codec *c, const float *x, const struct kvq_row *dst)
{
    int nb = c->cfg.dim / KVQ_QK;
    if (!kvq_all_finite_avx2(x, c->cfg.dim))
        return KVQ_ERR_NONFINITE;
    float dmax[KVQ_MAX_DIM / KVQ_QK];
    for (int b = 0; b < nb; b++) {
        dmax[b] = block_signed_max(x + b * KVQ_QK) / -8.0f;
        if (kvq_f16_overflows(dmax[b]))
            return KVQ_ERR_RANGE;
    }
    const __m256 half8 = _mm256_set1_ps(8.5f);
    const __m256i fifteen = _mm256_set1_epi32(15);
    for (int b = 0; b < nb; b++) {
        const float *xb = x + b * KVQ_QK;
        float d = dmax[b], id = kvq_block_inv_scale(d);
        const __m256 vid = _mm256_set1_ps(id);
        __m256i i[4];
        for (int k = 0; k < 4; k++) /* (int8_t)(x*id + 8.5): the value is >= 0, truncation is the cast */
            i[k] = _mm256_min_epi32(
                _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * k), vid), half8)), fifteen);
        __m256i lo = _mm256_or_si256(i[0], _mm256_slli_epi32(i[2], 4)); /* bytes 0..7  */
        __m256i hi = _mm256_or_si256(i[1], _mm256_slli_epi32(i[3], 4)); /* bytes 8..15 */
        __m128i a = _mm_packus_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
        __m128i e = _mm_packus_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
        uint16_t dh = kvq_f32_to_f16(d);
        uint8_t *o = dst->codes + (size_t)b * sizeof(kvq_block_q4_0);
        memcpy(o, &dh, sizeof dh);
        _mm_storeu_si128((__m128i *)(void *)(o + 2), _mm_packus_epi16(a, e));
    }
    return KVQ_OK;
}

/* The 32 values of one block as four vectors of (q - 8) as float. */
static inline void q4_unpack(const uint8_t *qs, __m256 v[4])
{
    __m128i raw = _mm_loadu_si128((const __m128i *)(const void *)qs);
    __m128i m = _mm_set1_epi8(15);
    __m128i lo = _mm_and_si128(raw, m), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m);
    const __m256i eight = _mm256_set1_epi32(8);
    v[0] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(lo), eight));
    v[1] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)), eight));
    v[2] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(hi), eight));
    v[3] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)), eight));
}

void kvq_q4_0_decode_avx2(const kvq_codec *c, const struct kvq_row *src, float *x)
{
    int nb = c->cfg.dim / KVQ_QK;
    for (int b = 0; b < nb; b++) {
        const uint8_t *o = src->codes + (size_t)b * sizeof(kvq_block_q4_0);
        uint16_t dh;
        memcpy(&dh, o, sizeof dh);
        const __m256 d = _mm256_set1_ps(kvq_f16_to_f32(dh));
        __m256 v[4];
        q4_unpack(o + 2, v);
        for (int k = 0; k < 4; k++)
            _mm256_storeu_ps(x + b * KVQ_QK + 8 * k, _mm256_mul_ps(v[k], d));
    }
}

float kvq_q4_0_score_avx2(const kvq_codec *c, const float *q, const struct kvq_row *src)
{
    int nb = c->cfg.dim / KVQ_QK;
    __m256 a = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *o = src->codes + (size_t)b * sizeof(kvq_block_q4_0);
        uint16_t dh;
        memcpy(&dh, o, sizeof dh);
        const __m256 d = _mm256_set1_ps(kvq_f16_to_f32(dh));
        __m256 v[4];
        q4_unpack(o + 2, v);
        for (int k = 0; k < 4; k++)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(q + b * KVQ_QK + 8 * k), _mm256_mul_ps(v[k], d), a);
    }
    return kvq_hsum8_avx2(a);
}

/* kvq_baseline_check() with the kernels above (the batch encoder checks
 * every row before writing any, so this runs once per row). */
kvq_status kvq_baseline_check_avx2(const kvq_codec *c, const float *x)
{
    int d = c->cfg.dim, nb = d / KVQ_QK;
    if (!kvq_all_finite_avx2(x, d))
        return KVQ_ERR_NONFINITE;
    switch (kvq_layout_base_type((int)c->cfg.type)) {
    case KVQ_TYPE_F16:
        return f16_range_bad(x, d) ? KVQ_ERR_RANGE : KVQ_OK;
    case KVQ_TYPE_Q8_0:
        for (int b = 0; b < nb; b++)
            if (kvq_f16_overflows(block_amax(x + b * KVQ_QK) / 127.0f))
                return KVQ_ERR_RANGE;
        return KVQ_OK;
    case KVQ_TYPE_Q4_0:
        for (int b = 0; b < nb; b++)
            if (kvq_f16_overflows(block_signed_max(x + b * KVQ_QK) / -8.0f))
                return KVQ_ERR_RANGE;
        return KVQ_OK;
    case KVQ_TYPE_Q4_1:
    case KVQ_TYPE_Q5_0:
    case KVQ_TYPE_Q5_1: /* no AVX2 row codec for these (baseline_q5.c): the scalar check */
        return kvq_q5_family_check(kvq_layout_base_type((int)c->cfg.type), x, d);
    default:
        return KVQ_OK;
    }
}
