/* test_moe.c - mixture-of-experts pieces against scalar references written
 * here: the router's top-k and weights (analytic cases and a sort-based
 * reference), the grouping of rows by expert, the config keys, and the CPU
 * backend's router and grouped-expert ops over synthetic checkpoints in
 * both expert layouts (per expert in bf16, fused in f32), against a double
 * precision forward of the same weights, with enough rows that some expert
 * gets more than the few-row kernel's 16 (sgemm). The expert cache and
 * batches: test_expert_cache.c.
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
#include "kvq_half.h"
#include "kvq_model.h"
#include "kvq_rng.h"
#include "kvq_safetensors.h"
#include "test.h"
#include "test_moe_synth.h"
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
    /* Qwen2-MoE: q/k/v biases (unless qkv_bias is false), a gated shared expert in every sparse layer */
    CHECK_OK(parse("\"model_type\": \"qwen2_moe\", \"num_experts\": 8, \"num_experts_per_tok\": 2,"
                   " \"moe_intermediate_size\": 24, \"shared_expert_intermediate_size\": 48, \"mlp_only_layers\": [0]",
                   &c, &err));
    CHECK(c.arch.n_experts == 8 && c.arch.moe_ffn == 24 && c.arch.shared_ffn == 48 && c.arch.qkv_bias == 1);
    CHECK(c.arch.norm_topk == 0 && !c.arch.qk_norm && sparse_mask(&c) == 0x3e);
    CHECK(kvq_model_config_layer_params_at(&c, 1) - kvq_model_config_layer_params_at(&c, 0) ==
          8 * (32 + 3 * 32 * 24) + 3 * 32 * 48 + 32 - 3 * 32 * 40);
    CHECK_OK(parse("\"model_type\": \"qwen2_moe\", \"num_experts\": 8, \"num_experts_per_tok\": 2,"
                   " \"moe_intermediate_size\": 24, \"shared_expert_intermediate_size\": 48, \"qkv_bias\": false",
                   &c, &err));
    CHECK(c.arch.qkv_bias == 0);
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
        {"\"model_type\": \"qwen2_moe\", \"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8",
         "shared_expert_intermediate_size"},
        {"\"model_type\": \"qwen3_moe\", \"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8,"
         " \"shared_expert_intermediate_size\": 16",
         "shared experts are not supported for model_type 'qwen3_moe'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = 0;
        CHECKF(parse(bad[i].json, &c, &err) != KVQ_OK && strstr(err.msg, bad[i].needle), "%s: '%s'", bad[i].json,
               err.msg);
    }
}

/* ---- the CPU ops over synthetic checkpoints --------------------------- */

/* o[HID] = down . (silu(gate . x) * (up . x)) in double, for an expert of
 * intermediate size F ([F][HID] gate and up, [HID][F] down). */
static void mlp_ref(const float *x, const float *g, const float *u, const float *d, int F, double *o)
{
    double h[SHARED_F > MOE_F ? SHARED_F : MOE_F];
    for (int f = 0; f < F; f++) {
        double a = 0, b = 0;
        for (int i = 0; i < HID; i++) {
            a += (double)x[i] * g[f * HID + i];
            b += (double)x[i] * u[f * HID + i];
        }
        h[f] = a / (1 + exp(-a)) * b;
    }
    for (int i = 0; i < HID; i++) {
        double s = 0;
        for (int f = 0; f < F; f++)
            s += h[f] * d[i * F + f];
        o[i] = s;
    }
}

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
            const float *g = sy->gu[l] + (size_t)e * 2 * MOE_F * HID;
            double o[HID];
            mlp_ref(xt, g, g + MOE_F * HID, sy->down[l] + (size_t)e * HID * MOE_F, MOE_F, o);
            for (int i = 0; i < HID; i++)
                y[t * HID + i] += rw[j] * o[i];
        }
        if (!sy->shared)
            continue;
        /* Qwen2-MoE: + sigmoid(gate . x) x the shared expert's output */
        double gl = 0, o[HID];
        for (int i = 0; i < HID; i++)
            gl += (double)xt[i] * sy->sgate[l][i];
        mlp_ref(xt, sy->sgu[l], sy->sgu[l] + SHARED_F * HID, sy->sdown[l], SHARED_F, o);
        for (int i = 0; i < HID; i++)
            y[t * HID + i] += o[i] / (1 + exp(-gl));
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
        int E, k, norm, fused, shared;
    } cases[] = {{4, 2, 1, 0, 0}, {6, 3, 0, 1, 0}, {5, 2, 0, 0, 1}, {4, 2, 1, 1, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char dir[64];
        snprintf(dir, sizeof dir, "/tmp/kvq_moe_%d_%zu", (int)getpid(), c);
        struct synth sy = {.E = cases[c].E, .k = cases[c].k, .norm = cases[c].norm, .fused = cases[c].fused,
                           .shared = cases[c].shared};
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
                       "case %zu: weights_f32 changes the bits of layer %d at %zu rows", c, l, Ts[ti]);
            }
        struct kvq_model_info mi;
        kvq_model_get_info(m[0], &mi);
        const size_t esz = cases[c].fused ? 4 : 2;
        const size_t moe = 2 * ((size_t)cases[c].E * (HID + 3 * HID * MOE_F) +
                                (cases[c].shared ? 3 * HID * SHARED_F + HID : 0)) * esz;
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

int main(void)
{
    RUN(test_topk_analytic);
    RUN(test_topk_vs_sort);
    RUN(test_group);
    RUN(test_config);
    RUN(test_cpu_ops);
    return TEST_END("test_moe");
}
