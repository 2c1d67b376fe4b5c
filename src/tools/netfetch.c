/*
 * The HTTP client of the fetching tools (web_fetch, HTTP tools from
 * config): one request under the network policy of netguard.c, with its
 * redirects followed by loom so that every hop is checked again.
 *
 * Each hop gets a fresh libcurl easy handle, so no connection, DNS entry
 * or cookie survives from one hop (or one call) to the next. The handle
 * is pinned to the addresses the policy checked: CURLOPT_RESOLVE feeds
 * them to libcurl (no lookup of its own), and the open-socket callback
 * refuses any other address, so even a libcurl that resolved the name
 * again could not be steered elsewhere. Proxies are off whatever the
 * environment says, only http and https are spoken, libcurl follows no
 * redirect itself, and body bytes, total time and slow transfers are
 * capped. This is not core/http.c's pooled client on purpose: that one
 * shares connections and DNS between calls, which is what a guarded
 * fetch must not do.
 */
#include "core/clock.h"
#include "core/error.h"
#include "tools/netguard.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The connect phase of one hop never waits longer than this. */
#define CONNECT_TIMEOUT_MS 10000L

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc = CURLE_FAILED_INIT;

static void global_init(void)
{
    global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* State of one hop, shared with the libcurl callbacks. */
typedef struct {
    const loom__net_target *t;
    loom_buf *body;
    loom_cancel *cancel;
    int too_large;
    int out_of_memory;
    int refused;
    int canceled;
    char why[320];
} hop;

static curl_socket_t open_socket(void *clientp, curlsocktype purpose,
                                 struct curl_sockaddr *a)
{
    hop *h = clientp;

    (void)purpose;
    if (loom__net_target_refuses(h->t, &a->addr, a->addrlen, h->why,
                                 sizeof(h->why))) {
        h->refused = 1;
        return CURL_SOCKET_BAD;
    }
    return socket(a->family, a->socktype, a->protocol);
}

static size_t on_write(char *data, size_t size, size_t n, void *userdata)
{
    hop *h = userdata;
    int rc = loom_buf_put(h->body, data, size * n);

    if (rc == LOOM_ETOOLARGE)
        h->too_large = 1;
    else if (rc)
        h->out_of_memory = 1;
    return rc ? 0 : size * n;
}

static int on_progress(void *clientp, curl_off_t dltotal, curl_off_t dlnow,
                       curl_off_t ultotal, curl_off_t ulnow)
{
    hop *h = clientp;

    (void)dltotal;
    (void)dlnow;
    (void)ultotal;
    (void)ulnow;
    if (loom_cancel_is_set(h->cancel)) {
        h->canceled = 1;
        return 1;
    }
    return 0;
}

/* The CURLOPT_RESOLVE entry "host:port:addr,addr" pinning a name. */
static struct curl_slist *resolve_entry(const loom__net_target *t)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    struct curl_slist *list = NULL;
    char text[INET6_ADDRSTRLEN];
    int rc;

    rc = loom_buf_printf(&b, "%s:%d:", t->host, t->port);
    for (size_t i = 0; i < t->naddrs && !rc; i++) {
        const struct sockaddr_storage *ss = &t->addrs[i];

        if (ss->ss_family == AF_INET)
            inet_ntop(AF_INET, &((const struct sockaddr_in *)ss)->sin_addr,
                      text, sizeof(text));
        else
            inet_ntop(AF_INET6,
                      &((const struct sockaddr_in6 *)ss)->sin6_addr, text,
                      sizeof(text));
        rc = loom_buf_printf(&b, ss->ss_family == AF_INET6 ? "%s[%s]"
                                                            : "%s%s",
                             i ? "," : "", text);
    }
    if (!rc)
        list = curl_slist_append(NULL, loom_buf_cstr(&b));
    loom_buf_free(&b);
    return list;
}

static int set_method(CURL *e, const char *method, const char *body,
                      size_t body_len)
{
    CURLcode c = CURLE_OK;

    if (strcmp(method, "GET") == 0 && !body)
        return curl_easy_setopt(e, CURLOPT_HTTPGET, 1L) == CURLE_OK ? 0 : -1;
    if (strcmp(method, "HEAD") == 0)
        return curl_easy_setopt(e, CURLOPT_NOBODY, 1L) == CURLE_OK ? 0 : -1;
    if (body) {
        c = curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
        if (c == CURLE_OK)
            c = curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE,
                                 (curl_off_t)body_len);
    }
    if (c == CURLE_OK && strcmp(method, "POST") != 0)
        c = curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    return c == CURLE_OK ? 0 : -1;
}

/* A URL cut for messages. */
static const char *shown(char *dst, size_t cap, const char *s)
{
    size_t n = strlen(s);

    if (n < cap) {
        memcpy(dst, s, n + 1);
    } else {
        memcpy(dst, s, cap - 4);
        memcpy(dst + cap - 4, "...", 4);
    }
    return dst;
}

/*
 * One request to the checked target t, with remaining_ms left. Fills
 * status, content type and redirect target (malloc'd, NULL when absent)
 * and the body into resp->body.
 */
