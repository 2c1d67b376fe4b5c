/*
 * Unit tests of the store (loom/store.h) on its SQLite backend.
 *
 * Each test works on its own database file under the test folder. They
 * cover the API (create, info, list with pagination, get, delete with
 * its cascade, load_history), what a turn becomes in the database (tool
 * calls with text offsets, tool outcomes, usage, status of failed and
 * cancelled turns, the placeholder of a turn without an answer), the
 * limits, schema versions (migration from nothing and from version 1, a
 * newer schema refused), a full disk (PRAGMA max_page_count) leaving
 * nothing half-written, 16 threads writing at once, and a writer killed
 * with SIGKILL mid-run whose committed turns must all survive. Raw SQLite
 * is used only to look at the file from outside.
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

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- helpers ---- */

static int is_id(const char *id, const char *prefix)
{
    size_t n = strlen(prefix);

    if (!id || strncmp(id, prefix, n) != 0 || strlen(id) != n + 24)
        return 0;
    for (size_t i = n; id[i]; i++)
        if (!strchr("0123456789abcdef", id[i]))
            return 0;
    return 1;
}

static const char *jstr(const json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

static json_int_t jint(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);

    assert_true(json_is_integer(v));
    return json_integer_value(v);
}

static int jnull(const json_t *o, const char *k)
{
    return json_is_null(json_object_get(o, k));
}

/* A simple turn: one user message in, one assistant answer out. */
typedef struct {
    loom_messages in, out;
    loom_turn_record turn;
} simple_turn;

static void simple_init(simple_turn *t, const char *conv, const char *user,
                        const char *answer)
{
    memset(t, 0, sizeof(*t));
    assert_int_equal(loom_messages_add(&t->in, LOOM_ROLE_USER, user), 0);
    if (answer)
        assert_int_equal(
            loom_messages_add_assistant(&t->out, answer, NULL, NULL, 0), 0);
    t->turn.conversation_id = conv;
    t->turn.run_id = "run_simple";
    t->turn.model = "fake/m1";
    t->turn.input = &t->in;
    t->turn.output = &t->out;
    t->turn.finish_reason = "stop";
    t->turn.cost = -1;
}

static void simple_free(simple_turn *t)
{
    loom_messages_free(&t->in);
    loom_messages_free(&t->out);
}

static void save_simple(loom_store *st, const char *conv, const char *user,
                        const char *answer)
{
    simple_turn t;

    simple_init(&t, conv, user, answer);
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    simple_free(&t);
}

static int streq_opt(const char *a, const char *b)
{
    if (!a || !b)
        return a == b;
    return strcmp(a, b) == 0;
}

/* Every field of two message lists is the same. */
static void assert_messages_equal(const loom_messages *a, const loom_message
                                  *b, size_t blen)
{
    assert_int_equal(a->len, blen);
    for (size_t i = 0; i < blen; i++) {
        const loom_message *x = &a->items[i], *y = &b[i];
        assert_int_equal(x->role, y->role);
        assert_true(streq_opt(x->content, y->content));
        assert_true(streq_opt(x->reasoning, y->reasoning));
        assert_true(streq_opt(x->tool_call_id, y->tool_call_id));
        assert_true(streq_opt(x->name, y->name));
        assert_true(streq_opt(x->provider_state, y->provider_state));
        assert_int_equal(x->tool_calls_len, y->tool_calls_len);
        for (size_t k = 0; k < y->tool_calls_len; k++) {
            assert_string_equal(x->tool_calls[k].id, y->tool_calls[k].id);
            assert_string_equal(x->tool_calls[k].name,
                                y->tool_calls[k].name);
            assert_string_equal(x->tool_calls[k].arguments,
                                y->tool_calls[k].arguments);
        }
    }
}

/* ---- the rich turn used by several tests ---- */

typedef struct {
    loom_messages in, out;
    loom_turn_tool tools[2];
    loom_turn_call calls[2];
    loom_turn_usage usage[2];
    loom_turn_record turn;
} rich_turn;

static void rich_init(rich_turn *r, const char *conv)
{
    loom_tool_call calls[2] = {
        {"call_1", "get_weather", "{\"city\":\"Paris\"}"},
        {"call_2", "get_time", "{}"},
    };

    memset(r, 0, sizeof(*r));
    assert_int_equal(loom_messages_add(&r->in, LOOM_ROLE_USER,
                                       "What's the weather in Paris?"),
                     0);
    assert_int_equal(loom_messages_add_assistant(&r->out, "Let me check.",
                                                 "The user wants weather.",
                                                 calls, 2),
                     0);
    /* What the adapter needs back next turn (a thinking signature). */
    r->out.items[0].provider_state =
        strdup("{\"anthropic\":{\"blocks\":[{\"type\":\"thinking\","
               "\"signature\":\"c2ln\"}]}}");
    assert_non_null(r->out.items[0].provider_state);
    assert_int_equal(loom_messages_add_tool_result(&r->out, "call_1",
                                                   "get_weather", "sunny"),
                     0);
    assert_int_equal(loom_messages_add_tool_result(&r->out, "call_2",
                                                   "get_time", "Error: boom"),
                     0);
    assert_int_equal(loom_messages_add_assistant(&r->out, "It is sunny.",
                                                 NULL, NULL, 0),
                     0);
    /* Outcomes listed out of order: matched by id, not position. */
    r->tools[0] = (loom_turn_tool){"call_2", 1, 3.0};
    r->tools[1] = (loom_turn_tool){"call_1", 0, 12.5};
    r->calls[0] = (loom_turn_call){"call_1", 13};
    r->calls[1] = (loom_turn_call){"call_2", 13};
    r->usage[0].iteration = 1;
    r->usage[0].usage = (loom_usage){.prompt_tokens = 10,
                                     .completion_tokens = 5,
                                     .cached_tokens = 2,
                                     .reasoning_tokens = 1,
                                     .total_tokens = 15,
                                     .cache_write_tokens = 3,
                                     .cost_micros = 1000};
    r->usage[0].cost = 0.001;
    r->usage[1].iteration = 2;
    r->usage[1].usage = (loom_usage){.prompt_tokens = 30,
                                     .completion_tokens = 7,
                                     .total_tokens = 37};
    r->usage[1].cost = -1;
    r->turn.conversation_id = conv;
    r->turn.run_id = "run_1";
    r->turn.agent = "helper";
    r->turn.model = "fake/m1";
    r->turn.input = &r->in;
    r->turn.output = &r->out;
    r->turn.status = LOOM_TURN_OK;
    r->turn.finish_reason = "stop";
    r->turn.tools = r->tools;
    r->turn.tools_len = 2;
    r->turn.calls = r->calls;
    r->turn.calls_len = 2;
    r->turn.usage = r->usage;
    r->turn.usage_len = 2;
    r->turn.cost = 0.5;
}

static void rich_free(rich_turn *r)
{
    loom_messages_free(&r->in);
    loom_messages_free(&r->out);
}

/* ---- tests ---- */

static void test_names(void **state)
{
    (void)state;
    assert_string_equal(loom_turn_status_name(LOOM_TURN_OK), "ok");
    assert_string_equal(loom_turn_status_name(LOOM_TURN_ERROR), "error");
    assert_string_equal(loom_turn_status_name(LOOM_TURN_CANCELLED),
                        "cancelled");
    assert_string_equal(loom_turn_status_name((loom_turn_record_status)42),
                        "error");
    loom_conversation_info_clear(NULL);
}

