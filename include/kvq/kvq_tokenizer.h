/* kvq_tokenizer.h - Hugging Face tokenizer.json (BPE tokenizers) in C.
 *
 * Supported, and reproduced exactly as HF `tokenizers` does it (Llama 2,
 * Llama 3, Qwen3, Gemma 3, DeepSeek-V3, gpt-oss are tested to the id; the list and
 * the known differences are in docs/tokenizer.md):
 *   added tokens   every entry of "added_tokens", leftmost-longest, with
 *                  single_word / lstrip / rstrip; normalized=false ones in the
 *                  raw text, normalized=true ones in the normalized text;
 *   normalizer     NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents,
 *                  Replace (string or regex), Prepend, Sequence;
 *   pre-tokenizer  Split (regex via PCRE2 or string, every behaviour, invert),
 *                  ByteLevel, Metaspace, Digits, Punctuation, Whitespace,
 *                  WhitespaceSplit, Sequence;
 *   model          BPE with ranked merges ("a b" strings or ["a", "b"] pairs),
 *                  byte_fallback (<0x00>..<0xFF>), unk_token, fuse_unk,
 *                  ignore_merges;
 *   post-processor TemplateProcessing ("single"), ByteLevel, Sequence;
 *   decoder        per-token Replace / ByteLevel / Metaspace, then ByteFallback,
 *                  Fuse, Strip (start only).
 * Anything else (Unigram/WordPiece models, BPE dropout, Precompiled, Bert
 * components, ...) is refused at load with KVQ_ERR_UNSUPPORTED and a message
 * naming the component.
 *
 * Special tokens: encoding with add_bos applies the post-processor's template
 * (HF add_special_tokens=True); a tokenizer.json without a post_processor
 * gets the BOS id instead when one is known.
 *
 * Ids are int32_t in [0, vocab_size). A loaded tokenizer is immutable and may
 * be used from several threads at once. Encoding allocates scratch memory per
 * call (prompt path); streaming detokenization (kvq_detok) does not allocate
 * in steady state.
 */
#ifndef KVQ_TOKENIZER_H
#define KVQ_TOKENIZER_H

#include "kvq_export.h"

#include <stddef.h>
#include <stdint.h>

#include "kvq_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Ids beyond this are refused at load (a corrupt file must not make us
 * allocate gigabytes). */
#define KVQ_TOKENIZER_MAX_VOCAB (1 << 22)

typedef struct kvq_tokenizer kvq_tokenizer;

/** Loads tokenizer.json from path.
 *  @return KVQ_OK and *out; KVQ_ERR_INVALID_ARG (NULL path/out), KVQ_ERR_IO
 *  (cannot read), KVQ_ERR_FORMAT (not JSON, missing/ill-typed fields, merge of
 *  tokens not in the vocab, invalid UTF-8 in a token), KVQ_ERR_UNSUPPORTED
 *  (a tokenizer kind listed above as refused), KVQ_ERR_NOMEM. err (optional)
 *  gets one line saying what was wrong. */
KVQ_API kvq_status kvq_tokenizer_create(const char *path, kvq_tokenizer **out, kvq_error *err);

/** Same from a JSON document in memory (json[0..len), need not be NUL-terminated;
 *  not retained). */
KVQ_API kvq_status kvq_tokenizer_create_from_memory(const char *json, size_t len, kvq_tokenizer **out,
                                            kvq_error *err);

/** Accepts NULL. */
KVQ_API void kvq_tokenizer_free(kvq_tokenizer *tok);

/** @return 1 + the largest id of the vocabulary or the added tokens. */
KVQ_API int32_t kvq_tokenizer_vocab_size(const kvq_tokenizer *tok);

/** BOS / EOS ids: the added tokens "<s>" / "</s>" when present (BOS: else
 *  the first special token of the post-processor's template), else -1;
 *  change them with kvq_tokenizer_set_bos_eos (e.g. from config.json). */
KVQ_API int32_t kvq_tokenizer_bos_id(const kvq_tokenizer *tok);
KVQ_API int32_t kvq_tokenizer_eos_id(const kvq_tokenizer *tok);

/** Overrides BOS/EOS (-1 = none). Call before sharing tok between threads.
 *  @return KVQ_OK, KVQ_ERR_RANGE when an id is >= vocab size or < -1. */
KVQ_API kvq_status kvq_tokenizer_set_bos_eos(kvq_tokenizer *tok, int32_t bos, int32_t eos);

/** The token string of id as stored in tokenizer.json (e.g. "▁the", "<0x0A>",
 *  "<s>"), NUL-terminated UTF-8 owned by tok; *len (optional) its byte length.
 *  @return KVQ_OK; KVQ_ERR_RANGE when id is outside [0, vocab_size) or no
 *  token has that id; KVQ_ERR_INVALID_ARG for NULL pointers. */
KVQ_API kvq_status kvq_tokenizer_piece(const kvq_tokenizer *tok, int32_t id, const char **piece,
                               size_t *len);

/** Id of an exact token string (added tokens first, then the model vocab).
 *  @return KVQ_OK; KVQ_ERR_RANGE when no token has that string. */
KVQ_API kvq_status kvq_tokenizer_token_id(const kvq_tokenizer *tok, const char *piece, size_t len,
                                  int32_t *id);

