/* moe_cpu.c - mixture-of-experts layers on the CPU: the router's top-k and
 * the grouped expert products with their weighted combine.
 *
 * The router is one product (logits [T][E]) and a top-k per row. The experts
 * op groups the T x k (row, expert) pairs by expert (a counting sort), and
 * runs each expert that has rows once, over all of its rows gathered
 * together: a prefill chunk reads each expert's weights once, not once per
 * token, and the products of more than KVQ_MATVEC_MAX_M rows go through
 * sgemm as a dense layer's do. Each expert's output is weighted and added
 * into a zeroed accumulator in ascending expert order, then the accumulator
 * into the residual stream: the order in which transformers sums them.
 * A row's result depends on which rows share an expert only through the
 * kernel choice (rows <= KVQ_MATVEC_MAX_M: the batch-invariant kernel), so
 * forward.c hands this op the same row groups as the projections.
 * Qwen2-MoE's shared expert runs over all the rows after the routed ones,
 * and sigmoid(gate . x) times its output is added to their sum, as
 * transformers' Qwen2MoeSparseMoeBlock does.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cpu_internal.h"
#include "decoder_internal.h"
#include "expert_cache.h"

void kvq_moe_topk(const float *lg, int E, int k, enum kvq_router_kind kind, int norm_topk, int32_t *ids, float *w)
{
    /* the j-th pick is the largest logit below the previous pick in the
     * order (logit descending, id ascending): no scratch, O(k E). The
     * softmax is monotonic, so picking on the logits picks the largest
     * probabilities, and the logits tell apart values whose probabilities
     * round alike */
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            if (j > 0) {
                const float pv = lg[ids[j - 1]];
                if (!(lg[e] < pv || (lg[e] == pv && e > ids[j - 1])))
                    continue;
            }
            if (best < 0 || lg[e] > lg[best])
                best = e;
        }
        ids[j] = best >= 0 ? best : j; /* NaN logits: any id in range; the NaN reaches the logits */
    }
    const float mx = lg[ids[0]];
    double sum = 0;
    if (kind == KVQ_ROUTER_SOFTMAX_TOPK) {
        for (int e = 0; e < E; e++)
            sum += expf(lg[e] - mx);
        for (int j = 0; j < k; j++)
            w[j] = (float)(expf(lg[ids[j]] - mx) / sum);
        if (!norm_topk)
            return;
        float s = 0;
        for (int j = 0; j < k; j++)
            s += w[j];
        for (int j = 0; j < k; j++)
            w[j] /= s;
        return;
    }
    for (int j = 0; j < k; j++)
        sum += expf(lg[ids[j]] - mx);
    for (int j = 0; j < k; j++)
        w[j] = (float)(expf(lg[ids[j]] - mx) / sum);
}

void kvq_moe_group(const int32_t *ids, size_t T, int k, int E, int32_t *start, int32_t *order)
{
    const size_t n = T * (size_t)k;
    memset(start, 0, (size_t)(E + 1) * sizeof *start);
    for (size_t r = 0; r < n; r++)
        start[ids[r] + 1]++;
    for (int e = 0; e < E; e++)
        start[e + 1] += start[e];
    /* start[e] as expert e's cursor: after the fill it is where e + 1 begins */
    for (size_t r = 0; r < n; r++)
        order[start[ids[r]]++] = (int32_t)r;
    for (int e = E; e > 0; e--)
        start[e] = start[e - 1];
    start[0] = 0;
}

