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
 * Durability: synchronous=NORMAL. In WAL mode a committed transaction is
 * in the WAL before COMMIT returns, so it survives the process being
 * killed; only a power cut may lose the last commits, never corrupt the
 * file. Every write is one transaction (BEGIN IMMEDIATE ... COMMIT), rolled
 * back on any error. Errors name the file and SQLite's message; a full
 * disk or an I/O failure is LOOM_EIO. Users' memories live in
 * sqlite_memory.c, which borrows the pool through sqlite_internal.h.
 */
#include "core/error.h"
#include "core/utf8.h"
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

enum {
    S_BEGIN,
    S_BEGIN_WRITE,
    S_COMMIT,
    S_ROLLBACK,
    S_PING,
    S_CONV_INSERT,
    S_CONV_INFO,
    S_CONV_LIST,
    S_CONV_LIST_AFTER,
    S_CONV_DELETE,
    S_CONV_BASE,
    S_CONV_UPDATE,
    S_MSG_INSERT,
    S_CALL_INSERT,
    S_OUTPUT_INSERT,
    S_USAGE_INSERT,
    S_MSG_SELECT,
    S_CALL_SELECT,
    S_USAGE_SELECT,
    S_CONV_SUMMARY,
    S_RECORD_INSERT,
    S_RECORD_SELECT,
    S_COUNT
};

#define INFO_COLS                                                              \
    "id, title, agent, model, created_at, updated_at, message_count"

static const char *const sql_text[S_COUNT] = {
    [S_BEGIN] = "BEGIN",
    [S_BEGIN_WRITE] = "BEGIN IMMEDIATE",
    [S_COMMIT] = "COMMIT",
    [S_ROLLBACK] = "ROLLBACK",
    [S_PING] = "SELECT 1",
    [S_CONV_INSERT] = "INSERT INTO conversations (id, title, created_at, "
                      "updated_at, message_count) VALUES (?1, '', ?2, ?2, 0)",
    [S_CONV_INFO] = "SELECT " INFO_COLS " FROM conversations WHERE id = ?1",
    [S_CONV_LIST] = "SELECT " INFO_COLS " FROM conversations "
                    "ORDER BY updated_at DESC, id DESC LIMIT ?1",
    [S_CONV_LIST_AFTER] = "SELECT " INFO_COLS " FROM conversations "
                          "WHERE (updated_at, id) < (?1, ?2) "
                          "ORDER BY updated_at DESC, id DESC LIMIT ?3",
    [S_CONV_DELETE] = "DELETE FROM conversations WHERE id = ?1",
    [S_CONV_BASE] = "SELECT message_count FROM conversations WHERE id = ?1",
    [S_CONV_UPDATE] =
        "UPDATE conversations SET updated_at = MAX(updated_at, ?2), "
        "message_count = message_count + ?3, agent = ?4, model = ?5, "
        "title = CASE WHEN title = '' AND ?6 IS NOT NULL THEN ?6 "
        "ELSE title END, "
        "summary = CASE WHEN ?7 IS NULL THEN summary ELSE ?7 END, "
        "summary_covers = CASE WHEN ?7 IS NULL THEN summary_covers "
        "ELSE ?8 END, plan = CASE WHEN ?9 IS NULL THEN plan ELSE ?9 END "
        "WHERE id = ?1",
    [S_MSG_INSERT] =
        "INSERT INTO messages (id, conversation_id, position, run_id, role, "
        "content, reasoning, model, finish_reason, status, error, "
        "prompt_tokens, completion_tokens, cost, tool_call_id, name, "
        "placeholder, created_at, provider_state, cost_micros, citations) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, "
        "?15, ?16, ?17, ?18, ?19, ?20, ?21)",
    [S_CALL_INSERT] = "INSERT INTO tool_calls (message_id, position, "
                      "call_id, name, arguments, text_offset) "
                      "VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    [S_OUTPUT_INSERT] = "INSERT INTO tool_outputs (message_id, call_id, "
                        "status, duration_ms) VALUES (?1, ?2, ?3, ?4)",
    [S_USAGE_INSERT] =
        "INSERT INTO usage (conversation_id, run_id, model, iteration, "
        "prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens, "
        "total_tokens, cost, created_at, cache_write_tokens, cost_micros) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    [S_MSG_SELECT] =
        "SELECT m.id, m.role, m.content, m.reasoning, m.model, "
        "m.finish_reason, m.status, m.error, m.prompt_tokens, "
        "m.completion_tokens, m.cost, m.created_at, m.run_id, "
        "m.tool_call_id, m.name, m.placeholder, o.status, o.duration_ms, "
        "m.provider_state, m.cost_micros, m.citations "
        "FROM messages m LEFT JOIN tool_outputs o ON o.message_id = m.id "
        "WHERE m.conversation_id = ?1 ORDER BY m.position",
    [S_CALL_SELECT] =
        "SELECT c.message_id, c.call_id, c.name, c.arguments, c.text_offset "
        "FROM messages m JOIN tool_calls c ON c.message_id = m.id "
        "WHERE m.conversation_id = ?1 ORDER BY m.position, c.position",
    [S_USAGE_SELECT] =
        "SELECT run_id, model, iteration, prompt_tokens, completion_tokens, "
        "cached_tokens, reasoning_tokens, total_tokens, cost, "
        "cache_write_tokens, cost_micros FROM usage "
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
};

/* Columns of S_MSG_SELECT. */
enum {
    M_ID,
    M_ROLE,
    M_CONTENT,
    M_REASONING,
    M_MODEL,
    M_FINISH,
    M_STATUS,
    M_ERROR,
    M_PROMPT,
    M_COMPLETION,
    M_COST,
    M_CREATED,
    M_RUN,
    M_CALL_ID,
    M_NAME,
    M_PLACEHOLDER,
    M_TOOL_STATUS,
    M_DURATION,
    M_PROVIDER_STATE,
    M_COST_MICROS,
    M_CITATIONS
};

typedef struct loom__sqlite_conn {
    sqlite3 *db;
    sqlite3_stmt *stmts[S_COUNT]; /* prepared on first use */
    struct loom__sqlite_conn *next; /* in the idle list */
} conn;

typedef struct {
    loom_store base;
    char *path;
    int version;
    pthread_mutex_t lock; /* guards idle, nconns and extra_sql */
    pthread_cond_t available;
    conn *idle;
    int nconns;
    pthread_mutex_t write_lock; /* one writer at a time, in process */
    char *extra_sql;            /* test hook: run on each new connection */
} sqlite_store;

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

/* Records SQLite's error rc (message from db when there is one). */
static int fail(sqlite_store *st, sqlite3 *db, int rc, const char *what)
{
    const char *msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);

    if (rc == SQLITE_OK || rc == SQLITE_ROW || rc == SQLITE_DONE)
        rc = SQLITE_ERROR; /* an unexpected row or end */
    if ((rc & 0xFF) == SQLITE_FULL)
        return loom__error_set(LOOM_EIO, "store %s: %s: disk full (%s)",
                               st->path, what, msg);
    return loom__error_set(map_rc(rc), "store %s: %s: %s", st->path, what, msg);
}

