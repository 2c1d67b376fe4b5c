/*
 * The admin API, for the admin key only (auth.c lets nothing else in):
 *
 *   POST   /v1/admin/keys        make a key; the answer holds it, once
 *   GET    /v1/admin/keys        list keys (?workspace=, ?user=)
 *   PATCH  /v1/admin/keys/{id}   change a key's limits
 *   DELETE /v1/admin/keys/{id}   revoke a key
 *   GET    /v1/admin/users       users (?workspace=)
 *   GET    /v1/admin/workspaces  workspaces
 *   GET    /v1/admin/audit       the audit log, newest first (?limit=)
 *   PATCH  /v1/admin/users/{workspace}/{name}  a user's limits
 *   PATCH  /v1/admin/workspaces/{id}           a workspace's limits
 *   GET    /v1/admin/spend       what each budget scope spent (?scope=)
 *
 * Everything goes through loom/accounts.h, as `loom keys` does, so the
 * two write the same rows and the same audit entries (actor "admin"
 * here). See docs/accounts.md for the shapes.
 */
#include "core/error.h"
#include "server/srvpriv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define AUDIT_PAGE 100

/* A 400 naming param. Returns what srv_reply_error returns. */
static int bad(srv_request *r, const char *param, const char *msg)
{
    return srv_reply_error(r, 400, NULL, param, "invalid_value", "%s", msg);
}

/* A non-negative integer field into *out (absent or null: left alone).
 * 1 when fine, else the 400. */
static int int_field(srv_request *r, const char *name, long *out)
{
    json_t *v = json_object_get(r->json, name);

    if (!v || json_is_null(v))
        return 1;
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) > 1000000000)
        return bad(r, name, "must be an integer from 0 (none) to 1e9"), 0;
    *out = (long)json_integer_value(v);
    return 1;
}

/* The limit fields of the body: rpm, tpm, max_concurrent, budget_usd,
 * budget_period, budget_allow_unpriced. 1 when fine, else the 400. */
static int limits_of(srv_request *r, loom_limits *l)
{
    json_t *usd = json_object_get(r->json, "budget_usd");
    json_t *period = json_object_get(r->json, "budget_period");
    json_t *unpriced = json_object_get(r->json, "budget_allow_unpriced");
    int p;

    if (unpriced && !json_is_null(unpriced)) {
        if (!json_is_boolean(unpriced))
            return bad(r, "budget_allow_unpriced", "must be true or false"), 0;
        l->budget_allow_unpriced = json_is_true(unpriced);
    }

    if (!int_field(r, "rpm", &l->rpm) || !int_field(r, "tpm", &l->tpm) ||
        !int_field(r, "max_concurrent", &l->max_concurrent))
        return 0;
    if (usd && !json_is_null(usd)) {
        double d = json_number_value(usd);
        if (!json_is_number(usd) || d < 0 || d > 1e9 || isnan(d))
            return bad(r, "budget_usd",
                       "must be a number of dollars, 0 "
                       "(none) or more"),
                   0;
        l->budget_micros = (int64_t)llround(d * 1e6);
    }
    if (period && !json_is_null(period)) {
        if ((p = loom_budget_period_parse(json_string_value(period))) < 0)
            return bad(r, "budget_period", "must be day, month or total"), 0;
        l->budget_period = (loom_budget_period)p;
    }
    return 1;
}

/* A list of names (models, agents) into names; 1 fine, else the 400. */
static int names_of(srv_request *r, const char *field, const char **names,
                    size_t *n)
{
    json_t *v = json_object_get(r->json, field), *x;
    size_t i;

    *n = 0;
    if (!v || json_is_null(v))
        return 1;
    if (!json_is_array(v) || json_array_size(v) > LOOM_KEY_ALLOW_MAX)
        return bad(r, field, "must be an array of at most 100 names"), 0;
    json_array_foreach(v, i, x)
    {
        if (!json_is_string(x))
            return bad(r, field, "must be an array of names"), 0;
        names[i] = json_string_value(x);
    }
    *n = json_array_size(v);
    return 1;
}

static int create_key(srv_request *r)
{
    static const char *const known[] = {
        "user",       "workspace",     "service",
        "models",     "agents",        "expires_at",
        "rpm",        "tpm",           "max_concurrent",
        "budget_usd", "budget_period", "budget_allow_unpriced",
        NULL};
    const char *models[LOOM_KEY_ALLOW_MAX], *agents[LOOM_KEY_ALLOW_MAX];
    loom_key_spec spec = {.version = LOOM_KEY_SPEC_VERSION, .actor = "admin"};
    char key[LOOM_KEY_SIZE];
    loom_key_info info;
    json_t *v, *out;
    int rc;

    if (!srv_body_only_known(r, known))
        return 0;
    spec.user = json_string_value(json_object_get(r->json, "user"));
    spec.workspace = json_string_value(json_object_get(r->json, "workspace"));
    if (!spec.user)
        return bad(r, "user", "`user` is required: the key's user");
    v = json_object_get(r->json, "service");
    if (v && !json_is_null(v) && !json_is_boolean(v))
        return bad(r, "service", "must be true or false");
    spec.service = json_is_true(v);
    v = json_object_get(r->json, "expires_at");
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) <= 0)
            return bad(r, "expires_at", "must be a Unix time in seconds");
        spec.expires_at = (int64_t)json_integer_value(v) * 1000;
    }
    spec.models = models;
    spec.agents = agents;
    if (!limits_of(r, &spec.limits) ||
        !names_of(r, "models", models, &spec.models_len) ||
        !names_of(r, "agents", agents, &spec.agents_len))
        return 0;
    if ((rc = loom_store_key_create(srv_store(r->srv), &spec, key, &info)))
        return srv_reply_loom_error(r, rc, NULL);
    out = loom_key_info_json(&info);
    loom_key_info_clear(&info);
    if (out)
        json_object_set_new(out, "key", json_string(key));
    memset(key, 0, sizeof(key));
    return srv_reply_json(r, 201, out);
}

