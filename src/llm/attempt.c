/*
 * The attempt loop of the HTTP model adapters (see llm/attempt.h): one
 * model call as a series of HTTP attempts. Each attempt gets a fresh
 * decoder from the adapter; body bytes of a 2xx answer go to it as they
 * arrive (or whole, for a JSON answer), an error answer is turned into a
 * loom_upstream_error by the adapter's own parser, and the outcome decides
 * whether another attempt may help. The policy lives here once so that
 * every provider retries, logs and reports failures the same way.
 */
#include "llm/attempt.h"
#include "core/clock.h"
#include "core/error.h"
#include "llm/retry.h"
#include "loom/buf.h"
#include "loom/log.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* What the body callback needs during one attempt. */
typedef struct {
    const loom__llm_decoder_ops *ops;
    void *d;
    loom__http_response *hr;
    int stream;
    int json_mode; /* streaming asked, but the server answered JSON */
    int mode_known;
    loom_buf json;
} attempt_ctx;

static int on_body(const char *data, size_t len, void *payload)
{
    attempt_ctx *a = payload;
    const char *ct;

    if (!a->mode_known) {
        /* A server that ignores "stream": true sends one JSON answer. */
        ct = a->hr->content_type;
        a->json_mode = ct && strncasecmp(ct, "application/json", 16) == 0;
        a->mode_known = 1;
    }
    if (!a->json_mode)
        return a->ops->feed(a->d, data, len);
    if (len > a->json.max - a->json.len)
        return loom__error_set(
            LOOM_ETOOLARGE, "answer body larger than %zu bytes", a->json.max);
    return loom_buf_put(&a->json, data, len);
}

/* Sets err from a failed attempt (msg NULL is "", never "HTTP <n>"). */
static int set_error(loom_upstream_error *err, loom_upstream_kind kind,
                     long status, const char *msg, const char *type,
                     const char *request_id)
{
    if (!msg)
        msg = "";
    return loom__llm_error_set(err, kind, status, msg, strlen(msg), type,
                               request_id);
}

/* The error paths below are kept out of loom__llm_attempts (noinline):
 * their message buffers would otherwise sit in its frame, which is on a
 * fiber's stack for the whole model call (see outcome). */

/* Sets the thread's error message for err and returns code. */
__attribute__((noinline)) static int
raise_error(const char *name, const loom_upstream_error *err, int code)
{
    char rid[LOOM_HTTP_MAX_HEADER + 16] = "";
    char tries[48] = "";

    if (err->request_id)
        snprintf(rid, sizeof(rid), " (request %s)", err->request_id);
    if (err->attempts > 1)
        snprintf(tries, sizeof(tries), " after %d attempts", err->attempts);
    /* The status tells something only when it is the error itself. */
    if (err->http_status >= 300)
        return loom__error_set(code, "%s: %d %s: %s%s%s", name,
                               err->http_status,
                               loom_upstream_kind_name(err->kind),
                               err->message ? err->message : "", rid, tries);
    return loom__error_set(code, "%s: %s: %s%s%s", name,
                           loom_upstream_kind_name(err->kind),
                           err->message ? err->message : "", rid, tries);
}

/* Puts the provider's name before the thread's error message. */
__attribute__((noinline)) static int prefix_error(const char *name, int code)
{
    char msg[1024];

    snprintf(msg, sizeof(msg), "%s", loom_error_last());
    return loom__error_set(code, "%s: %s", name, msg);
}

/* Puts the error answer's rate-limit headers into err->headers (left
 * NULL when there are none). LOOM_ENOMEM. */
static int keep_rate_headers(loom_upstream_error *err,
                             const loom__http_response *hr)
{
    if (!hr->rate_len)
        return 0;
    if (!(err->headers = json_object()))
        return loom__error_oom();
    for (size_t i = 0; i < hr->rate_len; i++)
        if (json_object_set_new(err->headers, hr->rate[i].name,
                                json_string(hr->rate[i].value)))
            return loom__error_oom();
    return 0;
}

/*
 * Classifies the outcome of one attempt. Returns 0 on success, or the
 * error to return, with resp->error filled and *retry set when another
 * attempt may help. Not inlined: its 1 KiB message buffer would add a
 * page to the stack of every streamed model call, whose deepest frames
 * (an event's serialisation) run below loom__llm_attempts.
 */
