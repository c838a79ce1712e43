/* chat_eval.c - rendering the syntax tree: statements, scopes, expressions
 * and Python's value semantics (truth, equality, arithmetic, indexing and
 * slicing by code point). Filters, tests, methods and global functions are
 * in chat_builtins.c.
 *
 * Scopes follow Jinja: a for loop's body gets a fresh scope per iteration
 * (a {% set %} inside does not leak out), if blocks share their enclosing
 * scope, and namespace() objects are the one thing a loop can write through.
 */
#include "chat_eval.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ch_fail(rctx *r, kvq_status st, int line, const char *fmt, ...)
{
    if (r->st)
        return;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->st = kvq_error_set(r->err, st, "chat template line %d: %s", line, msg);
}

const char *ch_type_name(ch_val v)
{
    static const char *n[] = {"undefined", "NoneType", "bool", "int", "float", "str", "list", "dict", "function"};
    return n[v.t];
}

int ch_truthy(ch_val v)
{
    switch (v.t) {
    case V_UNDEF:
    case V_NONE:
        return 0;
    case V_BOOL:
        return v.u.b;
    case V_INT:
        return v.u.i != 0;
    case V_FLOAT:
        return v.u.f != 0.0;
    case V_STR:
        return v.u.s.n != 0;
    case V_LIST:
        return v.u.l->n != 0;
    case V_DICT:
        return v.u.d->n != 0;
    default:
        return 1;
    }
}

static int is_num(ch_val v)
{
    return v.t == V_INT || v.t == V_FLOAT || v.t == V_BOOL;
}

double ch_num(ch_val v)
{
    return v.t == V_FLOAT ? v.u.f : v.t == V_INT ? (double)v.u.i : v.t == V_BOOL ? v.u.b : 0.0;
}

int64_t ch_float_to_int(double d)
{
    /* Truncation as Python's int(), clamped to 64 bits (NaN is 0). */
    if (!(d == d))
        return 0;
    if (d >= 9.2233720368547758e18)
        return INT64_MAX;
    if (d <= -9.2233720368547758e18)
        return INT64_MIN;
    return (int64_t)d;
}

static int64_t as_int(ch_val v)
{
    return v.t == V_INT ? v.u.i : v.t == V_BOOL ? v.u.b : ch_float_to_int(ch_num(v));
}

int ch_equal(ch_val a, ch_val b)
{
    if (is_num(a) && is_num(b))
        return ch_num(a) == ch_num(b);
    if (a.t != b.t)
        return 0;
    switch (a.t) {
    case V_UNDEF:
    case V_NONE:
        return 1;
    case V_STR:
        return a.u.s.n == b.u.s.n && memcmp(a.u.s.s, b.u.s.s, a.u.s.n) == 0;
    case V_LIST:
        if (a.u.l->n != b.u.l->n)
            return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!ch_equal(a.u.l->v[i], b.u.l->v[i]))
                return 0;
        return 1;
    case V_DICT:
        if (a.u.d->n != b.u.d->n)
            return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            ch_val *o = ch_dict_get(b.u.d, a.u.d->k[i].u.s.s, a.u.d->k[i].u.s.n);
            if (!o || !ch_equal(a.u.d->v[i], *o))
                return 0;
        }
        return 1;
    case V_FUNC:
        return a.u.fn == b.u.fn;
    default:
        return 0;
    }
}

ch_val ch_list_new(rctx *r, size_t n)
{
    ch_val v = {V_LIST, {0}};
    v.u.l = ch_alloc(r->a, sizeof *v.u.l);
    if (v.u.l && n && !(v.u.l->v = ch_alloc(r->a, n * sizeof *v.u.l->v)))
        v.u.l = NULL;
    if (!v.u.l) {
        ch_fail(r, KVQ_ERR_NOMEM, 0, "out of memory");
        v.t = V_UNDEF;
        return v;
    }
    v.u.l->n = n;
    return v;
}

