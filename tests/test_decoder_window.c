/* test_decoder_window.c - sliding-window attention on the CPU (issue 20).
 *
 * The bundled weights declared as mistral with a sliding window:
 *  - a window longer than the sequence attends to everything, so its logits
 *    equal the plain (windowless) model's to rounding: the window path's
 *    decoded rows and double-precision softmax against the fused kernels;
 *  - a 32-token window generates far past 4x its window with the cache
 *    memory bounded: bytes allocated stop growing once the ring of segments
 *    is full, while the windowless model's keep growing;
 *  - config parsing: which layers are windowed (Mistral all, Qwen2 by
 *    layer_types or max_window_layers, Gemma 3 by layer_types or
 *    sliding_window_pattern), Gemma 3's descriptor, and the refusals.
 * The windowed results against transformers are the mistral_window and
 * qwen2_window fixtures of test_decoder_families.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvq_batch.h"
#include "kvq_model.h"
#include "kvq_safetensors.h"
#include "test.h"
#include "test_fixture.h"
#include "test_util.h"

static char dir_plain[64], dir_win[64];

/* The bundled model as model_type mistral with sliding_window w (0: none). */
static void write_variant(const char *dir, int w)
{
    cJSON *cfg = test_model_config();
    if (!cfg)
        return;
    cJSON_ReplaceItemInObject(cfg, "model_type", cJSON_CreateString("mistral"));
    cJSON_DeleteItemFromObject(cfg, "sliding_window");
    if (w)
        cJSON_AddNumberToObject(cfg, "sliding_window", w);
    test_model_variant(dir, cfg);
}

static kvq_seq *open_seq(const char *dir, kvq_model **m, enum kvq_type t, size_t ctx)
{
    kvq_error err = {0};
    *m = NULL;
    CHECKF(kvq_model_load(dir, NULL, m, &err) == KVQ_OK, "%s: %s", dir, err.msg);
    if (!*m)
        return NULL;
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.type_k = sc.type_v = t;
    sc.max_ctx = ctx;
    kvq_seq *s = NULL;
    CHECKF(kvq_seq_create(*m, &sc, &s, &err) == KVQ_OK, "%s", err.msg);
    return s;
}

static void ids_of(int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ids[i] = i == 0 ? 1 : (int32_t)(300 + (7919u * (unsigned)i) % 3700u);
}

/* A window of 1000 over 300 tokens: everything in view. */
static void test_wide_window_equals_full(void)
{
    enum { N = 300, V = 4096 };
    static float a[N][V], b[N][V];
    static int32_t ids[N];
    ids_of(ids, N);
    kvq_model *mp, *mw;
    kvq_seq *sp = open_seq(dir_plain, &mp, KVQ_TYPE_F32, N), *sw = open_seq(dir_win, &mw, KVQ_TYPE_F32, N);
    if (sp && sw) {
        CHECK(kvq_model_config_of(mw)->arch.sliding_window == 1000);
        CHECK_OK(kvq_seq_forward(sp, ids, N, 0, &a[0][0], NULL));
        CHECK_OK(kvq_seq_forward(sw, ids, N, 0, &b[0][0], NULL));
        double worst = 0, mx = 0;
        for (int t = 0; t < N; t++)
            for (int v = 0; v < V; v++) {
                worst = fmax(worst, fabs((double)a[t][v] - b[t][v]));
                mx = fmax(mx, fabs((double)a[t][v]));
            }
        CHECKF(worst <= 1e-5 * mx, "window path differs from the full path by %.3g (max |logit| %.3g)", worst, mx);
        /* a rollback inside the ring, then the same tokens again: the same logits */
        CHECK_OK(kvq_seq_truncate(sw, N - 20));
        CHECK(kvq_seq_pos(sw) == N - 20);
        static float c[20][V];
        CHECK_OK(kvq_seq_forward(sw, ids + N - 20, 20, 0, &c[0][0], NULL));
        double w2 = 0;
        for (int t = 0; t < 20; t++)
            for (int v = 0; v < V; v++)
                w2 = fmax(w2, fabs((double)c[t][v] - b[N - 20 + t][v]));
        CHECKF(w2 <= 1e-5 * mx, "after a rollback: %.3g", w2); /* sgemm rows depend on the chunk's row count */
    }
    kvq_seq_free(sp);
    kvq_seq_free(sw);
    kvq_model_free(mp);
    kvq_model_free(mw);
}

