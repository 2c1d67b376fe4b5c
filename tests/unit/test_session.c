/*
 * The session layer (loom/session.h): turns from a config or an
 * embedder's own provider, with and without a store; the agent's config
 * mapped to the run; history, summary and plan loaded for a continued
 * conversation; the final event only after the store answered (and a
 * store_failed run.failed when it could not); the event log, its replay,
 * wake callbacks and its limit; caller-chosen ids; cancelling; version
 * fields on everything an embedder fills.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/utf8.h"
#include "loom/session.h"
#include "mock_provider.h"
#include "store/sqlite_internal.h"
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- fixtures ------------------------------------------------------------ */

typedef struct {
    mock_provider mock;
    loom_config *cfg;
    loom_store *store;
    char *path;
    loom_session *s;
} fx;

static const char agents_yaml[] = "providers:\n"
                                  "  mock:\n"
                                  "    kind: openai\n"
                                  "    base_url: http://127.0.0.1:9/v1\n"
                                  "agents:\n"
                                  "  helper:\n"
                                  "    model: mock/mock-1\n"
                                  "    system_prompt: You help with time.\n"
                                  "    tools: [get_time]\n"
                                  "    max_iterations: 3\n";

/* A session over the mock, with agents_yaml; a store when with_store. */
static void fx_open(fx *f, const mock_answer *answers, int n, int with_store)
{
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;

    memset(f, 0, sizeof(*f));
    mock_init(&f->mock, answers, n, 0);
    assert_int_equal(loom_config_load_string(&f->cfg, agents_yaml, "t.yaml"),
                     0);
    if (with_store) {
        f->path = test_tmp_path("session.db");
        unlink(f->path);
        assert_int_equal(loom_store_open(&f->store, f->path), 0);
    }
    so.config = f->cfg;
    so.store = f->store;
    so.provider = &f->mock.base;
    so.model = "mock-1";
    so.store_retry_ms = 100;
    assert_int_equal(loom_session_new(&f->s, &so), 0);
}

static void fx_close(fx *f)
{
    loom_session_free(f->s);
    loom_store_free(f->store);
    loom_config_free(f->cfg);
    mock_clear(&f->mock);
    if (f->path) {
        char wal[512];
        unlink(f->path);
        snprintf(wal, sizeof(wal), "%s-wal", f->path);
        unlink(wal);
        snprintf(wal, sizeof(wal), "%s-shm", f->path);
        unlink(wal);
        free(f->path);
    }
}

/* A sink that keeps each event's JSON, and at the final event asks the
 * store whether the turn is already there. */
typedef struct {
    json_t *events;
    loom_store *store;
    int final_seen;
    size_t stored_messages_at_final;
} sink_log;

static int sink_emit(const loom_event *ev, void *payload)
{
    sink_log *l = payload;

    json_array_append_new(l->events, loom_event_to_json(ev));
    if ((ev->type == LOOM_EV_RUN_COMPLETED || ev->type == LOOM_EV_RUN_FAILED) &&
        l->store) {
        const char *conv = json_string_value(
            json_object_get(json_array_get(l->events, 0), "conversation_id"));
        loom_messages hist = {0};
        l->final_seen = 1;
        if (conv && loom_store_load_history(l->store, conv, &hist) == 0)
            l->stored_messages_at_final = hist.len;
        loom_messages_free(&hist);
    }
    return 0;
}

static const char *ev_type(const json_t *events, size_t i)
{
    return json_string_value(
        json_object_get(json_array_get(events, i), "type"));
}

static const mock_answer hello[] = {{.text = "Hello there"}};

/* ---- tests --------------------------------------------------------------- */

/* An embedder's provider, no store: the answer, the chosen id in every
 * event, no conversation. */
