/* safetensors.c - the safetensors reader: map, validate the header, hand out
 * tensor views.
 *
 * Everything in the header is untrusted: lengths, shapes and offsets are
 * checked with overflow-safe arithmetic against the real file size before any
 * pointer is formed, so a corrupt or hostile file yields KVQ_ERR_FORMAT, never
 * an out-of-bounds read (tests/fuzz/fuzz_safetensors.c exercises this).
 */
#include "kvq_safetensors.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvq_half.h"

struct kvq_st_file {
    const uint8_t *base;    /* file image */
    size_t size;
    int mapped;             /* 1: base is our mmap, unmap on close */
    cJSON *root;            /* parsed header; tensor names point into it */
    const cJSON *metadata;  /* "__metadata__" or NULL */
    struct kvq_st_tensor *tensors; /* sorted by data offset */
    size_t n;
    const struct kvq_st_tensor **by_name; /* the same tensors, sorted by name */
};

static const struct {
    const char *name;
    size_t size;
} dtype_info[KVQ_ST_DTYPE_COUNT] = {
    [KVQ_ST_F32] = {"F32", 4}, [KVQ_ST_F16] = {"F16", 2}, [KVQ_ST_BF16] = {"BF16", 2},
    [KVQ_ST_F64] = {"F64", 8}, [KVQ_ST_I8] = {"I8", 1},   [KVQ_ST_U8] = {"U8", 1},
    [KVQ_ST_I16] = {"I16", 2}, [KVQ_ST_I32] = {"I32", 4}, [KVQ_ST_I64] = {"I64", 8},
    [KVQ_ST_BOOL] = {"BOOL", 1},
};

const char *kvq_st_dtype_name(enum kvq_st_dtype t)
{
    return (unsigned)t < KVQ_ST_DTYPE_COUNT ? dtype_info[t].name : "?";
}

size_t kvq_st_dtype_size(enum kvq_st_dtype t)
{
    return (unsigned)t < KVQ_ST_DTYPE_COUNT ? dtype_info[t].size : 0;
}

kvq_status kvq_st_dtype_from_name(const char *name, enum kvq_st_dtype *out)
{
    if (!name)
        return KVQ_ERR_UNSUPPORTED;
    for (int i = 0; i < KVQ_ST_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_info[i].name) == 0) {
            *out = (enum kvq_st_dtype)i;
            return KVQ_OK;
        }
    }
    return KVQ_ERR_UNSUPPORTED;
}

/* JSON numbers are doubles: accept only exact non-negative integers that a
 * double represents exactly (<= 2^53). @return 0 or -1. */
