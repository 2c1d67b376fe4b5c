/*
 * Internal: what a tool's settings say happens once one of its calls has
 * ended (docs/agents.md "Tool rules"), read from the run's tool settings
 * (the config's `tools` with the agent's `tool_options` over them):
 *
 *   wrap_result: "...{result}..."   the model reads the result wrapped
 *   then_force: tool | {tool, when} the next model call must call tool
 *                                   (when: only if that boolean argument
 *                                   of the call was true)
 *   history: summary                later model calls read a reduced
 *                                   version of the result
 *
 * Pure functions of the settings and the call; run.c applies them.
 */
#ifndef LOOM_AGENT_TOOLRULES_H
#define LOOM_AGENT_TOOLRULES_H

#include <jansson.h>

/*
 * The result the model reads of a call to tool that succeeded with
 * result: *out is the tool's wrap_result with {result} filled in (the
 * caller frees), or NULL when the tool has none. LOOM_ENOMEM.
 */
int loom__rules_wrap(char **out, const json_t *settings, const char *tool,
                     const char *result);

/* The tool the next model call must call after a call to tool that
 * succeeded with args (then_force), or NULL. Borrowed from settings. */
const char *loom__rules_then_force(const json_t *settings, const char *tool,
                                   const json_t *args);

/* Whether results of tool are reduced in later model calls (history:
 * summary). */
int loom__rules_history_summary(const json_t *settings, const char *tool);

/*
 * What later model calls read instead of a result of tool: its summary
 * (NULL or "": none) in a short frame, else a placeholder. The caller
 * frees; NULL when out of memory.
 */
char *loom__rules_reduced(const char *tool, const char *summary);

#endif
