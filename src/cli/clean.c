/*
 * The terminal cleaner (clean.h): a single pass that drops control
 * characters and whole escape sequences, so that nothing from outside
 * can drive the terminal loom prints on.
 */
#include "cli/clean.h"

#include <stdlib.h>
#include <string.h>

/* The length of the escape sequence at s[0] == ESC (at least 1): CSI up
 * to its final byte, OSC, DCS, SOS, PM and APC up to BEL or ST, any other
 * ESC with the byte after it. A sequence cut off by the end is whole. */
static size_t escape_len(const unsigned char *s)
{
    size_t i = 1;

    if (s[1] == '[') {
        for (i = 2; s[i] && (s[i] < 0x40 || s[i] > 0x7e); i++)
            ;
        return s[i] ? i + 1 : i;
    }
    if (s[1] == ']' || s[1] == 'P' || s[1] == 'X' || s[1] == '^' ||
        s[1] == '_') {
        for (i = 2; s[i] && s[i] != 0x07; i++)
            if (s[i] == 0x1b && s[i + 1] == '\\')
                return i + 2;
        return s[i] ? i + 1 : i;
    }
    return s[1] ? 2 : 1;
}

char *cli_clean(const char *s, int flags)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    char *out = malloc(strlen((const char *)p) + 1);
    size_t n = 0;

    if (!out)
        return NULL;
    while (*p) {
        int kept = (*p == '\n' && (flags & CLI_KEEP_NL)) ||
                   (*p == '\t' && (flags & CLI_KEEP_TAB));
        if (*p == 0x1b) {
            p += escape_len(p);
        } else if (!kept && (*p == '\t' || *p == '\n')) {
            out[n++] = ' ';
            p++;
        } else if (!kept && (*p < 0x20 || *p == 0x7f)) {
            p++;
        } else if (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) {
            p += 2; /* a C1 control, U+0080..U+009F */
        } else {
            out[n++] = (char)*p++;
        }
    }
    out[n] = '\0';
    return out;
}
