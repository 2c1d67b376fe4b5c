/*
 * The HTTP layer over libmicrohttpd: the router, the per-request context
 * (body buffered up to max_body_bytes, the JSON parse, headers to add),
 * the dispatcher that libmicrohttpd calls, reply helpers with OpenAI-
 * shaped errors, requests deferred until their run ends, and the one log
 * line and metrics sample per request when it completes.
 *
 * libmicrohttpd calls the access handler several times per request:
 * once with the headers (an oversized Content-Length is refused right
 * there with 413, before any body is read), once per piece of body, once
 * when the request is complete (the route's handler runs then), and again
 * after a deferred request is resumed.
 *
 * The first of those calls also lifts the connection's timeout from the
 * short header timeout the daemon starts every connection with to
 * read_timeout_ms: a slow-loris that never finishes its headers is cut
 * early, a body or a stream is not.
 *
 * A request whose run finds every slot taken waits in the admission
 * queue (queue.c), suspended; once a slot is handed over its handler
 * runs again from the start (its body, parse and caller kept), and when
 * its wait is over it gets 503 with Retry-After.
 *
 * HEAD is GET without the body (libmicrohttpd sends the headers of the
 * GET answer only); a path that exists with other methods answers 405
 * with an Allow header listing them (RFC 9110, 15.5.6). A request counts
 * as pending on the server from the moment its handler runs until it
 * completes, so a graceful stop can wait until every answer is out.
 */
#include "core/clock.h"
#include "core/error.h"
#include "core/text.h"
#include "core/utf8.h"
#include "loom/log.h"
#include "server/srvpriv.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define MAX_ROUTE_SEGMENTS 8
#define MAX_REPLY_HEADERS 32
#define MAX_LOG_PATH 200
#define MAX_ALLOW 96 /* "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS" */
#define JSON_ERROR_SHOWN 256

/* ---- the router ---------------------------------------------------------- */

typedef struct {
    char *method;
    char *tmpl;
    char *segs[MAX_ROUTE_SEGMENTS]; /* "{...}" segments are params */
    unsigned char param[MAX_ROUTE_SEGMENTS]; /* is_param(segs[i]) */
    size_t nseg;
    size_t nparams;
    int tail; /* the last segment is "{name...}" */
    srv_handler handler;
} route;

struct srv_router {
    route *routes;
    size_t len, cap;
};

int srv__router_new(srv_router **out)
{
    *out = calloc(1, sizeof(**out));
    return *out ? 0 : loom__error_oom();
}

static void route_clear(route *r)
{
    free(r->method);
    free(r->tmpl);
    for (size_t i = 0; i < r->nseg; i++)
        free(r->segs[i]);
}

void srv__router_free(srv_router *rt)
{
    if (!rt)
        return;
    for (size_t i = 0; i < rt->len; i++)
        route_clear(&rt->routes[i]);
    free(rt->routes);
    free(rt);
}

static int is_param(const char *seg)
{
    size_t n = strlen(seg);
    return n >= 3 && seg[0] == '{' && seg[n - 1] == '}';
}

/* "{name...}": a last segment that takes the rest of the path. */
static int is_tail(const char *seg)
{
    size_t n = strlen(seg);
    return is_param(seg) && n >= 6 && strcmp(seg + n - 4, "...}") == 0;
}

int srv_route(srv_router *rt, const char *method, const char *tmpl,
              srv_handler handler)
{
    route r;
    const char *p;

    if (!rt || !method || !tmpl || tmpl[0] != '/' || !handler)
        return loom__error_set(LOOM_EINVALID, "srv_route: bad arguments");
    for (size_t i = 0; i < rt->len; i++)
        if (!strcmp(rt->routes[i].method, method) &&
            !strcmp(rt->routes[i].tmpl, tmpl))
            return loom__error_set(LOOM_EEXISTS, "route %s %s exists",
                                   method, tmpl);
    memset(&r, 0, sizeof(r));
    r.handler = handler;
    if (!(r.method = strdup(method)) || !(r.tmpl = strdup(tmpl)))
        goto oom;
    p = tmpl + 1;
    while (*p) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (r.nseg == MAX_ROUTE_SEGMENTS) {
            route_clear(&r);
            return loom__error_set(LOOM_EINVALID, "route %s: too many "
                                   "segments", tmpl);
        }
        if (!(r.segs[r.nseg] = strndup(p, n)))
            goto oom;
        if ((r.param[r.nseg] = (unsigned char)is_param(r.segs[r.nseg])))
            r.nparams++;
        r.nseg++;
        p += n;
        if (*p == '/')
            p++;
        if (is_tail(r.segs[r.nseg - 1]) && *p) {
            route_clear(&r);
            return loom__error_set(LOOM_EINVALID,
                                   "route %s: {name...} must "
                                   "be the last segment",
                                   tmpl);
        }
    }
    r.tail = r.nseg && is_tail(r.segs[r.nseg - 1]);
    if (r.nparams > SRV_MAX_PARAMS) {
        route_clear(&r);
        return loom__error_set(LOOM_EINVALID, "route %s: too many params",
                               tmpl);
    }
    if (rt->len == rt->cap) {
        size_t c = rt->cap ? rt->cap * 2 : 16;
        route *nr = realloc(rt->routes, c * sizeof(*nr));
        if (!nr)
            goto oom;
        rt->routes = nr;
        rt->cap = c;
    }
    rt->routes[rt->len++] = r;
    return 0;