ch_val ch_dict_new(rctx *r)
{
    ch_val v = {V_DICT, {0}};
    if (!(v.u.d = ch_alloc(r->a, sizeof *v.u.d))) {
        ch_fail(r, KVQ_ERR_NOMEM, 0, "out of memory");
        v.t = V_UNDEF;
    }
    return v;
}

ch_val ch_str_copy(rctx *r, const char *s, size_t n)
{
    char *d = ch_strdup(r->a, s, n);
    if (!d) {
        ch_fail(r, KVQ_ERR_NOMEM, 0, "out of memory");
        return (ch_val){V_UNDEF, {0}};
    }
    return ch_str(d, n);
}

ch_val ch_to_str(rctx *r, ch_val v)
{
    if (v.t == V_STR)
        return v;
    ch_sb b = {0};
    ch_put_str(&b, v);
    ch_val s = ch_str_copy(r, b.s ? b.s : "", b.n);
    free(b.s);
    return s;
}

/* Code points of s[0..n), and the byte offset of code point k. */
size_t ch_cp_count(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

size_t ch_cp_offset(const char *s, size_t n, size_t k)
{
    size_t i = 0;
    while (i < n && k) {
        i++;
        while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80)
            i++;
        k--;
    }
    return i;
}

/* ---- scopes ---- */

ch_val *ch_lookup(rctx *r, const char *name)
{
    size_t n = strlen(name);
    for (scope *s = r->sc; s; s = s->up) {
        ch_val *v = ch_dict_get(s->vars, name, n);
        if (v)
            return v;
    }
    return NULL;
}

static int set_var(rctx *r, const char *name, ch_val v)
{
    if (!ch_dict_set(r->a, r->sc->vars, name, strlen(name), v)) {
        ch_fail(r, KVQ_ERR_NOMEM, 0, "out of memory");
        return 0;
    }
    return 1;
}

static int push_scope(rctx *r, scope *s)
{
    s->up = r->sc;
    s->vars = ch_alloc(r->a, sizeof *s->vars);
    if (!s->vars) {
        ch_fail(r, KVQ_ERR_NOMEM, 0, "out of memory");
        return 0;
    }
    r->sc = s;
    return 1;
}

/* ---- expressions ---- */

static ch_val undef(void)
{
    return (ch_val){V_UNDEF, {0}};
}

static ch_val mk_bool(int b)
{
    ch_val v = {V_BOOL, {0}};
    v.u.b = b != 0;
    return v;
}

static ch_val mk_int(int64_t i)
{
    ch_val v = {V_INT, {0}};
    v.u.i = i;
    return v;
}

static ch_val mk_float(double f)
{
    ch_val v = {V_FLOAT, {0}};
    v.u.f = f;
    return v;
}

ch_val ch_index(rctx *r, ch_val obj, ch_val idx, int line)
{
    if (obj.t == V_DICT) {
        if (idx.t != V_STR)
            return undef();
        ch_val *v = ch_dict_get(obj.u.d, idx.u.s.s, idx.u.s.n);
        return v ? *v : undef();
    }
    if (obj.t == V_LIST || obj.t == V_STR) {
        if (idx.t != V_INT && idx.t != V_BOOL) {
            ch_fail(r, KVQ_ERR_FORMAT, line, "%s indices must be integers, not %s", ch_type_name(obj),
                    ch_type_name(idx));
            return undef();
        }
        int64_t n = obj.t == V_LIST ? (int64_t)obj.u.l->n : (int64_t)ch_cp_count(obj.u.s.s, obj.u.s.n);
        int64_t i = as_int(idx);
        if (i < 0)
            i += n;
        if (i < 0 || i >= n)
            return undef(); /* Jinja: an undefined value, not an error */
        if (obj.t == V_LIST)
            return obj.u.l->v[i];
        size_t a = ch_cp_offset(obj.u.s.s, obj.u.s.n, (size_t)i);
        size_t b = ch_cp_offset(obj.u.s.s, obj.u.s.n, (size_t)i + 1);
        return ch_str(obj.u.s.s + a, b - a);
    }
    if (obj.t == V_UNDEF) {
        ch_fail(r, KVQ_ERR_FORMAT, line, "subscript of an undefined value");
        return undef();
    }
    return undef();
}

