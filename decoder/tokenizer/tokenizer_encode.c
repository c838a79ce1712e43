/* tokenizer_encode.c - text -> ids, step for step as HF tokenizers does it:
 *
 *   1. cut the added tokens with normalized=false out of the raw text
 *      (leftmost-longest, with their single_word / lstrip / rstrip rules);
 *   2. normalize each remaining segment (Replace, Prepend, NFC..., Strip, ...),
 *      then cut the normalized=true added tokens out of the result;
 *   3. pre-tokenize each piece into words (Split, ByteLevel, Metaspace,
 *      Digits, Punctuation, Whitespace...), each word remembering whether it
 *      starts at offset 0 of the original text (Metaspace "first");
 *   4. BPE each word: characters -> ids (byte fallback / unk), then apply the
 *      lowest-ranked merge, leftmost first, until none applies;
 *   5. the post-processor's template ids around it all, when asked for.
 *
 * Steps 2-3 are in tokenizer_pretok.c, step 4 in tokenizer_bpe.c; this file
 * cuts the added tokens out, drives the rest and owns the public calls.
 * Scratch memory lives in one struct per call: encoding is not on the
 * per-token hot path.
 */
#include "tokenizer_enc.h"

#include <stdlib.h>
#include <string.h>

int tok_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 1;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return 0;
    *p = q;
    *cap = c;
    return 1;
}

kvq_status tok_push_id(enc *e, int32_t id)
{
    if (!tok_grow((void **)&e->ids, &e->cap_ids, e->n_ids + 1, sizeof *e->ids))
        return KVQ_ERR_NOMEM;
    e->ids[e->n_ids++] = id;
    return KVQ_OK;
}

static int32_t trie_match(const tok_trie *tr, const char *s, size_t n, size_t i, size_t *len)
{
    int32_t node = tr->root[(unsigned char)s[i]], best = -1;
    size_t j = i + 1;
    while (node >= 0) {
        if (tr->node[node].added >= 0) {
            best = tr->node[node].added;
            *len = j - i;
        }
        if (j >= n)
            break;
        unsigned char c = (unsigned char)s[j++];
        node = tr->node[node].child;
        while (node >= 0 && tr->node[node].byte != c)
            node = tr->node[node].sibling;
    }
    return best;
}

static int word_before(const char *s, size_t i)
{
    if (i == 0)
        return 0;
    size_t j = i - 1;
    while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80)
        j--;
    uint32_t cp;
    tok_utf8_next(s + j, i - j, &cp);
    return tok_is_word(cp);
}

static int word_after(const char *s, size_t n, size_t i)
{
    uint32_t cp;
    if (i >= n)
        return 0;
    tok_utf8_next(s + i, n - i, &cp);
    return tok_is_word(cp);
}

/* Splits s[0..n) at the added tokens of tr, as HF's find_matches does;
 * each gap goes to fn(gap start, gap end), each token is pushed. */
typedef kvq_status (*gap_fn)(enc *e, const char *s, size_t a, size_t b, void *arg);
static kvq_status split_added(enc *e, const tok_trie *tr, const char *s, size_t n, gap_fn fn, void *arg)
{
    const kvq_tokenizer *t = e->t;
    kvq_status st;
    size_t done = 0; /* text before this is consumed */
    for (size_t i = 0; i < n;) {
        size_t ml = 0;
        int32_t a = tr->root[(unsigned char)s[i]] >= 0 ? trie_match(tr, s, n, i, &ml) : -1;
        if (a < 0) {
            i++;
            continue;
        }
        const tok_added *ad = &t->added[a];
        size_t start = i, stop = i + ml;
        i = stop; /* matches never overlap, also when one is discarded */
        if (ad->single_word && (word_before(s, start) || word_after(s, n, stop)))
            continue;
        if (ad->lstrip) {
            size_t j = start, cl;
            while (j > done) {
                size_t k = j - 1;
                while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80)
                    k--;
                if (!tok_is_ws_at(s, j, k, &cl))
                    break;
                j = k;
            }
            start = j;
        }
        if (ad->rstrip) {
            size_t cl;
            while (stop < n && tok_is_ws_at(s, n, stop, &cl))
                stop += cl;
            i = stop;
        }
        if (done < start && (st = fn(e, s, done, start, arg)))
            return st;
        if ((st = tok_push_id(e, ad->id)))
            return st;
        done = stop;
    }
    return done < n ? fn(e, s, done, n, arg) : KVQ_OK;
}

