/* attn_avx2.c - AVX2/FMA/F16C block kernels of fused decode attention.
 *
 * Dequantizing 8 coordinates of a tq row costs one 32-bit load, one variable
 * shift and one permute: the B-bit codes of 8 coordinates are B bytes, so the
 * word at byte B*g, broadcast to 8 lanes and shifted right by (0, B, .., 7B),
 * leaves code l in the low bits of lane l, and _mm256_permutevar8x32_ps (which
 * reads only the low 3 bits of each index) looks the centroid up in a
 * register. For B < 3 the table repeats the centroids so the neighbouring
 * code's bits do not matter; for B = 4 a second table and a blend on bit 3.
 * Baseline rows (f32, f16 via F16C, q8_0, q4_0, q4_1, q5_0, q5_1) are expanded to 8 floats per
 * step the same way, so one kernel body serves every type.
 *
 * One unpack feeds all query heads of a chunk (up to 4), and the score loop
 * takes 2-4 keys at a time so that each query load feeds several FMAs; the
 * value loop keeps a tile of (heads x 8-coordinate groups) accumulators in
 * registers across the block. The QJL sign sum of a tqBj key costs one scalar
 * 64-bit add per sign byte and pair of heads (fixed-point tables, see
 * kvq_attn_sign_lut): integer work that overlaps the vector work. (A float
 * table added with vector loads, and a shift + permute + FMA per 8 signs
 * like the codes, both measured slower.)
 *
 * Reads: the 32-bit word of the last code group of a row ends up to 3 bytes
 * past the row; that stays inside the page or its KVQ_PAGE_TAIL_PAD.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "attn_exp_avx2.h"
#include "attn_internal.h"
#include "codec_avx2_internal.h"

#define INLINE static inline __attribute__((always_inline))

/* What one row stores, as far as expanding 8 coordinates goes. */
/* K_TQ5: a 5-bit codebook, four registers of centroids; K_TQW: 6 to 8 bits,
 * read by gathers from the centroid array. */
/* K_Q41, K_Q50, K_Q51: llama.cpp's q4_1, q5_0, q5_1 blocks. */
enum kind { K_TQ1 = 1, K_TQ2 = 2, K_TQ3 = 3, K_TQ4 = 4, K_SIGN, K_F32, K_F16, K_Q8, K_Q4, K_TQ5, K_TQW,
            K_Q41, K_Q50, K_Q51 };

struct consts {
    __m256 lo, hi;    /* centroid tables (hi: codes 8..15 of a 4-bit codebook); K_SIGN: -1/+1 */
    __m256 lo2, hi2;  /* K_TQ5: codes 16..23 and 24..31 */
    __m256i shr, shl; /* per-lane shifts */
    __m256i mask;     /* K_TQW: levels - 1 */
    const float *tab; /* K_TQW: the centroids */
    int bits;         /* K_TQW: B */
};

static int kind_of(const kvq_codec *c)
{
    switch (kvq_layout_base_type((int)c->cfg.type)) { /* q8_0r, q4_0r, ...: their base's kernels on R's domain */
    case KVQ_TYPE_F32: return K_F32;
    case KVQ_TYPE_F16: return K_F16;
    case KVQ_TYPE_Q8_0: return K_Q8;
    case KVQ_TYPE_Q4_0: return K_Q4;
    case KVQ_TYPE_Q4_1: return K_Q41;
    case KVQ_TYPE_Q5_0: return K_Q50;
    case KVQ_TYPE_Q5_1: return K_Q51;
    default: return c->bits <= K_TQ4 ? c->bits : c->bits == 5 ? K_TQ5 : K_TQW; /* tq: 1..4, 5, 6..8 */
    }
}

/* Built with vector operations from the codec's centroid array: filling a
 * stack array and loading it as one vector stalls on store forwarding, and
 * this runs twice per block. */
