/* test_layer_spec.c - the per-layer memory spec (kvq_layer_specs) is what
 * the plans and pools are made of: its sums are kvq_seq_plan_of's and
 * kvq_batch's numbers, each against its own computation from the cache
 * types (kvq_type_row_bytes, kvq_cache_bytes_for); windowed layers are
 * marked (no sharing, no deep rollback) where the config windows them; bad
 * configs are refused with one line. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvq_batch.h"
#include "kvq_cache.h"
#include "kvq_model.h"
#include "test.h"

static kvq_model *model;

/* Plain types, no window: every number against the cache's own. */
static void test_plain_types(void)
{
    const struct kvq_model_config *c = kvq_model_config_of(model);
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.type_k = KVQ_TYPE_Q8_0;
    sc.type_v = KVQ_TYPE_Q4_0;
    sc.recent_f16 = 0;
    sc.max_ctx = 1024;
    struct kvq_layer_spec *sp = calloc((size_t)c->n_layers, sizeof *sp);
    kvq_error err = {0};
    CHECKF(kvq_layer_specs(model, &sc, sp, &err) == KVQ_OK, "%s", err.msg);
    struct kvq_cache_config cc;
    kvq_cache_config_default(&cc, c->n_kv_heads, c->head_dim, 1024);
    cc.type_k = KVQ_TYPE_Q8_0;
    cc.type_v = KVQ_TYPE_Q4_0;
    cc.recent_f16 = 0;
    const size_t P = KVQ_DEFAULT_PAGE_TOKENS;
    const size_t row = (kvq_type_row_bytes(KVQ_TYPE_Q8_0, c->head_dim) + kvq_type_row_bytes(KVQ_TYPE_Q4_0, c->head_dim)) *
                       (size_t)c->n_kv_heads;
    size_t tokens = 0, pages = 0;
    for (int l = 0; l < c->n_layers; l++) {
        CHECK(sp[l].kind == KVQ_LAYER_KV_CACHE && sp[l].page_tokens == P && sp[l].token_bytes == row);
        CHECK(sp[l].page_bytes == kvq_cache_bytes_for(&cc, P) - kvq_cache_bytes_for(&cc, 0));
        CHECK(sp[l].state_bytes == 0 && sp[l].fixed_bytes == 0 && !sp[l].recent_f16 && !sp[l].center_k);
        CHECK(sp[l].window == 0 && sp[l].can_rollback && sp[l].can_share);
        tokens += sp[l].token_bytes;
        pages += sp[l].page_bytes;
    }
    struct kvq_seq_plan pl;
    CHECK_OK(kvq_seq_plan_of(model, &sc, &pl));
    CHECK(pl.bytes_per_token == tokens && pl.page_tokens == P && pl.fixed_bytes == 0);
    struct kvq_batch_config bc;
    kvq_batch_config_default(&bc);
    bc.seq = sc;
    bc.max_seqs = 2;
    kvq_batch *b = NULL;
    CHECK_OK(kvq_batch_create(model, &bc, &b, &err));
    struct kvq_batch_stats bs;
    kvq_batch_get_stats(b, &bs);
    CHECK(bs.page_bytes == pages && bs.bytes_per_token == tokens && bs.page_tokens == P && bs.can_share);
    kvq_batch_free(b);
    free(sp);
}

/* The default (tq3j/tq3, window, centred keys, 4 sinks): the f16 buffers
 * are each layer's per-sequence state, summed in the plan's fixed bytes. */
static void test_window_state(void)
{
    const struct kvq_model_config *c = kvq_model_config_of(model);
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.sink_tokens = 4;
    struct kvq_layer_spec *sp = calloc((size_t)c->n_layers, sizeof *sp);
    CHECK_OK(kvq_layer_specs(model, &sc, sp, NULL));
    size_t state = 0;
    for (int l = 0; l < c->n_layers; l++) {
        CHECK(sp[l].recent_f16 && sp[l].state_bytes > 0);
        CHECK(sp[l].center_k == (sp[l].type_k != KVQ_TYPE_F16)); /* a key-outlier layer's keys are f16 */
        state += sp[l].state_bytes;
    }
    struct kvq_seq_plan pl;
    CHECK_OK(kvq_seq_plan_of(model, &sc, &pl));
    CHECK(pl.fixed_bytes == state);
    free(sp);
}

/* Gemma 3 (tests/models/gemma3_text): layers 0 and 2 slide over 8 tokens. */
static void test_windowed_layers(void)
{
    kvq_model *m = NULL;
    kvq_error err = {0};
    CHECKF(kvq_model_load("tests/models/gemma3_text", NULL, &m, &err) == KVQ_OK, "%s", err.msg);
    if (!m)
        return;
    struct kvq_layer_spec sp[4];
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    CHECK(kvq_model_config_of(m)->n_layers == 4);
    CHECK_OK(kvq_layer_specs(m, &sc, sp, &err));
    for (int l = 0; l < 4; l++)
        CHECKF(sp[l].window == (l % 2 ? 0 : 8) && sp[l].can_share == (l % 2) && sp[l].can_rollback == (l % 2),
               "layer %d: window %d", l, sp[l].window);
    kvq_model_free(m);
}

static void test_refusals(void)
{
    struct kvq_layer_spec sp[64];
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    kvq_error err = {0};
    sc.type_k = (enum kvq_type)999;
    CHECK_STATUS(kvq_layer_specs(model, &sc, sp, &err), KVQ_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "cache type") != NULL);
    kvq_seq_config_default(&sc);
    sc.recent_f16 = 0;
    sc.center_k = 1;
    CHECK_STATUS(kvq_layer_specs(model, &sc, sp, &err), KVQ_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "center") != NULL);
    CHECK_STATUS(kvq_layer_specs(NULL, &sc, sp, &err), KVQ_ERR_INVALID_ARG);
}

int main(void)
{
    kvq_error err = {0};
    if (kvq_model_load(TEST_MODEL_DIR, NULL, &model, &err) != KVQ_OK) {
        fprintf(stderr, "test_layer_spec: cannot load %s: %s\n", TEST_MODEL_DIR, err.msg);
        return 1;
    }
    RUN(test_plain_types);
    RUN(test_window_state);
    RUN(test_windowed_layers);
    RUN(test_refusals);
    kvq_model_free(model);
    return TEST_END("test_layer_spec");
}
