/* matvec_gemm.c - y[M][N] (+)= x[M][K] . w[N][K]^T for prefill chunks
 * (M = a chunk's rows, N = one slice of weight rows), AVX-512, and its
 * scalar reference. The CPU backend uses it only with KVQ_GEMM_AVX512=1
 * (backend_cpu.c says why).
 *
 * Written because Debian's OpenBLAS 0.3.21 does not know this machine's CPU
 * (an Intel Xeon, family 6 model 207) and runs its SSE3 "Prescott" kernels
 * there (OPENBLAS_VERBOSE=2 says so): 30 GFLOPS on one core, where this
 * kernel does ~95 and OpenBLAS's own AVX-512 kernels (OPENBLAS_CORETYPE=
 * SkylakeX, which the kvq command now sets itself) ~127.
 *
 * The kernel is the dot-product form: both operands are row-major with K
 * contiguous, so the weights need no packing (a slice is widened from bf16
 * once, row-major, by the caller) and x none either. A register tile is 4
 * rows of x by 6 weight rows: 24 zmm accumulators, each the 16-lane partial
 * sums of one output. Lane sums are reduced at the end.
 *
 * Every output is computed by the same operations in the same order
 * whatever M, N, the tile it falls in or the thread that runs it: lanes
 * accumulate k in order, the K tail is a masked load (zeros), the reduction
 * is one fixed tree; a partial tile repeats its last row or column (the
 * copies are not stored). So results are batch-invariant and do not depend
 * on how a caller slices the product over threads.
 */
#include <stdlib.h>

#include "kvq_cpu.h"
#include "matvec_internal.h"

void kvq_gemm_nt_ref(const float *x, int ldx, const float *w, int ldw, float *y, int ldy, int M, int N, int K,
                     int accumulate)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0.0;
            for (int k = 0; k < K; k++)
                s += (double)x[(size_t)m * ldx + k] * w[(size_t)n * ldw + k];
            float *o = y + (size_t)m * ldy + n;
            *o = accumulate ? *o + (float)s : (float)s;
        }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define TGT __attribute__((target("avx512f,avx2,fma")))
#define INLINE static inline __attribute__((always_inline, target("avx512f,avx2,fma")))

int kvq_gemm_nt_usable(void)
{
    static _Atomic int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        /* kvq_cpu_has_avx2() is 0 under KVQ_FORCE_SCALAR; __builtin_cpu_supports
         * also checks that the OS saves the zmm state */
        const char *off = getenv("KVQ_GEMM_NO_AVX512");
        cached = kvq_cpu_has_avx2() && __builtin_cpu_supports("avx512f") && !(off && *off && *off != '0');
    }
    return cached;
}

