/* test_backend_ops.c - every backend against the scalar reference, from one
 * table: op x cache type x backend, one tolerance table, a case filter and a
 * perf mode (in the spirit of ggml's test-backend-ops).
 *
 * A case is (op, type, shape); it runs the op's reference once and then each
 * backend that implements the op for that case, and compares the backend's
 * result with the reference in the op's error measure (OPS[].measure). The
 * case passes when the error is at most TOL[op][class of the type]. A
 * backend this process cannot run (no AVX2, no AVX-512, no GPU) skips its
 * cases; a backend that does not implement an op has no case for it. Cases
 * of a known library bug (known_bug()) run and count as skipped while they
 * fail, as failed once they pass.
 *
 *   ref     the reference of each op: the codecs' _ref functions,
 *           kvq_rotation_apply_ref, kvq_attn_decode_ref (dequantize with
 *           decode_ref, attend in double)
 *   scalar  the scalar kernel table of CPU attention (kvq_attn_kernels_scalar);
 *           for encode/decode/score/rot the scalar path is the reference itself
 *   avx2    the codecs' fast paths and the AVX2 Hadamard kernels (when the CPU
 *           has AVX2, the fast paths are the AVX2 kernels), kvq_attn_kernels_avx2
 *   avx512  kvq_attn_kernels_avx512 (tq rows 16 coordinates at a time)
 *   lib     the FFTW (DCT) and OpenBLAS (Gaussian) paths of kvq_rotation_apply
 *   cpu     the decoder's CPU backend (kvq_backend_cpu_create): its embed,
 *           norm, qkv_rope, glu and lm_head ops (test_ops_decoder.h), which
 *           the CUDA backend (kvq_backend_cuda_create) runs as "cuda"
 *   cuda    the GPU encoder (pages read back with kvq_cuda_cache_read_page;
 *           Hadamard and identity rotations, page sizes 16 to 64, appends in
 *           chunks, single-token steps and a two-sequence step) and
 *           kvq_cuda_cache_attend with the AUTO kernel choice
 *   cuda-fused, cuda-ref   kvq_cuda_cache_attend with the fused / reference
 *           kernel (fused: its own split count, then forced 1, 4, 7 and 128)
 * The library picks the CPU kernels itself inside kvq_cache_* and
 * kvq_attn_causal: the cases of ops "cache" and "causal" carry the backend
 * that pick makes in this process (KVQ_FORCE_SCALAR=1 or KVQ_ATTN_NO_AVX512=1
 * move them to another), and the "attn" case of the backend kvq_attn_decode
 * would pick runs through kvq_attn_decode itself.
 *
 * Usage: test_backend_ops [-o OPS] [-t TYPES] [-b BACKENDS] [-v] [-l]
 *                         [--perf [-r N]]   (--help for the details)
 * Without arguments it runs every case (make test) and ends with
 * "test_backend_ops: N passed, N failed, N skipped", counting (case, backend).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn_internal.h"
#include "codec_internal.h"
#include "kvq_attn.h"
#include "kvq_cache.h"
#include "kvq_cpu.h"
#include "kvq_cuda.h"
#include "kvq_rng.h"
#include "rotation_internal.h"
#include "test.h"
#include "test_data.h"
#include "test_util.h"
#include "test_ops_decoder.h"

/* ---- ops, backends, type classes ---------------------------------------- */

enum op { OP_ENCODE, OP_DECODE, OP_SCORE, OP_ROT, OP_ROT_T, OP_CACHE, OP_ATTN, OP_CAUSAL, OP_CAUSAL_TILED, OP_ATTEND, OP_ATTEND_WIN, OP_PREFILL, OP_PREFILL_DENSE,
          OP_D_EMBED, OP_D_NORM, OP_D_ROPE, OP_D_GLU, OP_D_LM, /* the decoder's backend ops (test_ops_decoder.h) */
          OP_COUNT };

enum backend { BE_SCALAR, BE_AVX2, BE_AVX512, BE_LIB, BE_CPU, BE_CUDA, BE_CUDA_FUSED, BE_CUDA_REF, BE_COUNT, BE_REF = BE_COUNT };
static const char *const BE_NAME[BE_COUNT + 1] = {"scalar", "avx2", "avx512",     "lib",      "cpu",
                                                  "cuda",   "cuda-fused", "cuda-ref", "ref"};

/* What a tolerance depends on besides the op: the family of the cache type
 * (for an op on a K/V pair, the family of K), or the rotation's kind. */
enum tclass { CL_BASE, CL_TQ, CL_TQJ, CL_HADAMARD, CL_DCT, CL_GAUSS, CL_COUNT };
static const char *const CL_NAME[CL_COUNT] = {"f32/f16/q8_0/q4_0", "tqB", "tqBj", "hadamard", "dct", "gauss"};

/* The prefill kernel: f16 operands (q as hi + lo, the levels alpha c ~exact,
 * the softmax weights and the window's rotated rows rounded once): measured
 * worst 1.2e-3 on these cases, 1.8e-3 with KVQ_CUDA_TEST_SMALL (H200). */
#define PF_TOL 2.5e-3
/* The dense prefill path (kvq_cuda_prefill_ws): q, the decoded keys and
 * values each rounded to f16 once (f16's unit roundoff 4.9e-4), the
 * softmax weights too; no hi + lo halves. */
#define PF_DENSE_TOL 5e-3
/* kvq_attn_causal (decoded f32 blocks, f32 products, exp_ps) against
 * kvq_attn_causal_ref (the fused decode: scores from the codes and the
 * fixed-point sign tables): both form each score in float, so a score carries
 * ~1e-7 of |q| |k| in absolute error, which becomes the relative error of its
 * softmax weight; with these outlier rows (K x8, q x4) |scale q.k| reaches
 * ~30, i.e. a few 1e-6. Measured worst 5.7e-6; the bound is the causal op's
 * against the exact reference (the same float-score error budget). */
#define TILED_TOL 1e-5

/* The one tolerance table: the largest error a backend may show against the
 * reference, in the op's measure (OPS[].measure). None is looser than the
 * per-module test it replaces (named in each comment). */
static const double TOL[OP_COUNT][CL_COUNT] = {
    /* codec_internal.h: the AVX2 and CUDA encoders perform the reference's
     * float operations in its order, so rows are identical byte for byte
     * (test_codec_types/test_codec_tq/test_cuda: memcmp). */
    [OP_ENCODE] = {[CL_BASE] = 0, [CL_TQ] = 0, [CL_TQJ] = 0},
    [OP_DECODE] = {[CL_BASE] = 0, [CL_TQ] = 0, [CL_TQJ] = 0}, /* the same contract for decode */
    [OP_SCORE] = {[CL_BASE] = 0, [CL_TQ] = 0, [CL_TQJ] = 0},  /* and for the 8-lane score order */
    /* rotation_internal.h: Hadamard is bit-exact on every path; FFTW's DCT
     * and OpenBLAS's sgemv round differently from the O(d^2) double loops
     * (test_rotation: 1e-6 |x|, and 1e-5 sqrt(d) |x| for the N(0,1) matrix). */
    [OP_ROT] = {[CL_HADAMARD] = 0, [CL_DCT] = 1e-6, [CL_GAUSS] = 1e-5},
    [OP_ROT_T] = {[CL_HADAMARD] = 0, [CL_DCT] = 1e-6, [CL_GAUSS] = 1e-5},
    /* The cache encodes and decodes with the codec: a read gives the bits of
     * the reference round trip (test_cache: memcmp). */
    [OP_CACHE] = {[CL_BASE] = 0, [CL_TQ] = 0, [CL_TQJ] = 0},
    /* Fused CPU attention sums blocks in float before folding into double,
     * the reference in double throughout: ~1e-6 relative (test_attn). */
    [OP_ATTN] = {[CL_BASE] = 1e-5, [CL_TQ] = 1e-5, [CL_TQJ] = 1e-5},
    [OP_CAUSAL] = {[CL_BASE] = 1e-5, [CL_TQ] = 1e-5, [CL_TQJ] = 1e-5}, /* one decode per position */
    /* The tiled chunk kernels against the per-position fused decode they
     * replace: TILED_TOL below. */
    [OP_CAUSAL_TILED] = {[CL_BASE] = TILED_TOL, [CL_TQ] = TILED_TOL, [CL_TQJ] = TILED_TOL},
    /* The fused GPU kernel multiplies in f16 on tensor cores (test_cuda TOL). */
    [OP_ATTEND] = {[CL_BASE] = 1e-3, [CL_TQ] = 1e-3, [CL_TQJ] = 1e-3},
    [OP_ATTEND_WIN] = {[CL_BASE] = 1e-3, [CL_TQ] = 1e-3, [CL_TQJ] = 1e-3}, /* the same kernels, + f16 rows in fp32 */
    /* The chunk kernel rounds q, the decoded keys and values and the softmax
     * weights to f16 (FlashAttention's f16 operands, f32 sums); the bound is
     * PF_TOL below. */
    [OP_PREFILL] = {[CL_BASE] = PF_TOL, [CL_TQ] = PF_TOL, [CL_TQJ] = PF_TOL},
    [OP_PREFILL_DENSE] = {[CL_BASE] = PF_DENSE_TOL, [CL_TQ] = PF_DENSE_TOL, [CL_TQJ] = PF_DENSE_TOL},
    /* The decoder's ops against their definitions in double (the bounds of
     * test_decoder_ops.c, which these cases replace): a float product per element
     * (embed: one rounding, 6e-8); float sums over a row (norm, the LM head's
     * hidden = 512 terms); float32 angles and float cos / sin (RoPE, whose
     * angle error grows with the position); expf / tanhf (glu). */
    [OP_D_EMBED] = {[CL_BASE] = 1e-7},
    [OP_D_NORM] = {[CL_BASE] = 1e-6},
    [OP_D_ROPE] = {[CL_BASE] = 1e-5},
    [OP_D_GLU] = {[CL_BASE] = 1e-6},
    [OP_D_LM] = {[CL_BASE] = 1e-5},
};

/* ---- shapes and cases ---------------------------------------------------- */

struct probe {
    int n_q;    /* query heads of the GQA group (causal: per position) */
    size_t ctx; /* context of one decode (causal: the chunk length T) */
};

struct shape {
    int dim;
    int page_tokens;        /* 0: KVQ_DEFAULT_PAGE_TOKENS (row ops: the GPU encoder's per-dim choice) */
    size_t n_tokens;        /* tokens in the cache (cache, attn, causal) */
    size_t pos0;            /* causal: position of the chunk's first query */
    int G;                  /* attend: query heads per KV head */
    enum kvq_rot_kind rot;  /* attend: the caches' rotation; row ops: the codec's (R and S) */
    int window, sinks;      /* prefill: the recent f16 window on, sink tokens */
    int center;             /* attend-window: key centering (kvq_cache_config.center_k) */
    int seg;                /* prefill-dense: the scratch's positions per launch (0: 128) */
    const struct probe *probes;
    int n_probes;
};

struct tcase {
    enum op op;
    int tk, tv; /* tv < 0: one type (row ops); rot ops: tk indexes ROTS */
    const struct shape *sh;
};

struct rot_variant {
    const char *name;
    enum kvq_rot_kind kind;
    int rounds; /* 0: the default (1) */
};
static const struct rot_variant ROTS[] = {
    {"hadamard", KVQ_ROT_HADAMARD, 0}, /* R of every tq codec */
    {"hadamard3", KVQ_ROT_HADAMARD, KVQ_QJL_ROUNDS}, /* S of the tqBj codecs */
    {"dct", KVQ_ROT_DCT, 0},
    {"gauss", KVQ_ROT_GAUSS, 0},
};
enum { N_ROTS = (int)(sizeof ROTS / sizeof ROTS[0]) };

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Row ops (encode, decode, score): every type at every dim it supports. */
static const struct shape SH_ROW[] = {{.dim = 8},  {.dim = 9},  {.dim = 15},  {.dim = 24},  {.dim = 40},
                                      {.dim = 64}, {.dim = 80}, {.dim = 96},  {.dim = 100}, {.dim = 128},
                                      {.dim = 192}, {.dim = 256}, {.dim = 1024}};
/* The rotated types once more without a rotation (R = S = I): every op,
 * the GPU encoder included. */
static const struct shape SH_ROW_IDENTITY[] = {{.dim = 128, .rot = KVQ_ROT_IDENTITY}};
/* The GPU encoder at page sizes its per-dim default (cuda_encode_prepare)
 * does not give: encode only, the cuda backend only. */
static const struct shape SH_ROW_PAGES[] = {{.dim = 128, .page_tokens = 16}, {.dim = 128, .page_tokens = 32},
                                            {.dim = 80, .page_tokens = 64},  {.dim = 256, .page_tokens = 16}};
/* Rotations: Hadamard at powers of two and Kronecker dims (m up to 511);
 * the library paths (FFTW, OpenBLAS) at a few dims, d = 3 included. */
static const struct shape SH_HAD[] = {{.dim = 8},    {.dim = 16},   {.dim = 32},   {.dim = 64},   {.dim = 128},
                                      {.dim = 256},  {.dim = 512},  {.dim = 1024}, {.dim = 2048}, {.dim = 4096},
                                      {.dim = 24},   {.dim = 40},   {.dim = 80},   {.dim = 96},   {.dim = 112},
                                      {.dim = 160},  {.dim = 192},  {.dim = 576},  {.dim = 1000}, {.dim = 4088}};
static const struct shape SH_LIBROT[] = {{.dim = 3}, {.dim = 80}, {.dim = 96}, {.dim = 128}, {.dim = 576}};

/* Cache: 150 tokens (two page boundaries) of 3 heads, appended in uneven pieces. */
static const struct shape SH_CACHE[] = {{.dim = 64, .n_tokens = 150}, {.dim = 96, .n_tokens = 150},
                                        {.dim = 128, .n_tokens = 150}};
static const struct shape SH_CACHE_ODD[] = {{.dim = 80, .n_tokens = 150}, {.dim = 100, .n_tokens = 150}};

/* Attention: GQA groups of 1 to 8 heads, contexts around block (64) and
 * page boundaries, pages shorter than a block or not dividing it, head dims
 * with the scalar path (100), AVX2 only (120) and AVX-512. */
static const struct probe PR_PAIRS[] = {{2, 1}, {2, 65}, {2, 300}, {7, 65}};
static const struct probe PR_LONG[] = {{1, 1},  {1, 63},   {1, 64}, {1, 65}, {1, 1000}, {2, 1},  {2, 63}, {2, 64},
                                       {2, 65}, {2, 1000}, {4, 1},  {4, 63}, {4, 64},   {4, 65}, {4, 1000}};
static const struct probe PR_PAGES[] = {{4, 15},  {4, 16},  {4, 17},  {4, 79},  {4, 81},
                                        {4, 257}, {4, 400}, {5, 257}, {5, 400}, {8, 400}};
