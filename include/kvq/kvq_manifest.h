/* kvq_manifest.h - runtime_meta.json: the manifest of a sharded model directory.
 *
 * `kvq shard` splits a Hugging Face checkpoint into safetensors shards that a
 * runtime can map independently:
 *   embed     the embedding table alone (host-side lookups),
 *   layers    a group of consecutive transformer layers [begin, end); the
 *             group that ends at n_layers also holds the final norm,
 *   lm_head   a vocabulary slice [begin, end) of the LM head, as a tensor
 *             "lm_head.weight" of shape [end - begin][hidden].
 * Tensors keep their Hugging Face names and dtypes. runtime_meta.json records
 * the format version, the model dimensions, the storage dtype and, per shard,
 * its kind, file, range, byte size and FNV-1a 64 checksum:
 *
 *   {"format": "kvq-runtime", "format_version": 1,
 *    "config": "config.json", "tokenizer": "tokenizer.json", "dtype": "BF16",
 *    "dims": {"hidden": 512, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2,
 *             "head_dim": 128, "ffn": 1024, "vocab": 4096, "max_context": 4096},
 *    "shards": [{"kind": "embed", "file": "embed.safetensors", "bytes": N, "fnv1a64": "0123..."},
 *               {"kind": "layers", "file": "layers-000-001.safetensors", "layers": [0, 2], ...},
 *               {"kind": "lm_head", "file": "lm_head-0.safetensors", "vocab": [0, 2048], ...}]}
 *
 * Validation (kvq_manifest_validate, kvq_manifest_check_files) runs before
 * any weight is read and gives one distinct message per violation.
 */
#ifndef KVQ_MANIFEST_H
#define KVQ_MANIFEST_H

#include "kvq_export.h"

#include <stddef.h>
#include <stdint.h>

#include "kvq_model.h"
#include "kvq_safetensors.h"
#include "kvq_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_MANIFEST_FILE "runtime_meta.json"
#define KVQ_MANIFEST_FORMAT "kvq-runtime"
#define KVQ_MANIFEST_VERSION 1
#define KVQ_MANIFEST_MAX_SHARDS 65536
#define KVQ_MANIFEST_NAME_MAX 128

enum kvq_shard_kind { KVQ_SHARD_EMBED = 0, KVQ_SHARD_LAYERS = 1, KVQ_SHARD_LM_HEAD = 2 };

struct kvq_shard {
    enum kvq_shard_kind kind;
    char file[KVQ_MANIFEST_NAME_MAX]; /* plain file name inside the directory (no '/') */
    int begin, end;                   /* layers or vocab rows [begin, end); 0, 0 for embed */
    uint64_t bytes;                   /* file size */
    uint64_t fnv1a64;                 /* FNV-1a 64 of the whole file */
};

struct kvq_manifest {
    int format_version;
    char config[KVQ_MANIFEST_NAME_MAX];    /* file names inside the directory */
    char tokenizer[KVQ_MANIFEST_NAME_MAX];
    enum kvq_st_dtype dtype;               /* storage dtype of the weights */
    int hidden, n_layers, n_heads, n_kv_heads, head_dim, ffn, vocab, max_ctx;
    struct kvq_shard *shards;              /* malloc'ed; kvq_manifest_clear frees */
    size_t n_shards;
};

/** FNV-1a 64 over data[0..n), continuing from h (start with KVQ_FNV1A64_INIT). */
#define KVQ_FNV1A64_INIT 0xcbf29ce484222325ull
KVQ_API uint64_t kvq_fnv1a64(const void *data, size_t n, uint64_t h);

/** Parses runtime_meta.json text (syntax and types only: see validate).
 *  @return KVQ_OK and *m (free with kvq_manifest_clear); KVQ_ERR_FORMAT;
 *  KVQ_ERR_UNSUPPORTED (format_version); KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_manifest_parse(const char *json, size_t len, struct kvq_manifest *m, kvq_error *err);

/** Frees the shard list; m is then empty. Accepts a zeroed manifest. */
KVQ_API void kvq_manifest_clear(struct kvq_manifest *m);