static void test_open_creates_folders_wal_schema(void **state)
{
    char *dir = test_db_path("nested"), *path, *loc;
    loom_store *st;
    size_t n;

    (void)state;
    n = strlen(dir) + 64;
    path = malloc(n);
    loc = malloc(n);
    assert_non_null(path);
    assert_non_null(loc);
    snprintf(path, n, "%s/a/b/loom.db", dir);
    snprintf(loc, n, "sqlite:%s", path);
    st = test_store_open_ok(loc);
    assert_int_equal(loom_store_schema_version(st),
                     loom__sqlite_migrations_len);
    assert_int_equal(loom_store_ping(st), 0);
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "PRAGMA user_version"),
                     loom__sqlite_migrations_len);
    /* WAL is stored in the file: a plain connection sees it. */
    {
        sqlite3 *db;
        sqlite3_stmt *s;
        assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
        assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1,
                                            &s, NULL),
                         SQLITE_OK);
        assert_int_equal(sqlite3_step(s), SQLITE_ROW);
        assert_string_equal((const char *)sqlite3_column_text(s, 0), "wal");
        sqlite3_finalize(s);
        sqlite3_close(db);
    }
    test_db_remove(path);
    snprintf(path, n, "%s/a/b", dir);
    rmdir(path);
    snprintf(path, n, "%s/a", dir);
    rmdir(path);
    rmdir(dir);
    free(path);
    free(loc);
    free(dir);
}

static void test_open_errors(void **state)
{
    char *file = test_db_path("plainfile"), *path;
    loom_store *st = (loom_store *)1;
    size_t n = strlen(file) + 32;

    (void)state;
    assert_int_equal(loom_store_open(&st, "postgres://db/loom"),
                     LOOM_EINVALID);
    assert_null(st);
    assert_non_null(strstr(loom_error_last(), "PostgreSQL"));
    assert_int_equal(loom_store_open(&st, ":memory:"), LOOM_EINVALID);
    assert_int_equal(loom_store_open(&st, "sqlite:"), LOOM_EINVALID);
    assert_int_equal(loom_store_open(NULL, "x.db"), LOOM_EINVALID);

    /* A folder where a regular file stands. */
    {
        char junk[300];
        memset(junk, 'x', sizeof(junk));
        assert_int_equal(test_write_file(file, junk, sizeof(junk)), 0);
    }
    path = malloc(n);
    assert_non_null(path);
    snprintf(path, n, "%s/sub/loom.db", file);
    assert_int_equal(loom_store_open(&st, path), LOOM_EIO);
    assert_null(st);
    assert_non_null(strstr(loom_error_last(), path));

    /* A file that is not a database. */
    assert_int_equal(loom_store_open(&st, file), LOOM_EIO);
    assert_null(st);
    assert_non_null(strstr(loom_error_last(), file));
    assert_non_null(strstr(loom_error_last(), "not a database"));
    unlink(file);
    free(path);
    free(file);
}

