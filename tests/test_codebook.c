/* test_codebook.c - Lloyd-Max codebooks: published values, the Lloyd
 * conditions against an integration written here (composite Simpson in long
 * double, not the library's adaptive Gauss-Legendre), closed forms (d = 3
 * uniform, d = 5 polynomial density, Gaussian 1-bit), the shipped tables
 * against fresh computations, bad arguments, threads and the CLI. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "codebook_internal.h"
#include "kvq_codebook.h"
#include "test.h"
#include "test_util.h"

int cmd_codebook(int argc, char **argv);

/* ---- independent reference integration ---------------------------------- */

struct dens {
    int gauss;
    long double alpha; /* beta: (d - 3)/2 */
    long double var;   /* gauss: 1/d */
};

static struct dens make_dens(int dim, enum kvq_dist dist)
{
    struct dens d = {dist == KVQ_DIST_GAUSS, 0.5L * (dim - 3), 1.0L / dim};
    return d;
}

static long double dens_at(const struct dens *d, long double t)
{
    if (d->gauss)
        return expl(-0.5L * t * t / d->var);
    if (t <= -1.0L || t >= 1.0L)
        return d->alpha == 0.0L ? 1.0L : 0.0L;
    return powl(1.0L - t * t, d->alpha);
}

/* Composite Simpson of t^k (t - c)^(2j) f(t) over [l, r] with panels of width
 * <= h: moments mom[0] = int f, mom[1] = int t f, mom[2] = int (t - c)^2 f. */
static void simpson_moments(const struct dens *d, long double l, long double r, long double c,
                            long double h, long double mom[3])
{
    long n = (long)ceill((r - l) / h);
    if (n < 2)
        n = 2;
    if (n % 2)
        n++;
    long double step = (r - l) / n;
    mom[0] = mom[1] = mom[2] = 0.0L;
    for (long k = 0; k <= n; k++) {
        long double t = k == n ? r : l + step * k;
        long double w = (k == 0 || k == n) ? 1.0L : (k % 2 ? 4.0L : 2.0L);
        long double f = w * dens_at(d, t);
        mom[0] += f;
        mom[1] += f * t;
        mom[2] += f * (t - c) * (t - c);
    }
    for (int i = 0; i < 3; i++)
        mom[i] *= step / 3.0L;
}

/* Checks both Lloyd conditions and the mse of cb by Simpson with panel h. */
static void check_lloyd(const kvq_codebook *cb, long double h, double tol)
{
    struct dens d = make_dens(cb->dim, cb->dist);
    long double lo = d.gauss ? -14.0L / sqrtl(cb->dim) : -1.0L, hi = -lo;
    long double worst = 0.0L, sq = 0.0L, total = 0.0L;
    int n = cb->levels;
    for (int i = 0; i + 1 < n; i++) {
        long double mid = 0.5L * ((long double)cb->centroids[i] + cb->centroids[i + 1]);
        CHECKF(fabsl(cb->boundaries[i] - mid) <= 1e-16L, "dim %d bits %d boundary %d not a midpoint",
               cb->dim, cb->bits, i);
        CHECKF(cb->centroids[i] < cb->centroids[i + 1], "dim %d bits %d not ascending at %d",
               cb->dim, cb->bits, i);
    }
    for (int i = 0; i < n; i++) {
        long double l = i ? cb->boundaries[i - 1] : lo, r = i + 1 < n ? cb->boundaries[i] : hi;
        long double mom[3];
        simpson_moments(&d, l, r, cb->centroids[i], h, mom);
        long double e = fabsl(mom[1] / mom[0] - cb->centroids[i]);
        if (e > worst)
            worst = e;
        sq += mom[2];
        total += mom[0];
    }
    CHECKF(worst <= tol, "dim %d bits %d %s: max |centroid - conditional mean| = %.3Lg",
           cb->dim, cb->bits, kvq_dist_name(cb->dist), worst);
    /* mse normalised by the Simpson total, not by the library's lgamma. */
    long double mse = sq / total * cb->dim;
    CHECKF(fabsl(mse - cb->mse) <= 1e-12L * mse, "dim %d bits %d %s: mse %.17g, Simpson %.17Lg",
           cb->dim, cb->bits, kvq_dist_name(cb->dist), cb->mse, mse);
}