static void test_turn_without_store(void **state)
{
    fx f;
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    sink_log l = {json_array(), NULL, 0, 0};
    loom_turn *t;
    size_t i;
    json_t *e;

    (void)state;
    fx_open(&f, hello, 1, 0);
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "hi"), 0);
    to.run_id = "run_mine";
    to.input = &in;
    to.sink = (loom_sink){sink_emit, &l};
    assert_int_equal(loom_turn_new(&t, f.s, &to), 0);
    assert_string_equal(loom_turn_id(t), "run_mine");
    assert_null(loom_turn_conversation_id(t));
    assert_null(loom_turn_agent(t) ? "agent" : NULL);
    /* Nothing is readable before the end. */
    assert_null(loom_turn_run(t));
    assert_int_equal(loom_turn_status(t), LOOM_RUN_RUNNING);
    assert_int_equal(loom_turn_execute(t), 0);
    assert_true(loom_turn_ended(t));
    assert_int_equal(loom_turn_status(t), LOOM_RUN_COMPLETED);
    assert_string_equal(loom_run_text(loom_turn_run(t)), "Hello there");
    assert_false(loom_turn_stored(t));
    assert_null(loom_turn_store_error(t));
    /* Once only. */
    assert_int_equal(loom_turn_execute(t), LOOM_EINVALID);
    json_array_foreach(l.events, i, e) assert_string_equal(
        json_string_value(json_object_get(e, "run_id")), "run_mine");
    assert_string_equal(ev_type(l.events, 0), "run.started");
    assert_null(
        json_object_get(json_array_get(l.events, 0), "conversation_id"));
    assert_string_equal(ev_type(l.events, json_array_size(l.events) - 1),
                        "run.completed");
    loom_turn_free(t);
    json_decref(l.events);
    loom_messages_free(&in);
    fx_close(&f);
}

/* With a store and a user, the agent's system prompt lists the user's
 * memories, newest first; without a user it does not. */
static void test_memories_in_prompt(void **state)
{
    static const mock_answer two[] = {{.text = "a"}, {.text = "b"}};
    fx f;
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    loom_turn *t;
    char *id = NULL;

    (void)state;
    fx_open(&f, two, 2, 1);
    assert_int_equal(
        loom_store_memory_add(f.store, "u1", "Likes \"tea\"", &id, NULL), 0);
    free(id);
    assert_int_equal(
        loom_store_memory_add(f.store, "u2", "Not u1's", &id, NULL), 0);
    free(id);
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "time?"), 0);
    to.input = &in;
    to.agent = "helper";
    to.user_id = "u1";
    assert_int_equal(loom_turn_new(&t, f.s, &to), 0);
    assert_int_equal(loom_turn_execute(t), 0);
    assert_string_equal(f.mock.seen[0].system,
                        "You help with time.\n\n<memories>\nWhat you know "
                        "about the user from earlier conversations (saved "
                        "with memory_store, most recent first; each quoted "
                        "as it was saved):\n- \"Likes \\\"tea\\\"\"\n"
                        "</memories>");
    loom_turn_free(t);
    to.user_id = NULL;
    assert_int_equal(loom_turn_new(&t, f.s, &to), 0);
    assert_int_equal(loom_turn_execute(t), 0);
    assert_string_equal(f.mock.seen[1].system, "You help with time.");
    loom_turn_free(t);
    loom_messages_free(&in);
    fx_close(&f);
}

/* The agent's prompt, tools and limits reach the model. */
static void test_agent_mapping(void **state)
{
    fx f;
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    loom_turn *t;

    (void)state;
    fx_open(&f, hello, 1, 0);
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "time?"), 0);
    to.input = &in;
    to.agent = "helper";
    assert_int_equal(loom_turn_new(&t, f.s, &to), 0);
    assert_string_equal(loom_turn_agent(t), "helper");
    assert_string_equal(loom_turn_model(t), "mock-1");
    assert_int_equal(loom_turn_execute(t), 0);
    assert_string_equal(f.mock.seen[0].system, "You help with time.");
    assert_string_equal(f.mock.seen[0].tools, "get_time");
    loom_turn_free(t);

    /* Overrides win over the agent's prompt and the session's model;
     * unknown agents fail. */
    mock_clear(&f.mock);
    mock_init(&f.mock, hello, 1, 0);
    to.system_prompt = "Be brief.";
    to.model = "mock-2";
    assert_int_equal(loom_turn_new(&t, f.s, &to), 0);
    assert_string_equal(loom_turn_model(t), "mock-2");
    assert_int_equal(loom_turn_execute(t), 0);
    assert_string_equal(f.mock.seen[0].system, "Be brief.");
    loom_turn_free(t);
    to.agent = "nobody";
    assert_int_equal(loom_turn_new(&t, f.s, &to), LOOM_ENOTFOUND);
    assert_null(t);
    loom_messages_free(&in);
    fx_close(&f);
}

