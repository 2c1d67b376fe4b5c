/*
 * loom/memory.h: the memory tools, and whether a run offers them.
 *
 * memory_store and memory_retrieve let a model keep short facts about the
 * user it talks to and find them again in later conversations. They keep
 * them in the store (loom_store_memory_* in loom/store.h), scoped to the
 * run's user (loom_tool_ctx.user_id): a run without a user cannot use
 * them, and a user never sees another's memories.
 *
 * Memory can be turned off for an agent or by a user (the tools are then
 * not offered at all, not merely refused). The registry is shared and
 * immutable, so "not offered" is decided per run: the run setup asks
 * loom_memory_tool_offered() for each tool name it is about to offer and
 * leaves the memory tools out of the run's tool_names when it says no. See
 * docs/memory.md.
 */
#ifndef LOOM_MEMORY_H
#define LOOM_MEMORY_H

#include "common.h"
#include "store.h"
#include "tools.h"
#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_MEMORY_TOOL_STORE "memory_store"
#define LOOM_MEMORY_TOOL_RETRIEVE "memory_retrieve"

/*
 * Registers memory_store and memory_retrieve in reg. store is borrowed:
 * it must outlive the registry (the tools call it from worker threads;
 * a store is thread-safe). LOOM_EINVALID for a NULL argument,
 * LOOM_EEXISTS when a tool of either name is already there (then neither
 * is added).
 */
int loom_tools_add_memory(loom_tool_registry *reg, loom_store *store);

/* 1 when name is one of the memory tools, else 0. */
int loom_memory_is_tool(const char *name);

/*
 * Whether one settings value leaves memory on. Accepted shapes:
 * NULL (on: the default), a JSON boolean, an object with "enabled"
 * (boolean) or with "memory" (a boolean or an object with "enabled");
 * any other object (settings about other things) leaves it on. So an
 * agent option `memory: false`, a user setting {"memory": {"enabled":
 * false}} and a tool's config settings {"enabled": false} all say off.
 * Returns 1 (on), 0 (off) or LOOM_EINVALID when a value has the wrong
 * type (a message says which); callers treat anything but 1 as off.
 */
int loom_memory_enabled(const json_t *settings);

/*
 * Whether a run may offer the tool called name. 1 for any tool that is
 * not a memory tool. For memory_store and memory_retrieve, 1 only when
 * user_id is set (not NULL, not "") and loom_memory_enabled() is 1 for
 * each of agent_settings (the agent's memory option), user_settings (the
 * user's settings) and the tool's entry in tool_settings (the config's
 * `tools` object: name -> settings); each may be NULL. Otherwise 0, or
 * LOOM_EINVALID for a malformed setting (treat it as 0).
 */
int loom_memory_tool_offered(const char *name, const char *user_id,
                             const json_t *agent_settings,
                             const json_t *user_settings,
                             const json_t *tool_settings);

#ifdef __cplusplus
}
#endif
#endif
