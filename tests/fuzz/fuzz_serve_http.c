/* fuzz_serve_http.c - libFuzzer target for the HTTP request path of kvq
 * serve as the engine sees it (tools/serve_route.c, serve_tokenize.c,
 * serve_request.c): the method, URL, Authorization and Content-Length
 * headers and the body of one request go through serve_route's two stages
 * (headers only, then with the body), as libmicrohttpd hands them to the
 * handler. Any bytes give a route and a status with a message, never a
 * crash or a leak; a request let through has its body parsed, and a parsed
 * /tokenize or /detokenize body satisfies what the tokenizer is then given.
 *
 * Input: one flag byte, then method, URL, Authorization and Content-Length,
 * each ended by '\n', then the body. Flag bits: 1 an API key is set, 2 the
 * Authorization header is absent, 4 the Content-Length header is absent,
 * 8 a small --max-body (64 bytes), 16 the body was over --max-body. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve_route.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The next '\n'-ended field of [*p, end) as a NUL-terminated copy. */
static char *field(const uint8_t **p, const uint8_t *end)
{
    const uint8_t *nl = memchr(*p, '\n', (size_t)(end - *p));
    size_t n = nl ? (size_t)(nl - *p) : (size_t)(end - *p);
    char *s = malloc(n + 1);
    if (!s)
        abort();
    memcpy(s, *p, n);
    s[n] = 0;
    *p += nl ? n + 1 : n;
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const unsigned flags = data[0];
    const uint8_t *p = data + 1, *end = data + size;
    char *method = field(&p, end), *url = field(&p, end), *auth = field(&p, end), *clen = field(&p, end);
    const struct serve_route_config cfg = {
        .api_key = flags & 1 ? "sekrit" : NULL,
        .max_body = flags & 8 ? 64 : 1u << 20,
        .model_name = "kvq-tiny-llama",
        .vocab = 4096,
    };
    /* the body in its own allocation, so a read past it is caught */
    size_t len = (size_t)(end - p);
    char *body = len ? malloc(len) : NULL;
    if (len && !body)
        abort();
    if (len)
        memcpy(body, p, len);
    struct serve_route_in in = {
        .method = method,
        .url = url,
        .authorization = flags & 2 ? NULL : auth,
        .content_length = flags & 4 ? NULL : clen,
        .body = body,
        .len = len,
        .body_too_large = (flags & 16) != 0,
    };
    struct serve_route_out o;
    int st = serve_route(&cfg, &in, 1, &o);
    if (st != o.status || (st && st != 413))
        abort();
    serve_route_free(&o);
    if (!st) {
        st = serve_route(&cfg, &in, 0, &o);
        if (st != o.status || (st && !o.message[0]) || !o.name)
            abort();
        if (!st && o.route == SERVE_ROUTE_DETOKENIZE) {
            for (size_t i = 0; i < o.tok.n_ids; i++)
                if (o.tok.ids[i] < 0 || o.tok.ids[i] >= cfg.vocab)
                    abort();
            free(serve_tok_json(o.tok.ids, o.tok.n_ids, NULL, NULL));
        }
        if (!st && o.route == SERVE_ROUTE_TOKENIZE) {
            /* {"content": the text} is a /tokenize body again: it must give
             * back every byte, NULs too */
            char *j = serve_detok_json(o.tok.content, o.tok.content_len), err[256], param[64];
            struct serve_tok_params q;
            if (!j || serve_tok_parse(j, strlen(j), 0, cfg.vocab, &q, err, sizeof err, param, sizeof param) ||
                q.content_len != o.tok.content_len || memcmp(q.content, o.tok.content, q.content_len) != 0)
                abort();
            serve_tok_params_free(&q);
            free(j);
        }
        serve_route_free(&o);
    }
    free(body);
    free(method);
    free(url);
    free(auth);
    free(clen);
    return 0;
}
