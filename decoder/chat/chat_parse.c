/* chat_parse.c - Jinja template source -> syntax tree (chat_internal.h).
 *
 * The lexer applies Jinja's whitespace rules with the settings transformers
 * uses for chat templates: trim_blocks (the newline after a block tag goes),
 * lstrip_blocks (spaces before a block tag on its own line go), and the '-'
 * / '+' modifiers. The parser is recursive descent with Jinja's precedence:
 *   a if c else b  <  or  <  and  <  not  <  comparisons, in, not in
 *   <  ~  <  + -  <  * / // %  <  **  <  unary - +  <  filters | and tests is
 *   <  postfix . [] ()  <  literals, names, ( ), [ ], { }.
 */
#include "chat_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { T_TEXT, T_VAR, T_VAR_END, T_BLOCK, T_BLOCK_END, T_NAME, T_STR, T_INT, T_FLOAT, T_OP, T_EOF } tkind;

typedef struct tok {
    tkind k;
    int line;
    const char *s; /* T_TEXT, T_NAME, T_OP: into the source; T_STR: unescaped copy */
    size_t n;
    int64_t i;
    double f;
} tok;

typedef struct parser {
    kvq_chat_template *t;
    kvq_error *err;
    tok *toks;
    int n, cap, pos;
    kvq_status st;
    int depth; /* recursion: nested expressions and blocks */
} parser;

/* Deeper nesting than this is refused (the recursion would otherwise run off
 * the stack on hostile input); real templates nest a handful of levels. */
#define MAX_DEPTH 200

static kvq_status fail(parser *p, kvq_status st, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static kvq_status fail(parser *p, kvq_status st, int line, const char *fmt, ...)
{
    if (!p->st) {
        char msg[200];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        p->st = kvq_error_set(p->err, st, "chat template line %d: %s", line, msg);
    }
    return p->st;
}

static int push(parser *p, tok t)
{
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 256;
        tok *nt = realloc(p->toks, (size_t)cap * sizeof *nt);
        if (!nt) {
            fail(p, KVQ_ERR_NOMEM, t.line, "%s", "out of memory");
            return 0;
        }
        p->toks = nt;
        p->cap = cap;
    }
    p->toks[p->n++] = t;
    return 1;
}

static int count_lines(const char *s, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++)
        k += s[i] == '\n';
    return k;
}

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Lexes the inside of a {{ }} or {% %} tag from *i; stops before its end marker. */
static void lex_tag(parser *p, const char *src, size_t len, size_t *ip, int *line, int block)
{
    size_t i = *ip;
    const char *end = block ? "%}" : "}}";
    while (i < len && !p->st) {
        char c = src[i];
        if (c == '\n')
            (*line)++;
        if (is_ws(c)) {
            i++;
            continue;
        }
        if ((c == '-' || c == '+') && i + 2 < len + 0 && memcmp(src + i + 1, end, 2) == 0)
            break;
        if (i + 1 < len && memcmp(src + i, end, 2) == 0)
            break;
        tok t = {T_OP, *line, src + i, 1, 0, 0};
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            size_t j = i;
            while (j < len && ((src[j] >= 'a' && src[j] <= 'z') || (src[j] >= 'A' && src[j] <= 'Z') ||
                               (src[j] >= '0' && src[j] <= '9') || src[j] == '_'))
                j++;
            t.k = T_NAME;
            t.n = j - i;
            i = j;
        } else if (c >= '0' && c <= '9') {
            size_t j = i;
            int is_float = 0;
            while (j < len && ((src[j] >= '0' && src[j] <= '9') || src[j] == '_'))
                j++;
            if (j + 1 < len && src[j] == '.' && src[j + 1] >= '0' && src[j + 1] <= '9') {
                is_float = 1;
                j++;
                while (j < len && src[j] >= '0' && src[j] <= '9')
                    j++;
            }
            if (j + 1 < len && (src[j] == 'e' || src[j] == 'E')) {
                size_t q = j + 1;
                if (q < len && (src[q] == '+' || src[q] == '-'))
                    q++;
                if (q < len && src[q] >= '0' && src[q] <= '9') {
                    is_float = 1;
                    j = q;
                    while (j < len && src[j] >= '0' && src[j] <= '9')
                        j++;
                }
            }
            char buf[64];
            size_t k = 0;
            for (size_t q = i; q < j && k < sizeof buf - 1; q++)
                if (src[q] != '_')
                    buf[k++] = src[q];
            buf[k] = 0;
            t.k = is_float ? T_FLOAT : T_INT;
            if (is_float)
                t.f = strtod(buf, NULL);
            else
                t.i = strtoll(buf, NULL, 10);
            i = j;
        } else if (c == '\'' || c == '"') {
            /* Python string literal escapes; sized by the literal, not the rest of the source. */
            size_t lit_end = i + 1;
            while (lit_end < len && src[lit_end] != c)
                lit_end += src[lit_end] == '\\' && lit_end + 1 < len ? 2 : 1;
            char *out = ch_alloc(&p->t->arena, lit_end - i + 1);
            if (!out) {
                fail(p, KVQ_ERR_NOMEM, *line, "%s", "out of memory");
                break;
            }
            size_t w = 0, j = i + 1;
            while (j < len && src[j] != c) {
                if (src[j] == '\n')
                    (*line)++;
                if (src[j] == '\\' && j + 1 < len) {
                    char e = src[++j];
                    switch (e) {
                    case 'n': out[w++] = '\n'; break;
                    case 't': out[w++] = '\t'; break;
                    case 'r': out[w++] = '\r'; break;
                    case '0': out[w++] = '\0'; break;
                    case '\\': case '\'': case '"': out[w++] = e; break;
                    case '\n': break;
                    default: out[w++] = '\\'; out[w++] = e; break;
                    }
                    j++;
                } else {
                    out[w++] = src[j++];
                }
            }
            if (j >= len) {
                fail(p, KVQ_ERR_FORMAT, t.line, "%s", "unterminated string literal");
                break;
            }
            t.k = T_STR;
            t.s = out;
            t.n = w;
            i = j + 1;
        } else {
            static const char *two[] = {"//", "**", "==", "!=", "<=", ">="};
            for (size_t q = 0; q < sizeof two / sizeof two[0]; q++)
                if (i + 1 < len && memcmp(src + i, two[q], 2) == 0)
                    t.n = 2;
            if (t.n == 1 && !strchr("+-*/%~|.,:()[]{}=<>!", c)) {
                char what[8] = {c, 0};
                fail(p, KVQ_ERR_FORMAT, *line, "unexpected character '%s'", what);
                break;
            }
            i += t.n;
        }
        if (!push(p, t))
            break;
    }
    *ip = i;
}

