/* shard_write.c - `kvq shard`: split a Hugging Face checkpoint into an
 * embedding file, layer-group shards and LM-head vocabulary slices, and
 * describe them in runtime_meta.json.
 *
 * Tensors are copied byte for byte from the mapped source (same names, same
 * dtype); an LM-head slice is a contiguous row range of lm_head.weight (or
 * of the embedding table when the model ties them), so no conversion happens
 * and a sharded model computes exactly what the original does.
 */
#define _GNU_SOURCE /* renameat2 (RENAME_EXCHANGE) */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "decoder_internal.h"
#include "format_internal.h"
#include "kvq_file.h"
#include "kvq_manifest.h"

/* Layer index of a "model.layers.N.xxx" name, or -1. */
static int layer_of(const char *name)
{
    static const char pre[] = "model.layers.";
    if (strncmp(name, pre, sizeof pre - 1) != 0)
        return -1;
    char *end;
    errno = 0;
    long l = strtol(name + sizeof pre - 1, &end, 10);
    if (errno || *end != '.' || l < 0 || l > (1 << 20))
        return -1;
    return (int)l;
}

int kvq_shard_plan_groups(const size_t *layer_bytes, int n_layers, double max_shard_mb, int *groups)
{
    if (!layer_bytes || !groups || n_layers <= 0)
        return 0;
    double limit = (max_shard_mb > 0 ? max_shard_mb : 256.0) * 1048576.0;
    int n = 0;
    double cur = 0;
    for (int l = 0; l < n_layers; l++) {
        /* A group closes when the next layer would push it over the limit;
         * a layer larger than the limit gets a group of its own. */
        if (l == 0 || cur + (double)layer_bytes[l] > limit) {
            groups[n++] = l;
            cur = 0;
        }
        cur += (double)layer_bytes[l];
    }
    return n;
}

/* Bytes each layer's tensors occupy in the source files. */
static void measure(const struct kvq_file_set *fs, int n_layers, size_t *bytes)
{
    memset(bytes, 0, (size_t)n_layers * sizeof *bytes);
    for (int f = 0; f < fs->n; f++)
        for (size_t i = 0; i < kvq_st_count(fs->files[f]); i++) {
            const struct kvq_st_tensor *t = kvq_st_tensor_at(fs->files[f], i);
            int l = layer_of(t->name);
            if (l >= 0 && l < n_layers)
                bytes[l] += t->nbytes;
        }
}

kvq_status kvq_shard_measure(const char *src_dir, struct kvq_model_config *cfg, size_t *layer_bytes, int max_layers,
                             kvq_error *err)
{
    char path[KVQ_PATH_MAX];
    if (kvq_path_join(path, sizeof path, src_dir, "config.json") != 0)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "%s: path too long", src_dir);
    kvq_status st = kvq_model_config_load(path, cfg, err);
    if (st != KVQ_OK)
        return st;
    if (!layer_bytes)
        return KVQ_OK;
    if (cfg->n_layers > max_layers)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "%d layers, room for %d", cfg->n_layers, max_layers);
    struct kvq_file_set fs = {0};
    st = kvq_files_open_hf(&fs, src_dir, err);
    if (st == KVQ_OK)
        measure(&fs, cfg->n_layers, layer_bytes);
    kvq_files_close(&fs);
    return st;
}

static kvq_status copy_file(const char *src_dir, const char *out_dir, const char *name, kvq_error *err)
{
    char src[KVQ_PATH_MAX], dst[KVQ_PATH_MAX];
    if (kvq_path_join(src, sizeof src, src_dir, name) != 0 || kvq_path_join(dst, sizeof dst, out_dir, name) != 0)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "path too long");
    size_t len;
    errno = 0;
    char *buf = kvq_read_text(src, 1u << 30, &len);
    if (!buf)
        return kvq_error_set(err, KVQ_ERR_IO, "%s: cannot read: %s", src, strerror(errno ? errno : EIO));
    kvq_status st = kvq_write_file_atomic(dst, buf, len, err);
    free(buf);
    return st;
}

