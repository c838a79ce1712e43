/* attn_internal.h - the workspace and the block kernels of fused decode attention.
 *
 * kvq_attn_decode() walks the context in blocks of at most KVQ_ATTN_BLOCK
 * tokens that never cross a page. For each block:
 *   1. score: dot[q][i] = q_q . k_i, straight from the K chunk (tq types in
 *      the rotated domain: n_i (q'.c[idx_i] + g_i (S q').s~_i));
 *   2. online softmax (max-subtracted, exp in float): w[q][i] =
 *      exp(scale dot - m_q) with the running max m_q; alpha_q =
 *      exp(m_old - m_new) rescales what earlier blocks accumulated;
 *   3. value: acc[q] = alpha_q acc[q] + sum_i w[q][i] v_i, in V's stored
 *      domain (tq types: the rotated one, sum_i w n_i c[idx_i], plus for a
 *      tqBj V a second sum in S's domain). The block sum is formed in float
 *      registers and folded into double accumulators, so the error does
 *      not grow with the context length.
 * Before the first block the kernels' prepare() lays the queries out for
 * them (and builds the QJL sign tables); finally out = acc / l, rotated back
 * once (R^T, and S^T for a tqBj V).
 *
 * Three implementations of steps 1-3 exist: scalar (attn_ref.c, also the
 * fallback on CPUs without AVX2 and for head dims not a multiple of 8), AVX2
 * (attn_avx2.c) and AVX-512 for tq rows (attn_avx512.c).
 * kvq_attn_decode_ref() (attn_ref.c) is the independent reference: dequantize
 * each row with the codec's decode_ref (or take its f16 override copy),
 * attend in double. f16 override rows (kvq_cache.h) are skipped by the
 * block loop and folded in afterwards by kvq_attn_merge_f16 (attn.c).
 */
#ifndef KVQ_ATTN_INTERNAL_H
#define KVQ_ATTN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "codec_internal.h"
#include "kvq_attn.h"

#define KVQ_ATTN_BLOCK 64 /* tokens per block: scores stay in L1 */
#define KVQ_ATTN_QCHUNK 4 /* query heads one pass of a kernel handles */

struct kvq_attn_workspace {
    int dim, max_q;
    size_t max_ctx;
    /* fused path */
    float *qprep;    /* [max_q][2 dim]: q (baseline K) or q', S q' (tq K) */
    float *qint;     /* [max_q][dim]: q (or q') per query chunk, interleaved by 8-coordinate group */
    float *qsum;     /* [max_q]: sum_j (S q')_j */
    uint64_t *lut;   /* sign tables, see kvq_attn_sign_lut */
    float *lut_inv;  /* [max_q]: value of one fixed-point step of each head's table */
    float *dot;      /* [max_q][KVQ_ATTN_BLOCK] */
    float *w;        /* [max_q][KVQ_ATTN_BLOCK] softmax weights */
    float *wv;       /* [max_q][KVQ_ATTN_BLOCK] weights times V norms (tq V) */
    float *wg;       /* [max_q][KVQ_ATTN_BLOCK] weights times V norms times g (tqBj V) */
    uint64_t *ssum;  /* [2][KVQ_ATTN_BLOCK] sign sums of one query chunk, as table words */
    double *acc;     /* [max_q][dim] */
    double *acc_s;   /* [max_q][dim]: tqBj V, the S-domain part */
    double *m, *l, *alpha; /* [max_q] */
    float *row;      /* [max_q][2 dim] scratch */
    /* chunk path (attn_chunk.c) */
    float *ck, *cv;  /* [KVQ_ATTN_BLOCK][dim]: one block's decoded keys, values */
    float *ckt;      /* [dim][KVQ_ATTN_BLOCK]: the keys transposed */
    float *crow;     /* [KVQ_ATTN_CHUNK_ROWS * KVQ_ATTN_BLOCK + 4 dim] the block step's scratch */
    double *cacc;    /* [max(max_q, KVQ_ATTN_PASS_ROWS)][dim] a pass's rows */
    double *cm, *cl; /* [max(max_q, KVQ_ATTN_PASS_ROWS)] their maxima, weight sums */
    struct kvq_attn_chunk_rows *cr; /* the rows of one block step */
};

/* One decode call, as the kernels see it. */
struct kvq_attn_job {
    const kvq_codec *ck, *cv;
    const struct kvq_head_layout *hk, *hv;
    int dim, n_q;
    float scale;
    kvq_attn_workspace *ws;
};

/* Where one block of keys/values lives: a head chunk and the slots [s0, s0+n). */
struct kvq_attn_block {
    const uint8_t *kchunk, *vchunk;
    uint32_t s0, n;
};

/* The three steps above for one block; all queries of the job.
 *  score: ws->dot[q][i] for i < n (unscaled dot products)
 *  softmax: ws->w, ws->alpha, and updates ws->m, ws->l
 *  value: ws->acc (and ws->acc_s) = alpha acc + sum_i w v_i */