static struct consts make_consts(const kvq_codec *c, int kind)
{
    struct consts k;
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int B = kind <= K_TQ4 ? kind : 1;
    k.shr = _mm256_mullo_epi32(lane, _mm256_set1_epi32(B)); /* K_Q50/K_Q51: 0..7, the fifth bits */
    k.shl = _mm256_sub_epi32(_mm256_set1_epi32(28), _mm256_slli_epi32(lane, 2));
    if (kind == K_SIGN) {
        k.lo = _mm256_setr_ps(-1, 1, -1, 1, -1, 1, -1, 1);
        k.hi = _mm256_setzero_ps();
    } else if (kind <= K_TQ4) { /* centroids[l mod levels]; codes 8..15 in hi (4 bits) */
        __m256i idx = _mm256_and_si256(lane, _mm256_set1_epi32(c->levels - 1));
        k.lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(c->centroids), idx);
        k.hi = _mm256_loadu_ps(c->centroids + 8);
    } else {
        k.lo = k.hi = _mm256_setzero_ps();
    }
    k.lo2 = k.hi2 = _mm256_setzero_ps();
    k.mask = _mm256_setzero_si256();
    k.tab = NULL;
    k.bits = 0;
    if (kind == K_TQ5 || kind == K_TQW) { /* the codes of group g: kvq_codes8_wide_avx2 */
        k.bits = c->bits;
        k.shr = kvq_wide_shifts_avx2(c->bits);
    }
    if (kind == K_TQ5) {
        k.lo = _mm256_loadu_ps(c->centroids);
        k.hi = _mm256_loadu_ps(c->centroids + 8);
        k.lo2 = _mm256_loadu_ps(c->centroids + 16);
        k.hi2 = _mm256_loadu_ps(c->centroids + 24);
    }
    if (kind == K_TQW) {
        k.mask = _mm256_set1_epi32(c->levels - 1);
        k.tab = c->centroids;
    }
    return k;
}

static inline int32_t load_i32(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Coordinates 8g .. 8g+7 of the row at r, as floats (tq: unit-scale centroids;
 * K_SIGN: +-1 from the sign bits). */
INLINE __m256 expand(const int kind, const uint8_t *r, int g, const struct consts *k)
{
    switch (kind) {
    case K_TQ1:
    case K_TQ2:
    case K_TQ3:
    case K_SIGN: {
        const int B = kind == K_SIGN ? 1 : kind;
        __m256i w = _mm256_set1_epi32(load_i32(r + B * g));
        return _mm256_permutevar8x32_ps(k->lo, _mm256_srlv_epi32(w, k->shr));
    }
    case K_TQ4: {
        __m256i w = _mm256_set1_epi32(load_i32(r + 4 * g));
        __m256i idx = _mm256_srlv_epi32(w, k->shr);
        __m256 a = _mm256_permutevar8x32_ps(k->lo, idx), b = _mm256_permutevar8x32_ps(k->hi, idx);
        return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_sllv_epi32(w, k->shl)));
    }
    case K_TQ5: { /* 8 codes in 5 bytes; the permutes read bits 0-2, the blends bits 3 and 4 */
        const __m256i idx = kvq_codes8_wide_avx2(r + 5 * (size_t)g, 5, k->shr);
        __m256 b3 = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)), b4 = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 27));
        __m256 a = _mm256_blendv_ps(_mm256_permutevar8x32_ps(k->lo, idx), _mm256_permutevar8x32_ps(k->hi, idx), b3);
        __m256 b = _mm256_blendv_ps(_mm256_permutevar8x32_ps(k->lo2, idx), _mm256_permutevar8x32_ps(k->hi2, idx), b3);
        return _mm256_blendv_ps(a, b, b4);
    }
    case K_TQW: { /* 8 codes of B bits are B bytes */
        const __m256i v = kvq_codes8_wide_avx2(r + (size_t)k->bits * (size_t)g, k->bits, k->shr);
        return _mm256_i32gather_ps(k->tab, _mm256_and_si256(v, k->mask), 4);
    }
    case K_F32:
        return _mm256_loadu_ps((const float *)(const void *)(r + 32 * g));
    case K_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(r + 16 * g)));
    case K_Q8: {
        const uint8_t *blk = r + (size_t)(g >> 2) * sizeof(kvq_block_q8_0);
        uint16_t h;
        memcpy(&h, blk, sizeof h);
        __m128i b8 = _mm_loadl_epi64((const __m128i *)(const void *)(blk + 2 + 8 * (g & 3)));
        __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b8));
        return _mm256_mul_ps(x, _mm256_set1_ps(_cvtsh_ss(h)));
    }
    case K_Q41: { /* as K_Q4 after d and m; x = q d + m as dequantize_row_q4_1 */
        const uint8_t *blk = r + (size_t)(g >> 2) * sizeof(kvq_block_q4_1);
        uint16_t h[2];
        memcpy(h, blk, sizeof h);
        __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(blk + 4 + 8 * (g & 1))));
        b = (g & 2) ? _mm256_srli_epi32(b, 4) : _mm256_and_si256(b, _mm256_set1_epi32(15));
        __m256 x = _mm256_mul_ps(_mm256_cvtepi32_ps(b), _mm256_set1_ps(_cvtsh_ss(h[0])));
        return _mm256_add_ps(x, _mm256_set1_ps(_cvtsh_ss(h[1])));
    }
    case K_Q50:
    case K_Q51: { /* nibbles as K_Q4; bit c of the u32 qh is bit 4 of value c of the block */
        const size_t bb = kind == K_Q50 ? sizeof(kvq_block_q5_0) : sizeof(kvq_block_q5_1);
        const int off = kind == K_Q50 ? 2 : 4; /* qh after d (and m) */
        const uint8_t *blk = r + (size_t)(g >> 2) * bb;
        uint16_t h[2];
        uint32_t qh;
        memcpy(h, blk, sizeof h);
        memcpy(&qh, blk + off, sizeof qh);
        __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(blk + off + 4 + 8 * (g & 1))));
        b = (g & 2) ? _mm256_srli_epi32(b, 4) : _mm256_and_si256(b, _mm256_set1_epi32(15));
        __m256i hb = _mm256_srlv_epi32(_mm256_set1_epi32((int)(qh >> (8 * (g & 3)))), k->shr);
        b = _mm256_or_si256(b, _mm256_and_si256(_mm256_slli_epi32(hb, 4), _mm256_set1_epi32(0x10)));
        if (kind == K_Q50)
            return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(b, _mm256_set1_epi32(16))),
                                 _mm256_set1_ps(_cvtsh_ss(h[0])));
        __m256 x = _mm256_mul_ps(_mm256_cvtepi32_ps(b), _mm256_set1_ps(_cvtsh_ss(h[0])));
        return _mm256_add_ps(x, _mm256_set1_ps(_cvtsh_ss(h[1])));
    }
    default: { /* K_Q4: byte j holds x_j (low nibble) and x_{j+16} (high) */
        const uint8_t *blk = r + (size_t)(g >> 2) * sizeof(kvq_block_q4_0);
        uint16_t h;
        memcpy(&h, blk, sizeof h);
        __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(blk + 2 + 8 * (g & 1))));
        b = (g & 2) ? _mm256_srli_epi32(b, 4) : _mm256_and_si256(b, _mm256_set1_epi32(15));
        __m256 x = _mm256_cvtepi32_ps(_mm256_sub_epi32(b, _mm256_set1_epi32(8)));
        return _mm256_mul_ps(x, _mm256_set1_ps(_cvtsh_ss(h)));
    }
    }
}

