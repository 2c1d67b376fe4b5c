/*
 * The tool calls of one turn, from the model's request to the results it
 * reads: lookup and validation, the before-tool hooks, execution (loop
 * tools here, the others in parallel through toolexec.c), the after-tool
 * hooks, the events and a telemetry record per call.
 *
 * loom's own policies are hooks of the public kind (loom_tool_hook) that
 * sit around the caller's in one chain, so they follow the same rules:
 *
 *   before: failure budget (block) -> duplicate calls (skip)
 *           -> the caller's hooks -> seen documents (excluded_ids)
 *   after:  outcome (failure count, seen documents, successes)
 *           -> the caller's hooks
 *
 * The duplicate check sees the model's arguments, before a caller's hook
 * rewrites them or excluded_ids grows: the model repeating itself is what
 * it catches. Everything here runs on the run's thread; the policies'
 * state lives in the tool turn (toolturn.h) and the built-in hooks reach
 * the call they look at through t->cur.
 */
#include "agent/toolturn.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The longest per-tool timeout the settings may give: a day. */
#define TIMEOUT_SETTING_MAX 86400000L

struct loom__toolturn {
    loom__toolturn_options o;
    /* The before/after chain: loom's policies around the caller's hooks. */
    loom_tool_hook *hooks;
    size_t nhooks;
    loom__tool_job *cur;    /* the job the chain is looking at */
    int iteration;          /* of the turn being run */
    unsigned char *blocked; /* per offered server tool: failed too often */
    int *failures;          /* per offered server tool: failed calls */
    /* The tools of the next request: defs without the blocked ones. */
    loom_tool_def *req_defs;
    size_t nreq_defs;
    int req_defs_stale;
    json_t *succeeded; /* duplicate key -> call id of its first success */
    json_t *turn_keys; /* duplicate key -> call id, this turn's calls */
    json_t *seen;      /* document id -> true */
    json_t *documents; /* the documents, in the order first seen */
    json_t *records;   /* tool call records */
};

const loom_tool *loom__toolset_server(const loom__toolset *set,
                                      const char *name)
{
    for (size_t i = 0; name && i < set->nserver; i++)
        if (strcmp(set->offered[i]->name, name) == 0)
            return set->offered[i];
    return NULL;
}

int loom__toolset_is_client(const loom__toolset *set, const char *name)
{
    for (size_t i = set->nserver; name && i < set->ndefs; i++)
        if (strcmp(set->defs[i].name, name) == 0)
            return 1;
    return 0;
}

json_t *loom__tool_call_json(const loom_tool_call *c)
{
    return json_pack("{s:s,s:s,s:s}", "id", c->id ? c->id : "", "name",
                     c->name ? c->name : "", "arguments",
                     c->arguments ? c->arguments : "");
}

/* The position of tool in the offered tools, or -1. */
static long offered_index(const loom__toolturn *t, const loom_tool *tool)
{
    for (size_t i = 0; tool && i < t->o.tools->nserver; i++)
        if (t->o.tools->offered[i] == tool)
            return (long)i;
    return -1;
}

/* ---- built-in policies, as hooks ---------------------------------------- */

/* Failure budget: a tool that failed too often is not run again. */
static loom_hook_action budget_before(loom_tool_hook_call *hc, void *payload)
{
    loom__toolturn *t = payload;
    long i = offered_index(t, t->cur->tool);

    if (i < 0 || !t->blocked[i])
        return LOOM_HOOK_CONTINUE;
    loom_buf_printf(hc->text,
                    "tool '%s' is blocked: it failed %d times in this run. "
                    "Do not call it again; use another tool or answer with "
                    "what you have.",
                    hc->tool_name, t->failures[i]);
    return LOOM_HOOK_BLOCK;
}

/*
 * The canonical text of a call: the tool's name and its arguments with
 * sorted keys, compact, so key order and spacing do not matter.
 */
static char *call_key(const char *name, const json_t *args)
{
    char *dump =
        args ? json_dumps(args, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY)
             : NULL;
    char *key = NULL;

    if (args && !dump)
        return NULL;
    if (asprintf(&key, "%s\n%s", name, dump ? dump : "null") < 0)
        key = NULL;
    free(dump);
    return key;
}

/* Duplicate calls: what already succeeded, or is already asked for in
 * this turn, is not run again. Loop tools are exempt: thinking the same
 * thought or saving the same plan twice costs nothing. */
static loom_hook_action duplicate_before(loom_tool_hook_call *hc, void *payload)
{
    loom__toolturn *t = payload;
    loom__tool_job *job = t->cur;
    const char *first;

    if (job->loop || job->own)
        return LOOM_HOOK_CONTINUE;
    free(job->key);
    if (!(job->key = call_key(hc->tool_name, hc->arguments)))
        return LOOM_HOOK_CONTINUE;
    first = json_string_value(json_object_get(t->succeeded, job->key));
    if (first) {
        loom_buf_printf(hc->text,
                        "Not run again: '%s' already succeeded with exactly "
                        "these arguments earlier in this run (call %s); its "
                        "result is above. Use that result, or call the tool "
                        "with different arguments.",
                        hc->tool_name, first);
        return LOOM_HOOK_SKIP;
    }
    first = json_string_value(json_object_get(t->turn_keys, job->key));
    if (first) {
        loom_buf_printf(hc->text,
                        "Not run: this call repeats call %s of this turn "
                        "(same tool, same arguments); its result is the "
                        "one to use.",
                        first);
        return LOOM_HOOK_SKIP;
    }
    /* loom__run_tools notes the key for the turn once the call runs. */
    return LOOM_HOOK_CONTINUE;
}

