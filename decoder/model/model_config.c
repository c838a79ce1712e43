/* model_config.c - config.json -> struct kvq_model_config.
 *
 * This file is the one place that knows how Llama-family variants differ:
 * arch_from_type() maps model_type and the bias/norm/tying keys to the flags
 * of struct kvq_model_arch (parse_moe: the mixture-of-experts fields), and
 * everything downstream only reads the flags.
 */
#include "kvq_model.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq_attn.h"

#define MAX_DIM (1 << 20)
#define MAX_LAYERS KVQ_MODEL_MAX_LAYERS
#define MAX_VOCAB (1 << 24)
#define MAX_CTX (1 << 24)

/* @return 1 when key is present and true. */
static int get_bool(const cJSON *root, const char *key)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, key));
}

/* Reads an integer key into *out. Absent or null: *out = def, and an error
 * when def < 0 (required). */
static kvq_status get_int(const cJSON *root, const char *key, int def, long max, int *out, kvq_error *err)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!j || cJSON_IsNull(j)) {
        if (def < 0)
            return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: missing '%s'", key);
        *out = def;
        return KVQ_OK;
    }
    double v = cJSON_IsNumber(j) ? j->valuedouble : -1.0;
    if (!(v >= 1.0) || v > (double)max || floor(v) != v)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: '%s' must be an integer in [1, %ld]", key, max);
    *out = (int)v;
    return KVQ_OK;
}

/* Token id keys: int, list of ints (eos) or null. */
static kvq_status get_ids(const cJSON *root, const char *key, int32_t *ids, int max_ids, int *n, kvq_error *err)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    *n = 0;
    for (int i = 0; i < max_ids; i++)
        ids[i] = -1;
    if (!j || cJSON_IsNull(j))
        return KVQ_OK;
    const cJSON *e = cJSON_IsArray(j) ? j->child : j;
    for (; e && *n < max_ids; e = cJSON_IsArray(j) ? e->next : NULL) {
        double v = cJSON_IsNumber(e) ? e->valuedouble : -1.0;
        if (!(v >= 0.0) || v >= (double)MAX_VOCAB || floor(v) != v)
            return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: '%s' is not a token id", key);
        ids[(*n)++] = (int32_t)v;
    }
    return KVQ_OK;
}

/* The architecture flags of each supported model_type. */
static kvq_status arch_from_type(const cJSON *root, const char *type, struct kvq_model_arch *a, kvq_error *err)
{
    memset(a, 0, sizeof *a);
    a->norm = KVQ_NORM_RMS;
    a->act = KVQ_ACT_SILU;
    a->rope = KVQ_ROPE_HALF;
    a->embed_scale = 1.0f;
    a->tied_embeddings = get_bool(root, "tie_word_embeddings");
    int attention_bias = get_bool(root, "attention_bias");
    if (strcmp(type, "llama") == 0 || strcmp(type, "mistral") == 0) {
        a->qkv_bias = a->o_bias = attention_bias;
        a->mlp_bias = get_bool(root, "mlp_bias");
    } else if (strcmp(type, "qwen2") == 0) {
        a->qkv_bias = 1; /* Qwen2 always has q/k/v biases and none elsewhere */
    } else if (strcmp(type, "gemma3_text") == 0) {
        a->qk_norm = 1;
        a->sandwich_norm = 1;
        a->norm = KVQ_NORM_RMS_UNIT_OFFSET;
        a->act = KVQ_ACT_GELU_TANH;
        a->qkv_bias = a->o_bias = attention_bias;
        a->tied_embeddings = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings"));
    } else if (strcmp(type, "phi3") == 0) {
        a->fused_proj = 1; /* qkv_proj and gate_up_proj, no biases */
    } else if (strcmp(type, "qwen3") == 0 || strcmp(type, "qwen3_moe") == 0) {
        a->qkv_bias = a->o_bias = attention_bias;
        a->qk_norm = 1;
        a->n_experts = strcmp(type, "qwen3_moe") == 0 ? -1 : 0; /* -1: read by parse_moe */
    } else if (strcmp(type, "qwen2_moe") == 0) {
        /* q/k/v biases unless the config says otherwise (transformers 5's qkv_bias; the Hub's
         * Qwen1.5-MoE and Qwen2-MoE configs do not name it) */
        const cJSON *qb = cJSON_GetObjectItemCaseSensitive(root, "qkv_bias");
        a->qkv_bias = !cJSON_IsFalse(qb);
        a->n_experts = -1;
    } else if (strcmp(type, "mixtral") == 0) {
        a->n_experts = -1;
        a->expert_names = KVQ_EXPERTS_MIXTRAL;
        a->norm_topk = 1; /* always: transformers renormalises the top-k of the softmax */
    } else if (strcmp(type, "olmoe") == 0) {
        a->qkv_bias = a->o_bias = attention_bias;
        a->qk_norm_full = 1;
        a->n_experts = -1;
    } else {
        return kvq_error_set(err, KVQ_ERR_UNSUPPORTED,
                             "config.json: model_type '%s' is not supported (llama, mistral, qwen2, qwen3, phi3, "
                             "gemma3_text, qwen3_moe, qwen2_moe, mixtral, olmoe)",
                             type);
    }
    return KVQ_OK;
}

