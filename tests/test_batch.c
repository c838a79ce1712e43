/* test_batch.c - kvq_batch: sequences batched together compute exactly what
 * each computes alone (bitwise logits, greedy and seeded sampled tokens),
 * against a kvq_seq per sequence as the independent reference; the shared
 * page pool refuses a step that does not fit without changing anything, and
 * gives pages (and memory) back when a slot goes. The same comparisons on
 * sliding-window models (the bundled model declared Mistral with a 32-token
 * window; the Gemma 3 fixture: windows, sandwich norms, the attention
 * scale, local RoPE), which kvq_batch refused before. */
#include <stdint.h>
#include <unistd.h>

#include "kvq_batch.h"
#include "kvq_model.h"
#include "kvq_rng.h"
#include "kvq_sampler.h"
#include "test.h"
#include "test_fixture.h"

#define N_SEQS 4
/* How tokens are chosen: greedy, sampled on the host from the logits, or
 * drawn by the step where the logits are (kvq_batch_item.sampler). */
enum { GREEDY = 0, SAMPLED = 1, DRAWN = 2 };
#define GEN 10
#define CHUNK 256

static kvq_model *model;
static size_t prompt_len[N_SEQS] = {530, 37, 5, 300};
static size_t chunk = CHUNK; /* prefill chunk: kvq_seq's max_chunk, the batch's items */
static int32_t *prompts[N_SEQS];

struct run_out {
    int32_t tok[N_SEQS][GEN];
    float *logits[N_SEQS]; /* [GEN][vocab]: the logits each token was chosen from */
};

static void run_out_init(struct run_out *o)
{
    const size_t V = (size_t)kvq_model_config_of(model)->vocab;
    for (int i = 0; i < N_SEQS; i++)
        o->logits[i] = calloc(GEN * V, sizeof(float));
}

static void run_out_free(struct run_out *o)
{
    for (int i = 0; i < N_SEQS; i++)
        free(o->logits[i]);
}

static kvq_sampler *make_sampler(int i, int sampled)
{
    kvq_sampler_params p = kvq_sampler_params_default();
    if (sampled) {
        p.temperature = 0.9f;
        p.top_p = 0.95f;
        p.seed = 1000 + (uint64_t)i;
    }
    kvq_sampler *s = NULL;
    kvq_sampler_create(kvq_model_config_of(model)->vocab, &p, &s);
    return s;
}

/* Each sequence alone through kvq_seq: prefill (chunks of CHUNK), then one
 * token per forward. */
static void run_solo(const struct kvq_seq_config *sc, int sampled, struct run_out *o)
{
    const size_t V = (size_t)kvq_model_config_of(model)->vocab;
    for (int i = 0; i < N_SEQS; i++) {
        kvq_seq *s = NULL;
        CHECK_OK(kvq_seq_create(model, sc, &s, NULL));
        kvq_sampler *smp = make_sampler(i, sampled);
        if (!s || !smp)
            return;
        float *lg = o->logits[i];
        CHECK_OK(kvq_seq_forward(s, prompts[i], prompt_len[i], prompt_len[i] - 1, lg, NULL));
        for (int g = 0; g < GEN; g++) {
            CHECK_OK(kvq_sampler_sample(smp, lg + g * V, &o->tok[i][g]));
            if (g + 1 < GEN)
                CHECK_OK(kvq_seq_forward(s, &o->tok[i][g], 1, 0, lg + (g + 1) * V, NULL));
        }
        kvq_sampler_free(smp);
        kvq_seq_free(s);
    }
}

/* All sequences in one batch: sequence i joins at step 2 i; every step
 * carries a decode row for each sequence past its prompt, then the next
 * prompt chunks (CHUNK-aligned, as kvq_seq cuts them) that fit. */
