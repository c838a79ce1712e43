/* kvq_cache.h - the packed KV cache of one layer.
 *
 * A cache holds the keys and values of one sequence for one layer, for all KV
 * heads, in fixed-size pages (layout: kvq_layout.h). Pages are allocated on
 * demand as tokens are appended and never moved or reallocated, so pointers
 * into old pages stay valid and a device copy can mirror them page by page.
 * reset() and truncate() keep the pages for reuse.
 *
 * Shapes: K and V inputs are [n_tokens][n_kv_heads][head_dim] floats, the
 * order a transformer produces them in (post-RoPE keys).
 *
 * f16 overrides (both off by default; see kvq_cache_config): besides the
 * packed pages, a cache may keep f16 copies of some tokens, and every reader
 * (kvq_cache_read, kvq_attn_decode, kvq_attn_decode_ref) then uses the f16 row
 * instead of the packed one:
 *  - sink tokens: tokens [0, sink_tokens), forever (the first tokens, BOS
 *    above all, draw a large share of the attention);
 *  - the recent window (recent_f16): the tokens of the last, partly filled
 *    page, i.e. [n - n % page_tokens, n) for a view of n tokens, until the
 *    page fills; then that page is read packed like every other.
 * Every token is still encoded into its page exactly as without overrides
 * (same bytes, same token -> page/slot mapping), so page-level code (device
 * mirrors, page copies) sees the same pages, but it does not see the f16
 * copies: a device mirror of a cache with overrides attends differently.
 * A read over the first n < len tokens (kvq_attn_decode with n_ctx < len)
 * sees the cache as kvq_cache_truncate(c, n) would leave it.
 * The recent copies live in a ring of page_tokens rows (the window is never
 * larger, so it costs no row it does not read): a truncation that stays in
 * the page of the last token (len - 1) restores exactly the view the cache
 * had at that length; a truncation into an earlier page may lose the f16
 * copies of the kept tokens of the then partly filled page, which are then
 * read packed until the page fills. Speculative decoding keeps its verify
 * passes within one page for this reason (kvq_model.h).
 *
 * Shared pages: kvq_cache_share lets one cache hold the whole pages of
 * another's prefix instead of its own copy (prefix sharing among sequences).
 * A page is freed when the last cache holding it lets go (trim, free, a
 * truncation then trim), and no cache ever writes a page another one holds:
 * an append that lands in one (only after a truncation into the shared
 * prefix) first replaces it by a private copy (copy on write).
 *
 * Threading: append/reset/truncate/reserve/share need exclusive access to
 * the caches they write; concurrent readers (kvq_cache_read, kvq_attn_*) are
 * safe while no writer runs. Caches that share pages may be written by
 * different threads (the page counts are atomic).
 */
#ifndef KVQ_CACHE_H
#define KVQ_CACHE_H

#include "kvq_export.h"

#include <stddef.h>
#include <stdint.h>

#include "kvq_codec.h"
#include "kvq_layout.h"
#include "kvq_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The V codec's seed is kvq_seed_derive(seed, KVQ_CACHE_SEED_STREAM_V)
 * (kvq_rng.h); the K codec uses seed itself. */
#define KVQ_CACHE_SEED_STREAM_V 3u

/* Most sink tokens a cache keeps in f16. */
#define KVQ_CACHE_MAX_SINK_TOKENS 1024

struct kvq_cache_config {
    int n_kv_heads;           /* >= 1 */
    int head_dim;             /* see kvq_type_check_dim */
    enum kvq_type type_k;     /* default KVQ_DEFAULT_TYPE_K (tq3j) */
    enum kvq_type type_v;     /* default KVQ_DEFAULT_TYPE_V (tq3) */
    uint64_t seed;            /* K codec uses seed, V codec kvq_seed_derive(seed, KVQ_CACHE_SEED_STREAM_V) */
    enum kvq_rot_kind rot;    /* default KVQ_ROT_HADAMARD */
    enum kvq_qjl_kind qjl;    /* default KVQ_QJL_ORTHO */
    int page_tokens;          /* multiple of 16; 0 -> KVQ_DEFAULT_PAGE_TOKENS */
    size_t max_tokens;        /* context limit, >= 1 */
    size_t max_bytes;         /* page memory budget, f16 override buffers included;
                               * 0 = no limit beyond max_tokens */
    int recent_f16;           /* 1: the tokens of the last, partly filled page are also
                               * kept in f16 and read from there (0 = off) */
    int sink_tokens;          /* 0..KVQ_CACHE_MAX_SINK_TOKENS: the first sink_tokens
                               * tokens are also kept in f16 and always read from there
                               * (0 = off) */
    int center_k;             /* 1: key centering (kvq_layout.h, "key means"): each page
                               * stores its keys' mean per head and encodes the keys minus
                               * it; a page's keys are encoded when it fills, from their f16
                               * copies, so this needs recent_f16 (0 = off) */
};

