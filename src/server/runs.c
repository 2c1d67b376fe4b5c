/*
 * The run manager: the server's table of turns (loom/session.h), their
 * worker threads and slots, metrics, and the bridge from a turn's event
 * log to suspended HTTP connections.
 *
 * Everything about a turn itself (resolving the agent and model, loading
 * the conversation, running, storing the turn before its final event,
 * the event log) is the session layer's. A run here is a turn plus what
 * the server keeps about it: its slot (max_concurrent_runs), whether it is
 * a background run, its place in the table (the last keep_finished_runs
 * ended runs stay findable for GET /v1/runs/{id}) and the connections
 * waiting on it. srv_run_start does only what cannot wait, on the
 * server's polling thread: loom_turn_new (which checks the request and
 * reads the store at most once); the worker executes the turn.
 *
 * With server.fibers (the default) a run executes as a fiber on the
 * server's worker pool (loom/pool.h): thousands of runs waiting on model
 * streams share a few threads; without it each run has a thread.
 */
#include "core/clock.h"
#include "core/error.h"
#include "core/utf8.h"
#include "loom/log.h"
#include "loom/pool.h"
#include "loom/session.h"
#include "server/srvpriv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct srv_run {
    atomic_int refs;
    srv_server *s;
    loom_turn *t;
    atomic_int background;
    /* The turn's outcome is final (set by on_ending, before the wake that
     * says it ended): watchers that wait for the end only are woken from
     * then on. */
    atomic_int ending;
    int64_t created_ms, ended_ms;
    long long start_mono;
    /* the table, guarded by the table's lock */
    struct srv_run *prev, *next;
    int finished;
    /* The caller's limits and the call gate (limits.c). */
    srv_admission adm;
    /* The model each run of the turn's tree runs on, by run id (its
     * run.started's, then its agent.changed's), for the metrics of its
     * usage events that name none; touched by the turn's sink only. */
    json_t *models;
};

struct srv_runs {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    srv_run *head, *tail;
    int active;   /* runs holding a slot (max_concurrent_runs) */
    int threads;  /* workers (threads or fibers) not yet done with the
                     server */
    int finished;
    loom_pool *pool; /* NULL: a thread per run */
};

/* ---- the table ----------------------------------------------------------- */

int srv__runs_new(srv_runs **out, const loom_server_config *sc)
{
    srv_runs *rt = calloc(1, sizeof(*rt));
    loom_pool_options po = {LOOM_POOL_OPTIONS_VERSION, 0, 0, 0};
    int rc;

    *out = NULL;
    if (!rt)
        return loom__error_oom();
    pthread_mutex_init(&rt->lock, NULL);
    pthread_cond_init(&rt->cv, NULL);
    if (sc->fibers) {
        po.workers = sc->workers;
        po.tool_threads = sc->tool_threads;
        po.stack_bytes = (size_t)sc->fiber_stack_kb << 10;
        if ((rc = loom_pool_new(&rt->pool, &po)) != 0) {
            srv__runs_free(rt);
            return rc;
        }
        loom_info("runs execute as fibers on %d worker threads",
                  loom_pool_workers(rt->pool));
    }
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
    /* Every run has ended (the caller waited): the pool stops at once. */
    loom_pool_free(rt->pool);
    pthread_mutex_destroy(&rt->lock);
    pthread_cond_destroy(&rt->cv);
    free(rt);
}

loom_pool *srv__runs_pool(const srv_runs *rt)
{
    return rt->pool;
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

    /* The server stops: a research run is left to resume. */
    pthread_mutex_lock(&rt->lock);
    for (srv_run *r = rt->head; r; r = r->next)
        if (!r->finished)
            (void)loom_turn_interrupt(r->t);
    pthread_mutex_unlock(&rt->lock);
}

/* The newest run with this id (tree: or holding a live sub-agent run of
 * that id), a new reference; NULL when none. */
static srv_run *find_run(srv_server *s, const char *id, int tree)
{
    srv_runs *rt = s->runs;
    srv_run *found = NULL;

    if (!id)
        return NULL;
    pthread_mutex_lock(&rt->lock);
    /* Newest first: recent runs are the ones asked about. */
    for (srv_run *r = rt->tail; r; r = r->prev) {
        if (tree ? loom_turn_has_run(r->t, id)
                 : strcmp(srv_run_id(r), id) == 0) {
            found = r;
            srv_run_ref(r);
            break;
        }
    }
    pthread_mutex_unlock(&rt->lock);
    return found;
}