static ch_val eval_slice(rctx *r, const ch_expr *e)
{
    ch_val obj = ch_eval(r, e->a);
    ch_val sv[3] = {undef(), undef(), undef()};
    const ch_expr *parts[3] = {e->b, e->c, e->nargs ? e->args[0] : NULL};
    for (int k = 0; k < 3; k++) {
        if (parts[k])
            sv[k] = ch_eval(r, parts[k]);
        if (sv[k].t != V_UNDEF && sv[k].t != V_NONE && sv[k].t != V_INT) {
            ch_fail(r, KVQ_ERR_FORMAT, e->line, "slice indices must be integers");
            return undef();
        }
    }
    if (r->st)
        return undef();
    if (obj.t != V_LIST && obj.t != V_STR) {
        ch_fail(r, KVQ_ERR_FORMAT, e->line, "cannot slice a %s", ch_type_name(obj));
        return undef();
    }
    int64_t n = obj.t == V_LIST ? (int64_t)obj.u.l->n : (int64_t)ch_cp_count(obj.u.s.s, obj.u.s.n);
    int64_t step = sv[2].t == V_INT ? sv[2].u.i : 1;
    if (step == 0) {
        ch_fail(r, KVQ_ERR_FORMAT, e->line, "slice step cannot be zero");
        return undef();
    }
    int64_t lo, hi;
    /* Python's PySlice_AdjustIndices. */
    if (sv[0].t == V_INT) {
        lo = sv[0].u.i < 0 ? sv[0].u.i + n : sv[0].u.i;
        if (lo < 0)
            lo = step < 0 ? -1 : 0;
        else if (lo >= n)
            lo = step < 0 ? n - 1 : n;
    } else {
        lo = step < 0 ? n - 1 : 0;
    }
    if (sv[1].t == V_INT) {
        hi = sv[1].u.i < 0 ? sv[1].u.i + n : sv[1].u.i;
        if (hi < 0)
            hi = step < 0 ? -1 : 0;
        else if (hi >= n)
            hi = step < 0 ? n - 1 : n;
    } else {
        hi = step < 0 ? -1 : n;
    }
    /* A step past the ends gives the same items as one just past them, and
     * keeps i + step from overflowing. */
    if (step > n + 1)
        step = n + 1;
    if (step < -(n + 1))
        step = -(n + 1);
    size_t count = 0;
    for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step)
        count++;
    if (obj.t == V_LIST) {
        ch_val out = ch_list_new(r, count);
        if (r->st)
            return undef();
        size_t w = 0;
        for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step)
            out.u.l->v[w++] = obj.u.l->v[i];
        return out;
    }
    if (step == 1) {
        size_t a = ch_cp_offset(obj.u.s.s, obj.u.s.n, (size_t)lo);
        size_t b = hi > lo ? ch_cp_offset(obj.u.s.s, obj.u.s.n, (size_t)hi) : a;
        return ch_str(obj.u.s.s + a, b - a);
    }
    ch_sb b = {0};
    for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) {
        size_t x = ch_cp_offset(obj.u.s.s, obj.u.s.n, (size_t)i);
        size_t y = ch_cp_offset(obj.u.s.s, obj.u.s.n, (size_t)i + 1);
        sb_put(&b, obj.u.s.s + x, y - x);
    }
    ch_val out = ch_str_copy(r, b.s ? b.s : "", b.n);
    free(b.s);
    return out;
}

