/*
 * Internal: the config's http_tools alone (http_tools.c), for the
 * builders that add the config's MCP servers their own way (builtins.c).
 */
#ifndef LOOM_TOOLS_HTTP_TOOLS_H
#define LOOM_TOOLS_HTTP_TOOLS_H

#include "loom/config.h"
#include "loom/tools.h"

/* Registers each of cfg's http_tools in reg. LOOM_EINVALID, LOOM_ENOMEM,
 * or the registry's error (a name taken). */
int loom__tools_add_http_tools(loom_tool_registry *reg, const loom_config *cfg);

#endif
