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
    size_t tools_offered;       /* tools the run offers (0: none) */
    int retries;                /* times the run went on after a model call
                                 * that asked for no tools
                                 * (NO_CALLS_GENERATED answered 1) */
    const char *model; /* "provider/model" of the next (or last) call */
    /* The conversation the next request is built from. */
    const loom_messages *messages;
    void *state; /* the hooks' own state for this run (init_state) */
} loom_agent_state;

/* Why a model call ended without tool calls to run (on_no_tool_calls). */
typedef enum {
    LOOM_NO_CALLS_GENERATED = 0, /* the model answered without calling */
    LOOM_NO_CALLS_LIMIT_REACHED, /* the last permitted call (no tools) */
    /* every call asked for a tool that is not enabled for this user or
     * request (should_use); the calls end TOOL_NOT_ENABLED */
    LOOM_NO_CALLS_TOOLS_DISABLED
} loom_no_calls_reason;

/* preprocess_tool_arguments's answer. */
typedef enum {
    LOOM_ARGS_DEFAULT = 0, /* loom parses the model's text as usual */
    LOOM_ARGS_SET,         /* *args holds the arguments (then validated) */
    LOOM_ARGS_FAIL         /* the call fails; error is what the model reads */
} loom_args_action;

/* approval_required's answer. */
typedef enum {
    LOOM_APPROVAL_DEFAULT = 0, /* the tool's setting (`approval:`) */
    LOOM_APPROVAL_REQUIRED,
    LOOM_APPROVAL_NOT_REQUIRED
} loom_approval;

/*
 * What a special tool's hook may change once a call has ended, before
 * the model reads its result. All start empty: leave them so to change
 * nothing.
 */
typedef struct {
    loom_buf *force_tool; /* a tool name: the next call must call it */
    loom_buf *result;     /* replaces what the model reads (and what is
                           * stored) */
    /* The conversation the next requests are built from (loom's copy:
     * what is stored does not change). A hook may replace a message's
     * content (free it, put a malloc'd string); it may not add or remove
     * messages. */
    loom_messages *messages;
} loom_special_tool;

/*
 * What the next model call is like (prepare_call). It starts as loom's
 * choice; a hook changes what it needs.
 */
