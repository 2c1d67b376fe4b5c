/*
 * Saving a turn in the SQLite backend: the messages of the plan that
 * store.c prepared (with their tool calls and outcomes, and the images
 * and files they hold, each blob once by its hash), the turn's
 * usage rows and tool records, the conversation's counters, title,
 * summary and plan, and the run's row, all in one write of the writer
 * thread (sqlite_writer.c): a turn is stored whole or not at all, and
 * saving returns once the batch holding it has committed.
 * A sub-agent's run writes its row, its own messages and its usage rows
 * only. A turn that creates its conversation (loom_turn_record
 * .create_conversation) writes the conversation's row first, in the same
 * transaction.
 */
#include "core/error.h"
#include "store/sqlite_internal.h"

/* Writes message i of the plan at position pos, its calls and outcome. */
static int insert_message(loom__sqlite_store *st, loom__sqlite_conn *c,
                          const loom__store_plan *p, size_t i, int64_t pos)
{
    const loom__store_msg *m = &p->msgs[i];
    const loom_message *msg = m->msg;
    const loom_turn_record *t = p->turn;
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK;

    if ((rc = loom__sqlite_use(st, c, S_MSG_INSERT, &s)) != 0)
        return rc;
    b_text(s, 1, m->id, &src);
    b_text(s, 2, t->conversation_id, &src);
    b_int(s, 3, pos, &src);
    b_text(s, 4, t->run_id, &src);
    b_text(s, 5, loom_role_name(msg->role), &src);
    b_text(s, 6, msg->content, &src);
    b_text(s, 7, msg->reasoning, &src);
    b_text(s, 8, m->model, &src);
    b_text(s, 9, m->finish_reason, &src);
    b_text(s, 10, m->status, &src);
    b_text(s, 11, m->error, &src);
    if (m->has_tokens) {
        b_int(s, 12, m->prompt_tokens, &src);
        b_int(s, 13, m->completion_tokens, &src);
    }
    b_real(s, 14, m->cost, &src);
    b_text(s, 15, msg->tool_call_id, &src);
    b_text(s, 16, msg->name, &src);
    b_int(s, 17, m->placeholder, &src);
    b_int(s, 18, p->now, &src);
    b_text(s, 19, msg->provider_state, &src);
    b_micros(s, 20, m->cost_micros, &src);
    b_text(s, 21, m->citations, &src);
    b_text(s, 22, m->parts, &src);
    b_text(s, 23, m->agent, &src);
    if ((src = step_done(s, src)) != SQLITE_OK)
        goto failed;
    done(s);
    for (size_t k = 0; k < m->blobs_len; k++) {
        if ((rc = loom__sqlite_use(st, c, S_BLOB_LINK, &s)) != 0)
            return rc;
        b_text(s, 1, m->id, &src);
        b_text(s, 2, p->blobs[p->blob_refs[m->blobs_at + k]].hash, &src);
        if ((src = step_done(s, src)) != SQLITE_OK)
            goto failed;
        done(s);
    }
    for (size_t k = 0; k < msg->tool_calls_len; k++) {
        const loom_tool_call *tc = &msg->tool_calls[k];
        if ((rc = loom__sqlite_use(st, c, S_CALL_INSERT, &s)) != 0)
            return rc;
        b_text(s, 1, m->id, &src);
        b_int(s, 2, (int64_t)k, &src);
        b_text(s, 3, tc->id ? tc->id : "", &src);
        b_text(s, 4, tc->name ? tc->name : "", &src);
        b_text(s, 5, tc->arguments ? tc->arguments : "{}", &src);
        b_int(s, 6, (int64_t)p->offsets[m->offsets_at + k], &src);
        if ((src = step_done(s, src)) != SQLITE_OK)
            goto failed;
        done(s);
    }
    if (msg->role == LOOM_ROLE_TOOL) {
        if ((rc = loom__sqlite_use(st, c, S_OUTPUT_INSERT, &s)) != 0)
            return rc;
        b_text(s, 1, m->id, &src);
        b_text(s, 2, msg->tool_call_id ? msg->tool_call_id : "", &src);
        b_text(s, 3, m->tool_status, &src);
        b_real(s, 4, m->duration_ms, &src);
        if ((src = step_done(s, src)) != SQLITE_OK)
            goto failed;
        done(s);
    }
    return 0;
failed:
    return loom__sqlite_error(st, c->db, src, "saving a turn");
}

