/*
 * Branches in the SQLite backend (migration 17, docs/store.md#branches):
 * making one, and telling a reader of a conversation which versions each
 * of its user messages has.
 *
 * A branch is a conversation of its own: its history is a copy of its
 * parent's messages before the user message it edits (rows copied with
 * their tool calls, tool outcomes and blob links, so every reader and
 * writer of conversations works on it unchanged), and its first turn
 * brings the new version of that message. Copying keeps a branch
 * independent of later changes to its parent and costs one pass over the
 * prefix when it is made.
 *
 * Versions: every message belongs to a version group, the id of the
 * original message it stands for. A message written by a turn is its own
 * group, except the first message of a branch, which is a new version of
 * the message it replaces (the branch's fork_origin). A copied row keeps
 * its original's group in version_of. The versions of a message are the
 * conversation that wrote its group's original and every branch whose
 * fork_origin is that group: two indexed lookups, whatever the depth of
 * the tree of branches.
 */
#include "core/error.h"
#include "store/sqlite_internal.h"

#include <stdlib.h>
#include <string.h>

/* The version group of message row m of conversation c (SQL). */
#define GROUP_OF(m, c)                                                         \
    "COALESCE(" m ".version_of, CASE WHEN " c ".fork_origin IS NOT NULL "      \
    "AND " m ".position = " c ".fork_position THEN " c ".fork_origin "         \
    "ELSE " m ".id END)"

/* The message to branch at (?1) in its conversation (?2): its position,
 * role, group, and how many messages of history precede it. */
static const char sql_fork_point[] = "SELECT m.position, m.role, " GROUP_OF(
    "m",
    "c") ", "
         "(SELECT count(*) FROM messages p WHERE p.conversation_id = ?2 "
         "AND p.position < m.position AND p.placeholder = 0) "
         "FROM messages m JOIN conversations c ON c.id = m.conversation_id "
         "WHERE m.id = ?1 AND m.conversation_id = ?2";

/* The branch ?1 of ?2 at position ?3, made at ?4, replacing message ?5
 * of group ?6, after ?7 messages of history: the parent's owner, title,
 * agent and model; its summary only when it covers no more than that
 * history; no plan (the parent's may come from after the fork). */
static const char sql_insert_branch[] =
    "INSERT INTO conversations (id, title, agent, model, created_at, "
    "updated_at, message_count, user_id, summary, summary_covers, "
    "parent_id, fork_position, fork_message, fork_origin) "
    "SELECT ?1, title, agent, model, ?4, ?4, ?3, user_id, "
    "CASE WHEN summary_covers <= ?7 THEN summary END, "
    "CASE WHEN summary_covers <= ?7 THEN summary_covers ELSE 0 END, "
    "id, ?3, ?5, ?6 FROM conversations WHERE id = ?2";

/* The parent's (?2) messages before ?3 into the branch ?1, new ids, each
 * keeping its group. */
static const char sql_copy_messages[] =
    "INSERT INTO messages (id, conversation_id, position, run_id, role, "
    "content, reasoning, model, finish_reason, status, error, "
    "prompt_tokens, completion_tokens, cost, tool_call_id, name, "
    "placeholder, created_at, provider_state, cost_micros, citations, "
    "parts, agent, version_of) "
    "SELECT 'msg_' || lower(hex(randomblob(12))), ?1, m.position, "
    "m.run_id, m.role, m.content, m.reasoning, m.model, m.finish_reason, "
    "m.status, m.error, m.prompt_tokens, m.completion_tokens, m.cost, "
    "m.tool_call_id, m.name, m.placeholder, m.created_at, "
    "m.provider_state, m.cost_micros, m.citations, m.parts, m.agent, " GROUP_OF(
        "m", "c") " FROM messages m "
                  "JOIN conversations c ON c.id = m.conversation_id "
                  "WHERE m.conversation_id = ?2 AND m.position < ?3";

/* The rows the copied messages own, the copy found by its position. */
#define COPY_OWNED(table, cols, from_cols)                                     \
    "INSERT INTO " table " (message_id, " cols ") SELECT n.id, " from_cols     \
    " FROM messages o JOIN " table " t ON t.message_id = o.id "                \
    "JOIN messages n ON n.conversation_id = ?1 AND n.position = o.position "   \
    "WHERE o.conversation_id = ?2 AND o.position < ?3"

static const char *const sql_copy_owned[] = {
    COPY_OWNED("tool_calls", "position, call_id, name, arguments, text_offset",
               "t.position, t.call_id, t.name, t.arguments, t.text_offset"),
    COPY_OWNED("tool_outputs", "call_id, status, duration_ms",
               "t.call_id, t.status, t.duration_ms"),
    COPY_OWNED("message_blobs", "hash", "t.hash"),
};