oom:
    route_clear(&r);
    return loom__error_oom();
}

/* Splits path (a writable copy) into segments; 0 when too many. */
static size_t split_path(char *path, char **segs)
{
    size_t n = 0;
    char *p = path + (path[0] == '/');

    if (!*p)
        return 0;
    for (;;) {
        char *slash = strchr(p, '/');
        if (n == MAX_ROUTE_SEGMENTS)
            return (size_t)-1;
        segs[n++] = p;
        if (!slash)
            break;
        *slash = '\0';
        p = slash + 1;
    }
    return n;
}

static int route_matches(const route *r, char **segs, size_t n)
{
    if (r->tail ? n < r->nseg : r->nseg != n)
        return 0;
    for (size_t i = 0; i < r->nseg; i++) {
        if (r->param[i] ? !*segs[i] : strcmp(r->segs[i], segs[i]))
            return 0;
    }
    return 1;
}

/* ---- requests ------------------------------------------------------------ */

enum { ST_NEW = 0, ST_HANDLED, ST_QUEUED, ST_DEFER, ST_DONE };

typedef struct {
    char *name, *value;
} kv;

typedef struct srv_conn {
    srv_request req;
    srv_server *s;
    struct MHD_Connection *mc;
    double start; /* seconds, monotonic */
    char *method, *path, *segbuf;
    loom_buf body;
    int too_large;
    size_t discarded;
    const route *route;
    /* req.json_error's text (JSON_ERROR_SHOWN bytes), made for a body
     * that does not parse. */
    char *json_error;
    int method_mismatch; /* the path exists with another method */
    const route *other;  /* then its route, for the metrics' label */
    /* The methods it exists with (MAX_ALLOW bytes), made for a 405:
     * a connection lives as long as its stream, so what only an error
     * needs is not kept in it. */
    char *allow;
    int state;
    int counted; /* in the server's pending requests */
    srv_identity who; /* the caller, once authenticated */
    int replied;
    unsigned status;
    char run_id[48];
    kv hdrs[MAX_REPLY_HEADERS];
    size_t nhdrs;
    size_t nhdrs_auth; /* those set before the handler ran */
    /* waiting for a run slot */
    srv_waiter wait;
    int waited; /* has been in the admission queue */
    /* deferred */
    srv_susp susp;
    srv_run *drun;
    srv_task *dtask; /* instead of drun (srv_defer_task) */
    srv_task_done_fn tdone;
    srv_done_fn done;
    srv_ready_fn dready;
    void *dpayload;
    void (*dfree)(void *);
    int watching;
    /* streamed */
    struct srv_sse_stream *sse;
    struct srv_conn *next_spare; /* on the server's spare list */
} srv_conn;

/*
 * Request contexts are kept for reuse, a few at a time: one is larger
 * than malloc's per-thread cache takes, so each calloc and free of it
 * went through the main heap (and consolidated its small free blocks).
 * Made and dropped on the polling thread only, so the list needs no
 * lock; loom_server_free frees it.
 */
#define CONN_SPARES 64

/* A zeroed request context. */
static srv_conn *conn_alloc(srv_server *s)
{
    srv_conn *c = s->conn_spare;

    if (!c)
        return calloc(1, sizeof(*c));
    s->conn_spare = c->next_spare;
    s->nconn_spare--;
    memset(c, 0, sizeof(*c));
    return c;
}

/* Gives c's memory back (its contents are freed already). */
static void conn_release(srv_server *s, srv_conn *c)
{
    if (s->nconn_spare >= CONN_SPARES) {
        free(c);
        return;
    }
    c->next_spare = s->conn_spare;
    s->conn_spare = c;
    s->nconn_spare++;
}

void srv__conn_spares_free(srv_server *s)
{
    while (s->conn_spare) {
        srv_conn *c = s->conn_spare;
        s->conn_spare = c->next_spare;
        free(c);
    }
    s->nconn_spare = 0;
}

