/*
 * Who is calling: the server's side of accounts (docs/accounts.md).
 *
 * Every request is judged here before its handler runs. Routes fall in
 * three kinds: operations (/healthz, /readyz, /metrics) and the web UI's
 * pages (/, /assets/...), open to all; the
 * admin API (/v1/admin/...), which takes only the admin key; and
 * everything else, the inference API, which in mode `keys` takes only a
 * stored API key (loom/accounts.h) and never the admin key, and in mode
 * `jwt` only a token the identity provider signed (loom/jwt.h), whose
 * user (and workspace) is made in the store the first time it is seen.
 * In mode `none` the inference API is open, as before accounts existed,
 * and a request's `user` is whoever it says.
 *
 * A caller's things are kept under its owner id (loom_account_owner:
 * workspace/user, or workspace/user/end-user for a service key's end
 * users), which is the run's user id: conversations, runs and their
 * events, memories all carry it, and srv_owns() is the one test every
 * route asks before showing anything (anything else is a 404, never a
 * 403 that would say it exists).
 *
 * Failed key checks are counted per client address in a small table
 * (the polling thread is the only one to touch it): past
 * FAIL_MAX failures in a minute the address gets 429 without its keys
 * being looked at until the minute is over, and one log line a minute
 * says so. Keys never reach a log line, an error message or an event:
 * messages name a key by its id at most.
 */
#include "core/clock.h"
#include "core/error.h"
#include "loom/accounts.h"
#include "loom/jwt.h"
#include "loom/log.h"
#include "server/chat_format.h"
#include "server/srvpriv.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL_SLOTS 256       /* addresses tracked at once */
#define FAIL_WINDOW_MS 60000 /* failures are counted per minute */
#define FAIL_MAX 10          /* past this many, the address waits */
#define ADDR_MAX 64
/* Token users known to be in the store (mode jwt), remembered at once. */
#define SEEN_SLOTS 256
#define SEEN_SIZE (2 * LOOM_ACCOUNT_NAME_MAX + 2)

typedef struct {
    char addr[ADDR_MAX];
    long long window_start; /* monotonic ms */
    int failures;
    long long logged_at; /* the last log line about it; 0: none */
} fail_slot;

struct srv_auth {
    int keys;               /* mode keys */
    loom_jwt_verifier *jwt; /* mode jwt */
    char *admin_key;        /* NULL: no admin API */
    fail_slot slots[FAIL_SLOTS];
    /* "workspace/user" of token users made or found in the store; the
     * oldest is forgotten first (it is then ensured again). */
    char seen[SEEN_SLOTS][SEEN_SIZE];
    size_t seen_next;
};

/* The verifier of mode jwt, from the auth.jwt section. */
static int jwt_new(loom_jwt_verifier **out, const loom_jwt_config *c)
{
    loom_jwt_options o = LOOM_JWT_OPTIONS_INIT;

    o.secret = c->secret;
    o.jwks_file = c->jwks_file;
    o.audience = c->audience;
    o.issuer = c->issuer;
    o.workspace_claim = c->workspace_claim;
    o.leeway_seconds = c->leeway_seconds;
    return loom_jwt_verifier_new(out, &o);
}

int srv__auth_new(srv_auth **out, const loom_config *cfg)
{
    const char *admin = cfg->auth.admin_key;
    srv_auth *a;
    int rc;

    *out = NULL;
    if (!admin || !*admin)
        admin = getenv("LOOM_ADMIN_KEY");
    if (!(a = calloc(1, sizeof(*a))))
        return loom__error_oom();
    a->keys = cfg->auth.mode && !strcmp(cfg->auth.mode, "keys");
    if (cfg->auth.mode && !strcmp(cfg->auth.mode, "jwt") &&
        (rc = jwt_new(&a->jwt, &cfg->auth.jwt)) != 0) {
        free(a);
        return rc;
    }
    if (admin && *admin && !(a->admin_key = strdup(admin))) {
        srv__auth_free(a);
        return loom__error_oom();
    }
    *out = a;
    return 0;
}

void srv__auth_free(srv_auth *a)
{
    if (!a)
        return;
    if (a->admin_key)
        memset(a->admin_key, 0, strlen(a->admin_key));
    free(a->admin_key);
    loom_jwt_verifier_free(a->jwt);
    free(a);
}

