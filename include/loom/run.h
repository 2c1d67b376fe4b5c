/*
 * loom/run.h: the run loop and its event stream.
 *
 * A run takes a conversation, calls the model, runs the tools the model
 * asks for (in parallel, bounded), feeds the results back and repeats until
 * the model answers or a limit ends it. Everything it does is reported, in
 * order, as events to a sink.
 *
 * Threads: loom_run_execute() runs the whole loop on the calling thread
 * (tools of a turn run on short-lived threads it starts). Tool hooks run
 * on the calling thread.
 *
 * Abandoned tool calls: a call that overruns its timeout, or does not
 * stop within a grace period once the run is cancelled, is abandoned: its
 * result is an error at once and the run goes on (and may end and be
 * freed) while the call's thread keeps running until the tool returns.
 * That thread owns copies of everything of the run it reads (arguments,
 * settings, user, its cancel flag) and holds a reference on the tool
 * registry (loom/tools.h), so nothing needs waiting for: free the run and
 * drop your registry reference when you are done; the last call out frees
 * the registry.
 * loom_run_cancel() may be called from any thread, or a signal handler.
 * The sink is called from the thread that runs execute, one event at a
 * time, never concurrently.
 */
#ifndef LOOM_RUN_H
#define LOOM_RUN_H

#include "agent.h"
#include "cancel.h"
#include "common.h"
#include "config.h"
#include "context.h"
#include "llm.h"
#include "tools.h"
#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    LOOM_EV_RUN_STARTED = 0,
    LOOM_EV_MESSAGE_DELTA,
    LOOM_EV_REASONING_DELTA,
    LOOM_EV_TOOL_CALLS,
    LOOM_EV_TOOL_STARTED,
    LOOM_EV_TOOL_PROGRESS,
    LOOM_EV_TOOL_DELTA,
    LOOM_EV_TOOL_COMPLETED,
    LOOM_EV_TOOL_FAILED,
    LOOM_EV_TOOL_METRIC,
    LOOM_EV_PLAN_UPDATED,
    LOOM_EV_REVIEW,
    LOOM_EV_CITATION,
    LOOM_EV_USAGE,
    LOOM_EV_RUN_COMPLETED,
    LOOM_EV_RUN_FAILED,
    LOOM_EV_CONTEXT,
    LOOM_EV_AGENT_CHANGED,
    LOOM_EV_APPROVAL_REQUIRED,
    LOOM_EV_RESEARCH_PLAN,
    LOOM_EV_RESEARCH_CYCLE,
    LOOM_EV_RESEARCH_BRANCH,
    LOOM_EV_CONVERSATION_TITLE,
    LOOM_EV_MCP_ELICITATION,
    LOOM_EV_RESEARCH_RESUMED,
    LOOM_EV__COUNT
} loom_event_type;

/* The wire name of an event type ("tool.completed"). */
const char *loom_event_type_name(loom_event_type type);

/*
 * One event. seq is monotonic per run from 1 (the SSE id). index is the
 * content position: it starts at 0 and grows by one with every model turn,
 * so text and tool events of one turn share an index. data holds the
 * event's fields (see docs/events.md); it is borrowed for the sink call
 * (json_incref to keep it).
 */
typedef struct {
    loom_event_type type;
    uint64_t seq;
    uint32_t index;
    const char *run_id;
    json_t *data;
} loom_event;

/* A non-zero return cancels the run (a disconnected client, say). */
typedef int (*loom_event_fn)(const loom_event *ev, void *payload);

typedef struct {
    loom_event_fn emit;
    void *payload;
} loom_sink;

/* Renders ev as one JSON object: {"type","seq","index","run_id",...data}. */
json_t *loom_event_to_json(const loom_event *ev);

/*
 * Where ev comes from in a tree of agent runs: 0 for the run's own
 * events; for an event of a sub-agent's run, nested into its parent's
 * stream (docs/events.md "Nested events": its data carries
 * parent_run_id), that run's depth: 1 for a child, 2 for a grandchild...
 */
