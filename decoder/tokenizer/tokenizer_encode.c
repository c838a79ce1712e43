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
 * Step 4 uses a binary heap of candidate pairs keyed (rank, position), so a
 * word of n symbols costs O(n log n); stale heap entries are recognised and
 * skipped, as in HF's Word::merge_all. Scratch memory lives in one struct per
 * call: encoding is not on the per-token hot path.
 */
#include "tokenizer_internal.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

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

/* memmem is not C11/POSIX. */
static const char *find_str(const char *h, size_t hn, const char *nd, size_t nn)
{
    if (nn == 0 || nn > hn)
        return NULL;
    for (const char *p = h, *end = h + hn - nn; p <= end;) {
        const char *q = memchr(p, nd[0], (size_t)(end - p) + 1);
        if (!q)
            return NULL;
        if (memcmp(q, nd, nn) == 0)
            return q;
        p = q + 1;
    }
    return NULL;
}

/* ---- regex matching ------------------------------------------------------- */

static kvq_status regex_ready(enc *e)
{
    if (e->md)
        return KVQ_OK;
    e->md = pcre2_match_data_create(16, NULL);
    e->mctx = pcre2_match_context_create(NULL);
    /* Patterns like \s+(?!\S) backtrack over whole whitespace runs: give JIT
     * more than its default 32 KiB of stack. */
    e->jit = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, NULL);
    if (!e->md || !e->mctx || !e->jit)
        return KVQ_ERR_NOMEM;
    pcre2_jit_stack_assign(e->mctx, NULL, e->jit);
    return KVQ_OK;
}

/* Next match of re in s[0..n) at or after *pos: KVQ_OK with [*ms, *me), or
 * *ms = n when there is none. Empty matches are skipped. */
static kvq_status regex_next(enc *e, const void *re, const char *s, size_t n, size_t pos, size_t *ms,
                             size_t *me)
{
    kvq_status st = regex_ready(e);
    if (st)
        return st;
    while (pos <= n) {
        int rc = pcre2_match((const pcre2_code *)re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, e->md, e->mctx);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0)
            return KVQ_ERR_NOMEM; /* match or JIT stack limit: pathological input */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        if (ov[1] > ov[0]) {
            *ms = ov[0];
            *me = ov[1];
            return KVQ_OK;
        }
        /* Empty match: HF drops empty pieces; step over one character. */
        if (ov[0] >= n)
            break;
        uint32_t cp;
        pos = ov[0] + tok_utf8_next(s + ov[0], n - ov[0], &cp);
    }
    *ms = *me = n;
    return KVQ_OK;
}

/* ---- normalizer ------------------------------------------------------------ */

static int is_ws_at(const char *s, size_t n, size_t i, size_t *cl)
{
    uint32_t cp;
    *cl = tok_utf8_next(s + i, n - i, &cp);
    return tok_is_whitespace(cp);
}

