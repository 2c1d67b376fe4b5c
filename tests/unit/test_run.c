/*
 * Unit tests of the run loop with an in-process mock provider: each test
 * scripts the model's answers, runs the loop and asserts on the events,
 * the final text, usage and what the loop sent to the model. The same
 * rules are tested end to end against the fake upstream in
 * tests/integration/test_loop.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "loom/recorder.h"
#include "loom/run.h"
#include "mock_provider.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- mock provider ---- */

/* The run tests stream call deltas and see provider_state come back. */
#define RUN_MOCK (MOCK_STREAM_CALLS | MOCK_STATE)

/* ---- test tools ---- */

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
    /* A long error: the loop must cut it. */
    for (int i = 0; i < 1000; i++)
        loom_buf_puts(out, "boom ");
    return LOOM_ERROR;
}

static int silent_fail_exec(const json_t *args, const loom_tool_ctx *ctx,
                            loom_buf *out, void *payload)
{
    (void)args;
    (void)ctx;
    (void)out;
    (void)payload;
    return LOOM_ERROR;
}

/*
 * "step" finishes in a chosen order: the call with {"order": k} waits until
 * the sink has seen k tool completions. It can only succeed when the calls
 * run at the same time, so it proves parallelism, and that completions are
 * reported as they happen, without timing assertions.
 */
static pthread_mutex_t step_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t step_cv = PTHREAD_COND_INITIALIZER;
static int steps_done;
static int step_timeout_s = 10;

static int step_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    int order = (int)json_integer_value(json_object_get(args, "order"));
    struct timespec deadline;
    int ok = 1;
    (void)ctx;
    (void)payload;

    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += step_timeout_s;
    pthread_mutex_lock(&step_mu);
    while (steps_done != order && ok)
        ok = pthread_cond_timedwait(&step_cv, &step_mu, &deadline) == 0;
    pthread_mutex_unlock(&step_mu);
    if (!ok) {
        loom_buf_printf(out, "step %d waited in vain", order);
        return LOOM_ERROR;
    }
    return loom_buf_printf(out, "step %d", order);
}

static int big_exec(const json_t *args, const loom_tool_ctx *ctx,
                    loom_buf *out, void *payload)
{
    (void)args;
    (void)ctx;
    (void)payload;
    for (;;) {
        int rc = loom_buf_puts(out, "0123456789");
        if (rc)
            return rc;
    }
}

static loom_tool_registry *make_tools(void)
{
    loom_tool_registry *reg;
    json_t *echo_schema = json_pack(
        "{s:s,s:{s:{s:s}},s:[s]}", "type", "object", "properties", "text",
        "type", "string", "required", "text");
    json_t *step_schema = json_pack("{s:s,s:{s:{s:s}}}", "type", "object",
                                    "properties", "order", "type",
                                    "integer");
    loom_tool t;

    assert_int_equal(loom_tool_registry_new(&reg), 0);
    memset(&t, 0, sizeof(t));
    t.name = "echo";
    t.description = "echoes text";
    t.parameters = echo_schema;
    t.execute = echo_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "fail";
    t.parameters = NULL;
    t.execute = fail_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "silent";
    t.execute = silent_fail_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "step";
    t.parameters = step_schema;
    t.execute = step_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "big";
    t.parameters = NULL;
    t.execute = big_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    json_decref(echo_schema);
    json_decref(step_schema);
    return reg;
}

/* ---- event recorder ---- */

typedef struct {
    json_t *events; /* array of event JSON */
} recorder;

static int record(const loom_event *ev, void *payload)
{
    recorder *r = payload;
    json_array_append_new(r->events, loom_event_to_json(ev));
    if (ev->type == LOOM_EV_TOOL_COMPLETED || ev->type == LOOM_EV_TOOL_FAILED) {
        pthread_mutex_lock(&step_mu);
        steps_done++;
        pthread_cond_broadcast(&step_cv);
        pthread_mutex_unlock(&step_mu);
    }
    return 0;
}

