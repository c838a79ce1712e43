/* test_decoder_spec.c - n-gram speculative decoding gives exactly the greedy
 * output of plain decoding (f32 and compressed caches), accepts drafts on
 * repetitive text, and keeps the cache consistent after rollbacks: the
 * recent-token window keeps every token of the partly filled page in f16
 * after every step, as plain decoding does. */
#include <stdint.h>

#include "kvq_cache.h"
#include "kvq_model.h"
#include "kvq_safetensors.h"
#include "test.h"
#include "test_util.h"

static kvq_model *model;
static kvq_st_file *ref;

static int32_t *ref_ids(const char *name, size_t *n)
{
    char key[64];
    snprintf(key, sizeof key, "%s.ids", name);
    return test_st_ints(ref, key, n);
}

/* Called with every token emitted: counts the layers whose window has lost
 * the f16 copy of a token of the partly filled page (a rollback past the
 * ring's rows: such tokens would be read packed, unlike plain decoding). */
struct window_watch {
    const kvq_seq *s;
    size_t steps, lost;
};

static int watch_window(void *user, int32_t id)
{
    (void)id;
    struct window_watch *w = user;
    w->steps++;
    for (int l = 0; l < kvq_model_config_of(model)->n_layers; l++) {
        const kvq_cache *c = kvq_seq_cache(w->s, l);
        const struct kvq_cache_config *cc = kvq_cache_config_of(c);
        if (!cc || !cc->recent_f16)
            continue;
        const size_t P = (size_t)(cc->page_tokens ? cc->page_tokens : KVQ_DEFAULT_PAGE_TOKENS), n = kvq_cache_len(c);
        size_t se, tail;
        if (kvq_cache_f16_view(c, n, &se, &tail) != KVQ_OK || tail != n - n % P)
            w->lost++;
    }
    return 0;
}

/* Generates n tokens with speculative = spec; returns the stats. */
static struct kvq_seq_stats gen(kvq_seq *s, const int32_t *ids, size_t n_ids, int spec, int32_t *out, size_t n,
                                size_t *n_out)
{
    struct window_watch w = {s, 0, 0};
    struct kvq_gen_params gp;
    kvq_gen_params_default(&gp);
    gp.max_tokens = (int)n;
    gp.speculative = spec;
    gp.stop_at_eos = 0;
    kvq_seq_reset(s);
    CHECK_OK(kvq_seq_generate(s, ids, n_ids, &gp, out, n, n_out, watch_window, &w));
    CHECKF(w.steps == *n_out && w.lost == 0, "speculative %d: the window lost rows %zu times in %zu steps", spec,
           w.lost, w.steps);
    struct kvq_seq_stats st;
    kvq_seq_get_stats(s, &st);
    return st;
}

static void check_identity(enum kvq_type tk, enum kvq_type tv, const char *name, size_t n_prompt_max, int spec)
{
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.type_k = tk;
    sc.type_v = tv;
    kvq_seq *s = NULL;
    CHECK_OK(kvq_seq_create(model, &sc, &s, NULL));
    size_t n_ids;
    int32_t *ids = ref_ids(name, &n_ids);
    if (!s || !ids)
        goto out;
    if (n_ids > n_prompt_max)
        n_ids = n_prompt_max;
    enum { N = 96 };
    int32_t plain[N], fast[N];
    size_t np, nf;
    struct kvq_seq_stats a = gen(s, ids, n_ids, 0, plain, N, &np);
    size_t pos_plain = kvq_seq_pos(s);
    struct kvq_seq_stats b = gen(s, ids, n_ids, spec, fast, N, &nf);
    CHECK(np == N && nf == N);
    int first_diff = -1;
    for (int i = 0; i < N && first_diff < 0; i++)
        if (plain[i] != fast[i])
            first_diff = i;
    CHECKF(first_diff < 0, "%s %s/%s: speculative output differs at token %d", name, kvq_type_traits(tk)->name,
           kvq_type_traits(tv)->name, first_diff);
    CHECK(kvq_seq_pos(s) == pos_plain); /* rollbacks left exactly the plain cache length */
    CHECK(a.decode_forwards == N - 1 && a.drafted == 0);
    CHECK(b.decode_forwards + b.accepted == N - 1);
    printf("  %-8s %s/%s: %zu forwards plain, %zu speculative (%zu of %zu drafts accepted, %.2f tokens/forward)\n",
           name, kvq_type_traits(tk)->name, kvq_type_traits(tv)->name, a.decode_forwards, b.decode_forwards,
           b.accepted, b.drafted, (double)(b.decode_forwards + b.accepted) / (double)b.decode_forwards);
out:
    free(ids);
    kvq_seq_free(s);
}

