/* rotation_internal.h - the rotation object and its kernels, for the rotation
 * module itself, the CUDA port (which uploads the tables below instead of
 * recomputing them) and the measurement tool bench/bench_rotation.c.
 *
 * Bit-exactness contract of KVQ_ROT_HADAMARD (every path - scalar _ref, AVX2,
 * CUDA - must do exactly these IEEE-754 binary32 operations, round to nearest
 * even, no contraction of a*b+c into fma unless written as fmaf):
 *
 * Power-of-two d (8 <= d <= KVQ_ROT_MAX_DIM), one round (several rounds
 * repeat it with the next d signs of the stream; apply_t undoes them last
 * round first):
 *   signs: kvq_rng_init(&rng, seed); for j = 0..d-1 in order:
 *          sign_j = (kvq_rng_next(&rng) >> 63) ? -1.0f : +1.0f
 *   s = (float)(1.0 / sqrt((double)d))
 *   apply:   v_j = x_j * sign_j (exact);
 *            FWHT(v): for h = 1, 2, 4, ..., d/2 in that order, for every
 *            j with (j & h) == 0:  a = v[j], b = v[j+h]; v[j] = a + b; v[j+h] = a - b;
 *            y_j = v_j * s
 *   apply_t: v = FWHT(y) (same stages, same order);  x_j = (v_j * s) * sign_j
 * Within one stage the butterflies are independent, so any evaluation order
 * (or SIMD width) gives the same bits as long as a + b and a - b are computed
 * as such (a - b, never -(b - a): that differs in the sign of zero).
 *
 * Other d = p * m, p = 2^k >= 8, m odd >= 3 (the Kronecker rotation, see
 * docs/rotation.md): x is viewed as an m x p row-major matrix, X[i][c] =
 * x[i*p + c]. rounds = 1 by default (more through kvq_rotation_create_rounds); signs for round r (0-based) are the draws r*d .. r*d + d-1
 * of the same rng stream as above.
 *   mix[i][l] = (float)(cas(2*pi*((i*l) mod m)/m) / sqrt((double)(m * p))),
 *   cas = cos + sin, computed in double (the normalised discrete Hartley
 *   transform of length m with the row-FWHT scale 1/sqrt(p) folded in;
 *   symmetric and, with the FWHT, exactly orthogonal in real arithmetic).
 *   One round of apply, v the round's input:
 *     v_j = v_j * sign_{r,j};  FWHT (as above, no scaling) of each row of
 *     length p;  out[i*p + c] = acc, where acc = 0.0f and
 *     for l = 0..m-1 in order: acc = fmaf(mix[i][l], v[l*p + c], acc)
 *   apply_t undoes the rounds in reverse order, each as:
 *     out[i*p + c] = sequential fmaf over l = 0..m-1 of mix[l][i] * y[l*p + c]
 *     (from acc = 0.0f), FWHT of each row, then out_j = out_j * sign_{r,j}.
 * The tables (signs as +-1.0f, mix) are what a port must upload: cos/sin of
 * another libm could round differently.
 */
#ifndef KVQ_ROTATION_INTERNAL_H
#define KVQ_ROTATION_INTERNAL_H

#include <stdint.h>

#include "kvq_rotation.h"

struct kvq_rotation {
    int dim;
    enum kvq_rot_kind kind;
    uint64_t seed;
    /* HADAMARD */
    int p;           /* largest power of two dividing dim */
    int m;           /* dim / p (odd); 1 for power-of-two dims */
    int rounds;      /* HADAMARD rounds: 1, more through kvq_rotation_create_rounds */
    float scale;     /* power-of-two dims: (float)(1/sqrt(dim)) */
    float *signs;    /* rounds * dim values, +-1.0f (also DCT: dim values) */
    float *mix;      /* m * m, row-major (m > 1 only) */
    /* DCT */
    void *dct_fwd;   /* fftwf_plan REDFT10, in place, dim */
    void *dct_inv;   /* fftwf_plan REDFT01, in place, dim */
    float dct_s0;    /* forward scale of coefficient 0: 1/(2 sqrt(n)) */
    float dct_s;     /* forward scale of the others, also inverse: 1/sqrt(2n) */
    float dct_t0;    /* inverse pre-scale of coefficient 0: 1/sqrt(n) */
    /* GAUSS */
    float *gauss;    /* dim * dim, row-major, i.i.d. N(0,1) */
};

/** kvq_rotation_create() with an explicit number of HADAMARD rounds
 *  (1..KVQ_ROT_MAX_ROUNDS; 0 = the default, 1). Each round draws fresh signs
 *  (round r uses draws r*d .. r*d + d-1 of the seed's stream) and applies
 *  the whole one-round construction again; apply_t undoes the rounds in
 *  reverse order. For other kinds rounds must be 0.
 *  One round is the best rotation R (docs/rotation.md); the QJL projection S
 *  uses KVQ_QJL_ROUNDS rounds, because the sign estimator is unbiased only
 *  for a Haar-like S (measured in tests/test_codec_qjl.c).
 *  @return as kvq_rotation_create(); KVQ_ERR_INVALID_ARG also for rounds out
 *  of range or nonzero for a kind other than HADAMARD. */
#define KVQ_ROT_MAX_ROUNDS 4
kvq_status kvq_rotation_create_rounds(int dim, enum kvq_rot_kind kind, uint64_t seed, int rounds,
                                      kvq_rotation **out);

/* Scalar kernels (rotation_ref.c). fwht is unnormalised, in place. */
void kvq_rot_fwht_ref(float *v, int n);
void kvq_rot_hadamard_ref(const kvq_rotation *r, const float *x, float *y);
void kvq_rot_hadamard_t_ref(const kvq_rotation *r, const float *y, float *x);
void kvq_rot_gauss_ref(const kvq_rotation *r, const float *x, float *y);
void kvq_rot_gauss_t_ref(const kvq_rotation *r, const float *y, float *x);
void kvq_rot_dct_ref(const kvq_rotation *r, const float *x, float *y);
void kvq_rot_dct_t_ref(const kvq_rotation *r, const float *y, float *x);

/* AVX2 kernels (rotation_avx2.c), bit-identical to the HADAMARD _ref ones.
 * Call only after kvq_cpu_has_avx2(). */
void kvq_rot_hadamard_avx2(const kvq_rotation *r, const float *x, float *y);
void kvq_rot_hadamard_t_avx2(const kvq_rotation *r, const float *y, float *x);

/* FFTW DCT (rotation_dct.c). */
kvq_status kvq_rot_dct_plan(kvq_rotation *r);
void kvq_rot_dct_destroy(kvq_rotation *r);
void kvq_rot_dct_apply(const kvq_rotation *r, const float *x, float *y);
void kvq_rot_dct_apply_t(const kvq_rotation *r, const float *y, float *x);

/* OpenBLAS Gaussian (rotation.c). */
void kvq_rot_gauss_blas(const kvq_rotation *r, const float *x, float *y);
void kvq_rot_gauss_t_blas(const kvq_rotation *r, const float *y, float *x);

#endif /* KVQ_ROTATION_INTERNAL_H */
