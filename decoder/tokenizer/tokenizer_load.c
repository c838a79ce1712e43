/* tokenizer_load.c - reading the model part of tokenizer.json: the BPE
 * vocabulary, the ranked merges and the added tokens, plus the typed JSON
 * accessors that give every malformed field its own message.
 */
#include "tokenizer_internal.h"

#include <cjson/cJSON.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- JSON helpers -------------------------------------------------------- */

const cJSON *tok_field(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* Optional boolean: absent or null gives def. */
kvq_status tok_get_bool(tok_loader *L, const cJSON *obj, const char *where, const char *key,
                        int def, int *out)
{
    const cJSON *v = tok_field(obj, key);
    if (!v) {
        *out = def;
        return KVQ_OK;
    }
    if (!cJSON_IsBool(v))
        return kvq_error_set(L->err, KVQ_ERR_FORMAT, "tokenizer.json: %s.%s is not a boolean",
                             where, key);
    *out = cJSON_IsTrue(v);
    return KVQ_OK;
}

/* Optional string: absent or null gives NULL. */
kvq_status tok_get_str(tok_loader *L, const cJSON *obj, const char *where, const char *key,
                       const char **out)
{
    const cJSON *v = tok_field(obj, key);
    *out = NULL;
    if (!v)
        return KVQ_OK;
    if (!cJSON_IsString(v) || !v->valuestring)
        return kvq_error_set(L->err, KVQ_ERR_FORMAT, "tokenizer.json: %s.%s is not a string",
                             where, key);
    if (!tok_utf8_valid(v->valuestring, strlen(v->valuestring)))
        return kvq_error_set(L->err, KVQ_ERR_FORMAT, "tokenizer.json: %s.%s is not valid UTF-8",
                             where, key);
    *out = v->valuestring;
    return KVQ_OK;
}

int tok_as_int(const cJSON *v, long lo, long hi, long *out)
{
    if (!cJSON_IsNumber(v))
        return 0;
    double d = v->valuedouble;
    if (!(d >= (double)lo && d <= (double)hi) || d != (double)(long)d)
        return 0;
    *out = (long)d;
    return 1;
}

/* One character, as Metaspace and Strip take. */
kvq_status tok_get_char(tok_loader *L, const cJSON *obj, const char *where, const char *key,
                        const char *def, char out[8], size_t *out_len)
{
    const char *s;
    kvq_status st = tok_get_str(L, obj, where, key, &s);
    if (st)
        return st;
    if (!s)
        s = def;
    uint32_t cp;
    size_t n = strlen(s);
    if (n == 0 || n > 4 || tok_utf8_next(s, n, &cp) != n)
        return kvq_error_set(L->err, KVQ_ERR_FORMAT,
                             "tokenizer.json: %s.%s must be one character", where, key);
    memcpy(out, s, n);
    out[n] = 0;
    *out_len = n;
    return KVQ_OK;
}

kvq_status tok_unsupported(tok_loader *L, const char *what, const char *type)
{
    return kvq_error_set(L->err, KVQ_ERR_UNSUPPORTED,
                         "tokenizer.json: %s '%.60s' is not supported (what kvq reads: "
                         "docs/tokenizer.md)",
                         what, type ? type : "(no type)");
}

kvq_status tok_take_str(tok_loader *L, const char *s, tok_str *out)
{
    size_t n = strlen(s);
    out->s = malloc(n + 1);
    if (!out->s)
        return kvq_error_set(L->err, KVQ_ERR_NOMEM, "out of memory");
    memcpy(out->s, s, n + 1);
    out->n = n;
    return KVQ_OK;
}

/* ---- arena and maps ------------------------------------------------------ */

kvq_status tok_arena_add(tok_loader *L, const char *s, size_t n, uint32_t *off)
{
    kvq_tokenizer *t = L->t;
    if (n > UINT32_MAX - t->arena_len - 1)
        return kvq_error_set(L->err, KVQ_ERR_FORMAT, "tokenizer.json: token strings too large");
    if (t->arena_len + n + 1 > t->arena_cap) {
        size_t cap = t->arena_cap ? t->arena_cap : 4096;
        while (cap < t->arena_len + n + 1)
            cap *= 2;
        char *a = realloc(t->arena, cap);
        if (!a)
            return kvq_error_set(L->err, KVQ_ERR_NOMEM, "out of memory");
        t->arena = a;
        t->arena_cap = cap;
    }
    memcpy(t->arena + t->arena_len, s, n);
    t->arena[t->arena_len + n] = 0;
    *off = (uint32_t)t->arena_len;
    t->arena_len += n + 1;
    return KVQ_OK;
}

static kvq_status strmap_init(tok_loader *L, tok_strmap *m, size_t count)
{
    size_t cap = 16;
    while (cap < 2 * count + 1)
        cap *= 2;
    m->slot = malloc(cap * sizeof *m->slot);
    if (!m->slot)
        return kvq_error_set(L->err, KVQ_ERR_NOMEM, "out of memory");
    memset(m->slot, 0xff, cap * sizeof *m->slot); /* -1 */
    m->mask = (uint32_t)(cap - 1);
    return KVQ_OK;
}

/* @return the id already holding this string, or -1 after inserting id. */
static int32_t strmap_put(kvq_tokenizer *t, tok_strmap *m, const uint32_t *off,
                          const uint32_t *len, int32_t id)
{
    const char *s = t->arena + off[id];
    size_t n = len[id];
    for (uint32_t i = (uint32_t)tok_hash(s, n) & m->mask;; i = (i + 1) & m->mask) {
        int32_t o = m->slot[i];
        if (o < 0) {
            m->slot[i] = id;
            return -1;
        }
        if (len[o] == n && memcmp(t->arena + off[o], s, n) == 0)
            return o;
    }
}

/* ---- the model ----------------------------------------------------------- */

static kvq_status load_vocab(tok_loader *L, const cJSON *vocab, const cJSON *added)
{
    kvq_tokenizer *t = L->t;
    if (!cJSON_IsObject(vocab))
        return kvq_error_set(L->err, KVQ_ERR_FORMAT, "tokenizer.json: model.vocab is missing or not an object");
    if (added && !cJSON_IsArray(added))
        return kvq_error_set(L->err, KVQ_ERR_FORMAT, "tokenizer.json: added_tokens is not an array");

    /* First pass: the largest id, to size the per-id tables. */
    long max_id = -1;
    size_t n_vocab = 0;
    for (const cJSON *e = vocab->child; e; e = e->next, n_vocab++) {
        long id;
        if (!tok_as_int(e, 0, KVQ_TOKENIZER_MAX_VOCAB - 1, &id))
            return kvq_error_set(L->err, KVQ_ERR_FORMAT,
                                 "tokenizer.json: model.vocab['%.40s'] is not an id in [0, %d)",
                                 e->string ? e->string : "", KVQ_TOKENIZER_MAX_VOCAB);
        if (id > max_id)
            max_id = id;
    }
    int n_added = 0;
    for (const cJSON *e = added ? added->child : NULL; e; e = e->next, n_added++) {
        long id;
        if (!cJSON_IsObject(e) || !tok_as_int(cJSON_GetObjectItemCaseSensitive(e, "id"), 0,
                                          KVQ_TOKENIZER_MAX_VOCAB - 1, &id))
            return kvq_error_set(L->err, KVQ_ERR_FORMAT,
                                 "tokenizer.json: added_tokens[%d] has no valid id", n_added);
        if (id > max_id)
            max_id = id;
    }
    if (max_id < 0)
        return kvq_error_set(L->err, KVQ_ERR_FORMAT, "tokenizer.json: the vocabulary is empty");
    t->vocab_size = (int32_t)(max_id + 1);
    size_t V = (size_t)t->vocab_size;
    t->piece_off = calloc(V, sizeof *t->piece_off);
    t->piece_len = calloc(V, sizeof *t->piece_len);
    t->model_off = calloc(V, sizeof *t->model_off);
    t->model_len = calloc(V, sizeof *t->model_len);
    t->flags = calloc(V, 1);
    t->dec_off = calloc(V, sizeof *t->dec_off);
    t->dec_len = calloc(V, sizeof *t->dec_len);
    t->dec_byte = malloc(V * sizeof *t->dec_byte);
    t->added = calloc((size_t)n_added + 1, sizeof *t->added);
    if (!t->piece_off || !t->piece_len || !t->model_off || !t->model_len || !t->flags ||
        !t->dec_off || !t->dec_len || !t->dec_byte || !t->added)
        return kvq_error_set(L->err, KVQ_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < V; i++)
        t->dec_byte[i] = -1;

    kvq_status st = strmap_init(L, &t->vocab, n_vocab);
    if (st)
        return st;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int32_t id = (int32_t)e->valuedouble;
        const char *s = e->string ? e->string : "";
        size_t n = strlen(s);
        if (!tok_utf8_valid(s, n))
            return kvq_error_set(L->err, KVQ_ERR_FORMAT,
                                 "tokenizer.json: model.vocab has a token (id %d) that is not valid UTF-8", id);
        if (t->flags[id] & TOK_F_PRESENT)
            return kvq_error_set(L->err, KVQ_ERR_FORMAT,
                                 "tokenizer.json: model.vocab gives id %d to two tokens", id);
        if ((st = tok_arena_add(L, s, n, &t->model_off[id])))
            return st;
        t->model_len[id] = (uint32_t)n;
        t->piece_off[id] = t->model_off[id];
        t->piece_len[id] = (uint32_t)n;
        t->flags[id] = TOK_F_PRESENT;
        /* A NUL inside a JSON string ("\u0000") truncates it in cJSON; such
         * a token could never be matched, so it stays out of the map. */
        if (n == 0)
            continue;
        int32_t dup = strmap_put(t, &t->vocab, t->model_off, t->model_len, id);
        if (dup >= 0)
            return kvq_error_set(L->err, KVQ_ERR_FORMAT,
                                 "tokenizer.json: model.vocab lists '%.40s' twice", s);
    }

    if ((st = strmap_init(L, &t->added_map, (size_t)n_added)))
        return st;
    int i = 0;
    for (const cJSON *e = added ? added->child : NULL; e; e = e->next, i++) {
        char where[48];
        snprintf(where, sizeof where, "added_tokens[%d]", i);
        int32_t id = (int32_t)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
        const char *content;
        int special, lstrip, rstrip, single_word, normalized;
        if ((st = tok_get_str(L, e, where, "content", &content)) ||
            (st = tok_get_bool(L, e, where, "special", 0, &special)) ||
            (st = tok_get_bool(L, e, where, "lstrip", 0, &lstrip)) ||
            (st = tok_get_bool(L, e, where, "rstrip", 0, &rstrip)) ||
            (st = tok_get_bool(L, e, where, "single_word", 0, &single_word)) ||
            (st = tok_get_bool(L, e, where, "normalized", !special, &normalized)))
            return st;
        if (!content || !*content)
            return kvq_error_set(L->err, KVQ_ERR_FORMAT, "tokenizer.json: %s has no content", where);
        if (t->flags[id] & TOK_F_ADDED)
            return kvq_error_set(L->err, KVQ_ERR_FORMAT,
                                 "tokenizer.json: added_tokens lists id %d twice", id);
        uint32_t off;
        size_t n = strlen(content);
        if ((st = tok_arena_add(L, content, n, &off)))
            return st;
        t->piece_off[id] = off;
        t->piece_len[id] = (uint32_t)n;
        t->flags[id] |= TOK_F_PRESENT | TOK_F_ADDED | (special ? TOK_F_SPECIAL : 0);
        t->added[i].id = id;
        t->added[i].off = off;
        t->added[i].len = (uint32_t)n;
        t->added[i].lstrip = (uint8_t)lstrip;
        t->added[i].rstrip = (uint8_t)rstrip;
        t->added[i].single_word = (uint8_t)single_word;
        t->added[i].normalized = (uint8_t)normalized;
        if (strmap_put(t, &t->added_map, t->piece_off, t->piece_len, id) >= 0)
            return kvq_error_set(L->err, KVQ_ERR_FORMAT,
                                 "tokenizer.json: added_tokens lists '%.40s' twice", content);
    }
    t->n_added = n_added;
    return KVQ_OK;
}