static int is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >>
                24) == 127;
    if (sa->sa_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(
            &((const struct sockaddr_in6 *)sa)->sin6_addr);
    return 0;
}

int srv__auth_check_listen(srv_server *s, const struct sockaddr *sa)
{
    if (s->auth->keys || s->auth->jwt || is_loopback(sa))
        return 0;
    if (!s->cfg->auth.allow_unauthenticated)
        return loom__error_set(
            LOOM_EINVALID,
            "refusing to serve %s without authentication: set auth.mode: "
            "keys or jwt (docs/accounts.md), listen on 127.0.0.1, or set "
            "auth.allow_unauthenticated: true to serve anyone who can "
            "reach it",
            s->listen);
    loom_warn("serving %s with auth.mode none: anyone who can reach it may "
              "run agents, read every conversation and name any user "
              "(auth.allow_unauthenticated is set)",
              s->listen);
    return 0;
}

/* ---- failures per address ------------------------------------------------ */

/* The client's address as text ("?" when unknown). */
static void client_addr(srv_request *r, char out[ADDR_MAX])
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
        srv__request_mc(r), MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    socklen_t len = sa && sa->sa_family == AF_INET6
                        ? sizeof(struct sockaddr_in6)
                        : sizeof(struct sockaddr_in);

    if (!sa || getnameinfo(sa, len, out, ADDR_MAX, NULL, 0, NI_NUMERICHOST))
        snprintf(out, ADDR_MAX, "?");
}

/* The slot of addr: its own, else a free or the stalest one (reset). */
static fail_slot *slot_of(srv_auth *a, const char *addr, long long now)
{
    fail_slot *pick = NULL;

    for (size_t i = 0; i < FAIL_SLOTS; i++) {
        fail_slot *f = &a->slots[i];
        if (!strcmp(f->addr, addr))
            return f;
        if (!pick || f->window_start < pick->window_start)
            pick = f;
    }
    memset(pick, 0, sizeof(*pick));
    snprintf(pick->addr, sizeof(pick->addr), "%s", addr);
    pick->window_start = now;
    return pick;
}

/* Starts a new minute when the last one is over. */
static void roll(fail_slot *f, long long now)
{
    if (now - f->window_start >= FAIL_WINDOW_MS) {
        f->window_start = now;
        f->failures = 0;
    }
}

/* 1 when addr has failed too often this minute (Retry-After set). */
static int throttled(srv_request *r, const char *addr)
{
    srv_auth *a = r->srv->auth;
    long long now = loom__mono_ms();
    fail_slot *f = slot_of(a, addr, now);
    char secs[24];

    roll(f, now);
    if (f->failures < FAIL_MAX)
        return 0;
    snprintf(secs, sizeof(secs), "%lld",
             (f->window_start + FAIL_WINDOW_MS - now + 999) / 1000);
    srv_set_header(r, "Retry-After", secs);
    return 1;
}

static void count_failure(srv_request *r, const char *addr)
{
    srv_auth *a = r->srv->auth;
    long long now = loom__mono_ms();
    fail_slot *f = slot_of(a, addr, now);

    roll(f, now);
    f->failures++;
    if (f->failures >= FAIL_MAX &&
        (!f->logged_at || now - f->logged_at >= FAIL_WINDOW_MS)) {
        f->logged_at = now;
        loom_warn("auth: %d failed API key checks from %s within a minute; "
                  "its requests get 429 until the minute is over",
                  f->failures, addr);
    }
}

/* ---- the check ----------------------------------------------------------- */

/* The bearer token of the request, or NULL. */
static const char *bearer(srv_request *r)
{
    const char *h = srv_header(r, "Authorization");

    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return NULL;
    h += 7;
    while (*h == ' ')
        h++;
    return *h ? h : NULL;
}

static int is_prefix(const char *path, const char *prefix)
{
    size_t n = strlen(prefix);

    return !strncmp(path, prefix, n) && (path[n] == '\0' || path[n] == '/');
}

