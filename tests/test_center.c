/* test_center.c - key centering (kvq_cache_config.center_k): the key-mean
 * block against the page's mean, chunking invariance of the bytes, reads
 * and fused attention against the reference and against exact attention,
 * truncation, sharing and the refusals. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvq_attn.h"
#include "kvq_cache.h"
#include "kvq_half.h"
#include "kvq_layout.h"
#include "kvq_rng.h"
#include "test.h"

enum { H = 2, D = 128 };

/* n tokens of H heads: N(0,1) around a per-head mean that is large on a few
 * channels and drifts slowly with the position, as real keys are. */
static float *keys_with_mean(size_t n, uint64_t seed)
{
    float *x = malloc(n * H * D * sizeof *x);
    kvq_rng rng;
    kvq_rng_init(&rng, seed);
    for (size_t t = 0; t < n; t++)
        for (int h = 0; h < H; h++)
            for (int j = 0; j < D; j++) {
                double m = (j % 16 == 3 ? 6.0 : 1.5) * cos(0.7 * j + h + 0.002 * (double)t);
                x[(t * H + h) * D + j] = (float)(m + kvq_rng_gauss(&rng));
            }
    return x;
}

static kvq_cache *centred(enum kvq_type tk, enum kvq_type tv, size_t max_tokens, int center)
{
    struct kvq_cache_config cfg;
    kvq_cache_config_default(&cfg, H, D, max_tokens);
    cfg.type_k = tk;
    cfg.type_v = tv;
    cfg.seed = 5;
    cfg.recent_f16 = 1;
    cfg.center_k = center;
    kvq_cache *c = NULL;
    const kvq_status st = kvq_cache_create(&cfg, &c);
    CHECKF(st == KVQ_OK, "create %d/%d: %s", (int)tk, (int)tv, kvq_status_str(st));
    return c;
}

/* Appends tokens [0, n) in chunks of the given sizes (cycled). */
static void append_chunks(kvq_cache *c, const float *k, const float *v, size_t n, const size_t *sizes, int n_sizes)
{
    for (size_t t = 0, i = 0; t < n; i++) {
        size_t m = sizes[i % (size_t)n_sizes];
        m = m < n - t ? m : n - t;
        CHECK_OK(kvq_cache_append(c, m, k + t * H * D, v + t * H * D));
        t += m;
    }
}

static void test_config(void)
{
    struct kvq_cache_config cfg;
    kvq_cache_config_default(&cfg, H, D, 256);
    kvq_cache *c = NULL;
    cfg.center_k = 1; /* the window is off: keys could not wait for their page */
    CHECK_STATUS(kvq_cache_create(&cfg, &c), KVQ_ERR_INVALID_ARG);
    cfg.recent_f16 = 1;
    cfg.center_k = 2;
    CHECK_STATUS(kvq_cache_create(&cfg, &c), KVQ_ERR_INVALID_ARG);
    cfg.center_k = 1;
    CHECK_OK(kvq_cache_create(&cfg, &c));
    struct kvq_page_layout plain;
    CHECK(kvq_page_layout_init(&plain, H, D, KVQ_DEFAULT_TYPE_K, KVQ_DEFAULT_TYPE_V, KVQ_DEFAULT_PAGE_TOKENS) == 0);
    const struct kvq_page_layout *pl = kvq_cache_layout(c);
    /* 2 heads x 66 bytes, padded to 16 */
    CHECK(pl->mean_bytes == 66 && pl->mean_off == plain.page_bytes && pl->page_bytes == plain.page_bytes + 144);
    CHECK(plain.mean_bytes == 0);
    kvq_cache_free(c);
    /* a plain cache has no means */
    kvq_cache *p = centred(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 256, 0);
    float *k = keys_with_mean(64, 1);
    CHECK_OK(kvq_cache_append(p, 64, k, k));
    CHECK(kvq_cache_key_mean(p, 0, 0) == NULL);
    free(k);
    kvq_cache_free(p);
}

/* The block holds the page's mean of the f16-rounded keys to within half a
 * step, and f32 keys read back as their f16 rounding (centred and restored
 * in float). Keys of a page that has not filled wait: no mean yet, read
 * from the f16 window. */