struct kvq_cpu_moe {
    float *logits;  /* [max_rows][E] */
    float *xg;      /* [max_rows][hidden] the rows of one expert, gathered */
    float *gu;      /* [max_rows][2 moe_ffn] */
    float *h;       /* [max_rows][moe_ffn] */
    float *yd;      /* [max_rows][hidden] one expert's outputs */
    float *acc;     /* [max_rows][hidden] the weighted sum over experts */
    int32_t *start; /* [E + 1] */
    int32_t *order; /* [max_rows][top_k] */
    struct kvq_expert_cache *cache; /* NULL: the experts are read where they are mapped */
    int32_t *wave;  /* [E] experts of one fetch */
    const struct kvq_wmat **wgu, **wdown; /* [E] their matrices */
    /* read-ahead with the cache: the next sparse layer's router on this
     * layer's input (the residual stream changes little between layers),
     * its experts by how many rows pick them */
    int prefetch;
    int32_t *ahead_ids;  /* [top_k] one row's picks */
    float *ahead_w;      /* [top_k] */
    int32_t *votes;      /* [E] */
    int32_t *ahead;      /* [E] the experts to read ahead, most picked first */
    int n_ahead, ahead_layer;
};

static float *alloc_f(size_t n)
{
    return aligned_alloc(64, ((n * sizeof(float) + 63) / 64) * 64);
}

kvq_status kvq_cpu_moe_create(kvq_backend *b, struct kvq_cpu_moe **out)
{
    const struct kvq_model_config *c = &b->m->cfg;
    *out = NULL;
    if (c->arch.n_experts <= 0)
        return KVQ_OK;
    const size_t R = b->max_rows, E = (size_t)c->arch.n_experts, k = (size_t)c->arch.top_k;
    const size_t H = (size_t)c->hidden, S = c->arch.shared_ffn > 0 ? (size_t)c->arch.shared_ffn : 0;
    const size_t F = (size_t)c->arch.moe_ffn > S ? (size_t)c->arch.moe_ffn : S; /* gu and h serve both */
    struct kvq_cpu_moe *s = calloc(1, sizeof *s);
    b->moe_ids = malloc(R * k * sizeof *b->moe_ids);
    b->moe_w = alloc_f(R * k);
    if (s) {
        s->logits = alloc_f(R * (E > 1 ? E : 1)); /* also the shared expert's gate logits [R] */
        s->xg = alloc_f(R * H);
        s->gu = alloc_f(R * 2 * F);
        s->h = alloc_f(R * F);
        s->yd = alloc_f(R * H);
        s->acc = alloc_f(R * H);
        s->start = malloc((E + 1) * sizeof *s->start);
        s->order = malloc(R * k * sizeof *s->order);
        s->wave = malloc(E * sizeof *s->wave);
        s->wgu = malloc(E * sizeof *s->wgu);
        s->wdown = malloc(E * sizeof *s->wdown);
        s->ahead_ids = malloc(k * sizeof *s->ahead_ids);
        s->ahead_w = alloc_f(k);
        s->votes = malloc(E * sizeof *s->votes);
        s->ahead = malloc(E * sizeof *s->ahead);
    }
    if (!s || !b->moe_ids || !b->moe_w || !s->logits || !s->xg || !s->gu || !s->h || !s->yd || !s->acc ||
        !s->start || !s->order || !s->wave || !s->wgu || !s->wdown || !s->ahead_ids ||
        !s->ahead_w || !s->votes || !s->ahead) {
        kvq_cpu_moe_free(b, s);
        return KVQ_ERR_NOMEM;
    }
    *out = s;
    return KVQ_OK;
}

void kvq_cpu_moe_free(kvq_backend *b, struct kvq_cpu_moe *s)
{
    free(b->moe_ids);
    free(b->moe_w);
    b->moe_ids = NULL;
    b->moe_w = NULL;
    if (!s)
        return;
    free(s->logits);
    free(s->xg);
    free(s->gu);
    free(s->h);
    free(s->yd);
    free(s->acc);
    free(s->start);
    free(s->order);
    free(s->wave);
    free(s->wgu);
    free(s->wdown);
    free(s->ahead_ids);
    free(s->ahead_w);
    free(s->votes);
    free(s->ahead);
    kvq_expert_cache_free(s->cache);
    free(s);
}

