/*
 * The tool turn (src/agent/toolturn.h), on its own: the server calls of
 * one assistant message go through lookup, the policies and the caller's
 * hooks, run, and come back in call order with what the model reads.
 * Tested here without a run or a model: duplicate calls are not run
 * again, a tool that keeps failing is blocked and left out of the next
 * request, client calls are left to the client, and every call is
 * reported (events through the emit callback, a record each).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "agent/toolturn.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- tools ------------------------------------------------------------ */

static atomic_int echo_runs;

static int echo_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    (void)ctx;
    (void)payload;
    atomic_fetch_add(&echo_runs, 1);
    return loom_buf_printf(out, "echo:%s",
                           json_string_value(json_object_get(args, "text")));
}

static int broken_exec(const json_t *args, const loom_tool_ctx *ctx,
                       loom_buf *out, void *payload)
{
    (void)args;
    (void)ctx;
    (void)payload;
    return loom_buf_puts(out, "disk on fire") ? LOOM_ENOMEM : LOOM_ERROR;
}

/* ---- fixture ---------------------------------------------------------- */

typedef struct {
    loom_tool_registry *reg;
    loom__plan *plan;
    const loom_tool *offered[4];
    loom_tool_def defs[5];
    loom__toolset set;
    json_t *events; /* event type names, in order */
    loom_cancel cancel;
    loom__toolturn *t;
} fixture;

static void on_event(loom_event_type type, json_t *data, void *payload)
{
    fixture *f = payload;

    json_array_append_new(f->events, json_string(loom_event_type_name(type)));
    json_decref(data);
}

static void add(loom_tool_registry *reg, const char *name,
                loom_tool_execute_fn fn, const char *schema)
{
    loom_tool t = {0};
    json_t *s = schema ? json_loads(schema, 0, NULL) : NULL;

    t.name = name;
    t.description = name;
    t.parameters = s;
    t.execute = fn;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    json_decref(s);
}

/* Offers echo, broken and think as server tools and "ask" as a client
 * tool. */
