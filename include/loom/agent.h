/*
 * loom/agent.h: an agent's behaviour as C hooks (docs/agents.md).
 *
 * A YAML agent (loom/config.h) sets what most agents need: prompt, tools,
 * limits, the loop's small rules. An embedder who needs more gives the
 * agent hooks: one loom_agent_hooks struct, every member optional (zero
 * or NULL keeps loom's default behaviour), registered with the session
 * for an agent name (loom_session_set_agent_hooks in loom/session.h) or
 * given to one run (loom_run_options.agent_hooks). Every run of that
 * agent, a sub-agent's included, calls them.
 *
 * Threads: every hook is called on the thread that runs the loop, one
 * at a time, never on a tool's thread; what a hook is given is borrowed
 * for the call.
 */
#ifndef LOOM_AGENT_H
#define LOOM_AGENT_H

#include "buf.h"
#include "common.h"
#include "message.h"
#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

struct loom_run;

/*
 * What hooks see of a run between model calls. All borrowed for the
 * call.
 */
typedef struct {
    const struct loom_run *run; /* loom/run.h accessors */
    const char *agent;          /* the agent's name; may be NULL */
    int iteration;              /* model calls made so far */
    int counted;                /* of them, those that count toward the limit */
    int max_iterations;         /* the limit in force */
    size_t tool_calls;          /* tool calls the last model call asked for */
    int retries;                /* times the run went on after a model call
                                 * without tool calls (on_no_tool_calls) */
    const char *model; /* "provider/model" of the next (or last) call */
    /* The conversation the next request is built from. */
    const loom_messages *messages;
    void *state; /* the hooks' own state for this run (init_state) */
} loom_agent_state;

#define LOOM_AGENT_HOOKS_VERSION 1

/*
 * The hooks. Start from LOOM_AGENT_HOOKS_INIT (or `= {0}`, which
 * version 0 also accepts); payload is passed to every hook.
 */
typedef struct {
    unsigned version;
    void *payload;
    /*
     * The hooks' own state for one run: init_state is called once when
     * the run starts (before the first model call) and its answer is
     * loom_agent_state.state in every later call; free_state is called
     * with it when the run is freed. Either may be NULL.
     */
    void *(*init_state)(const loom_agent_state *st, void *payload);
    void (*free_state)(void *state, void *payload);
} loom_agent_hooks;

#define LOOM_AGENT_HOOKS_INIT                                                  \
    {                                                                          \
        .version = LOOM_AGENT_HOOKS_VERSION                                    \
    }

#ifdef __cplusplus
}
#endif
#endif
