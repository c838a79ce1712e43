/* test_decoder_shard.c - `kvq shard` output loads and computes what the
 * plain directory computes; every manifest violation and every kind of bad
 * weight file is refused with its own message. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvq_manifest.h"
#include "kvq_model.h"
#include "kvq_safetensors.h"
#include "test.h"
#include "test_util.h"

static char tmp[64];   /* scratch directory for this run */
static char shard[96]; /* the sharded model */
static char *meta;     /* its runtime_meta.json text */
static size_t meta_len;

/* Greedy tokens and the last-position logits of a short prompt. */
static void run_model(kvq_model *m, int32_t *greedy, float *logits)
{
    static const int32_t ids[] = {1, 3843, 3783, 333, 3778, 330, 3797, 3941, 3707, 327, 3986};
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.type_k = sc.type_v = KVQ_TYPE_F32;
    kvq_seq *s = NULL;
    CHECK_OK(kvq_seq_create(m, &sc, &s, NULL));
    if (!s)
        return;
    CHECK_OK(kvq_seq_forward(s, ids, 11, 10, logits, NULL));
    kvq_seq_reset(s);
    struct kvq_gen_params gp;
    kvq_gen_params_default(&gp);
    gp.max_tokens = 8;
    size_t n;
    CHECK_OK(kvq_seq_generate(s, ids, 11, &gp, greedy, 8, &n, NULL, NULL));
    CHECK(n == 8);
    kvq_seq_free(s);
}

static void test_shard_roundtrip(void)
{
    struct kvq_shard_opts o = {5.0, 3, 0}; /* ~4.7 MB per bf16 layer: one layer per shard */
    kvq_error err = {0};
    CHECKF(kvq_shard_write(TEST_MODEL_DIR, shard, &o, &err) == KVQ_OK, "%s", err.msg);
    char p[160];
    snprintf(p, sizeof p, "%s/%s", shard, KVQ_MANIFEST_FILE);
    meta = test_read_file(p, &meta_len);
    CHECK(meta != NULL);
    struct kvq_manifest man;
    CHECK_OK(kvq_manifest_parse(meta, meta_len, &man, &err));
    int n_layers = 0, n_lm = 0, n_embed = 0;
    for (size_t i = 0; i < man.n_shards; i++) {
        n_layers += man.shards[i].kind == KVQ_SHARD_LAYERS;
        n_lm += man.shards[i].kind == KVQ_SHARD_LM_HEAD;
        n_embed += man.shards[i].kind == KVQ_SHARD_EMBED;
    }
    CHECK(n_layers == 4 && n_lm == 3 && n_embed == 1 && man.dtype == KVQ_ST_BF16 && man.vocab == 4096);
    kvq_manifest_clear(&man);

    kvq_model *plain = NULL, *sh = NULL;
    CHECK_OK(kvq_model_load(TEST_MODEL_DIR, NULL, &plain, &err));
    CHECKF(kvq_model_load(shard, NULL, &sh, &err) == KVQ_OK, "%s", err.msg);
    if (plain && sh) {
        struct kvq_model_info a, b;
        kvq_model_get_info(plain, &a);
        kvq_model_get_info(sh, &b);
        CHECK(!a.sharded && b.sharded && b.n_lm_slices == 3 && b.n_files == 8);
        int32_t g1[8], g2[8];
        float *l1 = malloc(4096 * sizeof *l1), *l2 = malloc(4096 * sizeof *l2);
        run_model(plain, g1, l1);
        run_model(sh, g2, l2);
        CHECK(memcmp(g1, g2, sizeof g1) == 0);
        double d = 0, mx = 0;
        for (int i = 0; i < 4096; i++) {
            d = fmax(d, fabs((double)l1[i] - l2[i]));
            mx = fmax(mx, fabs(l1[i]));
        }
        CHECKF(d <= 1e-6 * mx, "sharded logits differ by %.3g", d);
        free(l1);
        free(l2);
    }
    kvq_model_free(plain);
    kvq_model_free(sh);

    /* The plan agrees with what was written. */
    size_t bytes[4];
    struct kvq_model_config cfg;
    CHECK_OK(kvq_shard_measure(TEST_MODEL_DIR, &cfg, bytes, 4, &err));
    CHECK(bytes[0] == kvq_model_config_layer_params(&cfg) * 2); /* bf16 */
    int groups[4];
    CHECK(kvq_shard_plan_groups(bytes, 4, 5.0, groups) == 4);
    CHECK(kvq_shard_plan_groups(bytes, 4, 10.0, groups) == 2 && groups[1] == 2);
    CHECK(kvq_shard_plan_groups(bytes, 4, 1000.0, groups) == 1);
    CHECK(kvq_shard_plan_groups(bytes, 4, 1.0, groups) == 4); /* a layer over the limit still gets a shard */
}

