/*
 * Unit tests of loom_store_conversation_match (docs/store.md#client-
 * visible-form): turns saved with loom_store_save_turn, then looked up by
 * the messages a client would resend. They cover loom's own tool calls
 * and results left out of the client's form, the streamed and
 * non-streamed forms of an answer that spoke before a tool call, the
 * client's own calls kept, the owner set by the first turn (anonymous
 * only for anonymous, a user only for that user) and kept by later
 * turns, a conversation migrated with messages never matched, the most
 * recent of two equal conversations, the streamed hash stored only once
 * the two forms part, and bad arguments.
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

static const loom_tool_call time_call = {"call_t", "get_time", "{}"};
static const loom_tool_call weather_call = {"call_w", "get_weather",
                                            "{\"city\":\"Paris\"}"};

/* Saves a turn of conv for user (NULL: anonymous): input, then output. */
static void save(loom_store *st, const char *conv, const char *user,
                 const loom_messages *in, const loom_messages *out)
{
    loom_turn_record t;

    memset(&t, 0, sizeof(t));
    t.conversation_id = conv;
    t.run_id = "run_1";
    t.user_id = user;
    t.model = "fake/m";
    t.input = in;
    t.output = out;
    t.cost = -1;
    if (loom_store_save_turn(st, &t) != 0)
        fail_msg("save: %s", loom_error_last());
}

/* The id matched for user and msgs; NULL when none (caller frees). */
static char *match(loom_store *st, const char *user, const loom_messages *m)
{
    char *id = NULL;
    int rc = loom_store_conversation_match(st, user, m, &id);

    if (rc == LOOM_ENOTFOUND) {
        assert_null(id);
        return NULL;
    }
    assert_int_equal(rc, 0);
    assert_non_null(id);
    return id;
}

static void expect_match(loom_store *st, const char *user,
                         const loom_messages *m, const char *want)
{
    char *id = match(st, user, m);

    if (!want) {
        if (id)
            fail_msg("matched %s, want none", id);
        return;
    }
    assert_non_null(id);
    assert_string_equal(id, want);
    free(id);
}

/* A client's history: "u:text", "a:text" or "t:call id:text". */
static void client(loom_messages *m, const char *const *items, size_t n)
{
    memset(m, 0, sizeof(*m));
    for (size_t i = 0; i < n; i++) {
        const char *s = items[i] + 2;
        switch (items[i][0]) {
        case 'u':
            assert_int_equal(loom_messages_add(m, LOOM_ROLE_USER, s), 0);
            break;
        case 'a':
            assert_int_equal(loom_messages_add(m, LOOM_ROLE_ASSISTANT, s), 0);
            break;
        default: {
            char id[32];
            const char *colon = strchr(s, ':');
            snprintf(id, sizeof(id), "%.*s", (int)(colon - s), s);
            assert_int_equal(
                loom_messages_add_tool_result(m, id, NULL, colon + 1), 0);
        }
        }
    }
}

#define CLIENT(m, ...)                                                         \
    do {                                                                       \
        const char *const it_[] = {__VA_ARGS__};                               \
        client(m, it_, sizeof(it_) / sizeof(it_[0]));                          \
    } while (0)

/* Whether the client's history (CLIENT's items) matches want (NULL:
 * none) for user. */
#define EXPECT(st, user, want, ...)                                            \
    do {                                                                       \
        loom_messages em_;                                                     \
        CLIENT(&em_, __VA_ARGS__);                                             \
        expect_match(st, user, &em_, want);                                    \
        loom_messages_free(&em_);                                              \
    } while (0)

