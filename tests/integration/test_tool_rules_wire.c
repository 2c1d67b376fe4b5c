/*
 * The per-tool rules end to end (docs/agents.md "Tool rules"): a config
 * with `tools` settings and an agent's `tool_options`, turns through the
 * session against the fake upstream, and assertions on the events and
 * on the requests the fake saw: then_force and wrap_result (the forced
 * tool_choice, the wrapped result), repair_arguments (the repair
 * request, the usage summed), default_args_on_bad_json through an
 * agent's tool_options with history: summary (what later requests
 * read), and a tool not enabled (the answer, no second model call).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fake.h"
#include "loom/session.h"
#include "rule_tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* echo {text}, chatbot {use_kb}, rag, strict {n: integer, required},
 * locked (never enabled). */
static loom_tool_registry *make_tools(void)
{
    static const char *const schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"text\":{\"type\":\"string\"}}}",
        "{\"type\":\"object\",\"properties\":{\"use_kb\":{\"type\":"
        "\"boolean\"}}}",
        "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}},"
        "\"required\":[\"n\"]}"};
    json_t *s[3];
    loom_tool_registry *reg;
    loom_tool t;

    for (int i = 0; i < 3; i++)
        assert_non_null(s[i] = json_loads(schemas[i], 0, NULL));
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    memset(&t, 0, sizeof(t));
    t.description = "a test tool";
    t.name = "echo";
    t.parameters = s[0];
    t.execute = rule_echo_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "chatbot";
    t.parameters = s[1];
    t.execute = rule_const_exec;
    t.payload = "chatted";
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "rag";
    t.parameters = NULL;
    t.payload = "ctx";
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "strict";
    t.parameters = s[2];
    t.execute = rule_n_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "locked";
    t.parameters = NULL;
    t.execute = rule_const_exec;
    t.payload = "secret";
    t.should_use = rule_never;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    for (int i = 0; i < 3; i++)
        json_decref(s[i]);
    return reg;
}

static int collect(const loom_event *ev, void *payload)
{
    return json_array_append_new(payload, loom_event_to_json(ev)) ? -1 : 0;
}

/* One turn of agent "a" over the fake serving script, with the config
 * "providers: {fake: ...}" + yaml_tail (%s: none). */
typedef struct {
    loom_fake *fake;
    json_t *events;
    json_t *reqs; /* the bodies the fake got, in order */
    char *text;   /* the turn's answer */
    int rc;
} outcome;

static void run_turn(outcome *o, const char *script, const char *yaml_tail)
{
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_tool_registry *reg = make_tools();
    loom_messages in = {0};
    loom_config *cfg = NULL;
    loom_session *s;
    loom_turn *t;
    json_t *all, *r;
    char yaml[4096];
    size_t i;

    memset(o, 0, sizeof(*o));
    assert_non_null(o->fake = fake_start_script(script));
    snprintf(yaml, sizeof(yaml),
             "providers:\n"
             "  fake: {base_url: '%s', retries: {max: 0}}\n"
             "%s",
             fake_base_url(o->fake), yaml_tail);
    if (loom_config_load_string(&cfg, yaml, "t.yaml") != 0)
        fail_msg("config: %s", loom_error_last());
    so.config = cfg;
    so.tools = reg;
    assert_int_equal(loom_session_new(&s, &so), 0);
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "hi"), 0);
    o->events = json_array();
    to.input = &in;
    to.agent = "a";
    to.sink = (loom_sink){collect, o->events};
    assert_int_equal(loom_turn_new(&t, s, &to), 0);
    o->rc = loom_turn_execute(t);
    o->text = strdup(json_string_value(json_object_get(
        json_array_get(o->events, json_array_size(o->events) - 1), "text")));
    all = fake_requests(o->fake);
    o->reqs = json_array();
    json_array_foreach(all, i, r)
    {
        json_array_append(o->reqs, json_object_get(r, "body"));
    }
    json_decref(all);
    loom_turn_free(t);
    loom_session_free(s);
    loom_config_free(cfg);
    loom_tool_registry_free(reg);
    loom_messages_free(&in);
}

static void outcome_free(outcome *o)
{
    fake_stop(o->fake);
    json_decref(o->events);
    json_decref(o->reqs);
    free(o->text);
}

