/*
 * The store's backend-neutral front (see loom/store.h).
 *
 * Every public call lands here first: arguments and limits are checked,
 * ids and times are made, and a turn is turned into a "plan" in which each
 * message already knows its status, tool outcome, token counts, citations
 * and the text offsets of its tool calls, and each tool record is JSON
 * text within its limit. The backend behind the vtable
 * (store_internal.h) then only writes rows, so a second backend
 * (PostgreSQL) shares all of this logic and callers never change.
 */
#include "core/clock.h"
#include "core/error.h"
#include "core/utf8.h"
#include "store/store_internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

static const char *const turn_status_names[] = {"ok", "error", "cancelled"};

const char *loom_turn_status_name(loom_turn_record_status s)
{
    return (unsigned)s < 3 ? turn_status_names[s] : "error";
}

void loom_conversation_info_clear(loom_conversation_info *c)
{
    if (!c)
        return;
    free(c->id);
    free(c->title);
    free(c->agent);
    free(c->model);
    free(c->user_id);
    memset(c, 0, sizeof(*c));
}

/* ---- helpers for backends ------------------------------------------ */

static json_t *opt_string(const char *s)
{
    return loom__json_text(s, s ? strlen(s) : 0);
}

json_t *loom__store_info_json(const loom_conversation_info *c)
{
    return json_pack("{s:o,s:o,s:o,s:o,s:I,s:I,s:I}", "id", opt_string(c->id),
                     "title", opt_string(c->title ? c->title : ""), "agent",
                     opt_string(c->agent), "model", opt_string(c->model),
                     "created_at", (json_int_t)c->created_at, "updated_at",
                     (json_int_t)c->updated_at, "message_count",
                     (json_int_t)c->message_count);
}

/* ---- dispatch ------------------------------------------------------- */

