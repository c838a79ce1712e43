/* kvq_half.h - IEEE 754 binary16 conversion, shared by host code and CUDA.
 *
 * kvq stores norms, scales and f16 caches as raw uint16_t bit patterns so that
 * the layout is identical in C11 and under nvcc. float -> half rounds to
 * nearest, ties to even (the same as F16C's _mm_cvtps_ph(x, 0) and CUDA's
 * __float2half_rn), so every backend produces the same bits.
 */
#ifndef KVQ_HALF_H
#define KVQ_HALF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kvq_export.h"

#if defined(__CUDACC__)
#define KVQ_HD __host__ __device__
#else
#define KVQ_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

KVQ_HD static inline uint32_t kvq_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

KVQ_HD static inline float kvq_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/** @return the binary16 bits nearest to f (ties to even); NaN stays NaN,
 *  values beyond 65504 round to +-Inf as IEEE requires. */
KVQ_HD static inline uint16_t kvq_f32_to_f16(float f)
{
    uint32_t x = kvq_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t exp = (x >> 23) & 0xffu;
    uint32_t man = x & 0x7fffffu;

    if (exp == 0xffu) /* Inf or NaN (keep NaN quiet and non-zero) */
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0u));
    int32_t e = (int32_t)exp - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) { /* subnormal half or zero */
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (half & 1u)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u)))
        half++; /* may carry into the exponent, up to Inf: correct */
    return (uint16_t)(sign | half);
}

/** @return the float with exactly the value of binary16 bits h. */
KVQ_HD static inline float kvq_f16_to_f32(uint16_t h)
{
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t exp = ((uint32_t)h >> 10) & 0x1fu;
    uint32_t man = (uint32_t)h & 0x3ffu;
    uint32_t x;

    if (exp == 0x1fu) {
        x = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        x = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        x = sign;
    } else { /* subnormal: normalise */
        uint32_t e = 113u;
        while (!(man & 0x400u)) {
            man <<= 1;
            e--;
        }
        x = sign | (e << 23) | ((man & 0x3ffu) << 13);
    }
    return kvq_bits_f32(x);
}

/** Whole rows on the host: h[i] = kvq_f32_to_f16(x[i]) and x[i] =
 *  kvq_f16_to_f32(h[i]) for i < n, bit for bit (F16C where the CPU has it). */
KVQ_API void kvq_f32_to_f16_n(const float *x, uint16_t *h, size_t n);
KVQ_API void kvq_f16_to_f32_n(const uint16_t *h, float *x, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_HALF_H */
