/* test_codec_tq.c - the TurboQuant row codec: the packed layout against an
 * independent decoder, determinism, zero rows, bad input, and score =
 * <q, decode(row)>. The AVX2 path against the scalar reference (bit for bit)
 * is in test_backend_ops (encode, decode, score). */
#include <stdint.h>

#include "codec_internal.h"
#include "rotation_internal.h"
#include "kvq_half.h"
#include "kvq_rng.h"
#include "test.h"
#include "test_util.h"

static kvq_codec *make(enum kvq_type t, int d)
{
    return test_codec_make(t, d, 0, KVQ_QJL_ORTHO);
}

/* Test vectors of several kinds: Gaussian at scales from 1e-6 to 1e4,
 * one-hot spikes, sparse vectors and constant vectors (worst cases for a
 * rotation: many equal coordinates after the transform). */
static void fill_vector(kvq_rng *rng, float *x, int d, int kind)
{
    double scale = exp(kvq_rng_uniform(rng) * 20.0 - 14.0); /* 1e-6 .. 400 */
    memset(x, 0, (size_t)d * sizeof *x);
    switch (kind % 4) {
    case 0:
        for (int j = 0; j < d; j++)
            x[j] = (float)(kvq_rng_gauss(rng) * scale);
        break;
    case 1:
        x[kvq_rng_next(rng) % (uint64_t)d] = (float)scale;
        break;
    case 2:
        for (int k = 0; k < 3; k++)
            x[kvq_rng_next(rng) % (uint64_t)d] = (float)(kvq_rng_gauss(rng) * scale);
        break;
    default:
        for (int j = 0; j < d; j++)
            x[j] = (float)scale;
        break;
    }
}

/* Decodes a packed row from the layout text of kvq_codec.h alone, in double:
 * the codebook from kvq_codebook_get, R and S rebuilt from the public
 * rotation API with the documented seed streams (what a port must do). */
static void independent_decode(const kvq_codec *c, const uint8_t *row, double *x)
{
    int d = c->cfg.dim, b = c->traits->bits, qjl = c->traits->qjl;
    kvq_codebook cb;
    kvq_rotation *R = NULL, *S = NULL;
    CHECK_OK(kvq_codebook_get(d, b, KVQ_DIST_BETA, &cb));
    CHECK_OK(kvq_rotation_create(d, c->cfg.rot, kvq_seed_derive(c->cfg.seed, KVQ_SEED_STREAM_R), &R));
    if (qjl) {
        uint64_t s_seed = kvq_seed_derive(c->cfg.seed, KVQ_SEED_STREAM_S);
        if (c->cfg.qjl == KVQ_QJL_GAUSS)
            CHECK_OK(kvq_rotation_create(d, KVQ_ROT_GAUSS, s_seed, &S));
        else if (c->cfg.rot == KVQ_ROT_HADAMARD) /* documented: KVQ_QJL_ROUNDS rounds */
            CHECK_OK(kvq_rotation_create_rounds(d, KVQ_ROT_HADAMARD, s_seed, KVQ_QJL_ROUNDS, &S));
        else
            CHECK_OK(kvq_rotation_create(d, c->cfg.rot, s_seed, &S));
    }
    if (!R || (qjl && !S))
        goto out;
    uint16_t nb, gb;
    memcpy(&nb, row, 2);
    memcpy(&gb, row + 2, 2);
    const uint8_t *codes = row + (qjl ? 4 : 2), *signs = codes + d * b / 8;
    float w[KVQ_MAX_DIM], t[KVQ_MAX_DIM];
    double cw[KVQ_MAX_DIM];
    for (int j = 0; j < d; j++) {
        unsigned idx = 0;
        for (int k = 0; k < b; k++) {
            int bit = b * j + k;
            idx |= (unsigned)((codes[bit / 8] >> (bit % 8)) & 1) << k;
        }
        cw[j] = cb.centroids[idx];
        t[j] = qjl && (signs[j / 8] >> (j % 8)) & 1 ? 1.0f : -1.0f;
    }
    double g = 0;
    if (qjl) {
        kvq_rotation_apply_t_ref(S, t, t);
        double kappa = c->cfg.qjl == KVQ_QJL_GAUSS ? sqrt(M_PI / 2) / d
                                                   : sqrt(M_PI) * exp(lgamma(0.5 * (d + 1)) - lgamma(0.5 * d)) / d;
        g = kvq_f16_to_f32(gb) * kappa;
    }
    for (int j = 0; j < d; j++)
        w[j] = (float)(cw[j] + g * t[j]);
    kvq_rotation_apply_t_ref(R, w, w);
    for (int j = 0; j < d; j++)
        x[j] = (double)w[j] * kvq_f16_to_f32(nb);
out:
    kvq_rotation_free(R);
    kvq_rotation_free(S);
}

