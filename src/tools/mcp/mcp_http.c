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
 * Messages that belong to no request of loom's come on a listener
 * thread's stream: in a session era a GET on the endpoint, in the
 * 2026-07-28 era a subscriptions/listen request (POST) whose answer is
 * a stream that stays open. Either is opened again when it ends and
 * closed by http_stop.
 *
 * Each POST is its own libcurl easy handle, so parallel calls do not
 * wait for each other; a check every TICK_MS aborts one at its deadline
 * or when its cancel flag is set. Header values (tokens) are never
 * logged.
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
#include <strings.h>
#include <time.h>

#define SESSION_MAX 256
#define ERROR_SHOWN 300
#define CONNECT_MS 10000L
#define DELETE_MS 2000L
/* How often a POST in flight checks its cancel flag and deadline. */
#define TICK_MS 20

typedef struct {
    loom_mcp_server *s;
    unsigned gen;
    pthread_mutex_t mu;
    char session[SESSION_MAX + 1]; /* "" when none */
    int listening;                 /* the listener thread was started */
    int listen_ready;              /* its first GET was answered or failed */
    pthread_cond_t cv;             /* listen_ready changed */
    atomic_int stopping;           /* http_stop: the listener ends */
    pthread_t listener;
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
    char last_id[SESSION_MAX + 1]; /* the stream's last event id, "" if none */
    long retry;                    /* its last retry: value, -1 if none */
    int listener;                  /* the listener's GET: ends at http_stop */
    json_int_t listen_id; /* the subscriptions/listen request's id, or 0 */
    int events;           /* messages of the stream besides its answer */
    int resumed;          /* a subscription opened again */
    int refused;          /* the subscription was answered with an error */
    int aborted;                   /* by the progress callback: why in rc */
    int rc;
    char www[1024];    /* the answer's WWW-Authenticate, "" if none */
    char bearer[8192]; /* the Authorization sent, "" if none */
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
    pthread_cond_init(&c->cv, NULL);
    *impl = c;
    return 0;
}

static void trim(char *v)
{
    size_t n = strlen(v);

    while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' '))
        v[--n] = '\0';
}

/* The listener's first GET has its answer (or failed): start_listener
 * may return. */
static void listen_ready(http_conn *c)
{
    pthread_mutex_lock(&c->mu);
    c->listen_ready = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static size_t on_header(char *data, size_t size, size_t n, void *arg)
{
    post_state *st = arg;
    size_t len = size * n;
    char line[512];
    const char *v;

    if (st->listener && (len == 2 || len == 1) &&
        (*data == '\r' || *data == '\n'))
        listen_ready(st->c);
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
    } else if (strncasecmp(line, "www-authenticate:", 17) == 0 &&
               (!st->www[0] || strncasecmp(v, "Bearer", 6) == 0)) {
        snprintf(st->www, sizeof(st->www), "%s", v);
    } else if (strncasecmp(line, "mcp-session-id:", 15) == 0 && *v &&
               strlen(v) <= SESSION_MAX) {
        pthread_mutex_lock(&st->c->mu);
        snprintf(st->c->session, sizeof(st->c->session), "%s", v);
        pthread_mutex_unlock(&st->c->mu);
    }
    return len;
}

/*
 * A message that came on st's stream (or as its JSON body) goes to the
 * core. On a subscription, the answer to subscriptions/listen itself is
 * kept here (an error: refused; a result: it ended), and the first
 * message of one opened again marks the tool list stale, since a change
 * may have come while it was closed.
 */
static void dispatch_text(post_state *st, const char *data, size_t len)
{
    const char *name = loom__mcp_config(st->c->s)->name;
    json_error_t err;
    json_t *msg = json_loadb(data, len, JSON_REJECT_DUPLICATES, &err);
    const json_t *id = json_object_get(msg, "id");

    if (!msg) {
        loom_warn("mcp %s: skipped an answer that is not JSON (%zu bytes)",
                  name, len);
        return;
    }
    if (st->listen_id && json_is_integer(id) &&
        json_integer_value(id) == st->listen_id &&
        !json_object_get(msg, "method")) {
        const json_t *e = json_object_get(msg, "error");
        if (e) {
            st->refused = 1;
            loom__mcp_listen_refused(st->c->s, e);
        }
        json_decref(msg);
        return;
    }
    if (st->resumed && st->events == 0)
        loom__mcp_list_stale(st->c->s);
    st->events++;
    loom__mcp_dispatch(st->c->s, st->c->gen, msg);
}

