/* tokenizer_encode.c - text -> ids, step for step as HF tokenizers does it:
 *
 *   1. cut the added tokens out of the raw text (leftmost-longest);
 *   2. normalize each remaining segment (Replace, Prepend);
 *   3. pre-tokenize it into words (Metaspace, Digits), each word remembering
 *      whether it starts at offset 0 of the original text (Metaspace "first");
 *   4. BPE each word: characters -> ids (byte fallback / unk), then apply the
 *      lowest-ranked merge, leftmost first, until none applies.
 *
 * Step 4 uses a binary heap of candidate pairs keyed (rank, position), so a
 * word of n symbols costs O(n log n); stale heap entries are recognised and
 * skipped, as in HF's Word::merge_all. Scratch memory lives in one struct per
 * call: encoding is not on the per-token hot path.
 */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

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
} enc;

static int grow(void **p, size_t *cap, size_t need, size_t elem)
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

static kvq_status push_id(enc *e, int32_t id)
{
    if (!grow((void **)&e->ids, &e->cap_ids, e->n_ids + 1, sizeof *e->ids))
        return KVQ_ERR_NOMEM;
    e->ids[e->n_ids++] = id;
    return KVQ_OK;
}

/* ---- BPE ------------------------------------------------------------------ */

static int cand_less(const cand *a, const cand *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(enc *e, cand c)
{
    size_t i = e->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &e->heap[p]))
            break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = c;
}

static cand heap_pop(enc *e)
{
    cand top = e->heap[0], last = e->heap[--e->n_heap];
    size_t i = 0, n = e->n_heap;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        const cand *best = &last;
        if (l < n && cand_less(&e->heap[l], best)) {
            m = l;
            best = &e->heap[l];
        }
        if (l + 1 < n && cand_less(&e->heap[l + 1], best))
            m = l + 1;
        if (m == i)
            break;
        e->heap[i] = e->heap[m];
        i = m;
    }
    if (n)
        e->heap[i] = last;
    return top;
}

/* Queues the pair starting at symbol pos, if it is a merge. */
static void queue_pair(enc *e, int32_t pos)
{
    const sym *s = &e->syms[pos];
    if (s->next < 0)
        return;
    long m = tok_merge_find(e->t, s->id, e->syms[s->next].id);
    if (m < 0)
        return;
    cand c = {e->t->merges[m].rank, pos, e->t->merges[m].id};
    heap_push(e, c);
}

static kvq_status add_sym(enc *e, int32_t *n, int32_t id)
{
    if (!grow((void **)&e->syms, &e->cap_syms, (size_t)*n + 1, sizeof *e->syms))
        return KVQ_ERR_NOMEM;
    sym *s = &e->syms[*n];
    s->id = id;
    s->prev = *n - 1;
    s->next = -1;
    s->alive = 1;
    if (*n > 0)
        e->syms[*n - 1].next = *n;
    (*n)++;
    return KVQ_OK;
}

static kvq_status bpe_word(enc *e, const char *w, size_t n)
{
    const kvq_tokenizer *t = e->t;
    kvq_status st;
    if (t->ignore_merges) {
        int32_t id = tok_strmap_get(t, &t->vocab, t->model_off, t->model_len, w, n);
        if (id >= 0)
            return push_id(e, id);
    }
    /* Characters to symbols. A pending unknown is emitted only when the next
     * in-vocabulary character (or the end) comes, exactly as HF orders it. */
    int32_t n_sym = 0, pending_unk = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t cl = tok_utf8_next(w + i, n - i, &cp);
        int32_t id = tok_strmap_get(t, &t->vocab, t->model_off, t->model_len, w + i, cl);
        if (id >= 0) {
            if (pending_unk) {
                if ((st = add_sym(e, &n_sym, t->unk)))
                    return st;
                pending_unk = 0;
            }
            if ((st = add_sym(e, &n_sym, id)))
                return st;
            i += cl;
            continue;
        }
        int bytes_ok = t->byte_fallback;
        for (size_t j = 0; bytes_ok && j < cl; j++)
            bytes_ok = t->byte_id[(unsigned char)w[i + j]] >= 0;
        if (bytes_ok) {
            for (size_t j = 0; j < cl; j++)
                if ((st = add_sym(e, &n_sym, t->byte_id[(unsigned char)w[i + j]])))
                    return st;
        } else if (t->unk >= 0) {
            if (pending_unk && !t->fuse_unk)
                if ((st = add_sym(e, &n_sym, t->unk)))
                    return st;
            pending_unk = 1;
        } else if (t->unk_missing) {
            return KVQ_ERR_UNSUPPORTED;
        } /* no unk_token at all: HF drops the character */
        i += cl;
    }
    if (pending_unk && (st = add_sym(e, &n_sym, t->unk)))
        return st;
    if (n_sym == 0)
        return KVQ_OK;

    if (!grow((void **)&e->heap, &e->cap_heap, 2 * (size_t)n_sym + 2, sizeof *e->heap))
        return KVQ_ERR_NOMEM;
    e->n_heap = 0;
    for (int32_t i = 0; i + 1 < n_sym; i++)
        queue_pair(e, i);
    while (e->n_heap) {
        /* Each merge removes one symbol and queues at most two pairs, so the
         * heap never holds more than 2 * n_sym entries. */
        cand c = heap_pop(e);
        sym *l = &e->syms[c.pos];
        if (!l->alive || l->next < 0)
            continue;
        sym *r = &e->syms[l->next];
        long m = tok_merge_find(t, l->id, r->id);
        if (m < 0 || t->merges[m].id != c.id)
            continue; /* stale: one side was merged since this was queued */
        l->id = c.id;
        r->alive = 0;
        l->next = r->next;
        if (r->next >= 0)
            e->syms[r->next].prev = c.pos;
        if (l->prev >= 0)
            queue_pair(e, l->prev);
        queue_pair(e, c.pos);
    }
    for (int32_t i = 0; i >= 0; i = e->syms[i].next)
        if ((st = push_id(e, e->syms[i].id)))
            return st;
    return KVQ_OK;
}

