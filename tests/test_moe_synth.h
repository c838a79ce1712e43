/* test_moe_synth.h - tiny synthetic qwen3_moe checkpoints for the MoE tests
 * (test_moe.c, test_expert_cache.c): 3 layers (layer 1 dense by
 * mlp_only_layers), hidden 32, experts of 24, random weights stored per
 * expert in bf16 or fused in f32, and their values kept as f32 for the
 * scalar references. With `shared`, a qwen2_moe checkpoint instead: no q/k
 * norms, no q/k/v biases (qkv_bias false), and in each sparse layer a
 * shared expert of SHARED_F with its gate. */
#ifndef KVQ_TEST_MOE_SYNTH_H
#define KVQ_TEST_MOE_SYNTH_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvq_half.h"
#include "kvq_rng.h"
#include "kvq_safetensors.h"
#include "test.h"
#include "test_util.h"


#define HID 32
#define VOC 64
#define NL 3 /* layer 1 dense (mlp_only_layers) */
#define MOE_F 24
#define DENSE_F 40
#define SHARED_F 40 /* over MOE_F: the experts op sizes its buffers for both */

struct synth {
    int E, k, norm, fused; /* fused: f32 3-D tensors, else per-expert bf16 */
    float *router[NL], *gu[NL], *down[NL]; /* the stored values, as f32: [E][H], [E][2F][H], [E][H][F] */
    int shared;                            /* qwen2_moe with a shared expert */
    float *sgu[NL], *sdown[NL], *sgate[NL]; /* its [2 SHARED_F][H], [H][SHARED_F], [1][H] */
};

static inline float bf16_round(float x)
{
    uint32_t b = kvq_f32_bits(x);
    b += 0x7fffu + ((b >> 16) & 1u);
    return kvq_bits_f32(b & 0xffff0000u);
}

/* Adds a [n] or [a][b] tensor of random values (scale s) to w, stored as
 * bf16 or f32; keeps the f32 values it stands for in *vals (caller frees)
 * and the stored buffer in keep[]. */
static inline float *add_random(kvq_st_writer *w, const char *name, int nd, const int64_t *shape, float s, float offset,
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

static inline void write_synth(const char *dir, struct synth *sy, uint64_t seed)
{
    mkdir(dir, 0777);
    char js[1024], path[256], name[160], extra[128] = "";
    if (sy->shared)
        snprintf(extra, sizeof extra, ", \"qkv_bias\": false, \"shared_expert_intermediate_size\": %d", SHARED_F);
    snprintf(js, sizeof js,
             "{\"model_type\": \"%s\", \"hidden_size\": %d, \"num_hidden_layers\": %d,"
             " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 16, \"intermediate_size\": %d,"
             " \"vocab_size\": %d, \"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-6, \"num_experts\": %d,"
             " \"num_experts_per_tok\": %d, \"moe_intermediate_size\": %d, \"norm_topk_prob\": %s,"
             " \"mlp_only_layers\": [1], \"tie_word_embeddings\": false%s}",
             sy->shared ? "qwen2_moe" : "qwen3_moe", HID, NL, DENSE_F, VOC, sy->E, sy->k, MOE_F,
             sy->norm ? "true" : "false", extra);
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
        if (!sy->shared) {
            snprintf(name, sizeof name, "model.layers.%d.self_attn.q_norm.weight", l);
            ADD(name, 1, 0.1f, 1.0f, 16);
            snprintf(name, sizeof name, "model.layers.%d.self_attn.k_norm.weight", l);
            ADD(name, 1, 0.1f, 1.0f, 16);
        }
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
        if (sy->shared) {
            sy->sgu[l] = malloc(2 * SHARED_F * HID * sizeof(float));
            static const char *const snm[] = {"gate_proj", "up_proj"};
            for (int i = 0; i < 2; i++) {
                snprintf(name, sizeof name, "model.layers.%d.mlp.shared_expert.%s.weight", l, snm[i]);
                ADD(name, 2, 0.2f, 0.0f, SHARED_F, HID);
                memcpy(sy->sgu[l] + (size_t)i * SHARED_F * HID, plain[np - 1], SHARED_F * HID * sizeof(float));
            }
            snprintf(name, sizeof name, "model.layers.%d.mlp.shared_expert.down_proj.weight", l);
            ADD(name, 2, 0.2f, 0.0f, HID, SHARED_F);
            sy->sdown[l] = plain[--np];
            snprintf(name, sizeof name, "model.layers.%d.mlp.shared_expert_gate.weight", l);
            ADD(name, 2, 0.3f, 0.0f, 1, HID);
            sy->sgate[l] = plain[--np];
        }
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

static inline void synth_free(struct synth *sy)
{
    for (int l = 0; l < NL; l++) {
        free(sy->router[l]);
        free(sy->gu[l]);
        free(sy->down[l]);
        free(sy->sgu[l]);
        free(sy->sdown[l]);
        free(sy->sgate[l]);
    }
}

/* The sparse layer in double: y0 + sum of the experts' weighted outputs;
 * *gap: the smallest k-th vs (k+1)-th logit gap over the rows. */
#endif