srv_run *srv_run_find(srv_server *s, const char *id)
{
    return find_run(s, id, 0);
}

srv_run *srv_run_find_tree(srv_server *s, const char *id)
{
    return find_run(s, id, 1);
}

/* ---- refcounting --------------------------------------------------------- */

void srv_run_ref(srv_run *run)
{
    atomic_fetch_add(&run->refs, 1);
}

void srv_run_unref(srv_run *run)
{
    if (run && atomic_fetch_sub(&run->refs, 1) == 1) {
        srv__admission_release(&run->adm);
        loom_turn_free(run->t);
        json_decref(run->models);
        free(run);
    }
}

/* ---- accessors ----------------------------------------------------------- */

const char *srv_run_id(const srv_run *run)
{
    return loom_turn_id(run->t);
}

const char *srv_run_conversation_id(const srv_run *run)
{
    return loom_turn_conversation_id(run->t);
}

const char *srv_run_model_name(const srv_run *run)
{
    return loom_turn_model(run->t);
}

const char *srv_run_agent_name(const srv_run *run)
{
    return loom_turn_agent(run->t);
}

int srv_run_background(const srv_run *run)
{
    return atomic_load(&run->background);
}

int srv_run_research(const srv_run *run)
{
    return loom_turn_is_research(run->t);
}

void srv_run_set_background(srv_run *run)
{
    atomic_store(&run->background, 1);
}

int64_t srv_run_created_ms(const srv_run *run)
{
    return run->created_ms;
}

/* Lock-free (loom_turn_cancel), as the ticker calls it under susp_lock. */
int srv_run_cancel(srv_run *run)
{
    return run ? loom_turn_cancel(run->t) : 0;
}

void srv_run_leave(srv_run *run)
{
    if (run && !srv_run_background(run) && !loom_turn_awaiting_input(run->t))
        (void)loom_turn_cancel(run->t);
}

const char *srv_run_user(const srv_run *run)
{
    return loom_turn_user(run->t);
}

int srv_run_approve(srv_run *run, const char *run_id, const char *call_id,
                    int approve, const char *reason)
{
    return loom_turn_approve_in(run->t, run_id, call_id, approve, reason);
}

int srv_run_answer_elicitation(srv_run *run, const char *id, const char *action,
                               const json_t *content)
{
    return loom_turn_answer_elicitation(run->t, id, action, content);
}

int srv_run_ended(srv_run *run)
{
    return loom_turn_ended(run->t);
}

loom_run_status srv_run_status(srv_run *run)
{
    return loom_turn_status(run->t);
}

int srv_run_stored(srv_run *run)
{
    return loom_turn_stored(run->t);
}

const char *srv_run_store_error(srv_run *run)
{
    return loom_turn_store_error(run->t);
}

const loom_run *srv_run_result(srv_run *run)
{
    return loom_turn_run(run->t);
}

/* ---- the event log ------------------------------------------------------- */

/* Runs on the run's thread with the turn's lock held: a watcher of the
 * end only is left alone until then (no trip through the polling thread
 * per event). */
static void wake_susp(void *payload)
{
    srv_susp *sp = payload;

    if (sp->end_only && !atomic_load(&sp->run->ending))
        return;
    srv__wake(sp->srv, sp);
}

void srv__run_watch(srv_run *run, srv_susp *sp)
{
    sp->srv = run->s;
    if (loom_turn_watch(run->t, wake_susp, sp) != 0) {
        /* Out of memory: the watcher is never woken by events, but the
         * ticker still wakes streams for keep-alives, which look again. */
        loom_warn("run %s: out of memory adding a watcher", srv_run_id(run));
    }
}

void srv__run_unwatch(srv_run *run, srv_susp *sp)
{
    loom_turn_unwatch(run->t, wake_susp, sp);
}

uint64_t srv_run_last_seq(srv_run *run, int *ended)
{
    return loom_turn_last_seq(run->t, ended);
}

const srv_event *srv_run_next_event(srv_run *run, uint64_t after_seq)
{
    return loom_turn_next_event(run->t, after_seq);
}

