/*
 * resp.c: the load generator's HTTP/1.1 response reader; see resp.h. No
 * library parses HTTP responses and SSE incrementally with this little
 * per-byte cost and no I/O of its own (libcurl owns its sockets), and the
 * load generator must cost far less than what it measures: hence by hand.
 */
#include "resp.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum {
    P_HEAD,
    P_BODY_LEN,
    P_BODY_EOF,
    P_CHUNK_SIZE,
    P_CHUNK_DATA,
    P_CHUNK_CRLF,
    P_TRAILER,
    P_DONE
};

void resp_init(resp *r, int stream, size_t body_max)
{
    /* The body buffer is kept from one response to the next. */
    r->phase = P_HEAD;
    r->stream = stream;
    r->body_max = body_max;
    r->head_len = 0;
    r->line_len = 0;
    r->status = 0;
    r->close_after = 0;
    r->remaining = 0;
    r->body_len = 0;
    r->scan = 0;
    r->saw_head = 0;
    r->saw_done = 0;
    r->content_chunks = 0;
    r->new_first = 0;
    r->content_overflow = 0;
    r->content_len = 0;
    r->err[0] = '\0';
}

void resp_free(resp *r)
{
    free(r->body);
    r->body = NULL;
    r->body_cap = 0;
}

int resp_fail(resp *r, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(r->err, sizeof(r->err), fmt, ap);
    va_end(ap);
    r->phase = P_DONE;
    return -1;
}

/*
 * Finds the first `"content"` member in s[0..n) whose value is a string
 * and points *val at its raw (still escaped) characters. Returns 1 when
 * found, 0 otherwise. `"reasoning_content"` does not match: the quote
 * before the name is part of the pattern.
 */
static int find_content(const char *s, size_t n, const char **val,
                        size_t *vlen)
{
    static const char key[] = "\"content\"";
    const char *p = s, *end = s + n;

    while ((p = memmem(p, (size_t)(end - p), key, sizeof(key) - 1))) {
        const char *q = p + sizeof(key) - 1;

        p = q;
        while (q < end && (*q == ' ' || *q == '\t'))
            q++;
        if (q >= end || *q != ':')
            continue;
        q++;
        while (q < end && (*q == ' ' || *q == '\t'))
            q++;
        if (q >= end || *q != '"')
            continue;
        q++;
        *val = q;
        while (q < end && *q != '"') {
            if (*q == '\\')
                q++;
            q++;
        }
        if (q >= end)
            return 0;
        *vlen = (size_t)(q - *val);
        return 1;
    }
    return 0;
}

static void content_add(resp *r, const char *v, size_t n)
{
    if (r->content_len + n > sizeof(r->content)) {
        r->content_overflow = 1;
        return;
    }
    memcpy(r->content + r->content_len, v, n);
    r->content_len += n;
}

/* One complete SSE line (without its line ending). */
static void sse_line(resp *r, const char *s, size_t n)
{
    const char *v;
    size_t vlen;

    if (n < 5 || memcmp(s, "data:", 5) != 0)
        return;
    s += 5;
    n -= 5;
    if (n && *s == ' ') {
        s++;
        n--;
    }
    if (n == 6 && memcmp(s, "[DONE]", 6) == 0) {
        r->saw_done = 1;
        return;
    }
    if (find_content(s, n, &v, &vlen) && vlen > 0) {
        if (r->content_chunks++ == 0)
            r->new_first = 1;
        content_add(r, v, vlen);
    }
}

