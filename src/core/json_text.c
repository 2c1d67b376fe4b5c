/*
 * JSON strings from text that may hold any bytes (stored messages, error
 * messages from outside): jansson takes only UTF-8, so invalid bytes are
 * replaced with U+FFFD instead of failing. And why a JSON text from
 * outside did not parse, said the same way by every API. And the length
 * of a value's compact JSON text, counted as jansson would write it.
 */
#include "core/error.h"
#include "core/text.h"
#include "core/utf8.h"

#include <stdint.h>
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

/*
 * Whether the 8 bytes at p are all ASCII a dumped string keeps as they are
 * (no control character, '"' or '\\'), told a word at a time: most text
 * is. Each test flags a word holding such a byte (a borrow may flag a
 * byte next to it, never a word without one): a byte past 0x7F by its
 * top bit, one under 0x20 by the top bit of byte - 0x20, and '"' and '\\'
 * as the zero bytes of v XOR them.
 */
static int plain8(const unsigned char *p)
{
    const uint64_t ones = 0x0101010101010101ULL;
    const uint64_t high = 0x8080808080808080ULL;
    uint64_t v, q, bs;

    memcpy(&v, p, sizeof(v));
    q = v ^ (ones * '"');
    bs = v ^ (ones * '\\');
    return ((v | ((v - ones * 0x20) & ~v) | ((q - ones) & ~q) |
             ((bs - ones) & ~bs)) &
            high) == 0;
}

/* The escaped bytes of a string as jansson's dump writes it (no flags),
 * quotes included; 0 with *bad set when not UTF-8. */
