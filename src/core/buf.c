/*
 * Growable buffers with a maximum size (curl's dynbuf idea). Growth doubles
 * the allocation, clamped to max + 1 so a limited buffer never allocates
 * far beyond its limit. A failed write leaves the buffer untouched.
 */
#include "loom/buf.h"
#include "core/error.h"
#include "core/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void loom_buf_init(loom_buf *b, size_t max)
{
    b->ptr = NULL;
    b->len = 0;
    b->cap = 0;
    b->max = max;
}

static int grow(loom_buf *b, size_t extra)
{
    size_t need, cap;
    char *p;

    if (extra > b->max || b->len > b->max - extra)
        return loom__error_set(LOOM_ETOOLARGE,
                               "buffer limit of %zu bytes exceeded", b->max);
    need = b->len + extra + 1;
    if (need <= b->cap)
        return 0;
    cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap = cap > ((size_t)-1) / 4 ? need : cap * 2;
    if (cap > b->max + 1)
        cap = b->max + 1;
    if (cap < need)
        cap = need;
    p = realloc(b->ptr, cap);
    if (!p)
        return loom__error_oom();
    b->ptr = p;
    b->cap = cap;
    return 0;
}

int loom_buf_put(loom_buf *b, const void *data, size_t len)
{
    int rc = grow(b, len);

    if (rc)
        return rc;
    if (len)
        memcpy(b->ptr + b->len, data, len);
    b->len += len;
    b->ptr[b->len] = '\0';
    return 0;
}

int loom__buf_extend(loom_buf *b, size_t len, char **at)
{
    int rc = grow(b, len);

    if (rc)
        return rc;
    *at = b->ptr + b->len;
    b->len += len;
    b->ptr[b->len] = '\0';
    return 0;
}

int loom_buf_puts(loom_buf *b, const char *s)
{
    return loom_buf_put(b, s, strlen(s));
}

int loom_buf_putc(loom_buf *b, char c)
{
    return loom_buf_put(b, &c, 1);
}

int loom_buf_vprintf(loom_buf *b, const char *fmt, va_list ap)
{
    va_list cp;
    int n, rc;

    va_copy(cp, ap);
    n = vsnprintf(NULL, 0, fmt, cp);
    va_end(cp);
    if (n < 0)
        return loom__error_set(LOOM_ERROR, "bad format string");
    if ((rc = grow(b, (size_t)n)) != 0)
        return rc;
    vsnprintf(b->ptr + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
    return 0;
}

int loom_buf_printf(loom_buf *b, const char *fmt, ...)
{
    va_list ap;
    int rc;

    va_start(ap, fmt);
    rc = loom_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

const char *loom_buf_cstr(const loom_buf *b)
{
    return b->ptr ? b->ptr : "";
}

void loom_buf_clear(loom_buf *b)
{
    b->len = 0;
    if (b->ptr)
        b->ptr[0] = '\0';
}

void loom_buf_consume(loom_buf *b, size_t n)
{
    if (n >= b->len) {
        loom_buf_clear(b);
        return;
    }
    memmove(b->ptr, b->ptr + n, b->len - n);
    b->len -= n;
    b->ptr[b->len] = '\0';
}

char *loom_buf_detach(loom_buf *b)
{
    char *p = b->ptr;

    if (!p) {
        p = malloc(1);
        if (p)
            p[0] = '\0';
    }
    b->ptr = NULL;
    b->len = b->cap = 0;
    return p;
}

void loom_buf_free(loom_buf *b)
{
    free(b->ptr);
    b->ptr = NULL;
    b->len = b->cap = 0;
}