static int json_uint(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j))
        return -1;
    double v = j->valuedouble;
    if (!(v >= 0.0) || v > 9007199254740992.0 || floor(v) != v)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static int cmp_offset(const void *a, const void *b)
{
    const struct kvq_st_tensor *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static int cmp_name(const void *a, const void *b)
{
    const struct kvq_st_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* Parses one tensor entry; data_size bounds the offsets. */
static kvq_status parse_entry(const cJSON *e, size_t data_size, struct kvq_st_tensor *t, const char *what,
                              kvq_error *err)
{
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: entry '%s' is not an object", what, name);
    if (!name[0])
        return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: tensor with an empty name", what);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt))
        return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: tensor '%s' has no dtype string", what, name);
    if (kvq_st_dtype_from_name(dt->valuestring, &t->dtype) != KVQ_OK)
        return kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "%s: tensor '%s' has unsupported dtype '%s'", what, name,
                             dt->valuestring);
    if (!cJSON_IsArray(sh))
        return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: tensor '%s' has no shape array", what, name);
    int nd = cJSON_GetArraySize(sh);
    if (nd > KVQ_ST_MAX_DIMS)
        return kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "%s: tensor '%s' has %d dimensions (at most %d supported)",
                             what, name, nd, KVQ_ST_MAX_DIMS);
    t->name = name;
    t->n_dims = nd;
    size_t count = 1;
    int i = 0;
    int overflow = 0;
    for (const cJSON *d = sh->child; d; d = d->next, i++) {
        uint64_t v;
        if (json_uint(d, &v) != 0)
            return kvq_error_set(err, KVQ_ERR_FORMAT,
                                 "%s: tensor '%s' dimension %d is not a non-negative integer", what, name, i);
        t->shape[i] = (int64_t)v;
        if (v != 0 && count > SIZE_MAX / v)
            overflow = 1; /* keep scanning: a later 0 makes the product 0 */
        else
            count *= (size_t)v;
    }
    for (; i < KVQ_ST_MAX_DIMS; i++)
        t->shape[i] = 0;
    int has_zero = 0;
    for (i = 0; i < nd; i++)
        has_zero |= t->shape[i] == 0;
    if (has_zero)
        count = 0;
    else if (overflow)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: tensor '%s' shape is too large", what, name);
    size_t es = dtype_info[t->dtype].size;
    if (count > SIZE_MAX / es)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: tensor '%s' shape is too large", what, name);
    t->n_elements = count;
    t->nbytes = count * es;

    uint64_t b, en;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || json_uint(off->child, &b) != 0 ||
        json_uint(off->child->next, &en) != 0)
        return kvq_error_set(err, KVQ_ERR_FORMAT,
                             "%s: tensor '%s' data_offsets is not a pair of non-negative integers", what, name);
    if (b > en)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: tensor '%s' data_offsets [%llu, %llu] are reversed", what,
                             name, (unsigned long long)b, (unsigned long long)en);
    if (en > data_size)
        return kvq_error_set(err, KVQ_ERR_FORMAT,
                             "%s: tensor '%s' data_offsets end %llu beyond the data (%zu bytes): file truncated?",
                             what, name, (unsigned long long)en, data_size);
    if (en - b != t->nbytes)
        return kvq_error_set(err, KVQ_ERR_FORMAT,
                             "%s: tensor '%s' has %llu data bytes but dtype %s and its shape need %zu", what, name,
                             (unsigned long long)(en - b), dt->valuestring, t->nbytes);
    t->offset = (size_t)b;
    return KVQ_OK;
}

static kvq_status parse(struct kvq_st_file *f, const char *what, kvq_error *err)
{
    if (f->size < 8)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: %zu bytes, too short for the 8-byte header length", what,
                             f->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | f->base[i];
    if (hlen < 2)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: header length %llu is too small", what,
                             (unsigned long long)hlen);
    if (hlen > KVQ_ST_MAX_HEADER)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: header length %llu exceeds the %u-byte limit", what,
                             (unsigned long long)hlen, KVQ_ST_MAX_HEADER);
    if (hlen > f->size - 8)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)",
                             what, (unsigned long long)hlen, f->size);
    const char *hdr = (const char *)f->base + 8;
    if (hdr[0] != '{')
        return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: header does not start with '{'", what);
    const char *end = NULL;
    f->root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &end, 0);
    if (!f->root || !cJSON_IsObject(f->root))
        return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: header is not a valid JSON object (near byte %zu)", what,
                             (size_t)((end ? end : cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() : hdr) - hdr) + 8);
    /* Writers pad the header with spaces; anything else after the JSON is corruption. */
    for (const char *p = end; p < hdr + hlen; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: unexpected bytes after the header JSON", what);

    size_t data_size = f->size - 8 - (size_t)hlen;
    size_t n = 0;
    for (const cJSON *e = f->root->child; e; e = e->next)
        n += strcmp(e->string, "__metadata__") != 0;
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    f->by_name = calloc(n ? n : 1, sizeof *f->by_name);
    if (!f->tensors || !f->by_name)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "%s: out of memory for %zu tensors", what, n);
    for (const cJSON *e = f->root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(e))
                return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: __metadata__ is not an object", what);
            f->metadata = e;
            continue;
        }
        kvq_status st = parse_entry(e, data_size, &f->tensors[f->n], what, err);
        if (st != KVQ_OK)
            return st;
        f->tensors[f->n].data = f->base + 8 + hlen + f->tensors[f->n].offset;
        f->n++;
    }

    /* The tensors must tile the data buffer exactly: no overlap, no hole. */
    qsort(f->tensors, f->n, sizeof *f->tensors, cmp_offset);
    size_t cursor = 0;
    for (size_t i = 0; i < f->n; i++) {
        const struct kvq_st_tensor *t = &f->tensors[i];
        if (t->offset < cursor)
            return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: tensor '%s' overlaps the tensor before it", what, t->name);
        if (t->offset > cursor)
            return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: %zu unused bytes before tensor '%s'", what,
                                 t->offset - cursor, t->name);
        cursor = t->offset + t->nbytes;
    }
    if (cursor != data_size)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: %zu bytes after the last tensor are not described", what,
                             data_size - cursor);

    for (size_t i = 0; i < f->n; i++)
        f->by_name[i] = &f->tensors[i];
    qsort(f->by_name, f->n, sizeof *f->by_name, cmp_name);
    for (size_t i = 1; i < f->n; i++)
        if (strcmp(f->by_name[i]->name, f->by_name[i - 1]->name) == 0)
            return kvq_error_set(err, KVQ_ERR_FORMAT, "%s: tensor '%s' appears twice", what, f->by_name[i]->name);
    return KVQ_OK;
}