/*
 * "agent/<name>" as the model names that agent; no_agent runs none, not
 * even the default one; an agent named twice is refused.
 */
static void test_agent_as_model(void **state)
{
    static const mock_answer three[] = {
        {.text = "a"}, {.text = "b"}, {.text = "c"}};
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    const loom_agent_config *agent = NULL;
    mock_provider mock;
    loom_config *cfg;
    loom_session *s;
    loom_messages in = {0};
    loom_turn *t;
    char *model = NULL, yaml[sizeof(agents_yaml) + 32];

    (void)state;
    snprintf(yaml, sizeof(yaml), "%sdefault_agent: helper\n", agents_yaml);
    mock_init(&mock, three, 3, 0);
    assert_int_equal(loom_config_load_string(&cfg, yaml, "t.yaml"), 0);
    so.config = cfg;
    so.provider = &mock.base;
    so.model = "mock-1";
    assert_int_equal(loom_session_new(&s, &so), 0);
    assert_int_equal(
        loom_session_resolve_model(s, "agent/helper", &agent, &model), 0);
    assert_string_equal(agent->name, "helper");
    assert_null(model);
    assert_int_equal(
        loom_session_resolve_model(s, "agent/nobody", &agent, &model),
        LOOM_ENOTFOUND);
    assert_null(agent);
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "time?"), 0);
    to.input = &in;

    to.model = "agent/helper";
    assert_int_equal(loom_turn_new(&t, s, &to), 0);
    assert_string_equal(loom_turn_agent(t), "helper");
    assert_int_equal(loom_turn_execute(t), 0);
    assert_string_equal(mock.seen[0].system, "You help with time.");
    assert_string_equal(mock.seen[0].tools, "get_time");
    loom_turn_free(t);

    /* A plain model with no_agent: no prompt, no agent recorded. */
    to.model = "mock-2";
    to.no_agent = 1;
    assert_int_equal(loom_turn_new(&t, s, &to), 0);
    assert_null(loom_turn_agent(t));
    assert_string_equal(loom_turn_model(t), "mock-2");
    assert_int_equal(loom_turn_execute(t), 0);
    assert_null(mock.seen[1].system);
    loom_turn_free(t);

    /* Without no_agent the default agent runs. */
    to.no_agent = 0;
    assert_int_equal(loom_turn_new(&t, s, &to), 0);
    assert_string_equal(loom_turn_agent(t), "helper");
    loom_turn_free(t);

    to.model = "agent/helper";
    to.agent = "helper";
    assert_int_equal(loom_turn_new(&t, s, &to), LOOM_EINVALID);
    loom_messages_free(&in);
    loom_session_free(s);
    loom_config_free(cfg);
    mock_clear(&mock);
}

/* With a store: the conversation is created, the final event comes after
 * the turn is stored, and the next turn reads the history back. */
