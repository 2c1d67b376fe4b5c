/*
 * Users' memories in the SQLite backend (see loom/store.h and the
 * memories vtable entries in store_internal.h).
 *
 * Rows live in `memories`; `memories_fts` is an FTS5 index over their
 * text that triggers (migration 4) keep in step inside the writing
 * transaction, so no code path can leave the two apart. Every statement
 * names the user: search joins the index to `memories` and keeps only
 * that user's rows, so another user's memories never come back, whatever
 * the query. The query reaches FTS5 only as a list of double-quoted
 * strings joined with OR, built here from the words the front extracted:
 * model text is never FTS5 syntax (a quoted string cannot hold an
 * operator, a column filter or a prefix star). BM25 ranks the matches.
 *
 * Statements are prepared per call rather than cached on the connection:
 * memory calls are rare next to turns, so sqlite.c's statement cache
 * holds only the conversation store's statements.
 */
#include "core/error.h"
#include "core/utf8.h"
#include "loom/buf.h"
#include "store/sqlite_internal.h"

#include <stdlib.h>
#include <string.h>

/* The columns a search returns, in this order. */
#define MEMORY_COLS "m.id, m.content, m.created_at, m.updated_at"

static const char sql_find[] =
    "SELECT id FROM memories WHERE user_id = ?1 AND norm = ?2";
static const char sql_touch[] =
    "UPDATE memories SET updated_at = MAX(updated_at, ?2) WHERE id = ?1";
static const char sql_count[] =
    "SELECT count(*) FROM memories WHERE user_id = ?1";
static const char sql_insert[] =
    "INSERT INTO memories (id, user_id, content, norm, created_at, "
    "updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?5)";
static const char sql_search[] =
    "SELECT " MEMORY_COLS " FROM memories_fts "
    "JOIN memories m ON m.seq = memories_fts.rowid "
    "WHERE memories_fts MATCH ?1 AND m.user_id = ?2 "
    "ORDER BY bm25(memories_fts), m.updated_at DESC, m.seq DESC LIMIT ?3";
static const char sql_recent[] =
    "SELECT " MEMORY_COLS " FROM memories m WHERE m.user_id = ?1 "
    "ORDER BY m.updated_at DESC, m.seq DESC LIMIT ?2";
static const char sql_delete[] =
    "DELETE FROM memories WHERE user_id = ?1 AND id = ?2";

/* Prepares sql on c; an SQLite code. */
static int prepare(loom__sqlite_conn *c, const char *sql, sqlite3_stmt **s)
{
    *s = NULL;
    return sqlite3_prepare_v2(loom__sqlite_db(c), sql, -1, s, NULL);
}

/* Counts user_id's memories on c (inside the caller's transaction). */
static int count_on(loom_store *st, loom__sqlite_conn *c, const char *user_id,
                    int64_t *out)
{
    sqlite3_stmt *s = NULL;
    int src = prepare(c, sql_count, &s), rc = 0;

    b_text(s, 1, user_id, &src);
    if (src == SQLITE_OK && (src = sqlite3_step(s)) == SQLITE_ROW)
        *out = sqlite3_column_int64(s, 0);
    else
        rc = loom__sqlite_fail(st, c, src, "counting memories");
    sqlite3_finalize(s);
    return rc;
}

/* Looks for user's memory with this norm: 1 (id filled), 0 or an error. */
static int find_on(loom_store *st, loom__sqlite_conn *c,
                   const loom__store_memory *m, char id[LOOM__STORE_ID_SIZE])
{
    sqlite3_stmt *s = NULL;
    const char *v;
    int src = prepare(c, sql_find, &s), rc = 0;

    b_text(s, 1, m->user_id, &src);
    b_text(s, 2, m->norm, &src);
    if (src == SQLITE_OK)
        src = sqlite3_step(s);
    if (src == SQLITE_ROW) {
        v = (const char *)sqlite3_column_text(s, 0);
        /* Ids are written by loom_id_new, but the file is outside
         * our control: never copy past the buffer. */
        if (!v || strlen(v) >= LOOM__STORE_ID_SIZE)
            rc = loom__error_set(LOOM_EPROTO, "store: a memory id in the "
                                              "database is malformed");
        else {
            memcpy(id, v, strlen(v) + 1);
            rc = 1;
        }
    } else if (src != SQLITE_DONE) {
        rc = loom__sqlite_fail(st, c, src, "looking for a duplicate memory");
    }
    sqlite3_finalize(s);
    return rc;
}

