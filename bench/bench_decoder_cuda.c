/* bench_decoder_cuda.c - the whole decoder on one GPU: decode and prefill
 * speed, device memory and capacity per cache type, for a Hugging Face
 * checkpoint (bench/decoder_cuda.sh makes a Llama-3.1-8B-shaped one with
 * random bf16 weights and runs transformers on it too).
 *
 *   bench_decoder_cuda --model DIR [--ctx 4096,32768,131072] [--batch 1,8]
 *                      [--types f16/f16,tq3j/tq3,tq3j/tq3+ctr] [--steps 32]
 *                      [--prefill 4096,32768] [--sample T,K,P] [--graphs on|off|both]
 *                      [--fast-prefill off|on|both] [--chunk 2048,...] [--json FILE]
 *
 * A --types entry K/V+ctr runs that pair with key centering
 * (kvq_seq_config.center_k), the kvq command's default with the window; a
 * plain K/V entry runs without it.
 * Decode: a kvq_batch of B slots, each given a context of N tokens without
 * its prefill (kvq_batch_fill: seeded random K/V in every layer; what a step
 * costs does not depend on the values), then 3 warm-up and `steps` timed
 * steps of one greedy token per slot (host wall time, the argmax read back
 * each step: what generation pays). Compressed types run with the
 * recent-token f16 window, as the kvq command does. --sample T,K,P adds
 * two rows per shape with temperature T, top-k K, top-p P: the token drawn
 * by the step on the GPU (kvq_batch_item.sampler: only the id comes back),
 * and drawn on the host from the step's logits (kvq_sampler_sample, what
 * every sampled step did before the GPU sampler). --graphs: decode steps
 * replayed as one CUDA graph (kvq_seq_config.cuda_graphs, the default), or
 * launched kernel by kernel, or both in turn (the default: the A/B of one
 * run; each mode gets a batch of its own, filled with the same seeds).
 * Bandwidth floor of a step: the bytes it must read (every weight matrix
 * once, and K/V of B x N tokens in the cache type) over the measured
 * device-to-device copy bandwidth; "% floor" is floor time / step time.
 * Prefill: one sequence, chunks of 2048 tokens (each --chunk size in turn)
 * from position 0 to N; --fast-prefill off runs the exact two-GEMM products,
 * on the default one bf16 GEMM (kvq_seq_config.fast_prefill), both each
 * length with both. Each row also gives the GPU's own time per part
 * (kvq_batch_stats.gpu_*: products, attention with the cache's appends, the
 * LM head, the rest).
 * Capacity: from the device memory free after the weights and activations
 * (measured), the cache's exact bytes per token: the longest context of one
 * sequence and the number of 128K-token sequences that fit.
 * Without a GPU it prints one line and writes nothing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_cuda_util.h"
#include "bench_util.h"
#include "decoder_internal.h"
#include "kvq_batch.h"
#include "kvq_cuda.h"
#include "kvq_model.h"

#define MAX_LIST 8

static int parse_list(const char *s, long *v)
{
    int n = 0;
    while (s && *s && n < MAX_LIST) {
        char *end;
        const long x = strtol(s, &end, 10);
        if (x > 0) /* "0" or an empty list: none */
            v[n++] = x;
        s = *end == ',' ? end + 1 : end + strlen(end);
    }
    return n;
}

static double now_s(void)
{
    return bench_clock_s(CLOCK_MONOTONIC);
}

/* Device-to-device copy bandwidth (bytes read + written per second), best of 5. */
static double copy_bandwidth(void)
{
    const size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    double best = 0;
    if (kvq_cuda_malloc(&a, bytes) == KVQ_OK && kvq_cuda_malloc(&b, bytes) == KVQ_OK) {
        kvq_cuda_memset(a, 1, bytes);
        for (int i = 0; i < 6; i++) {
            kvq_cuda_synchronize();
            double t0 = now_s();
            kvq_cuda_memcpy_d2d(b, a, bytes);
            kvq_cuda_synchronize();
            double bw = 2.0 * (double)bytes / (now_s() - t0);
            if (i > 0 && bw > best)
                best = bw;
        }
    }
    kvq_cuda_free(a);
    kvq_cuda_free(b);
    return best;
}

static size_t weight_bytes(const kvq_model *m)
{
    size_t n = 0;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int i = 0; i < 4; i++)
            n += kvq_wmat_bytes(&m->mats[l][i]);
    for (int k = 0; k < m->n_lm; k++)
        n += kvq_wmat_bytes(&m->lm[k].wm);
    return n;
}

