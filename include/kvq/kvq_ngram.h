/* kvq_ngram.h - n-gram drafts for speculative decoding, and the rule of how
 * many a verify pass may take.
 *
 * A table over a token history: for every n-gram length g = 1..n it maps
 * the g tokens ending at a position to the position of the token that
 * followed them (the latest occurrence wins). A draft continues the
 * history with what followed the previous occurrence of its last g tokens,
 * longest g first. Entries are hints, confirmed against the history, so a
 * collision or a rollback costs a lookup, never a wrong draft (and the
 * verify pass decides what is kept anyway). kvq_seq_generate drafts with
 * one of these; a server decoding many sequences keeps one per sequence.
 *
 * The history is the caller's: every call passes it (tokens[0..len)), and
 * it may only grow, or shrink through kvq_ngram_truncate.
 */
#ifndef KVQ_NGRAM_H
#define KVQ_NGRAM_H

#include "kvq_export.h"

#include <stddef.h>
#include <stdint.h>

#include "kvq_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvq_ngram kvq_ngram;

/** A table for n-grams of 1..n tokens (n >= 1; 0 = 3) over histories of up
 *  to max_len tokens; its size stops growing at 2^18 slots per length
 *  (older n-grams are then overwritten sooner, fewer drafts).
 *  @return KVQ_OK and *out; KVQ_ERR_INVALID_ARG; KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_ngram_create(int n, size_t max_len, kvq_ngram **out);

/** Frees g; accepts NULL. */
KVQ_API void kvq_ngram_free(kvq_ngram *g);

/** Forgets every entry (a new history). */
KVQ_API void kvq_ngram_clear(kvq_ngram *g);

/** Indexes tokens[0..len) up to position len - 2 (those with a known
 *  successor); positions indexed before are not read again. */
KVQ_API void kvq_ngram_update(kvq_ngram *g, const int32_t *tokens, size_t len);

/** The history was cut to len tokens: positions from len on are indexed
 *  again when they come back. */
KVQ_API void kvq_ngram_truncate(kvq_ngram *g, size_t len);

/** Up to max tokens continuing tokens[0..len) into out. @return how many. */
KVQ_API int kvq_ngram_draft(const kvq_ngram *g, const int32_t *tokens, size_t len, int32_t *out, int max);

/** Drafts a verify pass at position pos (the pending token's) may carry:
 *  want, cut where it must be. With the recent-token f16 window
 *  (recent_f16) a verify pass must not fill the page of page_tokens
 *  tokens: a rollback then stays in the page the window's ring holds
 *  (kvq_cache.h), and a centred page's key mean comes from accepted tokens
 *  only, so the output is plain decoding's; the page's last two positions
 *  take no drafts. */
KVQ_API size_t kvq_draft_limit(size_t pos, int recent_f16, size_t page_tokens, size_t want);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_NGRAM_H */
