/* cmd_run.c - `kvq run`: generate text with a Llama-family model whose KV
 * cache lives in kvq caches.
 *
 * Text streams to stdout as tokens become final (never splitting a UTF-8
 * character); the timing and memory summary goes to stderr, so stdout holds
 * only the answer (or, with --json, one JSON object).
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv_auto.h"
#include "kv_opts.h"
#include "kvq_file.h"
#include "kvq_model.h"
#include "kvq_qkv_dump.h"
#include "kvq_tokenizer.h"
#include "kvq_chat.h"
#include "kvq_cuda.h"

#define CMD "run"
#define DUMP_Q_LAST 256 /* queries kept by --dump-qkv, as in the reference dumps */
#define MAX_TOKENS (1 << 24)

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvq run --model DIR (--prompt TEXT | --prompt-file F | --prompt-ids IDS) [options]\n\n"
            "Runs a Llama-family model (a Hugging Face directory or a `kvq shard` output) on\n"
            "the prompt and streams the continuation to stdout; timings and KV-cache memory\n"
            "go to stderr.\n\n"
            "  --model DIR          model directory\n"
            "  --prompt TEXT        prompt text (BOS is prepended)\n"
            "  --prompt-file F      prompt from a file, '-' for stdin (one trailing newline is dropped)\n"
            "  --prompt-ids IDS     prompt as token ids, e.g. 1,450,3791 (no BOS added)\n"
            "  --chat MSG|FILE      prompt = the model's chat template (tokenizer_config.json) over a\n"
            "                       messages JSON file ([{\"role\":..., \"content\":...}, ...]) or one\n"
            "                       user message; ends with the assistant header\n"
            "  --max-tokens N       tokens to generate (default 64; 0 = prefill only; at most %d)\n"
            "  --ctx N              context size in tokens, prompt included (default: the model's)\n"
            "  --chunk N            prompt tokens per prefill forward (default %d on the CPU, %d\n"
            "                       with --device cuda, whose products need thousands of rows)\n"
            "  --temp X             temperature (default 0 = greedy)\n"
            "  --top-k K            keep the K most likely tokens (default 0 = all)\n"
            "  --top-p P            nucleus sampling mass in (0, 1] (default 1)\n"
            "  --speculative N      n-gram speculative decoding with up to N drafts (0..%d)\n"
            "  --no-eos             do not stop at the end-of-sequence token\n"
            "  --json               print one JSON object instead of streaming text\n"
            "  --dump-qkv FILE      write post-RoPE q/k/v of all cached tokens (kvq eval format)\n"
            "  --expert-cache SIZE  mixture-of-experts models: keep at most SIZE of expert weights\n"
            "                       in memory and read the others from the checkpoint when the\n"
            "                       router picks them (default: all mapped); same output\n"
            "  --expert-prefetch on|off  with --expert-cache: read the next sparse layer's likely\n"
            "                       experts ahead, on a thread of its own (its router on this\n"
            "                       layer's input; default off)\n"
            "  --expert-direct on|off  with --expert-cache: read the experts with O_DIRECT, past\n"
            "                       the page cache (default off)\n"
            "  --plan               print bytes per token and the longest context fitting the\n"
            "                       budget for every cache type and for the chosen types\n"
            "                       (--layer-types, --kv-auto included), then exit (no prompt needed)\n"
            "short forms: -m --model, -p --prompt, -f --prompt-file, -n --max-tokens, -c --ctx,\n"
            "-s --seed, -ctk/-ctv --cache-type-k/-v; --opt=VALUE works for every option\n",
            MAX_TOKENS, KVQ_DEFAULT_MAX_CHUNK, KVQ_DEFAULT_MAX_CHUNK_CUDA, KVQ_MAX_DRAFT);
    kv_opts_usage(f); /* the cache options, --seed included, as kv_opts_parse reads them */
    fprintf(f, "\nexit status: 0 done; 1 failure; 2 bad input (also: the prompt does not fit the\n"
               "budget or context); 3 stopped early because the KV budget or the context ran\n"
               "out (the text so far is printed, a message says why)\n");
}

struct opts {
    const char *model, *prompt, *prompt_file, *prompt_ids, *dump, *chat;
    long max_tokens, top_k, speculative, ctx, chunk;
    size_t expert_cache;
    double temp, top_p;
    int json, no_eos, plan, expert_prefetch, expert_direct;
    struct kv_opts kvx; /* cache types, budget, seed (also the sampler's) and the other KV options */
};

