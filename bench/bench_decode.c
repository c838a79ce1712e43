/* bench_decode.c - end-to-end prefill and decode speed of the bundled model
 * (kvq-tiny-llama) with each KV cache type, with and without n-gram
 * speculative decoding.
 *
 * The prompt is natural text (the start of the fixture's valid.txt, encoded
 * with the model's tokenizer) cut to 512, 2048 and 4032 tokens (4K minus
 * room for decoding). For every context and cache type (f32, f16, q8_0 for
 * K and V, the library default tq3j K / tq3 V, and the same with the recent
 * f16 window, "tq3j/tq3+win", and that with key centering, the default of the
 * kvq commands, "tq3j/tq3+win+ctr"; then q4_0,
 * the rotated q4_0r that llama.cpp users get, and tq5/tq4, whose 5-bit
 * codebook the SIMD kernels read by gathers, for what each costs):
 *   prefill  tokens/s of one forward over the whole prompt (chunks of 256);
 *   decode   tokens/s of 32 greedy tokens continuing it (plain, then with
 *            --speculative 4), the cache truncated back to the prompt before
 *            each repetition;
 *   host     the share of decode time outside sgemm, attention and the LM
 *            head (embedding copies, norms, RoPE, drafting, bookkeeping).
 * The cache types are interleaved within each repetition so that machine
 * noise hits them alike; medians over the repetitions are reported, and the
 * decode speed of each type relative to f32 at the same context.
 *
 *   bench_decode [--quick]   (--quick: one repetition, 512 and 2048 only)
 * JSON: $KVQ_BENCH_JSON_DIR/bench_decode.json (default: this binary's folder).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvq_model.h"
#include "kvq_tokenizer.h"
#include "bench_util.h"

#define MODEL "models/kvq-tiny-llama"
#define TEXT "models/kvq-tiny-llama/reference/valid.txt"
#define N_DECODE 32
#define SPEC 4
#define MAX_REPS 5
#define N_TYPES 9
#define N_CTX 3

static const struct {
    enum kvq_type k, v;
    int window; /* kvq_seq_config.recent_f16 */
    int center; /* kvq_seq_config.center_k */
} types[N_TYPES] = {
    {KVQ_TYPE_F32, KVQ_TYPE_F32, 0, 0},   {KVQ_TYPE_F16, KVQ_TYPE_F16, 0, 0},   {KVQ_TYPE_Q8_0, KVQ_TYPE_Q8_0, 0, 0},
    {KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 0, 0},  {KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 1, 0},  {KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3, 1, 1},
    {KVQ_TYPE_Q4_0, KVQ_TYPE_Q4_0, 0, 0}, {KVQ_TYPE_Q4_0R, KVQ_TYPE_Q4_0R, 0, 0}, {KVQ_TYPE_TQ5, KVQ_TYPE_TQ4, 0, 0},
};
static const size_t contexts[N_CTX] = {512, 2048, 4032};

/* The first `want` tokens of valid.txt (BOS first). */
static int32_t *prompt_ids(size_t want)
{
    FILE *f = fopen(TEXT, "rb");
    if (!f)
        return NULL;
    size_t cap = 64 * want; /* bytes of text: several per token */
    char *text = malloc(cap + 1);
    size_t len = text ? fread(text, 1, cap, f) : 0;
    fclose(f);
    kvq_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    if (text && kvq_tokenizer_create(MODEL "/tokenizer.json", &tok, NULL) == KVQ_OK)
        kvq_tokenizer_encode_alloc(tok, text, len, 1, &ids, &n);
    kvq_tokenizer_free(tok);
    free(text);
    if (n < want) {
        free(ids);
        return NULL;
    }
    return ids;
}

struct result {
    double prefill[MAX_REPS], decode[2][MAX_REPS], host[2][MAX_REPS], tpf[2][MAX_REPS];
};

