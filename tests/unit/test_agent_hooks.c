/*
 * Unit tests of the agent's loop hooks (loom/agent.h, run.c's "agent
 * hooks" section, loop_rules.c) with the in-process mock provider: each
 * test scripts the model's answers and asserts on what every request
 * carried (system notes, tools offered or not, the model asked for), the
 * events and the run's outcome. The YAML keys built on loom's default
 * hooks (retry_without_tool_calls, model_after_retries,
 * non_iterative_tools) are tested through run options, through their
 * mapping from a config, and through a session turn; so is a turn's
 * max_iterations winning over the agent's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "agent/model_opts.h"
#include "loom/run.h"
#include "loom/session.h"
#include "mock_provider.h"

#include <stdlib.h>
#include <string.h>

/* ---- fixtures ------------------------------------------------------------ */

static int echo_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    (void)ctx;
    (void)payload;
    return loom_buf_printf(out, "echo:%s",
                           json_string_value(json_object_get(args, "text")));
}

static int fail_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    (void)args;
    (void)ctx;
    (void)payload;
    loom_buf_puts(out, "broken");
    return LOOM_ERROR;
}

static loom_tool_registry *make_tools(void)
{
    loom_tool_registry *reg;
    loom_tool t;

    assert_int_equal(loom_tool_registry_new(&reg), 0);
    memset(&t, 0, sizeof(t));
    t.name = "echo";
    t.description = "echoes text";
    t.execute = echo_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "fail";
    t.description = "always fails";
    t.execute = fail_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    return reg;
}

typedef struct {
    mock_provider mock;
    loom_tool_registry *reg;
    json_t *events;
    loom_run *run;
    int rc;
} harness;

static int record(const loom_event *ev, void *payload)
{
    json_array_append_new(payload, loom_event_to_json(ev));
    return 0;
}

/* Runs the loop over one user message with ro (may be NULL). */
static void run_with(harness *h, const mock_answer *answers, int n,
                     const loom_run_options *ro_in)
{
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};

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
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "hi"), 0);
    assert_int_equal(loom_run_new(&h->run, &ro, &hist), 0);
    loom_messages_free(&hist);
    h->rc = loom_run_execute(h->run);
}

static void harness_free(harness *h)
{
    loom_run_free(h->run);
    loom_tool_registry_free(h->reg);
    json_decref(h->events);
    mock_clear(&h->mock);
}

/* The nth event of type (from 0), or NULL. */
static json_t *nth_event(const harness *h, const char *type, int nth)
{
    size_t i;
    json_t *e;

    json_array_foreach(h->events, i, e)
    {
        if (strcmp(json_string_value(json_object_get(e, "type")), type) == 0 &&
            nth-- == 0)
            return e;
    }
    return NULL;
}

static const char *completed_str(const harness *h, const char *key)
{
    return json_string_value(
        json_object_get(nth_event(h, "run.completed", 0), key));
}

/* What the test hooks were told, and how they answer. */
typedef struct {
    int stop_at;      /* should_continue: 0 once iteration reaches it */
    int tools_from;   /* should_send_tools: 0 before this iteration */
    int retry_max;    /* on_no_tool_calls: go on this many times */
    const char *note; /* ... with this message */
    int limit_go;     /* LIMIT_REACHED: go on */
    const char *limit_note;
    int process_stop;  /* process_tool_calls answers this */
    const char *model; /* get_model answers this */
    int usage_factor;  /* calculate_usage multiplies prompt tokens */
    int reasons[8];    /* on_no_tool_calls's reasons, in order */
    int nreasons;
    size_t selected;     /* calls on_tools_selected saw */
    int retries_seen;    /* st->retries at the last on_no_tool_calls */
    size_t offered_seen; /* st->tools_offered at the last one */
    int freed;           /* free_state was called with our state */
} hook_log;

static void *h_init(const loom_agent_state *st, void *payload)
{
    (void)st;
    return payload;
}

