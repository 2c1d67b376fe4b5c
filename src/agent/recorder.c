/*
 * The turn recorder (see loom/recorder.h). It keeps small arrays of what
 * it saw; the strings it keeps are copies, since event data is borrowed
 * only for the sink call, and the tool records and citations are kept as
 * references to the events' data (json_incref), which the run no longer
 * changes once emitted. Costs arrive as exact integer micro-dollars
 * and are summed as such; they become the store's dollars (a double)
 * only at the end, once per row and once for the turn.
 */
#include "loom/recorder.h"
#include "core/error.h"
#include "loom/log.h"

#include <stdlib.h>
#include <string.h>

struct loom_recorder {
    loom_sink inner;
    loom_turn_tool *tools;
    size_t ntools, captools;
    loom_turn_call *calls;
    size_t ncalls, capcalls;
    loom_turn_usage *usage;
    size_t nusage, capusage;
    uint32_t text_index; /* index of the turn text_len counts */
    size_t text_len;     /* assistant text bytes in that turn so far */
    int64_t cost_micros; /* sum of the usage rows' costs */
    int unpriced;        /* usage rows without a cost */
    char *model;         /* the model that answered last, when named */
    /* The agent a handoff made the run (NULL: none), and the model of
     * the agent running (run.started's, then agent.changed's). */
    char *agent;
    char *agent_model;
    json_t *records;     /* tool.metric data, at most the cap */
    size_t records_dropped;
    json_t *citations;   /* citation data, at most the cap */
    size_t citations_dropped;
    int failed;          /* out of memory while recording */
    loom_data_policy policy; /* tools points into ptools */
    char **ptools;           /* the policy's tool names (copies) */
    loom_messages stored;    /* the output as the policy stores it */
    const char **agents;     /* who wrote each output message stored */
    const char **models;     /* and the model that answered it */
    json_t *stored_records;  /* the tool records it stores */
};

/* A copy of s (NULL: NULL); out of memory marks the recording failed. */
static char *copy(loom_recorder *r, const char *s)
{
    char *c = s ? strdup(s) : NULL;

    if (s && !c)
        r->failed = 1;
    return c;
}

/* Keeps a copy of the string d has at key in *out, unless it is the
 * same. */
static void note_string(loom_recorder *r, const json_t *d, const char *key,
                        char **out)
{
    const char *m = json_string_value(json_object_get(d, key));
    char *c;

    if (!m || (*out && strcmp(*out, m) == 0) || !(c = copy(r, m)))
        return;
    free(*out);
    *out = c;
}

/* Keeps a copy of the model an event names (the router's answer). */
static void note_model(loom_recorder *r, const json_t *d)
{
    note_string(r, d, "model", &r->model);
}

/* Grows *arr (of elem-sized items) to hold one more. */
static int grow(void **arr, size_t *cap, size_t n, size_t elem)
{
    void *p;
    size_t c;

    if (n < *cap)
        return 0;
    c = *cap ? *cap * 2 : 8;
    p = realloc(*arr, c * elem);
    if (!p)
        return loom__error_oom();
    *arr = p;
    *cap = c;
    return 0;
}

static long field_long(const json_t *o, const char *k)
{
    return (long)json_integer_value(json_object_get(o, k));
}

/* Keeps a reference to d in *arr (made on first use) while it holds
 * fewer than max; past that only counts it. */
static void keep(loom_recorder *r, json_t **arr, size_t max, size_t *dropped,
                 json_t *d)
{
    if (!json_is_object(d))
        return;
    if (*arr && json_array_size(*arr) >= max) {
        (*dropped)++;
        return;
    }
    if ((!*arr && !(*arr = json_array())) || json_array_append(*arr, d))
        r->failed = 1;
}

