/* cmd_ppl.c - `kvq ppl`: perplexity of a text with the compressed KV cache in
 * the loop (kvq_ppl_score, kvq_eval.h, says how windows and chunks attend over
 * the encoded cache). The result goes to stdout (one line, or JSON), progress
 * to stderr. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv_auto.h"
#include "kv_opts.h"
#include "kvq_eval.h"

#define CMD "ppl"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvq ppl --model DIR --file TEXT [options]\n\n"
               "Perplexity of TEXT in windows of --ctx tokens (BOS first), each forwarded in\n"
               "chunks whose queries attend over the compressed cache of the window so far.\n\n"
               "  --model DIR          model directory\n"
               "  --file TEXT          text file to score ('-': standard input)\n"
               "  --ctx N              tokens per window, BOS included (default: the model's context)\n"
               "  --chunk C            tokens per forward (default 256)\n"
               "  --max-tokens N       score only the first N tokens of the text (default: all)\n"
               "  --kl-divergence      also run an f32 cache over the same windows and report the mean,\n"
               "                       99th-percentile and largest KL(P_f32 || P) per token and how often\n"
               "                       the top-1 token agrees (twice the work)\n"
               "  --json               print one JSON object\n"
               "  --quiet              no progress on stderr\n");
    kv_opts_usage(f);
}

struct opts {
    struct kv_cmd c; /* --model, --json, --quiet, the KV options */
    const char *file;
    long ctx, max_tokens;
    int kl; /* --kl-divergence */
    struct kvq_ppl_config ppl;
};

/* The options of kvq ppl's own (kv_cmd_parse). */
static int own_option(void *user, const char *a, const char *v)
{
    struct opts *o = user;
    long chunk = 0;
    if (strcmp(a, "--file") == 0)
        o->file = v;
    else if (strcmp(a, "--ctx") == 0)
        return cli_parse_int(v, 2, 1 << 24, &o->ctx) ? 1 : 0;
    else if (strcmp(a, "--chunk") == 0) {
        if (cli_parse_int(v, 1, 1 << 16, &chunk))
            return 1;
        o->ppl.chunk = (size_t)chunk;
    } else if (strcmp(a, "--max-tokens") == 0)
        return cli_parse_int(v, 2, 1l << 40, &o->max_tokens) ? 1 : 0;
    else
        return -1;
    return 0;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    memset(o, 0, sizeof *o);
    kvq_ppl_config_default(&o->ppl);
    /* --kl-divergence is this command's one flag without a value: taken out
     * before the shared loop, which reads a value after every other option */
    int m = 0;
    for (int i = 0; i < argc; i++) {
        if (i > 0 && strcmp(argv[i], "--kl-divergence") == 0 && strcmp(argv[i - 1], "--file") != 0)
            o->kl = 1;
        else
            argv[m++] = argv[i];
    }
    int rc = kv_cmd_parse(CMD, m, argv, &o->c, usage, own_option, o);
    if (rc)
        return rc;
    if (!o->c.model || !o->file)
        return cli_error(CMD, "--model DIR and --file TEXT are required");
    return 0;
}

static void progress(void *user, size_t done, size_t total, const struct kvq_ppl_result *r)
{
    const struct opts *o = user;
    if (!o->c.quiet)
        fprintf(stderr, "\rkvq ppl: %zu / %zu tokens, ppl so far %.4f   ", done, total, r->ppl);
}

static int report(const struct opts *o, const struct kvq_seq_config *sc, const struct kvq_seq_plan *pl,
                  const kvq_model *m, size_t n, const struct kvq_ppl_result *r, const struct kvq_kl_result *kl)
{
    const struct kvq_model_config *c = kvq_model_config_of(m);
    char name[2048];
    kv_opts_name(&o->c.kv, name, sizeof name);
    double bits = kv_bits_at(pl, c, (size_t)o->ctx); /* f16 window/sink buffers included */
    if (!o->c.json) {
        printf("ppl %.4f  cache %s (%.3f bits/value)  %zu tokens scored in %zu windows of %ld  %.1f s\n", r->ppl,
               name, bits, r->scored, r->windows, o->ctx, r->seconds);
        if (kl)
            printf("KL vs an f32 cache (ppl %.4f): mean %.6f  p99 %.6f  max %.6f  top-1 agreement %.2f%%\n",
                   kl->ref_ppl, kl->mean, kl->p99, kl->max, 100.0 * kl->top1);
        return 0;
    }
    cJSON *root = cJSON_CreateObject();
    kv_opts_json(root, &o->c.kv);
    cJSON_AddNumberToObject(root, "bits_per_value", bits);
    cJSON_AddNumberToObject(root, "bits_per_value_pages", kv_bits_per_value(pl, c));
    cJSON_AddNumberToObject(root, "recent_f16", kvq_seq_window_for(sc, c->n_layers));
    cJSON_AddNumberToObject(root, "sink_tokens", o->c.kv.sink_tokens);
    cJSON_AddNumberToObject(root, "f16_buffer_bytes", (double)pl->fixed_bytes);
    cJSON_AddNumberToObject(root, "ppl", r->ppl);
    cJSON_AddNumberToObject(root, "nll_mean", r->scored ? r->nll_sum / (double)r->scored : 0);
    cJSON_AddNumberToObject(root, "scored", (double)r->scored);
    cJSON_AddNumberToObject(root, "text_tokens", (double)n);
    cJSON_AddNumberToObject(root, "windows", (double)r->windows);
    cJSON_AddNumberToObject(root, "ctx", (double)o->ctx);
    cJSON_AddNumberToObject(root, "chunk", (double)o->ppl.chunk);
    cJSON_AddNumberToObject(root, "seconds", r->seconds);
    if (kl) {
        cJSON *k = cJSON_AddObjectToObject(root, "kl_vs_f32");
        cJSON_AddNumberToObject(k, "ref_ppl", kl->ref_ppl);
        cJSON_AddNumberToObject(k, "mean", kl->mean);
        cJSON_AddNumberToObject(k, "p99", kl->p99);
        cJSON_AddNumberToObject(k, "max", kl->max);
        cJSON_AddNumberToObject(k, "top1_agreement", kl->top1);
        cJSON_AddNumberToObject(k, "positions", (double)kl->n);
    }
    kv_auto_json(root, &o->c.kv, m);
    return kv_print_json(CMD, root);
}

