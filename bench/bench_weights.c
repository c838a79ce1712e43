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
 *   bench_weights --make-random DIR   (writes the ~0.5B random bf16 checkpoint)
 * JSON: $KVQ_BENCH_JSON_DIR/bench_weights.json (default: this binary's folder).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdint.h>

#include "kvq_model.h"
#include "kvq_safetensors.h"
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

/* --make-random DIR: a random bf16 Llama checkpoint of about 0.5B
 * parameters (hidden 1536, 16 layers, 12 heads of 128, 4 KV heads, ffn
 * 4096, vocab 32000), weights ~ N(0, 0.02) by a fixed LCG, norms 1. */
static int make_random(const char *dir)
{
    enum { H = 1536, L = 16, NH = 12, NKV = 4, HD = 128, F = 4096, V = 32000 };
    char path[4096];
    mkdir(dir, 0777);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "{\"model_type\": \"llama\", \"hidden_size\": %d, \"num_hidden_layers\": %d, "
               "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, "
               "\"intermediate_size\": %d, \"vocab_size\": %d, \"max_position_embeddings\": 4096, "
               "\"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"bos_token_id\": 1, \"eos_token_id\": 2, "
               "\"tie_word_embeddings\": false, \"hidden_act\": \"silu\"}\n",
            H, L, NH, NKV, HD, F, V);
    if (fclose(f) != 0)
        return -1;
    kvq_st_writer *w = NULL;
    if (kvq_st_writer_create(&w) != KVQ_OK)
        return -1;
    struct {
        const char *name;
        int64_t r, c;
    } per[] = {{"input_layernorm.weight", H, 0},      {"post_attention_layernorm.weight", H, 0},
               {"self_attn.q_proj.weight", NH * HD, H}, {"self_attn.k_proj.weight", NKV * HD, H},
               {"self_attn.v_proj.weight", NKV * HD, H}, {"self_attn.o_proj.weight", H, NH * HD},
               {"mlp.gate_proj.weight", F, H},         {"mlp.up_proj.weight", F, H},
               {"mlp.down_proj.weight", H, F}};
    const int n_per = (int)(sizeof per / sizeof per[0]), n_t = L * n_per + 3;
    uint16_t **bufs = calloc((size_t)n_t, sizeof *bufs);
    char(*names)[96] = calloc((size_t)n_t, sizeof *names);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    int k = 0, rc = bufs && names ? 0 : -1;
    for (int t = 0; rc == 0 && t < n_t; t++) {
        int64_t r, c;
        if (t < L * n_per) {
            snprintf(names[t], sizeof names[t], "model.layers.%d.%s", t / n_per, per[t % n_per].name);
            r = per[t % n_per].r, c = per[t % n_per].c;
        } else {
            static const char *top[3] = {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"};
            snprintf(names[t], sizeof names[t], "%s", top[t - L * n_per]);
            r = t - L * n_per < 2 ? V : H, c = t - L * n_per < 2 ? H : 0;
        }
        size_t n = (size_t)r * (size_t)(c ? c : 1);
        bufs[k] = malloc(n * sizeof **bufs);
        if (!bufs[k]) {
            rc = -1;
            break;
        }
        for (size_t i = 0; i < n; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            /* sum of 4 uniforms: ~N(0, 1/3) scaled to sd 0.02; norms 1.0 (bf16 0x3f80) */
            double u = ((x >> 40) & 0xffff) + ((x >> 24) & 0xffff) + ((x >> 8) & 0xffff) + (x & 0xff) * 256.0;
            float v = (float)((u / 65536.0 - 2.0) * 0.0346);
            uint32_t b;
            memcpy(&b, &v, 4);
            bufs[k][i] = c ? (uint16_t)(b >> 16) : 0x3f80;
        }
        int64_t shape[2] = {r, c};
        if (kvq_st_writer_add(w, names[t], KVQ_ST_BF16, c ? 2 : 1, shape, bufs[k]) != KVQ_OK)
            rc = -1;
        k++;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (rc == 0 && kvq_st_writer_write(w, path, NULL) != KVQ_OK)
        rc = -1;
    kvq_st_writer_free(w);
    for (int i = 0; i < k; i++)
        free(bufs[i]);
    free(bufs);
    free(names);
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
        else if (strcmp(argv[i], "--make-random") == 0 && i + 1 < argc) {
            if (make_random(argv[++i]) != 0) {
                fprintf(stderr, "bench_weights: cannot write a random checkpoint in %s\n", argv[i]);
                return 1;
            }
            printf("bench_weights: wrote a random bf16 checkpoint (~0.5B parameters) in %s\n", argv[i]);
            return 0;
        } else {
            fprintf(stderr, "usage: bench_weights [--quick] [--model DIR] | --make-random DIR\n");
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
