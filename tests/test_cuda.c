/* test_cuda.c - the GPU path against the CPU library, where one call per
 * case does not tell (tests/test_backend_ops.c compares every GPU encoder
 * and attention kernel with the CPU references, case by case: op "encode",
 * backend cuda; op "attend", backends cuda, cuda-fused and cuda-ref):
 *  - attention calls queued back to back without synchronising, CUDA-graph
 *    capture and replay, the fused kernel refused where it does not apply;
 *  - attention on the real keys/values/queries of the fixture model
 *    (encoded on the GPU), on a long context with a flat tail, after
 *    truncation and re-append, and next to a non-finite query (relative
 *    error <= 1e-3 against the CPU's dequantize-then-attend reference);
 *  - page copies, truncation, pool accounting and every error path.
 * Without a GPU (CI) the GPU tests skip with a message and one test checks
 * that the API reports KVQ_ERR_NO_DEVICE cleanly.
 * KVQ_CUDA_TEST_SMALL=1 shrinks the sizes (for compute-sanitizer runs). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq_attn.h"
#include "kvq_cache.h"
#include "kvq_cuda.h"
#include "kvq_safetensors.h"
#include "test.h"
#include "test_data.h"

#define TOL 1e-3

static int have_gpu(void)
{
    return kvq_cuda_device_count() > 0;
}

#define REQUIRE_GPU()                                                                        \
    do {                                                                                     \
        if (!have_gpu())                                                                     \
            SKIP("no CUDA device (kvq_cuda_device_count() == 0): GPU test not run");         \
    } while (0)

static int small_mode(void)
{
    const char *s = getenv("KVQ_CUDA_TEST_SMALL");
    return s && s[0] == '1';
}

/* Both caches share one config; the GPU one holds max_seqs sequences. */
static struct kvq_cache_config cache_cfg(enum kvq_type tk, enum kvq_type tv, int H, int d, size_t max_tokens,
                                         int page_tokens, uint64_t seed, enum kvq_rot_kind rot)
{
    struct kvq_cache_config cfg;
    kvq_cache_config_default(&cfg, H, d, max_tokens);
    cfg.type_k = tk;
    cfg.type_v = tv;
    cfg.page_tokens = page_tokens;
    cfg.seed = seed;
    cfg.rot = rot;
    return cfg;
}

static kvq_cuda_cache *gpu_cache_checked(const struct kvq_cache_config *cc, int max_seqs, int max_q, int check)
{
    struct kvq_cuda_cache_config cfg;
    kvq_cuda_cache_config_default(&cfg, cc->n_kv_heads, cc->head_dim, cc->max_tokens, max_seqs);
    cfg.cache = *cc;
    cfg.max_q_per_kv = max_q;
    cfg.check_input = check;
    kvq_cuda_cache *g = NULL;
    kvq_status st = kvq_cuda_cache_create(&cfg, &g);
    CHECKF(st == KVQ_OK, "kvq_cuda_cache_create: %s", kvq_status_str(st));
    return g;
}

static kvq_cuda_cache *gpu_cache(const struct kvq_cache_config *cc, int max_seqs, int max_q)
{
    return gpu_cache_checked(cc, max_seqs, max_q, 1);
}

static const char *tname(enum kvq_type t)
{
    return kvq_type_traits(t)->name;
}

/* Byte-compares every row of tokens [0, n) of seq with the CPU cache.
 * @return the number of differing rows (first few are printed). */
static int compare_rows(const kvq_cache *cpu, const kvq_cuda_cache *gpu, int seq, size_t n)
{
    const struct kvq_page_layout *L = kvq_cache_layout(cpu);
    const size_t P = L->page_tokens;
    uint8_t *buf = malloc(L->page_bytes);
    int bad = 0;
    for (size_t i = 0; i * P < n; i++) {
        kvq_status st = kvq_cuda_cache_read_page(gpu, seq, i, buf);
        CHECK_OK(st);
        if (st != KVQ_OK) {
            bad++;
            break;
        }
        uint8_t *cp = (uint8_t *)(uintptr_t)kvq_cache_page(cpu, i);
        for (uint32_t h = 0; h < L->n_kv_heads; h++)
            for (int kv = 0; kv < 2; kv++) {
                const struct kvq_head_layout *hl = kv ? &L->v : &L->k;
                size_t off = (kv ? L->v_off : L->k_off) + (size_t)h * hl->bytes;
                struct kvq_row_fields f = kvq_layout_row_fields((int)hl->type, (int)hl->dim);
                for (uint32_t s = 0; s < P && i * P + s < n; s++) {
                    struct kvq_row a = kvq_head_row(hl, buf + off, s), b = kvq_head_row(hl, cp + off, s);
                    int diff = memcmp(a.codes, b.codes, f.codes) != 0;
                    if (f.norm)
                        diff |= memcmp(a.norm, b.norm, 2) != 0;
                    if (f.rnorm)
                        diff |= memcmp(a.rnorm, b.rnorm, 2) != 0;
                    if (f.signs)
                        diff |= memcmp(a.signs, b.signs, f.signs) != 0;
                    if (diff && bad++ < 3)
                        fprintf(stderr, "  row differs: seq %d token %zu head %u %s\n", seq, i * P + s, h,
                                kv ? "V" : "K");
                }
            }
    }
    free(buf);
    return bad;
}

/* ---- encode -------------------------------------------------------------- */