/* Writes one shard file and records it (size and checksum) in the manifest. */
static kvq_status finish_shard(kvq_st_writer *w, const char *out_dir, struct kvq_shard *sh, kvq_error *err)
{
    char path[KVQ_PATH_MAX];
    if (kvq_path_join(path, sizeof path, out_dir, sh->file) != 0)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "%s: path too long", out_dir);
    kvq_status st = kvq_st_writer_write(w, path, err);
    if (st == KVQ_OK && kvq_file_checksum(path, &sh->fnv1a64, &sh->bytes) != KVQ_OK)
        st = kvq_error_set(err, KVQ_ERR_IO, "%s: cannot read back: %s", path, strerror(errno ? errno : EIO));
    return st;
}

static kvq_status add_tensor(kvq_st_writer *w, const struct kvq_st_tensor *t, const char *name, kvq_error *err)
{
    kvq_status st = kvq_st_writer_add(w, name, t->dtype, t->n_dims, t->shape, t->data);
    return st == KVQ_OK ? st : kvq_error_set(err, st, "cannot add tensor '%s'", name);
}

struct job {
    const char *out_dir;
    const struct kvq_model_config *cfg;
    const struct kvq_file_set *fs;
    struct kvq_manifest *man;
    kvq_error *err;
};

static struct kvq_shard *new_shard(struct job *J, enum kvq_shard_kind kind, int begin, int end)
{
    struct kvq_shard *sh = &J->man->shards[J->man->n_shards++];
    sh->kind = kind;
    sh->begin = begin;
    sh->end = end;
    return sh;
}

static kvq_status write_layers(struct job *J, int first, int end)
{
    struct kvq_shard *sh = new_shard(J, KVQ_SHARD_LAYERS, first, end);
    snprintf(sh->file, sizeof sh->file, "layers-%03d-%03d.safetensors", first, end - 1);
    kvq_st_writer *w;
    kvq_status st = kvq_st_writer_create(&w);
    if (st != KVQ_OK)
        return kvq_error_set(J->err, st, "out of memory");
    for (int f = 0; f < J->fs->n && st == KVQ_OK; f++)
        for (size_t i = 0; i < kvq_st_count(J->fs->files[f]) && st == KVQ_OK; i++) {
            const struct kvq_st_tensor *t = kvq_st_tensor_at(J->fs->files[f], i);
            int l = layer_of(t->name);
            if ((l >= first && l < end) || (end == J->cfg->n_layers && strcmp(t->name, "model.norm.weight") == 0))
                st = add_tensor(w, t, t->name, J->err);
        }
    if (st == KVQ_OK)
        st = finish_shard(w, J->out_dir, sh, J->err);
    kvq_st_writer_free(w);
    return st;
}

static kvq_status write_lm_slices(struct job *J, const struct kvq_st_tensor *head, int n_slices)
{
    int V = J->cfg->vocab;
    size_t row = (size_t)J->cfg->hidden * kvq_st_dtype_size(head->dtype);
    kvq_status st = KVQ_OK;
    for (int k = 0; k < n_slices && st == KVQ_OK; k++) {
        int b = (int)((int64_t)V * k / n_slices), e = (int)((int64_t)V * (k + 1) / n_slices);
        struct kvq_shard *sh = new_shard(J, KVQ_SHARD_LM_HEAD, b, e);
        snprintf(sh->file, sizeof sh->file, "lm_head-%06d-%06d.safetensors", b, e - 1);
        kvq_st_writer *w;
        if ((st = kvq_st_writer_create(&w)) != KVQ_OK)
            return kvq_error_set(J->err, st, "out of memory");
        int64_t shape[2] = {e - b, J->cfg->hidden};
        st = kvq_st_writer_add(w, "lm_head.weight", head->dtype, 2, shape, (const uint8_t *)head->data + row * (size_t)b);
        if (st == KVQ_OK)
            st = finish_shard(w, J->out_dir, sh, J->err);
        else
            kvq_error_set(J->err, st, "cannot add an LM-head slice");
        kvq_st_writer_free(w);
    }
    return st;
}