const srv_event *srv_run_event(srv_run *run, uint64_t seq)
{
    return loom_turn_event_at(run->t, seq);
}

int srv_run_wait(srv_run *run, uint64_t after_seq, long timeout_ms)
{
    return loom_turn_wait(run->t, after_seq, timeout_ms);
}

/* The cost_micros of a usage object, when it has one (a priced call). */
static void note_cost(srv_run *r, const char *model, const json_t *usage)
{
    const json_t *c = json_object_get(usage, "cost_micros");

    if (json_is_integer(c))
        srv__metrics_cost(r->s->metrics, model,
                          (long long)json_integer_value(c));
}

/* Notes the model ev's run (a sub-agent's, or the turn's own after a
 * handoff) runs on from now. Out of memory: its usage counts under the
 * turn's model. */
static void note_run_model(srv_run *r, const loom_event *ev)
{
    const json_t *m = json_object_get(ev->data, "model");

    if (!ev->run_id || !json_is_string(m) ||
        (!r->models && !(r->models = json_object())))
        return;
    json_object_set_new(r->models, ev->run_id, json_copy((json_t *)m));
}

/* The model that answered the call of usage event ev (or of a review):
 * the one it names (a router's fallback, a get_model hook's), else its
 * run's agent's, which for a sub-agent is not the turn's. */
static const char *usage_model(srv_run *r, const loom_event *ev,
                               const json_t *data)
{
    const char *m = json_string_value(json_object_get(data, "model"));

    if (!m && ev->run_id)
        m = json_string_value(json_object_get(r->models, ev->run_id));
    return m ? m : loom_turn_model(r->t);
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
    case LOOM_EV_RUN_STARTED:
    case LOOM_EV_AGENT_CHANGED:
        note_run_model(r, ev);
        break;
    case LOOM_EV_USAGE:
        for (size_t i = 0; i < 4; i++)
            srv__metrics_tokens(
                m, usage_model(r, ev, ev->data), kinds[i],
                (long)json_integer_value(json_object_get(ev->data, keys[i])));
        note_cost(r, usage_model(r, ev, ev->data), ev->data);
        break;
    case LOOM_EV_REVIEW:
        note_cost(r, usage_model(r, ev, ev->data),
                  json_object_get(ev->data, "usage"));
        break;
    default:
        break;
    }
}

/* The tools the run's model abandoned after their errors. */
static void note_abandoned(srv_metrics *m, const loom_run *run)
{
    const json_t *counts =
        run ? loom_run_tools_abandoned_after_error(run) : NULL;
    const char *tool;
    json_t *n;

    json_object_foreach((json_t *)counts, tool, n)
    {
        srv__metrics_tools_abandoned(m, tool, (long)json_integer_value(n));
    }
}

/* The caller's sink of the turn: metrics. */
static int on_event(const loom_event *ev, void *payload)
{
    note_metrics(payload, ev);
    return 0;
}

/* ---- the store ----------------------------------------------------------- */

int srv__store_retry(srv_server *s, srv_store_op op, void *arg,
                     const char *what)
{
    return loom_session_store_retry(s->session, op, arg, what);
}

/* ---- the worker ---------------------------------------------------------- */

/*
 * The turn is stored and its final event made: free its slot first, so
 * a client that sees the end may start its next run at once, and forget
 * the oldest ended runs past keep_finished_runs (released by the worker
 * once the turn is marked ended).
 */
typedef struct {
    srv_run *r;
    srv_run *evict[8];
    size_t nevict;
} worker_end;

