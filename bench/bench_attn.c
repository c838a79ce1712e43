/* bench_attn.c - fused CPU decode attention over the packed cache against the
 * straightforward f32 and f16 ways, single-threaded.
 *
 * One KV head with n_q query heads (2 as in the bundled model, 4 as in
 * Llama-3-8B), d = 128, contexts 4K, 32K and 128K tokens:
 *   tq3j/tq3   kvq_attn_decode on a tq3j K / tq3 V cache (118 bytes per token):
 *              the AVX-512 kernels where the CPU has them
 *   tq avx2    the same cache through the AVX2 kernels
 *   q8_0       kvq_attn_decode on a q8_0 K / q8_0 V cache (272 bytes)
 *   f16 cache  kvq_attn_decode on an f16 cache (512 bytes)
 *   f16        contiguous f16 K and V arrays, F16C + FMA loops: scores of all
 *              heads per key, vectorised softmax, then p^T V (512 bytes)
 *   f32 sgemv  contiguous f32 arrays, OpenBLAS: per head sgemv q.K^T,
 *              softmax, sgemv p^T V (1024 bytes; K and V read once per head)
 *   f32 sgemm  the same with one sgemm per product for all heads at once
 * Each variant is timed "warm" (calls back to back: the cache may sit in
 * L2/L3) and "cold" (a 256 MiB buffer is read between calls, as in real
 * decoding, where the other layers' caches and weights are read between two
 * visits to one layer's cache). The variants are interleaved within every
 * repetition so that machine noise hits them alike; medians are reported,
 * with GB/s = bytes of K+V touched / time, and the ratios of the best f32
 * and the best f16 way to tq3j/tq3.
 *
 *   bench_attn [--quick] [--cpu-clock]
 *     --quick      fewer repetitions (a smoke test)
 *     --cpu-clock  time with the thread's CPU clock instead of wall time
 * JSON: $KVQ_BENCH_JSON_DIR/bench_attn.json (default: this binary's folder).
 */
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "attn_internal.h"
#include "kvq_cpu.h"
#include "kvq_attn.h"
#include "kvq_half.h"
#include "kvq_rng.h"
#include "bench_util.h"

void openblas_set_num_threads(int num_threads);

#define D 128
#define MAX_Q 4
#define MAX_CTX 131072
#define FLUSH_BYTES (256u << 20)

/* Wall time by default; --cpu-clock times this thread's CPU time instead,
 * which a busy machine disturbs less (the benchmark is single-threaded, and
 * time stalled on memory still counts as the thread's). */
static clockid_t bench_clock = CLOCK_MONOTONIC;

static void *xalloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "bench_attn: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* ---- the baselines ---- */

struct data {
    float *k32, *v32;      /* [MAX_CTX][D] */
    uint16_t *k16, *v16;   /* the same rounded to f16 */
    float *s, *p;          /* [MAX_Q][MAX_CTX] scores / weights; sgemm: [MAX_CTX][MAX_Q] */
};

/* Vectorised e^x for x <= 0, as the library's softmax (Cephes expf polynomial). */
__attribute__((target("avx2,fma"))) static __m256 exp_ps(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.33654f));
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* s[0..n) <- softmax(scale * s) in place (n a multiple of 8); stride between elements 1. */
__attribute__((target("avx2,fma"))) static void softmax_row(float *s, size_t n, float scale)
{
    __m256 mx = _mm256_set1_ps(-INFINITY), sc = _mm256_set1_ps(scale);
    for (size_t i = 0; i < n; i += 8)
        mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + i));
    float m8[8], m = -INFINITY;
    _mm256_storeu_ps(m8, mx);
    for (int i = 0; i < 8; i++)
        m = m8[i] > m ? m8[i] : m;
    /* scale > 0, so max(scale s) = scale max(s) */
    __m256 mm = _mm256_set1_ps(scale * m), sum = _mm256_setzero_ps();
    for (size_t i = 0; i < n; i += 8) {
        __m256 e = exp_ps(_mm256_fmsub_ps(sc, _mm256_loadu_ps(s + i), mm));
        _mm256_storeu_ps(s + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    float s8[8], t = 0.0f;
    _mm256_storeu_ps(s8, sum);
    for (int i = 0; i < 8; i++)
        t += s8[i];
    __m256 inv = _mm256_set1_ps(1.0f / t);
    for (size_t i = 0; i < n; i += 8)
        _mm256_storeu_ps(s + i, _mm256_mul_ps(inv, _mm256_loadu_ps(s + i)));
}

static void f32_sgemv(const struct data *x, size_t n, const float *q, int n_q, float scale, float *out)
{
    for (int h = 0; h < n_q; h++) {
        float *s = x->s + (size_t)h * MAX_CTX;
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)n, D, 1.0f, x->k32, D, q + h * D, 1, 0.0f, s, 1);
        softmax_row(s, n, scale);
        cblas_sgemv(CblasRowMajor, CblasTrans, (int)n, D, 1.0f, x->v32, D, s, 1, 0.0f, out + h * D, 1);
    }
}

