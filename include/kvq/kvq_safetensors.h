/* kvq_safetensors.h - read and write safetensors files.
 *
 * Format (https://huggingface.co/docs/safetensors): an 8-byte little-endian
 * header length N, N bytes of JSON mapping tensor names to
 *   {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}
 * (plus an optional "__metadata__" object of strings), then the data buffer.
 * Offsets are relative to the start of the data buffer; tensors are stored
 * row-major, little-endian, and together cover the buffer exactly (no holes,
 * no overlap), as the reference implementation requires.
 *
 * Reading: files are memory-mapped read-only, and tensor data pointers point
 * into the mapping, so opening a multi-gigabyte checkpoint costs only the
 * header parse. Every header field is validated against the file size before
 * any pointer is handed out; a bad file gives KVQ_ERR_FORMAT and one line in
 * kvq_error saying what is wrong.
 *
 * Writing: a writer collects (name, dtype, shape, data pointer) entries and
 * writes them in the order added; it borrows the data until
 * kvq_st_writer_write() returns.
 *
 * Threading: a kvq_st_file is immutable after open; any number of threads
 * may read it. A writer is used by one thread.
 */
#ifndef KVQ_SAFETENSORS_H
#define KVQ_SAFETENSORS_H

#include "kvq_export.h"

#include <stddef.h>
#include <stdint.h>

#include "kvq_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types; names as in the file ("F32", "BF16", ...). */
enum kvq_st_dtype {
    KVQ_ST_F32 = 0,
    KVQ_ST_F16,
    KVQ_ST_BF16,
    KVQ_ST_F64,
    KVQ_ST_I8,
    KVQ_ST_U8,
    KVQ_ST_I16,
    KVQ_ST_I32,
    KVQ_ST_I64,
    KVQ_ST_BOOL,
    KVQ_ST_DTYPE_COUNT
};

#define KVQ_ST_MAX_DIMS 8
/* Headers larger than this are refused (the reference reader's limit). */
#define KVQ_ST_MAX_HEADER (100u << 20)

/* One tensor as described by the header. name and data point into the
 * file object and live as long as it. */
struct kvq_st_tensor {
    const char *name;
    enum kvq_st_dtype dtype;
    int n_dims;                       /* 0 for a scalar */
    int64_t shape[KVQ_ST_MAX_DIMS];   /* shape[i] >= 0 */
    size_t n_elements;                /* product of shape (1 for a scalar) */
    size_t nbytes;                    /* n_elements * element size */
    size_t offset;                    /* of the data within the data buffer */
    const void *data;                 /* may be unaligned: see kvq_st_to_f32 */
};

typedef struct kvq_st_file kvq_st_file;

/** @return "F32", "BF16", ... or "?" for an invalid value. */
KVQ_API const char *kvq_st_dtype_name(enum kvq_st_dtype t);

/** @return bytes per element, 0 for an invalid value. */
KVQ_API size_t kvq_st_dtype_size(enum kvq_st_dtype t);

/** Parses a dtype name. @return KVQ_OK or KVQ_ERR_UNSUPPORTED. */
KVQ_API kvq_status kvq_st_dtype_from_name(const char *name, enum kvq_st_dtype *out);

/** Maps and parses the file at path.
 *  @return KVQ_OK and *out; KVQ_ERR_IO (cannot open or map);
 *  KVQ_ERR_FORMAT (truncated or invalid header); KVQ_ERR_UNSUPPORTED (an
 *  unknown dtype); KVQ_ERR_NOMEM. err (optional) gets one line naming the
 *  file and the problem. */
KVQ_API kvq_status kvq_st_open(const char *path, kvq_st_file **out, kvq_error *err);

/** Parses a safetensors image already in memory (size bytes at data). The
 *  memory is borrowed: it must outlive the returned object. Same checks and
 *  errors as kvq_st_open. */
KVQ_API kvq_status kvq_st_open_memory(const void *data, size_t size, kvq_st_file **out, kvq_error *err);