static void test_create_info(void **state)
{
    char *path = test_db_path("info.db"), *id;
    loom_conversation_info info;
    loom_store *st = test_store_open_ok(path);
    int64_t before = 0, after;
    struct timespec ts;

    (void)state;
    clock_gettime(CLOCK_REALTIME, &ts);
    before = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    id = test_conversation_create_ok(st);
    clock_gettime(CLOCK_REALTIME, &ts);
    after = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    assert_true(is_id(id, "conv_"));
    assert_int_equal(loom_store_conversation_info(st, id, &info), 0);
    assert_string_equal(info.id, id);
    assert_string_equal(info.title, "");
    assert_null(info.agent);
    assert_null(info.model);
    assert_int_equal(info.message_count, 0);
    assert_true(info.created_at >= before && info.created_at <= after);
    assert_int_equal(info.updated_at, info.created_at);
    loom_conversation_info_clear(&info);
    assert_null(info.id);

    assert_int_equal(loom_store_conversation_info(st, "conv_nope", &info),
                     LOOM_ENOTFOUND);
    assert_non_null(strstr(loom_error_last(), "conv_nope"));
    free(id);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

/* Compares by (updated_at, id), newest first. */
static int newest_first(const void *a, const void *b)
{
    const loom_conversation_info *x = a, *y = b;

    if (x->updated_at != y->updated_at)
        return x->updated_at > y->updated_at ? -1 : 1;
    return -strcmp(x->id, y->id);
}

static void test_list_pagination(void **state)
{
    char *path = test_db_path("list.db"), *ids[5];
    loom_conversation_info infos[5];
    loom_store *st = test_store_open_ok(path);
    const char *after = NULL;
    char *after_copy = NULL;
    json_t *page;
    size_t seen = 0;

    (void)state;
    for (int i = 0; i < 5; i++) {
        ids[i] = test_conversation_create_ok(st);
        assert_int_equal(loom_store_conversation_info(st, ids[i], &infos[i]),
                         0);
    }
    qsort(infos, 5, sizeof(infos[0]), newest_first);
    /* Pages of 2: 2, 2, 1, in (updated_at, id) order. */
    for (int pg = 0; pg < 3; pg++) {
        json_t *data, *item;
        size_t k;
        assert_int_equal(loom_store_conversation_list(st, after, 2, &page),
                         0);
        data = json_object_get(page, "data");
        assert_int_equal(json_array_size(data), pg < 2 ? 2 : 1);
        json_array_foreach(data, k, item)
        {
            assert_string_equal(jstr(item, "id"), infos[seen].id);
            assert_int_equal(jint(item, "updated_at"), infos[seen].updated_at);
            assert_int_equal(jint(item, "message_count"), 0);
            assert_string_equal(jstr(item, "title"), "");
            assert_true(jnull(item, "agent"));
            seen++;
        }
        assert_int_equal(json_is_true(json_object_get(page, "has_more")),
                         pg < 2);
        if (pg < 2)
            assert_string_equal(jstr(page, "next"), infos[seen - 1].id);
        else
            assert_true(jnull(page, "next"));
        free(after_copy);
        after_copy = pg < 2 ? strdup(jstr(page, "next")) : NULL;
        after = after_copy;
        json_decref(page);
    }
    assert_int_equal(seen, 5);

    /* A turn moves the oldest to the top. Every conversation's last change
     * goes a second back first, so the turn's is the newest whatever the
     * clock's resolution (their order among themselves stays). */
    test_db_exec(path, "UPDATE conversations SET updated_at = updated_at - "
                       "1000");
    save_simple(st, infos[4].id, "hello", "hi");
    assert_int_equal(loom_store_conversation_list(st, NULL, 100, &page), 0);
    assert_int_equal(json_array_size(json_object_get(page, "data")), 5);
    assert_string_equal(
        jstr(json_array_get(json_object_get(page, "data"), 0), "id"),
        infos[4].id);
    assert_false(json_is_true(json_object_get(page, "has_more")));
    json_decref(page);

    /* Limits and an unknown cursor. */
    page = (json_t *)1;
    assert_int_equal(loom_store_conversation_list(st, NULL, 0, &page),
                     LOOM_EINVALID);
    assert_null(page);
    assert_int_equal(loom_store_conversation_list(st, NULL, 101, &page),
                     LOOM_EINVALID);
    assert_int_equal(loom_store_conversation_list(st, "conv_gone", 10, &page),
                     LOOM_ENOTFOUND);
    assert_null(page);

    for (int i = 0; i < 5; i++) {
        loom_conversation_info_clear(&infos[i]);
        free(ids[i]);
    }
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

static void test_save_turn_get_json(void **state)
{
    char *path = test_db_path("get.db"), *id;
    loom_store *st = test_store_open_ok(path);
    json_t *j, *msgs, *m, *calls, *usage;
    rich_turn r;

    (void)state;
    id = test_conversation_create_ok(st);
    rich_init(&r, id);
    assert_int_equal(loom_store_save_turn(st, &r.turn), 0);
    j = test_conversation_get_ok(st, id);
    assert_string_equal(jstr(j, "id"), id);
    assert_string_equal(jstr(j, "title"), "What's the weather in Paris?");
    assert_string_equal(jstr(j, "agent"), "helper");
    assert_string_equal(jstr(j, "model"), "fake/m1");
    assert_int_equal(jint(j, "message_count"), 5);
    msgs = json_object_get(j, "messages");
    assert_int_equal(json_array_size(msgs), 5);

    m = json_array_get(msgs, 0);
    assert_true(is_id(jstr(m, "id"), "msg_"));
    assert_string_equal(jstr(m, "role"), "user");
    assert_string_equal(jstr(m, "content"), "What's the weather in Paris?");
    assert_string_equal(jstr(m, "status"), "ok");
    assert_string_equal(jstr(m, "run_id"), "run_1");
    assert_true(jnull(m, "model"));
    assert_true(jnull(m, "reasoning"));
    assert_null(json_object_get(m, "tool_calls"));
    assert_null(json_object_get(m, "tool_status"));

    m = json_array_get(msgs, 1);
    assert_string_equal(jstr(m, "role"), "assistant");
    assert_string_equal(jstr(m, "content"), "Let me check.");
    assert_string_equal(jstr(m, "reasoning"), "The user wants weather.");
    assert_string_equal(jstr(m, "model"), "fake/m1");
    assert_string_equal(jstr(m, "status"), "ok");
    assert_true(jnull(m, "finish_reason"));
    assert_true(jnull(m, "prompt_tokens"));
    assert_true(jnull(m, "cost"));
    calls = json_object_get(m, "tool_calls");
    assert_int_equal(json_array_size(calls), 2);
    assert_string_equal(jstr(json_array_get(calls, 0), "id"), "call_1");
    assert_string_equal(jstr(json_array_get(calls, 0), "name"),
                        "get_weather");
    assert_string_equal(jstr(json_array_get(calls, 0), "arguments"),
                        "{\"city\":\"Paris\"}");
    assert_int_equal(jint(json_array_get(calls, 0), "text_offset"), 13);
    assert_string_equal(jstr(json_array_get(calls, 1), "id"), "call_2");
    assert_int_equal(jint(json_array_get(calls, 1), "text_offset"), 13);

    m = json_array_get(msgs, 2);
    assert_string_equal(jstr(m, "role"), "tool");
    assert_string_equal(jstr(m, "content"), "sunny");
    assert_string_equal(jstr(m, "tool_call_id"), "call_1");
    assert_string_equal(jstr(m, "name"), "get_weather");
    assert_string_equal(jstr(m, "tool_status"), "success");
    assert_true(json_real_value(json_object_get(m, "duration_ms")) == 12.5);
    m = json_array_get(msgs, 3);
    assert_string_equal(jstr(m, "tool_call_id"), "call_2");
    assert_string_equal(jstr(m, "tool_status"), "error");
    assert_true(json_real_value(json_object_get(m, "duration_ms")) == 3.0);

    m = json_array_get(msgs, 4);
    assert_string_equal(jstr(m, "role"), "assistant");
    assert_string_equal(jstr(m, "content"), "It is sunny.");
    assert_string_equal(jstr(m, "finish_reason"), "stop");
    assert_string_equal(jstr(m, "status"), "ok");
    assert_true(jnull(m, "error"));
    /* The whole turn's tokens (both calls), beside the turn's cost. */
    assert_int_equal(jint(m, "prompt_tokens"), 40);
    assert_int_equal(jint(m, "completion_tokens"), 12);
    assert_true(json_real_value(json_object_get(m, "cost")) == 0.5);
    /* One usage row is unpriced: the turn's own total, exactly. */
    assert_int_equal(jint(m, "cost_micros"), 500000);
    assert_int_equal(json_array_size(json_object_get(m, "tool_calls")), 0);
    assert_true(jint(m, "created_at") >= jint(j, "created_at"));

    usage = json_object_get(j, "usage");
    assert_int_equal(json_array_size(usage), 2);
    m = json_array_get(usage, 0);
    assert_string_equal(jstr(m, "run_id"), "run_1");
    assert_string_equal(jstr(m, "model"), "fake/m1");
    assert_int_equal(jint(m, "iteration"), 1);
    assert_int_equal(jint(m, "prompt_tokens"), 10);
    assert_int_equal(jint(m, "completion_tokens"), 5);
    assert_int_equal(jint(m, "cached_tokens"), 2);
    assert_int_equal(jint(m, "reasoning_tokens"), 1);
    assert_int_equal(jint(m, "total_tokens"), 15);
    assert_true(json_real_value(json_object_get(m, "cost")) == 0.001);
    assert_int_equal(jint(m, "cost_micros"), 1000);
    assert_int_equal(jint(m, "cache_write_tokens"), 3);
    m = json_array_get(usage, 1);
    assert_int_equal(jint(m, "iteration"), 2);
    assert_int_equal(jint(m, "total_tokens"), 37);
    assert_true(jnull(m, "cost"));
    assert_true(jnull(m, "cost_micros"));
    assert_int_equal(jint(m, "cache_write_tokens"), 0);
    json_decref(j);

    rich_free(&r);
    free(id);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

static void test_load_history_roundtrip(void **state)
{
    char *path = test_db_path("history.db"), *id;
    loom_store *st = test_store_open_ok(path);
    loom_messages want = {0}, got = {0};
    rich_turn r;
    simple_turn s;

    (void)state;
    id = test_conversation_create_ok(st);
    rich_init(&r, id);
    assert_int_equal(loom_store_save_turn(st, &r.turn), 0);
    simple_init(&s, id, "And tomorrow?", "Rain.");
    /* An assistant with only tool calls: content stays NULL. */
    {
        loom_tool_call c = {"call_9", "f", "{\"a\":[1,2]}"};
        loom_messages_free(&s.out);
        assert_int_equal(
            loom_messages_add_assistant(&s.out, NULL, "hmm", &c, 1), 0);
        assert_int_equal(
            loom_messages_add_tool_result(&s.out, "call_9", "f", ""), 0);
        assert_int_equal(
            loom_messages_add_assistant(&s.out, "Rain.", NULL, NULL, 0), 0);
    }
    assert_int_equal(loom_store_save_turn(st, &s.turn), 0);

    assert_int_equal(loom_messages_append(&want, &r.in), 0);
    assert_int_equal(loom_messages_append(&want, &r.out), 0);
    assert_int_equal(loom_messages_append(&want, &s.in), 0);
    assert_int_equal(loom_messages_append(&want, &s.out), 0);
    /* Appended after what out already holds. */
    assert_int_equal(loom_messages_add(&got, LOOM_ROLE_SYSTEM, "sys"), 0);
    assert_int_equal(loom_store_load_history(st, id, &got), 0);
    assert_int_equal(got.len, 1 + want.len);
    assert_string_equal(got.items[0].content, "sys");
    {
        loom_messages tail = {got.items + 1, got.len - 1, got.len - 1};
        assert_messages_equal(&tail, want.items, want.len);
    }
    assert_null(got.items[1 + 6].content);

    loom_messages_free(&got);
    assert_int_equal(loom_store_load_history(st, "conv_missing", &got),
                     LOOM_ENOTFOUND);
    assert_int_equal(got.len, 0);
    loom_messages_free(&want);
    simple_free(&s);
    rich_free(&r);
    free(id);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

static void test_failed_and_cancelled_turns(void **state)
{
    char *path = test_db_path("failed.db"), *id;
    loom_store *st = test_store_open_ok(path);
    loom_messages hist = {0};
    simple_turn t;
    json_t *j, *msgs, *m;

    (void)state;
    id = test_conversation_create_ok(st);

    /* A run that failed after streaming part of its answer. */
    simple_init(&t, id, "Tell me a story", "Once upon a");
    t.turn.status = LOOM_TURN_ERROR;
    t.turn.error = "upstream: 500 Internal Server Error";
    t.turn.finish_reason = NULL;
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    simple_free(&t);

    /* Cancelled while its tools ran: the status lands on the assistant
     * that called them, the last assistant message of the turn. */
    simple_init(&t, id, "Search it", NULL);
    {
        loom_tool_call c = {"call_s", "search", "{}"};
        assert_int_equal(
            loom_messages_add_assistant(&t.out, "Searching", NULL, &c, 1), 0);
        assert_int_equal(loom_messages_add_tool_result(&t.out, "call_s",
                                                       "search", "partial"),
                         0);
    }
    t.turn.status = LOOM_TURN_CANCELLED;
    t.turn.error = "client disconnected";
    t.turn.finish_reason = "tool_calls";
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    simple_free(&t);

    /* Failed before any answer: a placeholder carries the status. */
    simple_init(&t, id, "Anyone there?", NULL);
    t.turn.status = LOOM_TURN_ERROR;
    t.turn.error = "connection refused";
    t.turn.finish_reason = NULL;
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    simple_free(&t);

    j = test_conversation_get_ok(st, id);
    msgs = json_object_get(j, "messages");
    assert_int_equal(json_array_size(msgs), 2 + 3 + 2);
    assert_int_equal(jint(j, "message_count"), 7);
    m = json_array_get(msgs, 1);
    assert_string_equal(jstr(m, "content"), "Once upon a");
    assert_string_equal(jstr(m, "status"), "error");
    assert_string_equal(jstr(m, "error"),
                        "upstream: 500 Internal Server Error");
    m = json_array_get(msgs, 3);
    assert_string_equal(jstr(m, "content"), "Searching");
    assert_string_equal(jstr(m, "status"), "cancelled");
    assert_string_equal(jstr(m, "error"), "client disconnected");
    assert_string_equal(jstr(m, "finish_reason"), "tool_calls");
    m = json_array_get(msgs, 4);
    assert_string_equal(jstr(m, "status"), "ok");
    assert_true(jnull(m, "tool_status"));
    assert_true(jnull(m, "duration_ms"));
    m = json_array_get(msgs, 6);
    assert_string_equal(jstr(m, "role"), "assistant");
    assert_true(jnull(m, "content"));
    assert_string_equal(jstr(m, "status"), "error");
    assert_string_equal(jstr(m, "error"), "connection refused");
    assert_string_equal(jstr(m, "model"), "fake/m1");
    json_decref(j);

    /* History keeps partial answers but not the placeholder. */
    assert_int_equal(loom_store_load_history(st, id, &hist), 0);
    assert_int_equal(hist.len, 6);
    assert_string_equal(hist.items[1].content, "Once upon a");
    assert_int_equal(hist.items[3].tool_calls_len, 1);
    assert_string_equal(hist.items[5].content, "Anyone there?");
    assert_int_equal(hist.items[5].role, LOOM_ROLE_USER);
    loom_messages_free(&hist);

    free(id);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

static void test_unknown_conversation(void **state)
{
    char *path = test_db_path("unknown.db");
    loom_store *st = test_store_open_ok(path);
    json_t *j = (json_t *)1;
    rich_turn r;

    (void)state;
    rich_init(&r, "conv_000000000000000000000000");
    assert_int_equal(loom_store_save_turn(st, &r.turn), LOOM_ENOTFOUND);
    assert_int_equal(loom_store_conversation_get(st, "conv_x", &j),
                     LOOM_ENOTFOUND);
    assert_null(j);
    assert_int_equal(loom_store_conversation_delete(st, "conv_x"),
                     LOOM_ENOTFOUND);
    r.turn.conversation_id = NULL;
    assert_int_equal(loom_store_save_turn(st, &r.turn), LOOM_EINVALID);
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages"), 0);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM usage"), 0);
    rich_free(&r);
    test_db_remove(path);
    free(path);
}

static void test_delete_cascades(void **state)
{
    char *path = test_db_path("delete.db"), *a, *b;
    loom_store *st = test_store_open_ok(path);
    loom_conversation_info info;
    rich_turn r;

    (void)state;
    a = test_conversation_create_ok(st);
    b = test_conversation_create_ok(st);
    rich_init(&r, a);
    assert_int_equal(loom_store_save_turn(st, &r.turn), 0);
    r.turn.conversation_id = b;
    assert_int_equal(loom_store_save_turn(st, &r.turn), 0);
    assert_int_equal(loom_store_conversation_delete(st, a), 0);
    assert_int_equal(loom_store_conversation_info(st, a, &info),
                     LOOM_ENOTFOUND);
    assert_int_equal(loom_store_conversation_delete(st, a), LOOM_ENOTFOUND);
    assert_int_equal(loom_store_conversation_info(st, b, &info), 0);
    assert_int_equal(info.message_count, 5);
    loom_conversation_info_clear(&info);
    loom_store_free(st);
    /* Only b's rows are left in every table. */
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM conversations"),
                     1);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages"), 5);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM tool_calls"), 2);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM tool_outputs"), 2);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM usage"), 2);
    rich_free(&r);
    free(a);
    free(b);
    test_db_remove(path);
    free(path);
}

