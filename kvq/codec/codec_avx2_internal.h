/* codec_avx2_internal.h - AVX2 helpers the codec kernels share.
 *
 * Include only from *_avx2.c files (built with -mavx2 -mfma -mf16c), and call
 * only after kvq_cpu_has_avx2().
 */
#ifndef KVQ_CODEC_AVX2_INTERNAL_H
#define KVQ_CODEC_AVX2_INTERNAL_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "codec_internal.h"

/* The sum of the 8 lanes in kvq_reduce8()'s order,
 * ((s0+s4)+(s2+s6)) + ((s1+s5)+(s3+s7)), so results match the references. */
static inline float kvq_hsum8_avx2(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

/* 1 when every x_j (j < d, any d >= 0) is finite, as kvq_all_finite(). */
static inline int kvq_all_finite_avx2(const float *x, int d)
{
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 inf = _mm256_set1_ps(INFINITY);
    __m256 bad = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= d; j += 8) /* NLT_UQ: |x| >= Inf, or NaN */
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask), inf, _CMP_NLT_UQ));
    int ok = _mm256_movemask_ps(bad) == 0;
    for (; j < d; j++)
        ok &= isfinite(x[j]) != 0;
    return ok;
}

/* Lane shifts for kvq_codes8_wide_avx2: bits * (k mod 4). */
static inline __m256i kvq_wide_shifts_avx2(int bits)
{
    return _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3), _mm256_set1_epi32(bits));
}

/* The 8 codes of a 5- to 8-bit codebook stored in the `bits` bytes at p, as
 * lanes still to be masked to their low `bits` bits: lanes 0-3 come from the
 * low 4 * bits bits of the word, lanes 4-7 from the next 4 * bits. */
static inline __m256i kvq_codes8_wide_avx2(const uint8_t *p, int bits, __m256i shifts)
{
    const uint64_t w = kvq_load_le_5to8(p, bits);
    const int lo = (int)(uint32_t)w, hi = (int)(uint32_t)(w >> (4 * bits));
    return _mm256_srlv_epi32(_mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi), shifts);
}

#endif /* KVQ_CODEC_AVX2_INTERNAL_H */
