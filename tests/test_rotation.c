/* test_rotation.c - rotations: orthogonality, inverse, the documented float
 * contract, determinism, bad input. (SIMD == scalar bit for bit, and the
 * FFTW/OpenBLAS paths against their references: test_backend_ops.)
 *
 * The references used here are independent of the library's kernels: dense
 * matrices built in double from the mathematical definitions (Sylvester
 * Hadamard entries (-1)^popcount(i&j), the Hartley cas() kernel, the DCT-II
 * cosine), and a fresh transcription of the bit-exactness contract of
 * rotation_internal.h for the power-of-two Hadamard.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvq_rotation.h"
#include "kvq_rng.h"
#include "rotation_internal.h"
#include "test.h"

static const int POW2_DIMS[] = {8, 16, 32, 64, 128, 256};
static const int ODD_DIMS[] = {24, 40, 80, 96, 112, 160, 192, 576};
#define NPOW2 ((int)(sizeof POW2_DIMS / sizeof POW2_DIMS[0]))
#define NODD ((int)(sizeof ODD_DIMS / sizeof ODD_DIMS[0]))

static void fill_gauss(float *x, int d, kvq_rng *rng)
{
    for (int j = 0; j < d; j++)
        x[j] = (float)kvq_rng_gauss(rng);
}

static double dot_d(const float *a, const float *b, int d)
{
    double s = 0;
    for (int j = 0; j < d; j++)
        s += (double)a[j] * (double)b[j];
    return s;
}

/* Columns of R (col j = R e_j) into cols[j*d .. j*d+d-1]. */
static float *columns(const kvq_rotation *r, int d)
{
    float *cols = calloc((size_t)d * d, sizeof *cols);
    for (int j = 0; j < d; j++) {
        cols[(size_t)j * d + j] = 1.0f;
        kvq_rotation_apply(r, cols + (size_t)j * d, cols + (size_t)j * d);
    }
    return cols;
}

/* max |R^T R - I| from the columns. */
static double ortho_error(const kvq_rotation *r, int d)
{
    float *cols = columns(r, d);
    double worst = 0;
    for (int i = 0; i < d; i++)
        for (int j = i; j < d; j++) {
            double g = dot_d(cols + (size_t)i * d, cols + (size_t)j * d, d) - (i == j);
            if (fabs(g) > worst)
                worst = fabs(g);
        }
    free(cols);
    return worst;
}

static void check_ortho_kind(enum kvq_rot_kind kind, int d)
{
    kvq_rotation *r = NULL;
    CHECK_OK(kvq_rotation_create(d, kind, 1234, &r));
    if (!r)
        return;
    CHECK(kvq_rotation_is_orthogonal(r));
    CHECK(kvq_rotation_dim(r) == d);
    CHECK(kvq_rotation_kind(r) == kind);
    double e = ortho_error(r, d);
    CHECKF(e < 1e-6, "%s d=%d: max |R^T R - I| = %.3g", kvq_rot_kind_name(kind), d, e);
    kvq_rotation_free(r);
}

static void test_orthogonality(void)
{
    for (int i = 0; i < NPOW2; i++)
        check_ortho_kind(KVQ_ROT_HADAMARD, POW2_DIMS[i]);
    for (int i = 0; i < NODD; i++) {
        check_ortho_kind(KVQ_ROT_HADAMARD, ODD_DIMS[i]);
        check_ortho_kind(KVQ_ROT_DCT, ODD_DIMS[i]);
    }
    static const int dct_only[] = {2, 3, 7, 100, 128};
    for (int i = 0; i < 5; i++)
        check_ortho_kind(KVQ_ROT_DCT, dct_only[i]);
    check_ortho_kind(KVQ_ROT_IDENTITY, 96);
}

/* apply_t(apply(x)) = x, ||R x|| = ||x||, and <R x, z> = <x, R^T z> (so
 * apply_t really is the transpose, also for the non-orthogonal GAUSS). */
