/* test_moe.c - mixture-of-experts pieces against scalar references written
 * here: the router's top-k and weights (analytic cases and a sort-based
 * reference), the grouping of rows by expert, the config keys, and the CPU
 * backend's router and grouped-expert ops over synthetic checkpoints in
 * both expert layouts (per expert in bf16, fused in f32), against a double
 * precision forward of the same weights, with enough rows that some expert
 * gets more than the few-row kernel's 16 (sgemm); and the expert cache
 * (kvq_seq_config.expert_cache) smaller than one layer's experts giving
 * bit-identical logits and the same greedy ids.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "decoder_internal.h"
#include "kvq_batch.h"
#include "kvq_half.h"
#include "kvq_model.h"
#include "kvq_rng.h"
#include "kvq_safetensors.h"
#include "test.h"
#include "test_util.h"

/* ---- router ----------------------------------------------------------- */

static void test_topk_analytic(void)
{
    /* logits ln p: the softmax gives p back */
    const float p[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    float lg[4], w[4];
    int32_t ids[4];
    for (int i = 0; i < 4; i++)
        lg[i] = logf(p[i]);
    kvq_moe_topk(lg, 4, 2, KVQ_ROUTER_SOFTMAX_TOPK, 0, ids, w);
    CHECK(ids[0] == 3 && ids[1] == 2);
    CHECK_NEAR(w[0], 0.4, 1e-6);
    CHECK_NEAR(w[1], 0.3, 1e-6);
    kvq_moe_topk(lg, 4, 2, KVQ_ROUTER_SOFTMAX_TOPK, 1, ids, w);
    CHECK(ids[0] == 3 && ids[1] == 2);
    CHECK_NEAR(w[0], 4.0 / 7, 1e-6);
    CHECK_NEAR(w[1], 3.0 / 7, 1e-6);
    kvq_moe_topk(lg, 4, 2, KVQ_ROUTER_TOPK_SOFTMAX, 0, ids, w);
    CHECK(ids[0] == 3 && ids[1] == 2);
    CHECK_NEAR(w[0], 4.0 / 7, 1e-6);
    CHECK_NEAR(w[1], 3.0 / 7, 1e-6);
    /* equal logits: the lowest ids, equal weights */
    const float flat[5] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
    kvq_moe_topk(flat, 5, 3, KVQ_ROUTER_SOFTMAX_TOPK, 0, ids, w);
    CHECK(ids[0] == 0 && ids[1] == 1 && ids[2] == 2);
    for (int j = 0; j < 3; j++)
        CHECK_NEAR(w[j], 0.2, 1e-7);
    /* ties below the first pick, out of order: (2.0 at 3), then 1.0 at 1 and 4 */
    const float tie[5] = {0.0f, 1.0f, -1.0f, 2.0f, 1.0f};
    kvq_moe_topk(tie, 5, 3, KVQ_ROUTER_SOFTMAX_TOPK, 1, ids, w);
    CHECK(ids[0] == 3 && ids[1] == 1 && ids[2] == 4);
    const double e1 = exp(-1.0);
    CHECK_NEAR(w[0], 1 / (1 + 2 * e1), 1e-6);
    CHECK_NEAR(w[1], e1 / (1 + 2 * e1), 1e-6);
    CHECK_NEAR(w[2], e1 / (1 + 2 * e1), 1e-6);
    /* large logits do not overflow */
    const float big[3] = {1000.0f, 999.0f, 0.0f};
    kvq_moe_topk(big, 3, 2, KVQ_ROUTER_TOPK_SOFTMAX, 0, ids, w);
    CHECK(ids[0] == 0 && ids[1] == 1);
    CHECK_NEAR(w[0], 1 / (1 + e1), 1e-6);
    kvq_moe_topk(big, 3, 1, KVQ_ROUTER_SOFTMAX_TOPK, 1, ids, w);
    CHECK(ids[0] == 0 && w[0] == 1.0f);
}

static const float *sort_keys;
static int by_logit_desc(const void *a, const void *b)
{
    const int i = *(const int *)a, j = *(const int *)b;
    if (sort_keys[i] != sort_keys[j])
        return sort_keys[i] > sort_keys[j] ? -1 : 1;
    return i - j;
}

/* The router as a full sort and a double softmax. */
static void topk_ref(const float *lg, int E, int k, enum kvq_router_kind kind, int norm, int *ids, double *w)
{
    int idx[KVQ_MAX_EXPERTS];
    for (int e = 0; e < E; e++)
        idx[e] = e;
    sort_keys = lg;
    qsort(idx, (size_t)E, sizeof *idx, by_logit_desc);
    double mx = lg[idx[0]], all = 0, sel = 0;
    for (int e = 0; e < E; e++)
        all += exp(lg[e] - mx);
    for (int j = 0; j < k; j++)
        sel += exp(lg[idx[j]] - mx);
    for (int j = 0; j < k; j++) {
        ids[j] = idx[j];
        const double q = exp(lg[idx[j]] - mx);
        w[j] = kind == KVQ_ROUTER_TOPK_SOFTMAX || norm ? q / sel : q / all;
    }
}

static void test_topk_vs_sort(void)
{
    kvq_rng r;
    kvq_rng_init(&r, 7);
    static const int shapes[][2] = {{8, 2}, {16, 4}, {60, 8}, {128, 8}, {7, 7}, {1, 1}};
    int bad = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int rep = 0; rep < 200; rep++) {
            const int E = shapes[s][0], k = shapes[s][1];
            float lg[128];
            for (int e = 0; e < E; e++)
                lg[e] = (float)(3 * kvq_rng_gauss(&r));
            if (rep % 5 == 0 && E > 2)
                lg[E - 1] = lg[0]; /* a tie */
            for (int kind = 0; kind < 2; kind++)
                for (int norm = 0; norm < 2; norm++) {
                    int32_t ids[KVQ_MAX_TOP_K];
                    float w[KVQ_MAX_TOP_K];
                    int rid[KVQ_MAX_TOP_K];
                    double rw[KVQ_MAX_TOP_K];
                    kvq_moe_topk(lg, E, k, (enum kvq_router_kind)kind, norm, ids, w);
                    topk_ref(lg, E, k, (enum kvq_router_kind)kind, norm, rid, rw);
                    for (int j = 0; j < k; j++)
                        bad += ids[j] != rid[j] || fabs(w[j] - rw[j]) > 1e-6 * (1 + rw[j]);
                }
        }
    CHECKF(bad == 0, "%d router outputs differ from the sort-based reference", bad);
}

