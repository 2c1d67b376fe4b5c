/*
 * Unit tests of users' memories: the store API (loom_store_memory_* in
 * loom/store.h) on its SQLite backend, and the memory tools and their
 * settings rule (loom/memory.h), called the way the run loop calls them.
 *
 * They cover adding and counting, deduplication (normalized text, per
 * user, also from many threads at once), BM25 ranking, the most recent
 * first listing, FTS5 syntax in queries (quotes, operators, column
 * filters, stars, invalid UTF-8) never erroring nor reaching another
 * user's rows, isolation between users for every call, every limit
 * crossed, migration from a version 3 database keeping its data, and the
 * full-text index staying in step with the rows (FTS5 integrity-check).
 * Raw SQLite is used only to look at the file or to fill it fast.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "loom/memory.h"
#include "loom/store.h"
#include "store/sqlite_internal.h"
#include "store_fixture.h"
#include "testutil.h"

#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- helpers ---- */

/* The full-text index agrees with the rows (FTS5's own check). */
static void fts_intact(const char *path)
{
    test_db_exec(path, "INSERT INTO memories_fts (memories_fts) "
                       "VALUES ('integrity-check')");
}

static char *add_ok(loom_store *st, const char *user, const char *text,
                    int want_dup)
{
    char *id = NULL;
    int dup = -1, rc = loom_store_memory_add(st, user, text, &id, &dup);

    if (rc)
        fail_msg("memory_add(%s, %s): %s", user, text, loom_error_last());
    assert_non_null(id);
    assert_int_equal(strncmp(id, "mem_", 4), 0);
    assert_int_equal(strlen(id), 4 + 24);
    assert_int_equal(dup, want_dup);
    return id;
}

static int64_t count_of(loom_store *st, const char *user)
{
    int64_t n = -1;

    assert_int_equal(loom_store_memory_count(st, user, &n), 0);
    return n;
}

/* Searches and returns the "data" array (a new reference). */
static json_t *search_ok(loom_store *st, const char *user, const char *q,
                         int limit)
{
    json_t *res = NULL, *data;
    int rc = loom_store_memory_search(st, user, q, limit, &res);

    if (rc)
        fail_msg("search(%s, %s): %s", user, q ? q : "(null)",
                 loom_error_last());
    data = json_object_get(res, "data");
    assert_true(json_is_array(data));
    json_incref(data);
    json_decref(res);
    return data;
}

static const char *item_str(const json_t *data, size_t i, const char *key)
{
    const char *v = json_string_value(json_object_get(json_array_get(data, i),
                                                      key));
    assert_non_null(v);
    return v;
}

/* ---- store API ---- */

static void test_add_count_delete(void **state)
{
    char *path = test_db_path("mem_basic.db"), *a, *b, *id = (char *)1;
    loom_store *st = test_store_open_ok(path);
    json_t *data;
    int dup = 7;

    (void)state;
    assert_int_equal(count_of(st, "u1"), 0);
    a = add_ok(st, "u1", "  The user lives in Lyon.\n", 0);
    b = add_ok(st, "u1", "The user has two cats", 0);
    assert_string_not_equal(a, b);
    assert_int_equal(count_of(st, "u1"), 2);
    /* Blanks around the text are not kept. */
    data = search_ok(st, "u1", "Lyon", 10);
    assert_int_equal(json_array_size(data), 1);
    assert_string_equal(item_str(data, 0, "id"), a);
    assert_string_equal(item_str(data, 0, "content"),
                        "The user lives in Lyon.");
    assert_true(json_integer_value(json_object_get(json_array_get(data, 0),
                                                   "created_at")) > 0);
    json_decref(data);
    /* A blank memory is refused and nothing is written. */
    assert_int_equal(loom_store_memory_add(st, "u1", " \t\n ", &id, &dup),
                     LOOM_EINVALID);
    assert_null(id);
    assert_int_equal(dup, 0);
    assert_non_null(strstr(loom_error_last(), "blank"));
    assert_int_equal(loom_store_memory_add(st, "u1", NULL, &id, NULL),
                     LOOM_EINVALID);
    assert_int_equal(loom_store_memory_add(st, "u1", "x", NULL, NULL),
                     LOOM_EINVALID);
    assert_int_equal(loom_store_memory_add(NULL, "u1", "x", &id, NULL),
                     LOOM_EINVALID);
    assert_int_equal(count_of(st, "u1"), 2);
    /* Delete: once, then it is gone. */
    assert_int_equal(loom_store_memory_delete(st, "u1", a), 0);
    assert_int_equal(loom_store_memory_delete(st, "u1", a), LOOM_ENOTFOUND);
    assert_non_null(strstr(loom_error_last(), a));
    assert_int_equal(loom_store_memory_delete(st, "u1", NULL), LOOM_EINVALID);
    assert_int_equal(count_of(st, "u1"), 1);
    data = search_ok(st, "u1", "Lyon", 10);
    assert_int_equal(json_array_size(data), 0);
    json_decref(data);
    loom_store_free(st);
    fts_intact(path);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM memories"), 1);
    free(a);
    free(b);
    test_db_remove(path);
    free(path);
}

