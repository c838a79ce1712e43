/* test_kv_auto.c - --kv-auto: the knapsack against brute force, the measured
 * errors deterministic, the choice within the budget and never worse for a
 * larger budget, the nll metric (exactly 0 for f32, the base NLL equal to an
 * independent one-shot forward, deterministic, masks), and the commands'
 * --kv-auto path end to end; the kvq_kv_auto handle against the step by step
 * API, with its progress and errors. */
#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq_eval.h"
#include "kvq_model.h"
#include "kvq_tokenizer.h"
#include "kvq_rng.h"
#include "test.h"
#include "test_util.h"

int cmd_ppl(int argc, char **argv);
int cmd_run(int argc, char **argv);

#define MODEL TEST_MODEL_DIR
#define CALIB 200

static kvq_model *model;
static kvq_tokenizer *tok;
static enum kvq_type cands[2 * KVQ_KV_AUTO_MAX_CANDS];
static int n_cands;
static double *errs;
static size_t *costs;

/* The least summed error of every combination with cost <= cap and only
 * finite errors, by enumeration (odometer over layers). @return NAN when
 * nothing fits. */
static double brute(int L, int N, const size_t *cost, const double *err, size_t cap)
{
    int idx[8] = {0}, found = 0;
    double best = NAN;
    for (;;) {
        size_t c = 0;
        double e = 0;
        int ok = 1;
        for (int l = 0; l < L; l++) {
            c += cost[l * N + idx[l]];
            e += err[l * N + idx[l]];
            ok &= isfinite(err[l * N + idx[l]]) != 0;
        }
        if (ok && c <= cap && (!found || e < best)) {
            best = e;
            found = 1;
        }
        int l = 0;
        while (l < L && ++idx[l] == N)
            idx[l++] = 0;
        if (l == L)
            return found ? best : NAN;
    }
}

/* Random tables (costs on a block grid like real rows), exact against brute force. */
static void test_choose_brute_force(void)
{
    kvq_rng r;
    kvq_rng_init(&r, 42);
    for (int trial = 0; trial < 40; trial++) {
        int L = 1 + (int)(kvq_rng_next(&r) % 4), N = 1 + (int)(kvq_rng_next(&r) % 7);
        size_t cost[4 * 7];
        double err[4 * 7];
        /* later trials: negative errors (an NLL increase can be < 0) and
         * excluded (infinite) options, as the nll metric produces */
        for (int i = 0; i < L * N; i++) {
            cost[i] = 16 * (1 + kvq_rng_next(&r) % 20);
            err[i] = kvq_rng_uniform(&r) - (trial >= 20 ? 0.5 : 0.0);
            if (trial >= 30 && kvq_rng_next(&r) % 4 == 0)
                err[i] = INFINITY;
        }
        int layer_empty = 0;
        for (int l = 0; l < L; l++) {
            int any = 0;
            for (int j = 0; j < N; j++)
                any |= isfinite(err[l * N + j]) != 0;
            layer_empty |= !any;
        }
        size_t cap = 16 * (size_t)(kvq_rng_next(&r) % (size_t)(20 * L + 4));
        int choice[4];
        double te = 0;
        size_t tc = 0;
        double want = brute(L, N, cost, err, cap);
        kvq_status st = kvq_kv_auto_knapsack(L, N, cost, err, cap, choice, &te, &tc);
        if (layer_empty) {
            CHECK(st == KVQ_ERR_INVALID_ARG);
            continue;
        }
        if (isnan(want)) {
            CHECK(st == KVQ_ERR_BUDGET);
            continue;
        }
        CHECK_OK(st);
        CHECK(tc <= cap);
        double e = 0;
        size_t c = 0;
        for (int l = 0; l < L; l++) {
            e += err[l * N + choice[l]];
            c += cost[l * N + choice[l]];
            CHECK(isfinite(err[l * N + choice[l]]));
        }
        CHECK(c == tc);
        CHECK_NEAR(e, te, 1e-12);
        CHECK_NEAR(te, want, 1e-12);
    }
    int choice[1];
    size_t c1 = 10;
    double e1 = 1;
    CHECK(kvq_kv_auto_knapsack(0, 1, &c1, &e1, 100, choice, NULL, NULL) == KVQ_ERR_INVALID_ARG);
}