static void test_group(void)
{
    kvq_rng r;
    kvq_rng_init(&r, 11);
    enum { T = 37, K = 3, E = 9 };
    int32_t ids[T * K], start[E + 1], order[T * K];
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) { /* k distinct experts per row */
            int e;
            int again;
            do {
                e = (int)(kvq_rng_next(&r) % E);
                again = 0;
                for (int i = 0; i < j; i++)
                    again |= ids[t * K + i] == e;
            } while (again);
            ids[t * K + j] = e;
        }
    kvq_moe_group(ids, T, K, E, start, order);
    CHECK(start[0] == 0 && start[E] == T * K);
    int seen[T * K] = {0};
    for (int e = 0; e < E; e++) {
        CHECK(start[e] <= start[e + 1]);
        for (int i = start[e]; i < start[e + 1]; i++) {
            CHECK(ids[order[i]] == e);
            seen[order[i]]++;
            if (i > start[e])
                CHECK(order[i] > order[i - 1]); /* rows ascending within an expert */
        }
    }
    for (int i = 0; i < T * K; i++)
        CHECK(seen[i] == 1);
}

/* ---- config ----------------------------------------------------------- */

/* A config of 6 layers, hidden 32, 2 heads (head_dim 16) with the keys of
 * extra added (a key given twice keeps its first value). */
