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
 * state lives in the run (run_internal.h) and the built-in hooks reach
 * the call they look at through run->cur.
 */
#include "agent/run_internal.h"
#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The longest per-tool timeout the settings may give: a day. */
#define TIMEOUT_SETTING_MAX 86400000L

json_t *loom__run_call_json(const loom_tool_call *c)
{
    return json_pack("{s:s,s:s,s:s}", "id", c->id ? c->id : "", "name",
                     c->name ? c->name : "", "arguments",
                     c->arguments ? c->arguments : "");
}

/* The position of tool in run->offered, or -1. */
static long offered_index(const loom_run *run, const loom_tool *tool)
{
    for (size_t i = 0; tool && i < run->nserver; i++)
        if (run->offered[i] == tool)
            return (long)i;
    return -1;
}

/* ---- built-in policies, as hooks ---------------------------------------- */

/* Failure budget: a tool that failed too often is not run again. */
static loom_hook_action budget_before(loom_tool_hook_call *hc, void *payload)
{
    loom_run *run = payload;
    long i = offered_index(run, run->cur->tool);

    if (i < 0 || !run->blocked[i])
        return LOOM_HOOK_CONTINUE;
    loom_buf_printf(hc->text,
                    "tool '%s' is blocked: it failed %d times in this run. "
                    "Do not call it again; use another tool or answer with "
                    "what you have.",
                    hc->tool_name, run->failures[i]);
    return LOOM_HOOK_BLOCK;
}

/*
 * The canonical text of a call: the tool's name and its arguments with
 * sorted keys, compact, so key order and spacing do not matter.
 */