static int body_add(resp *r, const char *p, size_t n)
{
    if (n > r->body_max - r->body_len)
        return resp_fail(r, "response body over %zu bytes", r->body_max);
    if (r->body_len + n > r->body_cap) {
        size_t cap = r->body_cap ? r->body_cap : 4096;
        char *nb;

        while (cap < r->body_len + n)
            cap *= 2;
        if (cap > r->body_max)
            cap = r->body_max;
        if (!(nb = realloc(r->body, cap)))
            return resp_fail(r, "out of memory");
        r->body = nb;
        r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, p, n);
    r->body_len += n;
    if (r->stream) {
        char *nl;

        while ((nl = memchr(r->body + r->scan, '\n',
                            r->body_len - r->scan))) {
            size_t len = (size_t)(nl - (r->body + r->scan));

            if (len && r->body[r->scan + len - 1] == '\r')
                len--;
            sse_line(r, r->body + r->scan, len);
            r->scan = (size_t)(nl - r->body) + 1;
        }
    }
    return 0;
}

/* The answer is complete: collect the text of a non-streamed one. */
static int resp_finish(resp *r)
{
    const char *v;
    size_t vlen;

    r->phase = P_DONE;
    if (!r->stream && r->body_len &&
        find_content(r->body, r->body_len, &v, &vlen))
        content_add(r, v, vlen);
    return 1;
}

static int header_is(const char *line, size_t n, const char *name,
                     const char **val, size_t *vlen)
{
    size_t k = strlen(name);
    const char *v, *e = line + n;

    if (n <= k || strncasecmp(line, name, k) != 0 || line[k] != ':')
        return 0;
    v = line + k + 1;
    while (v < e && (*v == ' ' || *v == '\t'))
        v++;
    while (e > v && (e[-1] == ' ' || e[-1] == '\t'))
        e--;
    *val = v;
    *vlen = (size_t)(e - v);
    return 1;
}

static int has_token(const char *v, size_t n, const char *tok)
{
    size_t k = strlen(tok);

    for (size_t i = 0; i + k <= n; i++)
        if (strncasecmp(v + i, tok, k) == 0)
            return 1;
    return 0;
}

/* The header block head[0..len) is complete (it ends with CRLF CRLF). */
static int parse_head(resp *r, size_t len)
{
    const char *p = r->head, *end = r->head + len - 2, *nl;
    int chunked = 0, have_len = 0, http10 = 0, keep_alive = 0;
    unsigned long long clen = 0;

    if (len < 14 || memcmp(p, "HTTP/1.", 7) != 0 ||
        (p[7] != '0' && p[7] != '1') || p[8] != ' ' ||
        p[9] < '1' || p[9] > '5' || p[10] < '0' || p[10] > '9' ||
        p[11] < '0' || p[11] > '9')
        return resp_fail(r, "bad status line");
    http10 = p[7] == '0';
    r->status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl)
        return resp_fail(r, "bad status line");
    for (p = nl + 1; p < end; p = nl + 1) {
        const char *v;
        size_t vlen, n;

        nl = memchr(p, '\n', (size_t)(end + 2 - p));
        if (!nl)
            break;
        n = (size_t)(nl - p);
        if (n && p[n - 1] == '\r')
            n--;
        if (header_is(p, n, "content-length", &v, &vlen)) {
            if (vlen == 0 || vlen > 12)
                return resp_fail(r, "bad Content-Length");
            clen = 0;
            for (size_t i = 0; i < vlen; i++) {
                if (v[i] < '0' || v[i] > '9')
                    return resp_fail(r, "bad Content-Length");
                clen = clen * 10 + (unsigned)(v[i] - '0');
            }
            have_len = 1;
        } else if (header_is(p, n, "transfer-encoding", &v, &vlen)) {
            chunked = has_token(v, vlen, "chunked");
        } else if (header_is(p, n, "connection", &v, &vlen)) {
            if (has_token(v, vlen, "close"))
                r->close_after = 1;
            if (has_token(v, vlen, "keep-alive"))
                keep_alive = 1;
        }
    }
    if (http10 && !keep_alive)
        r->close_after = 1;
    r->saw_head = 1;
    if (r->status >= 100 && r->status < 200) {
        /* An interim answer (100 Continue): the real one follows. */
        r->saw_head = 0;
        r->status = 0;
        r->close_after = 0;
        r->phase = P_HEAD;
        return 0;
    }
    if (r->status == 204 || r->status == 304)
        return resp_finish(r);
    if (chunked) {
        r->phase = P_CHUNK_SIZE;
        r->line_len = 0;
        return 0;
    }
    if (have_len) {
        if (clen > r->body_max)
            return resp_fail(r, "response body over %zu bytes", r->body_max);
        r->remaining = clen;
        r->phase = P_BODY_LEN;
        return clen == 0 ? resp_finish(r) : 0;
    }
    r->phase = P_BODY_EOF;
    r->close_after = 1;
    return 0;
}

