/* backend_cuda_stub.c - kvq_backend_cuda_create and _work_bytes in a build without CUDA or cuBLAS. */
#include "backend.h"

#ifndef KVQ_HAVE_CUBLAS
kvq_status kvq_backend_cuda_create(const struct kvq_model *m, size_t max_rows, unsigned flags, kvq_backend **out)
{
    (void)m;
    (void)max_rows;
    (void)flags;
    (void)out;
    return KVQ_ERR_NO_DEVICE;
}

size_t kvq_backend_cuda_work_bytes(const struct kvq_model *m, size_t max_rows)
{
    (void)m;
    (void)max_rows;
    return 0;
}
#else
typedef int kvq_backend_cuda_stub_unused; /* ISO C forbids an empty translation unit */
#endif