static int list_keys(srv_request *r)
{
    json_t *out = NULL;
    int rc = loom_store_key_list(srv_store(r->srv), srv_query(r, "workspace"),
                                 srv_query(r, "user"), &out);

    if (rc)
        return srv_reply_loom_error(r, rc, NULL);
    json_object_set_new(out, "object", json_string("list"));
    return srv_reply_json(r, 200, out);
}

static int revoke_key(srv_request *r)
{
    loom_key_info info;
    json_t *out;
    int rc =
        loom_store_key_revoke(srv_store(r->srv), r->params[0], "admin", &info);

    if (rc)
        return srv_reply_loom_error(r, rc, "id");
    out = loom_key_info_json(&info);
    loom_key_info_clear(&info);
    return srv_reply_json(r, 200, out);
}

/* The body of a PATCH of limits. */
static const char *const limit_fields[] = {
    "rpm",        "tpm",           "max_concurrent",
    "budget_usd", "budget_period", "budget_allow_unpriced",
    NULL};

static int patch_key(srv_request *r)
{
    const char *const *known = limit_fields;
    loom_limits l = {0};
    int rc;

    if (!srv_body_only_known(r, known) || !limits_of(r, &l))
        return 0;
    if ((rc = loom_store_key_set_limits(srv_store(r->srv), r->params[0], &l,
                                        "admin")) != 0)
        return srv_reply_loom_error(r, rc, "id");
    return srv_reply_json(r, 200,
                          json_pack("{s:s,s:s,s:b}", "id", r->params[0],
                                    "object", "api_key.limits", "updated", 1));
}

/* PATCH /v1/admin/users/{workspace}/{name} and
 * /v1/admin/workspaces/{id}: replaces the limits (one left out is none). */
static int patch_account(srv_request *r)
{
    const char *user = r->nparams > 1 ? r->params[1] : NULL;
    loom_limits l = {0};
    int rc;

    if (!srv_body_only_known(r, limit_fields) || !limits_of(r, &l))
        return 0;
    if ((rc = loom_store_account_set_limits(srv_store(r->srv), r->params[0],
                                            user, &l, "admin")) != 0)
        return srv_reply_loom_error(r, rc, user ? "name" : "id");
    return srv_reply_json(r, 200,
                          json_pack("{s:s,s:s?,s:s,s:o}", "workspace",
                                    r->params[0], "user", user, "object",
                                    user ? "user.limits" : "workspace.limits",
                                    "limits", loom_limits_json(&l)));
}

static int list_spend(srv_request *r)
{
    json_t *out = NULL;
    int rc =
        loom_store_spend_list(srv_store(r->srv), srv_query(r, "scope"), &out);

    if (rc)
        return srv_reply_loom_error(r, rc, "scope");
    json_object_set_new(out, "object", json_string("list"));
    return srv_reply_json(r, 200, out);
}

static int list_users(srv_request *r)
{
    json_t *out = NULL;
    int rc = loom_store_user_list(srv_store(r->srv), srv_query(r, "workspace"),
                                  &out);

    if (rc)
        return srv_reply_loom_error(r, rc, "workspace");
    json_object_set_new(out, "object", json_string("list"));
    return srv_reply_json(r, 200, out);
}

static int list_workspaces(srv_request *r)
{
    json_t *out = NULL;
    int rc = loom_store_workspace_list(srv_store(r->srv), &out);

    if (rc)
        return srv_reply_loom_error(r, rc, NULL);
    json_object_set_new(out, "object", json_string("list"));
    return srv_reply_json(r, 200, out);
}

static int audit(srv_request *r)
{
    long limit = AUDIT_PAGE;
    json_t *out = NULL;
    int rc;

    if (!srv_query_long(r, "limit", 1, 1000, &limit))
        return 0;
    if ((rc = loom_store_audit_list(srv_store(r->srv), (int)limit, &out)))
        return srv_reply_loom_error(r, rc, NULL);
    json_object_set_new(out, "object", json_string("list"));
    return srv_reply_json(r, 200, out);
}

int srv__api_admin_routes(srv_router *rt)
{
    int rc;

    if ((rc = srv_route(rt, "POST", "/v1/admin/keys", create_key)) ||
        (rc = srv_route(rt, "GET", "/v1/admin/keys", list_keys)) ||
        (rc = srv_route(rt, "PATCH", "/v1/admin/keys/{id}", patch_key)) ||
        (rc = srv_route(rt, "DELETE", "/v1/admin/keys/{id}", revoke_key)) ||
        (rc = srv_route(rt, "GET", "/v1/admin/users", list_users)) ||
        (rc = srv_route(rt, "GET", "/v1/admin/workspaces", list_workspaces)) ||
        (rc = srv_route(rt, "GET", "/v1/admin/audit", audit)) ||
        (rc = srv_route(rt, "PATCH", "/v1/admin/users/{workspace}/{name}",
                        patch_account)) ||
        (rc = srv_route(rt, "PATCH", "/v1/admin/workspaces/{id}",
                        patch_account)) ||
        (rc = srv_route(rt, "GET", "/v1/admin/spend", list_spend)))
        return rc;
    return 0;
}
