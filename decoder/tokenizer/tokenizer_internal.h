/* tokenizer_internal.h - the loaded form of a tokenizer.json, shared by the
 * loader (tokenizer.c), the encoder (tokenizer_encode.c) and the decoders
 * (tokenizer_decode.c). Nothing here is public API.
 */
#ifndef KVQ_TOKENIZER_INTERNAL_H
#define KVQ_TOKENIZER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kvq_tokenizer.h"

/* String -> id, open addressing over an arena of token strings. */
typedef struct tok_strmap {
    int32_t *slot; /* id, or -1 for empty */
    uint32_t mask; /* capacity - 1, capacity a power of two */
} tok_strmap;

/* (left id, right id) -> (rank, merged id); the key packs both 24-bit ids. */
typedef struct tok_merge {
    uint64_t key; /* TOK_MERGE_EMPTY when unused */
    int32_t rank;
    int32_t id;
} tok_merge;
#define TOK_MERGE_EMPTY UINT64_MAX

/* A string owned by the tokenizer (components' parameters). */
typedef struct tok_str {
    char *s;
    size_t n;
} tok_str;

enum tok_norm_kind {
    TOK_NORM_REPLACE, /* string pattern, or regex when re is set */
    TOK_NORM_PREPEND,
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_LOWERCASE,
    TOK_NORM_STRIP,        /* strip_left / strip_right whitespace */
    TOK_NORM_STRIP_ACCENTS /* drop non-spacing marks (Mn) */
};
typedef struct tok_norm {
    enum tok_norm_kind kind;
    tok_str pattern; /* Replace: what to find */
    tok_str content; /* Replace: replacement; Prepend: the prefix */
    void *re;        /* Replace with a Regex pattern: pcre2_code_8 */
    int strip_left, strip_right;
} tok_norm;

enum tok_pre_kind {
    TOK_PRE_METASPACE,
    TOK_PRE_DIGITS,
    TOK_PRE_SPLIT,      /* Split: regex (re) or string (pattern) */
    TOK_PRE_BYTELEVEL,  /* optional prefix space, GPT-2 regex (re), bytes -> chars */
    TOK_PRE_PUNCT,      /* Punctuation */
    TOK_PRE_WHITESPACE, /* Whitespace: \w+|[^\w\s]+ kept, the rest removed */
    TOK_PRE_WSPLIT      /* WhitespaceSplit */
};
enum tok_prepend { TOK_PREPEND_NEVER, TOK_PREPEND_FIRST, TOK_PREPEND_ALWAYS };
/* HF's SplitDelimiterBehavior. */
enum tok_behavior { TOK_B_REMOVED, TOK_B_ISOLATED, TOK_B_PREV, TOK_B_NEXT, TOK_B_CONTIGUOUS };
typedef struct tok_pre {
    enum tok_pre_kind kind;
    char repl[8]; /* Metaspace replacement character, UTF-8, NUL-terminated */
    size_t repl_len;
    enum tok_prepend prepend;
    int split;      /* Metaspace: split before every replacement character */
    int individual; /* Digits: every digit alone (else runs of digits) */
    enum tok_behavior behavior; /* Split, Punctuation */
    int invert;                 /* Split */
    tok_str pattern;            /* Split with a String pattern */
    void *re;                   /* pcre2_code_8: Split regex, ByteLevel's GPT-2 regex, Whitespace */
    int add_prefix_space;       /* ByteLevel */
} tok_pre;

#define TOK_MAX_STEPS 16

/* Per-id flags. */
enum {
    TOK_F_PRESENT = 1, /* some token has this id */
    TOK_F_ADDED = 2,   /* listed in added_tokens */
    TOK_F_SPECIAL = 4  /* added token marked special */
};

typedef struct tok_added {
    int32_t id;
    uint32_t off, len; /* content in the arena */
    uint8_t lstrip, rstrip, single_word, normalized;
} tok_added;

/* Byte trie of added-token contents, for leftmost-longest matching (what HF's
 * Aho-Corasick with MatchKind::LeftmostLongest finds, scanning from each
 * start position). Children are a sibling list, except the root's 256. */