static size_t alloc_bytes(const kvq_seq *s)
{
    struct kvq_seq_stats st;
    kvq_seq_get_stats(s, &st);
    return st.kv_bytes_alloc;
}

/* A 32-token window through 2000 tokens (60x the window): the pages stop
 * growing once the ring is full; the windowless model's grow. */
static void test_bounded_memory(void)
{
    enum { N = 2000 };
    static int32_t ids[N];
    ids_of(ids, N);
    char d32[64];
    snprintf(d32, sizeof d32, "/tmp/kvq_win32_%d", (int)getpid());
    write_variant(d32, 32);
    for (int ti = 0; ti < 2; ti++) {
        const enum kvq_type t = ti ? KVQ_TYPE_TQ3J : KVQ_TYPE_F16;
        kvq_model *mw, *mp;
        kvq_seq *sw = open_seq(d32, &mw, t, N), *sp = open_seq(dir_plain, &mp, t, N);
        size_t at[4] = {0, 0, 0, 0}, plain[2] = {0, 0};
        const size_t marks[4] = {500, 1000, 1500, 2000};
        size_t done = 0;
        for (int k = 0; sw && sp && k < 4; k++) {
            int32_t best;
            CHECK_OK(kvq_seq_forward(sw, ids + done, marks[k] - done, marks[k] - done - 1, NULL, &best));
            CHECK_OK(kvq_seq_forward(sp, ids + done, marks[k] - done, marks[k] - done - 1, NULL, &best));
            done = marks[k];
            at[k] = alloc_bytes(sw);
            if (k == 1 || k == 3)
                plain[k / 2] = alloc_bytes(sp);
        }
        printf("  %s, window 32: KV bytes allocated at 500/1000/1500/2000 tokens: %zu %zu %zu %zu (no window: %zu "
               "at 1000, %zu at 2000)\n",
               ti ? "tq3j" : "f16", at[0], at[1], at[2], at[3], plain[0], plain[1]);
        CHECK(at[1] == at[2] && at[2] == at[3]); /* bounded: the ring is reused */
        CHECK(at[3] < plain[1]);
        CHECK(plain[1] > plain[0]);
        kvq_seq_free(sw);
        kvq_seq_free(sp);
        kvq_model_free(mw);
        kvq_model_free(mp);
    }
    test_rm_dir(d32);
}

