/* matvec.c - dispatch and scalar reference of the few-row matrix product
 * (see matvec_internal.h). */
#include "matvec_internal.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kvq_cpu.h"
#include "kvq_half.h"

static float weight_at(const void *w, int dtype, size_t i)
{
    uint16_t h;
    float f;
    switch (dtype) {
    case KVQ_MV_BF16:
        memcpy(&h, (const uint16_t *)w + i, 2);
        return kvq_bits_f32((uint32_t)h << 16);
    case KVQ_MV_F16:
        memcpy(&h, (const uint16_t *)w + i, 2);
        return kvq_f16_to_f32(h);
    default:
        memcpy(&f, (const float *)w + i, 4);
        return f;
    }
}

void kvq_matvec_ref_w(const float *x, int ldx, const void *w, int dtype, float *y, int ldy, int M, int N, int K,
                      int accumulate)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const float *xr = x + (size_t)m * ldx;
            double s = 0.0;
            for (int k = 0; k < K; k++)
                s += (double)xr[k] * weight_at(w, dtype, (size_t)n * K + k);
            float *o = y + (size_t)m * ldy + n;
            *o = accumulate ? *o + (float)s : (float)s;
        }
}

void kvq_matvec_ref(const float *x, int ldx, const float *w, float *y, int ldy, int M, int N, int K, int accumulate)
{
    kvq_matvec_ref_w(x, ldx, w, KVQ_MV_F32, y, ldy, M, N, K, accumulate);
}

void kvq_matvec(const float *x, int ldx, const float *w, float *y, int ldy, int M, int N, int K, int accumulate)
{
    if (kvq_cpu_has_avx2())
        kvq_matvec_avx2(x, ldx, w, y, ldy, M, N, K, accumulate);
    else
        kvq_matvec_ref(x, ldx, w, y, ldy, M, N, K, accumulate);
}

void kvq_matvec_w(const float *x, int ldx, const void *w, int dtype, float *y, int ldy, int M, int N, int K,
                  int accumulate)
{
    if (kvq_cpu_has_avx2())
        kvq_matvec_avx2_w(x, ldx, w, dtype, y, ldy, M, N, K, accumulate);
    else
        kvq_matvec_ref_w(x, ldx, w, dtype, y, ldy, M, N, K, accumulate);
}
