/* attn_chunk_avx512.c - the block step of the chunk kernels with AVX-512:
 * the AVX2 step's algorithm (attn_chunk_avx2.c) 16 lanes at a time, which
 * halves its FMAs: scores 4 rows x 64 keys and weighted values 4 rows x 64
 * coordinates in 16 zmm accumulators (2 rows for the rest of a block's rows),
 * so each load of the block's K^T and V feeds four rows: the two 32 KiB
 * blocks do not both fit L1, and with 2 rows per load the step was bound by
 * those loads. A row's sums do not depend on the rows beside it.
 * Needs kvq_attn_avx512_usable() and dim % 16 == 0. Compiled with the
 * library's default flags; the functions carry the target attribute, as in
 * attn_avx512.c. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "attn_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define B KVQ_ATTN_BLOCK

/* e^x for x <= 0: attn_exp_avx2.h's kvq_exp_ps (Cephes' expf), 16 lanes. */
INLINE __m512 exp512(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.33654f));
    __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

/* Unscaled scores of rows q0, q1 (q1 may repeat q0) for the block's 64 keys. */
INLINE void score2(const float *q0, const float *q1, const float *kt, int d, float *s0, float *s1)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    const float *k = kt;
    for (int i = 0; i < d; i++, k += B) {
        const __m512 k0 = _mm512_load_ps(k), k1 = _mm512_load_ps(k + 16), k2 = _mm512_load_ps(k + 32),
                     k3 = _mm512_load_ps(k + 48);
        const __m512 x = _mm512_set1_ps(q0[i]), y = _mm512_set1_ps(q1[i]);
        a0 = _mm512_fmadd_ps(x, k0, a0);
        a1 = _mm512_fmadd_ps(x, k1, a1);
        a2 = _mm512_fmadd_ps(x, k2, a2);
        a3 = _mm512_fmadd_ps(x, k3, a3);
        b0 = _mm512_fmadd_ps(y, k0, b0);
        b1 = _mm512_fmadd_ps(y, k1, b1);
        b2 = _mm512_fmadd_ps(y, k2, b2);
        b3 = _mm512_fmadd_ps(y, k3, b3);
    }
    _mm512_store_ps(s0, a0);
    _mm512_store_ps(s0 + 16, a1);
    _mm512_store_ps(s0 + 32, a2);
    _mm512_store_ps(s0 + 48, a3);
    _mm512_store_ps(s1, b0);
    _mm512_store_ps(s1 + 16, b1);
    _mm512_store_ps(s1 + 32, b2);
    _mm512_store_ps(s1 + 48, b3);
}

/* Row r's scores in s ([B]) become its weights e^(scale s - m), 0 outside
 * [lo, hi); updates m, returns alpha and the weights' sum. */
TGT static double softmax_row(const struct kvq_attn_chunk_rows *R, int r, float scale, float *s, float *sum)
{
    const uint32_t lo = R->lo[r], hi = R->hi[r];
    const uint64_t live = (hi >= 64 ? ~0ull : (1ull << hi) - 1) & ~((1ull << lo) - 1);
    const __m512 sc = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    __m512 vmx = ninf;
    for (int g = 0; g < 4; g++)
        vmx = _mm512_mask_max_ps(vmx, (__mmask16)(live >> (16 * g)), vmx, _mm512_mul_ps(_mm512_load_ps(s + 16 * g), sc));
    const float mx = _mm512_reduce_max_ps(vmx);
    double *m = R->m[r];
    const double mn = *m > mx ? *m : mx;
    const double alpha = *m == -INFINITY ? 0.0 : exp(*m - mn);
    *m = mn;
    const __m512 mf = _mm512_set1_ps((float)mn);
    __m512 vs = _mm512_setzero_ps();
    for (int g = 0; g < 4; g++) {
        const __mmask16 k = (__mmask16)(live >> (16 * g));
        __m512 e = _mm512_setzero_ps();
        if (k)
            e = _mm512_maskz_mov_ps(k, exp512(_mm512_sub_ps(_mm512_mul_ps(_mm512_load_ps(s + 16 * g), sc), mf)));
        _mm512_store_ps(s + 16 * g, e);
        vs = _mm512_add_ps(vs, e);
    }
    *sum = _mm512_reduce_add_ps(vs);
    return alpha;
}

