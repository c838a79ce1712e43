/* serve_http.c - the HTTP side of `kvq serve` over libmicrohttpd.
 *
 * A thread per connection: a handler may block while its request runs, and
 * every wait is at most 50 ms long, after which it looks whether the peer
 * closed the socket (recv MSG_PEEK returns 0); a client that went away
 * cancels its request, whose pages the engine frees before its next step.
 * Streams are chunked server-sent events ending in `data: [DONE]`. Bad
 * input is answered in OpenAI's error shape with 400/401/404/405/413/429/503
 * (429 and 503 with Retry-After); 500 only when the model itself fails. What
 * to do with a request is decided by serve_route (serve_route.c, fuzzed);
 * how long a connection may take to deliver it, and how many there may be,
 * by serve_conn.c.
 */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "serve.h"
#include "serve_conn.h"
#include "serve_route.h"

#define WAIT_MS 50
/* Retry-After seconds: a full queue frees a place within a few steps; a
 * draining server is gone soon and a restarted one needs a moment. */
#define RETRY_AFTER_BUSY "1"
#define RETRY_AFTER_DRAINING "5"
#define STOP_WAIT_S 5

struct serve_http {
    struct MHD_Daemon *d;
    struct serve_engine *e;
    struct serve_http_config cfg;
    struct serve_route_config route;
    struct serve_conns *conns;
    pthread_mutex_t mu;
    pthread_cond_t idle;
    int in_flight; /* requests begun and not completed: their answers are still to go out */
};

/* Per connection and request: the body as it arrives. */
struct conn_ctx {
    char *body;
    size_t len, cap;
    int too_large;
};

/* A streaming response in progress. */
struct stream {
    struct serve_http *h;
    struct serve_req *r;
    struct MHD_Connection *conn;
    char *buf;
    size_t len, off, cap;
    size_t text_sent, tok_sent;
    int role_sent, done;
};

static int peer_closed(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return 0;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static enum MHD_Result send_text_allow(struct serve_http *h, struct MHD_Connection *c, const char *route,
                                       int status, const char *type, char *text, const char *allow)
{
    if (!text)
        return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", type);
    if (allow)
        MHD_add_response_header(resp, "Allow", allow);
    if (status == 429 || status == 503)
        MHD_add_response_header(resp, "Retry-After", status == 429 ? RETRY_AFTER_BUSY : RETRY_AFTER_DRAINING);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    serve_count_request(h->e, route, status);
    return rc;
}

static enum MHD_Result send_text(struct serve_http *h, struct MHD_Connection *c, const char *route, int status,
                                 const char *type, char *text)
{
    return send_text_allow(h, c, route, status, type, text, NULL);
}

static enum MHD_Result send_json(struct serve_http *h, struct MHD_Connection *c, const char *route, int status,
                                 cJSON *root)
{
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return send_text(h, c, route, status, "application/json", s);
}

static enum MHD_Result send_error(struct serve_http *h, struct MHD_Connection *c, const char *route, int status,
                                  const char *msg, const char *param, const char *code)
{
    return send_text(h, c, route, status, "application/json", serve_error_json(status, msg, param, code));
}

/* ---- response bodies --------------------------------------------------- */

static char *token_text(const kvq_tokenizer *tok, int32_t id, size_t *n)
{
    char *s = NULL;
    *n = 0;
    if (kvq_tokenizer_decode_alloc(tok, &id, 1, KVQ_DETOK_KEEP_LEADING_SPACE, &s, n) != KVQ_OK)
        return NULL;
    return s;
}

static cJSON *bytes_of(const char *s, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)s[i]));
    return a;
}

