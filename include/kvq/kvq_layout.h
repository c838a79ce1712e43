/* kvq_layout.h - the byte layout of encoded rows and cache pages, defined once.
 *
 * This header compiles as C11 and under nvcc (C++), so the CPU cache, the CUDA
 * kernels and any third-party kernel agree on every offset. Everything here is
 * plain data and inline arithmetic.
 *
 * A cache page holds page_tokens consecutive tokens of one layer, for every KV
 * head, K then V:
 *
 *   page = [K head 0][K head 1]...[K head H-1][V head 0]...[V head H-1]
 *
 * Each head chunk stores its row fields as separate sections (structure of
 * arrays), each section page_tokens entries long and starting on a 16-byte
 * boundary, so kernels stream each field with 16-byte loads:
 *
 *   tqBj chunk: norm[P] (u16) | rnorm[P] (u16) | codes[P][d*B/8] | signs[P][d/8]
 *   tqB  chunk: norm[P] (u16) | codes[P][d*B/8]
 *   baseline chunk (f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1 and the rotated
 *   ones): codes[P][row_bytes] (llama.cpp rows)
 *
 * page_tokens is a multiple of 16, which makes every section a multiple of
 * 16 bytes without padding: a page costs exactly P * H * (K row + V row)
 * bytes, the same as the packed rows it holds.
 */
#ifndef KVQ_LAYOUT_H
#define KVQ_LAYOUT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kvq_codec.h"
#include "kvq_half.h" /* KVQ_HD */

#ifdef __cplusplus
#define KVQ_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define KVQ_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

#define KVQ_PAGE_ALIGN 16
#define KVQ_DEFAULT_PAGE_TOKENS 64
#define KVQ_MIN_PAGE_TOKENS 16
#define KVQ_MAX_PAGE_TOKENS 4096
#define KVQ_NO_SECTION 0xffffffffu
/* Readable zero bytes after the last byte of every page allocation: SIMD and
 * CUDA kernels load whole 32- or 64-bit words at the last packed code group
 * (the 3 bytes of 8 codes are read as 4, the 6 bytes of 16 codes as 8), which
 * may run up to 7 bytes past the page. page_bytes does not include this
 * padding. */
#define KVQ_PAGE_TAIL_PAD 16

/* llama.cpp-compatible baseline blocks. */
#define KVQ_QK 32 /* values per block of every llama.cpp block type kvq has */
typedef struct kvq_block_q8_0 {
    uint16_t d;          /* f16 scale: max|x| / 127 */
    int8_t qs[KVQ_QK];   /* x ~ d * qs */
} kvq_block_q8_0;
typedef struct kvq_block_q4_0 {
    uint16_t d;              /* f16 scale: (value of max |x|) / -8 */
    uint8_t qs[KVQ_QK / 2];  /* x_j ~ d * ((qs[j] & 15) - 8), x_{j+16} ~ d * ((qs[j] >> 4) - 8) */
} kvq_block_q4_0;
/* llama.cpp's ggml-common.h block_q4_1 / block_q5_0 / block_q5_1. Fifth
 * bits: bit j of the little-endian u32 qh is bit 4 of value j (j < 32). */
