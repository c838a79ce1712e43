/* bench_cuda.c - fused decode attention on the GPU over the packed cache.
 *
 * Llama-3-8B-like shapes: 32 query heads, 8 KV heads, d = 128; batch 1, 8,
 * 32; context 4K .. 128K. Cache types tq3j/tq3 and tq3/tq3 against our own
 * f16/f16 path (same kernel family), plus a measured device-to-device copy
 * for the bandwidth ceiling. PyTorch's SDPA on the same shapes is
 * bench/cuda_sdpa.py; bench/run_cuda.sh runs both and prints the ratios.
 *
 * Every call is the default (KVQ_CUDA_KERNEL_AUTO: the fused kernel on
 * these shapes; KVQ_BENCH_DIM=64|96|256 sets the head dim, where AUTO takes
 * the reference kernel). The earlier versions of the fused kernel, which the runs up
 * to the tenth pass timed next to it ("v3o us", "v2 us", "v3 us"), have left
 * the library; their numbers are in docs/history/attention-cuda.md.
 *
 * Each timing: L2 flushed before every launch, device events around the
 * attend call only, 3 warm-ups, median of KVQ_BENCH_REPS (20). The flush
 * writes 256 MB (memset) and then reads them (bench_cuda_touch), so the call
 * starts with none of its data in L2 and no dirty line to write back;
 * KVQ_BENCH_FLUSH=write skips the read, the method of the first seven passes
 * (docs/history/attention-cuda.md: the call then also pays for writing back
 * up to the L2's size of the memset's lines). "read us" is a plain read of
 * as many bytes as the call must read (bench_cuda_touch on a separate buffer,
 * same flush): what moving those bytes alone costs, launch included.
 * "graph us" times the same default call recorded once into a CUDA graph
 * and replayed (kvq_cuda_graph_*): the device-side time without the host's
 * cost of issuing three launches, which a decode loop run from a graph does
 * not pay.
 * GB/s counts the cache bytes the call must read (K and V rows of every
 * attended token; queries and outputs are negligible).
 *
 * Appends (encode on the GPU, per cache type): a prefill of 8192 tokens
 * into one sequence, and one decode step (one token into each of 1, 8, 32
 * sequences that already hold a token, kvq_cuda_cache_append_batch) with
 * the input check on (the default: one host synchronisation per call) and
 * off. Host wall time from the call until the device is idle, median of 11
 * after 2 warm-ups.
 *
 * Env: KVQ_BENCH_QUICK=1 (batch 1 and 32, contexts 4K and 32K),
 *      KVQ_BENCH_PROFILE=1|2|3 (only tq3j/tq3, tq3/tq3 or f16/f16, at the
 *      batches KVQ_BENCH_BATCH (32) and contexts KVQ_BENCH_CTX (32768),
 *      each a comma-separated list of up to 5: for ncu and A/B runs),
 *      KVQ_BENCH_MAXCTX (cap on the context), KVQ_BENCH_JSON_DIR,
 *      KVQ_BENCH_SPLITS (force the split count; 0 = the library's choice),
 *      KVQ_BENCH_GRAPH=0 (no CUDA-graph timing),
 *      KVQ_BENCH_FLUSH=read|write (the L2 flush above; read by default),
 *      KVQ_BENCH_CHECK_ONLY=1 (only the helpers' self-check below, for
 *      compute-sanitizer: bench/run_cuda.sh's sanitize stage).
 * The timer, the random fill and the plain read are bench-only helpers
 * (bench_cuda_util.h), not libkvq API. Before measuring, the plain read is
 * checked at odd alignments and lengths (check_helpers).
 * Without a GPU it prints one line and exits 0.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq_cuda.h"
#include "bench_cuda_util.h"
#include "bench_util.h"

#define H 8
#define G 4
static int D = 128; /* KVQ_BENCH_DIM: 64, 96 and 256 time the reference kernel (AUTO's choice there) */
#define MAXB 32
#define APPEND_PREFILL 8192                      /* tokens of the timed prefill */
static const int append_batches[3] = {1, 8, 32}; /* sequences of a timed decode step */

struct result {
    int batch, ctx;
    enum kvq_type tk, tv;
    double us, gbps, pct;
    double us_graph; /* the default call replayed from a CUDA graph (0: not timed) */
    double bytes;
    double us_read; /* bench_cuda_touch of `bytes` bytes, same flush (0: not timed) */
};

