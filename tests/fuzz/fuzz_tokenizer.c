/* fuzz_tokenizer.c - libFuzzer target for the tokenizer.
 *
 * The first input byte picks what the rest is:
 *   0  a tokenizer.json document (the parser and validator of untrusted files);
 *   1  text to encode with the fixture tokenizer (or a built-in one);
 *   2  token ids (16-bit little-endian, some out of range) to decode;
 *   3  text to encode with a built-in GPT-2-style tokenizer: NFC, a Split
 *      regex (PCRE2), ByteLevel, added tokens with lstrip/rstrip/single_word/
 *      normalized, a TemplateProcessing post-processor, the ByteLevel decoder.
 * Besides "no crash, no sanitizer report", it aborts when the stream and the
 * whole-sequence decoder disagree or a streamed chunk is not complete UTF-8.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kvq_tokenizer *g_tok;

/* A small Llama-style tokenizer.json, for when the fixture is not reachable. */
static char *builtin_json(void)
{
    size_t cap = 64 * 1024, n = 0;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    n += (size_t)snprintf(s + n, cap - n,
                          "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true,\"normalized\":false},"
                          "{\"id\":1,\"content\":\"<s>\",\"special\":true,\"normalized\":false},"
                          "{\"id\":2,\"content\":\"</s>\",\"special\":true,\"normalized\":false}],"
                          "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Replace\","
                          "\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}]},"
                          "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Metaspace\","
                          "\"replacement\":\"\\u2581\",\"prepend_scheme\":\"first\",\"split\":true},"
                          "{\"type\":\"Digits\",\"individual_digits\":true}]},"
                          "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
                          "{\"String\":\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},"
                          "{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
                          "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,"
                          "\"byte_fallback\":true,\"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2");
    for (int b = 0; b < 256; b++)
        n += (size_t)snprintf(s + n, cap - n, ",\"<0x%02X>\":%d", b, 3 + b);
    const char *rest = ",\"\\u2581\":259,\"a\":260,\"b\":261,\"c\":262,\"1\":263,\"\\u2581a\":264,"
                       "\"ab\":265,\"\\u2581ab\":266,\"abc\":267},"
                       "\"merges\":[\"\\u2581 a\",[\"a\",\"b\"],\"\\u2581a b\",\"ab c\"]}}";
    snprintf(s + n, cap - n, "%s", rest);
    return s;
}

static kvq_tokenizer *g_bl;

/* A small byte-level tokenizer exercising the regex / Unicode half of the pipeline. */
static char *bytelevel_json(void)
{
    size_t cap = 64 * 1024, n = 0;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    n += (size_t)snprintf(s + n, cap - n,
                          "{\"added_tokens\":["
                          "{\"id\":300,\"content\":\"<|bos|>\",\"special\":true,\"normalized\":false},"
                          "{\"id\":301,\"content\":\"<mask>\",\"special\":true,\"lstrip\":true,\"rstrip\":true},"
                          "{\"id\":302,\"content\":\"word\",\"special\":false,\"single_word\":true,"
                          "\"normalized\":true}],"
                          "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},"
                          "{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"\\\\s{3,}\"},\"content\":\"  \"}]},"
                          "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
                          "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|"
                          "\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s+(?!\\\\S)|\\\\s+\"},"
                          "\"behavior\":\"Isolated\",\"invert\":false},"
                          "{\"type\":\"Punctuation\",\"behavior\":\"Contiguous\"},"
                          "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
                          "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":["
                          "{\"SpecialToken\":{\"id\":\"<|bos|>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
                          "\"special_tokens\":{\"<|bos|>\":{\"id\":\"<|bos|>\",\"ids\":[300],\"tokens\":[\"<|bos|>\"]}}},"
                          "\"decoder\":{\"type\":\"ByteLevel\"},"
                          "\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{");
    /* The 256 byte characters of GPT-2's table, then a few merges. */
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        int k = 0;
        for (int x = 0; x < b; x++)
            k += !((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE));
        unsigned cp = printable ? (unsigned)b : 256u + (unsigned)k;
        if (cp == '"' || cp == '\\')
            n += (size_t)snprintf(s + n, cap - n, "%s\"\\%c\":%d", b ? "," : "", (char)cp, b);
        else
            n += (size_t)snprintf(s + n, cap - n, "%s\"\\u%04x\":%d", b ? "," : "", cp, b);
    }
    snprintf(s + n, cap - n, ",\"\\u0120t\":256,\"he\":257,\"\\u0120the\":258},"
                             "\"merges\":[\"\\u0120 t\",\"h e\",\"\\u0120t he\"]}}");
    return s;
}

static void init(void)
{
    if (!g_bl) {
        char *j = bytelevel_json();
        if (!j || kvq_tokenizer_create_from_memory(j, strlen(j), &g_bl, NULL) != KVQ_OK)
            abort(); /* the built-in byte-level tokenizer must load */
        free(j);
    }
    if (g_tok)
        return;
    if (kvq_tokenizer_create("models/kvq-tiny-llama/tokenizer.json", &g_tok, NULL) == KVQ_OK)
        return;
    char *j = builtin_json();
    if (!j || kvq_tokenizer_create_from_memory(j, strlen(j), &g_tok, NULL) != KVQ_OK)
        abort(); /* the built-in tokenizer must load */
    free(j);
}

