/* serve_json.c - JSON strings that keep every byte, for `kvq serve`.
 *
 * cJSON decodes "\u0000" into a NUL byte inside valuestring but keeps no
 * length, so every reader that calls strlen loses the rest of the string: a
 * prompt "nul \u0000 inside" became "nul ". serve_json_lengths walks the
 * request's text beside the tree cJSON built from it (same order: members
 * and items are kept as written, duplicates included) and records each
 * string's decoded length in the node's valuedouble, unused by cJSON for
 * strings; serve_json_strlen reads it back. A string node made here for
 * joined chat parts carries its length the same way.
 */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serve.h"

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

static int hex4(const char *p, const char *end, unsigned *out)
{
    unsigned v = 0;
    if (end - p < 4)
        return 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return 0;
    }
    *out = v;
    return 1;
}

/* A string literal at *pp: its decoded length (as cJSON decodes it), *pp
 * moved past it. @return 0 when the text is not one. */
static int string_len(const char **pp, const char *end, size_t *len)
{
    const char *p = *pp;
    size_t n = 0;
    if (p >= end || *p != '"')
        return 0;
    for (p++; p < end && *p != '"'; n++) {
        if (*p != '\\') {
            p++;
            continue;
        }
        if (++p >= end)
            return 0;
        if (*p++ != 'u')
            continue; /* \n, \", \/ ...: one byte */
        unsigned c;
        if (!hex4(p, end, &c))
            return 0;
        p += 4;
        if (c >= 0xD800 && c < 0xDC00) { /* a surrogate pair: one 4-byte character */
            unsigned lo;
            if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || !hex4(p + 2, end, &lo))
                return 0;
            p += 6;
            n += 3;
        } else {
            n += c < 0x80 ? 0 : c < 0x800 ? 1 : 2;
        }
    }
    if (p >= end)
        return 0;
    *pp = p + 1;
    *len = n;
    return 1;
}

/* Walks the value at *pp beside node. @return 0 on a mismatch (the lengths
 * already recorded stay right; the rest fall back to strlen). */
static int walk(const char **pp, const char *end, cJSON *node)
{
    const char *p = skip_ws(*pp, end);
    size_t n;
    if (cJSON_IsString(node)) {
        if (!string_len(&p, end, &n))
            return 0;
        node->valuedouble = (double)n;
    } else if (cJSON_IsObject(node) || cJSON_IsArray(node)) {
        const int obj = cJSON_IsObject(node);
        if (p >= end || *p != (obj ? '{' : '['))
            return 0;
        p++;
        for (cJSON *c = node->child; c; c = c->next) {
            p = skip_ws(p, end);
            if (obj && (!string_len(&p, end, &n) || (p = skip_ws(p, end)) >= end || *p++ != ':'))
                return 0;
            if (!walk(&p, end, c))
                return 0;
            p = skip_ws(p, end);
            if (c->next && (p >= end || *p++ != ','))
                return 0;
        }
        p = skip_ws(p, end);
        if (p >= end || *p++ != (obj ? '}' : ']'))
            return 0;
    } else { /* a number, true, false or null */
        while (p < end && !strchr(",]} \t\r\n", *p))
            p++;
    }
    *pp = p;
    return 1;
}

void serve_json_lengths(const char *text, size_t len, cJSON *root)
{
    const char *p = text, *end = text + len;
    if (len >= 3 && memcmp(p, "\xEF\xBB\xBF", 3) == 0) /* cJSON skips a byte order mark too */
        p += 3;
    walk(&p, end, root);
}

size_t serve_json_strlen(const cJSON *s)
{
    if (!cJSON_IsString(s) || !s->valuestring)
        return 0;
    return s->valuedouble > 0 ? (size_t)s->valuedouble : strlen(s->valuestring);
}

cJSON *serve_json_string(const char *s, size_t n)
{
    cJSON *j = cJSON_CreateString("");
    char *b = j ? cJSON_malloc(n + 1) : NULL;
    if (!b) {
        cJSON_Delete(j);
        return NULL;
    }
    memcpy(b, s, n);
    b[n] = 0;
    cJSON_free(j->valuestring);
    j->valuestring = b;
    j->valuedouble = (double)n;
    return j;
}

size_t serve_utf8_check(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        size_t k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (k == 0 || i + k > n)
            return i;
        unsigned cp = k == 1 ? c : c & (0x7F >> k);
        for (size_t j = 1; j < k; j++) {
            if ((u[i + j] & 0xC0) != 0x80)
                return i;
            cp = cp << 6 | (u[i + j] & 0x3F);
        }
        /* overlong forms, UTF-16 surrogates and code points past U+10FFFF */
        if ((k == 2 && cp < 0x80) || (k == 3 && cp < 0x800) || (k == 4 && cp < 0x10000) ||
            (cp >= 0xD800 && cp < 0xE000) || cp > 0x10FFFF)
            return i;
        i += k;
    }
    return n;
}
