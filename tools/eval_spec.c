/* eval_spec.c - parsing --types and the default --sweep grid. */
#include "eval_spec.h"

#include <stdio.h>
#include <string.h>

#include "cli.h"

void eval_config_defaults(struct eval_config *d)
{
    memset(d, 0, sizeof *d);
    d->type_k = KVQ_TYPE_F32;
    d->type_v = KVQ_TYPE_F32;
    d->rot = KVQ_ROT_HADAMARD;
    d->qjl = KVQ_QJL_ORTHO;
    d->seed = 0;
}

static const char *qjl_name(enum kvq_qjl_kind q)
{
    return q == KVQ_QJL_GAUSS ? "gauss" : "ortho";
}

static int is_tq(enum kvq_type t)
{
    const struct kvq_type_traits *tr = kvq_type_traits(t);
    return tr && tr->rotated;
}

void eval_config_label(struct eval_config *c, const struct eval_config *def)
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
        used += (size_t)snprintf(c->label + used, sizeof c->label - used, "+%s", qjl_name(c->qjl));
    if (rotated && c->seed != def->seed && used < sizeof c->label)
        snprintf(c->label + used, sizeof c->label - used, "+s%llu", (unsigned long long)c->seed);
}

static kvq_status bad_item(kvq_error *err, const char *item, const char *why)
{
    return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "bad --types entry '%s': %s", item, why);
}

static kvq_status parse_type(const char *item, const char *name, enum kvq_type *out, kvq_error *err)
{
    if (kvq_type_from_name(name, out) == KVQ_OK)
        return KVQ_OK;
    char known[256];
    size_t used = 0;
    known[0] = '\0';
    for (int t = 0; t < KVQ_TYPE_COUNT; t++) {
        const struct kvq_type_traits *tr = kvq_type_traits((enum kvq_type)t);
        if (tr && used + strlen(tr->name) + 2 < sizeof known)
            used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", used ? " " : "", tr->name);
    }
    return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "bad --types entry '%s': unknown type '%s' (known: %s)", item,
                         name, known);
}

/* One item, already split out of the comma list (item is modified). */
static kvq_status parse_item(char *item, const struct eval_config *def, struct eval_config *c, kvq_error *err)
{
    char orig[128];
    snprintf(orig, sizeof orig, "%s", item);
    *c = *def;
    if (!strchr(item, '=')) {
        kvq_status st = parse_type(orig, item, &c->type_k, err);
        if (st)
            return st;
        c->type_v = c->type_k;
        eval_config_label(c, def);
        return KVQ_OK;
    }
    int have_k = 0, have_v = 0;
    char *save = NULL;
    for (char *kv = strtok_r(item, ":", &save); kv; kv = strtok_r(NULL, ":", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq || eq == kv || !eq[1])
            return bad_item(err, orig, "expected key=value pairs separated by ':' (keys k, v, rot, qjl, seed)");
        *eq = '\0';
        const char *key = kv, *val = eq + 1;
        kvq_status st = KVQ_OK;
        if (strcmp(key, "k") == 0) {
            st = parse_type(orig, val, &c->type_k, err);
            have_k = 1;
        } else if (strcmp(key, "v") == 0) {
            st = parse_type(orig, val, &c->type_v, err);
            have_v = 1;
        } else if (strcmp(key, "rot") == 0) {
            if (kvq_rot_kind_from_name(val, &c->rot) != KVQ_OK || c->rot == KVQ_ROT_GAUSS)
                return bad_item(err, orig, "rot must be hadamard, dct or identity");
        } else if (strcmp(key, "qjl") == 0) {
            if (strcmp(val, "ortho") == 0)
                c->qjl = KVQ_QJL_ORTHO;
            else if (strcmp(val, "gauss") == 0)
                c->qjl = KVQ_QJL_GAUSS;
            else
                return bad_item(err, orig, "qjl must be ortho or gauss");
        } else if (strcmp(key, "seed") == 0) {
            if (cli_parse_u64(val, &c->seed))
                return bad_item(err, orig, "seed must be a non-negative integer");
        } else {
            return bad_item(err, orig, "unknown key (keys are k, v, rot, qjl, seed)");
        }
        if (st)
            return st;
    }
    if (!have_k || !have_v)
        return bad_item(err, orig, "both k=TYPE and v=TYPE are needed (or one bare type for both)");
    eval_config_label(c, def);
    return KVQ_OK;
}

kvq_status eval_spec_parse(const char *spec, const struct eval_config *def, struct eval_config *out, size_t cap,
                           size_t *n, kvq_error *err)
{
    *n = 0;
    if (!spec || !*spec)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "--types needs at least one entry");
    const char *p = spec;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[128];
        if (len == 0)
            return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "empty entry in --types '%s'", spec);
        if (len >= sizeof item)
            return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "--types entry too long: '%.40s...'", p);
        if (*n >= cap)
            return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "more than %zu entries in --types", cap);
        memcpy(item, p, len);
        item[len] = '\0';
        kvq_status st = parse_item(item, def, &out[*n], err);
        if (st)
            return st;
        (*n)++;
        if (!end)
            return KVQ_OK;
        p = end + 1;
    }
}

static size_t add(struct eval_config *out, size_t n, size_t cap, const struct eval_config *def, enum kvq_type k,
                  enum kvq_type v)
{
    if (n >= cap)
        return n;
    out[n] = *def;
    out[n].type_k = k;
    out[n].type_v = v;
    eval_config_label(&out[n], def);
    return n + 1;
}

size_t eval_sweep_default(const struct eval_config *def, struct eval_config *out, size_t cap)
{
    static const enum kvq_type tq[4] = {KVQ_TYPE_TQ1, KVQ_TYPE_TQ2, KVQ_TYPE_TQ3, KVQ_TYPE_TQ4};
    static const enum kvq_type tqj[4] = {KVQ_TYPE_TQ1J, KVQ_TYPE_TQ2J, KVQ_TYPE_TQ3J, KVQ_TYPE_TQ4J};
    size_t n = 0;
    n = add(out, n, cap, def, KVQ_TYPE_F32, KVQ_TYPE_F32);
    n = add(out, n, cap, def, KVQ_TYPE_F16, KVQ_TYPE_F16);
    n = add(out, n, cap, def, KVQ_TYPE_Q8_0, KVQ_TYPE_Q8_0);
    n = add(out, n, cap, def, KVQ_TYPE_Q4_0, KVQ_TYPE_Q4_0);
    n = add(out, n, cap, def, KVQ_TYPE_Q8_0, KVQ_TYPE_Q4_0);
    /* Symmetric tq, then the QJL key on the same-bit value codebook. */
    for (int b = 0; b < 4; b++)
        n = add(out, n, cap, def, tq[b], tq[b]);
    for (int b = 0; b < 4; b++)
        n = add(out, n, cap, def, tqj[b], tq[b]);
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
    return n;
}

size_t eval_ensure_floor(const struct eval_config *def, struct eval_config *cfgs, size_t n, size_t cap)
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
