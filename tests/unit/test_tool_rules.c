/*
 * The per-tool rules of the run loop (docs/agents.md "Tool rules") with
 * the mock provider: tool enablement (should_use, TOOL_NOT_ENABLED and
 * the run that ends with tools_disabled_message instead of looping),
 * argument preprocessing (the agent's hook, default_args_on_bad_json,
 * repair_arguments), and what happens once a call ended (the
 * special_tool hook, then_force, wrap_result, history: summary). The
 * same rules run through the fake upstream in
 * tests/integration/test_tool_rules_wire.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "loom/agent.h"
#include "loom/run.h"
#include "mock_provider.h"
#include "rule_tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- tools ---- */

/* Enabled only for user "vip". */
static int vip_only(const loom_tool_ctx *ctx, void *payload)
{
    (void)payload;
    return ctx->user_id && strcmp(ctx->user_id, "vip") == 0;
}

/* echo {text}, chatbot {use_kb} ("chatted"), rag ("ctx"), locked (never
 * enabled), vip (enabled for "vip"), strict {n: integer, required}. */
static loom_tool_registry *make_tools(void)
{
    loom_tool_registry *reg;
    json_t *echo = json_pack("{s:s,s:{s:{s:s}}}", "type", "object",
                             "properties", "text", "type", "string");
    json_t *kb = json_pack("{s:s,s:{s:{s:s}}}", "type", "object", "properties",
                           "use_kb", "type", "boolean");
    json_t *strict =
        json_pack("{s:s,s:{s:{s:s}},s:[s]}", "type", "object", "properties",
                  "n", "type", "integer", "required", "n");
    loom_tool t;

    assert_int_equal(loom_tool_registry_new(&reg), 0);
    memset(&t, 0, sizeof(t));
    t.name = "echo";
    t.description = "echoes";
    t.parameters = echo;
    t.execute = rule_echo_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "chatbot";
    t.parameters = kb;
    t.execute = rule_const_exec;
    t.payload = "chatted";
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "rag";
    t.parameters = NULL;
    t.payload = "ctx";
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "locked";
    t.payload = "secret";
    t.should_use = rule_never;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "vip";
    t.payload = "vip data";
    t.should_use = vip_only;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "strict";
    t.parameters = strict;
    t.execute = rule_n_exec;
    t.should_use = NULL;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    json_decref(echo);
    json_decref(kb);
    json_decref(strict);
    return reg;
}

/* ---- harness ---- */

typedef struct {
    mock_provider mock;
    loom_tool_registry *reg;
    json_t *events;
    loom_run *run;
    int rc;
} harness;

static int record(const loom_event *ev, void *payload)
{
    return json_array_append_new(payload, loom_event_to_json(ev)) ? -1 : 0;
}

/* Runs answers with ro_in's options (may be NULL) over history (NULL:
 * one user message "hi"). */
static void run_hist(harness *h, const mock_answer *answers, int n,
                     const loom_run_options *ro_in, const loom_messages *hist)
{
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_messages one = {0};

    if (ro_in)
        ro = *ro_in;
    memset(h, 0, sizeof(*h));
    mock_init(&h->mock, answers, n, MOCK_STREAM_CALLS);
    h->reg = make_tools();
    h->events = json_array();
    ro.provider = &h->mock.base;
    ro.model = "mock/m";
    ro.upstream_model = "m";
    ro.tools = h->reg;
    ro.sink.emit = record;
    ro.sink.payload = h->events;
    if (!hist) {
        assert_int_equal(loom_messages_add(&one, LOOM_ROLE_USER, "hi"), 0);
        hist = &one;
    }
    assert_int_equal(loom_run_new(&h->run, &ro, hist), 0);
    loom_messages_free(&one);
    h->rc = loom_run_execute(h->run);
}

static void run_with(harness *h, const mock_answer *answers, int n,
                     const loom_run_options *ro_in)
{
    run_hist(h, answers, n, ro_in, NULL);
}

