/*
 * The run manager: starting runs on worker threads, their event logs, the
 * table that finds them by id, and storing each turn when a run ends.
 *
 * A run is refcounted: the caller of srv_run_start, the worker thread and
 * the table each hold a reference (streams and deferred requests take
 * their own). srv_run_start does only what cannot wait, on the server's
 * polling thread: it resolves the agent, model and tools, checks that a
 * conversation it continues exists (a read, which never queues behind the
 * store's writers), makes the run's and a new conversation's ids, and
 * builds the loom_run so a bad request fails at once. Writes wait on the
 * worker: it creates the new conversation (or loads the history of the
 * one it continues, then builds the run again over it), runs the loop
 * with a recorder in front of the event log, stores the turn (final-only
 * persistence, also for failed and cancelled runs; a busy store is
 * retried for a while) and only then marks the run ended, so a client
 * that sees the end can read the conversation from the store.
 *
 * The event log keeps every event serialized once, in order, so any
 * number of readers can replay it from any seq and follow it live. Its
 * terminal event (run.completed or run.failed) is held back until the
 * turn is stored: a turn that could not be stored ends its log with a
 * run.failed whose error code is "store_failed" instead. The log is
 * bounded by max_run_events_bytes: past it the run is cancelled and only
 * its final event is still logged. The table keeps the last
 * keep_finished_runs ended runs (with their logs) for GET /v1/runs/{id}.
 *
 * The run id is the server's own (the loom_run may be built twice): it
 * replaces the loop's in every event and in the stored turn.
 */
#include "server/srvpriv.h"
#include "agent/model_opts.h"
#include "core/error.h"
#include "loom/log.h"
#include "loom/memory.h"
#include "loom/recorder.h"
#include "store/store_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* What the worker is doing; srv_run_cancel reads it. */
enum { PH_PREPARING = 0, PH_EXECUTING, PH_STORING, PH_ENDED };

/* Backoff between attempts of a store call that failed with LOOM_EIO. */
#define STORE_BACKOFF_MIN_MS 50
#define STORE_BACKOFF_MAX_MS 1000

struct srv_run {
    atomic_int refs;
    srv_server *s;
    char id[LOOM__STORE_ID_SIZE]; /* "run_" + 24 hex digits */
    char *conversation_id;
    char *model;
    char *agent;
    int background;
    int64_t created_ms, ended_ms;
    long long start_mono;
    /* what the loom_run borrows */
    char *system_prompt;
    char *upstream;
    char *user_id;
    char **tool_names;
    size_t ntool_names;
    char *choice_fn;
    json_t *client_json;
    loom_tool_def *client_defs;
    /* The model's router: its fallbacks, cooldowns, prices, and the
     * request options it gives (strings borrowed from it). */
    loom_provider *router;
    loom_model_request_options mreq;
    /* What the continued conversation carries (options borrow them). */
    char *stored_summary;
    size_t stored_covers;
    json_t *stored_plan;
    loom__run_context ctxs; /* the context engine's fallback model */
    loom_run_options opts; /* the worker builds the run again from these */
    loom_messages input;
    loom_run *lr;          /* the worker's until the run ended */
    loom_recorder *rec;
    /* the store work the worker does before the model call */
    int create_conversation;
    int load_history;
    /* cancelling: see srv_run_cancel */
    atomic_int cancel_requested;
    _Atomic(loom_run *) live; /* r->lr once it may execute */
    atomic_int phase;
    /* the outcome, written by the worker before ended */
    int stored;           /* the turn is in the store */
    int failed_here;      /* reported as failed whatever the loop said */
    const char *fail_code; /* error code when failed_here */
    char *store_error;    /* why the turn is not stored, or NULL */
    /* the event log, guarded by lock */
    pthread_mutex_t lock;
    pthread_cond_t cv;
    srv_event **events;
    size_t nevents, capevents;
    size_t bytes;
    srv_event *terminal; /* held until the turn is stored (worker only) */
    int ended;
    int overflow;
    srv_susp **watchers;
    size_t nwatch, capwatch;
    /* the table, guarded by the table's lock */
    struct srv_run *prev, *next;
    int finished;
};

struct srv_runs {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    srv_run *head, *tail;
    int active;   /* runs holding a slot (max_concurrent_runs) */
    int threads;  /* worker threads not yet done with the server */
    int finished;
};

static int64_t unix_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- the table ----------------------------------------------------------- */

int srv__runs_new(srv_runs **out)
{
    srv_runs *rt = calloc(1, sizeof(*rt));

    *out = NULL;
    if (!rt)
        return loom__error_oom();
    pthread_mutex_init(&rt->lock, NULL);
    pthread_cond_init(&rt->cv, NULL);
    *out = rt;
    return 0;
}

static void unlink_run(srv_runs *rt, srv_run *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        rt->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        rt->tail = r->prev;
    r->prev = r->next = NULL;
}

void srv__runs_free(srv_runs *rt)
{
    if (!rt)
        return;
    while (rt->head) {
        srv_run *r = rt->head;
        unlink_run(rt, r);
        srv_run_unref(r);
    }
    pthread_mutex_destroy(&rt->lock);
    pthread_cond_destroy(&rt->cv);
    free(rt);
}

int srv__runs_active(srv_server *s)
{
    int n;

    pthread_mutex_lock(&s->runs->lock);
    n = s->runs->active;
    pthread_mutex_unlock(&s->runs->lock);
    return n;
}