static void check_inverse_kind(enum kvq_rot_kind kind, int d, uint64_t seed)
{
    kvq_rotation *r = NULL;
    CHECK_OK(kvq_rotation_create(d, kind, seed, &r));
    if (!r)
        return;
    float *x = malloc(sizeof(float) * (size_t)d), *y = malloc(sizeof(float) * (size_t)d);
    float *z = malloc(sizeof(float) * (size_t)d), *w = malloc(sizeof(float) * (size_t)d);
    kvq_rng rng;
    kvq_rng_init(&rng, seed + 99);
    for (int t = 0; t < 8; t++) {
        fill_gauss(x, d, &rng);
        fill_gauss(z, d, &rng);
        double nx = sqrt(dot_d(x, x, d)), nz = sqrt(dot_d(z, z, d));
        kvq_rotation_apply(r, x, y);
        kvq_rotation_apply_t(r, z, w);
        double lhs = dot_d(y, z, d), rhs = dot_d(x, w, d);
        /* GAUSS entries are N(0,1): both sides scale like sqrt(d) |x||z|. */
        double scale = kvq_rotation_is_orthogonal(r) ? nx * nz : sqrt((double)d) * nx * nz;
        CHECKF(fabs(lhs - rhs) <= 1e-5 * scale, "%s d=%d adjoint %.9g vs %.9g", kvq_rot_kind_name(kind),
               d, lhs, rhs);
        if (!kvq_rotation_is_orthogonal(r))
            continue;
        CHECKF(fabs(sqrt(dot_d(y, y, d)) - nx) <= 1e-6 * nx, "%s d=%d norm %.9g vs %.9g",
               kvq_rot_kind_name(kind), d, sqrt(dot_d(y, y, d)), nx);
        kvq_rotation_apply_t(r, y, w);
        double err = 0;
        for (int j = 0; j < d; j++)
            err = fmax(err, fabs((double)w[j] - x[j]));
        CHECKF(err <= 1e-6 * nx, "%s d=%d inverse error %.3g (|x| %.3g)", kvq_rot_kind_name(kind), d,
               err, nx);
    }
    free(x), free(y), free(z), free(w);
    kvq_rotation_free(r);
}

static void test_inverse_and_norm(void)
{
    for (int d = 8; d <= KVQ_ROT_MAX_DIM; d *= 2)
        check_inverse_kind(KVQ_ROT_HADAMARD, d, 7);
    static const int odd_big[] = {24, 80, 96, 112, 160, 192, 576, 1000, 4088};
    for (int i = 0; i < 9; i++) {
        check_inverse_kind(KVQ_ROT_HADAMARD, odd_big[i], 8);
        check_inverse_kind(KVQ_ROT_DCT, odd_big[i], 9);
    }
    check_inverse_kind(KVQ_ROT_DCT, 3, 9);
    check_inverse_kind(KVQ_ROT_IDENTITY, 80, 1);
    check_inverse_kind(KVQ_ROT_GAUSS, 64, 2);
    check_inverse_kind(KVQ_ROT_GAUSS, 96, 3);
}

/* The power-of-two contract of rotation_internal.h, transcribed afresh:
 * recursive-halving FWHT would do different float ops, so this follows the
 * text literally (stages h = 1, 2, 4, ... ; a + b, a - b). */
static void contract_pow2(int d, uint64_t seed, const float *x, float *y, int transpose)
{
    float sign[KVQ_ROT_MAX_DIM];
    kvq_rng rng;
    kvq_rng_init(&rng, seed);
    for (int j = 0; j < d; j++)
        sign[j] = (kvq_rng_next(&rng) >> 63) ? -1.0f : +1.0f;
    float s = (float)(1.0 / sqrt((double)d));
    for (int j = 0; j < d; j++)
        y[j] = transpose ? x[j] : x[j] * sign[j];
    for (int h = 1; h <= d / 2; h *= 2)
        for (int j = 0; j < d; j++)
            if ((j & h) == 0) {
                float a = y[j], b = y[j + h];
                y[j] = a + b;
                y[j + h] = a - b;
            }
    for (int j = 0; j < d; j++)
        y[j] = transpose ? (y[j] * s) * sign[j] : y[j] * s;
}