static void conn_free(srv_conn *c)
{
    if (!c)
        return;
    if (c->waited)
        srv__queue_leave(c->s, &c->wait);
    if (c->watching)
        srv__run_unwatch(c->drun, &c->susp);
    srv_run_unref(c->drun);
    if (c->dtask)
        srv__task_unwatch(c->dtask);
    srv_task_unref(c->dtask);
    if (c->dfree)
        c->dfree(c->dpayload);
    for (size_t i = 0; i < c->nhdrs; i++) {
        free(c->hdrs[i].name);
        free(c->hdrs[i].value);
    }
    json_decref(c->req.json);
    srv__identity_clear(&c->who);
    loom_buf_free(&c->body);
    free(c->method);
    free(c->path);
    free(c->segbuf);
    free(c->json_error);
    free(c->allow);
    conn_release(c->s, c);
}

/* Adds method to the comma-separated list allow, once. */
static void allow_add(char *allow, const char *method)
{
    size_t n = strlen(allow), m = strlen(method);
    const char *p = allow;

    while ((p = strstr(p, method)) != NULL) {
        if ((p == allow || p[-1] == ' ') && (p[m] == ',' || !p[m]))
            return;
        p += m;
    }
    if (n + m + 3 > MAX_ALLOW)
        return; /* routes use the few standard methods: never happens */
    snprintf(allow + n, MAX_ALLOW - n, "%s%s", n ? ", " : "", method);
}

/* The methods the path segs has routes for, into c->allow (for a 405;
 * GET brings HEAD). */
static void allowed_methods(srv_conn *c, char **segs, size_t n)
{
    srv_router *rt = c->s->router;

    if (!c->allow && !(c->allow = calloc(1, MAX_ALLOW)))
        return; /* the 405 then names none */
    for (size_t i = 0; i < rt->len; i++) {
        const route *r = &rt->routes[i];
        if (!route_matches(r, segs, n))
            continue;
        allow_add(c->allow, r->method);
        if (!strcmp(r->method, "GET"))
            allow_add(c->allow, "HEAD");
    }
}

/* Finds the route (HEAD takes GET's); fills params, and the methods the
 * path has when none matches. */
static int match(srv_conn *c)
{
    srv_router *rt = c->s->router;
    char *segs[MAX_ROUTE_SEGMENTS];
    size_t n;
    const route *best = NULL;
    const char *method = strcmp(c->method, "HEAD") ? c->method : "GET";

    if (!(c->segbuf = strdup(c->path)))
        return loom__error_oom();
    n = split_path(c->segbuf, segs);
    if (n == (size_t)-1)
        return 0;
    for (size_t i = 0; i < rt->len; i++) {
        const route *r = &rt->routes[i];
        if (!route_matches(r, segs, n))
            continue;
        if (strcmp(r->method, method) != 0) {
            c->method_mismatch = 1;
            if (!c->other || r->nparams < c->other->nparams)
                c->other = r;
            continue;
        }
        if (!best || r->nparams < best->nparams)
            best = r;
    }
    if (!best) {
        if (c->method_mismatch)
            allowed_methods(c, segs, n);
        return 0;
    }
    c->route = best;
    c->req.route = best->tmpl;
    for (size_t i = 0; i < best->nseg; i++)
        if (best->param[i])
            c->req.params[c->req.nparams++] = segs[i];
    /* A tail param runs to the end: put its slashes back. */
    for (size_t i = best->nseg; i < n; i++)
        *(segs[i] - 1) = '/';
    return 0;
}

static srv_conn *conn_new(srv_server *s, struct MHD_Connection *mc,
                          const char *url, const char *method)
{
    srv_conn *c = conn_alloc(s);

    if (!c)
        return NULL;
    c->s = s;
    c->mc = mc;
    c->start = loom__mono_ms_exact() / 1e3;
    loom_buf_init(&c->body, (size_t)s->sc->max_body_bytes);
    c->method = strdup(method);
    c->path = strdup(url);
    if (!c->method || !c->path || match(c) != 0) {
        conn_free(c);
        return NULL;
    }
    c->req.srv = s;
    c->req.method = c->method;
    c->req.path = c->path;
    c->req.body = "";
    c->req.who = &c->who;
    c->req.conn_ = c;
    return c;
}

const char *srv_query(const srv_request *r, const char *key)
{
    return MHD_lookup_connection_value(r->conn_->mc, MHD_GET_ARGUMENT_KIND,
                                       key);
}

int srv_query_long(srv_request *r, const char *key, long lo, long hi, long *out)
{
    const char *s = srv_query(r, key);
    char *end;
    long v;

    if (!s)
        return 1;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end || !*s || v < lo || v > hi) {
        srv_reply_error(r, 400, NULL, key, "invalid_value",
                        "%s must be an integer from %ld to %ld", key, lo, hi);
        return 0;
    }
    *out = v;
    return 1;
}

const char *srv_header(const srv_request *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn_->mc, MHD_HEADER_KIND, name);
}