/* The contents of request k's messages of role, joined by "|". */
static char *contents(const outcome *o, size_t k, const char *role)
{
    const json_t *msgs =
        json_object_get(json_array_get(o->reqs, k), "messages");
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    size_t i;
    json_t *m;

    json_array_foreach(msgs, i, m)
    {
        const char *c = json_string_value(json_object_get(m, "content"));
        if (strcmp(json_string_value(json_object_get(m, "role")), role) != 0)
            continue;
        loom_buf_printf(&b, "%s%s", b.len ? "|" : "", c ? c : "");
    }
    return loom_buf_detach(&b);
}

/* The event of type, nth of them, or NULL. */
static json_t *event(const outcome *o, const char *type, int nth)
{
    size_t i;
    json_t *e;

    json_array_foreach(o->events, i, e)
    {
        if (strcmp(json_string_value(json_object_get(e, "type")), type) == 0 &&
            nth-- == 0)
            return e;
    }
    return NULL;
}

static void expect_contents(const outcome *o, size_t k, const char *role,
                            const char *want)
{
    char *got = contents(o, k, role);

    assert_string_equal(got, want);
    free(got);
}

/* chatbot with use_kb forces rag on the next request; rag's result is
 * read wrapped. */
static void test_then_force_and_wrap(void **state)
{
    static const char script[] =
        "{\"responses\": ["
        "{\"tool_calls\": [{\"id\": \"c1\", \"name\": \"chatbot\", "
        "\"arguments\": \"{\\\"use_kb\\\": true}\"}]},"
        "{\"tool_calls\": [{\"id\": \"c2\", \"name\": \"rag\", "
        "\"arguments\": \"{}\"}]},"
        "{\"text\": [\"answered\"]}]}";
    static const char yaml[] =
        "agents:\n"
        "  a: {model: fake/m, tools: [chatbot, rag]}\n"
        "tools:\n"
        "  chatbot: {then_force: {tool: rag, when: use_kb}}\n"
        "  rag: {wrap_result: '<context>{result}</context>'}\n";
    json_t *choice;
    outcome o;

    (void)state;
    run_turn(&o, script, yaml);
    assert_int_equal(o.rc, 0);
    assert_int_equal(json_array_size(o.reqs), 3);
    /* Free choice, then rag, then free again. */
    assert_false(json_is_object(
        json_object_get(json_array_get(o.reqs, 0), "tool_choice")));
    choice = json_object_get(json_array_get(o.reqs, 1), "tool_choice");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(choice, "function"), "name")),
                        "rag");
    assert_false(json_is_object(
        json_object_get(json_array_get(o.reqs, 2), "tool_choice")));
    expect_contents(&o, 2, "tool", "chatted|<context>ctx</context>");
    assert_string_equal(o.text, "answered");
    outcome_free(&o);
}

/* Broken arguments of strict go to the repair model (its own request,
 * chosen by a rule on its instructions); the repaired call runs and the
 * usage of all three calls is summed. */
static void test_repair_arguments(void **state)
{
    static const char script[] =
        "{\"rules\": [{\"match\": {\"system\": \"You repair the arguments\"},"
        "  \"responses\": [{\"text\": [\"{\\\"n\\\": 3}\"], \"usage\": "
        "  {\"prompt_tokens\": 7, \"completion_tokens\": 2, "
        "\"total_tokens\": 9}}]}],"
        "\"responses\": ["
        "{\"tool_calls\": [{\"id\": \"c1\", \"name\": \"strict\", "
        "\"arguments\": \"{n: 3,\"}], \"usage\": {\"prompt_tokens\": 10, "
        "\"completion_tokens\": 5, \"total_tokens\": 15}},"
        "{\"text\": [\"three\"], \"usage\": {\"prompt_tokens\": 20, "
        "\"completion_tokens\": 1, \"total_tokens\": 21}}]}";
    static const char yaml[] =
        "models:\n"
        "  fake/fixer: {upstream: fixer-1}\n"
        "agents:\n"
        "  a: {model: fake/m, tools: [strict]}\n"
        "tools:\n"
        "  strict: {repair_arguments: {model: fake/fixer}}\n";
    const json_t *repair, *usage;
    json_t *ev;
    char *user;
    outcome o;

    (void)state;
    run_turn(&o, script, yaml);
    assert_int_equal(o.rc, 0);
    assert_int_equal(json_array_size(o.reqs), 3);
    repair = json_array_get(o.reqs, 1);
    assert_string_equal(json_string_value(json_object_get(repair, "model")),
                        "fixer-1");
    assert_null(json_object_get(repair, "tools"));
    user = contents(&o, 1, "user");
    assert_non_null(strstr(user, "Tool: strict"));
    assert_non_null(strstr(user, "{n: 3,"));
    free(user);
    expect_contents(&o, 2, "tool", "n=3");
    ev = event(&o, "usage", 1);
    assert_string_equal(json_string_value(json_object_get(ev, "purpose")),
                        "repair_arguments");
    usage = json_object_get(event(&o, "run.completed", 0), "usage");
    assert_int_equal(
        json_integer_value(json_object_get(usage, "prompt_tokens")), 37);
    assert_int_equal(
        json_integer_value(json_object_get(usage, "completion_tokens")), 8);
    assert_int_equal(json_integer_value(json_object_get(usage, "total_tokens")),
                     45);
    assert_string_equal(o.text, "three");
    outcome_free(&o);
}

