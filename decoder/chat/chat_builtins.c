/* chat_builtins.c - the filters, tests, string/dict methods and global
 * functions of kvq's Jinja subset (the list is in kvq_chat.h), each as
 * Jinja / Python defines it. An unknown one is an error naming it. */
#include "chat_eval.h"

#include <utf8proc.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_ARGS 8

typedef struct args {
    ch_val v[MAX_ARGS];
    const char *kw[MAX_ARGS];
    int n;
} args;

static ch_val undef(void)
{
    return (ch_val){V_UNDEF, {0}};
}

static ch_val mk_int(int64_t i)
{
    ch_val v = {V_INT, {0}};
    v.u.i = i;
    return v;
}

static ch_val mk_bool(int b)
{
    ch_val v = {V_BOOL, {0}};
    v.u.b = b != 0;
    return v;
}

static int eval_args(rctx *r, const ch_expr *e, args *a)
{
    if (e->nargs > MAX_ARGS) {
        ch_fail(r, KVQ_ERR_UNSUPPORTED, e->line, "more than %d arguments", MAX_ARGS);
        return 0;
    }
    a->n = e->nargs;
    for (int i = 0; i < e->nargs && !r->st; i++) {
        a->v[i] = ch_eval(r, e->args[i]);
        a->kw[i] = e->kw ? e->kw[i] : NULL;
    }
    return !r->st;
}

/* Positional argument pos, or keyword name; NULL when not given. */
static const ch_val *arg(const args *a, int pos, const char *name)
{
    int p = 0;
    for (int i = 0; i < a->n; i++) {
        if (a->kw[i]) {
            if (name && strcmp(a->kw[i], name) == 0)
                return &a->v[i];
        } else if (p++ == pos) {
            return &a->v[i];
        }
    }
    return NULL;
}

static int want_str(rctx *r, const ch_val *v, int line, const char *what)
{
    if (v && v->t == V_STR)
        return 1;
    ch_fail(r, KVQ_ERR_FORMAT, line, "%s expects a string, got %s", what, v ? ch_type_name(*v) : "nothing");
    return 0;
}

/* Python's str.isspace for one code point. */
static int py_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

static size_t next_cp(const char *s, size_t n, size_t i, uint32_t *cp)
{
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
    if (k <= 0) {
        *cp = (unsigned char)s[i];
        return 1;
    }
    *cp = (uint32_t)c;
    return (size_t)k;
}

static int in_chars(uint32_t cp, const ch_val *chars)
{
    if (!chars || chars->t != V_STR)
        return py_space(cp);
    for (size_t i = 0; i < chars->u.s.n;) {
        uint32_t c;
        i += next_cp(chars->u.s.s, chars->u.s.n, i, &c);
        if (c == cp)
            return 1;
    }
    return 0;
}

/* str.strip / lstrip / rstrip with optional chars. */
static ch_val strip(ch_val s, const ch_val *chars, int left, int right)
{
    size_t lo = 0, hi = s.u.s.n;
    while (left && lo < hi) {
        uint32_t cp;
        size_t k = next_cp(s.u.s.s, hi, lo, &cp);
        if (!in_chars(cp, chars))
            break;
        lo += k;
    }
    while (right && hi > lo) {
        size_t j = hi - 1;
        while (j > lo && ((unsigned char)s.u.s.s[j] & 0xC0) == 0x80)
            j--;
        uint32_t cp;
        next_cp(s.u.s.s, hi, j, &cp);
        if (!in_chars(cp, chars))
            break;
        hi = j;
    }
    return ch_str(s.u.s.s + lo, hi - lo);
}

enum { CASE_UPPER, CASE_LOWER, CASE_CAPITALIZE, CASE_TITLE };

static ch_val change_case(rctx *r, ch_val s, int mode)
{
    ch_sb b = {0};
    sb_put(&b, "", 0);
    int word_start = 1;
    for (size_t i = 0; i < s.u.s.n;) {
        uint32_t cp;
        i += next_cp(s.u.s.s, s.u.s.n, i, &cp);
        int up = mode == CASE_UPPER || ((mode == CASE_CAPITALIZE || mode == CASE_TITLE) && word_start);
        uint32_t o = (uint32_t)(up ? utf8proc_toupper((utf8proc_int32_t)cp) : utf8proc_tolower((utf8proc_int32_t)cp));
        char buf[4];
        utf8proc_ssize_t k = utf8proc_encode_char((utf8proc_int32_t)o, (utf8proc_uint8_t *)buf);
        sb_put(&b, buf, (size_t)k);
        if (mode == CASE_CAPITALIZE)
            word_start = 0;
        else if (mode == CASE_TITLE) {
            /* Jinja's title: a word starts after whitespace, '-', or an opening bracket. */
            word_start = py_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
        }
    }
    ch_val v = ch_str_copy(r, b.s, b.n);
    free(b.s);
    return v;
}

