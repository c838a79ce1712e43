/* test_batch_share.c - prefix sharing (kvq_batch_share, kvq_cache_share):
 * sequences that share the pages of a common prompt prefix compute exactly
 * what each computes alone (bitwise logits against a kvq_seq per sequence,
 * the independent reference), hold the prefix once (pages_used below the
 * unshared count, a step that fits only with sharing), never write a page
 * another holds (copy on write after a truncation into it), and give back
 * only their own references when removed mid-way; all pages return at the
 * end. */
#include <stdint.h>

#include "kvq_batch.h"
#include "kvq_cache.h"
#include "kvq_model.h"
#include "kvq_rng.h"
#include "test.h"

#define N_SEQS 4
#define GEN 6
#define CHUNK 256
#define PREFIX 552               /* two whole chunks and 40 tokens */
#define SHARED (PREFIX / CHUNK * CHUNK) /* what the sharers take: the whole chunks */

static kvq_model *model;
static const size_t suffix_len[N_SEQS] = {30, 260, 1, 45};
static int32_t *prompts[N_SEQS];
static size_t prompt_len[N_SEQS];

static size_t vocab(void)
{
    return (size_t)kvq_model_config_of(model)->vocab;
}

/* Greedy token of logits (lowest id on ties). */
static int32_t argmax_of(const float *lg)
{
    int32_t best = 0;
    for (size_t i = 1; i < vocab(); i++)
        if (lg[i] > lg[best])
            best = (int32_t)i;
    return best;
}

/* Sequence i alone through kvq_seq (prefill in chunks of CHUNK, then one
 * token per forward): the logits of its GEN greedy tokens, [GEN][vocab]. */
static void run_solo(const struct kvq_seq_config *sc, int i, float *lg)
{
    kvq_seq *s = NULL;
    CHECK_OK(kvq_seq_create(model, sc, &s, NULL));
    if (!s)
        return;
    CHECK_OK(kvq_seq_forward(s, prompts[i], prompt_len[i], prompt_len[i] - 1, lg, NULL));
    for (int g = 1; g < GEN; g++) {
        int32_t t = argmax_of(lg + (g - 1) * vocab());
        CHECK_OK(kvq_seq_forward(s, &t, 1, 0, lg + g * vocab(), NULL));
    }
    kvq_seq_free(s);
}

struct shared_run {
    float *logits[N_SEQS];   /* [GEN][vocab] */
    struct kvq_batch_stats prefilled; /* once every prompt is in */
    size_t freed_by_cancel;  /* pages the cancelled source gave back */
    size_t shared_after_cancel;
};

/* Sequence 0 prefills its prompt; once it holds SHARED tokens the others
 * join by sharing them (share = 1) or prefill everything themselves
 * (share = 0), in CHUNK-aligned chunks either way, then everyone decodes
 * greedily. With cancel, sequence 0 (the source of the shared pages) is
 * removed after its second token. */
