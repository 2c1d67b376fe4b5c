/*
 * The caller's own settings: GET and PUT /v1/me/settings
 * (docs/accounts.md "Per-user settings"), and the settings a run of
 * theirs follows (srv_user_settings).
 *
 * Settings belong to an owner id, as everything else a caller has: the
 * key's or token's user (a service key's end user), or in mode none the
 * user a request names (`?user=` or X-Loom-User), else the anonymous
 * user's. What they may hold, how a change is checked and merged, and
 * how secrets are masked is loom/accounts.h's; this file adds what only
 * the server knows: that a default agent must be one of its agents.
 * Secrets are never answered whole, nor logged.
 */
#include "core/error.h"
#include "loom/accounts.h"
#include "loom/log.h"
#include "server/chat_format.h"
#include "server/srvpriv.h"

#include <string.h>

/* The owner whose settings r is about ("" for the anonymous user of
 * mode none) into *owner. 1 go on, 0 answered (a 400). */
static int settings_owner(srv_request *r, char buf[SRV_OWNER_SIZE],
                          const char **owner)
{
    const char *user = srv_query(r, "user");

    if (!user && !srv_isolated(r))
        user = srv_header(r, "X-Loom-User");
    if (user && !srv_isolated(r) && !loom__chat_user_valid(user))
        return srv_reply_error(r, 400, NULL, "user", "invalid_value",
                               "the user must be 1 to 128 characters of "
                               "A-Z, a-z, 0-9 and " LOOM__CHAT_USER_PUNCT),
               0;
    if (!srv_request_owner(r, user, buf, owner))
        return 0;
    if (!*owner)
        *owner = "";
    return 1;
}

/* A failed read or write of the settings: the store's problem. */
static int store_failed(srv_request *r, int rc)
{
    if (rc == LOOM_EPROTO || rc == LOOM_EINVALID)
        return srv_reply_error(r, 500, NULL, NULL, "settings_unavailable", "%s",
                               loom_error_last());
    return srv_reply_loom_error(r, rc, NULL);
}

static int reply_view(srv_request *r, const json_t *settings)
{
    json_t *view = loom_user_settings_view(settings);

    if (!view || json_object_set_new(view, "object",
                                     json_string("user_settings")) != 0) {
        json_decref(view);
        return loom__error_oom();
    }
    return srv_reply_json(r, 200, view);
}

static int get_settings(srv_request *r)
{
    char buf[SRV_OWNER_SIZE];
    const char *owner;
    json_t *settings = NULL;
    int rc;

    if (!settings_owner(r, buf, &owner))
        return 0;
    if ((rc = loom_user_settings_get(srv_store(r->srv), owner, &settings)))
        return store_failed(r, rc);
    rc = reply_view(r, settings);
    json_decref(settings);
    return rc;
}

static int put_settings(srv_request *r)
{
    char buf[SRV_OWNER_SIZE], field[LOOM_SETTINGS_FIELD_SIZE];
    const char *owner, *agent;
    json_t *after = NULL;
    int rc;

    if (!settings_owner(r, buf, &owner))
        return 0;
    if (r->json_error || !json_is_object(r->json))
        return srv_reply_error(r, 400, NULL, NULL, "invalid_json",
                               "the body must be a JSON object");
    agent = json_string_value(json_object_get(r->json, "default_agent"));
    if (agent && *agent && !srv_agent(r->srv, agent))
        return srv_reply_error(r, 400, NULL, "default_agent", "invalid_value",
                               "settings: default_agent: there is no agent "
                               "called '%.64s'",
                               agent);
    rc = loom_user_settings_update(srv_store(r->srv), owner, r->json, &after,
                                   field);
    if (rc == LOOM_EINVALID && field[0])
        return srv_reply_error(r, 400, NULL, field, "invalid_value", "%s",
                               loom_error_last());
    if (rc != 0)
        return store_failed(r, rc);
    rc = reply_view(r, after);
    json_decref(after);
    return rc;
}

json_t *srv_user_settings(srv_server *s, const char *owner)
{
    json_t *settings = NULL;
    int rc;

    if (!srv_store(s))
        return NULL;
    rc = loom_user_settings_get(srv_store(s), owner ? owner : "", &settings);
    if (rc != 0) {
        loom_warn("settings of %s not used: %s",
                  owner && *owner ? owner : "the anonymous user",
                  loom_error_last());
        return NULL;
    }
    if (json_object_size(settings) == 0) {
        json_decref(settings);
        return NULL;
    }
    return settings;
}

const char *srv_settings_agent(const json_t *settings, const srv_run_spec *sp)
{
    const char *agent =
        json_string_value(json_object_get(settings, "default_agent"));

    if (sp->agent || sp->no_agent || !agent ||
        (sp->model && !strncmp(sp->model, "agent/", 6)))
        return sp->agent;
    return agent;
}

int srv__api_settings_routes(srv_router *rt)
{
    int rc;

    if ((rc = srv_route(rt, "GET", "/v1/me/settings", get_settings)) ||
        (rc = srv_route(rt, "PUT", "/v1/me/settings", put_settings)))
        return rc;
    return 0;
}
