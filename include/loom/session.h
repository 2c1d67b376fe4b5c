/*
 * loom/session.h: the one way to start a turn.
 *
 * A session turns a config (or an embedder's own provider, tools and
 * store) into turns. A turn is one run of an agent over a conversation:
 * it resolves the agent and its model, maps the agent's config to run
 * options, loads the conversation's history, context summary and plan
 * from the store, runs the loop with a recorder (what the store keeps)
 * in front of the caller's sink, stores the turn (retrying a busy store) and
 * only then emits the final event, so whoever sees run.completed can read the
 * conversation back. `loom run`, `loom serve` and embedders all start turns
 * here.
 *
 * Ownership. A session is immutable once made and may be shared by any
 * number of threads; each turn holds a reference on it, so
 * loom_session_free() may be called while turns still run (the last one
 * out frees it). Everything the session options borrow (config, tools,
 * store, provider, health record) must outlive the session.
 *
 * Threads. loom_turn_execute() runs the whole turn on the calling thread;
 * loom_turn_start() runs it on a thread of its own. loom_turn_cancel()
 * may be called from any thread or a signal handler. The sink is called
 * from the thread that executes the turn, one event at a time; wake
 * callbacks (loom_turn_watch) are called from it too, with no lock of the
 * caller's held.
 */
#ifndef LOOM_SESSION_H
#define LOOM_SESSION_H

#include "common.h"
#include "config.h"
#include "llm.h"
#include "router.h"
#include "run.h"
#include "store.h"
#include "tools.h"
#include <jansson.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_session loom_session;
typedef struct loom_turn loom_turn;

/* How long a store call answering LOOM_EIO (busy, locked, disk full) is
 * retried by default, with a backoff of 50 ms doubling up to 1 s. */
#define LOOM_SESSION_STORE_RETRY_MS 10000

/*
 * Told of the store's trouble (for metrics): op is "create_conversation",
 * "load_history", "save_turn" or "save_child_run" (a sub-agent's run,
 * whose failure fails nothing else). retry: a call failed with LOOM_EIO and is
 * tried again; error: it failed for good.
 */
typedef struct {
    void (*store_retry)(const char *op, void *payload);
    void (*store_error)(const char *op, void *payload);
    void *payload;
} loom_session_observer;

/* Hooks for the turns of one agent (loom/agent.h). */
typedef struct {
    const char *agent; /* the agent's name in the config */
    const loom_agent_hooks *hooks;
} loom_session_agent_hooks;

typedef struct {
    unsigned version;
    /*
     * The config: providers, models, agents, tool settings. NULL: an
     * empty one (an embedder that gives its own provider).
     */
    const loom_config *config;
    /*
     * Tools every turn may offer (each agent picks its own). NULL: the
     * session builds loom's built-ins plus the config's http_tools, and
     * the memory tools when there is a store.
     */
    const loom_tool_registry *tools;
    /* Where turns are loaded from and stored. NULL: nothing is loaded or
     * stored (history must be given with each turn). */
    loom_store *store;
    /*
     * Routing (loom/router.h): a failure record shared by every turn's
     * router (NULL: each router keeps its own) and the adapters to use
     * (NULL lookup: each router builds its own).
     */
    loom_router_health *health;
    loom_provider_lookup_fn lookup;
    void *lookup_payload;
    /*
     * An embedder's own provider: when set, every turn talks to it, with
     * model (or the turn's own model) as the id sent upstream and reported
     * in events; the config's models and routing are not consulted. NULL:
     * models come from the config.
     */
    loom_provider *provider;
    const char *model;
    /* The model of turns that name none and whose agent names none. NULL:
     * $LOOM_MODEL, else the config's first model, else a well-known
     * model of its first provider (loom_config_default_model). */
    const char *default_model;
    /* How long a busy store is retried: 0, LOOM_SESSION_STORE_RETRY_MS;
     * negative: not at all. */
    long store_retry_ms;
    loom_session_observer observer;
    /*
     * Hooks per agent: every turn of that agent (as a sub-agent too)
     * runs with them. Borrowed: they must outlive the session. An agent
     * named twice: the first entry.
     */
    const loom_session_agent_hooks *agent_hooks;
    size_t agent_hooks_len;
} loom_session_options;

#define LOOM_SESSION_OPTIONS_VERSION 1
#define LOOM_SESSION_OPTIONS_INIT                                              \
    {                                                                          \
        .version = LOOM_SESSION_OPTIONS_VERSION                                \
    }

