/* tokenizer_decode.c - ids -> text: whole sequences and streaming.
 *
 * HF's decoder chain for Llama-2 is Replace("▁" -> " "), ByteFallback, Fuse,
 * Strip(" ", 1, 0). The Replace steps are folded into every id's text at load
 * (tok->dec_*); what is left is ByteFallback - a maximal run of "<0xHH>"
 * tokens becomes its bytes when the whole run is valid UTF-8, else one U+FFFD
 * per byte - and the strip of leading characters from the fused text.
 *
 * The whole-sequence decoder and the streaming one are written separately on
 * purpose: the tests compare them with each other and with HF's fixtures.
 * Because a byte run's fate depends on its last byte, the stream holds a run
 * back until the first non-byte token (or finish) ends it.
 */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

static int valid_flags(unsigned flags)
{
    return (flags & ~(unsigned)(KVQ_DETOK_SKIP_SPECIAL | KVQ_DETOK_SKIP_CONTROL |
                                KVQ_DETOK_KEEP_LEADING_SPACE)) == 0;
}

static int present(const kvq_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->vocab_size && (t->flags[id] & TOK_F_PRESENT);
}

static int skipped(const kvq_tokenizer *t, int32_t id, unsigned flags)
{
    if (!(t->flags[id] & TOK_F_SPECIAL))
        return 0;
    if (flags & KVQ_DETOK_SKIP_SPECIAL)
        return 1;
    return (flags & KVQ_DETOK_SKIP_CONTROL) && t->dec_byte[id] < 0;
}

/* ---- whole sequence --------------------------------------------------------- */

typedef struct strbuf {
    char *s;
    size_t n, cap;
} strbuf;

static int sb_add(strbuf *b, const void *p, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s)
            return 0;
        b->s = s;
        b->cap = cap;
    }
    memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = 0;
    return 1;
}

/* Appends the run run[0..n) as ByteFallback renders it. */
static int sb_run(strbuf *b, const char *run, size_t n)
{
    if (tok_utf8_valid(run, n))
        return sb_add(b, run, n);
    for (size_t i = 0; i < n; i++)
        if (!sb_add(b, fffd, 3))
            return 0;
    return 1;
}

kvq_status kvq_tokenizer_decode_alloc(const kvq_tokenizer *t, const int32_t *ids, size_t n,
                                      unsigned flags, char **text, size_t *len)
{
    if (!t || (!ids && n) || !text || !len || !valid_flags(flags))
        return KVQ_ERR_INVALID_ARG;
    *text = NULL;
    *len = 0;
    for (size_t i = 0; i < n; i++)
        if (!present(t, ids[i]))
            return KVQ_ERR_RANGE;
    strbuf out = {0}, run = {0};
    int ok = sb_add(&out, "", 0), first = 1;
    for (size_t i = 0; ok && i < n; i++) {
        int32_t id = ids[i];
        if (skipped(t, id, flags))
            continue;
        /* Metaspace's rule is about the first token rendered, whatever it is
         * (a "<0xHH>" token has no replacement character to drop). */
        int is_first = first;
        first = 0;
        if (t->dec_byte[id] >= 0) {
            char c = (char)t->dec_byte[id];
            ok = sb_add(&run, &c, 1);
            continue;
        }
        if (run.n) {
            ok = sb_run(&out, run.s, run.n);
            run.n = 0;
        }
        if (is_first && t->dec_first_off)
            ok = ok && sb_add(&out, t->arena + t->dec_first_off[id], t->dec_first_len[id]);
        else
            ok = ok && sb_add(&out, t->arena + t->dec_off[id], t->dec_len[id]);
    }
    if (ok && run.n)
        ok = sb_run(&out, run.s, run.n);
    free(run.s);
    if (ok && t->dec_lossy && !tok_utf8_valid(out.s, out.n)) {
        char *fixed = malloc(3 * out.n + 1);
        if (fixed) {
            out.n = tok_utf8_lossy(out.s, out.n, fixed);
            fixed[out.n] = 0;
            free(out.s);
            out.s = fixed;
            out.cap = 3 * out.n + 1;
        }
        ok = fixed != NULL;
    }
    if (!ok) {
        free(out.s);
        return KVQ_ERR_NOMEM;
    }
    /* Strip: at most strip_start leading copies of strip_char, from the fused text. */
    size_t cut = 0;
    int strip = flags & KVQ_DETOK_KEEP_LEADING_SPACE ? 0 : t->strip_start;
    for (int k = 0; k < strip && t->strip_char_len; k++) {
        if (out.n - cut < t->strip_char_len || memcmp(out.s + cut, t->strip_char, t->strip_char_len))
            break;
        cut += t->strip_char_len;
    }
    memmove(out.s, out.s + cut, out.n - cut + 1);
    *text = out.s;
    *len = out.n - cut;
    return KVQ_OK;
}