static int has_string(const json_t *arr, const char *s)
{
    size_t i;
    const json_t *v;

    json_array_foreach(arr, i, v)
    {
        if (json_is_string(v) && strcmp(json_string_value(v), s) == 0)
            return 1;
    }
    return 0;
}

/*
 * Seen documents: a tool whose schema has an
 * `excluded_ids` array gets the ids of the documents the run has seen
 * added to the ones the model gave, newest first when the schema's
 * maxItems leaves no room for all, and ids longer than its items'
 * maxLength left out, so the arguments still fit the schema.
 */
static loom_hook_action seen_before(loom_tool_hook_call *hc, void *payload)
{
    loom__toolturn *t = payload;
    loom__tool_job *job = t->cur;
    const json_t *props, *prop, *items, *given;
    json_t *args = NULL, *ids = NULL;
    json_int_t max_items = -1, max_len = -1;
    size_t nseen = json_array_size(t->documents), added = 0;
    char *msg = NULL;

    props = json_object_get(job->tool->parameters, "properties");
    prop = json_object_get(props, "excluded_ids");
    if (!prop || nseen == 0 || !json_is_object(hc->arguments))
        return LOOM_HOOK_CONTINUE;
    if (json_is_integer(json_object_get(prop, "maxItems")))
        max_items = json_integer_value(json_object_get(prop, "maxItems"));
    items = json_object_get(prop, "items");
    if (json_is_integer(json_object_get(items, "maxLength")))
        max_len = json_integer_value(json_object_get(items, "maxLength"));
    given = json_object_get(hc->arguments, "excluded_ids");
    if (!(args = json_deep_copy(hc->arguments)) ||
        !(ids = json_is_array(given) ? json_deep_copy(given) : json_array()))
        goto keep;
    /* Newest first: the latest results are the likeliest to come back. */
    for (size_t k = nseen; k-- > 0;) {
        const char *id = json_string_value(
            json_object_get(json_array_get(t->documents, k), "id"));
        if (max_items >= 0 && (json_int_t)json_array_size(ids) >= max_items)
            break;
        if (!id ||
            (max_len >= 0 &&
             (json_int_t)loom__utf8_count(id, strlen(id)) > max_len) ||
            has_string(ids, id))
            continue;
        if (json_array_append_new(ids, json_string(id)) != 0)
            goto keep;
        added++;
    }
    if (!added || json_object_set(args, "excluded_ids", ids) != 0)
        goto keep;
    /* An odd schema the ids do not fit: the call goes as the model made
     * it rather than failing for loom's addition. */
    if (loom_schema_validate(job->tool->parameters, args, &msg) != 0)
        goto keep;
    json_decref(ids);
    job->excluded_added = added;
    json_decref(job->model_args);
    job->model_args = json_incref((json_t *)hc->arguments);
    hc->new_arguments = args;
    return LOOM_HOOK_REWRITE;
keep:
    free(msg);
    json_decref(args);
    json_decref(ids);
    return LOOM_HOOK_CONTINUE;
}

/* Adds the documents a call reported to the run's seen set. */
static void take_documents(loom__toolturn *t, loom__tool_job *job)
{
    size_t i;
    json_t *d;

    if (!job->documents || !(job->documents_added = json_array()))
        return;
    json_array_foreach(job->documents, i, d)
    {
        const char *id = json_string_value(json_object_get(d, "id"));
        if (i >= LOOM_TOOL_DOCUMENTS_MAX ||
            json_array_size(t->documents) >= LOOM_RUN_MAX_DOCUMENTS)
            break;
        if (!id || !*id || strlen(id) > LOOM_TOOL_DOCUMENT_ID_MAX ||
            json_object_get(t->seen, id))
            continue;
        if (json_object_set_new(t->seen, id, json_true()) != 0 ||
            json_array_append(t->documents, d) != 0 ||
            json_array_append_new(job->documents_added, json_string(id)))
            break;
    }
}

/*
 * The outcome of a call that ran: a failure counts toward the tool's
 * budget (the model is told when it is spent), a success is remembered
 * for the duplicate check, and its documents join the seen set.
 */
static loom_hook_action outcome_after(loom_tool_hook_call *hc, void *payload)
{
    loom__toolturn *t = payload;
    loom__tool_job *job = t->cur;
    long i = offered_index(t, job->tool);
    char *note = NULL;

    (void)hc;
    if (!job->failed) {
        if (job->key && !json_object_get(t->succeeded, job->key))
            json_object_set_new(t->succeeded, job->key,
                                json_string(job->call->id));
        take_documents(t, job);
        return LOOM_HOOK_CONTINUE;
    }
    if (i < 0 || t->blocked[i] || ++t->failures[i] < LOOM_RUN_TOOL_FAILURES_MAX)
        return LOOM_HOOK_CONTINUE;
    t->blocked[i] = 1;
    t->req_defs_stale = 1;
    if (asprintf(&note,
                 "%s\n[loom: tool '%s' has now failed %d times in "
                 "this run and is blocked: it is no longer available. Do "
                 "not call it again; continue with other tools or answer "
                 "with what you have.]",
                 job->output ? job->output : "", job->tool->name,
                 t->failures[i]) >= 0) {
        free(job->output);
        job->output = note;
    }
    return LOOM_HOOK_CONTINUE;
}