static void test_turn_stored_then_continued(void **state)
{
    static const mock_answer two[] = {{.text = "first answer"},
                                      {.text = "second answer"}};
    fx f;
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    sink_log l = {json_array(), NULL, 0, 0};
    loom_turn *t;
    char conv[LOOM_ID_MAX + 1];

    (void)state;
    fx_open(&f, two, 2, 1);
    l.store = f.store;
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "one"), 0);
    to.input = &in;
    to.sink = (loom_sink){sink_emit, &l};
    assert_int_equal(loom_turn_new(&t, f.s, &to), 0);
    assert_non_null(loom_turn_conversation_id(t));
    snprintf(conv, sizeof(conv), "%s", loom_turn_conversation_id(t));
    assert_int_equal(loom_turn_execute(t), 0);
    assert_true(loom_turn_stored(t));
    /* run.started names the conversation; at the final event the turn
     * (question and answer) was already in the store. */
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(l.events, 0), "conversation_id")),
                        conv);
    assert_true(l.final_seen);
    assert_int_equal(l.stored_messages_at_final, 2);
    loom_turn_free(t);

    /* Continued: history comes from the store. */
    loom_messages_free(&in);
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "two"), 0);
    to.conversation_id = conv;
    to.sink = (loom_sink){NULL, NULL};
    assert_int_equal(loom_turn_new(&t, f.s, &to), 0);
    assert_int_equal(loom_turn_execute(t), 0);
    assert_string_equal(f.mock.seen[1].all_roles, "uau");
    assert_string_equal(f.mock.seen[1].last_content, "two");
    loom_turn_free(t);

    /* A conversation that does not exist fails at once. */
    to.conversation_id = "conv_missing";
    assert_int_equal(loom_turn_new(&t, f.s, &to), LOOM_ENOTFOUND);
    json_decref(l.events);
    loom_messages_free(&in);
    fx_close(&f);
}

/* Without a store there is no conversation to continue. */
static void test_conversation_needs_store(void **state)
{
    fx f;
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    loom_turn *t;

    (void)state;
    fx_open(&f, hello, 1, 0);
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "hi"), 0);
    to.input = &in;
    to.conversation_id = "conv_x";
    assert_int_equal(loom_turn_new(&t, f.s, &to), LOOM_EINVALID);
    to.conversation_id = NULL;
    to.input = NULL;
    assert_int_equal(loom_turn_new(&t, f.s, &to), LOOM_EINVALID);
    loom_messages_free(&in);
    fx_close(&f);
}

/* A store that refuses writes: the turn fails before the model call with
 * store_failed, and says so in its final event. */
static int store_errors;
static void count_store_error(const char *op, void *payload)
{
    (void)payload;
    if (strcmp(op, "create_conversation") == 0)
        store_errors++;
}

static void test_store_failure(void **state)
{
    fx f;
    loom_session *s2;
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    sink_log l = {json_array(), NULL, 0, 0};
    loom_turn *t;
    json_t *last;

    (void)state;
    fx_open(&f, hello, 1, 1);
    so.config = f.cfg;
    so.store = f.store;
    so.provider = &f.mock.base;
    so.model = "mock-1";
    so.store_retry_ms = 100;
    so.observer.store_error = count_store_error;
    assert_int_equal(loom_session_new(&s2, &so), 0);
    assert_int_equal(
        loom__store_sqlite_exec_all(f.store, "PRAGMA query_only = 1"), 0);
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "hi"), 0);
    to.input = &in;
    to.sink = (loom_sink){sink_emit, &l};
    store_errors = 0;
    assert_int_equal(loom_turn_new(&t, s2, &to), 0);
    assert_int_not_equal(loom_turn_execute(t), 0);
    assert_int_equal(loom_turn_status(t), LOOM_RUN_FAILED);
    assert_string_equal(loom_turn_error_code(t), "store_failed");
    assert_non_null(loom_turn_store_error(t));
    assert_false(loom_turn_stored(t));
    assert_int_equal(store_errors, 1);
    /* No model call was made. */
    assert_int_equal(f.mock.next, 0);
    assert_int_equal(json_array_size(l.events), 2);
    last = json_array_get(l.events, 1);
    assert_string_equal(ev_type(l.events, 1), "run.failed");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(last, "error"), "code")),
                        "store_failed");
    loom_turn_free(t);
    loom_session_free(s2);
    json_decref(l.events);
    loom_messages_free(&in);
    fx_close(&f);
}

