/*
 * What `loom serve` and `loom chat` run turns with (served.c): the store
 * and the tools `loom serve` offers, set up and torn down the same way by
 * both, so a conversation held in `loom chat` has the tools and memories
 * it would have through the server.
 */
#ifndef LOOM_CLI_SERVED_H
#define LOOM_CLI_SERVED_H

#include "cli/mcp_store.h"
#include "loom/config.h"
#include "loom/mcp.h"
#include "loom/store.h"
#include "loom/tools.h"

typedef struct {
    loom_store *store;         /* own */
    loom_tool_registry *tools; /* own */
    loom_mcp_set *servers;     /* own: the setup's, NULL: none */
    cli_mcp_store ms;          /* MCP servers' OAuth credentials, in store */
    int ms_ready;
} cli_served;

/*
 * Opens the store at db (NULL: cfg's server.db) and makes the tools
 * `loom serve` offers: the config's tools and MCP servers, made with mcp
 * (NULL: none; its servers, elicitation, per_user and background are
 * used, the credentials are the store's), and the memory tools keeping
 * users' facts in the store. mcp->servers becomes s's (s->servers), also
 * on failure. cfg is borrowed and must outlive s; s must not move once
 * made. Returns 0, or says what failed ("loom <cmd>: ...") and returns
 * CLI_FAILED, or CLI_USAGE for tools the config gets wrong. Either way s
 * is to be closed with cli_served_close.
 */
int cli_served_open(cli_served *s, const loom_config *cfg, const char *db,
                    const char *cmd, const loom_mcp_setup *mcp);

/* Frees what cli_served_open made: the tools and the servers' set (every
 * MCP server ended), then the credentials and the store they are kept
 * in. A zeroed s is safe to close, and so is one closed already. */
void cli_served_close(cli_served *s);

#endif
