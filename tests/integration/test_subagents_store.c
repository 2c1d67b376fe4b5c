/*
 * Sub-agents in the store (docs/agents.md "Sub-agents", docs/store.md
 * "Runs") through the session layer in front of loom-fake-upstream: a
 * parent calling two children in parallel, one of which fails and one
 * of which calls a grandchild, each child stored when it ends as a run
 * linked to its parent, with its messages per its own agent's data
 * policy and none in the parent's conversation; the usage rows of the
 * tree summing exactly to the parent's total; a child whose store write
 * fails is logged and counted and fails neither itself nor its parent.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fake.h"
#include "loom/recorder.h"
#include "loom/session.h"
#include "loom/store.h"
#include "store_fixture.h"
#include "testutil.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* $1 and $2 per million tokens: a prompt token costs 1 micro-dollar, a
 * completion token 2. */
static const char script[] =
    "{\"rules\": ["
    " {\"match\": {\"system\": \"You are main\"}, \"responses\": ["
    "   {\"tool_calls\": ["
    "     {\"id\": \"call_r\", \"name\": \"researcher\","
    "      \"arguments\": \"{\\\"task\\\":\\\"find apples\\\"}\"},"
    "     {\"id\": \"call_w\", \"name\": \"writer\","
    "      \"arguments\": \"{\\\"task\\\":\\\"write pears\\\"}\"}],"
    "    \"usage\": {\"prompt_tokens\": 100, \"completion_tokens\": 10,"
    "              \"total_tokens\": 110}},"
    "   {\"text\": [\"Main: 5 apples.\"],"
    "    \"usage\": {\"prompt_tokens\": 100, \"completion_tokens\": 10,"
    "              \"total_tokens\": 110}}]},"
    " {\"match\": {\"system\": \"You research\"}, \"responses\": ["
    "   {\"tool_calls\": [{\"id\": \"call_f\", \"name\": \"fetcher\","
    "     \"arguments\": \"{\\\"task\\\":\\\"fetch apples\\\"}\"}],"
    "    \"usage\": {\"prompt_tokens\": 20, \"completion_tokens\": 4,"
    "              \"total_tokens\": 24}},"
    "   {\"text\": [\"5 apples\"],"
    "    \"usage\": {\"prompt_tokens\": 30, \"completion_tokens\": 5,"
    "              \"total_tokens\": 35}}]},"
    " {\"match\": {\"system\": \"You fetch\"}, \"responses\": ["
    "   {\"text\": [\"apples fetched: 5\"],"
    "    \"usage\": {\"prompt_tokens\": 7, \"completion_tokens\": 3,"
    "              \"total_tokens\": 10}}]},"
    " {\"match\": {\"system\": \"You write\"}, \"responses\": ["
    "   {\"status\": 400, \"error\": {\"message\": \"pears are banned\","
    "    \"type\": \"invalid_request_error\"}}]}"
    "]}";

/* The researcher stores no tool results; the others store everything. */
static const char agents[] = "  main:\n"
                             "    model: fake/m\n"
                             "    system_prompt: You are main.\n"
                             "    tools: []\n"
                             "    sub_agents: [researcher, writer]\n"
                             "  researcher:\n"
                             "    model: fake/m\n"
                             "    system_prompt: You research.\n"
                             "    tools: []\n"
                             "    sub_agents: [fetcher]\n"
                             "    data_policy: {store_tool_results: false}\n"
                             "  fetcher:\n"
                             "    model: fake/m\n"
                             "    system_prompt: You fetch.\n"
                             "    tools: []\n"
                             "  writer:\n"
                             "    model: fake/m\n"
                             "    system_prompt: You write.\n"
                             "    tools: []\n";

typedef struct {
    loom_fake *fake;
    loom_config *cfg;
    loom_store *st;
    loom_session *s;
    char *path;
    /* What the observer was told failed, from the children's threads. */
    atomic_int child_errors; /* save_child_run */
    atomic_int other_errors;
} fx;

static void on_store_error(const char *op, void *payload)
{
    fx *f = payload;

    atomic_fetch_add(strcmp(op, "save_child_run") == 0 ? &f->child_errors
                                                       : &f->other_errors,
                     1);
}

