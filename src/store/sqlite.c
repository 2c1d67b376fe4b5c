/*
 * The SQLite backend of the store (see loom/store.h, store_internal.h).
 *
 * One database file in WAL mode. Connections live in a small pool: each
 * is used by one thread at a time (so they are opened NOMUTEX) and keeps
 * its prepared statements for its whole life. Readers run side by side
 * (WAL gives each a snapshot); writers take an in-process lock first,
 * since SQLite admits one writer anyway and waiting on a mutex is cheaper
 * and fairer than spinning in SQLite's busy handler. busy_timeout still
 * covers other processes using the same file.
 *
 * Turns and new conversations are written by the writer thread
 * (sqlite_writer.c) in batches, one transaction for all that queued while
 * the previous batch committed; their callers wait for that commit. The
 * same file runs the WAL checkpoints on a thread of their own: SQLite's
 * auto-checkpoint is off on every connection.
 *
 * Durability: synchronous=NORMAL. In WAL mode a committed transaction is
 * in the WAL before COMMIT returns, so it survives the process being
 * killed; only a power cut may lose the last commits (those since the
 * newest checkpoint), never corrupt the file. Every other write is one
 * transaction (BEGIN IMMEDIATE ... COMMIT), rolled back on any error.
 * Errors name the file and SQLite's message; a full disk or an I/O
 * failure is LOOM_EIO. Every connection opens the file through
 * sqlite_walvfs.c, which writes each commit's WAL pages in one call.
 *
 * This file holds the pool, opening (WAL, migrations) and the vtable;
 * sqlite_conversations.c reads and deletes conversations, sqlite_turn.c
 * saves turns and sqlite_memory.c holds users' memories, all through
 * sqlite_internal.h.
 */
#include "core/error.h"
#include "store/sqlite_internal.h"

#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Connections at most; a thread past that waits for one to come back. */
#define MAX_CONNS 8
/* How long a statement waits for another process's lock. */
#define BUSY_TIMEOUT_MS 5000

#define INFO_COLS                                                              \
    "id, title, agent, model, created_at, updated_at, message_count, user_id"
/* A list's title filter (?5), '\\' escaping the pattern's own % and _;
 * a list holds no branches (they are reached from their conversation). */
#define LIST_FILTER                                                            \
    "parent_id IS NULL AND (?5 IS NULL OR title LIKE ?5 ESCAPE '\\') "