static void run_batch(const struct kvq_seq_config *sc, int share, int cancel, struct shared_run *o)
{
    struct kvq_batch_config bc;
    kvq_batch_config_default(&bc);
    bc.seq = *sc;
    bc.max_seqs = N_SEQS;
    bc.max_rows = CHUNK + N_SEQS;
    kvq_batch *b = NULL;
    kvq_error err = {0};
    CHECK_OK(kvq_batch_create(model, &bc, &b, &err));
    if (!b)
        return;
    struct kvq_batch_stats st;
    kvq_batch_get_stats(b, &st);
    CHECK(SHARED % st.page_tokens == 0);
    int slot[N_SEQS], gen[N_SEQS] = {0}, joined = 1, gone = 0, all_in = 0;
    size_t done[N_SEQS] = {0};
    CHECK_OK(kvq_batch_add(b, &slot[0]));
    for (int step = 0; step < 100; step++) {
        if (joined == 1 && done[0] >= SHARED) {
            for (; joined < N_SEQS; joined++) {
                CHECK_OK(kvq_batch_add(b, &slot[joined]));
                if (share) {
                    CHECK_OK(kvq_batch_share(b, slot[joined], slot[0], SHARED, &err));
                    done[joined] = SHARED;
                }
            }
        }
        struct kvq_batch_item items[N_SEQS];
        int32_t next[N_SEQS], am[N_SEQS];
        int n = 0;
        size_t rows = 0;
        for (int i = 0; i < joined; i++)
            if (!(gone & 1 << i) && done[i] == prompt_len[i] && gen[i] > 0 && gen[i] < GEN) {
                next[i] = argmax_of(o->logits[i] + (gen[i] - 1) * vocab());
                items[n++] = (struct kvq_batch_item){slot[i], &next[i], 1, o->logits[i] + gen[i] * vocab(), &am[i], NULL, NULL, 0};
                rows++;
            }
        for (int i = 0; i < joined; i++)
            if (done[i] < prompt_len[i]) {
                size_t c = prompt_len[i] - done[i] < CHUNK ? prompt_len[i] - done[i] : CHUNK;
                if (c > bc.max_rows - rows)
                    continue;
                int last = done[i] + c == prompt_len[i];
                items[n++] = (struct kvq_batch_item){slot[i], prompts[i] + done[i], c, last ? o->logits[i] : NULL,
                                                     last ? &am[i] : NULL, NULL, NULL, 0};
                rows += c;
            }
        if (n == 0)
            break;
        CHECK_OK(kvq_batch_step(b, items, n, &err));
        for (int k = 0; k < n; k++) {
            int i = 0;
            while (slot[i] != items[k].slot)
                i++;
            if (done[i] < prompt_len[i])
                done[i] += items[k].n;
            if (items[k].logits)
                gen[i]++;
        }
        if (!all_in && joined == N_SEQS) {
            all_in = 1;
            for (int i = 0; i < N_SEQS; i++)
                all_in &= done[i] == prompt_len[i];
            if (all_in)
                kvq_batch_get_stats(b, &o->prefilled);
        }
        if (cancel && !(gone & 1) && gen[0] == 2) {
            struct kvq_batch_stats before, after;
            kvq_batch_get_stats(b, &before);
            kvq_batch_remove(b, slot[0]);
            kvq_batch_get_stats(b, &after);
            o->freed_by_cancel = before.pages_used - after.pages_used;
            o->shared_after_cancel = after.pages_shared;
            gone |= 1;
        }
    }
    for (int i = 0; i < N_SEQS; i++)
        CHECKF(gen[i] == ((gone & 1 << i) ? 2 : GEN), "sequence %d made %d tokens", i, gen[i]);
    for (int i = 0; i < N_SEQS; i++)
        kvq_batch_remove(b, slot[i]);
    kvq_batch_get_stats(b, &st);
    CHECKF(st.pages_used == 0 && st.pages_shared == 0 && st.page_refs == 0, "after all finish: %zu pages used, %zu shared",
           st.pages_used, st.pages_shared);
    if (sc->device == KVQ_DEVICE_CPU) /* host caches count their f16 buffers as allocated */
        CHECKF(st.bytes_allocated == st.fixed_bytes, "after all finish: %zu bytes allocated, %zu fixed",
               st.bytes_allocated, st.fixed_bytes);
    kvq_batch_free(b);
}

/* The shared run against the unshared one, the run whose source is
 * cancelled and each sequence alone. On the CPU all logits are bit for bit
 * the same. On the GPU the greedy tokens agree, and with a 16-bit cache the
 * logits are within 1e-4 x the top logit of the unshared run's: the runs
 * batch different rows per step (a sharer skips its prefill), and the GPU
 * kernels split other batch sizes otherwise, which moves the last bits.
 * A compressed cache turns those bits into more: a code is a step function
 * of its row, so a row on a step's edge takes the next level in one run and
 * not in the other, and every later token sees it. Measured on an H200
 * without the window (tq3j/tq3, tq3/tq3, q8_0/q8_0; 0 and 4 sinks): from
 * 6e-6 to 3e-2 x the top logit on either prefill kernel, the size set by
 * which row flips, where the solo and unshared runs of that sequence were
 * bit for bit equal; f16/f16 4e-5 and 6e-5. So a compressed cache's logits
 * are printed, not bounded (logit_bound < 0). The page counts are the same
 * on both. */
