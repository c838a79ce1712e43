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
 * described at kvq_codebook_compute(); docs/codebooks.md has the mse table.
 */
#ifndef KVQ_CODEBOOK_H
#define KVQ_CODEBOOK_H

#include "kvq_export.h"

#include "kvq_status.h"

/* The shipped set, compiled into the library (beta density only): the head
 * dims in use by common models, every bit width of the tqB cache types. Other
 * dims are computed on first use. */
#define KVQ_CODEBOOK_SHIPPED_DIMS {64, 80, 96, 112, 128, 160, 192, 256}
#define KVQ_CODEBOOK_SHIPPED_MAX_BITS 4

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
    int iterations;      /* solver iterations (Newton or Lloyd steps); 0 for a shipped table */
} kvq_codebook;

/** Computes the Lloyd-Max codebook from scratch (no shared state: thread-safe).
 *
 *  Numerics (details in lloyd_max.c): everything in long double. Cell numerators
 *  int t f(t) dt use closed forms written without cancellation (expm1/log1p);
 *  Gaussian cell masses use erfc differences of same-sign arguments; beta cell
 *  masses and every cell's int (t - c)^2 f(t) dt (the mse, never formed as
 *  E[t^2] - M c^2) use adaptive 20-point Gauss-Legendre quadrature, with the
 *  substitution t = 1 - s^2 for |t| > 1/2 so the integrand stays analytic at the
 *  endpoints +-1; the normaliser B(1/2, (d-1)/2) comes from lgamma. The Lloyd
 *  conditions are solved by damped Newton steps (tridiagonal Jacobian) from the
 *  companding start (quantiles of f^(1/3)), falling back to plain Lloyd steps;
 *  converged when no centroid moves by more than 1e-13 and max |c_i - E[t | cell i]|
 *  <= 1e-12 (the acceptance bar is 1e-9; measured against 40-digit mpmath the
 *  centroids are right to ~1e-16, the mse to ~2e-16 relative). 5-8 iterations,
 *  a few ms for b <= 4, tens of ms for b = 8.
 *
 *  The output is fully written (padding zeroed, so equal codebooks compare equal
 *  with memcmp) only on KVQ_OK; on error *out is left untouched. Centroids are
 *  the long double solution rounded to double; boundaries are the midpoints of
 *  those doubles; mse is integrated for exactly that published codebook.
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG for out == NULL or an unknown dist;
 *  KVQ_ERR_UNSUPPORTED for dim or bits outside the ranges above;
 *  KVQ_ERR_NOT_CONVERGED if the iteration or quadrature limits are hit (never
 *  seen in a sweep of every d in 3..300 and log-spaced d up to 65536, b = 1..8). */
KVQ_API kvq_status kvq_codebook_compute(int dim, int bits, enum kvq_dist dist, kvq_codebook *out);

/** The codebook the library uses: the shipped table when (dim, bits, dist) is
 *  one (iterations = 0; boundaries rebuilt as midpoints exactly as
 *  kvq_codebook_compute() does), otherwise kvq_codebook_compute(). Thread-safe:
 *  no cache, nothing shared is written. It copies (or computes) a whole table:
 *  call it once at setup, not per vector.
 *  @return as kvq_codebook_compute(). */
KVQ_API kvq_status kvq_codebook_get(int dim, int bits, enum kvq_dist dist, kvq_codebook *out);

/** @return 1 when (dim, bits, dist) is one of the tables shipped in codebooks/. */
KVQ_API int kvq_codebook_is_shipped(int dim, int bits, enum kvq_dist dist);

/** @return "beta" or "gauss" (NULL for an unknown value). */
KVQ_API const char *kvq_dist_name(enum kvq_dist dist);

/** Parses "beta" or "gauss". @return KVQ_OK or KVQ_ERR_INVALID_ARG. */
KVQ_API kvq_status kvq_dist_from_name(const char *name, enum kvq_dist *out);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_CODEBOOK_H */
