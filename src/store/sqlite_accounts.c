/*
 * Accounts in the SQLite backend: workspaces, users, API keys, the audit
 * log and the pepper of key hashes (see loom/accounts.h and the accounts
 * vtable entries in store_internal.h; schema step 10).
 *
 * The front (accounts.c) has checked every name and made every id,
 * secret, hash and audit detail; this file only moves rows. Each change
 * to a key writes its audit entry in the same transaction, so the log
 * never misses a change that happened nor records one that did not.
 * Writes take BEGIN IMMEDIATE after the store's write lock; another
 * process (`loom keys` on a running server's file) is waited for up to
 * SQLite's busy timeout. What a keyed request with limits reads and
 * writes (the pepper, its key, the limits of its user and workspace, a
 * budget's spend) uses the connection's cached statements (sqlite.c);
 * the rest (admin calls, rare next to requests) is prepared per call.
 */
#include "core/error.h"
#include "store/sqlite_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static const char sql_pepper_put[] =
    "INSERT OR IGNORE INTO auth_secrets (name, value) "
    "VALUES ('key_pepper', ?1)";
static const char sql_workspace_put[] =
    "INSERT OR IGNORE INTO workspaces (id, created_at) VALUES (?1, ?2)";
static const char sql_user_put[] =
    "INSERT OR IGNORE INTO users (workspace, name, created_at) "
    "VALUES (?1, ?2, ?3)";
static const char sql_key_put[] =
    "INSERT INTO api_keys (" KEY_COLS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, "
    "NULL, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)";
static const char sql_key_revoke[] =
    "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL";
static const char sql_key_limits[] =
    "UPDATE api_keys SET rpm = ?2, tpm = ?3, max_concurrent = ?4, "
    "budget_micros = ?5, budget_period = ?6, budget_unpriced = ?7 "
    "WHERE id = ?1";
static const char sql_audit_put[] =
    "INSERT INTO audit_log (at, actor, action, key_id, workspace, user_name, "
    "detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";
static const char sql_key_list[] =
    "SELECT " KEY_COLS " FROM api_keys "
    "WHERE (?1 IS NULL OR workspace = ?1) AND (?2 IS NULL OR user_name = ?2) "
    "ORDER BY created_at DESC, id DESC";
static const char sql_user_list[] =
    "SELECT u.workspace, u.name, u.created_at, "
    "(SELECT count(*) FROM api_keys k WHERE k.workspace = u.workspace AND "
    "k.user_name = u.name AND k.revoked_at IS NULL), " LIMIT_COLS
    " FROM users u "
    "WHERE ?1 IS NULL OR u.workspace = ?1 ORDER BY u.workspace, u.name";
static const char sql_workspace_list[] =
    "SELECT w.id, w.created_at, (SELECT count(*) FROM users u "
    "WHERE u.workspace = w.id), " LIMIT_COLS " FROM workspaces w ORDER BY w.id";
static const char sql_user_set_limits[] =
    "UPDATE users SET rpm = ?3, tpm = ?4, max_concurrent = ?5, "
    "budget_micros = ?6, budget_period = ?7, budget_unpriced = ?8 "
    "WHERE workspace = ?1 AND name = ?2";
static const char sql_workspace_set_limits[] =
    "UPDATE workspaces SET rpm = ?3, tpm = ?4, max_concurrent = ?5, "
    "budget_micros = ?6, budget_period = ?7, budget_unpriced = ?8 "
    "WHERE id = ?1 AND ?2 IS NULL";
static const char sql_spend_list[] =
    "SELECT scope, period, period_start, spent_micros, updated_at "
    "FROM budget_spend WHERE ?1 IS NULL OR substr(scope, 1, length(?1)) = ?1 "
    "ORDER BY scope, period_start DESC";
static const char sql_audit_list[] =
    "SELECT id, at, actor, action, key_id, workspace, user_name, detail "
    "FROM audit_log ORDER BY id DESC LIMIT ?1";