/* The log: every event in order, replayable; watchers woken. */
static int wakes;
static void on_wake(void *payload)
{
    (void)payload;
    wakes++;
}

static void test_event_log(void **state)
{
    fx f;
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    const loom_turn_event *e;
    loom_turn *t;
    uint64_t seq = 0, last;
    int ended = 0, n = 0;

    (void)state;
    fx_open(&f, hello, 1, 0);
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "hi"), 0);
    to.input = &in;
    to.log = 1;
    assert_int_equal(loom_turn_new(&t, f.s, &to), 0);
    wakes = 0;
    assert_int_equal(loom_turn_watch(t, on_wake, NULL), 0);
    assert_int_equal(loom_turn_execute(t), 0);
    last = loom_turn_last_seq(t, &ended);
    assert_true(ended);
    while ((e = loom_turn_next_event(t, seq)) != NULL) {
        assert_int_equal(e->seq, seq + 1);
        assert_non_null(strstr(e->text, e->type_name));
        seq = e->seq;
        n++;
    }
    assert_int_equal(seq, last);
    /* One wake per event, one for the end. */
    assert_int_equal(wakes, n + 1);
    assert_int_equal(loom_turn_event_at(t, 1)->type, LOOM_EV_RUN_STARTED);
    assert_int_equal(loom_turn_event_at(t, last)->type, LOOM_EV_RUN_COMPLETED);
    assert_null(loom_turn_event_at(t, last + 1));
    assert_null(loom_turn_event_at(t, 0));
    assert_int_equal(loom_turn_wait(t, last, 0), 1);
    loom_turn_unwatch(t, on_wake, NULL);
    loom_turn_free(t);
    loom_messages_free(&in);
    fx_close(&f);
}

/* A logged event keeps only its text: read back, it is the event with
 * its type and seq, and dumped again it gives the same text (a tool call
 * makes tool.completed carry a real, its duration_ms). */
static void test_event_log_json(void **state)
{
    static const mock_answer answers[] = {
        {.calls = {{"c1", "get_time", "{}"}}, .ncalls = 1},
        {.text = "It is noon"}};
    fx f;
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    const loom_turn_event *e;
    loom_turn *t;
    uint64_t seq = 0;
    int reals = 0;

    (void)state;
    fx_open(&f, answers, 2, 1);
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "time?"), 0);
    to.agent = "helper";
    to.input = &in;
    to.log = 1;
    assert_int_equal(loom_turn_new(&t, f.s, &to), 0);
    assert_int_equal(loom_turn_execute(t), 0);
    while ((e = loom_turn_next_event(t, seq)) != NULL) {
        json_t *j = loom_turn_event_json(e);
        size_t len = 0;
        char *again;
        assert_non_null(j);
        assert_string_equal(json_string_value(json_object_get(j, "type")),
                            e->type_name);
        assert_int_equal(json_integer_value(json_object_get(j, "seq")), e->seq);
        assert_string_equal(json_string_value(json_object_get(j, "run_id")),
                            loom_turn_id(t));
        if (e->type == LOOM_EV_RUN_STARTED)
            assert_string_equal(
                json_string_value(json_object_get(j, "conversation_id")),
                loom_turn_conversation_id(t));
        reals += json_is_real(json_object_get(j, "duration_ms"));
        again = loom__json_compact_dumps(j, 15, &len);
        assert_non_null(again);
        assert_int_equal(len, e->text_len);
        assert_string_equal(again, e->text);
        free(again);
        json_decref(j);
        seq = e->seq;
    }
    assert_int_equal(loom_turn_status(t), LOOM_RUN_COMPLETED);
    assert_true(reals > 0);
    loom_turn_free(t);
    loom_messages_free(&in);
    fx_close(&f);
}