static kvq_status parse(const char *extra, struct kvq_model_config *c, kvq_error *err)
{
    char js[2048];
    snprintf(js, sizeof js,
             "{\"hidden_size\": 32, \"num_hidden_layers\": 6, \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
             " \"intermediate_size\": 40, \"vocab_size\": 64, \"max_position_embeddings\": 128,"
             " %s}",
             extra);
    return kvq_model_config_parse(js, strlen(js), c, err);
}

static int sparse_mask(const struct kvq_model_config *c)
{
    int m = 0;
    for (int l = 0; l < c->n_layers; l++)
        m |= kvq_model_layer_is_moe(c, l) << l;
    return m;
}

static void test_config(void)
{
    struct kvq_model_config c;
    kvq_error err = {0};
    CHECK_OK(parse("\"model_type\": \"qwen3_moe\", \"num_experts\": 8, \"num_experts_per_tok\": 2,"
                   " \"moe_intermediate_size\": 24, \"norm_topk_prob\": true, \"decoder_sparse_step\": 2,"
                   " \"mlp_only_layers\": [3]",
                   &c, &err));
    CHECK(c.arch.n_experts == 8 && c.arch.top_k == 2 && c.arch.moe_ffn == 24 && c.ffn == 40);
    CHECK(c.arch.norm_topk == 1 && c.arch.qk_norm == 1 && c.arch.router == KVQ_ROUTER_SOFTMAX_TOPK);
    CHECKF(sparse_mask(&c) == 0x22, "sparse layers %#x (want 1 and 5)", sparse_mask(&c)); /* (l+1) % 2, not 3 */
    CHECK(kvq_model_config_layer_params_at(&c, 1) - kvq_model_config_layer_params_at(&c, 0) ==
          8 * (32 + 3 * 32 * 24) - 3 * 32 * 40);
    CHECK_OK(parse("\"model_type\": \"qwen3_moe\", \"num_experts\": 8, \"num_experts_per_tok\": 2,"
                   " \"moe_intermediate_size\": 24",
                   &c, &err));
    CHECK(c.arch.norm_topk == 0 && sparse_mask(&c) == 0x3f); /* transformers' defaults */
    CHECK_OK(parse("\"model_type\": \"qwen3_moe\", \"num_experts\": 0, \"num_experts_per_tok\": 2", &c, &err));
    CHECK(c.arch.n_experts == 0 && sparse_mask(&c) == 0);
    /* transformers 5.17 writes Qwen3-MoE's expert count as num_local_experts */
    CHECK_OK(parse("\"model_type\": \"qwen3_moe\", \"num_local_experts\": 8, \"num_experts_per_tok\": 2,"
                   " \"moe_intermediate_size\": 24",
                   &c, &err));
    CHECK(c.arch.n_experts == 8);
    CHECK_OK(parse("\"model_type\": \"mixtral\", \"num_local_experts\": 8, \"num_experts_per_tok\": 2", &c, &err));
    CHECK(c.arch.n_experts == 8 && c.arch.moe_ffn == 40 && c.arch.norm_topk == 1 && sparse_mask(&c) == 0x3f);
    CHECK(c.arch.expert_names == KVQ_EXPERTS_MIXTRAL && !c.arch.qk_norm);
    CHECK_OK(parse("\"model_type\": \"olmoe\", \"num_experts\": 8, \"num_experts_per_tok\": 2", &c, &err));
    CHECK(c.arch.qk_norm_full == 1 && !c.arch.qk_norm && c.arch.norm_topk == 0 && c.arch.moe_ffn == 40);
    /* refusals, each naming its key */
    static const struct {
        const char *json, *needle;
    } bad[] = {
        {"\"model_type\": \"qwen3_moe\", \"num_experts\": 4, \"num_experts_per_tok\": 5, \"moe_intermediate_size\": 8",
         "num_experts_per_tok"},
        {"\"model_type\": \"qwen3_moe\", \"num_experts\": 4, \"num_experts_per_tok\": 2", "moe_intermediate_size"},
        {"\"model_type\": \"mixtral\", \"num_experts_per_tok\": 2", "num_local_experts"},
        {"\"model_type\": \"olmoe\", \"num_experts\": 4, \"num_experts_per_tok\": 2, \"clip_qkv\": 8", "clip_qkv"},
        {"\"model_type\": \"qwen3_moe\", \"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8,"
         " \"mlp_only_layers\": [6]",
         "mlp_only_layers"},
        {"\"model_type\": \"qwen3_moe\", \"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8,"
         " \"norm_topk_prob\": 1",
         "norm_topk_prob"},
        {"\"model_type\": \"olmoe\", \"num_experts\": 4, \"num_experts_per_tok\": 2, \"head_dim\": 8", "OLMoE"},
        {"\"model_type\": \"qwen2_moe\"", "qwen2_moe"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = 0;
        CHECKF(parse(bad[i].json, &c, &err) != KVQ_OK && strstr(err.msg, bad[i].needle), "%s: '%s'", bad[i].json,
               err.msg);
    }
}

/* ---- the CPU ops over synthetic checkpoints --------------------------- */

#define HID 32
#define VOC 64
#define NL 3 /* layer 1 dense (mlp_only_layers) */
#define MOE_F 24
#define DENSE_F 40

struct synth {
    int E, k, norm, fused; /* fused: f32 3-D tensors, else per-expert bf16 */
    float *router[NL], *gu[NL], *down[NL]; /* the stored values, as f32: [E][H], [E][2F][H], [E][H][F] */
};

static float bf16_round(float x)
{
    uint32_t b = kvq_f32_bits(x);
    b += 0x7fffu + ((b >> 16) & 1u);
    return kvq_bits_f32(b & 0xffff0000u);
}

/* Adds a [n] or [a][b] tensor of random values (scale s) to w, stored as
 * bf16 or f32; keeps the f32 values it stands for in *vals (caller frees)
 * and the stored buffer in keep[]. */
static float *add_random(kvq_st_writer *w, const char *name, int nd, const int64_t *shape, float s, float offset,
                         int bf16, kvq_rng *r, void **keep, int *n_keep)
{
    size_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= (size_t)shape[i];
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) {
        v[i] = offset + s * (float)kvq_rng_gauss(r);
        if (bf16)
            v[i] = bf16_round(v[i]);
    }
    void *data = v;
    if (bf16) {
        uint16_t *h = malloc(n * sizeof *h);
        for (size_t i = 0; i < n; i++)
            h[i] = (uint16_t)(kvq_f32_bits(v[i]) >> 16);
        data = h;
        keep[(*n_keep)++] = h;
    }
    CHECK_OK(kvq_st_writer_add(w, name, bf16 ? KVQ_ST_BF16 : KVQ_ST_F32, nd, shape, data));
    return v;
}