static kvq_status finish_open(struct kvq_st_file *f, const char *what, kvq_st_file **out, kvq_error *err)
{
    kvq_status st = parse(f, what, err);
    if (st != KVQ_OK) {
        kvq_st_close(f);
        return st;
    }
    *out = f;
    return KVQ_OK;
}

kvq_status kvq_st_open_memory(const void *data, size_t size, kvq_st_file **out, kvq_error *err)
{
    if (!out || (!data && size))
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_st_open_memory: NULL argument");
    struct kvq_st_file *f = calloc(1, sizeof *f);
    if (!f)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    f->base = data;
    f->size = size;
    return finish_open(f, "<memory>", out, err);
}

kvq_status kvq_st_open(const char *path, kvq_st_file **out, kvq_error *err)
{
    if (!path || !out)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_st_open: NULL argument");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kvq_error_set(err, KVQ_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return kvq_error_set(err, KVQ_ERR_IO, "%s: not a regular file", path);
    }
    struct kvq_st_file *f = calloc(1, sizeof *f);
    if (!f) {
        close(fd);
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    }
    f->size = (size_t)sb.st_size;
    if (f->size > 0) {
        void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            free(f);
            return kvq_error_set(err, KVQ_ERR_IO, "%s: cannot map %zu bytes: %s", path, (size_t)sb.st_size, strerror(e));
        }
        f->base = p;
        f->mapped = 1;
    }
    close(fd); /* the mapping keeps the file alive */
    return finish_open(f, path, out, err);
}

void kvq_st_close(kvq_st_file *f)
{
    if (!f)
        return;
    if (f->mapped)
        munmap((void *)f->base, f->size);
    cJSON_Delete(f->root);
    free(f->tensors);
    free(f->by_name);
    free(f);
}

size_t kvq_st_count(const kvq_st_file *f)
{
    return f ? f->n : 0;
}

const struct kvq_st_tensor *kvq_st_tensor_at(const kvq_st_file *f, size_t i)
{
    return f && i < f->n ? &f->tensors[i] : NULL;
}