/** @return 1 when id is an added token marked "special" (<s>, </s>, <unk>;
 *  in the bundled fixture also <0x00>..<0xFF>), 0 otherwise (also out of range). */
KVQ_API int kvq_tokenizer_is_special(const kvq_tokenizer *tok, int32_t id);

/** Encodes text[0..len) (UTF-8, need not be NUL-terminated) into ids; with
 *  add_bos, the special tokens of the post-processor's template around them
 *  (or, without a post-processor, the BOS id first when one is known).
 *  ids may be NULL when max_ids is 0 (size query).
 *  @return KVQ_OK with *n_ids ids written; KVQ_ERR_RANGE when max_ids is too
 *  small: *n_ids is then the count needed and ids holds the first max_ids;
 *  KVQ_ERR_INVALID_ARG for NULL pointers or text that is not valid UTF-8;
 *  KVQ_ERR_UNSUPPORTED when a character has no token, no byte-fallback
 *  token and the vocabulary has no unk token; KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_tokenizer_encode(const kvq_tokenizer *tok, const char *text, size_t len, int add_bos,
                                int32_t *ids, size_t max_ids, size_t *n_ids);

/** Same, into a malloc'ed array (*ids, free() it; NULL when *n_ids is 0). */
KVQ_API kvq_status kvq_tokenizer_encode_alloc(const kvq_tokenizer *tok, const char *text, size_t len,
                                      int add_bos, int32_t **ids, size_t *n_ids);

/* Flags for decoding. */
enum {
    /* Drop every added token marked special: exactly HF's
     * decode(skip_special_tokens=True). Note that the bundled fixture marks the
     * byte tokens <0x00>..<0xFF> special, so this also drops the characters
     * spelled with byte fallback (emoji, most Cyrillic). */
    KVQ_DETOK_SKIP_SPECIAL = 1u << 0,
    /* Drop special tokens except the byte-fallback ones: <s>, </s>, <unk> vanish
     * but emoji still print. What a chat/CLI stream wants. */
    KVQ_DETOK_SKIP_CONTROL = 1u << 1,
    /* Skip the decoder's Strip step (the one leading space removed from the
     * text): for text that continues earlier text, e.g. generated ids printed
     * right after their prompt ("...key is" + " 86317."). HF has no such switch:
     * its decode of the generated ids alone strips the space. */
    KVQ_DETOK_KEEP_LEADING_SPACE = 1u << 2
};

/** Decodes ids[0..n) into out (cap bytes, NUL-terminated) as HF's decoder
 *  does. Without flags every token is rendered (HF skip_special_tokens=False).
 *  Byte-fallback runs that are not valid UTF-8 become one U+FFFD per byte.
 *  out may be NULL when cap is 0 (size query).
 *  @return KVQ_OK with *len bytes (excluding the NUL); KVQ_ERR_RANGE for an
 *  id outside the vocabulary (nothing useful in out) or when cap <= needed
 *  length: *len is then the length needed (excluding the NUL);
 *  KVQ_ERR_INVALID_ARG for NULL pointers or unknown flags; KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_tokenizer_decode(const kvq_tokenizer *tok, const int32_t *ids, size_t n,
                                unsigned flags, char *out, size_t cap, size_t *len);

/** Same, into a malloc'ed NUL-terminated string (*text, free() it).
 *  @return KVQ_OK; KVQ_ERR_RANGE for an id outside the vocabulary;
 *  KVQ_ERR_INVALID_ARG; KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_tokenizer_decode_alloc(const kvq_tokenizer *tok, const int32_t *ids, size_t n,
                                      unsigned flags, char **text, size_t *len);

/* ---- streaming detokenization ------------------------------------------
 * Feed generated ids one at a time; each call hands back the text that is now
 * final. Every chunk is complete UTF-8 (a multi-byte character spelled with
 * byte-fallback tokens comes out whole, once its byte run ends), and the
 * concatenation of all chunks after kvq_detok_finish equals
 * kvq_tokenizer_decode of the same ids with the same flags. One kvq_detok per
 * sequence; it borrows tok, which must outlive it. */
typedef struct kvq_detok kvq_detok;

/** @return KVQ_OK; KVQ_ERR_INVALID_ARG (NULL, unknown flags); KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_detok_create(const kvq_tokenizer *tok, unsigned flags, kvq_detok **out);

/** Accepts NULL. */
KVQ_API void kvq_detok_free(kvq_detok *d);

/** Back to the start of a new sequence (the leading-space strip applies again). */
KVQ_API void kvq_detok_reset(kvq_detok *d);

/** Feeds one id. *text / *len: the newly final text (NUL-terminated, possibly
 *  empty; it holds NUL bytes only where the ids spell <0x00>), owned by d and
 *  valid until the next call on d.
 *  Allocates only when a byte-fallback run outgrows the internal buffer.
 *  @return KVQ_OK; KVQ_ERR_RANGE for an id outside the vocabulary (state
 *  unchanged, *text ""); KVQ_ERR_INVALID_ARG; KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_detok_push(kvq_detok *d, int32_t id, const char **text, size_t *len);

/** End of the sequence: releases a pending byte run. Same output contract as
 *  kvq_detok_push. The detok is then as after kvq_detok_reset. */
KVQ_API kvq_status kvq_detok_finish(kvq_detok *d, const char **text, size_t *len);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_TOKENIZER_H */
