/*
 * Sealed secrets in the SQLite backend: the rows of `mcp_credentials`
 * (migration 12), one per MCP server and user, each holding bytes the
 * front sealed (secrets.c). The backend never sees a key or a plain text.
 */
#include "core/error.h"
#include "store/sqlite_internal.h"

#include <stdlib.h>
#include <string.h>

static const char sql_get[] = "SELECT sealed FROM mcp_credentials "
                              "WHERE server = ?1 AND user_id = ?2";
static const char sql_put[] =
    "INSERT INTO mcp_credentials (server, user_id, sealed, updated_at) "
    "VALUES (?1, ?2, ?3, ?4) ON CONFLICT (server, user_id) DO UPDATE "
    "SET sealed = excluded.sealed, updated_at = excluded.updated_at";

int loom__sqlite_mcp_credentials_get(loom_store *st, const char *server,
                                     const char *user_id, unsigned char **out,
                                     size_t *len)
{
    loom__sqlite_conn *c = NULL;
    sqlite3_stmt *s = NULL;
    int src, rc;

    *out = NULL;
    *len = 0;
    if ((rc = loom__sqlite_begin(st, 0, &c)) != 0)
        return rc;
    src = sqlite3_prepare_v2(loom__sqlite_db(c), sql_get, -1, &s, NULL);
    b_text(s, 1, server, &src);
    b_text(s, 2, user_id, &src);
    if (src == SQLITE_OK)
        src = sqlite3_step(s);
    if (src == SQLITE_ROW) {
        const void *v = sqlite3_column_blob(s, 0);
        int n = sqlite3_column_bytes(s, 0);

        if (n > 0 && v && (*out = malloc((size_t)n))) {
            memcpy(*out, v, (size_t)n);
            *len = (size_t)n;
        } else {
            rc = n > 0 ? loom__error_oom()
                       : loom__error_set(LOOM_EPROTO, "store: empty sealed "
                                                      "credentials");
        }
    } else if (src == SQLITE_DONE) {
        rc = loom__error_set(LOOM_ENOTFOUND,
                             "store: no credentials for MCP server '%s'",
                             server);
    } else {
        rc = loom__sqlite_fail(st, c, src, "reading MCP credentials");
    }
    sqlite3_finalize(s);
    loom__sqlite_end(st, c, 0);
    return rc;
}

int loom__sqlite_mcp_credentials_put(loom_store *st, const char *server,
                                     const char *user_id,
                                     const unsigned char *sealed, size_t len,
                                     int64_t now)
{
    loom__sqlite_conn *c = NULL;
    sqlite3_stmt *s = NULL;
    int src, rc;

    if ((rc = loom__sqlite_begin(st, 1, &c)) != 0)
        return rc;
    src = sqlite3_prepare_v2(loom__sqlite_db(c), sql_put, -1, &s, NULL);
    b_text(s, 1, server, &src);
    b_text(s, 2, user_id, &src);
    b_blob(s, 3, sealed, len, &src);
    b_int(s, 4, now, &src);
    if ((src = step_done(s, src)) != SQLITE_OK)
        rc = loom__sqlite_fail(st, c, src, "storing MCP credentials");
    sqlite3_finalize(s);
    if (rc == 0)
        rc = loom__sqlite_commit(st, c, "storing MCP credentials");
    loom__sqlite_end(st, c, 1);
    return rc;
}
