/*
 * Internal: sub-agents, agents run as tools (docs/agents.md "Sub-agents").
 *
 * A turn that a caller starts is the top of a tree of runs: every
 * sub-agent call starts a child turn of the same session, which may call
 * its own sub-agents. The tree (loom__agent_tree) is what they share: the
 * session, the limits of the top agent (max_depth, max_sub_runs) and the
 * count of runs started. Each run knows its place in it
 * (loom__run_place: tree, depth); the tool calls it starts get a copy of
 * that place (loom__tool_host, loom_tool_ctx.host), which the sub-agent
 * tool reads on its thread to start the child and through which it hands
 * back a report of the child (usage, each agent's share, calls made,
 * tool records) that the parent run merges on its own thread.
 *
 * Usage travels as JSON objects of integers in the "full" shape: every
 * token field, cost_micros, and priced_calls / unpriced_calls (the model
 * calls with and without a known cost), so sums stay exact and a cost is
 * shown only when every call of the share had one.
 */
#ifndef LOOM_AGENT_SUBAGENT_H
#define LOOM_AGENT_SUBAGENT_H

#include "agent/elicit.h"
#include "agent/gate.h"
#include "loom/session.h"

#include <jansson.h>
#include <stdint.h>

typedef struct loom__agent_tree loom__agent_tree;

/*
 * A tree for one top-level turn of session s (a reference is taken on
 * it), with the top agent's limits (<= 0: the defaults 3 and 50).
 */
int loom__agent_tree_new(loom__agent_tree **out, loom_session *s, int max_depth,
                         int max_sub_runs);
/* Another reference (thread-safe); NULL is returned as it is. */
loom__agent_tree *loom__agent_tree_ref(loom__agent_tree *t);
/* Drops a reference; NULL is a no-op. The last one frees the tree. */
void loom__agent_tree_free(loom__agent_tree *t);

/* The tree's session (borrowed) and limits. */
loom_session *loom__agent_tree_session(const loom__agent_tree *t);
int loom__agent_tree_max_depth(const loom__agent_tree *t);
int loom__agent_tree_max_runs(const loom__agent_tree *t);
/*
 * The conversation of the tree's top turn, where its children's runs are
 * stored (NULL: none, nothing is stored). Set by the top turn before it
 * runs (id is copied; 0 or LOOM_ENOMEM); read by any thread after.
 */
int loom__agent_tree_set_conversation(loom__agent_tree *t, const char *id);
const char *loom__agent_tree_conversation(const loom__agent_tree *t);
/*
 * A new conversation made with the top turn's save
 * (loom_turn_options.create_with_save) is deferred: not in the store yet.
 * Whoever stores something in it first creates it, once:
 * loom__agent_tree_conversation_write calls write(arg, create) with
 * create 1 while the conversation is deferred (write must then create it
 * before, or with, what it writes; its 0 ends the deferral) and 0 after,
 * one such write at a time while deferred. Deferred is set by the top
 * turn before it runs; the rest from any thread.
 */
void loom__agent_tree_defer_conversation(loom__agent_tree *t);
int loom__agent_tree_conversation_deferred(loom__agent_tree *t);
int loom__agent_tree_conversation_write(loom__agent_tree *t,
                                        int (*write)(void *arg, int create),
                                        void *arg);
/* The forms the tree's calls put to whoever runs the turn (elicit.h).
 * Borrowed; NULL for a NULL tree. */
loom__elicits *loom__agent_tree_elicits(const loom__agent_tree *t);
/*
 * The top turn's user settings (loom_turn_options.user_settings), which
 * its children follow too (memory off holds for the whole tree). Set by
 * the top turn before it runs (a reference is taken; NULL: none); read by
 * any thread after.
 */
void loom__agent_tree_set_user_settings(loom__agent_tree *t, json_t *settings);
const json_t *loom__agent_tree_user_settings(const loom__agent_tree *t);
/*
 * Whom the tree's model calls are counted to (loom_turn_options.account
 * of its top turn), kept on every usage row of the tree. Set by the top
 * turn before it runs (the strings are copied; 0 or LOOM_ENOMEM); read
 * by any thread after (borrowed from the tree).
 */
int loom__agent_tree_set_account(loom__agent_tree *t,
                                 const loom_usage_account *a);
const loom_usage_account *loom__agent_tree_account(const loom__agent_tree *t);
/* Counts one more sub-agent run: 1 when the tree's limit allows it. Any
 * thread. */
int loom__agent_tree_take_run(loom__agent_tree *t);

/*
 * The tree's live sub-agent runs, so that an answer to a call waiting for
 * approval reaches the run it belongs to (docs/agents.md "Approval and
 * progress"). A child turn joins while its run executes, naming the run
 * and the call that started it (parent_id, parent_call_id), and leaves
 * before its run is freed: run is borrowed meanwhile. Thread-safe
 * (children come and go on tool threads). Join: 0 or LOOM_ENOMEM.
 */
int loom__agent_tree_join(loom__agent_tree *t, loom_run *run,
                          const char *parent_id, const char *parent_call_id);
void loom__agent_tree_leave(loom__agent_tree *t, const loom_run *run);
/* Whether run_id is a live run started, through any number of levels,
 * by the run above (an id). */
int loom__agent_tree_has(loom__agent_tree *t, const char *above,
                         const char *run_id);