static void test_layout_independent_decode(void)
{
    kvq_rng rng;
    kvq_rng_init(&rng, 22);
    for (int t = KVQ_TYPE_TQ1; t <= KVQ_TYPE_TQ4J; t++) {
        kvq_codec *c = test_codec_make((enum kvq_type)t, 96, 1234, t % 2 ? KVQ_QJL_GAUSS : KVQ_QJL_ORTHO);
        if (!c)
            continue;
        for (int it = 0; it < 50; it++) {
            float x[96], y[96];
            double z[96], nz = 0, err = 0;
            uint8_t row[128];
            fill_vector(&rng, x, 96, 0);
            CHECK_OK(kvq_codec_encode(c, x, 1, row));
            CHECK_OK(kvq_codec_decode(c, row, 1, y));
            independent_decode(c, row, z);
            for (int j = 0; j < 96; j++) {
                nz += z[j] * z[j];
                err += (y[j] - z[j]) * (y[j] - z[j]);
            }
            CHECKF(sqrt(err) <= 1e-5 * sqrt(nz), "%s: |decode - independent| = %g of %g",
                   kvq_codec_traits(c)->name, sqrt(err), sqrt(nz));
        }
        kvq_codec_free(c);
    }
}

static void test_determinism(void)
{
    float x[128];
    kvq_rng rng;
    kvq_rng_init(&rng, 23);
    for (int j = 0; j < 128; j++)
        x[j] = (float)kvq_rng_gauss(&rng);
    for (int t = KVQ_TYPE_TQ1; t <= KVQ_TYPE_TQ4J; t++) {
        kvq_codec *a = test_codec_make((enum kvq_type)t, 128, 77, KVQ_QJL_ORTHO);
        kvq_codec *b = test_codec_make((enum kvq_type)t, 128, 77, KVQ_QJL_ORTHO);
        kvq_codec *o = test_codec_make((enum kvq_type)t, 128, 78, KVQ_QJL_ORTHO);
        if (a && b && o) {
            uint8_t ra[84], rb[84], ro[84];
            CHECK_OK(kvq_codec_encode(a, x, 1, ra));
            CHECK_OK(kvq_codec_encode(b, x, 1, rb));
            CHECK_OK(kvq_codec_encode(o, x, 1, ro));
            size_t n = kvq_codec_row_bytes(a);
            CHECK(memcmp(ra, rb, n) == 0);
            /* Another seed: another R, so (with overwhelming probability) other codes. */
            CHECK(memcmp(ra + 2, ro + 2, n - 2) != 0);
        }
        kvq_codec_free(a);
        kvq_codec_free(b);
        kvq_codec_free(o);
    }
}

static void test_zero_vector(void)
{
    for (int t = KVQ_TYPE_TQ1; t <= KVQ_TYPE_TQ4J; t++) {
        kvq_codec *c = make((enum kvq_type)t, 80);
        if (!c)
            continue;
        float x[80] = {0}, y[80], q[80], qp[160];
        for (int j = 0; j < 80; j++)
            q[j] = (float)j - 40.0f;
        x[3] = -0.0f;
        uint8_t row[64];
        memset(row, 0xff, sizeof row);
        CHECK_OK(kvq_codec_encode(c, x, 1, row));
        size_t n = kvq_codec_row_bytes(c);
        for (size_t i = 0; i < n; i++)
            CHECK(row[i] == 0);
        for (int ref = 0; ref < 2; ref++) {
            memset(y, 0xff, sizeof y);
            CHECK_OK(ref ? kvq_codec_decode_ref(c, row, 1, y) : kvq_codec_decode(c, row, 1, y));
            for (int j = 0; j < 80; j++)
                CHECK(kvq_f32_bits(y[j]) == 0); /* +0.0f exactly */
        }
        CHECK_OK(kvq_codec_prepare_query(c, q, qp));
        struct kvq_row r = kvq_codec_packed_row(c, row);
        CHECK(kvq_codec_score(c, qp, &r) == 0.0f);
        kvq_codec_free(c);
    }
}

