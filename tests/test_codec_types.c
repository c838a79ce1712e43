/* test_codec_types.c - the traits table, storage accounting, codec planning
 * and the llama.cpp baselines (f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1). Their AVX2 paths
 * against the scalar references: test_backend_ops (encode, decode, score). */
#include <cjson/cJSON.h>
#include <stdint.h>

#include "codec_internal.h"
#include "kvq_half.h"
#include "kvq_rng.h"
#include "test.h"
#include "test_util.h"

static kvq_codec *make(enum kvq_type t, int d)
{
    return test_codec_make(t, d, 0, KVQ_QJL_ORTHO);
}

/* The layout a rotated baseline stores its rows in; t itself otherwise. */
static int rot_base(int t)
{
    switch (t) {
    case KVQ_TYPE_Q8_0R: return KVQ_TYPE_Q8_0;
    case KVQ_TYPE_Q4_0R: return KVQ_TYPE_Q4_0;
    case KVQ_TYPE_Q4_1R: return KVQ_TYPE_Q4_1;
    case KVQ_TYPE_Q5_0R: return KVQ_TYPE_Q5_0;
    case KVQ_TYPE_Q5_1R: return KVQ_TYPE_Q5_1;
    default: return t;
    }
}

static int is_block_type(int t)
{
    t = rot_base(t);
    return t == KVQ_TYPE_Q8_0 || t == KVQ_TYPE_Q4_0 || t == KVQ_TYPE_Q4_1 || t == KVQ_TYPE_Q5_0 || t == KVQ_TYPE_Q5_1;
}

static void test_traits_table(void)
{
    static const char *const names[KVQ_TYPE_COUNT] = {"f32",  "f16",  "q8_0", "q4_0", "tq1",  "tq2",
                                                      "tq3",  "tq4",  "tq1j", "tq2j", "tq3j", "tq4j",
                                                      "q8_0r", "q4_0r", "tq5",  "tq6",  "tq8",  "q4_1",
                                                      "q5_0",  "q5_1",  "q4_1r", "q5_0r", "q5_1r"};
    for (int t = 0; t < KVQ_TYPE_COUNT; t++) {
        const struct kvq_type_traits *tr = kvq_type_traits((enum kvq_type)t);
        CHECK(tr != NULL);
        if (!tr)
            continue;
        CHECK((int)tr->type == t);
        CHECKF(strcmp(tr->name, names[t]) == 0, "type %d is '%s'", t, tr->name);
        CHECK(tr->summary && *tr->summary);
        CHECK(tr->encode && tr->decode && tr->score && tr->encode_ref && tr->decode_ref && tr->score_ref);
        enum kvq_type back;
        CHECK_OK(kvq_type_from_name(names[t], &back));
        CHECK((int)back == t);
        int wide = t >= KVQ_TYPE_TQ5 && t <= KVQ_TYPE_TQ8;
        int tq = (t >= KVQ_TYPE_TQ1 && t <= KVQ_TYPE_TQ4J) || wide, rotbase = rot_base(t) != t;
        CHECK(tr->rotated == tq);
        CHECK(tr->qjl == (t >= KVQ_TYPE_TQ1J && t <= KVQ_TYPE_TQ4J));
        CHECK((int)tr->base == rot_base(t));
        if (rotbase) { /* the base's bytes, so the bit budget compares like for like */
            CHECK(kvq_type_row_bytes((enum kvq_type)t, 128) == kvq_type_row_bytes(tr->base, 128));
            CHECK(tr->block_bytes == kvq_type_traits(tr->base)->block_bytes);
            CHECK(tr->bits == kvq_type_traits(tr->base)->bits);
        }
        if (is_block_type(t))
            CHECK(tr->block_values == 32 && (size_t)tr->block_bytes * 4 == kvq_type_row_bytes((enum kvq_type)t, 128));
        if (wide)
            CHECK(tr->bits == (t == KVQ_TYPE_TQ5 ? 5 : t == KVQ_TYPE_TQ6 ? 6 : 8));
        else if (tq) {
            CHECK(tr->bits == (t - KVQ_TYPE_TQ1) % 4 + 1);
            CHECK(tr->block_values == 0 && tr->block_bytes == 0);
        }
    }
    CHECK(kvq_type_traits(KVQ_TYPE_COUNT) == NULL);
    CHECK(kvq_type_traits((enum kvq_type)-1) == NULL);
    enum kvq_type t = KVQ_TYPE_F32;
    CHECK_STATUS(kvq_type_from_name("tq7", &t), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_type_from_name("TQ3", &t), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_type_from_name(NULL, &t), KVQ_ERR_INVALID_ARG);
    CHECK(t == KVQ_TYPE_F32);
    CHECK(kvq_type_traits(KVQ_TYPE_Q8_0)->block_bytes == 34 && kvq_type_traits(KVQ_TYPE_Q4_0)->block_bytes == 18);
    CHECK(kvq_type_traits(KVQ_TYPE_Q4_1)->block_bytes == 20 && kvq_type_traits(KVQ_TYPE_Q5_0)->block_bytes == 22 &&
          kvq_type_traits(KVQ_TYPE_Q5_1)->block_bytes == 24);
}