/* Eight vectors -> one vector of their eight horizontal sums. */
INLINE __m256 hsum8(const __m256 *v)
{
    __m256 h01 = _mm256_hadd_ps(v[0], v[1]), h23 = _mm256_hadd_ps(v[2], v[3]);
    __m256 h45 = _mm256_hadd_ps(v[4], v[5]), h67 = _mm256_hadd_ps(v[6], v[7]);
    __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67);
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* ---- score ---- */

/* dot[h][i] = q_h . row_i for QC heads, rows at codes + i * stride, i < n
 * rounded up to 8 (the extra rows are inside the page; their dots are unused).
 * q is the chunk's interleaved query block: group g of head h at q + 8 (g QC + h).
 * NW > 0 (tqBj): also the sign sums of row i, NW table words (pairs of heads)
 * per sign byte, into ssum[w][i].
 * Addresses are written as base + kb * stride so that the compiler can use
 * indexed addressing: with a pointer per key, the integer registers run out
 * and the sign sums spill to the stack, which costs more than the rest. */
INLINE void score_pass(const int kind, const int QC, const int KB, const int NW, const uint8_t *codes,
                       uint32_t stride, const uint8_t *signs, uint32_t sstride, const uint64_t *lut, size_t lut_words,
                       uint64_t *ssum, uint32_t n, int dim, const float *q, float *dot, const struct consts *k)
{
    const int G = dim / 8;
    for (uint32_t i0 = 0; i0 < n; i0 += 8) {
        __m256 part[KVQ_ATTN_QCHUNK][8];
        for (int k0 = 0; k0 < 8; k0 += KB) {
            __m256 a[4][KVQ_ATTN_QCHUNK];
            uint64_t sa[4][2];
            const uint8_t *r = codes + (size_t)(i0 + (uint32_t)k0) * stride;
            const uint8_t *sg = NW ? signs + (size_t)(i0 + (uint32_t)k0) * sstride : NULL;
#pragma GCC unroll 4
            for (int kb = 0; kb < KB; kb++) {
                sa[kb][0] = sa[kb][1] = 0;
#pragma GCC unroll 4
                for (int h = 0; h < QC; h++)
                    a[kb][h] = _mm256_setzero_ps();
            }
            const uint64_t *t = lut;
            const float *qg = q;
            for (int g = 0; g < G; g++, t += 256, qg += 8 * QC) {
                __m256 x[4];
#pragma GCC unroll 4
                for (int kb = 0; kb < KB; kb++)
                    x[kb] = expand(kind, r + (size_t)kb * stride, g, k);
#pragma GCC unroll 4
                for (int h = 0; h < QC; h++) {
                    __m256 qv = _mm256_load_ps(qg + 8 * h);
                    /* One load for KB FMAs: without this the compiler folds the
                     * load into every FMA, and vector loads run out first. */
                    if (KB > 1)
                        __asm__("" : "+x"(qv));
#pragma GCC unroll 4
                    for (int kb = 0; kb < KB; kb++)
                        a[kb][h] = _mm256_fmadd_ps(x[kb], qv, a[kb][h]);
                }
#pragma GCC unroll 4
                for (int kb = 0; kb < KB; kb++)
#pragma GCC unroll 2
                    for (int w = 0; w < NW; w++)
                        sa[kb][w] += t[(size_t)w * lut_words + sg[(size_t)kb * sstride + (size_t)g]];
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
            _mm256_store_ps(dot + (size_t)h * KVQ_ATTN_BLOCK + i0, hsum8(part[h]));
    }
}

/* Specialisations by (kind, chunk size, sign words): 2-4 keys per step, as registers allow. */
#define SCORE_ARGS codes, stride, signs, sstride, lut, lut_words, ssum, n, dim, q, dot, k
#define SCORE_CASES(KIND)                                                                                  \
    case KIND:                                                                                             \
        if (qc == 4)                                                                                       \
            sign ? score_pass(KIND, 4, 2, 2, SCORE_ARGS) : score_pass(KIND, 4, 2, 0, SCORE_ARGS);          \
        else if (qc == 2)                                                                                  \
            sign ? score_pass(KIND, 2, 4, 1, SCORE_ARGS) : score_pass(KIND, 2, 4, 0, SCORE_ARGS);          \
        else                                                                                               \
            sign ? score_pass(KIND, 1, 4, 1, SCORE_ARGS) : score_pass(KIND, 1, 4, 0, SCORE_ARGS);          \
        break;
#define BASE_CASES(KIND)                                                                                   \
    case KIND:                                                                                             \
        if (qc == 4)                                                                                       \
            score_pass(KIND, 4, 2, 0, SCORE_ARGS);                                                         \
        else if (qc == 2)                                                                                  \
            score_pass(KIND, 2, 4, 0, SCORE_ARGS);                                                         \
        else                                                                                               \
            score_pass(KIND, 1, 4, 0, SCORE_ARGS);                                                         \
        break;

static void score_chunk(int kind, int qc, int sign, const uint8_t *codes, uint32_t stride, const uint8_t *signs,
                        uint32_t sstride, const uint64_t *lut, size_t lut_words, uint64_t *ssum, uint32_t n, int dim,
                        const float *q, float *dot, const struct consts *k)
{
    switch (kind) {
        SCORE_CASES(K_TQ1)
        SCORE_CASES(K_TQ2)
        SCORE_CASES(K_TQ3)
        SCORE_CASES(K_TQ4)
        BASE_CASES(K_F32)
        BASE_CASES(K_F16)
        BASE_CASES(K_Q8)
        BASE_CASES(K_Q4)
        BASE_CASES(K_TQ5)
        BASE_CASES(K_TQW)
        BASE_CASES(K_Q41)
        BASE_CASES(K_Q50)
        BASE_CASES(K_Q51)
    default: break;
    }
}

/* Lane l (0 or 1) of eight 64-bit words: the 32-bit halves, as 8 int32. */
INLINE __m256i words_half(const uint64_t *w, int l)
{
    const __m256i sel = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    __m256i a = _mm256_permutevar8x32_epi32(_mm256_load_si256((const __m256i *)(const void *)w), sel);
    __m256i b = _mm256_permutevar8x32_epi32(_mm256_load_si256((const __m256i *)(const void *)(w + 4)), sel);
    return l ? _mm256_permute2x128_si256(a, b, 0x31) : _mm256_permute2x128_si256(a, b, 0x20);
}

static void score_avx2(const struct kvq_attn_job *job, const struct kvq_attn_block *b)
{
    const kvq_codec *ck = job->ck;
    const struct kvq_head_layout *hl = job->hk;
    kvq_attn_workspace *ws = job->ws;
    const int kind = kind_of(ck), dim = job->dim, qjl = ck->traits->qjl;
    const struct consts k = make_consts(ck, kind);
    const size_t lut_words = kvq_attn_lut_offset(dim, 2);
    const uint8_t *codes = b->kchunk + hl->codes_off + (size_t)b->s0 * hl->codes_stride;
    const uint8_t *signs = qjl ? b->kchunk + hl->signs_off + (size_t)b->s0 * hl->signs_stride : NULL;
    const uint32_t n8 = (b->n + 7) & ~7u;
    const int P = dim / 8;
    const __m256i bias = _mm256_set1_epi32(P << kvq_attn_lut_bits(P));

    for (int q0 = 0; q0 < job->n_q; q0 += kvq_attn_chunk(job->n_q - q0)) {
        const int qc = kvq_attn_chunk(job->n_q - q0);
        float *dot = ws->dot + (size_t)q0 * KVQ_ATTN_BLOCK;
        score_chunk(kind, qc, qjl, codes, hl->codes_stride, signs, hl->signs_stride,
                    qjl ? ws->lut + kvq_attn_lut_offset(dim, q0) : NULL, lut_words, ws->ssum, b->n, dim,
                    ws->qint + (size_t)q0 * (size_t)dim, dot, &k);
        if (!ck->traits->rotated)
            continue;
        /* tq: times the row norm, plus the QJL term g (2 P - T). */
        const uint16_t *norm = (const uint16_t *)(const void *)(b->kchunk + hl->norm_off) + b->s0;
        const uint16_t *rnorm = qjl ? (const uint16_t *)(const void *)(b->kchunk + hl->rnorm_off) + b->s0 : NULL;
        const __m256 kappa = _mm256_set1_ps(ck->qjl_kappa_f), two = _mm256_set1_ps(2.0f);
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
                    __m256 t = _mm256_fmsub_ps(two, p, _mm256_set1_ps(ws->qsum[q0 + h]));
                    a = _mm256_fmadd_ps(gv, t, a);
                }
                _mm256_store_ps(dp, _mm256_mul_ps(nv, a));
            }
        }
    }
}

