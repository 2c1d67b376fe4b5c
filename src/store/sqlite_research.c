/*
 * Research runs in the SQLite backend (migration 14, docs/store.md
 * #research-runs): the rows a research run writes as it goes (its row,
 * the supervisor's messages, one row per researcher, its events) and
 * the reads that resume it or show it. Each write is one transaction.
 */
#include "core/error.h"
#include "store/sqlite_internal.h"

#include <stdlib.h>
#include <string.h>

static const char sql_begin[] =
    "INSERT INTO research_runs (run_id, conversation_id, user_id, spec, "
    "status, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, 'running', ?5, "
    "?5)";
static const char sql_step[] =
    "UPDATE research_runs SET phase = coalesce(?2, phase), "
    "cycle = CASE WHEN ?2 IS NULL THEN cycle ELSE ?3 END, "
    "max_cycles = CASE WHEN ?2 IS NULL THEN max_cycles ELSE ?4 END, "
    "state = coalesce(?5, state), plan = coalesce(?6, plan), "
    "report = coalesce(?7, report), citations = coalesce(?8, citations), "
    "status = CASE WHEN ?9 THEN 'ended' ELSE status END, updated_at = ?10 "
    "WHERE run_id = ?1";
static const char sql_message[] = "INSERT INTO research_messages (run_id, "
                                  "position, message) VALUES (?1, ?2, ?3)";
static const char sql_researcher[] =
    "INSERT INTO research_researchers (run_id, call_id, task, status, data, "
    "started_at, ended_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, "
    "CASE WHEN ?4 = 'running' THEN NULL ELSE ?6 END) "
    "ON CONFLICT (run_id, call_id) DO UPDATE SET task = excluded.task, "
    "status = excluded.status, data = excluded.data, "
    "ended_at = excluded.ended_at";
static const char sql_event[] =
    "INSERT INTO research_events (run_id, seq, event) VALUES (?1, ?2, ?3)";

static const char sql_get[] =
    "SELECT run_id, conversation_id, user_id, spec, status, phase, cycle, "
    "max_cycles, state, plan, report, citations, created_at, updated_at, "
    "(SELECT max(seq) FROM research_events e WHERE e.run_id = r.run_id) "
    "FROM research_runs r WHERE run_id = ?1";
static const char sql_get_messages[] = "SELECT message FROM research_messages "
                                       "WHERE run_id = ?1 ORDER BY position";
static const char sql_get_researchers[] =
    "SELECT data, status, started_at, ended_at FROM research_researchers "
    "WHERE run_id = ?1 ORDER BY started_at, call_id";
static const char sql_get_events[] =
    "SELECT event FROM research_events WHERE run_id = ?1 ORDER BY seq";
static const char sql_running[] = "SELECT run_id FROM research_runs WHERE "
                                  "status = 'running' ORDER BY created_at";

/* Runs sql once with the binders given by bind; an SQLite code. */
typedef void (*binder)(sqlite3_stmt *s, const void *arg, int *src);

static int exec1(loom__sqlite_conn *c, const char *sql, binder bind,
                 const void *arg, int *changes)
{
    sqlite3_stmt *s = NULL;
    int src = sqlite3_prepare_v2(loom__sqlite_db(c), sql, -1, &s, NULL);

    if (src == SQLITE_OK)
        bind(s, arg, &src);
    src = step_done(s, src);
    if (changes)
        *changes = sqlite3_changes(loom__sqlite_db(c));
    sqlite3_finalize(s);
    return src;
}

typedef struct {
    const loom_store_research_write *w;
    int64_t now;
    size_t i;  /* the message */
    json_t *r; /* the researcher, parsed */
} put_args;

static void bind_begin(sqlite3_stmt *s, const void *arg, int *src)
{
    const put_args *a = arg;

    b_text(s, 1, a->w->run_id, src);
    b_text(s, 2, a->w->conversation_id, src);
    b_text(s, 3, a->w->user_id, src);
    b_text(s, 4, a->w->spec, src);
    b_int(s, 5, a->now, src);
}

static void bind_step(sqlite3_stmt *s, const void *arg, int *src)
{
    const put_args *a = arg;
    const loom_store_research_write *w = a->w;

    b_text(s, 1, w->run_id, src);
    b_text(s, 2, w->phase, src);
    b_int(s, 3, w->cycle, src);
    b_int(s, 4, w->max_cycles, src);
    b_text(s, 5, w->state, src);
    b_text(s, 6, w->plan, src);
    b_text(s, 7, w->report, src);
    b_text(s, 8, w->citations, src);
    b_int(s, 9, w->end != 0, src);
    b_int(s, 10, a->now, src);
}