static int32_t *calib_ids(size_t *n)
{
    size_t len = 0, nt = 0;
    int32_t *t = NULL;
    char *text = test_read_file(TEST_REF_DIR "/valid.txt", &len);
    if (!text || kvq_tokenizer_encode_alloc(tok, text, len, 0, &t, &nt) != KVQ_OK || nt < CALIB) {
        free(text);
        free(t);
        return NULL;
    }
    free(text);
    t[0] = kvq_model_config_of(model)->bos_id;
    *n = CALIB;
    return t;
}

/* Measured on the model: deterministic, and the real cache's costs. */
static void test_score_deterministic(void)
{
    const struct kvq_model_config *c = kvq_model_config_of(model);
    size_t n = 0;
    int32_t *ids = calib_ids(&n);
    CHECK(ids != NULL);
    if (!ids)
        return;
    size_t cells = (size_t)c->n_layers * (size_t)n_cands;
    double *e2 = malloc(cells * sizeof *e2);
    size_t *c2 = malloc(cells * sizeof *c2);
    kvq_error err = {0};
    CHECKF(kvq_kv_auto_score(model, ids, n, cands, n_cands, 0, 64, KVQ_KV_AUTO_OUT_ERR, errs, costs, &err) == KVQ_OK, "%s", err.msg);
    CHECK_OK(kvq_kv_auto_score(model, ids, n, cands, n_cands, 0, 64, KVQ_KV_AUTO_OUT_ERR, e2, c2, &err));
    CHECK(memcmp(errs, e2, cells * sizeof *e2) == 0);
    CHECK(kvq_kv_auto_score(model, ids, n, cands, n_cands, 0, 64, KVQ_KV_AUTO_NLL, e2, c2, &err) == KVQ_ERR_INVALID_ARG);
    CHECK(memcmp(costs, c2, cells * sizeof *c2) == 0);
    for (size_t i = 0; i < cells; i++)
        CHECK(errs[i] > 0 && errs[i] < 2);
    /* Layer cost of a pair, times the layers, is what the planner charges for it uniformly. */
    for (int j = 0; j < n_cands; j++) {
        struct kvq_seq_config sc;
        struct kvq_seq_plan pl;
        kvq_seq_config_default(&sc);
        sc.type_k = cands[2 * j];
        sc.type_v = cands[2 * j + 1];
        CHECK_OK(kvq_seq_plan_of(model, &sc, &pl));
        CHECK(costs[j] * (size_t)c->n_layers == pl.bytes_per_token);
    }
    /* More bits per layer should not raise the error: q8_0/q8_0 beats tq2/tq2. */
    int i88 = -1, i22 = -1;
    for (int j = 0; j < n_cands; j++) {
        const char *k = kvq_type_traits(cands[2 * j])->name, *v = kvq_type_traits(cands[2 * j + 1])->name;
        if (!strcmp(k, "q8_0") && !strcmp(v, "q8_0"))
            i88 = j;
        if (!strcmp(k, "tq2") && !strcmp(v, "tq2"))
            i22 = j;
    }
    CHECK(i88 >= 0 && i22 >= 0);
    for (int l = 0; l < c->n_layers && i88 >= 0 && i22 >= 0; l++)
        CHECK(errs[l * n_cands + i88] < errs[l * n_cands + i22]);
    free(ids);
    free(e2);
    free(c2);
}

/* Over the measured tables: fits, exact, monotone in the budget. */
static void test_choice_budget(void)
{
    int L = kvq_model_config_of(model)->n_layers;
    size_t lo = SIZE_MAX, hi = 0;
    for (int j = 0; j < n_cands; j++) {
        lo = costs[j] < lo ? costs[j] : lo;
        hi = costs[j] > hi ? costs[j] : hi;
    }
    CHECK(kvq_kv_auto_knapsack(L, n_cands, costs, errs, lo * (size_t)L - 1, (int[KVQ_KV_AUTO_MAX_LAYERS]){0}, NULL, NULL) ==
          KVQ_ERR_BUDGET);
    double prev = DBL_MAX;
    for (size_t cap = lo * (size_t)L; cap <= hi * (size_t)L + 64; cap += 48) {
        int choice[KVQ_KV_AUTO_MAX_LAYERS];
        double te;
        size_t tc;
        CHECK_OK(kvq_kv_auto_knapsack(L, n_cands, costs, errs, cap, choice, &te, &tc));
        CHECK(tc <= cap);
        CHECK(te <= prev);
        prev = te;
        if (L <= 4 && cap % 240 == lo * (size_t)L % 240)
            CHECK_NEAR(te, brute(L, n_cands, costs, errs, cap), 1e-12);
    }
}