static int touch_on(loom_store *st, loom__sqlite_conn *c, const char *id,
                    int64_t now)
{
    sqlite3_stmt *s = NULL;
    int src = prepare(c, sql_touch, &s), rc = 0;

    b_text(s, 1, id, &src);
    b_int(s, 2, now, &src);
    if ((src = step_done(s, src)) != SQLITE_OK)
        rc = loom__sqlite_fail(st, c, src, "storing a memory");
    sqlite3_finalize(s);
    return rc;
}

static int insert_on(loom_store *st, loom__sqlite_conn *c,
                     const loom__store_memory *m)
{
    sqlite3_stmt *s = NULL;
    int src = prepare(c, sql_insert, &s), rc = 0;

    b_text(s, 1, m->id, &src);
    b_text(s, 2, m->user_id, &src);
    b_textn(s, 3, m->content, m->content_len, &src);
    b_text(s, 4, m->norm, &src);
    b_int(s, 5, m->now, &src);
    if ((src = step_done(s, src)) != SQLITE_OK)
        rc = loom__sqlite_fail(st, c, src, "storing a memory");
    sqlite3_finalize(s);
    return rc;
}

int loom__sqlite_memory_add(loom_store *st, const loom__store_memory *m,
                            char id[LOOM__STORE_ID_SIZE], int *duplicate)
{
    loom__sqlite_conn *c = NULL;
    int64_t n = 0;
    int rc;

    *duplicate = 0;
    /* One write transaction: the duplicate check, the count and the
     * insert see the same rows, so neither a second copy nor one memory
     * too many can slip in between (UNIQUE (user_id, norm) backs the
     * first up against other processes). */
    if ((rc = loom__sqlite_begin(st, 1, &c)) != 0)
        return rc;
    if ((rc = find_on(st, c, m, id)) < 0)
        goto cleanup;
    if (rc == 1) {
        *duplicate = 1;
        rc = touch_on(st, c, id, m->now);
    } else if ((rc = count_on(st, c, m->user_id, &n)) == 0) {
        if (n >= m->max_per_user)
            rc = loom__error_set(LOOM_ETOOLARGE,
                                 "this user already has %lld memories, the "
                                 "most allowed; nothing was stored (delete "
                                 "some first)",
                                 (long long)n);
        else if ((rc = insert_on(st, c, m)) == 0)
            memcpy(id, m->id, sizeof(m->id));
    }
    if (rc == 0)
        rc = loom__sqlite_commit(st, c, "storing a memory");
cleanup:
    loom__sqlite_end(st, c, 1);
    return rc;
}

/*
 * The FTS5 query for terms: each one a double-quoted string (a quote
 * inside doubled, though the front never leaves one), joined with OR.
 * Inside a string FTS5 sees only text for its tokenizer, never an
 * operator (AND, OR, NOT, NEAR), a column filter, a '^' or a '*'.
 */
static int match_expr(const char *const *terms, size_t n, loom_buf *b)
{
    int rc = 0;

    for (size_t i = 0; i < n && rc == 0; i++) {
        if (i > 0)
            rc = loom_buf_puts(b, " OR ");
        if (rc == 0)
            rc = loom_buf_putc(b, '"');
        for (const char *p = terms[i]; rc == 0 && *p; p++)
            rc = *p == '"' ? loom_buf_puts(b, "\"\"") : loom_buf_putc(b, *p);
        if (rc == 0)
            rc = loom_buf_putc(b, '"');
    }
    return rc;
}

