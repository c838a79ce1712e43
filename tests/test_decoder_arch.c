/* test_decoder_arch.c - the architecture flags reach the forward pass.
 *
 * There is no Qwen2 reference fixture, so the bias paths are checked by an
 * identity that holds in exact arithmetic: attention weights sum to 1, so a
 * value bias b_v adds exactly Wo . b_v to each layer's attention output.
 * Model A is the bundled model declared as qwen2 (q/k/v biases; q and k bias
 * 0, v bias b_v); model B is the bundled model as llama with attention_bias
 * (q/k/v biases 0, o_proj bias Wo . b_v). Their logits must agree to
 * rounding, and differ clearly from the bias-free model. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvq_model.h"
#include "kvq_safetensors.h"
#include "kvq_rng.h"
#include "test.h"
#include "test_util.h"

#define L 4
#define H 512
#define KV 256

static char tmp[64];

/* Writes dir/config.json (the fixture's with model_type and attention_bias
 * replaced) and dir/model.safetensors (the fixture's tensors plus extra). */
static void write_model(const char *dir, const char *type, int attention_bias, kvq_st_writer *extra_w,
                        kvq_st_file **src)
{
    mkdir(dir, 0777);
    size_t len;
    char *text = test_read_file(TEST_MODEL_DIR "/config.json", &len);
    cJSON *cfg = cJSON_Parse(text);
    free(text);
    cJSON_ReplaceItemInObject(cfg, "model_type", cJSON_CreateString(type));
    cJSON_ReplaceItemInObject(cfg, "attention_bias", cJSON_CreateBool(attention_bias));
    char *out = cJSON_Print(cfg);
    cJSON_Delete(cfg);
    char p[128];
    snprintf(p, sizeof p, "%s/config.json", dir);
    CHECK(out && test_write_file(p, out, strlen(out)) == 0);
    free(out);
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < kvq_st_count(src[k]); i++) {
            const struct kvq_st_tensor *t = kvq_st_tensor_at(src[k], i);
            kvq_st_writer_add(extra_w, t->name, t->dtype, t->n_dims, t->shape, t->data);
        }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK_OK(kvq_st_writer_write(extra_w, p, NULL));
}

static void last_logits(const char *dir, float *logits)
{
    static const int32_t ids[] = {1, 3843, 3783, 333, 3778, 330, 3797, 3941, 3707, 327, 3986, 4049, 346};
    kvq_model *m = NULL;
    kvq_error err = {0};
    CHECKF(kvq_model_load(dir, NULL, &m, &err) == KVQ_OK, "%s: %s", dir, err.msg);
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.type_k = sc.type_v = KVQ_TYPE_F32;
    kvq_seq *s = NULL;
    if (m)
        CHECK_OK(kvq_seq_create(m, &sc, &s, NULL));
    if (s)
        CHECK_OK(kvq_seq_forward(s, ids, 13, 12, logits, NULL));
    kvq_seq_free(s);
    kvq_model_free(m);
}

