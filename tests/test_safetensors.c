/* test_safetensors.c - the safetensors reader and writer: real fixture files,
 * a write/read round trip, and one hand-made corrupt header per rule. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <unistd.h>

#include "kvq_half.h"
#include "kvq_safetensors.h"
#include "test.h"
#include "test_util.h"

/* The fixture's ids and greedy continuations must agree with reference.json,
 * which was written independently of the safetensors file. */
static void test_reference_file(void)
{
    kvq_st_file *f = NULL;
    kvq_error err = {0};
    CHECK_OK(kvq_st_open(TEST_REF_DIR "/reference.safetensors", &f, &err));
    if (!f)
        return;
    CHECK(kvq_st_count(f) == 24);
    size_t jlen;
    char *js = test_read_file(TEST_REF_DIR "/reference.json", &jlen);
    cJSON *ref = js ? cJSON_Parse(js) : NULL;
    CHECK(ref != NULL);
    const cJSON *c;
    int n_cases = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(ref, "cases"))
    {
        char name[128];
        const char *cn = cJSON_GetObjectItem(c, "name")->valuestring;
        snprintf(name, sizeof name, "%s.ids", cn);
        const struct kvq_st_tensor *ids = kvq_st_find(f, name);
        CHECK(ids && ids->dtype == KVQ_ST_I32 && ids->n_dims == 1);
        if (!ids)
            continue;
        CHECK(ids->shape[0] == cJSON_GetObjectItem(c, "n_tokens")->valueint);
        int64_t first;
        CHECK_STATUS(kvq_st_to_i64(ids, NULL, 0), KVQ_ERR_INVALID_ARG);
        int64_t *v = malloc(ids->n_elements * sizeof *v);
        CHECK_OK(kvq_st_to_i64(ids, v, ids->n_elements));
        first = v[0];
        CHECK(first == 1); /* BOS */
        free(v);

        snprintf(name, sizeof name, "%s.greedy", cn);
        const struct kvq_st_tensor *g = kvq_st_find(f, name);
        const cJSON *gj = cJSON_GetObjectItem(c, "greedy_ids");
        CHECK(g && g->n_elements == (size_t)cJSON_GetArraySize(gj));
        if (g) {
            float gv[64];
            CHECK_OK(kvq_st_to_f32(g, gv, g->n_elements));
            int i = 0;
            const cJSON *x;
            cJSON_ArrayForEach(x, gj) CHECK(gv[i++] == (float)x->valueint);
        }
        snprintf(name, sizeof name, "%s.logits", cn);
        const struct kvq_st_tensor *lg = kvq_st_find(f, name);
        int64_t want[2] = {cJSON_GetArraySize(cJSON_GetObjectItem(c, "logit_positions")), 4096};
        CHECK(lg && kvq_st_expect(lg, KVQ_ST_F32, 2, want, NULL) == KVQ_OK);
        n_cases++;
    }
    CHECK(n_cases == 6);
    CHECK(kvq_st_find(f, "nope") == NULL);
    CHECK(kvq_st_find(f, "") == NULL);
    /* Tensors come in offset order and tile the buffer. */
    size_t end = 0;
    for (size_t i = 0; i < kvq_st_count(f); i++) {
        CHECK(kvq_st_tensor_at(f, i)->offset == end);
        end += kvq_st_tensor_at(f, i)->nbytes;
    }
    CHECK(kvq_st_tensor_at(f, kvq_st_count(f)) == NULL);
    cJSON_Delete(ref);
    free(js);
    kvq_st_close(f);
}

/* A bf16 checkpoint shard: dtype, shape, metadata, and conversion that is
 * exact (bf16 -> f32 is a shift). */
