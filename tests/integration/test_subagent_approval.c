/*
 * Approval of a sub-agent's tool calls (docs/agents.md "Approval and
 * progress" and "Sub-agents") through the session layer in front of
 * loom-fake-upstream: a child whose get_time needs approval asks in the
 * parent's stream and is answered through the parent's turn, from its
 * sink or from another thread, by call id or naming the child's run; a
 * denial's reason reaches the child's model; a call id that waits in two
 * parallel children needs the run named; the parent's turn says it waits
 * while a child does, and knows the child's run id until it ends; the
 * wait does not count toward the sub-agent call's timeout. The test
 * waits on the turn's event log, never on time.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fake.h"
#include "loom/session.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* helper asks for get_time, then answers; main delegates to helper (one
 * call, or two in parallel with the tasks "time one" and "time two",
 * whose get_time calls have the same id). */
static const char script[] =
    "{\"rules\": ["
    " {\"match\": {\"system\": \"You are main\", \"first_user\": \"twice\"},"
    "  \"responses\": ["
    "   {\"tool_calls\": ["
    "     {\"id\": \"call_1\", \"name\": \"helper\","
    "      \"arguments\": \"{\\\"task\\\":\\\"time one\\\"}\"},"
    "     {\"id\": \"call_2\", \"name\": \"helper\","
    "      \"arguments\": \"{\\\"task\\\":\\\"time two\\\"}\"}]},"
    "   {\"text\": [\"Main: both done\"]}]},"
    " {\"match\": {\"system\": \"You are main\"}, \"responses\": ["
    "   {\"tool_calls\": ["
    "     {\"id\": \"call_h\", \"name\": \"helper\","
    "      \"arguments\": \"{\\\"task\\\":\\\"time one\\\"}\"}]},"
    "   {\"text\": [\"Main: done\"]}]},"
    " {\"match\": {\"first_user\": \"time one\"}, \"responses\": ["
    "   {\"tool_calls\": [{\"id\": \"c1\", \"name\": \"get_time\","
    "     \"arguments\": \"{}\"}]},"
    "   {\"text\": [\"Helper one: answered\"]}]},"
    " {\"match\": {\"first_user\": \"time two\"}, \"responses\": ["
    "   {\"tool_calls\": [{\"id\": \"c1\", \"name\": \"get_time\","
    "     \"arguments\": \"{}\"}]},"
    "   {\"text\": [\"Helper two: answered\"]}]}"
    "]}";

typedef struct {
    loom_fake *fake;
    loom_config *cfg;
    loom_session *s;
    loom_turn *t;
    json_t *events;
    int waited; /* the turn said it waited when the sink was asked */
} fx;

static void fx_open(fx *f)
{
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    char *yaml = NULL;

    memset(f, 0, sizeof(*f));
    f->fake = fake_start_script(script);
    assert_non_null(f->fake);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake: {kind: openai, base_url: %s, api_key: k,"
                         " retries: {max: 0}}\n"
                         "routing: {retries: 0}\n"
                         "models:\n"
                         "  fake/m: {}\n"
                         "tools:\n"
                         "  get_time: {approval: required}\n"
                         "agents:\n"
                         "  main:\n"
                         "    model: fake/m\n"
                         "    system_prompt: You are main.\n"
                         "    tools: []\n"
                         "    sub_agents: [helper]\n"
                         "  hasty:\n"
                         "    model: fake/m\n"
                         "    system_prompt: You are main.\n"
                         "    tools: []\n"
                         "    sub_agents: [helper]\n"
                         "    tool_timeout_ms: 1500\n"
                         "  helper:\n"
                         "    model: fake/m\n"
                         "    description: Tells the time.\n"
                         "    system_prompt: You help.\n"
                         "    tools: [get_time]\n",
                         fake_base_url(f->fake)) > 0);
    if (loom_config_load_string(&f->cfg, yaml, "t.yaml") != 0)
        print_error("config: %s\n", loom_error_last());
    assert_non_null(f->cfg);
    free(yaml);
    so.config = f->cfg;
    if (loom_session_new(&f->s, &so) != 0)
        print_error("session: %s\n", loom_error_last());
    assert_non_null(f->s);
    f->events = json_array();
}

static void fx_close(fx *f)
{
    loom_turn_free(f->t);
    loom_session_free(f->s);
    loom_config_free(f->cfg);
    fake_stop(f->fake);
    json_decref(f->events);
}

static const char *sget(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

/* Makes the turn of main on text, with the event log on. */
static void new_turn(fx *f, const char *text, loom_sink sink)
{
    loom_turn_options o = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};

    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, text), 0);
    o.agent = "main";
    o.input = &in;
    o.log = 1;
    o.sink = sink;
    if (loom_turn_new(&f->t, f->s, &o) != 0)
        print_error("turn: %s\n", loom_error_last());
    assert_non_null(f->t);
    loom_messages_free(&in);
}