static void note(loom_recorder *r, const loom_event *ev)
{
    const json_t *d = ev->data;

    /* A sub-agent's events are its own run's, which its own turn
     * records: the parent's turn has the call and its result. */
    if (loom_event_depth(ev) > 0)
        return;
    if (ev->index != r->text_index) {
        r->text_index = ev->index;
        r->text_len = 0;
    }
    switch (ev->type) {
    case LOOM_EV_MESSAGE_DELTA:
        r->text_len += json_string_length(json_object_get(d, "delta"));
        break;
    case LOOM_EV_TOOL_CALLS: {
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(d, "calls"), i, c)
        {
            const char *id = json_string_value(json_object_get(c, "id"));
            if (grow((void **)&r->calls, &r->capcalls, r->ncalls,
                     sizeof(*r->calls)) ||
                !(r->calls[r->ncalls].tool_call_id = strdup(id ? id : ""))) {
                r->failed = 1;
                return;
            }
            /* The run says where the call appeared; older events
             * without it fall back to the text so far. */
            r->calls[r->ncalls++].text_offset =
                json_is_integer(json_object_get(c, "text_offset"))
                    ? (size_t)json_integer_value(
                          json_object_get(c, "text_offset"))
                    : r->text_len;
        }
        break;
    }
    case LOOM_EV_TOOL_COMPLETED:
    case LOOM_EV_TOOL_FAILED: {
        const char *id = json_string_value(json_object_get(d, "id"));
        loom_turn_tool *t;
        if (grow((void **)&r->tools, &r->captools, r->ntools,
                 sizeof(*r->tools))) {
            r->failed = 1;
            return;
        }
        t = &r->tools[r->ntools];
        if (!(t->tool_call_id = strdup(id ? id : ""))) {
            r->failed = 1;
            return;
        }
        t->failed = ev->type == LOOM_EV_TOOL_FAILED;
        t->duration_ms = json_number_value(json_object_get(d, "duration_ms"));
        r->ntools++;
        break;
    }
    case LOOM_EV_USAGE: {
        loom_turn_usage *u;
        if (grow((void **)&r->usage, &r->capusage, r->nusage,
                 sizeof(*r->usage))) {
            r->failed = 1;
            return;
        }
        u = &r->usage[r->nusage++];
        memset(u, 0, sizeof(*u));
        u->iteration = (int)field_long(d, "iteration");
        u->usage.prompt_tokens = field_long(d, "prompt_tokens");
        u->usage.completion_tokens = field_long(d, "completion_tokens");
        u->usage.cached_tokens = field_long(d, "cached_tokens");
        u->usage.reasoning_tokens = field_long(d, "reasoning_tokens");
        u->usage.total_tokens = field_long(d, "total_tokens");
        u->usage.cache_write_tokens = field_long(d, "cache_write_tokens");
        if (json_is_integer(json_object_get(d, "cost_micros"))) {
            u->usage.cost_micros =
                (int64_t)json_integer_value(json_object_get(d, "cost_micros"));
            u->cost = (double)u->usage.cost_micros / 1e6;
            r->cost_micros += u->usage.cost_micros;
        } else {
            u->cost = -1;
            r->unpriced++;
        }
        /* A call names its model when it is not the agent's (a router's
         * fallback, a get_model hook's); a call after a handoff is the
         * new agent's. */
        u->model = copy(r, json_is_string(json_object_get(d, "model"))
                               ? json_string_value(json_object_get(d, "model"))
                               : r->agent_model);
        u->agent = copy(r, json_is_string(json_object_get(d, "agent"))
                               ? json_string_value(json_object_get(d, "agent"))
                               : r->agent);
        /* A side call's model (an argument repair's) answered no
         * message. */
        if (!json_object_get(d, "purpose"))
            note_model(r, d);
        break;
    }
    case LOOM_EV_TOOL_METRIC:
        keep(r, &r->records, LOOM_RECORDER_MAX_TOOL_RECORDS,
             &r->records_dropped, ev->data);
        break;
    case LOOM_EV_CITATION:
        keep(r, &r->citations, LOOM_RECORDER_MAX_CITATIONS,
             &r->citations_dropped, ev->data);
        break;
    case LOOM_EV_RUN_STARTED:
        note_string(r, d, "model", &r->agent_model);
        break;
    case LOOM_EV_AGENT_CHANGED:
        note_string(r, d, "to", &r->agent);
        note_string(r, d, "model", &r->agent_model);
        break;
    case LOOM_EV_RUN_COMPLETED:
    case LOOM_EV_RUN_FAILED:
        note_model(r, d);
        break;
    default:
        break;
    }
}

static int on_event(const loom_event *ev, void *payload)
{
    loom_recorder *r = payload;

    note(r, ev);
    return r->inner.emit ? r->inner.emit(ev, r->inner.payload) : 0;
}

void loom_recorder_note(loom_recorder *rec, const loom_event *ev)
{
    if (rec && ev)
        note(rec, ev);
}

int loom_recorder_new(loom_recorder **out, loom_sink inner)
{
    loom_recorder *r = calloc(1, sizeof(*r));

    *out = NULL;
    if (!r)
        return loom__error_oom();
    r->inner = inner;
    *out = r;
    return 0;
}