static int has_prefix(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

int loom_store_open(loom_store **out, const char *location)
{
    int rc;

    if (!out)
        return loom__error_set(LOOM_EINVALID, "store: no out pointer");
    *out = NULL;
    if (!location)
        location = LOOM__STORE_DEFAULT_PATH;
    if (has_prefix(location, "postgres://") ||
        has_prefix(location, "postgresql://"))
        return loom__error_set(LOOM_EINVALID,
                               "store '%s': the PostgreSQL backend is not "
                               "built into this loom; use a SQLite path",
                               location);
    if (has_prefix(location, "sqlite:"))
        location += strlen("sqlite:");
    if (!*location)
        return loom__error_set(LOOM_EINVALID, "store: empty location");
    if ((rc = loom__store_sqlite_open(out, location)) != 0)
        return rc;
    if ((rc = loom__store_secrets_init(*out, location)) != 0) {
        loom_store_free(*out);
        *out = NULL;
    }
    return rc;
}

void loom_store_free(loom_store *st)
{
    if (st) {
        free(st->key_file);
        free(st->secret);
        st->vt->free(st);
    }
}

int loom_store_ping(loom_store *st)
{
    if (!st)
        return loom__error_set(LOOM_EINVALID, "store: NULL store");
    return st->vt->ping(st);
}

int loom_store_schema_version(loom_store *st)
{
    return st ? st->vt->schema_version(st) : 0;
}

int loom_store_stats_get(loom_store *st, loom_store_stats *out)
{
    if (out)
        memset(out, 0, sizeof(*out));
    if (!st || !out)
        return loom__error_set(LOOM_EINVALID, "store: NULL argument");
    st->vt->stats(st, out);
    return 0;
}

static int check_id(loom_store *st, const char *id)
{
    if (!st)
        return loom__error_set(LOOM_EINVALID, "store: NULL store");
    if (!id)
        return loom__error_set(LOOM_EINVALID, "store: NULL conversation id");
    return 0;
}

int loom_store_conversation_create(loom_store *st, char **id_out)
{
    char id[LOOM__STORE_ID_SIZE];
    int rc;

    if (!id_out)
        return loom__error_set(LOOM_EINVALID, "store: no out pointer");
    *id_out = NULL;
    if (!st)
        return loom__error_set(LOOM_EINVALID, "store: NULL store");
    if ((rc = loom_id_new(id, "conv_")) != 0 ||
        (rc = st->vt->conversation_create(st, id, NULL, loom__unix_ms())) != 0)
        return rc;
    if (!(*id_out = strdup(id)))
        return loom__error_oom();
    return 0;
}

/* NULL (anonymous) or 1 to LOOM_STORE_USER_ID_MAX bytes. */
static int make_title(const char *text, char **out);

static int check_owner(const char *user_id)
{
    if (user_id && (!*user_id || strlen(user_id) > LOOM_STORE_USER_ID_MAX))
        return loom__error_set(LOOM_EINVALID,
                               "store: a user id has 1 to %d bytes",
                               LOOM_STORE_USER_ID_MAX);
    return 0;
}

int loom_store_conversation_create_for(loom_store *st, const char *id,
                                       const char *user_id)
{
    int rc = check_id(st, id);

    if (rc || (rc = check_owner(user_id)) != 0)
        return rc;
    if (!*id || strlen(id) > 128)
        return loom__error_set(LOOM_EINVALID,
                               "store: a conversation id has 1 to 128 bytes");
    return st->vt->conversation_create(st, id, user_id, loom__unix_ms());
}

int loom_store_conversation_create_id(loom_store *st, const char *id)
{
    return loom_store_conversation_create_for(st, id, NULL);
}

int loom_store_conversation_match(loom_store *st, const char *user_id,
                                  const loom_messages *messages, char **id_out)
{
    loom__transcript h;
    int rc;

    if (!id_out)
        return loom__error_set(LOOM_EINVALID, "store: no out pointer");
    *id_out = NULL;
    if (!st)
        return loom__error_set(LOOM_EINVALID, "store: NULL store");
    if ((rc = check_owner(user_id)) != 0)
        return rc;
    if (!messages || !messages->len)
        return loom__error_set(LOOM_ENOTFOUND,
                               "no conversation continues no messages");
    /* A request's messages are already in the client's form: one chain
     * is enough, looked up against both of each conversation. */
    loom__transcript_init(&h);
    if ((rc = loom__transcript_add(h.last, messages)) != 0)
        return rc;
    return st->vt->conversation_match(st, user_id, h.last, id_out);
}

int loom_store_conversation_info(loom_store *st, const char *id,
                                 loom_conversation_info *out)
{
    int rc;

    if (!out)
        return loom__error_set(LOOM_EINVALID, "store: no out pointer");
    memset(out, 0, sizeof(*out));
    if ((rc = check_id(st, id)) != 0)
        return rc;
    return st->vt->conversation_info(st, id, out);
}

/*
 * The LIKE pattern of titles holding query: "%query%", its own %, _ and
 * \\ escaped with \\. *out NULL for no query. 0 or LOOM_ENOMEM.
 */
static int title_pattern(const char *query, char **out)
{
    size_t n = 0;
    char *p;

    *out = NULL;
    if (!query || !*query)
        return 0;
    if (!(p = malloc(2 * strlen(query) + 3)))
        return loom__error_oom();
    p[n++] = '%';
    for (const char *q = query; *q; q++) {
        if (*q == '%' || *q == '_' || *q == '\\')
            p[n++] = '\\';
        p[n++] = *q;
    }
    p[n++] = '%';
    p[n] = '\0';
    *out = p;
    return 0;
}

/* Lists every conversation (owner NULL) or one owner's, those whose title
 * holds query only (NULL: all). */
static int list(loom_store *st, const char *owner, const char *query,
                const char *after, int limit, json_t **out)
{
    char *like;
    int rc;

    if (!out)
        return loom__error_set(LOOM_EINVALID, "store: no out pointer");
    *out = NULL;
    if (!st)
        return loom__error_set(LOOM_EINVALID, "store: NULL store");
    if (limit < 1 || limit > 100)
        return loom__error_set(
            LOOM_EINVALID, "limit must be between 1 and 100, got %d", limit);
    if (query && strlen(query) > LOOM_STORE_QUERY_MAX_BYTES)
        return loom__error_set(LOOM_EINVALID,
                               "a title search is at most %d bytes",
                               LOOM_STORE_QUERY_MAX_BYTES);
    if ((rc = title_pattern(query, &like)) != 0)
        return rc;
    rc = st->vt->conversation_list(st, owner, like, after, limit, out);
    free(like);
    return rc;
}

int loom_store_conversation_list(loom_store *st, const char *after, int limit,
                                 json_t **out)
{
    return list(st, NULL, NULL, after, limit, out);
}

int loom_store_conversation_list_owned(loom_store *st, const char *user_id,
                                       const char *after, int limit,
                                       json_t **out)
{
    int rc;

    if (out)
        *out = NULL;
    if (!user_id)
        return loom__error_set(LOOM_EINVALID, "store: NULL user id");
    if ((rc = check_owner(user_id)) != 0)
        return rc;
    return list(st, user_id, NULL, after, limit, out);
}

int loom_store_conversation_search(loom_store *st, const char *user_id,
                                   const char *query, const char *after,
                                   int limit, json_t **out)
{
    int rc;

    if (out)
        *out = NULL;
    if (user_id && (rc = check_owner(user_id)) != 0)
        return rc;
    return list(st, user_id, query, after, limit, out);
}

int loom_store_conversation_rename(loom_store *st, const char *id,
                                   const char *title)
{
    char *clean = NULL;
    int rc;

    if ((rc = check_id(st, id)) != 0)
        return rc;
    if (!title)
        return loom__error_set(LOOM_EINVALID, "store: NULL title");
    if (strlen(title) > LOOM_STORE_TITLE_MAX_BYTES)
        return loom__error_set(LOOM_EINVALID, "a title is at most %d bytes",
                               LOOM_STORE_TITLE_MAX_BYTES);
    if ((rc = make_title(title, &clean)) != 0)
        return rc;
    if (!*clean)
        rc = loom__error_set(LOOM_EINVALID, "a title needs a visible "
                                            "character");
    else
        rc = st->vt->conversation_rename(st, id, clean);
    free(clean);
    return rc;
}

int loom_store_conversation_get(loom_store *st, const char *id, json_t **out)
{
    int rc;

    if (!out)
        return loom__error_set(LOOM_EINVALID, "store: no out pointer");
    *out = NULL;
    if ((rc = check_id(st, id)) != 0)
        return rc;
    return st->vt->conversation_get(st, id, out);
}

int loom_store_conversation_delete(loom_store *st, const char *id)
{
    int rc = check_id(st, id);

    return rc ? rc : st->vt->conversation_delete(st, id);
}

int loom_store_conversation_branch(loom_store *st, const char *id,
                                   const char *message_id, char **id_out)
{
    char branch[LOOM__STORE_ID_SIZE];
    int rc;

    if (!id_out)
        return loom__error_set(LOOM_EINVALID, "store: no out pointer");
    *id_out = NULL;
    if ((rc = check_id(st, id)) != 0)
        return rc;
    if (!message_id || strlen(message_id) >= LOOM__STORE_ID_SIZE)
        return loom__error_set(LOOM_EINVALID,
                               "store: a message id has 1 to "
                               "%d bytes",
                               LOOM__STORE_ID_SIZE - 1);
    if ((rc = loom_id_new(branch, "conv_")) != 0 ||
        (rc = st->vt->conversation_branch(st, id, message_id, branch,
                                          loom__unix_ms())) != 0)
        return rc;
    if (!(*id_out = strdup(branch)))
        return loom__error_oom();
    return 0;
}

int loom_store_conversation_summary(loom_store *st, const char *id,
                                    char **summary_out, size_t *covers_out)
{
    size_t covers = 0;
    int rc;

    if (!summary_out)
        return loom__error_set(LOOM_EINVALID, "store: no out pointer");
    *summary_out = NULL;
    if (covers_out)
        *covers_out = 0;
    if ((rc = check_id(st, id)) != 0)
        return rc;
    rc = st->vt->conversation_summary(st, id, summary_out, &covers, NULL);
    if (rc == 0 && covers_out)
        *covers_out = covers;
    return rc;
}

int loom_store_conversation_plan(loom_store *st, const char *id,
                                 json_t **plan_out)
{
    char *summary = NULL, *text = NULL;
    size_t covers;
    int rc;

    if (!plan_out)
        return loom__error_set(LOOM_EINVALID, "store: no out pointer");
    *plan_out = NULL;
    if ((rc = check_id(st, id)) != 0)
        return rc;
    rc = st->vt->conversation_summary(st, id, &summary, &covers, &text);
    free(summary);
    if (rc == 0 && text && !(*plan_out = json_loads(text, 0, NULL)))
        rc = loom__error_set(LOOM_EIO, "store: conversation %s has a "
                             "damaged plan", id);
    free(text);
    return rc;
}

int loom_store_load_history(loom_store *st, const char *id, loom_messages *out)
{
    size_t from;
    int rc;

    if (!out)
        return loom__error_set(LOOM_EINVALID, "store: no out pointer");
    if ((rc = check_id(st, id)) != 0)
        return rc;
    from = out->len;
    if ((rc = st->vt->load_history(st, id, out)) != 0)
        return rc;
    return loom__store_history_limit(out, from);
}

/* ---- planning a turn ------------------------------------------------ */

/*
 * A title from the first user text: on one line (control characters
 * become spaces, runs of blanks one space), trimmed, cut to
 * LOOM__STORE_TITLE_MAX code points without splitting one.
 */
static int make_title(const char *text, char **out)
{
    size_t len = strlen(text), chars = 0, w = 0;
    /* The loop never writes past 4 * LOOM__STORE_TITLE_MAX bytes. */
    char *t = malloc(4 * LOOM__STORE_TITLE_MAX + 1);

    *out = NULL;
    if (!t)
        return loom__error_oom();
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c < 0x20 || c == 0x7F || c == ' ') {
            if (w == 0 || t[w - 1] == ' ')
                continue;
            c = ' ';
        }
        /* A lead byte (not 10xxxxxx) starts a new character; the byte
         * cap only bites on invalid UTF-8 (stray continuation bytes). */
        if (((c & 0xC0) != 0x80 && chars++ == LOOM__STORE_TITLE_MAX) ||
            w >= 4 * LOOM__STORE_TITLE_MAX)
            break;
        t[w++] = (char)c;
    }
    while (w > 0 && t[w - 1] == ' ')
        w--;
    t[w] = '\0';
    *out = t;
    return 0;
}