static int not_found(const char *id)
{
    return loom__error_set(LOOM_ENOTFOUND, "conversation '%s' not found", id);
}

/* ---- connections ------------------------------------------------------ */

static void conn_close(conn *c)
{
    if (!c)
        return;
    for (int i = 0; i < S_COUNT; i++)
        sqlite3_finalize(c->stmts[i]);
    sqlite3_close(c->db);
    free(c);
}

/* The cached statement id of c, prepared on first use. */
static int use(sqlite_store *st, conn *c, int id, sqlite3_stmt **out)
{
    int rc;

    if (!c->stmts[id]) {
        rc = sqlite3_prepare_v3(c->db, sql_text[id], -1,
                                SQLITE_PREPARE_PERSISTENT, &c->stmts[id], NULL);
        if (rc != SQLITE_OK) {
            c->stmts[id] = NULL;
            return fail(st, c->db, rc, "preparing a statement");
        }
    }
    *out = c->stmts[id];
    return 0;
}

/* Resets a statement so it holds no snapshot and no borrowed strings. */
static void done(sqlite3_stmt *s)
{
    if (s) {
        sqlite3_reset(s);
        sqlite3_clear_bindings(s);
    }
}

/* Runs a cached statement that returns no rows; an SQLite code. */
static int run(conn *c, int id)
{
    sqlite3_stmt *s = c->stmts[id];
    int rc;

    if (!s) {
        rc = sqlite3_prepare_v3(c->db, sql_text[id], -1,
                                SQLITE_PREPARE_PERSISTENT, &c->stmts[id], NULL);
        if (rc != SQLITE_OK)
            return rc;
        s = c->stmts[id];
    }
    rc = sqlite3_step(s);
    sqlite3_reset(s);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static int conn_open(sqlite_store *st, conn **out)
{
    conn *c = calloc(1, sizeof(*c));
    int rc;

    *out = NULL;
    if (!c)
        return loom__error_oom();
    rc = sqlite3_open_v2(
        st->path, &c->db,
        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        rc = c->db ? fail(st, c->db, rc, "cannot open") : loom__error_oom();
        conn_close(c);
        return rc;
    }
    sqlite3_extended_result_codes(c->db, 1);
    sqlite3_busy_timeout(c->db, BUSY_TIMEOUT_MS);
    /* Both are per connection, not stored in the file. */
    rc = sqlite3_exec(c->db,
                      "PRAGMA foreign_keys = ON; PRAGMA synchronous = NORMAL",
                      NULL, NULL, NULL);
    if (rc == SQLITE_OK && st->extra_sql)
        rc = sqlite3_exec(c->db, st->extra_sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        rc = fail(st, c->db, rc, "setting up a connection");
        conn_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

/* Takes an idle connection, opens one, or waits for one. */
static int acquire(sqlite_store *st, conn **out)
{
    conn *c;
    int rc;

    pthread_mutex_lock(&st->lock);
    while (!st->idle && st->nconns >= MAX_CONNS)
        pthread_cond_wait(&st->available, &st->lock);
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
        pthread_cond_signal(&st->available);
        pthread_mutex_unlock(&st->lock);
    }
    return rc;
}

/* Gives c back, with no statement running and no transaction open. */
static void release(sqlite_store *st, conn *c)
{
    if (!c)
        return;
    for (int i = 0; i < S_COUNT; i++)
        done(c->stmts[i]);
    if (!sqlite3_get_autocommit(c->db))
        run(c, S_ROLLBACK);
    pthread_mutex_lock(&st->lock);
    c->next = st->idle;
    st->idle = c;
    pthread_cond_signal(&st->available);
    pthread_mutex_unlock(&st->lock);
}

/* ---- binding and reading ------------------------------------------- */

/* Binders that do nothing once *rc holds an error. */
static void b_text(sqlite3_stmt *s, int i, const char *v, int *rc)
{
    if (*rc == SQLITE_OK)
        *rc = v ? sqlite3_bind_text64(s, i, v, strlen(v), SQLITE_STATIC,
                                      SQLITE_UTF8)
                : sqlite3_bind_null(s, i);
}

/* Binds len bytes of v (NULL when v is). */
static void b_textn(sqlite3_stmt *s, int i, const char *v, size_t len, int *rc)
{
    if (*rc == SQLITE_OK)
        *rc = v ? sqlite3_bind_text64(s, i, v, len, SQLITE_STATIC, SQLITE_UTF8)
                : sqlite3_bind_null(s, i);
}

static void b_int(sqlite3_stmt *s, int i, int64_t v, int *rc)
{
    if (*rc == SQLITE_OK)
        *rc = sqlite3_bind_int64(s, i, v);
}

/* Binds v, or NULL when v is negative (unknown). */
static void b_real(sqlite3_stmt *s, int i, double v, int *rc)
{
    if (*rc == SQLITE_OK)
        *rc = v >= 0 ? sqlite3_bind_double(s, i, v) : sqlite3_bind_null(s, i);
}

/* Binds micro-dollars, or NULL when v is negative (unknown). */
static void b_micros(sqlite3_stmt *s, int i, int64_t v, int *rc)
{
    if (*rc == SQLITE_OK)
        *rc = v >= 0 ? sqlite3_bind_int64(s, i, v) : sqlite3_bind_null(s, i);
}

/* Steps s once: SQLITE_DONE becomes SQLITE_OK; anything else stays. */
static int step_done(sqlite3_stmt *s, int rc)
{
    if (rc != SQLITE_OK)
        return rc;
    rc = sqlite3_step(s);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static const char *col_text(sqlite3_stmt *s, int i)
{
    return (const char *)sqlite3_column_text(s, i);
}

/* A copy of column i, NULL when SQL NULL; *bad set when out of memory. */
static char *col_dup(sqlite3_stmt *s, int i, int *bad)
{
    const char *v = col_text(s, i);
    char *d;

    if (!v)
        return NULL;
    if (!(d = strdup(v)))
        *bad = 1;
    return d;
}

/* Column i as JSON, by its stored type. NULL when out of memory. */
static json_t *col_json(sqlite3_stmt *s, int i)
{
    switch (sqlite3_column_type(s, i)) {
    case SQLITE_INTEGER:
        return json_integer((json_int_t)sqlite3_column_int64(s, i));
    case SQLITE_FLOAT:
        return json_real(sqlite3_column_double(s, i));
    case SQLITE_NULL:
        return json_null();
    default: {
        const char *v = col_text(s, i);
        return loom__json_text(v, (size_t)sqlite3_column_bytes(s, i));
    }
    }
}

static int put(json_t *o, const char *key, json_t *v)
{
    return v ? json_object_set_new(o, key, v) : -1;
}

/*
 * Column i, which holds JSON text the store wrote, parsed; NULL when the
 * column is NULL or does not parse (only a file changed from outside).
 */
static json_t *col_parsed(sqlite3_stmt *s, int i)
{
    const char *v = col_text(s, i);

    if (!v)
        return NULL;
    return json_loadb(v, (size_t)sqlite3_column_bytes(s, i), 0, NULL);
}

static int row_info(sqlite3_stmt *s, loom_conversation_info *out)
{
    int bad = 0;

    out->id = col_dup(s, 0, &bad);
    out->title = col_dup(s, 1, &bad);
    out->agent = col_dup(s, 2, &bad);
    out->model = col_dup(s, 3, &bad);
    out->created_at = sqlite3_column_int64(s, 4);
    out->updated_at = sqlite3_column_int64(s, 5);
    out->message_count = sqlite3_column_int64(s, 6);
    if (bad || !out->id || !out->title) {
        loom_conversation_info_clear(out);
        return loom__error_oom();
    }
    return 0;
}

static loom_role role_of(const char *name)
{
    if (!name)
        return LOOM_ROLE_USER;
    if (strcmp(name, "system") == 0)
        return LOOM_ROLE_SYSTEM;
    if (strcmp(name, "assistant") == 0)
        return LOOM_ROLE_ASSISTANT;
    if (strcmp(name, "tool") == 0)
        return LOOM_ROLE_TOOL;
    return LOOM_ROLE_USER;
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

static int read_version(sqlite_store *st, conn *c, int *v)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c->db, "PRAGMA user_version", -1, &s, NULL);

    if (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        *v = sqlite3_column_int(s, 0);
        rc = SQLITE_OK;
    }
    if (rc != SQLITE_OK)
        rc = fail(st, c->db, rc, "reading the schema version");
    sqlite3_finalize(s);
    return rc;
}

static int too_new(sqlite_store *st, int v)
{
    return loom__error_set(LOOM_EINVALID,
                           "store %s: database schema version %d is newer "
                           "than this loom (%d)",
                           st->path, v, loom__sqlite_migrations_len);
}

/* Applies migrations up to target, one transaction per step. */
static int migrate(sqlite_store *st, conn *c, int target)
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
            return fail(st, c->db, rc, "starting a migration");
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
                (rc = sqlite3_exec(c->db, bump, NULL, NULL, NULL)) !=
                    SQLITE_OK) {
                snprintf(bump, sizeof(bump), "migrating to schema version %d",
                         v + 1);
                rc = fail(st, c->db, rc, bump);
                goto rollback;
            }
            v++;
        }
        rc = sqlite3_exec(c->db, "COMMIT", NULL, NULL, NULL);
        if (rc != SQLITE_OK) {
            rc = fail(st, c->db, rc, "committing a migration");
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
static int set_wal(sqlite_store *st, conn *c)
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
        rc = fail(st, c->db, rc, "cannot open");
    }
    sqlite3_finalize(s);
    return rc;
}