/* A gap of normalized text: pre-tokenize and BPE it. arg: origin flag. */
static kvq_status norm_gap(enc *e, const char *s, size_t a, size_t b, void *arg)
{
    return tok_pretok_bpe(e, s + a, b - a, *(const int *)arg && a == 0);
}

/* A gap of raw text between non-normalized added tokens: normalize it, then
 * split at the normalized added tokens. */
static kvq_status raw_gap(enc *e, const char *s, size_t a, size_t b, void *arg)
{
    (void)arg;
    int cur;
    size_t len;
    kvq_status st = tok_normalize(e, s + a, b - a, &cur, &len);
    if (st || len == 0)
        return st;
    /* pretok_bpe reuses buf[]: the normalized text moves out first. */
    if (!tok_grow((void **)&e->ntext, &e->cap_ntext, len + 1, 1))
        return KVQ_ERR_NOMEM;
    memcpy(e->ntext, e->buf[cur], len);
    int origin = a == 0;
    if (e->t->trie_norm.n == 0)
        return tok_pretok_bpe(e, e->ntext, len, origin);
    return split_added(e, &e->t->trie_norm, e->ntext, len, norm_gap, &origin);
}

static kvq_status encode_all(enc *e, const char *text, size_t len, int add_bos)
{
    const kvq_tokenizer *t = e->t;
    kvq_status st;
    if (add_bos && t->has_template) {
        for (int i = 0; i < t->n_tpl_pre; i++)
            if ((st = tok_push_id(e, t->tpl_pre[i])))
                return st;
    } else if (add_bos && t->bos >= 0 && (st = tok_push_id(e, t->bos))) {
        return st;
    }
    if ((st = split_added(e, &t->trie_raw, text, len, raw_gap, NULL)))
        return st;
    if (add_bos && t->has_template)
        for (int i = 0; i < t->n_tpl_post; i++)
            if ((st = tok_push_id(e, t->tpl_post[i])))
                return st;
    return KVQ_OK;
}

static void enc_free(enc *e)
{
    free(e->buf[0]);
    free(e->buf[1]);
    free(e->spans[0]);
    free(e->spans[1]);
    free(e->syms);
    free(e->heap);
    free(e->pieces);
    free(e->tmp);
    free(e->ntext);
    pcre2_match_data_free(e->md);
    pcre2_match_context_free(e->mctx);
    pcre2_jit_stack_free(e->jit);
}

kvq_status kvq_tokenizer_encode_alloc(const kvq_tokenizer *tok, const char *text, size_t len,
                                      int add_bos, int32_t **ids, size_t *n_ids)
{
    if (!tok || (!text && len) || !ids || !n_ids)
        return KVQ_ERR_INVALID_ARG;
    *ids = NULL;
    *n_ids = 0;
    if (len && !tok_utf8_valid(text, len))
        return KVQ_ERR_INVALID_ARG;
    enc e;
    memset(&e, 0, sizeof e);
    e.t = tok;
    kvq_status st = encode_all(&e, text ? text : "", len, add_bos);
    enc_free(&e);
    if (st) {
        free(e.ids);
        return st;
    }
    *ids = e.ids;
    *n_ids = e.n_ids;
    return KVQ_OK;
}

kvq_status kvq_tokenizer_encode(const kvq_tokenizer *tok, const char *text, size_t len, int add_bos,
                                int32_t *ids, size_t max_ids, size_t *n_ids)
{
    if (!n_ids || (!ids && max_ids))
        return KVQ_ERR_INVALID_ARG;
    *n_ids = 0;
    int32_t *all;
    size_t n;
    kvq_status st = kvq_tokenizer_encode_alloc(tok, text, len, add_bos, &all, &n);
    if (st)
        return st;
    size_t k = n < max_ids ? n : max_ids;
    if (k)
        memcpy(ids, all, k * sizeof *ids);
    free(all);
    *n_ids = n;
    return n > max_ids ? KVQ_ERR_RANGE : KVQ_OK;
}