int srv_set_header(srv_request *r, const char *name, const char *value)
{
    srv_conn *c = r->conn_;
    kv *h;

    if (!name || !value || strpbrk(name, "\r\n: ") || strpbrk(value, "\r\n"))
        return loom__error_set(LOOM_EINVALID, "bad header '%s'",
                               name ? name : "");
    if (c->nhdrs == MAX_REPLY_HEADERS)
        return loom__error_set(LOOM_ETOOLARGE, "too many reply headers");
    h = &c->hdrs[c->nhdrs];
    h->name = strdup(name);
    h->value = strdup(value);
    if (!h->name || !h->value) {
        free(h->name);
        free(h->value);
        return loom__error_oom();
    }
    c->nhdrs++;
    return 0;
}

void srv_pass_rate_headers(srv_request *r, const json_t *failure)
{
    const json_t *e = json_object_get(failure, "error");
    json_t *h = json_object_get(e, "headers");
    const char *name, *s;
    json_t *v;
    size_t n = 0;

    json_object_foreach(h, name, v)
    {
        s = json_string_value(v);
        if (n < LOOM__RATE_HEADERS_MAX && s &&
            loom__text_is_rate_header(name, strlen(name), s, strlen(s)) &&
            srv_set_header(r, name, s) == 0)
            n++;
    }
}

void srv_request_set_run(srv_request *r, const char *run_id)
{
    snprintf(r->conn_->run_id, sizeof(r->conn_->run_id), "%s",
             run_id ? run_id : "");
}

struct MHD_Connection *srv__request_mc(srv_request *r)
{
    return r->conn_->mc;
}

void srv__request_set_stream(srv_request *r, struct srv_sse_stream *st)
{
    r->conn_->sse = st;
}

srv_waiter *srv__request_waiter(srv_request *r)
{
    return &r->conn_->wait;
}

srv_susp *srv__request_susp(srv_request *r)
{
    srv_conn *c = r->conn_;

    memset(&c->susp, 0, sizeof(c->susp));
    c->susp.mc = c->mc;
    c->susp.fd = srv__conn_fd(c->mc);
    c->susp.srv = c->s;
    return &c->susp;
}

/* ---- CORS ---------------------------------------------------------------- */

/* Headers a page's script may send and read (the SDKs' and loom's). */
#define CORS_ALLOW_HEADERS                                                     \
    "Authorization, Content-Type, Last-Event-ID, X-Loom-User, "                \
    "X-Loom-Conversation-Id, X-Loom-Continue, X-Loom-Server-Calls, "           \
    "OpenAI-Organization, OpenAI-Project, X-Stainless-Arch, "                  \
    "X-Stainless-Lang, X-Stainless-OS, X-Stainless-Package-Version, "          \
    "X-Stainless-Retry-Count, X-Stainless-Runtime, "                           \
    "X-Stainless-Runtime-Version, X-Stainless-Timeout"
#define CORS_EXPOSE_HEADERS                                                    \
    "X-Loom-Run-Id, X-Loom-Conversation-Id, Retry-After, retry-after-ms, "     \
    "x-ratelimit-limit-requests, x-ratelimit-remaining-requests, "             \
    "x-ratelimit-reset-requests, x-ratelimit-limit-tokens, "                   \
    "x-ratelimit-remaining-tokens, x-ratelimit-reset-tokens"

