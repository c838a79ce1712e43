/* matvec.c - dispatch and scalar reference of the few-row matrix product
 * (see matvec_internal.h). */
#include "matvec_internal.h"

#include <stddef.h>

#include "kvq_cpu.h"

void kvq_matvec_ref(const float *x, int ldx, const float *w, float *y, int ldy, int M, int N, int K, int accumulate)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const float *xr = x + (size_t)m * ldx, *wr = w + (size_t)n * K;
            double s = 0.0;
            for (int k = 0; k < K; k++)
                s += (double)xr[k] * wr[k];
            float *o = y + (size_t)m * ldy + n;
            *o = accumulate ? *o + (float)s : (float)s;
        }
}

void kvq_matvec(const float *x, int ldx, const float *w, float *y, int ldy, int M, int N, int K, int accumulate)
{
    if (kvq_cpu_has_avx2())
        kvq_matvec_avx2(x, ldx, w, y, ldy, M, N, K, accumulate);
    else
        kvq_matvec_ref(x, ldx, w, y, ldy, M, N, K, accumulate);
}