static int on_event(const loom_sse_event *ev, void *arg)
{
    post_state *st = arg;

    if (strlen(ev->id) <= SESSION_MAX)
        snprintf(st->last_id, sizeof(st->last_id), "%s", ev->id);
    if (ev->retry >= 0)
        st->retry = ev->retry;
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
    if (loom_cancel_is_set(st->cancel) ||
        (st->listener && atomic_load(&st->c->stopping))) {
        st->rc = LOOM_ECANCELED;
    } else if (loom__mono_ms() >=
               (st->p ? loom__mcp_deadline(st->c->s, st->p) : st->deadline)) {
        st->rc = LOOM_ETIMEDOUT;
    } else if (st->sse && st->p && loom__mcp_answered(st->c->s, st->p)) {
        st->rc = 0; /* the answer came; the stream may stay open */
    } else {
        return 0;
    }
    st->aborted = 1;
    return 1;
}

/*
 * Runs e as curl_easy_perform does, but in a multi handle polled every
 * TICK_MS, checking what on_progress checks at each tick: curl calls
 * that only about once a second on a quiet stream, and a cancelled call
 * must stop (and tell the server) before its run gives up on it.
 */
static CURLcode perform(CURL *e, post_state *st)
{
    CURLM *m = curl_multi_init();
    CURLcode res = CURLE_OK;
    CURLMsg *msg;
    int running = 1, left;

    if (!m || curl_multi_add_handle(m, e) != CURLM_OK) {
        if (m)
            curl_multi_cleanup(m);
        return curl_easy_perform(e);
    }
    for (;;) {
        if (curl_multi_perform(m, &running) != CURLM_OK) {
            res = CURLE_RECV_ERROR;
            break;
        }
        while ((msg = curl_multi_info_read(m, &left)) != NULL)
            if (msg->msg == CURLMSG_DONE) {
                res = msg->data.result;
                running = 0;
            }
        if (!running)
            break;
        if (on_progress(st, 0, 0, 0, 0)) {
            res = CURLE_ABORTED_BY_CALLBACK;
            break;
        }
        if (curl_multi_poll(m, NULL, 0, TICK_MS, NULL) != CURLM_OK) {
            res = CURLE_RECV_ERROR;
            break;
        }
    }
    curl_multi_remove_handle(m, e);
    curl_multi_cleanup(m);
    return res;
}

struct curl_slist *loom__mcp_curl_headers(struct curl_slist *h, const json_t *o)
{
    struct curl_slist *t;
    char line[8300];
    const char *key;
    const json_t *v;

    json_object_foreach((json_t *)o, key, v)
    {
        if (!json_is_string(v) || strpbrk(json_string_value(v), "\r\n") ||
            strstr(json_string_value(v), "${user."))
            continue;
        /* curl drops "Name: " with nothing after it; "Name;" sends it. */
        if ((*json_string_value(v) ? snprintf(line, sizeof(line), "%s: %s", key,
                                              json_string_value(v))
                                   : snprintf(line, sizeof(line), "%s;",
                                              key)) >= (int)sizeof(line))
            continue;
        if (!(t = curl_slist_append(h, line))) {
            curl_slist_free_all(h);
            return NULL;
        }
        h = t;
    }
    return h;
}

/* Whether headers (name -> value) has name, whatever its case. */
static int has_header(const json_t *headers, const char *name)
{
    const char *key;
    const json_t *v;

    json_object_foreach((json_t *)headers, key, v)
    {
        if (strcasecmp(key, name) == 0)
            return 1;
    }
    return 0;
}

/*
 * The request headers: ours, those msg needs in its era (Mcp-Method,
 * ...; msg NULL for none), then the config's. last_id: for a GET that
 * resumes a stream, its Last-Event-ID ("" for none). bearer: the
 * OAuth Authorization value ("" or NULL for none), left out when the
 * config gives an Authorization header of its own. own: the call's own
 * headers (a user's, resolved: loom_mcp_call_options.headers), or NULL.
 */