static int env_int(const char *name, int dflt)
{
    const char *s = getenv(name);
    return s && *s ? atoi(s) : dflt;
}

/* A comma-separated list of up to max positive ints (e.g. "1,8,32"), in the
 * order given; dflt alone when unset. @return the count. */
static int env_list(const char *name, int dflt, int *out, int max)
{
    const char *s = getenv(name);
    int n = 0;
    while (s && *s && n < max) {
        char *end = NULL;
        const long v = strtol(s, &end, 10);
        if (end == s || v <= 0 || v > (1L << 30))
            break;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
    }
    if (n == 0)
        out[n++] = dflt;
    return n;
}

static int cmp_desc(const void *a, const void *b)
{
    const int x = *(const int *)a, y = *(const int *)b;
    return (x < y) - (x > y);
}

#define TRY(expr) BENCH_TRY("bench_cuda", expr)

static void *flush_buf;
static size_t flush_bytes = (size_t)256 << 20;
static int flush_read = 1; /* KVQ_BENCH_FLUSH: read (default) or write */

static void flush_l2(int i)
{
    TRY(kvq_cuda_memset(flush_buf, i & 0xff, flush_bytes));
    if (flush_read)
        TRY(bench_cuda_touch(flush_buf, flush_bytes));
}

/* Median device time (us) of `call(arg)` over reps runs after 3 warm-ups,
 * each run after flush_l2 and bracketed by the device-event timer. */
static double time_flushed(bench_cuda_timer *tm, int reps, kvq_status (*call)(void *), void *arg)
{
    double t[64];
    if (reps > 64)
        reps = 64;
    for (int i = 0; i < reps + 3; i++) {
        double ms;
        flush_l2(i);
        TRY(bench_cuda_timer_start(tm));
        TRY(call(arg));
        TRY(bench_cuda_timer_stop(tm, &ms));
        if (i >= 3)
            t[i - 3] = ms;
    }
    return bench_median(t, reps) * 1e3;
}

struct read_call {
    const void *buf;
    size_t bytes;
};

static kvq_status read_once(void *arg)
{
    const struct read_call *r = arg;
    return bench_cuda_touch(r->buf, r->bytes);
}

/* Median time of a plain read of bytes of buf, flushed like an attend call. */
static double time_read(bench_cuda_timer *tm, const void *buf, size_t bytes, int reps)
{
    struct read_call r = {buf, bytes};
    return time_flushed(tm, reps, read_once, &r);
}

static double copy_bandwidth(bench_cuda_timer *tm)
{
    const size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    TRY(kvq_cuda_malloc(&a, bytes));
    TRY(kvq_cuda_malloc(&b, bytes));
    TRY(kvq_cuda_memset(a, 1, bytes));
    double t[10];
    for (int i = 0; i < 12; i++) {
        double ms;
        TRY(bench_cuda_timer_start(tm));
        TRY(kvq_cuda_memcpy_d2d(b, a, bytes));
        TRY(bench_cuda_timer_stop(tm, &ms));
        if (i >= 2)
            t[i - 2] = ms;
    }
    kvq_cuda_free(a);
    kvq_cuda_free(b);
    return 2.0 * (double)bytes / (bench_median(t, 10) * 1e-3) / 1e9; /* read + write */
}

/* Fills sequences 0..MAXB-1 to ctx tokens of N(0,1) keys/values. */
static void fill(kvq_cuda_cache *c, int ctx)
{
    const size_t chunk = 8192, n = chunk * H * D;
    float *k = NULL, *v = NULL;
    TRY(kvq_cuda_malloc((void **)&k, n * sizeof(float)));
    TRY(kvq_cuda_malloc((void **)&v, n * sizeof(float)));
    uint64_t seed = 1;
    for (size_t t0 = 0; t0 < (size_t)ctx; t0 += chunk) {
        size_t m = (size_t)ctx - t0 < chunk ? (size_t)ctx - t0 : chunk;
        for (int s = 0; s < MAXB; s++) {
            TRY(bench_cuda_fill_normal(k, m * H * D, seed++, 1.0f));
            TRY(bench_cuda_fill_normal(v, m * H * D, seed++, 1.0f));
            TRY(kvq_cuda_cache_append(c, s, m, k, v));
        }
    }
    TRY(kvq_cuda_synchronize());
    kvq_cuda_free(k);
    kvq_cuda_free(v);
}