static void write_synth(const char *dir, struct synth *sy, uint64_t seed)
{
    mkdir(dir, 0777);
    char js[1024], path[256], name[160];
    snprintf(js, sizeof js,
             "{\"model_type\": \"qwen3_moe\", \"hidden_size\": %d, \"num_hidden_layers\": %d,"
             " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 16, \"intermediate_size\": %d,"
             " \"vocab_size\": %d, \"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-6, \"num_experts\": %d,"
             " \"num_experts_per_tok\": %d, \"moe_intermediate_size\": %d, \"norm_topk_prob\": %s,"
             " \"mlp_only_layers\": [1], \"tie_word_embeddings\": false}",
             HID, NL, DENSE_F, VOC, sy->E, sy->k, MOE_F, sy->norm ? "true" : "false");
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK(test_write_file(path, js, strlen(js)) == 0);
    kvq_st_writer *w = NULL;
    CHECK_OK(kvq_st_writer_create(&w));
    kvq_rng r;
    kvq_rng_init(&r, seed);
    void *keep[4096];
    int nk = 0;
    float *plain[64];
    int np = 0;
    const int bf = !sy->fused, E = sy->E;
#define ADD(nm, nd, s, off, ...)                                                                              \
    do {                                                                                                      \
        const int64_t sh_[] = {__VA_ARGS__};                                                                  \
        plain[np++] = add_random(w, nm, nd, sh_, s, off, bf, &r, keep, &nk);                                   \
    } while (0)
    ADD("model.embed_tokens.weight", 2, 1.0f, 0.0f, VOC, HID);
    ADD("model.norm.weight", 1, 0.1f, 1.0f, HID);
    ADD("lm_head.weight", 2, 0.2f, 0.0f, VOC, HID);
    for (int l = 0; l < NL; l++) {
        static const char *const att[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
        static const int64_t rows[] = {32, 16, 16, HID}, cols[] = {HID, HID, HID, 32};
        for (int i = 0; i < 4; i++) {
            snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.weight", l, att[i]);
            ADD(name, 2, 0.15f, 0.0f, rows[i], cols[i]);
        }
        snprintf(name, sizeof name, "model.layers.%d.self_attn.q_norm.weight", l);
        ADD(name, 1, 0.1f, 1.0f, 16);
        snprintf(name, sizeof name, "model.layers.%d.self_attn.k_norm.weight", l);
        ADD(name, 1, 0.1f, 1.0f, 16);
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        ADD(name, 1, 0.1f, 1.0f, HID);
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD(name, 1, 0.1f, 1.0f, HID);
        if (l == 1) {
            snprintf(name, sizeof name, "model.layers.%d.mlp.gate_proj.weight", l);
            ADD(name, 2, 0.15f, 0.0f, DENSE_F, HID);
            snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj.weight", l);
            ADD(name, 2, 0.15f, 0.0f, DENSE_F, HID);
            snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", l);
            ADD(name, 2, 0.15f, 0.0f, HID, DENSE_F);
            continue;
        }
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate.weight", l);
        ADD(name, 2, 0.3f, 0.0f, E, HID);
        sy->router[l] = plain[--np];
        sy->gu[l] = malloc((size_t)E * 2 * MOE_F * HID * sizeof(float));
        sy->down[l] = malloc((size_t)E * HID * MOE_F * sizeof(float));
        if (sy->fused) {
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj", l);
            ADD(name, 3, 0.2f, 0.0f, E, 2 * MOE_F, HID);
            memcpy(sy->gu[l], plain[np - 1], (size_t)E * 2 * MOE_F * HID * sizeof(float));
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj", l);
            ADD(name, 3, 0.2f, 0.0f, E, HID, MOE_F);
            memcpy(sy->down[l], plain[np - 1], (size_t)E * HID * MOE_F * sizeof(float));
            continue;
        }
        for (int e = 0; e < E; e++) {
            static const char *const nm[] = {"gate_proj", "up_proj", "down_proj"};
            for (int i = 0; i < 3; i++) {
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, nm[i]);
                if (i < 2) {
                    ADD(name, 2, 0.2f, 0.0f, MOE_F, HID);
                    memcpy(sy->gu[l] + ((size_t)e * 2 + i) * MOE_F * HID, plain[np - 1], MOE_F * HID * sizeof(float));
                } else {
                    ADD(name, 2, 0.2f, 0.0f, HID, MOE_F);
                    memcpy(sy->down[l] + (size_t)e * HID * MOE_F, plain[np - 1], HID * MOE_F * sizeof(float));
                }
            }
        }
    }
#undef ADD
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK_OK(kvq_st_writer_write(w, path, NULL));
    kvq_st_writer_free(w);
    for (int i = 0; i < nk; i++)
        free(keep[i]);
    for (int i = 0; i < np; i++) /* the f32 values (with f32 storage, the written buffers themselves) */
        free(plain[i]);
}