/* A branch copies the history before the edited user message (tool
 * calls, outcomes and a summary that covers no more of it; no usage),
 * refuses anything but a user message of the conversation, and goes with
 * its conversation. */
static void test_branch(void **state)
{
    char *path = test_db_path("branch.db"), *id, *b = NULL, *b0 = NULL;
    loom_store *st = test_store_open_ok(path);
    loom_messages want = {0}, got = {0};
    json_t *j, *m;
    rich_turn r;
    simple_turn s;
    char ask[LOOM_ID_SIZE], answer[LOOM_ID_SIZE];

    (void)state;
    id = test_conversation_create_ok(st);
    rich_init(&r, id);
    assert_int_equal(loom_store_save_turn(st, &r.turn), 0);
    simple_init(&s, id, "And tomorrow?", "Rain.");
    s.turn.summary = "They talked weather.";
    s.turn.summary_covers = 2;
    assert_int_equal(loom_store_save_turn(st, &s.turn), 0);
    assert_int_equal(loom_store_conversation_get(st, id, &j), 0);
    m = json_array_get(json_object_get(j, "messages"), 5);
    snprintf(ask, sizeof(ask), "%s", jstr(m, "id"));
    m = json_array_get(json_object_get(j, "messages"), 6);
    snprintf(answer, sizeof(answer), "%s", jstr(m, "id"));
    json_decref(j);

    assert_int_equal(loom_store_conversation_branch(st, id, ask, &b), 0);
    assert_true(is_id(b, "conv_"));
    assert_int_equal(loom_messages_append(&want, &r.in), 0);
    assert_int_equal(loom_messages_append(&want, &r.out), 0);
    assert_int_equal(loom_store_load_history(st, b, &got), 0);
    assert_messages_equal(&got, want.items, want.len);
    assert_int_equal(loom_store_conversation_get(st, b, &j), 0);
    assert_string_equal(jstr(j, "parent_id"), id);
    assert_string_equal(jstr(j, "fork_message"), ask);
    assert_string_equal(jstr(j, "summary"), "They talked weather.");
    assert_int_equal(jint(j, "message_count"), 5);
    assert_int_equal(json_array_size(json_object_get(j, "usage")), 0);
    m = json_array_get(json_object_get(j, "messages"), 1);
    assert_int_equal(json_array_size(json_object_get(m, "tool_calls")), 2);
    assert_int_equal(jint(json_array_get(json_object_get(m, "tool_calls"), 0),
                          "text_offset"),
                     13);
    m = json_array_get(json_object_get(j, "messages"), 3);
    assert_string_equal(jstr(m, "tool_status"), "error");
    json_decref(j);
    /* A branch at the first message has no history and no summary. */
    assert_int_equal(loom_store_conversation_get(st, id, &j), 0);
    m = json_array_get(json_object_get(j, "messages"), 0);
    assert_int_equal(loom_store_conversation_branch(st, id, jstr(m, "id"), &b0),
                     0);
    json_decref(j);
    assert_int_equal(loom_store_conversation_get(st, b0, &j), 0);
    assert_true(jnull(j, "summary"));
    assert_int_equal(json_array_size(json_object_get(j, "messages")), 0);
    json_decref(j);

    {
        char *none = NULL;
        assert_int_equal(loom_store_conversation_branch(st, id, answer, &none),
                         LOOM_EINVALID);
        assert_int_equal(loom_store_conversation_branch(st, b, ask, &none),
                         LOOM_EINVALID);
        assert_int_equal(
            loom_store_conversation_branch(st, "conv_missing", ask, &none),
            LOOM_ENOTFOUND);
        assert_null(none);
    }
    assert_int_equal(loom_store_conversation_delete(st, id), 0);
    assert_int_equal(loom_store_conversation_get(st, b, &j), LOOM_ENOTFOUND);
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM conversations"),
                     0);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages"), 0);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM tool_calls"), 0);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM tool_outputs"), 0);
    loom_messages_free(&want);
    loom_messages_free(&got);
    simple_free(&s);
    rich_free(&r);
    free(id);
    free(b);
    free(b0);
    test_db_remove(path);
    free(path);
}

