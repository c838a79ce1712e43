/* test_eval.c - kvq eval: metrics against brute force and analytic values,
 * bits against the cache's real bytes, determinism, and bad input. */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "test_util.h"

#include "eval_output.h"
#include "eval_spec.h"
#include "kvq_attn.h"
#include "kvq_cache.h"
#include "kvq_codebook.h"
#include "kvq_codec.h"
#include "kvq_eval.h"
#include "kvq_half.h"
#include "kvq_safetensors.h"

int cmd_eval(int argc, char **argv);

static char tmpdir[64];

/* Paths in the test's temporary directory; each call gets its own slot and
 * the slots are never reused (a test needs only a handful). */
static const char *tmp_path(const char *name)
{
    static char buf[64][256];
    static int k;
    if (k == 64)
        abort();
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k++];
}

/* Runs `kvq eval ARGS...` with stdout discarded and stderr captured. */
static int run_eval(char *errbuf, size_t errlen, int argc, const char **args)
{
    char *argv[64];
    argv[0] = (char *)"eval";
    for (int i = 0; i < argc && i < 62; i++)
        argv[i + 1] = (char *)args[i];
    argv[argc + 1] = NULL;
    return test_run_captured_buf(cmd_eval, argc + 1, argv, NULL, 0, errbuf, errlen);
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* An error run: nonzero exit, exactly one line, "kvq eval: error: ...",
 * mentioning `what`. */
static void expect_error(const char *what, int argc, const char **args)
{
    char err[2048];
    int rc = run_eval(err, sizeof err, argc, args);
    CHECKF(rc != 0, "%s: exit status 0", what);
    CHECKF(count_lines(err) == 1, "%s: %d stderr lines: %s", what, count_lines(err), err);
    CHECKF(strncmp(err, "kvq eval: error: ", 17) == 0, "%s: stderr: %s", what, err);
    CHECKF(strstr(err, what) != NULL, "'%s' not in: %s", what, err);
}

static int files_equal(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int eq = fa && fb;
    while (eq) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb)
            eq = 0;
        if (ca == EOF || cb == EOF)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return eq;
}

/* ---- configuration lists ----------------------------------------------- */

static void test_spec_parse(void)
{
    struct kvq_eval_config def, c[8];
    kvq_eval_config_default(&def);
    size_t n = 0;
    kvq_error err;
    CHECK_OK(eval_spec_parse("k=tq3j:v=tq3,q8_0,k=tq3j:v=tq3:qjl=gauss:seed=7,k=tq2:v=f16:rot=dct", &def, c, 8, &n,
                             &err));
    CHECK(n == 4);
    CHECK(c[0].type_k == KVQ_TYPE_TQ3J && c[0].type_v == KVQ_TYPE_TQ3 && c[0].qjl == KVQ_QJL_ORTHO);
    CHECK(strcmp(c[0].label, "tq3j/tq3") == 0);
    CHECK(c[1].type_k == KVQ_TYPE_Q8_0 && c[1].type_v == KVQ_TYPE_Q8_0);
    CHECK(strcmp(c[1].label, "q8_0/q8_0") == 0);
    CHECK(c[2].qjl == KVQ_QJL_GAUSS && c[2].seed == 7);
    CHECKF(strcmp(c[2].label, "tq3j/tq3+gauss+s7") == 0, "%s", c[2].label);
    CHECK(c[3].rot == KVQ_ROT_DCT);
    CHECKF(strcmp(c[3].label, "tq2/f16+dct") == 0, "%s", c[3].label);
    static const char *bad[] = {"", "k=tq9:v=tq3", "k=tq3", "k=tq3:v=tq3:foo=1", "tq3,,tq4", "k=tq3:v=tq3:qjl=x",
                                "k=tq3:v=tq3:rot=gauss", "k=tq3:v=tq3:seed=-1", "k=:v=tq3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = '\0';
        CHECKF(eval_spec_parse(bad[i], &def, c, 8, &n, &err) == KVQ_ERR_INVALID_ARG, "'%s' accepted", bad[i]);
        CHECKF(err.msg[0] != '\0', "no message for '%s'", bad[i]);
    }
    CHECK(strstr((eval_spec_parse("k=tq9:v=tq3", &def, c, 8, &n, &err), err.msg), "tq9") != NULL);
}