/* The mixture-of-experts keys of the families arch_from_type marked
 * (n_experts = -1): expert count, top-k, expert size, renormalisation and
 * which layers are sparse, as each family's transformers module reads them.
 * Needs n_layers and ffn. */
static kvq_status parse_moe(const cJSON *root, struct kvq_model_config *c, kvq_error *err)
{
    struct kvq_model_arch *a = &c->arch;
    memset(a->moe_layers, 0, sizeof a->moe_layers);
    if (a->n_experts == 0)
        return KVQ_OK;
    const int mixtral = a->expert_names == KVQ_EXPERTS_MIXTRAL;
    const int qwen2 = strcmp(c->model_type, "qwen2_moe") == 0, qwen = qwen2 || strcmp(c->model_type, "qwen3_moe") == 0;
    /* the family's key, else the other one: transformers 5.17 saves Qwen3-MoE's
     * num_experts as num_local_experts (an attribute_map), the Hub's configs
     * say num_experts */
    const char *n_key = mixtral ? "num_local_experts" : "num_experts";
    const char *alt = mixtral ? "num_experts" : "num_local_experts";
    const cJSON *ne = cJSON_GetObjectItemCaseSensitive(root, n_key);
    if (!ne || cJSON_IsNull(ne)) {
        const cJSON *a2 = cJSON_GetObjectItemCaseSensitive(root, alt);
        if (a2 && !cJSON_IsNull(a2)) {
            n_key = alt;
            ne = a2;
        }
    }
    if (qwen && cJSON_IsNumber(ne) && ne->valuedouble == 0) { /* Qwen3-MoE without experts: every layer dense */
        a->n_experts = 0;
        return KVQ_OK;
    }
    kvq_status st;
    if ((st = get_int(root, n_key, -1, KVQ_MAX_EXPERTS, &a->n_experts, err)) ||
        (st = get_int(root, "num_experts_per_tok", -1, KVQ_MAX_TOP_K, &a->top_k, err)))
        return st;
    if (a->top_k > a->n_experts)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: num_experts_per_tok %d is more than the %d experts",
                             a->top_k, a->n_experts);
    a->moe_ffn = c->ffn; /* Mixtral and OLMoE: intermediate_size is the experts' */
    if (qwen && (st = get_int(root, "moe_intermediate_size", -1, MAX_DIM, &a->moe_ffn, err)))
        return st;
    if (!mixtral) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(root, "norm_topk_prob");
        if (n && !cJSON_IsNull(n) && !cJSON_IsBool(n))
            return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: norm_topk_prob must be true or false");
        a->norm_topk = cJSON_IsTrue(n); /* both configs default to false */
    }
    const cJSON *clip = cJSON_GetObjectItemCaseSensitive(root, "clip_qkv");
    if (clip && !cJSON_IsNull(clip))
        return kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "config.json: clip_qkv is not supported");
    a->shared_ffn = 0;
    if (qwen2) { /* Qwen2-MoE: a gated shared expert in every sparse layer */
        if ((st = get_int(root, "shared_expert_intermediate_size", -1, MAX_DIM, &a->shared_ffn, err)))
            return st;
    } else {
        const cJSON *shared = cJSON_GetObjectItemCaseSensitive(root, "shared_expert_intermediate_size");
        if (cJSON_IsNumber(shared) && shared->valuedouble > 0)
            return kvq_error_set(err, KVQ_ERR_UNSUPPORTED,
                                 "config.json: shared experts are not supported for model_type '%s'", c->model_type);
    }
    a->router = KVQ_ROUTER_SOFTMAX_TOPK;
    int step = 1;
    if (qwen && (st = get_int(root, "decoder_sparse_step", 1, MAX_LAYERS, &step, err)))
        return st;
    for (int l = 0; l < c->n_layers; l++)
        if ((l + 1) % step == 0)
            a->moe_layers[l / 8] |= (uint8_t)(1u << (l % 8));
    const cJSON *only = qwen ? cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers") : NULL;
    if (only && !cJSON_IsNull(only)) {
        if (!cJSON_IsArray(only))
            return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: mlp_only_layers must be a list of layer indices");
        for (const cJSON *e = only->child; e; e = e->next) {
            if (!cJSON_IsNumber(e) || floor(e->valuedouble) != e->valuedouble || e->valuedouble < 0 ||
                e->valuedouble >= c->n_layers)
                return kvq_error_set(err, KVQ_ERR_FORMAT,
                                     "config.json: mlp_only_layers entry is not a layer index in [0, %d)", c->n_layers);
            const int l = (int)e->valuedouble;
            a->moe_layers[l / 8] &= (uint8_t)~(1u << (l % 8));
        }
    }
    return KVQ_OK;
}

