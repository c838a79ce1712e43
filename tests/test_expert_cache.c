/* test_expert_cache.c - kvq_seq_config.expert_cache (experts read on demand
 * from the checkpoint into a bounded set of slots) and batches of a sparse
 * model: with fewer slots than one layer's experts the logits are
 * bit-identical to the mapped experts' and the greedy ids the same; a
 * batch's rows get each sequence's own bits, cache or not; resident memory
 * stays within the cache. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvq_batch.h"
#include "kvq_model.h"
#include "test.h"
#include "test_fixture.h"
#include "test_moe_synth.h"
#include "test_util.h"

/* Prompt logits and greedy ids of model m with an expert cache of `bytes`
 * (0: none); *st: its statistics. */
/* expert_direct for run_seq's sequences */
static int opt_direct;

static void run_seq(const kvq_model *m, size_t bytes, int prefetch, const int32_t *ids, size_t T, float *logits,
                    int32_t *greedy, size_t N, struct kvq_seq_stats *st)
{
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.type_k = sc.type_v = KVQ_TYPE_F32;
    sc.max_ctx = T + N;
    sc.expert_cache = bytes;
    sc.expert_prefetch = prefetch;
    sc.expert_direct = opt_direct;
    kvq_seq *s = NULL;
    kvq_error err = {0};
    CHECKF(kvq_seq_create(m, &sc, &s, &err) == KVQ_OK, "%s", err.msg);
    if (!s)
        return;
    CHECK_OK(kvq_seq_forward(s, ids, T, 0, logits, NULL));
    CHECK(test_greedy_n(s, ids, T, greedy, N) == N);
    kvq_seq_get_stats(s, st);
    kvq_seq_free(s);
}

/* kvq_seq_config.expert_cache: with room for 1, 2 (fewer than one layer's
 * experts) or all experts, with and without read-ahead, the logits are
 * bit-identical to the mapped experts' and the greedy ids the same; every
 * miss and every read-ahead reads exactly one expert's bytes; with room for
 * all, each expert is read at most once. */
