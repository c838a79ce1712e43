/* kv_opts.c - parsing of the shared KV-cache options. */
#include "kv_opts.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli.h"
#include "kvq_cache.h"

void kv_opts_default(struct kv_opts *o)
{
    memset(o, 0, sizeof *o);
    o->tk = KVQ_DEFAULT_TYPE_K;
    o->tv = KVQ_DEFAULT_TYPE_V;
    o->recent_f16 = KVQ_WINDOW_AUTO;
    o->center_k = KVQ_CENTER_AUTO;
    o->key_outlier_f16 = 1;
    o->cuda_graphs = 1;
    o->fast_prefill = 1;
}

int kv_parse_type(const char *cmd, const char *s, enum kvq_type *t)
{
    char low[64];
    if (kvq_type_from_name(cli_lower(s, low, sizeof low), t) == KVQ_OK)
        return 0;
    char names[256] = "";
    for (int i = 0; i < KVQ_TYPE_COUNT; i++) {
        strncat(names, i ? ", " : "", sizeof names - strlen(names) - 1);
        strncat(names, kvq_type_traits((enum kvq_type)i)->name, sizeof names - strlen(names) - 1);
    }
    return cli_error(cmd, "unknown cache type '%s' (one of: %s)", s, names);
}

int kv_opts_parse(const char *cmd, const char *a, const char *v, struct kv_opts *o)
{
    if (strcmp(a, "--cache-type-k") == 0)
        return kv_parse_type(cmd, v, &o->tk) ? 2 : 1;
    if (strcmp(a, "--cache-type-v") == 0)
        return kv_parse_type(cmd, v, &o->tv) ? 2 : 1;
    if (strcmp(a, "--kv-budget") == 0) {
        if (cli_parse_size(v, &o->budget) || o->budget == 0) {
            cli_error(cmd, "bad value '%s' for --kv-budget (a size such as 48MiB, 2GiB or 1000000)", v);
            return 2;
        }
        return 1;
    }
    if (strcmp(a, "--layer-types") == 0) {
        o->n_layer_types = 0;
        char buf[64];
        for (const char *p = v; *p;) {
            size_t n = strcspn(p, ",");
            const char *slash = memchr(p, '/', n);
            if (!slash || n >= sizeof buf || o->n_layer_types == KVQ_KV_AUTO_MAX_LAYERS) {
                cli_error(cmd, "bad value '%s' for --layer-types (K/V per layer, e.g. q8_0/tq3,tq3j/tq3)", v);
                return 2;
            }
            memcpy(buf, p, n);
            buf[n] = 0;
            buf[slash - p] = 0;
            enum kvq_type *t = o->layer_types + 2 * o->n_layer_types;
            if (kv_parse_type(cmd, buf, t) || kv_parse_type(cmd, buf + (slash - p) + 1, t + 1))
                return 2;
            o->n_layer_types++;
            p += n;
            p += *p == ',';
        }
        if (!o->n_layer_types) {
            cli_error(cmd, "--layer-types needs one K/V pair per layer");
            return 2;
        }
        return 1;
    }
    if (strcmp(a, "--kv-sink") == 0) {
        long n = 0;
        if (cli_parse_int(v, 0, KVQ_CACHE_MAX_SINK_TOKENS, &n)) {
            cli_error(cmd, "bad value '%s' for --kv-sink (0..%d tokens)", v, KVQ_CACHE_MAX_SINK_TOKENS);
            return 2;
        }
        o->sink_tokens = (int)n;
        return 1;
    }
    if (strcmp(a, "--kv-auto-ctx") == 0) {
        long n = 0;
        if (cli_parse_int(v, 2, 1l << 30, &n)) {
            cli_error(cmd, "bad value '%s' for --kv-auto-ctx", v);
            return 2;
        }
        o->auto_ctx = (size_t)n;
        return 1;
    }
    if (strcmp(a, "--kv-auto-metric") == 0) {
        if (kvq_kv_auto_metric_from_name(v, &o->auto_metric) == KVQ_OK)
            return 1;
        cli_error(cmd, "bad value '%s' for --kv-auto-metric (nll, out_err, ipv or kl)", v);
        return 2;
    }
    if (strcmp(a, "--kv-auto-calib") == 0) {
        o->auto_calib = v;
        return 1;
    }
    if (strcmp(a, "--device") == 0) {
        if (strcmp(v, "cpu") == 0)
            o->device = KVQ_DEVICE_CPU;
        else if (strcmp(v, "cuda") == 0)
            o->device = KVQ_DEVICE_CUDA;
        else {
            cli_error(cmd, "bad value '%s' for --device (cpu or cuda)", v);
            return 2;
        }
        return 1;
    }
    if (strcmp(a, "--threads") == 0) { /* process-wide: applied as it is read */
        long n;
        if (cli_parse_int(v, 1, 1024, &n)) {
            cli_error(cmd, "bad value '%s' for --threads (1..1024)", v);
            return 2;
        }
        kvq_set_threads((int)n);
        return 1;
    }
    if (strcmp(a, "--seed") == 0) {
        if (cli_parse_u64(v, &o->seed)) {
            cli_error(cmd, "bad value '%s' for --seed", v);
            return 2;
        }
        return 1;
    }
    return 0;
}

