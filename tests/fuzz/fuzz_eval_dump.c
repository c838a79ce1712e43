/* fuzz_eval_dump.c - libFuzzer target for the `kvq eval` dump loader
 * (kvq_eval_data_load: a safetensors file with q [L, H, Tq, d], k and v
 * [L, KVH, T, d] in F16/BF16/F32). The bytes go to a file of this process,
 * since the loader reads a path. Any file gives data or a status; loaded
 * data is read at both ends of every array (ASan checks the bounds). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kvq_eval.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[64];
    if (!path[0])
        snprintf(path, sizeof path, "/tmp/kvq-fuzz-eval-%d.safetensors", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        abort();
    struct kvq_eval_data d;
    kvq_error err;
    if (kvq_eval_data_load(path, &d, &err) == KVQ_OK) {
        size_t nq = (size_t)d.n_layers * (size_t)d.n_heads * d.n_queries * (size_t)d.head_dim;
        size_t nk = (size_t)d.n_layers * (size_t)d.n_kv_heads * d.n_tokens * (size_t)d.head_dim;
        volatile float sink = 0;
        if (nq)
            sink += d.q[0] + d.q[nq - 1];
        if (nk)
            sink += d.k[0] + d.k[nk - 1] + d.v[0] + d.v[nk - 1];
        (void)sink;
        kvq_eval_data_free(&d);
    }
    unlink(path);
    return 0;
}