static int unauthorized(srv_request *r, const char *msg)
{
    srv_set_header(r, "WWW-Authenticate", "Bearer");
    srv_reply_error(r, 401, "invalid_request_error", NULL, "invalid_api_key",
                    "%s", msg);
    return 0;
}

/* Makes the token's user in the store the first time it is seen (a
 * failure is logged and tried again at the next request). */
static void ensure_user(srv_request *r, const loom_jwt_identity *id)
{
    srv_auth *a = r->srv->auth;
    char name[SEEN_SIZE];
    int created = 0;

    snprintf(name, sizeof(name), "%s/%s", id->workspace, id->user);
    for (size_t i = 0; i < SEEN_SLOTS; i++)
        if (!strcmp(a->seen[i], name))
            return;
    if (loom_store_user_ensure(srv_store(r->srv), id->workspace, id->user,
                               "jwt", &created) != 0) {
        loom_warn("auth: could not record token user %s: %s", name,
                  loom_error_last());
        return;
    }
    if (created)
        loom_info("auth: new user %s (first token)", name);
    memcpy(a->seen[a->seen_next], name, sizeof(name));
    a->seen_next = (a->seen_next + 1) % SEEN_SLOTS;
}

/* Mode jwt: the token checked into *who. 1 go on, 0 answered. */
static int token_check(srv_request *r, srv_identity *who, const char *token,
                       const char *addr)
{
    loom_jwt_identity id;
    int rc = loom_jwt_verify(r->srv->auth->jwt, token, loom__unix_ms(), &id);

    if (rc == LOOM_EINVALID) {
        count_failure(r, addr);
        loom_debug("auth: %s from %s", loom_error_last(), addr);
        srv_set_header(r, "WWW-Authenticate", "Bearer error=\"invalid_token\"");
        srv_reply_error(r, 401, "invalid_request_error", NULL,
                        "invalid_api_key", "Invalid token: %s",
                        loom_error_last());
        return 0;
    }
    if (rc != 0)
        return srv_reply_loom_error(r, rc, NULL), 0;
    if (!(who->key.user = strdup(id.user)) ||
        !(who->key.workspace = strdup(id.workspace)))
        return srv_reply_loom_error(r, loom__error_oom(), NULL), 0;
    who->key.expires_at = id.expires_at;
    who->kind = SRV_CALLER_JWT;
    ensure_user(r, &id);
    return 1;
}

int srv__auth_request(srv_request *r, srv_identity *who)
{
    srv_auth *a = r->srv->auth;
    const char *path = r->path, *token;
    char addr[ADDR_MAX];
    int rc;

    memset(who, 0, sizeof(*who));
    r->who = who;
    if (!strcmp(path, "/healthz") || !strcmp(path, "/readyz") ||
        !strcmp(path, "/metrics") || srv__ui_public(path) ||
        srv__mcp_public(path))
        return 1;
    token = bearer(r);
    if (is_prefix(path, "/v1/admin")) {
        if (!a->admin_key)
            return unauthorized(r, "the admin API is off: set auth.admin_key "
                                   "or LOOM_ADMIN_KEY");
        client_addr(r, addr);
        if (throttled(r, addr))
            return srv_reply_error(r, 429, NULL, NULL, "rate_limit_exceeded",
                                   "too many failed key checks from this "
                                   "address; try again later"),
                   0;
        if (!loom_secret_equal(token, a->admin_key)) {
            count_failure(r, addr);
            return unauthorized(r, "the admin API takes the admin key "
                                   "(Authorization: Bearer <admin key>)");
        }
        who->kind = SRV_CALLER_ADMIN;
        return 1;
    }
    if (!a->keys && !a->jwt)
        return 1;
    client_addr(r, addr);
    if (throttled(r, addr))
        return srv_reply_error(r, 429, NULL, NULL, "rate_limit_exceeded",
                               "too many failed key checks from this "
                               "address; try again later"),
               0;
    if (!token) {
        count_failure(r, addr);
        return unauthorized(r, a->jwt ? "You didn't provide a token. Send it "
                                        "as Authorization: Bearer <token>."
                                      : "You didn't provide an API key. Send "
                                        "it as Authorization: Bearer <key>.");
    }
    if (a->admin_key && loom_secret_equal(token, a->admin_key))
        return unauthorized(r, "the admin key cannot run inference; use an "
                               "API key (loom keys create)");
    if (a->jwt)
        return token_check(r, who, token, addr);
    rc = loom_store_key_verify(srv_store(r->srv), token, loom__unix_ms(),
                               &who->key);
    if (rc == LOOM_ENOTFOUND) {
        count_failure(r, addr);
        loom_debug("auth: %s from %s", loom_error_last(), addr);
        return unauthorized(r, "Incorrect API key provided, or the key was "
                               "revoked or has expired.");
    }
    if (rc != 0) {
        srv_reply_loom_error(r, rc, NULL);
        return 0;
    }
    who->kind = SRV_CALLER_KEY;
    return 1;
}

