/*
 * Internal: the loop tools (todo_write, think) and the plan (plan.c).
 *
 * A loom__plan holds the loop tools' definitions and the current plan.
 * It knows nothing of the run: run.c decides whether the tools are
 * offered, the system prompt (prompt.c) shows the plan as
 * loom__plan_render writes it, and run.c hands a loop tool call over
 * with loom__plan_execute, which reports a changed plan through the emit
 * callback it is given.
 */
#ifndef LOOM_AGENT_PLAN_H
#define LOOM_AGENT_PLAN_H

#include "agent/emit.h"
#include "agent/toolexec.h"
#include "loom/buf.h"
#include "loom/tools.h"

/* Loop tools, by their index. */
enum { LOOM__LOOP_TODO = 0, LOOM__LOOP_THINK, LOOM__LOOP_COUNT };

typedef struct loom__plan loom__plan;

/* A new plan object with the loop tools' definitions and no plan. */
int loom__plan_new(loom__plan **out);
void loom__plan_free(loom__plan *p);

/* Loop tool k (LOOM__LOOP_*); borrowed from p. */
const loom_tool *loom__plan_tool(const loom__plan *p, int k);

/* The index of the loop tool named name, or -1. */
int loom__plan_tool_index(const loom__plan *p, const char *name);

/*
 * Validates a plan given by the caller (a stored one) and keeps a copy
 * in its stored form (every task with a status and a tools list). On
 * failure nothing changes and LOOM_EINVALID says what is wrong.
 */
int loom__plan_set(loom__plan *p, const json_t *plan);

/* The current plan, or NULL; borrowed from p. */
const json_t *loom__plan_get(const loom__plan *p);

/* Appends the <plan> section the system message shows to b. */
int loom__plan_render(const loom__plan *p, loom_buf *b);

/* What a loop tool call needs besides its job. */
typedef struct {
    int iteration;    /* the model call that asked for it */
    size_t max_error; /* bytes of one error message */
    loom__emit emit;  /* plan.updated goes here */
} loom__loop_call;

/*
 * Executes a loop tool call on the caller's thread: job is prepared (its
 * arguments validated), job->loop is its tool's index + 1, and it is not
 * done; it ends done. A todo_write call that saves a plan emits
 * plan.updated.
 */
void loom__plan_execute(loom__plan *p, loom__tool_job *job,
                        const loom__loop_call *c);

#endif
