/*
 * The loom command's keeper of MCP OAuth credentials (mcp_store.c): the
 * loom_mcp_credentials of every MCP server it makes, sealed in loom's
 * store; and `loom mcp login`, which fills them (mcp_login.c).
 */
#ifndef LOOM_CLI_MCP_STORE_H
#define LOOM_CLI_MCP_STORE_H

#include "loom/config.h"
#include "loom/mcp.h"
#include "loom/store.h"

#include <pthread.h>

typedef struct {
    const loom_config *cfg;
    const char *db;    /* the store to open, NULL: cfg's server.db */
    loom_store *store; /* lent, or opened on first need (own) */
    int own;
    int failed; /* opening it failed: credentials last one process */
    pthread_mutex_t mu;
    loom_mcp_credentials credentials; /* arg: this struct */
    loom_mcp_setup setup;             /* the credentials, no authorizer */
} cli_mcp_store;

/*
 * Sets m up for cfg (borrowed, must outlive m). st: the open store to
 * use (its secret is set from cfg's server.secret_key here), or NULL to
 * open cfg's server.db on first need. m must not move once servers use
 * it. LOOM_ENOMEM.
 */
int cli_mcp_store_init(cli_mcp_store *m, const loom_config *cfg,
                       loom_store *st);
/* Closes the store when m opened it. After every server using m ended. */
void cli_mcp_store_free(cli_mcp_store *m);

/*
 * `loom mcp login NAME` (mcp_login.c): authorizes loom for the config's
 * HTTP server NAME through a person's browser, waiting at most timeout_s
 * for it, with creds keeping the tokens: user's own (a store user id),
 * or the server's when user is NULL. A CLI_ exit code (message printed).
 */
int cli_mcp_login(const loom_config *cfg, const char *name, long timeout_s,
                  const loom_mcp_credentials *creds, const char *user);

#endif