static void run_batched(const struct kvq_seq_config *sc, int sampled, struct run_out *o)
{
    const size_t V = (size_t)kvq_model_config_of(model)->vocab;
    struct kvq_batch_config bc;
    kvq_batch_config_default(&bc);
    bc.seq = *sc;
    bc.max_seqs = N_SEQS;
    bc.max_rows = (int)chunk + N_SEQS;
    kvq_batch *b = NULL;
    kvq_error err = {0};
    CHECK_OK(kvq_batch_create(model, &bc, &b, &err));
    if (!b) {
        fprintf(stderr, "  %s\n", err.msg);
        return;
    }
    int slot[N_SEQS], gen[N_SEQS] = {0}, joined = 0;
    size_t done[N_SEQS] = {0};
    kvq_sampler *smp[N_SEQS];
    for (int i = 0; i < N_SEQS; i++)
        smp[i] = make_sampler(i, sampled);
    int32_t argmax[N_SEQS];
    for (int step = 0; step < 200; step++) {
        if (joined < N_SEQS && step == 2 * joined)
            CHECK_OK(kvq_batch_add(b, &slot[joined++]));
        struct kvq_batch_item items[N_SEQS];
        int n = 0;
        size_t rows = 0;
        for (int i = 0; i < joined; i++)
            if (done[i] == prompt_len[i] && gen[i] > 0 && gen[i] < GEN) {
                items[n] = (struct kvq_batch_item){slot[i], &o->tok[i][gen[i] - 1], 1, o->logits[i] + gen[i] * V,
                                                   &argmax[i], NULL, NULL, 0};
                if (sampled == DRAWN)
                    items[n] = (struct kvq_batch_item){slot[i], &o->tok[i][gen[i] - 1], 1, NULL, NULL, smp[i],
                                                       &o->tok[i][gen[i]], 0};
                rows++, n++;
            }
        for (int i = 0; i < joined; i++)
            if (done[i] < prompt_len[i]) {
                size_t c = prompt_len[i] - done[i] < chunk ? prompt_len[i] - done[i] : chunk;
                if (c > bc.max_rows - rows)
                    continue;
                int last = done[i] + c == prompt_len[i];
                items[n] = (struct kvq_batch_item){slot[i], prompts[i] + done[i], c, last ? o->logits[i] : NULL,
                                                   NULL, NULL, NULL, 0};
                if (sampled == DRAWN)
                    items[n] = (struct kvq_batch_item){slot[i], prompts[i] + done[i], c, NULL, NULL,
                                                       last ? smp[i] : NULL, last ? &o->tok[i][0] : NULL, 0};
                n++;
                rows += c;
            }
        if (n == 0) {
            if (joined == N_SEQS)
                break;
            continue;
        }
        CHECK_OK(kvq_batch_step(b, items, n, &err));
        for (int k = 0; k < n; k++) {
            int i = 0;
            while (slot[i] != items[k].slot)
                i++;
            if (done[i] < prompt_len[i])
                done[i] += items[k].n;
            if (done[i] == prompt_len[i] && items[k].sampler) {
                gen[i]++; /* the step drew the token */
            } else if (done[i] == prompt_len[i] && (items[k].logits || items[k].argmax)) {
                CHECK_OK(kvq_sampler_sample(smp[i], o->logits[i] + gen[i] * V, &o->tok[i][gen[i]]));
                if (!sampled) /* the step's own greedy token agrees */
                    CHECK(items[k].argmax == NULL || *items[k].argmax == o->tok[i][gen[i]]);
                gen[i]++;
            }
        }
    }
    for (int i = 0; i < N_SEQS; i++) {
        CHECK(gen[i] == GEN);
        CHECK(kvq_batch_len(b, slot[i]) == prompt_len[i] + GEN - 1);
        kvq_sampler_free(smp[i]);
    }
    kvq_batch_free(b);
}

/* Bitwise on the CPU. On the GPU cuBLAS may sum a row in an order that
 * depends on the batch, so there the greedy tokens must agree and the
 * logits are reported (largest relative difference) and held to 1e-3. */
