/*
 * Internal: preparing and executing the tool calls of one model turn.
 *
 * run.c hands over every call of a turn as a job. prepare() resolves the
 * tool, parses and validates the arguments; a job that fails there already
 * has its result (the model reads it and recovers). execute() runs the
 * remaining jobs in parallel on at most `width` threads and reports each
 * start and end through a callback that is always called on the caller's
 * thread, so events stay single-threaded.
 */
#ifndef LOOM_AGENT_TOOLEXEC_H
#define LOOM_AGENT_TOOLEXEC_H

#include "loom/llm.h"
#include "loom/tools.h"

typedef struct {
    const loom_tool_call *call; /* borrowed from the assistant message */
    const loom_tool *tool;      /* NULL when the name is unknown */
    json_t *args;               /* parsed arguments; owned */
    /* Outcome, filled by prepare() on failure or by execute(). */
    int done;
    int failed;
    const char *stage; /* "lookup", "arguments", "validation", "execution" */
    char *error;       /* the failure alone, for events; owned */
    char *output;      /* what the model reads; owned */
    char *summary;     /* the tool's summary of it (loom_tool_ctx), owned;
                        * NULL when none */
    int truncated;     /* output was cut to the limit */
    size_t output_size; /* bytes the tool produced before any cut */
    double duration_ms;
} loom__tool_job;

typedef struct {
    const json_t *settings; /* config `tools` object, may be NULL */
    loom_cancel *cancel;
    size_t max_result;  /* bytes of one result the model is shown */
    size_t max_error;   /* bytes of one error message */
} loom__tool_exec_opts;

/*
 * Resolves job->call against the offered tools (find(name) returns NULL
 * for a tool that is not offered) and validates the arguments. On failure
 * the job is done, with its error result; available is the list shown
 * for an unknown tool ("a, b").
 */
void loom__tool_job_prepare(loom__tool_job *job, const loom_tool *tool,
                            const char *available,
                            const loom__tool_exec_opts *opts);

/* Called on the caller's thread: started (done == 0) or finished. */
typedef void (*loom__tool_notice_fn)(loom__tool_job *job, int done,
                                     void *payload);

/*
 * Executes every job not already done, at most width at a time, and
 * returns when all are done. Returns 0, or LOOM_ENOMEM/LOOM_ERROR when
 * threads could not be started (the jobs that could not run are failed
 * with that error, never left without a result).
 */
int loom__tools_execute(loom__tool_job *jobs, size_t n, int width,
                        const loom__tool_exec_opts *opts,
                        loom__tool_notice_fn notice, void *payload);

void loom__tool_job_clear(loom__tool_job *job);

#endif
