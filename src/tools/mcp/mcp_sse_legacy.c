/*
 * The legacy HTTP+SSE transport of the MCP client (protocol 2024-11-05,
 * `transport: sse`), for servers that predate Streamable HTTP.
 *
 * A connection is one event stream: a GET on the configured URL that
 * stays open. Its first `endpoint` event names where messages go (a URL
 * relative to the stream's, which must stay on the same origin: loom's
 * headers never go to another host); each message is then a POST of
 * JSON there, which the server accepts (202) and whose answer comes back
 * later on the stream as a `message` event. A reader thread owns the
 * stream and hands every message to the core (loom__mcp_dispatch); when
 * the stream ends the connection is lost (loom__mcp_lost), so calls in
 * flight fail at once and the next call opens a new stream. A 404 to a
 * POST means the server forgot the session: LOOM_ENOTFOUND, which the
 * core answers with a new connection, as for Streamable HTTP.
 *
 * The era has no session header, no protocol-version header and no
 * authorization: only the config's headers are sent.
 */
#include "core/clock.h"
#include "core/error.h"
#include "loom/buf.h"
#include "loom/log.h"
#include "loom/sse.h"
#include "tools/mcp/mcp_internal.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CONNECT_MS 10000L
#define ERROR_SHOWN 300

typedef struct {
    loom_mcp_server *s;
    unsigned gen;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *endpoint; /* where POSTs go, once the stream said; under mu */
    int ended;      /* the stream ended (or never opened); under mu */
    char why[256];  /* why it ended */
    atomic_int stopping;
    int reading; /* the reader thread was started */
    pthread_t reader;
    loom_sse_parser *parser;
} sse_conn;

static const char *server_name(const sse_conn *c)
{
    return loom__mcp_config(c->s)->name;
}

/*
 * The endpoint event's URI resolved against the stream's URL, as a new
 * string; NULL when it does not resolve or leaves the stream's origin
 * (scheme, host and port).
 */
static char *resolve_endpoint(const char *base, const char *ref)
{
    CURLU *b = curl_url(), *r = curl_url();
    char *url = NULL, *whole = NULL, *part[2][3] = {{NULL}};
    static const CURLUPart parts[3] = {CURLUPART_SCHEME, CURLUPART_HOST,
                                       CURLUPART_PORT};
    int same = 1;

    if (!b || !r || curl_url_set(b, CURLUPART_URL, base, 0) != CURLUE_OK ||
        curl_url_set(r, CURLUPART_URL, base, 0) != CURLUE_OK ||
        curl_url_set(r, CURLUPART_URL, ref, 0) != CURLUE_OK)
        goto done;
    for (int i = 0; i < 3; i++) {
        curl_url_get(b, parts[i], &part[0][i], CURLU_DEFAULT_PORT);
        curl_url_get(r, parts[i], &part[1][i], CURLU_DEFAULT_PORT);
        same = same && part[0][i] && part[1][i] &&
               strcmp(part[0][i], part[1][i]) == 0;
    }
    if (same && curl_url_get(r, CURLUPART_URL, &whole, 0) == CURLUE_OK) {
        url = strdup(whole);
        curl_free(whole);
    }
    for (int i = 0; i < 3; i++) {
        curl_free(part[0][i]);
        curl_free(part[1][i]);
    }

done:
    curl_url_cleanup(b);
    curl_url_cleanup(r);
    return url;
}

/* The stream is over (or never opened): why, for the calls in flight. */
static void stream_ended(sse_conn *c, const char *why)
{
    int had;

    pthread_mutex_lock(&c->mu);
    had = c->endpoint != NULL;
    if (!c->ended)
        snprintf(c->why, sizeof(c->why), "%s", why);
    c->ended = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (had && !atomic_load(&c->stopping))
        loom__mcp_lost(c->s, c->gen, why);
}