/* A number key of obj: *out = def when absent or null; else must be finite
 * and >= lo. */
static kvq_status get_num(const cJSON *obj, const char *key, double def, double lo, double *out, kvq_error *err)
{
    const cJSON *j = obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    if (!j || cJSON_IsNull(j)) {
        *out = def;
        return KVQ_OK;
    }
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble) || !(j->valuedouble >= lo))
        return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: rope '%s' must be a number >= %g", key, lo);
    *out = j->valuedouble;
    return KVQ_OK;
}

/* longrope's short_factor / long_factor: exactly n positive numbers. */
static kvq_status get_factors(const cJSON *obj, const char *key, int n, float *out, kvq_error *err)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: longrope '%s' must be a list of %d numbers (rotary_dim / 2)",
                             key, n);
    int i = 0;
    for (const cJSON *e = a->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || !(e->valuedouble > 0) || !isfinite(e->valuedouble))
            return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: longrope '%s'[%d] is not a positive number", key, i);
        out[i] = (float)e->valuedouble;
    }
    return KVQ_OK;
}

/* The RoPE object of a config: rope_parameters (transformers 5) or
 * rope_scaling (older); NULL for plain RoPE. One keyed by layer type
 * (Gemma 3 in transformers 5) gives its full_attention object, and its
 * sliding_attention object in *local. */
static kvq_status rope_object(const cJSON *root, const cJSON **obj, const cJSON **local, kvq_error *err)
{
    static const char *keys[2] = {"rope_parameters", "rope_scaling"};
    *obj = *local = NULL;
    for (int i = 0; i < 2; i++) {
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, keys[i]);
        if (!o || cJSON_IsNull(o))
            continue;
        if (!cJSON_IsObject(o))
            return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: '%s' is not an object", keys[i]);
        if (!*obj)
            *obj = o;
    }
    const cJSON *full = *obj ? cJSON_GetObjectItemCaseSensitive(*obj, "full_attention") : NULL;
    if (cJSON_IsObject(full)) {
        *local = cJSON_GetObjectItemCaseSensitive(*obj, "sliding_attention");
        *obj = full;
    }
    return KVQ_OK;
}