/* Bytes from first principles: f16 norms, B bits per code, 1 bit per sign. */
static size_t expected_bytes(int t, int d)
{
    t = rot_base(t); /* rotated: the base's bytes */
    switch (t) {
    case KVQ_TYPE_F32: return 4u * (size_t)d;
    case KVQ_TYPE_F16: return 2u * (size_t)d;
    case KVQ_TYPE_Q8_0: return (size_t)d / 32 * (2 + 32);
    case KVQ_TYPE_Q4_0: return (size_t)d / 32 * (2 + 16);
    case KVQ_TYPE_Q4_1: return (size_t)d / 32 * (2 + 2 + 16);     /* d, m, nibbles */
    case KVQ_TYPE_Q5_0: return (size_t)d / 32 * (2 + 4 + 16);     /* d, fifth bits, nibbles */
    case KVQ_TYPE_Q5_1: return (size_t)d / 32 * (2 + 2 + 4 + 16); /* d, m, fifth bits, nibbles */
    default: break;
    }
    int b = t == KVQ_TYPE_TQ5 ? 5 : t == KVQ_TYPE_TQ6 ? 6 : t == KVQ_TYPE_TQ8 ? 8 : (t - KVQ_TYPE_TQ1) % 4 + 1;
    int qjl = t >= KVQ_TYPE_TQ1J && t <= KVQ_TYPE_TQ4J;
    return (size_t)(16 * (1 + qjl) + d * b + qjl * d) / 8;
}

static void test_row_bytes(void)
{
    CHECK(kvq_type_row_bytes(KVQ_TYPE_TQ3J, 128) == 68);
    CHECK(kvq_type_row_bytes(KVQ_TYPE_TQ3, 128) == 50);
    CHECK(kvq_type_row_bytes(KVQ_TYPE_F16, 128) == 256);
    CHECK_NEAR(kvq_type_bits_per_value(KVQ_TYPE_TQ3J, 128), 4.25, 0);
    CHECK_NEAR(kvq_type_bits_per_value(KVQ_TYPE_TQ3, 128), 3.125, 0);
    CHECK_NEAR(kvq_type_bits_per_value(KVQ_TYPE_Q8_0, 128), 8.5, 0);
    CHECK_NEAR(kvq_type_bits_per_value(KVQ_TYPE_Q4_1, 128), 5.0, 0);
    CHECK_NEAR(kvq_type_bits_per_value(KVQ_TYPE_Q5_0R, 128), 5.5, 0);
    CHECK_NEAR(kvq_type_bits_per_value(KVQ_TYPE_Q5_1, 64), 6.0, 0);
    CHECK(kvq_type_row_bytes(KVQ_DEFAULT_TYPE_K, 128) + kvq_type_row_bytes(KVQ_DEFAULT_TYPE_V, 128) == 118);
    for (int t = 0; t < KVQ_TYPE_COUNT; t++) {
        for (int d = 0; d <= KVQ_MAX_DIM + 40; d += 4) {
            int block = is_block_type(t) ? 32 : t >= KVQ_TYPE_TQ1 ? 8 : 1;
            int ok = d >= 8 && d <= KVQ_MAX_DIM && d % block == 0;
            kvq_status st = kvq_type_check_dim((enum kvq_type)t, d);
            CHECKF(st == (ok ? KVQ_OK : KVQ_ERR_UNSUPPORTED), "type %d d=%d: %s", t, d, kvq_status_str(st));
            size_t bytes = kvq_type_row_bytes((enum kvq_type)t, d);
            CHECKF(bytes == (ok ? expected_bytes(t, d) : 0), "type %d d=%d: %zu bytes", t, d, bytes);
            double bpv = kvq_type_bits_per_value((enum kvq_type)t, d);
            CHECK(ok ? fabs(bpv - 8.0 * (double)bytes / d) < 1e-12 : bpv == 0.0);
        }
    }
    CHECK_STATUS(kvq_type_check_dim(KVQ_TYPE_COUNT, 128), KVQ_ERR_INVALID_ARG);
    CHECK(kvq_type_row_bytes(KVQ_TYPE_COUNT, 128) == 0);
}