/* ---- softmax ---- */

INLINE float hmax(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

INLINE float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

static void softmax_avx2(const struct kvq_attn_job *job, uint32_t n)
{
    kvq_attn_workspace *ws = job->ws;
    const __m256 sc = _mm256_set1_ps(job->scale), ninf = _mm256_set1_ps(-INFINITY);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const uint32_t n8 = (n + 7) & ~7u;
    for (int h = 0; h < job->n_q; h++) {
        const float *dot = ws->dot + (size_t)h * KVQ_ATTN_BLOCK;
        float *w = ws->w + (size_t)h * KVQ_ATTN_BLOCK;
        __m256 mx = ninf;
        for (uint32_t i = 0; i < n8; i += 8) {
            __m256 live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), lane));
            mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_mul_ps(sc, _mm256_load_ps(dot + i)), live));
        }
        float mo = (float)ws->m[h], mn = fmaxf(mo, hmax(mx));
        ws->alpha[h] = mo == -INFINITY ? 0.0 : exp((double)mo - (double)mn);
        ws->m[h] = mn;
        const __m256 m = _mm256_set1_ps(mn);
        __m256 sum = _mm256_setzero_ps();
        for (uint32_t i = 0; i < n8; i += 8) {
            __m256 live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), lane));
            __m256 e = _mm256_and_ps(live, kvq_exp_ps(_mm256_sub_ps(_mm256_mul_ps(sc, _mm256_load_ps(dot + i)), m)));
            _mm256_store_ps(w + i, e);
            sum = _mm256_add_ps(sum, e);
        }
        ws->l[h] = ws->l[h] * ws->alpha[h] + (double)hsum(sum);
    }
}

