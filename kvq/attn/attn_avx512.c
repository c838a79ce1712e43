/* attn_avx512.c - AVX-512 block kernels for tq keys and values.
 *
 * The same algorithm as attn_avx2.c, 16 coordinates per step instead of 8,
 * which halves the instructions per key (the AVX2 kernels are bound by
 * instruction throughput, not by memory). Expanding 16 B-bit codes:
 *   one 64-bit load of the B*16 code bits, broadcast;
 *   vpmultishiftqb (AVX512-VBMI) copies bits [B*l, B*l + 8) of it into the
 *   low byte of lane l (for B = 4 the last lane wraps around the qword, which
 *   still leaves code 15 in its low nibble);
 *   vpermps with a 16-entry table reads the low 4 bits of each lane: the
 *   centroids repeated every 2^B entries, so the neighbouring code's bits do
 *   not matter and 4-bit codes need no blend.
 * Only tq rows take this path (baseline types keep their AVX2 kernels), only
 * for head dims that are a multiple of 16, and only when the CPU and the OS
 * support AVX-512 F/BW/VL/VBMI (kvq_attn_avx512_usable()).
 *
 * The file is compiled with the library's default flags: every function
 * carries the target attribute instead, so the rest of the library stays
 * runnable on any x86-64.
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "attn_internal.h"
#include "kvq_cpu.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")))

int kvq_attn_avx512_usable(void)
{
    static _Atomic int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        /* __builtin_cpu_supports also checks that the OS saves the zmm state */
        const char *off = getenv("KVQ_ATTN_NO_AVX512");
        int ok = kvq_cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi") &&
                 !(off && *off && *off != '0');
        cached = ok;
    }
    return cached;
}

struct consts16 {
    __m512 tab;    /* codebook (or -1/+1 for sign bits), repeated to 16 entries */
    __m512i sel;   /* multishift control: lane l takes the byte at bit B*l */
    int bytes;     /* bytes of code per 16 coordinates: 2B */
};

/* Built with vector operations (see make_consts in attn_avx2.c). */
TGT static struct consts16 make_consts16(const kvq_codec *c, int sign)
{
    struct consts16 k;
    const int B = sign ? 1 : c->bits;
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    if (sign)
        k.tab = _mm512_setr_ps(-1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1);
    else /* centroids[l mod levels] */
        k.tab = _mm512_permutexvar_ps(_mm512_and_si512(lane, _mm512_set1_epi32(c->levels - 1)),
                                      _mm512_loadu_ps(c->centroids));
    /* lane l reads from bit B*l: byte 0 of dword l (byte 4m or 4m+4 of qword m) */
    k.sel = _mm512_mullo_epi32(lane, _mm512_set1_epi32(B));
    k.bytes = 2 * B;
    return k;
}

/* Coordinates 16g .. 16g+15 of the row at r. The 8-byte load ends at most
 * 6 bytes past the codes of a 3-bit row, inside the page or its padding. */
INLINE __m512 expand16(const uint8_t *r, int g, const struct consts16 *k)
{
    uint64_t w;
    memcpy(&w, r + (size_t)k->bytes * (size_t)g, sizeof w);
    __m512i idx = _mm512_multishift_epi64_epi8(k->sel, _mm512_set1_epi64((long long)w));
    return _mm512_permutexvar_ps(idx, k->tab);
}

/* Eight 16-lane vectors -> one vector of their eight horizontal sums. */
INLINE __m256 hsum8x16(const __m512 *v)
{
    __m256 h[8];
    for (int i = 0; i < 8; i++)
        h[i] = _mm256_add_ps(_mm512_castps512_ps256(v[i]), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v[i]), 1)));
    __m256 h01 = _mm256_hadd_ps(h[0], h[1]), h23 = _mm256_hadd_ps(h[2], h[3]);
    __m256 h45 = _mm256_hadd_ps(h[4], h[5]), h67 = _mm256_hadd_ps(h[6], h[7]);
    __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67);
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* ---- score: as score_pass in attn_avx2.c, 16 coordinates per step ---- */