/* ---- the chain -------------------------------------------------------- */

int loom__toolturn_new(loom__toolturn **out, const loom__toolturn_options *o)
{
    loom__toolturn *t = calloc(1, sizeof(*t));
    size_t n = 0, nserver = o->tools->nserver;

    *out = NULL;
    if (!t)
        return loom__error_oom();
    t->o = *o;
    t->hooks = calloc(o->hooks_len + 3, sizeof(*t->hooks));
    t->blocked = calloc(nserver + 1, sizeof(*t->blocked));
    t->failures = calloc(nserver + 1, sizeof(*t->failures));
    t->succeeded = json_object();
    t->turn_keys = json_object();
    t->seen = json_object();
    t->documents = json_array();
    t->records = json_array();
    if (!t->hooks || !t->blocked || !t->failures || !t->succeeded ||
        !t->turn_keys || !t->seen || !t->documents || !t->records) {
        loom__toolturn_free(t);
        return loom__error_oom();
    }
    t->hooks[n++] = (loom_tool_hook){budget_before, outcome_after, t};
    t->hooks[n++] = (loom_tool_hook){duplicate_before, NULL, t};
    for (size_t i = 0; i < o->hooks_len; i++)
        t->hooks[n++] = o->hooks[i];
    t->hooks[n++] = (loom_tool_hook){seen_before, NULL, t};
    t->nhooks = n;
    t->req_defs_stale = 1;
    *out = t;
    return 0;
}

void loom__toolturn_set_settings(loom__toolturn *t, const json_t *settings)
{
    t->o.settings = settings;
}

void loom__toolturn_set_registry(loom__toolturn *t,
                                 const loom_tool_registry *registry)
{
    t->o.registry = registry;
}

int loom__toolturn_retool(loom__toolturn *t, int concurrency, long timeout_ms)
{
    size_t nserver = t->o.tools->nserver;
    unsigned char *blocked = calloc(nserver + 1, sizeof(*blocked));
    int *failures = calloc(nserver + 1, sizeof(*failures));

    if (!blocked || !failures) {
        free(blocked);
        free(failures);
        return loom__error_oom();
    }
    free(t->blocked);
    free(t->failures);
    t->blocked = blocked;
    t->failures = failures;
    t->req_defs_stale = 1;
    t->o.concurrency = concurrency;
    t->o.timeout_ms = timeout_ms;
    return 0;
}

void loom__toolturn_free(loom__toolturn *t)
{
    if (!t)
        return;
    free(t->hooks);
    free(t->blocked);
    free(t->failures);
    free(t->req_defs);
    json_decref(t->succeeded);
    json_decref(t->turn_keys);
    json_decref(t->seen);
    json_decref(t->documents);
    json_decref(t->records);
    free(t);
}

const json_t *loom__toolturn_records(const loom__toolturn *t)
{
    return t->records;
}

const json_t *loom__toolturn_documents(const loom__toolturn *t)
{
    return t->documents;
}

int loom__toolturn_request_tools(loom__toolturn *t, const loom_tool_def **defs,
                                 size_t *n)
{
    const loom__toolset *set = t->o.tools;

    if (t->req_defs_stale) {
        /* A new array, so the request cache sees the tools changed. */
        loom_tool_def *d = calloc(set->ndefs + 1, sizeof(*d));
        size_t k = 0;
        if (!d)
            return loom__error_oom();
        for (size_t i = 0; i < set->ndefs; i++)
            if (i >= set->nserver || !t->blocked[i])
                d[k++] = set->defs[i];
        free(t->req_defs);
        t->req_defs = d;
        t->nreq_defs = k;
        t->req_defs_stale = 0;
    }
    *defs = t->nreq_defs ? t->req_defs : NULL;
    *n = t->nreq_defs;
    return 0;
}

static void hook_call_init(loom_tool_hook_call *hc, loom__toolturn *t,
                           loom__tool_job *job, loom_buf *text)
{
    memset(hc, 0, sizeof(*hc));
    hc->run = t->o.run;
    hc->call_id = job->call->id;
    hc->tool_name = job->tool ? job->tool->name : job->call->name;
    hc->iteration = t->iteration;
    hc->arguments = job->args;
    loom_buf_clear(text);
    hc->text = text;
}

/* Runs the before chain on a prepared job; it may end done (skipped,
 * blocked, or refused new arguments). */