/* ---- value ---- */

/* acc[h][8(g0+t) ..] = alpha_h acc + sum_i w[h][i] row_i[8(g0+t) ..] for
 * groups g0 .. g0+TG-1: QC x TG accumulators stay in registers over the block. */
INLINE void value_tile(const int kind, const int QC, const int TG, int g0, const uint8_t *rows, uint32_t stride,
                       uint32_t n, const float *w, double *acc, const double *alpha, int dim,
                       const struct consts *k)
{
    __m256 a[KVQ_ATTN_QCHUNK][8];
#pragma GCC unroll 4
    for (int h = 0; h < QC; h++)
#pragma GCC unroll 8
        for (int t = 0; t < TG; t++)
            a[h][t] = _mm256_setzero_ps();
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *r = rows + (size_t)i * stride;
        __m256 wq[KVQ_ATTN_QCHUNK];
#pragma GCC unroll 4
        for (int h = 0; h < QC; h++)
            wq[h] = _mm256_broadcast_ss(w + (size_t)h * KVQ_ATTN_BLOCK + i);
#pragma GCC unroll 8
        for (int t = 0; t < TG; t++) {
            __m256 x = expand(kind, r, g0 + t, k);
#pragma GCC unroll 4
            for (int h = 0; h < QC; h++)
                a[h][t] = _mm256_fmadd_ps(wq[h], x, a[h][t]);
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < QC; h++) {
        const __m256d al = _mm256_set1_pd(alpha[h]);
#pragma GCC unroll 8
        for (int t = 0; t < TG; t++) {
            double *p = acc + (size_t)h * (size_t)dim + 8 * (size_t)(g0 + t);
            __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(a[h][t]));
            __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(a[h][t], 1));
            _mm256_store_pd(p, _mm256_fmadd_pd(al, _mm256_load_pd(p), lo));
            _mm256_store_pd(p + 4, _mm256_fmadd_pd(al, _mm256_load_pd(p + 4), hi));
        }
    }
}