/* Mixture-of-experts checkpoints (tests/models: Qwen2-MoE's experts per
 * expert with a shared expert, OLMoE's fused) shard like dense ones: the
 * sharded model gives the plain directory's logits at every prompt position
 * bit for bit, and its plan counts each layer's experts. */
static void test_shard_moe(void)
{
    static const char *const fams[] = {"qwen2_moe", "olmoe"};
    for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++) {
        char src[128], out[128];
        snprintf(src, sizeof src, "tests/models/%s", fams[f]);
        snprintf(out, sizeof out, "%s/moe-%s", tmp, fams[f]);
        struct kvq_shard_opts o = {0.1, 1, 0}; /* ~0.15 MB a layer: one layer a shard */
        kvq_error err = {0};
        CHECKF(kvq_shard_write(src, out, &o, &err) == KVQ_OK, "%s: %s", fams[f], err.msg);
        kvq_model *m[2] = {NULL, NULL};
        CHECK_OK(kvq_model_load(src, NULL, &m[0], &err));
        CHECKF(kvq_model_load(out, NULL, &m[1], &err) == KVQ_OK, "%s: %s", fams[f], err.msg);
        const struct kvq_model_config *c = m[0] ? kvq_model_config_of(m[0]) : NULL;
        if (m[0] && m[1] && c) {
            struct kvq_model_info a, b;
            kvq_model_get_info(m[0], &a);
            kvq_model_get_info(m[1], &b);
            CHECKF(b.sharded && b.expert_bytes == a.expert_bytes && b.weight_bytes == a.weight_bytes,
                   "%s: expert bytes %zu vs %zu", fams[f], b.expert_bytes, a.expert_bytes);
            enum { T = 24 };
            int32_t ids[T];
            for (int i = 0; i < T; i++)
                ids[i] = (int32_t)((1 + 37 * i) % c->vocab);
            float *lg[2];
            for (int i = 0; i < 2; i++) {
                lg[i] = malloc((size_t)T * c->vocab * sizeof *lg[i]);
                struct kvq_seq_config sc;
                kvq_seq_config_default(&sc);
                sc.type_k = sc.type_v = KVQ_TYPE_F32;
                kvq_seq *s = NULL;
                CHECK_OK(kvq_seq_create(m[i], &sc, &s, NULL));
                if (s && lg[i])
                    CHECK_OK(kvq_seq_forward(s, ids, T, 0, lg[i], NULL));
                kvq_seq_free(s);
            }
            if (lg[0] && lg[1])
                CHECKF(memcmp(lg[0], lg[1], (size_t)T * c->vocab * sizeof(float)) == 0,
                       "%s: the sharded model's logits differ", fams[f]);
            free(lg[0]);
            free(lg[1]);
            size_t bytes[8];
            struct kvq_model_config cfg;
            CHECK_OK(kvq_shard_measure(src, &cfg, bytes, 8, &err));
            for (int l = 0; l < cfg.n_layers && l < 8; l++)
                CHECKF(bytes[l] == kvq_model_config_layer_params_at(&cfg, l) * 2, "%s: layer %d measured %zu bytes",
                       fams[f], l, bytes[l]); /* bf16 */
        }
        kvq_model_free(m[0]);
        kvq_model_free(m[1]);
        test_rm_dir(out);
    }
}

/* Applies one edit to the manifest JSON, loads, restores. */
typedef void (*edit_fn)(cJSON *root);