static void h_free(void *state, void *payload)
{
    ((hook_log *)payload)->freed += state == payload;
}

static int h_continue(const loom_agent_state *st, void *payload)
{
    hook_log *l = payload;

    assert_ptr_equal(st->state, l);
    return !l->stop_at || st->iteration < l->stop_at;
}

static int h_send_tools(const loom_agent_state *st, void *payload)
{
    return st->iteration >= ((hook_log *)payload)->tools_from;
}

static int h_no_calls(const loom_agent_state *st, loom_no_calls_reason reason,
                      const loom_tool_call *calls, size_t ncalls,
                      loom_buf *message, void *payload)
{
    hook_log *l = payload;

    (void)calls;
    (void)ncalls;
    if (l->nreasons < 8)
        l->reasons[l->nreasons++] = (int)reason;
    l->retries_seen = st->retries;
    l->offered_seen = st->tools_offered;
    if (reason == LOOM_NO_CALLS_LIMIT_REACHED) {
        if (l->limit_note)
            loom_buf_puts(message, l->limit_note);
        return l->limit_go;
    }
    if (l->note)
        loom_buf_puts(message, l->note);
    return st->retries < l->retry_max;
}

static const char *h_model(const loom_agent_state *st, void *payload)
{
    hook_log *l = payload;

    return st->iteration >= 1 ? l->model : NULL;
}

static void h_usage(const loom_agent_state *st, const loom_usage *call,
                    loom_usage *out, void *payload)
{
    (void)st;
    out->prompt_tokens =
        call->prompt_tokens * ((hook_log *)payload)->usage_factor;
}

static void h_selected(const loom_agent_state *st, const loom_tool_call *calls,
                       size_t n, void *payload)
{
    (void)st;
    (void)calls;
    ((hook_log *)payload)->selected += n;
}

static int h_process(const loom_agent_state *st, const loom_tool_call *calls,
                     size_t n, void *payload)
{
    (void)st;
    (void)calls;
    (void)n;
    return ((hook_log *)payload)->process_stop;
}

/* Hooks with every loop member of this file set, payload l. */
static loom_agent_hooks all_hooks(hook_log *l)
{
    loom_agent_hooks h = LOOM_AGENT_HOOKS_INIT;

    h.payload = l;
    h.init_state = h_init;
    h.free_state = h_free;
    h.should_continue = h_continue;
    h.should_send_tools = h_send_tools;
    h.on_no_tool_calls = h_no_calls;
    h.get_model = h_model;
    h.calculate_usage = h_usage;
    h.on_tools_selected = h_selected;
    h.process_tool_calls = h_process;
    return h;
}

static const mock_answer echo_then_text[] = {
    {.text = "looking",
     .calls = {{"c1", "echo", "{\"text\":\"x\"}"}},
     .ncalls = 1,
     .prompt = 10,
     .completion = 1},
    {.text = "done", .prompt = 20, .completion = 2}};

/* ---- the hooks ----------------------------------------------------------- */

/* should_continue 0 ends the run before the second call, with the first
 * call's text; on_tools_selected saw the call; free_state got the
 * state. */
static void test_should_continue(void **state)
{
    hook_log l = {.stop_at = 1, .usage_factor = 1};
    loom_agent_hooks hk = all_hooks(&l);
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;

    (void)state;
    ro.agent_hooks = &hk;
    run_with(&h, echo_then_text, 2, &ro);
    assert_int_equal(h.rc, 0);
    assert_int_equal(h.mock.next, 1);
    assert_string_equal(loom_run_text(h.run), "looking");
    assert_string_equal(loom_run_finish_reason(h.run), "stop");
    assert_string_equal(completed_str(&h, "text"), "looking");
    assert_int_equal(l.selected, 1);
    assert_int_equal(l.nreasons, 0);
    harness_free(&h);
    assert_int_equal(l.freed, 1);
}

