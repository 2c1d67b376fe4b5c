/*
 * Internal: preparing and executing the tool calls of one model turn.
 *
 * run.c hands over every call of a turn as a job. prepare() resolves the
 * tool, parses and validates the arguments; a job that fails there already
 * has its result (the model reads it and recovers). execute() runs the
 * remaining jobs in parallel, at most `width` at a time, each on a thread
 * of its own, and reports each start and end through a callback that is
 * always called on the caller's thread, so events stay single-threaded.
 *
 * A job that overruns its timeout (past its grace_ms, when it has one),
 * or that does not stop within a grace period after the run is
 * cancelled, is abandoned: its result becomes an
 * error at once and execute() goes on without it. The abandoned thread
 * keeps running until the tool returns; everything it touches (arguments,
 * settings, buffers, its cancel flag) is a copy it owns, so the run may
 * end and be freed meanwhile. Only the tool itself (its execute function
 * and payload) is shared, and it belongs to the registry: each started
 * call holds a reference on opts->registry until its thread ends, so the
 * registry outlives every call, abandoned or not (loom/tools.h).
 */
#ifndef LOOM_AGENT_TOOLEXEC_H
#define LOOM_AGENT_TOOLEXEC_H

#include "agent/subagent.h"
#include "loom/llm.h"
#include "loom/run.h"
#include "loom/tools.h"

/* How long tools get to stop after the run is cancelled. */
#define LOOM__TOOL_CANCEL_GRACE_MS 1000

/*
 * The bound on a running call's events that the caller has not emitted
 * yet (loom_tool_progress, loom_tool_delta, loom__tool_ctx_event): at
 * most this many events and bytes (a delta's text, or an event's compact
 * JSON). An event that would pass either drops the call's oldest pending
 * droppable events (tool.progress, tool.delta, message.delta,
 * reasoning.delta) until it fits; when none is left to drop, a droppable
 * event is dropped instead, and any other (the tool.*, run.* and usage
 * events a sub-agent forwards) is queued past the bound: those are never
 * lost, and there are only as many as the sub-agent's own limits let it
 * make (loom__tool_ctx_event is loom's own; tools send only droppable
 * ones). The next event of the call that is emitted carries `dropped`:
 * how many of the call's events were lost just before it. A single
 * delta larger than the byte bound is cut to it.
 */
#define LOOM__TOOL_EVENTS_PENDING_MAX 64
#define LOOM__TOOL_EVENT_BYTES_MAX (64 * 1024)

typedef struct {
    const loom_tool_call *call; /* borrowed from the assistant message */
    const loom_tool *tool;      /* NULL when the name is unknown */
    json_t *args;               /* parsed arguments; owned */
    long timeout_ms;            /* abandon after this long; <= 0: never */
    long grace_ms; /* > 0: past timeout_ms the call is first cancelled and
                    * given this long to end with its own result (a
                    * sub-agent's error and partial answer, its usage
                    * reported), which then fails with code ETIMEDOUT;
                    * abandoned only past that */
    /* Outcome, filled by prepare() on failure or by execute(). */
    int done;
    int failed;
    int code;          /* the failure's LOOM_E* code; 0 on success */
    const char *code_name; /* the failure's code as events name it when
                            * no LOOM_E* one says it (TOOL_NOT_ENABLED);
                            * NULL: loom_error_name(code) */
    const char *stage;     /* "lookup", "enablement", "arguments",
                            * "validation", "execution", "hook", "blocked",
                            * "approval" */
    char *error;       /* the failure alone, for events; owned */
    char *output;      /* what the model reads; owned */
    char *summary;     /* the tool's summary of it (loom_tool_ctx), owned;
                        * NULL when none */
    int truncated;     /* output was cut to the limit */
    size_t output_size; /* bytes the tool produced before any cut */
    double duration_ms;
    int64_t started_at_ms; /* wall clock (Unix ms) when it was started */
    json_t *documents; /* documents the tool reported (array), or NULL */
    json_t *images;    /* images the tool gave (loom_tool_ctx.images:
                        * array, not yet checked), or NULL */
    int64_t cost_micros; /* what the tool said the call cost */
    int abandoned;     /* timed out or cancelled; its thread may still run */
    json_t *report;    /* a sub-agent's report of its child (subagent.h),
                        * or NULL */
    /* Owned by run.c, freed by clear(). */
    int loop;          /* a loop tool (plan.c): 0 when not */
    int own;           /* answered by the tool turn's caller (toolturn.h) */
    int executed;      /* the tool ran (not skipped, blocked or failed
                        * before it started) */
    int skipped;       /* a before-tool hook answered in its place */
    int denied;        /* it needed approval and was denied */
    char *key;         /* canonical "name\nargs" for duplicate checks */
    json_t *model_args; /* the arguments before built-in additions */
    size_t excluded_added; /* seen ids added to excluded_ids */
    json_t *documents_added; /* ids new to the run's seen documents */
    /* The progress steps the call reported ({label, icon, status}), at
     * most LOOM__TOOL_PROGRESS_STEPS_MAX; NULL: none. progress_dropped
     * counts the steps past that. */
    json_t *progress;
    size_t progress_dropped;
} loom__tool_job;