static void f32_sgemm(const struct data *x, size_t n, const float *q, int n_q, float scale, float *out)
{
    /* S = Q K^T as [n_q][n]: K read once for all heads */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_q, (int)n, D, 1.0f, q, D, x->k32, D, 0.0f, x->s,
                MAX_CTX);
    for (int h = 0; h < n_q; h++)
        softmax_row(x->s + (size_t)h * MAX_CTX, n, scale);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n_q, D, (int)n, 1.0f, x->s, MAX_CTX, x->v32, D, 0.0f,
                out, D);
}

/* f16: scores of all heads per key (each K row read once), softmax, then
 * out_h = sum_i p_hi v_i with (heads x 8-coordinate group) accumulators kept
 * in registers over a block of 256 rows (the block stays in L1 across passes). */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
f16_attn_n(const int NQ, const struct data *x, size_t n, const float *q, float scale, float *out)
{
    for (size_t i = 0; i < n; i++) {
        const uint16_t *kr = x->k16 + i * D;
        __m256 a[MAX_Q][2];
#pragma GCC unroll 4
        for (int h = 0; h < NQ; h++)
            a[h][0] = a[h][1] = _mm256_setzero_ps();
        for (int j = 0; j < D; j += 16) {
            __m256 k0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(kr + j)));
            __m256 k1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(kr + j + 8)));
#pragma GCC unroll 4
            for (int h = 0; h < NQ; h++) {
                a[h][0] = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q + h * D + j), a[h][0]);
                a[h][1] = _mm256_fmadd_ps(k1, _mm256_loadu_ps(q + h * D + j + 8), a[h][1]);
            }
        }
#pragma GCC unroll 4
        for (int h = 0; h < NQ; h++) {
            __m256 t = _mm256_add_ps(a[h][0], a[h][1]);
            __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
            s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
            x->s[(size_t)h * MAX_CTX + i] = _mm_cvtss_f32(s4);
        }
    }
    for (int h = 0; h < NQ; h++)
        softmax_row(x->s + (size_t)h * MAX_CTX, n, scale);
    const int TG = 8 / NQ;
    __m256 sum[MAX_Q][D / 8];
    for (int h = 0; h < NQ; h++)
        for (int g = 0; g < D / 8; g++)
            sum[h][g] = _mm256_setzero_ps();
    for (size_t i0 = 0; i0 < n; i0 += 256) {
        const size_t i1 = i0 + 256 < n ? i0 + 256 : n;
        for (int g0 = 0; g0 < D / 8; g0 += TG) {
            __m256 acc[MAX_Q][8];
#pragma GCC unroll 4
            for (int h = 0; h < NQ; h++)
#pragma GCC unroll 8
                for (int t = 0; t < TG; t++)
                    acc[h][t] = sum[h][g0 + t];
            for (size_t i = i0; i < i1; i++) {
                const uint16_t *vr = x->v16 + i * D + 8 * g0;
                __m256 w[MAX_Q];
#pragma GCC unroll 4
                for (int h = 0; h < NQ; h++)
                    w[h] = _mm256_broadcast_ss(x->s + (size_t)h * MAX_CTX + i);
#pragma GCC unroll 8
                for (int t = 0; t < TG; t++) {
                    __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(vr + 8 * t)));
#pragma GCC unroll 4
                    for (int h = 0; h < NQ; h++)
                        acc[h][t] = _mm256_fmadd_ps(w[h], v, acc[h][t]);
                }
            }