kvq_status kvq_tokenizer_decode(const kvq_tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
                                char *out, size_t cap, size_t *len)
{
    if (!len || (!out && cap))
        return KVQ_ERR_INVALID_ARG;
    *len = 0;
    char *s;
    size_t k;
    kvq_status st = kvq_tokenizer_decode_alloc(t, ids, n, flags, &s, &k);
    if (st)
        return st;
    *len = k;
    if (k + 1 > cap) {
        if (cap) {
            memcpy(out, s, cap - 1);
            out[cap - 1] = 0;
        }
        free(s);
        return KVQ_ERR_RANGE;
    }
    memcpy(out, s, k + 1);
    free(s);
    return KVQ_OK;
}

/* ---- streaming -------------------------------------------------------------- */

struct kvq_detok {
    const kvq_tokenizer *t;
    unsigned flags;
    char *run; /* pending byte-fallback run */
    size_t run_len, run_cap;
    char *out; /* the chunk handed back: room for 3 * run_cap + one piece */
    size_t out_cap;
    int strip_left; /* leading strip characters still to remove */
    int first;      /* no token rendered yet (Metaspace's first-token rule) */
    char pend[4];   /* ByteLevel: an incomplete UTF-8 tail held back */
    size_t pend_len;
};

static int detok_reserve(kvq_detok *d, size_t run_cap)
{
    /* A flushed run (3 bytes per byte), then room for a ByteLevel token's
     * lossy text (3x) next to its raw bytes kept at the end (1x). */
    size_t out_cap = 3 * run_cap + 4 * (d->t->max_dec_len + 4) + 1;
    char *r = realloc(d->run, run_cap);
    if (!r)
        return 0;
    d->run = r;
    char *o = realloc(d->out, out_cap);
    if (!o)
        return 0;
    d->out = o;
    d->run_cap = run_cap;
    d->out_cap = out_cap;
    return 1;
}

kvq_status kvq_detok_create(const kvq_tokenizer *t, unsigned flags, kvq_detok **out)
{
    if (!out)
        return KVQ_ERR_INVALID_ARG;
    *out = NULL;
    if (!t || !valid_flags(flags))
        return KVQ_ERR_INVALID_ARG;
    kvq_detok *d = calloc(1, sizeof *d);
    if (!d)
        return KVQ_ERR_NOMEM;
    d->t = t;
    d->flags = flags;
    if (!detok_reserve(d, 64)) {
        kvq_detok_free(d);
        return KVQ_ERR_NOMEM;
    }
    kvq_detok_reset(d);
    *out = d;
    return KVQ_OK;
}

void kvq_detok_free(kvq_detok *d)
{
    if (!d)
        return;
    free(d->run);
    free(d->out);
    free(d);
}

static int initial_strip(const kvq_detok *d)
{
    if (!d->t->strip_char_len || (d->flags & KVQ_DETOK_KEEP_LEADING_SPACE))
        return 0;
    return d->t->strip_start;
}

void kvq_detok_reset(kvq_detok *d)
{
    if (!d)
        return;
    d->run_len = 0;
    d->pend_len = 0;
    d->first = 1;
    d->strip_left = initial_strip(d);
    d->out[0] = 0;
}

