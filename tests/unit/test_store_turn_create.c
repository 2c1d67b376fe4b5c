/*
 * Unit tests of a turn saved with its conversation's creation
 * (loom_turn_record.create_conversation): the rows it leaves are those of
 * a conversation created first (loom_store_conversation_create_for) and
 * then given the same turn, owner and transcript hashes included, for a
 * user and for the anonymous one; the conversation is created at the turn's
 * start; a save that fails after the conversation's row was written leaves no
 * conversation behind, and the same save then succeeds; a taken id and a
 * sub-agent's run are refused. Raw SQLite is used only to look at the
 * file and to make one save fail (a trigger).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "loom/store.h"
#include "store_fixture.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A turn of conversation conv: hi, a call of `lookup` with its result,
 * the answer; two priced model calls; a plan and a title. */
typedef struct {
    loom_messages in, out;
    loom_turn_usage usage[2];
    json_t *plan;
    loom_turn_record rec;
} turn_t;

static void turn_init(turn_t *t, const char *conv, const char *run_id,
                      const char *owner)
{
    char cid[] = "k1", cname[] = "lookup", cargs[] = "{\"q\":\"x\"}";
    loom_tool_call call = {cid, cname, cargs};

    memset(t, 0, sizeof(*t));
    assert_int_equal(loom_messages_add(&t->in, LOOM_ROLE_USER, "hi there"), 0);
    assert_int_equal(
        loom_messages_add_assistant(&t->out, "Checking.", "hmm", &call, 1), 0);
    assert_int_equal(
        loom_messages_add_tool_result(&t->out, "k1", "lookup", "found"), 0);
    assert_int_equal(
        loom_messages_add_assistant(&t->out, "the answer", NULL, NULL, 0), 0);
    for (int i = 0; i < 2; i++) {
        t->usage[i].iteration = i + 1;
        t->usage[i].usage.prompt_tokens = 100 + i;
        t->usage[i].usage.completion_tokens = 10 + i;
        t->usage[i].usage.total_tokens = 110 + 2 * i;
        t->usage[i].usage.cost_micros = 1000 + i;
        t->usage[i].cost = (double)(1000 + i) / 1e6;
    }
    t->plan = json_pack("{s:[{s:s,s:s}]}", "todos", "content", "look", "status",
                        "done");
    assert_non_null(t->plan);
    t->rec.conversation_id = conv;
    t->rec.run_id = run_id;
    t->rec.user_id = owner;
    t->rec.agent = "main";
    t->rec.model = "fake/m";
    t->rec.input = &t->in;
    t->rec.output = &t->out;
    t->rec.status = LOOM_TURN_OK;
    t->rec.finish_reason = "stop";
    t->rec.usage = t->usage;
    t->rec.usage_len = 2;
    t->rec.cost = 2001e-6;
    t->rec.plan = t->plan;
    t->rec.title = "A lookup";
    t->rec.started_at = 1234567;
}

static void turn_free(turn_t *t)
{
    loom_messages_free(&t->in);
    loom_messages_free(&t->out);
    json_decref(t->plan);
}

static long long conv_count(const char *path)
{
    return test_db_int(path, "SELECT count(*) FROM conversations");
}

/* The same turn in a conversation created first and in one created with
 * it: the same rows, the same owner (owner NULL: anonymous). bare: the
 * turn has no title, summary nor plan; else a summary too. */
static void same_rows_for(const char *owner, int bare)
{
    char *path = test_db_path("turn-create.db");
    loom_store *st = test_store_open_ok(path);
    loom_conversation_info info;
    turn_t a, b;

    turn_init(&a, "conv_first", "run_a", owner);
    turn_init(&b, "conv_with", "run_b", owner);
    b.rec.create_conversation = 1;
    for (turn_t *t = &a; t; t = t == &a ? &b : NULL) {
        if (bare) {
            t->rec.title = NULL;
            t->rec.plan = NULL;
        } else {
            t->rec.summary = "Earlier: greetings.";
            t->rec.summary_covers = 2;
        }
    }
    assert_int_equal(
        loom_store_conversation_create_for(st, "conv_first", owner), 0);
    assert_int_equal(loom_store_save_turn(st, &a.rec), 0);
    assert_int_equal(loom_store_save_turn(st, &b.rec), 0);

    memset(&info, 0, sizeof(info));
    assert_int_equal(loom_store_conversation_info(st, "conv_with", &info), 0);
    assert_int_equal(info.message_count, 4);
    assert_string_equal(info.title, bare ? "hi there" : "A lookup");
    if (owner)
        assert_string_equal(info.user_id, owner);
    else
        assert_null(info.user_id);
    /* Created when the turn started, as a conversation created before
     * the model call is. */
    assert_int_equal(info.created_at, 1234567);
    assert_true(info.updated_at >= info.created_at);
    loom_conversation_info_clear(&info);
    loom_store_free(st);

    test_db_same_conversation(path, "conv_first", "conv_with");
    turn_free(&a);
    turn_free(&b);
    test_db_remove(path);
    free(path);
}