static kvq_status lex(parser *p, const char *src, size_t len)
{
    size_t i = 0;
    int line = 1, strip_next = 0;
    while (i <= len && !p->st) {
        /* Next tag start. */
        size_t j = i;
        int kind = 0; /* 1 var, 2 block, 3 comment */
        for (; j + 1 < len; j++) {
            if (src[j] == '{' && (src[j + 1] == '{' || src[j + 1] == '%' || src[j + 1] == '#')) {
                kind = src[j + 1] == '{' ? 1 : src[j + 1] == '%' ? 2 : 3;
                break;
            }
        }
        if (!kind)
            j = len;
        char mod = kind && j + 2 < len ? src[j + 2] : 0;
        size_t ts = i, te = j;
        if (strip_next)
            while (ts < te && is_ws(src[ts]))
                ts++;
        if (kind && mod == '-') {
            while (te > ts && is_ws(src[te - 1]))
                te--;
        } else if ((kind == 2 || kind == 3) && mod != '+') {
            /* lstrip_blocks: spaces and tabs from the line start to the tag. */
            size_t l = te;
            while (l > ts && (src[l - 1] == ' ' || src[l - 1] == '\t'))
                l--;
            if ((l > ts && src[l - 1] == '\n') || (l == ts && (ts == 0 || src[ts - 1] == '\n')))
                te = l;
        }
        if (te > ts) {
            tok t = {T_TEXT, line, src + ts, te - ts, 0, 0};
            if (!push(p, t))
                break;
        }
        line += count_lines(src + i, j - i);
        if (!kind)
            break;
        i = j + 2 + (mod == '-' || mod == '+');
        strip_next = 0;
        int tag_line = line;
        if (kind == 3) {
            size_t k = i;
            while (k + 1 < len && !(src[k] == '#' && src[k + 1] == '}'))
                k++;
            if (k + 1 >= len)
                return fail(p, KVQ_ERR_FORMAT, tag_line, "%s", "unterminated comment");
            line += count_lines(src + i, k - i);
            char before = k > i ? src[k - 1] : 0;
            strip_next = before == '-';
            i = k + 2;
            if (before != '-' && before != '+' && i < len && src[i] == '\n')
                i++; /* trim_blocks */
            continue;
        }
        tok open = {kind == 1 ? T_VAR : T_BLOCK, tag_line, NULL, 0, 0, 0};
        if (!push(p, open))
            break;
        lex_tag(p, src, len, &i, &line, kind == 2);
        if (p->st)
            break;
        if (i >= len)
            return fail(p, KVQ_ERR_FORMAT, tag_line, "%s", kind == 1 ? "'{{' without '}}'" : "'{%' without '%}'");
        char endmod = src[i] == '-' || src[i] == '+' ? src[i] : 0;
        i += 2 + (endmod != 0);
        strip_next = endmod == '-';
        if (kind == 2 && !endmod && i < len && src[i] == '\n')
            i++; /* trim_blocks */
        tok close = {kind == 1 ? T_VAR_END : T_BLOCK_END, line, NULL, 0, 0, 0};
        if (!push(p, close))
            break;
    }
    tok eof = {T_EOF, line, NULL, 0, 0, 0};
    push(p, eof);
    return p->st;
}