/* Prepares sql on c; an SQLite code. */
static int prepare(loom__sqlite_conn *c, const char *sql, sqlite3_stmt **s)
{
    *s = NULL;
    return sqlite3_prepare_v2(loom__sqlite_db(c), sql, -1, s, NULL);
}

/* Binds a limit: NULL for zero (none). */
static void b_limit(sqlite3_stmt *s, int i, int64_t v, int *rc)
{
    if (*rc == SQLITE_OK)
        *rc = v ? sqlite3_bind_int64(s, i, v) : sqlite3_bind_null(s, i);
}

static void b_limits(sqlite3_stmt *s, int first, const loom_limits *l, int *rc)
{
    b_limit(s, first, l->rpm, rc);
    b_limit(s, first + 1, l->tpm, rc);
    b_limit(s, first + 2, l->max_concurrent, rc);
    b_limit(s, first + 3, l->budget_micros, rc);
    b_text(s, first + 4,
           l->budget_micros ? loom_budget_period_name(l->budget_period) : NULL,
           rc);
    if (*rc == SQLITE_OK)
        *rc = sqlite3_bind_int(s, first + 5, l->budget_allow_unpriced != 0);
}

/* Writes the audit entry a on c; an SQLite code. */
static int exec_audit(loom__sqlite_conn *c, const loom__store_audit *a)
{
    sqlite3_stmt *s = NULL;
    int src = prepare(c, sql_audit_put, &s);

    b_int(s, 1, a->at, &src);
    b_text(s, 2, a->actor, &src);
    b_text(s, 3, a->action, &src);
    b_text(s, 4, a->key_id, &src);
    b_text(s, 5, a->workspace, &src);
    b_text(s, 6, a->user, &src);
    b_text(s, 7, a->detail, &src);
    src = step_done(s, src);
    sqlite3_finalize(s);
    return src;
}

int loom__sqlite_key_pepper(loom_store *st, int create,
                            unsigned char out[LOOM__STORE_PEPPER_SIZE])
{
    unsigned char fresh[LOOM__STORE_PEPPER_SIZE];
    loom__sqlite_conn *c;
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK;

    if (create && getrandom(fresh, sizeof(fresh), 0) != (ssize_t)sizeof(fresh))
        return loom__error_set(LOOM_ERROR, "no random bytes for a pepper");
    /* Reading alone is one statement, its own snapshot. */
    rc = create ? loom__sqlite_begin(st, 1, &c)
                : loom__sqlite_acquire((loom__sqlite_store *)st, &c);
    if (rc != 0)
        return rc;
    if (create) {
        src = prepare(c, sql_pepper_put, &s);
        b_blob(s, 1, fresh, sizeof(fresh), &src);
        src = step_done(s, src);
        sqlite3_finalize(s);
        s = NULL;
    }
    if (src == SQLITE_OK &&
        (src = loom__sqlite_stmt(c, S_PEPPER_GET, &s)) == SQLITE_OK)
        src = sqlite3_step(s);
    if (src == SQLITE_ROW &&
        sqlite3_column_bytes(s, 0) == LOOM__STORE_PEPPER_SIZE) {
        memcpy(out, sqlite3_column_blob(s, 0), LOOM__STORE_PEPPER_SIZE);
        done(s);
        s = NULL;
        rc = create ? loom__sqlite_commit(st, c, "reading the key pepper") : 0;
    } else if (src == SQLITE_DONE) {
        rc = loom__error_set(LOOM_ENOTFOUND, "no key has been made yet");
    } else {
        rc = loom__sqlite_fail(st, c, src, "reading the key pepper");
    }
    done(s);
    loom__sqlite_end(st, c, create);
    return rc;
}

/* Inserts workspace and user on c when new; *created (may be NULL) says
 * whether the user was. An SQLite code. */