/* All groups of a chunk of QC heads: tiles of TG = 8 / QC groups, then single groups. */
INLINE void value_pass(const int kind, const int QC, const uint8_t *rows, uint32_t stride, uint32_t n,
                       const float *w, double *acc, const double *alpha, int dim, const struct consts *k)
{
    const int G = dim / 8, TG = 8 / QC;
    int g0 = 0;
    for (; g0 + TG <= G; g0 += TG)
        value_tile(kind, QC, 8 / QC, g0, rows, stride, n, w, acc, alpha, dim, k);
    for (; g0 < G; g0++)
        value_tile(kind, QC, 1, g0, rows, stride, n, w, acc, alpha, dim, k);
}

#define VALUE_CASES(KIND)                                                                                  \
    case KIND:                                                                                             \
        if (qc == 4)                                                                                       \
            value_pass(KIND, 4, rows, stride, n, w, acc, alpha, dim, k);                                   \
        else if (qc == 2)                                                                                  \
            value_pass(KIND, 2, rows, stride, n, w, acc, alpha, dim, k);                                   \
        else                                                                                               \
            value_pass(KIND, 1, rows, stride, n, w, acc, alpha, dim, k);                                   \
        break;

static void value_chunk(int kind, int qc, const uint8_t *rows, uint32_t stride, uint32_t n, const float *w,
                        double *acc, const double *alpha, int dim, const struct consts *k)
{
    switch (kind) {
        VALUE_CASES(K_TQ1)
        VALUE_CASES(K_TQ2)
        VALUE_CASES(K_TQ3)
        VALUE_CASES(K_TQ4)
        VALUE_CASES(K_SIGN)
        VALUE_CASES(K_F32)
        VALUE_CASES(K_F16)
        VALUE_CASES(K_Q8)
        VALUE_CASES(K_Q4)
        VALUE_CASES(K_TQ5)
        VALUE_CASES(K_TQW)
        VALUE_CASES(K_Q41)
        VALUE_CASES(K_Q50)
        VALUE_CASES(K_Q51)
    default: break;
    }
}

/* dst[h][i] = src[h][i] * f16(h16[i]) * mul, for whole groups of 8 slots. */
static void scale_weights(const float *src, const uint16_t *h16, float mul, int n_q, uint32_t n8, float *dst)
{
    const __m256 m = _mm256_set1_ps(mul);
    for (uint32_t i = 0; i < n8; i += 8) {
        __m256 f = _mm256_mul_ps(m, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(h16 + i))));
        for (int h = 0; h < n_q; h++)
            _mm256_store_ps(dst + (size_t)h * KVQ_ATTN_BLOCK + i,
                            _mm256_mul_ps(f, _mm256_load_ps(src + (size_t)h * KVQ_ATTN_BLOCK + i)));
    }
}

static void value_avx2(const struct kvq_attn_job *job, const struct kvq_attn_block *b)
{
    const kvq_codec *cv = job->cv;
    const struct kvq_head_layout *hl = job->hv;
    kvq_attn_workspace *ws = job->ws;
    const int kind = kind_of(cv), dim = job->dim;
    const uint32_t n8 = (b->n + 7) & ~7u;
    const float *w = ws->w;
    if (cv->traits->rotated) { /* the row norm joins the weight: sum_i (w n_i) c[idx_i] */
        const uint16_t *norm = (const uint16_t *)(const void *)(b->vchunk + hl->norm_off) + b->s0;
        scale_weights(ws->w, norm, 1.0f, job->n_q, n8, ws->wv);
        w = ws->wv;
    }
    const struct consts k = make_consts(cv, kind);
    const uint8_t *codes = b->vchunk + hl->codes_off + (size_t)b->s0 * hl->codes_stride;
    for (int q0 = 0; q0 < job->n_q; q0 += kvq_attn_chunk(job->n_q - q0))
        value_chunk(kind, kvq_attn_chunk(job->n_q - q0), codes, hl->codes_stride, b->n, w + (size_t)q0 * KVQ_ATTN_BLOCK,
                    ws->acc + (size_t)q0 * (size_t)dim, ws->alpha + q0, dim, &k);
    if (!cv->traits->qjl)
        return;
    /* tqBj V: sum_i (w n_i g_i) s~_i, rotated back by S^T at the end. */
    const uint16_t *rnorm = (const uint16_t *)(const void *)(b->vchunk + hl->rnorm_off) + b->s0;
    scale_weights(ws->wv, rnorm, cv->qjl_kappa_f, job->n_q, n8, ws->wg);
    const struct consts ks = make_consts(cv, K_SIGN);
    const uint8_t *signs = b->vchunk + hl->signs_off + (size_t)b->s0 * hl->signs_stride;
    for (int q0 = 0; q0 < job->n_q; q0 += kvq_attn_chunk(job->n_q - q0))
        value_chunk(K_SIGN, kvq_attn_chunk(job->n_q - q0), signs, hl->signs_stride, b->n,
                    ws->wg + (size_t)q0 * KVQ_ATTN_BLOCK, ws->acc_s + (size_t)q0 * (size_t)dim, ws->alpha + q0, dim,
                    &ks);
}