/* The request's Origin when server.cors_origins lists it exactly. */
static const char *cors_origin(const srv_conn *c)
{
    const loom_server_config *sc = c->s->sc;
    const char *o;

    if (!sc->cors_origins_len ||
        !(o = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Origin")))
        return NULL;
    for (size_t i = 0; i < sc->cors_origins_len; i++)
        if (!strcmp(sc->cors_origins[i], o))
            return o;
    return NULL;
}

/* Lets an allowed origin's page read the answer. */
static void cors_headers(const srv_conn *c, struct MHD_Response *resp)
{
    const char *o = cors_origin(c);

    if (!o)
        return;
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", o);
    MHD_add_response_header(resp, "Vary", "Origin");
    MHD_add_response_header(resp, "Access-Control-Expose-Headers",
                            CORS_EXPOSE_HEADERS);
}

/* A preflight (OPTIONS with Access-Control-Request-Method) from an
 * allowed origin: 204 with what it may do. 1 when answered. */
static int cors_preflight(srv_conn *c)
{
    if (strcmp(c->method, "OPTIONS") != 0 || !cors_origin(c) ||
        !MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND,
                                     "Access-Control-Request-Method"))
        return 0;
    srv_set_header(&c->req, "Access-Control-Allow-Methods",
                   "GET, HEAD, POST, PUT, PATCH, DELETE");
    srv_set_header(&c->req, "Access-Control-Allow-Headers", CORS_ALLOW_HEADERS);
    srv_set_header(&c->req, "Access-Control-Max-Age", "600");
    srv_reply_text(&c->req, 204, NULL, "", 0);
    return 1;
}

/* ---- replies ------------------------------------------------------------- */

int srv__queue(srv_request *r, unsigned status, struct MHD_Response *resp)
{
    srv_conn *c = r->conn_;
    enum MHD_Result ok;

    if (!resp)
        return loom__error_oom();
    if (c->replied) {
        MHD_destroy_response(resp);
        return loom__error_set(LOOM_ERROR, "request already answered");
    }
    for (size_t i = 0; i < c->nhdrs; i++)
        MHD_add_response_header(resp, c->hdrs[i].name, c->hdrs[i].value);
    cors_headers(c, resp);
    ok = MHD_queue_response(c->mc, status, resp);
    MHD_destroy_response(resp);
    if (ok != MHD_YES)
        return loom__error_set(LOOM_ERROR, "cannot queue the response");
    c->replied = 1;
    c->status = status;
    return 0;
}

int srv_reply_text(srv_request *r, unsigned status, const char *ctype,
                   const char *text, size_t len)
{
    struct MHD_Response *resp;
    char *copy = malloc(len + 1);

    if (!copy)
        return loom__error_oom();
    memcpy(copy, text, len);
    copy[len] = '\0';
    resp = MHD_create_response_from_buffer(len, copy, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(copy);
        return loom__error_oom();
    }
    if (ctype)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    return srv__queue(r, status, resp);
}

int srv_reply_json(srv_request *r, unsigned status, json_t *body)
{
    size_t len = 0;
    char *text;

    if (!body)
        return loom__error_oom();
    text = loom__json_compact_dumps(body, 15, &len);
    json_decref(body);
    return srv_reply_json_text(r, status, text, len);
}

int srv_reply_json_text(srv_request *r, unsigned status, char *text, size_t len)
{
    struct MHD_Response *resp;

    if (!text)
        return loom__error_oom();
    /* The answer's own buffer: libmicrohttpd sends it from there. */
    resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(text);
        return loom__error_oom();
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                            "application/json");
    return srv__queue(r, status, resp);
}

/* Replaces bytes that are not valid UTF-8 so jansson takes the text. */
static json_t *safe_string(const char *s)
{
    json_t *j = json_string(s);
    char *copy;

    if (j)
        return j;
    if (!(copy = strdup(s)))
        return NULL;
    for (char *p = copy; *p; p++)
        if ((unsigned char)*p >= 0x80)
            *p = '?';
    j = json_string(copy);
    free(copy);
    return j;
}

static int reply_verror(srv_request *r, unsigned status, const char *type,
                        const char *param, const char *code, const char *fmt,
                        va_list ap)
{
    char msg[1024];
    json_t *err;

    vsnprintf(msg, sizeof(msg), fmt, ap);
    if (!type)
        type = status >= 500 ? "server_error" : "invalid_request_error";
    err = json_pack("{s:{s:o,s:s,s:s?,s:s?}}", "error", "message",
                    safe_string(msg), "type", type, "param", param, "code",
                    code);
    return srv_reply_json(r, status, err);
}

int srv_reply_error(srv_request *r, unsigned status, const char *type,
                    const char *param, const char *code, const char *fmt,
                    ...)
{
    va_list ap;
    int rc;

    va_start(ap, fmt);
    rc = reply_verror(r, status, type, param, code, fmt, ap);
    va_end(ap);
    return rc;
}

int srv_body_only_known(srv_request *r, const char *const *known)
{
    const char *key;
    json_t *v;

    if (r->json_error || !json_is_object(r->json))
        return srv_reply_error(r, 400, NULL, NULL, "invalid_json",
                               "the body must be a JSON object"),
               0;
    json_object_foreach(r->json, key, v)
    {
        size_t i;
        for (i = 0; known[i] && strcmp(known[i], key); i++)
            ;
        if (!known[i])
            return srv_reply_error(r, 400, NULL, key, "unknown_parameter",
                                   "unknown parameter '%s'", key),
                   0;
    }
    return 1;
}