static const char *const sql_text[S_COUNT] = {
    [S_BEGIN] = "BEGIN",
    [S_BEGIN_WRITE] = "BEGIN IMMEDIATE",
    [S_COMMIT] = "COMMIT",
    [S_ROLLBACK] = "ROLLBACK",
    [S_PING] = "SELECT 1",
    [S_CONV_INSERT] = "INSERT INTO conversations (id, title, created_at, "
                      "updated_at, message_count) VALUES (?1, '', ?2, ?2, 0)",
    [S_CONV_INSERT_OWNED] = "INSERT INTO conversations (id, title, "
                            "created_at, updated_at, message_count, user_id) "
                            "VALUES (?1, '', ?2, ?2, 0, ?3)",
    /* A conversation made with its first turn, as S_CONV_UPDATE leaves a
     * row S_CONV_INSERT_OWNED made (?10: the hashes are set). */
    [S_CONV_INSERT_TURN] =
        "INSERT INTO conversations (id, created_at, updated_at, "
        "message_count, agent, model, title, summary, summary_covers, plan, "
        "prefix_hash, prefix_hash_streamed, user_id) VALUES (?1, ?15, "
        "MAX(?15, ?2), ?3, ?4, ?5, coalesce(?6, ''), ?7, "
        "CASE WHEN ?7 IS NULL THEN 0 ELSE ?8 END, ?9, "
        "CASE WHEN ?10 THEN ?11 END, CASE WHEN ?10 THEN ?12 END, ?14)",
    [S_CONV_INFO] = "SELECT " INFO_COLS " FROM conversations WHERE id = ?1",
    /* ?5: NULL, or a LIKE pattern the title must match. */
    [S_CONV_LIST] =
        "SELECT " INFO_COLS " FROM conversations "
        "WHERE " LIST_FILTER "ORDER BY updated_at DESC, id DESC LIMIT ?1",
    [S_CONV_LIST_AFTER] = "SELECT " INFO_COLS " FROM conversations "
                          "WHERE (updated_at, id) < (?1, ?2) AND " LIST_FILTER
                          "ORDER BY updated_at DESC, id DESC LIMIT ?3",
    /* One owner's (conversations_by_owner). */
    [S_CONV_LIST_OWNED] = "SELECT " INFO_COLS " FROM conversations "
                          "WHERE user_id = ?2 AND " LIST_FILTER
                          "ORDER BY updated_at DESC, id DESC LIMIT ?1",
    [S_CONV_LIST_OWNED_AFTER] = "SELECT " INFO_COLS " FROM conversations "
                                "WHERE user_id = ?4 AND (updated_at, id) < "
                                "(?1, ?2) AND " LIST_FILTER
                                "ORDER BY updated_at DESC, id DESC LIMIT ?3",
    [S_CONV_DELETE] = "DELETE FROM conversations WHERE id = ?1",
    [S_CONV_RENAME] = "UPDATE conversations SET title = ?2 WHERE id = ?1",
    [S_CONV_BASE] = "SELECT message_count FROM conversations WHERE id = ?1",
    /* A turn's one write of its conversation's row: counters, title,
     * summary, plan, and (?10 set) the transcript hashes, with the owner
     * at the first turn (?13 set). */
    [S_CONV_UPDATE] =
        "UPDATE conversations SET updated_at = MAX(updated_at, ?2), "
        "message_count = message_count + ?3, agent = ?4, model = ?5, "
        "title = CASE WHEN title = '' AND ?6 IS NOT NULL THEN ?6 "
        "ELSE title END, "
        "summary = CASE WHEN ?7 IS NULL THEN summary ELSE ?7 END, "
        "summary_covers = CASE WHEN ?7 IS NULL THEN summary_covers "
        "ELSE ?8 END, plan = CASE WHEN ?9 IS NULL THEN plan ELSE ?9 END, "
        "prefix_hash = CASE WHEN ?10 THEN ?11 ELSE prefix_hash END, "
        "prefix_hash_streamed = CASE WHEN ?10 THEN ?12 "
        "ELSE prefix_hash_streamed END, "
        "user_id = CASE WHEN ?13 THEN ?14 ELSE user_id END "
        "WHERE id = ?1",
    [S_MSG_INSERT] =
        "INSERT INTO messages (id, conversation_id, position, run_id, role, "
        "content, reasoning, model, finish_reason, status, error, "
        "prompt_tokens, completion_tokens, cost, tool_call_id, name, "
        "placeholder, created_at, provider_state, cost_micros, citations, "
        "parts, agent) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, "
        "?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23)",
    [S_CALL_INSERT] = "INSERT INTO tool_calls (message_id, position, "
                      "call_id, name, arguments, text_offset) "
                      "VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    [S_OUTPUT_INSERT] = "INSERT INTO tool_outputs (message_id, call_id, "
                        "status, duration_ms) VALUES (?1, ?2, ?3, ?4)",
    [S_USAGE_INSERT] =
        "INSERT INTO usage (conversation_id, run_id, model, iteration, "
        "prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens, "
        "total_tokens, cost, created_at, cache_write_tokens, cost_micros, "
        "agent, user_id, key_id, workspace, user_name, end_user) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, "
        "?15, ?16, ?17, ?18, ?19)",
    [S_MSG_SELECT] =
        "SELECT m.id, m.role, m.content, m.reasoning, m.model, "
        "m.finish_reason, m.status, m.error, m.prompt_tokens, "
        "m.completion_tokens, m.cost, m.created_at, m.run_id, "
        "m.tool_call_id, m.name, m.placeholder, o.status, o.duration_ms, "
        "m.provider_state, m.cost_micros, m.citations, m.parts, m.agent "
        "FROM messages m LEFT JOIN tool_outputs o ON o.message_id = m.id "
        "WHERE m.conversation_id = ?1 ORDER BY m.position",
    [S_CALL_SELECT] =
        "SELECT c.message_id, c.call_id, c.name, c.arguments, c.text_offset "
        "FROM messages m JOIN tool_calls c ON c.message_id = m.id "
        "WHERE m.conversation_id = ?1 ORDER BY m.position, c.position",
    [S_USAGE_SELECT] =
        "SELECT run_id, model, iteration, prompt_tokens, completion_tokens, "
        "cached_tokens, reasoning_tokens, total_tokens, cost, "
        "cache_write_tokens, cost_micros, agent FROM usage "
        "WHERE conversation_id = ?1 ORDER BY id",
    [S_CONV_SUMMARY] =
        "SELECT summary, summary_covers, plan FROM conversations "
        "WHERE id = ?1",
    [S_RECORD_INSERT] =
        "INSERT INTO tool_records (conversation_id, run_id, position, tool, "
        "call_id, status, duration_ms, record, created_at) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    [S_RECORD_SELECT] = "SELECT run_id, record FROM tool_records "
                        "WHERE conversation_id = ?1 ORDER BY id",
    [S_BLOB_INSERT] = "INSERT OR IGNORE INTO blobs (hash, mime, bytes, data) "
                      "VALUES (?1, ?2, ?3, ?4)",
    [S_BLOB_LINK] = "INSERT OR IGNORE INTO message_blobs (message_id, hash) "
                    "VALUES (?1, ?2)",
    [S_BLOB_SELECT] = "SELECT data FROM blobs WHERE hash = ?1",
    [S_CONV_HASHES] = "SELECT message_count, prefix_hash, "
                      "prefix_hash_streamed FROM conversations WHERE id = ?1",
    /* Two indexed lookups (conversations_by_prefix and _streamed). */
    [S_CONV_MATCH] = "SELECT id, updated_at FROM conversations "
                     "WHERE user_id IS ?1 AND prefix_hash = ?2 "
                     "UNION ALL SELECT id, updated_at FROM conversations "
                     "WHERE user_id IS ?1 AND prefix_hash_streamed = ?2 "
                     "ORDER BY 2 DESC, 1 DESC LIMIT 1",
    [S_RUN_INSERT] =
        "INSERT OR REPLACE INTO runs (id, conversation_id, parent_run_id, "
        "parent_call_id, depth, user_id, agent, model, status, error, "
        "finish_reason, prompt_tokens, completion_tokens, cached_tokens, "
        "reasoning_tokens, total_tokens, cache_write_tokens, cost_micros, "
        "created_at, ended_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, "
        "?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)",
    [S_RUN_MSG_INSERT] =
        "INSERT INTO run_messages (run_id, position, role, content, "
        "reasoning, agent, tool_calls, tool_call_id, name, tool_status, "
        "duration_ms, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, "
        "?9, ?10, ?11, ?12)",
    [S_RUN_SELECT] = "SELECT " RUN_COLS ", user_id FROM runs WHERE id = ?1",
    [S_RUN_CHILDREN] = "SELECT " RUN_COLS " FROM runs "
                       "WHERE parent_run_id = ?1 ORDER BY created_at, id",
    [S_RUN_MSG_SELECT] =
        "SELECT role, content, reasoning, agent, tool_calls, tool_call_id, "
        "name, tool_status, duration_ms, created_at FROM run_messages "
        "WHERE run_id = ?1 ORDER BY position",
    /* One write of the writer's batch (sqlite_writer.c). */
    [S_SAVEPOINT] = "SAVEPOINT write",
    [S_RELEASE] = "RELEASE write",
    [S_ROLLBACK_TO] = "ROLLBACK TO write",
    /* Sealed rows (sqlite_secrets.c); user settings are read per run. */
    [S_SEALED_GET] = "SELECT sealed FROM mcp_credentials "
                     "WHERE server = ?1 AND user_id = ?2",
    [S_SETTINGS_GET] = "SELECT sealed FROM user_settings WHERE user_id = ?1",
    /* Accounts (sqlite_accounts.c): what a keyed request with limits
     * reads (the pepper and its key, its user's and workspace's limits,
     * a budget's spend once per period) and writes (its spend). */
    [S_PEPPER_GET] = "SELECT value FROM auth_secrets WHERE name = 'key_pepper'",
    [S_KEY_GET] = "SELECT " KEY_COLS " FROM api_keys WHERE id = ?1",
    [S_USER_LIMITS] =
        "SELECT " LIMIT_COLS " FROM users WHERE workspace = ?1 AND name = ?2",
    [S_WORKSPACE_LIMITS] =
        "SELECT " LIMIT_COLS " FROM workspaces WHERE id = ?1",
    [S_SPEND_GET] = "SELECT spent_micros FROM budget_spend "
                    "WHERE scope = ?1 AND period = ?2 AND period_start = ?3",
    [S_SPEND_ADD] =
        "INSERT INTO budget_spend (scope, period, period_start, spent_micros, "
        "updated_at) VALUES (?1, ?2, ?3, ?4, ?5) "
        "ON CONFLICT (scope, period, period_start) DO UPDATE SET "
        "spent_micros = spent_micros + excluded.spent_micros, "
        "updated_at = excluded.updated_at",
};

/* ---- errors ----------------------------------------------------------- */

static int map_rc(int rc)
{
    switch (rc & 0xFF) {
    case SQLITE_NOMEM:
        return LOOM_ENOMEM;
    case SQLITE_TOOBIG:
        return LOOM_ETOOLARGE;
    case SQLITE_FULL:
    case SQLITE_IOERR:
    case SQLITE_CANTOPEN:
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
    case SQLITE_READONLY:
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_PROTOCOL:
    case SQLITE_PERM:
    case SQLITE_NOLFS:
    case SQLITE_AUTH:
        return LOOM_EIO;
    default:
        return LOOM_ERROR;
    }
}

int loom__sqlite_error(loom__sqlite_store *st, sqlite3 *db, int rc,
                       const char *what)
{
    const char *msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);

    if (rc == SQLITE_OK || rc == SQLITE_ROW || rc == SQLITE_DONE)
        rc = SQLITE_ERROR; /* an unexpected row or end */
    if ((rc & 0xFF) == SQLITE_FULL)
        return loom__error_set(LOOM_EIO, "store %s: %s: disk full (%s)",
                               st->path, what, msg);
    return loom__error_set(map_rc(rc), "store %s: %s: %s", st->path, what, msg);
}

