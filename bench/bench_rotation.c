/* bench_rotation.c - speed of every rotation kind, and the measurements
 * behind the choice of the non-power-of-two construction (docs/rotation.md).
 *
 *   bench_rotation            both parts
 *   bench_rotation --speed    ns per vector of apply / apply_t at d = 128, 96
 *   bench_rotation --quality  orthogonality, spike flatness, and the
 *                             distribution of rotated coordinates for uniform
 *                             and outlier-channel inputs, d in {80, ..., 576}
 * Prints tables; writes bench_rotation.json to $KVQ_BENCH_JSON_DIR (default:
 * the folder of this binary). Everything is seeded: numbers reproduce exactly
 * except the timings.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "kvq_cpu.h"
#include "kvq_rotation.h"
#include "kvq_rng.h"
#include "rotation_internal.h"
#include "bench_util.h"

/* Thread CPU time, not wall time: the development machine is shared, and
 * time spent descheduled would otherwise land in the medians. On a quiet
 * machine the two agree. */
static FILE *json;
static int json_first;

static void json_sep(void)
{
    fprintf(json, json_first ? "\n    " : ",\n    ");
    json_first = 0;
}

/* ------------------------------------------------------------------ speed */

typedef void (*apply_fn)(const kvq_rotation *, const float *, float *);

#define NVEC 64
#define REPEATS 15

/* Median over REPEATS of the time per call, each repeat running enough
 * calls (over NVEC different vectors, in place) to last >= 2 ms. */
static double time_apply(const kvq_rotation *r, apply_fn fn, int d)
{
    float *buf = malloc(sizeof(float) * (size_t)d * NVEC);
    kvq_rng rng;
    kvq_rng_init(&rng, 1);
    for (int i = 0; i < d * NVEC; i++)
        buf[i] = (float)kvq_rng_gauss(&rng) * 0.1f;
    long calls = NVEC;
    for (;;) {
        double t0 = bench_clock_s(CLOCK_THREAD_CPUTIME_ID);
        for (long c = 0; c < calls; c++)
            fn(r, buf + (c % NVEC) * d, buf + (c % NVEC) * d);
        if (bench_clock_s(CLOCK_THREAD_CPUTIME_ID) - t0 >= 2e-3 || calls > (1L << 26))
            break;
        calls *= 2;
    }
    double t[REPEATS];
    for (int k = 0; k < REPEATS; k++) {
        double t0 = bench_clock_s(CLOCK_THREAD_CPUTIME_ID);
        for (long c = 0; c < calls; c++)
            fn(r, buf + (c % NVEC) * d, buf + (c % NVEC) * d);
        t[k] = (bench_clock_s(CLOCK_THREAD_CPUTIME_ID) - t0) / (double)calls;
    }
    free(buf);
    qsort(t, REPEATS, sizeof t[0], bench_cmp_double);
    return t[REPEATS / 2] * 1e9;
}

struct speed_case {
    const char *label; /* kind name, or "hadamard-2round" */
    enum kvq_rot_kind kind;
    int rounds;
};

