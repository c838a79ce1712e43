/* matvec_avx2.c - the few-row matrix product with AVX2 + FMA.
 *
 * Tiles of up to 2 weight rows x 4 input rows share every load. Each output
 * element has two 8-lane accumulators (k mod 16 < 8 and >= 8), summed in k
 * order, then reduced in a fixed lane order, then the k tail in order; tile
 * shape never changes that sequence, hence batch invariance.
 */
#include <immintrin.h>
#include <stddef.h>

#include "matvec_internal.h"

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* res[i][j] = w row i . x row j for i < nr (<= 2), j < mr (<= 4). */
static inline __attribute__((always_inline)) void tile(const float *w, int K, const float *x, int ldx, int nr, int mr,
                                                       float res[2][4])
{
    __m256 a[2][4], b[2][4];
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < mr; j++)
            a[i][j] = b[i][j] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        __m256 x0[4], x1[4];
        for (int j = 0; j < mr; j++) {
            x0[j] = _mm256_loadu_ps(x + (size_t)j * ldx + k);
            x1[j] = _mm256_loadu_ps(x + (size_t)j * ldx + k + 8);
        }
        for (int i = 0; i < nr; i++) {
            __m256 w0 = _mm256_loadu_ps(w + (size_t)i * K + k), w1 = _mm256_loadu_ps(w + (size_t)i * K + k + 8);
            for (int j = 0; j < mr; j++) {
                a[i][j] = _mm256_fmadd_ps(w0, x0[j], a[i][j]);
                b[i][j] = _mm256_fmadd_ps(w1, x1[j], b[i][j]);
            }
        }
    }
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < mr; j++) {
            float s = hsum(_mm256_add_ps(a[i][j], b[i][j]));
            for (int t = k; t < K; t++)
                s += w[(size_t)i * K + t] * x[(size_t)j * ldx + t];
            res[i][j] = s;
        }
}

static inline void put(float *y, int ldy, int n, int m0, int nr, int mr, float res[2][4], int accumulate)
{
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < mr; j++) {
            float *o = y + (size_t)(m0 + j) * ldy + n + i;
            *o = accumulate ? *o + res[i][j] : res[i][j];
        }
}

void kvq_matvec_avx2(const float *x, int ldx, const float *w, float *y, int ldy, int M, int N, int K, int accumulate)
{
    float res[2][4];
    int n = 0;
    for (; n + 2 <= N; n += 2) {
        const float *wn = w + (size_t)n * K;
        int m = 0;
        for (; m + 4 <= M; m += 4) {
            tile(wn, K, x + (size_t)m * ldx, ldx, 2, 4, res);
            put(y, ldy, n, m, 2, 4, res, accumulate);
        }
        for (; m < M; m++) {
            tile(wn, K, x + (size_t)m * ldx, ldx, 2, 1, res);
            put(y, ldy, n, m, 2, 1, res, accumulate);
        }
    }
    for (; n < N; n++) {
        const float *wn = w + (size_t)n * K;
        int m = 0;
        for (; m + 4 <= M; m += 4) {
            tile(wn, K, x + (size_t)m * ldx, ldx, 1, 4, res);
            put(y, ldy, n, m, 1, 4, res, accumulate);
        }
        for (; m < M; m++) {
            tile(wn, K, x + (size_t)m * ldx, ldx, 1, 1, res);
            put(y, ldy, n, m, 1, 1, res, accumulate);
        }
    }
}
