/*
 * HTTP tools declared in config (`http_tools:`, see loom/config.h): each
 * is a fixed URL and method that the model calls with JSON arguments.
 * loom sends the arguments as a JSON body (POST, PUT, PATCH) or as a
 * query string (GET, DELETE), with the configured headers (where secrets
 * come from ${ENV} in the file), and returns "HTTP <status>", the
 * content type and the body as text, cut at max_chars characters.
 *
 * The request goes through the same guarded client as web_fetch
 * (tools/netguard.h): the URL's host is resolved and checked on every
 * call, and a host on a private network needs an allow_hosts entry. The
 * tool follows no redirect: its headers may carry credentials meant for
 * one host only, so a 3xx is returned to the model as it is.
 *
 * Each tool's payload is a copy of its config, built at registration and
 * only read afterwards, so calls may run on many threads at once.
 */
#include "tools/http_tools.h"
#include "core/error.h"
#include "core/utf8.h"
#include "loom/config.h"
#include "loom/mcp.h"
#include "loom/tools.h"
#include "tools/html_text.h"
#include "tools/netguard.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Room kept in the result for the cut marker. */
#define MARKER_RESERVE 200

typedef struct {
    char *name;
    char *method;
    char *url;
    char **headers; /* "Name: value" lines */
    size_t headers_len;
    int body_method; /* POST, PUT, PATCH: arguments in the body */
    loom__net_policy policy;
    long timeout_ms;
    size_t max_bytes;
    long max_chars;
    char user_agent[64];
} http_tool;

static void http_tool_free(void *payload)
{
    http_tool *t = payload;

    if (!t)
        return;
    free(t->name);
    free(t->method);
    free(t->url);
    for (size_t i = 0; i < t->headers_len; i++)
        free(t->headers[i]);
    free(t->headers);
    loom__net_policy_clear(&t->policy);
    free(t);
}

static int tool_fail(loom_buf *out, const http_tool *t, int code)
{
    loom_buf_clear(out);
    loom_buf_printf(out, "%s: %s", t->name, loom_error_last());
    return code;
}

/* Appends key=value, percent-encoded, with '&' before all but the first. */
static int put_pair(loom_buf *q, const char *key, const char *value)
{
    char *k = curl_easy_escape(NULL, key, 0);
    char *v = curl_easy_escape(NULL, value, 0);
    int rc;

    if (!k || !v)
        rc = loom__error_oom();
    else
        rc = loom_buf_printf(q, "%s%s=%s", q->len ? "&" : "", k, v);
    curl_free(k);
    curl_free(v);
    return rc;
}

/* A value as query text: strings as they are, anything else as JSON. */
static int put_value(loom_buf *q, const char *key, const json_t *v)
{
    char *text;
    int rc;

    if (json_is_null(v))
        return 0;
    if (json_is_string(v))
        return put_pair(q, key, json_string_value(v));
    if (!(text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY)))
        return loom__error_oom();
    rc = put_pair(q, key, text);
    free(text);
    return rc;
}

/* The arguments as a query string: one pair per property, a list as the
 * key repeated, nulls left out. */
static int build_query(const json_t *args, loom_buf *q)
{
    const char *key;
    const json_t *v;
    int rc = 0;

    json_object_foreach((json_t *)args, key, v) {
        if (json_is_array(v)) {
            for (size_t i = 0; i < json_array_size(v) && !rc; i++)
                rc = put_value(q, key, json_array_get(v, i));
        } else {
            rc = put_value(q, key, v);
        }
        if (rc)
            break;
    }
    return rc;
}

/* Whether a body of this media type is shown as text. */
static int textual(const char *mt)
{
    size_t n = strlen(mt);

    return !*mt || strncmp(mt, "text/", 5) == 0 ||
           strcmp(mt, "application/json") == 0 ||
           strcmp(mt, "application/xml") == 0 ||
           strcmp(mt, "application/javascript") == 0 ||
           strcmp(mt, "application/x-www-form-urlencoded") == 0 ||
           (n > 5 && (strcmp(mt + n - 5, "+json") == 0 ||
                      strcmp(mt + n - 4, "+xml") == 0));
}