void kvq_cpu_moe_route(kvq_backend *b, struct kvq_cpu_moe *s, int layer, const float *x, size_t T)
{
    const struct kvq_model_arch *a = &b->m->cfg.arch;
    const int E = a->n_experts, k = a->top_k;
    kvq_cpu_matmul(b, &b->m->moe[layer].router, x, s->logits, E, T, 0);
    for (size_t t = 0; t < T; t++)
        kvq_moe_topk(s->logits + t * (size_t)E, E, k, a->router, a->norm_topk, b->moe_ids + t * (size_t)k,
                     b->moe_w + t * (size_t)k);
    s->n_ahead = 0;
    if (!s->cache || !s->prefetch)
        return;
    int ln = layer + 1;
    while (ln < b->m->cfg.n_layers && !kvq_model_layer_is_moe(&b->m->cfg, ln))
        ln++;
    if (ln >= b->m->cfg.n_layers)
        return;
    /* into s->logits: this layer's picks are in b->moe_ids and b->moe_w already */
    kvq_cpu_matmul(b, &b->m->moe[ln].router, x, s->logits, E, T, 0);
    memset(s->votes, 0, (size_t)E * sizeof *s->votes);
    for (size_t t = 0; t < T; t++) {
        kvq_moe_topk(s->logits + t * (size_t)E, E, k, a->router, a->norm_topk, s->ahead_ids, s->ahead_w);
        for (int j = 0; j < k; j++)
            s->votes[s->ahead_ids[j]]++;
    }
    for (;;) { /* most votes first, the lower id on ties */
        int best = -1;
        for (int e = 0; e < E; e++)
            if (s->votes[e] > 0 && (best < 0 || s->votes[e] > s->votes[best]))
                best = e;
        if (best < 0)
            break;
        s->ahead[s->n_ahead++] = best;
        s->votes[best] = 0;
    }
    s->ahead_layer = ln;
}

/* s->yd[n][hidden] = down . (act(gate . x) * (up . x)) for the n rows of x,
 * through an expert of intermediate size F (gu: gate rows then up rows). */
static void expert_mlp(kvq_backend *b, struct kvq_cpu_moe *s, const struct kvq_wmat *gu, const struct kvq_wmat *down,
                       const float *x, size_t n, int F)
{
    const struct kvq_model_config *c = &b->m->cfg;
    kvq_cpu_matmul(b, gu, x, s->gu, 2 * F, n, 0);
    for (size_t i = 0; i < n; i++) {
        const float *g = s->gu + i * 2 * (size_t)F;
        float *o = s->h + i * (size_t)F;
        for (int j = 0; j < F; j++)
            o[j] = kvq_cpu_act(c->arch.act, g[j]) * g[F + j];
    }
    kvq_cpu_matmul(b, down, s->h, s->yd, c->hidden, n, 0);
}

/* Output row i of s->yd times its weight, rounded, then added into s->acc:
 * as transformers' multiply and index_add. With rows (an expert's entries
 * of b->moe_ids), the weight is w[rows[i]] and the row rows[i] / k; else
 * w[i] and row i. */
static void add_weighted(struct kvq_cpu_moe *s, size_t H, size_t n, const float *w, const int32_t *rows, int k)
{
    for (size_t i = 0; i < n; i++) {
        const float wi = w[rows ? (size_t)rows[i] : i];
        float *dst = s->acc + (rows ? (size_t)(rows[i] / k) : i) * H;
        const float *src = s->yd + i * H;
        for (size_t j = 0; j < H; j++) {
            const float p = src[j] * wi;
            dst[j] += p;
        }
    }
}

/* Expert e's rows of this call through its matrices gu / down, weighted
 * into s->acc. */
static void run_expert(kvq_backend *b, struct kvq_cpu_moe *s, int e, const struct kvq_wmat *gu,
                       const struct kvq_wmat *down, const float *x)
{
    const struct kvq_model_config *c = &b->m->cfg;
    const int k = c->arch.top_k;
    const size_t H = (size_t)c->hidden;
    const int32_t *rows = s->order + s->start[e];
    const size_t n = (size_t)(s->start[e + 1] - s->start[e]);
    for (size_t i = 0; i < n; i++)
        memcpy(s->xg + i * H, x + (size_t)(rows[i] / k) * H, H * sizeof *x);
    expert_mlp(b, s, gu, down, s->xg, n, c->arch.moe_ffn);
    add_weighted(s, H, n, b->moe_w, rows, k);
}