static void compare(const struct kvq_seq_config *sc, double logit_bound)
{
    const size_t V = vocab();
    float *solo[N_SEQS];
    struct shared_run sh = {0}, un = {0}, cn = {0};
    for (int i = 0; i < N_SEQS; i++) {
        solo[i] = calloc(GEN * V, sizeof(float));
        sh.logits[i] = calloc(GEN * V, sizeof(float));
        un.logits[i] = calloc(GEN * V, sizeof(float));
        cn.logits[i] = calloc(GEN * V, sizeof(float));
        run_solo(sc, i, solo[i]);
    }
    run_batch(sc, 1, 0, &sh);
    run_batch(sc, 0, 0, &un);
    run_batch(sc, 1, 1, &cn);
    double worst = 0;
    for (int i = 0; i < N_SEQS; i++) {
        const int n = i ? GEN : 2; /* the cancelled source made 2 tokens, the others all of theirs */
        if (sc->device == KVQ_DEVICE_CPU) {
            CHECKF(memcmp(solo[i], sh.logits[i], GEN * V * sizeof(float)) == 0, "sequence %d: shared logits differ",
                   i);
            CHECKF(memcmp(solo[i], un.logits[i], GEN * V * sizeof(float)) == 0,
                   "sequence %d: unshared logits differ", i);
            CHECKF(memcmp(solo[i], cn.logits[i], n * V * sizeof(float)) == 0,
                   "sequence %d: logits differ after the source was cancelled", i);
            continue;
        }
        for (int g = 0; g < GEN; g++) {
            const float *u = un.logits[i] + g * V, *x = sh.logits[i] + g * V;
            const double top = fabs(u[argmax_of(u)]);
            for (size_t j = 0; j < V; j++) {
                const double e = fabs((double)x[j] - u[j]) / (top > 0 ? top : 1);
                worst = e > worst ? e : worst;
            }
            const int32_t a = argmax_of(solo[i] + g * V), c = g < n ? argmax_of(cn.logits[i] + g * V) : a;
            CHECKF(a == argmax_of(x) && a == c, "sequence %d token %d: solo %d, shared %d, source cancelled %d", i, g,
                   a, argmax_of(x), c);
        }
    }
    if (logit_bound >= 0)
        CHECKF(worst <= logit_bound, "shared vs unshared logits: %.3g x the top logit", worst);
    const size_t P = sh.prefilled.page_tokens, k = SHARED / P;
    size_t refs = 0;
    for (int i = 0; i < N_SEQS; i++)
        refs += (prompt_len[i] + P - 1) / P;
    printf("  %s prompts in: %zu pages used shared, %zu unshared (%zu shared pages); logits vs unshared %.2g\n",
           sc->device == KVQ_DEVICE_CPU ? "CPU" : "GPU", sh.prefilled.pages_used, un.prefilled.pages_used,
           sh.prefilled.pages_shared, worst);
    CHECK(un.prefilled.pages_used == refs && un.prefilled.pages_shared == 0 && un.prefilled.page_refs == refs);
    CHECK(sh.prefilled.page_refs == refs && sh.prefilled.pages_shared == k);
    CHECK(sh.prefilled.pages_used == refs - (N_SEQS - 1) * k);
    if (sc->device == KVQ_DEVICE_CPU) {
        CHECK(sh.prefilled.bytes_allocated < un.prefilled.bytes_allocated);
        CHECK(un.prefilled.bytes_allocated - sh.prefilled.bytes_allocated ==
              (N_SEQS - 1) * k * sh.prefilled.page_bytes);
    }
    /* the source gave back only its own pages: the shared ones stay */
    CHECKF(cn.freed_by_cancel == (prompt_len[0] + 1 + P - 1) / P - k && cn.shared_after_cancel == k,
           "cancel freed %zu pages, %zu shared remain", cn.freed_by_cancel, cn.shared_after_cancel);
    for (int i = 0; i < N_SEQS; i++) {
        free(solo[i]);
        free(sh.logits[i]);
        free(un.logits[i]);
        free(cn.logits[i]);
    }
}

/* tq3j/tq3 with the recent f16 window (the default). */
static void test_shared_identical_compressed(void)
{
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    compare(&sc, 0);
}

/* q8_0 with f16 sink tokens and no window: the sink rows travel with the share. */
static void test_shared_identical_sinks(void)
{
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.type_k = sc.type_v = KVQ_TYPE_Q8_0;
    sc.recent_f16 = 0;
    sc.sink_tokens = 4;
    compare(&sc, 0);
}