/*
 * Makes a session. Errors: LOOM_EINVALID for a bad version or options
 * (with neither a provider nor a config), errors of building the tools
 * (loom_tools_new_from_config), LOOM_ENOMEM.
 */
int loom_session_new(loom_session **out, const loom_session_options *opts);

/* Drops the caller's reference; NULL is a no-op. Turns still running keep
 * the session alive until they end. */
void loom_session_free(loom_session *s);

/* Borrowed from the session. */
const loom_config *loom_session_config(const loom_session *s);
const loom_tool_registry *loom_session_tools(const loom_session *s);
loom_store *loom_session_store(const loom_session *s);

/*
 * The model a turn of agent (NULL: none) runs when it names none: the
 * agent's model, else the session's default. NULL when there is none (no
 * provider at all). Borrowed from the session or the config.
 */
const char *loom_session_default_model(const loom_session *s,
                                       const loom_agent_config *agent);

/* A model name that names an agent: "agent/researcher". */
#define LOOM_AGENT_MODEL_PREFIX "agent/"

/*
 * Resolves a model name as a user gives it (`loom run -m`, a chat
 * request's `model`), by the one rule of docs/routing.md#model-names:
 * "agent/<name>" is that agent (*agent_out set, *model_out NULL); any
 * other name is a model, resolved by loom_router_resolve_name against
 * the session's default model (*agent_out NULL, *model_out the malloc'd
 * "provider/model", the caller's). With an embedder's provider a model
 * name is taken as is. Errors: LOOM_ENOTFOUND (an unknown agent, a model
 * that does not resolve; the message says why), LOOM_EINVALID (NULL or
 * empty name), LOOM_ENOMEM.
 */
int loom_session_resolve_model(const loom_session *s, const char *name,
                               const loom_agent_config **agent_out,
                               char **model_out);

/*
 * Checks a client's request parameters (loom/llm.h; NULL: none) against
 * the provider kind of the model a turn would call: model ("provider/
 * model"), else that of agent (NULL: the default agent), else the
 * session's default. 0 when the kind takes them all, and always with an
 * embedder's own provider (it decides). Else LOOM_EINVALID, the message
 * "<param> is not supported by provider '<name>' (<kind>)" and *param
 * (when not NULL) the parameter's name (borrowed from static text or p);
 * LOOM_ENOTFOUND for an unknown agent or model. loom_turn_new checks the
 * same; a front end calls this first to answer with the parameter named.
 */
int loom_session_check_params(const loom_session *s, const char *agent,
                              const char *model, const loom_llm_params *p,
                              const char **param);

/*
 * Calls op(arg) until it answers anything but LOOM_EIO, or until the
 * session's store retry time has passed since the first call, sleeping 50
 * ms doubling up to 1 s between calls (each retry told to the observer
 * under `what`). Returns op's last answer. Blocks: not for a thread that
 * serves others.
 */
typedef int (*loom_store_op_fn)(void *arg);
int loom_session_store_retry(loom_session *s, loom_store_op_fn op, void *arg,
                             const char *what);

/* Changes the store retry time of turns that store from now on (tests,
 * operators' reloads); any thread. */
void loom_session_set_store_retry_ms(loom_session *s, long ms);

/* ---- agents as tools ------------------------------------------------- */

/*
 * How an agent is offered as a tool (loom_session_agent_tool). Zero is
 * the default for every field.
 */
typedef struct {
    unsigned version;
    const char *name;        /* the tool's name; NULL: the agent's */
    const char *description; /* NULL: the agent's `description`, else a
                              * generic one */
    const char *model;       /* each child's model; NULL: the agent's */
    int max_iterations;      /* each child's limit; 0: the agent's */
} loom_agent_tool_options;

#define LOOM_AGENT_TOOL_OPTIONS_VERSION 1
#define LOOM_AGENT_TOOL_OPTIONS_INIT                                           \
    {                                                                          \
        .version = LOOM_AGENT_TOOL_OPTIONS_VERSION                             \
    }

