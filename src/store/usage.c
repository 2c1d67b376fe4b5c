/*
 * The store's front for usage (loom_store_usage, docs/accounts.md#usage):
 * checks a query, fills its defaults and limits, asks the backend for the
 * groups and adds them up into the total, refusing an answer that would
 * pass a limit rather than cutting it (a cut sum would look exact). Also
 * the check of the account a saved turn's usage rows are counted to.
 */
#include "core/error.h"
#include "store/store_internal.h"

#include <string.h>

const char *const loom__store_usage_sums[LOOM__STORE_USAGE_SUMS] = {
    "calls",
    "unpriced_calls",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "cache_write_tokens",
    "total_tokens",
    "cost_micros"};

/* A string of the query or account: NULL, or 1 to max bytes. */
static int check_name(const char *what, const char *v)
{
    if (v && (!*v || strlen(v) > LOOM_STORE_USER_ID_MAX))
        return loom__error_set(LOOM_EINVALID, "store: %s has 1 to %d bytes",
                               what, LOOM_STORE_USER_ID_MAX);
    return 0;
}

int loom__store_account_check(const loom_usage_account *a)
{
    int rc;

    if ((rc = check_name("a key id", a->key_id)) != 0 ||
        (rc = check_name("a workspace", a->workspace)) != 0 ||
        (rc = check_name("a user", a->user)) != 0)
        return rc;
    return check_name("an end user", a->end_user);
}

static int check_query(const loom_usage_query *q)
{
    unsigned seen = 0;
    int rc;

    if (q->version != LOOM_USAGE_QUERY_VERSION && q->version != 0)
        return loom__error_set(LOOM_EINVALID, "usage query: bad version");
    if (q->from_ms < 0 || q->to_ms < 0 || (q->to_ms && q->to_ms < q->from_ms))
        return loom__error_set(LOOM_EINVALID,
                               "usage: the range ends before it starts");
    if (q->group_by_len > LOOM_USAGE_GROUP_KINDS)
        return loom__error_set(LOOM_EINVALID, "usage: too many groups");
    for (size_t i = 0; i < q->group_by_len; i++) {
        unsigned bit = 1u << (unsigned)q->group_by[i];
        if (q->group_by[i] < LOOM_USAGE_BY_KEY ||
            q->group_by[i] > LOOM_USAGE_BY_AGENT)
            return loom__error_set(LOOM_EINVALID, "usage: unknown group");
        if (seen & bit)
            return loom__error_set(LOOM_EINVALID,
                                   "usage: a group is asked for twice");
        seen |= bit;
    }
    if ((rc = check_name("a user id", q->user_id)) != 0 ||
        (rc = check_name("a key id", q->key_id)) != 0 ||
        (rc = check_name("a workspace", q->workspace)) != 0)
        return rc;
    return check_name("a user", q->user);
}

/* Adds group g's sums into total (a new object the first time). */
static int add_sums(json_t *total, const json_t *g)
{
    for (size_t k = 0; k < LOOM__STORE_USAGE_SUMS; k++) {
        const char *name = loom__store_usage_sums[k];
        json_int_t a = json_integer_value(json_object_get(total, name));
        json_int_t b = json_integer_value(json_object_get(g, name));
        if (json_object_set_new(total, name, json_integer(a + b)) != 0)
            return loom__error_oom();
    }
    return 0;
}

int loom_store_usage(loom_store *st, const loom_usage_query *q, json_t **out)
{
    long rows, groups;
    json_t *data = NULL, *total = NULL, *g;
    size_t i;
    int rc;

    *out = NULL;
    if (!st || !q)
        return loom__error_set(LOOM_EINVALID, "store: NULL argument");
    if ((rc = check_query(q)) != 0)
        return rc;
    rows = q->max_rows > 0 && q->max_rows < LOOM_STORE_USAGE_ROWS_MAX
               ? q->max_rows
               : LOOM_STORE_USAGE_ROWS_MAX;
    groups = q->max_groups > 0 && q->max_groups < LOOM_STORE_USAGE_GROUPS_MAX
                 ? q->max_groups
                 : LOOM_STORE_USAGE_GROUPS_MAX;
    /* One more of each than allowed, to tell "exactly the limit" from
     * "past it". */
    if ((rc = st->vt->usage(st, q, rows + 1, groups + 1, &data)) != 0)
        return rc;
    if (json_array_size(data) > (size_t)groups) {
        rc = loom__error_set(LOOM_ETOOLARGE,
                             "usage: more than %ld groups; group by less or "
                             "narrow the range",
                             groups);
        goto cleanup;
    }
    if (!(total = json_object()) || add_sums(total, json_null()) != 0) {
        rc = loom__error_oom();
        goto cleanup;
    }
    json_array_foreach(data, i, g)
    {
        if ((rc = add_sums(total, g)) != 0)
            goto cleanup;
    }
    if (json_integer_value(json_object_get(total, "calls")) > rows) {
        rc = loom__error_set(LOOM_ETOOLARGE,
                             "usage: the range holds more than %ld model "
                             "calls; narrow it",
                             rows);
        goto cleanup;
    }
    if (!(*out = json_pack("{s:O,s:O}", "data", data, "total", total)))
        rc = loom__error_oom();
cleanup:
    json_decref(data);
    json_decref(total);
    return rc;
}
