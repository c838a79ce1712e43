/* manifest.c - runtime_meta.json: parse, validate, check files, write.
 *
 * Validation gives every violation its own message, because a runtime that
 * says only "bad manifest" leaves the user to diff JSON by hand.
 */
#include "kvq_manifest.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvq_file.h"

static const char *const kind_names[] = {"embed", "layers", "lm_head"};

uint64_t kvq_fnv1a64(const void *data, size_t n, uint64_t h)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

void kvq_manifest_clear(struct kvq_manifest *m)
{
    if (!m)
        return;
    free(m->shards);
    memset(m, 0, sizeof *m);
}

static int json_int(const cJSON *j, long lo, long hi, int *out)
{
    if (!cJSON_IsNumber(j) || floor(j->valuedouble) != j->valuedouble || j->valuedouble < (double)lo ||
        j->valuedouble > (double)hi)
        return -1;
    *out = (int)j->valuedouble;
    return 0;
}

static int json_name(const cJSON *j, char *out)
{
    if (!cJSON_IsString(j) || !j->valuestring[0] || strlen(j->valuestring) >= KVQ_MANIFEST_NAME_MAX ||
        strchr(j->valuestring, '/') || strcmp(j->valuestring, "..") == 0 || strcmp(j->valuestring, ".") == 0)
        return -1;
    strcpy(out, j->valuestring);
    return 0;
}

static kvq_status parse_shard(const cJSON *e, size_t i, struct kvq_shard *sh, kvq_error *err)
{
    if (!cJSON_IsObject(e))
        return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: shard %zu is not an object", i);
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(e, "kind");
    int k = -1;
    for (int j = 0; j < 3 && cJSON_IsString(kind); j++)
        if (strcmp(kind->valuestring, kind_names[j]) == 0)
            k = j;
    if (k < 0)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: shard %zu has no kind embed/layers/lm_head", i);
    sh->kind = (enum kvq_shard_kind)k;
    if (json_name(cJSON_GetObjectItemCaseSensitive(e, "file"), sh->file) != 0)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: shard %zu has no plain 'file' name", i);
    const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(e, "bytes");
    if (!cJSON_IsNumber(bytes) || !(bytes->valuedouble >= 0) || bytes->valuedouble > 9007199254740992.0 ||
        floor(bytes->valuedouble) != bytes->valuedouble)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: shard '%s' has no valid 'bytes'", sh->file);
    sh->bytes = (uint64_t)bytes->valuedouble;
    const cJSON *fnv = cJSON_GetObjectItemCaseSensitive(e, "fnv1a64");
    char *end = NULL;
    if (cJSON_IsString(fnv) && strlen(fnv->valuestring) == 16)
        sh->fnv1a64 = strtoull(fnv->valuestring, &end, 16);
    if (!end || *end)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: shard '%s' has no 16-hex-digit 'fnv1a64'",
                             sh->file);
    if (sh->kind == KVQ_SHARD_EMBED)
        return KVQ_OK;
    const char *rk = sh->kind == KVQ_SHARD_LAYERS ? "layers" : "vocab";
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(e, rk);
    if (!cJSON_IsArray(r) || cJSON_GetArraySize(r) != 2 || json_int(r->child, 0, 1 << 24, &sh->begin) != 0 ||
        json_int(r->child->next, 0, 1 << 24, &sh->end) != 0)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: shard '%s' has no '%s' range [begin, end]",
                             sh->file, rk);
    return KVQ_OK;
}

