/* test_decoder_run.c - the `kvq run` command end to end: JSON output against
 * the HF fixtures, streamed text, --dump-qkv against the reference dump, and
 * one clear error line (exit 2) for each kind of bad input. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvq_half.h"
#include "kvq_safetensors.h"
#include "test.h"
#include "test_util.h"

int cmd_run(int argc, char **argv);

static char tmp[64];
static char *out_text, *err_text; /* what the last run printed */
static cJSON *ref_json;

/* Runs `kvq run ARGS...` in-process with stdout and stderr captured. */
static int run(int argc, const char **args)
{
    char *argv[64];
    argv[0] = "run";
    for (int i = 0; i < argc && i < 62; i++)
        argv[i + 1] = (char *)args[i];
    argv[argc + 1] = NULL;
    free(out_text);
    free(err_text);
    return test_run_captured(cmd_run, argc + 1, argv, &out_text, &err_text);
}

static const cJSON *ref_case(const char *name)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(ref_json, "cases"))
    {
        if (strcmp(cJSON_GetObjectItem(c, "name")->valuestring, name) == 0)
            return c;
    }
    return NULL;
}

static int same_ids(const cJSON *arr, const int32_t *ids, size_t n)
{
    if (!cJSON_IsArray(arr) || (size_t)cJSON_GetArraySize(arr) != n)
        return 0;
    size_t i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, arr)
    {
        if (x->valueint != ids[i++])
            return 0;
    }
    return 1;
}

/* --json with an f32 cache reproduces HF: prompt ids (BOS first), greedy ids
 * and text; speculative decoding gives the same. */
static void test_json_matches_reference(void)
{
    kvq_st_file *ref = NULL;
    CHECK_OK(kvq_st_open(TEST_REF_DIR "/reference.safetensors", &ref, NULL));
    const char *names[] = {"prose", "code"};
    for (int k = 0; k < 2 && ref; k++) {
        const cJSON *c = ref_case(names[k]);
        size_t n_ids, n_g;
        char key[64];
        snprintf(key, sizeof key, "%s.ids", names[k]);
        int32_t *ids = test_st_ints(ref, key, &n_ids);
        snprintf(key, sizeof key, "%s.greedy", names[k]);
        int32_t *greedy = test_st_ints(ref, key, &n_g);
        for (int spec = 0; spec <= 4; spec += 4) {
            char specs[16];
            snprintf(specs, sizeof specs, "%d", spec);
            const char *args[] = {"--model", TEST_MODEL_DIR, "--prompt", cJSON_GetObjectItem(c, "text")->valuestring,
                                  "--max-tokens", "24", "--json", "--cache-type-k", "f32", "--cache-type-v", "f32",
                                  "--speculative", specs};
            CHECK(run(13, args) == 0);
            cJSON *j = out_text ? cJSON_Parse(out_text) : NULL;
            CHECKF(j != NULL, "stdout is not JSON: %s", out_text ? out_text : "(none)");
            if (!j)
                continue;
            CHECK(same_ids(cJSON_GetObjectItem(j, "prompt_ids"), ids, n_ids));
            CHECK(same_ids(cJSON_GetObjectItem(j, "ids"), greedy, n_g));
            const cJSON *text = cJSON_GetObjectItem(j, "text");
            CHECKF(cJSON_IsString(text) &&
                       strcmp(text->valuestring, cJSON_GetObjectItem(c, "greedy_text")->valuestring) == 0,
                   "%s: text '%s'", names[k], cJSON_IsString(text) ? text->valuestring : "?");
            const cJSON *kv = cJSON_GetObjectItem(j, "kv_bytes");
            /* f32 K and V: 2 x 4 bytes x 128 x 2 heads x 4 layers per token = twice f16. */
            CHECK(cJSON_GetObjectItem(kv, "used")->valuedouble ==
                  2.0 * cJSON_GetObjectItem(kv, "f16")->valuedouble);
            CHECK(cJSON_GetObjectItem(kv, "tokens")->valueint == (int)(n_ids + n_g - 1));
            CHECK(cJSON_IsObject(cJSON_GetObjectItem(j, "timings")) &&
                  cJSON_GetObjectItem(cJSON_GetObjectItem(j, "timings"), "prefill_s")->valuedouble > 0);
            CHECK(cJSON_GetObjectItem(j, "tokens_per_forward")->valuedouble >= 1.0);
            cJSON_Delete(j);
        }
        free(ids);
        free(greedy);
    }
    kvq_st_close(ref);
}