const struct kvq_st_tensor *kvq_st_find(const kvq_st_file *f, const char *name)
{
    if (!f || !name)
        return NULL;
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const struct kvq_st_tensor *t = f->by_name[mid];
        int c = strcmp(name, t->name);
        if (c == 0)
            return t;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

size_t kvq_st_file_size(const kvq_st_file *f)
{
    return f ? f->size : 0;
}

const void *kvq_st_file_data(const kvq_st_file *f)
{
    return f ? f->base : NULL;
}

const char *kvq_st_metadata(const kvq_st_file *f, const char *key)
{
    if (!f || !f->metadata || !key)
        return NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(f->metadata, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Element i of t as a double. Data may be unaligned inside the file, hence memcpy. */
static double elem_f64(const struct kvq_st_tensor *t, size_t i)
{
    const uint8_t *p = (const uint8_t *)t->data + i * dtype_info[t->dtype].size;
    switch (t->dtype) {
    case KVQ_ST_F32: { float v; memcpy(&v, p, 4); return v; }
    case KVQ_ST_F16: { uint16_t h; memcpy(&h, p, 2); return kvq_f16_to_f32(h); }
    case KVQ_ST_BF16: { uint16_t h; memcpy(&h, p, 2); return kvq_bits_f32((uint32_t)h << 16); }
    case KVQ_ST_F64: { double v; memcpy(&v, p, 8); return v; }
    case KVQ_ST_I8: return (int8_t)p[0];
    case KVQ_ST_U8: return p[0];
    case KVQ_ST_BOOL: return p[0] != 0;
    case KVQ_ST_I16: { int16_t v; memcpy(&v, p, 2); return v; }
    case KVQ_ST_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case KVQ_ST_I64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
    case KVQ_ST_DTYPE_COUNT: break;
    }
    return 0.0;
}

kvq_status kvq_st_to_f32_range(const struct kvq_st_tensor *t, size_t first, size_t n, float *out)
{
    if (!t || (!out && n) || first > t->n_elements || n > t->n_elements - first)
        return KVQ_ERR_INVALID_ARG;
    const uint8_t *p = t->data;
    /* The two formats checkpoints use get straight loops; the rest go element-wise. */
    if (t->dtype == KVQ_ST_F32) {
        memcpy(out, p + 4 * first, 4 * n);
    } else if (t->dtype == KVQ_ST_BF16) {
        p += 2 * first;
        for (size_t i = 0; i < n; i++)
            out[i] = kvq_bits_f32((uint32_t)(p[2 * i] | (p[2 * i + 1] << 8)) << 16);
    } else if (t->dtype == KVQ_ST_F16) {
        p += 2 * first;
        for (size_t i = 0; i < n; i++)
            out[i] = kvq_f16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
    } else {
        for (size_t i = 0; i < n; i++)
            out[i] = (float)elem_f64(t, first + i);
    }
    return KVQ_OK;
}

kvq_status kvq_st_to_f32(const struct kvq_st_tensor *t, float *out, size_t n)
{
    if (!t || n != t->n_elements)
        return KVQ_ERR_INVALID_ARG;
    return kvq_st_to_f32_range(t, 0, n, out);
}

kvq_status kvq_st_to_i64(const struct kvq_st_tensor *t, int64_t *out, size_t n)
{
    if (!t || n != t->n_elements || (!out && n))
        return KVQ_ERR_INVALID_ARG;
    if (t->dtype == KVQ_ST_F32 || t->dtype == KVQ_ST_F16 || t->dtype == KVQ_ST_BF16 || t->dtype == KVQ_ST_F64)
        return KVQ_ERR_INVALID_ARG;
    for (size_t i = 0; i < n; i++) {
        if (t->dtype == KVQ_ST_I64)
            memcpy(&out[i], (const uint8_t *)t->data + 8 * i, 8);
        else
            out[i] = (int64_t)elem_f64(t, i);
    }
    return KVQ_OK;
}

kvq_status kvq_st_expect(const struct kvq_st_tensor *t, enum kvq_st_dtype dtype, int n_dims, const int64_t *shape,
                         kvq_error *err)
{
    if (!t)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_st_expect: NULL tensor");
    if (dtype != KVQ_ST_DTYPE_COUNT && t->dtype != dtype)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "tensor '%s' has dtype %s, expected %s", t->name,
                             kvq_st_dtype_name(t->dtype), kvq_st_dtype_name(dtype));
    int same = t->n_dims == n_dims;
    for (int i = 0; same && i < n_dims; i++)
        same = t->shape[i] == shape[i];
    if (!same) {
        char got[128], want[128];
        size_t a = 0, b = 0;
        got[0] = want[0] = 0;
        for (int i = 0; i < t->n_dims && a < sizeof got; i++)
            a += (size_t)snprintf(got + a, sizeof got - a, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        for (int i = 0; i < n_dims && b < sizeof want; i++)
            b += (size_t)snprintf(want + b, sizeof want - b, "%s%lld", i ? ", " : "", (long long)shape[i]);
        return kvq_error_set(err, KVQ_ERR_FORMAT, "tensor '%s' has shape [%s], expected [%s]", t->name, got, want);
    }
    return KVQ_OK;
}