int loom__sqlite_not_found(const char *id)
{
    return loom__error_set(LOOM_ENOTFOUND, "conversation '%s' not found", id);
}

/* ---- connections ------------------------------------------------------ */

static void conn_close(loom__sqlite_conn *c)
{
    if (!c)
        return;
    for (int i = 0; i < S_COUNT; i++)
        sqlite3_finalize(c->stmts[i]);
    sqlite3_close(c->db);
    free(c);
}

/* The cached statement id of c, prepared on first use; an SQLite code. */
int loom__sqlite_stmt(loom__sqlite_conn *c, int id, sqlite3_stmt **out)
{
    int rc;

    if (!c->stmts[id]) {
        rc = sqlite3_prepare_v3(c->db, sql_text[id], -1,
                                SQLITE_PREPARE_PERSISTENT, &c->stmts[id], NULL);
        if (rc != SQLITE_OK) {
            c->stmts[id] = NULL;
            *out = NULL;
            return rc;
        }
    }
    *out = c->stmts[id];
    return SQLITE_OK;
}

/* The cached statement id of c, prepared on first use. */
int loom__sqlite_use(loom__sqlite_store *st, loom__sqlite_conn *c, int id,
                     sqlite3_stmt **out)
{
    int rc = loom__sqlite_stmt(c, id, out);

    return rc == SQLITE_OK
               ? 0
               : loom__sqlite_error(st, c->db, rc, "preparing a statement");
}