static void test_pow2_contract_bits(void)
{
    kvq_rng rng;
    kvq_rng_init(&rng, 5);
    float x[KVQ_ROT_MAX_DIM], want[KVQ_ROT_MAX_DIM], got[KVQ_ROT_MAX_DIM];
    for (int d = 8; d <= KVQ_ROT_MAX_DIM; d *= 2) {
        kvq_rotation *r = NULL;
        CHECK_OK(kvq_rotation_create(d, KVQ_ROT_HADAMARD, 0xabcdefull + (uint64_t)d, &r));
        if (!r)
            continue;
        for (int t = 0; t < 4; t++) {
            fill_gauss(x, d, &rng);
            for (int tr = 0; tr < 2; tr++) {
                contract_pow2(d, 0xabcdefull + (uint64_t)d, x, want, tr);
                (tr ? kvq_rotation_apply_t_ref : kvq_rotation_apply_ref)(r, x, got);
                CHECKF(memcmp(want, got, sizeof(float) * (size_t)d) == 0, "ref d=%d t=%d", d, tr);
                (tr ? kvq_rotation_apply_t : kvq_rotation_apply)(r, x, got);
                CHECKF(memcmp(want, got, sizeof(float) * (size_t)d) == 0, "fast d=%d t=%d", d, tr);
            }
        }
        kvq_rotation_free(r);
    }
}

/* Dense R in double from the definitions: per round, signs, the Sylvester
 * Hadamard (-1)^popcount(c&c') on each row of the m x p view, then the
 * Hartley matrix cas(2 pi i l / m) along columns, all scaled by 1/sqrt(m p). */
static void dense_kron(const kvq_rotation *r, double *R)
{
    const int d = r->dim, p = r->p, m = r->m;
    double *A = malloc(sizeof(double) * (size_t)d * d), *B = malloc(sizeof(double) * (size_t)d * d);
    for (int i = 0; i < d * d; i++)
        R[i] = (i / d == i % d);
    for (int k = 0; k < r->rounds; k++) {
        /* B = K D_k with K[(i,c),(l,c')] = cas(i,l) H(c,c') / sqrt(mp) */
        for (int row = 0; row < d; row++)
            for (int col = 0; col < d; col++) {
                int i = row / p, c = row % p, l = col / p, c2 = col % p;
                double a = 6.283185307179586 * (double)((i * l) % m) / m;
                double h = (__builtin_popcount((unsigned)(c & c2)) & 1) ? -1.0 : 1.0;
                B[(size_t)row * d + col] = (cos(a) + sin(a)) * h / sqrt((double)m * p) *
                                           r->signs[(size_t)k * d + col];
            }
        for (int i = 0; i < d; i++)
            for (int j = 0; j < d; j++) {
                double s = 0;
                for (int t = 0; t < d; t++)
                    s += B[(size_t)i * d + t] * R[(size_t)t * d + j];
                A[(size_t)i * d + j] = s;
            }
        memcpy(R, A, sizeof(double) * (size_t)d * d);
    }
    free(A), free(B);
}

static void test_kron_matches_definition(void)
{
    static const int dims[] = {24, 80, 96, 112};
    kvq_rng rng;
    kvq_rng_init(&rng, 11);
    for (int di = 0; di < 4; di++) {
        for (int rounds = 1; rounds <= 2; rounds++) {
            int d = dims[di];
            kvq_rotation *r = NULL;
            CHECK_OK(kvq_rotation_create_rounds(d, KVQ_ROT_HADAMARD, 77, rounds, &r));
            if (!r)
                continue;
            CHECK(r->m * r->p == d && r->m % 2 == 1 && r->m > 1);
            double *R = malloc(sizeof(double) * (size_t)d * d);
            dense_kron(r, R);
            float x[KVQ_ROT_MAX_DIM], y[KVQ_ROT_MAX_DIM], xt[KVQ_ROT_MAX_DIM];
            fill_gauss(x, d, &rng);
            double nx = sqrt(dot_d(x, x, d));
            kvq_rotation_apply(r, x, y);
            kvq_rotation_apply_t(r, x, xt);
            double err = 0, errt = 0;
            for (int i = 0; i < d; i++) {
                double s = 0, st = 0;
                for (int j = 0; j < d; j++) {
                    s += R[(size_t)i * d + j] * x[j];
                    st += R[(size_t)j * d + i] * x[j];
                }
                err = fmax(err, fabs(s - y[i]));
                errt = fmax(errt, fabs(st - xt[i]));
            }
            CHECKF(err < 1e-6 * nx && errt < 1e-6 * nx, "d=%d rounds=%d err %.3g / %.3g", d, rounds,
                   err, errt);
            free(R);
            kvq_rotation_free(r);
        }
    }
}

