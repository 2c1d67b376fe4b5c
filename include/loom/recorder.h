/*
 * loom/recorder.h: turns a run's event stream into a storable turn.
 *
 * A recorder is a sink that sits in front of another sink: it notes what
 * the store needs and the events do not leave behind in the run itself
 * (where in the assistant text each tool call appeared, each tool's
 * outcome and duration, each model call's usage, the tool records of
 * `tool.metric` events and the sources of `citation` events), then
 * forwards every event unchanged. After the run, loom_recorder_turn()
 * fills a loom_turn_record ready for loom_store_save_turn().
 *
 * Memory is bounded: at most LOOM_RECORDER_MAX_TOOL_RECORDS tool records
 * and LOOM_RECORDER_MAX_CITATIONS citations are kept (references to the
 * events' data, which the run already bounds); later ones are counted,
 * not kept, and loom_recorder_turn() logs a warning saying how many.
 *
 * A data policy (loom_recorder_set_policy) narrows what the turn stores,
 * never what the events carry: the sink behind the recorder still gets
 * every event unchanged.
 */
#ifndef LOOM_RECORDER_H
#define LOOM_RECORDER_H

#include "run.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_recorder loom_recorder;

/* Tool records kept (as many as a run keeps, LOOM_RUN_MAX_TOOL_RECORDS). */
#define LOOM_RECORDER_MAX_TOOL_RECORDS 1024
/* Citations kept (a run numbers at most 999 sources). */
#define LOOM_RECORDER_MAX_CITATIONS 1000

/* The version of loom_data_policy this header describes. */
#define LOOM_DATA_POLICY_VERSION 1
/* The content a tool result not stored keeps (docs/store.md). */
#define LOOM_DATA_POLICY_RESULT_MARKER "[result not stored]"

/*
 * What of a turn the store keeps (an agent's `data_policy`, see
 * docs/store.md). Zero stores everything. Applied to the run's output
 * messages and tool records:
 * - omit_text: assistant text, reasoning and provider state are dropped;
 *   an assistant message left with no text and no tool calls is dropped
 *   (the store's placeholder then carries a turn's status).
 * - omit_tool_calls: every tool call and its result are dropped.
 * - omit_tool_results: results stay (so each kept call keeps its answer)
 *   with LOOM_DATA_POLICY_RESULT_MARKER as content and no summary.
 * - tools: only calls of these tools, and their results and tool
 *   records, are stored; the others are dropped together. NULL: every
 *   tool; non-NULL with tools_len 0: none.
 * Tool records (`tool.metric` data, which hold the arguments) follow the
 * calls: dropped with them.
 */
typedef struct {
    unsigned int version; /* LOOM_DATA_POLICY_VERSION, or 0 */
    int omit_text;
    int omit_tool_calls;
    int omit_tool_results;
    const char *const *tools;
    size_t tools_len;
} loom_data_policy;

/* inner may have a NULL emit (record only). */
int loom_recorder_new(loom_recorder **out, loom_sink inner);
/* The sink to give the run (payload is the recorder). */
loom_sink loom_recorder_sink(loom_recorder *rec);

/*
 * Notes ev as the recorder's sink would, without passing it on: for
 * events a run sent before (a resumed run's, read back from a store),
 * whose calls, usage and tool records belong to the turn it stores.
 * Events must come in seq order, before the run's new ones.
 */
void loom_recorder_note(loom_recorder *rec, const loom_event *ev);

/*
 * Sets the policy later loom_recorder_turn() calls apply (NULL: store
 * everything); policy is copied. LOOM_EINVALID for a version newer than
 * LOOM_DATA_POLICY_VERSION, LOOM_ENOMEM; on error the policy in force is
 * kept.
 */
int loom_recorder_set_policy(loom_recorder *rec,
                             const loom_data_policy *policy);

/*
 * Fills *turn from what was recorded and from the finished run: output
 * messages and the agent that wrote each (loom_run_message_agent),
 * status (ok, error or cancelled with the run's error as
 * reason), finish reason, tool outcomes, call offsets, usage rows, tool
 * records and citations (NULL when none were seen), the run's usage
 * with its descendants' (run_usage, run_cost_known) and its context
 * summary (loom_run_summary: NULL when the run made none, so the stored
 * one is kept), output messages and tool records narrowed by the data
 * policy (copies the recorder owns). The caller sets conversation_id,
 * input and agent, and for a sub-agent's run parent_run_id,
 * parent_call_id and depth. Pointers are borrowed from rec and run:
 * valid until either is freed.
 * LOOM_ENOMEM when recording ran out of memory.
 */
int loom_recorder_turn(loom_recorder *rec, const loom_run *run,
                       loom_turn_record *turn);

void loom_recorder_free(loom_recorder *rec);

#ifdef __cplusplus
}
#endif
#endif