/* The sum of the 16 lanes, always by the same tree. */
INLINE float hsum(__m512 v)
{
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* The 16-lane sums of a, b, c, d in lanes 0, 4, 8, 12, each by exactly
 * hsum's tree (the same bits as hsum of each). */
INLINE __m512 hsum4(__m512 a, __m512 b, __m512 c, __m512 d)
{
    /* l + l+8: 256-bit halves, two vectors per register */
    const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    /* l + l+4: 128-bit lanes 0 + 1 and 2 + 3 of each; now one vector per lane */
    __m512 e = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
    /* l + l+2, then l + l+1, within each 128-bit lane */
    e = _mm512_add_ps(e, _mm512_permute_ps(e, 0x4E));
    return _mm512_add_ps(e, _mm512_permute_ps(e, 0xB1));
}

/* One tile of 4 rows of x by 6 weight rows: xr[0..3], wr[0..5] (pointers,
 * the last repeated in a partial tile); writes the first mt x nt outputs.
 * 24 accumulators + 6 weight vectors + 1 x vector fill the 32 zmm registers:
 * per 16 coordinates 10 loads feed 24 FMAs, so the x rows, which stream from
 * L2, cost 4 loads per 24 FMAs. The accumulators are named variables: as an
 * array indexed in loops, gcc kept them in memory. */
#define ROW6(i, xv)                                                                                                    \
    do {                                                                                                               \
        a##i##0 = _mm512_fmadd_ps(xv, w0, a##i##0);                                                                    \
        a##i##1 = _mm512_fmadd_ps(xv, w1, a##i##1);                                                                    \
        a##i##2 = _mm512_fmadd_ps(xv, w2, a##i##2);                                                                    \
        a##i##3 = _mm512_fmadd_ps(xv, w3, a##i##3);                                                                    \
        a##i##4 = _mm512_fmadd_ps(xv, w4, a##i##4);                                                                    \
        a##i##5 = _mm512_fmadd_ps(xv, w5, a##i##5);                                                                    \
    } while (0)
#define STEP(LOAD)                                                                                                     \
    do {                                                                                                               \
        const __m512 w0 = LOAD(w0p + k), w1 = LOAD(w1p + k), w2 = LOAD(w2p + k);                                       \
        const __m512 w3 = LOAD(w3p + k), w4 = LOAD(w4p + k), w5 = LOAD(w5p + k);                                       \
        __m512 xv = LOAD(x0p + k);                                                                                     \
        ROW6(0, xv);                                                                                                   \
        xv = LOAD(x1p + k);                                                                                            \
        ROW6(1, xv);                                                                                                   \
        xv = LOAD(x2p + k);                                                                                            \
        ROW6(2, xv);                                                                                                   \
        xv = LOAD(x3p + k);                                                                                            \
        ROW6(3, xv);                                                                                                   \
    } while (0)
#define TM 4
#define TN 6

INLINE void tile(const float *const xr[TM], const float *const wr[TN], int K, float *y, int ldy, int mt, int nt,
                 int accumulate)
{
    const float *x0p = xr[0], *x1p = xr[1], *x2p = xr[2], *x3p = xr[3];
    const float *w0p = wr[0], *w1p = wr[1], *w2p = wr[2], *w3p = wr[3], *w4p = wr[4], *w5p = wr[5];
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a04 = a00, a05 = a00;
    __m512 a10 = a00, a11 = a00, a12 = a00, a13 = a00, a14 = a00, a15 = a00;
    __m512 a20 = a00, a21 = a00, a22 = a00, a23 = a00, a24 = a00, a25 = a00;
    __m512 a30 = a00, a31 = a00, a32 = a00, a33 = a00, a34 = a00, a35 = a00;
    int k = 0;
#define LOADU(p) _mm512_loadu_ps(p)
    for (; k + 16 <= K; k += 16)
        STEP(LOADU);
    if (k < K) { /* zeros past K: the lanes' sums are unchanged (0 * 0 + acc) */
        const __mmask16 mk = (__mmask16)((1u << (K - k)) - 1);
#define LOADM(p) _mm512_maskz_loadu_ps(mk, p)
        STEP(LOADM);
#undef LOADM
    }
#undef LOADU
    /* column j's 4 outputs (rows i = 0..3) are reduced together, each by
     * hsum's tree: lanes l + l+8, then l + l+4, l + l+2, l + l+1 */
    const __m512 col[TN][TM] = {{a00, a10, a20, a30}, {a01, a11, a21, a31}, {a02, a12, a22, a32},
                                {a03, a13, a23, a33}, {a04, a14, a24, a34}, {a05, a15, a25, a35}};
    for (int j = 0; j < nt; j++) {
        float s[16];
        _mm512_storeu_ps(s, hsum4(col[j][0], col[j][1], col[j][2], col[j][3]));
        for (int i = 0; i < mt; i++) {
            float *o = y + (size_t)i * ldy + j;
            *o = accumulate ? *o + s[4 * i] : s[4 * i];
        }
    }
}
#undef STEP
#undef ROW6

TGT void kvq_gemm_nt_avx512(const float *x, int ldx, const float *w, int ldw, float *y, int ldy, int M, int N,
                            int K, int accumulate)
{
    /* weight tiles outer: 6 weight rows (24 KiB at K = 1024) stay in L1
     * while the chunk's rows stream past them from L2 */
    for (int n0 = 0; n0 < N; n0 += TN) {
        const int nt = N - n0 < TN ? N - n0 : TN;
        const float *wr[TN];
        for (int j = 0; j < TN; j++)
            wr[j] = w + (size_t)(n0 + (j < nt ? j : nt - 1)) * ldw;
        for (int m0 = 0; m0 < M; m0 += TM) {
            const int mt = M - m0 < TM ? M - m0 : TM;
            const float *xr[TM];
            for (int i = 0; i < TM; i++)
                xr[i] = x + (size_t)(m0 + (i < mt ? i : mt - 1)) * ldx;
            tile(xr, wr, K, y + (size_t)m0 * ldy + n0, ldy, mt, nt, accumulate);
        }
    }
}

#else

int kvq_gemm_nt_usable(void)
{
    return 0;
}

void kvq_gemm_nt_avx512(const float *x, int ldx, const float *w, int ldw, float *y, int ldy, int M, int N, int K,
                        int accumulate)
{
    kvq_gemm_nt_ref(x, ldx, w, ldw, y, ldy, M, N, K, accumulate);
}

#endif
