/* attn_chunk_avx2.c - the block step of the chunk kernels (attn_internal.h,
 * struct kvq_attn_chunk_kernels) with AVX2/FMA. Rows go in pairs so that
 * every load of K^T or V feeds two FMAs: scores 2 rows x 32 keys in 8
 * registers (q_i broadcast times the i-th row of K^T), the weighted values
 * 2 rows x 32 coordinates in 8 registers. A row's own arithmetic (its sums'
 * order) is the same paired or alone. Needs dim % 8 == 0. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "attn_exp_avx2.h"
#include "attn_internal.h"

#define INLINE static inline __attribute__((always_inline))
#define B KVQ_ATTN_BLOCK

/* Unscaled scores of rows q0, q1 (q1 may repeat q0) for keys [32 h, 32 h + 32). */
INLINE void score2(const float *q0, const float *q1, const float *kt, int d, int h, float *s0, float *s1)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    const float *k = kt + 32 * h;
    for (int i = 0; i < d; i++, k += B) {
        const __m256 k0 = _mm256_load_ps(k), k1 = _mm256_load_ps(k + 8), k2 = _mm256_load_ps(k + 16),
                     k3 = _mm256_load_ps(k + 24);
        const __m256 x = _mm256_set1_ps(q0[i]), y = _mm256_set1_ps(q1[i]);
        a0 = _mm256_fmadd_ps(x, k0, a0);
        a1 = _mm256_fmadd_ps(x, k1, a1);
        a2 = _mm256_fmadd_ps(x, k2, a2);
        a3 = _mm256_fmadd_ps(x, k3, a3);
        b0 = _mm256_fmadd_ps(y, k0, b0);
        b1 = _mm256_fmadd_ps(y, k1, b1);
        b2 = _mm256_fmadd_ps(y, k2, b2);
        b3 = _mm256_fmadd_ps(y, k3, b3);
    }
    _mm256_store_ps(s0 + 32 * h, a0);
    _mm256_store_ps(s0 + 32 * h + 8, a1);
    _mm256_store_ps(s0 + 32 * h + 16, a2);
    _mm256_store_ps(s0 + 32 * h + 24, a3);
    _mm256_store_ps(s1 + 32 * h, b0);
    _mm256_store_ps(s1 + 32 * h + 8, b1);
    _mm256_store_ps(s1 + 32 * h + 16, b2);
    _mm256_store_ps(s1 + 32 * h + 24, b3);
}

/* Row r's scores in s ([B]) become its weights e^(scale s - m) (0 outside
 * [lo, hi), every lane of the block written); updates m, returns alpha and
 * the weights' sum. */