/* ---- parser helpers ---- */

static tok *peek(parser *p)
{
    return &p->toks[p->pos];
}

static int is_name(const tok *t, const char *s)
{
    return t->k == T_NAME && t->n == strlen(s) && memcmp(t->s, s, t->n) == 0;
}

static int is_op(const tok *t, const char *s)
{
    return t->k == T_OP && t->n == strlen(s) && memcmp(t->s, s, t->n) == 0;
}

static int accept_op(parser *p, const char *s)
{
    if (is_op(peek(p), s)) {
        p->pos++;
        return 1;
    }
    return 0;
}

static int accept_name(parser *p, const char *s)
{
    if (is_name(peek(p), s)) {
        p->pos++;
        return 1;
    }
    return 0;
}

static const char *tok_text(parser *p, const tok *t)
{
    static const char *names[] = {"text", "'{{'", "'}}'", "'{%'", "'%}'", "name", "string", "number", "number",
                                  "operator", "end of template"};
    (void)p;
    return names[t->k];
}

static int expect_op(parser *p, const char *s)
{
    if (accept_op(p, s))
        return 1;
    char what[64];
    snprintf(what, sizeof what, "'%s'", s);
    fail(p, KVQ_ERR_FORMAT, peek(p)->line, "expected %s", what);
    return 0;
}

static const char *name_dup(parser *p, const tok *t)
{
    char *s = ch_strdup(&p->t->arena, t->s, t->n);
    if (!s)
        fail(p, KVQ_ERR_NOMEM, t->line, "%s", "out of memory");
    return s;
}

static ch_expr *mk(parser *p, ch_ekind k, int line)
{
    ch_expr *e = ch_alloc(&p->t->arena, sizeof *e);
    if (!e) {
        fail(p, KVQ_ERR_NOMEM, line, "%s", "out of memory");
        return NULL;
    }
    e->k = k;
    e->line = line;
    return e;
}

static int add_arg(parser *p, ch_expr *e, ch_expr *arg, const char *kw)
{
    ch_expr **na = ch_alloc(&p->t->arena, (size_t)(e->nargs + 1) * sizeof *na);
    const char **nk = ch_alloc(&p->t->arena, (size_t)(e->nargs + 1) * sizeof *nk);
    if (!na || !nk) {
        fail(p, KVQ_ERR_NOMEM, e->line, "%s", "out of memory");
        return 0;
    }
    if (e->nargs) {
        memcpy(na, e->args, (size_t)e->nargs * sizeof *na);
        memcpy(nk, e->kw, (size_t)e->nargs * sizeof *nk);
    }
    na[e->nargs] = arg;
    nk[e->nargs] = kw;
    e->args = na;
    e->kw = nk;
    e->nargs++;
    return 1;
}

static ch_expr *parse_expr(parser *p);
static ch_expr *parse_or(parser *p);
static ch_expr *parse_unary(parser *p);
static int enter(parser *p);

/* "(" args ")" with keyword arguments; the "(" is consumed already. */
static void parse_args(parser *p, ch_expr *e)
{
    while (!p->st && !accept_op(p, ")")) {
        const char *kw = NULL;
        if (peek(p)->k == T_NAME && is_op(&p->toks[p->pos + 1], "=")) {
            kw = name_dup(p, peek(p));
            p->pos += 2;
        }
        ch_expr *a = parse_expr(p);
        if (!a || !add_arg(p, e, a, kw))
            return;
        if (!is_op(peek(p), ")") && !expect_op(p, ","))
            return;
    }
}