/* Streaming text, default compressed cache, summary on stderr. */
static void test_stream(void)
{
    const cJSON *c = ref_case("code");
    const char *args[] = {"--model", TEST_MODEL_DIR, "--prompt", cJSON_GetObjectItem(c, "text")->valuestring,
                          "--max-tokens", "24", "--cache-type-k", "f32", "--cache-type-v", "f32"};
    CHECK(run(10, args) == 0);
    char want[256];
    snprintf(want, sizeof want, "%s\n", cJSON_GetObjectItem(c, "greedy_text")->valuestring);
    CHECKF(out_text && strcmp(out_text, want) == 0, "stdout '%s'", out_text ? out_text : "");
    CHECK(err_text && strstr(err_text, "prefill:") && strstr(err_text, "KV cache f32/f32") &&
          strstr(err_text, "host overhead"));
    /* packed rows only: 118 against 512 bytes per token-head */
    const char *args2[] = {"--model", TEST_MODEL_DIR, "--prompt", "The grass is green.", "--max-tokens", "8",
                           "--no-kv-recent-f16"};
    CHECK(run(7, args2) == 0);
    CHECK(err_text && strstr(err_text, "KV cache tq3j/tq3:") && strstr(err_text, "4.34x smaller"));
    /* the default adds the recent-token window, whose fixed f16 buffers
     * (320 KiB here) outweigh 14 tokens of rows, and says so */
    CHECK(run(6, args2) == 0);
    CHECK(err_text && strstr(err_text, "KV cache tq3j/tq3+ctr+win:") && strstr(err_text, "x larger: the fixed f16 buffers outweigh") &&
          strstr(err_text, "f16 window/sink buffers"));
}