/* Past its limit the log cancels the turn; the final event still gets in. */
static void test_event_log_limit(void **state)
{
    static const mock_answer slow[] = {
        {.text = "an answer far longer than what the log may keep: "
                 "it goes on and on, well past the hundred and fifty "
                 "bytes that this turn's log allows, so it cannot fit"}};
    fx f;
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    loom_turn *t;
    uint64_t last;

    (void)state;
    fx_open(&f, slow, 1, 0);
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "hi"), 0);
    to.input = &in;
    to.log = 1;
    to.log_max_bytes = 150; /* run.started fits, the delta does not */
    assert_int_equal(loom_turn_new(&t, f.s, &to), 0);
    assert_int_equal(loom_turn_execute(t), LOOM_ECANCELED);
    assert_int_equal(loom_turn_status(t), LOOM_RUN_CANCELLED);
    last = loom_turn_last_seq(t, NULL);
    assert_int_equal(loom_turn_event_at(t, 1)->type, LOOM_EV_RUN_STARTED);
    assert_int_equal(loom_turn_next_event(t, 1)->type, LOOM_EV_RUN_FAILED);
    assert_int_equal(loom_turn_next_event(t, 1)->seq, last);
    loom_turn_free(t);
    loom_messages_free(&in);
    fx_close(&f);
}

/* On a thread of its own; cancelled while the model call waits. */
static void test_start_and_cancel(void **state)
{
    static const mock_answer wait[] = {{.wait_cancel = 1}};
    fx f;
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    loom_turn *t;
    const loom_turn_event *e;

    (void)state;
    fx_open(&f, wait, 1, 1);
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "hi"), 0);
    to.input = &in;
    to.log = 1;
    assert_int_equal(loom_turn_start(&t, f.s, &to), 0);
    /* Wait for run.started, then cancel. */
    assert_int_equal(loom_turn_wait(t, 0, 10000), 1);
    e = loom_turn_event_at(t, 1);
    assert_non_null(e);
    assert_int_equal(e->type, LOOM_EV_RUN_STARTED);
    assert_int_equal(loom_turn_cancel(t), 1);
    while (!loom_turn_ended(t))
        assert_true(loom_turn_wait(t, loom_turn_last_seq(t, NULL), 10000));
    assert_int_equal(loom_turn_status(t), LOOM_RUN_CANCELLED);
    /* A cancelled turn is stored, as cancelled. */
    assert_true(loom_turn_stored(t));
    /* Too late now. */
    assert_int_equal(loom_turn_cancel(t), 0);
    loom_turn_free(t);
    loom_messages_free(&in);
    fx_close(&f);
}

/* The session frees when its last turn does. */
static void test_session_outlives_caller(void **state)
{
    fx f;
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    loom_turn *t;

    (void)state;
    fx_open(&f, hello, 1, 0);
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "hi"), 0);
    to.input = &in;
    assert_int_equal(loom_turn_new(&t, f.s, &to), 0);
    loom_session_free(f.s);
    f.s = NULL;
    assert_int_equal(loom_turn_execute(t), 0);
    loom_turn_free(t);
    loom_messages_free(&in);
    fx_close(&f);
}

/* Versions: zero and the current one accepted, others refused. */
static int noop_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    (void)args;
    (void)ctx;
    (void)payload;
    return loom_buf_puts(out, "ok");
}