int srv__runs_wait_idle(srv_server *s, long long deadline_ms)
{
    srv_runs *rt = s->runs;
    int idle;

    pthread_mutex_lock(&rt->lock);
    while (rt->active > 0 || rt->threads > 0) {
        struct timespec ts;
        long long left;
        if (deadline_ms < 0) {
            pthread_cond_wait(&rt->cv, &rt->lock);
            continue;
        }
        left = deadline_ms - srv__now_ms();
        if (left <= 0)
            break;
        if (left > 50)
            left = 50;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += left * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&rt->cv, &rt->lock, &ts);
    }
    idle = rt->active == 0 && rt->threads == 0;
    pthread_mutex_unlock(&rt->lock);
    return idle;
}

void srv__runs_cancel_all(srv_server *s)
{
    srv_runs *rt = s->runs;

    pthread_mutex_lock(&rt->lock);
    for (srv_run *r = rt->head; r; r = r->next)
        if (!r->finished)
            (void)srv_run_cancel(r);
    pthread_mutex_unlock(&rt->lock);
}

srv_run *srv_run_find(srv_server *s, const char *id)
{
    srv_runs *rt = s->runs;
    srv_run *found = NULL;

    if (!id)
        return NULL;
    pthread_mutex_lock(&rt->lock);
    /* Newest first: recent runs are the ones asked about. */
    for (srv_run *r = rt->tail; r; r = r->prev) {
        if (strcmp(r->id, id) == 0) {
            found = r;
            srv_run_ref(r);
            break;
        }
    }
    pthread_mutex_unlock(&rt->lock);
    return found;
}

/* ---- refcounting --------------------------------------------------------- */

void srv_run_ref(srv_run *run)
{
    atomic_fetch_add(&run->refs, 1);
}

static void event_free(srv_event *e)
{
    if (!e)
        return;
    json_decref(e->json);
    free((char *)e->text);
    free(e);
}

static void run_free(srv_run *r)
{
    for (size_t i = 0; i < r->nevents; i++)
        event_free(r->events[i]);
    free(r->events);
    event_free(r->terminal);
    free(r->store_error);
    free(r->watchers);
    loom_recorder_free(r->rec);
    loom_run_free(r->lr);
    free(r->stored_summary);
    json_decref(r->stored_plan);
    loom__run_context_free(&r->ctxs);
    loom_provider_free(r->router);
    loom_messages_free(&r->input);
    for (size_t i = 0; i < r->ntool_names; i++)
        free(r->tool_names[i]);
    free(r->tool_names);
    free(r->choice_fn);
    free(r->client_defs);
    json_decref(r->client_json);
    free(r->system_prompt);
    free(r->upstream);
    free(r->user_id);
    free(r->conversation_id);
    free(r->model);
    free(r->agent);
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->cv);
    free(r);
}

void srv_run_unref(srv_run *run)
{
    if (run && atomic_fetch_sub(&run->refs, 1) == 1)
        run_free(run);
}

/* ---- accessors ----------------------------------------------------------- */

const char *srv_run_id(const srv_run *run)
{
    return run->id;
}

const char *srv_run_conversation_id(const srv_run *run)
{
    return run->conversation_id;
}

const char *srv_run_model_name(const srv_run *run)
{
    return run->model;
}

const char *srv_run_agent_name(const srv_run *run)
{
    return run->agent;
}

int srv_run_background(const srv_run *run)
{
    return run->background;
}

int64_t srv_run_created_ms(const srv_run *run)
{
    return run->created_ms;
}

/*
 * Lock-free, as the ticker calls it under susp_lock: the flag is set
 * before the live run is looked at, and the worker publishes the run
 * before it looks at the flag, so one of them always sees the other.
 */
int srv_run_cancel(srv_run *run)
{
    loom_run *lr;

    if (!run)
        return 0;
    atomic_store(&run->cancel_requested, 1);
    if ((lr = atomic_load(&run->live)) != NULL)
        loom_run_cancel(lr);
    return atomic_load(&run->phase) < PH_STORING;
}

int srv_run_ended(srv_run *run)
{
    int e;

    pthread_mutex_lock(&run->lock);
    e = run->ended;
    pthread_mutex_unlock(&run->lock);
    return e;
}

loom_run_status srv_run_status(srv_run *run)
{
    if (!srv_run_ended(run))
        return LOOM_RUN_RUNNING;
    return run->failed_here ? LOOM_RUN_FAILED : loom_run_status_get(run->lr);
}

int srv_run_stored(srv_run *run)
{
    return srv_run_ended(run) && run->stored;
}

const char *srv_run_store_error(srv_run *run)
{
    return srv_run_ended(run) ? run->store_error : NULL;
}

const loom_run *srv_run_result(srv_run *run)
{
    return srv_run_ended(run) ? run->lr : NULL;
}

/* ---- the event log ------------------------------------------------------- */

void srv__run_watch(srv_run *run, srv_susp *sp)
{
    int ok = 1;

    pthread_mutex_lock(&run->lock);
    if (run->nwatch == run->capwatch) {
        size_t c = run->capwatch ? run->capwatch * 2 : 4;
        srv_susp **w = realloc(run->watchers, c * sizeof(*w));
        if (w) {
            run->watchers = w;
            run->capwatch = c;
        } else {
            ok = 0;
        }
    }
    if (ok)
        run->watchers[run->nwatch++] = sp;
    pthread_mutex_unlock(&run->lock);
    if (!ok) {
        /* Out of memory: the watcher is never woken by events, but the
         * ticker still wakes streams for keep-alives, which look again. */
        loom_warn("run %s: out of memory adding a watcher", srv_run_id(run));
    }
}