/* Four rows per load, 16 named accumulators (no arrays: gcc keeps those in
 * memory): o_r[0..64) = sum over i in [i0, i1) of c_r[i] m[i * stride + 0..64)
 * for r = 0..3, each row's sums in i order. The scores are this over K^T
 * (c = q, stride KVQ_ATTN_BLOCK), the weighted values over V, 64
 * coordinates at a time (c = the weights, stride d): each row's sums are
 * score2's / value2's. */
#define FMA4(x, a0, a1, a2, a3)                                                                                        \
    do {                                                                                                               \
        a0 = _mm512_fmadd_ps(x, l0, a0);                                                                               \
        a1 = _mm512_fmadd_ps(x, l1, a1);                                                                               \
        a2 = _mm512_fmadd_ps(x, l2, a2);                                                                               \
        a3 = _mm512_fmadd_ps(x, l3, a3);                                                                               \
    } while (0)
#define STORE4(p, a0, a1, a2, a3)                                                                                      \
    do {                                                                                                               \
        _mm512_storeu_ps((p), a0);                                                                                     \
        _mm512_storeu_ps((p) + 16, a1);                                                                                \
        _mm512_storeu_ps((p) + 32, a2);                                                                                \
        _mm512_storeu_ps((p) + 48, a3);                                                                                \
    } while (0)

INLINE void rows4(const float *c0, const float *c1, const float *c2, const float *c3, uint32_t i0, uint32_t i1,
                  const float *m, size_t stride, float *o0, float *o1, float *o2, float *o3)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    __m512 d0 = a0, d1 = a0, d2 = a0, d3 = a0, e0 = a0, e1 = a0, e2 = a0, e3 = a0;
    for (uint32_t i = i0; i < i1; i++) {
        const float *mi = m + (size_t)i * stride;
        const __m512 l0 = _mm512_loadu_ps(mi), l1 = _mm512_loadu_ps(mi + 16), l2 = _mm512_loadu_ps(mi + 32),
                     l3 = _mm512_loadu_ps(mi + 48);
        const __m512 x = _mm512_set1_ps(c0[i]), y = _mm512_set1_ps(c1[i]), z = _mm512_set1_ps(c2[i]),
                     w = _mm512_set1_ps(c3[i]);
        FMA4(x, a0, a1, a2, a3);
        FMA4(y, b0, b1, b2, b3);
        FMA4(z, d0, d1, d2, d3);
        FMA4(w, e0, e1, e2, e3);
    }
    STORE4(o0, a0, a1, a2, a3);
    STORE4(o1, b0, b1, b2, b3);
    STORE4(o2, d0, d1, d2, d3);
    STORE4(o3, e0, e1, e2, e3);
}

/* o0/o1 [d] = sum_j w_j v_j over keys [a, b) for the weights w0, w1. */
INLINE void value2(const float *w0, const float *w1, const float *v, int d, uint32_t a, uint32_t b, float *o0,
                   float *o1)
{
    int c0 = 0;
    for (; c0 + 64 <= d; c0 += 64) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (uint32_t j = a; j < b; j++) {
            const float *vj = v + (size_t)j * d + c0;
            const __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + 16), v2 = _mm512_loadu_ps(vj + 32),
                         v3 = _mm512_loadu_ps(vj + 48);
            const __m512 x = _mm512_set1_ps(w0[j]), y = _mm512_set1_ps(w1[j]);
            a0 = _mm512_fmadd_ps(x, v0, a0);
            a1 = _mm512_fmadd_ps(x, v1, a1);
            a2 = _mm512_fmadd_ps(x, v2, a2);
            a3 = _mm512_fmadd_ps(x, v3, a3);
            b0 = _mm512_fmadd_ps(y, v0, b0);
            b1 = _mm512_fmadd_ps(y, v1, b1);
            b2 = _mm512_fmadd_ps(y, v2, b2);
            b3 = _mm512_fmadd_ps(y, v3, b3);
        }
        _mm512_storeu_ps(o0 + c0, a0);
        _mm512_storeu_ps(o0 + c0 + 16, a1);
        _mm512_storeu_ps(o0 + c0 + 32, a2);
        _mm512_storeu_ps(o0 + c0 + 48, a3);
        _mm512_storeu_ps(o1 + c0, b0);
        _mm512_storeu_ps(o1 + c0 + 16, b1);
        _mm512_storeu_ps(o1 + c0 + 32, b2);
        _mm512_storeu_ps(o1 + c0 + 48, b3);
    }
    for (; c0 < d; c0 += 16) {
        __m512 a0 = _mm512_setzero_ps(), b0 = a0;
        for (uint32_t j = a; j < b; j++) {
            const __m512 v0 = _mm512_loadu_ps(v + (size_t)j * d + c0);
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(w0[j]), v0, a0);
            b0 = _mm512_fmadd_ps(_mm512_set1_ps(w1[j]), v0, b0);
        }
        _mm512_storeu_ps(o0 + c0, a0);
        _mm512_storeu_ps(o1 + c0, b0);
    }
}