/* Frees what a test held and removes its database. */
static void finish(loom_store *st, char *path, loom_messages *in,
                   loom_messages *out)
{
    loom_messages_free(in);
    loom_messages_free(out);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

/* A store at schema version (of a file at path, closed) with two new
 * conversations, *a and *b (caller frees). */
static void old_store(const char *path, int version, char **a, char **b)
{
    loom_store *st = NULL;

    assert_int_equal(loom__store_sqlite_open_version(&st, path, version), 0);
    *a = test_conversation_create_ok(st);
    *b = test_conversation_create_ok(st);
    loom_store_free(st);
}

/* Makes conversation id the older of two that went the same way. */
static void make_older(const char *path, const char *id)
{
    char sql[256];

    snprintf(sql, sizeof(sql),
             "UPDATE conversations SET updated_at = 1 WHERE id = '%s'", id);
    test_db_exec(path, sql);
}

/* A get_time turn: the call (with text before it), its result, the
 * answer. */
static void time_turn(loom_messages *out, const char *before,
                      const char *answer)
{
    memset(out, 0, sizeof(*out));
    assert_int_equal(
        loom_messages_add_assistant(out, before, NULL, &time_call, 1), 0);
    assert_int_equal(
        loom_messages_add_tool_result(out, "call_t", "get_time", "12:00"), 0);
    assert_int_equal(loom_messages_add(out, LOOM_ROLE_ASSISTANT, answer), 0);
}

static void test_server_tools_left_out(void **state)
{
    char *path = test_db_path("transcript_tools.db");
    loom_store *st = test_store_open_ok(path);
    char *conv = test_conversation_create_ok(st);
    loom_messages in, out;
    (void)state;

    CLIENT(&in, "u:time?");
    time_turn(&out, "Let me look. ", "It is noon.");
    save(st, conv, NULL, &in, &out);

    /* Non-streamed: the last call's text; streamed: all of it. */
    EXPECT(st, NULL, conv, "u:time?", "a:It is noon.");
    EXPECT(st, NULL, conv, "u:time?", "a:Let me look. It is noon.");
    /* Anything else is not it. */
    EXPECT(st, NULL, NULL, "u:time?", "a:Let me look. ");
    EXPECT(st, NULL, NULL, "u:time?", "a:It is noon");
    EXPECT(st, NULL, NULL, "u:time?");
    /* The stored form (with loom's call and result) is not the client's. */
    expect_match(st, NULL, &out, NULL);

    /* A second turn extends both forms. */
    loom_messages_free(&in);
    loom_messages_free(&out);
    CLIENT(&in, "u:and now?");
    CLIENT(&out, "a:Still noon.");
    save(st, conv, NULL, &in, &out);
    EXPECT(st, NULL, conv, "u:time?", "a:It is noon.", "u:and now?",
           "a:Still noon.");
    EXPECT(st, NULL, NULL, "u:time?", "a:It is noon.");

    free(conv);
    finish(st, path, &in, &out);
}

static void test_client_calls_kept(void **state)
{
    char *path = test_db_path("transcript_client.db");
    loom_store *st = test_store_open_ok(path);
    char *conv = test_conversation_create_ok(st);
    loom_tool_call both[2] = {time_call, weather_call};
    loom_messages in, out, m;
    (void)state;

    /* One call of loom's, answered in the turn, one of the client's. */
    CLIENT(&in, "u:time and weather?");
    memset(&out, 0, sizeof(out));
    assert_int_equal(loom_messages_add_assistant(&out, NULL, NULL, both, 2), 0);
    assert_int_equal(
        loom_messages_add_tool_result(&out, "call_t", "get_time", "12:00"), 0);
    save(st, conv, NULL, &in, &out);

    /* The client holds an assistant message with its own call only
     * (arguments as it likes them), and adds its result. */
    CLIENT(&m, "u:time and weather?");
    assert_int_equal(
        loom_messages_add_assistant(
            &m, "", NULL, &(loom_tool_call){"call_w", "get_weather", "{}"}, 1),
        0);
    expect_match(st, NULL, &m, conv);
    loom_messages_free(&m);
    CLIENT(&m, "u:time and weather?");
    assert_int_equal(loom_messages_add_assistant(&m, NULL, NULL, both, 2), 0);
    expect_match(st, NULL, &m, NULL);
    loom_messages_free(&m);

    /* Its result is the next turn's input, kept as sent. */
    loom_messages_free(&in);
    loom_messages_free(&out);
    CLIENT(&in, "t:call_w:sunny");
    CLIENT(&out, "a:Noon and sunny.");
    save(st, conv, NULL, &in, &out);
    CLIENT(&m, "u:time and weather?");
    assert_int_equal(
        loom_messages_add_assistant(&m, NULL, NULL, &weather_call, 1), 0);
    assert_int_equal(loom_messages_add_tool_result(&m, "call_w", NULL, "sunny"),
                     0);
    assert_int_equal(
        loom_messages_add(&m, LOOM_ROLE_ASSISTANT, "Noon and sunny."), 0);
    expect_match(st, NULL, &m, conv);
    loom_messages_free(&m);

    free(conv);
    finish(st, path, &in, &out);
}

static void test_owner(void **state)
{
    char *path = test_db_path("transcript_owner.db");
    loom_store *st = test_store_open_ok(path);
    char *alice = test_conversation_create_ok(st);
    char *anon = test_conversation_create_ok(st);
    loom_messages in, out, m;
    (void)state;

    CLIENT(&in, "u:hi");
    CLIENT(&out, "a:Hello.");
    save(st, alice, "alice", &in, &out);
    save(st, anon, NULL, &in, &out);
    CLIENT(&m, "u:hi", "a:Hello.");
    expect_match(st, "alice", &m, alice);
    expect_match(st, NULL, &m, anon);
    expect_match(st, "bob", &m, NULL);
    loom_messages_free(&m);

    /* A later turn by someone else (by id) does not change the owner. */
    loom_messages_free(&in);
    loom_messages_free(&out);
    CLIENT(&in, "u:more");
    CLIENT(&out, "a:Sure.");
    save(st, alice, "bob", &in, &out);
    CLIENT(&m, "u:hi", "a:Hello.", "u:more", "a:Sure.");
    expect_match(st, "alice", &m, alice);
    expect_match(st, "bob", &m, NULL);
    expect_match(st, NULL, &m, NULL);
    loom_messages_free(&m);

    /* Bad arguments. */
    {
        char *id = (char *)1, big[LOOM_STORE_USER_ID_MAX + 2];
        memset(big, 'u', sizeof(big) - 1);
        big[sizeof(big) - 1] = '\0';
        CLIENT(&m, "u:hi", "a:Hello.");
        assert_int_equal(loom_store_conversation_match(st, "", &m, &id),
                         LOOM_EINVALID);
        assert_null(id);
        assert_int_equal(loom_store_conversation_match(st, big, &m, &id),
                         LOOM_EINVALID);
        loom_messages_free(&m);
        memset(&m, 0, sizeof(m));
        assert_int_equal(loom_store_conversation_match(st, NULL, &m, &id),
                         LOOM_ENOTFOUND);
        assert_int_equal(loom_store_conversation_match(NULL, NULL, &m, &id),
                         LOOM_EINVALID);
    }

    free(alice);
    free(anon);
    finish(st, path, &in, &out);
}

/* Two conversations that went the same way: the most recent goes on. */
static void test_most_recent(void **state)
{
    char *path = test_db_path("transcript_recent.db");
    loom_store *st = test_store_open_ok(path);
    char *older = test_conversation_create_ok(st);
    char *newer = test_conversation_create_ok(st);
    loom_messages in, out;
    (void)state;

    CLIENT(&in, "u:hi");
    CLIENT(&out, "a:Hello.");
    save(st, older, NULL, &in, &out);
    save(st, newer, NULL, &in, &out);
    /* Ordered by updated_at: make the first one older for sure. */
    make_older(path, older);
    EXPECT(st, NULL, newer, "u:hi", "a:Hello.");

    free(older);
    free(newer);
    finish(st, path, &in, &out);
}

/* A conversation holding messages from before version 8 is never found;
 * an empty one gets its hashes with its first turn. */
static void test_migrated(void **state)
{
    char *path = test_db_path("transcript_v6.db");
    loom_store *st = NULL;
    char *old, *empty, sql[1024];
    loom_messages in, out;
    (void)state;

    old_store(path, 6, &old, &empty);
    snprintf(sql, sizeof(sql),
             "UPDATE conversations SET message_count = 2 WHERE id = '%s';"
             "INSERT INTO messages (id, conversation_id, position, role, "
             "content, created_at) VALUES ('msg_1', '%s', 0, 'user', 'hi', "
             "1);"
             "INSERT INTO messages (id, conversation_id, position, role, "
             "content, created_at) VALUES ('msg_2', '%s', 1, 'assistant', "
             "'Hello.', 1);",
             old, old, old);
    test_db_exec(path, sql);

    st = test_store_open_ok(path);
    CLIENT(&in, "u:more");
    CLIENT(&out, "a:Sure.");
    save(st, old, NULL, &in, &out);
    EXPECT(st, NULL, NULL, "u:hi", "a:Hello.", "u:more", "a:Sure.");
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM conversations "
                                       "WHERE prefix_hash IS NULL"),
                     2);

    save(st, empty, NULL, &in, &out);
    EXPECT(st, NULL, empty, "u:more", "a:Sure.");

    free(old);
    free(empty);
    finish(st, path, &in, &out);
}

