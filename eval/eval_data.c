/* eval_data.c - loading and validating eval dumps, and synthetic data (kvq_eval.h). */
#include "kvq_eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq_attn.h"
#include "kvq_codec.h"
#include "kvq_safetensors.h"
#include "kvq_rng.h"

/* Tensors bigger than this are refused before any allocation: a corrupt
 * header should give an error, not an out-of-memory kill. */
#define EVAL_MAX_ELEMENTS ((size_t)1 << 31)

void kvq_eval_data_free(struct kvq_eval_data *d)
{
    if (!d)
        return;
    free(d->q);
    free(d->k);
    free(d->v);
    memset(d, 0, sizeof *d);
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static kvq_status find_tensor(const kvq_st_file *f, const char *file, const char *name,
                              const struct kvq_st_tensor **out, kvq_error *err)
{
    const struct kvq_st_tensor *t = kvq_st_find(f, name);
    if (!t)
        return kvq_error_set(err, KVQ_ERR_FORMAT,
                             "%s: no tensor '%s' (an eval dump has q [layer, head, Tq, d], k and v "
                             "[layer, kv_head, T, d])",
                             file, name);
    if (t->dtype != KVQ_ST_F16 && t->dtype != KVQ_ST_BF16 && t->dtype != KVQ_ST_F32)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: tensor '%s' has dtype %s; eval reads F16, BF16 or F32", file,
                             name, kvq_st_dtype_name(t->dtype));
    if (t->n_dims != 4)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: tensor '%s' has %d dimensions, expected 4 (%s)", file, name,
                             t->n_dims,
                             name[0] == 'q' ? "[layer, head, Tq, d]" : "[layer, kv_head, T, d]");
    for (int i = 0; i < 4; i++)
        if (t->shape[i] < 1)
            return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: tensor '%s' has an empty dimension %d", file, name, i);
    if (t->n_elements > EVAL_MAX_ELEMENTS)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: tensor '%s' is too large (%zu elements)", file, name,
                             t->n_elements);
    *out = t;
    return KVQ_OK;
}

static kvq_status to_f32_checked(const struct kvq_st_tensor *t, const char *file, float **out, kvq_error *err)
{
    float *buf = malloc(t->n_elements * sizeof *buf);
    if (!buf)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "%s: out of memory reading '%s'", file, t->name);
    kvq_status st = kvq_st_to_f32(t, buf, t->n_elements);
    if (st) {
        free(buf);
        return kvq_error_set(err, st, "%s: cannot convert '%s': %s", file, t->name, kvq_status_str(st));
    }
    for (size_t i = 0; i < t->n_elements; i++) {
        if (!isfinite(buf[i])) {
            /* Name the element: a NaN deep in a dump is otherwise hard to find. */
            size_t r = i, idx[4];
            for (int a = 3; a >= 0; a--) {
                idx[a] = r % (size_t)t->shape[a];
                r /= (size_t)t->shape[a];
            }
            kvq_error_set(err, KVQ_ERR_NONFINITE, "%s: tensor '%s' has a non-finite value (%g) at [%zu, %zu, %zu, %zu]",
                          file, t->name, (double)buf[i], idx[0], idx[1], idx[2], idx[3]);
            free(buf);
            return KVQ_ERR_NONFINITE;
        }
    }
    *out = buf;
    return KVQ_OK;
}

kvq_status kvq_eval_data_load(const char *path, struct kvq_eval_data *out, kvq_error *err)
{
    memset(out, 0, sizeof *out);
    const char *file = base_name(path);
    kvq_st_file *f = NULL;
    kvq_error e2;
    kvq_status st = kvq_st_open(path, &f, &e2);
    if (st) {
        /* The reader's message already names the file. */
        return kvq_error_set(err, st, "%s", e2.msg[0] ? e2.msg : kvq_status_str(st));
    }
    const struct kvq_st_tensor *q, *k, *v;
    if ((st = find_tensor(f, file, "q", &q, err)) || (st = find_tensor(f, file, "k", &k, err)) ||
        (st = find_tensor(f, file, "v", &v, err)))
        goto done;
    for (int i = 0; i < 4; i++) {
        if (k->shape[i] != v->shape[i]) {
            st = kvq_error_set(err, KVQ_ERR_FORMAT,
                               "%s: k [%lld, %lld, %lld, %lld] and v [%lld, %lld, %lld, %lld] differ in shape", file,
                               (long long)k->shape[0], (long long)k->shape[1], (long long)k->shape[2],
                               (long long)k->shape[3], (long long)v->shape[0], (long long)v->shape[1],
                               (long long)v->shape[2], (long long)v->shape[3]);
            goto done;
        }
    }
    if (q->shape[0] != k->shape[0] || q->shape[3] != k->shape[3]) {
        st = kvq_error_set(err, KVQ_ERR_FORMAT,
                           "%s: q has %lld layers of dim %lld but k has %lld layers of dim %lld", file,
                           (long long)q->shape[0], (long long)q->shape[3], (long long)k->shape[0],
                           (long long)k->shape[3]);
        goto done;
    }
    if (q->shape[1] % k->shape[1] != 0 || q->shape[1] / k->shape[1] > KVQ_ATTN_MAX_Q) {
        st = kvq_error_set(err, KVQ_ERR_FORMAT,
                           "%s: %lld query heads cannot share %lld kv heads (need a multiple, at most %d per kv head)",
                           file, (long long)q->shape[1], (long long)k->shape[1], KVQ_ATTN_MAX_Q);
        goto done;
    }
    if (q->shape[2] > k->shape[2]) {
        st = kvq_error_set(err, KVQ_ERR_FORMAT, "%s: %lld query positions but only %lld key positions", file,
                           (long long)q->shape[2], (long long)k->shape[2]);
        goto done;
    }
    if (k->shape[3] > KVQ_MAX_DIM) {
        st = kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "%s: head dim %lld is larger than kvq supports (%d)", file,
                           (long long)k->shape[3], KVQ_MAX_DIM);
        goto done;
    }
    snprintf(out->name, sizeof out->name, "%s", file);
    out->n_layers = (int)k->shape[0];
    out->n_heads = (int)q->shape[1];
    out->n_kv_heads = (int)k->shape[1];
    out->head_dim = (int)k->shape[3];
    out->n_tokens = (size_t)k->shape[2];
    out->n_queries = (size_t)q->shape[2];
    if ((st = to_f32_checked(q, file, &out->q, err)) || (st = to_f32_checked(k, file, &out->k, err)) ||
        (st = to_f32_checked(v, file, &out->v, err)))
        goto done;