static void test_sweep_grid(void)
{
    struct kvq_eval_config def, c[KVQ_EVAL_MAX_CONFIGS];
    kvq_eval_config_default(&def);
    size_t n = kvq_eval_sweep_default(&def, c, KVQ_EVAL_MAX_CONFIGS);
    CHECK(n > 20);
    CHECK(c[0].type_k == KVQ_TYPE_F32 && c[0].type_v == KVQ_TYPE_F32);
    CHECK(kvq_eval_ensure_floor(&def, c, n, KVQ_EVAL_MAX_CONFIGS) == n);
    const enum kvq_type want[][2] = {
        {KVQ_TYPE_F16, KVQ_TYPE_F16},   {KVQ_TYPE_Q8_0, KVQ_TYPE_Q8_0}, {KVQ_TYPE_Q4_0, KVQ_TYPE_Q4_0},
        {KVQ_TYPE_TQ1, KVQ_TYPE_TQ1},   {KVQ_TYPE_TQ2, KVQ_TYPE_TQ2},   {KVQ_TYPE_TQ3, KVQ_TYPE_TQ3},
        {KVQ_TYPE_TQ4, KVQ_TYPE_TQ4},   {KVQ_TYPE_TQ1J, KVQ_TYPE_TQ1},  {KVQ_TYPE_TQ2J, KVQ_TYPE_TQ2},
        {KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3},  {KVQ_TYPE_TQ4J, KVQ_TYPE_TQ4},  {KVQ_TYPE_Q8_0, KVQ_TYPE_TQ3},
        {KVQ_TYPE_Q8_0R, KVQ_TYPE_Q8_0R}, {KVQ_TYPE_Q4_0R, KVQ_TYPE_Q4_0R},
        {KVQ_TYPE_Q4_1R, KVQ_TYPE_Q4_1R}, {KVQ_TYPE_Q5_0R, KVQ_TYPE_Q5_0R}, {KVQ_TYPE_Q5_1R, KVQ_TYPE_Q5_1R},
    };
    for (size_t w = 0; w < sizeof want / sizeof want[0]; w++) {
        int found = 0;
        for (size_t i = 0; i < n; i++)
            found += c[i].type_k == want[w][0] && c[i].type_v == want[w][1];
        CHECKF(found == 1, "pair %d/%d found %d times", (int)want[w][0], (int)want[w][1], found);
    }
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            CHECKF(strcmp(c[i].label, c[j].label) != 0, "duplicate %s", c[i].label);
    /* A list without the floor gets it in front. */
    size_t m = 0;
    kvq_error err;
    CHECK_OK(eval_spec_parse("tq3,q4_0", &def, c, KVQ_EVAL_MAX_CONFIGS, &m, &err));
    CHECK(kvq_eval_ensure_floor(&def, c, m, KVQ_EVAL_MAX_CONFIGS) == 3);
    CHECK(c[0].type_k == KVQ_TYPE_F32 && c[1].type_k == KVQ_TYPE_TQ3 && c[2].type_k == KVQ_TYPE_Q4_0);
}

/* ---- storage accounting ------------------------------------------------ */

/* The bits eval reports must be what the cache really allocates: fill whole
 * pages and compare with bytes_allocated. */
static void test_bits_match_cache(void)
{
    struct kvq_eval_config def, c[KVQ_EVAL_MAX_CONFIGS];
    kvq_eval_config_default(&def);
    size_t n = kvq_eval_sweep_default(&def, c, KVQ_EVAL_MAX_CONFIGS);
    const int dims[] = {128, 96, 64};
    const int kvh = 2;
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const int d = dims[di];
        for (size_t i = 0; i < n; i++) {
            struct kvq_eval_cost cost;
            if (kvq_eval_cost_of(&c[i], d, &cost) != KVQ_OK) {
                CHECKF(kvq_type_check_dim(c[i].type_k, d) || kvq_type_check_dim(c[i].type_v, d),
                       "%s d=%d: no cost but both types accept d", c[i].label, d);
                continue;
            }
            struct kvq_cache_config cc;
            const size_t tokens = 3 * KVQ_DEFAULT_PAGE_TOKENS;
            kvq_cache_config_default(&cc, kvh, d, tokens);
            cc.type_k = c[i].type_k;
            cc.type_v = c[i].type_v;
            kvq_cache *cache = NULL;
            CHECK_OK(kvq_cache_create(&cc, &cache));
            if (!cache)
                continue;
            float *x = malloc(tokens * (size_t)kvh * (size_t)d * sizeof(float));
            for (size_t j = 0; j < tokens * (size_t)kvh * (size_t)d; j++)
                x[j] = (float)((j * 7919u) % 23u) - 11.0f;
            CHECK_OK(kvq_cache_append(cache, tokens, x, x));
            struct kvq_cache_stats st;
            kvq_cache_get_stats(cache, &st);
            double want_bytes = cost.bits * 2.0 * d * (double)tokens * kvh / 8.0;
            CHECKF(fabs((double)st.bytes_allocated - want_bytes) < 0.5, "%s d=%d: %zu bytes allocated, eval says %.1f",
                   c[i].label, d, st.bytes_allocated, want_bytes);
            CHECK(st.bytes_f16 > 0 && fabs((double)st.bytes_f16 / (double)st.bytes_allocated - cost.ratio_f16) < 1e-9);
            free(x);
            kvq_cache_free(cache);
        }
    }
    /* The field's anchor: tq3j/tq3 at d = 128 is 118 bytes per token-head. */
    struct kvq_eval_config t = def;
    t.type_k = KVQ_TYPE_TQ3J;
    t.type_v = KVQ_TYPE_TQ3;
    struct kvq_eval_cost cost;
    CHECK_OK(kvq_eval_cost_of(&t, 128, &cost));
    CHECK(cost.row_k + cost.row_v == 118);
    CHECK_NEAR(cost.bits_k, 4.25, 1e-12);
    CHECK_NEAR(cost.bits_v, 3.125, 1e-12);
}

/* ---- metrics ------------------------------------------------------------ */