/* Median wall time (us) of `reps` append calls (2 warm-ups before): a
 * prefill of n tokens into an empty sequence 0 when batch == 0, else one
 * token into each of sequences 0..batch-1 holding one token already (the
 * steady state of a decode loop: the page exists, nothing is allocated). */
static double time_append(kvq_cuda_cache *c, int batch, size_t n, const float *k, const float *v, int reps)
{
    int seqs[MAXB];
    for (int i = 0; i < MAXB; i++)
        seqs[i] = i;
    double t[16];
    if (reps > 16)
        reps = 16;
    for (int s = 0; s < MAXB; s++)
        TRY(kvq_cuda_cache_truncate(c, s, 0));
    if (batch > 0)
        TRY(kvq_cuda_cache_append_batch(c, batch, seqs, k, v));
    for (int i = 0; i < reps + 2; i++) {
        for (int s = 0; s < MAXB; s++)
            TRY(kvq_cuda_cache_truncate(c, s, batch > 0 && s < batch ? 1 : 0));
        TRY(kvq_cuda_synchronize());
        const double t0 = bench_clock_s(CLOCK_MONOTONIC);
        TRY(batch == 0 ? kvq_cuda_cache_append(c, 0, n, k, v) : kvq_cuda_cache_append_batch(c, batch, seqs, k, v));
        TRY(kvq_cuda_synchronize());
        if (i >= 2)
            t[i - 2] = (bench_clock_s(CLOCK_MONOTONIC) - t0) * 1e6;
    }
    return bench_median(t, reps);
}

/* Append timings of one cache type (see the file comment), printed as one
 * line and kept for the JSON. */
struct append_result {
    enum kvq_type tk, tv;
    double prefill_us, step_us[3], step_nocheck_us[3]; /* steps at batch 1, 8, 32 */
};

static void bench_append(enum kvq_type tk, enum kvq_type tv, struct append_result *r)
{
    const size_t n = APPEND_PREFILL;
    float *k = NULL, *v = NULL;
    TRY(kvq_cuda_malloc((void **)&k, n * H * D * sizeof(float)));
    TRY(kvq_cuda_malloc((void **)&v, n * H * D * sizeof(float)));
    TRY(bench_cuda_fill_normal(k, n * H * D, 77, 1.0f));
    TRY(bench_cuda_fill_normal(v, n * H * D, 78, 1.0f));
    r->tk = tk;
    r->tv = tv;
    for (int check = 1; check >= 0; check--) {
        struct kvq_cuda_cache_config cfg;
        kvq_cuda_cache_config_default(&cfg, H, D, n, MAXB);
        cfg.cache.type_k = tk;
        cfg.cache.type_v = tv;
        cfg.check_input = check;
        kvq_cuda_cache *c = NULL;
        TRY(kvq_cuda_cache_create(&cfg, &c));
        if (check)
            r->prefill_us = time_append(c, 0, n, k, v, 11);
        for (int i = 0; i < 3; i++)
            (check ? r->step_us : r->step_nocheck_us)[i] = time_append(c, append_batches[i], 1, k, v, 11);
        kvq_cuda_cache_free(c);
    }
    kvq_cuda_free(k);
    kvq_cuda_free(v);
    printf("append %s/%s: prefill %zu tokens %.1f us (%.2f M tokens/s); decode step at batch %d/%d/%d: %.1f / %.1f / "
           "%.1f us (input check off: %.1f / %.1f / %.1f)\n",
           kvq_type_traits(tk)->name, kvq_type_traits(tv)->name, n, r->prefill_us, (double)n / r->prefill_us,
           append_batches[0], append_batches[1], append_batches[2], r->step_us[0], r->step_us[1], r->step_us[2],
           r->step_nocheck_us[0], r->step_nocheck_us[1], r->step_nocheck_us[2]);
}

struct attend_call {
    kvq_cuda_cache *c;
    kvq_cuda_graph *g; /* replayed instead of the call when set */
    int batch;
    const int *seqs;
    const float *qd;
    float *od;
    float scale;
    const struct kvq_cuda_attn_opts *opts;
};