static kvq_status run(struct job *J, const char *src_dir, const struct kvq_shard_opts *o, size_t *layer_bytes,
                      int *groups)
{
    const struct kvq_model_config *c = J->cfg;
    struct kvq_manifest *man = J->man;
    const struct kvq_st_tensor *emb = kvq_files_find(J->fs, -1, "model.embed_tokens.weight", NULL);
    const struct kvq_st_tensor *head =
        c->arch.tied_embeddings ? emb : kvq_files_find(J->fs, -1, "lm_head.weight", NULL);
    int64_t shape[2] = {c->vocab, c->hidden};
    kvq_status st;
    if (!emb || !head)
        return kvq_error_set(J->err, KVQ_ERR_FORMAT, "%s: missing tensor '%s'", src_dir,
                             emb ? "lm_head.weight" : "model.embed_tokens.weight");
    if ((st = kvq_st_expect(emb, KVQ_ST_DTYPE_COUNT, 2, shape, J->err)) != KVQ_OK ||
        (st = kvq_st_expect(head, emb->dtype, 2, shape, J->err)) != KVQ_OK)
        return st;
    man->dtype = emb->dtype;
    for (int f = 0; f < J->fs->n; f++)
        for (size_t i = 0; i < kvq_st_count(J->fs->files[f]); i++) {
            const struct kvq_st_tensor *t = kvq_st_tensor_at(J->fs->files[f], i);
            if (t->dtype != man->dtype && (layer_of(t->name) >= 0 || strncmp(t->name, "model.norm", 10) == 0))
                return kvq_error_set(J->err, KVQ_ERR_UNSUPPORTED, "%s: tensor '%s' is %s, others %s (mixed dtypes)",
                                     src_dir, t->name, kvq_st_dtype_name(t->dtype), kvq_st_dtype_name(man->dtype));
        }

    struct kvq_shard *sh = new_shard(J, KVQ_SHARD_EMBED, 0, 0);
    strcpy(sh->file, "embed.safetensors");
    kvq_st_writer *w;
    if ((st = kvq_st_writer_create(&w)) != KVQ_OK)
        return kvq_error_set(J->err, st, "out of memory");
    st = add_tensor(w, emb, emb->name, J->err);
    if (st == KVQ_OK)
        st = finish_shard(w, J->out_dir, sh, J->err);
    kvq_st_writer_free(w);

    measure(J->fs, c->n_layers, layer_bytes);
    int n_groups = kvq_shard_plan_groups(layer_bytes, c->n_layers, o->max_shard_mb, groups);
    for (int g = 0; g < n_groups && st == KVQ_OK; g++)
        st = write_layers(J, groups[g], g + 1 < n_groups ? groups[g + 1] : c->n_layers);
    if (st == KVQ_OK)
        st = write_lm_slices(J, head, o->lm_head_shards > 0 ? o->lm_head_shards : 1);
    if (st == KVQ_OK)
        st = copy_file(src_dir, J->out_dir, "config.json", J->err);
    char tok[KVQ_PATH_MAX];
    if (st == KVQ_OK && kvq_path_join(tok, sizeof tok, src_dir, "tokenizer.json") == 0 && kvq_file_exists(tok))
        st = copy_file(src_dir, J->out_dir, "tokenizer.json", J->err);
    if (st == KVQ_OK)
        st = kvq_manifest_validate(man, c, J->err); /* what we write must load */
    char path[KVQ_PATH_MAX];
    if (st == KVQ_OK && kvq_path_join(path, sizeof path, J->out_dir, KVQ_MANIFEST_FILE) != 0)
        st = kvq_error_set(J->err, KVQ_ERR_INVALID_ARG, "%s: path too long", J->out_dir);
    if (st == KVQ_OK)
        st = kvq_manifest_write(man, path, J->err);
    return st;
}

/* Removes dir and the plain files in it (the temporaries and replaced
 * outputs this file creates hold nothing else). */
static void remove_flat_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[KVQ_PATH_MAX];
    while (d && (e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 &&
            kvq_path_join(path, sizeof path, dir, e->d_name) == 0)
            unlink(path);
    if (d)
        closedir(d);
    rmdir(dir);
}

