/*
 * Sealed secrets in the SQLite backend: the rows of `mcp_credentials`
 * (migration 12), one per MCP server and user, and of `user_settings`
 * (migration 15), one per user, each holding bytes the front sealed
 * (secrets.c). The backend never sees a key or a plain text. Both tables
 * are read and written the same way: one row by its key (one or two
 * texts), its `sealed` blob replaced whole.
 *
 * A user's settings are read at every request of theirs (the server
 * applies them to each run) and change seldom, so the last few users'
 * sealed rows (or that they have none) are kept for SETTINGS_TTL_MS: a
 * save through this store replaces its user's entry at once; a save by
 * another process sharing the file shows within that time.
 */
#include "core/clock.h"
#include "core/error.h"
#include "store/sqlite_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char sql_put[] =
    "INSERT INTO mcp_credentials (server, user_id, sealed, updated_at) "
    "VALUES (?1, ?2, ?3, ?4) ON CONFLICT (server, user_id) DO UPDATE "
    "SET sealed = excluded.sealed, updated_at = excluded.updated_at";
static const char sql_delete[] = "DELETE FROM mcp_credentials "
                                 "WHERE server = ?1 AND user_id = ?2";
static const char sql_settings_put[] =
    "INSERT INTO user_settings (user_id, sealed, updated_at) "
    "VALUES (?1, ?3, ?4) ON CONFLICT (user_id) DO UPDATE "
    "SET sealed = excluded.sealed, updated_at = excluded.updated_at";

/* The row the cached statement id (S_SEALED_GET, S_SETTINGS_GET) selects
 * by k1 (and k2 unless NULL): *out, *len; what names it in messages; none
 * is LOOM_ENOTFOUND with missing. One statement: its own snapshot. */
static int sealed_get(loom_store *base, int id, const char *k1, const char *k2,
                      unsigned char **out, size_t *len, const char *what,
                      const char *missing)
{
    loom__sqlite_store *st = (loom__sqlite_store *)base;
    loom__sqlite_conn *c = NULL;
    sqlite3_stmt *s = NULL;
    int src = SQLITE_OK, rc;

    *out = NULL;
    *len = 0;
    if ((rc = loom__sqlite_acquire(st, &c)) != 0)
        return rc;
    if ((rc = loom__sqlite_use(st, c, id, &s)) != 0)
        goto done;
    b_text(s, 1, k1, &src);
    if (k2)
        b_text(s, 2, k2, &src);
    if (src == SQLITE_OK)
        src = sqlite3_step(s);
    if (src == SQLITE_ROW) {
        const void *v = sqlite3_column_blob(s, 0);
        int n = sqlite3_column_bytes(s, 0);

        if (n > 0 && v && (*out = malloc((size_t)n))) {
            memcpy(*out, v, (size_t)n);
            *len = (size_t)n;
        } else {
            rc = n > 0
                     ? loom__error_oom()
                     : loom__error_set(LOOM_EPROTO,
                                       "store: an empty sealed row (%s)", what);
        }
    } else if (src == SQLITE_DONE) {
        rc = loom__error_set(LOOM_ENOTFOUND, "store: %s", missing);
    } else {
        rc = loom__sqlite_fail(base, c, src, what);
    }
done:
    /* Resets s (no snapshot kept) and gives c back. */
    loom__sqlite_release(st, c);
    return rc;
}

/* Replaces the row sql writes: keys ?1 (and ?2 unless k2 is NULL), the
 * blob ?3, the time ?4. */
static int sealed_put(loom_store *st, const char *sql, const char *k1,
                      const char *k2, const unsigned char *sealed, size_t len,
                      int64_t now, const char *what)
{
    loom__sqlite_conn *c = NULL;
    sqlite3_stmt *s = NULL;
    int src, rc;

    if ((rc = loom__sqlite_begin(st, 1, &c)) != 0)
        return rc;
    src = sqlite3_prepare_v2(loom__sqlite_db(c), sql, -1, &s, NULL);
    b_text(s, 1, k1, &src);
    if (k2)
        b_text(s, 2, k2, &src);
    b_blob(s, 3, sealed, len, &src);
    b_int(s, 4, now, &src);
    if ((src = step_done(s, src)) != SQLITE_OK)
        rc = loom__sqlite_fail(st, c, src, what);
    sqlite3_finalize(s);
    if (rc == 0)
        rc = loom__sqlite_commit(st, c, what);
    loom__sqlite_end(st, c, 1);
    return rc;
}

int loom__sqlite_mcp_credentials_get(loom_store *st, const char *server,
                                     const char *user_id, unsigned char **out,
                                     size_t *len)
{
    char missing[160];

    snprintf(missing, sizeof(missing), "no credentials for MCP server '%.80s'",
             server);
    return sealed_get(st, S_SEALED_GET, server, user_id, out, len,
                      "reading MCP credentials", missing);
}

int loom__sqlite_mcp_credentials_put(loom_store *st, const char *server,
                                     const char *user_id,
                                     const unsigned char *sealed, size_t len,
                                     int64_t now)
{
    return sealed_put(st, sql_put, server, user_id, sealed, len, now,
                      "storing MCP credentials");
}

