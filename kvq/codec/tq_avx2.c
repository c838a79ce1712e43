/* tq_avx2.c - the tq row codec with AVX2/FMA, bit-identical to tq_ref.c.
 *
 * Every float result here comes from the same operations as the reference,
 * in the same order: lane k of an 8-wide accumulator is the reference's
 * partial sum s[k] (j = k mod 8), and kvq_hsum8_avx2() reduces the register
 * exactly like kvq_reduce8(). Quantization counts boundaries with compares
 * (no arithmetic, so nothing to round), and the codebook lookup is a permute.
 * Only called after kvq_cpu_has_avx2().
 */
#include <immintrin.h>
#include <string.h>

#include "codec_avx2_internal.h"
#include "codec_internal.h"
#include "kvq_half.h"

static inline float norm8(const float *x, int d)
{
    __m256 acc = _mm256_setzero_ps();
    for (int j = 0; j < d; j += 8) {
        __m256 v = _mm256_loadu_ps(x + j);
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    return sqrtf(kvq_hsum8_avx2(acc));
}

kvq_status kvq_tq_check_avx2(const kvq_codec *c, const float *x)
{
    int d = c->cfg.dim;
    if (!kvq_all_finite_avx2(x, d))
        return KVQ_ERR_NONFINITE;
    return kvq_f16_overflows(norm8(x, d)) ? KVQ_ERR_RANGE : KVQ_OK;
}

/* Codebook in registers: c[idx] for idx < 16 via one or two permutes. */
struct lut {
    __m256 lo, hi;
    int two;
};

static inline struct lut lut_load(const kvq_codec *c)
{
    struct lut L;
    L.lo = _mm256_loadu_ps(c->centroids);
    L.hi = _mm256_loadu_ps(c->centroids + 8);
    L.two = c->levels > 8;
    return L;
}

static inline __m256 lut_get(const struct lut *L, __m256i idx)
{
    __m256 v = _mm256_permutevar8x32_ps(L->lo, idx);
    if (L->two) {
        __m256 h = _mm256_permutevar8x32_ps(L->hi, idx);
        __m256 up = _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32(7)));
        v = _mm256_blendv_ps(v, h, up);
    }
    return v;
}

/* Lane k of the shift vector is bits * k: 8 codes of `bits` bits make one
 * little-endian word of `bits` bytes (the stream order of kvq_codec.h). */
static inline __m256i code_shifts(int bits)
{
    return _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(bits));
}

static inline uint32_t or_lanes(__m256i v)
{
    __m128i a = _mm_or_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    a = _mm_or_si128(a, _mm_shuffle_epi32(a, _MM_SHUFFLE(1, 0, 3, 2)));
    a = _mm_or_si128(a, _mm_shuffle_epi32(a, _MM_SHUFFLE(2, 3, 0, 1)));
    return (uint32_t)_mm_cvtsi128_si32(a);
}

static inline void store_word(uint8_t *p, uint32_t w, int nbytes)
{
    for (int i = 0; i < nbytes; i++)
        p[i] = (uint8_t)(w >> (8 * i));
}

static inline uint32_t load_word(const uint8_t *p, int nbytes)
{
    uint32_t w = 0;
    for (int i = 0; i < nbytes; i++)
        w |= (uint32_t)p[i] << (8 * i);
    return w;
}

/* Codes j..j+7 as 8 lanes. */
static inline __m256i codes8(const uint8_t *codes, int bits, int j, __m256i shifts, __m256i mask)
{
    __m256i w = _mm256_set1_epi32((int)load_word(codes + (j >> 3) * bits, bits));
    return _mm256_and_si256(_mm256_srlv_epi32(w, shifts), mask);
}

/* Centroids of codes j..j+7: the permute table up to 4 bits; for the 5- to
 * 8-bit codebooks a gather, the 8 codes being the B bytes at (j / 8) * B
 * (lanes 0-3 in their low 4B bits, lanes 4-7 in the next 4B). */
