/* rotation_avx2.c - AVX2 path of KVQ_ROT_HADAMARD, bit-identical to
 * rotation_ref.c.
 *
 * Why it is bit-identical: every FWHT butterfly computes a + b and a - b on
 * the same two floats as the reference (IEEE addition is commutative, so
 * b + a == a + b; the difference is always formed as a - b, never -(b - a),
 * which would flip the sign of an exact zero), the stages run in the same
 * order h = 1, 2, 4, ..., and products / fmas are the same single-rounded
 * operations. Only the order *within* a stage differs, and butterflies of
 * one stage are independent.
 *
 * Layout: stages h = 1, 2, 4 are done inside one register (a permute brings
 * the partner lanes over, then add / sub are blended); stages h >= 8 pair
 * whole registers: h = 8, 16 still inside the first pass (32 floats in 4
 * registers), then two stages per pass over memory (radix 4) to halve the
 * loads and stores. The final scale (and, for apply_t, the signs) is fused
 * into the last pass.
 */
#include <immintrin.h>
#include <string.h>

#include "rotation_internal.h"

/* Stages h = 1, 2, 4 of the 8 lanes of v. t holds each lane's partner: in
 * the lanes that receive a - b (the upper member of each pair, selected by
 * the blend mask) t is the lower member a and v is b, so t - v is a - b. */
static inline __m256 fwht8(__m256 v)
{
    __m256 t = _mm256_permute_ps(v, 0xB1); /* lanes 1,0,3,2 */
    v = _mm256_blend_ps(_mm256_add_ps(v, t), _mm256_sub_ps(t, v), 0xAA);
    t = _mm256_permute_ps(v, 0x4E); /* lanes 2,3,0,1 */
    v = _mm256_blend_ps(_mm256_add_ps(v, t), _mm256_sub_ps(t, v), 0xCC);
    t = _mm256_permute2f128_ps(v, v, 0x01); /* swap 128-bit halves */
    v = _mm256_blend_ps(_mm256_add_ps(v, t), _mm256_sub_ps(t, v), 0xF0);
    return v;
}

/* What the last pass does to each output vector: (v * s) * post_j, either
 * factor optional - exactly the reference's "y_j * s" / "(v_j * s) * sign_j"
 * / "v_j * sign_j". */
struct finish {
    int scale;
    __m256 s;
    const float *post;
};

static inline __m256 finish_vec(const struct finish *f, __m256 v, int j)
{
    if (f->scale)
        v = _mm256_mul_ps(v, f->s);
    if (f->post)
        v = _mm256_mul_ps(v, _mm256_loadu_ps(f->post + j));
    return v;
}

/* Stages h0, 2 h0, ..., n/2 across registers, two per pass over memory
 * (radix 4), the last pass applying finish. */
static void fwht_stages(float *v, int n, int h0, const struct finish *f)
{
    int h = h0;
    while (h < n) {
        if (4 * h <= n) { /* stages h and 2h in one pass */
            const int last = 4 * h == n;
            for (int i = 0; i < n; i += 4 * h)
                for (int j = i; j < i + h; j += 8) {
                    __m256 a0 = _mm256_loadu_ps(v + j), a1 = _mm256_loadu_ps(v + j + h);
                    __m256 a2 = _mm256_loadu_ps(v + j + 2 * h), a3 = _mm256_loadu_ps(v + j + 3 * h);
                    __m256 b0 = _mm256_add_ps(a0, a1), b1 = _mm256_sub_ps(a0, a1);
                    __m256 b2 = _mm256_add_ps(a2, a3), b3 = _mm256_sub_ps(a2, a3);
                    __m256 c0 = _mm256_add_ps(b0, b2), c2 = _mm256_sub_ps(b0, b2);
                    __m256 c1 = _mm256_add_ps(b1, b3), c3 = _mm256_sub_ps(b1, b3);
                    if (last) {
                        c0 = finish_vec(f, c0, j);
                        c1 = finish_vec(f, c1, j + h);
                        c2 = finish_vec(f, c2, j + 2 * h);
                        c3 = finish_vec(f, c3, j + 3 * h);
                    }
                    _mm256_storeu_ps(v + j, c0);
                    _mm256_storeu_ps(v + j + h, c1);
                    _mm256_storeu_ps(v + j + 2 * h, c2);
                    _mm256_storeu_ps(v + j + 3 * h, c3);
                }
            h *= 4;
        } else { /* one stage left: h == n / 2 */
            for (int j = 0; j < h; j += 8) {
                __m256 a = _mm256_loadu_ps(v + j), b = _mm256_loadu_ps(v + j + h);
                _mm256_storeu_ps(v + j, finish_vec(f, _mm256_add_ps(a, b), j));
                _mm256_storeu_ps(v + j + h, finish_vec(f, _mm256_sub_ps(a, b), j + h));
            }
            h *= 2;
        }
    }
}