int loom_event_depth(const loom_event *ev);

typedef enum {
    LOOM_RUN_PENDING = 0,
    LOOM_RUN_RUNNING,
    LOOM_RUN_COMPLETED,
    LOOM_RUN_FAILED,
    LOOM_RUN_CANCELLED
} loom_run_status;

const char *loom_run_status_name(loom_run_status status);

/*
 * The context engine of a run (loom/context.h, docs/context.md): before
 * every model call the request is fitted to window - max_output_tokens -
 * margin, and a `context` event says how. Off while window is 0 (the
 * model's window is unknown): requests then go as they are. Strings and
 * providers are borrowed: they must outlive the run.
 */
typedef struct {
    long window;         /* the model's context window in tokens; 0: off */
    long margin;         /* tokens kept free; 0: window / 50, >= 16 */
    /* Research agents: older tool results are never reduced. */
    int keep_full_tool_results;
    double tool_result_share; /* of the limit, per round; 0: 0.5 */
    /*
     * Summaries of older messages: by summary_provider and summary_model
     * (NULL provider: the run's own provider and upstream model), with
     * summary_prompt (NULL: LOOM_CONTEXT_SUMMARY_PROMPT) and at most
     * summary_max_tokens (0: min(1024, limit / 8)). no_summary: never
     * summarise (older rounds are dropped instead).
     */
    loom_provider *summary_provider;
    const char *summary_model;
    const char *summary_prompt;
    long summary_max_tokens;
    int no_summary;
    /*
     * A summary stored with the conversation by an earlier run (see
     * loom_run_summary), or NULL, and how many messages of history (as
     * given to loom_run_new) it replaces.
     */
    const char *summary;
    size_t summary_covers;
    /* Token counting; NULL callbacks: the crude default. */
    loom_context_counter counter;
    /*
     * The model's context_window_fallback: when even the parts that are
     * never dropped do not fit, the run switches to this model (for this
     * call and the rest of the run) instead of failing. NULL provider:
     * none. fallback_max_output_tokens caps the answer there (0: the
     * run's max_output_tokens).
     */
    loom_provider *fallback_provider;
    const char *fallback_model;          /* "provider/model", in events */
    const char *fallback_upstream_model; /* id sent upstream */
    long fallback_window;
    long fallback_max_output_tokens;
    /*
     * The model's token counter (loom/tokenizer.h) when counter's
     * callbacks are its: after each model call that reports prompt
     * tokens, an estimating counter is corrected with them
     * (loom_token_counter_observe). NULL: no feedback. Borrowed.
     */
    struct loom_token_counter *token_counter;
} loom_run_context_options;

/* Every field zero: the engine's defaults (off while window is 0). */
#define LOOM_RUN_CONTEXT_OPTIONS_INIT                                          \
    {                                                                          \
        .window = 0                                                            \
    }

typedef struct loom_run loom_run;

/*
 * A model named by an agent's get_model hook (or model_after_retries), as
 * a run's resolve_model callback gives it. Everything is borrowed from
 * whoever resolved it and must stay valid until the run is freed.
 */
typedef struct {
    loom_provider *provider;
    const char *model;          /* "provider/model", reported in events */
    const char *upstream_model; /* id sent upstream */
    /* The model's reasoning controls (0, NULL: unset). */
    long thinking_budget;
    const char *reasoning_effort;
} loom_resolved_model;

/*
 * Fills *out for the model called name; LOOM_ENOTFOUND (with a message)
 * when it does not resolve, which fails the run. Called on the run's
 * thread, once per name the run switches to.
 */
typedef int (*loom_run_resolve_fn)(loom_resolved_model *out, const char *name,
                                   void *payload);

