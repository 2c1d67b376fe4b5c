/*
 * The list of loom's built-in tools. Each built-in lives in its own file
 * (builtin_<name>.c) and exposes one internal function that registers it;
 * this file only calls them in a fixed order, so the order the model sees
 * them in is stable.
 */
#include "loom/tools.h"
#include "core/error.h"

/* Defined in builtin_time.c; tools/ has no private header yet. */
int loom__tools_add_get_time(loom_tool_registry *reg);

int loom_tools_add_builtins(loom_tool_registry *reg)
{
    if (!reg)
        return loom__error_set(LOOM_EINVALID, "registry must not be NULL");
    return loom__tools_add_get_time(reg);
}
