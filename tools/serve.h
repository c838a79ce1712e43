/* serve.h - `kvq serve`: an OpenAI-compatible HTTP server over one kvq_batch.
 *
 * Three parts:
 *  - serve_request.c: an untrusted JSON body -> struct serve_params, or an
 *    HTTP status, one message naming the field and an OpenAI code (fuzzed:
 *    tests/fuzz/fuzz_serve_request.c); OpenAI's error JSON. serve_json.c
 *    keeps the byte length of JSON strings (a "\u0000" included).
 *  - serve_engine.c: the scheduler thread. It owns the batch (kvq_batch.h),
 *    builds each step from a decode row per running sequence plus prompt
 *    chunks, samples, detokenizes and applies stop rules; serve_req.c
 *    makes a request from its params (chat template, tokens, checks),
 *    serve_admit.c keeps the wait queue and admits by KV pages,
 *    serve_metrics.c writes /metrics (they share serve_engine_int.h).
 *  - serve_http.c: libmicrohttpd (a thread per connection), bodies, JSON
 *    and server-sent-event responses, disconnects; the route, the API key
 *    and the body's checks are serve_route.c's, /tokenize and /detokenize
 *    serve_tokenize.c's (serve_route.h), the connection deadline and limits
 *    serve_conn.c's.
 * cmd_serve.c parses the flags, loads the model, waits for SIGTERM and drains.
 */
#ifndef KVQ_SERVE_H
#define KVQ_SERVE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kvq_batch.h"
#include "kvq_chat.h"
#include "kvq_model.h"
#include "kvq_ngram.h"
#include "kvq_sampler.h"
#include "kvq_tokenizer.h"

#define SERVE_MAX_STOP 4
#define SERVE_MAX_LOGPROBS 20
#define SERVE_STOP_MAX_LEN 256
#define SERVE_MAX_BIAS 1024 /* logit_bias entries */

/* A request body as parsed (serve_request.c). Strings are malloc'ed. */
struct serve_params {
    int chat;               /* /v1/chat/completions */
    char *model;            /* NULL when absent */
    char *prompt;           /* completions: text prompt; chat: the rendered messages */
    size_t prompt_len;      /* its bytes: a "\u0000" in the JSON is a byte of the prompt too */
    int32_t *prompt_ids;    /* completions: a prompt given as token ids (else NULL) */
    size_t n_prompt_ids;
    void *messages;         /* chat: the messages (a cJSON array, owned; each content one
                             * string, text parts joined, lengths by serve_json_strlen) */
    int max_tokens;         /* -1: the endpoint's default */
    float temperature, top_p;
    int top_k;
    uint64_t seed;
    int has_seed;
    char *stop[SERVE_MAX_STOP];
    int n_stop;
    int stream, include_usage;
    int ignore_eos;         /* vLLM's extension: EOS does not end the answer (benchmarks) */
    int logprobs;           /* top-N alternatives per token; -1 = no logprobs */
    int32_t *bias_ids;      /* logit_bias: added to these tokens' logits before the pick */
    float *bias;
    int n_bias;
    int has_types;          /* the "kvq" extension named cache types */
    int type_k, type_v;     /* enum kvq_type */
    const char *code;       /* after a failed parse: the error's OpenAI code (static), or NULL */
};

/** Parses body[0..len) for the completions (chat = 0) or chat endpoint.
 *  @return 0, or 400 (503: out of memory) with a message in err, the
 *  offending field in param (may be "") and the code in p->code
 *  ("invalid_json", "invalid_type", "invalid_value", "invalid_utf8",
 *  "missing_required_parameter", "unsupported_parameter",
 *  "unsupported_value"), p then holding nothing else. */
int serve_params_parse(const char *body, size_t len, int chat, struct serve_params *p, char *err, size_t cap,
                       char *param, size_t param_cap);
void serve_params_free(struct serve_params *p);