/* Refuses an out_dir whose use would lose data: a non-directory, the source
 * itself, a non-empty directory without force, one holding a subdirectory
 * (force replaces only plain files). */
static kvq_status check_out(const char *src_dir, const char *out_dir, int force, kvq_error *err)
{
    struct stat so, ss;
    if (stat(out_dir, &so) != 0)
        return errno == ENOENT ? KVQ_OK : kvq_error_set(err, KVQ_ERR_IO, "%s: %s", out_dir, strerror(errno));
    if (!S_ISDIR(so.st_mode))
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "%s: exists and is not a directory", out_dir);
    if (stat(src_dir, &ss) == 0 && ss.st_dev == so.st_dev && ss.st_ino == so.st_ino)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "%s: is the source model directory; give another --out",
                             out_dir);
    DIR *d = opendir(out_dir);
    if (!d)
        return kvq_error_set(err, KVQ_ERR_IO, "%s: %s", out_dir, strerror(errno));
    kvq_status st = KVQ_OK;
    struct dirent *e;
    char path[KVQ_PATH_MAX];
    while (st == KVQ_OK && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        struct stat sb;
        if (!force)
            st = kvq_error_set(err, KVQ_ERR_INVALID_ARG, "%s: exists and is not empty (holds '%s'); --force replaces it",
                               out_dir, e->d_name);
        else if (kvq_path_join(path, sizeof path, out_dir, e->d_name) == 0 && lstat(path, &sb) == 0 &&
                 S_ISDIR(sb.st_mode))
            st = kvq_error_set(err, KVQ_ERR_INVALID_ARG,
                               "%s: holds the subdirectory '%s'; --force replaces only a directory of files", out_dir,
                               e->d_name);
    }
    closedir(d);
    return st;
}

/* out_dir without trailing slashes, and the temporary directory template
 * beside it: "PARENT/.NAME.kvq-tmp-XXXXXX". @return 0 or -1 (too long). */
static int temp_dir_name(const char *out_dir, char *out, char *tmpl, size_t cap)
{
    size_t n = strlen(out_dir);
    while (n > 1 && out_dir[n - 1] == '/')
        n--;
    if (n + 1 > cap)
        return -1;
    memcpy(out, out_dir, n);
    out[n] = 0;
    const char *slash = strrchr(out, '/');
    size_t dlen = slash ? (size_t)(slash - out) + 1 : 0;
    int w = snprintf(tmpl, cap, "%.*s.%s.kvq-tmp-XXXXXX", (int)dlen, out, out + dlen);
    return w > 0 && (size_t)w < cap ? 0 : -1;
}

/* Messages from the writers name files in the temporary directory; the
 * user knows only out_dir. */
static void untemp_message(kvq_error *err, const char *tmp, const char *out)
{
    char *at;
    if (!err || !(at = strstr(err->msg, tmp)))
        return;
    char msg[KVQ_ERROR_MSG_MAX];
    if (snprintf(msg, sizeof msg, "%.*s%s%s", (int)(at - err->msg), err->msg, out, at + strlen(tmp)) < 0)
        return;
    memcpy(err->msg, msg, sizeof msg);
}

static void sync_path(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* Moves the finished temporary directory onto out. */
static kvq_status publish(const char *tmp, const char *out, int force, kvq_error *err)
{
    if (rename(tmp, out) == 0) /* out absent or an empty directory */
        return KVQ_OK;
    int e = errno;
    if ((e == ENOTEMPTY || e == EEXIST) && !force)
        return kvq_error_set(err, KVQ_ERR_IO, "%s: another writer filled it meanwhile; nothing written (--force "
                             "replaces it)", out);
    if (e != ENOTEMPTY && e != EEXIST)
        return kvq_error_set(err, KVQ_ERR_IO, "%s: cannot move the output into place: %s", out, strerror(e));
    /* One atomic swap: readers see the old directory or the new one. */
#ifdef RENAME_EXCHANGE
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, out, RENAME_EXCHANGE) == 0) {
        remove_flat_dir(tmp); /* now the old output */
        return KVQ_OK;
    }
    if (errno != EINVAL && errno != ENOSYS)
        return kvq_error_set(err, KVQ_ERR_IO, "%s: cannot replace it: %s", out, strerror(errno));