static void fx_open(fx *f, const char *db, const char *extra_sql)
{
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    char *yaml = NULL;

    memset(f, 0, sizeof(*f));
    atomic_init(&f->child_errors, 0);
    atomic_init(&f->other_errors, 0);
    f->fake = fake_start_script(script);
    assert_non_null(f->fake);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake:\n"
                         "    kind: openai\n"
                         "    base_url: %s\n"
                         "    api_key: k\n"
                         "    retries: {max: 0}\n"
                         "routing: {retries: 0}\n"
                         "models:\n"
                         "  fake/m:\n"
                         "    prices: {input: 1, output: 2}\n"
                         "agents:\n%s",
                         fake_base_url(f->fake), agents) > 0);
    if (loom_config_load_string(&f->cfg, yaml, "t.yaml") != 0)
        print_error("config: %s\n", loom_error_last());
    assert_non_null(f->cfg);
    free(yaml);
    f->path = test_db_path(db);
    f->st = test_store_open_ok(f->path);
    if (extra_sql)
        test_db_exec(f->path, extra_sql);
    so.config = f->cfg;
    so.store = f->st;
    so.observer.store_error = on_store_error;
    so.observer.payload = f;
    if (loom_session_new(&f->s, &so) != 0)
        print_error("session: %s\n", loom_error_last());
    assert_non_null(f->s);
}

static void fx_close(fx *f)
{
    loom_session_free(f->s);
    loom_store_free(f->st);
    loom_config_free(f->cfg);
    fake_stop(f->fake);
    test_db_remove(f->path);
    free(f->path);
}

/* Runs main on its question to the end, which must complete. */
static loom_turn *run_main(fx *f)
{
    loom_turn_options o = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    loom_turn *t = NULL;

    assert_int_equal(
        loom_messages_add(&in, LOOM_ROLE_USER, "apples and pears?"), 0);
    o.agent = "main";
    o.input = &in;
    o.user_id = "ann";
    if (loom_turn_new(&t, f->s, &o) != 0)
        print_error("turn: %s\n", loom_error_last());
    assert_non_null(t);
    loom_messages_free(&in);
    if (loom_turn_execute(t) != 0)
        print_error("turn: %s\n", loom_error_last());
    assert_string_equal(loom_run_text(loom_turn_run(t)), "Main: 5 apples.");
    assert_true(loom_turn_stored(t));
    return t;
}