static int parse_args(int argc, char **argv, struct opts *o)
{
    memset(o, 0, sizeof *o);
    kv_opts_default(&o->kvx);
    o->max_tokens = 64;
    o->top_p = 1.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) {
            usage(stdout);
            return -1;
        }
        if (strcmp(a, "--json") == 0) {
            o->json = 1;
            continue;
        }
        if (strcmp(a, "--no-eos") == 0) {
            o->no_eos = 1;
            continue;
        }
        if (strcmp(a, "--plan") == 0) {
            o->plan = 1;
            continue;
        }
        if (kv_opts_flag(a, &o->kvx))
            continue;
        if (a[0] != '-')
            return cli_error(CMD, "unexpected argument '%s': options start with -- (the prompt goes after "
                                  "--prompt or -p)", a);
        if (i + 1 >= argc)
            return cli_error(CMD, "%s needs a value (see kvq run --help)", a);
        const char *v = argv[++i];
        int bad = 0;
        const char *range = ""; /* said after a bad value */
        if (strcmp(a, "--model") == 0)
            o->model = v;
        else if (strcmp(a, "--prompt") == 0)
            o->prompt = v;
        else if (strcmp(a, "--prompt-file") == 0)
            o->prompt_file = v;
        else if (strcmp(a, "--prompt-ids") == 0)
            o->prompt_ids = v;
        else if (strcmp(a, "--chat") == 0)
            o->chat = v;
        else if (strcmp(a, "--dump-qkv") == 0)
            o->dump = v;
        else if (strcmp(a, "--max-tokens") == 0)
            bad = cli_parse_int(v, 0, MAX_TOKENS, &o->max_tokens), range = " (an integer, 0 to 16777216)";
        else if (strcmp(a, "--ctx") == 0)
            bad = cli_parse_int(v, 1, 1l << 30, &o->ctx), range = " (tokens, 1 or more)";
        else if (strcmp(a, "--chunk") == 0)
            bad = cli_parse_int(v, 1, 1 << 20, &o->chunk), range = " (tokens, 1 to 1048576)";
        else if (strcmp(a, "--top-k") == 0)
            bad = cli_parse_int(v, 0, 1 << 30, &o->top_k), range = " (an integer, 0 = all)";
        else if (strcmp(a, "--speculative") == 0)
            bad = cli_parse_int(v, 0, KVQ_MAX_DRAFT, &o->speculative), range = " (an integer, 0 to the drafts limit)";
        else if (strcmp(a, "--expert-cache") == 0)
            bad = cli_parse_size(v, &o->expert_cache) || o->expert_cache == 0, range = " (a size such as 512MiB)";
        else if (strcmp(a, "--expert-prefetch") == 0)
            bad = strcmp(v, "on") && strcmp(v, "off"), o->expert_prefetch = !strcmp(v, "on"), range = " (on or off)";
        else if (strcmp(a, "--expert-direct") == 0)
            bad = strcmp(v, "on") && strcmp(v, "off"), o->expert_direct = !strcmp(v, "on"), range = " (on or off)";
        else if (strcmp(a, "--temp") == 0)
            bad = cli_parse_double(v, &o->temp) || o->temp < 0, range = " (0 or more)";
        else if (strcmp(a, "--top-p") == 0)
            bad = cli_parse_double(v, &o->top_p) || !(o->top_p > 0 && o->top_p <= 1), range = " (in (0, 1])";
        else {
            const int kv = kv_opts_parse(CMD, a, v, &o->kvx); /* --cache-type-k, --kv-budget, --seed, ... */
            if (kv == 2)
                return 2;
            if (kv == 0)
                return cli_error(CMD, "unknown option '%s' (see kvq run --help)", a);
        }
        if (bad)
            return cli_error(CMD, "bad value '%s' for %s%s", v, a, range);
    }
    if (!o->model)
        return cli_error(CMD, "--model DIR is required");
    if (!o->plan && !!o->prompt + !!o->prompt_file + !!o->prompt_ids + !!o->chat != 1)
        return cli_error(CMD, "give exactly one of --prompt, --prompt-file, --prompt-ids, --chat");
    return 0;
}

/* "1,2, 3" -> ids (malloc'ed). @return count, or -1 on a bad list. */
static long parse_ids(const char *s, int32_t **out)
{
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    while (ids && *s) {
        while (*s == ',' || *s == ' ')
            s++;
        if (!*s)
            break;
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < -(1l << 30) || v > (1l << 30)) {
            free(ids);
            return -1;
        }
        if (n == cap) {
            int32_t *ni = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!ni)
                free(ids);
            ids = ni;
            if (!ids)
                return -1;
        }
        ids[n++] = (int32_t)v;
        s = end;
    }
    *out = ids;
    return ids && n ? (long)n : -1;
}

struct stream {
    kvq_detok *detok;
    int quiet; /* --json: no streaming */
};

static int on_token(void *user, int32_t id)
{
    struct stream *st = user;
    const char *text;
    size_t len;
    if (!st->quiet && st->detok && kvq_detok_push(st->detok, id, &text, &len) == KVQ_OK && len) {
        fwrite(text, 1, len, stdout);
        cli_flush_stdout();
    }
    return ferror(stdout) != 0; /* nobody reads the rest: stop (cli_finish_stdout says why) */
}

static double mib(size_t b)
{
    return (double)b / 1048576.0;
}