static void test_dedup(void **state)
{
    char *path = test_db_path("mem_dedup.db"), *a, *a2, *a3, *near, *other;
    loom_store *st = test_store_open_ok(path);
    json_t *data;

    (void)state;
    a = add_ok(st, "u1", "The user prefers tea.", 0);
    /* Same text up to blanks, ASCII case and a final '.' or '!'. */
    test_db_exec(path,
                 "UPDATE memories SET updated_at = 1000, created_at = 1000");
    a2 = add_ok(st, "u1", "  the USER   prefers\ttea!! ", 1);
    assert_string_equal(a, a2);
    a3 = add_ok(st, "u1", "The user prefers tea", 1);
    assert_string_equal(a, a3);
    assert_int_equal(count_of(st, "u1"), 1);
    /* The first wording is kept; storing again refreshed updated_at. */
    data = search_ok(st, "u1", NULL, 10);
    assert_string_equal(item_str(data, 0, "content"), "The user prefers tea.");
    assert_int_equal(json_integer_value(json_object_get(
                         json_array_get(data, 0), "created_at")),
                     1000);
    assert_true(json_integer_value(json_object_get(json_array_get(data, 0),
                                                   "updated_at")) > 1000);
    json_decref(data);
    /* A near duplicate is a memory of its own. */
    near = add_ok(st, "u1", "The user prefers green tea.", 0);
    assert_string_not_equal(near, a);
    assert_int_equal(count_of(st, "u1"), 2);
    /* Duplicates are per user: the same text for u2 is u2's own. */
    other = add_ok(st, "u2", "The user prefers tea.", 0);
    assert_string_not_equal(other, a);
    assert_int_equal(count_of(st, "u1"), 2);
    assert_int_equal(count_of(st, "u2"), 1);
    loom_store_free(st);
    fts_intact(path);
    free(a);
    free(a2);
    free(a3);
    free(near);
    free(other);
    test_db_remove(path);
    free(path);
}

static void test_ranked_search(void **state)
{
    char *path = test_db_path("mem_rank.db"), *best, *some, *dog, *cafe;
    loom_store *st = test_store_open_ok(path);
    json_t *data;

    (void)state;
    some = add_ok(st, "u1", "The user once tried tea at a party", 0);
    best = add_ok(st, "u1",
                  "Jasmine tea, always jasmine tea: the user drinks tea daily",
                  0);
    dog = add_ok(st, "u1", "The user has a dog named Rex", 0);
    cafe = add_ok(st, "u1", "The user runs a Café in Nîmes", 0);
    /* Words in half the memories or more weigh nothing in BM25; these
     * keep "tea" rarer than that. */
    free(add_ok(st, "u1", "The user works at night", 0));
    free(add_ok(st, "u1", "The user speaks Basque", 0));

    /* The memory that matches more and more often comes first. */
    data = search_ok(st, "u1", "jasmine tea", 10);
    assert_int_equal(json_array_size(data), 2);
    assert_string_equal(item_str(data, 0, "id"), best);
    assert_string_equal(item_str(data, 1, "id"), some);
    json_decref(data);
    /* Any word may match; limit cuts after the best. */
    data = search_ok(st, "u1", "what tea does the user like?", 1);
    assert_int_equal(json_array_size(data), 1);
    assert_string_equal(item_str(data, 0, "id"), best);
    json_decref(data);
    /* Case, English endings and diacritics do not matter. */
    data = search_ok(st, "u1", "DOGS", 10);
    assert_int_equal(json_array_size(data), 1);
    assert_string_equal(item_str(data, 0, "id"), dog);
    json_decref(data);
    data = search_ok(st, "u1", "cafe nimes", 10);
    assert_int_equal(json_array_size(data), 1);
    assert_string_equal(item_str(data, 0, "id"), cafe);
    json_decref(data);
    data = search_ok(st, "u1", "submarine", 10);
    assert_int_equal(json_array_size(data), 0);
    json_decref(data);
    loom_store_free(st);
    free(best);
    free(some);
    free(dog);
    free(cafe);
    test_db_remove(path);
    free(path);
}