static void test_title(void **state)
{
    char *path = test_db_path("title.db"), *id, *id2, *text;
    loom_store *st = test_store_open_ok(path);
    loom_conversation_info info;
    size_t n = 0;

    (void)state;
    /* 100 two-byte characters after blank lines: cut to 80 characters. */
    text = malloc(400);
    assert_non_null(text);
    memcpy(text, "\n\n  ", 4);
    n = 4;
    for (int i = 0; i < 100; i++) {
        memcpy(text + n, "\xc3\xa9", 2);
        n += 2;
    }
    text[n] = '\0';
    id = test_conversation_create_ok(st);
    save_simple(st, id, text, "ok");
    save_simple(st, id, "second question", "ok");
    assert_int_equal(loom_store_conversation_info(st, id, &info), 0);
    assert_int_equal(strlen(info.title), 160);
    assert_int_equal(memcmp(info.title, text + 4, 160), 0);
    assert_int_equal(info.message_count, 4);
    loom_conversation_info_clear(&info);

    /* Lines become one; an empty first message leaves the title to the
     * next one. */
    id2 = test_conversation_create_ok(st);
    save_simple(st, id2, "", "ok");
    assert_int_equal(loom_store_conversation_info(st, id2, &info), 0);
    assert_string_equal(info.title, "");
    loom_conversation_info_clear(&info);
    save_simple(st, id2, "line one\n\tline   two  ", "ok");
    assert_int_equal(loom_store_conversation_info(st, id2, &info), 0);
    assert_string_equal(info.title, "line one line two");
    loom_conversation_info_clear(&info);

    free(text);
    free(id);
    free(id2);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

static void test_invalid_utf8(void **state)
{
    char *path = test_db_path("utf8.db"), *id;
    loom_store *st = test_store_open_ok(path);
    loom_messages hist = {0};
    json_t *j;

    (void)state;
    id = test_conversation_create_ok(st);
    save_simple(st, id, "ok", "bad \xff byte \xed\xa0\x80 end");
    j = test_conversation_get_ok(st, id);
    assert_string_equal(
        jstr(json_array_get(json_object_get(j, "messages"), 1), "content"),
        "bad \xef\xbf\xbd byte \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd end");
    json_decref(j);
    /* History gives back the bytes as they were. */
    assert_int_equal(loom_store_load_history(st, id, &hist), 0);
    assert_string_equal(hist.items[1].content,
                        "bad \xff byte \xed\xa0\x80 end");
    loom_messages_free(&hist);
    free(id);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

static void test_turn_limits(void **state)
{
    char *path = test_db_path("limits.db"), *id;
    loom_store *st = test_store_open_ok(path);
    loom_conversation_info info;
    loom_turn_usage *u;
    simple_turn t;

    (void)state;
    id = test_conversation_create_ok(st);
    simple_init(&t, id, "many", NULL);
    /* 1 input + 9,999 output = exactly the limit: stored. */
    for (int i = 0; i < 9999; i++)
        assert_int_equal(
            loom_messages_add_assistant(&t.out, "x", NULL, NULL, 0), 0);
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    /* One more: refused, nothing written. */
    assert_int_equal(loom_messages_add_assistant(&t.out, "x", NULL, NULL, 0),
                     0);
    assert_int_equal(loom_store_save_turn(st, &t.turn), LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "10000"));
    assert_int_equal(loom_store_conversation_info(st, id, &info), 0);
    assert_int_equal(info.message_count, 10000);
    loom_conversation_info_clear(&info);
    simple_free(&t);

    /* Usage rows have the same limit. */
    simple_init(&t, id, "usage", "ok");
    u = calloc(10001, sizeof(*u));
    assert_non_null(u);
    t.turn.usage = u;
    t.turn.usage_len = 10001;
    assert_int_equal(loom_store_save_turn(st, &t.turn), LOOM_ETOOLARGE);
    t.turn.usage_len = 10000;
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    free(u);
    simple_free(&t);
    free(id);
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM usage"), 10000);
    test_db_remove(path);
    free(path);
}

static void test_schema_newer_refused(void **state)
{
    char *path = test_db_path("newer.db");
    loom_store *st = test_store_open_ok(path);
    char want[96];

    (void)state;
    loom_store_free(st);
    test_db_exec(path, "PRAGMA user_version = 99");
    st = (loom_store *)1;
    assert_int_equal(loom_store_open(&st, path), LOOM_EINVALID);
    assert_null(st);
    /* The newest version this loom knows, whatever the latest step is. */
    snprintf(want, sizeof(want),
             "database schema version 99 is newer than this loom (%d)",
             loom__sqlite_migrations_len);
    assert_non_null(strstr(loom_error_last(), want));
    test_db_remove(path);
    free(path);
}

static void test_migrations(void **state)
{
    char *path = test_db_path("migrate.db"), *id;
    loom_conversation_info info;
    loom_store *st = NULL;

    (void)state;
    /* An empty file is version 0. */
    assert_int_equal(test_write_file(path, "", 0), 0);
    st = test_store_open_ok(path);
    assert_int_equal(loom_store_schema_version(st),
                     loom__sqlite_migrations_len);
    loom_store_free(st);
    test_db_remove(path);

    /* A version 1 database (no indexes, no exact costs yet) holding data
     * written the way loom 1 wrote it. */
    assert_int_equal(loom__store_sqlite_open_version(&st, path, 1), 0);
    assert_int_equal(loom_store_schema_version(st), 1);
    loom_store_free(st);
    id = strdup("conv_00000000000000000000000a");
    assert_non_null(id);
    test_db_exec(
        path, "INSERT INTO conversations (id, title, created_at, updated_at, "
              "message_count) VALUES ('conv_00000000000000000000000a', "
              "'from v1', 1, 1, 2);"
              "INSERT INTO messages (id, conversation_id, position, role, "
              "content, created_at) VALUES ('msg_1', "
              "'conv_00000000000000000000000a', 0, 'user', 'from v1', 1);"
              "INSERT INTO messages (id, conversation_id, position, role, "
              "content, cost, created_at) VALUES ('msg_2', "
              "'conv_00000000000000000000000a', 1, 'assistant', 'yes', "
              "0.000123, 1);"
              "INSERT INTO usage (conversation_id, iteration, prompt_tokens, "
              "completion_tokens, cached_tokens, reasoning_tokens, "
              "total_tokens, cost, created_at) VALUES "
              "('conv_00000000000000000000000a', 1, 1, 1, 0, 0, 2, "
              "0.000123, 1);");
    assert_int_equal(test_db_int(path, "PRAGMA user_version"), 1);
    assert_int_equal(test_db_int(path,
                                 "SELECT count(*) FROM sqlite_master "
                                 "WHERE name = 'conversations_by_update'"),
                     0);
    /* Opening migrates it to 5 and keeps the data. */
    st = test_store_open_ok(path);
    assert_int_equal(loom_store_schema_version(st),
                     loom__sqlite_migrations_len);
    assert_int_equal(loom_store_conversation_info(st, id, &info), 0);
    assert_string_equal(info.title, "from v1");
    assert_int_equal(info.message_count, 2);
    loom_conversation_info_clear(&info);
    loom_store_free(st);
    assert_int_equal(test_db_int(path,
                                 "SELECT count(*) FROM sqlite_master "
                                 "WHERE name = 'conversations_by_update'"),
                     1);
    /* Version 3 carried the costs over exactly. */
    assert_int_equal(test_db_int(path, "SELECT cost_micros FROM messages "
                                       "WHERE id = 'msg_2'"),
                     123);
    assert_int_equal(test_db_int(path, "SELECT cost_micros FROM usage"), 123);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages "
                                       "WHERE provider_state IS NULL"),
                     2);
    /* Reopening a current database changes nothing. */
    st = test_store_open_ok(path);
    assert_int_equal(loom_store_schema_version(st),
                     loom__sqlite_migrations_len);
    assert_int_equal(loom_store_conversation_info(st, id, &info), 0);
    loom_conversation_info_clear(&info);
    loom_store_free(st);
    assert_int_equal(loom__store_sqlite_open_version(
                         &st, path, loom__sqlite_migrations_len + 1),
                     LOOM_EINVALID);
    free(id);
    test_db_remove(path);
    free(path);
}