static void test_model_shard(void)
{
    kvq_st_file *f = NULL;
    CHECK_OK(kvq_st_open(TEST_MODEL_DIR "/model-00001-of-00002.safetensors", &f, NULL));
    if (!f)
        return;
    CHECK(kvq_st_metadata(f, "format") && strcmp(kvq_st_metadata(f, "format"), "pt") == 0);
    CHECK(kvq_st_metadata(f, "missing") == NULL);
    const struct kvq_st_tensor *e = kvq_st_find(f, "model.embed_tokens.weight");
    int64_t shape[2] = {4096, 512};
    CHECK(e && kvq_st_expect(e, KVQ_ST_BF16, 2, shape, NULL) == KVQ_OK);
    kvq_error err = {0};
    CHECK_STATUS(kvq_st_expect(e, KVQ_ST_F32, 2, shape, &err), KVQ_ERR_FORMAT);
    CHECK(strstr(err.msg, "dtype BF16, expected F32") != NULL);
    int64_t bad[2] = {4096, 256};
    CHECK_STATUS(kvq_st_expect(e, KVQ_ST_DTYPE_COUNT, 2, bad, &err), KVQ_ERR_FORMAT);
    CHECK(strstr(err.msg, "shape [4096, 512], expected [4096, 256]") != NULL);
    if (e) {
        float row[512];
        CHECK_OK(kvq_st_to_f32_range(e, 7 * 512, 512, row));
        const uint8_t *raw = (const uint8_t *)e->data + 7 * 512 * 2;
        for (int i = 0; i < 512; i++) {
            uint32_t bits = (uint32_t)(raw[2 * i] | raw[2 * i + 1] << 8) << 16;
            CHECK(kvq_f32_bits(row[i]) == bits);
        }
        CHECK_STATUS(kvq_st_to_f32_range(e, 4096 * 512 - 10, 11, row), KVQ_ERR_INVALID_ARG);
    }
    kvq_st_close(f);
}

static void test_open_errors(void)
{
    kvq_st_file *f = (kvq_st_file *)1;
    kvq_error err = {0};
    CHECK_STATUS(kvq_st_open("models/does-not-exist.safetensors", &f, &err), KVQ_ERR_IO);
    CHECK(strstr(err.msg, "does-not-exist") != NULL);
    CHECK_STATUS(kvq_st_open("models", &f, &err), KVQ_ERR_IO); /* a directory */
    CHECK_STATUS(kvq_st_open(TEST_MODEL_DIR "/config.json", &f, &err), KVQ_ERR_FORMAT);
    CHECK(f == (kvq_st_file *)1); /* untouched on error */
    kvq_st_close(NULL);
}