/* Runs a cached statement that returns no rows; an SQLite code. */
int loom__sqlite_run(loom__sqlite_conn *c, int id)
{
    sqlite3_stmt *s;
    int rc = loom__sqlite_stmt(c, id, &s);

    if (rc != SQLITE_OK)
        return rc;
    rc = sqlite3_step(s);
    sqlite3_reset(s);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static int conn_open(loom__sqlite_store *st, loom__sqlite_conn **out)
{
    loom__sqlite_conn *c = calloc(1, sizeof(*c));
    int rc;

    *out = NULL;
    if (!c)
        return loom__error_oom();
    if (loom__sqlite_walvfs() != SQLITE_OK) {
        conn_close(c);
        return loom__error_set(LOOM_EIO,
                               "store %s: cannot set up SQLite's "
                               "file layer",
                               st->path);
    }
    rc = sqlite3_open_v2(st->path, &c->db,
                         SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                             SQLITE_OPEN_NOMUTEX,
                         LOOM_SQLITE_VFS);
    if (rc != SQLITE_OK) {
        rc = c->db ? loom__sqlite_error(st, c->db, rc, "cannot open")
                   : loom__error_oom();
        conn_close(c);
        return rc;
    }
    sqlite3_extended_result_codes(c->db, 1);
    sqlite3_busy_timeout(c->db, BUSY_TIMEOUT_MS);
    loom__sqlite_wal_setup(st, c->db);
    /* All per connection, not stored in the file. temp_store: the
     * statement and savepoint journals (every write of the writer's
     * batch has a savepoint) stay in memory instead of a temporary file
     * written at each first change of a page. */
    rc = sqlite3_exec(c->db,
                      "PRAGMA foreign_keys = ON; PRAGMA synchronous = NORMAL; "
                      "PRAGMA temp_store = MEMORY",
                      NULL, NULL, NULL);
    if (rc == SQLITE_OK && st->extra_sql)
        rc = sqlite3_exec(c->db, st->extra_sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        rc = loom__sqlite_error(st, c->db, rc, "setting up a connection");
        conn_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

/* Takes an idle connection, opens one, or waits for one. */
int loom__sqlite_acquire(loom__sqlite_store *st, loom__sqlite_conn **out)
{
    loom__sqlite_conn *c;
    int rc;

    pthread_mutex_lock(&st->lock);
    while (!st->idle && st->nconns >= MAX_CONNS)
        loom__cond_wait(&st->available, &st->lock, -1);
    if (st->idle) {
        c = st->idle;
        st->idle = c->next;
        pthread_mutex_unlock(&st->lock);
        c->next = NULL;
        *out = c;
        return 0;
    }
    st->nconns++;
    pthread_mutex_unlock(&st->lock);
    if ((rc = conn_open(st, out)) != 0) {
        pthread_mutex_lock(&st->lock);
        st->nconns--;
        loom__cond_signal(&st->available);
        pthread_mutex_unlock(&st->lock);
    }
    return rc;
}

/* Gives c back, with no statement running and no transaction open. */
void loom__sqlite_reset(loom__sqlite_conn *c)
{
    for (int i = 0; i < S_COUNT; i++)
        done(c->stmts[i]);
    if (!sqlite3_get_autocommit(c->db))
        loom__sqlite_run(c, S_ROLLBACK);
}

void loom__sqlite_release(loom__sqlite_store *st, loom__sqlite_conn *c)
{
    if (!c)
        return;
    loom__sqlite_reset(c);
    pthread_mutex_lock(&st->lock);
    c->next = st->idle;
    st->idle = c;
    loom__cond_signal(&st->available);
    pthread_mutex_unlock(&st->lock);
}

/* ---- opening, migrations -------------------------------------------- */

/* Creates the folders above path (mkdir -p of its dirname). */
static int make_parents(const char *path)
{
    char *dir = strdup(path);
    int rc = 0;

    if (!dir)
        return loom__error_oom();
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            rc = loom__error_set(LOOM_EIO, "store %s: cannot create %s: %s",
                                 path, dir, strerror(errno));
            break;
        }
        *p = '/';
    }
    free(dir);
    return rc;
}

static int read_version(loom__sqlite_store *st, loom__sqlite_conn *c, int *v)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c->db, "PRAGMA user_version", -1, &s, NULL);

    if (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        *v = sqlite3_column_int(s, 0);
        rc = SQLITE_OK;
    }
    if (rc != SQLITE_OK)
        rc = loom__sqlite_error(st, c->db, rc, "reading the schema version");
    sqlite3_finalize(s);
    return rc;
}

