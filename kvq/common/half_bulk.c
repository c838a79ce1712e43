/* half_bulk.c - f16 conversions of whole rows (kvq_half.h, half_bulk.h):
 * F16C eight at a time where the CPU has it (kvq_cpu_has_avx2 checks F16C
 * too; it rounds to nearest even as kvq_f32_to_f16 does), the scalar
 * kvq_half.h functions for the rest and elsewhere. */
#include "half_bulk.h"

#include "kvq_cpu.h"
#include "kvq_half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define F16C __attribute__((target("avx,f16c")))
#define RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

F16C static size_t from_f32_f16c(const float *x, uint16_t *h, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), RNE));
    return i;
}

F16C static size_t to_f32_f16c(const uint16_t *h, float *x, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(h + i))));
    return i;
}

F16C static size_t round_f16c(float *x, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), RNE)));
    return i;
}
#else
static size_t from_f32_f16c(const float *x, uint16_t *h, size_t n) { (void)x; (void)h; (void)n; return 0; }
static size_t to_f32_f16c(const uint16_t *h, float *x, size_t n) { (void)x; (void)h; (void)n; return 0; }
static size_t round_f16c(float *x, size_t n) { (void)x; (void)n; return 0; }
#endif

void kvq_f32_to_f16_n(const float *x, uint16_t *h, size_t n)
{
    for (size_t i = kvq_cpu_has_avx2() ? from_f32_f16c(x, h, n) : 0; i < n; i++)
        h[i] = kvq_f32_to_f16(x[i]);
}

void kvq_f16_to_f32_n(const uint16_t *h, float *x, size_t n)
{
    for (size_t i = kvq_cpu_has_avx2() ? to_f32_f16c(h, x, n) : 0; i < n; i++)
        x[i] = kvq_f16_to_f32(h[i]);
}

void kvq_half_round(float *x, size_t n)
{
    for (size_t i = kvq_cpu_has_avx2() ? round_f16c(x, n) : 0; i < n; i++)
        x[i] = kvq_f16_to_f32(kvq_f32_to_f16(x[i]));
}
