/* safetensors_write.c - the safetensors writer (qkv dumps, model shards).
 *
 * The header is built with cJSON, padded with spaces to a multiple of 8 bytes
 * (as the reference writer does) so that data stays aligned for readers that
 * map the file, and the file goes through kvq_out_file (kvq_file.h): an
 * interrupted or concurrent write never leaves a file that looks complete.
 */
#include "kvq_safetensors.h"

#include "kvq_file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct entry {
    char *name;
    enum kvq_st_dtype dtype;
    int n_dims;
    int64_t shape[KVQ_ST_MAX_DIMS];
    size_t nbytes;
    const void *data;
};

struct kvq_st_writer {
    struct entry *e;
    size_t n, cap;
    cJSON *meta; /* object of strings, or NULL */
};

kvq_status kvq_st_writer_create(kvq_st_writer **out)
{
    if (!out)
        return KVQ_ERR_INVALID_ARG;
    *out = calloc(1, sizeof **out);
    return *out ? KVQ_OK : KVQ_ERR_NOMEM;
}

void kvq_st_writer_free(kvq_st_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n; i++)
        free(w->e[i].name);
    free(w->e);
    cJSON_Delete(w->meta);
    free(w);
}

kvq_status kvq_st_writer_add(kvq_st_writer *w, const char *name, enum kvq_st_dtype dtype, int n_dims,
                             const int64_t *shape, const void *data)
{
    if (!w || !name || !name[0] || strcmp(name, "__metadata__") == 0 || kvq_st_dtype_size(dtype) == 0 ||
        n_dims < 0 || n_dims > KVQ_ST_MAX_DIMS || (n_dims && !shape))
        return KVQ_ERR_INVALID_ARG;
    size_t count = 1;
    for (int i = 0; i < n_dims; i++) {
        if (shape[i] < 0 || (shape[i] && count > SIZE_MAX / (uint64_t)shape[i]))
            return KVQ_ERR_INVALID_ARG;
        count *= (size_t)shape[i];
    }
    size_t es = kvq_st_dtype_size(dtype);
    if (count > SIZE_MAX / es || (count && !data))
        return KVQ_ERR_INVALID_ARG;
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->e[i].name, name) == 0)
            return KVQ_ERR_INVALID_ARG;
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        struct entry *e = realloc(w->e, cap * sizeof *e);
        if (!e)
            return KVQ_ERR_NOMEM;
        w->e = e;
        w->cap = cap;
    }
    struct entry *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    if (!e->name)
        return KVQ_ERR_NOMEM;
    e->dtype = dtype;
    e->n_dims = n_dims;
    for (int i = 0; i < n_dims; i++)
        e->shape[i] = shape[i];
    e->nbytes = count * es;
    e->data = data;
    w->n++;
    return KVQ_OK;
}

kvq_status kvq_st_writer_set_metadata(kvq_st_writer *w, const char *key, const char *value)
{
    if (!w || !key || !value)
        return KVQ_ERR_INVALID_ARG;
    if (!w->meta && !(w->meta = cJSON_CreateObject()))
        return KVQ_ERR_NOMEM;
    cJSON *s = cJSON_CreateString(value);
    if (!s)
        return KVQ_ERR_NOMEM;
    cJSON_DeleteItemFromObjectCaseSensitive(w->meta, key);
    if (!cJSON_AddItemToObject(w->meta, key, s)) {
        cJSON_Delete(s);
        return KVQ_ERR_NOMEM;
    }
    return KVQ_OK;
}

/* The header JSON, or NULL when out of memory. */
static char *build_header(const kvq_st_writer *w)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return NULL;
    int ok = 1;
    if (w->meta) {
        cJSON *m = cJSON_Duplicate(w->meta, 1);
        ok = m && cJSON_AddItemToObject(root, "__metadata__", m);
    }
    size_t off = 0;
    for (size_t i = 0; ok && i < w->n; i++) {
        const struct entry *e = &w->e[i];
        cJSON *t = cJSON_CreateObject();
        cJSON *shape = cJSON_CreateArray();
        cJSON *offs = cJSON_CreateArray();
        ok = t && shape && offs;
        for (int d = 0; ok && d < e->n_dims; d++)
            ok = cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e->shape[d]));
        ok = ok && cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off)) &&
             cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + e->nbytes)));
        ok = ok && cJSON_AddStringToObject(t, "dtype", kvq_st_dtype_name(e->dtype)) &&
             cJSON_AddItemToObject(t, "shape", shape);
        if (ok)
            shape = NULL;
        ok = ok && cJSON_AddItemToObject(t, "data_offsets", offs);
        if (ok)
            offs = NULL;
        ok = ok && cJSON_AddItemToObject(root, e->name, t);
        if (ok)
            t = NULL;
        cJSON_Delete(shape);
        cJSON_Delete(offs);
        cJSON_Delete(t);
        off += e->nbytes;
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return json;
}

kvq_status kvq_st_writer_write(const kvq_st_writer *w, const char *path, kvq_error *err)
{
    if (!w || !path)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_st_writer_write: NULL argument");
    char *json = build_header(w);
    if (!json)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "%s: out of memory building the header", path);
    size_t jlen = strlen(json);
    size_t hlen = (jlen + 7) & ~(size_t)7;
    kvq_out_file *of;
    kvq_status st = kvq_out_file_create(path, &of, err);
    if (st != KVQ_OK) {
        free(json);
        return st;
    }
    FILE *fp = kvq_out_file_stream(of);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    int ok = fwrite(len8, 1, 8, fp) == 8 && fwrite(json, 1, jlen, fp) == jlen;
    for (size_t i = jlen; ok && i < hlen; i++)
        ok = fputc(' ', fp) != EOF;
    for (size_t i = 0; ok && i < w->n; i++)
        ok = w->e[i].nbytes == 0 || fwrite(w->e[i].data, 1, w->e[i].nbytes, fp) == w->e[i].nbytes;
    if (ok)
        st = kvq_out_file_commit(of, err); /* reports late errors too (full disk at flush) */
    else {
        int e = errno ? errno : EIO;
        kvq_out_file_free(of);
        st = kvq_error_set(err, KVQ_ERR_IO, "%s: write failed: %s", path, strerror(e));
    }
    free(json);
    return st;
}