/* The agent's tool_options give echo default arguments (the global
 * settings do not) and its results history: summary: the second request
 * reads echo's result whole, the third its summary. */
static void test_default_args_and_history(void **state)
{
    static const char script[] =
        "{\"responses\": ["
        "{\"tool_calls\": [{\"id\": \"c1\", \"name\": \"echo\", "
        "\"arguments\": \"{text: oops\"}]},"
        "{\"tool_calls\": [{\"id\": \"c2\", \"name\": \"echo\", "
        "\"arguments\": \"{\\\"text\\\": \\\"x\\\"}\"}]},"
        "{\"text\": [\"done\"]}]}";
    static const char yaml[] = "agents:\n"
                               "  a:\n"
                               "    model: fake/m\n"
                               "    tools: [echo]\n"
                               "    tool_options:\n"
                               "      echo: {default_args_on_bad_json: true}\n"
                               "tools:\n"
                               "  echo: {history: summary}\n";
    outcome o;

    (void)state;
    run_turn(&o, script, yaml);
    assert_int_equal(o.rc, 0);
    assert_int_equal(json_array_size(o.reqs), 3);
    expect_contents(&o, 1, "tool", "echo:-");
    expect_contents(&o, 2, "tool",
                    "[result of echo, shortened for history] echo "
                    "summary|echo:x");
    /* The events carry the whole results. */
    assert_string_equal(json_string_value(json_object_get(
                            event(&o, "tool.completed", 0), "output")),
                        "echo:-");
    outcome_free(&o);
}

/* A call to a tool not enabled: TOOL_NOT_ENABLED, and the turn ends
 * with the agent's message instead of asking the model again. */
static void test_tools_disabled(void **state)
{
    static const char script[] =
        "{\"responses\": ["
        "{\"tool_calls\": [{\"id\": \"c1\", \"name\": \"locked\", "
        "\"arguments\": \"{}\"}]},"
        "{\"text\": [\"must not be asked\"]}]}";
    static const char yaml[] =
        "agents:\n"
        "  a:\n"
        "    model: fake/m\n"
        "    tools: [locked]\n"
        "    tools_disabled_message: 'Enable {tool} under Settings.'\n";
    json_t *f, *d;
    outcome o;

    (void)state;
    run_turn(&o, script, yaml);
    assert_int_equal(o.rc, 0);
    assert_int_equal(json_array_size(o.reqs), 1);
    f = event(&o, "tool.failed", 0);
    assert_string_equal(json_string_value(json_object_get(f, "code")),
                        "TOOL_NOT_ENABLED");
    assert_null(event(&o, "tool.started", 0));
    d = event(&o, "message.delta", 0);
    assert_string_equal(json_string_value(json_object_get(d, "delta")),
                        "Enable locked under Settings.");
    assert_string_equal(o.text, "Enable locked under Settings.");
    assert_string_equal(json_string_value(json_object_get(
                            event(&o, "run.completed", 0), "finish_reason")),
                        "stop");
    outcome_free(&o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_then_force_and_wrap),
        cmocka_unit_test(test_repair_arguments),
        cmocka_unit_test(test_default_args_and_history),
        cmocka_unit_test(test_tools_disabled),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