/* One normalizer step from src[0..n) into buf[dst]; *n updated. */
static kvq_status norm_step(enc *e, const tok_norm *nm, const char *src, int dst, size_t *np)
{
    size_t n = *np;
    if (nm->kind == TOK_NORM_PREPEND) {
        if (n == 0)
            return KVQ_OK; /* HF prepends to non-empty strings only */
        if (!grow((void **)&e->buf[dst], &e->cap[dst], n + nm->content.n + 1, 1))
            return KVQ_ERR_NOMEM;
        memcpy(e->buf[dst], nm->content.s, nm->content.n);
        memcpy(e->buf[dst] + nm->content.n, src, n);
        *np = n + nm->content.n;
        return KVQ_OK;
    }
    if (nm->kind == TOK_NORM_REPLACE) {
        /* Literal content, also for regex patterns (HF does not expand $1). */
        size_t o = 0, i = 0;
        while (i < n) {
            size_t ms, me;
            if (nm->re) {
                kvq_status st = regex_next(e, nm->re, src, n, i, &ms, &me);
                if (st)
                    return st;
            } else {
                const char *hit = find_str(src + i, n - i, nm->pattern.s, nm->pattern.n);
                ms = hit ? (size_t)(hit - src) : n;
                me = hit ? ms + nm->pattern.n : n;
            }
            size_t need = o + (ms - i) + (ms < n ? nm->content.n : 0) + 1;
            if (!grow((void **)&e->buf[dst], &e->cap[dst], need, 1))
                return KVQ_ERR_NOMEM;
            memcpy(e->buf[dst] + o, src + i, ms - i);
            o += ms - i;
            if (ms < n) {
                memcpy(e->buf[dst] + o, nm->content.s, nm->content.n);
                o += nm->content.n;
            }
            i = me;
        }
        *np = o;
        return KVQ_OK;
    }
    if (nm->kind == TOK_NORM_STRIP) {
        size_t lo = 0, hi = n, cl;
        while (nm->strip_left && lo < hi && is_ws_at(src, hi, lo, &cl))
            lo += cl;
        while (nm->strip_right && hi > lo) {
            size_t j = hi - 1;
            while (j > lo && ((unsigned char)src[j] & 0xC0) == 0x80)
                j--;
            if (!is_ws_at(src, hi, j, &cl))
                break;
            hi = j;
        }
        if (!grow((void **)&e->buf[dst], &e->cap[dst], hi - lo + 1, 1))
            return KVQ_ERR_NOMEM;
        memcpy(e->buf[dst], src + lo, hi - lo);
        *np = hi - lo;
        return KVQ_OK;
    }
    size_t out_n;
    char *m = tok_unicode_map(nm->kind, src, n, &out_n);
    if (!m)
        return KVQ_ERR_NOMEM;
    int ok = grow((void **)&e->buf[dst], &e->cap[dst], out_n + 1, 1);
    if (ok)
        memcpy(e->buf[dst], m, out_n);
    free(m);
    if (!ok)
        return KVQ_ERR_NOMEM;
    *np = out_n;
    return KVQ_OK;
}

/* Runs the normalizer over s[0..n); the result is in e->buf[*which][0..*out_n). */
static kvq_status normalize(enc *e, const char *s, size_t n, int *which, size_t *out_n)
{
    const kvq_tokenizer *t = e->t;
    int cur = 0;
    if (!grow((void **)&e->buf[0], &e->cap[0], n + 1, 1))
        return KVQ_ERR_NOMEM;
    memcpy(e->buf[0], s, n);
    for (int k = 0; k < t->n_norm; k++) {
        kvq_status st = norm_step(e, &t->norm[k], e->buf[cur], !cur, &n);
        if (st)
            return st;
        cur = !cur;
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

static kvq_status add_piece(enc *e, size_t *np, size_t start, size_t end, int match)
{
    if (!grow((void **)&e->pieces, &e->cap_pieces, *np + 1, sizeof *e->pieces))
        return KVQ_ERR_NOMEM;
    piece pc = {start, end, match};
    e->pieces[(*np)++] = pc;
    return KVQ_OK;
}

/* The matches of p's pattern in s[0..n), as HF's Pattern::find_matches lists
 * them: consecutive pieces covering s, each flagged match or not. */
static kvq_status find_matches(enc *e, const tok_pre *p, const char *s, size_t n, size_t *np)
{
    kvq_status st;
    size_t prev = 0, i = 0;
    *np = 0;
    if (p->kind == TOK_PRE_PUNCT || p->kind == TOK_PRE_WSPLIT) {
        /* A character predicate: every such character is a match of its own. */
        while (i < n) {
            uint32_t cp;
            size_t cl = tok_utf8_next(s + i, n - i, &cp);
            int hit = p->kind == TOK_PRE_PUNCT ? tok_is_punct(cp) : tok_is_whitespace(cp);
            if (hit) {
                if (prev < i && (st = add_piece(e, np, prev, i, 0)))
                    return st;
                if ((st = add_piece(e, np, i, i + cl, 1)))
                    return st;
                prev = i + cl;
            }
            i += cl;
        }
    } else {
        while (i < n) {
            size_t ms, me;
            if (p->re) {
                if ((st = regex_next(e, p->re, s, n, i, &ms, &me)))
                    return st;
            } else {
                const char *hit = find_str(s + i, n - i, p->pattern.s, p->pattern.n);
                ms = hit ? (size_t)(hit - s) : n;
                me = hit ? ms + p->pattern.n : n;
            }
            if (ms >= n)
                break;
            if (prev < ms && (st = add_piece(e, np, prev, ms, 0)))
                return st;
            if ((st = add_piece(e, np, ms, me, 1)))
                return st;
            prev = i = me;
        }
    }
    if (prev < n && (st = add_piece(e, np, prev, n, 0)))
        return st;
    return KVQ_OK;
}

/* HF's SplitDelimiterBehavior over the pieces, in place; pieces to drop keep
 * match = 1, the others match = 0. */
static size_t apply_behavior(piece *pc, size_t n, enum tok_behavior b, int invert)
{
    if (invert)
        for (size_t i = 0; i < n; i++)
            pc[i].match = !pc[i].match;
    size_t w = 0;
    int prev_match = 0;
    switch (b) {
    case TOK_B_REMOVED:
        return n;
    case TOK_B_ISOLATED:
        for (size_t i = 0; i < n; i++)
            pc[i].match = 0;
        return n;
    case TOK_B_PREV:
        for (size_t i = 0; i < n; i++) {
            if (pc[i].match && !prev_match && w > 0)
                pc[w - 1].end = pc[i].end;
            else
                pc[w++] = (piece){pc[i].start, pc[i].end, 0};
            prev_match = pc[i].match;
        }
        return w;
    case TOK_B_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            if (pc[i].match == prev_match && w > 0)
                pc[w - 1].end = pc[i].end;
            else
                pc[w++] = (piece){pc[i].start, pc[i].end, 0};
            prev_match = pc[i].match;
        }
        return w;
    case TOK_B_NEXT: {
        /* Right to left, writing from the end, then moved to the front. */
        size_t r = n;
        for (size_t i = n; i-- > 0;) {
            if (pc[i].match && !prev_match && r < n)
                pc[r].start = pc[i].start;
            else
                pc[--r] = (piece){pc[i].start, pc[i].end, 0};
            prev_match = pc[i].match;
        }
        memmove(pc, pc + r, (n - r) * sizeof *pc);
        return n - r;
    }
    }
    return n;
}

/* ByteLevel's byte -> character mapping of s[0..n) into the sink. */
static kvq_status sink_bytelevel(sink *k, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t cl;
        const char *c = tok_bytelevel_char((unsigned char)s[i], &cl);
        kvq_status st = sink_text(k, c, cl);
        if (st)
            return st;
    }
    return KVQ_OK;
}