/* Several Hadamard rounds (the QJL projection uses 3) must still invert
 * exactly (to rounding), at every dim, on vectors of varied magnitude with
 * exact zeros. (SIMD vs scalar bit for bit: test_backend_ops, rot/rot_t.) */
static void test_rounds_invert(void)
{
    kvq_rng rng;
    kvq_rng_init(&rng, 21);
    float x[KVQ_ROT_MAX_DIM], a[KVQ_ROT_MAX_DIM], b[KVQ_ROT_MAX_DIM];
    int ndims = 0, dims[64];
    for (int d = 8; d <= KVQ_ROT_MAX_DIM; d *= 2)
        dims[ndims++] = d;
    for (int i = 0; i < NODD; i++)
        dims[ndims++] = ODD_DIMS[i];
    dims[ndims++] = 4088; /* m = 511 */
    dims[ndims++] = 1000;
    for (int di = 0; di < 2 * ndims; di++) {
        /* default (1 round), then 3 rounds: the QJL projection's count */
        int d = dims[di % ndims], rounds = di < ndims ? 0 : 3;
        kvq_rotation *r = NULL;
        CHECK_OK(kvq_rotation_create_rounds(d, KVQ_ROT_HADAMARD, (uint64_t)d * 31, rounds, &r));
        if (!r)
            continue;
        double mag = ldexp(1.0, (int)(kvq_rng_next(&rng) % 40) - 20);
        for (int j = 0; j < d; j++) {
            uint64_t u = kvq_rng_next(&rng);
            x[j] = (u % 7 == 0) ? ((u & 8) ? -0.0f : 0.0f) : (float)(kvq_rng_gauss(&rng) * mag);
        }
        kvq_rotation_apply(r, x, a);
        kvq_rotation_apply_t(r, a, b);
        double e = 0, n = 0;
        for (int j = 0; j < d; j++) {
            e += ((double)b[j] - x[j]) * ((double)b[j] - x[j]);
            n += (double)x[j] * x[j];
        }
        CHECKF(e <= 1e-11 * n, "d=%d rounds=%d: |R^T R x - x|^2 = %.3g of %.3g", d, r->rounds, e, n);
        kvq_rotation_free(r);
    }
}