#define NLL_TOKENS 128

/* The last NLL_TOKENS text tokens of valid.txt (no BOS), as --kv-auto
 * calibrates on the end of the file. */
static int32_t *nll_text(void)
{
    size_t len = 0, nt = 0;
    int32_t *t = NULL;
    char *text = test_read_file(TEST_REF_DIR "/valid.txt", &len);
    if (!text || kvq_tokenizer_encode_alloc(tok, text, len, 0, &t, &nt) != KVQ_OK || nt < NLL_TOKENS) {
        free(text);
        free(t);
        return NULL;
    }
    free(text);
    memmove(t, t + nt - NLL_TOKENS, NLL_TOKENS * sizeof *t);
    return t;
}

/* Mean NLL of text[0..n) after BOS from ONE forward of the whole window
 * (f32 cache, no chunks) with the log-softmax computed here: a reference
 * independent of kvq_ppl_score's chunked path. */
static double one_shot_nll(const int32_t *text, size_t n)
{
    const struct kvq_model_config *c = kvq_model_config_of(model);
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.type_k = sc.type_v = KVQ_TYPE_F32;
    sc.max_ctx = n + 1;
    sc.max_chunk = (int)(n + 1);
    kvq_seq *s = NULL;
    int32_t *w = malloc((n + 1) * sizeof *w);
    float *logits = malloc((n + 1) * (size_t)c->vocab * sizeof *logits);
    double sum = NAN;
    if (w && logits && kvq_seq_create(model, &sc, &s, NULL) == KVQ_OK) {
        w[0] = c->bos_id;
        memcpy(w + 1, text, n * sizeof *text);
        if (kvq_seq_forward(s, w, n + 1, 0, logits, NULL) == KVQ_OK) {
            sum = 0;
            for (size_t t = 0; t < n; t++) {
                const float *row = logits + t * (size_t)c->vocab;
                double mx = row[0], z = 0;
                for (int i = 1; i < c->vocab; i++)
                    mx = row[i] > mx ? row[i] : mx;
                for (int i = 0; i < c->vocab; i++)
                    z += exp((double)row[i] - mx);
                sum += mx + log(z) - (double)row[w[t + 1]];
            }
        }
    }
    kvq_seq_free(s);
    free(w);
    free(logits);
    return sum / (double)n;
}

/* The nll metric: f32/f32 costs exactly nothing, the base is the one-shot
 * NLL, the table is deterministic and masks skip cells, the choice fits. */