static cJSON *shard_entry(cJSON *root, const char *kind, int nth)
{
    cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "shards"))
    {
        if (strcmp(cJSON_GetObjectItem(e, "kind")->valuestring, kind) == 0 && nth-- == 0)
            return e;
    }
    return NULL;
}

static void set_range(cJSON *e, const char *key, int b, int en)
{
    cJSON *r = cJSON_GetObjectItem(e, key);
    cJSON_SetNumberValue(r->child, b);
    cJSON_SetNumberValue(r->child->next, en);
}

static void e_gap(cJSON *r) { cJSON_DeleteItemFromArray(cJSON_GetObjectItem(r, "shards"), 2); } /* layer 1 */
static void e_overlap(cJSON *r) { set_range(shard_entry(r, "layers", 0), "layers", 0, 2); }
static void e_short(cJSON *r) { set_range(shard_entry(r, "layers", 3), "layers", 3, 3); }
static void e_long(cJSON *r) { set_range(shard_entry(r, "layers", 3), "layers", 3, 5); }
static void e_lm_start(cJSON *r) { set_range(shard_entry(r, "lm_head", 0), "vocab", 1, 1365); }
static void e_lm_gap(cJSON *r) { set_range(shard_entry(r, "lm_head", 1), "vocab", 1366, 2730); }
static void e_lm_end(cJSON *r) { set_range(shard_entry(r, "lm_head", 2), "vocab", 2730, 4000); }
static void e_lm_shape(cJSON *r)
{
    set_range(shard_entry(r, "lm_head", 0), "vocab", 0, 1000);
    set_range(shard_entry(r, "lm_head", 1), "vocab", 1000, 2730);
}
static void e_missing(cJSON *r)
{
    cJSON_SetValuestring(cJSON_GetObjectItem(shard_entry(r, "layers", 2), "file"), "nope.safetensors");
}
static void e_size(cJSON *r) { cJSON_SetNumberValue(cJSON_GetObjectItem(shard_entry(r, "lm_head", 1), "bytes"), 12); }
static void e_checksum(cJSON *r)
{
    cJSON_SetValuestring(cJSON_GetObjectItem(shard_entry(r, "layers", 1), "fnv1a64"), "0123456789abcdef");
}
static void e_dims(cJSON *r) { cJSON_SetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "dims"), "ffn"), 2048); }
static void e_dtype(cJSON *r) { cJSON_SetValuestring(cJSON_GetObjectItem(r, "dtype"), "F16"); }
static void e_version(cJSON *r) { cJSON_SetNumberValue(cJSON_GetObjectItem(r, "format_version"), 2); }
static void e_two_embeds(cJSON *r) { cJSON_SetValuestring(cJSON_GetObjectItem(shard_entry(r, "layers", 0), "kind"), "embed"); }
static void e_dup_file(cJSON *r)
{
    cJSON_SetValuestring(cJSON_GetObjectItem(shard_entry(r, "lm_head", 2), "file"),
                         cJSON_GetObjectItem(shard_entry(r, "lm_head", 1), "file")->valuestring);
}
static void e_empty(cJSON *r) { set_range(shard_entry(r, "layers", 1), "layers", 1, 1); }
static void e_escape(cJSON *r) { cJSON_SetValuestring(cJSON_GetObjectItem(shard_entry(r, "layers", 0), "file"), "../x"); }
static void e_no_kind(cJSON *r) { cJSON_SetValuestring(cJSON_GetObjectItem(shard_entry(r, "layers", 0), "kind"), "mlp"); }