static void compare(const struct kvq_seq_config *sc, int sampled)
{
    const size_t V = (size_t)kvq_model_config_of(model)->vocab;
    struct run_out solo, batched;
    run_out_init(&solo);
    run_out_init(&batched);
    run_solo(sc, sampled, &solo);
    run_batched(sc, sampled, &batched);
    for (int i = 0; i < N_SEQS; i++) {
        CHECKF(memcmp(solo.tok[i], batched.tok[i], sizeof solo.tok[i]) == 0, "sequence %d: tokens differ", i);
        if (sampled == DRAWN) /* no logits came back */
            continue;
        if (sc->device == KVQ_DEVICE_CPU) {
            CHECKF(memcmp(solo.logits[i], batched.logits[i], GEN * V * sizeof(float)) == 0,
                   "sequence %d: logits differ bitwise", i);
            continue;
        }
        double num = 0, den = 0;
        for (size_t j = 0; j < GEN * V; j++) {
            double d = (double)solo.logits[i][j] - batched.logits[i][j];
            num = fmax(num, fabs(d));
            den = fmax(den, fabs((double)solo.logits[i][j]));
        }
        printf("  cuda sequence %d: max |logit diff| / max |logit| = %.3g\n", i, den > 0 ? num / den : 0);
        CHECKF(num <= 1e-3 * den, "sequence %d: logits differ by %.3g of %.3g", i, num, den);
    }
    run_out_free(&solo);
    run_out_free(&batched);
}

/* tq3j/tq3 with the recent f16 window (the default), greedy. */
static void test_greedy_identical_compressed(void)
{
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    compare(&sc, GREEDY);
}

/* tq3j/tq3 with the window and key centering: pages whose keys are encoded
 * when they fill, alone and batched. */
static void test_greedy_identical_centred(void)
{
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.center_k = 1;
    compare(&sc, GREEDY);
}

/* f32 cache (no window), greedy: the same with sgemm chunks and the plain append. */
static void test_greedy_identical_f32(void)
{
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.type_k = sc.type_v = KVQ_TYPE_F32;
    compare(&sc, GREEDY);
}

/* Seeded sampling: the same draws alone and batched, from host logits and
 * drawn by the step. */
static void test_sampled_identical(void)
{
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    compare(&sc, SAMPLED);
    compare(&sc, DRAWN);
}

/* The same on the GPU: types k/v, the window as the kvq command sets it;
 * chosen as compare() takes it. */
static void on_cuda_centred(enum kvq_type k, enum kvq_type v, int sampled, int center)
{
    struct kvq_batch_config bc;
    kvq_batch_config_default(&bc);
    bc.seq.device = KVQ_DEVICE_CUDA;
    bc.seq.fast_prefill = 0; /* exact products: the comparisons are against f32 references */
    bc.seq.type_k = k;
    bc.seq.type_v = v;
    bc.seq.center_k = center;
    kvq_batch *b = NULL;
    kvq_error err = {0};
    kvq_status st = kvq_batch_create(model, &bc, &b, &err);
    kvq_batch_free(b);
    if (st == KVQ_ERR_NO_DEVICE || st == KVQ_ERR_UNSUPPORTED)
        SKIP("no CUDA device or build: %s", err.msg);
    CHECK_OK(st);
    compare(&bc.seq, sampled);
}

static void on_cuda(enum kvq_type k, enum kvq_type v, int sampled)
{
    on_cuda_centred(k, v, sampled, 0);
}

static void test_greedy_cuda(void)
{
    on_cuda(KVQ_TYPE_F16, KVQ_TYPE_F16, GREEDY);
}

/* tq3j/tq3 with the recent f16 window: the device's f16 rows, batched. */
static void test_greedy_cuda_compressed(void)
{
    on_cuda(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, GREEDY);
}

/* ... and with key centering: pages packed when they fill, by the step. */
static void test_greedy_cuda_centred(void)
{
    on_cuda_centred(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, GREEDY, 1);
}

/* Tokens drawn on the device in the step against host draws from each
 * sequence's own logits (which differ from the batch's by ~1e-6). */
static void test_sampled_cuda(void)
{
    on_cuda(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, DRAWN);
}

/* Seeded random prompts of prompt_len[] tokens (malloc'd into prompts[]). */
static void make_prompts(uint64_t seed)
{
    kvq_rng rng;
    kvq_rng_init(&rng, seed);
    for (int i = 0; i < N_SEQS; i++) {
        prompts[i] = malloc(prompt_len[i] * sizeof(int32_t));
        for (size_t t = 0; t < prompt_len[i]; t++)
            prompts[i][t] = (int32_t)(kvq_rng_next(&rng) % (uint64_t)kvq_model_config_of(model)->vocab);
    }
}