static size_t string_size(const char *s, size_t len, int *bad)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = 2 + len, i = 0, stop = 0;

    while (i < len) {
        size_t k;
        /* Plain words at once; a word that is not, a character at a
         * time to its end. */
        if (i >= stop) {
            if (len - i >= 8 && plain8(p + i)) {
                i += 8;
                continue;
            }
            stop = i + 8;
        }
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

/* The bytes of a real as jansson writes it: "%.<prec>g" into 25 bytes
 * (more fails the dump), ".0" added when that has neither a point nor an
 * exponent, an exponent's '+' and leading zeros dropped. */
static size_t real_size(double v, int prec, int *bad)
{
    char b[64];
    int len = snprintf(b, sizeof(b), "%.*g", prec, v);
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

/* JSON_COMPACT with prec's JSON_REAL_PRECISION: how jansson is asked. */
static size_t dump_flags(int prec)
{
    return JSON_COMPACT | JSON_REAL_PRECISION(prec == 17 ? 0 : prec);
}

static size_t value_size(const json_t *j, int depth, int prec, int *bad)
{
    size_t n = 0, i;
    const char *key;
    json_t *v;

    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        void *it = json_object_iter((json_t *)j);
        if (depth >= SIZE_DEPTH_MAX) {
            n = json_dumpb(j, NULL, 0, dump_flags(prec));
            *bad |= n == 0;
            return n;
        }
        n = 2;
        for (i = 0; it && !*bad; i++) {
            key = json_object_iter_key(it);
            n += (i ? 1 : 0) + 1 +
                 string_size(key, json_object_iter_key_len(it), bad) +
                 value_size(json_object_iter_value(it), depth + 1, prec, bad);
            it = json_object_iter_next((json_t *)j, it);
        }
        return n;
    }
    case JSON_ARRAY:
        if (depth >= SIZE_DEPTH_MAX) {
            n = json_dumpb(j, NULL, 0, dump_flags(prec));
            *bad |= n == 0;
            return n;
        }
        n = 2;
        json_array_foreach((json_t *)j, i, v)
        {
            n += (i ? 1 : 0) + value_size(v, depth + 1, prec, bad);
            if (*bad)
                break;
        }
        return n;
    case JSON_STRING:
        return string_size(json_string_value(j), json_string_length(j), bad);
    case JSON_INTEGER:
        return int_size(json_integer_value(j));
    case JSON_REAL:
        return real_size(json_real_value(j), prec, bad);
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
    n = value_size(j, 0, 17, &bad);
    return bad ? 0 : n;
}

/* ---- writing ------------------------------------------------------------ */

/*
 * The writer below fills a buffer that value_size() sized, so it checks
 * nothing: every string was found UTF-8 and every real short enough
 * while sizing. Containers past SIZE_DEPTH_MAX are written by jansson,
 * as they were sized.
 */

static char *put_bytes(char *w, const char *s, size_t n)
{
    memcpy(w, s, n);
    return w + n;
}

/* The letter after the backslash of a two-byte escape; 0: \u00XX. */
static const char short_escape[128] = {
    ['"'] = '"',  ['\\'] = '\\', ['\b'] = 'b', ['\f'] = 'f',
    ['\n'] = 'n', ['\r'] = 'r',  ['\t'] = 't',
};

static char *put_string(char *w, const char *s, size_t len)
{
    static const char hex[] = "0123456789ABCDEF";
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, run;

    *w++ = '"';
    while (i < len) {
        /* Copy the bytes that need no escape in one go: plain words at
         * once, a word that is not a byte at a time. */
        for (run = i; run < len;) {
            size_t end = run + 8 < len ? run + 8 : len;
            if (end - run == 8 && plain8(p + run)) {
                run = end;
                continue;
            }
            while (run < end && (p[run] >= 0x80 || !ascii_extra[p[run]]))
                run++;
            if (run < end)
                break;
        }
        w = put_bytes(w, s + i, run - i);
        if ((i = run) == len)
            break;
        *w++ = '\\';
        if (short_escape[p[i]]) {
            *w++ = short_escape[p[i]];
        } else {
            w = put_bytes(w, "u00", 3);
            *w++ = hex[p[i] >> 4];
            *w++ = hex[p[i] & 15];
        }
        i++;
    }
    *w++ = '"';
    return w;
}

static char *put_real(char *w, double v, int prec)
{
    char b[64];
    int len = snprintf(b, sizeof(b), "%.*g", prec, v);
    char *e;

    if (strspn(b, "-0123456789") == (size_t)len) {
        w = put_bytes(w, b, (size_t)len);
        return put_bytes(w, ".0", 2);
    }
    /* jansson writes '.' whatever the locale's decimal point. */
    for (char *c = b; *c; c++)
        if (*c != '-' && *c != 'e' && *c != '+' && (*c < '0' || *c > '9'))
            *c = '.';
    if ((e = strchr(b, 'e')) != NULL) {
        char *d = ++e;
        if (*d == '+')
            d++;
        else if (*d == '-')
            d++, e++;
        while (*d == '0')
            d++;
        memmove(e, d, strlen(d) + 1);
    }
    return put_bytes(w, b, strlen(b));
}

static char *put_int(char *w, json_int_t i)
{
    unsigned long long u =
        i < 0 ? 0ULL - (unsigned long long)i : (unsigned long long)i;
    char b[24], *d = b + sizeof(b);

    do {
        *--d = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (i < 0)
        *--d = '-';
    return put_bytes(w, d, (size_t)(b + sizeof(b) - d));
}

static char *put_value(char *w, const json_t *j, int depth, int prec)
{
    size_t i;
    json_t *v;

    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        void *it = json_object_iter((json_t *)j);
        if (depth >= SIZE_DEPTH_MAX)
            break;
        *w++ = '{';
        for (i = 0; it; i++) {
            if (i)
                *w++ = ',';
            w = put_string(w, json_object_iter_key(it),
                           json_object_iter_key_len(it));
            *w++ = ':';
            w = put_value(w, json_object_iter_value(it), depth + 1, prec);
            it = json_object_iter_next((json_t *)j, it);
        }
        *w++ = '}';
        return w;
    }
    case JSON_ARRAY:
        if (depth >= SIZE_DEPTH_MAX)
            break;
        *w++ = '[';
        json_array_foreach((json_t *)j, i, v)
        {
            if (i)
                *w++ = ',';
            w = put_value(w, v, depth + 1, prec);
        }
        *w++ = ']';
        return w;
    case JSON_STRING:
        return put_string(w, json_string_value(j), json_string_length(j));
    case JSON_INTEGER:
        return put_int(w, json_integer_value(j));
    case JSON_REAL:
        return put_real(w, json_real_value(j), prec);
    case JSON_TRUE:
        return put_bytes(w, "true", 4);
    case JSON_FALSE:
        return put_bytes(w, "false", 5);
    case JSON_NULL:
        return put_bytes(w, "null", 4);
    }
    /* A container as deep as sizing left to jansson: the same bytes. */
    return w + json_dumpb(j, w, json_dumpb(j, NULL, 0, dump_flags(prec)),
                          dump_flags(prec));
}