typedef struct kvq_cache kvq_cache;

/** Fills cfg with defaults (tq3j/tq3, seed 0, HADAMARD, ORTHO, 64-token pages). */
KVQ_API void kvq_cache_config_default(struct kvq_cache_config *cfg, int n_kv_heads, int head_dim, size_t max_tokens);

/** Validates cfg, creates the K and V codecs and the page table (no pages yet).
 *  @return KVQ_OK and *out, or KVQ_ERR_INVALID_ARG / KVQ_ERR_UNSUPPORTED / KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_cache_create(const struct kvq_cache_config *cfg, kvq_cache **out);

/** Frees c and all its pages; accepts NULL. */
KVQ_API void kvq_cache_free(kvq_cache *c);

/** Makes room for n_tokens more tokens without appending them: allocates
 *  every page that appending them will need (all-or-nothing), so that the
 *  appends that follow cannot fail for the context or the budget.
 *  @return KVQ_OK; KVQ_ERR_CONTEXT_FULL; KVQ_ERR_BUDGET; KVQ_ERR_NOMEM;
 *  KVQ_ERR_INVALID_ARG (NULL). */
KVQ_API kvq_status kvq_cache_reserve(kvq_cache *c, size_t n_tokens);

/** Encodes and appends n_tokens tokens. All-or-nothing: every row is checked
 *  and every page needed is allocated before the first byte is written, so
 *  on any error the cache is exactly as before.
 *  @return KVQ_OK; KVQ_ERR_NONFINITE / KVQ_ERR_RANGE (bad input row, or
 *  with f16 overrides a value beyond the f16 range, 65504, in a row that gets
 *  an f16 copy);
 *  KVQ_ERR_CONTEXT_FULL (len + n_tokens > max_tokens); KVQ_ERR_BUDGET (a new
 *  page would exceed max_bytes); KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_cache_append(kvq_cache *c, size_t n_tokens, const float *k, const float *v);

/** Decodes tokens [t0, t0 + n) of one KV head into k and/or v ([n][head_dim]
 *  each; either may be NULL). Tokens with an f16 override (of the whole
 *  cache, len tokens) come from their f16 copy.
 *  @return KVQ_OK or KVQ_ERR_INVALID_ARG (range beyond len, bad head). */
KVQ_API kvq_status kvq_cache_read(const kvq_cache *c, int kv_head, size_t t0, size_t n, float *k, float *v);

/** @return the number of tokens held (0 when c is NULL). */
KVQ_API size_t kvq_cache_len(const kvq_cache *c);

/** Forgets all tokens; keeps the pages for reuse. */
KVQ_API void kvq_cache_reset(kvq_cache *c);

/** Frees the pages no held token uses (reset and truncate keep them for
 *  reuse): a pool of sequences that come and go (kvq_batch.h) gives their
 *  memory back. Pages reserved by kvq_cache_reserve beyond len are freed too.
 *  @return the bytes freed (0 when c is NULL). */
KVQ_API size_t kvq_cache_trim(kvq_cache *c);

/** Makes dst hold the first n_tokens tokens of src by sharing src's pages
 *  (no copy, no encode): dst must be empty (len 0; the pages it kept are
 *  let go), n_tokens a multiple of page_tokens and at most src's len, and
 *  both caches of one config (all but max_tokens and max_bytes equal). The
 *  sink f16 rows are copied; no recent-window copy is needed at a page
 *  boundary, so dst then reads exactly what src reads over those tokens, and
 *  what dst would read had it appended them itself. The shared pages count
 *  towards dst's max_bytes as its own. src is not changed (const: only the
 *  pages' hidden reference counts move).
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (NULL, dst == src, dst not empty,
 *  n_tokens not whole pages or beyond src's len, configs differ);
 *  KVQ_ERR_CONTEXT_FULL (n_tokens > dst's max_tokens); KVQ_ERR_BUDGET
 *  (the pages exceed dst's max_bytes). On error dst is unchanged. */