static void test_nll_metric(void)
{
    static const char *names[][2] = {{"f32", "f32"}, {"tq2", "tq2"}, {"tq3j", "tq3"}, {"tq4", "tq4"}, {"q8_0", "q8_0"}};
    enum { NC = 5 };
    enum kvq_type nc_types[2 * NC];
    for (int j = 0; j < NC; j++) {
        CHECK_OK(kvq_type_from_name(names[j][0], &nc_types[2 * j]));
        CHECK_OK(kvq_type_from_name(names[j][1], &nc_types[2 * j + 1]));
    }
    const struct kvq_model_config *c = kvq_model_config_of(model);
    int L = c->n_layers;
    int32_t *text = nll_text();
    CHECK(text != NULL && L <= 8);
    if (!text || L > 8)
        return;
    double e[8 * NC], e2[8 * NC], e3[8 * NC], base = 0, base2 = 0, again = 0;
    size_t cost[8 * NC], cost2[8 * NC];
    kvq_error err = {0};
    CHECKF(kvq_kv_auto_score_nll(model, text, NLL_TOKENS, 0, 0, nc_types, NC, NULL, &base, e, cost, &err) == KVQ_OK, "%s",
           err.msg);
    CHECK_OK(kvq_kv_auto_nll(model, text, NLL_TOKENS, 0, 0, NULL, &again, &err));
    CHECK(again == base);
    double ref = one_shot_nll(text, NLL_TOKENS);
    CHECK(base > 0.1 && base < 10);
    CHECK_NEAR(base, ref, 1e-4);
    double sum22 = 0, sum3j = 0, sum88 = 0;
    for (int l = 0; l < L; l++) {
        CHECK(e[l * NC + 0] == 0.0);                /* f32 in one layer is the f32 model */
        CHECK(fabs(e[l * NC + 4]) < 0.005);          /* q8_0 is near lossless */
        sum22 += e[l * NC + 1];
        sum3j += e[l * NC + 2];
        sum88 += e[l * NC + 4];
    }
    CHECK(sum22 > sum3j && sum3j > sum88);
    /* deterministic, costs as the planner's */
    CHECK_OK(kvq_kv_auto_score_nll(model, text, NLL_TOKENS, 0, 0, nc_types, NC, NULL, &base2, e2, cost2, &err));
    CHECK(base2 == base && memcmp(e, e2, sizeof(double) * (size_t)(L * NC)) == 0);
    CHECK(memcmp(cost, cost2, sizeof(size_t) * (size_t)(L * NC)) == 0);
    /* a mask measures only its cells, each bit-identical to the full table */
    unsigned char mask[8 * NC];
    for (int i = 0; i < L * NC; i++)
        mask[i] = (unsigned char)(i / NC == 1 && i % NC >= 2);
    CHECK_OK(kvq_kv_auto_score_nll(model, text, NLL_TOKENS, 0, 0, nc_types, NC, mask, NULL, e3, cost2, &err));
    for (int i = 0; i < L * NC; i++)
        CHECK(mask[i] ? e3[i] == e[i] : isinf(e3[i]));
    /* the choice at the bytes of uniform tq3j/tq3 fits, is exact, and is no
     * worse on the calibration than that uniform pair */
    size_t cap = (size_t)L * cost[2];
    int choice[8];
    double te = 0;
    size_t tc = 0;
    CHECK_OK(kvq_kv_auto_knapsack(L, NC, cost, e, cap, choice, &te, &tc));
    CHECK(tc <= cap);
    CHECK(te <= sum3j + 1e-15);
    CHECK_NEAR(te, brute(L, NC, cost, e, cap), 1e-12);
    /* a layer with nothing measured cannot be chosen for */
    CHECK(kvq_kv_auto_knapsack(L, NC, cost, e3, SIZE_MAX / 2, choice, NULL, NULL) == KVQ_ERR_INVALID_ARG);
    free(text);
}

static void count_progress(void *user, size_t done, size_t total)
{
    size_t *p = user; /* [calls, last done, total] */
    CHECK(done == p[1] + 1 && done <= total);
    p[0]++;
    p[1] = done;
    p[2] = total;
}

/* The metric names both ways, and the config defaults. */
static void test_metric_names(void)
{
    for (int i = 0; i < KVQ_KV_AUTO_N_METRICS; i++) {
        enum kvq_kv_auto_metric m = KVQ_KV_AUTO_N_METRICS;
        CHECK_OK(kvq_kv_auto_metric_from_name(kvq_kv_auto_metric_name(i), &m));
        CHECK((int)m == i);
    }
    CHECK(strcmp(kvq_kv_auto_metric_name(KVQ_KV_AUTO_NLL), "nll") == 0);
    CHECK(strcmp(kvq_kv_auto_metric_name(KVQ_KV_AUTO_IPV), "ipv") == 0);
    CHECK(kvq_kv_auto_metric_name(-1) == NULL && kvq_kv_auto_metric_name(KVQ_KV_AUTO_N_METRICS) == NULL);
    enum kvq_kv_auto_metric m;
    CHECK_STATUS(kvq_kv_auto_metric_from_name("mse", &m), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_kv_auto_metric_from_name(NULL, &m), KVQ_ERR_INVALID_ARG);
    struct kvq_kv_auto_config cfg;
    kvq_kv_auto_config_default(&cfg);
    CHECK(cfg.metric == KVQ_KV_AUTO_NLL && cfg.ctx == 0 && cfg.seq.kv_budget == 0 &&
          cfg.seq.recent_f16 == KVQ_WINDOW_AUTO);
}