static void synth_free(struct synth *sy)
{
    for (int l = 0; l < NL; l++) {
        free(sy->router[l]);
        free(sy->gu[l]);
        free(sy->down[l]);
    }
}

/* The sparse layer in double: y0 + sum of the experts' weighted outputs;
 * *gap: the smallest k-th vs (k+1)-th logit gap over the rows. */
static void moe_ref(const struct synth *sy, int l, const float *x, const float *y0, size_t T, double *y, int32_t *ids,
                    double *gap)
{
    const int E = sy->E, k = sy->k;
    *gap = INFINITY;
    for (size_t t = 0; t < T; t++) {
        const float *xt = x + t * HID;
        float lg[64];
        for (int e = 0; e < E; e++) {
            double s = 0;
            for (int i = 0; i < HID; i++)
                s += (double)xt[i] * sy->router[l][e * HID + i];
            lg[e] = (float)s;
        }
        int rid[64];
        double rw[64];
        topk_ref(lg, E, k, KVQ_ROUTER_SOFTMAX_TOPK, sy->norm, rid, rw);
        if (k < E) {
            sort_keys = lg;
            int idx[64];
            for (int e = 0; e < E; e++)
                idx[e] = e;
            qsort(idx, (size_t)E, sizeof *idx, by_logit_desc);
            *gap = fmin(*gap, (double)lg[idx[k - 1]] - lg[idx[k]]);
        }
        for (int i = 0; i < HID; i++)
            y[t * HID + i] = y0[t * HID + i];
        for (int j = 0; j < k; j++) {
            const int e = rid[j];
            ids[t * (size_t)k + (size_t)j] = e;
            const float *g = sy->gu[l] + (size_t)e * 2 * MOE_F * HID, *u = g + MOE_F * HID;
            const float *d = sy->down[l] + (size_t)e * HID * MOE_F;
            double h[MOE_F];
            for (int f = 0; f < MOE_F; f++) {
                double a = 0, b = 0;
                for (int i = 0; i < HID; i++) {
                    a += (double)xt[i] * g[f * HID + i];
                    b += (double)xt[i] * u[f * HID + i];
                }
                h[f] = a / (1 + exp(-a)) * b;
            }
            for (int i = 0; i < HID; i++) {
                double s = 0;
                for (int f = 0; f < MOE_F; f++)
                    s += h[f] * d[i * MOE_F + f];
                y[t * HID + i] += rw[j] * s;
            }
        }
    }
}

