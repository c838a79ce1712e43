/* test_attn.c - fused decode attention against (a) exact double-precision
 * attention on the unquantized data, to show the remaining error is the
 * quantization's; (b) analytic cases; plus causal attention, bad input and
 * workspace limits. Every kernel set (scalar, AVX2, AVX-512) and causal
 * chunks against the dequantize-then-attend reference, for every K/V type
 * pair: test_backend_ops (ops attn, causal). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_internal.h"
#include "kvq_cpu.h"
#include "kvq_attn.h"
#include "kvq_rng.h"
#include "test.h"

#define H 2 /* KV heads in every test cache; tests use head 1 */

static float *random_rows(size_t n, int d, uint64_t seed, double outlier)
{
    float *x = malloc(n * (size_t)d * sizeof *x);
    kvq_rng rng;
    kvq_rng_init(&rng, seed);
    for (size_t i = 0; i < n * (size_t)d; i++) {
        int j = (int)(i % (size_t)d);
        double s = (j == 5 || j == d - 3) ? outlier : 1.0;
        x[i] = (float)(s * kvq_rng_gauss(&rng));
    }
    return x;
}

struct fixture {
    kvq_cache *c;
    float *k, *v; /* [N][H][d], what was appended */
    size_t n;
    int d;
};

static int fixture_make(struct fixture *f, enum kvq_type tk, enum kvq_type tv, int d, size_t n, int page_tokens,
                        uint64_t seed)
{
    struct kvq_cache_config cfg;
    kvq_cache_config_default(&cfg, H, d, n);
    cfg.type_k = tk;
    cfg.type_v = tv;
    cfg.seed = seed;
    cfg.page_tokens = page_tokens;
    f->c = NULL;
    f->n = n;
    f->d = d;
    f->k = random_rows(n * H, d, seed * 3 + 1, 8.0);
    f->v = random_rows(n * H, d, seed * 3 + 2, 3.0);
    kvq_status st = kvq_cache_create(&cfg, &f->c);
    if (st == KVQ_OK)
        st = kvq_cache_append(f->c, n, f->k, f->v);
    CHECKF(st == KVQ_OK, "cache %s/%s d=%d: %s", kvq_type_traits(tk)->name, kvq_type_traits(tv)->name, d,
           kvq_status_str(st));
    return st == KVQ_OK;
}

static void fixture_free(struct fixture *f)
{
    kvq_cache_free(f->c);
    free(f->k);
    free(f->v);
}

/* Exact softmax(scale q.k) v over the unquantized rows of head h, in double. */
static void exact_attention(const struct fixture *f, int h, size_t n_ctx, const float *q, int n_q, float scale,
                            float *out)
{
    const int d = f->d;
    double *s = malloc(n_ctx * sizeof *s), *acc = malloc((size_t)d * sizeof *acc);
    for (int a = 0; a < n_q; a++) {
        const float *qa = q + (size_t)a * d;
        double m = -INFINITY, l = 0.0;
        for (size_t i = 0; i < n_ctx; i++) {
            const float *k = f->k + (i * H + (size_t)h) * (size_t)d;
            double t = 0.0;
            for (int j = 0; j < d; j++)
                t += (double)qa[j] * k[j];
            s[i] = (double)scale * t;
            m = s[i] > m ? s[i] : m;
        }
        memset(acc, 0, (size_t)d * sizeof *acc);
        for (size_t i = 0; i < n_ctx; i++) {
            double w = exp(s[i] - m);
            const float *v = f->v + (i * H + (size_t)h) * (size_t)d;
            l += w;
            for (int j = 0; j < d; j++)
                acc[j] += w * v[j];
        }
        for (int j = 0; j < d; j++)
            out[(size_t)a * d + j] = (float)(acc[j] / l);
    }
    free(s);
    free(acc);
}