/*
 * Adds to reg a tool that runs agent (an agent of s's config) as a
 * sub-agent (docs/agents.md "Sub-agents"): its arguments are {"task":
 * string, "context": string (optional)}; a call runs a child turn of the
 * agent (its prompt, tools, model and limits) on the task and answers
 * with the child's final text, its usage merged into the calling run's.
 * It works in turns of any session (the calling turn's limits apply:
 * max_depth, max_sub_runs); outside a turn it refuses. The tool holds a
 * reference on s. Add it before reg is used by a turn. Errors:
 * LOOM_EINVALID (bad version or arguments, a bad tool name),
 * LOOM_ENOTFOUND (no such agent), LOOM_EEXISTS (the name is taken),
 * LOOM_ENOMEM.
 */
int loom_session_agent_tool(loom_tool_registry *reg, loom_session *s,
                            const char *agent,
                            const loom_agent_tool_options *opts);

/* ---- turns ----------------------------------------------------------- */

/* Bytes of one turn's event log by default (loom_turn_options.log). */
#define LOOM_TURN_LOG_DEFAULT_BYTES (64L * 1024 * 1024)

/* A watcher's callback: the turn has a new event, or ended. */
typedef void (*loom_turn_wake_fn)(void *payload);

typedef struct {
    unsigned version;
    /*
     * Ids. run_id: NULL makes one ("run_" + 24 hex digits); at most
     * LOOM_ID_MAX bytes. conversation_id: continue this conversation,
     * which must exist in the store; NULL: a new conversation when the
     * session has a store, none otherwise.
     */
    const char *run_id;
    const char *conversation_id;
    /*
     * The agent by name; NULL: the config's default_agent, or none.
     * no_agent: none at all, not even the default (a plain model, as a
     * chat request naming a model asks; the turn is stored without one).
     */
    const char *agent;
    int no_agent;
    /*
     * The model, resolved by loom_session_resolve_model: "provider/model",
     * a bare name, or "agent/<name>" (which then names the agent instead;
     * agent must be NULL). NULL: the agent's, else the session's default.
     */
    const char *model;
    /* This turn's new messages, ending with the user's; not empty. */
    const loom_messages *input;
    /*
     * The conversation before input. NULL: loaded from the store when the
     * turn continues a conversation (with its context summary and plan);
     * non-NULL: used as is (clients that resend the whole history).
     */
    const loom_messages *history;
    /* The user the turn is for (memory tools need one); NULL: anonymous.
     * user_keys: that user's own keys (name -> key) for tools. */
    const char *user_id;
    const json_t *user_keys;
    /*
     * The user's own settings (docs/accounts.md "Per-user settings"), an
     * object: "memory": false leaves the memory tools out (and the
     * memories out of the system prompt), for this turn and the
     * sub-agents it runs; "instructions" (a string) is added to this
     * turn's system prompt (not its sub-agents'). Other members are
     * ignored. Copied; NULL: none.
     */
    const json_t *user_settings;
    /*
     * Per-turn overrides; zero keeps the agent's. tool_names with
     * tool_names_set: the server tools offered (an empty list: none).
     */
    const char *system_prompt;
    const char *const *tool_names;
    size_t tool_names_len;
    int tool_names_set;
    loom_tool_choice tool_choice; /* when tool_choice_set */
    int tool_choice_set;
    loom_opt_bool parallel_tool_calls;
    long max_output_tokens;
    double temperature; /* when temperature_set */
    int temperature_set;
    int max_iterations;
    /* The client's further request parameters (loom/llm.h), checked
     * against the model's provider kind by loom_turn_new; copied. NULL:
     * none. */
    const loom_llm_params *params;
    /* Tools the client runs (see loom_run_options); copied. */
    const loom_tool_def *client_tools;
    size_t client_tools_len;
    /*
     * A research agent's settings for this turn (docs/research.md): an
     * object of the `research:` section's keys, over the config's;
     * copied. NULL: none. Given for another agent: LOOM_EINVALID.
     */
    const json_t *research;
    /*
     * Title the conversation (docs/server.md "Conversation titles"):
     * when the turn starts a new conversation in the store, a short call
     * of the turn's model writes its title once the answer is there, sent
     * as a `conversation.title` event and stored. Else ignored.
     */
    int title;
    /*
     * Where events go, after the recorder and the log: every event, the
     * final one only once the turn is stored. A non-zero return cancels
     * the turn. emit may be NULL.
     */
    loom_sink sink;
    /*
     * The event log (loom_turn_next_event): every event kept serialized
     * for any number of readers. log: keep one. log_max_bytes: its limit
     * (0: LOOM_TURN_LOG_DEFAULT_BYTES); past it the turn is cancelled and
     * only its final event is still logged.
     */
    int log;
    long log_max_bytes;
    /*
     * Called on the executing thread once the turn is stored and its
     * final event made, just before the turn is marked ended (a server
     * frees the turn's slot there, so a client that sees the end may
     * start the next turn at once). May be NULL.
     */
    void (*ending)(loom_turn *t, void *payload);
    void *ending_payload;
    /*
     * The turn's own budget (loom/run.h loom_run_budget; zero: none), put
     * with the agent's (its max_cost_usd, max_tokens, max_seconds keys):
     * for each limit the tighter of the two holds. call_gate: the account
     * gate every model call of the turn and its sub-agents asks first
     * (NULL: none). Borrowed.
     */
    loom_run_budget budget;
    const loom_call_gate *call_gate;
    /*
     * Someone follows the turn's events as they come and may answer the
     * forms its tool calls put (an MCP server's elicitation, as an
     * `mcp.elicitation` event; loom_turn_answer_elicitation), in this
     * turn and its sub-agent runs; a form waits up to the turn's agent's
     * approval_timeout_ms, then is answered "cancel". 0: every such form
     * is declined at once (a run nobody streams, no terminal to ask on).
     */
    int elicitation;
    /*
     * Resumable research (docs/research.md "Resuming after a stop"). For
     * a research turn with a store and a log (other turns ignore it),
     * resumable keeps the turn in the store as it goes: its request, each
     * step, each researcher and every event before it is logged.
     * loom_turn_interrupt then leaves it to resume. resume: this turn
     * resumes the stored research run run_id (in conversation_id, with
     * the input, agent, model and research settings it was started
     * with): its events continue the stored ones and what had finished
     * is not done again. resume on a turn that cannot be resumable:
     * LOOM_EINVALID.
     */
    int resumable;
    int resume;
    /*
     * Whom the turn's model calls are counted to (loom/store.h
     * loom_usage_account: the API key, its workspace and user, a service
     * key's end user), kept on the usage rows of the turn and of every
     * sub-agent's turn below it (docs/accounts.md#usage). Ignored for a
     * sub-agent's turn, which takes its top turn's. Copied.
     */
    loom_usage_account account;
    /*
     * A new conversation (conversation_id NULL, a store) is created with
     * the turn's save, in the same store transaction, not before the
     * model call: one write less per turn. For a caller that names the
     * conversation to no one before the turn is stored (a non-streamed
     * chat completion, whose answer is where its client learns the id):
     * until then the conversation is not in the store (not listed nor
     * found). A store that cannot write then fails the turn after its
     * model call (its tokens spent; the final event is run.failed with
     * code "store_failed", as for any turn that cannot be stored), where
     * without it the turn fails before the call; a turn that fails
     * before its model call leaves no conversation. A sub-agent's run
     * stored during the turn creates the conversation first, and a
     * resumable research turn (resumable) creates it when it starts, as
     * without this option. With a conversation_id: LOOM_EINVALID.
     */
    int create_with_save;
    /*
     * The turn's model calls ask for whole answers, not streams
     * (loom_run_options.whole_answers): for a caller that reads only the
     * finished turn (a non-streamed chat completion). Its sub-agents'
     * calls still stream.
     */
    int whole_answers;
} loom_turn_options;