/* ---- normalizer ------------------------------------------------------------ */

/* Runs the normalizer over s[0..n); the result is in e->buf[*which][0..*out_n). */
static kvq_status normalize(enc *e, const char *s, size_t n, int *which, size_t *out_n)
{
    const kvq_tokenizer *t = e->t;
    int cur = 0;
    if (!grow((void **)&e->buf[0], &e->cap[0], n + 1, 1))
        return KVQ_ERR_NOMEM;
    memcpy(e->buf[0], s, n);
    for (int k = 0; k < t->n_norm; k++) {
        const tok_norm *nm = &t->norm[k];
        const char *src = e->buf[cur];
        int dst = !cur;
        if (nm->kind == TOK_NORM_PREPEND) {
            if (n == 0)
                continue; /* HF prepends to non-empty strings only */
            if (!grow((void **)&e->buf[dst], &e->cap[dst], n + nm->content.n + 1, 1))
                return KVQ_ERR_NOMEM;
            memcpy(e->buf[dst], nm->content.s, nm->content.n);
            memcpy(e->buf[dst] + nm->content.n, src, n);
            n += nm->content.n;
        } else {
            size_t worst = nm->content.n > nm->pattern.n ? n / nm->pattern.n * nm->content.n + n : n;
            if (!grow((void **)&e->buf[dst], &e->cap[dst], worst + 1, 1))
                return KVQ_ERR_NOMEM;
            src = e->buf[cur];
            char *w = e->buf[dst];
            size_t o = 0;
            for (size_t i = 0; i < n;) {
                if (i + nm->pattern.n <= n && memcmp(src + i, nm->pattern.s, nm->pattern.n) == 0) {
                    memcpy(w + o, nm->content.s, nm->content.n);
                    o += nm->content.n;
                    i += nm->pattern.n;
                } else {
                    w[o++] = src[i++];
                }
            }
            n = o;
        }
        cur = dst;
    }
    *which = cur;
    *out_n = n;
    return KVQ_OK;
}

/* ---- pre-tokenizers --------------------------------------------------------- */

/* Output side of one pre-tokenizer step. */
typedef struct sink {
    enc *e;
    int dst;
    size_t n_text, n_spans;
} sink;

static kvq_status sink_text(sink *k, const char *s, size_t n)
{
    enc *e = k->e;
    if (!grow((void **)&e->buf[k->dst], &e->cap[k->dst], k->n_text + n + 1, 1))
        return KVQ_ERR_NOMEM;
    memcpy(e->buf[k->dst] + k->n_text, s, n);
    k->n_text += n;
    return KVQ_OK;
}

/* Closes the piece that began at text offset start (no-op when empty). */
static kvq_status sink_span(sink *k, size_t start, int origin)
{
    if (k->n_text == start)
        return KVQ_OK;
    enc *e = k->e;
    if (!grow((void **)&e->spans[k->dst], &e->cap_spans[k->dst], k->n_spans + 1, sizeof(span)))
        return KVQ_ERR_NOMEM;
    span sp = {start, k->n_text - start, origin};
    e->spans[k->dst][k->n_spans++] = sp;
    return KVQ_OK;
}

