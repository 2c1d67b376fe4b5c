/*
 * Internal: references on a tool registry (registry.c).
 *
 * The run loop starts each tool call on a thread of its own, and a call
 * that overruns its timeout is abandoned there and may outlive the run
 * and whoever made the registry. So every started call holds a reference
 * on the registry its tool comes from (execute, payload and settings stay
 * valid) and drops it with loom_tool_registry_free when its thread ends;
 * the last reference frees the registry and its tools' payloads.
 */
#ifndef LOOM_TOOLS_REGISTRY_H
#define LOOM_TOOLS_REGISTRY_H

#include "loom/tools.h"

/*
 * Takes one more reference on reg (thread-safe) and returns it; NULL is
 * returned as it is. loom_tool_registry_free drops it. reg may be const:
 * the count is not part of what the registry holds (as json_incref).
 */
loom_tool_registry *loom__tool_registry_ref(const loom_tool_registry *reg);

#endif
