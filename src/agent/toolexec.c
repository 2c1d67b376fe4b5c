/*
 * Tool execution for one turn (see toolexec.h).
 *
 * Each job runs on a detached thread of its own, at most `width` at a
 * time. The caller's thread (the run's) starts them, waits for finished
 * jobs on a queue, and watches their deadlines and the run's cancel flag
 * (polled, since a signal handler may set it without waking anyone), so
 * the sink sees events from one thread only, in the order tools actually
 * start and finish.
 *
 * Why detached threads and not a pool that is joined: a tool that
 * overruns its timeout must not hold the run. Such a job is abandoned:
 * the caller marks it so under the queue's lock and forgets it, and the
 * thread frees its job when the tool finally returns. So a running job
 * owns copies of all it reads (the call, the arguments, the settings, its
 * own cancel flag) and its output buffers, and the queue (`hub`) is
 * reference counted between the caller and the live threads: whoever
 * leaves last frees it. Nothing of the run is reachable from a thread.
 * The tool itself (execute, payload) belongs to the registry: each slot
 * holds a reference on it (tools/registry.h), dropped when the slot is
 * freed, so the registry lives as long as its last running call. There
 * is no process-wide list of abandoned calls and nothing to wait for.
 *
 * The hub also carries the events running jobs send (loom_tool_progress,
 * loom_tool_delta, loom__tool_ctx_event): a thread queues them under the
 * hub's lock and wakes the caller, which takes them with the finished
 * jobs, all at once, and hands them out first, so a job's events come
 * before its finish. A job's pending events are bounded (toolexec.h);
 * abandoning a job purges its pending events, and a thread whose job
 * was abandoned queues nothing more.
 */
#include "agent/toolexec.h"
#include "agent/emit.h"
#include "agent/subagent.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/fiber.h"
#include "core/utf8.h"
#include "loom/run.h"
#include "tools/registry.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RECEIVED_QUOTE_MAX 500
/* How often the waiting caller looks at the run's cancel flag. */
#define POLL_MS 50.0

void loom__tool_job_fail(loom__tool_job *job, const char *stage, int code,
                         const char *error, const char *output,
                         size_t max_error)
{
    size_t elen = strlen(error), cut = loom__utf8_cut(error, elen, max_error);

    job->done = 1;
    job->failed = 1;
    job->code = code ? code : LOOM_ERROR;
    job->stage = stage;
    free(job->error);
    free(job->output);
    job->error = strndup(error, cut);
    if (output) {
        job->output = strdup(output);
    } else if (cut < elen) {
        if (asprintf(&job->output, "Error: %s... [error truncated: %zu of "
                     "%zu bytes shown]", job->error ? job->error : "",
                     cut, elen) < 0)
            job->output = NULL;
    } else if (asprintf(&job->output, "Error: %s", error) < 0) {
        job->output = NULL;
    }
}

json_t *loom__tool_args_parse(const char *raw, json_error_t *err)
{
    /* Models send "" for tools without arguments: that means {}. So does
     * "{}" itself, the usual case, which needs no parser. */
    raw += strspn(raw, " \t\r\n");
    return *raw && strcmp(raw, "{}") != 0
               ? json_loads(raw, JSON_DECODE_ANY, err)
               : json_object();
}