static int fetch_hop(const loom__net_target *t, const loom__net_request *req,
                     const char *method, const char *body, size_t body_len,
                     long remaining_ms, loom__net_response *resp,
                     char **redirect)
{
    struct curl_slist *hdrs = NULL, *pin = NULL;
    char errbuf[CURL_ERROR_SIZE] = "", where[160];
    char *ct = NULL, *loc = NULL;
    CURL *e = NULL;
    CURLcode c;
    hop h;
    int rc = 0;

    *redirect = NULL;
    memset(&h, 0, sizeof(h));
    h.t = t;
    h.body = &resp->body;
    h.cancel = req->cancel;
    loom_buf_clear(&resp->body);
    shown(where, sizeof(where), t->url);

    if (!(e = curl_easy_init()))
        return loom__error_oom();
    for (size_t i = 0; i < req->headers_len; i++)
        if (!(hdrs = curl_slist_append(hdrs, req->headers[i])))
            goto oom;
    /* No "Expect: 100-continue" round trip for bodies. */
    if (body && !(hdrs = curl_slist_append(hdrs, "Expect:")))
        goto oom;
    if (!t->literal && !(pin = resolve_entry(t)))
        goto oom;

    c = curl_easy_setopt(e, CURLOPT_URL, t->url);
    if (c == CURLE_OK)
        c = curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    if (c == CURLE_OK)
        c = curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
    /* The environment's http_proxy & co. would send the request to a
     * host that was never checked. */
    if (c == CURLE_OK)
        c = curl_easy_setopt(e, CURLOPT_PROXY, "");
    if (c == CURLE_OK)
        c = curl_easy_setopt(e, CURLOPT_NOPROXY, "*");
    if (c == CURLE_OK && pin)
        c = curl_easy_setopt(e, CURLOPT_RESOLVE, pin);
    if (c == CURLE_OK)
        c = curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, open_socket);
    if (c == CURLE_OK)
        c = curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, &h);
    if (c == CURLE_OK)
        c = curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    if (c == CURLE_OK)
        c = curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, remaining_ms);
    if (c == CURLE_OK)
        c = curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
                             remaining_ms < CONNECT_TIMEOUT_MS
                                 ? remaining_ms
                                 : CONNECT_TIMEOUT_MS);
    if (c == CURLE_OK && req->low_speed_secs > 0) {
        c = curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT,
                             req->low_speed_bytes);
        if (c == CURLE_OK)
            c = curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME,
                                 req->low_speed_secs);
    }
    if (c == CURLE_OK)
        c = curl_easy_setopt(e, CURLOPT_MAXFILESIZE_LARGE,
                             (curl_off_t)req->max_bytes);
    /* Any encoding libcurl decodes; the byte cap counts decoded bytes. */
    if (c == CURLE_OK)
        c = curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, "");
    if (c == CURLE_OK)
        c = curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    if (c == CURLE_OK)
        c = curl_easy_setopt(e, CURLOPT_WRITEDATA, &h);
    if (c == CURLE_OK)
        c = curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, on_progress);
    if (c == CURLE_OK)
        c = curl_easy_setopt(e, CURLOPT_XFERINFODATA, &h);
    if (c == CURLE_OK)
        c = curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
    if (c == CURLE_OK)
        c = curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
    if (c == CURLE_OK && req->user_agent)
        c = curl_easy_setopt(e, CURLOPT_USERAGENT, req->user_agent);
    if (c == CURLE_OK && hdrs)
        c = curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
    if (c != CURLE_OK || set_method(e, method, body, body_len) != 0) {
        rc = loom__error_set(LOOM_ERROR, "libcurl refused an option: %s",
                             curl_easy_strerror(c));
        goto cleanup;
    }

    c = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &resp->status);
    if (h.canceled) {
        rc = loom__error_set(LOOM_ECANCELED, "the fetch of %s was cancelled",
                             where);
    } else if (h.refused) {
        rc = loom__error_set(LOOM_ERROR, "blocked by policy: %s", h.why);
    } else if (h.out_of_memory) {
        rc = loom__error_oom();
    } else if (h.too_large || c == CURLE_FILESIZE_EXCEEDED) {
        rc = loom__error_set(LOOM_ETOOLARGE,
                             "the response of %s is larger than max_bytes "
                             "(%zu bytes)",
                             where, req->max_bytes);
    } else if (c == CURLE_OPERATION_TIMEDOUT) {
        if (strstr(errbuf, "too slow"))
            rc = loom__error_set(LOOM_ETIMEDOUT,
                                 "the transfer of %s was too slow: less than "
                                 "%ld bytes/s for %ld s",
                                 where, req->low_speed_bytes,
                                 req->low_speed_secs);
        else
            rc = loom__error_set(LOOM_ETIMEDOUT,
                                 "timed out: %s did not answer completely "
                                 "within timeout_ms (%ld ms)",
                                 where, req->timeout_ms);
    } else if (c == CURLE_COULDNT_RESOLVE_HOST) {
        rc = loom__error_set(LOOM_ENOTFOUND, "could not resolve %s: %s",
                             where, errbuf[0] ? errbuf : curl_easy_strerror(c));
    } else if (c == CURLE_COULDNT_CONNECT) {
        rc = loom__error_set(LOOM_EIO, "could not connect to %s: %s", where,
                             errbuf[0] ? errbuf : curl_easy_strerror(c));
    } else if (c != CURLE_OK) {
        rc = loom__error_set(LOOM_EIO, "fetching %s failed: %s", where,
                             errbuf[0] ? errbuf : curl_easy_strerror(c));
    }
    if (rc)
        goto cleanup;
    if (curl_easy_getinfo(e, CURLINFO_CONTENT_TYPE, &ct) == CURLE_OK && ct) {
        free(resp->content_type);
        if (!(resp->content_type = strdup(ct)))
            goto oom;
    }
    if (curl_easy_getinfo(e, CURLINFO_REDIRECT_URL, &loc) == CURLE_OK &&
        loc && !(*redirect = strdup(loc)))
        goto oom;
    goto cleanup;