#endif
    /* No exchange on this file system: move the old one aside first (a
     * moment without out_dir, but never a mixed one). */
    char old[KVQ_PATH_MAX];
    snprintf(old, sizeof old, "%s", tmp);
    memcpy(old + strlen(old) - 6, "XXXXXX", 6);
    if (!mkdtemp(old) || rename(out, old) != 0 || rename(tmp, out) != 0)
        return kvq_error_set(err, KVQ_ERR_IO, "%s: cannot replace it: %s", out, strerror(errno));
    remove_flat_dir(old);
    return KVQ_OK;
}

kvq_status kvq_shard_write(const char *src_dir, const char *out_dir, const struct kvq_shard_opts *opts,
                           kvq_error *err)
{
    if (!src_dir || !out_dir || !out_dir[0])
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_shard_write: NULL argument");
    struct kvq_shard_opts o = {0, 1, 0};
    if (opts)
        o = *opts;
    if (o.max_shard_mb < 0 || o.lm_head_shards < 0)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "negative --max-shard-mb or --lm-head-shards");
    struct kvq_model_config cfg;
    kvq_status st = kvq_shard_measure(src_dir, &cfg, NULL, 0, err);
    if (st != KVQ_OK)
        return st;
    if (o.lm_head_shards > cfg.vocab)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "%d LM-head shards for a vocabulary of %d", o.lm_head_shards,
                             cfg.vocab);
    char out[KVQ_PATH_MAX], tmp[KVQ_PATH_MAX];
    if (temp_dir_name(out_dir, out, tmp, sizeof tmp) != 0)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "%s: path too long", out_dir);
    if ((st = check_out(src_dir, out, o.force, err)) != KVQ_OK)
        return st;
    if (!mkdtemp(tmp))
        return kvq_error_set(err, KVQ_ERR_IO, "%s: cannot create the output directory beside it: %s", out,
                             strerror(errno));
    chmod(tmp, 0777 & ~kvq_umask_now()); /* mkdtemp makes 0700; the output is an ordinary directory */

    struct kvq_file_set fs = {0};
    struct kvq_manifest man;
    memset(&man, 0, sizeof man);
    int n_lm = o.lm_head_shards > 0 ? o.lm_head_shards : 1;
    man.shards = calloc((size_t)(1 + cfg.n_layers + n_lm), sizeof *man.shards);
    size_t *layer_bytes = calloc((size_t)cfg.n_layers, sizeof *layer_bytes);
    int *groups = calloc((size_t)cfg.n_layers, sizeof *groups);
    if (!man.shards || !layer_bytes || !groups) {
        st = kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
        goto out;
    }
    man.format_version = KVQ_MANIFEST_VERSION;
    strcpy(man.config, "config.json");
    strcpy(man.tokenizer, "tokenizer.json");
    man.hidden = cfg.hidden;
    man.n_layers = cfg.n_layers;
    man.n_heads = cfg.n_heads;
    man.n_kv_heads = cfg.n_kv_heads;
    man.head_dim = cfg.head_dim;
    man.ffn = cfg.ffn;
    man.vocab = cfg.vocab;
    man.max_ctx = cfg.max_ctx;
    if ((st = kvq_files_open_hf(&fs, src_dir, err)) != KVQ_OK)
        goto out;
    struct job J = {tmp, &cfg, &fs, &man, err};
    st = run(&J, src_dir, &o, layer_bytes, groups);
    if (st == KVQ_OK)
        st = publish(tmp, out, o.force, err);
    if (st == KVQ_OK) {
        char parent[KVQ_PATH_MAX + 4];
        if (snprintf(parent, sizeof parent, "%s/..", out) > 0)
            sync_path(parent); /* the rename itself survives a crash */
    }
out:
    if (st != KVQ_OK) {
        remove_flat_dir(tmp);
        untemp_message(err, tmp, out);
    }
    kvq_files_close(&fs);
    kvq_manifest_clear(&man);
    free(layer_bytes);
    free(groups);
    return st;
}