/* Gemma 3's windowed layers: plain RoPE of rope_local_base_freq (or the
 * sliding_attention object's rope_theta), 10000 by default. */
static kvq_status parse_local_rope(const cJSON *root, const cJSON *local, struct kvq_model_config *c, kvq_error *err)
{
    const cJSON *t = local ? cJSON_GetObjectItemCaseSensitive(local, "rope_theta")
                           : cJSON_GetObjectItemCaseSensitive(root, "rope_local_base_freq");
    const cJSON *ty = local ? cJSON_GetObjectItemCaseSensitive(local, "rope_type") : NULL;
    if (ty && !cJSON_IsNull(ty) && !(cJSON_IsString(ty) && strcmp(ty->valuestring, "default") == 0))
        return kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "config.json: sliding_attention rope type '%.40s' is not supported",
                             cJSON_IsString(ty) ? ty->valuestring : "?");
    c->arch.rope_local_theta = 10000.0;
    if (t && !cJSON_IsNull(t)) {
        if (!cJSON_IsNumber(t) || !(t->valuedouble > 1.0) || !isfinite(t->valuedouble))
            return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: the local rope_theta must be a number > 1");
        c->arch.rope_local_theta = t->valuedouble;
    }
    return KVQ_OK;
}

/* rope_theta, partial_rotary_factor and the scaling of transformers' rope
 * init functions. Keys are read from the RoPE object first, then the top
 * level (older configs keep rope_theta, partial_rotary_factor and Phi-3's
 * original_max_position_embeddings there). Needs head_dim and max_ctx. */
