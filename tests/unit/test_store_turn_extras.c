/*
 * Unit tests of what a turn leaves in the store besides its messages
 * (schema version 5): the context summary kept with the conversation,
 * the citations kept on the answer and the tool records kept per
 * conversation. They cover the round trip through loom_store_save_turn,
 * loom_store_conversation_get and loom_store_conversation_summary, a
 * summary replaced by a later turn and kept by a turn without one,
 * citations on the placeholder of a turn without an answer, the cascade
 * of a delete, every limit (summary bytes, citation count and bytes,
 * record count; a record over its size kept cut; column fields cut on a
 * character), malformed extras refused, and the migration of a version 4
 * database holding data. Raw SQLite is used only to look at the file.
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

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- helpers ---- */

static json_t *parse(const char *text)
{
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);

    if (!j)
        fprintf(stderr, "bad test JSON: %s\n", err.text);
    assert_non_null(j);
    return j;
}

static int64_t message_count(loom_store *st, const char *id)
{
    loom_conversation_info info;
    int64_t n;

    assert_int_equal(loom_store_conversation_info(st, id, &info), 0);
    n = info.message_count;
    loom_conversation_info_clear(&info);
    return n;
}

/* A turn: one user message in; out, an assistant message calling c1, its
 * tool result and the answer (or nothing when answer is NULL). */
typedef struct {
    loom_messages in, out;
    loom_turn_record turn;
} turn_t;

static void turn_init(turn_t *t, const char *conv, const char *answer)
{
    char cid[] = "c1", cname[] = "echo", cargs[] = "{\"x\":1}";
    loom_tool_call call = {cid, cname, cargs};

    memset(t, 0, sizeof(*t));
    assert_int_equal(loom_messages_add(&t->in, LOOM_ROLE_USER, "question"), 0);
    if (answer) {
        assert_int_equal(
            loom_messages_add_assistant(&t->out, "Looking.", NULL, &call, 1),
            0);
        assert_int_equal(
            loom_messages_add_tool_result(&t->out, "c1", "echo", "{\"x\":1}"),
            0);
        assert_int_equal(
            loom_messages_add_assistant(&t->out, answer, NULL, NULL, 0), 0);
    }
    t->turn.conversation_id = conv;
    t->turn.run_id = "run_extras";
    t->turn.model = "fake/m1";
    t->turn.input = &t->in;
    t->turn.output = &t->out;
    t->turn.finish_reason = "stop";
    t->turn.cost = -1;
}

static void turn_free(turn_t *t)
{
    loom_messages_free(&t->in);
    loom_messages_free(&t->out);
}

static const char *const cites_json =
    "[{\"number\":1,\"id\":\"ws_c7244eb2f8e0\",\"url\":"
    "\"https://loom.example/\",\"title\":\"Loom home\",\"published\":"
    "\"2024-05-01\",\"tool_call_id\":\"c1\"},{\"number\":2,\"id\":null,"
    "\"url\":\"https://b.example/\",\"title\":\"\",\"published\":null,"
    "\"tool_call_id\":null}]";

static const char *const records_json =
    "[{\"call_id\":\"c1\",\"tool\":\"echo\",\"iteration\":1,\"arguments\":"
    "{\"x\":1},\"arguments_size\":7,\"started_at_ms\":1700000000000,"
    "\"duration_ms\":1.5,\"status\":\"success\",\"error\":null,"
    "\"result_size\":7,\"truncated\":false,\"cost_micros\":0,"
    "\"documents\":[{\"id\":\"ws_c7244eb2f8e0\"}]},"
    "{\"call_id\":\"c2\",\"tool\":\"nope\",\"iteration\":2,\"arguments\":{},"
    "\"duration_ms\":0,\"status\":\"error\",\"error\":{\"code\":"
    "\"ENOTFOUND\",\"stage\":\"lookup\",\"message\":\"Unknown tool\"},"
    "\"result_size\":50,\"documents\":[]}]";

/* A string of n bytes of c; caller frees. */
static char *fill(size_t n, char c)
{
    char *s = malloc(n + 1);

    assert_non_null(s);
    memset(s, c, n);
    s[n] = '\0';
    return s;
}