/* Whether the call call_id of run run_id waits for a form's answer, or a
 * live run started by it, or one below it, waits for approval or a
 * form's answer now: that call's time does not count toward its timeout
 * meanwhile (toolexec.c). */
int loom__agent_tree_call_waits(loom__agent_tree *t, const char *run_id,
                                const char *call_id);
/* How many calls of the live runs below above wait for approval. */
size_t loom__agent_tree_waiting(loom__agent_tree *t, const char *above);
/*
 * loom_run_approve on a live run below above: the run run_id, or (run_id
 * NULL) the one whose call call_id waits. LOOM_ENOTFOUND when no such
 * run or call; LOOM_EEXISTS when call_id waits in several runs (run_id
 * tells them apart); else what loom_run_approve says.
 */
int loom__agent_tree_approve(loom__agent_tree *t, const char *above,
                             const char *run_id, const char *call_id,
                             int approve, const char *reason);

#define LOOM__SUB_DEFAULT_MAX_DEPTH 3
#define LOOM__SUB_DEFAULT_MAX_RUNS 50

/* Where a run sits: what it tells the tool calls it starts. Borrowed. */
typedef struct {
    loom__agent_tree *tree; /* NULL: a bare run, sub-agent tools refuse */
    int depth;              /* 0: the top */
    const char *run_id;
    const char *agent; /* may be NULL */
    uint32_t index;    /* the run's event index when its tools start */
    loom__spend *spend; /* the run's budget, its children's parent; or NULL */
    /* The model of the run's call that asked for its tools ("provider/
     * model"), which their side calls use (loom_tool_sample); NULL:
     * none. */
    const char *model;
} loom__run_place;

/* A tool call's copy of its run's place, owned by the call's thread. */
struct loom__tool_host {
    loom__agent_tree *tree; /* a reference, or NULL */
    int depth;
    char *run_id;
    char *agent;
    uint32_t index;
    loom__spend *spend; /* a reference, or NULL */
    char *model;        /* the run's model (loom__run_place) */
    json_t *report; /* set by a sub-agent tool (loom__run_report) */
};
typedef struct loom__tool_host loom__tool_host;

/* Fills h from p (NULL: an empty host). 0 or LOOM_ENOMEM (h is then
 * cleared). */
int loom__tool_host_init(loom__tool_host *h, const loom__run_place *p);
void loom__tool_host_clear(loom__tool_host *h);

/*
 * Makes the tool that runs agent (of s) as a sub-agent: named name (NULL:
 * the agent's), with description (NULL: the agent's, else a generic one)
 * and the {task, context} parameters. own_ref: the tool holds a reference
 * on s (an embedder's registry); else it borrows s and runs only under
 * turns of s (the session's own registry, which s holds). model and
 * max_iterations (NULL, 0: the agent's) apply to every child it starts.
 * The tool is added to reg. Errors: LOOM_EEXISTS (a tool of that name),
 * LOOM_ENOTFOUND (no such agent), LOOM_EINVALID (a name that is no tool
 * name), LOOM_ENOMEM.
 */
int loom__agent_tool_add(loom_tool_registry *reg, loom_session *s,
                         const char *agent, const char *name,
                         const char *description, const char *model,
                         int max_iterations, int own_ref);

/*
 * Whether tool runs an agent (made by loom__agent_tool_add, or a research
 * run's research_agent, research.h): such a call
 * that overruns its timeout is cancelled and given the tool cancel grace
 * to end with the child's error and partial answer (toolexec.h).
 */
int loom__tool_is_agent(const loom_tool *tool);

/*
 * Runs a child turn for a tool call (ctx, on its thread), as the
 * sub-agent tool does: checks the tree's limits (a refusal is written to
 * out and its code returned: the call's error), starts o (of session s,
 * o->agent named; user, keys and cancel come from ctx; any_session: s
 * need not be the tree's), runs it on this thread, leaves its report on
 * the call's host and passes its documents and cost to the call. When it
 * ran, 0 is returned whatever its outcome: *child_out is the child (the
 * caller's reference) and *child_rc loom_turn_execute's answer.
 */
int loom__sub_run(const loom_tool_ctx *ctx, loom_session *s, int any_session,
                  loom_turn_options *o, loom_buf *out, loom_turn **child_out,
                  int *child_rc);
/* A failed child (rc its answer) as the call's error in out: "agent 'x'
 * failed: ..." with its partial answer. Returns the call's code. */
int loom__sub_failure(loom_buf *out, const char *agent, loom_turn *t, int rc);

/* ---- usage in the full shape ------------------------------------------ */

/* u and its priced/unpriced call counts as a full usage object. */
json_t *loom__usage_full(const loom_usage *u, int priced, int unpriced);
/* Reads a full usage object back (missing fields: 0). */
void loom__usage_from_full(const json_t *j, loom_usage *u, int *priced,
                           int *unpriced);
/*
 * by (an object, agent -> full usage) gains u for agent: added to what
 * it holds. 0 or LOOM_ENOMEM.
 */
int loom__by_agent_add(json_t *by, const char *agent, const loom_usage *u,
                       int priced, int unpriced);
/* The public shape of by: each agent's usage as usage events show it
 * (cost_micros only when every call of that share had a cost). */
json_t *loom__by_agent_public(const json_t *by);

#endif