static void test_versions(void **state)
{
    fx f;
    loom_session *s, *bad;
    loom_session_options so = {0};
    loom_turn_options to = {0};
    loom_run_options ro = {0};
    loom_tool_registry *reg;
    loom_tool tool = {0};
    loom_messages in = {0};
    loom_turn *t;
    loom_run *run;
    loom_provider_vtable vt;
    const loom_provider_vtable *saved;

    (void)state;
    fx_open(&f, hello, 2, 0);
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "hi"), 0);
    /* `= {0}` options work. */
    so.provider = &f.mock.base;
    so.model = "mock-1";
    assert_int_equal(loom_session_new(&s, &so), 0);
    to.input = &in;
    assert_int_equal(loom_turn_new(&t, s, &to), 0);
    loom_turn_free(t);
    ro.provider = &f.mock.base;
    ro.upstream_model = "mock-1";
    assert_int_equal(loom_run_new(&run, &ro, &in), 0);
    loom_run_free(run);
    /* Unknown versions. */
    so.version = 99;
    assert_int_equal(loom_session_new(&bad, &so), LOOM_EINVALID);
    assert_null(bad);
    to.version = 99;
    assert_int_equal(loom_turn_new(&t, f.s, &to), LOOM_EINVALID);
    to.version = 0;
    ro.version = 99;
    assert_int_equal(loom_run_new(&run, &ro, &in), LOOM_EINVALID);
    saved = f.mock.base.vt;
    vt = *saved;
    vt.version = 99;
    f.mock.base.vt = &vt;
    assert_int_equal(loom_turn_new(&t, f.s, &to), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "version"));
    f.mock.base.vt = saved;
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    tool.name = "noop";
    tool.execute = noop_exec;
    assert_int_equal(loom_tool_registry_add(reg, &tool), 0);
    tool.name = "noop2";
    tool.version = 99;
    assert_int_equal(loom_tool_registry_add(reg, &tool), LOOM_EINVALID);
    tool.version = LOOM_TOOL_VERSION;
    assert_int_equal(loom_tool_registry_add(reg, &tool), 0);
    loom_tool_registry_free(reg);
    loom_session_free(s);
    loom_messages_free(&in);
    fx_close(&f);
}

/* A config whose agent names a tool nobody has: refused at once. */
static void test_unknown_agent_tool(void **state)
{
    loom_config *cfg;
    loom_session *s;
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;

    (void)state;
    assert_int_equal(loom_config_load_string(
                         &cfg,
                         "providers:\n  x:\n    kind: openai\n    base_url: "
                         "http://127.0.0.1:9/v1\n"
                         "agents:\n  a:\n    model: x/y\n    tools: [nosuch]\n",
                         "t.yaml"),
                     0);
    so.config = cfg;
    assert_int_equal(loom_session_new(&s, &so), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "unknown tool 'nosuch'"));
    loom_config_free(cfg);
}

/* Every unknown tool of every agent is reported, one per line, at the
 * line of its entry; the available tools are listed on the first. */
static void test_unknown_agent_tools_all(void **state)
{
    loom_config *cfg;
    loom_session *s = NULL;
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    const char *msg, *second;

    (void)state;
    assert_int_equal(loom_config_load_string(
                         &cfg,
                         "providers:\n  x: {base_url: 'http://127.0.0.1:9'}\n"
                         "agents:\n"
                         "  a:\n"
                         "    model: x/y\n"
                         "    tools:\n"
                         "      - nosuch\n"
                         "      - get_time\n"
                         "      - other\n"
                         "  b: {model: x/y, tools: [third]}\n",
                         "t.yaml"),
                     0);
    so.config = cfg;
    assert_int_equal(loom_session_new(&s, &so), LOOM_EINVALID);
    assert_null(s);
    msg = loom_error_last();
    assert_memory_equal(msg,
                        "t.yaml:7: agents.a.tools: unknown tool 'nosuch' "
                        "(available: get_time",
                        strlen("t.yaml:7: agents.a.tools: unknown tool "
                               "'nosuch' (available: get_time"));
    second = strchr(msg, '\n');
    assert_non_null(second);
    assert_string_equal(second,
                        "\nt.yaml:9: agents.a.tools: unknown tool 'other'"
                        "\nt.yaml:10: agents.b.tools: unknown tool 'third'");
    loom_config_free(cfg);
}

/* Request parameters are checked against the model a turn would run,
 * "agent/<name>" and bare names resolved as the turn resolves them. */
