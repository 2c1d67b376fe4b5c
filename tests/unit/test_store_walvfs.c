/*
 * Unit tests of the store's SQLite file layer (src/store/sqlite_walvfs.c),
 * which writes each commit's WAL frames in one call: a commit of a dozen
 * pages is one write, and every commit is readable, as soon as COMMIT
 * returns, by another connection through the layer and by one through
 * SQLite's default file layer (as another process would read it);
 * commits larger than the layer's buffer are whole; a commit whose write
 * fails (the file may not grow: RLIMIT_FSIZE) fails, leaves the earlier
 * commits intact and unseen frames out, and the same commit succeeds once
 * there is room; the file passes SQLite's integrity check after all.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "store/sqlite_internal.h"

#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* Indexes on the test table: a row written touches one page of each. */
#define NINDEXES 10

static char path[64];

static sqlite3 *open_db(const char *vfs)
{
    sqlite3 *db = NULL;

    assert_int_equal(sqlite3_open_v2(path, &db,
                                     SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                                     vfs),
                     SQLITE_OK);
    assert_int_equal(sqlite3_exec(db,
                                  "PRAGMA journal_mode = WAL; "
                                  "PRAGMA synchronous = NORMAL; "
                                  "PRAGMA temp_store = MEMORY",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_wal_autocheckpoint(db, 0);
    return db;
}

static long long query_int(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *s = NULL;
    long long v;

    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return v;
}

static void exec_ok(sqlite3 *db, const char *sql)
{
    int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);

    if (rc != SQLITE_OK)
        fail_msg("%s: %s", sql, sqlite3_errmsg(db));
}

/* Inserts n rows with blobs of size bytes in one transaction; SQLite's
 * code of the COMMIT (or of the first failing insert). */
static int insert_rows(sqlite3 *db, int n, int size)
{
    char sql[224];
    int rc;

    exec_ok(db, "BEGIN IMMEDIATE");
    snprintf(sql, sizeof(sql),
             "WITH RECURSIVE s(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM s "
             "WHERE x < %d) INSERT INTO t (k, b) SELECT abs(random()) || '-' "
             "|| x, randomblob(%d) FROM s",
             n, size);
    rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK && !sqlite3_get_autocommit(db))
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    return rc;
}

static int setup(void **state)
{
    sqlite3 *db;
    char sql[128];

    (void)state;
    snprintf(path, sizeof(path), "/tmp/loom-walvfs-%d.db", (int)getpid());
    unlink(path);
    assert_int_equal(loom__sqlite_walvfs(), SQLITE_OK);
    db = open_db(LOOM_SQLITE_VFS);
    exec_ok(db, "CREATE TABLE t (id INTEGER PRIMARY KEY, k TEXT, b BLOB)");
    for (int i = 0; i < NINDEXES; i++) {
        snprintf(sql, sizeof(sql), "CREATE INDEX t_%d ON t (substr(k, %d), id)",
                 i, i + 1);
        exec_ok(db, sql);
    }
    sqlite3_close(db);
    return 0;
}

static int teardown(void **state)
{
    char p[80];

    (void)state;
    unlink(path);
    snprintf(p, sizeof(p), "%s-wal", path);
    unlink(p);
    snprintf(p, sizeof(p), "%s-shm", path);
    unlink(p);
    return 0;
}

/* A commit touching a dozen pages is one write; readers through either
 * file layer see each commit as soon as COMMIT returns. */
static void test_commit_one_write(void **state)
{
    sqlite3 *w = open_db(LOOM_SQLITE_VFS), *r = open_db(LOOM_SQLITE_VFS),
            *plain = open_db(NULL);
    long long rows = query_int(w, "SELECT count(*) FROM t");

    (void)state;
    /* The first commit opens the WAL and writes its header. */
    assert_int_equal(insert_rows(w, 1, 100), SQLITE_OK);
    rows++;
    for (int i = 0; i < 20; i++) {
        long before = loom__sqlite_walvfs_writes();
        assert_int_equal(insert_rows(w, 3, 100), SQLITE_OK);
        /* Table and NINDEXES indexes: at least 11 frames, 22 writes
         * for SQLite's default file layer. */
        assert_int_equal(loom__sqlite_walvfs_writes() - before, 1);
        rows += 3;
        assert_int_equal(query_int(r, "SELECT count(*) FROM t"), rows);
        assert_int_equal(query_int(plain, "SELECT count(*) FROM t"), rows);
        assert_int_equal(query_int(plain, "SELECT count(*) FROM t "
                                          "INDEXED BY t_9"),
                         rows);
    }
    sqlite3_close(r);
    sqlite3_close(plain);
    sqlite3_close(w);
}

