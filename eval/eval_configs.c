/* eval_configs.c - cache configurations for the attention-error evaluation:
 * defaults, labels, the sweep grid and the f32 floor (kvq_eval.h). */
#include "kvq_eval.h"

#include <stdio.h>
#include <string.h>

void kvq_eval_config_default(struct kvq_eval_config *d)
{
    memset(d, 0, sizeof *d);
    d->type_k = KVQ_TYPE_F32;
    d->type_v = KVQ_TYPE_F32;
    d->rot = KVQ_ROT_HADAMARD;
    d->qjl = KVQ_QJL_ORTHO;
    d->seed = 0;
}

static int is_tq(enum kvq_type t)
{
    const struct kvq_type_traits *tr = kvq_type_traits(t);
    return tr && tr->rotated;
}

void kvq_eval_config_label(struct kvq_eval_config *c, const struct kvq_eval_config *def)
{
    const struct kvq_type_traits *tk = kvq_type_traits(c->type_k), *tv = kvq_type_traits(c->type_v);
    int n = snprintf(c->label, sizeof c->label, "%s/%s", tk ? tk->name : "?", tv ? tv->name : "?");
    size_t used = n < 0 ? 0 : (size_t)n;
    /* Variants only matter for the types that use them: don't label an
     * f16/q8_0 row "+dct" when nothing in it is rotated. */
    int rotated = is_tq(c->type_k) || is_tq(c->type_v);
    const struct kvq_type_traits *qk = kvq_type_traits(c->type_k);
    if (rotated && c->rot != def->rot && used < sizeof c->label)
        used += (size_t)snprintf(c->label + used, sizeof c->label - used, "+%s", kvq_rot_kind_name(c->rot));
    if (qk && qk->qjl && c->qjl != def->qjl && used < sizeof c->label)
        used += (size_t)snprintf(c->label + used, sizeof c->label - used, "+%s",
                                 c->qjl == KVQ_QJL_GAUSS ? "gauss" : "ortho");
    if (rotated && c->seed != def->seed && used < sizeof c->label)
        snprintf(c->label + used, sizeof c->label - used, "+s%llu", (unsigned long long)c->seed);
}

static size_t add(struct kvq_eval_config *out, size_t n, size_t cap, const struct kvq_eval_config *def,
                  enum kvq_type k, enum kvq_type v)
{
    if (n >= cap)
        return n;
    out[n] = *def;
    out[n].type_k = k;
    out[n].type_v = v;
    kvq_eval_config_label(&out[n], def);
    return n + 1;
}

size_t kvq_eval_sweep_default(const struct kvq_eval_config *def, struct kvq_eval_config *out, size_t cap)
{
    static const enum kvq_type tq[4] = {KVQ_TYPE_TQ1, KVQ_TYPE_TQ2, KVQ_TYPE_TQ3, KVQ_TYPE_TQ4};
    static const enum kvq_type tqj[4] = {KVQ_TYPE_TQ1J, KVQ_TYPE_TQ2J, KVQ_TYPE_TQ3J, KVQ_TYPE_TQ4J};
    size_t n = 0;
    n = add(out, n, cap, def, KVQ_TYPE_F32, KVQ_TYPE_F32);
    n = add(out, n, cap, def, KVQ_TYPE_F16, KVQ_TYPE_F16);
    n = add(out, n, cap, def, KVQ_TYPE_Q8_0, KVQ_TYPE_Q8_0);
    n = add(out, n, cap, def, KVQ_TYPE_Q4_0, KVQ_TYPE_Q4_0);
    n = add(out, n, cap, def, KVQ_TYPE_Q8_0, KVQ_TYPE_Q4_0);
    /* What llama.cpp stores by default since 2026-04: the same, rotated. */
    n = add(out, n, cap, def, KVQ_TYPE_Q8_0R, KVQ_TYPE_Q8_0R);
    n = add(out, n, cap, def, KVQ_TYPE_Q4_0R, KVQ_TYPE_Q4_0R);
    n = add(out, n, cap, def, KVQ_TYPE_Q8_0R, KVQ_TYPE_Q4_0R);
    /* llama.cpp's other block types, rotated: 5.0, 5.5 and 6.0 bits per value. */
    n = add(out, n, cap, def, KVQ_TYPE_Q4_1R, KVQ_TYPE_Q4_1R);
    n = add(out, n, cap, def, KVQ_TYPE_Q5_0R, KVQ_TYPE_Q5_0R);
    n = add(out, n, cap, def, KVQ_TYPE_Q5_1R, KVQ_TYPE_Q5_1R);
    /* Symmetric tq, then the QJL key on the same-bit value codebook. */
    for (int b = 0; b < 4; b++)
        n = add(out, n, cap, def, tq[b], tq[b]);
    for (int b = 0; b < 4; b++)
        n = add(out, n, cap, def, tqj[b], tq[b]);
    /* Wider codebooks: the rates of q4_0 .. q8_0 (docs/frontier.md). */
    n = add(out, n, cap, def, KVQ_TYPE_TQ5, KVQ_TYPE_TQ3);
    n = add(out, n, cap, def, KVQ_TYPE_TQ5, KVQ_TYPE_TQ4);
    n = add(out, n, cap, def, KVQ_TYPE_TQ6, KVQ_TYPE_TQ6);
    n = add(out, n, cap, def, KVQ_TYPE_TQ8, KVQ_TYPE_TQ8);
    /* Mixed pairs: spend bits on K, save them on V ("V is cheap"). */
    n = add(out, n, cap, def, KVQ_TYPE_Q8_0, KVQ_TYPE_TQ3);
    n = add(out, n, cap, def, KVQ_TYPE_Q8_0, KVQ_TYPE_TQ4);
    n = add(out, n, cap, def, KVQ_TYPE_TQ4J, KVQ_TYPE_TQ3);
    n = add(out, n, cap, def, KVQ_TYPE_TQ4, KVQ_TYPE_TQ3);
    n = add(out, n, cap, def, KVQ_TYPE_TQ4J, KVQ_TYPE_TQ2);
    n = add(out, n, cap, def, KVQ_TYPE_TQ3J, KVQ_TYPE_TQ2);
    /* K alone (V kept at f16) and V alone (K at f16): which side hurts. */
    for (int b = 1; b < 4; b++) {
        n = add(out, n, cap, def, tq[b], KVQ_TYPE_F16);
        n = add(out, n, cap, def, tqj[b], KVQ_TYPE_F16);
    }
    n = add(out, n, cap, def, KVQ_TYPE_Q4_0, KVQ_TYPE_F16);
    for (int b = 1; b < 4; b++)
        n = add(out, n, cap, def, KVQ_TYPE_F16, tq[b]);
    n = add(out, n, cap, def, KVQ_TYPE_F16, KVQ_TYPE_Q4_0);
    n = add(out, n, cap, def, KVQ_TYPE_Q4_0R, KVQ_TYPE_F16);
    n = add(out, n, cap, def, KVQ_TYPE_F16, KVQ_TYPE_Q4_0R);
    return n;
}

size_t kvq_eval_ensure_floor(const struct kvq_eval_config *def, struct kvq_eval_config *cfgs, size_t n, size_t cap)
{
    for (size_t i = 0; i < n; i++)
        if (cfgs[i].type_k == KVQ_TYPE_F32 && cfgs[i].type_v == KVQ_TYPE_F32)
            return n;
    if (n >= cap)
        return n;
    memmove(cfgs + 1, cfgs, n * sizeof *cfgs);
    add(cfgs, 0, cap, def, KVQ_TYPE_F32, KVQ_TYPE_F32);
    return n + 1;
}