/* ---- tests ---- */

static void test_roundtrip(void **state)
{
    char *path = test_db_path("extras_roundtrip.db"), *id, *summary = NULL;
    json_t *cites = parse(cites_json), *recs = parse(records_json), *j, *msgs,
           *got, *m;
    loom_store *st = test_store_open_ok(path);
    size_t covers = 99, i;
    turn_t t;

    (void)state;
    id = test_conversation_create_ok(st);
    /* A new conversation has no summary. */
    assert_int_equal(loom_store_conversation_summary(st, id, &summary, &covers),
                     0);
    assert_null(summary);
    assert_int_equal(covers, 0);
    j = test_conversation_get_ok(st, id);
    assert_true(json_is_null(json_object_get(j, "summary")));
    assert_int_equal(json_integer_value(json_object_get(j, "summary_covers")),
                     0);
    assert_int_equal(json_array_size(json_object_get(j, "tool_records")), 0);
    json_decref(j);

    turn_init(&t, id, "The answer [1][2].");
    t.turn.summary = "Earlier: the user asked about looms.";
    t.turn.summary_covers = 3;
    t.turn.citations = cites;
    t.turn.tool_records = recs;
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);

    j = test_conversation_get_ok(st, id);
    assert_string_equal(json_string_value(json_object_get(j, "summary")),
                        "Earlier: the user asked about looms.");
    assert_int_equal(json_integer_value(json_object_get(j, "summary_covers")),
                     3);
    msgs = json_object_get(j, "messages");
    assert_int_equal(json_array_size(msgs), 4);
    /* The citations are on the answer only, as they were given. */
    assert_true(json_equal(
        json_object_get(json_array_get(msgs, 3), "citations"), cites));
    assert_true(
        json_is_null(json_object_get(json_array_get(msgs, 1), "citations")));
    assert_null(json_object_get(json_array_get(msgs, 0), "citations"));
    assert_null(json_object_get(json_array_get(msgs, 2), "citations"));
    /* Every record, in order, as given plus its run id. */
    got = json_object_get(j, "tool_records");
    assert_int_equal(json_array_size(got), 2);
    json_array_foreach(got, i, m)
    {
        json_t *want = json_deep_copy(json_array_get(recs, i));
        json_object_set_new(want, "run_id", json_string("run_extras"));
        assert_true(json_equal(m, want));
        json_decref(want);
    }
    json_decref(j);

    assert_int_equal(loom_store_conversation_summary(st, id, &summary, &covers),
                     0);
    assert_string_equal(summary, "Earlier: the user asked about looms.");
    assert_int_equal(covers, 3);
    free(summary);
    summary = NULL;
    /* covers_out may be NULL. */
    assert_int_equal(loom_store_conversation_summary(st, id, &summary, NULL),
                     0);
    assert_non_null(summary);
    free(summary);
    summary = NULL;
    loom_store_free(st);

    /* The columns one filters on. */
    assert_int_equal(test_db_int(path,
                                 "SELECT count(*) FROM tool_records WHERE "
                                 "position = 0 AND tool = 'echo' AND "
                                 "call_id = 'c1' AND status = 'success' "
                                 "AND duration_ms = 1.5 AND run_id = "
                                 "'run_extras' AND created_at > 0"),
                     1);
    assert_int_equal(test_db_int(path,
                                 "SELECT count(*) FROM tool_records WHERE "
                                 "position = 1 AND tool = 'nope' AND "
                                 "status = 'error' AND duration_ms = 0"),
                     1);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages "
                                       "WHERE citations IS NOT NULL"),
                     1);
    turn_free(&t);
    json_decref(cites);
    json_decref(recs);
    free(id);
    test_db_remove(path);
    free(path);
}