static inline __m256 centroids8(const kvq_codec *c, const struct lut *L, const uint8_t *codes, int j, __m256i shifts,
                                __m256i mask)
{
    const int bits = c->bits;
    if (bits <= KVQ_TQ_SIMD_MAX_BITS)
        return lut_get(L, codes8(codes, bits, j, shifts, mask));
    const __m256i v = kvq_codes8_wide_avx2(codes + (j >> 3) * bits, bits, shifts);
    return _mm256_i32gather_ps(c->centroids, _mm256_and_si256(v, mask), 4);
}

/* Per-lane shifts of centroids8(): bits * k, or bits * (k mod 4) past 4 bits. */
static inline __m256i centroid_shifts(int bits)
{
    return bits <= KVQ_TQ_SIMD_MAX_BITS ? code_shifts(bits) : kvq_wide_shifts_avx2(bits);
}

/* The reference's code for y: the number of boundaries below it (they
 * ascend, so a binary search finds the same count as the reference's scan). */
static inline unsigned code_of(const kvq_codec *c, float y)
{
    unsigned lo = 0, hi = (unsigned)c->levels - 1;
    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        if (y > c->boundaries[mid])
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Lane k all-ones when sign bit k of byte b is set. */
static inline __m256 signs8(uint8_t b)
{
    const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    __m256i m = _mm256_and_si256(_mm256_set1_epi32(b), lane_bit);
    return _mm256_castsi256_ps(_mm256_cmpeq_epi32(m, lane_bit));
}

/* Codes of y into codes, and r = y - c[idx] when r is not NULL: up to 4
 * bits, every boundary is one vector compare, counted per lane. */
static void quantize_simd(const kvq_codec *c, const struct lut *L, const float *y, uint8_t *codes, float *r)
{
    const int d = c->cfg.dim, bits = c->bits, nb = c->levels - 1;
    __m256 bnd[(1 << KVQ_TQ_SIMD_MAX_BITS) - 1];
    for (int i = 0; i < nb; i++)
        bnd[i] = _mm256_set1_ps(c->boundaries[i]);
    const __m256i shifts = code_shifts(bits);
    for (int j = 0; j < d; j += 8) {
        __m256 yv = _mm256_load_ps(y + j);
        __m256i idx = _mm256_setzero_si256();
        for (int i = 0; i < nb; i++) /* idx += (y > b_i): the mask is -1 */
            idx = _mm256_sub_epi32(idx, _mm256_castps_si256(_mm256_cmp_ps(yv, bnd[i], _CMP_GT_OQ)));
        store_word(codes + (j >> 3) * bits, or_lanes(_mm256_sllv_epi32(idx, shifts)), bits);
        if (r)
            _mm256_store_ps(r + j, _mm256_sub_ps(yv, lut_get(L, idx)));
    }
}

/* The same past 4 bits: 31..255 boundaries, so a search per coordinate
 * rather than a compare against each. */
static void quantize_wide(const kvq_codec *c, const float *y, uint8_t *codes, float *r)
{
    const int d = c->cfg.dim, bits = c->bits;
    memset(codes, 0, c->fields.codes);
    for (int j = 0; j < d; j++) {
        const unsigned idx = code_of(c, y[j]);
        kvq_code_set(codes, bits, j, idx);
        if (r)
            r[j] = y[j] - c->centroids[idx];
    }
}

kvq_status kvq_tq_encode_avx2(const kvq_codec *c, const float *x, const struct kvq_row *dst)
{
    int d = c->cfg.dim, bits = c->bits;
    if (!kvq_all_finite_avx2(x, d))
        return KVQ_ERR_NONFINITE;
    float n = norm8(x, d);
    if (kvq_f16_overflows(n))
        return KVQ_ERR_RANGE;
    int qjl = c->traits->qjl;
    if (n == 0.0f) {
        kvq_row_store_u16(dst->norm, 0);
        memset(dst->codes, 0, c->fields.codes);
        if (qjl) {
            kvq_row_store_u16(dst->rnorm, 0);
            memset(dst->signs, 0, c->fields.signs);
        }
        return KVQ_OK;
    }

    _Alignas(32) float y[KVQ_MAX_DIM];
    _Alignas(32) float r[KVQ_MAX_DIM];
    if (d < 8) /* never (create checks dims); tells the compiler y gets written */
        return KVQ_ERR_INTERNAL;
    const __m256 inv = _mm256_set1_ps(1.0f / n);
    for (int j = 0; j < d; j += 8)
        _mm256_store_ps(y + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), inv));
    kvq_rotation_apply(c->rot, y, y);

    const struct lut L = lut_load(c);
    if (bits > KVQ_TQ_SIMD_MAX_BITS)
        quantize_wide(c, y, dst->codes, qjl ? r : NULL);
    else
        quantize_simd(c, &L, y, dst->codes, qjl ? r : NULL);
    kvq_row_store_u16(dst->norm, kvq_f32_to_f16(n));
    if (!qjl)
        return KVQ_OK;

    float gamma = norm8(r, d);
    kvq_codec_s_apply(c, r, r);
    const __m256 zero = _mm256_setzero_ps();
    for (int j = 0; j < d; j += 8) {
        int neg = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_load_ps(r + j), zero, _CMP_LT_OQ));
        dst->signs[j >> 3] = (uint8_t)~neg;
    }
    kvq_row_store_u16(dst->rnorm, kvq_f32_to_f16(gamma));
    return KVQ_OK;
}

