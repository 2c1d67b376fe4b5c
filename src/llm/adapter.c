/*
 * The provider object of the HTTP model adapters (see llm/adapter.h): how
 * a provider is made from its config (URL, header lines, timeouts, retry
 * policy, connection pool), freed, and how it makes one model call. The
 * four adapters were written apart and each had its own copy of all this;
 * what differs between them (the key header, the body, the decoder) is in
 * their loom__llm_adapter_spec, so that the rest can live here once.
 */
#include "llm/adapter.h"
#include "core/error.h"
#include "llm/answer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- one model call ---------------------------------------------------- */

static int adapter_complete(loom_provider *base, const loom_llm_request *req,
                            loom_llm_event_cb cb, void *payload,
                            loom_llm_response *resp, loom_cancel *cancel)
{
    loom__llm_adapter *a = (loom__llm_adapter *)base;
    const loom__llm_adapter_spec *s = a->spec;
    loom__llm_decoder_args da = {a, 0, cb, payload};
    loom__llm_attempts_opts o = {0};
    loom__http_request hreq = {0};
    loom_buf own = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    loom_buf *body = &own;
    json_t *j = NULL;
    char *url = NULL;
    int rc;

    resp->error.attempts = 0;
    if ((rc = loom_llm_params_check(req->params, a->base.name, s->kind,
                                    NULL)) != 0)
        goto cleanup;
    if (s->build_json) {
        if ((rc = s->build_json(&j, req)) == 0)
            rc = loom__llm_put_json_text(&own, j);
    } else {
        rc = s->build_text(a, req, &body);
    }
    if (rc != 0 || (s->request_url && (rc = s->request_url(a, req, &url))))
        goto cleanup;
    da.arg = s->decoder_arg ? s->decoder_arg(req) : 0;
    hreq.method = "POST";
    hreq.url = url ? url : a->url;
    hreq.headers = req->stream ? a->stream_headers : a->json_headers;
    hreq.headers_len = a->request_headers_len;
    hreq.body = body->ptr;
    hreq.body_len = body->len;
    hreq.connect_timeout_ms = a->connect_ms;
    /* A whole answer sends its first byte when the model is done. */
    hreq.first_byte_timeout_ms = req->stream ? a->first_byte_ms : a->answer_ms;
    hreq.idle_timeout_ms = a->idle_ms;
    hreq.max_body = s->max_body(a);
    hreq.cancel = cancel;
    o.name = a->base.name;
    o.pool = a->pool;
    o.http = &hreq;
    o.stream = req->stream;
    o.max_json_body = hreq.max_body;
    o.max_retries = a->max_retries;
    o.base_delay_ms = a->base_delay_ms;
    o.max_delay_ms = a->max_delay_ms;
    o.ops = &a->ops;
    o.payload = &da;
    o.body_retry_after = s->body_retry_after;
    rc = loom__llm_attempts(&o, resp);

cleanup:
    if (!resp->text && !(resp->text = strdup("")) && rc == 0)
        rc = loom__error_oom();
    json_decref(j);
    free(url);
    loom_buf_free(&own);
    return rc;
}

static void adapter_free(loom_provider *base)
{
    loom__llm_adapter *a = (loom__llm_adapter *)base;

    loom__http_pool_free(a->pool);
    for (size_t i = 0; i < a->nlines; i++)
        free(a->lines[i]);
    free(a->lines);
    free(a->stream_headers);
    free(a->json_headers);
    free(a->url);
    free(a->base.name);
    free(a);
}

static const loom_provider_vtable adapter_vtable = {
    .version = LOOM_PROVIDER_VTABLE_VERSION,
    .complete = adapter_complete,
    .free = adapter_free};

int loom__llm_request_check(const loom_llm_request *req)
{
    if (!req->model || !*req->model)
        return loom__error_set(LOOM_EINVALID, "request has no model");
    if (req->tools_len && req->tool_choice.kind == LOOM_TOOL_CHOICE_FUNCTION &&
        (!req->tool_choice.function || !*req->tool_choice.function))
        return loom__error_set(LOOM_EINVALID, "tool choice names no function");
    return 0;
}

static int dump_to_buf(const char *s, size_t len, void *payload)
{
    return loom_buf_put(payload, s, len) ? -1 : 0;
}

int loom__llm_put_json_text(loom_buf *b, const json_t *v)
{
    if (json_dump_callback(v, dump_to_buf, b,
                           JSON_COMPACT | JSON_REAL_PRECISION(15) |
                               JSON_ENCODE_ANY) != 0)
        return loom__error_oom();
    return 0;
}

/* ---- making one ---------------------------------------------------------- */

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

static int add_line(loom__llm_adapter *a, const char *name, const char *prefix,
                    const char *value)
{
    char *line;

    if (asprintf(&line, "%s: %s%s", name, prefix, value) < 0)
        return loom__error_oom();
    a->lines[a->nlines++] = line;
    return 0;
}

/* loom's own lines (each left out when the config names it), then the
 * config's, then the two request lists with their Accept. */