static void print_summary(const struct opts *o, const kvq_model *m, const kvq_seq *s, size_t n_prompt)
{
    struct kvq_model_info mi;
    struct kvq_seq_stats st;
    kvq_model_get_info(m, &mi);
    kvq_seq_get_stats(s, &st);
    double busy = st.t_prefill + st.t_decode;
    fprintf(stderr, "\n--\nmodel: %s (%s, %d files, %.1f MiB), loaded in %.3f s\n", o->model,
            mi.sharded ? "sharded" : "Hugging Face", mi.n_files, mib(mi.file_bytes), mi.load_seconds);
    fprintf(stderr, "prefill: %zu tokens in %.3f s (%.0f tokens/s)\n", n_prompt, st.t_prefill,
            st.t_prefill > 0 ? (double)st.prefill_tokens / st.t_prefill : 0.0);
    fprintf(stderr, "decode:  %zu tokens in %.3f s (%.1f tokens/s), %zu forwards, %.2f tokens/forward", st.decode_tokens,
            st.t_decode, st.t_decode > 0 ? (double)st.decode_tokens / st.t_decode : 0.0, st.decode_forwards,
            st.decode_forwards ? (double)(st.decode_forwards + st.accepted) / (double)st.decode_forwards : 0.0);
    if (o->speculative)
        fprintf(stderr, " (drafts accepted %zu of %zu)", st.accepted, st.drafted);
    fprintf(stderr, "\ntime:    matmul %.3f s, attention %.3f s, LM head %.3f s, host overhead %.3f s (%.1f%%)\n",
            st.t_matmul, st.t_attn, st.t_lm_head, st.t_host, busy > 0 ? 100.0 * st.t_host / busy : 0.0);
    if (st.experts.cache_bytes) {
        const size_t used = st.experts.hits + st.experts.misses;
        fprintf(stderr, "experts: cache %.2f MiB, %zu of %zu fetches hit (%.1f%%), %.2f MiB read in %.3f s (%.2f GB/s)\n",
                mib(st.experts.cache_bytes), st.experts.hits, used, used ? 100.0 * (double)st.experts.hits / (double)used : 0.0,
                mib(st.experts.bytes_read), st.experts.t_read,
                st.experts.t_read > 0 ? (double)st.experts.bytes_read / st.experts.t_read / 1e9 : 0.0);
    if (st.experts.prefetched)
        fprintf(stderr,
                "         read ahead: %zu experts (%.2f MiB in %.3f s, %.2f GB/s), %zu of them used (%.1f%%); "
                "%.3f s waited for them\n",
                st.experts.prefetched, mib(st.experts.prefetch_bytes), st.experts.t_prefetch,
                st.experts.t_prefetch > 0 ? (double)st.experts.prefetch_bytes / st.experts.t_prefetch / 1e9 : 0.0,
                st.experts.prefetch_hits, 100.0 * (double)st.experts.prefetch_hits / (double)st.experts.prefetched,
                st.experts.t_wait);
    }
    size_t dev_free = 0, dev_total = 0;
    if (o->kvx.device == KVQ_DEVICE_CUDA && kvq_cuda_mem_info(&dev_free, &dev_total) == KVQ_OK) {
        /* the host times above are mostly queuing: the GPU's own, from
         * events between the parts' work (gaps inside a forward count) */
        const double gpu = st.gpu_matmul + st.gpu_attn + st.gpu_lm_head + st.gpu_other;
        fprintf(stderr,
                "GPU:     matmul %.3f s, attention %.3f s, LM head %.3f s, other %.3f s; %.3f s of the %.3f s "
                "(%.1f%%); %zu decode steps as CUDA graphs\n"
                "device:  %.2f GiB of %.2f GiB in use\n",
                st.gpu_matmul, st.gpu_attn, st.gpu_lm_head, st.gpu_other, gpu, busy,
                busy > 0 ? 100.0 * gpu / busy : 0.0, st.gpu_graph_steps, (double)(dev_total - dev_free) / (1 << 30),
                (double)dev_total / (1 << 30));
    }
    char name[2048];
    kv_opts_name(&o->kvx, name, sizeof name);
    /* what the cache holds for these tokens: their rows, plus the f16
     * window/sink buffers, which are allocated once at the start */
    const size_t held = st.kv_bytes_used + st.kv_bytes_f16_buffers;
    if (held <= st.kv_bytes_f16)
        fprintf(stderr, "KV cache %s: %zu tokens, %.2f MiB vs %.2f MiB as f16 (%.2fx smaller, %.2f MiB saved)\n", name,
                st.tokens, mib(held), mib(st.kv_bytes_f16), held ? (double)st.kv_bytes_f16 / (double)held : 0.0,
                mib(st.kv_bytes_f16) - mib(held));
    else /* f32 rows, or a context short enough for the fixed f16 buffers to outweigh the rows */
        fprintf(stderr, "KV cache %s: %zu tokens, %.2f MiB vs %.2f MiB as f16 (%.2fx larger%s)\n", name, st.tokens,
                mib(held), mib(st.kv_bytes_f16), (double)held / (double)st.kv_bytes_f16,
                st.kv_bytes_f16_buffers > st.kv_bytes_used ? ": the fixed f16 buffers outweigh this short context" : "");
    if (st.kv_bytes_f16_buffers)
        fprintf(stderr, "         of which %.2f MiB packed rows and %.2f MiB f16 window/sink buffers\n",
                mib(st.kv_bytes_used), mib(st.kv_bytes_f16_buffers));
    if (st.kv_budget)
        fprintf(stderr, "KV budget: %.2f MiB, pages allocated %.2f MiB (%.1f%%)\n", mib(st.kv_budget),
                mib(st.kv_bytes_alloc), 100.0 * (double)st.kv_bytes_alloc / (double)st.kv_budget);
    fprintf(stderr, "peak RSS: %.1f MiB\n", mib(kv_peak_rss()));
}

