/* chat.c - kvq_chat.h's entry points: template life cycle, tokenizer_config.json
 * reading, and the variables a render sees (what transformers'
 * apply_chat_template passes: messages, tools=None, documents=None,
 * add_generation_prompt, bos_token, eos_token, and extra keyword arguments). */
#include "chat_internal.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvq_chat_options kvq_chat_options_default(void)
{
    kvq_chat_options o = {1, NULL, NULL, NULL};
    return o;
}

kvq_status kvq_chat_template_create(const char *src, size_t len, kvq_chat_template **out, kvq_error *err)
{
    if (!out || (!src && len))
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_chat_template_create: NULL argument");
    *out = NULL;
    kvq_chat_template *t = calloc(1, sizeof *t);
    if (!t)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    /* The source is kept: text nodes point into it. */
    char *copy = ch_strdup(&t->arena, src ? src : "", len);
    kvq_status st = copy ? ch_parse(t, copy, len, err) : kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    if (!st && t->arena.failed)
        st = kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    if (st) {
        kvq_chat_template_free(t);
        return st;
    }
    *out = t;
    return KVQ_OK;
}

void kvq_chat_template_free(kvq_chat_template *t)
{
    if (!t)
        return;
    ch_arena_free(&t->arena);
    free(t->bos);
    free(t->eos);
    free(t);
}

/* A special token in tokenizer_config.json: "text" or {"content": "text", ...}. */
static char *token_string(const cJSON *v)
{
    if (cJSON_IsObject(v))
        v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v) || !v->valuestring)
        return NULL;
    size_t n = strlen(v->valuestring);
    char *s = malloc(n + 1);
    if (s)
        memcpy(s, v->valuestring, n + 1);
    return s;
}

/* The whole file, malloc'ed and NUL-terminated; NULL with errno when unreadable. */
static char *read_all(const char *file, size_t *len)
{
    FILE *f = fopen(file, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, got;
    *len = 0;
    do {
        if (*len + 1 >= cap) {
            cap = cap ? 2 * cap : 1 << 16;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                errno = ENOMEM;
                return NULL;
            }
            buf = nb;
        }
        got = fread(buf + *len, 1, cap - *len - 1, f);
        *len += got;
    } while (got);
    fclose(f);
    buf[*len] = 0;
    return buf;
}

kvq_status kvq_chat_template_load(const char *path, kvq_chat_template **out, kvq_error *err)
{
    if (!path || !out)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_chat_template_load: NULL argument");
    *out = NULL;
    char file[4096], jinja_file[4096];
    size_t pl = strlen(path), len;
    int is_file = pl >= 5 && strcmp(path + pl - 5, ".json") == 0;
    snprintf(file, sizeof file, is_file ? "%s" : "%s/tokenizer_config.json", path);
    /* Newer model folders keep the template in chat_template.jinja beside it. */
    char *jinja = NULL;
    if (!is_file) {
        snprintf(jinja_file, sizeof jinja_file, "%s/chat_template.jinja", path);
        jinja = read_all(jinja_file, &len);
    }
    char *buf = read_all(file, &len);
    if (!buf && !jinja)
        return kvq_error_set(err, KVQ_ERR_IO, "%s: %s", file, strerror(errno));
    if (!buf) {
        kvq_status st = kvq_chat_template_create(jinja, strlen(jinja), out, err);
        free(jinja);
        return st;
    }
    cJSON *root = cJSON_ParseWithLength(buf, len);
    free(buf);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        free(jinja);
        return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: not a JSON object", file);
    }
    const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    if (cJSON_IsArray(tpl)) {
        /* [{"name": "default", "template": ...}, {"name": "tool_use", ...}] */
        const cJSON *pick = NULL;
        for (const cJSON *e = tpl->child; e; e = e->next) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (cJSON_IsString(name) && strcmp(name->valuestring, "default") == 0)
                pick = cJSON_GetObjectItemCaseSensitive(e, "template");
        }
        tpl = pick;
    }
    const char *src = jinja ? jinja : cJSON_IsString(tpl) ? tpl->valuestring : NULL;
    if (!src) {
        cJSON_Delete(root);
        return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: no chat_template (and no chat_template.jinja beside it)",
                             file);
    }
    kvq_status st = kvq_chat_template_create(src, strlen(src), out, err);
    free(jinja);
    if (!st) {
        (*out)->bos = token_string(cJSON_GetObjectItemCaseSensitive(root, "bos_token"));
        (*out)->eos = token_string(cJSON_GetObjectItemCaseSensitive(root, "eos_token"));
    }
    cJSON_Delete(root);
    return st;
}

/* ---- JSON -> values ---- */

