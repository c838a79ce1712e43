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

/* A {"Regex": ...} pattern, compiled into *re; 0 when the pattern is a String. */
static kvq_status regex_pattern(tok_loader *L, const cJSON *step, const char *where, void **re)
{
    const cJSON *pat = tok_field(step, "pattern");
    *re = NULL;
    const char *src;
    kvq_status st;
    if (!cJSON_IsObject(pat) || !tok_field(pat, "Regex"))
        return KVQ_OK;
    if ((st = tok_get_str(L, pat, where, "Regex", &src)))
        return st;
    if (!(*re = tok_regex_compile(src, strlen(src), L->err, where)))
        return KVQ_ERR_UNSUPPORTED;
    return KVQ_OK;
}

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
        static const struct {
            const char *name;
            enum tok_norm_kind kind;
        } simple[] = {{"NFC", TOK_NORM_NFC},       {"NFD", TOK_NORM_NFD},
                      {"NFKC", TOK_NORM_NFKC},     {"NFKD", TOK_NORM_NFKD},
                      {"Lowercase", TOK_NORM_LOWERCASE}, {"StripAccents", TOK_NORM_STRIP_ACCENTS}};
        int found = 0;
        for (size_t k = 0; type && k < sizeof simple / sizeof simple[0]; k++)
            if (strcmp(type, simple[k].name) == 0) {
                nm->kind = simple[k].kind;
                found = 1;
            }
        if (found) {
        } else if (type && strcmp(type, "Strip") == 0) {
            nm->kind = TOK_NORM_STRIP;
            if ((st = tok_get_bool(L, steps[i], "normalizer Strip", "strip_left", 1, &nm->strip_left)) ||
                (st = tok_get_bool(L, steps[i], "normalizer Strip", "strip_right", 1, &nm->strip_right)))
                break;
        } else if (type && strcmp(type, "Replace") == 0) {
            nm->kind = TOK_NORM_REPLACE;
            if ((st = regex_pattern(L, steps[i], "normalizer Replace", &nm->re)))
                break;
            if (!nm->re && (st = string_pattern(L, steps[i], "normalizer Replace", &a)))
                break;
            if ((st = tok_get_str(L, steps[i], "normalizer Replace", "content", &b)))
                break;
            if ((st = tok_take_str(L, nm->re ? "" : a, &nm->pattern)) ||
                (st = tok_take_str(L, b ? b : "", &nm->content)))
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

static kvq_status behavior(tok_loader *L, const cJSON *step, const char *where, enum tok_behavior def,
                           int required, enum tok_behavior *out)
{
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    const char *b;
    kvq_status st = tok_get_str(L, step, where, "behavior", &b);
    if (st)
        return st;
    *out = def;
    if (!b) {
        if (required)
            return kvq_error_set(L->err, KVQ_ERR_FORMAT, "tokenizer.json: %s.behavior is missing", where);
        return KVQ_OK;
    }
    for (int k = 0; k < 5; k++)
        if (strcmp(b, names[k]) == 0) {
            *out = (enum tok_behavior)k;
            return KVQ_OK;
        }
    return kvq_error_set(L->err, KVQ_ERR_UNSUPPORTED, "tokenizer.json: %s behavior '%.30s' is not supported",
                         where, b);
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
        } else if (type && strcmp(type, "Split") == 0) {
            const char *a;
            p->kind = TOK_PRE_SPLIT;
            if ((st = behavior(L, steps[i], "pre_tokenizer Split", TOK_B_ISOLATED, 1, &p->behavior)) ||
                (st = tok_get_bool(L, steps[i], "pre_tokenizer Split", "invert", 0, &p->invert)) ||
                (st = regex_pattern(L, steps[i], "pre_tokenizer Split", &p->re)))
                break;
            if (!p->re && ((st = string_pattern(L, steps[i], "pre_tokenizer Split", &a)) ||
                           (st = tok_take_str(L, a, &p->pattern))))
                break;
        } else if (type && strcmp(type, "ByteLevel") == 0) {
            int use_regex;
            p->kind = TOK_PRE_BYTELEVEL;
            if ((st = tok_get_bool(L, steps[i], "pre_tokenizer ByteLevel", "add_prefix_space", 1,
                                   &p->add_prefix_space)) ||
                (st = tok_get_bool(L, steps[i], "pre_tokenizer ByteLevel", "use_regex", 1, &use_regex)))
                break;
            static const char gpt2[] =
                "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
            if (use_regex && !(p->re = tok_regex_compile(gpt2, sizeof gpt2 - 1, L->err, "ByteLevel"))) {
                st = KVQ_ERR_UNSUPPORTED;
                break;
            }
        } else if (type && strcmp(type, "Punctuation") == 0) {
            p->kind = TOK_PRE_PUNCT;
            if ((st = behavior(L, steps[i], "pre_tokenizer Punctuation", TOK_B_ISOLATED, 0, &p->behavior)))
                break;
        } else if (type && strcmp(type, "Whitespace") == 0) {
            /* Rust regex \w: alphabetic, marks, decimal digits, connector punctuation, joiners. */
            static const char ws[] = "[\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]+|"
                                     "[^\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}\\s]+";
            p->kind = TOK_PRE_WHITESPACE;
            if (!(p->re = tok_regex_compile(ws, sizeof ws - 1, L->err, "Whitespace"))) {
                st = KVQ_ERR_UNSUPPORTED;
                break;
            }
        } else if (type && strcmp(type, "WhitespaceSplit") == 0) {
            p->kind = TOK_PRE_WSPLIT;
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

/* Per-token decoder steps, folded into each id's text at load. */
enum dec_step_kind { DEC_REPLACE, DEC_BYTELEVEL, DEC_METASPACE };
typedef struct dec_step {
    enum dec_step_kind kind;
    tok_str pat, content; /* Replace; Metaspace: pat = the replacement character */
} dec_step;

/* ByteLevel: each character back to the byte it stands for (others keep their UTF-8). */
static char *bytelevel_back(const char *s, size_t n, size_t *out_len)
{
    char *o = malloc(n + 1);
    if (!o)
        return NULL;
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t cl = tok_utf8_next(s + i, n - i, &cp);
        int b = tok_bytelevel_byte(cp);
        if (b >= 0) {
            o[w++] = (char)b;
        } else {
            memcpy(o + w, s + i, cl);
            w += cl;
        }
        i += cl;
    }
    o[w] = 0;
    *out_len = w;
    return o;
}

/* Runs the per-token steps over one token; first: it is the first token (Metaspace). */
static char *fold_token(const dec_step *steps, int n, const char *piece, size_t len, int first, size_t *out_len)
{
    char *cur = malloc(len + 1);
    if (!cur)
        return NULL;
    memcpy(cur, piece, len);
    cur[len] = 0;
    for (int r = 0; r < n; r++) {
        char *next;
        if (steps[r].kind == DEC_BYTELEVEL) {
            next = bytelevel_back(cur, len, &len);
        } else if (steps[r].kind == DEC_METASPACE && first) {
            tok_str none = {(char *)"", 0};
            next = replace_all(cur, len, &steps[r].pat, &none, &len);
        } else {
            next = replace_all(cur, len, &steps[r].pat, &steps[r].content, &len);
        }
        free(cur);
        if (!(cur = next))
            return NULL;
    }
    *out_len = len;
    return cur;
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
    dec_step per[TOK_MAX_STEPS];
    int n_per = 0, first_variant = 0;
    char mrepl[8];
    size_t mrepl_len = 0;
    /* Stages must come in this order: per-token steps (Replace, ByteLevel,
     * Metaspace), ByteFallback, Fuse, Strip. */
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
            per[n_per].kind = DEC_REPLACE;
            per[n_per].pat.s = (char *)a;
            per[n_per].pat.n = strlen(a);
            per[n_per].content.s = (char *)(b ? b : "");
            per[n_per].content.n = strlen(per[n_per].content.s);
            n_per++;
        } else if (type && strcmp(type, "ByteLevel") == 0 && stage == 0) {
            per[n_per].kind = DEC_BYTELEVEL;
            n_per++;
            t->dec_lossy = 1;
        } else if (type && strcmp(type, "Metaspace") == 0 && stage == 0) {
            const char *scheme;
            int add_prefix;
            if ((st = tok_get_char(L, steps[i], "decoder Metaspace", "replacement", "\xe2\x96\x81", mrepl,
                                   &mrepl_len)) ||
                (st = tok_get_bool(L, steps[i], "decoder Metaspace", "add_prefix_space", 1, &add_prefix)) ||
                (st = tok_get_str(L, steps[i], "decoder Metaspace", "prepend_scheme", &scheme)))
                break;
            int never = scheme ? strcmp(scheme, "never") == 0 : !add_prefix;
            per[n_per].kind = DEC_METASPACE;
            per[n_per].pat.s = mrepl;
            per[n_per].pat.n = mrepl_len;
            per[n_per].content.s = (char *)" ";
            per[n_per].content.n = 1;
            n_per++;
            first_variant |= !never;
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
            char what[128];
            snprintf(what, sizeof what,
                     "decoder step %d (expected Replace/ByteLevel/Metaspace*, ByteFallback, Fuse, Strip)", i);
            st = tok_unsupported(L, what, type);
        }
    }
    if (st)
        return st;
    if (first_variant) {
        t->dec_first_off = calloc((size_t)t->vocab_size, sizeof *t->dec_first_off);
        t->dec_first_len = calloc((size_t)t->vocab_size, sizeof *t->dec_first_len);
        if (!t->dec_first_off || !t->dec_first_len)
            return kvq_error_set(L->err, KVQ_ERR_NOMEM, "out of memory");
    }

    /* Fold the per-token steps into each id's text once, here. */
    for (int32_t id = 0; id < t->vocab_size; id++) {
        if (!(t->flags[id] & TOK_F_PRESENT))
            continue;
        for (int first = 0; first <= first_variant; first++) {
            size_t len;
            char *cur = fold_token(per, n_per, t->arena + t->piece_off[id], t->piece_len[id], first, &len);
            if (!cur)
                return kvq_error_set(L->err, KVQ_ERR_NOMEM, "out of memory");
            uint32_t off;
            st = tok_arena_add(L, cur, len, &off);
            free(cur);
            if (st)
                return st;
            if (first) {
                t->dec_first_off[id] = off;
                t->dec_first_len[id] = (uint32_t)len;
            } else {
                t->dec_off[id] = off;
                t->dec_len[id] = (uint32_t)len;
            }
            if (len > t->max_dec_len)
                t->max_dec_len = len;
        }
        if (t->dec_byte_fallback)
            t->dec_byte[id] = (int16_t)tok_parse_byte_token(t->arena + t->dec_off[id], t->dec_len[id]);
    }
    return KVQ_OK;
}