static int contains(rctx *r, ch_val hay, ch_val needle, int line)
{
    if (hay.t == V_STR) {
        if (needle.t != V_STR) {
            ch_fail(r, KVQ_ERR_FORMAT, line, "'in <string>' requires a string, not %s", ch_type_name(needle));
            return 0;
        }
        if (needle.u.s.n == 0)
            return 1;
        for (size_t i = 0; i + needle.u.s.n <= hay.u.s.n; i++)
            if (memcmp(hay.u.s.s + i, needle.u.s.s, needle.u.s.n) == 0)
                return 1;
        return 0;
    }
    if (hay.t == V_LIST) {
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (ch_equal(hay.u.l->v[i], needle))
                return 1;
        return 0;
    }
    if (hay.t == V_DICT)
        return needle.t == V_STR && ch_dict_get(hay.u.d, needle.u.s.s, needle.u.s.n) != NULL;
    ch_fail(r, KVQ_ERR_FORMAT, line, "argument of type '%s' is not iterable", ch_type_name(hay));
    return 0;
}

static int compare(rctx *r, ch_val a, ch_val b, int line, int *out)
{
    if (is_num(a) && is_num(b)) {
        double x = ch_num(a), y = ch_num(b);
        *out = (x > y) - (x < y);
        return 1;
    }
    if (a.t == V_STR && b.t == V_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = memcmp(a.u.s.s, b.u.s.s, n);
        *out = c ? (c > 0) - (c < 0) : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
        return 1;
    }
    ch_fail(r, KVQ_ERR_FORMAT, line, "'<' not supported between '%s' and '%s'", ch_type_name(a), ch_type_name(b));
    return 0;
}