static void test_manifest_violations(void)
{
    if (!meta)
        return;
    static const struct {
        edit_fn fn;
        kvq_status want;
        const char *msg;
    } cases[] = {
        {e_gap, KVQ_ERR_FORMAT, "layers [1, 2) are in no shard (gap)"},
        {e_overlap, KVQ_ERR_FORMAT, "overlap"},
        {e_short, KVQ_ERR_FORMAT, "empty range"},
        {e_long, KVQ_ERR_FORMAT, "layer shards end at layer 5, the model has 4 layers"},
        {e_lm_start, KVQ_ERR_FORMAT, "LM-head slices start at vocab 1, not 0"},
        {e_lm_gap, KVQ_ERR_FORMAT, "LM-head slices are not contiguous"},
        {e_lm_end, KVQ_ERR_FORMAT, "LM-head slices end at 4000, vocab_size is 4096"},
        {e_lm_shape, KVQ_ERR_FORMAT, "has shape [1365, 512], expected [1000, 512]"},
        {e_missing, KVQ_ERR_IO, "nope.safetensors: shard file missing"},
        {e_size, KVQ_ERR_FORMAT, "runtime_meta.json declares 12"},
        {e_checksum, KVQ_ERR_FORMAT, "checksum mismatch"},
        {e_dims, KVQ_ERR_FORMAT, "dims.ffn is 2048, config.json says 1024"},
        {e_dtype, KVQ_ERR_FORMAT, "has dtype BF16, the manifest declares F16"},
        {e_version, KVQ_ERR_UNSUPPORTED, "format_version 2 is not supported"},
        {e_two_embeds, KVQ_ERR_FORMAT, "2 embedding shards"},
        {e_dup_file, KVQ_ERR_FORMAT, "is listed twice"},
        {e_empty, KVQ_ERR_FORMAT, "empty range [1, 1)"},
        {e_escape, KVQ_ERR_FORMAT, "no plain 'file' name"},
        {e_no_kind, KVQ_ERR_FORMAT, "has no kind"},
    };
    char path[160];
    snprintf(path, sizeof path, "%s/%s", shard, KVQ_MANIFEST_FILE);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *root = cJSON_Parse(meta);
        cases[i].fn(root);
        char *text = cJSON_Print(root);
        cJSON_Delete(root);
        CHECK(test_write_file(path, text, strlen(text)) == 0);
        free(text);
        kvq_model *m = NULL;
        kvq_error err = {0};
        kvq_status st = kvq_model_load(shard, NULL, &m, &err);
        CHECKF(st == cases[i].want && m == NULL, "case %zu: status %d (%s)", i, (int)st, err.msg);
        CHECKF(strstr(err.msg, cases[i].msg) != NULL, "case %zu: '%s' lacks '%s'", i, err.msg, cases[i].msg);
        kvq_model_free(m);
    }
    CHECK(test_write_file(path, "{\"format\": ", 11) == 0);
    kvq_model *m = NULL;
    kvq_error err = {0};
    CHECK_STATUS(kvq_model_load(shard, NULL, &m, &err), KVQ_ERR_FORMAT);
    CHECK(strstr(err.msg, "not valid JSON") != NULL);
    CHECK(test_write_file(path, meta, meta_len) == 0);
    CHECK_OK(kvq_model_load(shard, NULL, &m, &err)); /* restored: loads again */
    kvq_model_free(m);
}

/* A plain directory with config.json and one model.safetensors holding the
 * real tensors, except that `edit` may drop or replace one. */
static void write_plain(const char *dir, const char *drop, const char *replace, enum kvq_st_dtype rdtype, int rrows)
{
    mkdir(dir, 0777);
    char p[160];
    size_t len;
    char *cfg = test_read_file(TEST_MODEL_DIR "/config.json", &len);
    snprintf(p, sizeof p, "%s/config.json", dir);
    CHECK(cfg && test_write_file(p, cfg, len) == 0);
    free(cfg);
    kvq_st_file *f[2] = {NULL, NULL};
    kvq_st_open(TEST_MODEL_DIR "/model-00001-of-00002.safetensors", &f[0], NULL);
    kvq_st_open(TEST_MODEL_DIR "/model-00002-of-00002.safetensors", &f[1], NULL);
    kvq_st_writer *w = NULL;
    kvq_st_writer_create(&w);
    static int32_t junk[4096 * 512];
    for (int k = 0; k < 2 && f[k]; k++)
        for (size_t i = 0; i < kvq_st_count(f[k]); i++) {
            const struct kvq_st_tensor *t = kvq_st_tensor_at(f[k], i);
            if (drop && strcmp(t->name, drop) == 0)
                continue;
            if (replace && strcmp(t->name, replace) == 0) {
                int64_t shape[2] = {rrows, t->shape[1]};
                kvq_st_writer_add(w, t->name, rdtype, 2, shape, junk);
                continue;
            }
            kvq_st_writer_add(w, t->name, t->dtype, t->n_dims, t->shape, t->data);
        }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK_OK(kvq_st_writer_write(w, p, NULL));
    kvq_st_writer_free(w);
    kvq_st_close(f[0]);
    kvq_st_close(f[1]);
}