static void test_disk_full(void **state)
{
    char *path = test_db_path("full.db"), *id, *big;
    loom_store *st = test_store_open_ok(path);
    loom_conversation_info info;
    json_t *j;
    rich_turn r;
    int rc = 0, tries = 0;

    (void)state;
    id = test_conversation_create_ok(st);
    save_simple(st, id, "first", "answer");
    /* The file may not grow past its current size (SQLite never lowers
     * the cap below that). */
    assert_int_equal(
        loom__store_sqlite_exec_all(st, "PRAGMA max_page_count = 1"), 0);
    big = malloc(200001);
    assert_non_null(big);
    memset(big, 'z', 200000);
    big[200000] = '\0';
    rich_init(&r, id);
    free(r.out.items[3].content);
    r.out.items[3].content = big;
    while (tries++ < 5 && (rc = loom_store_save_turn(st, &r.turn)) == 0)
        ;
    assert_int_equal(rc, LOOM_EIO);
    assert_non_null(strstr(loom_error_last(), "disk full"));
    assert_non_null(strstr(loom_error_last(), path));
    /* Nothing of the failed turn is there. */
    assert_int_equal(loom_store_conversation_info(st, id, &info), 0);
    assert_int_equal(info.message_count, 2);
    loom_conversation_info_clear(&info);
    j = test_conversation_get_ok(st, id);
    assert_int_equal(json_array_size(json_object_get(j, "messages")), 2);
    assert_int_equal(json_array_size(json_object_get(j, "usage")), 0);
    json_decref(j);
    /* With room again the same store writes. */
    assert_int_equal(loom__store_sqlite_exec_all(
                         st, "PRAGMA max_page_count = 1073741823"),
                     0);
    assert_int_equal(loom_store_save_turn(st, &r.turn), 0);
    assert_int_equal(loom_store_conversation_info(st, id, &info), 0);
    assert_int_equal(info.message_count, 7);
    loom_conversation_info_clear(&info);
    rich_free(&r);
    free(id);
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages"), 7);
    test_db_remove(path);
    free(path);
}

/* ---- threads ---- */

#define NTHREADS 16
#define NTURNS 20

typedef struct {
    loom_store *st;
    const char *own, *shared;
    int k;
    int failed; /* the first failing step, 0 when all went well */
    char why[256];
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    char user[64], answer[64];

    for (int i = 0; i < NTURNS && !w->failed; i++) {
        for (int which = 0; which < 2 && !w->failed; which++) {
            loom_messages in = {0}, out = {0}, hist = {0};
            loom_turn_record t = {0};
            snprintf(user, sizeof(user), "u %d %d", w->k, i);
            snprintf(answer, sizeof(answer), "a %d %d", w->k, i);
            if (loom_messages_add(&in, LOOM_ROLE_USER, user) ||
                loom_messages_add_assistant(&out, answer, NULL, NULL, 0)) {
                w->failed = 1;
            } else {
                t.conversation_id = which ? w->shared : w->own;
                t.run_id = "run_t";
                t.model = "fake/m";
                t.input = &in;
                t.output = &out;
                t.cost = -1;
                if (loom_store_save_turn(w->st, &t) != 0)
                    w->failed = 2;
                /* Readers beside the writers. */
                else if (loom_store_load_history(w->st, w->own, &hist) != 0)
                    w->failed = 3;
                else if (hist.len != (size_t)(2 * (i + 1)))
                    w->failed = 4;
            }
            if (w->failed)
                snprintf(w->why, sizeof(w->why), "step %d: %s", w->failed,
                         loom_error_last());
            loom_messages_free(&in);
            loom_messages_free(&out);
            loom_messages_free(&hist);
        }
    }
    return NULL;
}

static void test_threads(void **state)
{
    char *path = test_db_path("threads.db"), *shared, *own[NTHREADS];
    loom_store *st = test_store_open_ok(path);
    pthread_t th[NTHREADS];
    worker w[NTHREADS];
    loom_messages hist = {0};
    int last[NTHREADS];
    json_t *page;

    (void)state;
    shared = test_conversation_create_ok(st);
    for (int k = 0; k < NTHREADS; k++) {
        own[k] = test_conversation_create_ok(st);
        w[k] = (worker){st, own[k], shared, k, 0, ""};
        last[k] = -1;
    }
    for (int k = 0; k < NTHREADS; k++)
        assert_int_equal(pthread_create(&th[k], NULL, work, &w[k]), 0);
    for (int k = 0; k < NTHREADS; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < NTHREADS; k++) {
        if (w[k].failed)
            fprintf(stderr, "thread %d: %s\n", k, w[k].why);
        assert_int_equal(w[k].failed, 0);
    }
    /* Each own conversation: its turns, in order. */
    for (int k = 0; k < NTHREADS; k++) {
        char want[64];
        assert_int_equal(loom_store_load_history(st, own[k], &hist), 0);
        assert_int_equal(hist.len, 2 * NTURNS);
        for (int i = 0; i < NTURNS; i++) {
            snprintf(want, sizeof(want), "u %d %d", k, i);
            assert_string_equal(hist.items[2 * i].content, want);
            snprintf(want, sizeof(want), "a %d %d", k, i);
            assert_string_equal(hist.items[2 * i + 1].content, want);
        }
        loom_messages_free(&hist);
    }
    /* The shared one: every turn whole, each thread's in its order. */
    assert_int_equal(loom_store_load_history(st, shared, &hist), 0);
    assert_int_equal(hist.len, 2 * NTURNS * NTHREADS);
    for (size_t p = 0; p < hist.len; p += 2) {
        int k, i, k2, i2;
        assert_int_equal(hist.items[p].role, LOOM_ROLE_USER);
        assert_int_equal(hist.items[p + 1].role, LOOM_ROLE_ASSISTANT);
        assert_int_equal(sscanf(hist.items[p].content, "u %d %d", &k, &i), 2);
        assert_int_equal(
            sscanf(hist.items[p + 1].content, "a %d %d", &k2, &i2), 2);
        assert_int_equal(k, k2);
        assert_int_equal(i, i2);
        assert_true(k >= 0 && k < NTHREADS);
        assert_int_equal(i, last[k] + 1);
        last[k] = i;
    }
    loom_messages_free(&hist);
    assert_int_equal(loom_store_conversation_list(st, NULL, 100, &page), 0);
    assert_int_equal(json_array_size(json_object_get(page, "data")),
                     NTHREADS + 1);
    json_decref(page);
    for (int k = 0; k < NTHREADS; k++)
        free(own[k]);
    free(shared);
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages"),
                     4 * NTURNS * NTHREADS);
    test_db_remove(path);
    free(path);
}

