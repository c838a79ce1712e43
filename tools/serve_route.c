/* serve_route.c - the per-request decision of `kvq serve` (serve_route.h):
 * from the method, the URL, two headers and the body to the route and what
 * to answer. The checks run in a fixed order, so that a client learns the
 * most basic problem first: an oversized body (413), an unknown URL (404), a
 * wrong method (405), a missing or wrong API key (401), then the body (400)
 * and the model it names (404). Everything here arrives from the network. */
#include <stdio.h>
#include <string.h>

#include "serve_route.h"

static const struct {
    const char *path;
    enum serve_route route;
    int post; /* the method it takes: POST, else GET/HEAD */
    int key;  /* needs the API key */
} routes[] = {
    {"/v1/completions", SERVE_ROUTE_COMPLETIONS, 1, 1},
    {"/v1/chat/completions", SERVE_ROUTE_CHAT, 1, 1},
    {"/v1/models", SERVE_ROUTE_MODELS, 0, 1},
    {"/health", SERVE_ROUTE_HEALTH, 0, 0},
    {"/metrics", SERVE_ROUTE_METRICS, 0, 0},
    {"/tokenize", SERVE_ROUTE_TOKENIZE, 1, 1},
    {"/detokenize", SERVE_ROUTE_DETOKENIZE, 1, 1},
};
#define N_ROUTES (sizeof routes / sizeof routes[0])

/* The table index of url, or -1. /v1/models also has /v1/models/ID. */
static int find_route(const char *url)
{
    for (size_t i = 0; i < N_ROUTES; i++) {
        size_t n = strlen(routes[i].path);
        if (strncmp(url, routes[i].path, n) == 0 &&
            (url[n] == 0 || (routes[i].route == SERVE_ROUTE_MODELS && url[n] == '/')))
            return (int)i;
    }
    return -1;
}

/* Content-Length as a number, saturating: a value past any body size is
 * simply too large. Not digits: 0 (libmicrohttpd refuses those itself). */
static unsigned long long content_length(const char *s)
{
    unsigned long long v = 0;
    while (*s == ' ' || *s == '\t')
        s++;
    for (; *s >= '0' && *s <= '9'; s++)
        v = v > (~0ull - 9) / 10 ? ~0ull : v * 10 + (unsigned)(*s - '0');
    return v;
}

int serve_route_authorized(const char *key, const char *a)
{
    if (!key)
        return 1;
    if (!a)
        return 0;
    while (*a == ' ' || *a == '\t')
        a++;
    /* RFC 9110: the scheme is case-insensitive, then one or more spaces */
    static const char scheme[] = "bearer";
    for (size_t i = 0; i < sizeof scheme - 1; i++, a++)
        if ((*a | 0x20) != scheme[i])
            return 0;
    if (*a != ' ' && *a != '\t')
        return 0;
    while (*a == ' ' || *a == '\t')
        a++;
    size_t n = strlen(a), k = strlen(key);
    while (n > 0 && (a[n - 1] == ' ' || a[n - 1] == '\t'))
        n--;
    /* time independent of where they differ: every byte given is compared */
    unsigned diff = n != k;
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)a[i] ^ (unsigned char)key[k ? i % k : 0];
    return diff == 0;
}

static int fail(struct serve_route_out *o, int status, const char *param, const char *code, const char *msg)
{
    o->status = status;
    o->code = code;
    snprintf(o->param, sizeof o->param, "%s", param ? param : "");
    snprintf(o->message, sizeof o->message, "%s", msg);
    return status;
}

int serve_route(const struct serve_route_config *cfg, const struct serve_route_in *in, int headers_only,
                 struct serve_route_out *o)
{
    memset(o, 0, sizeof *o);
    const char *method = in->method ? in->method : "", *url = in->url ? in->url : "";
    const int r = find_route(url);
    o->route = r < 0 ? SERVE_ROUTE_OTHER : routes[r].route;
    o->name = r < 0 ? "other" : routes[r].path;
    char msg[512];
    snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", cfg->max_body);
    if (headers_only) { /* checks that need no body: the rest waits for it */
        if (in->content_length && content_length(in->content_length) > cfg->max_body)
            return fail(o, 413, NULL, NULL, msg);
        return 0;
    }
    if (in->body_too_large)
        return fail(o, 413, NULL, NULL, msg);
    if (r < 0) {
        snprintf(msg, sizeof msg, "no route %.8s %.200s", method, url);
        return fail(o, 404, NULL, "unknown_url", msg);
    }
    const int post = strcmp(method, "POST") == 0, get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    if (routes[r].post ? !post : !get) {
        o->allow = routes[r].post ? "POST" : "GET";
        snprintf(msg, sizeof msg, "%.8s is not allowed on %s", method, routes[r].path);
        return fail(o, 405, NULL, "method_not_allowed", msg);
    }
    if (routes[r].key && !serve_route_authorized(cfg->api_key, in->authorization))
        return fail(o, 401, NULL, "invalid_api_key", "Incorrect API key provided");
    const char *model = NULL;
    switch (o->route) {
    case SERVE_ROUTE_MODELS:
        model = url[strlen(routes[r].path)] == '/' ? url + strlen(routes[r].path) + 1 : NULL;
        break;
    case SERVE_ROUTE_COMPLETIONS:
    case SERVE_ROUTE_CHAT:
        o->status = serve_params_parse(in->body, in->len, o->route == SERVE_ROUTE_CHAT, &o->params, o->message,
                                       sizeof o->message, o->param, sizeof o->param);
        if (o->status) {
            o->code = o->params.code; /* the parser's precise code (serve_request.c) */
            return o->status;
        }
        o->has_params = 1;
        model = o->params.model;
        break;
    case SERVE_ROUTE_TOKENIZE:
    case SERVE_ROUTE_DETOKENIZE:
        o->status = serve_tok_parse(in->body, in->len, o->route == SERVE_ROUTE_DETOKENIZE, cfg->vocab, &o->tok,
                                    o->message, sizeof o->message, o->param, sizeof o->param);
        o->has_tok = o->status == 0;
        return o->status;
    default:
        return 0;
    }
    if (model && strcmp(model, cfg->model_name ? cfg->model_name : "") != 0) {
        snprintf(msg, sizeof msg, "The model '%.200s' does not exist; this server serves '%.200s'", model,
                 cfg->model_name ? cfg->model_name : "");
        return fail(o, 404, "model", "model_not_found", msg);
    }
    return 0;
}

void serve_route_free(struct serve_route_out *o)
{
    if (o->has_params)
        serve_params_free(&o->params);
    if (o->has_tok)
        serve_tok_params_free(&o->tok);
    o->has_params = o->has_tok = 0;
}