static struct kvq_eval_sums run_cfg(const struct kvq_eval_data *d, const char *spec, size_t max_q)
{
    struct kvq_eval_config def, c[4];
    kvq_eval_config_default(&def);
    size_t n = 0;
    kvq_error err;
    struct kvq_eval_sums total, s;
    memset(&total, 0, sizeof total);
    CHECK_OK(eval_spec_parse(spec, &def, c, 4, &n, &err));
    kvq_eval_ctx *ctx = NULL;
    CHECK_OK(kvq_eval_ctx_create(d, max_q, &ctx, &err));
    if (!ctx || n != 1)
        return total;
    for (int l = 0; l < d->n_layers; l++) {
        CHECK_OK(kvq_eval_ctx_set_layer(ctx, l, &err));
        CHECK_OK(kvq_eval_ctx_run(ctx, &c[0], &s, &err));
        kvq_eval_sums_add(&total, &s);
    }
    kvq_eval_ctx_free(ctx);
    return total;
}

/* Synthetic data of the default heads (4 query, 2 kv) and outliers. */
static void synth(struct kvq_eval_data *d, int n_layers, size_t n_tokens, size_t n_queries, int head_dim)
{
    struct kvq_eval_synth_config sc;
    kvq_eval_synth_config_default(&sc);
    sc.n_layers = n_layers;
    sc.n_tokens = n_tokens;
    sc.n_queries = n_queries;
    sc.head_dim = head_dim;
    kvq_error err;
    CHECKF(kvq_eval_data_synthetic(&sc, d, &err) == KVQ_OK, "%s", err.msg);
}

/* The f32 cache loses nothing but float rounding. */
static void test_floor(void)
{
    struct kvq_eval_data d;
    synth(&d, 1, 300, 12, 64);
    struct kvq_eval_sums s = run_cfg(&d, "f32", 0);
    struct kvq_eval_stats m;
    kvq_eval_stats_of(&s, &m);
    CHECK(s.n_q == (double)(d.n_heads * 12));
    CHECK(m.key_mse == 0.0 && m.val_mse == 0.0);
    CHECKF(m.out_err < 1e-5, "%g", m.out_err);
    CHECKF(m.ip_rel_rms < 1e-5, "%g", m.ip_rel_rms);
    CHECKF(m.kl < 1e-9 && m.tv < 1e-5, "kl %g tv %g", m.kl, m.tv);
    CHECK(m.top1 == 1.0 && m.top8 == 1.0);
    kvq_eval_data_free(&d);
}

/* Isotropic data: a rotated unit vector follows the codebook's density
 * whatever the rotation, so the relative key MSE must be the codebook's
 * expected error per unit vector (plus negligible f16 norm rounding). */
static void test_key_mse_is_codebook_mse(void)
{
    struct kvq_eval_synth_config sc;
    kvq_eval_synth_config_default(&sc);
    sc.n_layers = 1;
    sc.n_heads = 1;
    sc.n_kv_heads = 1;
    sc.n_tokens = 2048;
    sc.n_queries = 1;
    sc.n_outliers = 0;
    struct kvq_eval_data d;
    kvq_error err;
    CHECK_OK(kvq_eval_data_synthetic(&sc, &d, &err));
    static const char *spec[4] = {"tq1", "tq2", "tq3", "tq4"};
    for (int b = 1; b <= 4; b++) {
        kvq_codebook cb;
        CHECK_OK(kvq_codebook_get(128, b, KVQ_DIST_BETA, &cb));
        struct kvq_eval_stats m;
        struct kvq_eval_sums s = run_cfg(&d, spec[b - 1], 1);
        kvq_eval_stats_of(&s, &m);
        /* MSE here is sum ||x-x~||^2 / sum ||x||^2; with ||x|| nearly
         * constant in high dimension that is the per-unit-vector mse. */
        CHECKF(fabs(m.key_mse / cb.mse - 1.0) < 0.03, "tq%d: key mse %g, codebook %g", b, m.key_mse, cb.mse);
        CHECKF(fabs(m.val_mse / cb.mse - 1.0) < 0.03, "tq%d: value mse %g, codebook %g", b, m.val_mse, cb.mse);
    }
    kvq_eval_data_free(&d);
}

/* Every metric recomputed here the slow, obvious way: scores in double from
 * the decoded cache, softmax, sets, and dequantize-then-attend outputs. */
