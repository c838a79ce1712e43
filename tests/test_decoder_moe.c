/* test_decoder_moe.c - whole mixture-of-experts models against transformers'
 * numbers, before any MoE fixture exists: a Mixtral checkpoint made from the
 * Mistral fixture (tests/models/mistral_window) whose every expert is that
 * model's MLP. Mixtral renormalises the top-k weights to sum 1, so in exact
 * arithmetic the layer computes sum_e w_e MLP(x) = MLP(x) whatever the
 * (random) router picks, and the logits and greedy ids must be Mistral's
 * transformers reference (f32 and f16 caches, the bounds of
 * test_decoder_families), in both expert layouts (per expert w1/w3/w2, and
 * transformers 5's fused gate_up_proj / down_proj). The identity cannot hide
 * a dead router or combine: a variant whose experts 1..3 output twice the
 * MLP must move the logits far. Also: the weight accounting, the default
 * cache, and the CUDA refusal.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvq_batch.h"
#include "kvq_half.h"
#include "kvq_model.h"
#include "kvq_rng.h"
#include "kvq_safetensors.h"
#include "test.h"
#include "test_util.h"
#include "test_fixture.h"

#define SRC "tests/models/mistral_window"
#define E 4

static int have_src(void)
{
    struct stat st;
    return stat(SRC "/reference.safetensors", &st) == 0;
}

/* dst: SRC as Mixtral with E experts, each SRC's MLP (experts 1.. with
 * down_proj x double_rest when it is not 1), a random bf16 router; fused:
 * transformers 5's tensor names and layout; window 0: sliding_window null. */