static ch_val replace(rctx *r, ch_val s, ch_val old, ch_val new_, int64_t count)
{
    ch_sb b = {0};
    sb_put(&b, "", 0);
    size_t i = 0;
    int64_t done = 0;
    if (old.u.s.n == 0) {
        /* Python inserts new between characters (and at both ends). */
        for (size_t j = 0; j <= s.u.s.n;) {
            if (count < 0 || done < count) {
                sb_put(&b, new_.u.s.s, new_.u.s.n);
                done++;
            }
            if (j == s.u.s.n)
                break;
            uint32_t cp;
            size_t k = next_cp(s.u.s.s, s.u.s.n, j, &cp);
            sb_put(&b, s.u.s.s + j, k);
            j += k;
        }
    } else {
        while (i < s.u.s.n) {
            if ((count < 0 || done < count) && i + old.u.s.n <= s.u.s.n &&
                memcmp(s.u.s.s + i, old.u.s.s, old.u.s.n) == 0) {
                sb_put(&b, new_.u.s.s, new_.u.s.n);
                i += old.u.s.n;
                done++;
            } else {
                sb_put(&b, s.u.s.s + i++, 1);
            }
        }
    }
    ch_val v = ch_str_copy(r, b.s, b.n);
    free(b.s);
    return v;
}

/* str.split(sep=None, maxsplit=-1). */
static ch_val split(rctx *r, ch_val s, const ch_val *sep, int64_t maxsplit, int line)
{
    ch_val parts[4096];
    size_t n = 0;
    const char *p = s.u.s.s;
    size_t len = s.u.s.n;
    if (!sep || sep->t == V_NONE) {
        size_t i = 0;
        while (i < len) {
            uint32_t cp;
            size_t k;
            while (i < len && py_space((k = next_cp(p, len, i, &cp), cp)))
                i += k;
            if (i >= len)
                break;
            size_t start = i;
            if (maxsplit >= 0 && (int64_t)n >= maxsplit) {
                /* The rest, right-stripped of whitespace. */
                ch_val rest = strip(ch_str(p + start, len - start), NULL, 0, 1);
                parts[n++] = rest;
                break;
            }
            while (i < len && !py_space((k = next_cp(p, len, i, &cp), cp)))
                i += k;
            if (n < sizeof parts / sizeof parts[0])
                parts[n++] = ch_str(p + start, i - start);
        }
    } else {
        if (!want_str(r, sep, line, "split"))
            return undef();
        if (sep->u.s.n == 0) {
            ch_fail(r, KVQ_ERR_FORMAT, line, "split: empty separator");
            return undef();
        }
        size_t start = 0;
        for (size_t i = 0; i + sep->u.s.n <= len && n + 1 < sizeof parts / sizeof parts[0];) {
            if ((maxsplit < 0 || (int64_t)n < maxsplit) && memcmp(p + i, sep->u.s.s, sep->u.s.n) == 0) {
                parts[n++] = ch_str(p + start, i - start);
                i += sep->u.s.n;
                start = i;
            } else {
                i++;
            }
        }
        parts[n++] = ch_str(p + start, len - start);
    }
    ch_val l = ch_list_new(r, n);
    if (!r->st)
        if (n)
            memcpy(l.u.l->v, parts, n * sizeof *parts);
    return l;
}

static int starts_ends(ch_val s, ch_val x, int ends)
{
    if (x.t == V_LIST) {
        for (size_t i = 0; i < x.u.l->n; i++)
            if (starts_ends(s, x.u.l->v[i], ends))
                return 1;
        return 0;
    }
    if (x.t != V_STR || x.u.s.n > s.u.s.n)
        return 0;
    return memcmp(s.u.s.s + (ends ? s.u.s.n - x.u.s.n : 0), x.u.s.s, x.u.s.n) == 0;
}

static ch_val join(rctx *r, ch_val list, const ch_val *sep, const ch_val *attr)
{
    ch_sb b = {0};
    sb_put(&b, "", 0);
    for (size_t i = 0; i < list.u.l->n; i++) {
        if (i && sep)
            ch_put_str(&b, *sep);
        ch_val it = list.u.l->v[i];
        if (attr && attr->t == V_STR)
            it = ch_index(r, it, *attr, 0);
        ch_put_str(&b, it);
    }
    ch_val v = ch_str_copy(r, b.s, b.n);
    free(b.s);
    return v;
}