/* The 16 subset sums of v[0..3] (entry n sums v_t over the set bits t of n),
 * rounded to integers at `scale` and biased, as four 4 x int32 vectors. */
INLINE void nibble_sums(const float *v, double scale, __m128i bias, __m128i out[4])
{
    const __m256d m0 = _mm256_setr_pd(0, 1, 0, 1), m1 = _mm256_setr_pd(0, 0, 1, 1);
    __m256d base = _mm256_fmadd_pd(_mm256_set1_pd((double)v[1]), m1, _mm256_mul_pd(_mm256_set1_pd((double)v[0]), m0));
    const __m256d sc = _mm256_set1_pd(scale);
    for (int k = 0; k < 4; k++) { /* entries 4k .. 4k+3: bits 2, 3 of n are those of k */
        double c = ((k & 1) ? (double)v[2] : 0.0) + ((k & 2) ? (double)v[3] : 0.0);
        /* cvtpd rounds to nearest even (the default MXCSR mode) */
        out[k] = _mm_add_epi32(_mm256_cvtpd_epi32(_mm256_mul_pd(_mm256_add_pd(base, _mm256_set1_pd(c)), sc)), bias);
    }
}

void kvq_attn_sign_lut(const struct kvq_attn_job *job, int q0, int qc)
{
    const int d = job->dim, P = d / 8, kb = kvq_attn_lut_bits(P);
    const double half = (double)((1u << (kb - 1)) - 1u); /* |nibble entry| limit */
    const __m128i bias = _mm_set1_epi32(1 << (kb - 1));  /* per nibble: entries in [1, 2^(kb+1)) */
    static const float zeros[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    kvq_attn_workspace *ws = job->ws;
    for (int w = 0; 2 * w < qc; w++) {
        uint64_t *tab = ws->lut + kvq_attn_lut_offset(d, q0 + 2 * w);
        const float *sq[2] = {NULL, NULL};
        double scale[2] = {0.0, 0.0};
        for (int l = 0; l < 2 && 2 * w + l < qc; l++) {
            const int h = q0 + 2 * w + l;
            sq[l] = ws->qprep + (size_t)h * 2 * (size_t)d + (size_t)d;
            double mx = 0.0; /* the largest |nibble sum| over all positions */
            for (int j = 0; j < d; j += 4) {
                double pos = 0.0, neg = 0.0;
                for (int t = 0; t < 4; t++) {
                    if (sq[l][j + t] > 0.0f)
                        pos += (double)sq[l][j + t];
                    else
                        neg -= (double)sq[l][j + t];
                }
                mx = fmax(mx, fmax(pos, neg));
            }
            scale[l] = mx > 0.0 ? ldexp(1.0, (int)floor(log2(half / mx))) : 0.0;
            ws->lut_inv[h] = mx > 0.0 ? (float)(1.0 / scale[l]) : 0.0f;
        }
        for (int p = 0; p < P; p++) {
            __m128i lo[2][4], hi[2][4];
            for (int l = 0; l < 2; l++) {
                const float *v = sq[l] ? sq[l] + 8 * p : zeros;
                nibble_sums(v, scale[l], bias, lo[l]);
                nibble_sums(v + 4, scale[l], bias, hi[l]);
            }
            /* 64-bit words: head 2w in the low half, head 2w + 1 in the high half */
            uint64_t high[16] __attribute__((aligned(32)));
            __m256i low[4];
            for (int k = 0; k < 4; k++) {
                low[k] = _mm256_setr_m128i(_mm_unpacklo_epi32(lo[0][k], lo[1][k]), _mm_unpackhi_epi32(lo[0][k], lo[1][k]));
                _mm256_store_si256((__m256i *)(void *)(high + 4 * k),
                                   _mm256_setr_m128i(_mm_unpacklo_epi32(hi[0][k], hi[1][k]),
                                                     _mm_unpackhi_epi32(hi[0][k], hi[1][k])));
            }
            uint64_t *e = tab + (size_t)p * 256;
            for (int x = 0; x < 16; x++) {
                __m256i hx = _mm256_set1_epi64x((long long)high[x]);
                for (int k = 0; k < 4; k++)
                    _mm256_storeu_si256((__m256i *)(void *)(e + 16 * x + 4 * k), _mm256_add_epi64(hx, low[k]));
            }
        }
    }
}

/* Per call: the queries of each chunk interleaved by 8-coordinate group (so
 * that the score loop reaches every head at a fixed offset), and the sign
 * tables of a tqBj K. */
static void prepare_avx2(const struct kvq_attn_job *job)
{
    kvq_attn_workspace *ws = job->ws;
    const size_t d = (size_t)job->dim;
    for (int q0 = 0; q0 < job->n_q; q0 += kvq_attn_chunk(job->n_q - q0)) {
        const int qc = kvq_attn_chunk(job->n_q - q0);
        float *dst = ws->qint + (size_t)q0 * d;
        for (size_t g = 0; g < d / 8; g++)
            for (int h = 0; h < qc; h++)
                memcpy(dst + (g * (size_t)qc + (size_t)h) * 8, ws->qprep + (size_t)(q0 + h) * 2 * d + 8 * g,
                       8 * sizeof(float));
        if (job->ck->traits->qjl)
            kvq_attn_sign_lut(job, q0, qc);
    }
}

/* One f16 override row (kvq_attn_f16_row_fn): halves to floats with F16C,
 * the score as a float dot product (FMA, two chains), the softmax state and
 * the weighted sum of values in double, 4 lanes at a time. */
void kvq_attn_f16_row_avx2(const uint16_t *hk, const uint16_t *hv, const float *q, int n_q, int d, double scale,
                           double *m, double *l, double *acc, float *tmp)
{
    float *k = tmp, *v = tmp + d;
    for (int j = 0; j < d; j += 8) {
        _mm256_storeu_ps(k + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hk + j))));
        _mm256_storeu_ps(v + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hv + j))));
    }
    for (int h = 0; h < n_q; h++) {
        const float *qh = q + (size_t)h * d;
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
        int j = 0;
        for (; j + 16 <= d; j += 16) {
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + j), _mm256_loadu_ps(k + j), s0);
            s1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + j + 8), _mm256_loadu_ps(k + j + 8), s1);
        }
        if (j < d)
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + j), _mm256_loadu_ps(k + j), s0);
        double s = scale * (double)hsum(_mm256_add_ps(s0, s1)), *a = acc + (size_t)h * d;
        if (s > m[h]) { /* a new maximum rescales what came before */
            __m256d r = _mm256_set1_pd(m[h] == -INFINITY ? 0.0 : exp(m[h] - s));
            l[h] *= _mm256_cvtsd_f64(r);
            for (int i = 0; i < d; i += 4)
                _mm256_storeu_pd(a + i, _mm256_mul_pd(_mm256_loadu_pd(a + i), r));
            m[h] = s;
        }
        double w = exp(s - m[h]);
        l[h] += w;
        __m256d wv = _mm256_set1_pd(w);
        for (int i = 0; i < d; i += 4)
            _mm256_storeu_pd(a + i, _mm256_fmadd_pd(wv, _mm256_cvtps_pd(_mm_loadu_ps(v + i)), _mm256_loadu_pd(a + i)));
    }
}

