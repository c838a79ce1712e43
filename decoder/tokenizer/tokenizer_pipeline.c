/* tokenizer_pipeline.c - reading the normalizer, pre-tokenizer and decoder
 * sections of tokenizer.json into the fixed forms tokenizer_internal.h
 * describes; components kvq does not reproduce exactly are refused here.
 */
#include "tokenizer_internal.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- normalizer, pre-tokenizer, decoder ----------------------------------- */

static kvq_status string_pattern(tok_loader *L, const cJSON *step, const char *where, const char **out)
{
    const cJSON *pat = tok_field(step, "pattern");
    if (!cJSON_IsObject(pat))
        return kvq_error_set(L->err, KVQ_ERR_FORMAT, "tokenizer.json: %s.pattern is missing", where);
    if (!tok_field(pat, "String"))
        return kvq_error_set(L->err, KVQ_ERR_UNSUPPORTED,
                             "tokenizer.json: %s uses a regex pattern; only string patterns are supported",
                             where);
    kvq_status st = tok_get_str(L, pat, where, "String", out);
    if (!st && !**out)
        st = kvq_error_set(L->err, KVQ_ERR_FORMAT, "tokenizer.json: %s has an empty pattern", where);
    return st;
}

/* Flattens a component that is either one step or a Sequence of steps. */
static kvq_status flatten(tok_loader *L, const cJSON *c, const char *what, const char *list_key,
                          const cJSON **steps, int *n)
{
    *n = 0;
    if (!c)
        return KVQ_OK;
    if (!cJSON_IsObject(c))
        return kvq_error_set(L->err, KVQ_ERR_FORMAT, "tokenizer.json: %s is not an object", what);
    const char *type;
    kvq_status st = tok_get_str(L, c, what, "type", &type);
    if (st)
        return st;
    if (type && strcmp(type, "Sequence") == 0) {
        const cJSON *list = tok_field(c, list_key);
        if (!cJSON_IsArray(list))
            return kvq_error_set(L->err, KVQ_ERR_FORMAT, "tokenizer.json: %s.%s is not an array",
                                 what, list_key);
        for (const cJSON *e = list->child; e; e = e->next) {
            if (*n == TOK_MAX_STEPS)
                return tok_unsupported(L, what, "Sequence longer than 16 steps");
            if (!cJSON_IsObject(e))
                return kvq_error_set(L->err, KVQ_ERR_FORMAT, "tokenizer.json: %s step is not an object", what);
            steps[(*n)++] = e;
        }
    } else {
        steps[(*n)++] = c;
    }
    return KVQ_OK;
}

kvq_status tok_load_normalizer(tok_loader *L, const cJSON *root)
{
    kvq_tokenizer *t = L->t;
    const cJSON *steps[TOK_MAX_STEPS];
    int n;
    kvq_status st = flatten(L, tok_field(root, "normalizer"), "normalizer", "normalizers", steps, &n);
    for (int i = 0; !st && i < n; i++) {
        const char *type, *a = NULL, *b = NULL;
        if ((st = tok_get_str(L, steps[i], "normalizer", "type", &type)))
            break;
        tok_norm *nm = &t->norm[t->n_norm];
        if (type && strcmp(type, "Replace") == 0) {
            if ((st = string_pattern(L, steps[i], "normalizer Replace", &a)) ||
                (st = tok_get_str(L, steps[i], "normalizer Replace", "content", &b)))
                break;
            nm->kind = TOK_NORM_REPLACE;
            if ((st = tok_take_str(L, a, &nm->pattern)) || (st = tok_take_str(L, b ? b : "", &nm->content)))
                break;
        } else if (type && strcmp(type, "Prepend") == 0) {
            if ((st = tok_get_str(L, steps[i], "normalizer Prepend", "prepend", &b)))
                break;
            nm->kind = TOK_NORM_PREPEND;
            if ((st = tok_take_str(L, "", &nm->pattern)) || (st = tok_take_str(L, b ? b : "", &nm->content)))
                break;
        } else {
            st = tok_unsupported(L, "normalizer", type);
            break;
        }
        t->n_norm++;
    }
    return st;
}

kvq_status tok_load_pre_tokenizer(tok_loader *L, const cJSON *root)
{
    kvq_tokenizer *t = L->t;
    const cJSON *steps[TOK_MAX_STEPS];
    int n;
    kvq_status st = flatten(L, tok_field(root, "pre_tokenizer"), "pre_tokenizer", "pretokenizers", steps, &n);
    for (int i = 0; !st && i < n; i++) {
        const char *type;
        if ((st = tok_get_str(L, steps[i], "pre_tokenizer", "type", &type)))
            break;
        tok_pre *p = &t->pre[t->n_pre];
        if (type && strcmp(type, "Metaspace") == 0) {
            const char *scheme;
            int add_prefix;
            p->kind = TOK_PRE_METASPACE;
            if ((st = tok_get_char(L, steps[i], "pre_tokenizer Metaspace", "replacement", "\xe2\x96\x81",
                               p->repl, &p->repl_len)) ||
                (st = tok_get_bool(L, steps[i], "pre_tokenizer Metaspace", "split", 1, &p->split)) ||
                (st = tok_get_bool(L, steps[i], "pre_tokenizer Metaspace", "add_prefix_space", 1, &add_prefix)) ||
                (st = tok_get_str(L, steps[i], "pre_tokenizer Metaspace", "prepend_scheme", &scheme)))
                break;
            /* Older files only have add_prefix_space, which meant "always". */
            if (!scheme)
                p->prepend = add_prefix ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
            else if (strcmp(scheme, "always") == 0)
                p->prepend = TOK_PREPEND_ALWAYS;
            else if (strcmp(scheme, "first") == 0)
                p->prepend = TOK_PREPEND_FIRST;
            else if (strcmp(scheme, "never") == 0)
                p->prepend = TOK_PREPEND_NEVER;
            else {
                st = kvq_error_set(L->err, KVQ_ERR_FORMAT,
                                   "tokenizer.json: Metaspace prepend_scheme '%.20s' is unknown", scheme);
                break;
            }
        } else if (type && strcmp(type, "Digits") == 0) {
            p->kind = TOK_PRE_DIGITS;
            if ((st = tok_get_bool(L, steps[i], "pre_tokenizer Digits", "individual_digits", 0, &p->individual)))
                break;
        } else {
            st = tok_unsupported(L, "pre_tokenizer", type);
            break;
        }
        t->n_pre++;
    }
    return st;
}