static char *call_key(const char *name, const json_t *args)
{
    char *dump = args ? json_dumps(args, JSON_COMPACT | JSON_SORT_KEYS |
                                             JSON_ENCODE_ANY)
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
static loom_hook_action duplicate_before(loom_tool_hook_call *hc,
                                         void *payload)
{
    loom_run *run = payload;
    loom__tool_job *job = run->cur;
    const char *first;

    if (job->loop)
        return LOOM_HOOK_CONTINUE;
    free(job->key);
    if (!(job->key = call_key(hc->tool_name, hc->arguments)))
        return LOOM_HOOK_CONTINUE;
    first = json_string_value(json_object_get(run->succeeded, job->key));
    if (first) {
        loom_buf_printf(hc->text,
                        "Not run again: '%s' already succeeded with exactly "
                        "these arguments earlier in this run (call %s); its "
                        "result is above. Use that result, or call the tool "
                        "with different arguments.",
                        hc->tool_name, first);
        return LOOM_HOOK_SKIP;
    }
    first = json_string_value(json_object_get(run->turn_keys, job->key));
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

/* Code points of a UTF-8 string. */
static size_t code_points(const char *s)
{
    size_t n = 0;

    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
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
    loom_run *run = payload;
    loom__tool_job *job = run->cur;
    const json_t *props, *prop, *items, *given;
    json_t *args = NULL, *ids = NULL;
    json_int_t max_items = -1, max_len = -1;
    size_t nseen = json_array_size(run->documents), added = 0;
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
            json_object_get(json_array_get(run->documents, k), "id"));
        if (max_items >= 0 && (json_int_t)json_array_size(ids) >= max_items)
            break;
        if (!id || (max_len >= 0 && (json_int_t)code_points(id) > max_len) ||
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
static void take_documents(loom_run *run, loom__tool_job *job)
{
    size_t i;
    json_t *d;

    if (!job->documents || !(job->documents_added = json_array()))
        return;
    json_array_foreach(job->documents, i, d)
    {
        const char *id = json_string_value(json_object_get(d, "id"));
        if (i >= LOOM_TOOL_DOCUMENTS_MAX ||
            json_array_size(run->documents) >= LOOM_RUN_MAX_DOCUMENTS)
            break;
        if (!id || !*id || strlen(id) > LOOM_TOOL_DOCUMENT_ID_MAX ||
            json_object_get(run->seen, id))
            continue;
        if (json_object_set_new(run->seen, id, json_true()) != 0 ||
            json_array_append(run->documents, d) != 0 ||
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
    loom_run *run = payload;
    loom__tool_job *job = run->cur;
    long i = offered_index(run, job->tool);
    char *note = NULL;

    (void)hc;
    if (!job->failed) {
        if (job->key && !json_object_get(run->succeeded, job->key))
            json_object_set_new(run->succeeded, job->key,
                                json_string(job->call->id));
        take_documents(run, job);
        return LOOM_HOOK_CONTINUE;
    }
    if (i < 0 || run->blocked[i] ||
        ++run->failures[i] < LOOM_RUN_TOOL_FAILURES_MAX)
        return LOOM_HOOK_CONTINUE;
    run->blocked[i] = 1;
    run->req_defs_stale = 1;
    if (asprintf(&note, "%s\n[loom: tool '%s' has now failed %d times in "
                 "this run and is blocked: it is no longer available. Do "
                 "not call it again; continue with other tools or answer "
                 "with what you have.]",
                 job->output ? job->output : "", job->tool->name,
                 run->failures[i]) >= 0) {
        free(job->output);
        job->output = note;
    }
    return LOOM_HOOK_CONTINUE;
}

/* ---- the chain -------------------------------------------------------- */

int loom__hooks_init(loom_run *run)
{
    const loom_run_options *o = &run->opts;
    size_t n = 0;

    run->hooks = calloc(o->hooks_len + 3, sizeof(*run->hooks));
    run->blocked = calloc(run->nserver + 1, sizeof(*run->blocked));
    run->failures = calloc(run->nserver + 1, sizeof(*run->failures));
    run->succeeded = json_object();
    run->turn_keys = json_object();
    run->seen = json_object();
    run->documents = json_array();
    run->records = json_array();
    if (!run->hooks || !run->blocked || !run->failures || !run->succeeded ||
        !run->turn_keys || !run->seen || !run->documents || !run->records)
        return loom__error_oom();
    run->hooks[n++] = (loom_tool_hook){budget_before, outcome_after, run};
    run->hooks[n++] = (loom_tool_hook){duplicate_before, NULL, run};
    for (size_t i = 0; i < o->hooks_len; i++)
        run->hooks[n++] = o->hooks[i];
    run->hooks[n++] = (loom_tool_hook){seen_before, NULL, run};
    run->nhooks = n;
    run->req_defs_stale = 1;
    return 0;
}

void loom__hooks_free(loom_run *run)
{
    free(run->hooks);
    free(run->blocked);
    free(run->failures);
    free(run->req_defs);
    json_decref(run->succeeded);
    json_decref(run->turn_keys);
    json_decref(run->seen);
    json_decref(run->documents);
    json_decref(run->records);
}

int loom__run_request_tools(loom_run *run, const loom_tool_def **defs,
                            size_t *n)
{
    if (run->req_defs_stale) {
        /* A new array, so the request cache sees the tools changed. */
        loom_tool_def *d = calloc(run->ndefs + 1, sizeof(*d));
        size_t k = 0;
        if (!d)
            return loom__error_oom();
        for (size_t i = 0; i < run->ndefs; i++)
            if (i >= run->nserver || !run->blocked[i])
                d[k++] = run->defs[i];
        free(run->req_defs);
        run->req_defs = d;
        run->nreq_defs = k;
        run->req_defs_stale = 0;
    }
    *defs = run->nreq_defs ? run->req_defs : NULL;
    *n = run->nreq_defs;
    return 0;
}

static void hook_call_init(loom_tool_hook_call *hc, loom_run *run,
                           loom__tool_job *job, loom_buf *text)
{
    memset(hc, 0, sizeof(*hc));
    hc->run = run;
    hc->call_id = job->call->id;
    hc->tool_name = job->tool ? job->tool->name : job->call->name;
    hc->iteration = run->iterations;
    hc->arguments = job->args;
    loom_buf_clear(text);
    hc->text = text;
}

/* Runs the before chain on a prepared job; it may end done (skipped,
 * blocked, or refused new arguments). */
static void before_chain(loom_run *run, loom__tool_job *job)
{
    loom_buf text;
    size_t max_error = run->opts.max_tool_error;

    loom_buf_init(&text, run->opts.max_tool_result);
    for (size_t i = 0; i < run->nhooks && !job->done; i++) {
        const loom_tool_hook *h = &run->hooks[i];
        loom_tool_hook_call hc;
        loom_hook_action act;
        char *msg = NULL;

        if (!h->before_tool)
            continue;
        hook_call_init(&hc, run, job, &text);
        run->cur = job;
        act = h->before_tool(&hc, h->payload);
        run->cur = NULL;
        if (act != LOOM_HOOK_REWRITE || !hc.new_arguments) {
            json_decref(hc.new_arguments);
            hc.new_arguments = NULL;
        }
        switch (act) {
        case LOOM_HOOK_REWRITE:
            if (!hc.new_arguments)
                break;
            if (loom_schema_validate(job->tool->parameters,
                                     hc.new_arguments, &msg) != 0) {
                char *why = NULL;
                if (asprintf(&why, "a before-tool hook gave arguments that "
                             "do not fit the schema of '%s': %s",
                             job->tool->name, msg ? msg : "invalid") < 0)
                    why = NULL;
                loom__tool_job_fail(job, "hook", LOOM_EINVALID,
                                    why ? why : "invalid arguments from a "
                                                "hook", NULL, max_error);
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
static void after_chain(loom_run *run, loom__tool_job *job)
{
    loom_buf text;

    loom_buf_init(&text, run->opts.max_tool_result);
    for (size_t i = 0; i < run->nhooks; i++) {
        const loom_tool_hook *h = &run->hooks[i];
        loom_tool_hook_call hc;
        loom_hook_action act;

        if (!h->after_tool)
            continue;
        hook_call_init(&hc, run, job, &text);
        hc.failed = job->failed;
        hc.result = job->output ? job->output : "";
        run->cur = job;
        act = h->after_tool(&hc, h->payload);
        run->cur = NULL;
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

static void emit_started(loom_run *run, loom__tool_job *job)
{
    pk p;

    if (!loom__run_has_sink(run))
        return;
    p = pk_new();
    pk_str(&p, "id", job->call->id);
    pk_str(&p, "name", job->call->name);
    pk_set(&p, "arguments",
           job->args ? json_incref(job->args) : json_null());
    loom__run_emit(run, LOOM_EV_TOOL_STARTED, pk_done(&p));
}

static void emit_ended(loom_run *run, loom__tool_job *job)
{
    const loom_tool_call *c = job->call;
    pk p;

    if (!loom__run_has_sink(run))
        return;
    p = pk_new();
    pk_str(&p, "id", c->id);
    if (job->failed) {
        pk_str(&p, "name", c->name ? c->name : "");
        pk_str(&p, "stage", job->stage);
        pk_str(&p, "error", job->error ? job->error : "");
        pk_str(&p, "output", job->output ? job->output : "");
        pk_set(&p, "duration_ms", json_real(job->duration_ms));
        loom__run_emit(run, LOOM_EV_TOOL_FAILED, pk_done(&p));
        return;
    }
    pk_str(&p, "name", c->name);
    pk_str(&p, "output", job->output ? job->output : "");
    pk_set(&p, "truncated", json_boolean(job->truncated));
    pk_int(&p, "output_size", (json_int_t)job->output_size);
    pk_set(&p, "duration_ms", json_real(job->duration_ms));
    if (job->skipped)
        pk_set(&p, "skipped", json_true());
    loom__run_emit(run, LOOM_EV_TOOL_COMPLETED, pk_done(&p));
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
    cut = len < LOOM_RUN_RECORD_ARGS_MAX ? len : LOOM_RUN_RECORD_ARGS_MAX;
    {
        const char *s = dump ? dump : raw;
        while (cut > 0 && cut < len && ((unsigned char)s[cut] & 0xC0) == 0x80)
            cut--;
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
    if (!job->failed)
        return "success";
    return strcmp(job->stage, "blocked") == 0 ? "blocked" : "error";
}

/* Keeps the call's record on the run and sends it as tool.metric. */
static void record(loom_run *run, loom__tool_job *job)
{
    size_t args_size = 0;
    json_t *args = record_args(job, &args_size), *r, *err = json_null();

    if (job->failed)
        err = json_pack("{s:s,s:s,s:s}", "code", loom_error_name(job->code),
                        "stage", job->stage, "message",
                        job->error ? job->error : "");
    r = json_pack(
        "{s:s,s:s,s:i,s:o*,s:I,s:I,s:f,s:s,s:o*,s:I,s:b,s:I,s:O*}",
        "call_id", job->call->id, "tool",
        job->tool ? job->tool->name
                  : (job->call->name ? job->call->name : ""),
        "iteration", run->iterations, "arguments", args, "arguments_size",
        (json_int_t)args_size, "started_at_ms",
        (json_int_t)job->started_at_ms, "duration_ms", job->duration_ms,
        "status", record_status(job), "error", err, "result_size",
        (json_int_t)(job->output ? strlen(job->output) : 0), "truncated",
        job->truncated, "cost_micros", (json_int_t)job->cost_micros,
        "documents", job->documents_added);
    if (!r)
        return;
    if (!json_object_get(r, "documents"))
        json_object_set_new(r, "documents", json_array());
    if (job->excluded_added)
        json_object_set_new(r, "excluded_ids_added",
                            json_integer((json_int_t)job->excluded_added));
    if (json_array_size(run->records) < LOOM_RUN_MAX_TOOL_RECORDS)
        json_array_append(run->records, r);
    else
        run->records_dropped++;
    if (loom__run_has_sink(run))
        loom__run_emit(run, LOOM_EV_TOOL_METRIC, json_incref(r));
    json_decref(r);
}

/* A job has its outcome: after hooks (when it ran), events, record. */
static void finish(loom_run *run, loom__tool_job *job)
{
    if (!job->started_at_ms)
        job->started_at_ms = loom__wall_ms();
    if (job->executed)
        after_chain(run, job);
    if (!job->output)
        job->output = strdup("Error: no result");
    emit_ended(run, job);
    record(run, job);
}

static void on_notice(loom__tool_job *job, int done, void *payload)
{
    loom_run *run = payload;

    if (done)
        finish(run, job);
    else
        emit_started(run, job);
}

/* ---- the turn ---------------------------------------------------------- */

/*
 * The call's timeout: its tool's `timeout_ms` setting, else the run's.
 * A setting that is not a number of milliseconds fails the call.
 */
static void set_timeout(loom_run *run, loom__tool_job *job)
{
    const json_t *set = json_object_get(run->opts.tool_settings,
                                        job->tool->name);
    const json_t *v = json_object_get(set, "timeout_ms");
    char *msg = NULL;

    job->timeout_ms = run->opts.tool_timeout_ms > 0
                          ? run->opts.tool_timeout_ms : 0;
    if (!v)
        return;
    if (json_is_integer(v) && json_integer_value(v) >= 1 &&
        json_integer_value(v) <= TIMEOUT_SETTING_MAX) {
        job->timeout_ms = (long)json_integer_value(v);
        return;
    }
    if (asprintf(&msg, "setting tools.%s.timeout_ms must be an integer "
                 "from 1 to %ld (milliseconds)", job->tool->name,
                 TIMEOUT_SETTING_MAX) < 0)
        msg = NULL;
    loom__tool_job_fail(job, "execution", LOOM_EINVALID,
                        msg ? msg : "bad timeout_ms setting", NULL,
                        run->opts.max_tool_error);
    free(msg);
}

/* Copies the client calls of a turn into run->pending. */
static int keep_pending(loom_run *run, const loom_message *assistant)
{
    size_t n = assistant->tool_calls_len;

    run->pending = calloc(n, sizeof(*run->pending));
    if (!run->pending)
        return loom__error_oom();
    for (size_t i = 0; i < n; i++) {
        const loom_tool_call *c = &assistant->tool_calls[i];
        loom_tool_call *p = &run->pending[run->npending];
        if (!loom__run_is_client_tool(run, c->name))
            continue;
        run->npending++;
        if (!(p->id = strdup(c->id)) || !(p->name = strdup(c->name)) ||
            !(p->arguments = strdup(c->arguments ? c->arguments : "{}")))
            return loom__error_oom();
    }
    return 0;
}

static void emit_calls(loom_run *run, const loom_message *assistant)
{
    size_t n = assistant->tool_calls_len;
    size_t text_len = assistant->content ? strlen(assistant->content) : 0;
    json_t *calls = json_array();

    for (size_t i = 0; calls && i < n; i++) {
        json_t *c = loom__run_call_json(&assistant->tool_calls[i]);
        size_t off = i < run->ncall_offsets ? run->call_offsets[i]
                                            : SIZE_MAX;
        /* Where in the turn's text the call appeared (its text
         * offset); the end of the text when it streamed no delta. */
        json_object_set_new(
            c, "text_offset",
            json_integer((json_int_t)(off == SIZE_MAX ? text_len : off)));
        json_array_append_new(calls, c);
    }
    loom__run_emit(run, LOOM_EV_TOOL_CALLS,
                   calls ? json_pack("{s:o}", "calls", calls) : NULL);
}

int loom__run_tools(loom_run *run, const loom_message *assistant,
                    size_t *client_calls, int *think_only)
{
    size_t n = assistant->tool_calls_len, nj = 0, nthink = 0;
    loom__tool_job *jobs = calloc(n + 1, sizeof(*jobs));
    const loom_tool *think = &run->loop_tools[LOOM__LOOP_THINK];
    loom__tool_exec_opts xo;
    int rc = 0;

    *client_calls = 0;
    *think_only = 0;
    if (!jobs)
        return loom__error_oom();
    if (loom__run_has_sink(run))
        emit_calls(run, assistant);
    json_object_clear(run->turn_keys);
    memset(&xo, 0, sizeof(xo));
    xo.registry = run->opts.tools;
    xo.settings = run->opts.tool_settings;
    xo.cancel = &run->cancel;
    xo.max_result = run->opts.max_tool_result;
    xo.max_error = run->opts.max_tool_error;
    xo.user_id = run->opts.user_id;
    xo.user_keys = run->opts.user_keys;
    for (size_t i = 0; i < n; i++) {
        const loom_tool_call *c = &assistant->tool_calls[i];
        const loom_tool *tool;
        loom__tool_job *job;

        if (loom__run_is_client_tool(run, c->name)) {
            (*client_calls)++;
            continue;
        }
        job = &jobs[nj++];
        job->call = c;
        tool = loom__run_offered_tool(run, c->name);
        for (int k = 0; tool && k < LOOM__LOOP_COUNT; k++)
            if (tool == &run->loop_tools[k])
                job->loop = k + 1;
        nthink += tool && tool == think;
        loom__tool_job_prepare(job, tool, run->available, &xo);
        if (!job->done)
            before_chain(run, job);
        if (!job->done && !job->loop)
            set_timeout(run, job);
        if (!job->done && job->key)
            json_object_set_new(run->turn_keys, job->key,
                                json_string(c->id));
        if (job->done) {
            finish(run, job);
        } else if (job->loop) {
            job->started_at_ms = loom__wall_ms();
            emit_started(run, job);
            loom__loop_tool_execute(run, job);
            finish(run, job);
        }
    }
    rc = loom__tools_execute(jobs, nj, run->opts.tool_concurrency, &xo,
                             on_notice, run);
    *think_only = nj > 0 && nthink == nj && *client_calls == 0;
    /* Results go back in call order, each matched to its call id. */
    for (size_t i = 0; i < nj; i++) {
        loom_message m = {0};
        char *note = NULL, *shown = NULL;
        int rc2 = 0;
        m.role = LOOM_ROLE_TOOL;
        m.tool_call_id = jobs[i].call->id;
        m.name = jobs[i].call->name;
        m.content = jobs[i].output ? jobs[i].output : "Error: no result";
        m.summary = jobs[i].summary;
        /* Citations: the model reads the numbers of the documents. */
        if (run->cites && !jobs[i].failed && jobs[i].documents &&
            (rc2 = loom__citations_annotate(run->cites, jobs[i].documents,
                                            jobs[i].call->id, &note)) == 0 &&
            note) {
            if (asprintf(&shown, "%s\n\n%s", m.content, note) < 0) {
                shown = NULL;
                rc2 = loom__error_oom();
            }
            m.content = shown;
        }
        if (!rc2)
            rc2 = loom__run_add_message(run, &(loom_messages){&m, 1, 1});
        free(note);
        free(shown);
        if (rc2 && !rc)
            rc = rc2;
    }
    for (size_t i = 0; i < nj; i++)
        loom__tool_job_clear(&jobs[i]);
    free(jobs);
    if (!rc && *client_calls)
        rc = keep_pending(run, assistant);
    return rc;
}