/* The shared expert over all T rows of x, each output scaled by
 * sigmoid(gate . x) and added into s->acc. */
static void run_shared(kvq_backend *b, struct kvq_cpu_moe *s, const struct kvq_moe_layer *ml, const float *x,
                       size_t T)
{
    const struct kvq_model_config *c = &b->m->cfg;
    expert_mlp(b, s, &ml->shared_gu, &ml->shared_down, x, T, c->arch.shared_ffn);
    kvq_cpu_matmul(b, &ml->shared_gate, x, s->logits, 1, T, 0);
    for (size_t i = 0; i < T; i++)
        s->logits[i] = 1.0f / (1.0f + expf(-s->logits[i]));
    add_weighted(s, (size_t)c->hidden, T, s->logits, NULL, 1);
}

kvq_status kvq_cpu_moe_experts(kvq_backend *b, struct kvq_cpu_moe *s, int layer, const float *x, float *y, size_t T)
{
    const struct kvq_model_config *c = &b->m->cfg;
    const struct kvq_moe_layer *ml = &b->m->moe[layer];
    const int E = c->arch.n_experts, k = c->arch.top_k;
    const size_t H = (size_t)c->hidden;
    kvq_moe_group(b->moe_ids, T, k, E, s->start, s->order);
    memset(s->acc, 0, T * H * sizeof *s->acc);
    if (!s->cache) {
        for (int e = 0; e < E; e++)
            if (s->start[e + 1] > s->start[e])
                run_expert(b, s, e, &ml->gu[e], &ml->down[e], x);
    } else {
        /* the experts with rows, ascending, in fetches of at most the cache's
         * slots: the same order of the sum as without the cache */
        const int slots = kvq_expert_cache_slots(s->cache);
        for (int e0 = 0; e0 < E;) {
            int n = 0, e = e0;
            for (; e < E && n < slots; e++)
                if (s->start[e + 1] > s->start[e])
                    s->wave[n++] = e;
            kvq_status st = n ? kvq_expert_cache_fetch(s->cache, layer, s->wave, n, s->wgu, s->wdown) : KVQ_OK;
            if (st != KVQ_OK)
                return st;
            int last = 1; /* no expert with rows after this fetch's: the next layer's reads go now */
            for (int f = e; f < E && last; f++)
                last = s->start[f + 1] == s->start[f];
            if (last && s->n_ahead) {
                kvq_expert_cache_prefetch(s->cache, s->ahead_layer, s->ahead, s->n_ahead);
                s->n_ahead = 0;
            }
            for (int i = 0; i < n; i++)
                run_expert(b, s, s->wave[i], s->wgu[i], s->wdown[i], x);
            e0 = e;
        }
    }
    if (c->arch.shared_ffn > 0)
        run_shared(b, s, ml, x, T);
    for (size_t i = 0; i < T * H; i++)
        y[i] += s->acc[i];
    return KVQ_OK;
}

kvq_status kvq_cpu_moe_set_cache(kvq_backend *b, struct kvq_cpu_moe *s, size_t bytes, int prefetch, int direct,
                                  kvq_error *err)
{
    struct kvq_expert_cache *c = NULL;
    kvq_status st = kvq_expert_cache_create(b->m, bytes, direct, &c, err);
    if (st != KVQ_OK)
        return st == KVQ_ERR_NOMEM ? kvq_error_set(err, st, "expert cache: out of memory") : st;
    kvq_expert_cache_free(s->cache);
    s->cache = c;
    s->prefetch = prefetch;
    return KVQ_OK;
}

const char *kvq_cpu_moe_cache_error(const struct kvq_cpu_moe *s)
{
    return s->cache ? kvq_expert_cache_error(s->cache) : NULL;
}

int kvq_cpu_moe_cache_stats(const struct kvq_cpu_moe *s, struct kvq_expert_cache_stats *st)
{
    if (!s->cache)
        return 0;
    kvq_expert_cache_get_stats(s->cache, st);
    return 1;
}