static void run_speed(void)
{
    static const struct speed_case cases[] = {
        {"hadamard", KVQ_ROT_HADAMARD, 0}, {"hadamard-2round", KVQ_ROT_HADAMARD, 2},
        {"dct", KVQ_ROT_DCT, 0},           {"identity", KVQ_ROT_IDENTITY, 0},
        {"gauss", KVQ_ROT_GAUSS, 0},
    };
    static const int dims[] = {128, 96};
    printf("apply time, ns per vector (thread CPU time, median of %d; in place; %s fast path)\n", REPEATS,
           kvq_cpu_has_avx2() ? "AVX2" : "scalar");
    printf("%-16s %5s %10s %10s %10s %10s %8s\n", "kind", "dim", "apply", "apply_t", "apply_ref",
           "apply_t_ref", "ref/fast");
    for (int di = 0; di < 2; di++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const struct speed_case *sc = &cases[ci];
            int d = dims[di];
            if (sc->rounds && (d & (d - 1)) == 0)
                continue; /* the power-of-two Hadamard has one round only */
            kvq_rotation *r = NULL;
            if (kvq_rotation_create_rounds(d, sc->kind, 7, sc->rounds, &r) != KVQ_OK)
                continue;
            double ns[4] = {time_apply(r, kvq_rotation_apply, d), time_apply(r, kvq_rotation_apply_t, d),
                            time_apply(r, kvq_rotation_apply_ref, d),
                            time_apply(r, kvq_rotation_apply_t_ref, d)};
            printf("%-16s %5d %10.1f %10.1f %10.1f %10.1f %8.2f\n", sc->label, d, ns[0], ns[1], ns[2],
                   ns[3], ns[2] / ns[0]);
            json_sep();
            fprintf(json,
                    "{\"kind\": \"%s\", \"dim\": %d, \"apply_ns\": %.2f, \"apply_t_ns\": %.2f, "
                    "\"apply_ref_ns\": %.2f, \"apply_t_ref_ns\": %.2f}",
                    sc->label, d, ns[0], ns[1], ns[2], ns[3]);
            kvq_rotation_free(r);
        }
}

/* ---------------------------------------------------------------- quality */

/* A construction under test: a kvq rotation, or a dense Haar-random
 * orthogonal matrix as the ideal reference. */
struct ctor {
    const char *label;
    enum kvq_rot_kind kind;
    int rounds; /* -1: Haar reference */
};

struct rot {
    kvq_rotation *r;
    double *dense; /* d x d, row-major (Haar) */
    int d;
};

/* Haar: Gram-Schmidt (twice, for accuracy) of a Gaussian matrix's rows. */
static void haar(double *q, int d, uint64_t seed)
{
    kvq_rng rng;
    kvq_rng_init(&rng, seed);
    for (int i = 0; i < d * d; i++)
        q[i] = kvq_rng_gauss(&rng);
    for (int i = 0; i < d; i++) {
        double *qi = q + (size_t)i * d;
        for (int pass = 0; pass < 2; pass++)
            for (int k = 0; k < i; k++) {
                const double *qk = q + (size_t)k * d;
                double s = 0;
                for (int j = 0; j < d; j++)
                    s += qi[j] * qk[j];
                for (int j = 0; j < d; j++)
                    qi[j] -= s * qk[j];
            }
        double n = 0;
        for (int j = 0; j < d; j++)
            n += qi[j] * qi[j];
        n = 1.0 / sqrt(n);
        for (int j = 0; j < d; j++)
            qi[j] *= n;
    }
}

static int rot_make(struct rot *ro, const struct ctor *c, int d, uint64_t seed)
{
    memset(ro, 0, sizeof *ro);
    ro->d = d;
    if (c->rounds < 0) {
        ro->dense = malloc(sizeof(double) * (size_t)d * d);
        haar(ro->dense, d, seed);
        return 0;
    }
    return kvq_rotation_create_rounds(d, c->kind, seed, c->rounds, &ro->r) == KVQ_OK ? 0 : -1;
}

static void rot_apply(const struct rot *ro, const float *x, float *y)
{
    if (ro->r) {
        kvq_rotation_apply(ro->r, x, y);
        return;
    }
    for (int i = 0; i < ro->d; i++) {
        double s = 0;
        for (int j = 0; j < ro->d; j++)
            s += ro->dense[(size_t)i * ro->d + j] * x[j];
        y[i] = (float)s;
    }
}

static void rot_free(struct rot *ro)
{
    kvq_rotation_free(ro->r);
    free(ro->dense);
}

/* CDF of sqrt(d) * (one coordinate of a uniform unit vector in R^d), density
 * prop. to (1 - t^2/d)^((d-3)/2) on |t| <= sqrt(d), tabulated by the
 * trapezoid rule on a fine grid. */