static void test_create_errors(void)
{
    kvq_codec *c = (kvq_codec *)(uintptr_t)1; /* must stay untouched on error */
    struct kvq_codec_config cfg;
    kvq_codec_config_default(&cfg, KVQ_TYPE_TQ3J, 128);
    CHECK(cfg.seed == 0 && cfg.rot == KVQ_ROT_HADAMARD && cfg.qjl == KVQ_QJL_ORTHO);
    CHECK_STATUS(kvq_codec_create(NULL, &c), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_codec_create(&cfg, NULL), KVQ_ERR_INVALID_ARG);
    static const int bad_tq[] = {0, 4, 12, 66, 1032, 4096, -8};
    for (size_t i = 0; i < sizeof bad_tq / sizeof bad_tq[0]; i++) {
        cfg.dim = bad_tq[i];
        CHECK_STATUS(kvq_codec_create(&cfg, &c), KVQ_ERR_UNSUPPORTED);
    }
    kvq_codec_config_default(&cfg, KVQ_TYPE_Q8_0, 80);
    CHECK_STATUS(kvq_codec_create(&cfg, &c), KVQ_ERR_UNSUPPORTED);
    kvq_codec_config_default(&cfg, KVQ_TYPE_Q4_0, 48);
    CHECK_STATUS(kvq_codec_create(&cfg, &c), KVQ_ERR_UNSUPPORTED);
    kvq_codec_config_default(&cfg, (enum kvq_type)99, 128);
    CHECK_STATUS(kvq_codec_create(&cfg, &c), KVQ_ERR_INVALID_ARG);
    kvq_codec_config_default(&cfg, KVQ_TYPE_TQ3, 128);
    cfg.rot = KVQ_ROT_GAUSS; /* not orthogonal: cannot be R */
    CHECK_STATUS(kvq_codec_create(&cfg, &c), KVQ_ERR_INVALID_ARG);
    cfg.rot = (enum kvq_rot_kind)17;
    CHECK_STATUS(kvq_codec_create(&cfg, &c), KVQ_ERR_INVALID_ARG);
    kvq_codec_config_default(&cfg, KVQ_TYPE_TQ3J, 128);
    cfg.qjl = (enum kvq_qjl_kind)5;
    CHECK_STATUS(kvq_codec_create(&cfg, &c), KVQ_ERR_INVALID_ARG);
    CHECK(c == (kvq_codec *)(uintptr_t)1);
    kvq_codec_free(NULL);
}

static void test_codec_accessors(void)
{
    kvq_codec *c = make(KVQ_TYPE_TQ3J, 128);
    if (!c)
        return;
    CHECK(kvq_codec_row_bytes(c) == 68);
    CHECK(kvq_codec_traits(c) == kvq_type_traits(KVQ_TYPE_TQ3J));
    CHECK(kvq_codec_config_of(c)->dim == 128);
    CHECK(kvq_codec_query_floats(c) == 256);
    uint8_t row[68];
    struct kvq_row r = kvq_codec_packed_row(c, row);
    CHECK((uint8_t *)r.norm == row && (uint8_t *)r.rnorm == row + 2 && r.codes == row + 4 && r.signs == row + 52);
    /* kappa = 1 / (d E|v_1|), E|v_1| = Gamma(64) / (sqrt(pi) Gamma(64.5)) at
     * d = 128, here as an exact product (no lgamma):
     * Gamma(64) / Gamma(64.5) = prod_{k=1}^{63} k / (k + 1/2) * Gamma(1) / Gamma(3/2). */
    double e = 1.0;
    for (int k = 1; k <= 63; k++)
        e *= (double)k / (k + 0.5);
    e *= 1.0 / (0.5 * sqrt(M_PI)) / sqrt(M_PI);
    CHECK_NEAR(kvq_codec_qjl_kappa(c), 1.0 / (128.0 * e), 1e-12);
    /* ... and sits below its large-d limit sqrt(pi/(2d)) by the factor 1 - 1/(4d) + O(1/d^2). */
    CHECK(fabs(kvq_codec_qjl_kappa(c) / sqrt(M_PI / 256.0) - (1.0 - 1.0 / 512)) < 1.0 / (128.0 * 128.0));
    kvq_codec_free(c);

    struct kvq_codec_config cfg;
    kvq_codec_config_default(&cfg, KVQ_TYPE_TQ2J, 96);
    cfg.qjl = KVQ_QJL_GAUSS;
    CHECK_OK(kvq_codec_create(&cfg, &c));
    CHECK_NEAR(kvq_codec_qjl_kappa(c), sqrt(M_PI / 2) / 96, 1e-15);
    kvq_codec_free(c);

    c = make(KVQ_TYPE_TQ4, 64);
    if (!c)
        return;
    CHECK(kvq_codec_qjl_kappa(c) == 0.0);
    r = kvq_codec_packed_row(c, row);
    CHECK((uint8_t *)r.norm == row && r.rnorm == NULL && r.codes == row + 2 && r.signs == NULL);
    kvq_codec_free(c);

    c = make(KVQ_TYPE_Q8_0, 64);
    if (!c)
        return;
    r = kvq_codec_packed_row(c, row);
    CHECK(r.norm == NULL && r.codes == row && kvq_codec_query_floats(c) == 64);
    kvq_codec_free(c);
}

static kvq_block_q8_0 encode_q8(const float *x32)
{
    kvq_block_q8_0 b;
    memset(&b, 0, sizeof b);
    kvq_codec *c = make(KVQ_TYPE_Q8_0, 32);
    if (c) {
        CHECK_OK(kvq_codec_encode(c, x32, 1, &b));
        kvq_codec_free(c);
    }
    return b;
}

/* Hand-computed llama.cpp results: d = max|x| / 127, q = roundf(x / d),
 * halves rounded away from zero. */