typedef struct kvq_block_q4_1 {
    uint16_t d, m;           /* f16 scale (max - min) / 15 and minimum */
    uint8_t qs[KVQ_QK / 2];  /* x_j ~ d * (qs[j] & 15) + m, x_{j+16} ~ d * (qs[j] >> 4) + m */
} kvq_block_q4_1;
typedef struct kvq_block_q5_0 {
    uint16_t d;              /* f16 scale: (value of max |x|) / -16 */
    uint8_t qh[4];           /* fifth bits */
    uint8_t qs[KVQ_QK / 2];  /* low nibbles as q4_0; x ~ d * (q - 16) */
} kvq_block_q5_0;
typedef struct kvq_block_q5_1 {
    uint16_t d, m;           /* f16 scale (max - min) / 31 and minimum */
    uint8_t qh[4];
    uint8_t qs[KVQ_QK / 2];  /* x ~ d * q + m */
} kvq_block_q5_1;
KVQ_STATIC_ASSERT(sizeof(kvq_block_q8_0) == 34, "q8_0 block is 34 bytes as in llama.cpp");
KVQ_STATIC_ASSERT(sizeof(kvq_block_q4_0) == 18, "q4_0 block is 18 bytes as in llama.cpp");
KVQ_STATIC_ASSERT(sizeof(kvq_block_q4_1) == 20, "q4_1 block is 20 bytes as in llama.cpp");
KVQ_STATIC_ASSERT(sizeof(kvq_block_q5_0) == 22, "q5_0 block is 22 bytes as in llama.cpp");
KVQ_STATIC_ASSERT(sizeof(kvq_block_q5_1) == 24, "q5_1 block is 24 bytes as in llama.cpp");

/* Field sizes of one tq row, in bytes. */
#define KVQ_TQ_NORM_BYTES 2
#define KVQ_TQ_CODE_BYTES(d, b) ((d) * (b) / 8)
#define KVQ_TQ_SIGN_BYTES(d) ((d) / 8)
#define KVQ_TQ_ROW_BYTES(d, b, qjl) \
    (KVQ_TQ_NORM_BYTES * ((qjl) ? 2 : 1) + KVQ_TQ_CODE_BYTES(d, b) + ((qjl) ? KVQ_TQ_SIGN_BYTES(d) : 0))
KVQ_STATIC_ASSERT(KVQ_TQ_ROW_BYTES(128, 3, 1) == 68, "tq3j row at d=128 is 68 bytes");
KVQ_STATIC_ASSERT(KVQ_TQ_ROW_BYTES(128, 3, 0) == 50, "tq3 row at d=128 is 50 bytes");
KVQ_STATIC_ASSERT(KVQ_TQ_ROW_BYTES(128, 4, 1) == 84, "tq4j row at d=128 is 84 bytes");
KVQ_STATIC_ASSERT(KVQ_TQ_ROW_BYTES(80, 3, 1) == 44, "tq3j row at d=80 is 44 bytes");
KVQ_STATIC_ASSERT(KVQ_DEFAULT_PAGE_TOKENS % 16 == 0, "pages hold a multiple of 16 tokens");

/* Per-row field sizes of type t at dim d; all zero when unsupported. */
struct kvq_row_fields {
    uint32_t norm, rnorm, codes, signs; /* bytes; codes is the whole row for baselines */
};

KVQ_HD static inline int kvq_layout_tq_bits(int t)
{
    if (t >= KVQ_TYPE_TQ1 && t <= KVQ_TYPE_TQ4)
        return t - KVQ_TYPE_TQ1 + 1;
    if (t >= KVQ_TYPE_TQ1J && t <= KVQ_TYPE_TQ4J)
        return t - KVQ_TYPE_TQ1J + 1;
    switch (t) {
    case KVQ_TYPE_TQ5: return 5;
    case KVQ_TYPE_TQ6: return 6;
    case KVQ_TYPE_TQ8: return 8;
    default: return 0;
    }
}

KVQ_HD static inline int kvq_layout_tq_qjl(int t)
{
    return t >= KVQ_TYPE_TQ1J && t <= KVQ_TYPE_TQ4J;
}

/* The block layout a type's rows use: rotated baselines store R x in their
 * base's layout, every other type is its own. */
KVQ_HD static inline int kvq_layout_base_type(int t)
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

/* Bytes of one KVQ_QK-value block of a llama.cpp block layout; 0 for any
 * other type. */
