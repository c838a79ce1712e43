/* traits.c - the table of cache types and the storage arithmetic on it.
 *
 * Row sizes come from kvq_layout_row_bytes() only, so the codec, the cache
 * pages and the CUDA kernels can never disagree about a byte count. */
#include <string.h>

#include "codec_internal.h"

#define BASELINE(T, NAME, BITS, BV, BB, SUMMARY, FN)                                      \
    [T] = {NAME, T, BITS, BV, BB, 0, 0, T, SUMMARY, FN##_encode_fast, FN##_decode_fast,    \
           FN##_score_fast, FN##_encode, FN##_decode, FN##_score}
#define TQ(T, NAME, BITS, QJL, SUMMARY)                                                   \
    [T] = {NAME, T, BITS, 0, 0, 1, QJL, T, SUMMARY, kvq_tq_encode, kvq_tq_decode, kvq_tq_score, \
           kvq_tq_encode_ref, kvq_tq_decode_ref, kvq_tq_score_ref}
/* A baseline with scalar kernels only (baseline_q5.c): they are the fast path too. */
#define BASELINE_SCALAR(T, NAME, BITS, BB, SUMMARY, FN)                                        \
    [T] = {NAME, T, BITS, KVQ_QK, BB, 0, 0, T, SUMMARY, FN##_encode, FN##_decode, FN##_score, \
           FN##_encode, FN##_decode, FN##_score}
/* A baseline layout holding R x (see kvq_codec.h); the kernels reach the
 * base's own functions through kvq_rotbase_*. */
#define ROTATED_BASELINE(T, BASE, NAME, BITS, BB, SUMMARY)                                   \
    [T] = {NAME, T, BITS, KVQ_QK, BB, 0, 0, BASE, SUMMARY, kvq_rotbase_encode, kvq_rotbase_decode, \
           kvq_rotbase_score, kvq_rotbase_encode_ref, kvq_rotbase_decode_ref, kvq_rotbase_score_ref}

static const struct kvq_type_traits traits_table[KVQ_TYPE_COUNT] = {
    /* f32 decode is a memcpy on either path. */
    [KVQ_TYPE_F32] = {"f32", KVQ_TYPE_F32, 32, 1, 4, 0, 0, KVQ_TYPE_F32, "IEEE binary32, uncompressed reference",
                      kvq_f32_encode_fast, kvq_f32_decode, kvq_f32_score_fast, kvq_f32_encode, kvq_f32_decode,
                      kvq_f32_score},
    BASELINE(KVQ_TYPE_F16, "f16", 16, 1, 2, "IEEE binary16 (round to nearest even)", kvq_f16),
    BASELINE(KVQ_TYPE_Q8_0, "q8_0", 8, KVQ_QK, (int)sizeof(kvq_block_q8_0),
             "llama.cpp q8_0: blocks of 32 int8 with an f16 scale", kvq_q8_0),
    BASELINE(KVQ_TYPE_Q4_0, "q4_0", 4, KVQ_QK, (int)sizeof(kvq_block_q4_0),
             "llama.cpp q4_0: blocks of 32 4-bit values with an f16 scale", kvq_q4_0),
    TQ(KVQ_TYPE_TQ1, "tq1", 1, 0, "TurboQuant: f16 norm + rotation + 1-bit Lloyd-Max codes"),
    TQ(KVQ_TYPE_TQ2, "tq2", 2, 0, "TurboQuant: f16 norm + rotation + 2-bit Lloyd-Max codes"),
    TQ(KVQ_TYPE_TQ3, "tq3", 3, 0, "TurboQuant: f16 norm + rotation + 3-bit Lloyd-Max codes"),
    TQ(KVQ_TYPE_TQ4, "tq4", 4, 0, "TurboQuant: f16 norm + rotation + 4-bit Lloyd-Max codes"),
    TQ(KVQ_TYPE_TQ1J, "tq1j", 1, 1, "tq1 + 1-bit QJL sign residual and its f16 norm"),
    TQ(KVQ_TYPE_TQ2J, "tq2j", 2, 1, "tq2 + 1-bit QJL sign residual and its f16 norm"),
    TQ(KVQ_TYPE_TQ3J, "tq3j", 3, 1, "tq3 + 1-bit QJL sign residual and its f16 norm"),
    TQ(KVQ_TYPE_TQ4J, "tq4j", 4, 1, "tq4 + 1-bit QJL sign residual and its f16 norm"),
    ROTATED_BASELINE(KVQ_TYPE_Q8_0R, KVQ_TYPE_Q8_0, "q8_0r", 8, (int)sizeof(kvq_block_q8_0),
                     "q8_0 of the rotated row (llama.cpp's default for a q8_0 cache since 2026-04)"),
    ROTATED_BASELINE(KVQ_TYPE_Q4_0R, KVQ_TYPE_Q4_0, "q4_0r", 4, (int)sizeof(kvq_block_q4_0),
                     "q4_0 of the rotated row (llama.cpp's default for a q4_0 cache since 2026-04)"),
    TQ(KVQ_TYPE_TQ5, "tq5", 5, 0, "TurboQuant: f16 norm + rotation + 5-bit Lloyd-Max codes"),
    TQ(KVQ_TYPE_TQ6, "tq6", 6, 0, "TurboQuant: f16 norm + rotation + 6-bit Lloyd-Max codes"),
    TQ(KVQ_TYPE_TQ8, "tq8", 8, 0, "TurboQuant: f16 norm + rotation + 8-bit Lloyd-Max codes"),
    BASELINE_SCALAR(KVQ_TYPE_Q4_1, "q4_1", 4, (int)sizeof(kvq_block_q4_1),
                    "llama.cpp q4_1: blocks of 32 4-bit values with an f16 scale and minimum", kvq_q4_1),
    BASELINE_SCALAR(KVQ_TYPE_Q5_0, "q5_0", 5, (int)sizeof(kvq_block_q5_0),
                    "llama.cpp q5_0: blocks of 32 5-bit values with an f16 scale", kvq_q5_0),
    BASELINE_SCALAR(KVQ_TYPE_Q5_1, "q5_1", 5, (int)sizeof(kvq_block_q5_1),
                    "llama.cpp q5_1: blocks of 32 5-bit values with an f16 scale and minimum", kvq_q5_1),
    ROTATED_BASELINE(KVQ_TYPE_Q4_1R, KVQ_TYPE_Q4_1, "q4_1r", 4, (int)sizeof(kvq_block_q4_1),
                     "q4_1 of the rotated row (llama.cpp's default for a q4_1 cache since 2026-04)"),
    ROTATED_BASELINE(KVQ_TYPE_Q5_0R, KVQ_TYPE_Q5_0, "q5_0r", 5, (int)sizeof(kvq_block_q5_0),
                     "q5_0 of the rotated row (llama.cpp's default for a q5_0 cache since 2026-04)"),
    ROTATED_BASELINE(KVQ_TYPE_Q5_1R, KVQ_TYPE_Q5_1, "q5_1r", 5, (int)sizeof(kvq_block_q5_1),
                     "q5_1 of the rotated row (llama.cpp's default for a q5_1 cache since 2026-04)"),
};

const struct kvq_type_traits *kvq_type_traits(enum kvq_type t)
{
    if ((int)t < 0 || (int)t >= KVQ_TYPE_COUNT)
        return NULL;
    return &traits_table[t];
}

kvq_status kvq_type_from_name(const char *name, enum kvq_type *out)
{
    if (!name || !out)
        return KVQ_ERR_INVALID_ARG;
    for (int t = 0; t < KVQ_TYPE_COUNT; t++) {
        if (strcmp(name, traits_table[t].name) == 0) {
            *out = (enum kvq_type)t;
            return KVQ_OK;
        }
    }
    return KVQ_ERR_INVALID_ARG;
}

kvq_status kvq_type_check_dim(enum kvq_type t, int dim)
{
    if (!kvq_type_traits(t))
        return KVQ_ERR_INVALID_ARG;
    /* The layout encodes every rule (range, block multiple, whole bytes of codes). */
    return kvq_layout_row_bytes((int)t, dim) ? KVQ_OK : KVQ_ERR_UNSUPPORTED;
}

size_t kvq_type_row_bytes(enum kvq_type t, int dim)
{
    if (!kvq_type_traits(t))
        return 0;
    return kvq_layout_row_bytes((int)t, dim);
}

double kvq_type_bits_per_value(enum kvq_type t, int dim)
{
    size_t bytes = kvq_type_row_bytes(t, dim);
    return bytes ? 8.0 * (double)bytes / (double)dim : 0.0;
}