/* The row s is on as {"id", "content", "created_at", "updated_at"}. */
static json_t *row_json(sqlite3_stmt *s)
{
    const char *id = (const char *)sqlite3_column_text(s, 0);
    const char *text = (const char *)sqlite3_column_text(s, 1);

    return json_pack(
        "{s:o,s:o,s:I,s:I}", "id", loom__json_text(id, id ? strlen(id) : 0),
        "content",
        loom__json_text(text ? text : "",
                        text ? (size_t)sqlite3_column_bytes(s, 1) : 0),
        "created_at", (json_int_t)sqlite3_column_int64(s, 2), "updated_at",
        (json_int_t)sqlite3_column_int64(s, 3));
}

int loom__sqlite_memory_search(loom_store *st, const char *user_id,
                               const char *const *terms, size_t nterms,
                               int limit, json_t **out)
{
    loom_buf expr = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    loom__sqlite_conn *c = NULL;
    sqlite3_stmt *s = NULL;
    json_t *res = NULL, *data = NULL;
    int rc, src;

    *out = NULL;
    if (nterms > 0 && (rc = match_expr(terms, nterms, &expr)) != 0)
        goto cleanup;
    if (!(data = json_array())) {
        rc = loom__error_oom();
        goto cleanup;
    }
    if ((rc = loom__sqlite_begin(st, 0, &c)) != 0)
        goto cleanup;
    if (nterms > 0) {
        src = prepare(c, sql_search, &s);
        b_textn(s, 1, expr.ptr, expr.len, &src);
        b_text(s, 2, user_id, &src);
        b_int(s, 3, limit, &src);
    } else {
        src = prepare(c, sql_recent, &s);
        b_text(s, 1, user_id, &src);
        b_int(s, 2, limit, &src);
    }
    while (src == SQLITE_OK && (src = sqlite3_step(s)) == SQLITE_ROW) {
        src = SQLITE_OK;
        if (json_array_append_new(data, row_json(s))) {
            rc = loom__error_oom();
            goto cleanup;
        }
    }
    if (src != SQLITE_DONE) {
        rc = loom__sqlite_fail(st, c, src, "searching memories");
        goto cleanup;
    }
    sqlite3_finalize(s);
    s = NULL;
    if ((rc = loom__sqlite_commit(st, c, "searching memories")) != 0)
        goto cleanup;
    if (!(res = json_pack("{s:O}", "data", data)))
        rc = loom__error_oom();
cleanup:
    sqlite3_finalize(s);
    if (c)
        loom__sqlite_end(st, c, 0);
    json_decref(data);
    loom_buf_free(&expr);
    *out = res;
    return rc;
}

int loom__sqlite_memory_delete(loom_store *st, const char *user_id,
                               const char *id)
{
    loom__sqlite_conn *c = NULL;
    sqlite3_stmt *s = NULL;
    int rc, src;

    if ((rc = loom__sqlite_begin(st, 1, &c)) != 0)
        return rc;
    src = prepare(c, sql_delete, &s);
    b_text(s, 1, user_id, &src);
    b_text(s, 2, id, &src);
    if ((src = step_done(s, src)) != SQLITE_OK)
        rc = loom__sqlite_fail(st, c, src, "deleting a memory");
    else if (sqlite3_changes(loom__sqlite_db(c)) == 0)
        rc = loom__error_set(LOOM_ENOTFOUND, "memory '%s' not found", id);
    sqlite3_finalize(s);
    if (rc == 0)
        rc = loom__sqlite_commit(st, c, "deleting a memory");
    loom__sqlite_end(st, c, 1);
    return rc;
}

int loom__sqlite_memory_count(loom_store *st, const char *user_id, int64_t *out)
{
    loom__sqlite_conn *c = NULL;
    int rc;

    if ((rc = loom__sqlite_begin(st, 0, &c)) != 0)
        return rc;
    if ((rc = count_on(st, c, user_id, out)) == 0)
        rc = loom__sqlite_commit(st, c, "counting memories");
    loom__sqlite_end(st, c, 0);
    return rc;
}
