/* cmd_types.c - `kvq types`: every cache type with its exact storage cost.
 *
 * The numbers come from the library's own accounting (kvq_type_row_bytes),
 * the same that sizes cache pages, so what this prints is what a cache holds. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvq_codec.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvq types [--dim D] [--json]\n\n"
               "Lists every cache type with its storage cost per token and head at head\n"
               "dimension D (default 128): bits per value, bytes per row, compression\n"
               "against f16, and K+V bytes when the type stores both K and V.\n\n"
               "  --dim D   head dimension, %d..%d\n"
               "  --json    print JSON instead of a table\n",
               8, KVQ_MAX_DIM);
}

/* Why (type, dim) is refused, or NULL when it is supported. */
static const char *unsupported_reason(enum kvq_type t, int dim)
{
    if (kvq_type_check_dim(t, dim) == KVQ_OK)
        return NULL;
    if (dim < 8 || dim > KVQ_MAX_DIM)
        return "dim outside 8..1024";
    const struct kvq_type_traits *tr = kvq_type_traits(t);
    if (tr->block_values > 1)
        return "needs dim % 32 == 0";
    return "needs dim % 8 == 0";
}

static int print_json(int dim)
{
    size_t f16 = kvq_type_row_bytes(KVQ_TYPE_F16, dim);
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    if (!root || !arr) {
        cJSON_Delete(root);
        cJSON_Delete(arr);
        return cli_status_error("types", KVQ_ERR_NOMEM, "building JSON");
    }
    cJSON_AddNumberToObject(root, "dim", dim);
    cJSON_AddItemToObject(root, "types", arr);
    for (int t = 0; t < KVQ_TYPE_COUNT; t++) {
        const struct kvq_type_traits *tr = kvq_type_traits((enum kvq_type)t);
        size_t bytes = kvq_type_row_bytes((enum kvq_type)t, dim);
        const char *why = unsupported_reason((enum kvq_type)t, dim);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, o);
        cJSON_AddStringToObject(o, "name", tr->name);
        cJSON_AddNumberToObject(o, "id", t);
        cJSON_AddBoolToObject(o, "supported", why == NULL);
        if (why) {
            cJSON_AddStringToObject(o, "note", why);
        } else {
            cJSON_AddNumberToObject(o, "bits_per_value", kvq_type_bits_per_value((enum kvq_type)t, dim));
            cJSON_AddNumberToObject(o, "row_bytes", (double)bytes);
            cJSON_AddNumberToObject(o, "kv_bytes", 2.0 * (double)bytes);
            cJSON_AddNumberToObject(o, "compression_vs_f16", f16 ? (double)f16 / (double)bytes : 0.0);
        }
        cJSON_AddStringToObject(o, "summary", tr->summary);
    }
    size_t k = kvq_type_row_bytes(KVQ_DEFAULT_TYPE_K, dim), v = kvq_type_row_bytes(KVQ_DEFAULT_TYPE_V, dim);
    cJSON *pair = cJSON_AddObjectToObject(root, "default_pair");
    cJSON_AddStringToObject(pair, "k", kvq_type_traits(KVQ_DEFAULT_TYPE_K)->name);
    cJSON_AddStringToObject(pair, "v", kvq_type_traits(KVQ_DEFAULT_TYPE_V)->name);
    cJSON_AddBoolToObject(pair, "supported", k && v);
    if (k && v) {
        cJSON_AddNumberToObject(pair, "kv_bytes", (double)(k + v));
        cJSON_AddNumberToObject(pair, "compression_vs_f16", 2.0 * (double)f16 / (double)(k + v));
    }
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    if (!s)
        return cli_status_error("types", KVQ_ERR_NOMEM, "printing JSON");
    printf("%s\n", s);
    cJSON_free(s);
    return 0;
}

static void print_table(int dim)
{
    size_t f16 = kvq_type_row_bytes(KVQ_TYPE_F16, dim);
    printf("cache types at head dim %d (bytes per token per head)\n\n", dim);
    printf("%-6s %10s %6s %8s %6s  %s\n", "type", "bits/value", "bytes", "vs f16", "K+V", "summary");
    for (int t = 0; t < KVQ_TYPE_COUNT; t++) {
        const struct kvq_type_traits *tr = kvq_type_traits((enum kvq_type)t);
        size_t bytes = kvq_type_row_bytes((enum kvq_type)t, dim);
        const char *why = unsupported_reason((enum kvq_type)t, dim);
        if (why) {
            printf("%-6s %10s %6s %8s %6s  unsupported at dim %d: %s\n", tr->name, "-", "-", "-", "-", dim, why);
            continue;
        }
        printf("%-6s %10.3f %6zu %7.2fx %6zu  %s\n", tr->name, kvq_type_bits_per_value((enum kvq_type)t, dim),
               bytes, (double)f16 / (double)bytes, 2 * bytes, tr->summary);
    }
    size_t k = kvq_type_row_bytes(KVQ_DEFAULT_TYPE_K, dim), v = kvq_type_row_bytes(KVQ_DEFAULT_TYPE_V, dim);
    const char *kn = kvq_type_traits(KVQ_DEFAULT_TYPE_K)->name, *vn = kvq_type_traits(KVQ_DEFAULT_TYPE_V)->name;
    if (k && v)
        printf("\ndefault pair: K %s + V %s = %zu bytes per token-head (f16 K+V: %zu, %.2fx smaller)\n", kn, vn,
               k + v, 2 * f16, 2.0 * (double)f16 / (double)(k + v));
    else
        printf("\ndefault pair: K %s + V %s is unsupported at dim %d\n", kn, vn, dim);
}

int cmd_types(int argc, char **argv)
{
    long dim = 128;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--dim") == 0) {
            if (i + 1 >= argc || cli_parse_int(argv[++i], 1, 1L << 20, &dim) != 0)
                return cli_error("types", "--dim needs a positive integer");
        } else {
            cli_error("types", "unknown option '%s'", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (json)
        return print_json((int)dim);
    print_table((int)dim);
    return 0;
}