#pragma GCC unroll 4
            for (int h = 0; h < NQ; h++)
#pragma GCC unroll 8
                for (int t = 0; t < TG; t++)
                    sum[h][g0 + t] = acc[h][t];
        }
    }
    for (int h = 0; h < NQ; h++)
        for (int g = 0; g < D / 8; g++)
            _mm256_storeu_ps(out + h * D + 8 * g, sum[h][g]);
}

__attribute__((target("avx2,fma,f16c"))) static void f16_attn(const struct data *x, size_t n, const float *q,
                                                              int n_q, float scale, float *out)
{
    if (n_q == 4)
        f16_attn_n(4, x, n, q, scale, out);
    else
        f16_attn_n(2, x, n, q, scale, out);
}

/* ---- harness ---- */

enum { V_TQ, V_TQ2, V_Q8, V_F16C, V_F16, V_F32V, V_F32M, N_VAR };
static const char *const var_name[N_VAR] = {"tq3j/tq3",  "tq avx2", "q8_0 cache", "f16 cache",
                                            "f16",       "f32 sgemv", "f32 sgemm"};
static const double var_bytes[N_VAR] = {118, 118, 272, 512, 512, 1024, 1024};

struct ctx_all {
    struct data x;
    kvq_cache *cache[3]; /* tq, q8_0, f16 */
    kvq_attn_workspace *ws;
    volatile uint64_t *flush;
};

static void run_variant(struct ctx_all *a, int v, size_t n, const float *q, int n_q, float scale, float *out)
{
    kvq_status st = KVQ_OK;
    switch (v) {
    case V_TQ: st = kvq_attn_decode(a->cache[0], 0, n, q, n_q, scale, out, a->ws); break;
    case V_TQ2:
        st = kvq_attn_decode_kernels(&kvq_attn_kernels_avx2, a->cache[0], 0, n, q, n_q, scale, out, a->ws);
        break;
    case V_Q8: st = kvq_attn_decode(a->cache[1], 0, n, q, n_q, scale, out, a->ws); break;
    case V_F16C: st = kvq_attn_decode(a->cache[2], 0, n, q, n_q, scale, out, a->ws); break;
    case V_F16: f16_attn(&a->x, n, q, n_q, scale, out); break;
    case V_F32V: f32_sgemv(&a->x, n, q, n_q, scale, out); break;
    case V_F32M: f32_sgemm(&a->x, n, q, n_q, scale, out); break;
    default: break;
    }
    if (st != KVQ_OK) {
        fprintf(stderr, "bench_attn: %s failed: %s\n", var_name[v], kvq_status_str(st));
        exit(1);
    }
}

static void flush_caches(struct ctx_all *a)
{
    uint64_t s = 0;
    for (size_t i = 0; i < FLUSH_BYTES / 8; i += 8)
        s += a->flush[i];
    a->flush[0] = s;
}

static double rel_err(const float *a, const float *b, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / den);
}