static kvq_status parse_root(const cJSON *root, struct kvq_manifest *m, kvq_error *err)
{
    if (!cJSON_IsObject(root))
        return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: not a JSON object");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, KVQ_MANIFEST_FORMAT) != 0)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: 'format' is not \"%s\"", KVQ_MANIFEST_FORMAT);
    if (json_int(cJSON_GetObjectItemCaseSensitive(root, "format_version"), 0, 1 << 30, &m->format_version) != 0)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: missing 'format_version'");
    if (m->format_version != KVQ_MANIFEST_VERSION)
        return kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "runtime_meta.json: format_version %d is not supported (%d)",
                             m->format_version, KVQ_MANIFEST_VERSION);
    if (json_name(cJSON_GetObjectItemCaseSensitive(root, "config"), m->config) != 0 ||
        json_name(cJSON_GetObjectItemCaseSensitive(root, "tokenizer"), m->tokenizer) != 0)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: 'config' and 'tokenizer' must be plain file names");
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(root, "dtype");
    if (!cJSON_IsString(dt) || kvq_st_dtype_from_name(dt->valuestring, &m->dtype) != KVQ_OK ||
        (m->dtype != KVQ_ST_F32 && m->dtype != KVQ_ST_F16 && m->dtype != KVQ_ST_BF16))
        return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: 'dtype' must be F32, F16 or BF16");
    const cJSON *dims = cJSON_GetObjectItemCaseSensitive(root, "dims");
    static const char *const dn[] = {"hidden", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn", "vocab",
                                     "max_context"};
    int *dv[] = {&m->hidden, &m->n_layers, &m->n_heads, &m->n_kv_heads, &m->head_dim, &m->ffn, &m->vocab,
                 &m->max_ctx};
    for (int i = 0; i < 8; i++)
        if (json_int(cJSON_GetObjectItemCaseSensitive(dims, dn[i]), 1, 1 << 24, dv[i]) != 0)
            return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: dims.%s missing or not a positive integer",
                                 dn[i]);
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(root, "shards");
    if (!cJSON_IsArray(shards) || cJSON_GetArraySize(shards) < 1 ||
        cJSON_GetArraySize(shards) > KVQ_MANIFEST_MAX_SHARDS)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: 'shards' must be a non-empty array");
    m->n_shards = (size_t)cJSON_GetArraySize(shards);
    m->shards = calloc(m->n_shards, sizeof *m->shards);
    if (!m->shards)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, shards)
    {
        kvq_status st = parse_shard(e, i, &m->shards[i], err);
        if (st != KVQ_OK)
            return st;
        i++;
    }
    return KVQ_OK;
}

kvq_status kvq_manifest_parse(const char *json, size_t len, struct kvq_manifest *m, kvq_error *err)
{
    if (!json || !m)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_manifest_parse: NULL argument");
    memset(m, 0, sizeof *m);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: not valid JSON");
    kvq_status st = parse_root(root, m, err);
    cJSON_Delete(root);
    if (st != KVQ_OK)
        kvq_manifest_clear(m);
    return st;
}

/* Sorted view of the shards of one kind, by begin. */
static int cmp_begin(const void *a, const void *b)
{
    const struct kvq_shard *x = *(const struct kvq_shard *const *)a, *y = *(const struct kvq_shard *const *)b;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

/* Layer groups must tile [0, total); LM-head slices must tile [0, vocab). */
static kvq_status check_cover(const struct kvq_manifest *m, enum kvq_shard_kind kind, int total,
                              const struct kvq_shard **v, kvq_error *err)
{
    size_t n = 0;
    for (size_t i = 0; i < m->n_shards; i++)
        if (m->shards[i].kind == kind)
            v[n++] = &m->shards[i];
    int layers = kind == KVQ_SHARD_LAYERS;
    if (n == 0)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: no %s shards", layers ? "layer" : "LM-head");
    for (size_t i = 0; i < n; i++)
        if (v[i]->begin >= v[i]->end)
            return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: shard '%s' has an empty range [%d, %d)",
                                 v[i]->file, v[i]->begin, v[i]->end);
    qsort(v, n, sizeof *v, cmp_begin);
    if (layers) {
        if (v[0]->begin != 0)
            return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: layers [0, %d) are in no shard (gap)",
                                 v[0]->begin);
        for (size_t i = 1; i < n; i++) {
            if (v[i]->begin < v[i - 1]->end)
                return kvq_error_set(err, KVQ_ERR_FORMAT,
                                     "runtime_meta.json: layer shards '%s' [%d, %d) and '%s' [%d, %d) overlap",
                                     v[i - 1]->file, v[i - 1]->begin, v[i - 1]->end, v[i]->file, v[i]->begin,
                                     v[i]->end);
            if (v[i]->begin > v[i - 1]->end)
                return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: layers [%d, %d) are in no shard (gap)",
                                     v[i - 1]->end, v[i]->begin);
        }
        if (v[n - 1]->end != total)
            return kvq_error_set(err, KVQ_ERR_FORMAT,
                                 "runtime_meta.json: layer shards end at layer %d, the model has %d layers",
                                 v[n - 1]->end, total);
        return KVQ_OK;
    }
    if (v[0]->begin != 0)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: LM-head slices start at vocab %d, not 0",
                             v[0]->begin);
    for (size_t i = 1; i < n; i++)
        if (v[i]->begin != v[i - 1]->end)
            return kvq_error_set(err, KVQ_ERR_FORMAT,
                                 "runtime_meta.json: LM-head slices are not contiguous: '%s' ends at %d, '%s' "
                                 "starts at %d",
                                 v[i - 1]->file, v[i - 1]->end, v[i]->file, v[i]->begin);
    if (v[n - 1]->end != total)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: LM-head slices end at %d, vocab_size is %d",
                             v[n - 1]->end, total);
    return KVQ_OK;
}

