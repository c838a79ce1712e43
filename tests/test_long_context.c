/* test_long_context.c - long context under memory limits: `kvq ppl` against
 * an independent NLL computation and the Hugging Face logits, the passkey
 * prompt format against the fixture prompts, KV budgets (never exceeded,
 * exhaustion is a clean stop that loses nothing, tq3j/tq3 holds >= 4x the
 * tokens of f16), and `kvq run --kv-budget` / `--plan`. */
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>

#include "kvq_cache.h"
#include "kvq_eval.h"
#include "kvq_model.h"
#include "kvq_safetensors.h"
#include "kvq_tokenizer.h"
#include "test.h"
#include "test_util.h"

int cmd_run(int argc, char **argv);
int cmd_ppl(int argc, char **argv);
int cmd_passkey(int argc, char **argv);

#define MODEL "models/kvq-tiny-llama"

static kvq_model *model;
static kvq_tokenizer *tok;
static kvq_st_file *ref;
static cJSON *ref_json;
static char tmp[64];
static char *out_text, *err_text;

/* Runs a subcommand in-process with stdout/stderr captured into
 * out_text / err_text (freed on the next call). */
static int run_cmd(int (*fn)(int, char **), const char *name, int argc, const char **args)
{
    char *argv[64];
    argv[0] = (char *)name;
    for (int i = 0; i < argc && i < 62; i++)
        argv[i + 1] = (char *)args[i];
    argv[argc + 1] = NULL;
    free(out_text);
    free(err_text);
    return test_run_captured(fn, argc + 1, argv, &out_text, &err_text);
}

static const cJSON *ref_case(const char *name)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(ref_json, "cases"))
    {
        if (strcmp(cJSON_GetObjectItem(c, "name")->valuestring, name) == 0)
            return c;
    }
    return NULL;
}

static int32_t *ref_ints(const char *name, const char *field, size_t *n)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", name, field);
    return test_st_ints(ref, key, n);
}

static kvq_seq *new_seq(enum kvq_type k, enum kvq_type v, size_t max_ctx, size_t budget, int chunk)
{
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.recent_f16 = 0; /* the plain paged cache; test_cache_window.c covers the window */
    sc.type_k = k;
    sc.type_v = v;
    sc.max_ctx = max_ctx;
    sc.kv_budget = budget;
    sc.max_chunk = chunk;
    kvq_seq *s = NULL;
    kvq_error err = {0};
    CHECKF(kvq_seq_create(model, &sc, &s, &err) == KVQ_OK, "%s", err.msg);
    return s;
}

/* log-sum-exp written out again here, so the tool's NLL is not checked
 * against itself. */
static double nll_of(const float *row, int vocab, int32_t target)
{
    double mx = row[0], sum = 0;
    for (int i = 1; i < vocab; i++)
        if (row[i] > mx)
            mx = row[i];
    for (int i = 0; i < vocab; i++)
        sum += exp((double)row[i] - mx);
    return mx + log(sum) - (double)row[target];
}

/* With an f32 cache, the chunked NLL at the reference positions equals
 * -log softmax of the Hugging Face logits there. */
static void test_ppl_matches_hf(void)
{
    const char *name = "valid_2";
    size_t n_ids, n_pos;
    int32_t *ids = ref_ints(name, "ids", &n_ids);
    int32_t *pos = ref_ints(name, "logit_positions", &n_pos);
    char key[128];
    snprintf(key, sizeof key, "%s.logits", name);
    const struct kvq_st_tensor *lt = kvq_st_find(ref, key);
    CHECK(ids && pos && lt && ids[0] == 1);
    if (!ids || !pos || !lt)
        return;
    int vocab = kvq_model_config_of(model)->vocab;
    float *hf = malloc(n_pos * (size_t)vocab * sizeof *hf);
    CHECK_OK(kvq_st_to_f32(lt, hf, n_pos * (size_t)vocab));
    kvq_seq *s = new_seq(KVQ_TYPE_F32, KVQ_TYPE_F32, 2048, 0, 100);
    double *nll = malloc(n_ids * sizeof *nll);
    struct kvq_ppl_result r;
    struct kvq_ppl_config pc;
    kvq_ppl_config_default(&pc); /* the model's BOS (ids[0]) starts the window */
    pc.ctx = 2048;
    pc.chunk = 100;
    CHECK_OK(kvq_ppl_score(model, s, &pc, ids + 1, n_ids - 1, nll, &r, NULL, NULL));
    CHECK(r.windows == 1 && r.scored == n_ids - 1);
    int checked = 0;
    for (size_t i = 0; i < n_pos; i++) {
        size_t p = (size_t)pos[i]; /* logits at p predict ids[p + 1] = text token p */
        if (p + 1 >= n_ids)
            continue;
        double want = nll_of(hf + i * (size_t)vocab, vocab, ids[p + 1]);
        CHECK_NEAR(nll[p], want, 2e-3);
        checked++;
    }
    CHECK(checked >= 3);
    free(nll);
    free(hf);
    free(ids);
    free(pos);
    kvq_seq_free(s);
}

/* Progress of one call of kvq_ppl_score: every chunk, monotone, ending at n. */
struct ppl_progress {
    size_t calls, last, n_total;
    int monotone;
};

static void ppl_progress(void *user, size_t done, size_t n_total, const struct kvq_ppl_result *sofar)
{
    struct ppl_progress *p = user;
    p->monotone &= done >= p->last && done <= n_total && sofar->scored > 0;
    p->last = done;
    p->n_total = n_total;
    p->calls++;
}

