/*
 * loom/sse.h: a Server-Sent Events parser that does no I/O.
 *
 * Bytes go in at any split (one byte at a time or a whole body); complete
 * events come out through a callback, as the WHATWG EventSource rules
 * define them: `data` lines joined with "\n", `event`, `id`, `retry`,
 * comments (lines starting with ':') ignored, "\n", "\r\n" and "\r" line
 * ends (a "\r" at the end of one chunk and "\n" at the start of the next
 * are one line end), a leading UTF-8 BOM skipped, stray blank lines
 * ignored (a blank line with no data dispatches nothing).
 *
 * Limits: a line longer than max_line or an event whose data grows past
 * max_event makes feed() fail with LOOM_ETOOLARGE; the parser is then
 * unusable (call reset). No input can make it crash or grow unbounded.
 */
#ifndef LOOM_SSE_H
#define LOOM_SSE_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *event; /* the `event` field, "message" when none was given */
    const char *data;  /* data lines joined with "\n", NUL-terminated */
    size_t data_len;
    const char *id;    /* last event id seen so far (persists), "" if none */
    long retry;        /* last `retry` value in ms, -1 if none */
} loom_sse_event;

/*
 * Called once per complete event. The event and its strings are borrowed
 * and valid only during the call. A non-zero return stops the parser:
 * feed() returns that value at once.
 */
typedef int (*loom_sse_event_cb)(const loom_sse_event *ev, void *payload);

typedef struct {
    unsigned version;
    size_t max_line;  /* longest line, bytes (default 1 MiB) */
    size_t max_event; /* largest joined data of one event (default 8 MiB) */
} loom_sse_options;

#define LOOM_SSE_OPTIONS_VERSION 1
#define LOOM_SSE_OPTIONS_INIT                                                  \
    {                                                                          \
        .version = LOOM_SSE_OPTIONS_VERSION                                    \
    }

typedef struct loom_sse_parser loom_sse_parser;

/* opts may be NULL for defaults. */
int loom_sse_parser_new(loom_sse_parser **out, const loom_sse_options *opts,
                        loom_sse_event_cb cb, void *payload);
/* Feeds len bytes. 0, the callback's non-zero value, or LOOM_ETOOLARGE. */
int loom_sse_parser_feed(loom_sse_parser *p, const char *data, size_t len);
/*
 * Ends the input. An event still pending without its closing blank line is
 * dispatched (servers often omit the last blank line); a partial last line
 * counts as a line. Returns like feed().
 */
int loom_sse_parser_finish(loom_sse_parser *p);
/* Forgets all state (including last id) to parse a new stream. */
void loom_sse_parser_reset(loom_sse_parser *p);
void loom_sse_parser_free(loom_sse_parser *p);

#ifdef __cplusplus
}
#endif
#endif