/* Post-RoPE q/k/v of kv_text's ids equal the reference dump to f16 precision. */
static void test_dump_qkv(void)
{
    kvq_st_file *ref = NULL;
    CHECK_OK(kvq_st_open(TEST_REF_DIR "/kv_text.safetensors", &ref, NULL));
    if (!ref)
        return;
    size_t n;
    int32_t *ids = test_st_ints(ref, "ids", &n);
    char *list = malloc(n * 8 + 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        o += (size_t)sprintf(list + o, "%s%d", i ? "," : "", ids[i]);
    char path[96];
    snprintf(path, sizeof path, "%s/dump.safetensors", tmp);
    const char *args[] = {"--model", TEST_MODEL_DIR, "--prompt-ids", list, "--max-tokens", "0",
                          "--cache-type-k", "f32", "--cache-type-v", "f32", "--dump-qkv", path};
    CHECKF(run(12, args) == 0, "%s", err_text ? err_text : "");
    kvq_st_file *got = NULL;
    CHECK_OK(kvq_st_open(path, &got, NULL));
    const char *names[] = {"ids", "k", "q", "v"};
    for (int k = 0; k < 4 && got; k++) {
        const struct kvq_st_tensor *a = kvq_st_find(ref, names[k]), *b = kvq_st_find(got, names[k]);
        CHECK(a && b && kvq_st_expect(b, a->dtype, a->n_dims, a->shape, NULL) == KVQ_OK);
        if (!a || !b || a->n_elements != b->n_elements)
            continue;
        float *x = malloc(a->n_elements * sizeof *x), *y = malloc(a->n_elements * sizeof *y);
        kvq_st_to_f32(a, x, a->n_elements);
        kvq_st_to_f32(b, y, b->n_elements);
        /* f16 precision: every value of a head vector within 2^-10 of the
         * vector's largest magnitude, i.e. at most one f16 unit in the last
         * place apart (the runs differ in f32 rounding before converting). */
        size_t d = (size_t)a->shape[a->n_dims - 1], bad = 0;
        double worst = 0;
        for (size_t r = 0; r + d <= a->n_elements && k > 0; r += d) {
            double mx = 0, e = 0;
            for (size_t i = r; i < r + d; i++) {
                mx = fmax(mx, fabs(x[i]));
                e = fmax(e, fabs((double)x[i] - y[i]));
            }
            double rel = e / fmax(mx, 1e-6);
            worst = fmax(worst, rel);
            bad += rel > 1.0 / 1024.0;
        }
        if (k == 0)
            bad = memcmp(x, y, a->n_elements * sizeof *x) != 0;
        CHECKF(bad == 0, "%s: %zu vectors beyond f16 precision (worst %.2e)", names[k], bad, worst);
        printf("  dump %s: worst error %.2e x max|vector|\n", names[k], worst);
        free(x);
        free(y);
    }
    kvq_st_close(got);
    kvq_st_close(ref);
    free(ids);
    free(list);
}

static void expect_error(int argc, const char **args, const char *msg)
{
    int rc = run(argc, args);
    CHECKF(rc == 2, "rc %d for '%s'", rc, msg);
    CHECKF(err_text && strncmp(err_text, "kvq run: error: ", 16) == 0 && strstr(err_text, msg) &&
               strchr(err_text, '\n') == err_text + strlen(err_text) - 1,
           "stderr '%s' is not one error line with '%s'", err_text ? err_text : "", msg);
}

static void test_errors(void)
{
    const char *a1[] = {"--model", TEST_MODEL_DIR, "--prompt", "hi", "--cache-type-k", "tq7"};
    expect_error(6, a1, "unknown cache type 'tq7'");
    const char *a2[] = {"--model", TEST_MODEL_DIR, "--prompt-ids", "1,5,4096"};
    expect_error(4, a2, "prompt token id 4096 is outside the vocabulary");
    char *many = malloc(4097 * 2 + 1);
    for (int i = 0; i < 4097; i++)
        memcpy(many + 2 * i, "5,", 2);
    many[4097 * 2 - 1] = 0;
    const char *a3[] = {"--model", TEST_MODEL_DIR, "--prompt-ids", many};
    expect_error(4, a3, "the prompt has 4097 tokens, longer than the model's context of 4096");
    free(many);
    const char *a4[] = {"--model", "models/none", "--prompt", "hi"};
    expect_error(4, a4, "models/none/config.json: cannot open");
    const char *a5[] = {"--prompt", "hi"};
    expect_error(2, a5, "--model DIR is required");
    const char *a6[] = {"--model", TEST_MODEL_DIR, "--prompt", "hi", "--prompt-file", "x"};
    expect_error(6, a6, "exactly one of");
    const char *a7[] = {"--model", TEST_MODEL_DIR, "--prompt-file", "models/none.txt"};
    expect_error(4, a7, "cannot read the prompt file");
    const char *a8[] = {"--model", TEST_MODEL_DIR, "--prompt", "hi", "--speculative", "99"};
    expect_error(6, a8, "bad value '99' for --speculative");
    const char *a9[] = {"--model", TEST_MODEL_DIR, "--prompt", "hi", "--top-p", "0"};
    expect_error(6, a9, "bad value '0' for --top-p");

    /* A model directory whose weights are corrupt. */
    char dir[96], p[128];
    snprintf(dir, sizeof dir, "%s/bad", tmp);
    mkdir(dir, 0777);
    size_t len;
    char *cfg = test_read_file(TEST_MODEL_DIR "/config.json", &len);
    snprintf(p, sizeof p, "%s/config.json", dir);
    CHECK(cfg && test_write_file(p, cfg, len) == 0);
    free(cfg);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK(test_write_file(p, "\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": 1, \"b\":", 21) == 0);
    const char *a10[] = {"--model", dir, "--prompt", "hi"};
    expect_error(4, a10, "model.safetensors: header length 16 runs past the end");
    remove(p);
    snprintf(p, sizeof p, "%s/config.json", dir);
    remove(p);
    rmdir(dir);
}

int main(void)
{
    strcpy(tmp, "/tmp/kvq_test_run_XXXXXX");
    if (!mkdtemp(tmp))
        return 1;
    char *js = test_read_file(TEST_REF_DIR "/reference.json", NULL);
    ref_json = js ? cJSON_Parse(js) : NULL;
    free(js);
    RUN(test_json_matches_reference);
    RUN(test_stream);
    RUN(test_dump_qkv);
    RUN(test_errors);
    cJSON_Delete(ref_json);
    free(out_text);
    free(err_text);
    char p[96];
    snprintf(p, sizeof p, "%s/dump.safetensors", tmp);
    remove(p);
    rmdir(tmp);
    return TEST_END("test_decoder_run");
}