/* One f16 override row in the online softmax of kvq_attn_merge_f16, for
 * every query: s = scale q.k; on a new maximum m, l and acc are rescaled;
 * then l += exp(s - m), acc += exp(s - m) v. k, v: [dim] halves; q [n_q][dim];
 * m, l [n_q] and acc [n_q][dim] in double; tmp: 2 dim floats of scratch. */
typedef void (*kvq_attn_f16_row_fn)(const uint16_t *k, const uint16_t *v, const float *q, int n_q, int dim,
                                    double scale, double *m, double *l, double *acc, float *tmp);

struct kvq_attn_kernels {
    void (*prepare)(const struct kvq_attn_job *job); /* once per call, after qprep; may be NULL */
    void (*score)(const struct kvq_attn_job *job, const struct kvq_attn_block *b);
    void (*softmax)(const struct kvq_attn_job *job, uint32_t n);
    void (*value)(const struct kvq_attn_job *job, const struct kvq_attn_block *b);
    kvq_attn_f16_row_fn f16_row;
    /* key centering: gain[h] = q_h . m~ for the n_q queries q [n_q][d] and a
     * page's key-mean block (kvq_layout.h), added to the page's scores */
    void (*mean_gain)(const uint8_t *blk, int d, const float *q, int n_q, float *gain);
};

/* The scalar mean_gain (attn_ref.c), also the table entry where a SIMD one
 * would gain nothing. */
void kvq_attn_mean_gain_scalar(const uint8_t *blk, int d, const float *q, int n_q, float *gain);
/* ... and eight coordinates at a time (attn_avx2.c; d % 8 == 0), the AVX2 and
 * AVX-512 tables' */
void kvq_attn_mean_gain_avx2(const uint8_t *blk, int d, const float *q, int n_q, float *gain);

extern const struct kvq_attn_kernels kvq_attn_kernels_scalar;
extern const struct kvq_attn_kernels kvq_attn_kernels_avx2; /* needs AVX2 and dim % 8 == 0 */
/* tq rows 16 coordinates at a time (other types go to the AVX2 kernels);
 * needs kvq_attn_avx512_usable() and dim % 16 == 0. */
extern const struct kvq_attn_kernels kvq_attn_kernels_avx512;
/** @return 1 when AVX2 is usable (kvq_cpu_has_avx2) and the CPU and OS also
 *  support AVX-512 F/BW/VL/VBMI; KVQ_ATTN_NO_AVX512=1 in the environment
 *  turns it off (to compare with the AVX2 kernels). */
int kvq_attn_avx512_usable(void);

/* kvq_attn_decode() with the kernels given (tests compare both sets). */
kvq_status kvq_attn_decode_kernels(const struct kvq_attn_kernels *kr, const kvq_cache *c, int kv_head, size_t n_ctx,
                                   const float *q, int n_q, float scale, float *out, kvq_attn_workspace *ws);

/* The f16 override rows of a decode (kvq_cache_f16_view: [0, sink_end) and
 * [tail_lo, n_ctx)) folded into out, the result of the packed rows
 * (have_packed = 0: there were none); ws->m and ws->l hold the packed rows'
 * softmax maximum and weight sum. Exact arithmetic: f16 rows to float,
 * scores and weights in double. */
kvq_status kvq_attn_merge_f16(const struct kvq_attn_kernels *kr, const kvq_cache *c, int kv_head, size_t n_ctx,
                              size_t sink_end, size_t tail_lo, const float *q, int n_q, float scale,
                              int have_packed, float *out, kvq_attn_workspace *ws);

/* Query heads are processed in chunks of 4, the rest as 2 + 1. */
static inline int kvq_attn_chunk(int left)
{
    return left >= 4 ? 4 : left == 3 ? 2 : left;
}

/* Sign tables for a tqBj K and the query chunk starting at q0 (even) with qc
 * heads. The sign sum P = sum of (S q')_j over the set sign bits of a key is
 * gathered one sign byte at a time: entry [p][b] holds the sum over the set
 * bits of byte value b at byte position p (j = 8p + bit). Entries are fixed
 * point, two heads per 64-bit word (head 2w + l in bits 32l .. 32l+31, each
 * biased to be non-negative and small enough that the sums over all d/8
 * positions never carry into the other half), so a key's sums for a pair of
 * heads cost one scalar add per sign byte, on the integer side of the core
 * while the vector units score the codes. Head h's sum is
 *   (int32)(half_h - (d/8) 2^kvq_attn_lut_bits(d/8)) * lut_inv[h].
 * Rounding: two roundings to a step of lut_inv per byte, ~2^-24 of the
 * largest nibble sum at d = 128: below float accumulation error.
 * Word table w of the chunk is ws->lut + kvq_attn_lut_offset(dim, q0 + 2w),
 * [d/8][256] words. */
static inline int kvq_attn_lut_bits(int positions)
{
    int c = 0;
    while ((1 << c) < positions)
        c++;
    return 30 - c;
}
static inline size_t kvq_attn_lut_offset(int dim, int q0)
{
    return (size_t)(q0 / 2) * (size_t)(dim / 8) * 256u;
}
void kvq_attn_sign_lut(const struct kvq_attn_job *job, int q0, int qc); /* attn_avx2.c: needs AVX2 */
/* attn_avx2.c: the f16 row step of the AVX2 and AVX-512 kernel sets; needs
 * AVX2/FMA/F16C and dim % 8 == 0. */