static ch_val items_of(rctx *r, ch_val d)
{
    ch_val l = ch_list_new(r, d.u.d->n);
    for (size_t i = 0; !r->st && i < d.u.d->n; i++) {
        ch_val pair = ch_list_new(r, 2);
        if (r->st)
            break;
        pair.u.l->tuple = 1;
        pair.u.l->v[0] = d.u.d->k[i];
        pair.u.l->v[1] = d.u.d->v[i];
        l.u.l->v[i] = pair;
    }
    return l;
}

static ch_val as_list(rctx *r, ch_val v, int line)
{
    if (v.t == V_LIST)
        return v;
    if (v.t == V_DICT) {
        ch_val l = ch_list_new(r, v.u.d->n);
        if (!r->st && v.u.d->n)
            memcpy(l.u.l->v, v.u.d->k, v.u.d->n * sizeof(ch_val));
        return l;
    }
    if (v.t == V_STR) {
        size_t n = ch_cp_count(v.u.s.s, v.u.s.n);
        ch_val l = ch_list_new(r, n);
        for (size_t i = 0; !r->st && i < n; i++) {
            size_t a = ch_cp_offset(v.u.s.s, v.u.s.n, i), b = ch_cp_offset(v.u.s.s, v.u.s.n, i + 1);
            l.u.l->v[i] = ch_str(v.u.s.s + a, b - a);
        }
        return l;
    }
    if (v.t == V_UNDEF)
        return ch_list_new(r, 0);
    ch_fail(r, KVQ_ERR_FORMAT, line, "'%s' object is not iterable", ch_type_name(v));
    return undef();
}

static ch_val tojson(rctx *r, ch_val v, const args *a, int line, int arg0)
{
    ch_json_opts o = {-1, 0, 0, NULL, NULL};
    const ch_val *indent = arg(a, arg0, "indent"), *ascii = arg(a, arg0 + 1, "ensure_ascii"),
                 *sort = arg(a, arg0 + 2, "sort_keys"), *seps = arg(a, -1, "separators");
    /* transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False),
     * where Jinja's own takes indent first; keywords mean the same in both. */
    if (indent && indent->t == V_INT) {
        if (indent->u.i > 256) {
            ch_fail(r, KVQ_ERR_UNSUPPORTED, line, "tojson indent over 256");
            return undef();
        }
        o.indent = indent->u.i < 0 ? 0 : (int)indent->u.i;
    }
    if (ascii)
        o.ascii = ch_truthy(*ascii);
    if (sort)
        o.sort_keys = ch_truthy(*sort);
    if (seps && seps->t == V_LIST && seps->u.l->n == 2 && seps->u.l->v[0].t == V_STR &&
        seps->u.l->v[1].t == V_STR) {
        o.item_sep = ch_strdup(r->a, seps->u.l->v[0].u.s.s, seps->u.l->v[0].u.s.n);
        o.key_sep = ch_strdup(r->a, seps->u.l->v[1].u.s.s, seps->u.l->v[1].u.s.n);
    }
    ch_sb b = {0};
    sb_put(&b, "", 0);
    int ok = ch_put_json(&b, v, &o, 0);
    if (b.failed) {
        free(b.s);
        ch_fail(r, KVQ_ERR_NOMEM, line, "tojson: the text is over %zu MiB", CH_SB_CAP >> 20);
        return undef();
    }
    ch_val s = ok ? ch_str_copy(r, b.s, b.n) : undef();
    free(b.s);
    if (!ok)
        ch_fail(r, KVQ_ERR_FORMAT, line, "tojson: a %s is not JSON serializable", ch_type_name(v));
    return s;
}

/* ---- tests ---- */