/* ---- crash safety ---- */

#define CRASH_AFTER 30

/* The child: saves turns forever, reporting each committed one. */
static void crash_child(const char *path, int fd)
{
    loom_store *st = NULL;
    char *id = NULL, text[64];
    rich_turn r;

    if (loom_store_open(&st, path) ||
        loom_store_conversation_create(st, &id) ||
        write(fd, id, strlen(id) + 1) != (ssize_t)strlen(id) + 1)
        _exit(2);
    for (int i = 0; i < 100000; i++) {
        rich_init(&r, id);
        snprintf(text, sizeof(text), "turn %d", i);
        free(r.in.items[0].content);
        r.in.items[0].content = strdup(text);
        if (!r.in.items[0].content || loom_store_save_turn(st, &r.turn) ||
            write(fd, &i, sizeof(i)) != sizeof(i))
            _exit(3);
        rich_free(&r);
    }
    _exit(4);
}

static void test_crash_safety(void **state)
{
    char *path = test_db_path("crash.db"), id[64];
    int fds[2], n, reported = -1, status;
    loom_messages hist = {0};
    loom_store *st;
    size_t got = 0;
    pid_t pid;

    (void)state;
    assert_int_equal(pipe(fds), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        crash_child(path, fds[1]);
    }
    close(fds[1]);
    /* The conversation id, NUL-terminated. */
    while (got < sizeof(id) && read(fds[0], id + got, 1) == 1 &&
           id[got] != '\0')
        got++;
    assert_true(got > 0 && got < sizeof(id));
    while (reported < CRASH_AFTER &&
           read(fds[0], &n, sizeof(n)) == (ssize_t)sizeof(n))
        reported = n;
    assert_int_equal(reported, CRASH_AFTER);
    kill(pid, SIGKILL);
    status = test_wait_pid(pid, 60000);
    assert_int_equal(status, 128 + SIGKILL);
    /* Whatever it reported before dying was committed. */
    while (read(fds[0], &n, sizeof(n)) == (ssize_t)sizeof(n))
        reported = n;
    close(fds[0]);

    {
        sqlite3 *db;
        sqlite3_stmt *s;
        assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
        assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1,
                                            &s, NULL),
                         SQLITE_OK);
        assert_int_equal(sqlite3_step(s), SQLITE_ROW);
        assert_string_equal((const char *)sqlite3_column_text(s, 0), "ok");
        sqlite3_finalize(s);
        sqlite3_close(db);
    }
    st = test_store_open_ok(path);
    assert_int_equal(loom_store_load_history(st, id, &hist), 0);
    /* Whole turns only (5 messages each), every reported one there. */
    assert_int_equal(hist.len % 5, 0);
    assert_true(hist.len / 5 >= (size_t)reported + 1);
    for (int i = 0; i <= reported; i++) {
        char want[64];
        snprintf(want, sizeof(want), "turn %d", i);
        assert_string_equal(hist.items[5 * i].content, want);
        assert_string_equal(hist.items[5 * i + 4].content, "It is sunny.");
    }
    loom_messages_free(&hist);
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM tool_calls") % 2,
                     0);
    test_db_remove(path);
    free(path);
}

/* Whether a row of what SQLite explains (how: "EXPLAIN" or "EXPLAIN
 * QUERY PLAN") about sql on the database at path holds text in column
 * col. */
static int explained(const char *path, const char *how, const char *sql,
                     int col, const char *text)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *s = NULL;
    char *q = sqlite3_mprintf("%s %s", how, sql);
    int found = 0;

    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, q, -1, &s, NULL), SQLITE_OK);
    while (sqlite3_step(s) == SQLITE_ROW)
        if (strstr((const char *)sqlite3_column_text(s, col), text))
            found = 1;
    sqlite3_finalize(s);
    sqlite3_close(db);
    sqlite3_free(q);
    return found;
}

/* Whether SQLite's plan for sql on the database at path reads through
 * index (the plan's detail names it). */
static int plan_uses(const char *path, const char *sql, const char *index)
{
    return explained(path, "EXPLAIN QUERY PLAN", sql, 3, index);
}

/* The indexes on often-NULL columns hold only rows with a value (a row
 * without one writes fewer pages), and the lookups that need them still
 * read through them. */
static void test_partial_indexes(void **state)
{
    char *path = test_db_path("partial.db");
    loom_store *st = test_store_open_ok(path);
    char *id = test_conversation_create_ok(st);
    static const struct {
        const char *sql, *index;
    } lookups[] = {
        {"SELECT id FROM conversations WHERE user_id IS NULL AND "
         "prefix_hash = x'00'",
         "conversations_by_prefix"},
        {"SELECT id FROM conversations WHERE user_id IS 'u' AND "
         "prefix_hash_streamed = x'00'",
         "conversations_by_prefix_streamed"},
        {"SELECT id FROM conversations WHERE user_id = 'u' AND parent_id "
         "IS NULL ORDER BY updated_at DESC, id DESC LIMIT 5",
         "conversations_by_owner"},
        {"SELECT id FROM conversations WHERE parent_id = 'c'",
         "conversations_by_parent"},
        {"SELECT id FROM conversations WHERE fork_origin = 'm'",
         "conversations_by_origin"},
        {"SELECT id FROM runs WHERE parent_run_id = 'r' ORDER BY "
         "created_at, id",
         "runs_by_parent"},
        {"SELECT count(*) FROM usage WHERE user_id = 'u' AND created_at >= 0",
         "usage_by_owner"},
        {"SELECT count(*) FROM usage WHERE workspace = 'w' AND user_name = "
         "'u' AND created_at >= 0",
         "usage_by_account"},
        {"SELECT count(*) FROM usage WHERE user_name = 'u' AND created_at >= 0",
         "usage_by_user"},
        {"SELECT count(*) FROM usage WHERE key_id = 'k' AND created_at >= 0",
         "usage_by_key"},
    };

    (void)state;
    loom_store_free(st);
    assert_int_equal(
        test_db_int(path, "SELECT count(*) FROM sqlite_schema WHERE "
                          "type = 'index' AND sql LIKE '%WHERE%IS NOT NULL'"),
        10);
    for (size_t i = 0; i < sizeof(lookups) / sizeof(lookups[0]); i++) {
        if (!plan_uses(path, lookups[i].sql, lookups[i].index))
            fail_msg("'%s' does not read through %s", lookups[i].sql,
                     lookups[i].index);
    }
    free(id);
    test_db_remove(path);
    free(path);
}

