/* serve_request.c - OpenAI request bodies -> struct serve_params, and
 * OpenAI's error JSON. Every byte here comes from the network: each field is
 * checked for type and range, and a bad one gives 400 with a message naming
 * it, never a crash (tests/fuzz/fuzz_serve_request.c). Fields the server
 * does not know are ignored, as clients send many optional ones. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq_codec.h"
#include "serve.h"

#define MAX_PROMPT_IDS (1u << 24)

struct perr {
    char *msg, *param;
    size_t cap, param_cap;
};

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int bad(const struct perr *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, e->cap, fmt, ap);
    va_end(ap);
    snprintf(e->param, e->param_cap, "%s", param);
    return 400;
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d)
        memcpy(d, s, n + 1);
    return d;
}

/* A number that is an integer in [lo, hi]. */
static int get_int(const cJSON *v, double lo, double hi, long long *out)
{
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble) ||
        v->valuedouble < lo || v->valuedouble > hi)
        return -1;
    *out = (long long)v->valuedouble;
    return 0;
}

static int parse_prompt(const cJSON *pr, struct serve_params *p, const struct perr *e)
{
    if (cJSON_IsString(pr)) {
        p->prompt = dup_str(pr->valuestring);
        return p->prompt ? 0 : bad(e, "prompt", "out of memory");
    }
    if (!cJSON_IsArray(pr))
        return bad(e, "prompt", "'prompt' must be a string, an array of one string, or an array of token ids");
    int n = cJSON_GetArraySize(pr);
    const cJSON *first = cJSON_GetArrayItem(pr, 0);
    if (n == 1 && (cJSON_IsString(first) || cJSON_IsArray(first)))
        return parse_prompt(first, p, e); /* a batch of one prompt */
    if (n == 0)
        return bad(e, "prompt", "'prompt' is empty");
    if ((unsigned)n > MAX_PROMPT_IDS)
        return bad(e, "prompt", "'prompt' has more than %u token ids", MAX_PROMPT_IDS);
    p->prompt_ids = malloc((size_t)n * sizeof *p->prompt_ids);
    if (!p->prompt_ids)
        return bad(e, "prompt", "out of memory");
    const cJSON *x;
    cJSON_ArrayForEach(x, pr)
    {
        long long id;
        if (cJSON_IsString(x) || cJSON_IsArray(x))
            return bad(e, "prompt", "kvq serve takes one prompt per request (n_prompts = %d)", n);
        if (get_int(x, 0, 2147483647.0, &id))
            return bad(e, "prompt", "'prompt' token ids must be non-negative integers");
        p->prompt_ids[p->n_prompt_ids++] = (int32_t)id;
    }
    return 0;
}

/* Chat messages: a non-empty array of {role, content}, content a string or
 * an array of {"type": "text", "text": ...} parts. Kept for the renderer. */
static int parse_messages(cJSON *root, struct serve_params *p, const struct perr *e)
{
    cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!msgs)
        return bad(e, "messages", "'messages' is required");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return bad(e, "messages", "'messages' must be a non-empty array");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        char where[48];
        snprintf(where, sizeof where, "messages[%d]", i++);
        if (!cJSON_IsObject(m) || !cJSON_IsString(role))
            return bad(e, where, "%s must be an object with a string 'role'", where);
        const char *r = role->valuestring;
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "developer") &&
            strcmp(r, "tool"))
            return bad(e, where, "%s.role '%.40s' is not system, developer, user, assistant or tool", where, r);
        if (cJSON_IsString(content) || (cJSON_IsNull(content) && strcmp(r, "assistant") == 0))
            continue;
        if (!cJSON_IsArray(content))
            return bad(e, where, "%s.content must be a string or an array of text parts", where);
        const cJSON *part;
        cJSON_ArrayForEach(part, content)
        {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 ||
                !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(part, "text")))
                return bad(e, where, "%s.content parts must be {\"type\": \"text\", \"text\": string}", where);
        }
    }
    p->messages = cJSON_DetachItemViaPointer(root, msgs);
    return 0;
}