int srv_reply_loom_error(srv_request *r, int rc, const char *param)
{
    const char *msg = loom_error_last();
    char copy[1024];

    snprintf(copy, sizeof(copy), "%s", *msg ? msg : loom_error_name(rc));
    switch (rc) {
    case LOOM_ENOTFOUND:
        return srv_reply_error(r, 404, NULL, param, "not_found", "%s", copy);
    case LOOM_EINVALID:
    case LOOM_EPROTO:
        return srv_reply_error(r, 400, NULL, param, "invalid_value", "%s",
                               copy);
    case LOOM_ETOOLARGE:
        return srv_reply_error(r, 413, NULL, param, "request_too_large", "%s",
                               copy);
    case SRV_ENOPROVIDER:
        return srv_reply_error(r, 503, NULL, NULL, "no_provider",
                               "this server has no model provider "
                               "configured");
    case SRV_EMODEL_NOT_ALLOWED:
        return srv_reply_error(r, 403, NULL, "model", "model_not_allowed", "%s",
                               copy);
    case SRV_EAGENT_NOT_ALLOWED:
        return srv_reply_error(r, 403, NULL, "agent", "agent_not_allowed", "%s",
                               copy);
    case SRV_ERATE_REQUESTS:
    case SRV_ERATE_TOKENS:
        return srv_reply_error(r, 429,
                               rc == SRV_ERATE_TOKENS ? "tokens" : "requests",
                               NULL, "rate_limit_exceeded", "%s", copy);
    case SRV_EQUOTA:
        return srv_reply_quota(r, copy);
    case SRV_EUNPRICED:
        return srv_reply_error(r, 403, NULL, "model", "model_not_priced", "%s",
                               copy);
    case SRV_EQUEUED:
        return 0; /* the request waits for a slot: nothing to say yet */
    case SRV_EBUSY:
        srv_set_header(r, "Retry-After", "1");
        return srv_reply_error(r, 503, NULL, NULL, "server_busy", "%s", copy);
    case LOOM_EUPSTREAM:
        return srv_reply_error(r, 502, NULL, NULL, "upstream_error", "%s",
                               copy);
    case LOOM_ETIMEDOUT:
        return srv_reply_error(r, 504, NULL, NULL, "timeout", "%s", copy);
    default:
        return srv_reply_error(r, 500, NULL, NULL, "internal_error", "%s",
                               copy);
    }
}

/* ---- deferred requests --------------------------------------------------- */

int srv_defer(srv_request *r, srv_run *run, srv_done_fn done, void *payload,
              void (*free_payload)(void *payload))
{
    return srv_defer_until(r, run, NULL, done, payload, free_payload);
}

/* Makes c a deferred request of payload, its connection ready to be
 * suspended (watching for run, which may be NULL). */
static void defer_begin(srv_conn *c, srv_run *run, void *payload,
                        void (*free_payload)(void *payload))
{
    c->dpayload = payload;
    c->dfree = free_payload;
    memset(&c->susp, 0, sizeof(c->susp));
    c->susp.mc = c->mc;
    c->susp.fd = srv__conn_fd(c->mc);
    c->susp.run = run;
    c->susp.idle_since = loom__mono_ms();
    c->state = ST_DEFER;
}

int srv_defer_until(srv_request *r, srv_run *run, srv_ready_fn ready,
                    srv_done_fn done, void *payload,
                    void (*free_payload)(void *payload))
{
    srv_conn *c = r->conn_;

    if (!run || !done || c->replied || c->state == ST_DEFER)
        return loom__error_set(LOOM_EINVALID, "srv_defer: bad call");
    srv_run_ref(run);
    c->drun = run;
    c->done = done;
    c->dready = ready;
    defer_begin(c, run, payload, free_payload);
    /* Without a ready test it answers at the run's end only. */
    c->susp.end_only = ready == NULL;
    srv__run_watch(run, &c->susp);
    c->watching = 1;
    return 0;
}

int srv_defer_task(srv_request *r, srv_task *t, srv_task_done_fn done,
                   void *payload, void (*free_payload)(void *payload))
{
    srv_conn *c = r->conn_;

    if (!t || !done || c->replied || c->state == ST_DEFER)
        return loom__error_set(LOOM_EINVALID, "srv_defer_task: bad call");
    srv_task_ref(t);
    c->dtask = t;
    c->tdone = done;
    defer_begin(c, NULL, payload, free_payload);
    srv__task_watch(t, c->s, &c->susp);
    return 0;
}

/* Whether the deferred request may answer now. */
static int defer_ready(srv_conn *c)
{
    if (c->dtask)
        return srv_task_finished(c->dtask);
    return srv_run_ended(c->drun) ||
           (c->dready && c->dready(c->drun, c->dpayload));
}

/* Runs the deferred request on: replies once its run ended (or its task
 * finished), suspends otherwise. */
static enum MHD_Result defer_step(srv_conn *c)
{
    int gone = 0, rc;

    srv__susp_flags(c->s, &c->susp, &gone, NULL);
    if (gone)
        return MHD_NO;
    for (;;) {
        if (defer_ready(c)) {
            /* done may start a stream that watches the run itself. */
            if (c->watching) {
                srv__run_unwatch(c->drun, &c->susp);
                c->watching = 0;
            }
            c->state = ST_DONE;
            if ((rc = srv__fault("defer.done")) == 0)
                rc = c->dtask ? c->tdone(&c->req, c->dpayload)
                              : c->done(&c->req, c->drun, c->dpayload);
            if (rc == 0 && !c->replied)
                rc = loom__error_set(LOOM_ERROR, "the handler sent no reply");
            if (rc < 0) {
                /* The request is over: a run it owns (which may only be
                 * ready, not ended) must not go on without a client. */
                if (c->drun && !srv_run_background(c->drun))
                    srv_run_cancel(c->drun);
                if (!c->replied)
                    srv_reply_loom_error(&c->req, rc, NULL);
            }
            return c->replied ? MHD_YES : MHD_NO;
        }
        rc = srv__suspend(c->s, &c->susp);
        if (rc == 0)
            return MHD_YES;
        if (rc < 0) {
            c->state = ST_DONE;
            srv_reply_error(&c->req, 503, NULL, NULL, "shutting_down",
                            "the server is shutting down");
            return c->replied ? MHD_YES : MHD_NO;
        }
    }
}

