/*
 * Transcript hashes in the SQLite backend (store/transcript.h): each
 * conversation keeps the two hashes of its client-visible form in
 * conversations.prefix_hash and prefix_hash_streamed (NULL while it is
 * empty, and for one stored before they existed; prefix_hash_streamed
 * also NULL while the two chains are the same, as they are until a model
 * speaks before loom's tools run), with its owner in
 * user_id, set by its first turn. Saving a turn extends them inside the
 * turn's write transaction (the conversation's row is read once and
 * written once, with the turn's other changes to it: sqlite_turn.c), so
 * a hash always describes exactly the messages committed with it;
 * finding the conversation a request continues is one read on the
 * (user_id, hash) indexes.
 */
#include "core/error.h"
#include "store/sqlite_internal.h"

#include <stdlib.h>
#include <string.h>

/* Copies column i into h when it is a hash; 0 when it is not (NULL). */
static int col_hash(sqlite3_stmt *s, int i, unsigned char *h)
{
    const void *v = sqlite3_column_blob(s, i);

    if (!v || sqlite3_column_bytes(s, i) != LOOM__TRANSCRIPT_HASH_SIZE)
        return 0;
    memcpy(h, v, LOOM__TRANSCRIPT_HASH_SIZE);
    return 1;
}

int loom__sqlite_conv_read(loom__sqlite_store *st, loom__sqlite_conn *c,
                           const char *id, loom__sqlite_conv_row *out)
{
    sqlite3_stmt *s = NULL;
    int rc = 0, src = SQLITE_OK;

    memset(out, 0, sizeof(*out));
    if ((rc = loom__sqlite_use(st, c, S_CONV_HASHES, &s)) != 0)
        return rc;
    b_text(s, 1, id, &src);
    if (src == SQLITE_OK)
        src = sqlite3_step(s);
    if (src == SQLITE_ROW) {
        out->count = sqlite3_column_int64(s, 0);
        out->has_last = col_hash(s, 1, out->h.last);
        out->has_streamed = col_hash(s, 2, out->h.streamed);
        /* No streamed hash beside the other: the chains have not parted
         * (write_conversation stores it only where they have). */
        if (out->has_last && !out->has_streamed) {
            memcpy(out->h.streamed, out->h.last, LOOM__TRANSCRIPT_HASH_SIZE);
            out->has_streamed = 1;
        }
        src = SQLITE_OK;
    } else if (src == SQLITE_DONE) {
        rc = loom__sqlite_not_found(id);
    }
    done(s);
    if (rc == 0 && src != SQLITE_OK)
        rc = loom__sqlite_error(st, c->db, src, "reading a conversation");
    return rc;
}

int loom__sqlite_transcript_extend(loom__sqlite_conv_row *row,
                                   const loom__store_plan *p)
{
    int rc;

    if (row->count == 0) {
        row->first = 1;
        loom__transcript_init(&row->h);
        row->has_last = row->has_streamed = 1;
    } else if (!row->has_last && !row->has_streamed) {
        /* Messages stored before the hashes existed: they cannot be
         * hashed as their client saw them, so the conversation keeps
         * none and is never matched. */
        return 0;
    }
    if ((rc = loom__transcript_add_turn(&row->h, p->turn->input,
                                        p->turn->output)) != 0)
        return rc;
    row->extend = 1;
    return 0;
}

int loom__sqlite_conversation_match(loom_store *base, const char *user_id,
                                    const unsigned char *hash, char **id_out)
{
    loom__sqlite_store *st = (loom__sqlite_store *)base;
    sqlite3_stmt *s = NULL;
    loom__sqlite_conn *c;
    int rc, src = SQLITE_OK;

    if ((rc = loom__sqlite_acquire(st, &c)) != 0)
        return rc;
    if ((rc = loom__sqlite_use(st, c, S_CONV_MATCH, &s)) != 0)
        goto cleanup;
    b_text(s, 1, user_id, &src);
    b_blob(s, 2, hash, LOOM__TRANSCRIPT_HASH_SIZE, &src);
    if (src == SQLITE_OK)
        src = sqlite3_step(s);
    if (src == SQLITE_ROW) {
        if (!(*id_out = strdup(col_text(s, 0) ? col_text(s, 0) : "")))
            rc = loom__error_oom();
    } else if (src == SQLITE_DONE) {
        rc = loom__error_set(LOOM_ENOTFOUND,
                             "no stored conversation has these messages");
    } else {
        rc = loom__sqlite_error(st, c->db, src, "finding a conversation");
    }
    done(s);
cleanup:
    loom__sqlite_release(st, c);
    return rc;
}