static const struct probe PR_ODD[] = {{4, 81}, {4, 257}, {4, 400}, {3, 400}};
#define PROBES(p) .probes = p, .n_probes = COUNT(p)
static const struct shape SH_ATTN_PAIRS[] = {{.dim = 128, .n_tokens = 300, PROBES(PR_PAIRS)}};
static const struct shape SH_ATTN_LONG[] = {{.dim = 64, .n_tokens = 1000, PROBES(PR_LONG)},
                                            {.dim = 96, .n_tokens = 1000, PROBES(PR_LONG)},
                                            {.dim = 128, .n_tokens = 1000, PROBES(PR_LONG)}};
static const struct shape SH_ATTN_PAGES[] = {{.dim = 128, .page_tokens = 16, .n_tokens = 400, PROBES(PR_PAGES)},
                                             {.dim = 128, .page_tokens = 80, .n_tokens = 400, PROBES(PR_PAGES)},
                                             {.dim = 128, .page_tokens = 256, .n_tokens = 400, PROBES(PR_PAGES)}};
static const struct shape SH_ATTN_ODD[] = {{.dim = 80, .n_tokens = 400, PROBES(PR_ODD)},
                                           {.dim = 112, .n_tokens = 400, PROBES(PR_ODD)},
                                           {.dim = 120, .n_tokens = 400, PROBES(PR_ODD)},
                                           {.dim = 256, .n_tokens = 400, PROBES(PR_ODD)}};
static const struct shape SH_ATTN_D100[] = {{.dim = 100, .n_tokens = 400, .probes = PR_PAGES, .n_probes = 7}};
/* key centering (with the window it needs): the page means' gains of each
 * kernel table, 128 (AVX-512 where usable) and 80 (AVX2) */
static const struct shape SH_ATTN_CENTER[] = {{.dim = 128, .n_tokens = 400, .center = 1, PROBES(PR_PAGES)},
                                              {.dim = 80, .page_tokens = 32, .n_tokens = 400, .center = 1,
                                               PROBES(PR_ODD)}};

/* Causal: 80 positions from 50 (up to token 129, across two pages). */
static const struct probe PR_CAUSAL[] = {{2, 80}};
static const struct shape SH_CAUSAL[] = {{.dim = 64, .n_tokens = 140, .pos0 = 50, PROBES(PR_CAUSAL)},
                                         {.dim = 96, .n_tokens = 140, .pos0 = 50, PROBES(PR_CAUSAL)},
                                         {.dim = 128, .n_tokens = 140, .pos0 = 50, PROBES(PR_CAUSAL)}};
/* causal-tiled: several query tiles (G = 4: 32 positions a tile), queries
 * inside the sinks, and with the recent window chunks in the cache's last
 * page (the only one whose f16 copies it keeps), one ending as the page fills
 * (its last query reads the page packed); key centring (window on). */
static const struct probe PR_TILED_2[] = {{2, 64}}, PR_TILED_4[] = {{4, 290}}, PR_TILED_S[] = {{2, 297}},
                          PR_TILED_W[] = {{4, 20}};
static const struct shape SH_TILED[] = {
    {.dim = 128, .n_tokens = 300, .pos0 = 10, PROBES(PR_TILED_4)},
    {.dim = 96, .n_tokens = 300, .pos0 = 3, .sinks = 8, PROBES(PR_TILED_S)},
    {.dim = 128, .n_tokens = 192, .pos0 = 128, .window = 1, PROBES(PR_TILED_2)},
    {.dim = 64, .page_tokens = 32, .n_tokens = 150, .pos0 = 130, .window = 1, .sinks = 4, PROBES(PR_TILED_W)}};
static const struct shape SH_TILED_CENTER[] = {{.dim = 128, .n_tokens = 256, .pos0 = 192, .center = 1, PROBES(PR_TILED_2)}};
static const struct shape SH_TILED_D100[] = {{.dim = 100, .n_tokens = 300, .pos0 = 10, .sinks = 8, PROBES(PR_TILED_4)}};
static const struct shape SH_CAUSAL_D100[] = {{.dim = 100, .n_tokens = 140, .pos0 = 50, PROBES(PR_CAUSAL)}};

enum { F32 = KVQ_TYPE_F32, F16 = KVQ_TYPE_F16, Q8 = KVQ_TYPE_Q8_0, Q4 = KVQ_TYPE_Q4_0, T1 = KVQ_TYPE_TQ1,
       T2 = KVQ_TYPE_TQ2, T3 = KVQ_TYPE_TQ3, T4 = KVQ_TYPE_TQ4, T1J = KVQ_TYPE_TQ1J, T2J = KVQ_TYPE_TQ2J,
       T3J = KVQ_TYPE_TQ3J, T4J = KVQ_TYPE_TQ4J, T5 = KVQ_TYPE_TQ5, T6 = KVQ_TYPE_TQ6, T8 = KVQ_TYPE_TQ8,
       Q8R = KVQ_TYPE_Q8_0R, Q4R = KVQ_TYPE_Q4_0R, Q41 = KVQ_TYPE_Q4_1, Q50 = KVQ_TYPE_Q5_0, Q51 = KVQ_TYPE_Q5_1,
       Q41R = KVQ_TYPE_Q4_1R, Q50R = KVQ_TYPE_Q5_0R, Q51R = KVQ_TYPE_Q5_1R };

/* GPU attention: a batch of sequences of 1, 77, 600 and 3001 tokens plus the
 * longest again; query heads per KV head, page sizes (32- and 16-token
 * stages) and rotations as the fused kernel sees them. From the eleventh
 * entry on only the reference kernel applies (other types, other dims),
 * and the last eight are the group kernel's (AUTO at d = 64, 96, 256; tq4
 * keys at 128 too). */
static const struct attend_case {
    int tk, tv;
    struct shape sh;
} ATTEND[] = {
#define ATT(k, v, d, g, p, r) {k, v, {.dim = d, .G = g, .page_tokens = p, .rot = KVQ_ROT_##r}}
    ATT(T3J, T3, 128, 4, 64, HADAMARD), ATT(T3J, T3, 128, 8, 16, HADAMARD), ATT(T3J, T3, 128, 1, 64, DCT),
    ATT(T3, T3, 128, 3, 32, HADAMARD),  ATT(T3J, T3, 128, 2, 48, HADAMARD), ATT(F16, F16, 128, 4, 64, HADAMARD),
    ATT(F16, F16, 128, 6, 48, HADAMARD), ATT(T3J, F16, 128, 4, 64, HADAMARD), ATT(F16, T3, 128, 2, 64, HADAMARD),
    ATT(T3, F16, 128, 8, 64, IDENTITY), ATT(Q8, Q4, 128, 4, 64, HADAMARD),  ATT(T4J, T2, 128, 4, 64, HADAMARD),
    ATT(T3J, T3, 96, 4, 64, HADAMARD),  ATT(F32, F16, 64, 2, 16, HADAMARD), ATT(T1J, T1, 128, 4, 64, HADAMARD),
    ATT(T2J, T4, 96, 2, 48, HADAMARD),  ATT(Q4, Q8, 64, 4, 32, HADAMARD),   ATT(T2, T1J, 80, 4, 64, HADAMARD),
    ATT(T4, F32, 128, 4, 64, HADAMARD), ATT(T1, T4J, 64, 4, 64, HADAMARD),  ATT(F16, T2J, 128, 4, 64, HADAMARD),
    ATT(T3, T3J, 128, 4, 64, HADAMARD),
    /* the group kernel (AUTO at d = 64, 96, 256 for the fused kernel's
     * types; tq4 keys at 128 too) */
    ATT(T4, T3, 128, 4, 64, HADAMARD),  ATT(T4, F16, 64, 8, 32, HADAMARD),  ATT(T4, T3, 128, 6, 48, HADAMARD),
    ATT(T3J, T3, 64, 4, 64, HADAMARD),  ATT(T3, F16, 64, 8, 32, IDENTITY),  ATT(F16, T3, 256, 2, 64, HADAMARD),
    ATT(T3J, F16, 256, 8, 16, HADAMARD), ATT(F16, F16, 96, 3, 48, HADAMARD),
    /* codebooks of 5 to 8 bits (device tables), and other codebooks read a
     * code at a time: the group kernel's K_CB and V_CB */
    ATT(T5, T3, 128, 4, 64, HADAMARD),  ATT(T8, T6, 64, 8, 32, HADAMARD),   ATT(T6, T5, 128, 2, 48, HADAMARD),
    ATT(T5, T8, 96, 4, 64, HADAMARD),   ATT(T2, T5, 128, 4, 64, HADAMARD),  ATT(T3J, T5, 256, 2, 64, HADAMARD),
    ATT(F16, T6, 64, 4, 16, HADAMARD),  ATT(T8, T8, 128, 1, 64, HADAMARD),  ATT(T4, T1, 128, 8, 64, IDENTITY),
    /* llama.cpp's blocks, plain and rotated (the group kernel's K_BL, V_BL) */
    ATT(Q4R, Q4R, 128, 4, 64, HADAMARD), ATT(Q8R, Q4R, 128, 8, 32, HADAMARD), ATT(Q41, Q50, 64, 4, 64, HADAMARD),
    ATT(Q51R, Q41R, 96, 2, 48, HADAMARD), ATT(Q50R, F16, 256, 4, 64, HADAMARD), ATT(T3J, Q51, 128, 4, 64, HADAMARD),
    ATT(Q8, Q8R, 128, 3, 64, HADAMARD),
#undef ATT
};

/* GPU attention with f16 override rows (sinks and the recent window): the
 * types and rotations the GPU encoder takes, fused and reference kernels. */
static const struct {
    int tk, tv;
    struct shape sh;
} ATTEND_WIN[] = {
#define ATT(k, v, d, g, p, r) {k, v, {.dim = d, .G = g, .page_tokens = p, .rot = KVQ_ROT_##r}}
    ATT(T3J, T3, 128, 4, 64, HADAMARD), ATT(T3J, T3, 128, 8, 16, HADAMARD), ATT(T3, T3, 128, 3, 32, HADAMARD),
    ATT(F16, F16, 128, 4, 64, HADAMARD), ATT(T3, F16, 128, 8, 64, IDENTITY), ATT(T3J, T3, 96, 4, 64, HADAMARD),
    ATT(T4J, T2, 128, 4, 48, HADAMARD), ATT(F32, F16, 64, 2, 16, HADAMARD), ATT(T3J, T3, 64, 4, 64, HADAMARD),
    ATT(T3J, T3, 256, 2, 64, HADAMARD), ATT(T5, T4, 128, 4, 64, HADAMARD), ATT(T8, T6, 64, 2, 32, HADAMARD),
    ATT(Q4R, Q4R, 128, 4, 64, HADAMARD), ATT(Q8, Q41R, 64, 2, 32, HADAMARD),
#undef ATT
    /* key centering: the page means' scores in the fused kernel (integer and
     * f16 scores), the group and reference kernels, pages packed when they fill */
#define ATC(k, v, d, g, p) {k, v, {.dim = d, .G = g, .page_tokens = p, .rot = KVQ_ROT_HADAMARD, .center = 1}}
    ATC(T3J, T3, 128, 4, 64), ATC(T3J, T3, 128, 8, 16), ATC(T3, T3, 128, 3, 32), ATC(F16, F16, 128, 4, 64),
    ATC(T4, T3, 128, 4, 64),  ATC(T3J, T3, 96, 4, 64), ATC(T5, T3, 128, 4, 64), ATC(T6, T5, 64, 2, 32),
    ATC(Q4R, Q4R, 128, 4, 64), ATC(Q50, Q51R, 128, 2, 32),
#undef ATC
};

/* GPU prefill chunks (kvq_cuda_cache_prefill): the types, dims, GQA groups
 * and page sizes the chunk kernel takes (the types the GPU encoder appends,
 * f32 and QJL values aside), with and without the recent window and sinks. */
static const struct {
    int tk, tv;
    struct shape sh;
} PREFILL[] = {
#define PF(k, v, d, g, p, r, w, s) {k, v, {.dim = d, .G = g, .page_tokens = p, .rot = KVQ_ROT_##r, .window = w, .sinks = s}}
    PF(T3J, T3, 128, 4, 64, HADAMARD, 1, 4), PF(T3J, T3, 128, 4, 64, HADAMARD, 0, 0),
    PF(T3J, T3, 128, 8, 16, HADAMARD, 1, 0), PF(T3, T3, 128, 3, 32, HADAMARD, 1, 4),
    PF(F16, F16, 128, 4, 64, HADAMARD, 1, 0), PF(F16, F16, 64, 2, 64, HADAMARD, 0, 4),
    PF(T2J, T4, 128, 4, 64, HADAMARD, 1, 4),  PF(T4J, T2, 128, 4, 48, HADAMARD, 1, 0),
    PF(T3J, T3, 96, 4, 64, HADAMARD, 1, 4),  PF(T3, F16, 128, 8, 64, IDENTITY, 1, 0),
    PF(T3J, T3, 256, 2, 64, HADAMARD, 1, 4), PF(T3J, T3, 32, 4, 16, HADAMARD, 1, 0),
    PF(T4, T1, 64, 1, 32, HADAMARD, 0, 0),   PF(T3J, T3, 128, 16, 64, HADAMARD, 1, 4),
    PF(T5, T4, 128, 4, 64, HADAMARD, 1, 4),  PF(T8, T6, 64, 2, 64, HADAMARD, 0, 0),
    PF(T6, T5, 256, 2, 64, HADAMARD, 1, 0),  PF(T8, T8, 128, 8, 16, HADAMARD, 1, 4),
    PF(Q4R, Q4R, 128, 4, 64, HADAMARD, 1, 4), PF(Q8R, Q8R, 64, 2, 64, HADAMARD, 0, 0),
    PF(Q41, Q50R, 128, 4, 32, HADAMARD, 1, 0), PF(Q51R, Q8, 256, 2, 64, HADAMARD, 1, 4),
#undef PF
    /* the bundled model's shape (G = 2, d = 128) without the window, where
     * two decoder GPU tests fail on the warpgroup kernel, with the whole past
     * in one launch as the decoder has it (many 128-key tiles, the diagonal
     * among them) */
#define PFS(s) {T3J, T3, {.dim = 128, .G = 2, .page_tokens = 64, .rot = KVQ_ROT_HADAMARD, .sinks = s, .seg = 1024}}
    PFS(0), PFS(4),
#undef PFS
    /* key centering: the page means' gains in the chunk kernel, pipelined
     * and not, pages that tiles cross (48, sinks) */
#define PFC(k, v, d, g, p, s) {k, v, {.dim = d, .G = g, .page_tokens = p, .rot = KVQ_ROT_HADAMARD, .window = 1, .sinks = s, .center = 1}}
    PFC(T3J, T3, 128, 4, 64, 4), PFC(T3J, T3, 128, 8, 16, 0), PFC(F16, F16, 128, 4, 64, 0),
    PFC(T4J, T2, 128, 4, 48, 0), PFC(T3J, T3, 96, 4, 64, 4), PFC(T5, T3, 128, 4, 64, 4),
    PFC(Q4R, Q4R, 128, 4, 64, 4),
#undef PFC
};