/* The handle end to end with an attention metric: the calibration is BOS +
 * the end of the text, the measurement is kvq_kv_auto_score's, the choice is
 * the knapsack's over the budget less the window buffers and fits the plan. */
static void test_handle(void)
{
    const struct kvq_model_config *c = kvq_model_config_of(model);
    const int L = c->n_layers;
    struct kvq_kv_auto_config cfg;
    kvq_kv_auto_config_default(&cfg);
    kvq_kv_auto *a = NULL;
    kvq_error err = {0};
    CHECK_STATUS(kvq_kv_auto_create(model, &cfg, &a, &err), KVQ_ERR_INVALID_ARG); /* no budget */
    cfg.seq.kv_budget = 1000;
    cfg.ctx = 1024;
    cfg.metric = KVQ_KV_AUTO_OUT_ERR;
    CHECK_STATUS(kvq_kv_auto_create(model, &cfg, &a, &err), KVQ_ERR_BUDGET);
    CHECK(a == NULL);
    cfg.seq.kv_budget = 900000;
    CHECKF(kvq_kv_auto_create(model, &cfg, &a, &err) == KVQ_OK, "%s", err.msg);
    if (!a)
        return;
    struct kvq_kv_auto_choice ch;
    CHECK_STATUS(kvq_kv_auto_choose(a, &ch, &err), KVQ_ERR_INVALID_ARG); /* nothing measured */

    size_t len = 0, nt = 0, n = 0;
    int32_t *text = NULL, *ids = NULL;
    char *vt = test_read_file(TEST_REF_DIR "/valid.txt", &len);
    CHECK_OK(kvq_tokenizer_encode_alloc(tok, vt, len, 0, &text, &nt));
    free(vt);
    CHECK_STATUS(kvq_kv_auto_calib_ids(a, text, 10, &ids, &n), KVQ_ERR_RANGE);
    CHECK(ids == NULL && n == 11);
    CHECK_OK(kvq_kv_auto_calib_ids(a, text, nt, &ids, &n));
    CHECK(nt > KVQ_KV_AUTO_CALIB_TOKENS && n == KVQ_KV_AUTO_CALIB_TOKENS && ids[0] == c->bos_id);
    CHECK(memcmp(ids + 1, text + nt - (n - 1), (n - 1) * sizeof *ids) == 0);
    size_t prog[3] = {0, 0, 0};
    CHECKF(kvq_kv_auto_measure(a, ids, n, count_progress, prog, &err) == KVQ_OK, "%s", err.msg);
    CHECK(prog[0] == (size_t)(L * n_cands) && prog[1] == prog[2]);
    CHECK_OK(kvq_kv_auto_choose(a, &ch, &err));

    /* the same from the step by step API */
    size_t cells = (size_t)L * (size_t)n_cands;
    double *e = malloc(cells * sizeof *e);
    size_t *cost = malloc(cells * sizeof *cost);
    CHECK_OK(kvq_kv_auto_score(model, ids, n, cands, n_cands, 0, 128, KVQ_KV_AUTO_OUT_ERR, e, cost, &err));
    struct kvq_seq_config sc;
    struct kvq_seq_plan pl;
    kvq_seq_config_default(&sc);
    sc.type_k = cands[0];
    sc.type_v = cands[1];
    CHECK_OK(kvq_seq_plan_of(model, &sc, &pl)); /* the window's buffers: every candidate is compressed */
    CHECK(pl.fixed_bytes > 0);
    int choice[KVQ_KV_AUTO_MAX_LAYERS];
    double te = 0;
    size_t tc = 0;
    CHECK_OK(kvq_kv_auto_knapsack(L, n_cands, cost, e, (900000 - pl.fixed_bytes) / 1024, choice, &te, &tc));
    CHECK(ch.n_layers == L && ch.ctx == 1024 && ch.budget == 900000 && ch.metric == KVQ_KV_AUTO_OUT_ERR);
    CHECK(ch.n_cands == n_cands && ch.calib_tokens == n && isnan(ch.joint_err) && ch.base_nll == 0);
    CHECK(ch.total_err == te && ch.total_bytes == tc);
    size_t bytes = 0;
    for (int l = 0; l < L; l++) {
        CHECK(ch.layer_types[2 * l] == cands[2 * choice[l]] && ch.layer_types[2 * l + 1] == cands[2 * choice[l] + 1]);
        CHECK(ch.layer_err[l] == e[(size_t)l * (size_t)n_cands + (size_t)choice[l]]);
        bytes += ch.layer_bytes[l];
    }
    CHECK(bytes == ch.total_bytes);
    sc.layer_types = ch.layer_types;
    sc.kv_budget = 900000;
    sc.max_ctx = 1024;
    CHECK_OK(kvq_seq_plan_of(model, &sc, &pl));
    CHECK(pl.budget_tokens >= 1024);
    free(e);
    free(cost);
    free(ids);
    kvq_kv_auto_free(a);
    kvq_kv_auto_free(NULL);

    /* nll: one forward per cell plus the base, the joint measured */
    cfg.metric = KVQ_KV_AUTO_NLL;
    CHECK_OK(kvq_kv_auto_create(model, &cfg, &a, &err));
    CHECK_OK(kvq_kv_auto_calib_ids(a, text, 63, &ids, &n));
    CHECK(n == 64);
    memset(prog, 0, sizeof prog);
    CHECKF(kvq_kv_auto_measure(a, ids, n, count_progress, prog, &err) == KVQ_OK, "%s", err.msg);
    CHECK(prog[0] == (size_t)(L * n_cands) + 1);
    CHECK_OK(kvq_kv_auto_choose(a, &ch, &err));
    double base = 0;
    CHECK_OK(kvq_kv_auto_nll(model, ids + 1, n - 1, 0, 1, NULL, &base, &err));
    CHECK(ch.base_nll == base && isfinite(ch.joint_err) && ch.metric == KVQ_KV_AUTO_NLL);
    free(ids);
    free(text);
    kvq_kv_auto_free(a);
}

