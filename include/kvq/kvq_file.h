/* kvq_file.h - output files that appear whole or not at all.
 *
 * Every file kvq writes (safetensors shards and dumps, runtime_meta.json, the
 * copies of config.json and tokenizer.json, kvq eval's CSV and JSON) goes
 * through kvq_out_file: the bytes go to a unique temporary file created with
 * mkstemp in the target's directory (so rename stays on one file system), are
 * fsync'ed, and the temporary is renamed over the target, then the directory
 * is fsync'ed. A crash, a full disk or a concurrent writer therefore leaves
 * either the old complete file or the new complete file, never a mix, and two
 * writers never share a temporary name. Error messages name the user's path
 * and carry the system's reason (strerror), never the temporary name.
 */
#ifndef KVQ_FILE_H
#define KVQ_FILE_H

#include "kvq_export.h"

#include <stdio.h>

#include "kvq_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvq_out_file kvq_out_file;

/** Creates the temporary file beside path (".NAME.XXXXXX", mode 0644).
 *  @return KVQ_OK and *out; KVQ_ERR_IO (directory missing, not writable,
 *  path is a directory: the message says which, with strerror);
 *  KVQ_ERR_INVALID_ARG; KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_out_file_create(const char *path, kvq_out_file **out, kvq_error *err);

/** The stream to write to (binary). Do not fclose it. */
KVQ_API FILE *kvq_out_file_stream(kvq_out_file *f);

/** The temporary's path, for a program that writes the file itself (gnuplot
 *  opens it by name; commit then renames it into place). */
KVQ_API const char *kvq_out_file_temp_path(const kvq_out_file *f);

/** Flushes, fsyncs and closes the stream, renames the temporary over the
 *  target and fsyncs the directory; any write error since create (full
 *  disk, I/O error) fails here with its reason and removes the temporary.
 *  f is freed in every case. @return KVQ_OK or KVQ_ERR_IO. */
KVQ_API kvq_status kvq_out_file_commit(kvq_out_file *f, kvq_error *err);

/** Abandons the write: closes and removes the temporary; the target is
 *  untouched. Accepts NULL. */
KVQ_API void kvq_out_file_free(kvq_out_file *f);

/** Checks, before any work, that path can be written: its directory exists
 *  and accepts a new file (tried with a temporary that is removed at once)
 *  and path is not a directory. @return KVQ_OK or KVQ_ERR_IO (reason in err). */
KVQ_API kvq_status kvq_out_path_check(const char *path, kvq_error *err);

/** Writes len bytes to path through a kvq_out_file. @return KVQ_OK or KVQ_ERR_IO. */
KVQ_API kvq_status kvq_write_file_atomic(const char *path, const void *data, size_t len, kvq_error *err);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_FILE_H */