static ch_val binop(rctx *r, const ch_expr *e, ch_val a, ch_val b)
{
    static const char *sym[] = {"+", "-", "*", "/", "//", "%", "**"};
    int op = e->op;
    if (op == OP_CONCAT) {
        ch_sb s = {0};
        ch_put_str(&s, a);
        ch_put_str(&s, b);
        ch_val v = ch_str_copy(r, s.s ? s.s : "", s.n);
        free(s.s);
        return v;
    }
    if (op == OP_EQ || op == OP_NE)
        return mk_bool(ch_equal(a, b) == (op == OP_EQ));
    if (op == OP_IN || op == OP_NOTIN)
        return mk_bool(contains(r, b, a, e->line) == (op == OP_IN));
    if (op >= OP_LT && op <= OP_GE) {
        int c;
        if (!compare(r, a, b, e->line, &c))
            return undef();
        return mk_bool(op == OP_LT ? c < 0 : op == OP_GT ? c > 0 : op == OP_LE ? c <= 0 : c >= 0);
    }
    if (a.t == V_UNDEF || b.t == V_UNDEF) {
        ch_fail(r, KVQ_ERR_FORMAT, e->line, "an undefined value in '%s'", sym[op]);
        return undef();
    }
    if ((op == OP_ADD && a.t == V_STR && b.t == V_STR && a.u.s.n + b.u.s.n > CH_MAX_TEXT)) {
        ch_fail(r, KVQ_ERR_UNSUPPORTED, e->line, "a string over %zu MiB", CH_MAX_TEXT >> 20);
        return undef();
    }
    if (op == OP_ADD && a.t == V_STR && b.t == V_STR) {
        char *s = ch_alloc(r->a, a.u.s.n + b.u.s.n + 1);
        if (!s) {
            ch_fail(r, KVQ_ERR_NOMEM, e->line, "out of memory");
            return undef();
        }
        memcpy(s, a.u.s.s, a.u.s.n);
        memcpy(s + a.u.s.n, b.u.s.s, b.u.s.n);
        return ch_str(s, a.u.s.n + b.u.s.n);
    }
    if (op == OP_ADD && a.t == V_LIST && b.t == V_LIST) {
        ch_val v = ch_list_new(r, a.u.l->n + b.u.l->n);
        if (r->st)
            return undef();
        if (a.u.l->n) /* an empty list has no array */
            memcpy(v.u.l->v, a.u.l->v, a.u.l->n * sizeof(ch_val));
        if (b.u.l->n)
            memcpy(v.u.l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof(ch_val));
        return v;
    }
    if (op == OP_MUL && ((a.t == V_STR && b.t == V_INT) || (a.t == V_INT && b.t == V_STR))) {
        ch_val s = a.t == V_STR ? a : b;
        int64_t k = a.t == V_INT ? a.u.i : b.u.i;
        if (k > 0 && s.u.s.n && (uint64_t)k > CH_MAX_TEXT / s.u.s.n) {
            ch_fail(r, KVQ_ERR_UNSUPPORTED, e->line, "a string over %zu MiB", CH_MAX_TEXT >> 20);
            return undef();
        }
        ch_sb out = {0};
        sb_put(&out, "", 0);
        for (int64_t i = 0; i < k; i++)
            sb_put(&out, s.u.s.s, s.u.s.n);
        ch_val v = ch_str_copy(r, out.s, out.n);
        free(out.s);
        return v;
    }
    if (!is_num(a) || !is_num(b)) {
        ch_fail(r, KVQ_ERR_FORMAT, e->line, "unsupported operand types for %s: '%s' and '%s'", sym[op],
                ch_type_name(a), ch_type_name(b));
        return undef();
    }
    int ints = a.t != V_FLOAT && b.t != V_FLOAT;
    double x = ch_num(a), y = ch_num(b);
    if ((op == OP_DIV || op == OP_FLOORDIV || op == OP_MOD) && y == 0) {
        ch_fail(r, KVQ_ERR_FORMAT, e->line, "division by zero");
        return undef();
    }
    int64_t p = as_int(a), q = as_int(b), res = 0;
    /* Python's integers do not overflow; kvq's 64-bit ones say so instead. */
    if (ints && (op == OP_ADD || op == OP_SUB || op == OP_MUL)) {
        int over = op == OP_ADD ? __builtin_add_overflow(p, q, &res)
                   : op == OP_SUB ? __builtin_sub_overflow(p, q, &res)
                                  : __builtin_mul_overflow(p, q, &res);
        if (over) {
            ch_fail(r, KVQ_ERR_UNSUPPORTED, e->line, "integer overflow in '%s' (kvq's integers are 64-bit)", sym[op]);
            return undef();
        }
        return mk_int(res);
    }
    if (ints && (op == OP_FLOORDIV || op == OP_MOD) && p == INT64_MIN && q == -1) {
        ch_fail(r, KVQ_ERR_UNSUPPORTED, e->line, "integer overflow in '%s' (kvq's integers are 64-bit)", sym[op]);
        return undef();
    }
    switch (op) {
    case OP_ADD:
        return mk_float(x + y);
    case OP_SUB:
        return mk_float(x - y);
    case OP_MUL:
        return mk_float(x * y);
    case OP_DIV:
        return mk_float(x / y);
    case OP_FLOORDIV:
        if (ints) {
            int64_t d = p / q;
            return mk_int(d - ((p % q != 0) && ((p < 0) != (q < 0))));
        }
        return mk_float(floor(x / y));
    case OP_MOD:
        if (ints) {
            int64_t m = p % q;
            return mk_int(m && ((m < 0) != (q < 0)) ? m + q : m);
        }
        return mk_float(x - floor(x / y) * y);
    case OP_POW:
        if (ints && as_int(b) >= 0) {
            int64_t acc = 1;
            for (int64_t i = 0; i < q && i < 64; i++)
                if (__builtin_mul_overflow(acc, p, &acc)) {
                    ch_fail(r, KVQ_ERR_UNSUPPORTED, e->line, "integer overflow in '**' (kvq's integers are 64-bit)");
                    return undef();
                }
            return mk_int(acc);
        }
        return mk_float(pow(x, y));
    }
    return undef();
}

static ch_val eval_inner(rctx *r, const ch_expr *e);