/* Pairs that put every type once as K and once as V, the common ones first. */
static const int PAIRS_MAIN[][2] = {{T3J, T3}, {T4J, T4}, {T1J, T2}, {T2J, T3J}, {F32, F16}, {Q8, Q4}, {Q8, T3},
                                    {T3J, F16}, {T1, T4J}, {F16, F32}, {Q4, Q8},  {T2, T1},   {T3, T1J}, {T4, T2J}};
static const int PAIRS_LONG[][2] = {{T3J, T3}, {T4J, T4}, {T2J, T2}, {T1J, T1}, {Q8, T3},
                                    {T3J, Q4}, {F16, F16}, {F32, F32}, {Q8, Q8},  {T3, T3J}};
static const int PAIRS_CAUSAL[][2] = {{T3J, T3}, {F16, F16}, {Q8, Q4}, {T4J, T2}, {F32, T1J}};
static const int PAIR_T3J_T3[][2] = {{T3J, T3}};
static const int PAIR_T3J_T4J[][2] = {{T3J, T4J}};
static const int PAIR_F32_F16[][2] = {{F32, F16}};
static const int PAIRS_CENTER[][2] = {{T3J, T3}, {T4, T3}, {Q4, Q8}, {F16, F16}};

/* Cases of cache ops: every pair of a list with every shape of a list (the
 * pairs' types must support the dim); n_pairs 0: all K x V pairs. */
struct scene {
    enum op op;
    const int (*pairs)[2];
    int n_pairs;
    const struct shape *shapes;
    int n_shapes;
};
#define SCENE(o, p, s) {o, p, COUNT(p), s, COUNT(s)}
static const struct scene SCENES[] = {
    SCENE(OP_CACHE, PAIRS_MAIN, SH_CACHE),
    {OP_CACHE, PAIR_T3J_T3, 1, SH_CACHE_ODD, 1},
    {OP_CACHE, PAIR_F32_F16, 1, SH_CACHE_ODD + 1, 1},
    {OP_ATTN, NULL, 0, SH_ATTN_PAIRS, 1},
    SCENE(OP_ATTN, PAIRS_LONG, SH_ATTN_LONG),
    SCENE(OP_ATTN, PAIR_T3J_T3, SH_ATTN_PAGES),
    SCENE(OP_ATTN, PAIR_T3J_T4J, SH_ATTN_ODD),
    SCENE(OP_ATTN, PAIR_F32_F16, SH_ATTN_D100),
    SCENE(OP_ATTN, PAIRS_CENTER, SH_ATTN_CENTER),
    SCENE(OP_CAUSAL, PAIRS_CAUSAL, SH_CAUSAL),
    SCENE(OP_CAUSAL, PAIR_F32_F16, SH_CAUSAL_D100),
    SCENE(OP_CAUSAL_TILED, PAIRS_CAUSAL, SH_TILED),
    SCENE(OP_CAUSAL_TILED, PAIRS_CENTER, SH_TILED_CENTER),
    SCENE(OP_CAUSAL_TILED, PAIR_F32_F16, SH_TILED_D100),
};

static enum tclass type_class(int t)
{
    const struct kvq_type_traits *tr = kvq_type_traits((enum kvq_type)t);
    return !tr->rotated ? CL_BASE : tr->qjl ? CL_TQJ : CL_TQ;
}

static enum tclass case_class(const struct tcase *c)
{
    if (c->op >= OP_D_EMBED)
        return CL_BASE;
    if (c->op == OP_ROT || c->op == OP_ROT_T)
        return ROTS[c->tk].kind == KVQ_ROT_DCT ? CL_DCT : ROTS[c->tk].kind == KVQ_ROT_GAUSS ? CL_GAUSS : CL_HADAMARD;
    return type_class(c->tk);
}

static const char *tname(int t)
{
    return kvq_type_traits((enum kvq_type)t)->name;
}

static uint64_t case_seed(const struct tcase *c)
{
    const struct shape *s = c->sh;
    return 1000003u * (uint64_t)(c->tk + 1) + 10007u * (uint64_t)(c->tv + 2) + 101u * (uint64_t)s->dim +
           (uint64_t)s->n_tokens + 7u * (uint64_t)s->page_tokens + 13u * (uint64_t)s->G + 17u * (uint64_t)s->rot;
}

/* ---- input data (rows, blocks and outlier rows: test_data.h) ------------- */

/* Rotation inputs (vector t): magnitudes 2^-20 .. 2^20 with exact zeros of
 * either sign (where a - b vs -(b - a) would show); every fourth vector +-1
 * only (exact cancellations); every fourth sparse (zero results whose sign
 * must match). */
static void gen_rot_vec(kvq_rng *rng, float *x, int d, int t)
{
    const double mag = ldexp(1.0, (int)(kvq_rng_next(rng) % 40) - 20);
    const uint64_t one_in = 4ull << (t % 3 * 2);
    for (int j = 0; j < d; j++) {
        const uint64_t u = kvq_rng_next(rng);
        if (t % 4 == 3)
            x[j] = (u & 16) ? 1.0f : -1.0f;
        else if (t % 4 == 2)
            x[j] = (u % one_in == 1) ? ((u & 32) ? 1.0f : -1.0f) : ((u & 64) ? -0.0f : 0.0f);
        else
            x[j] = (u % 7 == 0) ? ((u & 8) ? -0.0f : 0.0f) : (float)(kvq_rng_gauss(rng) * mag);
    }
}

/* ---- comparisons --------------------------------------------------------- */

static int all_bytes(const uint8_t *p, size_t n, uint8_t v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return 0;
    return 1;
}

/* 1 when two row views of type t at dim d differ in any field. */
static int rows_differ(const struct kvq_row *a, const struct kvq_row *b, int t, int d)
{
    const struct kvq_row_fields f = kvq_layout_row_fields(t, d);
    return memcmp(a->codes, b->codes, f.codes) || (f.norm && memcmp(a->norm, b->norm, f.norm)) ||
           (f.rnorm && memcmp(a->rnorm, b->rnorm, f.rnorm)) || (f.signs && memcmp(a->signs, b->signs, f.signs));
}

/* The cache config of kv_heads heads for the case's pair and shape. */
static void case_cache_config(const struct tcase *c, int kv_heads, size_t max_tokens, uint64_t seed,
                              struct kvq_cache_config *cfg)
{
    kvq_cache_config_default(cfg, kv_heads, c->sh->dim, max_tokens);
    cfg->type_k = (enum kvq_type)c->tk;
    cfg->type_v = (enum kvq_type)c->tv;
    cfg->seed = seed;
    cfg->rot = c->sh->rot;
    cfg->page_tokens = c->sh->page_tokens;
    if (c->sh->center)
        cfg->recent_f16 = cfg->center_k = 1;
    if (c->op == OP_CAUSAL_TILED) {
        cfg->recent_f16 |= c->sh->window;
        cfg->sink_tokens = c->sh->sinks;
    }
}

/* An empty CPU cache of kv_heads heads for the case's pair and shape. */
static kvq_cache *make_cache(const struct tcase *c, int kv_heads, size_t max_tokens, uint64_t seed)
{
    struct kvq_cache_config cfg;
    case_cache_config(c, kv_heads, max_tokens, seed, &cfg);
    kvq_cache *kc = NULL;
    kvq_status st = kvq_cache_create(&cfg, &kc);
    CHECKF(st == KVQ_OK, "cache create: %s", kvq_status_str(st));
    return kc;
}

/* make_cache holding n tokens of test_outlier_rows (K outliers 8, V 3). */
static kvq_cache *filled_cache(const struct tcase *c, int kv_heads, size_t n, uint64_t seed)
{
    kvq_cache *kc = make_cache(c, kv_heads, n, seed);
    float *k = test_outlier_rows(n * (size_t)kv_heads, c->sh->dim, seed * 3 + 1, 8.0);
    float *v = test_outlier_rows(n * (size_t)kv_heads, c->sh->dim, seed * 3 + 2, 3.0);
    if (kc)
        CHECK_OK(kvq_cache_append(kc, n, k, v));
    free(k);
    free(v);
    return kc;
}

/* ---- row ops: encode, decode, score --------------------------------------- */

struct row_fx {
    kvq_codec *c, *cv; /* cv: the V codec of the GPU encoder's cache */
    const struct kvq_type_traits *tr;
    int d, n;
    size_t rb, qn;
    float *x, *qp;     /* [n][d] inputs, [n][qn] prepared queries */
    uint8_t *row[2];   /* [n][rb]: [0] the reference's, [1] the backend's */
    kvq_status *st[2]; /* per row */
    float *y[2];       /* decode outputs [n][d] */
    float *s[2];       /* scores [n] */
    /* the GPU encoder: seq 1 holds T tokens of 3 heads, seq 0 the first cuda_steps() + 1 */
    kvq_cuda_cache *g;
    size_t T;
    int *kidx;      /* [T][3]: the row of x (and of row[0]) each K token-head holds */
    uint8_t *vref;  /* [T][3]: the V rows as cv's reference encodes them */
    float *kd, *vd; /* device copies of K, V [T][3][d] */
};

static const uint8_t FILL[2] = {0xa5, 0x5a}; /* what rows hold before an encode */

static void row_free(void *p)
{
    struct row_fx *f = p;
    kvq_codec_free(f->c);
    kvq_codec_free(f->cv);
    for (int s = 0; s < 2; s++) {
        free(f->row[s]);
        free(f->st[s]);
        free(f->y[s]);
        free(f->s[s]);
    }
    free(f->x);
    free(f->qp);
    free(f->kidx);
    free(f->vref);
    kvq_cuda_free(f->kd);
    kvq_cuda_free(f->vd);
    kvq_cuda_cache_free(f->g);
    free(f);
}

/* The kind of row r for a type of the given family: four rows in five take
 * the kinds aimed at that family (tq types: the whole-row kinds 0..3,
 * baselines: the block kinds 4..10), the fifth cycles through the others. */
static int row_kind(int r, int base)
{
    static const int base_rest[] = {0, 1, 2, 3, 11, 12};
    const int i = r / 5 * 4 + r % 5;
    if (r % 5 < 4)
        return base ? 4 + i % 7 : i % 4;
    return base ? base_rest[r / 5 % COUNT(base_rest)] : 4 + r / 5 % 9;
}

static int rows_of(int t, int d)
{
    /* 1200 rows of the whole-row kinds for tq types, 3000 rows of block
     * kinds for the baselines (what the per-module tests used); a tenth
     * above 256 */
    int n = type_class(t) == CL_BASE ? 3750 : 1500;
    return d > 256 ? n / 10 : n;
}

/* test_codec_make (ORTHO QJL) with the shape's rotation kind, for R and
 * the S of a tqBj type, as a cache of that rotation makes its codecs. */
static kvq_codec *row_codec(const struct tcase *c, int t, uint64_t seed)
{
    struct kvq_codec_config cfg;
    kvq_codec_config_default(&cfg, (enum kvq_type)t, c->sh->dim);
    cfg.seed = seed;
    cfg.rot = c->sh->rot;
    cfg.qjl = KVQ_QJL_ORTHO;
    kvq_codec *cd = NULL;
    const kvq_status st = kvq_codec_create(&cfg, &cd);
    CHECKF(st == KVQ_OK, "create %s at d=%d, %s: %s", tname(t), c->sh->dim, kvq_rot_kind_name(c->sh->rot),
           kvq_status_str(st));
    return cd;
}

static void *row_setup(const struct tcase *c)
{
    struct row_fx *f = calloc(1, sizeof *f);
    const int d = c->sh->dim;
    f->c = row_codec(c, c->tk, case_seed(c));
    if (!f->c) {
        row_free(f);
        return NULL;
    }
    f->tr = kvq_codec_traits(f->c);
    f->d = d;
    f->n = rows_of(c->tk, d);
    f->rb = kvq_codec_row_bytes(f->c);
    f->qn = kvq_codec_query_floats(f->c);
    const size_t n = (size_t)f->n;
    f->x = malloc(n * (size_t)d * sizeof *f->x);
    f->qp = malloc(n * f->qn * sizeof *f->qp);
    for (int s = 0; s < 2; s++) {
        f->row[s] = malloc(n * f->rb);
        f->st[s] = malloc(n * sizeof *f->st[s]);
        f->y[s] = calloc(n * (size_t)d, sizeof *f->y[s]);
        f->s[s] = calloc(n, sizeof *f->s[s]);
    }
    kvq_rng rng;
    kvq_rng_init(&rng, case_seed(c) + 1);
    float *q = malloc((size_t)d * sizeof *q);
    for (size_t r = 0; r < n; r++) {
        test_fill_row(&rng, f->x + r * (size_t)d, d, row_kind((int)r, type_class(c->tk) == CL_BASE));
        test_fill_row(&rng, q, d, 0);
        CHECK_OK(kvq_codec_prepare_query(f->c, q, f->qp + r * f->qn));
    }
    free(q);
    /* the reference rows decode and score read */
    memset(f->row[0], FILL[0], n * f->rb);
    for (size_t r = 0; r < n; r++) {
        struct kvq_row v = kvq_codec_packed_row(f->c, f->row[0] + r * f->rb);
        f->st[0][r] = f->tr->encode_ref(f->c, f->x + r * (size_t)d, &v);
    }
    return f;
}

static struct kvq_row ref_row(const struct row_fx *f, int r)
{
    return kvq_codec_packed_row(f->c, f->row[0] + (size_t)r * f->rb);
}

/* The V type of the GPU encoder's cache for K type t: another family and
 * row size, so that K and V sections differ (t itself where the other type
 * does not take the dim). */
static int gpu_v_type(int t, int d)
{
    static const int gpu[] = {F32, F16, T1, T2, T3, T4, T1J, T2J, T3J, T4J}; /* what the GPU encodes */
    int i = 0;
    while (i < COUNT(gpu) - 1 && gpu[i] != t)
        i++;
    const int v = gpu[(i + 3) % COUNT(gpu)];
    return kvq_type_check_dim((enum kvq_type)v, d) == KVQ_OK ? v : t;
}

/* The GPU encoder's input: the rows both codecs encode (status OK) as
 * tokens of 3 heads, K in order and V in reverse, on the device; the V
 * rows as the V codec's reference encodes them. */
