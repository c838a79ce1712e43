/* cmd_eval.c - `kvq eval`: attention error against compression, per cache type.
 *
 * Reads q/k/v dumps (or generates synthetic data), builds each requested
 * cache configuration for real, runs the fused attention over it and reports
 * the errors against exact double-precision attention (kvq_eval.h).
 */
#include <cblas.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "eval_output.h"
#include "kvq_file.h"
#include "eval_spec.h"

#define CMD "eval"
#define DEFAULT_TYPES "k=tq3j:v=tq3,k=tq4j:v=tq3,q8_0,q4_0,f16"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvq eval [options] DUMP.safetensors [DUMP2 ...]\n"
            "       kvq eval --synthetic [options]\n\n"
            "Measures, per cache configuration, the memory it saves and how much attention it\n"
            "breaks: each configuration's cache is built from the dump's keys and values, every\n"
            "query position attends over it with the fused kernel, and the result is compared\n"
            "with exact double-precision attention on the original data.\n\n"
            "A dump has q [layer, head, Tq, d] (the last Tq positions), k and v [layer, kv_head,\n"
            "T, d], in F16, BF16 or F32 (kvq run --dump-qkv writes them).\n\n"
            "configurations:\n"
            "  --types LIST       comma list of k=TYPE:v=TYPE[:rot=R][:qjl=Q][:seed=N] or TYPE\n"
            "                     (default " DEFAULT_TYPES ")\n"
            "  --sweep            the default grid: f16, q8_0, q4_0, tqB and tqBj/tqB for B=1..4,\n"
            "                     mixed pairs, K-only and V-only rows\n"
            "  --rot KIND         rotation: hadamard (default), dct, identity\n"
            "  --qjl KIND         QJL projection: ortho (default), gauss\n"
            "  --seed N           codec seed (default 0)\n"
            "  The f32/f32 cache is always measured too: its error is the floor.\n\n"
            "scope:\n"
            "  --layers LIST      layers to measure, e.g. 0,2 or 1-3 (default all)\n"
            "  --max-queries N    use N evenly spaced query positions (the last included)\n\n"
            "synthetic data (Gaussian, planted outlier channels, deterministic):\n"
            "  --synthetic        instead of dump files\n"
            "  --data-seed N      data seed (default: --seed)\n"
            "  --tokens N (1024) --queries N (64) --dim D (128) --n-layers N (2)\n"
            "  --heads N (4) --kv-heads N (2) --outliers N (4 channels)\n\n"
            "output:\n"
            "  --per-layer        one table line per layer too\n"
            "  --csv FILE         every number, per configuration and layer\n"
            "  --json             the same as JSON on stdout, instead of the tables\n"
            "  --json-out FILE    the JSON into FILE (the old spelling --json FILE still works\n"
            "                     for a FILE not ending in .safetensors)\n"
            "  --plot FILE.png    error and KL against bits per value (gnuplot); with several\n"
            "                     inputs, one plot each (FILE-NAME.png)\n"
            "  --quiet            no progress on stderr\n");
}

struct opts {
    const char *types, *csv, *json_out, *plot, *layers;
    int sweep, per_layer, quiet, synthetic, have_data_seed, json;
    size_t max_queries;
    uint64_t data_seed;
    struct kvq_eval_config def;
    struct kvq_eval_synth_config synth;
    int synth_opt; /* a synthetic-only option was given */
    const char **inputs;
    int n_inputs;
};

/* Parses "0,2,5-7" into a mask over n layers. @return 0 or -1. */
static int parse_layers(const char *s, int n, unsigned char *mask, char *bad, size_t bad_len)
{
    memset(mask, 0, (size_t)n);
    const char *p = s;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p)
            goto fail;
        if (*end == '-') {
            const char *q = end + 1;
            b = strtol(q, &end, 10);
            if (end == q)
                goto fail;
        }
        if (a < 0 || b < a || b >= n) {
            snprintf(bad, bad_len, "--layers '%s': layer range %ld-%ld outside 0..%d", s, a, b, n - 1);
            return -1;
        }
        for (long i = a; i <= b; i++)
            mask[i] = 1;
        if (*end == ',')
            end++;
        else if (*end)
            goto fail;
        p = end;
    }
    return 0;
