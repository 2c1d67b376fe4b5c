/*
 * A signed-in user's own MCP accounts (docs/mcp.md "Connecting your own
 * account"): GET /v1/me/mcp lists the configured MCP servers that take
 * each user's own account and whether the caller's is connected; POST
 * /v1/me/mcp/{server}/connect starts the OAuth authorization-code flow
 * for the caller and answers the authorization URL to open; the
 * authorization server sends the browser back to GET
 * /v1/mcp/oauth/callback, which finishes it; DELETE /v1/me/mcp/{server}
 * forgets the caller's tokens.
 *
 * One connection under way is a flow: a thread of its own runs the MCP
 * client's whole authorization (loom_mcp_server_connect_user: discovery,
 * registration, PKCE, the state, iss, the token exchange, the tokens
 * saved sealed under the user), with an authorizer that publishes the
 * authorization URL and then waits, FLOW_TTL_MS at most, for the browser
 * to come back. The callback carries the state the client made for that
 * very URL: it finds the flow (the state is the only key: the browser
 * comes back without the caller's key), hands over the answer once
 * (a state is good for one callback) and waits, without blocking the
 * server thread (srv_defer_task), for the exchange. A flow belongs to
 * the user who started it: whatever comes back with its state completes
 * that user's connection and nobody else's. A new connect of the same
 * user and server ends the one before.
 */
#include "core/clock.h"
#include "core/error.h"
#include "loom/log.h"
#include "loom/mcp.h"
#include "server/srvpriv.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How long a flow waits for the browser to come back. */
#define FLOW_TTL_MS (10L * 60 * 1000)
/* Flows at once, every user's. */
#define FLOWS_MAX 64
#define STATE_MAX 128
#define BASE_MAX 1024
#define MSG_MAX 512
#define CALLBACK_PATH "/v1/mcp/oauth/callback"

static const char page_csp[] = "default-src 'none'; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'";

/* For tests: the wait of flows started from now on (< 0: FLOW_TTL_MS). */
static atomic_long flow_ttl_ms = -1;

void srv__mcp_flow_ttl_set(long ms)
{
    atomic_store(&flow_ttl_ms, ms);
}

enum { F_STARTING, F_WAITING, F_DONE };

typedef struct mcp_flow {
    atomic_int refs;
    struct srv_mcp_flows *all;
    loom_mcp_server *ms; /* borrowed: the server's set outlives it */
    char server[128];
    char user[SRV_OWNER_SIZE];
    /* Under all->mu. */
    char state[STATE_MAX]; /* once asked */
    char *url;             /* the authorization URL, once asked */
    char *callback;        /* the browser's answer, handed to the thread */
    int phase;
    int asked;     /* the authorizer was called */
    int used;      /* the browser came back with the state */
    int cancelled; /* a newer connect or a disconnect ended it */
    int rc;        /* once F_DONE */
    char msg[MSG_MAX];
    long long expires; /* monotonic ms */
    srv_task *started; /* the authorization URL is known, or it ended */
    srv_task *ended;
    pthread_t th;
    int running; /* th was started and not joined */
    struct mcp_flow *next;
} mcp_flow;

struct srv_mcp_flows {
    char base[BASE_MAX]; /* of the redirect URI: server.public_url... */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* monotonic */
    mcp_flow *head;
    size_t n;
    int stopping;
};

static void flow_unref(void *arg)
{
    mcp_flow *f = arg;

    if (!f || atomic_fetch_sub(&f->refs, 1) != 1)
        return;
    srv_task_unref(f->started);
    srv_task_unref(f->ended);
    free(f->url);
    free(f->callback);
    free(f);
}

/* ---- the flow's thread ------------------------------------------------- */

static int redirect_uri(void *arg, char *uri, size_t cap)
{
    const mcp_flow *f = arg;

    if ((size_t)snprintf(uri, cap, "%s" CALLBACK_PATH, f->all->base) >= cap)
        return loom__error_set(LOOM_EINVALID, "server.public_url is too long");
    return 0;
}

/* The value of name in url's query as written (the state is base64url:
 * nothing to decode) into out; 0 when absent or too long. */
