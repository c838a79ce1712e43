/* rotation_ref.c - scalar reference kernels of the rotations.
 *
 * The HADAMARD functions here *are* the bit-exactness contract written out in
 * rotation_internal.h; the AVX2 and CUDA paths must reproduce them bit for
 * bit. The GAUSS and DCT references accumulate in double and are independent
 * of OpenBLAS / FFTW, so the tests can check those libraries' results against
 * them (close, not bit-identical).
 */
#include <math.h>
#include <string.h>

#include "rotation_internal.h"

void kvq_rot_fwht_ref(float *v, int n)
{
    for (int h = 1; h < n; h <<= 1)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
}

/* dst[i*p + c] = sum over l of M(i, l) * src[l*p + c], M(i, l) = mix[i*m + l]
 * (or mix[l*m + i] when transposed), accumulated with fmaf in l order. */
static void mix_ref(const float *mix, int m, int p, int transposed, const float *src, float *dst)
{
    for (int i = 0; i < m; i++)
        for (int c = 0; c < p; c++) {
            float acc = 0.0f;
            for (int l = 0; l < m; l++) {
                float w = transposed ? mix[l * m + i] : mix[i * m + l];
                acc = fmaf(w, src[l * p + c], acc);
            }
            dst[i * p + c] = acc;
        }
}

void kvq_rot_hadamard_ref(const kvq_rotation *r, const float *x, float *y)
{
    const int d = r->dim, p = r->p, m = r->m;
    if (m == 1) {
        const float *src = x;
        for (int k = 0; k < r->rounds; k++, src = y) {
            const float *sg = r->signs + (size_t)k * d;
            for (int j = 0; j < d; j++)
                y[j] = src[j] * sg[j];
            kvq_rot_fwht_ref(y, d);
            for (int j = 0; j < d; j++)
                y[j] = y[j] * r->scale;
        }
        return;
    }
    float tmp[KVQ_ROT_MAX_DIM];
    const float *src = x;
    float *cur = y;
    for (int k = 0; k < r->rounds; k++) {
        const float *sg = r->signs + (size_t)k * d;
        for (int j = 0; j < d; j++)
            cur[j] = src[j] * sg[j];
        for (int i = 0; i < m; i++)
            kvq_rot_fwht_ref(cur + i * p, p);
        float *dst = cur == y ? tmp : y;
        mix_ref(r->mix, m, p, 0, cur, dst);
        src = cur = dst;
    }
    if (cur != y)
        memcpy(y, cur, (size_t)d * sizeof *y);
}

void kvq_rot_hadamard_t_ref(const kvq_rotation *r, const float *y, float *x)
{
    const int d = r->dim, p = r->p, m = r->m;
    if (m == 1) {
        if (x != y)
            memcpy(x, y, (size_t)d * sizeof *x);
        for (int k = r->rounds - 1; k >= 0; k--) {
            const float *sg = r->signs + (size_t)k * d;
            kvq_rot_fwht_ref(x, d);
            for (int j = 0; j < d; j++)
                x[j] = (x[j] * r->scale) * sg[j];
        }
        return;
    }
    float tmp[KVQ_ROT_MAX_DIM];
    const float *src = y;
    for (int k = r->rounds - 1; k >= 0; k--) {
        const float *sg = r->signs + (size_t)k * d;
        float *dst = src == tmp ? x : tmp; /* the first round never writes the caller's y */
        mix_ref(r->mix, m, p, 1, src, dst);
        for (int i = 0; i < m; i++)
            kvq_rot_fwht_ref(dst + i * p, p);
        for (int j = 0; j < d; j++)
            dst[j] = dst[j] * sg[j];
        src = dst;
    }
    if (src != x)
        memcpy(x, src, (size_t)d * sizeof *x);
}

void kvq_rot_gauss_ref(const kvq_rotation *r, const float *x, float *y)
{
    const int d = r->dim;
    float in[KVQ_ROT_MAX_DIM];
    memcpy(in, x, (size_t)d * sizeof *in);
    for (int i = 0; i < d; i++) {
        const float *g = r->gauss + (size_t)i * d;
        double acc = 0.0;
        for (int j = 0; j < d; j++)
            acc += (double)g[j] * (double)in[j];
        y[i] = (float)acc;
    }
}

void kvq_rot_gauss_t_ref(const kvq_rotation *r, const float *y, float *x)
{
    const int d = r->dim;
    float in[KVQ_ROT_MAX_DIM];
    memcpy(in, y, (size_t)d * sizeof *in);
    for (int j = 0; j < d; j++) {
        double acc = 0.0;
        for (int i = 0; i < d; i++)
            acc += (double)r->gauss[(size_t)i * d + j] * (double)in[i];
        x[j] = (float)acc;
    }
}

/* Orthonormal DCT-II basis value C[k][j] = f_k cos(pi (2j+1) k / (2n)); the
 * angle is reduced exactly in integers first so that large n stay accurate. */
static double dct_basis(int n, int k, int j)
{
    const double pi = 3.14159265358979323846;
    long q = ((long)(2 * j + 1) * k) % (4L * n);
    double f = k == 0 ? sqrt(1.0 / n) : sqrt(2.0 / n);
    return f * cos(pi * (double)q / (2.0 * n));
}

void kvq_rot_dct_ref(const kvq_rotation *r, const float *x, float *y)
{
    const int d = r->dim;
    float in[KVQ_ROT_MAX_DIM];
    for (int j = 0; j < d; j++)
        in[j] = x[j] * r->signs[j];
    for (int k = 0; k < d; k++) {
        double acc = 0.0;
        for (int j = 0; j < d; j++)
            acc += dct_basis(d, k, j) * (double)in[j];
        y[k] = (float)acc;
    }
}

void kvq_rot_dct_t_ref(const kvq_rotation *r, const float *y, float *x)
{
    const int d = r->dim;
    float in[KVQ_ROT_MAX_DIM];
    memcpy(in, y, (size_t)d * sizeof *in);
    for (int j = 0; j < d; j++) {
        double acc = 0.0;
        for (int k = 0; k < d; k++)
            acc += dct_basis(d, k, j) * (double)in[k];
        x[j] = (float)acc * r->signs[j];
    }
}