fail:
    snprintf(bad, bad_len, "--layers '%s': expected a list like 0,2,5-7", s);
    return -1;
}

static int need_arg(int i, int argc, char **argv)
{
    if (i + 1 >= argc) {
        cli_error(CMD, "%s needs a value", argv[i]);
        return -1;
    }
    return 0;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
    memset(o, 0, sizeof *o);
    kvq_eval_config_default(&o->def);
    kvq_eval_synth_config_default(&o->synth);
    o->inputs = calloc((size_t)argc, sizeof *o->inputs);
    if (!o->inputs)
        return cli_error(CMD, "out of memory");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long v;
        if (cli_is_help(a)) {
            usage(stdout);
            return -1;
        } else if (strcmp(a, "--sweep") == 0) {
            o->sweep = 1;
        } else if (strcmp(a, "--per-layer") == 0) {
            o->per_layer = 1;
        } else if (strcmp(a, "--quiet") == 0) {
            o->quiet = 1;
        } else if (strcmp(a, "--synthetic") == 0) {
            o->synthetic = 1;
        } else if (strcmp(a, "--json") == 0) {
            /* --json FILE was the file form (now --json-out): a next token
             * that cannot be a dump is taken as that file */
            const char *n = i + 1 < argc ? argv[i + 1] : NULL;
            size_t len = n ? strlen(n) : 0;
            if (n && n[0] != '-' && (len < 12 || strcmp(n + len - 12, ".safetensors") != 0))
                o->json_out = argv[++i];
            else
                o->json = 1;
        } else if (a[0] == '-' && a[1] == '-') {
            if (need_arg(i, argc, argv))
                return 2;
            const char *val = argv[++i];
            if (strcmp(a, "--types") == 0) {
                o->types = val;
            } else if (strcmp(a, "--csv") == 0) {
                o->csv = val;
            } else if (strcmp(a, "--json-out") == 0) {
                o->json_out = val;
            } else if (strcmp(a, "--plot") == 0) {
                o->plot = val;
            } else if (strcmp(a, "--layers") == 0) {
                o->layers = val;
            } else if (strcmp(a, "--rot") == 0) {
                if (kvq_rot_kind_from_name(val, &o->def.rot) || o->def.rot == KVQ_ROT_GAUSS)
                    return cli_error(CMD, "--rot '%s': expected hadamard, dct or identity", val);
            } else if (strcmp(a, "--qjl") == 0) {
                if (strcmp(val, "ortho") == 0)
                    o->def.qjl = KVQ_QJL_ORTHO;
                else if (strcmp(val, "gauss") == 0)
                    o->def.qjl = KVQ_QJL_GAUSS;
                else
                    return cli_error(CMD, "--qjl '%s': expected ortho or gauss", val);
            } else if (strcmp(a, "--seed") == 0) {
                if (cli_parse_u64(val, &o->def.seed))
                    return cli_error(CMD, "--seed '%s': expected a non-negative integer", val);
            } else if (strcmp(a, "--data-seed") == 0) {
                if (cli_parse_u64(val, &o->data_seed))
                    return cli_error(CMD, "--data-seed '%s': expected a non-negative integer", val);
                o->have_data_seed = o->synth_opt = 1;
            } else if (strcmp(a, "--max-queries") == 0) {
                if (cli_parse_int(val, 1, 1L << 30, &v))
                    return cli_error(CMD, "--max-queries '%s': expected a positive integer", val);
                o->max_queries = (size_t)v;
            } else {
                static const struct { const char *name; long min, max; } synth[] = {
                    {"--tokens", 1, 1L << 24}, {"--queries", 1, 1L << 24}, {"--dim", 2, KVQ_MAX_DIM},
                    {"--n-layers", 1, 4096}, {"--heads", 1, 4096}, {"--kv-heads", 1, 4096},
                    {"--outliers", 0, KVQ_MAX_DIM},
                };
                size_t k = 0;
                while (k < sizeof synth / sizeof synth[0] && strcmp(a, synth[k].name) != 0)
                    k++;
                if (k == sizeof synth / sizeof synth[0])
                    return cli_error(CMD, "unknown option '%s' (kvq eval --help)", a);
                if (cli_parse_int(val, synth[k].min, synth[k].max, &v))
                    return cli_error(CMD, "%s '%s': expected an integer in [%ld, %ld]", a, val, synth[k].min,
                                     synth[k].max);
                o->synth_opt = 1;
                switch (k) {
                case 0: o->synth.n_tokens = (size_t)v; break;
                case 1: o->synth.n_queries = (size_t)v; break;
                case 2: o->synth.head_dim = (int)v; break;
                case 3: o->synth.n_layers = (int)v; break;
                case 4: o->synth.n_heads = (int)v; break;
                case 5: o->synth.n_kv_heads = (int)v; break;
                default: o->synth.n_outliers = (int)v; break;
                }
            }
        } else {
            o->inputs[o->n_inputs++] = a;
        }
    }
    if (o->synthetic && o->n_inputs)
        return cli_error(CMD, "--synthetic and dump files are exclusive");
    if (!o->synthetic && o->synth_opt)
        return cli_error(CMD, "--tokens/--queries/--dim/--n-layers/--heads/--kv-heads/--outliers/--data-seed "
                              "need --synthetic");
    if (!o->synthetic && !o->n_inputs)
        return cli_error(CMD, "no input: give dump files or --synthetic (kvq eval --help)");
    if (o->sweep && o->types)
        return cli_error(CMD, "--sweep and --types are exclusive");
    o->synth.seed = o->have_data_seed ? o->data_seed : o->def.seed;
    /* Output paths are checked before minutes of work, not after. */
    const char *outs[2] = {o->csv, o->json_out};
    for (int k = 0; k < 2; k++) {
        kvq_error err = {0};
        if (outs[k] && kvq_out_path_check(outs[k], &err) != KVQ_OK)
            return cli_error(CMD, "%s %s", k ? "--json-out" : "--csv", err.msg);
    }
    char why[256];
    if (o->plot && eval_plot_check(o->plot, why, sizeof why))
        return cli_error(CMD, "--plot %s: %s", o->plot, why);
    return 0;
}