static size_t msgs_len(const loom_messages *m)
{
    return m ? m->len : 0;
}

static int too_many(const char *what, size_t n)
{
    return loom__error_set(LOOM_ETOOLARGE,
                           "a turn holds at most %d %s, this one has %zu",
                           LOOM__STORE_MAX_TURN_ITEMS, what, n);
}

/* The outcome of the tool message answering id; hint is its likely slot
 * (the recorder keeps tools in tool-message order). */
static const loom_turn_tool *find_tool(const loom_turn_record *t,
                                       const char *id, size_t hint)
{
    if (!id)
        return NULL;
    if (hint < t->tools_len && t->tools[hint].tool_call_id &&
        strcmp(t->tools[hint].tool_call_id, id) == 0)
        return &t->tools[hint];
    for (size_t i = 0; i < t->tools_len; i++)
        if (t->tools[i].tool_call_id &&
            strcmp(t->tools[i].tool_call_id, id) == 0)
            return &t->tools[i];
    return NULL;
}

/*
 * The turn's cost in micro-dollars: the exact sum of its usage rows when
 * every row is priced, else the turn's own figure rounded (a caller that
 * gives only a total), else -1 (unknown).
 */
static int64_t turn_micros(const loom_turn_record *t)
{
    int64_t sum = 0;

    if (t->cost < 0)
        return -1;
    for (size_t i = 0; i < t->usage_len; i++) {
        if (t->usage[i].cost < 0)
            return (int64_t)llround(t->cost * 1e6);
        sum += t->usage[i].usage.cost_micros;
    }
    return t->usage_len ? sum : (int64_t)llround(t->cost * 1e6);
}