static void test_expert_cache(void)
{
    static const struct {
        int E, k, norm, fused;
    } cases[] = {{4, 2, 1, 0}, {6, 3, 0, 1}};
    enum { T = 24, N = 12 };
    for (size_t c = 0; c < 2; c++) {
        char dir[64];
        snprintf(dir, sizeof dir, "/tmp/kvq_moe_cache_%d_%zu", (int)getpid(), c);
        struct synth sy = {.E = cases[c].E, .k = cases[c].k, .norm = cases[c].norm, .fused = cases[c].fused};
        write_synth(dir, &sy, 200 + c);
        kvq_model *m = NULL;
        kvq_error err = {0};
        CHECKF(kvq_model_load(dir, NULL, &m, &err) == KVQ_OK, "%s", err.msg);
        if (!m)
            continue;
        const size_t expert = (size_t)3 * MOE_F * HID * (cases[c].fused ? 4 : 2), all = 2 * (size_t)sy.E;
        int32_t ids[T], g0[N], g1[N];
        kvq_rng r;
        kvq_rng_init(&r, 33 + c);
        for (int t = 0; t < T; t++)
            ids[t] = (int32_t)(kvq_rng_next(&r) % VOC);
        static float l0[T * VOC], l1[T * VOC];
        struct kvq_seq_stats st;
        run_seq(m, 0, 1, ids, T, l0, g0, N, &st);
        CHECK(st.experts.cache_bytes == 0 && st.experts.misses == 0 && st.experts.prefetched == 0);
        const size_t slots[4] = {1, 2, 3, all};
        for (int i = 0; i < 8; i++) {
            const size_t n = slots[i / 2];
            const int ahead = i % 2;
            memset(l1, 0, sizeof l1);
            run_seq(m, n * expert + expert / 2, ahead, ids, T, l1, g1, N, &st);
            CHECKF(memcmp(l0, l1, sizeof l0) == 0, "%zu slots%s: logits differ from the mapped experts'", n,
                   ahead ? ", read-ahead" : "");
            CHECKF(memcmp(g0, g1, sizeof g0) == 0, "%zu slots%s: greedy ids differ", n, ahead ? ", read-ahead" : "");
            CHECK(st.experts.cache_bytes == n * expert);
            CHECKF(st.experts.bytes_read == st.experts.misses * expert, "%zu bytes read for %zu misses",
                   st.experts.bytes_read, st.experts.misses);
            CHECKF(st.experts.prefetch_bytes == st.experts.prefetched * expert, "%zu bytes read ahead for %zu experts",
                   st.experts.prefetch_bytes, st.experts.prefetched);
            CHECK(st.experts.prefetch_hits <= st.experts.prefetched && st.experts.prefetch_hits <= st.experts.hits);
            CHECK(ahead || st.experts.prefetched == 0);
            CHECK(st.experts.misses + st.experts.prefetched > 0);
            if (n == all)
                CHECKF(st.experts.misses + st.experts.prefetched <= all && st.experts.hits > 0,
                       "room for all: %zu misses, %zu read ahead, %zu hits", st.experts.misses, st.experts.prefetched,
                       st.experts.hits);
            printf("  %s experts, cache of %zu of %zu%s: %zu hits, %zu misses, %zu read ahead (%zu of them hit)\n",
                   cases[c].fused ? "fused" : "per-expert", n, all, ahead ? ", read-ahead" : "", st.experts.hits,
                   st.experts.misses, st.experts.prefetched, st.experts.prefetch_hits);
        }
        /* refusals, one line each */
        struct kvq_seq_config sc;
        kvq_seq_config_default(&sc);
        sc.expert_cache = expert - 1;
        kvq_seq *s = NULL;
        CHECK(kvq_seq_create(m, &sc, &s, &err) == KVQ_ERR_INVALID_ARG && !s && strstr(err.msg, "holds no expert"));
        kvq_model_free(m);
        struct kvq_model_load_opts o;
        kvq_model_load_opts_default(&o);
        o.weights_f32 = 1;
        m = NULL;
        CHECK_OK(kvq_model_load(dir, &o, &m, NULL));
        sc.expert_cache = 1 << 20;
        CHECK(m && kvq_seq_create(m, &sc, &s, &err) == KVQ_ERR_INVALID_ARG && !s && strstr(err.msg, "widened"));
        kvq_model_free(m);
        synth_free(&sy);
        test_rm_dir(dir);
    }
    kvq_model *dense = NULL;
    kvq_error err = {0};
    CHECK_OK(kvq_model_load(TEST_MODEL_DIR, NULL, &dense, NULL));
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.expert_cache = 1 << 20;
    sc.max_ctx = 64;
    kvq_seq *s = NULL;
    CHECK(dense && kvq_seq_create(dense, &sc, &s, &err) == KVQ_ERR_INVALID_ARG && !s && strstr(err.msg, "no experts"));
    kvq_model_free(dense);
}

/* kvq_seq_config.expert_direct: the committed fixtures' experts (per
 * expert and fused) read with O_DIRECT through 1 and 2 slots, with and
 * without read-ahead, give the mapped experts' logits bit for bit; each
 * miss reads its blocks' 4 KiB-aligned ranges. Skipped where the
 * filesystem refuses O_DIRECT (tmpfs), with the reason. */