/* Split, Punctuation, Whitespace, WhitespaceSplit and ByteLevel: find the
 * matches, apply the behaviour, emit the pieces kept. */
static kvq_status split_step(sink *k, const tok_pre *p, const char *s, size_t n, int origin)
{
    enc *e = k->e;
    kvq_status st;
    const char *text = s;
    if (p->kind == TOK_PRE_BYTELEVEL && p->add_prefix_space && (n == 0 || s[0] != ' ')) {
        if (!grow((void **)&e->tmp, &e->cap_tmp, n + 2, 1))
            return KVQ_ERR_NOMEM;
        e->tmp[0] = ' ';
        memcpy(e->tmp + 1, s, n);
        text = e->tmp;
        n++;
    }
    if (n == 0)
        return KVQ_OK;
    size_t np = 0;
    if (p->kind == TOK_PRE_BYTELEVEL && !p->re) {
        if ((st = add_piece(e, &np, 0, n, 0)))
            return st;
    } else {
        if ((st = find_matches(e, p, text, n, &np)))
            return st;
        enum tok_behavior b = p->behavior;
        int invert = p->invert;
        if (p->kind == TOK_PRE_BYTELEVEL)
            b = TOK_B_ISOLATED;
        else if (p->kind == TOK_PRE_WSPLIT)
            b = TOK_B_REMOVED, invert = 0;
        else if (p->kind == TOK_PRE_WHITESPACE)
            b = TOK_B_REMOVED, invert = 1;
        np = apply_behavior(e->pieces, np, b, invert);
    }
    for (size_t i = 0; i < np; i++) {
        piece pc = e->pieces[i];
        if (pc.match || pc.end == pc.start)
            continue;
        size_t start = k->n_text;
        st = p->kind == TOK_PRE_BYTELEVEL ? sink_bytelevel(k, text + pc.start, pc.end - pc.start)
                                          : sink_text(k, text + pc.start, pc.end - pc.start);
        if (st || (st = sink_span(k, start, origin && pc.start == 0)))
            return st;
    }
    return KVQ_OK;
}