void srv__run_unwatch(srv_run *run, srv_susp *sp)
{
    pthread_mutex_lock(&run->lock);
    for (size_t i = 0; i < run->nwatch; i++) {
        if (run->watchers[i] == sp) {
            run->watchers[i] = run->watchers[--run->nwatch];
            break;
        }
    }
    pthread_mutex_unlock(&run->lock);
}

/* Wakes every watcher; run->lock held. */
static void wake_watchers(srv_run *run)
{
    for (size_t i = 0; i < run->nwatch; i++)
        srv__wake(run->s, run->watchers[i]);
}

uint64_t srv_run_last_seq(srv_run *run, int *ended)
{
    uint64_t seq;

    pthread_mutex_lock(&run->lock);
    seq = run->nevents ? run->events[run->nevents - 1]->seq : 0;
    if (ended)
        *ended = run->ended;
    pthread_mutex_unlock(&run->lock);
    return seq;
}

/* Index of the first event with seq > after; run->lock held. */
static size_t first_after(const srv_run *run, uint64_t after)
{
    size_t lo = 0, hi = run->nevents;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (run->events[mid]->seq <= after)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

const srv_event *srv_run_next_event(srv_run *run, uint64_t after_seq)
{
    const srv_event *e = NULL;
    size_t i;

    pthread_mutex_lock(&run->lock);
    i = first_after(run, after_seq);
    if (i < run->nevents)
        e = run->events[i];
    pthread_mutex_unlock(&run->lock);
    return e;
}

const srv_event *srv_run_event(srv_run *run, uint64_t seq)
{
    const srv_event *e;

    if (seq == 0)
        return NULL;
    e = srv_run_next_event(run, seq - 1);
    return e && e->seq == seq ? e : NULL;
}

int srv_run_wait(srv_run *run, uint64_t after_seq, long timeout_ms)
{
    struct timespec ts;
    int ready, rc = 0;

    clock_gettime(CLOCK_REALTIME, &ts);
    if (timeout_ms > 0) {
        ts.tv_sec += timeout_ms / 1000;
        ts.tv_nsec += (timeout_ms % 1000) * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
    }
    pthread_mutex_lock(&run->lock);
    for (;;) {
        ready = run->ended || first_after(run, after_seq) < run->nevents;
        if (ready || timeout_ms == 0 || rc == ETIMEDOUT)
            break;
        if (timeout_ms < 0)
            pthread_cond_wait(&run->cv, &run->lock);
        else
            rc = pthread_cond_timedwait(&run->cv, &run->lock, &ts);
    }
    pthread_mutex_unlock(&run->lock);
    return ready;
}

static void note_metrics(srv_run *r, const loom_event *ev)
{
    static const char *const kinds[] = {"prompt", "completion", "cached",
                                        "reasoning"};
    static const char *const keys[] = {"prompt_tokens", "completion_tokens",
                                       "cached_tokens", "reasoning_tokens"};
    srv_metrics *m = r->s->metrics;

    switch (ev->type) {
    case LOOM_EV_TOOL_COMPLETED:
    case LOOM_EV_TOOL_FAILED:
        srv__metrics_tool(
            m, json_string_value(json_object_get(ev->data, "name")),
            ev->type == LOOM_EV_TOOL_COMPLETED
                ? "completed"
                : json_string_value(json_object_get(ev->data, "stage")));
        break;
    case LOOM_EV_USAGE:
        for (size_t i = 0; i < 4; i++)
            srv__metrics_tokens(
                m, r->model, kinds[i],
                (long)json_integer_value(json_object_get(ev->data, keys[i])));
        break;
    default:
        break;
    }
}

/* A log entry for j (taken, also on failure); NULL when out of memory. */
static srv_event *event_new(json_t *j, uint64_t seq, loom_event_type type)
{
    srv_event *e;
    char *text;

    if (!j)
        return NULL;
    if (!(text = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(15))) ||
        !(e = calloc(1, sizeof(*e)))) {
        json_decref(j);
        free(text);
        return NULL;
    }
    e->seq = seq;
    e->type = type;
    e->type_name = loom_event_type_name(type);
    e->json = j;
    e->text = text;
    e->text_len = strlen(text);
    return e;
}

/* Appends e to the log and wakes the readers; run->lock held. 0, or -1
 * when out of memory (e is then still the caller's). */
static int log_append(srv_run *r, srv_event *e)
{
    if (r->nevents == r->capevents) {
        size_t c = r->capevents ? r->capevents * 2 : 64;
        srv_event **ne = realloc(r->events, c * sizeof(*ne));
        if (!ne)
            return -1;
        r->events = ne;
        r->capevents = c;
    }
    r->events[r->nevents++] = e;
    r->bytes += e->text_len;
    pthread_cond_broadcast(&r->cv);
    wake_watchers(r);
    return 0;
}

/*
 * The sink behind the recorder: serializes each event once into the log
 * and wakes the readers. The terminal event is held for the worker to
 * log once the turn is stored. A non-zero return cancels the run.
 */
