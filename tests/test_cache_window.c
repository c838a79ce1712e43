/* test_cache_window.c - f16 overrides of the cache: the recent-token window
 * (recent_f16) and the sink tokens (sink_tokens).
 *
 * References are independent of the override code: the expected rows of a
 * view are built here from the definition (f16-rounded input for sink tokens
 * and for the tokens of the partly filled page, the decoded rows of an
 * identical cache without overrides for the rest) and attended in double.
 * Then: fused vs reference at every length (page boundaries included),
 * truncate/reset, a chunk attended with the caller's f16 copies of its pages
 * (kvq_attn_causal_recent), budgets that count the buffers, refused configs, and in the
 * decoder a chunked prefill that equals token-by-token generation bit for
 * bit, speculative decoding equal to plain decoding, refused forwards. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn_internal.h"
#include "kvq_cpu.h"
#include "kvq_attn.h"
#include "kvq_cache.h"
#include "kvq_half.h"
#include "kvq_model.h"
#include "kvq_rng.h"
#include "test.h"

static kvq_model *model;

/* n rows of d floats: N(0,1) times s, a few outlier channels. */
static float *random_rows(size_t n, int d, uint64_t seed, double s)
{
    float *x = malloc(n * (size_t)d * sizeof *x);
    kvq_rng rng;
    kvq_rng_init(&rng, seed);
    for (size_t i = 0; i < n * (size_t)d; i++) {
        int j = (int)(i % (size_t)d);
        double o = (j == 5 || j == d / 2 + 3) ? 8.0 : 1.0;
        x[i] = (float)(s * o * kvq_rng_gauss(&rng));
    }
    return x;
}

static kvq_cache *make(enum kvq_type tk, enum kvq_type tv, int H, int d, int P, size_t max_tokens, int recent,
                       int sink, size_t max_bytes)
{
    struct kvq_cache_config cfg;
    kvq_cache_config_default(&cfg, H, d, max_tokens);
    cfg.type_k = tk;
    cfg.type_v = tv;
    cfg.seed = 77;
    cfg.page_tokens = P;
    cfg.recent_f16 = recent;
    cfg.sink_tokens = sink;
    cfg.max_bytes = max_bytes;
    kvq_cache *c = NULL;
    kvq_status st = kvq_cache_create(&cfg, &c);
    CHECKF(st == KVQ_OK, "create: %s", kvq_status_str(st));
    return c;
}