static void before_chain(loom__toolturn *t, loom__tool_job *job)
{
    loom_buf text;
    size_t max_error = t->o.max_error;

    loom_buf_init(&text, t->o.max_result);
    for (size_t i = 0; i < t->nhooks && !job->done; i++) {
        const loom_tool_hook *h = &t->hooks[i];
        loom_tool_hook_call hc;
        loom_hook_action act;
        char *msg = NULL;

        if (!h->before_tool)
            continue;
        hook_call_init(&hc, t, job, &text);
        t->cur = job;
        act = h->before_tool(&hc, h->payload);
        t->cur = NULL;
        if (act != LOOM_HOOK_REWRITE || !hc.new_arguments) {
            json_decref(hc.new_arguments);
            hc.new_arguments = NULL;
        }
        switch (act) {
        case LOOM_HOOK_REWRITE:
            if (!hc.new_arguments)
                break;
            if (loom_schema_validate(job->tool->parameters, hc.new_arguments,
                                     &msg) != 0) {
                char *why = NULL;
                if (asprintf(&why,
                             "a before-tool hook gave arguments that "
                             "do not fit the schema of '%s': %s",
                             job->tool->name, msg ? msg : "invalid") < 0)
                    why = NULL;
                loom__tool_job_fail(job, "hook", LOOM_EINVALID,
                                    why ? why
                                        : "invalid arguments from a "
                                          "hook",
                                    NULL, max_error);
                free(why);
                free(msg);
                json_decref(hc.new_arguments);
                break;
            }
            json_decref(job->args);
            job->args = hc.new_arguments;
            break;
        case LOOM_HOOK_SKIP:
            free(job->output);
            job->output = strdup(text.len ? text.ptr
                                          : "This call was skipped by a "
                                            "hook and not run.");
            job->done = 1;
            job->skipped = 1;
            break;
        case LOOM_HOOK_BLOCK:
            loom__tool_job_fail(job, "blocked", LOOM_ERROR,
                                text.len ? text.ptr
                                         : "this call was blocked by a hook",
                                NULL, max_error);
            break;
        default:
            break;
        }
    }
    loom_buf_free(&text);
}

/* Runs the after chain on a job that ran. */
static void after_chain(loom__toolturn *t, loom__tool_job *job)
{
    loom_buf text;

    loom_buf_init(&text, t->o.max_result);
    for (size_t i = 0; i < t->nhooks; i++) {
        const loom_tool_hook *h = &t->hooks[i];
        loom_tool_hook_call hc;
        loom_hook_action act;

        if (!h->after_tool)
            continue;
        hook_call_init(&hc, t, job, &text);
        hc.failed = job->failed;
        hc.result = job->output ? job->output : "";
        t->cur = job;
        act = h->after_tool(&hc, h->payload);
        t->cur = NULL;
        json_decref(hc.new_arguments);
        if (act == LOOM_HOOK_REWRITE) {
            char *s = strdup(loom_buf_cstr(&text));
            if (s) {
                free(job->output);
                job->output = s;
            }
        }
    }
    loom_buf_free(&text);
}

/* ---- events and records ------------------------------------------------ */

static void emit_started(loom__toolturn *t, loom__tool_job *job)
{
    pk p;

    if (!loom__emit_on(&t->o.emit))
        return;
    p = pk_new();
    pk_str(&p, "id", job->call->id);
    pk_str(&p, "name", job->call->name);
    pk_set(&p, "arguments", job->args ? json_incref(job->args) : json_null());
    loom__emit_send(&t->o.emit, LOOM_EV_TOOL_STARTED, pk_done(&p));
}

/* A failed job's code as events and records name it. */
static const char *failure_code(const loom__tool_job *job)
{
    return job->code_name ? job->code_name : loom_error_name(job->code);
}

int loom__tool_job_not_enabled(const loom__tool_job *job)
{
    return job->failed && job->code_name &&
           strcmp(job->code_name, LOOM__TOOL_NOT_ENABLED) == 0;
}

static void emit_ended(loom__toolturn *t, loom__tool_job *job)
{
    const loom_tool_call *c = job->call;
    pk p;

    if (!loom__emit_on(&t->o.emit))
        return;
    p = pk_new();
    pk_str(&p, "id", c->id);
    if (job->failed) {
        pk_str(&p, "name", c->name ? c->name : "");
        pk_str(&p, "stage", job->stage);
        /* The record has every failure's code; the event only a code
         * no stage says (denied, TOOL_NOT_ENABLED). */
        if (job->denied)
            pk_str(&p, "code", "denied");
        else if (job->code_name)
            pk_str(&p, "code", job->code_name);
        pk_str(&p, "error", job->error ? job->error : "");
        pk_str(&p, "output", job->output ? job->output : "");
        pk_set(&p, "duration_ms", json_real(job->duration_ms));
        loom__emit_send(&t->o.emit, LOOM_EV_TOOL_FAILED, pk_done(&p));
        return;
    }
    pk_str(&p, "name", c->name);
    pk_str(&p, "output", job->output ? job->output : "");
    pk_set(&p, "truncated", json_boolean(job->truncated));
    pk_int(&p, "output_size", (json_int_t)job->output_size);
    pk_set(&p, "duration_ms", json_real(job->duration_ms));
    if (job->skipped)
        pk_set(&p, "skipped", json_true());
    loom__emit_send(&t->o.emit, LOOM_EV_TOOL_COMPLETED, pk_done(&p));
}