static int on_event(const loom_event *in, void *payload)
{
    srv_run *r = payload;
    loom_event ev = *in;
    srv_event *e;
    json_t *j;
    int terminal = ev.type == LOOM_EV_RUN_COMPLETED ||
                   ev.type == LOOM_EV_RUN_FAILED;
    int rc = 0;

    ev.run_id = r->id;
    note_metrics(r, &ev);
    if (!(j = loom_event_to_json(&ev)))
        return 1;
    if (ev.type == LOOM_EV_RUN_STARTED)
        json_object_set_new(j, "conversation_id",
                            json_string(r->conversation_id));
    if (!(e = event_new(j, ev.seq, ev.type)))
        return 1;
    if (terminal) {
        /* Only the worker thread calls the sink and reads this. */
        event_free(r->terminal);
        r->terminal = e;
        return 0;
    }
    pthread_mutex_lock(&r->lock);
    if (r->overflow ||
        r->bytes + e->text_len > (size_t)r->s->sc->max_run_events_bytes) {
        if (!r->overflow)
            loom_warn("run %s: event log passed %ld bytes: cancelling it",
                      r->id, r->s->sc->max_run_events_bytes);
        r->overflow = 1;
        rc = 1;
    } else if (log_append(r, e) != 0) {
        rc = 1;
    } else {
        e = NULL;
    }
    pthread_mutex_unlock(&r->lock);
    event_free(e);
    return rc;
}

/* ---- the store ----------------------------------------------------------- */

int srv__store_retry(srv_server *s, srv_store_op op, void *arg,
                     const char *what)
{
    long long deadline = srv__now_ms() + s->store_retry_ms;
    long wait = STORE_BACKOFF_MIN_MS;
    int rc;

    for (;;) {
        long long left;
        struct timespec ts;
        if ((rc = op(arg)) != LOOM_EIO)
            return rc;
        left = deadline - srv__now_ms();
        if (left <= 0)
            return rc;
        if (wait > left)
            wait = (long)left;
        srv__metrics_store_retry(s->metrics, what);
        loom_warn("store: %s failed (%s); retrying in %ld ms", what,
                  loom_error_last(), wait);
        ts.tv_sec = wait / 1000;
        ts.tv_nsec = (wait % 1000) * 1000000L;
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
        wait = wait * 2 > STORE_BACKOFF_MAX_MS ? STORE_BACKOFF_MAX_MS
                                               : wait * 2;
    }
}

static int op_create(void *arg)
{
    srv_run *r = arg;

    return loom__store_conversation_create_id(r->s->store,
                                              r->conversation_id);
}

typedef struct {
    srv_run *r;
    loom_messages *hist;
} load_ctx;

/*
 * Loads what the conversation carries into the next run: the context
 * summary and the plan (kept on the run, which its options borrow), then
 * the history. Appends nothing unless it all succeeds, so a retry starts
 * clean.
 */
static int op_load(void *arg)
{
    load_ctx *c = arg;
    srv_run *r = c->r;
    int rc;

    free(r->stored_summary);
    r->stored_summary = NULL;
    json_decref(r->stored_plan);
    r->stored_plan = NULL;
    if ((rc = loom_store_conversation_summary(r->s->store, r->conversation_id,
                                              &r->stored_summary,
                                              &r->stored_covers)) != 0 ||
        (rc = loom_store_conversation_plan(r->s->store, r->conversation_id,
                                           &r->stored_plan)) != 0)
        return rc;
    return loom_store_load_history(r->s->store, r->conversation_id, c->hist);
}

static int op_save(void *arg)
{
    srv_run *r = arg;
    loom_turn_record turn;
    int rc;

    /* Recorded again on each attempt: only pointers, nothing copied. */
    if ((rc = loom_recorder_turn(r->rec, r->lr, &turn)) != 0)
        return rc;
    turn.run_id = r->id;
    turn.conversation_id = r->conversation_id;
    turn.agent = r->agent;
    turn.input = &r->input;
    return loom_store_save_turn(r->s->store, &turn);
}

/*
 * Notes why the turn is not stored (the message is loom_error_last's)
 * and, when the store is what failed, counts it.
 */
static void store_failed(srv_run *r, const char *op, int rc, int counted)
{
    const char *msg = loom_error_last();

    free(r->store_error);
    r->store_error = strdup(*msg ? msg : loom_error_name(rc));
    r->stored = 0;
    if (counted)
        srv__metrics_store_error(r->s->metrics, op);
    loom_log(LOOM_LOG_ERROR, "run %s: %s failed: %s", r->id, op,
             r->store_error ? r->store_error : loom_error_name(rc));
}

/*
 * The store work before the model call: create the new conversation, or
 * load the history of the one continued and build the run again over
 * it. 0, or the error (the run then fails without calling the model).
 */
static int prepare(srv_run *r, const char **op)
{
    loom_messages hist = {0};
    loom_run *lr = NULL;
    load_ctx lc;
    int rc = 0;

    if (r->create_conversation) {
        *op = "create_conversation";
        return srv__store_retry(r->s, op_create, r, *op);
    }
    if (!r->load_history)
        return 0;
    *op = "load_history";
    lc.r = r;
    lc.hist = &hist;
    if ((rc = srv__store_retry(r->s, op_load, &lc, *op)) == 0) {
        *op = "build_run";
        if (r->stored_summary) {
            r->opts.context.summary = r->stored_summary;
            r->opts.context.summary_covers = r->stored_covers;
        }
        if (r->stored_plan && !r->opts.plan)
            r->opts.plan = r->stored_plan;
        if ((rc = loom_messages_append(&hist, &r->input)) == 0 &&
            (rc = loom_run_new(&lr, &r->opts, &hist)) == 0) {
            loom_run_free(r->lr);
            r->lr = lr;
        }
    }
    loom_messages_free(&hist);
    return rc;
}