static cJSON *int_array(const int32_t *v, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

static int print_json(const struct opts *o, const kvq_model *m, const kvq_seq *s, const kvq_tokenizer *tok,
                      const struct kvq_seq_config *sc, const int32_t *prompt, size_t n_prompt, const int32_t *out,
                      size_t n_out, const char *stop_reason)
{
    size_t len = 0;
    kvq_tokenizer_decode(tok, out, n_out, KVQ_DETOK_SKIP_CONTROL, NULL, 0, &len);
    char *text = malloc(len + 1);
    if (!text || kvq_tokenizer_decode(tok, out, n_out, KVQ_DETOK_SKIP_CONTROL, text, len + 1, &len) != KVQ_OK) {
        free(text);
        return cli_status_error(CMD, KVQ_ERR_NOMEM, "decoding the output");
    }
    struct kvq_model_info mi;
    struct kvq_seq_stats st;
    kvq_model_get_info(m, &mi);
    kvq_seq_get_stats(s, &st);
    cJSON *root = cJSON_CreateObject(), *kv = cJSON_CreateObject(), *tm = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "prompt_ids", int_array(prompt, n_prompt));
    cJSON_AddItemToObject(root, "ids", int_array(out, n_out));
    cJSON_AddStringToObject(root, "text", text);
    cJSON_AddStringToObject(root, "cache_type_k", kvq_type_traits(o->kvx.tk)->name);
    cJSON_AddStringToObject(root, "cache_type_v", kvq_type_traits(o->kvx.tv)->name);
    cJSON_AddItemToObject(root, "kv_bytes", kv);
    cJSON_AddNumberToObject(kv, "used", (double)st.kv_bytes_used);
    cJSON_AddNumberToObject(kv, "allocated", (double)st.kv_bytes_alloc);
    cJSON_AddNumberToObject(kv, "f16", (double)st.kv_bytes_f16);
    cJSON_AddNumberToObject(kv, "tokens", (double)st.tokens);
    cJSON_AddNumberToObject(kv, "budget", (double)st.kv_budget);
    cJSON_AddNumberToObject(kv, "f16_buffers", (double)st.kv_bytes_f16_buffers);
    cJSON_AddNumberToObject(root, "recent_f16", kvq_seq_window_for(sc, kvq_model_config_of(m)->n_layers));
    cJSON_AddNumberToObject(root, "sink_tokens", o->kvx.sink_tokens);
    cJSON_AddStringToObject(root, "stop_reason", stop_reason);
    cJSON_AddNumberToObject(root, "peak_rss_bytes", (double)kv_peak_rss());
    kv_auto_json(root, &o->kvx, m);
    cJSON_AddItemToObject(root, "timings", tm);
    cJSON_AddNumberToObject(tm, "load_s", mi.load_seconds);
    cJSON_AddNumberToObject(tm, "prefill_s", st.t_prefill);
    cJSON_AddNumberToObject(tm, "decode_s", st.t_decode);
    cJSON_AddNumberToObject(tm, "matmul_s", st.t_matmul);
    cJSON_AddNumberToObject(tm, "attention_s", st.t_attn);
    cJSON_AddNumberToObject(tm, "lm_head_s", st.t_lm_head);
    cJSON_AddNumberToObject(tm, "host_s", st.t_host);
    if (o->kvx.device == KVQ_DEVICE_CUDA) {
        cJSON *g = cJSON_AddObjectToObject(tm, "gpu");
        cJSON_AddNumberToObject(g, "matmul_s", st.gpu_matmul);
        cJSON_AddNumberToObject(g, "attention_s", st.gpu_attn);
        cJSON_AddNumberToObject(g, "lm_head_s", st.gpu_lm_head);
        cJSON_AddNumberToObject(g, "other_s", st.gpu_other);
        cJSON_AddNumberToObject(g, "graph_steps", (double)st.gpu_graph_steps);
    }
    cJSON_AddNumberToObject(tm, "prefill_tokens_per_s", st.t_prefill > 0 ? (double)st.prefill_tokens / st.t_prefill : 0);
    cJSON_AddNumberToObject(tm, "decode_tokens_per_s", st.t_decode > 0 ? (double)st.decode_tokens / st.t_decode : 0);
    cJSON_AddNumberToObject(root, "forwards", (double)st.decode_forwards);
    cJSON_AddNumberToObject(root, "drafted", (double)st.drafted);
    cJSON_AddNumberToObject(root, "accepted", (double)st.accepted);
    cJSON_AddNumberToObject(root, "tokens_per_forward",
                            st.decode_forwards ? (double)(st.decode_forwards + st.accepted) / (double)st.decode_forwards : 0);
    free(text); /* cJSON holds its own copy */
    return kv_print_json(CMD, root);
}