/* The arguments as a record shows them: the JSON value, or its first
 * LOOM_RUN_RECORD_ARGS_MAX bytes as a string when larger; the raw text
 * when they do not parse. *size gets the full size in bytes. */
static json_t *record_args(const loom__tool_job *job, size_t *size)
{
    const char *raw = job->call->arguments ? job->call->arguments : "";
    json_t *a = job->model_args ? job->model_args : job->args, *v;
    char *dump = NULL;
    size_t len, cut;

    /* A call that failed its lookup was never parsed. */
    if (a)
        json_incref(a);
    else if (*raw)
        a = json_loads(raw, JSON_DECODE_ANY, NULL);
    else
        a = json_object();
    if (a && !(dump = json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY))) {
        json_decref(a);
        return NULL;
    }
    len = dump ? strlen(dump) : strlen(raw);
    *size = len;
    if (a && len <= LOOM_RUN_RECORD_ARGS_MAX) {
        free(dump);
        return a;
    }
    json_decref(a);
    {
        const char *s = dump ? dump : raw;
        cut = loom__utf8_cut(s, len, LOOM_RUN_RECORD_ARGS_MAX);
        /* json_stringn refuses invalid UTF-8 (raw text may hold it). */
        v = json_stringn(s, cut);
        if (!v)
            v = json_string("(not valid UTF-8)");
        if (v && cut < len) {
            json_t *more = json_sprintf("%s...", json_string_value(v));
            json_decref(v);
            v = more;
        }
    }
    free(dump);
    return v;
}

static const char *record_status(const loom__tool_job *job)
{
    if (job->skipped)
        return "skipped";
    if (job->denied)
        return "denied";
    if (!job->failed)
        return "success";
    return strcmp(job->stage, "blocked") == 0 ? "blocked" : "error";
}

/* A sub-agent call's child records join the run's, after the call's
 * own (each says its run and agent). */
static void merge_records(loom__toolturn *t, const loom__tool_job *job)
{
    const json_t *recs = json_object_get(job->report, "records");
    size_t i;
    json_t *r;

    json_array_foreach(recs, i, r)
    {
        if (json_array_size(t->records) >= LOOM_RUN_MAX_TOOL_RECORDS)
            break;
        json_array_append(t->records, r);
    }
}

/* Keeps the call's record on the run and sends it as tool.metric. */
static void record(loom__toolturn *t, loom__tool_job *job)
{
    size_t args_size = 0;
    json_t *args = record_args(job, &args_size), *r, *err = json_null();
    pk rec;

    if (job->failed)
        err = json_pack("{s:s,s:s,s:s}", "code", failure_code(job), "stage",
                        job->stage, "message", job->error ? job->error : "");
    /* As json_pack would make it: a NULL arguments, error or documents
     * leaves its key out. */
    rec = pk_new();
    pk_str(&rec, "call_id", job->call->id);
    pk_str(&rec, "tool",
           job->tool ? job->tool->name
                     : (job->call->name ? job->call->name : ""));
    pk_int(&rec, "iteration", t->iteration);
    if (args)
        pk_set(&rec, "arguments", args);
    pk_int(&rec, "arguments_size", (json_int_t)args_size);
    pk_int(&rec, "started_at_ms", (json_int_t)job->started_at_ms);
    pk_set(&rec, "duration_ms", json_real(job->duration_ms));
    pk_str(&rec, "status", record_status(job));
    if (err)
        pk_set(&rec, "error", err);
    pk_int(&rec, "result_size",
           (json_int_t)(job->output ? strlen(job->output) : 0));
    pk_set(&rec, "truncated", json_boolean(job->truncated));
    pk_int(&rec, "cost_micros", (json_int_t)job->cost_micros);
    if (job->documents_added)
        pk_set(&rec, "documents", json_incref(job->documents_added));
    if (!(r = pk_done(&rec)))
        return;
    if (!json_object_get(r, "documents"))
        json_object_set_new(r, "documents", json_array());
    if (job->excluded_added)
        json_object_set_new(r, "excluded_ids_added",
                            json_integer((json_int_t)job->excluded_added));
    if (job->progress) {
        json_t *p =
            json_pack("{s:s,s:O}", "type", "PROGRESS", "steps", job->progress);
        if (p && job->progress_dropped)
            json_object_set_new(
                p, "steps_dropped",
                json_integer((json_int_t)job->progress_dropped));
        json_object_set_new(r, "progress", p);
    }
    if (json_array_size(t->records) < LOOM_RUN_MAX_TOOL_RECORDS)
        json_array_append(t->records, r);
    if (loom__emit_on(&t->o.emit))
        loom__emit_send(&t->o.emit, LOOM_EV_TOOL_METRIC, json_incref(r));
    json_decref(r);
    merge_records(t, job);
}

/* A job has its outcome: after hooks (when it ran), events, record. */
static void finish(loom__toolturn *t, loom__tool_job *job)
{
    if (!job->started_at_ms)
        job->started_at_ms = loom__unix_ms();
    if (job->executed)
        after_chain(t, job);
    if (!job->output)
        job->output = strdup("Error: no result");
    emit_ended(t, job);
    record(t, job);
}