int loom__sqlite_mcp_credentials_delete(loom_store *st, const char *server,
                                        const char *user_id)
{
    loom__sqlite_conn *c = NULL;
    sqlite3_stmt *s = NULL;
    int src, rc;

    if ((rc = loom__sqlite_begin(st, 1, &c)) != 0)
        return rc;
    src = sqlite3_prepare_v2(loom__sqlite_db(c), sql_delete, -1, &s, NULL);
    b_text(s, 1, server, &src);
    b_text(s, 2, user_id, &src);
    if ((src = step_done(s, src)) != SQLITE_OK)
        rc = loom__sqlite_fail(st, c, src, "deleting MCP credentials");
    else if (sqlite3_changes(loom__sqlite_db(c)) == 0)
        rc = loom__error_set(LOOM_ENOTFOUND,
                             "store: no credentials for MCP server '%.80s'",
                             server);
    sqlite3_finalize(s);
    if (rc == 0)
        rc = loom__sqlite_commit(st, c, "deleting MCP credentials");
    loom__sqlite_end(st, c, 1);
    return rc;
}

/* How long a cached settings entry serves. */
#define SETTINGS_TTL_MS 1000

static void entry_clear(loom__sqlite_settings_entry *e)
{
    free(e->user_id);
    free(e->sealed);
    memset(e, 0, sizeof(*e));
}

void loom__sqlite_settings_cache_free(loom__sqlite_store *st)
{
    for (int i = 0; i < LOOM__SETTINGS_CACHED; i++)
        entry_clear(&st->settings[i]);
}

/* user_id's live entry, or NULL. Under settings_lock. */
static loom__sqlite_settings_entry *entry_find(loom__sqlite_store *st,
                                               const char *user_id)
{
    int64_t now = loom__mono_ms();

    for (int i = 0; i < LOOM__SETTINGS_CACHED; i++) {
        loom__sqlite_settings_entry *e = &st->settings[i];
        if (e->user_id && strcmp(e->user_id, user_id) == 0) {
            if (now - e->read_ms < SETTINGS_TTL_MS)
                return e;
            entry_clear(e);
        }
    }
    return NULL;
}

/* Keeps what user_id's row held when read (sealed NULL: none), in its
 * own entry, a free one or the oldest, unless some save came since the
 * read began (saves then was settings_saves); out of memory keeps
 * nothing. */
static void entry_keep(loom__sqlite_store *st, const char *user_id,
                       const unsigned char *sealed, size_t len,
                       unsigned long saves)
{
    loom__sqlite_settings_entry *slot = NULL;

    pthread_mutex_lock(&st->settings_lock);
    if (saves != st->settings_saves) {
        pthread_mutex_unlock(&st->settings_lock);
        return;
    }
    for (int i = 0; i < LOOM__SETTINGS_CACHED; i++) {
        loom__sqlite_settings_entry *e = &st->settings[i];
        if (e->user_id && strcmp(e->user_id, user_id) == 0) {
            slot = e;
            break;
        }
        if (!slot ||
            (slot->user_id && (!e->user_id || e->read_ms < slot->read_ms)))
            slot = e;
    }
    entry_clear(slot);
    slot->user_id = strdup(user_id);
    slot->sealed = sealed ? malloc(len) : NULL;
    if (!slot->user_id || (sealed && !slot->sealed)) {
        entry_clear(slot);
    } else {
        if (sealed)
            memcpy(slot->sealed, sealed, len);
        slot->len = len;
        slot->read_ms = loom__mono_ms();
    }
    pthread_mutex_unlock(&st->settings_lock);
}

/* Forgets user_id's entry, and any read begun before. */
static void entry_forget(loom__sqlite_store *st, const char *user_id)
{
    pthread_mutex_lock(&st->settings_lock);
    st->settings_saves++;
    for (int i = 0; i < LOOM__SETTINGS_CACHED; i++)
        if (st->settings[i].user_id &&
            strcmp(st->settings[i].user_id, user_id) == 0)
            entry_clear(&st->settings[i]);
    pthread_mutex_unlock(&st->settings_lock);
}

int loom__sqlite_user_settings_get(loom_store *base, const char *user_id,
                                   unsigned char **out, size_t *len)
{
    loom__sqlite_store *st = (loom__sqlite_store *)base;
    loom__sqlite_settings_entry *e;
    unsigned long saves;
    int rc;

    *out = NULL;
    *len = 0;
    pthread_mutex_lock(&st->settings_lock);
    saves = st->settings_saves;
    if ((e = entry_find(st, user_id)) != NULL) {
        if (!e->sealed) {
            rc = loom__error_set(LOOM_ENOTFOUND,
                                 "store: no settings for this user");
        } else if ((*out = malloc(e->len)) != NULL) {
            memcpy(*out, e->sealed, e->len);
            *len = e->len;
            rc = 0;
        } else {
            rc = loom__error_oom();
        }
        pthread_mutex_unlock(&st->settings_lock);
        return rc;
    }
    pthread_mutex_unlock(&st->settings_lock);
    rc = sealed_get(base, S_SETTINGS_GET, user_id, NULL, out, len,
                    "reading user settings", "no settings for this user");
    if (rc == 0 || rc == LOOM_ENOTFOUND)
        entry_keep(st, user_id, rc == 0 ? *out : NULL, *len, saves);
    return rc;
}

int loom__sqlite_user_settings_put(loom_store *base, const char *user_id,
                                   const unsigned char *sealed, size_t len,
                                   int64_t now)
{
    loom__sqlite_store *st = (loom__sqlite_store *)base;
    int rc;

    /* Forgotten before and after: a read racing the save cannot keep
     * the row from before it (the second also counts as a save). */
    entry_forget(st, user_id);
    rc = sealed_put(base, sql_settings_put, user_id, NULL, sealed, len, now,
                    "storing user settings");
    entry_forget(st, user_id);
    return rc;
}