/* Routes and runs layer l over T random rows; compares with moe_ref. */
static void check_ops(kvq_backend *be, const struct synth *sy, int l, size_t T, kvq_rng *r, float *y_out)
{
    const int k = sy->k;
    float *x = malloc(T * HID * sizeof *x), *y0 = malloc(T * HID * sizeof *y0);
    double *ref = malloc(T * HID * sizeof *ref), gap;
    int32_t *rid = malloc(T * (size_t)k * sizeof *rid);
    for (size_t i = 0; i < T * HID; i++) {
        x[i] = (float)kvq_rng_gauss(r);
        y_out[i] = y0[i] = (float)kvq_rng_gauss(r);
    }
    moe_ref(sy, l, x, y0, T, ref, rid, &gap);
    be->ops->moe_route(be, l, x, T);
    be->ops->moe_experts(be, l, x, y_out, T);
    CHECKF(gap > 1e-4, "test data: router gap %.3g too small to compare ids", gap);
    int id_bad = 0, most = 0;
    int count[64] = {0};
    for (size_t t = 0; t < T * (size_t)k; t++) {
        id_bad += be->moe_ids[t] != rid[t];
        most = ++count[rid[t]] > most ? count[rid[t]] : most;
    }
    CHECKF(id_bad == 0, "layer %d, %zu rows: %d expert ids differ from the reference", l, T, id_bad);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < T * HID; i++) {
        worst = fmax(worst, fabs(y_out[i] - ref[i]));
        scale = fmax(scale, fabs(ref[i] - y0[i]));
    }
    CHECKF(worst <= 2e-6 * (1 + scale), "layer %d, %zu rows (busiest expert %d rows): |y - ref| %.3g (moe part %.3g)",
           l, T, most, worst, scale);
    if (T == 40)
        CHECKF(most > 16, "no expert got more than 16 of %zu rows: the sgemm path is not exercised", T);
    free(x);
    free(y0);
    free(ref);
    free(rid);
}

