/* status.c - kvq_status_str and the kvq_error helper. */
#include "kvq_status.h"

#include <stdarg.h>
#include <stdio.h>

const char *kvq_status_str(kvq_status s)
{
    switch (s) {
    case KVQ_OK:                return "ok";
    case KVQ_ERR_INVALID_ARG:   return "invalid argument";
    case KVQ_ERR_UNSUPPORTED:   return "unsupported";
    case KVQ_ERR_NONFINITE:     return "non-finite value (NaN or Inf) in input";
    case KVQ_ERR_RANGE:         return "value out of range";
    case KVQ_ERR_NOMEM:         return "out of memory";
    case KVQ_ERR_CONTEXT_FULL:  return "context full";
    case KVQ_ERR_BUDGET:        return "memory budget exhausted";
    case KVQ_ERR_IO:            return "i/o error";
    case KVQ_ERR_FORMAT:        return "corrupt or truncated input";
    case KVQ_ERR_NOT_CONVERGED: return "did not converge";
    case KVQ_ERR_NO_DEVICE:     return "no CUDA device";
    case KVQ_ERR_DEVICE:        return "CUDA error";
    case KVQ_ERR_INTERNAL:      return "internal error";
    case KVQ_STATUS_COUNT:      break;
    }
    return "unknown status";
}

kvq_status kvq_error_set(kvq_error *err, kvq_status status, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->status = status;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        for (char *p = err->msg; *p; p++)
            if (*p == '\n' || *p == '\r')
                *p = ' ';
    }
    return status;
}
