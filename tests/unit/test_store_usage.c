/*
 * Unit tests of usage sums in the store (loom_store_usage, the usage
 * rows' account): every saved usage row carries its owner and account,
 * a sub-agent's rows included; sums and groups equal what SQL over the
 * raw file says; filters narrow, the range is [from, to); unpriced rows
 * are counted apart and add nothing to the cost; each limit answers
 * exactly at it and refuses one past it; bad queries and accounts are
 * refused; and the migration gives older rows their conversation's
 * owner and its parts.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "loom/store.h"
#include "store/sqlite_internal.h"
#include "store_fixture.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_int_t jint(const json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}

static const char *jstr(const json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

/* Saves one top-level turn of two model calls (the second unpriced when
 * unpriced is set) for owner and account, with its run id. */
static void save(loom_store *st, const char *run_id, const char *owner,
                 loom_usage_account acc, const char *model, int unpriced)
{
    loom_messages in = {0}, out = {0};
    loom_turn_usage u[2];
    loom_turn_record rec;
    char *conv = test_conversation_create_ok(st);

    memset(u, 0, sizeof(u));
    for (int i = 0; i < 2; i++) {
        u[i].iteration = i + 1;
        u[i].usage.prompt_tokens = 100 + i;
        u[i].usage.completion_tokens = 10 + i;
        u[i].usage.cached_tokens = 3;
        u[i].usage.reasoning_tokens = 2;
        u[i].usage.cache_write_tokens = 1;
        u[i].usage.total_tokens = 110 + 2 * i;
        u[i].usage.cost_micros = 1000 + i;
        u[i].cost = (double)(1000 + i) / 1e6;
        u[i].model = model;
    }
    if (unpriced)
        u[1].cost = -1;
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "hi"), 0);
    assert_int_equal(loom_messages_add_assistant(&out, "hello", NULL, NULL, 0),
                     0);
    memset(&rec, 0, sizeof(rec));
    rec.conversation_id = conv;
    rec.run_id = run_id;
    rec.user_id = owner;
    rec.agent = "main";
    rec.model = "fake/m";
    rec.input = &in;
    rec.output = &out;
    rec.usage = u;
    rec.usage_len = 2;
    rec.cost = -1;
    rec.account = acc;
    assert_int_equal(loom_store_save_turn(st, &rec), 0);
    loom_messages_free(&in);
    loom_messages_free(&out);
    free(conv);
}

static json_t *sum(loom_store *st, const loom_usage_query *q)
{
    json_t *out = NULL;

    if (loom_store_usage(st, q, &out) != 0)
        fail_msg("usage: %s", loom_error_last());
    return out;
}

static const loom_usage_account alice = {"k_alice", "acme", "alice", NULL};
static const loom_usage_account svc_u1 = {"k_svc", "acme", "svc", "u1"};
static const loom_usage_account svc_u2 = {"k_svc", "acme", "svc", "u2"};