static void test_cpu_ops(void)
{
    static const struct {
        int E, k, norm, fused;
    } cases[] = {{4, 2, 1, 0}, {6, 3, 0, 1}};
    for (size_t c = 0; c < 2; c++) {
        char dir[64];
        snprintf(dir, sizeof dir, "/tmp/kvq_moe_%d_%zu", (int)getpid(), c);
        struct synth sy = {cases[c].E, cases[c].k, cases[c].norm, cases[c].fused, {0}, {0}, {0}};
        write_synth(dir, &sy, 100 + c);
        kvq_model *m[2] = {NULL, NULL};
        kvq_error err = {0};
        struct kvq_model_load_opts o;
        kvq_model_load_opts_default(&o);
        CHECKF(kvq_model_load(dir, &o, &m[0], &err) == KVQ_OK, "%s", err.msg);
        o.weights_f32 = 1;
        CHECKF(kvq_model_load(dir, &o, &m[1], &err) == KVQ_OK, "%s", err.msg);
        kvq_backend *be[2] = {NULL, NULL};
        for (int i = 0; i < 2 && m[i]; i++)
            CHECK_OK(kvq_backend_cpu_create(m[i], 40, &be[i]));
        static const size_t Ts[] = {1, 3, 16, 17, 40};
        float y[2][40 * HID];
        for (size_t ti = 0; be[0] && be[1] && ti < sizeof Ts / sizeof Ts[0]; ti++)
            for (int l = 0; l < NL; l += 2) {
                for (int i = 0; i < 2; i++) {
                    kvq_rng r;
                    kvq_rng_init(&r, 1000 * ti + (uint64_t)l);
                    check_ops(be[i], &sy, l, Ts[ti], &r, y[i]);
                }
                /* widened at load or as read: the same f32 values, the same kernels */
                CHECKF(memcmp(y[0], y[1], Ts[ti] * HID * sizeof(float)) == 0,
                       "weights_f32 changes the bits of layer %d at %zu rows", l, Ts[ti]);
            }
        struct kvq_model_info mi;
        kvq_model_get_info(m[0], &mi);
        const size_t esz = cases[c].fused ? 4 : 2;
        const size_t moe = 2 * (size_t)cases[c].E * (HID + 3 * HID * MOE_F) * esz;
        const size_t attn = NL * (size_t)(32 * HID + 2 * 16 * HID + HID * 32) * esz, dense = 3 * HID * DENSE_F * esz;
        const size_t norms = (NL * 2 + 1) * HID * sizeof(float), lm = VOC * HID * esz;
        CHECKF(mi.weight_bytes == moe + attn + dense + norms + lm, "weight_bytes %zu, want %zu", mi.weight_bytes,
               moe + attn + dense + norms + lm);
        for (int i = 0; i < 2; i++) {
            kvq_backend_free(be[i]);
            kvq_model_free(m[i]);
        }
        synth_free(&sy);
        test_rm_dir(dir);
    }
}

/* Prompt logits and greedy ids of model m with an expert cache of `bytes`
 * (0: none); *st: its statistics. */
static void run_seq(const kvq_model *m, size_t bytes, const int32_t *ids, size_t T, float *logits, int32_t *greedy,
                    size_t N, struct kvq_seq_stats *st)
{
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.type_k = sc.type_v = KVQ_TYPE_F32;
    sc.max_ctx = T + N;
    sc.expert_cache = bytes;
    kvq_seq *s = NULL;
    kvq_error err = {0};
    CHECKF(kvq_seq_create(m, &sc, &s, &err) == KVQ_OK, "%s", err.msg);
    if (!s)
        return;
    CHECK_OK(kvq_seq_forward(s, ids, T, 0, logits, NULL));
    kvq_seq_reset(s);
    struct kvq_gen_params gp;
    kvq_gen_params_default(&gp);
    gp.max_tokens = (int)N;
    gp.stop_at_eos = 0;
    size_t n = 0;
    CHECK_OK(kvq_seq_generate(s, ids, T, &gp, greedy, N, &n, NULL, NULL));
    CHECK(n == N);
    kvq_seq_get_stats(s, st);
    kvq_seq_free(s);
}