INLINE void score_pass16(const int QC, const int KB, const int NW, const uint8_t *codes, uint32_t stride,
                         const uint8_t *signs, uint32_t sstride, const uint64_t *lut, size_t lut_words,
                         uint64_t *ssum, uint32_t n, int dim, const float *q, float *dot, const struct consts16 *k)
{
    const int G = dim / 16;
    for (uint32_t i0 = 0; i0 < n; i0 += 8) {
        __m512 part[KVQ_ATTN_QCHUNK][8];
        for (int k0 = 0; k0 < 8; k0 += KB) {
            __m512 a[4][KVQ_ATTN_QCHUNK];
            uint64_t sa[4][2];
            const uint8_t *r = codes + (size_t)(i0 + (uint32_t)k0) * stride;
            const uint8_t *sg = NW ? signs + (size_t)(i0 + (uint32_t)k0) * sstride : NULL;
#pragma GCC unroll 4
            for (int kb = 0; kb < KB; kb++) {
                sa[kb][0] = sa[kb][1] = 0;
#pragma GCC unroll 4
                for (int h = 0; h < QC; h++)
                    a[kb][h] = _mm512_setzero_ps();
            }
            const uint64_t *t = lut;
            const float *qg = q;
            for (int g = 0; g < G; g++, t += 512, qg += 16 * QC) {
                __m512 x[4];
#pragma GCC unroll 4
                for (int kb = 0; kb < KB; kb++)
                    x[kb] = expand16(r + (size_t)kb * stride, g, k);
#pragma GCC unroll 4
                for (int h = 0; h < QC; h++) {
                    __m512 qv = _mm512_load_ps(qg + 16 * h);
                    if (KB > 1) /* one load for KB FMAs (see attn_avx2.c) */
                        __asm__("" : "+v"(qv));
#pragma GCC unroll 4
                    for (int kb = 0; kb < KB; kb++)
                        a[kb][h] = _mm512_fmadd_ps(x[kb], qv, a[kb][h]);
                }
                /* two sign bytes per step: byte positions 2g and 2g + 1 */
#pragma GCC unroll 4
                for (int kb = 0; kb < KB; kb++)
#pragma GCC unroll 2
                    for (int w = 0; w < NW; w++) {
                        const uint8_t *s = sg + (size_t)kb * sstride + 2 * (size_t)g;
                        sa[kb][w] += t[(size_t)w * lut_words + s[0]] + t[(size_t)w * lut_words + 256 + s[1]];
                    }
            }
#pragma GCC unroll 4
            for (int kb = 0; kb < KB; kb++) {
#pragma GCC unroll 4
                for (int h = 0; h < QC; h++)
                    part[h][k0 + kb] = a[kb][h];
#pragma GCC unroll 2
                for (int w = 0; w < NW; w++)
                    ssum[(size_t)w * KVQ_ATTN_BLOCK + i0 + (uint32_t)(k0 + kb)] = sa[kb][w];
            }
        }
#pragma GCC unroll 4
        for (int h = 0; h < QC; h++)
            _mm256_store_ps(dot + (size_t)h * KVQ_ATTN_BLOCK + i0, hsum8x16(part[h]));
    }
}

#define SARGS codes, stride, signs, sstride, lut, lut_words, ssum, n, dim, q, dot, k
TGT static void score_chunk16(int qc, int sign, const uint8_t *codes, uint32_t stride, const uint8_t *signs,
                              uint32_t sstride, const uint64_t *lut, size_t lut_words, uint64_t *ssum, uint32_t n,
                              int dim, const float *q, float *dot, const struct consts16 *k)
{
    if (qc == 4)
        sign ? score_pass16(4, 2, 2, SARGS) : score_pass16(4, 4, 0, SARGS);
    else if (qc == 2)
        sign ? score_pass16(2, 4, 1, SARGS) : score_pass16(2, 4, 0, SARGS);
    else
        sign ? score_pass16(1, 4, 1, SARGS) : score_pass16(1, 4, 0, SARGS);
}