static double rel_err(const float *a, const float *b, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - (double)b[i];
        num += e * e;
        den += (double)b[i] * b[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static float f16_round(float x)
{
    return kvq_f16_to_f32(kvq_f32_to_f16(x));
}

/* softmax(scale q.k) v over rows k, v [n][d], in double, for n_q queries. */
static void attend(const float *q, int n_q, const float *k, const float *v, size_t n, int d, float scale, float *out)
{
    for (int h = 0; h < n_q; h++) {
        double m = -INFINITY, l = 0.0;
        double *s = malloc(n * sizeof *s), *acc = calloc((size_t)d, sizeof *acc);
        for (size_t i = 0; i < n; i++) {
            double dot = 0.0;
            for (int j = 0; j < d; j++)
                dot += (double)q[(size_t)h * d + j] * k[i * d + j];
            s[i] = (double)scale * dot;
            m = s[i] > m ? s[i] : m;
        }
        for (size_t i = 0; i < n; i++) {
            double w = exp(s[i] - m);
            l += w;
            for (int j = 0; j < d; j++)
                acc[j] += w * v[i * d + j];
        }
        for (int j = 0; j < d; j++)
            out[(size_t)h * d + j] = (float)(acc[j] / l);
        free(s);
        free(acc);
    }
}

/* The rows of head h that a view of n tokens reads, by the definition: an
 * override token (t < sink, or in the partly filled last page with the
 * window on) gives its input rounded to f16; any other the decoded row of
 * `plain` (the same config without overrides: the same bytes). Assumes the
 * cache got its n tokens by appends only (the ring then holds the page). */
static void expected_rows(const kvq_cache *plain, const float *kin, const float *vin, int H, int h, size_t n,
                          int P, int recent, int sink, float *k, float *v)
{
    const int d = kvq_cache_config_of(plain)->head_dim;
    CHECK_OK(kvq_cache_read(plain, h, 0, n, k, v));
    size_t tail = recent && n % (size_t)P ? n - n % (size_t)P : n;
    for (size_t t = 0; t < n; t++)
        if (t < (size_t)sink || t >= tail)
            for (int j = 0; j < d; j++) {
                size_t src = (t * (size_t)H + (size_t)h) * (size_t)d + (size_t)j;
                k[t * d + j] = f16_round(kin[src]);
                v[t * d + j] = f16_round(vin[src]);
            }
}

struct pair {
    enum kvq_type tk, tv;
};

/* Appends tokens one at a time; after each, at every length, checks the
 * view, kvq_cache_read, the reference and every fused kernel set against the
 * expected rows. */
static void check_views(struct pair tp, int P, int recent, int sink, size_t N, int n_q)
{
    const int H = 2, d = 128;
    const float scale = 1.0f / sqrtf((float)d);
    kvq_cache *c = make(tp.tk, tp.tv, H, d, P, N, recent, sink, 0);
    kvq_cache *plain = make(tp.tk, tp.tv, H, d, P, N, 0, 0, 0);
    float *kin = random_rows(N * H, d, 11, 1.0), *vin = random_rows(N * H, d, 12, 1.0);
    float *q = random_rows((size_t)n_q, d, 13, 3.0);
    float *k = malloc(N * d * sizeof *k), *v = malloc(N * d * sizeof *v);
    float *rk = malloc(N * d * sizeof *rk), *rv = malloc(N * d * sizeof *rv);
    float *want = malloc((size_t)n_q * d * sizeof *want), *got = malloc((size_t)n_q * d * sizeof *got);
    kvq_attn_workspace *ws = NULL;
    CHECK_OK(kvq_attn_workspace_create(d, n_q, N, &ws));
    const struct kvq_attn_kernels *sets[3] = {&kvq_attn_kernels_scalar, NULL, NULL};
    if (kvq_cpu_has_avx2())
        sets[1] = &kvq_attn_kernels_avx2;
    if (kvq_attn_avx512_usable())
        sets[2] = &kvq_attn_kernels_avx512;
    double worst = 0.0;
    for (size_t n = 1; c && plain && ws && n <= N; n++) {
        size_t off = (n - 1) * H * (size_t)d;
        CHECK_OK(kvq_cache_append(c, 1, kin + off, vin + off));
        CHECK_OK(kvq_cache_append(plain, 1, kin + off, vin + off));
        /* the pages are exactly those of the cache without overrides */
        for (size_t p = 0; p < kvq_cache_page_count(c); p++)
            CHECK(memcmp(kvq_cache_page(c, p), kvq_cache_page(plain, p), kvq_cache_layout(c)->page_bytes) == 0);
        size_t se, tl;
        CHECK_OK(kvq_cache_f16_view(c, n, &se, &tl));
        size_t want_tl = recent && n % (size_t)P ? n - n % (size_t)P : n;
        CHECKF(se == (n < (size_t)sink ? n : (size_t)sink) && tl == want_tl, "n=%zu view %zu %zu", n, se, tl);
        for (int h = 0; h < H; h++) {
            expected_rows(plain, kin, vin, H, h, n, P, recent, sink, k, v);
            CHECK_OK(kvq_cache_read(c, h, 0, n, rk, rv));
            CHECKF(memcmp(k, rk, n * d * sizeof *k) == 0 && memcmp(v, rv, n * d * sizeof *v) == 0,
                   "read n=%zu h=%d", n, h);
            attend(q, n_q, k, v, n, d, scale, want);
            CHECK_OK(kvq_attn_decode_ref(c, h, n, q, n_q, scale, got, ws));
            double e = rel_err(got, want, (size_t)n_q * d);
            CHECKF(e <= 1e-9, "ref n=%zu h=%d: %.3g", n, h, e);
            CHECK_OK(kvq_attn_decode(c, h, n, q, n_q, scale, got, ws));
            e = rel_err(got, want, (size_t)n_q * d);
            worst = e > worst ? e : worst;
            CHECKF(e <= 1e-5, "fused %s/%s P=%d win=%d sink=%d n=%zu h=%d: %.3g", kvq_type_traits(tp.tk)->name,
                   kvq_type_traits(tp.tv)->name, P, recent, sink, n, h, e);
            for (int s = 0; s < 3; s++) {
                if (!sets[s])
                    continue;
                CHECK_OK(kvq_attn_decode_kernels(sets[s], c, h, n, q, n_q, scale, got, ws));
                e = rel_err(got, want, (size_t)n_q * d);
                CHECKF(e <= 1e-5, "kernels %d n=%zu: %.3g", s, n, e);
            }
        }
    }
    printf("  %s/%s P=%d window %d sink %d: %zu lengths, worst fused rel err %.2g\n", kvq_type_traits(tp.tk)->name,
           kvq_type_traits(tp.tv)->name, P, recent, sink, N, worst);
    kvq_attn_workspace_free(ws);
    kvq_cache_free(c);
    kvq_cache_free(plain);
    free(kin);
    free(vin);
    free(q);
    free(k);
    free(v);
    free(rk);
    free(rv);
    free(want);
    free(got);
}

static void test_fused_vs_ref(void)
{
    const struct pair tq3j = {KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3}, tq4 = {KVQ_TYPE_TQ4, KVQ_TYPE_TQ3};
    const struct pair q4 = {KVQ_TYPE_Q4_0, KVQ_TYPE_Q4_0}, jv = {KVQ_TYPE_F16, KVQ_TYPE_TQ3J};
    check_views(tq3j, 16, 1, 0, 70, 2);   /* window alone, small pages */
    check_views(tq3j, 16, 0, 20, 70, 2);  /* sink alone, longer than a page */
    check_views(tq3j, 16, 1, 5, 70, 4);   /* both; sink inside the first page */
    check_views(tq3j, 64, 1, 64, 140, 1); /* default pages, sink = one page */
    check_views(tq4, 32, 1, 40, 100, 3);
    check_views(q4, 16, 1, 3, 50, 2);
    check_views(jv, 16, 1, 7, 50, 2); /* tqBj values: two rotated accumulators merged */
    /* without overrides the view is empty: the packed path runs as before */
    check_views(tq3j, 16, 0, 0, 40, 2);
}

/* n tokens of kin/vin appended to a fresh cache of the same config. */
static kvq_cache *fresh(int P, int recent, int sink, size_t N, const float *kin, const float *vin, size_t n)
{
    kvq_cache *c = make(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 2, 128, P, N, recent, sink, 0);
    if (c && n)
        CHECK_OK(kvq_cache_append(c, n, kin, vin));
    return c;
}

static int same_decode(const kvq_cache *a, const kvq_cache *b, size_t n, const float *q, kvq_attn_workspace *ws)
{
    float oa[2 * 128], ob[2 * 128];
    const float scale = 1.0f / sqrtf(128.0f);
    int same = 1;
    for (int h = 0; h < 2; h++) {
        CHECK_OK(kvq_attn_decode(a, h, n, q, 2, scale, oa, ws));
        CHECK_OK(kvq_attn_decode(b, h, n, q, 2, scale, ob, ws));
        same &= memcmp(oa, ob, sizeof oa) == 0;
    }
    return same;
}

/* Truncation within the page of the last token, a read over a prefix, and
 * reset give exactly the cache that only ever held those tokens; a
 * truncation into an earlier page reads the kept tokens of the partly
 * filled page packed (as documented) and stays consistent: fused =
 * reference. */
static void test_truncate_reset(void)
{
    const int P = 32, sink = 4;
    const size_t N = 200, hd = 2 * 128;
    float *kin = random_rows(N * 2, 128, 21, 1.0), *vin = random_rows(N * 2, 128, 22, 1.0);
    float *k2 = random_rows(N * 2, 128, 23, 1.0);
    float *q = random_rows(2, 128, 24, 3.0);
    kvq_attn_workspace *ws = NULL;
    CHECK_OK(kvq_attn_workspace_create(128, 2, N, &ws));
    /* rollbacks from lengths around page boundaries back to any length in
     * the page of the last token (a full page's start included) */
    const size_t lens[] = {33, 40, 63, 64, 65, 70, 96, 100};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (size_t back = 1; back < lens[li] && lens[li] - back >= (lens[li] - 1) / P * P; back += 3) {
            size_t L = lens[li], n = L - back;
            kvq_cache *c = fresh(P, 1, sink, N, kin, vin, n);
            kvq_cache *ref = fresh(P, 1, sink, N, kin, vin, n);
            if (!c || !ref)
                break;
            /* other tokens appended, then rolled back */
            CHECK_OK(kvq_cache_append(c, back, k2, k2 + hd));
            CHECK_OK(kvq_cache_truncate(c, n));
            CHECKF(same_decode(c, ref, n, q, ws), "rollback %zu -> %zu", L, n);
            /* and growing again gives the same as appending directly */
            CHECK_OK(kvq_cache_append(c, back, kin + n * hd, vin + n * hd));
            kvq_cache *ref2 = fresh(P, 1, sink, N, kin, vin, L);
            CHECKF(same_decode(c, ref2, L, q, ws), "regrow %zu -> %zu -> %zu", L, n, L);
            /* a read over a prefix sees the cache as truncated there */
            CHECKF(same_decode(c, ref, n, q, ws), "prefix view %zu of %zu", n, L);
            kvq_cache_free(c);
            kvq_cache_free(ref);
            kvq_cache_free(ref2);
        }
    /* a deep truncation: from 150 back to 70 (the ring no longer holds 64..69) */
    kvq_cache *c = fresh(P, 1, sink, N, kin, vin, 150), *plain = NULL;
    struct kvq_cache_config pc = *kvq_cache_config_of(c);
    pc.recent_f16 = 0;
    pc.sink_tokens = sink;
    CHECK_OK(kvq_cache_create(&pc, &plain)); /* sink only: what 64..69 now read like */
    if (c && plain) {
        CHECK_OK(kvq_cache_append(plain, 70, kin, vin));
        CHECK_OK(kvq_cache_truncate(c, 70));
        size_t se, tl;
        CHECK_OK(kvq_cache_f16_view(c, 70, &se, &tl));
        CHECK(se == (size_t)sink && tl == 70);
        CHECK(same_decode(c, plain, 70, q, ws));
        /* new tokens of the page get f16 copies again; the kept ones stay packed */
        CHECK_OK(kvq_cache_append(c, 5, kin + 70 * hd, vin + 70 * hd));
        CHECK_OK(kvq_cache_f16_view(c, 75, &se, &tl));
        CHECK(tl == 70);
        float out[256], ref[256];
        const float scale = 1.0f / sqrtf(128.0f);
        CHECK_OK(kvq_attn_decode(c, 1, 75, q, 2, scale, out, ws));
        CHECK_OK(kvq_attn_decode_ref(c, 1, 75, q, 2, scale, ref, ws));
        CHECK(rel_err(out, ref, 256) <= 1e-5);
        /* once the page fills, everything is as in a cache that never truncated */
        CHECK_OK(kvq_cache_append(c, 26, kin + 75 * hd, vin + 75 * hd));
        kvq_cache *ref2 = fresh(P, 1, sink, N, kin, vin, 101);
        CHECK(same_decode(c, ref2, 101, q, ws));
        kvq_cache_free(ref2);
        /* reset: a new sequence of other tokens equals a fresh cache */
        kvq_cache_reset(c);
        CHECK(kvq_cache_len(c) == 0);
        CHECK_OK(kvq_cache_append(c, 45, k2, vin));
        kvq_cache *ref3 = fresh(P, 1, sink, N, k2, vin, 45);
        CHECK(same_decode(c, ref3, 45, q, ws));
        kvq_cache_free(ref3);
    }
    kvq_cache_free(c);
    kvq_cache_free(plain);
    kvq_attn_workspace_free(ws);
    free(kin);
    free(vin);
    free(k2);
    free(q);
}

/* kvq_attn_causal_recent: a chunk over several pages appended at once, each
 * query's page read from the caller's f16 copies, gives bit for bit what
 * appending and attending a page at a time gives (kvq_attn_causal while the
 * ring holds the page), and the decode of generation, token by token, to
 * float rounding; with sinks, key centring and after a deep truncation
 * (copies the ring lost stay packed); bad arguments are refused. */
static void test_causal_recent(void)
{
    const int P = 32, H = 2, d = 128, G = 2;
    const size_t N = 200, hd = (size_t)H * d, qd = (size_t)H * G * d;
    const size_t first = 45, T = 80;
    float *kin = random_rows(N * H, d, 41, 1.0), *vin = random_rows(N * H, d, 42, 1.0);
    float *q = random_rows(T * H * G, d, 43, 3.0);
    float *out = malloc(T * qd * sizeof *out), *page = malloc(T * qd * sizeof *page);
    float *gen = malloc(T * qd * sizeof *gen);
    uint16_t *rk = malloc((P + T) * hd * sizeof *rk), *rv = malloc((P + T) * hd * sizeof *rv);
    float *qg = malloc(T * G * (size_t)d * sizeof *qg), *og = malloc(T * G * (size_t)d * sizeof *og);
    kvq_attn_workspace *ws = NULL;
    CHECK_OK(kvq_attn_workspace_create(d, G, N, &ws));
    const float scale = 1.0f / sqrtf((float)d);
    for (int variant = 0; variant < 3; variant++) { /* plain, sinks + centring, after a deep truncation */
        kvq_cache *c = make(KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, H, d, P, N, 1, variant == 1 ? 4 : 0, 0), *pg = NULL,
                  *g = NULL;
        if (!c)
            break;
        struct kvq_cache_config cfg = *kvq_cache_config_of(c);
        if (variant == 1) { /* and key centring */
            kvq_cache_free(c);
            c = NULL;
            cfg.center_k = 1;
            CHECK_OK(kvq_cache_create(&cfg, &c));
        }
        CHECK_OK(kvq_cache_create(&cfg, &pg));
        CHECK_OK(kvq_cache_create(&cfg, &g));
        if (!c || !pg || !g || !out || !page || !gen || !rk || !rv || !qg || !og)
            goto next;
        /* variant 2: 100 tokens, then back to 45: the ring lost 32..44 */
        for (kvq_cache **x = (kvq_cache *[]){c, pg, g}, **e = x + 3; x < e; x++) {
            CHECK_OK(kvq_cache_append(*x, variant == 2 ? 100 : first, kin, vin));
            if (variant == 2)
                CHECK_OK(kvq_cache_truncate(*x, first));
        }
        size_t se, lo;
        CHECK_OK(kvq_cache_f16_view(c, first, &se, &lo));
        CHECKF(lo == (variant == 2 ? first : first / P * P), "variant %d: the copies before the chunk from %zu", variant,
               lo);
        for (size_t t = lo; t < first; t++)
            for (int h = 0; h < H; h++) {
                memcpy(rk + (t - lo) * hd + (size_t)h * d, kvq_cache_f16_row(c, 0, h, t), (size_t)d * 2);
                memcpy(rv + (t - lo) * hd + (size_t)h * d, kvq_cache_f16_row(c, 1, h, t), (size_t)d * 2);
            }
        kvq_f32_to_f16_n(kin + first * hd, rk + (first - lo) * hd, T * hd);
        kvq_f32_to_f16_n(vin + first * hd, rv + (first - lo) * hd, T * hd);
        const struct kvq_attn_recent rec = {rk, rv, lo, first - lo + T};
        CHECK_OK(kvq_cache_append(c, T, kin + first * hd, vin + first * hd));
        for (int h = 0; h < H; h++) {
            for (size_t t = 0; t < T; t++)
                memcpy(qg + t * G * (size_t)d, q + t * qd + (size_t)h * G * d, G * (size_t)d * sizeof *qg);
            CHECK_OK(kvq_attn_causal_recent(c, h, first, T, qg, G, scale, og, ws, &rec));
            for (size_t t = 0; t < T; t++)
                memcpy(out + t * qd + (size_t)h * G * d, og + t * G * (size_t)d, G * (size_t)d * sizeof *og);
        }
        /* a page at a time (the ring holds the page), and token by token */
        for (size_t t = 0; t < T;) {
            const size_t p = first + t, n = P - p % P < T - t ? P - p % P : T - t;
            CHECK_OK(kvq_cache_append(pg, n, kin + p * hd, vin + p * hd));
            for (int h = 0; h < H; h++) {
                for (size_t i = 0; i < n; i++)
                    memcpy(qg + i * G * (size_t)d, q + (t + i) * qd + (size_t)h * G * d, G * (size_t)d * sizeof *qg);
                CHECK_OK(kvq_attn_causal(pg, h, p, n, qg, G, scale, og, ws));
                for (size_t i = 0; i < n; i++)
                    memcpy(page + (t + i) * qd + (size_t)h * G * d, og + i * G * (size_t)d, G * (size_t)d * sizeof *og);
            }
            t += n;
        }
        for (size_t t = 0; t < T; t++) {
            CHECK_OK(kvq_cache_append(g, 1, kin + (first + t) * hd, vin + (first + t) * hd));
            for (int h = 0; h < H; h++)
                CHECK_OK(kvq_attn_decode(g, h, first + t + 1, q + t * qd + (size_t)h * G * d, G, scale,
                                         gen + t * qd + (size_t)h * G * d, ws));
        }
        CHECKF(!memcmp(out, page, T * qd * sizeof *out), "variant %d: a chunk at once differs from a page at a time",
               variant);
        const double e = rel_err(out, gen, T * qd);
        printf("  variant %d: 80 positions over 4 pages at once = a page at a time; vs generation rel err %.2g\n",
               variant, e);
        CHECK(e <= 1e-5);
        /* refusals: no rows, rows that start past the chunk or end short, no window */
        struct kvq_attn_recent r2 = rec;
        CHECK_STATUS(kvq_attn_causal_recent(c, 0, first, T, qg, G, scale, og, ws, NULL), KVQ_ERR_INVALID_ARG);
        r2.pos = first + 1;
        CHECK_STATUS(kvq_attn_causal_recent(c, 0, first, T, qg, G, scale, og, ws, &r2), KVQ_ERR_INVALID_ARG);
        r2 = rec;
        r2.n--;
        CHECK_STATUS(kvq_attn_causal_recent(c, 0, first, T, qg, G, scale, og, ws, &r2), KVQ_ERR_INVALID_ARG);
        r2 = rec;
        r2.v = NULL;
        CHECK_STATUS(kvq_attn_causal_recent(c, 0, first, T, qg, G, scale, og, ws, &r2), KVQ_ERR_INVALID_ARG);
    next:
        kvq_cache_free(c);
        kvq_cache_free(pg);
        kvq_cache_free(g);
    }
    kvq_cache *plain = fresh(P, 0, 0, N, kin, vin, 60);
    const struct kvq_attn_recent r3 = {rk, rv, 0, 60};
    if (plain && qg && og)
        CHECK_STATUS(kvq_attn_causal_recent(plain, 0, 0, 60, qg, G, scale, og, ws, &r3), KVQ_ERR_INVALID_ARG);
    kvq_cache_free(plain);
    kvq_attn_workspace_free(ws);
    free(kin);
    free(vin);
    free(q);
    free(out);
    free(page);
    free(gen);
    free(rk);
    free(rv);
    free(qg);
    free(og);
}

/* The buffers are counted in bytes_allocated, kvq_cache_bytes_for and
 * against max_bytes, which is never exceeded; reserve is all-or-nothing. */
static void test_budget(void)
{
    const int H = 2, d = 128, P = 64, sink = 32;
    const size_t N = 4096, hd = (size_t)H * d;
    struct kvq_cache_config cfg;
    kvq_cache_config_default(&cfg, H, d, N);
    cfg.recent_f16 = 1;
    cfg.sink_tokens = sink;
    const size_t buf = (size_t)(P + sink) * hd * 2 * 2; /* rows x K,V x 2 bytes */
    const size_t page = kvq_cache_bytes_for(&cfg, 1) - buf;
    struct kvq_cache_config off = cfg;
    off.recent_f16 = off.sink_tokens = 0;
    CHECK(kvq_cache_bytes_for(&off, 1) == page);
    CHECK(kvq_cache_bytes_for(&cfg, 0) == buf);
    CHECK(kvq_cache_bytes_for(&cfg, 200) == 4 * page + buf);
    /* short caches hold no more rows than tokens */
    struct kvq_cache_config sh = cfg;
    sh.max_tokens = 20;
    CHECK(kvq_cache_bytes_for(&sh, 0) == 2 * 20 * hd * 2 * 2);

    cfg.max_bytes = buf + 3 * page + page / 2;
    kvq_cache *c = NULL;
    CHECK_OK(kvq_cache_create(&cfg, &c));
    float *k = random_rows(N * H, d, 31, 1.0), *v = random_rows(N * H, d, 32, 1.0);
    struct kvq_cache_stats st;
    kvq_cache_get_stats(c, &st);
    CHECK(st.bytes_f16_buffers == buf && st.bytes_allocated == buf && st.pages == 0);
    CHECK_STATUS(kvq_cache_reserve(c, 4 * (size_t)P), KVQ_ERR_BUDGET);
    kvq_cache_get_stats(c, &st);
    CHECK(st.pages == 0); /* nothing allocated by the refused reserve */
    CHECK_STATUS(kvq_cache_reserve(c, N + 1), KVQ_ERR_CONTEXT_FULL);
    CHECK_OK(kvq_cache_reserve(c, 2 * (size_t)P + 1));
    kvq_cache_get_stats(c, &st);
    CHECK(st.pages == 3 && st.tokens == 0 && st.bytes_allocated == 3 * page + buf);
    size_t n = 0;
    for (;;) {
        kvq_status s = kvq_cache_append(c, 7, k + n * hd, v + n * hd);
        kvq_cache_get_stats(c, &st);
        CHECK(st.bytes_allocated <= cfg.max_bytes);
        if (s != KVQ_OK) {
            CHECK_STATUS(s, KVQ_ERR_BUDGET);
            break;
        }
        n += 7;
    }
    CHECK(n == 3 * (size_t)P / 7 * 7 && kvq_cache_len(c) == n);
    kvq_cache_free(c);
    /* a budget below the buffers holds nothing, and says so */
    cfg.max_bytes = buf - 1;
    CHECK_OK(kvq_cache_create(&cfg, &c));
    CHECK_STATUS(kvq_cache_append(c, 1, k, v), KVQ_ERR_BUDGET);
    kvq_cache_free(c);
    /* a row that gets an f16 copy must fit f16; nothing changes on refusal */
    cfg.max_bytes = 0;
    CHECK_OK(kvq_cache_create(&cfg, &c));
    CHECK_OK(kvq_cache_append(c, 3, k, v));
    k[3 * hd + 17] = 70000.0f;
    CHECK_STATUS(kvq_cache_append(c, 2, k + 2 * hd, v + 2 * hd), KVQ_ERR_RANGE);
    CHECK(kvq_cache_len(c) == 3);
    kvq_cache_free(c);
    free(k);
    free(v);
}

static void test_bad_config(void)
{
    struct kvq_cache_config cfg;
    kvq_cache_config_default(&cfg, 2, 128, 100);
    CHECK(cfg.recent_f16 == 0 && cfg.sink_tokens == 0);
    kvq_cache *c = NULL;
    const int bad[][2] = {{2, 0}, {-1, 0}, {0, -1}, {0, KVQ_CACHE_MAX_SINK_TOKENS + 1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct kvq_cache_config b = cfg;
        b.recent_f16 = bad[i][0];
        b.sink_tokens = bad[i][1];
        CHECK_STATUS(kvq_cache_create(&b, &c), KVQ_ERR_INVALID_ARG);
        CHECK(kvq_cache_bytes_for(&b, 10) == 0);
    }
    cfg.sink_tokens = KVQ_CACHE_MAX_SINK_TOKENS;
    CHECK_OK(kvq_cache_create(&cfg, &c));
    size_t se, tl;
    CHECK_STATUS(kvq_cache_f16_view(c, 1, &se, &tl), KVQ_ERR_INVALID_ARG); /* beyond len */
    CHECK(kvq_cache_f16_row(c, 0, 0, 0) == NULL);
    CHECK_STATUS(kvq_cache_reserve(NULL, 1), KVQ_ERR_INVALID_ARG);
    kvq_cache_free(c);

    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    kvq_seq *s = NULL;
    kvq_error err = {0};
    struct kvq_seq_plan pl;
    sc.recent_f16 = 3;
    CHECK_STATUS(kvq_seq_create(model, &sc, &s, &err), KVQ_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "recent_f16") != NULL);
    CHECK_STATUS(kvq_seq_plan_of(model, &sc, &pl), KVQ_ERR_INVALID_ARG);
    sc.recent_f16 = 0;
    sc.sink_tokens = -4;
    CHECK_STATUS(kvq_seq_create(model, &sc, &s, &err), KVQ_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "sink_tokens") != NULL);
    CHECK_STATUS(kvq_seq_plan_of(model, &sc, &pl), KVQ_ERR_INVALID_ARG);
    sc.sink_tokens = 0;
    sc.center_k = 1; /* key centering without the window: its keys could not wait for their page */
    CHECK_STATUS(kvq_seq_create(model, &sc, &s, &err), KVQ_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "center_k") != NULL);
    CHECK_STATUS(kvq_seq_plan_of(model, &sc, &pl), KVQ_ERR_INVALID_ARG);
    CHECK(s == NULL);
}

