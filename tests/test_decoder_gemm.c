/* test_decoder_gemm.c - the prefill product kernel (matvec_gemm.c): AVX-512
 * against the scalar reference, and that an output's bits depend neither on
 * the tile it falls in nor on how the product is cut into pieces (the CPU
 * backend splits it into weight slices over its threads, and the logits must
 * not depend on the thread count). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvq_rng.h"
#include "matvec_internal.h"
#include "test.h"

static void fill(float *v, size_t n, kvq_rng *r)
{
    for (size_t i = 0; i < n; i++)
        v[i] = (float)(kvq_rng_uniform(r) * 2.0 - 1.0);
}

static void test_avx512_vs_ref(void)
{
    if (!kvq_gemm_nt_usable())
        SKIP("no AVX-512");
    /* tile edges in M and N, K tails, the model's shapes */
    static const int shapes[][3] = {{1, 1, 1},    {1, 7, 15},   {3, 5, 16},   {4, 4, 33},     {5, 9, 512},
                                    {17, 64, 1024}, {7, 3, 100}, {13, 17, 257}, {256, 128, 512}, {33, 130, 1023}};
    kvq_rng r;
    kvq_rng_init(&r, 44);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], ldx = K + 3, ldw = K + 1, ldy = N + 5;
        float *x = malloc((size_t)M * ldx * sizeof *x), *w = malloc((size_t)N * ldw * sizeof *w);
        float *y1 = malloc((size_t)M * ldy * sizeof *y1), *y2 = malloc((size_t)M * ldy * sizeof *y2);
        fill(x, (size_t)M * ldx, &r);
        fill(w, (size_t)N * ldw, &r);
        for (int acc = 0; acc < 2; acc++) {
            fill(y1, (size_t)M * ldy, &r);
            memcpy(y2, y1, (size_t)M * ldy * sizeof *y1);
            kvq_gemm_nt_avx512(x, ldx, w, ldw, y1, ldy, M, N, K, acc);
            kvq_gemm_nt_ref(x, ldx, w, ldw, y2, ldy, M, N, K, acc);
            double worst = 0;
            int outside = 0;
            for (int m = 0; m < M; m++)
                for (int n = 0; n < ldy; n++) {
                    double d = fabs((double)y1[m * ldy + n] - y2[m * ldy + n]);
                    if (n >= N)
                        outside += d != 0; /* columns beyond N untouched */
                    else
                        worst = fmax(worst, d / sqrt((double)K)); /* |x w| <= 1: error grows ~ sqrt(K) eps */
                }
            CHECKF(outside == 0, "M=%d N=%d K=%d acc=%d: %d columns past N written", M, N, K, acc, outside);
            CHECKF(worst < 1e-6, "M=%d N=%d K=%d acc=%d: error %.3g", M, N, K, acc, worst);
        }
        free(x);
        free(w);
        free(y1);
        free(y2);
    }
}

/* The whole product equals, bit for bit, the product cut into row ranges of
 * x and slices of weight rows of any sizes (every tile position), and each
 * row computed alone. */
static void test_split_invariance(void)
{
    if (!kvq_gemm_nt_usable())
        SKIP("no AVX-512");
    enum { M = 23, N = 37, K = 300 };
    kvq_rng r;
    kvq_rng_init(&r, 9);
    float *x = malloc((size_t)M * K * sizeof *x), *w = malloc((size_t)N * K * sizeof *w);
    float *whole = malloc((size_t)M * N * sizeof *whole), *part = malloc((size_t)M * N * sizeof *part);
    fill(x, (size_t)M * K, &r);
    fill(w, (size_t)N * K, &r);
    kvq_gemm_nt_avx512(x, K, w, K, whole, N, M, N, K, 0);
    int bad = 0;
    for (int bm = 1; bm <= 7; bm++)
        for (int bn = 1; bn <= 9; bn += 2) {
            memset(part, 0, (size_t)M * N * sizeof *part);
            for (int m0 = 0; m0 < M; m0 += bm)
                for (int n0 = 0; n0 < N; n0 += bn)
                    kvq_gemm_nt_avx512(x + (size_t)m0 * K, K, w + (size_t)n0 * K, K, part + (size_t)m0 * N + n0, N,
                                       M - m0 < bm ? M - m0 : bm, N - n0 < bn ? N - n0 : bn, K, 0);
            bad += memcmp(part, whole, (size_t)M * N * sizeof *part) != 0;
        }
    CHECKF(bad == 0, "%d of 35 splits differ from the whole product", bad);
    free(x);
    free(w);
    free(whole);
    free(part);
}

int main(void)
{
    RUN(test_avx512_vs_ref);
    RUN(test_split_invariance);
    return TEST_END("test_decoder_gemm");
}