static const loom__store_vtable sqlite_vtable;

static void sqlite_free(loom_store *base)
{
    sqlite_store *st = (sqlite_store *)base;

    while (st->idle) {
        conn *c = st->idle;
        st->idle = c->next;
        conn_close(c);
    }
    pthread_mutex_destroy(&st->lock);
    pthread_cond_destroy(&st->available);
    pthread_mutex_destroy(&st->write_lock);
    free(st->extra_sql);
    free(st->path);
    free(st);
}

static int sqlite_open(loom_store **out, const char *path, int target)
{
    sqlite_store *st;
    conn *c = NULL;
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
    if (!(st = calloc(1, sizeof(*st))))
        return loom__error_oom();
    st->base.vt = &sqlite_vtable;
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->available, NULL);
    pthread_mutex_init(&st->write_lock, NULL);
    if (!(st->path = strdup(path))) {
        rc = loom__error_oom();
        goto fail;
    }
    if ((rc = make_parents(path)) != 0 || (rc = conn_open(st, &c)) != 0)
        goto fail;
    st->nconns = 1;
    if ((rc = set_wal(st, c)) != 0 || (rc = migrate(st, c, target)) != 0)
        goto fail;
    release(st, c);
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
    sqlite_store *st = (sqlite_store *)base;
    int rc = 0;

    pthread_mutex_lock(&st->lock);
    free(st->extra_sql);
    if (!(st->extra_sql = strdup(sql)))
        rc = loom__error_oom();
    for (conn *c = st->idle; c && !rc; c = c->next) {
        int src = sqlite3_exec(c->db, sql, NULL, NULL, NULL);
        if (src != SQLITE_OK)
            rc = fail(st, c->db, src, "running test SQL");
    }
    pthread_mutex_unlock(&st->lock);
    return rc;
}

