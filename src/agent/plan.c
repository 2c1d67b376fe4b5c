/*
 * Loop tools: todo_write and think, the tools that act on the run itself
 * rather than on the world, so they run on the run's thread with its
 * state at hand.
 *
 * todo_write replaces the run's plan (a goal and tasks with a status),
 * which the system message shows in a <plan> section at every model call,
 * and which every change
 * reports as a plan.updated event. The plan's limits are the tool's JSON
 * Schema, so a model reads them and a plan given back by a caller (a
 * stored one) is checked by the same rules.
 *
 * think records a thought and answers "Acknowledged, please continue.":
 * the thinking itself is in the call's arguments, in the conversation. A
 * turn of think calls only costs no iteration (run.c counts them).
 *
 * The plan object is the run's, but knows nothing of it (plan.h): run.c
 * puts the text it gives into the system message and hands loop tool
 * calls over, and events go out through the callback it is given.
 */
#include "agent/plan.h"
#include "core/clock.h"
#include "core/error.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TODO_NAME "todo_write"
#define THINK_NAME "think"

#define TODO_DESCRIPTION                                                     \
    "Create or update your plan for this request: a goal and an ordered "   \
    "list of tasks, each with an id, a description, a status (pending, "    \
    "in_progress, completed, blocked, failed) and the tools it needs. "     \
    "Each call replaces the whole plan, so send every task each time with " \
    "its current status. Write a plan before a task of several steps, "     \
    "mark a task in_progress when you start it and completed when it is "   \
    "done. The plan is shown to you in the system prompt under <plan>."

#define THINK_DESCRIPTION                                                    \
    "Think step by step before acting: what you know, what is missing, "    \
    "what to do next, whether a result answers the question. The thought " \
    "is recorded and nothing else happens; use it between tool calls and " \
    "before your final answer."

#define THINK_ANSWER "Acknowledged, please continue."

#define NO_PLAN                                                              \
    "No plan exists yet. For a request of several steps, create one with "  \
    "todo_write first."

#define PLAN_FOOTER                                                          \
    "Keep the plan current with todo_write as tasks start, finish or fail."

struct loom__plan {
    loom_tool tools[LOOM__LOOP_COUNT]; /* their schemas are owned */
    json_t *plan;                      /* the current plan, or NULL */
};

static const char *const statuses[] = {"pending", "in_progress", "completed",
                                       "blocked", "failed"};
#define NSTATUS (sizeof(statuses) / sizeof(*statuses))

static json_t *todo_schema(void)
{
    json_t *status = json_array();

    for (size_t i = 0; status && i < NSTATUS; i++)
        json_array_append_new(status, json_string(statuses[i]));
    if (!status)
        return NULL;
    return json_pack(
        "{s:s, s:{s:{s:s, s:i, s:i, s:s},"
        "         s:{s:s, s:i, s:i, s:s, s:{s:s, s:{"
        "             s:{s:s, s:i, s:i},"
        "             s:{s:s, s:i, s:i},"
        "             s:{s:s, s:o, s:s},"
        "             s:{s:s, s:i, s:{s:s, s:i, s:i}}},"
        "           s:[s,s], s:b}}},"
        " s:[s,s], s:b}",
        "type", "object", "properties",
        "goal", "type", "string", "minLength", 1, "maxLength",
        LOOM_PLAN_GOAL_MAX, "description", "What the whole request is to "
        "achieve",
        "tasks", "type", "array", "minItems", 1, "maxItems",
        LOOM_PLAN_MAX_TASKS, "description", "The tasks, in order",
        "items", "type", "object", "properties",
        "id", "type", "string", "minLength", 1, "maxLength",
        LOOM_PLAN_ID_MAX,
        "description", "type", "string", "minLength", 1, "maxLength",
        LOOM_PLAN_TEXT_MAX,
        "status", "type", "string", "enum", status, "description",
        "Default pending",
        "tools", "type", "array", "maxItems", LOOM_PLAN_TASK_TOOLS_MAX,
        "items", "type", "string", "minLength", 1, "maxLength", 64,
        "required", "id", "description", "additionalProperties", 0,
        "required", "goal", "tasks", "additionalProperties", 0);
}

static json_t *think_schema(void)
{
    return json_pack("{s:s, s:{s:{s:s, s:i, s:i, s:s}}, s:[s], s:b}",
                     "type", "object", "properties", "thought", "type",
                     "string", "minLength", 1, "maxLength", LOOM_THINK_MAX,
                     "description", "Your reasoning", "required", "thought",
                     "additionalProperties", 0);
}

