/* kvq_rotation.h - seeded random rotations of head vectors.
 *
 * TurboQuant needs y = R x with R orthogonal and random, so that every
 * coordinate of a rotated unit vector follows the same known density
 * (see kvq_codebook.h) and outlier channels are spread over all coordinates.
 *
 * Kinds:
 *  - KVQ_ROT_HADAMARD (default). For d a power of two: R = H D / sqrt(d), D a
 *    seeded diagonal of +-1 signs and H the Walsh-Hadamard matrix applied by an
 *    in-place fast transform (O(d log d), exactly orthogonal). For other d
 *    (multiples of 8), d = p * m with p = 2^k and m odd: seeded signs, an
 *    FWHT along each row of the m x p view and an m x m discrete Hartley
 *    transform along each column (exactly orthogonal, O(d (log p + m)); a
 *    spike comes out with every |y_i| in (0, sqrt(2/d)]). The exact float
 *    operations are specified in rotation_internal.h; docs/rotation.md has
 *    the measurements behind the choice.
 *  - KVQ_ROT_DCT: seeded signs then an orthonormal DCT-II through FFTW, kept
 *    for comparison; any d >= 2.
 *  - KVQ_ROT_IDENTITY: no rotation, for ablations.
 *  - KVQ_ROT_GAUSS: an i.i.d. N(0,1) d x d matrix G (not orthogonal), applied
 *    with OpenBLAS sgemv: apply is G x, apply_t is G^T y (not an inverse).
 *    G[i][j] is the (i*d + j)-th kvq_rng_gauss() draw of the seed's stream.
 *    Only meaningful as the QJL projection S (the paper's choice).
 *
 * Determinism: for a given (dim, kind, seed) the matrix is the same on every
 * platform. For HADAMARD and IDENTITY, kvq_rotation_apply() and the scalar
 * kvq_rotation_apply_ref() return bit-identical results (the fast path does
 * the same floating-point operations in the same order), which is what lets
 * the CUDA encoder match the CPU encoder bit for bit. DCT (FFTW) and GAUSS
 * (OpenBLAS) results depend on those libraries' algorithms; their _ref
 * functions are independent double-accumulated O(d^2) loops that agree to
 * float rounding (~1e-6 relative), not bitwise.
 *
 * Threading: a rotation is immutable after create; apply functions never
 * allocate and may run concurrently on different buffers.
 */
#ifndef KVQ_ROTATION_H
#define KVQ_ROTATION_H

#include "kvq_export.h"

#include <stdint.h>

#include "kvq_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_ROT_MAX_DIM 4096

enum kvq_rot_kind {
    KVQ_ROT_HADAMARD = 0,
    KVQ_ROT_DCT = 1,
    KVQ_ROT_IDENTITY = 2,
    KVQ_ROT_GAUSS = 3,
    KVQ_ROT_KIND_COUNT
};

typedef struct kvq_rotation kvq_rotation;

/** Plans a rotation of R^dim (validates, draws the seeded parameters,
 *  allocates once).
 *  Memory: dim floats of signs (HADAMARD, DCT; plus an m x m table for
 *  non-powers of two), FFTW plans (DCT), dim * dim floats (GAUSS).
 *  @return KVQ_OK and *out; on failure *out = NULL (when out is not NULL) and
 *  KVQ_ERR_INVALID_ARG (out NULL, kind unknown), KVQ_ERR_UNSUPPORTED (dim < 2
 *  or > KVQ_ROT_MAX_DIM, or dim not a multiple of 8 for HADAMARD),
 *  KVQ_ERR_NOMEM, KVQ_ERR_INTERNAL (FFTW could not plan). */
KVQ_API kvq_status kvq_rotation_create(int dim, enum kvq_rot_kind kind, uint64_t seed, kvq_rotation **out);

/** Frees r; accepts NULL. */
KVQ_API void kvq_rotation_free(kvq_rotation *r);

/** @return the dimension (0 for NULL). */
KVQ_API int kvq_rotation_dim(const kvq_rotation *r);
/** @return the kind (KVQ_ROT_KIND_COUNT for NULL). */
KVQ_API enum kvq_rot_kind kvq_rotation_kind(const kvq_rotation *r);
/** @return 1 when R is orthogonal (every kind except GAUSS). */
KVQ_API int kvq_rotation_is_orthogonal(const kvq_rotation *r);

/** y = R x. x and y have dim floats and may be the same buffer (in place);
 *  partially overlapping buffers are not allowed. Never allocates (uses up
 *  to 16 KiB of stack). */
KVQ_API void kvq_rotation_apply(const kvq_rotation *r, const float *x, float *y);

/** x = R^T y (the inverse for orthogonal kinds). In place allowed. */
KVQ_API void kvq_rotation_apply_t(const kvq_rotation *r, const float *y, float *x);

/** Scalar references of the two above: plain loops, no SIMD, no FFTW/BLAS.
 *  Bit-identical to the fast paths for HADAMARD and IDENTITY; see above for
 *  DCT and GAUSS (and they are O(d^2): slow, for tests). */
KVQ_API void kvq_rotation_apply_ref(const kvq_rotation *r, const float *x, float *y);
KVQ_API void kvq_rotation_apply_t_ref(const kvq_rotation *r, const float *y, float *x);

/** @return "hadamard", "dct", "identity", "gauss" (NULL for unknown). */
KVQ_API const char *kvq_rot_kind_name(enum kvq_rot_kind kind);
/** Parses the names above. @return KVQ_OK or KVQ_ERR_INVALID_ARG. */
KVQ_API kvq_status kvq_rot_kind_from_name(const char *name, enum kvq_rot_kind *out);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_ROTATION_H */