void srv__identity_clear(srv_identity *who)
{
    loom_key_info_clear(&who->key);
    memset(who, 0, sizeof(*who));
}

/* ---- what handlers ask --------------------------------------------------- */

int srv_identity_isolated(const srv_identity *who)
{
    return who && (who->kind == SRV_CALLER_KEY || who->kind == SRV_CALLER_JWT);
}

int srv_isolated(const srv_request *r)
{
    return srv_identity_isolated(r->who);
}

/* The caller's owner id into out (*owner; request_user itself when not
 * isolated). -1 for an end user that is not a valid user id. */
static int owner_of(srv_request *r, const char *request_user,
                    char out[SRV_OWNER_SIZE], const char **owner)
{
    const srv_identity *who = r->who;
    const char *end = NULL;

    *owner = request_user;
    if (!srv_isolated(r))
        return 0;
    if (who->key.service) {
        end = request_user ? request_user : srv_header(r, "X-Loom-User");
        if (end && !loom__chat_user_valid(end))
            return -1;
    }
    if (loom_account_owner(out, who->key.workspace, who->key.user, end) != 0)
        return -1;
    *owner = out;
    return 0;
}

int srv_request_owner(srv_request *r, const char *request_user,
                      char out[SRV_OWNER_SIZE], const char **owner)
{
    if (owner_of(r, request_user, out, owner) == 0)
        return 1;
    srv_reply_error(r, 400, NULL, "user", "invalid_value",
                    "the end user (`user`, or the X-Loom-User header) must "
                    "be 1 to 128 characters of A-Z, a-z, 0-9 "
                    "and " LOOM__CHAT_USER_PUNCT);
    return 0;
}

int srv_owns(srv_request *r, const char *object_owner, const char *request_user)
{
    char buf[SRV_OWNER_SIZE];
    const char *mine;

    /* Without accounts, a user asked for must be the thing's. */
    if (!srv_isolated(r))
        return !request_user ||
               (object_owner && !strcmp(object_owner, request_user));
    /* A bad end user owns nothing: a 404 here, never a 400. */
    return owner_of(r, request_user, buf, &mine) == 0 && object_owner &&
           !strcmp(object_owner, mine);
}

void srv_request_account(srv_request *r, const char *request_user,
                         loom_usage_account *out)
{
    const srv_identity *who = r->who;

    memset(out, 0, sizeof(*out));
    if (!srv_isolated(r)) {
        out->user = request_user;
        return;
    }
    /* A token (mode jwt) has no key id. */
    out->key_id = who->key.id[0] ? who->key.id : NULL;
    out->workspace = who->key.workspace;
    out->user = who->key.user;
    if (who->key.service)
        out->end_user =
            request_user ? request_user : srv_header(r, "X-Loom-User");
}

/* 1 when name is in list (a JSON array of strings), or list is NULL. */
static int listed(const json_t *list, const char *name)
{
    size_t i;
    json_t *v;

    if (!list)
        return 1;
    if (!name)
        return 0;
    json_array_foreach(list, i, v)
    {
        if (!strcmp(json_string_value(v), name))
            return 1;
    }
    return 0;
}

int srv_identity_allows(const srv_identity *who, const char *model,
                        const char *agent)
{
    if (!who || who->kind != SRV_CALLER_KEY)
        return 0;
    if (!listed(who->key.models, model))
        return SRV_EMODEL_NOT_ALLOWED;
    if (!listed(who->key.agents, agent))
        return SRV_EAGENT_NOT_ALLOWED;
    return 0;
}
