/* fuzz_index.c - libFuzzer target for model.safetensors.index.json: the
 * weight_map parser (kvq_index_parse) and its check against the files it
 * names (kvq_index_check). Two small in-memory safetensors files stand for
 * "a.safetensors" (tensors x, y) and "b.safetensors" (tensor z); an index
 * naming only those is checked against them. Any bytes give an index or a
 * status, never a crash or a read out of bounds; a check that passes means
 * every tensor of a and b is listed under its own file. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format_internal.h"
#include "kvq_safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A safetensors file of F32 scalars named by names (NULL-terminated). */
static size_t make_file(uint8_t *buf, const char *const *names)
{
    char header[256];
    size_t n = 0, h = 0;
    h += (size_t)snprintf(header + h, sizeof header - h, "{");
    for (; names[n]; n++)
        h += (size_t)snprintf(header + h, sizeof header - h, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[1],"
                              "\"data_offsets\":[%zu,%zu]}", n ? "," : "", names[n], 4 * n, 4 * n + 4);
    h += (size_t)snprintf(header + h, sizeof header - h, "}");
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, header, h);
    memset(buf + 8 + h, 0, 4 * n);
    return 8 + h + 4 * n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t a_bytes[512], b_bytes[512];
    static kvq_st_file *a, *b;
    if (!a) {
        static const char *const an[] = {"x", "y", NULL}, *const bn[] = {"z", NULL};
        size_t na = make_file(a_bytes, an), nb = make_file(b_bytes, bn);
        if (kvq_st_open_memory(a_bytes, na, &a, NULL) != KVQ_OK || kvq_st_open_memory(b_bytes, nb, &b, NULL) != KVQ_OK)
            abort();
    }
    struct kvq_index idx;
    kvq_error err;
    if (kvq_index_parse((const char *)data, size, "index.json", &idx, &err) != KVQ_OK)
        return 0;
    if (idx.n_files < 1 || idx.n == 0)
        abort(); /* parse promises a non-empty map */
    kvq_st_file *files[2];
    int known = idx.n_files <= 2;
    for (int f = 0; known && f < idx.n_files; f++) {
        if (strcmp(idx.files[f], "a.safetensors") == 0)
            files[f] = a;
        else if (strcmp(idx.files[f], "b.safetensors") == 0)
            files[f] = b;
        else
            known = 0;
    }
    if (known && kvq_index_check(&idx, files, "index.json", &err) == KVQ_OK) {
        /* passed: the map lists exactly the tensors of the files it names */
        size_t total = 0;
        for (int f = 0; f < idx.n_files; f++)
            total += kvq_st_count(files[f]);
        if (total != idx.n)
            abort();
    }
    kvq_index_free(&idx);
    return 0;
}
