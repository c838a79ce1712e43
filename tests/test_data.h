/* test_data.h - test inputs and comparisons for tests that check kernels:
 * key/value/query rows with outlier channels, rows that stress the codecs'
 * exact semantics, a relative error, and (when kvq_cuda.h is included
 * first) a host-to-device copy.
 *
 * Header-only and static inline, like test_util.h. The row generators are
 * deterministic for a given rng state, so a test can name its inputs by
 * seed and kind.
 */
#ifndef KVQ_TEST_DATA_H
#define KVQ_TEST_DATA_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvq_rng.h"

/* n rows of d values ~ N(0,1) with channels 5 and d-3 scaled by outlier (the
 * outlier channels real keys have). @return malloc'd [n][d] (caller frees). */
static inline float *test_outlier_rows(size_t n, int d, uint64_t seed, double outlier)
{
    float *x = malloc(n * (size_t)d * sizeof *x);
    kvq_rng rng;
    kvq_rng_init(&rng, seed);
    for (size_t i = 0; i < n * (size_t)d; i++) {
        int j = (int)(i % (size_t)d);
        x[i] = (float)(((j == 5 || j == d - 3) ? outlier : 1.0) * kvq_rng_gauss(&rng));
    }
    return x;
}

/* n <= 32 values of one llama.cpp block, stressing the baselines' exact
 * semantics (kind % 7): 0, 6 Gaussian at scales 2e-9 .. 5e8; 1 scale 1 with
 * q8_0 products on exact .5 ties (roundf goes away from zero, the SIMD
 * default would go to even); 2 two maxima of opposite sign (the first wins in
 * q4_0); 3 +-0; 4 float subnormals; 5 a value whose q4_0 scale sits near the
 * f16 limit. */
static inline void test_fill_block(kvq_rng *rng, float *x, int n, int kind)
{
    double scale = exp(kvq_rng_uniform(rng) * 40.0 - 20.0);
    for (int j = 0; j < n; j++)
        x[j] = (float)(kvq_rng_gauss(rng) * scale);
    switch (kind % 7) {
    case 1:
        for (int j = 0; j < n; j++)
            x[j] = (float)((int)(kvq_rng_next(rng) % 253) - 126) + (kvq_rng_next(rng) & 1 ? 0.5f : 0.0f);
        x[kvq_rng_next(rng) % (uint64_t)n] = kvq_rng_next(rng) & 1 ? 127.0f : -127.0f;
        break;
    case 2: {
        for (int j = 0; j < n; j++)
            x[j] = (float)(kvq_rng_uniform(rng) * 9.0 - 4.5);
        const float m = kvq_rng_next(rng) & 1 ? 5.0f : -5.0f;
        x[n > 20 ? 3 : 0] = m;
        x[n > 20 ? 20 : n - 1] = -m;
        break;
    }
    case 3:
        for (int j = 0; j < n; j++)
            x[j] = kvq_rng_next(rng) & 1 ? -0.0f : 0.0f;
        break;
    case 4:
        for (int j = 0; j < n; j++)
            x[j] = (float)(kvq_rng_gauss(rng) * 1e-40);
        break;
    case 5:
        x[7 % n] = kvq_rng_next(rng) & 1 ? 65504.0f * 8.0f : -65504.0f * 8.0f;
        break;
    default:
        break;
    }
}

/* One row of d values by kind:
 *   0 Gaussian at a scale of 1e-6 .. 400      1 a one-hot spike
 *   2 three nonzero coordinates               3 a constant row (many equal
 *                                               coordinates after a rotation)
 *   4 .. 10 blocks of 32 of test_fill_block's kinds (kind - 4 + block index)
 *   11 +-0 everywhere                         12 a tiny row (1e-30: an f16
 *                                               norm underflows to 0)
 * Some kinds overflow a type's f16 fields on purpose (the status paths). */
enum { TEST_ROW_KINDS = 13 };
static inline void test_fill_row(kvq_rng *rng, float *x, int d, int kind)
{
    const double scale = exp(kvq_rng_uniform(rng) * 20.0 - 14.0);
    memset(x, 0, (size_t)d * sizeof *x);
    switch (kind) {
    case 0:
    case 12:
        for (int j = 0; j < d; j++)
            x[j] = (float)(kvq_rng_gauss(rng) * (kind ? 1e-30 : scale));
        break;
    case 1:
        x[kvq_rng_next(rng) % (uint64_t)d] = (float)scale;
        break;
    case 2:
        for (int k = 0; k < 3; k++) {
            const uint64_t at = kvq_rng_next(rng) % (uint64_t)d;
            x[at] = (float)(kvq_rng_gauss(rng) * scale);
        }
        break;
    case 3:
        for (int j = 0; j < d; j++)
            x[j] = (float)scale;
        break;
    case 11:
        for (int j = 0; j < d; j++)
            x[j] = kvq_rng_next(rng) & 1 ? -0.0f : 0.0f;
        break;
    default:
        for (int b = 0; b < d; b += 32)
            test_fill_block(rng, x + b, d - b < 32 ? d - b : 32, kind - 4 + b / 32);
        break;
    }
}

/* ||a - b|| / ||b|| over n values (||a - b|| when b = 0), in double; a NaN
 * anywhere gives Inf, so unwritten (NaN-filled) outputs fail any tolerance. */
static inline double test_rel_err(const float *a, const float *b, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - (double)b[i];
        num += e * e;
        den += (double)b[i] * b[i];
    }
    if (num != num || den != den)
        return INFINITY;
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

#ifdef KVQ_CUDA_H
/* A device copy of n host floats. @return the device pointer (kvq_cuda_free),
 * or NULL when it cannot be allocated or written. */
static inline float *test_to_dev(const float *h, size_t n)
{
    void *d = NULL;
    if (kvq_cuda_malloc(&d, n * sizeof(float)) != KVQ_OK)
        return NULL;
    if (kvq_cuda_memcpy_h2d(d, h, n * sizeof(float)) != KVQ_OK) {
        kvq_cuda_free(d);
        return NULL;
    }
    return d;
}
#endif

#endif /* KVQ_TEST_DATA_H */