static double softmax_row(const struct kvq_attn_chunk_rows *R, int r, float scale, float *s, float *sum)
{
    const uint32_t lo = R->lo[r], hi = R->hi[r];
    const __m256 sc = _mm256_set1_ps(scale), lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 flo = _mm256_set1_ps((float)lo), fhi = _mm256_set1_ps((float)hi);
    __m256 vmx = _mm256_set1_ps(-INFINITY);
    for (uint32_t g = lo / 8 * 8; g < hi; g += 8) {
        const __m256 j = _mm256_add_ps(lane, _mm256_set1_ps((float)g));
        const __m256 live = _mm256_and_ps(_mm256_cmp_ps(j, flo, _CMP_GE_OQ), _mm256_cmp_ps(j, fhi, _CMP_LT_OQ));
        vmx = _mm256_max_ps(vmx, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_mul_ps(_mm256_load_ps(s + g), sc), live));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(vmx), _mm256_extractf128_ps(vmx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    const float mx = _mm_cvtss_f32(h);
    double *m = R->m[r];
    const double mn = *m > mx ? *m : mx;
    const double alpha = *m == -INFINITY ? 0.0 : exp(*m - mn);
    *m = mn;
    const __m256 mf = _mm256_set1_ps((float)mn);
    __m256 vs = _mm256_setzero_ps();
    for (uint32_t g = 0; g < B; g += 8) {
        const __m256 j = _mm256_add_ps(lane, _mm256_set1_ps((float)g));
        const __m256 live = _mm256_and_ps(_mm256_cmp_ps(j, flo, _CMP_GE_OQ), _mm256_cmp_ps(j, fhi, _CMP_LT_OQ));
        __m256 e = _mm256_setzero_ps();
        if (g + 8 > lo && g < hi)
            e = _mm256_and_ps(live, kvq_exp_ps(_mm256_sub_ps(_mm256_mul_ps(_mm256_load_ps(s + g), sc), mf)));
        _mm256_store_ps(s + g, e);
        vs = _mm256_add_ps(vs, e);
    }
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(vs), _mm256_extractf128_ps(vs, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
    *sum = _mm_cvtss_f32(t);
    return alpha;
}

/* o0/o1 [d] = sum_j w_j v_j over keys [a, b) for the weights w0, w1. */
INLINE void value2(const float *w0, const float *w1, const float *v, int d, uint32_t a, uint32_t b, float *o0,
                   float *o1)
{
    int c0 = 0;
    for (; c0 + 32 <= d; c0 += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (uint32_t j = a; j < b; j++) {
            const float *vj = v + (size_t)j * d + c0;
            const __m256 v0 = _mm256_loadu_ps(vj), v1 = _mm256_loadu_ps(vj + 8), v2 = _mm256_loadu_ps(vj + 16),
                         v3 = _mm256_loadu_ps(vj + 24);
            const __m256 x = _mm256_set1_ps(w0[j]), y = _mm256_set1_ps(w1[j]);
            a0 = _mm256_fmadd_ps(x, v0, a0);
            a1 = _mm256_fmadd_ps(x, v1, a1);
            a2 = _mm256_fmadd_ps(x, v2, a2);
            a3 = _mm256_fmadd_ps(x, v3, a3);
            b0 = _mm256_fmadd_ps(y, v0, b0);
            b1 = _mm256_fmadd_ps(y, v1, b1);
            b2 = _mm256_fmadd_ps(y, v2, b2);
            b3 = _mm256_fmadd_ps(y, v3, b3);
        }
        _mm256_storeu_ps(o0 + c0, a0);
        _mm256_storeu_ps(o0 + c0 + 8, a1);
        _mm256_storeu_ps(o0 + c0 + 16, a2);
        _mm256_storeu_ps(o0 + c0 + 24, a3);
        _mm256_storeu_ps(o1 + c0, b0);
        _mm256_storeu_ps(o1 + c0 + 8, b1);
        _mm256_storeu_ps(o1 + c0 + 16, b2);
        _mm256_storeu_ps(o1 + c0 + 24, b3);
    }
    for (; c0 < d; c0 += 8) {
        __m256 a0 = _mm256_setzero_ps(), b0 = a0;
        for (uint32_t j = a; j < b; j++) {
            const __m256 v0 = _mm256_loadu_ps(v + (size_t)j * d + c0);
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(w0[j]), v0, a0);
            b0 = _mm256_fmadd_ps(_mm256_set1_ps(w1[j]), v0, b0);
        }
        _mm256_storeu_ps(o0 + c0, a0);
        _mm256_storeu_ps(o1 + c0, b0);
    }
}

INLINE void fold(double *acc, const float *o, double alpha, int d)
{
    const __m256d al = _mm256_set1_pd(alpha);
    for (int i = 0; i < d; i += 4)
        _mm256_storeu_pd(acc + i, _mm256_fmadd_pd(_mm256_loadu_pd(acc + i), al, _mm256_cvtps_pd(_mm_loadu_ps(o + i))));
}

static void chunk_block_avx2(const struct kvq_attn_chunk_rows *R, const float *kt, const float *v, int d,
                             float scale, float *tmp)
{
    float *o0 = tmp + KVQ_ATTN_CHUNK_ROWS * B, *o1 = o0 + d;
    for (int r = 0; r < R->n; r += 2) {
        /* an odd last row is paired with itself: the same sums, written twice */
        const int r1 = r + 1 < R->n ? r + 1 : r;
        float *s0 = tmp + (size_t)r * B, *s1 = tmp + (size_t)(r + 1) * B;
        const uint32_t lo = R->lo[r] < R->lo[r1] ? R->lo[r] : R->lo[r1];
        const uint32_t hi = R->hi[r] > R->hi[r1] ? R->hi[r] : R->hi[r1];
        for (int h = 0; h < 2; h++)
            if (lo < 32u * (h + 1) && hi > 32u * h)
                score2(R->q[r], R->q[r1], kt, d, h, s0, s1);
        float sum0, sum1;
        const double al0 = softmax_row(R, r, scale, s0, &sum0);
        const double al1 = r1 != r ? softmax_row(R, r1, scale, s1, &sum1) : 0.0;
        value2(s0, r1 != r ? s1 : s0, v, d, lo, hi, o0, o1);
        *R->l[r] = *R->l[r] * al0 + sum0;
        fold(R->acc[r], o0, al0, d);
        if (r1 != r) {
            *R->l[r1] = *R->l[r1] * al1 + sum1;
            fold(R->acc[r1], o1, al1, d);
        }
    }
}

const struct kvq_attn_chunk_kernels kvq_attn_chunk_kernels_avx2 = {chunk_block_avx2};