/*
 * Tool hooks (docs/tools.md "Hooks"). A hook looks at each server tool
 * call of a turn, on the thread that runs the loop (never on the tool
 * threads), one call at a time:
 *
 * - before_tool, after the arguments were parsed and validated and
 *   before the tool starts: LOOM_HOOK_CONTINUE runs the call,
 *   LOOM_HOOK_REWRITE runs it with new_arguments (validated again),
 *   LOOM_HOOK_SKIP does not run it and gives the model `text` as a
 *   successful result, LOOM_HOOK_BLOCK does not run it and gives the
 *   model `text` as the reason of a failure.
 * - after_tool, when a call that ran has ended (finished, failed or timed
 *   out), before its events: LOOM_HOOK_REWRITE replaces what the model
 *   reads with `text`; any other answer keeps it.
 *
 * Hooks run in the order given, each seeing the arguments or result the
 * previous one left; the first SKIP or BLOCK ends the before chain. loom's
 * own policies (failure budget, duplicate calls, excluded_ids) are hooks
 * of the same kind that run around the caller's: see docs/tools.md.
 */
typedef enum {
    LOOM_HOOK_CONTINUE = 0,
    LOOM_HOOK_REWRITE,
    LOOM_HOOK_SKIP,
    LOOM_HOOK_BLOCK
} loom_hook_action;

typedef struct {
    const loom_run *run;   /* loom_run_plan, loom_run_tool_records... */
    const char *call_id;
    const char *tool_name;
    int iteration;         /* the model call that asked for it, from 1 */
    /* before: the arguments so far; after: what the tool was given */
    const json_t *arguments;
    /* after only: the call failed, and what the model would read */
    int failed;
    const char *result;
    /*
     * Answers. new_arguments (before, with REWRITE): a JSON object that
     * the run takes (one reference). text: an empty buffer whose limit is
     * the run's max_tool_result; write the result, reason or new result
     * into it.
     */
    json_t *new_arguments;
    loom_buf *text;
} loom_tool_hook_call;

typedef loom_hook_action (*loom_tool_hook_fn)(loom_tool_hook_call *call,
                                              void *payload);

/* A pair of hooks; either may be NULL. */
typedef struct {
    loom_tool_hook_fn before_tool;
    loom_tool_hook_fn after_tool;
    void *payload;
} loom_tool_hook;

/*
 * The plan a model writes with todo_write (docs/tools.md "Planning"): a
 * goal and at most LOOM_PLAN_MAX_TASKS tasks {id, description, status,
 * tools}. Lengths are in Unicode code points.
 */
#define LOOM_PLAN_MAX_TASKS 50
#define LOOM_PLAN_GOAL_MAX 1000
#define LOOM_PLAN_TEXT_MAX 500       /* a task's description */
#define LOOM_PLAN_ID_MAX 64          /* a task's id */
#define LOOM_PLAN_TASK_TOOLS_MAX 16  /* tool names of one task */
#define LOOM_THINK_MAX 20000         /* one thought */

/* Failures of one tool in a run after which it is blocked. */
#define LOOM_RUN_TOOL_FAILURES_MAX 3
/* Think-only model turns that cost no iteration, by default. */
#define LOOM_RUN_DEFAULT_THINK_TURNS 8
/* A tool call's timeout when neither its settings nor the run set one. */
#define LOOM_RUN_DEFAULT_TOOL_TIMEOUT_MS 300000L
/* Records kept by a run (loom_run_tool_records); later calls still emit
 * tool.metric. */
#define LOOM_RUN_MAX_TOOL_RECORDS 1024
/* Documents kept in a run's seen set (loom_run_documents). */
#define LOOM_RUN_MAX_DOCUMENTS 1000
/* Bytes of a record's arguments before they are shown cut. */
#define LOOM_RUN_RECORD_ARGS_MAX 4096
/* How long a call waits for approval when the run does not say: 10 min. */
#define LOOM_RUN_DEFAULT_APPROVAL_TIMEOUT_MS 600000L

/*
 * A handoff an agent offers (docs/agents.md "Handoffs"): the tool
 * transfer_to_<agent> (parameters: an optional "reason" string), whose
 * description is description (NULL: one naming the agent).
 */
