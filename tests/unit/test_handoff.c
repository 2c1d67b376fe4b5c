/*
 * Unit tests of handoffs in the run loop (docs/agents.md "Handoffs")
 * with the mock provider: a transfer_to_<agent> call makes the next
 * request the new agent's (its prompt, tools and provider), an
 * agent.changed event says so, each message knows its agent, and the
 * failures (an agent not offered, a second handoff in a turn, the
 * run's handoff limit, a resolver error) are tool errors the model
 * reads. The same flow through the session and the store is tested
 * against the fake upstream in tests/integration/test_handoffs.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/error.h"
#include "loom/run.h"
#include "mock_provider.h"

#include <stdlib.h>
#include <string.h>

static int echo_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    (void)args;
    (void)ctx;
    (void)payload;
    return loom_buf_puts(out, "echoed");
}

/* Agents a (tools: echo; hands off to b) and b (no tools; hands off to
 * a), b on a provider of its own. */
typedef struct {
    mock_provider ma, mb;
    loom_tool_registry *reg;
    json_t *events;
    int b_max_iterations;
    int fail_resolve;
    int a_unprompted; /* a has no system prompt */
    loom_run *run;
    int rc;
} fixture;

static const loom_run_handoff to_a[] = {{"a", NULL}};
static const loom_run_handoff to_b[] = {{"b", "Agent b answers billing."}};
static const char *const a_tools[] = {"echo"};

static int record(const loom_event *ev, void *payload)
{
    fixture *f = payload;

    json_array_append_new(f->events, loom_event_to_json(ev));
    return 0;
}

/* The resolver a session would be: agent name -> options. */
static int resolve(const char *agent, loom_run_options *o, void *payload)
{
    fixture *f = payload;

    if (strcmp(agent, "a") == 0) {
        o->agent = "a";
        o->system_prompt = f->a_unprompted ? NULL : "You are a.";
        o->tool_names = a_tools;
        o->tool_names_len = 1;
        o->provider = &f->ma.base;
        o->model = "ma/m";
        o->upstream_model = "m";
        o->max_iterations = 0;
        o->handoffs = to_b;
        o->handoffs_len = 1;
        return 0;
    }
    if (f->fail_resolve)
        return loom__error_set(LOOM_ENOTFOUND, "no model 'x/y'");
    o->agent = "b";
    o->system_prompt = "You are b.";
    o->tool_names = a_tools; /* a list: none of it is b's */
    o->tool_names_len = 0;
    o->provider = &f->mb.base;
    o->model = "mb/m";
    o->upstream_model = "m";
    o->max_iterations = f->b_max_iterations;
    o->handoffs = to_a;
    o->handoffs_len = 1;
    return 0;
}

static void run_as_a(fixture *f, const mock_answer *aa, int na,
                     const mock_answer *ab, int nb)
{
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    loom_tool t;

    mock_init(&f->ma, aa, na, MOCK_STREAM_CALLS);
    mock_init(&f->mb, ab, nb, MOCK_STREAM_CALLS);
    assert_int_equal(loom_tool_registry_new(&f->reg), 0);
    memset(&t, 0, sizeof(t));
    t.name = "echo";
    t.description = "echoes";
    t.execute = echo_exec;
    assert_int_equal(loom_tool_registry_add(f->reg, &t), 0);
    f->events = json_array();
    ro.tools = f->reg;
    ro.sink.emit = record;
    ro.sink.payload = f;
    ro.resolve_agent = resolve;
    ro.resolve_payload = f;
    assert_int_equal(resolve("a", &ro, f), 0);
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "hi"), 0);
    assert_int_equal(loom_run_new(&f->run, &ro, &hist), 0);
    loom_messages_free(&hist);
    f->rc = loom_run_execute(f->run);
}

static void fixture_free(fixture *f)
{
    loom_run_free(f->run);
    loom_tool_registry_free(f->reg);
    json_decref(f->events);
    mock_clear(&f->ma);
    mock_clear(&f->mb);
}

/* The events of a type, in order. */
static json_t *events_of(const fixture *f, const char *type)
{
    json_t *out = json_array(), *e;
    size_t i;

    json_array_foreach(f->events, i, e)
    {
        if (strcmp(json_string_value(json_object_get(e, "type")), type) == 0)
            json_array_append(out, e);
    }
    return out;
}

