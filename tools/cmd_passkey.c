/* cmd_passkey.c - `kvq passkey`: passkey-retrieval accuracy per prompt
 * length with the compressed KV cache.
 *
 * Prompts follow the format the bundled model was trained on
 * (models/kvq-tiny-llama/FIXTURES.md):
 *   INTRO + FILLER*a + KEY_SENTENCE + FILLER*b + QUESTION,  BOS first,
 * with a + b as large as fits the requested length in tokens, the depth
 * a / (a + b) and a 5-7 digit key drawn per trial from the seed (so every
 * cache type sees the same prompts). The greedy answer must start with the
 * key, not followed by another digit.
 */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv_auto.h"
#include "kv_opts.h"
#include "passkey_prompt.h"
#include "kvq_rng.h"

#define CMD "passkey"
#define MAX_LENGTHS 32
#define ANSWER_TOKENS 10 /* up to 7 digits (one token each), the full stop, slack */

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
    const char *model;
    long lengths[MAX_LENGTHS];
    int n_lengths;
    long trials;
    int json, quiet;
    struct kv_opts kv;
};

static int parse_lengths(const char *s, struct opts *o)
{
    o->n_lengths = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 64 || v > (1 << 24) || o->n_lengths == MAX_LENGTHS || (*end && *end != ','))
            return -1;
        o->lengths[o->n_lengths++] = v;
        s = *end ? end + 1 : end;
    }
    return o->n_lengths ? 0 : -1;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    memset(o, 0, sizeof *o);
    o->trials = 10;
    kv_opts_default(&o->kv);
    parse_lengths("512,1024,2048,3072,4000", o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) {
            usage(stdout);
            return -1;
        }
        if (kv_opts_flag(a, &o->kv))
            continue;
        if (strcmp(a, "--json") == 0 || strcmp(a, "--quiet") == 0) {
            *(a[2] == 'j' ? &o->json : &o->quiet) = 1;
            continue;
        }
        if (i + 1 >= argc)
            return cli_error(CMD, "%s needs a value (see kvq passkey --help)", a);
        const char *v = argv[++i];
        int r = kv_opts_parse(CMD, a, v, &o->kv), bad = 0;
        if (r == 2)
            return 2;
        if (r == 1)
            continue;
        if (strcmp(a, "--model") == 0)
            o->model = v;
        else if (strcmp(a, "--lengths") == 0)
            bad = parse_lengths(v, o);
        else if (strcmp(a, "--trials") == 0)
            bad = cli_parse_int(v, 1, 1 << 20, &o->trials);
        else
            return cli_error(CMD, "unknown option '%s' (see kvq passkey --help)", a);
        if (bad)
            return cli_error(CMD, "bad value '%s' for %s", v, a);
    }
    if (!o->model)
        return cli_error(CMD, "--model DIR is required");
    return 0;
}

/* Tokens (BOS included) of the prompt with n fillers at depth frac. */
static kvq_status build(const kvq_tokenizer *tok, long key, int n, double frac, int32_t **ids, size_t *n_ids)
{
    int a = (int)(frac * n + 0.5);
    char *t = passkey_prompt_text(key, a, n - a);
    if (!t)
        return KVQ_ERR_NOMEM;
    free(*ids);
    *ids = NULL;
    kvq_status st = kvq_tokenizer_encode_alloc(tok, t, strlen(t), 1, ids, n_ids);
    free(t);
    return st;
}

/* The largest prompt of at most len tokens. Tokens grow with the filler
 * count (each filler adds ~43), so step from an estimate. */
static kvq_status fit(const kvq_tokenizer *tok, long key, double frac, long len, int32_t **ids, size_t *n_ids)
{
    kvq_status st = build(tok, key, 0, frac, ids, n_ids);
    if (st != KVQ_OK)
        return st;
    size_t base = *n_ids;
    if ((long)base > len)
        return KVQ_ERR_RANGE;
    if ((st = build(tok, key, 1, frac, ids, n_ids)) != KVQ_OK)
        return st;
    size_t per = *n_ids - base;
    int n = (int)(((size_t)len - base) / (per ? per : 1));
    if ((st = build(tok, key, n, frac, ids, n_ids)) != KVQ_OK)
        return st;
    while (n > 0 && (long)*n_ids > len && (st = build(tok, key, --n, frac, ids, n_ids)) == KVQ_OK) {
    }
    return st;
}

static int is_correct(const char *answer, long key)
{
    char want[24];
    snprintf(want, sizeof want, "%ld", key);
    while (*answer == ' ')
        answer++;
    size_t k = strlen(want);
    return strncmp(answer, want, k) == 0 && !isdigit((unsigned char)answer[k]);
}

struct len_result {
    long length;
    long correct;
    double tokens_sum;
};