static int query_raw(const char *url, const char *name, char *out, size_t cap)
{
    size_t n = strlen(name);

    for (const char *p = strchr(url, '?'); p && *p; p = strchr(p + 1, '&')) {
        const char *v = p + 1;
        size_t len;
        if (strncmp(v, name, n) != 0 || v[n] != '=')
            continue;
        v += n + 1;
        len = strcspn(v, "&#");
        if (len == 0 || len >= cap)
            return 0;
        memcpy(out, v, len);
        out[len] = '\0';
        return 1;
    }
    return 0;
}

/* The authorizer's person step: publishes url, waits for the browser. */
static int authorize(void *arg, const char *url, char **callback)
{
    mcp_flow *f = arg;
    struct srv_mcp_flows *all = f->all;
    char state[STATE_MAX];
    char *copy = strdup(url);
    int rc = 0;

    if (!copy)
        return loom__error_oom();
    if (!query_raw(url, "state", state, sizeof(state))) {
        free(copy);
        return loom__error_set(LOOM_EPROTO,
                               "the authorization URL has no state");
    }
    pthread_mutex_lock(&all->mu);
    snprintf(f->state, sizeof(f->state), "%s", state);
    free(f->url);
    f->url = copy;
    f->asked = 1;
    f->phase = F_WAITING;
    pthread_mutex_unlock(&all->mu);
    srv_task_finish(f->started);

    pthread_mutex_lock(&all->mu);
    for (;;) {
        long long left = f->expires - loom__mono_ms();
        struct timespec ts;
        if (f->callback || all->stopping || f->cancelled || left <= 0)
            break;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += (time_t)(left / 1000);
        ts.tv_nsec += (long)(left % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&all->cv, &all->mu, &ts);
    }
    if (f->callback) {
        *callback = f->callback;
        f->callback = NULL;
    } else if (all->stopping) {
        rc = loom__error_set(LOOM_ERROR, "the server is stopping");
    } else if (f->cancelled) {
        rc = loom__error_set(LOOM_ECANCELED,
                             "this connection was replaced or cancelled");
    } else {
        rc = loom__error_set(LOOM_ETIMEDOUT,
                             "the authorization expired: the browser did "
                             "not come back in time");
    }
    pthread_mutex_unlock(&all->mu);
    return rc;
}

static void *flow_main(void *arg)
{
    mcp_flow *f = arg;
    loom_mcp_authorizer az = {redirect_uri, authorize, f};
    int rc = loom_mcp_server_connect_user(f->ms, f->user, &az,
                                          f->expires - loom__mono_ms());

    pthread_mutex_lock(&f->all->mu);
    f->rc = rc;
    if (rc != 0) {
        snprintf(f->msg, sizeof(f->msg), "%s", loom_error_last());
        loom_info("mcp %s: connecting the account of %s failed: %s", f->server,
                  f->user, f->msg);
    } else {
        loom_info("mcp %s: %s connected their account", f->server, f->user);
    }
    f->phase = F_DONE;
    pthread_mutex_unlock(&f->all->mu);
    srv_task_finish(f->started);
    srv_task_finish(f->ended);
    return NULL;
}

/* ---- the table of flows ------------------------------------------------ */

/* How long an ended flow is kept after its expiry, to tell a late
 * callback it expired or was used rather than unknown. */
#define FLOW_KEEP_MS FLOW_TTL_MS

/* The redirect URI base: server.public_url, else http://HOST:PORT of
 * the listen address (a wildcard host as the loopback one). */
static void public_base(const srv_server *s, char *out, size_t cap)
{
    const char *p = s->sc->public_url, *colon;
    size_t n;

    if (p && *p) {
        n = strlen(p);
        while (n > 0 && p[n - 1] == '/')
            n--;
        snprintf(out, cap, "%.*s", (int)n, p);
        return;
    }
    colon = strrchr(s->listen, ':');
    n = colon ? (size_t)(colon - s->listen) : strlen(s->listen);
    if (n == 0 || (n == 1 && s->listen[0] == '*') ||
        (n == 7 && !strncmp(s->listen, "0.0.0.0", 7)))
        snprintf(out, cap, "http://127.0.0.1:%d", s->port);
    else if (n == 4 && !strncmp(s->listen, "[::]", 4))
        snprintf(out, cap, "http://[::1]:%d", s->port);
    else
        snprintf(out, cap, "http://%.*s:%d", (int)n, s->listen, s->port);
}

/* The server's flows, made on first use (server thread). */
static struct srv_mcp_flows *flows_of(srv_server *s)
{
    struct srv_mcp_flows *all = s->mcp_flows;
    pthread_condattr_t ca;