/* A complete chunk-size line in r->line (without CRLF). */
static int parse_chunk_size(resp *r)
{
    unsigned long long n = 0;
    size_t i, digits = 0;

    for (i = 0; i < r->line_len; i++) {
        char c = r->line[i];
        int d;

        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            break;
        if (++digits > 8)
            return resp_fail(r, "chunk size too large");
        n = n * 16 + (unsigned)d;
    }
    if (digits == 0 || (i < r->line_len && r->line[i] != ';' &&
                        r->line[i] != ' ' && r->line[i] != '\t'))
        return resp_fail(r, "bad chunk size line");
    if (n > r->body_max - r->body_len)
        return resp_fail(r, "response body over %zu bytes", r->body_max);
    r->line_len = 0;
    if (n == 0) {
        r->phase = P_TRAILER;
        return 0;
    }
    r->remaining = n;
    r->phase = P_CHUNK_DATA;
    return 0;
}

/*
 * Collects one CRLF-terminated line into r->line. Returns the bytes of
 * p[0..n) consumed; *done is set when the line is complete (its line
 * ending is not stored). A line longer than LINE_MAX_CHUNK fails.
 */
static size_t take_line(resp *r, const char *p, size_t n, int *done)
{
    const char *nl = memchr(p, '\n', n);
    size_t take = nl ? (size_t)(nl - p) + 1 : n;
    size_t keep = nl ? take - 1 : take;

    *done = 0;
    if (r->line_len + keep > sizeof(r->line)) {
        resp_fail(r, "chunk line over %d bytes", LINE_MAX_CHUNK);
        return n;
    }
    memcpy(r->line + r->line_len, p, keep);
    r->line_len += keep;
    if (nl) {
        if (r->line_len && r->line[r->line_len - 1] == '\r')
            r->line_len--;
        *done = 1;
    }
    return take;
}

/*
 * Feeds n bytes of the connection to the reader. Returns 1 when the
 * response is complete (every byte consumed), 0 when more is needed, -1 on
 * a protocol error or a limit (message in r->err); bytes after the end of
 * a response are an error (requests are never pipelined). r->new_first is
 * set when these bytes completed the first content chunk of a stream.
 */