static void on_ending(loom_turn *t, void *payload)
{
    worker_end *we = payload;
    srv_run *r = we->r;
    srv_server *s = r->s;
    srv_runs *rt = s->runs;
    const char *status = loom_run_status_name(loom_turn_status(t));
    double secs = (double)(srv__now_ms() - r->start_mono) / 1000.0;

    atomic_store(&r->ending, 1);
    srv__metrics_run(s->metrics, status, secs);
    note_abandoned(s->metrics, loom_turn_run(t));
    loom_info("run %s %s in %.3fs (conversation %s)%s", srv_run_id(r), status,
              secs, srv_run_conversation_id(r),
              loom_turn_store_error(t) || !loom_turn_conversation_id(t)
                  ? ", turn not stored"
                  : "");
    /* Every model call of the run is settled: its slots are free. */
    srv__admission_release(&r->adm);
    pthread_mutex_lock(&rt->lock);
    r->finished = 1;
    rt->finished++;
    for (srv_run *o = rt->head;
         o && we->nevict < 8 && rt->finished > s->sc->keep_finished_runs;) {
        srv_run *next = o->next;
        if (o->finished) {
            unlink_run(rt, o);
            rt->finished--;
            we->evict[we->nevict++] = o;
        }
        o = next;
    }
    rt->active--;
    pthread_cond_broadcast(&rt->cv);
    pthread_mutex_unlock(&rt->lock);
    srv__slot_give(s);
    r->ended_ms = loom__unix_ms();
}

static void *worker(void *arg)
{
    worker_end *we = arg;
    srv_run *r = we->r;
    srv_runs *rt = r->s->runs;

    (void)loom_turn_execute(r->t);
    /* Past this point the worker no longer touches the server. */
    pthread_mutex_lock(&rt->lock);
    rt->threads--;
    pthread_cond_broadcast(&rt->cv);
    pthread_mutex_unlock(&rt->lock);
    for (size_t i = 0; i < we->nevict; i++)
        srv_run_unref(we->evict[i]);
    free(we);
    srv_run_unref(r);
    return NULL;
}

static void worker_fiber(void *arg)
{
    (void)worker(arg);
}

/* ---- starting ------------------------------------------------------------ */

/* A slot for the run of request req (NULL: none), which may wait for
 * one in the admission queue (queue.c): SRV_EQUEUED. */
static int reserve_slot(srv_server *s, srv_request *req)
{
    srv_runs *rt = s->runs;
    int rc;

    if (atomic_load(&s->draining))
        return loom__error_set(SRV_EBUSY, "the server is shutting down");
    if ((rc = srv__slot_take(s, req)) != 0)
        return rc;
    pthread_mutex_lock(&rt->lock);
    rt->active++;
    rt->threads++;
    pthread_mutex_unlock(&rt->lock);
    return 0;
}

static void release_slot(srv_server *s)
{
    pthread_mutex_lock(&s->runs->lock);
    s->runs->active--;
    s->runs->threads--;
    pthread_cond_broadcast(&s->runs->cv);
    pthread_mutex_unlock(&s->runs->lock);
    srv__slot_give(s);
}

/* An isolated caller's run continues only its owner's conversations:
 * another's is as unknown as one that does not exist. A store read. */
static int check_owner(srv_server *s, const srv_run_spec *sp)
{
    loom_conversation_info info;
    int rc, mine;

    if (!srv_identity_isolated(sp->who) || !sp->conversation_id)
        return 0;
    if ((rc = loom_store_conversation_info(s->store, sp->conversation_id,
                                           &info)) != 0)
        return rc;
    mine = info.user_id && sp->user_id && !strcmp(info.user_id, sp->user_id);
    loom_conversation_info_clear(&info);
    return mine ? 0
                : loom__error_set(LOOM_ENOTFOUND, "conversation '%s' not found",
                                  sp->conversation_id);
}

/* An API key limited to some models or agents runs only those: the
 * turn's own, as it resolved them. */
static int check_allowed(const srv_run_spec *sp, const loom_turn *t)
{
    int rc =
        srv_identity_allows(sp->who, loom_turn_model(t), loom_turn_agent(t));

    if (rc == SRV_EMODEL_NOT_ALLOWED)
        return loom__error_set(rc, "this API key may not use the model '%s'",
                               loom_turn_model(t));
    if (rc == SRV_EAGENT_NOT_ALLOWED)
        return loom__error_set(rc, "this API key may not use the agent '%s'",
                               loom_turn_agent(t) ? loom_turn_agent(t)
                                                  : "(none)");
    return 0;
}

/* The keys a run's tools get (loom_tool_ctx.user_keys) from the user's
 * settings: web_search's by backend name, and "secrets" for MCP headers.
 * NULL when out of memory. */
