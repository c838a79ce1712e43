/* ngram.c - the n-gram table of a sequence, for speculative drafts.
 *
 * For every n-gram length g = 1..N the table maps the hash of the g tokens
 * ending at history position p to p + 1, the position of the token that
 * followed them (the latest occurrence wins). A draft looks up the last g
 * tokens, longest g first, and proposes what followed their previous
 * occurrence. Entries are only hints: a hit is confirmed against the history,
 * so collisions and entries made stale by a rollback cost a lookup, never a
 * wrong answer (and the verify pass decides what is kept anyway).
 */
#include <string.h>

#include "decoder_internal.h"

static size_t slot(const kvq_seq *s, const int32_t *t, int g)
{
    uint64_t h = 0x9e3779b97f4a7c15ull * (uint64_t)g;
    for (int i = 0; i < g; i++) {
        h ^= (uint32_t)t[i];
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    return (size_t)(g - 1) * (s->ngram_mask + 1) + (size_t)(h & s->ngram_mask);
}

void kvq_ngram_clear(kvq_seq *s)
{
    memset(s->ngram_pos, 0, (size_t)s->cfg.ngram * (s->ngram_mask + 1) * sizeof *s->ngram_pos);
    s->ngram_indexed = 0;
}

void kvq_ngram_update(kvq_seq *s, size_t len)
{
    for (size_t p = s->ngram_indexed; p + 1 < len; p++)
        for (int g = 1; g <= s->cfg.ngram && (size_t)g <= p + 1; g++)
            s->ngram_pos[slot(s, s->tokens + p + 1 - g, g)] = (int32_t)(p + 1);
    if (len > s->ngram_indexed + 1)
        s->ngram_indexed = len - 1;
}

int kvq_ngram_draft(const kvq_seq *s, size_t len, int32_t *out, int max)
{
    const int32_t *t = s->tokens;
    for (int g = s->cfg.ngram; g >= 1 && max > 0; g--) {
        if ((size_t)g > len)
            continue;
        const int32_t *ctx = t + len - g;
        size_t q = (size_t)s->ngram_pos[slot(s, ctx, g)];
        /* q must leave a continuation before the context itself. */
        if (q < (size_t)g || q >= len || memcmp(t + q - g, ctx, (size_t)g * sizeof *t) != 0)
            continue;
        int n = 0;
        while (n < max && q + (size_t)n < len) {
            out[n] = t[q + (size_t)n];
            n++;
        }
        return n;
    }
    return 0;
}
