/*
 * The internal HTTP client (see core/http.h for the contract).
 *
 * libcurl does the protocol work. What lives here is what it lacks for
 * model APIs: a first-byte timeout and an idle timeout measured on body
 * bytes (CURLOPT_LOW_SPEED_* is too coarse and CURLOPT_TIMEOUT would cut a
 * long but healthy stream), cancellation through a shared flag, a cap on
 * the error bodies kept in memory, and typed failures. The transfer runs
 * in a curl_multi_poll loop with a LOOM_HTTP_TICK_MS tick: each tick checks
 * the cancel flag and the timers, so both act within one tick.
 *
 * A pool keeps idle (easy, multi) pairs, newest first. The multi handle
 * owns the connection cache, so reusing the pair reuses its keep-alive
 * connection; the CURLSH shares only the DNS and TLS session caches
 * (libcurl does not support sharing the connection cache itself between
 * concurrent threads).
 *
 * A pair also remembers what its easy handle was set up for (URL, method,
 * connect timeout, header lines): a request that asks for the same, the
 * usual case of one provider calling one endpoint, only sets its body,
 * instead of resetting the handle and setting every option and header
 * list again. The URL is handed over parsed (set_url), so that libcurl
 * does not parse it again for each transfer. The transfer state and
 * error buffer the callbacks point to live in the pair, so those pointers
 * stay valid between requests.
 *
 * On a fiber (core/fiber.h) the transfer joins the curl multi handle of
 * the fiber's worker instead of polling its own, and the fiber parks until
 * there is something to do: the worker's event loop drives every transfer
 * of its fibers from one epoll. The write callback then runs in the
 * worker's loop, not on the fiber, so it only copies the bytes into the
 * transfer's inbox (pausing the transfer past INBOX_MAX) and wakes the
 * fiber, which hands them to on_body itself: the caller's callback runs on
 * its own fiber, where it may wait. The timers and the cancel flag are
 * checked each time the fiber wakes: the timeouts have exact timers, and
 * setting the cancel flag wakes the fiber at once (loom_cancel_set), so
 * a worker holding thousands of streams is not woken periodically for
 * each; FIBER_TICK_MS is only a backstop. A cancelled transfer leaves the
 * multi handle at once, which closes its connection. Off a fiber (the
 * CLI, embedders, tests) a call runs its own loop as before.
 */
#include "core/http.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/fiber.h"

#include <ctype.h>
#include <curl/curl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* Idle pairs kept per pool (a provider); more concurrent calls make and
 * drop extras. A new pair costs a curl_easy_init (about 14k instructions),
 * a reset and every option and header line set again, so the bound
 * covers the model calls a server has in flight at a few hundred
 * requests at once (with 8, four in ten calls at 64 concurrent requests
 * made a new pair). An idle pair holds its easy handle and its 2 KiB
 * receive buffer, about 14 KiB: 1 MiB per provider at most. Connections
 * are not kept here (the multi handles keep them). */
#define POOL_MAX_IDLE 64
/* libcurl's receive buffer per transfer (CURLOPT_BUFFERSIZE). loom
 * always calls models streamed, and a stream's chunk is a few hundred
 * bytes; libcurl allocates one byte more than this, so 2047 is a 2 KiB
 * allocation (4096 took mimalloc's 5 KiB class): about 2 KB less per
 * open stream at 9,900 streams (bench/serve/README.md, round seven). */
#define HTTP_RECV_BUFFER 2047
/* Body bytes a fiber's transfer holds before it pauses until they are
 * handed on. */
#define INBOX_MAX ((size_t)256 << 10)
/* The longest a fiber's transfer parks without looking at its timers and
 * cancel flag, though both wake it when due. */
#define FIBER_TICK_MS 30000

