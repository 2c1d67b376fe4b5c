/*
 * Internal to the SQLite backend: its migrations (migrations.c) and the
 * hooks its tests use to reach states a caller cannot (an older schema,
 * a full disk).
 */
#ifndef LOOM_STORE_SQLITE_INTERNAL_H
#define LOOM_STORE_SQLITE_INTERNAL_H

#include "store/store_internal.h"

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

#endif