void loom__tool_job_prepare(loom__tool_job *job, const loom_tool *tool,
                            const char *available,
                            const loom__tool_exec_opts *opts)
{
    const char *name = job->call->name ? job->call->name : "";
    const char *raw = job->call->arguments ? job->call->arguments : "";
    char *msg = NULL, *out = NULL;
    json_error_t jerr;

    job->tool = tool;
    if (!tool) {
        if (asprintf(&msg, "Unknown tool '%s'. Available tools: %s.", name,
                     available && *available ? available : "none") >= 0)
            loom__tool_job_fail(job, "lookup", LOOM_ENOTFOUND, msg, NULL,
                                opts->max_error);
        goto done;
    }
    /* Arguments a preprocessing step already gave are taken as they
     * are (and validated below). */
    if (!job->args)
        job->args = loom__tool_args_parse(raw, &jerr);
    if (!job->args) {
        size_t rlen = strlen(job->call->arguments);
        int q =
            (int)loom__utf8_cut(job->call->arguments, rlen, RECEIVED_QUOTE_MAX);
        if (asprintf(&msg, "invalid JSON in the arguments of '%s': %s",
                     name, jerr.text) >= 0 &&
            asprintf(&out, "Error: The arguments for tool '%s' are not "
                     "valid JSON (%s). Received: %.*s%s. Call the tool "
                     "again with a JSON object.", name, jerr.text, q,
                     job->call->arguments, (size_t)q < rlen ? "..." : "") >=
                0)
            loom__tool_job_fail(job, "arguments", LOOM_EINVALID, msg, out,
                                opts->max_error);
        goto done;
    }
    if (loom_schema_validate(tool->parameters, job->args, &msg) != 0) {
        char *m = msg;
        msg = NULL;
        if (asprintf(&msg, "invalid arguments for '%s': %s", name,
                     m ? m : loom_error_last()) >= 0 &&
            asprintf(&out, "Error: Invalid arguments for tool '%s': %s",
                     name, m ? m : loom_error_last()) >= 0)
            loom__tool_job_fail(job, "validation", LOOM_EINVALID, msg,
                                out, opts->max_error);
        free(m);
        goto done;
    }
done:
    free(msg);
    free(out);
}

/* ---- running jobs on their own threads ---------------------------------- */

typedef struct slot slot;
typedef struct tev tev;

/* An event a job sent, waiting for the caller. */
struct tev {
    tev *next;
    slot *slot;   /* the sender; valid while queued */
    size_t index; /* of the sender's job */
    loom_event_type type;
    json_t *data; /* NULL for a delta: text holds it */
    char *text;   /* a delta's text (joined deltas) */
    size_t len;
    size_t bytes;   /* what it counts toward the bound */
    size_t dropped; /* the job's events lost just before it */
};

/* A job's events channel (loom_tool_ctx.events). */
struct loom_tool_events {
    slot *slot;
};

/* The finished-job and event queues, shared by the caller and the live
 * threads. */
typedef struct {
    pthread_mutex_t mu;
    loom__cond cv;      /* parks a caller on a fiber */
    int refs;           /* the caller, and each thread not yet ended */
    slot *head, *tail;  /* finished, not yet taken by the caller */
    tev *ev_head, *ev_tail; /* sent, not yet taken by the caller */
} hub;

/* One running job: everything its thread reads or writes. */
struct slot {
    hub *hub;
    size_t index;         /* of the caller's job */
    loom__tool_job work;  /* the thread's job; the caller's stays apart */
    loom_tool_call call;  /* copies of the call's strings */
    loom_tool tool;       /* execute and payload, from the registry */
    loom_tool_registry *reg; /* a reference on it, or NULL */
    json_t *settings;     /* a copy of the tool's settings, or NULL */
    char *user_id;        /* a copy of the run's user, or NULL */
    json_t *user_keys;    /* a copy of the user's keys, or NULL */
    loom_cancel cancel;   /* the tool's own flag */
    loom__tool_host host; /* a copy of the run's place */
    size_t max_result, max_error;
    double deadline;      /* monotonic ms; 0: none */
    long grace_ms;        /* the job's (toolexec.h) */
    int stopping;         /* the caller's: past the timeout, cancelled,
                           * in its grace */
    int finished;         /* under hub->mu */
    int abandoned;        /* under hub->mu */
    /* The events channel, and (under hub->mu) the job's pending events:
     * how many, their bytes, the newest, and the events lost since the
     * last one queued. */
    struct loom_tool_events chan;
    int listen; /* the caller takes events */
    size_t ev_n, ev_bytes, ev_dropped;
    tev *ev_last;
    slot *next;
};

static void tev_free(tev *e)
{
    if (!e)
        return;
    json_decref(e->data);
    free(e->text);
    free(e);
}