static int setup(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    loom__toolturn_options o;

    assert_non_null(f);
    assert_int_equal(loom_tool_registry_new(&f->reg), 0);
    add(f->reg, "echo", echo_exec,
        "{\"type\":\"object\",\"properties\":{\"text\":{\"type\":"
        "\"string\"}},\"required\":[\"text\"]}");
    add(f->reg, "broken", broken_exec, NULL);
    assert_int_equal(loom__plan_new(&f->plan), 0);
    f->offered[0] = loom_tool_registry_get(f->reg, "echo");
    f->offered[1] = loom_tool_registry_get(f->reg, "broken");
    f->offered[2] = loom__plan_tool(f->plan, LOOM__LOOP_THINK);
    for (size_t i = 0; i < 3; i++) {
        f->defs[i].name = f->offered[i]->name;
        f->defs[i].description = f->offered[i]->description;
        f->defs[i].parameters = f->offered[i]->parameters;
    }
    f->defs[3].name = "ask";
    f->set.offered = f->offered;
    f->set.nserver = 3;
    f->set.defs = f->defs;
    f->set.ndefs = 4;
    f->set.available = "echo, broken, think, ask";
    f->events = json_array();
    memset(&o, 0, sizeof(o));
    o.tools = &f->set;
    o.plan = f->plan;
    o.registry = f->reg;
    o.cancel = &f->cancel;
    o.max_result = 4096;
    o.max_error = 1024;
    o.concurrency = 4;
    o.emit.fn = on_event;
    o.emit.payload = f;
    assert_int_equal(loom__toolturn_new(&f->t, &o), 0);
    atomic_store(&echo_runs, 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;

    loom__toolturn_free(f->t);
    loom__plan_free(f->plan);
    loom_tool_registry_free(f->reg);
    json_decref(f->events);
    free(f);
    return 0;
}

/* Up to 4 calls: {id, name, arguments} each. */
typedef struct {
    loom_tool_call calls[4];
    loom_message m;
} turn;

static const loom_message *make(turn *tn, const char *const (*c)[3], size_t n)
{
    memset(tn, 0, sizeof(*tn));
    for (size_t i = 0; i < n; i++) {
        tn->calls[i].id = (char *)c[i][0];
        tn->calls[i].name = (char *)c[i][1];
        tn->calls[i].arguments = (char *)c[i][2];
    }
    tn->m.role = LOOM_ROLE_ASSISTANT;
    tn->m.tool_calls = tn->calls;
    tn->m.tool_calls_len = n;
    return &tn->m;
}

/* Runs one turn; *jobs is the caller's, and borrows its calls from tn. */
static size_t run_turn(fixture *f, turn *tn, const char *const (*c)[3],
                       size_t n, int iteration, loom__tool_job **jobs)
{
    size_t nj = 0;

    assert_int_equal(
        loom__toolturn_run(f->t, make(tn, c, n), iteration, jobs, &nj), 0);
    return nj;
}

static size_t count(const json_t *events, const char *type)
{
    size_t i, n = 0;
    json_t *e;

    json_array_foreach(events, i, e)
    {
        n += strcmp(json_string_value(e), type) == 0;
    }
    return n;
}

/* ---- tests ------------------------------------------------------------ */

/* Results come back in call order; client calls are the client's. */
static void test_order_and_client_calls(void **state)
{
    static const char *const c[][3] = {
        {"a", "echo", "{\"text\":\"one\"}"},
        {"b", "ask", "{}"},
        {"c", "echo", "{\"text\":\"two\"}"},
        {"d", "nosuch", "{}"},
    };
    fixture *f = *state;
    turn tn;
    loom__tool_job *jobs;
    size_t n = run_turn(f, &tn, c, 4, 1, &jobs);

    assert_int_equal(n, 3);
    assert_string_equal(jobs[0].call->id, "a");
    assert_string_equal(jobs[0].output, "echo:one");
    assert_string_equal(jobs[1].call->id, "c");
    assert_string_equal(jobs[1].output, "echo:two");
    assert_string_equal(jobs[2].call->id, "d");
    assert_true(jobs[2].failed);
    assert_string_equal(jobs[2].stage, "lookup");
    assert_non_null(strstr(jobs[2].output, "echo, broken, think, ask"));
    assert_int_equal(atomic_load(&echo_runs), 2);
    assert_int_equal(count(f->events, "tool.started"), 2);
    assert_int_equal(count(f->events, "tool.completed"), 2);
    assert_int_equal(count(f->events, "tool.failed"), 1);
    assert_int_equal(count(f->events, "tool.metric"), 3);
    assert_int_equal(json_array_size(loom__toolturn_records(f->t)), 3);
    loom__toolturn_jobs_free(jobs, n);
}

/* A call that repeats one of the same turn, or one that already
 * succeeded (key order and spacing aside), is not run again. */
static void test_duplicates(void **state)
{
    static const char *const t1[][3] = {
        {"a", "echo", "{\"text\":\"x\"}"},
        {"b", "echo", "{ \"text\" : \"x\" }"},
    };
    static const char *const t2[][3] = {
        {"c", "echo", "{\"text\":\"x\"}"},
        {"d", "echo", "{\"text\":\"y\"}"},
    };
    fixture *f = *state;
    turn tn;
    loom__tool_job *jobs;
    size_t n = run_turn(f, &tn, t1, 2, 1, &jobs);

    assert_int_equal(n, 2);
    assert_string_equal(jobs[0].output, "echo:x");
    assert_true(jobs[1].skipped);
    assert_false(jobs[1].failed);
    assert_non_null(strstr(jobs[1].output, "repeats call a of this turn"));
    loom__toolturn_jobs_free(jobs, n);
    n = run_turn(f, &tn, t2, 2, 2, &jobs);
    assert_true(jobs[0].skipped);
    assert_non_null(strstr(jobs[0].output,
                           "already succeeded with exactly these arguments "
                           "earlier in this run (call a)"));
    assert_string_equal(jobs[1].output, "echo:y");
    assert_int_equal(atomic_load(&echo_runs), 2);
    loom__toolturn_jobs_free(jobs, n);
}

/* A tool that fails LOOM_RUN_TOOL_FAILURES_MAX times is blocked: the
 * model is told with the last failure, the next request leaves it out,
 * and a call of it is refused without running. */
static void test_strike_budget(void **state)
{
    static const char *const c[][3] = {{"b", "broken", "{}"}};
    fixture *f = *state;
    turn tn;
    const loom_tool_def *defs;
    const loom_tool_def *first;
    loom__tool_job *jobs;
    size_t n, ndefs;

    assert_int_equal(loom__toolturn_request_tools(f->t, &defs, &ndefs), 0);
    assert_int_equal(ndefs, 4);
    first = defs;
    for (int i = 1; i <= LOOM_RUN_TOOL_FAILURES_MAX; i++) {
        n = run_turn(f, &tn, c, 1, i, &jobs);
        assert_true(jobs[0].failed);
        assert_string_equal(jobs[0].stage, "execution");
        assert_int_equal(strstr(jobs[0].output, "is blocked") != NULL,
                         i == LOOM_RUN_TOOL_FAILURES_MAX);
        loom__toolturn_jobs_free(jobs, n);
    }
    assert_int_equal(loom__toolturn_request_tools(f->t, &defs, &ndefs), 0);
    assert_int_equal(ndefs, 3);
    /* A new array, so the request cache sees the change. */
    assert_ptr_not_equal(defs, first);
    for (size_t i = 0; i < ndefs; i++)
        assert_string_not_equal(defs[i].name, "broken");
    n = run_turn(f, &tn, c, 1, 9, &jobs);
    assert_true(jobs[0].failed);
    assert_string_equal(jobs[0].stage, "blocked");
    assert_false(jobs[0].executed);
    assert_non_null(strstr(jobs[0].output, "failed 3 times in this run"));
    loom__toolturn_jobs_free(jobs, n);
}

/* A loop tool runs on the caller's thread, through the plan. */
static void test_loop_tool(void **state)
{
    static const char *const c[][3] = {
        {"t", "think", "{\"thought\":\"first A\"}"},
    };
    fixture *f = *state;
    turn tn;
    loom__tool_job *jobs;
    size_t n = run_turn(f, &tn, c, 1, 1, &jobs);

    assert_int_equal(n, 1);
    assert_int_equal(jobs[0].loop, LOOM__LOOP_THINK + 1);
    assert_string_equal(jobs[0].output, "Acknowledged, please continue.");
    assert_int_equal(count(f->events, "tool.started"), 1);
    assert_int_equal(count(f->events, "tool.completed"), 1);
    loom__toolturn_jobs_free(jobs, n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_order_and_client_calls, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_duplicates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_strike_budget, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loop_tool, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
