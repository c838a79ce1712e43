/* test_decoder_cuda.c - the whole decoder on the GPU (KVQ_DEVICE_CUDA)
 * against the Hugging Face fixtures and against the CPU decoder.
 *
 *  - f32 cache: logits at every reference position within 1e-3 x max|logit|
 *    of HF and of the CPU decoder, same argmax, the HF greedy continuation;
 *  - tq3j/tq3 with and without the recent-token f16 window (and with sink
 *    tokens): both passkeys retrieved, and perplexity over 4K tokens of
 *    valid.txt within 0.3% of the CPU decoder with the same cache.
 * Without a GPU (or built without CUDA) every test skips, and one test checks
 * that a CUDA sequence is refused with KVQ_ERR_NO_DEVICE. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>

#include "kvq_cuda.h"
#include "kvq_model.h"
#include "kvq_safetensors.h"
#include "kvq_tokenizer.h"
#include "test.h"
#include "test_fixture.h"
#include "test_util.h"

static struct test_fixture fx;
static kvq_model *model; /* fx.model */

#define NEED_GPU()                                                                   \
    do {                                                                             \
        if (kvq_cuda_device_count() == 0) {                                          \
            SKIP("no CUDA device (kvq_cuda_device_count() == 0): GPU test not run"); \
            return;                                                                  \
        }                                                                            \
    } while (0)

static kvq_seq *new_seq_sinks(enum kvq_device dev, enum kvq_type k, enum kvq_type v, int window, int sinks)
{
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.device = dev;
    sc.type_k = k;
    sc.type_v = v;
    sc.recent_f16 = window;
    sc.sink_tokens = sinks;
    kvq_seq *s = NULL;
    kvq_error err = {0};
    CHECKF(kvq_seq_create(model, &sc, &s, &err) == KVQ_OK, "%s", err.msg);
    return s;
}

static kvq_seq *new_seq(enum kvq_device dev, enum kvq_type k, enum kvq_type v, int window)
{
    return new_seq_sinks(dev, k, v, window, 0);
}

static void check_case(kvq_seq *gpu, kvq_seq *cpu, const char *name, double *worst_hf, double *worst_cpu)
{
    struct test_fixture_case fc;
    const int V = kvq_model_config_of(model)->vocab;
    float *g = malloc((size_t)V * sizeof *g), *c = malloc((size_t)V * sizeof *c);
    if (!test_fixture_case_load(&fx, name, &fc))
        goto out;
    kvq_seq_reset(gpu);
    kvq_seq_reset(cpu);
    size_t done = 0;
    for (size_t i = 0; i < fc.n_pos; i++) {
        size_t p = (size_t)fc.pos[i];
        CHECK_OK(kvq_seq_forward(gpu, fc.ids + done, p + 1 - done, p - done, g, NULL));
        CHECK_OK(kvq_seq_forward(cpu, fc.ids + done, p + 1 - done, p - done, c, NULL));
        done = p + 1;
        int a_w, a_g, a_c, a_g2;
        double e_hf = test_logits_rel_diff(fc.logits + i * (size_t)V, g, V, &a_w, &a_g);
        double e_cpu = test_logits_rel_diff(c, g, V, &a_c, &a_g2);
        *worst_hf = fmax(*worst_hf, e_hf);
        *worst_cpu = fmax(*worst_cpu, e_cpu);
        CHECKF(e_hf <= 1e-3, "%s pos %zu: GPU vs HF %.3g x max|logit|", name, p, e_hf);
        CHECKF(e_cpu <= 1e-3, "%s pos %zu: GPU vs CPU %.3g x max|logit|", name, p, e_cpu);
        CHECKF(a_w == a_g && a_c == a_g, "%s pos %zu: argmax GPU %d, HF %d, CPU %d", name, p, a_g, a_w, a_c);
    }
    size_t n_out = 0;
    CHECKF(test_fixture_greedy_matches(&fx, gpu, &fc, &n_out),
           "%s: GPU greedy continuation (%zu tokens) differs from HF's", name, n_out);
out:
    free(g);
    free(c);
    test_fixture_case_free(&fc);
}

static void test_fixture_cases_f32(void)
{
    NEED_GPU();
    kvq_seq *gpu = new_seq(KVQ_DEVICE_CUDA, KVQ_TYPE_F32, KVQ_TYPE_F32, 0);
    kvq_seq *cpu = new_seq(KVQ_DEVICE_CPU, KVQ_TYPE_F32, KVQ_TYPE_F32, 0);
    double worst_hf = 0, worst_cpu = 0;
    const cJSON *c;
    int n = 0;
    cJSON_ArrayForEach(c, test_fixture_cases(&fx))
    {
        if (gpu && cpu)
            check_case(gpu, cpu, cJSON_GetObjectItem(c, "name")->valuestring, &worst_hf, &worst_cpu);
        n++;
    }
    CHECK(n == 6);
    printf("  GPU f32 cache: worst logit error %.2e x max|logit| vs HF, %.2e vs the CPU decoder\n", worst_hf,
           worst_cpu);
    kvq_seq_free(gpu);
    kvq_seq_free(cpu);
}

