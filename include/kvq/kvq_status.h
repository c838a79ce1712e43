/* kvq_status.h - status codes shared by every kvq module.
 *
 * Library code never prints and never exits: every fallible call returns an
 * enum kvq_status. Parsers of untrusted input also fill an optional
 * struct kvq_error with one human-readable line saying what was wrong.
 *
 * The numeric values are pinned: they appear in tools' exit paths and in
 * bindings, so new codes are only ever appended.
 */
#ifndef KVQ_STATUS_H
#define KVQ_STATUS_H

#include "kvq_export.h"

#ifdef __cplusplus
extern "C" {
#endif

enum kvq_status {
    KVQ_OK                = 0,
    KVQ_ERR_INVALID_ARG   = 1,  /* NULL pointer, negative size, bad option value */
    KVQ_ERR_UNSUPPORTED   = 2,  /* dimension, bit width or type combination not supported */
    KVQ_ERR_NONFINITE     = 3,  /* NaN or Inf in an input vector */
    KVQ_ERR_RANGE         = 4,  /* value outside what the format can hold (f16 norm overflow, token id) */
    KVQ_ERR_NOMEM         = 5,  /* allocation failed */
    KVQ_ERR_CONTEXT_FULL  = 6,  /* appending would exceed the cache's max_tokens */
    KVQ_ERR_BUDGET        = 7,  /* appending would exceed the cache's memory budget */
    KVQ_ERR_IO            = 8,  /* file could not be opened, read, mapped or written */
    KVQ_ERR_FORMAT        = 9,  /* truncated or corrupt file, JSON or manifest */
    KVQ_ERR_NOT_CONVERGED = 10, /* an iterative computation missed its tolerance */
    KVQ_ERR_NO_DEVICE     = 11, /* no usable CUDA device */
    KVQ_ERR_DEVICE        = 12, /* a CUDA call failed */
    KVQ_ERR_INTERNAL      = 13, /* a bug in kvq: please report */
    KVQ_STATUS_COUNT
};
typedef enum kvq_status kvq_status;

/** @return a static, lowercase description of s ("invalid argument", ...);
 *  never NULL, also for out-of-range values. */
KVQ_API const char *kvq_status_str(kvq_status s);

/* Optional detail for callers that want more than the code. msg is always a
 * NUL-terminated single line (no trailing newline). */
#define KVQ_ERROR_MSG_MAX 256
typedef struct kvq_error {
    kvq_status status;
    char msg[KVQ_ERROR_MSG_MAX];
} kvq_error;

/** Fills err (if not NULL) with status and a printf-style message.
 *  @return status, so that `return kvq_error_set(err, KVQ_ERR_FORMAT, ...)` reads well. */
KVQ_API kvq_status kvq_error_set(kvq_error *err, kvq_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif /* KVQ_STATUS_H */