static void test_same_rows_as_created_first(void **state)
{
    (void)state;
    same_rows_for("ann", 0);
    same_rows_for(NULL, 0);
    same_rows_for("ann", 1);
}

/* A save that fails after the conversation's row is written (a message
 * refused) writes nothing, that row included; once the cause is gone the
 * same save, with the same id, succeeds. */
static void test_failed_save_leaves_no_conversation(void **state)
{
    char *path = test_db_path("turn-create-fail.db");
    loom_store *st = test_store_open_ok(path);
    loom_conversation_info info;
    turn_t t;

    (void)state;
    turn_init(&t, "conv_with", "run_b", "ann");
    t.rec.create_conversation = 1;
    test_db_exec(path, "CREATE TRIGGER no_messages BEFORE INSERT ON messages "
                       "BEGIN SELECT RAISE(ABORT, 'no messages today'); END");
    assert_int_not_equal(loom_store_save_turn(st, &t.rec), 0);
    memset(&info, 0, sizeof(info));
    assert_int_equal(loom_store_conversation_info(st, "conv_with", &info),
                     LOOM_ENOTFOUND);
    assert_int_equal(conv_count(path), 0);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM runs"), 0);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM usage"), 0);

    test_db_exec(path, "DROP TRIGGER no_messages");
    assert_int_equal(loom_store_save_turn(st, &t.rec), 0);
    assert_int_equal(loom_store_conversation_info(st, "conv_with", &info), 0);
    assert_int_equal(info.message_count, 4);
    assert_string_equal(info.user_id, "ann");
    loom_conversation_info_clear(&info);
    loom_store_free(st);
    turn_free(&t);
    test_db_remove(path);
    free(path);
}

/* An id taken is refused and the conversation that has it is left as
 * it was; so is a sub-agent's run or a bad id asking to create one. */
static void test_refused(void **state)
{
    char *path = test_db_path("turn-create-refused.db");
    loom_store *st = test_store_open_ok(path);
    char long_id[200];
    turn_t t;

    (void)state;
    turn_init(&t, "conv_taken", "run_a", "ann");
    t.rec.create_conversation = 1;
    assert_int_equal(loom_store_save_turn(st, &t.rec), 0);
    t.rec.run_id = "run_b";
    assert_int_equal(loom_store_save_turn(st, &t.rec), LOOM_ERROR);
    assert_int_equal(test_db_int(path, "SELECT message_count FROM "
                                       "conversations WHERE id = 'conv_taken'"),
                     4);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM runs"), 1);

    t.rec.conversation_id = "conv_kid";
    t.rec.parent_run_id = "run_a";
    t.rec.depth = 1;
    assert_int_equal(loom_store_save_turn(st, &t.rec), LOOM_EINVALID);
    t.rec.parent_run_id = NULL;
    t.rec.depth = 0;
    t.rec.conversation_id = "";
    assert_int_equal(loom_store_save_turn(st, &t.rec), LOOM_EINVALID);
    memset(long_id, 'c', sizeof(long_id) - 1);
    long_id[sizeof(long_id) - 1] = '\0';
    t.rec.conversation_id = long_id;
    assert_int_equal(loom_store_save_turn(st, &t.rec), LOOM_EINVALID);
    assert_int_equal(conv_count(path), 1);
    loom_store_free(st);
    turn_free(&t);
    test_db_remove(path);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_rows_as_created_first),
        cmocka_unit_test(test_failed_save_leaves_no_conversation),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
