/* codec_internal.h - the codec object and the exact encode arithmetic, for the
 * library's own kernels (codec, cache, CPU attention) and the CUDA port.
 *
 * Bit-exactness contract. The scalar reference (tq_ref.c), the AVX2 path and
 * the CUDA encoder must perform these float operations in this order:
 *  1. reject non-finite input;
 *  2. n = kvq_norm_ref(x): eight partial sums s[k] += x_j*x_j (fmaf) over
 *     j = k mod 8, combined as ((s0+s4)+(s2+s6)) + ((s1+s5)+(s3+s7)), sqrtf;
 *     n == 0 -> the all-zero row; f16(n) = Inf -> KVQ_ERR_RANGE;
 *  3. inv = 1.0f / n; u_j = x_j * inv;
 *  4. y = R u with kvq_rotation_apply (itself bit-exact across paths);
 *  5. idx_j = number of boundaries b_i with y_j > b_i (ties go to the lower cell);
 *  6. tqBj: r_j = y_j - c[idx_j]; gamma = kvq_norm_ref(r); z = S r;
 *     sign bit j = !(z_j < 0);
 *  7. norm = f16(n), rnorm = f16(gamma), round to nearest even.
 * Decode: n_f32 == 0 -> x~ = +0.0f everywhere (no rotation: a zero row must
 * decode to exact, positive zeros); otherwise w_j = c[idx_j]; tqBj: t = S^T s~
 * (s~_j = +-1.0f), g = gamma_f32 * qjl_kappa_f, w_j = fmaf(g, t_j, w_j);
 * z = R^T w; x~_j = z_j * n_f32.
 * The reference uses kvq_rotation_apply_ref/_t_ref, the fast path
 * kvq_rotation_apply/_t; both give the same bits for HADAMARD and IDENTITY
 * (DCT and the Gaussian S go through FFTW/OpenBLAS, whose rounding may differ).
 *
 * Score (kvq_codec_score for tq types), also identical on both paths:
 * A = sum_j q'_j c[idx_j], P = sum_{sign bit j = 1} (S q')_j, T = sum_j (S q')_j,
 * each an 8-lane fmaf/add accumulation over j = k mod 8 reduced like the norm;
 * score = n_f32 * fmaf(g, 2P - T, A), with 2P - T = sum_j (S q')_j s~_j.
 *
 * Row fields of packed rows may be unaligned (a tq row can have an odd size,
 * e.g. tq3 at d = 24 is 11 bytes): read and write norm/rnorm through
 * kvq_row_load_u16 / kvq_row_store_u16, never by dereferencing.
 */
#ifndef KVQ_CODEC_INTERNAL_H
#define KVQ_CODEC_INTERNAL_H

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "kvq_codebook.h"
#include "kvq_codec.h"
#include "kvq_layout.h"
#include "kvq_rotation.h"

#define KVQ_TQ_MAX_LEVELS 256 /* tq types use at most 8-bit codebooks */
/* Codebooks the SIMD row and attention kernels take (a 4-bit codebook fits
 * two 8-lane registers); wider ones run the scalar kernels. */
#define KVQ_TQ_SIMD_MAX_BITS 4

/* Stream ids for kvq_seed_derive(cfg.seed, id). */
#define KVQ_SEED_STREAM_R 1u
#define KVQ_SEED_STREAM_S 2u

/* Rounds of the Hadamard QJL projection S. The sign estimator is unbiased for
 * a Haar-random S; one randomised Hadamard round left a +3% (d=128) to +5.6%
 * (d=64) bias on the QJL term for queries correlated with their key, two
 * rounds -0.6%, three rounds none measurable (tests/test_codec_qjl.c). The
 * rotation R keeps one round: flatter is better there (docs/rotation.md). */
#define KVQ_QJL_ROUNDS 3

struct kvq_codec {
    struct kvq_codec_config cfg;
    const struct kvq_type_traits *traits;
    struct kvq_row_fields fields;    /* per-field bytes of one row */
    size_t row_bytes;
    int bits;                        /* tq: codebook bits; 0 for baselines */
    int levels;                      /* tq: 1 << bits */
    float centroids[KVQ_TQ_MAX_LEVELS];      /* ascending, unit-vector scale */
    float boundaries[KVQ_TQ_MAX_LEVELS - 1]; /* thresholds between centroids */
    double codebook_mse;             /* expected squared error per unit vector */
    kvq_rotation *rot;               /* R: tq types */
    kvq_rotation *qjl;               /* S: tqBj types */
    double qjl_kappa;                /* see kvq_codec.h; 0 without QJL */
    float qjl_kappa_f;               /* (float)qjl_kappa, the factor decode and scoring use */
};