typedef struct {
    const char *agent;
    const char *description;
} loom_run_handoff;

/* Handoffs one run makes at most; a call past them is a tool error the
 * model reads. */
#define LOOM_RUN_MAX_HANDOFFS 8

/*
 * A model a run may call on the side by its config name (a tool's
 * `repair_arguments` model): its provider and the id sent upstream.
 * Borrowed.
 */
typedef struct {
    const char *name;
    loom_provider *provider;
    const char *upstream_model;
} loom_run_side_model;

/* Asked before every model call of a run, its sub-agents, reviews and
 * summaries, with the call's worst-case cost; the reservation is held
 * until settle. reserve returns 0 to let the call go, or nonzero to refuse it
 * (the run then answers without tools if a smaller call fits, else ends
 * with what it has: finish_reason "budget"). */
typedef struct loom_call_gate {
    int (*reserve)(void *payload, const char *model, int64_t worst_micros,
                   long worst_tokens, void **ticket);
    void (*settle)(void *payload, void *ticket, int64_t real_micros,
                   long real_tokens);
    void *payload;
} loom_call_gate;

/*
 * A run's own budget (docs/accounts.md "Per-run budgets"): what its model
 * calls, its sub-agents' included, may cost in micro-dollars and in
 * tokens (prompt and output), and how long it may take. 0: no limit.
 * Before each model call its worst case (loom_call_gate) is reserved
 * against it; when the call would pass it, or the time is up, the run
 * makes one last call without tools if that fits (its output cut to
 * what is left), else ends with what was said, in both cases with
 * finish_reason "budget" and status completed. A model without prices
 * under max_cost_micros is refused.
 */
typedef struct {
    int64_t max_cost_micros;
    long max_tokens;
    long max_seconds;
} loom_run_budget;

/* The output tokens a budget's last call may be cut down to, at least. */
#define LOOM_RUN_BUDGET_MIN_OUTPUT 16
/* The output limit a call under a budget or gate carries when neither
 * the request nor the model gives one (the worst case needs one). */
#define LOOM_RUN_BUDGET_DEFAULT_OUTPUT 4096

/*
 * A run's options. Zero means the default for every field: start from
 * LOOM_RUN_OPTIONS_INIT (or `= {0}`, which version 0 also accepts).
 */
