/* codebook.c - the codebooks the library uses: shipped tables first, computed
 * ones otherwise; and the dist name helpers. */
#include "codebook_internal.h"

#include <string.h>

static const struct kvq_codebook_table *find_shipped(int dim, int bits, enum kvq_dist dist)
{
    if (dist != KVQ_DIST_BETA)
        return NULL;
    for (int i = 0; i < kvq_codebook_tables_count; i++)
        if (kvq_codebook_tables[i].dim == dim && kvq_codebook_tables[i].bits == bits)
            return &kvq_codebook_tables[i];
    return NULL;
}

int kvq_codebook_is_shipped(int dim, int bits, enum kvq_dist dist)
{
    return find_shipped(dim, bits, dist) != NULL;
}

/* No cache: a table is a few hundred doubles copied out of .rodata, and an
 * on-demand computation takes milliseconds, so nothing shared is written and
 * the function is thread-safe without locks. */
kvq_status kvq_codebook_get(int dim, int bits, enum kvq_dist dist, kvq_codebook *out)
{
    if (!out)
        return KVQ_ERR_INVALID_ARG;
    const struct kvq_codebook_table *t = find_shipped(dim, bits, dist);
    if (!t)
        return kvq_codebook_compute(dim, bits, dist, out);
    kvq_codebook r;
    memset(&r, 0, sizeof r); /* padding too, as kvq_codebook_compute does */
    r.dim = dim;
    r.bits = bits;
    r.dist = dist;
    r.levels = 1 << bits;
    r.mse = t->mse;
    r.iterations = 0;
    for (int i = 0; i < r.levels; i++)
        r.centroids[i] = t->centroids[i];
    /* Same rounding as kvq_codebook_compute: midpoint in long double, then double. */
    for (int i = 0; i + 1 < r.levels; i++)
        r.boundaries[i] =
            (double)(0.5L * ((long double)r.centroids[i] + (long double)r.centroids[i + 1]));
    memcpy(out, &r, sizeof r);
    return KVQ_OK;
}

const char *kvq_dist_name(enum kvq_dist dist)
{
    switch (dist) {
    case KVQ_DIST_BETA:  return "beta";
    case KVQ_DIST_GAUSS: return "gauss";
    }
    return NULL;
}

kvq_status kvq_dist_from_name(const char *name, enum kvq_dist *out)
{
    if (!name || !out)
        return KVQ_ERR_INVALID_ARG;
    if (strcmp(name, "beta") == 0)
        *out = KVQ_DIST_BETA;
    else if (strcmp(name, "gauss") == 0)
        *out = KVQ_DIST_GAUSS;
    else
        return KVQ_ERR_INVALID_ARG;
    return KVQ_OK;
}
