/* matvec_avx2.c - the few-row matrix product with AVX2 + FMA (+ F16C).
 *
 * Tiles of up to 2 weight rows x 4 input rows share every load. Each output
 * element has two 8-lane accumulators (k mod 16 < 8 and >= 8), summed in k
 * order, then reduced in a fixed lane order, then the k tail in order; tile
 * shape never changes that sequence, hence batch invariance.
 *
 * The weights may be f32, bf16 or f16: each 8-lane load widens them to f32
 * (bf16: a 16-bit shift; f16: F16C), exactly, so a bf16 matrix gives the
 * same products as the same matrix widened to f32 at load, without the
 * f32 copy in memory.
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kvq_half.h"
#include "matvec_internal.h"

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 weights from element i of w, widened to f32. */
static inline __attribute__((always_inline)) __m256 load8(const void *w, size_t i, int dt)
{
    if (dt == KVQ_MV_BF16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    if (dt == KVQ_MV_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
    return _mm256_loadu_ps((const float *)w + i);
}

static inline __attribute__((always_inline)) float load1(const void *w, size_t i, int dt)
{
    if (dt == KVQ_MV_BF16) {
        uint16_t h;
        memcpy(&h, (const uint16_t *)w + i, 2);
        return kvq_bits_f32((uint32_t)h << 16);
    }
    if (dt == KVQ_MV_F16) {
        uint16_t h;
        memcpy(&h, (const uint16_t *)w + i, 2);
        return kvq_f16_to_f32(h);
    }
    float f;
    memcpy(&f, (const float *)w + i, 4);
    return f;
}

/* res[i][j] = w row n0 + i . x row j for i < nr (<= 2), j < mr (<= 4). */
static inline __attribute__((always_inline)) void tile(const void *w, int dt, size_t n0, int K, const float *x,
                                                       int ldx, int nr, int mr, float res[2][4])
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
            size_t r = (n0 + (size_t)i) * (size_t)K + (size_t)k;
            __m256 w0 = load8(w, r, dt), w1 = load8(w, r + 8, dt);
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
                s += load1(w, (n0 + (size_t)i) * (size_t)K + (size_t)t, dt) * x[(size_t)j * ldx + t];
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

static inline __attribute__((always_inline)) void kernel(const float *x, int ldx, const void *w, int dt, float *y,
                                                         int ldy, int M, int N, int K, int accumulate)
{
    float res[2][4];
    int n = 0;
    for (; n + 2 <= N; n += 2) {
        int m = 0;
        for (; m + 4 <= M; m += 4) {
            tile(w, dt, (size_t)n, K, x + (size_t)m * ldx, ldx, 2, 4, res);
            put(y, ldy, n, m, 2, 4, res, accumulate);
        }
        for (; m < M; m++) {
            tile(w, dt, (size_t)n, K, x + (size_t)m * ldx, ldx, 2, 1, res);
            put(y, ldy, n, m, 2, 1, res, accumulate);
        }
    }
    for (; n < N; n++) {
        int m = 0;
        for (; m + 4 <= M; m += 4) {
            tile(w, dt, (size_t)n, K, x + (size_t)m * ldx, ldx, 1, 4, res);
            put(y, ldy, n, m, 1, 4, res, accumulate);
        }
        for (; m < M; m++) {
            tile(w, dt, (size_t)n, K, x + (size_t)m * ldx, ldx, 1, 1, res);
            put(y, ldy, n, m, 1, 1, res, accumulate);
        }
    }
}

void kvq_matvec_avx2(const float *x, int ldx, const float *w, float *y, int ldy, int M, int N, int K, int accumulate)
{
    kernel(x, ldx, w, KVQ_MV_F32, y, ldy, M, N, K, accumulate);
}

void kvq_matvec_avx2_w(const float *x, int ldx, const void *w, int dtype, float *y, int ldy, int M, int N, int K,
                       int accumulate)
{
    if (dtype == KVQ_MV_BF16)
        kernel(x, ldx, w, KVQ_MV_BF16, y, ldy, M, N, K, accumulate);
    else if (dtype == KVQ_MV_F16)
        kernel(x, ldx, w, KVQ_MV_F16, y, ldy, M, N, K, accumulate);
    else
        kernel(x, ldx, w, KVQ_MV_F32, y, ldy, M, N, K, accumulate);
}