static void on_notice(loom__tool_job *job, int done, void *payload)
{
    loom__toolturn *t = payload;

    if (done)
        finish(t, job);
    else
        emit_started(t, job);
}

/* Keeps a progress step for the call's record (stored with the turn). */
static void keep_step(loom__tool_job *job, const json_t *ev)
{
    json_t *step;

    if (json_array_size(job->progress) >= LOOM__TOOL_PROGRESS_STEPS_MAX) {
        job->progress_dropped++;
        return;
    }
    if ((!job->progress && !(job->progress = json_array())) ||
        !(step = json_pack("{s:O?,s:O?,s:O?}", "label",
                           json_object_get(ev, "label"), "icon",
                           json_object_get(ev, "icon"), "status",
                           json_object_get(ev, "status"))))
        return;
    json_array_append_new(job->progress, step);
}

/*
 * An event a running call sent (toolexec.c): its data gets the call's id
 * and tool first (unless it names its own), the progress hook sees a
 * progress step, and it goes out, before the call's tool.completed. A
 * sub-agent's event (it carries parent_run_id and parent_call_id) goes
 * out as it came: it is the child's, not a step of the call (it is not
 * kept with the call's record), though the progress hook sees a
 * sub-agent's step too, with who made it in its nested fields. A usage
 * event of the call's own with a purpose is a side call it made, which
 * the run counts (on_usage) and reports itself.
 */
static void on_tool_event(loom__tool_job *job, loom_event_type type,
                          json_t *data, void *payload)
{
    loom__toolturn *t = payload;
    json_t *ev;

    if (json_is_string(json_object_get(data, "parent_run_id"))) {
        if (type == LOOM_EV_TOOL_PROGRESS && t->o.on_progress)
            t->o.on_progress(data, t->o.agent_payload);
        loom__emit_send(&t->o.emit, type, data);
        return;
    }
    if (type == LOOM_EV_USAGE && t->o.on_usage &&
        json_is_string(json_object_get(data, "purpose"))) {
        /* A side call of the tool's: the run counts it and says so. */
        t->o.on_usage(data, job->tool->name, t->o.usage_payload);
        json_decref(data);
        return;
    }
    ev = json_object();
    if (!ev ||
        json_object_set_new(ev, "call_id", json_string(job->call->id)) != 0 ||
        json_object_set_new(ev, "tool", json_string(job->tool->name)) != 0 ||
        json_object_update(ev, data) != 0) {
        json_decref(ev);
        json_decref(data);
        return;
    }
    json_decref(data);
    if (type == LOOM_EV_TOOL_PROGRESS) {
        keep_step(job, ev);
        if (t->o.on_progress)
            t->o.on_progress(ev, t->o.agent_payload);
    }
    loom__emit_send(&t->o.emit, type, ev);
}

/* ---- the turn ---------------------------------------------------------- */

/*
 * The call's timeout: its tool's `timeout_ms` setting, else the run's.
 * A setting that is not a number of milliseconds fails the call.
 */
static void set_timeout(loom__toolturn *t, loom__tool_job *job)
{
    const json_t *set = json_object_get(t->o.settings, job->tool->name);
    const json_t *v = json_object_get(set, "timeout_ms");
    char *msg = NULL;

    job->timeout_ms = t->o.timeout_ms > 0 ? t->o.timeout_ms : 0;
    /* A sub-agent past its timeout ends its child with what it has. */
    job->grace_ms =
        loom__tool_is_agent(job->tool) ? LOOM__TOOL_CANCEL_GRACE_MS : 0;
    if (!v)
        return;
    if (json_is_integer(v) && json_integer_value(v) >= 1 &&
        json_integer_value(v) <= TIMEOUT_SETTING_MAX) {
        job->timeout_ms = (long)json_integer_value(v);
        return;
    }
    if (asprintf(&msg,
                 "setting tools.%s.timeout_ms must be an integer "
                 "from 1 to %ld (milliseconds)",
                 job->tool->name, TIMEOUT_SETTING_MAX) < 0)
        msg = NULL;
    loom__tool_job_fail(job, "execution", LOOM_EINVALID,
                        msg ? msg : "bad timeout_ms setting", NULL,
                        t->o.max_error);
    free(msg);
}

/*
 * Asks the tool's should_use whether it is enabled for this call; when
 * not, the call fails TOOL_NOT_ENABLED and the model reads why. Returns
 * 1 when the call may go on.
 */
static int enabled(loom__toolturn *t, loom__tool_job *job,
                   const loom_tool *tool)
{
    loom_tool_ctx ctx;
    char *msg = NULL;

    if (!tool || !tool->should_use)
        return 1;
    memset(&ctx, 0, sizeof(ctx));
    ctx.call_id = job->call->id;
    ctx.tool_name = tool->name;
    ctx.cancel = t->o.cancel;
    ctx.settings = json_object_get(t->o.settings, tool->name);
    ctx.user_id = t->o.user_id;
    ctx.user_keys = t->o.user_keys;
    if (tool->should_use(&ctx, tool->payload))
        return 1;
    job->tool = tool;
    if (asprintf(&msg,
                 "tool '%s' is not enabled for this user or request; do "
                 "not call it again",
                 tool->name) < 0)
        msg = NULL;
    loom__tool_job_fail(job, "enablement", LOOM_ERROR,
                        msg ? msg : "tool not enabled", NULL, t->o.max_error);
    job->code_name = LOOM__TOOL_NOT_ENABLED;
    free(msg);
    return 0;
}