static struct curl_slist *headers_for(http_conn *c, const char *method,
                                      const json_t *msg, const char *last_id,
                                      const char *bearer, const json_t *own)
{
    const loom_mcp_server_config *cfg = loom__mcp_config(c->s);
    struct curl_slist *h = NULL, *t;
    char line[8300], version[32];
    json_t *extra;

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
    } else if (strcmp(method, "GET") == 0) {
        ADD("Accept: text/event-stream");
    }
    if (last_id && *last_id) {
        snprintf(line, sizeof(line), "Last-Event-ID: %s", last_id);
        ADD(line);
    }
    pthread_mutex_lock(&c->mu);
    snprintf(line, sizeof(line), "Mcp-Session-Id: %s", c->session);
    pthread_mutex_unlock(&c->mu);
    if (strlen(line) > strlen("Mcp-Session-Id: "))
        ADD(line);
    if (bearer && *bearer && !has_header(cfg->headers, "Authorization") &&
        !has_header(own, "Authorization")) {
        snprintf(line, sizeof(line), "Authorization: %s", bearer);
        ADD(line);
    }
    loom__mcp_protocol(c->s, version, sizeof(version));
    if (*version) {
        snprintf(line, sizeof(line), "MCP-Protocol-Version: %s", version);
        ADD(line);
    }
#undef ADD
    if (msg) {
        if (!(extra = loom__mcp_request_headers(c->s, msg))) {
            curl_slist_free_all(h);
            return NULL;
        }
        h = loom__mcp_curl_headers(h, extra);
        json_decref(extra);
        if (!h)
            return NULL;
    }
    if (own && !(h = loom__mcp_curl_headers(h, own)))
        return NULL;
    return loom__mcp_curl_headers(h, cfg->headers);
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

/*
 * Waits ms (a stream's retry:) before resuming, or until deadline or
 * cancel. 0, or LOOM_ETIMEDOUT / LOOM_ECANCELED.
 */
static int wait_retry(http_conn *c, long ms, int64_t deadline,
                      loom_cancel *cancel)
{
    int64_t until = loom__mono_ms() + ms;

    for (;;) {
        int64_t now = loom__mono_ms(), nap = until - now;
        struct timespec ts;

        if (loom_cancel_is_set(cancel) || atomic_load(&c->stopping))
            return LOOM_ECANCELED;
        if (now >= deadline)
            return LOOM_ETIMEDOUT;
        if (nap <= 0)
            return 0;
        if (nap > 50)
            nap = 50;
        ts.tv_sec = (time_t)(nap / 1000);
        ts.tv_nsec = (long)(nap % 1000) * 1000000L;
        nanosleep(&ts, NULL);
    }
}

/* Readies st for another exchange: a new answer, body and stream. */
static void reset_answer(post_state *st)
{
    loom_sse_parser_free(st->parser);
    st->parser = NULL;
    st->typed = st->sse = st->aborted = 0;
    st->type[0] = '\0';
    loom_buf_clear(&st->body);
}

/*
 * One exchange: a POST of text (or, text NULL, a GET that resumes the
 * stream after st->last_id). Its status in *status. Returns 0 or the
 * error (the message set).
 */
static int exchange(http_conn *c, post_state *st, const json_t *msg,
                    const char *text, long *status)
{
    const char *name = loom__mcp_config(c->s)->name;
    struct curl_slist *h;
    CURL *e = NULL;
    CURLcode cc;
    int rc = 0;

    *status = 0;
    st->www[0] = '\0';
    if (loom__mcp_oauth(c->s))
        loom__mcp_oauth_bearer(loom__mcp_oauth(c->s), st->deadline, st->bearer,
                               sizeof(st->bearer));
    if (!(h = headers_for(c, text ? "POST" : "GET", msg,
                          text ? NULL : st->last_id, st->bearer,
                          loom__mcp_call_headers(st->p))) ||
        !(e = easy_for(c, st, h, st->deadline))) {
        curl_slist_free_all(h);
        return loom__error_oom();
    }
    if (text)
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, text);
    cc = perform(e, st);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, status);
    if (st->aborted && st->rc)
        rc = loom__error_set(st->rc, "MCP server '%s': %s", name,
                             st->rc == LOOM_ECANCELED ? "cancelled"
                                                      : "no answer in time");
    else if (cc != CURLE_OK && !st->aborted)
        rc = loom__error_set(LOOM_EUPSTREAM, "MCP server '%s': %s", name,
                             curl_easy_strerror(cc));
    curl_easy_cleanup(e);
    curl_slist_free_all(h);
    return rc;
}