#ifdef __cplusplus
extern "C" {
#endif

/* Row-level kernels, one set per family; the traits table points at them.
 * Baselines: f32, f16, q8_0, q4_0 (block formats of llama.cpp). */
kvq_status kvq_f32_encode(const kvq_codec *c, const float *x, const struct kvq_row *dst);
void kvq_f32_decode(const kvq_codec *c, const struct kvq_row *src, float *x);
float kvq_f32_score(const kvq_codec *c, const float *q, const struct kvq_row *src);
kvq_status kvq_f16_encode(const kvq_codec *c, const float *x, const struct kvq_row *dst);
void kvq_f16_decode(const kvq_codec *c, const struct kvq_row *src, float *x);
float kvq_f16_score(const kvq_codec *c, const float *q, const struct kvq_row *src);
kvq_status kvq_q8_0_encode(const kvq_codec *c, const float *x, const struct kvq_row *dst);
void kvq_q8_0_decode(const kvq_codec *c, const struct kvq_row *src, float *x);
float kvq_q8_0_score(const kvq_codec *c, const float *q, const struct kvq_row *src);
kvq_status kvq_q4_0_encode(const kvq_codec *c, const float *x, const struct kvq_row *dst);
void kvq_q4_0_decode(const kvq_codec *c, const struct kvq_row *src, float *x);
float kvq_q4_0_score(const kvq_codec *c, const float *q, const struct kvq_row *src);
/* q4_1, q5_0, q5_1 (baseline_q5.c): scalar only, the traits table uses
 * them as the fast path too. kvq_q5_family_check: steps 1-2 for a row of
 * one of these types (non-finite input, then a block scale or minimum whose
 * f16 would overflow). */
kvq_status kvq_q4_1_encode(const kvq_codec *c, const float *x, const struct kvq_row *dst);
void kvq_q4_1_decode(const kvq_codec *c, const struct kvq_row *src, float *x);
float kvq_q4_1_score(const kvq_codec *c, const float *q, const struct kvq_row *src);
kvq_status kvq_q5_0_encode(const kvq_codec *c, const float *x, const struct kvq_row *dst);
void kvq_q5_0_decode(const kvq_codec *c, const struct kvq_row *src, float *x);
float kvq_q5_0_score(const kvq_codec *c, const float *q, const struct kvq_row *src);
kvq_status kvq_q5_1_encode(const kvq_codec *c, const float *x, const struct kvq_row *dst);
void kvq_q5_1_decode(const kvq_codec *c, const struct kvq_row *src, float *x);
float kvq_q5_1_score(const kvq_codec *c, const float *q, const struct kvq_row *src);
kvq_status kvq_q5_family_check(int type, const float *x, int d);
/* The same with AVX2/F16C (baseline_avx2.c), bit-identical, and the
 * dispatchers (baseline.c) the traits table uses as the fast path. Baseline
 * scores use the 8-lane fmaf order of the tq scores (see above), so that
 * their fast and reference paths agree bit for bit too. */
kvq_status kvq_f16_encode_avx2(const kvq_codec *c, const float *x, const struct kvq_row *dst);
void kvq_f16_decode_avx2(const kvq_codec *c, const struct kvq_row *src, float *x);
float kvq_f16_score_avx2(const kvq_codec *c, const float *q, const struct kvq_row *src);
kvq_status kvq_q8_0_encode_avx2(const kvq_codec *c, const float *x, const struct kvq_row *dst);
void kvq_q8_0_decode_avx2(const kvq_codec *c, const struct kvq_row *src, float *x);
float kvq_q8_0_score_avx2(const kvq_codec *c, const float *q, const struct kvq_row *src);
kvq_status kvq_q4_0_encode_avx2(const kvq_codec *c, const float *x, const struct kvq_row *dst);
void kvq_q4_0_decode_avx2(const kvq_codec *c, const struct kvq_row *src, float *x);
float kvq_q4_0_score_avx2(const kvq_codec *c, const float *q, const struct kvq_row *src);
float kvq_f32_score_avx2(const kvq_codec *c, const float *q, const struct kvq_row *src);
kvq_status kvq_f32_encode_avx2(const kvq_codec *c, const float *x, const struct kvq_row *dst);
kvq_status kvq_f32_encode_fast(const kvq_codec *c, const float *x, const struct kvq_row *dst);
kvq_status kvq_f16_encode_fast(const kvq_codec *c, const float *x, const struct kvq_row *dst);
void kvq_f16_decode_fast(const kvq_codec *c, const struct kvq_row *src, float *x);
float kvq_f16_score_fast(const kvq_codec *c, const float *q, const struct kvq_row *src);
kvq_status kvq_q8_0_encode_fast(const kvq_codec *c, const float *x, const struct kvq_row *dst);
void kvq_q8_0_decode_fast(const kvq_codec *c, const struct kvq_row *src, float *x);
float kvq_q8_0_score_fast(const kvq_codec *c, const float *q, const struct kvq_row *src);
kvq_status kvq_q4_0_encode_fast(const kvq_codec *c, const float *x, const struct kvq_row *dst);
void kvq_q4_0_decode_fast(const kvq_codec *c, const struct kvq_row *src, float *x);
float kvq_q4_0_score_fast(const kvq_codec *c, const float *q, const struct kvq_row *src);
float kvq_f32_score_fast(const kvq_codec *c, const float *q, const struct kvq_row *src);
/* Steps 1-2 for the baselines: non-finite input, or an f16 (value or block
 * scale) that would overflow. Scalar; the AVX2 encoders check the same. */
kvq_status kvq_baseline_check(const kvq_codec *c, const float *x);
kvq_status kvq_baseline_check_avx2(const kvq_codec *c, const float *x);
/* TurboQuant tqB / tqBj (c->bits, c->qjl select the variant): scalar
 * references (tq_ref.c), AVX2 (tq_avx2.c) and dispatchers (tq.c). */
kvq_status kvq_tq_encode_ref(const kvq_codec *c, const float *x, const struct kvq_row *dst);
void kvq_tq_decode_ref(const kvq_codec *c, const struct kvq_row *src, float *x);
float kvq_tq_score_ref(const kvq_codec *c, const float *qprep, const struct kvq_row *src);
kvq_status kvq_tq_encode_avx2(const kvq_codec *c, const float *x, const struct kvq_row *dst);
void kvq_tq_decode_avx2(const kvq_codec *c, const struct kvq_row *src, float *x);
float kvq_tq_score_avx2(const kvq_codec *c, const float *qprep, const struct kvq_row *src);
kvq_status kvq_tq_encode(const kvq_codec *c, const float *x, const struct kvq_row *dst);
void kvq_tq_decode(const kvq_codec *c, const struct kvq_row *src, float *x);
float kvq_tq_score(const kvq_codec *c, const float *qprep, const struct kvq_row *src);
/* Rotated baselines (q8_0r, q4_0r, q4_1r, q5_0r, q5_1r; baseline_rot.c): the base type's kernels
 * on y = R x. Encode rotates then encodes; decode decodes then applies R^T;
 * score is the base's score against the prepared query R q. The _ref ones use
 * the scalar rotation and the base's scalar kernels, bit-identical to the
 * fast ones. kvq_rotbase_check: steps 1-2 (non-finite x, then an f16 block
 * scale of R x that would overflow). */
kvq_status kvq_rotbase_encode(const kvq_codec *c, const float *x, const struct kvq_row *dst);
void kvq_rotbase_decode(const kvq_codec *c, const struct kvq_row *src, float *x);
float kvq_rotbase_score(const kvq_codec *c, const float *qprep, const struct kvq_row *src);
kvq_status kvq_rotbase_encode_ref(const kvq_codec *c, const float *x, const struct kvq_row *dst);
void kvq_rotbase_decode_ref(const kvq_codec *c, const struct kvq_row *src, float *x);
float kvq_rotbase_score_ref(const kvq_codec *c, const float *qprep, const struct kvq_row *src);
kvq_status kvq_rotbase_check(const kvq_codec *c, const float *x);
/* The traits whose kernels read this codec's stored rows: the base's for a
 * rotated baseline (rows in R's domain), the codec's own otherwise. */
static inline const struct kvq_type_traits *kvq_codec_stored_traits(const kvq_codec *c)
{
    return c->traits->base != c->traits->type ? kvq_type_traits(c->traits->base) : c->traits;
}
/* Steps 1-2 of encode without writing: KVQ_OK, KVQ_ERR_NONFINITE or KVQ_ERR_RANGE. */
kvq_status kvq_tq_check_ref(const kvq_codec *c, const float *x);
kvq_status kvq_tq_check_avx2(const kvq_codec *c, const float *x);

/** Step 1 and 2 of encode for any type, without writing anything: KVQ_OK,
 *  KVQ_ERR_NONFINITE or KVQ_ERR_RANGE (what encode would return). */
kvq_status kvq_codec_check_row(const kvq_codec *c, const float *x);

#ifdef __cplusplus
}
#endif