static kvq_status parse_rope(const cJSON *root, struct kvq_model_config *c, kvq_error *err)
{
    const cJSON *o, *local;
    kvq_status st = rope_object(root, &o, &local, err);
    if (st != KVQ_OK || (c->arch.sandwich_norm && (st = parse_local_rope(root, local, c, err)) != KVQ_OK))
        return st;
    struct kvq_rope_scaling *rs = &c->arch.rope_scaling;
    memset(rs, 0, sizeof *rs);
    rs->truncate = 1;
    const cJSON *ty = o ? cJSON_GetObjectItemCaseSensitive(o, "rope_type") : NULL;
    if (o && !ty)
        ty = cJSON_GetObjectItemCaseSensitive(o, "type");
    static const struct {
        const char *name;
        enum kvq_rope_scaling_kind kind;
    } kinds[] = {{"default", KVQ_ROPE_SCALE_NONE},    {"linear", KVQ_ROPE_SCALE_LINEAR},
                 {"dynamic", KVQ_ROPE_SCALE_DYNAMIC}, {"yarn", KVQ_ROPE_SCALE_YARN},
                 {"llama3", KVQ_ROPE_SCALE_LLAMA3},   {"longrope", KVQ_ROPE_SCALE_LONGROPE}};
    if (ty && !cJSON_IsNull(ty)) {
        size_t k = 0;
        while (k < sizeof kinds / sizeof kinds[0] && !(cJSON_IsString(ty) && strcmp(ty->valuestring, kinds[k].name) == 0))
            k++;
        if (k == sizeof kinds / sizeof kinds[0])
            return kvq_error_set(err, KVQ_ERR_UNSUPPORTED,
                                 "config.json: rope type '%.40s' is not supported (default, linear, dynamic, yarn, "
                                 "llama3, longrope)",
                                 cJSON_IsString(ty) ? ty->valuestring : "?");
        rs->kind = kinds[k].kind;
    }
#define NUM(obj, key, def, lo, dst)                                                                                    \
    do {                                                                                                               \
        if ((st = get_num(obj, key, def, lo, dst, err)) != KVQ_OK)                                                     \
            return st;                                                                                                 \
    } while (0)
    /* rope_theta: the object's, else the top level's, else Llama's default */
    double theta, prf, v;
    NUM(root, "rope_theta", 10000.0, 1.0, &theta);
    NUM(o, "rope_theta", theta, 1.0, &theta);
    if (!(theta > 1.0))
        return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: rope_theta must be a number > 1");
    c->rope_theta = theta;
    NUM(root, "partial_rotary_factor", 1.0, 0.0, &prf);
    NUM(o, "partial_rotary_factor", prf, 0.0, &prf);
    if (!(prf > 0.0) || prf > 1.0)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: partial_rotary_factor must be in (0, 1]");
    int rd = (int)(c->head_dim * prf); /* int(head_dim * factor), as transformers */
    if (rd < 2 || rd % 2)
        return kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "config.json: rotary dimension %d (head_dim x partial_rotary_factor) must be even",
                             rd);
    c->arch.rotary_dim = rd;
    if (rs->kind == KVQ_ROPE_SCALE_NONE)
        return KVQ_OK;

    NUM(root, "original_max_position_embeddings", 0.0, 1.0, &v);
    NUM(o, "original_max_position_embeddings", v, 1.0, &v);
    if (v > (double)MAX_CTX || floor(v) != v)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: original_max_position_embeddings must be an integer in [1, %d]",
                             MAX_CTX);
    rs->original_max = (int)v;
    NUM(o, "factor", 0.0, 0.0, &rs->factor);
    NUM(o, "attention_factor", 0.0, 0.0, &rs->attention_factor);
    const char *need = NULL;
    switch (rs->kind) {
    case KVQ_ROPE_SCALE_LINEAR:
        need = rs->factor > 0 ? NULL : "factor";
        break;
    case KVQ_ROPE_SCALE_DYNAMIC:
        /* transformers rescales from max_position_embeddings on, and the
         * point of it is to run past it: the usable context is factor times */
        need = rs->factor > 0 ? NULL : "factor";
        rs->original_max = c->max_ctx;
        if (rs->factor > 1)
            c->max_ctx = rs->factor * c->max_ctx < MAX_CTX ? (int)(rs->factor * c->max_ctx) : MAX_CTX;
        break;
    case KVQ_ROPE_SCALE_LLAMA3:
        NUM(o, "low_freq_factor", 0.0, 0.0, &rs->low_freq_factor);
        NUM(o, "high_freq_factor", 0.0, 0.0, &rs->high_freq_factor);
        need = !(rs->factor > 0)                                  ? "factor"
               : !rs->original_max                                ? "original_max_position_embeddings"
               : !(rs->high_freq_factor > rs->low_freq_factor)    ? "high_freq_factor > low_freq_factor"
               : !(rs->low_freq_factor > 0)                       ? "low_freq_factor"
                                                                  : NULL;
        break;
    case KVQ_ROPE_SCALE_YARN: {
        NUM(o, "beta_fast", 0.0, 0.0, &rs->beta_fast);
        NUM(o, "beta_slow", 0.0, 0.0, &rs->beta_slow);
        NUM(o, "mscale", 0.0, 0.0, &rs->mscale);
        NUM(o, "mscale_all_dim", 0.0, 0.0, &rs->mscale_all_dim);
        const cJSON *tr = cJSON_GetObjectItemCaseSensitive(o, "truncate");
        rs->truncate = !cJSON_IsFalse(tr);
        if (!rs->original_max) /* older transformers: the model's own context */
            rs->original_max = c->max_ctx;
        if (!(rs->factor > 0))
            rs->factor = (double)c->max_ctx / rs->original_max;
        need = rs->factor > 0 ? NULL : "factor";
        break;
    }
    case KVQ_ROPE_SCALE_LONGROPE: {
        int half = rd / 2;
        if (half > KVQ_ROPE_MAX_FACTORS)
            return kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "config.json: longrope with rotary_dim %d is not supported", rd);
        if ((st = get_factors(o, "short_factor", half, rs->short_factor, err)) ||
            (st = get_factors(o, "long_factor", half, rs->long_factor, err)))
            return st;
        rs->n_factors = half;
        if (!rs->original_max)
            rs->original_max = c->max_ctx;
        if (!(rs->factor > 0))
            rs->factor = (double)c->max_ctx / rs->original_max;
        break;
    }
    default:
        break;
    }