static int run_test(rctx *r, const char *name, ch_val v, const args *a, int line)
{
    const ch_val *x = arg(a, 0, NULL);
    if (!strcmp(name, "defined"))
        return v.t != V_UNDEF;
    if (!strcmp(name, "undefined"))
        return v.t == V_UNDEF;
    if (!strcmp(name, "none"))
        return v.t == V_NONE;
    if (!strcmp(name, "string"))
        return v.t == V_STR;
    if (!strcmp(name, "number"))
        return v.t == V_INT || v.t == V_FLOAT;
    if (!strcmp(name, "integer"))
        return v.t == V_INT;
    if (!strcmp(name, "float"))
        return v.t == V_FLOAT;
    if (!strcmp(name, "boolean"))
        return v.t == V_BOOL;
    if (!strcmp(name, "true"))
        return v.t == V_BOOL && v.u.b;
    if (!strcmp(name, "false"))
        return v.t == V_BOOL && !v.u.b;
    if (!strcmp(name, "mapping"))
        return v.t == V_DICT;
    if (!strcmp(name, "iterable"))
        return v.t == V_LIST || v.t == V_DICT || v.t == V_STR || v.t == V_UNDEF;
    if (!strcmp(name, "sequence"))
        return v.t == V_LIST || v.t == V_DICT || v.t == V_STR;
    if (!strcmp(name, "callable"))
        return v.t == V_FUNC;
    if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        if (v.t != V_INT) {
            ch_fail(r, KVQ_ERR_FORMAT, line, "'%s' test of a %s", name, ch_type_name(v));
            return 0;
        }
        return (v.u.i % 2 != 0) == (name[0] == 'o');
    }
    if (!strcmp(name, "divisibleby")) {
        if (v.t != V_INT || !x || x->t != V_INT || x->u.i == 0) {
            ch_fail(r, KVQ_ERR_FORMAT, line, "'divisibleby' needs integers");
            return 0;
        }
        return v.u.i % x->u.i == 0;
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (v.t != V_STR)
            return 0;
        ch_val c = change_case(r, v, name[0] == 'l' ? CASE_LOWER : CASE_UPPER);
        return !r->st && ch_equal(c, v);
    }
    static const char *cmp[] = {"equalto", "eq", "==", "ne", "!=", "lt", "<", "gt", ">", "le", "<=", "ge", ">=",
                                "sameas", "in"};
    for (size_t k = 0; k < sizeof cmp / sizeof cmp[0]; k++) {
        if (strcmp(name, cmp[k]))
            continue;
        if (!x) {
            ch_fail(r, KVQ_ERR_FORMAT, line, "test '%s' needs an argument", name);
            return 0;
        }
        if (k <= 2 || k == 13)
            return ch_equal(v, *x);
        if (k <= 4)
            return !ch_equal(v, *x);
        if (k == 14) {
            if (x->t == V_LIST) {
                for (size_t i = 0; i < x->u.l->n; i++)
                    if (ch_equal(x->u.l->v[i], v))
                        return 1;
                return 0;
            }
            if (x->t == V_DICT)
                return v.t == V_STR && ch_dict_get(x->u.d, v.u.s.s, v.u.s.n) != NULL;
            if (x->t == V_STR && v.t == V_STR) {
                for (size_t i = 0; i + v.u.s.n <= x->u.s.n; i++)
                    if (memcmp(x->u.s.s + i, v.u.s.s, v.u.s.n) == 0)
                        return 1;
                return 0;
            }
            return 0;
        }
        double p = ch_num(v), q = ch_num(*x);
        if (!((v.t == V_INT || v.t == V_FLOAT) && (x->t == V_INT || x->t == V_FLOAT))) {
            ch_fail(r, KVQ_ERR_FORMAT, line, "test '%s' compares numbers", name);
            return 0;
        }
        return k <= 6 ? p < q : k <= 8 ? p > q : k <= 10 ? p <= q : p >= q;
    }
    ch_fail(r, KVQ_ERR_UNSUPPORTED, line, "test '%s' is not supported by kvq's Jinja subset", name);
    return 0;
}

int ch_test(rctx *r, const ch_expr *e)
{
    ch_val v = ch_eval(r, e->a);
    args a;
    if (r->st || !eval_args(r, e, &a))
        return 0;
    return run_test(r, e->name, v, &a, e->line);
}

/* select / reject / selectattr / rejectattr over a list. */
static ch_val select_items(rctx *r, ch_val list, const args *a, int by_attr, int keep, int line)
{
    int base = by_attr ? 1 : 0;
    const ch_val *attr = by_attr ? arg(a, 0, NULL) : NULL;
    const ch_val *test = arg(a, base, NULL);
    if (by_attr && (!attr || attr->t != V_STR)) {
        ch_fail(r, KVQ_ERR_FORMAT, line, "selectattr/rejectattr need an attribute name");
        return undef();
    }
    if (test && test->t != V_STR) {
        ch_fail(r, KVQ_ERR_FORMAT, line, "select: the test name must be a string");
        return undef();
    }
    char tname[64] = "";
    if (test)
        snprintf(tname, sizeof tname, "%.*s", (int)test->u.s.n, test->u.s.s);
    args rest = {{{0}}, {0}, 0};
    for (int i = 0; i < a->n; i++)
        if (!a->kw[i] && i > base)
            rest.v[rest.n++] = a->v[i];
    ch_val out = ch_list_new(r, list.u.l->n);
    size_t w = 0;
    for (size_t i = 0; !r->st && i < list.u.l->n; i++) {
        ch_val it = list.u.l->v[i], x = by_attr ? ch_index(r, it, *attr, line) : it;
        int t = test ? run_test(r, tname, x, &rest, line) : ch_truthy(x);
        if (t == keep)
            out.u.l->v[w++] = it;
    }
    if (!r->st)
        out.u.l->n = w;
    return out;
}