/* The streamed hash is stored only once the two chains part (the model
 * spoke before loom's tools ran): until then it is NULL and reads as the
 * other, and a turn after the parting extends each chain from its own
 * hash. Version 20 drops the copies rows stored before kept. */
static void test_streamed_hash_when_parted(void **state)
{
    char *path = test_db_path("transcript_parted.db");
    loom_store *st = NULL;
    char *conv, *other, sql[512];
    loom_messages in, out;
    (void)state;

    old_store(path, 19, &conv, &other);
    assert_int_equal(loom__store_sqlite_open_version(&st, path, 19), 0);
    CLIENT(&in, "u:hi");
    CLIENT(&out, "a:Hello.");
    save(st, conv, NULL, &in, &out);
    save(st, other, NULL, &in, &out);
    loom_store_free(st);
    /* As a store before version 20 wrote them: both hashes, the same. */
    test_db_exec(path, "UPDATE conversations SET prefix_hash_streamed = "
                       "prefix_hash");
    st = test_store_open_ok(path);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM conversations "
                                       "WHERE prefix_hash IS NOT NULL AND "
                                       "prefix_hash_streamed IS NULL"),
                     2);
    make_older(path, other);
    EXPECT(st, NULL, conv, "u:hi", "a:Hello.");

    loom_messages_free(&in);
    loom_messages_free(&out);
    CLIENT(&in, "u:time?");
    time_turn(&out, "Let me look. ", "It is noon.");
    snprintf(sql, sizeof(sql),
             "SELECT prefix_hash_streamed IS NULL FROM conversations "
             "WHERE id = '%s'",
             conv);
    save(st, conv, NULL, &in, &out);
    /* Text before loom's tool call: the chains part, both are kept. */
    assert_int_equal(test_db_int(path, sql), 0);
    EXPECT(st, NULL, conv, "u:hi", "a:Hello.", "u:time?", "a:It is noon.");
    EXPECT(st, NULL, conv, "u:hi", "a:Hello.", "u:time?",
           "a:Let me look. It is noon.");

    /* The next turn extends each from its own. */
    loom_messages_free(&in);
    loom_messages_free(&out);
    CLIENT(&in, "u:thanks");
    CLIENT(&out, "a:You are welcome.");
    save(st, conv, NULL, &in, &out);
    assert_int_equal(test_db_int(path, sql), 0);
    EXPECT(st, NULL, conv, "u:hi", "a:Hello.", "u:time?", "a:It is noon.",
           "u:thanks", "a:You are welcome.");
    EXPECT(st, NULL, conv, "u:hi", "a:Hello.", "u:time?",
           "a:Let me look. It is noon.", "u:thanks", "a:You are welcome.");

    /* The other conversation's chains never parted. */
    save(st, other, NULL, &in, &out);
    snprintf(sql, sizeof(sql),
             "SELECT prefix_hash IS NOT NULL AND prefix_hash_streamed IS "
             "NULL FROM conversations WHERE id = '%s'",
             other);
    assert_int_equal(test_db_int(path, sql), 1);
    EXPECT(st, NULL, other, "u:hi", "a:Hello.", "u:thanks",
           "a:You are welcome.");

    free(conv);
    free(other);
    finish(st, path, &in, &out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_server_tools_left_out),
        cmocka_unit_test(test_client_calls_kept),
        cmocka_unit_test(test_owner),
        cmocka_unit_test(test_most_recent),
        cmocka_unit_test(test_migrated),
        cmocka_unit_test(test_streamed_hash_when_parted),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
