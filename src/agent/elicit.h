/*
 * Internal: the forms a turn's tool calls put to whoever runs the turn
 * (loom_tool_elicit, loom/tools.h; docs/mcp.md "Elicitation").
 *
 * A tree of agent runs (subagent.h) has one list of them, shared by the
 * top turn and every sub-agent run below it, so an answer given to the
 * turn reaches a call of any of its runs. An item waits under its id
 * ("elicit_<n>") with the schema it asks for; the calling thread sleeps
 * on the list's condition until the answer, its cancel flag, or its
 * deadline.
 */
#ifndef LOOM_AGENT_ELICIT_H
#define LOOM_AGENT_ELICIT_H

#include <jansson.h>

typedef struct loom__elicits loom__elicits;

/* A new, closed list (nobody answers): 0 or LOOM_ENOMEM. */
int loom__elicits_new(loom__elicits **out);
void loom__elicits_free(loom__elicits *e);

/*
 * Whether someone answers the turn's forms (the turn's option), and how
 * long a form waits for its answer before it is answered "cancel"
 * (timeout_ms <= 0: LOOM_RUN_DEFAULT_APPROVAL_TIMEOUT_MS).
 */
void loom__elicits_set_open(loom__elicits *e, int open, long timeout_ms);
int loom__elicits_open(loom__elicits *e);

/*
 * Answers the form id: action "accept" with content (an object: the
 * schema's defaults are filled in, then it must be valid for the
 * schema), "decline" or "cancel" (content must be absent or null).
 * Errors: LOOM_ENOTFOUND (no form of that id waits), LOOM_EINVALID (a
 * bad action or content; the message says what), LOOM_ENOMEM.
 */
int loom__elicits_answer(loom__elicits *e, const char *id, const char *action,
                         const json_t *content);

/* Whether the call call_id of run run_id waits for a form's answer. */
int loom__elicits_call_waits(loom__elicits *e, const char *run_id,
                             const char *call_id);
/* Whether any call of run run_id waits for a form's answer. */
int loom__elicits_run_waits(loom__elicits *e, const char *run_id);
/* How many forms wait. */
size_t loom__elicits_waiting(loom__elicits *e);

#endif
