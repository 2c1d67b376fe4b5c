/*
 * Internal: what sub-agents (subagent.c) need of the session layer
 * beyond loom/session.h: a reference on a session, and child turns.
 *
 * A child turn is a turn of an agent started by a sub-agent tool call:
 * prepared and run like any turn (the agent's prompt, tools, model and
 * limits, the session's hooks), but with no conversation of its own
 * (nothing is loaded; its events and report go to its parent; when it
 * ends it is stored as a run linked to its parent, under the top turn's
 * conversation, per its own agent's data policy), in the tree of its
 * parent, one level deeper, and with a cancel flag that follows the
 * call's.
 */
#ifndef LOOM_AGENT_SESSION_INTERNAL_H
#define LOOM_AGENT_SESSION_INTERNAL_H

#include "agent/subagent.h"
#include "loom/session.h"

void loom__session_ref(loom_session *s);

/*
 * The provider for one side call to model (a run's model: "provider/
 * model", or with the session's own provider the id sent to it), from
 * any thread: *use is what to call; *owned the router made for it (the
 * caller frees it; NULL with the session's own provider); *mreq its
 * request options, borrowed from *owned. Errors of loom_router_new.
 */
int loom__session_model(loom_session *s, const char *model,
                        loom_provider **owned, loom_provider **use,
                        loom_model_request_options *mreq);

typedef struct {
    loom__agent_tree *tree;    /* the parent's tree; a reference is taken */
    int depth;                 /* the child's: its parent's + 1 */
    const loom_cancel *cancel; /* the child's cancel follows it; it must
                                * outlive the turn */
    /* The parent's run and the call that starts the child, stored with
     * the child's run (copied; may be NULL). */
    const char *parent_run_id;
    const char *parent_call_id;
    /* The parent run's budget, which the child's calls count toward
     * (gate.h; a reference is taken); NULL: none. */
    loom__spend *spend;
} loom__turn_child;

/* loom_turn_new for a child turn (above); same errors. */
int loom__turn_new_child(loom_turn **out, loom_session *s,
                         const loom_turn_options *opts,
                         const loom__turn_child *child);

/* The log entry a turn makes of ev (what loom_turn_next_event returns),
 * made alone: for tests of the log's readers. NULL when out of memory.
 * loom__turn_event_free frees it. */
loom_turn_event *loom__turn_event_of(const loom_event *ev);
void loom__turn_event_free(loom_turn_event *e);

#endif