static ch_expr *parse_primary(parser *p)
{
    tok *t = peek(p);
    ch_expr *e;
    if (t->k == T_STR || t->k == T_INT || t->k == T_FLOAT) {
        p->pos++;
        if (!(e = mk(p, E_LIT, t->line)))
            return NULL;
        if (t->k == T_STR) {
            e->lit.t = V_STR;
            e->lit.u.s.s = t->s;
            e->lit.u.s.n = t->n;
            /* Adjacent string literals concatenate, as in Python. */
            while (peek(p)->k == T_STR) {
                tok *u = peek(p);
                char *s = ch_alloc(&p->t->arena, e->lit.u.s.n + u->n + 1);
                if (!s)
                    return NULL;
                memcpy(s, e->lit.u.s.s, e->lit.u.s.n);
                memcpy(s + e->lit.u.s.n, u->s, u->n);
                e->lit.u.s.s = s;
                e->lit.u.s.n += u->n;
                p->pos++;
            }
        } else if (t->k == T_INT) {
            e->lit.t = V_INT;
            e->lit.u.i = t->i;
        } else {
            e->lit.t = V_FLOAT;
            e->lit.u.f = t->f;
        }
        return e;
    }
    if (t->k == T_NAME) {
        p->pos++;
        if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") || is_name(t, "False")) {
            if ((e = mk(p, E_LIT, t->line))) {
                e->lit.t = V_BOOL;
                e->lit.u.b = t->s[0] == 't' || t->s[0] == 'T';
            }
            return e;
        }
        if (is_name(t, "none") || is_name(t, "None")) {
            if ((e = mk(p, E_LIT, t->line)))
                e->lit.t = V_NONE;
            return e;
        }
        if ((e = mk(p, E_NAME, t->line)))
            e->name = name_dup(p, t);
        return e;
    }
    if (accept_op(p, "(")) {
        ch_expr *first = parse_expr(p);
        if (!first)
            return NULL;
        if (accept_op(p, ")"))
            return first;
        /* A tuple: a list that prints with parentheses (negate marks it). */
        if (!(e = mk(p, E_LIST, t->line)) || !add_arg(p, e, first, NULL))
            return NULL;
        e->negate = 1;
        while (!p->st && accept_op(p, ",")) {
            if (is_op(peek(p), ")"))
                break;
            ch_expr *x = parse_expr(p);
            if (!x || !add_arg(p, e, x, NULL))
                return NULL;
        }
        return expect_op(p, ")") ? e : NULL;
    }
    if (accept_op(p, "[")) {
        if (!(e = mk(p, E_LIST, t->line)))
            return NULL;
        while (!p->st && !accept_op(p, "]")) {
            ch_expr *x = parse_expr(p);
            if (!x || !add_arg(p, e, x, NULL))
                return NULL;
            if (!is_op(peek(p), "]") && !expect_op(p, ","))
                return NULL;
        }
        return p->st ? NULL : e;
    }
    if (accept_op(p, "{")) {
        if (!(e = mk(p, E_DICT, t->line)))
            return NULL;
        while (!p->st && !accept_op(p, "}")) {
            ch_expr *k = parse_expr(p);
            if (!k || !expect_op(p, ":"))
                return NULL;
            ch_expr *v = parse_expr(p);
            if (!v || !add_arg(p, e, k, NULL) || !add_arg(p, e, v, NULL))
                return NULL;
            if (!is_op(peek(p), "}") && !expect_op(p, ","))
                return NULL;
        }
        return p->st ? NULL : e;
    }
    fail(p, KVQ_ERR_FORMAT, t->line, "unexpected %s in an expression", tok_text(p, t));
    return NULL;
}

static ch_expr *parse_postfix(parser *p)
{
    ch_expr *e = parse_primary(p);
    while (e && !p->st) {
        tok *t = peek(p);
        if (accept_op(p, ".")) {
            tok *n = peek(p);
            ch_expr *x = mk(p, E_ATTR, t->line);
            if (!x)
                return NULL;
            if (n->k == T_NAME) {
                x->name = name_dup(p, n);
            } else if (n->k == T_INT) { /* x.0 is x[0] */
                x->k = E_INDEX;
                if (!(x->b = mk(p, E_LIT, t->line)))
                    return NULL;
                x->b->lit.t = V_INT;
                x->b->lit.u.i = n->i;
            } else {
                fail(p, KVQ_ERR_FORMAT, n->line, "%s", "expected a name after '.'");
                return NULL;
            }
            p->pos++;
            x->a = e;
            e = x;
        } else if (accept_op(p, "[")) {
            /* Index or slice a[b:c:d]. */
            ch_expr *parts[3] = {NULL, NULL, NULL};
            int colons = 0;
            while (!p->st && !is_op(peek(p), "]")) {
                if (accept_op(p, ":")) {
                    if (++colons > 2) {
                        fail(p, KVQ_ERR_FORMAT, t->line, "%s", "too many ':' in a slice");
                        return NULL;
                    }
                    continue;
                }
                if (parts[colons]) {
                    fail(p, KVQ_ERR_FORMAT, t->line, "%s", "bad subscript");
                    return NULL;
                }
                if (!(parts[colons] = parse_expr(p)))
                    return NULL;
            }
            if (!expect_op(p, "]"))
                return NULL;
            ch_expr *x = mk(p, colons ? E_SLICE : E_INDEX, t->line);
            if (!x)
                return NULL;
            x->a = e;
            x->b = parts[0];
            x->c = parts[1];
            if (colons && !add_arg(p, x, parts[2], NULL))
                return NULL;
            if (!colons && !parts[0]) {
                fail(p, KVQ_ERR_FORMAT, t->line, "%s", "empty subscript");
                return NULL;
            }
            e = x;
        } else if (accept_op(p, "(")) {
            ch_expr *x = mk(p, E_CALL, t->line);
            if (!x)
                return NULL;
            x->a = e;
            parse_args(p, x);
            e = p->st ? NULL : x;
        } else {
            break;
        }
    }
    return e;
}

