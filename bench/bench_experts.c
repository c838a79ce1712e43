/* bench_experts.c - the expert cache's hit rates and read bytes, with and
 * without read-ahead (issue 39), on the CPU.
 *
 * For a mixture-of-experts checkpoint (default tests/models/qwen3_moe: 3
 * layers, 2 sparse, 8 experts, top 2; --model DIR for another) it runs one
 * sequence (a PROMPT-token prompt of seeded random ids, then DECODE greedy
 * tokens, f16 cache) with an expert cache holding 100%, 50%, 25% and 10% of
 * the experts (at least one), read-ahead off and on, and reports per run:
 *   hit %        fetches served by a slot,
 *   read MiB     what the misses read from the checkpoint's files,
 *   ahead        experts read ahead, and how many a fetch then used,
 *   wait s       forwards waiting for a read-ahead to land,
 *   read GB/s    the misses' bytes over the time the fetches spent reading,
 *   decode t/s   the decode's speed (without --direct the files sit in the
 *                page cache after their first read: CPU time, not the disk's).
 * --direct reads every miss with O_DIRECT (kvq_seq_config.expert_direct),
 * so each one comes from the disk; bench/experts_synth.py makes a
 * checkpoint whose experts are large enough for that to mean something.
 * Every run's greedy ids are checked to equal the run without a cache
 * (exit 1 otherwise): the cache must not change a bit.
 *
 *   bench_experts [--model DIR] [--decode N] [--direct]   (N default 160: prompt + N within the context)
 * JSON: $KVQ_BENCH_JSON_DIR/bench_experts.json (default: this binary's folder).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "kvq_model.h"
#include "kvq_rng.h"
#include "kvq_status.h"

#define PROG "bench_experts"
enum { PROMPT = 64 };

struct run {
    double frac;
    int ahead;
    size_t slots;
    struct kvq_seq_stats st;
    double decode_tps;
    int same;
};

/* One sequence with a cache of `bytes` (0: none); greedy ids into out. */
static int opt_direct; /* --direct */

static void run_one(const kvq_model *m, size_t bytes, int ahead, const int32_t *prompt, int n_decode, int32_t *out,
                    struct kvq_seq_stats *st, double *tps)
{
    const struct kvq_model_config *c = kvq_model_config_of(m);
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.type_k = sc.type_v = KVQ_TYPE_F16;
    sc.max_ctx = PROMPT + (size_t)n_decode + 1;
    sc.expert_cache = bytes;
    sc.expert_prefetch = ahead;
    sc.expert_direct = bytes ? opt_direct : 0;
    kvq_seq *s = NULL;
    kvq_error err = {0};
    if (kvq_seq_create(m, &sc, &s, &err) != KVQ_OK) {
        fprintf(stderr, "%s: %s\n", PROG, err.msg);
        exit(1);
    }
    float *lg = malloc((size_t)c->vocab * sizeof *lg);
    if (!lg)
        exit(1);
    BENCH_TRY(PROG, kvq_seq_forward(s, prompt, PROMPT, PROMPT - 1, lg, NULL));
    const double t0 = bench_clock_s(CLOCK_MONOTONIC);
    for (int i = 0; i < n_decode; i++) {
        int32_t best = 0;
        for (int v = 1; v < c->vocab; v++)
            if (lg[v] > lg[best])
                best = v;
        out[i] = best;
        BENCH_TRY(PROG, kvq_seq_forward(s, &best, 1, 0, lg, NULL));
    }
    *tps = n_decode / (bench_clock_s(CLOCK_MONOTONIC) - t0);
    kvq_seq_get_stats(s, st);
    kvq_seq_free(s);
    free(lg);
}