typedef struct loom_run_options {
    unsigned version;
    /*
     * The run's id (at most LOOM_ID_MAX bytes), in every event; NULL:
     * one is made ("run_" + 24 hex digits). The conversation it belongs
     * to, reported in run.started; NULL: none. Copied.
     */
    const char *run_id;
    const char *conversation_id;
    /* What the run talks to. All borrowed: they must outlive the run. */
    loom_provider *provider;
    const char *model;          /* "provider/model", reported in events */
    const char *upstream_model; /* id sent upstream */
    const loom_tool_registry *tools; /* may be NULL: no tools */
    const json_t *tool_settings;     /* config `tools` object, may be NULL */
    /* The agent. */
    const char *agent;          /* name, reported in events; may be NULL */
    const char *system_prompt;  /* may be NULL */
    const char *const *tool_names; /* subset of tools offered; NULL: all */
    size_t tool_names_len;
    int max_iterations;         /* model calls at most; default 10 */
    loom_tool_choice tool_choice; /* applies to the first call only */
    loom_opt_bool parallel_tool_calls; /* sent upstream when set */
    int tool_concurrency;       /* tools run at once; default 8 */
    size_t max_tool_result;     /* bytes of one result; default 64 KiB */
    size_t max_tool_error;      /* bytes of an error shown; default 2 KiB */
    long max_output_tokens;     /* 0: unset */
    double temperature;         /* sent when temperature_set */
    int temperature_set;
    /* Events go here; emit may be NULL. */
    loom_sink sink;
    /*
     * Client tools: offered to the model but not run by loom (OpenAI's
     * function calling as a client sees it). When the model calls one, loom
     * runs the turn's server tools, then ends the run with finish reason
     * "tool_calls" and the client calls pending (loom_run_pending_calls).
     * Borrowed. A name may not also be a server tool's.
     */
    const loom_tool_def *client_tools;
    size_t client_tools_len;
    /*
     * The model's request options, put into every request (the fields of
     * loom_llm_request of the same names; a model's come from
     * loom_model_provider_new in loom/router.h). 0 and NULL: unset.
     */
    long thinking_budget;
    const char *reasoning_effort; /* borrowed */
    int prompt_cache;
    int chain_responses;
    /* The client's further request parameters, put into every model call
     * of the run (loom_llm_request.params); NULL: none. Borrowed. */
    const loom_llm_params *params;
    /* The context engine, which fits every request to the window. */
    loom_run_context_options context;
    /*
     * Tool hooks (above), called in order after loom's own before-tool
     * policies and before its after-tool ones. Borrowed.
     */
    const loom_tool_hook *hooks;
    size_t hooks_len;
    /*
     * Loop tools (docs/tools.md "Planning and thinking"). planning offers
     * todo_write, whose plan is shown in the system prompt every turn;
     * think offers think, whose think-only turns cost no iteration (at
     * most max_think_turns of them: 0 means LOOM_RUN_DEFAULT_THINK_TURNS,
     * negative none; the same cap holds for every non-iterative tool,
     * see non_iterative_tools). Listing "todo_write" or "think" in tool_names
     * offers them too. plan: the plan to start from (loom_run_plan of an
     * earlier run of the conversation), copied; NULL: none.
     */
    int planning;
    int think;
    int max_think_turns;
    const json_t *plan;
    /*
     * How long one tool call may run before it is abandoned with an error
     * result, unless the tool's settings give `timeout_ms`; 0:
     * LOOM_RUN_DEFAULT_TOOL_TIMEOUT_MS; negative: no limit.
     */
    long tool_timeout_ms;
    /*
     * Automatic review (docs/review.md): after each turn with tool calls
     * that the run's last call does not follow (and that did more than
     * think), a reviewer model judges the progress, a `review` event
     * reports it, and its note goes into the next turn. provider NULL:
     * the run's; model NULL: the run's upstream model; max_tokens 0: 512;
     * prompt NULL: the built-in one. Borrowed.
     */
    struct {
        int enabled;
        loom_provider *provider;
        const char *model;
        long max_tokens;
        const char *prompt;
    } review;
    /*
     * A title for the conversation (docs/server.md "Conversation
     * titles"): once the run has answered, a short model call writes one
     * and a `conversation.title` event carries it, before run.completed.
     * provider NULL: the run's; model NULL: the run's upstream model.
     * Borrowed.
     */
    struct {
        int enabled;
        loom_provider *provider;
        const char *model;
    } title;
    /*
     * Citations (docs/citations.md): documents that tools report get
     * numbers the model is shown, and the answer's [n] markers are
     * checked, emitted as `citation` events and kept (loom_run_citations).
     */
    int citations;
    /* With citations: a "Sources" list of the sources the answer cites
     * ([n] title - url) is appended to it (and streamed). */
    int citations_sources_list;
    /*
     * The user the run is for, and that user's own keys (an object, name
     * -> key), given to every tool call (loom_tool_ctx.user_id,
     * user_keys; the memory tools need a user). NULL: anonymous, none.
     * Each call gets its own copies. Borrowed.
     */
    const char *user_id;
    const json_t *user_keys;
    /*
     * The user's own instructions (their settings), added to the system
     * prompt after the tools' usage rules (docs/agents.md "System
     * prompt"); NULL or empty: none. Borrowed.
     */
    const char *user_instructions;
    /*
     * The system note added before the last permitted model call (once
     * tools were offered), taken as it is; NULL or empty: the built-in
     * one, which names the limit. Borrowed.
     */
    const char *limit_prompt;
    /*
     * After a tool turn with more than many_results_after tool results
     * (server calls answered), one system note is added for the next
     * model call asking the model to keep its context summary short:
     * many_results_prompt, NULL or empty: the built-in one. Each such
     * turn gets its own note, after its results; notes are loom's own
     * messages (never stored with the conversation) and stay in the
     * run's later requests, as review notes do. 0: off. Borrowed.
     */
    int many_results_after;
    const char *many_results_prompt;
    /*
     * The agent's hooks (loom/agent.h), or NULL: loom's default
     * behaviour. Borrowed.
     */
    const loom_agent_hooks *agent_hooks;
    /*
     * The system prompt's further parts (docs/agents.md "System prompt"),
     * in its order: system_prompt, the usage rule of each tool offered,
     * the user's memories, the plan. tool_docs is the agent's
     * tool-description registry: an entry's description is sent in place
     * of the tool's own, and its selection_rule (else the tool settings'
     * `selection_rule`) is the tool's usage rule; entries for tools not
     * offered are ignored. memories is the memories section as shown
     * (NULL: none; the session layer makes it from the store).
     * few_shot: example exchanges sent after the system messages of
     * every request (loom's own messages, never stored, never summarised
     * or dropped by the context engine). Borrowed.
     */
    const loom_agent_tool_doc *tool_docs;
    size_t tool_docs_len;
    const char *memories;
    const loom_message *few_shot;
    size_t few_shot_len;
    /*
     * Handoffs (docs/agents.md "Handoffs"): the agents this one may hand
     * the run over to, each offered as a tool transfer_to_<agent>. When
     * the model calls one, resolve_agent fills *out (a copy of the run's
     * options as they are) with that agent's options; the call's result
     * is "Transferred to <agent>." and, from the next model call on, the
     * run is that agent: its prompt, tools, handoffs, model and provider,
     * limits, loop rules and agent hooks, with max_iterations counted
     * afresh from the handoff (the call that asked for it counts toward
     * the agent that made it). An `agent.changed` event says so. The run
     * keeps its id, conversation, sink, plan, messages and usage whatever
     * out says. What resolve_agent sets is borrowed until the run is
     * freed. Its error (or a call past LOOM_RUN_MAX_HANDOFFS, or a second
     * handoff in one turn) is the call's error; the run goes on as it
     * was. Without resolve_agent no handoff is offered. Borrowed.
     */
    const loom_run_handoff *handoffs;
    size_t handoffs_len;
    int (*resolve_agent)(const char *agent, struct loom_run_options *out,
                         void *payload);
    void *resolve_payload;
    /*
     * How long a tool call that needs approval (docs/agents.md "Approval
     * and progress": the tool's `approval: required` setting, or the
     * agent's approval_required hook) waits for an answer
     * (loom_run_approve) before it is denied with the reason "approval
     * timed out"; 0: LOOM_RUN_DEFAULT_APPROVAL_TIMEOUT_MS; negative: no
     * limit.
     */
    long approval_timeout_ms;
    /*
     * The side models the run may call by name (tool_settings'
     * `repair_arguments`). A name not listed is asked of the run's own
     * provider, with the name as the upstream id. Borrowed.
     */
    const loom_run_side_model *models;
    size_t models_len;
    /*
     * What a turn whose every call was to a tool not enabled for the
     * user (loom_tool.should_use) ends with, streamed as the answer;
     * "{tool}" is replaced by the tool's name. NULL or empty: the
     * built-in text. Borrowed.
     */
    const char *tools_disabled_message;
    /*
     * How a model name that get_model gives becomes a provider
     * (loom_resolved_model); the session layer supplies one that resolves as
     * a turn's `model` does. NULL: the run's own provider, with the name
     * as the upstream id.
     */
    loom_run_resolve_fn resolve_model;
    void *resolve_model_payload;
    /*
     * The YAML keys retry_without_tool_calls and model_after_retries,
     * carried out by loom's default on_no_tool_calls and get_model
     * (loom/agent.h; a hook of the agent's replaces them). max > 0: a
     * model call that asks for no tool while tools are offered (and is
     * not the last permitted one) is followed by another while fewer
     * than max retries were made, with prompt (NULL or empty: a built-in
     * note) as a system note. model set: once model_after (> 0) retries
     * were made, every later call uses that model (resolve_model).
     * Retries are model calls: they count toward max_iterations.
     * Borrowed.
     */
    struct {
        int max;
        const char *prompt;
        int model_after;
        const char *model;
    } retry;
    /*
     * Tools whose calls cost no iteration: a model turn whose calls are
     * all of these tools (and no client tool) is not counted toward
     * max_iterations, up to max_think_turns such turns, after which they
     * count. NULL: loom's think tool only; non-NULL with length 0: none.
     * Borrowed.
     */
    const char *const *non_iterative_tools;
    size_t non_iterative_tools_len;
    /*
     * The model reasons (its capabilities.reasoning): the run sends an
     * empty reasoning.delta right after run.started, as it also does
     * when thinking_budget or reasoning_effort is set, so a client opens
     * its reasoning view before the first thought arrives.
     */
    int reasoning;
    /*
     * The model sees images (its capabilities.vision): tools may give
     * images with their results (loom_tool_ctx.images), which the run
     * sends to the model with the result. 0: tools get no place for
     * them and describe them in their text only.
     */
    int vision;
    /*
     * The account gate, asked around every model call of the run and of
     * its sub-agents (they inherit it), and the run's own budget (above),
     * which its sub-agents' calls count toward too. A handoff keeps the
     * run's budget. Borrowed.
     */
    const loom_call_gate *call_gate; /* NULL: none */
    loom_run_budget budget;
    /*
     * Every model call asks for the whole answer instead of a stream
     * (loom_llm_request.stream 0): for a caller that reads only the
     * finished run. The run's events are the same, but each answer's
     * text and reasoning arrive as one delta when the model is done, and
     * the provider's answer timeout (timeouts.answer_ms) bounds the wait
     * for it instead of first_byte_ms. A handoff keeps it.
     */
    int whole_answers;
} loom_run_options;