static int too_new(loom__sqlite_store *st, int v)
{
    return loom__error_set(LOOM_EINVALID,
                           "store %s: database schema version %d is newer "
                           "than this loom (%d)",
                           st->path, v, loom__sqlite_migrations_len);
}

/*
 * After a step that edits sqlite_schema by hand (writable_schema), bumps
 * the schema cookie, so that every other connection to the file reads
 * the schema again before its next statement (SQLite's documented
 * procedure; DDL bumps it by itself). An SQLite code.
 */
static int bump_cookie(sqlite3 *db, const char *step)
{
    char sql[64];
    sqlite3_stmt *s = NULL;
    int rc, cookie = 0;

    if (!strstr(step, "writable_schema"))
        return SQLITE_OK;
    rc = sqlite3_prepare_v2(db, "PRAGMA schema_version", -1, &s, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        cookie = sqlite3_column_int(s, 0);
        rc = SQLITE_OK;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_OK)
        return rc;
    snprintf(sql, sizeof(sql), "PRAGMA schema_version = %d", cookie + 1);
    return sqlite3_exec(db, sql, NULL, NULL, NULL);
}

/* Applies migrations up to target, one transaction per step. */
static int migrate(loom__sqlite_store *st, loom__sqlite_conn *c, int target)
{
    char bump[64];
    int v = 0, rc;

    if ((rc = read_version(st, c, &v)) != 0)
        return rc;
    if (v > loom__sqlite_migrations_len)
        return too_new(st, v);
    while (v < target) {
        rc = sqlite3_exec(c->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
        if (rc != SQLITE_OK)
            return loom__sqlite_error(st, c->db, rc, "starting a migration");
        /* Another process may have migrated while this one waited. */
        if ((rc = read_version(st, c, &v)) != 0)
            goto rollback;
        if (v > loom__sqlite_migrations_len) {
            rc = too_new(st, v);
            goto rollback;
        }
        if (v < target) {
            snprintf(bump, sizeof(bump), "PRAGMA user_version = %d", v + 1);
            if ((rc = sqlite3_exec(c->db, loom__sqlite_migrations[v], NULL,
                                   NULL, NULL)) != SQLITE_OK ||
                (rc = bump_cookie(c->db, loom__sqlite_migrations[v])) !=
                    SQLITE_OK ||
                (rc = sqlite3_exec(c->db, bump, NULL, NULL, NULL)) !=
                    SQLITE_OK) {
                snprintf(bump, sizeof(bump), "migrating to schema version %d",
                         v + 1);
                rc = loom__sqlite_error(st, c->db, rc, bump);
                goto rollback;
            }
            v++;
        }
        rc = sqlite3_exec(c->db, "COMMIT", NULL, NULL, NULL);
        if (rc != SQLITE_OK) {
            rc = loom__sqlite_error(st, c->db, rc, "committing a migration");
            goto rollback;
        }
    }
    st->version = v;
    return 0;
rollback:
    if (!sqlite3_get_autocommit(c->db))
        sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
    return rc;
}

/* Turns WAL on (it is stored in the file) and checks it took. */
static int set_wal(loom__sqlite_store *st, loom__sqlite_conn *c)
{
    sqlite3_stmt *s = NULL;
    const char *mode;
    int rc =
        sqlite3_prepare_v2(c->db, "PRAGMA journal_mode = WAL", -1, &s, NULL);

    if (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        mode = col_text(s, 0);
        rc = SQLITE_OK;
        if (!mode || strcmp(mode, "wal") != 0)
            rc = loom__error_set(LOOM_EIO,
                                 "store %s: cannot use WAL mode (journal "
                                 "mode stays '%s')",
                                 st->path, mode ? mode : "?");
    } else {
        rc = loom__sqlite_error(st, c->db, rc, "cannot open");
    }
    sqlite3_finalize(s);
    return rc;
}

static const loom__store_vtable sqlite_vtable;

static void sqlite_free(loom_store *base)
{
    loom__sqlite_store *st = (loom__sqlite_store *)base;

    loom__sqlite_writer_free(st);
    while (st->idle) {
        loom__sqlite_conn *c = st->idle;
        st->idle = c->next;
        conn_close(c);
    }
    pthread_mutex_destroy(&st->lock);
    loom__cond_destroy(&st->available);
    pthread_mutex_destroy(&st->write_lock);
    loom__sqlite_settings_cache_free(st);
    pthread_mutex_destroy(&st->settings_lock);
    free(st->extra_sql);
    free(st->path);
    free(st);
}

/* Before SQLite's first use in the process: no memory statistics, which
 * take a global mutex around every allocation SQLite makes (loom reads
 * none of them). Fails harmlessly (SQLITE_MISUSE) when the process had
 * already initialized SQLite. */
static void sqlite_configure(void)
{
    sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
}

static int sqlite_open(loom_store **out, const char *path, int target)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;

    loom__sqlite_store *st;
    loom__sqlite_conn *c = NULL;
    int rc;

    *out = NULL;
    if (strcmp(path, ":memory:") == 0)
        return loom__error_set(LOOM_EINVALID,
                               "store: ':memory:' is not supported (each "
                               "pooled connection would see its own "
                               "database); use a file path");
    if (!sqlite3_threadsafe())
        return loom__error_set(LOOM_ERROR,
                               "store: SQLite was built without threads");
    pthread_once(&once, sqlite_configure);
    if (!(st = calloc(1, sizeof(*st))))
        return loom__error_oom();
    st->base.vt = &sqlite_vtable;
    pthread_mutex_init(&st->lock, NULL);
    loom__cond_init(&st->available);
    pthread_mutex_init(&st->write_lock, NULL);
    pthread_mutex_init(&st->settings_lock, NULL);
    loom__sqlite_writer_init(st);
    if (!(st->path = strdup(path))) {
        rc = loom__error_oom();
        goto fail;
    }
    if ((rc = make_parents(path)) != 0 || (rc = conn_open(st, &c)) != 0)
        goto fail;
    st->nconns = 1;
    if ((rc = set_wal(st, c)) != 0 || (rc = migrate(st, c, target)) != 0)
        goto fail;
    loom__sqlite_release(st, c);
    c = NULL;
    if ((rc = loom__sqlite_writer_start(st)) != 0)
        goto fail;
    *out = &st->base;
    return 0;
fail:
    conn_close(c);
    sqlite_free(&st->base);
    return rc;
}