static void brute_force(const struct kvq_eval_data *d, const char *spec)
{
    struct kvq_eval_config def, c[2];
    kvq_eval_config_default(&def);
    size_t n;
    kvq_error err;
    CHECK_OK(eval_spec_parse(spec, &def, c, 2, &n, &err));
    struct kvq_eval_sums got = run_cfg(d, spec, 0);
    struct kvq_eval_stats g;
    kvq_eval_stats_of(&got, &g);

    const int D = d->head_dim, G = d->n_heads / d->n_kv_heads;
    const size_t T = d->n_tokens, TQ = d->n_queries;
    const double scale = 1.0 / sqrt((double)D);
    double ke = 0, kn = 0, ve = 0, vn = 0, ie = 0, ie2 = 0, ir2 = 0, in = 0, tv = 0, kl = 0, t1 = 0, t8 = 0, oe = 0;
    float *kt = malloc(T * (size_t)d->n_kv_heads * (size_t)D * sizeof(float));
    float *vt = malloc(T * (size_t)d->n_kv_heads * (size_t)D * sizeof(float));
    float *kd = malloc(T * (size_t)D * sizeof(float)), *vd = malloc(T * (size_t)D * sizeof(float));
    double *s = malloc(T * sizeof(double)), *sq = malloc(T * sizeof(double));
    double *p = malloc(T * sizeof(double)), *pq = malloc(T * sizeof(double));
    for (int l = 0; l < d->n_layers; l++) {
        struct kvq_cache_config cc;
        kvq_cache_config_default(&cc, d->n_kv_heads, D, T);
        cc.type_k = c[0].type_k;
        cc.type_v = c[0].type_v;
        kvq_cache *cache = NULL;
        for (int g0 = 0; g0 < d->n_kv_heads; g0++)
            for (size_t t = 0; t < T; t++)
                for (int j = 0; j < D; j++) {
                    size_t src = (((size_t)l * (size_t)d->n_kv_heads + (size_t)g0) * T + t) * (size_t)D + (size_t)j;
                    kt[(t * (size_t)d->n_kv_heads + (size_t)g0) * (size_t)D + (size_t)j] = d->k[src];
                    vt[(t * (size_t)d->n_kv_heads + (size_t)g0) * (size_t)D + (size_t)j] = d->v[src];
                }
        CHECK_OK(kvq_cache_create(&cc, &cache));
        CHECK_OK(kvq_cache_append(cache, T, kt, vt));
        for (int g0 = 0; g0 < d->n_kv_heads; g0++) {
            CHECK_OK(kvq_cache_read(cache, g0, 0, T, kd, vd));
            const float *k = d->k + ((size_t)l * (size_t)d->n_kv_heads + (size_t)g0) * T * (size_t)D;
            const float *v = d->v + ((size_t)l * (size_t)d->n_kv_heads + (size_t)g0) * T * (size_t)D;
            for (size_t i = 0; i < T * (size_t)D; i++) {
                ke += ((double)kd[i] - k[i]) * ((double)kd[i] - k[i]);
                kn += (double)k[i] * k[i];
                ve += ((double)vd[i] - v[i]) * ((double)vd[i] - v[i]);
                vn += (double)v[i] * v[i];
            }
            for (int h = g0 * G; h < (g0 + 1) * G; h++)
                for (size_t qi = 0; qi < TQ; qi++) {
                    const float *q = d->q + (((size_t)l * (size_t)d->n_heads + (size_t)h) * TQ + qi) * (size_t)D;
                    size_t np = T - TQ + qi + 1;
                    double m1 = -1e300, m2 = -1e300, z1 = 0, z2 = 0;
                    for (size_t t = 0; t < np; t++) {
                        s[t] = sq[t] = 0;
                        for (int j = 0; j < D; j++) {
                            s[t] += (double)q[j] * k[t * (size_t)D + (size_t)j];
                            sq[t] += (double)q[j] * kd[t * (size_t)D + (size_t)j];
                        }
                        ie += sq[t] - s[t];
                        ie2 += (sq[t] - s[t]) * (sq[t] - s[t]);
                        ir2 += s[t] * s[t];
                        in += 1;
                        m1 = fmax(m1, s[t]);
                        m2 = fmax(m2, sq[t]);
                    }
                    for (size_t t = 0; t < np; t++) {
                        p[t] = exp(scale * (s[t] - m1));
                        pq[t] = exp(scale * (sq[t] - m2));
                        z1 += p[t];
                        z2 += pq[t];
                    }
                    size_t a1 = 0, a2 = 0;
                    for (size_t t = 0; t < np; t++) {
                        p[t] /= z1;
                        pq[t] /= z2;
                        tv += 0.5 * fabs(p[t] - pq[t]);
                        kl += p[t] * log(p[t] / pq[t]);
                        a1 = s[t] > s[a1] ? t : a1;
                        a2 = sq[t] > sq[a2] ? t : a2;
                    }
                    t1 += a1 == a2;
                    /* top-8 by counting: t is in the top 8 when fewer than 8 beat it */
                    int hit = 0, k8 = np < 8 ? (int)np : 8;
                    for (size_t t = 0; t < np; t++) {
                        int r1 = 0, r2 = 0;
                        for (size_t u = 0; u < np; u++) {
                            r1 += s[u] > s[t] || (s[u] == s[t] && u < t);
                            r2 += sq[u] > sq[t] || (sq[u] == sq[t] && u < t);
                        }
                        hit += r1 < 8 && r2 < 8;
                    }
                    t8 += (double)hit / k8;
                    double e2 = 0, r2 = 0;
                    for (int j = 0; j < D; j++) {
                        double o = 0, oq = 0;
                        for (size_t t = 0; t < np; t++) {
                            o += p[t] * v[t * (size_t)D + (size_t)j];
                            oq += pq[t] * vd[t * (size_t)D + (size_t)j];
                        }
                        e2 += (o - oq) * (o - oq);
                        r2 += o * o;
                    }
                    oe += sqrt(e2 / r2);
                }
        }
        kvq_cache_free(cache);
    }
    const double nq = (double)d->n_layers * d->n_heads * (double)TQ;
    CHECKF(fabs(g.key_mse - ke / kn) <= 1e-9 * ke / kn, "%s key mse %g vs %g", spec, g.key_mse, ke / kn);
    CHECKF(fabs(g.val_mse - ve / vn) <= 1e-9 * ve / vn, "%s val mse %g vs %g", spec, g.val_mse, ve / vn);
    /* Scores: eval takes them from a float product, so ~1e-6 relative. */
    CHECKF(fabs(g.ip_rel_rms - sqrt(ie2 / ir2)) <= 1e-4 * sqrt(ie2 / ir2), "%s ip rms %g vs %g", spec, g.ip_rel_rms,
           sqrt(ie2 / ir2));
    CHECKF(fabs(g.ip_bias - (ie / in) / sqrt(ir2 / in)) <= 1e-3 * sqrt(ie2 / ir2), "%s ip bias %g vs %g", spec,
           g.ip_bias, (ie / in) / sqrt(ir2 / in));
    CHECKF(fabs(g.tv - tv / nq) <= 1e-4 * tv / nq, "%s tv %g vs %g", spec, g.tv, tv / nq);
    CHECKF(fabs(g.kl - kl / nq) <= 1e-3 * kl / nq, "%s kl %g vs %g", spec, g.kl, kl / nq);
    CHECKF(fabs(g.top1 - t1 / nq) < 1e-12, "%s top1 %g vs %g", spec, g.top1, t1 / nq);
    CHECKF(fabs(g.top8 - t8 / nq) < 1e-12, "%s top8 %g vs %g", spec, g.top8, t8 / nq);
    /* Fused attention against dequantize-then-attend: the kernel contract
     * is 1e-5 relative on the output, far below the error being measured. */
    CHECKF(fabs(g.out_err - oe / nq) <= 1e-5 + 1e-3 * oe / nq, "%s out err %g vs %g", spec, g.out_err, oe / nq);
    CHECK(g.kl > 0 && g.tv > 0 && g.out_err > 0);
    free(kt);
    free(vt);
    free(kd);
    free(vd);
    free(s);
    free(sq);
    free(p);
    free(pq);
}

