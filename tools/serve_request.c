/* serve_request.c - OpenAI request bodies -> struct serve_params, and
 * OpenAI's error JSON. Every byte here comes from the network: each field is
 * checked for type and range, and a bad one gives 400 with a message naming
 * it and OpenAI's code for the kind of error, never a crash
 * (tests/fuzz/fuzz_serve_request.c). Fields the server does not know are
 * ignored, as clients send many optional ones; known fields that would
 * change the answer and are not implemented are refused, naming the field
 * (parse_refused), so a client never gets an answer to a question it did
 * not ask. */
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
    const char **code;
};

/* OpenAI's codes for the kinds of bad input */
#define E_JSON "invalid_json"
#define E_TYPE "invalid_type"
#define E_VALUE "invalid_value"
#define E_UTF8 "invalid_utf8"
#define E_MISSING "missing_required_parameter"
#define E_PARAM "unsupported_parameter"
#define E_UNSUPPORTED "unsupported_value"

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static int bad(const struct perr *e, const char *param, const char *code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, e->cap, fmt, ap);
    va_end(ap);
    snprintf(e->param, e->param_cap, "%s", param);
    *e->code = code;
    return 400;
}

static int oom(const struct perr *e, const char *param)
{
    bad(e, param, NULL, "out of memory");
    return 503;
}

static char *dup_mem(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d)
        memcpy(d, s, n), d[n] = 0;
    return d;
}

static char *dup_str(const char *s)
{
    return dup_mem(s, strlen(s));
}

/* A text field's bytes must be UTF-8 (the tokenizer takes nothing else). */
static int check_utf8(const struct perr *e, const char *param, const cJSON *s)
{
    size_t n = serve_json_strlen(s), at = serve_utf8_check(s->valuestring, n);
    if (at < n)
        return bad(e, param, E_UTF8, "'%s' is not valid UTF-8 (byte %zu of %zu)", param, at, n);
    return 0;
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
        p->prompt_len = serve_json_strlen(pr);
        if (check_utf8(e, "prompt", pr))
            return 400;
        p->prompt = dup_mem(pr->valuestring, p->prompt_len);
        return p->prompt ? 0 : oom(e, "prompt");
    }
    if (!cJSON_IsArray(pr))
        return bad(e, "prompt", E_TYPE, "'prompt' must be a string, an array of one string, or an array of token ids");
    int n = cJSON_GetArraySize(pr);
    const cJSON *first = cJSON_GetArrayItem(pr, 0);
    if (n == 1 && (cJSON_IsString(first) || cJSON_IsArray(first)))
        return parse_prompt(first, p, e); /* a batch of one prompt */
    if (n == 0)
        return bad(e, "prompt", E_VALUE, "'prompt' is empty");
    if ((unsigned)n > MAX_PROMPT_IDS)
        return bad(e, "prompt", E_VALUE, "'prompt' has more than %u token ids", MAX_PROMPT_IDS);
    p->prompt_ids = malloc((size_t)n * sizeof *p->prompt_ids);
    if (!p->prompt_ids)
        return oom(e, "prompt");
    const cJSON *x;
    cJSON_ArrayForEach(x, pr)
    {
        long long id;
        if (cJSON_IsString(x) || cJSON_IsArray(x))
            return bad(e, "prompt", E_UNSUPPORTED, "kvq serve takes one prompt per request (n_prompts = %d)", n);
        if (get_int(x, 0, 2147483647.0, &id))
            return bad(e, "prompt", E_TYPE, "'prompt' token ids must be non-negative integers");
        p->prompt_ids[p->n_prompt_ids++] = (int32_t)id;
    }
    return 0;
}

/* A content given as parts -> one string: the text parts joined with "\n",
 * as vLLM joins them for a string-content template (what every template
 * that reads message['content'] as text expects); any other part is
 * refused, naming it. */
