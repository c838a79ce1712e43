/* test_cache.c - the paged KV cache: layout, append/read, reset/truncate,
 * all-or-nothing appends, limits and byte accounting. Reads against the
 * codec's reference round trip with the documented seeds (and f32 caches
 * against the input itself): test_backend_ops, op cache. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h" /* kvq_code_set: the stream order */
#include "kvq_cache.h"
#include "kvq_rng.h"
#include "test.h"

/* n rows of d floats: N(0,1) with a few outlier channels, as real keys have. */
static float *random_rows(size_t n, int d, uint64_t seed)
{
    float *x = malloc(n * (size_t)d * sizeof *x);
    kvq_rng rng;
    kvq_rng_init(&rng, seed);
    for (size_t i = 0; i < n * (size_t)d; i++) {
        int j = (int)(i % (size_t)d);
        double s = (j == 3 || j == d / 2 + 1) ? 12.0 : 1.0;
        x[i] = (float)(s * kvq_rng_gauss(&rng));
    }
    return x;
}

static kvq_cache *make_cache(enum kvq_type tk, enum kvq_type tv, int H, int d, size_t max_tokens, uint64_t seed)
{
    struct kvq_cache_config cfg;
    kvq_cache_config_default(&cfg, H, d, max_tokens);
    cfg.type_k = tk;
    cfg.type_v = tv;
    cfg.seed = seed;
    kvq_cache *c = NULL;
    kvq_status st = kvq_cache_create(&cfg, &c);
    CHECKF(st == KVQ_OK, "create %d/%d d=%d: %s", (int)tk, (int)tv, d, kvq_status_str(st));
    return c;
}