/* --chat: a messages JSON file, or one user message, through the model's
 * chat template. @return 0 with *text (free() it), or the exit code. */
static int chat_prompt(const struct opts *o, char **text, size_t *len)
{
    kvq_chat_template *t = NULL;
    kvq_error err = {0};
    if (kvq_chat_template_load(o->model, &t, &err) != KVQ_OK)
        return cli_error(CMD, "--chat: %s", err.msg);
    kvq_chat_options opt = kvq_chat_options_default();
    kvq_status st;
    FILE *f = fopen(o->chat, "rb");
    if (f) {
        fclose(f);
        size_t n;
        char *js = cli_read_text(CMD, o->chat, "the messages", &n);
        if (!js) {
            kvq_chat_template_free(t);
            return 2;
        }
        st = kvq_chat_render_json(t, js, &opt, text, len, &err);
        free(js);
    } else {
        kvq_chat_message m = {"user", o->chat};
        st = kvq_chat_render(t, &m, 1, &opt, text, len, &err);
    }
    kvq_chat_template_free(t);
    if (st)
        return cli_error(CMD, "--chat: %s", err.msg);
    return 0;
}

/* Prompt ids from whichever option was given. @return 0 or the exit code. */
static int get_prompt(const struct opts *o, const kvq_tokenizer *tok, int32_t **ids, size_t *n)
{
    if (o->prompt_ids) {
        long k = parse_ids(o->prompt_ids, ids);
        if (k < 0)
            return cli_error(CMD, "--prompt-ids: expected a comma-separated list of integers");
        *n = (size_t)k;
        return 0;
    }
    size_t len;
    char *text = NULL;
    if (o->chat) {
        int rc = chat_prompt(o, &text, &len);
        if (rc)
            return rc;
        /* The template spells BOS itself (HF encodes it with add_special_tokens=False). */
        kvq_status st = kvq_tokenizer_encode_alloc(tok, text, len, 0, ids, n);
        free(text);
        return st ? cli_status_error(CMD, st, "encoding the chat prompt") : 0;
    }
    if (o->prompt_file) {
        text = cli_read_text(CMD, o->prompt_file, "the prompt file", &len);
        if (!text)
            return 2;
        if (len && text[len - 1] == '\n')
            text[--len] = 0; /* editors end files with a newline the prompt did not mean */
    }
    const char *p = text ? text : o->prompt;
    if (!text)
        len = strlen(p);
    long bad = cli_utf8_invalid_at(p, len);
    if (bad >= 0) {
        int rc = cli_error(CMD, "%s: not valid UTF-8 at byte %ld (0x%02x); the prompt must be UTF-8 text",
                           o->prompt_file ? o->prompt_file : "--prompt", bad, (unsigned char)p[bad]);
        free(text);
        return rc;
    }
    kvq_status st = kvq_tokenizer_encode_alloc(tok, p, len, 1, ids, n);
    free(text);
    if (st != KVQ_OK)
        return cli_status_error(CMD, st, "encoding the prompt");
    if (*n == 0)
        return cli_error(CMD, "the prompt is empty");
    return 0;
}

/* A plan row's label: the K/V pair or "per-layer", "+ctr" with centred
 * keys, "+win" with the recent window, "*" for the selected types. */
static void plan_row_name(const struct kvq_seq_config *sc, int n_layers, int selected, char *name, size_t n)
{
    char mods[16];
    snprintf(mods, sizeof mods, "%s%s", kvq_seq_centred(sc, n_layers) ? "+ctr" : "",
             kvq_seq_window_for(sc, n_layers) ? "+win" : "");
    if (sc->layer_types)
        snprintf(name, n, "per-layer%s*", mods);
    else
        snprintf(name, n, "%s/%s%s%s", kvq_type_traits(sc->type_k)->name, kvq_type_traits(sc->type_v)->name, mods,
                 selected ? "*" : "");
}

/* --plan --device cuda: what this GPU's free memory holds once the model is
 * on it (an estimate: the weights in their file's type, the embedding table
 * too, the activations and scratch of kvq_seq_plan.work_bytes and 256 MiB
 * for cuBLAS and the RoPE tables). */