static json_t *user_keys(const json_t *settings)
{
    const json_t *ws = json_object_get(settings, "web_search_keys");
    const json_t *secrets = json_object_get(settings, "secrets");
    json_t *k = ws ? json_deep_copy(ws) : json_object();

    if (k && secrets && json_object_set(k, "secrets", (json_t *)secrets)) {
        json_decref(k);
        return NULL;
    }
    return k;
}

int srv_run_start(srv_run **out, srv_server *s, const srv_run_spec *sp)
{
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    json_t *settings = NULL, *keys = NULL;
    worker_end *we = NULL;
    srv_run *r = NULL;
    pthread_attr_t attr;
    pthread_t th;
    int rc, slot = 0;

    *out = NULL;
    if (!sp->input || sp->input->len == 0)
        return loom__error_set(LOOM_EINVALID, "the run has no input");
    if (s->nproviders == 0)
        return SRV_ENOPROVIDER;
    if ((rc = reserve_slot(s, sp->request)) != 0)
        return rc;
    slot = 1;
    if (!(r = calloc(1, sizeof(*r))) || !(we = calloc(1, sizeof(*we)))) {
        rc = loom__error_oom();
        goto fail;
    }
    atomic_init(&r->refs, 1);
    r->s = s;
    atomic_init(&r->background, sp->background);
    r->created_ms = loom__unix_ms();
    r->start_mono = srv__now_ms();
    we->r = r;
    srv__admission_init(&r->adm, s);

    settings = sp->user_settings ? json_incref((json_t *)sp->user_settings)
                                 : srv_user_settings(s, sp->user_id);
    if (settings && !(keys = user_keys(settings))) {
        rc = loom__error_oom();
        goto fail;
    }
    to.conversation_id = sp->conversation_id;
    to.create_with_save = sp->create_with_save;
    to.whole_answers = sp->whole_answers;
    to.agent = srv_settings_agent(settings, sp);
    to.user_settings = settings;
    to.user_keys = keys;
    to.no_agent = sp->no_agent;
    to.model = sp->model;
    to.input = sp->input;
    to.history = sp->history;
    to.user_id = sp->user_id;
    to.research = sp->research;
    to.title = sp->title;
    to.system_prompt = sp->system_prompt;
    to.tool_names = sp->tool_names;
    to.tool_names_len = sp->tool_names_len;
    to.tool_names_set = sp->tool_names_set;
    to.tool_choice = sp->tool_choice;
    to.tool_choice_set = sp->tool_choice_set;
    to.parallel_tool_calls = sp->parallel_tool_calls < 0 ? LOOM_OPT_DEFAULT
                             : sp->parallel_tool_calls   ? LOOM_OPT_ON
                                                         : LOOM_OPT_OFF;
    to.max_output_tokens = sp->max_tokens;
    to.temperature = sp->temperature;
    to.temperature_set = sp->temperature >= 0;
    to.max_iterations = sp->max_iterations;
    to.budget = sp->budget;
    to.account = sp->account;
    to.params = sp->params;
    to.client_tools = sp->client_tools;
    to.client_tools_len = sp->client_tools_len;
    to.resumable = 1;
    to.resume = sp->resume;
    to.run_id = sp->run_id;
    to.sink = (loom_sink){on_event, r};
    to.log = 1;
    to.log_max_bytes = s->sc->max_run_events_bytes;
    to.elicitation = sp->elicitation;
    to.ending = on_ending;
    to.ending_payload = we;
    to.call_gate = &r->adm.gate;
    if ((rc = check_owner(s, sp)) != 0 ||
        (rc = loom_turn_new(&r->t, s->session, &to)) != 0 ||
        (rc = check_allowed(sp, r->t)) != 0 ||
        (rc = srv__admit(&r->adm, sp, loom_turn_model(r->t))) != 0)
        goto fail;
    json_decref(settings);
    json_decref(keys);
    settings = keys = NULL;

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

    if (s->runs->pool) {
        rc = loom_pool_spawn(s->runs->pool, worker_fiber, we);
    } else {
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        rc = pthread_create(&th, &attr, worker, we);
        pthread_attr_destroy(&attr);
        if (rc != 0)
            rc = loom__error_set(LOOM_ERROR, "cannot start a run thread: %s",
                                 strerror(rc));
    }
    if (rc != 0) {
        pthread_mutex_lock(&s->runs->lock);
        unlink_run(s->runs, r);
        pthread_mutex_unlock(&s->runs->lock);
        atomic_store(&r->refs, 1);
        goto fail;
    }
    *out = r;
    return 0;

fail:
    json_decref(settings);
    json_decref(keys);
    if (slot)
        release_slot(s);
    if (r)
        srv__admission_release(&r->adm);
    free(we);
    srv_run_unref(r);
    return rc;
}