static void test_q8_0_semantics(void)
{
    float x[32] = {0};
    x[0] = 127.0f; /* d = 1 exactly */
    x[1] = 2.5f;
    x[2] = -2.5f;
    x[3] = 0.5f;
    x[4] = -0.5f;
    x[5] = 1.49f;
    x[6] = -126.6f;
    kvq_block_q8_0 b = encode_q8(x);
    CHECK(b.d == 0x3c00); /* f16 1.0 */
    static const int8_t want[7] = {127, 3, -3, 1, -1, 1, -127};
    for (int j = 0; j < 7; j++)
        CHECKF(b.qs[j] == want[j], "qs[%d] = %d, want %d", j, b.qs[j], want[j]);
    for (int j = 7; j < 32; j++)
        CHECK(b.qs[j] == 0);

    for (int j = 0; j < 32; j++)
        x[j] = (float)(j - 16); /* amax 16: id = 127/16 = 7.9375 */
    b = encode_q8(x);
    CHECK(b.qs[0] == -127 && b.qs[16] == 0 && b.qs[17] == 8 && b.qs[18] == 16 && b.qs[19] == 24 &&
          b.qs[31] == 119);
    CHECK(b.d == kvq_f32_to_f16(16.0f / 127.0f));
    CHECK(b.d == 0x3008); /* 0.12598 rounds to 0x3008 = 0.125977 */

    memset(x, 0, sizeof x);
    b = encode_q8(x);
    CHECK(b.d == 0);
    for (int j = 0; j < 32; j++)
        CHECK(b.qs[j] == 0);
}

static kvq_block_q4_0 encode_q4(const float *x32)
{
    kvq_block_q4_0 b;
    memset(&b, 0, sizeof b);
    kvq_codec *c = make(KVQ_TYPE_Q4_0, 32);
    if (c) {
        CHECK_OK(kvq_codec_encode(c, x32, 1, &b));
        kvq_codec_free(c);
    }
    return b;
}

/* llama.cpp q4_0: d = (the value with the largest |x|) / -8, q = min(15,
 * (int8)(x/d + 8.5)), low nibbles hold x[0..15], high nibbles x[16..31]. */
static void test_q4_0_semantics(void)
{
    float x[32] = {0};
    x[0] = -8.0f; /* max |x| is negative: d = 1 */
    x[1] = 7.0f;
    x[2] = 7.4f;
    x[3] = -0.6f;
    x[4] = 0.49f;
    x[5] = 0.5f;
    x[16] = 3.0f;
    x[17] = -7.5f;
    kvq_block_q4_0 b = encode_q4(x);
    CHECK(b.d == 0x3c00);
    int q[32];
    for (int j = 0; j < 16; j++) {
        q[j] = b.qs[j] & 15;
        q[j + 16] = b.qs[j] >> 4;
    }
    static const int want[6] = {0, 15, 15, 7, 8, 9};
    for (int j = 0; j < 6; j++)
        CHECKF(q[j] == want[j], "q[%d] = %d, want %d", j, q[j], want[j]);
    CHECK(q[6] == 8 && q[16] == 11 && q[17] == 1);

    memset(x, 0, sizeof x);
    x[0] = 8.0f; /* positive max: d = -1, and -8 is clamped to q = 15 -> -7 */
    x[1] = -8.0f;
    x[2] = 4.0f;
    b = encode_q4(x);
    CHECK(b.d == 0xbc00); /* f16 -1.0 */
    CHECK((b.qs[0] & 15) == 0 && (b.qs[1] & 15) == 15 && (b.qs[2] & 15) == 4);
    kvq_codec *c = make(KVQ_TYPE_Q4_0, 32);
    if (!c)
        return;
    float y[32];
    CHECK_OK(kvq_codec_decode(c, &b, 1, y));
    CHECK(y[0] == 8.0f && y[1] == -7.0f && y[2] == 4.0f && y[3] == 0.0f);
    kvq_codec_free(c);
}

/* Encodes one block of 32 values with type t into out (block_bytes). */
static void encode_block(enum kvq_type t, const float *x32, void *out, size_t bytes)
{
    memset(out, 0, bytes);
    kvq_codec *c = make(t, 32);
    if (c) {
        CHECK(kvq_codec_row_bytes(c) == bytes);
        CHECK_OK(kvq_codec_encode(c, x32, 1, out));
        kvq_codec_free(c);
    }
}

/* The decode of one block of type t, against want[32]. */
static void check_decode(enum kvq_type t, const void *blk, const float *want)
{
    kvq_codec *c = make(t, 32);
    if (!c)
        return;
    float y[32];
    CHECK_OK(kvq_codec_decode(c, blk, 1, y));
    for (int j = 0; j < 32; j++)
        CHECKF(y[j] == want[j], "%s y[%d] = %g, want %g", kvq_type_traits(t)->name, j, y[j], want[j]);
    kvq_codec_free(c);
}

/* llama.cpp's q4_1 (quantize_row_q4_1_ref): d = (max - min) / 15, m = min,
 * q = min(15, (int8)((x - min) / d + 0.5)); x[j] in the low nibble of
 * qs[j], x[j + 16] in the high one; decode q d + m. On the ramp x_j = j - 8:
 * min -8 (f16 0xc800), d = 31/15 -> f16 2.06640625 = 0x4022 (2 + 34/512),
 * q_j = floor(15 j / 31 + 1/2) = (30 j + 31) / 62 in integers (no tie: the
 * fractions are multiples of 1/31). */