static int put_user(loom__sqlite_conn *c, const char *workspace,
                    const char *user, int64_t at, int *created)
{
    sqlite3_stmt *s = NULL;
    int src = prepare(c, sql_workspace_put, &s);

    b_text(s, 1, workspace, &src);
    b_int(s, 2, at, &src);
    src = step_done(s, src);
    sqlite3_finalize(s);
    s = NULL;
    if (src == SQLITE_OK && (src = prepare(c, sql_user_put, &s)) == SQLITE_OK) {
        b_text(s, 1, workspace, &src);
        b_text(s, 2, user, &src);
        b_int(s, 3, at, &src);
        src = step_done(s, src);
        sqlite3_finalize(s);
    }
    if (src == SQLITE_OK && created)
        *created = sqlite3_changes(loom__sqlite_db(c)) > 0;
    return src;
}

int loom__sqlite_key_insert(loom_store *st, const loom__store_key *k)
{
    loom__sqlite_conn *c;
    sqlite3_stmt *s = NULL;
    int rc, src;

    if ((rc = loom__sqlite_begin(st, 1, &c)) != 0)
        return rc;
    src = put_user(c, k->workspace, k->user, k->created_at, NULL);
    if (src == SQLITE_OK && (src = prepare(c, sql_key_put, &s)) == SQLITE_OK) {
        b_text(s, 1, k->id, &src);
        b_blob(s, 2, k->hash, sizeof(k->hash), &src);
        b_text(s, 3, k->workspace, &src);
        b_text(s, 4, k->user, &src);
        b_int(s, 5, k->service, &src);
        b_int(s, 6, k->created_at, &src);
        b_limit(s, 7, k->expires_at, &src);
        b_text(s, 8, k->models, &src);
        b_text(s, 9, k->agents, &src);
        b_limits(s, 10, &k->limits, &src);
        src = step_done(s, src);
        sqlite3_finalize(s);
    }
    if (src == SQLITE_OK)
        src = exec_audit(c, &k->audit);
    rc = src == SQLITE_OK ? loom__sqlite_commit(st, c, "storing a key")
                          : loom__sqlite_fail(st, c, src, "storing a key");
    loom__sqlite_end(st, c, 1);
    return rc;
}

int loom__sqlite_user_ensure(loom_store *st, const loom__store_audit *a,
                             int *created)
{
    loom__sqlite_conn *c;
    int rc, src;

    *created = 0;
    if ((rc = loom__sqlite_begin(st, 1, &c)) != 0)
        return rc;
    src = put_user(c, a->workspace, a->user, a->at, created);
    if (src == SQLITE_OK && *created)
        src = exec_audit(c, a);
    rc = src == SQLITE_OK ? loom__sqlite_commit(st, c, "storing a user")
                          : loom__sqlite_fail(st, c, src, "storing a user");
    loom__sqlite_end(st, c, 1);
    if (rc != 0)
        *created = 0;
    return rc;
}

static json_t *json_col(sqlite3_stmt *s, int i)
{
    const char *v = col_text(s, i);

    return v ? json_loadb(v, (size_t)sqlite3_column_bytes(s, i), 0, NULL)
             : NULL;
}

/* A row of KEY_COLS into *out (and its hash). */
static int row_key(sqlite3_stmt *s, loom_key_info *out,
                   unsigned char hash[LOOM__STORE_KEY_HASH_SIZE])
{
    const char *id = col_text(s, 0), *period = col_text(s, 14);
    int bad = 0;

    memset(out, 0, sizeof(*out));
    snprintf(out->id, sizeof(out->id), "%s", id ? id : "");
    if (hash) {
        memset(hash, 0, LOOM__STORE_KEY_HASH_SIZE);
        if (sqlite3_column_bytes(s, 1) == LOOM__STORE_KEY_HASH_SIZE)
            memcpy(hash, sqlite3_column_blob(s, 1), LOOM__STORE_KEY_HASH_SIZE);
    }
    out->workspace = col_dup(s, 2, &bad);
    out->user = col_dup(s, 3, &bad);
    out->service = sqlite3_column_int(s, 4);
    out->created_at = sqlite3_column_int64(s, 5);
    out->expires_at = sqlite3_column_int64(s, 6);
    out->revoked_at = sqlite3_column_int64(s, 7);
    out->models = json_col(s, 8);
    out->agents = json_col(s, 9);
    out->limits.rpm = (long)sqlite3_column_int64(s, 10);
    out->limits.tpm = (long)sqlite3_column_int64(s, 11);
    out->limits.max_concurrent = (long)sqlite3_column_int64(s, 12);
    out->limits.budget_micros = sqlite3_column_int64(s, 13);
    out->limits.budget_period =
        period && loom_budget_period_parse(period) > 0
            ? (loom_budget_period)loom_budget_period_parse(period)
            : LOOM_BUDGET_TOTAL;
    out->limits.budget_allow_unpriced = sqlite3_column_int(s, 15);
    if (bad || !out->workspace || !out->user) {
        loom_key_info_clear(out);
        return loom__error_oom();
    }
    return 0;
}