int resp_feed(resp *r, const char *p, size_t n)
{
    r->new_first = 0;
    while (n > 0) {
        switch (r->phase) {
        case P_HEAD: {
            size_t from = r->head_len > 3 ? r->head_len - 3 : 0;
            size_t room = sizeof(r->head) - r->head_len;
            size_t take = n < room ? n : room;
            char *e;

            if (take == 0)
                return resp_fail(r, "response head over %d bytes",
                                 HEAD_MAX);
            memcpy(r->head + r->head_len, p, take);
            r->head_len += take;
            e = memmem(r->head + from, r->head_len - from, "\r\n\r\n", 4);
            if (!e) {
                p += take;
                n -= take;
                continue;
            }
            {
                size_t hlen = (size_t)(e - r->head) + 4;
                size_t used = take - (r->head_len - hlen);
                int rc;

                p += used;
                n -= used;
                rc = parse_head(r, hlen);
                if (rc < 0)
                    return -1;
                r->head_len = 0;
                if (rc == 1)
                    return n ? resp_fail(r, "bytes after the response") : 1;
            }
            break;
        }
        case P_BODY_LEN: {
            size_t take = n < r->remaining ? n : (size_t)r->remaining;

            if (body_add(r, p, take) < 0)
                return -1;
            p += take;
            n -= take;
            r->remaining -= take;
            if (r->remaining == 0) {
                resp_finish(r);
                return n ? resp_fail(r, "bytes after the response") : 1;
            }
            break;
        }
        case P_BODY_EOF:
            if (body_add(r, p, n) < 0)
                return -1;
            n = 0;
            break;
        case P_CHUNK_SIZE:
        case P_TRAILER: {
            int done;
            size_t used = take_line(r, p, n, &done);

            if (r->phase == P_DONE)
                return -1;
            p += used;
            n -= used;
            if (!done)
                break;
            if (r->phase == P_CHUNK_SIZE) {
                if (parse_chunk_size(r) < 0)
                    return -1;
            } else if (r->line_len == 0) {
                resp_finish(r);
                return n ? resp_fail(r, "bytes after the response") : 1;
            } else {
                r->line_len = 0; /* a trailer field: ignored */
            }
            break;
        }
        case P_CHUNK_DATA: {
            size_t take = n < r->remaining ? n : (size_t)r->remaining;

            if (body_add(r, p, take) < 0)
                return -1;
            p += take;
            n -= take;
            r->remaining -= take;
            if (r->remaining == 0) {
                r->phase = P_CHUNK_CRLF;
                r->line_len = 0;
            }
            break;
        }
        case P_CHUNK_CRLF:
            /* CR then LF; a bare LF is tolerated. */
            if (*p == '\r' && r->line_len == 0) {
                r->line_len = 1;
            } else if (*p == '\n') {
                r->line_len = 0;
                r->phase = P_CHUNK_SIZE;
            } else {
                return resp_fail(r, "no CRLF after a chunk");
            }
            p++;
            n--;
            break;
        default:
            return resp_fail(r, "bytes after the response");
        }
    }
    return r->phase == P_DONE ? 1 : 0;
}

/* The server closed the connection: 1 if that ended the response. */
int resp_eof(resp *r)
{
    if (r->phase == P_BODY_EOF)
        return resp_finish(r);
    if (r->phase == P_DONE)
        return 1;
    return resp_fail(r, "connection closed %s",
                     r->phase == P_HEAD && r->head_len == 0
                         ? "before any response byte"
                         : "in the middle of the response");
}

/*
 * Checks a complete response against what was asked: status 200, a
 * stream ends with [DONE] and has content, the text is `expect` when
 * given. Returns 0 or -1 with a message in r->err.
 */
int resp_check(resp *r, const char *expect, size_t expect_len)
{
    if (r->status != 200) {
        size_t n = r->body_len < 120 ? r->body_len : 120;

        snprintf(r->err, sizeof(r->err), "status %d: %.*s", r->status,
                 (int)n, r->body ? r->body : "");
        for (char *c = r->err; *c; c++)
            if (*c == '\n' || *c == '\r')
                *c = ' ';
        return -1;
    }
    if (r->stream && !r->saw_done) {
        snprintf(r->err, sizeof(r->err), "stream without data: [DONE]");
        return -1;
    }
    if (r->stream && r->content_chunks == 0) {
        snprintf(r->err, sizeof(r->err), "stream without content");
        return -1;
    }
    if (r->content_overflow) {
        snprintf(r->err, sizeof(r->err), "answer over %d bytes",
                 CONTENT_MAX);
        return -1;
    }
    if (expect && (r->content_len != expect_len ||
                   memcmp(r->content, expect, expect_len) != 0)) {
        size_t n = r->content_len < 60 ? r->content_len : 60;

        snprintf(r->err, sizeof(r->err), "answer '%.*s' is not the "
                 "expected text", (int)n, r->content);
        return -1;
    }
    return 0;
}