static void test_spike_flattening(void)
{
    float e[KVQ_ROT_MAX_DIM], y[KVQ_ROT_MAX_DIM];
    for (int i = 0; i < NPOW2; i++) {
        int d = POW2_DIMS[i];
        kvq_rotation *r = NULL;
        CHECK_OK(kvq_rotation_create(d, KVQ_ROT_HADAMARD, 3, &r));
        if (!r)
            continue;
        float want = (float)(1.0 / sqrt((double)d));
        int bad = 0;
        for (int j = 0; j < d; j++) {
            memset(e, 0, sizeof(float) * (size_t)d);
            e[j] = 1.0f;
            kvq_rotation_apply(r, e, y);
            for (int k = 0; k < d; k++)
                bad += fabsf(y[k]) != want;
        }
        CHECKF(bad == 0, "d=%d: %d coordinates of rotated spikes are not +-1/sqrt(d)", d, bad);
        kvq_rotation_free(r);
    }
    /* Kronecker, one round (the default): R's entries are +-cas(.)/sqrt(d),
     * so a spike lands on every coordinate with 0 < |y_i| sqrt(d) <= sqrt(2)
     * (cas = sqrt(2) sin(. + pi/4) never vanishes for odd m). Two rounds: the
     * spike must be spread like a random unit vector: participation ratio
     * 1 / sum y_i^4 (~d/3 for a random unit vector, d flat, k for a vector on
     * k coordinates) above d/10, and no coordinate above 6/sqrt(d) (a
     * probability of ~2e-9 per coordinate of a random unit vector). */
    for (int i = 0; i < NODD; i++)
        for (int rounds = 1; rounds <= 2; rounds++) {
            int d = ODD_DIMS[i];
            kvq_rotation *r = NULL;
            CHECK_OK(kvq_rotation_create_rounds(d, KVQ_ROT_HADAMARD, 3, rounds, &r));
            if (!r)
                continue;
            double worst = 0, least = INFINITY, min_pr = INFINITY;
            for (int j = 0; j < d; j++) {
                memset(e, 0, sizeof(float) * (size_t)d);
                e[j] = 1.0f;
                kvq_rotation_apply(r, e, y);
                double s4 = 0;
                for (int k = 0; k < d; k++) {
                    worst = fmax(worst, fabs(y[k]) * sqrt((double)d));
                    least = fmin(least, fabs(y[k]) * sqrt((double)d));
                    s4 += pow(y[k], 4);
                }
                min_pr = fmin(min_pr, 1.0 / s4);
            }
            if (rounds == 1) {
                CHECKF(worst <= sqrt(2.0) * (1 + 1e-6), "d=%d: max |R e_j| sqrt(d) = %.7f", d, worst);
                CHECKF(least > 0, "d=%d: a spike leaves a coordinate at 0", d);
            } else {
                CHECKF(worst < 6.0, "d=%d 2 rounds: max |R e_j| sqrt(d) = %.3f", d, worst);
                CHECKF(min_pr > d / 10.0, "d=%d 2 rounds: a spike spreads over only %.1f coordinates", d,
                       min_pr);
            }
            kvq_rotation_free(r);
        }
    kvq_rotation *r = NULL;
    CHECK_OK(kvq_rotation_create(96, KVQ_ROT_HADAMARD, 3, &r));
    CHECK(r && r->rounds == 1); /* the documented default */
    kvq_rotation_free(r);
}

static void test_determinism(void)
{
    static const enum kvq_rot_kind kinds[] = {KVQ_ROT_HADAMARD, KVQ_ROT_DCT, KVQ_ROT_GAUSS};
    static const int dims[] = {128, 96};
    float x[128], a[128], b[128], c[128];
    kvq_rng rng;
    kvq_rng_init(&rng, 4);
    for (int k = 0; k < 3; k++)
        for (int di = 0; di < 2; di++) {
            int d = dims[di];
            kvq_rotation *r1 = NULL, *r2 = NULL, *r3 = NULL;
            CHECK_OK(kvq_rotation_create(d, kinds[k], 42, &r1));
            CHECK_OK(kvq_rotation_create(d, kinds[k], 42, &r2));
            CHECK_OK(kvq_rotation_create(d, kinds[k], 43, &r3));
            if (r1 && r2 && r3) {
                fill_gauss(x, d, &rng);
                kvq_rotation_apply(r1, x, a);
                kvq_rotation_apply(r2, x, b);
                kvq_rotation_apply(r3, x, c);
                CHECKF(memcmp(a, b, sizeof(float) * (size_t)d) == 0, "%s d=%d same seed",
                       kvq_rot_kind_name(kinds[k]), d);
                CHECKF(memcmp(a, c, sizeof(float) * (size_t)d) != 0, "%s d=%d other seed",
                       kvq_rot_kind_name(kinds[k]), d);
            }
            kvq_rotation_free(r1), kvq_rotation_free(r2), kvq_rotation_free(r3);
        }
}