static int cuda_encode_prepare(struct row_fx *f, const struct tcase *c)
{
    const int H = 3, d = f->d, t = c->tk, tv = gpu_v_type(t, d);
    f->cv = row_codec(c, tv, kvq_seed_derive(case_seed(c), KVQ_CACHE_SEED_STREAM_V));
    if (!f->cv)
        return 0;
    const size_t rbv = kvq_codec_row_bytes(f->cv);
    int *ok = malloc((size_t)f->n * sizeof *ok), n_ok = 0;
    for (int r = 0; r < f->n; r++)
        if (f->st[0][r] == KVQ_OK && kvq_codec_check_row(f->cv, f->x + (size_t)r * d) == KVQ_OK)
            ok[n_ok++] = r;
    f->T = (size_t)n_ok / H;
    CHECKF(f->T >= 4, "%d encodable rows: too few for the append pattern", n_ok);
    const size_t nr = f->T * H;
    float *k = malloc(nr * (size_t)d * sizeof *k), *v = malloc(nr * (size_t)d * sizeof *v);
    f->kidx = malloc(nr * sizeof *f->kidx);
    f->vref = malloc(nr * rbv);
    for (size_t i = 0; i < nr; i++) {
        const int rk = ok[i], rv = ok[nr - 1 - i];
        f->kidx[i] = rk;
        memcpy(k + i * (size_t)d, f->x + (size_t)rk * d, (size_t)d * sizeof *k);
        memcpy(v + i * (size_t)d, f->x + (size_t)rv * d, (size_t)d * sizeof *v);
        struct kvq_row row = kvq_codec_packed_row(f->cv, f->vref + i * rbv);
        CHECK_OK(f->cv->traits->encode_ref(f->cv, v + i * (size_t)d, &row));
    }
    struct kvq_cuda_cache_config cfg;
    kvq_cuda_cache_config_default(&cfg, H, d, f->T, 2);
    cfg.cache.type_k = (enum kvq_type)t;
    cfg.cache.type_v = (enum kvq_type)tv;
    cfg.cache.seed = case_seed(c);
    cfg.cache.rot = c->sh->rot;
    cfg.cache.page_tokens = c->sh->page_tokens ? c->sh->page_tokens
                          : d > 256            ? 16
                          : d % 3 == 0         ? 48
                          : d % 128 == 0       ? 64
                                               : 32;
    cfg.check_input = t % 2; /* without the check, appends return without synchronising */
    CHECK_OK(kvq_cuda_cache_create(&cfg, &f->g));
    f->kd = test_to_dev(k, nr * (size_t)d);
    f->vd = test_to_dev(v, nr * (size_t)d);
    free(k);
    free(v);
    free(ok);
    return f->g && f->kd && f->vd && f->T >= 4;
}

/* Single-token steps of seq 0: 40, fewer when few rows encode (f16 at large d). */
static size_t cuda_steps(const struct row_fx *f)
{
    return f->T / 2 < 40 ? f->T / 2 : 40;
}

/* Seq 1: a chunk, one token through the batch path, a chunk; seq 0:
 * cuda_steps() single-token steps; then one step for both (the next token to
 * seq 0, the last token to seq 1). */
static void cuda_encode_exec(struct row_fx *f, const struct tcase *c)
{
    if (!f->g && !cuda_encode_prepare(f, c))
        return;
    const size_t row = 3 * (size_t)f->d, T = f->T, a = T / 2;
    CHECK_OK(kvq_cuda_cache_truncate(f->g, 0, 0));
    CHECK_OK(kvq_cuda_cache_truncate(f->g, 1, 0));
    int one = 1, zero = 0, both[2] = {0, 1};
    CHECK_OK(kvq_cuda_cache_append(f->g, 1, a, f->kd, f->vd));
    CHECK_OK(kvq_cuda_cache_append_batch(f->g, 1, &one, f->kd + a * row, f->vd + a * row));
    CHECK_OK(kvq_cuda_cache_append(f->g, 1, T - a - 2, f->kd + (a + 1) * row, f->vd + (a + 1) * row));
    const size_t steps = cuda_steps(f);
    for (size_t t = 0; t < steps; t++)
        CHECK_OK(kvq_cuda_cache_append_batch(f->g, 1, &zero, f->kd + t * row, f->vd + t * row));
    float *kb = NULL, *vb = NULL;
    CHECK_OK(kvq_cuda_malloc((void **)&kb, 2 * row * sizeof(float)));
    CHECK_OK(kvq_cuda_malloc((void **)&vb, 2 * row * sizeof(float)));
    if (kb && vb) {
        CHECK_OK(kvq_cuda_memcpy_d2d(kb, f->kd + steps * row, row * sizeof(float)));
        CHECK_OK(kvq_cuda_memcpy_d2d(kb + row, f->kd + (T - 1) * row, row * sizeof(float)));
        CHECK_OK(kvq_cuda_memcpy_d2d(vb, f->vd + steps * row, row * sizeof(float)));
        CHECK_OK(kvq_cuda_memcpy_d2d(vb + row, f->vd + (T - 1) * row, row * sizeof(float)));
        CHECK_OK(kvq_cuda_cache_append_batch(f->g, 2, both, kb, vb));
    }
    CHECK_OK(kvq_cuda_synchronize());
    kvq_cuda_free(kb);
    kvq_cuda_free(vb);
}

/* Rows of seq (tokens [0, n)) read back page by page that differ from the
 * reference encoder's. */
static double cuda_encode_error(const struct row_fx *f, const struct tcase *c, int seq, size_t n)
{
    if (!f->g || kvq_cuda_cache_len(f->g, seq) != n) {
        CHECKF(0, "seq %d holds %zu tokens, want %zu", seq, f->g ? kvq_cuda_cache_len(f->g, seq) : 0, n);
        return INFINITY;
    }
    const struct kvq_page_layout *L = kvq_cuda_cache_layout(f->g);
    const size_t P = L->page_tokens;
    uint8_t *page = malloc(L->page_bytes);
    double bad = 0;
    for (size_t i = 0; i * P < n; i++) {
        CHECK_OK(kvq_cuda_cache_read_page(f->g, seq, i, page));
        for (uint32_t h = 0; h < L->n_kv_heads; h++)
            for (size_t s = 0; s < P && i * P + s < n; s++) {
                const size_t tok = i * P + s, at = tok * 3 + h;
                const struct kvq_row gk = kvq_head_row(&L->k, page + L->k_off + h * L->k.bytes, (uint32_t)s);
                const struct kvq_row gv = kvq_head_row(&L->v, page + L->v_off + h * L->v.bytes, (uint32_t)s);
                const struct kvq_row rk = ref_row(f, f->kidx[at]);
                const struct kvq_row rv = kvq_codec_packed_row(f->cv, f->vref + at * kvq_codec_row_bytes(f->cv));
                bad += rows_differ(&gk, &rk, c->tk, f->d) + rows_differ(&gv, &rv, (int)L->v.type, f->d);
            }
    }
    free(page);
    return bad;
}

static void row_exec(void *p, const struct tcase *c, enum backend b)
{
    struct row_fx *f = p;
    const int s = b != BE_REF, d = f->d;
    if (b == BE_CUDA) {
        cuda_encode_exec(f, c);
        return;
    }
    for (int r = 0; r < f->n; r++) {
        const float *x = f->x + (size_t)r * d;
        struct kvq_row v = ref_row(f, r);
        switch (c->op) {
        case OP_ENCODE:
            memset(f->row[s] + (size_t)r * f->rb, FILL[s], f->rb);
            v = kvq_codec_packed_row(f->c, f->row[s] + (size_t)r * f->rb);
            f->st[s][r] = (s ? f->tr->encode : f->tr->encode_ref)(f->c, x, &v);
            break;
        case OP_DECODE:
            if (f->st[0][r] == KVQ_OK)
                (s ? f->tr->decode : f->tr->decode_ref)(f->c, &v, f->y[s] + (size_t)r * d);
            break;
        default:
            if (f->st[0][r] == KVQ_OK)
                f->s[s][r] = (s ? f->tr->score : f->tr->score_ref)(f->c, f->qp + (size_t)r * f->qn, &v);
            break;
        }
    }
}

/* Rows that differ: status, bytes (or, after an error, anything written),
 * kvq_codec_check_row's verdict; decoded values; scores (bits). */
static double row_error(void *p, const struct tcase *c, enum backend b)
{
    struct row_fx *f = p;
    if (b == BE_CUDA)
        return cuda_encode_error(f, c, 1, f->T) + cuda_encode_error(f, c, 0, cuda_steps(f) + 1);
    double bad = 0;
    for (int r = 0; r < f->n; r++) {
        const size_t o = (size_t)r * f->rb, od = (size_t)r * f->d;
        if (c->op == OP_ENCODE) {
            const kvq_status s0 = f->st[0][r];
            bad += s0 != f->st[1][r] || kvq_codec_check_row(f->c, f->x + od) != s0 ||
                   (s0 == KVQ_OK ? memcmp(f->row[0] + o, f->row[1] + o, f->rb) != 0
                                 : !all_bytes(f->row[0] + o, f->rb, FILL[0]) || !all_bytes(f->row[1] + o, f->rb, FILL[1]));
        } else if (f->st[0][r] == KVQ_OK) {
            bad += c->op == OP_DECODE ? memcmp(f->y[0] + od, f->y[1] + od, (size_t)f->d * sizeof(float)) != 0
                                      : memcmp(&f->s[0][r], &f->s[1][r], sizeof(float)) != 0;
        }
    }
    return bad;
}

static int row_supports(const struct tcase *c, enum backend b)
{
    if (b == BE_AVX2)
        return !c->sh->page_tokens; /* SH_ROW_PAGES: the GPU encoder's page sizes */
    /* the GPU encoder: every type */
    return b == BE_CUDA && c->op == OP_ENCODE;
}

/* ---- rotations ------------------------------------------------------------ */

struct rot_fx {
    kvq_rotation *r;
    int d, n;
    float *x, *y[2]; /* [n][d] */
};

static void rot_free(void *p)
{
    struct rot_fx *f = p;
    kvq_rotation_free(f->r);
    free(f->x);
    free(f->y[0]);
    free(f->y[1]);
    free(f);
}

static void *rot_setup(const struct tcase *c)
{
    const struct rot_variant *rv = &ROTS[c->tk];
    struct rot_fx *f = calloc(1, sizeof *f);
    f->d = c->sh->dim;
    f->n = rv->kind == KVQ_ROT_HADAMARD ? 96 : 16; /* the library paths' references are O(d^2) */
    CHECK_OK(kvq_rotation_create_rounds(f->d, rv->kind, (uint64_t)f->d * 31, rv->rounds, &f->r));
    if (!f->r) {
        rot_free(f);
        return NULL;
    }
    const size_t n = (size_t)f->n * (size_t)f->d;
    f->x = malloc(n * sizeof *f->x);
    f->y[0] = malloc(n * sizeof *f->x);
    f->y[1] = malloc(n * sizeof *f->x);
    kvq_rng rng;
    kvq_rng_init(&rng, case_seed(c));
    for (int t = 0; t < f->n; t++)
        gen_rot_vec(&rng, f->x + (size_t)t * f->d, f->d, t);
    return f;
}

static void rot_exec(void *p, const struct tcase *c, enum backend b)
{
    struct rot_fx *f = p;
    typedef void (*rot_fn)(const kvq_rotation *, const float *, float *);
    static const rot_fn fns[2][3] = {{kvq_rotation_apply_ref, kvq_rot_hadamard_avx2, kvq_rotation_apply},
                                     {kvq_rotation_apply_t_ref, kvq_rot_hadamard_t_avx2, kvq_rotation_apply_t}};
    const rot_fn fn = fns[c->op == OP_ROT_T][b == BE_REF ? 0 : b == BE_AVX2 ? 1 : 2];
    for (int t = 0; t < f->n; t++)
        fn(f->r, f->x + (size_t)t * f->d, f->y[b != BE_REF] + (size_t)t * f->d);
}

/* Hadamard: vectors whose bits differ. DCT: max |y - ref| / |x|; Gaussian:
 * max |y - ref| / (sqrt(d) |x|), the scale of G x. */
static double rot_error(void *p, const struct tcase *c, enum backend b)
{
    struct rot_fx *f = p;
    const enum tclass cl = case_class(c);
    (void)b;
    double worst = 0;
    for (int t = 0; t < f->n; t++) {
        const size_t o = (size_t)t * f->d;
        if (cl == CL_HADAMARD) {
            worst += memcmp(f->y[0] + o, f->y[1] + o, (size_t)f->d * sizeof(float)) != 0;
            continue;
        }
        double e = 0, nx = 0;
        for (int j = 0; j < f->d; j++) {
            e = fmax(e, fabs((double)f->y[1][o + j] - f->y[0][o + j]));
            nx += (double)f->x[o + j] * f->x[o + j];
        }
        nx = sqrt(nx) * (cl == CL_GAUSS ? sqrt((double)f->d) : 1.0);
        worst = fmax(worst, nx > 0 ? e / nx : e);
    }
    return worst;
}

static int rot_supports(const struct tcase *c, enum backend b)
{
    return b == (ROTS[c->tk].kind == KVQ_ROT_HADAMARD ? BE_AVX2 : BE_LIB);
}

/* ---- the CPU cache: append + read ----------------------------------------- */

/* The backend the library's own dispatch runs for head dim d: the codecs'
 * fast paths (cache) and kvq_attn_decode's kernel choice (attention). */
static enum backend cache_dispatch(void)
{
    return kvq_cpu_has_avx2() ? BE_AVX2 : BE_SCALAR;
}

static enum backend attn_dispatch(int d)
{
    if (!kvq_cpu_has_avx2() || d % 8)
        return BE_SCALAR;
    return kvq_attn_avx512_usable() && d % 16 == 0 ? BE_AVX512 : BE_AVX2;
}

enum { CACHE_HEADS = 3 };

struct cache_fx {
    int d;
    size_t n;
    uint64_t seed;
    float *k, *v;           /* appended [n][H][d] */
    float *want[2], *got[2]; /* K, V as [H][n][d] */
    kvq_cache *c;
};

static void cache_free(void *p)
{
    struct cache_fx *f = p;
    kvq_cache_free(f->c);
    free(f->k);
    free(f->v);
    for (int i = 0; i < 2; i++) {
        free(f->want[i]);
        free(f->got[i]);
    }
    free(f);
}

static void *cache_setup(const struct tcase *c)
{
    struct cache_fx *f = calloc(1, sizeof *f);
    f->d = c->sh->dim;
    f->n = c->sh->n_tokens;
    f->seed = case_seed(c);
    const size_t nv = f->n * CACHE_HEADS * (size_t)f->d;
    f->k = test_outlier_rows(f->n * CACHE_HEADS, f->d, f->seed + 1, 12.0);
    f->v = test_outlier_rows(f->n * CACHE_HEADS, f->d, f->seed + 2, 12.0);
    for (int i = 0; i < 2; i++) {
        f->want[i] = malloc(nv * sizeof(float));
        f->got[i] = malloc(nv * sizeof(float));
    }
    return f;
}

/* ref: every row through the reference encoder and decoder of codecs made
 * from the documented seeds (K: seed, V: kvq_seed_derive(seed, V stream));
 * backend: a cache appended in uneven pieces, then read whole. */