KVQ_HD static inline uint32_t kvq_layout_block_bytes(int t)
{
    switch (t) {
    case KVQ_TYPE_Q8_0: return (uint32_t)sizeof(kvq_block_q8_0);
    case KVQ_TYPE_Q4_0: return (uint32_t)sizeof(kvq_block_q4_0);
    case KVQ_TYPE_Q4_1: return (uint32_t)sizeof(kvq_block_q4_1);
    case KVQ_TYPE_Q5_0: return (uint32_t)sizeof(kvq_block_q5_0);
    case KVQ_TYPE_Q5_1: return (uint32_t)sizeof(kvq_block_q5_1);
    default: return 0;
    }
}

KVQ_HD static inline struct kvq_row_fields kvq_layout_row_fields(int t, int d)
{
    struct kvq_row_fields f = {0, 0, 0, 0};
    if (d < 8 || d > KVQ_MAX_DIM)
        return f;
    const int base = kvq_layout_base_type(t);
    if (base == KVQ_TYPE_F32 || base == KVQ_TYPE_F16) {
        f.codes = (base == KVQ_TYPE_F32 ? 4u : 2u) * (uint32_t)d;
        return f;
    }
    const uint32_t block = kvq_layout_block_bytes(base);
    if (block) {
        if (d % KVQ_QK == 0)
            f.codes = (uint32_t)(d / KVQ_QK) * block;
        return f;
    }
    int b = kvq_layout_tq_bits(t);
    if (b == 0 || d % 8 != 0)
        return f;
    f.norm = KVQ_TQ_NORM_BYTES;
    f.codes = (uint32_t)KVQ_TQ_CODE_BYTES(d, b);
    if (kvq_layout_tq_qjl(t)) {
        f.rnorm = KVQ_TQ_NORM_BYTES;
        f.signs = (uint32_t)KVQ_TQ_SIGN_BYTES(d);
    }
    return f;
}

KVQ_HD static inline uint32_t kvq_layout_row_bytes(int t, int d)
{
    struct kvq_row_fields f = kvq_layout_row_fields(t, d);
    return f.norm + f.rnorm + f.codes + f.signs;
}

/* One (page, head) chunk of one type. Offsets are from the chunk start. */
struct kvq_head_layout {
    uint32_t type, dim, page_tokens;
    uint32_t norm_off, rnorm_off, codes_off, signs_off; /* KVQ_NO_SECTION when absent */
    uint32_t codes_stride, signs_stride;                /* bytes per token */
    uint32_t bytes;                                     /* whole chunk, multiple of 16 */
};

struct kvq_page_layout {
    uint32_t n_kv_heads, page_tokens, dim;
    struct kvq_head_layout k, v;
    uint64_t k_off;      /* = 0: K head h chunk at k_off + h * k.bytes */
    uint64_t v_off;      /* V head h chunk at v_off + h * v.bytes */
    uint64_t page_bytes;
    uint64_t mean_off;   /* key means (kvq_page_layout_add_key_means): head h's block at
                          * mean_off + h * mean_bytes; mean_bytes 0 when the page has none */
    uint32_t mean_bytes;
};

/* ---- key means (key centering, kvq_cache_config.center_k) -------------
 *
 * Keys of one head share a large common component that the rotation
 * spreads over every coordinate, so a codec spends its levels on it. A
 * centred page stores, per head, the mean m of its keys coarsely: an f16
 * scale s, then one 4-bit code per coordinate (coordinate j in the low
 * nibble of byte j / 2 when j is even, the high nibble when odd),
 * m~_j = s (code_j - 8). Its keys are encoded as k - m~, and a query's
 * score gains q.m~ once per page, which restores q.k exactly as far as the
 * codec goes: how coarse m~ is changes only how much is left to encode. */
#define KVQ_KEY_MEAN_BYTES(d) (2u + ((uint32_t)(d) + 1u) / 2u)
KVQ_STATIC_ASSERT(KVQ_KEY_MEAN_BYTES(128) == 66, "a d=128 key mean is 66 bytes");

