/*
 * Conversations in the SQLite backend: creating, listing, reading one as
 * the API shows it (messages with their tool calls, usage, tool records,
 * summary and plan), loading its history as loom_messages for a run (with
 * the bytes of its images and files, from their blobs), and deleting it
 * (a blob no message holds any more goes with it: a trigger, migration
 * 7). Reads run in one read transaction, so what they return is
 * one snapshot; messages and their tool calls are read by two statements
 * that walk the conversation side by side (start_walk), not one query
 * per message.
 */
#include "core/error.h"
#include "core/utf8.h"
#include "store/sqlite_internal.h"

#include <stdlib.h>
#include <string.h>

/* Column i as JSON, by its stored type. NULL when out of memory. */
json_t *loom__sqlite_col_json(sqlite3_stmt *s, int i)
{
    switch (sqlite3_column_type(s, i)) {
    case SQLITE_INTEGER:
        return json_integer((json_int_t)sqlite3_column_int64(s, i));
    case SQLITE_FLOAT:
        return json_real(sqlite3_column_double(s, i));
    case SQLITE_NULL:
        return json_null();
    default: {
        const char *v = col_text(s, i);
        return loom__json_text(v, (size_t)sqlite3_column_bytes(s, i));
    }
    }
}

static int put(json_t *o, const char *key, json_t *v)
{
    return v ? json_object_set_new(o, key, v) : -1;
}

/*
 * Column i, which holds JSON text the store wrote, parsed; NULL when the
 * column is NULL or does not parse (only a file changed from outside).
 */
json_t *loom__sqlite_col_parsed(sqlite3_stmt *s, int i)
{
    const char *v = col_text(s, i);

    if (!v)
        return NULL;
    return json_loadb(v, (size_t)sqlite3_column_bytes(s, i), 0, NULL);
}

static int row_info(sqlite3_stmt *s, loom_conversation_info *out)
{
    int bad = 0;

    out->id = col_dup(s, 0, &bad);
    out->title = col_dup(s, 1, &bad);
    out->agent = col_dup(s, 2, &bad);
    out->model = col_dup(s, 3, &bad);
    out->created_at = sqlite3_column_int64(s, 4);
    out->updated_at = sqlite3_column_int64(s, 5);
    out->message_count = sqlite3_column_int64(s, 6);
    out->user_id = col_dup(s, 7, &bad);
    if (bad || !out->id || !out->title) {
        loom_conversation_info_clear(out);
        return loom__error_oom();
    }
    return 0;
}

static loom_role role_of(const char *name)
{
    if (!name)
        return LOOM_ROLE_USER;
    if (strcmp(name, "system") == 0)
        return LOOM_ROLE_SYSTEM;
    if (strcmp(name, "assistant") == 0)
        return LOOM_ROLE_ASSISTANT;
    if (strcmp(name, "tool") == 0)
        return LOOM_ROLE_TOOL;
    return LOOM_ROLE_USER;
}

/* Inserts conversation id's row (owned by owner, NULL: none; created at
 * now) on c, inside the writer's transaction. A turn that creates its
 * conversation writes the row whole instead (sqlite_turn.c). */
static int conv_insert(loom__sqlite_store *st, loom__sqlite_conn *c,
                       const char *id, const char *owner, int64_t now)
{
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK;

    if ((rc = loom__sqlite_use(
             st, c, owner ? S_CONV_INSERT_OWNED : S_CONV_INSERT, &s)))
        return rc;
    b_text(s, 1, id, &src);
    b_int(s, 2, now, &src);
    if (owner)
        b_text(s, 3, owner, &src);
    if ((src = step_done(s, src)) != SQLITE_OK)
        return loom__sqlite_error(st, c->db, src, "creating a conversation");
    done(s);
    return 0;
}

typedef struct {
    const char *id, *owner;
    int64_t now;
} create_arg;

/* Inserts conversation arg's row on c, inside the writer's transaction. */
static int write_conversation(loom__sqlite_store *st, loom__sqlite_conn *c,
                              const void *arg)
{
    const create_arg *a = arg;

    return conv_insert(st, c, a->id, a->owner, a->now);
}

