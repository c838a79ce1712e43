/* chat_value.h - output buffers and value printing (chat_value.c). */
#ifndef KVQ_CHAT_VALUE_H
#define KVQ_CHAT_VALUE_H

#include "chat_internal.h"

/* No one buffer grows past this (the renderer reports it as out of memory). */
#define CH_SB_CAP ((size_t)64 << 20)

typedef struct ch_sb {
    char *s;
    size_t n, cap;
    int failed;
} ch_sb;
int sb_put(ch_sb *b, const char *s, size_t n);
int sb_puts(ch_sb *b, const char *s);

/* str(v) as Jinja prints it (undefined prints nothing). */
void ch_put_str(ch_sb *b, ch_val v);
/* repr(v): lists and dicts print their items this way. */
void ch_put_repr(ch_sb *b, ch_val v);

typedef struct ch_json_opts {
    int indent; /* -1: none */
    int ascii, sort_keys;
    const char *item_sep, *key_sep; /* NULL: json.dumps defaults */
} ch_json_opts;
/* json.dumps(v). @return 0 when v holds something JSON cannot spell. */
int ch_put_json(ch_sb *b, ch_val v, const ch_json_opts *o, int depth);

#endif
