/*
 * Internal: the loop rules of a run that need no more of it than its
 * options and what its hooks see (loop_rules.c).
 *
 * - loom's default agent hooks (loom__loop_default_hooks): what a run does
 *   for on_no_tool_calls and get_model when the agent's hooks leave them
 *   NULL. They carry out the YAML keys retry_without_tool_calls and
 *   model_after_retries (loom_run_options.retry), so a YAML agent and a C
 *   hook take the same path through the loop.
 * - Non-iterative tools: which calls cost no iteration.
 * - Tools abandoned after an error: a tool that failed in one turn and
 *   that the next model call does not call again is logged and counted
 *   (seed 001's TOOLS-NOT-CHOSEN-AFTER-ERROR).
 */
#ifndef LOOM_AGENT_LOOP_RULES_H
#define LOOM_AGENT_LOOP_RULES_H

#include "loom/agent.h"
#include "loom/run.h"

/* The note retry_without_tool_calls adds when it has no prompt. */
#define LOOM__RETRY_PROMPT                                                     \
    "You answered without calling a tool, but the task is not done: call "     \
    "the tools you need now instead of answering."

/*
 * loom's default hooks: on_no_tool_calls and get_model, whose payload is
 * the run's options (const loom_run_options *). on_no_tool_calls goes on
 * at LIMIT_REACHED (the limit note), and at NO_CALLS_GENERATED while
 * tools are offered and st->retries < retry.max (with retry.prompt);
 * otherwise it ends the run. get_model is retry.model once st->retries
 * reached retry.model_after, else NULL (the agent's).
 */
extern const loom_agent_hooks loom__loop_default_hooks;

/*
 * Whether a call of tool name costs no iteration under o: name is listed
 * in o->non_iterative_tools, or, when that is NULL, the call is of loom's
 * own think tool (is_think).
 */
int loom__loop_non_iterative(const loom_run_options *o, const char *name,
                             int is_think);

/*
 * Tools that failed in the last tool turn, and the count of each tool
 * that a model call did not call again after it had failed. Zero it to
 * start; loom__abandoned_clear frees it.
 */
typedef struct {
    char **failed; /* names, each once */
    size_t nfailed;
    json_t *counts; /* {tool: count}; NULL until the first one */
} loom__abandoned;

/* Notes that tool name failed in this turn. LOOM_ENOMEM. */
int loom__abandoned_failed(loom__abandoned *a, const char *name);

/*
 * The model call after a failure turn asked for calls (n may be 0): each
 * tool that failed and is not among them is logged (a warning naming the
 * run) and counted. The failures are forgotten either way. LOOM_ENOMEM.
 */
int loom__abandoned_check(loom__abandoned *a, const char *run_id,
                          const loom_tool_call *calls, size_t n);

/* Forgets the failures of the last turn without checking them. */
void loom__abandoned_forget(loom__abandoned *a);

void loom__abandoned_clear(loom__abandoned *a);

#endif
