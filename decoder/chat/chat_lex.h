/* chat_lex.h - tokens of a Jinja template and the parser state they feed;
 * chat_lex.c makes them (with Jinja's whitespace rules), chat_parse.c reads
 * them. Nothing here is public API.
 */
#ifndef KVQ_CHAT_LEX_H
#define KVQ_CHAT_LEX_H

#include "chat_internal.h"

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

/* Records the first error (one line naming the line of the template). @return it. */
kvq_status ch_fail_at(parser *p, kvq_status st, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
/* Splits src into p->toks (text, tag markers, names, literals, operators). */
kvq_status ch_lex(parser *p, const char *src, size_t len);

#endif /* KVQ_CHAT_LEX_H */
