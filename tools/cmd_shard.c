/* cmd_shard.c - `kvq shard`: split a Hugging Face checkpoint into the sharded
 * runtime layout (see decoder/kvq_manifest.h), or with --plan show how it
 * would be split. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvq_manifest.h"

#define CMD "shard"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvq shard --model HF_DIR --out DIR [--force] [--max-shard-mb M] [--lm-head-shards N]\n"
               "       kvq shard --model HF_DIR --plan [--max-shard-mb M]\n\n"
               "Writes layer-group shards of at most M MiB (at least one layer each; default 256),\n"
               "N vocabulary slices of the LM head (default 1), the embedding table as its own\n"
               "file, config.json, tokenizer.json and runtime_meta.json (the manifest `kvq run`\n"
               "validates before loading). DIR must be absent or empty (--force replaces a\n"
               "directory of files) and not HF_DIR; the output is built beside DIR and moved\n"
               "onto it at the end, so an interrupted run leaves DIR as it was. --plan prints, per layer, the parameter count implied\n"
               "by config.json beside the bytes measured in the checkpoint, and the grouping.\n");
}

static int plan(const char *model, double max_mb)
{
    struct kvq_model_config cfg;
    kvq_error err = {0};
    if (kvq_shard_measure(model, &cfg, NULL, 0, &err) != KVQ_OK)
        return cli_error(CMD, "%s", err.msg);
    size_t *bytes = calloc((size_t)cfg.n_layers, sizeof *bytes);
    int *groups = calloc((size_t)cfg.n_layers, sizeof *groups);
    if (!bytes || !groups) {
        free(bytes);
        free(groups);
        return cli_status_error(CMD, KVQ_ERR_NOMEM, "plan");
    }
    int rc = 0;
    if (kvq_shard_measure(model, &cfg, bytes, cfg.n_layers, &err) != KVQ_OK) {
        rc = cli_error(CMD, "%s", err.msg);
        goto out;
    }
    int n_groups = kvq_shard_plan_groups(bytes, cfg.n_layers, max_mb, groups);
    printf("%s: %s, %d layers, hidden %d, %d/%d heads (GQA), head_dim %d, ffn %d, vocab %d\n", model,
           cfg.model_type, cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn, cfg.vocab);
    printf("%6s %14s %14s %10s %6s\n", "layer", "params(config)", "bytes(file)", "bytes/par", "shard");
    size_t total = 0;
    for (int l = 0, g = 0; l < cfg.n_layers; l++) {
        if (g + 1 < n_groups && groups[g + 1] == l)
            g++;
        total += bytes[l];
        const size_t params = kvq_model_config_layer_params_at(&cfg, l); /* dense and sparse layers differ */
        printf("%6d %14zu %14zu %10.2f %6d%s\n", l, params, bytes[l], (double)bytes[l] / (double)params, g,
               bytes[l] == 0 ? "  (no tensors found!)" : "");
    }
    printf("layers: %zu bytes in %d shard(s) of at most %.0f MiB; embedding and LM head (%d x %d each) are "
           "separate files\n",
           total, n_groups, max_mb > 0 ? max_mb : 256.0, cfg.vocab, cfg.hidden);
out:
    free(bytes);
    free(groups);
    return rc;
}

int cmd_shard(int argc, char **argv)
{
    const char *model = NULL, *out = NULL;
    double max_mb = 0;
    long lm = 1;
    int do_plan = 0, force = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--plan") == 0 || strcmp(a, "--force") == 0) {
            *(a[2] == 'p' ? &do_plan : &force) = 1;
            continue;
        }
        if (a[0] != '-')
            return cli_error(CMD, "unexpected argument '%s': options start with -- (see kvq shard --help)", a);
        if (i + 1 >= argc)
            return cli_error(CMD, "%s needs a value (see kvq shard --help)", a);
        const char *v = argv[++i];
        if (strcmp(a, "--model") == 0)
            model = v;
        else if (strcmp(a, "--out") == 0)
            out = v;
        else if (strcmp(a, "--max-shard-mb") == 0) {
            if (cli_parse_double(v, &max_mb) || !(max_mb > 0))
                return cli_error(CMD, "bad value '%s' for --max-shard-mb", v);
        } else if (strcmp(a, "--lm-head-shards") == 0) {
            if (cli_parse_int(v, 1, 1 << 20, &lm))
                return cli_error(CMD, "bad value '%s' for --lm-head-shards", v);
        } else
            return cli_error(CMD, "unknown option '%s' (see kvq shard --help)", a);
    }
    if (!model)
        return cli_error(CMD, "--model HF_DIR is required");
    if (do_plan)
        return plan(model, max_mb);
    if (!out)
        return cli_error(CMD, "--out DIR is required (or --plan)");
    struct kvq_shard_opts o = {.max_shard_mb = max_mb, .lm_head_shards = (int)lm, .force = force};
    kvq_error err = {0};
    double t0 = cli_now();
    kvq_status st = kvq_shard_write(model, out, &o, &err);
    if (st != KVQ_OK)
        return cli_error(CMD, "%s", err.msg);
    printf("wrote %s/%s and its shards in %.2f s\n", out, KVQ_MANIFEST_FILE, cli_now() - t0);
    return 0;
}