#undef NUM
    if (need)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: rope type '%s' needs '%s'", ty->valuestring, need);
    return KVQ_OK;
}

/* Gemma's scalars: embedding scale sqrt(hidden) (a float32 tensor in
 * transformers), attention scale query_pre_attn_scalar^-1/2, the final
 * logit soft-cap; an attention soft-cap is refused (the attention kernels
 * have none). */
static kvq_status parse_gemma(const cJSON *root, struct kvq_model_config *c, kvq_error *err)
{
    struct kvq_model_arch *a = &c->arch;
    const cJSON *acap = cJSON_GetObjectItemCaseSensitive(root, "attn_logit_softcapping");
    if (acap && !cJSON_IsNull(acap))
        return kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "config.json: attn_logit_softcapping is not supported");
    const cJSON *fcap = cJSON_GetObjectItemCaseSensitive(root, "final_logit_softcapping");
    if (fcap && !cJSON_IsNull(fcap)) {
        if (!cJSON_IsNumber(fcap) || !(fcap->valuedouble > 0) || !isfinite(fcap->valuedouble))
            return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: final_logit_softcapping must be a positive number");
        a->final_softcap = (float)fcap->valuedouble;
    }
    if (!a->sandwich_norm)
        return KVQ_OK;
    a->embed_scale = (float)sqrt((double)c->hidden);
    const cJSON *qs = cJSON_GetObjectItemCaseSensitive(root, "query_pre_attn_scalar");
    double q = c->head_dim;
    if (qs && !cJSON_IsNull(qs)) {
        if (!cJSON_IsNumber(qs) || !(qs->valuedouble > 0) || !isfinite(qs->valuedouble))
            return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: query_pre_attn_scalar must be a positive number");
        q = qs->valuedouble;
    }
    a->attn_scale = (float)pow(q, -0.5);
    return KVQ_OK;
}

/* Sliding-window attention, as transformers' models apply it: a windowed
 * layer's query at position p sees keys (p - W, p]. Mistral and Phi-3 window
 * every layer when sliding_window is set; Qwen2/Qwen3 only with
 * use_sliding_window, the layers that layer_types names (else those from
 * max_window_layers on). Llama has no window. A window as long as the
 * context changes nothing and is dropped. */
static kvq_status parse_window(const cJSON *root, struct kvq_model_config *c, kvq_error *err)
{
    struct kvq_model_arch *a = &c->arch;
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    const cJSON *use = cJSON_GetObjectItemCaseSensitive(root, "use_sliding_window");
    const int qwen = strncmp(c->model_type, "qwen", 4) == 0;
    a->sliding_window = 0;
    memset(a->window_layers, 0, sizeof a->window_layers);
    if (!sw || cJSON_IsNull(sw) || strcmp(c->model_type, "llama") == 0 || (qwen ? !cJSON_IsTrue(use) : cJSON_IsFalse(use)))
        return KVQ_OK;
    if (!cJSON_IsNumber(sw) || !(sw->valuedouble >= 1) || floor(sw->valuedouble) != sw->valuedouble)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: sliding_window must be a positive integer");
    if (sw->valuedouble >= c->max_ctx)
        return KVQ_OK;
    a->sliding_window = (int)sw->valuedouble;
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    int mwl = 0;
    if (!lt && qwen) {
        kvq_status st = get_int(root, "max_window_layers", c->n_layers, MAX_LAYERS, &mwl, err);
        if (st != KVQ_OK)
            return st;
    }
    if (lt && (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers))
        return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: layer_types must list num_hidden_layers (%d) entries",
                             c->n_layers);
    const cJSON *e = lt ? lt->child : NULL;
    int any = 0;
    int pattern = 0; /* Gemma 3 without layer_types: every pattern-th layer global */
    if (!lt && c->arch.sandwich_norm) {
        kvq_status st = get_int(root, "sliding_window_pattern", 6, MAX_LAYERS, &pattern, err);
        if (st != KVQ_OK)
            return st;
    }
    for (int l = 0; l < c->n_layers; l++, e = e ? e->next : NULL) {
        int windowed = pattern ? (l + 1) % pattern != 0 : !qwen || l >= mwl;
        if (lt) {
            if (!cJSON_IsString(e) || (strcmp(e->valuestring, "sliding_attention") && strcmp(e->valuestring, "full_attention")))
                return kvq_error_set(err, KVQ_ERR_UNSUPPORTED,
                                     "config.json: layer_types[%d] is not 'sliding_attention' or 'full_attention'", l);
            windowed = strcmp(e->valuestring, "sliding_attention") == 0;
        }
        if (windowed)
            a->window_layers[l / 8] |= (uint8_t)(1u << (l % 8));
        any |= windowed;
    }
    if (!any)
        a->sliding_window = 0;
    return KVQ_OK;
}

