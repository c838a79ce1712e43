/* test_sampler.c - the sampler against a brute-force reference.
 *
 * The reference distribution is computed here from the definition (sort by
 * value with qsort, softmax in long double, cut, renormalise) without any of
 * the library's code; draws are then checked against it with a chi-square
 * test at a 1e-6 false-alarm level, with a fixed seed.
 */
#include <float.h>
#include <stdint.h>

#include "kvq_sampler.h"
#include "kvq_rng.h"
#include "test.h"

#define V_MAX 512

static const float *g_sort_logits;

static int by_value_desc(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    float lx = g_sort_logits[x], ly = g_sort_logits[y];
    if (lx != ly)
        return lx > ly ? -1 : 1;
    return x - y;
}

/* The truncated distribution straight from its definition. */
static void reference_probs(const float *logits, int V, float temp, int top_k, float top_p, double *probs)
{
    int order[V_MAX];
    for (int i = 0; i < V; i++)
        order[i] = i;
    g_sort_logits = logits;
    qsort(order, (size_t)V, sizeof order[0], by_value_desc);
    int n = top_k > 0 && top_k < V ? top_k : V;
    /* Everything tied with the k-th largest value is kept (HF's top-k). */
    while (n < V && logits[order[n]] == logits[order[n - 1]])
        n++;
    long double p[V_MAX], z = 0;
    for (int i = 0; i < n; i++)
        z += p[i] = expl(((long double)logits[order[i]] - logits[order[0]]) / temp);
    int m = n;
    if (top_p < 1.0f) {
        long double cum = 0;
        m = 0;
        while (m < n && cum / z < (long double)top_p)
            cum += p[m++];
        z = cum;
    }
    for (int i = 0; i < V; i++)
        probs[i] = 0;
    for (int i = 0; i < m; i++)
        probs[order[i]] = (double)(p[i] / z);
}

static void random_logits(float *x, int V, uint64_t seed, double scale)
{
    kvq_rng r;
    kvq_rng_init(&r, seed);
    for (int i = 0; i < V; i++)
        x[i] = (float)(scale * kvq_rng_gauss(&r));
}

/* Chi-square critical value at false-alarm probability ~1e-6
 * (Wilson-Hilferty with z = 4.753). */
static double chi2_crit(int df)
{
    double a = 2.0 / (9.0 * df), z = 4.753;
    double t = 1.0 - a + z * sqrt(a);
    return df * t * t * t;
}

/* Draws n tokens and compares the histogram with probs. @return the chi-square
 * statistic over the support; *outside counts draws where probs is 0. */
static double draw_chi2(kvq_sampler *s, const float *logits, int V, const double *probs, int n,
                        int *df, int *outside)
{
    static int count[V_MAX];
    memset(count, 0, sizeof count);
    *outside = 0;
    for (int i = 0; i < n; i++) {
        int32_t t = -1;
        if (kvq_sampler_sample(s, logits, &t) != KVQ_OK || t < 0 || t >= V) {
            (*outside)++;
            continue;
        }
        count[t]++;
    }
    /* Pool cells with expected count < 5 into one, as the test requires. */
    double chi = 0, pooled_e = 0, pooled_o = 0;
    int cells = 0;
    for (int i = 0; i < V; i++) {
        if (probs[i] == 0) {
            *outside += count[i];
            continue;
        }
        double e = probs[i] * n;
        if (e < 5) {
            pooled_e += e;
            pooled_o += count[i];
            continue;
        }
        chi += (count[i] - e) * (count[i] - e) / e;
        cells++;
    }
    if (pooled_e > 0) {
        chi += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
        cells++;
    }
    *df = cells - 1;
    return chi;
}

static void test_greedy_is_argmax(void)
{
    float x[V_MAX];
    kvq_sampler *s;
    kvq_sampler_params p = kvq_sampler_params_default();
    CHECK_OK(kvq_sampler_create(300, &p, &s));
    for (uint64_t seed = 1; seed <= 50; seed++) {
        random_logits(x, 300, seed, 3.0);
        int arg = 0;
        for (int i = 1; i < 300; i++)
            if (x[i] > x[arg])
                arg = i;
        int32_t t;
        CHECK_OK(kvq_sampler_sample(s, x, &t));
        CHECK(t == arg);
    }
    /* Ties go to the smaller id; masked tokens are never chosen. */
    for (int i = 0; i < 300; i++)
        x[i] = -INFINITY;
    x[200] = 1.5f;
    x[17] = 1.5f;
    int32_t t;
    CHECK_OK(kvq_sampler_sample(s, x, &t));
    CHECK(t == 17);
    kvq_sampler_free(s);
}