/* The events of a run that failed before its model call. */
static void fail_early(srv_run *r, const char *code)
{
    loom_event ev;
    size_t ntools = r->tool_names ? r->ntool_names
                                  : loom_tool_registry_count(r->s->tools);
    int maxit = r->opts.max_iterations > 0 ? r->opts.max_iterations : 10;

    memset(&ev, 0, sizeof(ev));
    ev.run_id = r->id;
    ev.type = LOOM_EV_RUN_STARTED;
    ev.seq = 1;
    ev.data = json_pack("{s:s?,s:s,s:i,s:i}", "agent", r->agent, "model",
                        r->model, "max_iterations", maxit, "tools",
                        (int)(ntools + r->opts.client_tools_len));
    if (ev.data)
        on_event(&ev, r);
    json_decref(ev.data);
    ev.type = LOOM_EV_RUN_FAILED;
    ev.seq = 2;
    ev.data = json_pack(
        "{s:s,s:{s:s,s:o},s:s,s:i,s:{s:i,s:i,s:i,s:i,s:i}}", "status",
        "failed", "error", "code", code, "message",
        loom__store_json_text(r->store_error, strlen(r->store_error)),
        "text", "", "iterations", 0, "usage", "prompt_tokens", 0,
        "completion_tokens", 0, "cached_tokens", 0, "reasoning_tokens", 0,
        "total_tokens", 0);
    if (ev.data)
        on_event(&ev, r);
    json_decref(ev.data);
}

/*
 * The terminal event of a run whose turn could not be stored: a
 * completed run becomes a run.failed with code "store_failed"; a run that
 * failed anyway keeps its event, which gains "store_error". NULL when out
 * of memory (the original is logged then).
 */
static srv_event *unstored_terminal(srv_run *r, const srv_event *t)
{
    json_t *j = json_copy(t->json);
    json_t *msg = loom__store_json_text(r->store_error,
                                        strlen(r->store_error));
    int bad = !j || !msg;

    if (!bad && t->type == LOOM_EV_RUN_COMPLETED)
        bad = json_object_set_new(j, "type", json_string("run.failed")) ||
              json_object_set_new(j, "status", json_string("failed")) ||
              json_object_set_new(j, "error",
                                  json_pack("{s:s,s:O}", "code",
                                            "store_failed", "message", msg));
    else if (!bad)
        bad = json_object_set(j, "store_error", msg);
    json_decref(msg);
    if (bad) {
        json_decref(j);
        return NULL;
    }
    return event_new(j, t->seq, t->type == LOOM_EV_RUN_COMPLETED
                                    ? LOOM_EV_RUN_FAILED
                                    : t->type);
}

static void *worker(void *arg)
{
    srv_run *r = arg;
    srv_server *s = r->s;
    srv_runs *rt = s->runs;
    srv_run *evict[8];
    size_t nevict = 0;
    const char *op = NULL, *status;
    srv_event *t;
    double secs;
    int prep, rc;

    if ((prep = prepare(r, &op)) == 0) {
        atomic_store(&r->phase, PH_EXECUTING);
        atomic_store(&r->live, r->lr);
        if (atomic_load(&r->cancel_requested))
            loom_run_cancel(r->lr);
        loom_run_execute(r->lr);
        atomic_store(&r->phase, PH_STORING);
        if ((rc = srv__store_retry(s, op_save, r, "save_turn")) == 0)
            r->stored = 1;
        else
            store_failed(r, "save_turn", rc, 1);
        if (!r->stored && loom_run_status_get(r->lr) == LOOM_RUN_COMPLETED) {
            r->failed_here = 1;
            r->fail_code = "store_failed";
        }
    } else {
        int from_store = strcmp(op, "build_run") != 0;
        atomic_store(&r->phase, PH_STORING);
        store_failed(r, op, prep, from_store);
        r->failed_here = 1;
        r->fail_code = from_store ? "store_failed" : loom_error_name(prep);
        if (r->store_error)
            fail_early(r, r->fail_code);
    }
    status = loom_run_status_name(r->failed_here
                                      ? LOOM_RUN_FAILED
                                      : loom_run_status_get(r->lr));
    secs = (double)(srv__now_ms() - r->start_mono) / 1000.0;
    srv__metrics_run(s->metrics, status, secs);
    loom_info("run %s %s in %.3fs (conversation %s)%s", r->id, status, secs,
              r->conversation_id, r->stored ? "" : ", turn not stored");
    /* The final event, unless the turn is stored, says it is not. */
    if ((t = r->terminal) != NULL && !r->stored && r->store_error &&
        prep == 0) {
        srv_event *u = unstored_terminal(r, t);
        if (u) {
            event_free(t);
            r->terminal = u;
        }
    }

    /* Free the slot first: a client that sees the end may start its
     * next run at once. */
    pthread_mutex_lock(&rt->lock);
    r->finished = 1;
    rt->finished++;
    /* Forget the oldest ended runs past keep_finished_runs. */
    for (srv_run *o = rt->head; o && nevict < 8 &&
                                rt->finished > s->sc->keep_finished_runs;) {
        srv_run *next = o->next;
        if (o->finished) {
            unlink_run(rt, o);
            rt->finished--;
            evict[nevict++] = o;
        }
        o = next;
    }
    rt->active--;
    pthread_cond_broadcast(&rt->cv);
    pthread_mutex_unlock(&rt->lock);

    pthread_mutex_lock(&r->lock);
    /* The terminal event goes past max_run_events_bytes: it is the one a
     * reader must see. */
    if (r->terminal && log_append(r, r->terminal) == 0)
        r->terminal = NULL;
    atomic_store(&r->phase, PH_ENDED);
    r->ended = 1;
    r->ended_ms = unix_ms();
    pthread_cond_broadcast(&r->cv);
    wake_watchers(r);
    pthread_mutex_unlock(&r->lock);

    /* Past this point the worker no longer touches the server. */
    pthread_mutex_lock(&rt->lock);
    rt->threads--;
    pthread_cond_broadcast(&rt->cv);
    pthread_mutex_unlock(&rt->lock);
    for (size_t i = 0; i < nevict; i++)
        srv_run_unref(evict[i]);
    srv_run_unref(r);
    return NULL;
}