/* Every version of every user message of ?1, in message order, then
 * the original's writer first, then branches oldest first; with each
 * version how far up ?1's line of parents it is (NULL: not on it). */
static const char sql_versions[] =
    "WITH RECURSIVE line(id, depth) AS (SELECT ?1, 0 UNION ALL "
    "SELECT c.parent_id, line.depth + 1 FROM conversations c "
    "JOIN line ON c.id = line.id WHERE c.parent_id IS NOT NULL), "
    "mine(mid, pos, grp) AS (SELECT m.id, m.position, " GROUP_OF(
        "m", "c") " FROM messages m JOIN conversations c ON c.id = "
                  "m.conversation_id "
                  "WHERE m.conversation_id = ?1 AND m.role = 'user'), "
                  "versions(mid, pos, cid, later) AS ("
                  "SELECT mine.mid, mine.pos, o.conversation_id, 0 FROM mine "
                  "JOIN messages o ON o.id = mine.grp UNION ALL "
                  "SELECT mine.mid, mine.pos, b.id, 1 FROM mine "
                  "JOIN conversations b ON b.fork_origin = mine.grp) "
                  "SELECT v.mid, v.cid, line.depth FROM versions v "
                  "JOIN conversations c ON c.id = v.cid "
                  "LEFT JOIN line ON line.id = v.cid "
                  "ORDER BY v.pos, v.later, c.created_at, c.id";

/* Steps the prepared statement sql with ?1..?3 bound to a, b and pos. */
static int copy_step(loom_store *base, loom__sqlite_conn *c, const char *sql,
                     const char *a, const char *b, int64_t pos)
{
    sqlite3_stmt *s = NULL;
    int src = sqlite3_prepare_v2(loom__sqlite_db(c), sql, -1, &s, NULL);

    b_text(s, 1, a, &src);
    b_text(s, 2, b, &src);
    b_int(s, 3, pos, &src);
    src = step_done(s, src);
    sqlite3_finalize(s);
    return src == SQLITE_OK
               ? 0
               : loom__sqlite_fail(base, c, src, "copying a branch's history");
}

/* The fork point of message_id in conversation id: *pos, *history, and
 * its group (caller frees). LOOM_EINVALID when it is no user message of
 * the conversation. */
static int fork_point(loom_store *base, loom__sqlite_conn *c, const char *id,
                      const char *message_id, int64_t *pos, int64_t *history,
                      char **group)
{
    sqlite3_stmt *s = NULL;
    const char *role, *g;
    int rc = 0, src;

    src = sqlite3_prepare_v2(loom__sqlite_db(c), sql_fork_point, -1, &s, NULL);
    b_text(s, 1, message_id, &src);
    b_text(s, 2, id, &src);
    if (src == SQLITE_OK)
        src = sqlite3_step(s);
    if (src == SQLITE_ROW) {
        role = col_text(s, 1);
        g = col_text(s, 2);
        *pos = sqlite3_column_int64(s, 0);
        *history = sqlite3_column_int64(s, 3);
        if (!role || strcmp(role, "user"))
            rc = loom__error_set(LOOM_EINVALID,
                                 "message '%s' is not a user message; only "
                                 "a user message is edited into a branch",
                                 message_id);
        else if (!g || !(*group = strdup(g)))
            rc = loom__error_oom();
    } else if (src == SQLITE_DONE) {
        rc = loom__error_set(LOOM_EINVALID,
                             "message '%s' is not in conversation '%s'",
                             message_id, id);
    } else {
        rc = loom__sqlite_fail(base, c, src, "reading a branch's fork");
    }
    sqlite3_finalize(s);
    return rc;
}

int loom__sqlite_conversation_branch(loom_store *base, const char *id,
                                     const char *message_id,
                                     const char *branch_id, int64_t now)
{
    loom__sqlite_store *st = (loom__sqlite_store *)base;
    loom__sqlite_conn *c = NULL;
    sqlite3_stmt *s = NULL;
    int64_t count, pos = 0, history = 0;
    char *group = NULL;
    int rc, src;

    if ((rc = loom__sqlite_begin(base, 1, &c)) != 0)
        return rc;
    if ((rc = loom__sqlite_exists(st, c, id, &count)) != 0 ||
        (rc = fork_point(base, c, id, message_id, &pos, &history, &group)))
        goto cleanup;
    src =
        sqlite3_prepare_v2(loom__sqlite_db(c), sql_insert_branch, -1, &s, NULL);
    b_text(s, 1, branch_id, &src);
    b_text(s, 2, id, &src);
    b_int(s, 3, pos, &src);
    b_int(s, 4, now, &src);
    b_text(s, 5, message_id, &src);
    b_text(s, 6, group, &src);
    b_int(s, 7, history, &src);
    src = step_done(s, src);
    sqlite3_finalize(s);
    if (src != SQLITE_OK) {
        rc = loom__sqlite_fail(base, c, src, "creating a branch");
        goto cleanup;
    }
    /* Messages first: the rows they own find them by position. */
    if ((rc = copy_step(base, c, sql_copy_messages, branch_id, id, pos)) != 0)
        goto cleanup;
    for (size_t i = 0; i < sizeof(sql_copy_owned) / sizeof(*sql_copy_owned);
         i++)
        if ((rc = copy_step(base, c, sql_copy_owned[i], branch_id, id, pos)))
            goto cleanup;
    rc = loom__sqlite_commit(base, c, "creating a branch");
cleanup:
    free(group);
    loom__sqlite_end(base, c, 1);
    return rc;
}