/* A q8_0 pool without the window: page counts that are easy to follow. */
static struct kvq_batch_config q8_batch(int max_seqs, int max_rows)
{
    struct kvq_batch_config bc;
    kvq_batch_config_default(&bc);
    bc.max_seqs = max_seqs;
    bc.max_rows = max_rows;
    bc.seq.type_k = bc.seq.type_v = KVQ_TYPE_Q8_0;
    bc.seq.recent_f16 = 0;
    return bc;
}

/* A pool that holds the prompts only with sharing. */
/* A batch of config bc whose budget holds exactly `pages` pages past the
 * slots' f16 buffers; NULL (a check failed) when it cannot be made. */
static kvq_batch *batch_of_pages(struct kvq_batch_config bc, size_t pages, struct kvq_batch_stats *st)
{
    kvq_batch *b = NULL;
    CHECK_OK(kvq_batch_create(model, &bc, &b, NULL));
    if (!b)
        return NULL;
    kvq_batch_get_stats(b, st);
    kvq_batch_free(b);
    bc.seq.kv_budget = st->fixed_bytes + pages * st->page_bytes + st->page_bytes / 2;
    b = NULL;
    CHECK_OK(kvq_batch_create(model, &bc, &b, NULL));
    if (b)
        kvq_batch_get_stats(b, st);
    CHECKF(!b || st->pages_total == pages, "a budget of %zu pages holds %zu", pages, st->pages_total);
    return b;
}

static void test_budget(void)
{
    struct kvq_batch_stats st;
    kvq_batch *b = batch_of_pages(q8_batch(3, 600), 6, &st); /* 4 prefix pages + 1 each for two more */
    if (!b)
        return;
    const size_t P = st.page_tokens;
    int s[3];
    for (int i = 0; i < 3; i++)
        CHECK_OK(kvq_batch_add(b, &s[i]));
    struct kvq_batch_item it = {s[0], prompts[0], 4 * P, NULL, NULL, NULL, NULL, 0};
    CHECK_OK(kvq_batch_step(b, &it, 1, NULL));
    struct kvq_batch_item two[2] = {{s[1], prompts[1], 4 * P + 1, NULL, NULL, NULL, NULL, 0}, {s[2], prompts[2], 4 * P + 1, NULL, NULL, NULL, NULL, 0}};
    CHECK_STATUS(kvq_batch_step(b, two, 2, NULL), KVQ_ERR_BUDGET); /* unshared: 4 + 10 pages */
    CHECK_OK(kvq_batch_share(b, s[1], s[0], 4 * P, NULL));
    CHECK_OK(kvq_batch_share(b, s[2], s[0], 4 * P, NULL));
    two[0] = (struct kvq_batch_item){s[1], prompts[1], 1, NULL, NULL, NULL, NULL, 0};
    two[1] = (struct kvq_batch_item){s[2], prompts[2], 1, NULL, NULL, NULL, NULL, 0};
    CHECK_OK(kvq_batch_step(b, two, 2, NULL));
    kvq_batch_get_stats(b, &st);
    CHECK(st.pages_used == 6 && st.pages_shared == 4 && st.page_refs == 14);
    CHECK(kvq_batch_len(b, s[1]) == 4 * P + 1 && kvq_batch_len(b, s[0]) == 4 * P);
    /* the pool is full: the source cannot grow, removing it frees nothing */
    it = (struct kvq_batch_item){s[0], prompts[0], 1, NULL, NULL, NULL, NULL, 0};
    CHECK_STATUS(kvq_batch_step(b, &it, 1, NULL), KVQ_ERR_BUDGET);
    kvq_batch_remove(b, s[0]);
    kvq_batch_get_stats(b, &st);
    CHECK(st.pages_used == 6 && st.pages_shared == 4);
    kvq_batch_remove(b, s[1]);
    kvq_batch_get_stats(b, &st);
    CHECK(st.pages_used == 5 && st.pages_shared == 0 && st.bytes_allocated == 5 * st.page_bytes);
    kvq_batch_remove(b, s[2]);
    kvq_batch_get_stats(b, &st);
    CHECK(st.pages_used == 0 && st.bytes_allocated == 0);
    kvq_batch_free(b);
}