static void bind_message(sqlite3_stmt *s, const void *arg, int *src)
{
    const put_args *a = arg;

    b_text(s, 1, a->w->run_id, src);
    b_int(s, 2, a->w->first_position + (int64_t)a->i, src);
    b_text(s, 3, a->w->messages[a->i], src);
}

static void bind_researcher(sqlite3_stmt *s, const void *arg, int *src)
{
    const put_args *a = arg;

    b_text(s, 1, a->w->run_id, src);
    b_text(s, 2, json_string_value(json_object_get(a->r, "call_id")), src);
    b_text(s, 3, json_string_value(json_object_get(a->r, "task")), src);
    b_text(s, 4, json_string_value(json_object_get(a->r, "status")), src);
    b_text(s, 5, a->w->researcher, src);
    b_int(s, 6, a->now, src);
}

static void bind_event(sqlite3_stmt *s, const void *arg, int *src)
{
    const put_args *a = arg;

    b_text(s, 1, a->w->run_id, src);
    b_int(s, 2, (int64_t)a->w->event_seq, src);
    b_text(s, 3, a->w->event, src);
}

static int put_rows(loom_store *base, loom__sqlite_conn *c, put_args *a)
{
    const loom_store_research_write *w = a->w;
    int src = SQLITE_OK, n = 0;

    if (w->spec && (src = exec1(c, sql_begin, bind_begin, a, NULL)) != 0)
        return loom__sqlite_fail(base, c, src, "starting a research run");
    if ((src = exec1(c, sql_step, bind_step, a, &n)) != 0)
        return loom__sqlite_fail(base, c, src, "saving a research step");
    if (n == 0)
        return loom__error_set(LOOM_ENOTFOUND, "research run '%s' not found",
                               w->run_id);
    for (a->i = 0; a->i < w->nmessages; a->i++)
        if ((src = exec1(c, sql_message, bind_message, a, NULL)) != 0)
            return loom__sqlite_fail(base, c, src, "saving a research message");
    if (a->r && (src = exec1(c, sql_researcher, bind_researcher, a, NULL)))
        return loom__sqlite_fail(base, c, src, "saving a researcher");
    if (w->event_seq && (src = exec1(c, sql_event, bind_event, a, NULL)))
        return loom__sqlite_fail(base, c, src, "saving a research event");
    return 0;
}

/* put_rows as one write of the writer thread's batch. */
static int write_step(loom__sqlite_store *st, loom__sqlite_conn *c,
                      const void *arg)
{
    put_args a = *(const put_args *)arg;

    return put_rows(&st->base, c, &a);
}

int loom__sqlite_research_put(loom_store *base,
                              const loom_store_research_write *w, int64_t now)
{
    put_args a = {w, now, 0, NULL};
    int rc;

    if (w->researcher && !(a.r = json_loads(w->researcher, 0, NULL)))
        return loom__error_set(LOOM_EINVALID,
                               "store: a researcher is not JSON");
    /* Returns once the writer's batch holding the step has committed. */
    rc = loom__sqlite_write((loom__sqlite_store *)base, write_step, &a);
    json_decref(a.r);
    return rc;
}

/* Appends column 0 of every row of sql (bound to id) to arr: parsed
 * (parse), else as a string. */
static int rows_into(loom_store *base, loom__sqlite_conn *c, const char *sql,
                     const char *id, int parse, json_t *arr)
{
    sqlite3_stmt *s = NULL;
    int src = sqlite3_prepare_v2(loom__sqlite_db(c), sql, -1, &s, NULL);
    int rc = 0;

    if (id)
        b_text(s, 1, id, &src);
    while (src == SQLITE_OK && (src = sqlite3_step(s)) == SQLITE_ROW) {
        json_t *v =
            parse ? loom__sqlite_col_parsed(s, 0) : loom__sqlite_col_json(s, 0);
        src = SQLITE_OK;
        if (!v || json_array_append_new(arr, v) != 0) {
            rc = loom__error_oom();
            break;
        }
    }
    if (!rc && src != SQLITE_DONE)
        rc = loom__sqlite_fail(base, c, src, "reading a research run");
    sqlite3_finalize(s);
    return rc;
}

static const char *const get_keys[] = {
    "run_id", "conversation_id", "user_id",    "spec",       "status",
    "phase",  "cycle",           "max_cycles", "state",      "plan",
    "report", "citations",       "created_at", "updated_at", "last_seq"};

/* Which columns of sql_get hold JSON text. */
static int parsed_col(int i)
{
    return i == 3 || i == 8 || i == 11;
}

static int owned(sqlite3_stmt *s, const char *user_id, int any_user)
{
    const char *owner = col_text(s, 2);

    if (any_user)
        return 1;
    if (!owner || !user_id)
        return !owner && !user_id;
    return strcmp(owner, user_id) == 0;
}