int main(int argc, char **argv)
{
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--cpu-clock") == 0) {
            bench_clock = CLOCK_THREAD_CPUTIME_ID;
        } else {
            fprintf(stderr, "usage: bench_attn [--quick] [--cpu-clock]\n");
            return 2;
        }
    }
    if (!kvq_cpu_has_avx2()) {
        printf("bench_attn: needs AVX2/FMA/F16C for the f16 baseline; skipped\n");
        return 0;
    }
    openblas_set_num_threads(1);
    struct ctx_all a;
    memset(&a, 0, sizeof a);
    a.x.k32 = xalloc((size_t)MAX_CTX * D * sizeof(float));
    a.x.v32 = xalloc((size_t)MAX_CTX * D * sizeof(float));
    a.x.k16 = xalloc((size_t)MAX_CTX * D * sizeof(uint16_t));
    a.x.v16 = xalloc((size_t)MAX_CTX * D * sizeof(uint16_t));
    a.x.s = xalloc((size_t)MAX_Q * MAX_CTX * sizeof(float));
    a.flush = xalloc(FLUSH_BYTES);
    memset((void *)a.flush, 1, FLUSH_BYTES);
    kvq_rng rng;
    kvq_rng_init(&rng, 2024);
    for (size_t i = 0; i < (size_t)MAX_CTX * D; i++) {
        int j = (int)(i % D);
        double o = (j == 5 || j == 77) ? 6.0 : 1.0; /* a few outlier channels, as in real keys */
        a.x.k32[i] = (float)(o * kvq_rng_gauss(&rng));
        a.x.v32[i] = (float)kvq_rng_gauss(&rng);
        a.x.k16[i] = kvq_f32_to_f16(a.x.k32[i]);
        a.x.v16[i] = kvq_f32_to_f16(a.x.v32[i]);
    }
    const enum kvq_type types[3][2] = {
        {KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3}, {KVQ_TYPE_Q8_0, KVQ_TYPE_Q8_0}, {KVQ_TYPE_F16, KVQ_TYPE_F16}};
    for (int t = 0; t < 3; t++) {
        struct kvq_cache_config cfg;
        kvq_cache_config_default(&cfg, 1, D, MAX_CTX);
        cfg.type_k = types[t][0];
        cfg.type_v = types[t][1];
        kvq_status st = kvq_cache_create(&cfg, &a.cache[t]);
        for (size_t i = 0; st == KVQ_OK && i < MAX_CTX; i += 4096)
            st = kvq_cache_append(a.cache[t], 4096, a.x.k32 + i * D, a.x.v32 + i * D);
        if (st != KVQ_OK) {
            fprintf(stderr, "bench_attn: cache: %s\n", kvq_status_str(st));
            return 1;
        }
    }
    if (kvq_attn_workspace_create(D, MAX_Q, MAX_CTX, &a.ws) != KVQ_OK)
        return 1;

    const char *dir = getenv("KVQ_BENCH_JSON_DIR");
    char path[4096];
    if (dir && *dir) {
        snprintf(path, sizeof path, "%s/bench_attn.json", dir);
    } else {
        const char *slash = strrchr(argv[0], '/');
        int len = slash ? (int)(slash - argv[0]) : 1;
        snprintf(path, sizeof path, "%.*s/bench_attn.json", len, slash ? argv[0] : ".");
    }
    FILE *json = fopen(path, "w");
    if (!json) {
        fprintf(stderr, "bench_attn: cannot write %s\n", path);
        return 1;
    }
    fprintf(json,
            "{\n  \"benchmark\": \"bench_attn\",\n  \"head_dim\": %d,\n  \"threads\": 1,\n  \"clock\": \"%s\",\n"
            "  \"tq_kernels\": \"%s\",\n  \"results\": [",
            D, bench_clock == CLOCK_MONOTONIC ? "wall" : "thread_cpu", kvq_attn_avx512_usable() ? "avx512" : "avx2");

    const size_t ctxs[] = {4096, 32768, 131072};
    const int nqs[] = {2, 4};
    const float scale = 1.0f / sqrtf((float)D);
    float q[MAX_Q * D], out[MAX_Q * D], ref[MAX_Q * D];
    for (int i = 0; i < MAX_Q * D; i++)
        q[i] = (float)kvq_rng_gauss(&rng);
    int first = 1;
    printf("fused decode attention, d=%d, one KV head, single thread; median us over repetitions (%s)\n", D,
           bench_clock == CLOCK_MONOTONIC ? "wall clock" : "thread CPU clock");
    printf("tq3j/tq3 kernels: %s\n", kvq_attn_avx512_usable() ? "avx512" : "avx2");
    printf("%7s %3s  %-10s %10s %10s %9s %9s\n", "ctx", "n_q", "variant", "warm us", "cold us", "warm GB/s",
           "cold GB/s");
    for (size_t ci = 0; ci < sizeof ctxs / sizeof *ctxs; ci++)
        for (size_t qi = 0; qi < sizeof nqs / sizeof *nqs; qi++) {
            const size_t n = ctxs[ci];
            const int n_q = nqs[qi];
            const int reps = quick ? 3 : n >= 131072 ? 9 : n >= 32768 ? 15 : 31;
            double tw[N_VAR][64], tc[N_VAR][64], err[N_VAR];
            /* accuracy against f32 (sanity: every variant computes the same thing) */
            f32_sgemm(&a.x, n, q, n_q, scale, ref);
            for (int v = 0; v < N_VAR; v++) {
                run_variant(&a, v, n, q, n_q, scale, out);
                err[v] = rel_err(out, ref, n_q * D);
            }
            for (int r = 0; r < reps; r++)
                for (int v = 0; v < N_VAR; v++) {
                    run_variant(&a, v, n, q, n_q, scale, out);
                    double t1 = bench_clock_s(bench_clock);
                    run_variant(&a, v, n, q, n_q, scale, out);
                    tw[v][r] = bench_clock_s(bench_clock) - t1; /* the second of two back-to-back calls */
                    flush_caches(&a);
                    double t3 = bench_clock_s(bench_clock);
                    run_variant(&a, v, n, q, n_q, scale, out);
                    tc[v][r] = bench_clock_s(bench_clock) - t3;
                }
            double mw[N_VAR], mc[N_VAR];
            for (int v = 0; v < N_VAR; v++) {
                mw[v] = bench_median(tw[v], reps);
                mc[v] = bench_median(tc[v], reps);
                double gb = var_bytes[v] * (double)n / 1e9;
                printf("%7zu %3d  %-10s %10.1f %10.1f %9.2f %9.2f\n", n, n_q, var_name[v], mw[v] * 1e6, mc[v] * 1e6,
                       gb / mw[v], gb / mc[v]);
                fprintf(json,
                        "%s\n    {\"ctx\": %zu, \"n_q\": %d, \"variant\": \"%s\", \"bytes_per_token\": %g, "
                        "\"warm_us\": %.2f, \"cold_us\": %.2f, \"warm_gbs\": %.3f, \"cold_gbs\": %.3f, "
                        "\"rel_err_vs_f32\": %.3g, \"reps\": %d}",
                        first ? "" : ",", n, n_q, var_name[v], var_bytes[v], mw[v] * 1e6, mc[v] * 1e6, gb / mw[v],
                        gb / mc[v], err[v], reps);
                first = 0;
            }
            double f32w = fmin(mw[V_F32V], mw[V_F32M]), f32c = fmin(mc[V_F32V], mc[V_F32M]);
            double f16w = fmin(mw[V_F16], mw[V_F16C]), f16c = fmin(mc[V_F16], mc[V_F16C]);
            printf("%7s %3s  speed-up of tq3j/tq3: vs best f32 %.2fx warm, %.2fx cold; vs best f16 %.2fx warm, "
                   "%.2fx cold\n",
                   "", "", f32w / mw[V_TQ], f32c / mc[V_TQ], f16w / mw[V_TQ], f16c / mc[V_TQ]);
            fprintf(json,
                    ",\n    {\"ctx\": %zu, \"n_q\": %d, \"variant\": \"ratios\", \"tq_vs_f32_warm\": %.3f, "
                    "\"tq_vs_f32_cold\": %.3f, \"tq_vs_f16_warm\": %.3f, \"tq_vs_f16_cold\": %.3f}",
                    n, n_q, f32w / mw[V_TQ], f32c / mc[V_TQ], f16w / mw[V_TQ], f16c / mc[V_TQ]);
        }
    fprintf(json, "\n  ]\n}\n");
    fclose(json);
    printf("JSON: %s\n", path);
    for (int t = 0; t < 3; t++)
        kvq_cache_free(a.cache[t]);
    kvq_attn_workspace_free(a.ws);
    free(a.x.k32);
    free(a.x.v32);
    free(a.x.k16);
    free(a.x.v16);
    free(a.x.s);
    free((void *)a.flush);
    return 0;
}