void kvq_tq_decode_avx2(const kvq_codec *c, const struct kvq_row *src, float *x)
{
    int d = c->cfg.dim, bits = c->bits;
    float n = kvq_f16_to_f32(kvq_row_load_u16(src->norm));
    if (n == 0.0f) {
        memset(x, 0, (size_t)d * sizeof(float));
        return;
    }
    _Alignas(32) float w[KVQ_MAX_DIM];
    _Alignas(32) float t[KVQ_MAX_DIM];
    if (d < 8) /* never (create checks dims); tells the compiler w gets written */
        return;
    const struct lut L = lut_load(c);
    const __m256i shifts = centroid_shifts(bits), mask = _mm256_set1_epi32(c->levels - 1);
    for (int j = 0; j < d; j += 8)
        _mm256_store_ps(w + j, centroids8(c, &L, src->codes, j, shifts, mask));
    if (c->traits->qjl) {
        const __m256 one = _mm256_set1_ps(1.0f), minus = _mm256_set1_ps(-1.0f);
        for (int j = 0; j < d; j += 8)
            _mm256_store_ps(t + j, _mm256_blendv_ps(minus, one, signs8(src->signs[j >> 3])));
        kvq_codec_s_apply_t(c, t, t);
        const __m256 g = _mm256_set1_ps(kvq_f16_to_f32(kvq_row_load_u16(src->rnorm)) * c->qjl_kappa_f);
        for (int j = 0; j < d; j += 8)
            _mm256_store_ps(w + j, _mm256_fmadd_ps(g, _mm256_load_ps(t + j), _mm256_load_ps(w + j)));
    }
    kvq_rotation_apply_t(c->rot, w, w);
    const __m256 nv = _mm256_set1_ps(n);
    for (int j = 0; j < d; j += 8)
        _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_load_ps(w + j), nv));
}

float kvq_tq_score_avx2(const kvq_codec *c, const float *qprep, const struct kvq_row *src)
{
    int d = c->cfg.dim, bits = c->bits;
    float n = kvq_f16_to_f32(kvq_row_load_u16(src->norm));
    const struct lut L = lut_load(c);
    const __m256i shifts = centroid_shifts(bits), mask = _mm256_set1_epi32(c->levels - 1);
    __m256 a = _mm256_setzero_ps();
    for (int j = 0; j < d; j += 8)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(qprep + j), centroids8(c, &L, src->codes, j, shifts, mask), a);
    float A = kvq_hsum8_avx2(a);
    if (!c->traits->qjl)
        return n * A;

    const float *sq = qprep + d;
    __m256 p = _mm256_setzero_ps(), t = _mm256_setzero_ps();
    for (int j = 0; j < d; j += 8) {
        __m256 v = _mm256_loadu_ps(sq + j);
        p = _mm256_add_ps(p, _mm256_and_ps(v, signs8(src->signs[j >> 3])));
        t = _mm256_add_ps(t, v);
    }
    float g = kvq_f16_to_f32(kvq_row_load_u16(src->rnorm)) * c->qjl_kappa_f;
    return n * fmaf(g, 2.0f * kvq_hsum8_avx2(p) - kvq_hsum8_avx2(t), A);
}