/* v = FWHT(src [* pre]) then finish; n a power of two >= 8. v may equal src. */
static void fwht_avx2(const float *src, const float *pre, float *v, int n, const struct finish *f)
{
    if (n >= 32) {
        /* First pass: 32 floats at a time, stages 1..16 without leaving registers. */
        const int last = n == 32;
        for (int j = 0; j < n; j += 32) {
            __m256 a[4];
            for (int k = 0; k < 4; k++) {
                a[k] = _mm256_loadu_ps(src + j + 8 * k);
                if (pre)
                    a[k] = _mm256_mul_ps(a[k], _mm256_loadu_ps(pre + j + 8 * k));
                a[k] = fwht8(a[k]);
            }
            __m256 b0 = _mm256_add_ps(a[0], a[1]), b1 = _mm256_sub_ps(a[0], a[1]);
            __m256 b2 = _mm256_add_ps(a[2], a[3]), b3 = _mm256_sub_ps(a[2], a[3]);
            __m256 c0 = _mm256_add_ps(b0, b2), c2 = _mm256_sub_ps(b0, b2);
            __m256 c1 = _mm256_add_ps(b1, b3), c3 = _mm256_sub_ps(b1, b3);
            if (last) {
                c0 = finish_vec(f, c0, j);
                c1 = finish_vec(f, c1, j + 8);
                c2 = finish_vec(f, c2, j + 16);
                c3 = finish_vec(f, c3, j + 24);
            }
            _mm256_storeu_ps(v + j, c0);
            _mm256_storeu_ps(v + j + 8, c1);
            _mm256_storeu_ps(v + j + 16, c2);
            _mm256_storeu_ps(v + j + 24, c3);
        }
        fwht_stages(v, n, 32, f);
        return;
    }
    for (int j = 0; j < n; j += 8) { /* n = 8 or 16 */
        __m256 x = _mm256_loadu_ps(src + j);
        if (pre)
            x = _mm256_mul_ps(x, _mm256_loadu_ps(pre + j));
        x = fwht8(x);
        _mm256_storeu_ps(v + j, n == 8 ? finish_vec(f, x, j) : x);
    }
    fwht_stages(v, n, 8, f);
}

/* dst[i*p + c] = sequential fma over l of M(i, l) * src[l*p + c], from 0. */
static void mix_avx2(const float *mix, int m, int p, int transposed, const float *src, float *dst)
{
    for (int i = 0; i < m; i++)
        for (int c = 0; c < p; c += 8) {
            __m256 acc = _mm256_setzero_ps();
            for (int l = 0; l < m; l++) {
                __m256 w = _mm256_set1_ps(transposed ? mix[l * m + i] : mix[i * m + l]);
                acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(src + l * p + c), acc);
            }
            _mm256_storeu_ps(dst + i * p + c, acc);
        }
}

void kvq_rot_hadamard_avx2(const kvq_rotation *r, const float *x, float *y)
{
    const int d = r->dim, p = r->p, m = r->m;
    if (m == 1) {
        struct finish f = {1, _mm256_set1_ps(r->scale), NULL};
        for (int k = 0; k < r->rounds; k++)
            fwht_avx2(k ? y : x, r->signs + (size_t)k * d, y, d, &f);
        return;
    }
    const struct finish none = {0, _mm256_setzero_ps(), NULL};
    float tmp[KVQ_ROT_MAX_DIM];
    const float *src = x;
    float *cur = y;
    for (int k = 0; k < r->rounds; k++) {
        const float *sg = r->signs + (size_t)k * d;
        for (int i = 0; i < m; i++)
            fwht_avx2(src + i * p, sg + i * p, cur + i * p, p, &none);
        float *dst = cur == y ? tmp : y;
        mix_avx2(r->mix, m, p, 0, cur, dst);
        src = cur = dst;
    }
    if (cur != y)
        memcpy(y, cur, (size_t)d * sizeof *y);
}

void kvq_rot_hadamard_t_avx2(const kvq_rotation *r, const float *y, float *x)
{
    const int d = r->dim, p = r->p, m = r->m;
    if (m == 1) {
        for (int k = r->rounds - 1; k >= 0; k--) {
            struct finish f = {1, _mm256_set1_ps(r->scale), r->signs + (size_t)k * d};
            fwht_avx2(k == r->rounds - 1 ? y : x, NULL, x, d, &f);
        }
        return;
    }
    float tmp[KVQ_ROT_MAX_DIM];
    const float *src = y;
    for (int k = r->rounds - 1; k >= 0; k--) {
        const float *sg = r->signs + (size_t)k * d;
        float *dst = src == tmp ? x : tmp;
        mix_avx2(r->mix, m, p, 1, src, dst);
        for (int i = 0; i < m; i++) {
            struct finish f = {0, _mm256_setzero_ps(), sg + i * p};
            fwht_avx2(dst + i * p, NULL, dst + i * p, p, &f);
        }
        src = dst;
    }
    if (src != x)
        memcpy(x, src, (size_t)d * sizeof *x);
}