/* Reads key id on c (inside the caller's transaction). */
static int key_on(loom_store *st, loom__sqlite_conn *c, const char *id,
                  loom_key_info *out,
                  unsigned char hash[LOOM__STORE_KEY_HASH_SIZE])
{
    sqlite3_stmt *s = NULL;
    int rc, src = loom__sqlite_stmt(c, S_KEY_GET, &s);

    b_text(s, 1, id, &src);
    if (src == SQLITE_OK)
        src = sqlite3_step(s);
    if (src == SQLITE_ROW)
        rc = row_key(s, out, hash);
    else if (src == SQLITE_DONE)
        rc = loom__error_set(LOOM_ENOTFOUND, "no key with id '%s'", id);
    else
        rc = loom__sqlite_fail(st, c, src, "reading a key");
    done(s);
    return rc;
}

int loom__sqlite_key_get(loom_store *st, const char *id, loom_key_info *out,
                         unsigned char hash[LOOM__STORE_KEY_HASH_SIZE])
{
    loom__sqlite_conn *c;
    int rc;

    /* One statement: its own snapshot. */
    if ((rc = loom__sqlite_acquire((loom__sqlite_store *)st, &c)) != 0)
        return rc;
    rc = key_on(st, c, id, out, hash);
    loom__sqlite_end(st, c, 0);
    return rc;
}

/* Runs an UPDATE of key id (sql: ?1 the id, then bind's), then the audit
 * entry a, in one write transaction; LOOM_ENOTFOUND when no such key. */
static int key_change(loom_store *st, const char *id, const char *sql,
                      const loom_limits *l, int64_t revoked_at,
                      const loom__store_audit *a, loom_key_info *out)
{
    loom_key_info before;
    loom__sqlite_conn *c;
    sqlite3_stmt *s = NULL;
    int rc, src;

    if ((rc = loom__sqlite_begin(st, 1, &c)) != 0)
        return rc;
    if ((rc = key_on(st, c, id, &before, NULL)) != 0)
        goto cleanup;
    /* Revoking twice is no change and no entry. */
    if (!l && before.revoked_at) {
        rc = loom__sqlite_commit(st, c, "revoking a key");
        goto cleanup;
    }
    src = prepare(c, sql, &s);
    b_text(s, 1, id, &src);
    if (l)
        b_limits(s, 2, l, &src);
    else
        b_int(s, 2, revoked_at, &src);
    src = step_done(s, src);
    sqlite3_finalize(s);
    if (src == SQLITE_OK)
        src = exec_audit(c, a);
    rc = src == SQLITE_OK ? loom__sqlite_commit(st, c, "changing a key")
                          : loom__sqlite_fail(st, c, src, "changing a key");
cleanup:
    loom_key_info_clear(&before);
    loom__sqlite_end(st, c, 1);
    if (rc == 0 && out)
        rc = loom__sqlite_key_get(st, id, out, NULL);
    return rc;
}

int loom__sqlite_key_revoke(loom_store *st, const char *id,
                            const loom__store_audit *a, loom_key_info *out)
{
    return key_change(st, id, sql_key_revoke, NULL, a->at, a, out);
}

int loom__sqlite_key_set_limits(loom_store *st, const char *id,
                                const loom_limits *l,
                                const loom__store_audit *a)
{
    return key_change(st, id, sql_key_limits, l, 0, a, NULL);
}

/* Runs a read-only list: sql with up to two text parameters; each row is
 * turned into an object by row. {"data": [...]} into *out. */
