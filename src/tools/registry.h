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

/*
 * Puts tool, a tool of another registry (a pointer that registry gave),
 * in reg as well: the two share it, and it lives until the last registry
 * holding it is freed. LOOM_EEXISTS when reg has a tool of that name.
 */
int loom__tool_registry_share(loom_tool_registry *reg, const loom_tool *tool);

/*
 * Tools whose list changes while loom runs (an MCP server's). add puts
 * the source's current tools in reg (a snapshot being built) with
 * loom__tool_registry_share; when wait is set, the snapshot needs them
 * (its run names them): add first waits for a listing that is due (the
 * first, or one after the list changed), within its own bound, and adds
 * what there is when that fails (a failure is no error of add's: it
 * returns only LOOM_ENOMEM). generation changes whenever what add would
 * add changes, and only grows. The source's tools are named starting
 * with prefix (copied): any such name is its to give. free (may be
 * NULL) is called with arg when the last registry holding the source is
 * freed. Every function may be called from any thread.
 */
typedef struct {
    int (*add)(void *arg, loom_tool_registry *reg, int wait);
    uint64_t (*generation)(void *arg);
    void (*free)(void *arg);
    void *arg;
    const char *prefix;
} loom__tool_source;

/*
 * Adds a source to reg (while reg is being built, as tools are added).
 * On failure free is not called: the caller keeps arg. LOOM_EINVALID
 * (no add, generation or prefix), LOOM_ENOMEM.
 */
int loom__tool_registry_add_source(loom_tool_registry *reg,
                                   const loom__tool_source *src);

/* Makes dst hold every source of src too (dst being built). LOOM_ENOMEM;
 * the sources carried before a failure stay. */
int loom__tool_registry_carry_sources(loom_tool_registry *dst,
                                      const loom_tool_registry *src);

/* How many sources reg holds, and the prefix of the i-th (borrowed;
 * NULL past the end). */
size_t loom__tool_registry_source_count(const loom_tool_registry *reg);
const char *loom__tool_registry_source_prefix(const loom_tool_registry *reg,
                                              size_t i);

/* The sum of reg's sources' generations (0 without sources): it changes
 * when a snapshot would differ. */
uint64_t loom__tool_registry_generation(const loom_tool_registry *reg);

/* The generation a snapshot was built at (0 for a registry that is its
 * own snapshot). A snapshot whose value differs from its registry's
 * loom__tool_registry_generation() is out of date. */
uint64_t loom__tool_registry_built_at(const loom_tool_registry *snap);

/*
 * loom_tool_registry_snapshot() for a run that offers the tools named
 * (names, n: names and `prefix*` patterns; NULL: every tool): it waits
 * only for the sources one of the names is for, and adds the current
 * tools of the others. *out is NULL when reg is.
 */
int loom__tool_registry_snapshot(loom_tool_registry **out,
                                 const loom_tool_registry *reg,
                                 const char *const *names, size_t n);

#endif
