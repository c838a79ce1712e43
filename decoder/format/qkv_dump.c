/* qkv_dump.c - post-RoPE q/k/v recorder (see kvq_qkv_dump.h). */
#include "kvq_qkv_dump.h"

#include <stdlib.h>
#include <string.h>

#include "kvq_half.h"
#include "kvq_safetensors.h"

struct kvq_qkv_dump {
    int L, H, Hkv, d;
    size_t cap, q_last;
    uint16_t *q, *k, *v; /* [L][H or Hkv][cap][d] */
};

kvq_status kvq_qkv_dump_create(const struct kvq_model_config *c, size_t max_tokens, size_t q_last,
                               kvq_qkv_dump **out)
{
    if (!c || !out || !max_tokens)
        return KVQ_ERR_INVALID_ARG;
    kvq_qkv_dump *d = calloc(1, sizeof *d);
    if (!d)
        return KVQ_ERR_NOMEM;
    d->L = c->n_layers;
    d->H = c->n_heads;
    d->Hkv = c->n_kv_heads;
    d->d = c->head_dim;
    d->cap = max_tokens;
    d->q_last = q_last;
    size_t per = max_tokens * (size_t)d->d * (size_t)d->L;
    d->q = calloc(per * (size_t)d->H, sizeof *d->q);
    d->k = calloc(per * (size_t)d->Hkv, sizeof *d->k);
    d->v = calloc(per * (size_t)d->Hkv, sizeof *d->v);
    if (!d->q || !d->k || !d->v) {
        kvq_qkv_dump_free(d);
        return KVQ_ERR_NOMEM;
    }
    *out = d;
    return KVQ_OK;
}

void kvq_qkv_dump_free(kvq_qkv_dump *d)
{
    if (!d)
        return;
    free(d->q);
    free(d->k);
    free(d->v);
    free(d);
}

/* src [T][H][d] floats -> dst [layer][H][cap][d] halves at positions pos0... */
static void store(uint16_t *dst, const float *src, const kvq_qkv_dump *d, int layer, int H, size_t pos0, size_t T)
{
    for (size_t t = 0; t < T && pos0 + t < d->cap; t++)
        for (int h = 0; h < H; h++) {
            uint16_t *o = dst + (((size_t)layer * H + h) * d->cap + pos0 + t) * (size_t)d->d;
            const float *x = src + (t * H + (size_t)h) * (size_t)d->d;
            for (int i = 0; i < d->d; i++)
                o[i] = kvq_f32_to_f16(x[i]);
        }
}

void kvq_qkv_dump_hook(void *user, int layer, size_t pos0, size_t T, const float *q, const float *k, const float *v)
{
    kvq_qkv_dump *d = user;
    if (!d || layer < 0 || layer >= d->L)
        return;
    store(d->q, q, d, layer, d->H, pos0, T);
    store(d->k, k, d, layer, d->Hkv, pos0, T);
    store(d->v, v, d, layer, d->Hkv, pos0, T);
}

/* [L][H][cap][d] -> [L][H][n][d] keeping positions [first, first + n). */
static void compact(uint16_t *a, const kvq_qkv_dump *d, int H, size_t first, size_t n)
{
    size_t row = (size_t)d->d;
    for (size_t lh = 0; lh < (size_t)d->L * H; lh++)
        memmove(a + lh * n * row, a + (lh * d->cap + first) * row, n * row * sizeof *a);
}

kvq_status kvq_qkv_dump_write(kvq_qkv_dump *d, const int32_t *ids, size_t n, const char *path, kvq_error *err)
{
    if (!d || !ids || !path || n == 0 || n > d->cap)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "qkv dump: nothing to write or more tokens than recorded");
    size_t nq = n < d->q_last ? n : d->q_last;
    compact(d->k, d, d->Hkv, 0, n);
    compact(d->v, d, d->Hkv, 0, n);
    compact(d->q, d, d->H, n - nq, nq);
    d->cap = 0; /* the layout is gone: no more recording */
    kvq_st_writer *w;
    kvq_status st = kvq_st_writer_create(&w);
    if (st != KVQ_OK)
        return kvq_error_set(err, st, "out of memory");
    int64_t s_ids[1] = {(int64_t)n};
    int64_t s_kv[4] = {d->L, d->Hkv, (int64_t)n, d->d};
    int64_t s_q[4] = {d->L, d->H, (int64_t)nq, d->d};
    if ((st = kvq_st_writer_add(w, "ids", KVQ_ST_I32, 1, s_ids, ids)) != KVQ_OK ||
        (st = kvq_st_writer_add(w, "k", KVQ_ST_F16, 4, s_kv, d->k)) != KVQ_OK ||
        (st = kvq_st_writer_add(w, "q", KVQ_ST_F16, 4, s_q, d->q)) != KVQ_OK ||
        (st = kvq_st_writer_add(w, "v", KVQ_ST_F16, 4, s_kv, d->v)) != KVQ_OK)
        kvq_error_set(err, st, "qkv dump: cannot add tensors");
    else
        st = kvq_st_writer_write(w, path, err);
    kvq_st_writer_free(w);
    return st;
}