static int build_headers(loom__llm_adapter *a, const loom_provider_config *c)
{
    const loom__llm_adapter_spec *s = a->spec;
    const char *name = a->base.name;
    const json_t *h = json_is_object(c->headers) ? c->headers : NULL;
    const char *const *own = s->headers;
    size_t n = json_object_size(h) + 3;
    const char *k;
    json_t *v;
    char ua[64], num[32];
    int rc = 0;

    for (size_t i = 0; own && own[i]; i += 2)
        n++;
    if (!(a->lines = calloc(n, sizeof(*a->lines))))
        return loom__error_oom();
    if (c->api_key && *c->api_key &&
        !loom__llm_config_has_header(h, s->key_header)) {
        if (strpbrk(c->api_key, "\r\n"))
            return loom__error_set(
                LOOM_EINVALID, "provider '%s': api_key has a line break", name);
        if ((rc = add_line(a, s->key_header, s->key_prefix, c->api_key)))
            return rc;
    }
    for (size_t i = 0; own && own[i]; i += 2)
        if (!loom__llm_config_has_header(h, own[i]) &&
            (rc = add_line(a, own[i], "", own[i + 1])))
            return rc;
    if (!loom__llm_config_has_header(h, "Content-Type") &&
        (rc = add_line(a, "Content-Type", "", "application/json")))
        return rc;
    snprintf(ua, sizeof(ua), "loom/%s", loom_version());
    if (!loom__llm_config_has_header(h, "User-Agent") &&
        (rc = add_line(a, "User-Agent", "", ua)))
        return rc;
    json_object_foreach((json_t *)h, k, v)
    {
        const char *str = json_string_value(v);
        if (json_is_integer(v)) {
            snprintf(num, sizeof(num), "%lld",
                     (long long)json_integer_value(v));
            str = num;
        }
        if (!str || !loom__llm_header_ok(k, str))
            return loom__error_set(LOOM_EINVALID,
                                   "provider '%s': header '%s' must be a "
                                   "token name with a one-line string value",
                                   name, k);
        if ((rc = add_line(a, k, "", str)))
            return rc;
    }
    a->stream_headers = calloc(a->nlines + 1, sizeof(char *));
    a->json_headers = calloc(a->nlines + 1, sizeof(char *));
    if (!a->stream_headers || !a->json_headers)
        return loom__error_oom();
    for (size_t i = 0; i < a->nlines; i++)
        a->stream_headers[i] = a->json_headers[i] = a->lines[i];
    a->request_headers_len = a->nlines;
    if (!loom__llm_config_has_header(h, "Accept")) {
        a->stream_headers[a->nlines] = "Accept: text/event-stream";
        a->json_headers[a->nlines] = "Accept: application/json";
        a->request_headers_len++;
    }
    return 0;
}

/* The adapter's URL (see loom__llm_adapter_spec.path). */
static int make_url(loom__llm_adapter *a, const char *base)
{
    const loom__llm_adapter_spec *s = a->spec;
    size_t n = strlen(base), v = s->version ? strlen(s->version) : 0;
    int has_version;

    if (!s->path)
        return *base && !(a->url = strdup(base)) ? loom__error_oom() : 0;
    while (n > 0 && base[n - 1] == '/')
        n--;
    /* A base URL that already names the version is not given another. */
    has_version = v && n > v && base[n - v - 1] == '/' &&
                  strncmp(base + n - v, s->version, v) == 0;
    if (asprintf(&a->url, "%.*s%s%s%s", (int)n, base,
                 v && !has_version ? "/" : "",
                 v && !has_version ? s->version : "", s->path) < 0) {
        a->url = NULL;
        return loom__error_oom();
    }
    return 0;
}

int loom__llm_adapter_new(loom_provider **out, size_t size,
                          const loom__llm_adapter_spec *spec,
                          const loom_provider_config *config)
{
    const char *name = config->name ? config->name : spec->kind;
    const char *base = config->base_url && *config->base_url
                           ? config->base_url
                           : spec->default_base_url;
    loom__llm_adapter *a;
    int rc;

    *out = NULL;
    if (spec->path && !base)
        return loom__error_set(LOOM_EINVALID, "provider '%s': no base_url",
                               name);
    if (!(a = calloc(1, size)))
        return loom__error_oom();
    a->base.vt = &adapter_vtable;
    a->spec = spec;
    a->ops.decoder_new = spec->decoder_new;
    a->ops.decoder_free = loom__llm_answer_free;
    a->ops.feed = loom__llm_answer_feed;
    a->ops.finish = loom__llm_answer_finish;
    a->ops.complete = loom__llm_answer_complete;
    a->ops.output_started = loom__llm_answer_output_started;
    a->ops.error = loom__llm_answer_error_of;
    a->ops.export_to = loom__llm_answer_export;
    a->ops.error_from_http = spec->error_from_http;
    a->ops.status_retryable = loom__llm_status_retryable;
    a->ops.stream_error_retryable = spec->stream_error_retryable;
    if (!(a->base.name = strdup(name))) {
        rc = loom__error_oom();
        goto fail;
    }
    if ((rc = make_url(a, base ? base : "")) != 0 ||
        (rc = build_headers(a, config)) != 0)
        goto fail;
    a->connect_ms = config->connect_timeout_ms;
    a->first_byte_ms = config->first_byte_timeout_ms;
    a->answer_ms = config->answer_timeout_ms ? config->answer_timeout_ms
                                             : config->first_byte_timeout_ms;
    a->idle_ms = config->idle_timeout_ms;
    a->max_retries = config->max_retries > 0 ? config->max_retries : 0;
    a->base_delay_ms = config->retry_base_delay_ms;
    a->max_delay_ms = config->retry_max_delay_ms;
    if ((rc = loom__http_pool_new(&a->pool)) != 0)
        goto fail;
    *out = &a->base;
    return 0;

fail:
    adapter_free(&a->base);
    return rc;
}
