/* fuzz_safetensors.c - libFuzzer target for the safetensors header parser.
 * Any byte string must either be refused with a status or yield tensors
 * whose every byte can be read (ASan checks the bounds). */
#include <stdint.h>
#include <stdlib.h>

#include "kvq_safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvq_st_file *f = NULL;
    if (kvq_st_open_memory(data, size, &f, NULL) != KVQ_OK)
        return 0;
    float buf[256];
    for (size_t i = 0; i < kvq_st_count(f); i++) {
        const struct kvq_st_tensor *t = kvq_st_tensor_at(f, i);
        /* Read the first and last elements of every tensor. */
        size_t n = t->n_elements < 256 ? t->n_elements : 256;
        kvq_st_to_f32_range(t, 0, n, buf);
        kvq_st_to_f32_range(t, t->n_elements - n, n, buf);
        if (kvq_st_find(f, t->name) != t)
            abort();
    }
    kvq_st_metadata(f, "format");
    kvq_st_close(f);
    return 0;
}