static void test_summary_replaced_and_kept(void **state)
{
    char *path = test_db_path("extras_summary.db"), *id, *other,
         *summary = NULL;
    loom_store *st = test_store_open_ok(path);
    size_t covers = 0;
    turn_t t;

    (void)state;
    id = test_conversation_create_ok(st);
    other = test_conversation_create_ok(st);
    turn_init(&t, id, "one");
    t.turn.summary = "first summary";
    t.turn.summary_covers = 2;
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    turn_free(&t);

    /* A turn without a summary keeps the stored one. */
    turn_init(&t, id, "two");
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    turn_free(&t);
    assert_int_equal(loom_store_conversation_summary(st, id, &summary, &covers),
                     0);
    assert_string_equal(summary, "first summary");
    assert_int_equal(covers, 2);
    free(summary);

    /* A later summary replaces it. */
    turn_init(&t, id, "three");
    t.turn.summary = "second summary";
    t.turn.summary_covers = 7;
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    turn_free(&t);
    assert_int_equal(loom_store_conversation_summary(st, id, &summary, &covers),
                     0);
    assert_string_equal(summary, "second summary");
    assert_int_equal(covers, 7);
    free(summary);
    summary = NULL;

    /* Another conversation is untouched. */
    assert_int_equal(
        loom_store_conversation_summary(st, other, &summary, &covers), 0);
    assert_null(summary);
    assert_int_equal(covers, 0);

    /* Errors. */
    summary = (char *)1;
    covers = 5;
    assert_int_equal(
        loom_store_conversation_summary(st, "conv_000000000000000000000000",
                                        &summary, &covers),
        LOOM_ENOTFOUND);
    assert_null(summary);
    assert_int_equal(covers, 0);
    assert_int_equal(loom_store_conversation_summary(st, id, NULL, &covers),
                     LOOM_EINVALID);
    assert_int_equal(
        loom_store_conversation_summary(st, NULL, &summary, &covers),
        LOOM_EINVALID);
    assert_int_equal(
        loom_store_conversation_summary(NULL, id, &summary, &covers),
        LOOM_EINVALID);
    free(id);
    free(other);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

/* A turn with no answer puts its citations on the placeholder. */
static void test_citations_on_placeholder(void **state)
{
    char *path = test_db_path("extras_placeholder.db"), *id;
    json_t *cites = parse(cites_json), *empty = json_array(), *j, *msgs;
    loom_store *st = test_store_open_ok(path);
    turn_t t;

    (void)state;
    id = test_conversation_create_ok(st);
    turn_init(&t, id, NULL);
    t.turn.status = LOOM_TURN_ERROR;
    t.turn.error = "upstream failed";
    t.turn.citations = cites;
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    /* An empty array is no citations. */
    t.turn.citations = empty;
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    j = test_conversation_get_ok(st, id);
    msgs = json_object_get(j, "messages");
    assert_int_equal(json_array_size(msgs), 4);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(msgs, 1), "status")),
        "error");
    assert_true(json_equal(
        json_object_get(json_array_get(msgs, 1), "citations"), cites));
    assert_true(
        json_is_null(json_object_get(json_array_get(msgs, 3), "citations")));
    json_decref(j);
    turn_free(&t);
    json_decref(cites);
    json_decref(empty);
    free(id);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

static void test_delete_cascades_records(void **state)
{
    char *path = test_db_path("extras_delete.db"), *a, *b;
    json_t *recs = parse(records_json), *cites = parse(cites_json);
    loom_store *st = test_store_open_ok(path);
    turn_t t;

    (void)state;
    a = test_conversation_create_ok(st);
    b = test_conversation_create_ok(st);
    turn_init(&t, a, "answer");
    t.turn.tool_records = recs;
    t.turn.citations = cites;
    t.turn.summary = "s";
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    t.turn.conversation_id = b;
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM tool_records"), 6);
    st = test_store_open_ok(path);
    assert_int_equal(loom_store_conversation_delete(st, a), 0);
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM tool_records"), 2);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM tool_records "
                                       "WHERE conversation_id <> (SELECT id "
                                       "FROM conversations)"),
                     0);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages "
                                       "WHERE citations IS NOT NULL"),
                     1);
    turn_free(&t);
    json_decref(recs);
    json_decref(cites);
    free(a);
    free(b);
    test_db_remove(path);
    free(path);
}