int loom__store_sqlite_open(loom_store **out, const char *path)
{
    return sqlite_open(out, path, loom__sqlite_migrations_len);
}

int loom__store_sqlite_open_version(loom_store **out, const char *path,
                                    int version)
{
    if (version < 0 || version > loom__sqlite_migrations_len)
        return loom__error_set(LOOM_EINVALID, "no schema version %d", version);
    return sqlite_open(out, path, version);
}

int loom__store_sqlite_exec_all(loom_store *base, const char *sql)
{
    loom__sqlite_store *st = (loom__sqlite_store *)base;
    int rc = 0, src;

    /* The writer's connection is out of the pool: the write lock keeps
     * its thread off it meanwhile. */
    pthread_mutex_lock(&st->write_lock);
    pthread_mutex_lock(&st->lock);
    free(st->extra_sql);
    if (!(st->extra_sql = strdup(sql)))
        rc = loom__error_oom();
    if (!rc && st->w.conn &&
        (src = sqlite3_exec(st->w.conn->db, sql, NULL, NULL, NULL)) !=
            SQLITE_OK)
        rc = loom__sqlite_error(st, st->w.conn->db, src, "running test SQL");
    for (loom__sqlite_conn *c = st->idle; c && !rc; c = c->next) {
        if ((src = sqlite3_exec(c->db, sql, NULL, NULL, NULL)) != SQLITE_OK)
            rc = loom__sqlite_error(st, c->db, src, "running test SQL");
    }
    pthread_mutex_unlock(&st->lock);
    pthread_mutex_unlock(&st->write_lock);
    return rc;
}