static int join_parts(cJSON *m, cJSON *content, const char *where, const struct perr *e)
{
    size_t len = 0, k = 0;
    char at[80];
    const cJSON *part;
    cJSON_ArrayForEach(part, content)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        snprintf(at, sizeof at, "%s.content[%zu]", where, k++);
        if (!cJSON_IsObject(part) || !cJSON_IsString(type))
            return bad(e, at, E_TYPE, "%s must be an object with a string 'type'", at);
        if (strcmp(type->valuestring, "text") != 0)
            return bad(e, at, E_UNSUPPORTED, "%s is a '%.40s' part; kvq serve takes text parts only", at,
                       type->valuestring);
        if (!cJSON_IsString(text))
            return bad(e, at, E_TYPE, "%s.text must be a string", at);
        if (check_utf8(e, at, text))
            return 400;
        len += serve_json_strlen(text) + 1;
    }
    char *joined = malloc(len + 1), *w = joined;
    if (!joined)
        return oom(e, where);
    cJSON_ArrayForEach(part, content)
    {
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        size_t n = serve_json_strlen(text);
        if (w > joined)
            *w++ = '\n';
        memcpy(w, text->valuestring, n);
        w += n;
    }
    cJSON *j = serve_json_string(joined, (size_t)(w - joined));
    free(joined);
    if (!j)
        return oom(e, where);
    cJSON_ReplaceItemInObjectCaseSensitive(m, "content", j); /* the first 'content', as read above */
    return 0;
}

/* Chat messages: a non-empty array of {role, content}, content a string or
 * an array of text parts (joined here). Kept for the renderer. */
static int parse_messages(cJSON *root, struct serve_params *p, const struct perr *e)
{
    cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!msgs)
        return bad(e, "messages", E_MISSING, "'messages' is required");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return bad(e, "messages", cJSON_IsArray(msgs) ? E_VALUE : E_TYPE, "'messages' must be a non-empty array");
    int i = 0;
    cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        char where[48], field[64];
        snprintf(where, sizeof where, "messages[%d]", i++);
        snprintf(field, sizeof field, "%s.content", where);
        if (!cJSON_IsObject(m) || !cJSON_IsString(role))
            return bad(e, where, E_TYPE, "%s must be an object with a string 'role'", where);
        const char *r = role->valuestring;
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "developer") &&
            strcmp(r, "tool"))
            return bad(e, where, E_VALUE, "%s.role '%.40s' is not system, developer, user, assistant or tool",
                       where, r);
        if (cJSON_IsString(content)) {
            if (check_utf8(e, field, content))
                return 400;
            continue;
        }
        if (cJSON_IsNull(content) && strcmp(r, "assistant") == 0)
            continue;
        if (!cJSON_IsArray(content))
            return bad(e, field, E_TYPE, "%s must be a string or an array of text parts", field);
        int rc = join_parts(m, content, where, e);
        if (rc)
            return rc;
    }
    p->messages = cJSON_DetachItemViaPointer(root, msgs);
    return 0;
}

/* The code of a number field that get_int or a range check refused. */
static const char *num_code(const cJSON *v)
{
    return cJSON_IsNumber(v) ? E_VALUE : E_TYPE;
}

static int parse_stop(const cJSON *v, struct serve_params *p, const struct perr *e)
{
    if (!v || cJSON_IsNull(v))
        return 0;
    const cJSON *one = v, *x;
    if (cJSON_IsArray(v)) {
        if (cJSON_GetArraySize(v) > SERVE_MAX_STOP)
            return bad(e, "stop", E_VALUE, "'stop' takes at most %d sequences", SERVE_MAX_STOP);
        cJSON_ArrayForEach(x, v)
        {
            if (!cJSON_IsString(x) || !x->valuestring[0] || strlen(x->valuestring) > SERVE_STOP_MAX_LEN)
                return bad(e, "stop", cJSON_IsString(x) ? E_VALUE : E_TYPE,
                           "'stop' sequences must be non-empty strings of at most %d bytes", SERVE_STOP_MAX_LEN);
            if (!(p->stop[p->n_stop++] = dup_str(x->valuestring)))
                return oom(e, "stop");
        }
        return 0;
    }
    if (!cJSON_IsString(one) || !one->valuestring[0] || strlen(one->valuestring) > SERVE_STOP_MAX_LEN)
        return bad(e, "stop", cJSON_IsString(one) ? E_VALUE : E_TYPE,
                   "'stop' must be a non-empty string of at most %d bytes or an array of them", SERVE_STOP_MAX_LEN);
    return (p->stop[p->n_stop++] = dup_str(one->valuestring)) ? 0 : oom(e, "stop");
}