/* Runs the loop over one user message; returns execute()'s code. */
typedef struct {
    mock_provider mock;
    loom_tool_registry *reg;
    recorder rec;
    loom_run *run;
    int rc;
} harness;

static void run_with(harness *h, const mock_answer *answers, int n,
                     loom_run_options *ro_in)
{
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};

    if (ro_in)
        ro = *ro_in;
    mock_init(&h->mock, answers, n, RUN_MOCK);
    h->reg = make_tools();
    h->rec.events = json_array();
    ro.provider = &h->mock.base;
    ro.model = "mock/m";
    ro.upstream_model = "m";
    ro.tools = h->reg;
    ro.sink.emit = record;
    ro.sink.payload = &h->rec;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "hi"), 0);
    assert_int_equal(loom_run_new(&h->run, &ro, &hist), 0);
    loom_messages_free(&hist);
    h->rc = loom_run_execute(h->run);
}

static void harness_free(harness *h)
{
    loom_run_free(h->run);
    loom_tool_registry_free(h->reg);
    json_decref(h->rec.events);
    mock_clear(&h->mock);
}

static int count_type(const harness *h, const char *type)
{
    size_t i;
    json_t *e;
    int n = 0;

    json_array_foreach(h->rec.events, i, e)
    {
        n += strcmp(json_string_value(json_object_get(e, "type")), type) == 0;
    }
    return n;
}

static json_t *nth_type(const harness *h, const char *type, int nth)
{
    size_t i;
    json_t *e;

    json_array_foreach(h->rec.events, i, e)
    {
        if (!strcmp(json_string_value(json_object_get(e, "type")), type) &&
            nth-- == 0)
            return e;
    }
    return NULL;
}

static const char *tool_result(const harness *h, int i)
{
    const loom_messages *m = loom_run_messages(h->run);
    int k = 0;
    for (size_t j = 0; j < m->len; j++)
        if (m->items[j].role == LOOM_ROLE_TOOL && k++ == i)
            return m->items[j].content;
    return NULL;
}

/* ---- tests ---- */

static void test_plain_answer(void **state)
{
    static const mock_answer a[] = {{.text = "Hello!", .prompt = 5,
                                     .completion = 2}};
    harness h;
    (void)state;

    run_with(&h, a, 1, NULL);
    assert_int_equal(h.rc, 0);
    assert_int_equal(loom_run_status_get(h.run), LOOM_RUN_COMPLETED);
    assert_string_equal(loom_run_text(h.run), "Hello!");
    assert_int_equal(loom_run_usage(h.run)->total_tokens, 7);
    assert_int_equal(count_type(&h, "run.started"), 1);
    assert_int_equal(count_type(&h, "message.delta"), 1);
    assert_int_equal(count_type(&h, "run.completed"), 1);
    /* seq is monotonic from 1 and run.completed is last. */
    for (size_t i = 0; i < json_array_size(h.rec.events); i++)
        assert_int_equal(json_integer_value(json_object_get(
                             json_array_get(h.rec.events, i), "seq")),
                         (json_int_t)i + 1);
    assert_string_equal(
        json_string_value(json_object_get(
            json_array_get(h.rec.events, json_array_size(h.rec.events) - 1),
            "type")),
        "run.completed");
    assert_int_equal(h.mock.seen[0].tools_len, 5);
    harness_free(&h);
}

