/*
 * JSON strings from text that may hold any bytes (stored messages, error
 * messages from outside): jansson takes only UTF-8, so invalid bytes are
 * replaced with U+FFFD instead of failing. And why a JSON text from
 * outside did not parse, said the same way by every API.
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
