/* tokenizer.c - struct kvq_tokenizer's life cycle (create, free), its
 * accessors, and the helpers the other tokenizer files share (hash maps,
 * UTF-8). Reading tokenizer.json is in tokenizer_load.c (vocabulary, merges,
 * added tokens) and tokenizer_pipeline.c (normalizer, pre-tokenizer,
 * decoder); encoding in tokenizer_encode.c; decoding in tokenizer_decode.c.
 *
 * The loader is also the gatekeeper: anything whose behaviour we do not
 * reproduce exactly is refused with KVQ_ERR_UNSUPPORTED, so that a tokenizer
 * that loads is a tokenizer that encodes like HF.
 */
#include "tokenizer_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- shared helpers ------------------------------------------------------ */

uint64_t tok_hash(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

int32_t tok_strmap_get(const kvq_tokenizer *tok, const tok_strmap *m, const uint32_t *off,
                       const uint32_t *len, const char *s, size_t n)
{
    if (!m->slot)
        return -1;
    for (uint32_t i = (uint32_t)tok_hash(s, n) & m->mask;; i = (i + 1) & m->mask) {
        int32_t id = m->slot[i];
        if (id < 0)
            return -1;
        if (len[id] == n && memcmp(tok->arena + off[id], s, n) == 0)
            return id;
    }
}

long tok_merge_find(const kvq_tokenizer *tok, int32_t a, int32_t b)
{
    if (!tok->merges)
        return -1;
    uint64_t key = tok_merge_key(a, b);
    for (uint32_t i = tok_merge_slot(key) & tok->merge_mask;; i = (i + 1) & tok->merge_mask) {
        if (tok->merges[i].key == key)
            return (long)i;
        if (tok->merges[i].key == TOK_MERGE_EMPTY)
            return -1;
    }
}

int tok_utf8_valid(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF) {
            k = 1; cp = c & 0x1F; min = 0x80;
        } else if (c >= 0xE0 && c <= 0xEF) {
            k = 2; cp = c & 0x0F; min = 0x800;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3; cp = c & 0x07; min = 0x10000;
        } else {
            return 0;
        }
        if (n - i <= k)
            return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += k + 1;
    }
    return 1;
}

