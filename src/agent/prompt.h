/*
 * Internal: the system prompt of a run, assembled in one order
 * (prompt.c; docs/agents.md "System prompt").
 *
 * The parts are borrowed from whoever holds them (the run's options, its
 * offered tools, its plan); loom__prompt_system_text makes the text from
 * them at each call, so a run that changes a part (a new plan, another
 * agent after a handoff) calls it again and compares.
 */
#ifndef LOOM_AGENT_PROMPT_H
#define LOOM_AGENT_PROMPT_H

#include "agent/plan.h"
#include "loom/config.h"
#include "loom/message.h"

#include <stdint.h>

/* The memories section shows at most this many memories, in at most
 * this many bytes (their quoted text). */
#define LOOM__PROMPT_MEMORIES_MAX 20
#define LOOM__PROMPT_MEMORIES_BYTES 4096

/* Bytes of the whole system text. */
#define LOOM__PROMPT_SYSTEM_MAX (16 << 20)

typedef struct {
    /* The agent's prompt, or the request's own in its place; NULL or
     * empty: none. */
    const char *base;
    /* The tools offered, in the order offered: each one's usage rule is
     * its entry's selection_rule in docs, else the `selection_rule` of
     * its settings in tool_settings (name -> settings object). */
    const loom_tool_def *tools;
    size_t ntools;
    const json_t *tool_settings;
    const loom_agent_tool_doc *docs;
    size_t ndocs;
    /* The user's own instructions (their settings); NULL or empty:
     * none. */
    const char *user_instructions;
    /* The memories section (loom__prompt_memories), NULL: none. */
    const char *memories;
    /* The plan, shown when planning is on; NULL: off. */
    const loom__plan *plan;
} loom__prompt_parts;

/*
 * The system text, its sections apart by a blank line, in this order:
 * base; <tool_usage> with one "- name: rule" line per offered tool that
 * has a rule; <user_instructions> with the user's own instructions; the
 * memories section; the <plan> section. *text (the
 * caller's) is "" when there is nothing. LOOM_ETOOLARGE past
 * LOOM__PROMPT_SYSTEM_MAX, LOOM_ENOMEM.
 */
int loom__prompt_system_text(char **text, const loom__prompt_parts *p);

/* The registry entry for tool name, or NULL. */
const loom_agent_tool_doc *loom__prompt_doc(const loom_agent_tool_doc *docs,
                                            size_t ndocs, const char *name);

/*
 * The memories section for the memories found (an array of objects with
 * "content", most recent first, as loom_store_memory_search gives them)
 * when the user has total in all: each memory as a JSON string on its
 * line (a memory's text can never pass for loom's own words), as many as
 * fit LOOM__PROMPT_MEMORIES_MAX and LOOM__PROMPT_MEMORIES_BYTES, then how
 * many are left out. *out (the caller's) is NULL when there are none.
 * LOOM_ENOMEM.
 */
int loom__prompt_memories(char **out, const json_t *memories, int64_t total);

#endif