static int score(void *user, kvq_model *m, kvq_tokenizer *tok)
{
    struct opts *o = user;
    const struct kvq_model_config *c = kvq_model_config_of(m);
    size_t len = 0, n = 0;
    int32_t *ids = NULL;
    kvq_seq *s = NULL, *ref = NULL;
    kvq_error err = {0};
    int rc = 0;
    char *text = cli_read_text(CMD, o->file, "the text", &len);
    if (!text)
        return 2;
    kvq_status st = kvq_tokenizer_encode_alloc(tok, text, len, 0, &ids, &n);
    free(text);
    if (st != KVQ_OK)
        return cli_status_error(CMD, st, "encoding the text");
    if (o->max_tokens && (size_t)o->max_tokens < n)
        n = (size_t)o->max_tokens;
    if (!o->ctx)
        o->ctx = c->max_ctx;
    if (o->ctx > c->max_ctx) {
        rc = cli_error(CMD, "--ctx %ld exceeds the model's context of %d", o->ctx, c->max_ctx);
        goto out;
    }
    if (n < 2) {
        rc = cli_error(CMD, "%s has fewer than 2 tokens", o->file);
        goto out;
    }
    if ((rc = kv_auto_apply(CMD, &o->c.kv, m, tok, o->c.model, (size_t)o->ctx, o->c.quiet)) != 0)
        goto out;
    struct kvq_seq_config sc;
    kv_opts_seq_config(&o->c.kv, &sc);
    sc.max_ctx = (size_t)o->ctx;
    sc.max_chunk = (int)o->ppl.chunk;
    struct kvq_seq_plan pl;
    if (kvq_seq_plan_of(m, &sc, &pl) != KVQ_OK || kvq_seq_create(m, &sc, &s, &err) != KVQ_OK) {
        rc = cli_error(CMD, "%s", err.msg[0] ? err.msg : "unsupported cache type for this model");
        goto out;
    }
    if (pl.max_tokens < (size_t)o->ctx) {
        rc = cli_error(CMD, "--kv-budget holds only %zu tokens, less than --ctx %ld", pl.max_tokens, o->ctx);
        goto out;
    }
    struct kvq_ppl_result r;
    struct kvq_kl_result kl;
    o->ppl.ctx = (size_t)o->ctx;
    if (o->kl) { /* the reference: an f32 cache, no window or sinks, on the same device */
        struct kvq_seq_config ref_cfg = sc;
        ref_cfg.type_k = ref_cfg.type_v = KVQ_TYPE_F32;
        ref_cfg.layer_types = NULL;
        ref_cfg.recent_f16 = 0;
        ref_cfg.sink_tokens = 0;
        ref_cfg.v_norm_correct = 0;
        ref_cfg.center_k = 0;
        ref_cfg.kv_budget = 0;
        if (kvq_seq_create(m, &ref_cfg, &ref, &err) != KVQ_OK) {
            rc = cli_error(CMD, "the f32 reference cache: %s", err.msg);
            goto out;
        }
        st = kvq_ppl_kl(m, s, ref, &o->ppl, ids, n, &r, &kl, progress, o);
    } else {
        st = kvq_ppl_score(m, s, &o->ppl, ids, n, NULL, &r, progress, o);
    }
    if (!o->c.quiet)
        fputc('\n', stderr);
    if (st != KVQ_OK) {
        rc = cli_status_error(CMD, st, "scoring");
        goto out;
    }
    rc = report(o, &sc, &pl, m, n, &r, o->kl ? &kl : NULL);
out:
    kvq_seq_free(ref);
    kvq_seq_free(s);
    free(ids);
    return rc;
}

int cmd_ppl(int argc, char **argv)
{
    struct opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    return kv_with_model(CMD, o.c.model, &o.c.kv, score, &o);
}