static void test_mean_block_and_read(void)
{
    const size_t n = 150, P = KVQ_DEFAULT_PAGE_TOKENS;
    kvq_cache *c = centred(KVQ_TYPE_F32, KVQ_TYPE_F16, 512, 1);
    float *k = keys_with_mean(n, 2), *r = malloc(n * D * sizeof *r);
    CHECK_OK(kvq_cache_append(c, n, k, k));
    for (int h = 0; h < H; h++) {
        for (size_t page = 0; page < 2; page++) {
            const uint8_t *blk = kvq_cache_key_mean(c, page, h);
            CHECK(blk != NULL);
            if (!blk)
                continue;
            float mean[D], m[D], mx = 0.0f;
            for (int j = 0; j < D; j++) {
                double s = 0.0;
                for (size_t t = page * P; t < page * P + P; t++)
                    s += kvq_f16_to_f32(kvq_f32_to_f16(k[(t * H + h) * D + j]));
                m[j] = (float)(s / (double)P);
                mx = fabsf(m[j]) > mx ? fabsf(m[j]) : mx;
            }
            kvq_key_mean_decode(blk, D, mean);
            const float step = kvq_f16_to_f32(kvq_f32_to_f16(mx / 7.0f));
            float worst = 0.0f;
            for (int j = 0; j < D; j++)
                worst = fmaxf(worst, fabsf(mean[j] - m[j]));
            CHECKF(worst <= 0.5f * step * 1.01f + 1e-4f, "head %d page %zu: mean off by %g (step %g)", h, page, worst,
                   step);
        }
        CHECK(kvq_cache_key_mean(c, 2, h) == NULL); /* page 2 has 22 of 64 tokens */
        CHECK_OK(kvq_cache_read(c, h, 0, n, r, NULL));
        float worst = 0.0f;
        for (size_t t = 0; t < n; t++)
            for (int j = 0; j < D; j++) {
                const float x = k[(t * H + h) * D + j], want = kvq_f16_to_f32(kvq_f32_to_f16(x));
                worst = fmaxf(worst, fabsf(r[t * D + j] - want));
            }
        CHECKF(worst <= 1e-5f, "head %d: read off by %g", h, worst);
    }
    free(k);
    free(r);
    kvq_cache_free(c);
}

/* The bytes do not depend on how the tokens arrive. */
static void test_chunking(void)
{
    const size_t n = 300;
    const size_t one[] = {1}, all[] = {300}, mixed[] = {7, 50, 1, 130, 3};
    const size_t *plans[] = {one, all, mixed};
    const int counts[] = {1, 1, 5};
    float *k = keys_with_mean(n, 3), *v = keys_with_mean(n, 4);
    kvq_cache *c[3];
    for (int i = 0; i < 3; i++) {
        c[i] = centred(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 512, 1);
        append_chunks(c[i], k, v, n, plans[i], counts[i]);
    }
    const size_t full = n / KVQ_DEFAULT_PAGE_TOKENS;
    const size_t bytes = (size_t)kvq_cache_layout(c[0])->page_bytes;
    for (int i = 1; i < 3; i++)
        for (size_t p = 0; p < full; p++)
            CHECKF(memcmp(kvq_cache_page(c[0], p), kvq_cache_page(c[i], p), bytes) == 0, "plan %d page %zu", i, p);
    float *a = malloc(n * D * sizeof *a), *b = malloc(n * D * sizeof *b);
    for (int i = 1; i < 3; i++)
        for (int h = 0; h < H; h++) {
            CHECK_OK(kvq_cache_read(c[0], h, 0, n, a, NULL));
            CHECK_OK(kvq_cache_read(c[i], h, 0, n, b, NULL));
            CHECK(memcmp(a, b, n * D * sizeof *a) == 0);
        }
    for (int i = 0; i < 3; i++)
        kvq_cache_free(c[i]);
    free(a);
    free(b);
    free(k);
    free(v);
}

