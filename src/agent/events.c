/*
 * Event names and their JSON rendering. Every front end (the CLI's --json
 * printer, later the HTTP API and the store recorder) sees events through
 * loom_event_to_json, so the wire shape of an event is defined here once:
 * the envelope {type, seq, index, run_id} followed by the event's fields.
 */
#include "agent/events.h"
#include "core/utf8.h"
#include "loom/run.h"

#include <stdlib.h>
#include <string.h>

static const char *const event_names[LOOM_EV__COUNT] = {
    [LOOM_EV_RUN_STARTED] = "run.started",
    [LOOM_EV_MESSAGE_DELTA] = "message.delta",
    [LOOM_EV_REASONING_DELTA] = "reasoning.delta",
    [LOOM_EV_TOOL_CALLS] = "tool_calls",
    [LOOM_EV_TOOL_STARTED] = "tool.started",
    [LOOM_EV_TOOL_PROGRESS] = "tool.progress",
    [LOOM_EV_TOOL_DELTA] = "tool.delta",
    [LOOM_EV_TOOL_COMPLETED] = "tool.completed",
    [LOOM_EV_TOOL_FAILED] = "tool.failed",
    [LOOM_EV_TOOL_METRIC] = "tool.metric",
    [LOOM_EV_PLAN_UPDATED] = "plan.updated",
    [LOOM_EV_REVIEW] = "review",
    [LOOM_EV_CITATION] = "citation",
    [LOOM_EV_USAGE] = "usage",
    [LOOM_EV_RUN_COMPLETED] = "run.completed",
    [LOOM_EV_RUN_FAILED] = "run.failed",
    [LOOM_EV_CONTEXT] = "context",
    [LOOM_EV_AGENT_CHANGED] = "agent.changed",
    [LOOM_EV_APPROVAL_REQUIRED] = "approval.required",
    [LOOM_EV_RESEARCH_PLAN] = "research.plan",
    [LOOM_EV_RESEARCH_CYCLE] = "research.cycle",
    [LOOM_EV_RESEARCH_BRANCH] = "research.branch",
    [LOOM_EV_CONVERSATION_TITLE] = "conversation.title",
    [LOOM_EV_MCP_ELICITATION] = "mcp.elicitation",
    [LOOM_EV_RESEARCH_RESUMED] = "research.resumed",
};

const char *loom_event_type_name(loom_event_type type)
{
    return (unsigned)type < LOOM_EV__COUNT ? event_names[type] : "unknown";
}

/* The envelope's keys, which win over the data's: with the run id, and
 * without it (an event that has none keeps the data's). */
static const char *const envelope_rid[] = {"type", "seq", "index", "run_id",
                                           NULL};
static const char *const envelope_no_rid[] = {"type", "seq", "index", NULL};

/* Whether data's key k is one of the envelope's. */
static int envelope_key(const char *k, int has_run_id)
{
    for (const char *const *e = has_run_id ? envelope_rid : envelope_no_rid; *e;
         e++)
        if (strcmp(k, *e) == 0)
            return 1;
    return 0;
}

/*
 * Called for every event a run makes (several per request), so it skips
 * what jansson would check again: the envelope's keys and type names are
 * ASCII constants, the data's keys come from a JSON object (valid UTF-8
 * already), and whether a data key is the envelope's is a string compare,
 * not a lookup. The run id is still checked (an invalid one is left out,
 * as json_string() always did).
 */
json_t *loom_event_to_json(const loom_event *ev)
{
    json_t *o = json_object(), *rid;
    int has_run_id = 0;

    if (!o)
        return NULL;
    json_object_set_new_nocheck(
        o, "type", json_string_nocheck(loom_event_type_name(ev->type)));
    json_object_set_new_nocheck(o, "seq", json_integer((json_int_t)ev->seq));
    json_object_set_new_nocheck(o, "index", json_integer(ev->index));
    if (ev->run_id && (rid = json_string(ev->run_id)) != NULL)
        has_run_id = json_object_set_new_nocheck(o, "run_id", rid) == 0;
    if (ev->data && json_is_object(ev->data)) {
        const char *k;
        json_t *v;
        json_object_foreach(ev->data, k, v)
        {
            /* The envelope wins: data never overrides type/seq/index. */
            if (!envelope_key(k, has_run_id))
                json_object_set_nocheck(o, k, v);
        }
    }
    return o;
}