/*
 * The call's arguments before loom__tool_job_prepare parses them: the
 * agent's preprocess_tool_arguments hook first; then, for a tool whose
 * settings give a fallback, the text is parsed here and, when it is not
 * JSON, becomes {} (default_args_on_bad_json) or what the repair model
 * makes of it (repair_arguments). Sets job->args, fails the job, or
 * leaves both to prepare (which then fails the call as usual).
 */
static void preprocess(loom__toolturn *t, loom__tool_job *job,
                       const loom_tool *tool)
{
    const json_t *set = json_object_get(t->o.settings, tool->name);
    const char *raw = job->call->arguments ? job->call->arguments : "";
    const char *model = json_string_value(
        json_object_get(json_object_get(set, "repair_arguments"), "model"));
    int defaults =
        json_is_true(json_object_get(set, "default_args_on_bad_json"));
    json_error_t jerr;
    json_t *args = NULL;

    if (t->o.preprocess) {
        loom_buf err;
        loom_args_action a;

        loom_buf_init(&err, t->o.max_error);
        a = t->o.preprocess(job->call, &args, &err, t->o.rules_payload);
        if (a == LOOM_ARGS_SET && json_is_object(args))
            job->args = args;
        else if (a != LOOM_ARGS_DEFAULT)
            loom__tool_job_fail(
                job, "arguments", LOOM_EINVALID,
                err.len ? loom_buf_cstr(&err)
                : a == LOOM_ARGS_SET
                    ? "the agent's argument preprocessing gave no JSON object"
                    : "the agent's argument preprocessing refused the call",
                NULL, t->o.max_error);
        if (!job->args)
            json_decref(args);
        loom_buf_free(&err);
        if (a != LOOM_ARGS_DEFAULT)
            return;
    }
    if (job->loop || (!defaults && !model) ||
        (job->args = loom__tool_args_parse(raw, &jerr)) != NULL)
        return;
    if (defaults)
        job->args = json_object();
    else if (t->o.repair)
        t->o.repair(tool, model, raw, &job->args, t->o.rules_payload);
}

/* Resolves, checks and (for a loop tool) runs one server call; a call
 * for the threads is left prepared and not done. */
static void turn_call(loom__toolturn *t, loom__tool_job *job,
                      const loom__tool_exec_opts *xo)
{
    const loom_tool *tool = loom__toolset_server(t->o.tools, job->call->name);
    int k = tool ? loom__plan_tool_index(t->o.plan, tool->name) : -1;

    if (k >= 0 && tool == loom__plan_tool(t->o.plan, k))
        job->loop = k + 1;
    else if (tool && t->o.own && t->o.own(tool, t->o.own_payload))
        job->own = 1;
    if (tool && enabled(t, job, tool))
        preprocess(t, job, tool);
    if (!job->done)
        loom__tool_job_prepare(job, tool, t->o.tools->available, xo);
    if (!job->done)
        before_chain(t, job);
    if (!job->done && !job->loop && !job->own)
        set_timeout(t, job);
    if (!job->done && job->key)
        json_object_set_new(t->turn_keys, job->key, json_string(job->call->id));
    if (job->done) {
        finish(t, job);
    } else if (job->loop) {
        loom__loop_call lc = {t->iteration, t->o.max_error, t->o.emit};
        job->started_at_ms = loom__unix_ms();
        emit_started(t, job);
        loom__plan_execute(t->o.plan, job, &lc);
        finish(t, job);
    } else if (job->own) {
        job->started_at_ms = loom__unix_ms();
        emit_started(t, job);
        t->o.answer(job, t->o.own_payload);
        job->executed = 1;
        finish(t, job);
    }
}

/* ---- approval ----------------------------------------------------------- */

/*
 * Whether a prepared call waits for approval: the agent's hook, else the
 * tool's `approval` setting ("required" or "never"). -1: a bad setting
 * failed the call.
 */
static int needs_approval(loom__toolturn *t, loom__tool_job *job)
{
    const json_t *set = json_object_get(t->o.settings, job->tool->name);
    const json_t *v = json_object_get(set, "approval");
    loom_approval a = LOOM_APPROVAL_DEFAULT;
    char *msg = NULL;

    if (t->o.approval_required)
        a = t->o.approval_required(job->call, job->args, t->o.agent_payload);
    if (a != LOOM_APPROVAL_DEFAULT)
        return a == LOOM_APPROVAL_REQUIRED;
    if (!v || (json_is_string(v) && !strcmp(json_string_value(v), "never")))
        return 0;
    if (json_is_string(v) && !strcmp(json_string_value(v), "required"))
        return 1;
    if (asprintf(&msg,
                 "setting tools.%s.approval must be \"required\" or "
                 "\"never\"",
                 job->tool->name) < 0)
        msg = NULL;
    loom__tool_job_fail(job, "execution", LOOM_EINVALID,
                        msg ? msg : "bad approval setting", NULL,
                        t->o.max_error);
    free(msg);
    return -1;
}