#define LOOM_RUN_OPTIONS_VERSION 1
#define LOOM_RUN_OPTIONS_INIT                                                  \
    {                                                                          \
        .version = LOOM_RUN_OPTIONS_VERSION                                    \
    }

/*
 * Creates a run over a copy of history (the conversation so far, ending
 * with the user's message). LOOM_EINVALID when the options are unusable
 * (a bad version, no provider, no model, a bad run_id, empty history).
 */
int loom_run_new(loom_run **out, const loom_run_options *opts,
                 const loom_messages *history);

/*
 * Runs the loop to its end. Returns 0 when the run completed,
 * LOOM_ECANCELED when cancelled, or the error that failed it (the message
 * is in loom_error_last and in the run.failed event). In every case the
 * run's status, text, usage and new messages are readable afterwards.
 */
int loom_run_execute(loom_run *run);

/* Asks the run to stop; safe from any thread and from signal handlers. */
void loom_run_cancel(loom_run *run);

/*
 * Answers a tool call that waits for approval (its approval.required
 * event): approve non-zero runs it; else it is denied and the model
 * reads "the user denied this call: <reason>" (reason may be NULL; cut
 * to 1000 bytes). Safe from any thread, and from the run's sink while it
 * handles the approval.required event. LOOM_ENOTFOUND when no call of
 * that id waits (never asked, already answered, timed out, or the run is
 * over); LOOM_EINVALID for a NULL call_id.
 */