/* State of one transfer, shared with the curl callbacks. */
typedef struct {
    const loom__http_request *req;
    loom__http_response *resp;
    CURL *easy;
    long long sent_at;      /* request about to go out; 0: not yet */
    long long last_byte_at; /* last body byte */
    int body_started;
    int status_known;
    int cb_rc;     /* on_body's return, or our own abort reason */
    int error_cut; /* stopped reading an error body at its limit */
    size_t max_error_body;
    size_t max_body;
    /* On a fiber: bytes that arrived, not yet handed on, and whether the
     * transfer paused because there were too many. */
    loom__fiber_xfer x;
    int on_fiber;
    loom_buf inbox;
    loom_buf handing; /* what drain() is handing on */
    int paused;
} transfer;

typedef struct pair {
    CURL *easy;
    CURLM *multi;
    struct pair *next;
    transfer t; /* the current transfer; the callbacks point here */
    char errbuf[CURL_ERROR_SIZE];
    /* What easy is set up for (valid while ready): the header list curl
     * holds, and url, method and the header lines, NUL-separated, in sig,
     * with the connect timeout and whether it posts. */
    int ready;
    struct curl_slist *hdrs;
    CURLU *url; /* the URL, parsed once (see set_url) */
    loom_buf sig;
    size_t nheaders;
    long connect_ms;
    int post;
} pair;

struct loom__http_pool {
    pthread_mutex_t lock;
    pair *idle;
    size_t idle_len;
    CURLSH *share;
    pthread_mutex_t share_locks[CURL_LOCK_DATA_LAST];
    /* The last URL a new pair parsed, and its text (under lock). */
    CURLU *url;
    char *url_text;
};

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc = CURLE_FAILED_INIT;