ch_val ch_eval(rctx *r, const ch_expr *e)
{
    if (r->st)
        return undef();
    if (++r->steps > CH_MAX_STEPS) {
        ch_fail(r, KVQ_ERR_UNSUPPORTED, e->line, "the template runs too long (over %llu steps)",
                (unsigned long long)CH_MAX_STEPS);
        return undef();
    }
    /* Long operator or attribute chains nest the tree as deep as they are long. */
    if (++r->eval_depth > CH_MAX_EVAL_DEPTH) {
        r->eval_depth--;
        ch_fail(r, KVQ_ERR_UNSUPPORTED, e->line, "an expression nested deeper than %d", CH_MAX_EVAL_DEPTH);
        return undef();
    }
    ch_val v = eval_inner(r, e);
    r->eval_depth--;
    return v;
}

static ch_val eval_inner(rctx *r, const ch_expr *e)
{
    switch (e->k) {
    case E_LIT:
        return e->lit;
    case E_NAME: {
        ch_val *v = ch_lookup(r, e->name);
        if (v)
            return *v;
        return ch_global(e->name);
    }
    case E_LIST: {
        ch_val l = ch_list_new(r, (size_t)e->nargs);
        if (!r->st)
            l.u.l->tuple = e->negate;
        for (int i = 0; !r->st && i < e->nargs; i++)
            l.u.l->v[i] = ch_eval(r, e->args[i]);
        return r->st ? undef() : l;
    }
    case E_DICT: {
        ch_val d = ch_dict_new(r);
        for (int i = 0; !r->st && i + 1 < e->nargs; i += 2) {
            ch_val k = ch_eval(r, e->args[i]), v = ch_eval(r, e->args[i + 1]);
            if (!r->st && k.t != V_STR)
                ch_fail(r, KVQ_ERR_UNSUPPORTED, e->line, "dict keys other than strings are not supported");
            else if (!r->st && !ch_dict_set(r->a, d.u.d, k.u.s.s, k.u.s.n, v))
                ch_fail(r, KVQ_ERR_NOMEM, e->line, "out of memory");
        }
        return r->st ? undef() : d;
    }
    case E_ATTR: {
        ch_val o = ch_eval(r, e->a);
        if (r->st)
            return undef();
        if (o.t == V_DICT) {
            ch_val *v = ch_dict_get(o.u.d, e->name, strlen(e->name));
            return v ? *v : undef();
        }
        if (o.t == V_UNDEF) {
            ch_fail(r, KVQ_ERR_FORMAT, e->line, "'%s' of an undefined value", e->name);
            return undef();
        }
        return undef();
    }
    case E_INDEX: {
        ch_val o = ch_eval(r, e->a), i = ch_eval(r, e->b);
        return r->st ? undef() : ch_index(r, o, i, e->line);
    }
    case E_SLICE:
        return eval_slice(r, e);
    case E_CALL:
        return ch_call(r, e);
    case E_FILTER:
        return ch_filter(r, e);
    case E_TEST: {
        int t = ch_test(r, e);
        return r->st ? undef() : mk_bool(t != e->negate);
    }
    case E_NEG:
    case E_POS: {
        ch_val v = ch_eval(r, e->a);
        if (r->st)
            return undef();
        if (!is_num(v)) {
            ch_fail(r, KVQ_ERR_FORMAT, e->line, "bad operand type for unary %c: '%s'", e->k == E_NEG ? '-' : '+',
                    ch_type_name(v));
            return undef();
        }
        if (e->k == E_POS)
            return v;
        if (v.t != V_FLOAT && as_int(v) == INT64_MIN) {
            ch_fail(r, KVQ_ERR_UNSUPPORTED, e->line, "integer overflow in unary '-'");
            return undef();
        }
        return v.t == V_FLOAT ? mk_float(-v.u.f) : mk_int(-as_int(v));
    }
    case E_NOT: {
        ch_val v = ch_eval(r, e->a);
        return r->st ? undef() : mk_bool(!ch_truthy(v));
    }
    case E_AND: {
        ch_val a = ch_eval(r, e->a);
        return r->st || !ch_truthy(a) ? a : ch_eval(r, e->b);
    }
    case E_OR: {
        ch_val a = ch_eval(r, e->a);
        return r->st || ch_truthy(a) ? a : ch_eval(r, e->b);
    }
    case E_COND: {
        ch_val c = ch_eval(r, e->b);
        if (r->st)
            return undef();
        if (ch_truthy(c))
            return ch_eval(r, e->a);
        return e->c ? ch_eval(r, e->c) : undef();
    }
    case E_BIN: {
        ch_val a = ch_eval(r, e->a), b = ch_eval(r, e->b);
        return r->st ? undef() : binop(r, e, a, b);
    }
    }
    return undef();
}

