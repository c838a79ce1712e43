/* cmd_serve.c - `kvq serve`: the OpenAI-compatible server (serve.h).
 * Flags, model loading, then the main thread waits for SIGTERM or SIGINT,
 * drains every queued and running request (new ones get 503) for at most
 * --drain-timeout seconds, and exits 0, or 1 when the deadline cut requests
 * (an operator's log then shows that clients lost answers).
 * The listening address goes to stderr as one line, so that scripts started
 * with --port 0 learn the port. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv_opts.h"
#include "serve.h"

#define CMD "serve"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvq serve --model DIR [options]\n\n"
               "An OpenAI-compatible HTTP server: POST /v1/completions, POST /v1/chat/completions\n"
               "(\"stream\": true for server-sent events), GET /v1/models, /health, /metrics.\n"
               "Every running sequence advances in one batched forward per step over one KV page\n"
               "pool of --kv-budget bytes; requests wait for pages (docs/serve.md).\n\n"
               "  --model DIR          model directory\n"
               "  --host ADDR          IPv4 address to listen on (default 127.0.0.1)\n"
               "  --port N             TCP port (default 8080; 0: any free port)\n"
               "  --max-seqs N         sequences running at once (default 16)\n"
               "  --ctx N              tokens per sequence (default: the model's context)\n"
               "  --chunk N            prompt tokens per prefill chunk (default 256)\n"
               "  --max-queue N        waiting requests before 429 (default 128)\n"
               "  --prefix-cache N     keep up to N finished sequences' prompts for prefix reuse\n"
               "                       (default 0: off; --chunk must be a multiple of 64)\n"
               "  --prefix-share on|off a request shares the pages of the prompt start it has in\n"
               "                       common with a running sequence (default: on; off for\n"
               "                       sliding-window models, whose layers keep no prefix)\n"
               "  --expert-cache SIZE  mixture-of-experts models: keep at most SIZE of expert weights in\n"
               "                       memory, one cache for all sequences, and read the others from\n"
               "                       the checkpoint when the router picks them (default: all\n"
               "                       mapped); same answers\n"
               "  --expert-prefetch on|off  with --expert-cache: read the next sparse layer's likely\n"
               "                       experts ahead (default off)\n"
               "  --expert-direct on|off  with --expert-cache: read the experts with O_DIRECT, past\n"
               "                       the page cache (default off)\n"
               "  --speculative N      n-gram speculative decoding with up to N drafts a step\n"
               "                       (0..15, default 0: off; not for requests with logprobs or\n"
               "                       logit_bias); the answers are plain decoding's\n"
               "  --api-key KEY        require 'Authorization: Bearer KEY' on /v1/, /tokenize and\n"
               "                       /detokenize (default: env\n"
               "                       KVQ_API_KEY, else none)\n"
               "  --model-name NAME    the model id clients send and see (default: the directory name)\n"
               "  --chat-template FILE Jinja chat template for /v1/chat/completions (default: the\n"
               "                       model's tokenizer_config.json chat_template)\n"
               "  --max-body SIZE      largest request body (default 1MiB)\n"
               "  --timeout S          seconds a connection may take to deliver a whole request, or\n"
               "                       stay idle (default 30)\n"
               "  --max-conns N        open connections at most (default 1000)\n"
               "  --max-conns-per-ip N open connections from one client address (default 256; 0: no limit)\n"
               "  --drain-timeout S    on SIGTERM/SIGINT, let queued and running requests finish for\n"
               "                       at most S seconds, then cancel the rest (their clients get\n"
               "                       503) (default 0: no limit)\n"
               "  --quiet              no log lines on stderr\n");
    kv_opts_usage(f);
    fprintf(f, "\nExit status: 0 after a drain that finished every request; 1 when --drain-timeout\n"
               "cut requests, or the server could not start; 2 for bad usage.\n");
}

struct opts {
    struct kv_cmd c;
    const char *host, *api_key, *model_name, *chat_template;
    long port, max_seqs, ctx, chunk, max_queue, timeout, drain_timeout, prefix_cache, speculative;
    long max_conns, max_conns_per_ip;
    int prefix_share, expert_prefetch, expert_direct;
    size_t max_body, expert_cache;
};

static int own_option(void *user, const char *a, const char *v)
{
    struct opts *o = user;
    if (strcmp(a, "--host") == 0)
        o->host = v;
    else if (strcmp(a, "--api-key") == 0)
        o->api_key = v;
    else if (strcmp(a, "--model-name") == 0)
        o->model_name = v;
    else if (strcmp(a, "--chat-template") == 0)
        o->chat_template = v;
    else if (strcmp(a, "--port") == 0)
        return cli_parse_int(v, 0, 65535, &o->port) ? 1 : 0;
    else if (strcmp(a, "--max-seqs") == 0)
        return cli_parse_int(v, 1, 4096, &o->max_seqs) ? 1 : 0;
    else if (strcmp(a, "--ctx") == 0)
        return cli_parse_int(v, 2, 1 << 24, &o->ctx) ? 1 : 0;
    else if (strcmp(a, "--chunk") == 0)
        return cli_parse_int(v, 1, 1 << 16, &o->chunk) ? 1 : 0;
    else if (strcmp(a, "--speculative") == 0)
        return cli_parse_int(v, 0, KVQ_MAX_DRAFT, &o->speculative) ? 1 : 0;
    else if (strcmp(a, "--prefix-cache") == 0)
        return cli_parse_int(v, 0, 4096, &o->prefix_cache) ? 1 : 0;
    else if (strcmp(a, "--prefix-share") == 0) {
        if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0)
            return 1;
        o->prefix_share = strcmp(v, "on") == 0;
    } else if (strcmp(a, "--max-queue") == 0)
        return cli_parse_int(v, 1, 1 << 20, &o->max_queue) ? 1 : 0;
    else if (strcmp(a, "--timeout") == 0)
        return cli_parse_int(v, 1, 86400, &o->timeout) ? 1 : 0;
    else if (strcmp(a, "--max-conns") == 0)
        return cli_parse_int(v, 1, 1 << 16, &o->max_conns) ? 1 : 0;
    else if (strcmp(a, "--max-conns-per-ip") == 0)
        return cli_parse_int(v, 0, 1 << 16, &o->max_conns_per_ip) ? 1 : 0;
    else if (strcmp(a, "--drain-timeout") == 0)
        return cli_parse_int(v, 0, 86400, &o->drain_timeout) ? 1 : 0;
    else if (strcmp(a, "--max-body") == 0)
        return cli_parse_size(v, &o->max_body) || o->max_body == 0 ? 1 : 0;
    else if (strcmp(a, "--expert-cache") == 0)
        return cli_parse_size(v, &o->expert_cache) || o->expert_cache == 0 ? 1 : 0;
    else if (strcmp(a, "--expert-prefetch") == 0) {
        if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0)
            return 1;
        o->expert_prefetch = strcmp(v, "on") == 0;
    } else if (strcmp(a, "--expert-direct") == 0) {
        if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0)
            return 1;
        o->expert_direct = strcmp(v, "on") == 0;
    }
    else
        return -1;
    return 0;
}

static const char *base_name(const char *dir)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    static char name[256];
    size_t i = n;
    while (i > 0 && dir[i - 1] != '/')
        i--;
    snprintf(name, sizeof name, "%.*s", (int)(n - i), dir + i);
    return name;
}

/* --chat-template FILE (an error is fatal), else the model's own template
 * (missing or refused: chat requests get 400 saying why). */