static void test_summary_limit(void **state)
{
    char *path = test_db_path("extras_summary_limit.db"), *id, *big,
         *summary = NULL;
    loom_store *st = test_store_open_ok(path);
    size_t covers = 0;
    turn_t t;

    (void)state;
    id = test_conversation_create_ok(st);
    big = fill(LOOM_STORE_SUMMARY_MAX_BYTES + 1, 's');
    turn_init(&t, id, "answer");
    t.turn.summary = big;
    t.turn.summary_covers = 1;
    assert_int_equal(loom_store_save_turn(st, &t.turn), LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "262144"));
    /* Nothing of the turn was written. */
    assert_int_equal(message_count(st, id), 0);
    /* Exactly the limit is kept, byte for byte. */
    big[LOOM_STORE_SUMMARY_MAX_BYTES] = '\0';
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    assert_int_equal(loom_store_conversation_summary(st, id, &summary, &covers),
                     0);
    assert_int_equal(strlen(summary), LOOM_STORE_SUMMARY_MAX_BYTES);
    assert_string_equal(summary, big);
    assert_int_equal(covers, 1);
    free(summary);
    /* A count past what SQLite's integers hold is refused. */
    t.turn.summary = "s";
    t.turn.summary_covers = (size_t)INT64_MAX + 1;
    assert_int_equal(loom_store_save_turn(st, &t.turn), LOOM_EINVALID);
    assert_int_equal(message_count(st, id), 4);
    turn_free(&t);
    free(big);
    free(id);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

static void test_citation_limits(void **state)
{
    char *path = test_db_path("extras_cite_limit.db"), *id, *title;
    loom_store *st = test_store_open_ok(path);
    json_t *cites = json_array(), *j;
    turn_t t;

    (void)state;
    id = test_conversation_create_ok(st);
    turn_init(&t, id, "answer");
    t.turn.citations = cites;
    /* Count: LOOM_STORE_CITATIONS_MAX kept, one more refused. */
    for (int i = 0; i < LOOM_STORE_CITATIONS_MAX; i++)
        assert_int_equal(
            json_array_append_new(
                cites, json_pack("{s:i,s:s}", "number", i + 1, "id", "x")),
            0);
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    assert_int_equal(json_array_append_new(cites, json_object()), 0);
    assert_int_equal(loom_store_save_turn(st, &t.turn), LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "1000"));
    assert_int_equal(message_count(st, id), 4);
    j = test_conversation_get_ok(st, id);
    assert_int_equal(
        json_array_size(json_object_get(
            json_array_get(json_object_get(j, "messages"), 3), "citations")),
        LOOM_STORE_CITATIONS_MAX);
    json_decref(j);
    /* Bytes: 1000 citations of 8,000-byte titles fit in 8 MiB, of
     * 8,400-byte titles they do not. */
    json_array_clear(cites);
    title = fill(8400, 't');
    for (int i = 0; i < LOOM_STORE_CITATIONS_MAX; i++)
        assert_int_equal(
            json_array_append_new(
                cites, json_pack("{s:i,s:s}", "number", i + 1, "title", title)),
            0);
    assert_int_equal(loom_store_save_turn(st, &t.turn), LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "8388608"));
    assert_int_equal(message_count(st, id), 4);
    json_array_clear(cites);
    title[8000] = '\0';
    for (int i = 0; i < LOOM_STORE_CITATIONS_MAX; i++)
        assert_int_equal(
            json_array_append_new(
                cites, json_pack("{s:i,s:s}", "number", i + 1, "title", title)),
            0);
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    assert_int_equal(message_count(st, id), 8);
    free(title);
    turn_free(&t);
    json_decref(cites);
    free(id);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