/* Whether a JSON body holds a JSON-RPC error answer (with an id). */
static int error_answer(const loom_buf *body)
{
    json_t *m = json_loadb(body->ptr, body->len, 0, NULL);
    int yes = json_is_object(json_object_get(m, "error")) &&
              json_object_get(m, "id") &&
              !json_is_null(json_object_get(m, "id"));

    json_decref(m);
    return yes;
}

/* How long the listener waits before it opens its stream again when the
 * stream gave no retry:, and the most it waits after failures. */
#define LISTEN_RETRY_MS 1000L
#define LISTEN_FAILURES 5
/* How long the first request after the handshake waits for the
 * listener's stream to open, so the server has it before that request. */
#define LISTEN_READY_S 2

/*
 * The listener (2025-11-25 and older): a GET on the endpoint that the
 * server may keep open to send requests and notifications that belong to
 * no request of loom's (an elicitation, list_changed). A server that
 * does not offer one (405, or any refusal) is left alone; a stream that
 * ends is opened again after its retry: with Last-Event-ID. Ends at
 * http_stop.
 */
static void *listen_main(void *arg)
{
    http_conn *c = arg;
    post_state st;
    int failed = 0;

    memset(&st, 0, sizeof(st));
    st.c = c;
    st.listener = 1;
    st.deadline = INT64_MAX;
    st.retry = -1;
    loom_buf_init(&st.body, 1 << 20);
    while (!atomic_load(&c->stopping) && failed < LISTEN_FAILURES) {
        long status = 0;
        reset_answer(&st);
        int rc = exchange(c, &st, NULL, NULL, &status);
        listen_ready(c);
        if (rc != 0 && atomic_load(&c->stopping))
            break;
        if (status < 200 || status > 299 || !st.sse)
            break;
        loom_sse_parser_finish(st.parser);
        failed = st.last_id[0] ? 0 : failed + 1;
        if (wait_retry(c, st.retry >= 0 ? st.retry : LISTEN_RETRY_MS, INT64_MAX,
                       NULL) != 0)
            break;
    }
    loom_sse_parser_free(st.parser);
    loom_buf_free(&st.body);
    return NULL;
}

/* Starts fn as the connection's listener thread, once, and waits (a
 * little) for its stream to be open. */
static void start_thread(http_conn *c, void *(*fn)(void *))
{
    pthread_mutex_lock(&c->mu);
    if (!c->listening && pthread_create(&c->listener, NULL, fn, c) == 0) {
        struct timespec ts;
        c->listening = 1;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += LISTEN_READY_S;
        while (!c->listen_ready &&
               pthread_cond_timedwait(&c->cv, &c->mu, &ts) == 0)
            ;
    }
    pthread_mutex_unlock(&c->mu);
}

/* Starts the listener once, after the handshake (a session era only). */
static void start_listener(http_conn *c, const json_t *msg)
{
    const char *method = json_string_value(json_object_get(msg, "method"));
    char version[32];

    loom__mcp_protocol(c->s, version, sizeof(version));
    if (!method || strcmp(method, "notifications/initialized") != 0 ||
        strcmp(version, LOOM_MCP_PROTOCOL_STATELESS) == 0)
        return;
    start_thread(c, listen_main);
}

/* The subscription's waits: after a stream that ended, its retry: (else
 * LISTEN_RETRY_MS), never less than SUBSCRIBE_MIN_MS; after attempts
 * that opened nothing, doubling up to SUBSCRIBE_MAX_MS; it gives up
 * after SUBSCRIBE_FAILURES of those in a row. */
