/* attn_exp_avx2.h - e^x over 8 floats, for the AVX2 attention kernels
 * (attn_avx2.c: decode; attn_chunk_avx2.c: prefill tiles), which must agree
 * bit for bit. Include only from files built with -mavx2 -mfma (the *_avx2.c
 * rule). Private to kvq/attn. */
#ifndef KVQ_ATTN_EXP_AVX2_H
#define KVQ_ATTN_EXP_AVX2_H

#include <immintrin.h>

/* e^x for x <= 0 (inputs below -87.3 give ~1e-38, not 0): Cody-Waite
 * reduction by ln 2 and the degree-6 polynomial of Cephes' expf, ~1 ulp. */
static inline __attribute__((always_inline)) __m256 kvq_exp_ps(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.33654f));
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

#endif /* KVQ_ATTN_EXP_AVX2_H */