static size_t find_offset(const loom_turn_record *t, const char *id,
                          size_t hint)
{
    if (!id)
        return 0;
    if (hint < t->calls_len && t->calls[hint].tool_call_id &&
        strcmp(t->calls[hint].tool_call_id, id) == 0)
        return t->calls[hint].text_offset;
    for (size_t i = 0; i < t->calls_len; i++)
        if (t->calls[i].tool_call_id &&
            strcmp(t->calls[i].tool_call_id, id) == 0)
            return t->calls[i].text_offset;
    return 0;
}

/*
 * Checks that a turn's JSON array (citations, tool records) is an array
 * of at most max objects; NULL is none.
 */
static int check_objects(const json_t *a, const char *what, size_t max)
{
    size_t i, n;
    json_t *v;

    if (!a)
        return 0;
    if (!json_is_array(a))
        return loom__error_set(LOOM_EINVALID, "turn: %s must be a JSON array",
                               what);
    if ((n = json_array_size(a)) > max)
        return loom__error_set(LOOM_ETOOLARGE,
                               "a turn holds at most %zu %s, this one has %zu",
                               max, what, n);
    /* jansson's iteration takes no const; nothing is changed. */
    json_array_foreach((json_t *)a, i, v)
    {
        if (!json_is_object(v))
            return loom__error_set(LOOM_EINVALID,
                                   "turn: %s item %zu is not a JSON object",
                                   what, i);
    }
    return 0;
}

static int check_extras(const loom_turn_record *t)
{
    size_t n;
    int rc;

    if (t->summary && (n = strlen(t->summary)) > LOOM_STORE_SUMMARY_MAX_BYTES)
        return loom__error_set(LOOM_ETOOLARGE,
                               "a context summary has at most %d bytes, this "
                               "one has %zu; nothing was saved",
                               LOOM_STORE_SUMMARY_MAX_BYTES, n);
    if (t->summary && t->summary_covers > (size_t)INT64_MAX)
        return loom__error_set(LOOM_EINVALID,
                               "turn: summary_covers %zu is out of range",
                               t->summary_covers);
    if ((rc = check_objects(t->citations, "citations",
                            LOOM_STORE_CITATIONS_MAX)) != 0)
        return rc;
    return check_objects(t->tool_records, "tool records",
                         LOOM_STORE_TOOL_RECORDS_MAX);
}

static int check_turn(const loom_turn_record *t)
{
    size_t nin = msgs_len(t->input), nout = msgs_len(t->output), ncalls = 0;

    if (!t->conversation_id)
        return loom__error_set(LOOM_EINVALID, "turn: no conversation id");
    if ((t->parent_run_id && strlen(t->parent_run_id) > LOOM_ID_MAX) ||
        (t->parent_call_id && strlen(t->parent_call_id) > LOOM_ID_MAX) ||
        t->depth < 0 || (t->parent_run_id && !t->run_id))
        return loom__error_set(LOOM_EINVALID,
                               "turn: a sub-agent's run needs its run id, "
                               "ids of at most %d bytes and a depth >= 0",
                               LOOM_ID_MAX);
    if ((unsigned)t->status > LOOM_TURN_CANCELLED)
        return loom__error_set(LOOM_EINVALID, "turn: unknown status %d",
                               (int)t->status);
    if (t->create_conversation && (t->parent_run_id || !*t->conversation_id ||
                                   strlen(t->conversation_id) > 128))
        return loom__error_set(LOOM_EINVALID,
                               "turn: a conversation created with its turn "
                               "has an id of 1 to 128 bytes and a top-level "
                               "run");
    if ((t->tools_len && !t->tools) || (t->calls_len && !t->calls) ||
        (t->usage_len && !t->usage))
        return loom__error_set(LOOM_EINVALID, "turn: NULL array");
    if (nin + nout > LOOM__STORE_MAX_TURN_ITEMS)
        return too_many("messages", nin + nout);
    if (t->tools_len > LOOM__STORE_MAX_TURN_ITEMS)
        return too_many("tool outcomes", t->tools_len);
    if (t->calls_len > LOOM__STORE_MAX_TURN_ITEMS)
        return too_many("call offsets", t->calls_len);
    if (t->usage_len > LOOM__STORE_MAX_TURN_ITEMS)
        return too_many("usage rows", t->usage_len);
    for (size_t i = 0; i < nout; i++) {
        ncalls += t->output->items[i].tool_calls_len;
        if (ncalls > LOOM__STORE_MAX_TURN_ITEMS)
            return too_many("tool calls", ncalls);
    }
    return check_extras(t);
}