typedef struct tok_trie_node {
    int32_t child, sibling; /* node indices, -1 = none */
    int32_t added;          /* index into added[] ending here, or -1 */
    uint8_t byte;
} tok_trie_node;
typedef struct tok_trie {
    tok_trie_node *node;
    int32_t n, cap;
    int32_t root[256];
} tok_trie;

struct kvq_tokenizer {
    int32_t vocab_size;
    int32_t bos, eos, unk; /* -1 when absent */

    /* Token strings of every id (added token content wins over the model's). */
    char *arena;
    size_t arena_len, arena_cap;
    uint32_t *piece_off, *piece_len;
    uint32_t *model_off, *model_len; /* the model vocab's string of each id (len 0: none) */
    uint8_t *flags;

    /* What the decoder makes of each id before byte runs are joined: the piece
     * after the decoder's Replace steps, and the byte it spells (0..255) when
     * that text has ByteFallback's "<0xHH>" form, else -1. */
    uint32_t *dec_off, *dec_len;
    int16_t *dec_byte;
    size_t max_dec_len;

    /* Model (BPE). */
    tok_strmap vocab; /* model vocab only: what BPE may produce */
    tok_merge *merges;
    uint32_t merge_mask;
    int32_t byte_id[256]; /* "<0xHH>" in the model vocab, or -1 */
    int byte_fallback, fuse_unk, ignore_merges;
    int unk_missing; /* unk_token named but not in the vocab: unknown characters are an error */

    /* Added tokens, leftmost-longest: those with normalized false in the raw
     * text (trie_raw), then the others in each normalized piece (trie_norm). */
    tok_added *added;
    int n_added;
    tok_trie trie_raw, trie_norm;
    tok_strmap added_map;     /* content -> id */

    /* post_processor TemplateProcessing "single": ids around the sequence,
     * added when the caller asks for special tokens (add_bos). */
    int has_template;
    int32_t *tpl_pre, *tpl_post;
    int n_tpl_pre, n_tpl_post;

    tok_norm norm[TOK_MAX_STEPS];
    int n_norm;
    tok_pre pre[TOK_MAX_STEPS];
    int n_pre;

    /* Decoder: per-token steps (Replace, ByteLevel, Metaspace; folded into
     * dec_*), then ByteFallback?, Fuse?, Strip?. */
    int dec_byte_fallback;
    int dec_lossy; /* ByteLevel: tokens are bytes; the text is their UTF-8, lossy */
    /* Metaspace decoder (prepend_scheme not never): the first token loses its
     * replacement characters instead of turning them into spaces. */
    uint32_t *dec_first_off, *dec_first_len; /* NULL when not needed */
    char strip_char[8]; /* UTF-8 of the Strip content character */
    size_t strip_char_len;
    int strip_start; /* leading strip_char removed from the whole text, at most this many */
};

/* Hash-table slot of a merge key (left id << 32 | right id). */
static inline uint64_t tok_merge_key(int32_t a, int32_t b)
{
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}
static inline uint32_t tok_merge_slot(uint64_t key)
{
    key ^= key >> 31;
    key *= 0x9e3779b97f4a7c15ull;
    return (uint32_t)(key >> 32);
}

/* Helpers shared by the tokenizer files. */
uint64_t tok_hash(const char *s, size_t n);
/* @return the id of s in m (strings looked up through tok's arena), or -1. */
int32_t tok_strmap_get(const kvq_tokenizer *tok, const tok_strmap *m, const uint32_t *off,
                       const uint32_t *len, const char *s, size_t n);