/* Filters and tests after a unary expression. */
static ch_expr *parse_filters(parser *p, ch_expr *e)
{
    while (e && !p->st) {
        tok *t = peek(p);
        if (accept_op(p, "|")) {
            tok *n = peek(p);
            if (n->k != T_NAME) {
                fail(p, KVQ_ERR_FORMAT, n->line, "%s", "expected a filter name after '|'");
                return NULL;
            }
            p->pos++;
            ch_expr *x = mk(p, E_FILTER, t->line);
            if (!x)
                return NULL;
            x->name = name_dup(p, n);
            x->a = e;
            if (accept_op(p, "("))
                parse_args(p, x);
            e = p->st ? NULL : x;
        } else if (accept_name(p, "is")) {
            ch_expr *x = mk(p, E_TEST, t->line);
            if (!x)
                return NULL;
            x->negate = accept_name(p, "not");
            tok *n = peek(p);
            if (n->k != T_NAME) {
                fail(p, KVQ_ERR_FORMAT, n->line, "%s", "expected a test name after 'is'");
                return NULL;
            }
            p->pos++;
            x->name = name_dup(p, n);
            x->a = e;
            if (accept_op(p, "(")) {
                parse_args(p, x);
            } else {
                /* One argument without parentheses: "is divisibleby 3", "is equalto x". */
                tok *u = peek(p);
                if (u->k == T_STR || u->k == T_INT || u->k == T_FLOAT ||
                    (u->k == T_NAME && !is_name(u, "and") && !is_name(u, "or") && !is_name(u, "else") &&
                     !is_name(u, "if") && !is_name(u, "is") && !is_name(u, "in") && !is_name(u, "not"))) {
                    ch_expr *arg = parse_primary(p);
                    if (!arg || !add_arg(p, x, arg, NULL))
                        return NULL;
                }
            }
            e = p->st ? NULL : x;
        } else {
            break;
        }
    }
    return e;
}

/* As Jinja: "-x|abs" is (-x)|abs - the filters apply after the sign. */
static ch_expr *parse_unary_f(parser *p, int with_filter)
{
    tok *t = peek(p);
    ch_expr *e;
    if (accept_op(p, "-") || accept_op(p, "+")) {
        if (!(e = mk(p, t->s[0] == '-' ? E_NEG : E_POS, t->line)))
            return NULL;
        e->a = enter(p) ? parse_unary_f(p, 0) : NULL;
        p->depth--;
        if (!e->a)
            return NULL;
    } else {
        e = parse_postfix(p);
    }
    return with_filter ? parse_filters(p, e) : e;
}

static ch_expr *parse_unary(parser *p)
{
    return parse_unary_f(p, 1);
}

static ch_expr *bin(parser *p, int op, ch_expr *a, ch_expr *b, int line)
{
    if (!a || !b)
        return NULL;
    ch_expr *x = mk(p, E_BIN, line);
    if (x) {
        x->op = op;
        x->a = a;
        x->b = b;
    }
    return x;
}

static ch_expr *parse_pow(parser *p)
{
    ch_expr *e = parse_unary(p);
    while (e && is_op(peek(p), "**")) {
        int line = peek(p)->line;
        p->pos++;
        e = bin(p, OP_POW, e, parse_unary(p), line);
    }
    return e;
}

static ch_expr *parse_mul(parser *p)
{
    ch_expr *e = parse_pow(p);
    for (;;) {
        tok *t = peek(p);
        int op = is_op(t, "*") ? OP_MUL : is_op(t, "/") ? OP_DIV : is_op(t, "//") ? OP_FLOORDIV
                 : is_op(t, "%") ? OP_MOD : -1;
        if (!e || op < 0)
            return e;
        p->pos++;
        e = bin(p, op, e, parse_pow(p), t->line);
    }
}