static void test_window_config(void)
{
    const char *base = "{\"hidden_size\":64,\"num_hidden_layers\":4,\"num_attention_heads\":4,"
                       "\"num_key_value_heads\":2,\"intermediate_size\":128,\"vocab_size\":100,"
                       "\"max_position_embeddings\":256,";
    struct {
        const char *rest;
        kvq_status want;
        int window;
        unsigned layers; /* bit l: layer l windowed */
    } cases[] = {
        {"\"model_type\":\"mistral\",\"sliding_window\":16}", KVQ_OK, 16, 0xf},
        {"\"model_type\":\"mistral\",\"sliding_window\":null}", KVQ_OK, 0, 0},
        {"\"model_type\":\"mistral\",\"sliding_window\":4096}", KVQ_OK, 0, 0},
        {"\"model_type\":\"llama\",\"sliding_window\":16}", KVQ_OK, 0, 0},
        {"\"model_type\":\"qwen2\",\"sliding_window\":16,\"use_sliding_window\":false}", KVQ_OK, 0, 0},
        {"\"model_type\":\"qwen2\",\"sliding_window\":16,\"use_sliding_window\":true,\"max_window_layers\":2}", KVQ_OK,
         16, 0xc},
        {"\"model_type\":\"qwen2\",\"sliding_window\":16,\"use_sliding_window\":true,\"layer_types\":"
         "[\"sliding_attention\",\"full_attention\",\"sliding_attention\",\"full_attention\"]}",
         KVQ_OK, 16, 0x5},
        {"\"model_type\":\"qwen2\",\"sliding_window\":16,\"use_sliding_window\":true,\"layer_types\":[\"full_attention\"]}",
         KVQ_ERR_FORMAT, 0, 0},
        {"\"model_type\":\"mistral\",\"sliding_window\":-3}", KVQ_ERR_FORMAT, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char js[1024];
        snprintf(js, sizeof js, "%s%s", base, cases[i].rest);
        struct kvq_model_config c;
        kvq_error err = {0};
        kvq_status st = kvq_model_config_parse(js, strlen(js), &c, &err);
        CHECKF(st == cases[i].want, "case %zu: %d (%s)", i, (int)st, err.msg);
        if (st != KVQ_OK)
            continue;
        CHECKF(c.arch.sliding_window == cases[i].window, "case %zu: window %d", i, c.arch.sliding_window);
        CHECKF(c.arch.window_layers[0] == cases[i].layers, "case %zu: layers %#x", i, c.arch.window_layers[0]);
    }
}

/* Gemma 3 text: the descriptor from config.json (transformers 5 keys the
 * RoPE by layer type; older configs use rope_local_base_freq and a top-level
 * rope_scaling), and its refusals. */
static void test_gemma3_config(void)
{
    const char *base = "{\"model_type\":\"gemma3_text\",\"hidden_size\":64,\"num_hidden_layers\":4,"
                       "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,\"intermediate_size\":128,"
                       "\"vocab_size\":100,\"max_position_embeddings\":256,\"sliding_window\":8,";
    const char *v5 = "\"query_pre_attn_scalar\":24,\"hidden_activation\":\"gelu_pytorch_tanh\","
                     "\"layer_types\":[\"sliding_attention\",\"full_attention\",\"sliding_attention\",\"full_attention\"],"
                     "\"rope_parameters\":{\"sliding_attention\":{\"rope_type\":\"default\",\"rope_theta\":10000.0},"
                     "\"full_attention\":{\"rope_type\":\"linear\",\"rope_theta\":1000000.0,\"factor\":8.0}}}";
    char js[2048];
    snprintf(js, sizeof js, "%s%s", base, v5);
    struct kvq_model_config c;
    kvq_error err = {0};
    CHECKF(kvq_model_config_parse(js, strlen(js), &c, &err) == KVQ_OK, "%s", err.msg);
    const struct kvq_model_arch *a = &c.arch;
    CHECK(a->sandwich_norm && a->qk_norm && a->norm == KVQ_NORM_RMS_UNIT_OFFSET && a->act == KVQ_ACT_GELU_TANH);
    CHECK(a->tied_embeddings && a->embed_scale == 8.0f && fabsf(a->attn_scale - 0.20412415f) < 1e-7f);
    CHECK(a->sliding_window == 8 && a->window_layers[0] == 0x5 && a->rope_local_theta == 10000.0);
    CHECK(c.rope_theta == 1000000.0 && a->rope_scaling.kind == KVQ_ROPE_SCALE_LINEAR && a->rope_scaling.factor == 8.0);
    /* older keys: rope_local_base_freq, sliding_window_pattern (every 2nd layer global) */
    const char *old = "\"rope_theta\":1000000.0,\"rope_local_base_freq\":5000.0,\"sliding_window_pattern\":2,"
                      "\"final_logit_softcapping\":30.0}";
    snprintf(js, sizeof js, "%s%s", base, old);
    CHECKF(kvq_model_config_parse(js, strlen(js), &c, &err) == KVQ_OK, "%s", err.msg);
    CHECK(a->rope_local_theta == 5000.0 && a->window_layers[0] == 0x5 && a->final_softcap == 30.0f &&
          fabsf(a->attn_scale - 0.17677669f) < 1e-7f); /* query_pre_attn_scalar defaults to head_dim */
    const char *bad[] = {"\"attn_logit_softcapping\":50.0}", "\"hidden_activation\":\"silu\"}"};
    for (int i = 0; i < 2; i++) {
        snprintf(js, sizeof js, "%s%s", base, bad[i]);
        CHECK(kvq_model_config_parse(js, strlen(js), &c, &err) == KVQ_ERR_UNSUPPORTED);
    }
}

/* The bundled weights as a Gemma 3 checkpoint (pre_feedforward_layernorm =
 * the bundled post-attention norm, zero post norms and q/k norms: (1 + w) = 1)
 * with a 16-token window on layers 0 and 2: loads, runs 300 tokens through
 * windows, sandwich norms and both RoPEs, finite logits; identical greedy
 * tokens whether the prompt runs as one prefill or token by token. */
static void test_gemma3_runs(void)
{
    char dir[64], p[256];
    snprintf(dir, sizeof dir, "/tmp/kvq_gemma_%d", (int)getpid());
    mkdir(dir, 0777);
    const char *cfg = "{\"model_type\":\"gemma3_text\",\"hidden_size\":512,\"num_hidden_layers\":4,"
                      "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":128,\"intermediate_size\":1024,"
                      "\"vocab_size\":4096,\"max_position_embeddings\":4096,\"sliding_window\":16,\"rms_norm_eps\":1e-6,"
                      "\"query_pre_attn_scalar\":128,\"hidden_activation\":\"gelu_pytorch_tanh\",\"bos_token_id\":1,"
                      "\"layer_types\":[\"sliding_attention\",\"full_attention\",\"sliding_attention\",\"full_attention\"],"
                      "\"rope_parameters\":{\"sliding_attention\":{\"rope_type\":\"default\",\"rope_theta\":10000.0},"
                      "\"full_attention\":{\"rope_type\":\"linear\",\"rope_theta\":1000000.0,\"factor\":8.0}}}";
    snprintf(p, sizeof p, "%s/config.json", dir);
    CHECK(test_write_file(p, cfg, strlen(cfg)) == 0);
    kvq_st_file *src[2] = {NULL, NULL};
    CHECK_OK(kvq_st_open(TEST_MODEL_DIR "/model-00001-of-00002.safetensors", &src[0], NULL));
    CHECK_OK(kvq_st_open(TEST_MODEL_DIR "/model-00002-of-00002.safetensors", &src[1], NULL));
    kvq_st_writer *w = NULL;
    CHECK_OK(kvq_st_writer_create(&w));
    static float zeros[512];
    static char names[64][96];
    int nn = 0;
    for (int k = 0; k < 2 && src[0] && src[1] && w; k++)
        for (size_t i = 0; i < kvq_st_count(src[k]); i++) {
            const struct kvq_st_tensor *t = kvq_st_tensor_at(src[k], i);
            const char *name = t->name;
            if (strstr(name, "lm_head"))
                continue; /* Gemma ties the LM head to the embedding */
            const char *pa = strstr(name, "post_attention_layernorm");
            if (pa) {
                snprintf(names[nn], sizeof names[nn], "%.*spre_feedforward_layernorm.weight", (int)(pa - name), name);
                name = names[nn++];
            }
            kvq_st_writer_add(w, name, t->dtype, t->n_dims, t->shape, t->data);
        }
    for (int l = 0; l < 4 && w; l++) {
        const char *extra[4] = {"post_attention_layernorm", "post_feedforward_layernorm", "self_attn.q_norm",
                                "self_attn.k_norm"};
        for (int e = 0; e < 4; e++) {
            int64_t shape[1] = {e < 2 ? 512 : 128};
            snprintf(names[nn], sizeof names[nn], "model.layers.%d.%s.weight", l, extra[e]);
            kvq_st_writer_add(w, names[nn++], KVQ_ST_F32, 1, shape, zeros);
        }
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (w)
        CHECK_OK(kvq_st_writer_write(w, p, NULL));
    kvq_st_writer_free(w);
    kvq_st_close(src[0]);
    kvq_st_close(src[1]);

    enum { N = 300 };
    static int32_t ids[N];
    ids_of(ids, N);
    kvq_model *m;
    kvq_seq *s = open_seq(dir, &m, KVQ_TYPE_F16, N + 8);
    int32_t a[8], b[8];
    size_t na = 0, nb = 0;
    struct kvq_gen_params gp;
    kvq_gen_params_default(&gp);
    gp.max_tokens = 8;
    gp.stop_at_eos = 0;
    if (s) {
        static float logits[4096];
        CHECK_OK(kvq_seq_forward(s, ids, N, N - 1, logits, NULL));
        int finite = 1;
        for (int v = 0; v < 4096; v++)
            finite &= isfinite(logits[v]) != 0;
        CHECK(finite);
        kvq_seq_reset(s);
        CHECK_OK(kvq_seq_generate(s, ids, N, &gp, a, 8, &na, NULL, NULL));
        kvq_seq_reset(s);
        for (int i = 0; i + 1 < N; i++)
            CHECK_OK(kvq_seq_forward(s, &ids[i], 1, 0, NULL, NULL));
        CHECK_OK(kvq_seq_generate(s, &ids[N - 1], 1, &gp, b, 8, &nb, NULL, NULL));
        CHECK(na == 8 && nb == 8 && memcmp(a, b, sizeof a) == 0);
    }
    kvq_seq_free(s);
    kvq_model_free(m);
    test_rm_dir(dir);
}

/* A batch of a windowed model runs on the CPU (test_batch_window.c checks
 * what it computes); on the GPU, whose store ignored windows it was handed,
 * create refuses it before touching a device, with a reason a user can act
 * on: the model feature and what does run it, not the library's names. */
static void test_batch_window_devices(void)
{
    kvq_model *m = NULL;
    kvq_error err = {0};
    CHECKF(kvq_model_load(dir_win, NULL, &m, &err) == KVQ_OK, "%s", err.msg);
    if (!m)
        return;
    struct kvq_batch_config bc;
    kvq_batch_config_default(&bc);
    bc.seq.max_ctx = 1500; /* the window of 1000 then restricts something */
    kvq_batch *b = NULL;
    CHECKF(kvq_batch_create(m, &bc, &b, &err) == KVQ_OK, "%s", err.msg);
    struct kvq_batch_stats bs;
    kvq_batch_get_stats(b, &bs);
    CHECK(b && !bs.can_share && !bs.can_rollback);
    kvq_batch_free(b);
    b = NULL;
    bc.seq.device = KVQ_DEVICE_CUDA;
    bc.seq.fast_prefill = 0; /* exact products: the comparisons are against f32 references */
    kvq_status st = kvq_batch_create(m, &bc, &b, &err);
    CHECKF(st == KVQ_ERR_UNSUPPORTED && strstr(err.msg, "sliding-window attention") && strstr(err.msg, "--device cpu") &&
               !strstr(err.msg, "kvq_"),
           "status %d, '%s'", st, err.msg);
    CHECK(b == NULL);
    kvq_batch_free(b);
    /* a window that holds the whole context restricts nothing: no refusal
     * for the window (without a GPU: no device) */
    bc.seq.max_ctx = 1000;
    st = kvq_batch_create(m, &bc, &b, &err);
    CHECKF(st != KVQ_ERR_UNSUPPORTED, "status %d, '%s'", st, err.msg);
    kvq_batch_free(b);
    kvq_model_free(m);
}

int main(void)
{
    snprintf(dir_plain, sizeof dir_plain, "/tmp/kvq_winplain_%d", (int)getpid());
    snprintf(dir_win, sizeof dir_win, "/tmp/kvq_win1000_%d", (int)getpid());
    write_variant(dir_plain, 0);
    write_variant(dir_win, 1000);
    RUN(test_window_config);
    RUN(test_gemma3_config);
    RUN(test_gemma3_runs);
    RUN(test_wide_window_equals_full);
    RUN(test_bounded_memory);
    RUN(test_batch_window_devices);
    test_rm_dir(dir_plain);
    test_rm_dir(dir_win);
    return TEST_END("test_decoder_window");
}