static int on_event(const loom_sse_event *ev, void *arg)
{
    sse_conn *c = arg;

    if (strcmp(ev->event, "endpoint") == 0) {
        char *url = resolve_endpoint(loom__mcp_config(c->s)->url, ev->data);
        pthread_mutex_lock(&c->mu);
        if (!url)
            loom_warn("mcp %s: the stream's endpoint %.200s is not on the "
                      "stream's origin; ignored",
                      server_name(c), ev->data);
        else if (!c->endpoint) {
            c->endpoint = url;
            url = NULL;
        }
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        free(url);
        return 0;
    }
    if (strcmp(ev->event, "message") == 0 && ev->data_len) {
        json_t *msg = json_loadb(ev->data, ev->data_len, 0, NULL);
        if (msg)
            loom__mcp_dispatch(c->s, c->gen, msg);
        else
            loom_warn("mcp %s: skipped a message that is not JSON (%zu "
                      "bytes)",
                      server_name(c), ev->data_len);
    }
    return 0;
}

static size_t on_stream(char *data, size_t size, size_t n, void *arg)
{
    sse_conn *c = arg;

    return loom_sse_parser_feed(c->parser, data, size * n) == 0 ? size * n : 0;
}

/* What aborts a transfer: the connection stopping, or a cancel flag. */
typedef struct {
    sse_conn *c;
    loom_cancel *cancel;
} abort_when;

static int on_xfer(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut,
                   curl_off_t un)
{
    const abort_when *a = arg;

    (void)dt;
    (void)dn;
    (void)ut;
    (void)un;
    return atomic_load(&a->c->stopping) || loom_cancel_is_set(a->cancel);
}

/* A transfer of url with headers h, its body to write(arg), aborted as a
 * says. NULL on OOM. */
static CURL *easy_for(const char *url, struct curl_slist *h,
                      curl_write_callback write, void *arg, abort_when *a)
{
    CURL *e = curl_easy_init();

    if (!e)
        return NULL;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, CONNECT_MS);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, arg);
    curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, on_xfer);
    curl_easy_setopt(e, CURLOPT_XFERINFODATA, a);
    curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
    return e;
}

/* The config's headers (and accept) as a curl list; NULL on OOM. */
static struct curl_slist *headers_for(sse_conn *c, const char *accept)
{
    struct curl_slist *h = curl_slist_append(NULL, accept);

    return h ? loom__mcp_curl_headers(h, loom__mcp_config(c->s)->headers)
             : NULL;
}

/* The reader: the GET of the event stream, until it ends or stop. */
static void *read_main(void *arg)
{
    sse_conn *c = arg;
    struct curl_slist *h = headers_for(c, "Accept: text/event-stream");
    abort_when a = {c, NULL};
    CURL *e =
        h ? easy_for(loom__mcp_config(c->s)->url, h, on_stream, c, &a) : NULL;
    long status = 0;
    char why[256];
    CURLcode cc = CURLE_OUT_OF_MEMORY;

    if (e) {
        curl_easy_setopt(e, CURLOPT_FAILONERROR, 1L);
        cc = curl_easy_perform(e);
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    }
    if (cc == CURLE_OK)
        snprintf(why, sizeof(why), "the event stream ended");
    else if (status >= 400)
        snprintf(why, sizeof(why), "the event stream: HTTP %ld", status);
    else
        snprintf(why, sizeof(why), "the event stream: %s",
                 curl_easy_strerror(cc));
    curl_easy_cleanup(e);
    curl_slist_free_all(h);
    stream_ended(c, why);
    return NULL;
}

/*
 * Opens the stream and waits (startup_timeout_ms at most) for its
 * endpoint event.
 */
static void sse_stop(void *impl);
static void sse_free(void *impl);

