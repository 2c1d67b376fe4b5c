/*
 * The MCP client core (loom/mcp.h): JSON-RPC 2.0 over a transport
 * (mcp_internal.h), the 2025-11-25 handshake, tools/list paging and
 * tools/call with timeouts and cancellation.
 *
 * Requests wait on the server's condition variable for their answer,
 * which arrives through loom__mcp_dispatch() on whatever thread reads
 * it. A thread's wait wakes at least every WAIT_TICK_MS to poll the
 * cancel flag; a fiber's is woken by the flag itself. When the connection
 * is lost, every request of that connection is woken and fails at once:
 * a dead server is never waited on.
 *
 * On a fiber (loom serve's worker pool), a request to a server over HTTP
 * (Streamable or legacy SSE) runs on one of the pool's threads for
 * blocking work while the fiber parks: those transports wait in curl
 * loops of their own, and a start holds start_mu while it connects,
 * either of which would stop every other fiber of the worker. A stdio
 * server's requests stay on the fiber, whose waits park.
 *
 * Starting is lazy and serialised (start_mu): the first request after
 * the server died or was never started opens a connection and shakes
 * hands. Consecutive failures (a start that failed, a server that died)
 * push the next attempt back: the first restart is immediate, then
 * 250 ms doubling up to 30 s; a request in that window fails at once
 * saying when the next attempt is. A call that succeeds resets it.
 */
#include "core/clock.h"
#include "core/config_internal.h"
#include "core/error.h"
#include "core/fiber.h"
#include "loom/log.h"
#include "tools/mcp/mcp_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WAIT_TICK_MS 50
#define MAX_PAGES 100
/* A call's total time, progress included, in times its timeout_ms. */
#define TOTAL_TIMES 5
#define BACKOFF_FIRST_MS 250
#define BACKOFF_MAX_MS 30000
/* How long a cancellation notice may take to send. */
#define CANCEL_SEND_MS 2000

/* The versions loom accepts from a server, newest first. */
static const char *const versions[] = {LOOM_MCP_PROTOCOL_VERSION, "2025-06-18",
                                       "2025-03-26", "2024-11-05", NULL};

typedef enum { ST_IDLE, ST_READY, ST_DOWN, ST_FAILED } server_state;

static const char *const state_names[] = {"idle", "ready", "down", "failed"};

/* What a call's progress notifications do (loom_mcp_call_options). */
typedef struct {
    int64_t cap; /* the latest the deadline may move to */
    long step_ms;
    void (*on_progress)(const json_t *params, void *arg);
    void *arg;
    loom_mcp_input_fn input; /* the call's answerer (may be NULL) */
    void *input_arg;
    int elicit; /* input answers elicitations */
    const json_t *headers; /* the call's own HTTP headers, or NULL */
} call_ctl;

struct mcp_pending {
    json_int_t id;
    unsigned gen;
    int64_t deadline;    /* moves with progress (ctl); under the lock */
    int64_t held;        /* ms a person took (input, OAuth): the cap
                          * moves by as much; under the lock */
    const call_ctl *ctl; /* NULL: no progress asked */
    int done;
    json_t *answer; /* the whole response message */
    char *lost;     /* why the connection went away, when it did */
    json_t *inbox;  /* requests of the server for the caller to answer */
    mcp_pending *next;
};

/*
 * The request whose exchange this thread is sending (an HTTP POST reads
 * its answer stream on the caller's thread): a request of the server
 * that arrives there is that call's, and is answered on the spot.
 */
static _Thread_local mcp_pending *tl_sending;

typedef struct {
    int refs; /* under the server's mu */
    unsigned gen;
    void *impl;
} mcp_conn;

struct loom_mcp_server {
    atomic_int refs;
    loom_mcp_server_config cfg; /* a deep copy */
    const mcp_transport *tr;
    pthread_mutex_t mu;
    loom__cond cv; /* parks a caller on a fiber */
    pthread_mutex_t start_mu;
    server_state state;
    unsigned gen;
    mcp_conn *conn;
    json_int_t next_id;
    mcp_pending *pending;
    char protocol[32];
    int stateless;      /* the 2026-07-28 era: no handshake, _meta */
    int listen_tools;   /* its discover says tools.listChanged */
    json_t *headers_of; /* tool -> {param: x-mcp-header}; may be NULL */
    loom_mcp_input_fn input;
    void *input_arg;
    int may_elicit; /* calls may bring an answerer */
    json_t *server_info;
    char *error;
    int failures;
    int64_t next_start;
    int starting;     /* a start under way: 1 the first, 2 a restart */
    long ntools;      /* tools offered at the last listing; -1 before */
    mcp_oauth *oauth; /* http only */
    atomic_uint lists_changed; /* notifications/tools/list_changed seen */
    loom_mcp_credentials cs;   /* where OAuth credentials live (users') */
    int per_user;              /* loom_mcp_server_set_per_user */
    mcp_users *users;          /* users' own servers (mcp_users.c) */
    loom_mcp_server *parent;   /* a user's own server: its server */
};

/* ---- config copy ------------------------------------------------------- */

static char *dup_opt(const char *s, int *oom)
{
    char *d;

    if (!s)
        return NULL;
    if (!(d = strdup(s)))
        *oom = 1;
    return d;
}

static char **dup_list(char *const *v, size_t n, int *oom)
{
    char **d;

    if (!n)
        return NULL;
    if (!(d = calloc(n, sizeof(*d)))) {
        *oom = 1;
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        d[i] = dup_opt(v[i], oom);
    return d;
}

/*
 * A root as a file:// URI: a URI as it is; a path made absolute (from
 * loom's working directory) with every byte outside the unreserved
 * characters and '/' percent-encoded. NULL on OOM.
 */
static char *root_uri(const char *root)
{
    static const char hex[] = "0123456789ABCDEF";
    char cwd[4096] = "";
    loom_buf b = LOOM_BUF_INIT(65536);

    if (strncmp(root, "file://", 7) == 0)
        return strdup(root);
    if (root[0] != '/' && !getcwd(cwd, sizeof(cwd)))
        cwd[0] = '\0';
    loom_buf_puts(&b, "file://");
    for (int k = 0; k < 2; k++) {
        const char *p = k ? root : cwd;
        if (k && cwd[0] && cwd[strlen(cwd) - 1] != '/')
            loom_buf_puts(&b, "/");
        for (; *p; p++) {
            unsigned char ch = (unsigned char)*p;
            char esc[3] = {'%', hex[ch >> 4], hex[ch & 15]};
            if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                (ch >= '0' && ch <= '9') || strchr("-._~/", ch))
                loom_buf_put(&b, p, 1);
            else
                loom_buf_put(&b, esc, 3);
        }
    }
    return loom_buf_detach(&b);
}

static int config_copy(loom_mcp_server_config *d,
                       const loom_mcp_server_config *c)
{
    int oom = 0;

    memset(d, 0, sizeof(*d));
    d->name = dup_opt(c->name ? c->name : "mcp", &oom);
    d->transport = dup_opt(c->transport, &oom);
    d->command = dup_opt(c->command, &oom);
    d->args = dup_list(c->args, c->args_len, &oom);
    d->args_len = c->args_len;
    d->env = c->env ? json_deep_copy(c->env) : json_object();
    d->cwd = dup_opt(c->cwd, &oom);
    d->url = dup_opt(c->url, &oom);
    d->headers = c->headers ? json_deep_copy(c->headers) : json_object();
    d->tools = dup_list(c->tools, c->tools_len, &oom);
    d->tools_len = c->tools_len;
    d->timeout_ms = c->timeout_ms > 0 ? c->timeout_ms : 60000;
    d->startup_timeout_ms =
        c->startup_timeout_ms > 0 ? c->startup_timeout_ms : 30000;
    d->protocol_version = dup_opt(c->protocol_version, &oom);
    d->oauth.client_id = dup_opt(c->oauth.client_id, &oom);
    d->oauth.client_secret = dup_opt(c->oauth.client_secret, &oom);
    d->oauth.auth_method = dup_opt(c->oauth.auth_method, &oom);
    d->oauth.client_metadata_url = dup_opt(c->oauth.client_metadata_url, &oom);
    d->oauth.client_name = dup_opt(c->oauth.client_name, &oom);
    d->oauth.scopes = dup_list(c->oauth.scopes, c->oauth.scopes_len, &oom);
    d->oauth.scopes_len = c->oauth.scopes_len;
    d->oauth.grant_type = dup_opt(c->oauth.grant_type, &oom);
    d->oauth.private_key = dup_opt(c->oauth.private_key, &oom);
    d->oauth.signing_alg = dup_opt(c->oauth.signing_alg, &oom);
    d->oauth.disabled = c->oauth.disabled;
    d->sampling = dup_opt(c->sampling, &oom);
    d->sampling_max_tokens = c->sampling_max_tokens > 0
                                 ? c->sampling_max_tokens
                                 : LOOM_MCP_SAMPLING_MAX_TOKENS;
    if (c->roots_len && !(d->roots = calloc(c->roots_len, sizeof(char *))))
        oom = 1;
    for (size_t i = 0; d->roots && i < c->roots_len; i++)
        if ((d->roots[i] = root_uri(c->roots[i])) != NULL)
            d->roots_len++;
        else
            oom = 1;
    if (oom || !d->env || !d->headers)
        return loom__error_oom();
    return 0;
}