/* Sets msg's "versions" (ids) and "version" (the index of the one on
 * the conversation's line) when it has more than one. */
static int put_versions(json_t *msg, json_t *ids, int64_t on_line)
{
    if (!msg || json_array_size(ids) < 2)
        return 0;
    if (json_object_set(msg, "versions", ids) ||
        json_object_set_new(msg, "version", json_integer((json_int_t)on_line)))
        return loom__error_oom();
    return 0;
}

/* The message of msgs with id mid, looking from *at on (both are in
 * position order); NULL when none. */
static json_t *message_at(json_t *msgs, size_t *at, const char *mid)
{
    for (; *at < json_array_size(msgs); (*at)++) {
        json_t *m = json_array_get(msgs, *at);
        const char *v = json_string_value(json_object_get(m, "id"));
        if (v && !strcmp(v, mid))
            return m;
    }
    return NULL;
}

int loom__sqlite_versions_on(loom_store *base, loom__sqlite_conn *c,
                             const char *id, json_t *msgs)
{
    sqlite3_stmt *s = NULL;
    json_t *ids = NULL, *msg = NULL;
    char *cur = NULL;
    int64_t on_line = 0, best = -1;
    size_t at = 0;
    int rc = 0, src;

    src = sqlite3_prepare_v2(loom__sqlite_db(c), sql_versions, -1, &s, NULL);
    b_text(s, 1, id, &src);
    while (rc == 0 && src == SQLITE_OK &&
           (src = sqlite3_step(s)) == SQLITE_ROW) {
        const char *mid = col_text(s, 0), *cid = col_text(s, 1);
        src = SQLITE_OK;
        if (!mid || !cid)
            continue;
        if (!cur || strcmp(cur, mid)) {
            if ((rc = put_versions(msg, ids, on_line)) != 0)
                break;
            json_decref(ids);
            free(cur);
            ids = json_array();
            cur = strdup(mid);
            msg = message_at(msgs, &at, mid);
            best = -1;
            on_line = 0;
            if (!ids || !cur) {
                rc = loom__error_oom();
                break;
            }
        }
        /* The nearest version up the line is the one this conversation
         * shows (a branch of a branch also descends from the first). */
        if (sqlite3_column_type(s, 2) != SQLITE_NULL &&
            (best < 0 || sqlite3_column_int64(s, 2) < best)) {
            best = sqlite3_column_int64(s, 2);
            on_line = (int64_t)json_array_size(ids);
        }
        if (json_array_append_new(ids, json_string(cid)))
            rc = loom__error_oom();
    }
    if (rc == 0 && src != SQLITE_DONE)
        rc = loom__sqlite_fail(base, c, src, "reading a message's versions");
    if (rc == 0)
        rc = put_versions(msg, ids, on_line);
    json_decref(ids);
    free(cur);
    sqlite3_finalize(s);
    return rc;
}

int loom__sqlite_branch_info_on(loom_store *base, loom__sqlite_conn *c,
                                const char *id, json_t *conv)
{
    static const char sql[] = "SELECT parent_id, fork_message "
                              "FROM conversations WHERE id = ?1";
    sqlite3_stmt *s = NULL;
    int rc = 0, src;

    src = sqlite3_prepare_v2(loom__sqlite_db(c), sql, -1, &s, NULL);
    b_text(s, 1, id, &src);
    if (src == SQLITE_OK)
        src = sqlite3_step(s);
    if (src == SQLITE_ROW) {
        /* Each set takes its value, also when it fails. */
        int bad =
            json_object_set_new(conv, "parent_id", loom__sqlite_col_json(s, 0));
        bad |= json_object_set_new(conv, "fork_message",
                                   loom__sqlite_col_json(s, 1));
        if (bad)
            rc = loom__error_oom();
    } else {
        rc = src == SQLITE_DONE
                 ? loom__sqlite_not_found(id)
                 : loom__sqlite_fail(base, c, src, "reading a branch");
    }
    sqlite3_finalize(s);
    return rc;
}