static kvq_seq *seq(int recent, int sink, int max_chunk, size_t budget)
{
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.recent_f16 = recent;
    sc.sink_tokens = sink;
    sc.max_chunk = max_chunk;
    sc.kv_budget = budget;
    sc.max_ctx = 1024;
    kvq_seq *s = NULL;
    kvq_error err = {0};
    kvq_status st = kvq_seq_create(model, &sc, &s, &err);
    CHECKF(st == KVQ_OK, "seq: %s", err.msg);
    return s;
}

static int32_t *text_ids(size_t n, uint64_t seed)
{
    int32_t *ids = malloc(n * sizeof *ids);
    kvq_rng rng;
    kvq_rng_init(&rng, seed);
    const int vocab = kvq_model_config_of(model)->vocab;
    ids[0] = kvq_model_config_of(model)->bos_id;
    for (size_t i = 1; i < n; i++) /* a repeated phrase with noise: drafts get accepted */
        ids[i] = i % 23 < 17 ? (int32_t)(100 + i % 23 * 7) : (int32_t)(kvq_rng_next(&rng) % (uint64_t)vocab);
    return ids;
}

/* A prefill in chunks (interleaved append/attend) gives the logits of
 * token-by-token generation bit for bit (chunks of <= 16 use the same
 * batch-invariant matrix kernel); the window changes them (the test can
 * fail); speculative decoding equals plain decoding. */
