/*
 * Spend, summed from the store's usage rows (docs/accounts.md#usage):
 *
 *   GET /v1/usage        the caller's own: an API key's user, or a
 *                        service key's end users (?user= narrows to one);
 *                        everyone's in mode none (?user= narrows)
 *   GET /v1/admin/usage  anyone's, for the admin key (auth.c lets nothing
 *                        else in): ?user=, ?workspace=, ?key= narrow
 *
 * Both take ?from=&to= (Unix seconds or UTC dates, from included, to
 * not) and ?group_by= (a comma-separated list of key, user, workspace,
 * model, agent), and answer loom_store_usage()'s exact integer sums.
 * Who may see which rows is decided here, from the caller alone: the
 * query can narrow what a caller sees, never widen it.
 */
#include "core/clock.h"
#include "core/error.h"
#include "server/srvpriv.h"

#include <stdlib.h>
#include <string.h>

/* 9999-12-31T23:59:59Z: the last second a time may name. */
#define LAST_SECOND 253402300799LL
/* Bytes of a group_by list: the five names and their commas fit. */
#define GROUP_BY_MAX 64

static const struct {
    const char *name;
    loom_usage_group g;
} group_names[] = {{"key", LOOM_USAGE_BY_KEY},
                   {"user", LOOM_USAGE_BY_USER},
                   {"workspace", LOOM_USAGE_BY_WORKSPACE},
                   {"model", LOOM_USAGE_BY_MODEL},
                   {"agent", LOOM_USAGE_BY_AGENT}};
#define NGROUPS (sizeof(group_names) / sizeof(group_names[0]))

static int bad(srv_request *r, const char *param, const char *msg)
{
    return srv_reply_error(r, 400, NULL, param, "invalid_value", "%s", msg);
}

/* A time argument (Unix seconds, or a date as loom__date_ms takes it)
 * into *ms; absent leaves it alone. 1 go on, 0 the 400 was answered. */
static int time_arg(srv_request *r, const char *key, int64_t *ms, int *given)
{
    const char *v = srv_query(r, key);
    size_t n;

    *given = v != NULL;
    if (!v)
        return 1;
    /* Only digits, at most 12: strtoll cannot overflow here. */
    n = strspn(v, "0123456789");
    if (n > 0 && !v[n] && n <= 12 && strtoll(v, NULL, 10) <= LAST_SECOND) {
        *ms = (int64_t)strtoll(v, NULL, 10) * 1000;
        return 1;
    }
    if ((*ms = loom__date_ms(v)) >= 0)
        return 1;
    return bad(r, key,
               "must be a Unix time in seconds, a date (YYYY-MM-DD) or a "
               "UTC time (YYYY-MM-DDTHH:MM:SSZ)"),
           0;
}

/* ?group_by= into q and the answer's list; 1 go on, 0 the 400. */
static int group_arg(srv_request *r, loom_usage_query *q, json_t *names)
{
    const char *v = srv_query(r, "group_by");
    char buf[GROUP_BY_MAX], *item, *save = NULL;
    size_t len;

    if (!v || !*v)
        return 1;
    len = strlen(v);
    if (len >= sizeof(buf) || v[0] == ',' || v[len - 1] == ',' ||
        strstr(v, ",,"))
        return bad(r, "group_by",
                   "must be a comma-separated list of key, user, "
                   "workspace, model and agent"),
               0;
    memcpy(buf, v, len + 1);
    for (item = strtok_r(buf, ",", &save); item;
         item = strtok_r(NULL, ",", &save)) {
        size_t k = 0;
        while (k < NGROUPS && strcmp(group_names[k].name, item) != 0)
            k++;
        if (k == NGROUPS)
            return srv_reply_error(r, 400, NULL, "group_by", "invalid_value",
                                   "unknown group '%.32s': group by key, "
                                   "user, workspace, model or agent",
                                   item),
                   0;
        for (size_t i = 0; i < q->group_by_len; i++)
            if (q->group_by[i] == group_names[k].g)
                return srv_reply_error(r, 400, NULL, "group_by",
                                       "invalid_value", "'%s' is named twice",
                                       item),
                       0;
        q->group_by[q->group_by_len++] = group_names[k].g;
        json_array_append_new(names, json_string(item));
    }
    return 1;
}