static void test_check_params_resolves_names(void **state)
{
    loom_config *cfg;
    loom_session *s;
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    loom_llm_params p;
    const char *param = NULL;

    (void)state;
    assert_int_equal(loom_config_load_string(&cfg, agents_yaml, "t.yaml"), 0);
    so.config = cfg;
    assert_int_equal(loom_session_new(&s, &so), 0);
    memset(&p, 0, sizeof(p));
    p.set = LOOM_PARAM_TOP_P;
    p.top_p = 0.5;
    assert_int_equal(
        loom_session_check_params(s, NULL, "agent/helper", &p, &param), 0);
    assert_int_equal(
        loom_session_check_params(s, NULL, "mock/mock-1", &p, &param), 0);
    assert_int_equal(
        loom_session_check_params(s, NULL, "agent/nobody", &p, &param),
        LOOM_ENOTFOUND);
    loom_session_free(s);
    loom_config_free(cfg);
}

/* Hooks the session holds per agent: each turn of that agent gets its
 * own state (init once, before the first call; free with the turn); other
 * turns get none; unknown versions are refused. */
typedef struct {
    int inits, frees, last_iteration;
    char agent[32];
} hook_counts;

static void *count_init(const loom_agent_state *st, void *payload)
{
    hook_counts *c = payload;
    c->inits++;
    c->last_iteration = st->iteration;
    snprintf(c->agent, sizeof(c->agent), "%s", st->agent ? st->agent : "");
    return c;
}

static void count_free(void *state, void *payload)
{
    hook_counts *c = payload;
    assert_ptr_equal(state, c);
    c->frees++;
}

static void test_agent_hooks_state(void **state)
{
    fx f;
    hook_counts c = {0};
    loom_agent_hooks h = LOOM_AGENT_HOOKS_INIT;
    loom_session_agent_hooks per[1] = {{"helper", &h}};
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    loom_session *s;
    loom_turn *t;

    static const mock_answer two[] = {{.text = "one"}, {.text = "two"}};

    (void)state;
    fx_open(&f, two, 2, 0);
    h.payload = &c;
    h.init_state = count_init;
    h.free_state = count_free;
    so.config = f.cfg;
    so.provider = &f.mock.base;
    so.model = "mock-1";
    so.agent_hooks = per;
    so.agent_hooks_len = 1;
    assert_int_equal(loom_session_new(&s, &so), 0);
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "hi"), 0);
    to.input = &in;
    to.agent = "helper";
    assert_int_equal(loom_turn_new(&t, s, &to), 0);
    assert_int_equal(c.inits, 0);
    assert_int_equal(loom_turn_execute(t), 0);
    assert_int_equal(c.inits, 1);
    assert_int_equal(c.last_iteration, 0);
    assert_string_equal(c.agent, "helper");
    assert_int_equal(c.frees, 0);
    loom_turn_free(t);
    assert_int_equal(c.frees, 1);

    /* A turn without the agent runs without its hooks. */
    to.agent = NULL;
    to.no_agent = 1;
    assert_int_equal(loom_turn_new(&t, s, &to), 0);
    assert_int_equal(loom_turn_execute(t), 0);
    loom_turn_free(t);
    assert_int_equal(c.inits, 1);

    h.version = 99;
    to.agent = "helper";
    to.no_agent = 0;
    assert_int_equal(loom_turn_new(&t, s, &to), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "hooks"));
    loom_session_free(s);
    loom_messages_free(&in);
    fx_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_turn_without_store),
        cmocka_unit_test(test_agent_mapping),
        cmocka_unit_test(test_memories_in_prompt),
        cmocka_unit_test(test_unknown_agent_tools_all),
        cmocka_unit_test(test_agent_as_model),
        cmocka_unit_test(test_turn_stored_then_continued),
        cmocka_unit_test(test_conversation_needs_store),
        cmocka_unit_test(test_store_failure),
        cmocka_unit_test(test_event_log),
        cmocka_unit_test(test_event_log_json),
        cmocka_unit_test(test_event_log_limit),
        cmocka_unit_test(test_start_and_cancel),
        cmocka_unit_test(test_session_outlives_caller),
        cmocka_unit_test(test_versions),
        cmocka_unit_test(test_unknown_agent_tool),
        cmocka_unit_test(test_check_params_resolves_names),
        cmocka_unit_test(test_agent_hooks_state),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