int kv_opts_flag(const char *a, struct kv_opts *o)
{
    /* each flag sets one int field of o */
    static const struct {
        const char *name;
        size_t field;
        int value;
    } flags[] = {
        {"--v-norm-correct", offsetof(struct kv_opts, v_norm_correct), 1},
        {"--kv-recent-f16", offsetof(struct kv_opts, recent_f16), 1},
        {"--no-kv-recent-f16", offsetof(struct kv_opts, recent_f16), 0},
        {"--kv-auto", offsetof(struct kv_opts, kv_auto), 1},
        {"--no-key-outlier-f16", offsetof(struct kv_opts, key_outlier_f16), 0},
        {"--no-cuda-graphs", offsetof(struct kv_opts, cuda_graphs), 0},
        {"--fast-prefill", offsetof(struct kv_opts, fast_prefill), 1},
        {"--exact-prefill", offsetof(struct kv_opts, fast_prefill), 0},
        {"--kv-center-k", offsetof(struct kv_opts, center_k), 1},
        {"--no-kv-center-k", offsetof(struct kv_opts, center_k), 0},
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (strcmp(a, flags[i].name) == 0) {
            *(int *)((char *)o + flags[i].field) = flags[i].value;
            return 1;
        }
    return 0;
}

int kv_cmd_parse(const char *cmd, int argc, char **argv, struct kv_cmd *c, void (*usage)(FILE *),
                 int (*own)(void *user, const char *a, const char *v), void *user)
{
    memset(c, 0, sizeof *c);
    kv_opts_default(&c->kv);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) {
            usage(stdout);
            return -1;
        }
        if (kv_opts_flag(a, &c->kv))
            continue;
        if (strcmp(a, "--json") == 0 || strcmp(a, "--quiet") == 0) {
            *(a[2] == 'j' ? &c->json : &c->quiet) = 1;
            continue;
        }
        if (a[0] != '-')
            return cli_error(cmd, "unexpected argument '%s': options start with -- (see kvq %s --help)", a, cmd);
        if (i + 1 >= argc)
            return cli_error(cmd, "%s needs a value (see kvq %s --help)", a, cmd);
        const char *v = argv[++i];
        int r = kv_opts_parse(cmd, a, v, &c->kv);
        if (r == 2)
            return 2;
        if (r == 1)
            continue;
        if (strcmp(a, "--model") == 0) {
            c->model = v;
            continue;
        }
        r = own(user, a, v);
        if (r < 0)
            return cli_error(cmd, "unknown option '%s' (see kvq %s --help)", a, cmd);
        if (r)
            return cli_error(cmd, "bad value '%s' for %s", v, a);
    }
    return 0;
}

int kv_opts_check(const char *cmd, const struct kv_opts *o, const kvq_model *m)
{
    int n = kvq_model_config_of(m)->n_layers;
    if (o->kv_auto && !o->budget)
        return cli_error(cmd, "--kv-auto needs --kv-budget");
    if (o->kv_auto && o->n_layer_types)
        return cli_error(cmd, "--kv-auto chooses the per-layer types itself: drop --layer-types");
    if (o->n_layer_types && o->n_layer_types != n)
        return cli_error(cmd, "--layer-types gives %d K/V pairs, the model has %d layers", o->n_layer_types, n);
    /* Said here in the options' names: the library's refusal names its
     * config fields (center_k, recent_f16). --kv-auto's types come later,
     * and they are compressed (the window on) unless it was turned off. */
    if (o->center_k == 1) {
        struct kvq_seq_config sc;
        kv_opts_seq_config(o, &sc);
        if (o->recent_f16 == 0)
            return cli_error(cmd, "--kv-center-k needs the recent-token window, which --no-kv-recent-f16 turns off");
        if (!o->kv_auto && !kvq_seq_window_for(&sc, n))
            return cli_error(cmd, "--kv-center-k needs the recent-token window, which is off for f16/f32 caches "
                                  "(--kv-recent-f16 turns it on)");
    }
    const struct kvq_model_config *c = kvq_model_config_of(m);
    char layers[256] = "";
    size_t used = 0;
    for (int l = 0; l < n && o->key_outlier_f16 && used < sizeof layers - 16; l++)
        if (c->arch.key_outlier_layers[l / 8] >> (l % 8) & 1) {
            int w = snprintf(layers + used, sizeof layers - used, "%s%d", used ? ", " : "", l);
            used += w > 0 ? (size_t)w : 0;
        }
    if (used)
        fprintf(stderr,
                "kvq %s: layer%s %s keep%s keys in f16: the k_proj bias there is >= %.0fx the median norm, "
                "which a few bits per coordinate cannot carry (--no-key-outlier-f16: quantize them too)\n",
                cmd, strchr(layers, ',') ? "s" : "", layers, strchr(layers, ',') ? "" : "s",
                (double)KVQ_KEY_OUTLIER_RATIO);
    return 0;
}

