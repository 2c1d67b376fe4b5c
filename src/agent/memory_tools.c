/*
 * The memory tools (loom/memory.h): memory_store and memory_retrieve over
 * the store's per-user memories, and the settings rule that decides
 * whether a run offers them. They live with the agent layer because they
 * join two layers below it: tools (the registry) and the store.
 *
 * The tools hold only a borrowed store (thread-safe), so they run side by
 * side on worker threads with nothing of their own to lock. Who the
 * memories belong to comes from the run (ctx->user_id), never from the
 * model's arguments: a model cannot name another user. Results are JSON
 * so that stored text, whatever it holds, cannot break out of its frame
 * and pass for loom's own words; a retrieval that would not fit the
 * run's result allowance drops its last matches and says how many.
 */
#include "core/error.h"
#include "loom/memory.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Results when the model gives no limit. */
#define DEFAULT_LIMIT 10
/* Room kept for the closing of a retrieval result (count, omitted, note). */
#define TAIL_ROOM 256

/* ---- settings --------------------------------------------------------- */

int loom_memory_is_tool(const char *name)
{
    return name && (strcmp(name, LOOM_MEMORY_TOOL_STORE) == 0 ||
                    strcmp(name, LOOM_MEMORY_TOOL_RETRIEVE) == 0);
}

/* An "enabled" value: 1, 0, or LOOM_EINVALID naming where it was. */
static int enabled_value(const json_t *v, const char *where)
{
    if (json_is_boolean(v))
        return json_is_true(v);
    return loom__error_set(LOOM_EINVALID, "%s must be true or false", where);
}

int loom_memory_enabled(const json_t *settings)
{
    const json_t *v;

    if (!settings || json_is_boolean(settings))
        return !settings || json_is_true(settings);
    if (!json_is_object(settings))
        return loom__error_set(LOOM_EINVALID,
                               "memory settings must be an object or "
                               "true/false");
    if ((v = json_object_get(settings, "memory")) != NULL) {
        if (json_is_object(v)) {
            const json_t *e = json_object_get(v, "enabled");
            return e ? enabled_value(e, "memory.enabled") : 1;
        }
        return enabled_value(v, "memory");
    }
    if ((v = json_object_get(settings, "enabled")) != NULL)
        return enabled_value(v, "enabled");
    return 1;
}

int loom_memory_tool_offered(const char *name, const char *user_id,
                             const json_t *agent_settings,
                             const json_t *user_settings,
                             const json_t *tool_settings)
{
    int rc;

    if (!loom_memory_is_tool(name))
        return 1;
    if (!user_id || !*user_id)
        return 0;
    if ((rc = loom_memory_enabled(agent_settings)) != 1 ||
        (rc = loom_memory_enabled(user_settings)) != 1)
        return rc;
    return loom_memory_enabled(
        tool_settings ? json_object_get(tool_settings, name) : NULL);
}

/* ---- shared by both tools --------------------------------------------- */

/* Puts the thread's error message into out (what the model reads). */
static int tool_fail(loom_buf *out, int code)
{
    loom_buf_clear(out);
    loom_buf_puts(out, loom_error_last());
    return code;
}

/* The checks both tools make before touching the store. */
static int check_ctx(const loom_tool_ctx *ctx, loom_store *store)
{
    if (!store)
        return loom__error_set(LOOM_EINVALID, "memory has no store");
    if (!ctx || !ctx->user_id || !*ctx->user_id)
        return loom__error_set(LOOM_EINVALID,
                               "memory is only available to a signed-in "
                               "user, and this conversation has none: "
                               "nothing can be stored or recalled; answer "
                               "without memory");
    if (loom_memory_enabled(ctx->settings) != 1)
        return loom__error_set(LOOM_EINVALID,
                               "memory is turned off here; answer without "
                               "it");
    return 0;
}

/* Writes json as compact text into out. */
static int put_json(loom_buf *out, json_t *json)
{
    char *text;
    int rc;

    if (!json || !(text = json_dumps(json, JSON_COMPACT)))
        return loom__error_oom();
    rc = loom_buf_puts(out, text);
    free(text);
    return rc;
}

/* ---- memory_store ------------------------------------------------------ */

