/*
 * Internal: what the session layer (session.c) needs of a run beyond
 * loom/run.h: building it in two steps and failing it before it ran.
 *
 * struct loom_run is run.c's own. The parts of a run live in their own
 * modules, which do not see it: the tool turn (toolturn.h) and the plan
 * (plan.h).
 */
#ifndef LOOM_AGENT_RUN_INTERNAL_H
#define LOOM_AGENT_RUN_INTERNAL_H

#include "loom/run.h"

/*
 * A run built in two steps, for a caller that learns the history after
 * the options (the session layer: a bad request fails at once, before the
 * store is read). loom_run_new() is create + begin.
 *
 * loom__run_create checks and applies the options (errors as
 * loom_run_new, but no history is needed). loom__run_begin gives the run
 * its history (copied, not empty) and what the conversation carries from
 * earlier runs (may be NULL; strings borrowed until the run is freed):
 * the context summary with the messages it covers, used unless the
 * options set one, the plan, used unless the options set one, and the
 * user's memories for the system prompt, likewise. Once, before
 * loom_run_execute.
 */
typedef struct {
    const char *summary;
    size_t summary_covers;
    const json_t *plan;
    const char *memories; /* the memories section; used unless the
                           * options give one */
} loom__run_carried;

int loom__run_create(loom_run **out, const loom_run_options *opts);
int loom__run_begin(loom_run *run, const loom_messages *history,
                    const loom__run_carried *carried);

/*
 * Ends a run that never executed as failed: emits run.started and a
 * run.failed whose error has code (NULL: the name of rc) and the message
 * of loom_error_last(). For a turn whose store work failed before the
 * model call.
 */
void loom__run_fail(loom_run *run, int rc, const char *code);

/*
 * Places the run in a tree of agent runs (subagent.h), before it
 * executes: its tool calls see the tree and depth (a reference on tree
 * is taken), count_sub_calls says whether its sub-agents' calls count
 * toward its iterations, its cancel flag follows parent (NULL: none;
 * it must outlive the run), and its model calls count toward the budget
 * of its parent run, spend (gate.h; a reference is taken; NULL: none).
 */
struct loom__agent_tree;
struct loom__spend;
void loom__run_set_place(loom_run *run, struct loom__agent_tree *tree,
                         int depth, int count_sub_calls,
                         const loom_cancel *parent, struct loom__spend *spend);

/* Whether the run's call call_id waits for approval now; any thread. */
int loom__run_approval_waits(const loom_run *run, const char *call_id);

/*
 * What a finished run reports to the run whose sub-agent call started
 * it: {run_id, agent, status, usage (full, subagent.h, descendants
 * included), by_agent (agent -> full usage), calls (its model calls,
 * tool calls and the counted calls of its own children), records (its
 * tool records, each with run_id and agent)}. NULL when out of memory.
 */
json_t *loom__run_report(const loom_run *run);

/*
 * For agents built on the run loop (research.c), from the run's own
 * thread (its hooks):
 *
 * loom__run_emit sends one event of the run (seq and index the run's;
 * data's reference is taken, NULL: no fields).
 * loom__run_citation_map is the run's map of numbered sources (NULL:
 * citations off); the run reads it from the same thread only.
 * loom__run_complete_with adds key: value (the reference is taken) to the
 * run.completed event's fields, over the run's own ("status" too).
 * 0 or LOOM_ENOMEM.
 */
void loom__run_emit(loom_run *run, loom_event_type type, json_t *data);
struct loom__citations;
struct loom__citations *loom__run_citation_map(const loom_run *run);
int loom__run_complete_with(loom_run *run, const char *key, json_t *value);
/* From on_no_tool_calls: the run fails with message instead of going on
 * or ending (copied). */
void loom__run_hook_fail(loom_run *run, const char *message);
/* The text the current model call has streamed so far. Borrowed. */
const char *loom__run_turn_text(const loom_run *run);

/*
 * Resuming a run from what a step left (research runs, research.h),
 * from the run's own thread.
 *
 * loom__run_set_step: fn(run, what, payload) is called after each step
 * of the loop, unless the run is being cancelled: "calls" once a model
 * call's message with tool calls is in (before they run), "results"
 * once their results are, "continue" once a call without tool calls was
 * answered by going on. Set it before the run executes.
 * loom__run_base_len: where the run's own messages start in the
 * messages it sends (after the system prompt, history and input);
 * loom__run_all_len and loom__run_all_at read those messages (*own: the
 * message is the run's, not a note loom added for one call).
 * loom__run_snapshot: the run's counters, usage and numbered sources, the
 * seq of its last event ("seq": the events up to it are the ones this
 * state accounts for) and what its spend has spent ("spend", gate.h) as
 * JSON (NULL when out of memory), for loom__run_restore.
 * loom__run_restore, after loom__run_begin and before loom_run_execute:
 * appends msgs (own[i]: the run's message, else a note) after the
 * history, sets what snap says (its spend, once open, goes on from what
 * snap's had spent) and the last event seq; the run then
 * sends no run.started, and first runs the calls of the last message
 * when it is a message with tool calls. 0 or LOOM_ENOMEM.
 */
typedef void (*loom__run_step_fn)(loom_run *run, const char *what,
                                  void *payload);
void loom__run_set_step(loom_run *run, loom__run_step_fn fn, void *payload);
size_t loom__run_base_len(const loom_run *run);
size_t loom__run_all_len(const loom_run *run);
const loom_message *loom__run_all_at(const loom_run *run, size_t i, int *own);
uint64_t loom__run_seq(const loom_run *run);
json_t *loom__run_snapshot(const loom_run *run);
int loom__run_restore(loom_run *run, const json_t *snap,
                      const loom_messages *msgs, const unsigned char *own,
                      uint64_t seq);

#endif
