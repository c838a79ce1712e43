/* serve_route.h - `kvq serve`'s per-request decision as pure functions, so
 * that the whole HTTP request path the engine sees (method, URL, the
 * Authorization and Content-Length headers, the body) can be fuzzed without a
 * socket (tests/fuzz/fuzz_serve_http.c):
 *  - serve_route.c: the route, the status (404/405/401/413, the body's 400)
 *    and the parsed body, or what to answer instead;
 *  - serve_tokenize.c: /tokenize and /detokenize bodies, and the JSON text
 *    of their answers (every byte kept, NUL included).
 * serve_http.c does the I/O around them. */
#ifndef KVQ_SERVE_ROUTE_H
#define KVQ_SERVE_ROUTE_H

#include <stddef.h>
#include <stdint.h>

#include "serve.h"

enum serve_route {
    SERVE_ROUTE_OTHER,
    SERVE_ROUTE_COMPLETIONS,
    SERVE_ROUTE_CHAT,
    SERVE_ROUTE_MODELS,
    SERVE_ROUTE_HEALTH,
    SERVE_ROUTE_METRICS,
    SERVE_ROUTE_TOKENIZE,
    SERVE_ROUTE_DETOKENIZE
};

/* A /tokenize or /detokenize body as parsed (serve_tokenize.c). */
struct serve_tok_params {
    char *content;          /* /tokenize: the text, NUL bytes kept (malloc'ed) */
    size_t content_len;
    int add_special;        /* the post-processor's special tokens (BOS); llama-server's default: off */
    int with_pieces;        /* answer [{"id", "piece"}] instead of ids */
    int32_t *ids;           /* /detokenize: the ids, each in [0, vocab) (malloc'ed) */
    size_t n_ids;
};

/* What the router needs to know of the server: nothing that does I/O. */
struct serve_route_config {
    const char *api_key;    /* NULL: no key */
    size_t max_body;
    const char *model_name;
    int32_t vocab;          /* token ids must be below it */
};

/* One request as it arrived. NULL header values: the header is absent. */
struct serve_route_in {
    const char *method, *url;
    const char *authorization, *content_length;
    const char *body;       /* the body (NULL when empty) */
    size_t len;
    int body_too_large;     /* more than max_body bytes arrived (the rest was dropped) */
};

/* The decision: status 0 means the handler goes ahead with route (and the
 * parsed body for the generation and tokenizer routes); otherwise it answers
 * status with OpenAI's error JSON of message, param and code. */
struct serve_route_out {
    enum serve_route route;
    const char *name;       /* the route as /metrics counts it */
    int status;
    char message[512];
    char param[64];
    const char *code;       /* OpenAI's error code, or NULL */
    const char *allow;      /* 405: the Allow header */
    int has_params;         /* params hold a parsed completions/chat body */
    struct serve_params params;
    int has_tok;            /* tok holds a parsed /tokenize or /detokenize body */
    struct serve_tok_params tok;
};

/** Decides on in. headers_only: only the headers have arrived (the 413 of a
 *  Content-Length over max_body is given before the body is read; the body's
 *  checks wait for the final call). @return out->status: 0 (go ahead) or the
 *  HTTP status to answer; out is freed with serve_route_free either way. */
int serve_route(const struct serve_route_config *cfg, const struct serve_route_in *in, int headers_only,
                 struct serve_route_out *out);
void serve_route_free(struct serve_route_out *out);

/** 1 when authorization carries key: the scheme "Bearer" in any case, then
 *  the key, compared in time independent of where they differ. */
int serve_route_authorized(const char *key, const char *authorization);

/** Parses a /tokenize (detok = 0) or /detokenize (detok = 1) body. @return 0,
 *  or 400 with the message in err and the field in param (may be ""). */
int serve_tok_parse(const char *body, size_t len, int detok, int32_t vocab, struct serve_tok_params *p, char *err,
                    size_t cap, char *param, size_t param_cap);
void serve_tok_params_free(struct serve_tok_params *p);

/** Runs the tokenizer for a parsed /tokenize (detok = 0) or /detokenize
 *  body. @return the answer's JSON text (malloc'ed), or NULL with the HTTP
 *  status (400: the text has no tokens, an id no token; 503: no memory) and
 *  the message in err. */
char *serve_tok_answer(const kvq_tokenizer *tok, int detok, const struct serve_tok_params *p, int *status,
                       char *err, size_t cap);

/** The answers' JSON text (malloc'ed; NULL without memory). /tokenize:
 *  {"tokens": [ids]}, or with pieces[i] (its bytes, piece_len[i] long; NULL
 *  for none) [{"id", "piece"}], a piece that is not UTF-8 given as its bytes
 *  as llama-server does. /detokenize: {"content": text}. */
char *serve_tok_json(const int32_t *ids, size_t n, const char *const *pieces, const size_t *piece_len);
char *serve_detok_json(const char *text, size_t len);


#endif
