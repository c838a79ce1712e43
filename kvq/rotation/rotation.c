/* rotation.c - creating rotations, dispatching apply to the fastest path,
 * and the kind names. The arithmetic lives in rotation_ref.c (scalar
 * contract), rotation_avx2.c (SIMD) and rotation_dct.c (FFTW). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "kvq_cpu.h"
#include "kvq_rng.h"
#include "rotation_internal.h"

static const char *const kind_names[KVQ_ROT_KIND_COUNT] = {
    [KVQ_ROT_HADAMARD] = "hadamard",
    [KVQ_ROT_DCT] = "dct",
    [KVQ_ROT_IDENTITY] = "identity",
    [KVQ_ROT_GAUSS] = "gauss",
};

const char *kvq_rot_kind_name(enum kvq_rot_kind kind)
{
    if ((int)kind < 0 || kind >= KVQ_ROT_KIND_COUNT)
        return NULL;
    return kind_names[kind];
}

kvq_status kvq_rot_kind_from_name(const char *name, enum kvq_rot_kind *out)
{
    if (!name || !out)
        return KVQ_ERR_INVALID_ARG;
    for (int k = 0; k < KVQ_ROT_KIND_COUNT; k++)
        if (strcmp(name, kind_names[k]) == 0) {
            *out = (enum kvq_rot_kind)k;
            return KVQ_OK;
        }
    return KVQ_ERR_INVALID_ARG;
}

/* Signs are drawn as the top bit of consecutive xoshiro outputs: the rule the
 * CUDA port and any other implementation can reproduce exactly. */
static void draw_signs(float *signs, size_t n, uint64_t seed)
{
    kvq_rng rng;
    kvq_rng_init(&rng, seed);
    for (size_t j = 0; j < n; j++)
        signs[j] = (kvq_rng_next(&rng) >> 63) ? -1.0f : 1.0f;
}

/* Normalised discrete Hartley transform of odd length m, with the FWHT's
 * 1/sqrt(p) folded in. i*l is reduced mod m in integers so every entry's
 * angle is computed from an exact small fraction. */
static void fill_mix(float *mix, int m, int p)
{
    const double two_pi = 6.283185307179586476925;
    const double norm = 1.0 / sqrt((double)m * (double)p);
    for (int i = 0; i < m; i++)
        for (int l = 0; l < m; l++) {
            double a = two_pi * (double)((i * l) % m) / (double)m;
            mix[i * m + l] = (float)((cos(a) + sin(a)) * norm);
        }
}

kvq_status kvq_rotation_create_rounds(int dim, enum kvq_rot_kind kind, uint64_t seed, int rounds,
                                      kvq_rotation **out)
{
    if (!out)
        return KVQ_ERR_INVALID_ARG;
    *out = NULL;
    if ((int)kind < 0 || kind >= KVQ_ROT_KIND_COUNT)
        return KVQ_ERR_INVALID_ARG;
    if (dim < 2 || dim > KVQ_ROT_MAX_DIM)
        return KVQ_ERR_UNSUPPORTED;
    if (kind == KVQ_ROT_HADAMARD && dim % 8 != 0)
        return KVQ_ERR_UNSUPPORTED;
    int p = 1;
    while (dim % (2 * p) == 0)
        p *= 2;
    int m = dim / p;
    int kron = kind == KVQ_ROT_HADAMARD && m > 1;
    if (rounds < 0 || rounds > KVQ_ROT_MAX_ROUNDS || (rounds != 0 && kind != KVQ_ROT_HADAMARD))
        return KVQ_ERR_INVALID_ARG;

    kvq_rotation *r = calloc(1, sizeof *r);
    if (!r)
        return KVQ_ERR_NOMEM;
    r->dim = dim;
    r->kind = kind;
    r->seed = seed;
    r->p = p;
    r->m = m;
    /* One round by default: docs/rotation.md has the measurements. */
    r->rounds = rounds ? rounds : 1;
    kvq_status st = KVQ_OK;
    switch (kind) {
    case KVQ_ROT_HADAMARD:
        r->scale = (float)(1.0 / sqrt((double)dim));
        r->signs = malloc((size_t)r->rounds * dim * sizeof *r->signs);
        if (kron)
            r->mix = malloc((size_t)m * m * sizeof *r->mix);
        if (!r->signs || (kron && !r->mix)) {
            st = KVQ_ERR_NOMEM;
            break;
        }
        draw_signs(r->signs, (size_t)r->rounds * dim, seed);
        if (kron)
            fill_mix(r->mix, m, p);
        break;
    case KVQ_ROT_DCT:
        r->signs = malloc((size_t)dim * sizeof *r->signs);
        if (!r->signs) {
            st = KVQ_ERR_NOMEM;
            break;
        }
        draw_signs(r->signs, (size_t)dim, seed);
        st = kvq_rot_dct_plan(r);
        break;
    case KVQ_ROT_GAUSS: {
        r->gauss = malloc((size_t)dim * dim * sizeof *r->gauss);
        if (!r->gauss) {
            st = KVQ_ERR_NOMEM;
            break;
        }
        kvq_rng rng;
        kvq_rng_init(&rng, seed);
        for (size_t i = 0; i < (size_t)dim * dim; i++)
            r->gauss[i] = (float)kvq_rng_gauss(&rng);
        break;
    }
    case KVQ_ROT_IDENTITY:
    case KVQ_ROT_KIND_COUNT:
        break;
    }
    if (st != KVQ_OK) {
        kvq_rotation_free(r);
        return st;
    }
    *out = r;
    return KVQ_OK;
}

