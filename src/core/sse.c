/*
 * A Server-Sent Events parser that does no I/O (nghttp2's model: bytes in,
 * events out through a callback), following the WHATWG EventSource
 * "interpreting an event stream" rules. Written by hand because none of the
 * libraries loom links parses SSE.
 *
 * The input is scanned with memchr for line ends. A line that lies wholly
 * inside one feed() is parsed in place; only the tail of a chunk that ends
 * mid-line is copied into a carry buffer. Field values are copied once, into
 * the event's data (or event/id) buffer, so the usual `data: {...}\n\n` event
 * costs one copy and no allocation once the buffers have grown. The state
 * kept across chunks is small: the carry, a "last chunk ended in CR" flag
 * (so a CRLF split across chunks is one line end), and how much of a UTF-8
 * BOM has been matched at stream start. Every buffer is bounded by
 * max_line or max_event; passing a bound stops the parser for good (until
 * reset) so a caller can never see half-parsed state.
 */
#include "loom/sse.h"
#include "loom/buf.h"
#include "core/error.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_MAX_LINE ((size_t)1 << 20)
#define DEFAULT_MAX_EVENT ((size_t)8 << 20)

static const char bom[3] = { '\xEF', '\xBB', '\xBF' };

struct loom_sse_parser {
    loom_sse_event_cb cb;
    void *payload;
    size_t max_line;
    size_t max_event;

    loom_buf line;  /* partial line carried from the previous chunk */
    loom_buf data;  /* joined data of the pending event, no trailing LF */
    loom_buf event; /* event type of the pending event, "" for "message" */
    loom_buf id;    /* last event id; persists across events */
    long retry;     /* last valid retry, -1 if none */

    int has_data;   /* a data field was seen for the pending event */
    int pending_cr; /* the previous chunk ended with CR */
    int bom_done;   /* stream start is past (BOM skipped or absent) */
    size_t bom_len; /* BOM bytes matched so far while !bom_done */
    int stopped;    /* non-zero: the code that stopped the parser */
};

/* Calls the callback for the pending event, then forgets the event. */
static int dispatch(loom_sse_parser *p)
{
    loom_sse_event ev;
    int rc;

    if (!p->has_data) {
        /* WHATWG: no data means no event, but the type still resets. */
        loom_buf_clear(&p->event);
        return 0;
    }
    ev.event = p->event.len ? p->event.ptr : "message";
    ev.data = loom_buf_cstr(&p->data);
    ev.data_len = p->data.len;
    ev.id = loom_buf_cstr(&p->id);
    ev.retry = p->retry;
    rc = p->cb(&ev, p->payload);
    loom_buf_clear(&p->data);
    loom_buf_clear(&p->event);
    p->has_data = 0;
    return rc;
}

/* True when s[0..len) is one or more ASCII digits; stores the value, or
 * returns false when it does not fit in a long. */
static int parse_retry(const char *s, size_t len, long *out)
{
    long v = 0;
    size_t i;

    if (len == 0)
        return 0;
    for (i = 0; i < len; i++) {
        int d;

        if (s[i] < '0' || s[i] > '9')
            return 0;
        d = s[i] - '0';
        if (v > (LONG_MAX - d) / 10)
            return 0;
        v = v * 10 + d;
    }
    *out = v;
    return 1;
}

static int field_is(const char *name, size_t len, const char *lit,
                    size_t litlen)
{
    return len == litlen && memcmp(name, lit, len) == 0;
}

/* Interprets one complete line (without its line end). */
static int process_line(loom_sse_parser *p, const char *s, size_t len)
{
    const char *colon, *value;
    size_t nlen, vlen;
    int rc;

    if (len == 0)
        return dispatch(p);
    if (s[0] == ':')
        return 0; /* comment */

    colon = memchr(s, ':', len);
    if (colon) {
        nlen = (size_t)(colon - s);
        value = colon + 1;
        vlen = len - nlen - 1;
        if (vlen && value[0] == ' ') {
            value++;
            vlen--;
        }
    } else {
        nlen = len;
        value = s + len;
        vlen = 0;
    }

    if (field_is(s, nlen, "data", 4)) {
        size_t add = vlen + (p->has_data ? 1 : 0);

        if (add > p->max_event || p->data.len > p->max_event - add)
            return loom__error_set(LOOM_ETOOLARGE,
                                   "SSE event data longer than %zu bytes",
                                   p->max_event);
        if (p->has_data && (rc = loom_buf_putc(&p->data, '\n')) != 0)
            return rc;
        if ((rc = loom_buf_put(&p->data, value, vlen)) != 0)
            return rc;
        p->has_data = 1;
    } else if (field_is(s, nlen, "event", 5)) {
        loom_buf_clear(&p->event);
        if ((rc = loom_buf_put(&p->event, value, vlen)) != 0)
            return rc;
    } else if (field_is(s, nlen, "id", 2)) {
        if (memchr(value, '\0', vlen))
            return 0; /* WHATWG: an id with NUL is ignored */
        loom_buf_clear(&p->id);
        if ((rc = loom_buf_put(&p->id, value, vlen)) != 0)
            return rc;
    } else if (field_is(s, nlen, "retry", 5)) {
        long v;

        if (parse_retry(value, vlen, &v))
            p->retry = v;
    }
    /* Any other field is ignored. */
    return 0;
}