/* Logprobs of tokens [a, b) of r, in the endpoint's shape (mu held). */
static cJSON *logprobs_json(struct serve_http *h, const struct serve_req *r, size_t a, size_t b)
{
    if (!r->lps)
        return cJSON_CreateNull();
    const kvq_tokenizer *tok = serve_tokenizer(h->e);
    cJSON *lp = cJSON_CreateObject();
    if (r->p.chat) {
        cJSON *content = cJSON_AddArrayToObject(lp, "content");
        for (size_t i = a; i < b; i++) {
            const struct serve_logprob *l = &r->lps[i];
            size_t n;
            char *s = token_text(tok, l->id, &n);
            cJSON *t = cJSON_CreateObject();
            cJSON_AddStringToObject(t, "token", s ? s : "");
            cJSON_AddNumberToObject(t, "logprob", l->lp);
            cJSON_AddItemToObject(t, "bytes", bytes_of(s, n));
            free(s);
            cJSON *top = cJSON_AddArrayToObject(t, "top_logprobs");
            for (int k = 0; k < l->n_top; k++) {
                char *ts = token_text(tok, l->top_id[k], &n);
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "token", ts ? ts : "");
                cJSON_AddNumberToObject(o, "logprob", l->top_lp[k]);
                cJSON_AddItemToObject(o, "bytes", bytes_of(ts, n));
                cJSON_AddItemToArray(top, o);
                free(ts);
            }
            cJSON_AddItemToArray(content, t);
        }
        return lp;
    }
    cJSON *toks = cJSON_AddArrayToObject(lp, "tokens"), *lps = cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(lp, "top_logprobs"), *offs = cJSON_AddArrayToObject(lp, "text_offset");
    size_t off = 0;
    for (size_t i = 0; i < b; i++) {
        const struct serve_logprob *l = &r->lps[i];
        size_t n;
        char *s = token_text(tok, l->id, &n);
        if (i >= a) {
            cJSON_AddItemToArray(toks, cJSON_CreateString(s ? s : ""));
            cJSON_AddItemToArray(lps, cJSON_CreateNumber(l->lp));
            cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
            cJSON *o = cJSON_CreateObject();
            for (int k = 0; k < l->n_top; k++) {
                size_t tn;
                char *ts = token_text(tok, l->top_id[k], &tn);
                if (ts && !cJSON_GetObjectItemCaseSensitive(o, ts))
                    cJSON_AddNumberToObject(o, ts, l->top_lp[k]);
                free(ts);
            }
            cJSON_AddItemToArray(tops, o);
        }
        off += n;
        free(s);
    }
    return lp;
}

static cJSON *usage_json(const struct serve_req *r)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)r->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)r->n_out);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(r->n_prompt + r->n_out));
    /* OpenAI's field for prompt tokens served from a cache: here a cached
     * prefix taken over or pages shared with a running sequence */
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)r->cached_tokens);
    return u;
}

static cJSON *envelope(struct serve_http *h, const struct serve_req *r, const char *object)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", r->id);
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)r->created);
    cJSON_AddStringToObject(root, "model", serve_model_name(h->e));
    return root;
}

/* The whole answer of a finished request (mu held). */
static cJSON *completion_json(struct serve_http *h, const struct serve_req *r)
{
    cJSON *root = envelope(h, r, r->p.chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices"), *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    if (r->p.chat) {
        cJSON *msg = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        cJSON_AddStringToObject(msg, "content", r->text ? r->text : "");
    } else {
        cJSON_AddStringToObject(c, "text", r->text ? r->text : "");
    }
    cJSON_AddItemToObject(c, "logprobs", logprobs_json(h, r, 0, r->n_out));
    cJSON_AddStringToObject(c, "finish_reason", r->finish ? r->finish : "stop");
    cJSON_AddItemToArray(choices, c);
    cJSON_AddItemToObject(root, "usage", usage_json(r));
    cJSON *k = cJSON_AddObjectToObject(root, "kvq");
    cJSON_AddStringToObject(k, "cache", serve_cache_name(h->e));
    cJSON_AddNumberToObject(k, "kv_pages_reserved", (double)r->pages);
    cJSON_AddNumberToObject(k, "time_to_first_token_ms", r->n_out ? 1e3 * (r->t_first - r->t_submit) : 0);
    return root;
}

/* ---- streaming ----------------------------------------------------------- */

static void sbuf_add(struct stream *s, const char *a, size_t n)
{
    if (s->len + n + 1 > s->cap) {
        size_t cap = (s->len + n + 1) * 2;
        char *b = realloc(s->buf, cap);
        if (!b)
            return;
        s->buf = b;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, a, n);
    s->len += n;
}

static void sse_json(struct stream *s, cJSON *root)
{
    char *j = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!j)
        return;
    sbuf_add(s, "data: ", 6);
    sbuf_add(s, j, strlen(j));
    sbuf_add(s, "\n\n", 2);
    free(j);
}

/* Text that can go out: all of it once done, else short of the longest stop
 * string (it may still be forming), on a UTF-8 character boundary. */