/* Lane l (0 or 1) of eight 64-bit words: the 32-bit halves, as 8 int32. */
INLINE __m256i words_half(const uint64_t *w, int l)
{
    const __m256i sel = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    __m256i a = _mm256_permutevar8x32_epi32(_mm256_load_si256((const __m256i *)(const void *)w), sel);
    __m256i b = _mm256_permutevar8x32_epi32(_mm256_load_si256((const __m256i *)(const void *)(w + 4)), sel);
    return l ? _mm256_permute2x128_si256(a, b, 0x31) : _mm256_permute2x128_si256(a, b, 0x20);
}

TGT static void score_avx512(const struct kvq_attn_job *job, const struct kvq_attn_block *b)
{
    const kvq_codec *ck = job->ck;
    if (!ck->traits->rotated || ck->bits > KVQ_TQ_SIMD_MAX_BITS) {
        kvq_attn_kernels_avx2.score(job, b);
        return;
    }
    const struct kvq_head_layout *hl = job->hk;
    kvq_attn_workspace *ws = job->ws;
    const int dim = job->dim, qjl = ck->traits->qjl, P = dim / 8;
    const struct consts16 k = make_consts16(ck, 0);
    const size_t lut_words = kvq_attn_lut_offset(dim, 2);
    const uint8_t *codes = b->kchunk + hl->codes_off + (size_t)b->s0 * hl->codes_stride;
    const uint8_t *signs = qjl ? b->kchunk + hl->signs_off + (size_t)b->s0 * hl->signs_stride : NULL;
    const uint32_t n8 = (b->n + 7) & ~7u;
    const __m256i bias = _mm256_set1_epi32(P << kvq_attn_lut_bits(P));
    const __m256 kappa = _mm256_set1_ps(ck->qjl_kappa_f), two = _mm256_set1_ps(2.0f);
    const uint16_t *norm = (const uint16_t *)(const void *)(b->kchunk + hl->norm_off) + b->s0;
    const uint16_t *rnorm = qjl ? (const uint16_t *)(const void *)(b->kchunk + hl->rnorm_off) + b->s0 : NULL;

    for (int q0 = 0; q0 < job->n_q; q0 += kvq_attn_chunk(job->n_q - q0)) {
        const int qc = kvq_attn_chunk(job->n_q - q0);
        float *dot = ws->dot + (size_t)q0 * KVQ_ATTN_BLOCK;
        score_chunk16(qc, qjl, codes, hl->codes_stride, signs, hl->signs_stride,
                      qjl ? ws->lut + kvq_attn_lut_offset(dim, q0) : NULL, lut_words, ws->ssum, b->n, dim,
                      ws->qint + (size_t)q0 * (size_t)dim, dot, &k);
        /* times the row norm, plus the QJL term g (2 P - T) */
        for (uint32_t i0 = 0; i0 < n8; i0 += 8) {
            __m256 nv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(norm + i0)));
            __m256 gv = _mm256_setzero_ps();
            if (rnorm)
                gv = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(rnorm + i0))), kappa);
            for (int h = 0; h < qc; h++) {
                float *dp = dot + (size_t)h * KVQ_ATTN_BLOCK + i0;
                __m256 a = _mm256_load_ps(dp);
                if (rnorm) {
                    __m256i s = _mm256_sub_epi32(words_half(ws->ssum + (size_t)(h >> 1) * KVQ_ATTN_BLOCK + i0, h & 1), bias);
                    __m256 p = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(ws->lut_inv[q0 + h]));
                    a = _mm256_fmadd_ps(gv, _mm256_fmsub_ps(two, p, _mm256_set1_ps(ws->qsum[q0 + h])), a);
                }
                _mm256_store_ps(dp, _mm256_mul_ps(nv, a));
            }
        }
    }
}

/* ---- value ---- */