static void global_init(void)
{
    global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access,
                       void *userptr)
{
    loom__http_pool *pool = userptr;

    (void)h;
    (void)access;
    if ((unsigned)data < CURL_LOCK_DATA_LAST)
        pthread_mutex_lock(&pool->share_locks[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *userptr)
{
    loom__http_pool *pool = userptr;

    (void)h;
    if ((unsigned)data < CURL_LOCK_DATA_LAST)
        pthread_mutex_unlock(&pool->share_locks[data]);
}

int loom__http_pool_new(loom__http_pool **out)
{
    loom__http_pool *pool;

    *out = NULL;
    pthread_once(&global_once, global_init);
    if (global_rc != CURLE_OK)
        return loom__error_set(LOOM_ERROR, "libcurl failed to start: %s",
                               curl_easy_strerror(global_rc));
    pool = calloc(1, sizeof(*pool));
    if (!pool)
        return loom__error_oom();
    pthread_mutex_init(&pool->lock, NULL);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_init(&pool->share_locks[i], NULL);
    pool->share = curl_share_init();
    if (!pool->share) {
        loom__http_pool_free(pool);
        return loom__error_oom();
    }
    curl_share_setopt(pool->share, CURLSHOPT_LOCKFUNC, share_lock);
    curl_share_setopt(pool->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
    curl_share_setopt(pool->share, CURLSHOPT_USERDATA, pool);
    curl_share_setopt(pool->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    curl_share_setopt(pool->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    *out = pool;
    return 0;
}

static void pair_free(pair *pr)
{
    if (!pr)
        return;
    if (pr->multi)
        curl_multi_cleanup(pr->multi);
    if (pr->easy)
        curl_easy_cleanup(pr->easy);
    curl_slist_free_all(pr->hdrs);
    curl_url_cleanup(pr->url);
    loom_buf_free(&pr->sig);
    free(pr);
}

void loom__http_pool_free(loom__http_pool *pool)
{
    if (!pool)
        return;
    while (pool->idle) {
        pair *pr = pool->idle;
        pool->idle = pr->next;
        pair_free(pr);
    }
    /* Every easy handle is gone, so the share is no longer in use. */
    if (pool->share)
        curl_share_cleanup(pool->share);
    curl_url_cleanup(pool->url);
    free(pool->url_text);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_destroy(&pool->share_locks[i]);
    pthread_mutex_destroy(&pool->lock);
    free(pool);
}

static pair *pool_take(loom__http_pool *pool)
{
    pair *pr;

    pthread_mutex_lock(&pool->lock);
    pr = pool->idle;
    if (pr) {
        pool->idle = pr->next;
        pool->idle_len--;
    }
    pthread_mutex_unlock(&pool->lock);
    if (pr) {
        pr->next = NULL;
        return pr;
    }
    pr = calloc(1, sizeof(*pr));
    if (!pr)
        return NULL;
    loom_buf_init(&pr->sig, LOOM_BUF_UNLIMITED);
    /* The multi handle is made on first use off a fiber (on one, the
     * worker's serves). */
    pr->easy = curl_easy_init();
    if (!pr->easy) {
        pair_free(pr);
        return NULL;
    }
    /* curl_easy_reset() keeps the share, so it is set once. */
    curl_easy_setopt(pr->easy, CURLOPT_SHARE, pool->share);
    return pr;
}

static void pool_give(loom__http_pool *pool, pair *pr)
{
    pthread_mutex_lock(&pool->lock);
    if (pool->idle_len < POOL_MAX_IDLE) {
        pr->next = pool->idle;
        pool->idle = pr;
        pool->idle_len++;
        pr = NULL;
    }
    pthread_mutex_unlock(&pool->lock);
    pair_free(pr);
}

void loom__http_response_clear(loom__http_response *resp)
{
    free(resp->request_id);
    free(resp->retry_after);
    free(resp->retry_after_ms);
    free(resp->content_type);
    free(resp->rate);
    loom_buf_free(&resp->body);
    memset(resp, 0, sizeof(*resp));
}

/* Copies a header value, cut at LOOM_HTTP_MAX_HEADER. NULL on OOM. */
static void keep_header(char **dst, const char *v, size_t len)
{
    if (len > LOOM_HTTP_MAX_HEADER)
        len = LOOM_HTTP_MAX_HEADER;
    free(*dst);
    *dst = strndup(v, len);
}

static int name_is(const char *data, size_t nlen, const char *name)
{
    return strlen(name) == nlen && strncasecmp(data, name, nlen) == 0;
}

/* Keeps a header to pass on (checked by loom__text_is_rate_header), its
 * name in lower case, while there is room (and memory: a header that
 * cannot be kept is left out, as past the limit). */
static void keep_rate(loom__http_response *r, const char *name, size_t nlen,
                      const char *v, size_t vlen)
{
    loom__http_rate_header *h;
    size_t i;

    if (r->rate_len == LOOM__RATE_HEADERS_MAX)
        return;
    h = realloc(r->rate, (r->rate_len + 1) * sizeof(*h));
    if (!h)
        return;
    r->rate = h;
    h += r->rate_len;
    for (i = 0; i < nlen; i++)
        h->name[i] = (char)tolower((unsigned char)name[i]);
    h->name[i] = '\0';
    memcpy(h->value, v, vlen);
    h->value[vlen] = '\0';
    r->rate_len++;
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *ud)
{
    transfer *t = ud;
    loom__http_response *r = t->resp;
    size_t len = size * nmemb, nlen;
    const char *colon, *v, *end;

    /* A new status line (after 100 Continue or a proxy CONNECT) starts a
     * new header block: forget the headers of the previous one. */
    if (len >= 5 && memcmp(data, "HTTP/", 5) == 0) {
        free(r->request_id);
        free(r->retry_after);
        free(r->retry_after_ms);
        free(r->content_type);
        r->request_id = r->retry_after = r->retry_after_ms = NULL;
        r->content_type = NULL;
        r->rate_len = 0;
        return len;
    }
    colon = memchr(data, ':', len);
    if (!colon)
        return len;
    nlen = (size_t)(colon - data);
    v = colon + 1;
    end = data + len;
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ' ||
                       end[-1] == '\t'))
        end--;
    if (loom__text_is_rate_header(data, nlen, v, (size_t)(end - v)))
        keep_rate(r, data, nlen, v, (size_t)(end - v));
    if (name_is(data, nlen, "x-request-id") ||
        (name_is(data, nlen, "request-id") && !r->request_id))
        keep_header(&r->request_id, v, (size_t)(end - v));
    else if (name_is(data, nlen, "retry-after"))
        keep_header(&r->retry_after, v, (size_t)(end - v));
    else if (name_is(data, nlen, "retry-after-ms"))
        keep_header(&r->retry_after_ms, v, (size_t)(end - v));
    else if (name_is(data, nlen, "content-type"))
        keep_header(&r->content_type, v, (size_t)(end - v));
    return len;
}

static int is_2xx(long status)
{
    return status >= 200 && status < 300;
}

/* Hands len body bytes on (on_body, the kept body or the error body):
 * len, or less to end the transfer. */
static size_t deliver(transfer *t, const char *data, size_t len)
{
    loom__http_response *r = t->resp;
    int rc;

    r->body_bytes += len;
    if (is_2xx(r->status) && t->req->on_body) {
        rc = t->req->on_body(data, len, t->req->payload);
        if (rc) {
            t->cb_rc = rc;
            return len ? 0 : 1;
        }
        return len;
    }
    if (is_2xx(r->status)) {
        if (r->body.len + len > t->max_body)
            t->cb_rc = loom__error_set(LOOM_ETOOLARGE,
                                       "response body larger than %zu "
                                       "bytes",
                                       t->max_body);
        else if (loom_buf_put(&r->body, data, len) != 0)
            t->cb_rc = LOOM_ENOMEM;
        else
            return len;
        return len ? 0 : 1;
    }
    /* An error body: keep the head, then stop reading (an endless error
     * body must not pin the call). */
    if (r->body.len + len > t->max_error_body) {
        loom_buf_put(&r->body, data, t->max_error_body - r->body.len);
        r->body_truncated = 1;
        t->error_cut = 1;
        return len ? 0 : 1;
    }
    if (loom_buf_put(&r->body, data, len) != 0) {
        t->cb_rc = LOOM_ENOMEM;
        return len ? 0 : 1;
    }
    return len;
}

static size_t on_write(char *data, size_t size, size_t nmemb, void *ud)
{
    transfer *t = ud;
    size_t len = size * nmemb;

    t->last_byte_at = loom__mono_ms();
    t->body_started = 1;
    if (!t->status_known) {
        curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &t->resp->status);
        t->status_known = 1;
    }
    if (!t->on_fiber)
        return deliver(t, data, len);
    if (t->inbox.len + len > INBOX_MAX && t->inbox.len > 0) {
        t->paused = 1;
        loom__fiber_wake(t->x.fiber, t->x.token);
        return CURL_WRITEFUNC_PAUSE;
    }
    if (loom_buf_put(&t->inbox, data, len) != 0) {
        t->cb_rc = LOOM_ENOMEM;
        return len ? 0 : 1;
    }
    loom__fiber_wake(t->x.fiber, t->x.token);
    return len;
}

static int on_prereq(void *ud, char *primary_ip, char *local_ip,
                     int primary_port, int local_port)
{
    transfer *t = ud;

    (void)primary_ip;
    (void)local_ip;
    (void)primary_port;
    (void)local_port;
    t->sent_at = loom__mono_ms();
    return CURL_PREREQFUNC_OK;
}

static int has_header(const loom__http_request *req, const char *name)
{
    size_t n = strlen(name);

    for (size_t i = 0; i < req->headers_len; i++)
        if (strncasecmp(req->headers[i], name, n) == 0 &&
            req->headers[i][n] == ':')
            return 1;
    return 0;
}

static int is_post(const loom__http_request *req)
{
    return req->body || (req->method && strcmp(req->method, "POST") == 0);
}

/* Whether pr's handle is set up exactly as req needs (see the top). */
static int same_setup(const pair *pr, const loom__http_request *req)
{
    const char *p = pr->sig.ptr;

    if (!pr->ready || pr->nheaders != req->headers_len ||
        pr->connect_ms != req->connect_timeout_ms || pr->post != is_post(req))
        return 0;
    if (strcmp(p, req->url) != 0)
        return 0;
    p += strlen(p) + 1;
    if (strcmp(p, req->method ? req->method : "") != 0)
        return 0;
    p += strlen(p) + 1;
    for (size_t i = 0; i < req->headers_len; i++) {
        if (strcmp(p, req->headers[i]) != 0)
            return 0;
        p += strlen(p) + 1;
    }
    return 1;
}

/* Records what pr's handle was just set up for. */
static int keep_setup(pair *pr, const loom__http_request *req)
{
    loom_buf *b = &pr->sig;

    loom_buf_clear(b);
    if (loom_buf_put(b, req->url, strlen(req->url) + 1) ||
        loom_buf_put(b, req->method ? req->method : "",
                     req->method ? strlen(req->method) + 1 : 1))
        return loom__error_oom();
    for (size_t i = 0; i < req->headers_len; i++)
        if (loom_buf_put(b, req->headers[i], strlen(req->headers[i]) + 1))
            return loom__error_oom();
    pr->nheaders = req->headers_len;
    pr->connect_ms = req->connect_timeout_ms;
    pr->post = is_post(req);
    pr->ready = 1;
    return 0;
}

/* url parsed with the flags libcurl itself parses a string URL with,
 * so a transfer sees the same parts; NULL when it does not parse. */
static CURLU *parse_url(const char *url)
{
    CURLU *u = curl_url();

    if (u && curl_url_set(u, CURLUPART_URL, url,
                          CURLU_GUESS_SCHEME | CURLU_NON_SUPPORT_SCHEME) !=
                 CURLUE_OK) {
        curl_url_cleanup(u);
        u = NULL;
    }
    return u;
}

/* A copy of the pool's last parsed URL when it is url, else url parsed
 * (then kept as the pool's last); NULL when it does not parse or out of
 * memory. */
static CURLU *pool_url(loom__http_pool *pool, const char *url)
{
    CURLU *u = NULL, *keep;
    char *text;

    pthread_mutex_lock(&pool->lock);
    if (pool->url && strcmp(pool->url_text, url) == 0)
        u = curl_url_dup(pool->url);
    pthread_mutex_unlock(&pool->lock);
    if (u || !(u = parse_url(url)))
        return u;
    keep = curl_url_dup(u);
    text = strdup(url);
    if (keep && text) {
        CURLU *old_url;
        char *old_text;

        pthread_mutex_lock(&pool->lock);
        old_url = pool->url;
        old_text = pool->url_text;
        pool->url = keep;
        pool->url_text = text;
        pthread_mutex_unlock(&pool->lock);
        keep = old_url;
        text = old_text;
    }
    curl_url_cleanup(keep);
    free(text);
    return u;
}

/*
 * Gives pr's handle req's URL. Set as a string (CURLOPT_URL), libcurl
 * parses it again for every transfer and builds it back into a string
 * with its own printf (about 12k instructions, a tenth of what libcurl
 * spends on a call); a parsed handle (CURLOPT_CURLU) is only copied. A
 * new pair copies the pool's parsed URL too: parsing formats with that
 * printf, whose frame is about 4 KB, on the caller's fiber, and a
 * fiber's stack keeps every page it touched for as long as its stream
 * is open (a third page of every stream when each parsed its own). A
 * URL that does not parse is set as a string, for libcurl to refuse
 * with its own error as before.
 */
static void set_url(loom__http_pool *pool, pair *pr, const char *url)
{
    curl_url_cleanup(pr->url);
    pr->url = pool_url(pool, url);
    if (pr->url)
        curl_easy_setopt(pr->easy, CURLOPT_CURLU, pr->url);
    else
        curl_easy_setopt(pr->easy, CURLOPT_URL, url);
}

/* Sets pr's handle up for req: everything when it was set up for
 * something else, else only the body. */
static int setup(loom__http_pool *pool, pair *pr, const loom__http_request *req)
{
    transfer *t = &pr->t;
    CURL *e = pr->easy;
    struct curl_slist *hdrs = NULL, *l;
    int rc;

    if (!same_setup(pr, req)) {
        pr->ready = 0;
        for (size_t i = 0; i < req->headers_len; i++) {
            if (!(l = curl_slist_append(hdrs, req->headers[i])))
                goto oom;
            hdrs = l;
        }
        /* curl would wait for "100 Continue" before sending a large
         * body. */
        if (!has_header(req, "Expect")) {
            if (!(l = curl_slist_append(hdrs, "Expect:")))
                goto oom;
            hdrs = l;
        }
        curl_easy_reset(e);
        curl_slist_free_all(pr->hdrs);
        pr->hdrs = hdrs;
        set_url(pool, pr, req->url);
        curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
        curl_easy_setopt(e, CURLOPT_ERRORBUFFER, pr->errbuf);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, pr->hdrs);
        curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(e, CURLOPT_HEADERDATA, t);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, t);
        /* libcurl's receive buffer, one per transfer (16 KiB by
         * default): an open stream holds one, and a chunk of a stream is
         * far smaller. */
        curl_easy_setopt(e, CURLOPT_BUFFERSIZE, (long)HTTP_RECV_BUFFER);
        curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, on_prereq);
        curl_easy_setopt(e, CURLOPT_PREREQDATA, t);
        if (req->connect_timeout_ms > 0)
            curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
                             req->connect_timeout_ms);
        if (is_post(req))
            curl_easy_setopt(e, CURLOPT_POST, 1L);
        else
            curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
        if (req->method && strcmp(req->method, "POST") != 0 &&
            strcmp(req->method, "GET") != 0)
            curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, req->method);
        if ((rc = keep_setup(pr, req)) != 0)
            return rc;
    }
    if (is_post(req)) {
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE,
                         (curl_off_t)req->body_len);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, req->body ? req->body : "");
    }
    return 0;