static void test_expert_direct(void)
{
    static const char *const fams[] = {"tests/models/qwen3_moe", "tests/models/olmoe"};
    enum { T = 20, N = 8 };
    for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++) {
        kvq_model *m = NULL;
        kvq_error err = {0};
        CHECKF(kvq_model_load(fams[f], NULL, &m, &err) == KVQ_OK, "%s", err.msg);
        if (!m)
            continue;
        const struct kvq_model_config *c = kvq_model_config_of(m);
        struct kvq_seq_config sc;
        kvq_seq_config_default(&sc);
        sc.expert_cache = 1 << 20;
        sc.expert_direct = 1;
        kvq_seq *s = NULL;
        if (kvq_seq_create(m, &sc, &s, &err) != KVQ_OK) {
            kvq_model_free(m);
            CHECKF(strstr(err.msg, "O_DIRECT") != NULL, "%s", err.msg);
            SKIP("%s", err.msg);
        }
        kvq_seq_free(s);
        int32_t ids[T], g0[N], g1[N];
        for (int t = 0; t < T; t++)
            ids[t] = (int32_t)((3 + 29 * t) % c->vocab);
        static float l0[T * 256], l1[T * 256];
        CHECK(c->vocab <= 256);
        struct kvq_seq_stats st;
        opt_direct = 0;
        run_seq(m, 0, 0, ids, T, l0, g0, N, &st);
        const size_t expert = (size_t)3 * c->hidden * c->arch.moe_ffn * 2; /* bf16 */
        for (int i = 0; i < 4; i++) {
            const size_t slots = 1 + (size_t)(i / 2);
            const int ahead = i % 2;
            opt_direct = 1;
            memset(l1, 0, sizeof l1);
            /* room for `slots` experts with their aligned ranges (at most 3 blocks of 2 pages more) */
            run_seq(m, slots * (expert + 6 * 4096), ahead, ids, T, l1, g1, N, &st);
            opt_direct = 0;
            CHECKF(memcmp(l0, l1, (size_t)T * c->vocab * sizeof(float)) == 0 && memcmp(g0, g1, sizeof g0) == 0,
                   "%s, %zu slots%s, O_DIRECT: logits or ids differ from the mapped experts'", fams[f], slots,
                   ahead ? ", read-ahead" : "");
            CHECKF(st.experts.misses > 0 && st.experts.bytes_read >= st.experts.misses * expert &&
                       st.experts.bytes_read % 4096 == 0,
                   "%s: %zu bytes read for %zu misses", fams[f], st.experts.bytes_read, st.experts.misses);
            printf("  %s, O_DIRECT, %zu slots%s: %zu misses, %zu bytes read (%.2f x the experts' bytes)\n", fams[f],
                   slots, ahead ? ", read-ahead" : "", st.experts.misses, st.experts.bytes_read,
                   (double)st.experts.bytes_read / (double)(st.experts.misses * expert));
        }
        kvq_model_free(m);
    }
}

/* kvq_batch over a sparse model: prompts of 5, 9 and 20 tokens in one step
 * (the first two share a row group, the third goes alone through sgemm),
 * then greedy decode rows together; every slot's logits bit-identical to
 * its own kvq_seq run, with and without a 2-slot expert cache. */
static void test_batch_invariance(void)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/kvq_moe_batch_%d", (int)getpid());
    struct synth sy = {.E = 4, .k = 2, .norm = 1, .fused = 0};
    write_synth(dir, &sy, 300);
    kvq_model *m = NULL;
    CHECK_OK(kvq_model_load(dir, NULL, &m, NULL));
    enum { S = 3, STEPS = 6 };
    static const size_t len[S] = {5, 9, 20};
    int32_t prompt[S][20];
    kvq_rng r;
    kvq_rng_init(&r, 77);
    for (int i = 0; i < S; i++)
        for (size_t t = 0; t < len[i]; t++)
            prompt[i][t] = (int32_t)(kvq_rng_next(&r) % VOC);
    const size_t expert = (size_t)3 * MOE_F * HID * 2;
    for (int cached = 0; m && cached < 2; cached++) {
        /* each sequence alone */
        static float want[S][STEPS + 1][VOC], got[S][STEPS + 1][VOC];
        int32_t tok_alone[S][STEPS + 1];
        for (int i = 0; i < S; i++) {
            struct kvq_seq_config sc;
            kvq_seq_config_default(&sc);
            sc.type_k = sc.type_v = KVQ_TYPE_F32;
            sc.max_ctx = 64;
            sc.expert_cache = cached ? 2 * expert : 0;
            kvq_seq *s = NULL;
            CHECK_OK(kvq_seq_create(m, &sc, &s, NULL));
            if (!s)
                return;
            CHECK_OK(kvq_seq_forward(s, prompt[i], len[i], len[i] - 1, want[i][0], &tok_alone[i][0]));
            for (int k = 1; k <= STEPS; k++)
                CHECK_OK(kvq_seq_forward(s, &tok_alone[i][k - 1], 1, 0, want[i][k], &tok_alone[i][k]));
            kvq_seq_free(s);
        }
        struct kvq_batch_config bc;
        kvq_batch_config_default(&bc);
        bc.seq.type_k = bc.seq.type_v = KVQ_TYPE_F32;
        bc.seq.max_ctx = 64;
        bc.seq.expert_cache = cached ? 2 * expert : 0;
        bc.max_seqs = S;
        kvq_batch *b = NULL;
        kvq_error err = {0};
        CHECKF(kvq_batch_create(m, &bc, &b, &err) == KVQ_OK, "%s", err.msg);
        if (!b)
            return;
        int slot[S];
        int32_t tok[S];
        struct kvq_batch_item it[S];
        for (int i = 0; i < S; i++) {
            CHECK_OK(kvq_batch_add(b, &slot[i]));
            it[i] = (struct kvq_batch_item){slot[i], prompt[i], len[i], got[i][0], &tok[i], NULL, NULL, 0};
        }
        CHECK_OK(kvq_batch_step(b, it, S, &err));
        int bad = 0;
        for (int k = 1; k <= STEPS; k++) {
            int32_t in[S];
            for (int i = 0; i < S; i++) {
                bad += tok[i] != tok_alone[i][k - 1];
                in[i] = tok[i];
                it[i] = (struct kvq_batch_item){slot[i], &in[i], 1, got[i][k], &tok[i], NULL, NULL, 0};
            }
            CHECK_OK(kvq_batch_step(b, it, S, &err));
        }
        CHECKF(bad == 0, "%d batched greedy tokens differ from the sequences' own", bad);
        CHECKF(memcmp(want, got, sizeof want) == 0, "batched logits differ from each sequence's own (cache %d)",
               cached);
        kvq_batch_free(b);
    }
    kvq_model_free(m);
    synth_free(&sy);
    test_rm_dir(dir);
}

