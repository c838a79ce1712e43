/* test_sample_cuda.c - the GPU argmax and sampler (decoder/backend/
 * sample_cuda.h) against the CPU sampler's definition, kvq_sampler_pick.
 *
 * Rows of synthetic logits chosen to reach every branch: spread and peaked
 * rows, rows of many exact ties (top-k ties, the order of equal logits),
 * rows with masked (-Inf) tokens, a row of one value; settings from greedy
 * through top-k, top-p and both, with k beyond the vocabulary; uniforms at
 * random, 0 and 1 - 1e-9 (the tail's tiny weights). Every draw must pick the CPU's token:
 * the sums differ only in rounding order, which moves a token only when a
 * draw lands within ulps of a boundary (probability ~1e-13 per draw here).
 * Rows with NaN, +Inf or nothing but -Inf get the CPU's status and leave
 * the other rows of their pass alone. Skips without a GPU.
 */
#include <math.h>
#include <stdint.h>

#include "kvq_cuda.h"
#include "kvq_rng.h"
#include "kvq_sampler.h"
#include "test.h"
#include "test_gpu.h"

#ifdef KVQ_HAVE_CUBLAS
#include "decoder_internal.h"
#include "sample_cuda.h"

enum { V = 50021, R = 11, TRIALS = 150 }; /* R > the sampler's 8-row pass */
static int trials = TRIALS; /* KVQ_CUDA_TEST_SMALL=1 (the sanitizer runs): 4 */

/* Row r's logits: a different shape per row. */
static void fill_row(float *x, int r, kvq_rng *g)
{
    for (int i = 0; i < V; i++) {
        double z = kvq_rng_gauss(g);
        switch (r % 6) {
        case 0: x[i] = (float)(3.0 * z); break;                 /* spread */
        case 1: x[i] = (float)(z - (i == 77 ? -12.0 : 0.0)); break; /* one dominant token */
        case 2: x[i] = (float)(round(2.0 * z) / 2.0); break;     /* ~12 distinct values: ties everywhere */
        case 3: x[i] = i % 3 ? -INFINITY : (float)(2.0 * z); break; /* two thirds masked */
        case 4: x[i] = 0.25f; break;                             /* all equal */
        default: x[i] = (float)(8.0 * z); break;                 /* sharp */
        }
    }
}

static const kvq_sampler_params settings[] = {
    {1.0f, 0, 1.0f, 0},  {0.7f, 40, 1.0f, 0},  {1.3f, 0, 0.9f, 0}, {0.8f, 50, 0.5f, 0}, {1.0f, 1, 1.0f, 0},
    {0.0f, 0, 1.0f, 0},  {1.0f, V + 5, 0.95f, 0}, {2.0f, 3, 1.0f, 0}, {0.5f, 7, 0.3f, 0}, {1.0f, 0, 0.05f, 0},
    {1.7f, 1000, 1.0f, 0},
};

static void test_matches_cpu(void)
{
    NEED_GPU();
    float *x = malloc((size_t)R * V * sizeof *x);
    void *dev = NULL;
    kvq_gpu_sampler *g = NULL;
    kvq_sampler *cpu[R] = {0};
    kvq_rng rng;
    kvq_rng_init(&rng, 2024);
    for (int r = 0; r < R; r++)
        fill_row(x + (size_t)r * V, r, &rng);
    CHECK_OK(kvq_gpu_sampler_create(V, R, &g));
    CHECK_OK(kvq_cuda_malloc(&dev, (size_t)R * V * sizeof *x));
    CHECK_OK(kvq_cuda_memcpy_h2d(dev, x, (size_t)R * V * sizeof *x));
    if (!g || !dev || !x)
        goto out;
    int32_t best[R], tok[R], want;
    kvq_status st[R];
    double u[R];
    CHECK_OK(kvq_gpu_argmax(g, dev, R, best));
    for (int r = 0; r < R; r++) {
        kvq_best b;
        CHECK_OK(kvq_argmax(x + (size_t)r * V, V, 0, &b));
        CHECKF(best[r] == b.token, "row %d: GPU argmax %d, CPU %d", r, best[r], b.token);
    }
    int draws = 0, diff = 0;
    for (int shift = 0; shift < R; shift++) { /* every row meets every setting */
        kvq_sampler_params p[R];
        for (int r = 0; r < R; r++) {
            p[r] = settings[(r + shift) % R];
            kvq_sampler_free(cpu[r]);
            cpu[r] = NULL;
            CHECK_OK(kvq_sampler_create(V, &p[r], &cpu[r]));
        }
        for (int t = 0; t < trials; t++) {
            for (int r = 0; r < R; r++)
                u[r] = t == 0 ? 0.0 : t == 1 ? 1.0 - 1e-9 : kvq_rng_uniform(&rng);
            CHECK_OK(kvq_gpu_sample(g, dev, R, p, u, tok, st));
            for (int r = 0; r < R && cpu[r]; r++) {
                CHECK_OK(kvq_sampler_pick(cpu[r], x + (size_t)r * V, u[r], &want));
                CHECK_OK(st[r]);
                draws++;
                if (tok[r] != want && diff++ < 5)
                    fprintf(stderr, "  row %d (T %g, k %d, p %g), u %.17g: GPU %d, CPU %d\n", r, p[r].temperature,
                            p[r].top_k, p[r].top_p, u[r], tok[r], want);
            }
        }
    }
    CHECKF(diff == 0, "%d of %d draws differ", diff, draws);
    printf("  %d draws over %d rows x %d settings: all equal to the CPU sampler's\n", draws, R, R);
out:
    for (int r = 0; r < R; r++)
        kvq_sampler_free(cpu[r]);
    kvq_cuda_free(dev);
    kvq_gpu_sampler_free(g);
    free(x);
}

