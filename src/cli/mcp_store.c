/*
 * Where the loom command keeps MCP servers' OAuth credentials: sealed in
 * loom's store (loom_store_mcp_credentials_load/save), so a token got by
 * `loom mcp login` or by a run survives restarts and is shared by `loom
 * serve`, `loom run` and `loom mcp`. `loom serve` lends its open store;
 * the others open the config's store (server.db) the first time a
 * server needs its credentials, so a run without OAuth servers never
 * touches it. The key is the config's server.secret_key, else the
 * store's own default (loom/store.h).
 */
#include "cli/mcp_store.h"
#include "core/error.h"
#include "loom/log.h"

#include <string.h>

/* The store, opened on first need. Under mu. */
static loom_store *store_locked(cli_mcp_store *m)
{
    if (m->store || m->failed)
        return m->store;
    if (loom_store_open(&m->store, m->db ? m->db : m->cfg->server.db) != 0 ||
        loom_store_set_secret(m->store, m->cfg->server.secret_key) != 0) {
        loom_warn("mcp: OAuth credentials are not kept between runs: %s",
                  loom_error_last());
        loom_store_free(m->store);
        m->store = NULL;
        m->failed = 1;
        return NULL;
    }
    m->own = 1;
    return m->store;
}

static int load(void *arg, const char *server, const char *user, char **json)
{
    cli_mcp_store *m = arg;
    loom_store *st;
    int rc;

    *json = NULL;
    pthread_mutex_lock(&m->mu);
    st = store_locked(m);
    rc = st ? loom_store_mcp_credentials_load(st, server, user, json)
            : loom__error_set(LOOM_ENOTFOUND, "no store");
    pthread_mutex_unlock(&m->mu);
    return rc;
}

static int save(void *arg, const char *server, const char *user,
                const char *json)
{
    cli_mcp_store *m = arg;
    loom_store *st;
    int rc;

    pthread_mutex_lock(&m->mu);
    st = store_locked(m);
    rc = st ? loom_store_mcp_credentials_save(st, server, user, json)
            : loom__error_set(LOOM_EIO, "no store");
    pthread_mutex_unlock(&m->mu);
    return rc;
}

int cli_mcp_store_init(cli_mcp_store *m, const loom_config *cfg, loom_store *st)
{
    memset(m, 0, sizeof(*m));
    m->cfg = cfg;
    m->store = st;
    pthread_mutex_init(&m->mu, NULL);
    m->credentials.load = load;
    m->credentials.save = save;
    m->credentials.arg = m;
    m->setup.credentials = &m->credentials;
    return st ? loom_store_set_secret(st, cfg->server.secret_key) : 0;
}

void cli_mcp_store_free(cli_mcp_store *m)
{
    if (m->own)
        loom_store_free(m->store);
    m->store = NULL;
    pthread_mutex_destroy(&m->mu);
}