/* compare() on the model in dir with prompts of lens[] tokens prefilled in
 * chunks of ch: greedy over the default compressed types (the recent
 * window on) and over f32, sampled on the host and drawn by the step. */
static void compare_on(const char *dir, const size_t *lens, size_t ch)
{
    kvq_model *keep = model, *m = NULL;
    size_t keep_len[N_SEQS];
    int32_t *keep_prompts[N_SEQS];
    kvq_error err = {0};
    CHECKF(kvq_model_load(dir, NULL, &m, &err) == KVQ_OK, "%s: %s", dir, err.msg);
    if (!m)
        return;
    /* the window is on (else this compares nothing new): no sharing */
    struct kvq_batch_config bc;
    kvq_batch_config_default(&bc);
    kvq_batch *b = NULL;
    CHECK_OK(kvq_batch_create(m, &bc, &b, NULL));
    struct kvq_batch_stats bs;
    kvq_batch_get_stats(b, &bs);
    CHECK(b && !bs.can_share && !bs.can_rollback);
    kvq_batch_free(b);
    memcpy(keep_len, prompt_len, sizeof keep_len);
    memcpy(keep_prompts, prompts, sizeof keep_prompts);
    model = m;
    chunk = ch;
    memcpy(prompt_len, lens, sizeof prompt_len);
    make_prompts(11);
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.max_chunk = (int)ch;
    compare(&sc, GREEDY);
    compare(&sc, SAMPLED);
    compare(&sc, DRAWN);
    sc.type_k = sc.type_v = KVQ_TYPE_F32;
    compare(&sc, GREEDY);
    for (int i = 0; i < N_SEQS; i++)
        free(prompts[i]);
    model = keep;
    chunk = CHUNK;
    memcpy(prompt_len, keep_len, sizeof prompt_len);
    memcpy(prompts, keep_prompts, sizeof prompts);
    kvq_model_free(m);
}

/* Mistral with a 32-token window over prompts of up to 530 tokens (16x the
 * window, chunks of 256 longer than it). */
static void test_window_mistral(void)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/kvq_batch_win32_%d", (int)getpid());
    cJSON *cfg = test_model_config();
    if (!cfg)
        return;
    cJSON_ReplaceItemInObject(cfg, "model_type", cJSON_CreateString("mistral"));
    cJSON_DeleteItemFromObject(cfg, "sliding_window");
    cJSON_AddNumberToObject(cfg, "sliding_window", 32);
    test_model_variant(dir, cfg);
    static const size_t lens[N_SEQS] = {530, 37, 5, 300};
    compare_on(dir, lens, CHUNK);
    test_rm_dir(dir);
}

/* Gemma 3 (tests/models/gemma3_text: 8-token windows on alternate layers,
 * a 256-token context), chunks of 64. */
static void test_gemma3(void)
{
    static const size_t lens[N_SEQS] = {150, 37, 5, 90};
    compare_on("tests/models/gemma3_text", lens, 64);
}

/* A verify item (n_out > 1: a pending token and its drafts) gives each row
 * the greedy token plain decoding gives there, batched with a plain decode
 * row: drafts that continue greedily all come back, and after a wrong one
 * (rolled back) decoding goes on as before. */