static void cache_exec(void *p, const struct tcase *c, enum backend b)
{
    struct cache_fx *f = p;
    const int d = f->d;
    if (b == BE_REF) {
        for (int kv = 0; kv < 2; kv++) {
            const int t = kv ? c->tv : c->tk;
            kvq_codec *cd =
                test_codec_make((enum kvq_type)t, d, kv ? kvq_seed_derive(f->seed, KVQ_CACHE_SEED_STREAM_V) : f->seed,
                                KVQ_QJL_ORTHO);
            if (!cd)
                return;
            uint8_t *row = malloc(kvq_codec_row_bytes(cd));
            struct kvq_row r = kvq_codec_packed_row(cd, row);
            for (int h = 0; h < CACHE_HEADS; h++)
                for (size_t i = 0; i < f->n; i++) {
                    CHECK_OK(cd->traits->encode_ref(cd, (kv ? f->v : f->k) + (i * CACHE_HEADS + h) * d, &r));
                    cd->traits->decode_ref(cd, &r, f->want[kv] + ((size_t)h * f->n + i) * d);
                }
            free(row);
            kvq_codec_free(cd);
        }
        return;
    }
    kvq_cache_free(f->c);
    if (!(f->c = make_cache(c, CACHE_HEADS, 1000, f->seed)))
        return;
    static const size_t pieces[] = {1, 62, 1, 1};
    size_t at = 0;
    for (int i = 0; i <= COUNT(pieces); i++) {
        const size_t m = i < COUNT(pieces) ? pieces[i] : f->n - at;
        CHECK_OK(kvq_cache_append(f->c, m, f->k + at * CACHE_HEADS * d, f->v + at * CACHE_HEADS * d));
        at += m;
    }
    for (int h = 0; h < CACHE_HEADS; h++)
        CHECK_OK(kvq_cache_read(f->c, h, 0, f->n, f->got[0] + (size_t)h * f->n * d, f->got[1] + (size_t)h * f->n * d));
}

/* Rows that differ from the reference, plus: an f32 K read differs from its
 * input; a partial read differs from the whole one. */
static double cache_error(void *p, const struct tcase *c, enum backend b)
{
    struct cache_fx *f = p;
    const size_t d = (size_t)f->d;
    (void)b;
    if (!f->c || kvq_cache_len(f->c) != f->n)
        return INFINITY;
    double bad = 0;
    for (int kv = 0; kv < 2; kv++)
        for (size_t h = 0; h < CACHE_HEADS; h++)
            for (size_t i = 0; i < f->n; i++) {
                const float *got = f->got[kv] + (h * f->n + i) * d;
                bad += memcmp(got, f->want[kv] + (h * f->n + i) * d, d * sizeof(float)) != 0;
                if (!kv && c->tk == KVQ_TYPE_F32)
                    bad += memcmp(got, f->k + (i * CACHE_HEADS + h) * d, d * sizeof(float)) != 0;
            }
    float *part = malloc(3 * d * sizeof *part);
    CHECK_OK(kvq_cache_read(f->c, 1, 63, 3, part, NULL));
    bad += memcmp(part, f->got[0] + (f->n + 63) * d, 3 * d * sizeof(float)) != 0;
    free(part);
    return bad;
}

static int cache_supports(const struct tcase *c, enum backend b)
{
    (void)c;
    return b == cache_dispatch();
}

/* ---- CPU attention: decode (GQA group) and causal chunks ------------------ */

enum { ATTN_HEADS = 2, ATTN_HEAD = 1 }; /* the cache's KV heads; the one attended */

struct attn_fx {
    kvq_cache *c;
    kvq_attn_workspace *ws;
    int d;
    float scale;
    float *q;      /* the probes' queries, one after the other */
    float *out[2]; /* the same layout: reference, backend */
    size_t *off;   /* [n_probes]: where a probe's floats start */
    size_t len;
};

static void attn_free(void *p)
{
    struct attn_fx *f = p;
    kvq_cache_free(f->c);
    kvq_attn_workspace_free(f->ws);
    free(f->q);
    free(f->out[0]);
    free(f->out[1]);
    free(f->off);
    free(f);
}

/* Floats of probe i's queries (causal: all positions of the chunk). */
static size_t probe_floats(const struct tcase *c, int i)
{
    const struct probe *pr = &c->sh->probes[i];
    return (size_t)pr->n_q * (size_t)c->sh->dim * (c->op == OP_CAUSAL || c->op == OP_CAUSAL_TILED ? pr->ctx : 1);
}

static void *attn_setup(const struct tcase *c)
{
    const struct shape *s = c->sh;
    struct attn_fx *f = calloc(1, sizeof *f);
    f->d = s->dim;
    f->scale = 1.0f / sqrtf((float)s->dim);
    f->c = filled_cache(c, ATTN_HEADS, s->n_tokens, case_seed(c));
    f->off = malloc((size_t)s->n_probes * sizeof *f->off);
    int max_q = 1;
    for (int i = 0; i < s->n_probes; i++) {
        f->off[i] = f->len;
        f->len += probe_floats(c, i);
        max_q = s->probes[i].n_q > max_q ? s->probes[i].n_q : max_q;
    }
    CHECK_OK(kvq_attn_workspace_create(s->dim, max_q, s->n_tokens, &f->ws));
    f->q = test_outlier_rows(f->len / (size_t)s->dim, s->dim, case_seed(c) + 5, 4.0);
    f->out[0] = calloc(f->len, sizeof(float));
    f->out[1] = calloc(f->len, sizeof(float));
    if (!f->c || !f->ws) {
        attn_free(f);
        return NULL;
    }
    return f;
}

static const struct kvq_attn_kernels *kernel_set(enum backend b)
{
    return b == BE_AVX512 ? &kvq_attn_kernels_avx512 : b == BE_AVX2 ? &kvq_attn_kernels_avx2 : &kvq_attn_kernels_scalar;
}

/* causal-tiled: the reference is the per-position path; scalar, avx2 and
 * avx512 the chunk kernels; lib kvq_attn_causal, also over the chunk cut into uneven
 * pieces, which must give the same bits (kv_store_cpu.c splits chunks by
 * position across threads and relies on it), and with the window
 * kvq_attn_causal_recent over the f16 rows the cache holds, the same bits. */
static void causal_tiled_exec(struct attn_fx *f, const struct tcase *c, enum backend b, int i, const float *q,
                              float *out)
{
    const struct shape *s = c->sh;
    const int nq = s->probes[i].n_q;
    const size_t T = s->probes[i].ctx, stride = (size_t)nq * (size_t)f->d;
    if (b == BE_REF) {
        CHECK_OK(kvq_attn_causal_ref(f->c, ATTN_HEAD, s->pos0, T, q, nq, f->scale, out, f->ws));
    } else if (b != BE_LIB) {
        const struct kvq_attn_chunk_kernels *kr = b == BE_AVX512 ? &kvq_attn_chunk_kernels_avx512
                                                  : b == BE_AVX2 ? &kvq_attn_chunk_kernels_avx2
                                                                 : &kvq_attn_chunk_kernels_scalar;
        CHECK_OK(kvq_attn_causal_kernels(kr, f->c, ATTN_HEAD, s->pos0, T, q, nq, f->scale, out, f->ws, NULL));
    } else {
        CHECK_OK(kvq_attn_causal(f->c, ATTN_HEAD, s->pos0, T, q, nq, f->scale, out, f->ws));
        float *part = malloc(T * stride * sizeof *part);
        for (size_t t = 0, n = 1; t < T; t += n, n = n * 3 % 37 + 1) {
            n = n < T - t ? n : T - t;
            CHECK_OK(kvq_attn_causal(f->c, ATTN_HEAD, s->pos0 + t, n, q + t * stride, nq, f->scale,
                                     part + t * stride, f->ws));
        }
        CHECKF(!memcmp(part, out, T * stride * sizeof *part), "causal-tiled d=%d: a split chunk's rows differ",
               s->dim);
        /* with the window: kvq_attn_causal_recent given the f16 copies the
         * cache holds for the chunk's page gives the same bits */
        const struct kvq_cache_config *cc = kvq_cache_config_of(f->c);
        size_t se, lo;
        if (cc->recent_f16 && kvq_cache_f16_view(f->c, s->pos0, &se, &lo) == KVQ_OK &&
            kvq_cache_f16_row(f->c, 0, ATTN_HEAD, s->pos0 + T - 1)) {
            const size_t hd = (size_t)cc->n_kv_heads * (size_t)f->d, n = s->pos0 + T - lo;
            uint16_t *rk = malloc(n * hd * sizeof *rk), *rv = malloc(n * hd * sizeof *rv);
            int held = rk && rv;
            for (size_t t = 0; held && t < n; t++)
                for (int h = 0; h < cc->n_kv_heads && held; h++) {
                    const uint16_t *hk = kvq_cache_f16_row(f->c, 0, h, lo + t), *hv = kvq_cache_f16_row(f->c, 1, h, lo + t);
                    held = hk && hv;
                    if (held) {
                        memcpy(rk + t * hd + (size_t)h * f->d, hk, (size_t)f->d * sizeof *hk);
                        memcpy(rv + t * hd + (size_t)h * f->d, hv, (size_t)f->d * sizeof *hv);
                    }
                }
            CHECKF(held, "causal-tiled d=%d: the view's f16 rows are not all held", s->dim);
            if (held) {
                const struct kvq_attn_recent rec = {rk, rv, lo, n};
                CHECK_OK(kvq_attn_causal_recent(f->c, ATTN_HEAD, s->pos0, T, q, nq, f->scale, part, f->ws, &rec));
                CHECKF(!memcmp(part, out, T * stride * sizeof *part),
                       "causal-tiled d=%d: kvq_attn_causal_recent differs from kvq_attn_causal", s->dim);
            }
            free(rk);
            free(rv);
        }
        free(part);
    }
}

static void attn_exec(void *p, const struct tcase *c, enum backend b)
{
    struct attn_fx *f = p;
    const struct shape *s = c->sh;
    for (int i = 0; i < s->n_probes; i++) {
        const int nq = s->probes[i].n_q;
        const float *q = f->q + f->off[i];
        float *out = f->out[b != BE_REF] + f->off[i];
        if (c->op == OP_CAUSAL_TILED) {
            causal_tiled_exec(f, c, b, i, q, out);
        } else if (c->op == OP_CAUSAL && b != BE_REF) {
            CHECK_OK(kvq_attn_causal(f->c, ATTN_HEAD, s->pos0, s->probes[i].ctx, q, nq, f->scale, out, f->ws));
        } else if (c->op == OP_CAUSAL) {
            const size_t stride = (size_t)nq * (size_t)f->d;
            for (size_t t = 0; t < s->probes[i].ctx; t++)
                CHECK_OK(kvq_attn_decode_ref(f->c, ATTN_HEAD, s->pos0 + t + 1, q + t * stride, nq, f->scale,
                                             out + t * stride, f->ws));
        } else if (b == BE_REF) {
            CHECK_OK(kvq_attn_decode_ref(f->c, ATTN_HEAD, s->probes[i].ctx, q, nq, f->scale, out, f->ws));
        } else if (b == attn_dispatch(f->d)) { /* what the library picks: through its public entry point */
            CHECK_OK(kvq_attn_decode(f->c, ATTN_HEAD, s->probes[i].ctx, q, nq, f->scale, out, f->ws));
        } else {
            CHECK_OK(kvq_attn_decode_kernels(kernel_set(b), f->c, ATTN_HEAD, s->probes[i].ctx, q, nq, f->scale, out,
                                             f->ws));
        }
    }
}

/* The largest relative error (L2 over a GQA group's outputs) of any decode. */
static double attn_error(void *p, const struct tcase *c, enum backend b)
{
    struct attn_fx *f = p;
    const size_t group = (size_t)f->d;
    double worst = 0;
    (void)b;
    for (int i = 0; i < c->sh->n_probes; i++) {
        const size_t n = (size_t)c->sh->probes[i].n_q * group, end = f->off[i] + probe_floats(c, i);
        for (size_t o = f->off[i]; o < end; o += n)
            worst = fmax(worst, test_rel_err(f->out[1] + o, f->out[0] + o, n));
    }
    return worst;
}

static int attn_supports(const struct tcase *c, enum backend b)
{
    const int d = c->sh->dim;
    if (c->op == OP_CAUSAL)
        return b == attn_dispatch(d);
    if (c->op == OP_CAUSAL_TILED)
        return b == BE_SCALAR || b == BE_LIB || (b == BE_AVX2 && d % 8 == 0) || (b == BE_AVX512 && d % 16 == 0);
    return b == BE_SCALAR || (b == BE_AVX2 && d % 8 == 0) || (b == BE_AVX512 && d % 16 == 0);
}

/* ---- GPU attention -------------------------------------------------------- */

enum { ATTEND_HEADS = 2, ATTEND_LENS = 4 };

struct attend_fx {
    int d, Hq, nb; /* nb: batch entries (every length, then the longest again) */
    int small;     /* KVQ_CUDA_TEST_SMALL=1: shorter sequences, no 128-split call */
    size_t lens[ATTEND_LENS];
    int seqs[ATTEND_LENS + 1];
    float scale;
    kvq_cache *cpu[ATTEND_LENS];
    float *q, *ref, *out; /* [nb][Hq][d] */
    kvq_cuda_cache *g;
    float *qd, *od;
};

static void attend_free(void *p)
{
    struct attend_fx *f = p;
    for (int i = 0; i < ATTEND_LENS; i++)
        kvq_cache_free(f->cpu[i]);
    free(f->q);
    free(f->ref);
    free(f->out);
    kvq_cuda_cache_free(f->g);
    kvq_cuda_free(f->qd);
    kvq_cuda_free(f->od);
    free(f);
}

static void *attend_setup(const struct tcase *c)
{
    static const size_t full[ATTEND_LENS] = {1, 77, 600, 3001}, small[ATTEND_LENS] = {1, 77, 150, 300};
    const char *sm = getenv("KVQ_CUDA_TEST_SMALL"); /* shorter sequences, for compute-sanitizer runs */
    struct attend_fx *f = calloc(1, sizeof *f);
    f->d = c->sh->dim;
    f->Hq = ATTEND_HEADS * c->sh->G;
    f->nb = ATTEND_LENS + 1;
    f->scale = 1.0f / sqrtf((float)f->d);
    f->small = sm && sm[0] == '1';
    memcpy(f->lens, f->small ? small : full, sizeof f->lens);
    for (int i = 0; i < ATTEND_LENS; i++) {
        f->seqs[i] = i;
        f->cpu[i] = filled_cache(c, ATTEND_HEADS, f->lens[i], case_seed(c)); /* one seed: one config */
    }
    f->seqs[ATTEND_LENS] = ATTEND_LENS - 1;
    const size_t n = (size_t)f->nb * (size_t)f->Hq * (size_t)f->d;
    f->q = test_outlier_rows((size_t)f->nb * (size_t)f->Hq, f->d, case_seed(c) + 3, 1.0);
    for (size_t i = 0; i < n; i++)
        f->q[i] *= 2.0f; /* a peaky softmax */
    f->ref = malloc(n * sizeof(float));
    f->out = malloc(n * sizeof(float));
    return f;
}