/*
 * The two schemas, built once per process and shared (read only, like a
 * registry's tools, which every turn of a session reads): building them
 * took a fifth of a short child run's set-up. NULL when out of memory.
 */
static json_t *shared_schemas[LOOM__LOOP_COUNT];
static pthread_once_t schemas_once = PTHREAD_ONCE_INIT;

static void make_schemas(void)
{
    shared_schemas[LOOM__LOOP_TODO] = todo_schema();
    shared_schemas[LOOM__LOOP_THINK] = think_schema();
}

int loom__plan_new(loom__plan **out)
{
    loom__plan *p = calloc(1, sizeof(*p));
    loom_tool *todo, *think;

    *out = NULL;
    if (!p)
        return loom__error_oom();
    todo = &p->tools[LOOM__LOOP_TODO];
    think = &p->tools[LOOM__LOOP_THINK];
    todo->name = TODO_NAME;
    todo->description = TODO_DESCRIPTION;
    think->name = THINK_NAME;
    think->description = THINK_DESCRIPTION;
    pthread_once(&schemas_once, make_schemas);
    /* Without the shared ones (out of memory once), each its own. */
    todo->parameters = shared_schemas[LOOM__LOOP_TODO]
                           ? json_incref(shared_schemas[LOOM__LOOP_TODO])
                           : todo_schema();
    think->parameters = shared_schemas[LOOM__LOOP_THINK]
                            ? json_incref(shared_schemas[LOOM__LOOP_THINK])
                            : think_schema();
    if (!todo->parameters || !think->parameters) {
        loom__plan_free(p);
        return loom__error_oom();
    }
    *out = p;
    return 0;
}

void loom__plan_free(loom__plan *p)
{
    if (!p)
        return;
    for (int k = 0; k < LOOM__LOOP_COUNT; k++)
        json_decref((json_t *)p->tools[k].parameters);
    json_decref(p->plan);
    free(p);
}

const loom_tool *loom__plan_tool(const loom__plan *p, int k)
{
    return k >= 0 && k < LOOM__LOOP_COUNT ? &p->tools[k] : NULL;
}

int loom__plan_tool_index(const loom__plan *p, const char *name)
{
    for (int k = 0; name && k < LOOM__LOOP_COUNT; k++)
        if (strcmp(p->tools[k].name, name) == 0)
            return k;
    return -1;
}

const json_t *loom__plan_get(const loom__plan *p)
{
    return p->plan;
}

/*
 * Checks value against the todo_write schema and what a schema cannot
 * say (task ids are unique), and makes the stored form: every task with
 * its status (pending when not given) and tools ([] when not given).
 */
static int plan_make(json_t **out, const loom__plan *p, const json_t *value,
                     char **msg)
{
    const json_t *tasks, *t;
    json_t *plan = NULL, *list = NULL, *ids = NULL;
    size_t i;
    int rc = 0;

    *out = NULL;
    *msg = NULL;
    if (loom_schema_validate(p->tools[LOOM__LOOP_TODO].parameters, value,
                             msg) != 0)
        return LOOM_EINVALID;
    tasks = json_object_get(value, "tasks");
    if (!(list = json_array()) || !(ids = json_object())) {
        rc = loom__error_oom();
        goto cleanup;
    }
    json_array_foreach(tasks, i, t)
    {
        const char *id = json_string_value(json_object_get(t, "id"));
        const json_t *st = json_object_get(t, "status");
        const json_t *tools = json_object_get(t, "tools");
        json_t *task;

        if (json_object_get(ids, id)) {
            if (asprintf(msg, "task id '%s' is used twice; give every task "
                         "its own id", id) < 0)
                *msg = NULL;
            rc = LOOM_EINVALID;
            goto cleanup;
        }
        task = json_pack("{s:s, s:O, s:s, s:o}", "id", id, "description",
                         json_object_get(t, "description"), "status",
                         st ? json_string_value(st) : "pending", "tools",
                         tools ? json_deep_copy(tools) : json_array());
        if (!task || json_array_append_new(list, task) != 0 ||
            json_object_set_new(ids, id, json_true()) != 0) {
            rc = loom__error_oom();
            goto cleanup;
        }
    }
    plan = json_pack("{s:O, s:O}", "goal", json_object_get(value, "goal"),
                     "tasks", list);
    if (!plan) {
        rc = loom__error_oom();
        goto cleanup;
    }
    *out = plan;

cleanup:
    json_decref(list);
    json_decref(ids);
    return rc;
}

