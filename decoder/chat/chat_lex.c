/* chat_lex.c - Jinja template source -> tokens. Whitespace follows Jinja
 * with the settings transformers uses for chat templates: trim_blocks (the
 * newline after a block tag goes), lstrip_blocks (spaces before a block tag
 * on its own line go), and the '-' / '+' modifiers on either side of a tag.
 */
#include "chat_lex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvq_status ch_fail_at(parser *p, kvq_status st, int line, const char *fmt, ...)
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
            ch_fail_at(p, KVQ_ERR_NOMEM, t.line, "%s", "out of memory");
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
                ch_fail_at(p, KVQ_ERR_NOMEM, *line, "%s", "out of memory");
                break;
            }
            size_t w = 0, j = i + 1;
            while (j < len && src[j] != c) {
                if (src[j] == '\n')
                    (*line)++;
                if (src[j] == '\\' && j + 1 < len) {
                    char e = src[++j];
                    if (e == '\n')
                        (*line)++; /* a line continuation is still a line of the source */
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
                ch_fail_at(p, KVQ_ERR_FORMAT, t.line, "%s", "unterminated string literal");
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
                ch_fail_at(p, KVQ_ERR_FORMAT, *line, "unexpected character '%s'", what);
                break;
            }
            i += t.n;
        }
        if (!push(p, t))
            break;
    }
    *ip = i;
}

kvq_status ch_lex(parser *p, const char *src, size_t len)
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
                return ch_fail_at(p, KVQ_ERR_FORMAT, tag_line, "%s", "unterminated comment");
            line += count_lines(src + i, k - i);
            char before = k > i ? src[k - 1] : 0;
            strip_next = before == '-';
            i = k + 2;
            if (before != '-' && before != '+' && i < len && src[i] == '\n') {
                i++; /* trim_blocks: the newline goes from the text, not from the line count */
                line++;
            }
            continue;
        }
        tok open = {kind == 1 ? T_VAR : T_BLOCK, tag_line, NULL, 0, 0, 0};
        if (!push(p, open))
            break;
        lex_tag(p, src, len, &i, &line, kind == 2);
        if (p->st)
            break;
        if (i >= len)
            return ch_fail_at(p, KVQ_ERR_FORMAT, tag_line, "%s", kind == 1 ? "'{{' without '}}'" : "'{%' without '%}'");
        char endmod = src[i] == '-' || src[i] == '+' ? src[i] : 0;
        i += 2 + (endmod != 0);
        strip_next = endmod == '-';
        tok close = {kind == 1 ? T_VAR_END : T_BLOCK_END, line, NULL, 0, 0, 0};
        if (!push(p, close))
            break;
        /* trim_blocks. Lines are counted over the source between tags
         * (from i), so a newline skipped here is counted here: missing it
         * put every error after N block tags N lines early. */
        if (kind == 2 && !endmod && i < len && src[i] == '\n') {
            i++;
            line++;
        }
    }
    tok eof = {T_EOF, line, NULL, 0, 0, 0};
    push(p, eof);
    return p->st;
}

/* ---- parser helpers ---- */