static void test_brute_force(void)
{
    struct kvq_eval_synth_config sc;
    kvq_eval_synth_config_default(&sc);
    sc.n_layers = 2;
    sc.n_heads = 4;
    sc.n_kv_heads = 2;
    sc.n_tokens = 70;
    sc.n_queries = 9;
    sc.head_dim = 64;
    sc.n_outliers = 3;
    struct kvq_eval_data d;
    kvq_error err;
    CHECK_OK(kvq_eval_data_synthetic(&sc, &d, &err));
    brute_force(&d, "k=tq2j:v=tq2");
    brute_force(&d, "k=q4_0:v=tq1");
    brute_force(&d, "k=tq1:v=q8_0");
    kvq_eval_data_free(&d);
    /* Queries from position 0 on: contexts of 1..12 keys, fewer than 8 early. */
    sc.n_layers = 1;
    sc.n_tokens = 12;
    sc.n_queries = 12;
    CHECK_OK(kvq_eval_data_synthetic(&sc, &d, &err));
    brute_force(&d, "k=tq2j:v=tq2");
    kvq_eval_data_free(&d);
}

/* Labels name only the variants that differ and matter for the types. */
static void test_config_label(void)
{
    struct kvq_eval_config def, c;
    kvq_eval_config_default(&def);
    CHECK(def.type_k == KVQ_TYPE_F32 && def.type_v == KVQ_TYPE_F32 && def.rot == KVQ_ROT_HADAMARD &&
          def.qjl == KVQ_QJL_ORTHO && def.seed == 0 && def.label[0] == 0);
    c = def;
    c.type_k = KVQ_TYPE_TQ3J;
    c.type_v = KVQ_TYPE_TQ3;
    kvq_eval_config_label(&c, &def);
    CHECK(strcmp(c.label, "tq3j/tq3") == 0);
    c.rot = KVQ_ROT_DCT;
    c.qjl = KVQ_QJL_GAUSS;
    c.seed = 7;
    kvq_eval_config_label(&c, &def);
    CHECK(strcmp(c.label, "tq3j/tq3+dct+gauss+s7") == 0);
    c.type_k = c.type_v = KVQ_TYPE_Q8_0; /* nothing rotated, no QJL: no variant */
    kvq_eval_config_label(&c, &def);
    CHECK(strcmp(c.label, "q8_0/q8_0") == 0);
}