/* ---- filters ---- */

ch_val ch_filter(rctx *r, const ch_expr *e)
{
    ch_val v = ch_eval(r, e->a);
    args a;
    if (r->st || !eval_args(r, e, &a))
        return undef();
    const char *f = e->name;
    int line = e->line;
    if (!strcmp(f, "safe") || (!strcmp(f, "string") && v.t == V_STR))
        return v;
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        const ch_val *d = arg(&a, 0, "default_value"), *boolean = arg(&a, 1, "boolean");
        int use_default = boolean && ch_truthy(*boolean) ? !ch_truthy(v) : v.t == V_UNDEF;
        return use_default ? (d ? *d : ch_str("", 0)) : v;
    }
    if (!strcmp(f, "tojson"))
        return tojson(r, v, &a, line, 0);
    if (!strcmp(f, "string"))
        return ch_to_str(r, v);
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        if (v.t == V_STR)
            return mk_int((int64_t)ch_cp_count(v.u.s.s, v.u.s.n));
        if (v.t == V_LIST)
            return mk_int((int64_t)v.u.l->n);
        if (v.t == V_DICT)
            return mk_int((int64_t)v.u.d->n);
        if (v.t == V_UNDEF)
            return mk_int(0);
        ch_fail(r, KVQ_ERR_FORMAT, line, "object of type '%s' has no len()", ch_type_name(v));
        return undef();
    }
    if (!strcmp(f, "list"))
        return as_list(r, v, line);
    if (!strcmp(f, "items")) {
        if (v.t == V_DICT)
            return items_of(r, v);
        if (v.t == V_UNDEF)
            return ch_list_new(r, 0);
        ch_fail(r, KVQ_ERR_FORMAT, line, "items of a %s", ch_type_name(v));
        return undef();
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        ch_val l = as_list(r, v, line);
        if (r->st || l.u.l->n == 0)
            return undef();
        return l.u.l->v[f[0] == 'f' ? 0 : l.u.l->n - 1];
    }
    if (!strcmp(f, "reverse")) {
        if (v.t == V_STR) {
            ch_sb b = {0};
            sb_put(&b, "", 0);
            size_t n = ch_cp_count(v.u.s.s, v.u.s.n);
            for (size_t i = n; i-- > 0;) {
                size_t x = ch_cp_offset(v.u.s.s, v.u.s.n, i), y = ch_cp_offset(v.u.s.s, v.u.s.n, i + 1);
                sb_put(&b, v.u.s.s + x, y - x);
            }
            ch_val s = ch_str_copy(r, b.s, b.n);
            free(b.s);
            return s;
        }
        ch_val l = as_list(r, v, line);
        if (r->st)
            return undef();
        ch_val out = ch_list_new(r, l.u.l->n);
        for (size_t i = 0; !r->st && i < l.u.l->n; i++)
            out.u.l->v[i] = l.u.l->v[l.u.l->n - 1 - i];
        return out;
    }
    if (!strcmp(f, "join")) {
        ch_val l = as_list(r, v, line);
        const ch_val *sep = arg(&a, 0, "d"), *attr = arg(&a, 1, "attribute");
        return r->st ? undef() : join(r, l, sep, attr);
    }
    if (!strcmp(f, "unique")) {
        ch_val l = as_list(r, v, line);
        if (r->st)
            return undef();
        ch_val out = ch_list_new(r, l.u.l->n);
        size_t w = 0;
        for (size_t i = 0; !r->st && i < l.u.l->n; i++) {
            int seen = 0;
            for (size_t j = 0; j < w && !seen; j++)
                seen = ch_equal(out.u.l->v[j], l.u.l->v[i]);
            if (!seen)
                out.u.l->v[w++] = l.u.l->v[i];
        }
        if (!r->st)
            out.u.l->n = w;
        return out;
    }
    if (!strcmp(f, "map")) {
        ch_val l = as_list(r, v, line);
        const ch_val *attr = arg(&a, -1, "attribute"), *dflt = arg(&a, -1, "default");
        if (r->st)
            return undef();
        if (!attr || attr->t != V_STR) {
            ch_fail(r, KVQ_ERR_UNSUPPORTED, line, "map is supported with attribute= only");
            return undef();
        }
        ch_val out = ch_list_new(r, l.u.l->n);
        for (size_t i = 0; !r->st && i < l.u.l->n; i++) {
            ch_val x = ch_index(r, l.u.l->v[i], *attr, line);
            out.u.l->v[i] = x.t == V_UNDEF && dflt ? *dflt : x;
        }
        return out;
    }
    if (!strcmp(f, "select") || !strcmp(f, "reject") || !strcmp(f, "selectattr") || !strcmp(f, "rejectattr")) {
        ch_val l = as_list(r, v, line);
        return r->st ? undef() : select_items(r, l, &a, strstr(f, "attr") != NULL, f[0] == 's', line);
    }
    if (v.t == V_UNDEF && (!strcmp(f, "trim") || !strcmp(f, "upper") || !strcmp(f, "lower")))
        v = ch_str("", 0); /* Jinja's filters see an undefined value as "" */
    if (!strcmp(f, "abs")) {
        if (v.t == V_INT)
            return mk_int(v.u.i < 0 ? -v.u.i : v.u.i);
        if (v.t == V_FLOAT) {
            ch_val x = v;
            x.u.f = fabs(v.u.f);
            return x;
        }
    }
    if (!strcmp(f, "int")) {
        const ch_val *d = arg(&a, 0, "default");
        if (v.t == V_INT || v.t == V_BOOL)
            return mk_int(v.t == V_INT ? v.u.i : v.u.b);
        if (v.t == V_FLOAT)
            return mk_int(ch_float_to_int(v.u.f));
        if (v.t == V_STR) {
            char buf[64];
            snprintf(buf, sizeof buf, "%.*s", (int)(v.u.s.n < 63 ? v.u.s.n : 63), v.u.s.s);
            char *end;
            long long x = strtoll(buf, &end, 10);
            if (end != buf && !*end)
                return mk_int(x);
        }
        return d ? *d : mk_int(0);
    }
    if (!strcmp(f, "float")) {
        ch_val x = {V_FLOAT, {0}};
        if (v.t == V_INT || v.t == V_FLOAT || v.t == V_BOOL) {
            x.u.f = ch_num(v);
            return x;
        }
        if (v.t == V_STR) {
            char buf[64];
            snprintf(buf, sizeof buf, "%.*s", (int)(v.u.s.n < 63 ? v.u.s.n : 63), v.u.s.s);
            char *end;
            x.u.f = strtod(buf, &end);
            if (end != buf && !*end)
                return x;
        }
        const ch_val *d = arg(&a, 0, "default");
        return d ? *d : x;
    }
    if (v.t == V_STR) {
        if (!strcmp(f, "trim"))
            return strip(v, arg(&a, 0, "chars"), 1, 1);
        if (!strcmp(f, "upper"))
            return change_case(r, v, CASE_UPPER);
        if (!strcmp(f, "lower"))
            return change_case(r, v, CASE_LOWER);
        if (!strcmp(f, "capitalize"))
            return change_case(r, v, CASE_CAPITALIZE);
        if (!strcmp(f, "title"))
            return change_case(r, v, CASE_TITLE);
        if (!strcmp(f, "replace")) {
            const ch_val *o = arg(&a, 0, "old"), *n = arg(&a, 1, "new"), *c = arg(&a, 2, "count");
            if (!want_str(r, o, line, "replace") || !want_str(r, n, line, "replace"))
                return undef();
            return replace(r, v, *o, *n, c && c->t == V_INT ? c->u.i : -1);
        }
        if (!strcmp(f, "e") || !strcmp(f, "escape")) {
            ch_sb b = {0};
            sb_put(&b, "", 0);
            for (size_t i = 0; i < v.u.s.n; i++) {
                char c = v.u.s.s[i];
                sb_puts(&b, c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&#34;"
                                   : c == '\'' ? "&#39;" : (char[2]){c, 0});
            }
            ch_val s = ch_str_copy(r, b.s, b.n);
            free(b.s);
            return s;
        }
        if (!strcmp(f, "indent")) {
            const ch_val *w = arg(&a, 0, "width"), *first = arg(&a, 1, "first"), *blank = arg(&a, 2, "blank");
            char pad[64] = "    ";
            if (w && w->t == V_INT && w->u.i >= 0 && w->u.i < 63) {
                memset(pad, ' ', (size_t)w->u.i);
                pad[w->u.i] = 0;
            } else if (w && w->t == V_STR) {
                snprintf(pad, sizeof pad, "%.*s", (int)w->u.s.n, w->u.s.s);
            }
            ch_sb b = {0};
            sb_put(&b, "", 0);
            int at_start = 1, is_first = 1;
            for (size_t i = 0; i < v.u.s.n; i++) {
                if (at_start) {
                    int empty = v.u.s.s[i] == '\n';
                    if ((!is_first || (first && ch_truthy(*first))) && (!empty || (blank && ch_truthy(*blank))))
                        sb_puts(&b, pad);
                    at_start = 0;
                }
                sb_put(&b, v.u.s.s + i, 1);
                if (v.u.s.s[i] == '\n') {
                    at_start = 1;
                    is_first = 0;
                }
            }
            ch_val s = ch_str_copy(r, b.s, b.n);
            free(b.s);
            return s;
        }
    }
    ch_fail(r, KVQ_ERR_UNSUPPORTED, line, "filter '%s' (on a %s) is not supported by kvq's Jinja subset", f,
            ch_type_name(v));
    return undef();
}