/* Round trip: every dtype, a scalar, an empty tensor, metadata. */
static void test_write_read(void)
{
    char dir[] = "/tmp/kvq_test_st_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[64];
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    float f32[6] = {1.5f, -2.0f, 0.0f, 3.25f, -1e-3f, 65504.0f};
    uint16_t f16[3], bf16[3];
    for (int i = 0; i < 3; i++) {
        f16[i] = kvq_f32_to_f16(f32[i]);
        bf16[i] = (uint16_t)(kvq_f32_bits(f32[i]) >> 16);
    }
    int32_t i32[4] = {1, -2, 2147483647, 0};
    int64_t i64[2] = {-5, 1ll << 40};
    double f64 = 0.125;
    kvq_st_writer *w = NULL;
    CHECK_OK(kvq_st_writer_create(&w));
    int64_t s23[2] = {2, 3}, s3[1] = {3}, s4[1] = {4}, s2[1] = {2}, s0[2] = {0, 7};
    CHECK_OK(kvq_st_writer_add(w, "x.f32", KVQ_ST_F32, 2, s23, f32));
    CHECK_OK(kvq_st_writer_add(w, "x.f16", KVQ_ST_F16, 1, s3, f16));
    CHECK_OK(kvq_st_writer_add(w, "x.bf16", KVQ_ST_BF16, 1, s3, bf16));
    CHECK_OK(kvq_st_writer_add(w, "ids", KVQ_ST_I32, 1, s4, i32));
    CHECK_OK(kvq_st_writer_add(w, "big", KVQ_ST_I64, 1, s2, i64));
    CHECK_OK(kvq_st_writer_add(w, "scalar", KVQ_ST_F64, 0, NULL, &f64));
    CHECK_OK(kvq_st_writer_add(w, "empty", KVQ_ST_F32, 2, s0, NULL));
    CHECK_STATUS(kvq_st_writer_add(w, "ids", KVQ_ST_I32, 1, s4, i32), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_st_writer_add(w, "", KVQ_ST_I32, 1, s4, i32), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_st_writer_add(w, "__metadata__", KVQ_ST_I32, 1, s4, i32), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_st_writer_add(w, "q", KVQ_ST_DTYPE_COUNT, 1, s4, i32), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_st_writer_add(w, "q", KVQ_ST_I32, 1, s4, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_OK(kvq_st_writer_set_metadata(w, "format", "kvq"));
    CHECK_OK(kvq_st_writer_write(w, path, NULL));
    kvq_error err;
    CHECK_STATUS(kvq_st_writer_write(w, "/nonexistent-dir/x.safetensors", &err), KVQ_ERR_IO);
    kvq_st_writer_free(w);

    kvq_st_file *f = NULL;
    CHECK_OK(kvq_st_open(path, &f, &err));
    if (f) {
        CHECK(kvq_st_count(f) == 7);
        CHECK(strcmp(kvq_st_metadata(f, "format"), "kvq") == 0);
        const struct kvq_st_tensor *t = kvq_st_find(f, "x.f32");
        CHECK(t && kvq_st_expect(t, KVQ_ST_F32, 2, s23, NULL) == KVQ_OK && memcmp(t->data, f32, 24) == 0);
        CHECK(((uintptr_t)t->data & 3) == 0); /* header padding keeps f32 aligned */
        float out[6];
        t = kvq_st_find(f, "x.f16");
        CHECK_OK(kvq_st_to_f32(t, out, 3));
        for (int i = 0; i < 3; i++)
            CHECK(out[i] == f32[i]);
        t = kvq_st_find(f, "x.bf16");
        CHECK_OK(kvq_st_to_f32(t, out, 3));
        for (int i = 0; i < 3; i++)
            CHECK(out[i] == f32[i]); /* these values are exact in bf16 */
        CHECK_STATUS(kvq_st_to_f32(t, out, 2), KVQ_ERR_INVALID_ARG);
        int64_t iv[4];
        t = kvq_st_find(f, "ids");
        CHECK_OK(kvq_st_to_i64(t, iv, 4));
        for (int i = 0; i < 4; i++)
            CHECK(iv[i] == i32[i]);
        t = kvq_st_find(f, "big");
        CHECK_OK(kvq_st_to_i64(t, iv, 2));
        CHECK(iv[0] == -5 && iv[1] == 1ll << 40);
        CHECK_STATUS(kvq_st_to_i64(kvq_st_find(f, "x.f32"), iv, 6), KVQ_ERR_INVALID_ARG);
        t = kvq_st_find(f, "scalar");
        CHECK(t && t->n_dims == 0 && t->n_elements == 1);
        CHECK_OK(kvq_st_to_f32(t, out, 1));
        CHECK(out[0] == 0.125f);
        t = kvq_st_find(f, "empty");
        CHECK(t && t->n_elements == 0 && t->nbytes == 0 && t->shape[1] == 7);
        kvq_st_close(f);
    }
    remove(path);
    rmdir(dir);
}

/* Builds "len8 | header | data" in buf; @return its size. */
static size_t image(uint8_t *buf, const char *header, size_t data_bytes, uint64_t len_override)
{
    size_t h = strlen(header);
    uint64_t len = len_override ? len_override : h;
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)(len >> (8 * i));
    memcpy(buf + 8, header, h);
    memset(buf + 8 + h, 0x3c, data_bytes);
    return 8 + h + data_bytes;
}

struct bad_case {
    const char *header;
    size_t data;
    uint64_t len; /* 0: the header's real length */
    kvq_status want;
    const char *msg;
};

static void test_corrupt_headers(void)
{
    static const struct bad_case cases[] = {
        {"{}", 0, 1, KVQ_ERR_FORMAT, "too small"},
        {"{}", 0, 1000, KVQ_ERR_FORMAT, "runs past the end"},
        {"{}", 0, 0xffffffffffffffffull, KVQ_ERR_FORMAT, "exceeds"},
        {"[1, 2]", 0, 0, KVQ_ERR_FORMAT, "does not start with '{'"},
        {"{\"a\": ", 0, 0, KVQ_ERR_FORMAT, "not a valid JSON object"},
        {"{} x", 0, 0, KVQ_ERR_FORMAT, "unexpected bytes after"},
        {"{\"a\": 3}", 0, 0, KVQ_ERR_FORMAT, "not an object"},
        {"{\"\": {\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, 0, KVQ_ERR_FORMAT, "empty name"},
        {"{\"a\": {\"shape\":[1],\"data_offsets\":[0,4]}}", 4, 0, KVQ_ERR_FORMAT, "no dtype"},
        {"{\"a\": {\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, 0, KVQ_ERR_UNSUPPORTED,
         "unsupported dtype 'F8_E4M3'"},
        {"{\"a\": {\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, 0, KVQ_ERR_FORMAT, "no shape"},
        {"{\"a\": {\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, 0, KVQ_ERR_FORMAT,
         "not a non-negative integer"},
        {"{\"a\": {\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, 0, KVQ_ERR_FORMAT,
         "not a non-negative integer"},
        {"{\"a\": {\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4, 0, KVQ_ERR_FORMAT,
         "not a non-negative integer"},
        {"{\"a\": {\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, 0,
         KVQ_ERR_UNSUPPORTED, "9 dimensions"},
        {"{\"a\": {\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4, 0,
         KVQ_ERR_FORMAT, "too large"},
        {"{\"a\": {\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,4]}}", 4, 0, KVQ_ERR_FORMAT,
         "not a non-negative integer"},
        {"{\"a\": {\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, 0, KVQ_ERR_FORMAT,
         "not a pair"},
        {"{\"a\": {\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}", 4, 0, KVQ_ERR_FORMAT,
         "not a pair"},
        {"{\"a\": {\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, 0, KVQ_ERR_FORMAT, "reversed"},
        {"{\"a\": {\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, 0, KVQ_ERR_FORMAT,
         "truncated"},
        {"{\"a\": {\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, 0, KVQ_ERR_FORMAT,
         "need 8"},
        {"{\"a\": {\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\": {\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8, 0, KVQ_ERR_FORMAT, "overlaps"},
        {"{\"a\": {\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, 0, KVQ_ERR_FORMAT,
         "unused bytes before"},
        {"{\"a\": {\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 6, 0, KVQ_ERR_FORMAT,
         "after the last tensor"},
        {"{\"a\": {\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\": {\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8, 0, KVQ_ERR_FORMAT, "appears twice"},
        {"{\"__metadata__\": 5}", 0, 0, KVQ_ERR_FORMAT, "__metadata__ is not an object"},
    };
    uint8_t buf[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = image(buf, cases[i].header, cases[i].data, cases[i].len);
        kvq_st_file *f = NULL;
        kvq_error err = {0};
        kvq_status st = kvq_st_open_memory(buf, n, &f, &err);
        CHECKF(st == cases[i].want && f == NULL, "case %zu (%s): status %d", i, cases[i].header, (int)st);
        CHECKF(strstr(err.msg, cases[i].msg) != NULL, "case %zu: message '%s' lacks '%s'", i, err.msg,
               cases[i].msg);
        kvq_st_close(f);
    }
    /* And the valid neighbours of those cases parse. */
    const char *good = "{\"__metadata__\":{\"k\":\"v\"},\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[4,8]},"
                       "\"a\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[0,4]},"
                       "\"z\":{\"dtype\":\"BOOL\",\"shape\":[0],\"data_offsets\":[8,8]}}   ";
    size_t n = image(buf, good, 8, 0);
    kvq_st_file *f = NULL;
    kvq_error err = {0};
    CHECKF(kvq_st_open_memory(buf, n, &f, &err) == KVQ_OK, "%s", err.msg);
    CHECK(kvq_st_count(f) == 3 && kvq_st_find(f, "b") && kvq_st_find(f, "b")->offset == 4);
    CHECK(kvq_st_tensor_at(f, 0) == kvq_st_find(f, "a"));
    kvq_st_close(f);
    CHECK_STATUS(kvq_st_open_memory(buf, 5, &f, &err), KVQ_ERR_FORMAT);
    CHECK(strstr(err.msg, "too short") != NULL);
}

/* Every truncation of a real file is refused (the data must end exactly
 * where the header says). */
static void test_truncations(void)
{
    size_t len;
    char *buf = test_read_file(TEST_REF_DIR "/reference.safetensors", &len);
    CHECK(buf != NULL);
    if (!buf)
        return;
    kvq_st_file *f = NULL;
    CHECK_OK(kvq_st_open_memory(buf, len, &f, NULL));
    kvq_st_close(f);
    int refused = 0, tried = 0;
    for (size_t cut = 0; cut < len; cut += (cut < 4096 ? 1 : 997)) {
        f = NULL;
        kvq_status st = kvq_st_open_memory(buf, cut, &f, NULL);
        refused += st == KVQ_ERR_FORMAT && f == NULL;
        tried++;
        kvq_st_close(f);
    }
    CHECKF(refused == tried, "%d of %d truncations refused", refused, tried);
    free(buf);
}

int main(void)
{
    RUN(test_reference_file);
    RUN(test_model_shard);
    RUN(test_open_errors);
    RUN(test_write_read);
    RUN(test_corrupt_headers);
    RUN(test_truncations);
    return TEST_END("test_safetensors");
}
