/*
 * Server-sent event responses: a libmicrohttpd content-reader response
 * that drains a run's event log through a formatter (loom's native
 * events here, OpenAI chunks in chat.c).
 *
 * The reader runs on the server thread. When it has nothing to send it
 * suspends the connection (returning 0 to libmicrohttpd without
 * suspending would make it spin) and the stream waits as a watcher of the
 * run: a new event, the run's end, a keep-alive that is due or a client
 * that went away (both seen by the ticker) resume it. A stream is
 * refcounted by its response (freed by libmicrohttpd) and its request
 * (ended by the completion callback, which also decides whether the
 * client left early and the run must be cancelled).
 */
#include "core/clock.h"
#include "core/error.h"
#include "loom/log.h"
#include "server/srvpriv.h"

#include <stdlib.h>
#include <string.h>

/* libmicrohttpd allocates (and zeroes) this with the response, per
 * stream. A chunked answer (HTTP/1.1) never uses it: the reader writes
 * straight into the connection's write buffer. Only an answer without
 * chunks (an HTTP/1.0 client's) is read through it, a block at a time; a
 * chat chunk is about 200 bytes, so 512 still carries two a call, and
 * the response with its block (about 620 bytes, mimalloc's 640-byte size
 * class; 1,280 with 1 KiB) is what every open stream keeps. */
#define SSE_BLOCK 512
#define SSE_FILL (64 * 1024)        /* format events up to this much */
#define SSE_MAX_PENDING ((size_t)64 << 20) /* one formatted batch at most */

typedef struct srv_sse_stream {
    atomic_int refs;
    srv_server *s;
    srv_run *run;
    srv_susp susp;
    srv_sse_options o;
    loom_buf out;
    size_t off;
    uint64_t last; /* the last seq formatted */
    int began;
    int done;
    int watching;
    int counted;
} srv_sse_stream;

int srv_sse_native(srv_run *run, const srv_event *ev, loom_buf *out,
                   void *payload)
{
    (void)run;
    (void)payload;
    if (loom_buf_printf(out, "id: %llu\nevent: %s\ndata: ",
                        (unsigned long long)ev->seq, ev->type_name) ||
        loom_buf_put(out, ev->text, ev->text_len) ||
        loom_buf_puts(out, "\n\n"))
        return LOOM_ETOOLARGE;
    return SRV_SSE_CONTINUE;
}

static void stream_unref(srv_sse_stream *st)
{
    if (!st || atomic_fetch_sub(&st->refs, 1) != 1)
        return;
    if (st->o.free_payload)
        st->o.free_payload(st->o.payload);
    srv_run_unref(st->run);
    loom_buf_free(&st->out);
    free(st);
}

/* Formats what the log holds after st->last; sets done at the end. */
static int fill(srv_sse_stream *st)
{
    srv_sse_format_fn fmt = st->o.format ? st->o.format : srv_sse_native;

    while (st->out.len < SSE_FILL) {
        /* Read "ended" before looking for the next event: if the run had
         * ended and no event follows, none ever will. */
        int ended = srv_run_ended(st->run);
        const srv_event *e = srv_run_next_event(st->run, st->last);
        int rc;

        if (!e) {
            if (ended) {
                if (st->o.end)
                    st->o.end(st->run, &st->out, st->o.payload);
                st->done = 1;
            }
            return 0;
        }
        rc = fmt(st->run, e, &st->out, st->o.payload);
        st->last = e->seq;
        if (rc < 0)
            return rc;
        if (rc == SRV_SSE_END) {
            st->done = 1;
            return 0;
        }
    }
    return 0;
}

static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    srv_sse_stream *st = cls;
    int gone, keepalive, rc;

    (void)pos;
    for (;;) {
        if (st->off < st->out.len) {
            size_t n = st->out.len - st->off;
            if (n > max)
                n = max;
            memcpy(buf, st->out.ptr + st->off, n);
            st->off += n;
            if (st->off == st->out.len) {
                loom_buf_clear(&st->out);
                st->off = 0;
            }
            st->susp.idle_since = loom__mono_ms();
            return (ssize_t)n;
        }
        if (st->done)
            return MHD_CONTENT_READER_END_OF_STREAM;
        srv__susp_flags(st->s, &st->susp, &gone, &keepalive);
        if (gone)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (!st->began) {
            st->began = 1;
            if (st->o.begin)
                st->o.begin(st->run, &st->out, st->o.payload);
            continue;
        }
        if (fill(st) < 0) {
            loom_warn("run %s: formatting an event failed: %s",
                      srv_run_id(st->run), loom_error_last());
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (st->out.len || st->done)
            continue;
        if (keepalive) {
            if (loom_buf_puts(&st->out, ": keep-alive\n\n"))
                return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        rc = srv__suspend(st->s, &st->susp);
        if (rc == 0)
            return 0;
        if (rc < 0)
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void response_free(void *cls)
{
    stream_unref(cls);
}

void srv__sse_request_done(struct srv_sse_stream *st, int ok)
{
    if (!ok && !st->done && !st->o.observer)
        srv_run_leave(st->run);
    if (st->watching) {
        srv__run_unwatch(st->run, &st->susp);
        st->watching = 0;
    }
    if (st->counted) {
        atomic_fetch_sub(&st->s->streams, 1);
        st->counted = 0;
    }
    stream_unref(st);
}

int srv_reply_sse(srv_request *r, srv_run *run, const srv_sse_options *o)
{
    srv_server *s = r->srv;
    srv_sse_stream *st;
    struct MHD_Response *resp;
    int rc;

    if (!run || !o) {
        if (o && o->free_payload)
            o->free_payload(o->payload);
        return loom__error_set(LOOM_EINVALID, "srv_reply_sse: bad call");
    }
    if (!(st = calloc(1, sizeof(*st)))) {
        if (o->free_payload)
            o->free_payload(o->payload);
        return loom__error_oom();
    }
    srv_run_ref(run);
    st->s = s;
    st->run = run;
    st->o = *o;
    st->last = o->after_seq;
    loom_buf_init(&st->out, SSE_MAX_PENDING);
    atomic_init(&st->refs, 1);
    resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK,
                                             reader, st, response_free);
    if (!resp) {
        stream_unref(st);
        return loom__error_oom();
    }
    /* One reference for the response (response_free), one for the
     * request (srv__sse_request_done). */
    atomic_store(&st->refs, 2);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                            "text/event-stream; charset=utf-8");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    st->susp.run = o->observer ? NULL : run; /* the ticker cancels it */
    st->susp.keepalive_ms = s->sc->keepalive_ms;
    st->susp.idle_since = loom__mono_ms();
    st->susp.mc = srv__request_mc(r);
    st->susp.fd = srv__conn_fd(st->susp.mc);
    srv__run_watch(run, &st->susp);
    st->watching = 1;
    srv__request_set_stream(r, st);
    atomic_fetch_add(&s->streams, 1);
    st->counted = 1;
    if ((rc = srv__queue(r, 200, resp)) != 0) {
        /* The response is gone (response_free ran): end the request's
         * side too, so nothing refers to the stream. */
        srv__request_set_stream(r, NULL);
        srv__sse_request_done(st, 1);
        return rc;
    }
    return 0;
}