static void test_tool_then_answer(void **state)
{
    static const mock_answer a[] = {
        {.text = "Let me check.",
         .calls = {{"c1", "echo", "{\"text\":\"x\"}"}},
         .ncalls = 1, .prompt = 10, .completion = 3},
        {.text = "Done.", .prompt = 20, .completion = 4}};
    harness h;
    (void)state;

    run_with(&h, a, 2, NULL);
    assert_int_equal(h.rc, 0);
    assert_string_equal(loom_run_text(h.run), "Done.");
    assert_string_equal(tool_result(&h, 0), "echo:x");
    /* Each assistant turn keeps what its provider must get back. */
    assert_string_equal(loom_run_messages(h.run)->items[0].provider_state,
                        "{\"mock\":{\"turn\":1}}");
    assert_string_equal(loom_run_messages(h.run)->items[2].provider_state,
                        "{\"mock\":{\"turn\":2}}");
    /* The second call saw user, assistant (with the call), tool. */
    assert_string_equal(h.mock.seen[1].all_roles, "uat");
    assert_int_equal(h.mock.seen[1].last_role, LOOM_ROLE_TOOL);
    assert_int_equal(loom_run_usage(h.run)->prompt_tokens, 30);
    assert_int_equal(loom_run_usage(h.run)->completion_tokens, 7);
    assert_int_equal(count_type(&h, "usage"), 2);
    assert_int_equal(count_type(&h, "tool_calls"), 1);
    assert_int_equal(count_type(&h, "tool.started"), 1);
    assert_int_equal(count_type(&h, "tool.completed"), 1);
    /* Content index: turn 0 for the tool turn, 1 for the answer. */
    assert_int_equal(json_integer_value(json_object_get(
                         nth_type(&h, "tool.completed", 0), "index")),
                     0);
    assert_int_equal(json_integer_value(json_object_get(
                         nth_type(&h, "message.delta", 1), "index")),
                     1);
    assert_int_equal(loom_run_iterations(h.run), 2);
    harness_free(&h);
}

static void test_tool_failures_become_results(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "nope", "{}"},
                   {"c2", "echo", "{\"text\": "},
                   {"c3", "echo", "{\"text\": 5}"},
                   {"c4", "fail", ""}},
         .ncalls = 4},
        {.calls = {{"c5", "silent", "{}"}}, .ncalls = 1},
        {.text = "recovered"}};
    harness h;
    (void)state;

    run_with(&h, a, 3, NULL);
    assert_int_equal(h.rc, 0);
    assert_string_equal(loom_run_text(h.run), "recovered");
    assert_string_equal(tool_result(&h, 0),
                        "Error: Unknown tool 'nope'. Available tools: echo, "
                        "fail, silent, step, big.");
    assert_non_null(strstr(tool_result(&h, 1), "not valid JSON"));
    assert_non_null(strstr(tool_result(&h, 1), "Received: {\"text\": "));
    assert_non_null(strstr(tool_result(&h, 2), "Invalid arguments for tool "
                                                "'echo'"));
    assert_non_null(strstr(tool_result(&h, 2), "`text`"));
    /* A long error is cut to the limit (2 KiB default) with a marker. */
    assert_true(strncmp(tool_result(&h, 3), "Error: boom boom", 16) == 0);
    assert_non_null(strstr(tool_result(&h, 3), "[error truncated: 2048 of "
                                                "5000 bytes shown]"));
    assert_true(strlen(tool_result(&h, 3)) < 2200);
    /* A tool failing without a message still gets a readable result. */
    assert_non_null(strstr(tool_result(&h, 4), "failed without a message"));
    assert_int_equal(count_type(&h, "tool.failed"), 5);
    assert_string_equal(json_string_value(json_object_get(
                            nth_type(&h, "tool.failed", 0), "stage")),
                        "lookup");
    harness_free(&h);
}

static void test_parallel_tools_order(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "step", "{\"order\":2}"},
                   {"c2", "step", "{\"order\":0}"},
                   {"c3", "step", "{\"order\":1}"}},
         .ncalls = 3},
        {.text = "ok"}};
    harness h;
    const loom_messages *m;
    (void)state;

    steps_done = 0;
    run_with(&h, a, 2, NULL);
    assert_int_equal(h.rc, 0);
    /* Results go back in call order whatever the completion order. */
    m = loom_run_messages(h.run);
    assert_string_equal(m->items[1].tool_call_id, "c1");
    assert_string_equal(m->items[1].content, "step 2");
    assert_string_equal(m->items[2].tool_call_id, "c2");
    assert_string_equal(m->items[2].content, "step 0");
    assert_string_equal(m->items[3].tool_call_id, "c3");
    assert_string_equal(m->items[3].content, "step 1");
    /* Completion events come as each tool finishes. */
    assert_int_equal(count_type(&h, "tool.started"), 3);
    assert_string_equal(json_string_value(json_object_get(
                            nth_type(&h, "tool.completed", 0), "id")),
                        "c2");
    assert_string_equal(json_string_value(json_object_get(
                            nth_type(&h, "tool.completed", 1), "id")),
                        "c3");
    assert_string_equal(json_string_value(json_object_get(
                            nth_type(&h, "tool.completed", 2), "id")),
                        "c1");
    harness_free(&h);
}