/* "HTTP <status>", the content type and the body, cut at max_chars. */
static int write_result(loom_buf *out, const http_tool *t,
                        const loom__net_response *r)
{
    loom_buf text = LOOM_BUF_INIT(2 * r->body.len + 4096);
    char mt[128], cs[64];
    size_t room, keep, total, shown;
    int rc;

    loom__content_type_parse(r->content_type, mt, sizeof(mt), cs, sizeof(cs));
    if (!textual(mt) || (!*mt && r->body.ptr &&
                         memchr(r->body.ptr, '\0', r->body.len)))
        rc = loom_buf_printf(&text, "(%zu bytes of %s, not shown)",
                             r->body.len, *mt ? mt : "binary data");
    else
        rc = loom__text_to_utf8(r->body.ptr ? r->body.ptr : "", r->body.len,
                                cs[0] ? cs : NULL, &text);
    if (rc)
        goto cleanup;
    if ((rc = loom_buf_printf(out, "HTTP %ld\n", r->status)) != 0 ||
        (r->content_type &&
         (rc = loom_buf_printf(out, "Content-Type: %s\n", mt)) != 0) ||
        (r->location &&
         (rc = loom_buf_printf(out, "Location: %.2048s\n", r->location)) !=
             0) ||
        (rc = loom_buf_puts(out, "\n")) != 0)
        goto cleanup;
    room = out->max > out->len + MARKER_RESERVE
               ? out->max - out->len - MARKER_RESERVE
               : 0;
    keep = loom__utf8_prefix(text.ptr ? text.ptr : "", text.len,
                             (size_t)t->max_chars, room);
    if ((rc = loom_buf_put(out, text.ptr ? text.ptr : "", keep)) != 0)
        goto cleanup;
    if (keep < text.len) {
        total = loom__utf8_count(text.ptr, text.len);
        shown = loom__utf8_count(text.ptr, keep);
        rc = loom_buf_printf(out,
                             "\n[cut: showing the first %zu of %zu "
                             "characters of the body]",
                             shown, total);
    }

cleanup:
    loom_buf_free(&text);
    return rc;
}

static int http_tool_execute(const json_t *args, const loom_tool_ctx *ctx,
                             loom_buf *out, void *payload)
{
    const http_tool *t = payload;
    loom__net_request req;
    loom__net_response resp;
    loom_buf url = LOOM_BUF_INIT(LOOM__NET_MAX_URL + 1);
    loom_buf query = LOOM_BUF_INIT(LOOM__NET_MAX_URL + 1);
    const char **headers = NULL;
    char *body = NULL;
    int rc;

    memset(&resp, 0, sizeof(resp));
    memset(&req, 0, sizeof(req));
    if (args && !json_is_object(args)) {
        rc = tool_fail(out, t, loom__error_set(LOOM_EINVALID,
                                               "arguments must be a JSON "
                                               "object"));
        goto cleanup;
    }
    if ((rc = loom_buf_puts(&url, t->url)) != 0)
        goto too_long;
    if (t->body_method) {
        body = args ? json_dumps(args, JSON_COMPACT) : strdup("{}");
        if (!body) {
            rc = tool_fail(out, t, loom__error_oom());
            goto cleanup;
        }
    } else if (args) {
        if ((rc = build_query(args, &query)) != 0)
            goto too_long;
        if (query.len &&
            ((rc = loom_buf_putc(&url, strchr(t->url, '?') ? '&' : '?')) ||
             (rc = loom_buf_put(&url, query.ptr, query.len))))
            goto too_long;
    }
    if (!(headers = calloc(t->headers_len + 2, sizeof(*headers)))) {
        rc = tool_fail(out, t, loom__error_oom());
        goto cleanup;
    }
    for (size_t i = 0; i < t->headers_len; i++)
        headers[i] = t->headers[i];

    req.method = t->method;
    req.headers = headers;
    req.headers_len = t->headers_len;
    req.body = body;
    req.body_len = body ? strlen(body) : 0;
    req.max_redirects = 0;
    req.max_bytes = t->max_bytes;
    req.timeout_ms = t->timeout_ms;
    req.user_agent = t->user_agent;
    req.cancel = ctx ? ctx->cancel : NULL;
    if ((rc = loom__net_fetch(&t->policy, loom_buf_cstr(&url), &req,
                              &resp)) != 0) {
        rc = tool_fail(out, t, rc);
        goto cleanup;
    }
    loom_buf_clear(out);
    if ((rc = write_result(out, t, &resp)) != 0) {
        rc = tool_fail(out, t, rc);
        goto cleanup;
    }
    /* An error status is a failed call; the model still reads the body,
     * which usually says what was wrong with the arguments. */
    if (resp.status >= 400)
        rc = LOOM_ERROR;
    goto cleanup;

too_long:
    rc = tool_fail(out, t,
                   rc == LOOM_ETOOLARGE
                       ? loom__error_set(LOOM_ETOOLARGE,
                                         "the arguments make the URL longer "
                                         "than %d bytes",
                                         LOOM__NET_MAX_URL)
                       : rc);

cleanup:
    free(headers);
    free(body);
    loom_buf_free(&url);
    loom_buf_free(&query);
    loom__net_response_clear(&resp);
    return rc;
}