/* acc[h][16(g0+t) ..] = alpha_h acc + sum_i w[h][i] row_i[16(g0+t) ..]. */
INLINE void value_tile16(const int QC, const int TG, int g0, const uint8_t *rows, uint32_t stride, uint32_t n,
                         const float *w, double *acc, const double *alpha, int dim, const struct consts16 *k)
{
    __m512 a[KVQ_ATTN_QCHUNK][8];
#pragma GCC unroll 4
    for (int h = 0; h < QC; h++)
#pragma GCC unroll 8
        for (int t = 0; t < TG; t++)
            a[h][t] = _mm512_setzero_ps();
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *r = rows + (size_t)i * stride;
        __m512 wq[KVQ_ATTN_QCHUNK];
#pragma GCC unroll 4
        for (int h = 0; h < QC; h++)
            wq[h] = _mm512_set1_ps(w[(size_t)h * KVQ_ATTN_BLOCK + i]);
#pragma GCC unroll 8
        for (int t = 0; t < TG; t++) {
            __m512 x = expand16(r, g0 + t, k);
#pragma GCC unroll 4
            for (int h = 0; h < QC; h++)
                a[h][t] = _mm512_fmadd_ps(wq[h], x, a[h][t]);
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < QC; h++) {
        const __m512d al = _mm512_set1_pd(alpha[h]);
#pragma GCC unroll 8
        for (int t = 0; t < TG; t++) {
            double *p = acc + (size_t)h * (size_t)dim + 16 * (size_t)(g0 + t);
            __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(a[h][t]));
            __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[h][t]), 1)));
            _mm512_storeu_pd(p, _mm512_fmadd_pd(al, _mm512_loadu_pd(p), lo));
            _mm512_storeu_pd(p + 8, _mm512_fmadd_pd(al, _mm512_loadu_pd(p + 8), hi));
        }
    }
}

/* Tiles of 4 (four heads) or 8 groups of 16 coordinates, then single groups. */
INLINE void value_pass16(const int QC, const uint8_t *rows, uint32_t stride, uint32_t n, const float *w,
                         double *acc, const double *alpha, int dim, const struct consts16 *k)
{
    const int G = dim / 16, TG = QC == 4 ? 4 : 8;
    int g0 = 0;
    for (; g0 + TG <= G; g0 += TG)
        value_tile16(QC, QC == 4 ? 4 : 8, g0, rows, stride, n, w, acc, alpha, dim, k);
    for (; g0 < G; g0++)
        value_tile16(QC, 1, g0, rows, stride, n, w, acc, alpha, dim, k);
}

TGT static void value_chunk16(int qc, const uint8_t *rows, uint32_t stride, uint32_t n, const float *w, double *acc,
                              const double *alpha, int dim, const struct consts16 *k)
{
    if (qc == 4)
        value_pass16(4, rows, stride, n, w, acc, alpha, dim, k);
    else if (qc == 2)
        value_pass16(2, rows, stride, n, w, acc, alpha, dim, k);
    else
        value_pass16(1, rows, stride, n, w, acc, alpha, dim, k);
}

/* dst[h][i] = src[h][i] * f16(h16[i]) * mul, for whole groups of 8 slots. */
TGT static void scale_weights16(const float *src, const uint16_t *h16, float mul, int n_q, uint32_t n8, float *dst)
{
    const __m256 m = _mm256_set1_ps(mul);
    for (uint32_t i = 0; i < n8; i += 8) {
        __m256 f = _mm256_mul_ps(m, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(h16 + i))));
        for (int h = 0; h < n_q; h++)
            _mm256_store_ps(dst + (size_t)h * KVQ_ATTN_BLOCK + i,
                            _mm256_mul_ps(f, _mm256_load_ps(src + (size_t)h * KVQ_ATTN_BLOCK + i)));
    }
}