static kvq_status metaspace(sink *k, const tok_pre *p, const char *s, size_t n, int origin)
{
    kvq_status st;
    /* Spaces become the replacement; then maybe a leading replacement. */
    int starts = 0;
    if (n >= 1 && s[0] == ' ')
        starts = 1;
    else if (n >= p->repl_len && memcmp(s, p->repl, p->repl_len) == 0)
        starts = 1;
    int prepend = !starts && (p->prepend == TOK_PREPEND_ALWAYS ||
                              (p->prepend == TOK_PREPEND_FIRST && origin));
    size_t start = k->n_text;
    int first = 1;
    if (prepend && (st = sink_text(k, p->repl, p->repl_len)))
        return st;
    for (size_t i = 0; i < n;) {
        int is_space = s[i] == ' ';
        int is_repl = !is_space && i + p->repl_len <= n && memcmp(s + i, p->repl, p->repl_len) == 0;
        if ((is_space || is_repl) && p->split) {
            /* MergedWithNext: every replacement begins a new piece. */
            if (k->n_text > start) {
                if ((st = sink_span(k, start, origin && first)))
                    return st;
                first = 0;
            }
            start = k->n_text;
        }
        if (is_space || is_repl) {
            if ((st = sink_text(k, p->repl, p->repl_len)))
                return st;
            i += is_space ? 1 : p->repl_len;
        } else {
            if ((st = sink_text(k, s + i, 1)))
                return st;
            i++;
        }
    }
    return sink_span(k, start, origin && first);
}

static kvq_status digits(sink *k, const tok_pre *p, const char *s, size_t n, int origin)
{
    kvq_status st;
    size_t start = k->n_text;
    int first = 1, prev_num = -1;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t cl = tok_utf8_next(s + i, n - i, &cp);
        int num = tok_is_numeric(cp);
        /* Isolated: a numeric character is a piece of its own. Contiguous: a
         * run of them is. Non-numeric runs stay together either way. */
        int cut = prev_num >= 0 && (num != prev_num || (num && p->individual));
        if (cut) {
            if ((st = sink_span(k, start, origin && first)))
                return st;
            first = 0;
            start = k->n_text;
        }
        if ((st = sink_text(k, s + i, cl)))
            return st;
        prev_num = num;
        i += cl;
    }
    return sink_span(k, start, origin && first);
}

/* Normalizes, pre-tokenizes and BPEs one segment of text between added tokens. */
static kvq_status segment(enc *e, const char *s, size_t n, int origin)
{
    if (n == 0)
        return KVQ_OK;
    const kvq_tokenizer *t = e->t;
    int cur;
    size_t len;
    kvq_status st = normalize(e, s, n, &cur, &len);
    if (st)
        return st;
    if (len == 0)
        return KVQ_OK;
    if (!grow((void **)&e->spans[cur], &e->cap_spans[cur], 1, sizeof(span)))
        return KVQ_ERR_NOMEM;
    span whole = {0, len, origin};
    e->spans[cur][0] = whole;
    size_t n_spans = 1;
    for (int k = 0; k < t->n_pre; k++) {
        sink out = {e, !cur, 0, 0};
        for (size_t i = 0; i < n_spans; i++) {
            span sp = e->spans[cur][i];
            /* sink_text may move buf[dst] but never buf[cur]. */
            const char *src = e->buf[cur] + sp.off;
            st = t->pre[k].kind == TOK_PRE_METASPACE ? metaspace(&out, &t->pre[k], src, sp.len, sp.origin)
                                                     : digits(&out, &t->pre[k], src, sp.len, sp.origin);
            if (st)
                return st;
        }
        cur = !cur;
        n_spans = out.n_spans;
    }
    for (size_t i = 0; i < n_spans; i++) {
        span sp = e->spans[cur][i];
        if ((st = bpe_word(e, e->buf[cur] + sp.off, sp.len)))
            return st;
    }
    return KVQ_OK;
}

static kvq_status encode_all(enc *e, const char *text, size_t len, int add_bos)
{
    const kvq_tokenizer *t = e->t;
    kvq_status st;
    if (add_bos && t->bos >= 0 && (st = push_id(e, t->bos)))
        return st;
    size_t seg = 0;
    for (size_t i = 0; i < len;) {
        unsigned c = (unsigned char)text[i];
        int32_t hit = -1;
        size_t hit_len = 0;
        for (int32_t k = t->first_start[c]; k < t->first_start[c + 1]; k++) {
            const tok_added *a = &t->added[t->added_order[k]];
            if (a->len <= len - i && memcmp(text + i, t->arena + a->off, a->len) == 0) {
                hit = a->id; /* longest first, so the first hit is the longest */
                hit_len = a->len;
                break;
            }
        }
        if (hit < 0) {
            i++;
            continue;
        }
        if ((st = segment(e, text + seg, i - seg, seg == 0)) || (st = push_id(e, hit)))
            return st;
        i += hit_len;
        seg = i;
    }
    return segment(e, text + seg, len - seg, seg == 0);
}

static void enc_free(enc *e)
{
    free(e->buf[0]);
    free(e->buf[1]);
    free(e->spans[0]);
    free(e->spans[1]);
    free(e->syms);
    free(e->heap);
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
