/*
 * A SQLite store on a temporary file for tests (store_fixture.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "store_fixture.h"
#include "testutil.h"

#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void test_db_remove(const char *path)
{
    char buf[4096];

    unlink(path);
    snprintf(buf, sizeof(buf), "%s-wal", path);
    unlink(buf);
    snprintf(buf, sizeof(buf), "%s-shm", path);
    unlink(buf);
}

char *test_db_path(const char *name)
{
    char *p = test_tmp_path(name);

    assert_non_null(p);
    test_db_remove(p);
    return p;
}

loom_store *test_store_open_ok(const char *path)
{
    loom_store *st = NULL;
    int rc = loom_store_open(&st, path);

    if (rc)
        fprintf(stderr, "open %s: %s\n", path, loom_error_last());
    assert_int_equal(rc, 0);
    assert_non_null(st);
    return st;
}

char *test_conversation_create_ok(loom_store *st)
{
    char *id = NULL;

    assert_int_equal(loom_store_conversation_create(st, &id), 0);
    assert_non_null(id);
    return id;
}

json_t *test_conversation_get_ok(loom_store *st, const char *id)
{
    json_t *j = NULL;

    assert_int_equal(loom_store_conversation_get(st, id, &j), 0);
    assert_non_null(j);
    return j;
}

long long test_db_int(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *s = NULL;
    long long v = -1;

    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
    if (sqlite3_step(s) == SQLITE_ROW)
        v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
    return v;
}

void test_db_exec(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    char *err = NULL;

    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL),
                     SQLITE_OK);
    if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK)
        fail_msg("raw SQL failed: %s", err ? err : "?");
    sqlite3_close(db);
}

const json_t *test_usage_group(const json_t *out, const char *key,
                               const char *value)
{
    const json_t *g;
    size_t i;

    json_array_foreach(json_object_get(out, "data"), i, g)
    {
        const char *v = json_string_value(json_object_get(g, key));
        if ((!value && !v) || (value && v && !strcmp(v, value)))
            return g;
    }
    fail_msg("no usage group with %s = %s", key, value ? value : "null");
    return NULL;
}