/* The context's queries, attention statistics and argument errors. */
static void test_ctx_api(void)
{
    struct kvq_eval_synth_config sc;
    kvq_eval_synth_config_default(&sc);
    CHECK(sc.n_layers == 2 && sc.n_heads == 4 && sc.n_kv_heads == 2 && sc.head_dim == 128 && sc.n_tokens == 1024 &&
          sc.n_queries == 64 && sc.n_outliers == 4 && sc.seed == 0);
    struct kvq_eval_data d;
    kvq_error err;
    synth(&d, 2, 100, 20, 64);
    CHECK(kvq_eval_query_pos(&d, 0) == 80 && kvq_eval_query_pos(&d, 19) == 99);
    kvq_eval_ctx *ctx = NULL;
    CHECK_OK(kvq_eval_ctx_create(&d, 0, &ctx, &err));
    CHECK(kvq_eval_ctx_queries_used(ctx) == 20);
    kvq_eval_ctx_free(ctx);
    CHECK_OK(kvq_eval_ctx_create(&d, 7, &ctx, &err));
    CHECK(kvq_eval_ctx_queries_used(ctx) == 7);
    double eff = -1, top = -1, gain = -1;
    kvq_eval_ctx_attention_stats(ctx, &eff, &top, &gain);
    CHECK(eff == 0 && top == 0 && gain == 0);
    struct kvq_eval_config cfg;
    struct kvq_eval_sums s;
    kvq_eval_config_default(&cfg);
    CHECK_STATUS(kvq_eval_ctx_run(ctx, &cfg, &s, &err), KVQ_ERR_INVALID_ARG); /* no layer yet */
    CHECK_STATUS(kvq_eval_ctx_set_layer(ctx, 2, &err), KVQ_ERR_INVALID_ARG);
    CHECK_OK(kvq_eval_ctx_set_layer(ctx, 1, &err));
    kvq_eval_ctx_attention_stats(ctx, &eff, &top, &gain);
    /* a query reads between one key and all 100 of them */
    CHECK(eff >= 1 && eff <= 100 && top > 0 && top <= 1 && gain > 0);
    CHECK_OK(kvq_eval_ctx_run(ctx, &cfg, &s, &err));
    CHECK(s.n_q == 4 * 7);
    kvq_eval_ctx_free(ctx);
    kvq_eval_ctx_free(NULL);
    kvq_eval_data_free(&d);
    kvq_eval_data_free(NULL);
}

/* ---- Pareto front -------------------------------------------------------- */

static void test_pareto(void)
{
    /* (bits, error): dominated points 2 and 3; 6 is the f32 floor and 7 is
     * lossless (within 10x of the floor): neither counts. */
    enum { N = 8 };
    const double bits[N] = {2, 3, 3, 4, 5, 1, 32, 16}, errs[N] = {0.5, 0.3, 0.4, 0.3, 0.1, 0.9, 1e-7, 3e-7};
    const int front[N] = {1, 1, 0, 0, 1, 1, 0, 0};
    struct eval_result r[N];
    struct kvq_eval_data d;
    memset(&d, 0, sizeof d);
    memset(r, 0, sizeof r);
    for (int i = 0; i < N; i++) {
        kvq_eval_config_default(&r[i].cfg);
        r[i].cfg.type_k = i == 6 ? KVQ_TYPE_F32 : i == 7 ? KVQ_TYPE_F16 : KVQ_TYPE_TQ3;
        r[i].cfg.type_v = r[i].cfg.type_k;
        r[i].cost.bits = bits[i];
        r[i].total.n_q = 1;
        r[i].total.out_rel = errs[i];
        /* KL falls with bits, the two 3-bit points tie: neither dominates. */
        r[i].total.kl = i >= 6 ? 1e-12 : 1.0 - bits[i] / 40.0;
    }
    struct eval_run run = {&d, 1, 0, 0, 0, NULL, 0, r, N};
    eval_mark_pareto(&run);
    for (int i = 0; i < N; i++) {
        CHECKF(r[i].front_out == front[i], "point %d: front_out %d", i, r[i].front_out);
        CHECKF(r[i].front_kl == (i < 6), "point %d: front_kl %d", i, r[i].front_kl);
    }
    CHECK(eval_is_lossless(&run, &r[7], 0) && eval_is_lossless(&run, &r[7], 1));
    CHECK(!eval_is_lossless(&run, &r[6], 0) && !eval_is_lossless(&run, &r[4], 0));
}

/* ---- the command --------------------------------------------------------- */

static void test_deterministic(void)
{
    const char *a = tmp_path("a.json"), *b = tmp_path("b.json"), *ca = tmp_path("a.csv"), *cb = tmp_path("b.csv");
    char err[4096];
    const char *args1[] = {"--synthetic", "--tokens", "200", "--queries", "8", "--dim", "64",
                           "--types", "k=tq3j:v=tq3,q4_0,k=tq2j:v=tq2:qjl=gauss", "--json", a, "--csv", ca};
    const char *args2[] = {"--synthetic", "--tokens", "200", "--queries", "8", "--dim", "64",
                           "--types", "k=tq3j:v=tq3,q4_0,k=tq2j:v=tq2:qjl=gauss", "--json", b, "--csv", cb};
    CHECKF(run_eval(err, sizeof err, 13, args1) == 0, "%s", err);
    CHECKF(run_eval(err, sizeof err, 13, args2) == 0, "%s", err);
    CHECK(files_equal(a, b));
    CHECK(files_equal(ca, cb));
    /* The comparison can fail: another codec seed gives other numbers. */
    const char *c = tmp_path("c.json");
    const char *args3[] = {"--synthetic", "--tokens", "200", "--queries", "8", "--dim", "64", "--data-seed", "0",
                           "--seed", "1", "--types", "k=tq3j:v=tq3,q4_0,k=tq2j:v=tq2:qjl=gauss", "--json", c};
    CHECKF(run_eval(err, sizeof err, 15, args3) == 0, "%s", err);
    CHECK(!files_equal(a, c));
    /* ... and on a real dump, a slice of it. */
    const char *dump = TEST_REF_DIR "/kv_text.safetensors";
    if (access(dump, R_OK) == 0) {
        const char *r1[] = {dump, "--layers", "1", "--max-queries", "6", "--types", "k=tq3j:v=tq3,q4_0", "--json", a};
        const char *r2[] = {dump, "--layers", "1", "--max-queries", "6", "--types", "k=tq3j:v=tq3,q4_0", "--json", b};
        CHECKF(run_eval(err, sizeof err, 9, r1) == 0, "%s", err);
        CHECKF(run_eval(err, sizeof err, 9, r2) == 0, "%s", err);
        CHECK(files_equal(a, b));
    }
}