/* Whether the program SQLite compiles for sql on the database at path
 * has an opcode op. */
static int program_has(const char *path, const char *sql, const char *op)
{
    return explained(path, "EXPLAIN", sql, 1, op);
}

/* Whether sql succeeds on the database at path (foreign keys on). */
static int db_accepts(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    int rc;

    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
    sqlite3_close(db);
    return rc == SQLITE_OK;
}

/* Version 19: the CHECK constraints of three or more values compare with
 * '=' (no ephemeral table per row written) and accept the same values;
 * rows written before stay. */
static void test_checks_without_lists(void **state)
{
    char *path = test_db_path("checks.db");
    loom_store *st = NULL;
    char sql[512];
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    static const char *const msg_statuses[] = {"ok", "error", "cancelled"};
    static const char *const run_statuses[] = {"completed", "failed",
                                               "cancelled"};
    static const char *const researcher_statuses[] = {"running", "completed",
                                                      "failed"};
    static const char *const inserts[] = {
        "INSERT INTO messages (id, conversation_id, position, role, status, "
        "created_at) VALUES (?1, 'conv_a', ?2, ?3, ?4, 1)",
        "INSERT INTO runs (id, conversation_id, status, prompt_tokens, "
        "completion_tokens, cached_tokens, reasoning_tokens, total_tokens, "
        "cache_write_tokens, created_at, ended_at) VALUES (?1, 'conv_a', ?2, "
        "0, 0, 0, 0, 0, 0, 1, 1)",
        "INSERT INTO run_messages (run_id, position, role, created_at) "
        "VALUES (?1, ?2, ?3, 1)",
        "INSERT INTO research_researchers (run_id, call_id, status, "
        "started_at) VALUES (?1, ?2, ?3, 1)",
    };

    (void)state;
    assert_int_equal(loom__store_sqlite_open_version(&st, path, 18), 0);
    loom_store_free(st);
    test_db_exec(path,
                 "INSERT INTO conversations (id, title, created_at, "
                 "updated_at, message_count) VALUES ('conv_a', '', 1, 1, 1);"
                 "INSERT INTO messages (id, conversation_id, position, role, "
                 "status, created_at) VALUES ('msg_old', 'conv_a', 0, "
                 "'assistant', 'cancelled', 1);"
                 "INSERT INTO runs (id, conversation_id, status, "
                 "prompt_tokens, completion_tokens, cached_tokens, "
                 "reasoning_tokens, total_tokens, cache_write_tokens, "
                 "created_at, ended_at) VALUES ('run_old', 'conv_a', "
                 "'failed', 0, 0, 0, 0, 0, 0, 1, 1);"
                 "INSERT INTO research_runs (run_id, conversation_id, spec, "
                 "status, created_at, updated_at) VALUES ('run_old', "
                 "'conv_a', '{}', 'running', 1, 1)");
    for (size_t i = 0; i < sizeof(inserts) / sizeof(inserts[0]); i++)
        assert_true(program_has(path, inserts[i], "OpenEphemeral"));
    st = test_store_open_ok(path);
    assert_int_equal(loom_store_schema_version(st),
                     loom__sqlite_migrations_len);
    loom_store_free(st);
    for (size_t i = 0; i < sizeof(inserts) / sizeof(inserts[0]); i++)
        if (program_has(path, inserts[i], "OpenEphemeral"))
            fail_msg("'%s' still builds an ephemeral table", inserts[i]);
    /* Only the lists of two values are left (tool_outputs.status,
     * research_runs.status): SQLite compares those one by one. */
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM sqlite_schema "
                                       "WHERE sql LIKE '% IN (%'"),
                     2);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages WHERE "
                                       "id = 'msg_old' AND status = "
                                       "'cancelled'"),
                     1);
    /* Every value allowed before is allowed, and no other. */
    for (size_t i = 0; i < 4; i++) {
        snprintf(sql, sizeof(sql),
                 "INSERT INTO messages (id, conversation_id, position, role, "
                 "created_at) VALUES ('msg_r%zu', 'conv_a', %zu, '%s', 1);"
                 "INSERT INTO run_messages (run_id, position, role, "
                 "created_at) VALUES ('run_old', %zu, '%s', 1)",
                 i, i + 1, roles[i], i, roles[i]);
        assert_true(db_accepts(path, sql));
    }
    for (size_t i = 0; i < 3; i++) {
        snprintf(sql, sizeof(sql),
                 "INSERT INTO messages (id, conversation_id, position, role, "
                 "status, created_at) VALUES ('msg_s%zu', 'conv_a', %zu, "
                 "'user', '%s', 1);"
                 "INSERT INTO runs (id, conversation_id, status, "
                 "prompt_tokens, completion_tokens, cached_tokens, "
                 "reasoning_tokens, total_tokens, cache_write_tokens, "
                 "created_at, ended_at) VALUES ('run_%zu', 'conv_a', '%s', 0, "
                 "0, 0, 0, 0, 0, 1, 1);"
                 "INSERT INTO research_researchers (run_id, call_id, status, "
                 "started_at) VALUES ('run_old', 'call_%zu', '%s', 1)",
                 i, i + 10, msg_statuses[i], i, run_statuses[i], i,
                 researcher_statuses[i]);
        assert_true(db_accepts(path, sql));
    }
    assert_false(db_accepts(path, "INSERT INTO messages (id, conversation_id, "
                                  "position, role, created_at) VALUES "
                                  "('msg_x', 'conv_a', 50, 'User', 1)"));
    assert_false(db_accepts(path,
                            "INSERT INTO messages (id, conversation_id, "
                            "position, role, status, created_at) VALUES "
                            "('msg_x', 'conv_a', 50, 'user', 'done', 1)"));
    assert_false(db_accepts(
        path, "INSERT INTO runs (id, conversation_id, status, prompt_tokens, "
              "completion_tokens, cached_tokens, reasoning_tokens, "
              "total_tokens, cache_write_tokens, created_at, ended_at) VALUES "
              "('run_x', 'conv_a', 'running', 0, 0, 0, 0, 0, 0, 1, 1)"));
    assert_false(db_accepts(path, "INSERT INTO run_messages (run_id, "
                                  "position, role, created_at) VALUES "
                                  "('run_old', 50, 'developer', 1)"));
    assert_false(db_accepts(path, "INSERT INTO research_researchers (run_id, "
                                  "call_id, status, started_at) VALUES "
                                  "('run_old', 'call_x', 'ended', 1)"));
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM "
                                       "pragma_integrity_check WHERE "
                                       "integrity_check = 'ok'"),
                     1);
    test_db_remove(path);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_open_creates_folders_wal_schema),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_create_info),
        cmocka_unit_test(test_list_pagination),
        cmocka_unit_test(test_save_turn_get_json),
        cmocka_unit_test(test_load_history_roundtrip),
        cmocka_unit_test(test_failed_and_cancelled_turns),
        cmocka_unit_test(test_unknown_conversation),
        cmocka_unit_test(test_delete_cascades),
        cmocka_unit_test(test_branch),
        cmocka_unit_test(test_title),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_turn_limits),
        cmocka_unit_test(test_schema_newer_refused),
        cmocka_unit_test(test_migrations),
        cmocka_unit_test(test_partial_indexes),
        cmocka_unit_test(test_checks_without_lists),
        cmocka_unit_test(test_disk_full),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_crash_safety),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
