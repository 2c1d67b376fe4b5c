/*
 * Small text helpers every layer shares (core/text.h): the name rule and
 * the shown form of strings quoted in error messages. Written by hand:
 * both are a few lines, and no linked library has them.
 */
#include "core/text.h"

#include <string.h>

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
