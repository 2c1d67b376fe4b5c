/*
 * Internal to the SQLite backend: its migrations (migrations.c), what
 * sqlite.c lends the backend's other files (sqlite_memory.c) to run a
 * transaction on a pooled connection, and the hooks its tests use to
 * reach states a caller cannot (an older schema, a full disk).
 */
#ifndef LOOM_STORE_SQLITE_INTERNAL_H
#define LOOM_STORE_SQLITE_INTERNAL_H

#include "store/store_internal.h"

#include <sqlite3.h>

/* Migration N is loom__sqlite_migrations[N - 1]; the newest schema version
 * this loom knows is loom__sqlite_migrations_len. */
extern const char *const loom__sqlite_migrations[];
extern const int loom__sqlite_migrations_len;

/*
 * Test hook: opens like loom_store_open() but migrates no further than
 * version (a database already past it is left alone).
 */
int loom__store_sqlite_open_version(loom_store **out, const char *path,
                                    int version);

/*
 * Test hook: runs sql on every idle connection of st now and on every
 * connection it opens later (say "PRAGMA max_page_count = 40"). Only
 * while no other thread uses st. sql is copied.
 */
int loom__store_sqlite_exec_all(loom_store *st, const char *sql);

/* ---- transactions on pooled connections (sqlite.c) ------------------- */

typedef struct loom__sqlite_conn loom__sqlite_conn;

/*
 * Takes a pooled connection (waiting for one) and begins a transaction on
 * it: BEGIN IMMEDIATE after the store's in-process write lock when write
 * is set, a plain (read) BEGIN otherwise. Every success is paired with
 * loom__sqlite_end() with the same write.
 */
int loom__sqlite_begin(loom_store *st, int write, loom__sqlite_conn **out);
/* Rolls back whatever is still open, gives c back and drops the write
 * lock. Statements the caller prepared must be finalized first. */
void loom__sqlite_end(loom_store *st, loom__sqlite_conn *c, int write);
int loom__sqlite_commit(loom_store *st, loom__sqlite_conn *c,
                        const char *what);
/* The connection's handle, for statements the caller prepares itself. */
sqlite3 *loom__sqlite_db(loom__sqlite_conn *c);
/* Records SQLite's error rc for what ("store PATH: what: message") and
 * returns the LOOM_E* code it maps to (a full disk is LOOM_EIO). */
int loom__sqlite_fail(loom_store *st, loom__sqlite_conn *c, int rc,
                      const char *what);

/* ---- memories (sqlite_memory.c): the vtable entries ------------------ */

int loom__sqlite_memory_add(loom_store *st, const loom__store_memory *m,
                            char id[LOOM__STORE_ID_SIZE], int *duplicate);
int loom__sqlite_memory_search(loom_store *st, const char *user_id,
                               const char *const *terms, size_t nterms,
                               int limit, json_t **out);
int loom__sqlite_memory_delete(loom_store *st, const char *user_id,
                               const char *id);
int loom__sqlite_memory_count(loom_store *st, const char *user_id,
                              int64_t *out);

#endif