/* The "kvq" extension: {"cache_type_k": T, "cache_type_v": T}. */
static int parse_kvq(const cJSON *v, struct serve_params *p, const struct perr *e)
{
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsObject(v))
        return bad(e, "kvq", E_TYPE, "'kvq' must be an object");
    const char *names[2] = {"cache_type_k", "cache_type_v"};
    int *dst[2] = {&p->type_k, &p->type_v};
    for (int i = 0; i < 2; i++) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, names[i]);
        enum kvq_type ty;
        if (!t)
            return bad(e, names[i], E_MISSING, "'kvq.%s' is required with the kvq extension", names[i]);
        if (!cJSON_IsString(t) || kvq_type_from_name(t->valuestring, &ty) != KVQ_OK)
            return bad(e, names[i], cJSON_IsString(t) ? E_VALUE : E_TYPE, "'kvq.%s' is not a cache type (see kvq types)",
                       names[i]);
        *dst[i] = (int)ty;
    }
    p->has_types = 1;
    return 0;
}

static int parse_sampling(const cJSON *root, struct serve_params *p, const struct perr *e)
{
    const cJSON *v;
    long long n;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "max_tokens")) && !cJSON_IsNull(v)) {
        if (get_int(v, 1, 1 << 24, &n))
            return bad(e, "max_tokens", num_code(v), "'max_tokens' must be an integer in 1..16777216");
        p->max_tokens = (int)n;
    }
    /* the newer field wins when both are given, as in OpenAI's API and vLLM */
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "max_completion_tokens")) && !cJSON_IsNull(v)) {
        if (get_int(v, 1, 1 << 24, &n))
            return bad(e, "max_completion_tokens", num_code(v),
                       "'max_completion_tokens' must be an integer in 1..16777216");
        p->max_tokens = (int)n;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "temperature")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= 2))
            return bad(e, "temperature", num_code(v), "'temperature' must be a number in [0, 2]");
        p->temperature = (float)v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "top_p")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0 && v->valuedouble <= 1))
            return bad(e, "top_p", num_code(v), "'top_p' must be a number in (0, 1]");
        p->top_p = (float)v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "top_k")) && !cJSON_IsNull(v)) {
        if (get_int(v, 0, 1 << 24, &n))
            return bad(e, "top_k", num_code(v), "'top_k' must be a non-negative integer");
        p->top_k = (int)n;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "seed")) && !cJSON_IsNull(v)) {
        if (get_int(v, -9007199254740991.0, 9007199254740991.0, &n))
            return bad(e, "seed", num_code(v), "'seed' must be an integer");
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
            return bad(e, "stream", E_TYPE, "'stream' must be a boolean");
        p->stream = cJSON_IsTrue(v);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "ignore_eos")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsBool(v))
            return bad(e, "ignore_eos", E_TYPE, "'ignore_eos' must be a boolean");
        p->ignore_eos = cJSON_IsTrue(v);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "stream_options")) && !cJSON_IsNull(v)) {
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(v, "include_usage");
        if (!cJSON_IsObject(v) || (u && !cJSON_IsBool(u)))
            return bad(e, "stream_options", E_TYPE,
                       "'stream_options' must be an object with a boolean 'include_usage'");
        p->include_usage = cJSON_IsTrue(u);
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
    if (p->chat) { /* logprobs: bool, top_logprobs: 0..20 */
        if (v && !cJSON_IsNull(v) && !cJSON_IsBool(v))
            return bad(e, "logprobs", E_TYPE, "'logprobs' must be a boolean");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "top_logprobs");
        n = 0;
        if (t && !cJSON_IsNull(t) && get_int(t, 0, SERVE_MAX_LOGPROBS, &n))
            return bad(e, "top_logprobs", num_code(t), "'top_logprobs' must be an integer in 0..%d",
                       SERVE_MAX_LOGPROBS);
        if (t && !cJSON_IsNull(t) && !cJSON_IsTrue(v))
            return bad(e, "top_logprobs", E_VALUE, "'top_logprobs' needs 'logprobs': true");
        p->logprobs = cJSON_IsTrue(v) ? (int)n : -1;
    } else if (v && !cJSON_IsNull(v)) { /* logprobs: 0..5 in OpenAI, up to 20 here */
        if (get_int(v, 0, SERVE_MAX_LOGPROBS, &n))
            return bad(e, "logprobs", num_code(v), "'logprobs' must be an integer in 0..%d", SERVE_MAX_LOGPROBS);
        p->logprobs = (int)n;
    }
    return 0;
}

