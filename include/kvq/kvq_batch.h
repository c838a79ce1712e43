/* kvq_batch.h - many sequences of one model over one KV page pool, advanced
 * together: one forward per step carries a decode row for each running
 * sequence and chunks of prompts being prefilled (continuous batching, as a
 * server runs it).
 *
 * A batch owns one backend (activation buffers for max_rows rows) and one KV
 * store of max_seqs slots. All slots share one budget: cfg.seq.kv_budget
 * bytes hold every slot's f16 override buffers (recent window, sinks;
 * allocated at create) and a pool of pages, where one page is page_tokens
 * tokens of one sequence in every layer. A slot of n tokens holds
 * ceil(n / page_tokens) pages; a step that would need more pages than the
 * pool has free is refused as a whole (KVQ_ERR_BUDGET) before anything
 * runs, so a scheduler can admit work by kvq_batch_pages_for and always
 * knows where it stands. Removing a slot gives its pages back at once.
 *
 * Prefix sharing: kvq_batch_share makes an empty slot hold the first n
 * tokens of another slot by referencing its whole pages (one copy in the
 * pool, counted once in pages_used). A page is returned to the pool when the
 * last slot holding it lets go (remove, truncate); no slot writes a page
 * another holds: sharing stops at the last whole page, so new tokens go to
 * the slot's own pages, and an append after a truncation into a shared page
 * copies that page first (copy on write, one more page in the step's
 * check). Sharing is exact: the tokens' bytes are the ones the source
 * encoded, so a sharer computes bit-identical logits to a sequence that
 * prefilled the same tokens in the same chunks, on the CPU and on the GPU
 * (kvq_cuda_cache_share).
 *
 * Sliding-window models (Mistral's sliding_window, Gemma 3's local layers)
 * run on the CPU: a windowed layer keeps a ring of its last tokens, so it
 * holds no prefix to share (kvq_batch_stats.can_share) and rolls back only
 * the last few hundred tokens (can_rollback); the page count still counts
 * its pages as a full layer's, so the pool never promises more than the
 * caches take. On the GPU, create refuses them (one line).
 *
 * One engine: a sequence state (kvq_seq) is slot 0 of a batch of one, so
 * the forward, the store, the backend and their checks are the same code.
 *
 * Determinism: on the CPU a sequence's logits are bit-identical whether it
 * runs alone or batched with any others, for the same chunk boundaries (its
 * rows meet the same kernels: see decoder/model/forward.c); so greedy and
 * seeded sampled tokens are too. A sequence state (kvq_seq) prefilling in
 * chunks of max_chunk and decoding one token at a time computes the same
 * logits as a slot fed the same chunks.
 *
 * Threading: one thread drives a batch; the model may be shared.
 */
#ifndef KVQ_BATCH_H
#define KVQ_BATCH_H

#include "kvq_export.h"

#include <stddef.h>
#include <stdint.h>

#include "kvq_model.h"
#include "kvq_sampler.h"
#include "kvq_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvq_batch kvq_batch;

struct kvq_batch_config {
    struct kvq_seq_config seq; /* device, cache types, codec seed, window, sinks, max_ctx
                                * (per slot), and kv_budget: the whole pool, all slots */
    int max_seqs;              /* slots (default 8) */
    int max_rows;              /* rows of one step over all its sequences
                                * (default kvq_default_max_chunk(seq.device)
                                * + max_seqs) */
};

/** kvq_seq_config_default for seq, 8 slots, max_rows 0 (= 256 + max_seqs). */
KVQ_API void kvq_batch_config_default(struct kvq_batch_config *cfg);

/** Creates the batch: backend, store, slots (all free), page accounting.
 *  @return KVQ_OK and *out; KVQ_ERR_INVALID_ARG; KVQ_ERR_UNSUPPORTED (a
 *  cache type for this head_dim, or a device limitation); KVQ_ERR_BUDGET
 *  (kv_budget does not hold every slot's f16 buffers plus one page);
 *  KVQ_ERR_NOMEM; KVQ_ERR_NO_DEVICE. err gets one line. */
KVQ_API kvq_status kvq_batch_create(const kvq_model *m, const struct kvq_batch_config *cfg, kvq_batch **out,
                                    kvq_error *err);

/** Frees b; accepts NULL. */
KVQ_API void kvq_batch_free(kvq_batch *b);

/** Takes a free slot (empty). @return KVQ_OK and *slot; KVQ_ERR_BUDGET when
 *  every slot is taken. */
KVQ_API kvq_status kvq_batch_add(kvq_batch *b, int *slot);

/** Empties slot and frees it; its pages go back to the pool. Accepts a free
 *  or out-of-range slot (no-op). */
KVQ_API void kvq_batch_remove(kvq_batch *b, int slot);

/** Drops tokens [n, len) of slot (pages past n go back to the pool).
 *  @return KVQ_OK or KVQ_ERR_INVALID_ARG (free slot, n > len). */
KVQ_API kvq_status kvq_batch_truncate(kvq_batch *b, int slot, size_t n);

/** Tokens slot holds (0 for a free slot). */
KVQ_API size_t kvq_batch_len(const kvq_batch *b, int slot);