static void test_passkey_compressed(void)
{
    NEED_GPU();
    kvq_tokenizer *tok = NULL;
    CHECK_OK(kvq_tokenizer_create(TEST_MODEL_DIR "/tokenizer.json", &tok, NULL));
    const cJSON *c;
    int n = 0;
    for (int window = 0; window <= 1; window++) {
        kvq_seq *s = new_seq(KVQ_DEVICE_CUDA, KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, window);
        cJSON_ArrayForEach(c, test_fixture_cases(&fx))
        {
            const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
            if (!s || !tok || strncmp(name, "passkey", 7) != 0)
                continue;
            char key[16], text[256];
            CHECKF(test_fixture_passkey(&fx, s, tok, c, key, sizeof key, text, sizeof text),
                   "%s: GPU answer '%s' lacks the key %s", name, text, key);
            struct kvq_seq_stats st;
            kvq_seq_get_stats(s, &st);
            printf("  %-10s key %s -> '%s' (GPU, tq3j/tq3%s); KV %zu bytes vs f16 %zu\n", name, key, text,
                   window ? " + window" : "", st.kv_bytes_used, st.kv_bytes_f16);
            CHECK(st.kv_bytes_used > 0 && st.kv_bytes_used * 4 < st.kv_bytes_f16);
            n++;
        }
        kvq_seq_free(s);
    }
    CHECK(n == 4);
    kvq_tokenizer_free(tok);
}

/* Mean NLL of ids[1..n) given their prefixes, 256 positions per forward. */
static double mean_nll(kvq_seq *s, const int32_t *ids, size_t n, float *logits, int V)
{
    double nll = 0;
    kvq_seq_reset(s);
    for (size_t i = 0; i + 1 < n; i += 256) {
        size_t T = n - 1 - i < 256 ? n - 1 - i : 256;
        if (kvq_seq_forward(s, ids + i, T, 0, logits, NULL) != KVQ_OK)
            return NAN;
        for (size_t t = 0; t < T; t++) {
            const float *row = logits + t * (size_t)V;
            double mx = row[0], sum = 0;
            for (int j = 1; j < V; j++)
                mx = fmax(mx, row[j]);
            for (int j = 0; j < V; j++)
                sum += exp(row[j] - mx);
            nll += mx + log(sum) - row[ids[i + t + 1]];
        }
    }
    return nll / (double)(n - 1);
}

static void test_ppl_matches_cpu(void)
{
    NEED_GPU();
    kvq_tokenizer *tok = NULL;
    CHECK_OK(kvq_tokenizer_create(TEST_MODEL_DIR "/tokenizer.json", &tok, NULL));
    size_t len = 0, n = 0;
    char *text = test_read_file(TEST_REF_DIR "/valid.txt", &len);
    /* KVQ_CUDA_TEST_SMALL=1 (the sanitizer runs): 1024 tokens */
    const char *small = getenv("KVQ_CUDA_TEST_SMALL");
    const size_t N = small && small[0] == '1' ? 1024 : 4096;
    const size_t text_max = 40000; /* bytes of valid.txt: comfortably over N tokens */
    int32_t *ids = malloc((text_max + 1) * sizeof *ids);
    const int V = kvq_model_config_of(model)->vocab;
    float *logits = malloc(256 * (size_t)V * sizeof *logits);
    if (!tok || !text || !ids || !logits)
        goto out;
    CHECK_OK(kvq_tokenizer_encode(tok, text, len < text_max ? len : text_max, 0, ids, text_max + 1, &n));
    CHECK(n >= N);
    n = N;
    /* no window; the window (the default); the window and 4 sink tokens */
    static const int windows[] = {0, 1, 1}, sinks[] = {0, 0, 4};
    for (int i = 0; i < 3; i++) {
        kvq_seq *g = new_seq_sinks(KVQ_DEVICE_CUDA, KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, windows[i], sinks[i]);
        kvq_seq *c = new_seq_sinks(KVQ_DEVICE_CPU, KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, windows[i], sinks[i]);
        if (g && c) {
            double pg = exp(mean_nll(g, ids, n, logits, V)), pc = exp(mean_nll(c, ids, n, logits, V));
            printf("  perplexity over %zu tokens, tq3j/tq3, window %d, sinks %d: GPU %.4f, CPU %.4f (%+.3f%%)\n", n,
                   windows[i], sinks[i], pg, pc, 100.0 * (pg / pc - 1.0));
            CHECKF(fabs(pg / pc - 1.0) <= 0.003, "GPU perplexity %.4f vs CPU %.4f (window %d, sinks %d)", pg, pc,
                   windows[i], sinks[i]);
        }
        kvq_seq_free(g);
        kvq_seq_free(c);
    }
out:
    free(text);
    free(ids);
    free(logits);
    kvq_tokenizer_free(tok);
}

/* What the device store refuses, in one clear status; no GPU: NO_DEVICE. */
static void test_refusals(void)
{
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.device = KVQ_DEVICE_CUDA;
    kvq_seq *s = NULL;
    kvq_error err = {0};
    if (kvq_cuda_device_count() == 0) {
        sc.recent_f16 = 0;
        CHECK_STATUS(kvq_seq_create(model, &sc, &s, &err), KVQ_ERR_NO_DEVICE);
        CHECK(s == NULL && err.msg[0]);
        return;
    }
    sc.v_norm_correct = 1;
    CHECK_STATUS(kvq_seq_create(model, &sc, &s, &err), KVQ_ERR_UNSUPPORTED);
    CHECK(s == NULL && strstr(err.msg, "value-norm"));
    sc.v_norm_correct = 0;
    sc.device = (enum kvq_device)7;
    CHECK_STATUS(kvq_seq_create(model, &sc, &s, &err), KVQ_ERR_INVALID_ARG);
}

int main(void)
{
    if (test_fixture_open(&fx, "test_decoder_cuda") != 0)
        return 1;
    model = fx.model;
    RUN(test_refusals);
    RUN(test_fixture_cases_f32);
    RUN(test_passkey_compressed);
    RUN(test_ppl_matches_cpu);
    test_fixture_close(&fx);
    return TEST_END("test_decoder_cuda");
}
