/*
 * Unit tests of runs in the store (schema version 10): the row every
 * saved turn leaves, a sub-agent's run stored linked to its parent with
 * its own messages (never in the conversation's), usage rows that say
 * which run and agent each call belongs to and sum exactly to the top
 * run's total, loom_store_run_get and loom_store_run_children (one
 * level, children oldest first), scoping to the run's user, the cascade
 * of a conversation's delete, and the migration of a version 9 database
 * holding data. Raw SQLite is used only to look at the file.
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

/* One priced model call's usage row. */
static loom_turn_usage call_usage(int iteration, long prompt, long completion,
                                  int64_t micros)
{
    loom_turn_usage u;

    memset(&u, 0, sizeof(u));
    u.iteration = iteration;
    u.usage.prompt_tokens = prompt;
    u.usage.completion_tokens = completion;
    u.usage.total_tokens = prompt + completion;
    u.usage.cost_micros = micros;
    u.cost = (double)micros / 1e6;
    return u;
}

/* A sub-agent's run: its task in, a call of `lookup` with its result and
 * an answer out (no answer when failed). */
typedef struct {
    loom_messages in, out;
    loom_turn_usage usage[2];
    loom_usage total;
    loom_turn_record rec;
} child_t;

static void child_init(child_t *c, const char *conv, const char *id,
                       const char *call_id, const char *agent, int failed)
{
    char cid[] = "k1", cname[] = "lookup", cargs[] = "{\"q\":\"x\"}";
    loom_tool_call call = {cid, cname, cargs};

    memset(c, 0, sizeof(*c));
    assert_int_equal(loom_messages_add(&c->in, LOOM_ROLE_USER, "the task"), 0);
    assert_int_equal(
        loom_messages_add_assistant(&c->out, "Checking.", NULL, &call, 1), 0);
    assert_int_equal(
        loom_messages_add_tool_result(&c->out, "k1", "lookup", "found"), 0);
    if (!failed)
        assert_int_equal(
            loom_messages_add_assistant(&c->out, "child answer", NULL, NULL, 0),
            0);
    c->usage[0] = call_usage(1, 100, 10, 110);
    c->usage[1] = call_usage(2, 200, 20, 220);
    loom_usage_add(&c->total, &c->usage[0].usage);
    loom_usage_add(&c->total, &c->usage[1].usage);
    c->rec.conversation_id = conv;
    c->rec.run_id = id;
    c->rec.user_id = "ann";
    c->rec.agent = agent;
    c->rec.model = "fake/m";
    c->rec.input = &c->in;
    c->rec.output = &c->out;
    c->rec.status = failed ? LOOM_TURN_ERROR : LOOM_TURN_OK;
    c->rec.error = failed ? "upstream said no" : NULL;
    c->rec.usage = c->usage;
    c->rec.usage_len = 2;
    c->rec.cost = 330e-6;
    c->rec.parent_run_id = "run_top";
    c->rec.parent_call_id = call_id;
    c->rec.depth = 1;
    c->rec.run_usage = &c->total;
    c->rec.run_cost_known = 1;
    c->rec.started_at = 1000;
}

static void child_free(child_t *c)
{
    loom_messages_free(&c->in);
    loom_messages_free(&c->out);
}

/* A parent's turn: the two calls of its children and their answers, and
 * its own two model calls; its total includes the children's. */
typedef struct {
    loom_messages in, out;
    loom_turn_usage usage[2];
    loom_usage total;
    loom_turn_record rec;
} parent_t;

