/*
 * Users' own servers (loom_mcp_call_options.user): when accounts are on,
 * an HTTP server behind OAuth is called with the calling user's own
 * tokens, never another's. Each user gets a server object of their own,
 * made from the same config (mcp_client.c's loom__mcp_adopt): its own
 * connection and session (a 2025-11-25 session may be bound to the token
 * that opened it, so sessions are never shared between users), its own
 * OAuth state loaded from and saved to the store under that user (a
 * refresh of one user's token touches only that user's row). They are
 * kept for the next calls, LOOM_MCP_USERS_MAX at most: past that the
 * least recently used is let go (a call in flight keeps its reference;
 * the last one out deletes its session).
 */
#include "core/error.h"
#include "tools/mcp/mcp_internal.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *user;
    loom_mcp_server *s; /* a reference */
    uint64_t used;      /* when last taken, on the table's clock */
} user_entry;

struct mcp_users {
    pthread_mutex_t mu;
    user_entry e[LOOM_MCP_USERS_MAX];
    size_t n;
    uint64_t clock;
};

int loom__mcp_users_new(mcp_users **out)
{
    mcp_users *u = calloc(1, sizeof(*u));

    *out = u;
    if (!u)
        return loom__error_oom();
    pthread_mutex_init(&u->mu, NULL);
    return 0;
}

void loom__mcp_users_free(mcp_users *u)
{
    if (!u)
        return;
    for (size_t i = 0; i < u->n; i++) {
        loom_mcp_server_free(u->e[i].s);
        free(u->e[i].user);
    }
    pthread_mutex_destroy(&u->mu);
    free(u);
}

/* user's entry taken (a reference in *out, its use noted), or 0 when
 * there is none. Under mu. */
static int take_locked(mcp_users *u, const char *user, loom_mcp_server **out)
{
    for (size_t i = 0; i < u->n; i++)
        if (strcmp(u->e[i].user, user) == 0) {
            u->e[i].used = ++u->clock;
            loom__mcp_ref(u->e[i].s);
            *out = u->e[i].s;
            return 1;
        }
    return 0;
}

int loom__mcp_user_server(loom_mcp_server *s, mcp_users *u, const char *user,
                          loom_mcp_server **out)
{
    loom_mcp_server *made = NULL, *gone = NULL;
    char *name = NULL, *gone_name = NULL;
    size_t slot;
    int rc;

    *out = NULL;
    if (!user || !*user)
        return loom__error_set(LOOM_EINVALID,
                               "MCP server '%s': a call for no user",
                               loom_mcp_server_name(s));
    pthread_mutex_lock(&u->mu);
    rc = take_locked(u, user, out);
    pthread_mutex_unlock(&u->mu);
    if (rc)
        return 0;
    /* Made outside the lock: nothing is started yet. */
    if ((rc = loom_mcp_server_new(&made, loom__mcp_config(s))) != 0 ||
        (rc = loom__mcp_adopt(made, s, user)) != 0 || !(name = strdup(user))) {
        loom_mcp_server_free(made);
        return rc ? rc : loom__error_oom();
    }
    pthread_mutex_lock(&u->mu);
    if (take_locked(u, user, out)) {
        /* another call made one meanwhile */
        pthread_mutex_unlock(&u->mu);
        loom_mcp_server_free(made);
        free(name);
        return 0;
    }
    slot = u->n;
    if (slot == LOOM_MCP_USERS_MAX) {
        slot = 0;
        for (size_t i = 1; i < u->n; i++)
            if (u->e[i].used < u->e[slot].used)
                slot = i;
        gone = u->e[slot].s;
        gone_name = u->e[slot].user;
    } else {
        u->n++;
    }
    u->e[slot].user = name;
    u->e[slot].s = made;
    u->e[slot].used = ++u->clock;
    loom__mcp_ref(made);
    *out = made;
    pthread_mutex_unlock(&u->mu);
    loom_mcp_server_free(gone);
    free(gone_name);
    return 0;
}

void loom__mcp_users_drop(mcp_users *u, const char *user)
{
    loom_mcp_server *gone = NULL;
    char *gone_name = NULL;

    if (!u || !user)
        return;
    pthread_mutex_lock(&u->mu);
    for (size_t i = 0; i < u->n; i++)
        if (strcmp(u->e[i].user, user) == 0) {
            gone = u->e[i].s;
            gone_name = u->e[i].user;
            u->e[i] = u->e[--u->n];
            break;
        }
    pthread_mutex_unlock(&u->mu);
    if (!gone)
        return;
    /* A call still in flight must not write its tokens back. */
    loom_mcp_server_set_credentials(gone, NULL);
    loom_mcp_server_free(gone);
    free(gone_name);
}

/* ---- connecting a user's own account ---------------------------------- */

int loom_mcp_server_user_oauth(loom_mcp_server *s)
{
    const loom_mcp_server_config *c = loom__mcp_config(s);

    return loom__mcp_users(s) && loom__mcp_per_user(s) &&
           (!c->oauth.grant_type ||
            strcmp(c->oauth.grant_type, "client_credentials") != 0);
}

int loom_mcp_server_user_connected(loom_mcp_server *s, const char *user)
{
    loom_mcp_credentials cs = loom__mcp_credentials(s);
    char *text = NULL;
    int rc, on;

    if (!user || !*user || !cs.load)
        return 0;
    rc = cs.load(cs.arg, loom_mcp_server_name(s), user, &text);
    on = rc == 0 && loom__mcp_oauth_text_connected(text);
    free(text);
    if (rc != 0 && rc != LOOM_ENOTFOUND)
        return rc;
    return on;
}

void loom_mcp_server_forget_user(loom_mcp_server *s, const char *user)
{
    loom__mcp_users_drop(loom__mcp_users(s), user);
}

int loom_mcp_server_connect_user(loom_mcp_server *s, const char *user,
                                 const loom_mcp_authorizer *az, long wait_ms)
{
    loom_mcp_server_config cfg = *loom__mcp_config(s);
    loom_mcp_server *made = NULL;
    json_t *tools = NULL;
    int rc;

    if (!loom_mcp_server_user_oauth(s) || !user || !*user || !az)
        return loom__error_set(LOOM_EINVALID,
                               "MCP server '%s' takes no account of each "
                               "user's own",
                               loom_mcp_server_name(s));
    /* The handshake waits for the person too. */
    cfg.startup_timeout_ms =
        wait_ms + (cfg.startup_timeout_ms > 0 ? cfg.startup_timeout_ms : 30000);
    if ((rc = loom_mcp_server_new(&made, &cfg)) != 0 ||
        (rc = loom__mcp_adopt(made, s, user)) != 0) {
        loom_mcp_server_free(made);
        return rc;
    }
    loom_mcp_server_set_authorizer(made, az);
    rc = loom_mcp_server_tools(made, &tools);
    json_decref(tools);
    loom_mcp_server_free(made);
    /* The user's next call loads the new tokens. */
    if (rc == 0)
        loom__mcp_users_drop(loom__mcp_users(s), user);
    return rc;
}
