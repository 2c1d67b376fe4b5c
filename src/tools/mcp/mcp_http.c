/*
 * The Streamable HTTP transport of the MCP client (2025-11-25): each
 * message is a POST to the server's URL; a request's answer comes back
 * as a JSON body or as an SSE stream that may carry the server's own
 * requests and notifications before the answer. Both are decoded as they
 * arrive and handed to the core; a stream is left once its request has
 * its answer.
 *
 * The session id the server gives with the initialize answer
 * (Mcp-Session-Id) goes on every later POST, with MCP-Protocol-Version;
 * a 404 to a POST that carried one means the session expired, which the
 * core handles by starting a new session (LOOM_ENOTFOUND). Stopping
 * deletes the session (DELETE, best effort).
 *
 * Each POST is its own libcurl easy handle, so parallel calls do not
 * wait for each other; a progress callback aborts one at its deadline or
 * when its cancel flag is set. Header values (tokens) are never logged.
 */
#include "core/clock.h"
#include "core/error.h"
#include "loom/buf.h"
#include "loom/log.h"
#include "loom/sse.h"
#include "tools/mcp/mcp_internal.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define SESSION_MAX 256
#define ERROR_SHOWN 300
#define CONNECT_MS 10000L
#define DELETE_MS 2000L

typedef struct {
    loom_mcp_server *s;
    unsigned gen;
    pthread_mutex_t mu;
    char session[SESSION_MAX + 1]; /* "" when none */
} http_conn;

/* One POST in progress. */
typedef struct {
    http_conn *c;
    mcp_pending *p;
    int64_t deadline;
    loom_cancel *cancel;
    int sse;   /* the answer is an event stream */
    int typed; /* content type seen */
    char type[128];
    loom_buf body; /* a JSON answer */
    loom_sse_parser *parser;
    int aborted; /* by the progress callback: why in rc */
    int rc;
} post_state;

static int http_open(loom_mcp_server *s, unsigned gen, void **impl)
{
    http_conn *c = calloc(1, sizeof(*c));

    *impl = NULL;
    if (!c)
        return loom__error_oom();
    c->s = s;
    c->gen = gen;
    pthread_mutex_init(&c->mu, NULL);
    *impl = c;
    return 0;
}

static void trim(char *v)
{
    size_t n = strlen(v);

    while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' '))
        v[--n] = '\0';
}

static size_t on_header(char *data, size_t size, size_t n, void *arg)
{
    post_state *st = arg;
    size_t len = size * n;
    char line[512];
    const char *v;

    if (len >= sizeof(line))
        return len;
    memcpy(line, data, len);
    line[len] = '\0';
    if (!(v = strchr(line, ':')))
        return len;
    v++;
    while (*v == ' ')
        v++;
    trim((char *)v);
    if (strncasecmp(line, "content-type:", 13) == 0) {
        snprintf(st->type, sizeof(st->type), "%s", v);
    } else if (strncasecmp(line, "mcp-session-id:", 15) == 0 && *v &&
               strlen(v) <= SESSION_MAX) {
        pthread_mutex_lock(&st->c->mu);
        snprintf(st->c->session, sizeof(st->c->session), "%s", v);
        pthread_mutex_unlock(&st->c->mu);
    }
    return len;
}

static void dispatch_text(post_state *st, const char *data, size_t len)
{
    json_error_t err;
    json_t *msg = json_loadb(data, len, JSON_REJECT_DUPLICATES, &err);

    if (!msg) {
        loom_warn("mcp %s: skipped an answer that is not JSON (%zu bytes)",
                  loom__mcp_config(st->c->s)->name, len);
        return;
    }
    loom__mcp_dispatch(st->c->s, st->c->gen, msg);
}

static int on_event(const loom_sse_event *ev, void *arg)
{
    post_state *st = arg;

    if (ev->data_len && strcmp(ev->event, "message") == 0)
        dispatch_text(st, ev->data, ev->data_len);
    return 0;
}

static size_t on_body(char *data, size_t size, size_t n, void *arg)
{
    post_state *st = arg;
    size_t len = size * n;

    if (!st->typed) {
        st->typed = 1;
        st->sse = strncasecmp(st->type, "text/event-stream", 17) == 0;
        if (st->sse && loom_sse_parser_new(&st->parser, NULL, on_event, st))
            return 0;
    }
    if (st->sse) {
        if (loom_sse_parser_feed(st->parser, data, len) != 0)
            return 0;
    } else if (loom_buf_put(&st->body, data, len) != 0) {
        return 0;
    }
    return len;
}

static int on_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut,
                       curl_off_t un)
{
    post_state *st = arg;

    (void)dt;
    (void)dn;
    (void)ut;
    (void)un;
    if (loom_cancel_is_set(st->cancel)) {
        st->rc = LOOM_ECANCELED;
    } else if (loom__mono_ms() >= st->deadline) {
        st->rc = LOOM_ETIMEDOUT;
    } else if (st->sse && st->p && loom__mcp_answered(st->c->s, st->p)) {
        st->rc = 0; /* the answer came; the stream may stay open */
    } else {
        return 0;
    }
    st->aborted = 1;
    return 1;
}