/* ---- statements ---- */

static void exec_body(rctx *r, const ch_body *b);

/* The items a for loop walks: a list's items, a dict's keys, a string's characters. */
static ch_val iter_items(rctx *r, ch_val v, int line)
{
    if (v.t == V_LIST)
        return v;
    if (v.t == V_UNDEF)
        return ch_list_new(r, 0);
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
    ch_fail(r, KVQ_ERR_FORMAT, line, "'%s' object is not iterable", ch_type_name(v));
    return undef();
}

static int bind_targets(rctx *r, const ch_node *n, ch_val item)
{
    if (!n->var[1])
        return set_var(r, n->var[0], item);
    if (item.t != V_LIST || item.u.l->n != 2) {
        ch_fail(r, KVQ_ERR_FORMAT, n->line, "cannot unpack a %s into 2 loop variables", ch_type_name(item));
        return 0;
    }
    return set_var(r, n->var[0], item.u.l->v[0]) && set_var(r, n->var[1], item.u.l->v[1]);
}

static void exec_for(rctx *r, const ch_node *n)
{
    ch_val src = ch_eval(r, n->e);
    if (r->st)
        return;
    ch_val all = iter_items(r, src, n->line);
    if (r->st)
        return;
    /* The "if" filter runs first: loop.length and loop.last count what passes. */
    ch_val items = all;
    if (n->cond) {
        items = ch_list_new(r, all.u.l->n);
        if (r->st)
            return;
        size_t w = 0;
        for (size_t i = 0; !r->st && i < all.u.l->n; i++) {
            scope s;
            if (!push_scope(r, &s))
                return;
            int keep = bind_targets(r, n, all.u.l->v[i]) && ch_truthy(ch_eval(r, n->cond));
            r->sc = s.up;
            if (keep)
                items.u.l->v[w++] = all.u.l->v[i];
        }
        items.u.l->n = w;
    }
    size_t len = items.u.l->n;
    for (size_t i = 0; !r->st && i < len; i++) {
        scope s;
        if (!push_scope(r, &s))
            return;
        ch_val loop = ch_dict_new(r);
        if (r->st)
            return;
        struct {
            const char *k;
            ch_val v;
        } f[] = {{"index", mk_int((int64_t)i + 1)},
                 {"index0", mk_int((int64_t)i)},
                 {"first", mk_bool(i == 0)},
                 {"last", mk_bool(i + 1 == len)},
                 {"length", mk_int((int64_t)len)},
                 {"revindex", mk_int((int64_t)(len - i))},
                 {"revindex0", mk_int((int64_t)(len - i - 1))},
                 {"previtem", i ? items.u.l->v[i - 1] : undef()},
                 {"nextitem", i + 1 < len ? items.u.l->v[i + 1] : undef()}};
        for (size_t k = 0; k < sizeof f / sizeof f[0]; k++)
            if (!ch_dict_set(r->a, loop.u.d, f[k].k, strlen(f[k].k), f[k].v))
                ch_fail(r, KVQ_ERR_NOMEM, n->line, "out of memory");
        if (!r->st && set_var(r, "loop", loop) && bind_targets(r, n, items.u.l->v[i]))
            exec_body(r, &n->bodies[0]);
        r->sc = s.up;
        if (r->loop_ctl == CTL_BREAK) {
            r->loop_ctl = 0;
            break;
        }
        r->loop_ctl = 0;
    }
    if (!r->st && len == 0)
        exec_body(r, &n->else_body);
}

