/*
 * resp.h: the load generator's HTTP/1.1 response reader (bench/serve).
 *
 * Bytes in, state out, no I/O: loadgen.c feeds it what a socket gave and
 * asks whether the response is complete; resp_test.c feeds it canned
 * answers, whole and byte by byte. It understands just what the benchmark
 * needs: the status line, Content-Length, the chunked transfer coding and
 * close-delimited bodies; for a streamed answer, a minimal SSE scanner that
 * looks only at `data:` lines for their `"content"` string and `[DONE]`.
 * Every buffer filled from the server has a limit below, and passing it is
 * an error of the response, never a crash.
 */
#ifndef SERVEBENCH_RESP_H
#define SERVEBENCH_RESP_H

#include <stddef.h>

#define HEAD_MAX (64 * 1024)           /* status line + headers */
#define LINE_MAX_CHUNK 256             /* a chunk-size or trailer line */
#define BODY_MAX (8 * 1024 * 1024)     /* one response body */
#define CONTENT_MAX (64 * 1024)        /* the answer text collected */
#define ERR_MAX 200                    /* an error message */

typedef struct {
    int phase;
    int stream;             /* scan the body as server-sent events */
    size_t body_max;        /* BODY_MAX unless a test lowers it */
    char head[HEAD_MAX];
    size_t head_len;
    char line[LINE_MAX_CHUNK];
    size_t line_len;
    int status;
    int close_after;        /* the server will close after this response */
    unsigned long long remaining;
    char *body;
    size_t body_len, body_cap;
    size_t scan;            /* SSE: start of the first unscanned line */
    int saw_head;           /* set once the header block is complete */
    int saw_done;           /* SSE: data: [DONE] seen */
    int content_chunks;     /* SSE: data lines with non-empty content */
    int new_first;          /* the last feed completed the first content */
    int content_overflow;
    char content[CONTENT_MAX];
    size_t content_len;
    char err[ERR_MAX];
} resp;

/* Prepares r for the next response (stream: scan the body as SSE; body_max:
 * BODY_MAX, or less in tests). The body buffer is kept for reuse; r must be
 * zeroed before its first use. */
void resp_init(resp *r, int stream, size_t body_max);

/* Frees the body buffer. */
void resp_free(resp *r);

/* Feeds n bytes of the connection to the reader. Returns 1 when the
 * response is complete (every byte consumed), 0 when more is needed, -1 on
 * a protocol error or a limit (message in r->err); bytes after the end of
 * a response are an error (requests are never pipelined). r->new_first is
 * set when these bytes completed the first content chunk of a stream. */
int resp_feed(resp *r, const char *p, size_t n);

/* The server closed the connection: 1 if that completed the response (a
 * close-delimited body), else -1 with a message. */
int resp_eof(resp *r);

/* Checks a complete response: status 200, a stream has content and ends
 * with data: [DONE], the text is expect[0..expect_len) when expect is not
 * NULL. Returns 0, or -1 with a message in r->err. */
int resp_check(resp *r, const char *expect, size_t expect_len);

/* Ends the response with an error message; returns -1. */
int resp_fail(resp *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The reader against canned answers (resp_test.c): 0 when every check
 * passes, 1 otherwise, with the failures on stderr. */
int resp_self_test(void);

#endif