#define CDF_N 40001
struct beta_cdf {
    double lo, step, f[CDF_N];
};

static void beta_cdf_init(struct beta_cdf *b, int d)
{
    double a = sqrt((double)d);
    b->lo = -a;
    b->step = 2 * a / (CDF_N - 1);
    double prev = 0, acc = 0;
    b->f[0] = 0;
    for (int i = 1; i < CDF_N; i++) {
        double t = b->lo + i * b->step, u = 1 - t * t / d;
        double dens = u > 0 ? exp(0.5 * (d - 3) * log(u)) : 0;
        acc += 0.5 * (prev + dens) * b->step;
        b->f[i] = acc;
        prev = dens;
    }
    for (int i = 0; i < CDF_N; i++)
        b->f[i] /= acc;
}

static double beta_cdf_at(const struct beta_cdf *b, double t)
{
    double u = (t - b->lo) / b->step;
    if (u <= 0)
        return 0;
    if (u >= CDF_N - 1)
        return 1;
    int i = (int)u;
    return b->f[i] + (u - i) * (b->f[i + 1] - b->f[i]);
}

/* Kolmogorov distance of samples (sorted in place) to the beta CDF. */
static double ks_distance(double *s, size_t n, const struct beta_cdf *b)
{
    qsort(s, n, sizeof *s, bench_cmp_double);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double f = beta_cdf_at(b, s[i]);
        worst = fmax(worst, fmax(fabs(f - (double)i / n), fabs(f - (double)(i + 1) / n)));
    }
    return worst;
}

static double kurtosis(const double *s, size_t n)
{
    double m2 = 0, m4 = 0;
    for (size_t i = 0; i < n; i++)
        m2 += s[i] * s[i], m4 += s[i] * s[i] * s[i] * s[i];
    m2 /= n, m4 /= n;
    return m4 / (m2 * m2);
}

/* 3-bit Lloyd-Max quantizer of N(0,1), the large-d limit of the codebook the
 * codec uses for sqrt(d) * (rotated coordinate): computed here so that this
 * measurement depends on nothing but the rotation. Cells' conditional means
 * and probabilities have closed forms for the normal density. */
#define QLEVELS 8
static double qc[QLEVELS], qb[QLEVELS - 1], q_mse_ideal;

static void lloyd_gauss_init(void)
{
    const double r2 = 0.70710678118654752440, rs2pi = 0.39894228040143267794;
    for (int k = 0; k < QLEVELS; k++)
        qc[k] = -2.0 + 4.0 * k / (QLEVELS - 1);
    for (int it = 0; it < 5000; it++) {
        for (int k = 0; k < QLEVELS - 1; k++)
            qb[k] = 0.5 * (qc[k] + qc[k + 1]);
        q_mse_ideal = 1.0;
        for (int k = 0; k < QLEVELS; k++) {
            double a = k ? qb[k - 1] : -INFINITY, b = k < QLEVELS - 1 ? qb[k] : INFINITY;
            double pa = isinf(a) ? 0 : rs2pi * exp(-0.5 * a * a), pb = isinf(b) ? 0 : rs2pi * exp(-0.5 * b * b);
            double prob = 0.5 * (erf(b * r2) - erf(a * r2));
            qc[k] = (pa - pb) / prob;
            q_mse_ideal -= prob * qc[k] * qc[k];
        }
    }
}

/* Mean squared quantization error of the samples (units of sqrt(d) * y, so
 * this is the expected error per unit vector). */
static double quant_mse(const double *s, size_t n)
{
    double acc = 0;
    for (size_t i = 0; i < n; i++) {
        int k = 0;
        while (k < QLEVELS - 1 && s[i] > qb[k])
            k++;
        acc += (s[i] - qc[k]) * (s[i] - qc[k]);
    }
    return acc / (double)n;
}