#define LOOM_TURN_OPTIONS_VERSION 1
#define LOOM_TURN_OPTIONS_INIT                                                 \
    {                                                                          \
        .version = LOOM_TURN_OPTIONS_VERSION                                   \
    }

/*
 * Prepares a turn: resolves the agent, model and tools, checks the
 * options (a bad request fails here, before anything is written), checks
 * that a continued conversation exists (a store read), and fixes the ids.
 * Nothing is written and no model is called. Errors: LOOM_EINVALID (bad
 * options: no input, an unknown tool_choice, a bad id), LOOM_ENOTFOUND
 * (unknown agent, model or conversation), LOOM_EIO from the store,
 * LOOM_ENOMEM. The turn holds a reference on s.
 */
int loom_turn_new(loom_turn **out, loom_session *s,
                  const loom_turn_options *opts);

/*
 * Runs a prepared turn to its end on the calling thread: creates the new
 * conversation or loads the continued one (retrying a busy store; a
 * failure there ends the turn failed with code "store_failed" before any
 * model call), runs the loop, stores the turn (also a failed or cancelled
 * one) and emits the final event. Returns 0 when the turn completed and
 * was stored, LOOM_ECANCELED when cancelled, else the error that failed it
 * (the run's, or the store's). Once only.
 */
int loom_turn_execute(loom_turn *t);