/* ---- waiting for a run slot ---------------------------------------------- */

static enum MHD_Result run_handler(srv_conn *c);

/* Drops the headers the handler set (it sets them again when it runs
 * again). */
static void drop_handler_headers(srv_conn *c)
{
    while (c->nhdrs > c->nhdrs_auth) {
        c->nhdrs--;
        free(c->hdrs[c->nhdrs].name);
        free(c->hdrs[c->nhdrs].value);
    }
}

/* Runs the queued request on: its handler again once a slot is handed
 * over, 503 once its wait is over, suspends otherwise. */
static enum MHD_Result queue_step(srv_conn *c)
{
    int gone = 0, rc;

    srv__susp_flags(c->s, &c->susp, &gone, NULL);
    if (gone) {
        srv__queue_leave(c->s, &c->wait);
        c->state = ST_DONE;
        return MHD_NO;
    }
    for (;;) {
        switch (srv__queue_state(c->s, &c->wait)) {
        case SRV_WAIT_GRANTED:
            c->state = ST_HANDLED;
            return run_handler(c);
        case SRV_WAIT_QUEUED:
            break;
        default:
            srv__queue_leave(c->s, &c->wait);
            c->state = ST_DONE;
            if (atomic_load(&c->s->draining)) {
                srv_reply_error(&c->req, 503, NULL, NULL, "shutting_down",
                                "the server is shutting down");
            } else {
                loom__error_set(SRV_EBUSY,
                                "waited %ld ms for one of the %d run slots "
                                "(queue_wait_ms, max_concurrent_runs); "
                                "retry later",
                                c->s->sc->queue_wait_ms,
                                c->s->sc->max_concurrent_runs);
                srv_reply_loom_error(&c->req, SRV_EBUSY, NULL);
            }
            return c->replied ? MHD_YES : MHD_NO;
        }
        rc = srv__suspend(c->s, &c->susp);
        if (rc == 0)
            return MHD_YES;
        if (rc < 0) {
            srv__queue_leave(c->s, &c->wait);
            c->state = ST_DONE;
            srv_reply_error(&c->req, 503, NULL, NULL, "shutting_down",
                            "the server is shutting down");
            return c->replied ? MHD_YES : MHD_NO;
        }
    }
}

/* Runs the route's handler (again, after a wait for a run slot), then
 * whatever it asked for: a deferred answer, a wait, or its error. */
static enum MHD_Result run_handler(srv_conn *c)
{
    int rc;

    loom_error_clear();
    rc = c->route->handler(&c->req);
    if (c->wait.enqueued && !c->replied && c->state != ST_DEFER) {
        c->wait.enqueued = 0;
        c->waited = 1;
        c->state = ST_QUEUED;
        drop_handler_headers(c);
        return queue_step(c);
    }
    if (c->waited)
        srv__queue_leave(c->s, &c->wait); /* a slot it did not use */
    if (c->state == ST_DEFER)
        return defer_step(c);
    if (!c->replied) {
        if (rc == 0)
            rc = loom__error_set(LOOM_ERROR, "the handler sent no reply");
        srv_reply_loom_error(&c->req, rc, NULL);
    }
    return c->replied ? MHD_YES : MHD_NO;
}

/* ---- the dispatcher ------------------------------------------------------ */

static void reply_no_route(srv_conn *c)
{
    if (c->method_mismatch) {
        const char *allow = c->allow ? c->allow : "";

        srv_set_header(&c->req, "Allow", allow);
        srv_reply_error(&c->req, 405, NULL, NULL, "method_not_allowed",
                        "%s is not allowed on %s (allowed: %s)", c->method,
                        c->path, allow);
    } else {
        srv_reply_error(&c->req, 404, NULL, NULL, "not_found",
                        "no route for %s %s", c->method, c->path);
    }
}

static void reply_too_large(srv_conn *c)
{
    srv_reply_error(&c->req, 413, NULL, NULL, "request_too_large",
                    "the request body is larger than the %ld bytes allowed",
                    c->s->sc->max_body_bytes);
}