/* y = S x and x = S^T y for tqBj codecs (fast and reference paths). Kernels
 * apply S only through these, never through c->qjl directly, so that what S
 * is stays decided in one place (codec.c). In place allowed. */
static inline void kvq_codec_s_apply(const kvq_codec *c, const float *x, float *y)
{
    kvq_rotation_apply(c->qjl, x, y);
}

static inline void kvq_codec_s_apply_t(const kvq_codec *c, const float *y, float *x)
{
    kvq_rotation_apply_t(c->qjl, y, x);
}

static inline void kvq_codec_s_apply_ref(const kvq_codec *c, const float *x, float *y)
{
    kvq_rotation_apply_ref(c->qjl, x, y);
}

static inline void kvq_codec_s_apply_t_ref(const kvq_codec *c, const float *y, float *x)
{
    kvq_rotation_apply_t_ref(c->qjl, y, x);
}

/* 1/d for the q8_0/q4_0 quantizers: llama.cpp's `d ? 1/d : 0`, except that
 * a scale so small that 1/d overflows (|d| < 2^-128, blocks of magnitude
 * below ~1e-36, whose f16 scale is 0 anyway) also gets 0: llama.cpp then
 * converts Inf/NaN to int8, which is undefined behaviour in C. */
static inline float kvq_block_inv_scale(float d)
{
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    return isinf(id) ? 0.0f : id;
}