/** Makes the taken, empty slot dst hold tokens [0, n) of slot src by
 *  sharing src's pages: no forward, no encode, no new page. n must be a
 *  multiple of page_tokens (kvq_batch_get_stats) and at most src's length;
 *  dst then has length n and continues with its own tokens (kvq_batch_step).
 *  src is not changed; either slot may be removed or truncated first, each
 *  releases only its own references.
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (a free or out-of-range slot, dst ==
 *  src, dst not empty, n not whole pages or beyond src's length: nothing
 *  changed); KVQ_ERR_UNSUPPORTED (a sliding-window layer:
 *  kvq_batch_stats.can_share; nothing changed). err gets one line. */
KVQ_API kvq_status kvq_batch_share(kvq_batch *b, int dst, int src, size_t n, kvq_error *err);

/** The pool's page counts as kvq_batch_get_stats gives them (pages_used,
 *  pages_shared, page_refs) without walking the caches: cheap enough for
 *  every step. Any pointer may be NULL; all zero when b is NULL. */
KVQ_API void kvq_batch_page_counts(const kvq_batch *b, size_t *used, size_t *shared, size_t *refs);

/** Pages a sequence of n tokens holds: ceil(n / page_tokens). */
KVQ_API size_t kvq_batch_pages_for(const kvq_batch *b, size_t n);

/* One sequence's part of a step: n tokens appended at the slot's length. */
struct kvq_batch_item {
    int slot;
    const int32_t *ids; /* [n], each in [0, vocab) */
    size_t n;           /* >= 1 */
    float *logits;      /* [vocab] logits after the item's last token, or NULL */
    int32_t *argmax;    /* greedy token after the last token (lowest id on ties), or NULL */
    /* The token after the last token drawn by sampler (its settings; one
     * draw of its RNG, made only when the row's logits are finite) into
     * *token, computed where the logits are: on a GPU only the id comes
     * back. Both NULL: no draw; -1 in *token for a row whose logits are
     * not finite. */
    kvq_sampler *sampler;
    int32_t *token;
    /* 0 or 1: the outputs above are for the last row. 2..KVQ_MAX_DRAFT + 1
     * (a speculative verify pass: a pending token and its drafts): the
     * token after each of the last n_out rows, greedy into argmax[0..n_out)
     * or drawn by sampler into token[0..n_out) (row j at its j-th next
     * uniform; the step does not advance its RNG: the caller skips past
     * the draws it keeps, kvq_sampler_skip), never both, logits NULL. Each
     * row meets the kernels a row of its own would (on the CPU:
     * bit-identical to decoding them one by one), so the verified tokens
     * are plain decoding's. */
    size_t n_out;
};

/** Runs every item in one forward (items in order: put decode rows first;
 *  at most one item per slot; the sum of n at most max_rows). Items with
 *  logits, argmax or a sampler get the LM head of their last row only.
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (free or repeated slot, n = 0, rows
 *  over max_rows: nothing run); KVQ_ERR_RANGE (an id out of range: nothing
 *  run); KVQ_ERR_CONTEXT_FULL (an item past max_ctx: nothing run);
 *  KVQ_ERR_BUDGET (not enough free pages: nothing run); another error from
 *  the forward (every item rolled back); KVQ_ERR_NONFINITE (NaN/Inf logits:
 *  the tokens stay appended) or KVQ_ERR_INVALID_ARG (a sampled row whose
 *  every logit is -Inf), the other items' outputs written. */
KVQ_API kvq_status kvq_batch_step(kvq_batch *b, const struct kvq_batch_item *items, int n_items, kvq_error *err);

struct kvq_batch_stats {
    int max_seqs, active;     /* slots, slots taken */
    size_t max_rows;          /* rows per step */
    size_t max_ctx;           /* tokens per slot */
    size_t page_tokens;       /* tokens per page */
    size_t page_bytes;        /* bytes of one page: page_tokens tokens in every layer */
    size_t pages_total;       /* the pool (SIZE_MAX / page_tokens when there is no budget) */
    size_t pages_used;        /* held by the slots' tokens (a shared page once) */
    size_t pages_shared;      /* of those, pages two slots or more hold (kvq_batch_share) */
    size_t page_refs;         /* pages the slots would hold without sharing: sum of
                               * kvq_batch_pages_for(len) over taken slots */
    size_t bytes_per_token;   /* encoded K+V bytes of one token, all layers */
    size_t fixed_bytes;       /* f16 override buffers of all slots */
    size_t kv_budget;         /* as configured (0 = none) */
    size_t bytes_allocated;   /* memory the slots' caches hold now: pages and f16 buffers */
    size_t steps, rows;       /* forwards run, rows through them */
    double t_matmul, t_attn, t_lm_head, t_total; /* seconds in steps */
    /* KVQ_DEVICE_CUDA: seconds of GPU time per part over the steps, as
     * kvq_seq_stats.gpu_* (attention includes the cache's appends; other:
     * embedding, norms, RoPE, GLU); 0 on the CPU. */
    double gpu_matmul, gpu_attn, gpu_lm_head, gpu_other;
    int can_share;            /* 1: kvq_batch_share works (no layer has a sliding window:
                               * kvq_layer_spec.can_share) */
    int can_rollback;         /* 1: a truncation to any length keeps a slot exact; 0: only
                               * the last few hundred tokens (sliding-window layers:
                               * kvq_layer_spec.can_rollback) */
    struct kvq_expert_stats experts; /* kvq_batch_config.seq.expert_cache: one cache for all slots */
};
KVQ_API void kvq_batch_get_stats(const kvq_batch *b, struct kvq_batch_stats *st);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_BATCH_H */