/* kvq ppl --kv-auto: JSON names the choice, the cache fits the budget, same
 * result twice; without --kv-budget it is refused. */
static void test_cmd_ppl(void)
{
    const char *args[] = {"--model", MODEL,     "--file", TEST_REF_DIR "/valid.txt", "--ctx", "1024", "--max-tokens",
                          "300",     "--kv-budget", "900000", "--kv-auto", "--kv-auto-metric", "out_err", "--json", "--quiet"};
    int na = (int)(sizeof args / sizeof *args);
    char *argv[20], *out = NULL, *out2 = NULL, *err = NULL;
    argv[0] = "ppl";
    for (int i = 0; i < na; i++)
        argv[i + 1] = (char *)args[i];
    CHECK(test_run_captured(cmd_ppl, na + 1, argv, &out, &err) == 0);
    free(err);
    CHECK(test_run_captured(cmd_ppl, na + 1, argv, &out2, &err) == 0);
    free(err);
    cJSON *j = out ? cJSON_Parse(out) : NULL, *j2 = out2 ? cJSON_Parse(out2) : NULL;
    /* the same choice and score both times (only "seconds" may differ) */
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(j, "cache"));
    const char *name2 = cJSON_GetStringValue(cJSON_GetObjectItem(j2, "cache"));
    CHECK(name && name2 && strcmp(name, name2) == 0);
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "ppl")) == cJSON_GetNumberValue(cJSON_GetObjectItem(j2, "ppl")));
    cJSON_Delete(j2);
    const cJSON *a = cJSON_GetObjectItem(j, "kv_auto"), *layers = cJSON_GetObjectItem(a, "layers");
    CHECK(a && cJSON_GetArraySize(layers) == kvq_model_config_of(model)->n_layers);
    double bits = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "bits_per_value"));
    const struct kvq_model_config *c = kvq_model_config_of(model);
    /* bytes per token at 1024 tokens within 900000 bytes */
    double bytes = bits / 8.0 * 2.0 * c->n_layers * c->n_kv_heads * c->head_dim;
    CHECK(bytes * 1024 <= 900000);
    /* every candidate is compressed: the default recent-token window is on, and
     * bits_per_value counts its f16 buffers, so the check above includes them */
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "recent_f16")) == 1);
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "f16_buffer_bytes")) > 0);
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "ppl")) > 1);
    cJSON_Delete(j);
    free(out);
    free(out2);
    out = NULL;

    /* the default metric (nll) on a short calibration file: the choice is named,
     * its errors are NLL increases, and the cache fits the budget */
    char calib[64];
    snprintf(calib, sizeof calib, "/tmp/kvq_test_kv_auto_%ld.txt", (long)getpid());
    size_t vlen = 0;
    char *vt = test_read_file(TEST_REF_DIR "/valid.txt", &vlen);
    CHECK(vt && vlen > 300 && test_write_file(calib, vt, 300) == 0);
    free(vt);
    const char *nll[] = {"ppl", "--model", MODEL, "--file", TEST_REF_DIR "/valid.txt", "--ctx", "1024",
                         "--max-tokens", "300", "--kv-budget", "900000", "--kv-auto", /* nll: the default metric */
                         "--kv-auto-calib", calib, "--json", "--quiet"};
    CHECK(test_run_captured(cmd_ppl, 16, (char **)nll, &out, &err) == 0);
    free(err);
    remove(calib);
    j = out ? cJSON_Parse(out) : NULL;
    a = cJSON_GetObjectItem(j, "kv_auto");
    layers = cJSON_GetObjectItem(a, "layers");
    CHECK(a && strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(a, "metric")), "nll") == 0);
    CHECK(cJSON_GetArraySize(layers) == c->n_layers);
    for (int l = 0; l < cJSON_GetArraySize(layers); l++)
        CHECK(isfinite(cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(layers, l), "err"))));
    bits = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "bits_per_value"));
    CHECK(bits / 8.0 * 2.0 * c->n_layers * c->n_kv_heads * c->head_dim * 1024 <= 900000);
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "ppl")) > 1);
    cJSON_Delete(j);
    free(out);

    const char *bad[] = {"ppl", "--model", MODEL, "--file", TEST_REF_DIR "/valid.txt", "--kv-auto"};
    CHECK(test_run_captured(cmd_ppl, 6, (char **)bad, &out, &err) == 2);
    CHECK(err && strstr(err, "--kv-auto needs --kv-budget"));
    free(out);
    free(err);
    const char *tiny[] = {"ppl", "--model", MODEL, "--file", TEST_REF_DIR "/valid.txt", "--ctx", "1024",
                          "--kv-budget", "1000", "--kv-auto"};
    CHECK(test_run_captured(cmd_ppl, 10, (char **)tiny, &out, &err) == 2);
    CHECK(err && strstr(err, "cannot hold"));
    free(out);
    free(err);
    const char *metric[] = {"ppl", "--model", MODEL, "--file", TEST_REF_DIR "/valid.txt", "--kv-budget", "1MiB",
                            "--kv-auto", "--kv-auto-metric", "mse"};
    CHECK(test_run_captured(cmd_ppl, 10, (char **)metric, &out, &err) == 2);
    CHECK(err && strstr(err, "--kv-auto-metric"));
    free(out);
    free(err);
}

int main(void)
{
    kvq_error err = {0};
    if (kvq_model_load(MODEL, NULL, &model, &err) != KVQ_OK ||
        kvq_tokenizer_create(MODEL "/tokenizer.json", &tok, &err) != KVQ_OK) {
        fprintf(stderr, "cannot load the model: %s\n", err.msg);
        return 1;
    }
    n_cands = kvq_kv_auto_candidates(cands, KVQ_KV_AUTO_MAX_CANDS);
    size_t cells = (size_t)kvq_model_config_of(model)->n_layers * (size_t)n_cands;
    errs = calloc(cells, sizeof *errs);
    costs = calloc(cells, sizeof *costs);
    RUN(test_choose_brute_force);
    RUN(test_score_deterministic);
    RUN(test_choice_budget);
    RUN(test_nll_metric);
    RUN(test_metric_names);
    RUN(test_handle);
    RUN(test_cmd_ppl);
    free(errs);
    free(costs);
    kvq_tokenizer_free(tok);
    kvq_model_free(model);
    return TEST_END("test_kv_auto");
}
