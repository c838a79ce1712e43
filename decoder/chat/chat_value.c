/* chat_value.c - the arena, dictionaries, and how values print: str() and
 * repr() as Python writes them (what Jinja prints), and json.dumps as
 * transformers' tojson filter calls it. */
#include "chat_value.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ch_chunk {
    ch_chunk *next;
    size_t used, cap;
    max_align_t data[];
};

void *ch_alloc(ch_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    ch_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 60000 ? n : 60000;
        c = a->total + cap <= CH_ARENA_CAP ? malloc(sizeof *c + cap) : NULL;
        if (!c) {
            a->failed = 1;
            return NULL;
        }
        a->total += cap;
        c->cap = cap;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

char *ch_strdup(ch_arena *a, const char *s, size_t n)
{
    char *d = ch_alloc(a, n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

void ch_arena_free(ch_arena *a)
{
    for (ch_chunk *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    a->head = NULL;
}

ch_val ch_str(const char *s, size_t n)
{
    ch_val v = {V_STR, {0}};
    v.u.s.s = s;
    v.u.s.n = n;
    return v;
}

ch_val *ch_dict_get(const ch_dict *d, const char *k, size_t kn)
{
    for (size_t i = 0; d && i < d->n; i++)
        if (d->k[i].u.s.n == kn && memcmp(d->k[i].u.s.s, k, kn) == 0)
            return &d->v[i];
    return NULL;
}

int ch_dict_set(ch_arena *a, ch_dict *d, const char *k, size_t kn, ch_val v)
{
    ch_val *old = ch_dict_get(d, k, kn);
    if (old) {
        *old = v;
        return 1;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 8;
        ch_val *nk = ch_alloc(a, cap * sizeof *nk), *nv = ch_alloc(a, cap * sizeof *nv);
        if (!nk || !nv)
            return 0;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = ch_str(k, kn);
    d->v[d->n++] = v;
    return 1;
}

/* ---- output buffer ---- */

int sb_put(ch_sb *b, const char *s, size_t n)
{
    if (b->failed || b->n + n > CH_SB_CAP) { /* a hostile template's text: stop growing */
        b->failed = 1;
        return 0;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->failed = 1;
            return 0;
        }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
    return 1;
}

int sb_puts(ch_sb *b, const char *s)
{
    return sb_put(b, s, strlen(s));
}

/* Python's repr of a float: the shortest digits that read back the same,
 * positional for exponents in [-4, 16), else d.ddde+XX. */
static void put_float(ch_sb *b, double f)
{
    char buf[64];
    if (isnan(f)) {
        sb_puts(b, "nan");
        return;
    }
    if (isinf(f)) {
        sb_puts(b, f > 0 ? "inf" : "-inf");
        return;
    }
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f)
            break;
    }
    snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
    int exp = atoi(strchr(buf, 'e') + 1);
    if (exp < -4 || exp >= 16) {
        char *e = strchr(buf, 'e');
        char mant[40];
        snprintf(mant, sizeof mant, "%.*s", (int)(e - buf), buf);
        snprintf(buf, sizeof buf, "%se%c%02d", mant, exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else {
        int dec = prec - 1 - exp;
        snprintf(buf, sizeof buf, "%.*f", dec > 0 ? dec : 0, f);
        if (!strchr(buf, '.'))
            strcat(buf, ".0");
    }
    sb_puts(b, buf);
}

static void put_int(ch_sb *b, int64_t i)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)i);
    sb_puts(b, buf);
}

/* Python's repr of a str: single quotes unless the text has ' and no ". */
static void put_repr_str(ch_sb *b, const char *s, size_t n)
{
    int sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    sb_put(b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char buf[8];
        if (c == '\\')
            sb_puts(b, "\\\\");
        else if (c == (unsigned char)q)
            sb_puts(b, q == '\'' ? "\\'" : "\\\"");
        else if (c == '\n')
            sb_puts(b, "\\n");
        else if (c == '\r')
            sb_puts(b, "\\r");
        else if (c == '\t')
            sb_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f) {
            snprintf(buf, sizeof buf, "\\x%02x", c);
            sb_puts(b, buf);
        } else
            sb_put(b, (const char *)&c, 1);
    }
    sb_put(b, &q, 1);
}

void ch_put_repr(ch_sb *b, ch_val v)
{
    if (v.t == V_STR) {
        put_repr_str(b, v.u.s.s, v.u.s.n);
    } else if (v.t == V_LIST) {
        sb_puts(b, v.u.l->tuple ? "(" : "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                sb_puts(b, ", ");
            ch_put_repr(b, v.u.l->v[i]);
        }
        sb_puts(b, v.u.l->tuple ? (v.u.l->n == 1 ? ",)" : ")") : "]");
    } else if (v.t == V_DICT) {
        sb_puts(b, v.u.d->is_ns ? "<Namespace {" : "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i)
                sb_puts(b, ", ");
            ch_put_repr(b, v.u.d->k[i]);
            sb_puts(b, ": ");
            ch_put_repr(b, v.u.d->v[i]);
        }
        sb_puts(b, v.u.d->is_ns ? "}>" : "}");
    } else {
        ch_put_str(b, v);
    }
}

void ch_put_str(ch_sb *b, ch_val v)
{
    switch (v.t) {
    case V_UNDEF:
        break;
    case V_NONE:
        sb_puts(b, "None");
        break;
    case V_BOOL:
        sb_puts(b, v.u.b ? "True" : "False");
        break;
    case V_INT:
        put_int(b, v.u.i);
        break;
    case V_FLOAT:
        put_float(b, v.u.f);
        break;
    case V_STR:
        sb_put(b, v.u.s.s, v.u.s.n);
        break;
    case V_FUNC:
        sb_puts(b, "<function>");
        break;
    default:
        ch_put_repr(b, v);
    }
}

static void put_json_str(ch_sb *b, const char *s, size_t n, int ascii)
{
    sb_puts(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char buf[16];
        switch (c) {
        case '"': sb_puts(b, "\\\""); break;
        case '\\': sb_puts(b, "\\\\"); break;
        case '\n': sb_puts(b, "\\n"); break;
        case '\r': sb_puts(b, "\\r"); break;
        case '\t': sb_puts(b, "\\t"); break;
        case '\b': sb_puts(b, "\\b"); break;
        case '\f': sb_puts(b, "\\f"); break;
        default:
            if (c < 0x20 || c == 0x7f) {
                snprintf(buf, sizeof buf, "\\u%04x", c);
                sb_puts(b, buf);
            } else if (c >= 0x80 && ascii) {
                /* \uXXXX, surrogate pairs above the BMP (json.dumps ensure_ascii). */
                uint32_t cp;
                size_t k = c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
                cp = c & (k == 1 ? 0x1F : k == 2 ? 0x0F : 0x07);
                for (size_t j = 1; j <= k && i + j < n; j++)
                    cp = (cp << 6) | ((unsigned char)s[i + j] & 0x3F);
                i += k;
                if (cp >= 0x10000) {
                    cp -= 0x10000;
                    snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
                } else {
                    snprintf(buf, sizeof buf, "\\u%04x", cp);
                }
                sb_puts(b, buf);
            } else {
                sb_put(b, (const char *)&c, 1);
            }
        }
    }
    sb_puts(b, "\"");
}

static void newline_indent(ch_sb *b, const ch_json_opts *o, int depth)
{
    sb_puts(b, "\n");
    for (int i = 0; i < depth * o->indent; i++)
        sb_puts(b, " ");
}

static int key_cmp(const void *x, const void *y, const ch_dict *d)
{
    const ch_val *a = &d->k[*(const size_t *)x], *c = &d->k[*(const size_t *)y];
    size_t n = a->u.s.n < c->u.s.n ? a->u.s.n : c->u.s.n;
    int r = memcmp(a->u.s.s, c->u.s.s, n);
    return r ? r : (a->u.s.n > c->u.s.n) - (a->u.s.n < c->u.s.n);
}

int ch_put_json(ch_sb *b, ch_val v, const ch_json_opts *o, int depth)
{
    const char *item_sep = o->item_sep ? o->item_sep : (o->indent >= 0 ? "," : ", ");
    const char *key_sep = o->key_sep ? o->key_sep : ": ";
    switch (v.t) {
    case V_UNDEF:
    case V_FUNC:
        return 0; /* not JSON serializable */
    case V_NONE:
        sb_puts(b, "null");
        break;
    case V_BOOL:
        sb_puts(b, v.u.b ? "true" : "false");
        break;
    case V_INT:
        put_int(b, v.u.i);
        break;
    case V_FLOAT:
        if (isnan(v.u.f))
            sb_puts(b, "NaN");
        else if (isinf(v.u.f))
            sb_puts(b, v.u.f > 0 ? "Infinity" : "-Infinity");
        else
            put_float(b, v.u.f);
        break;
    case V_STR:
        put_json_str(b, v.u.s.s, v.u.s.n, o->ascii);
        break;
    case V_LIST:
        if (!v.u.l->n) {
            sb_puts(b, "[]");
            break;
        }
        sb_puts(b, "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                sb_puts(b, item_sep);
            if (o->indent >= 0)
                newline_indent(b, o, depth + 1);
            if (!ch_put_json(b, v.u.l->v[i], o, depth + 1))
                return 0;
        }
        if (o->indent >= 0)
            newline_indent(b, o, depth);
        sb_puts(b, "]");
        break;
    case V_DICT: {
        const ch_dict *d = v.u.d;
        if (!d->n) {
            sb_puts(b, "{}");
            break;
        }
        size_t *order = malloc(d->n * sizeof *order);
        if (!order) {
            b->failed = 1;
            return 0;
        }
        for (size_t i = 0; i < d->n; i++)
            order[i] = i;
        if (o->sort_keys) /* insertion sort: dicts in templates are small */
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i; j > 0 && key_cmp(&order[j - 1], &order[j], d) > 0; j--) {
                    size_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
        sb_puts(b, "{");
        int ok = 1;
        for (size_t i = 0; ok && i < d->n; i++) {
            if (i)
                sb_puts(b, item_sep);
            if (o->indent >= 0)
                newline_indent(b, o, depth + 1);
            put_json_str(b, d->k[order[i]].u.s.s, d->k[order[i]].u.s.n, o->ascii);
            sb_puts(b, key_sep);
            ok = ch_put_json(b, d->v[order[i]], o, depth + 1);
        }
        free(order);
        if (!ok)
            return 0;
        if (o->indent >= 0)
            newline_indent(b, o, depth);
        sb_puts(b, "}");
        break;
    }
    }
    return 1;
}