/* logit_bias: {"token id": bias in [-100, 100], ...}, as OpenAI takes it;
 * the ids are checked against the vocabulary by serve_req_create. */
static int parse_bias(const cJSON *root, struct serve_params *p, const struct perr *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "logit_bias"), *x;
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsObject(v))
        return bad(e, "logit_bias", E_TYPE, "'logit_bias' must be an object of token id -> bias");
    const int n = cJSON_GetArraySize(v);
    if (n > SERVE_MAX_BIAS)
        return bad(e, "logit_bias", E_VALUE, "'logit_bias' takes at most %d tokens", SERVE_MAX_BIAS);
    if (n == 0)
        return 0;
    p->bias_ids = malloc((size_t)n * sizeof *p->bias_ids);
    p->bias = malloc((size_t)n * sizeof *p->bias);
    if (!p->bias_ids || !p->bias)
        return oom(e, "logit_bias");
    cJSON_ArrayForEach(x, v)
    {
        char *end;
        const char *k = x->string;
        long id = k[0] >= '0' && k[0] <= '9' ? strtol(k, &end, 10) : -1;
        if (id < 0 || *end || id > 2147483647L)
            return bad(e, "logit_bias", E_VALUE, "'logit_bias' keys must be token ids; '%.40s' is not", k);
        if (!cJSON_IsNumber(x) || !(x->valuedouble >= -100 && x->valuedouble <= 100))
            return bad(e, "logit_bias", num_code(x), "'logit_bias' values must be numbers in [-100, 100]");
        p->bias_ids[p->n_bias] = (int32_t)id;
        p->bias[p->n_bias++] = (float)x->valuedouble;
    }
    return 0;
}

/* A number field whose only value here leaves the answer as it is. */
static int neutral_number(const cJSON *root, const char *name, double neutral, const char *what,
                          const struct perr *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsNumber(v))
        return bad(e, name, E_TYPE, "'%s' must be a number", name);
    if (v->valuedouble != neutral)
        return bad(e, name, E_UNSUPPORTED, "kvq serve does not implement '%s' (%s): it must be %g or absent", name,
                   what, neutral);
    return 0;
}

/* Known OpenAI (and vLLM) fields that would change the answer: accepted
 * where their value leaves it unchanged, else refused with 400 naming the
 * field, so that no client takes an answer for the one it asked for. */