/* @return a malloc'ed copy of s with every pattern replaced by content. */
static char *replace_all(const char *s, size_t n, const tok_str *pat, const tok_str *content,
                         size_t *out_len)
{
    size_t count = 0;
    for (size_t i = 0; i + pat->n <= n;) {
        if (memcmp(s + i, pat->s, pat->n) == 0) {
            count++;
            i += pat->n;
        } else {
            i++;
        }
    }
    size_t len = n - count * pat->n + count * content->n;
    char *o = malloc(len + 1), *w = o;
    if (!o)
        return NULL;
    for (size_t i = 0; i < n;) {
        if (i + pat->n <= n && memcmp(s + i, pat->s, pat->n) == 0) {
            memcpy(w, content->s, content->n);
            w += content->n;
            i += pat->n;
        } else {
            *w++ = s[i++];
        }
    }
    *w = 0;
    *out_len = len;
    return o;
}

kvq_status tok_load_decoder(tok_loader *L, const cJSON *root)
{
    kvq_tokenizer *t = L->t;
    const cJSON *dec = tok_field(root, "decoder");
    if (!dec)
        return kvq_error_set(L->err, KVQ_ERR_UNSUPPORTED,
                             "tokenizer.json: a tokenizer without a decoder is not supported");
    const cJSON *steps[TOK_MAX_STEPS];
    int n;
    kvq_status st = flatten(L, dec, "decoder", "decoders", steps, &n);
    tok_str pats[TOK_MAX_STEPS], conts[TOK_MAX_STEPS];
    int n_rep = 0;
    /* Stages must come in the Llama order: Replace*, ByteFallback, Fuse, Strip. */
    int stage = 0;
    for (int i = 0; !st && i < n; i++) {
        const char *type;
        if ((st = tok_get_str(L, steps[i], "decoder", "type", &type)))
            break;
        if (type && strcmp(type, "Replace") == 0 && stage == 0) {
            const char *a, *b;
            if ((st = string_pattern(L, steps[i], "decoder Replace", &a)) ||
                (st = tok_get_str(L, steps[i], "decoder Replace", "content", &b)))
                break;
            pats[n_rep].s = (char *)a;
            pats[n_rep].n = strlen(a);
            conts[n_rep].s = (char *)(b ? b : "");
            conts[n_rep].n = strlen(conts[n_rep].s);
            n_rep++;
        } else if (type && strcmp(type, "ByteFallback") == 0 && stage == 0) {
            t->dec_byte_fallback = 1;
            stage = 1;
        } else if (type && strcmp(type, "Fuse") == 0 && stage <= 1) {
            stage = 2;
        } else if (type && strcmp(type, "Strip") == 0 && stage == 2) {
            long start, stop;
            if ((st = tok_get_char(L, steps[i], "decoder Strip", "content", " ", t->strip_char,
                               &t->strip_char_len)))
                break;
            if (!tok_as_int(tok_field(steps[i], "start"), 0, 1 << 20, &start) ||
                !tok_as_int(tok_field(steps[i], "stop"), 0, 1 << 20, &stop)) {
                st = kvq_error_set(L->err, KVQ_ERR_FORMAT, "tokenizer.json: decoder Strip needs start and stop");
                break;
            }
            if (stop != 0) {
                st = kvq_error_set(L->err, KVQ_ERR_UNSUPPORTED,
                                   "tokenizer.json: decoder Strip with stop > 0 is not supported");
                break;
            }
            t->strip_start = (int)start;
            stage = 3;
        } else {
            char what[96];
            snprintf(what, sizeof what, "decoder step %d (expected Replace*, ByteFallback, Fuse, Strip)", i);
            st = tok_unsupported(L, what, type);
        }
    }
    if (st)
        return st;

    /* Fold the Replace steps into each id's text once, here. */
    for (int32_t id = 0; id < t->vocab_size; id++) {
        if (!(t->flags[id] & TOK_F_PRESENT))
            continue;
        size_t len = t->piece_len[id];
        char *cur = malloc(len + 1);
        if (!cur)
            return kvq_error_set(L->err, KVQ_ERR_NOMEM, "out of memory");
        memcpy(cur, t->arena + t->piece_off[id], len + 1);
        for (int r = 0; r < n_rep; r++) {
            char *next = replace_all(cur, len, &pats[r], &conts[r], &len);
            free(cur);
            if (!(cur = next))
                return kvq_error_set(L->err, KVQ_ERR_NOMEM, "out of memory");
        }
        st = tok_arena_add(L, cur, len, &t->dec_off[id]);
        free(cur);
        if (st)
            return st;
        t->dec_len[id] = (uint32_t)len;
        if (len > t->max_dec_len)
            t->max_dec_len = len;
        if (t->dec_byte_fallback)
            t->dec_byte[id] = (int16_t)tok_parse_byte_token(t->arena + t->dec_off[id], len);
    }
    return KVQ_OK;
}