static int store_execute(const json_t *args, const loom_tool_ctx *ctx,
                         loom_buf *out, void *payload)
{
    loom_store *store = payload;
    const json_t *v = json_object_get(args, "content");
    json_t *res = NULL;
    char *id = NULL;
    int rc, dup = 0;

    if ((rc = check_ctx(ctx, store)) != 0)
        return tool_fail(out, rc);
    if (!json_is_string(v))
        return tool_fail(
            out, loom__error_set(LOOM_EINVALID,
                                 "`content` is required and must be a string"));
    if ((rc = loom_store_memory_add(store, ctx->user_id, json_string_value(v),
                                    &id, &dup)) != 0)
        return tool_fail(out, rc);
    if (dup)
        res = json_pack("{s:s,s:s,s:s}", "id", id, "status", "already_stored",
                        "note",
                        "the same memory was already saved; it was "
                        "not stored twice");
    else
        res = json_pack("{s:s,s:s}", "id", id, "status", "stored");
    rc = put_json(out, res);
    json_decref(res);
    free(id);
    return rc ? tool_fail(out, rc) : 0;
}

/* ---- memory_retrieve --------------------------------------------------- */

/* "2025-01-02T10:00:00Z" for Unix milliseconds. */
static void iso_utc(int64_t ms, char *buf, size_t size)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;

    if (!gmtime_r(&t, &tm))
        snprintf(buf, size, "unknown");
    else
        strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* One memory as the model sees it; caller frees. NULL: out of memory. */
static char *memory_text(const json_t *m)
{
    int64_t created = json_integer_value(json_object_get(m, "created_at"));
    int64_t updated = json_integer_value(json_object_get(m, "updated_at"));
    char c[32], u[32], *text;
    json_t *o;

    iso_utc(created, c, sizeof(c));
    iso_utc(updated, u, sizeof(u));
    o = json_pack("{s:O,s:O,s:s}", "id", json_object_get(m, "id"), "content",
                  json_object_get(m, "content"), "created", c);
    /* Stored again later: say when it was last confirmed. */
    if (o && strcmp(c, u) != 0 &&
        json_object_set_new(o, "updated", json_string(u))) {
        json_decref(o);
        o = NULL;
    }
    text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return text;
}

/* Writes the result: as many memories as fit out, then how many did not. */
static int write_result(const json_t *data, int ranked, loom_buf *out)
{
    size_t n = json_array_size(data), fit = 0, used;
    char **items = calloc(n ? n : 1, sizeof(*items));
    int rc = 0;

    if (!items)
        return loom__error_oom();
    used = out->len + 64 + TAIL_ROOM;
    for (size_t i = 0; i < n; i++) {
        if (!(items[i] = memory_text(json_array_get(data, i)))) {
            rc = loom__error_oom();
            goto cleanup;
        }
        if (fit == i && used + strlen(items[i]) + 1 <= out->max) {
            used += strlen(items[i]) + 1;
            fit++;
        }
    }
    rc = loom_buf_printf(out, "{\"order\":\"%s\",\"memories\":[",
                         ranked ? "best match first" : "most recent first");
    for (size_t i = 0; rc == 0 && i < fit; i++)
        rc = loom_buf_printf(out, "%s%s", i ? "," : "", items[i]);
    if (rc == 0)
        rc = loom_buf_printf(out, "],\"count\":%zu", fit);
    if (rc == 0 && fit < n)
        rc = loom_buf_printf(out,
                             ",\"omitted\":%zu,\"note\":\"more matches did "
                             "not fit; ask for fewer (limit) or narrow the "
                             "query\"",
                             n - fit);
    else if (rc == 0 && n == 0)
        rc = loom_buf_printf(out, ",\"note\":\"%s\"",
                             ranked ? "no memory matches this query"
                                    : "no memories saved for this user yet");
    if (rc == 0)
        rc = loom_buf_putc(out, '}');
cleanup:
    for (size_t i = 0; i < n; i++)
        free(items[i]);
    free(items);
    return rc;
}

/* Whether query holds a word the store would search for. */
static int has_word(const char *q)
{
    for (; q && *q; q++) {
        unsigned char c = (unsigned char)*q;
        if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
            (c >= 'A' && c <= 'Z') || c >= 0x80)
            return 1;
    }
    return 0;
}

