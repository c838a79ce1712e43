/* rotation_dct.c - KVQ_ROT_DCT: seeded signs then an orthonormal DCT-II
 * through FFTW, kept to compare with the Kronecker Hadamard (docs/rotation.md).
 *
 * FFTW's REDFT10 is the unnormalised DCT-II, Y_k = 2 sum_j x_j cos(pi (j+1/2) k / n);
 * orthonormal means scaling Y_0 by 1/(2 sqrt(n)) and the others by 1/sqrt(2n).
 * Its inverse, the orthonormal DCT-III, is REDFT01 (X_k = Y_0 + 2 sum_{j>=1}
 * Y_j cos(pi j (k+1/2) / n)) after pre-scaling Y_0 by 1/sqrt(n) and the
 * others by 1/sqrt(2n).
 *
 * Plans are made once, in place, with FFTW_UNALIGNED so that any caller
 * buffer can be used through the new-array execute (which is thread-safe);
 * the planner itself is not thread-safe, hence the lock around it.
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include <fftw3.h>

#include "rotation_internal.h"

static pthread_mutex_t planner_lock = PTHREAD_MUTEX_INITIALIZER;

kvq_status kvq_rot_dct_plan(kvq_rotation *r)
{
    const int n = r->dim;
    float *buf = fftwf_malloc((size_t)n * sizeof *buf);
    if (!buf)
        return KVQ_ERR_NOMEM;
    const unsigned flags = FFTW_ESTIMATE | FFTW_UNALIGNED;
    pthread_mutex_lock(&planner_lock);
    fftwf_plan fwd = fftwf_plan_r2r_1d(n, buf, buf, FFTW_REDFT10, flags);
    fftwf_plan inv = fftwf_plan_r2r_1d(n, buf, buf, FFTW_REDFT01, flags);
    pthread_mutex_unlock(&planner_lock);
    fftwf_free(buf);
    r->dct_fwd = fwd;
    r->dct_inv = inv;
    if (!fwd || !inv)
        return KVQ_ERR_INTERNAL; /* freed by kvq_rotation_free via kvq_rot_dct_destroy */
    r->dct_s0 = (float)(1.0 / (2.0 * sqrt((double)n)));
    r->dct_s = (float)(1.0 / sqrt(2.0 * (double)n));
    r->dct_t0 = (float)(1.0 / sqrt((double)n));
    return KVQ_OK;
}

void kvq_rot_dct_destroy(kvq_rotation *r)
{
    if (!r->dct_fwd && !r->dct_inv)
        return;
    pthread_mutex_lock(&planner_lock);
    if (r->dct_fwd)
        fftwf_destroy_plan((fftwf_plan)r->dct_fwd);
    if (r->dct_inv)
        fftwf_destroy_plan((fftwf_plan)r->dct_inv);
    pthread_mutex_unlock(&planner_lock);
    r->dct_fwd = r->dct_inv = NULL;
}

void kvq_rot_dct_apply(const kvq_rotation *r, const float *x, float *y)
{
    const int n = r->dim;
    for (int j = 0; j < n; j++)
        y[j] = x[j] * r->signs[j];
    fftwf_execute_r2r((fftwf_plan)r->dct_fwd, y, y);
    y[0] = y[0] * r->dct_s0;
    for (int k = 1; k < n; k++)
        y[k] = y[k] * r->dct_s;
}

void kvq_rot_dct_apply_t(const kvq_rotation *r, const float *y, float *x)
{
    const int n = r->dim;
    x[0] = y[0] * r->dct_t0;
    for (int k = 1; k < n; k++)
        x[k] = y[k] * r->dct_s;
    fftwf_execute_r2r((fftwf_plan)r->dct_inv, x, x);
    for (int j = 0; j < n; j++)
        x[j] = x[j] * r->signs[j];
}