/* ---- starting ------------------------------------------------------------ */

static int reserve_slot(srv_server *s)
{
    srv_runs *rt = s->runs;
    int rc = 0;

    pthread_mutex_lock(&rt->lock);
    if (atomic_load(&s->draining))
        rc = loom__error_set(SRV_EBUSY, "the server is shutting down");
    else if (rt->active >= s->sc->max_concurrent_runs)
        rc = loom__error_set(SRV_EBUSY,
                             "%d runs are already running, the most this "
                             "server allows (max_concurrent_runs); retry "
                             "later",
                             rt->active);
    else {
        rt->active++;
        rt->threads++;
    }
    pthread_mutex_unlock(&rt->lock);
    return rc;
}

static void release_slot(srv_server *s)
{
    pthread_mutex_lock(&s->runs->lock);
    s->runs->active--;
    s->runs->threads--;
    pthread_cond_broadcast(&s->runs->cv);
    pthread_mutex_unlock(&s->runs->lock);
}

static char *dup_or_null(const char *s, int *oom)
{
    char *d = s ? strdup(s) : NULL;

    if (s && !d)
        *oom = 1;
    return d;
}

/* Whether the run offers tool `name` (memory tools: see loom/memory.h). */
static int offered(const srv_run *r, const loom_agent_config *agent,
                   const char *name)
{
    json_t *as = agent ? json_boolean(agent->memory) : NULL;
    int on = loom_memory_tool_offered(name, r->user_id, as, NULL,
                                      r->s->cfg->tools);

    json_decref(as);
    return on == 1;
}

/*
 * Leaves the memory tools out of the run when they may not be offered
 * (no user, memory off for the agent or the tool): from its tool names,
 * or, when it offers every registered tool, by naming all the others.
 */