static void parent_init(parent_t *p, const char *conv, const child_t *a,
                        const child_t *b)
{
    char c1[] = "call_a", c2[] = "call_b", n1[] = "researcher", n2[] = "writer",
         args[] = "{\"task\":\"t\"}";
    loom_tool_call calls[2] = {{c1, n1, args}, {c2, n2, args}};

    memset(p, 0, sizeof(*p));
    assert_int_equal(loom_messages_add(&p->in, LOOM_ROLE_USER, "hello"), 0);
    assert_int_equal(loom_messages_add_assistant(&p->out, "", NULL, calls, 2),
                     0);
    assert_int_equal(loom_messages_add_tool_result(
                         &p->out, "call_a", "researcher", "child answer"),
                     0);
    assert_int_equal(
        loom_messages_add_tool_result(&p->out, "call_b", "writer",
                                      "agent 'writer' failed: upstream"),
        0);
    assert_int_equal(
        loom_messages_add_assistant(&p->out, "done", NULL, NULL, 0), 0);
    p->usage[0] = call_usage(1, 50, 5, 55);
    p->usage[1] = call_usage(2, 60, 6, 66);
    loom_usage_add(&p->total, &p->usage[0].usage);
    loom_usage_add(&p->total, &p->usage[1].usage);
    loom_usage_add(&p->total, &a->total);
    loom_usage_add(&p->total, &b->total);
    p->rec.conversation_id = conv;
    p->rec.run_id = "run_top";
    p->rec.user_id = "ann";
    p->rec.agent = "main";
    p->rec.model = "fake/m";
    p->rec.input = &p->in;
    p->rec.output = &p->out;
    p->rec.usage = p->usage;
    p->rec.usage_len = 2;
    p->rec.cost = 121e-6;
    p->rec.run_usage = &p->total;
    p->rec.run_cost_known = 1;
}

static void parent_free(parent_t *p)
{
    loom_messages_free(&p->in);
    loom_messages_free(&p->out);
}

/* Saves a tree: the children first (they end first), then the parent. */
static void save_tree(loom_store *st, const char *conv, child_t *a, child_t *b,
                      parent_t *p)
{
    child_init(a, conv, "run_kid_a", "call_a", "researcher", 0);
    child_init(b, conv, "run_kid_b", "call_b", "writer", 1);
    b->rec.started_at = 2000;
    parent_init(p, conv, a, b);
    assert_int_equal(loom_store_save_turn(st, &a->rec), 0);
    assert_int_equal(loom_store_save_turn(st, &b->rec), 0);
    assert_int_equal(loom_store_save_turn(st, &p->rec), 0);
}

static void free_tree(child_t *a, child_t *b, parent_t *p)
{
    child_free(a);
    child_free(b);
    parent_free(p);
}

/* ---- tests ---- */

static void test_tree_rows_and_sums(void **state)
{
    char *path = test_db_path("runs-tree.db"), *conv;
    loom_store *st = test_store_open_ok(path);
    child_t a, b;
    parent_t p;
    json_t *c;
    char sql[256];

    (void)state;
    conv = test_conversation_create_ok(st);
    save_tree(st, conv, &a, &b, &p);

    /* The conversation holds the parent's messages only: hello, the
     * calls, two results, the answer. */
    c = test_conversation_get_ok(st, conv);
    assert_int_equal(json_array_size(json_object_get(c, "messages")), 5);
    /* Its usage rows are every call of the tree, each with its run and
     * agent. */
    assert_int_equal(json_array_size(json_object_get(c, "usage")), 6);
    assert_string_equal(
        jstr(json_array_get(json_object_get(c, "usage"), 0), "agent"),
        "researcher");
    assert_string_equal(
        jstr(json_array_get(json_object_get(c, "usage"), 0), "run_id"),
        "run_kid_a");
    assert_string_equal(
        jstr(json_array_get(json_object_get(c, "usage"), 5), "agent"), "main");
    json_decref(c);
    loom_store_free(st);

    /* Rows: three runs, linked; the children's messages in run_messages. */
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM runs"), 3);
    assert_int_equal(test_db_int(path,
                                 "SELECT count(*) FROM runs WHERE "
                                 "parent_run_id = 'run_top' AND depth = 1"),
                     2);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM runs WHERE id = "
                                       "'run_top' AND parent_run_id IS NULL "
                                       "AND depth = 0 AND user_id = 'ann'"),
                     1);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM run_messages "
                                       "WHERE run_id = 'run_kid_a'"),
                     4);
    /* A failed child has no placeholder: its row carries the status. */
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM run_messages "
                                       "WHERE run_id = 'run_kid_b'"),
                     3);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM runs WHERE id = "
                                       "'run_kid_b' AND status = 'failed' AND "
                                       "error = 'upstream said no'"),
                     1);
    /* The exact sum: the top run's total is the sum of its tree's rows. */
    assert_int_equal(
        test_db_int(path, "SELECT cost_micros FROM runs WHERE id = 'run_top'"),
        55 + 66 + 2 * 330);
    assert_int_equal(test_db_int(path, "SELECT sum(cost_micros) FROM usage"),
                     test_db_int(path, "SELECT cost_micros FROM runs "
                                       "WHERE id = 'run_top'"));
    snprintf(sql, sizeof(sql),
             "SELECT sum(total_tokens) = (SELECT total_tokens FROM runs "
             "WHERE id = 'run_top') FROM usage WHERE conversation_id = '%s'",
             conv);
    assert_int_equal(test_db_int(path, sql), 1);
    /* Each child's total is its own rows'. */
    assert_int_equal(test_db_int(path,
                                 "SELECT count(*) FROM runs r WHERE "
                                 "r.parent_run_id IS NOT NULL AND "
                                 "r.cost_micros = (SELECT sum(cost_micros) "
                                 "FROM usage u WHERE u.run_id = r.id)"),
                     2);
    free_tree(&a, &b, &p);
    free(conv);
    test_db_remove(path);
    free(path);
}