static void write_mixtral(const char *dst, int fused, float double_rest, int window)
{
    mkdir(dst, 0777);
    size_t len;
    char *text = test_read_file(SRC "/config.json", &len);
    cJSON *cfg = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(cfg != NULL);
    if (!cfg)
        return;
    cJSON_ReplaceItemInObject(cfg, "model_type", cJSON_CreateString("mixtral"));
    cJSON_AddNumberToObject(cfg, "num_local_experts", E);
    cJSON_AddNumberToObject(cfg, "num_experts_per_tok", 2);
    if (!window) /* kvq batch refuses windows before anything else */
        cJSON_ReplaceItemInObject(cfg, "sliding_window", cJSON_CreateNull());
    const int H = cJSON_GetObjectItem(cfg, "hidden_size")->valueint, F = cJSON_GetObjectItem(cfg, "intermediate_size")->valueint;
    const int NL = cJSON_GetObjectItem(cfg, "num_hidden_layers")->valueint;
    char *js = cJSON_Print(cfg);
    cJSON_Delete(cfg);
    char path[256], name[160];
    snprintf(path, sizeof path, "%s/config.json", dst);
    CHECK(test_write_file(path, js, strlen(js)) == 0);
    free(js);

    kvq_st_file *src = NULL;
    CHECK_OK(kvq_st_open(SRC "/model.safetensors", &src, NULL));
    kvq_st_writer *w = NULL;
    CHECK_OK(kvq_st_writer_create(&w));
    if (!src || !w)
        return;
    for (size_t i = 0; i < kvq_st_count(src); i++) {
        const struct kvq_st_tensor *t = kvq_st_tensor_at(src, i);
        if (!strstr(t->name, ".mlp."))
            CHECK_OK(kvq_st_writer_add(w, t->name, t->dtype, t->n_dims, t->shape, t->data));
    }
    const size_t mat = (size_t)F * H; /* elements of gate, up or down */
    uint16_t *router = malloc((size_t)NL * E * H * 2), *big = malloc((size_t)NL * E * 3 * mat * 2);
    kvq_rng r;
    kvq_rng_init(&r, 5);
    for (size_t i = 0; i < (size_t)NL * E * H; i++)
        router[i] = (uint16_t)(kvq_f32_bits((float)(0.5 * kvq_rng_gauss(&r))) >> 16);
    for (int l = 0; l < NL; l++) {
        const struct kvq_st_tensor *g, *u, *d;
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate_proj.weight", l);
        g = kvq_st_find(src, name);
        snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj.weight", l);
        u = kvq_st_find(src, name);
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", l);
        d = kvq_st_find(src, name);
        CHECK(g && u && d && g->dtype == KVQ_ST_BF16 && d->nbytes == mat * 2);
        if (!g || !u || !d)
            break;
        /* per layer: E x [gate; up; down], bf16 (doubling a bf16 is exact) */
        uint16_t *L = big + (size_t)l * E * 3 * mat;
        for (int e = 0; e < E; e++) {
            uint16_t *x = L + (size_t)e * 3 * mat;
            memcpy(x, g->data, mat * 2);
            memcpy(x + mat, u->data, mat * 2);
            memcpy(x + 2 * mat, d->data, mat * 2);
            for (size_t i = 0; e > 0 && double_rest != 1 && i < mat; i++) {
                const float v = kvq_bits_f32((uint32_t)x[2 * mat + i] << 16) * double_rest;
                x[2 * mat + i] = (uint16_t)(kvq_f32_bits(v) >> 16);
            }
        }
        const int64_t rshape[2] = {E, H};
        snprintf(name, sizeof name, fused ? "model.layers.%d.mlp.gate.weight" : "model.layers.%d.block_sparse_moe.gate.weight", l);
        CHECK_OK(kvq_st_writer_add(w, name, KVQ_ST_BF16, 2, rshape, router + (size_t)l * E * H));
        if (fused) {
            /* [E][2F][H] gate then up rows, [E][H][F]: rebuilt contiguously after the per-expert copies */
            uint16_t *gu = malloc((size_t)E * 2 * mat * 2), *dn = malloc((size_t)E * mat * 2);
            for (int e = 0; e < E; e++) {
                memcpy(gu + (size_t)e * 2 * mat, L + (size_t)e * 3 * mat, 2 * mat * 2);
                memcpy(dn + (size_t)e * mat, L + (size_t)e * 3 * mat + 2 * mat, mat * 2);
            }
            memcpy(L, gu, (size_t)E * 2 * mat * 2); /* the layer's block now holds gu then down */
            memcpy(L + (size_t)E * 2 * mat, dn, (size_t)E * mat * 2);
            free(gu);
            free(dn);
            const int64_t gs[3] = {E, 2 * F, H}, ds[3] = {E, H, F};
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj", l);
            CHECK_OK(kvq_st_writer_add(w, name, KVQ_ST_BF16, 3, gs, L));
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj", l);
            CHECK_OK(kvq_st_writer_add(w, name, KVQ_ST_BF16, 3, ds, L + (size_t)E * 2 * mat));
            continue;
        }
        static const char *const nm[3] = {"w1", "w3", "w2"};
        for (int e = 0; e < E; e++)
            for (int i = 0; i < 3; i++) {
                const int64_t in[2] = {F, H}, out[2] = {H, F};
                snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.experts.%d.%s.weight", l, e, nm[i]);
                CHECK_OK(kvq_st_writer_add(w, name, KVQ_ST_BF16, 2, i < 2 ? in : out, L + ((size_t)e * 3 + i) * mat));
            }
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    CHECK_OK(kvq_st_writer_write(w, path, NULL));
    kvq_st_writer_free(w);
    kvq_st_close(src);
    free(router);
    free(big);
}

/* Prompt logits (all positions) and greedy ids of dir with a cache of types
 * tk/tv; *worst: the logits' largest distance to reference tensor lname in
 * x max|logit|; returns greedy ids equal to tensor gname's. */
static int run(const char *dir, enum kvq_type tk, enum kvq_type tv, const char *lname, const char *gname, double *worst)
{
    kvq_model *m = NULL;
    kvq_st_file *ref = NULL;
    kvq_seq *s = NULL;
    kvq_error err = {0};
    int same = 0;
    *worst = INFINITY;
    CHECKF(kvq_model_load(dir, NULL, &m, &err) == KVQ_OK, "%s: %s", dir, err.msg);
    CHECK_OK(kvq_st_open(SRC "/reference.safetensors", &ref, NULL));
    size_t T = 0, N = 0;
    int32_t *ids = ref ? test_st_ints(ref, "ids", &T) : NULL, *greedy = ref ? test_st_ints(ref, gname, &N) : NULL;
    const struct kvq_st_tensor *lt = ref ? kvq_st_find(ref, lname) : NULL;
    const int V = m ? kvq_model_config_of(m)->vocab : 0;
    float *want = lt ? malloc(lt->n_elements * sizeof *want) : NULL, *got = lt ? malloc(lt->n_elements * sizeof *got) : NULL;
    int32_t *out = N ? malloc(N * sizeof *out) : NULL;
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.type_k = tk;
    sc.type_v = tv;
    sc.recent_f16 = 0;
    sc.max_ctx = T + N;
    if (m && ids && greedy && want && got && out && lt->n_elements == T * (size_t)V &&
        kvq_st_to_f32(lt, want, lt->n_elements) == KVQ_OK && kvq_seq_create(m, &sc, &s, &err) == KVQ_OK &&
        kvq_seq_forward(s, ids, T, 0, got, NULL) == KVQ_OK) {
        *worst = test_logits_worst(got, want, T, (int)V);
        same = test_greedy_n(s, ids, T, out, N) == N && memcmp(out, greedy, N * sizeof *out) == 0;
    } else {
        CHECKF(0, "%s: could not run (%s)", dir, err.msg);
    }
    kvq_seq_free(s);
    kvq_model_free(m);
    kvq_st_close(ref);
    free(ids);
    free(greedy);
    free(want);
    free(got);
    free(out);
    return same;
}

static void test_mixtral_of_mistral(void)
{
    if (!have_src())
        SKIP("no %s", SRC);
    for (int fused = 0; fused < 2; fused++) {
        char dir[64];
        snprintf(dir, sizeof dir, "/tmp/kvq_mixtral_%d_%d", (int)getpid(), fused);
        write_mixtral(dir, fused, 1.0f, 1);
        double w32, w16, wq;
        const int g32 = run(dir, KVQ_TYPE_F32, KVQ_TYPE_F32, "logits", "greedy", &w32);
        const int g16 = run(dir, KVQ_TYPE_F16, KVQ_TYPE_F16, "logits_f16kv", "greedy_f16kv", &w16);
        run(dir, KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, "logits", "greedy", &wq);
        printf("  mixtral of mistral_window (%s experts): f32 %.2g, f16 %.2g x max|logit| from transformers' "
               "mistral; tq3j/tq3 %.2g\n",
               fused ? "fused" : "per-expert", w32, w16, wq);
        CHECKF(w32 <= 1e-4 && g32, "%s: f32 cache: logits %.3g x max|logit|, greedy %s", dir, w32,
               g32 ? "equal" : "differs");
        CHECKF(w16 <= 1e-4 && g16, "%s: f16 cache: logits %.3g x max|logit|, greedy %s", dir, w16,
               g16 ? "equal" : "differs");
        CHECKF(isfinite(wq), "%s: tq3j/tq3 logits not finite", dir);
        /* experts 1..3 twice the MLP: the router's choice and weights now matter */
        write_mixtral(dir, fused, 2.0f, 1);
        double wb;
        run(dir, KVQ_TYPE_F32, KVQ_TYPE_F32, "logits", "greedy", &wb);
        CHECKF(wb > 1e-2, "experts 1..3 doubled moved the logits only %.3g x max|logit|", wb);
        test_rm_dir(dir);
    }
}

/* Weight bytes: the dense model's, less its MLPs, plus E experts and a
 * router per layer; the CUDA device refused at create with one line. */
static void test_accounting_and_cuda(void)
{
    if (!have_src())
        SKIP("no %s", SRC);
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/kvq_mixtral_acc_%d", (int)getpid());
    write_mixtral(dir, 0, 1.0f, 0);
    kvq_model *dense = NULL, *moe = NULL;
    kvq_error err = {0};
    CHECK_OK(kvq_model_load(SRC, NULL, &dense, NULL));
    CHECKF(kvq_model_load(dir, NULL, &moe, &err) == KVQ_OK, "%s", err.msg);
    if (dense && moe) {
        struct kvq_model_info di, mi;
        kvq_model_get_info(dense, &di);
        kvq_model_get_info(moe, &mi);
        const struct kvq_model_config *c = kvq_model_config_of(dense);
        const size_t mlp = 3 * (size_t)c->hidden * c->ffn * 2, router = (size_t)E * c->hidden * 2;
        CHECKF(mi.weight_bytes == di.weight_bytes + (size_t)c->n_layers * ((E - 1) * mlp + router),
               "weight_bytes %zu, dense %zu", mi.weight_bytes, di.weight_bytes);
        CHECK(mi.expert_bytes == (size_t)c->n_layers * (E * mlp + router) && di.expert_bytes == 0);
        CHECK(kvq_model_config_layer_params(kvq_model_config_of(moe)) ==
              kvq_model_config_layer_params(c) + (E - 1) * mlp / 2 + router / 2);
        struct kvq_seq_config sc;
        kvq_seq_config_default(&sc);
        sc.device = KVQ_DEVICE_CUDA;
        sc.fast_prefill = 0; /* exact products: the comparisons are against f32 references */
        sc.max_ctx = 64;
        kvq_seq *s = NULL;
        err.msg[0] = 0;
        CHECK(kvq_seq_create(moe, &sc, &s, &err) == KVQ_ERR_UNSUPPORTED && !s);
        CHECKF(strstr(err.msg, "mixture-of-experts") && strstr(err.msg, "--device cpu"), "'%s'", err.msg);
        struct kvq_batch_config bc;
        kvq_batch_config_default(&bc);
        bc.seq.device = KVQ_DEVICE_CUDA;
        bc.seq.fast_prefill = 0; /* exact products: the comparisons are against f32 references */
        bc.seq.max_ctx = 64;
        kvq_batch *b = NULL;
        err.msg[0] = 0;
        CHECK(kvq_batch_create(moe, &bc, &b, &err) == KVQ_ERR_UNSUPPORTED && !b);
        CHECKF(strstr(err.msg, "mixture-of-experts"), "'%s'", err.msg);
    }
    kvq_model_free(dense);
    kvq_model_free(moe);
    test_rm_dir(dir);
}

int main(void)
{
    RUN(test_mixtral_of_mistral);
    RUN(test_accounting_and_cuda);
    return TEST_END("test_decoder_moe");
}