TGT static void value_avx512(const struct kvq_attn_job *job, const struct kvq_attn_block *b)
{
    const kvq_codec *cv = job->cv;
    if (!cv->traits->rotated || cv->bits > KVQ_TQ_SIMD_MAX_BITS) {
        kvq_attn_kernels_avx2.value(job, b);
        return;
    }
    const struct kvq_head_layout *hl = job->hv;
    kvq_attn_workspace *ws = job->ws;
    const int dim = job->dim;
    const uint32_t n8 = (b->n + 7) & ~7u;
    const uint16_t *norm = (const uint16_t *)(const void *)(b->vchunk + hl->norm_off) + b->s0;
    scale_weights16(ws->w, norm, 1.0f, job->n_q, n8, ws->wv);
    const struct consts16 k = make_consts16(cv, 0);
    const uint8_t *codes = b->vchunk + hl->codes_off + (size_t)b->s0 * hl->codes_stride;
    for (int q0 = 0; q0 < job->n_q; q0 += kvq_attn_chunk(job->n_q - q0))
        value_chunk16(kvq_attn_chunk(job->n_q - q0), codes, hl->codes_stride, b->n,
                      ws->wv + (size_t)q0 * KVQ_ATTN_BLOCK, ws->acc + (size_t)q0 * (size_t)dim, ws->alpha + q0, dim,
                      &k);
    if (!cv->traits->qjl)
        return;
    const uint16_t *rnorm = (const uint16_t *)(const void *)(b->vchunk + hl->rnorm_off) + b->s0;
    scale_weights16(ws->wv, rnorm, cv->qjl_kappa_f, job->n_q, n8, ws->wg);
    const struct consts16 ks = make_consts16(cv, 1);
    const uint8_t *signs = b->vchunk + hl->signs_off + (size_t)b->s0 * hl->signs_stride;
    for (int q0 = 0; q0 < job->n_q; q0 += kvq_attn_chunk(job->n_q - q0))
        value_chunk16(kvq_attn_chunk(job->n_q - q0), signs, hl->signs_stride, b->n,
                      ws->wg + (size_t)q0 * KVQ_ATTN_BLOCK, ws->acc_s + (size_t)q0 * (size_t)dim, ws->alpha + q0, dim,
                      &ks);
}

/* Queries interleaved by 16-coordinate group for a tq K; the AVX2 layout otherwise. */
TGT static void prepare_avx512(const struct kvq_attn_job *job)
{
    if (!job->ck->traits->rotated || job->ck->bits > KVQ_TQ_SIMD_MAX_BITS) {
        kvq_attn_kernels_avx2.prepare(job);
        return;
    }
    kvq_attn_workspace *ws = job->ws;
    const size_t d = (size_t)job->dim;
    for (int q0 = 0; q0 < job->n_q; q0 += kvq_attn_chunk(job->n_q - q0)) {
        const int qc = kvq_attn_chunk(job->n_q - q0);
        float *dst = ws->qint + (size_t)q0 * d;
        for (size_t g = 0; g < d / 16; g++)
            for (int h = 0; h < qc; h++)
                memcpy(dst + (g * (size_t)qc + (size_t)h) * 16, ws->qprep + (size_t)(q0 + h) * 2 * d + 16 * g,
                       16 * sizeof(float));
        if (job->ck->traits->qjl)
            kvq_attn_sign_lut(job, q0, qc);
    }
}

static void softmax_avx512(const struct kvq_attn_job *job, uint32_t n)
{
    kvq_attn_kernels_avx2.softmax(job, n);
}

const struct kvq_attn_kernels kvq_attn_kernels_avx512 = {prepare_avx512, score_avx512, softmax_avx512, value_avx512,
                                                         kvq_attn_f16_row_avx2, kvq_attn_mean_gain_avx2};

#else /* not x86-64 with GCC or clang: never usable */

int kvq_attn_avx512_usable(void)
{
    return 0;
}

const struct kvq_attn_kernels kvq_attn_kernels_avx512 = {NULL, NULL, NULL, NULL, NULL, NULL};

#endif
