/* chat_eval.h - the renderer's state and the helpers chat_eval.c and
 * chat_builtins.c share. */
#ifndef KVQ_CHAT_EVAL_H
#define KVQ_CHAT_EVAL_H

#include "chat_value.h"

typedef struct scope {
    ch_dict *vars;
    struct scope *up;
} scope;

enum { CTL_BREAK = 1, CTL_CONTINUE = 2 };

typedef struct rctx {
    ch_arena *a;
    kvq_error *err;
    kvq_status st;
    ch_sb out;
    scope *sc;
    int loop_ctl;
    int depth;
    uint64_t steps; /* nodes and expressions evaluated: a runaway template stops */
    int eval_depth;
} rctx;

/* Limits that turn a runaway template into an error instead of a hang or an
 * out-of-memory: evaluation steps, and bytes of output or of one string. */
#define CH_MAX_STEPS 1000000ull
#define CH_MAX_TEXT ((size_t)64 << 20)
#define CH_MAX_EVAL_DEPTH 1000

void ch_fail(rctx *r, kvq_status st, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
const char *ch_type_name(ch_val v);
int ch_truthy(ch_val v);
int ch_equal(ch_val a, ch_val b);
double ch_num(ch_val v);
int64_t ch_float_to_int(double d);
ch_val ch_list_new(rctx *r, size_t n);
ch_val ch_dict_new(rctx *r);
ch_val ch_str_copy(rctx *r, const char *s, size_t n);
ch_val ch_to_str(rctx *r, ch_val v);
size_t ch_cp_count(const char *s, size_t n);
size_t ch_cp_offset(const char *s, size_t n, size_t k);
ch_val *ch_lookup(rctx *r, const char *name);
ch_val ch_index(rctx *r, ch_val obj, ch_val idx, int line);
ch_val ch_eval(rctx *r, const ch_expr *e);

/* chat_builtins.c */
ch_val ch_global(const char *name); /* a global function, or undefined */
ch_val ch_call(rctx *r, const ch_expr *e);
ch_val ch_filter(rctx *r, const ch_expr *e);
int ch_test(rctx *r, const ch_expr *e); /* without the "not" */

#endif