    if (all)
        return all;
    if (!(all = calloc(1, sizeof(*all))))
        return NULL;
    public_base(s, all->base, sizeof(all->base));
    pthread_mutex_init(&all->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&all->cv, &ca);
    pthread_condattr_destroy(&ca);
    s->mcp_flows = all;
    return all;
}

/* Unlinks and frees the flows that ended, every one when all is set,
 * else those kept long enough. Joins their threads. Under mu. */
static void reap_locked(struct srv_mcp_flows *all, int every)
{
    long long now = loom__mono_ms();

    for (mcp_flow **pp = &all->head; *pp;) {
        mcp_flow *f = *pp;
        if (f->phase != F_DONE ||
            (!every && now <= f->expires + FLOW_KEEP_MS)) {
            pp = &f->next;
            continue;
        }
        *pp = f->next;
        all->n--;
        if (f->running)
            pthread_join(f->th, NULL); /* it ended: at once */
        flow_unref(f);
    }
}

void srv__mcp_flows_free(srv_server *s)
{
    struct srv_mcp_flows *all = s->mcp_flows;

    if (!all)
        return;
    pthread_mutex_lock(&all->mu);
    all->stopping = 1;
    pthread_cond_broadcast(&all->cv);
    pthread_mutex_unlock(&all->mu);
    /* Threads end on their own once told (an exchange under way within
     * its HTTP timeouts). */
    for (mcp_flow *f = all->head; f; f = f->next)
        if (f->running) {
            pthread_join(f->th, NULL);
            f->running = 0;
        }
    pthread_mutex_lock(&all->mu);
    reap_locked(all, 1);
    pthread_mutex_unlock(&all->mu);
    pthread_mutex_destroy(&all->mu);
    pthread_cond_destroy(&all->cv);
    free(all);
    s->mcp_flows = NULL;
}

/* Ends the flows of user on server that still wait (cancelled). Under
 * mu. */
static void cancel_locked(struct srv_mcp_flows *all, const char *user,
                          const char *server)
{
    for (mcp_flow *f = all->head; f; f = f->next)
        if (f->phase != F_DONE && !strcmp(f->user, user) &&
            !strcmp(f->server, server))
            f->cancelled = 1;
    pthread_cond_broadcast(&all->cv);
}

/* Starts a flow of user for ms; *out holds a reference. */
static int flow_start(struct srv_mcp_flows *all, loom_mcp_server *ms,
                      const char *user, mcp_flow **out)
{
    long ttl = atomic_load(&flow_ttl_ms);
    mcp_flow *f;
    int rc;

    *out = NULL;
    pthread_mutex_lock(&all->mu);
    reap_locked(all, all->n >= FLOWS_MAX);
    if (all->n >= FLOWS_MAX) {
        pthread_mutex_unlock(&all->mu);
        return loom__error_set(SRV_EBUSY, "too many MCP connections are "
                                          "under way; try again later");
    }
    cancel_locked(all, user, loom_mcp_server_name(ms));
    if (!(f = calloc(1, sizeof(*f))) || srv_task_new(&f->started) != 0 ||
        srv_task_new(&f->ended) != 0) {
        pthread_mutex_unlock(&all->mu);
        if (f) {
            srv_task_unref(f->started);
            free(f);
        }
        return loom__error_oom();
    }
    atomic_init(&f->refs, 2); /* the table's, the caller's */
    f->all = all;
    f->ms = ms;
    snprintf(f->server, sizeof(f->server), "%s", loom_mcp_server_name(ms));
    snprintf(f->user, sizeof(f->user), "%s", user);
    f->expires = loom__mono_ms() + (ttl >= 0 ? ttl : FLOW_TTL_MS);
    if ((rc = pthread_create(&f->th, NULL, flow_main, f)) != 0) {
        pthread_mutex_unlock(&all->mu);
        flow_unref(f);
        flow_unref(f);
        return loom__error_set(LOOM_ERROR, "starting a thread: %s",
                               strerror(rc));
    }
    f->running = 1;
    f->next = all->head;
    all->head = f;
    all->n++;
    pthread_mutex_unlock(&all->mu);
    *out = f;
    return 0;
}

/* ---- pages ------------------------------------------------------------- */