KVQ_API kvq_status kvq_cache_share(kvq_cache *dst, const kvq_cache *src, size_t n_tokens);

/** @return how many of c's allocated pages another cache also holds (0 when
 *  c is NULL). */
KVQ_API size_t kvq_cache_pages_shared(const kvq_cache *c);

/** Drops tokens [n, len) (speculative decoding rollback). n > len is an error.
 *  With recent_f16, see above for what a truncation into an earlier page
 *  does to the f16 copies.
 *  @return KVQ_OK or KVQ_ERR_INVALID_ARG. */
KVQ_API kvq_status kvq_cache_truncate(kvq_cache *c, size_t n);

/** The f16 overrides of a read over the first n tokens (n <= len): tokens
 *  [0, *sink_end) and [*tail_lo, n) come from f16 copies (*tail_lo == n:
 *  none), the packed pages serve [*sink_end, max(*sink_end, *tail_lo)).
 *  Without overrides *sink_end = 0 and *tail_lo = n.
 *  @return KVQ_OK or KVQ_ERR_INVALID_ARG (NULL, n > len). */
KVQ_API kvq_status kvq_cache_f16_view(const kvq_cache *c, size_t n, size_t *sink_end, size_t *tail_lo);

/** The f16 copy ([head_dim] halves) of token t's key (v = 0) or value
 *  (v = 1) for kv_head, when the cache holds one (a sink token, or a token
 *  of the recent ring); NULL otherwise. Use with kvq_cache_f16_view. */
KVQ_API const uint16_t *kvq_cache_f16_row(const kvq_cache *c, int v, int kv_head, size_t t);

struct kvq_cache_stats {
    size_t tokens;          /* len */
    size_t pages;           /* pages allocated (>= pages in use) */
    size_t page_bytes;      /* bytes of one page */
    size_t bytes_allocated; /* pages * page_bytes + bytes_f16_buffers */
    size_t bytes_used;      /* tokens * n_kv_heads * (K row + V row): what the tokens occupy */
    size_t bytes_f16;       /* what an f16 cache would use for the same tokens */
    size_t bytes_f16_buffers; /* the f16 override buffers (sink rows and recent ring),
                               * allocated once at create */
};
/** Fills *st (all zeros when c is NULL; a NULL st is ignored). */
KVQ_API void kvq_cache_get_stats(const kvq_cache *c, struct kvq_cache_stats *st);

/** Accessors. @return the cache's config (page_tokens resolved) / page
 *  layout / K and V codecs; NULL when c is NULL. Owned by c, valid until
 *  kvq_cache_free(c). */
KVQ_API const struct kvq_cache_config *kvq_cache_config_of(const kvq_cache *c);
KVQ_API const struct kvq_page_layout *kvq_cache_layout(const kvq_cache *c);
KVQ_API const kvq_codec *kvq_cache_codec_k(const kvq_cache *c);
KVQ_API const kvq_codec *kvq_cache_codec_v(const kvq_cache *c);

/** Pages currently allocated, and page i's bytes (kvq_cache_layout() says
 *  where each field is). Token t lives in page t / page_tokens, slot
 *  t % page_tokens. @return NULL when i is out of range. */
KVQ_API size_t kvq_cache_page_count(const kvq_cache *c);
KVQ_API const uint8_t *kvq_cache_page(const kvq_cache *c, size_t i);

/** With center_k: the key-mean block (kvq_layout.h) of KV head kv_head in
 *  page i, which every packed key of the page was encoded against (a
 *  decoded key is the codec's row plus kvq_key_mean_decode of it).
 *  @return NULL without center_k, out of range, or while the page's keys
 *  wait for it to fill. */
KVQ_API const uint8_t *kvq_cache_key_mean(const kvq_cache *c, size_t i, int kv_head);

/** Bytes a cache with this config needs for n_tokens tokens (whole pages,
 *  plus the f16 override buffers, which are allocated at create whatever
 *  n_tokens is). @return 0 when cfg is invalid. */
KVQ_API size_t kvq_cache_bytes_for(const struct kvq_cache_config *cfg, size_t n_tokens);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_CACHE_H */
