/* test_model.c - the decoder against the Hugging Face fixtures: logits at the
 * reference positions, greedy continuations, passkey retrieval on the
 * compressed cache, config parsing, state reuse and bad input. */
#include <cjson/cJSON.h>
#include <stdint.h>

#include "kvq_model.h"
#include "kvq_safetensors.h"
#include "kvq_tokenizer.h"
#include "test.h"
#include "test_fixture.h"
#include "test_util.h"

static struct test_fixture fx;
static kvq_model *model; /* fx.model */

static kvq_seq *new_seq(enum kvq_type k, enum kvq_type v)
{
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.type_k = k;
    sc.type_v = v;
    kvq_seq *s = NULL;
    kvq_error err = {0};
    CHECKF(kvq_seq_create(model, &sc, &s, &err) == KVQ_OK, "%s", err.msg);
    return s;
}

/* Logits at every reference position (f32 cache): within 1e-3 x max|logit|
 * of HF, same argmax; then the 24 greedy tokens. */
static void check_case(kvq_seq *s, const char *name)
{
    struct test_fixture_case fc;
    if (!test_fixture_case_load(&fx, name, &fc)) {
        test_fixture_case_free(&fc);
        return;
    }
    int V = kvq_model_config_of(model)->vocab;
    float *got = malloc((size_t)V * sizeof *got);
    kvq_seq_reset(s);
    size_t done = 0;
    double worst = 0;
    for (size_t i = 0; i < fc.n_pos; i++) {
        size_t p = (size_t)fc.pos[i];
        /* Run up to and including position p; logits of its row only. */
        CHECK_OK(kvq_seq_forward(s, fc.ids + done, p + 1 - done, p - done, got, NULL));
        done = p + 1;
        int am_w, am_g;
        const double e = test_logits_rel_diff(fc.logits + i * (size_t)V, got, V, &am_w, &am_g);
        worst = fmax(worst, e);
        CHECKF(e <= 1e-3, "%s pos %zu: max |diff| %.3g x max|logit| > 1e-3", name, p, e);
        CHECKF(am_w == am_g, "%s pos %zu: argmax %d, reference %d", name, p, am_g, am_w);
    }
    printf("  %-10s %5zu tokens: worst logit error %.2e x max|logit|\n", name, fc.n_ids, worst);

    /* Greedy continuation from a fresh state. */
    size_t n_out = 0;
    CHECKF(test_fixture_greedy_matches(&fx, s, &fc, &n_out),
           "%s: greedy continuation (%zu tokens) differs from NAME.greedy", name, n_out);
    CHECK(kvq_seq_pos(s) == fc.n_ids + n_out - 1);
    free(got);
    test_fixture_case_free(&fc);
}

static void test_fixture_cases_f32(void)
{
    kvq_seq *s = new_seq(KVQ_TYPE_F32, KVQ_TYPE_F32);
    if (!s)
        return;
    const cJSON *c;
    int n = 0;
    cJSON_ArrayForEach(c, test_fixture_cases(&fx))
    {
        check_case(s, cJSON_GetObjectItem(c, "name")->valuestring);
        n++;
    }
    CHECK(n == 6);
    kvq_seq_free(s);
}

/* tq3j keys / tq3 values (the default cache) still retrieve both keys. */
static void test_passkey_compressed(void)
{
    kvq_tokenizer *tok = NULL;
    CHECK_OK(kvq_tokenizer_create(TEST_MODEL_DIR "/tokenizer.json", &tok, NULL));
    kvq_seq *s = new_seq(KVQ_DEFAULT_TYPE_K, KVQ_DEFAULT_TYPE_V);
    if (!s || !tok)
        goto out;
    const cJSON *c;
    int n = 0;
    cJSON_ArrayForEach(c, test_fixture_cases(&fx))
    {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        if (strncmp(name, "passkey", 7) != 0)
            continue;
        char key[16], text[256];
        CHECKF(test_fixture_passkey(&fx, s, tok, c, key, sizeof key, text, sizeof text),
               "%s: answer '%s' lacks the key %s", name, text, key);
        struct kvq_seq_stats st;
        kvq_seq_get_stats(s, &st);
        printf("  %-10s key %s -> '%s'; KV %zu bytes vs f16 %zu (%.2fx)\n", name, key, text, st.kv_bytes_used,
               st.kv_bytes_f16, (double)st.kv_bytes_f16 / (double)st.kv_bytes_used);
        CHECK(st.kv_bytes_used > 0 && st.kv_bytes_used * 4 < st.kv_bytes_f16);
        n++;
    }
    CHECK(n == 2);
out:
    kvq_seq_free(s);
    kvq_tokenizer_free(tok);
}

/* Two states share the model; a reset state repeats itself exactly; prefill
 * in one call equals prefill in uneven pieces. */