/* post_processor: TemplateProcessing's "single" template gives the ids put
 * around a sequence; ByteLevel only trims offsets (no ids). */
static kvq_status template_side(tok_loader *L, const cJSON *specials, const cJSON *item, int32_t **ids,
                                int *n)
{
    const cJSON *sp = tok_field(item, "SpecialToken");
    const char *name;
    kvq_status st = tok_get_str(L, sp, "post_processor SpecialToken", "id", &name);
    if (st)
        return st;
    const cJSON *entry = name ? tok_field(specials, name) : NULL;
    const cJSON *list = entry ? tok_field(entry, "ids") : NULL;
    if (!cJSON_IsArray(list))
        return kvq_error_set(L->err, KVQ_ERR_FORMAT,
                             "tokenizer.json: post_processor special token '%.40s' has no ids", name ? name : "");
    for (const cJSON *e = list->child; e; e = e->next) {
        long id;
        if (!tok_as_int(e, 0, L->t->vocab_size - 1, &id))
            return kvq_error_set(L->err, KVQ_ERR_FORMAT,
                                 "tokenizer.json: post_processor special token '%.40s' has an id outside the vocabulary",
                                 name);
        int32_t *v = realloc(*ids, (size_t)(*n + 1) * sizeof *v);
        if (!v)
            return kvq_error_set(L->err, KVQ_ERR_NOMEM, "out of memory");
        *ids = v;
        v[(*n)++] = (int32_t)id;
    }
    return KVQ_OK;
}