/** OpenAI's error object for status: {"error": {"message", "type", "param",
 *  "code"}}; malloc'ed JSON text. */
char *serve_error_json(int status, const char *message, const char *param, const char *code);

/* JSON strings with every byte (serve_json.c): cJSON keeps a "\u0000" as a
 * NUL inside valuestring but no length. serve_json_lengths records each
 * string's length in the tree parsed from text; serve_json_strlen reads it
 * (strlen for a node it has not seen); serve_json_string makes a string node
 * of s[0..n). serve_utf8_check: the offset of the first byte of s[0..n) that
 * is not valid UTF-8, or n. */
struct cJSON;
void serve_json_lengths(const char *text, size_t len, struct cJSON *root);
size_t serve_json_strlen(const struct cJSON *s);
struct cJSON *serve_json_string(const char *s, size_t n);
size_t serve_utf8_check(const char *s, size_t n);

/* ---- engine ------------------------------------------------------------ */

enum serve_state { SERVE_WAITING, SERVE_PREFILL, SERVE_DECODE, SERVE_DONE };

/* One generated token's log-probabilities (natural log). */
struct serve_logprob {
    int32_t id;
    float lp;
    int n_top;
    int32_t top_id[SERVE_MAX_LOGPROBS];
    float top_lp[SERVE_MAX_LOGPROBS];
};

struct serve_engine;

/* One request, shared by its connection thread and the engine (refs), every
 * field behind the engine's mutex. */
struct serve_req {
    struct serve_engine *e;
    int refs;
    pthread_cond_t cond;       /* signalled when the request changes */
    struct serve_params p;
    char id[40];
    long created;
    int32_t *ids;              /* prompt tokens */
    size_t n_prompt, done;     /* prompt tokens, and those prefilled */
    size_t cached_tokens;      /* prompt tokens not prefilled: a cached prefix taken over or
                                * a running sequence's pages shared */
    int max_tokens;
    int slot;
    enum serve_state state;
    size_t pages;              /* pages of the whole sequence (prompt + max_tokens) */
    int32_t *out;              /* [max_tokens] generated ids */
    size_t n_out;
    struct serve_logprob *lps; /* [max_tokens] when logprobs >= 0 */
    float *logits;             /* [vocab] when logprobs need them (the draw is then made from them) */
    int32_t next_tok;          /* the step's token: its argmax, or drawn where the logits are */
    kvq_sampler *smp;
    kvq_detok *detok;
    /* speculative decoding (serve_engine_config.speculative; requests whose
     * logits stay where they are: no logprobs, no logit_bias): the history
     * the drafts continue, its n-gram
     * table (NULL: plain decoding), the step's verify pass */
    int32_t *hist;             /* [n_prompt + max_tokens] the prompt, then out */
    kvq_ngram *ngram;
    int32_t draft[KVQ_MAX_DRAFT + 1]; /* the pending token, then the drafts */
    int32_t verify[KVQ_MAX_DRAFT + 1]; /* the model's token after each */
    int n_draft;               /* drafts in the step's item (0: a plain decode row) */
    char *text;                /* generated text so far (after stop truncation) */
    size_t text_len, text_cap;
    const char *finish;        /* "stop" / "length" once done */
    int cancelled;
    int status;                /* != 0: failed with this HTTP status */
    char error[256];
    double t_submit, t_first, t_done;
    struct serve_req *next;    /* waiting queue */
};

struct serve_engine_config {
    struct kvq_batch_config batch;
    int chunk;                 /* prompt tokens per prefill chunk (default 256) */
    int max_queue;             /* waiting requests before 429 (default 128) */
    int prefix_cache;          /* finished sequences kept for prefix reuse (0: off) */
    int prefix_share;          /* a request shares the pages of a running sequence's prompt
                                * start it has too (kvq_batch_share; 0: off) */
    int speculative;           /* n-gram drafts per decode step of a request (0: off) */
    const char *model_name;    /* what /v1/models and responses call the model */
    const kvq_chat_template *chat; /* renders /v1/chat/completions messages; NULL: 400 */
    const char *chat_missing;  /* the 400's message without a template */
    char cache_name[64];       /* "tq3j/tq3" */
};