/* NO_CALLS_GENERATED: going on keeps the answer, adds the hook's note,
 * counts retries; ending appends the hook's text to the answer. */
static void test_no_calls_generated(void **state)
{
    static const mock_answer a[] = {
        {.text = "first"}, {.text = "second"}, {.text = "third"}};
    hook_log l = {.retry_max = 2, .note = "Use a tool."};
    loom_agent_hooks hk = LOOM_AGENT_HOOKS_INIT;
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;

    (void)state;
    hk.payload = &l;
    hk.on_no_tool_calls = h_no_calls;
    ro.agent_hooks = &hk;
    run_with(&h, a, 3, &ro);
    assert_int_equal(h.rc, 0);
    assert_int_equal(h.mock.next, 3);
    /* user, the answer kept, the note. */
    assert_string_equal(h.mock.seen[1].all_roles, "uas");
    assert_string_equal(h.mock.seen[1].last_content, "Use a tool.");
    assert_string_equal(h.mock.seen[2].all_roles, "uasas");
    assert_int_equal(l.nreasons, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(l.reasons[i], LOOM_NO_CALLS_GENERATED);
    assert_int_equal(l.retries_seen, 2);
    assert_int_equal(l.offered_seen, 2);
    /* The third call ended the run: its text and then the note. */
    assert_string_equal(loom_run_text(h.run), "thirdUse a tool.");
    assert_string_equal(json_string_value(json_object_get(
                            nth_event(&h, "message.delta", 3), "delta")),
                        "Use a tool.");
    /* Notes are loom's own: the run's messages hold the answers only. */
    assert_int_equal(loom_run_messages(h.run)->len, 3);
    harness_free(&h);
}

/* LIMIT_REACHED before the last call: a hook's message replaces the
 * limit note; ending stops before that call with the message as the
 * answer. */
static void test_limit_reached(void **state)
{
    hook_log l = {.limit_go = 1, .limit_note = "Wrap up now."};
    loom_agent_hooks hk = LOOM_AGENT_HOOKS_INIT;
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;

    (void)state;
    hk.payload = &l;
    hk.on_no_tool_calls = h_no_calls;
    ro.agent_hooks = &hk;
    ro.max_iterations = 2;
    run_with(&h, echo_then_text, 2, &ro);
    assert_int_equal(h.rc, 0);
    assert_int_equal(l.reasons[0], LOOM_NO_CALLS_LIMIT_REACHED);
    assert_string_equal(h.mock.seen[1].last_content, "Wrap up now.");
    assert_int_equal(h.mock.seen[1].choice, LOOM_TOOL_CHOICE_NONE);
    assert_string_equal(loom_run_text(h.run), "done");
    harness_free(&h);

    /* Going on without a message: the built-in limit note. */
    l = (hook_log){.limit_go = 1};
    run_with(&h, echo_then_text, 2, &ro);
    assert_non_null(strstr(h.mock.seen[1].last_content, "limit of 2"));
    harness_free(&h);

    /* Ending: no second call; the hook's text is the answer. */
    l = (hook_log){.limit_go = 0, .limit_note = "Stopped at the limit."};
    run_with(&h, echo_then_text, 2, &ro);
    assert_int_equal(h.rc, 0);
    assert_int_equal(h.mock.next, 1);
    assert_string_equal(loom_run_text(h.run), "Stopped at the limit.");
    assert_string_equal(loom_run_finish_reason(h.run), "stop");
    harness_free(&h);
}

/* should_send_tools 0: no tools sent while the conversation has no tool
 * call; after one, declared with tool choice none, and calls the model
 * makes anyway are not run. */
static void test_should_send_tools(void **state)
{
    static const mock_answer a[] = {
        {.text = "plain",
         .calls = {{"c0", "echo", "{\"text\":\"0\"}"}},
         .ncalls = 1},
        {.text = "done"}};
    hook_log l = {.tools_from = 5};
    loom_agent_hooks hk = LOOM_AGENT_HOOKS_INIT;
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;

    (void)state;
    hk.payload = &l;
    hk.should_send_tools = h_send_tools;
    ro.agent_hooks = &hk;
    run_with(&h, a, 2, &ro);
    assert_int_equal(h.rc, 0);
    assert_int_equal(h.mock.seen[0].tools_len, 0);
    /* The call was not run: the answer is the text. */
    assert_int_equal(h.mock.next, 1);
    assert_null(nth_event(&h, "tool.started", 0));
    assert_string_equal(loom_run_text(h.run), "plain");
    harness_free(&h);

    /* The hook saying yes: every tool, choice auto. */
    l = (hook_log){.tools_from = 0};
    run_with(&h, echo_then_text, 2, &ro);
    assert_int_equal(h.mock.seen[0].tools_len, 2);
    assert_int_equal(h.mock.seen[1].tools_len, 2);
    assert_int_equal(h.mock.seen[1].choice, LOOM_TOOL_CHOICE_AUTO);
    harness_free(&h);
}

/* A turn's tools are declared, with choice none, once the conversation
 * holds tool calls and should_send_tools says 0. */
static int no_tools_after_first(const loom_agent_state *st, void *payload)
{
    (void)payload;
    return st->iteration == 0;
}

static void test_send_tools_declared_after_calls(void **state)
{
    loom_agent_hooks hk = LOOM_AGENT_HOOKS_INIT;
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;

    (void)state;
    hk.should_send_tools = no_tools_after_first;
    ro.agent_hooks = &hk;
    run_with(&h, echo_then_text, 2, &ro);
    assert_int_equal(h.rc, 0);
    assert_int_equal(h.mock.seen[1].tools_len, 2);
    assert_int_equal(h.mock.seen[1].choice, LOOM_TOOL_CHOICE_NONE);
    harness_free(&h);
}

/* get_model switches the second call's model (no resolver: the name is
 * the upstream id); events say which model answered; calculate_usage
 * sets what counts. */
static void test_get_model_and_usage(void **state)
{
    hook_log l = {.model = "cheap-1", .usage_factor = 3};
    loom_agent_hooks hk = all_hooks(&l);
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;

    (void)state;
    ro.agent_hooks = &hk;
    run_with(&h, echo_then_text, 2, &ro);
    assert_int_equal(h.rc, 0);
    assert_string_equal(h.mock.seen[0].model, "m");
    assert_string_equal(h.mock.seen[1].model, "cheap-1");
    assert_null(json_object_get(nth_event(&h, "usage", 0), "model"));
    assert_string_equal(
        json_string_value(json_object_get(nth_event(&h, "usage", 1), "model")),
        "cheap-1");
    assert_string_equal(completed_str(&h, "model"), "cheap-1");
    assert_int_equal(loom_run_usage(h.run)->prompt_tokens, 90);
    assert_int_equal(json_integer_value(json_object_get(
                         nth_event(&h, "usage", 1), "prompt_tokens")),
                     60);
    harness_free(&h);
}

/* A resolver gives the provider of a switched model; a name it does not
 * know fails the run. */
typedef struct {
    mock_provider *other;
    int calls;
} resolver;

static int resolve(loom_resolved_model *out, const char *name, void *payload)
{
    resolver *r = payload;

    r->calls++;
    if (strcmp(name, "other/cheap") != 0)
        return LOOM_ENOTFOUND;
    out->provider = &r->other->base;
    out->model = "other/cheap";
    out->upstream_model = "cheap-up";
    return 0;
}

static void test_resolve_model(void **state)
{
    static const mock_answer other_a[] = {{.text = "from the other"}};
    static const mock_answer a[] = {
        {.calls = {{"c1", "echo", "{\"text\":\"x\"}"}}, .ncalls = 1}};
    mock_provider other;
    resolver r = {&other, 0};
    hook_log l = {.model = "other/cheap", .usage_factor = 1};
    loom_agent_hooks hk = LOOM_AGENT_HOOKS_INIT;
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;

    (void)state;
    mock_init(&other, other_a, 1, 0);
    hk.payload = &l;
    hk.get_model = h_model;
    ro.agent_hooks = &hk;
    ro.resolve_model = resolve;
    ro.resolve_model_payload = &r;
    run_with(&h, a, 1, &ro);
    assert_int_equal(h.rc, 0);
    assert_int_equal(h.mock.next, 1);
    assert_int_equal(other.next, 1);
    assert_string_equal(other.seen[0].model, "cheap-up");
    assert_string_equal(loom_run_text(h.run), "from the other");
    assert_string_equal(completed_str(&h, "model"), "other/cheap");
    harness_free(&h);
    mock_clear(&other);

    l.model = "nowhere/x";
    run_with(&h, a, 1, &ro);
    assert_int_equal(h.rc, LOOM_ENOTFOUND);
    assert_non_null(nth_event(&h, "run.failed", 0));
    harness_free(&h);
}

/* process_tool_calls non-zero: the calls are not run, the run ends with
 * the call's text; on_tools_selected is not called. */
static void test_process_tool_calls(void **state)
{
    hook_log l = {.process_stop = 1, .usage_factor = 1};
    loom_agent_hooks hk = all_hooks(&l);
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;

    (void)state;
    ro.agent_hooks = &hk;
    run_with(&h, echo_then_text, 2, &ro);
    assert_int_equal(h.rc, 0);
    assert_int_equal(h.mock.next, 1);
    assert_null(nth_event(&h, "tool.started", 0));
    assert_string_equal(loom_run_text(h.run), "looking");
    assert_string_equal(loom_run_finish_reason(h.run), "stop");
    assert_int_equal(l.selected, 0);
    harness_free(&h);
}

/* ---- loom's defaults: the YAML keys -------------------------------------- */

static const char *const no_names[1] = {NULL};

/* retry_without_tool_calls and model_after_retries through the options:
 * two retries with the prompt, the cheaper model from the second on. */
static void test_retry_and_model_after(void **state)
{
    static const mock_answer a[] = {
        {.text = "lazy"},
        {.text = "lazy again"},
        {.calls = {{"c1", "echo", "{\"text\":\"x\"}"}}, .ncalls = 1},
        {.text = "no more retries"},
        {.text = "unused"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;

    (void)state;
    ro.retry.max = 2;
    ro.retry.prompt = "Research first.";
    ro.retry.model_after = 2;
    ro.retry.model = "small";
    run_with(&h, a, 5, &ro);
    assert_int_equal(h.rc, 0);
    assert_int_equal(h.mock.next, 4);
    assert_string_equal(h.mock.seen[1].last_content, "Research first.");
    assert_string_equal(h.mock.seen[2].last_content, "Research first.");
    assert_string_equal(h.mock.seen[0].model, "m");
    assert_string_equal(h.mock.seen[1].model, "m");
    assert_string_equal(h.mock.seen[2].model, "small");
    assert_string_equal(h.mock.seen[3].model, "small");
    /* The retries are spent: the fourth answer ends the run. */
    assert_string_equal(loom_run_text(h.run), "no more retries");
    assert_int_equal(loom_run_iterations(h.run), 4);
    harness_free(&h);

    /* The built-in note; no retry without tools. */
    ro.retry.prompt = NULL;
    ro.retry.model = NULL;
    run_with(&h, a, 5, &ro);
    assert_non_null(strstr(h.mock.seen[1].last_content, "call the tools"));
    harness_free(&h);
    /* An agent that offers no tool never retries. */
    ro.tool_names = no_names;
    ro.tool_names_len = 0;
    run_with(&h, a, 5, &ro);
    assert_int_equal(h.mock.next, 1);
    assert_string_equal(loom_run_text(h.run), "lazy");
    harness_free(&h);
}

/* A hook of the agent's replaces the default: no retry though max is
 * set. */
static void test_hook_replaces_default(void **state)
{
    static const mock_answer a[] = {{.text = "once"}};
    hook_log l = {.retry_max = 0};
    loom_agent_hooks hk = LOOM_AGENT_HOOKS_INIT;
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;

    (void)state;
    hk.payload = &l;
    hk.on_no_tool_calls = h_no_calls;
    ro.agent_hooks = &hk;
    ro.retry.max = 3;
    run_with(&h, a, 1, &ro);
    assert_int_equal(h.rc, 0);
    assert_int_equal(h.mock.next, 1);
    assert_int_equal(l.nreasons, 1);
    harness_free(&h);
}

/* non_iterative_tools: turns of listed tools cost no iteration (the last
 * call still comes after max_iterations counted ones); an empty list
 * makes think turns count. */
static void test_non_iterative_tools(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "echo", "{\"text\":\"1\"}"}}, .ncalls = 1},
        {.calls = {{"c2", "echo", "{\"text\":\"2\"}"}}, .ncalls = 1},
        {.calls = {{"c3", "fail", "{}"}}, .ncalls = 1},
        {.text = "done"}};
    static const char *const free_tools[] = {"echo"};
    static const mock_answer t[] = {
        {.calls = {{"t1", "think", "{\"thought\":\"hm\"}"}}, .ncalls = 1},
        {.text = "done"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;

    (void)state;
    ro.max_iterations = 2;
    ro.non_iterative_tools = free_tools;
    ro.non_iterative_tools_len = 1;
    run_with(&h, a, 4, &ro);
    assert_int_equal(h.rc, 0);
    assert_int_equal(loom_run_iterations(h.run), 4);
    assert_int_equal(h.mock.seen[2].choice, LOOM_TOOL_CHOICE_AUTO);
    assert_int_equal(h.mock.seen[3].choice, LOOM_TOOL_CHOICE_NONE);
    harness_free(&h);

    /* The cap: one free turn, then echo turns count. */
    ro.max_think_turns = 1;
    run_with(&h, a, 4, &ro);
    assert_int_equal(loom_run_iterations(h.run), 3);
    assert_int_equal(h.mock.seen[2].choice, LOOM_TOOL_CHOICE_NONE);
    harness_free(&h);

    /* An empty list: think costs an iteration (the second call is the
     * last); no list: it is free. */
    ro = (loom_run_options)LOOM_RUN_OPTIONS_INIT;
    ro.think = 1;
    ro.max_iterations = 2;
    ro.non_iterative_tools = no_names;
    ro.non_iterative_tools_len = 0;
    run_with(&h, t, 2, &ro);
    assert_int_equal(h.mock.seen[1].choice, LOOM_TOOL_CHOICE_NONE);
    harness_free(&h);
    ro.non_iterative_tools = NULL;
    run_with(&h, t, 2, &ro);
    assert_int_equal(h.mock.seen[1].choice, LOOM_TOOL_CHOICE_AUTO);
    harness_free(&h);
}

/* ---- small loop rules ---------------------------------------------------- */

/* A reasoning model: an empty reasoning.delta right after run.started;
 * none otherwise. */
static void test_reasoning_opens(void **state)
{
    static const mock_answer a[] = {{.text = "hi"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;
    json_t *e;

    (void)state;
    run_with(&h, a, 1, NULL);
    assert_null(nth_event(&h, "reasoning.delta", 0));
    harness_free(&h);
    ro.reasoning = 1;
    run_with(&h, a, 1, &ro);
    e = json_array_get(h.events, 1);
    assert_string_equal(json_string_value(json_object_get(e, "type")),
                        "reasoning.delta");
    assert_string_equal(json_string_value(json_object_get(e, "delta")), "");
    harness_free(&h);
    ro.reasoning = 0;
    ro.reasoning_effort = "low";
    run_with(&h, a, 1, &ro);
    assert_non_null(nth_event(&h, "reasoning.delta", 0));
    harness_free(&h);
}

/* A tool that failed and is not called in the next call (one that could
 * call tools) is counted; one called again is not. */
static void test_abandoned_after_error(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "fail", "{}"}, {"c2", "echo", "{\"text\":\"1\"}"}},
         .ncalls = 2},
        {.calls = {{"c3", "fail", "{}"}}, .ncalls = 1},
        {.calls = {{"c4", "echo", "{\"text\":\"2\"}"}}, .ncalls = 1},
        {.text = "done"}};
    static const mock_answer last[] = {
        {.calls = {{"c1", "fail", "{}"}}, .ncalls = 1}, {.text = "done"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    const json_t *n;
    harness h;

    (void)state;
    run_with(&h, a, 4, NULL);
    assert_int_equal(h.rc, 0);
    n = loom_run_tools_abandoned_after_error(h.run);
    assert_non_null(n);
    assert_int_equal(json_object_size(n), 1);
    assert_int_equal(json_integer_value(json_object_get(n, "fail")), 1);
    harness_free(&h);

    /* The next call could not call tools (the last): not counted. */
    ro.max_iterations = 2;
    run_with(&h, last, 2, &ro);
    assert_null(loom_run_tools_abandoned_after_error(h.run));
    harness_free(&h);
}

/* ---- config and session -------------------------------------------------- */

/* The YAML keys, their defaults, their checks and their mapping. */
static void test_yaml_keys(void **state)
{
    loom_config *cfg;
    const loom_agent_config *a, *b;
    loom__run_context rc;
    loom_run_options o = LOOM_RUN_OPTIONS_INIT;

    (void)state;
    if (loom_config_load_string(
            &cfg,
            "providers: {p: {base_url: 'http://127.0.0.1:9', api_key: k}}\n"
            "agents:\n"
            "  a: {model: p/m,\n"
            "      retry_without_tool_calls: {max: 3, prompt: Go on.},\n"
            "      model_after_retries: {retries: 2, model: p/small},\n"
            "      non_iterative_tools: [think, todo_write]}\n"
            "  b: {model: p/m, retry_without_tool_calls: {},\n"
            "      model_after_retries: {model: p/small},\n"
            "      non_iterative_tools: []}\n",
            "t.yaml") != 0)
        fail_msg("config: %s", loom_error_last());
    a = loom_config_agent(cfg, "a");
    b = loom_config_agent(cfg, "b");
    memset(&rc, 0, sizeof(rc));
    assert_int_equal(loom__run_agent_setup(&rc, &o, cfg, a, NULL), 0);
    assert_int_equal(o.retry.max, 3);
    assert_string_equal(o.retry.prompt, "Go on.");
    assert_int_equal(o.retry.model_after, 2);
    assert_string_equal(o.retry.model, "p/small");
    assert_int_equal(o.non_iterative_tools_len, 2);
    assert_string_equal(o.non_iterative_tools[1], "todo_write");
    loom__run_context_free(&rc);
    o = (loom_run_options)LOOM_RUN_OPTIONS_INIT;
    assert_int_equal(loom__run_agent_setup(&rc, &o, cfg, b, NULL), 0);
    assert_int_equal(o.retry.max, 1);
    assert_null(o.retry.prompt);
    assert_int_equal(o.retry.model_after, 1);
    assert_non_null(o.non_iterative_tools);
    assert_int_equal(o.non_iterative_tools_len, 0);
    loom__run_context_free(&rc);
    o = (loom_run_options)LOOM_RUN_OPTIONS_INIT;
    assert_int_equal(loom__run_agent_setup(&rc, &o, cfg, NULL, NULL), 0);
    assert_int_equal(o.retry.max, 0);
    assert_null(o.non_iterative_tools);
    loom_config_free(cfg);

    /* The model must resolve; max is 1 or more. */
    assert_int_not_equal(
        loom_config_load_string(
            &cfg,
            "providers: {p: {base_url: 'http://127.0.0.1:9', api_key: k}}\n"
            "agents:\n"
            "  a: {model: p/m, model_after_retries: {model: q/x}}\n",
            "t.yaml"),
        0);
    assert_non_null(
        strstr(loom_error_last(), "agents.a.model_after_retries.model"));
    assert_int_not_equal(
        loom_config_load_string(
            &cfg,
            "providers: {p: {base_url: 'http://127.0.0.1:9', api_key: k}}\n"
            "agents:\n"
            "  a: {model: p/m, retry_without_tool_calls: {max: 0}}\n",
            "t.yaml"),
        0);
    assert_non_null(
        strstr(loom_error_last(), "agents.a.retry_without_tool_calls.max"));
}

static const char session_yaml[] =
    "providers:\n"
    "  mock: {kind: openai, base_url: 'http://127.0.0.1:9/v1'}\n"
    "agents:\n"
    "  researcher:\n"
    "    model: mock/big\n"
    "    tools: [get_time]\n"
    "    max_iterations: 5\n"
    "    retry_without_tool_calls: {max: 1, prompt: Search first.}\n"
    "    model_after_retries: {retries: 1, model: mock/small}\n";

/* A session turn: the agent's YAML keys reach the run and the session
 * resolves the cheaper model; a turn's max_iterations wins over the
 * agent's. */
static void test_session_turn(void **state)
{
    static const mock_answer a[] = {{.text = "lazy"}, {.text = "ok"}};
    static const mock_answer c[] = {
        {.text = "last", .calls = {{"c1", "get_time", "{}"}}, .ncalls = 1}};
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    mock_provider m;
    loom_config *cfg;
    loom_session *s;
    loom_turn *t;

    (void)state;
    mock_init(&m, a, 2, 0);
    assert_int_equal(loom_config_load_string(&cfg, session_yaml, "t.yaml"), 0);
    so.config = cfg;
    so.provider = &m.base;
    so.model = "big-1";
    assert_int_equal(loom_session_new(&s, &so), 0);
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "find"), 0);
    to.input = &in;
    to.agent = "researcher";
    assert_int_equal(loom_turn_new(&t, s, &to), 0);
    assert_int_equal(loom_turn_execute(t), 0);
    assert_int_equal(m.next, 2);
    assert_string_equal(m.seen[1].last_content, "Search first.");
    assert_string_equal(m.seen[1].model, "mock/small");
    assert_string_equal(loom_run_text(loom_turn_run(t)), "ok");
    loom_turn_free(t);
    mock_clear(&m);

    /* max_iterations 1 for this turn: the first call is the last. */
    mock_init(&m, c, 1, 0);
    to.max_iterations = 1;
    assert_int_equal(loom_turn_new(&t, s, &to), 0);
    assert_int_equal(loom_turn_execute(t), 0);
    assert_int_equal(m.next, 1);
    assert_int_equal(m.seen[0].choice, LOOM_TOOL_CHOICE_NONE);
    assert_string_equal(loom_run_text(loom_turn_run(t)), "last");
    loom_turn_free(t);
    mock_clear(&m);
    loom_messages_free(&in);
    loom_session_free(s);
    loom_config_free(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_should_continue),
        cmocka_unit_test(test_no_calls_generated),
        cmocka_unit_test(test_limit_reached),
        cmocka_unit_test(test_should_send_tools),
        cmocka_unit_test(test_send_tools_declared_after_calls),
        cmocka_unit_test(test_get_model_and_usage),
        cmocka_unit_test(test_resolve_model),
        cmocka_unit_test(test_process_tool_calls),
        cmocka_unit_test(test_retry_and_model_after),
        cmocka_unit_test(test_hook_replaces_default),
        cmocka_unit_test(test_non_iterative_tools),
        cmocka_unit_test(test_reasoning_opens),
        cmocka_unit_test(test_abandoned_after_error),
        cmocka_unit_test(test_yaml_keys),
        cmocka_unit_test(test_session_turn),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
