/* test_decoder_weights.c - bf16 weights stay bf16 in memory (issue 20).
 *
 * The bundled model is a bf16 checkpoint. Loaded as it is, its matrices
 * stay memory-mapped and the kernels widen them as they read; loaded with
 * weights_f32 they are widened once into an f32 arena (the former layout).
 * Widening is exact, so decode steps (the few-row kernel) must give
 * bit-identical logits, and prefill chunks (sgemm over widened tiles vs the
 * whole f32 matrix) logits equal to sgemm rounding; the mapped model must
 * hold about half the weight bytes and keep less resident. The thread
 * count (kvq_set_threads) does not change a single logit.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kvq_model.h"
#include "test.h"
#include "test_util.h"

#define T_PROMPT 40

struct run {
    float prefill[T_PROMPT][4096];
    float decode[4][4096];
    struct kvq_model_info info;
    size_t resident;
};

static void run_model(int f32, int max_chunk, struct run *r)
{
    size_t before = test_rss_now();
    struct kvq_model_load_opts o;
    kvq_model_load_opts_default(&o);
    o.weights_f32 = f32;
    kvq_model *m = NULL;
    kvq_seq *s = NULL;
    kvq_error err = {0};
    CHECKF(kvq_model_load(TEST_MODEL_DIR, &o, &m, &err) == KVQ_OK, "%s", err.msg);
    if (!m)
        return;
    CHECK(kvq_model_config_of(m)->vocab == 4096);
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.type_k = sc.type_v = KVQ_TYPE_F32;
    sc.max_ctx = 128;
    sc.max_chunk = max_chunk;
    CHECK_OK(kvq_seq_create(m, &sc, &s, &err));
    int32_t ids[T_PROMPT];
    for (int i = 0; i < T_PROMPT; i++)
        ids[i] = i == 0 ? 1 : (int32_t)(100 + 37 * i % 3900);
    if (s) {
        CHECK_OK(kvq_seq_forward(s, ids, T_PROMPT, 0, &r->prefill[0][0], NULL));
        kvq_seq_reset(s); /* decode from scratch: every step through the few-row kernel */
        for (int i = 0; i < 4; i++)
            CHECK_OK(kvq_seq_forward(s, &ids[i], 1, 0, r->decode[i], NULL));
    }
    r->resident = test_rss_now() - before;
    kvq_model_get_info(m, &r->info);
    kvq_seq_free(s);
    kvq_model_free(m);
}

static void test_bf16_in_memory(void)
{
    static struct run mapped, wide;
    run_model(0, 0, &mapped);
    run_model(1, 0, &wide);
    CHECKF(memcmp(mapped.decode, wide.decode, sizeof mapped.decode) == 0,
           "decode logits differ between bf16-in-memory and widened-f32 weights");
    double worst = 0, mx = 0;
    for (int t = 0; t < T_PROMPT; t++)
        for (int v = 0; v < 4096; v++) {
            worst = fmax(worst, fabs((double)mapped.prefill[t][v] - wide.prefill[t][v]));
            mx = fmax(mx, fabs((double)wide.prefill[t][v]));
        }
    CHECKF(worst <= 1e-5 * mx, "prefill logits differ by %.3g (max |logit| %.3g)", worst, mx);
    /* matrices at 2 bytes instead of 4: about half, norms (f32 in both) aside */
    CHECKF(mapped.info.weight_bytes * 10 < wide.info.weight_bytes * 6, "weight bytes %zu (mapped) vs %zu (f32)",
           mapped.info.weight_bytes, wide.info.weight_bytes);
    printf("  weights %.1f MiB bf16 mapped vs %.1f MiB widened; resident after load + 44 tokens %.1f vs %.1f MiB\n",
           mapped.info.weight_bytes / 1048576.0, wide.info.weight_bytes / 1048576.0, mapped.resident / 1048576.0,
           wide.resident / 1048576.0);
    CHECKF(mapped.resident + wide.info.weight_bytes / 3 < wide.resident, "resident %zu (mapped) vs %zu (f32)",
           mapped.resident, wide.resident);
}

static double rel_diff(const struct run *a, const struct run *b)
{
    double worst = 0, mx = 0;
    for (int t = 0; t < T_PROMPT; t++)
        for (int v = 0; v < 4096; v++) {
            worst = fmax(worst, fabs((double)a->prefill[t][v] - b->prefill[t][v]));
            mx = fmax(mx, fabs((double)a->prefill[t][v]));
        }
    return worst / mx;
}

/* --threads. Chunks of 16 rows run through the few-row kernel (row ranges
 * over the pool) and attend the KV heads in parallel: the same logits, bit
 * for bit, on 1, 2 and 3 threads. Chunks of 40 rows go through OpenBLAS,
 * whose sgemm sums differently with its thread count: equal to rounding. */
static void test_threads_invariant(void)
{
    static struct run one, two, three;
    int before = kvq_threads();
    for (int chunk = 16; chunk <= 256; chunk += 240) {
        CHECK(kvq_set_threads(1) == 1);
        run_model(0, chunk, &one);
        CHECK(kvq_set_threads(2) == 2);
        run_model(0, chunk, &two);
        CHECK(kvq_set_threads(3) == 3);
        run_model(0, chunk, &three);
        CHECK(memcmp(one.decode, two.decode, sizeof one.decode) == 0 &&
              memcmp(one.decode, three.decode, sizeof one.decode) == 0);
        if (chunk == 16)
            CHECK(memcmp(one.prefill, two.prefill, sizeof one.prefill) == 0 &&
                  memcmp(one.prefill, three.prefill, sizeof one.prefill) == 0);
        else
            CHECKF(rel_diff(&one, &two) < 1e-5 && rel_diff(&one, &three) < 1e-5, "%.3g %.3g", rel_diff(&one, &two),
                   rel_diff(&one, &three));
    }
    kvq_set_threads(before);
}

int main(void)
{
    RUN(test_bf16_in_memory);
    RUN(test_threads_invariant);
    return TEST_END("test_decoder_weights");
}
