/* serve_tokenize.c - the bodies of llama-server's /tokenize and /detokenize
 * (serve_route.h), and the JSON text of their answers.
 *
 * Every byte of the text is kept, NUL included: cJSON decodes "\u0000" into a
 * NUL inside its NUL-terminated strings, so the content's length comes from
 * serve_json_lengths (serve_json.c, as for the completion endpoints' prompts).
 * The answers are written here rather than by cJSON for the same reason. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"
#include "serve_route.h"

#define MAX_IDS (1u << 24)

/* 1 when s[0..n) is UTF-8 (NUL included), as RFC 3629 defines it. */
static int utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i], need;
        unsigned cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            need = 1, cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2, cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3, cp = c & 0x07;
        } else {
            return 0;
        }
        if (n - i <= need)
            return 0;
        for (unsigned k = 1; k <= need; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((need == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (need == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        i += need + 1;
    }
    return 1;
}

struct terr {
    char *msg, *param;
    size_t cap, param_cap;
};

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int bad(const struct terr *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, e->cap, fmt, ap);
    va_end(ap);
    snprintf(e->param, e->param_cap, "%s", param);
    return 400;
}

/* An optional boolean field: absent or null leaves *out. */
static int get_bool(const cJSON *root, const char *name, int *out, const struct terr *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsBool(v))
        return bad(e, name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int parse_tokenize(const cJSON *root, struct serve_tok_params *p, const struct terr *e)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(root, "content");
    if (!c)
        return bad(e, "content", "'content' is required");
    if (!cJSON_IsString(c))
        return bad(e, "content", "'content' must be a string");
    int parse_special = 1;
    int rc = get_bool(root, "add_special", &p->add_special, e);
    if (!rc)
        rc = get_bool(root, "with_pieces", &p->with_pieces, e);
    if (!rc)
        rc = get_bool(root, "parse_special", &parse_special, e);
    if (rc)
        return rc;
    if (!parse_special) /* it would change the answer: refused rather than ignored */
        return bad(e, "parse_special", "'parse_special': false is not supported: special token text is always "
                                       "matched as the tokenizer's added tokens");
    const size_t n = serve_json_strlen(c);
    if (!(p->content = malloc(n + 1)))
        return bad(e, "content", "out of memory");
    memcpy(p->content, c->valuestring, n);
    p->content[n] = 0;
    p->content_len = n;
    if (!utf8_valid((const unsigned char *)p->content, n))
        return bad(e, "content", "'content' is not valid UTF-8");
    return 0;
}

static int parse_detokenize(const cJSON *root, int32_t vocab, struct serve_tok_params *p, const struct terr *e)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!t)
        return bad(e, "tokens", "'tokens' is required");
    if (!cJSON_IsArray(t))
        return bad(e, "tokens", "'tokens' must be an array of token ids");
    const int n = cJSON_GetArraySize(t);
    if ((unsigned)n > MAX_IDS)
        return bad(e, "tokens", "'tokens' has more than %u ids", MAX_IDS);
    if (n && !(p->ids = malloc((size_t)n * sizeof *p->ids)))
        return bad(e, "tokens", "out of memory");
    const cJSON *x;
    cJSON_ArrayForEach(x, t)
    {
        const double v = cJSON_IsNumber(x) ? x->valuedouble : NAN;
        if (!isfinite(v) || v != floor(v))
            return bad(e, "tokens", "'tokens'[%zu] is not an integer token id", p->n_ids);
        if (v < 0 || v >= (double)vocab)
            return bad(e, "tokens", "'tokens'[%zu] = %.0f is outside the vocabulary (ids 0..%d)", p->n_ids,
                       v < -1e15 ? -1e15 : v > 1e15 ? 1e15 : v, (int)vocab - 1);
        p->ids[p->n_ids++] = (int32_t)v;
    }
    return 0;
}

int serve_tok_parse(const char *body, size_t len, int detok, int32_t vocab, struct serve_tok_params *p, char *err,
                    size_t cap, char *param, size_t param_cap)
{
    const struct terr e = {err, param, cap, param_cap};
    memset(p, 0, sizeof *p);
    if (param_cap)
        param[0] = 0;
    if (!body || !len)
        return bad(&e, "", "the request body is not valid JSON");
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (root)
        serve_json_lengths(body, len, root);
    int rc;
    if (!root)
        rc = bad(&e, "", "the request body is not valid JSON");
    else if (!cJSON_IsObject(root))
        rc = bad(&e, "", "the request body must be a JSON object");
    else
        rc = detok ? parse_detokenize(root, vocab, p, &e) : parse_tokenize(root, p, &e);
    cJSON_Delete(root);
    if (rc)
        serve_tok_params_free(p);
    return rc;
}

void serve_tok_params_free(struct serve_tok_params *p)
{
    free(p->content);
    free(p->ids);
    memset(p, 0, sizeof *p);
}

/* ---- answers ------------------------------------------------------------- */

struct sbuf {
    char *s;
    size_t len, cap;
    int oom;
};