static int keep_memory_choice(srv_run *r, const loom_agent_config *agent)
{
    const loom_tool_registry *reg = r->s->tools;
    size_t n = reg ? loom_tool_registry_count(reg) : 0, k = 0;
    int hidden = 0;

    if (r->tool_names) {
        for (size_t i = 0; i < r->ntool_names; i++) {
            if (offered(r, agent, r->tool_names[i]))
                r->tool_names[k++] = r->tool_names[i];
            else
                free(r->tool_names[i]);
        }
        r->ntool_names = k;
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        hidden += !offered(r, agent, loom_tool_registry_at(reg, i)->name);
    if (!hidden)
        return 0;
    if (!(r->tool_names = calloc(n + 1, sizeof(*r->tool_names))))
        return loom__error_oom();
    for (size_t i = 0; i < n; i++) {
        const char *name = loom_tool_registry_at(reg, i)->name;
        if (!offered(r, agent, name))
            continue;
        if (!(r->tool_names[r->ntool_names] = strdup(name)))
            return loom__error_oom();
        r->ntool_names++;
    }
    return 0;
}

/* Copies what the loom_run options borrow into r. */
static int keep_spec(srv_run *r, const srv_run_spec *sp,
                     const loom_agent_config *agent)
{
    int oom = 0;

    r->model = dup_or_null(r->mreq.model, &oom);
    r->upstream = dup_or_null(r->mreq.upstream, &oom);
    r->agent = dup_or_null(agent ? agent->name : NULL, &oom);
    r->system_prompt = dup_or_null(
        sp->system_prompt ? sp->system_prompt
                          : agent ? agent->system_prompt : NULL,
        &oom);
    if (sp->tool_names_set || (agent && !agent->tools_all)) {
        const char *const *names = sp->tool_names_set
                                       ? sp->tool_names
                                       : (const char *const *)agent->tools;
        size_t n = sp->tool_names_set ? sp->tool_names_len : agent->tools_len;
        /* One extra slot so an empty list is still a list. */
        r->tool_names = calloc(n + 1, sizeof(*r->tool_names));
        if (!r->tool_names)
            oom = 1;
        for (size_t i = 0; !oom && i < n; i++) {
            if (!(r->tool_names[i] = strdup(names[i])))
                oom = 1;
            else
                r->ntool_names++;
        }
    }
    if (sp->tool_choice_set && sp->tool_choice.function)
        r->choice_fn = dup_or_null(sp->tool_choice.function, &oom);
    if (sp->client_tools_len) {
        r->client_defs = calloc(sp->client_tools_len, sizeof(*r->client_defs));
        if (!r->client_defs)
            oom = 1;
        else
            memcpy(r->client_defs, sp->client_tools,
                   sp->client_tools_len * sizeof(*r->client_defs));
        r->client_json = json_incref(sp->client_tools_json);
    }
    r->user_id = dup_or_null(sp->user_id, &oom);
    if (!oom && loom_messages_append(&r->input, sp->input) != 0)
        oom = 1;
    return oom ? loom__error_oom() : keep_memory_choice(r, agent);
}

/*
 * The conversation's id: a new one (created by the worker), or the one
 * continued, which must exist. The check is a read: in WAL mode it never
 * waits for the store's writers, so it may run on the polling thread.
 */
static int pick_conversation(srv_run *r, const srv_run_spec *sp)
{
    loom_conversation_info info;
    char id[LOOM__STORE_ID_SIZE];
    int rc;

    if (!sp->conversation_id) {
        if ((rc = loom__store_new_id(id, "conv_")) != 0)
            return rc;
        r->create_conversation = 1;
    } else {
        memset(&info, 0, sizeof(info));
        rc = loom_store_conversation_info(r->s->store, sp->conversation_id,
                                          &info);
        loom_conversation_info_clear(&info);
        if (rc)
            return rc;
        /* Without a history given, it is loaded from the store. */
        r->load_history = !sp->history;
    }
    r->conversation_id = strdup(sp->conversation_id ? sp->conversation_id
                                                    : id);
    return r->conversation_id ? 0 : loom__error_oom();
}

/*
 * Fills r->opts and builds the run over hist: the real run, or (when the
 * worker is to load the history) one over the input alone that checks
 * the options now, so a bad request fails before anything starts.
 */
/* The server's adapters (with their metrics and connections) serve every
 * run's routers; the failure record is shared. */
static loom_router_options router_options(srv_server *s)
{
    loom_router_options ro = LOOM_ROUTER_OPTIONS_INIT;

    ro.health = s->health;
    ro.lookup = srv__provider_lookup;
    ro.lookup_payload = s;
    return ro;
}

static int build_run(srv_run *r, const srv_run_spec *sp,
                     const loom_agent_config *agent,
                     const loom_messages *hist)
{
    loom_run_options o = LOOM_RUN_OPTIONS_INIT;
    loom_router_options ropts;
    srv_server *s = r->s;
    int rc;

    o.provider = r->router;
    o.tools = s->tools;
    o.tool_settings = s->cfg->tools;
    o.agent = r->agent;
    o.system_prompt = r->system_prompt;
    if (r->tool_names) {
        o.tool_names = (const char *const *)r->tool_names;
        o.tool_names_len = r->ntool_names;
    }
    o.max_iterations = sp->max_iterations > 0 ? sp->max_iterations
                       : agent                ? agent->max_iterations
                                              : 0;
    if (agent) {
        o.tool_choice = agent->tool_choice;
        o.parallel_tool_calls = agent->parallel_tool_calls;
        o.tool_concurrency = agent->tool_concurrency;
    }
    if (sp->tool_choice_set) {
        o.tool_choice.kind = sp->tool_choice.kind;
        o.tool_choice.function = r->choice_fn;
    }
    if (sp->parallel_tool_calls >= 0)
        o.parallel_tool_calls = sp->parallel_tool_calls;
    o.max_output_tokens = sp->max_tokens > 0 ? sp->max_tokens : 0;
    o.temperature = sp->temperature;
    o.client_tools = r->client_defs;
    o.client_tools_len = sp->client_tools_len;
    o.user_id = r->user_id;
    loom__run_options_use_model(&o, &r->mreq);
    o.model = r->model;
    o.upstream_model = r->upstream;
    ropts = router_options(s);
    if ((rc = loom__run_context_setup(&r->ctxs, &o, s->cfg, &ropts)) != 0 ||
        (rc = loom__run_agent_setup(&r->ctxs, &o, s->cfg, agent, &ropts)) != 0)
        return rc;
    if ((rc = loom_recorder_new(&r->rec, (loom_sink){on_event, r})) != 0)
        return rc;
    o.sink = loom_recorder_sink(r->rec);
    r->opts = o;
    return loom_run_new(&r->lr, &r->opts, hist);
}

int srv_run_start(srv_run **out, srv_server *s, const srv_run_spec *sp)
{
    const loom_agent_config *agent = NULL;
    loom_router_options ropts;
    loom_model_request_options mreq;
    loom_provider *router = NULL;
    loom_messages hist = {0};
    const char *model_name;
    srv_run *r = NULL;
    pthread_attr_t attr;
    pthread_t th;
    int rc, slot = 0;

    *out = NULL;
    if (!sp->input || sp->input->len == 0)
        return loom__error_set(LOOM_EINVALID, "the run has no input");
    if ((rc = reserve_slot(s)) != 0)
        return rc;
    slot = 1;
    if (sp->agent && !(agent = srv_agent(s, sp->agent))) {
        rc = loom__error_set(LOOM_ENOTFOUND, "no agent named '%s'",
                             sp->agent);
        goto fail;
    }
    if (!sp->agent)
        agent = srv_agent(s, NULL);
    model_name = sp->model ? sp->model : srv_default_model(s, agent);
    if (!model_name) {
        rc = loom__error_set(LOOM_EINVALID,
                             "no model provider is configured on this "
                             "server");
        goto fail;
    }
    ropts = router_options(s);
    if ((rc = loom_router_new(&router, s->cfg, model_name, &ropts, &mreq)) !=
        0)
        goto fail;
    if (!(r = calloc(1, sizeof(*r)))) {
        rc = loom__error_oom();
        goto fail;
    }
    r->router = router;
    r->mreq = mreq;
    router = NULL;
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->cv, NULL);
    atomic_init(&r->refs, 1);
    atomic_init(&r->cancel_requested, 0);
    atomic_init(&r->live, NULL);
    atomic_init(&r->phase, PH_PREPARING);
    r->s = s;
    r->background = sp->background;
    r->created_ms = unix_ms();
    r->start_mono = srv__now_ms();
    if ((rc = loom__store_new_id(r->id, "run_")) != 0 ||
        (rc = keep_spec(r, sp, agent)) != 0 ||
        (rc = pick_conversation(r, sp)) != 0 ||
        (sp->history &&
         (rc = loom_messages_append(&hist, sp->history)) != 0) ||
        (rc = loom_messages_append(&hist, sp->input)) != 0 ||
        (rc = build_run(r, sp, agent, &hist)) != 0)
        goto fail;

    /* References: the caller's, the worker's and the table's. */
    atomic_store(&r->refs, 3);
    pthread_mutex_lock(&s->runs->lock);
    r->prev = s->runs->tail;
    if (s->runs->tail)
        s->runs->tail->next = r;
    else
        s->runs->head = r;
    s->runs->tail = r;
    pthread_mutex_unlock(&s->runs->lock);

    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    rc = pthread_create(&th, &attr, worker, r);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        pthread_mutex_lock(&s->runs->lock);
        unlink_run(s->runs, r);
        pthread_mutex_unlock(&s->runs->lock);
        atomic_store(&r->refs, 1);
        rc = loom__error_set(LOOM_ERROR, "cannot start a run thread: %s",
                             strerror(rc));
        goto fail;
    }
    loom_messages_free(&hist);
    *out = r;
    return 0;