static void harness_free(harness *h)
{
    loom_run_free(h->run);
    loom_tool_registry_free(h->reg);
    json_decref(h->events);
    mock_clear(&h->mock);
}

static json_t *nth_type(const harness *h, const char *type, int nth)
{
    size_t i;
    json_t *e;

    json_array_foreach(h->events, i, e)
    {
        if (!strcmp(json_string_value(json_object_get(e, "type")), type) &&
            nth-- == 0)
            return e;
    }
    return NULL;
}

static int count_type(const harness *h, const char *type)
{
    int n = 0;

    while (nth_type(h, type, n))
        n++;
    return n;
}

/* The text the run streamed (message.delta), joined. */
static char *streamed(const harness *h)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    size_t i;
    json_t *e;

    json_array_foreach(h->events, i, e)
    {
        if (!strcmp(json_string_value(json_object_get(e, "type")),
                    "message.delta"))
            loom_buf_puts(&b, json_string_value(json_object_get(e, "delta")));
    }
    return loom_buf_detach(&b);
}

/* The stored tool result i of the run. */
static const char *tool_result(const harness *h, int i)
{
    const loom_messages *m = loom_run_messages(h->run);
    int k = 0;

    for (size_t j = 0; j < m->len; j++)
        if (m->items[j].role == LOOM_ROLE_TOOL && k++ == i)
            return m->items[j].content;
    return NULL;
}

/* ---- tool enablement ---- */

/* A call to a disabled tool fails TOOL_NOT_ENABLED; when every call of
 * the turn did, the run ends with the disabled message, without calling
 * the model again. */
static void test_tools_disabled_default(void **state)
{
    static const mock_answer answers[] = {
        {.calls = {{"c1", "locked", "{}"}, {"c2", "vip", "{}"}}, .ncalls = 2}};
    harness h;
    json_t *f;
    char *text;

    (void)state;
    run_with(&h, answers, 1, NULL);
    assert_int_equal(h.rc, 0);
    assert_int_equal(h.mock.next, 1);
    assert_int_equal(count_type(&h, "tool.failed"), 2);
    f = nth_type(&h, "tool.failed", 0);
    assert_string_equal(json_string_value(json_object_get(f, "code")),
                        "TOOL_NOT_ENABLED");
    assert_string_equal(json_string_value(json_object_get(f, "stage")),
                        "enablement");
    assert_int_equal(count_type(&h, "tool.started"), 0);
    text = streamed(&h);
    assert_non_null(strstr(text, "I could not use locked"));
    assert_string_equal(loom_run_text(h.run), text);
    assert_string_equal(loom_run_finish_reason(h.run), "stop");
    /* The stored turn: the calls, their results, the answer. */
    assert_int_equal(loom_run_messages(h.run)->len, 4);
    assert_non_null(strstr(tool_result(&h, 0), "not enabled"));
    free(text);
    harness_free(&h);
}

/* The agent's tools_disabled_message, {tool} filled in; a tool enabled
 * for the user runs as usual. */