static int32_t trie_node(tok_trie *tr, uint8_t byte)
{
    if (tr->n == tr->cap) {
        int32_t cap = tr->cap ? 2 * tr->cap : 256;
        tok_trie_node *nn = realloc(tr->node, (size_t)cap * sizeof *nn);
        if (!nn)
            return -1;
        tr->node = nn;
        tr->cap = cap;
    }
    tok_trie_node *x = &tr->node[tr->n];
    x->child = x->sibling = x->added = -1;
    x->byte = byte;
    return tr->n++;
}

static kvq_status trie_add(tok_loader *L, tok_trie *tr, int idx)
{
    const kvq_tokenizer *t = L->t;
    const unsigned char *s = (const unsigned char *)t->arena + t->added[idx].off;
    uint32_t n = t->added[idx].len;
    int32_t cur = tr->root[s[0]];
    if (cur < 0) {
        if ((cur = trie_node(tr, s[0])) < 0)
            return kvq_error_set(L->err, KVQ_ERR_NOMEM, "out of memory");
        tr->root[s[0]] = cur;
    }
    for (uint32_t i = 1; i < n; i++) {
        int32_t c = tr->node[cur].child;
        while (c >= 0 && tr->node[c].byte != s[i])
            c = tr->node[c].sibling;
        if (c < 0) {
            if ((c = trie_node(tr, s[i])) < 0)
                return kvq_error_set(L->err, KVQ_ERR_NOMEM, "out of memory");
            tr->node[c].sibling = tr->node[cur].child;
            tr->node[cur].child = c;
        }
        cur = c;
    }
    tr->node[cur].added = idx;
    return KVQ_OK;
}

