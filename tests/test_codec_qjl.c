/* test_codec_qjl.c - statistics of the QJL inner-product estimator (tqBj).
 *
 * For a key k (unit norm, so its f16 norm is exactly 1) and a query q, the
 * score is <q', c[idx]> + g <S q', s~> with q' = R q. Its codebook part equals
 * <q', y - r> exactly, so score - <q, k> is the error of the QJL term as an
 * estimate of <q', r>, plus float rounding (~1e-7, far below the QJL noise).
 * The paper's claims, checked over 1e5 (q, k) pairs per case:
 *   unbiased:  mean error within 3 standard errors of 0;
 *   variance:  E[err^2] <= (pi/(2d)) E[||r||^2 ||q||^2], tested one-sided:
 *              mean(err^2 - bound) <= 3 standard errors of that mean.
 * The Gaussian S sits on the bound (its variance is (pi/(2d))||r||^2||q||^2
 * - <q', r>^2/d), the orthogonal S well below it (~(pi/2 - 1)/(pi/2) of it).
 */
#include <stdint.h>

#include "codec_internal.h"
#include "kvq_half.h"
#include "kvq_rng.h"
#include "test.h"
#include "test_util.h"

#define N_PAIRS 100000

static void unit_vector(kvq_rng *rng, float *x, int d)
{
    double nn = 0;
    for (int j = 0; j < d; j++) {
        x[j] = (float)kvq_rng_gauss(rng);
        nn += (double)x[j] * x[j];
    }
    for (int j = 0; j < d; j++)
        x[j] = (float)(x[j] / sqrt(nn));
}

/* The residual r = y - c[idx] of unit key k, as the encoder computes it. */
static void residual(const kvq_codec *c, const float *k, float *r)
{
    int d = c->cfg.dim;
    float n = kvq_norm_ref(k, d), inv = 1.0f / n;
    for (int j = 0; j < d; j++)
        r[j] = k[j] * inv;
    kvq_rotation_apply_ref(c->rot, r, r);
    for (int j = 0; j < d; j++) {
        int idx = 0;
        for (int i = 0; i + 1 < c->levels; i++)
            idx += r[j] > c->boundaries[i];
        r[j] -= c->centroids[idx];
    }
}

enum query_kind {
    Q_INDEPENDENT, /* q ~ N(0, I): the plain random pairs */
    Q_CORRELATED,  /* q = k + N(0, I/d): attention-like, <q, k> ~ 1 */
    Q_RESIDUAL     /* q' = r / ||r||: the whole signal is the QJL term */
};

struct stats {
    double mean, se;          /* error of score vs <q, k> */
    double excess, excess_se; /* mean(err^2 - bound) */
    double ratio;             /* E[err^2] / E[bound] */
    double target;            /* mean <q', r> (what the QJL term estimates) */
    double cb_bias;           /* mean error without the QJL term (the tqB score) */
};

/* N_PAIRS pairs spread over N_SEEDS codecs (seeds): the claims are about a
 * random S, and one fixed S has its own O(1/d) deviations (e.g. the Gaussian
 * S's Frobenius norm fluctuates by sqrt(2)/d), which would otherwise be
 * mistaken for a bias or an excess variance at this sample size. */
#define N_SEEDS 100