loom_sink loom_recorder_sink(loom_recorder *rec)
{
    loom_sink s = {on_event, rec};
    return s;
}

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; names && i < n; i++)
        free(names[i]);
    free(names);
}

int loom_recorder_set_policy(loom_recorder *rec, const loom_data_policy *policy)
{
    loom_data_policy p = {0};
    char **names = NULL;

    if (policy && policy->version > LOOM_DATA_POLICY_VERSION)
        return loom__error_set(LOOM_EINVALID,
                               "data policy version %u is newer than %d",
                               policy->version, LOOM_DATA_POLICY_VERSION);
    if (policy)
        p = *policy;
    if (p.tools) {
        /* One slot more, so that an empty list is still non-NULL. */
        if (!(names = calloc(p.tools_len + 1, sizeof(*names))))
            return loom__error_oom();
        for (size_t i = 0; i < p.tools_len; i++)
            if (!(names[i] = strdup(p.tools[i] ? p.tools[i] : ""))) {
                free_names(names, i);
                return loom__error_oom();
            }
        p.tools = (const char *const *)names;
    }
    free_names(rec->ptools, rec->policy.tools_len);
    rec->ptools = names;
    rec->policy = p;
    return 0;
}

/* Whether the policy stores the calls (and results) of tool name. */
static int tool_stored(const loom_data_policy *p, const char *name)
{
    if (p->omit_tool_calls)
        return 0;
    if (!p->tools)
        return 1;
    for (size_t i = 0; name && i < p->tools_len; i++)
        if (strcmp(p->tools[i], name) == 0)
            return 1;
    return 0;
}

static void drop_text(loom_message *m)
{
    free(m->content);
    free(m->reasoning);
    free(m->provider_state);
    m->content = m->reasoning = m->provider_state = NULL;
    for (size_t i = 0; i < m->parts_len; i++)
        loom_part_clear(&m->parts[i]);
    free(m->parts);
    m->parts = NULL;
    m->parts_len = 0;
}

/* Narrows the last message of out, a copy of an output message, as the
 * policy says; *keep becomes 0 when nothing of it is stored. */
static int narrow(const loom_data_policy *p, loom_message *m, int *keep)
{
    size_t k = 0;

    *keep = 1;
    if (m->role == LOOM_ROLE_TOOL) {
        if (!tool_stored(p, m->name)) {
            *keep = 0;
            return 0;
        }
        if (p->omit_tool_results) {
            drop_text(m);
            free(m->summary);
            m->summary = NULL;
            if (!(m->content = strdup(LOOM_DATA_POLICY_RESULT_MARKER)))
                return loom__error_oom();
        }
        return 0;
    }
    if (m->role != LOOM_ROLE_ASSISTANT)
        return 0;
    for (size_t i = 0; i < m->tool_calls_len; i++) {
        if (tool_stored(p, m->tool_calls[i].name))
            m->tool_calls[k++] = m->tool_calls[i];
        else
            loom_tool_call_clear(&m->tool_calls[i]);
    }
    m->tool_calls_len = k;
    if (p->omit_text)
        drop_text(m);
    *keep = k > 0 || (m->content && *m->content) || m->parts_len > 0;
    return 0;
}

/* The run's output messages and tool records as the policy stores them,
 * into rec->stored and rec->stored_records. */
static int apply_policy(loom_recorder *rec, const loom_messages *out)
{
    /* rec->agents and rec->models hold the run's output's: kept messages
     * keep theirs, in place (k <= i). */
    const loom_data_policy *p = &rec->policy;
    size_t i;
    json_t *r;
    int rc, keep;

    loom_messages_free(&rec->stored);
    json_decref(rec->stored_records);
    rec->stored_records = NULL;
    for (i = 0; out && i < out->len; i++) {
        /* A one-message view of the run's list; append copies it. */
        loom_messages one = {(loom_message *)&out->items[i], 1, 1};
        loom_message *last;
        if ((rc = loom_messages_append(&rec->stored, &one)) != 0)
            return rc;
        last = &rec->stored.items[rec->stored.len - 1];
        if ((rc = narrow(p, last, &keep)) != 0)
            return rc;
        if (!keep) {
            loom_message_clear(last);
            rec->stored.len--;
        } else {
            rec->agents[rec->stored.len - 1] = rec->agents[i];
            rec->models[rec->stored.len - 1] = rec->models[i];
        }
    }
    if (!rec->records)
        return 0;
    if (!(rec->stored_records = json_array()))
        return loom__error_oom();
    json_array_foreach(rec->records, i, r)
    {
        if (tool_stored(p, json_string_value(json_object_get(r, "tool"))) &&
            json_array_append(rec->stored_records, r))
            return loom__error_oom();
    }
    return 0;
}