static int load_chat(const struct opts *o, kvq_chat_template **t, char *missing, size_t cap)
{
    kvq_error err = {0};
    *t = NULL;
    if (o->chat_template) {
        size_t len;
        char *src = cli_read_file(o->chat_template, &len);
        if (!src)
            return cli_error(CMD, "cannot read --chat-template %s", o->chat_template);
        kvq_status st = kvq_chat_template_create(src, len, t, &err);
        free(src);
        return st == KVQ_OK ? 0 : cli_error(CMD, "--chat-template %s: %s", o->chat_template, err.msg);
    }
    if (kvq_chat_template_load(o->c.model, t, &err) != KVQ_OK) {
        snprintf(missing, cap, "this model has no usable chat template (%s); start kvq serve with --chat-template FILE",
                 err.msg);
        if (!o->c.quiet && err.msg[0] && !strstr(err.msg, "No such file"))
            fprintf(stderr, "kvq serve: chat completions off: %s\n", err.msg);
    }
    return 0;
}

static int serve(void *user, kvq_model *m, kvq_tokenizer *tok)
{
    struct opts *o = user;
    const struct kvq_model_config *c = kvq_model_config_of(m);
    if (o->ctx > c->max_ctx)
        return cli_error(CMD, "--ctx %ld exceeds the model's context %d", o->ctx, c->max_ctx);
    struct serve_engine_config ec;
    memset(&ec, 0, sizeof ec);
    kvq_batch_config_default(&ec.batch);
    kv_opts_seq_config(&o->c.kv, &ec.batch.seq);
    ec.batch.seq.max_ctx = (size_t)o->ctx;
    ec.batch.seq.expert_cache = o->expert_cache;
    ec.batch.seq.expert_prefetch = o->expert_prefetch;
    ec.batch.seq.expert_direct = o->expert_direct;
    ec.batch.max_seqs = (int)o->max_seqs;
    ec.chunk = (int)o->chunk;
    ec.max_queue = (int)o->max_queue;
    ec.prefix_cache = (int)(o->prefix_cache < o->max_seqs ? o->prefix_cache : o->max_seqs);
    ec.prefix_share = o->prefix_share;
    ec.speculative = (int)o->speculative;
    ec.model_name = o->model_name ? o->model_name : base_name(o->c.model);
    kv_opts_name(&o->c.kv, ec.cache_name, sizeof ec.cache_name);
    kvq_chat_template *chat = NULL;
    char missing[512] = "";
    int rc = load_chat(o, &chat, missing, sizeof missing);
    if (rc)
        return rc;
    ec.chat = chat;
    ec.chat_missing = missing;

    /* Signals go to sigwait below only: every thread started from here on
     * inherits the blocked mask. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    char err[512];
    struct serve_engine *e = NULL;
    rc = serve_engine_start(m, tok, &ec, &e, err, sizeof err);
    if (rc) {
        kvq_chat_template_free(chat);
        cli_error(CMD, "%s", err);
        return rc;
    }
    struct serve_http_config hc = {o->host, (int)o->port, o->api_key, o->max_body, (int)o->timeout, (int)o->max_conns,
                                   (int)o->max_conns_per_ip, o->c.quiet};
    struct serve_http *h = NULL;
    int port = 0;
    if ((rc = serve_http_start(e, &hc, &h, &port, err, sizeof err)) != 0) {
        serve_engine_stop(e);
        kvq_chat_template_free(chat);
        cli_error(CMD, "%s", err);
        return rc;
    }
    fprintf(stderr, "kvq serve: listening on http://%s:%d (model %s, cache %s, %ld sequences, pool %s)\n", o->host,
            port, ec.model_name, ec.cache_name, o->max_seqs, o->c.kv.budget ? "--kv-budget" : "unbounded");
    fflush(stderr);
    int sig = 0;
    sigwait(&set, &sig);
    if (!o->c.quiet)
        fprintf(stderr, "kvq serve: %s: draining\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    const int n_cut = serve_engine_drain(e, (double)o->drain_timeout);
    if (n_cut && !o->c.quiet)
        fprintf(stderr, "kvq serve: --drain-timeout %ld s passed: %d request%s cancelled (503)\n", o->drain_timeout,
                n_cut, n_cut == 1 ? "" : "s");
    serve_http_stop(h);
    serve_engine_stop(e);
    kvq_chat_template_free(chat);
    if (!o->c.quiet)
        fprintf(stderr, "kvq serve: stopped\n");
    return n_cut ? 1 : 0;
}

int cmd_serve(int argc, char **argv)
{
    struct opts o;
    memset(&o, 0, sizeof o);
    o.host = "127.0.0.1";
    o.port = 8080;
    o.max_seqs = 16;
    o.chunk = KVQ_DEFAULT_MAX_CHUNK;
    o.prefix_share = 1;
    o.max_queue = 128;
    o.timeout = 30;
    o.max_conns = 1000;
    o.max_conns_per_ip = 256;
    o.max_body = 1u << 20;
    int rc = kv_cmd_parse(CMD, argc, argv, &o.c, usage, own_option, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    if (!o.c.model)
        return cli_error(CMD, "--model DIR is required");
    if (o.c.kv.kv_auto)
        return cli_error(CMD, "--kv-auto is not supported by kvq serve: name the cache types");
    if (!o.api_key) {
        const char *k = getenv("KVQ_API_KEY");
        o.api_key = k && *k ? k : NULL;
    }
    return kv_with_model(CMD, o.c.model, &o.c.kv, serve, &o);
}