/* Monotone in bits on real keys: more codebook bits never hurt. */
static void test_real_dump_monotone(void)
{
    const char *dump = TEST_REF_DIR "/kv_passkey.safetensors";
    if (access(dump, R_OK) != 0)
        SKIP("no %s", dump);
    struct kvq_eval_data d;
    kvq_error err;
    CHECK_OK(kvq_eval_data_load(dump, &d, &err));
    CHECK(d.n_layers == 4 && d.n_heads == 4 && d.n_kv_heads == 2 && d.head_dim == 128 && d.n_tokens == 3040 &&
          d.n_queries == 256);
    double prev = 1e9;
    static const char *spec[4] = {"tq1", "tq2", "tq3", "tq4"};
    for (int b = 0; b < 4; b++) {
        struct kvq_eval_sums s = run_cfg(&d, spec[b], 4);
        struct kvq_eval_stats m;
        kvq_eval_stats_of(&s, &m);
        CHECKF(m.key_mse < prev && m.out_err > 0, "%s: key mse %g after %g", spec[b], m.key_mse, prev);
        prev = m.key_mse;
    }
    kvq_eval_data_free(&d);
}

/* A small dump with values on a 1/8 grid, exact in F16, BF16 and F32, so
 * the three dtypes hold the same numbers. drop: 'q'/'k'/'v' leaves that
 * tensor out, '3' writes k with rank 3; poison (if not 0) replaces one key. */
static void write_dump_dtype(const char *path, enum kvq_st_dtype dt, int64_t L, int64_t H, int64_t KVH, int64_t TQ,
                             int64_t T, int64_t D, int drop, float poison)
{
    size_t nq = (size_t)(L * H * TQ * D), nk = (size_t)(L * KVH * T * D), es = kvq_st_dtype_size(dt);
    float *f[3] = {malloc(nq * 4), malloc(nk * 4), malloc(nk * 4)};
    for (size_t i = 0; i < nq; i++)
        f[0][i] = (float)((i * 37u) % 17u) / 8.0f - 1.0f;
    for (size_t i = 0; i < nk; i++) {
        f[1][i] = (float)((i * 13u) % 19u) / 8.0f - 1.125f;
        f[2][i] = (float)((i * 29u) % 11u) / 4.0f - 1.25f;
    }
    if (poison != 0.0f)
        f[1][nk / 2] = poison;
    size_t n[3] = {nq, nk, nk};
    void *raw[3];
    for (int t = 0; t < 3; t++) {
        raw[t] = malloc(n[t] * es);
        for (size_t i = 0; i < n[t]; i++) {
            if (dt == KVQ_ST_F16)
                ((uint16_t *)raw[t])[i] = kvq_f32_to_f16(f[t][i]);
            else if (dt == KVQ_ST_BF16)
                ((uint16_t *)raw[t])[i] = (uint16_t)(kvq_f32_bits(f[t][i]) >> 16); /* exact on this grid */
            else
                ((float *)raw[t])[i] = f[t][i];
        }
    }
    kvq_st_writer *w = NULL;
    kvq_st_writer_create(&w);
    int64_t sq[4] = {L, H, TQ, D}, sk[4] = {L, KVH, T, D};
    if (drop != 'q')
        kvq_st_writer_add(w, "q", dt, 4, sq, raw[0]);
    if (drop != 'k')
        kvq_st_writer_add(w, "k", dt, drop == '3' ? 3 : 4, sk, raw[1]);
    if (drop != 'v')
        kvq_st_writer_add(w, "v", dt, 4, sk, raw[2]);
    kvq_error err;
    CHECK_OK(kvq_st_writer_write(w, path, &err));
    kvq_st_writer_free(w);
    for (int t = 0; t < 3; t++) {
        free(f[t]);
        free(raw[t]);
    }
}

static void write_dump(const char *path, int64_t L, int64_t H, int64_t KVH, int64_t TQ, int64_t T, int64_t D,
                       int drop, float poison)
{
    write_dump_dtype(path, KVQ_ST_F16, L, H, KVH, TQ, T, D, drop, poison);
}