static int run_row(loom_store *base, loom__sqlite_conn *c, const char *run_id,
                   const char *user_id, int any_user, json_t *o)
{
    sqlite3_stmt *s = NULL;
    int src = sqlite3_prepare_v2(loom__sqlite_db(c), sql_get, -1, &s, NULL);
    int rc = 0;

    b_text(s, 1, run_id, &src);
    if (src == SQLITE_OK)
        src = sqlite3_step(s);
    if (src == SQLITE_ROW && owned(s, user_id, any_user)) {
        for (int i = 0; !rc && i < (int)(sizeof(get_keys) / sizeof(*get_keys));
             i++) {
            json_t *v =
                parsed_col(i) && sqlite3_column_type(s, i) != SQLITE_NULL
                    ? loom__sqlite_col_parsed(s, i)
                    : loom__sqlite_col_json(s, i);
            if (i == 14 && sqlite3_column_type(s, i) == SQLITE_NULL) {
                json_decref(v);
                v = json_integer(0);
            }
            if (!v || json_object_set_new(o, get_keys[i], v) != 0)
                rc = loom__error_oom();
        }
    } else if (src == SQLITE_ROW || src == SQLITE_DONE) {
        rc = loom__error_set(LOOM_ENOTFOUND, "research run '%s' not found",
                             run_id);
    } else {
        rc = loom__sqlite_fail(base, c, src, "reading a research run");
    }
    sqlite3_finalize(s);
    return rc;
}

/* The researchers' rows: each one's data with its times. */
static int researchers_into(loom_store *base, loom__sqlite_conn *c,
                            const char *id, json_t *arr)
{
    sqlite3_stmt *s = NULL;
    int src = sqlite3_prepare_v2(loom__sqlite_db(c), sql_get_researchers, -1,
                                 &s, NULL);
    int rc = 0;

    b_text(s, 1, id, &src);
    while (src == SQLITE_OK && (src = sqlite3_step(s)) == SQLITE_ROW) {
        json_t *v = loom__sqlite_col_parsed(s, 0);
        src = SQLITE_OK;
        if (!json_is_object(v)) {
            json_decref(v);
            v = json_object();
        }
        if (!v ||
            json_object_set_new(v, "status", loom__sqlite_col_json(s, 1)) ||
            json_object_set_new(v, "started_at", loom__sqlite_col_json(s, 2)) ||
            json_object_set_new(v, "ended_at", loom__sqlite_col_json(s, 3)) ||
            json_array_append_new(arr, v) != 0) {
            rc = loom__error_oom();
            break;
        }
    }
    if (!rc && src != SQLITE_DONE)
        rc = loom__sqlite_fail(base, c, src, "reading researchers");
    sqlite3_finalize(s);
    return rc;
}

int loom__sqlite_research_get(loom_store *base, const char *run_id,
                              const char *user_id, int any_user, int events,
                              json_t **out)
{
    json_t *o = json_object(), *msgs = json_array(), *rs = json_array();
    json_t *evs = events ? json_array() : NULL;
    loom__sqlite_conn *c = NULL;
    int rc;

    *out = NULL;
    if (!o || !msgs || !rs || (events && !evs)) {
        rc = loom__error_oom();
        goto done;
    }
    if ((rc = loom__sqlite_begin(base, 0, &c)) != 0)
        goto done;
    if ((rc = run_row(base, c, run_id, user_id, any_user, o)) == 0 &&
        (rc = rows_into(base, c, sql_get_messages, run_id, 1, msgs)) == 0 &&
        (rc = researchers_into(base, c, run_id, rs)) == 0 &&
        (!evs ||
         (rc = rows_into(base, c, sql_get_events, run_id, 0, evs)) == 0))
        rc = loom__sqlite_commit(base, c, "reading a research run");
    loom__sqlite_end(base, c, 0);
    if (!rc && (json_object_set(o, "messages", msgs) ||
                json_object_set(o, "researchers", rs) ||
                (evs && json_object_set(o, "events", evs))))
        rc = loom__error_oom();
done:
    json_decref(msgs);
    json_decref(rs);
    json_decref(evs);
    if (rc)
        json_decref(o);
    else
        *out = o;
    return rc;
}

int loom__sqlite_research_running(loom_store *base, json_t **out)
{
    json_t *arr = json_array();
    loom__sqlite_conn *c = NULL;
    int rc;

    *out = NULL;
    if (!arr)
        return loom__error_oom();
    if ((rc = loom__sqlite_begin(base, 0, &c)) == 0) {
        if ((rc = rows_into(base, c, sql_running, NULL, 0, arr)) == 0)
            rc = loom__sqlite_commit(base, c, "listing research runs");
        loom__sqlite_end(base, c, 0);
    }
    if (rc)
        json_decref(arr);
    else
        *out = arr;
    return rc;
}