static int parse_stop(const cJSON *v, struct serve_params *p, const struct perr *e)
{
    if (!v || cJSON_IsNull(v))
        return 0;
    const cJSON *one = v, *x;
    if (cJSON_IsArray(v)) {
        if (cJSON_GetArraySize(v) > SERVE_MAX_STOP)
            return bad(e, "stop", "'stop' takes at most %d sequences", SERVE_MAX_STOP);
        cJSON_ArrayForEach(x, v)
        {
            if (!cJSON_IsString(x) || !x->valuestring[0] || strlen(x->valuestring) > SERVE_STOP_MAX_LEN)
                return bad(e, "stop", "'stop' sequences must be non-empty strings of at most %d bytes",
                           SERVE_STOP_MAX_LEN);
            if (!(p->stop[p->n_stop++] = dup_str(x->valuestring)))
                return bad(e, "stop", "out of memory");
        }
        return 0;
    }
    if (!cJSON_IsString(one) || !one->valuestring[0] || strlen(one->valuestring) > SERVE_STOP_MAX_LEN)
        return bad(e, "stop", "'stop' must be a non-empty string of at most %d bytes or an array of them",
                   SERVE_STOP_MAX_LEN);
    return (p->stop[p->n_stop++] = dup_str(one->valuestring)) ? 0 : bad(e, "stop", "out of memory");
}

/* The "kvq" extension: {"cache_type_k": T, "cache_type_v": T}. */
static int parse_kvq(const cJSON *v, struct serve_params *p, const struct perr *e)
{
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsObject(v))
        return bad(e, "kvq", "'kvq' must be an object");
    const char *names[2] = {"cache_type_k", "cache_type_v"};
    int *dst[2] = {&p->type_k, &p->type_v};
    for (int i = 0; i < 2; i++) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, names[i]);
        enum kvq_type ty;
        if (!t)
            return bad(e, names[i], "'kvq.%s' is required with the kvq extension", names[i]);
        if (!cJSON_IsString(t) || kvq_type_from_name(t->valuestring, &ty) != KVQ_OK)
            return bad(e, names[i], "'kvq.%s' is not a cache type (see kvq types)", names[i]);
        *dst[i] = (int)ty;
    }
    p->has_types = 1;
    return 0;
}

static int parse_sampling(const cJSON *root, struct serve_params *p, const struct perr *e)
{
    const cJSON *v;
    long long n;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "n")) && !cJSON_IsNull(v) && (get_int(v, 1, 1, &n)))
        return bad(e, "n", "kvq serve returns one choice per request: 'n' must be 1");
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "max_completion_tokens")) && !cJSON_IsNull(v)) {
        if (get_int(v, 1, 1 << 24, &n))
            return bad(e, "max_completion_tokens", "'max_completion_tokens' must be an integer in 1..16777216");
        p->max_tokens = (int)n;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "max_tokens")) && !cJSON_IsNull(v)) {
        if (get_int(v, 1, 1 << 24, &n))
            return bad(e, "max_tokens", "'max_tokens' must be an integer in 1..16777216");
        p->max_tokens = (int)n;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "temperature")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= 2))
            return bad(e, "temperature", "'temperature' must be a number in [0, 2]");
        p->temperature = (float)v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "top_p")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0 && v->valuedouble <= 1))
            return bad(e, "top_p", "'top_p' must be a number in (0, 1]");
        p->top_p = (float)v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "top_k")) && !cJSON_IsNull(v)) {
        if (get_int(v, 0, 1 << 24, &n))
            return bad(e, "top_k", "'top_k' must be a non-negative integer");
        p->top_k = (int)n;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "seed")) && !cJSON_IsNull(v)) {
        if (get_int(v, -9007199254740991.0, 9007199254740991.0, &n))
            return bad(e, "seed", "'seed' must be an integer");
        p->seed = (uint64_t)n;
        p->has_seed = 1;
    }
    return 0;
}

