/*
 * Runs in the SQLite backend (docs/store.md#runs): the row every saved
 * turn leaves in `runs` and the messages of a sub-agent's run in
 * `run_messages`, written inside save_turn's write transaction, and the
 * two reads: one run (with its children and, for a sub-agent's run, its
 * messages) and a run's children.
 *
 * A run's children are one level: each child names its own id, which a
 * reader follows for its children. That bounds every answer by the
 * tree's width, never by its size.
 */
#include "core/error.h"
#include "store/sqlite_internal.h"

/* The columns of RUN_COLS, in order; S_RUN_SELECT adds user_id. */
enum {
    R_ID,
    R_CONV,
    R_PARENT,
    R_PARENT_CALL,
    R_DEPTH,
    R_AGENT,
    R_MODEL,
    R_STATUS,
    R_ERROR,
    R_FINISH,
    R_PROMPT,
    R_COMPLETION,
    R_CACHED,
    R_REASONING,
    R_TOTAL,
    R_CACHE_WRITE,
    R_COST,
    R_CREATED,
    R_ENDED,
    R_USER
};

/* ---- writing ---------------------------------------------------------- */

int loom__sqlite_run_insert(loom__sqlite_store *st, loom__sqlite_conn *c,
                            const loom__store_plan *p)
{
    const loom_turn_record *t = p->turn;
    const loom_usage *u = &p->run_usage;
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK;

    if (!t->run_id)
        return 0; /* a caller's turn without a run: no row */
    if ((rc = loom__sqlite_use(st, c, S_RUN_INSERT, &s)) != 0)
        return rc;
    b_text(s, 1, t->run_id, &src);
    b_text(s, 2, t->conversation_id, &src);
    b_text(s, 3, t->parent_run_id, &src);
    b_text(s, 4, t->parent_call_id, &src);
    b_int(s, 5, t->depth, &src);
    b_text(s, 6, t->user_id, &src);
    b_text(s, 7, t->agent, &src);
    b_text(s, 8, t->model, &src);
    b_text(s, 9, p->run_status, &src);
    b_text(s, 10, t->status != LOOM_TURN_OK ? (t->error ? t->error : "") : NULL,
           &src);
    b_text(s, 11, t->finish_reason, &src);
    b_int(s, 12, u->prompt_tokens, &src);
    b_int(s, 13, u->completion_tokens, &src);
    b_int(s, 14, u->cached_tokens, &src);
    b_int(s, 15, u->reasoning_tokens, &src);
    b_int(s, 16, u->total_tokens, &src);
    b_int(s, 17, u->cache_write_tokens, &src);
    b_micros(s, 18, p->run_cost_micros, &src);
    b_int(s, 19, p->started_at, &src);
    b_int(s, 20, p->now, &src);
    if ((src = step_done(s, src)) != SQLITE_OK)
        return loom__sqlite_error(st, c->db, src, "saving a run");
    done(s);
    return 0;
}

/* A message's tool calls as JSON text (caller frees); NULL with none. */
static int calls_text(const loom_message *m, char **out)
{
    json_t *a;

    *out = NULL;
    if (!m->tool_calls_len)
        return 0;
    if (!(a = json_array()))
        return loom__error_oom();
    for (size_t k = 0; k < m->tool_calls_len; k++) {
        const loom_tool_call *tc = &m->tool_calls[k];
        json_t *v = json_pack("{s:s,s:s,s:s}", "id", tc->id ? tc->id : "",
                              "name", tc->name ? tc->name : "", "arguments",
                              tc->arguments ? tc->arguments : "{}");
        if (!v || json_array_append_new(a, v)) {
            json_decref(a);
            return loom__error_oom();
        }
    }
    *out = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    return *out ? 0 : loom__error_oom();
}