static void test_run_get_children_and_owner(void **state)
{
    char *path = test_db_path("runs-get.db"), *conv;
    loom_store *st = test_store_open_ok(path);
    json_t *r, *kids, *k, *msgs, *call;
    child_t a, b;
    parent_t p;

    (void)state;
    conv = test_conversation_create_ok(st);
    save_tree(st, conv, &a, &b, &p);

    assert_int_equal(loom_store_run_get(st, "run_top", "ann", &r), 0);
    assert_string_equal(jstr(r, "status"), "completed");
    assert_string_equal(jstr(r, "agent"), "main");
    assert_true(json_is_null(json_object_get(r, "parent_run_id")));
    assert_int_equal(jint(json_object_get(r, "usage"), "cost_micros"),
                     55 + 66 + 660);
    assert_null(json_object_get(r, "messages"));
    kids = json_object_get(r, "children");
    assert_int_equal(json_array_size(kids), 2);
    k = json_array_get(kids, 0);
    assert_string_equal(jstr(k, "id"), "run_kid_a");
    assert_string_equal(jstr(k, "parent_call_id"), "call_a");
    assert_string_equal(jstr(k, "status"), "completed");
    assert_int_equal(jint(json_object_get(k, "usage"), "total_tokens"), 330);
    k = json_array_get(kids, 1);
    assert_string_equal(jstr(k, "id"), "run_kid_b");
    assert_string_equal(jstr(k, "agent"), "writer");
    assert_string_equal(jstr(k, "status"), "failed");
    assert_string_equal(jstr(json_object_get(k, "error"), "message"),
                        "upstream said no");
    json_decref(r);

    /* A child is a run of its own, with its messages. */
    assert_int_equal(loom_store_run_get(st, "run_kid_a", "ann", &r), 0);
    assert_string_equal(jstr(r, "parent_run_id"), "run_top");
    assert_string_equal(jstr(r, "conversation_id"), conv);
    assert_int_equal(jint(r, "depth"), 1);
    assert_int_equal(json_array_size(json_object_get(r, "children")), 0);
    msgs = json_object_get(r, "messages");
    assert_int_equal(json_array_size(msgs), 4);
    assert_string_equal(jstr(json_array_get(msgs, 0), "content"), "the task");
    call = json_array_get(
        json_object_get(json_array_get(msgs, 1), "tool_calls"), 0);
    assert_string_equal(jstr(call, "name"), "lookup");
    assert_string_equal(jstr(json_array_get(msgs, 2), "tool_call_id"), "k1");
    assert_string_equal(jstr(json_array_get(msgs, 3), "content"),
                        "child answer");
    assert_string_equal(jstr(json_array_get(msgs, 3), "agent"), "researcher");
    json_decref(r);

    /* Another user, or none, finds nothing. */
    assert_int_equal(loom_store_run_get(st, "run_kid_a", "bob", &r),
                     LOOM_ENOTFOUND);
    assert_null(r);
    assert_int_equal(loom_store_run_get(st, "run_top", NULL, &r),
                     LOOM_ENOTFOUND);
    assert_int_equal(loom_store_run_get(st, "run_nope", "ann", &r),
                     LOOM_ENOTFOUND);
    assert_int_equal(loom_store_run_children(st, "run_top", &kids), 0);
    assert_int_equal(json_array_size(kids), 2);
    json_decref(kids);
    assert_int_equal(loom_store_run_children(st, "run_nope", &kids), 0);
    assert_int_equal(json_array_size(kids), 0);
    json_decref(kids);

    /* Deleting the conversation deletes the tree. */
    assert_int_equal(loom_store_conversation_delete(st, conv), 0);
    assert_int_equal(loom_store_run_get(st, "run_kid_a", "ann", &r),
                     LOOM_ENOTFOUND);
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM run_messages"), 0);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM usage"), 0);
    free_tree(&a, &b, &p);
    free(conv);
    test_db_remove(path);
    free(path);
}