/* Reads the turn's log from *seq on until n approval.required events
 * came, copying them into asked; the turn must not end first. */
static void wait_asked(fx *f, uint64_t *seq, size_t n, json_t *asked)
{
    while (json_array_size(asked) < n) {
        const loom_turn_event *e;
        assert_int_equal(loom_turn_wait(f->t, *seq, 20000), 1);
        while ((e = loom_turn_next_event(f->t, *seq)) != NULL) {
            *seq = e->seq;
            if (e->type == LOOM_EV_APPROVAL_REQUIRED)
                json_array_append_new(asked, loom_turn_event_json(e));
        }
        if (json_array_size(asked) < n)
            assert_false(loom_turn_ended(f->t));
    }
}

/* Starts the turn of main on text on its own thread, with the log on,
 * and returns the first n approval.required events once they came. */
static json_t *start_turn(fx *f, const char *agent, const char *text, size_t n)
{
    loom_turn_options o = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    json_t *asked = json_array();
    uint64_t seq = 0;

    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, text), 0);
    o.agent = agent;
    o.input = &in;
    o.log = 1;
    if (loom_turn_start(&f->t, f->s, &o) != 0)
        print_error("turn: %s\n", loom_error_last());
    assert_non_null(f->t);
    loom_messages_free(&in);
    wait_asked(f, &seq, n, asked);
    return asked;
}

/* Waits for the turn's end and keeps its whole log in f->events. */
static void wait_end(fx *f)
{
    const loom_turn_event *e;
    uint64_t seq = 0;

    while (!loom_turn_ended(f->t))
        assert_int_equal(loom_turn_wait(f->t, UINT64_MAX - 1, 20000), 1);
    while ((e = loom_turn_next_event(f->t, seq)) != NULL) {
        seq = e->seq;
        json_array_append_new(f->events, loom_turn_event_json(e));
    }
}

/* The events of type of the run run_id (NULL: any run). */
static size_t count(const json_t *events, const char *type, const char *run_id)
{
    size_t i, n = 0;
    json_t *e;

    json_array_foreach(events, i, e)
    {
        n += strcmp(sget(e, "type"), type) == 0 &&
             (!run_id || strcmp(sget(e, "run_id"), run_id) == 0);
    }
    return n;
}

/* ---- scenarios ----------------------------------------------------------- */

/* The sink answers a child's approval.required through the top turn, as
 * `loom run` does. */
static int approving_sink(const loom_event *ev, void *payload)
{
    fx *f = payload;

    json_array_append_new(f->events, loom_event_to_json(ev));
    if (ev->type != LOOM_EV_APPROVAL_REQUIRED)
        return 0;
    f->waited = loom_turn_awaiting_approval(f->t);
    assert_int_equal(
        loom_turn_approve(f->t, sget(ev->data, "call_id"), 1, NULL), 0);
    return 0;
}

/*
 * The child's approval.required comes nested in the parent's stream
 * (the child's run_id, agent, depth 1), the parent's turn says it waits,
 * and the answer given to the parent's turn from its sink reaches the
 * child: get_time runs and both runs answer.
 */
static void test_approve_from_sink(void **state)
{
    fx f;
    const json_t *asked = NULL;
    const char *child;
    size_t i;
    json_t *e;

    (void)state;
    fx_open(&f);
    new_turn(&f, "go", (loom_sink){approving_sink, &f});
    assert_int_equal(loom_turn_execute(f.t), 0);
    assert_string_equal(loom_run_text(loom_turn_run(f.t)), "Main: done");
    assert_true(f.waited);
    json_array_foreach(f.events, i, e)
    {
        if (strcmp(sget(e, "type"), "approval.required") == 0)
            asked = e;
    }
    assert_non_null(asked);
    assert_string_equal(sget(asked, "tool"), "get_time");
    assert_string_equal(sget(asked, "call_id"), "c1");
    assert_string_equal(sget(asked, "agent"), "helper");
    assert_string_equal(sget(asked, "parent_call_id"), "call_h");
    assert_int_equal(json_integer_value(json_object_get(asked, "depth")), 1);
    child = sget(asked, "run_id");
    assert_string_not_equal(child, loom_turn_id(f.t));
    assert_int_equal(count(f.events, "approval.required", NULL), 1);
    assert_int_equal(count(f.events, "tool.completed", child), 1);
    assert_int_equal(count(f.events, "tool.failed", NULL), 0);
    assert_int_equal(fake_requests_with(f.fake, "Helper one: answered"), 1);
    /* The child is over: nothing of it is live any more. */
    assert_false(loom_turn_has_run(f.t, child));
    assert_false(loom_turn_awaiting_approval(f.t));
    fx_close(&f);
}

/*
 * From another thread, naming the child's run: a wrong run id is not
 * found, the child's is; the denial's reason is what the child's model
 * reads, the child answers and so does the parent.
 */