/** Unmaps and frees f; accepts NULL. */
KVQ_API void kvq_st_close(kvq_st_file *f);

/** Number of tensors (the "__metadata__" entry is not a tensor). */
KVQ_API size_t kvq_st_count(const kvq_st_file *f);

/** Tensor i in data-offset order. @return NULL when i >= count. */
KVQ_API const struct kvq_st_tensor *kvq_st_tensor_at(const kvq_st_file *f, size_t i);

/** @return the tensor called name, or NULL when there is none. */
KVQ_API const struct kvq_st_tensor *kvq_st_find(const kvq_st_file *f, const char *name);

/** Total size of the file (or memory image) in bytes. */
KVQ_API size_t kvq_st_file_size(const kvq_st_file *f);

/** The whole file image (for checksums). */
KVQ_API const void *kvq_st_file_data(const kvq_st_file *f);

/** Value of key in "__metadata__", or NULL. */
KVQ_API const char *kvq_st_metadata(const kvq_st_file *f, const char *key);

/** Converts n = t->n_elements values of a float tensor (F32, F16, BF16, F64)
 *  or an integer tensor (I8..I64, U8, BOOL) to float32 in out[n]. bf16 and
 *  f16 convert exactly; integers beyond 2^24 round.
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (n != n_elements, NULL). */
KVQ_API kvq_status kvq_st_to_f32(const struct kvq_st_tensor *t, float *out, size_t n);

/** Converts elements [first, first + n) (row slices, embedding lookups).
 *  @return KVQ_OK or KVQ_ERR_INVALID_ARG (range beyond the tensor). */
KVQ_API kvq_status kvq_st_to_f32_range(const struct kvq_st_tensor *t, size_t first, size_t n, float *out);

/** Converts an integer tensor (I8..I64, U8, BOOL) to int64 out[n].
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (n mismatch or a float dtype). */
KVQ_API kvq_status kvq_st_to_i64(const struct kvq_st_tensor *t, int64_t *out, size_t n);

/** Checks dtype and shape of t against expectations, for loaders;
 *  dtype KVQ_ST_DTYPE_COUNT accepts any dtype.
 *  @return KVQ_OK; KVQ_ERR_FORMAT with a message naming the tensor. */
KVQ_API kvq_status kvq_st_expect(const struct kvq_st_tensor *t, enum kvq_st_dtype dtype, int n_dims, const int64_t *shape,
                         kvq_error *err);

/* ---- writer ---------------------------------------------------------- */

typedef struct kvq_st_writer kvq_st_writer;

/** @return KVQ_OK and *out, or KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_st_writer_create(kvq_st_writer **out);

/** Frees w (not the borrowed data); accepts NULL. */
KVQ_API void kvq_st_writer_free(kvq_st_writer *w);

/** Adds a tensor. name is copied; data (product(shape) * dtype size bytes) is
 *  borrowed until kvq_st_writer_write returns.
 *  @return KVQ_OK; KVQ_ERR_INVALID_ARG (duplicate or empty name, bad dtype,
 *  n_dims outside [0, KVQ_ST_MAX_DIMS], negative dim, NULL data with bytes);
 *  KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_st_writer_add(kvq_st_writer *w, const char *name, enum kvq_st_dtype dtype, int n_dims,
                             const int64_t *shape, const void *data);

/** Adds a string entry to "__metadata__" (key and value are copied).
 *  @return KVQ_OK, KVQ_ERR_INVALID_ARG or KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_st_writer_set_metadata(kvq_st_writer *w, const char *key, const char *value);

/** Writes the file: header padded with spaces to a multiple of 8 bytes (so
 *  that 4- and 8-byte tensors stay aligned when each tensor size keeps the
 *  running offset aligned), then the data in the order added. Writes to
 *  path.tmp and renames, so a failed write never leaves a truncated file.
 *  @return KVQ_OK; KVQ_ERR_IO; KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_st_writer_write(const kvq_st_writer *w, const char *path, kvq_error *err);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_SAFETENSORS_H */