static ch_expr *parse_add(parser *p)
{
    ch_expr *e = parse_mul(p);
    for (;;) {
        tok *t = peek(p);
        int op = is_op(t, "+") ? OP_ADD : is_op(t, "-") ? OP_SUB : -1;
        if (!e || op < 0)
            return e;
        p->pos++;
        e = bin(p, op, e, parse_mul(p), t->line);
    }
}

static ch_expr *parse_concat(parser *p)
{
    ch_expr *e = parse_add(p);
    while (e && is_op(peek(p), "~")) {
        int line = peek(p)->line;
        p->pos++;
        e = bin(p, OP_CONCAT, e, parse_add(p), line);
    }
    return e;
}

static ch_expr *parse_compare(parser *p)
{
    ch_expr *e = parse_concat(p);
    for (;;) {
        tok *t = peek(p);
        int op = is_op(t, "==") ? OP_EQ : is_op(t, "!=") ? OP_NE : is_op(t, "<") ? OP_LT : is_op(t, ">") ? OP_GT
                 : is_op(t, "<=") ? OP_LE : is_op(t, ">=") ? OP_GE : is_name(t, "in") ? OP_IN : -1;
        if (op < 0 && is_name(t, "not") && is_name(&p->toks[p->pos + 1], "in")) {
            op = OP_NOTIN;
            p->pos++;
        }
        if (!e || op < 0)
            return e;
        p->pos++;
        e = bin(p, op, e, parse_concat(p), t->line);
    }
}

static ch_expr *parse_not(parser *p)
{
    tok *t = peek(p);
    if (accept_name(p, "not")) {
        ch_expr *x = mk(p, E_NOT, t->line);
        if (!x)
            return NULL;
        x->a = enter(p) ? parse_not(p) : NULL;
        p->depth--;
        return x->a ? x : NULL;
    }
    return parse_compare(p);
}

static ch_expr *parse_and(parser *p)
{
    ch_expr *e = parse_not(p);
    while (e && is_name(peek(p), "and")) {
        int line = peek(p)->line;
        p->pos++;
        ch_expr *x = mk(p, E_AND, line);
        if (!x || !(x->b = parse_not(p)))
            return NULL;
        x->a = e;
        e = x;
    }
    return e;
}

static ch_expr *parse_or(parser *p)
{
    ch_expr *e = parse_and(p);
    while (e && is_name(peek(p), "or")) {
        int line = peek(p)->line;
        p->pos++;
        ch_expr *x = mk(p, E_OR, line);
        if (!x || !(x->b = parse_and(p)))
            return NULL;
        x->a = e;
        e = x;
    }
    return e;
}

static ch_expr *parse_expr_inner(parser *p);

static int enter(parser *p)
{
    if (++p->depth > MAX_DEPTH) {
        fail(p, KVQ_ERR_UNSUPPORTED, peek(p)->line, "nesting deeper than %d levels", MAX_DEPTH);
        return 0;
    }
    return 1;
}

static ch_expr *parse_expr(parser *p)
{
    ch_expr *e = enter(p) ? parse_expr_inner(p) : NULL;
    p->depth--;
    return e;
}

static ch_expr *parse_expr_inner(parser *p)
{
    ch_expr *e = parse_or(p);
    if (e && is_name(peek(p), "if")) {
        int line = peek(p)->line;
        p->pos++;
        ch_expr *x = mk(p, E_COND, line);
        if (!x || !(x->b = parse_or(p)))
            return NULL;
        x->a = e;
        if (accept_name(p, "else") && !(x->c = parse_expr(p)))
            return NULL;
        e = x;
    }
    return e;
}

/* ---- statements ---- */

static int body_add(parser *p, ch_body *b, ch_node *n)
{
    ch_node **nn = ch_alloc(&p->t->arena, (size_t)(b->count + 1) * sizeof *nn);
    if (!nn) {
        fail(p, KVQ_ERR_NOMEM, n->line, "%s", "out of memory");
        return 0;
    }
    if (b->count)
        memcpy(nn, b->n, (size_t)b->count * sizeof *nn);
    nn[b->count++] = n;
    b->n = nn;
    return 1;
}

static ch_node *mknode(parser *p, ch_skind k, int line)
{
    ch_node *n = ch_alloc(&p->t->arena, sizeof *n);
    if (!n)
        fail(p, KVQ_ERR_NOMEM, line, "%s", "out of memory");
    else {
        n->k = k;
        n->line = line;
    }
    return n;
}