static int utf8_ok(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < n;) {
        size_t k;
        if (s[i] < 0x80)
            k = 0;
        else if ((s[i] & 0xE0) == 0xC0)
            k = 1;
        else if ((s[i] & 0xF0) == 0xE0)
            k = 2;
        else if ((s[i] & 0xF8) == 0xF0)
            k = 3;
        else
            return 0;
        if (i + k >= n)
            return 0;
        for (size_t j = 1; j <= k; j++)
            if ((s[i + j] & 0xC0) != 0x80)
                return 0;
        i += k + 1;
    }
    return 1;
}

/* Decodes ids both ways and insists they agree. */
static void check_decode(const kvq_tokenizer *t, const int32_t *ids, size_t n, unsigned flags)
{
    char *full = NULL;
    size_t full_len = 0;
    kvq_status st = kvq_tokenizer_decode_alloc(t, ids, n, flags, &full, &full_len);
    kvq_detok *d = NULL;
    if (kvq_detok_create(t, flags, &d) != KVQ_OK)
        abort();
    size_t pos = 0;
    int stream_err = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *c;
        size_t cl;
        kvq_status s2 = i < n ? kvq_detok_push(d, ids[i], &c, &cl) : kvq_detok_finish(d, &c, &cl);
        if (s2 != KVQ_OK) {
            stream_err = 1;
            if (cl != 0)
                abort();
            continue;
        }
        if (!utf8_ok(c, cl) || c[cl] != 0) /* NUL-terminated; may hold NULs (<0x00>) */
            abort();
        if (st == KVQ_OK && (pos + cl > full_len || memcmp(full + pos, c, cl) != 0))
            abort();
        pos += cl;
    }
    if (st == KVQ_OK && (stream_err || pos != full_len))
        abort();
    if (st != KVQ_OK && !stream_err)
        abort(); /* a bad id must be refused by both */
    kvq_detok_free(d);
    free(full);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    init();
    const char *rest = (const char *)data + 1;
    size_t n = size - 1;
    switch (data[0] % 4) {
    case 3: {
        int32_t *ids = NULL;
        size_t k = 0;
        kvq_status st = kvq_tokenizer_encode_alloc(g_bl, rest, n, data[0] & 4, &ids, &k);
        if (st == KVQ_OK) {
            check_decode(g_bl, ids, k, 0);
            check_decode(g_bl, ids, k, KVQ_DETOK_SKIP_SPECIAL);
        } else if (st != KVQ_ERR_INVALID_ARG && st != KVQ_ERR_NOMEM) {
            abort(); /* invalid UTF-8, or a regex running out of its stack */
        }
        free(ids);
        break;
    }
    case 0: {
        kvq_tokenizer *t = NULL;
        kvq_error err = {KVQ_OK, ""};
        if (kvq_tokenizer_create_from_memory(rest, n, &t, &err) == KVQ_OK) {
            const char *texts[] = {"Hello world 123", " <s>x</s>\xe6\x9d\xb1 \xf0\x9f\x99\x82", ""};
            for (int i = 0; i < 3; i++) {
                int32_t *ids = NULL;
                size_t k = 0;
                if (kvq_tokenizer_encode_alloc(t, texts[i], strlen(texts[i]), 1, &ids, &k) == KVQ_OK) {
                    check_decode(t, ids, k, 0);
                    check_decode(t, ids, k, KVQ_DETOK_SKIP_CONTROL);
                }
                free(ids);
            }
            int32_t some[64];
            int32_t v = kvq_tokenizer_vocab_size(t);
            for (int i = 0; i < 64; i++)
                some[i] = (int32_t)((uint32_t)i * 2654435761u % (uint32_t)v);
            check_decode(t, some, 64, 0);
        } else if (err.msg[0] == 0 || strchr(err.msg, '\n')) {
            abort(); /* every refusal says why, in one line */
        }
        kvq_tokenizer_free(t);
        break;
    }
    case 1: {
        int32_t *ids = NULL;
        size_t k = 0;
        kvq_status st = kvq_tokenizer_encode_alloc(g_tok, rest, n, data[0] & 4, &ids, &k);
        if (st == KVQ_OK) {
            check_decode(g_tok, ids, k, 0);
            check_decode(g_tok, ids, k, KVQ_DETOK_SKIP_SPECIAL);
        } else if (st != KVQ_ERR_INVALID_ARG) {
            abort(); /* only invalid UTF-8 may be refused */
        }
        free(ids);
        break;
    }
    case 2: {
        size_t k = n / 2;
        int32_t *ids = malloc((k + 1) * sizeof *ids);
        if (!ids)
            return 0;
        int32_t v = kvq_tokenizer_vocab_size(g_tok);
        for (size_t i = 0; i < k; i++) {
            uint32_t x = (uint32_t)(unsigned char)rest[2 * i] | (uint32_t)(unsigned char)rest[2 * i + 1] << 8;
            ids[i] = (int32_t)(x % (uint32_t)(v + 8)) - 4; /* a few out of range on both sides */
        }
        check_decode(g_tok, ids, k, (unsigned)(data[0] >> 2) % 8);
        free(ids);
        break;
    }
    }
    return 0;
}