static void test_record_count_limit(void **state)
{
    char *path = test_db_path("extras_record_limit.db"), *id;
    loom_store *st = test_store_open_ok(path);
    json_t *recs = json_array();
    turn_t t;

    (void)state;
    id = test_conversation_create_ok(st);
    for (int i = 0; i < LOOM_STORE_TOOL_RECORDS_MAX; i++)
        assert_int_equal(json_array_append_new(
                             recs, json_pack("{s:s,s:i}", "tool", "t", "n", i)),
                         0);
    turn_init(&t, id, "answer");
    t.turn.tool_records = recs;
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    assert_int_equal(json_array_append_new(recs, json_object()), 0);
    assert_int_equal(loom_store_save_turn(st, &t.turn), LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "10000"));
    assert_int_equal(message_count(st, id), 4);
    turn_free(&t);
    json_decref(recs);
    free(id);
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM tool_records"),
                     LOOM_STORE_TOOL_RECORDS_MAX);
    assert_int_equal(
        test_db_int(path, "SELECT max(position) FROM tool_records"),
        LOOM_STORE_TOOL_RECORDS_MAX - 1);
    test_db_remove(path);
    free(path);
}

/* A record over its limit is kept cut; the turn is saved. */
static void test_record_cut(void **state)
{
    /* {"call_id":"x","pad":""} is 24 bytes as compact JSON. */
    const size_t whole = LOOM_STORE_TOOL_RECORD_MAX_BYTES - 24;
    char *path = test_db_path("extras_record_cut.db"), *id, *pad, *tool;
    loom_store *st = test_store_open_ok(path);
    json_t *recs = json_array(), *big, *j, *r;
    turn_t t;

    (void)state;
    id = test_conversation_create_ok(st);
    pad = fill(whole + 1, 'p');
    /* "a" then 150 two-byte characters: 301 bytes, cut on a character. */
    tool = malloc(302);
    assert_non_null(tool);
    tool[0] = 'a';
    for (int i = 0; i < 150; i++)
        memcpy(tool + 1 + 2 * i, "\xc3\xa9", 2);
    tool[301] = '\0';
    /* Exactly the limit: kept whole. */
    json_array_append_new(
        recs, json_pack("{s:s,s:s%}", "call_id", "x", "pad", pad, whole));
    /* One byte more: cut. */
    json_array_append_new(recs,
                          json_pack("{s:s,s:s}", "call_id", "y", "pad", pad));
    /* A big record with the usual fields. */
    big = json_pack("{s:s,s:s,s:i,s:{s:s},s:f,s:s,s:n,s:b,s:[i],s:s}",
                    "call_id", "z", "tool", tool, "iteration", 3, "arguments",
                    "text", pad, "duration_ms", 2.5, "status", "success",
                    "error", "truncated", 1, "documents", 7, "note", pad);
    assert_non_null(big);
    json_array_append_new(recs, big);
    turn_init(&t, id, "answer");
    t.turn.tool_records = recs;
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    j = test_conversation_get_ok(st, id);
    r = json_array_get(json_object_get(j, "tool_records"), 0);
    assert_int_equal(json_string_length(json_object_get(r, "pad")), whole);
    assert_null(json_object_get(r, "record_cut"));
    r = json_array_get(json_object_get(j, "tool_records"), 1);
    assert_true(json_is_true(json_object_get(r, "record_cut")));
    assert_int_equal(json_integer_value(json_object_get(r, "record_bytes")),
                     LOOM_STORE_TOOL_RECORD_MAX_BYTES + 1);
    assert_string_equal(json_string_value(json_object_get(r, "call_id")), "y");
    assert_int_equal(json_string_length(json_object_get(r, "pad")), 256);
    r = json_array_get(json_object_get(j, "tool_records"), 2);
    assert_true(json_is_true(json_object_get(r, "record_cut")));
    assert_string_equal(json_string_value(json_object_get(r, "status")),
                        "success");
    assert_string_equal(json_string_value(json_object_get(r, "run_id")),
                        "run_extras");
    assert_int_equal(json_integer_value(json_object_get(r, "iteration")), 3);
    assert_true(json_real_value(json_object_get(r, "duration_ms")) == 2.5);
    assert_true(json_is_null(json_object_get(r, "error")));
    assert_true(json_is_true(json_object_get(r, "truncated")));
    /* Objects and arrays go; strings are cut on a character. */
    assert_null(json_object_get(r, "arguments"));
    assert_null(json_object_get(r, "documents"));
    assert_int_equal(json_string_length(json_object_get(r, "tool")), 255);
    assert_int_equal(json_string_length(json_object_get(r, "note")), 256);
    json_decref(j);
    loom_store_free(st);
    /* The columns: whole values where short, cut where long. */
    assert_int_equal(test_db_int(path, "SELECT length(CAST(tool AS BLOB)) FROM "
                                       "tool_records WHERE call_id = 'z'"),
                     255);
    assert_int_equal(test_db_int(path, "SELECT duration_ms * 10 FROM "
                                       "tool_records WHERE call_id = 'z'"),
                     25);
    assert_true(test_db_int(path,
                            "SELECT max(length(record)) FROM tool_records "
                            "WHERE call_id <> 'x'") < 4096);
    assert_int_equal(message_count(st = test_store_open_ok(path), id), 4);
    loom_store_free(st);
    turn_free(&t);
    json_decref(recs);
    free(pad);
    free(tool);
    free(id);
    test_db_remove(path);
    free(path);
}