/*
 * loom_turn_new, then loom_turn_execute on a detached thread of its own,
 * which holds its own reference. *out is the caller's reference.
 */
int loom_turn_start(loom_turn **out, loom_session *s,
                    const loom_turn_options *opts);

/*
 * Asks the turn to stop; safe from any thread and from signal handlers.
 * Returns 1 when the cancel may still take effect (the loop had not
 * ended), 0 when it comes too late (the turn is storing or ended).
 */
int loom_turn_cancel(loom_turn *t);

/*
 * Answers a tool call of the turn that waits for approval (its
 * approval.required event; docs/agents.md "Approval and progress"):
 * approve non-zero runs it, else it is denied with reason (may be NULL),
 * which the model reads. The call may be the turn's own or one of a
 * sub-agent run below it (the event's run_id): the turn's own run is
 * looked at first, then its live sub-agent runs. Safe from any thread,
 * and from the turn's sink while it handles approval.required (`loom
 * run` asks there). LOOM_ENOTFOUND when no call of that id waits (never
 * asked, already answered, timed out, or its run is over); LOOM_EEXISTS
 * when it waits in several sub-agent runs (loom_turn_approve_in tells
 * them apart); LOOM_EINVALID for a NULL call_id.
 */
int loom_turn_approve(loom_turn *t, const char *call_id, int approve,
                      const char *reason);

/*
 * loom_turn_approve for the call call_id of the run run_id: the turn's
 * own, or one of its sub-agent runs still going (NULL: as
 * loom_turn_approve). LOOM_ENOTFOUND also when run_id is neither.
 */
int loom_turn_approve_in(loom_turn *t, const char *run_id, const char *call_id,
                         int approve, const char *reason);

/*
 * Answers the form id of an `mcp.elicitation` event of the turn (or of a
 * sub-agent run below it): action "accept" with content (an object; the
 * requested schema's defaults are filled in and it must then be valid
 * for it), "decline" or "cancel" (no content). Safe from any thread, and
 * from the turn's sink while it handles mcp.elicitation (`loom run` asks
 * there). LOOM_ENOTFOUND when no form of that id waits (never asked,
 * answered, timed out, run over); LOOM_EINVALID for a bad action or
 * content (the message says what).
 */
int loom_turn_answer_elicitation(loom_turn *t, const char *id,
                                 const char *action, const json_t *content);

/*
 * Stops the turn for a server's stop: a resumable turn (see
 * loom_turn_options.resumable) is cut short without storing the turn
 * or logging anything more, and stays in the store to resume; any other
 * turn is cancelled (loom_turn_cancel). Returns 1 when the turn will
 * resume, 0 otherwise. Any thread.
 */
int loom_turn_interrupt(loom_turn *t);

/*
 * A research turn's progress as JSON (caller's reference): {"phase"
 * (clarify, plan, research, report, done), "cycle", "max_cycles",
 * "researchers": [{call_id, task, status, sources, elapsed_ms}],
 * "resumed"}; NULL for another turn (or out of memory). Any thread.
 */
json_t *loom_turn_research_status(loom_turn *t);

/* Whether the turn runs a research agent (loom/config.h research). */
int loom_turn_is_research(const loom_turn *t);

/* Whether the turn, or a sub-agent run below it, waits for approval now
 * (1) or not (0); safe from any thread. A server keeps such a turn going
 * when its client leaves. */
int loom_turn_awaiting_approval(const loom_turn *t);

/* loom_turn_awaiting_approval, or a form of an mcp.elicitation event of
 * the turn or a sub-agent run below it waits for its answer. */
int loom_turn_awaiting_input(const loom_turn *t);

/* Whether run_id is the turn's run or one of its sub-agent runs going on
 * now (at any depth); safe from any thread. */
int loom_turn_has_run(const loom_turn *t, const char *run_id);

void loom_turn_ref(loom_turn *t);
/* Drops a reference; NULL is a no-op. The last one frees the turn. */
void loom_turn_free(loom_turn *t);

/* Constant for the turn's life. conversation_id is NULL without one. */
const char *loom_turn_id(const loom_turn *t);
const char *loom_turn_conversation_id(const loom_turn *t);
const char *loom_turn_model(const loom_turn *t); /* "provider/model" */
const char *loom_turn_agent(const loom_turn *t); /* NULL: no agent */
const char *loom_turn_user(const loom_turn *t);  /* NULL: anonymous */

