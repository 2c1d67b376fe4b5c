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

/* Frees err's strings and zeroes it, keeping the attempt count. */
static void clear_error(loom_upstream_error *err)
{
    int attempts = err->attempts;

    free(err->type);
    free(err->message);
    free(err->request_id);
    memset(err, 0, sizeof(*err));
    err->attempts = attempts;
}

static int set_error(loom_upstream_error *err, loom_upstream_kind kind,
                     long status, const char *msg, const char *type,
                     const char *request_id)
{
    clear_error(err);
    err->kind = kind;
    err->http_status = (int)status;
    err->message = strdup(msg ? msg : "");
    if (type)
        err->type = strdup(type);
    if (request_id)
        err->request_id = strdup(request_id);
    if (!err->message || (type && !err->type) ||
        (request_id && !err->request_id))
        return loom__error_oom();
    return 0;
}

/* Sets the thread's error message for err and returns code. */
static int raise_error(const char *name, const loom_upstream_error *err,
                       int code)
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
static int prefix_error(const char *name, int code)
{
    char msg[1024];

    snprintf(msg, sizeof(msg), "%s", loom_error_last());
    return loom__error_set(code, "%s: %s", name, msg);
}

/*
 * Classifies the outcome of one attempt. Returns 0 on success, or the
 * error to return, with resp->error filled and *retry set when another
 * attempt may help.
 */
static int outcome(attempt_ctx *a, int rc, const loom__http_response *hr,
                   loom_llm_response *resp, int *retry)
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
            clear_error(err);
            return 0;
        }
    } else if (rc == 0) {
        if (ops->error_from_http(err, hr->status, loom_buf_cstr(&hr->body),
                                 hr->body.len, hr->request_id))
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
    loom__http_request hreq = *o->http;
    loom__http_response hr = {0};
    attempt_ctx a = {0};
    unsigned seed;
    int rc, retry;
    long delay;

    resp->error.attempts = 0;
    seed = (unsigned)loom__http_now_ms() ^ (unsigned)(uintptr_t)&seed;
    loom_buf_init(&a.json,
                  o->max_json_body ? o->max_json_body : LOOM_BUF_UNLIMITED);
    a.ops = ops;
    a.stream = o->stream;
    a.hr = &hr;
    hreq.on_body = o->stream ? on_body : NULL;
    hreq.payload = &a;

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
        rc = loom__http_perform(o->pool, &hreq, &hr);
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
        if ((rc = loom__retry_sleep(delay, hreq.cancel)) != 0)
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

/* The length of the valid UTF-8 sequence at p (NUL-terminated), 0 when
 * the byte at p does not start one; the rules are jansson's. */
static size_t utf8_len(const unsigned char *p)
{
    unsigned c = p[0];
    unsigned long cp;
    size_t n;

    if (c < 0x80)
        return 1;
    n = c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
    if (!n)
        return 0;
    cp = c & (0x7Fu >> n);
    for (size_t k = 1; k < n; k++) {
        /* The NUL terminator is no continuation byte: no overread. */
        if ((p[k] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[k] & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
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
        if ((n = utf8_len(p + i)) != 0) {
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

int loom__llm_header_ok(const char *name, const char *value)
{
    if (!*name)
        return 0;
    for (const char *s = name; *s; s++)
        if (*s <= ' ' || *s >= 127 || strchr("\"(),/:;<=>?@[\\]{}", *s))
            return 0;
    return strpbrk(value, "\r\n") == NULL;
}

int loom__llm_config_has_header(const json_t *headers, const char *name)
{
    const char *k;
    json_t *v;

    json_object_foreach((json_t *)headers, k, v)
    {
        if (strcasecmp(k, name) == 0)
            return 1;
    }
    return 0;
}