/* Three owners' rows, and what SQL says of them. */
static void test_sums_match_sql(void **state)
{
    char *path = test_db_path("usage-sums.db");
    loom_store *st = test_store_open_ok(path);
    loom_usage_query q = {.version = LOOM_USAGE_QUERY_VERSION};
    const loom_usage_account none = {0};
    const json_t *g;
    json_t *out;

    (void)state;
    save(st, "run_1", "acme/alice", alice, "fake/m", 0);
    save(st, "run_2", "acme/alice", alice, "fake/other", 1);
    save(st, "run_3", "acme/svc/u1", svc_u1, "fake/m", 0);
    save(st, "run_4", "acme/svc/u2", svc_u2, "fake/m", 0);
    save(st, "run_5", NULL, none, "fake/m", 0);
    /* The rows say whose they are. */
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM usage WHERE "
                                       "user_id = 'acme/svc/u1' AND key_id = "
                                       "'k_svc' AND workspace = 'acme' AND "
                                       "user_name = 'svc' AND end_user = 'u1'"),
                     2);

    /* Everything, one group. */
    out = sum(st, &q);
    assert_int_equal(json_array_size(json_object_get(out, "data")), 1);
    g = json_object_get(out, "total");
    assert_int_equal(jint(g, "calls"),
                     test_db_int(path, "SELECT count(*) FROM usage"));
    assert_int_equal(jint(g, "prompt_tokens"),
                     test_db_int(path, "SELECT sum(prompt_tokens) FROM usage"));
    assert_int_equal(jint(g, "completion_tokens"),
                     test_db_int(path, "SELECT sum(completion_tokens) FROM "
                                       "usage"));
    assert_int_equal(jint(g, "cached_tokens"), 30);
    assert_int_equal(jint(g, "reasoning_tokens"), 20);
    assert_int_equal(jint(g, "cache_write_tokens"), 10);
    assert_int_equal(jint(g, "total_tokens"),
                     test_db_int(path, "SELECT sum(total_tokens) FROM usage"));
    assert_int_equal(jint(g, "unpriced_calls"), 1);
    assert_int_equal(jint(g, "cost_micros"),
                     test_db_int(path, "SELECT sum(cost_micros) FROM usage"));
    assert_int_equal(jint(g, "cost_micros"), 5 * 1000 + 4 * 1001);
    json_decref(out);

    /* By user: the owner and its parts; the anonymous rows too. */
    q.group_by[0] = LOOM_USAGE_BY_USER;
    q.group_by_len = 1;
    out = sum(st, &q);
    assert_int_equal(json_array_size(json_object_get(out, "data")), 4);
    g = test_usage_group(out, "user_id", "acme/svc/u1");
    assert_string_equal(jstr(g, "workspace"), "acme");
    assert_string_equal(jstr(g, "user"), "svc");
    assert_string_equal(jstr(g, "end_user"), "u1");
    assert_int_equal(jint(g, "calls"), 2);
    g = test_usage_group(out, "user_id", "acme/alice");
    assert_true(json_is_null(json_object_get(g, "end_user")));
    assert_int_equal(jint(g, "calls"), 4);
    assert_int_equal(jint(g, "unpriced_calls"), 1);
    assert_int_equal(jint(g, "cost_micros"),
                     test_db_int(path, "SELECT sum(cost_micros) FROM usage "
                                       "WHERE user_id = 'acme/alice'"));
    /* Nulls first. */
    assert_true(json_is_null(json_object_get(
        json_array_get(json_object_get(out, "data"), 0), "user_id")));
    json_decref(out);

    /* By key and model, narrowed to a service's account. */
    q.group_by[0] = LOOM_USAGE_BY_KEY;
    q.group_by[1] = LOOM_USAGE_BY_MODEL;
    q.group_by_len = 2;
    q.workspace = "acme";
    q.user = "svc";
    out = sum(st, &q);
    assert_int_equal(json_array_size(json_object_get(out, "data")), 1);
    g = test_usage_group(out, "key_id", "k_svc");
    assert_string_equal(jstr(g, "model"), "fake/m");
    assert_int_equal(jint(g, "calls"), 4);
    json_decref(out);

    /* One owner; a key; an account nobody has. */
    memset(&q, 0, sizeof(q));
    q.user_id = "acme/alice";
    q.group_by[0] = LOOM_USAGE_BY_MODEL;
    q.group_by[1] = LOOM_USAGE_BY_AGENT;
    q.group_by_len = 2;
    out = sum(st, &q);
    assert_int_equal(
        jint(test_usage_group(out, "model", "fake/other"), "calls"), 2);
    assert_string_equal(
        jstr(test_usage_group(out, "model", "fake/other"), "agent"), "main");
    assert_int_equal(jint(json_object_get(out, "total"), "calls"), 4);
    json_decref(out);
    memset(&q, 0, sizeof(q));
    q.key_id = "k_alice";
    out = sum(st, &q);
    assert_int_equal(jint(json_object_get(out, "total"), "calls"), 4);
    json_decref(out);
    q.key_id = "k_nobody";
    q.group_by[0] = LOOM_USAGE_BY_KEY;
    q.group_by_len = 1;
    out = sum(st, &q);
    assert_int_equal(json_array_size(json_object_get(out, "data")), 0);
    assert_int_equal(jint(json_object_get(out, "total"), "calls"), 0);
    json_decref(out);

    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

/* [from, to) over the rows' times, set by hand in the file. */
static void test_range(void **state)
{
    char *path = test_db_path("usage-range.db");
    loom_store *st = test_store_open_ok(path);
    loom_usage_query q = {0};
    json_t *out = NULL;

    (void)state;
    save(st, "run_1", "acme/alice", alice, "fake/m", 0);
    save(st, "run_2", "acme/alice", alice, "fake/m", 0);
    test_db_exec(path, "UPDATE usage SET created_at = 1000 * id");
    q.from_ms = 2000;
    q.to_ms = 4000;
    out = sum(st, &q);
    assert_int_equal(jint(json_object_get(out, "total"), "calls"), 2);
    json_decref(out);
    q.to_ms = 2000; /* empty */
    out = sum(st, &q);
    assert_int_equal(jint(json_object_get(out, "total"), "calls"), 0);
    json_decref(out);
    q.from_ms = 4000;
    q.to_ms = 0; /* no end */
    out = sum(st, &q);
    assert_int_equal(jint(json_object_get(out, "total"), "calls"), 1);
    json_decref(out);

    q.to_ms = 3999;
    assert_int_equal(loom_store_usage(st, &q, &out), LOOM_EINVALID);
    q.to_ms = 0;
    q.group_by[0] = LOOM_USAGE_BY_AGENT;
    q.group_by[1] = LOOM_USAGE_BY_AGENT;
    q.group_by_len = 2;
    assert_int_equal(loom_store_usage(st, &q, &out), LOOM_EINVALID);
    q.group_by_len = 1;
    q.group_by[0] = (loom_usage_group)0;
    assert_int_equal(loom_store_usage(st, &q, &out), LOOM_EINVALID);
    assert_null(out);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

/* Each limit: exactly at it answers, one past it is LOOM_ETOOLARGE. */
static void test_limits(void **state)
{
    char *path = test_db_path("usage-limits.db");
    loom_store *st = test_store_open_ok(path);
    loom_usage_query q = {0};
    json_t *out = NULL;
    char run[16];

    (void)state;
    for (int i = 0; i < 3; i++) {
        snprintf(run, sizeof(run), "run_%d", i);
        save(st, run, "acme/alice", alice, i ? "fake/m" : "fake/other", 0);
    }
    /* 6 rows, in 2 models. */
    q.max_rows = 6;
    out = sum(st, &q);
    assert_int_equal(jint(json_object_get(out, "total"), "calls"), 6);
    json_decref(out);
    q.max_rows = 5;
    assert_int_equal(loom_store_usage(st, &q, &out), LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "more than 5 model calls"));
    q.max_rows = 0;
    q.group_by[0] = LOOM_USAGE_BY_MODEL;
    q.group_by_len = 1;
    q.max_groups = 2;
    out = sum(st, &q);
    assert_int_equal(json_array_size(json_object_get(out, "data")), 2);
    json_decref(out);
    q.max_groups = 1;
    assert_int_equal(loom_store_usage(st, &q, &out), LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "more than 1 groups"));
    assert_null(out);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

