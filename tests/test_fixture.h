/* test_fixture.h - the Hugging Face fixtures of the bundled model, for the
 * tests that run the decoder against them (test_model on the CPU,
 * test_decoder_cuda on the GPU).
 *
 * TEST_REF_DIR/reference.json lists the cases ("cases": name, prompt text);
 * TEST_REF_DIR/reference.safetensors holds, per case NAME, the prompt's
 * token ids (NAME.ids), the positions HF's logits were kept at
 * (NAME.logit_positions), those logits (NAME.logits, [positions][vocab]) and
 * HF's greedy continuation (NAME.greedy, TEST_N_GREEDY tokens). The passkey
 * cases (names "passkey*") say their key in the prompt.
 *
 * Header-only and static inline, like test_util.h.
 */
#ifndef KVQ_TEST_FIXTURE_H
#define KVQ_TEST_FIXTURE_H

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvq_model.h"
#include "kvq_safetensors.h"
#include "kvq_tokenizer.h"
#include "test.h"
#include "test_util.h"

/* Tokens of HF's greedy continuation per case (NAME.greedy). */
#define TEST_N_GREEDY 24

struct test_fixture {
    kvq_model *model;  /* TEST_MODEL_DIR */
    kvq_st_file *ref;  /* reference.safetensors */
    cJSON *json;       /* reference.json */
};

/* Loads the model, reference.json and reference.safetensors into fx.
 * @return 0, or -1 after printing "SUITE: cannot load the fixtures: why"
 * (then the test binary exits 1). */
static inline int test_fixture_open(struct test_fixture *fx, const char *suite)
{
    kvq_error err = {0};
    size_t len = 0;
    memset(fx, 0, sizeof *fx);
    char *js = test_read_file(TEST_REF_DIR "/reference.json", &len);
    fx->json = js ? cJSON_Parse(js) : NULL;
    free(js);
    if (kvq_model_load(TEST_MODEL_DIR, NULL, &fx->model, &err) != KVQ_OK ||
        kvq_st_open(TEST_REF_DIR "/reference.safetensors", &fx->ref, &err) != KVQ_OK || !fx->json) {
        fprintf(stderr, "%s: cannot load the fixtures: %s\n", suite, err.msg);
        return -1;
    }
    return 0;
}

static inline void test_fixture_close(struct test_fixture *fx)
{
    kvq_model_free(fx->model);
    kvq_st_close(fx->ref);
    cJSON_Delete(fx->json);
    memset(fx, 0, sizeof *fx);
}

/* The cases of reference.json (iterate with cJSON_ArrayForEach). */
static inline const cJSON *test_fixture_cases(const struct test_fixture *fx)
{
    return cJSON_GetObjectItem(fx->json, "cases");
}

/* NAME.FIELD of the reference file as int32 (ids, logit_positions, greedy).
 * @return a malloc'd array of *n values (caller frees), or NULL (*n = 0). */
static inline int32_t *test_fixture_ints(const struct test_fixture *fx, const char *name, const char *field,
                                         size_t *n)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", name, field);
    return test_st_ints(fx->ref, key, n);
}

/* One case's tensors. */
struct test_fixture_case {
    int32_t *ids, *pos, *greedy; /* NAME.ids, NAME.logit_positions, NAME.greedy */
    size_t n_ids, n_pos, n_greedy;
    float *logits; /* NAME.logits as f32: [n_pos][vocab] */
};

/* Loads case name's tensors into c (test_fixture_case_free frees them). A
 * tensor missing, or a greedy continuation not TEST_N_GREEDY long, is a test
 * failure. @return 1 when every tensor is there. */
static inline int test_fixture_case_load(const struct test_fixture *fx, const char *name,
                                         struct test_fixture_case *c)
{
    memset(c, 0, sizeof *c);
    c->ids = test_fixture_ints(fx, name, "ids", &c->n_ids);
    c->pos = test_fixture_ints(fx, name, "logit_positions", &c->n_pos);
    c->greedy = test_fixture_ints(fx, name, "greedy", &c->n_greedy);
    char key[128];
    snprintf(key, sizeof key, "%s.logits", name);
    const struct kvq_st_tensor *lt = kvq_st_find(fx->ref, key);
    CHECK(c->ids && c->pos && c->greedy && lt && c->n_greedy == TEST_N_GREEDY);
    if (lt && (c->logits = malloc(lt->n_elements * sizeof *c->logits)))
        kvq_st_to_f32(lt, c->logits, lt->n_elements);
    return c->ids && c->pos && c->greedy && c->logits;
}

static inline void test_fixture_case_free(struct test_fixture_case *c)
{
    free(c->ids);
    free(c->pos);
    free(c->greedy);
    free(c->logits);
    memset(c, 0, sizeof *c);
}

/* max_j |want[j] - got[j]| / max_j |want[j]| over n logits, with each
 * side's argmax (first maximum) in *am_want and *am_got. */
static inline double test_logits_rel_diff(const float *want, const float *got, int n, int *am_want, int *am_got)
{
    double maxabs = 0, diff = 0;
    *am_want = *am_got = 0;
    for (int j = 0; j < n; j++) {
        maxabs = fmax(maxabs, fabs(want[j]));
        diff = fmax(diff, fabs((double)want[j] - got[j]));
        if (want[j] > want[*am_want])
            *am_want = j;
        if (got[j] > got[*am_got])
            *am_got = j;
    }
    return diff / maxabs;
}