/* Rows 1, 4 and 9 are bad; the others must come out as alone. */
static void test_bad_rows(void)
{
    NEED_GPU();
    float *x = malloc((size_t)R * V * sizeof *x);
    void *dev = NULL;
    kvq_gpu_sampler *g = NULL;
    kvq_rng rng;
    kvq_rng_init(&rng, 99);
    for (int r = 0; r < R; r++)
        fill_row(x + (size_t)r * V, 0, &rng);
    x[1 * (size_t)V + 500] = NAN;
    x[4 * (size_t)V + 3] = INFINITY;
    for (int i = 0; i < V; i++)
        x[9 * (size_t)V + i] = -INFINITY;
    CHECK_OK(kvq_gpu_sampler_create(V, R, &g));
    CHECK_OK(kvq_cuda_malloc(&dev, (size_t)R * V * sizeof *x));
    CHECK_OK(kvq_cuda_memcpy_h2d(dev, x, (size_t)R * V * sizeof *x));
    kvq_sampler *cpu = NULL;
    const kvq_sampler_params sp = {0.9f, 20, 0.9f, 0};
    CHECK_OK(kvq_sampler_create(V, &sp, &cpu));
    if (!g || !dev || !x || !cpu)
        goto out;
    kvq_sampler_params p[R];
    double u[R];
    int32_t tok[R], best[R], want;
    kvq_status st[R];
    for (int greedy = 0; greedy <= 1; greedy++) {
        for (int r = 0; r < R; r++) {
            p[r] = sp;
            p[r].temperature = greedy ? 0.0f : sp.temperature;
            u[r] = 0.5;
        }
        CHECK_OK(kvq_gpu_sample(g, dev, R, p, u, tok, st));
        for (int r = 0; r < R; r++) {
            kvq_status w = r == 1 || r == 4 ? KVQ_ERR_NONFINITE : r == 9 ? KVQ_ERR_INVALID_ARG : KVQ_OK;
            CHECKF(st[r] == w && (w == KVQ_OK) == (tok[r] >= 0), "row %d: status %d, token %d", r, st[r], tok[r]);
            if (w == KVQ_OK && !greedy) {
                CHECK_OK(kvq_sampler_pick(cpu, x + (size_t)r * V, u[r], &want));
                CHECK(tok[r] == want);
            }
        }
    }
    CHECK_STATUS(kvq_gpu_argmax(g, dev, R, best), KVQ_ERR_NONFINITE);
    CHECK(best[1] == -1 && best[4] == -1 && best[0] >= 0 && best[9] == 0);
    p[0].top_p = 0.0f;
    CHECK_STATUS(kvq_gpu_sample(g, dev, 1, p, u, tok, st), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_gpu_argmax(g, dev, R + 1, best), KVQ_ERR_INVALID_ARG);
out:
    kvq_sampler_free(cpu);
    kvq_cuda_free(dev);
    kvq_gpu_sampler_free(g);
    free(x);
}
#else
static void test_matches_cpu(void)
{
    SKIP("built without CUDA and cuBLAS: no GPU sampler");
}
static void test_bad_rows(void)
{
    SKIP("built without CUDA and cuBLAS: no GPU sampler");
}
#endif

int main(void)
{
#ifdef KVQ_HAVE_CUBLAS
    if (test_gpu_small())
        trials = 4;
#endif
    RUN(test_matches_cpu);
    RUN(test_bad_rows);
    return TEST_END("test_sample_cuda");
}