kvq_status tok_index_added(tok_loader *L)
{
    kvq_tokenizer *t = L->t;
    for (int c = 0; c < 256; c++)
        t->trie_raw.root[c] = t->trie_norm.root[c] = -1;
    for (int i = 0; i < t->n_added; i++) {
        /* Without a normalizer both lists match the same text; HF still
         * matches the normalized ones second, so keep them apart. */
        kvq_status st = trie_add(L, t->added[i].normalized ? &t->trie_norm : &t->trie_raw, i);
        if (st)
            return st;
    }
    return KVQ_OK;
}

static kvq_status load_merges(tok_loader *L, const cJSON *merges)
{
    kvq_tokenizer *t = L->t;
    if (!cJSON_IsArray(merges))
        return kvq_error_set(L->err, KVQ_ERR_FORMAT, "tokenizer.json: model.merges is missing or not an array");
    int n = cJSON_GetArraySize(merges);
    size_t cap = 16;
    while (cap < 2 * (size_t)n + 1)
        cap *= 2;
    t->merges = malloc(cap * sizeof *t->merges);
    if (!t->merges)
        return kvq_error_set(L->err, KVQ_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < cap; i++)
        t->merges[i].key = TOK_MERGE_EMPTY;
    t->merge_mask = (uint32_t)(cap - 1);

    char *buf = NULL;
    size_t buf_cap = 0;
    kvq_status st = KVQ_OK;
    int rank = 0;
    for (const cJSON *e = merges->child; e; e = e->next, rank++) {
        const char *a, *b;
        size_t na, nb;
        if (cJSON_IsString(e) && e->valuestring) {
            /* "a b": split at the first space, as HF does. */
            const char *sp = strchr(e->valuestring, ' ');
            if (!sp) {
                st = kvq_error_set(L->err, KVQ_ERR_FORMAT,
                                   "tokenizer.json: model.merges[%d] '%.40s' is not \"a b\"", rank,
                                   e->valuestring);
                break;
            }
            a = e->valuestring;
            na = (size_t)(sp - a);
            b = sp + 1;
            nb = strlen(b);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) &&
                   cJSON_IsString(e->child->next)) {
            a = e->child->valuestring;
            b = e->child->next->valuestring;
            na = strlen(a);
            nb = strlen(b);
        } else {
            st = kvq_error_set(L->err, KVQ_ERR_FORMAT,
                               "tokenizer.json: model.merges[%d] is neither \"a b\" nor [a, b]", rank);
            break;
        }
        int32_t ia = tok_strmap_get(t, &t->vocab, t->model_off, t->model_len, a, na);
        int32_t ib = tok_strmap_get(t, &t->vocab, t->model_off, t->model_len, b, nb);
        if (na + nb + 1 > buf_cap) {
            buf_cap = 2 * (na + nb + 1);
            char *nbuf = realloc(buf, buf_cap);
            if (!nbuf) {
                st = kvq_error_set(L->err, KVQ_ERR_NOMEM, "out of memory");
                break;
            }
            buf = nbuf;
        }
        memcpy(buf, a, na);
        memcpy(buf + na, b, nb);
        int32_t iab = tok_strmap_get(t, &t->vocab, t->model_off, t->model_len, buf, na + nb);
        if (ia < 0 || ib < 0 || iab < 0) {
            st = kvq_error_set(L->err, KVQ_ERR_FORMAT,
                               "tokenizer.json: model.merges[%d] ('%.*s' + '%.*s') uses a token "
                               "that is not in model.vocab",
                               rank, (int)(na < 40 ? na : 40), a, (int)(nb < 40 ? nb : 40), b);
            break;
        }
        /* A repeated pair takes the later rank, as HF's map insertion does. */
        uint64_t key = tok_merge_key(ia, ib);
        uint32_t s = tok_merge_slot(key) & t->merge_mask;
        while (t->merges[s].key != TOK_MERGE_EMPTY && t->merges[s].key != key)
            s = (s + 1) & t->merge_mask;
        t->merges[s].key = key;
        t->merges[s].rank = rank;
        t->merges[s].id = iab;
    }
    free(buf);
    return st;
}