/* ---- tests ---------------------------------------------------------------- */

/* |mse - ref| within half a unit in the 5th significant digit of ref. */
static void test_gauss_published_mse(void)
{
    const double ref[4] = {0.36338, 0.11748, 0.034548, 0.0095010};
    const double half_unit[4] = {0.5e-5, 0.5e-5, 0.5e-6, 0.5e-7};
    const int dims[] = {64, 128, 1000};
    for (int k = 0; k < 3; k++)
        for (int b = 1; b <= 4; b++) {
            kvq_codebook cb;
            CHECK_OK(kvq_codebook_compute(dims[k], b, KVQ_DIST_GAUSS, &cb));
            CHECKF(fabs(cb.mse - ref[b - 1]) <= half_unit[b - 1], "d %d b %d: mse %.10g vs %.5g",
                   dims[k], b, cb.mse, ref[b - 1]);
        }
}

/* 1 bit, Gaussian: c = +-sqrt(2/pi) sigma, mse = 1 - 2/pi exactly. */
static void test_gauss_one_bit_closed_form(void)
{
    const double pi = 3.14159265358979323846;
    kvq_codebook cb;
    CHECK_OK(kvq_codebook_compute(128, 1, KVQ_DIST_GAUSS, &cb));
    CHECK_NEAR(cb.centroids[1], sqrt(2.0 / pi) / sqrt(128.0), 1e-16);
    CHECK_NEAR(cb.centroids[0], -cb.centroids[1], 0.0);
    CHECK_NEAR(cb.mse, 1.0 - 2.0 / pi, 1e-15);
}

static void test_lloyd_conditions_d128(void)
{
    for (int b = 1; b <= KVQ_CODEBOOK_MAX_BITS; b++) {
        kvq_codebook cb;
        CHECK_OK(kvq_codebook_get(128, b, KVQ_DIST_BETA, &cb));
        check_lloyd(&cb, 2e-5L, 1e-12);
    }
}

static void test_lloyd_conditions_gauss(void)
{
    const int bits[] = {1, 2, 3, 4, 8};
    for (int k = 0; k < 5; k++) {
        kvq_codebook cb;
        CHECK_OK(kvq_codebook_compute(128, bits[k], KVQ_DIST_GAUSS, &cb));
        check_lloyd(&cb, 2e-5L, 1e-12);
    }
}

static void test_lloyd_conditions_other_dims(void)
{
    const int dims[] = {16, 80, 96, 1000};
    for (int k = 0; k < 4; k++)
        for (int b = 2; b <= 6; b += 2) {
            kvq_codebook cb;
            CHECK_OK(kvq_codebook_compute(dims[k], b, KVQ_DIST_BETA, &cb));
            check_lloyd(&cb, 2e-5L, 1e-12);
        }
}

/* FIELD.md: d = 128, 3 bits, centroids +-0.021604, +-0.066586, +-0.11814, +-0.188397. */
static void test_d128_b3_field_values(void)
{
    const double ref[4] = {0.021604, 0.066586, 0.11814, 0.188397};
    const double half_unit[4] = {0.5e-6, 0.5e-6, 0.5e-5, 0.5e-6};
    kvq_codebook cb;
    CHECK_OK(kvq_codebook_get(128, 3, KVQ_DIST_BETA, &cb));
    CHECK(cb.levels == 8);
    for (int i = 0; i < 4; i++) {
        CHECK_NEAR(cb.centroids[4 + i], ref[i], half_unit[i]);
        CHECK_NEAR(cb.centroids[3 - i], -ref[i], half_unit[i]);
    }
}

