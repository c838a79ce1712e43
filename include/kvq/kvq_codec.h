/* kvq_codec.h - cache types, their traits table, and per-type row codecs.
 *
 * A "row" is one token of one attention head: dim floats in, a few dozen
 * bytes out. Every cache type, the llama.cpp-style baselines and the kvq
 * TurboQuant types alike, is described by one entry of the traits table, so
 * every tool can compare any of them through the same calls.
 *
 * TurboQuant types (d = head dim, B = codebook bits):
 *   tqB  : norm n = ||x|| (f16) | codes: B bits per coordinate of y = R x/n,
 *          nearest centroid of the Lloyd-Max codebook for (d, B)
 *   tqBj : tqB plus the QJL residual: gamma = ||r|| (f16) with r = y - c[idx],
 *          and 1 sign bit per coordinate of S r (S independent of R)
 * Packed row layout, in this order, no padding:
 *   tqB : u16 norm | codes[d*B/8]
 *   tqBj: u16 norm | u16 rnorm (gamma) | codes[d*B/8] | signs[d/8]
 * Codes are a little-endian bit stream: code j occupies stream bits
 * [B*j, B*j+B), stream bit i being bit (i % 8) of byte i / 8. Sign j is
 * stream bit j of signs, 1 when (S r)_j >= 0.
 * At d = 128: tq3j = 68 bytes (4.25 bits/value), tq3 = 50 (3.125).
 * tq5, tq6, tq8 (no QJL variant) extend tqB to the rates of q4_0..q8_0:
 * 82, 98, 130 bytes at d = 128 (5.125, 6.125, 8.125 bits/value).
 *
 * Baselines use llama.cpp's block layouts bit for bit: f32, f16 (IEEE
 * binary16), q8_0 (blocks of 32: f16 scale + 32 x int8, 34 bytes) and q4_0
 * (blocks of 32: f16 scale + 16 bytes of nibbles, 18 bytes), and the other
 * llama.cpp cache types of blocks of 32: q4_1 (f16 scale and minimum + 16
 * bytes of nibbles, 20 bytes), q5_0 (f16 scale + 4 bytes of fifth bits + 16
 * of nibbles, 22 bytes) and q5_1 (f16 scale and minimum + 4 + 16, 24 bytes).
 *
 * Rotated baselines q8_0r, q4_0r, q4_1r, q5_0r, q5_1r: what llama.cpp has
 * stored for quantized caches since PR #21038 (merged 2026-04-01, commit
 * 744c0c73): the row is rotated, y = R x, and y is stored in the base layout; queries are
 * rotated the same way (<R q, y> = <q, x>) and a value sum is rotated back
 * once per head. R is kvq's randomized Hadamard over the whole row, as for
 * the tq types (llama.cpp uses an unsigned Sylvester Hadamard, over the
 * whole head for K and in blocks of 64 for V). Row bytes are the base's.
 *
 * What a tq row decodes to (the "dequantize" used by reference attention):
 *   x~ = n * R^T ( c[idx] + g * S^T s~ ),  s~_j = +-1 from the sign bits,
 * g = gamma * kappa (0 for tqB), kappa = 1 / E[sum_i |v_i|] for v uniform on
 * the unit sphere of R^d (exact; ~ sqrt(pi/(2d))) for the orthogonal S, and
 * sqrt(pi/2)/d for the Gaussian S. Then <q, x~> is exactly the QJL inner
 * product estimate n * (<q', c[idx]> + g <S q', s~>) with q' = R q.
 */
#ifndef KVQ_CODEC_H
#define KVQ_CODEC_H

#include "kvq_export.h"

#include <stddef.h>
#include <stdint.h>

#include "kvq_rotation.h"
#include "kvq_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_MAX_DIM 1024 /* largest head dimension any codec accepts */

/* Append-only: values are stored in files and manifests. */
enum kvq_type {
    KVQ_TYPE_F32 = 0,
    KVQ_TYPE_F16 = 1,
    KVQ_TYPE_Q8_0 = 2,
    KVQ_TYPE_Q4_0 = 3,
    KVQ_TYPE_TQ1 = 4,
    KVQ_TYPE_TQ2 = 5,
    KVQ_TYPE_TQ3 = 6,
    KVQ_TYPE_TQ4 = 7,
    KVQ_TYPE_TQ1J = 8,
    KVQ_TYPE_TQ2J = 9,
    KVQ_TYPE_TQ3J = 10,
    KVQ_TYPE_TQ4J = 11,
    KVQ_TYPE_Q8_0R = 12,
    KVQ_TYPE_Q4_0R = 13,
    KVQ_TYPE_TQ5 = 14,
    KVQ_TYPE_TQ6 = 15,
    KVQ_TYPE_TQ8 = 16,
    KVQ_TYPE_Q4_1 = 17,
    KVQ_TYPE_Q5_0 = 18,
    KVQ_TYPE_Q5_1 = 19,
    KVQ_TYPE_Q4_1R = 20,
    KVQ_TYPE_Q5_0R = 21,
    KVQ_TYPE_Q5_1R = 22,
    KVQ_TYPE_COUNT
};