static void plan_free(loom__store_plan *p)
{
    loom__store_plan_parts_free(p);
    for (size_t i = 0; p->records && i < p->records_len; i++)
        free(p->records[i].json);
    free(p->records);
    free(p->citations);
    free(p->plan_text);
    free(p->msgs);
    free(p->offsets);
    free(p->title);
}

/* The turn's plan as JSON text (NULL: the conversation keeps its own). */
static int plan_plan(const loom_turn_record *t, loom__store_plan *p)
{
    size_t n;

    if (!t->plan)
        return 0;
    if (!json_is_object(t->plan))
        return loom__error_set(LOOM_EINVALID,
                               "turn: a plan must be a JSON object");
    if (!(p->plan_text = json_dumps(t->plan, JSON_COMPACT)))
        return loom__error_oom();
    if ((n = strlen(p->plan_text)) > LOOM_STORE_PLAN_MAX_BYTES)
        return loom__error_set(LOOM_ETOOLARGE,
                               "a plan takes at most %d bytes as JSON, this "
                               "one takes %zu; nothing was saved",
                               LOOM_STORE_PLAN_MAX_BYTES, n);
    return 0;
}

/* The turn's citations as JSON text (NULL for none). */
static int plan_citations(const loom_turn_record *t, loom__store_plan *p)
{
    size_t n;

    if (!t->citations || json_array_size(t->citations) == 0)
        return 0;
    if (!(p->citations = json_dumps(t->citations, JSON_COMPACT)))
        return loom__error_oom();
    if ((n = strlen(p->citations)) > LOOM_STORE_CITATIONS_MAX_BYTES)
        return loom__error_set(LOOM_ETOOLARGE,
                               "the citations of a turn take at most %d bytes "
                               "as JSON, these take %zu; nothing was saved",
                               LOOM_STORE_CITATIONS_MAX_BYTES, n);
    return 0;
}

/* Top-level fields a cut record keeps at most, and the longest key. With
 * LOOM__STORE_RECORD_FIELD_MAX, even strings of control characters
 * (6 bytes each as JSON) keep a cut record far below the limit. */
#define CUT_FIELDS_MAX 32
#define CUT_KEY_MAX 64

/*
 * The stand-in for a record over LOOM_STORE_TOOL_RECORD_MAX_BYTES (size
 * bytes as JSON): its first CUT_FIELDS_MAX numbers, booleans, nulls and
 * strings (cut to LOOM__STORE_RECORD_FIELD_MAX bytes), so what a record
 * is about (tool, call id, status, duration, sizes) survives, plus
 * "record_cut": true and "record_bytes". Arrays and objects (arguments,
 * documents, error) go. NULL when out of memory.
 */
static json_t *cut_record(const json_t *r, size_t size)
{
    json_t *c = json_object(), *v, *nv;
    const char *k;
    size_t kept = 0;

    if (!c)
        return NULL;
    /* jansson's iteration takes no const; nothing is changed. */
    json_object_foreach((json_t *)r, k, v)
    {
        if (kept == CUT_FIELDS_MAX || strlen(k) > CUT_KEY_MAX)
            continue;
        if (json_is_string(v))
            nv = json_stringn(json_string_value(v),
                              loom__utf8_cut(json_string_value(v),
                                       json_string_length(v),
                                       LOOM__STORE_RECORD_FIELD_MAX));
        else if (json_is_number(v) || json_is_boolean(v) || json_is_null(v))
            nv = json_deep_copy(v);
        else
            continue;
        if (!nv || json_object_set_new(c, k, nv))
            goto fail;
        kept++;
    }
    if (json_object_set_new(c, "record_cut", json_true()) ||
        json_object_set_new(c, "record_bytes", json_integer((json_int_t)size)))
        goto fail;
    return c;
fail:
    json_decref(c);
    return NULL;
}