/* A bigger sparse model for resident memory: 2 layers of 32 experts of
 * 256 x 512 (768 KiB each in bf16, 48 MiB in all), top-8; per expert. */
#define BIG_H 256
#define BIG_F 512
#define BIG_E 32
static size_t write_big(const char *dir)
{
    mkdir(dir, 0777);
    char js[1024], path[256], name[160];
    snprintf(js, sizeof js,
             "{\"model_type\": \"qwen3_moe\", \"hidden_size\": %d, \"num_hidden_layers\": 2,"
             " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 64, \"intermediate_size\": 64,"
             " \"vocab_size\": %d, \"max_position_embeddings\": 256, \"num_experts\": %d,"
             " \"num_experts_per_tok\": 8, \"moe_intermediate_size\": %d, \"norm_topk_prob\": true}",
             BIG_H, VOC, BIG_E, BIG_F);
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK(test_write_file(path, js, strlen(js)) == 0);
    const size_t mat = (size_t)BIG_H * BIG_F, n_exp = 2 * (size_t)BIG_E * 3 * mat;
    const size_t small = (size_t)VOC * BIG_H * 2 + 2 * (4 * 64 * BIG_H * 2 + 2 * 64 * BIG_H * 2 + 256 * BIG_H + BIG_E * BIG_H);
    uint16_t *w = malloc((n_exp + small) * sizeof *w), *p = w;
    float *ones = malloc(BIG_H * sizeof *ones);
    kvq_rng r;
    kvq_rng_init(&r, 9);
    for (size_t i = 0; i < n_exp + small; i++) /* bf16 of about N(0, 0.05) */
        w[i] = (uint16_t)(kvq_f32_bits((float)(0.05 * (kvq_rng_uniform(&r) + kvq_rng_uniform(&r) - 1.0) * 2.45)) >> 16);
    for (int i = 0; i < BIG_H; i++)
        ones[i] = 1.0f;
    kvq_st_writer *wr = NULL;
    CHECK_OK(kvq_st_writer_create(&wr));
#define T2(nm, a, b)                                                                 \
    do {                                                                             \
        const int64_t sh_[2] = {a, b};                                               \
        CHECK_OK(kvq_st_writer_add(wr, nm, KVQ_ST_BF16, 2, sh_, p));                 \
        p += (size_t)(a) * (size_t)(b);                                              \
    } while (0)
#define T1(nm, a)                                                                    \
    do {                                                                             \
        const int64_t sh_[1] = {a};                                                  \
        CHECK_OK(kvq_st_writer_add(wr, nm, KVQ_ST_F32, 1, sh_, ones));               \
    } while (0)
    T2("model.embed_tokens.weight", VOC, BIG_H);
    T2("lm_head.weight", VOC, BIG_H);
    T1("model.norm.weight", BIG_H);
    for (int l = 0; l < 2; l++) {
        static const char *const att[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
        static const int rows[] = {256, 128, 128, BIG_H}, cols[] = {BIG_H, BIG_H, BIG_H, 256};
        for (int i = 0; i < 4; i++) {
            snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.weight", l, att[i]);
            T2(name, rows[i], cols[i]);
        }
        snprintf(name, sizeof name, "model.layers.%d.self_attn.q_norm.weight", l);
        T1(name, 64);
        snprintf(name, sizeof name, "model.layers.%d.self_attn.k_norm.weight", l);
        T1(name, 64);
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        T1(name, BIG_H);
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
        T1(name, BIG_H);
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate.weight", l);
        T2(name, BIG_E, BIG_H);
        for (int e = 0; e < BIG_E; e++) {
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
            T2(name, BIG_F, BIG_H);
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
            T2(name, BIG_F, BIG_H);
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
            T2(name, BIG_H, BIG_F);
        }
    }
#undef T1
#undef T2
    CHECK((size_t)(p - w) <= n_exp + small);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK_OK(kvq_st_writer_write(wr, path, NULL));
    kvq_st_writer_free(wr);
    free(w);
    free(ones);
    return n_exp * 2;
}

/* Resident memory after a 64-token forward over every expert: without a
 * cache the touched experts' mapped pages stay resident (most of the 48
 * MiB); with a cache of 4 experts (3 MiB) the growth stays within the cache
 * plus a few MiB of buffers, and the logits are bit-identical. */
static void test_expert_cache_rss(void)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/kvq_moe_rss_%d", (int)getpid());
    const size_t experts = write_big(dir), one = (size_t)3 * BIG_H * BIG_F * 2;
    enum { T = 64 };
    int32_t ids[T];
    for (int t = 0; t < T; t++)
        ids[t] = (int32_t)((t * 37 + 11) % VOC);
    static float lg[2][T * VOC];
    size_t grow[2] = {0, 0};
    for (int cached = 0; cached < 2; cached++) {
        kvq_model *m = NULL;
        kvq_error err = {0};
        CHECKF(kvq_model_load(dir, NULL, &m, &err) == KVQ_OK, "%s", err.msg);
        struct kvq_seq_config sc;
        kvq_seq_config_default(&sc);
        sc.type_k = sc.type_v = KVQ_TYPE_F32;
        sc.max_ctx = T;
        sc.expert_cache = cached ? 4 * one : 0;
        kvq_seq *s = NULL;
        if (m)
            CHECKF(kvq_seq_create(m, &sc, &s, &err) == KVQ_OK, "%s", err.msg);
        if (!s) {
            kvq_model_free(m);
            break;
        }
        const size_t before = test_rss_now();
        CHECK_OK(kvq_seq_forward(s, ids, T, 0, lg[cached], NULL));
        const size_t after = test_rss_now();
        grow[cached] = after > before ? after - before : 0;
        struct kvq_seq_stats st;
        kvq_seq_get_stats(s, &st);
        if (cached)
            CHECKF(st.experts.misses >= 2 * BIG_E - 8, "%zu misses: not every expert was used", st.experts.misses);
        kvq_seq_free(s);
        kvq_model_free(m);
    }
    printf("  %.1f MiB of experts; a 64-token forward grows resident memory by %.1f MiB without a cache, %.1f MiB "
           "with a %.1f MiB cache\n",
           experts / 1048576.0, grow[0] / 1048576.0, grow[1] / 1048576.0, 4 * one / 1048576.0);
    CHECKF(grow[0] > experts / 2, "without a cache only %zu bytes became resident: the measure shows nothing", grow[0]);
    CHECKF(grow[1] <= 4 * one + (6u << 20), "with the cache %zu bytes became resident", grow[1]);
    CHECK(memcmp(lg[0], lg[1], sizeof lg[0]) == 0);
    test_rm_dir(dir);
}

