/*
 * The plan and the loop tools (src/agent/plan.h), on their own: what a
 * plan must be to be kept, the stored form, the <plan> section the system
 * message shows and when it changes, and what todo_write and think calls
 * answer and report. No run, no model: the calls are prepared jobs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "agent/plan.h"
#include "loom/common.h"

#include <stdlib.h>
#include <string.h>

/* ---- helpers ---------------------------------------------------------- */

typedef struct {
    json_t *events; /* [{type, data}] */
} sink;

static void record(loom_event_type type, json_t *data, void *payload)
{
    sink *s = payload;

    json_array_append_new(
        s->events, json_pack("{s:s,s:o}", "type", loom_event_type_name(type),
                             "data", data ? data : json_object()));
}

static json_t *parse(const char *text)
{
    json_t *v = json_loads(text, 0, NULL);

    assert_non_null(v);
    return v;
}

/* Runs a loop tool call `name` with arguments `args` (JSON text). */
static void call(loom__plan *p, loom__tool_job *job, loom_tool_call *c,
                 const char *name, const char *args, sink *s)
{
    loom__loop_call lc = {4, 2048, {s ? record : NULL, s}};
    int k = loom__plan_tool_index(p, name);

    assert_true(k >= 0);
    memset(job, 0, sizeof(*job));
    c->id = (char *)"c1";
    c->name = (char *)name;
    c->arguments = (char *)args;
    job->call = c;
    job->tool = loom__plan_tool(p, k);
    job->args = parse(args);
    job->loop = k + 1;
    loom__plan_execute(p, job, &lc);
    assert_true(job->done);
    assert_true(job->executed);
}

#define TWO_TASKS                                                              \
    "{\"goal\":\"Compare A and B\",\"tasks\":["                                \
    "{\"id\":\"a\",\"description\":\"Find A\",\"tools\":[\"web\",\"x\"]},"     \
    "{\"id\":\"b\",\"description\":\"Find B\",\"status\":\"completed\"}]}"

/* ---- tests ------------------------------------------------------------ */

static void test_tools(void **state)
{
    loom__plan *p;

    (void)state;
    assert_int_equal(loom__plan_new(&p), 0);
    assert_string_equal(loom__plan_tool(p, LOOM__LOOP_TODO)->name,
                        "todo_write");
    assert_string_equal(loom__plan_tool(p, LOOM__LOOP_THINK)->name, "think");
    assert_int_equal(loom__plan_tool_index(p, "think"), LOOM__LOOP_THINK);
    assert_int_equal(loom__plan_tool_index(p, "todo_write"), LOOM__LOOP_TODO);
    assert_int_equal(loom__plan_tool_index(p, "web_search"), -1);
    assert_null(loom__plan_tool(p, LOOM__LOOP_COUNT));
    assert_true(
        json_is_object(loom__plan_tool(p, LOOM__LOOP_TODO)->parameters));
    assert_null(loom__plan_get(p));
    loom__plan_free(p);
    loom__plan_free(NULL);
}

/* A plan is kept in its stored form: every task with a status (pending
 * when not given) and a tools list ([] when not given). */
static void test_set_stored_form(void **state)
{
    loom__plan *p;
    json_t *in = parse(TWO_TASKS);
    json_t *want = parse(
        "{\"goal\":\"Compare A and B\",\"tasks\":["
        "{\"id\":\"a\",\"description\":\"Find A\",\"status\":\"pending\","
        "\"tools\":[\"web\",\"x\"]},"
        "{\"id\":\"b\",\"description\":\"Find B\",\"status\":\"completed\","
        "\"tools\":[]}]}");

    (void)state;
    assert_int_equal(loom__plan_new(&p), 0);
    assert_int_equal(loom__plan_set(p, in), 0);
    assert_true(json_equal(loom__plan_get(p), want));
    /* A copy: the caller's value may go. */
    assert_ptr_not_equal(loom__plan_get(p), in);
    json_decref(in);
    json_decref(want);
    loom__plan_free(p);
}

/* An invalid plan is refused with what is wrong, and the plan kept
 * before stays. */
static void test_set_refuses(void **state)
{
    static const char *const bad[] = {
        "{\"goal\":\"g\",\"tasks\":[{\"id\":\"a\",\"description\":\"x\"},"
        "{\"id\":\"a\",\"description\":\"y\"}]}",
        "{\"goal\":\"g\",\"tasks\":[]}",
        "{\"goal\":\"g\",\"tasks\":[{\"id\":\"a\",\"description\":\"x\","
        "\"status\":\"maybe\"}]}",
        "{\"tasks\":[{\"id\":\"a\",\"description\":\"x\"}]}",
    };
    static const char *const why[] = {"task id 'a' is used twice", "tasks",
                                      "status", "goal"};
    loom__plan *p;
    json_t *good = parse(TWO_TASKS);

    (void)state;
    assert_int_equal(loom__plan_new(&p), 0);
    assert_int_equal(loom__plan_set(p, good), 0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        json_t *v = parse(bad[i]);
        assert_int_equal(loom__plan_set(p, v), LOOM_EINVALID);
        assert_non_null(strstr(loom_error_last(), "the plan is not valid"));
        assert_non_null(strstr(loom_error_last(), why[i]));
        assert_string_equal(
            json_string_value(json_object_get(loom__plan_get(p), "goal")),
            "Compare A and B");
        json_decref(v);
    }
    json_decref(good);
    loom__plan_free(p);
}