/* Prints err's line (it already says what and where) and maps the status to
 * the exit code: 1 when the work itself failed (memory), 2 for bad input. */
static int fail(kvq_status st, const kvq_error *err)
{
    cli_error(CMD, "%s", err->msg[0] ? err->msg : kvq_status_str(st));
    return st == KVQ_ERR_NOMEM || st == KVQ_ERR_INTERNAL ? 1 : 2;
}

/* Checks every configuration against the head dim before any work. */
static int check_configs(const struct kvq_eval_config *cfgs, size_t n, const struct kvq_eval_data *d)
{
    for (size_t i = 0; i < n; i++) {
        enum kvq_type ts[2] = {cfgs[i].type_k, cfgs[i].type_v};
        for (int s = 0; s < 2; s++) {
            kvq_status st = kvq_type_check_dim(ts[s], d->head_dim);
            if (st) {
                const struct kvq_type_traits *tr = kvq_type_traits(ts[s]);
                return cli_error(CMD, "%s: type %s cannot store head dim %d (%s; q8_0/q4_0 need a multiple of 32, "
                                      "tq types a multiple of 8)",
                                 d->name, tr ? tr->name : "?", d->head_dim, kvq_status_str(st));
            }
        }
    }
    return 0;
}

static void progress(const struct opts *o, const struct kvq_eval_data *d, int li, int nl, size_t c, size_t nc,
                     const char *label, double t0)
{
    if (o->quiet)
        return;
    if (isatty(STDERR_FILENO))
        fprintf(stderr, "\r\033[Kkvq eval: %s layer %d/%d, config %zu/%zu %s (%.1f s)", d->name, li + 1, nl, c + 1,
                nc, label, cli_now() - t0);
    else if (c + 1 == nc)
        fprintf(stderr, "kvq eval: %s layer %d/%d done (%zu configurations, %.1f s)\n", d->name, li + 1, nl, nc,
                cli_now() - t0);
}