/* A sharer truncated into a shared page copies it before writing: its
 * logits are those of a slot that held the same bytes alone, the source's
 * next logits are unchanged, and the copy is one more page. */
static void copy_on_write(struct kvq_batch_config bc)
{
    kvq_batch *b = NULL;
    CHECK_OK(kvq_batch_create(model, &bc, &b, NULL));
    if (!b)
        return;
    struct kvq_batch_stats st;
    kvq_batch_get_stats(b, &st);
    const size_t P = st.page_tokens, V = vocab();
    int src, sh, ref_src, ref_sh;
    CHECK_OK(kvq_batch_add(b, &src));
    CHECK_OK(kvq_batch_add(b, &sh));
    CHECK_OK(kvq_batch_add(b, &ref_src));
    CHECK_OK(kvq_batch_add(b, &ref_sh));
    /* the source and two references that hold the same bytes unshared */
    struct kvq_batch_item three[3] = {{src, prompts[0], 2 * P, NULL, NULL, NULL, NULL, 0},
                                      {ref_src, prompts[0], 2 * P, NULL, NULL, NULL, NULL, 0},
                                      {ref_sh, prompts[0], 2 * P, NULL, NULL, NULL, NULL, 0}};
    for (int i = 0; i < 3; i++)
        CHECK_OK(kvq_batch_step(b, &three[i], 1, NULL)); /* the same chunk each: same bytes */
    CHECK_STATUS(kvq_batch_share(b, sh, src, P + 1, NULL), KVQ_ERR_INVALID_ARG); /* not whole pages */
    CHECK_STATUS(kvq_batch_share(b, sh, src, 3 * P, NULL), KVQ_ERR_INVALID_ARG); /* beyond the source */
    CHECK_STATUS(kvq_batch_share(b, src, src, P, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_batch_share(b, ref_src, src, P, NULL), KVQ_ERR_INVALID_ARG); /* not empty */
    CHECK_STATUS(kvq_batch_share(b, sh, 9, P, NULL), KVQ_ERR_INVALID_ARG);
    CHECK(kvq_batch_len(b, sh) == 0);
    CHECK_OK(kvq_batch_share(b, sh, src, 2 * P, NULL));
    CHECK_OK(kvq_batch_truncate(b, sh, P + 5));
    CHECK_OK(kvq_batch_truncate(b, ref_sh, P + 5));
    kvq_batch_get_stats(b, &st);
    CHECK(st.pages_used == 6 && st.pages_shared == 2);
    float *lg = calloc(4 * V, sizeof(float));
    int32_t tok = 17;
    struct kvq_batch_item w[2] = {{sh, &tok, 1, lg, NULL, NULL, NULL, 0}, {ref_sh, &tok, 1, lg + V, NULL, NULL, NULL, 0}};
    CHECK_OK(kvq_batch_step(b, w, 2, NULL));
    kvq_batch_get_stats(b, &st);
    CHECK(st.pages_used == 7 && st.pages_shared == 1); /* page 1 copied, page 0 still shared */
    CHECK(memcmp(lg, lg + V, V * sizeof(float)) == 0);
    struct kvq_batch_item r[2] = {{src, &tok, 1, lg + 2 * V, NULL, NULL, NULL, 0}, {ref_src, &tok, 1, lg + 3 * V, NULL, NULL, NULL, 0}};
    CHECK_OK(kvq_batch_step(b, r, 2, NULL));
    CHECKF(memcmp(lg + 2 * V, lg + 3 * V, V * sizeof(float)) == 0, "the source's logits changed");
    free(lg);
    kvq_batch_free(b);
}

static void test_copy_on_write(void)
{
    copy_on_write(q8_batch(4, 512));
}

/* kvq_cache_share itself: the same pages, the same reads, copy on write,
 * either cache freed first. */
static void test_cache_share(void)
{
    struct kvq_cache_config cc;
    kvq_cache_config_default(&cc, 2, 128, 1024);
    cc.sink_tokens = 2;
    kvq_cache *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(kvq_cache_create(&cc, &a));
    CHECK_OK(kvq_cache_create(&cc, &b));
    struct kvq_cache_config other = cc;
    other.seed = 5;
    CHECK_OK(kvq_cache_create(&other, &c));
    if (!a || !b || !c)
        return;
    const size_t P = (size_t)kvq_cache_config_of(a)->page_tokens, n = 2 * P + 7, d = 128;
    float *k = malloc(n * 2 * d * sizeof(float)), *v = malloc(n * 2 * d * sizeof(float));
    kvq_rng r;
    kvq_rng_init(&r, 3);
    for (size_t i = 0; i < n * 2 * d; i++)
        k[i] = (float)kvq_rng_gauss(&r), v[i] = (float)kvq_rng_gauss(&r);
    CHECK_OK(kvq_cache_append(a, n, k, v));
    CHECK_STATUS(kvq_cache_share(b, a, P + 1), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_cache_share(c, a, P), KVQ_ERR_INVALID_ARG); /* another seed */
    CHECK_STATUS(kvq_cache_share(b, a, 3 * P), KVQ_ERR_INVALID_ARG);
    CHECK_OK(kvq_cache_share(b, a, 2 * P));
    CHECK(kvq_cache_len(b) == 2 * P && kvq_cache_page(b, 0) == kvq_cache_page(a, 0) &&
          kvq_cache_page(b, 1) == kvq_cache_page(a, 1));
    CHECK(kvq_cache_pages_shared(a) == 2 && kvq_cache_pages_shared(b) == 2);
    CHECK_STATUS(kvq_cache_share(b, a, P), KVQ_ERR_INVALID_ARG); /* not empty */
    float *ka = malloc(2 * P * d * sizeof(float)), *kb = malloc(2 * P * d * sizeof(float));
    CHECK_OK(kvq_cache_read(a, 1, 0, 2 * P, ka, NULL));
    CHECK_OK(kvq_cache_read(b, 1, 0, 2 * P, kb, NULL));
    CHECK(memcmp(ka, kb, 2 * P * d * sizeof(float)) == 0); /* sinks included */
    /* b writes into shared page 1 after a truncation: a copy, a unchanged */
    uint8_t *page1 = malloc(kvq_cache_layout(a)->page_bytes);
    memcpy(page1, kvq_cache_page(a, 1), kvq_cache_layout(a)->page_bytes);
    CHECK_OK(kvq_cache_truncate(b, P + 3));
    CHECK_OK(kvq_cache_append(b, 4, k + (n - 4) * 2 * d, v + (n - 4) * 2 * d));
    CHECK(kvq_cache_page(b, 1) != kvq_cache_page(a, 1) && kvq_cache_page(b, 0) == kvq_cache_page(a, 0));
    CHECK(memcmp(page1, kvq_cache_page(a, 1), kvq_cache_layout(a)->page_bytes) == 0);
    CHECK(kvq_cache_pages_shared(a) == 1 && kvq_cache_pages_shared(b) == 1);
    /* the source goes first: b still reads its prefix (ASan: no use after free) */
    kvq_cache_free(a);
    CHECK(kvq_cache_pages_shared(b) == 0);
    CHECK_OK(kvq_cache_read(b, 1, 0, P, kb, NULL));
    CHECK(memcmp(ka, kb, P * d * sizeof(float)) == 0);
    kvq_cache_free(b);
    kvq_cache_free(c);
    free(page1);
    free(ka);
    free(kb);
    free(k);
    free(v);
}

/* The GPU's page pool (kvq_cuda_cache_share): 0 when this build or machine
 * has no CUDA device (the tests then skip). */
static int cuda_here(void)
{
    struct kvq_batch_config bc;
    kvq_batch_config_default(&bc);
    bc.seq.device = KVQ_DEVICE_CUDA;
    bc.seq.fast_prefill = 0; /* exact products: the comparisons are against f32 references */
    bc.max_seqs = 1;
    kvq_batch *b = NULL;
    kvq_status st = kvq_batch_create(model, &bc, &b, NULL);
    kvq_batch_free(b);
    return st == KVQ_OK;
}

static void test_cuda_shared_identical(void)
{
    if (!cuda_here())
        SKIP("no CUDA device or build");
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc); /* tq3j/tq3 with the recent f16 window */
    sc.device = KVQ_DEVICE_CUDA;
    sc.fast_prefill = 0; /* exact products: the comparisons are against f32 references */
    compare(&sc, -1);
    sc.recent_f16 = 0; /* sink rows travel with the share */
    sc.sink_tokens = 4;
    compare(&sc, -1);
    sc.type_k = sc.type_v = KVQ_TYPE_F16; /* no code to flip: the logits bounded */
    compare(&sc, 1e-4);
}