/* The norm is stored as f16: n up to 65519 rounds to 65504, 65520 and up
 * (or an overflowing sum of squares) cannot be stored. */
static void test_norm_range(void)
{
    kvq_codec *c = make(KVQ_TYPE_TQ3J, 64);
    if (!c)
        return;
    float x[64] = {0};
    uint8_t row[2 * 36], keep[2 * 36];
    x[5] = 65519.0f;
    CHECK_OK(kvq_codec_encode(c, x, 1, row));
    CHECK(kvq_row_load_u16((const uint16_t *)(const void *)row) == 0x7bff);
    x[5] = 65520.0f;
    memset(row, 0x33, sizeof row);
    memcpy(keep, row, sizeof row);
    CHECK_STATUS(kvq_codec_encode(c, x, 1, row), KVQ_ERR_RANGE);
    CHECK_STATUS(kvq_codec_encode_ref(c, x, 1, row), KVQ_ERR_RANGE);
    x[5] = 1.0e30f; /* finite, but x^2 overflows float */
    CHECK_STATUS(kvq_codec_encode(c, x, 1, row), KVQ_ERR_RANGE);
    for (int j = 0; j < 64; j++)
        x[j] = 8200.0f; /* every coordinate fine, the norm (65600) is not */
    float ok[64] = {1.0f};
    float both[128];
    memcpy(both, ok, sizeof ok);
    memcpy(both + 64, x, sizeof x);
    CHECK_STATUS(kvq_codec_encode(c, both, 2, row), KVQ_ERR_RANGE);
    CHECK(memcmp(row, keep, sizeof row) == 0);
    kvq_codec_free(c);
}

/* score(q, row) is <q, decode(row)> up to float rounding, for both S kinds. */
static void test_score_is_dot_of_decode(void)
{
    kvq_rng rng;
    kvq_rng_init(&rng, 24);
    static const int dims[] = {64, 96, 128};
    for (int qk = 0; qk < KVQ_QJL_KIND_COUNT; qk++)
        for (size_t di = 0; di < 3; di++)
            for (int t = KVQ_TYPE_TQ1; t <= KVQ_TYPE_TQ4J; t++) {
                int d = dims[di];
                if (qk == KVQ_QJL_GAUSS && t < KVQ_TYPE_TQ1J)
                    continue;
                kvq_codec *c = test_codec_make((enum kvq_type)t, d, 5, (enum kvq_qjl_kind)qk);
                if (!c)
                    continue;
                double worst = 0;
                for (int it = 0; it < 300; it++) {
                    float x[128], y[128], q[128], qp[256];
                    uint8_t row[128];
                    fill_vector(&rng, x, d, 0);
                    fill_vector(&rng, q, d, 0);
                    CHECK_OK(kvq_codec_encode(c, x, 1, row));
                    CHECK_OK(kvq_codec_decode(c, row, 1, y));
                    CHECK_OK(kvq_codec_prepare_query(c, q, qp));
                    struct kvq_row r = kvq_codec_packed_row(c, row);
                    double dot = 0, nq = 0, ny = 0;
                    for (int j = 0; j < d; j++) {
                        dot += (double)q[j] * y[j];
                        nq += (double)q[j] * q[j];
                        ny += (double)y[j] * y[j];
                    }
                    double e = fabs(kvq_codec_score(c, qp, &r) - dot) / sqrt(nq * ny);
                    worst = fmax(worst, e);
                }
                CHECKF(worst <= 2e-6, "%s d=%d qjl=%d: |score - <q, decode>| up to %.3g of |q||x~|",
                       kvq_codec_traits(c)->name, d, qk, worst);
                kvq_codec_free(c);
            }
}