static void test_q4_1_semantics(void)
{
    float x[32], want[32];
    for (int j = 0; j < 32; j++)
        x[j] = (float)j - 8.0f;
    kvq_block_q4_1 b;
    encode_block(KVQ_TYPE_Q4_1, x, &b, sizeof b);
    CHECK(b.d == 0x4022 && b.m == 0xc800);
    for (int j = 0; j < 16; j++) {
        const int lo = (30 * j + 31) / 62, hi = (30 * (j + 16) + 31) / 62;
        CHECKF(b.qs[j] == (lo | hi << 4), "qs[%d] = %#x, want %#x", j, b.qs[j], lo | hi << 4);
    }
    CHECK(b.qs[0] == 0x80 && b.qs[1] == 0x80 && b.qs[2] == 0x91 && b.qs[15] == 0xf7);
    for (int j = 0; j < 32; j++)
        want[j] = (float)((30 * j + 31) / 62) * 2.06640625f + -8.0f;
    check_decode(KVQ_TYPE_Q4_1, &b, want);

    for (int j = 0; j < 32; j++) /* a constant block: d = 0, every q = 0, decodes to m */
        x[j] = 3.0f;
    encode_block(KVQ_TYPE_Q4_1, x, &b, sizeof b);
    CHECK(b.d == 0 && b.m == 0x4200);
    for (int j = 0; j < 16; j++)
        CHECK(b.qs[j] == 0);
}

/* llama.cpp's q5_0 (quantize_row_q5_0_ref): d = (the value of max |x|, the
 * first one on ties) / -16, q = min(31, (int8)(x / d + 16.5)); nibbles as
 * q4_0, bit 4 of q_j in bit j of the little-endian u32 qh; decode (q - 16) d. */
static void test_q5_0_semantics(void)
{
    float x[32], want[32];
    for (int j = 0; j < 32; j++) /* max |x| is x_0 = -8: d = 0.5, q_j = j exactly */
        x[j] = ((float)j - 16.0f) * 0.5f;
    kvq_block_q5_0 b;
    encode_block(KVQ_TYPE_Q5_0, x, &b, sizeof b);
    CHECK(b.d == 0x3800);
    for (int j = 0; j < 16; j++) /* q_j = j, q_{j+16} = j + 16: both nibbles j */
        CHECKF(b.qs[j] == 0x11 * j, "qs[%d] = %#x", j, b.qs[j]);
    CHECK(b.qh[0] == 0 && b.qh[1] == 0 && b.qh[2] == 0xff && b.qh[3] == 0xff);
    check_decode(KVQ_TYPE_Q5_0, &b, x);

    memset(x, 0, sizeof x); /* a positive max: d = -1; -16 -> 32.5 is clamped to 31 */
    x[0] = 16.0f;
    x[1] = -16.0f;
    x[2] = 5.0f;
    x[3] = -3.0f;
    encode_block(KVQ_TYPE_Q5_0, x, &b, sizeof b);
    CHECK(b.d == 0xbc00);
    /* q = {0, 31, 11, 19, 16, 16, ...}: low nibbles {0, 15, 11, 3, 0...}, the
     * high nibbles (x_16.. = 0 -> 16) 0; fifth bits everywhere but j = 0, 2 */
    static const uint8_t want_qs[4] = {0x00, 0x0f, 0x0b, 0x03};
    for (int j = 0; j < 16; j++)
        CHECKF(b.qs[j] == (j < 4 ? want_qs[j] : 0), "qs[%d] = %#x", j, b.qs[j]);
    CHECK(b.qh[0] == 0xfa && b.qh[1] == 0xff && b.qh[2] == 0xff && b.qh[3] == 0xff);
    memset(want, 0, sizeof want);
    want[0] = 16.0f;
    want[1] = -15.0f;
    want[2] = 5.0f;
    want[3] = -3.0f;
    check_decode(KVQ_TYPE_Q5_0, &b, want);
}

/* llama.cpp's q5_1 (quantize_row_q5_1_ref): d = (max - min) / 31, m = min,
 * q = (uint8)((x - min) / d + 0.5) (no clamp), packed as q5_0; decode
 * q d + m. On x_j = j^2: d = 961/31 = 31 (f16 0x4fc0), m = 0, q_j =
 * floor(j^2 / 31 + 1/2) = (2 j^2 + 31) / 62 (no tie: 31 is prime). */
static void test_q5_1_semantics(void)
{
    float x[32], want[32];
    int q[32];
    for (int j = 0; j < 32; j++) {
        x[j] = (float)(j * j);
        q[j] = (2 * j * j + 31) / 62;
        want[j] = (float)q[j] * 31.0f;
    }
    kvq_block_q5_1 b;
    encode_block(KVQ_TYPE_Q5_1, x, &b, sizeof b);
    CHECK(b.d == 0x4fc0 && b.m == 0);
    uint32_t qh = 0;
    for (int j = 0; j < 32; j++)
        qh |= (uint32_t)(q[j] >> 4) << j;
    for (int j = 0; j < 16; j++)
        CHECKF(b.qs[j] == ((q[j] & 15) | (q[j + 16] & 15) << 4), "qs[%d] = %#x", j, b.qs[j]);
    CHECK(b.qh[0] == (qh & 0xff) && b.qh[1] == (qh >> 8 & 0xff) && b.qh[2] == (qh >> 16 & 0xff) &&
          b.qh[3] == qh >> 24);
    CHECK(qh == 0xffc00000u); /* q_j >= 16 from j = 22: 484 / 31 = 15.6 rounds to 16 */
    check_decode(KVQ_TYPE_Q5_1, &b, want);

    for (int j = 0; j < 32; j++) /* min 1, d = 7.75 / 31 = 0.25, q_j = j: exact round trip */
        x[j] = (float)j * 0.25f + 1.0f;
    encode_block(KVQ_TYPE_Q5_1, x, &b, sizeof b);
    CHECK(b.d == 0x3400 && b.m == 0x3c00);
    for (int j = 0; j < 16; j++)
        CHECK(b.qs[j] == 0x11 * j);
    CHECK(b.qh[0] == 0 && b.qh[1] == 0 && b.qh[2] == 0xff && b.qh[3] == 0xff);
    check_decode(KVQ_TYPE_Q5_1, &b, x);
}