static int cmp_file(const void *a, const void *b)
{
    return strcmp((*(const struct kvq_shard *const *)a)->file, (*(const struct kvq_shard *const *)b)->file);
}

kvq_status kvq_manifest_validate(const struct kvq_manifest *m, const struct kvq_model_config *cfg, kvq_error *err)
{
    if (!m || !m->n_shards)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: no shards");
    if (cfg) {
        static const char *const dn[] = {"hidden", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn", "vocab",
                                         "max_context"};
        const int mine[] = {m->hidden, m->n_layers, m->n_heads, m->n_kv_heads, m->head_dim, m->ffn, m->vocab,
                            m->max_ctx};
        const int theirs[] = {cfg->hidden, cfg->n_layers, cfg->n_heads, cfg->n_kv_heads, cfg->head_dim, cfg->ffn,
                              cfg->vocab, cfg->max_ctx};
        for (int i = 0; i < 8; i++)
            if (mine[i] != theirs[i])
                return kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: dims.%s is %d, config.json says %d",
                                     dn[i], mine[i], theirs[i]);
    }
    const struct kvq_shard **v = malloc(m->n_shards * sizeof *v);
    if (!v)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    kvq_status st = KVQ_OK;
    size_t n_embed = 0;
    for (size_t i = 0; i < m->n_shards; i++)
        n_embed += m->shards[i].kind == KVQ_SHARD_EMBED;
    if (n_embed != 1)
        st = kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: %zu embedding shards (need exactly 1)", n_embed);
    if (st == KVQ_OK)
        st = check_cover(m, KVQ_SHARD_LAYERS, m->n_layers, v, err);
    if (st == KVQ_OK)
        st = check_cover(m, KVQ_SHARD_LM_HEAD, m->vocab, v, err);
    if (st == KVQ_OK) {
        for (size_t i = 0; i < m->n_shards; i++)
            v[i] = &m->shards[i];
        qsort(v, m->n_shards, sizeof *v, cmp_file);
        for (size_t i = 1; i < m->n_shards && st == KVQ_OK; i++)
            if (strcmp(v[i]->file, v[i - 1]->file) == 0)
                st = kvq_error_set(err, KVQ_ERR_FORMAT, "runtime_meta.json: file '%s' is listed twice", v[i]->file);
    }
    free(v);
    return st;
}

kvq_status kvq_file_checksum(const char *path, uint64_t *fnv, uint64_t *bytes)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return KVQ_ERR_IO;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return KVQ_ERR_IO;
    }
    *bytes = (uint64_t)sb.st_size;
    uint64_t h = KVQ_FNV1A64_INIT;
    if (sb.st_size > 0) {
        void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return KVQ_ERR_IO;
        }
        h = kvq_fnv1a64(p, (size_t)sb.st_size, h);
        munmap(p, (size_t)sb.st_size);
    }
    close(fd);
    *fnv = h;
    return KVQ_OK;
}