static void test_verify_rows(void)
{
    struct kvq_batch_config bc;
    kvq_batch_config_default(&bc);
    bc.max_seqs = 2;
    kvq_batch *b = NULL;
    kvq_error err = {0};
    CHECK_OK(kvq_batch_create(model, &bc, &b, &err));
    if (!b)
        return;
    enum { K = 9, G = 14 };
    const size_t n = prompt_len[1];
    int s0, s1;
    int32_t plain[G], got[K];
    CHECK_OK(kvq_batch_add(b, &s0));
    CHECK_OK(kvq_batch_add(b, &s1));
    struct kvq_batch_item it[2] = {{s0, prompts[1], n, NULL, &plain[0], NULL, NULL, 0},
                                   {s1, prompts[1], n, NULL, &got[0], NULL, NULL, 0}};
    CHECK_OK(kvq_batch_step(b, it, 2, &err));
    CHECK(got[0] == plain[0]);
    for (int g = 1; g < G; g++) { /* slot s0: one token a step */
        it[0] = (struct kvq_batch_item){s0, &plain[g - 1], 1, NULL, &plain[g], NULL, NULL, 0};
        CHECK_OK(kvq_batch_step(b, it, 1, &err));
    }
    /* slot s1: the pending plain[0] and drafts plain[1..K) in one pass, next to
     * a decode row of s0 */
    int32_t more;
    it[0] = (struct kvq_batch_item){s0, &plain[G - 1], 1, NULL, &more, NULL, NULL, 0};
    it[1] = (struct kvq_batch_item){s1, plain, K, NULL, got, NULL, NULL, K};
    CHECK_OK(kvq_batch_step(b, it, 2, &err));
    CHECKF(memcmp(got, plain + 1, sizeof got) == 0, "verified tokens differ from plain decoding");
    /* a wrong draft at 3: rows 0..2 agree, row 3 still gives plain[4] */
    CHECK_OK(kvq_batch_truncate(b, s1, n)); /* back to the pending plain[0] */
    int32_t ids[K];
    memcpy(ids, plain, sizeof ids);
    ids[3] = (plain[3] + 1) % kvq_model_config_of(model)->vocab;
    it[1] = (struct kvq_batch_item){s1, ids, K, NULL, got, NULL, NULL, K};
    CHECK_OK(kvq_batch_step(b, &it[1], 1, &err));
    CHECK(got[0] == plain[1] && got[1] == plain[2] && got[2] == plain[3]);
    CHECK_OK(kvq_batch_truncate(b, s1, n + 3)); /* keep plain[0..3): plain[3] is next */
    it[1] = (struct kvq_batch_item){s1, &plain[3], 1, NULL, &got[0], NULL, NULL, 0};
    CHECK_OK(kvq_batch_step(b, &it[1], 1, &err));
    CHECK(got[0] == plain[4]);
    /* sampled: the same with a sampler each (one seed): row j of the verify
     * pass draws at the j-th next uniform, so it gives the token plain
     * drawing gives there, and the step leaves the RNG to the caller */
    kvq_sampler *sa = make_sampler(5, 1), *sb = make_sampler(5, 1);
    kvq_batch_remove(b, s0);
    kvq_batch_remove(b, s1);
    CHECK_OK(kvq_batch_add(b, &s0));
    CHECK_OK(kvq_batch_add(b, &s1));
    it[0] = (struct kvq_batch_item){s0, prompts[1], n, NULL, NULL, sa, &plain[0], 0};
    it[1] = (struct kvq_batch_item){s1, prompts[1], n, NULL, NULL, sb, &got[0], 0};
    CHECK_OK(kvq_batch_step(b, it, 2, &err));
    CHECK(got[0] == plain[0]);
    for (int g = 1; g < G; g++) {
        it[0] = (struct kvq_batch_item){s0, &plain[g - 1], 1, NULL, NULL, sa, &plain[g], 0};
        CHECK_OK(kvq_batch_step(b, it, 1, &err));
    }
    it[1] = (struct kvq_batch_item){s1, plain, K, NULL, NULL, sb, got, K};
    CHECK_OK(kvq_batch_step(b, &it[1], 1, &err));
    CHECKF(memcmp(got, plain + 1, sizeof got) == 0, "sampled verified tokens differ from plain drawing");
    kvq_sampler_skip(sb, K); /* all kept: the RNG where plain drawing has it */
    it[1] = (struct kvq_batch_item){s1, &plain[K], 1, NULL, NULL, sb, &got[0], 0}; /* the pending plain[K] */
    CHECK_OK(kvq_batch_step(b, &it[1], 1, &err));
    CHECK(got[0] == plain[K + 1]);
    kvq_sampler_free(sa);
    kvq_sampler_free(sb);
    /* refusals: more outputs than rows, or with logits */
    float *lg = malloc((size_t)kvq_model_config_of(model)->vocab * sizeof *lg);
    it[1] = (struct kvq_batch_item){s1, plain, 2, NULL, got, NULL, NULL, 3};
    CHECK_STATUS(kvq_batch_step(b, &it[1], 1, NULL), KVQ_ERR_INVALID_ARG);
    it[1] = (struct kvq_batch_item){s1, plain, 2, lg, got, NULL, NULL, 2};
    CHECK_STATUS(kvq_batch_step(b, &it[1], 1, NULL), KVQ_ERR_INVALID_ARG);
    free(lg);
    kvq_batch_free(b);
}