static void test_encode_errors(void)
{
    REQUIRE_GPU();
    const int H = 2, d = 128;
    struct kvq_cache_config cc = cache_cfg(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, H, d, 64, 16, 7, KVQ_ROT_HADAMARD);
    struct kvq_cuda_cache_config cfg;
    kvq_cuda_cache_config_default(&cfg, H, d, 64, 2);
    cfg.cache = cc;
    cfg.pool_pages = 5;
    kvq_cuda_cache *g = NULL;
    CHECK_OK(kvq_cuda_cache_create(&cfg, &g));
    float *x = test_outlier_rows(80 * (size_t)H, d, 5, 1.0);
    float *xd = test_to_dev(x, 80 * (size_t)H * d);
    if (!g || !xd)
        goto done;
    /* NaN, Inf and an f16-overflowing norm: refused, nothing changes */
    float *bad = malloc(5 * (size_t)H * d * sizeof(float));
    memcpy(bad, x, 5 * (size_t)H * d * sizeof(float));
    bad[3 * H * d + 7] = NAN;
    float *bd = test_to_dev(bad, 5 * (size_t)H * d);
    CHECK_STATUS(kvq_cuda_cache_append(g, 0, 5, bd, xd), KVQ_ERR_NONFINITE);
    CHECK_STATUS(kvq_cuda_cache_append(g, 0, 5, xd, bd), KVQ_ERR_NONFINITE);
    bad[3 * H * d + 7] = INFINITY;
    CHECK_OK(kvq_cuda_memcpy_h2d(bd, bad, 5 * (size_t)H * d * sizeof(float)));
    CHECK_STATUS(kvq_cuda_cache_append(g, 0, 5, bd, xd), KVQ_ERR_NONFINITE);
    for (int j = 0; j < d; j++)
        bad[3 * H * d + j] = 1.0e4f;
    CHECK_OK(kvq_cuda_memcpy_h2d(bd, bad, 5 * (size_t)H * d * sizeof(float)));
    CHECK_STATUS(kvq_cuda_cache_append(g, 0, 5, bd, xd), KVQ_ERR_RANGE);
    CHECK(kvq_cuda_cache_len(g, 0) == 0);
    CHECK(kvq_cuda_cache_free_pages(g) == 5);
    /* nor are the refused call's good rows written where they would have
     * gone into a page the sequence already holds (slots past its end): the
     * encoder reads the check's verdict on the device */
    const size_t pb = kvq_cuda_cache_layout(g)->page_bytes;
    uint8_t *pages = malloc(2 * pb);
    CHECK_OK(kvq_cuda_cache_append(g, 0, 3, xd, xd));
    CHECK_OK(kvq_cuda_cache_read_page(g, 0, 0, pages));
    CHECK_STATUS(kvq_cuda_cache_append(g, 0, 5, bd, xd), KVQ_ERR_RANGE);
    CHECK_OK(kvq_cuda_cache_read_page(g, 0, 0, pages + pb));
    CHECK(memcmp(pages, pages + pb, pb) == 0);
    CHECK(kvq_cuda_cache_len(g, 0) == 3 && kvq_cuda_cache_free_pages(g) == 4);
    CHECK_OK(kvq_cuda_cache_truncate(g, 0, 0));
    free(pages);
    kvq_cuda_free(bd);
    free(bad);
    /* limits: context (64 tokens) and pool (5 pages of 16) */
    CHECK_STATUS(kvq_cuda_cache_append(g, 0, 65, xd, xd), KVQ_ERR_CONTEXT_FULL);
    CHECK_OK(kvq_cuda_cache_append(g, 0, 64, xd, xd));
    CHECK_STATUS(kvq_cuda_cache_append(g, 0, 1, xd, xd), KVQ_ERR_CONTEXT_FULL);
    CHECK_OK(kvq_cuda_cache_append(g, 1, 16, xd, xd));
    CHECK_STATUS(kvq_cuda_cache_append(g, 1, 1, xd, xd), KVQ_ERR_BUDGET);
    CHECK(kvq_cuda_cache_len(g, 1) == 16);
    CHECK_OK(kvq_cuda_cache_truncate(g, 0, 20)); /* frees 2 pages */
    CHECK(kvq_cuda_cache_free_pages(g) == 2);
    CHECK_OK(kvq_cuda_cache_append(g, 1, 17, xd, xd));
    CHECK_STATUS(kvq_cuda_cache_truncate(g, 0, 21), KVQ_ERR_INVALID_ARG);
    /* bad arguments */
    CHECK_STATUS(kvq_cuda_cache_append(g, 2, 1, xd, xd), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_cuda_cache_append(g, -1, 1, xd, xd), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_cuda_cache_append(g, 0, 1, NULL, xd), KVQ_ERR_INVALID_ARG);
    int dup[2] = {0, 0};
    CHECK_STATUS(kvq_cuda_cache_append_batch(g, 2, dup, xd, xd), KVQ_ERR_INVALID_ARG);
    uint8_t page[16];
    CHECK_STATUS(kvq_cuda_cache_read_page(g, 0, 99, page), KVQ_ERR_INVALID_ARG);
done:
    kvq_cuda_free(xd);
    free(x);
    kvq_cuda_cache_free(g);
    /* configs the GPU encoder cannot reproduce are refused, not approximated */
    struct kvq_cache_config c2 = cache_cfg(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 1, 128, 64, 16, 1, KVQ_ROT_DCT);
    kvq_cuda_cache *g2 = gpu_cache(&c2, 1, 8);
    float *z = NULL;
    CHECK_OK(kvq_cuda_malloc((void **)&z, 128 * sizeof(float)));
    if (g2 && z)
        CHECK_STATUS(kvq_cuda_cache_append(g2, 0, 1, z, z), KVQ_ERR_UNSUPPORTED);
    kvq_cuda_cache_free(g2);
    kvq_cuda_free(z);
}

/* ---- attention ----------------------------------------------------------- */

struct attn_case {
    enum kvq_type tk, tv;
    int d, G, page_tokens;
    enum kvq_rot_kind rot;
};

/* CPU reference for one sequence: out[Hq][d]. */
static void cpu_attend(const kvq_cache *c, size_t n_ctx, const float *q, int H, int G, int d, float scale, float *out)
{
    kvq_attn_workspace *ws = NULL;
    CHECK_OK(kvq_attn_workspace_create(d, G, n_ctx, &ws));
    for (int h = 0; h < H; h++)
        CHECK_OK(kvq_attn_decode_ref(c, h, n_ctx, q + (size_t)h * G * d, G, scale, out + (size_t)h * G * d, ws));
    kvq_attn_workspace_free(ws);
}

/* Runs kernel kind on the GPU and compares every (sequence, KV head) with ref. */
static double gpu_vs(kvq_cuda_cache *g, int n_seqs, const int *seqs, const float *qd, int Hq, float scale,
                     const float *ref, enum kvq_cuda_kernel kern, const char *what)
{
    const int d = kvq_cuda_cache_config_of(g)->cache.head_dim, H = kvq_cuda_cache_config_of(g)->cache.n_kv_heads;
    const size_t n = (size_t)n_seqs * Hq * d;
    float *od = NULL, *out = malloc(n * sizeof(float));
    CHECK_OK(kvq_cuda_malloc((void **)&od, n * sizeof(float)));
    CHECK_OK(kvq_cuda_memset(od, 0xff, n * sizeof(float))); /* NaN: unwritten outputs fail */
    struct kvq_cuda_attn_opts o = {kern, 0};
    CHECK_OK(kvq_cuda_cache_attend(g, n_seqs, seqs, qd, Hq, scale, od, &o));
    CHECK_OK(kvq_cuda_synchronize());
    CHECK_OK(kvq_cuda_memcpy_d2h(out, od, n * sizeof(float)));
    double worst = 0.0;
    const int G = Hq / H;
    for (int i = 0; i < n_seqs; i++)
        for (int h = 0; h < H; h++) {
            size_t off = ((size_t)i * Hq + (size_t)h * G) * d;
            double e = test_rel_err(out + off, ref + off, (size_t)G * d);
            worst = e > worst ? e : worst;
            CHECKF(e <= TOL, "%s: entry %d head %d: relative error %.3g > %.0e", what, i, h, e, TOL);
        }
    kvq_cuda_free(od);
    free(out);
    return worst;
}