/* Pre-tokenizes and BPEs one piece of normalized text (not in buf[]). */
static kvq_status pretok_bpe(enc *e, const char *text, size_t n, int origin)
{
    const kvq_tokenizer *t = e->t;
    kvq_status st;
    if (n == 0)
        return KVQ_OK;
    int cur = 0;
    if (!grow((void **)&e->buf[cur], &e->cap[cur], n + 1, 1))
        return KVQ_ERR_NOMEM;
    memcpy(e->buf[cur], text, n);
    if (!grow((void **)&e->spans[cur], &e->cap_spans[cur], 1, sizeof(span)))
        return KVQ_ERR_NOMEM;
    span whole = {0, n, origin};
    e->spans[cur][0] = whole;
    size_t n_spans = 1;
    for (int k = 0; k < t->n_pre; k++) {
        sink out = {e, !cur, 0, 0};
        for (size_t i = 0; i < n_spans; i++) {
            span sp = e->spans[cur][i];
            /* sink_text may move buf[dst] but never buf[cur]. */
            const char *s = e->buf[cur] + sp.off;
            const tok_pre *p = &t->pre[k];
            st = p->kind == TOK_PRE_METASPACE ? metaspace(&out, p, s, sp.len, sp.origin)
                 : p->kind == TOK_PRE_DIGITS  ? digits(&out, p, s, sp.len, sp.origin)
                                              : split_step(&out, p, s, sp.len, sp.origin);
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

/* Leftmost-longest added token of trie at s[i..n): its added[] index, or -1. */
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
                if (!is_ws_at(s, j, k, &cl))
                    break;
                j = k;
            }
            start = j;
        }
        if (ad->rstrip) {
            size_t cl;
            while (stop < n && is_ws_at(s, n, stop, &cl))
                stop += cl;
            i = stop;
        }
        if (done < start && (st = fn(e, s, done, start, arg)))
            return st;
        if ((st = push_id(e, ad->id)))
            return st;
        done = stop;
    }
    return done < n ? fn(e, s, done, n, arg) : KVQ_OK;
}

/* A gap of normalized text: pre-tokenize and BPE it. arg: origin flag. */
static kvq_status norm_gap(enc *e, const char *s, size_t a, size_t b, void *arg)
{
    return pretok_bpe(e, s + a, b - a, *(const int *)arg && a == 0);
}

/* A gap of raw text between non-normalized added tokens: normalize it, then
 * split at the normalized added tokens. */
static kvq_status raw_gap(enc *e, const char *s, size_t a, size_t b, void *arg)
{
    (void)arg;
    int cur;
    size_t len;
    kvq_status st = normalize(e, s + a, b - a, &cur, &len);
    if (st || len == 0)
        return st;
    /* pretok_bpe reuses buf[]: the normalized text moves out first. */
    if (!grow((void **)&e->ntext, &e->cap_ntext, len + 1, 1))
        return KVQ_ERR_NOMEM;
    memcpy(e->ntext, e->buf[cur], len);
    int origin = a == 0;
    if (e->t->trie_norm.n == 0)
        return pretok_bpe(e, e->ntext, len, origin);
    return split_added(e, &e->t->trie_norm, e->ntext, len, norm_gap, &origin);
}

static kvq_status encode_all(enc *e, const char *text, size_t len, int add_bos)
{
    const kvq_tokenizer *t = e->t;
    kvq_status st;
    if (add_bos && t->has_template) {
        for (int i = 0; i < t->n_tpl_pre; i++)
            if ((st = push_id(e, t->tpl_pre[i])))
                return st;
    } else if (add_bos && t->bos >= 0 && (st = push_id(e, t->bos))) {
        return st;
    }
    if ((st = split_added(e, &t->trie_raw, text, len, raw_gap, NULL)))
        return st;
    if (add_bos && t->has_template)
        for (int i = 0; i < t->n_tpl_post; i++)
            if ((st = push_id(e, t->tpl_post[i])))
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