oom:
    curl_slist_free_all(hdrs);
    return loom__error_oom();
}

/* Turns curl's result into loom's. */
static int finish(transfer *t, CURLcode res, const char *errbuf)
{
    loom__http_response *r = t->resp;
    const char *msg = errbuf[0] ? errbuf : curl_easy_strerror(res);
    int answered;

    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &r->status);
    curl_easy_getinfo(t->easy, CURLINFO_NUM_CONNECTS, &r->new_connections);
    if (res == CURLE_OK || (res == CURLE_WRITE_ERROR && t->error_cut))
        return 0;
    if (res == CURLE_WRITE_ERROR && t->cb_rc) {
        r->failure = LOOM_HTTP_FAIL_CALLBACK;
        return t->cb_rc;
    }
    if (res == CURLE_OPERATION_TIMEDOUT) {
        r->failure = LOOM_HTTP_FAIL_TIMEOUT_CONNECT;
        return loom__error_set(LOOM_ETIMEDOUT,
                               "connect timeout: no connection within %ld "
                               "ms",
                               t->req->connect_timeout_ms);
    }
    answered = r->status != 0 || r->body_bytes > 0;
    switch (res) {
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_SSL_CONNECT_ERROR:
        r->failure =
            answered ? LOOM_HTTP_FAIL_TRUNCATED : LOOM_HTTP_FAIL_CONNECT;
        if (answered)
            return loom__error_set(LOOM_EIO,
                                   "connection dropped after %zu body "
                                   "bytes: %s",
                                   r->body_bytes, msg);
        return loom__error_set(LOOM_EIO, "connection failed: %s", msg);
    default:
        r->failure = LOOM_HTTP_FAIL_OTHER;
        return loom__error_set(LOOM_EIO, "http: %s", msg);
    }
}

