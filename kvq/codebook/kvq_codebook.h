/* kvq_codebook.h - Lloyd-Max scalar codebooks for rotated unit-vector coordinates.
 *
 * After a random rotation, each coordinate t of a unit vector in R^d follows
 *     f(t) = (1 - t^2)^((d-3)/2) / B(1/2, (d-1)/2)   on [-1, 1]      (KVQ_DIST_BETA)
 * which tends to N(0, 1/d) as d grows                                 (KVQ_DIST_GAUSS).
 * A codebook is the b-bit Lloyd-Max quantizer of that density: 2^b ascending
 * centroids, 2^b - 1 decision boundaries (midpoints of adjacent centroids),
 * each centroid the conditional mean of its cell.
 *
 * Units: centroids and boundaries are in coordinates of a *unit* vector;
 * mse is the expected squared error of a whole unit vector, i.e.
 * d * (per-coordinate MSE). Gaussian-limit mse is independent of d:
 * 0.36338, 0.11748, 0.034548, 0.0095010 for b = 1..4.
 *
 * The library uses the tables shipped in codebooks/ (compiled in) for
 * d in {64, 80, 96, 112, 128, 160, 192, 256}, b in 1..4, and computes any other
 * (d, b) on demand. How the integrals are evaluated, and to what accuracy, is
 * described at kvq_codebook_compute().
 */
#ifndef KVQ_CODEBOOK_H
#define KVQ_CODEBOOK_H

#include "kvq_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_CODEBOOK_MAX_BITS 8
#define KVQ_CODEBOOK_MAX_LEVELS (1 << KVQ_CODEBOOK_MAX_BITS)
#define KVQ_CODEBOOK_MIN_DIM 3
#define KVQ_CODEBOOK_MAX_DIM 65536

enum kvq_dist {
    KVQ_DIST_BETA = 0,  /* exact coordinate density of a uniform unit vector in R^d */
    KVQ_DIST_GAUSS = 1  /* its large-d limit N(0, 1/d) */
};

/* Plain data; copy freely. */
typedef struct kvq_codebook {
    int dim;             /* d >= 3 */
    int bits;            /* b in 1..KVQ_CODEBOOK_MAX_BITS */
    enum kvq_dist dist;
    int levels;          /* 2^b */
    double centroids[KVQ_CODEBOOK_MAX_LEVELS];      /* ascending, symmetric about 0 */
    double boundaries[KVQ_CODEBOOK_MAX_LEVELS - 1]; /* boundaries[i] between centroid i and i+1 */
    double mse;          /* expected squared error per unit vector (d x per-coordinate MSE) */
    int iterations;      /* Lloyd iterations used (0 for a shipped table) */
} kvq_codebook;

/** Computes the Lloyd-Max codebook from scratch.
 *  Converged when no centroid moves by more than 1e-12 (the acceptance bar is
 *  1e-9). Integrals of the density over each cell come from closed forms or
 *  adaptive Gauss-Kronrod quadrature in long double; see lloyd_max.c.
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG for out (NULL), KVQ_ERR_UNSUPPORTED for
 *  dim or bits outside the ranges above, KVQ_ERR_NOT_CONVERGED if the
 *  iteration limit is hit. */
kvq_status kvq_codebook_compute(int dim, int bits, enum kvq_dist dist, kvq_codebook *out);

/** The codebook the library uses: the shipped table when (dim, bits, dist) is
 *  one, otherwise kvq_codebook_compute(). Thread-safe.
 *  @return as kvq_codebook_compute(). */
kvq_status kvq_codebook_get(int dim, int bits, enum kvq_dist dist, kvq_codebook *out);

/** @return 1 when (dim, bits, dist) is one of the tables shipped in codebooks/. */
int kvq_codebook_is_shipped(int dim, int bits, enum kvq_dist dist);

/** @return "beta" or "gauss" (NULL for an unknown value). */
const char *kvq_dist_name(enum kvq_dist dist);

/** Parses "beta" or "gauss". @return KVQ_OK or KVQ_ERR_INVALID_ARG. */
kvq_status kvq_dist_from_name(const char *name, enum kvq_dist *out);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_CODEBOOK_H */
