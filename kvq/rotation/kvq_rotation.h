/* kvq_rotation.h - seeded random rotations of head vectors.
 *
 * TurboQuant needs y = R x with R orthogonal and random, so that every
 * coordinate of a rotated unit vector follows the same known density
 * (see kvq_codebook.h) and outlier channels are spread over all coordinates.
 *
 * Kinds:
 *  - KVQ_ROT_HADAMARD (default). For d a power of two: R = H D / sqrt(d), D a
 *    seeded diagonal of +-1 signs and H the Walsh-Hadamard matrix applied by an
 *    in-place fast transform (O(d log d), exactly orthogonal). For other d,
 *    d = 2^k * m with m odd: see rotation.c / docs/rotation.md for the
 *    Kronecker construction and why it was chosen.
 *  - KVQ_ROT_DCT: seeded signs then an orthonormal DCT-II through FFTW, kept
 *    for comparison; any d >= 2.
 *  - KVQ_ROT_IDENTITY: no rotation, for ablations.
 *  - KVQ_ROT_GAUSS: an i.i.d. N(0,1) d x d matrix G (not orthogonal), applied
 *    with OpenBLAS. Only meaningful as the QJL projection S (the paper's choice).
 *
 * Determinism: for a given (dim, kind, seed) the matrix is the same on every
 * platform. For HADAMARD and IDENTITY, kvq_rotation_apply() and the scalar
 * kvq_rotation_apply_ref() return bit-identical results (the fast path does
 * the same floating-point operations in the same order), which is what lets
 * the CUDA encoder match the CPU encoder bit for bit.
 *
 * Threading: a rotation is immutable after create; apply functions never
 * allocate and may run concurrently on different buffers.
 */
#ifndef KVQ_ROTATION_H
#define KVQ_ROTATION_H

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
 *  @return KVQ_OK and *out; KVQ_ERR_INVALID_ARG (out NULL, kind unknown),
 *  KVQ_ERR_UNSUPPORTED (dim < 2 or > KVQ_ROT_MAX_DIM, or dim not a multiple
 *  of 8 for HADAMARD), KVQ_ERR_NOMEM. */
kvq_status kvq_rotation_create(int dim, enum kvq_rot_kind kind, uint64_t seed, kvq_rotation **out);

/** Frees r; accepts NULL. */
void kvq_rotation_free(kvq_rotation *r);

int kvq_rotation_dim(const kvq_rotation *r);
enum kvq_rot_kind kvq_rotation_kind(const kvq_rotation *r);
/** @return 1 when R is orthogonal (every kind except GAUSS). */
int kvq_rotation_is_orthogonal(const kvq_rotation *r);

/** y = R x. x and y have dim floats and may be the same buffer (in place). */
void kvq_rotation_apply(const kvq_rotation *r, const float *x, float *y);

/** x = R^T y (the inverse for orthogonal kinds). In place allowed. */
void kvq_rotation_apply_t(const kvq_rotation *r, const float *y, float *x);

/** Scalar references of the two above: plain loops, no SIMD. */
void kvq_rotation_apply_ref(const kvq_rotation *r, const float *x, float *y);
void kvq_rotation_apply_t_ref(const kvq_rotation *r, const float *y, float *x);

/** @return "hadamard", "dct", "identity", "gauss" (NULL for unknown). */
const char *kvq_rot_kind_name(enum kvq_rot_kind kind);
/** Parses the names above. @return KVQ_OK or KVQ_ERR_INVALID_ARG. */
kvq_status kvq_rot_kind_from_name(const char *name, enum kvq_rot_kind *out);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_ROTATION_H */