static void test_f16_semantics(void)
{
    kvq_codec *c = make(KVQ_TYPE_F16, 8);
    if (!c)
        return;
    float x[8] = {1.0f, -2.0f, 65504.0f, 1.0f + 0x1p-11f, 1.0f + 0x1.8p-10f, 0x1p-24f, -0.0f, 0.1f};
    uint16_t h[8];
    CHECK_OK(kvq_codec_encode(c, x, 1, h));
    static const uint16_t want[8] = {0x3c00, 0xc000, 0x7bff, 0x3c00, 0x3c02, 0x0001, 0x8000, 0x2e66};
    for (int j = 0; j < 8; j++)
        CHECKF(h[j] == want[j], "h[%d] = %#x, want %#x", j, h[j], want[j]);
    kvq_codec_free(c);
}

/* Random data: per-element error bounds that follow from each format. */
static void test_baseline_round_trip(void)
{
    const int d = 128;
    kvq_rng rng;
    kvq_rng_init(&rng, 11);
    kvq_codec *c8 = make(KVQ_TYPE_Q8_0, d), *c4 = make(KVQ_TYPE_Q4_0, d), *c16 = make(KVQ_TYPE_F16, d),
              *c32 = make(KVQ_TYPE_F32, d);
    if (!c8 || !c4 || !c16 || !c32)
        goto out;
    for (int it = 0; it < 2000; it++) {
        float x[128], y[128];
        double scale = exp(kvq_rng_uniform(&rng) * 12.0 - 6.0);
        for (int j = 0; j < d; j++)
            x[j] = (float)(kvq_rng_gauss(&rng) * scale);
        uint8_t row[512];

        CHECK_OK(kvq_codec_encode(c8, x, 1, row));
        CHECK_OK(kvq_codec_decode(c8, row, 1, y));
        for (int b = 0; b < d / 32; b++) {
            double amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fmax(amax, fabs(x[b * 32 + j]));
            double dd = amax / 127, d16 = kvq_f16_to_f32(kvq_f32_to_f16((float)dd));
            double bound = 0.5 * dd * (1 + 1e-6) + 127 * fabs(dd - d16) + 1e-7 * amax;
            for (int j = 0; j < 32; j++)
                CHECKF(fabs(y[b * 32 + j] - x[b * 32 + j]) <= bound, "q8_0 err %g > %g",
                       fabs(y[b * 32 + j] - x[b * 32 + j]), bound);
        }

        CHECK_OK(kvq_codec_encode(c4, x, 1, row));
        CHECK_OK(kvq_codec_decode(c4, row, 1, y));
        for (int b = 0; b < d / 32; b++) {
            double amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fmax(amax, fabs(x[b * 32 + j]));
            double dd = amax / 8, d16 = fabs(kvq_f16_to_f32(kvq_f32_to_f16((float)dd)));
            for (int j = 0; j < 32; j++) {
                double v = fabs(x[b * 32 + j]) / dd; /* |x / d| <= 8 */
                /* floor(x/d + 8.5) is round-half-up: error d/2, except the
                 * clamp at q = 15 (x/d in (7.5, 8]), error up to d. */
                double bound = (v <= 7.5 ? 0.5 : 1.0) * dd * (1 + 1e-6) + 8 * fabs(dd - d16) + 1e-7 * amax;
                CHECKF(fabs(y[b * 32 + j] - x[b * 32 + j]) <= bound, "q4_0 err %g > %g",
                       fabs(y[b * 32 + j] - x[b * 32 + j]), bound);
            }
        }

        CHECK_OK(kvq_codec_encode(c16, x, 1, row));
        CHECK_OK(kvq_codec_decode(c16, row, 1, y));
        for (int j = 0; j < d; j++) /* RNE: half an ulp of 11 significant bits, or of the subnormal step */
            CHECK(fabs(y[j] - x[j]) <= fmax(fabs(x[j]) * 0x1p-11, 0x1p-25));

        CHECK_OK(kvq_codec_encode(c32, x, 1, row));
        CHECK_OK(kvq_codec_decode(c32, row, 1, y));
        CHECK(memcmp(x, y, sizeof x) == 0);
    }
out:
    kvq_codec_free(c8);
    kvq_codec_free(c4);
    kvq_codec_free(c16);
    kvq_codec_free(c32);
}

/* score(q, row) = <q, decode(row)>; prepare_query copies for the plain
 * baselines and rotates (same norm, other coordinates) for q8_0r/q4_0r. */
