/* cmd_passkey.c - `kvq passkey`: passkey-retrieval accuracy per prompt
 * length with the compressed KV cache (kvq_passkey_run, kvq_eval.h, says how
 * prompts are built, drawn and checked). The table or JSON goes to stdout,
 * progress to stderr.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv_auto.h"
#include "kv_opts.h"
#include "kvq_eval.h"

#define CMD "passkey"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvq passkey --model DIR [options]\n\n"
               "Passkey retrieval: for each length, TRIALS prompts of at most that many tokens\n"
               "with a random 5-7 digit key at a random depth; reports greedy accuracy.\n\n"
               "  --model DIR          model directory\n"
               "  --lengths L1,L2,...  prompt lengths in tokens (default 512,1024,2048,3072,4000)\n"
               "  --trials N           prompts per length (default 10)\n"
               "  --json               print one JSON object\n"
               "  --quiet              no progress on stderr\n"
               "  (--seed also picks the keys and depths)\n");
    kv_opts_usage(f);
}

struct opts {
    struct kv_cmd c;              /* --model, --json, --quiet, the KV options */
    struct kvq_passkey_config pk; /* lengths, trials; its seed is --seed */
    double t0;                    /* progress: when the trials started */
};

static int parse_lengths(const char *s, struct opts *o)
{
    struct kvq_passkey_config *pk = &o->pk;
    pk->n_lengths = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 64 || v > (1 << 24) || pk->n_lengths == KVQ_PASSKEY_MAX_LENGTHS || (*end && *end != ','))
            return -1;
        pk->lengths[pk->n_lengths++] = (size_t)v;
        s = *end ? end + 1 : end;
    }
    return pk->n_lengths ? 0 : -1;
}

/* The options of kvq passkey's own (kv_cmd_parse). */
static int own_option(void *user, const char *a, const char *v)
{
    struct opts *o = user;
    long trials = 0;
    if (strcmp(a, "--lengths") == 0)
        return parse_lengths(v, o) ? 1 : 0;
    if (strcmp(a, "--trials") != 0)
        return -1;
    if (cli_parse_int(v, 1, 1 << 20, &trials))
        return 1;
    o->pk.trials = (size_t)trials;
    return 0;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    memset(o, 0, sizeof *o);
    kvq_passkey_config_default(&o->pk);
    int rc = kv_cmd_parse(CMD, argc, argv, &o->c, usage, own_option, o);
    if (rc)
        return rc;
    if (!o->c.model)
        return cli_error(CMD, "--model DIR is required");
    return 0;
}

static void progress(void *user, int li, const struct kvq_passkey_result *r)
{
    const struct opts *o = user;
    (void)li; /* r says which length */
    if (o->c.quiet)
        return;
    fprintf(stderr, "\rkvq passkey: length %zu trial %zu/%zu: %zu correct (%.0f s)   ", r->length, r->trials,
            o->pk.trials, r->correct, cli_now() - o->t0);
    if (r->trials == o->pk.trials)
        fputc('\n', stderr);
}

static int run_all(struct opts *o, kvq_model *m, kvq_tokenizer *tok, struct kvq_passkey_result *res)
{
    const struct kvq_model_config *c = kvq_model_config_of(m);
    size_t need = kvq_passkey_ctx(&o->pk); /* the longest prompt and its answer */
    if (need > (size_t)c->max_ctx)
        return cli_error(CMD, "length %zu plus %zu answer tokens exceeds the model's context of %d",
                         need - o->pk.answer_tokens, o->pk.answer_tokens, c->max_ctx);
    /* --kv-auto plans for the longest prompt and its answer (or --kv-auto-ctx) */
    int arc = kv_auto_apply(CMD, &o->c.kv, m, tok, o->c.model, need, o->c.quiet);
    if (arc)
        return arc;
    struct kvq_seq_config sc;
    kv_opts_seq_config(&o->c.kv, &sc);
    sc.max_ctx = need;
    struct kvq_seq_plan pl;
    kvq_error err = {0};
    kvq_seq *s = NULL;
    if (kvq_seq_plan_of(m, &sc, &pl) != KVQ_OK || kvq_seq_create(m, &sc, &s, &err) != KVQ_OK)
        return cli_error(CMD, "%s", err.msg[0] ? err.msg : "unsupported cache type for this model");
    if (pl.max_tokens < sc.max_ctx) {
        kvq_seq_free(s);
        return cli_error(CMD, "--kv-budget holds only %zu tokens, the longest prompt needs %zu", pl.max_tokens,
                         sc.max_ctx);
    }
    o->pk.seed = o->c.kv.seed;
    o->t0 = cli_now();
    kvq_status st = kvq_passkey_run(s, tok, &o->pk, res, progress, o, &err);
    int rc = 0;
    if (st != KVQ_OK) {
        rc = st == KVQ_ERR_RANGE ? cli_error(CMD, "%s", err.msg) : cli_status_error(CMD, st, "running a prompt");
        if (!o->c.quiet)
            fputc('\n', stderr); /* the progress line of the length that failed still ends */
    }
    kvq_seq_free(s);
    return rc;
}

static int report(const struct opts *o, const kvq_model *m, const struct kvq_passkey_result *res)
{
    const double trials = (double)o->pk.trials;
    struct kvq_seq_config sc;
    kv_opts_seq_config(&o->c.kv, &sc);
    char name[2048];
    kv_opts_name(&o->c.kv, name, sizeof name);
    if (!o->c.json) {
        printf("passkey  cache %s  seed %llu  %zu trials per length\n", name, (unsigned long long)o->c.kv.seed,
               o->pk.trials);
        printf("%8s %12s %8s %9s\n", "length", "mean tokens", "correct", "accuracy");
        for (int i = 0; i < o->pk.n_lengths; i++)
            printf("%8zu %12.1f %8zu %8.1f%%\n", res[i].length, res[i].tokens_sum / trials, res[i].correct,
                   100.0 * (double)res[i].correct / trials);
        return 0;
    }
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    kv_opts_json(root, &o->c.kv);
    cJSON_AddNumberToObject(root, "recent_f16", kvq_seq_window_for(&sc, kvq_model_config_of(m)->n_layers));
    cJSON_AddNumberToObject(root, "sink_tokens", o->c.kv.sink_tokens);
    cJSON_AddNumberToObject(root, "seed", (double)o->c.kv.seed);
    cJSON_AddNumberToObject(root, "trials", trials);
    cJSON_AddItemToObject(root, "lengths", arr);
    kv_auto_json(root, &o->c.kv, m);
    for (int i = 0; i < o->pk.n_lengths; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "length", (double)res[i].length);
        cJSON_AddNumberToObject(e, "mean_tokens", res[i].tokens_sum / trials);
        cJSON_AddNumberToObject(e, "correct", (double)res[i].correct);
        cJSON_AddNumberToObject(e, "accuracy", (double)res[i].correct / trials);
        cJSON_AddItemToArray(arr, e);
    }
    return kv_print_json(CMD, root);
}

static int run_and_report(void *user, kvq_model *m, kvq_tokenizer *tok)
{
    struct opts *o = user;
    struct kvq_passkey_result res[KVQ_PASSKEY_MAX_LENGTHS];
    memset(res, 0, sizeof res);
    int rc = run_all(o, m, tok, res);
    return rc ? rc : report(o, m, res);
}

int cmd_passkey(int argc, char **argv)
{
    struct opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    return kv_with_model(CMD, o.c.model, &o.c.kv, run_and_report, &o);
}