static kvq_status attend_once(void *arg)
{
    const struct attend_call *a = arg;
    return a->g ? kvq_cuda_graph_launch(a->g)
                : kvq_cuda_cache_attend(a->c, a->batch, a->seqs, a->qd, H * G, a->scale, a->od, a->opts);
}

/* One attend call over sequences 0..batch-1, timed reps times after 3
 * warm-ups. graph = 1 records the call once into a CUDA graph and times its
 * replays instead (kvq_cuda_graph_*), with the same flush and bracketing. */
static double time_attend(kvq_cuda_cache *c, bench_cuda_timer *tm, int batch, const float *qd, float *od, int reps,
                          int graph)
{
    const struct kvq_cuda_attn_opts opts = {KVQ_CUDA_KERNEL_AUTO, env_int("KVQ_BENCH_SPLITS", 0)};
    int seqs[MAXB];
    for (int i = 0; i < batch; i++)
        seqs[i] = i;
    struct attend_call a = {c, NULL, batch, seqs, qd, od, 1.0f / sqrtf((float)D), &opts};
    if (graph) {
        TRY(kvq_cuda_graph_begin(c));
        TRY(attend_once(&a));
        TRY(kvq_cuda_graph_end(c, &a.g));
    }
    const double us = time_flushed(tm, reps, attend_once, &a);
    kvq_cuda_graph_free(a.g);
    return us;
}

/* The plain read at any alignment and length, reading nothing past the end
 * (under compute-sanitizer's memcheck: KVQ_BENCH_CHECK_ONLY=1), and its
 * argument checks. @return 0 when every check passed. */
static int check_helpers(void)
{
    int bad = 0;
    unsigned char *b = NULL;
    TRY(kvq_cuda_malloc((void **)&b, 1000));
    bad += bench_cuda_touch(b + 3, 997) != KVQ_OK;
    bad += bench_cuda_touch(b + 5, 7) != KVQ_OK;
    bad += bench_cuda_touch(b, 1000) != KVQ_OK;
    bad += kvq_cuda_synchronize() != KVQ_OK;
    bad += bench_cuda_touch(NULL, 0) != KVQ_OK;
    bad += bench_cuda_touch(NULL, 16) != KVQ_ERR_INVALID_ARG;
    kvq_cuda_free(b);
    if (bad)
        fprintf(stderr, "bench_cuda: %d helper check(s) failed\n", bad);
    return bad;
}