/* ---- the vtable --------------------------------------------------- */

static int sqlite_ping(loom_store *base)
{
    loom__sqlite_store *st = (loom__sqlite_store *)base;
    sqlite3_stmt *s = NULL;
    loom__sqlite_conn *c;
    int rc;

    if ((rc = loom__sqlite_acquire(st, &c)) != 0)
        return rc;
    if ((rc = loom__sqlite_use(st, c, S_PING, &s)) == 0) {
        int src = sqlite3_step(s);
        if (src != SQLITE_ROW)
            rc = loom__sqlite_error(st, c->db, src, "ping");
    }
    loom__sqlite_release(st, c);
    return rc;
}

static int sqlite_schema_version(loom_store *base)
{
    return ((loom__sqlite_store *)base)->version;
}

int loom__sqlite_begin_read(loom__sqlite_store *st, loom__sqlite_conn *c)
{
    int src = loom__sqlite_run(c, S_BEGIN);

    return src == SQLITE_OK
               ? 0
               : loom__sqlite_error(st, c->db, src, "starting a read");
}

/* ---- for the other files of the backend (sqlite_internal.h) --------- */

int loom__sqlite_begin(loom_store *base, int write, loom__sqlite_conn **out)
{
    loom__sqlite_store *st = (loom__sqlite_store *)base;
    int rc, src;

    *out = NULL;
    /* As in loom__sqlite_save_turn(): the write lock before a connection. */
    if (write)
        pthread_mutex_lock(&st->write_lock);
    if ((rc = loom__sqlite_acquire(st, out)) != 0) {
        if (write)
            pthread_mutex_unlock(&st->write_lock);
        return rc;
    }
    if ((src = loom__sqlite_run(*out, write ? S_BEGIN_WRITE : S_BEGIN)) !=
        SQLITE_OK) {
        rc = loom__sqlite_error(st, (*out)->db, src,
                                write ? "starting a write" : "starting a read");
        loom__sqlite_end(base, *out, write);
        *out = NULL;
    }
    return rc;
}