/** Creates the batch and starts the scheduler thread. @return 0, or 2/1 with
 *  the error in err. */
int serve_engine_start(const kvq_model *m, const kvq_tokenizer *tok, const struct serve_engine_config *cfg,
                       struct serve_engine **out, char *err, size_t cap);
/** Stops the thread (after serve_engine_drain) and frees everything. */
void serve_engine_stop(struct serve_engine *e);

/** A request for parsed params: renders the chat, tokenizes, checks the
 *  context and the pool.
 *  @return the request (refs 1, not queued), or NULL with an HTTP status
 *  (400, 503), message and OpenAI code (*code, static; NULL for a 503):
 *  "context_length_exceeded" (prompt + max_tokens over the context),
 *  "kv_pool_exceeded" (more pages than the whole pool), "chat_template_missing",
 *  "chat_template_error", "invalid_utf8", "token_id_out_of_vocabulary",
 *  "unsupported_character" (no token for it), "empty_prompt",
 *  "cache_type_mismatch" (the kvq extension). */
struct serve_req *serve_req_create(struct serve_engine *e, struct serve_params *p, int *status, char *err,
                                   size_t cap, const char **code);
/** Queues r. @return 0, or 429 (queue full) / 503 (draining) with the message. */
int serve_submit(struct serve_engine *e, struct serve_req *r, char *err, size_t cap);
/** Marks r cancelled (the client went away): its pages are freed within one step. */
void serve_cancel(struct serve_engine *e, struct serve_req *r);
/** Drops the connection's reference. */
void serve_req_release(struct serve_engine *e, struct serve_req *r);

/* Locking for readers of a request's fields, and a wait of at most ms. */
void serve_lock(struct serve_engine *e);
void serve_unlock(struct serve_engine *e);
void serve_wait(struct serve_engine *e, struct serve_req *r, int ms);

/** Stops taking requests (503) and waits until every queued and running
 *  request is finished and released, for at most timeout_s seconds (<= 0:
 *  no limit); then cancels what is left, each client getting 503, and waits
 *  for their release (at most 2 s more).
 *  @return how many requests the deadline cut (0: all drained). */
int serve_engine_drain(struct serve_engine *e, double timeout_s);

/* Read-only facts for responses and metrics. */
const char *serve_model_name(const struct serve_engine *e);
const char *serve_cache_name(const struct serve_engine *e);
const kvq_tokenizer *serve_tokenizer(const struct serve_engine *e);
int serve_draining(const struct serve_engine *e);

/** Prometheus text of the engine's metrics (malloc'ed); http adds its own. */
char *serve_metrics_text(struct serve_engine *e);

/** Counts a finished HTTP exchange for /metrics. */
void serve_count_request(struct serve_engine *e, const char *route, int status);

/* ---- HTTP ---------------------------------------------------------------- */

struct serve_http_config {
    const char *host;          /* numeric IPv4 address */
    int port;                  /* 0: any free port */
    const char *api_key;       /* NULL: no key */
    size_t max_body;           /* bytes */
    int timeout_s;             /* idle connection timeout (a request that never completes) */
    int max_connections;
    int max_per_ip;            /* open connections from one client address (0: no limit) */
    int quiet;                 /* no log lines (a limit hit, slow clients closed) */
};
struct serve_http;
/** Starts listening. @return 0 and *out (the bound port in *port), or 1 with err. */
int serve_http_start(struct serve_engine *e, const struct serve_http_config *cfg, struct serve_http **out,
                     int *port, char *err, size_t cap);
void serve_http_stop(struct serve_http *h);

#endif