/* ---- calls: methods and global functions ---- */

static ch_val method(rctx *r, const ch_expr *e, ch_val obj, const char *m, const args *a)
{
    int line = e->line;
    if (obj.t == V_STR) {
        const ch_val *x = arg(a, 0, NULL), *y = arg(a, 1, NULL);
        if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip"))
            return strip(obj, x && x->t != V_NONE ? x : NULL, m[0] != 'r', m[0] != 'l');
        if (!strcmp(m, "split"))
            return split(r, obj, arg(a, 0, "sep"), arg(a, 1, "maxsplit") ? arg(a, 1, "maxsplit")->u.i : -1, line);
        if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
            if (!x) {
                ch_fail(r, KVQ_ERR_FORMAT, line, "%s needs an argument", m);
                return undef();
            }
            return mk_bool(starts_ends(obj, *x, m[0] == 'e'));
        }
        if (!strcmp(m, "upper"))
            return change_case(r, obj, CASE_UPPER);
        if (!strcmp(m, "lower"))
            return change_case(r, obj, CASE_LOWER);
        if (!strcmp(m, "title"))
            return change_case(r, obj, CASE_TITLE);
        if (!strcmp(m, "capitalize"))
            return change_case(r, obj, CASE_CAPITALIZE);
        if (!strcmp(m, "replace")) {
            const ch_val *c = arg(a, 2, "count");
            if (!want_str(r, x, line, "replace") || !want_str(r, y, line, "replace"))
                return undef();
            return replace(r, obj, *x, *y, c && c->t == V_INT ? c->u.i : -1);
        }
        if (!strcmp(m, "find") || !strcmp(m, "count")) {
            if (!want_str(r, x, line, m))
                return undef();
            int64_t count = 0;
            for (size_t i = 0; i + x->u.s.n <= obj.u.s.n;) {
                if (memcmp(obj.u.s.s + i, x->u.s.s, x->u.s.n) == 0) {
                    if (m[0] == 'f')
                        return mk_int((int64_t)ch_cp_count(obj.u.s.s, i));
                    count++;
                    i += x->u.s.n ? x->u.s.n : 1;
                } else {
                    i++;
                }
            }
            return mk_int(m[0] == 'f' ? -1 : count);
        }
        if (!strcmp(m, "join")) {
            if (!x)
                return ch_str("", 0);
            ch_val l = as_list(r, *x, line);
            return r->st ? undef() : join(r, l, &obj, NULL);
        }
        if (!strcmp(m, "isdigit") || !strcmp(m, "isspace")) {
            if (!obj.u.s.n)
                return mk_bool(0);
            for (size_t i = 0; i < obj.u.s.n;) {
                uint32_t cp;
                i += next_cp(obj.u.s.s, obj.u.s.n, i, &cp);
                int ok = m[2] == 'd' ? utf8proc_category((utf8proc_int32_t)cp) == UTF8PROC_CATEGORY_ND : py_space(cp);
                if (!ok)
                    return mk_bool(0);
            }
            return mk_bool(1);
        }
    } else if (obj.t == V_DICT) {
        if (!strcmp(m, "items"))
            return items_of(r, obj);
        if (!strcmp(m, "keys") || !strcmp(m, "values")) {
            ch_val l = ch_list_new(r, obj.u.d->n);
            if (!r->st && obj.u.d->n)
                memcpy(l.u.l->v, m[0] == 'k' ? obj.u.d->k : obj.u.d->v, obj.u.d->n * sizeof(ch_val));
            return l;
        }
        if (!strcmp(m, "get")) {
            const ch_val *k = arg(a, 0, NULL), *d = arg(a, 1, NULL);
            ch_val *v = k && k->t == V_STR ? ch_dict_get(obj.u.d, k->u.s.s, k->u.s.n) : NULL;
            return v ? *v : d ? *d : (ch_val){V_NONE, {0}};
        }
        /* A function stored in a dict (rare): fall through to the error. */
    } else if (obj.t == V_UNDEF) {
        ch_fail(r, KVQ_ERR_FORMAT, line, "'%s' called on an undefined value", m);
        return undef();
    }
    ch_fail(r, KVQ_ERR_UNSUPPORTED, line, "method '%s' of a %s is not supported by kvq's Jinja subset", m,
            ch_type_name(obj));
    return undef();
}

