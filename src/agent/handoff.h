/*
 * Internal: the tools of an agent's handoffs (handoff.c).
 *
 * A handoff is offered to the model as the tool transfer_to_<agent>
 * (docs/agents.md "Handoffs"). The tools are definitions only: the run
 * answers their calls itself on the loop's thread (the tool turn's `own`
 * tools, toolturn.h) and switches agents after the turn, so their execute
 * function is never called and nothing of them outlives the run. One set
 * per agent the run is: a handoff builds the next agent's set.
 */
#ifndef LOOM_AGENT_HANDOFF_H
#define LOOM_AGENT_HANDOFF_H

#include "loom/run.h"

/* The tool name of a handoff is this prefix and the agent's name. */
#define LOOM__HANDOFF_PREFIX "transfer_to_"

typedef struct loom__handoffs loom__handoffs;

/*
 * The tools of handoffs h[0..n) (n may be 0: none), in that order.
 * LOOM_EINVALID when an agent's name does not make a tool name
 * ([a-zA-Z0-9_-], at most 64 bytes with the prefix) or is given twice,
 * LOOM_ENOMEM.
 */
int loom__handoffs_new(loom__handoffs **out, const loom_run_handoff *h,
                       size_t n);
void loom__handoffs_free(loom__handoffs *hs);

size_t loom__handoffs_count(const loom__handoffs *hs);
/* Tool i, borrowed from hs. */
const loom_tool *loom__handoffs_tool(const loom__handoffs *hs, size_t i);

/* The agent tool hands off to when it is one of hs's tools, else NULL;
 * borrowed from hs. */
const char *loom__handoffs_target(const loom__handoffs *hs,
                                  const loom_tool *tool);

#endif
