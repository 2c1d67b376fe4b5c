/*
 * The list of loom's built-in tools. Each built-in lives in its own file
 * (builtin_<name>.c, web_fetch.c, web_search.c) and exposes one internal function that
 * registers it; this file only calls them in a fixed order, so the order
 * the model sees them in is stable.
 */
#include "core/error.h"
#include "loom/config.h"
#include "loom/mcp.h"
#include "loom/tools.h"
#include "tools/http_tools.h"
#include "tools/web_search.h"

/* Defined in builtin_time.c and web_fetch.c; tools/ has no private header
 * for them. */
int loom__tools_add_get_time(loom_tool_registry *reg);
int loom__tools_add_web_fetch(loom_tool_registry *reg);

int loom_tools_add_builtins(loom_tool_registry *reg)
{
    int rc;

    if (!reg)
        return loom__error_set(LOOM_EINVALID, "registry must not be NULL");
    if ((rc = loom__tools_add_get_time(reg)) != 0 ||
        (rc = loom__tools_add_web_fetch(reg)) != 0)
        return rc;
    return loom__tools_add_web_search(reg);
}

int loom_tools_new_from_config(loom_tool_registry **out,
                               const loom_config *cfg)
{
    return loom_tools_new_from_config_with(out, cfg, NULL);
}

int loom_tools_new_from_config_with(loom_tool_registry **out,
                                    const loom_config *cfg,
                                    const loom_mcp_setup *setup)
{
    loom_tool_registry *reg = NULL;
    int rc;

    if (!out || !cfg)
        return loom__error_set(LOOM_EINVALID, "NULL argument");
    *out = NULL;
    if ((rc = loom_tool_registry_new(&reg)) != 0 ||
        (rc = loom_tools_add_builtins(reg)) != 0 ||
        (rc = loom__tools_add_http_tools(reg, cfg)) != 0 ||
        (rc = loom_tools_add_mcp_with(reg, cfg, setup)) != 0) {
        loom_tool_registry_free(reg);
        return rc;
    }
    *out = reg;
    return 0;
}