static enum kvq_cuda_kernel cuda_kernel(enum backend b)
{
    return b == BE_CUDA_FUSED ? KVQ_CUDA_KERNEL_FUSED : b == BE_CUDA_REF ? KVQ_CUDA_KERNEL_REF : KVQ_CUDA_KERNEL_AUTO;
}

/* One attend call into od, which is NaN-filled first (unwritten outputs fail). */
static void attend_call(struct attend_fx *f, enum backend b, int n_splits)
{
    const size_t bytes = (size_t)f->nb * (size_t)f->Hq * (size_t)f->d * sizeof(float);
    const struct kvq_cuda_attn_opts o = {.kernel = cuda_kernel(b), .n_splits = n_splits};
    CHECK_OK(kvq_cuda_memset(f->od, 0xff, bytes));
    CHECK_OK(kvq_cuda_cache_attend(f->g, f->nb, f->seqs, f->qd, f->Hq, f->scale, f->od, &o));
    CHECK_OK(kvq_cuda_synchronize());
}

static void attend_exec(void *p, const struct tcase *c, enum backend b)
{
    struct attend_fx *f = p;
    const size_t per = (size_t)f->Hq * (size_t)f->d;
    if (b == BE_REF) { /* kvq_attn_decode_ref, per batch entry and KV head */
        kvq_attn_workspace *ws = NULL;
        CHECK_OK(kvq_attn_workspace_create(f->d, c->sh->G, f->lens[ATTEND_LENS - 1], &ws));
        for (int i = 0; i < f->nb && ws; i++)
            for (int h = 0; h < ATTEND_HEADS; h++) {
                const size_t o = (size_t)i * per + (size_t)h * (size_t)c->sh->G * (size_t)f->d;
                CHECK_OK(kvq_attn_decode_ref(f->cpu[f->seqs[i]], h, f->lens[f->seqs[i]], f->q + o, c->sh->G,
                                             f->scale, f->ref + o, ws));
            }
        kvq_attn_workspace_free(ws);
        return;
    }
    if (!f->g) {
        struct kvq_cuda_cache_config cfg;
        kvq_cuda_cache_config_default(&cfg, ATTEND_HEADS, f->d, f->lens[ATTEND_LENS - 1], f->nb); /* max_seqs bounds a batch */
        cfg.cache = *kvq_cache_config_of(f->cpu[0]);
        cfg.cache.max_tokens = f->lens[ATTEND_LENS - 1];
        CHECK_OK(kvq_cuda_cache_create(&cfg, &f->g));
        for (int i = 0; i < ATTEND_LENS && f->g; i++)
            CHECK_OK(kvq_cuda_cache_upload(f->g, i, f->cpu[i]));
        f->qd = test_to_dev(f->q, (size_t)f->nb * per);
        CHECK_OK(kvq_cuda_malloc((void **)&f->od, (size_t)f->nb * per * sizeof(float)));
    }
    if (f->g && f->qd && f->od)
        attend_call(f, b, 0);
}

/* The largest relative error of any (sequence, KV head); the fused kernel
 * also with forced split counts 1, 4, 7 and 128: 128 (94 on 32-token
 * stages) is more than one wave of blocks on a GPU of up to 230 SMs, where
 * the integer-score kernel reads a query block made by the prep kernel
 * instead of preparing its own queries, and the split lengths taper (not in
 * KVQ_CUDA_TEST_SMALL runs). */
static double attend_error(void *p, const struct tcase *c, enum backend b)
{
    struct attend_fx *f = p;
    if (!f->g || !f->qd || !f->od)
        return INFINITY;
    const size_t group = (size_t)c->sh->G * (size_t)f->d, n = (size_t)f->nb * ATTEND_HEADS;
    if (b == BE_CUDA_FUSED)
        CHECKF(kvq_cuda_fast_supported(f->g, f->Hq), "the fused kernel does not apply");
    /* 0: the call attend_exec made (the kernel's own count); every kernel
     * splits (the reference and group kernels as the fused one) */
    static const int splits[] = {0, 1, 4, 7, 128};
    double worst = 0;
    for (int k = 0; k < COUNT(splits) - f->small; k++) {
        if (splits[k])
            attend_call(f, b, splits[k]);
        CHECK_OK(kvq_cuda_memcpy_d2h(f->out, f->od, n * group * sizeof(float)));
        for (size_t i = 0; i < n; i++)
            worst = fmax(worst, test_rel_err(f->out + i * group, f->ref + i * group, group));
    }
    return worst;
}

/* The fused kernel (kvq_cuda.h): head_dim 128, up to 8 query heads per KV
 * head, K tq3j/tq3/f16, V tq3/f16; the reference kernel and AUTO: anything. */
static int attend_supports(const struct tcase *c, enum backend b)
{
    if (b == BE_CUDA_FUSED)
        return c->sh->dim == 128 && c->sh->G <= 8 && (c->tk == T3J || c->tk == T3 || c->tk == F16) &&
               (c->tv == T3 || c->tv == F16);
    return b == BE_CUDA || b == BE_CUDA_REF;
}

/* Host rows, the reference outputs and their device copies: what the
 * fixtures of the GPU ops below hold. */
struct gpu_rows {
    float *k, *v, *q, *ref, *out;
    kvq_cuda_cache *g;
    float *kd, *vd, *qd, *od;
};

/* n_kv KV rows of d (keys with outliers of 8, values of 3), nq query rows
 * doubled for a peaky softmax, and room for nq outputs. */
static void gpu_rows_alloc(struct gpu_rows *r, const struct tcase *c, size_t n_kv, size_t nq, int d)
{
    r->k = test_outlier_rows(n_kv, d, case_seed(c) * 3 + 1, 8.0);
    r->v = test_outlier_rows(n_kv, d, case_seed(c) * 3 + 2, 3.0);
    r->q = test_outlier_rows(nq, d, case_seed(c) + 3, 1.0);
    for (size_t i = 0; i < nq * (size_t)d; i++)
        r->q[i] *= 2.0f;
    r->ref = calloc(nq * (size_t)d, sizeof(float));
    r->out = calloc(nq * (size_t)d, sizeof(float));
}

static void gpu_rows_free(struct gpu_rows *r)
{
    free(r->k);
    free(r->v);
    free(r->q);
    free(r->ref);
    free(r->out);
    kvq_cuda_cache_free(r->g);
    kvq_cuda_free(r->kd);
    kvq_cuda_free(r->vd);
    kvq_cuda_free(r->qd);
    kvq_cuda_free(r->od);
}

/* ---- GPU attention with f16 override rows ---------------------------------- */

/* Sequences of WIN_LENS lengths (one shorter than the sinks), appended to the
 * device cache by the GPU encoder: all but the last page's tokens at once,
 * then those (the longest piece whose prefix views the ring keeps exact). The reference for a view of n tokens is a CPU cache
 * with the same config (recent window, WIN_SINKS sinks) holding exactly those
 * n tokens: what token-by-token generation reads. Checked: the batch's full
 * views (attend), and every view inside the last piece of WIN_PREFIX_SEQ
 * (attend_prefix, a prefill chunk's causal views). */
enum { WIN_HEADS = 2, WIN_LENS = 4, WIN_SINKS = 4, WIN_PREFIX_SEQ = 2 };

struct win_fx {
    int d, Hq, G, P;
    size_t lens[WIN_LENS];
    struct kvq_cache_config cfg;
    struct gpu_rows r;     /* k, v [max len][WIN_HEADS][d], shared by every sequence;
                              q, ref, out [max len][Hq][d]: entry i's query is row i */
    int n_entries;         /* of the last call */
};

static void win_free(void *p)
{
    struct win_fx *f = p;
    gpu_rows_free(&f->r);
    free(f);
}

static void *win_setup(const struct tcase *c)
{
    static const size_t full[WIN_LENS] = {3, 77, 600, 3001}, small[WIN_LENS] = {3, 77, 150, 300};
    const char *sm = getenv("KVQ_CUDA_TEST_SMALL");
    struct win_fx *f = calloc(1, sizeof *f);
    f->d = c->sh->dim;
    f->G = c->sh->G;
    f->Hq = WIN_HEADS * f->G;
    f->P = c->sh->page_tokens;
    memcpy(f->lens, sm && sm[0] == '1' ? small : full, sizeof f->lens);
    const size_t n = f->lens[WIN_LENS - 1];
    case_cache_config(c, WIN_HEADS, n, case_seed(c), &f->cfg);
    f->cfg.recent_f16 = 1;
    f->cfg.sink_tokens = WIN_SINKS;
    f->cfg.center_k = c->sh->center;
    gpu_rows_alloc(&f->r, c, n * WIN_HEADS, n * (size_t)f->Hq, f->d);
    return f;
}

/* Rows of the last piece of a sequence of n tokens: its last page's. */
static size_t win_piece(const struct win_fx *f, size_t n)
{
    return n - (n - 1) / (size_t)f->P * (size_t)f->P;
}

/* The entries of the check: (sequence, view length) pairs. */
static int win_entries(const struct win_fx *f, int *seqs, size_t *views)
{
    int m = 0;
    for (int i = 0; i < WIN_LENS; i++) {
        seqs[m] = i;
        views[m++] = f->lens[i];
    }
    const size_t n = f->lens[WIN_PREFIX_SEQ];
    for (size_t t = n - win_piece(f, n) + 1; t <= n; t++) {
        seqs[m] = WIN_PREFIX_SEQ;
        views[m++] = t;
    }
    return m;
}

static void win_exec(void *p, const struct tcase *c, enum backend b)
{
    struct win_fx *f = p;
    (void)c;
    int seqs[WIN_LENS + 128];
    size_t views[WIN_LENS + 128];
    const int m = win_entries(f, seqs, views);
    const size_t per = (size_t)f->Hq * (size_t)f->d, row = (size_t)WIN_HEADS * (size_t)f->d;
    f->n_entries = m;
    if (b == BE_REF) { /* a CPU cache of exactly n tokens per view */
        kvq_attn_workspace *ws = NULL;
        CHECK_OK(kvq_attn_workspace_create(f->d, f->G, f->lens[WIN_LENS - 1], &ws));
        for (int e = 0; e < m && ws; e++) {
            kvq_cache *kc = NULL;
            struct kvq_cache_config cc = f->cfg;
            cc.max_tokens = views[e];
            CHECK_OK(kvq_cache_create(&cc, &kc));
            if (kc)
                CHECK_OK(kvq_cache_append(kc, views[e], f->r.k, f->r.v));
            for (int h = 0; h < WIN_HEADS && kc; h++) {
                const size_t o = (size_t)e * per + (size_t)h * (size_t)f->G * (size_t)f->d;
                CHECK_OK(kvq_attn_decode_ref(kc, h, views[e], f->r.q + o, f->G, 1.0f / sqrtf((float)f->d),
                                             f->r.ref + o, ws));
            }
            kvq_cache_free(kc);
        }
        kvq_attn_workspace_free(ws);
        return;
    }
    if (!f->r.g) {
        struct kvq_cuda_cache_config cfg;
        kvq_cuda_cache_config_default(&cfg, WIN_HEADS, f->d, f->lens[WIN_LENS - 1], WIN_LENS);
        cfg.cache = f->cfg;
        CHECK_OK(kvq_cuda_cache_create(&cfg, &f->r.g));
        f->r.kd = test_to_dev(f->r.k, f->lens[WIN_LENS - 1] * row);
        f->r.vd = test_to_dev(f->r.v, f->lens[WIN_LENS - 1] * row);
        f->r.qd = test_to_dev(f->r.q, (size_t)m * per);
        CHECK_OK(kvq_cuda_malloc((void **)&f->r.od, (size_t)m * per * sizeof(float)));
        for (int i = 0; i < WIN_LENS && f->r.g && f->r.kd && f->r.vd; i++) {
            const size_t n = f->lens[i], a = n - win_piece(f, n);
            CHECK_OK(kvq_cuda_cache_append(f->r.g, i, a, f->r.kd, f->r.vd));
            CHECK_OK(kvq_cuda_cache_append(f->r.g, i, n - a, f->r.kd + a * row, f->r.vd + a * row));
        }
    }
    if (!f->r.g || !f->r.qd || !f->r.od)
        return;
    const struct kvq_cuda_attn_opts o = {.kernel = cuda_kernel(b), .n_splits = 0};
    const float scale = 1.0f / sqrtf((float)f->d);
    CHECK_OK(kvq_cuda_memset(f->r.od, 0xff, (size_t)m * per * sizeof(float)));
    CHECK_OK(kvq_cuda_cache_attend(f->r.g, WIN_LENS, seqs, f->r.qd, f->Hq, scale, f->r.od, &o));
    CHECK_OK(kvq_cuda_cache_attend_prefix(f->r.g, m - WIN_LENS, seqs + WIN_LENS, views + WIN_LENS,
                                          f->r.qd + WIN_LENS * per, f->Hq, scale, f->r.od + WIN_LENS * per, &o));
    CHECK_OK(kvq_cuda_synchronize());
}

static double win_error(void *p, const struct tcase *c, enum backend b)
{
    struct win_fx *f = p;
    (void)c;
    if (!f->r.g || !f->r.od)
        return INFINITY;
    if (b == BE_CUDA_FUSED)
        CHECKF(kvq_cuda_fast_supported(f->r.g, f->Hq), "the fused kernel does not apply");
    const size_t group = (size_t)f->G * (size_t)f->d, n = (size_t)f->n_entries * WIN_HEADS;
    CHECK_OK(kvq_cuda_memcpy_d2h(f->r.out, f->r.od, n * group * sizeof(float)));
    double worst = 0;
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, test_rel_err(f->r.out + i * group, f->r.ref + i * group, group));
    return worst;
}

/* ---- GPU prefill chunks ------------------------------------------------------ */

/* Two sequences: seq 0 takes one chunk from position 0 (its sinks and first
 * pages inside it), seq 1 a past of two pages and 5 tokens (appended, so
 * the chunk starts off a page boundary) and then a chunk. Every position of
 * both chunks is checked against token-by-token generation on a CPU cache
 * with the same config (appended one token at a time, attended by
 * kvq_attn_decode_ref after each). */
enum { PF_HEADS = 2 };

struct pf_fx {
    int d, Hq, G;
    size_t n0, past, n1;    /* seq 0's chunk; seq 1's past and chunk */
    struct kvq_cache_config cfg;
    struct gpu_rows r;      /* k, v [past + n1][PF_HEADS][d] (seq 0 uses the first n0);
                               q, ref, out [n0 + n1][Hq][d]: the views', seq 0's first */
    kvq_cuda_prefill_ws *ws; /* prefill-dense: lent to r.g */
};