/* Appends the key-mean section to a page layout (all heads, padded to 16 bytes). */
KVQ_HD static inline void kvq_page_layout_add_key_means(struct kvq_page_layout *pl)
{
    pl->mean_off = pl->page_bytes;
    pl->mean_bytes = KVQ_KEY_MEAN_BYTES(pl->dim);
    pl->page_bytes += ((uint64_t)pl->n_kv_heads * pl->mean_bytes + KVQ_PAGE_ALIGN - 1) / KVQ_PAGE_ALIGN * KVQ_PAGE_ALIGN;
}

/* The scale s of a key-mean block, and the code of coordinate j. */
KVQ_HD static inline float kvq_key_mean_scale(const uint8_t *blk)
{
    return kvq_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
}

KVQ_HD static inline int kvq_key_mean_code(const uint8_t *blk, int j)
{
    return j & 1 ? blk[2 + j / 2] >> 4 : blk[2 + j / 2] & 15;
}

/* The code of a mean coordinate m at scale s (the block's f16 scale as a
 * float): clamp(rint(m / s), -8, 7) + 8, 8 when s is 0. Host and device
 * round the same way (the division correctly rounded, ties to even), so the
 * CPU's and the GPU's packers write the same bytes. */
KVQ_HD static inline int kvq_key_mean_quant(float m, float s)
{
#ifdef __CUDA_ARCH__
    const int q = s > 0.0f ? __float2int_rn(__fdiv_rn(m, s)) : 0;
#else
    const int q = s > 0.0f ? (int)lrintf(m / s) : 0;
#endif
    return (q < -8 ? -8 : q > 7 ? 7 : q) + 8;
}

/* m~ of a key-mean block into out[d]. */
KVQ_HD static inline void kvq_key_mean_decode(const uint8_t *blk, int d, float *out)
{
    const float s = kvq_key_mean_scale(blk);
    for (int j = 0; j < d; j++)
        out[j] = s * (float)(kvq_key_mean_code(blk, j) - 8);
}

/** @return 0 on success, -1 when (type, d, page_tokens) is unsupported. */
KVQ_HD static inline int kvq_head_layout_init(struct kvq_head_layout *hl, int t, int d, int page_tokens)
{
    struct kvq_row_fields f = kvq_layout_row_fields(t, d);
    if (f.codes == 0 || page_tokens < KVQ_MIN_PAGE_TOKENS || page_tokens > KVQ_MAX_PAGE_TOKENS ||
        page_tokens % 16 != 0)
        return -1;
    uint32_t P = (uint32_t)page_tokens, off = 0;
    hl->type = (uint32_t)t;
    hl->dim = (uint32_t)d;
    hl->page_tokens = P;
    hl->norm_off = f.norm ? off : KVQ_NO_SECTION;
    off += f.norm * P;
    hl->rnorm_off = f.rnorm ? off : KVQ_NO_SECTION;
    off += f.rnorm * P;
    hl->codes_off = off;
    off += f.codes * P;
    hl->signs_off = f.signs ? off : KVQ_NO_SECTION;
    off += f.signs * P;
    hl->codes_stride = f.codes;
    hl->signs_stride = f.signs;
    hl->bytes = off;
    return 0;
}

/** @return 0 on success, -1 when unsupported. */
KVQ_HD static inline int kvq_page_layout_init(struct kvq_page_layout *pl, int n_kv_heads, int d,
                                              int type_k, int type_v, int page_tokens)
{
    if (n_kv_heads < 1 || kvq_head_layout_init(&pl->k, type_k, d, page_tokens) ||
        kvq_head_layout_init(&pl->v, type_v, d, page_tokens))
        return -1;
    pl->n_kv_heads = (uint32_t)n_kv_heads;
    pl->page_tokens = (uint32_t)page_tokens;
    pl->dim = (uint32_t)d;
    pl->k_off = 0;
    pl->v_off = (uint64_t)n_kv_heads * pl->k.bytes;
    pl->page_bytes = pl->v_off + (uint64_t)n_kv_heads * pl->v.bytes;
    pl->mean_off = 0;
    pl->mean_bytes = 0;
    return 0;
}