/* An expert read that fails (the checkpoint's file replaced by a shorter
 * one after the model was mapped, so the cache's reads meet its end): the
 * forward returns KVQ_ERR_IO, the sequence keeps the tokens it had, the
 * failed slots are not used later (a second call fails the same way), and
 * a fresh sequence over the restored file gives the mapped experts' bits;
 * with read-ahead too. */
static void test_read_error(void)
{
    char dir[64], path[96], keep[96];
    snprintf(dir, sizeof dir, "/tmp/kvq_moe_ioerr_%d", (int)getpid());
    struct synth sy = {.E = 4, .k = 2, .norm = 1, .fused = 0};
    write_synth(dir, &sy, 400);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(keep, sizeof keep, "%s/model.keep", dir);
    kvq_model *m = NULL;
    CHECK_OK(kvq_model_load(dir, NULL, &m, NULL));
    enum { T = 12 };
    int32_t ids[T];
    for (int t = 0; t < T; t++)
        ids[t] = (int32_t)((7 * t + 3) % VOC);
    static float want[VOC], got[VOC];
    const size_t expert = (size_t)3 * MOE_F * HID * 2;
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.type_k = sc.type_v = KVQ_TYPE_F32;
    sc.max_ctx = 64;
    kvq_seq *s = NULL;
    CHECK(m && kvq_seq_create(m, &sc, &s, NULL) == KVQ_OK);
    if (!s) {
        kvq_model_free(m);
        return;
    }
    CHECK_OK(kvq_seq_forward(s, ids, T, T - 1, want, NULL));
    kvq_seq_free(s);
    for (int ahead = 0; ahead < 2; ahead++) {
        /* the mapping keeps the old file; the cache opens the short one */
        CHECK(rename(path, keep) == 0);
        FILE *f = fopen(path, "wb");
        CHECK(f != NULL);
        if (!f)
            break;
        static uint8_t head[4096];
        FILE *k = fopen(keep, "rb");
        const size_t n = k ? fread(head, 1, sizeof head, k) : 0; /* the header, then nothing */
        if (k)
            fclose(k);
        CHECK(n > 0 && fwrite(head, 1, n, f) == n);
        fclose(f);
        sc.expert_cache = 2 * expert;
        sc.expert_prefetch = ahead;
        kvq_error err = {0};
        CHECKF(kvq_seq_create(m, &sc, &s, &err) == KVQ_OK, "%s", err.msg);
        if (!s)
            break;
        for (int again = 0; again < 2; again++) {
            const kvq_status st = kvq_seq_forward(s, ids, T, T - 1, got, NULL);
            CHECKF(st == KVQ_ERR_IO, "read-ahead %d, call %d: %s, want an I/O error", ahead, again, kvq_status_str(st));
            CHECKF(kvq_seq_pos(s) == 0, "read-ahead %d: %zu tokens kept after the failed call", ahead, kvq_seq_pos(s));
            const char *why = kvq_seq_error_detail(s);
            CHECKF(why && strstr(why, "model.safetensors") && strstr(why, "the file ends before them"), "detail: %s",
                   why ? why : "(none)");
        }
        kvq_seq_free(s);
        /* a batch's step says which file and why (kvq serve answers with it) */
        struct kvq_batch_config bc;
        kvq_batch_config_default(&bc);
        bc.seq = sc;
        bc.max_seqs = 1;
        kvq_batch *b = NULL;
        CHECKF(kvq_batch_create(m, &bc, &b, &err) == KVQ_OK, "%s", err.msg);
        int slot = -1;
        int32_t tok = 0;
        if (b && kvq_batch_add(b, &slot) == KVQ_OK) {
            const struct kvq_batch_item it = {slot, ids, T, NULL, &tok, NULL, NULL, 0};
            CHECK(kvq_batch_step(b, &it, 1, &err) == KVQ_ERR_IO);
            CHECKF(strstr(err.msg, "model.safetensors") && strstr(err.msg, "the file ends before them"), "%s",
                   err.msg);
        }
        kvq_batch_free(b);
        CHECK(rename(keep, path) == 0);
        s = NULL;
        CHECK_OK(kvq_seq_create(m, &sc, &s, NULL));
        if (!s)
            break;
        memset(got, 0, sizeof got);
        CHECK_OK(kvq_seq_forward(s, ids, T, T - 1, got, NULL));
        CHECKF(memcmp(want, got, sizeof want) == 0, "read-ahead %d: the restored file's logits differ", ahead);
        CHECK(kvq_seq_error_detail(s) == NULL);
        kvq_seq_free(s);
    }
    kvq_model_free(m);
    synth_free(&sy);
    test_rm_dir(dir);
}

int main(void)
{
    RUN(test_expert_cache);
    RUN(test_expert_direct);
    RUN(test_batch_invariance);
    RUN(test_expert_cache_rss);
    RUN(test_read_error);
    return TEST_END("test_expert_cache");
}