static int list(loom_store *st, const char *sql, const char *p1, const char *p2,
                int limit, json_t *(*row)(sqlite3_stmt *s), const char *what,
                json_t **out)
{
    loom__sqlite_conn *c;
    sqlite3_stmt *s = NULL;
    json_t *data = json_array();
    int rc, src;

    *out = NULL;
    if (!data)
        return loom__error_oom();
    if ((rc = loom__sqlite_begin(st, 0, &c)) != 0) {
        json_decref(data);
        return rc;
    }
    src = prepare(c, sql, &s);
    if (limit)
        b_int(s, 1, limit, &src);
    else if (src == SQLITE_OK && sqlite3_bind_parameter_count(s) > 0) {
        b_text(s, 1, p1, &src);
        if (src == SQLITE_OK && sqlite3_bind_parameter_count(s) > 1)
            b_text(s, 2, p2, &src);
    }
    while (src == SQLITE_OK && (src = sqlite3_step(s)) == SQLITE_ROW) {
        json_t *o = row(s);
        src =
            o && json_array_append_new(data, o) == 0 ? SQLITE_OK : SQLITE_NOMEM;
    }
    sqlite3_finalize(s);
    if (src != SQLITE_DONE)
        rc = loom__sqlite_fail(st, c, src, what);
    else
        rc = loom__sqlite_commit(st, c, what);
    loom__sqlite_end(st, c, 0);
    if (rc == 0 && !(*out = json_pack("{s:o}", "data", data)))
        rc = loom__error_oom();
    else if (rc != 0)
        json_decref(data);
    return rc;
}

static json_t *key_row_json(sqlite3_stmt *s)
{
    loom_key_info k;
    json_t *o;

    if (row_key(s, &k, NULL) != 0)
        return NULL;
    o = loom_key_info_json(&k);
    loom_key_info_clear(&k);
    return o;
}

static json_t *text_or_null(sqlite3_stmt *s, int i)
{
    const char *v = col_text(s, i);

    return v ? json_string(v) : json_null();
}

/* The LIMIT_COLS of a row, from column first on. */
static void row_limits(sqlite3_stmt *s, int first, loom_limits *l)
{
    const char *period = col_text(s, first + 4);
    int p = period ? loom_budget_period_parse(period) : -1;

    memset(l, 0, sizeof(*l));
    l->rpm = (long)sqlite3_column_int64(s, first);
    l->tpm = (long)sqlite3_column_int64(s, first + 1);
    l->max_concurrent = (long)sqlite3_column_int64(s, first + 2);
    l->budget_micros = sqlite3_column_int64(s, first + 3);
    l->budget_period = p > 0 ? (loom_budget_period)p : LOOM_BUDGET_TOTAL;
    l->budget_allow_unpriced = sqlite3_column_int(s, first + 5);
}

static json_t *user_row_json(sqlite3_stmt *s)
{
    loom_limits l;

    row_limits(s, 4, &l);
    return json_pack("{s:o,s:o,s:I,s:I,s:o}", "workspace", text_or_null(s, 0),
                     "name", text_or_null(s, 1), "created_at",
                     (json_int_t)sqlite3_column_int64(s, 2), "keys",
                     (json_int_t)sqlite3_column_int64(s, 3), "limits",
                     loom_limits_json(&l));
}

static json_t *workspace_row_json(sqlite3_stmt *s)
{
    loom_limits l;

    row_limits(s, 3, &l);
    return json_pack("{s:o,s:s,s:I,s:I,s:o}", "id", text_or_null(s, 0),
                     "object", "workspace", "created_at",
                     (json_int_t)sqlite3_column_int64(s, 1), "users",
                     (json_int_t)sqlite3_column_int64(s, 2), "limits",
                     loom_limits_json(&l));
}