fail:
    if (slot)
        release_slot(s);
    if (r)
        srv_run_unref(r);
    loom_messages_free(&hist);
    loom_provider_free(router);
    return rc;
}

/* ---- JSON ---------------------------------------------------------------- */

static json_t *usage_json(const loom_usage *u)
{
    return json_pack("{s:I,s:I,s:I,s:I,s:I}", "prompt_tokens",
                     (json_int_t)u->prompt_tokens, "completion_tokens",
                     (json_int_t)u->completion_tokens, "cached_tokens",
                     (json_int_t)u->cached_tokens, "reasoning_tokens",
                     (json_int_t)u->reasoning_tokens, "total_tokens",
                     (json_int_t)u->total_tokens);
}

/* The "error" of an ended run: null, or {"message"[, "code"]}. */
static json_t *error_json(srv_run *run)
{
    const char *err = loom_run_error(run->lr);

    if (run->failed_here) {
        json_t *msg = loom__store_json_text(
            run->store_error ? run->store_error : "the run failed",
            strlen(run->store_error ? run->store_error : "the run failed"));
        return json_pack("{s:o,s:s}", "message", msg, "code",
                         run->fail_code ? run->fail_code : "store_failed");
    }
    return *err ? json_pack("{s:o}", "message",
                            loom__store_json_text(err, strlen(err)))
                : json_null();
}

json_t *srv_run_to_json(srv_run *run, int with_events)
{
    json_t *o, *events = NULL;
    int ended;

    pthread_mutex_lock(&run->lock);
    ended = run->ended;
    if (with_events) {
        events = json_array();
        for (size_t i = 0; events && i < run->nevents; i++)
            json_array_append(events, run->events[i]->json);
    }
    pthread_mutex_unlock(&run->lock);
    o = json_pack("{s:s,s:s,s:s,s:s,s:s?,s:s,s:b,s:I}", "id", run->id,
                  "object", "run", "status",
                  ended ? loom_run_status_name(srv_run_status(run))
                        : "running",
                  "conversation_id", run->conversation_id, "agent",
                  run->agent, "model", run->model, "background",
                  run->background, "created_at",
                  (json_int_t)run->created_ms);
    if (!o) {
        json_decref(events);
        return NULL;
    }
    if (ended) {
        const loom_run *lr = run->lr;
        size_t npending = 0;
        const loom_tool_call *pc = loom_run_pending_calls(lr, &npending);
        json_object_set_new(o, "ended_at", json_integer(run->ended_ms));
        json_object_set_new(o, "text", json_string(loom_run_text(lr)));
        json_object_set_new(o, "finish_reason",
                            loom_run_finish_reason(lr)
                                ? json_string(loom_run_finish_reason(lr))
                                : json_null());
        json_object_set_new(o, "error", error_json(run));
        json_object_set_new(o, "iterations",
                            json_integer(loom_run_iterations(lr)));
        json_object_set_new(o, "usage", usage_json(loom_run_usage(lr)));
        json_object_set_new(o, "stored", json_boolean(run->stored));
        json_object_set_new(
            o, "store_error",
            run->store_error
                ? loom__store_json_text(run->store_error,
                                        strlen(run->store_error))
                : json_null());
        if (npending) {
            json_t *arr = json_array();
            for (size_t i = 0; arr && i < npending; i++)
                json_array_append_new(
                    arr, json_pack("{s:s?,s:s?,s:s?}", "id", pc[i].id, "name",
                                   pc[i].name, "arguments", pc[i].arguments));
            json_object_set_new(o, "pending_tool_calls", arr);
        }
    } else {
        json_object_set_new(o, "ended_at", json_null());
        json_object_set_new(o, "stored", json_false());
        json_object_set_new(o, "store_error", json_null());
    }
    if (events)
        json_object_set_new(o, "events", events);
    return o;
}