/* kvq_seq_config.expert_cache: with room for 1, 2 (fewer than one layer's
 * experts) or all experts, the logits are bit-identical to the mapped
 * experts' and the greedy ids the same; every miss reads exactly one
 * expert's bytes; with room for all, each expert is read at most once. */
static void test_expert_cache(void)
{
    static const struct {
        int E, k, norm, fused;
    } cases[] = {{4, 2, 1, 0}, {6, 3, 0, 1}};
    enum { T = 24, N = 12 };
    for (size_t c = 0; c < 2; c++) {
        char dir[64];
        snprintf(dir, sizeof dir, "/tmp/kvq_moe_cache_%d_%zu", (int)getpid(), c);
        struct synth sy = {cases[c].E, cases[c].k, cases[c].norm, cases[c].fused, {0}, {0}, {0}};
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
        run_seq(m, 0, ids, T, l0, g0, N, &st);
        CHECK(st.expert_cache_bytes == 0 && st.expert_misses == 0);
        const size_t slots[3] = {1, 2, all};
        for (int i = 0; i < 3; i++) {
            memset(l1, 0, sizeof l1);
            run_seq(m, slots[i] * expert + expert / 2, ids, T, l1, g1, N, &st);
            CHECKF(memcmp(l0, l1, sizeof l0) == 0, "%zu slots: logits differ from the mapped experts'", slots[i]);
            CHECKF(memcmp(g0, g1, sizeof g0) == 0, "%zu slots: greedy ids differ", slots[i]);
            CHECK(st.expert_cache_bytes == slots[i] * expert);
            CHECKF(st.expert_bytes_read == st.expert_misses * expert, "%zu bytes read for %zu misses",
                   st.expert_bytes_read, st.expert_misses);
            CHECK(st.expert_misses > 0 && st.expert_hits + st.expert_misses > 0);
            if (slots[i] == all)
                CHECKF(st.expert_misses <= all && st.expert_hits > 0, "room for all: %zu misses, %zu hits",
                       st.expert_misses, st.expert_hits);
            printf("  %s experts, cache of %zu of %zu: %zu hits, %zu misses, %zu bytes read\n",
                   cases[c].fused ? "fused" : "per-expert", slots[i], all, st.expert_hits, st.expert_misses,
                   st.expert_bytes_read);
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

/* kvq_batch over a sparse model: prompts of 5, 9 and 20 tokens in one step
 * (the first two share a row group, the third goes alone through sgemm),
 * then greedy decode rows together; every slot's logits bit-identical to
 * its own kvq_seq run, with and without a 2-slot expert cache. */
static void test_batch_invariance(void)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/kvq_moe_batch_%d", (int)getpid());
    struct synth sy = {4, 2, 1, 0, {0}, {0}, {0}};
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
            it[i] = (struct kvq_batch_item){slot[i], prompt[i], len[i], got[i][0], &tok[i], NULL, NULL};
        }
        CHECK_OK(kvq_batch_step(b, it, S, &err));
        int bad = 0;
        for (int k = 1; k <= STEPS; k++) {
            int32_t in[S];
            for (int i = 0; i < S; i++) {
                bad += tok[i] != tok_alone[i][k - 1];
                in[i] = tok[i];
                it[i] = (struct kvq_batch_item){slot[i], &in[i], 1, got[i][k], &tok[i], NULL, NULL};
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
            CHECKF(st.expert_misses >= 2 * BIG_E - 8, "%zu misses: not every expert was used", st.expert_misses);
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

int main(void)
{
    RUN(test_topk_analytic);
    RUN(test_topk_vs_sort);
    RUN(test_group);
    RUN(test_config);
    RUN(test_cpu_ops);
    RUN(test_expert_cache);
    RUN(test_batch_invariance);
    RUN(test_expert_cache_rss);
    return TEST_END("test_moe");
}
