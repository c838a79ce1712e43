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
 *    layer_types or max_window_layers), and the refusals.
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

#include "kvq_model.h"
#include "test.h"
#include "test_util.h"

static char dir_plain[64], dir_win[64];

/* The bundled model as model_type mistral with sliding_window w (0: none). */
static void write_variant(const char *dir, int w)
{
    mkdir(dir, 0777);
    size_t len;
    char *text = test_read_file(TEST_MODEL_DIR "/config.json", &len);
    cJSON *cfg = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(cfg != NULL);
    if (!cfg)
        return;
    cJSON_ReplaceItemInObject(cfg, "model_type", cJSON_CreateString("mistral"));
    cJSON_DeleteItemFromObject(cfg, "sliding_window");
    if (w)
        cJSON_AddNumberToObject(cfg, "sliding_window", w);
    char *js = cJSON_Print(cfg);
    cJSON_Delete(cfg);
    char p[256], src[512], cwd[256];
    snprintf(p, sizeof p, "%s/config.json", dir);
    CHECK(js && test_write_file(p, js, strlen(js)) == 0);
    free(js);
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    const char *files[] = {"model.safetensors.index.json", "model-00001-of-00002.safetensors",
                           "model-00002-of-00002.safetensors"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        snprintf(src, sizeof src, "%s/" TEST_MODEL_DIR "/%s", cwd, files[i]);
        unlink(p);
        CHECK(symlink(src, p) == 0);
    }
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

int main(void)
{
    snprintf(dir_plain, sizeof dir_plain, "/tmp/kvq_winplain_%d", (int)getpid());
    snprintf(dir_win, sizeof dir_win, "/tmp/kvq_win1000_%d", (int)getpid());
    write_variant(dir_plain, 0);
    write_variant(dir_win, 1000);
    RUN(test_window_config);
    RUN(test_wide_window_equals_full);
    RUN(test_bounded_memory);
    test_rm_dir(dir_plain);
    test_rm_dir(dir_win);
    return TEST_END("test_decoder_window");
}