/* Moves the pending run into d->out at *o. */
static void flush_run(kvq_detok *d, size_t *o)
{
    if (!d->run_len)
        return;
    if (tok_utf8_valid(d->run, d->run_len)) {
        memcpy(d->out + *o, d->run, d->run_len);
        *o += d->run_len;
    } else {
        for (size_t i = 0; i < d->run_len; i++, *o += 3)
            memcpy(d->out + *o, fffd, 3);
    }
    d->run_len = 0;
}

/* Applies the leading strip to the chunk d->out[0..n) and hands it back. */
static void emit(kvq_detok *d, size_t n, const char **text, size_t *len)
{
    const char *c = d->t->strip_char;
    size_t cl = d->t->strip_char_len, cut = 0;
    while (d->strip_left > 0 && cut < n) {
        if (n - cut >= cl && memcmp(d->out + cut, c, cl) == 0) {
            cut += cl;
            d->strip_left--;
        } else {
            d->strip_left = 0; /* text has started: nothing more is leading */
        }
    }
    if (cut < n)
        d->strip_left = 0;
    memmove(d->out, d->out + cut, n - cut);
    d->out[n - cut] = 0;
    *text = d->out;
    if (len)
        *len = n - cut;
}

kvq_status kvq_detok_push(kvq_detok *d, int32_t id, const char **text, size_t *len)
{
    if (!d || !text)
        return KVQ_ERR_INVALID_ARG;
    const kvq_tokenizer *t = d->t;
    if (!present(t, id) || skipped(t, id, d->flags)) {
        d->out[0] = 0;
        *text = d->out;
        if (len)
            *len = 0;
        return present(t, id) ? KVQ_OK : KVQ_ERR_RANGE;
    }
    if (t->dec_byte[id] >= 0) {
        if (d->run_len == d->run_cap && !detok_reserve(d, 2 * d->run_cap)) {
            d->out[0] = 0;
            *text = d->out;
            if (len)
                *len = 0;
            return KVQ_ERR_NOMEM;
        }
        d->run[d->run_len++] = (char)t->dec_byte[id];
        d->first = 0;
        emit(d, 0, text, len);
        return KVQ_OK;
    }
    size_t o = 0;
    flush_run(d, &o);
    const char *piece = t->arena + t->dec_off[id];
    size_t pl = t->dec_len[id];
    if (d->first && t->dec_first_off) {
        piece = t->arena + t->dec_first_off[id];
        pl = t->dec_first_len[id];
    }
    d->first = 0;
    if (t->dec_lossy) {
        /* Bytes: complete characters go out now, a partial one waits. */
        char *tmp = d->out + d->out_cap - (pl + d->pend_len); /* the free end of out */
        memmove(tmp + d->pend_len, piece, pl);
        memcpy(tmp, d->pend, d->pend_len);
        size_t all = pl + d->pend_len, keep = tok_utf8_incomplete_tail(tmp, all);
        memcpy(d->pend, tmp + all - keep, keep);
        d->pend_len = keep;
        /* out_cap leaves the 3x room between o and tmp: no overlap. */
        size_t w = tok_utf8_lossy(tmp, all - keep, d->out + o);
        emit(d, o + w, text, len);
        return KVQ_OK;
    }
    memcpy(d->out + o, piece, pl);
    emit(d, o + pl, text, len);
    return KVQ_OK;
}

kvq_status kvq_detok_finish(kvq_detok *d, const char **text, size_t *len)
{
    if (!d || !text)
        return KVQ_ERR_INVALID_ARG;
    size_t o = 0;
    flush_run(d, &o);
    if (d->pend_len) /* a character that never completed */
        o += tok_utf8_lossy(d->pend, d->pend_len, d->out + o);
    emit(d, o, text, len);
    /* Back to a fresh sequence; the chunk in d->out stays valid. */
    d->run_len = 0;
    d->pend_len = 0;
    d->first = 1;
    d->strip_left = initial_strip(d);
    return KVQ_OK;
}
