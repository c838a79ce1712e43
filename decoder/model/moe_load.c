/* moe_load.c - a sparse layer's router and experts from a checkpoint.
 *
 * Checkpoints store experts in one of two layouts, and kvq reads both
 * without converting anything:
 *  - per expert, as the Hub's checkpoints do: PREFIX.experts.N.gate_proj /
 *    up_proj / down_proj (Qwen3-MoE, OLMoE; PREFIX = mlp) or w1 / w3 / w2
 *    (Mixtral; PREFIX = block_sparse_moe), router PREFIX.gate.weight;
 *  - fused, as transformers 5 holds them in memory (and writes them when it
 *    does not convert back on save): mlp.experts.gate_up_proj [E][2F][H]
 *    and mlp.experts.down_proj [E][H][F], router mlp.gate.weight.
 * Qwen2-MoE's shared expert is mlp.shared_expert.gate_proj / up_proj /
 * down_proj and its gate mlp.shared_expert_gate.weight [1][H], in both.
 * Each expert becomes a struct kvq_wmat over its rows where they lie (two
 * blocks, gate and up, or one slice of the fused tensor), so the grouped
 * expert products read the mapped file like every other projection, and a
 * sparse layer's experts cost no memory beyond the mapping.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoder_internal.h"

static size_t round16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

size_t kvq_moe_arena_floats(const struct kvq_model_config *c)
{
    const size_t E = (size_t)c->arch.n_experts, h = (size_t)c->hidden, f = (size_t)c->arch.moe_ffn;
    const size_t sf = c->arch.shared_ffn > 0 ? (size_t)c->arch.shared_ffn : 0;
    size_t per = round16(E * h) + E * (round16(2 * f * h) + round16(h * f)), n = 0;
    if (sf)
        per += 2 * round16(sf * h) + round16(h * sf) + round16(h);
    for (int l = 0; l < c->n_layers; l++)
        n += kvq_model_layer_is_moe(c, l) ? per : 0;
    return n;
}

kvq_status kvq_moe_alloc(struct kvq_model *m)
{
    const struct kvq_model_config *c = &m->cfg;
    if (c->arch.n_experts <= 0)
        return KVQ_OK;
    const size_t E = (size_t)c->arch.n_experts;
    m->moe = calloc((size_t)c->n_layers, sizeof *m->moe);
    m->expert_mats = calloc((size_t)c->n_layers * 2 * E, sizeof *m->expert_mats);
    if (!m->moe || !m->expert_mats)
        return KVQ_ERR_NOMEM;
    for (int l = 0; l < c->n_layers; l++) {
        m->moe[l].gu = m->expert_mats + (size_t)l * 2 * E;
        m->moe[l].down = m->moe[l].gu + E;
    }
    return KVQ_OK;
}

size_t kvq_moe_bytes(const struct kvq_model *m)
{
    size_t s = 0;
    for (int l = 0; m->moe && l < m->cfg.n_layers; l++) {
        s += kvq_wmat_bytes(&m->moe[l].router);
        for (int e = 0; kvq_model_layer_is_moe(&m->cfg, l) && e < m->cfg.arch.n_experts; e++)
            s += kvq_wmat_bytes(&m->moe[l].gu[e]) + kvq_wmat_bytes(&m->moe[l].down[e]);
        s += kvq_wmat_bytes(&m->moe[l].shared_gu) + kvq_wmat_bytes(&m->moe[l].shared_down) +
             kvq_wmat_bytes(&m->moe[l].shared_gate);
    }
    return s;
}

/* What loading one layer needs. */
struct ctx {
    struct kvq_model *m;
    int fi, l;
    const char *dir;
    kvq_error *err;
};

/* model.layers.L.SUFFIX, a float tensor of shape dims[0..n) (NULL with
 * *st = KVQ_OK when absent and optional). */