static void test_config_and_bad_args(void)
{
    struct kvq_cache_config cfg;
    kvq_cache_config_default(&cfg, 4, 128, 1000);
    CHECK(cfg.type_k == KVQ_TYPE_TQ3J && cfg.type_v == KVQ_TYPE_TQ3);
    CHECK(cfg.page_tokens == KVQ_DEFAULT_PAGE_TOKENS && cfg.rot == KVQ_ROT_HADAMARD && cfg.qjl == KVQ_QJL_ORTHO);
    kvq_cache *c = NULL;
    CHECK_STATUS(kvq_cache_create(NULL, &c), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_cache_create(&cfg, NULL), KVQ_ERR_INVALID_ARG);
    struct kvq_cache_config b = cfg;
    b.n_kv_heads = 0;
    CHECK_STATUS(kvq_cache_create(&b, &c), KVQ_ERR_INVALID_ARG);
    b = cfg;
    b.max_tokens = 0;
    CHECK_STATUS(kvq_cache_create(&b, &c), KVQ_ERR_INVALID_ARG);
    b = cfg;
    b.page_tokens = 24; /* not a multiple of 16 */
    CHECK_STATUS(kvq_cache_create(&b, &c), KVQ_ERR_INVALID_ARG);
    b.page_tokens = 8;
    CHECK_STATUS(kvq_cache_create(&b, &c), KVQ_ERR_INVALID_ARG);
    b.page_tokens = KVQ_MAX_PAGE_TOKENS + 16;
    CHECK_STATUS(kvq_cache_create(&b, &c), KVQ_ERR_INVALID_ARG);
    b = cfg;
    b.type_k = (enum kvq_type)99;
    CHECK_STATUS(kvq_cache_create(&b, &c), KVQ_ERR_INVALID_ARG);
    b = cfg;
    b.rot = KVQ_ROT_GAUSS; /* not orthogonal: no codebook density */
    CHECK_STATUS(kvq_cache_create(&b, &c), KVQ_ERR_INVALID_ARG);
    b = cfg;
    b.head_dim = 100; /* tq needs whole bytes of codes: d % 8 */
    CHECK_STATUS(kvq_cache_create(&b, &c), KVQ_ERR_UNSUPPORTED);
    b = cfg;
    b.type_k = KVQ_TYPE_Q8_0;
    b.head_dim = 80; /* q8_0 needs d % 32 */
    CHECK_STATUS(kvq_cache_create(&b, &c), KVQ_ERR_UNSUPPORTED);
    b.head_dim = 2048;
    CHECK_STATUS(kvq_cache_create(&b, &c), KVQ_ERR_UNSUPPORTED);
    CHECK(c == NULL);
    kvq_cache_free(NULL);
    CHECK(kvq_cache_bytes_for(NULL, 10) == 0);
    CHECK(kvq_cache_bytes_for(&b, 10) == 0);
    /* f32 and f16 accept any d in range, e.g. 100 */
    c = make_cache(KVQ_TYPE_F32, KVQ_TYPE_F16, 1, 100, 10, 0);
    kvq_cache_free(c);

    c = make_cache(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 2, 64, 100, 1);
    float *x = random_rows(2, 64, 5);
    float out[64];
    CHECK_STATUS(kvq_cache_append(NULL, 1, x, x), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_cache_append(c, 1, NULL, x), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_cache_append(c, 1, x, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_OK(kvq_cache_append(c, 0, NULL, NULL));
    CHECK(kvq_cache_len(c) == 0 && kvq_cache_page_count(c) == 0);
    CHECK_OK(kvq_cache_append(c, 1, x, x));
    CHECK_STATUS(kvq_cache_read(c, 2, 0, 1, out, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_cache_read(c, -1, 0, 1, out, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_cache_read(c, 0, 0, 2, out, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_cache_read(c, 0, 1, 1, out, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_cache_read(c, 0, SIZE_MAX, 2, out, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_cache_read(NULL, 0, 0, 1, out, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_OK(kvq_cache_read(c, 0, 1, 0, out, out)); /* empty range at the end */
    CHECK_OK(kvq_cache_read(c, 1, 0, 1, NULL, NULL));
    CHECK_STATUS(kvq_cache_truncate(c, 2), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_cache_truncate(NULL, 0), KVQ_ERR_INVALID_ARG);
    CHECK(kvq_cache_page(c, 1) == NULL && kvq_cache_page(c, 0) != NULL);
    CHECK(kvq_cache_len(NULL) == 0 && kvq_cache_config_of(NULL) == NULL && kvq_cache_codec_k(NULL) == NULL);
    free(x);
    kvq_cache_free(c);
}

/* Every section starts on a 16-byte boundary and a page is exactly the rows it holds. */
static void test_layout(void)
{
    const int dims[] = {64, 80, 96, 128, 256};
    const int ptoks[] = {16, 48, 64, 256};
    for (int t = 0; t < KVQ_TYPE_COUNT; t++)
        for (size_t di = 0; di < sizeof dims / sizeof *dims; di++)
            for (size_t pi = 0; pi < sizeof ptoks / sizeof *ptoks; pi++) {
                struct kvq_head_layout hl;
                int d = dims[di], P = ptoks[pi];
                size_t rb = kvq_type_row_bytes((enum kvq_type)t, d);
                int rc = kvq_head_layout_init(&hl, t, d, P);
                CHECK((rc == 0) == (rb != 0));
                if (rc)
                    continue;
                CHECK(hl.bytes == (uint32_t)(rb * (size_t)P));
                CHECK(hl.bytes % KVQ_PAGE_ALIGN == 0 && hl.codes_off % KVQ_PAGE_ALIGN == 0);
                CHECK(hl.norm_off == KVQ_NO_SECTION || hl.norm_off % KVQ_PAGE_ALIGN == 0);
                CHECK(hl.rnorm_off == KVQ_NO_SECTION || hl.rnorm_off % KVQ_PAGE_ALIGN == 0);
                CHECK(hl.signs_off == KVQ_NO_SECTION || hl.signs_off % KVQ_PAGE_ALIGN == 0);
            }
    struct kvq_page_layout pl;
    CHECK(kvq_page_layout_init(&pl, 8, 128, KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 64) == 0);
    CHECK(pl.k.bytes == 64 * 68 && pl.v.bytes == 64 * 50 && pl.v_off == 8u * 64 * 68);
    CHECK(pl.page_bytes == 64u * 8 * 118);
    CHECK(kvq_page_layout_init(&pl, 8, 128, KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 40) != 0);
}

/* The CUDA cache's device order of 3-bit codes (kvq_layout.h), checked
 * against words built straight from its definition: code 8k + i in nibble i
 * of word k, bit k of code 24 + i in that nibble's bit 3. */
static void test_dev_code_order(void)
{
    const int dims[] = {32, 80, 128, 256};
    kvq_rng rng;
    kvq_rng_init(&rng, 77);
    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
        const int d = dims[di], nb = d * 3 / 8;
        for (int rep = 0; rep < 20; rep++) {
            unsigned code[256];
            uint8_t stream[96] = {0}, row[96];
            for (int j = 0; j < d; j++) {
                code[j] = (unsigned)(kvq_rng_next(&rng) % 8u);
                kvq_code_set(stream, 3, j, code[j]);
            }
            memcpy(row, stream, (size_t)nb);
            kvq_dev_order_row(row, d, 1);
            for (int g = 0; g + 32 <= d; g += 32)
                for (int k = 0; k < 3; k++) {
                    uint32_t want = 0, got = 0;
                    for (int i = 0; i < 8; i++)
                        want |= (code[g + 8 * k + i] | ((code[g + 24 + i] >> k) & 1u) << 3) << (4 * i);
                    for (int y = 0; y < 4; y++)
                        got |= (uint32_t)row[(g / 32) * 12 + 4 * k + y] << (8 * y);
                    CHECKF(got == want, "d=%d group %d word %d: %08x, want %08x", d, g / 32, k, got, want);
                }
            /* a trailing part-group keeps the stream order */
            for (int i = 3 * (d & ~31) / 8; i < nb; i++)
                CHECK(row[i] == stream[i]);
            for (int j = 0; j < d; j++)
                CHECK(kvq_dev_code_get(row, d, j) == code[j]);
            kvq_dev_order_row(row, d, 0);
            CHECK(memcmp(row, stream, (size_t)nb) == 0);
        }
        for (int j = 0; j < d; j++)
            for (int b = 0; b < 3; b++) {
                int bit = -1;
                const uint32_t pos = kvq_dev_bitpos(d, j, b);
                CHECK(pos < 3u * (uint32_t)d);
                CHECK(kvq_dev_bitsrc(d, pos, &bit) == j && bit == b);
            }
    }
    CHECK(kvq_dev_order(KVQ_TYPE_TQ3) && kvq_dev_order(KVQ_TYPE_TQ3J));
    CHECK(!kvq_dev_order(KVQ_TYPE_TQ4) && !kvq_dev_order(KVQ_TYPE_TQ2J) && !kvq_dev_order(KVQ_TYPE_F16));
}

/* Marks the n bytes at p in the ownership map of a page; @return how many
 * were already marked. */
static size_t mark(uint8_t *owned, const uint8_t *page, const uint8_t *p, size_t n)
{
    size_t again = 0;
    for (size_t i = 0; i < n; i++)
        again += owned[(size_t)(p - page) + i]++ != 0;
    return again;
}

/* The CUDA cache's device page layout (kvq_layout.h): the rows of all heads
 * and tokens own every byte of a page exactly once, a group holds the K rows
 * then the V rows of G consecutive tokens, sections stay 16-byte aligned, and
 * at d = 128 a tq3j/tq3 group is the fused kernel's 32-token stage
 * (cuda_attn_fast.cu, stage_layout: norm 0, rnorm 64, codes 128, signs 1664,
 * V at 2176: norm, codes at +64; 3776 bytes). */
static void test_dev_page_layout(void)
{
    const int types[][2] = {{KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3}, {KVQ_TYPE_TQ3, KVQ_TYPE_TQ3},
                            {KVQ_TYPE_F16, KVQ_TYPE_TQ3}, {KVQ_TYPE_TQ4J, KVQ_TYPE_F32},
                            {KVQ_TYPE_Q8_0, KVQ_TYPE_Q4_0}};
    const int ptoks[] = {16, 48, 64, 256};
    const int dims[] = {64, 128};
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t pi = 0; pi < sizeof ptoks / sizeof *ptoks; pi++)
            for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
                const int H = 3, P = ptoks[pi], d = dims[di];
                struct kvq_page_layout pl;
                struct kvq_dev_layout dl;
                if (kvq_page_layout_init(&pl, H, d, types[ti][0], types[ti][1], P) != 0 ||
                    kvq_dev_layout_init(&dl, &pl) != 0) {
                    CHECKF(0, "types %d/%d P=%d d=%d: no layout", types[ti][0], types[ti][1], P, d);
                    continue;
                }
                CHECK(dl.group_tokens == (P % 32 == 0 ? 32u : 16u));
                CHECK((size_t)H * dl.head_bytes == pl.page_bytes);
                CHECK(dl.k.bytes % KVQ_PAGE_ALIGN == 0 && dl.v.bytes % KVQ_PAGE_ALIGN == 0);
                uint8_t *page = calloc(pl.page_bytes, 1), *owned = calloc(pl.page_bytes, 1);
                size_t again = 0;
                for (int kv = 0; kv < 2; kv++) {
                    const struct kvq_head_layout *hl = kv ? &pl.v : &pl.k;
                    const struct kvq_row_fields f = kvq_layout_row_fields((int)hl->type, d);
                    for (uint32_t h = 0; h < (uint32_t)H; h++)
                        for (uint32_t t = 0; t < (uint32_t)P; t++) {
                            const struct kvq_row r = kvq_dev_row(&dl, page, kv, h, t);
                            const size_t group =
                                (size_t)h * dl.head_bytes + (size_t)(t / dl.group_tokens) * dl.group_tokens * dl.row_bytes;
                            CHECK((size_t)(r.codes - page) >= group + (kv ? dl.k.bytes : 0) &&
                                  (size_t)(r.codes - page) < group + dl.k.bytes + (kv ? dl.v.bytes : 0));
                            again += mark(owned, page, r.codes, f.codes);
                            if (f.norm)
                                again += mark(owned, page, (uint8_t *)r.norm, 2);
                            if (f.rnorm)
                                again += mark(owned, page, (uint8_t *)r.rnorm, 2);
                            if (f.signs)
                                again += mark(owned, page, r.signs, f.signs);
                        }
                }
                size_t unowned = 0;
                for (size_t i = 0; i < pl.page_bytes; i++)
                    unowned += owned[i] == 0;
                CHECKF(again == 0 && unowned == 0, "types %d/%d P=%d d=%d: %zu bytes twice, %zu of none",
                       types[ti][0], types[ti][1], P, d, again, unowned);
                free(page);
                free(owned);
            }
    struct kvq_page_layout pl;
    struct kvq_dev_layout dl;
    memset(&dl, 0, sizeof dl);
    CHECK(kvq_page_layout_init(&pl, 8, 128, KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 64) == 0 && kvq_dev_layout_init(&dl, &pl) == 0);
    CHECK(dl.k.norm_off == 0 && dl.k.rnorm_off == 64 && dl.k.codes_off == 128 && dl.k.signs_off == 1664);
    CHECK(dl.k.bytes == 2176 && dl.v.norm_off == 0 && dl.v.codes_off == 64 && dl.v.bytes == 1600);
    CHECK(dl.row_bytes == 118 && dl.head_bytes == 64u * 118);
}

static void test_pages_stable_reset_truncate(void)
{
    const int H = 2, d = 128;
    kvq_cache *c = make_cache(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, H, d, 1000, 7);
    float *k = random_rows(300 * H, d, 11), *v = random_rows(300 * H, d, 12);
    float *a = malloc(300 * (size_t)d * sizeof(float)), *b = malloc(300 * (size_t)d * sizeof(float));
    CHECK_OK(kvq_cache_append(c, 64, k, v));
    CHECK(kvq_cache_page_count(c) == 1);
    const uint8_t *p0 = kvq_cache_page(c, 0);
    CHECK(((uintptr_t)p0 & 63) == 0);
    CHECK_OK(kvq_cache_append(c, 1, k + 64 * H * d, v + 64 * H * d));
    CHECK(kvq_cache_page_count(c) == 2 && kvq_cache_page(c, 0) == p0); /* never moved */
    CHECK_OK(kvq_cache_append(c, 135, k + 65 * H * d, v + 65 * H * d));
    CHECK(kvq_cache_len(c) == 200 && kvq_cache_page_count(c) == 4 && kvq_cache_page(c, 0) == p0);
    const uint8_t *p3 = kvq_cache_page(c, 3);
    CHECK_OK(kvq_cache_read(c, 1, 0, 200, a, NULL));

    /* truncate: the prefix reads the same, the rest is gone, pages stay */
    CHECK_OK(kvq_cache_truncate(c, 70));
    CHECK(kvq_cache_len(c) == 70 && kvq_cache_page_count(c) == 4);
    CHECK_OK(kvq_cache_read(c, 1, 0, 70, b, NULL));
    CHECK(memcmp(a, b, 70 * (size_t)d * sizeof(float)) == 0);
    CHECK_STATUS(kvq_cache_read(c, 1, 0, 71, b, NULL), KVQ_ERR_INVALID_ARG);
    /* re-append different tokens after the rollback point */
    CHECK_OK(kvq_cache_append(c, 10, k + 200 * H * d, v + 200 * H * d));
    CHECK_OK(kvq_cache_read(c, 1, 0, 80, b, NULL));
    CHECK(memcmp(a, b, 70 * (size_t)d * sizeof(float)) == 0);
    CHECK(memcmp(a + 70 * d, b + 70 * d, 10 * (size_t)d * sizeof(float)) != 0);
    CHECK_OK(kvq_cache_truncate(c, 80)); /* truncating to len is a no-op */
    CHECK(kvq_cache_len(c) == 80);

    /* reset: empty, pages kept and reused */
    kvq_cache_reset(c);
    CHECK(kvq_cache_len(c) == 0 && kvq_cache_page_count(c) == 4);
    CHECK_STATUS(kvq_cache_read(c, 0, 0, 1, b, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_OK(kvq_cache_append(c, 200, k, v));
    CHECK(kvq_cache_page_count(c) == 4 && kvq_cache_page(c, 0) == p0 && kvq_cache_page(c, 3) == p3);
    CHECK_OK(kvq_cache_read(c, 1, 0, 200, b, NULL));
    CHECK(memcmp(a, b, 200 * (size_t)d * sizeof(float)) == 0);
    kvq_cache_reset(NULL);
    free(a);
    free(b);
    free(k);
    free(v);
    kvq_cache_free(c);
}

/* A failed append leaves every byte and every count as it was. */
static void test_all_or_nothing(void)
{
    const int H = 2, d = 64;
    const enum kvq_type types[][2] = {{KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3}, {KVQ_TYPE_F16, KVQ_TYPE_Q8_0}};
    for (size_t ti = 0; ti < 2; ti++) {
        kvq_cache *c = make_cache(types[ti][0], types[ti][1], H, d, 1000, 3);
        float *k = random_rows(100 * H, d, 21), *v = random_rows(100 * H, d, 22);
        CHECK_OK(kvq_cache_append(c, 60, k, v));
        struct kvq_cache_stats s0, s1;
        kvq_cache_get_stats(c, &s0);
        const size_t pb = s0.page_bytes;
        uint8_t *snap = malloc(pb);
        memcpy(snap, kvq_cache_page(c, 0), pb);

        /* 10 tokens, crossing into a new page; the last V row of the last token is bad */
        const float bad_vals[] = {NAN, INFINITY, -INFINITY, 1e6f};
        const kvq_status want[] = {KVQ_ERR_NONFINITE, KVQ_ERR_NONFINITE, KVQ_ERR_NONFINITE, KVQ_ERR_RANGE};
        for (int b = 0; b < 4; b++) {
            float *kk = malloc(10 * H * (size_t)d * sizeof(float)), *vv = malloc(10 * H * (size_t)d * sizeof(float));
            memcpy(kk, k + 60 * H * d, 10 * H * (size_t)d * sizeof(float));
            memcpy(vv, v + 60 * H * d, 10 * H * (size_t)d * sizeof(float));
            /* 1e6 overflows f16 as a norm (tq), a value (f16) and a q8_0 scale (> 65504 * 127 needs more) */
            float bad = bad_vals[b];
            if (b == 3 && types[ti][1] == KVQ_TYPE_Q8_0)
                bad = 1e10f;
            vv[10 * H * d - 1] = bad;
            CHECK_STATUS(kvq_cache_append(c, 10, kk, vv), want[b]);
            /* the same in K, first row */
            memcpy(vv, v + 60 * H * d, 10 * H * (size_t)d * sizeof(float));
            kk[0] = b == 3 ? 1e10f : bad;
            CHECK_STATUS(kvq_cache_append(c, 10, kk, vv), want[b]);
            kvq_cache_get_stats(c, &s1);
            CHECK(s1.tokens == 60 && s1.pages == s0.pages && s1.bytes_allocated == s0.bytes_allocated);
            CHECK(memcmp(snap, kvq_cache_page(c, 0), pb) == 0);
            free(kk);
            free(vv);
        }
        /* and the cache still works */
        CHECK_OK(kvq_cache_append(c, 10, k + 60 * H * d, v + 60 * H * d));
        CHECK(kvq_cache_len(c) == 70);
        free(snap);
        free(k);
        free(v);
        kvq_cache_free(c);
    }
}

static void test_limits(void)
{
    const int H = 2, d = 128;
    float *k = random_rows(200 * H, d, 31), *v = random_rows(200 * H, d, 32);
    /* context limit */
    kvq_cache *c = make_cache(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, H, d, 100, 1);
    CHECK_OK(kvq_cache_append(c, 99, k, v));
    CHECK_STATUS(kvq_cache_append(c, 2, k, v), KVQ_ERR_CONTEXT_FULL);
    CHECK(kvq_cache_len(c) == 99 && kvq_cache_page_count(c) == 2);
    CHECK_OK(kvq_cache_append(c, 1, k, v));
    CHECK_STATUS(kvq_cache_append(c, 1, k, v), KVQ_ERR_CONTEXT_FULL);
    CHECK_STATUS(kvq_cache_append(c, SIZE_MAX, k, v), KVQ_ERR_CONTEXT_FULL);
    CHECK(kvq_cache_len(c) == 100);
    kvq_cache_free(c);

    /* memory budget: two pages */
    struct kvq_cache_config cfg;
    kvq_cache_config_default(&cfg, H, d, 100000);
    size_t page = kvq_cache_bytes_for(&cfg, 1);
    CHECK(page == 64u * (size_t)H * 118);
    cfg.max_bytes = 2 * page + page / 2;
    CHECK_OK(kvq_cache_create(&cfg, &c));
    CHECK_OK(kvq_cache_append(c, 100, k, v));
    CHECK_STATUS(kvq_cache_append(c, 29, k, v), KVQ_ERR_BUDGET);
    CHECK(kvq_cache_len(c) == 100 && kvq_cache_page_count(c) == 2);
    CHECK_OK(kvq_cache_append(c, 28, k, v));
    CHECK_STATUS(kvq_cache_append(c, 1, k, v), KVQ_ERR_BUDGET);
    kvq_cache_reset(c); /* kept pages are reusable within the budget */
    CHECK_OK(kvq_cache_append(c, 128, k, v));
    kvq_cache_free(c);

    /* a budget below one page admits nothing */
    cfg.max_bytes = page - 1;
    CHECK_OK(kvq_cache_create(&cfg, &c));
    CHECK_STATUS(kvq_cache_append(c, 1, k, v), KVQ_ERR_BUDGET);
    CHECK(kvq_cache_len(c) == 0 && kvq_cache_page_count(c) == 0);
    kvq_cache_free(c);

    /* a huge context limit with a budget needs no huge page table */
    cfg.max_tokens = SIZE_MAX;
    cfg.max_bytes = 4 * page;
    CHECK_OK(kvq_cache_create(&cfg, &c));
    CHECK_OK(kvq_cache_append(c, 200, k, v));
    kvq_cache_free(c);
    free(k);
    free(v);
}

static void test_stats_bytes(void)
{
    const int H = 4, d = 128;
    kvq_cache *c = make_cache(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, H, d, 4096, 9);
    CHECK(kvq_type_row_bytes(KVQ_TYPE_TQ3J, d) + kvq_type_row_bytes(KVQ_TYPE_TQ3, d) == 118);
    struct kvq_cache_stats st;
    kvq_cache_get_stats(c, &st);
    CHECK(st.tokens == 0 && st.pages == 0 && st.bytes_allocated == 0 && st.bytes_used == 0);
    CHECK(st.page_bytes == 64u * H * 118);
    float *k = random_rows(256 * H, d, 41), *v = random_rows(256 * H, d, 42);
    CHECK_OK(kvq_cache_append(c, 128, k, v)); /* exactly two full pages */
    kvq_cache_get_stats(c, &st);
    CHECK(st.tokens == 128 && st.pages == 2);
    CHECK(st.bytes_allocated == 2 * st.page_bytes);
    CHECK(st.bytes_allocated == 128u * H * 118 && st.bytes_used == st.bytes_allocated);
    CHECK(st.bytes_f16 == 128u * H * 2 * d * 2);
    CHECKF(fabs((double)st.bytes_f16 / (double)st.bytes_used - 512.0 / 118.0) < 1e-12, "ratio %g",
           (double)st.bytes_f16 / (double)st.bytes_used);
    CHECK_OK(kvq_cache_append(c, 1, k, v)); /* a third page for one token */
    kvq_cache_get_stats(c, &st);
    CHECK(st.pages == 3 && st.bytes_allocated == 3 * st.page_bytes && st.bytes_used == 129u * H * 118);
    CHECK(kvq_cache_bytes_for(kvq_cache_config_of(c), 129) == st.bytes_allocated);
    CHECK(kvq_cache_bytes_for(kvq_cache_config_of(c), 128) == 2 * st.page_bytes);
    CHECK(kvq_cache_bytes_for(kvq_cache_config_of(c), 0) == 0);
    const struct kvq_page_layout *pl = kvq_cache_layout(c);
    CHECK(pl && pl->page_bytes == st.page_bytes && pl->k.type == KVQ_TYPE_TQ3J && pl->v.type == KVQ_TYPE_TQ3);
    kvq_cache_get_stats(NULL, &st);
    CHECK(st.tokens == 0);
    free(k);
    free(v);
    kvq_cache_free(c);

    /* baselines: f16 costs 512 bytes per token-head, q8_0 272 */
    c = make_cache(KVQ_TYPE_F16, KVQ_TYPE_F16, 1, d, 64, 0);
    kvq_cache_get_stats(c, &st);
    CHECK(st.page_bytes == 64u * 512);
    kvq_cache_free(c);
    c = make_cache(KVQ_TYPE_Q8_0, KVQ_TYPE_Q8_0, 1, d, 64, 0);
    kvq_cache_get_stats(c, &st);
    CHECK(st.page_bytes == 64u * 272);
    kvq_cache_free(c);
}

int main(void)
{
    RUN(test_config_and_bad_args);
    RUN(test_layout);
    RUN(test_dev_code_order);
    RUN(test_dev_page_layout);
    RUN(test_pages_stable_reset_truncate);
    RUN(test_all_or_nothing);
    RUN(test_limits);
    RUN(test_stats_bytes);
    return TEST_END("test_cache");
}