static int print_gpu_plan(const struct opts *o, kvq_model *m)
{
    const struct kvq_model_config *c = kvq_model_config_of(m);
    size_t fr = 0, total = 0;
    char name[256];
    if (kvq_cuda_mem_info(&fr, &total) != KVQ_OK || kvq_cuda_device_describe(name, sizeof name) != KVQ_OK)
        return cli_error(CMD, "--device cuda: no CUDA device (or kvq was built without CUDA)");
    struct kvq_model_info mi;
    kvq_model_get_info(m, &mi);
    const size_t embed = mi.file_bytes > mi.weight_bytes ? mi.file_bytes - mi.weight_bytes : 0;
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.device = KVQ_DEVICE_CUDA; /* the device's window ring (kvq_cuda_cache_f16_bytes) */
    sc.sink_tokens = o->kvx.sink_tokens;
    sc.recent_f16 = o->kvx.recent_f16;
    sc.center_k = o->kvx.center_k;
    sc.max_ctx = (size_t)o->ctx;
    sc.max_chunk = (int)o->chunk;
    /* the activations and the prefill scratch for the chunk kvq run would use
     * (kvq_seq_plan.work_bytes), plus what the plan leaves out: cuBLAS's
     * workspace and the RoPE tables */
    struct kvq_seq_plan wp;
    if (kvq_seq_plan_of(m, &sc, &wp) != KVQ_OK)
        wp.work_bytes = 0, wp.max_chunk = 0;
    const size_t other = (size_t)256 << 20, work = wp.work_bytes + other;
    const size_t need = mi.weight_bytes + embed + work;
    const size_t room = fr > need ? fr - need : 0;
    printf("\nOn this GPU (%s): %.2f GiB free, the model ~%.2f GiB, activations and scratch for chunks of %zu "
           "%.2f GiB -> %.2f GiB for the KV cache\n",
           name, (double)fr / (1 << 30), (double)(mi.weight_bytes + embed) / (1 << 30), wp.max_chunk,
           (double)work / (1 << 30), (double)room / (1 << 30));
    printf("%-15s %14s %22s\n", "K/V", "longest context", "sequences at full ctx");
    static const enum kvq_type pairs[][2] = {{KVQ_TYPE_F16, KVQ_TYPE_F16}, {KVQ_TYPE_Q8_0, KVQ_TYPE_Q8_0},
                                             {KVQ_TYPE_Q4_0, KVQ_TYPE_Q4_0}, {KVQ_TYPE_TQ3J, KVQ_TYPE_TQ3}};
    for (int i = -1; i < (int)(sizeof pairs / sizeof pairs[0]); i++) {
        sc.type_k = i < 0 ? o->kvx.tk : pairs[i][0];
        sc.type_v = i < 0 ? o->kvx.tv : pairs[i][1];
        sc.layer_types = i < 0 && o->kvx.n_layer_types ? o->kvx.layer_types : NULL;
        struct kvq_seq_plan pl;
        if (kvq_seq_plan_of(m, &sc, &pl) != KVQ_OK || !pl.bytes_per_token)
            continue;
        char nm[48];
        plan_row_name(&sc, c->n_layers, i < 0, nm, sizeof nm);
        const size_t longest = room > pl.fixed_bytes ? (room - pl.fixed_bytes) / pl.bytes_per_token : 0;
        const size_t per_seq = pl.bytes_per_token * (size_t)c->max_ctx + pl.fixed_bytes;
        printf("%-15s %14zu %22zu\n", nm, longest, per_seq ? room / per_seq : 0);
    }
    printf("  sequences at full ctx: how many sequences of the model's context (%d tokens) fit together\n",
           c->max_ctx);
    return 0;
}

/* --plan: for every type (as K and V) and the chosen types (one pair, the
 * --layer-types list, or what --kv-auto picks), the exact bytes per token
 * and how many tokens the budget holds (whole pages per layer). */