static inline uint16_t kvq_row_load_u16(const uint16_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void kvq_row_store_u16(uint16_t *p, uint16_t v)
{
    memcpy(p, &v, sizeof v);
}

/* 1 when the f16 of v is Inf: for finite v exactly when |v| >= 65520 (the
 * tie between 65504 and 2^16 rounds to even, i.e. up); also for v = +-Inf.
 * Encoders refuse such values (KVQ_ERR_RANGE) before writing anything. */
static inline int kvq_f16_overflows(float v)
{
    return !(fabsf(v) < 65520.0f);
}

/* 1 when every x_j is finite. */
static inline int kvq_all_finite(const float *x, int d)
{
    int ok = 1;
    for (int j = 0; j < d; j++)
        ok &= isfinite(x[j]) != 0;
    return ok;
}

/* The one reduction order of eight partial sums (lane k holds j = k mod 8):
 * what an AVX2 register reduces to by adding its halves, then pairs. */
static inline float kvq_reduce8(const float s[8])
{
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* Step 2 above; d % 8 == 0. */
static inline float kvq_norm_ref(const float *x, int d)
{
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < d; j += 8)
        for (int k = 0; k < 8; k++)
            s[k] = fmaf(x[j + k], x[j + k], s[k]);
    return sqrtf(kvq_reduce8(s));
}

/* Packed-code access, stream bit order as in kvq_codec.h. */
static inline unsigned kvq_code_get(const uint8_t *codes, int bits, int j)
{
    unsigned pos = (unsigned)(bits * j), v = 0;
    for (int b = 0; b < bits; b++, pos++)
        v |= (unsigned)((codes[pos >> 3] >> (pos & 7)) & 1u) << b;
    return v;
}

/* The 5..8 bytes at p, little-endian (8 codes of a 5- to 8-bit codebook),
 * with whole loads: a zeroed word patched by a short memcpy stalls on store
 * forwarding, and never reading past p + n keeps the last row in bounds. */
static inline uint64_t kvq_load_le_5to8(const uint8_t *p, int n)
{
    uint32_t a;
    uint16_t b;
    memcpy(&a, p, 4);
    switch (n) {
    case 5: return a | (uint64_t)p[4] << 32;
    case 6: memcpy(&b, p + 4, 2); return a | (uint64_t)b << 32;
    case 7: memcpy(&b, p + 4, 2); return a | (uint64_t)b << 32 | (uint64_t)p[6] << 48;
    default: {
        uint64_t w;
        memcpy(&w, p, 8);
        return w;
    }
    }
}

static inline void kvq_code_set(uint8_t *codes, int bits, int j, unsigned v)
{
    unsigned pos = (unsigned)(bits * j);
    for (int b = 0; b < bits; b++, pos++) {
        uint8_t m = (uint8_t)(1u << (pos & 7));
        if ((v >> b) & 1u)
            codes[pos >> 3] |= m;
        else
            codes[pos >> 3] &= (uint8_t)~m;
    }
}

#endif /* KVQ_CODEC_INTERNAL_H */