/* The pool: pages counted per slot, a step that does not fit changes
 * nothing, removal gives pages and memory back. */
static void test_page_pool(void)
{
    struct kvq_batch_config bc;
    kvq_batch_config_default(&bc);
    bc.max_seqs = 3;
    bc.max_rows = 512;
    bc.seq.type_k = KVQ_TYPE_Q8_0;
    bc.seq.type_v = KVQ_TYPE_Q8_0;
    bc.seq.recent_f16 = 0;
    kvq_batch *b = NULL;
    CHECK_OK(kvq_batch_create(model, &bc, &b, NULL));
    struct kvq_batch_stats st;
    kvq_batch_get_stats(b, &st);
    const size_t P = st.page_tokens;
    /* a budget of exactly 5 pages */
    kvq_batch_free(b);
    bc.seq.kv_budget = 5 * st.page_bytes + st.page_bytes / 2;
    CHECK_OK(kvq_batch_create(model, &bc, &b, NULL));
    kvq_batch_get_stats(b, &st);
    CHECK(st.pages_total == 5 && st.pages_used == 0 && st.bytes_allocated == 0);
    int s0, s1, s2, s3;
    CHECK_OK(kvq_batch_add(b, &s0));
    CHECK_OK(kvq_batch_add(b, &s1));
    CHECK_OK(kvq_batch_add(b, &s2));
    CHECK_STATUS(kvq_batch_add(b, &s3), KVQ_ERR_BUDGET);
    CHECK(kvq_batch_pages_for(b, 0) == 0 && kvq_batch_pages_for(b, 1) == 1 && kvq_batch_pages_for(b, P + 1) == 2);
    CHECK(s0 >= 0 && s1 >= 0 && s2 >= 0 && s0 < 3 && s1 < 3 && s2 < 3);
    int32_t *ids = prompts[0];
    struct kvq_batch_item a[2] = {{s0, ids, 3 * P, NULL, NULL, NULL, NULL, 0}, {s1, ids, 2 * P + 1, NULL, NULL, NULL, NULL, 0}};
    kvq_error err = {0};
    CHECK_STATUS(kvq_batch_step(b, a, 2, &err), KVQ_ERR_BUDGET); /* 3 + 3 pages: no */
    CHECK(kvq_batch_len(b, s0) == 0 && kvq_batch_len(b, s1) == 0);
    a[1].n = P; /* 3 + 1 pages */
    CHECK_OK(kvq_batch_step(b, a, 2, &err));
    kvq_batch_get_stats(b, &st);
    CHECK(st.pages_used == 4 && st.bytes_allocated == 4 * st.page_bytes);
    struct kvq_batch_item c = {s2, ids, P + 1, NULL, NULL, NULL, NULL, 0};
    CHECK_STATUS(kvq_batch_step(b, &c, 1, &err), KVQ_ERR_BUDGET);
    kvq_batch_get_stats(b, &st);
    CHECK(st.pages_used == 4 && kvq_batch_len(b, s2) == 0 && st.bytes_allocated == 4 * st.page_bytes);
    kvq_batch_remove(b, s0);
    kvq_batch_get_stats(b, &st);
    CHECK(st.pages_used == 1 && st.active == 2 && st.bytes_allocated == st.page_bytes);
    CHECK_OK(kvq_batch_step(b, &c, 1, &err));
    CHECK_OK(kvq_batch_truncate(b, s2, 1));
    kvq_batch_get_stats(b, &st);
    CHECK(st.pages_used == 2 && kvq_batch_len(b, s2) == 1 && st.bytes_allocated == 2 * st.page_bytes);
    CHECK_OK(kvq_batch_add(b, &s3));
    CHECK(s3 == s0);
    kvq_batch_free(b);
}