static void test_value_bias_identity(void)
{
    kvq_st_file *src[2] = {NULL, NULL};
    CHECK_OK(kvq_st_open(TEST_MODEL_DIR "/model-00001-of-00002.safetensors", &src[0], NULL));
    CHECK_OK(kvq_st_open(TEST_MODEL_DIR "/model-00002-of-00002.safetensors", &src[1], NULL));
    if (!src[0] || !src[1])
        goto out;
    static float zq[L][H], zkv[L][KV], bv[L][KV], bo[L][H];
    static float wo[H * H];
    kvq_rng r;
    kvq_rng_init(&r, 99);
    for (int l = 0; l < L; l++) {
        for (int i = 0; i < KV; i++)
            bv[l][i] = (float)(kvq_rng_uniform(&r) - 0.5);
        char name[96];
        snprintf(name, sizeof name, "model.layers.%d.self_attn.o_proj.weight", l);
        const struct kvq_st_tensor *t = kvq_st_find(src[l < 2 ? 0 : 1], name);
        CHECK(t != NULL);
        if (!t)
            goto out;
        kvq_st_to_f32(t, wo, (size_t)H * H);
        /* o_proj input = concatenated heads; head h reads KV head h / 2, so
         * the attention output carries b_v of its KV head in every query head. */
        for (int o = 0; o < H; o++) {
            double s = 0;
            for (int j = 0; j < H; j++)
                s += (double)wo[(size_t)o * H + j] * bv[l][(j / 128) / 2 * 128 + j % 128];
            bo[l][o] = (float)s;
        }
    }
    char da[96], db[96], dc[96];
    snprintf(da, sizeof da, "%s/qwen2", tmp);
    snprintf(db, sizeof db, "%s/llama_bias", tmp);
    snprintf(dc, sizeof dc, "%s/llama", tmp);
    int64_t sh[1];
    kvq_st_writer *wa, *wb, *wc;
    kvq_st_writer_create(&wa);
    kvq_st_writer_create(&wb);
    kvq_st_writer_create(&wc);
    for (int l = 0; l < L; l++) {
        char name[96];
        sh[0] = H;
        snprintf(name, sizeof name, "model.layers.%d.self_attn.q_proj.bias", l);
        kvq_st_writer_add(wa, name, KVQ_ST_F32, 1, sh, zq[l]);
        kvq_st_writer_add(wb, name, KVQ_ST_F32, 1, sh, zq[l]);
        snprintf(name, sizeof name, "model.layers.%d.self_attn.o_proj.bias", l);
        kvq_st_writer_add(wb, name, KVQ_ST_F32, 1, sh, bo[l]);
        sh[0] = KV;
        snprintf(name, sizeof name, "model.layers.%d.self_attn.k_proj.bias", l);
        kvq_st_writer_add(wa, name, KVQ_ST_F32, 1, sh, zkv[l]);
        kvq_st_writer_add(wb, name, KVQ_ST_F32, 1, sh, zkv[l]);
        snprintf(name, sizeof name, "model.layers.%d.self_attn.v_proj.bias", l);
        kvq_st_writer_add(wa, name, KVQ_ST_F32, 1, sh, bv[l]);
        kvq_st_writer_add(wb, name, KVQ_ST_F32, 1, sh, zkv[l]);
    }
    write_model(da, "qwen2", 0, wa, src);
    write_model(db, "llama", 1, wb, src);
    write_model(dc, "llama", 0, wc, src);
    kvq_st_writer_free(wa);
    kvq_st_writer_free(wb);
    kvq_st_writer_free(wc);

    float *a = calloc(4096, sizeof *a), *b = calloc(4096, sizeof *b), *c = calloc(4096, sizeof *c);
    last_logits(da, a);
    last_logits(db, b);
    last_logits(dc, c);
    double dab = 0, dac = 0, mx = 0;
    for (int i = 0; i < 4096; i++) {
        dab = fmax(dab, fabs((double)a[i] - b[i]));
        dac = fmax(dac, fabs((double)a[i] - c[i]));
        mx = fmax(mx, fabs(b[i]));
    }
    printf("  qwen2 v-bias vs llama o-bias: %.2e x max|logit|; vs no bias: %.2e\n", dab / mx, dac / mx);
    CHECKF(dab <= 1e-4 * mx, "qwen2 and llama+bias differ by %.3g (max %.3g)", dab, mx);
    CHECKF(dac >= 1e-2 * mx, "the bias had no effect (%.3g)", dac);
    free(a);
    free(b);
    free(c);
    test_rm_dir(da);
    test_rm_dir(db);
    test_rm_dir(dc);
out:
    kvq_st_close(src[0]);
    kvq_st_close(src[1]);
}

int main(void)
{
    strcpy(tmp, "/tmp/kvq_test_arch_XXXXXX");
    if (!mkdtemp(tmp))
        return 1;
    RUN(test_value_bias_identity);
    rmdir(tmp);
    return TEST_END("test_decoder_arch");
}
