/*
 * Usage sums in the SQLite backend (loom_store_usage, docs/store.md): one
 * statement over the `usage` table, built for the query's filters and
 * groups, read in one snapshot.
 *
 * The statement is written for each query rather than cached: its
 * WHERE holds only the filters asked for, so that SQLite picks the index
 * that fits (usage_by_owner, _account, _user, _key, _time) instead of
 * scanning past "?1 IS NULL OR ..." terms it cannot index. Only column
 * names chosen here go into the text; every value is bound. The rows are
 * taken through a LIMIT before they are grouped, so one query reads a
 * bounded number of rows however large the range: the front (usage.c)
 * asks for one row more than it allows and refuses when it gets it.
 */
#include "core/error.h"
#include "loom/buf.h"
#include "store/sqlite_internal.h"

/* The sums every group carries, in loom__store_usage_sums' order. */
static const char sums_sql[] =
    "count(*), coalesce(sum(cost_micros IS NULL), 0), "
    "coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0), "
    "coalesce(sum(cached_tokens), 0), coalesce(sum(reasoning_tokens), 0), "
    "coalesce(sum(cache_write_tokens), 0), coalesce(sum(total_tokens), 0), "
    "coalesce(sum(cost_micros), 0)";

/* The column a group is keyed by, and the field it is answered as. */
static const char *group_column(loom_usage_group g, const char **field)
{
    switch (g) {
    case LOOM_USAGE_BY_KEY:
        return *field = "key_id", "key_id";
    case LOOM_USAGE_BY_USER:
        return *field = "user_id", "user_id";
    case LOOM_USAGE_BY_WORKSPACE:
        return *field = "workspace", "workspace";
    case LOOM_USAGE_BY_MODEL:
        return *field = "model", "model";
    case LOOM_USAGE_BY_AGENT:
    default:
        return *field = "agent", "agent";
    }
}

/* The owner's parts a user group also answers (one value per owner). */
static const char *const user_parts[][2] = {{"workspace", "min(workspace)"},
                                            {"user", "min(user_name)"},
                                            {"end_user", "min(end_user)"}};
#define NPARTS (sizeof(user_parts) / sizeof(user_parts[0]))

/* Bytes of the statement: five groups and four filters take under 1 KiB. */
#define SQL_MAX 4096

/* Appends " AND column = ?n" when v is set, numbering the parameters. */
static int filter(loom_buf *b, const char *column, const char *v, int *n)
{
    if (!v)
        return 0;
    return loom_buf_printf(b, " AND %s = ?%d", column, ++*n);
}

/* The statement for q (its filters bound in order by bind()). */
static int build_sql(loom_buf *b, const loom_usage_query *q, long rows,
                     long groups)
{
    const char *field;
    int rc = 0, n = 1;

    rc |= loom_buf_printf(b, "SELECT ");
    for (size_t i = 0; i < q->group_by_len; i++) {
        rc |= loom_buf_printf(b, "%s, ", group_column(q->group_by[i], &field));
        if (q->group_by[i] == LOOM_USAGE_BY_USER)
            for (size_t k = 0; k < NPARTS; k++)
                rc |= loom_buf_printf(b, "%s, ", user_parts[k][1]);
    }
    rc |= loom_buf_printf(b,
                          "%s FROM (SELECT * FROM usage "
                          "WHERE created_at >= ?1",
                          sums_sql);
    if (q->to_ms)
        rc |= loom_buf_printf(b, " AND created_at < ?%d", ++n);
    rc |= filter(b, "user_id", q->user_id, &n);
    rc |= filter(b, "key_id", q->key_id, &n);
    rc |= filter(b, "workspace", q->workspace, &n);
    rc |= filter(b, "user_name", q->user, &n);
    rc |= loom_buf_printf(b, " LIMIT %ld)", rows);
    for (size_t i = 0; i < q->group_by_len; i++)
        rc |= loom_buf_printf(b, "%s%s", i ? ", " : " GROUP BY ",
                              group_column(q->group_by[i], &field));
    for (size_t i = 0; i < q->group_by_len; i++)
        rc |= loom_buf_printf(b, "%s%s", i ? ", " : " ORDER BY ",
                              group_column(q->group_by[i], &field));
    rc |= loom_buf_printf(b, " LIMIT %ld", groups);
    return rc ? loom__error_oom() : 0;
}

/* Binds q's values in build_sql's order. */
static void bind(sqlite3_stmt *s, const loom_usage_query *q, int *src)
{
    const char *v[] = {q->user_id, q->key_id, q->workspace, q->user};
    int n = 1;

    b_int(s, 1, q->from_ms, src);
    if (q->to_ms)
        b_int(s, ++n, q->to_ms, src);
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
        if (v[i])
            b_text(s, ++n, v[i], src);
}

/* Column i as a JSON string, or null. */
static json_t *text_json(sqlite3_stmt *s, int i)
{
    const char *v = col_text(s, i);

    return v ? json_string(v) : json_null();
}

/* The current row as a group object; NULL when out of memory. */
static json_t *group_json(sqlite3_stmt *s, const loom_usage_query *q)
{
    json_t *o = json_object();
    const char *field;
    int col = 0, bad = !o;

    for (size_t i = 0; !bad && i < q->group_by_len; i++) {
        group_column(q->group_by[i], &field);
        bad |= json_object_set_new(o, field, text_json(s, col++));
        if (q->group_by[i] == LOOM_USAGE_BY_USER)
            for (size_t k = 0; k < NPARTS; k++)
                bad |= json_object_set_new(o, user_parts[k][0],
                                           text_json(s, col++));
    }
    for (size_t k = 0; !bad && k < LOOM__STORE_USAGE_SUMS; k++)
        bad |=
            json_object_set_new(o, loom__store_usage_sums[k],
                                json_integer(sqlite3_column_int64(s, col++)));
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

int loom__sqlite_usage(loom_store *st, const loom_usage_query *q, long rows,
                       long groups, json_t **out)
{
    loom__sqlite_conn *c = NULL;
    sqlite3_stmt *s = NULL;
    json_t *data = NULL;
    loom_buf sql;
    int rc, src;

    *out = NULL;
    loom_buf_init(&sql, SQL_MAX);
    if ((rc = build_sql(&sql, q, rows, groups)) != 0)
        goto cleanup;
    if (!(data = json_array())) {
        rc = loom__error_oom();
        goto cleanup;
    }
    if ((rc = loom__sqlite_begin(st, 0, &c)) != 0)
        goto cleanup;
    src = sqlite3_prepare_v2(loom__sqlite_db(c), loom_buf_cstr(&sql), -1, &s,
                             NULL);
    bind(s, q, &src);
    while (src == SQLITE_OK && (src = sqlite3_step(s)) == SQLITE_ROW) {
        json_t *g = group_json(s, q);
        src =
            g && json_array_append_new(data, g) == 0 ? SQLITE_OK : SQLITE_NOMEM;
    }
    sqlite3_finalize(s);
    rc = src == SQLITE_DONE ? loom__sqlite_commit(st, c, "summing usage")
                            : loom__sqlite_fail(st, c, src, "summing usage");
    loom__sqlite_end(st, c, 0);
    if (rc == 0) {
        *out = data;
        data = NULL;
    }
cleanup:
    json_decref(data);
    loom_buf_free(&sql);
    return rc;
}