size_t tok_utf8_next(const char *str, size_t n, uint32_t *cp)
{
    const unsigned char *s = (const unsigned char *)str;
    unsigned c = s[0];
    size_t k = c < 0x80 ? 0 : c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
    if (k >= n)
        k = n - 1; /* only on invalid input, which callers rule out */
    uint32_t v = k == 0 ? c : k == 1 ? (c & 0x1F) : k == 2 ? (c & 0x0F) : (c & 0x07);
    for (size_t j = 1; j <= k; j++)
        v = (v << 6) | (s[j] & 0x3F);
    *cp = v;
    return k + 1;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int tok_parse_byte_token(const char *s, size_t n)
{
    /* HF reads bytes[3..5] with u8::from_str_radix(.., 16), which also takes
     * a leading '+' ("<0x+A>" is byte 10): reproduce that, oddity included. */
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    if (s[3] == '+') {
        int v = hexval(s[4]);
        return v;
    }
    int hi = hexval(s[3]), lo = hexval(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* ---- create / free -------------------------------------------------------- */

kvq_status kvq_tokenizer_create_from_memory(const char *json, size_t len, kvq_tokenizer **out,
                                            kvq_error *err)
{
    if (!json || !out)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_tokenizer_create: NULL argument");
    *out = NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root)
        return kvq_error_set(err, KVQ_ERR_FORMAT, "tokenizer.json: not valid JSON (error near byte %zu of %zu)",
                             end && end >= json ? (size_t)(end - json) : (size_t)0, len);
    kvq_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        cJSON_Delete(root);
        return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory");
    }
    t->bos = t->eos = t->unk = -1;
    tok_loader L = {t, err};
    kvq_status st;
    if (!cJSON_IsObject(root))
        st = kvq_error_set(err, KVQ_ERR_FORMAT, "tokenizer.json: the top level is not an object");
    else if (!(st = tok_load_model(&L, root)) && !(st = tok_load_normalizer(&L, root)) &&
             !(st = tok_load_pre_tokenizer(&L, root)) && !(st = tok_load_post_processor(&L, root)) &&
             !(st = tok_load_decoder(&L, root)))
        st = tok_index_added(&L);
    cJSON_Delete(root);
    if (st) {
        kvq_tokenizer_free(t);
        return st;
    }
    int32_t id;
    if (kvq_tokenizer_token_id(t, "<s>", 3, &id) == KVQ_OK)
        t->bos = id;
    if (kvq_tokenizer_token_id(t, "</s>", 4, &id) == KVQ_OK)
        t->eos = id;
    /* A template that starts with a special token names the BOS (Gemma's <bos>). */
    if (t->bos < 0 && t->n_tpl_pre > 0)
        t->bos = t->tpl_pre[0];
    *out = t;
    return KVQ_OK;
}

kvq_status kvq_tokenizer_create(const char *path, kvq_tokenizer **out, kvq_error *err)
{
    if (!path || !out)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_tokenizer_create: NULL argument");
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return kvq_error_set(err, KVQ_ERR_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? 2 * cap : 1 << 20;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return kvq_error_set(err, KVQ_ERR_NOMEM, "out of memory reading %s", path);
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return kvq_error_set(err, KVQ_ERR_IO, "%s: read error", path);
    }
    kvq_status st = kvq_tokenizer_create_from_memory(buf, len, out, err);
    free(buf);
    return st;
}

void kvq_tokenizer_free(kvq_tokenizer *t)
{
    if (!t)
        return;
    free(t->arena);
    free(t->piece_off);
    free(t->piece_len);
    free(t->model_off);
    free(t->model_len);
    free(t->flags);
    free(t->dec_off);
    free(t->dec_len);
    free(t->dec_byte);
    free(t->vocab.slot);
    free(t->merges);
    free(t->added);
    free(t->trie_raw.node);
    free(t->trie_norm.node);
    free(t->added_map.slot);
    free(t->tpl_pre);
    free(t->tpl_post);
    free(t->dec_first_off);
    free(t->dec_first_len);
    /* Every slot: a step that failed half-way may hold a compiled regex. */
    for (int i = 0; i < TOK_MAX_STEPS; i++) {
        free(t->norm[i].pattern.s);
        free(t->norm[i].content.s);
        if (t->norm[i].re)
            tok_regex_free(t->norm[i].re);
        free(t->pre[i].pattern.s);
        if (t->pre[i].re)
            tok_regex_free(t->pre[i].re);
    }
    free(t);
}

/* ---- accessors ------------------------------------------------------------ */

int32_t kvq_tokenizer_vocab_size(const kvq_tokenizer *t)
{
    return t ? t->vocab_size : 0;
}

int32_t kvq_tokenizer_bos_id(const kvq_tokenizer *t)
{
    return t ? t->bos : -1;
}

int32_t kvq_tokenizer_eos_id(const kvq_tokenizer *t)
{
    return t ? t->eos : -1;
}

kvq_status kvq_tokenizer_set_bos_eos(kvq_tokenizer *t, int32_t bos, int32_t eos)
{
    if (!t)
        return KVQ_ERR_INVALID_ARG;
    if (bos < -1 || bos >= t->vocab_size || eos < -1 || eos >= t->vocab_size)
        return KVQ_ERR_RANGE;
    t->bos = bos;
    t->eos = eos;
    return KVQ_OK;
}

kvq_status kvq_tokenizer_piece(const kvq_tokenizer *t, int32_t id, const char **piece, size_t *len)
{
    if (!t || !piece)
        return KVQ_ERR_INVALID_ARG;
    if (id < 0 || id >= t->vocab_size || !(t->flags[id] & TOK_F_PRESENT)) {
        *piece = "";
        if (len)
            *len = 0;
        return KVQ_ERR_RANGE;
    }
    *piece = t->arena + t->piece_off[id];
    if (len)
        *len = t->piece_len[id];
    return KVQ_OK;
}

kvq_status kvq_tokenizer_token_id(const kvq_tokenizer *t, const char *piece, size_t len, int32_t *id)
{
    if (!t || !piece || !id)
        return KVQ_ERR_INVALID_ARG;
    int32_t v = tok_strmap_get(t, &t->added_map, t->piece_off, t->piece_len, piece, len);
    if (v < 0)
        v = tok_strmap_get(t, &t->vocab, t->model_off, t->model_len, piece, len);
    *id = v;
    return v < 0 ? KVQ_ERR_RANGE : KVQ_OK;
}

int kvq_tokenizer_is_special(const kvq_tokenizer *t, int32_t id)
{
    return t && id >= 0 && id < t->vocab_size && (t->flags[id] & TOK_F_SPECIAL) != 0;
}