static const char *const g_funcs[] = {"namespace", "range", "raise_exception", "strftime_now", "dict"};

ch_val ch_global(const char *name)
{
    for (size_t i = 0; i < sizeof g_funcs / sizeof g_funcs[0]; i++)
        if (!strcmp(name, g_funcs[i])) {
            ch_val v = {V_FUNC, {0}};
            v.u.fn = (int)i;
            return v;
        }
    return undef();
}

ch_val ch_call(rctx *r, const ch_expr *e)
{
    args a;
    if (e->a->k == E_ATTR) {
        ch_val obj = ch_eval(r, e->a->a);
        if (r->st || !eval_args(r, e, &a))
            return undef();
        return method(r, e, obj, e->a->name, &a);
    }
    ch_val fn = ch_eval(r, e->a);
    if (r->st || !eval_args(r, e, &a))
        return undef();
    if (fn.t != V_FUNC) {
        ch_fail(r, KVQ_ERR_UNSUPPORTED, e->line, "'%s' is not a function kvq's Jinja subset knows",
                e->a->k == E_NAME ? e->a->name : "(expression)");
        return undef();
    }
    switch (fn.u.fn) {
    case FN_NAMESPACE:
    case FN_DICT: {
        ch_val d = ch_dict_new(r);
        if (r->st)
            return undef();
        d.u.d->is_ns = fn.u.fn == FN_NAMESPACE;
        for (int i = 0; i < a.n; i++) {
            if (a.kw[i]) {
                if (!ch_dict_set(r->a, d.u.d, a.kw[i], strlen(a.kw[i]), a.v[i]))
                    ch_fail(r, KVQ_ERR_NOMEM, e->line, "out of memory");
            } else if (a.v[i].t == V_DICT) {
                for (size_t k = 0; k < a.v[i].u.d->n; k++)
                    ch_dict_set(r->a, d.u.d, a.v[i].u.d->k[k].u.s.s, a.v[i].u.d->k[k].u.s.n, a.v[i].u.d->v[k]);
            }
        }
        return d;
    }
    case FN_RANGE: {
        int64_t lo = 0, hi, step = 1;
        for (int i = 0; i < a.n; i++)
            if (a.v[i].t != V_INT) {
                ch_fail(r, KVQ_ERR_FORMAT, e->line, "range() takes integers");
                return undef();
            }
        if (a.n == 1)
            hi = a.v[0].u.i;
        else if (a.n >= 2) {
            lo = a.v[0].u.i;
            hi = a.v[1].u.i;
            if (a.n == 3)
                step = a.v[2].u.i;
        } else {
            ch_fail(r, KVQ_ERR_FORMAT, e->line, "range() needs arguments");
            return undef();
        }
        if (step == 0) {
            ch_fail(r, KVQ_ERR_FORMAT, e->line, "range() step is zero");
            return undef();
        }
        /* The length without stepping past the bounds (no overflow): unsigned
         * differences are exact when the range is not empty. */
        uint64_t n = 0;
        if (step > 0 && hi > lo)
            n = ((uint64_t)hi - (uint64_t)lo - 1) / (uint64_t)step + 1;
        else if (step < 0 && lo > hi)
            n = ((uint64_t)lo - (uint64_t)hi - 1) / ((uint64_t)0 - (uint64_t)step) + 1;
        if (n > 100000) {
            ch_fail(r, KVQ_ERR_UNSUPPORTED, e->line, "range() longer than 100000");
            return undef();
        }
        ch_val l = ch_list_new(r, (size_t)n);
        for (uint64_t k = 0; !r->st && k < n; k++)
            l.u.l->v[k] = mk_int((int64_t)((uint64_t)lo + k * (uint64_t)step));
        return l;
    }
    case FN_RAISE: {
        ch_sb b = {0};
        if (a.n)
            ch_put_str(&b, a.v[0]);
        ch_fail(r, KVQ_ERR_FORMAT, e->line, "the template raised an exception: %s", b.s ? b.s : "");
        free(b.s);
        return undef();
    }
    case FN_STRFTIME: {
        if (a.n < 1 || a.v[0].t != V_STR) {
            ch_fail(r, KVQ_ERR_FORMAT, e->line, "strftime_now needs a format string");
            return undef();
        }
        char fmt[128], buf[256];
        snprintf(fmt, sizeof fmt, "%.*s", (int)a.v[0].u.s.n, a.v[0].u.s.s);
        time_t now = time(NULL);
        struct tm tmv;
        gmtime_r(&now, &tmv);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        size_t k = strftime(buf, sizeof buf, fmt, &tmv); /* the template's format, as Python's strftime */
#pragma GCC diagnostic pop
        return ch_str_copy(r, buf, k);
    }
    }
    return undef();
}
