/* chat_parse.c - Jinja template source -> syntax tree (chat_internal.h).
 *
 * Tokens come from chat_lex.c. The parser is recursive descent with Jinja's
 * precedence:
 *   a if c else b  <  or  <  and  <  not  <  comparisons, in, not in
 *   <  ~  <  + -  <  * / // %  <  **  <  unary - +  <  filters | and tests is
 *   <  postfix . [] ()  <  literals, names, ( ), [ ], { }.
 */
#include "chat_lex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    ch_fail_at(p, KVQ_ERR_FORMAT, peek(p)->line, "expected %s", what);
    return 0;
}

static const char *name_dup(parser *p, const tok *t)
{
    char *s = ch_strdup(&p->t->arena, t->s, t->n);
    if (!s)
        ch_fail_at(p, KVQ_ERR_NOMEM, t->line, "%s", "out of memory");
    return s;
}

static ch_expr *mk(parser *p, ch_ekind k, int line)
{
    ch_expr *e = ch_alloc(&p->t->arena, sizeof *e);
    if (!e) {
        ch_fail_at(p, KVQ_ERR_NOMEM, line, "%s", "out of memory");
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
        ch_fail_at(p, KVQ_ERR_NOMEM, e->line, "%s", "out of memory");
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
    ch_fail_at(p, KVQ_ERR_FORMAT, t->line, "unexpected %s in an expression", tok_text(p, t));
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
                ch_fail_at(p, KVQ_ERR_FORMAT, n->line, "%s", "expected a name after '.'");
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
                        ch_fail_at(p, KVQ_ERR_FORMAT, t->line, "%s", "too many ':' in a slice");
                        return NULL;
                    }
                    continue;
                }
                if (parts[colons]) {
                    ch_fail_at(p, KVQ_ERR_FORMAT, t->line, "%s", "bad subscript");
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
                ch_fail_at(p, KVQ_ERR_FORMAT, t->line, "%s", "empty subscript");
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
                ch_fail_at(p, KVQ_ERR_FORMAT, n->line, "%s", "expected a filter name after '|'");
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
                ch_fail_at(p, KVQ_ERR_FORMAT, n->line, "%s", "expected a test name after 'is'");
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
        ch_fail_at(p, KVQ_ERR_UNSUPPORTED, peek(p)->line, "nesting deeper than %d levels", MAX_DEPTH);
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
        ch_fail_at(p, KVQ_ERR_NOMEM, n->line, "%s", "out of memory");
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
        ch_fail_at(p, KVQ_ERR_NOMEM, line, "%s", "out of memory");
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
    ch_fail_at(p, KVQ_ERR_FORMAT, peek(p)->line, "expected '%%}', found %s", tok_text(p, peek(p)));
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
            ch_fail_at(p, KVQ_ERR_NOMEM, n->line, "%s", "out of memory");
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
            ch_fail_at(p, KVQ_ERR_FORMAT, t->line, "%s", "expected a loop variable");
            return;
        }
        n->var[k] = name_dup(p, t);
        p->pos++;
        if (!accept_op(p, ","))
            break;
    }
    if (!accept_name(p, "in")) {
        ch_fail_at(p, KVQ_ERR_FORMAT, peek(p)->line, "%s", "expected 'in' in a for loop");
        return;
    }
    if (!(n->e = parse_or(p)))
        return;
    if (accept_name(p, "if") && !(n->cond = parse_or(p)))
        return;
    if (is_name(peek(p), "recursive")) {
        ch_fail_at(p, KVQ_ERR_UNSUPPORTED, peek(p)->line, "%s", "recursive loops are not supported");
        return;
    }
    if (!end_tag(p))
        return;
    n->bodies = ch_alloc(&p->t->arena, sizeof *n->bodies);
    if (!n->bodies) {
        ch_fail_at(p, KVQ_ERR_NOMEM, n->line, "%s", "out of memory");
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
        ch_fail_at(p, KVQ_ERR_FORMAT, t->line, "%s", "expected a name after 'set'");
        return;
    }
    n->var[0] = name_dup(p, t);
    p->pos++;
    if (accept_op(p, ".")) {
        tok *a = peek(p);
        if (a->k != T_NAME) {
            ch_fail_at(p, KVQ_ERR_FORMAT, a->line, "%s", "expected an attribute name");
            return;
        }
        n->var[1] = name_dup(p, a);
        p->pos++;
    }
    if (is_op(peek(p), ",")) {
        ch_fail_at(p, KVQ_ERR_UNSUPPORTED, t->line, "%s", "'set' with several targets is not supported");
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
        ch_fail_at(p, KVQ_ERR_NOMEM, n->line, "%s", "out of memory");
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
                ch_fail_at(p, KVQ_ERR_FORMAT, t->line, "missing '{%% %s %%}'", last);
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
                ch_fail_at(p, KVQ_ERR_FORMAT, peek(p)->line, "expected '}}', found %s", tok_text(p, peek(p)));
                return;
            }
            p->pos++;
            body_add(p, body, n);
            continue;
        }
        if (t->k != T_BLOCK) {
            ch_fail_at(p, KVQ_ERR_FORMAT, t->line, "unexpected %s", tok_text(p, t));
            return;
        }
        tok *kw = &p->toks[p->pos + 1];
        if (kw->k != T_NAME) {
            ch_fail_at(p, KVQ_ERR_FORMAT, kw->line, "%s", "expected a statement after '{%'");
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
            ch_fail_at(p, known_end ? KVQ_ERR_FORMAT : KVQ_ERR_UNSUPPORTED, kw->line,
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
    if (!ch_lex(&p, src, len)) {
        const char *stop = NULL;
        parse_body(&p, &t->root, NULL, &stop);
    }
    free(p.toks);
    return p.st;
}

