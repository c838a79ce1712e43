/* kvq_rng.h - the one deterministic random source of kvq (header only).
 *
 * Rotation signs, QJL projections and synthetic test data must be identical
 * on every platform and backend for a given seed, so kvq never uses rand():
 * splitmix64 expands a user seed into independent streams, xoshiro256** draws.
 */
#ifndef KVQ_RNG_H
#define KVQ_RNG_H

#include <math.h>
#include <stdint.h>

#include "kvq_half.h" /* KVQ_HD */

typedef struct kvq_rng {
    uint64_t s[4];
} kvq_rng;

KVQ_HD static inline uint64_t kvq_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Seeds for different purposes (K rotation, QJL projection, ...) are derived
 * with distinct stream ids so that they are statistically independent. */
KVQ_HD static inline uint64_t kvq_seed_derive(uint64_t seed, uint64_t stream)
{
    uint64_t st = seed ^ (stream * 0xd1b54a32d192ed03ull);
    kvq_splitmix64(&st);
    return kvq_splitmix64(&st);
}

KVQ_HD static inline void kvq_rng_init(kvq_rng *r, uint64_t seed)
{
    uint64_t st = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = kvq_splitmix64(&st);
}

KVQ_HD static inline uint64_t kvq_rng_next(kvq_rng *r)
{
    uint64_t *s = r->s;
    uint64_t x = s[1] * 5u;
    uint64_t result = ((x << 7) | (x >> 57)) * 9u;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return result;
}

/** Uniform double in [0, 1) with 53 random bits. */
KVQ_HD static inline double kvq_rng_uniform(kvq_rng *r)
{
    return (double)(kvq_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/** Standard normal draw (Box-Muller, one value per call; not for hot paths). */
static inline double kvq_rng_gauss(kvq_rng *r)
{
    double u1 = kvq_rng_uniform(r), u2 = kvq_rng_uniform(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

#endif /* KVQ_RNG_H */