static int g_center; /* the --types entry being run asked for key centering (+ctr) */

static kvq_status make_batch(const kvq_model *m, enum kvq_type tk, enum kvq_type tv, int B, size_t ctx, size_t rows,
                             int graphs, int fast, kvq_batch **out, char *why, size_t nwhy)
{
    struct kvq_batch_config bc;
    kvq_batch_config_default(&bc);
    bc.seq.device = KVQ_DEVICE_CUDA;
    bc.seq.cuda_graphs = graphs;
    bc.seq.fast_prefill = fast;
    bc.seq.center_k = g_center;
    bc.seq.type_k = tk;
    bc.seq.type_v = tv;
    bc.seq.max_ctx = ctx;
    bc.max_seqs = B;
    bc.max_rows = rows;
    kvq_error err = {0};
    kvq_status st = kvq_batch_create(m, &bc, out, &err);
    snprintf(why, nwhy, "%s", st == KVQ_OK ? "" : err.msg[0] ? err.msg : kvq_status_str(st));
    return st;
}

/* How a decode step's token is chosen. */
enum { GREEDY, ON_DEVICE, ON_HOST };
static const char *const choose_name[] = {"greedy", "device", "host"};
#define MAX_B 256

/* Median wall time of `steps` steps (after 3 warm-up ones) of one token per
 * slot, chosen as `choose` says with settings sp (sampled modes). */