/* 1 once the turn has ended: stored (or failed to be) and final event
 * logged. */
int loom_turn_ended(const loom_turn *t);

/*
 * The outcome (status, stored, errors, run) is readable from the `ending`
 * callback on, and by anyone once loom_turn_ended() is 1.
 *
 * RUNNING until then, then the turn's final status: the run's, except
 * that a turn whose store work failed is FAILED even when its loop
 * completed.
 */
loom_run_status loom_turn_status(const loom_turn *t);

/* Whether the turn is in the store, and why not (NULL when
 * it is, or with no store); the error code of a turn failed by loom
 * itself ("store_failed"), else NULL. Borrowed from the turn. */
int loom_turn_stored(const loom_turn *t);
const char *loom_turn_store_error(const loom_turn *t);
const char *loom_turn_error_code(const loom_turn *t);

/* The run, for its text, usage, finish reason and messages, once the
 * outcome is final (see above); NULL before. Borrowed from the turn. */
const loom_run *loom_turn_run(const loom_turn *t);

/* ---- the event log --------------------------------------------------- */

/*
 * One logged event, serialized once and immutable: text is the compact
 * JSON of loom_event_to_json() of the event (run.started carries the
 * conversation_id), reals with 15 significant digits. Only the text is
 * kept (a JSON tree would cost several times its size per event, for
 * as long as the turn is kept); loom_turn_event_json reads it back. A
 * few facts of it are noted beside the text, so a reader that needs only
 * them does not parse it.
 */
typedef struct {
    uint64_t seq;
    loom_event_type type;
    /* loom_event_depth() of the event: 0 for the run's own, > 0 for a
     * sub-agent's nested in its stream. */
    int depth;
    const char *type_name; /* "message.delta" */
    const char *text;
    /*
     * The run's own run.completed or run.failed (depth 0), which every
     * reader of a turn reads whole: its JSON, kept from when the text
     * was written: what loom_turn_event_json reads back, but for reals,
     * which have all their digits here. Immutable and borrowed like the
     * entry (json_incref is fine). NULL for other events.
     */
    const json_t *json;
    /* Lengths and offsets in 32 bits (an event's text is under 4 GiB):
     * a run keeps every entry, about a hundred for a short answer, and
     * its header is a third of each. */
    uint32_t text_len;
    /*
     * A message.delta or reasoning.delta: the delta_len bytes of text at
     * delta_at are the JSON string literal of its "delta" (quotes
     * included), as a compact dump writes that string. delta_len is 0
     * for other events, and when the string holds U+0000 (a reader takes
     * it up to there: parse text then).
     */
    uint32_t delta_at, delta_len;
} loom_turn_event;

/* The event's JSON, parsed from its text: a new reference the caller
 * frees, NULL when out of memory. Dumped again with 15 significant
 * digits (as the text was), it gives the text back. */
json_t *loom_turn_event_json(const loom_turn_event *e);

/* The seq of the last logged event (0: none); *ended (may be NULL) is 1
 * when no event will follow. */
uint64_t loom_turn_last_seq(loom_turn *t, int *ended);

/* The first logged event with a seq above after_seq, or NULL when there
 * is none yet. Borrowed: valid while the caller holds a reference. Seqs
 * have no gaps unless the log passed its limit. */
const loom_turn_event *loom_turn_next_event(loom_turn *t, uint64_t after_seq);

/* The logged event with this seq; NULL for 0 or one not logged yet. */
const loom_turn_event *loom_turn_event_at(loom_turn *t, uint64_t seq);

/*
 * Waits up to timeout_ms (< 0: forever) until an event after after_seq is
 * logged or the turn ended. 1 when so, 0 at the timeout.
 */
int loom_turn_wait(loom_turn *t, uint64_t after_seq, long timeout_ms);

/*
 * wake(payload) is called after every new logged event and at the end,
 * until loom_turn_unwatch with the same pair. 0, or LOOM_ENOMEM (the
 * watcher is then not added).
 */
int loom_turn_watch(loom_turn *t, loom_turn_wake_fn wake, void *payload);
void loom_turn_unwatch(loom_turn *t, loom_turn_wake_fn wake, void *payload);

#ifdef __cplusplus
}
#endif
#endif