static const char *jstr(const json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

static json_int_t jint(const json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}

/* The child of kids called by call_id (must be there). */
static const json_t *child_by_call(const json_t *kids, const char *call_id)
{
    size_t i;
    json_t *k;

    json_array_foreach(kids, i, k)
    {
        if (strcmp(jstr(k, "parent_call_id"), call_id) == 0)
            return k;
    }
    print_error("no child for call %s\n", call_id);
    fail();
    return NULL;
}

static void test_tree_stored(void **state)
{
    fx f;
    loom_turn *t;
    json_t *top, *r, *g, *conv, *msgs, *usage, *row;
    const json_t *kid, *k2;
    json_int_t sum_micros = 0, sum_tokens = 0;
    char *text, *rid;
    size_t i;

    (void)state;
    fx_open(&f, "subagents-store.db", NULL);
    t = run_main(&f);
    assert_int_equal(atomic_load(&f.child_errors), 0);
    assert_int_equal(atomic_load(&f.other_errors), 0);

    /* The top run and its two children, one level. */
    assert_int_equal(loom_store_run_get(f.st, loom_turn_id(t), "ann", &top), 0);
    assert_int_equal(jint(json_object_get(top, "usage"), "cost_micros"),
                     loom_run_usage(loom_turn_run(t))->cost_micros);
    assert_int_equal(jint(json_object_get(top, "usage"), "total_tokens"),
                     loom_run_usage(loom_turn_run(t))->total_tokens);
    assert_int_equal(json_array_size(json_object_get(top, "children")), 2);
    kid = child_by_call(json_object_get(top, "children"), "call_w");
    assert_string_equal(jstr(kid, "agent"), "writer");
    assert_string_equal(jstr(kid, "status"), "failed");
    assert_non_null(
        strstr(jstr(json_object_get(kid, "error"), "message"), "pears"));
    kid = child_by_call(json_object_get(top, "children"), "call_r");
    assert_string_equal(jstr(kid, "agent"), "researcher");
    assert_string_equal(jstr(kid, "status"), "completed");
    assert_int_equal(jint(kid, "depth"), 1);
    /* The researcher's run, with its grandchild and its own messages:
     * the task, the call, the result as its data policy keeps it, the
     * answer. */
    rid = strdup(jstr(kid, "id"));
    assert_int_equal(loom_store_run_get(f.st, rid, "ann", &r), 0);
    assert_string_equal(jstr(r, "parent_run_id"), loom_turn_id(t));
    assert_string_equal(jstr(r, "conversation_id"),
                        loom_turn_conversation_id(t));
    msgs = json_object_get(r, "messages");
    assert_int_equal(json_array_size(msgs), 4);
    assert_string_equal(jstr(json_array_get(msgs, 0), "content"),
                        "find apples");
    assert_string_equal(jstr(json_array_get(msgs, 2), "role"), "tool");
    assert_string_equal(jstr(json_array_get(msgs, 2), "content"),
                        LOOM_DATA_POLICY_RESULT_MARKER);
    assert_string_equal(jstr(json_array_get(msgs, 3), "content"), "5 apples");
    k2 = json_array_get(json_object_get(r, "children"), 0);
    assert_non_null(k2);
    assert_string_equal(jstr(k2, "agent"), "fetcher");
    assert_string_equal(jstr(k2, "parent_call_id"), "call_f");
    assert_int_equal(jint(k2, "depth"), 2);
    /* The grandchild keeps its answer (its own policy stores all). */
    assert_int_equal(loom_store_run_get(f.st, jstr(k2, "id"), "ann", &g), 0);
    json_decref(r);
    assert_string_equal(jstr(g, "parent_run_id"), rid);
    msgs = json_object_get(g, "messages");
    assert_string_equal(
        jstr(json_array_get(msgs, json_array_size(msgs) - 1), "content"),
        "apples fetched: 5");
    json_decref(g);
    /* Another user finds none of the tree. */
    assert_int_equal(loom_store_run_get(f.st, rid, "bob", &r), LOOM_ENOTFOUND);
    free(rid);

    /* The conversation holds main's messages only, the children's
     * answers as its tool results. */
    assert_int_equal(
        loom_store_conversation_get(f.st, loom_turn_conversation_id(t), &conv),
        0);
    text = json_dumps(json_object_get(conv, "messages"), JSON_COMPACT);
    assert_int_equal(json_array_size(json_object_get(conv, "messages")), 5);
    assert_non_null(strstr(text, "5 apples"));
    assert_null(strstr(text, "fetch apples"));
    assert_null(strstr(text, "apples fetched"));
    free(text);
    /* Its usage rows: every model call of the tree (2 main, 2
     * researcher, 1 fetcher; the writer's failed), each naming its run
     * and agent, summing exactly to the top run's total. */
    usage = json_object_get(conv, "usage");
    assert_int_equal(json_array_size(usage), 5);
    json_array_foreach(usage, i, row)
    {
        const char *agent = jstr(row, "agent");
        sum_micros += jint(row, "cost_micros");
        sum_tokens += jint(row, "total_tokens");
        assert_non_null(agent);
        if (strcmp(agent, "main") == 0)
            assert_string_equal(jstr(row, "run_id"), loom_turn_id(t));
        else
            assert_string_not_equal(jstr(row, "run_id"), loom_turn_id(t));
    }
    assert_int_equal(sum_micros,
                     jint(json_object_get(top, "usage"), "cost_micros"));
    assert_int_equal(sum_tokens,
                     jint(json_object_get(top, "usage"), "total_tokens"));
    assert_int_equal(sum_micros, 200 + 2 * 20 + 50 + 2 * 9 + 7 + 2 * 3);
    json_decref(conv);
    json_decref(top);
    loom_turn_free(t);
    fx_close(&f);
}

/*
 * The store refuses every sub-agent's run (a trigger): the children's
 * failures are counted under save_child_run, and the parent completes
 * and is stored as if nothing happened.
 */
static void test_child_store_failure(void **state)
{
    fx f;
    loom_turn *t;
    json_t *top;

    (void)state;
    fx_open(&f, "subagents-store-fail.db",
            "CREATE TRIGGER no_children BEFORE INSERT ON runs "
            "WHEN new.parent_run_id IS NOT NULL "
            "BEGIN SELECT RAISE(ABORT, 'no children here'); END;");
    t = run_main(&f);
    assert_int_equal(atomic_load(&f.child_errors), 3);
    assert_int_equal(atomic_load(&f.other_errors), 0);
    assert_int_equal(loom_store_run_get(f.st, loom_turn_id(t), "ann", &top), 0);
    assert_string_equal(jstr(top, "status"), "completed");
    assert_int_equal(json_array_size(json_object_get(top, "children")), 0);
    json_decref(top);
    assert_int_equal(
        test_db_int(f.path, "SELECT count(*) FROM runs WHERE parent_run_id "
                            "IS NOT NULL"),
        0);
    loom_turn_free(t);
    fx_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tree_stored),
        cmocka_unit_test(test_child_store_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