static int end_tag(parser *p)
{
    if (peek(p)->k == T_BLOCK_END) {
        p->pos++;
        return 1;
    }
    fail(p, KVQ_ERR_FORMAT, peek(p)->line, "expected '%%}', found %s", tok_text(p, peek(p)));
    return 0;
}

/* Parses nodes into body until a block tag whose keyword is in stops
 * ("endfor|else" ...); leaves the position on that keyword. *stop gets it. */
static void parse_body(parser *p, ch_body *body, const char *const *stops, const char **stop);

static void parse_if(parser *p, ch_node *n)
{
    for (;;) {
        ch_expr *c = parse_expr(p);
        if (!c || !end_tag(p))
            return;
        ch_expr **nc = ch_alloc(&p->t->arena, (size_t)(n->n_branches + 1) * sizeof *nc);
        ch_body *nb = ch_alloc(&p->t->arena, (size_t)(n->n_branches + 1) * sizeof *nb);
        if (!nc || !nb) {
            fail(p, KVQ_ERR_NOMEM, n->line, "%s", "out of memory");
            return;
        }
        if (n->n_branches) {
            memcpy(nc, n->conds, (size_t)n->n_branches * sizeof *nc);
            memcpy(nb, n->bodies, (size_t)n->n_branches * sizeof *nb);
        }
        nc[n->n_branches] = c;
        n->conds = nc;
        n->bodies = nb;
        static const char *const stops[] = {"elif", "else", "endif", NULL};
        const char *stop = NULL;
        parse_body(p, &n->bodies[n->n_branches++], stops, &stop);
        if (p->st)
            return;
        if (strcmp(stop, "elif") == 0)
            continue;
        if (strcmp(stop, "else") == 0) {
            static const char *const end[] = {"endif", NULL};
            if (!end_tag(p))
                return;
            parse_body(p, &n->else_body, end, &stop);
        }
        end_tag(p);
        return;
    }
}

static void parse_for(parser *p, ch_node *n)
{
    for (int k = 0; k < 2; k++) {
        tok *t = peek(p);
        if (t->k != T_NAME) {
            fail(p, KVQ_ERR_FORMAT, t->line, "%s", "expected a loop variable");
            return;
        }
        n->var[k] = name_dup(p, t);
        p->pos++;
        if (!accept_op(p, ","))
            break;
    }
    if (!accept_name(p, "in")) {
        fail(p, KVQ_ERR_FORMAT, peek(p)->line, "%s", "expected 'in' in a for loop");
        return;
    }
    if (!(n->e = parse_or(p)))
        return;
    if (accept_name(p, "if") && !(n->cond = parse_or(p)))
        return;
    if (is_name(peek(p), "recursive")) {
        fail(p, KVQ_ERR_UNSUPPORTED, peek(p)->line, "%s", "recursive loops are not supported");
        return;
    }
    if (!end_tag(p))
        return;
    n->bodies = ch_alloc(&p->t->arena, sizeof *n->bodies);
    if (!n->bodies) {
        fail(p, KVQ_ERR_NOMEM, n->line, "%s", "out of memory");
        return;
    }
    static const char *const stops[] = {"else", "endfor", NULL};
    const char *stop = NULL;
    parse_body(p, &n->bodies[0], stops, &stop);
    if (p->st)
        return;
    if (strcmp(stop, "else") == 0) {
        static const char *const end[] = {"endfor", NULL};
        if (!end_tag(p))
            return;
        parse_body(p, &n->else_body, end, &stop);
    }
    end_tag(p);
}

static void parse_set(parser *p, ch_node *n)
{
    tok *t = peek(p);
    if (t->k != T_NAME) {
        fail(p, KVQ_ERR_FORMAT, t->line, "%s", "expected a name after 'set'");
        return;
    }
    n->var[0] = name_dup(p, t);
    p->pos++;
    if (accept_op(p, ".")) {
        tok *a = peek(p);
        if (a->k != T_NAME) {
            fail(p, KVQ_ERR_FORMAT, a->line, "%s", "expected an attribute name");
            return;
        }
        n->var[1] = name_dup(p, a);
        p->pos++;
    }
    if (is_op(peek(p), ",")) {
        fail(p, KVQ_ERR_UNSUPPORTED, t->line, "%s", "'set' with several targets is not supported");
        return;
    }
    if (accept_op(p, "=")) {
        if ((n->e = parse_expr(p)))
            end_tag(p);
        return;
    }
    /* {% set x %}...{% endset %} */
    if (!end_tag(p))
        return;
    n->k = S_SETBLOCK;
    n->bodies = ch_alloc(&p->t->arena, sizeof *n->bodies);
    if (!n->bodies) {
        fail(p, KVQ_ERR_NOMEM, n->line, "%s", "out of memory");
        return;
    }
    static const char *const stops[] = {"endset", NULL};
    const char *stop;
    parse_body(p, &n->bodies[0], stops, &stop);
    if (!p->st)
        end_tag(p);
}