static void test_render(void **state)
{
    loom__plan *p;
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    json_t *in = parse(TWO_TASKS);

    (void)state;
    assert_int_equal(loom__plan_new(&p), 0);
    assert_int_equal(loom__plan_render(p, &b), 0);
    assert_string_equal(loom_buf_cstr(&b),
                        "<plan>\nNo plan exists yet. For a request of "
                        "several steps, create one with todo_write first."
                        "\n</plan>");
    loom_buf_clear(&b);
    assert_int_equal(loom__plan_set(p, in), 0);
    assert_int_equal(loom__plan_render(p, &b), 0);
    assert_string_equal(loom_buf_cstr(&b),
                        "<plan>\nGoal: Compare A and B\nTasks:\n"
                        "1. [pending] a: Find A (tools: web, x)\n"
                        "2. [completed] b: Find B\n"
                        "Keep the plan current with todo_write as tasks "
                        "start, finish or fail.\n</plan>");
    loom_buf_free(&b);
    json_decref(in);
    loom__plan_free(p);
}

/* The <plan> section, as the system prompt shows it: "No plan" until
 * one is set, then its goal and tasks. */
static void test_system_text(void **state)
{
    loom__plan *p;
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    json_t *in = parse(TWO_TASKS);

    (void)state;
    assert_int_equal(loom__plan_new(&p), 0);
    assert_int_equal(loom__plan_render(p, &b), 0);
    assert_true(strncmp(loom_buf_cstr(&b), "<plan>\nNo plan", 14) == 0);
    loom_buf_clear(&b);
    assert_int_equal(loom__plan_set(p, in), 0);
    assert_int_equal(loom__plan_render(p, &b), 0);
    assert_true(
        strncmp(loom_buf_cstr(&b), "<plan>\nGoal: Compare A and B\n", 29) == 0);
    loom_buf_free(&b);
    json_decref(in);
    loom__plan_free(p);
}

/* todo_write saves the plan, says what it holds, reports plan.updated
 * and makes the system text change. */
static void test_todo_write(void **state)
{
    loom__plan *p;
    loom__tool_job job;
    loom_tool_call c;
    sink s = {json_array()};
    json_t *ev;
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);

    (void)state;
    assert_int_equal(loom__plan_new(&p), 0);
    call(p, &job, &c, "todo_write", TWO_TASKS, &s);
    assert_false(job.failed);
    assert_string_equal(job.output,
                        "Plan saved: 2 tasks (1 pending, 0 in progress, 1 "
                        "completed, 0 blocked, 0 failed). It is shown in "
                        "the system prompt under <plan>.");
    assert_int_equal(job.output_size, strlen(job.output));
    assert_int_equal(json_array_size(s.events), 1);
    ev = json_array_get(s.events, 0);
    assert_string_equal(json_string_value(json_object_get(ev, "type")),
                        "plan.updated");
    ev = json_object_get(ev, "data");
    assert_string_equal(json_string_value(json_object_get(ev, "call_id")),
                        "c1");
    assert_int_equal(json_integer_value(json_object_get(ev, "iteration")), 4);
    assert_true(json_equal(json_object_get(ev, "plan"), loom__plan_get(p)));
    assert_int_equal(loom__plan_render(p, &b), 0);
    assert_non_null(strstr(loom_buf_cstr(&b), "1. [pending] a: Find A"));
    loom_buf_free(&b);
    loom__tool_job_clear(&job);
    /* Nobody listening: the same, without the event. */
    call(p, &job, &c, "todo_write", TWO_TASKS, NULL);
    assert_false(job.failed);
    loom__tool_job_clear(&job);
    json_decref(s.events);
    loom__plan_free(p);
}

/* A plan todo_write cannot keep fails the call, which the model reads;
 * the plan before stays and nothing is reported. */
static void test_todo_write_refused(void **state)
{
    loom__plan *p;
    loom__tool_job job;
    loom_tool_call c;
    sink s = {json_array()};
    json_t *in = parse(TWO_TASKS);

    (void)state;
    assert_int_equal(loom__plan_new(&p), 0);
    assert_int_equal(loom__plan_set(p, in), 0);
    call(p, &job, &c, "todo_write",
         "{\"goal\":\"g\",\"tasks\":[{\"id\":\"t\",\"description\":\"x\"},"
         "{\"id\":\"t\",\"description\":\"y\"}]}",
         &s);
    assert_true(job.failed);
    assert_string_equal(job.stage, "execution");
    assert_string_equal(job.output,
                        "Error: todo_write: the plan was not saved: task id "
                        "'t' is used twice; give every task its own id");
    assert_int_equal(json_array_size(s.events), 0);
    assert_string_equal(
        json_string_value(json_object_get(loom__plan_get(p), "goal")),
        "Compare A and B");
    loom__tool_job_clear(&job);
    json_decref(in);
    json_decref(s.events);
    loom__plan_free(p);
}

static void test_think(void **state)
{
    loom__plan *p;
    loom__tool_job job;
    loom_tool_call c;
    sink s = {json_array()};

    (void)state;
    assert_int_equal(loom__plan_new(&p), 0);
    call(p, &job, &c, "think", "{\"thought\":\"A first, then B.\"}", &s);
    assert_false(job.failed);
    assert_string_equal(job.output, "Acknowledged, please continue.");
    assert_int_equal(json_array_size(s.events), 0);
    assert_null(loom__plan_get(p));
    loom__tool_job_clear(&job);
    json_decref(s.events);
    loom__plan_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tools),
        cmocka_unit_test(test_set_stored_form),
        cmocka_unit_test(test_set_refuses),
        cmocka_unit_test(test_render),
        cmocka_unit_test(test_system_text),
        cmocka_unit_test(test_todo_write),
        cmocka_unit_test(test_todo_write_refused),
        cmocka_unit_test(test_think),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