/* Five calls queued back to back, no synchronisation in between (the fused
 * kernel with two split counts, the reference kernel, then the default
 * twice with different splits; on sm_90 each fused call's launches overlap
 * the call queued before it): they share the query-block and split-partial
 * buffers, which must not race. */
static void back_to_back(kvq_cuda_cache *g, int n_seqs, const int *seqs, const float *qd, int Hq, float scale,
                         const float *ref, const char *what)
{
    const int d = kvq_cuda_cache_config_of(g)->cache.head_dim, H = kvq_cuda_cache_config_of(g)->cache.n_kv_heads;
    const size_t n = (size_t)n_seqs * Hq * d;
    enum { N_CALLS = 5 };
    const struct kvq_cuda_attn_opts o[N_CALLS] = {{KVQ_CUDA_KERNEL_FUSED, 0},
                                                  {KVQ_CUDA_KERNEL_FUSED, 4},
                                                  {KVQ_CUDA_KERNEL_REF, 0},
                                                  {KVQ_CUDA_KERNEL_AUTO, 7},
                                                  {KVQ_CUDA_KERNEL_AUTO, 0}};
    float *od = NULL, *out = malloc(N_CALLS * n * sizeof(float));
    CHECK_OK(kvq_cuda_malloc((void **)&od, N_CALLS * n * sizeof(float)));
    CHECK_OK(kvq_cuda_memset(od, 0xff, N_CALLS * n * sizeof(float)));
    for (int k = 0; k < N_CALLS; k++)
        CHECK_OK(kvq_cuda_cache_attend(g, n_seqs, seqs, qd, Hq, scale, od + k * n, &o[k]));
    CHECK_OK(kvq_cuda_synchronize());
    CHECK_OK(kvq_cuda_memcpy_d2h(out, od, N_CALLS * n * sizeof(float)));
    const int G = Hq / H;
    for (int k = 0; k < N_CALLS; k++)
        for (int i = 0; i < n_seqs; i++)
            for (int h = 0; h < H; h++) {
                const size_t off = ((size_t)i * Hq + (size_t)h * G) * d;
                const double e = test_rel_err(out + k * n + off, ref + off, (size_t)G * d);
                CHECKF(e <= TOL, "%s, back-to-back call %d: entry %d head %d: relative error %.3g > %.0e", what, k, i,
                       h, e, TOL);
            }
    kvq_cuda_free(od);
    free(out);
}

/* The default attend call recorded into a CUDA graph and replayed twice:
 * the same bits as the eager call, and nothing runs at capture time. */
static void graph_replay(kvq_cuda_cache *g, int n_seqs, const int *seqs, const float *qd, int Hq, float scale,
                         const char *what)
{
    const int d = kvq_cuda_cache_config_of(g)->cache.head_dim;
    const size_t n = (size_t)n_seqs * Hq * d;
    float *od = NULL, *eager = malloc(n * sizeof(float)), *replay = malloc(n * sizeof(float));
    CHECK_OK(kvq_cuda_malloc((void **)&od, n * sizeof(float)));
    CHECK_OK(kvq_cuda_cache_attend(g, n_seqs, seqs, qd, Hq, scale, od, NULL));
    CHECK_OK(kvq_cuda_synchronize());
    CHECK_OK(kvq_cuda_memcpy_d2h(eager, od, n * sizeof(float)));
    CHECK_OK(kvq_cuda_memset(od, 0xff, n * sizeof(float)));
    CHECK_OK(kvq_cuda_synchronize());
    kvq_cuda_graph *gr = NULL;
    CHECK_OK(kvq_cuda_graph_begin(g));
    CHECK_STATUS(kvq_cuda_graph_begin(g), KVQ_ERR_INVALID_ARG); /* already capturing */
    /* append synchronises: refused while capturing, and nothing changes */
    const size_t len0 = kvq_cuda_cache_len(g, seqs[0]);
    CHECK_STATUS(kvq_cuda_cache_append(g, seqs[0], 1, qd, qd), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_cuda_cache_append_batch(g, 1, seqs, qd, qd), KVQ_ERR_INVALID_ARG);
    CHECK(kvq_cuda_cache_len(g, seqs[0]) == len0);
    CHECK_OK(kvq_cuda_cache_attend(g, n_seqs, seqs, qd, Hq, scale, od, NULL));
    CHECK_OK(kvq_cuda_graph_end(g, &gr));
    kvq_cuda_graph *none = NULL;
    CHECK_STATUS(kvq_cuda_graph_end(g, &none), KVQ_ERR_INVALID_ARG); /* not capturing */
    CHECK(none == NULL);
    CHECK_OK(kvq_cuda_synchronize());
    CHECK_OK(kvq_cuda_memcpy_d2h(replay, od, n * sizeof(float)));
    CHECKF(memcmp(replay, eager, n * sizeof(float)) != 0, "%s: the capture ran the call", what);
    for (int k = 0; k < 2; k++) {
        CHECK_OK(kvq_cuda_memset(od, 0xff, n * sizeof(float)));
        CHECK_OK(kvq_cuda_graph_launch(gr));
        CHECK_OK(kvq_cuda_synchronize());
        CHECK_OK(kvq_cuda_memcpy_d2h(replay, od, n * sizeof(float)));
        CHECKF(memcmp(replay, eager, n * sizeof(float)) == 0, "%s: graph replay %d differs from the eager call", what,
               k);
    }
    kvq_cuda_graph_free(gr);
    kvq_cuda_graph_free(NULL);
    kvq_cuda_free(od);
    free(eager);
    free(replay);
}

/* One attention case (the configs of test_backend_ops' attend table): a
 * batch of sequences of every length, then the longest again. Where the
 * fused kernel applies: calls queued back to back and a CUDA-graph replay;
 * elsewhere the fused kernel is refused. */