int loom_run_approve(loom_run *run, const char *call_id, int approve,
                     const char *reason);

/* How many tool calls wait for approval now; safe from any thread. */
size_t loom_run_approvals_waiting(const loom_run *run);

loom_run_status loom_run_status_get(const loom_run *run);
const char *loom_run_id(const loom_run *run);
/* The final answer (or what was streamed before a failure); never NULL. */
const char *loom_run_text(const loom_run *run);
/* Token counts summed over the run's model calls; cost_micros sums the
 * costs of the calls whose model has prices. */
const loom_usage *loom_run_usage(const loom_run *run);
/* 1 when the run's cost is known: it made at least one priced model call
 * (reviews and summaries included) and no unpriced one; else 0, and
 * loom_run_usage's cost_micros is then no total. */
int loom_run_cost_known(const loom_run *run);
/* Model calls made. */
int loom_run_iterations(const loom_run *run);
/* Messages the run added after history (assistant turns, tool results). */
const loom_messages *loom_run_messages(const loom_run *run);
/*
 * The agent that was running when loom_run_messages' message i was added
 * (handoffs change it), or NULL: none named, or i out of range. Borrowed
 * from the run's options.
 */
const char *loom_run_message_agent(const loom_run *run, size_t i);
/*
 * The model that answered the model call loom_run_messages' message i
 * came from ("provider/model": a router's fallback, a get_model hook's
 * model, else the agent's at the time, which handoffs change), or NULL:
 * none answered before it (a resumed run's earlier messages), or i out
 * of range. Borrowed from the run.
 */