int loom__json_put_string(loom_buf *b, const char *s, size_t len)
{
    int bad = 0, rc;
    size_t n = string_size(s, len, &bad);
    char *w;

    if (bad)
        return loom__error_set(LOOM_EINVALID, "a string is not UTF-8");
    /* In place, as loom__json_put_members: no copy and no scratch on the
     * stack of the fiber that logs a run's events. */
    if ((rc = loom__buf_extend(b, n, &w)) != 0)
        return rc;
    put_string(w, s, len);
    return 0;
}

int loom__json_string_valid(const char *s, size_t len)
{
    int bad = 0;

    string_size(s, len, &bad);
    return !bad;
}

int loom__json_put_int(loom_buf *b, json_int_t i)
{
    char text[24];

    return loom_buf_put(b, text, (size_t)(put_int(text, i) - text));
}

/* Whether key is one of skip's (a NULL-terminated list; NULL: none). */
static int skipped(const char *key, const char *const *skip)
{
    /* The first bytes first: most keys differ there. */
    for (; skip && *skip; skip++)
        if (key[0] == (*skip)[0] && strcmp(key, *skip) == 0)
            return 1;
    return 0;
}

int loom__json_put_members(loom_buf *b, const json_t *obj,
                           const char *const *skip, int precision)
{
    char *w;
    int bad = 0, rc, prec = precision > 0 ? precision : 17;
    size_t n = 0;
    void *it;

    if (!json_is_object(obj) || prec > 17)
        return loom__error_set(LOOM_EINVALID, "no object, or precision %d",
                               precision);
    /* Sized first, as the dump sizes a member of its top object (depth
     * 1), then written in one go. */
    for (it = json_object_iter((json_t *)obj); it && !bad;
         it = json_object_iter_next((json_t *)obj, it))
        if (!skipped(json_object_iter_key(it), skip))
            n += 2 +
                 string_size(json_object_iter_key(it),
                             json_object_iter_key_len(it), &bad) +
                 value_size(json_object_iter_value(it), 1, prec, &bad);
    if (bad)
        return loom__error_set(LOOM_EINVALID, "a value cannot be written");
    /* Written in place: no copy, and no text buffer on the stack of the
     * fiber that logs a run's events (it was the deepest frame of a
     * stream's, taking a second stack page). */
    if ((rc = loom__buf_extend(b, n, &w)) != 0)
        return rc;
    for (it = json_object_iter((json_t *)obj); it;
         it = json_object_iter_next((json_t *)obj, it)) {
        if (skipped(json_object_iter_key(it), skip))
            continue;
        *w++ = ',';
        w = put_string(w, json_object_iter_key(it),
                       json_object_iter_key_len(it));
        *w++ = ':';
        w = put_value(w, json_object_iter_value(it), 1, prec);
    }
    return 0;
}

char *loom__json_compact_dumps(const json_t *j, int precision, size_t *len)
{
    int bad = 0, prec = precision > 0 ? precision : 17;
    size_t n;
    char *text, *end;

    if (!json_is_object(j) && !json_is_array(j))
        return NULL;
    /* Past 17 digits a real may pass the length jansson allows it, which
     * differs between its versions: jansson decides. */
    if (prec > 17) {
        text = json_dumps(j, JSON_COMPACT |
                                 JSON_REAL_PRECISION((size_t)(prec & 31)));
        if (text && len)
            *len = strlen(text);
        return text;
    }
    n = value_size(j, 0, prec, &bad);
    if (bad || !(text = malloc(n + 1)))
        return NULL;
    end = put_value(text, j, 0, prec);
    *end = '\0';
    if (len)
        *len = (size_t)(end - text);
    return text;
}