static void attn_case_run(const struct attn_case *ac, uint64_t seed)
{
    const int H = 2, d = ac->d, G = ac->G, Hq = H * G;
    size_t lens_full[] = {1, 77, 600, 3001}, lens_small[] = {1, 77, 300};
    const size_t *lens = small_mode() ? lens_small : lens_full;
    const int n_lens = small_mode() ? 3 : 4;
    const size_t max_len = lens[n_lens - 1];
    struct kvq_cache_config cc = cache_cfg(ac->tk, ac->tv, H, d, max_len, ac->page_tokens, seed, ac->rot);
    kvq_cuda_cache *g = gpu_cache(&cc, n_lens + 1, 8);
    kvq_cache *cpu[5] = {NULL, NULL, NULL, NULL, NULL};
    const float scale = 1.0f / sqrtf((float)d);
    /* batch: every length, then the longest again (a repeated sequence) */
    int seqs[5];
    const int nb = n_lens + 1;
    float *q = test_outlier_rows((size_t)nb * Hq, d, seed + 3, 1.0);
    for (size_t i = 0; i < (size_t)nb * Hq * d; i++)
        q[i] *= 2.0f; /* peaky softmax */
    float *ref = malloc((size_t)nb * Hq * d * sizeof(float));
    float *qd = test_to_dev(q, (size_t)nb * Hq * d);
    if (!g || !qd)
        goto done;
    for (int i = 0; i < n_lens; i++) {
        float *k = test_outlier_rows(lens[i] * H, d, seed + 100 + i, 8.0);
        float *v = test_outlier_rows(lens[i] * H, d, seed + 200 + i, 2.0);
        CHECK_OK(kvq_cache_create(&cc, &cpu[i]));
        CHECK_OK(kvq_cache_append(cpu[i], lens[i], k, v));
        CHECK_OK(kvq_cuda_cache_upload(g, i, cpu[i]));
        seqs[i] = i;
        free(k);
        free(v);
    }
    seqs[n_lens] = n_lens - 1;
    if (kvq_cuda_fast_supported(g, Hq)) {
        for (int i = 0; i < nb; i++)
            cpu_attend(cpu[seqs[i]], lens[seqs[i]], q + (size_t)i * Hq * d, H, G, d, scale, ref + (size_t)i * Hq * d);
        char what[128];
        snprintf(what, sizeof what, "K %s V %s d=%d G=%d P=%d %s", tname(ac->tk), tname(ac->tv), d, G,
                 ac->page_tokens, kvq_rot_kind_name(ac->rot));
        back_to_back(g, nb, seqs, qd, Hq, scale, ref, what);
        graph_replay(g, nb, seqs, qd, Hq, scale, what);
    } else {
        CHECK_STATUS(kvq_cuda_cache_attend(g, nb, seqs, qd, Hq, scale, qd, &(struct kvq_cuda_attn_opts){KVQ_CUDA_KERNEL_FUSED, 0}),
                     KVQ_ERR_UNSUPPORTED);
    }
done:
    for (int i = 0; i < 5; i++)
        kvq_cache_free(cpu[i]);
    kvq_cuda_cache_free(g);
    kvq_cuda_free(qd);
    free(q);
    free(ref);
}

/* Each kernel against the CPU reference, call by call, is test_backend_ops'
 * op "attend" (these configs and more); here what needs several calls. */
static void test_attend_queued(void)
{
    REQUIRE_GPU();
    static const struct attn_case cases[] = {
        {KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 128, 4, 64, KVQ_ROT_HADAMARD},
        {KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 128, 8, 16, KVQ_ROT_HADAMARD},
        {KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 128, 1, 64, KVQ_ROT_DCT},
        {KVQ_TYPE_TQ3, KVQ_TYPE_TQ3, 128, 3, 32, KVQ_ROT_HADAMARD},
        {KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 128, 2, 48, KVQ_ROT_HADAMARD}, /* 16-token stages, G <= 4 */
        {KVQ_TYPE_F16, KVQ_TYPE_F16, 128, 4, 64, KVQ_ROT_HADAMARD},
        {KVQ_TYPE_F16, KVQ_TYPE_F16, 128, 6, 48, KVQ_ROT_HADAMARD},
        {KVQ_TYPE_TQ3J, KVQ_TYPE_F16, 128, 4, 64, KVQ_ROT_HADAMARD},
        {KVQ_TYPE_F16, KVQ_TYPE_TQ3, 128, 2, 64, KVQ_ROT_HADAMARD},
        {KVQ_TYPE_TQ3, KVQ_TYPE_F16, 128, 8, 64, KVQ_ROT_IDENTITY},
        /* the fused kernel does not apply: refused */
        {KVQ_TYPE_Q8_0, KVQ_TYPE_Q4_0, 128, 4, 64, KVQ_ROT_HADAMARD},
        {KVQ_TYPE_TQ4J, KVQ_TYPE_TQ2, 128, 4, 64, KVQ_ROT_HADAMARD},
        {KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 96, 4, 64, KVQ_ROT_HADAMARD},
        {KVQ_TYPE_F32, KVQ_TYPE_F16, 64, 2, 16, KVQ_ROT_HADAMARD},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        attn_case_run(&cases[i], 500 + 31 * i);
}

/* Real keys, values and queries of the fixture model: for a few query
 * positions p, a GPU sequence holding tokens [0, p] (encoded on the GPU)
 * against the CPU reference over the first p + 1 tokens of a CPU cache. */
static void fixture_file(const char *path, enum kvq_type tk, enum kvq_type tv)
{
    kvq_st_file *f = NULL;
    kvq_error err;
    kvq_status st = kvq_st_open(path, &f, &err);
    CHECKF(st == KVQ_OK, "%s: %s", path, err.msg);
    if (st != KVQ_OK)
        return;
    const struct kvq_st_tensor *tk_t = kvq_st_find(f, "k"), *tv_t = kvq_st_find(f, "v"), *tq_t = kvq_st_find(f, "q");
    CHECK(tk_t && tv_t && tq_t && tk_t->n_dims == 4 && tq_t->n_dims == 4);
    if (!tk_t || !tv_t || !tq_t || tk_t->n_dims != 4 || tq_t->n_dims != 4) {
        kvq_st_close(f);
        return;
    }
    const int NL = (int)tk_t->shape[0], H = (int)tk_t->shape[1], T = (int)tk_t->shape[2], d = (int)tk_t->shape[3];
    const int Hq = (int)tq_t->shape[1], NQ = (int)tq_t->shape[2], G = Hq / H;
    float *kall = malloc(tk_t->n_elements * sizeof(float)), *vall = malloc(tv_t->n_elements * sizeof(float));
    float *qall = malloc(tq_t->n_elements * sizeof(float));
    CHECK_OK(kvq_st_to_f32(tk_t, kall, tk_t->n_elements));
    CHECK_OK(kvq_st_to_f32(tv_t, vall, tv_t->n_elements));
    CHECK_OK(kvq_st_to_f32(tq_t, qall, tq_t->n_elements));
    float *k = malloc((size_t)T * H * d * sizeof(float)), *v = malloc((size_t)T * H * d * sizeof(float));
    const int pos_i[3] = {0, NQ / 2, NQ - 1};
    const float scale = 1.0f / sqrtf((float)d);
    for (int layer = 0; layer < NL; layer += small_mode() ? NL : 1) {
        /* [layer][h][t][d] -> [t][h][d] */
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                memcpy(k + ((size_t)t * H + h) * d, kall + (((size_t)layer * H + h) * T + t) * d, d * sizeof(float));
                memcpy(v + ((size_t)t * H + h) * d, vall + (((size_t)layer * H + h) * T + t) * d, d * sizeof(float));
            }
        struct kvq_cache_config cc = cache_cfg(tk, tv, H, d, (size_t)T, 64, 42 + layer, KVQ_ROT_HADAMARD);
        kvq_cache *cpu = NULL;
        CHECK_OK(kvq_cache_create(&cc, &cpu));
        CHECK_OK(kvq_cache_append(cpu, (size_t)T, k, v));
        kvq_cuda_cache *g = gpu_cache(&cc, 3, 8);
        float *kd = test_to_dev(k, (size_t)T * H * d), *vd = test_to_dev(v, (size_t)T * H * d);
        float q[3 * 64 * 128], ref[3 * 64 * 128];
        int seqs[3] = {0, 1, 2};
        if (!cpu || !g || !kd || !vd || Hq * d > 64 * 128)
            goto next;
        for (int i = 0; i < 3; i++) {
            const int p = T - NQ + pos_i[i];
            CHECK_OK(kvq_cuda_cache_append(g, i, (size_t)p + 1, kd, vd));
            for (int hq = 0; hq < Hq; hq++)
                memcpy(q + ((size_t)i * Hq + hq) * d, qall + (((size_t)layer * Hq + hq) * NQ + pos_i[i]) * d,
                       d * sizeof(float));
            cpu_attend(cpu, (size_t)p + 1, q + (size_t)i * Hq * d, H, G, d, scale, ref + (size_t)i * Hq * d);
        }
        CHECK(compare_rows(cpu, g, 2, (size_t)(T - NQ + pos_i[2]) + 1) == 0);
        float *qd = test_to_dev(q, (size_t)3 * Hq * d);
        char what[160];
        snprintf(what, sizeof what, "%s layer %d K %s V %s ref kernel", path, layer, tname(tk), tname(tv));
        double e1 = gpu_vs(g, 3, seqs, qd, Hq, scale, ref, KVQ_CUDA_KERNEL_REF, what);
        snprintf(what, sizeof what, "%s layer %d K %s V %s fused kernel", path, layer, tname(tk), tname(tv));
        double e2 = gpu_vs(g, 3, seqs, qd, Hq, scale, ref, KVQ_CUDA_KERNEL_FUSED, what);
        printf("  %s layer %d K %s V %s: max rel err ref kernel %.2e, fused %.2e\n", path, layer, tname(tk),
               tname(tv), e1, e2);
        kvq_cuda_free(qd);
    next:
        kvq_cuda_free(kd);
        kvq_cuda_free(vd);
        kvq_cuda_cache_free(g);
        kvq_cache_free(cpu);
    }
    free(k), free(v), free(kall), free(vall), free(qall);
    kvq_st_close(f);
}