static void pf_free(void *p)
{
    struct pf_fx *f = p;
    gpu_rows_free(&f->r);
    kvq_cuda_prefill_ws_free(f->ws);
    free(f);
}

static void *pf_setup(const struct tcase *c)
{
    const char *sm = getenv("KVQ_CUDA_TEST_SMALL");
    const int small = sm && sm[0] == '1';
    struct pf_fx *f = calloc(1, sizeof *f);
    f->d = c->sh->dim;
    f->G = c->sh->G;
    f->Hq = PF_HEADS * f->G;
    f->n0 = small ? 90 : 200;
    f->past = 2 * (size_t)c->sh->page_tokens + 5;
    f->n1 = small ? 150 : 420;
    const size_t n = f->past + f->n1 > f->n0 ? f->past + f->n1 : f->n0, nq = f->n0 + f->n1;
    case_cache_config(c, PF_HEADS, n, case_seed(c), &f->cfg);
    f->cfg.recent_f16 = c->sh->window;
    f->cfg.sink_tokens = c->sh->sinks;
    f->cfg.center_k = c->sh->center;
    gpu_rows_alloc(&f->r, c, n * PF_HEADS, nq * (size_t)f->Hq, f->d);
    return f;
}

static int pf_supports(const struct tcase *c, enum backend b)
{
    (void)c;
    return b == BE_CUDA;
}

/* Token-by-token on a CPU cache: n tokens appended one at a time; after
 * token t >= from, query row q_row + t - from of every head attends. */
static void pf_ref_seq(struct pf_fx *f, size_t from, size_t n, size_t q_row, kvq_attn_workspace *ws)
{
    const size_t row = (size_t)PF_HEADS * (size_t)f->d, per = (size_t)f->Hq * (size_t)f->d;
    kvq_cache *kc = NULL;
    CHECK_OK(kvq_cache_create(&f->cfg, &kc));
    for (size_t t = 0; t < n && kc; t++) {
        CHECK_OK(kvq_cache_append(kc, 1, f->r.k + t * row, f->r.v + t * row));
        if (t < from)
            continue;
        const size_t e = q_row + t - from;
        for (int h = 0; h < PF_HEADS; h++) {
            const size_t o = e * per + (size_t)h * (size_t)f->G * (size_t)f->d;
            CHECK_OK(kvq_attn_decode_ref(kc, h, t + 1, f->r.q + o, f->G, 1.0f / sqrtf((float)f->d), f->r.ref + o, ws));
        }
    }
    kvq_cache_free(kc);
}

static void pf_exec(void *p, const struct tcase *c, enum backend b)
{
    struct pf_fx *f = p;
    const size_t row = (size_t)PF_HEADS * (size_t)f->d, per = (size_t)f->Hq * (size_t)f->d, nq = f->n0 + f->n1;
    const size_t n = f->past + f->n1 > f->n0 ? f->past + f->n1 : f->n0;
    if (b == BE_REF) {
        kvq_attn_workspace *ws = NULL;
        CHECK_OK(kvq_attn_workspace_create(f->d, f->G, n, &ws));
        if (ws) {
            pf_ref_seq(f, 0, f->n0, 0, ws);
            pf_ref_seq(f, f->past, f->past + f->n1, f->n0, ws);
        }
        kvq_attn_workspace_free(ws);
        return;
    }
    if (!f->r.g) {
        struct kvq_cuda_cache_config cfg;
        kvq_cuda_cache_config_default(&cfg, PF_HEADS, f->d, n, 2);
        cfg.cache = f->cfg;
        cfg.max_q_per_kv = f->G;
        CHECK_OK(kvq_cuda_cache_create(&cfg, &f->r.g));
        f->r.kd = test_to_dev(f->r.k, n * row);
        f->r.vd = test_to_dev(f->r.v, n * row);
        f->r.qd = test_to_dev(f->r.q, nq * per);
        CHECK_OK(kvq_cuda_malloc((void **)&f->r.od, nq * per * sizeof(float)));
    }
    if (!f->r.g || !f->r.kd || !f->r.vd || !f->r.qd || !f->r.od)
        return;
    CHECKF(kvq_cuda_prefill_supported(f->r.g, f->Hq), "the chunk kernel takes this config");
    if (c->op == OP_PREFILL_DENSE && !f->ws) {
        /* segments of 128 positions: the pasts here take 2 to 5 of them */
        CHECK_OK(kvq_cuda_prefill_ws_create(PF_HEADS, f->Hq, f->d, f->n0 > f->n1 ? f->n0 : f->n1,
                                            c->sh->seg ? (size_t)c->sh->seg : 128, &f->ws));
        kvq_cuda_cache_set_prefill_ws(f->r.g, f->ws);
    }
    const float scale = 1.0f / sqrtf((float)f->d);
    for (int s = 0; s < 2; s++)
        CHECK_OK(kvq_cuda_cache_truncate(f->r.g, s, 0));
    CHECK_OK(kvq_cuda_memset(f->r.od, 0xff, nq * per * sizeof(float)));
    CHECK_OK(kvq_cuda_cache_prefill(f->r.g, 0, f->n0, f->r.kd, f->r.vd, f->r.qd, f->Hq, scale, f->r.od));
    CHECK_OK(kvq_cuda_cache_append(f->r.g, 1, f->past, f->r.kd, f->r.vd));
    CHECK_OK(kvq_cuda_cache_prefill(f->r.g, 1, f->n1, f->r.kd + f->past * row, f->r.vd + f->past * row,
                                    f->r.qd + f->n0 * per, f->Hq, scale, f->r.od + f->n0 * per));
    CHECK_OK(kvq_cuda_synchronize());
}

static double pf_error(void *p, const struct tcase *c, enum backend b)
{
    struct pf_fx *f = p;
    (void)c;
    (void)b;
    if (!f->r.g || !f->r.od)
        return INFINITY;
    const size_t group = (size_t)f->G * (size_t)f->d, n = (f->n0 + f->n1) * PF_HEADS;
    CHECK_OK(kvq_cuda_memcpy_d2h(f->r.out, f->r.od, n * group * sizeof(float)));
    double worst = 0;
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, test_rel_err(f->r.out + i * group, f->r.ref + i * group, group));
    /* the same inputs again give the same bits: no block reads memory it
     * did not order (a race or an unwritten buffer would show here first,
     * where the decoder only sees logits drift between runs) */
    float *again = malloc(n * group * sizeof(float));
    if (again) {
        pf_exec(p, c, b);
        CHECK_OK(kvq_cuda_memcpy_d2h(again, f->r.od, n * group * sizeof(float)));
        size_t diff = 0;
        for (size_t i = 0; i < n * group; i++)
            diff += memcmp(&again[i], &f->r.out[i], sizeof(float)) != 0;
        CHECKF(diff == 0, "%zu of %zu outputs differ between two identical runs", diff, n * group);
        free(again);
    }
    return worst;
}

/* ---- the decoder's backend ops --------------------------------------------- */

static enum dop dop_of(enum op op)
{
    return (enum dop)(op - OP_D_EMBED);
}

static void *d_setup(const struct tcase *c)
{
    return dop_setup(dop_of(c->op), c->tk);
}

static int d_supports(const struct tcase *c, enum backend b)
{
    (void)c;
    return b == BE_CPU || b == BE_CUDA;
}

static void d_exec(void *fx, const struct tcase *c, enum backend b)
{
    (void)c;
    if (b == BE_REF)
        dop_reference(fx);
    else
        dop_run(fx, b == BE_CUDA);
}

static double d_error(void *fx, const struct tcase *c, enum backend b)
{
    (void)c;
    return fx ? dop_error(fx, b == BE_CUDA) : INFINITY;
}

static const struct shape SH_DEC = {.dim = 128}; /* the bundled model's head dim */

/* ---- the op table --------------------------------------------------------- */

struct op_impl {
    const char *name;
    int family; /* ops of one family share a fixture (same type and shape) */
    const char *what, *measure;
    void *(*setup)(const struct tcase *c);
    void (*free)(void *fx);
    int (*supports)(const struct tcase *c, enum backend b);
    void (*exec)(void *fx, const struct tcase *c, enum backend b); /* BE_REF: the reference; what --perf times */
    double (*error)(void *fx, const struct tcase *c, enum backend b);
};

#define ROW_OP row_setup, row_free, row_supports, row_exec, row_error
#define ROT_OP rot_setup, rot_free, rot_supports, rot_exec, rot_error
#define ATTN_OP attn_setup, attn_free, attn_supports, attn_exec, attn_error
#define DEC_OP d_setup, dop_free, d_supports, d_exec, d_error
static const struct op_impl OPS[OP_COUNT] = {
    [OP_ENCODE] = {"encode", 0, "one row per call (traits encode); the GPU encoder through a device cache (V: another type)",
                   "rows whose status, bytes or check_row verdict differ (after an error: any byte written)", ROW_OP},
    [OP_DECODE] = {"decode", 0, "one packed row per call (traits decode)", "rows whose decoded bits differ", ROW_OP},
    [OP_SCORE] = {"score", 0, "q . k on a packed row, prepared query (traits score)", "scores whose bits differ",
                  ROW_OP},
    [OP_ROT] = {"rot", 1, "y = R x", "hadamard: vectors whose bits differ; dct: max |y - ref| / |x|; "
                "gauss: max |y - ref| / (sqrt(d) |x|)", ROT_OP},
    [OP_ROT_T] = {"rot_t", 1, "x = R^T y", "as rot", ROT_OP},
    [OP_CACHE] = {"cache", 2, "kvq_cache_append in pieces + kvq_cache_read, 3 heads",
                  "rows that differ from the reference round trip (+ f32 input, partial read)", cache_setup,
                  cache_free, cache_supports, cache_exec, cache_error},
    [OP_ATTN] = {"attn", 3, "decode attention, one position, a GQA group of one KV head",
                 "max relative L2 error of a group's outputs", ATTN_OP},
    [OP_CAUSAL] = {"causal", 4, "kvq_attn_causal over a chunk of positions",
                   "max relative L2 error of a position's outputs", ATTN_OP},
    [OP_CAUSAL_TILED] = {"causal-tiled", 4, "kvq_attn_causal's tiled chunk kernels against one fused decode per position",
                         "max relative L2 error of a position's outputs", ATTN_OP},
    [OP_ATTEND] = {"attend", 5, "kvq_cuda_cache_attend: a batch of sequences, every KV head",
                   "max relative L2 error of a (sequence, KV head) group", attend_setup, attend_free, attend_supports,
                   attend_exec, attend_error},
    [OP_ATTEND_WIN] = {"attend-window", 6, "kvq_cuda_cache_attend + _prefix over f16 sinks and the recent window",
                       "max relative L2 error of a (view, KV head) group against a CPU cache of that view",
                       win_setup, win_free, attend_supports, win_exec, win_error},
    [OP_PREFILL] = {"prefill", 7, "kvq_cuda_cache_prefill: chunks from position 0 and after a past, every position",
                    "max relative L2 error of a (position, KV head) group against token-by-token on a CPU cache",
                    pf_setup, pf_free, pf_supports, pf_exec, pf_error},
    [OP_PREFILL_DENSE] = {"prefill-dense", 8,
                          "kvq_cuda_cache_prefill with a kvq_cuda_prefill_ws (the past decoded into f16, dense "
                          "attention), in segments of 128 positions",
                          "as prefill", pf_setup, pf_free, pf_supports, pf_exec, pf_error},
    [OP_D_EMBED] = {"embed", 9, "backend embed: rows of the bundled model's table times arch.embed_scale",
                    "max |y - ref| / max |ref|", DEC_OP},
    [OP_D_NORM] = {"norm", 10, "backend norm at each site (post-attn, post-ffn: y += norm(x)) and norm kind",
                   "as embed", DEC_OP},
    [OP_D_ROPE] = {"qkv-rope", 11,
                   "backend qkv_rope: per-head q/k norm, RoPE kind, rotary dim, a windowed layer's local base",
                   "as embed (q, k and v of 3 rows)", DEC_OP},
    [OP_D_GLU] = {"glu", 12, "backend glu: act(gate) * up", "as embed", DEC_OP},
    [OP_D_LM] = {"lm-head", 13, "backend lm_head: final norm, LM head, soft-cap, argmax",
                 "as embed over the logits; the argmax is checked to be the first largest logit", DEC_OP},
};

/* ---- the case list and its filter ------------------------------------------ */

static struct tcase *cases;
static size_t n_cases, cap_cases;

static void add_case(enum op op, int tk, int tv, const struct shape *sh)
{
    if (n_cases == cap_cases) {
        cap_cases = cap_cases ? 2 * cap_cases : 1024;
        cases = realloc(cases, cap_cases * sizeof *cases);
    }
    cases[n_cases++] = (struct tcase){op, tk, tv, sh};
}

static void build_cases(void)
{
    for (int t = 0; t < KVQ_TYPE_COUNT; t++) {
        for (int i = 0; i < COUNT(SH_ROW); i++)
            if (kvq_type_check_dim((enum kvq_type)t, SH_ROW[i].dim) == KVQ_OK)
                for (int op = OP_ENCODE; op <= OP_SCORE; op++)
                    add_case((enum op)op, t, -1, &SH_ROW[i]);
        if (type_class(t) != CL_BASE)
            for (int op = OP_ENCODE; op <= OP_SCORE; op++)
                add_case((enum op)op, t, -1, &SH_ROW_IDENTITY[0]);
        for (int i = 0; i < COUNT(SH_ROW_PAGES); i++)
            if (kvq_type_check_dim((enum kvq_type)t, SH_ROW_PAGES[i].dim) == KVQ_OK)
                add_case(OP_ENCODE, t, -1, &SH_ROW_PAGES[i]);
    }
    for (int r = 0; r < N_ROTS; r++) {
        const int had = ROTS[r].kind == KVQ_ROT_HADAMARD;
        for (int i = 0; i < (had ? COUNT(SH_HAD) : COUNT(SH_LIBROT)); i++)
            for (int op = OP_ROT; op <= OP_ROT_T; op++)
                add_case((enum op)op, r, -1, had ? &SH_HAD[i] : &SH_LIBROT[i]);
    }
    for (int s = 0; s < COUNT(SCENES); s++) {
        const struct scene *sc = &SCENES[s];
        const int np = sc->n_pairs ? sc->n_pairs : KVQ_TYPE_COUNT * KVQ_TYPE_COUNT;
        for (int i = 0; i < sc->n_shapes; i++)
            for (int p = 0; p < np; p++) {
                const int tk = sc->n_pairs ? sc->pairs[p][0] : p / KVQ_TYPE_COUNT;
                const int tv = sc->n_pairs ? sc->pairs[p][1] : p % KVQ_TYPE_COUNT;
                const int d = sc->shapes[i].dim;
                if (kvq_type_check_dim((enum kvq_type)tk, d) == KVQ_OK &&
                    kvq_type_check_dim((enum kvq_type)tv, d) == KVQ_OK)
                    add_case(sc->op, tk, tv, &sc->shapes[i]);
            }
    }
    for (int i = 0; i < COUNT(ATTEND); i++)
        add_case(OP_ATTEND, ATTEND[i].tk, ATTEND[i].tv, &ATTEND[i].sh);
    for (int i = 0; i < COUNT(ATTEND_WIN); i++)
        add_case(OP_ATTEND_WIN, ATTEND_WIN[i].tk, ATTEND_WIN[i].tv, &ATTEND_WIN[i].sh);
    for (int i = 0; i < COUNT(PREFILL); i++)
        add_case(OP_PREFILL, PREFILL[i].tk, PREFILL[i].tv, &PREFILL[i].sh);
    for (int i = 0; i < COUNT(PREFILL); i++) /* the dims the dense path takes */
        if (PREFILL[i].sh.dim == 64 || PREFILL[i].sh.dim == 128)
            add_case(OP_PREFILL_DENSE, PREFILL[i].tk, PREFILL[i].tv, &PREFILL[i].sh);
    for (int op = OP_D_EMBED; op <= OP_D_LM; op++) {
        int n;
        dop_table(dop_of((enum op)op), &n);
        for (int v = 0; v < n; v++)
            add_case((enum op)op, v, -1, &SH_DEC);
    }
}