static void expect_load_error(const char *dir, kvq_status want, const char *msg)
{
    kvq_model *m = NULL;
    kvq_error err = {0};
    kvq_status st = kvq_model_load(dir, NULL, &m, &err);
    CHECKF(st == want && m == NULL, "%s: status %d (%s)", dir, (int)st, err.msg);
    CHECKF(strstr(err.msg, msg) != NULL, "'%s' lacks '%s'", err.msg, msg);
    kvq_model_free(m);
}

static void test_bad_weights(void)
{
    char dir[96];
    snprintf(dir, sizeof dir, "%s/plain", tmp);
    write_plain(dir, NULL, NULL, KVQ_ST_F32, 0);
    kvq_model *m = NULL;
    CHECK_OK(kvq_model_load(dir, NULL, &m, NULL)); /* the single-file layout loads */
    kvq_model_free(m);

    write_plain(dir, "model.layers.2.mlp.up_proj.weight", NULL, KVQ_ST_F32, 0);
    expect_load_error(dir, KVQ_ERR_FORMAT, "missing tensor 'model.layers.2.mlp.up_proj.weight'");
    write_plain(dir, NULL, "model.layers.1.self_attn.k_proj.weight", KVQ_ST_I32, 256);
    expect_load_error(dir, KVQ_ERR_FORMAT, "'model.layers.1.self_attn.k_proj.weight' has dtype I32");
    write_plain(dir, NULL, "model.layers.0.self_attn.v_proj.weight", KVQ_ST_BF16, 128);
    expect_load_error(dir, KVQ_ERR_FORMAT, "has shape [128, 512], expected [256, 512]");

    /* Truncated weight file. */
    char p[160];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_plain(dir, NULL, NULL, KVQ_ST_F32, 0);
    CHECK(truncate(p, 20000) == 0);
    expect_load_error(dir, KVQ_ERR_FORMAT, "file truncated?");
    CHECK(truncate(p, 4) == 0);
    expect_load_error(dir, KVQ_ERR_FORMAT, "too short");
    remove(p);
    expect_load_error(dir, KVQ_ERR_IO, "no model.safetensors");
    /* A corrupt config. */
    snprintf(p, sizeof p, "%s/config.json", dir);
    const char *bad = "{\"model_type\": \"llama\", \"hidden_size\": 512";
    CHECK(test_write_file(p, bad, strlen(bad)) == 0);
    expect_load_error(dir, KVQ_ERR_FORMAT, "config.json: not valid JSON");
    test_rm_dir(dir);
}

static void test_fnv(void)
{
    /* Published FNV-1a 64 test vectors. */
    CHECK(kvq_fnv1a64("", 0, KVQ_FNV1A64_INIT) == 0xcbf29ce484222325ull);
    CHECK(kvq_fnv1a64("a", 1, KVQ_FNV1A64_INIT) == 0xaf63dc4c8601ec8cull);
    CHECK(kvq_fnv1a64("foobar", 6, KVQ_FNV1A64_INIT) == 0x85944171f73967e8ull);
}

int main(void)
{
    strcpy(tmp, "/tmp/kvq_test_shard_XXXXXX");
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(shard, sizeof shard, "%s/sharded", tmp);
    RUN(test_fnv);
    RUN(test_shard_roundtrip);
    RUN(test_shard_moe);
    RUN(test_manifest_violations);
    RUN(test_bad_weights);
    free(meta);
    test_rm_dir(shard);
    test_rm_dir(tmp);
    return TEST_END("test_decoder_shard");
}
