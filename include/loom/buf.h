/*
 * loom/buf.h: growable byte buffers with a hard maximum size.
 *
 * Every buffer that is filled from outside (HTTP bodies, SSE lines, tool
 * output) is a loom_buf with a limit; writing past it fails with
 * LOOM_ETOOLARGE and leaves the buffer as it was (curl's dynbuf model).
 * The content is always NUL-terminated when ptr is not NULL.
 */
#ifndef LOOM_BUF_H
#define LOOM_BUF_H

#include "common.h"
#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char *ptr;  /* NUL-terminated content, or NULL before the first write */
    size_t len; /* bytes used, not counting the terminator */
    size_t cap; /* bytes allocated */
    size_t max; /* the most len may ever be */
} loom_buf;

/* A buffer with no limit beyond memory. */
#define LOOM_BUF_UNLIMITED ((size_t)-1 / 2)
#define LOOM_BUF_INIT(max_) { NULL, 0, 0, (max_) }

void loom_buf_init(loom_buf *b, size_t max);
/* Appends len bytes. LOOM_ETOOLARGE past max, LOOM_ENOMEM; b unchanged then. */
int loom_buf_put(loom_buf *b, const void *data, size_t len);
int loom_buf_puts(loom_buf *b, const char *s);
int loom_buf_putc(loom_buf *b, char c);
int loom_buf_printf(loom_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int loom_buf_vprintf(loom_buf *b, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
/* Content as a string: "" for an empty buffer, never NULL. */
const char *loom_buf_cstr(const loom_buf *b);
/* Empties the buffer and keeps its memory. */
void loom_buf_clear(loom_buf *b);
/* Drops the first n bytes (n > len empties it). */
void loom_buf_consume(loom_buf *b, size_t n);
/* Hands the content to the caller (free() it) and empties b. Never NULL
 * unless out of memory. */
char *loom_buf_detach(loom_buf *b);
/* Releases the memory; the buffer may be reused after loom_buf_init. */
void loom_buf_free(loom_buf *b);

#ifdef __cplusplus
}
#endif
#endif
