/*
 * Internal: the tool turn, the server tool calls of one model turn from
 * the model's request to the results it reads (toolturn.c).
 *
 * A loom__toolturn lives as long as its run and keeps what the calls of
 * every turn share: the hook chain (loom's policies around the caller's
 * hooks), each tool's failures and whether it is blocked (the strike
 * budget), the successful calls (duplicate suppression), the documents
 * seen, and a telemetry record per call. It does not see the run: run.c
 * lends it the tools offered, hands it each assistant message with tool
 * calls and appends the results it gives back; events go out through the
 * emit callback run.c gives it.
 */
#ifndef LOOM_AGENT_TOOLTURN_H
#define LOOM_AGENT_TOOLTURN_H

#include "agent/approval.h"
#include "agent/emit.h"
#include "agent/plan.h"
#include "agent/toolexec.h"
#include "loom/agent.h"
#include "loom/run.h"

/* The tools a run offers; borrowed, all of it outlives the tool turn. */
typedef struct {
    const loom_tool *const *offered; /* server tools, then loop tools */
    size_t nserver;                  /* entries of offered */
    /* Every definition offered: defs[0..nserver) are offered's, the
     * rest the caller's client tools. */
    const loom_tool_def *defs;
    size_t ndefs;
    const char *available; /* the offered names, "a, b" */
} loom__toolset;

/* The offered server tool (or loop tool) of that name, or NULL. */
const loom_tool *loom__toolset_server(const loom__toolset *set,
                                      const char *name);

/* Whether name is one of the client tools (the caller runs it). */
int loom__toolset_is_client(const loom__toolset *set, const char *name);

typedef struct {
    loom_run *run; /* handed to hooks (loom_tool_hook_call.run) only */
    const loom__toolset *tools;
    loom__plan *plan;            /* runs the loop tools among tools->offered */
    const loom_tool_hook *hooks; /* the caller's, in order; borrowed */
    size_t hooks_len;
    /* Where the server tools come from: each started call holds a
     * reference on it (toolexec.h). */
    const loom_tool_registry *registry;
    const json_t *settings; /* config `tools` object, may be NULL */
    loom_cancel *cancel;    /* the run's */
    size_t max_result;      /* bytes of one result the model is shown */
    size_t max_error;       /* bytes of one error message */
    long timeout_ms;        /* a call's, unless its settings say; <= 0:
                             * none */
    int concurrency;        /* calls running at once, at least 1 */
    const char *user_id;    /* the run's user, may be NULL */
    const json_t *user_keys;
    int vision;      /* tools get loom_tool_ctx.images (toolexec.h) */
    loom__emit emit; /* tool.started/completed/failed/metric, plan */
    /*
     * Called with each tool.progress event's data (call_id, tool, label,
     * icon, status) on the run's thread, before it is emitted (the
     * agent's on_tool_progress hook): the run's own calls' steps, and its
     * sub-agents' (at any depth), which also carry the nested fields
     * (run_id, parent_run_id, parent_call_id, agent, depth). NULL: none.
     */
    void (*on_progress)(const json_t *progress, void *payload);
    /*
     * Takes a side call's usage that a running call sent
     * (loom_tool_sample: a usage event's data, with purpose, model and
     * `usage` in the full shape, subagent.h) on the run's thread, in
     * place of emitting it (one that has a `purpose`); tool is the
     * call's tool. NULL: such events go out as they came.
     */
    void (*on_usage)(const json_t *usage, const char *tool, void *payload);
    void *usage_payload;
    /*
     * Tools the caller answers itself on the loop's thread, as the loop
     * tools are (the run's handoffs): own(tool) says whether tool is one
     * of them; answer(job) gets each such call once it is prepared and
     * past the before-tool hooks, and ends it done (output, or failed).
     * Exempt from duplicate suppression and timeouts. NULL own: none.
     */
    int (*own)(const loom_tool *tool, void *payload);
    void (*answer)(loom__tool_job *job, void *payload);
    void *own_payload;
    /*
     * Whether a call needs approval before it runs (the agent's
     * approval_required hook), with its validated arguments; NULL or
     * LOOM_APPROVAL_DEFAULT: the tool's `approval` setting decides.
     */
    loom_approval (*approval_required)(const loom_tool_call *call,
                                       const json_t *args, void *payload);
    void *agent_payload; /* for on_progress and approval_required */
    /* Where calls that need approval wait (the run's), and for how long
     * (<= 0: no limit). */
    loom__approvals *approvals;
    long approval_timeout_ms;
    /*
     * Argument preprocessing, on the run's thread, for each call of an
     * offered tool (payload is rules_payload). preprocess: the agent's
     * preprocess_tool_arguments (loom/agent.h), NULL: none. repair: asks
     * model (a tool's repair_arguments) to turn raw into arguments;
     * *args gets them, or stays NULL when the repair failed. NULL: no
     * repairs.
     */
    loom_args_action (*preprocess)(const loom_tool_call *call, json_t **args,
                                   loom_buf *error, void *payload);
    void (*repair)(const loom_tool *tool, const char *model, const char *raw,
                   json_t **args, void *payload);
    void *rules_payload;
    /* The run's place in its tree of agent runs (read when each turn's
     * calls start); NULL: none. */
    const loom__run_place *place;
} loom__toolturn_options;