/* A commit larger than the buffer goes out in several writes, whole. */
static void test_large_commit(void **state)
{
    sqlite3 *w = open_db(LOOM_SQLITE_VFS), *plain = open_db(NULL);
    long long rows = query_int(w, "SELECT count(*) FROM t");
    long before = loom__sqlite_walvfs_writes();

    (void)state;
    /* About 300 pages of blobs, 1.2 MB. */
    assert_int_equal(insert_rows(w, 300, 3000), SQLITE_OK);
    assert_true(loom__sqlite_walvfs_writes() - before > 1);
    assert_int_equal(query_int(plain, "SELECT count(*) FROM t"), rows + 300);
    assert_int_equal(query_int(plain, "SELECT sum(length(b)) FROM t "
                                      "WHERE length(b) = 3000"),
                     300 * 3000);
    /* Copied back into the database, then read from there. */
    assert_int_equal(sqlite3_wal_checkpoint_v2(
                         plain, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL),
                     SQLITE_OK);
    assert_int_equal(query_int(w, "SELECT count(*) FROM t"), rows + 300);
    sqlite3_close(plain);
    sqlite3_close(w);
}

static long long file_size(const char *p)
{
    struct stat st;

    return stat(p, &st) == 0 ? (long long)st.st_size : -1;
}

/* A commit whose write fails (the WAL may not grow) fails, and nothing of
 * it is seen; the earlier commits stay; with room again it commits. */
static void test_failed_write(void **state)
{
    sqlite3 *w = open_db(LOOM_SQLITE_VFS), *plain = open_db(NULL);
    struct rlimit old, lim;
    char wal[80];
    long long rows, wal_size;
    int rc;

    (void)state;
    /* Start from an empty WAL file: the next commits must grow it. */
    assert_int_equal(sqlite3_wal_checkpoint_v2(
                         w, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL),
                     SQLITE_OK);
    assert_int_equal(insert_rows(w, 2, 100), SQLITE_OK);
    rows = query_int(w, "SELECT count(*) FROM t");
    snprintf(wal, sizeof(wal), "%s-wal", path);
    wal_size = file_size(wal);
    assert_true(wal_size > 0);

    signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = (rlim_t)wal_size + 8192;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    /* Twenty pages of blobs and the indexes: far past 8 KiB more. */
    rc = insert_rows(w, 20, 3000);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, SIG_DFL);
    assert_true(rc == SQLITE_FULL || (rc & 0xff) == SQLITE_IOERR);

    assert_int_equal(query_int(plain, "SELECT count(*) FROM t"), rows);
    assert_int_equal(query_int(w, "SELECT count(*) FROM t"), rows);
    /* With room again the same connection commits. */
    assert_int_equal(insert_rows(w, 20, 3000), SQLITE_OK);
    assert_int_equal(query_int(plain, "SELECT count(*) FROM t"), rows + 20);
    sqlite3_close(w);
    sqlite3_close(plain);

    /* The file, read afresh by SQLite's own layer, is whole. */
    plain = open_db(NULL);
    {
        sqlite3_stmt *s = NULL;
        assert_int_equal(
            sqlite3_prepare_v2(plain, "PRAGMA integrity_check", -1, &s, NULL),
            SQLITE_OK);
        assert_int_equal(sqlite3_step(s), SQLITE_ROW);
        assert_string_equal((const char *)sqlite3_column_text(s, 0), "ok");
        sqlite3_finalize(s);
    }
    assert_int_equal(query_int(plain, "SELECT count(*) FROM t"), rows + 20);
    sqlite3_close(plain);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_commit_one_write),
        cmocka_unit_test(test_large_commit),
        cmocka_unit_test(test_failed_write),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