/* A long context whose attention is a few sharp peaks over a flat tail of
 * many tiny weights: 2^-17 of the peak times the value norm (~11) puts the
 * tail's weights at the bottom of f16's normal range in the fused kernel's
 * value MMA, and below it under the kernel's softmax headroom (2^-3), the
 * case that headroom makes worse (docs/history/attention-cuda.md, tenth
 * pass). */
static void test_attend_long_tail(void)
{
    REQUIRE_GPU();
    const int H = 2, d = 128, G = 4, Hq = H * G;
    const size_t n = small_mode() ? 8192 : 65536;
    struct kvq_cache_config cc = cache_cfg(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, H, d, n, 64, 0x7a11, KVQ_ROT_HADAMARD);
    kvq_cuda_cache *g = gpu_cache(&cc, 1, G);
    kvq_cache *cpu = NULL;
    const float scale = 1.0f / sqrtf((float)d);
    float *q = test_outlier_rows(Hq, d, 0x7a12, 1.0), *k = test_outlier_rows(n * H, d, 0x7a13, 1.0);
    float *v = test_outlier_rows(n * H, d, 0x7a14, 1.0), *ref = malloc((size_t)Hq * d * sizeof(float));
    for (size_t i = 0; i < n * H * d; i++)
        k[i] *= 0.1f; /* a flat tail */
    /* peaks for query 0 of each head, the last one late, so that the running
     * max also grows near the end: score (log2) ~ 17 over the tail */
    const size_t peaks[] = {1000, n / 2 + 17, n - 100};
    for (size_t pi = 0; pi < sizeof peaks / sizeof *peaks; pi++)
        for (int h = 0; h < H; h++) {
            const float *qh = q + (size_t)h * G * d;
            double qq = 0.0;
            for (int j = 0; j < d; j++)
                qq += (double)qh[j] * qh[j];
            const double c = (17.0 + (double)pi) * 0.69314718 / (double)scale / qq;
            for (int j = 0; j < d; j++)
                k[(peaks[pi] * H + (size_t)h) * d + (size_t)j] = (float)(c * qh[j]);
        }
    float *qd = test_to_dev(q, (size_t)Hq * d);
    if (!g || !qd || !ref)
        goto done;
    CHECK_OK(kvq_cache_create(&cc, &cpu));
    CHECK_OK(kvq_cache_append(cpu, n, k, v));
    CHECK_OK(kvq_cuda_cache_upload(g, 0, cpu));
    cpu_attend(cpu, n, q, H, G, d, scale, ref);
    const int seqs[1] = {0};
    char what[96];
    snprintf(what, sizeof what, "long tail, %zu tokens", n);
    const double e_fast = gpu_vs(g, 1, seqs, qd, Hq, scale, ref, KVQ_CUDA_KERNEL_FUSED, what);
    const double e_ref = gpu_vs(g, 1, seqs, qd, Hq, scale, ref, KVQ_CUDA_KERNEL_REF, what);
    printf("  %s: max rel err ref kernel %.2e, fused %.2e\n", what, e_ref, e_fast);
done:
    kvq_cuda_free(qd);
    kvq_cuda_cache_free(g);
    kvq_cache_free(cpu);
    free(q);
    free(k);
    free(v);
    free(ref);
}

