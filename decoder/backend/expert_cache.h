/* expert_cache.h - a bounded cache of mixture-of-experts weights read on
 * demand from the checkpoint's files (CPU).
 *
 * Without it the experts are read where the files are mapped, and every
 * expert a prompt touches stays resident. With it the mapped expert pages
 * are never touched: each expert the router picks is pread into one of a
 * fixed number of slots (one expert each, allocated at create), the least
 * recently used slot giving way, the missing experts of a call read in
 * parallel on the decoder's thread pool. The bytes read are the file's
 * bytes, so the products see the same values as from the mapping and the
 * results are bit-identical to a run without the cache.
 *
 * Read-ahead (kvq_expert_cache_prefetch): experts a caller expects soon
 * (moe_cpu.c: the next sparse layer's router run on this layer's input) are
 * read into free or least recently used slots by one reader thread while
 * the forward goes on; a fetch that finds one still being read waits for
 * it. Slots of the last fetch are never taken, so its matrices stay valid.
 */
#ifndef KVQ_EXPERT_CACHE_H
#define KVQ_EXPERT_CACHE_H

#include <stddef.h>

#include "decoder_internal.h"

struct kvq_expert_cache;

struct kvq_expert_cache_stats {
    size_t slots, slot_bytes; /* capacity: experts held, bytes each */
    size_t hits, misses;      /* expert fetches served from a slot / read from the file */
    size_t bytes_read;        /* by the fetches themselves */
    double read_seconds;      /* wall time of those reads */
    size_t prefetched;        /* experts read ahead */
    size_t prefetch_bytes;    /* their bytes */
    double prefetch_seconds;  /* the reader's time reading them */
    size_t prefetch_hits;     /* fetches served by an expert read ahead (among hits) */
    double prefetch_wait_seconds; /* fetches waiting for a read-ahead to finish */
};

/** A cache of at most `bytes` bytes of m's experts (as many whole experts
 *  as fit). m's experts must be mapped from its files (not weights_f32).
 *  direct: the files are read with O_DIRECT, each block of an expert as the
 *  4 KiB-aligned range around it (a slot holds the ranges; the matrices
 *  point into them), so no read goes through the page cache.
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (no experts, not mapped, bytes below
 *  one expert); KVQ_ERR_IO (a file cannot be opened, or not with O_DIRECT);
 *  KVQ_ERR_NOMEM. */
kvq_status kvq_expert_cache_create(const struct kvq_model *m, size_t bytes, int direct, struct kvq_expert_cache **out,
                                   kvq_error *err);
void kvq_expert_cache_free(struct kvq_expert_cache *c);

/** Experts one fetch can hold at once (the slots). */
int kvq_expert_cache_slots(const struct kvq_expert_cache *c);

/** Makes experts ids[0..n) (distinct, n <= slots) of layer l resident and
 *  gives their matrices in gu[i] and down[i], valid until the next fetch.
 *  @return KVQ_OK; KVQ_ERR_IO (a read failed: nothing of it is kept). */
kvq_status kvq_expert_cache_fetch(struct kvq_expert_cache *c, int l, const int32_t *ids, int n,
                                  const struct kvq_wmat **gu, const struct kvq_wmat **down);

/** Starts reading experts ids[0..n) of layer l (most wanted first) into
 *  slots the last fetch does not hold, in the background, as far as such
 *  slots go; experts already held or being read are skipped.
 *  @return the experts whose reads it started. */
int kvq_expert_cache_prefetch(struct kvq_expert_cache *c, int l, const int32_t *ids, int n);

void kvq_expert_cache_get_stats(struct kvq_expert_cache *c, struct kvq_expert_cache_stats *st);

/* Why the last fetch failed with KVQ_ERR_IO (file, bytes, offset,
 * reason); NULL when it did not. Valid until the next fetch. */
const char *kvq_expert_cache_error(const struct kvq_expert_cache *c);

#endif