/* Exact softmax attention of query q over keys/values [0, n) of head h, in double. */
static void exact_attention(const float *q, const float *k, const float *v, size_t n, int h, float scale, double *out)
{
    double mx = -INFINITY, l = 0.0, *s = malloc(n * sizeof *s);
    for (size_t t = 0; t < n; t++) {
        double dot = 0.0;
        for (int j = 0; j < D; j++)
            dot += (double)q[j] * k[(t * H + h) * D + j];
        s[t] = dot * scale;
        mx = s[t] > mx ? s[t] : mx;
    }
    for (int j = 0; j < D; j++)
        out[j] = 0.0;
    for (size_t t = 0; t < n; t++) {
        const double w = exp(s[t] - mx);
        l += w;
        for (int j = 0; j < D; j++)
            out[j] += w * v[(t * H + h) * D + j];
    }
    for (int j = 0; j < D; j++)
        out[j] /= l;
    free(s);
}

/* Fused attention over a centred cache equals the reference (dequantize,
 * add the page's mean, attend in double); an f32/f32 centred cache equals
 * exact attention to f16 rounding; and for compressed keys with a common
 * mean, centring lowers the error against exact attention. */
static void test_attention(void)
{
    enum { n_q = 4 };
    const size_t n = 333;
    const float scale = 1.0f / sqrtf((float)D);
    float *k = keys_with_mean(n, 5), *v = keys_with_mean(n, 6), *q = keys_with_mean(2, 7);
    kvq_attn_workspace *ws = NULL;
    CHECK_OK(kvq_attn_workspace_create(D, n_q, n, &ws));
    const enum kvq_type types[][2] = {{KVQ_TYPE_F32, KVQ_TYPE_F32}, {KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3},
                                      {KVQ_TYPE_TQ4, KVQ_TYPE_TQ3}, {KVQ_TYPE_Q4_0, KVQ_TYPE_Q4_0},
                                      {KVQ_TYPE_Q4_0R, KVQ_TYPE_Q4_0R}, {KVQ_TYPE_TQ5, KVQ_TYPE_F16}};
    float out[n_q * D], ref[n_q * D];
    double ex[n_q][H][D];
    for (int i = 0; i < n_q; i++)
        for (int h = 0; h < H; h++)
            exact_attention(q + (size_t)i * D, k, v, n, h, scale, ex[i][h]);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        double err[2] = {0.0, 0.0};
        for (int center = 1; center >= 0; center--) {
            kvq_cache *c = centred(types[ti][0], types[ti][1], 512, center);
            CHECK_OK(kvq_cache_append(c, n, k, v));
            for (int h = 0; h < H; h++) {
                CHECK_OK(kvq_attn_decode(c, h, n, q, n_q, scale, out, ws));
                CHECK_OK(kvq_attn_decode_ref(c, h, n, q, n_q, scale, ref, ws));
                float worst = 0.0f;
                for (int j = 0; j < n_q * D; j++) {
                    worst = fmaxf(worst, fabsf(out[j] - ref[j]));
                    const double e = out[j] - ex[j / D][h][j % D];
                    err[center] += e * e;
                }
                CHECKF(worst <= 2e-4f, "%s/%s center %d head %d: fused vs reference %g",
                       kvq_type_traits(types[ti][0])->name, kvq_type_traits(types[ti][1])->name, center, h, worst);
            }
            kvq_cache_free(c);
        }
        const double rms_c = sqrt(err[1] / (H * n_q * D)), rms_p = sqrt(err[0] / (H * n_q * D));
        if (types[ti][0] == KVQ_TYPE_F32)
            CHECKF(rms_c <= 1e-3, "f32 centred: rms error %g against exact attention", rms_c);
        else
            CHECKF(rms_c < 0.8 * rms_p, "%s/%s: centred rms error %g, plain %g", kvq_type_traits(types[ti][0])->name,
                   kvq_type_traits(types[ti][1])->name, rms_c, rms_p);
    }
    kvq_attn_workspace_free(ws);
    free(k);
    free(v);
    free(q);
}

/* A page keeps its mean while it keeps a token: a truncation into a full
 * page and new tokens after it leave the page's mean and earlier keys as
 * they were; a truncation to a page start makes the page anew, byte for
 * byte as a cache that only ever saw the new tokens. Shared pages carry
 * their means. */