static json_t *audit_row_json(sqlite3_stmt *s)
{
    json_t *detail = json_col(s, 7);

    return json_pack("{s:I,s:I,s:o,s:o,s:o,s:o,s:o,s:o}", "id",
                     (json_int_t)sqlite3_column_int64(s, 0), "at",
                     (json_int_t)sqlite3_column_int64(s, 1), "actor",
                     text_or_null(s, 2), "action", text_or_null(s, 3), "key_id",
                     text_or_null(s, 4), "workspace", text_or_null(s, 5),
                     "user", text_or_null(s, 6), "detail",
                     detail ? detail : json_null());
}

int loom__sqlite_key_list(loom_store *st, const char *workspace,
                          const char *user, json_t **out)
{
    return list(st, sql_key_list, workspace, user, 0, key_row_json,
                "listing keys", out);
}

int loom__sqlite_user_list(loom_store *st, const char *workspace, json_t **out)
{
    return list(st, sql_user_list, workspace, NULL, 0, user_row_json,
                "listing users", out);
}

int loom__sqlite_workspace_list(loom_store *st, json_t **out)
{
    return list(st, sql_workspace_list, NULL, NULL, 0, workspace_row_json,
                "listing workspaces", out);
}

int loom__sqlite_audit_list(loom_store *st, int limit, json_t **out)
{
    return list(st, sql_audit_list, NULL, NULL, limit, audit_row_json,
                "reading the audit log", out);
}

/* ---- limits of users and workspaces, spend ------------------------------ */

/* The limits of one row of the cached statement id (S_USER_LIMITS: ?1
 * workspace, ?2 user; S_WORKSPACE_LIMITS: ?1) on c; zero when there is
 * no row. An SQLite code. */
static int limits_on(loom__sqlite_conn *c, int id, const char *workspace,
                     const char *user, loom_limits *out, int *found)
{
    sqlite3_stmt *s = NULL;
    int src = loom__sqlite_stmt(c, id, &s);

    memset(out, 0, sizeof(*out));
    *found = 0;
    b_text(s, 1, workspace, &src);
    if (user)
        b_text(s, 2, user, &src);
    if (src == SQLITE_OK && (src = sqlite3_step(s)) == SQLITE_ROW) {
        row_limits(s, 0, out);
        *found = 1;
        src = SQLITE_OK;
    } else if (src == SQLITE_DONE) {
        src = SQLITE_OK;
    }
    done(s);
    return src;
}

int loom__sqlite_account_limits(loom_store *st, const char *workspace,
                                const char *user, loom_limits *user_out,
                                loom_limits *workspace_out)
{
    loom__sqlite_conn *c;
    int rc, src = SQLITE_OK, found;

    memset(user_out, 0, sizeof(*user_out));
    if ((rc = loom__sqlite_begin(st, 0, &c)) != 0)
        return rc;
    if (user)
        src = limits_on(c, S_USER_LIMITS, workspace, user, user_out, &found);
    if (src == SQLITE_OK)
        src = limits_on(c, S_WORKSPACE_LIMITS, workspace, NULL, workspace_out,
                        &found);
    rc = src == SQLITE_OK ? loom__sqlite_commit(st, c, "reading limits")
                          : loom__sqlite_fail(st, c, src, "reading limits");
    loom__sqlite_end(st, c, 0);
    return rc;
}

int loom__sqlite_account_set_limits(loom_store *st, const char *workspace,
                                    const char *user, const loom_limits *l,
                                    const loom__store_audit *a)
{
    loom__sqlite_conn *c;
    sqlite3_stmt *s = NULL;
    int rc, src;

    if ((rc = loom__sqlite_begin(st, 1, &c)) != 0)
        return rc;
    src = prepare(c, user ? sql_user_set_limits : sql_workspace_set_limits, &s);
    b_text(s, 1, workspace, &src);
    b_text(s, 2, user, &src);
    b_limits(s, 3, l, &src);
    src = step_done(s, src);
    sqlite3_finalize(s);
    if (src == SQLITE_OK && sqlite3_changes(loom__sqlite_db(c)) == 0) {
        /* Nothing changed: end the transaction as it is. */
        (void)loom__sqlite_commit(st, c, "changing limits");
        loom__sqlite_end(st, c, 1);
        return user ? loom__error_set(LOOM_ENOTFOUND,
                                      "no user '%s' in workspace '%s'", user,
                                      workspace)
                    : loom__error_set(LOOM_ENOTFOUND, "no workspace '%s'",
                                      workspace);
    }
    if (src == SQLITE_OK)
        src = exec_audit(c, a);
    rc = src == SQLITE_OK ? loom__sqlite_commit(st, c, "changing limits")
                          : loom__sqlite_fail(st, c, src, "changing limits");
    loom__sqlite_end(st, c, 1);
    return rc;
}