__attribute__((noinline)) static int outcome(attempt_ctx *a, int rc,
                                             const loom__http_response *hr,
                                             loom_llm_response *resp,
                                             int *retry)
{
    const loom__llm_decoder_ops *ops = a->ops;
    loom_upstream_error *err = &resp->error;
    const loom_upstream_error *de;
    char msg[1024];

    *retry = 0;
    if (rc == 0 && hr->status >= 200 && hr->status < 300) {
        if (a->stream && !a->json_mode)
            rc = ops->finish(a->d);
        else if (a->json_mode)
            rc = ops->complete(a->d, loom_buf_cstr(&a->json), a->json.len);
        else
            rc = ops->complete(a->d, loom_buf_cstr(&hr->body), hr->body.len);
        if (rc == 0) {
            loom__upstream_error_clear(err);
            return 0;
        }
    } else if (rc == 0) {
        if (ops->error_from_http(err, hr->status, loom_buf_cstr(&hr->body),
                                 hr->body.len, hr->request_id) ||
            keep_rate_headers(err, hr))
            return LOOM_ENOMEM;
        *retry = ops->status_retryable(hr->status);
        return LOOM_EUPSTREAM;
    }
    snprintf(msg, sizeof(msg), "%s", loom_error_last());
    switch (rc) {
    case LOOM_EUPSTREAM: /* from the decoder: in-stream error, early end */
        de = ops->error(a->d);
        if (set_error(err, de->kind, hr->status, de->message, de->type,
                      hr->request_id))
            return LOOM_ENOMEM;
        *retry =
            de->kind == LOOM_UPSTREAM_CONNECTION ||
            (de->kind == LOOM_UPSTREAM_STREAM && ops->stream_error_retryable &&
             ops->stream_error_retryable(de));
        return rc;
    case LOOM_EIO:
        if (set_error(err, LOOM_UPSTREAM_CONNECTION, hr->status, msg, NULL,
                      hr->request_id))
            return LOOM_ENOMEM;
        *retry = 1;
        return LOOM_EUPSTREAM;
    case LOOM_ETIMEDOUT:
        if (set_error(err, LOOM_UPSTREAM_TIMEOUT, hr->status, msg, NULL,
                      hr->request_id))
            return LOOM_ENOMEM;
        *retry = hr->failure == LOOM_HTTP_FAIL_TIMEOUT_CONNECT;
        return rc;
    case LOOM_EPROTO:
        if (set_error(err, LOOM_UPSTREAM_PROTOCOL, hr->status, msg, NULL,
                      hr->request_id))
            return LOOM_ENOMEM;
        return rc;
    default: /* canceled, too large, out of memory: as they are */
        return rc;
    }
}

int loom__llm_attempts(const loom__llm_attempts_opts *o,
                       loom_llm_response *resp)
{
    const loom__llm_decoder_ops *ops = o->ops;
    /* Not a copy: this frame stays on a fiber's stack while the answer
     * streams. */
    loom__http_request *hreq = o->http;
    loom__http_response hr = {0};
    attempt_ctx a = {0};
    unsigned seed;
    int rc, retry;
    long delay;

    resp->error.attempts = 0;
    seed = (unsigned)loom__mono_ms() ^ (unsigned)(uintptr_t)&seed;
    loom_buf_init(&a.json,
                  o->max_json_body ? o->max_json_body : LOOM_HTTP_MAX_BODY);
    a.ops = ops;
    a.stream = o->stream;
    a.hr = &hr;
    hreq->on_body = o->stream ? on_body : NULL;
    hreq->payload = &a;

    for (int attempt = 1;; attempt++) {
        if (a.d)
            ops->decoder_free(a.d);
        a.d = NULL;
        loom__http_response_clear(&hr);
        loom_buf_clear(&a.json);
        a.mode_known = a.json_mode = 0;
        resp->error.attempts = attempt;
        if ((rc = ops->decoder_new(&a.d, o->payload)) != 0)
            goto cleanup;
        rc = loom__http_perform(o->pool, hreq, &hr);
        rc = outcome(&a, rc, &hr, resp, &retry);
        if (rc == 0 || !retry || attempt > o->max_retries ||
            ops->output_started(a.d))
            break;
        delay =
            loom__retry_after(hr.retry_after_ms, hr.retry_after, time(NULL));
        if (delay < 0 && o->body_retry_after && hr.status >= 300)
            delay = o->body_retry_after(loom_buf_cstr(&hr.body), hr.body.len);
        if (delay > LOOM_RETRY_MAX_HONOURED_MS) {
            loom_warn("%s: server asks to retry in %ld ms, more than %ld: "
                      "not retrying",
                      o->name, delay, LOOM_RETRY_MAX_HONOURED_MS);
            break;
        }
        if (delay < 0)
            delay = loom__retry_backoff(attempt, o->base_delay_ms,
                                        o->max_delay_ms, &seed);
        loom_warn("%s: %s: %s; retry %d of %d in %ld ms", o->name,
                  loom_upstream_kind_name(resp->error.kind),
                  resp->error.message ? resp->error.message : "", attempt,
                  o->max_retries, delay);
        if ((rc = loom__retry_sleep(delay, hreq->cancel)) != 0)
            goto cleanup;
    }
    if (rc == LOOM_EUPSTREAM || rc == LOOM_ETIMEDOUT || rc == LOOM_EPROTO)
        rc = raise_error(o->name, &resp->error, rc);
    else if (rc == LOOM_ETOOLARGE)
        rc = prefix_error(o->name, rc);

cleanup:
    if (a.d && ops->export_to(a.d, resp) != 0 && rc == 0)
        rc = LOOM_ENOMEM;
    if (!resp->text && !(resp->text = strdup("")) && rc == 0)
        rc = loom__error_oom();
    if (a.d)
        ops->decoder_free(a.d);
    loom__http_response_clear(&hr);
    loom_buf_free(&a.json);
    return rc;
}

