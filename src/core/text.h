/*
 * Internal: small text helpers every layer shares. Names (of tools,
 * providers, agents) are checked by one rule, so config, the tool
 * registry and the server agree on what a name is; strings quoted in
 * error messages are shown by one function, so a hostile value can
 * neither flood a message nor put control characters into a log.
 */
#ifndef LOOM_CORE_TEXT_H
#define LOOM_CORE_TEXT_H

#include <stddef.h>

/* The longest name loom__text_is_name() accepts (OpenAI's tool names). */
#define LOOM__NAME_MAX 64

/*
 * Copies s into dst (cap bytes, at least 8) for an error message: at most
 * max bytes of it (fewer when cap is smaller), control characters shown
 * as '?', then "..." when it was cut. Returns dst.
 */
const char *loom__text_shown(char *dst, size_t cap, const char *s, size_t max);

/*
 * Whether s is a name: [A-Za-z0-9_-]{1,LOOM__NAME_MAX}, with '.' allowed
 * too when dots is set (model names).
 */
int loom__text_is_name(const char *s, int dots);

/*
 * Rate-limit headers of an upstream error answer that loom passes on to
 * its own client, so it can back off as the provider asked: Retry-After,
 * retry-after-ms and x-ratelimit-*. At most LOOM__RATE_HEADERS_MAX of
 * them; a longer name or value is not passed on.
 */
#define LOOM__RATE_HEADERS_MAX 12
#define LOOM__RATE_HEADER_NAME_MAX 64
#define LOOM__RATE_HEADER_VALUE_MAX 128

/*
 * Whether a header is one to pass on: its name (nlen bytes) is
 * Retry-After, retry-after-ms or x-ratelimit-<more> in any case, at most
 * LOOM__RATE_HEADER_NAME_MAX bytes of [A-Za-z0-9-]; its value (vlen bytes)
 * is 1 to LOOM__RATE_HEADER_VALUE_MAX bytes of printable ASCII.
 */
int loom__text_is_rate_header(const char *name, size_t nlen, const char *value,
                              size_t vlen);

/*
 * A template filled: tmpl with every occurrence of mark ("{tool}")
 * replaced by value, as a new string (caller frees); NULL when out of
 * memory.
 */
char *loom__text_fill(const char *tmpl, const char *mark, const char *value);

#endif