/* ---- device order of 3-bit codes (the CUDA cache only) -----------------
 *
 * Host pages keep the stream order of kvq_codec.h (code j at bits 3j..3j+2).
 * GPU kernels turn codes into byte-permute selectors, which take one code
 * per 4-bit nibble; from the stream order that costs ~31 instructions per 32
 * codes, from the order below 13 (docs/history/attention-cuda.md, sixth
 * pass). So the CUDA cache stores 3-bit codes (tq3, tq3j) in groups of 32
 * codes = 12 bytes = three little-endian u32 words w0..w2:
 *
 *   code 8k + i (k < 3, i < 8): bits 4i .. 4i+2 of wk
 *   code 24 + i:                bit k of the code in bit 4i + 3 of wk
 *
 * A trailing group of fewer than 32 codes (d % 32 != 0) keeps the stream
 * order. Same bytes per row; kvq_cuda_cache_read_page / write_page / upload
 * convert, so pages leave and enter the GPU in the host order. */
#define KVQ_DEV_GROUP_CODES 32
#define KVQ_DEV_GROUP_BYTES 12
KVQ_STATIC_ASSERT(KVQ_TQ_CODE_BYTES(KVQ_DEV_GROUP_CODES, 3) == KVQ_DEV_GROUP_BYTES, "32 3-bit codes are 12 bytes");

/* Whether the CUDA cache stores rows of type t in device order. */
KVQ_HD static inline int kvq_dev_order(int t)
{
    return kvq_layout_tq_bits(t) == 3;
}

/* Bit position, within a row of d 3-bit codes in device order, of bit b of
 * code j. */
KVQ_HD static inline uint32_t kvq_dev_bitpos(int d, int j, int b)
{
    if (j >= (d & ~31))
        return (uint32_t)(3 * j + b);
    const int c = j & 31, base = 96 * (j >> 5);
    return (uint32_t)(base + (c < 24 ? 32 * (c >> 3) + 4 * (c & 7) + b : 32 * b + 4 * (c - 24) + 3));
}

/* The inverse: which code's bit (*bit) sits at bit position pos of a row of
 * d 3-bit codes in device order. @return the code index. */
KVQ_HD static inline int kvq_dev_bitsrc(int d, uint32_t pos, int *bit)
{
    if (pos >= 3u * (uint32_t)(d & ~31)) {
        *bit = (int)(pos % 3u);
        return (int)(pos / 3u);
    }
    const int base = 32 * (int)(pos / 96u), r = (int)(pos % 96u);
    const int k = r >> 5, i = (r >> 2) & 7, nb = r & 3;
    *bit = nb < 3 ? nb : k;
    return base + (nb < 3 ? 8 * k + i : 24 + i);
}

/* Code j of a row of d 3-bit codes in device order. */
KVQ_HD static inline unsigned kvq_dev_code_get(const uint8_t *codes, int d, int j)
{
    unsigned v = 0;
    for (int b = 0; b < 3; b++) {
        const uint32_t pos = kvq_dev_bitpos(d, j, b);
        v |= (unsigned)((codes[pos >> 3] >> (pos & 7)) & 1u) << b;
    }
    return v;
}

/* Rewrites one row of d 3-bit codes (3d/8 bytes) in place: stream order to
 * device order when to_device, else back. The two are exact inverses. */
KVQ_HD static inline void kvq_dev_order_row(uint8_t *codes, int d, int to_device)
{
    for (int g = 0; g + 32 <= d; g += 32) {
        uint8_t *p = codes + 12 * (g >> 5), src[12], dst[12];
        for (int i = 0; i < 12; i++) {
            src[i] = p[i];
            dst[i] = 0;
        }
        for (int j = 0; j < 32; j++)
            for (int b = 0; b < 3; b++) {
                const uint32_t sp = (uint32_t)(3 * j + b), dp = kvq_dev_bitpos(32, j, b);
                const uint32_t from = to_device ? sp : dp, to = to_device ? dp : sp;
                dst[to >> 3] |= (uint8_t)(((src[from >> 3] >> (from & 7)) & 1u) << (to & 7));
            }
        for (int i = 0; i < 12; i++)
            p[i] = dst[i];
    }
}