void kvq_attn_f16_row_avx2(const uint16_t *k, const uint16_t *v, const float *q, int n_q, int dim, double scale,
                           double *m, double *l, double *acc, float *tmp);

/* Row views of the block's slot s of a head chunk. */
static inline struct kvq_row kvq_attn_row(const struct kvq_head_layout *hl, const uint8_t *chunk, uint32_t slot)
{
    /* Rows are only read; kvq_row's pointers are non-const by type only. */
    return kvq_head_row(hl, (uint8_t *)(uintptr_t)chunk, slot);
}

/* ---- chunk (prefill) attention: attn_chunk.c, attn_chunk_avx2.c ----
 * A query tile holds kvq_attn_chunk_positions(n_q) positions of n_q heads
 * (at most KVQ_ATTN_CHUNK_ROWS rows: one block step). A pass holds up to
 * KVQ_ATTN_PASS_TILES tiles, which share every block's decode: a packed key
 * costs two inverse rotations (the codebook's and QJL's), about as much as 70
 * rows' products with it, so it is decoded once for up to 512 rows; their
 * accumulators (512 KiB at dim 128) still sit in L2. */
#define KVQ_ATTN_CHUNK_ROWS 128
#define KVQ_ATTN_CHUNK_POS 64
#define KVQ_ATTN_PASS_TILES 4
#define KVQ_ATTN_PASS_ROWS (KVQ_ATTN_PASS_TILES * KVQ_ATTN_CHUNK_ROWS)
#define KVQ_ATTN_PASS_POS (KVQ_ATTN_PASS_TILES * KVQ_ATTN_CHUNK_POS)
static inline size_t kvq_attn_chunk_positions(int n_q)
{
    size_t p = KVQ_ATTN_CHUNK_ROWS / (size_t)n_q;
    return p < 1 ? 1 : p > KVQ_ATTN_CHUNK_POS ? KVQ_ATTN_CHUNK_POS : p;
}

/* The rows of a tile that meet one block, as the block step sees them. */
struct kvq_attn_chunk_rows {
    int n;
    const float *q[KVQ_ATTN_CHUNK_ROWS];           /* [dim] each */
    uint32_t lo[KVQ_ATTN_CHUNK_ROWS], hi[KVQ_ATTN_CHUNK_ROWS]; /* keys [lo, hi) of the block, lo < hi */
    double *m[KVQ_ATTN_CHUNK_ROWS], *l[KVQ_ATTN_CHUNK_ROWS], *acc[KVQ_ATTN_CHUNK_ROWS]; /* acc: [dim] */
};

/* One block's step for every row given: scores s_j = scale q . k_j for the
 * row's keys j in [lo, hi) (kt: [dim][KVQ_ATTN_BLOCK], the keys as columns),
 * then the online softmax: m = max(m, max s), l = alpha l + sum e^(s_j - m),
 * acc = alpha acc + sum_j e^(s_j - m) v_j (v: [KVQ_ATTN_BLOCK][dim]; the
 * block's sum in float, acc in double), alpha = e^(m_old - m). Each row's
 * arithmetic is its own (rows are only paired to share loads), so a row's
 * result does not depend on the others. tmp: KVQ_ATTN_CHUNK_ROWS *
 * KVQ_ATTN_BLOCK + 4 dim floats of scratch, 64-byte aligned. */
struct kvq_attn_chunk_kernels {
    void (*block)(const struct kvq_attn_chunk_rows *r, const float *kt, const float *v, int dim, float scale,
                  float *tmp);
};
extern const struct kvq_attn_chunk_kernels kvq_attn_chunk_kernels_scalar;
extern const struct kvq_attn_chunk_kernels kvq_attn_chunk_kernels_avx2; /* AVX2/FMA, dim % 8 == 0 */
/* kvq_attn_avx512_usable() and dim % 16 == 0 */
extern const struct kvq_attn_chunk_kernels kvq_attn_chunk_kernels_avx512;

/* kvq_attn_causal() (rec NULL) / kvq_attn_causal_recent() with the kernels
 * given (tests compare the sets). */
kvq_status kvq_attn_causal_kernels(const struct kvq_attn_chunk_kernels *kr, const kvq_cache *c, int kv_head,
                                   size_t pos0, size_t T, const float *q, int n_q, float scale, float *out,
                                   kvq_attn_workspace *ws, const struct kvq_attn_recent *rec);

/* attn.c: the argument checks of every entry point (n_ctx: the longest
 * context used), and the queries' finiteness. */
kvq_status kvq_attn_check_args(const kvq_cache *c, int kv_head, size_t n_ctx, const float *q, int n_q, float scale,
                               const float *out, const kvq_attn_workspace *ws);
kvq_status kvq_attn_check_queries(const float *q, size_t n, int d);

#endif /* KVQ_ATTN_INTERNAL_H */