/* Appends s to b with HTML's special characters escaped. */
static int put_escaped(loom_buf *b, const char *s)
{
    int rc = 0;

    for (; s && *s && !rc; s++)
        switch (*s) {
        case '<':
            rc = loom_buf_puts(b, "&lt;");
            break;
        case '>':
            rc = loom_buf_puts(b, "&gt;");
            break;
        case '&':
            rc = loom_buf_puts(b, "&amp;");
            break;
        case '"':
            rc = loom_buf_puts(b, "&quot;");
            break;
        case '\'':
            rc = loom_buf_puts(b, "&#39;");
            break;
        default:
            rc = loom_buf_put(b, s, 1);
        }
    return rc;
}

/*
 * Answers a small HTML page: title, then text and detail (each may be
 * NULL) as escaped text, and a link back to the UI. No script, no style,
 * nothing loaded (CSP); never cached; never a Referer (the URL that
 * brought the browser here holds the code).
 */
static int reply_page(srv_request *r, unsigned status, const char *title,
                      const char *text, const char *detail)
{
    loom_buf b;
    int rc;

    loom_buf_init(&b, 1 << 16);
    rc = loom_buf_puts(&b, "<!doctype html>\n<html lang=\"en\"><head>"
                           "<meta charset=\"utf-8\"><title>") ||
                 put_escaped(&b, title) ||
                 loom_buf_puts(&b, "</title></head><body><h1>") ||
                 put_escaped(&b, title) || loom_buf_puts(&b, "</h1><p>") ||
                 put_escaped(&b, text) || loom_buf_puts(&b, "</p>") ||
                 (detail &&
                  (loom_buf_puts(&b, "<p><code>") || put_escaped(&b, detail) ||
                   loom_buf_puts(&b, "</code></p>"))) ||
                 loom_buf_puts(&b, "<p><a href=\"/\">Back to loom</a></p>"
                                   "</body></html>\n")
             ? loom__error_oom()
             : 0;
    if (rc == 0 &&
        (rc = srv_set_header(r, "Content-Security-Policy", page_csp)) == 0 &&
        (rc = srv_set_header(r, "X-Content-Type-Options", "nosniff")) == 0 &&
        (rc = srv_set_header(r, "Cache-Control", "no-store")) == 0 &&
        (rc = srv_set_header(r, "Referrer-Policy", "no-referrer")) == 0)
        rc = srv_reply_text(r, status, "text/html; charset=utf-8",
                            loom_buf_cstr(&b), b.len);
    loom_buf_free(&b);
    return rc;
}

/* ---- the routes -------------------------------------------------------- */

/* The caller's owner id into buf (*owner). 1 go on, 0 answered. */
static int me(srv_request *r, char buf[SRV_OWNER_SIZE], const char **owner)
{
    if (!srv_request_owner(r, NULL, buf, owner))
        return 0;
    if (!*owner)
        *owner = "";
    return 1;
}

/* The server of the route's {server} that takes the caller's own
 * account, else NULL after a 404. */
static loom_mcp_server *user_server(srv_request *r)
{
    loom_mcp_server *ms = loom_mcp_set_find(r->srv->mcp_servers, r->params[0]);

    if (!ms || !loom_mcp_server_user_oauth(ms)) {
        srv_reply_error(r, 404, NULL, NULL, "not_found",
                        "no MCP server '%.64s' takes an account of your own",
                        r->params[0]);
        return NULL;
    }
    return ms;
}

static int list_mine(srv_request *r)
{
    char buf[SRV_OWNER_SIZE];
    const char *owner;
    json_t *data = json_array(), *settings = NULL, *o;
    int rc = 0;

    if (!data)
        return loom__error_oom();
    if (!me(r, buf, &owner)) {
        json_decref(data);
        return 0;
    }
    for (size_t i = 0; rc == 0 && i < loom_mcp_set_len(r->srv->mcp_servers);
         i++) {
        loom_mcp_server *ms = loom_mcp_set_get(r->srv->mcp_servers, i);
        json_t *headers = NULL;
        int on;

        if (loom_mcp_server_user_oauth(ms) && *owner) {
            on = loom_mcp_server_user_connected(ms, owner);
            if (on < 0) {
                loom_warn("mcp %s: the credentials of %s do not open: %s",
                          loom_mcp_server_name(ms), owner, loom_error_last());
                on = 0;
            }
            o = json_pack("{s:s,s:s,s:b}", "name", loom_mcp_server_name(ms),
                          "auth", "oauth", "connected", on);
        } else if (loom_mcp_user_headers(ms, NULL, &headers) ==
                   LOOM_ENOTFOUND) {
            /* Headers that take the user's own secrets (their settings). */
            if (!settings)
                settings = srv_user_settings(r->srv, owner);
            on = loom_mcp_user_headers(ms, json_object_get(settings, "secrets"),
                                       &headers) == 0;
            o = json_pack("{s:s,s:s,s:b}", "name", loom_mcp_server_name(ms),
                          "auth", "secrets", "connected", on);
        } else {
            json_decref(headers);
            continue;
        }
        json_decref(headers);
        if (!o || json_array_append_new(data, o) != 0)
            rc = loom__error_oom();
    }
    json_decref(settings);
    loom_error_clear();
    if (rc != 0) {
        json_decref(data);
        return rc;
    }
    return srv_reply_json(
        r, 200, json_pack("{s:s,s:o}", "object", "list", "data", data));
}