static void test_recent_first(void **state)
{
    char *path = test_db_path("mem_recent.db"), *ids[3];
    static const char *const empties[] = {NULL, "", "   ", "*", "\"\" - ()"};
    loom_store *st = test_store_open_ok(path);
    json_t *data;

    (void)state;
    ids[0] = add_ok(st, "u1", "first thing", 0);
    ids[1] = add_ok(st, "u1", "second thing", 0);
    ids[2] = add_ok(st, "u1", "third thing", 0);
    /* Older times, so that a store now is clearly later. */
    test_db_exec(path, "UPDATE memories SET created_at = 1000 * seq, "
                       "updated_at = 1000 * seq");
    /* No query, or one with no words: newest first. */
    for (size_t i = 0; i < sizeof(empties) / sizeof(empties[0]); i++) {
        data = search_ok(st, "u1", empties[i], 10);
        assert_int_equal(json_array_size(data), 3);
        assert_string_equal(item_str(data, 0, "id"), ids[2]);
        assert_string_equal(item_str(data, 1, "id"), ids[1]);
        assert_string_equal(item_str(data, 2, "id"), ids[0]);
        json_decref(data);
    }
    /* Storing the first again makes it the most recent. */
    free(add_ok(st, "u1", "First thing.", 1));
    data = search_ok(st, "u1", NULL, 2);
    assert_int_equal(json_array_size(data), 2);
    assert_string_equal(item_str(data, 0, "id"), ids[0]);
    assert_string_equal(item_str(data, 1, "id"), ids[2]);
    json_decref(data);
    loom_store_free(st);
    for (int i = 0; i < 3; i++)
        free(ids[i]);
    test_db_remove(path);
    free(path);
}

/* Model text that would be FTS5 syntax if it reached MATCH as is. */
static const char *const hostile[] = {
    "foo\" OR user_id:*",
    "foo\" OR \"alpha",
    "NEAR(",
    "NEAR(alpha foo, 2)",
    "*",
    "-",
    "-alpha",
    "alpha*",
    "^alpha",
    "\"unbalanced",
    "unbalanced\"",
    "\"\"\"",
    "(",
    ")",
    "AND",
    "OR NOT",
    "alpha AND NOT foo",
    "content:alpha",
    "{content}: alpha",
    "memories_fts:alpha",
    "user_id:\"a\"",
    "foo + bar",
    "' OR 1=1 --",
    "\xff\xfe alpha \xc3",
    "\x01\x02",
    "\xe2\x80\x9c alpha \xe2\x80\x9d",
};

static void test_query_injection(void **state)
{
    char *path = test_db_path("mem_inject.db"), *a, *b;
    loom_store *st = test_store_open_ok(path);
    json_t *data;

    (void)state;
    a = add_ok(st, "a", "secret alpha plans", 0);
    b = add_ok(st, "b", "bravo foo notes", 0);
    for (size_t i = 0; i < sizeof(hostile) / sizeof(hostile[0]); i++) {
        data = search_ok(st, "b", hostile[i], 50);
        /* Never an error (search_ok) and never user a's row. */
        for (size_t k = 0; k < json_array_size(data); k++)
            assert_string_equal(item_str(data, k, "id"), b);
        json_decref(data);
        data = search_ok(st, "a", hostile[i], 50);
        for (size_t k = 0; k < json_array_size(data); k++)
            assert_string_equal(item_str(data, k, "id"), a);
        json_decref(data);
    }
    /* The words inside still count, as plain words. */
    data = search_ok(st, "b", "foo\" OR user_id:*", 50);
    assert_int_equal(json_array_size(data), 1);
    json_decref(data);
    data = search_ok(st, "b", "content:alpha", 50);
    assert_int_equal(json_array_size(data), 0);
    json_decref(data);
    data = search_ok(st, "a", "NEAR(alpha foo, 2)", 50);
    assert_int_equal(json_array_size(data), 1);
    json_decref(data);
    /* Operator words are words: "not" matches a memory saying it. */
    free(add_ok(st, "b", "do not call after nine", 0));
    data = search_ok(st, "b", "NOT", 50);
    assert_int_equal(json_array_size(data), 1);
    json_decref(data);
    loom_store_free(st);
    free(a);
    free(b);
    test_db_remove(path);
    free(path);
}

static void test_isolation(void **state)
{
    char *path = test_db_path("mem_iso.db"), *ids[3];
    static const char *const texts[] = {"Alice likes climbing",
                                        "Alice's bank is Acme",
                                        "Alice lives in Oslo"};
    loom_store *st = test_store_open_ok(path);
    json_t *data;

    (void)state;
    for (int i = 0; i < 3; i++)
        ids[i] = add_ok(st, "alice", texts[i], 0);
    /* Bob sees nothing of Alice's, by any call. */
    assert_int_equal(count_of(st, "bob"), 0);
    data = search_ok(st, "bob", "Alice climbing bank Oslo", 50);
    assert_int_equal(json_array_size(data), 0);
    json_decref(data);
    data = search_ok(st, "bob", NULL, 50);
    assert_int_equal(json_array_size(data), 0);
    json_decref(data);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(loom_store_memory_delete(st, "bob", ids[i]),
                         LOOM_ENOTFOUND);
        /* The same answer as for an id that does not exist. */
        assert_non_null(strstr(loom_error_last(), "not found"));
    }
    assert_int_equal(count_of(st, "alice"), 3);
    /* User ids are compared exactly: no case folding, no patterns. */
    assert_int_equal(count_of(st, "Alice"), 0);
    assert_int_equal(count_of(st, "%"), 0);
    data = search_ok(st, "alic%", "Alice", 50);
    assert_int_equal(json_array_size(data), 0);
    json_decref(data);
    data = search_ok(st, "alice", "Alice", 50);
    assert_int_equal(json_array_size(data), 3);
    json_decref(data);
    /* Bob's own memory with Alice's words stays Bob's. */
    free(add_ok(st, "bob", "Alice likes climbing", 0));
    data = search_ok(st, "bob", "climbing", 50);
    assert_int_equal(json_array_size(data), 1);
    assert_string_not_equal(item_str(data, 0, "id"), ids[0]);
    json_decref(data);
    assert_int_equal(loom_store_memory_delete(st, "alice", ids[0]), 0);
    assert_int_equal(count_of(st, "bob"), 1);
    assert_int_equal(count_of(st, "alice"), 2);
    loom_store_free(st);
    fts_intact(path);
    for (int i = 0; i < 3; i++)
        free(ids[i]);
    test_db_remove(path);
    free(path);
}

