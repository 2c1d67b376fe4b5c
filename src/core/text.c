/*
 * Small text helpers every layer shares (core/text.h): the name rule, the
 * shown form of strings quoted in error messages, and which upstream
 * headers are passed on. Written by hand: each is a few lines, and no
 * linked library has them.
 */
#include "core/text.h"
#include "loom/buf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *loom__text_shown(char *dst, size_t cap, const char *s, size_t max)
{
    size_t i = 0;

    if (max > cap - 4)
        max = cap - 4;
    for (; i < max && s[i]; i++)
        dst[i] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? '?' : s[i];
    if (s[i]) {
        memcpy(dst + i, "...", 3);
        i += 3;
    }
    dst[i] = '\0';
    return dst;
}

int loom__text_is_name(const char *s, int dots)
{
    size_t n = 0;

    for (; s[n]; n++) {
        char c = s[n];

        if (n >= LOOM__NAME_MAX)
            return 0;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '-' ||
              (dots && c == '.')))
            return 0;
    }
    return n > 0;
}

int loom__text_is_rate_header(const char *name, size_t nlen, const char *value,
                              size_t vlen)
{
    static const char prefix[] = "x-ratelimit-";
    size_t plen = sizeof(prefix) - 1;

    if (!nlen || nlen > LOOM__RATE_HEADER_NAME_MAX || !vlen ||
        vlen > LOOM__RATE_HEADER_VALUE_MAX)
        return 0;
    if (!(nlen == 11 && !strncasecmp(name, "retry-after", 11)) &&
        !(nlen == 14 && !strncasecmp(name, "retry-after-ms", 14)) &&
        !(nlen > plen && !strncasecmp(name, prefix, plen)))
        return 0;
    for (size_t i = 0; i < nlen; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '-'))
            return 0;
    }
    for (size_t i = 0; i < vlen; i++)
        if ((unsigned char)value[i] < 0x20 || (unsigned char)value[i] > 0x7e)
            return 0;
    return 1;
}

char *loom__text_fill(const char *tmpl, const char *mark, const char *value)
{
    size_t mlen = strlen(mark), vlen = strlen(value), n = 0, len;
    const char *p, *q;
    loom_buf b;

    for (p = tmpl; mlen && (q = strstr(p, mark)) != NULL; p = q + mlen)
        n++;
    len = strlen(tmpl);
    /* The filled text's size is known: that is the buffer's limit. */
    if (n && vlen > (SIZE_MAX - len - 1) / n)
        return NULL;
    loom_buf_init(&b, len + n * vlen + 1);
    for (p = tmpl; mlen && (q = strstr(p, mark)) != NULL; p = q + mlen)
        if (loom_buf_put(&b, p, (size_t)(q - p)) != 0 ||
            loom_buf_put(&b, value, vlen) != 0)
            goto fail;
    if (loom_buf_puts(&b, p) != 0)
        goto fail;
    return loom_buf_detach(&b);
fail:
    loom_buf_free(&b);
    return NULL;
}