/* Checks the cancel flag and the timers; non-zero ends the transfer. */
static int check(transfer *t, long tick_ms, long *wait_ms)
{
    const loom__http_request *req = t->req;
    long long now = loom__mono_ms(), left = tick_ms;

    if (loom_cancel_is_set(req->cancel)) {
        t->resp->failure = LOOM_HTTP_FAIL_CANCELED;
        return loom__error_set(LOOM_ECANCELED, "request canceled");
    }
    if (t->body_started && req->idle_timeout_ms > 0) {
        left = t->last_byte_at + req->idle_timeout_ms - now;
        if (left <= 0) {
            t->resp->failure = LOOM_HTTP_FAIL_TIMEOUT_IDLE;
            return loom__error_set(LOOM_ETIMEDOUT,
                                   "idle timeout: no data for %ld ms",
                                   req->idle_timeout_ms);
        }
    } else if (!t->body_started && !t->sent_at &&
               req->first_byte_timeout_ms > 0) {
        /* Not sent yet: a fiber's transfer goes out from its worker's
         * loop after this look, and nothing wakes the fiber when it does.
         * Look again when the timeout's length has passed: by then it is
         * out, and its exact deadline is known. */
        left = req->first_byte_timeout_ms;
    } else if (!t->body_started && req->first_byte_timeout_ms > 0) {
        left = t->sent_at + req->first_byte_timeout_ms - now;
        if (left <= 0) {
            t->resp->failure = LOOM_HTTP_FAIL_TIMEOUT_FIRST_BYTE;
            return loom__error_set(LOOM_ETIMEDOUT,
                                   "first-byte timeout: no response data "
                                   "within %ld ms",
                                   req->first_byte_timeout_ms);
        }
    }
    *wait_ms = left < tick_ms ? (long)left : tick_ms;
    return 0;
}

