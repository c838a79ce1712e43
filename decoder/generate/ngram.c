/* ngram.c - the n-gram table of speculative drafts (kvq_ngram.h).
 *
 * For every n-gram length g = 1..N the table maps the hash of the g tokens
 * ending at history position p to p + 1, the position of the token that
 * followed them (the latest occurrence wins). A draft looks up the last g
 * tokens, longest g first, and proposes what followed their previous
 * occurrence. Entries are only hints: a hit is confirmed against the history,
 * so collisions and entries made stale by a rollback cost a lookup, never a
 * wrong answer (and the verify pass decides what is kept anyway).
 */
#include <stdlib.h>
#include <string.h>

#include "kvq_ngram.h"

/* a hash table: past NGRAM_MAX_SLOTS / 2 tokens older n-grams are just
 * overwritten sooner (fewer drafts), so its size, cleared at every reset,
 * stays independent of a million-token context */
#define NGRAM_MAX_SLOTS ((size_t)1 << 18)

struct kvq_ngram {
    int n;          /* longest n-gram */
    int32_t *pos;   /* [n][mask + 1] */
    size_t mask;
    size_t indexed; /* history positions already in the table */
};

kvq_status kvq_ngram_create(int n, size_t max_len, kvq_ngram **out)
{
    if (!out || n < 0)
        return KVQ_ERR_INVALID_ARG;
    kvq_ngram *g = calloc(1, sizeof *g);
    if (!g)
        return KVQ_ERR_NOMEM;
    g->n = n ? n : 3;
    g->mask = 1;
    while (g->mask < 2 * max_len && g->mask < NGRAM_MAX_SLOTS)
        g->mask <<= 1;
    g->pos = malloc((size_t)g->n * g->mask * sizeof *g->pos);
    g->mask--;
    if (!g->pos) {
        kvq_ngram_free(g);
        return KVQ_ERR_NOMEM;
    }
    kvq_ngram_clear(g);
    *out = g;
    return KVQ_OK;
}

void kvq_ngram_free(kvq_ngram *g)
{
    if (!g)
        return;
    free(g->pos);
    free(g);
}

static size_t slot(const kvq_ngram *g, const int32_t *t, int n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull * (uint64_t)n;
    for (int i = 0; i < n; i++) {
        h ^= (uint32_t)t[i];
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    return (size_t)(n - 1) * (g->mask + 1) + (size_t)(h & g->mask);
}

void kvq_ngram_clear(kvq_ngram *g)
{
    memset(g->pos, 0, (size_t)g->n * (g->mask + 1) * sizeof *g->pos);
    g->indexed = 0;
}

void kvq_ngram_update(kvq_ngram *g, const int32_t *tokens, size_t len)
{
    for (size_t p = g->indexed; p + 1 < len; p++)
        for (int n = 1; n <= g->n && (size_t)n <= p + 1; n++)
            g->pos[slot(g, tokens + p + 1 - n, n)] = (int32_t)(p + 1);
    if (len > g->indexed + 1)
        g->indexed = len - 1;
}

void kvq_ngram_truncate(kvq_ngram *g, size_t len)
{
    if (g->indexed > len)
        g->indexed = len;
}

int kvq_ngram_draft(const kvq_ngram *g, const int32_t *t, size_t len, int32_t *out, int max)
{
    for (int n = g->n; n >= 1 && max > 0; n--) {
        if ((size_t)n > len)
            continue;
        const int32_t *ctx = t + len - n;
        size_t q = (size_t)g->pos[slot(g, ctx, n)];
        /* q must leave a continuation before the context itself. */
        if (q < (size_t)n || q >= len || memcmp(t + q - n, ctx, (size_t)n * sizeof *t) != 0)
            continue;
        int k = 0;
        while (k < max && q + (size_t)k < len) {
            out[k] = t[q + (size_t)k];
            k++;
        }
        return k;
    }
    return 0;
}

size_t kvq_draft_limit(size_t pos, int recent_f16, size_t page_tokens, size_t want)
{
    if (!recent_f16 || !page_tokens)
        return want;
    const size_t left = page_tokens - 1 - pos % page_tokens;
    return left ? (want < left - 1 ? want : left - 1) : 0;
}