#define KVQ_DEFAULT_TYPE_K KVQ_TYPE_TQ3J
#define KVQ_DEFAULT_TYPE_V KVQ_TYPE_TQ3

/* How the QJL projection S is drawn (tqBj only). */
enum kvq_qjl_kind {
    KVQ_QJL_ORTHO = 0, /* a second seeded rotation (same kind as R), exact-kappa scaling */
    KVQ_QJL_GAUSS = 1, /* i.i.d. N(0,1) d x d matrix, sqrt(pi/2)/d scaling (the paper's) */
    KVQ_QJL_KIND_COUNT
};

/* Where the fields of one encoded row live. For a packed row they follow
 * each other (see above); in cache pages each field has its own section.
 * Baseline types use only `codes` (the whole llama.cpp row). Unused fields
 * may be NULL. */
struct kvq_row {
    uint16_t *norm;  /* tq: f16 bits of ||x|| */
    uint16_t *rnorm; /* tqBj: f16 bits of gamma = ||r|| (unit-vector scale) */
    uint8_t *codes;  /* tq: packed codes; baselines: the row */
    uint8_t *signs;  /* tqBj: QJL sign bits */
};

typedef struct kvq_codec kvq_codec;

typedef kvq_status (*kvq_encode_fn)(const kvq_codec *c, const float *x, const struct kvq_row *dst);
typedef void (*kvq_decode_fn)(const kvq_codec *c, const struct kvq_row *src, float *x);
typedef float (*kvq_score_fn)(const kvq_codec *c, const float *qprep, const struct kvq_row *src);

/* One entry per kvq_type; the table is indexed by the enum value. */
struct kvq_type_traits {
    const char *name;    /* "f32", "q8_0", "tq3j", ... */
    enum kvq_type type;
    int bits;            /* tq: codebook bits B; baselines: bits per stored element */
    int block_values;    /* values per block: 1 (f32, f16), 32 (q8_0, q4_0, ...), 0 = whole row (tq) */
    int block_bytes;     /* bytes per block; 0 for tq (size depends on d) */
    int rotated;         /* 1: scores live in the rotated domain (tq types) */
    int qjl;             /* 1: has the QJL sign residual (tqBj) */
    enum kvq_type base;  /* the block layout rows are stored in: q8_0 for q8_0r
                            (likewise q4_0r, q4_1r, q5_0r, q5_1r), the type
                            itself otherwise */
    const char *summary; /* one line for --help and tables */
    /* Fast paths (SIMD where the CPU has it); bit-identical to the _ref ones. */
    kvq_encode_fn encode;
    kvq_decode_fn decode;
    kvq_score_fn score;  /* ~ <q, x> for a query prepared by kvq_codec_prepare_query */
    /* Scalar references. */
    kvq_encode_fn encode_ref;
    kvq_decode_fn decode_ref;
    kvq_score_fn score_ref; /* bit-identical to score (see codec_internal.h) */
};

/** @return the traits of t, or NULL when t is not a valid type. */
KVQ_API const struct kvq_type_traits *kvq_type_traits(enum kvq_type t);

/** Parses a type name ("tq3j", "q8_0", ...). @return KVQ_OK or KVQ_ERR_INVALID_ARG. */
KVQ_API kvq_status kvq_type_from_name(const char *name, enum kvq_type *out);

/** @return KVQ_OK when type t can encode rows of dim d; KVQ_ERR_UNSUPPORTED
 *  otherwise (the block types q8_0 .. q5_1r need d % 32 == 0, tq types d % 8 == 0, every type
 *  8 <= d <= KVQ_MAX_DIM); KVQ_ERR_INVALID_ARG for an unknown type. */
KVQ_API kvq_status kvq_type_check_dim(enum kvq_type t, int dim);

/** Exact bytes of one encoded row (one token of one head), norms included.
 *  @return 0 when (t, dim) is unsupported. */
KVQ_API size_t kvq_type_row_bytes(enum kvq_type t, int dim);