/* The request headers: ours, then the config's. */
static struct curl_slist *headers_for(http_conn *c, const char *method)
{
    const loom_mcp_server_config *cfg = loom__mcp_config(c->s);
    struct curl_slist *h = NULL, *t;
    char line[1024], version[32];
    const char *key;
    const json_t *v;

#define ADD(text)                                                              \
    do {                                                                       \
        if (!(t = curl_slist_append(h, (text)))) {                             \
            curl_slist_free_all(h);                                            \
            return NULL;                                                       \
        }                                                                      \
        h = t;                                                                 \
    } while (0)
    if (strcmp(method, "POST") == 0) {
        ADD("Content-Type: application/json");
        ADD("Accept: application/json, text/event-stream");
    }
    pthread_mutex_lock(&c->mu);
    snprintf(line, sizeof(line), "Mcp-Session-Id: %s", c->session);
    pthread_mutex_unlock(&c->mu);
    if (strlen(line) > strlen("Mcp-Session-Id: "))
        ADD(line);
    loom__mcp_protocol(c->s, version, sizeof(version));
    if (*version) {
        snprintf(line, sizeof(line), "MCP-Protocol-Version: %s", version);
        ADD(line);
    }
    json_object_foreach((json_t *)cfg->headers, key, v)
    {
        if (!json_is_string(v))
            continue;
        if (snprintf(line, sizeof(line), "%s: %s", key, json_string_value(v)) >=
            (int)sizeof(line))
            continue;
        ADD(line);
    }
#undef ADD
    return h;
}

static CURL *easy_for(http_conn *c, post_state *st, struct curl_slist *h,
                      int64_t deadline)
{
    CURL *e = curl_easy_init();
    long left = (long)(deadline - loom__mono_ms());

    if (!e)
        return NULL;
    if (left < 1)
        left = 1;
    curl_easy_setopt(e, CURLOPT_URL, loom__mcp_config(c->s)->url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
                     left < CONNECT_MS ? left : CONNECT_MS);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, st);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, st);
    curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(e, CURLOPT_XFERINFODATA, st);
    curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
    return e;
}

static int http_send(void *impl, const json_t *msg, int64_t deadline,
                     loom_cancel *cancel, mcp_pending *p)
{
    http_conn *c = impl;
    const char *name = loom__mcp_config(c->s)->name;
    post_state st;
    struct curl_slist *h = NULL;
    char *text = json_dumps(msg, JSON_COMPACT);
    int had_session, rc = 0;
    CURL *e = NULL;
    CURLcode cc;
    long status = 0;

    memset(&st, 0, sizeof(st));
    st.c = c;
    st.p = p;
    st.deadline = deadline;
    st.cancel = cancel;
    loom_buf_init(&st.body, LOOM_MCP_MAX_MESSAGE);
    pthread_mutex_lock(&c->mu);
    had_session = c->session[0] != '\0';
    pthread_mutex_unlock(&c->mu);
    if (!text || !(h = headers_for(c, "POST")) ||
        !(e = easy_for(c, &st, h, deadline))) {
        rc = loom__error_oom();
        goto done;
    }
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, text);
    cc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    if (st.aborted && st.rc) {
        rc = loom__error_set(st.rc, "MCP server '%s': %s", name,
                             st.rc == LOOM_ECANCELED ? "cancelled"
                                                     : "no answer in time");
        goto done;
    }
    if (cc != CURLE_OK && !st.aborted) {
        rc = loom__error_set(LOOM_EUPSTREAM, "MCP server '%s': %s", name,
                             curl_easy_strerror(cc));
        goto done;
    }
    if (status == 404 && had_session) {
        pthread_mutex_lock(&c->mu);
        c->session[0] = '\0';
        pthread_mutex_unlock(&c->mu);
        rc = loom__error_set(LOOM_ENOTFOUND,
                             "MCP server '%s': the session "
                             "expired",
                             name);
        goto done;
    }
    if (status < 200 || status > 299) {
        rc = loom__error_set(LOOM_EUPSTREAM, "MCP server '%s': HTTP %ld%s%.*s",
                             name, status, st.body.len ? ": " : "", ERROR_SHOWN,
                             loom_buf_cstr(&st.body));
        goto done;
    }
    if (st.sse)
        loom_sse_parser_finish(st.parser);
    else if (st.body.len)
        dispatch_text(&st, st.body.ptr, st.body.len);
    if (p && !loom__mcp_answered(c->s, p))
        rc = loom__error_set(LOOM_EUPSTREAM,
                             "MCP server '%s': the answer ended without "
                             "the result",
                             name);

done:
    if (e)
        curl_easy_cleanup(e);
    curl_slist_free_all(h);
    loom_sse_parser_free(st.parser);
    loom_buf_free(&st.body);
    free(text);
    return rc;
}

static void http_stop(void *impl)
{
    http_conn *c = impl;
    post_state st;
    struct curl_slist *h;
    CURL *e;

    if (!c || !c->session[0])
        return;
    memset(&st, 0, sizeof(st));
    st.c = c;
    st.deadline = loom__mono_ms() + DELETE_MS;
    loom_buf_init(&st.body, 4096);
    if ((h = headers_for(c, "DELETE")) != NULL &&
        (e = easy_for(c, &st, h, st.deadline)) != NULL) {
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "DELETE");
        curl_easy_perform(e);
        curl_easy_cleanup(e);
    }
    curl_slist_free_all(h);
    loom_sse_parser_free(st.parser);
    loom_buf_free(&st.body);
}

static void http_free(void *impl)
{
    http_conn *c = impl;

    if (!c)
        return;
    pthread_mutex_destroy(&c->mu);
    free(c);
}

const mcp_transport loom__mcp_http = {"http", http_open, http_send, http_stop,
                                      http_free};
