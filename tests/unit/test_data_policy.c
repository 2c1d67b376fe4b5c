/*
 * Data policies (loom_data_policy in loom/recorder.h, an agent's
 * `data_policy:` in the config): what each switch removes from the turn
 * the recorder hands to the store, that the events the recorder forwards
 * are never changed, and, through the session with a store, that the
 * stored conversation is narrowed while the turn's events carry
 * everything.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "loom/recorder.h"
#include "loom/session.h"
#include "loom/store.h"
#include "mock_provider.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One model call says "looking", reasons, and calls keep and drop; the
 * next answers "done". */
static const mock_answer script[] = {
    {.text = "looking",
     .calls = {{"c1", "keep", "{}"}, {"c2", "drop", "{}"}},
     .ncalls = 2},
    {.text = "done"}};

static mock_provider mock;

static int echo_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    (void)args;
    (void)ctx;
    return loom_buf_puts(out, payload);
}

/* The inner sink: counts the events and the text deltas forwarded. */
typedef struct {
    size_t n, deltas, tool_ends;
} counts;

static int count_emit(const loom_event *ev, void *payload)
{
    counts *c = payload;

    c->n++;
    c->deltas += ev->type == LOOM_EV_MESSAGE_DELTA;
    c->tool_ends += ev->type == LOOM_EV_TOOL_COMPLETED;
    return 0;
}

/* A sink that keeps each event's JSON in the array payload. */
static int collect(const loom_event *ev, void *payload)
{
    return json_array_append_new(payload, loom_event_to_json(ev)) ? -1 : 0;
}

/* Runs the script with a recorder under policy (NULL: none) and fills
 * *turn; the caller frees *run_out and *rec_out. */
static void run_policy(const loom_data_policy *policy, loom_turn_record *turn,
                       counts *c, loom_run **run_out, loom_recorder **rec_out)
{
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_tool_registry *reg;
    loom_messages hist = {0};
    loom_tool t;

    mock_clear(&mock);
    mock_init(&mock, script, 2, MOCK_STREAM_CALLS);
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    memset(&t, 0, sizeof(t));
    t.description = "echoes";
    t.execute = echo_exec;
    t.name = "keep";
    t.payload = "kept result";
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "drop";
    t.payload = "secret result";
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    memset(c, 0, sizeof(*c));
    assert_int_equal(loom_recorder_new(rec_out, (loom_sink){count_emit, c}), 0);
    assert_int_equal(loom_recorder_set_policy(*rec_out, policy), 0);
    ro.provider = &mock.base;
    ro.model = "mock/m";
    ro.upstream_model = "m";
    ro.tools = reg;
    ro.sink = loom_recorder_sink(*rec_out);
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "go"), 0);
    assert_int_equal(loom_run_new(run_out, &ro, &hist), 0);
    loom_messages_free(&hist);
    assert_int_equal(loom_run_execute(*run_out), 0);
    assert_int_equal(loom_recorder_turn(*rec_out, *run_out, turn), 0);
    /* The events are never narrowed: both calls ended, both texts
     * streamed. */
    assert_int_equal(c->tool_ends, 2);
    assert_int_equal(c->deltas, 2);
    loom_tool_registry_free(reg);
}

/* The stored output as a string: one letter per message (a, t), then
 * per message its content and the ids of its calls, e.g.
 * "a:looking[c1,c2] t:kept result a:done". */
static void shape(const loom_messages *m, char *dst, size_t cap)
{
    dst[0] = '\0';
    for (size_t i = 0; i < m->len; i++) {
        const loom_message *x = &m->items[i];
        size_t len = strlen(dst);
        snprintf(dst + len, cap - len, "%s%c:%s", i ? " " : "",
                 x->role == LOOM_ROLE_TOOL ? 't' : 'a',
                 x->content ? x->content : "-");
        for (size_t k = 0; k < x->tool_calls_len; k++) {
            len = strlen(dst);
            snprintf(dst + len, cap - len, "%s%s%s", k ? "," : "[",
                     x->tool_calls[k].id,
                     k + 1 == x->tool_calls_len ? "]" : "");
        }
    }
}

/* Runs under policy and checks the stored output's shape and how many
 * tool records are stored. */
static void check(const loom_data_policy *policy, const char *want,
                  size_t records)
{
    loom_turn_record turn;
    loom_recorder *rec;
    loom_run *run;
    counts c;
    char got[512];

    run_policy(policy, &turn, &c, &run, &rec);
    shape(turn.output, got, sizeof(got));
    assert_string_equal(got, want);
    assert_int_equal(json_array_size(turn.tool_records), records);
    /* The run itself keeps everything. */
    shape(loom_run_messages(run), got, sizeof(got));
    assert_string_equal(
        got, "a:looking[c1,c2] t:kept result t:secret result a:done");
    loom_run_free(run);
    loom_recorder_free(rec);
}

static void test_store_everything(void **state)
{
    loom_data_policy zero;

    (void)state;
    memset(&zero, 0, sizeof(zero));
    check(NULL, "a:looking[c1,c2] t:kept result t:secret result a:done", 2);
    check(&zero, "a:looking[c1,c2] t:kept result t:secret result a:done", 2);
}

static void test_omit_text(void **state)
{
    loom_data_policy p = {.version = LOOM_DATA_POLICY_VERSION, .omit_text = 1};

    (void)state;
    /* The answer with only text is left out; the call keeps its place. */
    check(&p, "a:-[c1,c2] t:kept result t:secret result", 2);
}

static void test_omit_tool_calls(void **state)
{
    loom_data_policy p = {.version = LOOM_DATA_POLICY_VERSION,
                          .omit_tool_calls = 1};

    (void)state;
    check(&p, "a:looking a:done", 0);
    p.omit_text = 1;
    /* Nothing of the model's is left: the store's placeholder carries
     * the turn's status. */
    check(&p, "", 0);
}

