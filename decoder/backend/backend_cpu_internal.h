/* backend_cpu_internal.h - what the CPU backend's files share: its product
 * kernel, the gate activation, and the mixture-of-experts ops (moe_cpu.c). */
#ifndef KVQ_BACKEND_CPU_INTERNAL_H
#define KVQ_BACKEND_CPU_INTERNAL_H

#include <math.h>

#include "backend.h"

/* y[T][ldy] (+)= x[T][w->cols] . w^T with the CPU backend b's kernels (the
 * few-row kernel up to KVQ_MATVEC_MAX_M rows, sgemm above), over w in its
 * stored dtype. b must be a CPU backend. */
void kvq_cpu_matmul(kvq_backend *b, const struct kvq_wmat *w, const float *x, float *y, int ldy, size_t T,
                    int accumulate);

/* The gate activation of the gated MLP, as transformers computes it in f32. */
static inline float kvq_cpu_act(enum kvq_act_kind kind, float g)
{
    if (kind == KVQ_ACT_GELU_TANH)
        return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    return g / (1.0f + expf(-g));
}

/* Scratch of the mixture-of-experts ops, allocated once with the backend. */
struct kvq_cpu_moe;
struct kvq_expert_cache_stats;

/* For b's model (NULL *out for a dense one); also allocates b->moe_ids and
 * b->moe_w. @return KVQ_OK or KVQ_ERR_NOMEM. */
kvq_status kvq_cpu_moe_create(kvq_backend *b, struct kvq_cpu_moe **out);
/* Frees s and b's moe_ids / moe_w; accepts NULL s. */
void kvq_cpu_moe_free(kvq_backend *b, struct kvq_cpu_moe *s);
/* The ops of backend.h (moe_route, moe_experts) over scratch s. */
void kvq_cpu_moe_route(kvq_backend *b, struct kvq_cpu_moe *s, int layer, const float *x, size_t T);
kvq_status kvq_cpu_moe_experts(kvq_backend *b, struct kvq_cpu_moe *s, int layer, const float *x, float *y, size_t T);
/* Replaces s's expert cache by one of `bytes` (expert_cache.h), reading
 * ahead when prefetch is 1. */
kvq_status kvq_cpu_moe_set_cache(kvq_backend *b, struct kvq_cpu_moe *s, size_t bytes, int prefetch, int direct,
                                  kvq_error *err);
/* @return 0 without a cache, else 1 and st. */
int kvq_cpu_moe_cache_stats(const struct kvq_cpu_moe *s, struct kvq_expert_cache_stats *st);
/* Why the expert cache's last fetch failed (kvq_expert_cache_error), or NULL. */
const char *kvq_cpu_moe_cache_error(const struct kvq_cpu_moe *s);

#endif