INLINE void fold(double *acc, const float *o, double alpha, int d)
{
    const __m512d al = _mm512_set1_pd(alpha);
    for (int i = 0; i < d; i += 8)
        _mm512_storeu_pd(acc + i, _mm512_fmadd_pd(_mm512_loadu_pd(acc + i), al, _mm512_cvtps_pd(_mm256_loadu_ps(o + i))));
}

TGT static void chunk_block_avx512(const struct kvq_attn_chunk_rows *R, const float *kt, const float *v, int d,
                                   float scale, float *tmp)
{
    float *o0 = tmp + KVQ_ATTN_CHUNK_ROWS * B, *o1 = o0 + d;
    int r = 0;
    for (; d % 64 == 0 && r + 4 <= R->n; r += 4) {
        float *o[4] = {o0, o1, o1 + d, o1 + 2 * d}, *sc[4];
        uint32_t lo = 64, hi = 0;
        for (int i = 0; i < 4; i++) {
            sc[i] = tmp + (size_t)(r + i) * B;
            lo = R->lo[r + i] < lo ? R->lo[r + i] : lo;
            hi = R->hi[r + i] > hi ? R->hi[r + i] : hi;
        }
        rows4(R->q[r], R->q[r + 1], R->q[r + 2], R->q[r + 3], 0, (uint32_t)d, kt, B, sc[0], sc[1], sc[2], sc[3]);
        float sum[4];
        double al[4];
        for (int i = 0; i < 4; i++)
            al[i] = softmax_row(R, r + i, scale, sc[i], &sum[i]);
        for (int c = 0; c < d; c += 64) /* the weights are 0 outside a row's own keys: exact zeros */
            rows4(sc[0], sc[1], sc[2], sc[3], lo, hi, v + c, (size_t)d, o[0] + c, o[1] + c, o[2] + c, o[3] + c);
        for (int i = 0; i < 4; i++) {
            *R->l[r + i] = *R->l[r + i] * al[i] + sum[i];
            fold(R->acc[r + i], o[i], al[i], d);
        }
    }
    for (; r < R->n; r += 2) {
        /* an odd last row is paired with itself: the same sums, written twice */
        const int r1 = r + 1 < R->n ? r + 1 : r;
        float *s0 = tmp + (size_t)r * B, *s1 = tmp + (size_t)(r + 1) * B;
        const uint32_t lo = R->lo[r] < R->lo[r1] ? R->lo[r] : R->lo[r1];
        const uint32_t hi = R->hi[r] > R->hi[r1] ? R->hi[r] : R->hi[r1];
        score2(R->q[r], R->q[r1], kt, d, s0, s1);
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

const struct kvq_attn_chunk_kernels kvq_attn_chunk_kernels_avx512 = {chunk_block_avx512};

#else /* never usable (kvq_attn_avx512_usable() is 0) */

const struct kvq_attn_chunk_kernels kvq_attn_chunk_kernels_avx512 = {NULL};

#endif