static void exec_set(rctx *r, const ch_node *n, ch_val v)
{
    if (r->st)
        return;
    if (!n->var[1]) {
        set_var(r, n->var[0], v);
        return;
    }
    ch_val *ns = ch_lookup(r, n->var[0]);
    if (!ns || ns->t != V_DICT || !ns->u.d->is_ns) {
        ch_fail(r, KVQ_ERR_FORMAT, n->line, "cannot set '%s.%s': '%s' is not a namespace()", n->var[0], n->var[1],
                n->var[0]);
        return;
    }
    if (!ch_dict_set(r->a, ns->u.d, n->var[1], strlen(n->var[1]), v))
        ch_fail(r, KVQ_ERR_NOMEM, n->line, "out of memory");
}

static void exec_node(rctx *r, const ch_node *n)
{
    if (++r->steps > CH_MAX_STEPS || r->out.n > CH_MAX_TEXT) {
        ch_fail(r, KVQ_ERR_UNSUPPORTED, n->line, "the template runs too long (over %llu steps or %zu MiB of text)",
                (unsigned long long)CH_MAX_STEPS, CH_MAX_TEXT >> 20);
        return;
    }
    switch (n->k) {
    case S_TEXT:
        sb_put(&r->out, n->text, n->len);
        break;
    case S_OUT: {
        ch_val v = ch_eval(r, n->e);
        if (!r->st)
            ch_put_str(&r->out, v);
        break;
    }
    case S_IF:
        for (int i = 0; i < n->n_branches && !r->st; i++) {
            if (ch_truthy(ch_eval(r, n->conds[i]))) {
                if (!r->st)
                    exec_body(r, &n->bodies[i]);
                return;
            }
        }
        if (!r->st)
            exec_body(r, &n->else_body);
        break;
    case S_FOR:
        if (++r->depth > 64) {
            ch_fail(r, KVQ_ERR_UNSUPPORTED, n->line, "loops nested deeper than 64");
            return;
        }
        exec_for(r, n);
        r->depth--;
        break;
    case S_SET:
        exec_set(r, n, ch_eval(r, n->e));
        break;
    case S_SETBLOCK: {
        ch_sb saved = r->out;
        memset(&r->out, 0, sizeof r->out);
        exec_body(r, &n->bodies[0]);
        ch_sb got = r->out;
        r->out = saved;
        ch_val v = ch_str_copy(r, got.s ? got.s : "", got.n);
        free(got.s);
        exec_set(r, n, v);
        break;
    }
    case S_BLOCK:
        exec_body(r, &n->bodies[0]);
        break;
    case S_BREAK:
    case S_CONTINUE:
        r->loop_ctl = n->k == S_BREAK ? CTL_BREAK : CTL_CONTINUE;
        break;
    }
}

static void exec_body(rctx *r, const ch_body *b)
{
    for (int i = 0; i < b->count && !r->st && !r->loop_ctl; i++) {
        exec_node(r, b->n[i]);
        if (r->out.failed)
            ch_fail(r, KVQ_ERR_NOMEM, b->n[i]->line, "out of memory");
        if (r->a->failed)
            ch_fail(r, KVQ_ERR_NOMEM, b->n[i]->line, "out of memory");
    }
}

kvq_status ch_render(const kvq_chat_template *t, ch_arena *a, ch_dict *globals, char **out, size_t *len,
                     kvq_error *err)
{
    rctx r;
    memset(&r, 0, sizeof r);
    r.a = a;
    r.err = err;
    scope g = {globals, NULL}, top;
    r.sc = &g;
    if (push_scope(&r, &top))
        exec_body(&r, &t->root);
    if (!r.st && !sb_put(&r.out, "", 0))
        r.st = kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    if (r.st) {
        free(r.out.s);
        return r.st;
    }
    *out = r.out.s;
    *len = r.out.n;
    return KVQ_OK;
}