int srv_run_quota_refused(srv_run *run)
{
    return atomic_load(&run->adm.refused) > 0 &&
           atomic_load(&run->adm.granted) == 0;
}

/* ---- JSON ---------------------------------------------------------------- */

/*
 * A run's usage: the token counts, cache_write_tokens, and cost_micros
 * (integer micro-dollars; null when unknown: a model without prices, or
 * no model call made).
 */
static json_t *usage_json(const loom_run *lr)
{
    const loom_usage *u = loom_run_usage(lr);

    return json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:o}", "prompt_tokens",
                     (json_int_t)u->prompt_tokens, "completion_tokens",
                     (json_int_t)u->completion_tokens, "cached_tokens",
                     (json_int_t)u->cached_tokens, "reasoning_tokens",
                     (json_int_t)u->reasoning_tokens, "total_tokens",
                     (json_int_t)u->total_tokens, "cache_write_tokens",
                     (json_int_t)u->cache_write_tokens, "cost_micros",
                     loom_run_cost_known(lr)
                         ? json_integer((json_int_t)u->cost_micros)
                         : json_null());
}

static json_t *json_text(const char *s)
{
    return loom__json_text(s, strlen(s));
}

/* The "error" of an ended run: null, or {"message"[, "code"]}. */
static json_t *error_json(srv_run *run)
{
    const char *err = loom_run_error(srv_run_result(run));
    const char *code = loom_turn_error_code(run->t);
    const char *serr = srv_run_store_error(run);

    if (code)
        return json_pack("{s:o,s:s}", "message",
                         json_text(serr ? serr : "the run failed"), "code",
                         code);
    return *err ? json_pack("{s:o}", "message", json_text(err)) : json_null();
}