static void test_argmax_over_slices(void)
{
    float x[V_MAX];
    for (uint64_t seed = 1; seed <= 20; seed++) {
        random_logits(x, 500, seed, 2.0);
        if (seed == 3)
            x[499] = x[10] = 9.0f; /* a tie across slices: the smaller id wins */
        int arg = 0;
        for (int i = 1; i < 500; i++)
            if (x[i] > x[arg])
                arg = i;
        /* Uneven slices, merged in reverse order. */
        const int start[4] = {0, 7, 250, 251}, end[4] = {7, 250, 251, 500};
        kvq_best acc = kvq_best_none();
        for (int k = 3; k >= 0; k--) {
            kvq_best b = kvq_best_none();
            CHECK_OK(kvq_argmax(x + start[k], end[k] - start[k], start[k], &b));
            kvq_best_merge(&acc, b);
        }
        CHECK(acc.token == arg && acc.score == x[arg]);
        if (seed == 3)
            CHECK(acc.token == 10);
    }
    /* A fully masked slice loses to any other. */
    float masked[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, other[2] = {-50.0f, -60.0f};
    kvq_best a = kvq_best_none(), b = kvq_best_none();
    CHECK_OK(kvq_argmax(masked, 4, 0, &a));
    CHECK_OK(kvq_argmax(other, 2, 4, &b));
    kvq_best_merge(&a, b);
    CHECK(a.token == 4);
    float bad[3] = {1.0f, NAN, 2.0f};
    CHECK_STATUS(kvq_argmax(bad, 3, 0, &a), KVQ_ERR_NONFINITE);
    CHECK_STATUS(kvq_argmax(bad, 0, 0, &a), KVQ_ERR_INVALID_ARG);
}

static void test_probs_match_definition(void)
{
    const struct {
        float temp;
        int top_k;
        float top_p;
    } cfg[] = {
        {1.0f, 0, 1.0f}, {0.7f, 0, 1.0f}, {1.3f, 40, 1.0f}, {1.0f, 0, 0.9f},
        {0.8f, 20, 0.75f}, {2.5f, 5, 0.5f}, {1.0f, 1000, 0.999f}, {0.05f, 0, 0.3f},
    };
    float x[V_MAX];
    double got[V_MAX], want[V_MAX];
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        kvq_sampler_params p = {cfg[c].temp, cfg[c].top_k, cfg[c].top_p, 7};
        kvq_sampler *s;
        CHECK_OK(kvq_sampler_create(400, &p, &s));
        for (uint64_t seed = 1; seed <= 5; seed++) {
            random_logits(x, 400, 100 * c + seed, 2.5);
            if (seed == 2) /* ties at the top-k boundary and some masked tokens */
                for (int i = 0; i < 400; i += 7)
                    x[i] = i % 2 ? 1.25f : -INFINITY;
            CHECK_OK(kvq_sampler_probs(s, x, got));
            reference_probs(x, 400, cfg[c].temp, cfg[c].top_k, cfg[c].top_p, want);
            double sum = 0, maxdiff = 0;
            int support_ok = 1;
            for (int i = 0; i < 400; i++) {
                sum += got[i];
                maxdiff = fmax(maxdiff, fabs(got[i] - want[i]));
                support_ok &= (got[i] > 0) == (want[i] > 0);
            }
            CHECKF(maxdiff < 1e-12 && support_ok, "config %zu seed %d: max |diff| %.3g, support %s", c,
                   (int)seed, maxdiff, support_ok ? "same" : "differs");
            CHECK_NEAR(sum, 1.0, 1e-12);
        }
        kvq_sampler_free(s);
    }
}