static void test_states_share_model(void)
{
    kvq_seq *a = new_seq(KVQ_TYPE_F32, KVQ_TYPE_F32), *b = new_seq(KVQ_TYPE_F32, KVQ_TYPE_F32);
    size_t n;
    int32_t *ids = test_fixture_ints(&fx, "valid_1", "ids", &n);
    if (!a || !b || !ids)
        goto out;
    int32_t g1[16], g2[16], g3[16];
    size_t n1, n2, n3;
    struct kvq_gen_params gp;
    kvq_gen_params_default(&gp);
    gp.max_tokens = 16;
    CHECK_OK(kvq_seq_generate(a, ids, n, &gp, g1, 16, &n1, NULL, NULL));
    CHECK_OK(kvq_seq_generate(b, ids, 300, &gp, g3, 0, &n3, NULL, NULL)); /* prefill only */
    CHECK(n3 == 0 && kvq_seq_pos(b) == 300);
    CHECK_OK(kvq_seq_generate(b, ids + 300, n - 300, &gp, g2, 16, &n2, NULL, NULL));
    CHECK(n1 == 16 && n2 == 16 && memcmp(g1, g2, sizeof g1) == 0);
    kvq_seq_reset(a);
    CHECK(kvq_seq_pos(a) == 0);
    CHECK_OK(kvq_seq_generate(a, ids, n, &gp, g3, 16, &n3, NULL, NULL));
    CHECK(n3 == 16 && memcmp(g1, g3, sizeof g1) == 0);
out:
    free(ids);
    kvq_seq_free(a);
    kvq_seq_free(b);
}