/* ---- the vtable --------------------------------------------------- */

static int sqlite_ping(loom_store *base)
{
    sqlite_store *st = (sqlite_store *)base;
    sqlite3_stmt *s = NULL;
    conn *c;
    int rc;

    if ((rc = acquire(st, &c)) != 0)
        return rc;
    if ((rc = use(st, c, S_PING, &s)) == 0) {
        int src = sqlite3_step(s);
        if (src != SQLITE_ROW)
            rc = fail(st, c->db, src, "ping");
    }
    release(st, c);
    return rc;
}

static int sqlite_schema_version(loom_store *base)
{
    return ((sqlite_store *)base)->version;
}

static int sqlite_conversation_create(loom_store *base, const char *id,
                                      int64_t now)
{
    sqlite_store *st = (sqlite_store *)base;
    sqlite3_stmt *s = NULL;
    conn *c = NULL;
    int rc, src = SQLITE_OK;

    pthread_mutex_lock(&st->write_lock);
    if ((rc = acquire(st, &c)) != 0 || (rc = use(st, c, S_CONV_INSERT, &s)))
        goto cleanup;
    b_text(s, 1, id, &src);
    b_int(s, 2, now, &src);
    if ((src = step_done(s, src)) != SQLITE_OK)
        rc = fail(st, c->db, src, "creating a conversation");
cleanup:
    release(st, c);
    pthread_mutex_unlock(&st->write_lock);
    return rc;
}

/* Reads conversation id's info on c (inside the caller's transaction). */
static int info_on(sqlite_store *st, conn *c, const char *id,
                   loom_conversation_info *out)
{
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK;

    if ((rc = use(st, c, S_CONV_INFO, &s)) != 0)
        return rc;
    b_text(s, 1, id, &src);
    if (src == SQLITE_OK)
        src = sqlite3_step(s);
    if (src == SQLITE_ROW)
        rc = row_info(s, out);
    else if (src == SQLITE_DONE)
        rc = not_found(id);
    else
        rc = fail(st, c->db, src, "reading a conversation");
    done(s);
    return rc;
}

static int sqlite_conversation_info(loom_store *base, const char *id,
                                    loom_conversation_info *out)
{
    sqlite_store *st = (sqlite_store *)base;
    conn *c;
    int rc;

    if ((rc = acquire(st, &c)) != 0)
        return rc;
    rc = info_on(st, c, id, out);
    release(st, c);
    return rc;
}

static int begin_read(sqlite_store *st, conn *c)
{
    int src = run(c, S_BEGIN);

    return src == SQLITE_OK ? 0 : fail(st, c->db, src, "starting a read");
}

static int commit(sqlite_store *st, conn *c, const char *what)
{
    int src = run(c, S_COMMIT);

    return src == SQLITE_OK ? 0 : fail(st, c->db, src, what);
}

static int sqlite_conversation_list(loom_store *base, const char *after,
                                    int limit, json_t **out)
{
    sqlite_store *st = (sqlite_store *)base;
    loom_conversation_info info = {0};
    json_t *res = NULL, *data = NULL, *next = NULL;
    sqlite3_stmt *s = NULL;
    conn *c;
    int rc, src = SQLITE_OK, n = 0, more = 0;

    if ((rc = acquire(st, &c)) != 0)
        return rc;
    if ((rc = begin_read(st, c)) != 0)
        goto cleanup;
    if (after) {
        if ((rc = info_on(st, c, after, &info)) != 0 ||
            (rc = use(st, c, S_CONV_LIST_AFTER, &s)) != 0)
            goto cleanup;
        b_int(s, 1, info.updated_at, &src);
        b_text(s, 2, after, &src);
        b_int(s, 3, limit + 1, &src);
        loom_conversation_info_clear(&info);
    } else {
        if ((rc = use(st, c, S_CONV_LIST, &s)) != 0)
            goto cleanup;
        b_int(s, 1, limit + 1, &src);
    }
    if (!(data = json_array())) {
        rc = loom__error_oom();
        goto cleanup;
    }
    while (src == SQLITE_OK && (src = sqlite3_step(s)) == SQLITE_ROW) {
        src = SQLITE_OK;
        if (n == limit) {
            more = 1;
            break;
        }
        if ((rc = row_info(s, &info)) != 0)
            goto cleanup;
        json_decref(next);
        next = loom__json_text(info.id, strlen(info.id));
        if (!next || json_array_append_new(data, loom__store_info_json(&info)))
            rc = loom__error_oom();
        loom_conversation_info_clear(&info);
        if (rc)
            goto cleanup;
        n++;
    }
    if (src != SQLITE_OK && src != SQLITE_DONE) {
        rc = fail(st, c->db, src, "listing conversations");
        goto cleanup;
    }
    if ((rc = commit(st, c, "listing conversations")) != 0)
        goto cleanup;
    if (!(res = json_object()) || put(res, "data", json_incref(data)) ||
        put(res, "has_more", json_boolean(more)) ||
        put(res, "next", more ? json_incref(next) : json_null())) {
        json_decref(res);
        res = NULL;
        rc = loom__error_oom();
    }
cleanup:
    loom_conversation_info_clear(&info);
    json_decref(data);
    json_decref(next);
    release(st, c);
    *out = res;
    return rc;
}