static void emit_approval(loom__toolturn *t, const loom__tool_job *job)
{
    pk p;

    if (!loom__emit_on(&t->o.emit))
        return;
    p = pk_new();
    pk_str(&p, "call_id", job->call->id);
    pk_str(&p, "tool", job->tool->name);
    pk_set(&p, "arguments", job->args ? json_incref(job->args) : json_null());
    pk_set(&p, "timeout_ms",
           t->o.approval_timeout_ms > 0 ? json_integer(t->o.approval_timeout_ms)
                                        : json_null());
    loom__emit_send(&t->o.emit, LOOM_EV_APPROVAL_REQUIRED, pk_done(&p));
}

/* Ends a call that was not approved: denied (reason: the person's, or
 * "approval timed out"), or the run was cancelled while it waited. */
static void refuse(loom__toolturn *t, loom__tool_job *job, int answer,
                   const char *reason)
{
    char *msg = NULL;

    if (answer < 0 && loom_cancel_is_set(t->o.cancel)) {
        loom__tool_job_fail(job, "execution", LOOM_ECANCELED,
                            "the run was cancelled while this call waited "
                            "for approval",
                            NULL, t->o.max_error);
    } else {
        if (answer < 0)
            reason = "approval timed out";
        if (asprintf(&msg, "the user denied this call%s%s", reason ? ": " : "",
                     reason ? reason : "") < 0)
            msg = NULL;
        loom__tool_job_fail(job, "approval", LOOM_ERROR,
                            msg ? msg : "the user denied this call",
                            msg ? msg : "the user denied this call",
                            t->o.max_error);
        job->denied = 1;
    }
    free(msg);
    finish(t, job);
}

/*
 * Asks for approval of the prepared calls that need it (an
 * approval.required event each, all before the wait), waits for the
 * answers, and ends the calls not approved.
 */
static void approve_calls(loom__toolturn *t, loom__tool_job *jobs, size_t n)
{
    unsigned char *asked = calloc(n ? n : 1, 1);
    size_t nasked = 0;
    double deadline = 0;

    for (size_t i = 0; i < n; i++) {
        int need;
        if (jobs[i].done || jobs[i].loop)
            continue;
        if ((need = needs_approval(t, &jobs[i])) < 0) {
            finish(t, &jobs[i]);
            continue;
        }
        if (!need)
            continue;
        if (!asked || loom__approvals_add(t->o.approvals, jobs[i].call->id)) {
            loom__tool_job_fail(&jobs[i], "approval", LOOM_ENOMEM,
                                "out of memory while asking for approval", NULL,
                                t->o.max_error);
            finish(t, &jobs[i]);
            continue;
        }
        asked[i] = 1;
        nasked++;
        emit_approval(t, &jobs[i]);
    }
    if (nasked) {
        if (t->o.approval_timeout_ms > 0)
            deadline = loom__mono_ms_exact() + (double)t->o.approval_timeout_ms;
        loom__approvals_wait(t->o.approvals, t->o.cancel, deadline);
    }
    for (size_t i = 0; i < n && nasked; i++) {
        char *reason = NULL;
        int answer;
        if (!asked[i])
            continue;
        answer =
            loom__approvals_take(t->o.approvals, jobs[i].call->id, &reason);
        if (answer != 1)
            refuse(t, &jobs[i], answer, reason);
        free(reason);
    }
    free(asked);
}

int loom__toolturn_run(loom__toolturn *t, const loom_message *assistant,
                       int iteration, loom__tool_job **jobs_out, size_t *njobs)
{
    size_t n = assistant->tool_calls_len, nj = 0;
    loom__tool_job *jobs = calloc(n + 1, sizeof(*jobs));
    loom__tool_exec_opts xo;
    int rc;

    *jobs_out = NULL;
    *njobs = 0;
    if (!jobs)
        return loom__error_oom();
    t->iteration = iteration;
    json_object_clear(t->turn_keys);
    memset(&xo, 0, sizeof(xo));
    xo.registry = t->o.registry;
    xo.settings = t->o.settings;
    xo.cancel = t->o.cancel;
    xo.max_result = t->o.max_result;
    xo.max_error = t->o.max_error;
    xo.user_id = t->o.user_id;
    xo.user_keys = t->o.user_keys;
    xo.vision = t->o.vision;
    xo.on_event = on_tool_event;
    xo.place = t->o.place;
    for (size_t i = 0; i < n; i++) {
        const loom_tool_call *c = &assistant->tool_calls[i];
        if (loom__toolset_is_client(t->o.tools, c->name))
            continue;
        jobs[nj].call = c;
        turn_call(t, &jobs[nj++], &xo);
    }
    if (t->o.approvals)
        approve_calls(t, jobs, nj);
    rc = loom__tools_execute(jobs, nj, t->o.concurrency, &xo, on_notice, t);
    *jobs_out = jobs;
    *njobs = nj;
    return rc;
}

void loom__toolturn_jobs_free(loom__tool_job *jobs, size_t n)
{
    for (size_t i = 0; jobs && i < n; i++)
        loom__tool_job_clear(&jobs[i]);
    free(jobs);
}