kvq_status tok_load_post_processor(tok_loader *L, const cJSON *root)
{
    kvq_tokenizer *t = L->t;
    const cJSON *steps[TOK_MAX_STEPS];
    int n;
    const cJSON *pp = tok_field(root, "post_processor");
    kvq_status st = flatten(L, pp, "post_processor", "processors", steps, &n);
    int templated = 0;
    for (int i = 0; !st && i < n; i++) {
        const char *type;
        if ((st = tok_get_str(L, steps[i], "post_processor", "type", &type)))
            break;
        if (type && strcmp(type, "ByteLevel") == 0)
            continue;
        if (!type || strcmp(type, "TemplateProcessing") != 0 || templated++) {
            st = tok_unsupported(L, "post_processor", type);
            break;
        }
        const cJSON *single = tok_field(steps[i], "single"), *specials = tok_field(steps[i], "special_tokens");
        if (!cJSON_IsArray(single))
            return kvq_error_set(L->err, KVQ_ERR_FORMAT, "tokenizer.json: post_processor.single is not an array");
        int seen_seq = 0;
        for (const cJSON *e = single->child; !st && e; e = e->next) {
            if (tok_field(e, "Sequence")) {
                if (seen_seq++)
                    return kvq_error_set(L->err, KVQ_ERR_FORMAT,
                                         "tokenizer.json: post_processor.single has two sequences");
            } else if (tok_field(e, "SpecialToken")) {
                st = seen_seq ? template_side(L, specials, e, &t->tpl_post, &t->n_tpl_post)
                              : template_side(L, specials, e, &t->tpl_pre, &t->n_tpl_pre);
            } else {
                st = kvq_error_set(L->err, KVQ_ERR_FORMAT,
                                   "tokenizer.json: post_processor.single has an item that is neither "
                                   "SpecialToken nor Sequence");
            }
        }
    }
    /* With a post-processor, it alone decides what "add special tokens"
     * adds (ByteLevel: nothing); without one, kvq adds the BOS it knows. */
    t->has_template = pp != NULL;
    return st;
}