int loom__sqlite_run_messages_insert(loom__sqlite_store *st,
                                     loom__sqlite_conn *c,
                                     const loom__store_plan *p)
{
    sqlite3_stmt *s = NULL;
    int64_t pos = 0;
    int rc, src = SQLITE_OK;

    for (size_t i = 0; i < p->len; i++) {
        const loom__store_msg *m = &p->msgs[i];
        char *calls = NULL;
        /* The run's row carries its status: no placeholder here. */
        if (m->placeholder)
            continue;
        if ((rc = calls_text(m->msg, &calls)) != 0 ||
            (rc = loom__sqlite_use(st, c, S_RUN_MSG_INSERT, &s)) != 0) {
            free(calls);
            return rc;
        }
        b_text(s, 1, p->turn->run_id, &src);
        b_int(s, 2, pos++, &src);
        b_text(s, 3, loom_role_name(m->msg->role), &src);
        b_text(s, 4, m->msg->content, &src);
        b_text(s, 5, m->msg->reasoning, &src);
        b_text(s, 6, m->agent, &src);
        b_text(s, 7, calls, &src);
        b_text(s, 8, m->msg->tool_call_id, &src);
        b_text(s, 9, m->msg->name, &src);
        b_text(s, 10, m->tool_status, &src);
        b_real(s, 11, m->duration_ms, &src);
        b_int(s, 12, p->now, &src);
        src = step_done(s, src);
        done(s);
        free(calls);
        if (src != SQLITE_OK)
            return loom__sqlite_error(st, c->db, src,
                                      "saving a sub-agent's messages");
    }
    return 0;
}

/* ---- reading ---------------------------------------------------------- */

static int put(json_t *o, const char *key, json_t *v)
{
    return v ? json_object_set_new(o, key, v) : -1;
}

/* The run's error: null, or {"message"}. */
static json_t *error_json(sqlite3_stmt *s)
{
    if (sqlite3_column_type(s, R_ERROR) == SQLITE_NULL)
        return json_null();
    return json_pack("{s:o}", "message", loom__sqlite_col_json(s, R_ERROR));
}