/* In place gives the same bits as out of place, for every kind and path. */
static void test_in_place(void)
{
    static const int dims[] = {8, 128, 96, 576};
    float x[576], out[576], io[576];
    kvq_rng rng;
    kvq_rng_init(&rng, 8);
    void (*const fns[4])(const kvq_rotation *, const float *, float *) = {
        kvq_rotation_apply, kvq_rotation_apply_t, kvq_rotation_apply_ref, kvq_rotation_apply_t_ref};
    for (int k = 0; k <= KVQ_ROT_KIND_COUNT; k++) /* KIND_COUNT here: 2-round Kronecker */
        for (int di = 0; di < 4; di++) {
            int d = dims[di], two = k == KVQ_ROT_KIND_COUNT;
            if (two && (d & (d - 1)) == 0)
                continue;
            kvq_rotation *r = NULL;
            CHECK_OK(kvq_rotation_create_rounds(d, two ? KVQ_ROT_HADAMARD : (enum kvq_rot_kind)k, 5,
                                                two ? 2 : 0, &r));
            if (!r)
                continue;
            fill_gauss(x, d, &rng);
            for (int f = 0; f < 4; f++) {
                fns[f](r, x, out);
                memcpy(io, x, sizeof(float) * (size_t)d);
                fns[f](r, io, io);
                CHECKF(memcmp(out, io, sizeof(float) * (size_t)d) == 0, "%s d=%d rounds=%d fn %d",
                       kvq_rot_kind_name(r->kind), d, r->rounds, f);
            }
            kvq_rotation_free(r);
        }
}

/* The Gaussian entries look like N(0,1). (DCT through FFTW and GAUSS through
 * OpenBLAS against their O(d^2) references: test_backend_ops, backend lib.) */
static void test_gauss_entries(void)
{
    kvq_rotation *g = NULL;
    CHECK_OK(kvq_rotation_create(256, KVQ_ROT_GAUSS, 1, &g));
    if (!g)
        return;
    CHECK(!kvq_rotation_is_orthogonal(g));
    float *cols = columns(g, 256);
    double s1 = 0, s2 = 0, s4 = 0, n = 256.0 * 256.0;
    for (int i = 0; i < 256 * 256; i++) {
        double v = cols[i];
        s1 += v, s2 += v * v, s4 += v * v * v * v;
    }
    free(cols);
    /* mean 0 (se 1/256), variance 1 (se sqrt(2)/256), kurtosis 3 (se ~ sqrt(96/n)) */
    CHECK_NEAR(s1 / n, 0.0, 5.0 / 256);
    CHECK_NEAR(s2 / n, 1.0, 5.0 * sqrt(2.0) / 256);
    CHECK_NEAR((s4 / n) / ((s2 / n) * (s2 / n)), 3.0, 5.0 * sqrt(96.0 / n));
    kvq_rotation_free(g);
}