static kvq_status time_steps(kvq_batch *b, const struct kvq_model_config *c, const int *slots, int B, int choose,
                             const kvq_sampler_params *sp, int steps, double *ms, kvq_error *err)
{
    static struct kvq_batch_item it[MAX_B];
    static int32_t tok[MAX_B], next[MAX_B];
    static kvq_sampler *smp[MAX_B];
    static double times[512];
    const size_t V = (size_t)c->vocab;
    float *logits = choose == ON_HOST ? malloc((size_t)B * V * sizeof *logits) : NULL;
    kvq_status st = choose == ON_HOST && !logits ? KVQ_ERR_NOMEM : KVQ_OK;
    steps = steps < 512 ? steps : 512;
    memset(smp, 0, sizeof smp);
    for (int i = 0; i < B && st == KVQ_OK; i++) {
        if (choose != GREEDY)
            st = kvq_sampler_create(c->vocab, sp, &smp[i]);
        tok[i] = (int32_t)(i % c->vocab);
        it[i] = (struct kvq_batch_item){.slot = slots[i], .ids = &tok[i], .n = 1};
        if (choose == GREEDY)
            it[i].argmax = &next[i];
        else if (choose == ON_DEVICE)
            it[i].sampler = smp[i], it[i].token = &next[i];
        else
            it[i].logits = logits + (size_t)i * V;
    }
    /* KVQ_BENCH_PROFILE: the last step alone under the profiler (ncu
     * --profile-from-start off): one step's kernels, graph nodes included */
    const int prof = getenv("KVQ_BENCH_PROFILE") != NULL;
    for (int s = 0; s < 3 + steps && st == KVQ_OK; s++) {
        if (prof && s == 2 + steps)
            bench_cuda_profile(1);
        double ts = now_s();
        st = kvq_batch_step(b, it, B, err);
        if (prof && s == 2 + steps)
            bench_cuda_profile(0);
        for (int i = 0; i < B && st == KVQ_OK && choose == ON_HOST; i++)
            st = kvq_sampler_sample(smp[i], logits + (size_t)i * V, &next[i]);
        if (s >= 3)
            times[s - 3] = now_s() - ts;
        for (int i = 0; i < B; i++)
            tok[i] = next[i];
    }
    *ms = st == KVQ_OK ? 1e3 * bench_median(times, steps) : NAN;
    for (int i = 0; i < B; i++)
        kvq_sampler_free(smp[i]);
    free(logits);
    return st;
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL, *json_path = NULL, *types = "f16/f16,tq3j/tq3,tq3j/tq3+ctr";
    long ctxs[MAX_LIST] = {4096, 32768, 131072}, batches[MAX_LIST] = {1, 8}, prefills[MAX_LIST] = {4096, 32768};
    long chunks[MAX_LIST] = {2048};
    int n_ctx = 3, n_batch = 2, n_prefill = 2, steps = 32, n_choose = 1, g_lo = 0, g_hi = 1, fast_lo = 0, fast_hi = 0;
    int n_chunk = 1;
    kvq_sampler_params sp = kvq_sampler_params_default();
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            model_dir = argv[i + 1];
        else if (!strcmp(argv[i], "--ctx"))
            n_ctx = parse_list(argv[i + 1], ctxs);
        else if (!strcmp(argv[i], "--batch"))
            n_batch = parse_list(argv[i + 1], batches);
        else if (!strcmp(argv[i], "--prefill"))
            n_prefill = parse_list(argv[i + 1], prefills);
        else if (!strcmp(argv[i], "--types"))
            types = argv[i + 1];
        else if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--json"))
            json_path = argv[i + 1];
        else if (!strcmp(argv[i], "--chunk"))
            n_chunk = parse_list(argv[i + 1], chunks);
        else if (!strcmp(argv[i], "--fast-prefill")) {
            const char *f = argv[i + 1];
            fast_lo = !strcmp(f, "on") ? 1 : 0;
            fast_hi = !strcmp(f, "off") ? 0 : 1;
            if (strcmp(f, "on") && strcmp(f, "off") && strcmp(f, "both")) {
                fprintf(stderr, "bench_decoder_cuda: --fast-prefill takes on, off or both, not '%s'\n", f);
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--graphs")) {
            const char *g = argv[i + 1];
            g_lo = !strcmp(g, "on") ? 1 : 0;
            g_hi = !strcmp(g, "off") ? 0 : 1;
            if (strcmp(g, "on") && strcmp(g, "off") && strcmp(g, "both")) {
                fprintf(stderr, "bench_decoder_cuda: --graphs takes on, off or both, not '%s'\n", g);
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--sample")) {
            if (sscanf(argv[i + 1], "%f,%d,%f", &sp.temperature, &sp.top_k, &sp.top_p) != 3 ||
                kvq_sampler_params_check(&sp) != KVQ_OK || sp.temperature == 0.0f) {
                fprintf(stderr, "bench_decoder_cuda: --sample wants T,K,P (T > 0, K >= 0, P in (0, 1]), not '%s'\n",
                        argv[i + 1]);
                return 2;
            }
            n_choose = 3;
        }
    }
    if (kvq_cuda_device_count() == 0 || !model_dir) {
        printf("bench_decoder_cuda: skipped (%s)\n", model_dir ? "no CUDA device" : "no --model: see bench/decoder_cuda.sh");
        return 0;
    }
    char dev_name[256];
    kvq_cuda_device_describe(dev_name, sizeof dev_name);
    size_t free0, total;
    kvq_cuda_mem_info(&free0, &total);
    const double bw = copy_bandwidth();
    struct kvq_model_load_opts lo;
    kvq_model_load_opts_default(&lo);
    kvq_model *m = NULL;
    kvq_error err = {0};
    double t0 = now_s();
    if (kvq_model_load(model_dir, &lo, &m, &err) != KVQ_OK) {
        fprintf(stderr, "bench_decoder_cuda: %s\n", err.msg);
        return 1;
    }
    const double t_load = now_s() - t0;
    const struct kvq_model_config *c = kvq_model_config_of(m);
    const size_t wbytes = weight_bytes(m);
    printf("device: %s; copy bandwidth %.0f GB/s\n", dev_name, bw / 1e9);
    printf("model: %s, %d layers, hidden %d, heads %d/%d, d %d, ffn %d, vocab %d; matrices %.2f GB (host load %.1f s)\n",
           model_dir, c->n_layers, c->hidden, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn, c->vocab, wbytes / 1e9,
           t_load);
    FILE *js = json_path ? fopen(json_path, "w") : NULL;
    if (js)
        fprintf(js, "{\"device\": \"%s\", \"copy_bw_gbs\": %.1f, \"weight_bytes\": %zu, \"results\": [\n", dev_name,
                bw / 1e9, wbytes);
    int first = 1;
    printf("\n%-9s %5s %7s %-7s %6s %10s %9s %9s %8s %8s  %s\n", "types", "batch", "ctx", "choose", "graphs",
           "ms/step", "tok/s", "floor ms", "% floor", "mem GiB", "note");
    char list[256];
    snprintf(list, sizeof list, "%s", types);
    for (char *tp = strtok(list, ","); tp; tp = strtok(NULL, ",")) {
        char kname[32] = "", pair[64];
        snprintf(pair, sizeof pair, "%s", tp); /* the types; tp (printed) keeps its +ctr */
        const size_t tl = strlen(pair);
        g_center = tl > 4 && !strcmp(pair + tl - 4, "+ctr");
        if (g_center)
            pair[tl - 4] = 0;
        const char *slash = strchr(pair, '/');
        enum kvq_type tk, tv;
        if (slash && (size_t)(slash - pair) < sizeof kname)
            memcpy(kname, pair, (size_t)(slash - pair));
        if (!slash || kvq_type_from_name(kname, &tk) != KVQ_OK || kvq_type_from_name(slash + 1, &tv) != KVQ_OK) {
            fprintf(stderr, "bench_decoder_cuda: bad --types entry '%s'\n", tp);
            return 2;
        }
        for (int bi = 0; bi < n_batch; bi++)
            for (int ci = 0; ci < n_ctx; ci++)
                for (int graphs = g_hi; graphs >= g_lo; graphs--) {
                    const int B = (int)batches[bi];
                    const size_t N = (size_t)ctxs[ci];
                    kvq_batch *b = NULL;
                    char why[300] = "";
                    /* a context at the model's limit: filled to the limit less the steps of every mode */
                    const size_t lim = (size_t)c->max_ctx, room = (size_t)n_choose * ((size_t)steps + 3) + 8;
                    const size_t mc = N + room <= lim ? N + room : lim, fill = mc - room;
                    kvq_status st = B <= MAX_B ? make_batch(m, tk, tv, B, mc, (size_t)B, graphs, 0, &b, why, sizeof why)
                                               : KVQ_ERR_INVALID_ARG;
                    int slots[MAX_B];
                    for (int i = 0; st == KVQ_OK && i < B; i++)
                        if ((st = kvq_batch_add(b, &slots[i])) == KVQ_OK)
                            st = kvq_batch_fill(b, slots[i], fill, 1234 + (uint64_t)i);
                    if (st != KVQ_OK && !why[0])
                        snprintf(why, sizeof why, "%s", kvq_status_str(st));
                    for (int choose = 0; choose < n_choose; choose++) {
                        double ms = NAN, floor_ms = NAN;
                        size_t free1 = 0, tot1 = 0;
                        if (st == KVQ_OK && (st = time_steps(b, c, slots, B, choose, &sp, steps, &ms, &err)) != KVQ_OK)
                            snprintf(why, sizeof why, "step: %s", err.msg[0] ? err.msg : kvq_status_str(st));
                        if (st == KVQ_OK) {
                            struct kvq_batch_stats bs;
                            kvq_batch_get_stats(b, &bs);
                            const double read = (double)wbytes + (double)B * (double)fill * (double)bs.bytes_per_token;
                            floor_ms = 1e3 * read / bw;
                            kvq_cuda_mem_info(&free1, &tot1);
                        }
                        const double mem = st == KVQ_OK ? (double)(total - free1) / (1 << 30) : NAN;
                        printf("%-9s %5d %7zu %-7s %6s %10.2f %9.1f %9.2f %7.1f%% %8.2f  %s\n", tp, B, N,
                               choose_name[choose], graphs ? "on" : "off", ms, B * 1e3 / ms, floor_ms,
                               100.0 * floor_ms / ms, mem, why);
                        if (js) {
                            fprintf(js, "%s {\"kind\": \"decode\", \"types\": \"%s\", \"batch\": %d, \"ctx\": %zu, "
                                        "\"choose\": \"%s\", \"graphs\": %d, ",
                                    first ? "" : ",", tp, B, N, choose_name[choose], graphs);
                            if (choose != GREEDY)
                                fprintf(js, "\"temperature\": %g, \"top_k\": %d, \"top_p\": %g, ", sp.temperature,
                                        sp.top_k, sp.top_p);
                            if (st == KVQ_OK)
                                fprintf(js,
                                        "\"ms_per_step\": %.4f, \"tok_s\": %.2f, \"floor_ms\": %.4f, \"device_gib\": %.3f}\n",
                                        ms, B * 1e3 / ms, floor_ms, mem);
                            else
                                fprintf(js, "\"error\": \"%s\"}\n", why);
                            first = 0;
                        }
                }
                kvq_batch_free(b);
            }
        /* capacity: what the memory left after the weights holds */
        kvq_batch *b = NULL;
        char why[300];
        if (make_batch(m, tk, tv, 1, 4096, 2048, 1, 0, &b, why, sizeof why) == KVQ_OK) {
            struct kvq_batch_stats bs;
            kvq_batch_get_stats(b, &bs);
            size_t fr, tt;
            kvq_cuda_mem_info(&fr, &tt);
            /* that batch's pool (one 4K-token slot) is small; the rest is free for pages */
            const double room = (double)fr + 4096.0 * (double)bs.bytes_per_token;
            const double per128 = 131072.0 * (double)bs.bytes_per_token + (double)bs.fixed_bytes;
            printf("%-9s capacity: %.0f bytes/token, longest context %.0fK tokens, %d sequences of 128K (%.1f GiB free)\n",
                   tp, (double)bs.bytes_per_token, room / (double)bs.bytes_per_token / 1024.0, (int)(room / per128),
                   room / (1 << 30));
            if (js) {
                fprintf(js, "%s {\"kind\": \"capacity\", \"types\": \"%s\", \"bytes_per_token\": %zu, "
                            "\"longest_ctx\": %.0f, \"seqs_128k\": %d, \"free_gib\": %.3f}\n",
                        first ? "" : ",", tp, bs.bytes_per_token, room / (double)bs.bytes_per_token,
                        (int)(room / per128), room / (1 << 30));
                first = 0;
            }
            /* prefill */
            kvq_batch_free(b);
            for (int pi = 0; pi < n_prefill; pi++)
                for (int ci = 0; ci < n_chunk; ci++)
                for (int fast = fast_lo; fast <= fast_hi; fast++) {
                    const size_t N = (size_t)prefills[pi], chunk = (size_t)chunks[ci];
                    b = NULL;
                    /* the whole context when N is the model's maximum (131072: Llama 3.1) */
                    const size_t fit = c->max_ctx > 0 && N + 8 > (size_t)c->max_ctx ? (size_t)c->max_ctx : N + 8;
                    if (make_batch(m, tk, tv, 1, fit, chunk, 1, fast, &b, why, sizeof why) != KVQ_OK) {
                        printf("%-9s prefill %zu tokens: skipped (%s)\n", tp, N, why);
                        continue;
                    }
                    int slot;
                    kvq_batch_add(b, &slot);
                    int32_t *ids = malloc(chunk * sizeof *ids), am;
                    for (size_t i = 0; i < chunk; i++)
                        ids[i] = (int32_t)((i * 7919) % (size_t)c->vocab);
                    kvq_cuda_synchronize();
                    double ts = now_s();
                    kvq_status st = KVQ_OK;
                    for (size_t done = 0; done < N && st == KVQ_OK; done += chunk) {
                        const size_t n = N - done < chunk ? N - done : chunk;
                        struct kvq_batch_item it = {.slot = slot, .ids = ids, .n = n,
                                                    .argmax = done + n >= N ? &am : NULL};
                        st = kvq_batch_step(b, &it, 1, &err);
                    }
                    kvq_cuda_synchronize();
                    const double t = now_s() - ts;
                    struct kvq_batch_stats ps;
                    kvq_batch_get_stats(b, &ps);
                    printf("%-9s prefill %zu tokens%s, chunks of %zu: %.2f s (%.0f tokens/s)%s; GPU: products %.2f s, "
                           "attention %.2f s, LM head %.2f s, rest %.2f s\n",
                           tp, N, fast ? " (fast)" : "", chunk, t, N / t, st == KVQ_OK ? "" : " FAILED", ps.gpu_matmul,
                           ps.gpu_attn, ps.gpu_lm_head, ps.gpu_other);
                    if (js) {
                        fprintf(js, "%s {\"kind\": \"prefill\", \"types\": \"%s\", \"ctx\": %zu, \"chunk\": %zu, "
                                    "\"fast_prefill\": %d, \"seconds\": %.3f, \"ok\": %d, \"gpu_matmul\": %.3f, "
                                    "\"gpu_attn\": %.3f, \"gpu_lm_head\": %.3f, \"gpu_other\": %.3f}\n",
                                first ? "" : ",", tp, N, chunk, fast, t, st == KVQ_OK, ps.gpu_matmul, ps.gpu_attn,
                                ps.gpu_lm_head, ps.gpu_other);
                        first = 0;
                    }
                    free(ids);
                    kvq_batch_free(b);
                }
        }
    }
    if (js) {
        fprintf(js, "]}\n");
        fclose(js);
    }
    kvq_model_free(m);
    return 0;
}