/* One tool call row of cs as the API shows it. */
static json_t *call_json(sqlite3_stmt *cs)
{
    json_t *o = json_object();

    if (!o || put(o, "id", col_json(cs, 1)) ||
        put(o, "name", col_json(cs, 2)) ||
        put(o, "arguments", col_json(cs, 3)) ||
        put(o, "text_offset", col_json(cs, 4))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Does the call row cs is on belong to message mid? */
static int call_of(sqlite3_stmt *cs, int crc, const char *mid)
{
    const char *cid;

    if (crc != SQLITE_ROW || !mid)
        return 0;
    cid = col_text(cs, 0);
    return cid && strcmp(cid, mid) == 0;
}

static const char *const msg_keys[] = {
    [M_ID] = "id",
    [M_ROLE] = "role",
    [M_CONTENT] = "content",
    [M_REASONING] = "reasoning",
    [M_MODEL] = "model",
    [M_FINISH] = "finish_reason",
    [M_STATUS] = "status",
    [M_ERROR] = "error",
    [M_PROMPT] = "prompt_tokens",
    [M_COMPLETION] = "completion_tokens",
    [M_COST] = "cost",
    [M_CREATED] = "created_at",
    [M_RUN] = "run_id",
};

/*
 * The message row ms is on as JSON, with its tool calls taken from cs
 * (which walks the same conversation in the same order; *crc is its last
 * step result and moves on). NULL when out of memory.
 */
static json_t *message_json(sqlite3_stmt *ms, sqlite3_stmt *cs, int *crc)
{
    const char *role = col_text(ms, M_ROLE), *mid = col_text(ms, M_ID);
    int assistant = role && strcmp(role, "assistant") == 0;
    json_t *m = json_object(), *calls;
    int bad = !m;

    for (int i = M_ID; !bad && i <= M_RUN; i++)
        bad = put(m, msg_keys[i], col_json(ms, i));
    if (!bad)
        bad = put(m, "cost_micros", col_json(ms, M_COST_MICROS));
    if (!bad && assistant) {
        json_t *cites = col_parsed(ms, M_CITATIONS);
        bad = put(m, "citations", cites ? cites : json_null());
    }
    if (!bad && (assistant || call_of(cs, *crc, mid))) {
        bad = !(calls = json_array()) ||
              json_object_set_new(m, "tool_calls", calls);
        while (!bad && call_of(cs, *crc, mid)) {
            bad = json_array_append_new(calls, call_json(cs));
            *crc = sqlite3_step(cs);
        }
    }
    if (!bad && role && strcmp(role, "tool") == 0)
        bad = put(m, "tool_call_id", col_json(ms, M_CALL_ID)) ||
              put(m, "name", col_json(ms, M_NAME)) ||
              put(m, "tool_status", col_json(ms, M_TOOL_STATUS)) ||
              put(m, "duration_ms", col_json(ms, M_DURATION));
    if (bad) {
        json_decref(m);
        return NULL;
    }
    return m;
}

static const char *const usage_keys[] = {
    "run_id",
    "model",
    "iteration",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "total_tokens",
    "cost",
    "cache_write_tokens",
    "cost_micros",
};

static json_t *usage_json(sqlite3_stmt *us)
{
    json_t *o = json_object();

    for (size_t i = 0; o && i < sizeof(usage_keys) / sizeof(usage_keys[0]); i++)
        if (put(o, usage_keys[i], col_json(us, i))) {
            json_decref(o);
            return NULL;
        }
    return o;
}

/* The conversation's summary row, left on s for the caller (who calls
 * done(s) after reading it). LOOM_ENOTFOUND when absent. */
static int summary_on(sqlite_store *st, conn *c, const char *id,
                      sqlite3_stmt **s)
{
    int rc, src = SQLITE_OK;

    if ((rc = use(st, c, S_CONV_SUMMARY, s)) != 0)
        return rc;
    b_text(*s, 1, id, &src);
    if (src == SQLITE_OK)
        src = sqlite3_step(*s);
    if (src == SQLITE_ROW)
        return 0;
    rc = src == SQLITE_DONE ? not_found(id)
                            : fail(st, c->db, src, "reading a summary");
    done(*s);
    return rc;
}

/* One tool record row as the API shows it: the record with its run id. */
static json_t *record_json(sqlite3_stmt *rs)
{
    json_t *r = col_parsed(rs, 1);

    if (r && !json_is_object(r)) {
        json_decref(r);
        r = NULL;
    }
    /* A record changed from outside into something else is shown so. */
    if (!r && (!(r = json_object()) ||
               json_object_set_new(r, "record_unreadable", json_true()))) {
        json_decref(r);
        return NULL;
    }
    if (put(r, "run_id", col_json(rs, 0))) {
        json_decref(r);
        return NULL;
    }
    return r;
}

/* Appends the conversation's tool records to arr. */
static int records_on(sqlite_store *st, conn *c, const char *id, json_t *arr)
{
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK;

    if ((rc = use(st, c, S_RECORD_SELECT, &s)) != 0)
        return rc;
    b_text(s, 1, id, &src);
    while (src == SQLITE_OK && (src = sqlite3_step(s)) == SQLITE_ROW) {
        src = SQLITE_OK;
        if (json_array_append_new(arr, record_json(s))) {
            done(s);
            return loom__error_oom();
        }
    }
    if (src != SQLITE_DONE)
        rc = fail(st, c->db, src, "reading tool records");
    done(s);
    return rc;
}

/* Binds id to the message and call walks and starts the call walk. */
static int start_walk(sqlite_store *st, conn *c, const char *id,
                      sqlite3_stmt **ms, sqlite3_stmt **cs, int *crc)
{
    int rc, src = SQLITE_OK;

    if ((rc = use(st, c, S_MSG_SELECT, ms)) != 0 ||
        (rc = use(st, c, S_CALL_SELECT, cs)) != 0)
        return rc;
    b_text(*ms, 1, id, &src);
    b_text(*cs, 1, id, &src);
    if (src != SQLITE_OK)
        return fail(st, c->db, src, "reading messages");
    *crc = sqlite3_step(*cs);
    return 0;
}

/* Checks how the two walks ended. */
static int end_walk(sqlite_store *st, conn *c, int mrc, int crc)
{
    if (mrc != SQLITE_DONE)
        return fail(st, c->db, mrc, "reading messages");
    if (crc != SQLITE_DONE && crc != SQLITE_ROW)
        return fail(st, c->db, crc, "reading tool calls");
    return 0;
}

static int sqlite_conversation_get(loom_store *base, const char *id,
                                   json_t **out)
{
    sqlite_store *st = (sqlite_store *)base;
    loom_conversation_info info = {0};
    json_t *res = NULL, *msgs = NULL, *usage = NULL, *records = NULL;
    sqlite3_stmt *ms = NULL, *cs = NULL, *us = NULL, *ss = NULL;
    int rc, mrc, crc, urc = SQLITE_OK;
    conn *c;

    if ((rc = acquire(st, &c)) != 0)
        return rc;
    if ((rc = begin_read(st, c)) != 0 || (rc = info_on(st, c, id, &info)))
        goto cleanup;
    if (!(res = loom__store_info_json(&info)) || !(msgs = json_array()) ||
        !(usage = json_array()) || !(records = json_array())) {
        rc = loom__error_oom();
        goto cleanup;
    }
    if ((rc = summary_on(st, c, id, &ss)) != 0)
        goto cleanup;
    rc = put(res, "summary", col_json(ss, 0)) ||
         put(res, "summary_covers",
             json_integer((json_int_t)sqlite3_column_int64(ss, 1))) ||
         put(res, "plan",
             col_text(ss, 2) ? col_parsed(ss, 2) : json_null());
    done(ss);
    if (rc) {
        rc = loom__error_oom();
        goto cleanup;
    }
    if ((rc = start_walk(st, c, id, &ms, &cs, &crc)) != 0)
        goto cleanup;
    while ((mrc = sqlite3_step(ms)) == SQLITE_ROW)
        if (json_array_append_new(msgs, message_json(ms, cs, &crc))) {
            rc = loom__error_oom();
            goto cleanup;
        }
    if ((rc = end_walk(st, c, mrc, crc)) != 0 ||
        (rc = use(st, c, S_USAGE_SELECT, &us)) != 0)
        goto cleanup;
    b_text(us, 1, id, &urc);
    while (urc == SQLITE_OK && (urc = sqlite3_step(us)) == SQLITE_ROW) {
        urc = SQLITE_OK;
        if (json_array_append_new(usage, usage_json(us))) {
            rc = loom__error_oom();
            goto cleanup;
        }
    }
    if (urc != SQLITE_DONE) {
        rc = fail(st, c->db, urc, "reading usage");
        goto cleanup;
    }
    if ((rc = records_on(st, c, id, records)) != 0 ||
        (rc = commit(st, c, "reading a conversation")) != 0)
        goto cleanup;
    if (json_object_set(res, "messages", msgs) ||
        json_object_set(res, "usage", usage) ||
        json_object_set(res, "tool_records", records))
        rc = loom__error_oom();
cleanup:
    loom_conversation_info_clear(&info);
    json_decref(msgs);
    json_decref(usage);
    json_decref(records);
    if (rc) {
        json_decref(res);
        res = NULL;
    }
    release(st, c);
    *out = res;
    return rc;
}

static int sqlite_conversation_delete(loom_store *base, const char *id)
{
    sqlite_store *st = (sqlite_store *)base;
    sqlite3_stmt *s = NULL;
    conn *c = NULL;
    int rc, src = SQLITE_OK;

    pthread_mutex_lock(&st->write_lock);
    if ((rc = acquire(st, &c)) != 0 || (rc = use(st, c, S_CONV_DELETE, &s)))
        goto cleanup;
    b_text(s, 1, id, &src);
    /* One statement: the cascade to messages, calls, outputs, usage and
     * tool records is part of it, so it is atomic without BEGIN. */
    if ((src = step_done(s, src)) != SQLITE_OK)
        rc = fail(st, c->db, src, "deleting a conversation");
    else if (sqlite3_changes(c->db) == 0)
        rc = not_found(id);
cleanup:
    release(st, c);
    pthread_mutex_unlock(&st->write_lock);
    return rc;
}

/* Appends *msg to m (taking its pointers) or leaves both as they were. */
static int push(loom_messages *m, loom_message *msg, size_t extra)
{
    if (m->len + extra > m->cap) {
        size_t cap = m->cap ? m->cap : 8;
        loom_message *p;
        while (cap < m->len + extra)
            cap *= 2;
        if (!(p = realloc(m->items, cap * sizeof(*p))))
            return loom__error_oom();
        m->items = p;
        m->cap = cap;
    }
    if (msg) {
        m->items[m->len++] = *msg;
        memset(msg, 0, sizeof(*msg));
    }
    return 0;
}

/* The message row ms is on, with its calls from cs, as a loom_message. */
static int row_message(sqlite3_stmt *ms, sqlite3_stmt *cs, int *crc,
                       loom_message *m)
{
    const char *mid = col_text(ms, M_ID);
    size_t cap = 0;
    int bad = 0;

    memset(m, 0, sizeof(*m));
    m->role = role_of(col_text(ms, M_ROLE));
    m->content = col_dup(ms, M_CONTENT, &bad);
    m->reasoning = col_dup(ms, M_REASONING, &bad);
    m->tool_call_id = col_dup(ms, M_CALL_ID, &bad);
    m->name = col_dup(ms, M_NAME, &bad);
    m->provider_state = col_dup(ms, M_PROVIDER_STATE, &bad);
    while (!bad && call_of(cs, *crc, mid)) {
        loom_tool_call *tc;
        if (m->tool_calls_len == cap) {
            cap = cap ? cap * 2 : 4;
            tc = realloc(m->tool_calls, cap * sizeof(*tc));
            if (!tc) {
                bad = 1;
                break;
            }
            m->tool_calls = tc;
        }
        tc = &m->tool_calls[m->tool_calls_len++];
        tc->id = col_dup(cs, 1, &bad);
        tc->name = col_dup(cs, 2, &bad);
        tc->arguments = col_dup(cs, 3, &bad);
        *crc = sqlite3_step(cs);
    }
    if (bad) {
        loom_message_clear(m);
        return loom__error_oom();
    }
    return 0;
}

static int exists_on(sqlite_store *st, conn *c, const char *id, int64_t *count)
{
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK;

    if ((rc = use(st, c, S_CONV_BASE, &s)) != 0)
        return rc;
    b_text(s, 1, id, &src);
    if (src == SQLITE_OK)
        src = sqlite3_step(s);
    if (src == SQLITE_ROW)
        *count = sqlite3_column_int64(s, 0);
    else if (src == SQLITE_DONE)
        rc = not_found(id);
    else
        rc = fail(st, c->db, src, "reading a conversation");
    done(s);
    return rc;
}

static int sqlite_conversation_summary(loom_store *base, const char *id,
                                       char **summary, size_t *covers,
                                       char **plan)
{
    sqlite_store *st = (sqlite_store *)base;
    sqlite3_stmt *s = NULL;
    const char *v;
    int64_t n;
    conn *c;
    int rc;

    if ((rc = acquire(st, &c)) != 0)
        return rc;
    if ((rc = summary_on(st, c, id, &s)) != 0)
        goto cleanup;
    if ((v = col_text(s, 0)) != NULL) {
        if (!(*summary = strdup(v)))
            rc = loom__error_oom();
        n = sqlite3_column_int64(s, 1);
        *covers = n > 0 ? (size_t)n : 0;
    }
    if (rc == 0 && plan && (v = col_text(s, 2)) != NULL &&
        !(*plan = strdup(v)))
        rc = loom__error_oom();
    done(s);
cleanup:
    release(st, c);
    return rc;
}

static int sqlite_load_history(loom_store *base, const char *id,
                               loom_messages *out)
{
    sqlite_store *st = (sqlite_store *)base;
    loom_messages got = {0};
    loom_message m;
    sqlite3_stmt *ms = NULL, *cs = NULL;
    int64_t count = 0;
    int rc, mrc, crc;
    conn *c;

    if ((rc = acquire(st, &c)) != 0)
        return rc;
    if ((rc = begin_read(st, c)) != 0 ||
        (rc = exists_on(st, c, id, &count)) != 0 ||
        (rc = start_walk(st, c, id, &ms, &cs, &crc)) != 0)
        goto cleanup;
    while ((mrc = sqlite3_step(ms)) == SQLITE_ROW) {
        if ((rc = row_message(ms, cs, &crc, &m)) != 0)
            goto cleanup;
        /* The stand-in for a turn with no answer is not history. */
        if (sqlite3_column_int(ms, M_PLACEHOLDER)) {
            loom_message_clear(&m);
            continue;
        }
        if ((rc = push(&got, &m, 1)) != 0) {
            loom_message_clear(&m);
            goto cleanup;
        }
    }
    if ((rc = end_walk(st, c, mrc, crc)) != 0 ||
        (rc = commit(st, c, "reading history")) != 0 ||
        (rc = push(out, NULL, got.len)) != 0)
        goto cleanup;
    memcpy(out->items + out->len, got.items, got.len * sizeof(*got.items));
    out->len += got.len;
    free(got.items);
    got.items = NULL;
    got.len = 0;
cleanup:
    loom_messages_free(&got);
    release(st, c);
    return rc;
}

/* Writes message i of the plan at position pos, its calls and outcome. */
static int insert_message(sqlite_store *st, conn *c, const loom__store_plan *p,
                          size_t i, int64_t pos)
{
    const loom__store_msg *m = &p->msgs[i];
    const loom_message *msg = m->msg;
    const loom_turn_record *t = p->turn;
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK;

    if ((rc = use(st, c, S_MSG_INSERT, &s)) != 0)
        return rc;
    b_text(s, 1, m->id, &src);
    b_text(s, 2, t->conversation_id, &src);
    b_int(s, 3, pos, &src);
    b_text(s, 4, t->run_id, &src);
    b_text(s, 5, loom_role_name(msg->role), &src);
    b_text(s, 6, msg->content, &src);
    b_text(s, 7, msg->reasoning, &src);
    b_text(s, 8, m->model, &src);
    b_text(s, 9, m->finish_reason, &src);
    b_text(s, 10, m->status, &src);
    b_text(s, 11, m->error, &src);
    if (m->has_tokens) {
        b_int(s, 12, m->prompt_tokens, &src);
        b_int(s, 13, m->completion_tokens, &src);
    }
    b_real(s, 14, m->cost, &src);
    b_text(s, 15, msg->tool_call_id, &src);
    b_text(s, 16, msg->name, &src);
    b_int(s, 17, m->placeholder, &src);
    b_int(s, 18, p->now, &src);
    b_text(s, 19, msg->provider_state, &src);
    b_micros(s, 20, m->cost_micros, &src);
    b_text(s, 21, m->citations, &src);
    if ((src = step_done(s, src)) != SQLITE_OK)
        goto failed;
    done(s);
    for (size_t k = 0; k < msg->tool_calls_len; k++) {
        const loom_tool_call *tc = &msg->tool_calls[k];
        if ((rc = use(st, c, S_CALL_INSERT, &s)) != 0)
            return rc;
        b_text(s, 1, m->id, &src);
        b_int(s, 2, (int64_t)k, &src);
        b_text(s, 3, tc->id ? tc->id : "", &src);
        b_text(s, 4, tc->name ? tc->name : "", &src);
        b_text(s, 5, tc->arguments ? tc->arguments : "{}", &src);
        b_int(s, 6, (int64_t)p->offsets[m->offsets_at + k], &src);
        if ((src = step_done(s, src)) != SQLITE_OK)
            goto failed;
        done(s);
    }
    if (msg->role == LOOM_ROLE_TOOL) {
        if ((rc = use(st, c, S_OUTPUT_INSERT, &s)) != 0)
            return rc;
        b_text(s, 1, m->id, &src);
        b_text(s, 2, msg->tool_call_id ? msg->tool_call_id : "", &src);
        b_text(s, 3, m->tool_status, &src);
        b_real(s, 4, m->duration_ms, &src);
        if ((src = step_done(s, src)) != SQLITE_OK)
            goto failed;
        done(s);
    }
    return 0;
failed:
    return fail(st, c->db, src, "saving a turn");
}

static int insert_usage(sqlite_store *st, conn *c, const loom__store_plan *p)
{
    const loom_turn_record *t = p->turn;
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK;

    for (size_t i = 0; i < t->usage_len; i++) {
        const loom_turn_usage *u = &t->usage[i];
        if ((rc = use(st, c, S_USAGE_INSERT, &s)) != 0)
            return rc;
        b_text(s, 1, t->conversation_id, &src);
        b_text(s, 2, t->run_id, &src);
        b_text(s, 3, u->model ? u->model : t->model, &src);
        b_int(s, 4, u->iteration, &src);
        b_int(s, 5, u->usage.prompt_tokens, &src);
        b_int(s, 6, u->usage.completion_tokens, &src);
        b_int(s, 7, u->usage.cached_tokens, &src);
        b_int(s, 8, u->usage.reasoning_tokens, &src);
        b_int(s, 9, u->usage.total_tokens, &src);
        b_real(s, 10, u->cost, &src);
        b_int(s, 11, p->now, &src);
        b_int(s, 12, u->usage.cache_write_tokens, &src);
        b_micros(s, 13, u->cost >= 0 ? u->usage.cost_micros : -1, &src);
        if ((src = step_done(s, src)) != SQLITE_OK)
            return fail(st, c->db, src, "saving usage");
        done(s);
    }
    return 0;
}

static int insert_records(sqlite_store *st, conn *c, const loom__store_plan *p)
{
    const loom_turn_record *t = p->turn;
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK;

    for (size_t i = 0; i < p->records_len; i++) {
        const loom__store_record *r = &p->records[i];
        if ((rc = use(st, c, S_RECORD_INSERT, &s)) != 0)
            return rc;
        b_text(s, 1, t->conversation_id, &src);
        b_text(s, 2, t->run_id, &src);
        b_int(s, 3, (int64_t)i, &src);
        b_textn(s, 4, r->tool, r->tool_len, &src);
        b_textn(s, 5, r->call_id, r->call_id_len, &src);
        b_textn(s, 6, r->status, r->status_len, &src);
        b_real(s, 7, r->duration_ms, &src);
        b_text(s, 8, r->json, &src);
        b_int(s, 9, p->now, &src);
        if ((src = step_done(s, src)) != SQLITE_OK)
            return fail(st, c->db, src, "saving tool records");
        done(s);
    }
    return 0;
}

static int update_conversation(sqlite_store *st, conn *c,
                               const loom__store_plan *p)
{
    const loom_turn_record *t = p->turn;
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK;

    if ((rc = use(st, c, S_CONV_UPDATE, &s)) != 0)
        return rc;
    b_text(s, 1, t->conversation_id, &src);
    b_int(s, 2, p->now, &src);
    b_int(s, 3, (int64_t)p->len, &src);
    b_text(s, 4, t->agent, &src);
    b_text(s, 5, t->model, &src);
    b_text(s, 6, p->title, &src);
    b_text(s, 7, t->summary, &src);
    b_int(s, 8, (int64_t)t->summary_covers, &src);
    b_text(s, 9, p->plan_text, &src);
    if ((src = step_done(s, src)) != SQLITE_OK)
        return fail(st, c->db, src, "updating a conversation");
    done(s);
    return 0;
}

static int sqlite_save_turn(loom_store *base, const loom__store_plan *p)
{
    sqlite_store *st = (sqlite_store *)base;
    int64_t count = 0;
    conn *c = NULL;
    int rc, src;

    /* The write lock first, so waiting writers do not hold connections
     * that readers could use. */
    pthread_mutex_lock(&st->write_lock);
    if ((rc = acquire(st, &c)) != 0)
        goto cleanup;
    if ((src = run(c, S_BEGIN_WRITE)) != SQLITE_OK) {
        rc = fail(st, c->db, src, "starting a write");
        goto cleanup;
    }
    if ((rc = exists_on(st, c, p->turn->conversation_id, &count)) != 0)
        goto cleanup;
    for (size_t i = 0; i < p->len; i++)
        if ((rc = insert_message(st, c, p, i, count + (int64_t)i)) != 0)
            goto cleanup;
    if ((rc = insert_usage(st, c, p)) != 0 ||
        (rc = insert_records(st, c, p)) != 0 ||
        (rc = update_conversation(st, c, p)) != 0 ||
        (rc = commit(st, c, "saving a turn")) != 0)
        goto cleanup;
cleanup:
    /* release() rolls back whatever an error left open. */
    release(st, c);
    pthread_mutex_unlock(&st->write_lock);
    return rc;
}

/* ---- for the other files of the backend (sqlite_internal.h) --------- */

int loom__sqlite_begin(loom_store *base, int write, loom__sqlite_conn **out)
{
    sqlite_store *st = (sqlite_store *)base;
    int rc, src;

    *out = NULL;
    /* As in sqlite_save_turn: the write lock before a connection. */
    if (write)
        pthread_mutex_lock(&st->write_lock);
    if ((rc = acquire(st, out)) != 0) {
        if (write)
            pthread_mutex_unlock(&st->write_lock);
        return rc;
    }
    if ((src = run(*out, write ? S_BEGIN_WRITE : S_BEGIN)) != SQLITE_OK) {
        rc = fail(st, (*out)->db, src,
                  write ? "starting a write" : "starting a read");
        loom__sqlite_end(base, *out, write);
        *out = NULL;
    }
    return rc;
}

void loom__sqlite_end(loom_store *base, loom__sqlite_conn *c, int write)
{
    sqlite_store *st = (sqlite_store *)base;

    release(st, c);
    if (write)
        pthread_mutex_unlock(&st->write_lock);
}

int loom__sqlite_commit(loom_store *base, loom__sqlite_conn *c,
                        const char *what)
{
    return commit((sqlite_store *)base, c, what);
}

sqlite3 *loom__sqlite_db(loom__sqlite_conn *c)
{
    return c->db;
}

int loom__sqlite_fail(loom_store *base, loom__sqlite_conn *c, int rc,
                      const char *what)
{
    return fail((sqlite_store *)base, c ? c->db : NULL, rc, what);
}

static const loom__store_vtable sqlite_vtable = {
    "sqlite",
    sqlite_free,
    sqlite_ping,
    sqlite_schema_version,
    sqlite_conversation_create,
    sqlite_conversation_info,
    sqlite_conversation_list,
    sqlite_conversation_get,
    sqlite_conversation_delete,
    sqlite_load_history,
    sqlite_conversation_summary,
    sqlite_save_turn,
    loom__sqlite_memory_add,
    loom__sqlite_memory_search,
    loom__sqlite_memory_delete,
    loom__sqlite_memory_count,
};
