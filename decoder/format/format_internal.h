/* format_internal.h - what the file writers of decoder/format share. */
#ifndef KVQ_FORMAT_INTERNAL_H
#define KVQ_FORMAT_INTERNAL_H

#include <stddef.h>
#include <sys/types.h>

#include "kvq_safetensors.h"
#include "kvq_status.h"

/* The process umask, read from /proc without changing it (umask(2) would
 * race with other threads creating files); 022 where /proc does not say. */
mode_t kvq_umask_now(void);

/* model.safetensors.index.json's weight_map (weight_files.c): tensor name ->
 * file, sorted by name; names point into root. */
struct kvq_index_entry {
    const char *name;
    int file; /* index into files */
};
struct kvq_index {
    void *root;           /* the parsed JSON (cJSON *) */
    const char **files;   /* distinct file names, in order of first mention */
    int n_files;
    struct kvq_index_entry *e;
    size_t n;
};
/* Parses the index (path only names it in messages): a weight_map object of
 * plain file names, none empty, no tensor listed twice. */
kvq_status kvq_index_parse(const char *text, size_t len, const char *path, struct kvq_index *idx, kvq_error *err);
/* files[i] holds idx->files[i]: every tensor of every file is in the
 * weight_map under that file, and every entry's file holds its tensor. */
kvq_status kvq_index_check(const struct kvq_index *idx, kvq_st_file *const *files, const char *path, kvq_error *err);
void kvq_index_free(struct kvq_index *idx);

#endif