static int print_plan(void *user, kvq_model *m, kvq_tokenizer *tok)
{
    struct opts *o = user;
    const struct kvq_model_config *c = kvq_model_config_of(m);
    if (o->kvx.device == KVQ_DEVICE_CUDA && kvq_cuda_device_count() == 0)
        return cli_error(CMD, "--device cuda: no CUDA device (or kvq was built without CUDA)");
    int rc = kv_opts_check(CMD, &o->kvx, m);
    if (!rc)
        rc = kv_auto_apply(CMD, &o->kvx, m, tok, o->model, o->ctx ? (size_t)o->ctx : (size_t)c->max_ctx, 0);
    if (rc)
        return rc;
    printf("KV plan for %s: %d layers x %d KV heads x head_dim %d, context %d, budget ", o->model, c->n_layers,
           c->n_kv_heads, c->head_dim, c->max_ctx);
    if (o->kvx.budget)
        printf("%zu bytes (%.2f MiB)\n\n", o->kvx.budget, mib(o->kvx.budget));
    else
        printf("none (--kv-budget SIZE)\n\n");
    if (c->arch.n_experts > 0) { /* what the weights cost beside the cache: the experts dominate */
        struct kvq_model_info mi;
        kvq_model_get_info(m, &mi);
        int sparse = 0;
        for (int l = 0; l < c->n_layers; l++)
            sparse += kvq_model_layer_is_moe(c, l);
        printf("weights: %.2f MiB, of which experts and routers %.2f MiB (%d experts, top-%d, in %d of %d layers)\n\n",
               mib(mi.weight_bytes), mib(mi.expert_bytes), c->arch.n_experts, c->arch.top_k, sparse, c->n_layers);
    }
    printf("%-15s %10s %12s %13s %14s %12s %10s\n", "K/V", "bits/value", "bytes/token", "full ctx MiB",
           "budget tokens", "max context", "vs f16");
    struct kvq_seq_config sc;
    kvq_seq_config_default(&sc);
    sc.kv_budget = o->kvx.budget;
    sc.device = o->kvx.device;           /* the device's window ring (kvq_cuda_cache_f16_bytes) */
    sc.sink_tokens = o->kvx.sink_tokens; /* f16 buffers come out of the budget */
    sc.recent_f16 = o->kvx.recent_f16;   /* KVQ_WINDOW_AUTO: on for the compressed pairs */
    sc.center_k = o->kvx.center_k;       /* KVQ_CENTER_AUTO: on with the window */
    struct kvq_seq_plan f16;
    sc.type_k = sc.type_v = KVQ_TYPE_F16;
    if (kvq_seq_plan_of(m, &sc, &f16) != KVQ_OK)
        return cli_error(CMD, "f16 is not supported at head_dim %d", c->head_dim);
    int any_buffers = 0;
    for (int i = -1; i < KVQ_TYPE_COUNT; i++) {
        sc.type_k = i < 0 ? o->kvx.tk : (enum kvq_type)i;
        sc.type_v = i < 0 ? o->kvx.tv : (enum kvq_type)i;
        /* the chosen row: per-layer types when given or chosen */
        sc.layer_types = i < 0 && o->kvx.n_layer_types ? o->kvx.layer_types : NULL;
        struct kvq_seq_plan pl;
        if (kvq_seq_plan_of(m, &sc, &pl) != KVQ_OK)
            continue;
        char name[40];
        plan_row_name(&sc, c->n_layers, i < 0, name, sizeof name);
        any_buffers |= pl.fixed_bytes > 0;
        double bits = kv_bits_at(&pl, c, (size_t)c->max_ctx); /* f16 window/sink buffers included */
        char bt[32] = "unlimited", ratio[32] = "-";
        if (o->kvx.budget) {
            snprintf(bt, sizeof bt, "%zu", pl.budget_tokens);
            if (f16.budget_tokens)
                snprintf(ratio, sizeof ratio, "%.2fx", (double)pl.budget_tokens / (double)f16.budget_tokens);
        }
        printf("%-15s %10.3f %12zu %13.2f %14s %12zu %10s\n", name, bits, pl.bytes_per_token,
               mib(pl.bytes_per_token * (size_t)c->max_ctx + pl.fixed_bytes), bt, pl.max_tokens, ratio);
    }
    if (o->kvx.n_layer_types) {
        char types[2048];
        kv_opts_name(&o->kvx, types, sizeof types);
        printf("\n* per-layer types (%s): %s\n", o->kvx.kv_auto ? "--kv-auto" : "--layer-types", types);
    }
    printf("\n* the selected types (--cache-type-k/-v, --layer-types or --kv-auto). budget tokens:\n"
           "  whole %zu-token pages in each layer's equal share of the budget; max context: that,\n"
           "  capped at the model's context; vs f16: budget tokens relative to an f16 cache.\n",
           f16.page_tokens);
    if (any_buffers)
        printf("  +win (the recent-token f16 window, the default for compressed types; --no-kv-recent-f16\n"
               "  turns it off) and --kv-sink: their f16 buffers are taken from the budget first and\n"
               "  included in bits/value (at the model's context) and full ctx MiB. +ctr (centred keys,\n"
               "  the default with the window; --no-kv-center-k): the pages' key means are included.\n");
    return o->kvx.device == KVQ_DEVICE_CUDA ? print_gpu_plan(o, m) : 0;
}