static const struct kvq_st_tensor *tensor(const struct ctx *x, const char *suffix, int n, const int64_t *dims,
                                          int optional, kvq_status *st)
{
    char name[192];
    snprintf(name, sizeof name, "model.layers.%d.%s", x->l, suffix);
    const struct kvq_st_tensor *t = kvq_files_find(&x->m->fs, x->fi, name, NULL);
    *st = KVQ_OK;
    if (!t) {
        if (!optional)
            *st = kvq_error_set(x->err, KVQ_ERR_FORMAT, "%s: missing tensor '%s'", x->dir, name);
        return NULL;
    }
    kvq_error e2;
    if (t->dtype != KVQ_ST_F32 && t->dtype != KVQ_ST_F16 && t->dtype != KVQ_ST_BF16)
        *st = kvq_error_set(x->err, KVQ_ERR_FORMAT, "%s: tensor '%s' has dtype %s (weights must be F32, F16 or BF16)",
                            x->dir, name, kvq_st_dtype_name(t->dtype));
    else if (kvq_st_expect(t, KVQ_ST_DTYPE_COUNT, n, dims, &e2) != KVQ_OK)
        *st = kvq_error_set(x->err, KVQ_ERR_FORMAT, "%s: %s (from config.json)", x->dir, e2.msg);
    return *st == KVQ_OK ? t : NULL;
}

/* Appends rows [r0, r0 + rows) of t (cols wide) to w as a mapped block. */
static void add_block(struct kvq_wmat *w, const struct kvq_st_tensor *t, size_t r0, int rows, int cols)
{
    const uint8_t *p = (const uint8_t *)t->data + r0 * (size_t)cols * kvq_st_dtype_size(t->dtype);
    w->b[w->n_blocks++] = (struct kvq_wblock){p, t->dtype, rows};
    w->rows += rows;
    w->cols = cols;
}

/* weights_f32: w's blocks widened into one f32 block at *f32. */
static void widen(struct kvq_wmat *w, float **f32)
{
    if (!f32)
        return;
    float *p = *f32;
    kvq_wmat_to_f32(w, p);
    *f32 += round16((size_t)w->rows * (size_t)w->cols);
    w->n_blocks = 1;
    w->b[0] = (struct kvq_wblock){p, KVQ_ST_F32, w->rows};
}

/* weights_f32: each of w's blocks widened into an f32 block of its own,
 * so that the products run in the same pieces as over the mapped blocks
 * (one sgemm of 2S columns measured other bits than two of S). */
static void widen_each(struct kvq_wmat *w, float **f32)
{
    if (!f32)
        return;
    for (int i = 0; i < w->n_blocks; i++) {
        struct kvq_wmat one = *w;
        one.n_blocks = 1;
        one.b[0] = w->b[i];
        one.rows = w->b[i].rows;
        float *p = *f32;
        kvq_wmat_to_f32(&one, p);
        *f32 += round16((size_t)one.rows * (size_t)w->cols);
        w->b[i] = (struct kvq_wblock){p, KVQ_ST_F32, one.rows};
    }
}

/* The shared expert of layer x->l (arch.shared_ffn > 0) and its gate. */
static kvq_status load_shared(const struct ctx *x, struct kvq_moe_layer *ml, float **f32)
{
    const int H = x->m->cfg.hidden, S = x->m->cfg.arch.shared_ffn;
    const int64_t in_dims[2] = {S, H}, out_dims[2] = {H, S}, g_dims[2] = {1, H};
    static const char *const nm[4] = {"mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight",
                                      "mlp.shared_expert.down_proj.weight", "mlp.shared_expert_gate.weight"};
    const struct kvq_st_tensor *t[4];
    kvq_status st;
    for (int i = 0; i < 4; i++)
        if (!(t[i] = tensor(x, nm[i], 2, i < 2 ? in_dims : i == 2 ? out_dims : g_dims, 0, &st)))
            return st;
    memset(&ml->shared_gu, 0, sizeof ml->shared_gu);
    memset(&ml->shared_down, 0, sizeof ml->shared_down);
    memset(&ml->shared_gate, 0, sizeof ml->shared_gate);
    add_block(&ml->shared_gu, t[0], 0, S, H);
    add_block(&ml->shared_gu, t[1], 0, S, H);
    add_block(&ml->shared_down, t[2], 0, H, S);
    add_block(&ml->shared_gate, t[3], 0, 1, H);
    widen_each(&ml->shared_gu, f32);
    widen(&ml->shared_down, f32);
    widen(&ml->shared_gate, f32);
    return KVQ_OK;
}