/* ---- the server object ------------------------------------------------- */

int loom_mcp_server_new(loom_mcp_server **out,
                        const loom_mcp_server_config *cfg)
{
    loom_mcp_server *s;
    int rc;

    *out = NULL;
    if (!cfg || (!cfg->command == !cfg->url))
        return loom__error_set(LOOM_EINVALID,
                               "MCP server '%s': give command or url",
                               cfg && cfg->name ? cfg->name : "?");
    if (!(s = calloc(1, sizeof(*s))))
        return loom__error_oom();
    atomic_init(&s->refs, 1);
    atomic_init(&s->lists_changed, 0);
    pthread_mutex_init(&s->mu, NULL);
    loom__cond_init(&s->cv);
    pthread_mutex_init(&s->start_mu, NULL);
    s->next_id = 1;
    s->ntools = -1;
    s->tr = cfg->command ? &loom__mcp_stdio
            : cfg->transport && strcmp(cfg->transport, "sse") == 0
                ? &loom__mcp_sse
                : &loom__mcp_http;
    if ((rc = config_copy(&s->cfg, cfg)) != 0 ||
        (s->tr == &loom__mcp_http &&
         ((rc = loom__mcp_oauth_new(&s->oauth, s)) != 0 ||
          (rc = loom__mcp_users_new(&s->users)) != 0))) {
        loom_mcp_server_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* Drops a reference to c; the last one frees it. Called under s->mu. */
static void conn_unref_locked(loom_mcp_server *s, mcp_conn *c)
{
    if (c && --c->refs == 0) {
        s->tr->free(c->impl);
        free(c);
    }
}

/* Detaches the current connection and stops it (outside the lock). */
static void retire_conn(loom_mcp_server *s)
{
    mcp_conn *c;

    pthread_mutex_lock(&s->mu);
    c = s->conn;
    s->conn = NULL;
    pthread_mutex_unlock(&s->mu);
    if (!c)
        return;
    s->tr->stop(c->impl);
    pthread_mutex_lock(&s->mu);
    conn_unref_locked(s, c);
    pthread_mutex_unlock(&s->mu);
}

void loom_mcp_server_free(loom_mcp_server *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    retire_conn(s);
    loom__mcp_users_free(s->users);
    loom__mcp_oauth_free(s->oauth);
    json_decref(s->headers_of);
    json_decref(s->server_info);
    free(s->error);
    loom__config_mcp_server_clear(&s->cfg);
    pthread_mutex_destroy(&s->start_mu);
    loom__cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void loom__mcp_ref(loom_mcp_server *s)
{
    atomic_fetch_add(&s->refs, 1);
}

mcp_oauth *loom__mcp_oauth(loom_mcp_server *s)
{
    return s->oauth;
}

void loom_mcp_server_set_authorizer(loom_mcp_server *s,
                                    const loom_mcp_authorizer *a)
{
    if (s->oauth)
        loom__mcp_oauth_set_authorizer(s->oauth, a);
}

void loom_mcp_server_set_credentials(loom_mcp_server *s,
                                     const loom_mcp_credentials *c)
{
    if (!s->oauth)
        return;
    loom__mcp_oauth_set_credentials(s->oauth, c);
    pthread_mutex_lock(&s->mu);
    if (c)
        s->cs = *c;
    else
        memset(&s->cs, 0, sizeof(s->cs));
    pthread_mutex_unlock(&s->mu);
}

int loom_mcp_server_set_oauth_user(loom_mcp_server *s, const char *user)
{
    return s->oauth ? loom__mcp_oauth_set_user(s->oauth, user) : 0;
}

/* Whether calls to s may go through users' own servers: it has OAuth. */
static int has_oauth(const loom_mcp_server *s)
{
    return s->oauth && !s->cfg.oauth.disabled;
}

void loom_mcp_server_set_per_user(loom_mcp_server *s, int on)
{
    pthread_mutex_lock(&s->mu);
    s->per_user = on && has_oauth(s);
    pthread_mutex_unlock(&s->mu);
}

int loom__mcp_per_user(loom_mcp_server *s)
{
    int on;

    pthread_mutex_lock(&s->mu);
    on = s->per_user;
    pthread_mutex_unlock(&s->mu);
    return on;
}

mcp_users *loom__mcp_users(loom_mcp_server *s)
{
    return s->users;
}

loom_mcp_credentials loom__mcp_credentials(loom_mcp_server *s)
{
    loom_mcp_credentials cs;

    pthread_mutex_lock(&s->mu);
    cs = s->cs;
    pthread_mutex_unlock(&s->mu);
    return cs;
}

int loom__mcp_adopt(loom_mcp_server *child, loom_mcp_server *s,
                    const char *user)
{
    loom_mcp_credentials cs;
    loom_mcp_input_fn fn;
    void *arg;
    int elicit;

    pthread_mutex_lock(&s->mu);
    cs = s->cs;
    fn = s->input;
    arg = s->input_arg;
    elicit = s->may_elicit;
    pthread_mutex_unlock(&s->mu);
    child->parent = s;
    loom_mcp_server_set_credentials(child, cs.load || cs.save ? &cs : NULL);
    loom_mcp_server_set_input(child, fn, arg);
    loom_mcp_server_set_elicitation(child, elicit);
    return loom_mcp_server_set_oauth_user(child, user);
}

void loom_mcp_server_set_input(loom_mcp_server *s, loom_mcp_input_fn fn,
                               void *arg)
{
    pthread_mutex_lock(&s->mu);
    s->input = fn;
    s->input_arg = arg;
    pthread_mutex_unlock(&s->mu);
}

void loom_mcp_server_set_elicitation(loom_mcp_server *s, int on)
{
    pthread_mutex_lock(&s->mu);
    s->may_elicit = on != 0;
    pthread_mutex_unlock(&s->mu);
}

const char *loom_mcp_server_name(const loom_mcp_server *s)
{
    return s->cfg.name;
}

const loom_mcp_server_config *loom__mcp_config(const loom_mcp_server *s)
{
    return &s->cfg;
}

void loom__mcp_protocol(loom_mcp_server *s, char *out, size_t cap)
{
    pthread_mutex_lock(&s->mu);
    snprintf(out, cap, "%s", s->protocol);
    pthread_mutex_unlock(&s->mu);
}

int64_t loom__mcp_deadline(loom_mcp_server *s, const mcp_pending *p)
{
    int64_t d;

    pthread_mutex_lock(&s->mu);
    d = p->deadline;
    pthread_mutex_unlock(&s->mu);
    return d;
}

void loom__mcp_defer(loom_mcp_server *s, mcp_pending *p, int64_t ms)
{
    pthread_mutex_lock(&s->mu);
    p->deadline += ms;
    p->held += ms;
    pthread_mutex_unlock(&s->mu);
}

const json_t *loom__mcp_call_headers(const mcp_pending *p)
{
    return p && p->ctl ? p->ctl->headers : NULL;
}

int loom__mcp_answered(loom_mcp_server *s, const mcp_pending *p)
{
    int done;

    pthread_mutex_lock(&s->mu);
    done = p->done;
    pthread_mutex_unlock(&s->mu);
    return done;
}

/* Records the last error (for status); under s->mu. */
static void set_error_locked(loom_mcp_server *s, const char *msg)
{
    char *d = strdup(msg);

    if (d) {
        free(s->error);
        s->error = d;
    }
}

static int64_t backoff_ms(int failures)
{
    int64_t ms = BACKOFF_FIRST_MS;

    if (failures <= 1)
        return 0;
    for (int i = 2; i < failures && ms < BACKOFF_MAX_MS; i++)
        ms *= 2;
    return ms < BACKOFF_MAX_MS ? ms : BACKOFF_MAX_MS;
}

/* One more failure in a row: the next start waits longer. Under s->mu. */
static void count_failure_locked(loom_mcp_server *s)
{
    s->failures++;
    s->next_start = loom__mono_ms() + backoff_ms(s->failures);
}

void loom__mcp_lost(loom_mcp_server *s, unsigned gen, const char *why)
{
    pthread_mutex_lock(&s->mu);
    if (gen == s->gen && s->state == ST_READY) {
        s->state = ST_DOWN;
        /* A start under way counts its failure itself: once. */
        if (!s->starting)
            count_failure_locked(s);
        set_error_locked(s, why);
        loom_warn("mcp %s: %s", s->cfg.name, why);
    }
    for (mcp_pending *p = s->pending; p; p = p->next) {
        if (p->gen != gen || p->done)
            continue;
        p->done = 1;
        p->lost = strdup(why);
    }
    loom__cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* ---- sending ----------------------------------------------------------- */

/* The current connection with a reference, or NULL when there is none. */
static mcp_conn *conn_get(loom_mcp_server *s)
{
    mcp_conn *c;

    pthread_mutex_lock(&s->mu);
    if ((c = s->conn) != NULL)
        c->refs++;
    pthread_mutex_unlock(&s->mu);
    return c;
}

static void conn_put(loom_mcp_server *s, mcp_conn *c)
{
    pthread_mutex_lock(&s->mu);
    conn_unref_locked(s, c);
    pthread_mutex_unlock(&s->mu);
}

/* Sends a message that takes no answer, within ms. */
static int notify(loom_mcp_server *s, json_t *msg, long ms)
{
    mcp_conn *c = conn_get(s);
    int rc = LOOM_EUPSTREAM;

    if (c) {
        rc = s->tr->send(c->impl, msg, loom__mono_ms() + ms, NULL, NULL);
        conn_put(s, c);
    }
    json_decref(msg);
    return rc;
}

/* Replies to a request of the server. */
static void reply(loom_mcp_server *s, const json_t *id, json_t *result,
                  int code, const char *message)
{
    json_t *msg;

    if (result)
        msg = json_pack("{s:s,s:O,s:o}", "jsonrpc", "2.0", "id", id, "result",
                        result);
    else
        msg = json_pack("{s:s,s:O,s:{s:i,s:s}}", "jsonrpc", "2.0", "id", id,
                        "error", "code", code, "message", message);
    if (msg)
        notify(s, msg, CANCEL_SEND_MS);
}

static void on_notification(loom_mcp_server *s, const char *method,
                            const json_t *params)
{
    if (strcmp(method, "notifications/message") == 0) {
        const json_t *data = json_object_get(params, "data");
        char *text =
            data ? json_dumps(data, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        loom_info("mcp %s: log: %.400s", s->cfg.name, text ? text : "");
        free(text);
    } else if (strcmp(method, "notifications/progress") == 0) {
        const json_t *token = json_object_get(params, "progressToken");
        loom_debug("mcp %s: progress %g", s->cfg.name,
                   json_number_value(json_object_get(params, "progress")));
        pthread_mutex_lock(&s->mu);
        for (mcp_pending *p = s->pending; p; p = p->next) {
            int64_t until, cap;
            if (!p->ctl || p->done || !json_is_integer(token) ||
                json_integer_value(token) != p->id)
                continue;
            until = loom__mono_ms() + p->ctl->step_ms;
            cap = p->ctl->cap + p->held;
            p->deadline = until < cap ? until : cap;
            if (p->ctl->on_progress)
                p->ctl->on_progress(params, p->ctl->arg);
            break;
        }
        pthread_mutex_unlock(&s->mu);
    } else if (strcmp(method, "notifications/tools/list_changed") == 0) {
        loom_debug("mcp %s: its tools changed", s->cfg.name);
        loom__mcp_list_stale(s);
    } else {
        loom_debug("mcp %s: notification %.100s", s->cfg.name, method);
    }
}

unsigned loom__mcp_lists_changed(loom_mcp_server *s)
{
    return atomic_load(&s->lists_changed);
}

void loom__mcp_list_stale(loom_mcp_server *s)
{
    atomic_fetch_add(&s->lists_changed, 1);
}

/* Whether the config lets the server sample (`sampling: allow`). */
static int sampling_on(const loom_mcp_server *s)
{
    return s->cfg.sampling && strcmp(s->cfg.sampling, "allow") == 0;
}

/*
 * The capabilities loom declares: elicitation when someone may answer
 * (for a 2026-07-28 request, ctl: when that call's answerer does),
 * sampling and roots when the config gives them.
 */
static json_t *client_caps(loom_mcp_server *s, const call_ctl *ctl)
{
    json_t *caps = json_object();
    int elicit;

    pthread_mutex_lock(&s->mu);
    elicit = s->input != NULL || (ctl ? ctl->elicit : s->may_elicit);
    pthread_mutex_unlock(&s->mu);
    if (caps && ((elicit && json_object_set_new(caps, "elicitation",
                                                json_object()) != 0) ||
                 (sampling_on(s) &&
                  json_object_set_new(caps, "sampling", json_object()) != 0) ||
                 (s->cfg.roots_len &&
                  json_object_set_new(caps, "roots", json_object()) != 0))) {
        json_decref(caps);
        caps = NULL;
    }
    return caps;
}

/* The answer to roots/list: the config's roots, each named by its last
 * path segment. */
static json_t *roots_result(const loom_mcp_server *s)
{
    json_t *list = json_array();

    for (size_t i = 0; list && i < s->cfg.roots_len; i++) {
        const char *uri = s->cfg.roots[i], *slash;
        size_t n = strlen(uri);
        while (n > 8 && uri[n - 1] == '/')
            n--;
        for (slash = uri + n; slash > uri && slash[-1] != '/'; slash--)
            ;
        if (json_array_append_new(
                list, json_pack("{s:s,s:s%}", "uri", uri, "name", slash,
                                (size_t)(uri + n - slash))) != 0) {
            json_decref(list);
            list = NULL;
        }
    }
    return list ? json_pack("{s:o}", "roots", list) : NULL;
}

/* An elicitation declined: nobody can answer it. */
static int decline(json_t **result)
{
    return (*result = json_pack("{s:s}", "action", "decline")) ? 0 : -32603;
}

/* The JSON-RPC error a sampling answerer's failure rc is told by: a
 * refusal (nobody to sample for: the spec's "user rejected"), bad
 * params, or anything else. */
static int sampling_error(int rc)
{
    return rc == LOOM_ENOTFOUND ? -1 : rc == LOOM_EINVALID ? -32602 : -32603;
}

/* Who answers a request of the server: the call's answerer when it has
 * one (and, for an elicitation, answers those: mine), else the
 * server's; NULL: nobody. */
static loom_mcp_input_fn answerer(loom_mcp_server *s, const call_ctl *ctl,
                                  int mine, void **arg)
{
    loom_mcp_input_fn fn;

    if (ctl && ctl->input && mine) {
        *arg = ctl->input_arg;
        return ctl->input;
    }
    pthread_mutex_lock(&s->mu);
    fn = s->input;
    *arg = s->input_arg;
    pthread_mutex_unlock(&s->mu);
    return fn;
}

/*
 * A sampling/createMessage of the server: refused as unknown unless the
 * config allows it (the capability is then not declared either), else
 * given to the call's answerer (or the server's), which makes it with
 * its run's model; refused with -1 when there is none (a call outside a
 * run). msg (cap bytes) gets why it failed.
 */
static int answer_sampling(loom_mcp_server *s, const call_ctl *ctl,
                           const json_t *params, json_t **result, char *msg,
                           size_t cap)
{
    loom_mcp_input_fn fn;
    void *arg;
    int rc;

    if (!sampling_on(s)) {
        snprintf(msg, cap, "sampling is not allowed for this server");
        return -32601;
    }
    if (!(fn = answerer(s, ctl, 1, &arg))) {
        snprintf(msg, cap, "sampling is answered only during a run");
        return -1;
    }
    if ((rc = fn(s, "sampling/createMessage", params, arg, result)) != 0 ||
        !json_is_object(*result)) {
        snprintf(msg, cap, "%s",
                 rc ? loom_error_last() : "the answer is not an object");
        json_decref(*result);
        *result = NULL;
        return sampling_error(rc);
    }
    return 0;
}

/*
 * The answer to a request of the server (method, params) that comes with
 * the call ctl (NULL: none known): ping, an elicitation (through the
 * call's answerer, else the server's, with the schema's defaults filled
 * in; declined when nobody answers), sampling (answer_sampling), roots.
 * Sets *result, or returns a JSON-RPC error code (-32601 not supported,
 * -32603 the answerer failed, ...) with msg (cap bytes) saying why.
 */
static int answer_input(loom_mcp_server *s, const call_ctl *ctl,
                        const char *method, const json_t *params,
                        json_t **result, char *msg, size_t cap)
{
    loom_mcp_input_fn fn;
    void *arg;
    json_t *content;

    *result = NULL;
    snprintf(msg, cap, "Internal error");
    if (strcmp(method, "ping") == 0)
        return (*result = json_object()) ? 0 : -32603;
    if (strcmp(method, "roots/list") == 0)
        return (*result = roots_result(s)) ? 0 : -32603;
    if (strcmp(method, "sampling/createMessage") == 0)
        return answer_sampling(s, ctl, params, result, msg, cap);
    if (strcmp(method, "elicitation/create") != 0) {
        snprintf(msg, cap, "Method not found");
        return -32601;
    }
    if (!(fn = answerer(s, ctl, ctl && ctl->elicit, &arg)))
        return decline(result);
    if (fn(s, method, params, arg, result) != 0 || !json_is_object(*result)) {
        json_decref(*result);
        *result = NULL;
        return -32603;
    }
    content = json_object_get(*result, "content");
    if (json_is_object(content) &&
        loom__mcp_apply_defaults(json_object_get(params, "requestedSchema"),
                                 content) != 0) {
        json_decref(*result);
        *result = NULL;
        return -32603;
    }
    return 0;
}

/* Answers the request msg of the server with what answer_input says. */
static void answer_request(loom_mcp_server *s, const call_ctl *ctl,
                           const json_t *msg)
{
    json_t *result = NULL;
    char why[512];
    int code =
        answer_input(s, ctl, json_string_value(json_object_get(msg, "method")),
                     json_object_get(msg, "params"), &result, why, sizeof(why));

    if (code == 0)
        reply(s, json_object_get(msg, "id"), result, 0, NULL);
    else
        reply(s, json_object_get(msg, "id"), NULL, code, why);
}

/* Whether answering method may wait on whoever answers the call (a
 * person, or a model call of the caller's run). */
static int asks_caller(const char *method)
{
    return strcmp(method, "elicitation/create") == 0 ||
           strcmp(method, "sampling/createMessage") == 0;
}

/*
 * Hands a request of the server that a call's answerer should answer to
 * that call (under s->mu): the only call of connection gen in flight
 * with an answerer gets it in its inbox, and its thread answers it.
 * Returns 0 when it did; 1 when there is no such call (or several, which
 * cannot be told apart: the request is then answered as the server's).
 */
static int route_locked(loom_mcp_server *s, unsigned gen, json_t *msg)
{
    mcp_pending *to = NULL;
    int n = 0;

    for (mcp_pending *p = s->pending; p; p = p->next)
        if (p->gen == gen && !p->done && p->ctl && p->ctl->input) {
            to = p;
            n++;
        }
    if (n != 1) {
        if (n > 1)
            loom_warn("mcp %s: %d calls in flight could have asked for "
                      "input; not knowing which, none is asked",
                      s->cfg.name, n);
        return 1;
    }
    if ((!to->inbox && !(to->inbox = json_array())) ||
        json_array_append(to->inbox, msg) != 0)
        return 1;
    loom__cond_broadcast(&s->cv);
    return 0;
}

void loom__mcp_dispatch(loom_mcp_server *s, unsigned gen, json_t *msg)
{
    const json_t *id = json_object_get(msg, "id");
    const json_t *method = json_object_get(msg, "method");

    if (json_is_array(msg)) {
        /* A batch (2025-03-26 allowed them): each message in turn. */
        for (size_t i = 0; i < json_array_size(msg); i++)
            loom__mcp_dispatch(s, gen, json_incref(json_array_get(msg, i)));
        json_decref(msg);
        return;
    }
    if (!json_is_object(msg)) {
        loom_warn("mcp %s: skipped a message that is not a JSON object",
                  s->cfg.name);
    } else if (json_is_string(method) && id && !json_is_null(id)) {
        mcp_pending *p = tl_sending;
        int mine;
        if (!asks_caller(json_string_value(method))) {
            answer_request(s, NULL, msg);
        } else if (p) {
            /* On the stream of the call this thread sends: its own, and
             * the person's time does not count toward its timeout. */
            int64_t t0 = loom__mono_ms();
            answer_request(s, p->ctl, msg);
            loom__mcp_defer(s, p, loom__mono_ms() - t0);
        } else {
            pthread_mutex_lock(&s->mu);
            mine = route_locked(s, gen, msg);
            pthread_mutex_unlock(&s->mu);
            if (mine)
                answer_request(s, NULL, msg);
        }
    } else if (json_is_string(method)) {
        on_notification(s, json_string_value(method),
                        json_object_get(msg, "params"));
    } else if (json_is_integer(id)) {
        pthread_mutex_lock(&s->mu);
        for (mcp_pending *p = s->pending; p; p = p->next) {
            if (p->id != json_integer_value(id) || p->gen != gen || p->done)
                continue;
            p->done = 1;
            p->answer = json_incref(msg);
            loom__cond_broadcast(&s->cv);
            break;
        }
        pthread_mutex_unlock(&s->mu);
    } else {
        loom_debug("mcp %s: skipped an answer with an id loom did not send",
                   s->cfg.name);
    }
    json_decref(msg);
}

static void unlink_pending_locked(loom_mcp_server *s, mcp_pending *p)
{
    for (mcp_pending **pp = &s->pending; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            return;
        }
}

/* The answer's result, or the error it carries as a message. */
static int take_answer(loom_mcp_server *s, const char *method, json_t *answer,
                       json_t **result)
{
    const json_t *err = json_object_get(answer, "error");
    const json_t *res = json_object_get(answer, "result");

    if (err) {
        const char *m = json_string_value(json_object_get(err, "message"));
        return loom__error_set(
            LOOM_EUPSTREAM, "MCP server '%s': %s failed: %.500s (code %lld)",
            s->cfg.name, method, m ? m : "no message",
            (long long)json_integer_value(json_object_get(err, "code")));
    }
    if (!json_is_object(res))
        return loom__error_set(LOOM_EPROTO,
                               "MCP server '%s': the answer to %s has no "
                               "result object",
                               s->cfg.name, method);
    *result = json_incref((json_t *)res);
    return 0;
}

/* Asks for progress: _meta.progressToken is id (params made when NULL;
 * freed on failure). */
static int add_progress_token(json_t **params, json_int_t id)
{
    json_t *meta;

    if (!*params && !(*params = json_object()))
        return LOOM_ENOMEM;
    if (!(meta = json_object_get(*params, "_meta")) &&
        json_object_set_new(*params, "_meta", json_object()) == 0)
        meta = json_object_get(*params, "_meta");
    if (!meta || json_object_set_new(meta, "progressToken", json_integer(id))) {
        json_decref(*params);
        *params = NULL;
        return LOOM_ENOMEM;
    }
    return 0;
}

/*
 * Sends one request on the current connection and waits for its answer
 * until deadline or cancel; *answer is the whole answer message (a
 * result or an error). In the 2026-07-28 era params get the `_meta` of
 * the era. On a timeout or cancellation, the server is told with
 * notifications/cancelled (initialize excepted, as the spec says; in the
 * 2026-07-28 era over HTTP the transport closing the request's stream
 * says it, while stdio, which has no stream per request, still sends the
 * notification).
 */
static int request(loom_mcp_server *s, const char *method, json_t *params,
                   int64_t deadline, loom_cancel *cancel, const call_ctl *ctl,
                   json_t **answer)
{
    mcp_pending *pp = calloc(1, sizeof(*pp));
    mcp_conn *c;
    json_t *msg = NULL;
    int rc = 0, sent, stateless;
    char version[32];

    *answer = NULL;
    if (!pp) {
        json_decref(params);
        return loom__error_oom();
    }
    pthread_mutex_lock(&s->mu);
    if (!(c = s->conn) || s->state != ST_READY) {
        pthread_mutex_unlock(&s->mu);
        json_decref(params);
        free(pp);
        return loom__error_set(LOOM_EUPSTREAM, "MCP server '%s' is not running",
                               s->cfg.name);
    }
    c->refs++;
    stateless = s->stateless;
    snprintf(version, sizeof(version), "%s", s->protocol);
    pp->id = s->next_id++;
    pp->gen = c->gen;
    pp->deadline = deadline;
    pp->ctl = ctl;
    pp->next = s->pending;
    s->pending = pp;
    pthread_mutex_unlock(&s->mu);

    if (stateless) {
        json_t *caps = client_caps(s, ctl);
        if (!params)
            params = json_object();
        if (!caps || !params ||
            json_object_set_new(params, "_meta",
                                loom__mcp_meta(version, caps)) != 0) {
            json_decref(params);
            params = NULL;
        }
        json_decref(caps);
        if (!params) {
            pthread_mutex_lock(&s->mu);
            unlink_pending_locked(s, pp);
            pthread_mutex_unlock(&s->mu);
            rc = loom__error_oom();
            goto done;
        }
    }
    if (ctl && add_progress_token(&params, pp->id) != 0) {
        pthread_mutex_lock(&s->mu);
        unlink_pending_locked(s, pp);
        pthread_mutex_unlock(&s->mu);
        rc = loom__error_oom();
        goto done;
    }
    msg = json_pack("{s:s,s:I,s:s}", "jsonrpc", "2.0", "id", (json_int_t)pp->id,
                    "method", method);
    if (!msg || (params && json_object_set_new(msg, "params", params) != 0)) {
        rc = loom__error_oom();
        params = NULL;
        pthread_mutex_lock(&s->mu);
        unlink_pending_locked(s, pp);
        pthread_mutex_unlock(&s->mu);
        goto done;
    }
    params = NULL;
    tl_sending = pp;
    sent = s->tr->send(c->impl, msg, deadline, cancel, pp);
    tl_sending = NULL;

    pthread_mutex_lock(&s->mu);
    while (!pp->done && sent == 0) {
        int64_t now = loom__mono_ms(), until;

        if (json_array_size(pp->inbox)) {
            /* A request of the server routed to this call: answered
             * here, the person's time not counted. */
            json_t *in = json_incref(json_array_get(pp->inbox, 0));
            json_array_remove(pp->inbox, 0);
            pthread_mutex_unlock(&s->mu);
            answer_request(s, pp->ctl, in);
            json_decref(in);
            pthread_mutex_lock(&s->mu);
            pp->deadline += loom__mono_ms() - now;
            pp->held += loom__mono_ms() - now;
            continue;
        }
        if (loom_cancel_is_set(cancel) || now >= pp->deadline)
            break;
        until = pp->deadline - now < WAIT_TICK_MS ? pp->deadline - now
                                                  : WAIT_TICK_MS;
        loom__cond_wait_cancel(&s->cv, &s->mu, (double)(now + until), cancel);
    }
    unlink_pending_locked(s, pp);
    pthread_mutex_unlock(&s->mu);

    if (pp->done && pp->lost)
        rc = loom__error_set(LOOM_EUPSTREAM, "MCP server '%s': %s", s->cfg.name,
                             pp->lost);
    else if (pp->done)
        *answer = json_incref(pp->answer);
    else if (sent != 0 && sent != LOOM_ETIMEDOUT && sent != LOOM_ECANCELED)
        rc = sent;
    else if (loom_cancel_is_set(cancel))
        rc = loom__error_set(LOOM_ECANCELED, "MCP server '%s': %s cancelled",
                             s->cfg.name, method);
    else
        rc = loom__error_set(LOOM_ETIMEDOUT,
                             "MCP server '%s': no answer to %s in time",
                             s->cfg.name, method);
    if ((rc == LOOM_ETIMEDOUT || rc == LOOM_ECANCELED) &&
        (!stateless || s->tr == &loom__mcp_stdio) &&
        strcmp(method, "initialize") != 0) {
        json_t *n = json_pack("{s:s,s:s,s:{s:I,s:s}}", "jsonrpc", "2.0",
                              "method", "notifications/cancelled", "params",
                              "requestId", (json_int_t)pp->id, "reason",
                              rc == LOOM_ETIMEDOUT ? "timeout" : "cancelled");
        if (n) {
            char why[256];
            snprintf(why, sizeof(why), "%s", loom_error_last());
            s->tr->send(c->impl, n, loom__mono_ms() + CANCEL_SEND_MS, NULL,
                        NULL);
            json_decref(n);
            rc = loom__error_set(rc, "%s", why);
        }
    }

done:
    json_decref(msg);
    json_decref(pp->answer);
    json_decref(pp->inbox);
    free(pp->lost);
    free(pp);
    conn_put(s, c);
    return rc;
}

/* ---- the handshake ----------------------------------------------------- */

static int known_version(const char *v)
{
    for (size_t i = 0; versions[i]; i++)
        if (v && strcmp(v, versions[i]) == 0)
            return 1;
    return 0;
}

/* initialize, then notifications/initialized. The state is READY for
 * the handshake's own requests; the caller resets it on failure. */
static int handshake(loom_mcp_server *s, int64_t deadline)
{
    json_t *params, *result = NULL, *n, *answer = NULL;
    const char *v, *want = s->cfg.protocol_version;
    int rc;

    params = json_pack("{s:s,s:o,s:{s:s,s:s}}", "protocolVersion",
                       want ? want : LOOM_MCP_PROTOCOL_VERSION, "capabilities",
                       client_caps(s, NULL), "clientInfo", "name", "loom",
                       "version", loom_version());
    if (!params)
        return loom__error_oom();
    if ((rc = request(s, "initialize", params, deadline, NULL, NULL,
                      &answer)) != 0)
        return rc;
    rc = take_answer(s, "initialize", answer, &result);
    json_decref(answer);
    if (rc != 0)
        return rc;
    v = json_string_value(json_object_get(result, "protocolVersion"));
    if (!known_version(v)) {
        rc = loom__error_set(LOOM_EPROTO,
                             "MCP server '%s' speaks protocol version %.40s, "
                             "which loom does not (it speaks %s to %s)",
                             s->cfg.name, v ? v : "(none)",
                             LOOM_MCP_PROTOCOL_VERSION, "2024-11-05");
        goto done;
    }
    pthread_mutex_lock(&s->mu);
    snprintf(s->protocol, sizeof(s->protocol), "%s", v);
    json_decref(s->server_info);
    s->server_info = json_incref(json_object_get(result, "serverInfo"));
    pthread_mutex_unlock(&s->mu);
    n = json_pack("{s:s,s:s}", "jsonrpc", "2.0", "method",
                  "notifications/initialized");
    rc = n ? notify(s, n, deadline - loom__mono_ms()) : loom__error_oom();

done:
    json_decref(result);
    return rc;
}

/*
 * The 2026-07-28 era's start: server/discover, which also says whether
 * the server speaks the era. *old is set when it does not (an error, or
 * an answer without the version among its supportedVersions): the caller
 * falls back to initialize when it was only probing.
 */
static int discover(loom_mcp_server *s, int64_t deadline, int *old)
{
    json_t *answer = NULL, *result = NULL, *info;
    const json_t *supported, *v;
    size_t i;
    int rc;

    *old = 1;
    if ((rc = request(s, "server/discover", NULL, deadline, NULL, NULL,
                      &answer)) != 0)
        return rc == LOOM_ECANCELED || rc == LOOM_ENOMEM ||
                       (s->oauth && loom__mcp_oauth_failed(s->oauth))
                   ? rc
                   : 0;
    if (take_answer(s, "server/discover", answer, &result) != 0) {
        json_decref(answer);
        return 0;
    }
    json_decref(answer);
    supported = json_object_get(result, "supportedVersions");
    json_array_foreach(supported, i, v)
    {
        if (json_is_string(v) &&
            strcmp(json_string_value(v), LOOM_MCP_PROTOCOL_STATELESS) == 0)
            *old = 0;
    }
    info = json_object_get(json_object_get(result, "_meta"),
                           "io.modelcontextprotocol/serverInfo");
    if (!info)
        info = json_object_get(result, "serverInfo");
    pthread_mutex_lock(&s->mu);
    json_decref(s->server_info);
    s->server_info = json_incref(info);
    s->listen_tools = json_is_true(json_object_get(
        json_object_get(json_object_get(result, "capabilities"), "tools"),
        "listChanged"));
    pthread_mutex_unlock(&s->mu);
    json_decref(result);
    return 0;
}

json_t *loom__mcp_listen_request(loom_mcp_server *s)
{
    json_t *caps = client_caps(s, NULL), *meta = NULL, *msg = NULL;
    json_int_t id;
    char version[32];

    pthread_mutex_lock(&s->mu);
    id = s->next_id++;
    snprintf(version, sizeof(version), "%s", s->protocol);
    pthread_mutex_unlock(&s->mu);
    if (caps && (meta = loom__mcp_meta(version, caps)) != NULL)
        msg = json_pack("{s:s,s:I,s:s,s:{s:o,s:{s:b}}}", "jsonrpc", "2.0", "id",
                        id, "method", "subscriptions/listen", "params", "_meta",
                        meta, "notifications", "toolsListChanged", 1);
    json_decref(caps);
    return msg;
}

void loom__mcp_listen_refused(loom_mcp_server *s, const json_t *error)
{
    const char *m = json_string_value(json_object_get(error, "message"));

    loom_info("mcp %s: subscriptions/listen refused (%.200s): its list "
              "changes are not followed",
              s->cfg.name, m ? m : "no message");
}

/* How long a probe with server/discover may take before the server is
 * taken for an old one that does not answer unknown methods. */
#define PROBE_MS 5000

/*
 * Settles the era on a new connection: a protocol_version in the config
 * fixes it; without one, server/discover probes and an old server gets
 * initialize.
 */
static int open_era(loom_mcp_server *s, int64_t deadline)
{
    const char *want = s->cfg.protocol_version;
    /* The legacy HTTP+SSE transport is of the 2024-11-05 era: no probe. */
    int probe = !want && s->tr != &loom__mcp_sse, old = 0, rc;
    int64_t probe_end = loom__mono_ms() + PROBE_MS;

    if (probe || (want && strcmp(want, LOOM_MCP_PROTOCOL_STATELESS) == 0)) {
        pthread_mutex_lock(&s->mu);
        s->stateless = 1;
        snprintf(s->protocol, sizeof(s->protocol), "%s",
                 LOOM_MCP_PROTOCOL_STATELESS);
        pthread_mutex_unlock(&s->mu);
        rc = discover(s, probe && probe_end < deadline ? probe_end : deadline,
                      &old);
        if (rc != 0 || !probe || !old)
            return rc;
        pthread_mutex_lock(&s->mu);
        s->stateless = 0;
        s->protocol[0] = '\0';
        pthread_mutex_unlock(&s->mu);
        loom_debug("mcp %s: no 2026-07-28 answer to server/discover; "
                   "shaking hands with initialize",
                   s->cfg.name);
    }
    return handshake(s, deadline);
}

/* Starts the server when it is not running (see the top of the file). */
static int ensure_started(loom_mcp_server *s)
{
    mcp_conn *c = NULL;
    int64_t now, deadline;
    int rc;

    pthread_mutex_lock(&s->start_mu);
    pthread_mutex_lock(&s->mu);
    now = loom__mono_ms();
    if (s->state == ST_READY) {
        pthread_mutex_unlock(&s->mu);
        pthread_mutex_unlock(&s->start_mu);
        return 0;
    }
    if (s->failures && now < s->next_start) {
        rc = loom__error_set(LOOM_EUPSTREAM,
                             "MCP server '%s' is down (%s); next start "
                             "attempt in %lld ms",
                             s->cfg.name, s->error ? s->error : "failed",
                             (long long)(s->next_start - now));
        pthread_mutex_unlock(&s->mu);
        pthread_mutex_unlock(&s->start_mu);
        return rc;
    }
    s->protocol[0] = '\0';
    s->stateless = 0;
    s->listen_tools = 0;
    /* 2: a restart (the server ran before, or failed to start). */
    s->starting = s->gen || s->failures ? 2 : 1;
    pthread_mutex_unlock(&s->mu);

    retire_conn(s);
    deadline = now + s->cfg.startup_timeout_ms;
    if (!(c = calloc(1, sizeof(*c)))) {
        rc = loom__error_oom();
        goto fail;
    }
    pthread_mutex_lock(&s->mu);
    c->gen = ++s->gen;
    c->refs = 1;
    pthread_mutex_unlock(&s->mu);
    if ((rc = s->tr->open(s, c->gen, &c->impl)) != 0) {
        free(c);
        goto fail;
    }
    pthread_mutex_lock(&s->mu);
    s->conn = c;
    s->state = ST_READY;
    pthread_mutex_unlock(&s->mu);
    if ((rc = open_era(s, deadline)) != 0)
        goto fail;
    loom_info("mcp %s: connected (%s, protocol %s)", s->cfg.name, s->tr->name,
              s->protocol);
    /* A 2026-07-28 server tells of list changes on a subscription only. */
    if (s->stateless && s->listen_tools && s->tr->listen)
        s->tr->listen(c->impl);
    pthread_mutex_lock(&s->mu);
    s->starting = 0;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_unlock(&s->start_mu);
    return 0;

fail : {
    char why[512];
    snprintf(why, sizeof(why), "%s", loom_error_last());
    pthread_mutex_lock(&s->mu);
    s->state = ST_FAILED;
    s->starting = 0;
    count_failure_locked(s);
    set_error_locked(s, why);
    pthread_mutex_unlock(&s->mu);
    retire_conn(s);
    pthread_mutex_unlock(&s->start_mu);
    return loom__error_set(rc, "%s", why);
}
}

/* The most rounds of input_required answers one request may take. */
#define MAX_INPUT_ROUNDS 8

/*
 * Whether answer refuses the protocol version with -32022 while naming
 * the one loom speaks among those it supports: the request is then sent
 * again (once).
 */
static int version_refused(loom_mcp_server *s, const json_t *answer)
{
    const json_t *err = json_object_get(answer, "error"), *v;
    const json_t *supported =
        json_object_get(json_object_get(err, "data"), "supported");
    char version[32];
    size_t i;

    if (json_integer_value(json_object_get(err, "code")) != -32022)
        return 0;
    loom__mcp_protocol(s, version, sizeof(version));
    json_array_foreach(supported, i, v)
    {
        if (json_is_string(v) && strcmp(json_string_value(v), version) == 0)
            return 1;
    }
    return 0;
}

/*
 * A 2026-07-28 input_required result: each of its inputRequests is
 * answered (answer_input) and p, the request's params, gets them as
 * inputResponses, with the result's requestState echoed as it came (or
 * none when it gave none), for the request to be sent again.
 */
static int take_inputs(loom_mcp_server *s, const call_ctl *ctl,
                       const json_t *res, json_t *p)
{
    const json_t *reqs = json_object_get(res, "inputRequests"), *r;
    const json_t *state = json_object_get(res, "requestState");
    json_t *responses = json_object();
    const char *key;

    if (!responses)
        return loom__error_oom();
    json_object_foreach((json_t *)reqs, key, r)
    {
        const char *m = json_string_value(json_object_get(r, "method"));
        json_t *one = NULL;
        char why[512] = "no method";
        if (!m || answer_input(s, ctl, m, json_object_get(r, "params"), &one,
                               why, sizeof(why)) != 0) {
            json_decref(responses);
            return loom__error_set(LOOM_EUPSTREAM,
                                   "MCP server '%s' asks for input loom "
                                   "cannot give (%.60s: %s)",
                                   s->cfg.name, m ? m : "?", why);
        }
        if (json_object_set_new(responses, key, one) != 0) {
            json_decref(responses);
            return loom__error_oom();
        }
    }
    if (json_object_set_new(p, "inputResponses", responses) != 0 ||
        (state ? json_object_set(p, "requestState", (json_t *)state)
               : (json_object_del(p, "requestState"), 0)) != 0)
        return loom__error_oom();
    return 0;
}

/*
 * A request with the server started first. An HTTP session that expired
 * (LOOM_ENOTFOUND from the transport) starts a new one and sends again,
 * once; so does a request whose protocol version was refused while the
 * server supports it. An input_required result is answered and the
 * request sent again (with a new id), up to MAX_INPUT_ROUNDS times.
 */
static int call_here(loom_mcp_server *s, const char *method,
                     const json_t *params, long timeout_ms, loom_cancel *cancel,
                     call_ctl *ctl, json_t **result)
{
    int64_t deadline = loom__mono_ms() + timeout_ms;
    json_t *p = params ? json_deep_copy(params) : NULL;
    int rc = 0, expired = 0, refused = 0, rounds = 0;

    *result = NULL;
    if (params && !p)
        return loom__error_oom();
    for (;;) {
        json_t *answer = NULL, *res = NULL, *copy = NULL;
        if ((rc = ensure_started(s)) != 0)
            break;
        if (p && !(copy = json_deep_copy(p))) {
            rc = loom__error_oom();
            break;
        }
        rc = request(s, method, copy, deadline, cancel, ctl, &answer);
        if (rc == LOOM_ENOTFOUND && !expired++) {
            pthread_mutex_lock(&s->mu);
            s->state = ST_DOWN;
            pthread_mutex_unlock(&s->mu);
            loom_info("mcp %s: the session expired; starting a new one",
                      s->cfg.name);
            continue;
        }
        if (rc != 0)
            break;
        if (!refused++ && version_refused(s, answer)) {
            json_decref(answer);
            continue;
        }
        rc = take_answer(s, method, answer, &res);
        json_decref(answer);
        if (rc != 0)
            break;
        if (!json_is_string(json_object_get(res, "resultType")) ||
            strcmp(json_string_value(json_object_get(res, "resultType")),
                   "input_required") != 0) {
            *result = res;
            break;
        }
        if (++rounds > MAX_INPUT_ROUNDS) {
            json_decref(res);
            rc = loom__error_set(LOOM_EUPSTREAM,
                                 "MCP server '%s': %s still asks for input "
                                 "after %d rounds",
                                 s->cfg.name, method, MAX_INPUT_ROUNDS);
            break;
        }
        if (!p && !(p = json_object())) {
            rc = loom__error_oom();
        } else {
            /* A person's time to answer does not count. */
            int64_t t0 = loom__mono_ms(), spent;
            rc = take_inputs(s, ctl, res, p);
            spent = loom__mono_ms() - t0;
            deadline += spent;
            if (ctl)
                ctl->cap += spent;
        }
        json_decref(res);
        if (rc != 0)
            break;
    }
    json_decref(p);
    if (rc == LOOM_ENOTFOUND)
        rc = loom__error_set(LOOM_EUPSTREAM,
                             "MCP server '%s': the session expired twice",
                             s->cfg.name);
    if (rc == 0) {
        pthread_mutex_lock(&s->mu);
        s->failures = 0;
        pthread_mutex_unlock(&s->mu);
    }
    return rc;
}

/* A call_here() handed from a fiber to a thread for blocking work. */
typedef struct {
    loom_mcp_server *s;
    const char *method;
    const json_t *params;
    long timeout_ms;
    loom_cancel *cancel;
    call_ctl *ctl;
    json_t *result;
    int rc;
    char why[512]; /* the error's message */
    int done;      /* under mu */
    pthread_mutex_t mu;
    loom__cond cv;
} off_call;

static void off_call_main(void *arg)
{
    off_call *o = arg;
    int rc = call_here(o->s, o->method, o->params, o->timeout_ms, o->cancel,
                       o->ctl, &o->result);

    if (rc != 0)
        snprintf(o->why, sizeof(o->why), "%s", loom_error_last());
    pthread_mutex_lock(&o->mu);
    o->rc = rc;
    o->done = 1;
    loom__cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

/*
 * call_here(), on a thread for blocking work when the caller is a fiber
 * and s speaks HTTP (see the top): the fiber parks until it returned
 * (the call looks at cancel itself). The same result and error.
 */
static int call(loom_mcp_server *s, const char *method, const json_t *params,
                long timeout_ms, loom_cancel *cancel, call_ctl *ctl,
                json_t **result)
{
    loom__sched *sched = loom__fiber_sched();
    off_call o;
    int rc;

    if (!sched || s->tr == &loom__mcp_stdio)
        return call_here(s, method, params, timeout_ms, cancel, ctl, result);
    memset(&o, 0, sizeof(o));
    o.s = s;
    o.method = method;
    o.params = params;
    o.timeout_ms = timeout_ms;
    o.cancel = cancel;
    o.ctl = ctl;
    if (pthread_mutex_init(&o.mu, NULL) != 0)
        return loom__error_oom();
    if (loom__cond_init(&o.cv) != 0) {
        pthread_mutex_destroy(&o.mu);
        return loom__error_oom();
    }
    if (loom__sched_blocking(sched, off_call_main, &o) != 0) {
        /* No thread: on the fiber, as it would block one anyway. */
        rc = call_here(s, method, params, timeout_ms, cancel, ctl, result);
    } else {
        pthread_mutex_lock(&o.mu);
        while (!o.done)
            loom__cond_wait(&o.cv, &o.mu, -1);
        pthread_mutex_unlock(&o.mu);
        *result = o.result;
        rc = o.rc ? loom__error_set(o.rc, "%s", o.why) : 0;
    }
    loom__cond_destroy(&o.cv);
    pthread_mutex_destroy(&o.mu);
    return rc;
}

int loom_mcp_server_request(loom_mcp_server *s, const char *method,
                            const json_t *params, long timeout_ms,
                            loom_cancel *cancel, json_t **out)
{
    int rc;

    loom__mcp_ref(s);
    rc =
        call(s, method, params, timeout_ms > 0 ? timeout_ms : s->cfg.timeout_ms,
             cancel, NULL, out);
    loom_mcp_server_free(s);
    return rc;
}

/* ---- tools ------------------------------------------------------------- */

static int allowed(const loom_mcp_server *s, const char *name)
{
    if (!s->cfg.tools)
        return 1;
    for (size_t i = 0; i < s->cfg.tools_len; i++)
        if (strcmp(s->cfg.tools[i], name) == 0)
            return 1;
    return 0;
}

/*
 * Appends page's tools (valid ones, allowed ones) to all, and the
 * x-mcp-header annotations of those that have some to headers. A tool
 * with a bad annotation is left out with a warning.
 */
static int add_page(loom_mcp_server *s, const json_t *page, json_t *all,
                    json_t *headers)
{
    const json_t *tools = json_object_get(page, "tools");
    const json_t *t;
    size_t i;

    if (!json_is_array(tools))
        return loom__error_set(LOOM_EPROTO,
                               "MCP server '%s': tools/list has no tools list",
                               s->cfg.name);
    json_array_foreach(tools, i, t)
    {
        const char *name = json_string_value(json_object_get(t, "name"));
        json_t *map = NULL;
        char why[256];
        int rc;

        if (!name || !*name) {
            loom_warn("mcp %s: skipped a tool without a name", s->cfg.name);
            continue;
        }
        if (!allowed(s, name))
            continue;
        if ((rc = loom__mcp_tool_headers(t, &map, why, sizeof(why))) ==
            LOOM_EINVALID) {
            loom_warn("mcp %s: skipped tool '%.100s': %s", s->cfg.name, name,
                      why);
            continue;
        }
        if (rc != 0 || (map && json_object_set_new(headers, name, map) != 0) ||
            json_array_append((json_t *)all, (json_t *)t))
            return loom__error_oom();
    }
    return 0;
}

int loom_mcp_server_tools(loom_mcp_server *s, json_t **out)
{
    json_t *all = json_array(), *cursors = json_object(), *page = NULL;
    json_t *params = NULL, *headers = json_object();
    char *cursor = NULL;
    int rc = 0, pages = 0;

    *out = NULL;
    if (!all || !cursors || !headers) {
        rc = loom__error_oom();
        goto done;
    }
    for (;;) {
        const json_t *next;
        json_decref(params);
        params = cursor ? json_pack("{s:s}", "cursor", cursor) : NULL;
        if (cursor && !params) {
            rc = loom__error_oom();
            goto done;
        }
        if ((rc = call(s, "tools/list", params, s->cfg.startup_timeout_ms, NULL,
                       NULL, &page)) != 0 ||
            (rc = add_page(s, page, all, headers)) != 0)
            goto done;
        pages++;
        next = json_object_get(page, "nextCursor");
        if (!json_is_string(next) || !*json_string_value(next))
            break;
        if ((cursor && strcmp(cursor, json_string_value(next)) == 0) ||
            json_object_get(cursors, json_string_value(next))) {
            loom_warn("mcp %s: tools/list gave back a cursor it gave "
                      "before; keeping the %zu tools listed",
                      s->cfg.name, json_array_size(all));
            break;
        }
        if (pages >= MAX_PAGES) {
            loom_warn("mcp %s: tools/list has more than %d pages; keeping "
                      "the %zu tools listed",
                      s->cfg.name, MAX_PAGES, json_array_size(all));
            break;
        }
        free(cursor);
        if (!(cursor = strdup(json_string_value(next))) ||
            json_object_set_new(cursors, cursor, json_true()) != 0) {
            rc = loom__error_oom();
            goto done;
        }
        json_decref(page);
        page = NULL;
    }
    *out = all;
    all = NULL;
    pthread_mutex_lock(&s->mu);
    json_decref(s->headers_of);
    s->headers_of = headers;
    headers = NULL;
    s->ntools = (long)json_array_size(*out);
    pthread_mutex_unlock(&s->mu);

done:
    json_decref(headers);
    free(cursor);
    json_decref(params);
    json_decref(page);
    json_decref(cursors);
    json_decref(all);
    return rc;
}

int loom_mcp_server_call_opts(loom_mcp_server *s, const char *tool,
                              const json_t *args,
                              const loom_mcp_call_options *o, json_t **out)
{
    long timeout = o && o->timeout_ms > 0 ? o->timeout_ms : s->cfg.timeout_ms;
    call_ctl ctl = {0};
    json_t *params;
    int rc;

    *out = NULL;
    params = json_pack("{s:s,s:o}", "name", tool, "arguments",
                       json_is_object(args) ? json_incref((json_t *)args)
                                            : json_object());
    if (!params)
        return loom__error_oom();
    ctl.step_ms = timeout;
    ctl.cap = loom__mono_ms() +
              (o && o->total_ms > 0 ? o->total_ms : TOTAL_TIMES * timeout);
    if (o && o->user && has_oauth(s)) {
        /* The user's own connection, with the user's own tokens. */
        loom_mcp_call_options mine = *o;
        loom_mcp_server *u;
        json_decref(params);
        if ((rc = loom__mcp_user_server(s, s->users, o->user, &u)) != 0)
            return rc;
        mine.user = NULL;
        rc = loom_mcp_server_call_opts(u, tool, args, &mine, out);
        loom_mcp_server_free(u);
        return rc;
    }
    if (o) {
        ctl.on_progress = o->on_progress;
        ctl.arg = o->progress_arg;
        ctl.input = o->input;
        ctl.input_arg = o->input_arg;
        ctl.elicit = o->input && o->elicitation;
        ctl.headers = o->headers;
    }
    loom__mcp_ref(s);
    rc =
        call(s, "tools/call", params, timeout, o ? o->cancel : NULL, &ctl, out);
    loom_mcp_server_free(s);
    json_decref(params);
    return rc;
}

int loom_mcp_server_call(loom_mcp_server *s, const char *tool,
                         const json_t *args, long timeout_ms,
                         loom_cancel *cancel, json_t **out)
{
    loom_mcp_call_options o = {0};

    o.timeout_ms = timeout_ms;
    o.cancel = cancel;
    return loom_mcp_server_call_opts(s, tool, args, &o, out);
}

json_t *loom__mcp_request_headers(loom_mcp_server *s, const json_t *msg)
{
    const char *method = json_string_value(json_object_get(msg, "method"));
    const json_t *params = json_object_get(msg, "params");
    const json_t *name = NULL;
    json_t *h = json_object(), *map = NULL;
    int stateless;

    if (!h)
        return NULL;
    pthread_mutex_lock(&s->mu);
    stateless = s->stateless;
    if (method && strcmp(method, "tools/call") == 0 && !s->parent)
        map = json_incref(json_object_get(
            s->headers_of, json_string_value(json_object_get(params, "name"))));
    pthread_mutex_unlock(&s->mu);
    if (method && strcmp(method, "tools/call") == 0 && s->parent) {
        /* A user's own server lists nothing: its server's listing. */
        pthread_mutex_lock(&s->parent->mu);
        map = json_incref(json_object_get(
            s->parent->headers_of,
            json_string_value(json_object_get(params, "name"))));
        pthread_mutex_unlock(&s->parent->mu);
    }
    if (!stateless || !method)
        goto done;
    if (strcmp(method, "tools/call") == 0 || strcmp(method, "prompts/get") == 0)
        name = json_object_get(params, "name");
    else if (strcmp(method, "resources/read") == 0)
        name = json_object_get(params, "uri");
    if (json_object_set_new(h, "Mcp-Method", json_string(method)) != 0 ||
        (json_is_string(name) &&
         json_object_set(h, "Mcp-Name", (json_t *)name) != 0) ||
        (map && loom__mcp_add_param_headers(
                    h, map, json_object_get(params, "arguments")) != 0)) {
        json_decref(h);
        h = NULL;
    }

done:
    json_decref(map);
    return h;
}

json_t *loom_mcp_server_status(loom_mcp_server *s)
{
    const char *state;
    json_t *o;

    pthread_mutex_lock(&s->mu);
    state = !s->starting       ? state_names[s->state]
            : s->starting == 2 ? "restarting"
                               : "starting";
    o = json_pack("{s:s,s:s,s:s}", "name", s->cfg.name, "transport",
                  s->tr->name, "state", state);
    if (o && s->ntools >= 0)
        json_object_set_new(o, "tools", json_integer(s->ntools));
    if (o && s->protocol[0])
        json_object_set_new(o, "protocol_version", json_string(s->protocol));
    if (o && s->server_info)
        json_object_set(o, "server", s->server_info);
    if (o && s->error)
        json_object_set_new(o, "error", json_string(s->error));
    pthread_mutex_unlock(&s->mu);
    return o;
}