/* The connect request, once its flow has an authorization URL or ended. */
static int connect_done(srv_request *r, void *payload)
{
    mcp_flow *f = payload;
    struct srv_mcp_flows *all = f->all;
    json_t *o = NULL;
    char msg[MSG_MAX];
    int asked, rc;

    pthread_mutex_lock(&all->mu);
    asked = f->asked;
    rc = f->rc;
    snprintf(msg, sizeof(msg), "%s", f->msg);
    if (asked)
        o = json_pack("{s:s,s:s,s:b,s:I}", "server", f->server,
                      "authorization_url", f->url, "connected", 0, "expires_in",
                      (json_int_t)((f->expires - loom__mono_ms()) / 1000));
    pthread_mutex_unlock(&all->mu);
    if (asked)
        return o ? srv_reply_json(r, 200, o) : loom__error_oom();
    if (rc == 0)
        /* The tokens the user had still work. */
        return srv_reply_json(
            r, 200,
            json_pack("{s:s,s:b}", "server", f->server, "connected", 1));
    return srv_reply_error(r, 502, NULL, NULL, "mcp_connect_failed", "%s", msg);
}

static int connect_mine(srv_request *r)
{
    char buf[SRV_OWNER_SIZE];
    const char *owner;
    struct srv_mcp_flows *all;
    loom_mcp_server *ms;
    mcp_flow *f;
    int rc;

    if (!me(r, buf, &owner) || !(ms = user_server(r)))
        return 0;
    if (!*owner)
        return srv_reply_error(r, 400, NULL, NULL, "no_user",
                               "connecting an account needs a user");
    if (!(all = flows_of(r->srv)))
        return loom__error_oom();
    if ((rc = flow_start(all, ms, owner, &f)) != 0)
        return srv_reply_loom_error(r, rc, NULL);
    if ((rc = srv_defer_task(r, f->started, connect_done, f, flow_unref)) != 0)
        flow_unref(f);
    return rc;
}

static int disconnect_mine(srv_request *r)
{
    char buf[SRV_OWNER_SIZE];
    const char *owner;
    loom_mcp_server *ms;
    int rc, had;

    if (!me(r, buf, &owner) || !(ms = user_server(r)))
        return 0;
    if (!*owner)
        return srv_reply_error(r, 400, NULL, NULL, "no_user",
                               "disconnecting an account needs a user");
    if (r->srv->mcp_flows) {
        pthread_mutex_lock(&r->srv->mcp_flows->mu);
        cancel_locked(r->srv->mcp_flows, owner, loom_mcp_server_name(ms));
        pthread_mutex_unlock(&r->srv->mcp_flows->mu);
    }
    rc = loom_store_mcp_credentials_delete(srv_store(r->srv),
                                           loom_mcp_server_name(ms), owner);
    if (rc != 0 && rc != LOOM_ENOTFOUND)
        return srv_reply_loom_error(r, rc, NULL);
    had = rc == 0;
    loom_mcp_server_forget_user(ms, owner);
    loom_info("mcp %s: %s disconnected their account", loom_mcp_server_name(ms),
              owner);
    return srv_reply_json(r, 200,
                          json_pack("{s:s,s:b,s:b}", "server",
                                    loom_mcp_server_name(ms), "connected", 0,
                                    "deleted", had));
}