static void test_prefill_is_generation(void)
{
    const size_t n = 150;
    const int vocab = kvq_model_config_of(model)->vocab;
    int32_t *ids = text_ids(n, 41);
    float *a = malloc(n * (size_t)vocab * sizeof *a), *b = malloc(n * (size_t)vocab * sizeof *b);
    float *o = malloc(n * (size_t)vocab * sizeof *o);
    kvq_seq *chunked = seq(1, 8, 16, 0), *single = seq(1, 8, 16, 0), *nowin = seq(0, 8, 16, 0);
    if (!chunked || !single || !nowin)
        goto out;
    CHECK_OK(kvq_seq_forward(chunked, ids, n, 0, a, NULL));
    for (size_t i = 0; i < n; i++)
        CHECK_OK(kvq_seq_forward(single, ids + i, 1, 0, b + i * (size_t)vocab, NULL));
    CHECK(memcmp(a, b, n * (size_t)vocab * sizeof *a) == 0);
    CHECK_OK(kvq_seq_forward(nowin, ids, n, 0, o, NULL));
    /* the window changes what position 70 sees (tokens 64..70 in f16) */
    CHECK(memcmp(a + 70 * (size_t)vocab, o + 70 * (size_t)vocab, (size_t)vocab * sizeof *a) != 0);
    /* speculative decoding (verify passes roll back up to 15 tokens) = plain */
    enum { G = 80 };
    int32_t plain[G], spec[G];
    size_t np = 0, ns = 0;
    struct kvq_gen_params gp;
    kvq_gen_params_default(&gp);
    gp.max_tokens = G;
    gp.stop_at_eos = 0;
    kvq_seq_reset(single);
    CHECK_OK(kvq_seq_generate(single, ids, 100, &gp, plain, G, &np, NULL, NULL));
    gp.speculative = KVQ_MAX_DRAFT;
    kvq_seq_reset(chunked);
    CHECK_OK(kvq_seq_generate(chunked, ids, 100, &gp, spec, G, &ns, NULL, NULL));
    struct kvq_seq_stats st;
    kvq_seq_get_stats(chunked, &st);
    CHECK(np == G && ns == G && memcmp(plain, spec, sizeof plain) == 0);
    printf("  speculative with the window: %zu of %zu drafts accepted, output = plain\n", st.accepted, st.drafted);
    /* The default chunk (sgemm instead of the few-row kernel) rounds the
     * projections differently, which flips some codes, by how much depends on
     * the BLAS kernels of the machine. What holds everywhere: those flips cost
     * a small part (<= 1/4) of what the codec itself costs against an f16
     * cache, and the window (recent tokens in f16) lowers the codec's cost. */
    float *r = malloc(n * (size_t)vocab * sizeof *r);
    struct kvq_seq_config fc;
    kvq_seq_config_default(&fc);
    fc.type_k = fc.type_v = KVQ_TYPE_F16;
    fc.max_ctx = 1024;
    kvq_seq *f16 = NULL;
    kvq_error ferr = {0};
    CHECKF(kvq_seq_create(model, &fc, &f16, &ferr) == KVQ_OK, "f16 seq: %s", ferr.msg);
    if (!r || !f16)
        goto out_f16;
    CHECK_OK(kvq_seq_forward(f16, ids, n, 0, r, NULL));
    double e_codec[2] = {0, 0};
    for (int w = 1; w >= 0; w--) {
        kvq_seq *big = seq(w, 8, 0, 0), *one = seq(w, 8, 16, 0);
        if (big && one) {
            CHECK_OK(kvq_seq_forward(big, ids, n, 0, o, NULL));
            for (size_t i = 0; i < n; i++)
                CHECK_OK(kvq_seq_forward(one, ids + i, 1, 0, b + i * (size_t)vocab, NULL));
            const double e_chunk = rel_err(o, b, n * (size_t)vocab);
            e_codec[w] = rel_err(b, r, n * (size_t)vocab);
            printf("  window %d: chunk 256 vs token by token: logits rel err %.3g (the codec vs f16: %.3g)\n", w,
                   e_chunk, e_codec[w]);
            CHECK(e_chunk <= 0.25 * e_codec[w]);
        }
        kvq_seq_free(big);
        kvq_seq_free(one);
    }
    CHECK(e_codec[1] < e_codec[0]);
out_f16:
    kvq_seq_free(f16);
    free(r);
out:
    kvq_seq_free(chunked);
    kvq_seq_free(single);
    kvq_seq_free(nowin);
    free(ids);
    free(a);
    free(b);
    free(o);
}