/* Bad steps are refused before anything runs. */
static void test_bad_steps(void)
{
    struct kvq_batch_config bc;
    kvq_batch_config_default(&bc);
    bc.max_seqs = 2;
    bc.max_rows = 8;
    bc.seq.max_ctx = 64;
    kvq_batch *b = NULL;
    CHECK_OK(kvq_batch_create(model, &bc, &b, NULL));
    int s0;
    CHECK_OK(kvq_batch_add(b, &s0));
    int32_t ids[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, bad = 1 << 20, out;
    struct kvq_batch_item it = {s0, ids, 9, NULL, &out, NULL, NULL, 0};
    CHECK_STATUS(kvq_batch_step(b, &it, 1, NULL), KVQ_ERR_INVALID_ARG); /* rows over max_rows */
    struct kvq_batch_item two[2] = {{s0, ids, 1, NULL, NULL, NULL, NULL, 0}, {s0, ids, 1, NULL, NULL, NULL, NULL, 0}};
    CHECK_STATUS(kvq_batch_step(b, two, 2, NULL), KVQ_ERR_INVALID_ARG); /* repeated slot */
    two[1].slot = 1;
    CHECK_STATUS(kvq_batch_step(b, two, 2, NULL), KVQ_ERR_INVALID_ARG); /* free slot */
    it = (struct kvq_batch_item){s0, &bad, 1, NULL, &out, NULL, NULL, 0};
    CHECK_STATUS(kvq_batch_step(b, &it, 1, NULL), KVQ_ERR_RANGE);
    kvq_sampler *smp = make_sampler(0, 1);
    it = (struct kvq_batch_item){s0, ids, 1, NULL, NULL, smp, NULL, 0};
    CHECK_STATUS(kvq_batch_step(b, &it, 1, NULL), KVQ_ERR_INVALID_ARG); /* a draw with nowhere to go */
    it = (struct kvq_batch_item){s0, ids, 1, NULL, NULL, NULL, &out, 0};
    CHECK_STATUS(kvq_batch_step(b, &it, 1, NULL), KVQ_ERR_INVALID_ARG);
    kvq_sampler_free(smp);
    CHECK(kvq_batch_len(b, s0) == 0);
    for (int i = 0; i < 8; i++) {
        it = (struct kvq_batch_item){s0, ids, 8, NULL, &out, NULL, NULL, 0};
        CHECK_OK(kvq_batch_step(b, &it, 1, NULL));
    }
    it.n = 1;
    CHECK_STATUS(kvq_batch_step(b, &it, 1, NULL), KVQ_ERR_CONTEXT_FULL);
    CHECK(kvq_batch_len(b, s0) == 64);
    CHECK_STATUS(kvq_batch_truncate(b, s0, 65), KVQ_ERR_INVALID_ARG);
    kvq_batch_remove(b, 7);
    kvq_batch_remove(b, s0);
    CHECK(kvq_batch_len(b, s0) == 0);
    kvq_batch_free(b);
    kvq_batch_free(NULL);
    bc.seq.kv_budget = 100; /* holds no page */
    kvq_error err = {0};
    CHECK_STATUS(kvq_batch_create(model, &bc, &b, &err), KVQ_ERR_BUDGET);
    CHECK(strstr(err.msg, "budget") != NULL);
}

int main(void)
{
    kvq_error err = {0};
    if (kvq_model_load(TEST_MODEL_DIR, NULL, &model, &err) != KVQ_OK) {
        fprintf(stderr, "test_batch: cannot load %s: %s\n", TEST_MODEL_DIR, err.msg);
        return 1;
    }
    make_prompts(7);
    RUN(test_greedy_identical_compressed);
    RUN(test_greedy_identical_centred);
    RUN(test_greedy_identical_f32);
    RUN(test_sampled_identical);
    RUN(test_verify_rows);
    RUN(test_window_mistral);
    RUN(test_gemma3);
    RUN(test_greedy_cuda);
    RUN(test_greedy_cuda_compressed);
    RUN(test_greedy_cuda_centred);
    RUN(test_sampled_cuda);
    RUN(test_page_pool);
    RUN(test_bad_steps);
    for (int i = 0; i < N_SEQS; i++)
        free(prompts[i]);
    kvq_model_free(model);
    return TEST_END("test_batch");
}
