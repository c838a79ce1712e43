/* generate.c: cc generate.c $(pkg-config --cflags --libs kvq) -lm -o generate */
/*
 * Load a model, encode a prompt, generate on the compressed KV cache:
 *
 *     ./generate models/kvq-tiny-llama "The grass is green." 32
 *
 * The generated text streams to stdout as it is decoded (what `kvq run
 * --model DIR --prompt TEXT --max-tokens N` prints, byte for byte); one line
 * on stderr says what the cache held. Built and run by tests/test_example.sh.
 */
#include <kvq/kvq_model.h>
#include <kvq/kvq_tokenizer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Called with every generated id once it is final. The streaming
 * detokenizer hands back only complete UTF-8 characters, so a character
 * spelled by several byte tokens is printed once it is whole. */
static int print_token(void *user, int32_t id)
{
    const char *text;
    size_t len;
    if (kvq_detok_push(user, id, &text, &len) == KVQ_OK)
        fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0; /* non-zero would stop generation here */
}

int main(int argc, char **argv)
{
    if (argc != 4 || atoi(argv[3]) < 1) {
        fprintf(stderr, "usage: %s MODEL_DIR PROMPT MAX_TOKENS\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1], *prompt = argv[2];
    const int max_tokens = atoi(argv[3]);
    kvq_error err = {0};
    kvq_model *model = NULL;
    kvq_tokenizer *tok = NULL;
    kvq_seq *seq = NULL;
    kvq_detok *detok = NULL;
    int32_t *ids = NULL, *out = NULL;
    size_t n_ids = 0, n_out = 0;
    int rc = 1;

    /* 1. The model: config.json and the safetensors files (or a `kvq shard`
     *    directory), weights memory-mapped. Immutable once loaded: any number
     *    of sequences, on any threads, may share it. */
    if (kvq_model_load(dir, NULL, &model, &err) != KVQ_OK)
        goto fail;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (kvq_tokenizer_create(path, &tok, &err) != KVQ_OK)
        goto fail;

    /* 2. A sequence: one KV cache per layer, activation buffers, sampler.
     *    The defaults are the kvq command's: tq3j keys, tq3 values, the
     *    recent-token f16 window, centred keys, on the CPU (cfg.device =
     *    KVQ_DEVICE_CUDA for the GPU). Nothing is allocated after this. */
    struct kvq_seq_config cfg;
    kvq_seq_config_default(&cfg);
    if (kvq_seq_create(model, &cfg, &seq, &err) != KVQ_OK)
        goto fail;

    /* 3. Generate: the prompt's ids with BOS (add_bos = 1), greedy decoding
     *    (temperature 0) up to max_tokens or an end-of-sequence id. */
    kvq_status st = kvq_tokenizer_encode_alloc(tok, prompt, strlen(prompt), 1, &ids, &n_ids);
    if (st == KVQ_OK)
        st = kvq_detok_create(tok, KVQ_DETOK_SKIP_CONTROL, &detok);
    if (st == KVQ_OK && !(out = malloc((size_t)max_tokens * sizeof *out)))
        st = KVQ_ERR_NOMEM;
    if (st != KVQ_OK) {
        kvq_error_set(&err, st, "encoding the prompt: %s", kvq_status_str(st));
        goto fail;
    }
    struct kvq_gen_params gp;
    kvq_gen_params_default(&gp);
    gp.max_tokens = max_tokens;
    st = kvq_seq_generate(seq, ids, n_ids, &gp, out, (size_t)max_tokens, &n_out, print_token, detok);
    const char *tail;
    size_t len;
    if (kvq_detok_finish(detok, &tail, &len) == KVQ_OK)
        fwrite(tail, 1, len, stdout); /* a byte run still pending at the end */
    putchar('\n');
    if (st != KVQ_OK) {
        kvq_error_set(&err, st, "generating: %s", kvq_status_str(st));
        goto fail;
    }

    struct kvq_seq_stats stats;
    kvq_seq_get_stats(seq, &stats);
    fprintf(stderr, "%zu prompt + %zu generated tokens; KV cache %zu bytes, %zu as f16\n", n_ids, n_out,
            stats.kv_bytes_used, stats.kv_bytes_f16);
    rc = 0;
fail:
    if (rc)
        fprintf(stderr, "generate: %s\n", err.msg[0] ? err.msg : "failed");
    free(out);
    free(ids);
    kvq_detok_free(detok);
    kvq_seq_free(seq); /* every sequence before its model */
    kvq_tokenizer_free(tok);
    kvq_model_free(model);
    return rc;
}
