/* engine.c - what kvq_seq and kvq_batch are built of, made in one place:
 * the per-layer cache configs and memory specs (layer_spec.c), the device
 * refusals (asked of the backend and the store before anything is
 * allocated), the KV store and the backend, attached to each other. The two
 * used to do this each on their own, with different refusal rules. */
#include <stdlib.h>

#include "backend.h"
#include "decoder_internal.h"
#include "kv_store.h"
#include "kvq_rng.h"

kvq_status kvq_engine_open(const kvq_model *m, const struct kvq_seq_config *sc, size_t max_ctx, int max_seqs,
                           size_t max_rows, const struct kvq_layer_spec *specs, const size_t *max_bytes,
                           struct kvq_kv_store **kv, struct kvq_backend **be, kvq_error *err)
{
    const struct kvq_model_config *c = &m->cfg;
    const int cuda = sc->device == KVQ_DEVICE_CUDA;
    *kv = NULL;
    *be = NULL;
    struct kvq_cache_config *ccs = calloc((size_t)c->n_layers, sizeof *ccs);
    if (!ccs)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    for (int l = 0; l < c->n_layers; l++) {
        kvq_layer_cache_config(c, sc, l, max_ctx, &ccs[l]);
        ccs[l].seed = kvq_seed_derive(sc->seed, (uint64_t)l);
        ccs[l].max_bytes = max_bytes ? max_bytes[l] : 0;
    }
    struct kvq_kv_store_config kc = {.cfgs = ccs, .n_layers = c->n_layers, .max_seqs = max_seqs,
                                     .n_heads = c->n_heads, .max_rows = max_rows,
                                     .v_norm_correct = sc->v_norm_correct, .specs = specs,
                                     .attn_scale = c->arch.attn_scale};
    /* the store's refusals first (sliding windows, the attention scale),
     * then the backend's, all before a byte of device memory is taken */
    kvq_status st = !cuda ? KVQ_OK : kvq_kv_store_cuda_supports(&kc, err);
    if (st == KVQ_OK && cuda)
        st = kvq_backend_cuda_supports(c, err);
    if (st == KVQ_OK && cuda && kvq_backend_cuda_refusal(m)) /* mixture-of-experts layers */
        st = kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "%s", kvq_backend_cuda_refusal(m));
    if (st == KVQ_OK)
        st = cuda ? kvq_kv_store_cuda_create(&kc, kv, err) : kvq_kv_store_cpu_create(&kc, kv, err);
    free(ccs);
    if (st != KVQ_OK)
        return st;
    st = cuda ? kvq_backend_cuda_create(m, max_rows, kvq_seq_backend_flags(sc), be)
              : kvq_backend_cpu_create(m, max_rows, be);
    if (st != KVQ_OK) {
        kvq_kv_store_free(*kv);
        *kv = NULL;
        return kvq_error_set(err, st, "cannot create the %s backend: %s", cuda ? "CUDA" : "CPU", kvq_status_str(st));
    }
    if ((*kv)->ops->attach)
        (*kv)->ops->attach(*kv, (*be)->dev_stream, (*be)->dev_step);
    /* experts read on demand into a bounded cache: one for all of a batch's
     * slots, which share the backend */
    if (sc->expert_cache && (st = kvq_backend_cpu_expert_cache(*be, sc->expert_cache, sc->expert_prefetch, sc->expert_direct, err)) != KVQ_OK) {
        kvq_backend_free(*be);
        kvq_kv_store_free(*kv);
        *be = NULL;
        *kv = NULL;
        return st;
    }
    return KVQ_OK;
}
