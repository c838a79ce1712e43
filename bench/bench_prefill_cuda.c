/* bench_prefill_cuda.c - the prefill kernel alone (kvq_cuda_cache_prefill):
 * one chunk of a prompt's causal attention over the packed past.
 *
 * Llama-3-8B's attention shape (32 query heads, 8 KV heads, d = 128, or the
 * head dims of --dims), a chunk of 2048 positions after a past of 0 .. 126K
 * tokens (seeded random K/V appended first), for f16/f16, tq3j/tq3 and
 * tq3j/tq3 with the recent f16 window. Each timing is host wall time of the call (append + attend)
 * until the device is idle, the sequence truncated back before each; 2
 * warm-ups, median of KVQ_BENCH_REPS (7). "TFLOP/s" counts 4 d flops per
 * (query head, attended key) pair, FlashAttention's convention (QK^T and PV),
 * so it compares with the f16 peak of the GPU and with bench/cuda_sdpa.py
 * --prefill (PyTorch's SDPA on the same chunk). Each row runs twice: the
 * tile kernel ("tile": the past decoded inside the key loop, exact hi + lo
 * products) and the dense path ("dense": a kvq_cuda_prefill_ws, the past
 * decoded into f16 segments of 32K positions and attended as plain
 * FlashAttention), the A/B of one run.
 *
 *   bench_prefill_cuda [--dims 64,96,128,256] [--json FILE]
 * Without a GPU it prints one line and exits 0.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cuda_util.h"
#include "bench_util.h"
#include "kvq_cuda.h"

#define H 8
#define G 4
#define MAX_D 256
#define CHUNK 2048

#define TRY(expr) BENCH_TRY("bench_prefill_cuda", expr)

static const long PAST[] = {0, 6144, 30720, 129024 - CHUNK};

struct config {
    const char *name;
    enum kvq_type tk, tv;
    int window;
};

int main(int argc, char **argv)
{
    const char *json = NULL, *dims_arg = "128";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--json"))
            json = argv[i + 1];
        else if (!strcmp(argv[i], "--dims"))
            dims_arg = argv[i + 1];
    }
    int dims[8], n_dims = 0;
    for (const char *p = dims_arg; *p && n_dims < 8;) {
        char *end;
        const long d = strtol(p, &end, 10);
        if (end == p || (d != 32 && d != 64 && d != 96 && d != 128 && d != 256)) {
            fprintf(stderr, "bench_prefill_cuda: --dims %s: head dims are 32, 64, 96, 128 or 256\n", dims_arg);
            return 2;
        }
        dims[n_dims++] = (int)d;
        p = *end == ',' ? end + 1 : end;
    }
    if (kvq_cuda_device_count() < 1) {
        printf("bench_prefill_cuda: no CUDA device, nothing measured\n");
        return 0;
    }
    const char *r = getenv("KVQ_BENCH_REPS");
    int reps = r ? atoi(r) : 7;
    reps = reps < 1 ? 1 : reps > 32 ? 32 : reps;
    const struct config cfgs[] = {{"f16/f16", KVQ_TYPE_F16, KVQ_TYPE_F16, 0},
                                  {"tq3j/tq3", KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 0},
                                  {"tq3j/tq3+window", KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 1}};
    const long max_ctx = PAST[sizeof PAST / sizeof PAST[0] - 1] + CHUNK;
    const size_t kvn = (size_t)8192 * H * MAX_D, qn = (size_t)CHUNK * H * G * MAX_D;
    float *k = NULL, *v = NULL, *q = NULL, *o = NULL;
    TRY(kvq_cuda_malloc((void **)&k, kvn * sizeof(float)));
    TRY(kvq_cuda_malloc((void **)&v, kvn * sizeof(float)));
    TRY(kvq_cuda_malloc((void **)&q, qn * sizeof(float)));
    TRY(kvq_cuda_malloc((void **)&o, qn * sizeof(float)));
    TRY(bench_cuda_fill_normal(q, qn, 7, 1.0f));
    FILE *js = json ? fopen(json, "w") : NULL;
    if (json && !js) {
        fprintf(stderr, "bench_prefill_cuda: cannot write %s\n", json);
        return 1;
    }
    if (js)
        fprintf(js, "{\"bench\": \"bench_prefill_cuda\", \"chunk\": %d, \"heads\": [%d, %d], \"results\": [\n", CHUNK,
                H * G, H);
    printf("%-16s %-6s %4s %8s %10s %10s\n", "types", "path", "d", "context", "ms/chunk", "TFLOP/s");
    int first = 1;
    for (int di = 0; di < n_dims; di++)
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
        const int D = dims[di];
        struct kvq_cuda_cache_config cc;
        kvq_cuda_cache_config_default(&cc, H, D, (size_t)max_ctx, 1);
        cc.cache.type_k = cfgs[ci].tk;
        cc.cache.type_v = cfgs[ci].tv;
        cc.cache.recent_f16 = cfgs[ci].window;
        cc.max_q_per_kv = G;
        kvq_cuda_cache *c = NULL;
        TRY(kvq_cuda_cache_create(&cc, &c));
        kvq_cuda_prefill_ws *ws = NULL;
        TRY(kvq_cuda_prefill_ws_create(H, H * G, D, CHUNK, 32768, &ws));
        uint64_t seed = 11;
        size_t have = 0;
        for (size_t pi = 0; pi < sizeof PAST / sizeof PAST[0]; pi++) {
            const size_t past = (size_t)PAST[pi];
            TRY(kvq_cuda_cache_truncate(c, 0, have < past ? have : past));
            for (have = kvq_cuda_cache_len(c, 0); have < past;) {
                const size_t m = past - have < 8192 ? past - have : 8192;
                TRY(bench_cuda_fill_normal(k, m * H * D, seed++, 1.0f));
                TRY(bench_cuda_fill_normal(v, m * H * D, seed++, 1.0f));
                TRY(kvq_cuda_cache_append(c, 0, m, k, v));
                have += m;
            }
            TRY(bench_cuda_fill_normal(k, (size_t)CHUNK * H * D, seed++, 1.0f));
            TRY(bench_cuda_fill_normal(v, (size_t)CHUNK * H * D, seed++, 1.0f));
            for (int path = 0; path < 2; path++) {
            kvq_cuda_cache_set_prefill_ws(c, path ? ws : NULL);
            double t[32];
            for (int i = 0; i < reps + 2; i++) {
                TRY(kvq_cuda_cache_truncate(c, 0, past));
                TRY(kvq_cuda_synchronize());
                const double t0 = bench_clock_s(CLOCK_MONOTONIC);
                TRY(kvq_cuda_cache_prefill(c, 0, CHUNK, k, v, q, H * G, 1.0f / sqrtf((float)D), o));
                TRY(kvq_cuda_synchronize());
                if (i >= 2)
                    t[i - 2] = (bench_clock_s(CLOCK_MONOTONIC) - t0) * 1e3;
            }
            const double ms = bench_median(t, reps);
            /* pairs: sum over the chunk's positions of the keys each sees */
            const double pairs = (double)CHUNK * (double)past + (double)CHUNK * (CHUNK + 1) / 2.0;
            const double tflops = 4.0 * D * H * G * pairs / (ms * 1e-3) / 1e12;
            const char *pname = path ? "dense" : "tile";
            printf("%-16s %-6s %4d %8zu %10.2f %10.1f\n", cfgs[ci].name, pname, D, past + CHUNK, ms, tflops);
            if (js)
                fprintf(js, "%s {\"types\": \"%s\", \"path\": \"%s\", \"d\": %d, \"context\": %zu, \"ms_per_chunk\": %.3f, \"tflops\": %.1f}\n",
                        first ? "" : ",", cfgs[ci].name, pname, D, past + CHUNK, ms, tflops);
            first = 0;
            }
            have = past + CHUNK;
        }
        kvq_cuda_prefill_ws_free(ws);
        kvq_cuda_cache_free(c);
    }
    if (js) {
        fprintf(js, "]}\n");
        fclose(js);
    }
    kvq_cuda_free(k);
    kvq_cuda_free(v);
    kvq_cuda_free(q);
    kvq_cuda_free(o);
    return 0;
}