/* Whether a key of data holds a NUL, which loom_event_to_json's set (by
 * a C string) would cut short. */
static int has_cut_key(const json_t *data)
{
    void *it;

    for (it = json_object_iter((json_t *)data); it;
         it = json_object_iter_next((json_t *)data, it))
        if (strlen(json_object_iter_key(it)) != json_object_iter_key_len(it))
            return 1;
    return 0;
}

/* A literal's bytes for loom_buf_put. */
#define PUT_LIT(b, s) loom_buf_put((b), (s), sizeof(s) - 1)

/*
 * Writes what loom_event_to_json builds, in its order: the envelope, then
 * the data's members but the envelope's keys, as the compact dump writes
 * them (loom__json_put_members). A data key holding a NUL (never one of loom's)
 * takes the object's way, which cuts it as loom_event_to_json does.
 */
int loom__event_text(const loom_event *ev, loom_buf *b)
{
    const char *name = loom_event_type_name(ev->type);
    int has_run_id =
        ev->run_id && loom__json_string_valid(ev->run_id, strlen(ev->run_id));
    const json_t *data = json_is_object(ev->data) ? ev->data : NULL;
    int rc;

    if (data && has_cut_key(data)) {
        json_t *o = loom_event_to_json(ev);
        size_t len = 0;
        char *text = o ? loom__json_compact_dumps(o, 15, &len) : NULL;
        rc = text ? loom_buf_put(b, text, len) : LOOM_ENOMEM;
        json_decref(o);
        free(text);
        return rc;
    }
    /* A type's name is ASCII that needs no escape. */
    if ((rc = PUT_LIT(b, "{\"type\":\"")) != 0 ||
        (rc = loom_buf_puts(b, name)) != 0 ||
        (rc = PUT_LIT(b, "\",\"seq\":")) != 0 ||
        (rc = loom__json_put_int(b, (json_int_t)ev->seq)) != 0 ||
        (rc = PUT_LIT(b, ",\"index\":")) != 0 ||
        (rc = loom__json_put_int(b, (json_int_t)ev->index)) != 0)
        return rc;
    if (has_run_id &&
        ((rc = PUT_LIT(b, ",\"run_id\":")) != 0 ||
         (rc = loom__json_put_string(b, ev->run_id, strlen(ev->run_id))) != 0))
        return rc;
    if (data &&
        (rc = loom__json_put_members(
             b, data, has_run_id ? envelope_rid : envelope_no_rid, 15)) != 0)
        return rc;
    return loom_buf_putc(b, '}');
}

int loom_event_depth(const loom_event *ev)
{
    const json_t *d;

    /* Called thrice per event: most are the run's own, told by one
     * lookup. */
    if (!ev || !json_is_string(json_object_get(ev->data, "parent_run_id")))
        return 0;
    d = json_object_get(ev->data, "depth");
    /* A nested event always says its depth; one that did not would
     * still be a child's. */
    return json_is_integer(d) && json_integer_value(d) > 0
               ? (int)json_integer_value(d)
               : 1;
}

const char *loom_run_status_name(loom_run_status status)
{
    switch (status) {
    case LOOM_RUN_PENDING: return "pending";
    case LOOM_RUN_RUNNING: return "running";
    case LOOM_RUN_COMPLETED: return "completed";
    case LOOM_RUN_FAILED: return "failed";
    case LOOM_RUN_CANCELLED: return "cancelled";
    }
    return "unknown";
}