/** The structural rules, checked against the model config (cfg may be NULL
 *  to check only the manifest against its own dims): dims equal to the
 *  config's, exactly one embed shard, layer groups covering [0, n_layers)
 *  with no gap and no overlap, LM-head slices starting at 0, contiguous, and
 *  ending at vocab, non-empty ranges, distinct file names.
 *  @return KVQ_OK or KVQ_ERR_FORMAT with the first violation in err. */
KVQ_API kvq_status kvq_manifest_validate(const struct kvq_manifest *m, const struct kvq_model_config *cfg, kvq_error *err);

/** Checks that every shard file exists in dir with the declared size and,
 *  when verify_checksums, the declared checksum.
 *  @return KVQ_OK; KVQ_ERR_IO (missing file); KVQ_ERR_FORMAT (size or checksum). */
KVQ_API kvq_status kvq_manifest_check_files(const struct kvq_manifest *m, const char *dir, int verify_checksums,
                                    kvq_error *err);

/** Writes m as JSON to path. @return KVQ_OK, KVQ_ERR_IO or KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_manifest_write(const struct kvq_manifest *m, const char *path, kvq_error *err);

/** FNV-1a 64 and size of a file. @return KVQ_OK or KVQ_ERR_IO. */
KVQ_API kvq_status kvq_file_checksum(const char *path, uint64_t *fnv, uint64_t *bytes);

/* ---- writing a sharded directory ----------------------------------- */

struct kvq_shard_opts {
    double max_shard_mb;  /* layer groups up to this size (at least one layer each); 0 = 256 */
    int lm_head_shards;   /* vocabulary slices of the LM head; 0 = 1 */
    int force;            /* replace a non-empty out_dir (of plain files only) */
};

/* The grouping kvq_shard_write would choose: groups[i] = first layer of
 * group i; returns the number of groups (<= n_layers), or 0 on error.
 * layer_bytes[l] = stored bytes of layer l. */
KVQ_API int kvq_shard_plan_groups(const size_t *layer_bytes, int n_layers, double max_shard_mb, int *groups);

/** Reads src_dir/config.json into cfg and, when layer_bytes is not NULL,
 *  the bytes each layer's tensors occupy in the source files
 *  (layer_bytes[max_layers]).
 *  @return KVQ_OK; KVQ_ERR_IO / KVQ_ERR_FORMAT; KVQ_ERR_INVALID_ARG (too many layers). */
KVQ_API kvq_status kvq_shard_measure(const char *src_dir, struct kvq_model_config *cfg, size_t *layer_bytes, int max_layers,
                             kvq_error *err);

/** Splits the Hugging Face model in src_dir into out_dir: shards, a copy of
 *  config.json and tokenizer.json, and runtime_meta.json. out_dir must be
 *  absent or empty, or opts->force set (then it may hold only files, no
 *  subdirectory), and never src_dir itself. Everything is written into a
 *  temporary directory beside out_dir (".NAME.kvq-tmp-XXXXXX") that is
 *  renamed onto out_dir at the end (exchanged with it under force), so a
 *  crash or a concurrent writer leaves the old complete directory or the new
 *  complete one, never a mix; a killed run leaves only its temporary
 *  directory. Of two concurrent writers without force, the second to finish
 *  fails (out_dir filled meanwhile).
 *  @return KVQ_OK; KVQ_ERR_IO; KVQ_ERR_FORMAT (bad source model);
 *  KVQ_ERR_INVALID_ARG (lm_head_shards > vocab, out_dir not empty or the
 *  source); KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_shard_write(const char *src_dir, const char *out_dir, const struct kvq_shard_opts *opts,
                           kvq_error *err);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_MANIFEST_H */