/* The chunk a plan resolves to: the config's, or the device's default (256
 * rows on the CPU, thousands on the GPU), at most the context and at least
 * a verify pass; the device's working memory for it is none on the CPU and,
 * in a build with CUDA (no device needed), grows with the chunk. */
static void test_plan_chunk(void)
{
    const size_t ctx = (size_t)kvq_model_config_of(model)->max_ctx; /* 4096 */
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    struct kvq_seq_plan pl;
    CHECK_OK(kvq_seq_plan_of(model, &sc, &pl));
    CHECKF(pl.max_chunk == KVQ_DEFAULT_MAX_CHUNK && pl.work_bytes == 0, "%zu rows, %zu bytes", pl.max_chunk,
           pl.work_bytes);
    sc.device = KVQ_DEVICE_CUDA;
    CHECK(kvq_default_max_chunk(KVQ_DEVICE_CUDA) > (int)ctx); /* so the context caps it */
    CHECK_OK(kvq_seq_plan_of(model, &sc, &pl));
    CHECKF(pl.max_chunk == ctx, "%zu rows", pl.max_chunk);
    const size_t w_ctx = pl.work_bytes;
    sc.max_ctx = 1000;
    CHECK_OK(kvq_seq_plan_of(model, &sc, &pl));
    CHECK(pl.max_chunk == 1000);
    sc.max_chunk = 100;
    CHECK_OK(kvq_seq_plan_of(model, &sc, &pl));
    CHECK(pl.max_chunk == 100);
    const size_t w_100 = pl.work_bytes;
    CHECKF(w_100 < w_ctx || (w_100 == 0 && w_ctx == 0), "%zu bytes at 100 rows, %zu at %zu", w_100, w_ctx, ctx);
    sc.max_chunk = 1;
    sc.device = KVQ_DEVICE_CPU;
    CHECK_OK(kvq_seq_plan_of(model, &sc, &pl));
    CHECK(pl.max_chunk == KVQ_MAX_DRAFT + 1 && pl.work_bytes == 0);
}

