/*
 * The store and tools of `loom serve` and `loom chat` (served.h): one
 * setup, so the two never drift apart in what a turn can use.
 */
#include "cli/served.h"
#include "cli/cli.h"
#include "loom/memory.h"

#include <stdio.h>
#include <string.h>

int cli_served_open(cli_served *s, const loom_config *cfg, const char *db,
                    const char *cmd, const loom_mcp_setup *mcp)
{
    int rc;

    memset(s, 0, sizeof(*s));
    if (mcp)
        s->servers = mcp->servers;
    if ((rc = cli_open_store(&s->store, cfg, db, cmd)) != 0)
        return rc;
    if (cli_mcp_store_init(&s->ms, cfg, s->store) != 0) {
        fprintf(stderr, "loom %s: %s\n", cmd, loom_error_last());
        return CLI_FAILED;
    }
    s->ms_ready = 1;
    if (mcp) {
        s->ms.setup.servers = mcp->servers;
        s->ms.setup.elicitation = mcp->elicitation;
        s->ms.setup.per_user = mcp->per_user;
        s->ms.setup.background = mcp->background;
    }
    if (loom_tools_new_from_config_with(&s->tools, cfg, &s->ms.setup) != 0) {
        fprintf(stderr, "loom %s: config: %s\n", cmd, loom_error_last());
        return CLI_USAGE;
    }
    /* The memory tools keep users' facts in the store (offered per run,
     * to runs that have a user). */
    if (loom_tools_add_memory(s->tools, s->store) != 0) {
        fprintf(stderr, "loom %s: %s\n", cmd, loom_error_last());
        return CLI_FAILED;
    }
    return 0;
}

void cli_served_close(cli_served *s)
{
    loom_tool_registry_free(s->tools);
    s->tools = NULL;
    loom_mcp_set_free(s->servers);
    s->servers = NULL;
    if (s->ms_ready)
        cli_mcp_store_free(&s->ms);
    s->ms_ready = 0;
    loom_store_free(s->store);
    s->store = NULL;
}