static int parse_stream_logprobs(const cJSON *root, struct serve_params *p, const struct perr *e)
{
    const cJSON *v;
    long long n;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "stream")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsBool(v))
            return bad(e, "stream", "'stream' must be a boolean");
        p->stream = cJSON_IsTrue(v);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "ignore_eos")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsBool(v))
            return bad(e, "ignore_eos", "'ignore_eos' must be a boolean");
        p->ignore_eos = cJSON_IsTrue(v);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "stream_options")) && !cJSON_IsNull(v)) {
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(v, "include_usage");
        if (!cJSON_IsObject(v) || (u && !cJSON_IsBool(u)))
            return bad(e, "stream_options", "'stream_options' must be an object with a boolean 'include_usage'");
        p->include_usage = cJSON_IsTrue(u);
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
    if (p->chat) { /* logprobs: bool, top_logprobs: 0..20 */
        if (v && !cJSON_IsNull(v) && !cJSON_IsBool(v))
            return bad(e, "logprobs", "'logprobs' must be a boolean");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "top_logprobs");
        n = 0;
        if (t && !cJSON_IsNull(t) && get_int(t, 0, SERVE_MAX_LOGPROBS, &n))
            return bad(e, "top_logprobs", "'top_logprobs' must be an integer in 0..%d", SERVE_MAX_LOGPROBS);
        if (t && !cJSON_IsNull(t) && !cJSON_IsTrue(v))
            return bad(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        p->logprobs = cJSON_IsTrue(v) ? (int)n : -1;
    } else if (v && !cJSON_IsNull(v)) { /* logprobs: 0..5 in OpenAI, up to 20 here */
        if (get_int(v, 0, SERVE_MAX_LOGPROBS, &n))
            return bad(e, "logprobs", "'logprobs' must be an integer in 0..%d", SERVE_MAX_LOGPROBS);
        p->logprobs = (int)n;
    }
    return 0;
}

int serve_params_parse(const char *body, size_t len, int chat, struct serve_params *p, char *err, size_t cap,
                       char *param, size_t param_cap)
{
    const struct perr e = {err, param, cap, param_cap};
    memset(p, 0, sizeof *p);
    p->chat = chat;
    p->max_tokens = -1;
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->logprobs = -1;
    if (param_cap)
        param[0] = 0;
    cJSON *root = body && len ? cJSON_ParseWithLength(body, len) : NULL;
    if (!root)
        return bad(&e, "", "the request body is not valid JSON");
    int rc = 0;
    if (!cJSON_IsObject(root)) {
        rc = bad(&e, "", "the request body must be a JSON object");
        goto out;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v)) {
            rc = bad(&e, "model", "'model' must be a string");
            goto out;
        }
        if (!(p->model = dup_str(v->valuestring))) {
            rc = bad(&e, "model", "out of memory");
            goto out;
        }
    }
    if (chat)
        rc = parse_messages(root, p, &e);
    else if (!(v = cJSON_GetObjectItemCaseSensitive(root, "prompt")))
        rc = bad(&e, "prompt", "'prompt' is required");
    else
        rc = parse_prompt(v, p, &e);
    if (!rc)
        rc = parse_sampling(root, p, &e);
    if (!rc)
        rc = parse_stop(cJSON_GetObjectItemCaseSensitive(root, "stop"), p, &e);
    if (!rc)
        rc = parse_stream_logprobs(root, p, &e);
    if (!rc)
        rc = parse_kvq(cJSON_GetObjectItemCaseSensitive(root, "kvq"), p, &e);
out:
    cJSON_Delete(root);
    if (rc)
        serve_params_free(p);
    return rc;
}

void serve_params_free(struct serve_params *p)
{
    if (!p)
        return;
    free(p->model);
    free(p->prompt);
    free(p->prompt_ids);
    cJSON_Delete(p->messages);
    for (int i = 0; i < p->n_stop; i++)
        free(p->stop[i]);
    int chat = p->chat;
    memset(p, 0, sizeof *p);
    p->chat = chat;
}

char *serve_error_json(int status, const char *message, const char *param, const char *code)
{
    const char *type = status == 401   ? "authentication_error"
                       : status == 404 ? "not_found_error"
                       : status == 429 ? "rate_limit_error"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", type);
    if (param && *param)
        cJSON_AddStringToObject(e, "param", param);
    else
        cJSON_AddNullToObject(e, "param");
    if (code)
        cJSON_AddStringToObject(e, "code", code);
    else
        cJSON_AddNullToObject(e, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}