static void test_bad_input(void)
{
    kvq_rotation *r = (kvq_rotation *)&r; /* must be reset to NULL on failure */
    CHECK_STATUS(kvq_rotation_create(128, KVQ_ROT_HADAMARD, 1, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_rotation_create(128, (enum kvq_rot_kind)99, 1, &r), KVQ_ERR_INVALID_ARG);
    CHECK(r == NULL);
    CHECK_STATUS(kvq_rotation_create(128, (enum kvq_rot_kind)-1, 1, &r), KVQ_ERR_INVALID_ARG);
    static const int bad_any[] = {-8, 0, 1, KVQ_ROT_MAX_DIM + 1, KVQ_ROT_MAX_DIM * 2};
    for (int i = 0; i < 5; i++)
        for (int k = 0; k < KVQ_ROT_KIND_COUNT; k++) {
            r = (kvq_rotation *)&r;
            CHECK_STATUS(kvq_rotation_create(bad_any[i], (enum kvq_rot_kind)k, 1, &r), KVQ_ERR_UNSUPPORTED);
            CHECK(r == NULL);
        }
    static const int bad_hadamard[] = {2, 4, 12, 100, 129, 4095};
    for (int i = 0; i < 6; i++)
        CHECK_STATUS(kvq_rotation_create(bad_hadamard[i], KVQ_ROT_HADAMARD, 1, &r), KVQ_ERR_UNSUPPORTED);
    CHECK_OK(kvq_rotation_create(100, KVQ_ROT_DCT, 1, &r));
    kvq_rotation_free(r);
    /* explicit rounds: HADAMARD only, 1..KVQ_ROT_MAX_ROUNDS */
    CHECK_STATUS(kvq_rotation_create_rounds(128, KVQ_ROT_HADAMARD, 1, KVQ_ROT_MAX_ROUNDS + 1, &r),
                 KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_rotation_create_rounds(96, KVQ_ROT_HADAMARD, 1, -1, &r), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_rotation_create_rounds(96, KVQ_ROT_DCT, 1, 1, &r), KVQ_ERR_INVALID_ARG);
    kvq_rotation_free(NULL);
    CHECK(kvq_rotation_dim(NULL) == 0);
    CHECK(!kvq_rotation_is_orthogonal(NULL));
}

static void test_names(void)
{
    for (int k = 0; k < KVQ_ROT_KIND_COUNT; k++) {
        enum kvq_rot_kind back = KVQ_ROT_KIND_COUNT;
        const char *name = kvq_rot_kind_name((enum kvq_rot_kind)k);
        CHECK(name != NULL);
        CHECK_OK(kvq_rot_kind_from_name(name, &back));
        CHECK(back == (enum kvq_rot_kind)k);
    }
    enum kvq_rot_kind out;
    CHECK(strcmp(kvq_rot_kind_name(KVQ_ROT_HADAMARD), "hadamard") == 0);
    CHECK(kvq_rot_kind_name(KVQ_ROT_KIND_COUNT) == NULL);
    CHECK(kvq_rot_kind_name((enum kvq_rot_kind)-3) == NULL);
    CHECK_STATUS(kvq_rot_kind_from_name("walsh", &out), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_rot_kind_from_name("", &out), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_rot_kind_from_name(NULL, &out), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_rot_kind_from_name("dct", NULL), KVQ_ERR_INVALID_ARG);
}

/* Several threads create (FFTW planner, under the lock) and apply at once;
 * each must get the same bits as a single-threaded run. */
struct thread_job {
    enum kvq_rot_kind kind;
    int d;
    float out[96];
    int ok;
};

static void *thread_main(void *arg)
{
    struct thread_job *job = arg;
    float x[96];
    kvq_rng rng;
    kvq_rng_init(&rng, 1);
    fill_gauss(x, job->d, &rng);
    job->ok = 1;
    for (int it = 0; it < 50; it++) {
        kvq_rotation *r = NULL;
        if (kvq_rotation_create(job->d, job->kind, 17, &r) != KVQ_OK) {
            job->ok = 0;
            return NULL;
        }
        float y[96];
        kvq_rotation_apply(r, x, y);
        if (it == 0)
            memcpy(job->out, y, sizeof y);
        else if (memcmp(job->out, y, sizeof(float) * (size_t)job->d) != 0)
            job->ok = 0;
        kvq_rotation_free(r);
    }
    return NULL;
}

static void test_threads(void)
{
    struct thread_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].kind = (i % 2) ? KVQ_ROT_DCT : KVQ_ROT_HADAMARD;
        jobs[i].d = 96;
        CHECK(pthread_create(&th[i], NULL, thread_main, &jobs[i]) == 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++)
        CHECK(jobs[i].ok);
    CHECK(memcmp(jobs[0].out, jobs[2].out, sizeof jobs[0].out) == 0);
    CHECK(memcmp(jobs[1].out, jobs[3].out, sizeof jobs[1].out) == 0);
}

int main(void)
{
    RUN(test_names);
    RUN(test_bad_input);
    RUN(test_pow2_contract_bits);
    RUN(test_orthogonality);
    RUN(test_inverse_and_norm);
    RUN(test_kron_matches_definition);
    RUN(test_rounds_invert);
    RUN(test_spike_flattening);
    RUN(test_determinism);
    RUN(test_in_place);
    RUN(test_gauss_entries);
    RUN(test_threads);
    return TEST_END("test_rotation");
}