static void test_symmetric(void)
{
    const int dims[] = {3, 4, 7, 64, 128, 4096};
    for (int k = 0; k < 6; k++)
        for (int b = 1; b <= KVQ_CODEBOOK_MAX_BITS; b++)
            for (int g = 0; g < 2; g++) {
                kvq_codebook cb;
                CHECK_OK(kvq_codebook_get(dims[k], b, g ? KVQ_DIST_GAUSS : KVQ_DIST_BETA, &cb));
                CHECK(cb.levels == 1 << b && cb.dim == dims[k] && cb.bits == b);
                for (int i = 0; i < cb.levels; i++)
                    CHECK(cb.centroids[i] == -cb.centroids[cb.levels - 1 - i]);
                CHECK(cb.boundaries[cb.levels / 2 - 1] == 0.0);
            }
}

/* d = 3: the uniform density; the b-bit uniform quantizer on [-1, 1]. */
static void test_uniform_d3(void)
{
    for (int b = 1; b <= KVQ_CODEBOOK_MAX_BITS; b++) {
        kvq_codebook cb;
        CHECK_OK(kvq_codebook_compute(3, b, KVQ_DIST_BETA, &cb));
        int n = 1 << b;
        double w = 2.0 / n;
        for (int i = 0; i < n; i++)
            CHECK_NEAR(cb.centroids[i], -1.0 + w * (i + 0.5), 1e-15);
        for (int i = 0; i + 1 < n; i++)
            CHECK_NEAR(cb.boundaries[i], -1.0 + w * (i + 1), 1e-15);
        double mse = 3.0 * w * w / 12.0;
        CHECK_NEAR(cb.mse, mse, 1e-14 * mse);
    }
}

/* d = 5: f = (3/4)(1 - t^2), a polynomial. Conditional means from exact
 * antiderivatives, mse by 3-point Gauss-Legendre (exact for degree 5). */
static void test_polynomial_d5(void)
{
    for (int b = 1; b <= KVQ_CODEBOOK_MAX_BITS; b++) {
        kvq_codebook cb;
        CHECK_OK(kvq_codebook_compute(5, b, KVQ_DIST_BETA, &cb));
        long double worst = 0.0L, sq = 0.0L;
        const long double x3 = sqrtl(0.6L), w3[3] = {5.0L / 9, 8.0L / 9, 5.0L / 9};
        for (int i = 0; i < cb.levels; i++) {
            long double l = i ? cb.boundaries[i - 1] : -1.0L;
            long double r = i + 1 < cb.levels ? cb.boundaries[i] : 1.0L;
            long double mass = (r - r * r * r / 3) - (l - l * l * l / 3);
            long double num = (r * r / 2 - r * r * r * r / 4) - (l * l / 2 - l * l * l * l / 4);
            long double e = fabsl(num / mass - cb.centroids[i]);
            if (e > worst)
                worst = e;
            long double half = 0.5L * (r - l), mid = 0.5L * (r + l), c = cb.centroids[i];
            const long double xs[3] = {-x3, 0.0L, x3};
            for (int k = 0; k < 3; k++) {
                long double t = mid + half * xs[k];
                sq += half * w3[k] * (t - c) * (t - c) * 0.75L * (1 - t * t);
            }
        }
        /* The closed-form mass/num cancel in narrow cells: ~1e-16 / width. */
        CHECKF(worst <= 1e-12L, "b %d: max |c - m| = %.3Lg", b, worst);
        CHECK_NEAR(cb.mse, (double)(5.0L * sq), 1e-13 * cb.mse);
    }
}

/* The beta mse approaches the Gaussian one from below, monotonically. */
static void test_beta_tends_to_gauss(void)
{
    const int dims[] = {8, 32, 128, 512, 4096};
    for (int b = 1; b <= 4; b++) {
        kvq_codebook g, cb;
        CHECK_OK(kvq_codebook_compute(128, b, KVQ_DIST_GAUSS, &g));
        double prev = INFINITY;
        for (int k = 0; k < 5; k++) {
            CHECK_OK(kvq_codebook_compute(dims[k], b, KVQ_DIST_BETA, &cb));
            double gap = g.mse - cb.mse;
            CHECKF(gap > 0 && gap < prev, "b %d d %d: gauss - beta mse %.3g (previous %.3g)", b,
                   dims[k], gap, prev);
            prev = gap;
        }
        CHECKF(prev < 1e-3 * g.mse, "b %d: d = 4096 beta mse %.8g vs gauss %.8g", b, cb.mse, g.mse);
        /* In standard units the centroids agree to O(1/d) too. */
        kvq_codebook g4;
        CHECK_OK(kvq_codebook_compute(4096, b, KVQ_DIST_GAUSS, &g4));
        for (int i = 0; i < cb.levels; i++)
            CHECK_NEAR(cb.centroids[i] * 64.0, g4.centroids[i] * 64.0, 2e-3);
    }
}