/* F16, BF16 and F32 dumps of the same numbers give the same results. */
static void test_dtypes(void)
{
    static const enum kvq_st_dtype dts[3] = {KVQ_ST_F16, KVQ_ST_BF16, KVQ_ST_F32};
    static const char *dirs[3] = {"f16", "bf16", "f32"};
    const char *json[3];
    char err[2048];
    for (int i = 0; i < 3; i++) {
        CHECK(mkdir(tmp_path(dirs[i]), 0700) == 0);
        char dump[256], js[256];
        snprintf(dump, sizeof dump, "%s/%s/dump.safetensors", tmpdir, dirs[i]);
        snprintf(js, sizeof js, "%s/%s/out.json", tmpdir, dirs[i]);
        json[i] = tmp_path(js + strlen(tmpdir) + 1);
        write_dump_dtype(dump, dts[i], 2, 4, 2, 6, 40, 64, 0, 0);
        const char *args[] = {dump, "--types", "k=tq3j:v=tq3,q4_0", "--json", json[i]};
        CHECKF(run_eval(err, sizeof err, 5, args) == 0, "%s: %s", dirs[i], err);
    }
    CHECK(files_equal(json[0], json[1]));
    CHECK(files_equal(json[0], json[2]));
}

static void test_bad_input(void)
{
    const char *p = tmp_path("bad.safetensors");
    write_dump(p, 1, 2, 1, 4, 16, 64, 'v', 0);
    expect_error("no tensor 'v'", 3, (const char *[]){p, "--types", "tq3"});
    write_dump(p, 1, 2, 1, 4, 16, 64, '3', 0);
    expect_error("3 dimensions", 3, (const char *[]){p, "--types", "tq3"});
    write_dump(p, 1, 3, 2, 4, 16, 64, 0, 0);
    expect_error("cannot share", 3, (const char *[]){p, "--types", "tq3"});
    write_dump(p, 1, 2, 1, 20, 16, 64, 0, 0);
    expect_error("query positions", 3, (const char *[]){p, "--types", "tq3"});
    write_dump(p, 1, 2, 1, 4, 16, 64, 0, NAN);
    expect_error("non-finite", 3, (const char *[]){p, "--types", "tq3"});
    write_dump(p, 1, 2, 1, 4, 16, 64, 0, INFINITY);
    expect_error("non-finite", 3, (const char *[]){p, "--types", "tq3"});
    /* Dims no type can take: q4_0 needs multiples of 32, tq multiples of 8. */
    write_dump(p, 1, 2, 1, 4, 16, 80, 0, 0);
    expect_error("q4_0 cannot store head dim 80", 3, (const char *[]){p, "--types", "k=tq3j:v=q4_0"});
    write_dump(p, 1, 2, 1, 4, 16, 100, 0, 0);
    expect_error("tq3j cannot store head dim 100", 3, (const char *[]){p, "--types", "k=tq3j:v=f16"});
    /* A good file cut short. */
    write_dump(p, 1, 2, 1, 4, 16, 64, 0, 0);
    struct stat stt;
    CHECK(stat(p, &stt) == 0);
    CHECK(truncate(p, stt.st_size - 100) == 0);
    expect_error("bad.safetensors", 3, (const char *[]){p, "--types", "tq3"});
    expect_error("nonexistent.safetensors", 1, (const char *[]){tmp_path("nonexistent.safetensors")});
    /* Usage errors. */
    expect_error("unknown type 'tq7'", 3, (const char *[]){"--synthetic", "--types", "tq7"});
    expect_error("--layers", 5, (const char *[]){"--synthetic", "--layers", "5", "--types", "tq3"});
    expect_error("exclusive", 4, (const char *[]){"--synthetic", "--sweep", "--types", "tq3"});
    expect_error("need --synthetic", 3, (const char *[]){p, "--tokens", "5"});
    expect_error("no input", 2, (const char *[]){"--types", "tq3"});
}

static void test_plot(void)
{
    if (system("command -v gnuplot >/dev/null 2>&1") != 0)
        SKIP("gnuplot not installed");
    const char *png = tmp_path("plot.png");
    char err[4096];
    const char *args[] = {"--synthetic", "--tokens", "128", "--queries", "4", "--dim", "64", "--n-layers", "1",
                          "--types", "tq2,tq3,k=tq3j:v=tq3,q4_0,k=f16:v=tq2", "--plot", png};
    CHECKF(run_eval(err, sizeof err, 13, args) == 0, "%s", err);
    FILE *f = fopen(png, "rb");
    unsigned char magic[8] = {0};
    CHECK(f && fread(magic, 1, 8, f) == 8);
    CHECK(memcmp(magic, "\x89PNG\r\n\x1a\n", 8) == 0);
    if (f)
        fclose(f);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kvq-test-eval-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_spec_parse);
    RUN(test_sweep_grid);
    RUN(test_bits_match_cache);
    RUN(test_floor);
    RUN(test_key_mse_is_codebook_mse);
    RUN(test_brute_force);
    RUN(test_config_label);
    RUN(test_ctx_api);
    RUN(test_pareto);
    RUN(test_deterministic);
    RUN(test_real_dump_monotone);
    RUN(test_dtypes);
    RUN(test_bad_input);
    RUN(test_plot);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return TEST_END("test_eval");
}
