/* bench_weights.c - what keeping bf16 weights in bf16 costs and saves, and
 * what threads buy (issues 20 and 24).
 *
 * For the model (default the bundled bf16 kvq-tiny-llama; --model DIR for
 * another, e.g. a random ~0.5B checkpoint) loaded two ways:
 *   bf16  matrices memory-mapped in the file's dtype (the default),
 *   f32   matrices widened to f32 at load (kvq_model_load_opts.weights_f32),
 * and on 1 and 2 threads (kvq_set_threads), it reports:
 *   load s          kvq_model_load wall time,
 *   resident MiB    what the process holds after load + prefill + decode
 *                   beyond what it held before (weights, caches, buffers),
 *   prefill t/s     one forward over a PROMPT-token prompt (chunks of 256),
 *   decode t/s      DECODE greedy tokens after it (f16 cache).
 * Medians over the repetitions; each variant loads the model afresh.
 *
 *   bench_weights [--quick] [--model DIR]
 * JSON: $KVQ_BENCH_JSON_DIR/bench_weights.json (default: this binary's folder).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvq_model.h"
#include "bench_util.h"

#define PROMPT 512
#define DECODE 32
#define MAX_REPS 3

static size_t rss_now(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, res = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &size, &res) != 2)
            res = 0;
        fclose(f);
    }
    return (size_t)res * (size_t)sysconf(_SC_PAGESIZE);
}

struct result {
    double load, resident, prefill, decode;
};

/* One load + prefill + decode. @return 0, or -1 after printing why. */
static int run_once(const char *dir, int f32, struct result *r)
{
    size_t before = rss_now();
    struct kvq_model_load_opts o;
    kvq_model_load_opts_default(&o);
    o.weights_f32 = f32;
    kvq_model *m = NULL;
    kvq_seq *s = NULL;
    kvq_error err = {0};
    double t0 = bench_clock_s(CLOCK_MONOTONIC);
    if (kvq_model_load(dir, &o, &m, &err) != KVQ_OK) {
        fprintf(stderr, "bench_weights: %s (run from the repository root)\n", err.msg);
        return -1;
    }
    r->load = bench_clock_s(CLOCK_MONOTONIC) - t0;
    const struct kvq_model_config *c = kvq_model_config_of(m);
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.type_k = sc.type_v = KVQ_TYPE_F16;
    sc.max_ctx = PROMPT + DECODE + 1;
    int32_t ids[PROMPT], out[DECODE], best;
    for (int i = 0; i < PROMPT; i++)
        ids[i] = i == 0 && c->bos_id >= 0 ? c->bos_id : (int32_t)((7919u * (unsigned)i + 13u) % (unsigned)c->vocab);
    int rc = -1;
    if (kvq_seq_create(m, &sc, &s, &err) != KVQ_OK) {
        fprintf(stderr, "bench_weights: %s\n", err.msg);
        goto out;
    }
    t0 = bench_clock_s(CLOCK_MONOTONIC);
    if (kvq_seq_forward(s, ids, PROMPT, PROMPT - 1, NULL, &best) != KVQ_OK)
        goto out;
    r->prefill = PROMPT / (bench_clock_s(CLOCK_MONOTONIC) - t0);
    t0 = bench_clock_s(CLOCK_MONOTONIC);
    for (int i = 0; i < DECODE; i++) {
        out[i] = best;
        if (kvq_seq_forward(s, &out[i], 1, 0, NULL, &best) != KVQ_OK)
            goto out;
    }
    r->decode = DECODE / (bench_clock_s(CLOCK_MONOTONIC) - t0);
    r->resident = (double)(rss_now() - before) / 1048576.0;
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "bench_weights: a forward failed\n");
    kvq_seq_free(s);
    kvq_model_free(m);
    return rc;
}

int main(int argc, char **argv)
{
    int quick = 0;
    const char *dir = "models/kvq-tiny-llama";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            dir = argv[++i];
        else {
            fprintf(stderr, "usage: bench_weights [--quick] [--model DIR]\n");
            return 2;
        }
    }
    const int reps = quick ? 1 : MAX_REPS;
    char path[4096];
    const char *jd = getenv("KVQ_BENCH_JSON_DIR");
    if (jd) {
        snprintf(path, sizeof path, "%s/bench_weights.json", jd);
    } else {
        const char *slash = strrchr(argv[0], '/');
        int len = slash ? (int)(slash - argv[0]) : 1;
        snprintf(path, sizeof path, "%.*s/bench_weights.json", len, slash ? argv[0] : ".");
    }
    FILE *json = fopen(path, "w");
    if (!json) {
        fprintf(stderr, "bench_weights: cannot write %s\n", path);
        return 1;
    }
    const int threads_before = kvq_threads();
    fprintf(json, "{\n  \"benchmark\": \"bench_weights\",\n  \"model\": \"%s\",\n  \"prompt_tokens\": %d,\n"
                  "  \"decode_tokens\": %d,\n  \"repetitions\": %d,\n  \"results\": [",
            dir, PROMPT, DECODE, reps);
    printf("%s: prompt %d, decode %d (f16 cache); medians of %d\n", dir, PROMPT, DECODE, reps);
    printf("%-8s %7s %8s %13s %12s %11s\n", "weights", "threads", "load s", "resident MiB", "prefill t/s",
           "decode t/s");
    int first = 1, fail = 0;
    for (int threads = 1; threads <= 2 && !fail; threads++)
        for (int f32 = 0; f32 < 2 && !fail; f32++) {
            kvq_set_threads(threads);
            double v[4][MAX_REPS];
            for (int r = 0; r < reps && !fail; r++) {
                struct result res = {0, 0, 0, 0};
                fail = run_once(dir, f32, &res) != 0;
                v[0][r] = res.load, v[1][r] = res.resident, v[2][r] = res.prefill, v[3][r] = res.decode;
            }
            if (fail)
                break;
            double med[4];
            for (int k = 0; k < 4; k++)
                med[k] = bench_median(v[k], reps);
            const char *name = f32 ? "f32" : "stored"; /* stored: the file's dtype, mapped */
            printf("%-8s %7d %8.3f %13.1f %12.1f %11.1f\n", name, threads, med[0], med[1], med[2], med[3]);
            fprintf(json,
                    "%s\n    {\"weights\": \"%s\", \"threads\": %d, \"load_s\": %.4f, \"resident_mib\": %.1f, "
                    "\"prefill_tokens_per_s\": %.2f, \"decode_tokens_per_s\": %.2f}",
                    first ? "" : ",", name, threads, med[0], med[1], med[2], med[3]);
            first = 0;
        }
    kvq_set_threads(threads_before);
    fprintf(json, "\n  ]\n}\n");
    fclose(json);
    printf("JSON: %s\n", path);
    return fail;
}