static void test_concurrency_one_is_sequential(void **state)
{
    /* With one at a time, steps that need each other cannot meet: the
     * first waits in vain, proving the limit holds. */
    static const mock_answer a[] = {
        {.calls = {{"c1", "step", "{\"order\":1}"},
                   {"c2", "step", "{\"order\":0}"}},
         .ncalls = 2},
        {.text = "ok"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;
    (void)state;

    steps_done = 0;
    step_timeout_s = 1;
    ro.tool_concurrency = 1;
    run_with(&h, a, 2, &ro);
    step_timeout_s = 10;
    assert_int_equal(h.rc, 0);
    assert_string_equal(json_string_value(json_object_get(
                            nth_type(&h, "tool.failed", 0), "id")),
                        "c1");
    assert_true(json_integer_value(json_object_get(
                    nth_type(&h, "tool.failed", 0), "seq")) <
                json_integer_value(json_object_get(
                    nth_type(&h, "tool.started", 1), "seq")));
    harness_free(&h);
}

static void test_limit_reached_answers(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "echo", "{\"text\":\"1\"}"}}, .ncalls = 1},
        {.calls = {{"c2", "echo", "{\"text\":\"2\"}"}}, .ncalls = 1},
        {.text = "final from what I have"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;
    (void)state;

    ro.max_iterations = 3;
    run_with(&h, a, 3, &ro);
    assert_int_equal(h.rc, 0);
    assert_string_equal(loom_run_text(h.run), "final from what I have");
    assert_int_equal(h.mock.seen[0].tools_len, 5);
    assert_int_equal(h.mock.seen[1].tools_len, 5);
    /* The last permitted call forbids tools and closes the run. */
    assert_int_equal(h.mock.seen[2].tools_len, 5);
    assert_int_equal(h.mock.seen[2].choice, LOOM_TOOL_CHOICE_NONE);
    assert_int_equal(h.mock.seen[2].last_role, LOOM_ROLE_SYSTEM);
    assert_non_null(strstr(h.mock.seen[2].last_content,
                           "limit of 3 model calls"));
    assert_int_equal(loom_run_iterations(h.run), 3);
    harness_free(&h);
}

/* An agent's limit_prompt replaces the built-in note, as it is. */
static void test_limit_prompt_custom(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "echo", "{\"text\":\"1\"}"}}, .ncalls = 1},
        {.text = "done"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;
    (void)state;

    ro.max_iterations = 2;
    ro.limit_prompt = "Stop at 100% and answer.";
    run_with(&h, a, 2, &ro);
    assert_int_equal(h.rc, 0);
    assert_int_equal(h.mock.seen[1].choice, LOOM_TOOL_CHOICE_NONE);
    assert_int_equal(h.mock.seen[1].last_role, LOOM_ROLE_SYSTEM);
    assert_string_equal(h.mock.seen[1].last_content,
                        "Stop at 100% and answer.");
    assert_null(strstr(h.mock.seen[0].last_content, "100%"));
    harness_free(&h);
}

/* A turn of more than many_results_after results gets one note for the
 * next call; a turn of fewer gets none; the note stays, unstacked. */