#define SUBSCRIBE_MIN_MS 250L
#define SUBSCRIBE_MAX_MS 30000L
#define SUBSCRIBE_FAILURES 8

/* Whether an HTTP status refuses the subscription for good (a client
 * error that trying again will not mend). */
static int refusal(long status)
{
    return status >= 400 && status <= 499 && status != 401 && status != 403 &&
           status != 408 && status != 429;
}

/*
 * The subscription (2026-07-28): a subscriptions/listen request for
 * toolsListChanged whose answer is an event stream that stays open; the
 * notifications on it are dispatched like any. A stream that ends (the
 * server's result, or a closed connection) is opened again with a new
 * request, and the tool list is then marked stale; a refusal (a JSON-RPC
 * error, a client error status, an answer that is no stream) ends it.
 * Ends at http_stop.
 */
static void *subscribe_main(void *arg)
{
    http_conn *c = arg;
    const char *name = loom__mcp_config(c->s)->name;
    post_state st;
    int failures = 0, opened = 0;

    memset(&st, 0, sizeof(st));
    st.c = c;
    st.listener = 1;
    st.deadline = INT64_MAX;
    loom_buf_init(&st.body, 1 << 20);
    while (!atomic_load(&c->stopping)) {
        json_t *msg = loom__mcp_listen_request(c->s);
        char *text = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
        long status = 0, wait;
        int rc = LOOM_ENOMEM;

        reset_answer(&st);
        st.retry = -1;
        st.events = st.refused = 0;
        st.resumed = opened;
        st.listen_id = json_integer_value(json_object_get(msg, "id"));
        if (text)
            rc = exchange(c, &st, msg, text, &status);
        json_decref(msg);
        free(text);
        listen_ready(c);
        if (atomic_load(&c->stopping))
            break;
        if (st.sse)
            loom_sse_parser_finish(st.parser);
        else if (rc == 0 && st.body.len)
            dispatch_text(&st, st.body.ptr, st.body.len);
        if (st.refused || refusal(status) ||
            (rc == 0 && status >= 200 && status <= 299 && !st.sse)) {
            if (!st.refused)
                loom_info("mcp %s: no subscriptions/listen stream (HTTP %ld): "
                          "its list changes are not followed",
                          name, status);
            break;
        }
        if (st.events) {
            opened = 1;
            failures = 0;
        } else if (++failures >= SUBSCRIBE_FAILURES) {
            loom_warn("mcp %s: subscriptions/listen failed %d times in a "
                      "row: its list changes are not followed",
                      name, failures);
            break;
        }
        wait = st.retry >= 0 ? st.retry : LISTEN_RETRY_MS;
        if (failures && (LISTEN_RETRY_MS << (failures - 1)) > wait)
            wait = LISTEN_RETRY_MS << (failures - 1);
        wait = wait < SUBSCRIBE_MIN_MS   ? SUBSCRIBE_MIN_MS
               : wait > SUBSCRIBE_MAX_MS ? SUBSCRIBE_MAX_MS
                                         : wait;
        loom_debug("mcp %s: subscriptions/listen ended; opening it again in "
                   "%ld ms",
                   name, wait);
        if (wait_retry(c, wait, INT64_MAX, NULL) != 0)
            break;
    }
    loom_sse_parser_free(st.parser);
    loom_buf_free(&st.body);
    return NULL;
}

static void http_listen(void *impl)
{
    start_thread(impl, subscribe_main);
}

/*
 * An answer of 401, or 403 insufficient_scope, to the exchange of st:
 * the OAuth client authorizes (mcp_oauth.c) and the exchange is made
 * again with the new token, as long as it gets one. 0 with the last
 * answer in st and *status, or the error of a failed authorization.
 */