/* Runs every configuration on one input. @return 0 or an exit status. */
static int eval_one(const struct opts *o, const struct kvq_eval_data *d, const struct kvq_eval_config *cfgs, size_t n_cfg,
                    struct eval_run *run, double t0)
{
    int rc = check_configs(cfgs, n_cfg, d);
    if (rc)
        return rc;
    unsigned char *mask = calloc((size_t)d->n_layers, 1);
    int *layers = calloc((size_t)d->n_layers, sizeof *layers);
    if (!mask || !layers) {
        free(mask);
        free(layers);
        return cli_error(CMD, "out of memory");
    }
    char bad[160];
    if (o->layers && parse_layers(o->layers, d->n_layers, mask, bad, sizeof bad)) {
        free(mask);
        free(layers);
        return cli_error(CMD, "%s: %s", d->name, bad);
    }
    int nl = 0;
    for (int l = 0; l < d->n_layers; l++)
        if (!o->layers || mask[l])
            layers[nl++] = l;
    free(mask);
    run->data = d;
    run->layers = layers;
    run->n_layers = nl;
    run->n_res = n_cfg;
    run->res = calloc(n_cfg, sizeof *run->res);
    if (!run->res)
        return cli_error(CMD, "out of memory");
    for (size_t c = 0; c < n_cfg; c++) {
        run->res[c].cfg = cfgs[c];
        kvq_eval_cost_of(&cfgs[c], d->head_dim, &run->res[c].cost);
        run->res[c].layers = calloc((size_t)nl, sizeof(struct kvq_eval_sums));
        if (!run->res[c].layers)
            return cli_error(CMD, "out of memory");
    }
    kvq_eval_ctx *ctx = NULL;
    kvq_error err = {0};
    kvq_status st = kvq_eval_ctx_create(d, o->max_queries, &ctx, &err);
    if (st)
        return fail(st, &err);
    run->queries_used = kvq_eval_ctx_queries_used(ctx);
    for (int li = 0; li < nl && !rc; li++) {
        st = kvq_eval_ctx_set_layer(ctx, layers[li], &err);
        for (size_t c = 0; c < n_cfg && !st; c++) {
            progress(o, d, li, nl, c, n_cfg, cfgs[c].label, t0);
            st = kvq_eval_ctx_run(ctx, &cfgs[c], &run->res[c].layers[li], &err);
        }
        if (st)
            rc = fail(st, &err);
    }
    if (!o->quiet && isatty(STDERR_FILENO))
        fprintf(stderr, "\r\033[K");
    kvq_eval_ctx_attention_stats(ctx, &run->eff_keys, &run->top_p, &run->v_gain);
    kvq_eval_ctx_free(ctx);
    if (rc)
        return rc;
    for (size_t c = 0; c < n_cfg; c++)
        for (int li = 0; li < nl; li++)
            kvq_eval_sums_add(&run->res[c].total, &run->res[c].layers[li]);
    eval_mark_pareto(run);
    return 0;
}

static void free_runs(struct eval_run *runs, struct kvq_eval_data *data, int n)
{
    for (int i = 0; i < n; i++) {
        for (size_t c = 0; runs[i].res && c < runs[i].n_res; c++)
            free(runs[i].res[c].layers);
        free(runs[i].res);
        free((void *)runs[i].layers);
        kvq_eval_data_free(&data[i]);
    }
    free(runs);
    free(data);
}