/* An account string past the limit, or empty, is refused whole. */
static void test_bad_account(void **state)
{
    char *path = test_db_path("usage-bad.db");
    loom_store *st = test_store_open_ok(path);
    char *conv = test_conversation_create_ok(st);
    char long_name[LOOM_STORE_USER_ID_MAX + 2];
    loom_messages in = {0};
    loom_turn_record rec;

    (void)state;
    memset(long_name, 'a', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "hi"), 0);
    memset(&rec, 0, sizeof(rec));
    rec.conversation_id = conv;
    rec.input = &in;
    rec.account.end_user = long_name;
    assert_int_equal(loom_store_save_turn(st, &rec), LOOM_EINVALID);
    rec.account.end_user = NULL;
    rec.account.key_id = "";
    assert_int_equal(loom_store_save_turn(st, &rec), LOOM_EINVALID);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages"), 0);
    /* The same turn with a fitting account is stored. */
    rec.account.key_id = "k1";
    assert_int_equal(loom_store_save_turn(st, &rec), 0);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages"), 2);
    loom_messages_free(&in);
    free(conv);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

/* Rows from before the migration get their conversation's owner and,
 * when it reads so, its workspace, user and end user. */
static void test_migration_backfill(void **state)
{
    char *path = test_db_path("usage-migrate.db");
    loom_store *st = NULL;
    const int before = 15; /* the schema before migration 16 */

    (void)state;
    assert_int_equal(loom__store_sqlite_open_version(&st, path, before), 0);
    loom_store_free(st);
    test_db_exec(
        path,
        "INSERT INTO conversations (id, created_at, updated_at, user_id) "
        "VALUES ('c_user', 1, 1, 'acme/alice'), ('c_end', 1, 1, "
        "'acme/svc/u1'), ('c_plain', 1, 1, 'bob'), ('c_hash', 1, 1, "
        "'~0123abcd'), ('c_anon', 1, 1, NULL);"
        "INSERT INTO usage (conversation_id, run_id, iteration, "
        "prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens, "
        "total_tokens, cost_micros, created_at) VALUES "
        "('c_user', 'r1', 1, 5, 1, 0, 0, 6, 7, 1),"
        "('c_user', 'r1_child', 1, 5, 1, 0, 0, 6, NULL, 1),"
        "('c_end', 'r2', 1, 5, 1, 0, 0, 6, 7, 1),"
        "('c_plain', 'r3', 1, 5, 1, 0, 0, 6, 7, 1),"
        "('c_hash', 'r4', 1, 5, 1, 0, 0, 6, 7, 1),"
        "('c_anon', 'r5', 1, 5, 1, 0, 0, 6, 7, 1);");
    st = test_store_open_ok(path);
    assert_int_equal(loom_store_schema_version(st),
                     loom__sqlite_migrations_len);
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM usage WHERE "
                                       "user_id = 'acme/alice' AND workspace "
                                       "= 'acme' AND user_name = 'alice' AND "
                                       "end_user IS NULL AND key_id IS NULL"),
                     2);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM usage WHERE "
                                       "user_id = 'acme/svc/u1' AND workspace "
                                       "= 'acme' AND user_name = 'svc' AND "
                                       "end_user = 'u1'"),
                     1);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM usage WHERE "
                                       "user_id = 'bob' AND workspace IS NULL "
                                       "AND user_name = 'bob'"),
                     1);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM usage WHERE "
                                       "user_id = '~0123abcd' AND workspace "
                                       "IS NULL AND user_name IS NULL AND "
                                       "end_user IS NULL"),
                     1);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM usage WHERE "
                                       "run_id = 'r5' AND user_id IS NULL AND "
                                       "user_name IS NULL"),
                     1);
    test_db_remove(path);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sums_match_sql),
        cmocka_unit_test(test_range),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_bad_account),
        cmocka_unit_test(test_migration_backfill),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
