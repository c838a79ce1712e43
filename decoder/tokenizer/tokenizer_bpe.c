/* tokenizer_bpe.c - step 4 of encoding: BPE of one word. Characters become
 * ids (byte fallback / unk as HF orders them), then the lowest-ranked merge,
 * leftmost first, applies until none does. A binary heap of candidate pairs
 * keyed (rank, position) makes a word of n symbols cost O(n log n); stale
 * heap entries are recognised and skipped, as in HF's Word::merge_all.
 */
#include "tokenizer_enc.h"

#include <stdlib.h>
#include <string.h>


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
    if (!tok_grow((void **)&e->syms, &e->cap_syms, (size_t)*n + 1, sizeof *e->syms))
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

kvq_status tok_bpe_word(enc *e, const char *w, size_t n)
{
    const kvq_tokenizer *t = e->t;
    kvq_status st;
    if (t->ignore_merges) {
        int32_t id = tok_strmap_get(t, &t->vocab, t->model_off, t->model_len, w, n);
        if (id >= 0)
            return tok_push_id(e, id);
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

    if (!tok_grow((void **)&e->heap, &e->cap_heap, 2 * (size_t)n_sym + 2, sizeof *e->heap))
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
        if ((st = tok_push_id(e, e->syms[i].id)))
            return st;
    return KVQ_OK;
}

/* memmem is not C11/POSIX. */