/* Progress steps a call's record keeps. */
#define LOOM__TOOL_PROGRESS_STEPS_MAX 32

/*
 * Called on the caller's thread with an event a running job sent (type,
 * data: stolen), in the order the job sent it, before that job's finish
 * notice; data has the event's own fields only (the caller adds the
 * call's id and tool). `dropped` is set in data when events were lost to
 * the bound.
 */
typedef void (*loom__tool_event_fn)(loom__tool_job *job, loom_event_type type,
                                    json_t *data, void *payload);

typedef struct {
    /* Where the jobs' tools come from: each started call holds a
     * reference on it until its thread ends. NULL: no reference taken
     * (the caller then keeps the tools alive past every call). */
    const loom_tool_registry *registry;
    const json_t *settings; /* config `tools` object, may be NULL */
    loom_cancel *cancel;    /* the run's */
    size_t max_result;  /* bytes of one result the model is shown */
    size_t max_error;   /* bytes of one error message */
    /* The run's user and that user's keys (loom_tool_ctx); each started
     * call gets copies of its own. May be NULL. */
    const char *user_id;
    const json_t *user_keys;
    /* The model sees images: each started call gets an empty array of
     * its own as loom_tool_ctx.images, which comes back as the job's
     * images. 0: ctx.images is NULL. */
    int vision;
    /* Takes the events running jobs send, with loom__tools_execute's
     * payload; NULL: jobs get no events channel (loom_tool_ctx.events is
     * NULL) and what they send is dropped. */
    loom__tool_event_fn on_event;
    /* Where the run sits in its tree of agent runs; each started call
     * gets a copy (loom_tool_ctx.host). NULL: none. */
    const loom__run_place *place;
} loom__tool_exec_opts;

/*
 * The arguments of a call as the model wrote them, parsed: "" and "{}"
 * are {}; NULL (err says why) when the text is not JSON.
 */
json_t *loom__tool_args_parse(const char *raw, json_error_t *err);

/*
 * Resolves job->call against the offered tools (find(name) returns NULL
 * for a tool that is not offered) and validates the arguments. On failure
 * the job is done, with its error result; available is the list shown
 * for an unknown tool ("a, b"). Arguments already in job->args (an
 * agent's preprocessing gave them) are validated without parsing.
 */
void loom__tool_job_prepare(loom__tool_job *job, const loom_tool *tool,
                            const char *available,
                            const loom__tool_exec_opts *opts);

/*
 * Ends job as failed: error (cut to max_error) is what events show, and
 * output (NULL: "Error: <error>") what the model reads.
 */
void loom__tool_job_fail(loom__tool_job *job, const char *stage, int code,
                         const char *error, const char *output,
                         size_t max_error);

/* Called on the caller's thread: started (done == 0) or finished. */
typedef void (*loom__tool_notice_fn)(loom__tool_job *job, int done,
                                     void *payload);

/*
 * Executes every job not already done, at most width at a time, and
 * returns when all are done (finished or abandoned). Jobs not started
 * when the run is cancelled fail without running. Returns 0, or
 * LOOM_ENOMEM when the bookkeeping could not be allocated (every job is
 * then failed with that error, never left without a result).
 */
int loom__tools_execute(loom__tool_job *jobs, size_t n, int width,
                        const loom__tool_exec_opts *opts,
                        loom__tool_notice_fn notice, void *payload);

void loom__tool_job_clear(loom__tool_job *job);

/*
 * Sends an event of any type from a running call to its run (what
 * loom_tool_progress and loom_tool_delta do; a sub-agent tool forwards
 * its child run's events so). Takes data (an object). Safe from any
 * thread while the call's execute() runs. Returns 0 when queued;
 * LOOM_ENOTFOUND when ctx has no events channel or the run has abandoned
 * the call; LOOM_ETOOLARGE when the bound (above) left no room for a
 * droppable event; and
 * LOOM_EINVALID for data that is not an object. The event is dropped in
 * every failing case.
 */
int loom__tool_ctx_event(const loom_tool_ctx *ctx, loom_event_type type,
                         json_t *data);

#endif
