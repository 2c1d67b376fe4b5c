/*
 * Internal: research runs (docs/research.md).
 *
 * A research run is a run of the loop whose agent is research.c's: its
 * hooks drive the phases (clarification, plan, supervisor cycles, the
 * report) through the loop's model calls, and its own tools
 * (research_agent, think_tool, generate_report) are what the supervisor
 * may call. research_agent runs a researcher sub-agent per call, in
 * parallel within one cycle. The session makes one research object per
 * research turn and frees it with the turn.
 */
#ifndef LOOM_AGENT_RESEARCH_H
#define LOOM_AGENT_RESEARCH_H

#include "loom/run.h"
#include "loom/session.h"

typedef struct loom__research loom__research;

/*
 * Makes the research of one turn of session s and points ro (the turn's
 * run options, already set up for the agent and model) at it: its
 * system prompt, tools, hooks, limits and citations. Settings are cfg's
 * `research` section with overrides (an object of the same keys; NULL:
 * none) over it. A supervisor model whose context window (ro's; 0:
 * unknown, allowed) is below min_context_tokens is refused.
 * Errors: LOOM_EINVALID (a bad override key or value, a window too
 * small: the message names the window and the minimum), LOOM_ENOMEM.
 */
int loom__research_new(loom__research **out, loom_session *s,
                       const loom_config *cfg, const json_t *overrides,
                       loom_run_options *ro);

/* Frees it once the run is freed; NULL is a no-op. */
void loom__research_free(loom__research *r);

/* Whether tool is a research run's research_agent (a researcher
 * sub-agent per call: loom__tool_is_agent counts it). */
int loom__research_tool_is_agent(const loom_tool *tool);

/* Checks per-request overrides (as loom__research_new would) without
 * making anything: 0 or LOOM_EINVALID naming the key. */
int loom__research_check_overrides(const json_t *overrides);

/*
 * Keeping a research run in the store (docs/store.md#research-runs), so
 * that it resumes after a stop. loom__research_keep, once the run has
 * its history (loom__run_begin): after each step the run's new
 * messages, the research's state and the run's counters are written in
 * one transaction, and each researcher's row as it starts and ends (its
 * result, citations, documents and usage), in the research_runs row
 * run_id that st holds (begun by the caller). 0 or LOOM_ENOMEM.
 *
 * loom__research_resume, after loom__research_keep, from what
 * loom_store_research_get gave (with the researchers): the run gets its
 * messages and counters back and its events continue after the last
 * stored seq; a research_agent call whose researcher had ended answers
 * from its row without running it. Sends research.resumed. 0,
 * LOOM_EPROTO for a stored message it cannot read, LOOM_ENOMEM.
 *
 * loom__research_status: {"phase" (clarify, plan, research, report,
 * done), "cycle", "max_cycles", "researchers": [{call_id, task, status
 * (running, completed, failed, interrupted), sources, elapsed_ms}],
 * "resumed"}; any thread. NULL when out of memory.
 */
int loom__research_keep(loom__research *r, loom_run *run, loom_store *st,
                        const char *run_id);
int loom__research_resume(loom__research *r, loom_run *run,
                          const json_t *stored);
json_t *loom__research_status(loom__research *r);

#endif