/* A string field of a record for its column: borrowed, cut. */
static void record_field(const json_t *r, const char *key, const char **s,
                         size_t *len)
{
    const json_t *v = json_object_get(r, key);

    *s = NULL;
    *len = 0;
    if (!json_is_string(v))
        return;
    *s = json_string_value(v);
    *len = loom__utf8_cut(*s, json_string_length(v), LOOM__STORE_RECORD_FIELD_MAX);
}

static int plan_records(const loom_turn_record *t, loom__store_plan *p)
{
    size_t n = t->tool_records ? json_array_size(t->tool_records) : 0, size;

    if (n == 0)
        return 0;
    if (!(p->records = calloc(n, sizeof(*p->records))))
        return loom__error_oom();
    p->records_len = n;
    for (size_t i = 0; i < n; i++) {
        const json_t *r = json_array_get(t->tool_records, i), *d;
        loom__store_record *rec = &p->records[i];
        json_t *cut;

        record_field(r, "tool", &rec->tool, &rec->tool_len);
        record_field(r, "call_id", &rec->call_id, &rec->call_id_len);
        record_field(r, "status", &rec->status, &rec->status_len);
        d = json_object_get(r, "duration_ms");
        rec->duration_ms = json_is_number(d) ? json_number_value(d) : -1;
        if (!(rec->json = json_dumps(r, JSON_COMPACT)))
            return loom__error_oom();
        if ((size = strlen(rec->json)) <= LOOM_STORE_TOOL_RECORD_MAX_BYTES)
            continue;
        /* Telemetry is not worth losing the turn for: keep it cut. */
        free(rec->json);
        rec->json = NULL;
        cut = cut_record(r, size);
        rec->json = cut ? json_dumps(cut, JSON_COMPACT) : NULL;
        json_decref(cut);
        if (!rec->json)
            return loom__error_oom();
    }
    return 0;
}

/*
 * The run's row: its status as the API names it, and its usage and cost:
 * the run's own figures (descendants included) when given, else its
 * usage rows' (rows_micros, < 0 when a row is unpriced).
 */
static void plan_run(const loom_turn_record *t, loom__store_plan *p,
                     int64_t rows_micros)
{
    static const char *const names[] = {"completed", "failed", "cancelled"};

    p->run_status = names[t->status];
    p->started_at = t->started_at > 0 ? t->started_at : p->now;
    if (t->run_usage) {
        p->run_usage = *t->run_usage;
        p->run_cost_micros = t->run_cost_known ? t->run_usage->cost_micros : -1;
        return;
    }
    for (size_t i = 0; i < t->usage_len; i++)
        loom_usage_add(&p->run_usage, &t->usage[i].usage);
    p->run_cost_micros = t->usage_len ? rows_micros : -1;
}

/* The empty assistant message that carries a failed turn's status. */
static const loom_message placeholder_msg = {.role = LOOM_ROLE_ASSISTANT};

static int plan_turn(const loom_turn_record *t, loom__store_plan *p)
{
    size_t nin = msgs_len(t->input), nout = msgs_len(t->output);
    size_t carrier = (size_t)-1, ntool = 0, ncall = 0, noff = 0;
    loom__store_msg *m;
    int rc;

    memset(p, 0, sizeof(*p));
    p->turn = t;
    p->now = loom__unix_ms();
    for (size_t i = 0; i < nout; i++) {
        if (t->output->items[i].role == LOOM_ROLE_ASSISTANT)
            carrier = nin + i;
        noff += t->output->items[i].tool_calls_len;
    }
    for (size_t i = 0; i < nin; i++)
        noff += t->input->items[i].tool_calls_len;
    p->len = nin + nout + (carrier == (size_t)-1);
    if (carrier == (size_t)-1)
        carrier = nin + nout;
    p->msgs = calloc(p->len, sizeof(*p->msgs));
    p->offsets = calloc(noff ? noff : 1, sizeof(*p->offsets));
    if (!p->msgs || !p->offsets)
        return loom__error_oom();
    p->offsets_len = noff;
    noff = 0;
    for (size_t i = 0; i < p->len; i++) {
        int out = i >= nin;
        m = &p->msgs[i];
        if (i < nin)
            m->msg = &t->input->items[i];
        else if (i < nin + nout)
            m->msg = &t->output->items[i - nin];
        else {
            m->msg = &placeholder_msg;
            m->placeholder = 1;
        }
        if ((rc = loom_id_new(m->id, "msg_")) != 0)
            return rc;
        m->status = "ok";
        m->cost = -1;
        m->cost_micros = -1;
        m->duration_ms = -1;
        m->offsets_at = noff;
        if (m->msg->role == LOOM_ROLE_ASSISTANT) {
            m->model = out && i < nin + nout && t->output_models &&
                               t->output_models[i - nin]
                           ? t->output_models[i - nin]
                           : t->model;
            m->agent = out && i < nin + nout && t->output_agents &&
                               t->output_agents[i - nin]
                           ? t->output_agents[i - nin]
                           : t->agent;
        }
        for (size_t k = 0; k < m->msg->tool_calls_len; k++, noff++)
            p->offsets[noff] =
                out ? find_offset(t, m->msg->tool_calls[k].id, ncall++) : 0;
        if (m->msg->role == LOOM_ROLE_TOOL && out) {
            const loom_turn_tool *tt =
                find_tool(t, m->msg->tool_call_id, ntool++);
            if (tt) {
                m->tool_status = tt->failed ? "error" : "success";
                m->duration_ms = tt->duration_ms;
            }
        }
        if (!p->title && t->title && *t->title &&
            (rc = make_title(t->title, &p->title)) != 0)
            return rc;
        if (!p->title && m->msg->role == LOOM_ROLE_USER && m->msg->content &&
            *m->msg->content &&
            (rc = make_title(m->msg->content, &p->title)) != 0)
            return rc;
    }
    m = &p->msgs[carrier];
    m->status = loom_turn_status_name(t->status);
    if (t->status != LOOM_TURN_OK)
        m->error = t->error ? t->error : "";
    m->finish_reason = t->finish_reason;
    /* The whole turn's tokens, beside the whole turn's cost. */
    for (size_t i = 0; i < t->usage_len; i++) {
        m->has_tokens = 1;
        m->prompt_tokens += t->usage[i].usage.prompt_tokens;
        m->completion_tokens += t->usage[i].usage.completion_tokens;
    }
    m->cost = t->cost;
    m->cost_micros = turn_micros(t);
    plan_run(t, p, m->cost_micros);
    /* A sub-agent's run keeps its messages' text only. */
    if (t->parent_run_id)
        return 0;
    if ((rc = plan_citations(t, p)) != 0 || (rc = plan_plan(t, p)) != 0)
        return rc;
    m->citations = p->citations;
    if ((rc = loom__store_plan_parts(p)) != 0)
        return rc;
    return plan_records(t, p);
}