static void test_identity_f32(void)
{
    check_identity(KVQ_TYPE_F32, KVQ_TYPE_F32, "prose", 1 << 20, 4);
    check_identity(KVQ_TYPE_F32, KVQ_TYPE_F32, "code", 1 << 20, 8);
    check_identity(KVQ_TYPE_F32, KVQ_TYPE_F32, "valid_1", 1 << 20, 4);
}

static void test_identity_compressed(void)
{
    check_identity(KVQ_DEFAULT_TYPE_K, KVQ_DEFAULT_TYPE_V, "code", 1 << 20, 4);
    check_identity(KVQ_TYPE_Q8_0, KVQ_TYPE_Q8_0, "valid_2", 400, 6);
    check_identity(KVQ_DEFAULT_TYPE_K, KVQ_DEFAULT_TYPE_V, "passkey_1k", 600, KVQ_MAX_DRAFT);
}

/* On the passkey filler (a repeated sentence) the drafts are right almost
 * always: the speedup in forwards must show. */
static void test_drafts_accepted(void)
{
    kvq_seq *s = NULL;
    CHECK_OK(kvq_seq_create(model, NULL, &s, NULL));
    size_t n_ids;
    int32_t *ids = ref_ids("passkey_1k", &n_ids);
    if (!s || !ids)
        goto out;
    /* Stop inside the filler, so the continuation is more filler. */
    int32_t out[64];
    size_t n;
    struct kvq_seq_stats st = gen(s, ids, 300, 8, out, 64, &n);
    CHECK(n == 64);
    CHECKF(st.decode_forwards * 2 < 63, "%zu forwards for 64 tokens", st.decode_forwards);
out:
    free(ids);
    kvq_seq_free(s);
}

/* Sampling: top_k = 1 at any temperature is greedy (plain and speculative);
 * a seed fixes the sampled text; speculative sampling draws valid tokens. */
static void test_sampling(void)
{
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.seed = 1234;
    kvq_seq *s = NULL;
    CHECK_OK(kvq_seq_create(model, &sc, &s, NULL));
    size_t n_ids;
    int32_t *ids = ref_ids("prose", &n_ids);
    if (!s || !ids)
        goto out;
    enum { N = 32 };
    int32_t greedy[N], a[N], b[N];
    size_t n;
    gen(s, ids, n_ids, 0, greedy, N, &n);
    struct kvq_gen_params gp;
    kvq_gen_params_default(&gp);
    gp.max_tokens = N;
    gp.stop_at_eos = 0;
    gp.temperature = 0.8f;
    gp.top_k = 1;
    for (int spec = 0; spec <= 4; spec += 4) {
        gp.speculative = spec;
        kvq_seq_reset(s);
        CHECK_OK(kvq_seq_generate(s, ids, n_ids, &gp, a, N, &n, NULL, NULL));
        CHECK(n == N && memcmp(a, greedy, sizeof a) == 0);
    }
    gp.top_k = 40;
    gp.top_p = 0.9f;
    gp.temperature = 1.0f;
    for (int spec = 0; spec <= 4; spec += 4) {
        gp.speculative = spec;
        kvq_seq_reset(s);
        CHECK_OK(kvq_seq_generate(s, ids, n_ids, &gp, a, N, &n, NULL, NULL));
        CHECK(n == N);
        kvq_seq_reset(s); /* the same seed draws the same tokens */
        CHECK_OK(kvq_seq_generate(s, ids, n_ids, &gp, b, N, &n, NULL, NULL));
        CHECK(n == N && memcmp(a, b, sizeof a) == 0);
        CHECK(memcmp(a, greedy, sizeof a) != 0); /* T = 1 over 40 tokens: not the greedy path */
        for (int i = 0; i < N; i++)
            CHECK(a[i] >= 0 && a[i] < kvq_model_config_of(model)->vocab);
    }
out:
    free(ids);
    kvq_seq_free(s);
}

int main(void)
{
    kvq_error err = {0};
    if (kvq_model_load(TEST_MODEL_DIR, NULL, &model, &err) != KVQ_OK ||
        kvq_st_open(TEST_REF_DIR "/reference.safetensors", &ref, &err) != KVQ_OK) {
        fprintf(stderr, "test_decoder_spec: %s\n", err.msg);
        return 1;
    }
    RUN(test_identity_f32);
    RUN(test_identity_compressed);
    RUN(test_drafts_accepted);
    RUN(test_sampling);
    kvq_model_free(model);
    kvq_st_close(ref);
    return TEST_END("test_decoder_spec");
}