static int line_too_long(const loom_sse_parser *p)
{
    return loom__error_set(LOOM_ETOOLARGE, "SSE line longer than %zu bytes",
                           p->max_line);
}

/*
 * Parses len bytes that follow the BOM check and the pending-CR check. Two
 * memchr cursors (one for LF, one for CR) are refreshed only when the scan
 * passes them, so each byte is looked at a bounded number of times.
 */
static int scan(loom_sse_parser *p, const char *s, size_t len)
{
    const char *pos = s, *end = s + len;
    const char *nl = NULL, *cr = NULL;
    int nl_fresh = 0, cr_fresh = 0;
    int rc;

    while (pos < end) {
        const char *eol;
        size_t seg;

        if (!nl_fresh || (nl && nl < pos)) {
            nl = memchr(pos, '\n', (size_t)(end - pos));
            nl_fresh = 1;
        }
        if (!cr_fresh || (cr && cr < pos)) {
            cr = memchr(pos, '\r', (size_t)(end - pos));
            cr_fresh = 1;
        }
        if (!nl && !cr) {
            /* The rest is a partial line: carry it to the next chunk. */
            seg = (size_t)(end - pos);
            if (seg > p->max_line || p->line.len > p->max_line - seg)
                return line_too_long(p);
            return loom_buf_put(&p->line, pos, seg);
        }
        eol = !nl ? cr : !cr ? nl : (nl < cr ? nl : cr);
        seg = (size_t)(eol - pos);

        if (p->line.len) {
            if (seg > p->max_line || p->line.len > p->max_line - seg)
                return line_too_long(p);
            if ((rc = loom_buf_put(&p->line, pos, seg)) != 0)
                return rc;
            rc = process_line(p, p->line.ptr, p->line.len);
            loom_buf_clear(&p->line);
        } else {
            if (seg > p->max_line)
                return line_too_long(p);
            rc = process_line(p, pos, seg);
        }
        if (rc)
            return rc;

        pos = eol + 1;
        if (*eol == '\r') {
            if (pos == end)
                p->pending_cr = 1; /* an LF may start the next chunk */
            else if (*pos == '\n')
                pos++;
        }
    }
    return 0;
}

/*
 * Consumes the leading bytes that may belong to a BOM. Stores in *skip how
 * many bytes of s were taken. When the bytes stop matching, the part of
 * the BOM matched earlier is ordinary input and is parsed first.
 */
static int check_bom(loom_sse_parser *p, const char *s, size_t len,
                     size_t *skip)
{
    size_t i = 0;
    size_t matched = p->bom_len;

    while (i < len && p->bom_len < sizeof(bom) && s[i] == bom[p->bom_len]) {
        i++;
        p->bom_len++;
    }
    if (p->bom_len == sizeof(bom)) {
        p->bom_done = 1;
        *skip = i;
        return 0;
    }
    if (i == len) {
        *skip = i; /* still a BOM prefix; wait for more */
        return 0;
    }
    /* Mismatch: nothing was a BOM. Re-parse what was held back earlier;
     * the bytes matched in this chunk are parsed from s itself. */
    p->bom_done = 1;
    *skip = 0;
    return scan(p, bom, matched);
}

static int stopped_error(const loom_sse_parser *p)
{
    if (p->stopped == LOOM_ETOOLARGE)
        loom__error_set(LOOM_ETOOLARGE,
                        "SSE parser stopped by an earlier size limit; "
                        "call loom_sse_parser_reset");
    return p->stopped;
}

/*
 * Contracts are in include/loom/sse.h. Beyond them: opts->version must be
 * LOOM_SSE_OPTIONS_VERSION, and a zero limit means the default.
 */