static int retrieve_execute(const json_t *args, const loom_tool_ctx *ctx,
                            loom_buf *out, void *payload)
{
    loom_store *store = payload;
    const json_t *q = json_object_get(args, "query");
    const json_t *l = json_object_get(args, "limit");
    json_t *res = NULL;
    json_int_t limit = DEFAULT_LIMIT;
    const char *query = NULL;
    int rc;

    if ((rc = check_ctx(ctx, store)) != 0)
        return tool_fail(out, rc);
    if (q && !json_is_null(q) && !json_is_string(q))
        return tool_fail(
            out, loom__error_set(LOOM_EINVALID, "`query` must be a string"));
    if (l && !json_is_null(l)) {
        /* The schema lets 3.0 through as an integer; the range is
         * checked before the cast, which is undefined past it. */
        double d = json_is_real(l) ? json_real_value(l) : 0;
        if (json_is_integer(l))
            limit = json_integer_value(l);
        else if (!json_is_real(l) || d != floor(d))
            return tool_fail(
                out,
                loom__error_set(LOOM_EINVALID, "`limit` must be an integer"));
        else
            limit =
                d >= 1 && d <= LOOM_STORE_MEMORY_SEARCH_MAX ? (json_int_t)d : 0;
        if (limit < 1 || limit > LOOM_STORE_MEMORY_SEARCH_MAX)
            return tool_fail(out,
                             loom__error_set(LOOM_EINVALID,
                                             "`limit` must be between 1 and %d",
                                             LOOM_STORE_MEMORY_SEARCH_MAX));
    }
    if (json_is_string(q))
        query = json_string_value(q);
    if ((rc = loom_store_memory_search(store, ctx->user_id, query, (int)limit,
                                       &res)) != 0)
        return tool_fail(out, rc);
    rc = write_result(json_object_get(res, "data"), has_word(query), out);
    json_decref(res);
    return rc ? tool_fail(out, rc) : 0;
}

/* ---- registration ------------------------------------------------------ */

static int add_store(loom_tool_registry *reg, loom_store *store)
{
    loom_tool tool = {0};
    json_t *params;
    int rc;

    params = json_pack(
        "{s:s, s:{s:{s:s, s:i, s:s}}, s:[s], s:b}", "type", "object",
        "properties", "content", "type", "string", "minLength", 1,
        "description",
        "one self-contained fact, in the third person, e.g. \"The user "
        "prefers metric units\"; at most 8 KiB",
        "required", "content", "additionalProperties", 0);
    if (!params)
        return loom__error_oom();
    tool.name = LOOM_MEMORY_TOOL_STORE;
    tool.description =
        "Save a fact about the user to long-term memory, so that it is "
        "available in later conversations: preferences, personal details, "
        "ongoing projects, standing instructions. One fact per call. Do "
        "not store secrets (passwords, keys) or what matters only to this "
        "conversation. Saving the same fact again stores nothing new.";
    tool.parameters = params;
    tool.execute = store_execute;
    tool.payload = store;
    rc = loom_tool_registry_add(reg, &tool);
    json_decref(params);
    return rc;
}

static int add_retrieve(loom_tool_registry *reg, loom_store *store)
{
    loom_tool tool = {0};
    json_t *params;
    int rc;

    params = json_pack(
        "{s:s, s:{s:{s:s, s:s}, s:{s:s, s:i, s:i, s:s}}, s:b}", "type",
        "object", "properties", "query", "type", "string", "description",
        "a few keywords to look for; leave out to list the most recent "
        "memories",
        "limit", "type", "integer", "minimum", 1, "maximum",
        LOOM_STORE_MEMORY_SEARCH_MAX, "description",
        "how many memories at most; default 10", "additionalProperties", 0);
    if (!params)
        return loom__error_oom();
    tool.name = LOOM_MEMORY_TOOL_RETRIEVE;
    tool.description =
        "Search the user's long-term memory: facts saved in earlier "
        "conversations with memory_store. Give keywords in `query`; the "
        "best matches come first. Without a query the most recent "
        "memories are listed. Use it when the user refers to something "
        "from before, or when knowing them would improve the answer. "
        "Memories may be out of date; the user's latest word wins.";
    tool.parameters = params;
    tool.execute = retrieve_execute;
    tool.payload = store;
    rc = loom_tool_registry_add(reg, &tool);
    json_decref(params);
    return rc;
}

int loom_tools_add_memory(loom_tool_registry *reg, loom_store *store)
{
    int rc;

    if (!reg || !store)
        return loom__error_set(LOOM_EINVALID, "memory tools: NULL argument");
    /* Both or neither. */
    if (loom_tool_registry_get(reg, LOOM_MEMORY_TOOL_STORE) ||
        loom_tool_registry_get(reg, LOOM_MEMORY_TOOL_RETRIEVE))
        return loom__error_set(LOOM_EEXISTS,
                               "a memory tool is already registered");
    if ((rc = add_store(reg, store)) != 0)
        return rc;
    if ((rc = add_retrieve(reg, store)) != 0)
        loom_tool_registry_remove(reg, LOOM_MEMORY_TOOL_STORE);
    return rc;
}