/* A bound as the answer echoes it: Unix seconds, or null when open. */
static json_t *bound_json(int given, int64_t ms)
{
    return given ? json_integer(ms / 1000) : json_null();
}

/* Reads the range and groups, sums q and answers. */
static int answer(srv_request *r, loom_usage_query *q)
{
    json_t *names = json_array(), *out = NULL;
    int from_given, to_given, rc;

    if (!names)
        return srv_reply_loom_error(r, loom__error_oom(), NULL);
    if (!time_arg(r, "from", &q->from_ms, &from_given) ||
        !time_arg(r, "to", &q->to_ms, &to_given) || !group_arg(r, q, names)) {
        json_decref(names);
        return 0;
    }
    if (to_given && q->to_ms < q->from_ms) {
        json_decref(names);
        return bad(r, "to", "`to` is before `from`");
    }
    /* to=0 is the empty range [0, 0), but the store reads a to_ms of 0
     * as no end: [1, 1) is as empty (and still echoes as 0). */
    if (to_given && q->to_ms == 0)
        q->from_ms = q->to_ms = 1;
    rc = loom_store_usage(srv_store(r->srv), q, &out);
    if (rc == LOOM_ETOOLARGE) {
        json_decref(names);
        return srv_reply_error(r, 400, NULL, NULL, "usage_too_large", "%s",
                               loom_error_last());
    }
    if (rc) {
        json_decref(names);
        return srv_reply_loom_error(r, rc, NULL);
    }
    json_object_set_new(out, "object", json_string("usage"));
    json_object_set_new(out, "from", bound_json(from_given, q->from_ms));
    json_object_set_new(out, "to", bound_json(to_given, q->to_ms));
    json_object_set_new(out, "group_by", names);
    return srv_reply_json(r, 200, out);
}

/* GET /v1/usage: what the caller may see, narrowed by ?user=. */
static int usage(srv_request *r)
{
    loom_usage_query q = {.version = LOOM_USAGE_QUERY_VERSION};
    const srv_identity *who = r->who;
    const char *user = srv_query(r, "user"), *owner;
    char buf[SRV_OWNER_SIZE];

    if (srv_query(r, "key") || srv_query(r, "workspace"))
        return bad(r, srv_query(r, "key") ? "key" : "workspace",
                   "`key` and `workspace` are the admin's filters "
                   "(GET /v1/admin/usage)");
    if (!srv_isolated(r)) {
        /* Mode none: nothing is isolated; `user` is whoever it says. */
        q.user_id = user;
    } else if (!who->key.service) {
        /* A user key's usage is its user's; `user` is only a label. */
        if (!srv_request_owner(r, NULL, buf, &owner))
            return 0;
        q.user_id = owner;
    } else if (user || srv_header(r, "X-Loom-User")) {
        /* One end user of the service. */
        if (!srv_request_owner(r, user, buf, &owner))
            return 0;
        q.user_id = owner;
    } else {
        /* The service itself and all of its end users. */
        q.workspace = who->key.workspace;
        q.user = who->key.user;
    }
    return answer(r, &q);
}

/* GET /v1/admin/usage: anyone's, narrowed by user, workspace and key. */
static int admin_usage(srv_request *r)
{
    loom_usage_query q = {.version = LOOM_USAGE_QUERY_VERSION};

    q.user = srv_query(r, "user");
    q.workspace = srv_query(r, "workspace");
    q.key_id = srv_query(r, "key");
    return answer(r, &q);
}

int srv__api_usage_routes(srv_router *rt)
{
    int rc;

    if ((rc = srv_route(rt, "GET", "/v1/usage", usage)) ||
        (rc = srv_route(rt, "GET", "/v1/admin/usage", admin_usage)))
        return rc;
    return 0;
}
