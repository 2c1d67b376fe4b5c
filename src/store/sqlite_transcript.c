/*
 * Transcript hashes in the SQLite backend (store/transcript.h): each
 * conversation keeps the two hashes of its client-visible form in
 * conversations.prefix_hash and prefix_hash_streamed (NULL while it is
 * empty, and for one stored before they existed), with its owner in
 * user_id, set by its first turn. Saving a turn extends them inside the
 * turn's write transaction, so a hash always describes exactly the
 * messages committed with it; finding the conversation a request
 * continues is one read on the (user_id, hash) indexes.
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

int loom__sqlite_transcript_extend(loom__sqlite_store *st, loom__sqlite_conn *c,
                                   const loom__store_plan *p)
{
    const loom_turn_record *t = p->turn;
    loom__transcript h;
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK, first = 0, has_last = 0, has_streamed = 0;

    if ((rc = loom__sqlite_use(st, c, S_CONV_HASHES, &s)) != 0)
        return rc;
    b_text(s, 1, t->conversation_id, &src);
    if (src == SQLITE_OK)
        src = sqlite3_step(s);
    if (src == SQLITE_ROW) {
        first = sqlite3_column_int64(s, 0) == 0;
        has_last = col_hash(s, 1, h.last);
        has_streamed = col_hash(s, 2, h.streamed);
        src = SQLITE_OK;
    } else if (src == SQLITE_DONE) {
        rc = loom__sqlite_not_found(t->conversation_id);
    }
    done(s);
    if (rc)
        return rc;
    if (src != SQLITE_OK)
        return loom__sqlite_error(st, c->db, src, "reading a conversation");
    if (first) {
        loom__transcript_init(&h);
        has_last = has_streamed = 1;
    } else if (!has_last && !has_streamed) {
        /* Messages stored before the hashes existed: they cannot be
         * hashed as their client saw them, so the conversation keeps
         * none and is never matched. */
        return 0;
    }
    if ((rc = loom__transcript_add_turn(&h, t->input, t->output)) != 0 ||
        (rc = loom__sqlite_use(st, c, S_CONV_HASHES_UPDATE, &s)) != 0)
        return rc;
    b_text(s, 1, t->conversation_id, &src);
    if (has_last)
        b_blob(s, 2, h.last, sizeof(h.last), &src);
    if (has_streamed)
        b_blob(s, 3, h.streamed, sizeof(h.streamed), &src);
    b_text(s, 4, t->user_id, &src);
    b_int(s, 5, first, &src);
    if ((src = step_done(s, src)) != SQLITE_OK)
        rc = loom__sqlite_error(st, c->db, src, "updating a conversation");
    done(s);
    return rc;
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