static size_t safe_end(const struct serve_req *r)
{
    if (r->state == SERVE_DONE || r->p.n_stop == 0)
        return r->text_len;
    size_t hold = 0;
    for (int i = 0; i < r->p.n_stop; i++)
        hold = strlen(r->p.stop[i]) - 1 > hold ? strlen(r->p.stop[i]) - 1 : hold;
    size_t end = r->text_len > hold ? r->text_len - hold : 0;
    while (end > 0 && end < r->text_len && ((unsigned char)r->text[end] & 0xC0) == 0x80)
        end--;
    return end;
}

/* Adds the events for what r has produced since the last call (mu held).
 * @return 1 when the stream is complete. */
static int stream_events(struct stream *s)
{
    struct serve_req *r = s->r;
    struct serve_http *h = s->h;
    const int done = r->state == SERVE_DONE;
    if (done && r->status) {
        char *ej = serve_error_json(r->status, r->error, NULL, NULL);
        sse_json(s, cJSON_Parse(ej ? ej : "{}"));
        free(ej);
        sbuf_add(s, "data: [DONE]\n\n", 14);
        return 1;
    }
    size_t end = safe_end(r);
    if (end > s->text_sent || (r->p.chat && !s->role_sent) || (done && r->n_out > s->tok_sent) || done) {
        cJSON *root = envelope(h, r, r->p.chat ? "chat.completion.chunk" : "text_completion");
        cJSON *choices = cJSON_AddArrayToObject(root, "choices"), *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", 0);
        char *piece = malloc(end - (s->text_sent < end ? s->text_sent : end) + 1);
        size_t pn = end > s->text_sent ? end - s->text_sent : 0;
        if (piece) {
            memcpy(piece, r->text ? r->text + s->text_sent : "", pn);
            piece[pn] = 0;
        }
        if (r->p.chat) {
            cJSON *d = cJSON_AddObjectToObject(c, "delta");
            if (!s->role_sent)
                cJSON_AddStringToObject(d, "role", "assistant");
            if (pn || !s->role_sent)
                cJSON_AddStringToObject(d, "content", piece ? piece : "");
            s->role_sent = 1;
        } else {
            cJSON_AddStringToObject(c, "text", piece ? piece : "");
        }
        free(piece);
        cJSON_AddItemToObject(c, "logprobs", logprobs_json(h, r, s->tok_sent, r->n_out));
        s->tok_sent = r->n_out;
        s->text_sent = end > s->text_sent ? end : s->text_sent;
        if (done)
            cJSON_AddStringToObject(c, "finish_reason", r->finish ? r->finish : "stop");
        else
            cJSON_AddNullToObject(c, "finish_reason");
        cJSON_AddItemToArray(choices, c);
        sse_json(s, root);
    }
    if (!done)
        return 0;
    if (r->p.include_usage) {
        cJSON *root = envelope(h, r, r->p.chat ? "chat.completion.chunk" : "text_completion");
        cJSON_AddArrayToObject(root, "choices");
        cJSON_AddItemToObject(root, "usage", usage_json(r));
        sse_json(s, root);
    }
    sbuf_add(s, "data: [DONE]\n\n", 14);
    return 1;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct stream *s = cls;
    struct serve_engine *e = s->h->e;
    while (s->off == s->len) {
        if (s->done)
            return MHD_CONTENT_READER_END_OF_STREAM;
        s->off = s->len = 0;
        serve_lock(e);
        s->done = stream_events(s);
        if (s->len == 0 && !s->done)
            serve_wait(e, s->r, WAIT_MS);
        serve_unlock(e);
        if (s->len == 0 && !s->done && peer_closed(s->conn)) {
            serve_cancel(e, s->r);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    size_t n = s->len - s->off < max ? s->len - s->off : max;
    memcpy(buf, s->buf + s->off, n);
    s->off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    struct stream *s = cls;
    serve_cancel(s->h->e, s->r); /* no-op once done */
    serve_req_release(s->h->e, s->r);
    free(s->buf);
    free(s);
}

/* ---- routes -------------------------------------------------------------- */

/* A completion of the parsed params p (serve_route checked them). */
static enum MHD_Result generate(struct serve_http *h, struct MHD_Connection *c, const char *route,
                                struct serve_params *p)
{
    char err[512];
    int status;
    const int stream = p->stream;
    const char *code;
    struct serve_req *r = serve_req_create(h->e, p, &status, err, sizeof err, &code);
    serve_params_free(p);
    if (!r)
        return send_error(h, c, route, status, err, NULL, code);
    if ((status = serve_submit(h->e, r, err, sizeof err)) != 0) {
        serve_req_release(h->e, r);
        return send_error(h, c, route, status, err, NULL, NULL);
    }
    if (stream) {
        struct stream *s = calloc(1, sizeof *s);
        struct MHD_Response *resp =
            s ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s, stream_free) : NULL;
        if (!resp) {
            free(s);
            serve_cancel(h->e, r);
            serve_req_release(h->e, r);
            return MHD_NO;
        }
        s->h = h;
        s->r = r;
        s->conn = c;
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        enum MHD_Result rc = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        serve_count_request(h->e, route, 200);
        return rc;
    }
    struct serve_engine *e = h->e;
    serve_lock(e);
    while (r->state != SERVE_DONE) {
        serve_wait(e, r, WAIT_MS);
        if (r->state == SERVE_DONE)
            break;
        serve_unlock(e);
        int gone = peer_closed(c);
        serve_lock(e);
        if (gone) {
            serve_unlock(e);
            serve_cancel(e, r);
            serve_req_release(e, r);
            serve_count_request(e, route, 499);
            return MHD_NO; /* nobody to answer */
        }
    }
    cJSON *root = r->status ? NULL : completion_json(h, r);
    status = r->status;
    snprintf(err, sizeof err, "%s", r->error);
    serve_unlock(e);
    serve_req_release(e, r);
    if (status)
        return send_error(h, c, route, status, err, NULL, NULL);
    return send_json(h, c, route, 200, root);
}

static enum MHD_Result models(struct serve_http *h, struct MHD_Connection *c, const char *url)
{
    const char *name = serve_model_name(h->e);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "kvq");
    if (url[10] == '/') /* serve_route checked that it names this model */
        return send_json(h, c, "/v1/models", 200, m);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "data"), m);
    return send_json(h, c, "/v1/models", 200, root);
}