static const char *opt_ops, *opt_types, *opt_backends;

/* 1 when list (comma-separated names; a trailing '*' matches a prefix) names
 * name, or list is NULL. */
static int listed(const char *list, const char *name)
{
    if (!list)
        return 1;
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        if (n && p[n - 1] == '*' ? strncmp(name, p, n - 1) == 0 : strlen(name) == n && strncmp(name, p, n) == 0)
            return 1;
        p += n + (p[n] == ',');
    }
    return 0;
}

static const char *type_label(const struct tcase *c, char *buf, size_t n)
{
    if (c->op == OP_ROT || c->op == OP_ROT_T)
        return ROTS[c->tk].name;
    if (c->op >= OP_D_EMBED) {
        int nv;
        return dop_table(dop_of(c->op), &nv)[c->tk].name;
    }
    if (c->tv < 0)
        return tname(c->tk);
    snprintf(buf, n, "%s/%s", tname(c->tk), tname(c->tv));
    return buf;
}

static int selected(const struct tcase *c)
{
    char pair[32];
    return listed(opt_ops, OPS[c->op].name) &&
           (listed(opt_types, type_label(c, pair, sizeof pair)) ||
            (c->tv >= 0 && (listed(opt_types, tname(c->tk)) || listed(opt_types, tname(c->tv)))));
}

static const char *shape_label(const struct tcase *c, char *buf, size_t n)
{
    const struct shape *s = c->sh;
    int at = snprintf(buf, n, "d=%d", s->dim);
    if (c->op <= OP_SCORE && s->page_tokens)
        at += snprintf(buf + at, n - (size_t)at, " P=%d", s->page_tokens);
    if (c->op <= OP_SCORE && s->rot != KVQ_ROT_HADAMARD)
        at += snprintf(buf + at, n - (size_t)at, " %s", kvq_rot_kind_name(s->rot));
    if (c->op == OP_CACHE || c->op == OP_ATTN || c->op == OP_CAUSAL || c->op == OP_CAUSAL_TILED)
        at += snprintf(buf + at, n - (size_t)at, " P=%d n=%zu%s%s sinks=%d",
                       s->page_tokens ? s->page_tokens : KVQ_DEFAULT_PAGE_TOKENS, s->n_tokens,
                       s->center ? " centred" : "", s->window ? " window" : "", s->sinks);
    if (c->op == OP_ATTEND || c->op == OP_ATTEND_WIN)
        snprintf(buf + at, n - (size_t)at, " G=%d P=%d %s%s", s->G, s->page_tokens, kvq_rot_kind_name(s->rot),
                 s->center ? " centred" : "");
    if (c->op == OP_PREFILL || c->op == OP_PREFILL_DENSE)
        snprintf(buf + at, n - (size_t)at, " G=%d P=%d %s%s sinks=%d%s%s", s->G, s->page_tokens,
                 kvq_rot_kind_name(s->rot), s->window ? " window" : "", s->sinks, s->center ? " centred" : "",
                 s->seg ? " one-launch" : "");
    return buf;
}

/* NULL when this process can run backend b, else why not. */
static const char *unavailable(enum backend b)
{
    switch (b) {
    case BE_AVX2:
        return kvq_cpu_has_avx2() ? NULL : "no AVX2/FMA/F16C on this CPU, or KVQ_FORCE_SCALAR set";
    case BE_AVX512:
        return kvq_attn_avx512_usable() ? NULL : "no AVX-512 F/BW/VL/VBMI, or KVQ_ATTN_NO_AVX512 / KVQ_FORCE_SCALAR set";
    case BE_CUDA:
    case BE_CUDA_FUSED:
    case BE_CUDA_REF:
        return kvq_cuda_device_count() > 0 ? NULL : "no CUDA device (kvq_cuda_device_count() == 0)";
    default:
        return NULL;
    }
}

/* ---- running ---------------------------------------------------------------- */

static int opt_verbose, opt_perf, opt_repeat = 5;

/* Known bugs of the library: cases that run and fail until the bug is fixed.
 * While such a case fails it counts as skipped ("xfail", with the bug named
 * in the summary); once it passes it counts as failed, so that the entry
 * leaves this list with the fix. @return the bug, or NULL. */
static const char *known_bug(const struct tcase *c, enum backend b)
{
    (void)c;
    (void)b; /* none known: the last (a tqBj V's QJL residual in the GPU reference kernel) is fixed */
    return NULL;
}

struct tally {
    int pass, fail, skip, xfail;
    double worst, worst_tol;
    const char *bug; /* the known bug of the xfail cases */
};
static struct tally tallies[OP_COUNT][BE_COUNT];

/* The fixture of the last case, kept while the next case shares it. */
static struct {
    const struct tcase *key;
    void *fx;
    unsigned ref_done; /* ops whose reference ran on fx */
} cur;

static void drop_fixture(void)
{
    if (cur.fx)
        OPS[cur.key->op].free(cur.fx);
    cur.fx = NULL;
    cur.key = NULL;
}

static void *fixture_for(const struct tcase *c)
{
    const struct tcase *k = cur.key;
    if (!k || OPS[k->op].family != OPS[c->op].family || k->tk != c->tk || k->tv != c->tv || k->sh != c->sh) {
        drop_fixture();
        cur.fx = OPS[c->op].setup(c);
        cur.key = c;
        cur.ref_done = 0;
    }
    return cur.fx;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median wall time of opt_repeat runs of backend b (after one warm-up). */
static double time_exec(void *fx, const struct tcase *c, enum backend b)
{
    double t[64];
    const int n = opt_repeat < 64 ? opt_repeat : 64;
    OPS[c->op].exec(fx, c, b);
    for (int i = 0; i < n; i++) {
        const double t0 = now_us();
        OPS[c->op].exec(fx, c, b);
        t[i] = now_us() - t0;
    }
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static void run_case(const struct tcase *c)
{
    const struct op_impl *o = &OPS[c->op];
    static char label[160]; /* test_current_: what a failing CHECK names */
    char tbuf[32], sbuf[64];
    const char *ty = type_label(c, tbuf, sizeof tbuf), *sh = shape_label(c, sbuf, sizeof sbuf);
    int runnable[BE_COUNT], any = 0;
    for (int b = 0; b < BE_COUNT; b++) {
        runnable[b] = 0;
        if (!o->supports(c, (enum backend)b) || !listed(opt_backends, BE_NAME[b]))
            continue;
        if (unavailable((enum backend)b)) {
            tallies[c->op][b].skip++;
            continue;
        }
        runnable[b] = any = 1;
    }
    if (!any)
        return;
    snprintf(label, sizeof label, "%s %s %s", o->name, ty, sh);
    test_current_ = label;
    const int before = test_failures_;
    void *fx = fixture_for(c);
    if (fx && opt_perf) {
        const double t_ref = time_exec(fx, c, BE_REF);
        printf("%-7s %-10s %-26s %-10s %12.1f\n", o->name, ty, sh, "ref", t_ref);
        for (int b = 0; b < BE_COUNT; b++)
            if (runnable[b]) {
                const double t = time_exec(fx, c, (enum backend)b);
                printf("%-7s %-10s %-26s %-10s %12.1f %8.2fx\n", o->name, ty, sh, BE_NAME[b], t, t_ref / t);
            }
        return;
    }
    if (fx && !(cur.ref_done & 1u << c->op)) {
        o->exec(fx, c, BE_REF);
        cur.ref_done |= 1u << c->op;
    }
    const int ref_failed = test_failures_ > before;
    const double tol = TOL[c->op][case_class(c)];
    for (int b = 0; b < BE_COUNT; b++) {
        if (!runnable[b])
            continue;
        snprintf(label, sizeof label, "%s %s %s %s", o->name, ty, sh, BE_NAME[b]);
        const int at = test_failures_;
        double err = INFINITY;
        if (fx) {
            o->exec(fx, c, (enum backend)b);
            err = o->error(fx, c, (enum backend)b);
        }
        struct tally *t = &tallies[c->op][b];
        const int bad = ref_failed || test_failures_ > at || !(err <= tol);
        const char *bug = known_bug(c, (enum backend)b);
        if (bug && bad) {
            t->xfail++;
            t->bug = bug;
            if (opt_verbose)
                printf("xfail %s: error %.3g > tolerance %.3g (known bug: %s)\n", label, err, tol, bug);
            continue;
        }
        if (bad || bug) {
            t->fail++;
            test_failed_++;
            if (bad)
                printf("FAIL %s: error %.3g > tolerance %.3g (%s)\n", label, err, tol, o->measure);
            else
                printf("FAIL %s: passes (error %.3g): take it out of known_bug() (%s)\n", label, err, bug);
        } else {
            t->pass++;
            test_passed_++;
            if (opt_verbose)
                printf("ok   %s: error %.3g (tolerance %.3g)\n", label, err, tol);
        }
        if (err > t->worst || (t->pass + t->fail == 1)) {
            t->worst = err;
            t->worst_tol = tol;
        }
    }
    fflush(stdout);
}

static void print_summary(void)
{
    for (int op = 0; op < OP_COUNT; op++)
        for (int b = 0; b < BE_COUNT; b++) {
            const struct tally *t = &tallies[op][b];
            if (t->pass + t->fail)
                printf("%s %-7s %-10s %4d cases, %d failed, worst error %.3g (tolerance %.3g)\n",
                       t->fail ? "FAIL" : "ok  ", OPS[op].name, BE_NAME[b], t->pass + t->fail, t->fail, t->worst,
                       t->worst_tol);
            if (t->skip)
                printf("  skip %-7s %-10s %4d cases: %s\n", OPS[op].name, BE_NAME[b], t->skip,
                       unavailable((enum backend)b));
            if (t->xfail)
                printf("  xfail %-6s %-10s %4d cases, counted as skipped: known bug: %s\n", OPS[op].name,
                       BE_NAME[b], t->xfail, t->bug);
            test_skipped_ += t->skip + t->xfail;
        }
}

static void usage(void)
{
    printf("usage: test_backend_ops [-o OPS] [-t TYPES] [-b BACKENDS] [-v] [-l] [--perf [-r N]]\n"
           "  Every backend against the reference, case by case; no arguments: every case.\n"
           "  -o, -t, -b  comma-separated names, each exact or, ending in '*', a prefix:\n"
           "              -o attn,causal   -t tq3j   -t 'tq*'   -b 'cuda*'\n"
           "              a K/V pair (cache, attn, causal, attend) is selected by 'K/V', K or V;\n"
           "              rot and rot_t take the rotation as type (hadamard, hadamard3 = %d rounds, dct, gauss);\n"
           "              the decoder's ops (embed, norm, qkv-rope, glu, lm-head) their variant (-l lists them)\n"
           "  -v          one line per case        -l  list the cases, run nothing\n"
           "  --perf      time each case per backend: median of -r N runs (default 5) after a warm-up,\n"
           "              microseconds per case; checks nothing, asserts no speed\n"
           "ops:\n",
           KVQ_QJL_ROUNDS);
    for (int op = 0; op < OP_COUNT; op++)
        printf("  %-7s %s\n          error: %s\n", OPS[op].name, OPS[op].what, OPS[op].measure);
    printf("backends: scalar avx2 avx512 lib cuda cuda-fused cuda-ref (see the top of tests/test_backend_ops.c);\n"
           "  the ops cache and causal run the backend the library dispatches to in this process\n"
           "tolerances (op: class = max error):\n");
    for (int op = 0; op < OP_COUNT; op++) {
        printf("  %-7s", OPS[op].name);
        for (int cl = op == OP_ROT || op == OP_ROT_T ? CL_HADAMARD : CL_BASE;
             cl < (op == OP_ROT || op == OP_ROT_T ? CL_COUNT : CL_HADAMARD); cl++)
            printf("  %s = %g", CL_NAME[cl], TOL[op][cl]);
        printf("\n");
    }
}

int main(int argc, char **argv)
{
    int list = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int more = i + 1 < argc;
        if (!strcmp(a, "-o") && more)
            opt_ops = argv[++i];
        else if (!strcmp(a, "-t") && more)
            opt_types = argv[++i];
        else if (!strcmp(a, "-b") && more)
            opt_backends = argv[++i];
        else if (!strcmp(a, "-r") && more)
            opt_repeat = atoi(argv[++i]);
        else if (!strcmp(a, "--perf"))
            opt_perf = 1;
        else if (!strcmp(a, "-v"))
            opt_verbose = 1;
        else if (!strcmp(a, "-l"))
            list = 1;
        else {
            usage();
            return strcmp(a, "-h") && strcmp(a, "--help") ? 2 : 0;
        }
    }
    if (opt_repeat < 1)
        opt_repeat = 1;
    build_cases();
    printf("  backends here:");
    for (int b = 0; b < BE_COUNT; b++)
        printf(" %s%s", BE_NAME[b], unavailable((enum backend)b) ? " (no)" : "");
    printf("\n");
    if (opt_perf)
        printf("%-7s %-10s %-26s %-10s %12s %9s\n", "op", "type", "shape", "backend", "median_us", "vs_ref");
    for (size_t i = 0; i < n_cases; i++) {
        if (!selected(&cases[i]))
            continue;
        if (list) {
            char tb[32], sb[64];
            printf("%-7s %-10s %s\n", OPS[cases[i].op].name, type_label(&cases[i], tb, sizeof tb),
                   shape_label(&cases[i], sb, sizeof sb));
            continue;
        }
        run_case(&cases[i]);
    }
    drop_fixture();
    dop_cleanup();
    free(cases);
    if (list || opt_perf)
        return 0;
    print_summary();
    return TEST_END("test_backend_ops");
}
