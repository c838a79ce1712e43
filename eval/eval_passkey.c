/* eval_passkey.c - passkey retrieval: the fixture's prompt format, trials
 * drawn from the seed, greedy answers checked (kvq_eval.h, "passkey"). */
#include "kvq_eval.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq_rng.h"

static const char INTRO[] = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
                            "it. I will quiz you about the important information there. ";
static const char FILLER[] = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";
static const char QUESTION[] = " What is the pass key? The pass key is";

void kvq_passkey_config_default(struct kvq_passkey_config *cfg)
{
    static const size_t lengths[] = {512, 1024, 2048, 3072, 4000};
    memset(cfg, 0, sizeof *cfg);
    cfg->n_lengths = (int)(sizeof lengths / sizeof *lengths);
    memcpy(cfg->lengths, lengths, sizeof lengths);
    cfg->trials = 10;
    cfg->answer_tokens = 10;
}

size_t kvq_passkey_ctx(const struct kvq_passkey_config *cfg)
{
    size_t longest = 0;
    for (int i = 0; cfg && i < cfg->n_lengths && i < KVQ_PASSKEY_MAX_LENGTHS; i++)
        longest = cfg->lengths[i] > longest ? cfg->lengths[i] : longest;
    return longest ? longest + cfg->answer_tokens : 0;
}

kvq_status kvq_passkey_prompt_text(long key, int n_before, int n_after, char **text)
{
    if (!text || n_before < 0 || n_after < 0)
        return KVQ_ERR_INVALID_ARG;
    *text = NULL;
    char sentence[160];
    snprintf(sentence, sizeof sentence, " The pass key is %ld. Remember it. %ld is the pass key. ", key, key);
    size_t fl = strlen(FILLER);
    size_t len = strlen(INTRO) + ((size_t)n_before + (size_t)n_after) * fl + strlen(sentence) + strlen(QUESTION) + 1;
    char *t = malloc(len), *p = t;
    if (!t)
        return KVQ_ERR_NOMEM;
    p += sprintf(p, "%s", INTRO);
    for (int i = 0; i < n_before; i++, p += fl)
        memcpy(p, FILLER, fl);
    p += sprintf(p, "%s", sentence);
    for (int i = 0; i < n_after; i++, p += fl)
        memcpy(p, FILLER, fl);
    sprintf(p, "%s", QUESTION);
    *text = t;
    return KVQ_OK;
}

/* Tokens (BOS included) of the prompt with n fillers at depth frac, into
 * *ids (the previous array freed). */
static kvq_status build(const kvq_tokenizer *tok, long key, int n, double frac, int32_t **ids, size_t *n_ids)
{
    int a = (int)(frac * n + 0.5);
    char *t = NULL;
    kvq_status st = kvq_passkey_prompt_text(key, a, n - a, &t);
    if (st != KVQ_OK)
        return st;
    free(*ids);
    *ids = NULL;
    st = kvq_tokenizer_encode_alloc(tok, t, strlen(t), 1, ids, n_ids);
    free(t);
    return st;
}

/* The largest prompt of at most len tokens. Tokens grow with the filler
 * count (each filler adds ~43), so step from an estimate. */
kvq_status kvq_passkey_prompt(const kvq_tokenizer *tok, long key, double depth, size_t length, int32_t **ids,
                              size_t *n_ids)
{
    if (!tok || !ids || !n_ids)
        return KVQ_ERR_INVALID_ARG;
    *ids = NULL;
    *n_ids = 0;
    kvq_status st = build(tok, key, 0, depth, ids, n_ids);
    size_t base = *n_ids;
    if (st == KVQ_OK && base > length)
        st = KVQ_ERR_RANGE;
    if (st == KVQ_OK)
        st = build(tok, key, 1, depth, ids, n_ids);
    if (st == KVQ_OK) {
        size_t per = *n_ids - base;
        int n = (int)((length - base) / (per ? per : 1));
        st = build(tok, key, n, depth, ids, n_ids);
        while (st == KVQ_OK && n > 0 && *n_ids > length)
            st = build(tok, key, --n, depth, ids, n_ids);
    }
    if (st != KVQ_OK) {
        free(*ids);
        *ids = NULL;
        *n_ids = 0;
    }
    return st;
}

