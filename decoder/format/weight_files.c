/* weight_files.c - the set of mapped safetensors files a model is read from,
 * and how a plain Hugging Face directory names them (one model.safetensors,
 * or model.safetensors.index.json listing the shards, whose weight_map
 * is held against the files: each tensor in exactly the file it names). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "decoder_internal.h"
#include "format_internal.h"

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
    if (nf)
        fs->files = nf;
    char **np = nf ? realloc(fs->paths, (size_t)(fs->n + 1) * sizeof *np) : NULL;
    if (np)
        fs->paths = np;
    if (!nf || !np || !(np[fs->n] = strdup(path)))
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    kvq_status st = kvq_st_open(path, &fs->files[fs->n], err);
    if (st != KVQ_OK) {
        free(fs->paths[fs->n]);
        return st;
    }
    fs->bytes += kvq_st_file_size(fs->files[fs->n]);
    fs->n++;
    return KVQ_OK;
}

/* A file name from untrusted JSON must stay inside the model directory. */
static int safe_name(const char *s)
{
    return s && s[0] && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const struct kvq_index_entry *)a)->name, ((const struct kvq_index_entry *)b)->name);
}

void kvq_index_free(struct kvq_index *idx)
{
    if (!idx)
        return;
    free(idx->files);
    free(idx->e);
    cJSON_Delete(idx->root);
    memset(idx, 0, sizeof *idx);
}

kvq_status kvq_index_parse(const char *text, size_t len, const char *path, struct kvq_index *idx, kvq_error *err)
{
    memset(idx, 0, sizeof *idx);
    idx->root = cJSON_ParseWithLength(text, len);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(idx->root, "weight_map");
    if (!cJSON_IsObject(map)) {
        kvq_index_free(idx);
        return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: %s", path,
                             idx->root ? "no 'weight_map' object" : "not valid JSON");
    }
    size_t n = (size_t)cJSON_GetArraySize(map);
    idx->e = calloc(n ? n : 1, sizeof *idx->e);
    idx->files = calloc(n ? n : 1, sizeof *idx->files);
    if (!idx->e || !idx->files) {
        kvq_index_free(idx);
        return kvq_error_set(err, KVQ_ERR_NOMEM, "%s: out of memory", path);
    }
    /* Each distinct file once, in order of first mention. */
    kvq_status st = KVQ_OK;
    const cJSON *e;
    cJSON_ArrayForEach(e, map)
    {
        if (!cJSON_IsString(e) || !safe_name(e->valuestring)) {
            st = kvq_error_set(err, KVQ_ERR_FORMAT, "%s: weight_map entry '%s' is not a plain file name", path,
                               e->string);
            break;
        }
        int f = 0;
        while (f < idx->n_files && strcmp(idx->files[f], e->valuestring) != 0)
            f++;
        if (f == idx->n_files)
            idx->files[idx->n_files++] = e->valuestring;
        idx->e[idx->n].name = e->string;
        idx->e[idx->n++].file = f;
    }
    if (st == KVQ_OK && idx->n == 0)
        st = kvq_error_set(err, KVQ_ERR_FORMAT, "%s: empty weight_map", path);
    if (st == KVQ_OK) {
        qsort(idx->e, idx->n, sizeof *idx->e, entry_cmp);
        for (size_t i = 1; i < idx->n && st == KVQ_OK; i++)
            if (strcmp(idx->e[i - 1].name, idx->e[i].name) == 0)
                st = kvq_error_set(err, KVQ_ERR_FORMAT, "%s: weight_map lists '%s' twice", path, idx->e[i].name);
    }
    if (st != KVQ_OK)
        kvq_index_free(idx);
    return st;
}

kvq_status kvq_index_check(const struct kvq_index *idx, kvq_st_file *const *files, const char *path, kvq_error *err)
{
    /* Every tensor of every file is listed, and listed in that file: a
     * tensor the index puts elsewhere (a duplicate in another shard) would
     * otherwise be taken from whichever file is searched first. */
    for (int f = 0; f < idx->n_files; f++)
        for (size_t i = 0; i < kvq_st_count(files[f]); i++) {
            const char *name = kvq_st_tensor_at(files[f], i)->name;
            struct kvq_index_entry key = {name, 0};
            const struct kvq_index_entry *hit = bsearch(&key, idx->e, idx->n, sizeof *idx->e, entry_cmp);
            if (!hit)
                return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: %s holds '%s', which weight_map does not list", path,
                                     idx->files[f], name);
            if (hit->file != f)
                return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: %s holds '%s', which weight_map puts in %s", path,
                                     idx->files[f], name, idx->files[hit->file]);
        }
    for (size_t i = 0; i < idx->n; i++)
        if (!kvq_st_find(files[idx->e[i].file], idx->e[i].name))
            return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: weight_map puts '%s' in %s, which does not hold it", path,
                                 idx->e[i].name, idx->files[idx->e[i].file]);
    return KVQ_OK;
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
    errno = 0;
    char *text = kvq_read_text(path, 1u << 28, &len);
    if (!text)
        return kvq_error_set(err, KVQ_ERR_IO, "%s: cannot read: %s", path, strerror(errno ? errno : EIO));
    struct kvq_index idx;
    kvq_status st = kvq_index_parse(text, len, path, &idx, err);
    free(text);
    for (int f = 0; st == KVQ_OK && f < idx.n_files; f++)
        st = kvq_files_open(fs, dir, idx.files[f], err);
    if (st == KVQ_OK)
        st = kvq_index_check(&idx, fs->files, path, err);
    kvq_index_free(&idx);
    return st;
}

void kvq_files_close(struct kvq_file_set *fs)
{
    for (int i = 0; i < fs->n; i++) {
        kvq_st_close(fs->files[i]);
        free(fs->paths[i]);
    }
    free(fs->files);
    free(fs->paths);
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