static struct stats run_pairs(enum kvq_type t, int d, enum kvq_qjl_kind qk, enum query_kind mode, uint64_t seed)
{
    struct stats st = {0, 0, 0, 0, 0, 0, 0};
    kvq_rng rng;
    kvq_rng_init(&rng, seed);
    double s = 0, s2 = 0, x = 0, x2 = 0, se2 = 0, sb = 0, stg = 0, scb = 0;
    const char *name = kvq_type_traits(t)->name;
    for (int sd = 0; sd < N_SEEDS; sd++) {
        const uint64_t cseed = seed * 1000 + (uint64_t)sd;
        kvq_codec *c = test_codec_make(t, d, cseed, qk);
        kvq_codec *cb = test_codec_make((enum kvq_type)(t - KVQ_TYPE_TQ1J + KVQ_TYPE_TQ1), d, cseed, qk);
        for (int it = 0; c && cb && it < N_PAIRS / N_SEEDS; it++) {
            float k[128], q[128], r[128], qp[256], qpb[256];
            uint8_t row[128], rowb[128];
            unit_vector(&rng, k, d);
            residual(c, k, r);
            if (mode == Q_RESIDUAL) {
                double g = 0;
                for (int j = 0; j < d; j++)
                    g += (double)r[j] * r[j];
                for (int j = 0; j < d; j++)
                    q[j] = (float)(r[j] / sqrt(g));
                kvq_rotation_apply_t_ref(c->rot, q, q);
            } else {
                for (int j = 0; j < d; j++)
                    q[j] = (float)kvq_rng_gauss(&rng);
                if (mode == Q_CORRELATED)
                    for (int j = 0; j < d; j++)
                        q[j] = (float)(k[j] + q[j] / sqrt((double)d));
            }
            CHECK_OK(kvq_codec_encode(c, k, 1, row));
            CHECK_OK(kvq_codec_encode(cb, k, 1, rowb));
            CHECK_OK(kvq_codec_prepare_query(c, q, qp));
            CHECK_OK(kvq_codec_prepare_query(cb, q, qpb));
            struct kvq_row rv = kvq_codec_packed_row(c, row), rvb = kvq_codec_packed_row(cb, rowb);
            double exact = 0, qq = 0, tg = 0;
            for (int j = 0; j < d; j++) {
                exact += (double)q[j] * k[j];
                qq += (double)q[j] * q[j];
                tg += (double)qp[j] * r[j];
            }
            double n = kvq_f16_to_f32(kvq_row_load_u16(rv.norm));
            double gamma = kvq_f16_to_f32(kvq_row_load_u16(rv.rnorm));
            double e = kvq_codec_score(c, qp, &rv) - exact;
            double bound = M_PI / (2.0 * d) * gamma * gamma * n * n * qq;
            s += e;
            s2 += e * e;
            x += e * e - bound;
            x2 += (e * e - bound) * (e * e - bound);
            se2 += e * e;
            sb += bound;
            stg += tg;
            scb += kvq_codec_score(cb, qpb, &rvb) - exact;
        }
        kvq_codec_free(c);
        kvq_codec_free(cb);
    }
    const double N = N_PAIRS;
    st.mean = s / N;
    st.se = sqrt((s2 / N - st.mean * st.mean) / N);
    st.excess = x / N;
    st.excess_se = sqrt((x2 / N - st.excess * st.excess) / N);
    st.ratio = se2 / sb;
    st.target = stg / N;
    st.cb_bias = scb / N;
    printf("  %s d=%d S=%s q=%s: mean err %.3g (%.2f se), rel. to <q',r> %.3f%%, tqB-only bias %.3g; "
           "E[err^2]/bound %.4f\n",
           name, d, qk == KVQ_QJL_GAUSS ? "gauss" : "ortho",
           mode == Q_INDEPENDENT ? "indep" : mode == Q_CORRELATED ? "k+noise" : "r-dir", st.mean, st.mean / st.se,
           100 * st.mean / st.target, st.cb_bias, st.ratio);
    return st;
}