/** Bits per value = 8 * row_bytes / dim. @return 0 when unsupported. */
KVQ_API double kvq_type_bits_per_value(enum kvq_type t, int dim);

struct kvq_codec_config {
    enum kvq_type type;
    int dim;
    uint64_t seed;           /* R and S are derived from it with independent streams */
    enum kvq_rot_kind rot;   /* rotation R (and S for KVQ_QJL_ORTHO); default HADAMARD */
    enum kvq_qjl_kind qjl;   /* default KVQ_QJL_ORTHO */
};

/** Fills cfg with defaults for (type, dim): seed 0, HADAMARD, QJL_ORTHO. */
KVQ_API void kvq_codec_config_default(struct kvq_codec_config *cfg, enum kvq_type type, int dim);

/** Plans a codec: validates the config, loads the codebook, builds R and S.
 *  @return KVQ_OK and *out; KVQ_ERR_INVALID_ARG / KVQ_ERR_UNSUPPORTED /
 *  KVQ_ERR_NOMEM otherwise (*out untouched). */
KVQ_API kvq_status kvq_codec_create(const struct kvq_codec_config *cfg, kvq_codec **out);

/** Frees c; accepts NULL. */
KVQ_API void kvq_codec_free(kvq_codec *c);

/** Accessors. @return the config c was created with / its type's traits /
 *  bytes of one packed row; NULL (0) when c is NULL. Pointers are owned by c
 *  and live until kvq_codec_free(c). */
KVQ_API const struct kvq_codec_config *kvq_codec_config_of(const kvq_codec *c);
KVQ_API const struct kvq_type_traits *kvq_codec_traits(const kvq_codec *c);
KVQ_API size_t kvq_codec_row_bytes(const kvq_codec *c);

/** Row view of a packed row starting at `row` (see the layout above). */
KVQ_API struct kvq_row kvq_codec_packed_row(const kvq_codec *c, void *row);

/** Encodes n_rows rows of x [n_rows][dim] into packed rows (row_bytes each).
 *  All rows are checked first: on error nothing is written.
 *  Zero vectors encode to rows that decode to exact zeros.
 *  @return KVQ_OK; KVQ_ERR_NONFINITE (NaN/Inf in x); KVQ_ERR_RANGE (what
 *  would be stored as f16 rounds to Inf, i.e. reaches 65520: the norm of a tq
 *  row, an f16 value, a block scale or minimum); KVQ_ERR_INVALID_ARG (NULL). */
KVQ_API kvq_status kvq_codec_encode(const kvq_codec *c, const float *x, size_t n_rows, void *rows);
/** The same through the scalar reference encoder (bit-identical output). */
KVQ_API kvq_status kvq_codec_encode_ref(const kvq_codec *c, const float *x, size_t n_rows, void *rows);

/** Decodes n_rows packed rows into x [n_rows][dim]. A row whose norm is 0
 *  decodes to +0.0f everywhere. @return KVQ_OK or KVQ_ERR_INVALID_ARG. */
KVQ_API kvq_status kvq_codec_decode(const kvq_codec *c, const void *rows, size_t n_rows, float *x);
/** The same through the scalar reference decoder (bit-identical output). */
KVQ_API kvq_status kvq_codec_decode_ref(const kvq_codec *c, const void *rows, size_t n_rows, float *x);

/** @return the floats a prepared query needs (dim for baselines, 2*dim for
 *  tq types); 0 when c is NULL. */
KVQ_API size_t kvq_codec_query_floats(const kvq_codec *c);

/** Prepares q [dim] for scoring: tq types store q' = R q then S q' (tqB,
 *  which has no S: zeros); baselines copy q. qprep holds
 *  kvq_codec_query_floats(c) floats and may be q itself when large enough.
 *  @return KVQ_OK, KVQ_ERR_NONFINITE, KVQ_ERR_INVALID_ARG (NULL). */
KVQ_API kvq_status kvq_codec_prepare_query(const kvq_codec *c, const float *q, float *qprep);

/** @return the estimate of <q, x> for the row, equal (to rounding) to
 *  <q, decode(row)>. Never allocates; safe from several threads (a codec is
 *  immutable after create, and so are all entry points here). */
KVQ_API float kvq_codec_score(const kvq_codec *c, const float *qprep, const struct kvq_row *row);

/** @return the QJL scale kappa described above for this codec (0 for non-QJL types). */
KVQ_API double kvq_codec_qjl_kappa(const kvq_codec *c);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_CODEC_H */