/* Decodes N_DECODE tokens after the prompt already in s. */
static int decode(kvq_seq *s, const int32_t *ids, size_t ctx, int spec, struct result *r, int rep)
{
    kvq_seq_truncate(s, ctx);
    struct kvq_seq_stats a, b;
    kvq_seq_get_stats(s, &a);
    struct kvq_gen_params gp;
    kvq_gen_params_default(&gp);
    gp.max_tokens = N_DECODE;
    gp.speculative = spec;
    gp.stop_at_eos = 0;
    int32_t out[N_DECODE];
    size_t n;
    if (kvq_seq_generate(s, ids + ctx, 1, &gp, out, N_DECODE, &n, NULL, NULL) != KVQ_OK || n != N_DECODE)
        return -1;
    kvq_seq_get_stats(s, &b);
    double t = b.t_decode - a.t_decode;
    double busy = (b.t_decode + b.t_prefill) - (a.t_decode + a.t_prefill);
    int k = spec > 0;
    r->decode[k][rep] = (double)(b.decode_tokens - a.decode_tokens) / t;
    r->host[k][rep] = busy > 0 ? (b.t_host - a.t_host) / busy : 0;
    r->tpf[k][rep] = (double)(b.decode_tokens - a.decode_tokens) / (double)(b.decode_forwards - a.decode_forwards);
    return 0;
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    int reps = quick ? 1 : 3, n_ctx = quick ? 2 : N_CTX;
    kvq_model *m = NULL;
    kvq_error err = {0};
    double t0 = bench_clock_s(CLOCK_MONOTONIC);
    if (kvq_model_load(MODEL, NULL, &m, &err) != KVQ_OK) {
        fprintf(stderr, "bench_decode: %s (run from the repository root)\n", err.msg);
        return 1;
    }
    double load = bench_clock_s(CLOCK_MONOTONIC) - t0;
    int32_t *ids = prompt_ids(contexts[N_CTX - 1] + 1);
    if (!ids) {
        fprintf(stderr, "bench_decode: cannot tokenize %s\n", TEXT);
        return 1;
    }
    char path[4096];
    const char *dir = getenv("KVQ_BENCH_JSON_DIR");
    if (dir) {
        snprintf(path, sizeof path, "%s/bench_decode.json", dir);
    } else {
        const char *slash = strrchr(argv[0], '/');
        int len = slash ? (int)(slash - argv[0]) : 1;
        snprintf(path, sizeof path, "%.*s/bench_decode.json", len, slash ? argv[0] : ".");
    }
    FILE *json = fopen(path, "w");
    if (!json) {
        fprintf(stderr, "bench_decode: cannot write %s\n", path);
        return 1;
    }
    fprintf(json, "{\n  \"benchmark\": \"bench_decode\",\n  \"model\": \"%s\",\n  \"load_s\": %.4f,\n"
                  "  \"decode_tokens\": %d,\n  \"speculative\": %d,\n  \"repetitions\": %d,\n  \"results\": [",
            MODEL, load, N_DECODE, SPEC, reps);
    printf("kvq-tiny-llama end to end (model load %.3f s); medians of %d repetitions\n", load, reps);
    printf("%6s %-17s %12s %12s %12s %9s %7s %10s\n", "ctx", "cache K/V", "prefill t/s", "decode t/s",
           "spec4 t/s", "tok/fwd", "host%", "vs f32");
    int first = 1, status = 0;
    for (int c = 0; c < n_ctx; c++) {
        size_t ctx = contexts[c];
        kvq_seq *seqs[N_TYPES] = {0};
        static struct result res[N_TYPES];
        memset(res, 0, sizeof res);
        for (int t = 0; t < N_TYPES; t++) {
            struct kvq_seq_config sc;
            kvq_seq_config_default(&sc);
            sc.type_k = types[t].k;
            sc.type_v = types[t].v;
            sc.recent_f16 = types[t].window;
            sc.center_k = types[t].center;
            if (kvq_seq_create(m, &sc, &seqs[t], &err) != KVQ_OK) {
                fprintf(stderr, "bench_decode: %s\n", err.msg);
                return 1;
            }
        }
        for (int r = 0; r < reps; r++)
            for (int t = 0; t < N_TYPES; t++) {
                kvq_seq_reset(seqs[t]);
                int32_t tok;
                double a = bench_clock_s(CLOCK_MONOTONIC);
                if (kvq_seq_forward(seqs[t], ids, ctx, ctx - 1, NULL, &tok) != KVQ_OK)
                    status = 1;
                res[t].prefill[r] = (double)ctx / (bench_clock_s(CLOCK_MONOTONIC) - a);
            }
        for (int r = 0; r < reps; r++)
            for (int t = 0; t < N_TYPES; t++)
                for (int spec = 0; spec <= SPEC; spec += SPEC)
                    if (decode(seqs[t], ids, ctx, spec, &res[t], r) != 0)
                        status = 1;
        double f32_decode = 0;
        for (int t = 0; t < N_TYPES; t++) {
            struct result *x = &res[t];
            double pf = bench_median(x->prefill, reps), d0 = bench_median(x->decode[0], reps), d1 = bench_median(x->decode[1], reps);
            double tpf = bench_median(x->tpf[1], reps), host = bench_median(x->host[0], reps);
            if (t == 0)
                f32_decode = d0;
            char name[32];
            snprintf(name, sizeof name, "%s/%s%s%s", kvq_type_traits(types[t].k)->name,
                     kvq_type_traits(types[t].v)->name, types[t].window ? "+win" : "", types[t].center ? "+ctr" : "");
            printf("%6zu %-17s %12.0f %12.1f %12.1f %9.2f %6.1f%% %9.2fx\n", ctx, name, pf, d0, d1, tpf, 100 * host,
                   d0 / f32_decode);
            fprintf(json,
                    "%s\n    {\"context\": %zu, \"cache\": \"%s\", \"prefill_tokens_per_s\": %.2f, "
                    "\"decode_tokens_per_s\": %.3f, \"decode_spec_tokens_per_s\": %.3f, "
                    "\"spec_tokens_per_forward\": %.3f, \"decode_host_share\": %.4f, "
                    "\"decode_spec_host_share\": %.4f, \"decode_vs_f32\": %.4f}",
                    first ? "" : ",", ctx, name, pf, d0, d1, tpf, host, bench_median(x->host[1], reps), d0 / f32_decode);
            first = 0;
        }
        for (int t = 0; t < N_TYPES; t++)
            kvq_seq_free(seqs[t]);
    }
    fprintf(json, "\n  ]\n}\n");
    fclose(json);
    printf("JSON: %s\n", path);
    free(ids);
    kvq_model_free(m);
    if (status)
        fprintf(stderr, "bench_decode: a forward or generation failed\n");
    return status;
}