/* The plain claim, both kinds of S: random independent (q, k). */
static void test_unbiased_and_variance_random_pairs(void)
{
    static const int dims[] = {128, 96};
    for (int di = 0; di < 2; di++)
        for (int qk = 0; qk < KVQ_QJL_KIND_COUNT; qk++) {
            struct stats st = run_pairs(KVQ_TYPE_TQ3J, dims[di], (enum kvq_qjl_kind)qk, Q_INDEPENDENT, 31 + di);
            CHECKF(fabs(st.mean) <= 3 * st.se, "mean error %.3g is %.1f standard errors", st.mean, st.mean / st.se);
            CHECKF(st.excess <= 3 * st.excess_se, "E[err^2] above the bound by %.3g (se %.3g)", st.excess,
                   st.excess_se);
        }
    /* 1 and 2 bits, Gaussian S: the same claims. */
    for (int t = KVQ_TYPE_TQ1J; t <= KVQ_TYPE_TQ2J; t++) {
        struct stats st = run_pairs((enum kvq_type)t, 64, KVQ_QJL_GAUSS, Q_INDEPENDENT, 33 + t);
        CHECK(fabs(st.mean) <= 3 * st.se);
        CHECK(st.excess <= 3 * st.excess_se);
    }
}

/* Queries correlated with their key, as in attention (independent random
 * pairs cannot reveal a multiplicative bias: the error is odd in q).
 * Gaussian S: unbiased, as the theory says for any fixed (q, k).
 * Orthogonal S: k's codes c and residual r share the sign pattern of
 * y = R k, and a single randomised Hadamard round turns that into a bias of
 * <S q', s~> along c (+3% of the QJL term at d = 128, +5.6% at d = 64,
 * measured). That is why S is KVQ_QJL_ROUNDS = 3 rounds (two left -0.6%):
 * the same strict 3-standard-error claim then holds as for the Gaussian S. */
static void test_correlated_pairs(void)
{
    struct stats g = run_pairs(KVQ_TYPE_TQ3J, 128, KVQ_QJL_GAUSS, Q_CORRELATED, 41);
    CHECKF(fabs(g.mean) <= 3 * g.se, "gauss S: mean error %.3g is %.1f standard errors", g.mean, g.mean / g.se);
    CHECK(g.excess <= 3 * g.excess_se);
    CHECK(g.cb_bias < -10 * g.se); /* the bias QJL is there to remove is clearly visible */
    static const int dims[] = {128, 64};
    for (int di = 0; di < 2; di++) {
        struct stats o = run_pairs(KVQ_TYPE_TQ3J, dims[di], KVQ_QJL_ORTHO, Q_CORRELATED, 42 + di);
        CHECKF(fabs(o.mean) <= 3 * o.se, "ortho S d=%d: mean error %.3g is %.1f standard errors", dims[di],
               o.mean, o.mean / o.se);
        CHECK(o.cb_bias < -10 * o.se);
        CHECK(o.excess <= 3 * o.excess_se);
    }
}

/* q' along the residual: the score's whole error is the QJL term's, and any
 * error in kappa shows as a relative bias. Gaussian S: unbiased with the exact
 * sqrt(pi/2)/d. Orthogonal S: kappa = 1/(d E|v_1|) is exact for a
 * sphere-uniform v = S r/gamma, which three Hadamard rounds make S r (one
 * round left the estimate 0.25% high at d = 128). The 1/(4d) = 0.2% that
 * separates the exact kappa from sqrt(pi/(2d)) is ~14 standard errors here,
 * so the strict check also tells the two constants apart. */
static void test_residual_direction(void)
{
    struct stats g = run_pairs(KVQ_TYPE_TQ3J, 128, KVQ_QJL_GAUSS, Q_RESIDUAL, 51);
    CHECKF(fabs(g.mean) <= 3 * g.se, "gauss S: mean error %.3g is %.1f standard errors", g.mean, g.mean / g.se);
    struct stats o = run_pairs(KVQ_TYPE_TQ3J, 128, KVQ_QJL_ORTHO, Q_RESIDUAL, 52);
    CHECKF(fabs(o.mean) <= 3 * o.se, "ortho S: mean error %.3g is %.1f standard errors (%.3f%% of the target)",
           o.mean, o.mean / o.se, 100 * o.mean / o.target);
    CHECK(o.excess <= 3 * o.excess_se);
}

int main(void)
{
    RUN(test_unbiased_and_variance_random_pairs);
    RUN(test_correlated_pairs);
    RUN(test_residual_direction);
    return TEST_END("test_codec_qjl");
}