typedef struct {
    int tools;              /* 1: the tools are offered; set 0 to offer none */
    int tool_required;      /* 1: the call must call a tool (tool_choice
                             * required) */
    long max_output_tokens; /* 0: the run's */
    /* A system note added before this call (loom's own message: kept
     * for the run's later calls, never stored); empty: none. */
    loom_buf *note;
    /* The event the call's text streams as: 0 message.delta, else a
     * loom_event_type of loom/run.h (reasoning.delta, research.plan);
     * -1: not streamed at all. */
    int text_event;
} loom_call_setup;

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

    /* ---- the loop ---- */
    /*
     * Before each model call after the first: 0 ends the run with the
     * text so far (the last call's text is the answer; finish reason
     * "stop"). NULL: loom's rule (go on while the last call asked for
     * tools, or on_no_tool_calls said to, and the limit allows). It
     * cannot extend the limit.
     */
    int (*should_continue)(const loom_agent_state *st, void *payload);
    /*
     * A model call left no tool calls to run, for reason. Return 1 to
     * call the model again, 0 to end the run. Text written to message
     * is, when the run goes on, a system note for the next call; when it
     * ends, text added to the answer the user sees (streamed as a
     * message.delta). calls: the calls of the turn (TOOLS_DISABLED), else
     * NULL.
     * - NO_CALLS_GENERATED: the model answered without calling a tool
     *   (not on the last permitted call). Going on keeps the answer's
     *   text in the conversation and counts a retry (retries).
     * - LIMIT_REACHED: before the last permitted call, once tools were
     *   offered. Going on with an empty message adds the limit note
     *   (limit_prompt); a message replaces it. Ending ends the run before
     *   that call, with message as the answer.
     * NULL hook: loom's default, which carries out the YAML key
     * retry_without_tool_calls (NO_CALLS_GENERATED: go on with its
     * prompt while retries < max and tools are offered, else end),
     * goes on at LIMIT_REACHED, and ends at TOOLS_DISABLED (with the
     * agent's tools_disabled_message).
     */
    int (*on_no_tool_calls)(const loom_agent_state *st,
                            loom_no_calls_reason reason,
                            const loom_tool_call *calls, size_t ncalls,
                            loom_buf *message, void *payload);
    /*
     * Before each model call: 0, the call may not call tools (tool
     * choice "none"; the tools are not sent at all unless the
     * conversation already holds tool calls, which some APIs refuse
     * without their declarations). Tool calls it returns anyway are not
     * run. NULL: tools are offered.
     */
    int (*should_send_tools)(const loom_agent_state *st, void *payload);
    /*
     * Before each model call, after should_send_tools: call says what
     * the call is like (tools, a forced tool call, an output limit, a
     * note, where its text streams) and the hook may change it. A call
     * that may not use tools (the last permitted one) stays so.
     */
    void (*prepare_call)(const loom_agent_state *st, loom_call_setup *call,
                         void *payload);
    /*
     * The model of the next call: "provider/model" (or any name a turn
     * may give), resolved by the run's resolve_model (loom/run.h; a
     * session's turns resolve as loom_session_resolve_model does); NULL:
     * the agent's. For this call only. A name that does not resolve
     * fails the run. NULL hook: loom's default, which carries out the
     * YAML key model_after_retries (its model once retries reached its
     * count).
     */
    const char *(*get_model)(const loom_agent_state *st, void *payload);
    /* The usage a model call counts as (in the usage event and the
     * run's totals): out starts as the call's own. */
    void (*calculate_usage)(const loom_agent_state *st, const loom_usage *call,
                            loom_usage *out, void *payload);

    /* ---- tool calls ---- */
    /* The model asked for calls (server and client), before any runs. */
    void (*on_tools_selected)(const loom_agent_state *st,
                              const loom_tool_call *calls, size_t n,
                              void *payload);
    /* Before on_tools_selected. Non-zero: the calls are not run and the
     * run ends with its text so far (finish reason "stop"). */
    int (*process_tool_calls)(const loom_agent_state *st,
                              const loom_tool_call *calls, size_t n,
                              void *payload);
    /*
     * A call's arguments, before validation. LOOM_ARGS_SET: *args (an
     * object; the run takes the reference) are the arguments;
     * LOOM_ARGS_FAIL: the call fails and the model reads error's text;
     * LOOM_ARGS_DEFAULT: loom parses the model's text, with the tool's
     * fallbacks (default_args_on_bad_json, repair_arguments).
     */
    loom_args_action (*preprocess_tool_arguments)(const loom_agent_state *st,
                                                  const loom_tool_call *call,
                                                  json_t **args,
                                                  loom_buf *error,
                                                  void *payload);
    /* Whether this call waits for a person's approval before it runs. */
    loom_approval (*approval_required)(const loom_agent_state *st,
                                       const loom_tool_call *call,
                                       const json_t *args, void *payload);
    /*
     * A running call reported progress (the tool.progress event's
     * fields: call_id, tool, label, icon, status). A sub-agent's calls'
     * steps (at any depth below this run) come too, as they reach this
     * run's stream, with the nested fields that say whose they are:
     * run_id (the sub-agent run's), parent_run_id, parent_call_id (the
     * call of the run above it), agent, depth (the sub-agent run's in
     * its tree, the top run's being 0; docs/events.md "Nested events").
     * Only the run's own steps have no parent_run_id. A sub-agent's own
     * hooks see its steps as their own.
     */
    void (*on_tool_progress)(const loom_agent_state *st, const json_t *progress,
                             void *payload);
    /* A call ended (failed: it failed, result: what the model would
     * read); see loom_special_tool. */
    void (*special_tool)(const loom_agent_state *st, const loom_tool_call *call,
                         int failed, const char *result, loom_special_tool *out,
                         void *payload);
} loom_agent_hooks;

#define LOOM_AGENT_HOOKS_INIT                                                  \
    {                                                                          \
        .version = LOOM_AGENT_HOOKS_VERSION                                    \
    }

#ifdef __cplusplus
}
#endif
#endif