/* Budgets with the buffers: the plan equals what the sequence holds, the
 * allocation never exceeds the budget, and a refused forward changes
 * nothing (the next logits equal those of a sequence that never saw it). */
static void test_seq_budget(void)
{
    const int vocab = kvq_model_config_of(model)->vocab;
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.recent_f16 = 1;
    sc.sink_tokens = 16;
    sc.max_ctx = 1024;
    struct kvq_seq_plan pl;
    CHECK_OK(kvq_seq_plan_of(model, &sc, &pl));
    /* one page of window rows and the sinks, K and V, in each of 4 layers */
    CHECK(pl.fixed_bytes == 4 * (size_t)(64 + 16) * 2 * 128 * 2 * 2);
    /* a GPU sequence's plan (kvq_cuda_cache_f16_bytes: no device needed)
     * counts the device's ring, which is the host's: the same budget holds
     * the same three pages a layer */
    struct kvq_seq_plan gp;
    sc.device = KVQ_DEVICE_CUDA;
    sc.fast_prefill = 0; /* exact products: the comparisons are against f32 references */
    CHECK_OK(kvq_seq_plan_of(model, &sc, &gp));
    CHECK(gp.fixed_bytes == pl.fixed_bytes);
    CHECK(gp.bytes_per_token == pl.bytes_per_token && gp.page_bytes == pl.page_bytes);
    sc.kv_budget = pl.fixed_bytes + 4 * 3 * pl.page_bytes + 1000;
    CHECK_OK(kvq_seq_plan_of(model, &sc, &gp));
    CHECKF(gp.max_tokens == 3 * gp.page_tokens, "%zu tokens", gp.max_tokens);
    sc.device = KVQ_DEVICE_CPU;
    sc.kv_budget = pl.fixed_bytes + 4 * 3 * pl.page_bytes + 1000; /* three pages per layer */
    CHECK_OK(kvq_seq_plan_of(model, &sc, &pl));
    CHECK(pl.max_tokens == 3 * pl.page_tokens);
    kvq_seq *s = seq(1, 16, 0, sc.kv_budget), *t = seq(1, 16, 0, sc.kv_budget);
    int32_t *ids = text_ids(400, 51);
    float *la = malloc(2 * (size_t)vocab * sizeof *la), *lb = malloc(2 * (size_t)vocab * sizeof *lb);
    if (!s || !t)
        goto out;
    struct kvq_seq_stats st;
    CHECK_OK(kvq_seq_forward(s, ids, 100, 0, NULL, NULL));
    CHECK_OK(kvq_seq_forward(t, ids, 100, 0, NULL, NULL));
    /* 100 more do not fit (192 tokens): refused before anything is appended */
    CHECK_STATUS(kvq_seq_forward(s, ids + 100, 100, 0, NULL, NULL), KVQ_ERR_BUDGET);
    kvq_seq_get_stats(s, &st);
    CHECK(st.tokens == 100 && st.kv_bytes_alloc <= sc.kv_budget);
    CHECK(st.kv_bytes_f16_buffers == pl.fixed_bytes);
    CHECK_OK(kvq_seq_forward(s, ids + 100, 2, 0, la, NULL));
    CHECK_OK(kvq_seq_forward(t, ids + 100, 2, 0, lb, NULL));
    CHECK(memcmp(la, lb, 2 * (size_t)vocab * sizeof *la) == 0);
    size_t held = 102;
    while (kvq_seq_forward(s, ids + held, 1, 0, NULL, NULL) == KVQ_OK)
        held++;
    kvq_seq_get_stats(s, &st);
    CHECK(held == pl.max_tokens && st.kv_bytes_alloc <= sc.kv_budget);
out:
    kvq_seq_free(s);
    kvq_seq_free(t);
    free(ids);
    free(la);
    free(lb);
}

int main(void)
{
    kvq_error err = {0};
    if (kvq_model_load(TEST_MODEL_DIR, NULL, &model, &err) != KVQ_OK) {
        fprintf(stderr, "test_cache_window: %s\n", err.msg);
        return 1;
    }
    RUN(test_fused_vs_ref);
    RUN(test_truncate_reset);
    RUN(test_causal_recent);
    RUN(test_budget);
    RUN(test_bad_config);
    RUN(test_prefill_is_generation);
    RUN(test_seq_budget);
    RUN(test_plan_chunk);
    kvq_model_free(model);
    return TEST_END("test_cache_window");
}