/* Writes the turn's blobs; one already stored (same hash) stays. */
static int insert_blobs(loom__sqlite_store *st, loom__sqlite_conn *c,
                        const loom__store_plan *p)
{
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK;

    for (size_t i = 0; i < p->blobs_len; i++) {
        const loom__store_blob *b = &p->blobs[i];
        if ((rc = loom__sqlite_use(st, c, S_BLOB_INSERT, &s)) != 0)
            return rc;
        b_text(s, 1, b->hash, &src);
        b_text(s, 2, b->mime, &src);
        b_int(s, 3, (int64_t)b->len, &src);
        if (src == SQLITE_OK)
            src = sqlite3_bind_blob64(
                s, 4, b->data ? (const void *)b->data : (const void *)"",
                b->len, SQLITE_STATIC);
        if ((src = step_done(s, src)) != SQLITE_OK)
            return loom__sqlite_error(st, c->db, src, "saving an image");
        done(s);
    }
    return 0;
}

static int insert_usage(loom__sqlite_store *st, loom__sqlite_conn *c,
                        const loom__store_plan *p)
{
    const loom_turn_record *t = p->turn;
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK;

    for (size_t i = 0; i < t->usage_len; i++) {
        const loom_turn_usage *u = &t->usage[i];
        if ((rc = loom__sqlite_use(st, c, S_USAGE_INSERT, &s)) != 0)
            return rc;
        b_text(s, 1, t->conversation_id, &src);
        b_text(s, 2, t->run_id, &src);
        b_text(s, 3, u->model ? u->model : t->model, &src);
        b_int(s, 4, u->iteration, &src);
        b_int(s, 5, u->usage.prompt_tokens, &src);
        b_int(s, 6, u->usage.completion_tokens, &src);
        b_int(s, 7, u->usage.cached_tokens, &src);
        b_int(s, 8, u->usage.reasoning_tokens, &src);
        b_int(s, 9, u->usage.total_tokens, &src);
        b_real(s, 10, u->cost, &src);
        b_int(s, 11, p->now, &src);
        b_int(s, 12, u->usage.cache_write_tokens, &src);
        b_micros(s, 13, u->cost >= 0 ? u->usage.cost_micros : -1, &src);
        b_text(s, 14, u->agent ? u->agent : t->agent, &src);
        b_text(s, 15, t->user_id, &src);
        b_text(s, 16, t->account.key_id, &src);
        b_text(s, 17, t->account.workspace, &src);
        b_text(s, 18, t->account.user, &src);
        b_text(s, 19, t->account.end_user, &src);
        if ((src = step_done(s, src)) != SQLITE_OK)
            return loom__sqlite_error(st, c->db, src, "saving usage");
        done(s);
    }
    return 0;
}

static int insert_records(loom__sqlite_store *st, loom__sqlite_conn *c,
                          const loom__store_plan *p)
{
    const loom_turn_record *t = p->turn;
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK;

    for (size_t i = 0; i < p->records_len; i++) {
        const loom__store_record *r = &p->records[i];
        if ((rc = loom__sqlite_use(st, c, S_RECORD_INSERT, &s)) != 0)
            return rc;
        b_text(s, 1, t->conversation_id, &src);
        b_text(s, 2, t->run_id, &src);
        b_int(s, 3, (int64_t)i, &src);
        b_textn(s, 4, r->tool, r->tool_len, &src);
        b_textn(s, 5, r->call_id, r->call_id_len, &src);
        b_textn(s, 6, r->status, r->status_len, &src);
        b_real(s, 7, r->duration_ms, &src);
        b_text(s, 8, r->json, &src);
        b_int(s, 9, p->now, &src);
        if ((src = step_done(s, src)) != SQLITE_OK)
            return loom__sqlite_error(st, c->db, src, "saving tool records");
        done(s);
    }
    return 0;
}

/* The conversation's row, written once: the turn's counters, title,
 * summary and plan, and the hashes of row (read at the turn's start and
 * extended by it). stmt: S_CONV_UPDATE, or S_CONV_INSERT_TURN for a
 * conversation the turn makes, whose row is written whole at once. */