static void test_malformed_extras(void **state)
{
    char *path = test_db_path("extras_bad.db"), *id;
    loom_store *st = test_store_open_ok(path);
    json_t *obj = json_object(), *arr_num = json_pack("[i]", 1);
    turn_t t;

    (void)state;
    id = test_conversation_create_ok(st);
    turn_init(&t, id, "answer");
    t.turn.citations = obj;
    assert_int_equal(loom_store_save_turn(st, &t.turn), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "citations"));
    t.turn.citations = arr_num;
    assert_int_equal(loom_store_save_turn(st, &t.turn), LOOM_EINVALID);
    t.turn.citations = NULL;
    t.turn.tool_records = obj;
    assert_int_equal(loom_store_save_turn(st, &t.turn), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "tool records"));
    t.turn.tool_records = arr_num;
    assert_int_equal(loom_store_save_turn(st, &t.turn), LOOM_EINVALID);
    assert_int_equal(message_count(st, id), 0);
    turn_free(&t);
    json_decref(obj);
    json_decref(arr_num);
    free(id);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

static void test_migration_from_v4(void **state)
{
    char *path = test_db_path("extras_v4.db"), *id, *summary = NULL;
    json_t *recs = parse(records_json), *cites = parse(cites_json), *j, *msgs;
    loom_store *st = NULL;
    size_t covers = 9;
    turn_t t;

    (void)state;
    assert_int_equal(loom__store_sqlite_open_version(&st, path, 4), 0);
    assert_int_equal(loom_store_schema_version(st), 4);
    id = test_conversation_create_ok(st);
    loom_store_free(st);
    {
        char sql[1024];
        snprintf(sql, sizeof(sql),
                 "UPDATE conversations SET title = 'from v4', "
                 "message_count = 2 WHERE id = '%s';"
                 "INSERT INTO messages (id, conversation_id, position, role, "
                 "content, created_at) VALUES ('msg_1', '%s', 0, 'user', "
                 "'from v4', 1);"
                 "INSERT INTO messages (id, conversation_id, position, role, "
                 "content, created_at) VALUES ('msg_2', '%s', 1, "
                 "'assistant', 'yes', 1);",
                 id, id, id);
        test_db_exec(path, sql);
    }
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM sqlite_master "
                                       "WHERE name = 'tool_records'"),
                     0);

    /* Opening migrates it to 5 and keeps the data. */
    st = test_store_open_ok(path);
    assert_int_equal(loom_store_schema_version(st),
                     loom__sqlite_migrations_len);
    j = test_conversation_get_ok(st, id);
    assert_string_equal(json_string_value(json_object_get(j, "title")),
                        "from v4");
    assert_true(json_is_null(json_object_get(j, "summary")));
    assert_int_equal(json_integer_value(json_object_get(j, "summary_covers")),
                     0);
    assert_int_equal(json_array_size(json_object_get(j, "tool_records")), 0);
    msgs = json_object_get(j, "messages");
    assert_int_equal(json_array_size(msgs), 2);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(msgs, 1), "content")),
        "yes");
    assert_true(
        json_is_null(json_object_get(json_array_get(msgs, 1), "citations")));
    json_decref(j);
    assert_int_equal(loom_store_conversation_summary(st, id, &summary, &covers),
                     0);
    assert_null(summary);
    assert_int_equal(covers, 0);
    /* And takes new turns with everything. */
    turn_init(&t, id, "after");
    t.turn.summary = "after the migration";
    t.turn.summary_covers = 2;
    t.turn.citations = cites;
    t.turn.tool_records = recs;
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    assert_int_equal(message_count(st, id), 6);
    assert_int_equal(loom_store_conversation_summary(st, id, &summary, &covers),
                     0);
    assert_string_equal(summary, "after the migration");
    assert_int_equal(covers, 2);
    free(summary);
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "PRAGMA user_version"),
                     loom__sqlite_migrations_len);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM sqlite_master "
                                       "WHERE name IN ('tool_records', "
                                       "'tool_records_by_conversation')"),
                     2);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM tool_records"), 2);
    turn_free(&t);
    json_decref(recs);
    json_decref(cites);
    free(id);
    test_db_remove(path);
    free(path);
}