static void test_invalid_args(void)
{
    kvq_codebook cb;
    CHECK_STATUS(kvq_codebook_compute(128, 3, KVQ_DIST_BETA, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_codebook_get(128, 3, KVQ_DIST_BETA, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_codebook_compute(128, 3, (enum kvq_dist)7, &cb), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_codebook_get(128, 3, (enum kvq_dist)-1, &cb), KVQ_ERR_INVALID_ARG);
    const int bad_dims[] = {-1, 0, 1, 2, KVQ_CODEBOOK_MAX_DIM + 1};
    for (int k = 0; k < 5; k++) {
        CHECK_STATUS(kvq_codebook_compute(bad_dims[k], 3, KVQ_DIST_BETA, &cb), KVQ_ERR_UNSUPPORTED);
        CHECK_STATUS(kvq_codebook_get(bad_dims[k], 3, KVQ_DIST_GAUSS, &cb), KVQ_ERR_UNSUPPORTED);
    }
    const int bad_bits[] = {-3, 0, KVQ_CODEBOOK_MAX_BITS + 1, 32};
    for (int k = 0; k < 4; k++) {
        CHECK_STATUS(kvq_codebook_compute(128, bad_bits[k], KVQ_DIST_BETA, &cb), KVQ_ERR_UNSUPPORTED);
        CHECK_STATUS(kvq_codebook_get(128, bad_bits[k], KVQ_DIST_BETA, &cb), KVQ_ERR_UNSUPPORTED);
        CHECK(!kvq_codebook_is_shipped(128, bad_bits[k], KVQ_DIST_BETA));
    }
    enum kvq_dist dist = KVQ_DIST_GAUSS;
    CHECK_STATUS(kvq_dist_from_name("normal", &dist), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_dist_from_name(NULL, &dist), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_dist_from_name("beta", NULL), KVQ_ERR_INVALID_ARG);
    CHECK(dist == KVQ_DIST_GAUSS);
    CHECK_OK(kvq_dist_from_name("beta", &dist));
    CHECK(dist == KVQ_DIST_BETA);
    CHECK(strcmp(kvq_dist_name(KVQ_DIST_GAUSS), "gauss") == 0);
    CHECK(kvq_dist_name((enum kvq_dist)9) == NULL);
    /* Extremes of the valid range work. */
    CHECK_OK(kvq_codebook_compute(KVQ_CODEBOOK_MAX_DIM, KVQ_CODEBOOK_MAX_BITS, KVQ_DIST_BETA, &cb));
    CHECK_OK(kvq_codebook_compute(KVQ_CODEBOOK_MIN_DIM, KVQ_CODEBOOK_MAX_BITS, KVQ_DIST_GAUSS, &cb));
}

/* Every shipped table equals a fresh computation; others are not shipped. */
static void test_shipped_tables(void)
{
    const int dims[] = {64, 80, 96, 112, 128, 160, 192, 256};
    for (int k = 0; k < 8; k++)
        for (int b = 1; b <= 4; b++) {
            kvq_codebook s, c;
            CHECK(kvq_codebook_is_shipped(dims[k], b, KVQ_DIST_BETA));
            CHECK(!kvq_codebook_is_shipped(dims[k], b, KVQ_DIST_GAUSS));
            CHECK_OK(kvq_codebook_get(dims[k], b, KVQ_DIST_BETA, &s));
            CHECK_OK(kvq_codebook_compute(dims[k], b, KVQ_DIST_BETA, &c));
            CHECK(s.iterations == 0 && c.iterations > 0);
            CHECK(s.levels == c.levels && s.dim == dims[k] && s.bits == b && s.dist == KVQ_DIST_BETA);
            for (int i = 0; i < c.levels; i++)
                CHECK_NEAR(s.centroids[i], c.centroids[i], 1e-10);
            for (int i = 0; i + 1 < c.levels; i++)
                CHECK_NEAR(s.boundaries[i], c.boundaries[i], 1e-10);
            CHECK_NEAR(s.mse, c.mse, 1e-10 * c.mse);
        }
    CHECK(kvq_codebook_tables_count == 32);
    CHECK(!kvq_codebook_is_shipped(100, 3, KVQ_DIST_BETA));
    CHECK(!kvq_codebook_is_shipped(128, 5, KVQ_DIST_BETA));
    kvq_codebook g, c;
    CHECK_OK(kvq_codebook_get(100, 3, KVQ_DIST_BETA, &g));
    CHECK_OK(kvq_codebook_compute(100, 3, KVQ_DIST_BETA, &c));
    CHECK(memcmp(&g, &c, sizeof g) == 0);
}

/* The quadrature rule: 20-point Gauss-Legendre is exact to degree 39. */
static long double poly38(long double x, const void *ctx)
{
    (void)ctx;
    return 39.0L * powl(x, 38) + 1.0L;
}

static void test_quadrature_rule(void)
{
    int ok = 1;
    long double v = kvq_cb_integrate(poly38, NULL, 0.0L, 1.0L, 1e-16L, &ok);
    CHECK(ok);
    CHECKF(fabsl(v - 2.0L) <= 4e-18L, "int_0^1 39 x^38 + 1 = %.21Lg", v);
    CHECK(kvq_cb_integrate(poly38, NULL, 1.0L, 1.0L, 1e-16L, &ok) == 0.0L);
}

struct thread_job {
    int dim, bits;
    kvq_codebook out;
    kvq_status st;
};

static void *thread_main(void *p)
{
    struct thread_job *j = p;
    j->st = kvq_codebook_get(j->dim, j->bits, KVQ_DIST_BETA, &j->out);
    return NULL;
}

static void test_threads(void)
{
    struct thread_job jobs[4] = {{100, 5, {0}, 0}, {128, 3, {0}, 0}, {100, 5, {0}, 0}, {48, 6, {0}, 0}};
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        CHECK(pthread_create(&th[i], NULL, thread_main, &jobs[i]) == 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        kvq_codebook serial;
        CHECK_OK(jobs[i].st);
        CHECK_OK(kvq_codebook_get(jobs[i].dim, jobs[i].bits, KVQ_DIST_BETA, &serial));
        CHECK(memcmp(&serial, &jobs[i].out, sizeof serial) == 0);
    }
}

/* Runs `kvq codebook ARGS`, capturing stdout and stderr. */
static int run_cli(int argc, char **argv, char *out, char *err, size_t cap)
{
    return test_run_captured_buf(cmd_codebook, argc, argv, out, cap, err, cap);
}

static void test_cli_json(void)
{
    static char out[1 << 16], err[1 << 12];
    char *argv[] = {"codebook", "--dim", "96", "--bits", "4", "--dist", "beta", "--json"};
    CHECK(run_cli(8, argv, out, err, sizeof err) == 0);
    cJSON *j = cJSON_Parse(out);
    CHECK(j != NULL);
    if (!j)
        return;
    kvq_codebook cb;
    CHECK_OK(kvq_codebook_get(96, 4, KVQ_DIST_BETA, &cb));
    CHECK(cJSON_GetObjectItem(j, "dim")->valuedouble == 96);
    CHECK(cJSON_GetObjectItem(j, "bits")->valuedouble == 4);
    CHECK(strcmp(cJSON_GetObjectItem(j, "dist")->valuestring, "beta") == 0);
    CHECK(cJSON_GetObjectItem(j, "mse")->valuedouble == cb.mse);
    cJSON *c = cJSON_GetObjectItem(j, "centroids"), *b = cJSON_GetObjectItem(j, "boundaries");
    CHECK(cJSON_GetArraySize(c) == 16 && cJSON_GetArraySize(b) == 15);
    for (int i = 0; i < 16; i++)
        CHECK(cJSON_GetArrayItem(c, i)->valuedouble == cb.centroids[i]);
    for (int i = 0; i < 15; i++)
        CHECK(cJSON_GetArrayItem(b, i)->valuedouble == cb.boundaries[i]);
    cJSON_Delete(j);

    char *gauss[] = {"codebook", "--dim=100", "--bits=2", "--dist=gauss", "--json"};
    CHECK(run_cli(5, gauss, out, err, sizeof err) == 0);
    j = cJSON_Parse(out);
    CHECK(j && strcmp(cJSON_GetObjectItem(j, "dist")->valuestring, "gauss") == 0);
    CHECK(j && fabs(cJSON_GetObjectItem(j, "mse")->valuedouble - 0.11748) <= 0.5e-5);
    cJSON_Delete(j);

    char *text[] = {"codebook", "--dim", "128", "--bits", "3"};
    CHECK(run_cli(5, text, out, err, sizeof err) == 0);
    CHECK_OK(kvq_codebook_get(128, 3, KVQ_DIST_BETA, &cb));
    for (int i = 0; i < 8; i++) {
        char num[40];
        snprintf(num, sizeof num, "%.17g", cb.centroids[i]);
        CHECKF(strstr(out, num) != NULL, "centroid %s not printed", num);
    }
    CHECK(strstr(out, "mse") != NULL);
    char *help[] = {"codebook", "--help"};
    CHECK(run_cli(2, help, out, err, sizeof err) == 0);
    CHECK(strstr(out, "usage: kvq codebook") != NULL);
}

static void test_cli_bad_args(void)
{
    static char out[1 << 12], err[1 << 12];
    char *cases[][6] = {
        {"codebook", NULL},
        {"codebook", "--dim", "128", NULL},
        {"codebook", "--dim", "2", "--bits", "3"},
        {"codebook", "--dim", "12x", "--bits", "3"},
        {"codebook", "--dim", "128", "--bits", "9"},
        {"codebook", "--dim", "128", "--bits", "0"},
        {"codebook", "--dim", "128", "--bits", NULL},
        {"codebook", "--dim", "128", "--bits", "3", "--frobnicate"},
        {"codebook", "--dim", "128", "--bits", "3", "--dist"},
        {"codebook", "--emit-c", "--dim", "128", NULL},
    };
    char *dist_bad[] = {"codebook", "--dim", "128", "--bits", "3", "--dist", "cauchy"};
    for (size_t k = 0; k <= sizeof cases / sizeof cases[0]; k++) {
        char **argv = k < sizeof cases / sizeof cases[0] ? cases[k] : dist_bad;
        int argc = 0;
        while (argc < (k < sizeof cases / sizeof cases[0] ? 6 : 7) && argv[argc])
            argc++;
        int rc = run_cli(argc, argv, out, err, sizeof err);
        CHECKF(rc == 2, "case %zu: exit %d", k, rc);
        CHECKF(strncmp(err, "kvq codebook: error: ", 21) == 0, "case %zu: stderr '%s'", k, err);
        char *nl = strchr(err, '\n');
        CHECKF(nl && nl[1] == '\0', "case %zu: not one line: '%s'", k, err);
        CHECKF(out[0] == '\0', "case %zu: printed '%s'", k, out);
    }
}

int main(void)
{
    RUN(test_gauss_published_mse);
    RUN(test_gauss_one_bit_closed_form);
    RUN(test_lloyd_conditions_d128);
    RUN(test_lloyd_conditions_gauss);
    RUN(test_lloyd_conditions_other_dims);
    RUN(test_d128_b3_field_values);
    RUN(test_symmetric);
    RUN(test_uniform_d3);
    RUN(test_polynomial_d5);
    RUN(test_beta_tends_to_gauss);
    RUN(test_invalid_args);
    RUN(test_shipped_tables);
    RUN(test_quadrature_rule);
    RUN(test_threads);
    RUN(test_cli_json);
    RUN(test_cli_bad_args);
    return TEST_END("test_codebook");
}