static int authorized(http_conn *c, post_state *st, const json_t *msg,
                      const char *text, long *status)
{
    mcp_oauth *o = loom__mcp_oauth(c->s);
    int rc;

    while (o && (*status == 401 || *status == 403)) {
        int64_t before = st->deadline;
        rc = loom__mcp_oauth_challenge(o, *status, st->www, st->bearer,
                                       &st->deadline);
        if (st->p && st->deadline > before)
            loom__mcp_defer(c->s, st->p, st->deadline - before);
        if (rc <= 0)
            return rc;
        reset_answer(st);
        if ((rc = exchange(c, st, msg, text, status)) != 0)
            return rc;
    }
    if (o && st->bearer[0] && *status >= 200 && *status <= 299)
        loom__mcp_oauth_accepted(o);
    return 0;
}

/*
 * Sends msg. A request whose answer comes as an event stream that ends
 * before the answer is resumed, as the 2025-11-25 transport says: after
 * the stream's retry: (1 s when it gave none), a GET with Last-Event-ID
 * takes the stream up again, as long as the stream gave event ids.
 */
static int http_send(void *impl, const json_t *msg, int64_t deadline,
                     loom_cancel *cancel, mcp_pending *p)
{
    http_conn *c = impl;
    const char *name = loom__mcp_config(c->s)->name;
    post_state st;
    char *text = json_dumps(msg, JSON_COMPACT);
    int had_session, rc = 0;
    long status = 0;

    memset(&st, 0, sizeof(st));
    st.c = c;
    st.p = p;
    st.deadline = deadline;
    st.cancel = cancel;
    st.retry = -1;
    loom_buf_init(&st.body, LOOM_MCP_MAX_MESSAGE);
    pthread_mutex_lock(&c->mu);
    had_session = c->session[0] != '\0';
    pthread_mutex_unlock(&c->mu);
    if (!text) {
        rc = loom__error_oom();
        goto done;
    }
    if ((rc = exchange(c, &st, msg, text, &status)) != 0 ||
        (rc = authorized(c, &st, msg, text, &status)) != 0)
        goto done;
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
    if ((status < 200 || status > 299) &&
        !(p && !st.sse && error_answer(&st.body))) {
        rc = loom__error_set(LOOM_EUPSTREAM, "MCP server '%s': HTTP %ld%s%.*s",
                             name, status, st.body.len ? ": " : "", ERROR_SHOWN,
                             loom_buf_cstr(&st.body));
        goto done;
    }
    if (st.sse)
        loom_sse_parser_finish(st.parser);
    else if (st.body.len)
        dispatch_text(&st, st.body.ptr, st.body.len);
    start_listener(c, msg);
    while (p && st.sse && st.last_id[0] && !loom__mcp_answered(c->s, p)) {
        if ((rc = wait_retry(c, st.retry >= 0 ? st.retry : 1000, deadline,
                             cancel)) != 0) {
            rc = loom__error_set(rc, "MCP server '%s': %s", name,
                                 rc == LOOM_ECANCELED ? "cancelled"
                                                      : "no answer in time");
            goto done;
        }
        loom_info("mcp %s: the answer's stream ended early; resuming it "
                  "after event %.40s",
                  name, st.last_id);
        reset_answer(&st);
        if ((rc = exchange(c, &st, NULL, NULL, &status)) != 0)
            goto done;
        if (status < 200 || status > 299 || !st.sse)
            break;
        loom_sse_parser_finish(st.parser);
    }
    if (p && !loom__mcp_answered(c->s, p))
        rc = loom__error_set(LOOM_EUPSTREAM,
                             "MCP server '%s': the answer ended without "
                             "the result",
                             name);

done:
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

    if (!c)
        return;
    atomic_store(&c->stopping, 1);
    if (c->listening)
        pthread_join(c->listener, NULL);
    c->listening = 0;
    if (!c->session[0])
        return;
    memset(&st, 0, sizeof(st));
    st.c = c;
    st.deadline = loom__mono_ms() + DELETE_MS;
    loom_buf_init(&st.body, 4096);
    if (loom__mcp_oauth(c->s))
        loom__mcp_oauth_bearer(loom__mcp_oauth(c->s), st.deadline, st.bearer,
                               sizeof(st.bearer));
    if ((h = headers_for(c, "DELETE", NULL, NULL, st.bearer, NULL)) != NULL &&
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
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

const mcp_transport loom__mcp_http = {"http",    http_open, http_send,
                                      http_stop, http_free, http_listen};