/* n bytes of text, all 'a' but for a word at the start. */
static char *text_of(size_t n)
{
    char *t = malloc(n + 1);

    assert_non_null(t);
    memset(t, 'a', n);
    memcpy(t, "word ", n < 5 ? n : 5);
    t[n] = '\0';
    return t;
}

static void test_limits(void **state)
{
    char *path = test_db_path("mem_limits.db"), *t, *id = NULL, *kept;
    char user[LOOM_STORE_USER_ID_MAX + 2];
    loom_store *st = test_store_open_ok(path);
    json_t *res = NULL, *data;
    int dup = 0;

    (void)state;
    /* Content: 8 KiB is fine, one byte more is not. */
    t = text_of(LOOM_STORE_MEMORY_MAX_BYTES);
    free(add_ok(st, "u1", t, 0));
    free(t);
    t = text_of(LOOM_STORE_MEMORY_MAX_BYTES + 1);
    assert_int_equal(loom_store_memory_add(st, "u1", t, &id, &dup),
                     LOOM_ETOOLARGE);
    assert_null(id);
    assert_non_null(strstr(loom_error_last(), "at most 8192 bytes"));
    free(t);
    assert_int_equal(count_of(st, "u1"), 1);

    /* User id: 1..128 bytes. */
    memset(user, 'u', sizeof(user));
    user[LOOM_STORE_USER_ID_MAX] = '\0';
    free(add_ok(st, user, "long user", 0));
    assert_int_equal(count_of(st, user), 1);
    user[LOOM_STORE_USER_ID_MAX] = 'u';
    user[LOOM_STORE_USER_ID_MAX + 1] = '\0';
    assert_int_equal(loom_store_memory_add(st, user, "x", &id, NULL),
                     LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "at most 128 bytes"));
    assert_int_equal(loom_store_memory_search(st, user, "x", 5, &res),
                     LOOM_EINVALID);
    assert_int_equal(loom_store_memory_add(st, "", "x", &id, NULL),
                     LOOM_EINVALID);
    assert_int_equal(loom_store_memory_add(st, NULL, "x", &id, NULL),
                     LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "need a user id"));
    {
        int64_t n = 5;
        assert_int_equal(loom_store_memory_count(st, "", &n), LOOM_EINVALID);
        assert_int_equal(n, 0);
        assert_int_equal(loom_store_memory_delete(st, NULL, "mem_x"),
                         LOOM_EINVALID);
    }

    /* Query: 1 KiB is fine, one byte more is not. */
    t = text_of(LOOM_STORE_MEMORY_QUERY_MAX);
    data = search_ok(st, "u1", t, 5);
    json_decref(data);
    free(t);
    t = text_of(LOOM_STORE_MEMORY_QUERY_MAX + 1);
    assert_int_equal(loom_store_memory_search(st, "u1", t, 5, &res),
                     LOOM_ETOOLARGE);
    assert_null(res);
    assert_non_null(strstr(loom_error_last(), "at most 1024 bytes"));
    free(t);

    /* Result limit: 1..50. */
    assert_int_equal(loom_store_memory_search(st, "u1", NULL, 0, &res),
                     LOOM_EINVALID);
    assert_int_equal(loom_store_memory_search(st, "u1", NULL, 51, &res),
                     LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "between 1 and 50"));
    assert_int_equal(loom_store_memory_search(st, "u1", NULL, -3, &res),
                     LOOM_EINVALID);
    assert_null(res);

    /* Memories per user: fill "full" to one short of the cap (raw, in
     * one transaction; the triggers index them), then cross it. */
    loom_store_free(st);
    test_db_exec(
        path, "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 "
              "FROM n WHERE i < 9999) "
              "INSERT INTO memories (id, user_id, content, norm, created_at, "
              "updated_at) SELECT printf('mem_%024d', i), 'full', "
              "'filler number ' || i, 'filler number ' || i, i, i FROM n");
    st = test_store_open_ok(path);
    assert_int_equal(count_of(st, "full"), LOOM_STORE_MEMORY_MAX_PER_USER - 1);
    kept = add_ok(st, "full", "the last one that fits", 0);
    assert_int_equal(count_of(st, "full"), LOOM_STORE_MEMORY_MAX_PER_USER);
    assert_int_equal(loom_store_memory_add(st, "full", "one too many", &id,
                                           &dup),
                     LOOM_ETOOLARGE);
    assert_null(id);
    assert_non_null(strstr(loom_error_last(), "10000 memories"));
    assert_int_equal(count_of(st, "full"), LOOM_STORE_MEMORY_MAX_PER_USER);
    /* A duplicate is still recognised at the cap. */
    free(add_ok(st, "full", "The last one that fits.", 1));
    /* Other users are not affected. */
    free(add_ok(st, "u2", "one too many", 0));
    /* Making room lets it in. */
    assert_int_equal(loom_store_memory_delete(st, "full", kept), 0);
    free(add_ok(st, "full", "one too many", 0));
    assert_int_equal(count_of(st, "full"), LOOM_STORE_MEMORY_MAX_PER_USER);
    /* 50 results at most, and they come. */
    data = search_ok(st, "full", "filler", 50);
    assert_int_equal(json_array_size(data), 50);
    json_decref(data);
    loom_store_free(st);
    fts_intact(path);
    free(kept);
    test_db_remove(path);
    free(path);
}