static void test_many_results_note(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "echo", "{\"text\":\"1\"}"},
                   {"c2", "echo", "{\"text\":\"2\"}"},
                   {"c3", "echo", "{\"text\":\"3\"}"}},
         .ncalls = 3},
        {.calls = {{"c4", "echo", "{\"text\":\"4\"}"},
                   {"c5", "echo", "{\"text\":\"5\"}"}},
         .ncalls = 2},
        {.text = "done"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;
    (void)state;

    ro.many_results_after = 2;
    ro.many_results_prompt = "Be brief.";
    run_with(&h, a, 3, &ro);
    assert_int_equal(h.rc, 0);
    assert_int_equal(h.mock.seen[1].last_role, LOOM_ROLE_SYSTEM);
    assert_string_equal(h.mock.seen[1].last_content, "Be brief.");
    assert_int_equal(h.mock.seen[1].nsystem, 1);
    /* Two results are not more than two: no second note. */
    assert_int_equal(h.mock.seen[2].last_role, LOOM_ROLE_TOOL);
    assert_int_equal(h.mock.seen[2].nsystem, 1);
    /* The note is loom's own: not among the run's messages. */
    for (size_t i = 0; i < loom_run_messages(h.run)->len; i++)
        assert_int_not_equal(loom_run_messages(h.run)->items[i].role,
                             LOOM_ROLE_SYSTEM);
    harness_free(&h);

    /* The built-in note when no prompt is given; 0 is off. */
    ro.many_results_prompt = NULL;
    run_with(&h, a, 3, &ro);
    assert_non_null(strstr(h.mock.seen[1].last_content, "short"));
    harness_free(&h);
    ro.many_results_after = 0;
    run_with(&h, a, 3, &ro);
    assert_int_equal(h.mock.seen[1].last_role, LOOM_ROLE_TOOL);
    assert_int_equal(h.mock.seen[2].nsystem, 0);
    harness_free(&h);
}

static void test_limit_model_ignores_and_calls_tools(void **state)
{
    /* Even if the model returns tool calls on the last call, the run ends
     * with its text and runs no tool. */
    static const mock_answer a[] = {
        {.calls = {{"c1", "echo", "{\"text\":\"1\"}"}}, .ncalls = 1},
        {.text = "best effort", .calls = {{"c2", "echo", "{\"text\":\"2\"}"}},
         .ncalls = 1}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;
    (void)state;

    ro.max_iterations = 2;
    run_with(&h, a, 2, &ro);
    assert_int_equal(h.rc, 0);
    assert_string_equal(loom_run_text(h.run), "best effort");
    assert_int_equal(count_type(&h, "tool.started"), 1);
    harness_free(&h);
}

static void test_forced_choice_once(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "echo", "{\"text\":\"1\"}"}}, .ncalls = 1},
        {.text = "ok"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;
    (void)state;

    ro.tool_choice.kind = LOOM_TOOL_CHOICE_FUNCTION;
    ro.tool_choice.function = "echo";
    run_with(&h, a, 2, &ro);
    assert_int_equal(h.rc, 0);
    assert_int_equal(h.mock.seen[0].choice, LOOM_TOOL_CHOICE_FUNCTION);
    assert_int_equal(h.mock.seen[1].choice, LOOM_TOOL_CHOICE_AUTO);
    harness_free(&h);
}

static void test_tool_subset_and_unknown_name(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "fail", "{}"}}, .ncalls = 1}, {.text = "ok"}};
    static const char *const names[] = {"echo"};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    mock_provider mock;
    loom_run *run = NULL;
    harness h;
    (void)state;

    ro.tool_names = names;
    ro.tool_names_len = 1;
    run_with(&h, a, 2, &ro);
    assert_int_equal(h.mock.seen[0].tools_len, 1);
    /* A registered tool the agent does not offer is unknown to the model. */
    assert_string_equal(tool_result(&h, 0),
                        "Error: Unknown tool 'fail'. Available tools: echo.");
    harness_free(&h);

    /* An agent naming a tool that does not exist is refused up front. */
    static const char *const bad[] = {"nosuch"};
    mock_init(&mock, a, 2, RUN_MOCK);
    ro = (loom_run_options)LOOM_RUN_OPTIONS_INIT;
    ro.provider = &mock.base;
    ro.upstream_model = "m";
    ro.tool_names = bad;
    ro.tool_names_len = 1;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "hi"), 0);
    assert_int_equal(loom_run_new(&run, &ro, &hist), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "unknown tool 'nosuch'"));
    assert_null(run);
    loom_messages_free(&hist);
}