static void parse_body(srv_conn *c)
{
    json_error_t jerr;

    c->req.body = loom_buf_cstr(&c->body);
    c->req.body_len = c->body.len;
    if (!c->body.len)
        return;
    c->req.json = json_loadb(c->body.ptr, c->body.len, 0, &jerr);
    if (c->req.json)
        return;
    if ((c->json_error = malloc(JSON_ERROR_SHOWN)) != NULL)
        c->req.json_error =
            loom__json_error_shown(c->json_error, JSON_ERROR_SHOWN, &jerr);
    else
        c->req.json_error = "not JSON (out of memory for the details)";
}

enum MHD_Result srv__on_request(void *cls, struct MHD_Connection *mc,
                                const char *url, const char *method,
                                const char *version, const char *upload,
                                size_t *upload_size, void **con_cls)
{
    srv_server *s = cls;
    srv_conn *c = *con_cls;
    const char *cl;

    (void)version;
    if (!c) {
        if (!(c = conn_new(s, mc, url, method)))
            return MHD_NO;
        *con_cls = c;
        /* The headers are in: from now on the client has read_timeout_ms
         * (a keep-alive connection keeps it for its next requests). */
        if (s->read_timeout_s != s->header_timeout_s)
            MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT,
                                      s->read_timeout_s);
        cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND,
                                         MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            unsigned long long n;
            errno = 0;
            n = strtoull(cl, &end, 10);
            if (errno || *end ||
                n > (unsigned long long)s->sc->max_body_bytes) {
                c->too_large = 1;
                reply_too_large(c);
            }
        }
        return MHD_YES;
    }
    if (c->state == ST_DEFER)
        return defer_step(c);
    if (c->state == ST_QUEUED)
        return queue_step(c);
    if (c->replied || c->state != ST_NEW)
        return MHD_YES;
    if (*upload_size) {
        if (!c->too_large &&
            loom_buf_put(&c->body, upload, *upload_size) != 0) {
            c->too_large = 1;
            loom_buf_free(&c->body);
        }
        if (c->too_large) {
            /* Read past the limit only so far, then cut the client. */
            c->discarded += *upload_size;
            if (c->discarded > (size_t)s->sc->max_body_bytes)
                return MHD_NO;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    c->state = ST_HANDLED;
    c->counted = 1;
    atomic_fetch_add(&s->pending, 1);
    if (c->too_large) {
        reply_too_large(c);
        return MHD_YES;
    }
    if (cors_preflight(c))
        return c->replied ? MHD_YES : MHD_NO;
    if (!c->route) {
        reply_no_route(c);
        return MHD_YES;
    }
    if (!srv__auth_request(&c->req, &c->who))
        return c->replied ? MHD_YES : MHD_NO;
    parse_body(c);
    c->nhdrs_auth = c->nhdrs;
    return run_handler(c);
}

/* Masks the secret of any API key in a path (DELETE
 * /v1/admin/keys/lk_<id>_<secret> names one) so a log line never holds
 * it: what follows "lk_<id>_" up to the next '/' becomes '*'. */
static void hide_key_secrets(char *path)
{
    for (char *p = strstr(path, "lk_"); p; p = strstr(p + 3, "lk_")) {
        char *q = p + 3;
        size_t n = 0;
        while (n < 16 &&
               ((q[n] >= '0' && q[n] <= '9') || (q[n] >= 'a' && q[n] <= 'f')))
            n++;
        if (n < 16 || q[16] != '_')
            continue;
        for (q += 17; *q && *q != '/'; q++)
            *q = '*';
    }
}

void srv__on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                       enum MHD_RequestTerminationCode toe)
{
    srv_server *s = cls;
    srv_conn *c = *con_cls;
    char path[MAX_LOG_PATH + 8];
    double secs;
    int ok = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK, counted;

    (void)mc;
    if (!c)
        return;
    *con_cls = NULL;
    if (c->state == ST_DEFER && !ok && c->drun)
        srv_run_leave(c->drun);
    if (c->sse)
        srv__sse_request_done(c->sse, ok);
    secs = loom__mono_ms_exact() / 1e3 - c->start;
    /* A 405 counts under the route whose path it named. */
    srv__metrics_request(s->metrics, c->method,
                         c->route   ? c->route->tmpl
                         : c->other ? c->other->tmpl
                                    : "unmatched",
                         c->replied ? c->status : 499, secs);
    if (loom_log_enabled(LOOM_LOG_INFO)) {
        /* Control bytes shown as '?', cut. */
        loom__text_shown(path, sizeof(path), c->path, MAX_LOG_PATH);
        hide_key_secrets(path);
        loom_info("%s %s %u %.1fms%s%s%s", c->method, path,
                  c->replied ? c->status : 499, secs * 1000.0,
                  c->run_id[0] ? " run=" : "", c->run_id,
                  ok ? "" : " (connection closed early)");
    }
    counted = c->counted;
    conn_free(c);
    if (counted)
        atomic_fetch_sub(&s->pending, 1);
}