static void test_attend_fixture(void)
{
    REQUIRE_GPU();
    fixture_file(TEST_REF_DIR "/kv_text.safetensors", KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3);
    if (small_mode())
        return;
    fixture_file(TEST_REF_DIR "/kv_passkey.safetensors", KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3);
    fixture_file(TEST_REF_DIR "/kv_text.safetensors", KVQ_TYPE_F16, KVQ_TYPE_F16);
}

/* Truncate, re-append, attend over the shorter sequence, pages still equal. */
/* kvq_cuda_cache_attend_prefix: a prefill chunk's queries over growing
 * prefixes (more entries than max_seqs and than one batch of 128) equal the
 * CPU reference at each prefix length, on the fused and the reference
 * kernel, for the second of two sequences; bad lengths are refused. */
static void test_attend_prefix(void)
{
    REQUIRE_GPU();
    const int H = 2, d = 128, G = 4, Hq = H * G;
    const size_t pos0 = 100, T = 150, N = pos0 + T;
    const float scale = 1.0f / sqrtf((float)d);
    struct kvq_cache_config cc = cache_cfg(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, H, d, N, 32, 21, KVQ_ROT_HADAMARD);
    float *k = test_outlier_rows(N * H, d, 81, 4.0), *v = test_outlier_rows(N * H, d, 82, 1.0);
    float *q = test_outlier_rows(T * Hq, d, 83, 2.0);
    float *out = malloc(T * Hq * d * sizeof *out), ref[8 * 128];
    int *seqs = malloc(T * sizeof *seqs);
    size_t *lens = malloc(T * sizeof *lens);
    kvq_cache *cpu = NULL;
    CHECK_OK(kvq_cache_create(&cc, &cpu));
    kvq_cuda_cache *g = gpu_cache(&cc, 2, 4);
    float *kd = test_to_dev(k, N * H * d), *vd = test_to_dev(v, N * H * d), *qd = test_to_dev(q, T * Hq * d);
    float *od = NULL;
    if (!cpu || !g || !kd || !vd || !qd || !out || !seqs || !lens ||
        kvq_cuda_malloc((void **)&od, T * Hq * d * sizeof(float)) != KVQ_OK)
        goto done;
    CHECK_OK(kvq_cache_append(cpu, N, k, v));
    CHECK_OK(kvq_cuda_cache_append(g, 1, N, kd, vd));
    for (size_t t = 0; t < T; t++) {
        seqs[t] = 1;
        lens[t] = pos0 + t + 1;
    }
    const enum kvq_cuda_kernel kernels[2] = {KVQ_CUDA_KERNEL_FUSED, KVQ_CUDA_KERNEL_REF};
    for (int kk = 0; kk < 2; kk++) {
        struct kvq_cuda_attn_opts o = {.kernel = kernels[kk], .n_splits = 0};
        CHECK_OK(kvq_cuda_cache_attend_prefix(g, (int)T, seqs, lens, qd, Hq, scale, od, &o));
        CHECK_OK(kvq_cuda_memcpy_d2h(out, od, T * Hq * d * sizeof *out));
        double worst = 0;
        for (size_t t = 0; t < T; t += 7) {
            cpu_attend(cpu, lens[t], q + t * Hq * d, H, G, d, scale, ref);
            const double e = test_rel_err(out + t * Hq * d, ref, (size_t)Hq * d);
            worst = e > worst ? e : worst;
        }
        CHECKF(worst <= TOL, "attend_prefix (%s): rel err %.3g", kk ? "ref" : "fused", worst);
        printf("  attend_prefix %zu entries over lengths %zu..%zu (%s): worst rel err %.2e\n", T, pos0 + 1, N,
               kk ? "reference" : "fused", worst);
    }
    lens[3] = 0;
    CHECK_STATUS(kvq_cuda_cache_attend_prefix(g, (int)T, seqs, lens, qd, Hq, scale, od, NULL), KVQ_ERR_INVALID_ARG);
    lens[3] = N + 1;
    CHECK_STATUS(kvq_cuda_cache_attend_prefix(g, (int)T, seqs, lens, qd, Hq, scale, od, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_cuda_cache_attend_prefix(g, (int)T, seqs, NULL, qd, Hq, scale, od, NULL), KVQ_ERR_INVALID_ARG);
    lens[3] = 4;
    seqs[0] = 0; /* empty sequence */
    CHECK_STATUS(kvq_cuda_cache_attend_prefix(g, (int)T, seqs, lens, qd, Hq, scale, od, NULL), KVQ_ERR_INVALID_ARG);
done:
    kvq_cuda_free(kd), kvq_cuda_free(vd), kvq_cuda_free(qd), kvq_cuda_free(od);
    kvq_cuda_cache_free(g);
    kvq_cache_free(cpu);
    free(k), free(v), free(q), free(out), free(seqs), free(lens);
}

static void test_truncate_reappend(void)
{
    REQUIRE_GPU();
    const int H = 2, d = 128, G = 4, Hq = H * G;
    const size_t N = 300;
    struct kvq_cache_config cc = cache_cfg(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, H, d, N, 32, 9, KVQ_ROT_HADAMARD);
    float *k = test_outlier_rows(N * H, d, 77, 4.0), *v = test_outlier_rows(N * H, d, 78, 1.0);
    kvq_cache *cpu = NULL;
    CHECK_OK(kvq_cache_create(&cc, &cpu));
    kvq_cuda_cache *g = gpu_cache(&cc, 1, 8);
    float *kd = test_to_dev(k, N * H * d), *vd = test_to_dev(v, N * H * d);
    float *q = test_outlier_rows((size_t)Hq, d, 79, 2.0), ref[8 * 128];
    float *qd = test_to_dev(q, (size_t)Hq * d);
    int seq0 = 0;
    if (!cpu || !g || !kd || !vd || !qd)
        goto done;
    CHECK_OK(kvq_cache_append(cpu, 150, k, v));
    CHECK_OK(kvq_cuda_cache_append(g, 0, 150, kd, vd));
    const size_t before = kvq_cuda_cache_free_pages(g);
    CHECK_OK(kvq_cache_truncate(cpu, 70));
    CHECK_OK(kvq_cuda_cache_truncate(g, 0, 70));
    CHECK(kvq_cuda_cache_free_pages(g) == before + 2); /* 5 pages of 32 -> 3 */
    CHECK_OK(kvq_cache_append(cpu, 100, k + 150 * H * d, v + 150 * H * d));
    CHECK_OK(kvq_cuda_cache_append(g, 0, 100, kd + 150 * H * d, vd + 150 * H * d));
    CHECK(compare_rows(cpu, g, 0, 170) == 0);
    /* a page read back (host order) and written again reaches the device in
     * its device order: the rows and the attention below still match */
    const size_t pb = kvq_cache_layout(cpu)->page_bytes;
    uint8_t *page = malloc(2 * pb);
    CHECK_OK(kvq_cuda_cache_read_page(g, 0, 1, page));
    CHECK(memcmp(page, kvq_cache_page(cpu, 1), pb) == 0);
    CHECK_OK(kvq_cuda_cache_write_page(g, 0, 1, page));
    CHECK_OK(kvq_cuda_cache_read_page(g, 0, 1, page + pb));
    CHECK(memcmp(page, page + pb, pb) == 0);
    free(page);
    CHECK(compare_rows(cpu, g, 0, 170) == 0);
    cpu_attend(cpu, 170, q, H, G, d, 1.0f / sqrtf((float)d), ref);
    gpu_vs(g, 1, &seq0, qd, Hq, 1.0f / sqrtf((float)d), ref, KVQ_CUDA_KERNEL_FUSED, "after truncate");
done:
    kvq_cuda_free(kd), kvq_cuda_free(vd), kvq_cuda_free(qd);
    kvq_cuda_cache_free(g);
    kvq_cache_free(cpu);
    free(k), free(v), free(q);
}

/* A NaN or Inf in one query head reaches that head's output on every
 * kernel (the fixed-point conversion of the integer key scores must not
 * turn it into zeros, nor the guard for "no packed token"), with and
 * without the f16 window and sinks, and leaves the other heads of its KV
 * group as they were. */
static void test_attend_nonfinite_query(void)
{
    REQUIRE_GPU();
    const int H = 2, d = 128, G = 4, Hq = H * G;
    const size_t N = 200;
    const enum kvq_type kt[2] = {KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3};
    for (int ti = 0; ti < 4; ti++)
        for (int bad = 0; bad < 2; bad++) {
            struct kvq_cache_config cc = cache_cfg(kt[ti % 2], KVQ_TYPE_TQ3, H, d, N, 64, 11, KVQ_ROT_HADAMARD);
            cc.recent_f16 = ti >= 2;
            cc.sink_tokens = ti >= 2 ? 4 : 0;
            float *k = test_outlier_rows(N * H, d, 81, 4.0), *v = test_outlier_rows(N * H, d, 82, 1.0);
            float *q = test_outlier_rows((size_t)Hq, d, 83, 2.0), ref[8 * 128], out[8 * 128];
            kvq_cache *cpu = NULL;
            CHECK_OK(kvq_cache_create(&cc, &cpu));
            kvq_cuda_cache *g = gpu_cache(&cc, 1, 8);
            float *kd = test_to_dev(k, N * H * d), *vd = test_to_dev(v, N * H * d), *od = NULL;
            CHECK_OK(kvq_cuda_malloc((void **)&od, sizeof out));
            const int hbad = 5, seq0 = 0; /* KV head 1, its second query */
            if (!cpu || !g || !kd || !vd || !od)
                goto next;
            CHECK_OK(kvq_cache_append(cpu, N, k, v));
            CHECK_OK(kvq_cuda_cache_append(g, 0, N, kd, vd));
            cpu_attend(cpu, N, q, H, G, d, 0.1f, ref);
            q[hbad * d + 17] = bad ? INFINITY : NAN;
            float *qd = test_to_dev(q, (size_t)Hq * d);
            const enum kvq_cuda_kernel kinds[3] = {KVQ_CUDA_KERNEL_AUTO, KVQ_CUDA_KERNEL_REF, KVQ_CUDA_KERNEL_FUSED};
            for (int ki = 0; ki < 3; ki++) {
                const struct kvq_cuda_attn_opts o = {kinds[ki], 0};
                CHECK_OK(kvq_cuda_cache_attend(g, 1, &seq0, qd, Hq, 0.1f, od, &o));
                CHECK_OK(kvq_cuda_synchronize());
                CHECK_OK(kvq_cuda_memcpy_d2h(out, od, sizeof out));
                int finite = 0;
                for (int i = 0; i < d; i++)
                    finite += isfinite(out[hbad * d + i]) != 0;
                CHECKF(finite == 0, "K %s%s, %s query, kernel %d: %d of %d outputs of the head are finite",
                       tname(kt[ti % 2]), ti >= 2 ? " + window, sinks" : "", bad ? "Inf" : "NaN", (int)kinds[ki], finite, d);
                for (int h = 0; h < Hq; h++)
                    if (h != hbad) {
                        const double e = test_rel_err(out + h * d, ref + h * d, (size_t)d);
                        CHECKF(e <= TOL, "K %s, kernel %d: head %d next to a non-finite query: error %.3g",
                               tname(kt[ti % 2]), (int)kinds[ki], h, e);
                    }
            }
            kvq_cuda_free(qd);
        next:
            kvq_cuda_free(kd), kvq_cuda_free(vd), kvq_cuda_free(od);
            kvq_cuda_cache_free(g);
            kvq_cache_free(cpu);
            free(k), free(v), free(q);
        }
}

static void test_attend_bad_args(void)
{
    REQUIRE_GPU();
    struct kvq_cache_config cc = cache_cfg(KVQ_TYPE_Q8_0, KVQ_TYPE_TQ3, 2, 128, 64, 16, 1, KVQ_ROT_HADAMARD);
    kvq_cuda_cache *g = gpu_cache(&cc, 2, 4);
    float *qd = NULL;
    CHECK_OK(kvq_cuda_malloc((void **)&qd, 2 * 8 * 128 * sizeof(float)));
    int s0 = 0, s9 = 9;
    if (!g || !qd)
        goto done;
    CHECK_STATUS(kvq_cuda_cache_attend(g, 1, &s0, qd, 8, 0.1f, qd, NULL), KVQ_ERR_INVALID_ARG); /* empty seq */
    kvq_cache *cpu = NULL;
    float *k = test_outlier_rows(10 * 2, 128, 1, 1.0);
    CHECK_OK(kvq_cache_create(&cc, &cpu));
    CHECK_OK(kvq_cache_append(cpu, 10, k, k));
    CHECK_OK(kvq_cuda_cache_upload(g, 0, cpu)); /* q8_0: host-encoded pages work */
    CHECK(kvq_cuda_cache_len(g, 0) == 10);
    CHECK_STATUS(kvq_cuda_cache_attend(g, 1, &s9, qd, 8, 0.1f, qd, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_cuda_cache_attend(g, 1, &s0, qd, 7, 0.1f, qd, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_cuda_cache_attend(g, 1, &s0, qd, 10, 0.1f, qd, NULL), KVQ_ERR_INVALID_ARG); /* G > 4 */
    CHECK_STATUS(kvq_cuda_cache_attend(g, 3, (int[]){0, 0, 0}, qd, 8, 0.1f, qd, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_cuda_cache_attend(g, 1, &s0, NULL, 8, 0.1f, qd, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_cuda_cache_attend(g, 1, &s0, qd, 8, NAN, qd, NULL), KVQ_ERR_INVALID_ARG);
    struct kvq_cuda_attn_opts fused = {KVQ_CUDA_KERNEL_FUSED, 0};
    CHECK(!kvq_cuda_fast_supported(g, 8));
    CHECK_STATUS(kvq_cuda_cache_attend(g, 1, &s0, qd, 8, 0.1f, qd + 8 * 128, &fused), KVQ_ERR_UNSUPPORTED);
    /* kernel values outside the enum, including those of the retired
     * versions (3..6), are refused */
    const int bad_kernels[4] = {-1, 3, 6, 7};
    for (int i = 0; i < 4; i++) {
        const struct kvq_cuda_attn_opts bad = {(enum kvq_cuda_kernel)bad_kernels[i], 0};
        CHECK_STATUS(kvq_cuda_cache_attend(g, 1, &s0, qd, 8, 0.1f, qd + 8 * 128, &bad), KVQ_ERR_INVALID_ARG);
    }
    CHECK_OK(kvq_cuda_cache_attend(g, 1, &s0, qd, 8, 0.1f, qd + 8 * 128, NULL)); /* AUTO -> reference */
    CHECK_OK(kvq_cuda_synchronize());
    /* a host cache with f16 override rows cannot be mirrored */
    struct kvq_cache_config cw = cc;
    cw.recent_f16 = 1;
    kvq_cache *cpuw = NULL;
    CHECK_OK(kvq_cache_create(&cw, &cpuw));
    CHECK_OK(kvq_cache_append(cpuw, 10, k, k));
    CHECK_STATUS(kvq_cuda_cache_upload(g, 1, cpuw), KVQ_ERR_UNSUPPORTED);
    CHECK(kvq_cuda_cache_len(g, 1) == 0);
    kvq_cache_free(cpuw);
    /* a mismatched host cache is refused */
    struct kvq_cache_config c2 = cc;
    c2.seed = 2;
    kvq_cache *cpu2 = NULL;
    CHECK_OK(kvq_cache_create(&c2, &cpu2));
    CHECK_STATUS(kvq_cuda_cache_upload(g, 1, cpu2), KVQ_ERR_INVALID_ARG);
    kvq_cache_free(cpu2);
    kvq_cache_free(cpu);
    free(k);
done:
    kvq_cuda_free(qd);
    kvq_cuda_cache_free(g);
}

/* Runs everywhere: a sink count outside 0..KVQ_CACHE_MAX_SINK_TOKENS is
 * refused before the device is looked at (the f16 override rows
 * themselves are checked on the GPU: test_backend_ops -o attend-window). */
static void test_f16_overrides_bad_config(void)
{
    struct kvq_cuda_cache_config cfg;
    kvq_cuda_cache_config_default(&cfg, 2, 128, 256, 1);
    kvq_cuda_cache *g = (kvq_cuda_cache *)&cfg;
    cfg.cache.recent_f16 = 1;
    cfg.cache.sink_tokens = -1;
    CHECK_STATUS(kvq_cuda_cache_create(&cfg, &g), KVQ_ERR_INVALID_ARG);
    CHECK(g == NULL);
    cfg.cache.sink_tokens = KVQ_CACHE_MAX_SINK_TOKENS + 1;
    CHECK_STATUS(kvq_cuda_cache_create(&cfg, &g), KVQ_ERR_INVALID_ARG);
    CHECK(g == NULL);
}

/* Every type is a device cache's K or V: created with a device (and its
 * rows GPU-encoded), refused without one, as every config is. */
static void test_every_type(void)
{
    const int dev = kvq_cuda_device_count() > 0;
    for (int t = 0; t < KVQ_TYPE_COUNT; t++)
        for (int side = 0; side < 2; side++) {
            struct kvq_cuda_cache_config cfg;
            kvq_cuda_cache_config_default(&cfg, 2, 128, 256, 1);
            if (side)
                cfg.cache.type_v = (enum kvq_type)t;
            else
                cfg.cache.type_k = (enum kvq_type)t;
            kvq_cuda_cache *g = (kvq_cuda_cache *)&cfg;
            const kvq_status st = kvq_cuda_cache_create(&cfg, &g);
            CHECKF(st == (dev ? KVQ_OK : KVQ_ERR_NO_DEVICE), "%s as %s: %s", kvq_type_traits((enum kvq_type)t)->name,
                   side ? "V" : "K", kvq_status_str(st));
            CHECK(dev ? g != NULL && kvq_cuda_cache_gpu_encodes(g) : g == NULL);
            kvq_cuda_cache_free(g);
        }
}

/* Runs everywhere: without a GPU the API must say so, not crash. */
static void test_no_device_contract(void)
{
    if (have_gpu()) {
        char name[256];
        CHECK_OK(kvq_cuda_device_describe(name, sizeof name));
        printf("  device: %s\n", name);
        /* the benchmarks' read helper is bench-only code: bench_cuda checks
         * it (under memcheck: KVQ_BENCH_CHECK_ONLY=1, bench/run_cuda.sh) */
        return;
    }
    struct kvq_cuda_cache_config cfg;
    kvq_cuda_cache_config_default(&cfg, 8, 128, 4096, 4);
    kvq_cuda_cache *g = (kvq_cuda_cache *)&cfg; /* must be reset to NULL */
    CHECK_STATUS(kvq_cuda_cache_create(&cfg, &g), KVQ_ERR_NO_DEVICE);
    CHECK(g == NULL);
    void *p = (void *)&cfg;
    CHECK_STATUS(kvq_cuda_malloc(&p, 16), KVQ_ERR_NO_DEVICE);
    CHECK(p == NULL);
    char name[64];
    CHECK_STATUS(kvq_cuda_device_describe(name, sizeof name), KVQ_ERR_NO_DEVICE);
    CHECK_STATUS(kvq_cuda_synchronize(), KVQ_ERR_NO_DEVICE);
    kvq_cuda_cache_free(NULL);
    printf("  no CUDA device here: GPU tests skipped (they run on a machine with a GPU)\n");
}

int main(void)
{
    RUN(test_no_device_contract);
    RUN(test_f16_overrides_bad_config);
    RUN(test_every_type);
    RUN(test_encode_errors);
    RUN(test_truncate_reappend);
    RUN(test_attend_prefix);
    RUN(test_attend_bad_args);
    RUN(test_attend_nonfinite_query);
    RUN(test_attend_queued);
    RUN(test_attend_fixture);
    RUN(test_attend_long_tail);
    return TEST_END("test_cuda");
}
