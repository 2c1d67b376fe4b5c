/*
 * The errors of one config load (or of a check over a loaded config, such
 * as the session's check of agents' tool names), collected so a user sees
 * every mistake of a file at once rather than one per try. The first
 * LOOM_CONFIG_MAX_ERRORS are kept one per line, the rest only counted
 * ("... and N more errors"). When the list is raised, loom_error_last()
 * gets the first error as its first line (the message a single error
 * always had), then as many whole lines as fit the per-thread message;
 * the whole list goes to callers who ask for it. A fixed-size line per
 * error would cut long paths, hence a buffer with a limit of its own.
 */
#include "core/config_internal.h"
#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What loom_error_last() holds (core/error.c keeps 1 KiB with its NUL). */
#define MESSAGE_MAX 1023

/* One line at most (a long path, a key and a message), and the list. */
#define LINE_MAX_BYTES 8192
#define LIST_MAX_BYTES ((size_t)LOOM_CONFIG_MAX_ERRORS * LINE_MAX_BYTES + 64)

void loom__config_errors_init(loom__config_errors *e)
{
    memset(e, 0, sizeof(*e));
    loom_buf_init(&e->kept, LIST_MAX_BYTES);
}

void loom__config_errors_free(loom__config_errors *e)
{
    loom_buf_free(&e->kept);
    memset(e, 0, sizeof(*e));
}

int loom__config_errors_add(loom__config_errors *e, int code, const char *fmt,
                            ...)
{
    char line[LINE_MAX_BYTES];
    va_list ap;

    if (e->count++ == 0)
        e->code = code;
    if (e->count > LOOM_CONFIG_MAX_ERRORS)
        return code;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    /* A line break inside a value would pass for another error. */
    for (char *c = line; *c; c++)
        if (*c == '\n' || *c == '\r')
            *c = ' ';
    if ((e->kept.len && loom_buf_putc(&e->kept, '\n') != 0) ||
        loom_buf_puts(&e->kept, line) != 0)
        e->oom = 1;
    return code;
}

/* "... and N more errors" past what was kept (or shown). */
static int put_more(loom_buf *b, size_t more)
{
    if (more == 0)
        return 0;
    return loom_buf_printf(b, "%s... and %zu more error%s", b->len ? "\n" : "",
                           more, more == 1 ? "" : "s");
}

int loom__config_errors_raise(loom__config_errors *e, char **all)
{
    loom_buf full = LOOM_BUF_INIT(LIST_MAX_BYTES + 64);
    loom_buf msg = LOOM_BUF_INIT(MESSAGE_MAX + 256);
    const char *text = loom_buf_cstr(&e->kept), *p = text;
    size_t kept =
        e->count < LOOM_CONFIG_MAX_ERRORS ? e->count : LOOM_CONFIG_MAX_ERRORS;
    size_t shown = 0;
    int code = e->code;

    if (all)
        *all = NULL;
    if (e->count == 0)
        return 0;
    if (e->oom || loom_buf_put(&full, text, e->kept.len) != 0 ||
        put_more(&full, e->count - kept) != 0)
        goto oom;
    /* The message: whole lines while they fit with the tail after them
     * (the first is always there, cut by core/error.c when too long). */
    for (; shown < kept; shown++) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        size_t tail = shown + 1 < e->count ? 40 : 0;

        if (shown > 0 && msg.len + 1 + len + tail > MESSAGE_MAX)
            break;
        if ((shown > 0 && loom_buf_putc(&msg, '\n') != 0) ||
            loom_buf_put(&msg, p, len < MESSAGE_MAX ? len : MESSAGE_MAX) != 0)
            goto oom;
        p = nl ? nl + 1 : p + len;
    }
    if (put_more(&msg, e->count - shown) != 0)
        goto oom;
    loom__error_set(code, "%s", loom_buf_cstr(&msg));
    loom_buf_free(&msg);
    if (all && !(*all = loom_buf_detach(&full)))
        code = loom__error_oom();
    loom_buf_free(&full);
    loom__config_errors_free(e);
    return code;

oom:
    loom_buf_free(&msg);
    loom_buf_free(&full);
    loom__config_errors_free(e);
    return loom__error_oom();
}