kvq_status tok_load_model(tok_loader *L, const cJSON *root)
{
    kvq_tokenizer *t = L->t;
    const cJSON *model = tok_field(root, "model");
    if (!cJSON_IsObject(model))
        return kvq_error_set(L->err, KVQ_ERR_FORMAT, "tokenizer.json: 'model' is missing or not an object");
    const char *type, *unk, *prefix, *suffix;
    kvq_status st;
    if ((st = tok_get_str(L, model, "model", "type", &type)))
        return st;
    if (type ? strcmp(type, "BPE") != 0 : !tok_field(model, "merges"))
        return tok_unsupported(L, "model type", type);
    const cJSON *dropout = tok_field(model, "dropout");
    if (dropout && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0.0))
        return kvq_error_set(L->err, KVQ_ERR_UNSUPPORTED,
                             "tokenizer.json: BPE dropout is not supported (it makes encoding random)");
    if ((st = tok_get_str(L, model, "model", "unk_token", &unk)) ||
        (st = tok_get_str(L, model, "model", "continuing_subword_prefix", &prefix)) ||
        (st = tok_get_str(L, model, "model", "end_of_word_suffix", &suffix)) ||
        (st = tok_get_bool(L, model, "model", "byte_fallback", 0, &t->byte_fallback)) ||
        (st = tok_get_bool(L, model, "model", "fuse_unk", 0, &t->fuse_unk)) ||
        (st = tok_get_bool(L, model, "model", "ignore_merges", 0, &t->ignore_merges)))
        return st;
    if ((prefix && *prefix) || (suffix && *suffix))
        return kvq_error_set(L->err, KVQ_ERR_UNSUPPORTED,
                             "tokenizer.json: BPE continuing_subword_prefix/end_of_word_suffix "
                             "are not supported");
    if ((st = load_vocab(L, tok_field(model, "vocab"), tok_field(root, "added_tokens"))))
        return st;
    if ((st = load_merges(L, tok_field(model, "merges"))))
        return st;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_id[b] = tok_strmap_get(t, &t->vocab, t->model_off, t->model_len, name, 6);
    }
    t->unk = unk ? tok_strmap_get(t, &t->vocab, t->model_off, t->model_len, unk, strlen(unk)) : -1;
    t->unk_missing = unk && t->unk < 0;
    return KVQ_OK;
}