int kvq_passkey_check(const char *answer, long key)
{
    if (!answer)
        return 0;
    char want[24];
    snprintf(want, sizeof want, "%ld", key);
    while (*answer == ' ')
        answer++;
    size_t k = strlen(want);
    return strncmp(answer, want, k) == 0 && !isdigit((unsigned char)answer[k]);
}

/* Trial t of a length: the key (5-7 digits) and its depth, from the seed. */
static void draw(uint64_t seed, size_t length, size_t t, long *key, double *depth)
{
    kvq_rng rng;
    kvq_rng_init(&rng, kvq_seed_derive(kvq_seed_derive(seed, (uint64_t)length), (uint64_t)t));
    int digits = 5 + (int)(kvq_rng_next(&rng) % 3);
    long lo = digits == 5 ? 10000 : digits == 6 ? 100000 : 1000000;
    *key = lo + (long)(kvq_rng_next(&rng) % (uint64_t)(9 * lo));
    *depth = kvq_rng_uniform(&rng);
}

kvq_status kvq_passkey_run(kvq_seq *s, const kvq_tokenizer *tok, const struct kvq_passkey_config *cfg,
                           struct kvq_passkey_result *res, kvq_passkey_progress_fn fn, void *user, kvq_error *err)
{
    if (!s || !tok || !cfg || !res || cfg->n_lengths < 1 || cfg->n_lengths > KVQ_PASSKEY_MAX_LENGTHS ||
        !cfg->trials || !cfg->answer_tokens)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "passkey: bad configuration");
    if (kvq_passkey_ctx(cfg) > kvq_seq_max_ctx(s))
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG,
                             "passkey: the sequence holds %zu tokens, the longest prompt and its answer need %zu",
                             kvq_seq_max_ctx(s), kvq_passkey_ctx(cfg));
    memset(res, 0, (size_t)cfg->n_lengths * sizeof *res);
    struct kvq_gen_params gp;
    kvq_gen_params_default(&gp);
    gp.max_tokens = (int)cfg->answer_tokens;
    int32_t *out = malloc(cfg->answer_tokens * sizeof *out), *ids = NULL;
    if (!out)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "passkey: out of memory");
    kvq_status st = KVQ_OK;
    for (int li = 0; li < cfg->n_lengths && st == KVQ_OK; li++) {
        struct kvq_passkey_result *r = &res[li];
        r->length = cfg->lengths[li];
        for (size_t t = 0; t < cfg->trials; t++) {
            long key;
            double depth;
            draw(cfg->seed, r->length, t, &key, &depth);
            size_t n_ids = 0, n_out = 0, n_ans = 0;
            char *answer = NULL;
            free(ids);
            st = kvq_passkey_prompt(tok, key, depth, r->length, &ids, &n_ids);
            if (st == KVQ_OK) {
                kvq_seq_reset(s);
                st = kvq_seq_generate(s, ids, n_ids, &gp, out, cfg->answer_tokens, &n_out, NULL, NULL);
            }
            if (st == KVQ_OK)
                st = kvq_tokenizer_decode_alloc(tok, out, n_out, KVQ_DETOK_SKIP_CONTROL, &answer, &n_ans);
            if (st != KVQ_OK) {
                if (st == KVQ_ERR_RANGE)
                    kvq_error_set(err, st, "length %zu is too short for the prompt format", r->length);
                else
                    kvq_error_set(err, st, "passkey: running a prompt: %s", kvq_status_str(st));
                break;
            }
            r->correct += (size_t)kvq_passkey_check(answer, key);
            r->tokens_sum += (double)n_ids;
            r->trials++;
            free(answer);
            if (fn)
                fn(user, li, r);
        }
    }
    free(ids);
    free(out);
    return st;
}