void kv_opts_name(const struct kv_opts *o, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = 0;
    int n = o->n_layer_types ? o->n_layer_types : 1;
    for (int l = 0; l < n && used < cap; l++) {
        enum kvq_type tk = o->n_layer_types ? o->layer_types[2 * l] : o->tk;
        enum kvq_type tv = o->n_layer_types ? o->layer_types[2 * l + 1] : o->tv;
        int w = snprintf(buf + used, cap - used, "%s%s/%s", l ? "," : "", kvq_type_traits(tk)->name,
                         kvq_type_traits(tv)->name);
        used += w > 0 ? (size_t)w : 0;
    }
    if (o->v_norm_correct && used < cap) {
        int w = snprintf(buf + used, cap - used, "+vnc");
        used += w > 0 ? (size_t)w : 0;
    }
    struct kvq_seq_config sc;
    kv_opts_seq_config(o, &sc);
    const int window = kvq_seq_window_for(&sc, o->n_layer_types);
    if (kvq_seq_centred(&sc, o->n_layer_types) && used < cap) {
        int w = snprintf(buf + used, cap - used, "+ctr");
        used += w > 0 ? (size_t)w : 0;
    }
    if (window && used < cap) {
        int w = snprintf(buf + used, cap - used, "+win");
        used += w > 0 ? (size_t)w : 0;
    }
    if (o->sink_tokens && used < cap)
        snprintf(buf + used, cap - used, "+sink%d", o->sink_tokens);
}

double kv_bits_per_value(const struct kvq_seq_plan *pl, const struct kvq_model_config *c)
{
    return 8.0 * (double)pl->bytes_per_token / (2.0 * c->n_layers * c->n_kv_heads * c->head_dim);
}

double kv_bits_at(const struct kvq_seq_plan *pl, const struct kvq_model_config *c, size_t ctx)
{
    double per_token = 2.0 * c->n_layers * c->n_kv_heads * c->head_dim;
    return ctx ? 8.0 * ((double)pl->bytes_per_token * (double)ctx + (double)pl->fixed_bytes) / (per_token * (double)ctx)
               : kv_bits_per_value(pl, c);
}

void kv_opts_usage(FILE *f)
{
    fprintf(f, "  --cache-type-k T     key cache type (default tq3j; see `kvq types`)\n"
               "  --cache-type-v T     value cache type (default tq3)\n"
               "  --kv-budget SIZE     most bytes of KV-cache pages over all layers, e.g. 48MiB\n"
               "                       (KiB/MiB/GiB or K/M/G: powers of 1024; kB/MB/GB: of 1000)\n"
               "                       (split evenly per layer; default: no limit)\n"
               "  --layer-types K/V,.. per-layer cache types, one pair per layer (overrides the above)\n"
               "  --kv-auto            choose per-layer K/V types that fit --kv-budget at the context\n"
               "                       with the least measured error on a calibration text\n"
               "  --kv-auto-ctx N      context --kv-auto plans for (default: the command's / model's)\n"
               "  --kv-auto-calib F    calibration text (default: the end of <model>/reference/valid.txt)\n"
               "  --kv-auto-metric M   per-layer error --kv-auto minimises: nll (default; ~2 min),\n"
               "                       out_err (~1 s), ipv, kl\n"
               "  --v-norm-correct     store value norms so that decoded tq values keep the input norm\n"
               "  --kv-recent-f16      also keep the tokens of the last, partly filled cache page in\n"
               "                       f16 and attend to them in f16 (2 x 64 f16 rows per layer and\n"
               "                       KV head, counted in --kv-budget); the default for compressed\n"
               "                       types (everything but f32 and f16)\n"
               "  --no-kv-recent-f16   no such window: every token is read from the packed pages\n"
               "  --kv-center-k        key centering: each full page stores its keys' mean (4 bits a\n"
               "                       coordinate) and encodes the keys minus it; needs the window,\n"
               "                       and is the default wherever the window is on\n"
               "  --no-kv-center-k     no key centering (a little faster: ~5%% decode on a GPU)\n"
               "  --kv-sink N          also keep the first N tokens (0..%d) in f16 for good\n"
               "  --no-key-outlier-f16 quantize the keys of layers whose k_proj bias is >= 8x the\n"
               "                       median norm too (default: such layers keep keys in f16)\n"
               "  --threads N, -t N    CPU threads for products and attention (default: the cores\n"
               "                       available)\n"
               "  --seed S             cache-rotation (and sampler) seed (default 0)\n"
               "  --device cpu|cuda    where the model runs (default cpu); cuda: weights, activations\n"
               "                       and the KV pages on the GPU (every cache type, with the\n"
               "                       recent-token window and sinks)\n"
               "  --no-cuda-graphs     launch a decode step's kernels one by one instead of replaying\n"
               "                       the step as one CUDA graph\n"
               "  --exact-prefill      on the GPU, prefill products keep f32 inputs (each as two 16-bit\n"
               "                       halves, two GEMMs: a float32 forward's logits) instead of the\n"
               "                       default one GEMM on inputs rounded to 16 bits, as a bf16 forward\n"
               "                       (~2x faster matmuls, logits ~2e-3 from float32; --fast-prefill)\n",
            KVQ_CACHE_MAX_SINK_TOKENS);
}