static void test_truncate_and_share(void)
{
    const size_t P = KVQ_DEFAULT_PAGE_TOKENS;
    float *k = keys_with_mean(400, 8), *v = keys_with_mean(400, 9);
    float *k2 = keys_with_mean(400, 10), *v2 = keys_with_mean(400, 11);
    kvq_cache *c = centred(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 512, 1);
    CHECK_OK(kvq_cache_append(c, 150, k, v));
    uint8_t mean1[66];
    memcpy(mean1, kvq_cache_key_mean(c, 1, 1), sizeof mean1);
    float *a = malloc(150 * D * sizeof *a), *b = malloc(150 * D * sizeof *b);
    CHECK_OK(kvq_cache_read(c, 1, 0, 150, a, NULL));
    CHECK_OK(kvq_cache_truncate(c, 100)); /* deeper than the ring's slack: page 1 is read packed */
    CHECK_OK(kvq_cache_append(c, 50, k2, v2));
    CHECK(memcmp(kvq_cache_key_mean(c, 1, 1), mean1, sizeof mean1) == 0);
    CHECK_OK(kvq_cache_read(c, 1, 0, 150, b, NULL));
    CHECK(memcmp(a, b, 100 * D * sizeof *a) == 0);

    /* to a page start: page 1 is rebuilt from the new tokens alone */
    CHECK_OK(kvq_cache_truncate(c, P));
    CHECK_OK(kvq_cache_append(c, 2 * P, k2, v2));
    kvq_cache *fresh = centred(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 512, 1);
    CHECK_OK(kvq_cache_append(fresh, P, k, v));
    CHECK_OK(kvq_cache_append(fresh, 2 * P, k2, v2));
    const size_t bytes = (size_t)kvq_cache_layout(c)->page_bytes;
    for (size_t p = 0; p < 3; p++)
        CHECKF(memcmp(kvq_cache_page(c, p), kvq_cache_page(fresh, p), bytes) == 0, "page %zu", p);

    /* share two pages: the same means, the same reads, and appends after them */
    kvq_cache *d = centred(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 512, 1);
    CHECK_OK(kvq_cache_share(d, fresh, 2 * P));
    CHECK(kvq_cache_key_mean(d, 1, 0) == kvq_cache_key_mean(fresh, 1, 0));
    CHECK_OK(kvq_cache_read(d, 0, 0, 2 * P, a, NULL));
    CHECK_OK(kvq_cache_read(fresh, 0, 0, 2 * P, b, NULL));
    CHECK(memcmp(a, b, 2 * P * D * sizeof *a) == 0);
    CHECK_OK(kvq_cache_append(d, P, k2 + P * H * D, v2 + P * H * D));
    CHECK(kvq_cache_key_mean(d, 2, 0) != NULL);
    CHECK(memcmp(kvq_cache_page(d, 2), kvq_cache_page(fresh, 2), bytes) == 0);
    kvq_cache *plain = centred(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 512, 0);
    CHECK_STATUS(kvq_cache_share(plain, fresh, P), KVQ_ERR_INVALID_ARG); /* not the same layout */
    kvq_cache_free(plain);
    kvq_cache_free(d);
    kvq_cache_free(fresh);
    kvq_cache_free(c);
    free(a);
    free(b);
    free(k);
    free(v);
    free(k2);
    free(v2);
}

/* A key so long that its centred row might not encode is refused before
 * anything is written. */
static void test_range(void)
{
    kvq_cache *c = centred(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 256, 1);
    float *k = keys_with_mean(3, 12), *v = keys_with_mean(3, 13);
    CHECK_OK(kvq_cache_append(c, 1, k, v));
    for (int j = 0; j < D; j++)
        k[(2 * H + 1) * D + j] = 2000.0f; /* norm 22627 > 65504 / 4 */
    CHECK_STATUS(kvq_cache_append(c, 2, k + H * D, v + H * D), KVQ_ERR_RANGE);
    CHECK(kvq_cache_len(c) == 1);
    kvq_cache_free(c);
    free(k);
    free(v);
}

int main(void)
{
    RUN(test_config);
    RUN(test_mean_block_and_read);
    RUN(test_chunking);
    RUN(test_attention);
    RUN(test_truncate_and_share);
    RUN(test_range);
    return TEST_END("test_center");
}