static kvq_status load_routed(struct kvq_model *m, int fi, int l, float **f32, const char *dir, kvq_error *err);

kvq_status kvq_moe_load_layer(struct kvq_model *m, int fi, int l, float **f32, const char *dir, kvq_error *err)
{
    kvq_status st = load_routed(m, fi, l, f32, dir, err);
    if (st != KVQ_OK || m->cfg.arch.shared_ffn <= 0)
        return st;
    const struct ctx x = {m, fi, l, dir, err};
    return load_shared(&x, &m->moe[l], f32);
}

/* The router and the routed experts, in either layout. */
static kvq_status load_routed(struct kvq_model *m, int fi, int l, float **f32, const char *dir, kvq_error *err)
{
    const struct kvq_model_config *c = &m->cfg;
    const int E = c->arch.n_experts, H = c->hidden, F = c->arch.moe_ffn;
    const int mixtral = c->arch.expert_names == KVQ_EXPERTS_MIXTRAL;
    const struct ctx x = {m, fi, l, dir, err};
    struct kvq_moe_layer *ml = &m->moe[l];
    kvq_status st;
    const int64_t rdims[2] = {E, H}, gudims[3] = {E, 2 * (int64_t)F, H}, ddims[3] = {E, H, F};
    /* fused (transformers 5) first: its router is mlp.gate.weight for Mixtral too */
    const struct kvq_st_tensor *gu = tensor(&x, "mlp.experts.gate_up_proj", 3, gudims, 1, &st);
    if (st != KVQ_OK)
        return st;
    const char *pre = mixtral && !gu ? "block_sparse_moe" : "mlp";
    char sfx[160];
    snprintf(sfx, sizeof sfx, "%s.gate.weight", pre);
    const struct kvq_st_tensor *r = tensor(&x, sfx, 2, rdims, 0, &st);
    if (!r)
        return st;
    memset(&ml->router, 0, sizeof ml->router);
    add_block(&ml->router, r, 0, E, H);
    widen(&ml->router, f32);
    if (gu) {
        const struct kvq_st_tensor *down = tensor(&x, "mlp.experts.down_proj", 3, ddims, 0, &st);
        if (!down)
            return st;
        for (int e = 0; e < E; e++) {
            memset(&ml->gu[e], 0, sizeof ml->gu[e]);
            memset(&ml->down[e], 0, sizeof ml->down[e]);
            add_block(&ml->gu[e], gu, (size_t)e * 2 * F, 2 * F, H);
            add_block(&ml->down[e], down, (size_t)e * H, H, F);
            widen(&ml->gu[e], f32);
            widen(&ml->down[e], f32);
        }
        return KVQ_OK;
    }
    static const char *const names[2][3] = {{"gate_proj", "up_proj", "down_proj"}, {"w1", "w3", "w2"}};
    const char *const *nm = names[mixtral];
    const int64_t in_dims[2] = {F, H}, out_dims[2] = {H, F};
    for (int e = 0; e < E; e++) {
        const struct kvq_st_tensor *t[3];
        for (int i = 0; i < 3; i++) {
            snprintf(sfx, sizeof sfx, "%s.experts.%d.%s.weight", pre, e, nm[i]);
            if (!(t[i] = tensor(&x, sfx, 2, i < 2 ? in_dims : out_dims, 0, &st)))
                return st;
        }
        memset(&ml->gu[e], 0, sizeof ml->gu[e]);
        memset(&ml->down[e], 0, sizeof ml->down[e]);
        add_block(&ml->gu[e], t[0], 0, F, H);
        add_block(&ml->gu[e], t[1], 0, F, H);
        add_block(&ml->down[e], t[2], 0, H, F);
        widen(&ml->gu[e], f32);
        widen(&ml->down[e], f32);
    }
    return KVQ_OK;
}