/* @return index into tok->merges of (a, b), or -1. */
long tok_merge_find(const kvq_tokenizer *tok, int32_t a, int32_t b);
/* @return 1 when s[0..n) is valid UTF-8 (no overlongs, surrogates or > U+10FFFF). */
int tok_utf8_valid(const char *s, size_t n);
/* Decodes one code point at s (valid UTF-8 assumed). @return its byte length. */
size_t tok_utf8_next(const char *s, size_t n, uint32_t *cp);
/* @return 1 when cp is numeric in Rust's sense (general category Nd, Nl or No). */
int tok_is_numeric(uint32_t cp);
/* Rust char::is_whitespace (the White_Space property). */
int tok_is_whitespace(uint32_t cp);
/* HF's is_punc: ASCII punctuation or a Unicode P* category. */
int tok_is_punct(uint32_t cp);
/* A Rust regex \w character (letters, marks, digits, connector punctuation). */
int tok_is_word(uint32_t cp);
/* Unicode normalization (utf8proc) of s[0..n): NFC/NFD/NFKC/NFKD by kind, or
 * Lowercase, StripAccents. @return a malloc'ed string (*out_n bytes) or NULL. */
char *tok_unicode_map(enum tok_norm_kind kind, const char *s, size_t n, size_t *out_n);
/* GPT-2's byte <-> character table (ByteLevel): UTF-8 of byte b's character. */
const char *tok_bytelevel_char(unsigned b, size_t *len);
/* @return the byte a ByteLevel character stands for, or -1. */
int tok_bytelevel_byte(uint32_t cp);
/* Appends the lossy UTF-8 reading of s[0..n) to out (Rust's from_utf8_lossy:
 * one U+FFFD per maximal invalid subpart). out needs 3 * n bytes.
 * @return bytes written. */
size_t tok_utf8_lossy(const char *s, size_t n, char *out);
/* @return how many trailing bytes of s[0..n) are an incomplete but still
 * possibly valid UTF-8 sequence (0..3). */
size_t tok_utf8_incomplete_tail(const char *s, size_t n);
/* Regexes (PCRE2 with UTF and UCP). @return the compiled code or NULL with a
 * message in err. */
void *tok_regex_compile(const char *pattern, size_t len, kvq_error *err, const char *where);
void tok_regex_free(void *re);
/* @return the byte HF's ByteFallback decoder reads from s ("<0xHH>"), or -1. */
int tok_parse_byte_token(const char *s, size_t n);

/* ---- loading (tokenizer_load.c, tokenizer_pipeline.c) ---- */
struct cJSON;
typedef struct tok_loader {
    kvq_tokenizer *t;
    kvq_error *err;
} tok_loader;

/* obj[key], or NULL when absent or JSON null. */
const struct cJSON *tok_field(const struct cJSON *obj, const char *key);
/* Typed optional fields; a wrong type is KVQ_ERR_FORMAT naming where.key. */
kvq_status tok_get_bool(tok_loader *L, const struct cJSON *obj, const char *where, const char *key,
                        int def, int *out);
kvq_status tok_get_str(tok_loader *L, const struct cJSON *obj, const char *where, const char *key,
                       const char **out);
kvq_status tok_get_char(tok_loader *L, const struct cJSON *obj, const char *where, const char *key,
                        const char *def, char out[8], size_t *out_len);
/* @return 1 when v is an integral number in [lo, hi] (stored in *out). */
int tok_as_int(const struct cJSON *v, long lo, long hi, long *out);
kvq_status tok_unsupported(tok_loader *L, const char *what, const char *type);
kvq_status tok_take_str(tok_loader *L, const char *s, tok_str *out);
kvq_status tok_arena_add(tok_loader *L, const char *s, size_t n, uint32_t *off);

/* The sections, in this order: the model (with added tokens), then the rest. */
kvq_status tok_load_model(tok_loader *L, const struct cJSON *root);
kvq_status tok_load_normalizer(tok_loader *L, const struct cJSON *root);
kvq_status tok_load_pre_tokenizer(tok_loader *L, const struct cJSON *root);
kvq_status tok_load_decoder(tok_loader *L, const struct cJSON *root);
kvq_status tok_load_post_processor(tok_loader *L, const struct cJSON *root);
/* Builds the added-token tries (after the pipeline is known). */
kvq_status tok_index_added(tok_loader *L);

#endif /* KVQ_TOKENIZER_INTERNAL_H */