oom:
    rc = loom__error_oom();
cleanup:
    curl_easy_cleanup(e);
    curl_slist_free_all(hdrs);
    curl_slist_free_all(pin);
    return rc;
}

void loom__net_response_clear(loom__net_response *resp)
{
    if (!resp)
        return;
    free(resp->url);
    free(resp->content_type);
    free(resp->location);
    loom_buf_free(&resp->body);
    memset(resp, 0, sizeof(*resp));
}

static int is_redirect(long status)
{
    return status == 301 || status == 302 || status == 303 ||
           status == 307 || status == 308;
}

/* Adds where a failing hop came from to the thread's message. */
static int after_redirect(int rc, const char *from)
{
    char msg[1024], tmp[160];

    snprintf(msg, sizeof(msg), "%s", loom_error_last());
    return loom__error_set(rc, "%s (reached by a redirect from %s)", msg,
                           shown(tmp, sizeof(tmp), from));
}

int loom__net_fetch(const loom__net_policy *p, const char *url,
                    const loom__net_request *req, loom__net_response *resp)
{
    loom__net_target t;
    const char *method, *body;
    char *cur = NULL, *prev = NULL, *next = NULL, tmp[160];
    long long deadline;
    size_t body_len;
    int rc = 0;

    memset(&t, 0, sizeof(t));
    if (!p || !url || !req || !resp)
        return loom__error_set(LOOM_EINVALID, "net fetch: NULL argument");
    memset(resp, 0, sizeof(*resp));
    loom_buf_init(&resp->body, req->max_bytes);
    pthread_once(&global_once, global_init);
    if (global_rc != CURLE_OK)
        return loom__error_set(LOOM_ERROR, "libcurl failed to start: %s",
                               curl_easy_strerror(global_rc));
    method = req->method ? req->method : "GET";
    body = req->body;
    body_len = req->body_len;
    deadline = loom__mono_ms() + req->timeout_ms;
    if (!(cur = strdup(url)))
        return loom__error_oom();
    for (;;) {
        long long left;

        if ((rc = loom__net_target_check(&t, p, cur)) != 0) {
            if (prev)
                rc = after_redirect(rc, prev);
            goto cleanup;
        }
        left = deadline - loom__mono_ms();
        if (left <= 0) {
            rc = loom__error_set(LOOM_ETIMEDOUT,
                                 "timed out: %s was not reached within "
                                 "timeout_ms (%ld ms)",
                                 shown(tmp, sizeof(tmp), t.url),
                                 req->timeout_ms);
            goto cleanup;
        }
        rc = fetch_hop(&t, req, method, body, body_len, (long)left, resp,
                       &next);
        if (rc) {
            if (prev)
                rc = after_redirect(rc, prev);
            goto cleanup;
        }
        if (!is_redirect(resp->status) || !next)
            break;
        if (req->max_redirects <= 0) {
            resp->location = next;
            next = NULL;
            break;
        }
        if (resp->redirects >= req->max_redirects) {
            rc = loom__error_set(LOOM_ERROR,
                                 "too many redirects: more than %d, the "
                                 "last from %s",
                                 req->max_redirects,
                                 shown(tmp, sizeof(tmp), t.url));
            goto cleanup;
        }
        if (strlen(next) > LOOM__NET_MAX_URL) {
            rc = loom__error_set(LOOM_ETOOLARGE,
                                 "%s redirects to a URL longer than %d "
                                 "bytes",
                                 shown(tmp, sizeof(tmp), t.url),
                                 LOOM__NET_MAX_URL);
            goto cleanup;
        }
        resp->redirects++;
        /* What browsers do: 303, and 301/302 after a POST, become GET. */
        if (resp->status == 303 ||
            ((resp->status == 301 || resp->status == 302) &&
             strcmp(method, "POST") == 0)) {
            method = "GET";
            body = NULL;
            body_len = 0;
        }
        free(prev);
        prev = t.url;
        t.url = NULL;
        free(cur);
        cur = next;
        next = NULL;
        loom__net_target_clear(&t);
    }
    resp->url = t.url;
    t.url = NULL;

cleanup:
    loom__net_target_clear(&t);
    free(cur);
    free(prev);
    free(next);
    return rc;
}