static void slot_free(slot *s)
{
    if (!s)
        return;
    loom__tool_job_clear(&s->work);
    free(s->call.id);
    free(s->call.name);
    free(s->call.arguments);
    json_decref(s->settings);
    free(s->user_id);
    json_decref(s->user_keys);
    loom__tool_host_clear(&s->host);
    /* The last call out of a registry its owner let go frees it. */
    loom_tool_registry_free(s->reg);
    free(s);
}

static void hub_release(hub *h)
{
    int last;

    pthread_mutex_lock(&h->mu);
    last = --h->refs == 0;
    pthread_mutex_unlock(&h->mu);
    if (!last)
        return;
    while (h->ev_head) {
        tev *nx = h->ev_head->next;
        tev_free(h->ev_head);
        h->ev_head = nx;
    }
    loom__cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

/* Runs one job on the current thread, with the slot's copies. */
static void run_job(slot *s)
{
    loom__tool_job *job = &s->work;
    loom_tool_ctx ctx;
    loom_buf out, summary;
    double t0 = loom__mono_ms_exact();
    int rc;

    memset(&ctx, 0, sizeof(ctx));
    ctx.call_id = s->call.id;
    ctx.tool_name = s->call.name;
    ctx.cancel = &s->cancel;
    ctx.settings = s->settings;
    ctx.user_id = s->user_id;
    ctx.user_keys = s->user_keys;
    loom_buf_init(&out, s->max_result);
    loom_buf_init(&summary, LOOM_TOOL_SUMMARY_MAX);
    ctx.summary = &summary;
    ctx.documents = job->documents;
    ctx.images = job->images;
    ctx.cost_micros = &job->cost_micros;
    ctx.events = s->listen ? &s->chan : NULL;
    ctx.host = &s->host;
    loom_error_clear();
    rc = s->tool.execute(job->args, &ctx, &out, s->tool.payload);
    job->duration_ms = loom__mono_ms_exact() - t0;
    job->output_size = out.len;
    job->executed = 1;
    if (rc == LOOM_ETOOLARGE && out.len > 0) {
        /* The tool filled its whole allowance: keep what fits, say so. */
        size_t keep = out.len;
        while (keep > 0 && ((unsigned char)out.ptr[keep - 1] & 0xC0) == 0x80)
            keep--;
        if (keep > 0 && ((unsigned char)out.ptr[keep - 1] & 0xC0) == 0xC0)
            keep--; /* drop a possibly incomplete multi-byte character */
        job->truncated = 1;
        if (asprintf(&job->output, "%.*s\n[output truncated at %zu bytes]",
                     (int)keep, out.ptr, s->max_result) < 0)
            job->output = NULL;
        job->done = 1;
    } else if (rc < 0) {
        const char *m = out.len ? out.ptr : loom_error_last();
        char *generic = NULL;
        if (!m || !*m) {
            if (asprintf(&generic, "tool '%s' failed without a message (%s)",
                         s->call.name, loom_error_name(rc)) < 0)
                generic = NULL;
            m = generic ? generic : "tool failed";
        }
        loom__tool_job_fail(job, "execution", rc, m, NULL, s->max_error);
        free(generic);
    } else {
        job->output = loom_buf_detach(&out);
        job->done = 1;
    }
    /* A summary stands for a result: a failure has none. */
    if (!job->failed && summary.len)
        job->summary = loom_buf_detach(&summary);
    if (!job->output && job->done)
        job->output = strdup("Error: out of memory while storing the result");
    loom_buf_free(&out);
    loom_buf_free(&summary);
}

/* ---- events from running jobs ------------------------------------------ */

/* What the bound may drop: streamed text and progress, never an event
 * that says something happened. */
static int droppable(loom_event_type type)
{
    return type == LOOM_EV_TOOL_PROGRESS || type == LOOM_EV_TOOL_DELTA ||
           type == LOOM_EV_MESSAGE_DELTA || type == LOOM_EV_REASONING_DELTA;
}

/* Unlinks e (whose predecessor is prev) from h's event queue. */
static void unlink_event(hub *h, tev *prev, tev *e)
{
    if (prev)
        prev->next = e->next;
    else
        h->ev_head = e->next;
    if (h->ev_tail == e)
        h->ev_tail = prev;
    if (e->slot->ev_last == e)
        e->slot->ev_last = NULL;
}

/*
 * Drops s's oldest pending droppable event; the job's next pending event
 * (or the next it queues) learns how many were lost. Returns 0 when s
 * has none to drop. Under h->mu.
 */
static int drop_oldest(hub *h, slot *s)
{
    tev *prev = NULL;

    for (tev *e = h->ev_head; e; prev = e, e = e->next) {
        tev *nx = e->next;
        if (e->slot != s || !droppable(e->type))
            continue;
        while (nx && nx->slot != s)
            nx = nx->next;
        if (nx)
            nx->dropped += e->dropped + 1;
        else
            s->ev_dropped += e->dropped + 1;
        unlink_event(h, prev, e);
        s->ev_n--;
        s->ev_bytes -= e->bytes;
        tev_free(e);
        return 1;
    }
    return 0;
}

/* Purges s's pending events (the caller abandons it). Under h->mu. */
static void purge_events(hub *h, slot *s)
{
    tev *prev = NULL, *e = h->ev_head;

    while (e) {
        tev *nx = e->next;
        if (e->slot == s) {
            unlink_event(h, prev, e);
            tev_free(e);
        } else {
            prev = e;
        }
        e = nx;
    }
    s->ev_n = s->ev_bytes = 0;
}

/* Whether one more event of that many bytes fits s's bound. */
static int fits(const slot *s, size_t bytes)
{
    return s->ev_n < LOOM__TOOL_EVENTS_PENDING_MAX &&
           s->ev_bytes + bytes <= LOOM__TOOL_EVENT_BYTES_MAX;
}

/*
 * Queues e (data, or a delta's text) for the caller within s's bound, or
 * joins a delta to s's newest pending one. Takes e.
 */
static int post(slot *s, tev *e)
{
    hub *h = s->hub;
    tev *last;
    int rc = 0;

    e->slot = s;
    e->index = s->index;
    pthread_mutex_lock(&h->mu);
    if (s->abandoned) {
        rc = LOOM_ENOTFOUND;
        goto out;
    }
    last = s->ev_last;
    if (!e->data && last && !last->data && !s->ev_dropped &&
        s->ev_bytes + e->bytes <= LOOM__TOOL_EVENT_BYTES_MAX) {
        char *t = realloc(last->text, last->len + e->len);
        if (!t) {
            rc = LOOM_ENOMEM;
            s->ev_dropped++;
            goto out;
        }
        memcpy(t + last->len, e->text, e->len);
        last->text = t;
        last->len += e->len;
        last->bytes += e->bytes;
        s->ev_bytes += e->bytes;
        goto out;
    }
    while (!fits(s, e->bytes) && drop_oldest(h, s))
        ;
    /* An event that says something happened (a sub-agent's tool.*,
     * run.*, usage) is never lost to the bound: it only makes room. */
    if (!fits(s, e->bytes) && droppable(e->type)) {
        s->ev_dropped++;
        rc = LOOM_ETOOLARGE;
        goto out;
    }
    e->dropped = s->ev_dropped;
    s->ev_dropped = 0;
    if (h->ev_tail)
        h->ev_tail->next = e;
    else
        h->ev_head = e;
    h->ev_tail = e;
    s->ev_last = e;
    s->ev_n++;
    s->ev_bytes += e->bytes;
    e = NULL;
    loom__cond_signal(&h->cv);
out:
    pthread_mutex_unlock(&h->mu);
    tev_free(e);
    return rc;
}

int loom__tool_ctx_event(const loom_tool_ctx *ctx, loom_event_type type,
                         json_t *data)
{
    tev *e;

    if (!ctx || !ctx->events) {
        json_decref(data);
        return LOOM_ENOTFOUND;
    }
    if (!json_is_object(data)) {
        json_decref(data);
        return LOOM_EINVALID;
    }
    if (!(e = calloc(1, sizeof(*e)))) {
        json_decref(data);
        return LOOM_ENOMEM;
    }
    e->type = type;
    e->data = data;
    e->bytes = loom__json_compact_size(data);
    return post(ctx->events->slot, e);
}

/* A progress field: s cut to LOOM_TOOL_PROGRESS_TEXT_MAX, or null. */
static json_t *progress_text(const char *s)
{
    return s ? loom__json_text(
                   s, loom__utf8_cut(s, strlen(s), LOOM_TOOL_PROGRESS_TEXT_MAX))
             : json_null();
}

void loom_tool_progress(const loom_tool_ctx *ctx, const char *label,
                        const char *icon, const char *status)
{
    pk p;

    if (!ctx || !ctx->events || !label)
        return;
    p = pk_new();
    pk_set(&p, "label", progress_text(label));
    pk_set(&p, "icon", progress_text(icon));
    pk_set(&p, "status", progress_text(status));
    loom__tool_ctx_event(ctx, LOOM_EV_TOOL_PROGRESS, pk_done(&p));
}

void loom_tool_delta(const loom_tool_ctx *ctx, const char *text, size_t len)
{
    tev *e;

    if (!ctx || !ctx->events || !text || len == 0)
        return;
    len = loom__utf8_cut(text, len, LOOM__TOOL_EVENT_BYTES_MAX);
    if (!(e = calloc(1, sizeof(*e))) || !(e->text = malloc(len))) {
        free(e);
        return;
    }
    memcpy(e->text, text, len);
    e->type = LOOM_EV_TOOL_DELTA;
    e->len = e->bytes = len;
    post(ctx->events->slot, e);
}

/* Hands the events taken from the hub to the caller's callback, in
 * order; frees them. */
static void deliver(tev *e, loom__tool_job *jobs,
                    const loom__tool_exec_opts *opts, void *payload)
{
    while (e) {
        tev *nx = e->next;
        json_t *data = e->data;

        e->data = NULL;
        if (!data && (data = json_object()) &&
            json_object_set_new(data, "delta",
                                loom__json_text(e->text, e->len)) != 0) {
            json_decref(data);
            data = NULL;
        }
        if (data && e->dropped)
            json_object_set_new(data, "dropped",
                                json_integer((json_int_t)e->dropped));
        if (data)
            opts->on_event(&jobs[e->index], e->type, data, payload);
        tev_free(e);
        e = nx;
    }
}

static void *worker(void *arg)
{
    slot *s = arg;
    hub *h = s->hub;
    int abandoned;

    run_job(s);
    pthread_mutex_lock(&h->mu);
    s->finished = 1;
    abandoned = s->abandoned;
    if (!abandoned) {
        /* From here the slot is the caller's. */
        if (h->tail)
            h->tail->next = s;
        else
            h->head = s;
        h->tail = s;
        loom__cond_signal(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    if (abandoned)
        slot_free(s);
    hub_release(h);
    return NULL;
}

static void worker_fiber(void *arg)
{
    (void)worker(arg);
}

/*
 * Starts s's job: on a plain thread when the caller is one (the CLI, an
 * embedder); on the caller's worker pool when it runs on a fiber (loom
 * serve): a sub-agent or researcher as a fiber of its own, since its run
 * waits only in ways a fiber parks on, any other tool on the pool's
 * bounded tool threads, since it may block a thread. 0, or -1.
 */
static int launch(slot *s, const loom_tool *tool)
{
    loom__sched *sched = loom__fiber_sched();
    pthread_attr_t attr;
    pthread_t th;
    int ok = 0;

    if (sched && loom__tool_is_agent(tool))
        return loom__fiber_spawn(sched, worker_fiber, s, 0) == 0 ? 0 : -1;
    if (sched)
        return loom__sched_blocking(sched, worker_fiber, s) == 0 ? 0 : -1;
    if (pthread_attr_init(&attr) == 0) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        ok = pthread_create(&th, &attr, worker, s) == 0;
        pthread_attr_destroy(&attr);
    }
    return ok ? 0 : -1;
}

/* Makes the slot of jobs[i] and starts its thread. On failure the job is
 * failed and *out is NULL. */
static void start(hub *h, loom__tool_job *job, size_t i,
                  const loom__tool_exec_opts *opts, slot **out)
{
    const loom_tool_call *c = job->call;
    const json_t *set = opts->settings && job->tool
                            ? json_object_get(opts->settings, job->tool->name)
                            : NULL;
    slot *s = calloc(1, sizeof(*s));
    int ok;

    *out = NULL;
    if (!s)
        goto oom;
    s->hub = h;
    s->index = i;
    s->chan.slot = s;
    s->listen = opts->on_event != NULL;
    s->max_result = opts->max_result;
    s->max_error = opts->max_error;
    s->tool.execute = job->tool->execute;
    s->tool.payload = job->tool->payload;
    s->reg = loom__tool_registry_ref(opts->registry);
    if (!(s->call.id = strdup(c->id ? c->id : "")) ||
        !(s->call.name = strdup(job->tool->name)) ||
        !(s->work.documents = json_array()) ||
        (opts->vision && !(s->work.images = json_array())) ||
        (job->args && !(s->work.args = json_deep_copy(job->args))) ||
        (set && !(s->settings = json_deep_copy(set))) ||
        (opts->user_id && !(s->user_id = strdup(opts->user_id))) ||
        (opts->user_keys &&
         !(s->user_keys = json_deep_copy(opts->user_keys))) ||
        loom__tool_host_init(&s->host, opts->place) != 0)
        goto oom;
    s->tool.name = s->call.name;
    s->work.call = &s->call;
    s->work.tool = &s->tool;
    if (job->timeout_ms > 0)
        s->deadline = loom__mono_ms_exact() + (double)job->timeout_ms;
    s->grace_ms = job->grace_ms;
    job->started_at_ms = loom__unix_ms();
    pthread_mutex_lock(&h->mu);
    h->refs++;
    pthread_mutex_unlock(&h->mu);
    ok = launch(s, job->tool) == 0;
    if (!ok) {
        pthread_mutex_lock(&h->mu);
        h->refs--;
        pthread_mutex_unlock(&h->mu);
        slot_free(s);
        loom__tool_job_fail(job, "execution", LOOM_ERROR,
                            "could not start a thread for the tool", NULL,
                            opts->max_error);
        return;
    }
    *out = s;
    return;
oom:
    slot_free(s);
    loom__tool_job_fail(job, "execution", LOOM_ENOMEM,
                        "out of memory while starting the tool", NULL,
                        opts->max_error);
}

/*
 * A job stopped for its timeout that failed (the cancel it was given) in
 * its grace: the failure says it timed out, followed by what the tool
 * said (a sub-agent's error and partial answer).
 */
static void timed_out(slot *s, long timeout_ms)
{
    loom__tool_job *w = &s->work;
    char *msg = NULL;

    if (asprintf(&msg,
                 "tool '%s' did not finish within its timeout of "
                 "%ld ms and was stopped: %s",
                 s->call.name, timeout_ms, w->error ? w->error : "") < 0)
        return; /* keeps the tool's own failure */
    loom__tool_job_fail(w, "execution", LOOM_ETIMEDOUT, msg, NULL,
                        s->max_error);
    free(msg);
}

/* Moves a finished slot's outcome into the caller's job; frees the slot. */
static void take(loom__tool_job *job, slot *s)
{
    loom__tool_job *w = &s->work;

    if (s->stopping && w->failed)
        timed_out(s, job->timeout_ms);

    job->done = 1;
    job->failed = w->failed;
    job->code = w->code;
    job->stage = w->stage;
    job->truncated = w->truncated;
    job->output_size = w->output_size;
    job->duration_ms = w->duration_ms;
    job->cost_micros = w->cost_micros;
    job->executed = w->executed;
    json_decref(job->report);
    job->report = s->host.report;
    s->host.report = NULL;
    free(job->error);
    free(job->output);
    free(job->summary);
    json_decref(job->documents);
    job->error = w->error;
    job->output = w->output;
    job->summary = w->summary;
    job->documents = json_array_size(w->documents) ? w->documents : NULL;
    if (!job->documents)
        json_decref(w->documents);
    json_decref(job->images);
    job->images = json_array_size(w->images) ? w->images : NULL;
    if (!job->images)
        json_decref(w->images);
    w->error = w->output = w->summary = NULL;
    w->documents = w->images = NULL;
    slot_free(s);
}

/*
 * Gives up on a running job unless it finished meanwhile (it is then
 * taken from the queue as usual). Returns 1 when abandoned.
 */
static int abandon(hub *h, slot *s, loom__tool_job *job, int cancelled,
                   double started, size_t max_error)
{
    char *msg = NULL;
    int gone = 0;

    pthread_mutex_lock(&h->mu);
    if (!s->finished) {
        s->abandoned = 1;
        loom_cancel_set(&s->cancel);
        purge_events(h, s);
        gone = 1;
    }
    pthread_mutex_unlock(&h->mu);
    if (!gone)
        return 0;
    /* From here the slot belongs to its thread. */
    if (cancelled) {
        if (asprintf(&msg, "tool '%s' was stopped because the run was "
                     "cancelled", job->tool->name) < 0)
            msg = NULL;
    } else if (asprintf(&msg, "tool '%s' did not finish within its "
                        "timeout of %ld ms and was abandoned",
                        job->tool->name, job->timeout_ms) < 0) {
        msg = NULL;
    }
    loom__tool_job_fail(job, "execution",
                        cancelled ? LOOM_ECANCELED : LOOM_ETIMEDOUT,
                        msg ? msg : "tool abandoned", NULL, max_error);
    free(msg);
    job->abandoned = 1;
    job->executed = 1;
    job->duration_ms = loom__mono_ms_exact() - started;
    return 1;
}

/* Waits until a job finishes or sends an event, `until` (monotonic ms)
 * passes or, on a fiber, cancel is set. Returns the finished slots,
 * oldest first, or NULL; *evs gets the events sent, oldest first. */
static slot *wait_finished(hub *h, double until, const loom_cancel *cancel,
                           tev **evs)
{
    slot *got;

    pthread_mutex_lock(&h->mu);
    while (!h->head && !h->ev_head && !loom_cancel_is_set(cancel)) {
        int e = loom__cond_wait_cancel(&h->cv, &h->mu, until, cancel);
        if (e == ETIMEDOUT || e == EINVAL)
            break;
    }
    got = h->head;
    h->head = h->tail = NULL;
    *evs = h->ev_head;
    h->ev_head = h->ev_tail = NULL;
    for (tev *e = *evs; e; e = e->next) {
        e->slot->ev_n = e->slot->ev_bytes = 0;
        e->slot->ev_last = NULL;
    }
    pthread_mutex_unlock(&h->mu);
    return got;
}

static hub *hub_new(void)
{
    hub *h = calloc(1, sizeof(*h));

    if (!h)
        return NULL;
    if (pthread_mutex_init(&h->mu, NULL) != 0) {
        free(h);
        return NULL;
    }
    if (loom__cond_init(&h->cv) != 0) {
        pthread_mutex_destroy(&h->mu);
        free(h);
        return NULL;
    }
    h->refs = 1;
    return h;
}

/*
 * Pushes back by elapsed ms the deadline of each running call that
 * started sub-agent runs (a sub-agent tool, a research branch) which
 * wait for approval now: a person's time to answer does not count toward
 * the call's timeout, until it is being stopped.
 */
static void hold_waiting(slot **running, size_t n, double elapsed)
{
    for (size_t i = 0; i < n; i++) {
        slot *s = running[i];
        if (s && s->deadline > 0 && !s->stopping &&
            loom__agent_tree_call_waits(s->host.tree, s->host.run_id,
                                        s->call.id))
            s->deadline += elapsed;
    }
}

int loom__tools_execute(loom__tool_job *jobs, size_t n, int width,
                        const loom__tool_exec_opts *opts,
                        loom__tool_notice_fn notice_cb, void *payload)
{
    slot **running = NULL;
    double *started = NULL, cancel_at = 0, held_at = loom__mono_ms_exact();
    size_t next = 0, active = 0, todo = 0;
    int cancelled = 0, rc = 0;
    hub *h = NULL;

    for (size_t i = 0; i < n; i++)
        todo += !jobs[i].done;
    if (todo == 0)
        return 0;
    if (width < 1)
        width = 1;
    running = calloc(n, sizeof(*running));
    started = calloc(n, sizeof(*started));
    if (!running || !started || !(h = hub_new())) {
        rc = loom__error_oom();
        goto fail_rest;
    }
    for (;;) {
        double now, until;
        slot *fin;
        tev *evs;

        while (active < (size_t)width && next < n) {
            loom__tool_job *job = &jobs[next++];
            if (job->done)
                continue;
            if (loom_cancel_is_set(opts->cancel)) {
                loom__tool_job_fail(job, "execution", LOOM_ECANCELED,
                                    "the run was cancelled before this "
                                    "tool started", NULL, opts->max_error);
                notice_cb(job, 1, payload);
                continue;
            }
            notice_cb(job, 0, payload);
            started[next - 1] = loom__mono_ms_exact();
            start(h, job, next - 1, opts, &running[next - 1]);
            if (!running[next - 1])
                notice_cb(job, 1, payload);
            else
                active++;
        }
        if (active == 0)
            break;
        /* Sleep until a job finishes, a deadline passes or it is time to
         * look at the cancel flag again. */
        now = loom__mono_ms_exact();
        until = now + POLL_MS;
        for (size_t i = 0; i < n; i++)
            if (running[i] && running[i]->deadline > 0 &&
                running[i]->deadline < until)
                until = running[i]->deadline;
        if (cancelled && cancel_at < until)
            until = cancel_at;
        fin = wait_finished(h, until, cancelled ? NULL : opts->cancel, &evs);
        deliver(evs, jobs, opts, payload);
        while (fin) {
            slot *nx = fin->next;
            size_t i = fin->index;
            running[i] = NULL;
            active--;
            take(&jobs[i], fin);
            notice_cb(&jobs[i], 1, payload);
            fin = nx;
        }
        now = loom__mono_ms_exact();
        hold_waiting(running, n, now - held_at);
        held_at = now;
        if (!cancelled && loom_cancel_is_set(opts->cancel)) {
            cancelled = 1;
            cancel_at = now + LOOM__TOOL_CANCEL_GRACE_MS;
            for (size_t i = 0; i < n; i++)
                if (running[i])
                    loom_cancel_set(&running[i]->cancel);
        }
        for (size_t i = 0; i < n; i++) {
            slot *s = running[i];
            int late = s && s->deadline > 0 && now >= s->deadline;
            int gone = s && cancelled && now >= cancel_at;
            if (late && !gone && s->grace_ms > 0 && !s->stopping) {
                /* Stopped, not abandoned: it gets the grace to end with
                 * its own result (a sub-agent's partial answer). */
                s->stopping = 1;
                s->deadline = now + (double)s->grace_ms;
                loom_cancel_set(&s->cancel);
                continue;
            }
            if ((late || gone) &&
                abandon(h, s, &jobs[i], gone && !late, started[i],
                        opts->max_error)) {
                running[i] = NULL;
                active--;
                notice_cb(&jobs[i], 1, payload);
            }
        }
    }

fail_rest:
    for (size_t i = 0; i < n; i++) {
        if (!jobs[i].done) {
            loom__tool_job_fail(&jobs[i], "execution", rc ? rc : LOOM_ERROR,
                                loom_error_last(), NULL, opts->max_error);
            notice_cb(&jobs[i], 1, payload);
        }
    }
    if (h)
        hub_release(h);
    free(running);
    free(started);
    return rc;
}

void loom__tool_job_clear(loom__tool_job *job)
{
    json_decref(job->args);
    free(job->error);
    free(job->output);
    free(job->summary);
    json_decref(job->documents);
    json_decref(job->images);
    free(job->key);
    json_decref(job->model_args);
    json_decref(job->documents_added);
    json_decref(job->progress);
    json_decref(job->report);
    memset(job, 0, sizeof(*job));
}