static double rel_err(const float *a, const float *b, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - (double)b[i];
        num += e * e;
        den += (double)b[i] * b[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

/* Against exact attention on the data before quantization: f32 is exact, and
 * the other types' errors grow as their bits shrink. */
static void test_error_is_quantization(void)
{
    const int d = 128, n_q = 4;
    const size_t n = 1000;
    const float scale = 1.0f / sqrtf((float)d);
    kvq_attn_workspace *ws = NULL;
    CHECK_OK(kvq_attn_workspace_create(d, n_q, n, &ws));
    const enum kvq_type types[][2] = {
        {KVQ_TYPE_F32, KVQ_TYPE_F32}, {KVQ_TYPE_F16, KVQ_TYPE_F16}, {KVQ_TYPE_Q8_0, KVQ_TYPE_Q8_0},
        {KVQ_TYPE_Q4_0, KVQ_TYPE_Q4_0}, {KVQ_TYPE_TQ4J, KVQ_TYPE_TQ4}, {KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3},
        {KVQ_TYPE_TQ2J, KVQ_TYPE_TQ2}, {KVQ_TYPE_TQ1J, KVQ_TYPE_TQ1},
    };
    double err[8];
    float *out = malloc((size_t)n_q * d * sizeof *out), *ex = malloc((size_t)n_q * d * sizeof *ex);
    for (int t = 0; t < 8; t++) {
        struct fixture f;
        err[t] = NAN;
        if (!fixture_make(&f, types[t][0], types[t][1], d, n, 0, 77)) /* same data for every type */
            continue;
        double sum = 0.0;
        for (int rep = 0; rep < 4; rep++) {
            float *q = random_rows(n_q, d, 1000u + (uint64_t)rep, 4.0);
            CHECK_OK(kvq_attn_decode(f.c, 1, n, q, n_q, scale, out, ws));
            exact_attention(&f, 1, n, q, n_q, scale, ex);
            sum += rel_err(out, ex, (size_t)n_q * d);
            free(q);
        }
        err[t] = sum / 4;
        fixture_free(&f);
    }
    CHECKF(err[0] <= 1e-6, "f32 cache vs exact: %.3g", err[0]);
    /* f16 keeps 11 significant bits, q8_0 about 8 per block: f16 is far closer */
    CHECKF(err[1] > err[0] && err[1] < err[2] / 4, "f16 vs exact: %.3g (q8_0 %.3g)", err[1], err[2]);
    CHECKF(err[2] > err[1] && err[3] > err[2], "f16 %.3g q8_0 %.3g q4_0 %.3g", err[1], err[2], err[3]);
    CHECKF(err[5] > err[4] && err[6] > err[5] && err[7] > err[6], "tq4 %.3g tq3 %.3g tq2 %.3g tq1 %.3g", err[4],
           err[5], err[6], err[7]);
    printf("  rel. error vs exact attention (d=128, 1000 tokens): f32 %.2g f16 %.2g q8_0 %.2g q4_0 %.2g "
           "tq4j/tq4 %.2g tq3j/tq3 %.2g tq2j/tq2 %.2g tq1j/tq1 %.2g\n",
           err[0], err[1], err[2], err[3], err[4], err[5], err[6], err[7]);
    free(out);
    free(ex);
    kvq_attn_workspace_free(ws);
}

/* Analytic: equal keys give equal weights, so the output is the mean of the
 * decoded values; one dominant key gives its own value. */
static void test_analytic(void)
{
    const int d = 128, n = 100;
    struct kvq_cache_config cfg;
    kvq_cache_config_default(&cfg, H, d, (size_t)n);
    kvq_cache *c = NULL;
    CHECK_OK(kvq_cache_create(&cfg, &c));
    float *k = random_rows((size_t)n * H, d, 61, 1.0), *v = random_rows((size_t)n * H, d, 62, 1.0);
    for (int i = 1; i < n; i++) /* head 1: the same key everywhere */
        memcpy(k + ((size_t)i * H + 1) * d, k + d, (size_t)d * sizeof(float)); /* token 0, head 1 */
    CHECK_OK(kvq_cache_append(c, (size_t)n, k, v));
    float *dec = malloc((size_t)n * d * sizeof *dec), mean[128], out[2 * 128], q[2 * 128];
    CHECK_OK(kvq_cache_read(c, 1, 0, (size_t)n, NULL, dec));
    for (int j = 0; j < d; j++) {
        double s = 0.0;
        for (int i = 0; i < n; i++)
            s += dec[(size_t)i * d + j];
        mean[j] = (float)(s / n);
    }
    kvq_attn_workspace *ws = NULL;
    CHECK_OK(kvq_attn_workspace_create(d, 2, (size_t)n, &ws));
    float *qq = random_rows(2, d, 63, 1.0);
    memcpy(q, qq, sizeof q);
    CHECK_OK(kvq_attn_decode(c, 1, (size_t)n, q, 2, 0.1f, out, ws));
    CHECKF(rel_err(out, mean, (size_t)d) <= 1e-6, "equal keys: %.3g", rel_err(out, mean, (size_t)d));
    CHECKF(rel_err(out + d, mean, (size_t)d) <= 1e-6, "equal keys: %.3g", rel_err(out + d, mean, (size_t)d));

    /* head 0, query along key 37 with a huge scale: all weight on key 37 */
    float *kd = malloc((size_t)n * d * sizeof *kd);
    CHECK_OK(kvq_cache_read(c, 0, 0, (size_t)n, kd, dec));
    memcpy(q, kd + 37 * d, (size_t)d * sizeof(float));
    CHECK_OK(kvq_attn_decode(c, 0, (size_t)n, q, 1, 50.0f, out, ws));
    CHECKF(rel_err(out, dec + 37 * d, (size_t)d) <= 1e-6, "dominant key: %.3g", rel_err(out, dec + 37 * d, (size_t)d));
    free(qq);
    free(kd);
    free(dec);
    free(k);
    free(v);
    kvq_attn_workspace_free(ws);
    kvq_cache_free(c);
}

static void test_causal(void)
{
    const int d = 128, n_q = 2;
    struct fixture f;
    if (!fixture_make(&f, KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, d, 140, 0, 71))
        return;
    kvq_attn_workspace *ws = NULL;
    CHECK_OK(kvq_attn_workspace_create(d, n_q, 140, &ws));
    const size_t pos0 = 50, T = 80; /* up to token 129, across two page boundaries */
    float *q = random_rows(T * n_q, d, 72, 4.0);
    float *out = malloc(T * n_q * d * sizeof *out);
    const float scale = 1.0f / sqrtf((float)d);
    CHECK_OK(kvq_attn_causal(f.c, 1, pos0, T, q, n_q, scale, out, ws)); /* vs the reference: test_backend_ops */
    /* the first position sees only token 0 */
    CHECK_OK(kvq_attn_causal(f.c, 1, 0, 1, q, n_q, scale, out, ws));
    float v0[128];
    CHECK_OK(kvq_cache_read(f.c, 1, 0, 1, NULL, v0));
    CHECK(rel_err(out, v0, (size_t)d) <= 1e-6 && rel_err(out + d, v0, (size_t)d) <= 1e-6);
    CHECK_STATUS(kvq_attn_causal(f.c, 1, 100, 41, q, n_q, scale, out, ws), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_attn_causal(f.c, 1, 0, 0, q, n_q, scale, out, ws), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_attn_causal(f.c, 1, SIZE_MAX, 2, q, n_q, scale, out, ws), KVQ_ERR_INVALID_ARG);
    q[(T - 1) * n_q * d] = NAN;
    CHECK_STATUS(kvq_attn_causal(f.c, 1, pos0, T, q, n_q, scale, out, ws), KVQ_ERR_NONFINITE);
    free(q);
    free(out);
    kvq_attn_workspace_free(ws);
    fixture_free(&f);
}

static void test_bad_args_and_workspace(void)
{
    kvq_attn_workspace *ws = NULL;
    CHECK_STATUS(kvq_attn_workspace_create(0, 2, 10, &ws), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_attn_workspace_create(128, 0, 10, &ws), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_attn_workspace_create(128, 2, 0, &ws), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_attn_workspace_create(128, 2, 10, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_attn_workspace_create(KVQ_MAX_DIM + 8, 2, 10, &ws), KVQ_ERR_UNSUPPORTED);
    CHECK_STATUS(kvq_attn_workspace_create(128, KVQ_ATTN_MAX_Q + 1, 10, &ws), KVQ_ERR_UNSUPPORTED);
    CHECK(ws == NULL);
    kvq_attn_workspace_free(NULL);

    const int d = 128;
    struct fixture f;
    if (!fixture_make(&f, KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, d, 100, 0, 81))
        return;
    CHECK_OK(kvq_attn_workspace_create(d, 2, 80, &ws));
    kvq_attn_workspace *ws64 = NULL, *big = NULL;
    CHECK_OK(kvq_attn_workspace_create(64, 2, 100, &ws64));
    CHECK_OK(kvq_attn_workspace_create(d, 2, 200, &big));
    float q[4 * 128], out[4 * 128];
    float *qq = random_rows(4, d, 82, 1.0);
    memcpy(q, qq, sizeof q);
    free(qq);
    const float s = 0.1f;
    for (int ref = 0; ref < 2; ref++) {
        kvq_status (*fn)(const kvq_cache *, int, size_t, const float *, int, float, float *, kvq_attn_workspace *) =
            ref ? kvq_attn_decode_ref : kvq_attn_decode;
        CHECK_OK(fn(f.c, 1, 80, q, 2, s, out, ws));
        CHECK_STATUS(fn(NULL, 1, 10, q, 2, s, out, ws), KVQ_ERR_INVALID_ARG);
        CHECK_STATUS(fn(f.c, 1, 10, NULL, 2, s, out, ws), KVQ_ERR_INVALID_ARG);
        CHECK_STATUS(fn(f.c, 1, 10, q, 2, s, NULL, ws), KVQ_ERR_INVALID_ARG);
        CHECK_STATUS(fn(f.c, 1, 10, q, 2, s, out, NULL), KVQ_ERR_INVALID_ARG);
        CHECK_STATUS(fn(f.c, -1, 10, q, 2, s, out, ws), KVQ_ERR_INVALID_ARG);
        CHECK_STATUS(fn(f.c, H, 10, q, 2, s, out, ws), KVQ_ERR_INVALID_ARG);
        CHECK_STATUS(fn(f.c, 1, 0, q, 2, s, out, ws), KVQ_ERR_INVALID_ARG);
        CHECK_STATUS(fn(f.c, 1, 81, q, 2, s, out, ws), KVQ_ERR_INVALID_ARG);   /* beyond the workspace */
        CHECK_STATUS(fn(f.c, 1, 101, q, 2, s, out, big), KVQ_ERR_INVALID_ARG);  /* beyond the cache */
        CHECK_STATUS(fn(f.c, 1, 10, q, 3, s, out, ws), KVQ_ERR_INVALID_ARG);   /* more heads than the workspace */
        CHECK_STATUS(fn(f.c, 1, 10, q, 0, s, out, ws), KVQ_ERR_INVALID_ARG);
        CHECK_STATUS(fn(f.c, 1, 10, q, 2, s, out, ws64), KVQ_ERR_INVALID_ARG); /* workspace for d = 64 */
        q[d + 17] = NAN;
        CHECK_STATUS(fn(f.c, 1, 10, q, 2, s, out, ws), KVQ_ERR_NONFINITE);
        q[d + 17] = INFINITY;
        CHECK_STATUS(fn(f.c, 1, 10, q, 2, s, out, ws), KVQ_ERR_NONFINITE);
        q[d + 17] = 0.5f;
        /* a scale that is not a number is a bad argument, not an answer */
        CHECK_STATUS(fn(f.c, 1, 10, q, 2, NAN, out, ws), KVQ_ERR_INVALID_ARG);
        CHECK_STATUS(fn(f.c, 1, 10, q, 2, INFINITY, out, ws), KVQ_ERR_INVALID_ARG);
        CHECK_STATUS(fn(f.c, 1, 10, q, 2, -INFINITY, out, ws), KVQ_ERR_INVALID_ARG);
        CHECK_OK(fn(f.c, 1, 10, q, 2, 0.0f, out, ws)); /* 0 is finite: uniform weights */
        CHECK_OK(fn(f.c, 1, 10, q, 2, -s, out, ws));
    }
    CHECK_STATUS(kvq_attn_causal(f.c, 1, 0, 4, q, 1, NAN, out, ws), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_attn_causal(f.c, 1, 0, 4, q, 1, INFINITY, out, ws), KVQ_ERR_INVALID_ARG);
    /* the same call twice gives the same bits; head 0 differs from head 1 */
    float a[2 * 128], b[2 * 128];
    CHECK_OK(kvq_attn_decode(f.c, 1, 80, q, 2, s, a, ws));
    CHECK_OK(kvq_attn_decode(f.c, 1, 80, q, 2, s, b, ws));
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK_OK(kvq_attn_decode(f.c, 0, 80, q, 2, s, b, ws));
    CHECK(memcmp(a, b, sizeof a) != 0);
    kvq_attn_workspace_free(ws);
    kvq_attn_workspace_free(ws64);
    kvq_attn_workspace_free(big);
    fixture_free(&f);
}

int main(void)
{
    printf("  simd kernels: %s\n", kvq_attn_avx512_usable() ? "avx2 + avx512" : kvq_cpu_has_avx2() ? "avx2" : "none (scalar only)");
    RUN(test_bad_args_and_workspace);
    RUN(test_analytic);
    RUN(test_causal);
    RUN(test_error_is_quantization);
    return TEST_END("test_attn");
}