static int parse_refused(const cJSON *root, const struct perr *e)
{
    const cJSON *v;
    long long n;
    int rc;
    const char *one[] = {"n", "best_of"};
    for (int i = 0; i < 2; i++)
        if ((v = cJSON_GetObjectItemCaseSensitive(root, one[i])) && !cJSON_IsNull(v) && get_int(v, 1, 1, &n))
            return bad(e, one[i], get_int(v, 2, 1e9, &n) ? num_code(v) : E_UNSUPPORTED,
                       "kvq serve returns one choice per request: '%s' must be 1", one[i]);
    if ((rc = neutral_number(root, "presence_penalty", 0, "a penalty on tokens already present", e)) ||
        (rc = neutral_number(root, "frequency_penalty", 0, "a penalty by token frequency", e)) ||
        (rc = neutral_number(root, "repetition_penalty", 1, "vLLM's repetition penalty", e)) ||
        (rc = neutral_number(root, "min_p", 0, "a probability floor", e)))
        return rc;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "echo")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsBool(v))
            return bad(e, "echo", E_TYPE, "'echo' must be a boolean");
        if (cJSON_IsTrue(v))
            return bad(e, "echo", E_UNSUPPORTED, "kvq serve does not implement 'echo' (the prompt in the answer)");
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "response_format")) && !cJSON_IsNull(v)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
        if (!cJSON_IsObject(v) || !cJSON_IsString(t))
            return bad(e, "response_format", E_TYPE, "'response_format' must be an object with a string 'type'");
        if (strcmp(t->valuestring, "text") != 0) /* plain text is what every answer is */
            return bad(e, "response_format", E_UNSUPPORTED,
                       "kvq serve does not implement 'response_format' '%.40s' (constrained output): only 'text'",
                       t->valuestring);
    }
    const char *lists[] = {"tools", "functions"};
    for (int i = 0; i < 2; i++)
        if ((v = cJSON_GetObjectItemCaseSensitive(root, lists[i])) && !cJSON_IsNull(v)) {
            if (!cJSON_IsArray(v))
                return bad(e, lists[i], E_TYPE, "'%s' must be an array", lists[i]);
            if (v->child)
                return bad(e, lists[i], E_UNSUPPORTED, "kvq serve does not implement '%s' (tool calls)", lists[i]);
        }
    /* with no tools, "none" and "auto" both mean an answer without tool calls */
    const char *choices[] = {"tool_choice", "function_call"};
    for (int i = 0; i < 2; i++)
        if ((v = cJSON_GetObjectItemCaseSensitive(root, choices[i])) && !cJSON_IsNull(v) &&
            !(cJSON_IsString(v) && (strcmp(v->valuestring, "none") == 0 || strcmp(v->valuestring, "auto") == 0)))
            return bad(e, choices[i], E_UNSUPPORTED,
                       "kvq serve does not implement tool calls: '%s' may only be \"none\" or \"auto\"", choices[i]);
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "suffix")) && !cJSON_IsNull(v) &&
        !(cJSON_IsString(v) && !v->valuestring[0]))
        return bad(e, "suffix", E_UNSUPPORTED, "kvq serve does not implement 'suffix' (insertion)");
    return 0;
}

int serve_params_parse(const char *body, size_t len, int chat, struct serve_params *p, char *err, size_t cap,
                       char *param, size_t param_cap)
{
    const char *code = NULL;
    const struct perr e = {err, param, cap, param_cap, &code};
    memset(p, 0, sizeof *p);
    p->chat = chat;
    p->max_tokens = -1;
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->logprobs = -1;
    if (param_cap)
        param[0] = 0;
    cJSON *root = body && len ? cJSON_ParseWithLength(body, len) : NULL;
    if (!root) {
        bad(&e, "", E_JSON, "the request body is not valid JSON");
        p->code = code;
        return 400;
    }
    int rc = 0;
    if (!cJSON_IsObject(root)) {
        rc = bad(&e, "", E_JSON, "the request body must be a JSON object");
        goto out;
    }
    serve_json_lengths(body, len, root);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v)) {
            rc = bad(&e, "model", E_TYPE, "'model' must be a string");
            goto out;
        }
        if (!(p->model = dup_str(v->valuestring))) {
            rc = oom(&e, "model");
            goto out;
        }
    }
    if (chat)
        rc = parse_messages(root, p, &e);
    else if (!(v = cJSON_GetObjectItemCaseSensitive(root, "prompt")))
        rc = bad(&e, "prompt", E_MISSING, "'prompt' is required");
    else
        rc = parse_prompt(v, p, &e);
    if (!rc)
        rc = parse_sampling(root, p, &e);
    if (!rc)
        rc = parse_refused(root, &e);
    if (!rc)
        rc = parse_bias(root, p, &e);
    if (!rc)
        rc = parse_stop(cJSON_GetObjectItemCaseSensitive(root, "stop"), p, &e);
    if (!rc)
        rc = parse_stream_logprobs(root, p, &e);
    if (!rc)
        rc = parse_kvq(cJSON_GetObjectItemCaseSensitive(root, "kvq"), p, &e);
out:
    cJSON_Delete(root);
    if (rc) {
        serve_params_free(p);
        p->code = code;
    }
    return rc;
}

void serve_params_free(struct serve_params *p)
{
    if (!p)
        return;
    free(p->model);
    free(p->prompt);
    free(p->prompt_ids);
    free(p->bias_ids);
    free(p->bias);
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