/* The device pool holds what the batch counts: a budget of 5 pages with the
 * recent f16 window (whose buffers the device keeps apart) takes 5 pages of
 * tokens, and the sixth is refused by the batch before any forward. (The
 * pool once came out smaller, and a forward failed in the middle.) */
static void test_cuda_budget_window(void)
{
    if (!cuda_here())
        SKIP("no CUDA device or build");
    struct kvq_batch_config bc;
    kvq_batch_config_default(&bc); /* tq3j/tq3 with the window */
    bc.seq.device = KVQ_DEVICE_CUDA;
    bc.seq.fast_prefill = 0; /* exact products: the comparisons are against f32 references */
    bc.max_seqs = 3;
    bc.max_rows = 512;
    struct kvq_batch_stats st;
    kvq_batch *b = batch_of_pages(bc, 5, &st);
    if (!b)
        return;
    const size_t P = st.page_tokens;
    int s0, s1;
    CHECK_OK(kvq_batch_add(b, &s0));
    CHECK_OK(kvq_batch_add(b, &s1));
    kvq_error err = {0};
    struct kvq_batch_item a[2] = {{s0, prompts[0], 3 * P, NULL, NULL, NULL, NULL, 0}, {s1, prompts[1], 2 * P, NULL, NULL, NULL, NULL, 0}};
    CHECKF(kvq_batch_step(b, a, 2, &err) == KVQ_OK, "5 pages in a 5-page pool: %s", err.msg);
    int32_t tok = 7;
    struct kvq_batch_item one = {s1, &tok, 1, NULL, NULL, NULL, NULL, 0};
    CHECK_STATUS(kvq_batch_step(b, &one, 1, &err), KVQ_ERR_BUDGET);
    CHECK(kvq_batch_len(b, s0) == 3 * P && kvq_batch_len(b, s1) == 2 * P);
    kvq_batch_free(b);
}