static void test_plan_kept_and_limited(void **state)
{
    char *path = test_db_path("extras_plan.db"), *id, *big;
    loom_store *st = test_store_open_ok(path);
    json_t *plan, *got = NULL, *conv = NULL;
    turn_t t;

    (void)state;
    id = test_conversation_create_ok(st);
    assert_int_equal(loom_store_conversation_plan(st, id, &got), 0);
    assert_null(got);
    plan = json_pack("{s:s,s:[{s:s,s:s,s:s}]}", "goal", "Ship it", "tasks",
                     "id", "t1", "description", "Write the code", "status",
                     "in_progress");
    assert_non_null(plan);
    turn_init(&t, id, "one");
    t.turn.plan = plan;
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    turn_free(&t);
    /* A turn without a plan keeps the stored one. */
    turn_init(&t, id, "two");
    assert_int_equal(loom_store_save_turn(st, &t.turn), 0);
    turn_free(&t);
    assert_int_equal(loom_store_conversation_plan(st, id, &got), 0);
    assert_true(json_equal(got, plan));
    json_decref(got);
    assert_int_equal(loom_store_conversation_get(st, id, &conv), 0);
    assert_true(json_equal(json_object_get(conv, "plan"), plan));
    json_decref(conv);
    /* Not an object; over the limit: refused, nothing written. */
    turn_init(&t, id, "three");
    t.turn.plan = json_object_get(plan, "goal");
    assert_int_equal(loom_store_save_turn(st, &t.turn), LOOM_EINVALID);
    big = fill(LOOM_STORE_PLAN_MAX_BYTES, 'p');
    json_object_set_new(plan, "goal", json_string(big));
    t.turn.plan = plan;
    assert_int_equal(loom_store_save_turn(st, &t.turn), LOOM_ETOOLARGE);
    turn_free(&t);
    assert_int_equal(loom_store_conversation_plan(st, id, &got), 0);
    assert_string_equal(json_string_value(json_object_get(got, "goal")),
                        "Ship it");
    json_decref(got);
    assert_int_equal(
        loom_store_conversation_plan(st, "conv_000000000000000000000000",
                                     &got),
        LOOM_ENOTFOUND);
    free(big);
    json_decref(plan);
    free(id);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_summary_replaced_and_kept),
        cmocka_unit_test(test_citations_on_placeholder),
        cmocka_unit_test(test_delete_cascades_records),
        cmocka_unit_test(test_summary_limit),
        cmocka_unit_test(test_citation_limits),
        cmocka_unit_test(test_record_count_limit),
        cmocka_unit_test(test_record_cut),
        cmocka_unit_test(test_malformed_extras),
        cmocka_unit_test(test_migration_from_v4),
        cmocka_unit_test(test_plan_kept_and_limited),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
