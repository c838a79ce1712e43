/* weight_files.c - the set of mapped safetensors files a model is read from,
 * and how a plain Hugging Face directory names them (one model.safetensors,
 * or model.safetensors.index.json listing the shards). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "decoder_internal.h"

int kvq_path_join(char *out, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(out, cap, "%s/%s", dir, name);
    return n > 0 && (size_t)n < cap ? 0 : -1;
}

int kvq_file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

char *kvq_read_text(const char *path, size_t max, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    long n;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && (size_t)n <= max && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = 0;
        *len = (size_t)n;
    } else {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

kvq_status kvq_files_open(struct kvq_file_set *fs, const char *dir, const char *name, kvq_error *err)
{
    char path[KVQ_PATH_MAX];
    if (kvq_path_join(path, sizeof path, dir, name) != 0)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "%s: path too long", dir);
    kvq_st_file **nf = realloc(fs->files, (size_t)(fs->n + 1) * sizeof *nf);
    if (!nf)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    fs->files = nf;
    kvq_status st = kvq_st_open(path, &fs->files[fs->n], err);
    if (st != KVQ_OK)
        return st;
    fs->bytes += kvq_st_file_size(fs->files[fs->n]);
    fs->n++;
    return KVQ_OK;
}

/* A file name from untrusted JSON must stay inside the model directory. */
static int safe_name(const char *s)
{
    return s && s[0] && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

kvq_status kvq_files_open_hf(struct kvq_file_set *fs, const char *dir, kvq_error *err)
{
    char path[KVQ_PATH_MAX];
    if (kvq_path_join(path, sizeof path, dir, "model.safetensors.index.json") != 0)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "%s: path too long", dir);
    if (!kvq_file_exists(path)) {
        if (kvq_path_join(path, sizeof path, dir, "model.safetensors") != 0 || !kvq_file_exists(path))
            return kvq_error_set(err, KVQ_ERR_IO, "%s: no model.safetensors, model.safetensors.index.json or %s",
                                 dir, "runtime_meta.json");
        return kvq_files_open(fs, dir, "model.safetensors", err);
    }
    size_t len;
    char *text = kvq_read_text(path, 1u << 28, &len);
    if (!text)
        return kvq_error_set(err, KVQ_ERR_IO, "%s: cannot read", path);
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    kvq_status st = KVQ_OK;
    if (!cJSON_IsObject(map)) {
        st = kvq_error_set(err, KVQ_ERR_FORMAT, "%s: no 'weight_map' object", path);
        goto out;
    }
    /* Each distinct file once, in order of first mention. */
    const cJSON *e, *p;
    cJSON_ArrayForEach(e, map)
    {
        if (!cJSON_IsString(e) || !safe_name(e->valuestring)) {
            st = kvq_error_set(err, KVQ_ERR_FORMAT, "%s: weight_map entry '%s' is not a plain file name", path,
                               e->string);
            goto out;
        }
        int seen = 0;
        for (p = map->child; p != e && !seen; p = p->next)
            seen = strcmp(p->valuestring, e->valuestring) == 0;
        if (!seen && (st = kvq_files_open(fs, dir, e->valuestring, err)) != KVQ_OK)
            goto out;
    }
    if (fs->n == 0)
        st = kvq_error_set(err, KVQ_ERR_FORMAT, "%s: empty weight_map", path);
out:
    cJSON_Delete(root);
    return st;
}

void kvq_files_close(struct kvq_file_set *fs)
{
    for (int i = 0; i < fs->n; i++)
        kvq_st_close(fs->files[i]);
    free(fs->files);
    memset(fs, 0, sizeof *fs);
}

const struct kvq_st_tensor *kvq_files_find(const struct kvq_file_set *fs, int only, const char *name, int *where)
{
    for (int i = 0; i < fs->n; i++) {
        if (only >= 0 && i != only)
            continue;
        const struct kvq_st_tensor *t = kvq_st_find(fs->files[i], name);
        if (t) {
            if (where)
                *where = i;
            return t;
        }
    }
    return NULL;
}
