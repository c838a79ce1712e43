/* test_decoder_matvec.c - the few-row matrix product: AVX2 kernel against the
 * scalar reference, and batch invariance (a row's result does not depend on
 * how many rows are computed with it), which speculative decoding relies on. */
#include <stdint.h>

#include "kvq_cpu.h"
#include "kvq_half.h"
#include "matvec_internal.h"
#include "kvq_rng.h"
#include "test.h"

static void fill(float *v, size_t n, kvq_rng *r)
{
    for (size_t i = 0; i < n; i++)
        v[i] = (float)(kvq_rng_uniform(r) * 2.0 - 1.0);
}

static void test_avx2_vs_ref(void)
{
    if (!kvq_cpu_has_avx2())
        SKIP("no AVX2");
    static const int shapes[][3] = {{1, 1, 1}, {1, 7, 15}, {3, 5, 16}, {4, 2, 33}, {5, 9, 512}, {16, 64, 1024},
                                    {7, 3, 100}, {13, 17, 257}};
    kvq_rng r;
    kvq_rng_init(&r, 42);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], ldx = K + 3, ldy = N + 5;
        float *x = malloc((size_t)M * ldx * sizeof *x), *w = malloc((size_t)N * K * sizeof *w);
        float *y1 = malloc((size_t)M * ldy * sizeof *y1), *y2 = malloc((size_t)M * ldy * sizeof *y2);
        fill(x, (size_t)M * ldx, &r);
        fill(w, (size_t)N * K, &r);
        for (int acc = 0; acc < 2; acc++) {
            fill(y1, (size_t)M * ldy, &r);
            memcpy(y2, y1, (size_t)M * ldy * sizeof *y1);
            kvq_matvec_avx2(x, ldx, w, y1, ldy, M, N, K, acc);
            kvq_matvec_ref(x, ldx, w, y2, ldy, M, N, K, acc);
            double worst = 0;
            for (int m = 0; m < M; m++)
                for (int n = 0; n < ldy; n++) {
                    double d = fabs((double)y1[m * ldy + n] - y2[m * ldy + n]);
                    if (n >= N)
                        CHECK(d == 0); /* columns beyond N untouched */
                    else
                        worst = fmax(worst, d / sqrt((double)K)); /* |x w| <= 1: error grows ~ sqrt(K) eps */
                }
            CHECKF(worst < 1e-6, "M=%d N=%d K=%d acc=%d: error %.3g", M, N, K, acc, worst);
        }
        free(x);
        free(w);
        free(y1);
        free(y2);
    }
}

/* Row m of a batch equals the same row computed alone, bit for bit, for
 * every batch size and position. */
static void test_batch_invariance(void)
{
    enum { K = 520, N = 33, MM = KVQ_MATVEC_MAX_M };
    kvq_rng r;
    kvq_rng_init(&r, 7);
    float *x = malloc((size_t)MM * K * sizeof *x), *w = malloc((size_t)N * K * sizeof *w);
    float one[N], *y = malloc((size_t)MM * N * sizeof *y);
    fill(x, (size_t)MM * K, &r);
    fill(w, (size_t)N * K, &r);
    int bad = 0;
    for (int M = 1; M <= MM; M++) {
        kvq_matvec(x, K, w, y, N, M, N, K, 0);
        for (int m = 0; m < M; m++) {
            kvq_matvec(x + (size_t)m * K, K, w, one, N, 1, N, K, 0);
            bad += memcmp(one, y + (size_t)m * N, sizeof one) != 0;
        }
    }
    CHECKF(bad == 0, "%d rows differ from their single-row result", bad);
    free(x);
    free(w);
    free(y);
}

/* bf16 and f16 weights: the kernel widens them as it loads, so its result
 * is bit-identical to the f32 kernel over the widened matrix (same
 * operations on the same values), for every row count; and the scalar
 * typed reference agrees with the f32 reference likewise. */
static void test_typed_weights(void)
{
    if (!kvq_cpu_has_avx2())
        SKIP("no AVX2");
    enum { K = 531, N = 19, MM = KVQ_MATVEC_MAX_M };
    kvq_rng r;
    kvq_rng_init(&r, 11);
    float *x = malloc((size_t)MM * K * sizeof *x), *wf = malloc((size_t)N * K * sizeof *wf);
    uint16_t *wh = malloc((size_t)N * K * sizeof *wh);
    float *y1 = malloc((size_t)MM * N * sizeof *y1), *y2 = malloc((size_t)MM * N * sizeof *y2);
    fill(x, (size_t)MM * K, &r);
    for (int dt = KVQ_MV_BF16; dt <= KVQ_MV_F16; dt++) {
        for (size_t i = 0; i < (size_t)N * K; i++) {
            float v = (float)(kvq_rng_uniform(&r) * 2.0 - 1.0);
            wh[i] = dt == KVQ_MV_BF16 ? (uint16_t)(kvq_f32_bits(v) >> 16) : kvq_f32_to_f16(v);
            wf[i] = dt == KVQ_MV_BF16 ? kvq_bits_f32((uint32_t)wh[i] << 16) : kvq_f16_to_f32(wh[i]);
        }
        int bad = 0;
        for (int M = 1; M <= MM; M++) {
            kvq_matvec_avx2_w(x, K, wh, dt, y1, N, M, N, K, 0);
            kvq_matvec_avx2(x, K, wf, y2, N, M, N, K, 0);
            bad += memcmp(y1, y2, (size_t)M * N * sizeof *y1) != 0;
        }
        CHECKF(bad == 0, "dtype %d: %d row counts differ from the f32 kernel over the widened weights", dt, bad);
        kvq_matvec_ref_w(x, K, wh, dt, y1, N, 3, N, K, 0);
        kvq_matvec_ref(x, K, wf, y2, N, 3, N, K, 0);
        CHECKF(memcmp(y1, y2, (size_t)3 * N * sizeof *y1) == 0, "dtype %d: typed reference differs", dt);
    }
    free(x);
    free(wf);
    free(wh);
    free(y1);
    free(y2);
}

int main(void)
{
    RUN(test_avx2_vs_ref);
    RUN(test_batch_invariance);
    RUN(test_typed_weights);
    return TEST_END("test_decoder_matvec");
}