static void test_baseline_score(void)
{
    const int d = 64;
    static const enum kvq_type types[] = {KVQ_TYPE_F32,  KVQ_TYPE_F16,  KVQ_TYPE_Q8_0,  KVQ_TYPE_Q4_0,
                                          KVQ_TYPE_Q8_0R, KVQ_TYPE_Q4_0R, KVQ_TYPE_Q4_1,  KVQ_TYPE_Q5_0,
                                          KVQ_TYPE_Q5_1, KVQ_TYPE_Q4_1R, KVQ_TYPE_Q5_0R, KVQ_TYPE_Q5_1R};
    kvq_rng rng;
    kvq_rng_init(&rng, 12);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const enum kvq_type t = types[ti];
        const int rotated = rot_base((int)t) != (int)t;
        kvq_codec *c = make(t, d);
        if (!c)
            continue;
        for (int it = 0; it < 200; it++) {
            float x[64], q[64], qp[64], y[64];
            uint8_t row[256];
            for (int j = 0; j < d; j++) {
                x[j] = (float)kvq_rng_gauss(&rng);
                q[j] = (float)kvq_rng_gauss(&rng);
            }
            CHECK_OK(kvq_codec_encode(c, x, 1, row));
            CHECK_OK(kvq_codec_decode(c, row, 1, y));
            CHECK_OK(kvq_codec_prepare_query(c, q, qp));
            double dot = 0, nq = 0, ny = 0, nqp = 0;
            for (int j = 0; j < d; j++) {
                dot += (double)q[j] * y[j];
                nq += (double)q[j] * q[j];
                ny += (double)y[j] * y[j];
                nqp += (double)qp[j] * qp[j];
            }
            if (rotated) {
                CHECK(memcmp(q, qp, sizeof q) != 0);
                CHECK_NEAR(nqp, nq, 1e-5 * nq);
            } else {
                CHECK(memcmp(q, qp, sizeof q) == 0);
            }
            struct kvq_row r = kvq_codec_packed_row(c, row);
            CHECK_NEAR(kvq_codec_score(c, qp, &r), dot, 1e-5 * sqrt(nq * ny));
        }
        kvq_codec_free(c);
    }
}

/* What the rotation is for: a channel outlier sets one block's scale in
 * q4_0 and flattens the other values of that block to few levels; R spreads
 * it over every block. Rows like a key with one massive channel (as RoPE'd
 * keys have) must come back with several times less squared error. */
static void test_rotated_baseline_outliers(void)
{
    const int d = 128;
    kvq_codec *plain = make(KVQ_TYPE_Q4_0, d), *rot = make(KVQ_TYPE_Q4_0R, d);
    kvq_rng rng;
    kvq_rng_init(&rng, 77);
    double err[2] = {0, 0};
    for (int it = 0; it < 200 && plain && rot; it++) {
        float x[128], y[128];
        uint8_t row[128];
        for (int j = 0; j < d; j++)
            x[j] = (float)kvq_rng_gauss(&rng);
        x[it % d] = 40.0f; /* one outlier channel */
        for (int k = 0; k < 2; k++) {
            kvq_codec *c = k ? rot : plain;
            CHECK_OK(kvq_codec_encode(c, x, 1, row));
            CHECK_OK(kvq_codec_decode(c, row, 1, y));
            for (int j = 0; j < d; j++)
                err[k] += ((double)x[j] - y[j]) * ((double)x[j] - y[j]);
        }
    }
    CHECKF(err[1] < 0.5 * err[0], "q4_0r squared error %.4g vs q4_0 %.4g", err[1], err[0]);
    kvq_codec_free(plain);
    kvq_codec_free(rot);
}

