/* bench_tokenize.c - tokenizer speed on 1 MiB of English, per family, against
 * Hugging Face's reference implementation timed on the same text.
 *
 * Text: the first 1 MiB of models/kvq-tiny-llama/reference/valid.txt.
 * Tokenizers: build/tokenizer-data/<family>/tokenizer.json (or
 * $KVQ_TOKENIZER_DATA), fetched by tests/tokenizer/fetch.sh; a family not
 * there is skipped. Reference: bench/bench_tokenize_hf.mjs under node
 * (@huggingface/tokenizers, installed by fetch.sh --node); "n/a" without it.
 * Both sides: median of 3 encodes, CPU time of one thread / the process,
 * and a hash of the ids to show they produced the same tokens.
 * Prints a table; writes bench_tokenize.json to $KVQ_BENCH_JSON_DIR.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq_tokenizer.h"
#include "bench_util.h"

#define TEXT_PATH "models/kvq-tiny-llama/reference/valid.txt"
#define TEXT_BYTES (1u << 20)

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    fclose(f);
    if (s) {
        s[n] = 0;
        *len = (size_t)n;
    }
    return s;
}

static unsigned long long fnv(const int32_t *ids, size_t n)
{
    unsigned long long h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned long long)(uint32_t)ids[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

int main(void)
{
    const char *dir = getenv("KVQ_TOKENIZER_DATA");
    if (!dir || !*dir)
        dir = "build/tokenizer-data";
    /* The tokenizers and the node reference (cached; one line and a skip when offline). */
    char fetch[600];
    snprintf(fetch, sizeof fetch, "sh tests/tokenizer/fetch.sh '%s' --node", dir);
    if (system(fetch) != 0)
        printf("bench_tokenize: tests/tokenizer/fetch.sh failed\n");
    size_t len;
    char *all = read_file(TEXT_PATH, &len);
    if (!all) {
        printf("bench_tokenize: %s not found (run from the repository root)\n", TEXT_PATH);
        return 1;
    }
    /* 1 MiB, cut back to a character boundary. */
    if (len > TEXT_BYTES) {
        len = TEXT_BYTES;
        while (len && ((unsigned char)all[len] & 0xC0) == 0x80)
            len--;
    }
    char tmp_path[] = "/tmp/kvq_bench_tokenize_XXXXXX";
    int fd = mkstemp(tmp_path);
    FILE *tf = fd >= 0 ? fdopen(fd, "wb") : NULL;
    int have_tmp = tf && fwrite(all, 1, len, tf) == len;
    if (tf)
        fclose(tf);

    const char *json_dir = getenv("KVQ_BENCH_JSON_DIR");
    char json_path[512];
    snprintf(json_path, sizeof json_path, "%s/bench_tokenize.json", json_dir ? json_dir : ".");
    FILE *json = fopen(json_path, "w");
    if (json)
        fprintf(json, "{\n  \"text_bytes\": %zu,\n  \"families\": [", len);

    printf("encode %zu bytes of English (valid.txt), median of 3, CPU time\n", len);
    printf("%-12s %8s %9s %9s %9s %10s %s\n", "tokenizer", "load s", "ids", "kvq MB/s", "HF MB/s", "kvq/HF", "same ids");
    const char *fams[] = {"llama3", "gemma3", "qwen3", "llama2", "deepseek_v3", "gptoss"};
    int first = 1;
    for (size_t k = 0; k < sizeof fams / sizeof fams[0]; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s/tokenizer.json", dir, fams[k]);
        kvq_tokenizer *tok = NULL;
        kvq_error err;
        double t0 = bench_clock_s(CLOCK_THREAD_CPUTIME_ID);
        if (kvq_tokenizer_create(path, &tok, &err) != KVQ_OK) {
            printf("%-12s skipped (%s)\n", fams[k], err.msg);
            continue;
        }
        double load = bench_clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
        double times[3];
        int32_t *ids = NULL;
        size_t n = 0;
        for (int r = 0; r < 3; r++) {
            free(ids);
            t0 = bench_clock_s(CLOCK_THREAD_CPUTIME_ID);
            kvq_status st = kvq_tokenizer_encode_alloc(tok, all, len, 0, &ids, &n);
            times[r] = bench_clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
            if (st) {
                printf("%-12s encode failed (status %d)\n", fams[k], st);
                return 1;
            }
        }
        double t = bench_median(times, 3), mbs = (double)len / 1e6 / t;
        unsigned long long h = fnv(ids, n);
        /* The reference, on the same bytes. */
        double hf = -1;
        int same = -1;
        if (have_tmp) {
            char cmd[1024];
            snprintf(cmd, sizeof cmd, "node bench/bench_tokenize_hf.mjs '%s' '%s' '%s' 2>/dev/null", dir, fams[k],
                     tmp_path);
            FILE *p = popen(cmd, "r");
            char line[256] = "";
            if (p) {
                if (!fgets(line, sizeof line, p))
                    line[0] = 0;
                pclose(p);
            }
            double secs;
            size_t hn;
            char hash[32];
            if (sscanf(line, "{\"seconds\":%lf,\"n_ids\":%zu,\"hash\":\"%31[0-9a-f]\"", &secs, &hn, hash) == 3) {
                hf = secs;
                char mine[32];
                snprintf(mine, sizeof mine, "%llx", h);
                same = hn == n && strcmp(mine, hash) == 0;
            }
        }
        char hf_s[32] = "n/a", ratio_s[32] = "n/a";
        if (hf > 0) {
            snprintf(hf_s, sizeof hf_s, "%.2f", (double)len / 1e6 / hf);
            snprintf(ratio_s, sizeof ratio_s, "%.1fx", hf / t);
        }
        printf("%-12s %8.2f %9zu %9.2f %9s %10s %s\n", fams[k], load, n, mbs, hf_s, ratio_s,
               same < 0 ? "n/a" : same ? "yes" : "NO");
        if (json) {
            fprintf(json, "%s\n    {\"tokenizer\": \"%s\", \"load_s\": %.4f, \"ids\": %zu, \"encode_s\": %.5f, "
                          "\"mb_per_s\": %.3f, \"hf_encode_s\": %.5f, \"same_ids_as_hf\": %d}",
                    first ? "" : ",", fams[k], load, n, t, mbs, hf, same);
            first = 0;
        }
        free(ids);
        kvq_tokenizer_free(tok);
    }
    if (json) {
        fprintf(json, "\n  ]\n}\n");
        fclose(json);
    }
    if (have_tmp)
        remove(tmp_path);
    free(all);
    return 0;
}
