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
 * Decode: w_j = c[idx_j]; tqBj: t = S^T s~ (s~_j = +-1.0f), g = gamma_f32 * qjl_kappa_f,
 * w_j = fmaf(g, t_j, w_j); z = R^T w; x~_j = z_j * n_f32.
 */
#ifndef KVQ_CODEC_INTERNAL_H
#define KVQ_CODEC_INTERNAL_H

#include <math.h>
#include <stddef.h>

#include "kvq_codebook.h"
#include "kvq_codec.h"
#include "kvq_layout.h"
#include "kvq_rotation.h"

#define KVQ_TQ_MAX_LEVELS 16 /* tq types use at most 4-bit codebooks */

/* Stream ids for kvq_seed_derive(cfg.seed, id). */
#define KVQ_SEED_STREAM_R 1u
#define KVQ_SEED_STREAM_S 2u

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

/* Step 2 above; d % 8 == 0. */
static inline float kvq_norm_ref(const float *x, int d)
{
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < d; j += 8)
        for (int k = 0; k < 8; k++)
            s[k] = fmaf(x[j + k], x[j + k], s[k]);
    float t = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
    return sqrtf(t);
}

/* Packed-code access, stream bit order as in kvq_codec.h. */
static inline unsigned kvq_code_get(const uint8_t *codes, int bits, int j)
{
    unsigned pos = (unsigned)(bits * j), v = 0;
    for (int b = 0; b < bits; b++, pos++)
        v |= (unsigned)((codes[pos >> 3] >> (pos & 7)) & 1u) << b;
    return v;
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