/* The answer to a request serve_route let through (status 0). */
static enum MHD_Result answer(struct serve_http *h, struct MHD_Connection *c, const char *url,
                              struct serve_route_out *o)
{
    switch (o->route) {
    case SERVE_ROUTE_HEALTH: {
        const int draining = serve_draining(h->e);
        return send_text(h, c, o->name, draining ? 503 : 200, "application/json",
                         strdup(draining ? "{\"status\":\"draining\"}" : "{\"status\":\"ok\"}"));
    }
    case SERVE_ROUTE_METRICS:
        return send_text(h, c, o->name, 200, "text/plain; version=0.0.4", serve_metrics_text(h->e));
    case SERVE_ROUTE_MODELS:
        return models(h, c, url);
    case SERVE_ROUTE_COMPLETIONS:
    case SERVE_ROUTE_CHAT:
        return generate(h, c, o->name, &o->params);
    case SERVE_ROUTE_TOKENIZE:
    case SERVE_ROUTE_DETOKENIZE: {
        char err[256];
        int status = 0;
        char *json = serve_tok_answer(serve_tokenizer(h->e), o->route == SERVE_ROUTE_DETOKENIZE, &o->tok, &status,
                                      err, sizeof err);
        if (!json)
            return send_error(h, c, o->name, status, err, status != 400                           ? NULL
                              : o->route == SERVE_ROUTE_DETOKENIZE ? "tokens"
                                                                   : "content",
                              NULL);
        return send_text(h, c, o->name, 200, "application/json", json);
    }
    default:
        return MHD_NO; /* serve_route answers every other route with an error */
    }
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    struct serve_http *h = cls;
    struct conn_ctx *cc = *con_cls;
    struct serve_route_in in = {
        .method = method,
        .url = url,
        .authorization = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"),
        .content_length = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length"),
    };
    struct serve_route_out o;
    if (!cc) { /* headers only: checks that need no body */
        if (!(cc = calloc(1, sizeof *cc)))
            return MHD_NO;
        *con_cls = cc;
        pthread_mutex_lock(&h->mu);
        h->in_flight++;
        pthread_mutex_unlock(&h->mu);
        enum MHD_Result rc = MHD_YES;
        if (serve_route(&h->route, &in, 1, &o))
            rc = send_error(h, c, o.name, o.status, o.message, o.param, o.code);
        serve_route_free(&o);
        return rc;
    }
    if (*upload_size) {
        if (cc->len + *upload_size > h->cfg.max_body)
            cc->too_large = 1;
        else {
            if (cc->len + *upload_size + 1 > cc->cap) {
                size_t cap = (cc->len + *upload_size + 1) * 2;
                char *b = realloc(cc->body, cap);
                if (!b)
                    return MHD_NO;
                cc->body = b;
                cc->cap = cap;
            }
            memcpy(cc->body + cc->len, upload, *upload_size);
            cc->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    /* the whole request is here: no deadline while it is answered */
    serve_conns_received(h->conns, c);
    in.body = cc->body;
    in.len = cc->len;
    in.body_too_large = cc->too_large;
    enum MHD_Result rc;
    if (serve_route(&h->route, &in, 0, &o))
        rc = send_text_allow(h, c, o.name, o.status, "application/json",
                             serve_error_json(o.status, o.message, o.param, o.code), o.allow);
    else
        rc = answer(h, c, url, &o);
    serve_route_free(&o);
    return rc;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why)
{
    (void)why;
    struct serve_http *h = cls;
    struct conn_ctx *cc = *con_cls;
    if (cc) {
        free(cc->body);
        free(cc);
        *con_cls = NULL;
        pthread_mutex_lock(&h->mu);
        if (--h->in_flight == 0)
            pthread_cond_broadcast(&h->idle);
        pthread_mutex_unlock(&h->mu);
    }
    /* keep-alive: the next request on this connection has --timeout to arrive */
    serve_conns_rearm(h->conns, c);
}

int serve_http_start(struct serve_engine *e, const struct serve_http_config *cfg, struct serve_http **out,
                     int *port, char *err, size_t cap)
{
    struct serve_http *h = calloc(1, sizeof *h);
    if (!h) {
        snprintf(err, cap, "out of memory");
        return 1;
    }
    h->e = e;
    h->cfg = *cfg;
    h->route.api_key = cfg->api_key;
    h->route.max_body = cfg->max_body;
    h->route.model_name = serve_model_name(e);
    h->route.vocab = kvq_tokenizer_vocab_size(serve_tokenizer(e));
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)cfg->port);
    if (inet_pton(AF_INET, cfg->host, &sa.sin_addr) != 1) {
        snprintf(err, cap, "--host %s is not a numeric IPv4 address", cfg->host);
        free(h);
        return 2;
    }
    int rc = serve_conns_start(cfg->timeout_s, cfg->max_connections, cfg->max_per_ip, cfg->quiet, &h->conns, err,
                               cap);
    if (rc) {
        free(h);
        return rc;
    }
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->idle, NULL);
    /* poll, not select: a socket numbered past FD_SETSIZE (1024) is then
     * served too. libmicrohttpd's own limit is one above ours: it refuses
     * before the accept policy (serve_conns_admit) runs, and without a log
     * line. */
    h->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD, (uint16_t)cfg->port,
                            serve_conns_admit, h->conns, handler, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)cfg->timeout_s,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned int)cfg->max_connections + 1,
                            MHD_OPTION_NOTIFY_CONNECTION, serve_conns_notify, h->conns,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, h, MHD_OPTION_END);
    if (!h->d) {
        snprintf(err, cap, "cannot listen on %s:%d: %s", cfg->host, cfg->port, strerror(errno));
        serve_conns_stop(h->conns);
        pthread_cond_destroy(&h->idle);
        pthread_mutex_destroy(&h->mu);
        free(h);
        return 1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    *port = di ? (int)di->port : cfg->port;
    *out = h;
    return 0;
}

void serve_http_stop(struct serve_http *h)
{
    if (!h)
        return;
    /* After the drain the engine has finished every request, but a
     * connection may still be writing its answer (the last of the queue):
     * stopping the daemon now would cut it off. Wait for those, at most
     * STOP_WAIT_S (a stalled client is closed by its deadline anyway). */
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += h->cfg.timeout_s < STOP_WAIT_S ? h->cfg.timeout_s : STOP_WAIT_S;
    pthread_mutex_lock(&h->mu);
    while (h->in_flight > 0 && pthread_cond_timedwait(&h->idle, &h->mu, &t) == 0)
        ;
    pthread_mutex_unlock(&h->mu);
    MHD_stop_daemon(h->d);
    serve_conns_stop(h->conns);
    pthread_cond_destroy(&h->idle);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