/* Round-trip MSE on random unit vectors against the codebook's expected
 * squared error (kvq_codebook.h: per unit vector, exact Beta density).
 *   tqB : E||x~ - x||^2 = mse.
 *   tqBj: the residual r (||r|| = gamma) is replaced by g S^T s~, g = gamma
 *         kappa, s~ = sign(S r). For orthogonal S, ||S^T s~||^2 = d and
 *         <r, S^T s~> = gamma ||v||_1 with v = S r / gamma, so
 *         E||r - g S^T s~||^2 = gamma^2 (1 - 2 kappa E||v||_1 + kappa^2 d)
 *                             = gamma^2 (kappa^2 d - 1)    (E||v||_1 = 1/kappa)
 *         and the MSE is mse (kappa^2 d - 1) ~ (pi/2 - 1) mse.
 * 2% is far above the sampling error (printed: ~0.15% for 20000 vectors).
 * One documented exception, in one direction: E||v||_1 = 1/kappa holds
 * exactly when v is uniform on the sphere. With the single-round randomised
 * Hadamard S of power-of-two d, v's coordinates are Rademacher sums of the
 * residual's coordinates; the 3- and 4-bit residuals are heavy-tailed (the
 * outer cells dominate gamma), which raises E||v||_1 by up to ~0.4% and so
 * *lowers* the MSE, by 1.5-2.5% at d = 64 for tq3j/tq4j and ~1.6% for tq4j at
 * d = 128 (measured; the two-round Kronecker rotation at d = 96 stays within
 * 0.1%). For tqBj at power-of-two d the lower tolerance is therefore 3%; the
 * upper one (QJL worse than the theory) stays 2% everywhere. */
static void test_round_trip_mse(void)
{
    static const int dims[] = {64, 96, 128};
    kvq_rng rng;
    kvq_rng_init(&rng, 25);
    static const enum kvq_type types[] = {KVQ_TYPE_TQ1,  KVQ_TYPE_TQ2,  KVQ_TYPE_TQ3,  KVQ_TYPE_TQ4,
                                          KVQ_TYPE_TQ1J, KVQ_TYPE_TQ2J, KVQ_TYPE_TQ3J, KVQ_TYPE_TQ4J,
                                          KVQ_TYPE_TQ5,  KVQ_TYPE_TQ6,  KVQ_TYPE_TQ8};
    for (size_t di = 0; di < 3; di++)
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            const enum kvq_type t = types[ti];
            int d = dims[di];
            kvq_codec *c = make(t, d);
            if (!c)
                continue;
            /* the error of a fine codebook varies more from row to row (the f16 norm's share grows) */
            const int N = c->bits > 4 ? 60000 : 20000;
            double s = 0, s2 = 0;
            for (int it = 0; it < N; it++) {
                float x[128], y[128];
                uint8_t row[256]; /* tq8 at d = 128 is 130 bytes */
                double nn = 0, e = 0;
                for (int j = 0; j < d; j++) {
                    x[j] = (float)kvq_rng_gauss(&rng);
                    nn += (double)x[j] * x[j];
                }
                for (int j = 0; j < d; j++)
                    x[j] = (float)(x[j] / sqrt(nn));
                CHECK_OK(kvq_codec_encode(c, x, 1, row));
                CHECK_OK(kvq_codec_decode(c, row, 1, y));
                for (int j = 0; j < d; j++)
                    e += ((double)y[j] - x[j]) * ((double)y[j] - x[j]);
                s += e;
                s2 += e * e;
            }
            double mean = s / N, se = sqrt((s2 / N - mean * mean) / N);
            double k = kvq_codec_qjl_kappa(c);
            double want = c->codebook_mse * (c->traits->qjl ? k * k * d - 1.0 : 1.0);
            int pow2 = (d & (d - 1)) == 0;
            double tol_lo = c->traits->qjl && pow2 ? 0.03 : 0.02, tol_hi = 0.02;
            printf("  %-5s d=%3d  mse %.6f  (se %.2g = %.2f%%)  expected %.6f  ratio %.4f\n",
                   kvq_codec_traits(c)->name, d, mean, se, 100 * se / mean, want, mean / want);
            CHECK(se < 0.005 * want); /* the sample is large enough for the tolerance */
            CHECKF(mean / want - 1.0 <= tol_hi && 1.0 - mean / want <= tol_lo, "%s d=%d: mse %.6f vs %.6f",
                   kvq_codec_traits(c)->name, d, mean, want);
            kvq_codec_free(c);
        }
}

int main(void)
{
    RUN(test_layout_independent_decode);
    RUN(test_determinism);
    RUN(test_zero_vector);
    RUN(test_norm_range);
    RUN(test_score_is_dot_of_decode);
    RUN(test_round_trip_mse);
    return TEST_END("test_codec_tq");
}