/* The run on the row of s as JSON (RUN_COLS); NULL when out of memory. */
static json_t *run_json(sqlite3_stmt *s)
{
    json_t *o = json_object(), *u = json_object();
    static const char *const ukeys[] = {"prompt_tokens", "completion_tokens",
                                        "cached_tokens", "reasoning_tokens",
                                        "total_tokens",  "cache_write_tokens",
                                        "cost_micros"};
    int bad = !o || !u;

    for (size_t i = 0; !bad && i < sizeof(ukeys) / sizeof(ukeys[0]); i++)
        bad = put(u, ukeys[i], loom__sqlite_col_json(s, R_PROMPT + (int)i));
    bad = bad || put(o, "id", loom__sqlite_col_json(s, R_ID)) ||
          put(o, "object", json_string("run")) ||
          put(o, "conversation_id", loom__sqlite_col_json(s, R_CONV)) ||
          put(o, "parent_run_id", loom__sqlite_col_json(s, R_PARENT)) ||
          put(o, "parent_call_id", loom__sqlite_col_json(s, R_PARENT_CALL)) ||
          put(o, "depth", loom__sqlite_col_json(s, R_DEPTH)) ||
          put(o, "agent", loom__sqlite_col_json(s, R_AGENT)) ||
          put(o, "model", loom__sqlite_col_json(s, R_MODEL)) ||
          put(o, "status", loom__sqlite_col_json(s, R_STATUS)) ||
          put(o, "error", error_json(s)) ||
          put(o, "finish_reason", loom__sqlite_col_json(s, R_FINISH)) ||
          json_object_set(o, "usage", u) ||
          put(o, "created_at", loom__sqlite_col_json(s, R_CREATED)) ||
          put(o, "ended_at", loom__sqlite_col_json(s, R_ENDED));
    json_decref(u);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Appends the children of id to arr, on c's read transaction. */
static int children_on(loom__sqlite_store *st, loom__sqlite_conn *c,
                       const char *id, json_t *arr)
{
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK;

    if ((rc = loom__sqlite_use(st, c, S_RUN_CHILDREN, &s)) != 0)
        return rc;
    b_text(s, 1, id, &src);
    while (src == SQLITE_OK && (src = sqlite3_step(s)) == SQLITE_ROW) {
        json_t *o = run_json(s);
        src = SQLITE_OK;
        /* What the parent already says. */
        if (o) {
            json_object_del(o, "object");
            json_object_del(o, "conversation_id");
            json_object_del(o, "parent_run_id");
        }
        if (!o || json_array_append_new(arr, o)) {
            done(s);
            return loom__error_oom();
        }
    }
    done(s);
    if (src != SQLITE_DONE)
        return loom__sqlite_error(st, c->db, src, "reading a run's children");
    return 0;
}

/* A sub-agent's messages as JSON, appended to arr. */
static int messages_on(loom__sqlite_store *st, loom__sqlite_conn *c,
                       const char *id, json_t *arr)
{
    static const char *const keys[] = {
        "role",         "content", "reasoning",   "agent",       "tool_calls",
        "tool_call_id", "name",    "tool_status", "duration_ms", "created_at"};
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK;

    if ((rc = loom__sqlite_use(st, c, S_RUN_MSG_SELECT, &s)) != 0)
        return rc;
    b_text(s, 1, id, &src);
    while (src == SQLITE_OK && (src = sqlite3_step(s)) == SQLITE_ROW) {
        json_t *o = json_object();
        int bad = !o;
        src = SQLITE_OK;
        for (int i = 0; !bad && i < (int)(sizeof(keys) / sizeof(keys[0]));
             i++) {
            json_t *v = i == 4 && sqlite3_column_type(s, i) != SQLITE_NULL
                            ? loom__sqlite_col_parsed(s, i)
                            : loom__sqlite_col_json(s, i);
            bad = put(o, keys[i], v ? v : json_null());
        }
        if (bad || json_array_append_new(arr, o)) {
            if (bad)
                json_decref(o);
            done(s);
            return loom__error_oom();
        }
    }
    done(s);
    if (src != SQLITE_DONE)
        return loom__sqlite_error(st, c->db, src, "reading a run's messages");
    return 0;
}

static int not_found(const char *id)
{
    return loom__error_set(LOOM_ENOTFOUND, "run '%s' not found", id);
}

/* Whether the row's user (S_RUN_SELECT's last column) is user_id; NULL
 * matches only NULL. */
static int owned_by(sqlite3_stmt *s, const char *user_id)
{
    const char *owner = col_text(s, R_USER);

    if (!owner || !user_id)
        return !owner && !user_id;
    return strcmp(owner, user_id) == 0;
}

int loom__sqlite_run_get(loom_store *base, const char *id, const char *user_id,
                         json_t **out)
{
    loom__sqlite_store *st = (loom__sqlite_store *)base;
    json_t *res = NULL, *kids = NULL, *msgs = NULL;
    sqlite3_stmt *s = NULL;
    loom__sqlite_conn *c;
    int rc, src = SQLITE_OK, child = 0;

    *out = NULL;
    if ((rc = loom__sqlite_acquire(st, &c)) != 0)
        return rc;
    if ((rc = loom__sqlite_begin_read(st, c)) != 0 ||
        (rc = loom__sqlite_use(st, c, S_RUN_SELECT, &s)) != 0)
        goto cleanup;
    b_text(s, 1, id, &src);
    if (src == SQLITE_OK)
        src = sqlite3_step(s);
    if (src == SQLITE_ROW && owned_by(s, user_id)) {
        child = sqlite3_column_type(s, R_PARENT) != SQLITE_NULL;
        if (!(res = run_json(s)))
            rc = loom__error_oom();
    } else if (src == SQLITE_ROW || src == SQLITE_DONE) {
        rc = not_found(id);
    } else {
        rc = loom__sqlite_error(st, c->db, src, "reading a run");
    }
    done(s);
    if (rc)
        goto cleanup;
    if (!(kids = json_array()) || (child && !(msgs = json_array()))) {
        rc = loom__error_oom();
        goto cleanup;
    }
    if ((rc = children_on(st, c, id, kids)) != 0 ||
        (msgs && (rc = messages_on(st, c, id, msgs)) != 0) ||
        (rc = loom__sqlite_commit(&st->base, c, "reading a run")) != 0)
        goto cleanup;
    if (json_object_set_new(res, "stored", json_true()) ||
        json_object_set(res, "children", kids) ||
        (msgs && json_object_set(res, "messages", msgs)))
        rc = loom__error_oom();
cleanup:
    json_decref(kids);
    json_decref(msgs);
    if (rc) {
        json_decref(res);
        res = NULL;
    }
    loom__sqlite_release(st, c);
    *out = res;
    return rc;
}

int loom__sqlite_run_children(loom_store *base, const char *id, json_t **out)
{
    loom__sqlite_store *st = (loom__sqlite_store *)base;
    loom__sqlite_conn *c;
    json_t *arr;
    int rc;

    *out = NULL;
    if (!(arr = json_array()))
        return loom__error_oom();
    if ((rc = loom__sqlite_acquire(st, &c)) != 0) {
        json_decref(arr);
        return rc;
    }
    if ((rc = loom__sqlite_begin_read(st, c)) == 0 &&
        (rc = children_on(st, c, id, arr)) == 0)
        rc = loom__sqlite_commit(&st->base, c, "reading a run's children");
    loom__sqlite_release(st, c);
    if (rc)
        json_decref(arr);
    else
        *out = arr;
    return rc;
}
