/* eval_spec.c - parsing `kvq eval --types`. */
#include "eval_spec.h"

#include <stdio.h>
#include <string.h>

#include "cli.h"

static kvq_status bad_item(kvq_error *err, const char *item, const char *why)
{
    return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "bad --types entry '%s': %s", item, why);
}

static kvq_status parse_type(const char *item, const char *name, enum kvq_type *out, kvq_error *err)
{
    char low[64];
    if (kvq_type_from_name(cli_lower(name, low, sizeof low), out) == KVQ_OK)
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
static kvq_status parse_item(char *item, const struct kvq_eval_config *def, struct kvq_eval_config *c, kvq_error *err)
{
    char orig[128];
    snprintf(orig, sizeof orig, "%s", item);
    *c = *def;
    if (!strchr(item, '=')) {
        kvq_status st = parse_type(orig, item, &c->type_k, err);
        if (st)
            return st;
        c->type_v = c->type_k;
        kvq_eval_config_label(c, def);
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
    kvq_eval_config_label(c, def);
    return KVQ_OK;
}

kvq_status eval_spec_parse(const char *spec, const struct kvq_eval_config *def, struct kvq_eval_config *out, size_t cap,
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
