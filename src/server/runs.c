/*
 * The run manager: starting runs on worker threads, their event logs, the
 * table that finds them by id, and storing each turn when a run ends.
 *
 * A run is refcounted: the caller of srv_run_start, the worker thread and
 * the table each hold a reference (streams and deferred requests take
 * their own). The worker runs the loop with a recorder in front of the
 * event log, stores the turn (final-only persistence, also for failed
 * and cancelled runs), and only then marks the run ended, so a client
 * that sees the end can read the conversation from the store.
 *
 * The event log keeps every event serialized once, in order, so any
 * number of readers can replay it from any seq and follow it live. It is
 * bounded by max_run_events_bytes: past it the run is cancelled and only
 * its final event is still logged. The table keeps the last
 * keep_finished_runs ended runs (with their logs) for GET /v1/runs/{id}.
 */
#include "server/srvpriv.h"
#include "core/error.h"
#include "loom/log.h"
#include "loom/recorder.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct srv_run {
    atomic_int refs;
    srv_server *s;
    char *conversation_id;
    char *model;
    char *agent;
    int background;
    int64_t created_ms, ended_ms;
    long long start_mono;
    /* what the loom_run borrows */
    char *system_prompt;
    char *upstream;
    char **tool_names;
    size_t ntool_names;
    char *choice_fn;
    json_t *client_json;
    loom_tool_def *client_defs;
    loom_messages input;
    loom_run *lr;
    loom_recorder *rec;
    /* the event log, guarded by lock */
    pthread_mutex_t lock;
    pthread_cond_t cv;
    srv_event **events;
    size_t nevents, capevents;
    size_t bytes;
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
            loom_run_cancel(r->lr);
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
        if (strcmp(loom_run_id(r->lr), id) == 0) {
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

static void run_free(srv_run *r)
{
    for (size_t i = 0; i < r->nevents; i++) {
        json_decref(r->events[i]->json);
        free((char *)r->events[i]->text);
        free(r->events[i]);
    }
    free(r->events);
    free(r->watchers);
    loom_recorder_free(r->rec);
    loom_run_free(r->lr);
    loom_messages_free(&r->input);
    for (size_t i = 0; i < r->ntool_names; i++)
        free(r->tool_names[i]);
    free(r->tool_names);
    free(r->choice_fn);
    free(r->client_defs);
    json_decref(r->client_json);
    free(r->system_prompt);
    free(r->upstream);
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
    return loom_run_id(run->lr);
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

void srv_run_cancel(srv_run *run)
{
    if (run)
        loom_run_cancel(run->lr);
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
    return srv_run_ended(run) ? loom_run_status_get(run->lr)
                              : LOOM_RUN_RUNNING;
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

/* The sink behind the recorder: serializes each event once into the log
 * and wakes the readers. A non-zero return cancels the run. */
static int on_event(const loom_event *ev, void *payload)
{
    srv_run *r = payload;
    srv_event *e = NULL;
    json_t *j;
    char *text = NULL;
    int terminal = ev->type == LOOM_EV_RUN_COMPLETED ||
                   ev->type == LOOM_EV_RUN_FAILED;
    int rc = 0;

    note_metrics(r, ev);
    if (!(j = loom_event_to_json(ev)))
        return 1;
    if (ev->type == LOOM_EV_RUN_STARTED)
        json_object_set_new(j, "conversation_id",
                            json_string(r->conversation_id));
    if (!(text = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(15))) ||
        !(e = calloc(1, sizeof(*e)))) {
        json_decref(j);
        free(text);
        return 1;
    }
    e->seq = ev->seq;
    e->type = ev->type;
    e->type_name = loom_event_type_name(ev->type);
    e->json = j;
    e->text = text;
    e->text_len = strlen(text);

    pthread_mutex_lock(&r->lock);
    if (!terminal &&
        (r->overflow ||
         r->bytes + e->text_len > (size_t)r->s->sc->max_run_events_bytes)) {
        if (!r->overflow)
            loom_warn("run %s: event log passed %ld bytes: cancelling it",
                      loom_run_id(r->lr), r->s->sc->max_run_events_bytes);
        r->overflow = 1;
        rc = 1;
    } else if (r->nevents == r->capevents) {
        size_t c = r->capevents ? r->capevents * 2 : 64;
        srv_event **ne = realloc(r->events, c * sizeof(*ne));
        if (ne) {
            r->events = ne;
            r->capevents = c;
        } else {
            rc = 1;
        }
    }
    if (rc == 0) {
        r->events[r->nevents++] = e;
        r->bytes += e->text_len;
        e = NULL;
        pthread_cond_broadcast(&r->cv);
        wake_watchers(r);
    }
    pthread_mutex_unlock(&r->lock);
    if (e) {
        json_decref(e->json);
        free(text);
        free(e);
    }
    return rc;
}

/* ---- the worker ---------------------------------------------------------- */

static void store_turn(srv_run *r)
{
    loom_turn turn;
    int rc;

    if ((rc = loom_recorder_turn(r->rec, r->lr, &turn)) == 0) {
        turn.conversation_id = r->conversation_id;
        turn.agent = r->agent;
        turn.input = &r->input;
        rc = loom_store_save_turn(r->s->store, &turn);
    }
    if (rc)
        loom_log(LOOM_LOG_ERROR, "run %s: storing the turn failed: %s",
                 loom_run_id(r->lr), loom_error_last());
}

static void *worker(void *arg)
{
    srv_run *r = arg;
    srv_server *s = r->s;
    srv_runs *rt = s->runs;
    srv_run *evict[8];
    size_t nevict = 0;
    double secs;

    loom_run_execute(r->lr);
    store_turn(r);
    secs = (double)(srv__now_ms() - r->start_mono) / 1000.0;
    srv__metrics_run(s->metrics, loom_run_status_name(loom_run_status_get(
                                     r->lr)),
                     secs);
    loom_info("run %s %s in %.3fs (conversation %s)", loom_run_id(r->lr),
              loom_run_status_name(loom_run_status_get(r->lr)), secs,
              r->conversation_id);

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

/* Copies what the loom_run options borrow into r. */
static int keep_spec(srv_run *r, const srv_run_spec *sp,
                     const loom_agent_config *agent,
                     const loom_model_config *model)
{
    int oom = 0;

    r->model = dup_or_null(model->name, &oom);
    r->upstream = dup_or_null(model->upstream, &oom);
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
    if (!oom && loom_messages_append(&r->input, sp->input) != 0)
        oom = 1;
    return oom ? loom__error_oom() : 0;
}

/* The conversation so far: given, loaded, or empty for a new one. */
static int load_history(srv_server *s, const srv_run_spec *sp,
                        loom_messages *hist)
{
    loom_conversation_info info;
    int rc;

    if (sp->history) {
        if ((rc = loom_messages_append(hist, sp->history)) != 0)
            return rc;
        if (!sp->conversation_id)
            return 0;
        memset(&info, 0, sizeof(info));
        rc = loom_store_conversation_info(s->store, sp->conversation_id,
                                          &info);
        loom_conversation_info_clear(&info);
        return rc;
    }
    if (!sp->conversation_id)
        return 0;
    return loom_store_load_history(s->store, sp->conversation_id, hist);
}

static int build_run(srv_run *r, const srv_run_spec *sp,
                     const loom_agent_config *agent,
                     const loom_model_config *model, loom_provider *provider,
                     const loom_messages *hist)
{
    loom_run_options o = LOOM_RUN_OPTIONS_INIT;
    srv_server *s = r->s;
    int rc;

    o.provider = provider;
    o.model = r->model;
    o.upstream_model = r->upstream;
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
    o.max_output_tokens =
        sp->max_tokens > 0 ? sp->max_tokens : model->max_output_tokens;
    o.temperature = sp->temperature;
    o.client_tools = r->client_defs;
    o.client_tools_len = sp->client_tools_len;
    if ((rc = loom_recorder_new(&r->rec, (loom_sink){on_event, r})) != 0)
        return rc;
    o.sink = loom_recorder_sink(r->rec);
    return loom_run_new(&r->lr, &o, hist);
}

int srv_run_start(srv_run **out, srv_server *s, const srv_run_spec *sp)
{
    const loom_agent_config *agent = NULL;
    const loom_model_config *model = NULL;
    loom_model_config tmp;
    loom_provider *provider;
    loom_messages hist = {0};
    const char *model_name;
    srv_run *r = NULL;
    pthread_attr_t attr;
    pthread_t th;
    int rc, slot = 0;

    memset(&tmp, 0, sizeof(tmp));
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
    if ((rc = srv_model(s, model_name, &model, &tmp)) != 0)
        goto fail;
    if (!(provider = srv_provider(s, model->provider))) {
        rc = loom__error_set(LOOM_ENOTFOUND, "provider '%s' is not "
                             "configured", model->provider);
        goto fail;
    }
    if (!(r = calloc(1, sizeof(*r)))) {
        rc = loom__error_oom();
        goto fail;
    }
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->cv, NULL);
    atomic_init(&r->refs, 1);
    r->s = s;
    r->background = sp->background;
    r->created_ms = unix_ms();
    r->start_mono = srv__now_ms();
    if ((rc = keep_spec(r, sp, agent, model)) != 0 ||
        (rc = load_history(s, sp, &hist)) != 0 ||
        (rc = loom_messages_append(&hist, sp->input)) != 0 ||
        (rc = build_run(r, sp, agent, model, provider, &hist)) != 0)
        goto fail;
    if (sp->conversation_id)
        r->conversation_id = strdup(sp->conversation_id);
    else if ((rc = loom_store_conversation_create(s->store,
                                                  &r->conversation_id)) != 0)
        goto fail;
    if (!r->conversation_id) {
        rc = loom__error_oom();
        goto fail;
    }

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
    loom_model_config_clear(&tmp);
    *out = r;
    return 0;

fail:
    if (slot)
        release_slot(s);
    if (r)
        srv_run_unref(r);
    loom_messages_free(&hist);
    loom_model_config_clear(&tmp);
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
    o = json_pack("{s:s,s:s,s:s,s:s,s:s?,s:s,s:b,s:I}", "id",
                  loom_run_id(run->lr), "object", "run", "status",
                  ended ? loom_run_status_name(loom_run_status_get(run->lr))
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
        const char *err = loom_run_error(lr);
        size_t npending = 0;
        const loom_tool_call *pc = loom_run_pending_calls(lr, &npending);
        json_object_set_new(o, "ended_at", json_integer(run->ended_ms));
        json_object_set_new(o, "text", json_string(loom_run_text(lr)));
        json_object_set_new(o, "finish_reason",
                            loom_run_finish_reason(lr)
                                ? json_string(loom_run_finish_reason(lr))
                                : json_null());
        json_object_set_new(o, "error",
                            *err ? json_pack("{s:s}", "message", err)
                                 : json_null());
        json_object_set_new(o, "iterations",
                            json_integer(loom_run_iterations(lr)));
        json_object_set_new(o, "usage", usage_json(loom_run_usage(lr)));
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
    }
    if (events)
        json_object_set_new(o, "events", events);
    return o;
}
