/* tokenizer_unicode.c - the Unicode services the pipeline needs, from
 * well-kept libraries rather than tables of our own: character categories
 * and normalization from utf8proc, regexes from PCRE2 (UTF + UCP, JIT), plus
 * GPT-2's byte <-> character table and Rust's lossy UTF-8 reading.
 *
 * Where Rust (HF tokenizers) and these libraries may differ: utf8proc tracks
 * its own Unicode version (15 in Debian 12's 2.8), and PCRE2's \s is Perl's
 * space set (Z categories + \t\n\v\f\r) where Oniguruma's also has U+0085.
 */
#include "tokenizer_internal.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tok_is_numeric(uint32_t cp)
{
    if (cp < 0x80)
        return cp >= '0' && cp <= '9';
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

int tok_is_whitespace(uint32_t cp)
{
    /* The White_Space property: a fixed list in the Unicode standard. */
    if (cp < 0x80)
        return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20;
    switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
        return 1;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}

int tok_is_punct(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
               (cp >= 0x7B && cp <= 0x7E);
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

int tok_is_word(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    if (cp == 0x200C || cp == 0x200D) /* Join_Control */
        return 1;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_ME) || c == UTF8PROC_CATEGORY_ND ||
           c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_PC;
}

static size_t put_utf8(uint32_t cp, char *o)
{
    return (size_t)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)o);
}

char *tok_unicode_map(enum tok_norm_kind kind, const char *s, size_t n, size_t *out_n)
{
    if (kind == TOK_NORM_LOWERCASE || kind == TOK_NORM_STRIP_ACCENTS) {
        /* Rust's char::to_lowercase is the simple mapping except U+0130,
         * which becomes "i" + U+0307: at most 3 bytes grow to... 3. */
        char *o = malloc(n + n / 2 + 4);
        if (!o)
            return NULL;
        size_t w = 0;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            i += tok_utf8_next(s + i, n - i, &cp);
            if (kind == TOK_NORM_STRIP_ACCENTS) {
                if (utf8proc_category((utf8proc_int32_t)cp) != UTF8PROC_CATEGORY_MN)
                    w += put_utf8(cp, o + w);
            } else if (cp == 0x130) {
                w += put_utf8('i', o + w);
                w += put_utf8(0x307, o + w);
            } else {
                w += put_utf8((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), o + w);
            }
        }
        o[w] = 0;
        *out_n = w;
        return o;
    }
    int opt = UTF8PROC_STABLE;
    if (kind == TOK_NORM_NFC)
        opt |= UTF8PROC_COMPOSE;
    else if (kind == TOK_NORM_NFD)
        opt |= UTF8PROC_DECOMPOSE;
    else if (kind == TOK_NORM_NFKC)
        opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else
        opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)opt);
    if (r < 0) {
        free(dst);
        return NULL;
    }
    *out_n = (size_t)r;
    return (char *)dst;
}

/* ---- ByteLevel ------------------------------------------------------------ */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the
 * other 68 take the code points 256, 257, ... in byte order. */
static uint32_t byte_cp(unsigned b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
        return b;
    unsigned k = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF)))
            k++;
    return 256 + k;
}

static struct {
    char utf8[256][3];
    uint8_t len[256];
    int16_t back[324]; /* code point (< 324) -> byte */
} g_bl;
static pthread_once_t g_bl_once = PTHREAD_ONCE_INIT;

static void bl_init(void)
{
    for (int i = 0; i < 324; i++)
        g_bl.back[i] = -1;
    for (unsigned b = 0; b < 256; b++) {
        uint32_t cp = byte_cp(b);
        g_bl.len[b] = (uint8_t)put_utf8(cp, g_bl.utf8[b]);
        g_bl.back[cp] = (int16_t)b;
    }
}

const char *tok_bytelevel_char(unsigned b, size_t *len)
{
    pthread_once(&g_bl_once, bl_init);
    *len = g_bl.len[b & 255];
    return g_bl.utf8[b & 255];
}

int tok_bytelevel_byte(uint32_t cp)
{
    pthread_once(&g_bl_once, bl_init);
    return cp < 324 ? g_bl.back[cp] : -1;
}

/* ---- lossy UTF-8 ------------------------------------------------------------ */

/* Length of the valid prefix of a sequence at s (0 when s[0] cannot start
 * one), and whether it is complete. */
static size_t utf8_prefix(const unsigned char *s, size_t n, int *complete)
{
    unsigned c = s[0];
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
        *complete = 1;
        return 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else {
        *complete = 0;
        return 0;
    }
    size_t k = 1;
    for (; k <= need && k < n; k++) {
        unsigned x = s[k];
        unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (x < l || x > h)
            break;
    }
    *complete = k == need + 1;
    return k;
}

size_t tok_utf8_lossy(const char *str, size_t n, char *out)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        int complete;
        size_t k = utf8_prefix(s + i, n - i, &complete);
        if (complete) {
            memcpy(out + w, s + i, k);
            w += k;
            i += k;
        } else {
            memcpy(out + w, "\xEF\xBF\xBD", 3);
            w += 3;
            i += k ? k : 1; /* a maximal invalid subpart is one replacement */
        }
    }
    return w;
}

size_t tok_utf8_incomplete_tail(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned c = s[n - back];
        if ((c & 0xC0) == 0x80)
            continue;
        int complete;
        size_t k = utf8_prefix(s + n - back, back, &complete);
        return !complete && k == back ? back : 0;
    }
    return 0;
}

/* ---- regexes ----------------------------------------------------------------- */

void *tok_regex_compile(const char *pattern, size_t len, kvq_error *err, const char *where)
{
    int code;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, PCRE2_UTF | PCRE2_UCP, &code, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        kvq_error_set(err, KVQ_ERR_UNSUPPORTED, "tokenizer.json: %s regex '%.60s' does not compile (PCRE2: %s at %zu)",
                      where, pattern, (const char *)msg, (size_t)off);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is unavailable */
    return re;
}

void tok_regex_free(void *re)
{
    pcre2_code_free((pcre2_code *)re);
}