kvq_status kvq_manifest_check_files(const struct kvq_manifest *m, const char *dir, int verify_checksums,
                                    kvq_error *err)
{
    char path[4096];
    for (size_t i = 0; i < m->n_shards; i++) {
        const struct kvq_shard *sh = &m->shards[i];
        int n = snprintf(path, sizeof path, "%s/%s", dir, sh->file);
        if (n < 0 || (size_t)n >= sizeof path)
            return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "%s: path too long", dir);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            return kvq_error_set(err, KVQ_ERR_IO, "%s: shard file missing (listed in runtime_meta.json)", path);
        if ((uint64_t)sb.st_size != sh->bytes)
            return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: %lld bytes, runtime_meta.json declares %" PRIu64, path,
                                 (long long)sb.st_size, sh->bytes);
        if (!verify_checksums)
            continue;
        uint64_t h, b;
        if (kvq_file_checksum(path, &h, &b) != KVQ_OK)
            return kvq_error_set(err, KVQ_ERR_IO, "%s: cannot read: %s", path, strerror(errno ? errno : EIO));
        if (h != sh->fnv1a64)
            return kvq_error_set(err, KVQ_ERR_FORMAT,
                                 "%s: checksum mismatch (file fnv1a64 %016" PRIx64 ", runtime_meta.json %016" PRIx64
                                 "): corrupt or replaced",
                                 path, h, sh->fnv1a64);
    }
    return KVQ_OK;
}

kvq_status kvq_manifest_write(const struct kvq_manifest *m, const char *path, kvq_error *err)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *dims = cJSON_CreateObject();
    cJSON *shards = cJSON_CreateArray();
    int ok = root && dims && shards;
    ok = ok && cJSON_AddStringToObject(root, "format", KVQ_MANIFEST_FORMAT) &&
         cJSON_AddNumberToObject(root, "format_version", m->format_version ? m->format_version : KVQ_MANIFEST_VERSION) &&
         cJSON_AddStringToObject(root, "config", m->config) && cJSON_AddStringToObject(root, "tokenizer", m->tokenizer) &&
         cJSON_AddStringToObject(root, "dtype", kvq_st_dtype_name(m->dtype));
    static const char *const dn[] = {"hidden", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn", "vocab",
                                     "max_context"};
    const int dv[] = {m->hidden, m->n_layers, m->n_heads, m->n_kv_heads, m->head_dim, m->ffn, m->vocab, m->max_ctx};
    for (int i = 0; ok && i < 8; i++)
        ok = cJSON_AddNumberToObject(dims, dn[i], dv[i]) != NULL;
    for (size_t i = 0; ok && i < m->n_shards; i++) {
        const struct kvq_shard *sh = &m->shards[i];
        cJSON *e = cJSON_CreateObject();
        char hex[17];
        snprintf(hex, sizeof hex, "%016" PRIx64, sh->fnv1a64);
        ok = e && cJSON_AddItemToArray(shards, e) && cJSON_AddStringToObject(e, "kind", kind_names[sh->kind]) &&
             cJSON_AddStringToObject(e, "file", sh->file);
        if (ok && sh->kind != KVQ_SHARD_EMBED) {
            cJSON *r = cJSON_CreateArray();
            ok = r && cJSON_AddItemToObject(e, sh->kind == KVQ_SHARD_LAYERS ? "layers" : "vocab", r) &&
                 cJSON_AddItemToArray(r, cJSON_CreateNumber(sh->begin)) &&
                 cJSON_AddItemToArray(r, cJSON_CreateNumber(sh->end));
        }
        ok = ok && cJSON_AddNumberToObject(e, "bytes", (double)sh->bytes) && cJSON_AddStringToObject(e, "fnv1a64", hex);
    }
    if (ok) {
        ok = cJSON_AddItemToObject(root, "dims", dims);
        if (ok)
            dims = NULL;
        ok = ok && cJSON_AddItemToObject(root, "shards", shards);
        if (ok)
            shards = NULL;
    }
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    cJSON_Delete(dims);
    cJSON_Delete(shards);
    if (!text)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory writing %s", path);
    size_t len = strlen(text);
    text[len] = '\n'; /* replaces the NUL: written with its length */
    kvq_status st = kvq_write_file_atomic(path, text, len + 1, err);
    free(text);
    return st;
}