static void test_upstream_failure(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "echo", "{\"text\":\"1\"}"}}, .ncalls = 1,
         .prompt = 3, .completion = 1},
        {.fail_rc = LOOM_EUPSTREAM}};
    harness h;
    json_t *failed;
    (void)state;

    run_with(&h, a, 2, NULL);
    assert_int_equal(h.rc, LOOM_EUPSTREAM);
    assert_int_equal(loom_run_status_get(h.run), LOOM_RUN_FAILED);
    failed = nth_type(&h, "run.failed", 0);
    assert_non_null(failed);
    assert_string_equal(json_string_value(json_object_get(failed, "status")),
                        "failed");
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(failed, "error"), "http_status")),
                     500);
    /* What happened before the failure is kept. */
    assert_string_equal(tool_result(&h, 0), "echo:1");
    assert_int_equal(loom_run_usage(h.run)->total_tokens, 4);
    harness_free(&h);
}

static void *cancel_later(void *arg)
{
    usleep(50 * 1000);
    loom_run_cancel(arg);
    return NULL;
}

static void test_cancel(void **state)
{
    static const mock_answer a[] = {{.wait_cancel = 1}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    mock_provider mock;
    loom_run *run;
    pthread_t t;
    (void)state;

    mock_init(&mock, a, 1, RUN_MOCK);
    ro.provider = &mock.base;
    ro.upstream_model = "m";
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "hi"), 0);
    assert_int_equal(loom_run_new(&run, &ro, &hist), 0);
    pthread_create(&t, NULL, cancel_later, run);
    assert_int_equal(loom_run_execute(run), LOOM_ECANCELED);
    pthread_join(t, NULL);
    assert_int_equal(loom_run_status_get(run), LOOM_RUN_CANCELLED);
    loom_run_free(run);
    loom_messages_free(&hist);
    mock_clear(&mock);
}

static int cancel_on_tool(const loom_event *ev, void *payload)
{
    (void)payload;
    /* A sink that says no (a client that went away) cancels the run. */
    return ev->type == LOOM_EV_TOOL_COMPLETED;
}

static void test_sink_cancels(void **state)
{
    static const mock_answer a[] = {
        {.text = "working", .calls = {{"c1", "echo", "{\"text\":\"1\"}"}},
         .ncalls = 1},
        {.text = "never"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    mock_provider mock;
    loom_tool_registry *reg = make_tools();
    loom_run *run;
    const loom_messages *m;
    (void)state;

    mock_init(&mock, a, 2, RUN_MOCK);
    ro.provider = &mock.base;
    ro.upstream_model = "m";
    ro.tools = reg;
    ro.sink.emit = cancel_on_tool;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "hi"), 0);
    assert_int_equal(loom_run_new(&run, &ro, &hist), 0);
    assert_int_equal(loom_run_execute(run), LOOM_ECANCELED);
    assert_int_equal(mock.next, 1);
    /* The tool turn is kept, text included, exactly once. */
    m = loom_run_messages(run);
    assert_int_equal(m->len, 2);
    assert_string_equal(m->items[0].content, "working");
    assert_string_equal(m->items[1].content, "echo:1");
    loom_run_free(run);
    loom_tool_registry_free(reg);
    loom_messages_free(&hist);
    mock_clear(&mock);
}

static void test_result_limit(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "big", "{}"}}, .ncalls = 1}, {.text = "ok"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;
    (void)state;

    ro.max_tool_result = 1000;
    run_with(&h, a, 2, &ro);
    assert_int_equal(h.rc, 0);
    assert_non_null(strstr(tool_result(&h, 0),
                           "[output truncated at 1000 bytes]"));
    assert_true(strlen(tool_result(&h, 0)) <= 1000 + 40);
    assert_true(json_is_true(json_object_get(
        nth_type(&h, "tool.completed", 0), "truncated")));
    harness_free(&h);
}