int main(void)
{
    if (kvq_cuda_device_count() == 0) {
        printf("bench_cuda: no CUDA device, nothing measured\n");
        return 0;
    }
    if (check_helpers() != 0)
        return 1;
    if (env_int("KVQ_BENCH_CHECK_ONLY", 0)) {
        printf("bench_cuda: helper checks passed\n");
        return 0;
    }
    char dev[256];
    TRY(kvq_cuda_device_describe(dev, sizeof dev));
    D = env_int("KVQ_BENCH_DIM", 128);
    if (D != 64 && D != 96 && D != 128 && D != 256) {
        fprintf(stderr, "bench_cuda: KVQ_BENCH_DIM: 64, 96, 128 or 256\n");
        return 1;
    }
    const int profile = env_int("KVQ_BENCH_PROFILE", 0);
    const int quick = env_int("KVQ_BENCH_QUICK", 0) || profile;
    const int maxctx = env_int("KVQ_BENCH_MAXCTX", 131072);
    const int reps = env_int("KVQ_BENCH_REPS", 20);
    const int graph = env_int("KVQ_BENCH_GRAPH", 1);
    const char *flush_env = getenv("KVQ_BENCH_FLUSH");
    if (flush_env && *flush_env && strcmp(flush_env, "read") != 0 && strcmp(flush_env, "write") != 0) {
        fprintf(stderr, "bench_cuda: KVQ_BENCH_FLUSH: read or write\n");
        return 1;
    }
    flush_read = !(flush_env && strcmp(flush_env, "write") == 0);
    const int all_batches[3] = {1, 8, 32}, quick_batches[2] = {1, 32};
    const int all_ctx[5] = {131072, 65536, 32768, 16384, 4096}, quick_ctx[2] = {32768, 4096};
    int prof_batch[5], prof_ctx[5];
    const int nprof_batch = env_list("KVQ_BENCH_BATCH", 32, prof_batch, 5);
    const int nprof_ctx = env_list("KVQ_BENCH_CTX", 32768, prof_ctx, 5);
    const int *batches = profile ? prof_batch : quick ? quick_batches : all_batches;
    const int nbatch = profile ? nprof_batch : quick ? 2 : 3;
    for (int i = 0; i < nbatch; i++)
        if (batches[i] > MAXB) {
            fprintf(stderr, "bench_cuda: KVQ_BENCH_BATCH: at most %d sequences\n", MAXB);
            return 1;
        }
    qsort(prof_ctx, (size_t)nprof_ctx, sizeof prof_ctx[0], cmp_desc); /* each context is the previous one truncated */
    const int *ctxs = profile ? prof_ctx : quick ? quick_ctx : all_ctx, nctx = profile ? nprof_ctx : quick ? 2 : 5;
    const int t0 = profile ? profile - 1 : 0, ntypes = profile ? profile : 3;
    const enum kvq_type types[3][2] = {
        {KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3}, {KVQ_TYPE_TQ3, KVQ_TYPE_TQ3}, {KVQ_TYPE_F16, KVQ_TYPE_F16}};

    bench_cuda_timer *tm = NULL;
    TRY(bench_cuda_timer_create(&tm));
    TRY(kvq_cuda_malloc(&flush_buf, flush_bytes));
    const double copy_gbps = copy_bandwidth(tm);
    printf("device: %s\n", dev);
    printf("device-to-device copy: %.0f GB/s (read + write)\n", copy_gbps);
    printf("L2 flush before each timed call: %zu MB memset%s\n\n", flush_bytes >> 20,
           flush_read ? ", then read" : " (KVQ_BENCH_FLUSH=write)");

    float *qd = NULL, *od = NULL;
    const size_t qn = (size_t)MAXB * H * G * D;
    TRY(kvq_cuda_malloc((void **)&qd, qn * sizeof(float)));
    TRY(kvq_cuda_malloc((void **)&od, qn * sizeof(float)));
    TRY(bench_cuda_fill_normal(qd, qn, 12345, 1.0f));

    struct result res[64];
    int nres = 0;
    struct append_result app[3];
    int napp = 0;
    int top = 0;
    for (int i = 0; i < nctx; i++)
        top = ctxs[i] <= maxctx && ctxs[i] > top ? ctxs[i] : top;
    /* plain-read buffer: the bytes of the largest tq3j/tq3 call (f16 calls
     * larger than that get no read time) */
    int maxb = 0;
    for (int i = 0; i < nbatch; i++)
        maxb = batches[i] > maxb ? batches[i] : maxb;
    const size_t read_cap = (size_t)maxb * (size_t)top * H *
                            (kvq_type_row_bytes(KVQ_TYPE_TQ3J, D) + kvq_type_row_bytes(KVQ_TYPE_TQ3, D));
    void *read_buf = NULL;
    TRY(kvq_cuda_malloc(&read_buf, read_cap));
    TRY(kvq_cuda_memset(read_buf, 0, read_cap));
    for (int ti = t0; ti < ntypes; ti++) {
        struct kvq_cuda_cache_config cfg;
        kvq_cuda_cache_config_default(&cfg, H, D, (size_t)top, MAXB);
        cfg.cache.type_k = types[ti][0];
        cfg.cache.type_v = types[ti][1];
        cfg.max_q_per_kv = G;
        kvq_cuda_cache *c = NULL;
        TRY(kvq_cuda_cache_create(&cfg, &c));
        fill(c, top);
        const double row = (double)kvq_type_row_bytes(types[ti][0], D) + (double)kvq_type_row_bytes(types[ti][1], D);
        for (int ci = 0; ci < nctx; ci++) {
            const int ctx = ctxs[ci];
            if (ctx > top)
                continue;
            for (int s = 0; s < MAXB; s++)
                TRY(kvq_cuda_cache_truncate(c, s, (size_t)ctx));
            for (int bi = 0; bi < nbatch; bi++) {
                struct result *r = &res[nres++];
                r->batch = batches[bi];
                r->ctx = ctx;
                r->tk = types[ti][0];
                r->tv = types[ti][1];
                r->us = time_attend(c, tm, r->batch, qd, od, reps, 0);
                r->us_graph = graph ? time_attend(c, tm, r->batch, qd, od, reps, 1) : 0.0;
                r->bytes = (double)r->batch * ctx * H * row;
                r->us_read = r->bytes <= (double)read_cap ? time_read(tm, read_buf, (size_t)r->bytes, reps) : 0.0;
                r->gbps = r->bytes / (r->us * 1e-6) / 1e9;
                r->pct = 100.0 * r->gbps / copy_gbps;
            }
        }
        kvq_cuda_cache_free(c);
        if (!profile)
            bench_append(types[ti][0], types[ti][1], &app[napp++]);
    }
    printf("\n");

    printf("%5s %7s %-10s %10s %9s %8s %10s %10s %9s %10s\n", "batch", "context", "K/V", "us", "GB/s", "%copy",
           "vs f16", "read us", "us/read", "graph us");
    for (int i = 0; i < nres; i++) {
        const struct result *r = &res[i];
        double f16us = 0.0;
        for (int j = 0; j < nres; j++)
            if (res[j].tk == KVQ_TYPE_F16 && res[j].batch == r->batch && res[j].ctx == r->ctx)
                f16us = res[j].us;
        char kv[32];
        snprintf(kv, sizeof kv, "%s/%s", kvq_type_traits(r->tk)->name, kvq_type_traits(r->tv)->name);
        printf("%5d %7d %-10s %10.1f %9.0f %7.1f%% %9.2fx %10.1f %8.2fx %10.1f\n", r->batch, r->ctx, kv, r->us,
               r->gbps, r->pct, f16us > 0.0 ? f16us / r->us : 0.0, r->us_read,
               r->us_read > 0.0 ? r->us / r->us_read : 0.0, r->us_graph);
    }

    const char *dir = getenv("KVQ_BENCH_JSON_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/bench_cuda.json", dir && *dir ? dir : ".");
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "{\n  \"benchmark\": \"bench_cuda\",\n  \"device\": \"%s\",\n  \"copy_gbps\": %.1f,\n", dev, copy_gbps);
        fprintf(f, "  \"flush\": \"%s\",\n", flush_read ? "read" : "write");
        fprintf(f, "  \"shape\": {\"q_heads\": %d, \"kv_heads\": %d, \"head_dim\": %d},\n  \"results\": [\n", H * G, H,
                D);
        for (int i = 0; i < nres; i++) {
            const struct result *r = &res[i];
            fprintf(f,
                    "    {\"batch\": %d, \"context\": %d, \"type_k\": \"%s\", \"type_v\": \"%s\", \"us\": %.2f, "
                    "\"bytes\": %.0f, \"gbps\": %.1f, \"pct_copy\": %.1f, \"us_graph\": %.2f, \"us_read\": %.2f}%s\n",
                    r->batch, r->ctx, kvq_type_traits(r->tk)->name, kvq_type_traits(r->tv)->name, r->us, r->bytes,
                    r->gbps, r->pct, r->us_graph, r->us_read, i + 1 < nres ? "," : "");
        }
        fprintf(f, "  ],\n  \"append\": [\n");
        for (int i = 0; i < napp; i++) {
            const struct append_result *a = &app[i];
            fprintf(f,
                    "    {\"type_k\": \"%s\", \"type_v\": \"%s\", \"prefill_tokens\": %d, \"prefill_us\": %.1f, "
                    "\"step_us\": [%.1f, %.1f, %.1f], \"step_nocheck_us\": [%.1f, %.1f, %.1f], "
                    "\"step_batches\": [%d, %d, %d]}%s\n",
                    kvq_type_traits(a->tk)->name, kvq_type_traits(a->tv)->name, APPEND_PREFILL, a->prefill_us,
                    a->step_us[0], a->step_us[1], a->step_us[2], a->step_nocheck_us[0], a->step_nocheck_us[1],
                    a->step_nocheck_us[2], append_batches[0], append_batches[1], append_batches[2],
                    i + 1 < napp ? "," : "");
        }
        fprintf(f, "  ]\n}\n");
        fclose(f);
        printf("\nJSON: %s\n", path);
    }
    kvq_cuda_free(qd);
    kvq_cuda_free(od);
    kvq_cuda_free(flush_buf);
    kvq_cuda_free(read_buf);
    bench_cuda_timer_free(tm);
    return 0;
}