static void test_omit_tool_results(void **state)
{
    loom_data_policy p = {.version = LOOM_DATA_POLICY_VERSION,
                          .omit_tool_results = 1};

    (void)state;
    check(&p,
          "a:looking[c1,c2] t:" LOOM_DATA_POLICY_RESULT_MARKER
          " t:" LOOM_DATA_POLICY_RESULT_MARKER " a:done",
          2);
}

static void test_tools_list(void **state)
{
    static const char *const keep[] = {"keep"};
    loom_data_policy p = {
        .version = LOOM_DATA_POLICY_VERSION, .tools = keep, .tools_len = 1};

    (void)state;
    check(&p, "a:looking[c1] t:kept result a:done", 1);
    /* An empty list stores no tool. */
    p.tools_len = 0;
    check(&p, "a:looking a:done", 0);
}

/* Through the session with a store: an agent whose data_policy keeps no
 * text and only get_time. Its events carry every text and both calls;
 * the stored conversation, as the next turn loads it, has the user's
 * message, the get_time call and its result, and nothing else. */
static void test_session_stores_narrowed(void **state)
{
    static const char yaml[] = "providers:\n"
                               "  mock:\n"
                               "    kind: openai\n"
                               "    base_url: http://127.0.0.1:9/v1\n"
                               "agents:\n"
                               "  private:\n"
                               "    model: mock/mock-1\n"
                               "    tools: [get_time]\n"
                               "    data_policy:\n"
                               "      store_text: false\n"
                               "      tools: [get_time]\n";
    static const mock_answer answers[] = {
        {.text = "checking",
         .calls = {{"c1", "get_time", "{}"}, {"c2", "nosuch", "{}"}},
         .ncalls = 2},
        {.text = "It is noon"}};
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0}, hist = {0};
    json_t *events = json_array(), *ev;
    loom_config *cfg;
    loom_store *store;
    loom_session *s;
    loom_turn *t;
    char *path = test_tmp_path("data_policy.db");
    char kinds[64] = "", texts[128] = "";
    size_t i;

    (void)state;
    unlink(path);
    mock_clear(&mock);
    mock_init(&mock, answers, 2, MOCK_STREAM_CALLS);
    assert_int_equal(loom_config_load_string(&cfg, yaml, "t.yaml"), 0);
    assert_int_equal(loom_store_open(&store, path), 0);
    so.config = cfg;
    so.store = store;
    so.provider = &mock.base;
    so.model = "mock-1";
    assert_int_equal(loom_session_new(&s, &so), 0);
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "time?"), 0);
    to.input = &in;
    to.agent = "private";
    to.sink = (loom_sink){collect, events};
    assert_int_equal(loom_turn_new(&t, s, &to), 0);
    assert_int_equal(loom_turn_execute(t), 0);
    assert_true(loom_turn_stored(t));

    /* The events: both texts, both calls ended. */
    json_array_foreach(events, i, ev)
    {
        const char *type = json_string_value(json_object_get(ev, "type"));
        const json_t *d = ev;
        if (strcmp(type, "message.delta") == 0)
            strncat(texts, json_string_value(json_object_get(d, "delta")),
                    sizeof(texts) - strlen(texts) - 1);
        else if (strcmp(type, "tool.completed") == 0 ||
                 strcmp(type, "tool.failed") == 0)
            strncat(kinds, json_string_value(json_object_get(d, "id")),
                    sizeof(kinds) - strlen(kinds) - 1);
    }
    assert_string_equal(texts, "checkingIt is noon");
    /* In either order: the calls run in parallel. */
    assert_int_equal(strlen(kinds), 4);
    assert_non_null(strstr(kinds, "c1"));
    assert_non_null(strstr(kinds, "c2"));

    /* The store: the question, the get_time call without text, its
     * result. */
    assert_int_equal(
        loom_store_load_history(store, loom_turn_conversation_id(t), &hist), 0);
    assert_int_equal(hist.len, 3);
    assert_int_equal(hist.items[0].role, LOOM_ROLE_USER);
    assert_string_equal(hist.items[0].content, "time?");
    assert_int_equal(hist.items[1].role, LOOM_ROLE_ASSISTANT);
    assert_true(!hist.items[1].content || !*hist.items[1].content);
    assert_int_equal(hist.items[1].tool_calls_len, 1);
    assert_string_equal(hist.items[1].tool_calls[0].name, "get_time");
    assert_int_equal(hist.items[2].role, LOOM_ROLE_TOOL);
    assert_string_equal(hist.items[2].tool_call_id, "c1");

    loom_messages_free(&hist);
    loom_messages_free(&in);
    loom_turn_free(t);
    loom_session_free(s);
    loom_store_free(store);
    loom_config_free(cfg);
    json_decref(events);
    unlink(path);
    free(path);
}

static void test_bad_version(void **state)
{
    loom_data_policy p = {.version = LOOM_DATA_POLICY_VERSION + 1};
    loom_recorder *rec;

    (void)state;
    assert_int_equal(loom_recorder_new(&rec, (loom_sink){NULL, NULL}), 0);
    assert_int_equal(loom_recorder_set_policy(rec, &p), LOOM_EINVALID);
    loom_recorder_free(rec);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_everything),
        cmocka_unit_test(test_omit_text),
        cmocka_unit_test(test_omit_tool_calls),
        cmocka_unit_test(test_omit_tool_results),
        cmocka_unit_test(test_tools_list),
        cmocka_unit_test(test_session_stores_narrowed),
        cmocka_unit_test(test_bad_version),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);

    mock_clear(&mock);
    return failed;
}