kvq_status kvq_rotation_create(int dim, enum kvq_rot_kind kind, uint64_t seed, kvq_rotation **out)
{
    return kvq_rotation_create_rounds(dim, kind, seed, 0, out);
}

void kvq_rotation_free(kvq_rotation *r)
{
    if (!r)
        return;
    kvq_rot_dct_destroy(r);
    free(r->signs);
    free(r->mix);
    free(r->gauss);
    free(r);
}

int kvq_rotation_dim(const kvq_rotation *r)
{
    return r ? r->dim : 0;
}

enum kvq_rot_kind kvq_rotation_kind(const kvq_rotation *r)
{
    return r ? r->kind : KVQ_ROT_KIND_COUNT;
}

int kvq_rotation_is_orthogonal(const kvq_rotation *r)
{
    return r && r->kind != KVQ_ROT_GAUSS;
}

/* Row-major G: apply is G x, apply_t is G^T y. sgemv must not alias its
 * input and output, so in-place calls go through a stack copy. */
void kvq_rot_gauss_blas(const kvq_rotation *r, const float *x, float *y)
{
    const int d = r->dim;
    float in[KVQ_ROT_MAX_DIM];
    if (x == y) {
        memcpy(in, x, (size_t)d * sizeof *in);
        x = in;
    }
    cblas_sgemv(CblasRowMajor, CblasNoTrans, d, d, 1.0f, r->gauss, d, x, 1, 0.0f, y, 1);
}

void kvq_rot_gauss_t_blas(const kvq_rotation *r, const float *y, float *x)
{
    const int d = r->dim;
    float in[KVQ_ROT_MAX_DIM];
    if (x == y) {
        memcpy(in, y, (size_t)d * sizeof *in);
        y = in;
    }
    cblas_sgemv(CblasRowMajor, CblasTrans, d, d, 1.0f, r->gauss, d, y, 1, 0.0f, x, 1);
}

void kvq_rotation_apply(const kvq_rotation *r, const float *x, float *y)
{
    switch (r->kind) {
    case KVQ_ROT_HADAMARD:
        if (kvq_cpu_has_avx2())
            kvq_rot_hadamard_avx2(r, x, y);
        else
            kvq_rot_hadamard_ref(r, x, y);
        return;
    case KVQ_ROT_DCT:
        kvq_rot_dct_apply(r, x, y);
        return;
    case KVQ_ROT_GAUSS:
        kvq_rot_gauss_blas(r, x, y);
        return;
    case KVQ_ROT_IDENTITY:
    case KVQ_ROT_KIND_COUNT:
        break;
    }
    if (x != y)
        memcpy(y, x, (size_t)r->dim * sizeof *y);
}

void kvq_rotation_apply_t(const kvq_rotation *r, const float *y, float *x)
{
    switch (r->kind) {
    case KVQ_ROT_HADAMARD:
        if (kvq_cpu_has_avx2())
            kvq_rot_hadamard_t_avx2(r, y, x);
        else
            kvq_rot_hadamard_t_ref(r, y, x);
        return;
    case KVQ_ROT_DCT:
        kvq_rot_dct_apply_t(r, y, x);
        return;
    case KVQ_ROT_GAUSS:
        kvq_rot_gauss_t_blas(r, y, x);
        return;
    case KVQ_ROT_IDENTITY:
    case KVQ_ROT_KIND_COUNT:
        break;
    }
    if (x != y)
        memcpy(x, y, (size_t)r->dim * sizeof *x);
}

/* HADAMARD and IDENTITY references are bit-identical to the fast paths. DCT
 * and GAUSS references are independent O(d^2) double-accumulated loops (no
 * FFTW, no BLAS): close to the fast paths (~1e-7 relative), not equal. */
void kvq_rotation_apply_ref(const kvq_rotation *r, const float *x, float *y)
{
    switch (r->kind) {
    case KVQ_ROT_HADAMARD:
        kvq_rot_hadamard_ref(r, x, y);
        return;
    case KVQ_ROT_DCT:
        kvq_rot_dct_ref(r, x, y);
        return;
    case KVQ_ROT_GAUSS:
        kvq_rot_gauss_ref(r, x, y);
        return;
    case KVQ_ROT_IDENTITY:
    case KVQ_ROT_KIND_COUNT:
        break;
    }
    if (x != y)
        memcpy(y, x, (size_t)r->dim * sizeof *y);
}

void kvq_rotation_apply_t_ref(const kvq_rotation *r, const float *y, float *x)
{
    switch (r->kind) {
    case KVQ_ROT_HADAMARD:
        kvq_rot_hadamard_t_ref(r, y, x);
        return;
    case KVQ_ROT_DCT:
        kvq_rot_dct_t_ref(r, y, x);
        return;
    case KVQ_ROT_GAUSS:
        kvq_rot_gauss_t_ref(r, y, x);
        return;
    case KVQ_ROT_IDENTITY:
    case KVQ_ROT_KIND_COUNT:
        break;
    }
    if (x != y)
        memcpy(x, y, (size_t)r->dim * sizeof *x);
}