static void test_migration_from_v3(void **state)
{
    char *path = test_db_path("mem_migrate.db"), *conv = NULL;
    loom_conversation_info info;
    loom_store *st = NULL;
    json_t *data;

    (void)state;
    assert_int_equal(loom__store_sqlite_open_version(&st, path, 3), 0);
    assert_int_equal(loom_store_schema_version(st), 3);
    assert_int_equal(loom_store_conversation_create(st, &conv), 0);
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM sqlite_master "
                                       "WHERE name = 'memories'"),
                     0);
    st = test_store_open_ok(path);
    assert_int_equal(loom_store_schema_version(st),
                     loom__sqlite_migrations_len);
    /* The version 3 data is still there. */
    assert_int_equal(loom_store_conversation_info(st, conv, &info), 0);
    assert_string_equal(info.id, conv);
    loom_conversation_info_clear(&info);
    free(add_ok(st, "u1", "remembered after the migration", 0));
    data = search_ok(st, "u1", "migration", 5);
    assert_int_equal(json_array_size(data), 1);
    json_decref(data);
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "PRAGMA user_version"),
                     loom__sqlite_migrations_len);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM sqlite_master "
                                       "WHERE name IN ('memories', "
                                       "'memories_fts', 'memories_by_user', "
                                       "'memories_fts_insert', "
                                       "'memories_fts_delete', "
                                       "'memories_fts_update')"),
                     6);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM conversations"),
                     1);
    fts_intact(path);
    free(conv);
    test_db_remove(path);
    free(path);
}

/* The index follows every change, including ones made outside loom. */
static void test_index_in_step(void **state)
{
    char *path = test_db_path("mem_step.db"), *a;
    loom_store *st = test_store_open_ok(path);
    json_t *data;

    (void)state;
    a = add_ok(st, "u1", "the user plays the oboe", 0);
    loom_store_free(st);
    test_db_exec(path,
                 "UPDATE memories SET content = 'the user plays the cello'");
    fts_intact(path);
    st = test_store_open_ok(path);
    data = search_ok(st, "u1", "oboe", 5);
    assert_int_equal(json_array_size(data), 0);
    json_decref(data);
    data = search_ok(st, "u1", "cello", 5);
    assert_int_equal(json_array_size(data), 1);
    json_decref(data);
    assert_int_equal(loom_store_memory_delete(st, "u1", a), 0);
    data = search_ok(st, "u1", "cello", 5);
    assert_int_equal(json_array_size(data), 0);
    json_decref(data);
    loom_store_free(st);
    fts_intact(path);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM memories_fts "
                                       "WHERE memories_fts MATCH 'cello'"),
                     0);
    free(a);
    test_db_remove(path);
    free(path);
}

#define NTHREADS 8

typedef struct {
    loom_store *st;
    char *id;
    int dup;
    int rc;
} adder;

static void *add_same(void *arg)
{
    adder *a = arg;

    a->rc = loom_store_memory_add(a->st, "u1", "The user is left-handed",
                                  &a->id, &a->dup);
    return NULL;
}