static void test_top_k_keeps_ties(void)
{
    /* The 3rd largest logit is tied three ways: top-k 3 keeps all five tokens
     * with logit >= 3, renormalised: weights e^2, e^1, e^0 x 3. */
    float x[8] = {1.0f, 3.0f, 5.0f, 3.0f, -INFINITY, 4.0f, 3.0f, 0.5f};
    kvq_sampler_params p = {1.0f, 3, 1.0f, 1};
    kvq_sampler *s;
    CHECK_OK(kvq_sampler_create(8, &p, &s));
    double got[8];
    CHECK_OK(kvq_sampler_probs(s, x, got));
    double z = exp(2.0) + exp(1.0) + 3.0;
    const double want[8] = {0, 1 / z, exp(2.0) / z, 1 / z, 0, exp(1.0) / z, 1 / z, 0};
    for (int i = 0; i < 8; i++)
        CHECK_NEAR(got[i], want[i], 1e-15);
    /* Top-p over the same order: 0.7 needs e^2 and e^1 (mass before the 3rd
     * token is (e^2 + e)/z = 0.89 >= 0.7), so the tied tokens go. */
    p.top_p = 0.7f;
    CHECK_OK(kvq_sampler_set_params(s, &p));
    CHECK_OK(kvq_sampler_probs(s, x, got));
    CHECK_NEAR(got[2], exp(2.0) / (exp(2.0) + exp(1.0)), 1e-15);
    CHECK_NEAR(got[5], exp(1.0) / (exp(2.0) + exp(1.0)), 1e-15);
    CHECK(got[1] == 0 && got[3] == 0 && got[6] == 0);
    kvq_sampler_free(s);
}

static void test_draws_follow_distribution(void)
{
    const struct {
        float temp;
        int top_k;
        float top_p;
    } cfg[] = {{1.0f, 0, 1.0f}, {0.8f, 20, 0.9f}, {1.5f, 0, 0.6f}, {0.6f, 8, 1.0f}};
    float x[V_MAX];
    double want[V_MAX], untruncated[V_MAX];
    const int V = 64, N = 200000;
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        random_logits(x, V, 900 + c, 1.5);
        kvq_sampler_params p = {cfg[c].temp, cfg[c].top_k, cfg[c].top_p, 1234 + c};
        kvq_sampler *s;
        CHECK_OK(kvq_sampler_create(V, &p, &s));
        reference_probs(x, V, cfg[c].temp, cfg[c].top_k, cfg[c].top_p, want);
        int df, outside;
        double chi = draw_chi2(s, x, V, want, N, &df, &outside);
        CHECKF(chi < chi2_crit(df) && outside == 0, "config %zu: chi2 %.1f (df %d, limit %.1f), %d outside",
               c, chi, df, chi2_crit(df), outside);
        /* The same draws judged against the wrong law (temperature 1, no cuts)
         * must fail, or this test could not tell. */
        if (cfg[c].temp != 1.0f || cfg[c].top_k || cfg[c].top_p < 1.0f) {
            reference_probs(x, V, 1.0f, 0, 1.0f, untruncated);
            kvq_sampler_reset(s);
            double chi_wrong = draw_chi2(s, x, V, untruncated, N, &df, &outside);
            CHECKF(chi_wrong > chi2_crit(df), "config %zu: the wrong law passes (%.1f)", c, chi_wrong);
        }
        kvq_sampler_free(s);
    }
}

static void test_seed_determinism(void)
{
    float x[V_MAX];
    random_logits(x, 100, 5, 1.0);
    kvq_sampler_params p = {1.0f, 0, 0.95f, 42};
    kvq_sampler *a, *b;
    CHECK_OK(kvq_sampler_create(100, &p, &a));
    CHECK_OK(kvq_sampler_create(100, &p, &b));
    int32_t first[64];
    int same = 1;
    for (int i = 0; i < 64; i++) {
        int32_t ta, tb;
        CHECK_OK(kvq_sampler_sample(a, x, &ta));
        CHECK_OK(kvq_sampler_sample(b, x, &tb));
        first[i] = ta;
        same &= ta == tb;
    }
    CHECK(same);
    /* reset replays the sequence; another seed gives another one. */
    kvq_sampler_reset(a);
    int replay = 1, differs = 0;
    for (int i = 0; i < 64; i++) {
        int32_t t;
        CHECK_OK(kvq_sampler_sample(a, x, &t));
        replay &= t == first[i];
    }
    CHECK(replay);
    p.seed = 43;
    CHECK_OK(kvq_sampler_set_params(b, &p));
    for (int i = 0; i < 64; i++) {
        int32_t t;
        CHECK_OK(kvq_sampler_sample(b, x, &t));
        differs |= t != first[i];
    }
    CHECK(differs);
    kvq_sampler_free(a);
    kvq_sampler_free(b);
}