static void test_deny_naming_run(void **state)
{
    fx f;
    json_t *asked, *e;
    const json_t *failed = NULL;
    char child[128];
    size_t i;

    (void)state;
    fx_open(&f);
    asked = start_turn(&f, "main", "go", 1);
    snprintf(child, sizeof(child), "%s",
             sget(json_array_get(asked, 0), "run_id"));
    assert_true(loom_turn_awaiting_approval(f.t));
    assert_true(loom_turn_has_run(f.t, child));
    assert_true(loom_turn_has_run(f.t, loom_turn_id(f.t)));
    assert_false(loom_turn_has_run(f.t, "run_nobody"));
    assert_int_equal(loom_turn_approve_in(f.t, "run_nobody", "c1", 0, NULL),
                     LOOM_ENOTFOUND);
    assert_int_equal(loom_turn_approve_in(f.t, child, "c9", 0, NULL),
                     LOOM_ENOTFOUND);
    /* The top run has no such call of its own: naming it is not found. */
    assert_int_equal(
        loom_turn_approve_in(f.t, loom_turn_id(f.t), "c1", 0, NULL),
        LOOM_ENOTFOUND);
    assert_int_equal(loom_turn_approve_in(f.t, child, "c1", 0, "not now"), 0);
    wait_end(&f);
    assert_int_equal(loom_turn_status(f.t), LOOM_RUN_COMPLETED);
    assert_string_equal(loom_run_text(loom_turn_run(f.t)), "Main: done");
    json_array_foreach(f.events, i, e)
    {
        if (strcmp(sget(e, "type"), "tool.failed") == 0)
            failed = e;
    }
    assert_non_null(failed);
    assert_string_equal(sget(failed, "run_id"), child);
    assert_string_equal(sget(failed, "stage"), "approval");
    assert_int_equal(count(f.events, "tool.completed", child), 0);
    /* The child's model read the reason, and main the child's answer. */
    assert_int_equal(
        fake_requests_with(f.fake, "the user denied this call: not now"), 1);
    assert_int_equal(fake_requests_with(f.fake, "Helper one: answered"), 1);
    assert_false(loom_turn_has_run(f.t, child));
    json_decref(asked);
    fx_close(&f);
}

/*
 * Two children in parallel wait on calls of the same id: the id alone
 * is ambiguous (LOOM_EEXISTS) and answers neither; each is answered
 * naming its run, one approved and one denied.
 */
static void test_parallel_same_call_id(void **state)
{
    fx f;
    json_t *asked, *e;
    const char *one = NULL, *two = NULL;
    size_t i;

    (void)state;
    fx_open(&f);
    asked = start_turn(&f, "main", "twice", 2);
    json_array_foreach(asked, i, e)
    {
        if (strcmp(sget(e, "parent_call_id"), "call_1") == 0)
            one = sget(e, "run_id");
        else
            two = sget(e, "run_id");
    }
    assert_non_null(one);
    assert_non_null(two);
    assert_int_equal(loom_turn_approve(f.t, "c1", 1, NULL), LOOM_EEXISTS);
    assert_true(loom_turn_awaiting_approval(f.t));
    assert_int_equal(loom_turn_approve_in(f.t, one, "c1", 1, NULL), 0);
    /* Now only one run waits on c1: the id alone finds it. */
    assert_int_equal(loom_turn_approve(f.t, "c1", 0, "no second"), 0);
    wait_end(&f);
    assert_string_equal(loom_run_text(loom_turn_run(f.t)), "Main: both done");
    assert_int_equal(count(f.events, "tool.completed", one), 1);
    assert_int_equal(count(f.events, "tool.failed", two), 1);
    assert_int_equal(
        fake_requests_with(f.fake, "the user denied this call: no second"), 1);
    json_decref(asked);
    fx_close(&f);
}

/*
 * The time a child waits for approval does not count toward its
 * sub-agent call's timeout (hasty's tool_timeout_ms, 1500 ms): nothing
 * happens in the tree for longer than that while it waits, and once
 * approved the call completes.
 */
static void test_wait_outside_timeout(void **state)
{
    fx f;
    json_t *asked;
    uint64_t seq;

    (void)state;
    fx_open(&f);
    asked = start_turn(&f, "hasty", "go", 1);
    seq = loom_turn_last_seq(f.t, NULL);
    assert_int_equal(loom_turn_wait(f.t, seq, 4000), 0);
    assert_true(loom_turn_awaiting_approval(f.t));
    assert_int_equal(loom_turn_approve(f.t, "c1", 1, NULL), 0);
    wait_end(&f);
    assert_string_equal(loom_run_text(loom_turn_run(f.t)), "Main: done");
    assert_int_equal(count(f.events, "tool.failed", NULL), 0);
    json_decref(asked);
    fx_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_approve_from_sink),
        cmocka_unit_test(test_deny_naming_run),
        cmocka_unit_test(test_parallel_same_call_id),
        cmocka_unit_test(test_wait_outside_timeout),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