/* A sub-agent's run needs a conversation that exists, as a turn does. */
static void test_child_unknown_conversation(void **state)
{
    char *path = test_db_path("runs-unknown.db");
    loom_store *st = test_store_open_ok(path);
    child_t a;

    (void)state;
    child_init(&a, "conv_000000000000000000000000", "run_kid_a", "call_a",
               "researcher", 0);
    assert_int_equal(loom_store_save_turn(st, &a.rec), LOOM_ENOTFOUND);
    a.rec.conversation_id = NULL;
    assert_int_equal(loom_store_save_turn(st, &a.rec), LOOM_EINVALID);
    child_free(&a);
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM runs"), 0);
    test_db_remove(path);
    free(path);
}

static void test_migration_from_9(void **state)
{
    char *path = test_db_path("runs-migrate.db");
    loom_store *st = NULL;
    json_t *c;

    (void)state;
    assert_int_equal(loom__store_sqlite_open_version(&st, path, 9), 0);
    assert_int_equal(loom_store_schema_version(st), 9);
    loom_store_free(st);
    test_db_exec(path,
                 "INSERT INTO conversations (id, title, created_at, "
                 "updated_at, message_count) VALUES "
                 "('conv_00000000000000000000000b', 'from v9', 1, 1, 1);"
                 "INSERT INTO messages (id, conversation_id, position, role, "
                 "content, created_at, run_id, agent) VALUES ('msg_1', "
                 "'conv_00000000000000000000000b', 0, 'assistant', 'old', 1, "
                 "'run_old', 'main');"
                 "INSERT INTO usage (conversation_id, run_id, iteration, "
                 "prompt_tokens, completion_tokens, cached_tokens, "
                 "reasoning_tokens, total_tokens, cost_micros, created_at) "
                 "VALUES ('conv_00000000000000000000000b', 'run_old', 1, 1, "
                 "1, 0, 0, 2, 7, 1);");
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM sqlite_master "
                                       "WHERE name = 'runs'"),
                     0);
    st = test_store_open_ok(path);
    assert_int_equal(loom_store_schema_version(st),
                     loom__sqlite_migrations_len);
    c = test_conversation_get_ok(st, "conv_00000000000000000000000b");
    assert_int_equal(json_array_size(json_object_get(c, "messages")), 1);
    /* Older usage rows have no agent; older runs have no row. */
    assert_true(json_is_null(json_object_get(
        json_array_get(json_object_get(c, "usage"), 0), "agent")));
    assert_int_equal(
        jint(json_array_get(json_object_get(c, "usage"), 0), "cost_micros"), 7);
    json_decref(c);
    {
        json_t *r = NULL;
        assert_int_equal(loom_store_run_get(st, "run_old", NULL, &r),
                         LOOM_ENOTFOUND);
    }
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM sqlite_master "
                                       "WHERE name IN ('runs', 'run_messages',"
                                       " 'runs_by_parent')"),
                     3);
    assert_int_equal(test_db_int(path, "PRAGMA user_version"),
                     loom__sqlite_migrations_len);
    test_db_remove(path);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tree_rows_and_sums),
        cmocka_unit_test(test_run_get_children_and_owner),
        cmocka_unit_test(test_child_unknown_conversation),
        cmocka_unit_test(test_migration_from_9),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