/* Row view of token `slot` (0 <= slot < page_tokens) inside a head chunk. */
KVQ_HD static inline struct kvq_row kvq_head_row(const struct kvq_head_layout *hl, uint8_t *chunk, uint32_t slot)
{
    struct kvq_row r;
    r.norm = hl->norm_off == KVQ_NO_SECTION ? NULL : (uint16_t *)(chunk + hl->norm_off) + slot;
    r.rnorm = hl->rnorm_off == KVQ_NO_SECTION ? NULL : (uint16_t *)(chunk + hl->rnorm_off) + slot;
    r.codes = chunk + hl->codes_off + (size_t)slot * hl->codes_stride;
    r.signs = hl->signs_off == KVQ_NO_SECTION ? NULL : chunk + hl->signs_off + (size_t)slot * hl->signs_stride;
    return r;
}

/* ---- device page layout (the CUDA cache only) -------------------------
 *
 * The fused CUDA kernel moves 32 tokens (16 on pages of an odd multiple of
 * 16) of one head's K and V into shared memory per pipeline stage. From host
 * pages that takes one bulk copy per section, six for tq3j/tq3, and issuing
 * them costs the kernel's loop ~110 instructions per stage. So the CUDA cache
 * stores each head's tokens in groups of G instead, the K rows of a group
 * followed by its V rows, each half laid out like a host chunk of G tokens:
 *
 *   page  = [head 0][head 1]...[head H-1]
 *   head  = [group 0][group 1]...[group P/G - 1]
 *   group = [K: norm[G] | rnorm[G] | codes[G][..] | signs[G][..]][V: likewise]
 *
 * and a stage is one contiguous copy (docs/history/attention-cuda.md, tenth
 * pass: 3-6% faster from 32K). G = 32 when page_tokens % 32 == 0, else 16,
 * so every section still starts on a 16-byte boundary and a page has the
 * same bytes as a host page. kvq_cuda_cache_read_page / write_page / upload convert. */
struct kvq_dev_layout {
    uint32_t group_tokens;       /* G */
    uint32_t row_bytes;          /* K row + V row of one token */
    uint32_t head_bytes;         /* page_tokens * row_bytes */
    struct kvq_head_layout k, v; /* the halves of one group (page_tokens = G); V starts at k.bytes */
};

/** @return 0 on success, -1 when the host layout is invalid. */
KVQ_HD static inline int kvq_dev_layout_init(struct kvq_dev_layout *dl, const struct kvq_page_layout *pl)
{
    const uint32_t P = pl->page_tokens, G = P % 32 == 0 ? 32u : 16u;
    if (P % 16 != 0 || kvq_head_layout_init(&dl->k, (int)pl->k.type, (int)pl->dim, (int)G) ||
        kvq_head_layout_init(&dl->v, (int)pl->v.type, (int)pl->dim, (int)G))
        return -1;
    dl->group_tokens = G;
    dl->row_bytes = (dl->k.bytes + dl->v.bytes) / G;
    dl->head_bytes = P * dl->row_bytes;
    return 0;
}

/* Row view of token `slot` of head h, K (kv = 0) or V (kv = 1), inside a
 * device page. */
KVQ_HD static inline struct kvq_row kvq_dev_row(const struct kvq_dev_layout *dl, uint8_t *page, int kv, uint32_t h,
                                                uint32_t slot)
{
    const uint32_t r = slot % dl->group_tokens;
    uint8_t *half = page + (size_t)h * dl->head_bytes + (size_t)(slot - r) * dl->row_bytes + (kv ? dl->k.bytes : 0);
    return kvq_head_row(kv ? &dl->v : &dl->k, half, r);
}

#endif /* KVQ_LAYOUT_H */