static void parse_body_inner(parser *p, ch_body *body, const char *const *stops, const char **stop);

static void parse_body(parser *p, ch_body *body, const char *const *stops, const char **stop)
{
    if (enter(p))
        parse_body_inner(p, body, stops, stop);
    p->depth--;
}

static void parse_body_inner(parser *p, ch_body *body, const char *const *stops, const char **stop)
{
    while (!p->st) {
        tok *t = peek(p);
        if (t->k == T_EOF) {
            if (stops) {
                const char *last = stops[0];
                for (int k = 0; stops[k]; k++)
                    last = stops[k];
                fail(p, KVQ_ERR_FORMAT, t->line, "missing '{%% %s %%}'", last);
            }
            return;
        }
        if (t->k == T_TEXT) {
            ch_node *n = mknode(p, S_TEXT, t->line);
            if (!n)
                return;
            n->text = t->s;
            n->len = t->n;
            body_add(p, body, n);
            p->pos++;
            continue;
        }
        if (t->k == T_VAR) {
            p->pos++;
            ch_node *n = mknode(p, S_OUT, t->line);
            if (!n || !(n->e = parse_expr(p)))
                return;
            if (peek(p)->k != T_VAR_END) {
                fail(p, KVQ_ERR_FORMAT, peek(p)->line, "expected '}}', found %s", tok_text(p, peek(p)));
                return;
            }
            p->pos++;
            body_add(p, body, n);
            continue;
        }
        if (t->k != T_BLOCK) {
            fail(p, KVQ_ERR_FORMAT, t->line, "unexpected %s", tok_text(p, t));
            return;
        }
        tok *kw = &p->toks[p->pos + 1];
        if (kw->k != T_NAME) {
            fail(p, KVQ_ERR_FORMAT, kw->line, "%s", "expected a statement after '{%'");
            return;
        }
        for (int k = 0; stops && stops[k]; k++)
            if (is_name(kw, stops[k])) {
                *stop = stops[k];
                p->pos += 2;
                return;
            }
        p->pos += 2;
        ch_node *n = NULL;
        if (is_name(kw, "if")) {
            if ((n = mknode(p, S_IF, kw->line)))
                parse_if(p, n);
        } else if (is_name(kw, "for")) {
            if ((n = mknode(p, S_FOR, kw->line)))
                parse_for(p, n);
        } else if (is_name(kw, "set")) {
            if ((n = mknode(p, S_SET, kw->line)))
                parse_set(p, n);
        } else if (is_name(kw, "break") || is_name(kw, "continue")) {
            if ((n = mknode(p, kw->s[0] == 'b' ? S_BREAK : S_CONTINUE, kw->line)))
                end_tag(p);
        } else if (is_name(kw, "generation")) {
            /* transformers' {% generation %}: marks assistant text; renders its body. */
            if ((n = mknode(p, S_BLOCK, kw->line)) && end_tag(p) &&
                (n->bodies = ch_alloc(&p->t->arena, sizeof *n->bodies))) {
                static const char *const stops2[] = {"endgeneration", NULL};
                const char *st2;
                parse_body(p, &n->bodies[0], stops2, &st2);
                if (!p->st)
                    end_tag(p);
            }
        } else {
            char what[48];
            snprintf(what, sizeof what, "%.*s", (int)(kw->n < 40 ? kw->n : 40), kw->s);
            int known_end = strncmp(what, "end", 3) == 0 || strcmp(what, "elif") == 0 || strcmp(what, "else") == 0;
            fail(p, known_end ? KVQ_ERR_FORMAT : KVQ_ERR_UNSUPPORTED, kw->line,
                 known_end ? "unexpected '{%% %s %%}'" : "'{%% %s %%}' is not supported by kvq's Jinja subset", what);
            return;
        }
        if (!n || p->st)
            return;
        body_add(p, body, n);
    }
}

kvq_status ch_parse(kvq_chat_template *t, const char *src, size_t len, kvq_error *err)
{
    parser p = {t, err, NULL, 0, 0, 0, KVQ_OK, 0};
    if (!lex(&p, src, len)) {
        const char *stop = NULL;
        parse_body(&p, &t->root, NULL, &stop);
    }
    free(p.toks);
    return p.st;
}