static int write_conversation(loom__sqlite_store *st, loom__sqlite_conn *c,
                              int stmt, const loom__store_plan *p,
                              const loom__sqlite_conv_row *row)
{
    const loom_turn_record *t = p->turn;
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK;

    if ((rc = loom__sqlite_use(st, c, stmt, &s)) != 0)
        return rc;
    b_text(s, 1, t->conversation_id, &src);
    b_int(s, 2, p->now, &src);
    b_int(s, 3, (int64_t)p->len, &src);
    b_text(s, 4, t->agent, &src);
    b_text(s, 5, t->model, &src);
    b_text(s, 6, p->title, &src);
    b_text(s, 7, t->summary, &src);
    b_int(s, 8, (int64_t)t->summary_covers, &src);
    b_text(s, 9, p->plan_text, &src);
    b_int(s, 10, row->extend, &src);
    if (row->extend && row->has_last)
        b_blob(s, 11, row->h.last, sizeof(row->h.last), &src);
    /* The streamed chain only where it parted from the other (the model
     * spoke before loom's tools ran): NULL reads as the same hash, and
     * the row then leaves conversations_by_prefix_streamed alone, one
     * index entry fewer a turn (docs/store.md#client-visible-form). */
    if (row->extend && row->has_streamed &&
        !(row->has_last && !loom__transcript_parted(&row->h)))
        b_blob(s, 12, row->h.streamed, sizeof(row->h.streamed), &src);
    b_int(s, 13, row->first, &src);
    b_text(s, 14, t->user_id, &src);
    if (stmt == S_CONV_INSERT_TURN)
        b_int(s, 15, t->started_at ? t->started_at : p->now, &src);
    if ((src = step_done(s, src)) != SQLITE_OK)
        return loom__sqlite_error(st, c->db, src,
                                  stmt == S_CONV_INSERT_TURN
                                      ? "creating a conversation"
                                      : "updating a conversation");
    done(s);
    return 0;
}

/* The turn of plan arg, on c inside the writer's transaction. */
static int write_turn(loom__sqlite_store *st, loom__sqlite_conn *c,
                      const void *arg)
{
    const loom__store_plan *p = arg;
    const loom_turn_record *t = p->turn;
    loom__sqlite_conv_row row;
    int rc = 0;

    /* A conversation made with its first turn (never a sub-agent's:
     * check_turn) starts empty; its row is written whole, hashes
     * included, before the rows that refer to it. */
    if (t->create_conversation)
        memset(&row, 0, sizeof(row));
    else
        rc = loom__sqlite_conv_read(st, c, t->conversation_id, &row);
    /* A sub-agent's run leaves the conversation's hashes as they are. */
    if (rc == 0 && !t->parent_run_id)
        rc = loom__sqlite_transcript_extend(&row, p);
    if (rc == 0 && t->create_conversation)
        rc = write_conversation(st, c, S_CONV_INSERT_TURN, p, &row);
    if (rc != 0 || (rc = loom__sqlite_run_insert(st, c, p)) != 0)
        return rc;
    if (t->parent_run_id) {
        /* A sub-agent's run: its own messages and its usage rows; the
         * conversation is left as it is. */
        if ((rc = loom__sqlite_run_messages_insert(st, c, p)) != 0)
            return rc;
        return insert_usage(st, c, p);
    }
    /* Blobs before the messages that refer to them. */
    if ((rc = insert_blobs(st, c, p)) != 0)
        return rc;
    for (size_t i = 0; i < p->len; i++)
        if ((rc = insert_message(st, c, p, i, row.count + (int64_t)i)) != 0)
            return rc;
    if ((rc = insert_usage(st, c, p)) != 0 ||
        (rc = insert_records(st, c, p)) != 0)
        return rc;
    return t->create_conversation
               ? 0
               : write_conversation(st, c, S_CONV_UPDATE, p, &row);
}

int loom__sqlite_save_turn(loom_store *base, const loom__store_plan *p)
{
    /* Returns once the writer's batch holding the turn has committed. */
    return loom__sqlite_write((loom__sqlite_store *)base, write_turn, p);
}