int loom__plan_set(loom__plan *p, const json_t *plan)
{
    json_t *made = NULL;
    char *msg = NULL;
    int rc = plan_make(&made, p, plan, &msg);

    if (rc == LOOM_EINVALID)
        rc = loom__error_set(LOOM_EINVALID,
                             "run options: the plan is not valid: %s",
                             msg ? msg : "invalid");
    free(msg);
    if (rc)
        return rc;
    json_decref(p->plan);
    p->plan = made;
    return 0;
}

int loom__plan_render(const loom__plan *p, loom_buf *b)
{
    const json_t *plan = p->plan, *t;
    size_t i;
    int rc;

    if (!plan)
        return loom_buf_printf(b, "<plan>\n%s\n</plan>", NO_PLAN);
    rc = loom_buf_printf(b, "<plan>\nGoal: %s\nTasks:\n",
                         json_string_value(json_object_get(plan, "goal")));
    json_array_foreach(json_object_get(plan, "tasks"), i, t)
    {
        const json_t *tools = json_object_get(t, "tools"), *tool;
        size_t j;
        if (rc)
            break;
        rc = loom_buf_printf(
            b, "%zu. [%s] %s: %s", i + 1,
            json_string_value(json_object_get(t, "status")),
            json_string_value(json_object_get(t, "id")),
            json_string_value(json_object_get(t, "description")));
        json_array_foreach(tools, j, tool)
        {
            if (!rc)
                rc = loom_buf_printf(b, "%s%s", j ? ", " : " (tools: ",
                                     json_string_value(tool));
        }
        if (!rc && json_array_size(tools))
            rc = loom_buf_putc(b, ')');
        if (!rc)
            rc = loom_buf_putc(b, '\n');
    }
    if (!rc)
        rc = loom_buf_printf(b, "%s\n</plan>", PLAN_FOOTER);
    return rc;
}

static void todo_execute(loom__plan *p, loom__tool_job *job,
                         const loom__loop_call *c)
{
    size_t count[NSTATUS] = {0}, i;
    const json_t *t;
    json_t *plan = NULL;
    char *msg = NULL, *why = NULL;
    int rc = plan_make(&plan, p, job->args, &msg);

    if (rc) {
        if (asprintf(&why, "todo_write: the plan was not saved: %s",
                     msg ? msg : loom_error_last()) < 0)
            why = NULL;
        loom__tool_job_fail(job, "execution", rc,
                            why ? why : "todo_write: the plan was not saved",
                            NULL, c->max_error);
        free(why);
        free(msg);
        return;
    }
    json_decref(p->plan);
    p->plan = plan;
    if (loom__emit_on(&c->emit))
        loom__emit_send(&c->emit, LOOM_EV_PLAN_UPDATED,
                        json_pack("{s:O, s:s, s:i}", "plan", plan, "call_id",
                                  job->call->id, "iteration", c->iteration));
    json_array_foreach(json_object_get(plan, "tasks"), i, t)
    {
        const char *st = json_string_value(json_object_get(t, "status"));
        for (size_t k = 0; k < NSTATUS; k++)
            count[k] += strcmp(st, statuses[k]) == 0;
    }
    if (asprintf(&job->output, "Plan saved: %zu task%s (%zu pending, %zu "
                 "in progress, %zu completed, %zu blocked, %zu failed). It "
                 "is shown in the system prompt under <plan>.",
                 json_array_size(json_object_get(plan, "tasks")),
                 json_array_size(json_object_get(plan, "tasks")) == 1 ? ""
                                                                      : "s",
                 count[0], count[1], count[2], count[3], count[4]) < 0)
        job->output = NULL;
    job->done = 1;
}

void loom__plan_execute(loom__plan *p, loom__tool_job *job,
                        const loom__loop_call *c)
{
    double t0 = loom__mono_ms_exact();

    if (job->loop - 1 == LOOM__LOOP_TODO) {
        todo_execute(p, job, c);
    } else {
        job->output = strdup(THINK_ANSWER);
        job->done = 1;
    }
    if (!job->output && !job->failed)
        job->output = strdup("Error: out of memory while storing the result");
    job->output_size = job->output ? strlen(job->output) : 0;
    job->duration_ms = loom__mono_ms_exact() - t0;
    job->executed = 1;
}