int loom_sse_parser_new(loom_sse_parser **out, const loom_sse_options *opts,
                        loom_sse_event_cb cb, void *payload)
{
    loom_sse_parser *p;

    if (out)
        *out = NULL;
    if (!out || !cb)
        return loom__error_set(LOOM_EINVALID,
                               "loom_sse_parser_new: out and cb are required");
    if (opts && opts->version != LOOM_SSE_OPTIONS_VERSION && opts->version != 0)
        return loom__error_set(LOOM_EINVALID,
                               "unsupported loom_sse_options version %u",
                               opts->version);
    p = calloc(1, sizeof(*p));
    if (!p)
        return loom__error_oom();
    p->cb = cb;
    p->payload = payload;
    p->max_line = opts && opts->max_line ? opts->max_line : DEFAULT_MAX_LINE;
    p->max_event =
        opts && opts->max_event ? opts->max_event : DEFAULT_MAX_EVENT;
    /* The buffers cannot hold more than this; the checks above them keep
     * the limits exact, so clamping only matters for absurd options. */
    if (p->max_line > LOOM_BUF_UNLIMITED)
        p->max_line = LOOM_BUF_UNLIMITED;
    if (p->max_event > LOOM_BUF_UNLIMITED)
        p->max_event = LOOM_BUF_UNLIMITED;
    loom_buf_init(&p->line, p->max_line);
    loom_buf_init(&p->data, p->max_event);
    loom_buf_init(&p->event, p->max_line);
    loom_buf_init(&p->id, p->max_line);
    p->retry = -1;
    *out = p;
    return 0;
}

/*
 * Any non-zero result (a limit, the callback's value, out of memory) stops
 * the parser: later feed() and finish() calls return the same code without
 * reading input until loom_sse_parser_reset().
 */
int loom_sse_parser_feed(loom_sse_parser *p, const char *data, size_t len)
{
    int rc = 0;

    if (!p)
        return loom__error_set(LOOM_EINVALID, "loom_sse_parser_feed: NULL");
    if (p->stopped)
        return stopped_error(p);
    if (len == 0)
        return 0;
    if (!data)
        return loom__error_set(LOOM_EINVALID,
                               "loom_sse_parser_feed: NULL data");

    if (!p->bom_done) {
        size_t skip;

        if ((rc = check_bom(p, data, len, &skip)) != 0)
            goto cleanup;
        data += skip;
        len -= skip;
        if (len == 0)
            goto cleanup;
    }
    if (p->pending_cr) {
        p->pending_cr = 0;
        if (data[0] == '\n') {
            data++;
            len--;
        }
    }
    rc = scan(p, data, len);

cleanup:
    if (rc)
        p->stopped = rc;
    return rc;
}

/*
 * Leaves the parser at a clean line and event boundary with the last id and
 * retry kept, so input fed afterwards continues the same stream (no BOM is
 * skipped again); reset() starts a new one.
 */
int loom_sse_parser_finish(loom_sse_parser *p)
{
    int rc = 0;

    if (!p)
        return loom__error_set(LOOM_EINVALID, "loom_sse_parser_finish: NULL");
    if (p->stopped)
        return stopped_error(p);

    if (!p->bom_done) {
        /* A stream that ended inside a BOM prefix: those bytes are text. */
        p->bom_done = 1;
        if ((rc = scan(p, bom, p->bom_len)) != 0)
            goto cleanup;
    }
    p->pending_cr = 0;
    if (p->line.len) {
        rc = process_line(p, p->line.ptr, p->line.len);
        loom_buf_clear(&p->line);
        if (rc)
            goto cleanup;
    }
    rc = dispatch(p);

cleanup:
    if (rc)
        p->stopped = rc;
    return rc;
}

/* Keeps the buffers' memory (bounded by the limits) for the next stream. */
void loom_sse_parser_reset(loom_sse_parser *p)
{
    if (!p)
        return;
    loom_buf_clear(&p->line);
    loom_buf_clear(&p->data);
    loom_buf_clear(&p->event);
    loom_buf_clear(&p->id);
    p->retry = -1;
    p->has_data = 0;
    p->pending_cr = 0;
    p->bom_done = 0;
    p->bom_len = 0;
    p->stopped = 0;
}

void loom_sse_parser_free(loom_sse_parser *p)
{
    if (!p)
        return;
    loom_buf_free(&p->line);
    loom_buf_free(&p->data);
    loom_buf_free(&p->event);
    loom_buf_free(&p->id);
    free(p);
}