int cmd_eval(int argc, char **argv)
{
    struct opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) {
        free(o.inputs);
        return rc < 0 ? 0 : rc;
    }
#if defined(OPENBLAS_VERSION)
    /* One thread: the reported time is single-threaded, and a fixed
     * partition of the products keeps the numbers identical run to run. */
    openblas_set_num_threads(1);
#endif
    static struct kvq_eval_config cfgs[KVQ_EVAL_MAX_CONFIGS];
    size_t n_cfg = 0;
    kvq_error err = {0};
    if (o.sweep) {
        n_cfg = kvq_eval_sweep_default(&o.def, cfgs, KVQ_EVAL_MAX_CONFIGS);
    } else if (eval_spec_parse(o.types ? o.types : DEFAULT_TYPES, &o.def, cfgs, KVQ_EVAL_MAX_CONFIGS, &n_cfg, &err)) {
        free(o.inputs);
        return cli_error(CMD, "%s", err.msg);
    }
    n_cfg = kvq_eval_ensure_floor(&o.def, cfgs, n_cfg, KVQ_EVAL_MAX_CONFIGS);

    int n_in = o.synthetic ? 1 : o.n_inputs;
    struct eval_run *runs = calloc((size_t)n_in, sizeof *runs);
    struct kvq_eval_data *data = calloc((size_t)n_in, sizeof *data);
    if (!runs || !data) {
        free(runs);
        free(data);
        free(o.inputs);
        return cli_error(CMD, "out of memory");
    }
    const double t0 = cli_now();
    for (int i = 0; i < n_in && !rc; i++) {
        double ti = cli_now();
        kvq_status st = o.synthetic ? kvq_eval_data_synthetic(&o.synth, &data[i], &err)
                                    : kvq_eval_data_load(o.inputs[i], &data[i], &err);
        if (st) {
            rc = fail(st, &err);
            break;
        }
        rc = eval_one(&o, &data[i], cfgs, n_cfg, &runs[i], t0);
        if (rc)
            break;
        if (!o.json) {
            eval_print_table(stdout, &runs[i], o.per_layer);
            cli_flush_stdout();
        }
        if (!o.quiet)
            fprintf(stderr, "kvq eval: %s: %zu configurations in %.2f s\n", data[i].name, n_cfg, cli_now() - ti);
    }
    if (!rc && !o.quiet)
        fprintf(stderr, "kvq eval: total %.2f s (single thread)\n", cli_now() - t0);
    if (!rc && o.csv && eval_write_csv(o.csv, runs, (size_t)n_in, &err)) {
        cli_error(CMD, "--csv %s", err.msg);
        rc = 1;
    }
    for (int pretty = 0; !rc && pretty < 2; pretty++) {
        /* --json: one line on stdout, as every command prints it; --json-out: indented */
        if (pretty ? !o.json_out : !o.json)
            continue;
        char *text = eval_json_text(runs, (size_t)n_in, pretty);
        if (!text) {
            rc = cli_status_error(CMD, KVQ_ERR_NOMEM, "building the JSON");
            break;
        }
        size_t len = strlen(text);
        text[len] = '\n'; /* replaces the NUL: written with its length */
        if (!pretty)
            fwrite(text, 1, len + 1, stdout);
        else if (kvq_write_file_atomic(o.json_out, text, len + 1, &err) != KVQ_OK) {
            cli_error(CMD, "--json-out %s", err.msg);
            rc = 1;
        }
        cJSON_free(text);
    }
    for (int i = 0; !rc && o.plot && i < n_in; i++) {
        char path[1024], why[256];
        eval_plot_path(o.plot, &runs[i], (size_t)n_in, path, sizeof path);
        if (eval_plot(path, &runs[i], why, sizeof why)) {
            cli_error(CMD, "--plot %s: %s", path, why);
            rc = 1;
        } else if (!o.quiet) {
            fprintf(stderr, "kvq eval: wrote %s\n", path);
        }
    }
    free_runs(runs, data, n_in);
    free(o.inputs);
    return rc;
}