static void test_missing_call_ids_are_filled(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"", "echo", "{\"text\":\"1\"}"}}, .ncalls = 1},
        {.text = "ok"}};
    harness h;
    (void)state;

    run_with(&h, a, 2, NULL);
    assert_int_equal(h.rc, 0);
    assert_string_equal(loom_run_messages(h.run)->items[1].tool_call_id,
                        loom_run_messages(h.run)->items[0].tool_calls[0].id);
    assert_true(strlen(loom_run_messages(h.run)->items[1].tool_call_id) > 0);
    harness_free(&h);
}

static void test_client_tools_end_the_run(void **state)
{
    static const mock_answer a[] = {
        {.text = "Looking.",
         .calls = {{"c1", "echo", "{\"text\":\"srv\"}"},
                   {"c2", "lookup_order", "{\"order\":42}"}},
         .ncalls = 2},
        {.text = "never"}};
    json_t *schema = json_pack("{s:s}", "type", "object");
    loom_tool_def client = {"lookup_order", "Looks up an order.", schema};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    const loom_tool_call *pending;
    size_t npending;
    harness h;
    json_t *done;
    (void)state;

    ro.client_tools = &client;
    ro.client_tools_len = 1;
    run_with(&h, a, 2, &ro);
    assert_int_equal(h.rc, 0);
    /* The client tool was offered beside the server tools. */
    assert_int_equal(h.mock.seen[0].tools_len, 6);
    /* The server tool ran; the client one is handed back; no second call. */
    assert_int_equal(h.mock.next, 1);
    assert_string_equal(tool_result(&h, 0), "echo:srv");
    assert_null(tool_result(&h, 1));
    pending = loom_run_pending_calls(h.run, &npending);
    assert_int_equal(npending, 1);
    assert_string_equal(pending[0].id, "c2");
    assert_string_equal(pending[0].name, "lookup_order");
    assert_string_equal(pending[0].arguments, "{\"order\":42}");
    assert_string_equal(loom_run_finish_reason(h.run), "tool_calls");
    assert_string_equal(loom_run_text(h.run), "Looking.");
    done = nth_type(&h, "run.completed", 0);
    assert_int_equal(
        json_array_size(json_object_get(done, "pending_tool_calls")), 1);
    assert_string_equal(json_string_value(json_object_get(done,
                                                          "finish_reason")),
                        "tool_calls");
    harness_free(&h);

    /* A client tool may not shadow a server tool. */
    {
        loom_tool_def clash = {"echo", "mine", schema};
        loom_messages hist = {0};
        mock_provider mock;
        loom_tool_registry *reg = make_tools();
        loom_run *run = NULL;
        mock_init(&mock, a, 2, RUN_MOCK);
        ro = (loom_run_options)LOOM_RUN_OPTIONS_INIT;
        ro.provider = &mock.base;
        ro.upstream_model = "m";
        ro.tools = reg;
        ro.client_tools = &clash;
        ro.client_tools_len = 1;
        assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "hi"), 0);
        assert_int_equal(loom_run_new(&run, &ro, &hist), LOOM_EINVALID);
        assert_non_null(strstr(loom_error_last(), "both a server tool"));
        loom_messages_free(&hist);
        loom_tool_registry_free(reg);
    }
    json_decref(schema);
}