json_t *loom__llm_json_string(const char *s)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    json_t *j;
    size_t i = 0, run = 0, n;
    int bad = 0;

    if ((j = json_string((const char *)p)) != NULL)
        return j;
    /* Written by hand: jansson has no lossy mode. */
    while (!bad && p[i]) {
        if ((n = loom__llm_utf8_seq(p + i, 4)) != 0) {
            i += n;
            continue;
        }
        bad = (i > run && loom_buf_put(&b, p + run, i - run)) ||
              loom_buf_put(&b, "\xEF\xBF\xBD", 3);
        run = ++i;
    }
    if (!bad && i > run)
        bad = loom_buf_put(&b, p + run, i - run) != 0;
    j = bad ? NULL : json_string(loom_buf_cstr(&b));
    loom_buf_free(&b);
    return j;
}

int loom__llm_put(json_t *o, const char *key, json_t *v)
{
    return v ? json_object_set_new(o, key, v) : -1;
}

const char *loom__llm_jstr(const json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

/* ---- upstream errors -------------------------------------------------- */

void loom__upstream_error_clear(loom_upstream_error *err)
{
    int attempts = err->attempts;

    free(err->type);
    free(err->message);
    free(err->request_id);
    json_decref(err->headers);
    memset(err, 0, sizeof(*err));
    err->attempts = attempts;
}

int loom__llm_error_set(loom_upstream_error *err, loom_upstream_kind kind,
                        long status, const char *msg, size_t len,
                        const char *type, const char *request_id)
{
    char num[32];

    loom__upstream_error_clear(err);
    err->kind = kind;
    err->http_status = (int)status;
    if (!msg) {
        snprintf(num, sizeof(num), "HTTP %ld", status);
        msg = num;
        len = strlen(num);
    }
    err->message = strndup(msg, len);
    if (type)
        err->type = strdup(type);
    if (request_id)
        err->request_id = strdup(request_id);
    if (!err->message || (type && !err->type) ||
        (request_id && !err->request_id))
        return loom__error_oom();
    return 0;
}

loom_upstream_kind loom__llm_status_kind(long status)
{
    switch (status) {
    case 400:
        return LOOM_UPSTREAM_BAD_REQUEST;
    case 401:
        return LOOM_UPSTREAM_AUTH;
    case 403:
        return LOOM_UPSTREAM_PERMISSION;
    case 404:
        return LOOM_UPSTREAM_NOT_FOUND;
    case 408:
        return LOOM_UPSTREAM_TIMEOUT;
    case 409:
        return LOOM_UPSTREAM_CONFLICT;
    case 413:
        return LOOM_UPSTREAM_TOO_LARGE;
    case 422:
        return LOOM_UPSTREAM_UNPROCESSABLE;
    case 429:
        return LOOM_UPSTREAM_RATE_LIMIT;
    default:
        break;
    }
    if (status >= 200 && status < 300)
        return LOOM_UPSTREAM_NONE;
    if (status >= 500 && status < 600)
        return LOOM_UPSTREAM_SERVER;
    if (status >= 400 && status < 500)
        return LOOM_UPSTREAM_BAD_REQUEST;
    return LOOM_UPSTREAM_PROTOCOL;
}

int loom__llm_status_retryable(long status)
{
    return status == 408 || status == 409 || status == 429 ||
           (status >= 500 && status < 600);
}