int loom_store_save_turn(loom_store *st, const loom_turn_record *turn)
{
    loom__store_plan plan;
    int rc;

    if (!st || !turn)
        return loom__error_set(LOOM_EINVALID, "store: NULL argument");
    if ((rc = check_turn(turn)) != 0 || (rc = check_owner(turn->user_id)) ||
        (rc = loom__store_account_check(&turn->account)) != 0)
        return rc;
    if ((rc = plan_turn(turn, &plan)) == 0)
        rc = st->vt->save_turn(st, &plan);
    plan_free(&plan);
    return rc;
}

int loom_store_run_get(loom_store *st, const char *id, const char *user_id,
                       json_t **out)
{
    int rc;

    if (out)
        *out = NULL;
    if (!st || !out)
        return loom__error_set(LOOM_EINVALID, "store: NULL argument");
    if ((rc = check_owner(user_id)) != 0)
        return rc;
    if (!id || !*id || strlen(id) > LOOM_ID_MAX)
        return loom__error_set(LOOM_ENOTFOUND, "run '%s' not found",
                               id ? id : "");
    return st->vt->run_get(st, id, user_id, out);
}

int loom_store_run_children(loom_store *st, const char *id, json_t **out)
{
    if (out)
        *out = NULL;
    if (!st || !out || !id)
        return loom__error_set(LOOM_EINVALID, "store: NULL argument");
    if (!*id || strlen(id) > LOOM_ID_MAX)
        return (*out = json_array()) ? 0 : loom__error_oom();
    return st->vt->run_children(st, id, out);
}

/* ---- memories --------------------------------------------------------- */

static int is_blank(unsigned char c)
{
    return c <= 0x20 || c == 0x7F;
}

char *loom__store_memory_norm(const char *text, size_t len)
{
    char *n = malloc(len + 1);
    size_t w = 0;

    if (!n)
        return NULL;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (is_blank(c)) {
            if (w > 0 && n[w - 1] != ' ')
                n[w++] = ' ';
            continue;
        }
        n[w++] = (char)(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
    }
    while (w > 0 && (n[w - 1] == ' ' || n[w - 1] == '.' || n[w - 1] == '!'))
        w--;
    n[w] = '\0';
    return n;
}

static int is_word_byte(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
           (c >= 'A' && c <= 'Z') || c >= 0x80;
}

int loom__store_query_terms(const char *query, char ***terms_out,
                            size_t *n_out)
{
    size_t len = strlen(query), n = 0, i = 0;
    char **terms, *text;

    *terms_out = NULL;
    *n_out = 0;
    for (size_t k = 0; k < len; k++)
        if (is_word_byte((unsigned char)query[k]) &&
            (k == 0 || !is_word_byte((unsigned char)query[k - 1])))
            n++;
    /* The pointers, then a copy of the query with separators as NULs. */
    terms = malloc((n ? n : 1) * sizeof(*terms) + len + 1);
    if (!terms)
        return loom__error_oom();
    text = (char *)(terms + (n ? n : 1));
    memcpy(text, query, len + 1);
    n = 0;
    while (i < len) {
        if (!is_word_byte((unsigned char)text[i])) {
            text[i++] = '\0';
            continue;
        }
        terms[n++] = text + i;
        while (i < len && is_word_byte((unsigned char)text[i]))
            i++;
    }
    *terms_out = terms;
    *n_out = n;
    return 0;
}