static int from_json(ch_arena *a, const cJSON *j, ch_val *out)
{
    memset(out, 0, sizeof *out);
    if (cJSON_IsNull(j)) {
        out->t = V_NONE;
    } else if (cJSON_IsBool(j)) {
        out->t = V_BOOL;
        out->u.b = cJSON_IsTrue(j);
    } else if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d > -9e15 && d < 9e15 && d == (double)(int64_t)d) {
            out->t = V_INT;
            out->u.i = (int64_t)d;
        } else {
            out->t = V_FLOAT;
            out->u.f = d;
        }
    } else if (cJSON_IsString(j)) {
        size_t n = strlen(j->valuestring);
        char *s = ch_strdup(a, j->valuestring, n);
        if (!s)
            return 0;
        *out = ch_str(s, n);
    } else if (cJSON_IsArray(j)) {
        int n = cJSON_GetArraySize(j), i = 0;
        out->t = V_LIST;
        if (!(out->u.l = ch_alloc(a, sizeof *out->u.l)) ||
            (n && !(out->u.l->v = ch_alloc(a, (size_t)n * sizeof(ch_val)))))
            return 0;
        out->u.l->n = (size_t)n;
        for (const cJSON *e = j->child; e; e = e->next, i++)
            if (!from_json(a, e, &out->u.l->v[i]))
                return 0;
    } else if (cJSON_IsObject(j)) {
        out->t = V_DICT;
        if (!(out->u.d = ch_alloc(a, sizeof *out->u.d)))
            return 0;
        for (const cJSON *e = j->child; e; e = e->next) {
            ch_val v;
            size_t kn = strlen(e->string);
            char *k = ch_strdup(a, e->string, kn);
            if (!k || !from_json(a, e, &v) || !ch_dict_set(a, out->u.d, k, kn, v))
                return 0;
        }
    } else {
        return 0;
    }
    return 1;
}

static ch_val str_or_empty(ch_arena *a, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    char *d = ch_strdup(a, s ? s : "", n);
    return d ? ch_str(d, n) : (ch_val){V_UNDEF, {0}};
}

static kvq_status render_with(const kvq_chat_template *t, ch_arena *a, ch_val messages, const kvq_chat_options *opt,
                              char **text, size_t *len, kvq_error *err)
{
    kvq_chat_options o = opt ? *opt : kvq_chat_options_default();
    ch_dict *g = ch_alloc(a, sizeof *g);
    if (!g)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    ch_val none = {V_NONE, {0}}, agp = {V_BOOL, {0}};
    agp.u.b = o.add_generation_prompt != 0;
    int ok = ch_dict_set(a, g, "messages", 8, messages) && ch_dict_set(a, g, "tools", 5, none) &&
             ch_dict_set(a, g, "documents", 9, none) && ch_dict_set(a, g, "add_generation_prompt", 21, agp) &&
             ch_dict_set(a, g, "bos_token", 9, str_or_empty(a, o.bos_token ? o.bos_token : t->bos)) &&
             ch_dict_set(a, g, "eos_token", 9, str_or_empty(a, o.eos_token ? o.eos_token : t->eos));
    if (ok && o.extra_json) {
        cJSON *x = cJSON_Parse(o.extra_json);
        if (!cJSON_IsObject(x)) {
            cJSON_Delete(x);
            return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "chat template: extra_json is not a JSON object");
        }
        for (const cJSON *e = x->child; ok && e; e = e->next) {
            ch_val v;
            size_t kn = strlen(e->string);
            char *k = ch_strdup(a, e->string, kn);
            ok = k && from_json(a, e, &v) && ch_dict_set(a, g, k, kn, v);
        }
        cJSON_Delete(x);
    }
    if (!ok || a->failed)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    return ch_render(t, a, g, text, len, err);
}

kvq_status kvq_chat_render(const kvq_chat_template *t, const kvq_chat_message *messages, size_t n,
                           const kvq_chat_options *opt, char **text, size_t *len, kvq_error *err)
{
    if (!t || (!messages && n) || !text || !len)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_chat_render: NULL argument");
    *text = NULL;
    *len = 0;
    ch_arena a = {NULL, 0, 0};
    ch_val list = {V_LIST, {0}};
    kvq_status st = KVQ_OK;
    if (!(list.u.l = ch_alloc(&a, sizeof *list.u.l)) || (n && !(list.u.l->v = ch_alloc(&a, n * sizeof(ch_val)))))
        st = kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    for (size_t i = 0; !st && i < n; i++) {
        if (!messages[i].role || !messages[i].content) {
            st = kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_chat_render: message %zu has no role or content", i);
            break;
        }
        ch_val m = {V_DICT, {0}};
        if (!(m.u.d = ch_alloc(&a, sizeof *m.u.d)) ||
            !ch_dict_set(&a, m.u.d, "role", 4, str_or_empty(&a, messages[i].role)) ||
            !ch_dict_set(&a, m.u.d, "content", 7, str_or_empty(&a, messages[i].content)) || a.failed)
            st = kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
        else
            list.u.l->v[list.u.l->n++] = m;
    }
    if (!st)
        st = render_with(t, &a, list, opt, text, len, err);
    ch_arena_free(&a);
    return st;
}

kvq_status kvq_chat_render_json(const kvq_chat_template *t, const char *messages_json, const kvq_chat_options *opt,
                                char **text, size_t *len, kvq_error *err)
{
    if (!t || !messages_json || !text || !len)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_chat_render_json: NULL argument");
    *text = NULL;
    *len = 0;
    cJSON *j = cJSON_Parse(messages_json);
    if (!cJSON_IsArray(j)) {
        cJSON_Delete(j);
        return kvq_error_set(err, KVQ_ERR_FORMAT, "chat messages: not a JSON array");
    }
    ch_arena a = {NULL, 0, 0};
    ch_val list;
    kvq_status st = from_json(&a, j, &list) ? KVQ_OK : kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    cJSON_Delete(j);
    if (!st)
        st = render_with(t, &a, list, opt, text, len, err);
    ch_arena_free(&a);
    return st;
}