static void put(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *t = realloc(b->s, cap);
        if (!t) {
            b->oom = 1;
            return;
        }
        b->s = t;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

static void put_int(struct sbuf *b, long long v)
{
    char t[32];
    int k = snprintf(t, sizeof t, "%lld", v);
    put(b, t, (size_t)k);
}

/* A JSON string of s[0..n) (UTF-8): quotes, backslashes and control bytes,
 * NUL among them, escaped; every other byte as it is. */
static void put_string(struct sbuf *b, const char *s, size_t n)
{
    put(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        put(b, s + run, i - run);
        run = i + 1;
        if (c == '"' || c == '\\') {
            const char esc[2] = {'\\', (char)c};
            put(b, esc, 2);
        } else {
            char t[8];
            snprintf(t, sizeof t, "\\u%04x", c);
            put(b, t, 6);
        }
    }
    put(b, s + run, n - run);
    put(b, "\"", 1);
}

char *serve_tok_json(const int32_t *ids, size_t n, const char *const *pieces, const size_t *piece_len)
{
    struct sbuf b = {0};
    put(&b, "{\"tokens\":[", 11);
    for (size_t i = 0; i < n; i++) {
        if (i)
            put(&b, ",", 1);
        if (!pieces) {
            put_int(&b, ids[i]);
            continue;
        }
        put(&b, "{\"id\":", 6);
        put_int(&b, ids[i]);
        put(&b, ",\"piece\":", 9);
        const char *s = pieces[i] ? pieces[i] : "";
        const size_t len = pieces[i] ? piece_len[i] : 0;
        if (utf8_valid((const unsigned char *)s, len)) {
            put_string(&b, s, len);
        } else { /* part of a character spelled in bytes: its bytes, as llama-server gives them */
            put(&b, "[", 1);
            for (size_t k = 0; k < len; k++) {
                if (k)
                    put(&b, ",", 1);
                put_int(&b, (unsigned char)s[k]);
            }
            put(&b, "]", 1);
        }
        put(&b, "}", 1);
    }
    put(&b, "]}", 2);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

char *serve_detok_json(const char *text, size_t len)
{
    struct sbuf b = {0};
    put(&b, "{\"content\":", 11);
    put_string(&b, text ? text : "", text ? len : 0);
    put(&b, "}", 1);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

/* ---- the tokenizer ------------------------------------------------------- */

/* The byte of a byte-fallback token ("<0xE2>"), or -1. A piece of a
 * character spelled in bytes is that one byte, not the U+FFFD a lone
 * decode of it gives, so that a client can join the pieces. */
static int byte_token(const kvq_tokenizer *tok, int32_t id)
{
    const char *s;
    size_t n;
    unsigned v;
    char end;
    if (kvq_tokenizer_piece(tok, id, &s, &n) != KVQ_OK || n != 6 || strncmp(s, "<0x", 3) != 0 ||
        sscanf(s + 3, "%2x%c", &v, &end) != 2 || end != '>')
        return -1;
    return (int)v;
}

static char *tokenize(const kvq_tokenizer *tok, const struct serve_tok_params *p, int *status, char *err,
                      size_t cap)
{
    int32_t *ids = NULL;
    size_t n = 0;
    kvq_status st = kvq_tokenizer_encode_alloc(tok, p->content, p->content_len, p->add_special, &ids, &n);
    if (st != KVQ_OK) {
        *status = st == KVQ_ERR_NOMEM ? 503 : 400;
        snprintf(err, cap, "%s", st == KVQ_ERR_UNSUPPORTED ? "'content' has a character this tokenizer has no token for"
                                 : st == KVQ_ERR_NOMEM    ? "out of memory for the tokens"
                                                          : "'content' cannot be tokenized (not valid UTF-8)");
        return NULL;
    }
    char **pieces = p->with_pieces && n ? calloc(n, sizeof *pieces) : NULL;
    size_t *lens = pieces ? calloc(n, sizeof *lens) : NULL;
    char *json = NULL;
    if (p->with_pieces && n && (!pieces || !lens))
        goto out;
    for (size_t i = 0; pieces && i < n; i++) {
        const int b = byte_token(tok, ids[i]);
        if (b >= 0 && (pieces[i] = malloc(1))) {
            pieces[i][0] = (char)b;
            lens[i] = 1;
        } else if (b < 0 && kvq_tokenizer_decode_alloc(tok, &ids[i], 1, KVQ_DETOK_KEEP_LEADING_SPACE, &pieces[i],
                                                       &lens[i]) != KVQ_OK) {
            goto out;
        }
        if (!pieces[i])
            goto out;
    }
    json = serve_tok_json(ids, n, (const char *const *)pieces, lens);
out:
    for (size_t i = 0; pieces && i < n; i++)
        free(pieces[i]);
    free(pieces);
    free(lens);
    free(ids);
    if (!json) {
        *status = 503;
        snprintf(err, cap, "out of memory for the answer");
    }
    return json;
}

char *serve_tok_answer(const kvq_tokenizer *tok, int detok, const struct serve_tok_params *p, int *status,
                       char *err, size_t cap)
{
    if (!detok)
        return tokenize(tok, p, status, err, cap);
    if (!p->n_ids)
        return serve_detok_json("", 0);
    char *text = NULL;
    size_t len = 0;
    /* every token rendered, special ones too: as `kvq tokenize --decode` */
    kvq_status st = kvq_tokenizer_decode_alloc(tok, p->ids, p->n_ids, 0, &text, &len);
    if (st != KVQ_OK) {
        *status = st == KVQ_ERR_NOMEM ? 503 : 400;
        snprintf(err, cap, "%s", st == KVQ_ERR_NOMEM ? "out of memory for the text"
                                                     : "'tokens' has an id that no token of this model has");
        return NULL;
    }
    char *json = serve_detok_json(text, len);
    free(text);
    if (!json) {
        *status = 503;
        snprintf(err, cap, "out of memory for the answer");
    }
    return json;
}