static int check_user(loom_store *st, const char *user_id)
{
    size_t n;

    if (!st)
        return loom__error_set(LOOM_EINVALID, "store: NULL store");
    if (!user_id || !*user_id)
        return loom__error_set(LOOM_EINVALID,
                               "memories need a user id; none was given");
    if ((n = strlen(user_id)) > LOOM_STORE_USER_ID_MAX)
        return loom__error_set(LOOM_EINVALID,
                               "a user id has at most %d bytes, this one "
                               "has %zu",
                               LOOM_STORE_USER_ID_MAX, n);
    return 0;
}

int loom_store_memory_add(loom_store *st, const char *user_id,
                          const char *content, char **id_out,
                          int *duplicate_out)
{
    loom__store_memory m;
    char id[LOOM__STORE_ID_SIZE], *norm = NULL;
    size_t len;
    int rc, dup = 0;

    if (!id_out)
        return loom__error_set(LOOM_EINVALID, "store: no out pointer");
    *id_out = NULL;
    if (duplicate_out)
        *duplicate_out = 0;
    if ((rc = check_user(st, user_id)) != 0)
        return rc;
    if (!content)
        return loom__error_set(LOOM_EINVALID, "a memory needs a text");
    /* Checked before trimming, so the limit is on what the caller sent
     * and a huge blank text is refused as too large, not scanned. */
    if ((len = strlen(content)) > LOOM_STORE_MEMORY_MAX_BYTES)
        return loom__error_set(LOOM_ETOOLARGE,
                               "a memory has at most %d bytes, this one "
                               "has %zu; store a shorter summary",
                               LOOM_STORE_MEMORY_MAX_BYTES, len);
    while (len > 0 && is_blank((unsigned char)*content)) {
        content++;
        len--;
    }
    while (len > 0 && is_blank((unsigned char)content[len - 1]))
        len--;
    if (len == 0)
        return loom__error_set(LOOM_EINVALID, "a memory needs a text; "
                                              "this one is blank");
    if (!(norm = loom__store_memory_norm(content, len)))
        return loom__error_oom();
    memset(&m, 0, sizeof(m));
    m.user_id = user_id;
    m.content = content;
    m.content_len = len;
    m.norm = norm;
    m.now = loom__unix_ms();
    m.max_per_user = LOOM_STORE_MEMORY_MAX_PER_USER;
    if ((rc = loom_id_new(m.id, "mem_")) != 0 ||
        (rc = st->vt->memory_add(st, &m, id, &dup)) != 0)
        goto cleanup;
    if (!(*id_out = strdup(id))) {
        rc = loom__error_oom();
        goto cleanup;
    }
    if (duplicate_out)
        *duplicate_out = dup;
cleanup:
    free(norm);
    return rc;
}

int loom_store_memory_search(loom_store *st, const char *user_id,
                             const char *query, int limit, json_t **out)
{
    char **terms = NULL;
    size_t n = 0, len;
    int rc;

    if (!out)
        return loom__error_set(LOOM_EINVALID, "store: no out pointer");
    *out = NULL;
    if ((rc = check_user(st, user_id)) != 0)
        return rc;
    if (limit < 1 || limit > LOOM_STORE_MEMORY_SEARCH_MAX)
        return loom__error_set(LOOM_EINVALID,
                               "limit must be between 1 and %d, got %d",
                               LOOM_STORE_MEMORY_SEARCH_MAX, limit);
    if (query && (len = strlen(query)) > LOOM_STORE_MEMORY_QUERY_MAX)
        return loom__error_set(LOOM_ETOOLARGE,
                               "a search query has at most %d bytes, this "
                               "one has %zu",
                               LOOM_STORE_MEMORY_QUERY_MAX, len);
    if (query && (rc = loom__store_query_terms(query, &terms, &n)) != 0)
        return rc;
    rc = st->vt->memory_search(st, user_id, (const char *const *)terms, n,
                               limit, out);
    free(terms);
    return rc;
}

int loom_store_memory_delete(loom_store *st, const char *user_id,
                             const char *id)
{
    int rc = check_user(st, user_id);

    if (rc)
        return rc;
    if (!id)
        return loom__error_set(LOOM_EINVALID, "store: NULL memory id");
    return st->vt->memory_delete(st, user_id, id);
}

int loom_store_memory_count(loom_store *st, const char *user_id,
                            int64_t *count_out)
{
    int rc;

    if (!count_out)
        return loom__error_set(LOOM_EINVALID, "store: no out pointer");
    *count_out = 0;
    if ((rc = check_user(st, user_id)) != 0)
        return rc;
    return st->vt->memory_count(st, user_id, count_out);
}