void loom__sqlite_end(loom_store *base, loom__sqlite_conn *c, int write)
{
    loom__sqlite_store *st = (loom__sqlite_store *)base;

    loom__sqlite_release(st, c);
    if (write)
        pthread_mutex_unlock(&st->write_lock);
}

int loom__sqlite_commit(loom_store *base, loom__sqlite_conn *c,
                        const char *what)
{
    int src = loom__sqlite_run(c, S_COMMIT);

    return src == SQLITE_OK ? 0
                            : loom__sqlite_error((loom__sqlite_store *)base,
                                                 c->db, src, what);
}

sqlite3 *loom__sqlite_db(loom__sqlite_conn *c)
{
    return c->db;
}

int loom__sqlite_fail(loom_store *base, loom__sqlite_conn *c, int rc,
                      const char *what)
{
    return loom__sqlite_error((loom__sqlite_store *)base, c ? c->db : NULL, rc,
                              what);
}

static const loom__store_vtable sqlite_vtable = {
    "sqlite",
    sqlite_free,
    sqlite_ping,
    sqlite_schema_version,
    loom__sqlite_conversation_create,
    loom__sqlite_conversation_info,
    loom__sqlite_conversation_list,
    loom__sqlite_conversation_get,
    loom__sqlite_conversation_delete,
    loom__sqlite_conversation_rename,
    loom__sqlite_load_history,
    loom__sqlite_conversation_summary,
    loom__sqlite_save_turn,
    loom__sqlite_memory_add,
    loom__sqlite_memory_search,
    loom__sqlite_memory_delete,
    loom__sqlite_memory_count,
    loom__sqlite_conversation_match,
    loom__sqlite_run_get,
    loom__sqlite_run_children,
    loom__sqlite_research_put,
    loom__sqlite_research_get,
    loom__sqlite_research_running,
    loom__sqlite_key_pepper,
    loom__sqlite_key_insert,
    loom__sqlite_key_get,
    loom__sqlite_key_revoke,
    loom__sqlite_key_set_limits,
    loom__sqlite_user_ensure,
    loom__sqlite_key_list,
    loom__sqlite_user_list,
    loom__sqlite_workspace_list,
    loom__sqlite_audit_list,
    loom__sqlite_account_limits,
    loom__sqlite_account_set_limits,
    loom__sqlite_audit_add,
    loom__sqlite_spend_get,
    loom__sqlite_spend_add,
    loom__sqlite_spend_list,
    loom__sqlite_mcp_credentials_get,
    loom__sqlite_mcp_credentials_put,
    loom__sqlite_user_settings_get,
    loom__sqlite_user_settings_put,
    loom__sqlite_usage,
    loom__sqlite_conversation_branch,
    loom__sqlite_mcp_credentials_delete,
    loom__sqlite_stats,
};
