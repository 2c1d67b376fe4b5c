/*
 * Internal: cutting text on UTF-8 character boundaries, and counting its
 * characters. Every place that caps a string for a model, an event or the
 * store cuts through this, so no cut leaves half a character behind; every
 * limit stated in characters (schema maxLength, a query's length, a call
 * id's) counts through loom__utf8_count().
 */
#ifndef LOOM_CORE_UTF8_H
#define LOOM_CORE_UTF8_H

#include "loom/buf.h"

#include <jansson.h>
#include <stddef.h>

/*
 * The length of the longest prefix of s (len bytes) that is at most max
 * bytes and does not end inside a UTF-8 sequence: len when it fits, else
 * max moved back over continuation bytes.
 */
static inline size_t loom__utf8_cut(const char *s, size_t len, size_t max)
{
    if (len <= max)
        return len;
    while (max > 0 && ((unsigned char)s[max] & 0xC0) == 0x80)
        max--;
    return max;
}

/*
 * A JSON string of len bytes of s, any invalid UTF-8 byte replaced with
 * U+FFFD (stored text and messages from outside may hold any bytes;
 * jansson takes only UTF-8). json null when s is NULL. NULL only when out
 * of memory.
 */
json_t *loom__json_text(const char *s, size_t len);

/*
 * The bytes of j's compact JSON text: what json_dumpb(j, NULL, 0,
 * JSON_COMPACT) returns (0 when j is not an object or array, or cannot be
 * dumped: a string that is not UTF-8), counted without writing the text
 * (jansson's dump tracks every container it enters, which costs more than
 * the text). What sizes an event for a bound, where only the count matters.
 */
size_t loom__json_compact_size(const json_t *j);

/*
 * j's compact JSON text, byte for byte what json_dumps(j, JSON_COMPACT |
 * JSON_REAL_PRECISION(precision)) returns (precision 0: jansson's 17;
 * past 17 json_dumps writes it), written without jansson's cost of tracking
 * every container it enters (a formatted pointer and a hash table entry each).
 * *len (may be NULL) is set to its length. NULL where json_dumps fails (j not
 * an object or array, a string that is not UTF-8, a real too long) and when out
 * of memory. The caller frees the text.
 */
char *loom__json_compact_dumps(const json_t *j, int precision, size_t *len);

/*
 * Appends len bytes of s to b as a JSON string, quotes included, as
 * loom__json_compact_dumps writes one. LOOM_EINVALID when s is not UTF-8
 * (jansson takes no such string); loom_buf_put's errors, b unchanged.
 */
int loom__json_put_string(loom_buf *b, const char *s, size_t len);

/* Whether len bytes of s are UTF-8 that jansson takes in a string. */
int loom__json_string_valid(const char *s, size_t len);

/* Appends i to b in decimal, as loom__json_compact_dumps writes it;
 * loom_buf_put's errors. */
int loom__json_put_int(loom_buf *b, json_int_t i);

/* Makes b len bytes longer (a NUL after them) and sets *at to where they
 * start, for a writer that sized its text first to write it in place;
 * loom_buf_put's errors, b unchanged. */
int loom__buf_extend(loom_buf *b, size_t len, char **at);

/*
 * Appends to b the members of obj (an object) whose keys skip (a
 * NULL-terminated list; NULL: none) does not name, each as `,"key":value`:
 * byte for byte what loom__json_compact_dumps(obj, precision, ...) writes
 * for them (precision 1 to 17; 0: 17), sized and written in one go. What
 * a writer splicing members into an object of its own writes them with.
 * LOOM_EINVALID where that dump fails (a string not UTF-8, a real too
 * long), obj is no object or precision is past 17; loom_buf_put's errors;
 * b unchanged.
 */
int loom__json_put_members(loom_buf *b, const json_t *obj,
                           const char *const *skip, int precision);

/*
 * Says in dst (cap bytes) why a JSON text did not parse and where: je's
 * reason (control characters shown as '?'; a \u0000 in a string said
 * plainly), then the byte offset, line and column jansson stopped at
 * (just past the offending byte or string). Returns dst.
 */
const char *loom__json_error_shown(char *dst, size_t cap,
                                   const json_error_t *je);

/* Code points in len bytes of UTF-8: the bytes that are not continuation
 * bytes (10xxxxxx), so invalid input counts each stray lead byte. */
static inline size_t loom__utf8_count(const char *s, size_t len)
{
    size_t n = 0;

    for (size_t i = 0; i < len; i++)
        n += ((unsigned char)s[i] & 0xC0) != 0x80;
    return n;
}

#endif