static void test_bad_input(void)
{
    kvq_seq *s = new_seq(KVQ_DEFAULT_TYPE_K, KVQ_DEFAULT_TYPE_V);
    if (!s)
        return;
    const struct kvq_model_config *c = kvq_model_config_of(model);
    int32_t ids[3] = {1, 5, c->vocab};
    CHECK_STATUS(kvq_seq_forward(s, ids, 3, 2, NULL, NULL), KVQ_ERR_RANGE);
    ids[2] = -1;
    CHECK_STATUS(kvq_seq_forward(s, ids, 3, 2, NULL, NULL), KVQ_ERR_RANGE);
    CHECK(kvq_seq_pos(s) == 0); /* nothing appended */
    CHECK_STATUS(kvq_seq_forward(s, ids, 2, 3, NULL, NULL), KVQ_ERR_INVALID_ARG);
    /* A prompt longer than the context. */
    size_t big = kvq_seq_max_ctx(s) + 1;
    int32_t *many = calloc(big, sizeof *many);
    struct kvq_gen_params gp;
    kvq_gen_params_default(&gp);
    int32_t out[4];
    size_t n_out = 99;
    CHECK_STATUS(kvq_seq_generate(s, many, big, &gp, out, 4, &n_out, NULL, NULL), KVQ_ERR_CONTEXT_FULL);
    CHECK(n_out == 0 && kvq_seq_pos(s) == 0);
    gp.speculative = KVQ_MAX_DRAFT + 1;
    CHECK_STATUS(kvq_seq_generate(s, ids, 2, &gp, out, 4, &n_out, NULL, NULL), KVQ_ERR_INVALID_ARG);
    gp.speculative = 0;
    gp.top_p = 0.0f;
    CHECK_STATUS(kvq_seq_generate(s, ids, 2, &gp, out, 4, &n_out, NULL, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_seq_truncate(s, 1), KVQ_ERR_INVALID_ARG);
    free(many);
    kvq_seq_free(s);

    /* Unsupported cache type for this head dim; context beyond the model's. */
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.type_k = KVQ_TYPE_COUNT;
    kvq_seq *t = NULL;
    kvq_error err = {0};
    CHECK_STATUS(kvq_seq_create(model, &sc, &t, &err), KVQ_ERR_INVALID_ARG);
    kvq_seq_config_default(&sc);
    sc.max_ctx = (size_t)c->max_ctx + 1;
    CHECK_STATUS(kvq_seq_create(model, &sc, &t, &err), KVQ_ERR_INVALID_ARG);
    CHECK(t == NULL);

    /* Missing directory / missing files. */
    kvq_model *m = NULL;
    CHECK_STATUS(kvq_model_load("models/no-such-model", NULL, &m, &err), KVQ_ERR_IO);
    CHECK(strstr(err.msg, "config.json") != NULL);
    CHECK_STATUS(kvq_model_load(TEST_REF_DIR, NULL, &m, &err), KVQ_ERR_IO);
    CHECK(m == NULL);
}

static void test_config_parse(void)
{
    size_t len;
    char *text = test_read_file(TEST_MODEL_DIR "/config.json", &len);
    struct kvq_model_config c;
    kvq_error err = {0};
    CHECK_OK(kvq_model_config_parse(text, len, &c, &err));
    CHECK(c.hidden == 512 && c.n_layers == 4 && c.n_heads == 4 && c.n_kv_heads == 2 && c.head_dim == 128);
    CHECK(c.ffn == 1024 && c.vocab == 4096 && c.max_ctx == 4096 && c.bos_id == 1 && c.n_eos == 1 && c.eos_ids[0] == 2);
    CHECK(c.rope_theta == 10000.0 && fabsf(c.rms_eps - 1e-5f) < 1e-12f);
    CHECK(!c.arch.qkv_bias && !c.arch.o_bias && !c.arch.mlp_bias && !c.arch.qk_norm && !c.arch.tied_embeddings);
    /* the Llama kinds (each op's other kinds: test_backend_ops -o embed,norm,qkv-rope,glu,lm-head) */
    CHECK(c.arch.norm == KVQ_NORM_RMS && c.arch.act == KVQ_ACT_SILU && c.arch.rope == KVQ_ROPE_HALF);
    CHECK(c.arch.rotary_dim == c.head_dim && c.arch.embed_scale == 1.0f && c.arch.final_softcap == 0.0f);
    CHECK(c.arch.attn_softcap == 0.0f && c.arch.sliding_window == 0 && !c.arch.sandwich_norm);
    CHECK(kvq_model_config_layer_params(&c) == 512 * 512 * 2 + 2 * 512 * 256 + 3 * 512 * 1024 + 2 * 512);
    free(text);

    struct {
        const char *json;
        kvq_status want;
        const char *msg;
    } cases[] = {
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"intermediate_size\":128,\"vocab_size\":100,\"max_position_embeddings\":64,\"rope_theta\":500000.0,"
         "\"eos_token_id\":[2,7],\"tie_word_embeddings\":true}",
         KVQ_OK, ""},
        {"{\"model_type\":\"qwen2\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"num_key_value_heads\":2,\"intermediate_size\":128,\"vocab_size\":100,\"max_position_embeddings\":64}",
         KVQ_OK, ""},
        {"{\"model_type\":\"gpt2\"}", KVQ_ERR_UNSUPPORTED, "model_type 'gpt2'"},
        {"{\"model_type\":\"llama\",\"hidden_act\":\"gelu\"}", KVQ_ERR_UNSUPPORTED, "hidden_act 'gelu'"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64}", KVQ_ERR_FORMAT, "missing 'num_hidden_layers'"},
        {"{\"model_type\":\"llama\",\"hidden_size\":-64,\"num_hidden_layers\":2}", KVQ_ERR_FORMAT, "'hidden_size'"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"num_key_value_heads\":3,\"intermediate_size\":128,\"vocab_size\":100,\"max_position_embeddings\":64}",
         KVQ_ERR_FORMAT, "not a multiple"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"intermediate_size\":128,\"vocab_size\":100,\"max_position_embeddings\":64,"
         "\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8}}",
         KVQ_ERR_FORMAT, "rope type 'llama3' needs 'original_max_position_embeddings'"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"intermediate_size\":128,\"vocab_size\":100,\"max_position_embeddings\":64,"
         "\"rope_scaling\":{\"rope_type\":\"mrope\"}}",
         KVQ_ERR_UNSUPPORTED, "rope type 'mrope' is not supported"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"intermediate_size\":128,\"vocab_size\":100,\"max_position_embeddings\":64,\"eos_token_id\":100}",
         KVQ_ERR_FORMAT, "eos_token_id 100"},
        {"[1]", KVQ_ERR_FORMAT, "not a JSON object"},
        {"{", KVQ_ERR_FORMAT, "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(&err, 0, sizeof err);
        kvq_status st = kvq_model_config_parse(cases[i].json, strlen(cases[i].json), &c, &err);
        CHECKF(st == cases[i].want, "case %zu: %d (%s)", i, (int)st, err.msg);
        CHECKF(strstr(err.msg, cases[i].msg) != NULL, "case %zu: '%s' lacks '%s'", i, err.msg, cases[i].msg);
        if (i == 0) {
            CHECK(c.rope_theta == 500000.0 && c.n_kv_heads == 4 && c.head_dim == 16 && c.arch.tied_embeddings);
            CHECK(c.n_eos == 2 && c.eos_ids[1] == 7 && c.bos_id == -1);
        }
        if (i == 1)
            CHECK(c.arch.qkv_bias && !c.arch.o_bias && !c.arch.qk_norm && c.rope_theta == 10000.0);
    }
}

int main(void)
{
    if (test_fixture_open(&fx, "test_model") != 0)
        return 1;
    model = fx.model;
    RUN(test_config_parse);
    RUN(test_fixture_cases_f32);
    RUN(test_passkey_compressed);
    RUN(test_states_share_model);
    RUN(test_bad_input);
    test_fixture_close(&fx);
    return TEST_END("test_model");
}