int loom__sqlite_conversation_create(loom_store *base, const char *id,
                                     const char *owner, int64_t now)
{
    create_arg a = {id, owner, now};

    return loom__sqlite_write((loom__sqlite_store *)base, write_conversation,
                              &a);
}

/* Reads conversation id's info on c (inside the caller's transaction). */
static int info_on(loom__sqlite_store *st, loom__sqlite_conn *c, const char *id,
                   loom_conversation_info *out)
{
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK;

    if ((rc = loom__sqlite_use(st, c, S_CONV_INFO, &s)) != 0)
        return rc;
    b_text(s, 1, id, &src);
    if (src == SQLITE_OK)
        src = sqlite3_step(s);
    if (src == SQLITE_ROW)
        rc = row_info(s, out);
    else if (src == SQLITE_DONE)
        rc = loom__sqlite_not_found(id);
    else
        rc = loom__sqlite_error(st, c->db, src, "reading a conversation");
    done(s);
    return rc;
}

int loom__sqlite_conversation_info(loom_store *base, const char *id,
                                   loom_conversation_info *out)
{
    loom__sqlite_store *st = (loom__sqlite_store *)base;
    loom__sqlite_conn *c;
    int rc;

    if ((rc = loom__sqlite_acquire(st, &c)) != 0)
        return rc;
    rc = info_on(st, c, id, out);
    loom__sqlite_release(st, c);
    return rc;
}

int loom__sqlite_conversation_list(loom_store *base, const char *owner,
                                   const char *like, const char *after,
                                   int limit, json_t **out)
{
    loom__sqlite_store *st = (loom__sqlite_store *)base;
    loom_conversation_info info = {0};
    json_t *res = NULL, *data = NULL, *next = NULL;
    sqlite3_stmt *s = NULL;
    loom__sqlite_conn *c;
    int rc, src = SQLITE_OK, n = 0, more = 0;

    if ((rc = loom__sqlite_acquire(st, &c)) != 0)
        return rc;
    if ((rc = loom__sqlite_begin_read(st, c)) != 0)
        goto cleanup;
    if (after) {
        if ((rc = info_on(st, c, after, &info)) != 0)
            goto cleanup;
        /* Another owner's conversation is not there for this one. */
        if (owner && (!info.user_id || strcmp(info.user_id, owner))) {
            rc = loom__sqlite_not_found(after);
            goto cleanup;
        }
        if ((rc = loom__sqlite_use(
                 st, c, owner ? S_CONV_LIST_OWNED_AFTER : S_CONV_LIST_AFTER,
                 &s)) != 0)
            goto cleanup;
        b_int(s, 1, info.updated_at, &src);
        b_text(s, 2, after, &src);
        b_int(s, 3, limit + 1, &src);
        if (owner)
            b_text(s, 4, owner, &src);
        b_text(s, 5, like, &src);
        loom_conversation_info_clear(&info);
    } else {
        if ((rc = loom__sqlite_use(
                 st, c, owner ? S_CONV_LIST_OWNED : S_CONV_LIST, &s)) != 0)
            goto cleanup;
        b_int(s, 1, limit + 1, &src);
        if (owner)
            b_text(s, 2, owner, &src);
        b_text(s, 5, like, &src);
    }
    if (!(data = json_array())) {
        rc = loom__error_oom();
        goto cleanup;
    }
    while (src == SQLITE_OK && (src = sqlite3_step(s)) == SQLITE_ROW) {
        src = SQLITE_OK;
        if (n == limit) {
            more = 1;
            break;
        }
        if ((rc = row_info(s, &info)) != 0)
            goto cleanup;
        json_decref(next);
        next = loom__json_text(info.id, strlen(info.id));
        if (!next || json_array_append_new(data, loom__store_info_json(&info)))
            rc = loom__error_oom();
        loom_conversation_info_clear(&info);
        if (rc)
            goto cleanup;
        n++;
    }
    if (src != SQLITE_OK && src != SQLITE_DONE) {
        rc = loom__sqlite_error(st, c->db, src, "listing conversations");
        goto cleanup;
    }
    if ((rc = loom__sqlite_commit(&st->base, c, "listing conversations")) != 0)
        goto cleanup;
    if (!(res = json_object()) || put(res, "data", json_incref(data)) ||
        put(res, "has_more", json_boolean(more)) ||
        put(res, "next", more ? json_incref(next) : json_null())) {
        json_decref(res);
        res = NULL;
        rc = loom__error_oom();
    }
cleanup:
    loom_conversation_info_clear(&info);
    json_decref(data);
    json_decref(next);
    loom__sqlite_release(st, c);
    *out = res;
    return rc;
}

