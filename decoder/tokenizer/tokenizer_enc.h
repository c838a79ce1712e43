/* tokenizer_enc.h - the per-call encoding state shared by the encoder's
 * files: tokenizer_encode.c (added tokens, the driver, the public calls),
 * tokenizer_pretok.c (normalizers, pre-tokenizers) and tokenizer_bpe.c (BPE).
 * Nothing here is public API.
 */
#ifndef KVQ_TOKENIZER_ENC_H
#define KVQ_TOKENIZER_ENC_H

#include "tokenizer_internal.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

typedef struct span {
    size_t off, len;
    int origin; /* starts at offset 0 of the caller's text */
} span;

typedef struct sym {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    int alive;
} sym;

typedef struct cand {
    int32_t rank, pos, id;
} cand;

/* One piece of a split: [start, end) and whether the pattern matched it. */
typedef struct piece {
    size_t start, end;
    int match;
} piece;

typedef struct enc {
    const kvq_tokenizer *t;
    int32_t *ids;
    size_t n_ids, cap_ids;
    char *buf[2];   /* ping-pong text buffers for normalizer / pre-tokenizer steps */
    size_t cap[2];
    span *spans[2];
    size_t cap_spans[2];
    sym *syms;
    size_t cap_syms;
    cand *heap;
    size_t cap_heap, n_heap;
    piece *pieces;
    size_t cap_pieces;
    char *tmp; /* ByteLevel scratch */
    size_t cap_tmp;
    char *ntext; /* the normalized text of the current raw gap */
    size_t cap_ntext;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;
} enc;

/* Grows *p (elements of elem bytes) to hold need. @return 0 when out of memory. */
int tok_grow(void **p, size_t *cap, size_t need, size_t elem);
kvq_status tok_push_id(enc *e, int32_t id);
/* BPE of one pre-tokenized word, its ids appended to e->ids. */
kvq_status tok_bpe_word(enc *e, const char *w, size_t n);
/* Runs the normalizer over s[0..n); the result is in e->buf[*which][0..*out_n). */
kvq_status tok_normalize(enc *e, const char *s, size_t n, int *which, size_t *out_n);
/* Pre-tokenizes and BPEs one piece of normalized text (not in e->buf). */
kvq_status tok_pretok_bpe(enc *e, const char *text, size_t n, int origin);
/* @return 1 when the character at s[i] is whitespace; *cl its byte length. */
int tok_is_ws_at(const char *s, size_t n, size_t i, size_t *cl);

#endif /* KVQ_TOKENIZER_ENC_H */