void kv_opts_seq_config(const struct kv_opts *o, struct kvq_seq_config *sc)
{
    kvq_seq_config_default(sc);
    sc->type_k = o->tk;
    sc->type_v = o->tv;
    sc->seed = o->seed;
    sc->kv_budget = o->budget;
    sc->layer_types = o->n_layer_types ? o->layer_types : NULL;
    sc->v_norm_correct = o->v_norm_correct;
    sc->recent_f16 = o->recent_f16;
    sc->sink_tokens = o->sink_tokens;
    sc->key_outlier_f16 = o->key_outlier_f16;
    sc->cuda_graphs = o->cuda_graphs;
    sc->fast_prefill = o->fast_prefill;
    sc->center_k = o->center_k;
    sc->device = o->device;
}

size_t kv_peak_rss(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (size_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
}

void kv_opts_json(void *cjson_root, const struct kv_opts *o)
{
    char name[2048];
    kv_opts_name(o, name, sizeof name);
    cJSON_AddStringToObject(cjson_root, "cache", name);
    cJSON_AddStringToObject(cjson_root, "cache_type_k", kvq_type_traits(o->tk)->name);
    cJSON_AddStringToObject(cjson_root, "cache_type_v", kvq_type_traits(o->tv)->name);
}

int kv_print_json(const char *cmd, void *cjson_root)
{
    char *js = cJSON_PrintUnformatted(cjson_root);
    if (js)
        printf("%s\n", js);
    free(js);
    cJSON_Delete(cjson_root);
    return js ? 0 : cli_status_error(cmd, KVQ_ERR_NOMEM, "building JSON");
}

/* Loads dir's model and tokenizer (kv_with_model). @return 0, or 2/1 after
 * printing the error (nothing left loaded). */
static int load_model(const char *cmd, const char *dir, const struct kv_opts *check, kvq_model **m,
                      kvq_tokenizer **tok)
{
    kvq_error err = {0};
    *m = NULL;
    *tok = NULL;
    if (kvq_model_load(dir, NULL, m, &err) != KVQ_OK)
        return cli_error(cmd, "%s", err.msg);
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (kvq_tokenizer_create(path, tok, &err) != KVQ_OK) {
        kvq_model_free(*m);
        *m = NULL;
        return cli_error(cmd, "%s", err.msg);
    }
    const struct kvq_model_config *c = kvq_model_config_of(*m);
    if (kvq_tokenizer_vocab_size(*tok) > c->vocab) {
        int rc = cli_error(cmd, "%s has %d tokens, the model only %d", path, kvq_tokenizer_vocab_size(*tok),
                           c->vocab);
        kvq_tokenizer_free(*tok);
        kvq_model_free(*m);
        *m = NULL;
        *tok = NULL;
        return rc;
    }
    kvq_tokenizer_set_bos_eos(*tok, c->bos_id, c->n_eos ? c->eos_ids[0] : -1);
    int rc = check ? kv_opts_check(cmd, check, *m) : 0;
    if (rc) {
        kvq_tokenizer_free(*tok);
        kvq_model_free(*m);
        *m = NULL;
        *tok = NULL;
    }
    return rc;
}

int kv_with_model(const char *cmd, const char *dir, const struct kv_opts *check,
                  int (*fn)(void *user, kvq_model *m, kvq_tokenizer *tok), void *user)
{
    kvq_model *m;
    kvq_tokenizer *tok;
    int rc = load_model(cmd, dir, check, &m, &tok);
    if (rc)
        return rc;
    rc = fn(user, m, tok);
    kvq_tokenizer_free(tok);
    kvq_model_free(m);
    return rc;
}