/* The codes of 8 coordinates are 4 bytes: their low and high nibbles
 * interleaved back into coordinate order, widened to floats. */
void kvq_attn_mean_gain_avx2(const uint8_t *blk, int d, const float *q, int n_q, float *gain)
{
    const float s = kvq_key_mean_scale(blk);
    const __m256 eight = _mm256_set1_ps(8.0f);
    for (int h = 0; h < n_q; h++) {
        const float *qh = q + (size_t)h * (size_t)d;
        __m256 acc = _mm256_setzero_ps();
        for (int j = 0; j < d; j += 8) {
            uint32_t w;
            memcpy(&w, blk + 2 + j / 2, sizeof w);
            const __m128i lo = _mm_cvtsi32_si128((int)(w & 0x0f0f0f0fu));
            const __m128i hi = _mm_cvtsi32_si128((int)((w >> 4) & 0x0f0f0f0fu));
            const __m256 c = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi))), eight);
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + j), c, acc);
        }
        gain[h] = s * kvq_hsum8_avx2(acc);
    }
}

const struct kvq_attn_kernels kvq_attn_kernels_avx2 = {prepare_avx2, score_avx2, softmax_avx2, value_avx2,
                                                       kvq_attn_f16_row_avx2, kvq_attn_mean_gain_avx2};