static int run(void *user, kvq_model *m, kvq_tokenizer *tok)
{
    struct opts *o = user;
    const struct kvq_model_config *c = kvq_model_config_of(m);
    int32_t *prompt = NULL, *out = NULL;
    size_t n_prompt = 0, n_out = 0;
    kvq_seq *s = NULL;
    kvq_qkv_dump *dump = NULL;
    kvq_detok *detok = NULL;
    kvq_error err = {0};
    int rc = get_prompt(o, tok, &prompt, &n_prompt);
    if (rc)
        goto out;
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= c->vocab) {
            rc = cli_error(CMD, "prompt token id %d is outside the vocabulary [0, %d)", prompt[i], c->vocab);
            goto out;
        }
    const size_t ctx = o->ctx ? (size_t)o->ctx : (size_t)c->max_ctx;
    if (n_prompt > ctx) {
        rc = cli_error(CMD, "the prompt has %zu tokens, longer than the %s of %zu", n_prompt,
                       o->ctx ? "--ctx context" : "model's context", ctx);
        goto out;
    }
    if ((rc = kv_opts_check(CMD, &o->kvx, m)) != 0 || (rc = kv_auto_apply(CMD, &o->kvx, m, tok, o->model, ctx, 0)) != 0)
        goto out;
    struct kvq_seq_config sc;
    kv_opts_seq_config(&o->kvx, &sc);
    sc.max_ctx = (size_t)o->ctx;     /* 0: the model's */
    sc.max_chunk = (int)o->chunk; /* 0: the device's default */
    sc.expert_cache = o->expert_cache;
    sc.expert_prefetch = o->expert_prefetch;
    sc.expert_direct = o->expert_direct;
    if (kvq_seq_create(m, &sc, &s, &err) != KVQ_OK) {
        rc = cli_error(CMD, "%s", err.msg);
        goto out;
    }
    struct kvq_seq_plan pl;
    if (kvq_seq_plan_of(m, &sc, &pl) == KVQ_OK && n_prompt > pl.max_tokens) {
        rc = cli_error(CMD, "the prompt has %zu tokens; the KV budget of %zu bytes holds only %zu tokens", n_prompt,
                       o->kvx.budget, pl.max_tokens);
        goto out;
    }
    if (o->dump) {
        if (kvq_qkv_dump_create(c, kvq_seq_max_ctx(s), DUMP_Q_LAST, &dump) != KVQ_OK) {
            rc = cli_status_error(CMD, KVQ_ERR_NOMEM, "--dump-qkv buffers");
            goto out;
        }
        kvq_seq_set_qkv_hook(s, kvq_qkv_dump_hook, dump);
    }
    out = malloc(((size_t)o->max_tokens + 1) * sizeof *out);
    if (!out || kvq_detok_create(tok, KVQ_DETOK_SKIP_CONTROL, &detok) != KVQ_OK) {
        rc = cli_status_error(CMD, KVQ_ERR_NOMEM, "buffers");
        goto out;
    }
    struct kvq_gen_params gp;
    kvq_gen_params_default(&gp);
    gp.max_tokens = (int)o->max_tokens;
    gp.temperature = (float)o->temp;
    gp.top_k = (int)o->top_k;
    gp.top_p = (float)o->top_p;
    gp.speculative = (int)o->speculative;
    gp.stop_at_eos = !o->no_eos;
    struct stream stream = {detok, o->json};
    kvq_status st = kvq_seq_generate(s, prompt, n_prompt, &gp, out, (size_t)o->max_tokens, &n_out, on_token, &stream);
    if (!o->json) {
        const char *tail;
        size_t len;
        if (kvq_detok_finish(detok, &tail, &len) == KVQ_OK && len)
            fwrite(tail, 1, len, stdout);
        fputc('\n', stdout);
        cli_flush_stdout();
    }
    /* A failed write to stdout stops generating (on_token): that is not a
     * full context, and cli_finish_stdout reports it once, as a write error
     * on standard output (exit status 1). The --dump-qkv file is still
     * written; the summary of a run nobody received is left out. */
    const int write_failed = !o->json && ferror(stdout);
    /* Why generation ended. Running out of budget or context is a clean
     * stop: every token produced so far was printed (exit status 3). */
    const char *stop_reason = "max_tokens";
    if (st == KVQ_ERR_BUDGET)
        stop_reason = "kv_budget";
    else if (st != KVQ_OK) {
        rc = cli_status_error_why(CMD, st, "generation failed", st == KVQ_ERR_IO ? kvq_seq_error_detail(s) : NULL);
        goto out;
    } else if (n_out && !o->no_eos && kvq_model_is_eos(c, out[n_out - 1]))
        stop_reason = "eos";
    else if (write_failed)
        stop_reason = "write_error";
    else if (n_out < (size_t)o->max_tokens)
        stop_reason = "context";
    if (st == KVQ_ERR_BUDGET)
        fprintf(stderr, "kvq run: stopped: the KV budget of %zu bytes is full after %zu tokens (%zu generated)\n",
                o->kvx.budget, kvq_seq_pos(s), n_out);
    else if (strcmp(stop_reason, "context") == 0)
        fprintf(stderr, "kvq run: stopped: the context of %zu tokens is full (%zu generated)\n", kvq_seq_max_ctx(s),
                n_out);
    int stopped = strcmp(stop_reason, "kv_budget") == 0 || strcmp(stop_reason, "context") == 0;
    if (dump) {
        size_t n_cached = kvq_seq_pos(s);
        int32_t *ids = malloc(n_cached * sizeof *ids);
        if (!ids) {
            rc = cli_status_error(CMD, KVQ_ERR_NOMEM, "--dump-qkv");
            goto out;
        }
        /* The cache holds the prompt, then every generated token but the last. */
        memcpy(ids, prompt, n_prompt * sizeof *ids);
        memcpy(ids + n_prompt, out, (n_cached - n_prompt) * sizeof *ids);
        st = kvq_qkv_dump_write(dump, ids, n_cached, o->dump, &err);
        free(ids);
        if (st != KVQ_OK) {
            rc = cli_error(CMD, "%s", err.msg);
            goto out;
        }
    }
    if (o->json)
        rc = print_json(o, m, s, tok, &sc, prompt, n_prompt, out, n_out, stop_reason);
    else if (!write_failed)
        print_summary(o, m, s, n_prompt);
    if (!rc && stopped)
        rc = 3;
out:
    kvq_detok_free(detok);
    kvq_qkv_dump_free(dump);
    kvq_seq_free(s);
    free(prompt);
    free(out);
    return rc;
}

int cmd_run(int argc, char **argv)
{
    struct opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    kvq_error err = {0};
    if (o.dump && !o.plan && kvq_out_path_check(o.dump, &err) != KVQ_OK) /* before minutes of work */
        return cli_error(CMD, "--dump-qkv %s", err.msg);
    return kv_with_model(CMD, o.model, NULL, o.plan ? print_plan : run, &o);
}
