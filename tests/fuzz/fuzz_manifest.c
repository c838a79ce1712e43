/* fuzz_manifest.c - libFuzzer target for the runtime_meta.json parser and
 * its structural validation: any bytes give a manifest or a status, never a
 * crash, and validation of whatever parsed never reads out of bounds. */
#include <stdint.h>
#include <stdlib.h>

#include "kvq_manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvq_manifest m;
    kvq_error err;
    if (kvq_manifest_parse((const char *)data, size, &m, &err) != KVQ_OK)
        return 0;
    kvq_manifest_validate(&m, NULL, &err);
    kvq_manifest_clear(&m);
    return 0;
}