static kvq_status parse_root(const cJSON *root, struct kvq_model_config *c, kvq_error *err)
{
    if (!cJSON_IsObject(root))
        return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: not a JSON object");
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(mt))
        return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: missing 'model_type'");
    if (strlen(mt->valuestring) >= sizeof c->model_type)
        return kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "config.json: model_type '%.40s...' is not supported",
                             mt->valuestring);
    strcpy(c->model_type, mt->valuestring);
    kvq_status st = arch_from_type(root, c->model_type, &c->arch, err);
    if (st != KVQ_OK)
        return st;

    /* the activation the architecture implies; a config naming another is refused */
    const int gemma = c->arch.act == KVQ_ACT_GELU_TANH;
    const char *want = gemma ? "gelu_pytorch_tanh" : "silu";
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, gemma ? "hidden_activation" : "hidden_act");
    if (!act && gemma)
        act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && !cJSON_IsNull(act) && !(cJSON_IsString(act) && strcmp(act->valuestring, want) == 0))
        return kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "config.json: hidden_act '%s' is not supported (%s only for %s)",
                             cJSON_IsString(act) ? act->valuestring : "?", want, c->model_type);

    if ((st = get_int(root, "hidden_size", -1, MAX_DIM, &c->hidden, err)) ||
        (st = get_int(root, "num_hidden_layers", -1, MAX_LAYERS, &c->n_layers, err)) ||
        (st = get_int(root, "num_attention_heads", -1, MAX_DIM, &c->n_heads, err)) ||
        (st = get_int(root, "num_key_value_heads", c->n_heads, MAX_DIM, &c->n_kv_heads, err)) ||
        (st = get_int(root, "head_dim", c->hidden / c->n_heads, KVQ_MAX_DIM, &c->head_dim, err)) ||
        (st = get_int(root, "intermediate_size", -1, MAX_DIM, &c->ffn, err)) ||
        (st = get_int(root, "vocab_size", -1, MAX_VOCAB, &c->vocab, err)) ||
        (st = get_int(root, "max_position_embeddings", -1, MAX_CTX, &c->max_ctx, err)))
        return st;
    if (c->head_dim < 2 || c->head_dim % 2)
        return kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "config.json: head_dim %d must be even", c->head_dim);
    if (c->n_heads % c->n_kv_heads || c->n_heads / c->n_kv_heads > KVQ_ATTN_MAX_Q)
        return kvq_error_set(err, KVQ_ERR_FORMAT,
                             "config.json: num_attention_heads %d is not a multiple of num_key_value_heads %d "
                             "(with at most %d query heads per KV head)",
                             c->n_heads, c->n_kv_heads, KVQ_ATTN_MAX_Q);
    if ((st = parse_window(root, c, err)) != KVQ_OK || (st = parse_gemma(root, c, err)) != KVQ_OK ||
        (st = parse_moe(root, c, err)) != KVQ_OK)
        return st;
    if (c->arch.qk_norm_full && c->n_heads * c->head_dim != c->hidden)
        return kvq_error_set(err, KVQ_ERR_UNSUPPORTED,
                             "config.json: OLMoE's q/k norm needs num_attention_heads x head_dim = hidden_size");

    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(root, "rms_norm_eps");
    c->rms_eps = 1e-6f;
    if (eps) {
        if (!cJSON_IsNumber(eps) || !(eps->valuedouble > 0.0) || eps->valuedouble > 1.0)
            return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: rms_norm_eps must be in (0, 1]");
        c->rms_eps = (float)eps->valuedouble;
    }
    if ((st = parse_rope(root, c, err)))
        return st;
    int nb;
    if ((st = get_ids(root, "bos_token_id", &c->bos_id, 1, &nb, err)) ||
        (st = get_ids(root, "eos_token_id", c->eos_ids, KVQ_MODEL_MAX_EOS, &c->n_eos, err)))
        return st;
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] >= c->vocab)
            return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: eos_token_id %d >= vocab_size", c->eos_ids[i]);
    if (c->bos_id >= c->vocab)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: bos_token_id %d >= vocab_size", c->bos_id);
    return KVQ_OK;
}