/* One tool call row of cs as the API shows it. */
static json_t *call_json(sqlite3_stmt *cs)
{
    json_t *o = json_object();

    if (!o || put(o, "id", loom__sqlite_col_json(cs, 1)) ||
        put(o, "name", loom__sqlite_col_json(cs, 2)) ||
        put(o, "arguments", loom__sqlite_col_json(cs, 3)) ||
        put(o, "text_offset", loom__sqlite_col_json(cs, 4))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Does the call row cs is on belong to message mid? */
static int call_of(sqlite3_stmt *cs, int crc, const char *mid)
{
    const char *cid;

    if (crc != SQLITE_ROW || !mid)
        return 0;
    cid = col_text(cs, 0);
    return cid && strcmp(cid, mid) == 0;
}

static const char *const msg_keys[] = {
    [M_ID] = "id",
    [M_ROLE] = "role",
    [M_CONTENT] = "content",
    [M_REASONING] = "reasoning",
    [M_MODEL] = "model",
    [M_FINISH] = "finish_reason",
    [M_STATUS] = "status",
    [M_ERROR] = "error",
    [M_PROMPT] = "prompt_tokens",
    [M_COMPLETION] = "completion_tokens",
    [M_COST] = "cost",
    [M_CREATED] = "created_at",
    [M_RUN] = "run_id",
};

/*
 * The message row ms is on as JSON, with its tool calls taken from cs
 * (which walks the same conversation in the same order; *crc is its last
 * step result and moves on). NULL when out of memory.
 */
static json_t *message_json(sqlite3_stmt *ms, sqlite3_stmt *cs, int *crc)
{
    const char *role = col_text(ms, M_ROLE), *mid = col_text(ms, M_ID);
    int assistant = role && strcmp(role, "assistant") == 0;
    json_t *m = json_object(), *calls;
    int bad = !m;

    for (int i = M_ID; !bad && i <= M_RUN; i++)
        bad = put(m, msg_keys[i], loom__sqlite_col_json(ms, i));
    if (!bad)
        bad = put(m, "cost_micros", loom__sqlite_col_json(ms, M_COST_MICROS));
    if (!bad && assistant) {
        json_t *cites = loom__sqlite_col_parsed(ms, M_CITATIONS);
        bad = put(m, "citations", cites ? cites : json_null()) ||
              put(m, "agent", loom__sqlite_col_json(ms, M_AGENT));
    }
    if (!bad && col_text(ms, M_PARTS)) {
        /* As stored: blobs by hash and size, never their bytes. */
        json_t *parts = loom__sqlite_col_parsed(ms, M_PARTS);
        bad = put(m, "parts", parts ? parts : json_null());
    }
    if (!bad && (assistant || call_of(cs, *crc, mid))) {
        bad = !(calls = json_array()) ||
              json_object_set_new(m, "tool_calls", calls);
        while (!bad && call_of(cs, *crc, mid)) {
            bad = json_array_append_new(calls, call_json(cs));
            *crc = sqlite3_step(cs);
        }
    }
    if (!bad && role && strcmp(role, "tool") == 0)
        bad = put(m, "tool_call_id", loom__sqlite_col_json(ms, M_CALL_ID)) ||
              put(m, "name", loom__sqlite_col_json(ms, M_NAME)) ||
              put(m, "tool_status", loom__sqlite_col_json(ms, M_TOOL_STATUS)) ||
              put(m, "duration_ms", loom__sqlite_col_json(ms, M_DURATION));
    if (bad) {
        json_decref(m);
        return NULL;
    }
    return m;
}

static const char *const usage_keys[] = {
    "run_id",
    "model",
    "iteration",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "total_tokens",
    "cost",
    "cache_write_tokens",
    "cost_micros",
    "agent",
};

static json_t *usage_json(sqlite3_stmt *us)
{
    json_t *o = json_object();

    for (size_t i = 0; o && i < sizeof(usage_keys) / sizeof(usage_keys[0]); i++)
        if (put(o, usage_keys[i], loom__sqlite_col_json(us, i))) {
            json_decref(o);
            return NULL;
        }
    return o;
}

/* The conversation's summary row, left on s for the caller (who calls
 * done(s) after reading it). LOOM_ENOTFOUND when absent. */
static int summary_on(loom__sqlite_store *st, loom__sqlite_conn *c,
                      const char *id, sqlite3_stmt **s)
{
    int rc, src = SQLITE_OK;

    if ((rc = loom__sqlite_use(st, c, S_CONV_SUMMARY, s)) != 0)
        return rc;
    b_text(*s, 1, id, &src);
    if (src == SQLITE_OK)
        src = sqlite3_step(*s);
    if (src == SQLITE_ROW)
        return 0;
    rc = src == SQLITE_DONE
             ? loom__sqlite_not_found(id)
             : loom__sqlite_error(st, c->db, src, "reading a summary");
    done(*s);
    return rc;
}

/* One tool record row as the API shows it: the record with its run id. */
static json_t *record_json(sqlite3_stmt *rs)
{
    json_t *r = loom__sqlite_col_parsed(rs, 1);

    if (r && !json_is_object(r)) {
        json_decref(r);
        r = NULL;
    }
    /* A record changed from outside into something else is shown so. */
    if (!r && (!(r = json_object()) ||
               json_object_set_new(r, "record_unreadable", json_true()))) {
        json_decref(r);
        return NULL;
    }
    if (put(r, "run_id", loom__sqlite_col_json(rs, 0))) {
        json_decref(r);
        return NULL;
    }
    return r;
}

/* Appends the conversation's tool records to arr. */
static int records_on(loom__sqlite_store *st, loom__sqlite_conn *c,
                      const char *id, json_t *arr)
{
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK;

    if ((rc = loom__sqlite_use(st, c, S_RECORD_SELECT, &s)) != 0)
        return rc;
    b_text(s, 1, id, &src);
    while (src == SQLITE_OK && (src = sqlite3_step(s)) == SQLITE_ROW) {
        src = SQLITE_OK;
        if (json_array_append_new(arr, record_json(s))) {
            done(s);
            return loom__error_oom();
        }
    }
    if (src != SQLITE_DONE)
        rc = loom__sqlite_error(st, c->db, src, "reading tool records");
    done(s);
    return rc;
}

/* Binds id to the message and call walks and starts the call walk. */
static int start_walk(loom__sqlite_store *st, loom__sqlite_conn *c,
                      const char *id, sqlite3_stmt **ms, sqlite3_stmt **cs,
                      int *crc)
{
    int rc, src = SQLITE_OK;

    if ((rc = loom__sqlite_use(st, c, S_MSG_SELECT, ms)) != 0 ||
        (rc = loom__sqlite_use(st, c, S_CALL_SELECT, cs)) != 0)
        return rc;
    b_text(*ms, 1, id, &src);
    b_text(*cs, 1, id, &src);
    if (src != SQLITE_OK)
        return loom__sqlite_error(st, c->db, src, "reading messages");
    *crc = sqlite3_step(*cs);
    return 0;
}

/* Checks how the two walks ended. */
static int end_walk(loom__sqlite_store *st, loom__sqlite_conn *c, int mrc,
                    int crc)
{
    if (mrc != SQLITE_DONE)
        return loom__sqlite_error(st, c->db, mrc, "reading messages");
    if (crc != SQLITE_DONE && crc != SQLITE_ROW)
        return loom__sqlite_error(st, c->db, crc, "reading tool calls");
    return 0;
}

int loom__sqlite_conversation_get(loom_store *base, const char *id,
                                  json_t **out)
{
    loom__sqlite_store *st = (loom__sqlite_store *)base;
    loom_conversation_info info = {0};
    json_t *res = NULL, *msgs = NULL, *usage = NULL, *records = NULL;
    sqlite3_stmt *ms = NULL, *cs = NULL, *us = NULL, *ss = NULL;
    int rc, mrc, crc, urc = SQLITE_OK;
    loom__sqlite_conn *c;

    if ((rc = loom__sqlite_acquire(st, &c)) != 0)
        return rc;
    if ((rc = loom__sqlite_begin_read(st, c)) != 0 ||
        (rc = info_on(st, c, id, &info)))
        goto cleanup;
    if (!(res = loom__store_info_json(&info)) || !(msgs = json_array()) ||
        !(usage = json_array()) || !(records = json_array())) {
        rc = loom__error_oom();
        goto cleanup;
    }
    if ((rc = summary_on(st, c, id, &ss)) != 0)
        goto cleanup;
    rc = put(res, "summary", loom__sqlite_col_json(ss, 0)) ||
         put(res, "summary_covers",
             json_integer((json_int_t)sqlite3_column_int64(ss, 1))) ||
         put(res, "plan",
             col_text(ss, 2) ? loom__sqlite_col_parsed(ss, 2) : json_null());
    done(ss);
    if (rc) {
        rc = loom__error_oom();
        goto cleanup;
    }
    if ((rc = start_walk(st, c, id, &ms, &cs, &crc)) != 0)
        goto cleanup;
    while ((mrc = sqlite3_step(ms)) == SQLITE_ROW)
        if (json_array_append_new(msgs, message_json(ms, cs, &crc))) {
            rc = loom__error_oom();
            goto cleanup;
        }
    if ((rc = end_walk(st, c, mrc, crc)) != 0 ||
        (rc = loom__sqlite_versions_on(base, c, id, msgs)) != 0 ||
        (rc = loom__sqlite_branch_info_on(base, c, id, res)) != 0 ||
        (rc = loom__sqlite_use(st, c, S_USAGE_SELECT, &us)) != 0)
        goto cleanup;
    b_text(us, 1, id, &urc);
    while (urc == SQLITE_OK && (urc = sqlite3_step(us)) == SQLITE_ROW) {
        urc = SQLITE_OK;
        if (json_array_append_new(usage, usage_json(us))) {
            rc = loom__error_oom();
            goto cleanup;
        }
    }
    if (urc != SQLITE_DONE) {
        rc = loom__sqlite_error(st, c->db, urc, "reading usage");
        goto cleanup;
    }
    if ((rc = records_on(st, c, id, records)) != 0 ||
        (rc = loom__sqlite_commit(&st->base, c, "reading a conversation")) != 0)
        goto cleanup;
    if (json_object_set(res, "messages", msgs) ||
        json_object_set(res, "usage", usage) ||
        json_object_set(res, "tool_records", records))
        rc = loom__error_oom();
cleanup:
    loom_conversation_info_clear(&info);
    json_decref(msgs);
    json_decref(usage);
    json_decref(records);
    if (rc) {
        json_decref(res);
        res = NULL;
    }
    loom__sqlite_release(st, c);
    *out = res;
    return rc;
}

/*
 * One statement on one conversation (?1 its id, ?2 text when not NULL)
 * under the write lock: LOOM_ENOTFOUND when it changed no row.
 */
static int change_one(loom_store *base, int stmt, const char *id,
                      const char *text, const char *what)
{
    loom__sqlite_store *st = (loom__sqlite_store *)base;
    sqlite3_stmt *s = NULL;
    loom__sqlite_conn *c = NULL;
    int rc, src = SQLITE_OK;

    pthread_mutex_lock(&st->write_lock);
    if ((rc = loom__sqlite_acquire(st, &c)) != 0 ||
        (rc = loom__sqlite_use(st, c, stmt, &s)))
        goto cleanup;
    b_text(s, 1, id, &src);
    if (text)
        b_text(s, 2, text, &src);
    /* One statement: a delete's cascade to messages, calls, outputs,
     * usage and tool records is part of it, so it is atomic without
     * BEGIN. */
    if ((src = step_done(s, src)) != SQLITE_OK)
        rc = loom__sqlite_error(st, c->db, src, what);
    else if (sqlite3_changes(c->db) == 0)
        rc = loom__sqlite_not_found(id);
cleanup:
    loom__sqlite_release(st, c);
    pthread_mutex_unlock(&st->write_lock);
    return rc;
}

int loom__sqlite_conversation_delete(loom_store *base, const char *id)
{
    return change_one(base, S_CONV_DELETE, id, NULL, "deleting a conversation");
}

int loom__sqlite_conversation_rename(loom_store *base, const char *id,
                                     const char *title)
{
    return change_one(base, S_CONV_RENAME, id, title,
                      "renaming a conversation");
}

/* Appends *msg to m (taking its pointers) or leaves both as they were. */
static int push(loom_messages *m, loom_message *msg, size_t extra)
{
    if (m->len + extra > m->cap) {
        size_t cap = m->cap ? m->cap : 8;
        loom_message *p;
        while (cap < m->len + extra)
            cap *= 2;
        if (!(p = realloc(m->items, cap * sizeof(*p))))
            return loom__error_oom();
        m->items = p;
        m->cap = cap;
    }
    if (msg) {
        m->items[m->len++] = *msg;
        memset(msg, 0, sizeof(*msg));
    }
    return 0;
}

/* What blob_get reads blobs with: the store and the connection. */
typedef struct {
    loom__sqlite_store *st;
    loom__sqlite_conn *c;
    sqlite3_stmt *s; /* left on the last blob's row until the next */
} blob_reader;

/* loom__store_blob_get on the connection of ctx (a blob_reader). */
static int blob_get(void *ctx, const char *hash, const void **data, size_t *len)
{
    blob_reader *r = ctx;
    int rc, src = SQLITE_OK;

    done(r->s);
    if ((rc = loom__sqlite_use(r->st, r->c, S_BLOB_SELECT, &r->s)) != 0)
        return rc;
    b_text(r->s, 1, hash, &src);
    if (src == SQLITE_OK)
        src = sqlite3_step(r->s);
    if (src == SQLITE_DONE)
        return loom__error_set(LOOM_EIO, "store %s: image %s is missing",
                               r->st->path, hash);
    if (src != SQLITE_ROW)
        return loom__sqlite_error(r->st, r->c->db, src, "reading an image");
    *len = (size_t)sqlite3_column_bytes(r->s, 0);
    *data = sqlite3_column_blob(r->s, 0);
    if (!*data && *len)
        return loom__error_oom();
    return 0;
}

/* The parts of the message row ms is on, when it has any, into m. */
static int row_parts(sqlite3_stmt *ms, blob_reader *r, loom_message *m)
{
    const char *json = col_text(ms, M_PARTS);
    int rc;

    if (!json)
        return 0;
    rc = loom__store_parts_load(
        m, json, (size_t)sqlite3_column_bytes(ms, M_PARTS), blob_get, r);
    done(r->s);
    return rc;
}

/* The message row ms is on, with its calls from cs, as a loom_message. */
static int row_message(sqlite3_stmt *ms, sqlite3_stmt *cs, int *crc,
                       loom_message *m)
{
    const char *mid = col_text(ms, M_ID);
    size_t cap = 0;
    int bad = 0;

    memset(m, 0, sizeof(*m));
    m->role = role_of(col_text(ms, M_ROLE));
    m->content = col_dup(ms, M_CONTENT, &bad);
    m->reasoning = col_dup(ms, M_REASONING, &bad);
    m->tool_call_id = col_dup(ms, M_CALL_ID, &bad);
    m->name = col_dup(ms, M_NAME, &bad);
    m->provider_state = col_dup(ms, M_PROVIDER_STATE, &bad);
    while (!bad && call_of(cs, *crc, mid)) {
        loom_tool_call *tc;
        if (m->tool_calls_len == cap) {
            cap = cap ? cap * 2 : 4;
            tc = realloc(m->tool_calls, cap * sizeof(*tc));
            if (!tc) {
                bad = 1;
                break;
            }
            m->tool_calls = tc;
        }
        tc = &m->tool_calls[m->tool_calls_len++];
        tc->id = col_dup(cs, 1, &bad);
        tc->name = col_dup(cs, 2, &bad);
        tc->arguments = col_dup(cs, 3, &bad);
        *crc = sqlite3_step(cs);
    }
    if (bad) {
        loom_message_clear(m);
        return loom__error_oom();
    }
    return 0;
}

int loom__sqlite_exists(loom__sqlite_store *st, loom__sqlite_conn *c,
                        const char *id, int64_t *count)
{
    sqlite3_stmt *s = NULL;
    int rc, src = SQLITE_OK;

    if ((rc = loom__sqlite_use(st, c, S_CONV_BASE, &s)) != 0)
        return rc;
    b_text(s, 1, id, &src);
    if (src == SQLITE_OK)
        src = sqlite3_step(s);
    if (src == SQLITE_ROW)
        *count = sqlite3_column_int64(s, 0);
    else if (src == SQLITE_DONE)
        rc = loom__sqlite_not_found(id);
    else
        rc = loom__sqlite_error(st, c->db, src, "reading a conversation");
    done(s);
    return rc;
}

int loom__sqlite_conversation_summary(loom_store *base, const char *id,
                                      char **summary, size_t *covers,
                                      char **plan)
{
    loom__sqlite_store *st = (loom__sqlite_store *)base;
    sqlite3_stmt *s = NULL;
    const char *v;
    int64_t n;
    loom__sqlite_conn *c;
    int rc;

    if ((rc = loom__sqlite_acquire(st, &c)) != 0)
        return rc;
    if ((rc = summary_on(st, c, id, &s)) != 0)
        goto cleanup;
    if ((v = col_text(s, 0)) != NULL) {
        if (!(*summary = strdup(v)))
            rc = loom__error_oom();
        n = sqlite3_column_int64(s, 1);
        *covers = n > 0 ? (size_t)n : 0;
    }
    if (rc == 0 && plan && (v = col_text(s, 2)) != NULL && !(*plan = strdup(v)))
        rc = loom__error_oom();
    done(s);
cleanup:
    loom__sqlite_release(st, c);
    return rc;
}

int loom__sqlite_load_history(loom_store *base, const char *id,
                              loom_messages *out)
{
    loom__sqlite_store *st = (loom__sqlite_store *)base;
    loom_messages got = {0};
    loom_message m;
    sqlite3_stmt *ms = NULL, *cs = NULL;
    int64_t count = 0;
    int rc, mrc, crc;
    loom__sqlite_conn *c;
    blob_reader blobs = {st, NULL, NULL};

    if ((rc = loom__sqlite_acquire(st, &c)) != 0)
        return rc;
    blobs.c = c;
    if ((rc = loom__sqlite_begin_read(st, c)) != 0 ||
        (rc = loom__sqlite_exists(st, c, id, &count)) != 0 ||
        (rc = start_walk(st, c, id, &ms, &cs, &crc)) != 0)
        goto cleanup;
    while ((mrc = sqlite3_step(ms)) == SQLITE_ROW) {
        if ((rc = row_message(ms, cs, &crc, &m)) != 0)
            goto cleanup;
        /* The stand-in for a turn with no answer is not history. */
        if (sqlite3_column_int(ms, M_PLACEHOLDER)) {
            loom_message_clear(&m);
            continue;
        }
        if ((rc = row_parts(ms, &blobs, &m)) != 0) {
            loom_message_clear(&m);
            goto cleanup;
        }
        if ((rc = push(&got, &m, 1)) != 0) {
            loom_message_clear(&m);
            goto cleanup;
        }
    }
    if ((rc = end_walk(st, c, mrc, crc)) != 0 ||
        (rc = loom__sqlite_commit(&st->base, c, "reading history")) != 0 ||
        (rc = push(out, NULL, got.len)) != 0)
        goto cleanup;
    /* An empty history has no array to copy (memcpy takes no NULL). */
    if (got.len)
        memcpy(out->items + out->len, got.items, got.len * sizeof(*got.items));
    out->len += got.len;
    free(got.items);
    got.items = NULL;
    got.len = 0;
cleanup:
    loom_messages_free(&got);
    loom__sqlite_release(st, c);
    return rc;
}