#define QSEEDS 4
#define N_UNIFORM 500
#define N_OUTLIER 1000
#define N_OUTCH 4
#define OUT_GAIN 10.0
#define N_SPARSE 300 /* k-sparse vectors per seed and k */
static const int SPARSE_K[3] = {2, 4, 8};

struct quality {
    double ortho, spike_max, spike_kurt, spike_mse, uni_ks, uni_kurt, uni_mse, out_ks, out_kurt,
        out_mse, out_var_max, sparse_mse[3], sparse_mse_max;
};

static void measure(const struct ctor *c, int d, struct quality *q)
{
    memset(q, 0, sizeof *q);
    struct beta_cdf *bc = malloc(sizeof *bc);
    beta_cdf_init(bc, d);
    float *cols = malloc(sizeof(float) * (size_t)d * d), *x = malloc(sizeof(float) * (size_t)d);
    float *y = malloc(sizeof(float) * (size_t)d);
    size_t nsp = (size_t)QSEEDS * d * d, nu = (size_t)QSEEDS * N_UNIFORM * d;
    size_t no = (size_t)QSEEDS * N_OUTLIER * d;
    double *sp = malloc(sizeof(double) * nsp), *su = malloc(sizeof(double) * nu);
    double *so = malloc(sizeof(double) * no);
    size_t isp = 0, iu = 0, io = 0, is[3] = {0, 0, 0}, ns = (size_t)QSEEDS * N_SPARSE * d;
    double *ss[3];
    for (int k = 0; k < 3; k++)
        ss[k] = malloc(sizeof(double) * ns);
    const double sd = sqrt((double)d);
    for (int s = 0; s < QSEEDS; s++) {
        struct rot ro;
        if (rot_make(&ro, c, d, 1000 + (uint64_t)s) != 0)
            continue;
        /* columns R e_j: orthogonality and spikes */
        for (int j = 0; j < d; j++) {
            float *col = cols + (size_t)j * d;
            memset(x, 0, sizeof(float) * (size_t)d);
            x[j] = 1.0f;
            rot_apply(&ro, x, col);
            for (int i = 0; i < d; i++) {
                sp[isp++] = col[i] * sd;
                q->spike_max = fmax(q->spike_max, fabs(col[i]) * sd);
            }
        }
        for (int i = 0; i < d; i++)
            for (int j = i; j < d; j++) {
                double g = 0;
                for (int k = 0; k < d; k++)
                    g += (double)cols[(size_t)i * d + k] * cols[(size_t)j * d + k];
                q->ortho = fmax(q->ortho, fabs(g - (i == j)));
            }
        kvq_rng rng;
        kvq_rng_init(&rng, 5000 + (uint64_t)s);
        for (int v = 0; v < N_UNIFORM; v++) {
            double n = 0;
            for (int j = 0; j < d; j++) {
                double g = kvq_rng_gauss(&rng);
                x[j] = (float)g, n += g * g;
            }
            for (int j = 0; j < d; j++)
                x[j] = (float)(x[j] / sqrt(n));
            rot_apply(&ro, x, y);
            for (int i = 0; i < d; i++)
                su[iu++] = y[i] * sd;
        }
        /* planted outlier channels, at seeded random positions */
        double lam[4096];
        for (int j = 0; j < d; j++)
            lam[j] = 1.0;
        for (int k = 0; k < N_OUTCH; k++)
            lam[kvq_rng_next(&rng) % (uint64_t)d] = OUT_GAIN * OUT_GAIN;
        double lam_sum = 0;
        for (int j = 0; j < d; j++)
            lam_sum += lam[j];
        /* exact variance of each rotated coordinate relative to 1/d:
         * d * sum_j R_ij^2 lam_j / sum_j lam_j, R_ij = cols[j][i] */
        for (int i = 0; i < d; i++) {
            double v = 0;
            for (int j = 0; j < d; j++)
                v += (double)cols[(size_t)j * d + i] * cols[(size_t)j * d + i] * lam[j];
            q->out_var_max = fmax(q->out_var_max, d * v / lam_sum);
        }
        for (int v = 0; v < N_OUTLIER; v++) {
            double n = 0;
            for (int j = 0; j < d; j++) {
                double g = kvq_rng_gauss(&rng) * sqrt(lam[j]);
                x[j] = (float)g, n += g * g;
            }
            for (int j = 0; j < d; j++)
                x[j] = (float)(x[j] / sqrt(n));
            rot_apply(&ro, x, y);
            for (int i = 0; i < d; i++)
                so[io++] = y[i] * sd;
        }
        /* k-sparse: Gaussian amplitudes at fresh random positions */
        for (int k = 0; k < 3; k++)
            for (int v = 0; v < N_SPARSE; v++) {
                memset(x, 0, sizeof(float) * (size_t)d);
                double n = 0;
                for (int t = 0; t < SPARSE_K[k]; t++) {
                    double g = kvq_rng_gauss(&rng);
                    x[kvq_rng_next(&rng) % (uint64_t)d] = (float)g;
                }
                for (int j = 0; j < d; j++)
                    n += (double)x[j] * x[j];
                for (int j = 0; j < d; j++)
                    x[j] = (float)(x[j] / sqrt(n));
                rot_apply(&ro, x, y);
                for (int i = 0; i < d; i++)
                    ss[k][is[k]++] = y[i] * sd;
            }
        rot_free(&ro);
    }
    for (int k = 0; k < 3; k++) {
        q->sparse_mse[k] = quant_mse(ss[k], is[k]) / q_mse_ideal;
        q->sparse_mse_max = fmax(q->sparse_mse_max, q->sparse_mse[k]);
        free(ss[k]);
    }
    q->spike_kurt = kurtosis(sp, isp);
    q->spike_mse = quant_mse(sp, isp) / q_mse_ideal;
    q->uni_mse = quant_mse(su, iu) / q_mse_ideal;
    q->out_mse = quant_mse(so, io) / q_mse_ideal;
    q->uni_kurt = kurtosis(su, iu);
    q->out_kurt = kurtosis(so, io);
    q->uni_ks = ks_distance(su, iu, bc);
    q->out_ks = ks_distance(so, io, bc);
    free(sp), free(su), free(so), free(cols), free(x), free(y), free(bc);
}