/* Over T positions of V logits each: the largest |got - want| of a position
 * over its largest |want|, worst position (INFINITY for a non-finite got). */
static inline double test_logits_worst(const float *got, const float *want, size_t T, int V)
{
    double worst = 0;
    for (size_t t = 0; t < T; t++) {
        double mx = 0, e = 0;
        for (int v = 0; v < V; v++) {
            const double r = want[t * (size_t)V + v], g = got[t * (size_t)V + v];
            mx = fmax(mx, fabs(r));
            e = fmax(e, isfinite(g) ? fabs(g - r) : INFINITY);
        }
        worst = fmax(worst, e / mx);
    }
    return worst;
}

/* From a reset s: n greedy tokens after the prompt ids[0..T), past EOS
 * (generation failing is a test failure). @return the tokens generated. */
static inline size_t test_greedy_n(kvq_seq *s, const int32_t *ids, size_t T, int32_t *out, size_t n)
{
    kvq_seq_reset(s);
    struct kvq_gen_params gp;
    kvq_gen_params_default(&gp);
    gp.max_tokens = (int)n;
    gp.stop_at_eos = 0;
    size_t n_out = 0;
    CHECK_OK(kvq_seq_generate(s, ids, T, &gp, out, n, &n_out, NULL, NULL));
    return n_out;
}

/* From a reset s: TEST_N_GREEDY greedy tokens after the case's prompt
 * (generation failing is a test failure), against NAME.greedy. HF pads
 * after EOS with EOS (pad = eos), where the decoder stops at the first EOS.
 * @return 1 when they match; *n_out: the tokens generated. */
static inline int test_fixture_greedy_matches(const struct test_fixture *fx, kvq_seq *s,
                                              const struct test_fixture_case *c, size_t *n_out)
{
    kvq_seq_reset(s);
    struct kvq_gen_params gp;
    kvq_gen_params_default(&gp);
    gp.max_tokens = TEST_N_GREEDY;
    int32_t out[TEST_N_GREEDY];
    *n_out = 0;
    CHECK_OK(kvq_seq_generate(s, c->ids, c->n_ids, &gp, out, TEST_N_GREEDY, n_out, NULL, NULL));
    const int32_t eos = kvq_model_config_of(fx->model)->eos_ids[0];
    int same = *n_out >= 1 && (*n_out == TEST_N_GREEDY || out[*n_out - 1] == eos);
    for (size_t i = 0; i < TEST_N_GREEDY && same; i++)
        same = i < *n_out ? out[i] == c->greedy[i] : c->greedy[i] == eos;
    return same;
}

/* The key as written in a passkey prompt: "The pass key is KEY. Remember
 * it." @return 0 with the digits in key (NUL-terminated, at most cap - 1),
 * or -1 when the prompt has none of at least 5 digits. */
static inline int test_prompt_key(const char *text, char *key, size_t cap)
{
    const char *p = strstr(text, "The pass key is ");
    if (!p)
        return -1;
    p += strlen("The pass key is ");
    size_t n = 0;
    while (p[n] >= '0' && p[n] <= '9' && n + 1 < cap) {
        key[n] = p[n];
        n++;
    }
    key[n] = 0;
    return n >= 5 ? 0 : -1;
}

/* Runs passkey case c (an entry of test_fixture_cases) on s: the key from
 * its prompt into key[key_cap] (not finding one is a test failure), then 12
 * greedy tokens from a reset s after NAME.ids, decoded (control tokens
 * skipped) into answer[cap]. @return 1 when the answer holds the key. */
static inline int test_fixture_passkey(const struct test_fixture *fx, kvq_seq *s, kvq_tokenizer *tok,
                                       const cJSON *c, char *key, size_t key_cap, char *answer, size_t cap)
{
    const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
    key[0] = 0;
    CHECK(test_prompt_key(cJSON_GetObjectItem(c, "text")->valuestring, key, key_cap) == 0);
    size_t n_ids;
    int32_t *ids = test_fixture_ints(fx, name, "ids", &n_ids);
    kvq_seq_reset(s);
    struct kvq_gen_params gp;
    kvq_gen_params_default(&gp);
    gp.max_tokens = 12;
    int32_t out[12];
    size_t n_out = 0, len;
    answer[0] = 0;
    CHECK_OK(kvq_seq_generate(s, ids, n_ids, &gp, out, 12, &n_out, NULL, NULL));
    CHECK_OK(kvq_tokenizer_decode(tok, out, n_out, KVQ_DETOK_SKIP_CONTROL, answer, cap, &len));
    free(ids);
    return strstr(answer, key) != NULL;
}

/* The bundled model's config.json, parsed, to edit into a variant (NULL
 * after a failed CHECK when it cannot be read). */
static inline cJSON *test_model_config(void)
{
    size_t len;
    char *text = test_read_file(TEST_MODEL_DIR "/config.json", &len);
    cJSON *cfg = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(cfg != NULL);
    return cfg;
}

/* Makes dir (created if needed) a model that differs from the bundled one
 * in its config only: cfg (freed here) as config.json, the bundled index
 * and weights linked in. */
static inline void test_model_variant(const char *dir, cJSON *cfg)
{
    mkdir(dir, 0777);
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

#endif /* KVQ_TEST_FIXTURE_H */
