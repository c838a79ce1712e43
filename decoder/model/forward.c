/* forward.c - one chunk of T tokens through every layer, in backend ops.
 *
 * Per layer (the architecture's kinds come from struct kvq_model_arch):
 *   x += Wo . attn(RoPE(norm_q(Wq . norm(x))), RoPE(norm_k(Wk . norm(x))), Wv . norm(x))
 *   x += Wdown . (act(Wgate . norm(x)) * (Wup . norm(x)))
 * The backend (backend.h) computes, the KV store (kv_store.h) keeps the keys
 * and values and attends; this file only orders the steps, times them and
 * rolls the store back when a step fails.
 */
#include "backend.h"
#include "decoder_internal.h"
#include "kv_store.h"

/* Timed op: matmul time is reported apart from attention and host work. */
static void linear_timed(kvq_seq *s, enum kvq_weight w, int layer, const float *x, float *y, size_t T, int acc)
{
    double t0 = kvq_now();
    s->be->ops->linear(s->be, w, layer, x, y, T, acc);
    s->tm.matmul += kvq_now() - t0;
}

kvq_status kvq_forward_chunk(kvq_seq *s, const int32_t *ids, size_t T)
{
    kvq_backend *be = s->be;
    const struct kvq_backend_ops *op = be->ops;
    const struct kvq_acts *a = &be->acts;
    const int n_layers = s->m->cfg.n_layers;
    op->embed(be, ids, T, a->x);
    for (int l = 0; l < n_layers; l++) {
        op->norm(be, KVQ_NORM_ATTN, l, a->x, a->xn, T);
        linear_timed(s, KVQ_W_QKV, l, a->xn, a->qkv, T, 0);
        op->qkv_rope(be, l, a->qkv, T, s->pos, a->q, a->k, a->v);
        if (s->hook && !be->device) /* the hook reads host memory */
            s->hook(s->hook_user, l, s->pos, T, a->q, a->k, a->v);

        double t0 = kvq_now();
        const int seq = 0;
        kvq_status st = s->kv->ops->append_attend(s->kv, l, 1, &seq, T, a->k, a->v, a->q, a->attn);
        if (st != KVQ_OK) {
            s->kv->ops->truncate(s->kv, 0, l, s->pos); /* layer l is already back at pos */
            return st;
        }
        s->tm.attn += kvq_now() - t0;

        linear_timed(s, KVQ_W_O, l, a->attn, a->x, T, 1);
        op->norm(be, KVQ_NORM_FFN, l, a->x, a->xn, T);
        linear_timed(s, KVQ_W_GATE_UP, l, a->xn, a->gu, T, 0);
        op->glu(be, a->gu, a->h, T);
        linear_timed(s, KVQ_W_DOWN, l, a->h, a->x, T, 1);
    }
    return KVQ_OK;
}