static void run_quality(void)
{
    static const struct ctor ctors[] = {
        {"kron-1round", KVQ_ROT_HADAMARD, 1},
        {"kron-2round", KVQ_ROT_HADAMARD, 2},
        {"dct", KVQ_ROT_DCT, 0},
        {"haar(ref)", KVQ_ROT_HADAMARD, -1},
    };
    static const int dims[] = {80, 96, 112, 160, 192, 576, 128};
    lloyd_gauss_init();
    printf("\nrotation quality (%d seeds; %d uniform and %d outlier vectors per seed; %d outlier\n"
           "channels x%.0f; coordinates scaled by sqrt(d). spike = R e_j for every j (flat: max 1,\n"
           "kurtosis 1); KS = Kolmogorov distance to the exact coordinate law of a uniform unit\n"
           "vector; kurtosis ideal 3d/(d+2) (column ideal_k); mse = 3-bit Lloyd-Max (N(0,1))\n"
           "quantization error / its Gaussian expectation %.6f; var_max = largest coordinate\n"
           "variance x d for one seed's outlier data, ideal 1; k_mse = worst mse ratio of\n"
           "2-, 4- and 8-sparse Gaussian vectors)\n",
           QSEEDS, N_UNIFORM, N_OUTLIER, N_OUTCH, OUT_GAIN, q_mse_ideal);
    printf("%-12s %4s %8s %7s %7s %7s %7s %7s %7s %7s %7s %7s %7s %7s\n", "rotation", "dim",
           "orth_err", "spk_max", "spk_kur", "spk_mse", "uni_KS", "uni_mse", "out_KS", "out_kur",
           "out_mse", "var_max", "k_mse", "ideal_k");
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (size_t ci = 0; ci < sizeof ctors / sizeof ctors[0]; ci++) {
            int d = dims[di];
            struct ctor c = ctors[ci];
            if ((d & (d - 1)) == 0) { /* power of two: the 1-round FWHT instead of kron */
                if (c.rounds == 2)
                    continue;
                if (c.rounds == 1)
                    c = (struct ctor){"hadamard", KVQ_ROT_HADAMARD, 0};
            }
            struct quality q;
            measure(&c, d, &q);
            double ideal = 3.0 * d / (d + 2.0);
            printf("%-12s %4d %8.1e %7.3f %7.3f %7.3f %7.4f %7.3f %7.4f %7.3f %7.3f %7.3f %7.3f %7.3f\n",
                   c.label, d, q.ortho, q.spike_max, q.spike_kurt, q.spike_mse, q.uni_ks, q.uni_mse,
                   q.out_ks, q.out_kurt, q.out_mse, q.out_var_max, q.sparse_mse_max, ideal);
            json_sep();
            fprintf(json,
                    "{\"rotation\": \"%s\", \"dim\": %d, \"ortho_err\": %.3e, \"spike_max\": %.4f, "
                    "\"spike_kurtosis\": %.4f, \"spike_mse_ratio\": %.4f, \"uniform_ks\": %.5f, "
                    "\"uniform_kurtosis\": %.4f, \"uniform_mse_ratio\": %.4f, \"outlier_ks\": %.5f, "
                    "\"outlier_kurtosis\": %.4f, \"outlier_mse_ratio\": %.4f, "
                    "\"outlier_var_max\": %.4f, \"sparse2_mse_ratio\": %.4f, "
                    "\"sparse4_mse_ratio\": %.4f, \"sparse8_mse_ratio\": %.4f, \"ideal_kurtosis\": %.4f}",
                    c.label, d, q.ortho, q.spike_max, q.spike_kurt, q.spike_mse, q.uni_ks, q.uni_kurt,
                    q.uni_mse, q.out_ks, q.out_kurt, q.out_mse, q.out_var_max, q.sparse_mse[0],
                    q.sparse_mse[1], q.sparse_mse[2], ideal);
            fflush(stdout);
        }
}