static void test_degenerate_cuts_are_greedy(void)
{
    float x[V_MAX];
    const kvq_sampler_params ps[] = {
        {1.0f, 1, 1.0f, 3},    /* top-k 1 */
        {2.0f, 0, 1e-6f, 4},   /* top-p tiny */
        {0.9f, 50, 1e-7f, 5},  /* both */
    };
    for (size_t c = 0; c < sizeof ps / sizeof ps[0]; c++) {
        kvq_sampler *s;
        CHECK_OK(kvq_sampler_create(256, &ps[c], &s));
        int ok = 1;
        for (uint64_t seed = 1; seed <= 200; seed++) {
            random_logits(x, 256, seed, 0.5);
            kvq_best b = kvq_best_none();
            CHECK_OK(kvq_argmax(x, 256, 0, &b));
            int32_t t;
            CHECK_OK(kvq_sampler_sample(s, x, &t));
            ok &= t == b.token;
        }
        CHECKF(ok, "config %zu is not greedy", c);
        kvq_sampler_free(s);
    }
}

static void test_bad_input(void)
{
    kvq_sampler *s = NULL;
    kvq_sampler_params p = {-0.5f, 0, 1.0f, 0};
    CHECK_STATUS(kvq_sampler_create(10, &p, &s), KVQ_ERR_INVALID_ARG);
    CHECK(s == NULL);
    p.temperature = NAN;
    CHECK_STATUS(kvq_sampler_params_check(&p), KVQ_ERR_INVALID_ARG);
    p.temperature = INFINITY;
    CHECK_STATUS(kvq_sampler_params_check(&p), KVQ_ERR_INVALID_ARG);
    p.temperature = 1.0f;
    p.top_p = 0.0f;
    CHECK_STATUS(kvq_sampler_params_check(&p), KVQ_ERR_INVALID_ARG);
    p.top_p = 1.5f;
    CHECK_STATUS(kvq_sampler_params_check(&p), KVQ_ERR_INVALID_ARG);
    p.top_p = 1.0f;
    p.top_k = -1;
    CHECK_STATUS(kvq_sampler_params_check(&p), KVQ_ERR_INVALID_ARG);
    p.top_k = 0;
    CHECK_STATUS(kvq_sampler_create(0, &p, &s), KVQ_ERR_INVALID_ARG);
    CHECK_OK(kvq_sampler_create(10, &p, &s));
    kvq_sampler_params bad = p;
    bad.temperature = -1.0f;
    CHECK_STATUS(kvq_sampler_set_params(s, &bad), KVQ_ERR_INVALID_ARG);
    CHECK(kvq_sampler_get_params(s).temperature == 1.0f);

    float x[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    double probs[10];
    int32_t t;
    /* A NaN or +Inf logit: a clear error, and the RNG does not move. */
    kvq_sampler_params p2 = p;
    kvq_sampler *ref;
    CHECK_OK(kvq_sampler_create(10, &p2, &ref));
    x[4] = NAN;
    CHECK_STATUS(kvq_sampler_sample(s, x, &t), KVQ_ERR_NONFINITE);
    CHECK(t == -1);
    CHECK_STATUS(kvq_sampler_probs(s, x, probs), KVQ_ERR_NONFINITE);
    x[4] = INFINITY;
    CHECK_STATUS(kvq_sampler_sample(s, x, &t), KVQ_ERR_NONFINITE);
    x[4] = 4;
    int32_t t_ref;
    CHECK_OK(kvq_sampler_sample(s, x, &t));
    CHECK_OK(kvq_sampler_sample(ref, x, &t_ref));
    CHECK(t == t_ref);
    for (int i = 0; i < 10; i++)
        x[i] = -INFINITY;
    CHECK_STATUS(kvq_sampler_sample(s, x, &t), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_sampler_sample(s, NULL, &t), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_sampler_sample(NULL, x, &t), KVQ_ERR_INVALID_ARG);
    kvq_sampler_free(s);
    kvq_sampler_free(ref);
    kvq_sampler_free(NULL);
}

int main(void)
{
    RUN(test_greedy_is_argmax);
    RUN(test_argmax_over_slices);
    RUN(test_probs_match_definition);
    RUN(test_top_k_keeps_ties);
    RUN(test_draws_follow_distribution);
    RUN(test_seed_determinism);
    RUN(test_degenerate_cuts_are_greedy);
    RUN(test_bad_input);
    return TEST_END("test_sampler");
}