typedef struct loom__toolturn loom__toolturn;

/* Builds the hook chain and the policies' tables; o and what it points
 * to are borrowed for the tool turn's life. */
int loom__toolturn_new(loom__toolturn **out, const loom__toolturn_options *o);
void loom__toolturn_free(loom__toolturn *t);

/*
 * Runs the server tool calls of one turn (assistant, asked for by model
 * call `iteration`) through the hooks and policies, in parallel up to the
 * concurrency, and reports each through the emit callback. Client calls
 * are left out. *jobs gets the server calls' outcomes in call order (the
 * caller frees them with loom__toolturn_jobs_free), each with the output
 * the model reads; *njobs their count. Every call gets an outcome: only
 * running out of memory fails.
 */
int loom__toolturn_run(loom__toolturn *t, const loom_message *assistant,
                       int iteration, loom__tool_job **jobs, size_t *njobs);

void loom__toolturn_jobs_free(loom__tool_job *jobs, size_t n);

/* The code of a call refused because its tool's should_use said no. */
#define LOOM__TOOL_NOT_ENABLED "TOOL_NOT_ENABLED"

/* Whether job ended TOOL_NOT_ENABLED. */
int loom__tool_job_not_enabled(const loom__tool_job *job);

/* The tools the next request offers: the offered ones less those blocked
 * for their failures. A new array whenever that changes, so the request
 * cache sees it; borrowed from t. */
int loom__toolturn_request_tools(loom__toolturn *t, const loom_tool_def **defs,
                                 size_t *n);

/*
 * The run's toolset changed (the set the options point to now holds
 * another agent's tools): each tool's failure count and block start
 * again, the next request takes the new tools, and later calls run with
 * concurrency and timeout_ms (as in the options). Duplicate suppression,
 * documents and records go on. LOOM_ENOMEM (nothing changed then).
 */
int loom__toolturn_retool(loom__toolturn *t, int concurrency, long timeout_ms);

/* Later calls read settings (borrowed, may be NULL) as the tools'
 * settings: a handoff's agent has its own tool_options. */
void loom__toolturn_set_settings(loom__toolturn *t, const json_t *settings);

/* Later calls take their tools from registry (borrowed): the tools were
 * built again from a new snapshot (retool follows). */
void loom__toolturn_set_registry(loom__toolturn *t,
                                 const loom_tool_registry *registry);

/* The calls' records and the documents seen; borrowed from t. */
const json_t *loom__toolturn_records(const loom__toolturn *t);
const json_t *loom__toolturn_documents(const loom__toolturn *t);

/* {id, name, arguments} of a call; NULL when out of memory. */
json_t *loom__tool_call_json(const loom_tool_call *c);

#endif