/* Copy on write in the device pool: f16 pages (the GPU encodes the f16 and
 * tq types; q8_0 is encoded on the host). */
static void test_cuda_copy_on_write(void)
{
    if (!cuda_here())
        SKIP("no CUDA device or build");
    struct kvq_batch_config bc = q8_batch(4, 512);
    bc.seq.device = KVQ_DEVICE_CUDA;
    bc.seq.fast_prefill = 0; /* exact products: the comparisons are against f32 references */
    bc.seq.type_k = bc.seq.type_v = KVQ_TYPE_F16;
    copy_on_write(bc);
}

int main(void)
{
    kvq_error err = {0};
    if (kvq_model_load(TEST_MODEL_DIR, NULL, &model, &err) != KVQ_OK) {
        fprintf(stderr, "test_batch_share: cannot load %s: %s\n", TEST_MODEL_DIR, err.msg);
        return 1;
    }
    kvq_rng rng;
    kvq_rng_init(&rng, 11);
    int32_t prefix[PREFIX];
    for (size_t t = 0; t < PREFIX; t++)
        prefix[t] = (int32_t)(kvq_rng_next(&rng) % (uint64_t)vocab());
    for (int i = 0; i < N_SEQS; i++) {
        prompt_len[i] = PREFIX + suffix_len[i];
        prompts[i] = malloc(prompt_len[i] * sizeof(int32_t));
        memcpy(prompts[i], prefix, sizeof prefix);
        for (size_t t = PREFIX; t < prompt_len[i]; t++)
            prompts[i][t] = (int32_t)(kvq_rng_next(&rng) % (uint64_t)vocab());
    }
    RUN(test_cache_share);
    RUN(test_shared_identical_compressed);
    RUN(test_shared_identical_sinks);
    RUN(test_budget);
    RUN(test_copy_on_write);
    RUN(test_cuda_shared_identical);
    RUN(test_cuda_copy_on_write);
    RUN(test_cuda_budget_window);
    for (int i = 0; i < N_SEQS; i++)
        free(prompts[i]);
    kvq_model_free(model);
    return TEST_END("test_batch_share");
}
