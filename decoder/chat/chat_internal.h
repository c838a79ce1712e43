/* chat_internal.h - the Jinja subset's values, syntax tree and arena, shared
 * by the parser (chat_parse.c), the evaluator (chat_eval.c, chat_builtins.c)
 * and the public entry points (chat.c). Nothing here is public API.
 */
#ifndef KVQ_CHAT_INTERNAL_H
#define KVQ_CHAT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kvq_chat.h"

/* ---- arena: everything of one parse or one render is freed at once ---- */
typedef struct ch_chunk ch_chunk;
typedef struct ch_arena {
    ch_chunk *head;
    int failed;   /* an allocation failed, or the cap below was reached */
    size_t total; /* bytes held */
} ch_arena;
/* One render (or parse) holds at most this much: hostile templates end in
 * KVQ_ERR_NOMEM instead of taking the machine's memory. */
#define CH_ARENA_CAP ((size_t)256 << 20)
void *ch_alloc(ch_arena *a, size_t n); /* zeroed; NULL (and a->failed) when out of memory */
char *ch_strdup(ch_arena *a, const char *s, size_t n);
void ch_arena_free(ch_arena *a);

/* ---- values ---- */
typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_FUNC } ch_type;

typedef struct ch_list ch_list;
typedef struct ch_dict ch_dict;
typedef struct ch_val {
    ch_type t;
    union {
        int b;
        int64_t i;
        double f;
        struct {
            const char *s;
            size_t n;
        } s;
        ch_list *l;
        ch_dict *d;
        int fn; /* global function id */
    } u;
} ch_val;

struct ch_list {
    size_t n;
    ch_val *v;
    int tuple; /* prints as (a, b): dict.items() pairs */
};
struct ch_dict {
    size_t n, cap;
    ch_val *k; /* string keys */
    ch_val *v;
    int is_ns; /* namespace(): its attributes may be set */
};

/* ---- syntax tree ---- */
typedef enum {
    E_LIT, E_NAME, E_LIST, E_DICT, E_ATTR, E_INDEX, E_SLICE, E_CALL, E_FILTER, E_TEST,
    E_NEG, E_POS, E_NOT, E_AND, E_OR, E_COND, E_BIN
} ch_ekind;

enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT, OP_EQ, OP_NE, OP_LT, OP_GT,
       OP_LE, OP_GE, OP_IN, OP_NOTIN };

typedef struct ch_expr ch_expr;
struct ch_expr {
    ch_ekind k;
    int line;
    int op;     /* E_BIN */
    int negate; /* E_TEST: is not */
    ch_val lit; /* E_LIT */
    const char *name; /* E_NAME, E_ATTR, E_FILTER, E_TEST */
    ch_expr *a, *b, *c; /* operands; E_SLICE: a[b:c:d] with d in args[0] */
    ch_expr **args;     /* E_LIST / E_DICT (k, v pairs) / calls / filters / tests */
    const char **kw;    /* keyword name per arg, or NULL */
    int nargs;
};

typedef enum { S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_BREAK, S_CONTINUE, S_BLOCK } ch_skind;

typedef struct ch_node ch_node;
typedef struct ch_body {
    ch_node **n;
    int count;
} ch_body;

struct ch_node {
    ch_skind k;
    int line;
    const char *text; /* S_TEXT */
    size_t len;
    ch_expr *e;        /* S_OUT, S_SET value, S_FOR iterable */
    ch_expr *cond;     /* S_FOR filter */
    const char *var[2]; /* S_FOR targets (var[1] for "a, b"); S_SET(BLOCK): name, attribute */
    ch_expr **conds;   /* S_IF: one per branch */
    ch_body *bodies;   /* S_IF branches; S_FOR/S_SETBLOCK/S_BLOCK: bodies[0] */
    int n_branches;
    ch_body else_body; /* S_IF, S_FOR */
};

struct kvq_chat_template {
    ch_arena arena;
    ch_body root;
    char *bos, *eos; /* from tokenizer_config.json, or NULL */
};

/* Parses src into t->root (t->arena). */
kvq_status ch_parse(kvq_chat_template *t, const char *src, size_t len, kvq_error *err);

/* Renders with the variables in globals (a dict). */
kvq_status ch_render(const kvq_chat_template *t, ch_arena *a, ch_dict *globals, char **out, size_t *len,
                     kvq_error *err);

/* Dict helpers (string keys). */
ch_val *ch_dict_get(const ch_dict *d, const char *k, size_t kn);
int ch_dict_set(ch_arena *a, ch_dict *d, const char *k, size_t kn, ch_val v);
ch_val ch_str(const char *s, size_t n);

/* The global functions. */
enum { FN_NAMESPACE, FN_RANGE, FN_RAISE, FN_STRFTIME, FN_DICT };

#endif /* KVQ_CHAT_INTERNAL_H */