/* NaN/Inf -> NONFINITE, overflow -> RANGE, and nothing written: for every type. */
static void test_bad_input_all_types(void)
{
    /* d = 12: f32/f16 rows with a tail after the last 8-wide vector, where the bad values sit */
    for (int pass = 0; pass < 2; pass++)
    for (int t = 0; t < (pass ? KVQ_TYPE_Q8_0 : KVQ_TYPE_COUNT); t++) {
        const int d = pass ? 12 : 64;
        kvq_codec *c = make((enum kvq_type)t, d);
        if (!c)
            continue;
        float x[4 * 64];
        for (int j = 0; j < 4 * d; j++)
            x[j] = (float)((j * 37) % 11) - 5.0f;
        uint8_t rows[4 * 256], ref[4 * 256];
        const float bad[3] = {NAN, INFINITY, -INFINITY};
        for (int k = 0; k < 3; k++) {
            memset(rows, 0xab, sizeof rows);
            memcpy(ref, rows, sizeof ref);
            float keep = x[4 * d - 1];
            x[4 * d - 1] = bad[k]; /* the last row is bad: the first three must not be written either */
            CHECK_STATUS(kvq_codec_encode(c, x, 4, rows), KVQ_ERR_NONFINITE);
            CHECK_STATUS(kvq_codec_encode_ref(c, x, 4, rows), KVQ_ERR_NONFINITE);
            CHECK_STATUS(kvq_type_traits((enum kvq_type)t)->encode(c, x + 3 * d, &(struct kvq_row){
                (uint16_t *)(void *)rows, (uint16_t *)(void *)(rows + 2), rows + 4, rows + 200}),
                KVQ_ERR_NONFINITE);
            CHECK(memcmp(rows, ref, sizeof rows) == 0);
            float qp[128];
            memset(qp, 0, sizeof qp);
            CHECK_STATUS(kvq_codec_prepare_query(c, x + 3 * d, qp), KVQ_ERR_NONFINITE);
            x[4 * d - 1] = keep;
        }
        /* Values whose f16 (tq: the norm; f16: the value; q8_0/q4_0: the
         * scale) would be Inf. f32 holds anything finite. */
        float keep = x[3 * d - 1];
        x[3 * d - 1] = 3.0e38f;
        memset(rows, 0xab, sizeof rows);
        memcpy(ref, rows, sizeof ref);
        CHECK_STATUS(kvq_codec_encode(c, x, 4, rows), t == KVQ_TYPE_F32 ? KVQ_OK : KVQ_ERR_RANGE);
        if (t != KVQ_TYPE_F32)
            CHECK(memcmp(rows, ref, sizeof rows) == 0);
        x[3 * d - 1] = keep;
        CHECK_STATUS(kvq_codec_encode(NULL, x, 1, rows), KVQ_ERR_INVALID_ARG);
        CHECK_STATUS(kvq_codec_encode(c, NULL, 1, rows), KVQ_ERR_INVALID_ARG);
        CHECK_STATUS(kvq_codec_decode(c, NULL, 1, x), KVQ_ERR_INVALID_ARG);
        CHECK_OK(kvq_codec_encode(c, x, 0, rows));
        kvq_codec_free(c);
    }
    /* Exact f16 edges: 65519 rounds to 65504 (fine), 65520 rounds to Inf. */
    kvq_codec *c = make(KVQ_TYPE_F16, 8);
    if (c) {
        float x[8] = {65519.0f, 0, 0, 0, 0, 0, 0, 0};
        uint16_t h[8];
        CHECK_OK(kvq_codec_encode(c, x, 1, h));
        CHECK(h[0] == 0x7bff);
        x[0] = -65520.0f;
        CHECK_STATUS(kvq_codec_encode(c, x, 1, h), KVQ_ERR_RANGE);
        kvq_codec_free(c);
    }
}

int cmd_types(int argc, char **argv);

/* Runs `kvq types ARGS` with stdout captured into buf. @return its exit status. */
static int run_types(char **argv, int argc, char *buf, size_t cap)
{
    return test_run_captured_buf(cmd_types, argc, argv, buf, cap, NULL, 0);
}

static void test_cmd_types(void)
{
    static char buf[1 << 16];
    char *a1[] = {"types", "--dim", "80", "--json"};
    CHECK(run_types(a1, 4, buf, sizeof buf) == 0);
    cJSON *root = cJSON_Parse(buf);
    CHECK(root != NULL);
    if (root) {
        CHECK(cJSON_GetObjectItem(root, "dim")->valueint == 80);
        cJSON *types = cJSON_GetObjectItem(root, "types");
        CHECK(cJSON_GetArraySize(types) == KVQ_TYPE_COUNT);
        for (int t = 0; t < cJSON_GetArraySize(types); t++) {
            cJSON *o = cJSON_GetArrayItem(types, t);
            const char *name = cJSON_GetObjectItem(o, "name")->valuestring;
            int supported = cJSON_IsTrue(cJSON_GetObjectItem(o, "supported"));
            CHECK(strcmp(name, kvq_type_traits((enum kvq_type)t)->name) == 0);
            CHECK(supported == (kvq_type_check_dim((enum kvq_type)t, 80) == KVQ_OK));
            if (supported)
                CHECK(cJSON_GetObjectItem(o, "row_bytes")->valuedouble == (double)expected_bytes(t, 80));
            else
                CHECK(cJSON_GetObjectItem(o, "note") != NULL);
        }
        cJSON *pair = cJSON_GetObjectItem(root, "default_pair");
        CHECK(cJSON_GetObjectItem(pair, "kv_bytes")->valuedouble == 44 + 32);
        cJSON_Delete(root);
    }
    char *a2[] = {"types"};
    CHECK(run_types(a2, 1, buf, sizeof buf) == 0);
    CHECK(strstr(buf, "tq3j") && strstr(buf, "118 bytes per token-head"));
    char *a3[] = {"types", "--dim"};
    CHECK(run_types(a3, 2, buf, sizeof buf) == 2);
    char *a4[] = {"types", "--bogus"};
    CHECK(run_types(a4, 2, buf, sizeof buf) == 2);
}

int main(void)
{
    RUN(test_traits_table);
    RUN(test_row_bytes);
    RUN(test_create_errors);
    RUN(test_codec_accessors);
    RUN(test_q8_0_semantics);
    RUN(test_q4_0_semantics);
    RUN(test_q4_1_semantics);
    RUN(test_q5_0_semantics);
    RUN(test_q5_1_semantics);
    RUN(test_f16_semantics);
    RUN(test_baseline_round_trip);
    RUN(test_baseline_score);
    RUN(test_rotated_baseline_outliers);
    RUN(test_bad_input_all_types);
    RUN(test_cmd_types);
    return TEST_END("test_codec_types");
}
