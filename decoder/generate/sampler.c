/* sampler.c - exact temperature / top-k / top-p sampling (see kvq_sampler.h).
 *
 * Plan: create() sizes every buffer for the vocabulary. Execute: sample()
 * checks the logits, orders them when a cut needs an order (an LSD radix sort
 * on the float bits: O(V), stable, no allocation - qsort may malloc), and
 * walks the cumulative mass in double precision.
 */
#include "kvq_sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decoder_internal.h"
#include "kvq_rng.h"

#define RADIX_BITS 11
#define RADIX_SIZE (1u << RADIX_BITS)
#define SAMPLER_STREAM 0x73616d706c6572ull /* "sampler": keeps draws apart from other uses of a seed */

struct kvq_sampler {
    int32_t vocab;
    kvq_sampler_params p;
    kvq_rng rng;
    uint32_t *key, *key_tmp; /* sort keys: descending logit order as ascending uint32 */
    int32_t *idx, *idx_tmp;  /* token ids in that order */
    double *w;               /* unnormalised weight of the i-th token in order */
    uint32_t count[RADIX_SIZE];
};

kvq_sampler_params kvq_sampler_params_default(void)
{
    kvq_sampler_params p = {0.0f, 0, 1.0f, 0};
    return p;
}

kvq_status kvq_sampler_params_check(const kvq_sampler_params *p)
{
    if (!p)
        return KVQ_ERR_INVALID_ARG;
    if (!(p->temperature >= 0.0f) || isinf(p->temperature))
        return KVQ_ERR_INVALID_ARG;
    if (p->top_k < 0)
        return KVQ_ERR_INVALID_ARG;
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return KVQ_ERR_INVALID_ARG;
    return KVQ_OK;
}

kvq_status kvq_sampler_create(int32_t vocab_size, const kvq_sampler_params *p, kvq_sampler **out)
{
    if (!out)
        return KVQ_ERR_INVALID_ARG;
    *out = NULL;
    if (vocab_size < 1 || kvq_sampler_params_check(p) != KVQ_OK)
        return KVQ_ERR_INVALID_ARG;
    kvq_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return KVQ_ERR_NOMEM;
    size_t V = (size_t)vocab_size;
    s->vocab = vocab_size;
    s->key = malloc(V * sizeof *s->key);
    s->key_tmp = malloc(V * sizeof *s->key_tmp);
    s->idx = malloc(V * sizeof *s->idx);
    s->idx_tmp = malloc(V * sizeof *s->idx_tmp);
    s->w = malloc(V * sizeof *s->w);
    if (!s->key || !s->key_tmp || !s->idx || !s->idx_tmp || !s->w) {
        kvq_sampler_free(s);
        return KVQ_ERR_NOMEM;
    }
    s->p = *p;
    kvq_sampler_reset(s);
    *out = s;
    return KVQ_OK;
}

void kvq_sampler_free(kvq_sampler *s)
{
    if (!s)
        return;
    free(s->key);
    free(s->key_tmp);
    free(s->idx);
    free(s->idx_tmp);
    free(s->w);
    free(s);
}

kvq_status kvq_sampler_set_params(kvq_sampler *s, const kvq_sampler_params *p)
{
    if (!s || kvq_sampler_params_check(p) != KVQ_OK)
        return KVQ_ERR_INVALID_ARG;
    s->p = *p;
    kvq_sampler_reset(s);
    return KVQ_OK;
}

kvq_sampler_params kvq_sampler_get_params(const kvq_sampler *s)
{
    kvq_sampler_params z;
    memset(&z, 0, sizeof z);
    return s ? s->p : z;
}

void kvq_sampler_reset(kvq_sampler *s)
{
    if (s)
        kvq_rng_init(&s->rng, kvq_seed_derive(s->p.seed, SAMPLER_STREAM));
}

/* ---- greedy ----------------------------------------------------------------- */

kvq_best kvq_best_none(void)
{
    kvq_best b = {-1, -INFINITY};
    return b;
}

kvq_status kvq_argmax(const float *logits, int32_t n, int32_t first_token, kvq_best *best)
{
    if (!logits || !best || n < 1)
        return KVQ_ERR_INVALID_ARG;
    int32_t arg = 0;
    float m = logits[0];
    int bad = 0;
    for (int32_t i = 0; i < n; i++) {
        float x = logits[i];
        bad |= isnan(x) || x == INFINITY;
        if (x > m) {
            m = x;
            arg = i;
        }
    }
    if (bad)
        return KVQ_ERR_NONFINITE;
    best->token = first_token + arg;
    best->score = m;
    return KVQ_OK;
}

void kvq_best_merge(kvq_best *acc, kvq_best b)
{
    if (!acc || b.token < 0)
        return;
    if (acc->token < 0 || b.score > acc->score || (b.score == acc->score && b.token < acc->token))
        *acc = b;
}

/* ---- sampling --------------------------------------------------------------- */

/* Monotone map of a (non-NaN) float to uint32, inverted so that ascending
 * keys mean descending logits. */
static uint32_t desc_key(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~u;
}

/* Stable LSD radix sort of (key, idx), ids ascending to start with, so equal
 * logits stay in ascending id order. */