static int policy_any(const loom_data_policy *p)
{
    return p->omit_text || p->omit_tool_calls || p->omit_tool_results ||
           p->tools;
}

int loom_recorder_turn(loom_recorder *rec, const loom_run *run,
                       loom_turn_record *turn)
{
    int rc;
    loom_run_status st = loom_run_status_get(run);

    if (rec->failed)
        return loom__error_oom();
    memset(turn, 0, sizeof(*turn));
    turn->run_id = loom_run_id(run);
    /* The model that answered last, which a router's fallback, a
     * get_model hook or a handoff may have changed: the conversation's
     * model, and that of a stored assistant message the run names none
     * for (loom_run_message_model). */
    turn->model = rec->model ? rec->model : loom_run_model(run);
    turn->output = loom_run_messages(run);
    free(rec->agents);
    free(rec->models);
    rec->models = NULL;
    if (!(rec->agents = calloc(turn->output->len + 1, sizeof(*rec->agents))) ||
        !(rec->models = calloc(turn->output->len + 1, sizeof(*rec->models))))
        return loom__error_oom();
    for (size_t i = 0; i < turn->output->len; i++) {
        rec->agents[i] = loom_run_message_agent(run, i);
        rec->models[i] = loom_run_message_model(run, i);
    }
    turn->output_agents = rec->agents;
    turn->output_models = rec->models;
    turn->status = st == LOOM_RUN_COMPLETED   ? LOOM_TURN_OK
                   : st == LOOM_RUN_CANCELLED ? LOOM_TURN_CANCELLED
                                              : LOOM_TURN_ERROR;
    turn->error = turn->status == LOOM_TURN_OK ? NULL : loom_run_error(run);
    turn->finish_reason = loom_run_finish_reason(run);
    turn->tools = rec->tools;
    turn->tools_len = rec->ntools;
    turn->calls = rec->calls;
    turn->calls_len = rec->ncalls;
    turn->usage = rec->usage;
    turn->usage_len = rec->nusage;
    turn->cost = rec->nusage && !rec->unpriced
                     ? (double)rec->cost_micros / 1e6
                     : -1;
    turn->tool_records = rec->records;
    turn->citations = rec->citations;
    turn->run_usage = loom_run_usage(run);
    turn->run_cost_known = loom_run_cost_known(run);
    if (policy_any(&rec->policy)) {
        if ((rc = apply_policy(rec, turn->output)) != 0)
            return rc;
        turn->output = &rec->stored;
        turn->tool_records = rec->stored_records;
    }
    turn->summary = loom_run_summary(run, &turn->summary_covers);
    turn->plan = loom_run_plan(run);
    turn->title = loom_run_title(run);
    if (rec->records_dropped)
        loom_warn("run %s: %zu tool records past the first %d are not "
                  "stored",
                  turn->run_id ? turn->run_id : "?", rec->records_dropped,
                  LOOM_RECORDER_MAX_TOOL_RECORDS);
    if (rec->citations_dropped)
        loom_warn("run %s: %zu citations past the first %d are not stored",
                  turn->run_id ? turn->run_id : "?", rec->citations_dropped,
                  LOOM_RECORDER_MAX_CITATIONS);
    return 0;
}

void loom_recorder_free(loom_recorder *rec)
{
    if (!rec)
        return;
    for (size_t i = 0; i < rec->ntools; i++)
        free((char *)rec->tools[i].tool_call_id);
    for (size_t i = 0; i < rec->ncalls; i++)
        free((char *)rec->calls[i].tool_call_id);
    for (size_t i = 0; i < rec->nusage; i++) {
        free((char *)rec->usage[i].model);
        free((char *)rec->usage[i].agent);
    }
    free(rec->tools);
    free(rec->calls);
    free(rec->usage);
    free(rec->model);
    free(rec->agent);
    free(rec->agent_model);
    json_decref(rec->records);
    json_decref(rec->citations);
    free_names(rec->ptools, rec->policy.tools_len);
    loom_messages_free(&rec->stored);
    json_decref(rec->stored_records);
    free(rec->agents);
    free(rec->models);
    free(rec);
}