kvq_status kvq_model_config_parse(const char *json, size_t len, struct kvq_model_config *cfg, kvq_error *err)
{
    if (!json || !cfg)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_model_config_parse: NULL argument");
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "config.json: not valid JSON");
    struct kvq_model_config c;
    memset(&c, 0, sizeof c);
    kvq_status st = parse_root(root, &c, err);
    cJSON_Delete(root);
    if (st == KVQ_OK)
        *cfg = c;
    return st;
}

kvq_status kvq_model_config_load(const char *path, struct kvq_model_config *cfg, kvq_error *err)
{
    errno = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return kvq_error_set(err, KVQ_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && n < (1l << 24) && fseek(f, 0, SEEK_SET) == 0)
        buf = malloc((size_t)n + 1);
    errno = 0;
    size_t got = buf ? fread(buf, 1, (size_t)n, f) : 0;
    const int e = errno;
    fclose(f);
    if (!buf || got != (size_t)n) {
        free(buf);
        if (n >= (1l << 24))
            return kvq_error_set(err, KVQ_ERR_IO, "%s: larger than 16 MiB, not a config", path);
        return kvq_error_set(err, KVQ_ERR_IO, "%s: cannot read: %s", path, e ? strerror(e) : "short read");
    }
    kvq_status st = kvq_model_config_parse(buf, (size_t)n, cfg, err);
    free(buf);
    return st;
}

size_t kvq_model_config_layer_params(const struct kvq_model_config *c)
{
    int l = 0; /* a sparse layer if there is one */
    while (c->arch.n_experts > 0 && l + 1 < c->n_layers && !kvq_model_layer_is_moe(c, l))
        l++;
    return kvq_model_config_layer_params_at(c, l);
}

size_t kvq_model_config_layer_params_at(const struct kvq_model_config *c, int l)
{
    size_t h = (size_t)c->hidden, q = (size_t)c->n_heads * c->head_dim, kv = (size_t)c->n_kv_heads * c->head_dim;
    size_t f = (size_t)c->ffn;
    size_t p = h * q + 2 * h * kv + q * h + 2 * h;
    if (kvq_model_layer_is_moe(c, l)) /* router [E][h] and E experts; the shared expert and its gate [1][h] */
        p += (size_t)c->arch.n_experts * (h + 3 * h * (size_t)c->arch.moe_ffn) +
             (c->arch.shared_ffn > 0 ? 3 * h * (size_t)c->arch.shared_ffn + h : 0);
    else
        p += 3 * h * f;
    if (c->arch.qkv_bias)
        p += q + 2 * kv;
    if (c->arch.o_bias)
        p += h;
    if (c->arch.mlp_bias)
        p += 2 * f + h;
    if (c->arch.qk_norm)
        p += 2 * (size_t)c->head_dim;
    if (c->arch.qk_norm_full)
        p += q + kv;
    if (c->arch.sandwich_norm)
        p += 2 * h;
    return p;
}
