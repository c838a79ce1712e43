/* prefill_llamacpp.c - prompt (prefill) and decode speed of llama.cpp's CPU
 * build on a given list of token ids, so that kvq and llama.cpp are timed on
 * exactly the same input (bench/prefill_llamacpp.py drives it next to
 * `kvq run`). Built against llama.cpp's public C API (llama.h) by
 * bench/llamacpp_get.sh; not part of kvq's build.
 *
 *   prefill_llamacpp -m MODEL.gguf --ids FILE [-t THREADS] [-r REPEAT] [-n GEN]
 *                    [--ctk f16|f32|q8_0] [--fa on|off] [--logits-at P,P,.. --logits-out F]
 *   prefill_llamacpp -m MODEL.gguf --tokenize      (text on stdin -> ids, BOS added)
 *
 * Context parameters are llama_context_default_params()'s (n_batch 2048,
 * n_ubatch 512: the defaults of llama.cpp's own tools) except n_ctx (the
 * prompt + GEN), threads, flash attention and the cache type. One warm-up
 * prefill, then REPEAT timed ones, each on a cleared cache (wall clock
 * around llama_decode of every n_batch piece, then llama_synchronize).
 * Prints one JSON object on stdout.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llama.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void quiet_log(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

/* Integers separated by anything else (commas, blanks, newlines). */
static int read_ids(const char *path, llama_token **out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    int n = 0, cap = 4096;
    llama_token *v = malloc((size_t)cap * sizeof *v);
    int c, have = 0;
    long x = 0;
    while (v) {
        c = fgetc(f);
        if (c != EOF && isdigit(c)) {
            x = 10 * x + (c - '0');
            have = 1;
            continue;
        }
        if (have) {
            if (n == cap && !(v = realloc(v, (size_t)(cap *= 2) * sizeof *v)))
                break;
            v[n++] = (llama_token)x;
        }
        x = 0;
        have = 0;
        if (c == EOF)
            break;
    }
    fclose(f);
    *out = v;
    return v ? n : -1;
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int tokenize_stdin(const struct llama_vocab *vocab)
{
    size_t n = 0, cap = 1 << 16;
    char *text = malloc(cap);
    for (size_t r; text && (r = fread(text + n, 1, cap - n, stdin)) > 0;)
        if ((n += r) == cap && !(text = realloc(text, cap *= 2)))
            return 1;
    if (!text)
        return 1;
    int m = llama_tokenize(vocab, text, (int32_t)n, NULL, 0, true, false);
    llama_token *ids = malloc((size_t)(m < 0 ? -m : m) * sizeof *ids + 1);
    m = llama_tokenize(vocab, text, (int32_t)n, ids, m < 0 ? -m : m, true, false);
    printf("{\"ids\": [");
    for (int i = 0; i < m; i++)
        printf("%s%d", i ? ", " : "", ids[i]);
    printf("]}\n");
    free(ids);
    free(text);
    return m < 0;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *ids_path = NULL, *logits_at = NULL, *logits_out = NULL, *ctk = "f16";
    int threads = 1, repeat = 3, gen = 0, fa = 1, tokenize = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--tokenize")) {
            tokenize = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "prefill_llamacpp: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "-m"))
            model_path = v;
        else if (!strcmp(a, "--ids"))
            ids_path = v;
        else if (!strcmp(a, "-t"))
            threads = atoi(v);
        else if (!strcmp(a, "-r"))
            repeat = atoi(v);
        else if (!strcmp(a, "-n"))
            gen = atoi(v);
        else if (!strcmp(a, "--ctk"))
            ctk = v;
        else if (!strcmp(a, "--fa"))
            fa = !strcmp(v, "on");
        else if (!strcmp(a, "--logits-at"))
            logits_at = v;
        else if (!strcmp(a, "--logits-out"))
            logits_out = v;
        else {
            fprintf(stderr, "prefill_llamacpp: unknown option %s\n", a);
            return 2;
        }
    }
    if (!model_path || (!ids_path && !tokenize) || threads < 1 || repeat < 1 || gen < 0) {
        fprintf(stderr, "usage: prefill_llamacpp -m MODEL.gguf --ids FILE [-t N] [-r N] [-n N] [--ctk T] [--fa on|off]\n");
        return 2;
    }
    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (!model) {
        fprintf(stderr, "prefill_llamacpp: cannot load %s\n", model_path);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    if (tokenize)
        return tokenize_stdin(vocab);

    llama_token *ids = NULL;
    const int n = read_ids(ids_path, &ids);
    if (n <= 0) {
        fprintf(stderr, "prefill_llamacpp: no ids in %s\n", ids_path);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n + gen + 1);
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = cp.type_v = !strcmp(ctk, "f32") ? GGML_TYPE_F32 : !strcmp(ctk, "q8_0") ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "prefill_llamacpp: cannot create a context\n");
        return 1;
    }
    const int n_batch = (int)llama_n_batch(ctx), n_vocab = llama_vocab_n_tokens(vocab);

    /* logits wanted at given prompt positions (a validation run) */
    int n_at = 0, *at = NULL;
    if (logits_at) {
        at = calloc((size_t)n, sizeof *at);
        for (const char *p = logits_at; *p;) {
            char *e;
            long x = strtol(p, &e, 10);
            if (e == p)
                break;
            if (x >= 0 && x < n)
                at[x] = 1, n_at++;
            p = *e ? e + 1 : e;
        }
    }
    float *saved = n_at ? malloc((size_t)n_at * (size_t)n_vocab * sizeof *saved) : NULL;
    struct llama_batch batch = llama_batch_init(n_batch, 0, 1);

    double *pre = malloc((size_t)(repeat + 1) * sizeof *pre), dec_s = 0.0;
    int *greedy = malloc((size_t)(gen > 0 ? gen : 1) * sizeof *greedy);
    for (int r = 0; r <= repeat; r++) { /* r == 0: warm-up */
        llama_memory_clear(llama_get_memory(ctx), true);
        int k = 0;
        double t0 = now_s();
        for (int p0 = 0; p0 < n; p0 += n_batch) {
            const int m = n - p0 < n_batch ? n - p0 : n_batch;
            batch.n_tokens = m;
            for (int j = 0; j < m; j++) {
                batch.token[j] = ids[p0 + j];
                batch.pos[j] = p0 + j;
                batch.n_seq_id[j] = 1;
                batch.seq_id[j][0] = 0;
                batch.logits[j] = (int8_t)(p0 + j == n - 1 || (at && at[p0 + j]));
            }
            if (llama_decode(ctx, batch) != 0) {
                fprintf(stderr, "prefill_llamacpp: llama_decode failed at %d\n", p0);
                return 1;
            }
            if (r == 0 && saved)
                for (int j = 0; j < m; j++)
                    if (at[p0 + j]) {
                        llama_synchronize(ctx);
                        memcpy(saved + (size_t)k++ * n_vocab, llama_get_logits_ith(ctx, j), (size_t)n_vocab * sizeof *saved);
                    }
        }
        llama_synchronize(ctx);
        pre[r] = now_s() - t0;
        if (r == repeat && gen > 0) { /* greedy continuation after the last prefill */
            int tok = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
            double t1 = now_s();
            for (int g = 0; g < gen; g++) {
                greedy[g] = tok;
                if (g + 1 == gen)
                    break;
                batch.n_tokens = 1;
                batch.token[0] = tok;
                batch.pos[0] = n + g;
                batch.n_seq_id[0] = 1;
                batch.seq_id[0][0] = 0;
                batch.logits[0] = 1;
                if (llama_decode(ctx, batch) != 0) {
                    fprintf(stderr, "prefill_llamacpp: decode step %d failed\n", g);
                    return 1;
                }
                tok = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
            }
            dec_s = now_s() - t1;
        }
    }
    if (saved && logits_out) {
        FILE *f = fopen(logits_out, "wb");
        if (!f || fwrite(saved, sizeof *saved, (size_t)n_at * n_vocab, f) != (size_t)n_at * n_vocab) {
            fprintf(stderr, "prefill_llamacpp: cannot write %s\n", logits_out);
            return 1;
        }
        fclose(f);
    }
    double *sorted = malloc((size_t)repeat * sizeof *sorted);
    memcpy(sorted, pre + 1, (size_t)repeat * sizeof *sorted);
    qsort(sorted, (size_t)repeat, sizeof *sorted, cmp_d);
    const double med = repeat % 2 ? sorted[repeat / 2] : 0.5 * (sorted[repeat / 2 - 1] + sorted[repeat / 2]);
    printf("{\"prompt_tokens\": %d, \"threads\": %d, \"n_batch\": %d, \"n_ubatch\": %u, \"flash_attn\": %s, "
           "\"cache_type\": \"%s\", \"warmup_s\": %.6f, \"prefill_s\": [",
           n, threads, n_batch, llama_n_ubatch(ctx), fa ? "true" : "false", ctk, pre[0]);
    for (int r = 1; r <= repeat; r++)
        printf("%s%.6f", r > 1 ? ", " : "", pre[r]);
    printf("], \"prefill_tok_s\": %.2f", n / med);
    if (gen > 0) {
        printf(", \"decode_tok_s\": %.2f, \"greedy\": [", gen > 1 ? (gen - 1) / dec_s : 0.0);
        for (int g = 0; g < gen; g++)
            printf("%s%d", g ? ", " : "", greedy[g]);
        printf("]");
    }
    printf(", \"system_info\": \"%s\"}\n", llama_print_system_info());
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