static int run_all(struct opts *o, kvq_model *m, kvq_tokenizer *tok, struct len_result *res)
{
    const struct kvq_model_config *c = kvq_model_config_of(m);
    long longest = 0;
    for (int i = 0; i < o->n_lengths; i++)
        longest = o->lengths[i] > longest ? o->lengths[i] : longest;
    if (longest + ANSWER_TOKENS > c->max_ctx)
        return cli_error(CMD, "length %ld plus %d answer tokens exceeds the model's context of %d", longest,
                         ANSWER_TOKENS, c->max_ctx);
    /* --kv-auto plans for the longest prompt and its answer (or --kv-auto-ctx) */
    int arc = kv_auto_apply(CMD, &o->kv, m, tok, o->model, (size_t)(longest + ANSWER_TOKENS), o->quiet);
    if (arc)
        return arc;
    struct kvq_seq_config sc;
    kv_opts_seq_config(&o->kv, &sc);
    sc.max_ctx = (size_t)(longest + ANSWER_TOKENS);
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
    struct kvq_gen_params gp;
    kvq_gen_params_default(&gp);
    gp.max_tokens = ANSWER_TOKENS;
    int32_t *ids = NULL, out[ANSWER_TOKENS];
    int rc = 0;
    double t0 = cli_now();
    for (int li = 0; li < o->n_lengths && !rc; li++) {
        res[li].length = o->lengths[li];
        for (long t = 0; t < o->trials && !rc; t++) {
            kvq_rng rng;
            kvq_rng_init(&rng, kvq_seed_derive(kvq_seed_derive(o->kv.seed, (uint64_t)o->lengths[li]), (uint64_t)t));
            int digits = 5 + (int)(kvq_rng_next(&rng) % 3);
            long lo = digits == 5 ? 10000 : digits == 6 ? 100000 : 1000000;
            long key = lo + (long)(kvq_rng_next(&rng) % (uint64_t)(9 * lo));
            double frac = kvq_rng_uniform(&rng);
            size_t n_ids = 0, n_out = 0, n_ans = 0;
            kvq_status st = fit(tok, key, frac, o->lengths[li], &ids, &n_ids);
            if (st == KVQ_OK) {
                kvq_seq_reset(s);
                st = kvq_seq_generate(s, ids, n_ids, &gp, out, ANSWER_TOKENS, &n_out, NULL, NULL);
            }
            char *answer = NULL;
            if (st == KVQ_OK)
                st = kvq_tokenizer_decode_alloc(tok, out, n_out, KVQ_DETOK_SKIP_CONTROL, &answer, &n_ans);
            if (st != KVQ_OK) {
                rc = st == KVQ_ERR_RANGE ? cli_error(CMD, "length %ld is too short for the prompt format",
                                                     o->lengths[li])
                                         : cli_status_error(CMD, st, "running a prompt");
                break;
            }
            res[li].correct += is_correct(answer, key);
            res[li].tokens_sum += (double)n_ids;
            if (!o->quiet)
                fprintf(stderr, "\rkvq passkey: length %ld trial %ld/%ld: %ld correct (%.0f s)   ", o->lengths[li],
                        t + 1, o->trials, res[li].correct, cli_now() - t0);
            free(answer);
        }
        if (!o->quiet)
            fputc('\n', stderr);
    }
    free(ids);
    kvq_seq_free(s);
    return rc;
}

static int report(const struct opts *o, const kvq_model *m, const struct len_result *res)
{
    char name[2048];
    kv_opts_name(&o->kv, name, sizeof name);
    if (!o->json) {
        printf("passkey  cache %s  seed %llu  %ld trials per length\n", name, (unsigned long long)o->kv.seed,
               o->trials);
        printf("%8s %12s %8s %9s\n", "length", "mean tokens", "correct", "accuracy");
        for (int i = 0; i < o->n_lengths; i++)
            printf("%8ld %12.1f %8ld %8.1f%%\n", res[i].length, res[i].tokens_sum / (double)o->trials, res[i].correct,
                   100.0 * (double)res[i].correct / (double)o->trials);
        return 0;
    }
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    cJSON_AddStringToObject(root, "cache", name);
    cJSON_AddStringToObject(root, "cache_type_k", kvq_type_traits(o->kv.tk)->name);
    cJSON_AddStringToObject(root, "cache_type_v", kvq_type_traits(o->kv.tv)->name);
    cJSON_AddNumberToObject(root, "recent_f16", kv_opts_window(&o->kv));
    cJSON_AddNumberToObject(root, "sink_tokens", o->kv.sink_tokens);
    cJSON_AddNumberToObject(root, "seed", (double)o->kv.seed);
    cJSON_AddNumberToObject(root, "trials", (double)o->trials);
    cJSON_AddItemToObject(root, "lengths", arr);
    kv_auto_json(root, &o->kv, m);
    for (int i = 0; i < o->n_lengths; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "length", (double)res[i].length);
        cJSON_AddNumberToObject(e, "mean_tokens", res[i].tokens_sum / (double)o->trials);
        cJSON_AddNumberToObject(e, "correct", (double)res[i].correct);
        cJSON_AddNumberToObject(e, "accuracy", (double)res[i].correct / (double)o->trials);
        cJSON_AddItemToArray(arr, e);
    }
    char *js = cJSON_PrintUnformatted(root);
    if (js)
        printf("%s\n", js);
    free(js);
    cJSON_Delete(root);
    return js ? 0 : cli_status_error(CMD, KVQ_ERR_NOMEM, "building JSON");
}

int cmd_passkey(int argc, char **argv)
{
    struct opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    kvq_model *m;
    kvq_tokenizer *tok;
    if ((rc = kv_load_model(CMD, o.model, &m, &tok)) != 0)
        return rc;
    if ((rc = kv_opts_check(CMD, &o.kv, m)) != 0) {
        kvq_tokenizer_free(tok);
        kvq_model_free(m);
        return rc;
    }
    struct len_result res[MAX_LENGTHS];
    memset(res, 0, sizeof res);
    rc = run_all(&o, m, tok, res);
    if (!rc)
        rc = report(&o, m, res);
    kvq_tokenizer_free(tok);
    kvq_model_free(m);
    return rc;
}
