/* fuzz_serve_request.c - libFuzzer target for kvq serve's request parser
 * (tools/serve_request.c): any body, for either endpoint, gives parsed
 * params or a 400 with a message, never a crash or a leak. */
#include <stdint.h>
#include <stdlib.h>

#include "serve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int chat = 0; chat < 2; chat++) {
        struct serve_params p;
        char err[256], param[64];
        if (serve_params_parse((const char *)data, size, chat, &p, err, sizeof err, param, sizeof param) == 0)
            serve_params_free(&p);
    }
    char *e = serve_error_json(400, (const char *)"x", "y", NULL);
    free(e);
    return 0;
}