int main(int argc, char **argv)
{
    const char *dir = "tests/models/qwen3_moe";
    int n_decode = 160; /* the fixtures' context is 256 */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc)
            n_decode = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--direct"))
            opt_direct = 1;
        else {
            fprintf(stderr, "usage: %s [--model DIR] [--decode N] [--direct]\n", PROG);
            return 2;
        }
    }
    if (n_decode < 1)
        n_decode = 1;
    kvq_model *m = NULL;
    kvq_error err = {0};
    if (kvq_model_load(dir, NULL, &m, &err) != KVQ_OK) {
        fprintf(stderr, "%s: %s\n", PROG, err.msg);
        return 1;
    }
    const struct kvq_model_config *c = kvq_model_config_of(m);
    int sparse = 0;
    for (int l = 0; l < c->n_layers; l++)
        sparse += kvq_model_layer_is_moe(c, l);
    if (!sparse) {
        fprintf(stderr, "%s: %s has no mixture-of-experts layer\n", PROG, dir);
        return 1;
    }
    const size_t all = (size_t)sparse * (size_t)c->arch.n_experts;
    int32_t prompt[PROMPT];
    kvq_rng r;
    kvq_rng_init(&r, 7);
    for (int t = 0; t < PROMPT; t++)
        prompt[t] = (int32_t)(kvq_rng_next(&r) % (uint64_t)c->vocab);
    int32_t *ref = malloc((size_t)n_decode * sizeof *ref), *ids = malloc((size_t)n_decode * sizeof *ids);
    if (!ref || !ids)
        return 1;
    struct kvq_seq_stats st;
    double tps0;
    double tps_big;
    run_one(m, 0, 0, prompt, n_decode, ref, &st, &tps0);
    /* one expert's bytes: a cache with room for all holds all, whole */
    run_one(m, (size_t)1 << 40, 0, prompt, 1, ids, &st, &tps_big);
    const size_t expert = st.experts.cache_bytes / all;
    static const double fracs[] = {1.0, 0.5, 0.25, 0.1};
    struct run runs[8];
    int n_runs = 0, bad = 0;
    printf("%s: %s, %d sparse layers x %d experts (top %d), %zu bytes an expert; %d-token prompt, %d decoded; "
           "without a cache %.1f tok/s%s\n",
           PROG, dir, sparse, c->arch.n_experts, c->arch.top_k, expert, PROMPT, n_decode, tps0,
           opt_direct ? "; the cache reads with O_DIRECT" : "");
    printf("%-6s %-6s %-10s %7s %10s %9s %14s %8s %10s\n", "cache", "slots", "read-ahead", "hit %", "read MiB",
           "read GB/s", "ahead (used)", "wait s", "decode t/s");
    for (int f = 0; f < 4; f++)
        for (int a = 0; a < 2; a++) {
            struct run *u = &runs[n_runs++];
            u->frac = fracs[f];
            u->ahead = a;
            u->slots = (size_t)(fracs[f] * (double)all + 0.5);
            u->slots = u->slots ? u->slots : 1;
            run_one(m, u->slots * expert, a, prompt, n_decode, ids, &u->st, &u->decode_tps);
            u->same = memcmp(ids, ref, (size_t)n_decode * sizeof *ids) == 0;
            bad |= !u->same;
            const size_t used = u->st.experts.hits + u->st.experts.misses;
            const double gbs = u->st.experts.t_read > 0 ? (double)u->st.experts.bytes_read / u->st.experts.t_read / 1e9 : 0;
            printf("%5.0f%% %6zu %-10s %7.1f %10.3f %9.2f %7zu (%4zu) %8.4f %10.2f%s\n", 100 * u->frac, u->slots,
                   a ? "on" : "off", used ? 100.0 * (double)u->st.experts.hits / (double)used : 0.0,
                   (double)u->st.experts.bytes_read / 1048576.0, gbs, u->st.experts.prefetched,
                   u->st.experts.prefetch_hits, u->st.experts.t_wait, u->decode_tps,
                   u->same ? "" : "  GREEDY IDS DIFFER");
        }
    const char *jd = getenv("KVQ_BENCH_JSON_DIR");
    char path[4096];
    if (jd && *jd) {
        snprintf(path, sizeof path, "%s/bench_experts.json", jd);
    } else { /* this binary's folder */
        const char *slash = strrchr(argv[0], '/');
        const int len = slash ? (int)(slash - argv[0]) : 1;
        snprintf(path, sizeof path, "%.*s/bench_experts.json", len, slash ? argv[0] : ".");
    }
    FILE *js = fopen(path, "w");
    if (js) {
        fprintf(js, "{\"model\": \"%s\", \"sparse_layers\": %d, \"experts\": %d, \"top_k\": %d, \"expert_bytes\": %zu, "
                    "\"prompt\": %d, \"decode\": %d, \"direct\": %d, \"no_cache_tps\": %.2f, \"runs\": [",
                dir, sparse, c->arch.n_experts, c->arch.top_k, expert, PROMPT, n_decode, opt_direct, tps0);
        for (int i = 0; i < n_runs; i++) {
            const struct run *u = &runs[i];
            fprintf(js, "%s\n {\"cache_frac\": %.2f, \"slots\": %zu, \"read_ahead\": %d, \"hits\": %zu, \"misses\": %zu, "
                        "\"bytes_read\": %zu, \"read_s\": %.6f, \"prefetched\": %zu, \"prefetch_hits\": %zu, "
                        "\"wait_s\": %.6f, \"decode_tps\": %.2f, \"same_ids\": %d}",
                    i ? "," : "", u->frac, u->slots, u->ahead, u->st.experts.hits, u->st.experts.misses,
                    u->st.experts.bytes_read, u->st.experts.t_read, u->st.experts.prefetched,
                    u->st.experts.prefetch_hits, u->st.experts.t_wait, u->decode_tps, u->same);
        }
        fprintf(js, "\n]}\n");
        fclose(js);
        printf("JSON: %s\n", path);
    }
    free(ref);
    free(ids);
    kvq_model_free(m);
    return bad;
}