static void test_recorder(void **state)
{
    static const mock_answer a[] = {
        {.text = "Let me see.",
         .calls = {{"c1", "echo", "{\"text\":\"x\"}"},
                   {"c2", "nope", "{}"}},
         .text_after = " More text after the calls.",
         .ncalls = 2, .prompt = 10, .completion = 4},
        {.text = "Done.", .prompt = 30, .completion = 2}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_recorder *rec;
    recorder inner = {json_array()};
    loom_turn_record turn;
    harness h;
    (void)state;

    /* The recorder forwards every event to the inner sink. */
    assert_int_equal(loom_recorder_new(&rec, (loom_sink){record, &inner}), 0);
    ro.sink = loom_recorder_sink(rec);
    {
        loom_messages hist = {0};
        mock_init(&h.mock, a, 2, RUN_MOCK);
        h.reg = make_tools();
        h.rec.events = json_array();
        ro.provider = &h.mock.base;
        ro.upstream_model = "m";
        ro.model = "mock/m";
        ro.tools = h.reg;
        assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "hi"), 0);
        assert_int_equal(loom_run_new(&h.run, &ro, &hist), 0);
        loom_messages_free(&hist);
        assert_int_equal(loom_run_execute(h.run), 0);
    }
    assert_int_equal(loom_recorder_turn(rec, h.run, &turn), 0);
    assert_int_equal(turn.status, LOOM_TURN_OK);
    assert_string_equal(turn.model, "mock/m");
    assert_string_equal(turn.finish_reason, "stop");
    assert_int_equal(turn.output->len, 4); /* assistant, 2 tools, answer */
    assert_int_equal(turn.calls_len, 2);
    assert_string_equal(turn.calls[0].tool_call_id, "c1");
    /* Where the call appeared in the text, not the end of the text. */
    assert_int_equal(turn.calls[0].text_offset, strlen("Let me see."));
    assert_int_equal(turn.calls[1].text_offset, strlen("Let me see."));
    assert_string_equal(turn.output->items[0].content,
                        "Let me see. More text after the calls.");
    assert_int_equal(turn.tools_len, 2);
    assert_false(turn.tools[0].failed == turn.tools[1].failed);
    assert_int_equal(turn.usage_len, 2);
    assert_int_equal(turn.usage[1].iteration, 2);
    assert_int_equal(turn.usage[1].usage.prompt_tokens, 30);
    assert_true(json_array_size(inner.events) > 6);
    json_decref(inner.events);
    loom_recorder_free(rec);
    harness_free(&h);
}

static void test_history_with_unanswered_calls(void **state)
{
    static const mock_answer a[] = {{.text = "ok"}};
    static const loom_tool_call calls[] = {{"k1", "echo", "{}"},
                                           {"k2", "echo", "{}"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    mock_provider mock;
    loom_run *run;
    (void)state;

    /* A stored cancelled turn: two calls, only the first answered. */
    mock_init(&mock, a, 1, RUN_MOCK);
    ro.provider = &mock.base;
    ro.upstream_model = "m";
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "q1"), 0);
    assert_int_equal(
        loom_messages_add_assistant(&hist, NULL, NULL, calls, 2), 0);
    assert_int_equal(
        loom_messages_add_tool_result(&hist, "k1", "echo", "r1"), 0);
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "q2"), 0);
    assert_int_equal(loom_run_new(&run, &ro, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);
    /* The model saw every call answered, in order, before "q2". */
    assert_string_equal(mock.seen[0].all_roles, "uattu");
    loom_run_free(run);
    loom_messages_free(&hist);
    mock_clear(&mock);
}

static void test_bad_options(void **state)
{
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    mock_provider mock;
    loom_run *run = NULL;
    (void)state;

    mock_init(&mock, NULL, 0, RUN_MOCK);
    assert_int_equal(loom_run_new(&run, &ro, &hist), LOOM_EINVALID);
    ro.provider = &mock.base;
    ro.upstream_model = "m";
    assert_int_equal(loom_run_new(&run, &ro, &hist), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "empty"));
    assert_null(run);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_answer),
        cmocka_unit_test(test_tool_then_answer),
        cmocka_unit_test(test_tool_failures_become_results),
        cmocka_unit_test(test_parallel_tools_order),
        cmocka_unit_test(test_concurrency_one_is_sequential),
        cmocka_unit_test(test_limit_reached_answers),
        cmocka_unit_test(test_limit_prompt_custom),
        cmocka_unit_test(test_many_results_note),
        cmocka_unit_test(test_limit_model_ignores_and_calls_tools),
        cmocka_unit_test(test_forced_choice_once),
        cmocka_unit_test(test_tool_subset_and_unknown_name),
        cmocka_unit_test(test_upstream_failure),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_sink_cancels),
        cmocka_unit_test(test_result_limit),
        cmocka_unit_test(test_missing_call_ids_are_filled),
        cmocka_unit_test(test_client_tools_end_the_run),
        cmocka_unit_test(test_recorder),
        cmocka_unit_test(test_history_with_unanswered_calls),
        cmocka_unit_test(test_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