/* Builds the payload of tool c; LOOM_EINVALID for a bad allowlist. */
static int payload_new(http_tool **out, const loom_http_tool_config *c)
{
    char what[128];
    http_tool *t;
    const char *name;
    json_t *value;
    size_t n = json_object_size(c->headers), i = 0;
    int rc = 0, has_type = 0, has_accept = 0;

    *out = NULL;
    if (!(t = calloc(1, sizeof(*t))))
        return loom__error_oom();
    loom__net_policy_init(&t->policy);
    t->name = strdup(c->name);
    t->method = strdup(c->method ? c->method : "POST");
    t->url = strdup(c->url);
    t->headers = calloc(n + 2, sizeof(*t->headers));
    if (!t->name || !t->method || !t->url || !t->headers) {
        rc = loom__error_oom();
        goto cleanup;
    }
    t->body_method = strcmp(t->method, "POST") == 0 ||
                     strcmp(t->method, "PUT") == 0 ||
                     strcmp(t->method, "PATCH") == 0;
    t->timeout_ms = c->timeout_ms > 0 ? c->timeout_ms : 30000;
    t->max_bytes = c->max_bytes > 0 ? (size_t)c->max_bytes : (size_t)1 << 20;
    t->max_chars = c->max_chars > 0 ? c->max_chars : 20000;
    snprintf(t->user_agent, sizeof(t->user_agent), "loom/%s",
             loom_version());
    json_object_foreach(c->headers, name, value) {
        const char *v = json_string_value(value);

        if (!v || strpbrk(v, "\r\n") || strpbrk(name, "\r\n: ")) {
            rc = loom__error_set(LOOM_EINVALID,
                                 "http_tools.%s.headers.%s: not a valid "
                                 "header",
                                 c->name, name);
            goto cleanup;
        }
        has_type |= strcasecmp(name, "Content-Type") == 0;
        has_accept |= strcasecmp(name, "Accept") == 0;
        if (asprintf(&t->headers[i], "%s: %s", name, v) < 0) {
            t->headers[i] = NULL;
            rc = loom__error_oom();
            goto cleanup;
        }
        t->headers_len = ++i;
    }
    if ((t->body_method && !has_type &&
         !(t->headers[t->headers_len++] =
               strdup("Content-Type: application/json"))) ||
        (!has_accept &&
         !(t->headers[t->headers_len++] =
               strdup("Accept: application/json, text/*;q=0.9, "
                      "*/*;q=0.1")))) {
        rc = loom__error_oom();
        goto cleanup;
    }
    snprintf(what, sizeof(what), "http_tools.%s", c->name);
    for (i = 0; i < c->allow_hosts_len && !rc; i++)
        rc = loom__net_policy_allow(&t->policy, c->allow_hosts[i], what);

cleanup:
    if (rc)
        http_tool_free(t);
    else
        *out = t;
    return rc;
}

int loom__tools_add_http_tools(loom_tool_registry *reg, const loom_config *cfg)
{
    if (!reg || !cfg)
        return loom__error_set(LOOM_EINVALID,
                               "loom_tools_add_from_config: NULL argument");
    for (size_t i = 0; i < cfg->http_tools_len; i++) {
        const loom_http_tool_config *c = &cfg->http_tools[i];
        loom_tool tool = {0};
        http_tool *t = NULL;
        json_t *params = NULL;
        int rc;

        if ((rc = payload_new(&t, c)) != 0)
            return rc;
        /* A copy: the config may be freed while the registry lives. */
        if (c->parameters && !(params = json_deep_copy(c->parameters))) {
            http_tool_free(t);
            return loom__error_oom();
        }
        tool.name = c->name;
        tool.description = c->description;
        tool.parameters = params;
        tool.execute = http_tool_execute;
        tool.payload = t;
        tool.free_payload = http_tool_free;
        rc = loom_tool_registry_add(reg, &tool);
        json_decref(params);
        if (rc) {
            http_tool_free(t);
            return rc;
        }
    }
    return 0;
}

int loom_tools_add_from_config(loom_tool_registry *reg, const loom_config *cfg)
{
    int rc = loom__tools_add_http_tools(reg, cfg);

    return rc ? rc : loom_tools_add_mcp(reg, cfg);
}