int loom__sqlite_audit_add(loom_store *st, const loom__store_audit *a)
{
    loom__sqlite_conn *c;
    int rc, src;

    if ((rc = loom__sqlite_begin(st, 1, &c)) != 0)
        return rc;
    src = exec_audit(c, a);
    rc = src == SQLITE_OK
             ? loom__sqlite_commit(st, c, "writing the audit log")
             : loom__sqlite_fail(st, c, src, "writing the audit log");
    loom__sqlite_end(st, c, 1);
    return rc;
}

int loom__sqlite_spend_get(loom_store *st, const char *scope,
                           const char *period, int64_t period_start,
                           int64_t *out)
{
    loom__sqlite_conn *c;
    sqlite3_stmt *s = NULL;
    int rc, src;

    *out = 0;
    /* One statement: its own snapshot. */
    if ((rc = loom__sqlite_acquire((loom__sqlite_store *)st, &c)) != 0)
        return rc;
    src = loom__sqlite_stmt(c, S_SPEND_GET, &s);
    b_text(s, 1, scope, &src);
    b_text(s, 2, period, &src);
    b_int(s, 3, period_start, &src);
    if (src == SQLITE_OK && (src = sqlite3_step(s)) == SQLITE_ROW) {
        *out = sqlite3_column_int64(s, 0);
        src = SQLITE_OK;
    } else if (src == SQLITE_DONE) {
        src = SQLITE_OK;
    }
    rc =
        src == SQLITE_OK ? 0 : loom__sqlite_fail(st, c, src, "reading a spend");
    done(s);
    loom__sqlite_end(st, c, 0);
    return rc;
}

typedef struct {
    const char *scope, *period;
    int64_t period_start, micros, now;
} spend_args;

/* Adds a spend_args to its row, as one write of the writer's batch. */
static int write_spend(loom__sqlite_store *st, loom__sqlite_conn *c,
                       const void *arg)
{
    const spend_args *a = arg;
    sqlite3_stmt *s = NULL;
    int rc, src;

    src = loom__sqlite_stmt(c, S_SPEND_ADD, &s);
    b_text(s, 1, a->scope, &src);
    b_text(s, 2, a->period, &src);
    b_int(s, 3, a->period_start, &src);
    b_int(s, 4, a->micros, &src);
    b_int(s, 5, a->now, &src);
    src = step_done(s, src);
    rc = src == SQLITE_OK
             ? 0
             : loom__sqlite_fail(&st->base, c, src, "adding a spend");
    done(s);
    return rc;
}

int loom__sqlite_spend_add(loom_store *st, const char *scope,
                           const char *period, int64_t period_start,
                           int64_t micros, int64_t now)
{
    spend_args a = {scope, period, period_start, micros, now};

    /* Returns once the writer's batch holding it has committed. */
    return loom__sqlite_write((loom__sqlite_store *)st, write_spend, &a);
}

static json_t *spend_row_json(sqlite3_stmt *s)
{
    return json_pack("{s:o,s:o,s:I,s:I,s:I}", "scope", text_or_null(s, 0),
                     "period", text_or_null(s, 1), "period_start",
                     (json_int_t)sqlite3_column_int64(s, 2), "spent_micros",
                     (json_int_t)sqlite3_column_int64(s, 3), "updated_at",
                     (json_int_t)sqlite3_column_int64(s, 4));
}

int loom__sqlite_spend_list(loom_store *st, const char *scope_prefix,
                            json_t **out)
{
    return list(st, sql_spend_list, scope_prefix, NULL, 0, spend_row_json,
                "listing spend", out);
}