json_t *srv_run_to_json(srv_run *run, int with_events)
{
    json_t *o, *events = NULL;
    int ended;

    ended = srv_run_ended(run);
    if (with_events) {
        const srv_event *e;
        uint64_t seq = 0;
        events = json_array();
        /* Up to what was logged when the run was looked at. */
        while (events && (e = srv_run_next_event(run, seq)) != NULL) {
            if (json_array_append_new(events, loom_turn_event_json(e))) {
                json_decref(events);
                return NULL;
            }
            seq = e->seq;
        }
    }
    o = json_pack("{s:s,s:s,s:s,s:s,s:s?,s:s,s:b,s:I}", "id", srv_run_id(run),
                  "object", "run", "status",
                  ended ? loom_run_status_name(srv_run_status(run)) : "running",
                  "conversation_id", srv_run_conversation_id(run), "agent",
                  srv_run_agent_name(run), "model", srv_run_model_name(run),
                  "background", srv_run_background(run), "created_at",
                  (json_int_t)run->created_ms);
    if (!o) {
        json_decref(events);
        return NULL;
    }
    if (ended) {
        const loom_run *lr = srv_run_result(run);
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
        json_object_set_new(o, "usage", usage_json(lr));
        json_object_set_new(o, "stored", json_boolean(srv_run_stored(run)));
        json_object_set_new(o, "store_error",
                            srv_run_store_error(run)
                                ? json_text(srv_run_store_error(run))
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
    if (loom_turn_is_research(run->t)) {
        json_t *rs = loom_turn_research_status(run->t);
        if (rs)
            json_object_set_new(o, "research", rs);
    }
    if (events)
        json_object_set_new(o, "events", events);
    return o;
}

int srv_run_check_params(srv_request *r, const srv_run_spec *spec)
{
    const char *param = NULL;
    int rc = loom_session_check_params(r->srv->session, spec->agent,
                                       spec->model, spec->params, &param);

    if (rc == 0)
        return 1;
    if (rc == LOOM_EINVALID && param)
        return srv_reply_error(r, 400, "invalid_request_error", param,
                               "unsupported_parameter", "%s",
                               loom_error_last());
    return srv_reply_loom_error(r, rc, NULL);
}

/* ---- resuming ------------------------------------------------------------ */

/* The stored request's input messages into *out. */
static int spec_input(const json_t *spec, loom_messages *out)
{
    const json_t *m;
    size_t i;
    int rc;

    json_array_foreach(json_object_get(spec, "input"), i, m)
    {
        const char *role = json_string_value(json_object_get(m, "role"));
        loom_role r = !role                        ? LOOM_ROLE_USER
                      : !strcmp(role, "system")    ? LOOM_ROLE_SYSTEM
                      : !strcmp(role, "assistant") ? LOOM_ROLE_ASSISTANT
                                                   : LOOM_ROLE_USER;
        if ((rc = loom_messages_add(
                 out, r, json_string_value(json_object_get(m, "content")))))
            return rc;
    }
    return out->len ? 0
                    : loom__error_set(LOOM_EPROTO, "the stored request has "
                                                   "no input");
}

/* Marks a stored research run ended (its turn is stored already). */
static void end_stored(srv_server *s, const char *id)
{
    loom_store_research_write w;

    memset(&w, 0, sizeof(w));
    w.run_id = id;
    w.end = 1;
    if (loom_store_research_put(s->store, &w) != 0)
        loom_warn("run %s: cannot mark its research ended: %s", id,
                  loom_error_last());
}

static void resume_one(srv_server *s, const char *id)
{
    srv_run_spec sp = SRV_RUN_SPEC_INIT;
    loom_messages input = {0};
    json_t *row = NULL, *done = NULL;
    const json_t *spec, *account, *budget;
    srv_run *r = NULL;
    int rc;

    if ((rc = loom_store_research_get(s->store, id, NULL, 1, 0, &row)) != 0)
        goto fail;
    spec = json_object_get(row, "spec");
    sp.user_id = json_string_value(json_object_get(spec, "user_id"));
    account = json_object_get(spec, "account");
    sp.account.key_id = json_string_value(json_object_get(account, "key_id"));
    sp.account.workspace =
        json_string_value(json_object_get(account, "workspace"));
    sp.account.user = json_string_value(json_object_get(account, "user"));
    sp.account.end_user =
        json_string_value(json_object_get(account, "end_user"));
    /* Its turn was stored but the end not marked: it is over. */
    if (loom_store_run_get(s->store, id, sp.user_id, &done) == 0) {
        end_stored(s, id);
        goto out;
    }
    if ((rc = spec_input(spec, &input)) != 0)
        goto fail;
    sp.agent = json_string_value(json_object_get(spec, "agent"));
    sp.model = json_string_value(json_object_get(spec, "model"));
    sp.research = json_is_object(json_object_get(spec, "research"))
                      ? json_object_get(spec, "research")
                      : NULL;
    budget = json_object_get(spec, "budget");
    sp.budget.max_cost_micros =
        (int64_t)json_integer_value(json_object_get(budget, "max_cost_micros"));
    sp.budget.max_tokens =
        (long)json_integer_value(json_object_get(budget, "max_tokens"));
    sp.budget.max_seconds =
        (long)json_integer_value(json_object_get(budget, "max_seconds"));
    sp.input = &input;
    sp.conversation_id =
        json_string_value(json_object_get(row, "conversation_id"));
    sp.background = 1;
    sp.run_id = id;
    sp.resume = 1;
    if ((rc = srv_run_start(&r, s, &sp)) != 0)
        goto fail;
    loom_info("run %s: research resumed (conversation %s)", id,
              sp.conversation_id);
    srv_run_unref(r);
    goto out;
fail:
    loom_warn("run %s: cannot resume its research: %s", id, loom_error_last());
out:
    loom_messages_free(&input);
    json_decref(done);
    json_decref(row);
}

void srv__runs_resume(srv_server *s)
{
    json_t *ids = NULL, *id;
    size_t i;

    if (!s->store || s->nproviders == 0)
        return;
    if (loom_store_research_running(s->store, &ids) != 0) {
        loom_warn("cannot list the research runs to resume: %s",
                  loom_error_last());
        return;
    }
    json_array_foreach(ids, i, id)
    {
        resume_one(s, json_string_value(id));
    }
    json_decref(ids);
}