/* The callback request, once its flow ended. */
static int callback_done(srv_request *r, void *payload)
{
    mcp_flow *f = payload;
    char msg[MSG_MAX], server[128];
    int rc;

    pthread_mutex_lock(&f->all->mu);
    rc = f->rc;
    snprintf(msg, sizeof(msg), "%s", f->msg);
    snprintf(server, sizeof(server), "%s", f->server);
    pthread_mutex_unlock(&f->all->mu);
    if (rc == 0) {
        char text[256];
        snprintf(text, sizeof(text),
                 "Your account for the MCP server '%s' is connected. You "
                 "may close this page.",
                 server);
        return reply_page(r, 200, "Connected", text, NULL);
    }
    return reply_page(r, 502, "Not connected",
                      "The account could not be connected:", msg);
}

/* Appends "&name=value" (value percent-encoded) when value is set. */
static int put_param(loom_buf *b, const char *name, const char *value)
{
    static const char hex[] = "0123456789ABCDEF";
    int rc;

    if (!value)
        return 0;
    rc = loom_buf_puts(b, b->len ? "&" : "") || loom_buf_puts(b, name) ||
         loom_buf_puts(b, "=");
    for (const unsigned char *p = (const unsigned char *)value; !rc && *p;
         p++) {
        if ((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
            (*p >= '0' && *p <= '9') || strchr("-._~", *p)) {
            rc = loom_buf_put(b, (const char *)p, 1);
        } else {
            char e[3] = {'%', hex[*p >> 4], hex[*p & 15]};
            rc = loom_buf_put(b, e, 3);
        }
    }
    return rc ? loom__error_oom() : 0;
}

static int oauth_callback(srv_request *r)
{
    static const char *const keep[] = {
        "code", "state", "iss", "error", "error_description", NULL};
    struct srv_mcp_flows *all = r->srv->mcp_flows;
    const char *state = srv_query(r, "state");
    const char *why = "This authorization is unknown to loom.";
    mcp_flow *f = NULL;
    loom_buf q;
    char *back;
    size_t n;
    int rc = 0;

    if (all && state && *state) {
        pthread_mutex_lock(&all->mu);
        for (f = all->head; f; f = f->next)
            if (f->asked && !strcmp(f->state, state))
                break;
        if (f && f->used)
            why = "This authorization was already used.";
        else if (f && f->cancelled)
            why = "This authorization was replaced or cancelled.";
        else if (f && (f->phase == F_DONE || loom__mono_ms() >= f->expires))
            why = "This authorization expired.";
        if (f && !f->used && !f->cancelled && f->phase != F_DONE &&
            loom__mono_ms() < f->expires) {
            /* Good once: hand the answer over. */
            loom_buf_init(&q, 1 << 16);
            for (size_t i = 0; keep[i] && !rc; i++)
                rc = put_param(&q, keep[i], srv_query(r, keep[i]));
            n = strlen(all->base) + strlen(CALLBACK_PATH) + q.len + 2;
            if (rc == 0 && (back = malloc(n))) {
                snprintf(back, n, "%s" CALLBACK_PATH "?%s", all->base,
                         loom_buf_cstr(&q));
                free(f->callback);
                f->callback = back;
                f->used = 1;
                atomic_fetch_add(&f->refs, 1);
                pthread_cond_broadcast(&all->cv);
            } else {
                rc = loom__error_oom();
                f = NULL;
            }
            loom_buf_free(&q);
        } else {
            f = NULL;
        }
        pthread_mutex_unlock(&all->mu);
    }
    if (rc != 0)
        return rc;
    if (!f)
        return reply_page(r, 400, "Not connected", why,
                          srv_query(r, "error") ? srv_query(r, "error") : NULL);
    if ((rc = srv_defer_task(r, f->ended, callback_done, f, flow_unref)) != 0)
        flow_unref(f);
    return rc;
}

int srv__api_mcp_routes(srv_router *rt)
{
    int rc;

    if ((rc = srv_route(rt, "GET", "/v1/me/mcp", list_mine)) ||
        (rc = srv_route(rt, "POST", "/v1/me/mcp/{server}/connect",
                        connect_mine)) ||
        (rc =
             srv_route(rt, "DELETE", "/v1/me/mcp/{server}", disconnect_mine)) ||
        (rc = srv_route(rt, "GET", CALLBACK_PATH, oauth_callback)))
        return rc;
    return 0;
}

int srv__mcp_public(const char *path)
{
    return !strcmp(path, CALLBACK_PATH);
}