static void sort_desc(kvq_sampler *s, const float *logits)
{
    int32_t V = s->vocab;
    for (int32_t i = 0; i < V; i++) {
        s->key[i] = desc_key(logits[i]);
        s->idx[i] = i;
    }
    for (int shift = 0; shift < 32; shift += RADIX_BITS) {
        memset(s->count, 0, sizeof s->count);
        for (int32_t i = 0; i < V; i++)
            s->count[(s->key[i] >> shift) & (RADIX_SIZE - 1)]++;
        uint32_t sum = 0;
        for (uint32_t b = 0; b < RADIX_SIZE; b++) {
            uint32_t c = s->count[b];
            s->count[b] = sum;
            sum += c;
        }
        for (int32_t i = 0; i < V; i++) {
            uint32_t pos = s->count[(s->key[i] >> shift) & (RADIX_SIZE - 1)]++;
            s->key_tmp[pos] = s->key[i];
            s->idx_tmp[pos] = s->idx[i];
        }
        uint32_t *tk = s->key;
        s->key = s->key_tmp;
        s->key_tmp = tk;
        int32_t *ti = s->idx;
        s->idx = s->idx_tmp;
        s->idx_tmp = ti;
    }
}

/* Builds the kept set: s->idx[0..*n_kept) with weights s->w[] (unnormalised,
 * summing to *mass). When no cut needs an order, tokens stay in id order. */
static void kept_set(kvq_sampler *s, const float *logits, float max_logit, int32_t *n_kept, double *mass)
{
    int32_t V = s->vocab;
    int32_t k = s->p.top_k > 0 && s->p.top_k < V ? s->p.top_k : V;
    int ordered = k < V || s->p.top_p < 1.0f;
    double inv_t = 1.0 / (double)s->p.temperature;
    if (!ordered) {
        for (int32_t i = 0; i < V; i++)
            s->idx[i] = i;
    } else {
        sort_desc(s, logits);
    }
    /* Top-k by value: everything tied with the k-th largest logit stays. */
    int32_t n = k;
    if (ordered) {
        float kth = logits[s->idx[k - 1]];
        while (n < V && logits[s->idx[n]] == kth)
            n++;
    }
    double z = 0.0;
    for (int32_t i = 0; i < n; i++) {
        /* The difference of two floats is exact in double. */
        s->w[i] = exp(((double)logits[s->idx[i]] - (double)max_logit) * inv_t);
        z += s->w[i];
    }
    /* Top-p: keep token r while the mass before it is < top_p of the total. */
    if (s->p.top_p < 1.0f) {
        double limit = (double)s->p.top_p * z, before = 0.0;
        int32_t r = 0;
        while (r < n && before < limit)
            before += s->w[r++];
        n = r;
        z = before;
    }
    *n_kept = n;
    *mass = z;
}

/* Checks the logits. @return KVQ_OK and the max, or the error. */
static kvq_status scan(const kvq_sampler *s, const float *logits, kvq_best *best)
{
    kvq_status st = kvq_argmax(logits, s->vocab, 0, best);
    if (st == KVQ_OK && best->score == -INFINITY)
        st = KVQ_ERR_INVALID_ARG; /* every token masked */
    return st;
}

kvq_status kvq_sampler_pick(kvq_sampler *s, const float *logits, double u, int32_t *token)
{
    if (!token)
        return KVQ_ERR_INVALID_ARG;
    *token = -1;
    if (!s || !logits)
        return KVQ_ERR_INVALID_ARG;
    kvq_best best;
    kvq_status st = scan(s, logits, &best);
    if (st)
        return st;
    if (s->p.temperature == 0.0f) {
        *token = best.token;
        return KVQ_OK;
    }
    int32_t n;
    double mass;
    kept_set(s, logits, best.score, &n, &mass);
    double target = u * mass, acc = 0.0;
    for (int32_t i = 0; i < n; i++) {
        acc += s->w[i];
        if (acc > target) {
            *token = s->idx[i];
            return KVQ_OK;
        }
    }
    /* Rounding left the target at the very top: the last token of positive weight. */
    for (int32_t i = n - 1; i >= 0; i--)
        if (s->w[i] > 0.0) {
            *token = s->idx[i];
            break;
        }
    return KVQ_OK;
}

void kvq_sampler_peek(const kvq_sampler *s, double *u, int n)
{
    kvq_rng r = s->rng;
    for (int i = 0; i < n; i++)
        u[i] = s->p.temperature == 0.0f ? 0.0 : kvq_rng_uniform(&r);
}

void kvq_sampler_skip(kvq_sampler *s, int n)
{
    for (int i = 0; s && i < n && s->p.temperature != 0.0f; i++)
        (void)kvq_rng_uniform(&s->rng);
}

kvq_status kvq_sampler_sample(kvq_sampler *s, const float *logits, int32_t *token)
{
    double u;
    if (!s) {
        if (token)
            *token = -1;
        return KVQ_ERR_INVALID_ARG;
    }
    kvq_sampler_peek(s, &u, 1);
    kvq_status st = kvq_sampler_pick(s, logits, u, token);
    if (st == KVQ_OK)
        kvq_sampler_skip(s, 1);
    return st;
}

kvq_status kvq_sampler_probs(kvq_sampler *s, const float *logits, double *probs)
{
    if (!s || !logits || !probs)
        return KVQ_ERR_INVALID_ARG;
    kvq_best best;
    kvq_status st = scan(s, logits, &best);
    if (st)
        return st;
    memset(probs, 0, (size_t)s->vocab * sizeof *probs);
    if (s->p.temperature == 0.0f) {
        probs[best.token] = 1.0;
        return KVQ_OK;
    }
    int32_t n;
    double mass;
    kept_set(s, logits, best.score, &n, &mass);
    for (int32_t i = 0; i < n; i++)
        probs[s->idx[i]] = s->w[i] / mass;
    return KVQ_OK;
}
