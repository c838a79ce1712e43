/* fuzz_config.c - libFuzzer target for the Hugging Face config.json parser:
 * any bytes give a model config or a status, never a crash. */
#include <stdint.h>
#include <stdlib.h>

#include "kvq_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvq_model_config c;
    kvq_error err;
    kvq_model_config_parse((const char *)data, size, &c, &err);
    return 0;
}