/* Hands the inbox's bytes on, on the fiber; 0, or -1 when deliver ended
 * the transfer. The bytes move out of the inbox first: on_body may park
 * the fiber (a store write), and bytes that arrive meanwhile go to the
 * inbox, for the next round. */
static int drain(transfer *t)
{
    loom_buf tmp = t->handing;
    size_t len, took;

    t->handing = t->inbox;
    t->inbox = tmp;
    loom_buf_clear(&t->inbox);
    len = t->handing.len;
    took = len ? deliver(t, t->handing.ptr, len) : 0;
    loom_buf_clear(&t->handing);
    return took == len ? 0 : -1;
}

/*
 * Runs pr's transfer on the caller's fiber through its worker's multi
 * handle m (see the top): 0 with *res set when it ended, else the error
 * (a timeout or cancellation) with resp->failure set.
 */
static int perform_on_fiber(pair *pr, CURLM *m, CURLcode *res)
{
    transfer *t = &pr->t;
    CURLMcode mc;
    long wait_ms = 0;
    int rc = 0;

    t->on_fiber = 1;
    t->x.fiber = loom__fiber_self();
    t->x.token = loom__fiber_arm();
    loom_buf_init(&t->inbox, INBOX_MAX + CURL_MAX_WRITE_SIZE);
    loom_buf_init(&t->handing, INBOX_MAX + CURL_MAX_WRITE_SIZE);
    curl_easy_setopt(pr->easy, CURLOPT_PRIVATE, (char *)&t->x);
    if ((mc = curl_multi_add_handle(m, pr->easy)) != CURLM_OK) {
        t->resp->failure = LOOM_HTTP_FAIL_OTHER;
        rc = loom__error_set(LOOM_ERROR, "curl: %s", curl_multi_strerror(mc));
        goto out;
    }
    for (;;) {
        /* Armed before looking, so that nothing that comes after the look
         * is missed by the park. */
        t->x.token = loom__fiber_arm();
        if (t->inbox.len) {
            if (drain(t) != 0) {
                *res = CURLE_WRITE_ERROR;
                break;
            }
            if (t->paused) {
                t->paused = 0;
                curl_easy_pause(pr->easy, CURLPAUSE_CONT);
            }
            continue;
        }
        if (t->x.done) {
            *res = (CURLcode)t->x.result;
            if (t->cb_rc && *res == CURLE_OK)
                *res = CURLE_WRITE_ERROR;
            break;
        }
        if ((rc = check(t, FIBER_TICK_MS, &wait_ms)) != 0)
            break;
        loom__fiber_park_cancel(loom__mono_ms_exact() + (double)wait_ms,
                                t->req->cancel);
    }
    curl_multi_remove_handle(m, pr->easy);
out:
    curl_easy_setopt(pr->easy, CURLOPT_PRIVATE, NULL);
    loom_buf_free(&t->inbox);
    loom_buf_free(&t->handing);
    return rc;
}