int main(int argc, char **argv)
{
    int speed = 1, quality = 1;
    if (argc > 1 && strcmp(argv[1], "--speed") == 0)
        quality = 0;
    else if (argc > 1 && strcmp(argv[1], "--quality") == 0)
        speed = 0;
    else if (argc > 1) {
        fprintf(stderr, "usage: bench_rotation [--speed | --quality]\n");
        return 2;
    }
    /* Single-threaded numbers, as every kvq benchmark: OpenBLAS would
     * otherwise hand the Gaussian sgemv to worker threads whose time the
     * thread clock does not see (and that are slower at this size anyway). */
    openblas_set_num_threads(1);
    char path[4096];
    const char *dir = getenv("KVQ_BENCH_JSON_DIR");
    if (dir && *dir)
        snprintf(path, sizeof path, "%s/bench_rotation.json", dir);
    else {
        const char *slash = strrchr(argv[0], '/');
        int len = slash ? (int)(slash - argv[0]) : 1;
        snprintf(path, sizeof path, "%.*s/bench_rotation.json", len, slash ? argv[0] : ".");
    }
    json = fopen(path, "w");
    if (!json) {
        fprintf(stderr, "bench_rotation: cannot write %s\n", path);
        return 1;
    }
    fprintf(json, "{\n  \"bench\": \"bench_rotation\",\n  \"speed\": [");
    json_first = 1;
    if (speed)
        run_speed();
    fprintf(json, "\n  ],\n  \"quality\": [");
    json_first = 1;
    if (quality)
        run_quality();
    fprintf(json, "\n  ]\n}\n");
    fclose(json);
    printf("\nJSON: %s\n", path);
    return 0;
}