static const char *str_of(const json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

static void test_transfer_switches_agent(void **state)
{
    static const mock_answer aa[] = {
        {.calls = {{"c1", "transfer_to_b", "{\"reason\":\"billing\"}"}},
         .ncalls = 1}};
    static const mock_answer ab[] = {{.text = "b here."}};
    fixture f;
    json_t *ch;
    const loom_messages *m;
    (void)state;

    memset(&f, 0, sizeof(f));
    run_as_a(&f, aa, 1, ab, 1);
    assert_int_equal(f.rc, 0);
    assert_string_equal(loom_run_text(f.run), "b here.");
    /* a's request: its prompt, its tool and its handoff. */
    assert_string_equal(f.ma.seen[0].system, "You are a.");
    assert_string_equal(f.ma.seen[0].tools, "echo,transfer_to_b");
    /* b's request, on b's provider: its prompt, only its handoff, and
     * the transfer's result last. */
    assert_int_equal(f.mb.next, 1);
    assert_string_equal(f.mb.seen[0].system, "You are b.");
    assert_int_equal(f.mb.seen[0].nsystem, 1);
    assert_string_equal(f.mb.seen[0].tools, "transfer_to_a");
    assert_string_equal(f.mb.seen[0].all_roles, "suat");
    assert_string_equal(f.mb.seen[0].last_content, "Transferred to b.");
    /* The event, between a's tool turn and b's answer. */
    ch = events_of(&f, "agent.changed");
    assert_int_equal(json_array_size(ch), 1);
    assert_string_equal(str_of(json_array_get(ch, 0), "from"), "a");
    assert_string_equal(str_of(json_array_get(ch, 0), "to"), "b");
    assert_string_equal(str_of(json_array_get(ch, 0), "reason"), "billing");
    assert_string_equal(str_of(json_array_get(ch, 0), "call_id"), "c1");
    assert_string_equal(str_of(json_array_get(ch, 0), "model"), "mb/m");
    json_decref(ch);
    ch = events_of(&f, "tool.completed");
    assert_int_equal(json_array_size(ch), 1);
    json_decref(ch);
    /* Who wrote what: the call and its result are a's turn. */
    m = loom_run_messages(f.run);
    assert_int_equal(m->len, 3);
    assert_string_equal(loom_run_message_agent(f.run, 0), "a");
    assert_string_equal(loom_run_message_agent(f.run, 1), "a");
    assert_string_equal(loom_run_message_agent(f.run, 2), "b");
    assert_null(loom_run_message_agent(f.run, 3));
    assert_string_equal(loom_run_agent(f.run), "b");
    assert_string_equal(loom_run_model(f.run), "mb/m");
    fixture_free(&f);
}

/* The new agent's limit counts from the handoff: with max_iterations 2,
 * b's second call is its last (no tools allowed). */
static void test_limit_counts_from_handoff(void **state)
{
    static const mock_answer aa[] = {
        {.calls = {{"c1", "echo", "{}"}}, .ncalls = 1},
        {.calls = {{"c2", "transfer_to_b", "{}"}}, .ncalls = 1}};
    static const mock_answer ab[] = {
        {.calls = {{"c3", "nothing", "{}"}}, .ncalls = 1}, {.text = "done"}};
    fixture f;
    (void)state;

    memset(&f, 0, sizeof(f));
    f.b_max_iterations = 2;
    run_as_a(&f, aa, 2, ab, 2);
    assert_int_equal(f.rc, 0);
    assert_int_equal(f.mb.seen[0].choice, LOOM_TOOL_CHOICE_AUTO);
    assert_int_equal(f.mb.seen[1].choice, LOOM_TOOL_CHOICE_NONE);
    assert_int_equal(loom_run_iterations(f.run), 4);
    fixture_free(&f);
}

/* A handoff that is not offered is an unknown tool; a second one in a
 * turn and a resolver's error are the call's errors; the run goes on
 * as the agent it was. */
static void test_handoff_failures(void **state)
{
    static const mock_answer aa[] = {
        {.calls = {{"c1", "transfer_to_c", "{}"}}, .ncalls = 1},
        {.calls = {{"c2", "transfer_to_b", "{}"},
                   {"c3", "transfer_to_b", "{\"reason\":\"again\"}"}},
         .ncalls = 2}};
    static const mock_answer ab[] = {{.text = "b"}};
    static const mock_answer aa2[] = {
        {.calls = {{"c1", "transfer_to_b", "{}"}}, .ncalls = 1},
        {.text = "still a"}};
    fixture f;
    json_t *failed;
    (void)state;

    memset(&f, 0, sizeof(f));
    run_as_a(&f, aa, 2, ab, 1);
    assert_int_equal(f.rc, 0);
    failed = events_of(&f, "tool.failed");
    assert_int_equal(json_array_size(failed), 2);
    assert_string_equal(str_of(json_array_get(failed, 0), "stage"), "lookup");
    assert_non_null(strstr(f.ma.seen[1].last_content, "transfer_to_c"));
    assert_non_null(strstr(str_of(json_array_get(failed, 1), "error"),
                           "one handoff per turn"));
    json_decref(failed);
    assert_string_equal(loom_run_agent(f.run), "b");
    fixture_free(&f);

    memset(&f, 0, sizeof(f));
    f.fail_resolve = 1;
    run_as_a(&f, aa2, 2, ab, 0);
    assert_int_equal(f.rc, 0);
    assert_string_equal(loom_run_text(f.run), "still a");
    assert_non_null(strstr(f.ma.seen[1].last_content,
                           "cannot hand over to 'b': no model 'x/y'"));
    assert_string_equal(loom_run_agent(f.run), "a");
    failed = events_of(&f, "agent.changed");
    assert_int_equal(json_array_size(failed), 0);
    json_decref(failed);
    fixture_free(&f);
}

/* Agents that hand back and forth: the run's handoffs are bounded and
 * the call past the bound is an error the model reads. */
static void test_handoff_loop_is_bounded(void **state)
{
    static const mock_answer aa[] = {
        {.calls = {{"x", "transfer_to_b", "{}"}}, .ncalls = 1},
        {.calls = {{"x", "transfer_to_b", "{}"}}, .ncalls = 1},
        {.calls = {{"x", "transfer_to_b", "{}"}}, .ncalls = 1},
        {.calls = {{"x", "transfer_to_b", "{}"}}, .ncalls = 1},
        {.calls = {{"x", "transfer_to_b", "{}"}}, .ncalls = 1},
        {.text = "a answers"}};
    static const mock_answer ab[] = {
        {.calls = {{"y", "transfer_to_a", "{}"}}, .ncalls = 1},
        {.calls = {{"y", "transfer_to_a", "{}"}}, .ncalls = 1},
        {.calls = {{"y", "transfer_to_a", "{}"}}, .ncalls = 1},
        {.calls = {{"y", "transfer_to_a", "{}"}}, .ncalls = 1}};
    fixture f;
    json_t *ev;
    (void)state;

    memset(&f, 0, sizeof(f));
    run_as_a(&f, aa, 6, ab, 4);
    assert_int_equal(f.rc, 0);
    ev = events_of(&f, "agent.changed");
    assert_int_equal(json_array_size(ev), LOOM_RUN_MAX_HANDOFFS);
    json_decref(ev);
    ev = events_of(&f, "tool.failed");
    assert_int_equal(json_array_size(ev), 1);
    assert_non_null(
        strstr(str_of(json_array_get(ev, 0), "error"), "handed over 8 times"));
    json_decref(ev);
    assert_string_equal(loom_run_text(f.run), "a answers");
    fixture_free(&f);
}

/* The system message follows the agent: put before the conversation for
 * an agent with a prompt, taken out for one without. */
static void test_system_message_follows_agent(void **state)
{
    static const mock_answer aa[] = {
        {.calls = {{"c1", "transfer_to_b", "{}"}}, .ncalls = 1},
        {.text = "a again"}};
    static const mock_answer ab[] = {
        {.calls = {{"c2", "transfer_to_a", "{}"}}, .ncalls = 1}};
    fixture f;
    (void)state;

    memset(&f, 0, sizeof(f));
    f.a_unprompted = 1;
    run_as_a(&f, aa, 2, ab, 1);
    assert_int_equal(f.rc, 0);
    assert_null(f.ma.seen[0].system);
    assert_string_equal(f.ma.seen[0].all_roles, "u");
    assert_string_equal(f.mb.seen[0].system, "You are b.");
    assert_string_equal(f.mb.seen[0].all_roles, "suat");
    assert_int_equal(f.ma.seen[1].nsystem, 0);
    assert_string_equal(f.ma.seen[1].all_roles, "uatat");
    assert_string_equal(loom_run_text(f.run), "a again");
    fixture_free(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transfer_switches_agent),
        cmocka_unit_test(test_limit_counts_from_handoff),
        cmocka_unit_test(test_handoff_failures),
        cmocka_unit_test(test_handoff_loop_is_bounded),
        cmocka_unit_test(test_system_message_follows_agent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