static int sse_open(loom_mcp_server *s, unsigned gen, void **impl)
{
    sse_conn *c = calloc(1, sizeof(*c));
    int64_t until = loom__mono_ms() + loom__mcp_config(s)->startup_timeout_ms;
    int rc = 0;

    *impl = NULL;
    if (!c)
        return loom__error_oom();
    c->s = s;
    c->gen = gen;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (loom_sse_parser_new(&c->parser, NULL, on_event, c) != 0) {
        rc = loom__error_oom();
        goto fail;
    }
    if (pthread_create(&c->reader, NULL, read_main, c) != 0) {
        rc = loom__error_set(LOOM_ERROR, "MCP server '%s': no thread",
                             server_name(c));
        goto fail;
    }
    c->reading = 1;
    *impl = c;
    pthread_mutex_lock(&c->mu);
    while (!c->endpoint && !c->ended && loom__mono_ms() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    if (!c->endpoint)
        rc = loom__error_set(
            LOOM_EUPSTREAM, "MCP server '%s': %s before its endpoint event",
            server_name(c), c->ended ? c->why : "no answer in time");
    pthread_mutex_unlock(&c->mu);
    if (rc == 0)
        return 0;

fail:
    /* A failed open leaves nothing behind (the core frees only what
     * opened). */
    sse_stop(c);
    sse_free(c);
    *impl = NULL;
    return rc;
}

static size_t on_body(char *data, size_t size, size_t n, void *arg)
{
    return loom_buf_put(arg, data, size * n) == 0 ? size * n : 0;
}

/* Sends msg with a POST to the endpoint; its answer comes on the stream. */
static int sse_send(void *impl, const json_t *msg, int64_t deadline,
                    loom_cancel *cancel, mcp_pending *p)
{
    sse_conn *c = impl;
    char *text = json_dumps(msg, JSON_COMPACT), *url = NULL;
    struct curl_slist *h = headers_for(c, "Content-Type: application/json");
    loom_buf body = LOOM_BUF_INIT(4096);
    long left = (long)(deadline - loom__mono_ms()), status = 0;
    abort_when a = {c, cancel};
    char why[sizeof(c->why)] = "";
    CURL *e = NULL;
    CURLcode cc;
    int rc = 0;

    (void)p;
    pthread_mutex_lock(&c->mu);
    if (c->endpoint && !c->ended)
        url = strdup(c->endpoint);
    else
        snprintf(why, sizeof(why), "%s", c->why[0] ? c->why : "not open");
    pthread_mutex_unlock(&c->mu);
    if (!url && text && h) {
        rc = loom__error_set(LOOM_EUPSTREAM, "MCP server '%s': %s",
                             server_name(c), why);
        goto done;
    }
    if (!text || !h || !url || !(e = easy_for(url, h, on_body, &body, &a))) {
        rc = loom__error_oom();
        goto done;
    }
    if (left < 1)
        left = 1;
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, text);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, left);
    cc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    if (cc == CURLE_ABORTED_BY_CALLBACK)
        rc = loom__error_set(LOOM_ECANCELED, "MCP server '%s': cancelled",
                             server_name(c));
    else if (cc == CURLE_OPERATION_TIMEDOUT)
        rc = loom__error_set(LOOM_ETIMEDOUT,
                             "MCP server '%s': no answer in "
                             "time",
                             server_name(c));
    else if (cc != CURLE_OK)
        rc = loom__error_set(LOOM_EUPSTREAM, "MCP server '%s': %s",
                             server_name(c), curl_easy_strerror(cc));
    else if (status == 404)
        rc = loom__error_set(LOOM_ENOTFOUND,
                             "MCP server '%s': the session expired",
                             server_name(c));
    else if (status < 200 || status > 299)
        rc = loom__error_set(LOOM_EUPSTREAM, "MCP server '%s': HTTP %ld%s%.*s",
                             server_name(c), status, body.len ? ": " : "",
                             ERROR_SHOWN, loom_buf_cstr(&body));

done:
    curl_easy_cleanup(e);
    curl_slist_free_all(h);
    loom_buf_free(&body);
    free(url);
    free(text);
    return rc;
}

static void sse_stop(void *impl)
{
    sse_conn *c = impl;

    if (!c)
        return;
    atomic_store(&c->stopping, 1);
    if (c->reading)
        pthread_join(c->reader, NULL);
    c->reading = 0;
}

static void sse_free(void *impl)
{
    sse_conn *c = impl;

    if (!c)
        return;
    loom_sse_parser_free(c->parser);
    free(c->endpoint);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

const mcp_transport loom__mcp_sse = {"sse",    sse_open, sse_send,
                                     sse_stop, sse_free, NULL};