done:
    kvq_st_close(f);
    if (st)
        kvq_eval_data_free(out);
    return st;
}

void kvq_eval_synth_config_default(struct kvq_eval_synth_config *cfg)
{
    cfg->n_layers = 2;
    cfg->n_heads = 4;
    cfg->n_kv_heads = 2;
    cfg->head_dim = 128;
    cfg->n_tokens = 1024;
    cfg->n_queries = 64;
    cfg->n_outliers = 4;
    cfg->seed = 0;
}

/* Draws n_out distinct channels out of d (partial Fisher-Yates). */
static void pick_channels(kvq_rng *r, int d, int n_out, int *chan)
{
    int perm[KVQ_MAX_DIM];
    for (int j = 0; j < d; j++)
        perm[j] = j;
    for (int i = 0; i < n_out; i++) {
        int j = i + (int)(kvq_rng_uniform(r) * (double)(d - i));
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
        chan[i] = perm[i];
    }
}

kvq_status kvq_eval_data_synthetic(const struct kvq_eval_synth_config *c, struct kvq_eval_data *out, kvq_error *err)
{
    memset(out, 0, sizeof *out);
    if (c->n_layers < 1 || c->n_heads < 1 || c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads != 0 ||
        c->n_heads / c->n_kv_heads > KVQ_ATTN_MAX_Q || c->head_dim < 2 || c->head_dim > KVQ_MAX_DIM ||
        c->n_tokens < 1 || c->n_queries < 1 || c->n_queries > c->n_tokens || c->n_outliers < 0 ||
        c->n_outliers > c->head_dim || c->n_tokens > ((size_t)1 << 24))
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG,
                             "synthetic shape invalid (layers %d, heads %d / kv heads %d, dim %d, tokens %zu, "
                             "queries %zu, outliers %d)",
                             c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->n_tokens, c->n_queries,
                             c->n_outliers);
    const size_t d = (size_t)c->head_dim, L = (size_t)c->n_layers;
    const size_t nkv = L * (size_t)c->n_kv_heads * c->n_tokens * d;
    const size_t nq = L * (size_t)c->n_heads * c->n_queries * d;
    snprintf(out->name, sizeof out->name, "synthetic");
    out->n_layers = c->n_layers;
    out->n_heads = c->n_heads;
    out->n_kv_heads = c->n_kv_heads;
    out->head_dim = c->head_dim;
    out->n_tokens = c->n_tokens;
    out->n_queries = c->n_queries;
    out->q = malloc(nq * sizeof(float));
    out->k = malloc(nkv * sizeof(float));
    out->v = malloc(nkv * sizeof(float));
    if (!out->q || !out->k || !out->v) {
        kvq_eval_data_free(out);
        return kvq_error_set(err, KVQ_ERR_NOMEM, "synthetic data: out of memory");
    }
    kvq_rng r;
    kvq_rng_init(&r, kvq_seed_derive(c->seed, 0x5e7a11u));
    const int group = c->n_heads / c->n_kv_heads;
    float mu[KVQ_MAX_DIM], sk[KVQ_MAX_DIM], sq[KVQ_MAX_DIM];
    int chan[KVQ_MAX_DIM];
    for (size_t l = 0; l < L; l++) {
        for (int g = 0; g < c->n_kv_heads; g++) {
            /* Outlier channels as seen in real post-RoPE keys: a large
             * channel mean (shared by all tokens) and a wider spread; the
             * queries lean on the same channels, so they matter for q.k. */
            for (size_t j = 0; j < d; j++) {
                mu[j] = 0.0f;
                sk[j] = 1.0f;
                sq[j] = 1.0f;
            }
            pick_channels(&r, c->head_dim, c->n_outliers, chan);
            for (int i = 0; i < c->n_outliers; i++) {
                mu[chan[i]] = (kvq_rng_uniform(&r) < 0.5 ? -6.0f : 6.0f);
                sk[chan[i]] = 4.0f;
                sq[chan[i]] = 1.5f;
            }
            float *k = out->k + (l * (size_t)c->n_kv_heads + (size_t)g) * c->n_tokens * d;
            float *v = out->v + (l * (size_t)c->n_kv_heads + (size_t)g) * c->n_tokens * d;
            for (size_t t = 0; t < c->n_tokens; t++)
                for (size_t j = 0; j < d; j++) {
                    k[t * d + j] = mu[j] + sk[j] * (float)kvq_rng_gauss(&r);
                    v[t * d + j] = (float)kvq_rng_gauss(&r);
                }
            for (int h = g * group; h < (g + 1) * group; h++) {
                float *q = out->q + (l * (size_t)c->n_heads + (size_t)h) * c->n_queries * d;
                for (size_t t = 0; t < c->n_queries; t++)
                    for (size_t j = 0; j < d; j++)
                        q[t * d + j] = sq[j] * (float)kvq_rng_gauss(&r);
            }
        }
    }
    return KVQ_OK;
}
