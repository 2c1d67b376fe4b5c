/*
 * Internal: the approval gate of a run (approval.c).
 *
 * A tool call that needs a person's approval (docs/agents.md "Approval
 * and progress") is added to the gate before its approval.required event
 * goes out; the run's thread then waits on the gate while any other
 * thread (the server's, or the CLI's sink on the run's own thread before
 * the wait begins) answers it. The gate belongs to the run and lives as
 * long as it: answers for a call that is not waiting are refused
 * (LOOM_ENOTFOUND), so a late answer never reaches a later turn.
 */
#ifndef LOOM_AGENT_APPROVAL_H
#define LOOM_AGENT_APPROVAL_H

#include "loom/cancel.h"

#include <stddef.h>

/* Bytes of a reason kept (longer ones are cut on a character boundary). */
#define LOOM__APPROVAL_REASON_MAX 1000

typedef struct loom__approvals loom__approvals;

int loom__approvals_new(loom__approvals **out);
void loom__approvals_free(loom__approvals *a);

/* Makes call_id wait for an answer (copied). LOOM_ENOMEM. */
int loom__approvals_add(loom__approvals *a, const char *call_id);

/*
 * Answers the waiting call call_id: approve non-zero approves, else
 * denies with reason (may be NULL; copied, cut). Safe from any thread.
 * LOOM_ENOTFOUND when no call of that id waits (never asked, already
 * answered, or given up); LOOM_ENOMEM.
 */
int loom__approvals_answer(loom__approvals *a, const char *call_id, int approve,
                           const char *reason);

/* Calls waiting for an answer now. Safe from any thread. */
size_t loom__approvals_waiting(loom__approvals *a);
/* Whether call_id waits for its answer now (1) or not (0). */
int loom__approvals_has(loom__approvals *a, const char *call_id);

/*
 * Waits until every added call is answered, cancel is set (polled) or
 * deadline (monotonic ms; <= 0: none) passes.
 */
void loom__approvals_wait(loom__approvals *a, const loom_cancel *cancel,
                          double deadline);

/*
 * Forgets call_id and returns its answer: 1 approved, 0 denied (*reason:
 * the reason, caller frees, NULL when none), -1 not answered.
 */
int loom__approvals_take(loom__approvals *a, const char *call_id,
                         char **reason);

#endif