int loom__http_perform(loom__http_pool *pool, const loom__http_request *req,
                       loom__http_response *resp)
{
    transfer *t;
    pair *pr = NULL;
    CURLM *fm;
    CURLcode res = CURLE_OK;
    CURLMcode mc;
    CURLMsg *msg;
    int rc = 0, added = 0, running = 1, done = 0, q;
    long wait_ms = 0;

    size_t max_body = req->max_body ? req->max_body : LOOM_HTTP_MAX_BODY,
           max_error_body = req->max_error_body ? req->max_error_body
                                                : LOOM_HTTP_MAX_ERROR_BODY;

    /* Either body is checked against its own limit as it arrives (with
     * its own message); the buffer holds to the larger as well. */
    loom_buf_init(&resp->body,
                  max_body > max_error_body ? max_body : max_error_body);
    if (loom_cancel_is_set(req->cancel)) {
        resp->failure = LOOM_HTTP_FAIL_CANCELED;
        return loom__error_set(LOOM_ECANCELED, "request canceled");
    }
    if (!(pr = pool_take(pool))) {
        rc = loom__error_set(LOOM_ENOMEM, "cannot make a curl handle");
        goto cleanup;
    }
    t = &pr->t;
    memset(t, 0, sizeof(*t));
    t->req = req;
    t->resp = resp;
    t->easy = pr->easy;
    t->max_error_body = max_error_body;
    t->max_body = max_body;
    pr->errbuf[0] = '\0';
    if ((rc = setup(pool, pr, req)) != 0)
        goto cleanup;
    if ((fm = loom__fiber_multi()) != NULL) {
        if ((rc = perform_on_fiber(pr, fm, &res)) == 0)
            rc = finish(t, res, pr->errbuf);
        goto cleanup;
    }
    if (!pr->multi && !(pr->multi = curl_multi_init())) {
        rc = loom__error_set(LOOM_ENOMEM, "cannot make a curl handle");
        goto cleanup;
    }
    if ((mc = curl_multi_add_handle(pr->multi, pr->easy)) != CURLM_OK) {
        rc = loom__error_set(LOOM_ERROR, "curl: %s", curl_multi_strerror(mc));
        goto cleanup;
    }
    added = 1;
    while (!done) {
        mc = curl_multi_perform(pr->multi, &running);
        if (mc != CURLM_OK) {
            resp->failure = LOOM_HTTP_FAIL_OTHER;
            rc = loom__error_set(LOOM_EIO, "curl: %s", curl_multi_strerror(mc));
            goto cleanup;
        }
        while ((msg = curl_multi_info_read(pr->multi, &q)) != NULL) {
            if (msg->msg == CURLMSG_DONE && msg->easy_handle == pr->easy) {
                res = msg->data.result;
                done = 1;
            }
        }
        if (done || !running)
            break;
        if ((rc = check(t, LOOM_HTTP_TICK_MS, &wait_ms)) != 0)
            goto cleanup;
        mc = curl_multi_poll(pr->multi, NULL, 0, (int)wait_ms, NULL);
        if (mc != CURLM_OK) {
            resp->failure = LOOM_HTTP_FAIL_OTHER;
            rc = loom__error_set(LOOM_EIO, "curl: %s", curl_multi_strerror(mc));
            goto cleanup;
        }
    }
    rc = finish(t, res, pr->errbuf);

cleanup:
    if (pr && rc && !resp->status)
        curl_easy_getinfo(pr->easy, CURLINFO_RESPONSE_CODE, &resp->status);
    if (added)
        curl_multi_remove_handle(pr->multi, pr->easy);
    if (pr) {
        /* The handle keeps its setup for the next request; the caller's
         * request, response and body must not be reached from the pool. */
        pr->t.req = NULL;
        pr->t.resp = NULL;
        if (pr->post)
            curl_easy_setopt(pr->easy, CURLOPT_POSTFIELDS, "");
        pool_give(pool, pr);
    }
    return rc;
}