const char *loom_run_message_model(const loom_run *run, size_t i);
/* The agent the run is now (after its handoffs), or NULL. */
const char *loom_run_agent(const loom_run *run);
/*
 * Client tool calls the run ended on (see client_tools), in call order;
 * *n is 0 when none. Borrowed from the run.
 */
const loom_tool_call *loom_run_pending_calls(const loom_run *run, size_t *n);
/* Finish reason of the last model call ("stop", "tool_calls", ...), or
 * NULL. */
const char *loom_run_finish_reason(const loom_run *run);
/* The conversation's title the run wrote (loom_run_options.title), or
 * NULL. */
const char *loom_run_title(const loom_run *run);
/* The model the run used ("provider/model", or the upstream id). */
const char *loom_run_model(const loom_run *run);

/*
 * The newest summary the run's context engine made (see
 * loom_run_context_options), or NULL when it made none; *covers (may be
 * NULL) gets how many messages of the conversation (history as given to
 * loom_run_new, then loom_run_messages) it replaces. A caller stores both
 * with the conversation and gives them to the next run. Borrowed from
 * the run.
 */
const char *loom_run_summary(const loom_run *run, size_t *covers);

/*
 * The sources the final answer cites (docs/citations.md), as stored with
 * the message: an array of {number, id, url, title, published,
 * tool_call_id}; NULL when citations are off or the answer was not
 * checked. Borrowed from the run.
 */
const json_t *loom_run_citations(const loom_run *run);

/* The error message of a failed run, "" otherwise. */
const char *loom_run_error(const loom_run *run);

/*
 * The run's plan ({goal, tasks: [{id, description, status, tools}]}, see
 * docs/tools.md), or NULL when it has none: the one given in the options,
 * as the model last wrote it. A caller keeps it with the conversation and
 * gives it to the next run. Borrowed from the run.
 */
const json_t *loom_run_plan(const loom_run *run);

/*
 * The record of every tool call of the run, in the order they ended (at
 * most LOOM_RUN_MAX_TOOL_RECORDS): an array of objects of the shape of
 * the tool.metric event (docs/events.md). Borrowed from the run.
 */
const json_t *loom_run_tool_records(const loom_run *run);

/*
 * The documents tools reported during the run (web_search results...),
 * each once, in the order first seen: an array of objects with at least
 * a string `id`. Borrowed from the run.
 */
const json_t *loom_run_documents(const loom_run *run);

/*
 * Tools that failed in one turn and that the next model call (one that
 * could call tools) did not call again, each counted once per such turn:
 * an object {tool: count}, or NULL when there were none. Each one is also
 * logged as a warning ("tool not chosen after error"). Borrowed from the
 * run.
 */
const json_t *loom_run_tools_abandoned_after_error(const loom_run *run);

void loom_run_free(loom_run *run);

#ifdef __cplusplus
}
#endif
#endif
