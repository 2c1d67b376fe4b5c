/*
 * JSON strings from text that may hold any bytes (stored messages, error
 * messages from outside): jansson takes only UTF-8, so invalid bytes are
 * replaced with U+FFFD instead of failing. And why a JSON text from
 * outside did not parse, said the same way by every API. And the length
 * of a value's compact JSON text, counted as jansson would write it.
 */
#include "core/text.h"
#include "core/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Length of the valid UTF-8 sequence at p (at most left bytes), or 0 when
 * the bytes there are not one. Rejects what jansson rejects: overlong
 * forms, surrogates and code points past U+10FFFF.
 */
static size_t utf8_seq(const unsigned char *p, size_t left)
{
    unsigned c = p[0];
    unsigned lo = 0x80, hi = 0xBF;
    size_t n;

    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF)
        n = 3;
    else if (c >= 0xF0 && c <= 0xF4)
        n = 4;
    else
        return 0;
    if (c == 0xE0)
        lo = 0xA0;
    else if (c == 0xED)
        hi = 0x9F;
    else if (c == 0xF0)
        lo = 0x90;
    else if (c == 0xF4)
        hi = 0x8F;
    if (n > left || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t k = 2; k < n; k++)
        if ((p[k] & 0xC0) != 0x80)
            return 0;
    return n;
}

/* Written by hand: jansson has no lossy mode for invalid UTF-8. */
json_t *loom__json_text(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    unsigned char *fixed, *w;
    json_t *j;
    size_t i = 0;

    if (!s)
        return json_null();
    if ((j = json_stringn(s, len)) != NULL)
        return j;
    if (len > ((size_t)-1 - 1) / 3 || !(fixed = malloc(len * 3 + 1)))
        return NULL;
    w = fixed;
    while (i < len) {
        size_t n = utf8_seq(p + i, len - i);
        if (n == 0) {
            *w++ = 0xEF;
            *w++ = 0xBF;
            *w++ = 0xBD;
            i++;
            continue;
        }
        memcpy(w, p + i, n);
        w += n;
        i += n;
    }
    j = json_stringn((const char *)fixed, (size_t)(w - fixed));
    free(fixed);
    return j;
}

const char *loom__json_error_shown(char *dst, size_t cap,
                                   const json_error_t *je)
{
    char reason[JSON_ERROR_TEXT_LENGTH];

    /* jansson's own words for \u0000 name a flag the sender cannot set. */
    if (json_error_code(je) == json_error_null_character)
        snprintf(reason, sizeof(reason), "%s",
                 "\\u0000 is not allowed in a string");
    else
        loom__text_shown(reason, sizeof(reason), je->text, sizeof(reason));
    snprintf(dst, cap, "%s, at byte offset %d (line %d, column %d)", reason,
             je->position, je->line, je->column);
    return dst;
}

/* Containers deeper than this are sized by jansson itself. */
#define SIZE_DEPTH_MAX 64

/* Bytes an ASCII byte takes in a dumped string beyond itself: \\ and \"
 * and \b \f \n \r \t 1 more, other control characters 5 (\u00XX). */
static const unsigned char ascii_extra[128] = {
    5, 5, 5, 5, 5, 5, 5, 5, 1, 1, 1, 5, 1, 1, 5, 5, 5, 5,
    5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 0, 0, 1, ['\\'] = 1,
};

/* The escaped bytes of a string as jansson's dump writes it (no flags),
 * quotes included; 0 with *bad set when not UTF-8. */
static size_t string_size(const char *s, size_t len, int *bad)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = 2 + len, i = 0;

    while (i < len) {
        size_t k;
        if (p[i] < 0x80) {
            n += ascii_extra[p[i++]];
            continue;
        }
        if (!(k = utf8_seq(p + i, len - i))) {
            *bad = 1;
            return 0;
        }
        i += k;
    }
    return n;
}

/* The bytes of a real as jansson writes it: "%.17g" into 25 bytes (more
 * fails the dump), ".0" added when that has neither a point nor an
 * exponent, an exponent's '+' and leading zeros dropped. */
static size_t real_size(double v, int *bad)
{
    char b[64];
    int len = snprintf(b, sizeof(b), "%.17g", v);
    const char *e;
    size_t n;

    if (len < 0 || len >= 25) {
        *bad = 1;
        return 0;
    }
    n = (size_t)len;
    /* The locale's decimal point (jansson turns it into '.') is neither
     * a digit nor '-'. */
    if (strspn(b, "-0123456789") == n) {
        *bad |= n + 3 >= 25;
        return n + 2;
    }
    if ((e = strchr(b, 'e')) != NULL) {
        e++;
        if (*e == '+')
            n--, e++;
        else if (*e == '-')
            e++;
        while (*e == '0')
            n--, e++;
    }
    return n;
}

/* The bytes of i in decimal, as "%" JSON_INTEGER_FORMAT writes it. */
static size_t int_size(json_int_t i)
{
    /* Counted on the magnitude as unsigned, which holds INT64_MIN's. */
    unsigned long long u =
        i < 0 ? 0ULL - (unsigned long long)i : (unsigned long long)i;
    size_t n = i < 0 ? 2 : 1;

    while (u >= 10) {
        u /= 10;
        n++;
    }
    return n;
}

static size_t value_size(const json_t *j, int depth, int *bad)
{
    size_t n = 0, i;
    const char *key;
    json_t *v;

    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        void *it = json_object_iter((json_t *)j);
        if (depth >= SIZE_DEPTH_MAX) {
            n = json_dumpb(j, NULL, 0, JSON_COMPACT);
            *bad |= n == 0;
            return n;
        }
        n = 2;
        for (i = 0; it && !*bad; i++) {
            key = json_object_iter_key(it);
            n += (i ? 1 : 0) + 1 +
                 string_size(key, json_object_iter_key_len(it), bad) +
                 value_size(json_object_iter_value(it), depth + 1, bad);
            it = json_object_iter_next((json_t *)j, it);
        }
        return n;
    }
    case JSON_ARRAY:
        if (depth >= SIZE_DEPTH_MAX) {
            n = json_dumpb(j, NULL, 0, JSON_COMPACT);
            *bad |= n == 0;
            return n;
        }
        n = 2;
        json_array_foreach((json_t *)j, i, v)
        {
            n += (i ? 1 : 0) + value_size(v, depth + 1, bad);
            if (*bad)
                break;
        }
        return n;
    case JSON_STRING:
        return string_size(json_string_value(j), json_string_length(j), bad);
    case JSON_INTEGER:
        return int_size(json_integer_value(j));
    case JSON_REAL:
        return real_size(json_real_value(j), bad);
    case JSON_TRUE:
        return 4;
    case JSON_FALSE:
        return 5;
    case JSON_NULL:
        return 4;
    }
    *bad = 1;
    return 0;
}

size_t loom__json_compact_size(const json_t *j)
{
    int bad = 0;
    size_t n;

    if (!json_is_object(j) && !json_is_array(j))
        return 0;
    n = value_size(j, 0, &bad);
    return bad ? 0 : n;
}
