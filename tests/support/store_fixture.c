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
#include <stdlib.h>
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

/* Rows of `from` whose column key is a that are not b's, and b's not
 * a's, over the columns cols, plus how many more rows one has, plus 1
 * when a has none and must have some. */
static long long rows_differ(const char *path, const char *cols,
                             const char *from, const char *key, const char *a,
                             const char *b, int some)
{
    char fa[512], fb[512], *sql = NULL;
    long long n;

    assert_true(snprintf(fa, sizeof(fa), "%s WHERE %s = '%s'", from, key, a) <
                (int)sizeof(fa));
    assert_true(snprintf(fb, sizeof(fb), "%s WHERE %s = '%s'", from, key, b) <
                (int)sizeof(fb));
    assert_true(asprintf(&sql,
                         "SELECT (SELECT count(*) FROM (SELECT %s FROM %s "
                         "EXCEPT SELECT %s FROM %s)) + (SELECT count(*) FROM "
                         "(SELECT %s FROM %s EXCEPT SELECT %s FROM %s)) + "
                         "abs((SELECT count(*) FROM %s) - (SELECT count(*) "
                         "FROM %s)) + (%d AND (SELECT count(*) FROM %s) = 0)",
                         cols, fa, cols, fb, cols, fb, cols, fa, fa, fb, some,
                         fa) > 0);
    n = test_db_int(path, sql);
    free(sql);
    return n;
}

void test_db_same_conversation(const char *path, const char *a, const char *b)
{
    static const struct {
        const char *cols, *from, *key;
        int some; /* the conversation must have such rows */
    } t[] = {
        {"title, agent, model, message_count, summary, summary_covers, plan, "
         "user_id, prefix_hash, prefix_hash_streamed, parent_id, "
         "fork_position, fork_message, fork_origin",
         "conversations", "id", 1},
        {"position, role, content, reasoning, model, finish_reason, status, "
         "error, prompt_tokens, completion_tokens, cost, tool_call_id, name, "
         "placeholder, provider_state, cost_micros, citations, parts, agent",
         "messages", "conversation_id", 1},
        {"m.position, c.position, c.call_id, c.name, c.arguments, "
         "c.text_offset",
         "tool_calls c JOIN messages m ON m.id = c.message_id",
         "m.conversation_id", 0},
        {"model, iteration, prompt_tokens, completion_tokens, cached_tokens, "
         "reasoning_tokens, total_tokens, cost, cache_write_tokens, "
         "cost_micros, agent, user_id, key_id, workspace, user_name, end_user",
         "usage", "conversation_id", 1},
        {"parent_run_id, parent_call_id, depth, user_id, agent, model, "
         "status, error, finish_reason, prompt_tokens, completion_tokens, "
         "cached_tokens, reasoning_tokens, total_tokens, cache_write_tokens, "
         "cost_micros",
         "runs", "conversation_id", 1},
    };

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        if (rows_differ(path, t[i].cols, t[i].from, t[i].key, a, b,
                        t[i].some) != 0)
            fail_msg("conversations %s and %s differ in: %s", a, b, t[i].from);
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