static void test_threads_dedup(void **state)
{
    char *path = test_db_path("mem_threads.db");
    loom_store *st = test_store_open_ok(path);
    pthread_t th[NTHREADS];
    adder a[NTHREADS];
    int dups = 0;

    (void)state;
    memset(a, 0, sizeof(a));
    for (int i = 0; i < NTHREADS; i++) {
        a[i].st = st;
        assert_int_equal(pthread_create(&th[i], NULL, add_same, &a[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < NTHREADS; i++) {
        assert_int_equal(a[i].rc, 0);
        assert_string_equal(a[i].id, a[0].id);
        dups += a[i].dup;
    }
    for (int i = 0; i < NTHREADS; i++)
        free(a[i].id);
    assert_int_equal(dups, NTHREADS - 1);
    assert_int_equal(count_of(st, "u1"), 1);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

/* ---- tools ---- */

typedef struct {
    char *path;
    loom_store *st;
    loom_tool_registry *reg;
} tool_env;

static void env_open(tool_env *e, const char *name)
{
    e->path = test_db_path(name);
    e->st = test_store_open_ok(e->path);
    assert_int_equal(loom_tool_registry_new(&e->reg), 0);
    assert_int_equal(loom_tools_add_memory(e->reg, e->st), 0);
}

static void env_close(tool_env *e)
{
    loom_tool_registry_free(e->reg);
    loom_store_free(e->st);
    test_db_remove(e->path);
    free(e->path);
}

static json_t *parse(const char *text)
{
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);

    if (!j)
        fail_msg("bad JSON '%s': %s", text, err.text);
    return j;
}

/*
 * Runs tool name as the loop would (schema check first when valid is
 * set) for user (may be NULL) with args and settings (JSON text or NULL)
 * into a buffer of max bytes. *text (caller frees) is the output.
 */
static int call_tool(tool_env *e, const char *name, const char *user,
                     const char *args_text, const char *settings_text,
                     size_t max, int valid, char **text)
{
    const loom_tool *t = loom_tool_registry_get(e->reg, name);
    json_t *args = args_text ? parse(args_text) : NULL;
    json_t *settings = settings_text ? parse(settings_text) : NULL;
    loom_cancel cancel = LOOM_CANCEL_INIT;
    loom_tool_ctx ctx = {.call_id = "call_1",
                         .tool_name = name,
                         .cancel = &cancel,
                         .settings = settings,
                         .user_id = user};
    loom_buf out = LOOM_BUF_INIT(max);
    int rc;

    assert_non_null(t);
    if (valid)
        assert_int_equal(loom_schema_validate(t->parameters, args, NULL), 0);
    rc = t->execute(args, &ctx, &out, t->payload);
    *text = loom_buf_detach(&out);
    assert_non_null(*text);
    json_decref(args);
    json_decref(settings);
    return rc;
}

static void test_tool_registration(void **state)
{
    tool_env e;
    const loom_tool *t;

    (void)state;
    env_open(&e, "mem_treg.db");
    assert_int_equal(loom_tool_registry_count(e.reg), 2);
    t = loom_tool_registry_at(e.reg, 0);
    assert_string_equal(t->name, "memory_store");
    assert_non_null(t->parameters);
    assert_string_equal(loom_tool_registry_at(e.reg, 1)->name,
                        "memory_retrieve");
    /* Both or neither. */
    assert_int_equal(loom_tools_add_memory(e.reg, e.st), LOOM_EEXISTS);
    assert_int_equal(loom_tool_registry_remove(e.reg, "memory_store"), 0);
    assert_int_equal(loom_tools_add_memory(e.reg, e.st), LOOM_EEXISTS);
    assert_int_equal(loom_tool_registry_count(e.reg), 1);
    assert_int_equal(loom_tools_add_memory(NULL, e.st), LOOM_EINVALID);
    assert_int_equal(loom_tools_add_memory(e.reg, NULL), LOOM_EINVALID);
    /* The schema refuses what the model must not send. */
    {
        json_t *bad = parse("{\"content\": \"x\", \"user_id\": \"other\"}");
        t = loom_tool_registry_get(e.reg, "memory_retrieve");
        assert_int_equal(loom_schema_validate(t->parameters, bad, NULL),
                         LOOM_EINVALID);
        json_decref(bad);
    }
    env_close(&e);
}

static void test_tool_store(void **state)
{
    tool_env e;
    char *text;
    json_t *j;
    char *id;

    (void)state;
    env_open(&e, "mem_tstore.db");
    assert_int_equal(call_tool(&e, "memory_store", "u1",
                               "{\"content\": \"The user is vegetarian\"}",
                               NULL, 4096, 1, &text),
                     0);
    j = parse(text);
    assert_string_equal(json_string_value(json_object_get(j, "status")),
                        "stored");
    id = strdup(json_string_value(json_object_get(j, "id")));
    assert_non_null(id);
    json_decref(j);
    free(text);
    /* Again: nothing new, same id, said so. */
    assert_int_equal(call_tool(&e, "memory_store", "u1",
                               "{\"content\": \"the user is vegetarian.\"}",
                               NULL, 4096, 1, &text),
                     0);
    j = parse(text);
    assert_string_equal(json_string_value(json_object_get(j, "status")),
                        "already_stored");
    assert_string_equal(json_string_value(json_object_get(j, "id")), id);
    json_decref(j);
    free(text);
    assert_int_equal(count_of(e.st, "u1"), 1);

    /* No user: a clear error the model can act on, nothing stored. */
    assert_true(call_tool(&e, "memory_store", NULL, "{\"content\": \"x\"}",
                          NULL, 4096, 1, &text) < 0);
    assert_non_null(strstr(text, "signed-in user"));
    free(text);
    assert_true(call_tool(&e, "memory_store", "", "{\"content\": \"x\"}",
                          NULL, 4096, 1, &text) < 0);
    assert_non_null(strstr(text, "signed-in user"));
    free(text);
    /* Turned off in the tool's settings. */
    assert_int_equal(call_tool(&e, "memory_store", "u1",
                               "{\"content\": \"y\"}", "{\"enabled\": false}",
                               4096, 1, &text),
                     LOOM_EINVALID);
    assert_non_null(strstr(text, "turned off"));
    free(text);
    /* Too long: the store's limit, as a tool result. */
    {
        char *big = text_of(LOOM_STORE_MEMORY_MAX_BYTES + 1), *args;
        json_t *a = json_pack("{s:s}", "content", big);
        args = json_dumps(a, 0);
        assert_int_equal(call_tool(&e, "memory_store", "u1", args, NULL, 4096,
                                   0, &text),
                         LOOM_ETOOLARGE);
        assert_non_null(strstr(text, "at most 8192 bytes"));
        free(text);
        free(args);
        json_decref(a);
        free(big);
    }
    /* Missing content (execute called without the schema check). */
    assert_int_equal(call_tool(&e, "memory_store", "u1", "{}", NULL, 4096, 0,
                               &text),
                     LOOM_EINVALID);
    assert_non_null(strstr(text, "`content`"));
    free(text);
    assert_int_equal(count_of(e.st, "u1"), 1);
    assert_int_equal(count_of(e.st, "u2"), 0);
    free(id);
    env_close(&e);
}

static void test_tool_retrieve(void **state)
{
    tool_env e;
    char *text, *best;
    json_t *j, *mems;

    (void)state;
    env_open(&e, "mem_tretrieve.db");
    free(add_ok(e.st, "u1", "The user once tried tea", 0));
    best = add_ok(e.st, "u1", "The user drinks jasmine tea, jasmine only",
                  0);
    free(add_ok(e.st, "u1", "The user has a dog", 0));
    free(add_ok(e.st, "u2", "u2 loves jasmine tea", 0));
    /* So that "jasmine" and "tea" are rare enough to weigh in BM25. */
    for (int i = 0; i < 6; i++) {
        char filler[64];
        snprintf(filler, sizeof(filler), "filler memory %d", i);
        free(add_ok(e.st, "u4", filler, 0));
    }

    assert_int_equal(call_tool(&e, "memory_retrieve", "u1",
                               "{\"query\": \"jasmine tea\"}", NULL, 65536, 1,
                               &text),
                     0);
    j = parse(text);
    assert_string_equal(json_string_value(json_object_get(j, "order")),
                        "best match first");
    mems = json_object_get(j, "memories");
    assert_int_equal(json_array_size(mems), 2);
    assert_int_equal(json_integer_value(json_object_get(j, "count")), 2);
    assert_string_equal(item_str(mems, 0, "id"), best);
    assert_string_equal(item_str(mems, 0, "content"),
                        "The user drinks jasmine tea, jasmine only");
    /* A date the model can read: 2025-01-02T10:00:00Z. */
    assert_int_equal(strlen(item_str(mems, 0, "created")), 20);
    assert_int_equal(item_str(mems, 0, "created")[10], 'T');
    assert_null(strstr(text, "u2 loves"));
    json_decref(j);
    free(text);

    /* No query: most recent first; a limit. */
    assert_int_equal(call_tool(&e, "memory_retrieve", "u1", "{\"limit\": 2}",
                               NULL, 65536, 1, &text),
                     0);
    j = parse(text);
    assert_string_equal(json_string_value(json_object_get(j, "order")),
                        "most recent first");
    assert_int_equal(json_array_size(json_object_get(j, "memories")), 2);
    json_decref(j);
    free(text);
    assert_int_equal(call_tool(&e, "memory_retrieve", "u1", "{\"limit\": 3.0}",
                               NULL, 65536, 1, &text),
                     0);
    free(text);
    assert_int_equal(call_tool(&e, "memory_retrieve", "u1", NULL, NULL, 65536,
                               0, &text),
                     0);
    j = parse(text);
    assert_int_equal(json_array_size(json_object_get(j, "memories")), 3);
    json_decref(j);
    free(text);

    /* Another user, and a user with nothing yet. */
    assert_int_equal(call_tool(&e, "memory_retrieve", "u3",
                               "{\"query\": \"jasmine\"}", NULL, 65536, 1,
                               &text),
                     0);
    j = parse(text);
    assert_int_equal(json_integer_value(json_object_get(j, "count")), 0);
    assert_non_null(json_string_value(json_object_get(j, "note")));
    json_decref(j);
    free(text);

    /* Bad limits and queries are results, not crashes. */
    {
        static const char *const bad[] = {
            "{\"limit\": 0}", "{\"limit\": 51}", "{\"limit\": 2.5}",
            "{\"limit\": \"3\"}", "{\"limit\": 1e300}", "{\"query\": 3}"};
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            assert_int_equal(call_tool(&e, "memory_retrieve", "u1", bad[i],
                                       NULL, 65536, 0, &text),
                             LOOM_EINVALID);
            assert_true(strstr(text, "`limit`") || strstr(text, "`query`"));
            free(text);
        }
    }
    /* No user. */
    assert_true(call_tool(&e, "memory_retrieve", NULL, "{}", NULL, 65536, 1,
                          &text) < 0);
    assert_non_null(strstr(text, "signed-in user"));
    free(text);
    free(best);
    env_close(&e);
}

/* A result larger than the run's allowance keeps what fits, and says so. */
static void test_tool_retrieve_fits(void **state)
{
    tool_env e;
    char *text, *big;
    json_t *j;
    size_t shown;

    (void)state;
    env_open(&e, "mem_tfit.db");
    for (int i = 0; i < 5; i++) {
        big = text_of(1000);
        big[0] = (char)('a' + i); /* distinct texts */
        free(add_ok(e.st, "u1", big, 0));
        free(big);
    }
    assert_int_equal(call_tool(&e, "memory_retrieve", "u1", "{}", NULL, 2600,
                               1, &text),
                     0);
    assert_true(strlen(text) <= 2600);
    j = parse(text);
    shown = json_array_size(json_object_get(j, "memories"));
    assert_true(shown >= 1 && shown < 5);
    assert_int_equal(json_integer_value(json_object_get(j, "count")), shown);
    assert_int_equal(json_integer_value(json_object_get(j, "omitted")),
                     5 - shown);
    json_decref(j);
    free(text);
    env_close(&e);
}

static void test_offered(void **state)
{
    json_t *off = parse("{\"memory\": false}");
    json_t *off2 = parse("{\"memory\": {\"enabled\": false}}");
    json_t *on = parse("{\"memory\": {\"enabled\": true}, \"theme\": \"x\"}");
    json_t *other = parse("{\"theme\": \"dark\"}");
    json_t *bad = parse("{\"memory\": \"no\"}");
    json_t *bad2 = parse("[1]");
    json_t *tools_off = parse("{\"memory_store\": {\"enabled\": false}, "
                              "\"get_time\": {}}");

    (void)state;
    assert_int_equal(loom_memory_enabled(NULL), 1);
    assert_int_equal(loom_memory_enabled(json_true()), 1);
    assert_int_equal(loom_memory_enabled(json_false()), 0);
    assert_int_equal(loom_memory_enabled(off), 0);
    assert_int_equal(loom_memory_enabled(off2), 0);
    assert_int_equal(loom_memory_enabled(on), 1);
    assert_int_equal(loom_memory_enabled(other), 1);
    assert_int_equal(loom_memory_enabled(bad), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "memory must be true or false"));
    assert_int_equal(loom_memory_enabled(bad2), LOOM_EINVALID);

    assert_int_equal(loom_memory_is_tool("memory_store"), 1);
    assert_int_equal(loom_memory_is_tool("memory_retrieve"), 1);
    assert_int_equal(loom_memory_is_tool("get_time"), 0);
    assert_int_equal(loom_memory_is_tool(NULL), 0);

    /* Other tools are always offered. */
    assert_int_equal(
        loom_memory_tool_offered("get_time", NULL, off, off, NULL), 1);
    /* Memory tools: a user, and nobody turning it off. */
    assert_int_equal(
        loom_memory_tool_offered("memory_store", "u1", NULL, NULL, NULL), 1);
    assert_int_equal(
        loom_memory_tool_offered("memory_store", NULL, NULL, NULL, NULL), 0);
    assert_int_equal(
        loom_memory_tool_offered("memory_store", "", NULL, NULL, NULL), 0);
    assert_int_equal(loom_memory_tool_offered("memory_retrieve", "u1", off,
                                              NULL, NULL),
                     0);
    assert_int_equal(loom_memory_tool_offered("memory_retrieve", "u1", NULL,
                                              off2, NULL),
                     0);
    assert_int_equal(loom_memory_tool_offered("memory_retrieve", "u1", on,
                                              other, tools_off),
                     1);
    assert_int_equal(loom_memory_tool_offered("memory_store", "u1", on, other,
                                              tools_off),
                     0);
    assert_true(loom_memory_tool_offered("memory_store", "u1", bad, NULL,
                                         NULL) != 1);
    json_decref(off);
    json_decref(off2);
    json_decref(on);
    json_decref(other);
    json_decref(bad);
    json_decref(bad2);
    json_decref(tools_off);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_count_delete),
        cmocka_unit_test(test_dedup),
        cmocka_unit_test(test_ranked_search),
        cmocka_unit_test(test_recent_first),
        cmocka_unit_test(test_query_injection),
        cmocka_unit_test(test_isolation),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_migration_from_v3),
        cmocka_unit_test(test_index_in_step),
        cmocka_unit_test(test_threads_dedup),
        cmocka_unit_test(test_tool_registration),
        cmocka_unit_test(test_tool_store),
        cmocka_unit_test(test_tool_retrieve),
        cmocka_unit_test(test_tool_retrieve_fits),
        cmocka_unit_test(test_offered),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