static void test_tools_disabled_message_and_user(void **state)
{
    static const mock_answer answers[] = {
        {.calls = {{"c1", "vip", "{}"}}, .ncalls = 1}, {.text = "done"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;

    (void)state;
    ro.tools_disabled_message = "Ask for {tool} access ({tool}).";
    run_with(&h, answers, 1, &ro);
    assert_string_equal(loom_run_text(h.run), "Ask for vip access (vip).");
    harness_free(&h);

    ro.user_id = "vip";
    run_with(&h, answers, 2, &ro);
    assert_string_equal(loom_run_text(h.run), "done");
    assert_string_equal(tool_result(&h, 0), "vip data");
    harness_free(&h);
}

/* One enabled call among the disabled ones: the loop goes on. */
static void test_tools_disabled_mixed_loops(void **state)
{
    static const mock_answer answers[] = {
        {.calls = {{"c1", "locked", "{}"}, {"c2", "rag", "{}"}}, .ncalls = 2},
        {.text = "answered"}};
    harness h;

    (void)state;
    run_with(&h, answers, 2, NULL);
    assert_int_equal(h.mock.next, 2);
    assert_string_equal(loom_run_text(h.run), "answered");
    harness_free(&h);
}

/* The hook decides: going on with a note, or ending with its text. */
typedef struct {
    int go_on;
    int reason;
    size_t ncalls;
} no_calls_seen;

static int on_no_calls(const loom_agent_state *st, loom_no_calls_reason reason,
                       const loom_tool_call *calls, size_t ncalls,
                       loom_buf *message, void *payload)
{
    no_calls_seen *s = payload;

    (void)st;
    /* The hook is asked for every reason (loom/agent.h); this one
     * answers TOOLS_DISABLED only and lets the others end the run. */
    if (reason != LOOM_NO_CALLS_TOOLS_DISABLED)
        return 0;
    s->reason = (int)reason;
    s->ncalls = ncalls;
    assert_string_equal(calls[0].name, "locked");
    loom_buf_puts(message, s->go_on ? "note: use rag" : "hook says no");
    return s->go_on;
}

static void test_tools_disabled_hook(void **state)
{
    static const mock_answer answers[] = {
        {.calls = {{"c1", "locked", "{}"}}, .ncalls = 1}, {.text = "ok"}};
    loom_agent_hooks hooks = LOOM_AGENT_HOOKS_INIT;
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    no_calls_seen seen = {0, -1, 0};
    harness h;

    (void)state;
    hooks.on_no_tool_calls = on_no_calls;
    hooks.payload = &seen;
    ro.agent_hooks = &hooks;
    run_with(&h, answers, 1, &ro);
    assert_int_equal(seen.reason, LOOM_NO_CALLS_TOOLS_DISABLED);
    assert_int_equal(seen.ncalls, 1);
    assert_string_equal(loom_run_text(h.run), "hook says no");
    harness_free(&h);

    seen.go_on = 1;
    run_with(&h, answers, 2, &ro);
    assert_int_equal(h.mock.next, 2);
    assert_string_equal(h.mock.seen[1].last_content, "note: use rag");
    assert_string_equal(loom_run_text(h.run), "ok");
    harness_free(&h);
}

/* ---- argument preprocessing ---- */

/* The hook: "echo" gets its text made up, "strict" is refused. */
static loom_args_action preprocess(const loom_agent_state *st,
                                   const loom_tool_call *call, json_t **args,
                                   loom_buf *error, void *payload)
{
    (void)st;
    (void)payload;
    if (strcmp(call->name, "echo") == 0) {
        *args = json_pack("{s:s}", "text", "from hook");
        return LOOM_ARGS_SET;
    }
    if (strcmp(call->name, "strict") == 0) {
        loom_buf_puts(error, "strict is refused here");
        return LOOM_ARGS_FAIL;
    }
    return LOOM_ARGS_DEFAULT;
}

static void test_preprocess_hook(void **state)
{
    static const mock_answer answers[] = {
        {.calls = {{"c1", "echo", "not json"},
                   {"c2", "strict", "{\"n\": 1}"},
                   {"c3", "rag", "{}"}},
         .ncalls = 3},
        {.text = "done"}};
    loom_agent_hooks hooks = LOOM_AGENT_HOOKS_INIT;
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;

    (void)state;
    hooks.preprocess_tool_arguments = preprocess;
    ro.agent_hooks = &hooks;
    run_with(&h, answers, 2, &ro);
    assert_int_equal(h.rc, 0);
    assert_string_equal(tool_result(&h, 0), "echo:from hook");
    assert_string_equal(tool_result(&h, 1), "Error: strict is refused here");
    assert_string_equal(tool_result(&h, 2), "ctx");
    harness_free(&h);
}

/* default_args_on_bad_json: unparsable arguments are {}; without it the
 * call fails as usual. */
static void test_default_args(void **state)
{
    static const mock_answer answers[] = {
        {.calls = {{"c1", "echo", "{text: oops"}, {"c2", "rag", "{oops"}},
         .ncalls = 2},
        {.text = "done"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    json_t *set = json_loads("{\"echo\": {\"default_args_on_bad_json\": "
                             "true}}",
                             0, NULL);
    harness h;

    (void)state;
    ro.tool_settings = set;
    run_with(&h, answers, 2, &ro);
    assert_string_equal(tool_result(&h, 0), "echo:-");
    assert_non_null(strstr(tool_result(&h, 1), "not valid JSON"));
    harness_free(&h);
    json_decref(set);
}

/* repair_arguments: a side call to the repair model makes the arguments;
 * its usage counts in the run's and in a usage event. */
static void test_repair_arguments(void **state)
{
    static const mock_answer answers[] = {
        {.calls = {{"c1", "strict", "{n: 3,"}},
         .ncalls = 1,
         .prompt = 10,
         .completion = 5},
        {.text = "Here: ```{\"n\": 3}```", .prompt = 7, .completion = 2},
        {.text = "three", .prompt = 20, .completion = 1}};
    static const mock_answer failing[] = {
        {.calls = {{"c1", "strict", "{n: 3,"}}, .ncalls = 1},
        {.text = "no idea", .prompt = 4, .completion = 1},
        {.text = "sorry"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    json_t *set = json_loads("{\"strict\": {\"repair_arguments\": "
                             "{\"model\": \"small/fixer\"}}}",
                             0, NULL);
    const loom_usage *u;
    json_t *ev;
    harness h;

    (void)state;
    ro.tool_settings = set;
    run_with(&h, answers, 3, &ro);
    assert_int_equal(h.rc, 0);
    assert_int_equal(h.mock.next, 3);
    /* The repair request: the model named, the instructions, the tool,
     * its schema and the broken text; no tools. */
    assert_string_equal(h.mock.seen[1].model, "small/fixer");
    assert_non_null(strstr(h.mock.seen[1].system, "You repair the arguments"));
    assert_non_null(strstr(h.mock.seen[1].last_content, "Tool: strict"));
    assert_non_null(strstr(h.mock.seen[1].last_content, "\"required\""));
    assert_non_null(strstr(h.mock.seen[1].last_content, "{n: 3,"));
    assert_int_equal(h.mock.seen[1].tools_len, 0);
    assert_string_equal(tool_result(&h, 0), "n=3");
    u = loom_run_usage(h.run);
    assert_int_equal(u->prompt_tokens, 37);
    assert_int_equal(u->completion_tokens, 8);
    ev = nth_type(&h, "usage", 1);
    assert_string_equal(json_string_value(json_object_get(ev, "purpose")),
                        "repair_arguments");
    assert_string_equal(json_string_value(json_object_get(ev, "tool")),
                        "strict");
    assert_int_equal(json_integer_value(json_object_get(ev, "prompt_tokens")),
                     7);
    harness_free(&h);

    /* A repair without JSON: the call fails as its text does not parse;
     * the repair's usage still counts. */
    run_with(&h, failing, 3, &ro);
    assert_non_null(strstr(tool_result(&h, 0), "not valid JSON"));
    assert_int_equal(loom_run_usage(h.run)->prompt_tokens, 4);
    harness_free(&h);

    /* A side model listed in the options is called on its provider. */
    {
        static const mock_answer side_answers[] = {
            {.text = "{\"n\": 5}", .prompt = 1, .completion = 1}};
        static const mock_answer main_answers[] = {
            {.calls = {{"c1", "strict", "{n: 5"}}, .ncalls = 1},
            {.text = "five"}};
        mock_provider side;
        loom_run_side_model m = {"small/fixer", &side.base, "fixer-1"};

        mock_init(&side, side_answers, 1, 0);
        ro.models = &m;
        ro.models_len = 1;
        run_with(&h, main_answers, 2, &ro);
        assert_int_equal(side.next, 1);
        assert_string_equal(side.seen[0].model, "fixer-1");
        assert_string_equal(tool_result(&h, 0), "n=5");
        harness_free(&h);
        mock_clear(&side);
    }
    json_decref(set);
}

/* ---- after a call: then_force, wrap_result, history, special_tool ---- */

static json_t *settings(const char *text)
{
    json_t *v = json_loads(text, 0, NULL);

    assert_non_null(v);
    return v;
}

/* then_force {tool, when}: the next call must call rag when use_kb was
 * true, and only that call; the plain form always forces. */
static void test_then_force(void **state)
{
    static const mock_answer yes[] = {
        {.calls = {{"c1", "chatbot", "{\"use_kb\": true}"}}, .ncalls = 1},
        {.calls = {{"c2", "rag", "{}"}}, .ncalls = 1},
        {.text = "done"}};
    static const mock_answer no[] = {
        {.calls = {{"c1", "chatbot", "{\"use_kb\": false}"}}, .ncalls = 1},
        {.text = "done"}};
    static const mock_answer plain[] = {
        {.calls = {{"c1", "echo", "{}"}}, .ncalls = 1}, {.text = "done"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    json_t *set = settings("{\"chatbot\": {\"then_force\": {\"tool\": "
                           "\"rag\", \"when\": \"use_kb\"}}, \"echo\": "
                           "{\"then_force\": \"rag\"}}");
    harness h;

    (void)state;
    ro.tool_settings = set;
    run_with(&h, yes, 3, &ro);
    assert_int_equal(h.mock.seen[0].choice, LOOM_TOOL_CHOICE_AUTO);
    assert_int_equal(h.mock.seen[1].choice, LOOM_TOOL_CHOICE_FUNCTION);
    assert_string_equal(h.mock.seen[1].choice_fn, "rag");
    assert_int_equal(h.mock.seen[2].choice, LOOM_TOOL_CHOICE_AUTO);
    harness_free(&h);

    run_with(&h, no, 2, &ro);
    assert_int_equal(h.mock.seen[1].choice, LOOM_TOOL_CHOICE_AUTO);
    harness_free(&h);

    run_with(&h, plain, 2, &ro);
    assert_string_equal(h.mock.seen[1].choice_fn, "rag");
    harness_free(&h);
    json_decref(set);
}

/* wrap_result: what the model reads and what is stored; a failed call
 * is not wrapped. */
static void test_wrap_result(void **state)
{
    static const mock_answer answers[] = {
        {.calls = {{"c1", "rag", "{}"}, {"c2", "strict", "{}"}}, .ncalls = 2},
        {.text = "done"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    json_t *set = settings("{\"rag\": {\"wrap_result\": \"<ctx>{result}"
                           "</ctx> use {result}\"}, \"strict\": "
                           "{\"wrap_result\": \"W{result}\"}}");
    harness h;

    (void)state;
    ro.tool_settings = set;
    run_with(&h, answers, 2, &ro);
    assert_string_equal(tool_result(&h, 0), "<ctx>ctx</ctx> use ctx");
    assert_non_null(strstr(h.mock.seen[1].tool_texts, "<ctx>ctx</ctx>"));
    assert_string_not_equal(tool_result(&h, 1), "W");
    assert_int_equal(strncmp(tool_result(&h, 1), "Error:", 6), 0);
    harness_free(&h);
    json_decref(set);
}

/* history: summary: the next call reads the result whole, later calls
 * (and later runs) a reduced version; the stored result is whole. */
static void test_history_summary(void **state)
{
    static const mock_answer answers[] = {
        {.calls = {{"c1", "echo", "{\"text\": \"x\"}"}, {"c2", "rag", "{}"}},
         .ncalls = 2},
        {.calls = {{"c3", "chatbot", "{}"}}, .ncalls = 1},
        {.text = "done"}};
    static const mock_answer later[] = {{.text = "again"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    json_t *set = settings("{\"echo\": {\"history\": \"summary\"}, \"rag\": "
                           "{\"history\": \"summary\"}, \"chatbot\": "
                           "{\"history\": \"full\"}}");
    loom_messages hist = {0};
    harness h;

    (void)state;
    ro.tool_settings = set;
    run_with(&h, answers, 3, &ro);
    assert_string_equal(h.mock.seen[1].tool_texts, "echo:x|ctx");
    assert_string_equal(h.mock.seen[2].tool_texts,
                        "[result of echo, shortened for history] echo "
                        "summary|[result of rag omitted from history]|"
                        "chatted");
    assert_string_equal(tool_result(&h, 0), "echo:x");
    assert_string_equal(tool_result(&h, 1), "ctx");
    /* The next run of the conversation reads the results reduced (the
     * run's messages still carry the tool's summary). */
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "hi"), 0);
    assert_int_equal(loom_messages_append(&hist, loom_run_messages(h.run)), 0);
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "more"), 0);
    harness_free(&h);
    run_hist(&h, later, 1, &ro, &hist);
    assert_string_equal(h.mock.seen[0].tool_texts,
                        "[result of echo, shortened for history] echo "
                        "summary|[result of rag omitted from history]|"
                        "chatted");
    harness_free(&h);
    loom_messages_free(&hist);
    json_decref(set);
}

/* The special_tool hook: after chatbot, force rag; after rag, put its
 * context into the user's message (for the requests only) and replace
 * the result. */
static void special(const loom_agent_state *st, const loom_tool_call *call,
                    int failed, const char *result, loom_special_tool *out,
                    void *payload)
{
    (void)st;
    (void)payload;
    assert_false(failed);
    if (strcmp(call->name, "chatbot") == 0) {
        assert_string_equal(result, "chatted");
        loom_buf_puts(out->force_tool, "rag");
        return;
    }
    for (size_t i = 0; i < out->messages->len; i++) {
        loom_message *m = &out->messages->items[i];
        char *text = NULL;
        if (m->role != LOOM_ROLE_USER)
            continue;
        assert_true(asprintf(&text, "%s\nUser Query: %s", result, m->content) >
                    0);
        free(m->content);
        m->content = text;
    }
    loom_buf_puts(out->result, "(context given)");
}

static void test_special_tool_hook(void **state)
{
    static const mock_answer answers[] = {
        {.calls = {{"c1", "chatbot", "{}"}}, .ncalls = 1},
        {.calls = {{"c2", "rag", "{}"}}, .ncalls = 1},
        {.text = "done"}};
    loom_agent_hooks hooks = LOOM_AGENT_HOOKS_INIT;
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;

    (void)state;
    hooks.special_tool = special;
    ro.agent_hooks = &hooks;
    run_with(&h, answers, 3, &ro);
    assert_int_equal(h.rc, 0);
    assert_string_equal(h.mock.seen[1].choice_fn, "rag");
    assert_string_equal(h.mock.seen[1].first_user, "hi");
    assert_string_equal(h.mock.seen[2].first_user, "ctx\nUser Query: hi");
    assert_string_equal(tool_result(&h, 1), "(context given)");
    assert_string_equal(h.mock.seen[2].tool_texts, "chatted|(context given)");
    harness_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tools_disabled_default),
        cmocka_unit_test(test_tools_disabled_message_and_user),
        cmocka_unit_test(test_tools_disabled_mixed_loops),
        cmocka_unit_test(test_tools_disabled_hook),
        cmocka_unit_test(test_preprocess_hook),
        cmocka_unit_test(test_default_args),
        cmocka_unit_test(test_repair_arguments),
        cmocka_unit_test(test_then_force),
        cmocka_unit_test(test_wrap_result),
        cmocka_unit_test(test_history_summary),
        cmocka_unit_test(test_special_tool_hook),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
