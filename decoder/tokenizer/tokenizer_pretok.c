/* tokenizer_pretok.c - steps 2 and 3 of encoding: the normalizers (string
 * and regex Replace, Prepend, Unicode forms, Strip, ...) and the
 * pre-tokenizers (Split with HF's five behaviours, ByteLevel, Metaspace,
 * Digits, Punctuation, Whitespace), then BPE of each word. Text moves between
 * two ping-pong buffers; each piece remembers whether it starts at offset 0
 * of the original text (Metaspace "first").
 */
#include "tokenizer_enc.h"

#include <stdlib.h>
#include <string.h>

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

int tok_is_ws_at(const char *s, size_t n, size_t i, size_t *cl)
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
        if (!tok_grow((void **)&e->buf[dst], &e->cap[dst], n + nm->content.n + 1, 1))
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
            if (!tok_grow((void **)&e->buf[dst], &e->cap[dst], need, 1))
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
        while (nm->strip_left && lo < hi && tok_is_ws_at(src, hi, lo, &cl))
            lo += cl;
        while (nm->strip_right && hi > lo) {
            size_t j = hi - 1;
            while (j > lo && ((unsigned char)src[j] & 0xC0) == 0x80)
                j--;
            if (!tok_is_ws_at(src, hi, j, &cl))
                break;
            hi = j;
        }
        if (!tok_grow((void **)&e->buf[dst], &e->cap[dst], hi - lo + 1, 1))
            return KVQ_ERR_NOMEM;
        memcpy(e->buf[dst], src + lo, hi - lo);
        *np = hi - lo;
        return KVQ_OK;
    }
    size_t out_n;
    char *m = tok_unicode_map(nm->kind, src, n, &out_n);
    if (!m)
        return KVQ_ERR_NOMEM;
    int ok = tok_grow((void **)&e->buf[dst], &e->cap[dst], out_n + 1, 1);
    if (ok)
        memcpy(e->buf[dst], m, out_n);
    free(m);
    if (!ok)
        return KVQ_ERR_NOMEM;
    *np = out_n;
    return KVQ_OK;
}

/* Runs the normalizer over s[0..n); the result is in e->buf[*which][0..*out_n). */
kvq_status tok_normalize(enc *e, const char *s, size_t n, int *which, size_t *out_n)
{
    const kvq_tokenizer *t = e->t;
    int cur = 0;
    if (!tok_grow((void **)&e->buf[0], &e->cap[0], n + 1, 1))
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
    if (!tok_grow((void **)&e->buf[k->dst], &e->cap[k->dst], k->n_text + n + 1, 1))
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
    if (!tok_grow((void **)&e->spans[k->dst], &e->cap_spans[k->dst], k->n_spans + 1, sizeof(span)))
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
    if (!tok_grow((void **)&e->pieces, &e->cap_pieces, *np + 1, sizeof *e->pieces))
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
        if (!tok_grow((void **)&e->tmp, &e->cap_tmp, n + 2, 1))
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
kvq_status tok_pretok_bpe(enc *e, const char *text, size_t n, int origin)
{
    const kvq_tokenizer *t = e->t;
    kvq_status st;
    if (n == 0)
        return KVQ_OK;
    int cur = 0;
    if (!tok_grow((void **)&e->buf[cur], &e->cap[cur], n + 1, 1))
        return KVQ_ERR_NOMEM;
    memcpy(e->buf[cur], text, n);
    if (!tok_grow((void **)&e->spans[cur], &e->cap_spans[cur], 1, sizeof(span)))
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
        if ((st = tok_bpe_word(e, e->buf[cur] + sp.off, sp.len)))
            return st;
    }
    return KVQ_OK;
}

/* Leftmost-longest added token of trie at s[i..n): its added[] index, or -1. */