/* kvq_ppl_score's contract beyond the HF match: the token NLL equals the
 * log-sum-exp written out here, the defaults are the command's, progress is
 * reported per chunk, without a BOS the first token of every window is not
 * scored (NAN), and bad arguments are refused. */
static void test_ppl_api(void)
{
    struct kvq_ppl_config pc;
    kvq_ppl_config_default(&pc);
    CHECK(pc.ctx == 0 && pc.chunk == 256 && pc.add_bos == 1);
    const float row[5] = {0.5f, -1.0f, 3.0f, 2.5f, -7.0f};
    for (int t = 0; t < 5; t++)
        CHECK_NEAR(kvq_ppl_token_nll(row, 5, t), nll_of(row, 5, t), 1e-12);

    enum { N = 150 };
    int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = 10 + (i * 53) % 3000;
    kvq_seq *s = new_seq(KVQ_TYPE_F32, KVQ_TYPE_F32, 64, 0, 16);
    struct kvq_ppl_result r;
    struct ppl_progress p = {0, 0, 0, 1};
    double nll[N];
    pc.chunk = 16; /* ctx 0: the sequence's 64 */
    CHECK_OK(kvq_ppl_score(model, s, &pc, ids, N, nll, &r, ppl_progress, &p));
    /* 63 text tokens per window after BOS: 3 windows, every token scored */
    CHECK(r.windows == 3 && r.scored == N);
    CHECK(p.calls == 4 + 4 + 2 && p.monotone && p.last == N && p.n_total == N);
    CHECK_NEAR(r.ppl, exp(r.nll_sum / N), 1e-12);
    /* without BOS: 64 text tokens per window, the first of each not predicted */
    pc.add_bos = 0;
    CHECK_OK(kvq_ppl_score(model, s, &pc, ids, N, nll, &r, NULL, NULL));
    CHECK(r.windows == 3 && r.scored == N - 3);
    CHECK(isnan(nll[0]) && isnan(nll[64]) && isnan(nll[128]) && isfinite(nll[1]) && isfinite(nll[127]));
    pc.ctx = 65; /* more than the sequence holds */
    CHECK_STATUS(kvq_ppl_score(model, s, &pc, ids, N, NULL, &r, NULL, NULL), KVQ_ERR_INVALID_ARG);
    pc.ctx = 1;
    CHECK_STATUS(kvq_ppl_score(model, s, &pc, ids, N, NULL, &r, NULL, NULL), KVQ_ERR_INVALID_ARG);
    pc.ctx = 0;
    pc.chunk = 0;
    CHECK_STATUS(kvq_ppl_score(model, s, &pc, ids, N, NULL, &r, NULL, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_ppl_score(model, s, NULL, ids, N, NULL, &r, NULL, NULL), KVQ_ERR_INVALID_ARG);
    kvq_seq_free(s);
}

/* KL against a reference cache: analytic on two-token rows; 0 and full
 * top-1 agreement for the same cache type; for q4_0 the per-position KLs
 * reproduced here from the two sequences' logits. */
static void test_ppl_kl(void)
{
    const float a[2] = {0.0f, 0.0f}, b[2] = {(float)log(3.0), 0.0f};
    /* p = (1/2, 1/2), q = (3/4, 1/4): 1/2 ln(2/3) + 1/2 ln 2 */
    CHECK_NEAR(kvq_logits_kl(a, b, 2), 0.5 * log(2.0 / 3.0) + 0.5 * log(2.0), 1e-7);
    CHECK(kvq_logits_kl(a, a, 2) == 0.0);
    enum { N = 100 };
    int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = 10 + (i * 53) % 3000;
    struct kvq_ppl_config pc;
    kvq_ppl_config_default(&pc);
    pc.chunk = 16;
    kvq_seq *base = new_seq(KVQ_TYPE_F32, KVQ_TYPE_F32, 64, 0, 16), *same = new_seq(KVQ_TYPE_F32, KVQ_TYPE_F32, 64, 0, 16);
    kvq_seq *q4 = new_seq(KVQ_TYPE_Q4_0, KVQ_TYPE_Q4_0, 64, 0, 16);
    struct kvq_ppl_result r, r0;
    struct kvq_kl_result kl;
    CHECK_OK(kvq_ppl_kl(model, same, base, &pc, ids, N, &r, &kl, NULL, NULL));
    CHECK(kl.n == N && kl.mean == 0.0 && kl.max == 0.0 && kl.top1 == 1.0 && kl.ref_ppl == r.ppl);
    CHECK_OK(kvq_ppl_score(model, base, &pc, ids, N, NULL, &r0, NULL, NULL));
    CHECK_OK(kvq_ppl_kl(model, q4, base, &pc, ids, N, &r, &kl, NULL, NULL));
    CHECK(kl.n == N && kl.mean > 0 && kl.p99 <= kl.max && kl.mean <= kl.max && kl.top1 > 0.5 && kl.top1 <= 1.0);
    CHECK_NEAR(kl.ref_ppl, r0.ppl, 1e-9 * r0.ppl);
    /* the mean again from one window's logits (ids[0..63) after BOS) */
    const int V = kvq_model_config_of(model)->vocab;
    float *lr = malloc(64 * (size_t)V * sizeof *lr), *lq = malloc(64 * (size_t)V * sizeof *lq);
    int32_t win[64];
    win[0] = kvq_model_config_of(model)->bos_id;
    memcpy(win + 1, ids, 63 * sizeof *ids);
    kvq_seq_reset(base);
    kvq_seq_reset(q4);
    double sum = 0;
    for (int c0 = 0; c0 < 64 && lr && lq; c0 += 16) {
        CHECK_OK(kvq_seq_forward(base, win + c0, 16, 0, lr + (size_t)c0 * V, NULL));
        CHECK_OK(kvq_seq_forward(q4, win + c0, 16, 0, lq + (size_t)c0 * V, NULL));
    }
    for (int t = 0; t < 63 && lr && lq; t++)
        sum += kvq_logits_kl(lr + (size_t)t * V, lq + (size_t)t * V, V);
    struct kvq_kl_result k1;
    CHECK_OK(kvq_ppl_kl(model, q4, base, &pc, ids, 63, &r, &k1, NULL, NULL));
    CHECK_NEAR(k1.mean, sum / 63, 1e-12);
    CHECK_STATUS(kvq_ppl_kl(model, q4, NULL, &pc, ids, N, &r, &kl, NULL, NULL), KVQ_ERR_INVALID_ARG);
    free(lr);
    free(lq);
    kvq_seq_free(base);
    kvq_seq_free(same);
    kvq_seq_free(q4);
}

/* `kvq ppl --json` over several windows equals exp(mean NLL) from full
 * logits of each window computed here in one forward; it is deterministic
 * for a compressed cache. */
static void test_ppl_cmd(void)
{
    const char *text = cJSON_GetObjectItem(ref_case("valid_1"), "text")->valuestring;
    char path[96];
    snprintf(path, sizeof path, "%s/valid_1.txt", tmp);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    const size_t ctx = 256;
    const char *args[] = {"--model", MODEL, "--file", path, "--ctx", "256", "--chunk", "48", "--json",
                          "--cache-type-k", "f32", "--cache-type-v", "f32"};
    CHECK(run_cmd(cmd_ppl, "ppl", 13, args) == 0);
    cJSON *js = cJSON_Parse(out_text);
    CHECK(js != NULL);
    if (!js)
        return;
    double got = cJSON_GetObjectItem(js, "ppl")->valuedouble;
    size_t scored = (size_t)cJSON_GetObjectItem(js, "scored")->valuedouble;
    CHECK(strstr(err_text, "tokens, ppl so far") != NULL); /* progress on stderr */
    cJSON_Delete(js);

    int32_t *ids;
    size_t n;
    CHECK_OK(kvq_tokenizer_encode_alloc(tok, text, strlen(text), 0, &ids, &n));
    int vocab = kvq_model_config_of(model)->vocab;
    kvq_seq *s = new_seq(KVQ_TYPE_F32, KVQ_TYPE_F32, ctx, 0, 256);
    float *logits = malloc(ctx * (size_t)vocab * sizeof *logits);
    int32_t win[256];
    double sum = 0;
    size_t cnt = 0;
    for (size_t w0 = 0; w0 < n; w0 += ctx - 1) {
        size_t m = n - w0 < ctx - 1 ? n - w0 : ctx - 1;
        win[0] = 1;
        memcpy(win + 1, ids + w0, m * sizeof *ids);
        kvq_seq_reset(s);
        CHECK_OK(kvq_seq_forward(s, win, m + 1, 0, logits, NULL));
        for (size_t j = 0; j < m; j++, cnt++)
            sum += nll_of(logits + j * (size_t)vocab, vocab, win[j + 1]);
    }
    CHECK(n > 2 * ctx && cnt == n && scored == n);
    double want = exp(sum / (double)cnt);
    CHECKF(fabs(got / want - 1) < 1e-5, "ppl %.8f, independent %.8f", got, want);
    free(logits);
    free(ids);
    kvq_seq_free(s);

    /* determinism with the default compressed cache */
    const char *a2[] = {"--model", MODEL, "--file", path, "--ctx", "256", "--chunk", "48", "--json", "--quiet"};
    CHECK(run_cmd(cmd_ppl, "ppl", 10, a2) == 0);
    char *first = out_text;
    out_text = NULL;
    CHECK(run_cmd(cmd_ppl, "ppl", 10, a2) == 0);
    cJSON *j1 = cJSON_Parse(first), *j2 = cJSON_Parse(out_text);
    CHECK(j1 && j2 && cJSON_GetObjectItem(j1, "ppl")->valuedouble == cJSON_GetObjectItem(j2, "ppl")->valuedouble);
    CHECK(j1 && strcmp(cJSON_GetObjectItem(j1, "cache_type_v")->valuestring, "tq3") == 0);
    cJSON_Delete(j1);
    cJSON_Delete(j2);
    free(first);

    const char *bad[] = {"--model", MODEL, "--file", path, "--ctx", "9999"};
    CHECK(run_cmd(cmd_ppl, "ppl", 6, bad) == 2 && strstr(err_text, "exceeds the model's context"));
    const char *small[] = {"--model", MODEL, "--file", path, "--ctx", "256", "--kv-budget", "10KiB"};
    CHECK(run_cmd(cmd_ppl, "ppl", 8, small) == 2 && strstr(err_text, "--kv-budget holds only"));
}

/* The prompt builder reproduces the fixture passkey prompts exactly. */
static void test_passkey_prompt(void)
{
    const char *cases[] = {"passkey_1k", "passkey_3k"};
    const long keys[] = {86317, 5402917};
    const char *filler = "The grass is green.";
    for (int c = 0; c < 2; c++) {
        const char *want = cJSON_GetObjectItem(ref_case(cases[c]), "text")->valuestring;
        const char *at = strstr(want, "The pass key is");
        int a = 0, b = 0;
        for (const char *p = strstr(want, filler); p; p = strstr(p + 1, filler))
            *(p < at ? &a : &b) += 1;
        char *got = NULL;
        CHECK_OK(kvq_passkey_prompt_text(keys[c], a, b, &got));
        CHECKF(got && strcmp(got, want) == 0, "case %s (a=%d, b=%d)", cases[c], a, b);
        free(got);
    }
}

/* The prompt at a length fits it and is the longest that does, the check
 * wants the whole key, the defaults are the command's. */
static void test_passkey_api(void)
{
    struct kvq_passkey_config pk;
    kvq_passkey_config_default(&pk);
    CHECK(pk.n_lengths == 5 && pk.lengths[0] == 512 && pk.lengths[4] == 4000 && pk.trials == 10 &&
          pk.answer_tokens == 10 && pk.seed == 0);
    CHECK(kvq_passkey_ctx(&pk) == 4010);
    pk.n_lengths = 0;
    CHECK(kvq_passkey_ctx(&pk) == 0);

    char *t = NULL;
    CHECK_STATUS(kvq_passkey_prompt_text(1, -1, 0, &t), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_passkey_prompt_text(1, 0, 0, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_OK(kvq_passkey_prompt_text(123456, 2, 1, &t));
    CHECK(t && strstr(t, " The pass key is 123456. Remember it. 123456 is the pass key. "));
    free(t);

    int32_t *ids = NULL, *more = NULL;
    size_t n = 0, n2 = 0;
    CHECK_OK(kvq_passkey_prompt(tok, 86317, 0.3, 700, &ids, &n));
    CHECK(ids && n <= 700 && n > 700 - 45 && ids[0] == kvq_model_config_of(model)->bos_id);
    /* one more filler does not fit: the prompt with ~43 more tokens of room */
    CHECK_OK(kvq_passkey_prompt(tok, 86317, 0.3, n + 45, &more, &n2));
    CHECK(n2 > n && n2 <= n + 45);
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(kvq_tokenizer_decode_alloc(tok, ids, n, KVQ_DETOK_SKIP_CONTROL, &text, &len));
    CHECK(text && strstr(text, "86317 is the pass key") && strstr(text, "What is the pass key? The pass key is"));
    free(text);
    free(ids);
    free(more);
    CHECK_STATUS(kvq_passkey_prompt(tok, 86317, 0.3, 40, &ids, &n), KVQ_ERR_RANGE);
    CHECK(ids == NULL && n == 0);

    CHECK(kvq_passkey_check(" 86317.", 86317) && kvq_passkey_check("86317", 86317));
    CHECK(!kvq_passkey_check(" 863170", 86317) && !kvq_passkey_check(" 8631", 86317));
    CHECK(!kvq_passkey_check(" x86317", 86317) && !kvq_passkey_check(NULL, 86317));
}

static void passkey_progress(void *user, int li, const struct kvq_passkey_result *r)
{
    int *calls = user;
    CHECK(r->trials >= 1 && r->correct <= r->trials && li >= 0);
    (*calls)++;
}

/* kvq_passkey_run on an f32 cache: every key found, one progress call per
 * trial, the same prompts as `kvq passkey` (mean tokens), and the errors. */
static void test_passkey_run(void)
{
    struct kvq_passkey_config pk;
    kvq_passkey_config_default(&pk);
    pk.n_lengths = 2;
    pk.lengths[0] = 300;
    pk.lengths[1] = 700;
    pk.trials = 2;
    pk.seed = 5;
    kvq_seq *s = new_seq(KVQ_TYPE_F32, KVQ_TYPE_F32, kvq_passkey_ctx(&pk), 0, 0);
    struct kvq_passkey_result res[2];
    kvq_error err = {0};
    int calls = 0;
    CHECKF(kvq_passkey_run(s, tok, &pk, res, passkey_progress, &calls, &err) == KVQ_OK, "%s", err.msg);
    CHECK(calls == 4);
    for (int i = 0; i < 2; i++) {
        CHECK(res[i].length == pk.lengths[i] && res[i].trials == 2 && res[i].correct == 2);
        CHECK(res[i].tokens_sum / 2 <= (double)pk.lengths[i] && res[i].tokens_sum / 2 > (double)pk.lengths[i] - 45);
    }
    /* the same trials as the command's (test_passkey_cmd, seed 5) */
    const char *args[] = {"--model", MODEL, "--lengths", "300,700", "--trials", "2", "--seed", "5", "--json",
                          "--quiet", "--cache-type-k", "f32", "--cache-type-v", "f32"};
    CHECK(run_cmd(cmd_passkey, "passkey", 14, args) == 0);
    cJSON *js = cJSON_Parse(out_text);
    const cJSON *arr = cJSON_GetObjectItem(js, "lengths");
    for (int i = 0; i < 2 && cJSON_GetArraySize(arr) == 2; i++)
        CHECK(cJSON_GetObjectItem(cJSON_GetArrayItem(arr, i), "mean_tokens")->valuedouble == res[i].tokens_sum / 2);
    cJSON_Delete(js);
    pk.lengths[1] = 100; /* too short for the format */
    CHECK_STATUS(kvq_passkey_run(s, tok, &pk, res, NULL, NULL, &err), KVQ_ERR_RANGE);
    CHECK(strcmp(err.msg, "length 100 is too short for the prompt format") == 0);
    CHECK(res[0].trials == 2 && res[1].trials == 0);
    pk.lengths[1] = 2000; /* longer than the sequence holds */
    CHECK_STATUS(kvq_passkey_run(s, tok, &pk, res, NULL, NULL, &err), KVQ_ERR_INVALID_ARG);
    pk.trials = 0;
    CHECK_STATUS(kvq_passkey_run(s, tok, &pk, res, NULL, NULL, NULL), KVQ_ERR_INVALID_ARG);
    kvq_seq_free(s);
}

/* f32 retrieves every key (the model's documented ability), results are
 * reproducible and the JSON has the per-length fields. */
static void test_passkey_cmd(void)
{
    const char *args[] = {"--model", MODEL, "--lengths", "300,700", "--trials", "2", "--seed", "5", "--json",
                          "--cache-type-k", "f32", "--cache-type-v", "f32"};
    CHECK(run_cmd(cmd_passkey, "passkey", 13, args) == 0);
    cJSON *js = cJSON_Parse(out_text);
    CHECK(js != NULL);
    if (!js)
        return;
    const cJSON *arr = cJSON_GetObjectItem(js, "lengths"), *e;
    CHECK(cJSON_GetArraySize(arr) == 2);
    long want_len[] = {300, 700};
    int i = 0;
    cJSON_ArrayForEach(e, arr)
    {
        CHECK(cJSON_GetObjectItem(e, "length")->valuedouble == want_len[i]);
        double mt = cJSON_GetObjectItem(e, "mean_tokens")->valuedouble;
        CHECKF(mt <= want_len[i] && mt > want_len[i] - 45, "mean tokens %.1f for length %ld", mt, want_len[i]);
        CHECK(cJSON_GetObjectItem(e, "accuracy")->valuedouble == 1.0);
        i++;
    }
    cJSON_Delete(js);
    const char *bad[] = {"--model", MODEL, "--lengths", "100"};
    CHECK(run_cmd(cmd_passkey, "passkey", 4, bad) == 2 && strstr(err_text, "too short"));
    const char *bad2[] = {"--model", MODEL, "--lengths", "5000"};
    CHECK(run_cmd(cmd_passkey, "passkey", 4, bad2) == 2 && strstr(err_text, "exceeds the model's context"));
}

/* Planned bytes per token are the exact row bytes; at one budget tq3j/tq3
 * holds >= 4x the tokens of f16 - measured by filling real sequences. */
static void test_budget_ratio(void)
{
    const struct kvq_model_config *c = kvq_model_config_of(model);
    const size_t budget = 2u << 20;
    size_t held[2];
    enum kvq_type types[2][2] = {{KVQ_TYPE_F16, KVQ_TYPE_F16}, {KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3}};
    int32_t *ids = malloc(4096 * sizeof *ids);
    for (int i = 0; i < 4096; i++)
        ids[i] = 10 + (i * 37) % 3000;
    for (int t = 0; t < 2; t++) {
        struct kvq_seq_config sc;
        kvq_seq_config_default(&sc);
        sc.recent_f16 = 0; /* the ratio of the packed rows alone */
        sc.type_k = types[t][0];
        sc.type_v = types[t][1];
        sc.kv_budget = budget;
        struct kvq_seq_plan pl;
        CHECK_OK(kvq_seq_plan_of(model, &sc, &pl));
        size_t row = kvq_type_row_bytes(sc.type_k, c->head_dim) + kvq_type_row_bytes(sc.type_v, c->head_dim);
        CHECK(pl.bytes_per_token == row * (size_t)(c->n_layers * c->n_kv_heads));
        kvq_seq *s = new_seq(sc.type_k, sc.type_v, 0, budget, 0);
        /* fill 64 tokens at a time until the budget refuses */
        kvq_status st = KVQ_OK;
        while (st == KVQ_OK && kvq_seq_pos(s) + 64 <= 4096)
            st = kvq_seq_forward(s, ids + kvq_seq_pos(s), 64, 0, NULL, NULL);
        held[t] = kvq_seq_pos(s);
        CHECK(held[t] == pl.max_tokens);
        struct kvq_seq_stats ss;
        kvq_seq_get_stats(s, &ss);
        CHECK(ss.kv_bytes_alloc <= budget && ss.kv_budget == budget);
        kvq_seq_free(s);
    }
    CHECK(held[0] == 512); /* f16: 4096 bytes per token, 512 KiB per layer */
    CHECKF(held[1] >= 4 * held[0], "tq3j/tq3 holds %zu tokens, f16 %zu", held[1], held[0]);
    free(ids);
}

/* A tiny budget is never exceeded, a refused forward leaves the sequence as
 * it was, and generation stops cleanly with every token produced so far -
 * the same tokens an unlimited cache produces. */
static void test_budget_exhaustion(void)
{
    const size_t budget = 70000; /* 17500 bytes per layer: one 64-token tq3j/tq3 page each */
    kvq_seq *s = new_seq(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 0, budget, 0);
    int32_t ids[40];
    for (int i = 0; i < 40; i++)
        ids[i] = 100 + i * 7;
    struct kvq_seq_stats ss;
    size_t pos_before = 0;
    kvq_status st = KVQ_OK;
    for (int step = 0; step < 10 && st == KVQ_OK; step++) {
        pos_before = kvq_seq_pos(s);
        st = kvq_seq_forward(s, ids, 13, 12, NULL, NULL);
        kvq_seq_get_stats(s, &ss);
        CHECKF(ss.kv_bytes_alloc <= budget, "allocated %zu > budget %zu", ss.kv_bytes_alloc, budget);
    }
    CHECK_STATUS(st, KVQ_ERR_BUDGET);
    CHECK(kvq_seq_pos(s) == pos_before && pos_before == 52);
    CHECK_STATUS(kvq_seq_forward(s, ids, 13, 12, NULL, NULL), KVQ_ERR_BUDGET);
    CHECK(kvq_seq_pos(s) == 52);
    CHECK_OK(kvq_seq_forward(s, ids, 12, 11, NULL, NULL)); /* exactly fills the page */
    CHECK(kvq_seq_pos(s) == 64);
    kvq_seq_free(s);

    /* generation: stops at the budget with the tokens an unlimited cache makes */
    int32_t prompt[10] = {1, 450, 3791, 338, 7933, 29889, 450, 14744, 338, 7254};
    for (int i = 0; i < 10; i++)
        prompt[i] %= 4096;
    struct kvq_gen_params gp;
    kvq_gen_params_default(&gp);
    gp.max_tokens = 100;
    gp.stop_at_eos = 0;
    int32_t full[100], cut[100];
    size_t n_full = 0, n_cut = 0;
    kvq_seq *u = new_seq(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 0, 0, 0);
    CHECK_OK(kvq_seq_generate(u, prompt, 10, &gp, full, 100, &n_full, NULL, NULL));
    CHECK(n_full == 100);
    kvq_seq *b = new_seq(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 0, budget, 0);
    CHECK_STATUS(kvq_seq_generate(b, prompt, 10, &gp, cut, 100, &n_cut, NULL, NULL), KVQ_ERR_BUDGET);
    CHECK(n_cut == 64 - 10 + 1 && kvq_seq_pos(b) == 64); /* the last token is produced, not cached */
    CHECK(memcmp(full, cut, n_cut * sizeof *cut) == 0);
    kvq_seq_get_stats(b, &ss);
    CHECK(ss.kv_bytes_alloc <= budget);
    /* the prompt alone does not fit: nothing generated, sequence empty */
    kvq_seq_reset(b);
    int32_t longp[80];
    for (int i = 0; i < 80; i++)
        longp[i] = prompt[i % 10];
    CHECK_STATUS(kvq_seq_generate(b, longp, 80, &gp, cut, 100, &n_cut, NULL, NULL), KVQ_ERR_BUDGET);
    CHECK(n_cut == 0 && kvq_seq_pos(b) == 0);
    kvq_seq_free(u);
    kvq_seq_free(b);
}

/* `kvq run --kv-budget`: exit 3, the message and the text so far;
 * a prompt over the budget is exit 2; --plan prints every type. The
 * default recent-token window's f16 buffers (one page of rows, 64 KiB per
 * layer here) come out of the budget first; without the window 70000 bytes
 * hold one 64-token page per layer, and with it 330000 bytes do. */
static void test_run_budget(void)
{
    const char *args[] = {"--model", MODEL, "--prompt", "Emma Woodhouse, handsome, clever", "--max-tokens", "200",
                          "--no-eos", "--kv-budget", "70000", "--json", "--no-kv-recent-f16"};
    CHECK(run_cmd(cmd_run, "run", 11, args) == 3);
    CHECK(strstr(err_text, "stopped: the KV budget of 70000 bytes is full after 64 tokens") != NULL);
    cJSON *js = cJSON_Parse(out_text);
    CHECK(js && strcmp(cJSON_GetObjectItem(js, "stop_reason")->valuestring, "kv_budget") == 0);
    if (js) {
        size_t np = (size_t)cJSON_GetArraySize(cJSON_GetObjectItem(js, "prompt_ids"));
        CHECK((size_t)cJSON_GetArraySize(cJSON_GetObjectItem(js, "ids")) == 64 - np + 1);
        CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(js, "kv_bytes"), "allocated")->valuedouble <= 70000);
        CHECK(cJSON_GetObjectItem(js, "peak_rss_bytes")->valuedouble > 1e6);
        CHECK(strlen(cJSON_GetObjectItem(js, "text")->valuestring) > 20);
    }
    cJSON_Delete(js);
    const char *win[] = {"--model", MODEL, "--prompt", "Emma Woodhouse, handsome, clever", "--max-tokens", "200",
                         "--no-eos", "--kv-budget", "330000", "--json"};
    CHECK(run_cmd(cmd_run, "run", 10, win) == 3);
    CHECK(strstr(err_text, "stopped: the KV budget of 330000 bytes is full after 64 tokens") != NULL);
    js = cJSON_Parse(out_text);
    CHECK(js && cJSON_GetObjectItem(js, "recent_f16")->valueint == 1);
    if (js) {
        const cJSON *kv = cJSON_GetObjectItem(js, "kv_bytes");
        /* allocated counts the pages and the f16 buffers */
        CHECK(cJSON_GetObjectItem(kv, "allocated")->valuedouble <= 330000);
        CHECK(cJSON_GetObjectItem(kv, "f16_buffers")->valuedouble == 4 * 64 * 1024);
    }
    cJSON_Delete(js);
    const char *tiny[] = {"--model", MODEL, "--prompt", "Emma Woodhouse", "--kv-budget", "1000"};
    CHECK(run_cmd(cmd_run, "run", 6, tiny) == 2 && strstr(err_text, "holds only 0 tokens"));
    const char *plan[] = {"--model", MODEL, "--plan", "--kv-budget", "8MiB", "--no-kv-recent-f16"};
    CHECK(run_cmd(cmd_run, "run", 6, plan) == 0);
    CHECK(strstr(out_text, "f16/f16") && strstr(out_text, "tq3j/tq3*") && strstr(out_text, "4.31x"));
    const char *plan_win[] = {"--model", MODEL, "--plan", "--kv-budget", "8MiB"};
    CHECK(run_cmd(cmd_run, "run", 5, plan_win) == 0);
    CHECK(strstr(out_text, "f16/f16 ") && strstr(out_text, "tq3j/tq3+ctr+win*") && strstr(out_text, "4.16x"));
    const char *badb[] = {"--model", MODEL, "--plan", "--kv-budget", "lots"};
    CHECK(run_cmd(cmd_run, "run", 5, badb) == 2);
}

/* Per-layer types: uniform per-layer lists give bit-identical logits to the
 * plain config; mixed lists create the caches asked for, and a mixed budget
 * is split by bytes per token, never exceeded, and holds what the plan says. */
static void test_layer_types(void)
{
    const struct kvq_model_config *c = kvq_model_config_of(model);
    int vocab = c->vocab;
    int32_t ids[24];
    for (int i = 0; i < 24; i++)
        ids[i] = 5 + i * 131 % 4000;
    float *a = malloc(24 * (size_t)vocab * sizeof *a), *b = malloc(24 * (size_t)vocab * sizeof *b);
    enum kvq_type uni[2 * 64];
    for (int l = 0; l < c->n_layers; l++) {
        uni[2 * l] = KVQ_TYPE_TQ3J;
        uni[2 * l + 1] = KVQ_TYPE_TQ3;
    }
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.recent_f16 = 0; /* the budget split of the packed rows alone */
    kvq_seq *s1 = NULL, *s2 = NULL;
    CHECK_OK(kvq_seq_create(model, &sc, &s1, NULL));
    sc.layer_types = uni;
    CHECK_OK(kvq_seq_create(model, &sc, &s2, NULL));
    CHECK_OK(kvq_seq_forward(s1, ids, 24, 0, a, NULL));
    CHECK_OK(kvq_seq_forward(s2, ids, 24, 0, b, NULL));
    CHECK(memcmp(a, b, 24 * (size_t)vocab * sizeof *a) == 0);
    kvq_seq_free(s1);
    kvq_seq_free(s2);

    enum kvq_type mix[2 * 64];
    const enum kvq_type pick[4][2] = {{KVQ_TYPE_Q8_0, KVQ_TYPE_TQ3}, {KVQ_TYPE_TQ4J, KVQ_TYPE_TQ4},
                                      {KVQ_TYPE_F16, KVQ_TYPE_F16}, {KVQ_TYPE_TQ3J, KVQ_TYPE_TQ2}};
    size_t per_token = 0;
    for (int l = 0; l < c->n_layers; l++) {
        mix[2 * l] = pick[l % 4][0];
        mix[2 * l + 1] = pick[l % 4][1];
        per_token += (kvq_type_row_bytes(mix[2 * l], c->head_dim) + kvq_type_row_bytes(mix[2 * l + 1], c->head_dim)) *
                     (size_t)c->n_kv_heads;
    }
    sc.layer_types = mix;
    sc.kv_budget = 1u << 20;
    struct kvq_seq_plan pl;
    CHECK_OK(kvq_seq_plan_of(model, &sc, &pl));
    CHECK(pl.bytes_per_token == per_token);
    CHECK_OK(kvq_seq_create(model, &sc, &s1, NULL));
    for (int l = 0; l < c->n_layers; l++) {
        const struct kvq_cache_config *cc = kvq_cache_config_of(kvq_seq_cache(s1, l));
        CHECK(cc->type_k == mix[2 * l] && cc->type_v == mix[2 * l + 1]);
    }
    int32_t *many = malloc(4096 * sizeof *many);
    for (int i = 0; i < 4096; i++)
        many[i] = 7 + (i * 53) % 4000;
    kvq_status st = KVQ_OK;
    while (st == KVQ_OK && kvq_seq_pos(s1) + 64 <= 4096)
        st = kvq_seq_forward(s1, many + kvq_seq_pos(s1), 64, 0, NULL, NULL);
    CHECK_STATUS(st, KVQ_ERR_BUDGET);
    CHECK(kvq_seq_pos(s1) == pl.max_tokens);
    /* the proportional split lets every layer reach about the same length:
     * far more than an equal split would allow the f16 layer */
    CHECK(pl.max_tokens * per_token > (size_t)(0.8 * (double)sc.kv_budget));
    struct kvq_seq_stats ss;
    kvq_seq_get_stats(s1, &ss);
    CHECK(ss.kv_bytes_alloc <= sc.kv_budget);
    kvq_seq_free(s1);
    free(many);
    free(a);
    free(b);
}

static float *v_seen; /* layer 0 values as the model produced them */
static void grab_v(void *user, int layer, size_t pos0, size_t T, const float *q, const float *k, const float *v)
{
    (void)user, (void)q, (void)k;
    if (layer == 0)
        memcpy(v_seen + pos0 * 256, v, T * 256 * sizeof *v);
}

/* Value norm correction: decoded tq3 values keep the input norm (up to the
 * f16 rounding of the stored norm); without it they are shorter by about
 * sqrt(1 - D) with D the codebook's MSE (0.0345 for 3 bits). Keys untouched. */
static void test_v_norm_correct(void)
{
    const struct kvq_model_config *c = kvq_model_config_of(model);
    CHECK(c->n_kv_heads * c->head_dim == 256);
    v_seen = malloc(64 * 256 * sizeof *v_seen);
    float *row = malloc(64 * 128 * sizeof *row), *key = malloc(64 * 128 * sizeof *key);
    float *key0 = malloc(64 * 128 * sizeof *key0);
    int32_t ids[64];
    for (int i = 0; i < 64; i++)
        ids[i] = 30 + i * 71 % 4000;
    for (int corr = 0; corr < 2; corr++) {
        struct kvq_seq_config sc;
        kvq_seq_config_default(&sc);
        sc.v_norm_correct = corr;
        kvq_seq *s = NULL;
        CHECK_OK(kvq_seq_create(model, &sc, &s, NULL));
        kvq_seq_set_qkv_hook(s, grab_v, NULL);
        CHECK_OK(kvq_seq_forward(s, ids, 64, 63, NULL, NULL));
        double sum_ratio = 0, worst = 0;
        for (int g = 0; g < 2; g++) {
            CHECK_OK(kvq_cache_read(kvq_seq_cache(s, 0), g, 0, 64, corr ? key : key0, row));
            for (int t = 0; t < 64; t++) {
                double nx = 0, ny = 0;
                for (int i = 0; i < 128; i++) {
                    double x = v_seen[t * 256 + g * 128 + i], y = row[t * 128 + i];
                    nx += x * x;
                    ny += y * y;
                }
                double r = sqrt(ny / nx);
                sum_ratio += r;
                worst = fabs(r - 1) > worst ? fabs(r - 1) : worst;
            }
        }
        double mean = sum_ratio / 128;
        if (corr)
            CHECKF(worst < 1.5e-3, "corrected norm ratio off by %.2e", worst);
        else
            CHECKF(fabs(mean - sqrt(1 - 0.034548)) < 0.01, "uncorrected mean ratio %.4f", mean);
        kvq_seq_free(s);
    }
    /* both buffers end with KV head 1's keys: the correction leaves keys alone */
    CHECK(memcmp(key, key0, 64 * 128 * sizeof *key) == 0);
    free(v_seen);
    free(row);
    free(key);
    free(key0);
}

/* The library's defaults are the kvq command's: the recent-token window is
 * on for compressed types and off for f32/f16, unless set explicitly. */
static void test_window_default(void)
{
    const struct kvq_model_config *c = kvq_model_config_of(model);
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    CHECK(sc.recent_f16 == KVQ_WINDOW_AUTO && sc.type_k == KVQ_TYPE_TQ3J && sc.type_v == KVQ_TYPE_TQ3);
    CHECK(kvq_seq_window_for(&sc, c->n_layers) == 1);
    kvq_seq *s = NULL;
    CHECK_OK(kvq_seq_create(model, &sc, &s, NULL));
    CHECK(s && kvq_cache_config_of(kvq_seq_cache(s, 0))->recent_f16 == 1);
    kvq_seq_free(s);
    sc.type_k = sc.type_v = KVQ_TYPE_F32;
    CHECK(kvq_seq_window_for(&sc, c->n_layers) == 0);
    s = NULL;
    CHECK_OK(kvq_seq_create(model, &sc, &s, NULL));
    CHECK(s && kvq_cache_config_of(kvq_seq_cache(s, 0))->recent_f16 == 0);
    kvq_seq_free(s);
    enum kvq_type mixed[2 * 64];
    for (int l = 0; l < c->n_layers; l++)
        mixed[2 * l] = mixed[2 * l + 1] = l == c->n_layers - 1 ? KVQ_TYPE_Q8_0 : KVQ_TYPE_F16;
    sc.layer_types = mixed;
    CHECK(kvq_seq_window_for(&sc, c->n_layers) == 1);
    sc.recent_f16 = 0;
    CHECK(kvq_seq_window_for(&sc, c->n_layers) == 0);
    sc.recent_f16 = 2;
    CHECK_STATUS(kvq_seq_create(model, &sc, &s, NULL), KVQ_ERR_INVALID_ARG);
}

int main(void)
{
    snprintf(tmp, sizeof tmp, "/tmp/kvq_test_lc_XXXXXX");
    if (!mkdtemp(tmp))
        return 1;
    kvq_error err = {0};
    size_t len;
    char *js = test_read_file(MODEL "/reference/reference.json", &len);
    ref_json = js ? cJSON_Parse(js) : NULL;
    free(js);
    if (kvq_model_load(MODEL, NULL, &model, &err) != KVQ_OK ||
        kvq_tokenizer_create(MODEL "/tokenizer.json", &tok, &err) != KVQ_OK ||
        kvq_st_open(MODEL "/reference/reference.safetensors", &ref, &err) != KVQ_OK || !ref_json) {
        fprintf(stderr, "cannot load the fixtures: %s\n", err.msg);
        return 1;
    }
    RUN(test_ppl_matches_hf);
    RUN(test_ppl_api);
    RUN(test_ppl_kl);
    RUN(test_ppl_cmd);
    RUN(test_passkey_prompt);
    RUN(test_passkey_api);
    RUN(test_passkey_run);
    RUN(test_passkey_cmd);
    RUN(test_budget_ratio);
    RUN(test_budget_exhaustion);
    RUN(test_run_budget);
    RUN(test_layer_types);
    RUN(test_v_norm_correct);
    RUN(test_window_default);
    free(out_text);
    free(err_text);
    cJSON_Delete(ref_json);
    kvq_st_close(ref);
    kvq_tokenizer_free(tok);
    kvq_model_free(model);
    test_rm_dir(tmp);
    return TEST_END("test_long_context");
}
